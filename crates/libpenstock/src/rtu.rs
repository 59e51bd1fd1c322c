//! `penstock_rtu_*`: MARS's Real-Time Upcalls for C — a function of the caller run
//! periodically by the engine's dispatcher (`Engine::rtu_create`, `docs/rtu.md`).

use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use penstock_core::lateness::lateness_bucket_quantile_ns;
use penstock_driver::{RtuError, RtuHandle, RtuKeep, RtuReport, RtuSpec, RtuStats};

use crate::engine::{ENGINES, penstock_engine};
use crate::error::{
    Error, PENSTOCK_EHANDLE, PENSTOCK_EINVAL, PENSTOCK_ENULL, PENSTOCK_EPANIC, PENSTOCK_EREFUSED,
    PENSTOCK_OK,
};
use crate::ffi::{Registry, guard_code};

/// An upcall (opaque). Made by `penstock_rtu_create`, ended by `penstock_rtu_free`.
pub struct penstock_rtu {
    _opaque: [u8; 0],
}

/// An upcall's function: called with the `arg` given to `penstock_rtu_create`, on one of the
/// engine's worker threads. It must not block (no sleep, no lock another thread holds, no
/// wait on a stream or an upcall): while it runs, that worker sends nothing.
pub type penstock_rtu_fn = Option<unsafe extern "C" fn(arg: *mut c_void)>;

/// What `penstock_rtu_stats` and `penstock_rtu_free` report.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct penstock_rtu_stats_t {
    /// Activations run (the callback called).
    pub activations: u64,
    /// Activations whose callback used more CPU time than `budget_ns`.
    pub overruns: u64,
    /// Activations that started later than `period_ns - budget_ns` after their release.
    pub misses: u64,
    /// Activations never run: their period had passed when the previous one ended.
    pub skipped: u64,
    /// Lateness (release to start of the callback), in ns: median, 99th percentile, most.
    /// From `penstock_rtu_stats`: the upper ends of power-of-two buckets (never below the
    /// true figure, less than twice it; the maximum is exact); from `penstock_rtu_free`:
    /// within 1/2048 of the truth.
    pub lateness_p50_ns: u64,
    pub lateness_p99_ns: u64,
    pub lateness_max_ns: u64,
    /// The most CPU time and wall time one activation took, and the CPU time of all, in ns.
    pub cpu_max_ns: u64,
    pub wall_max_ns: u64,
    pub cpu_total_ns: u64,
    /// 1 while the upcall is on its worker; 0 once it was stopped (or its engine freed).
    pub running: c_int,
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn live_stats(s: &RtuStats) -> penstock_rtu_stats_t {
    let b = &s.lateness.buckets;
    let q = |per_million| lateness_bucket_quantile_ns(b, per_million).unwrap_or(0);
    penstock_rtu_stats_t {
        activations: s.activations,
        overruns: s.overruns,
        misses: s.lateness.misses,
        skipped: s.lateness.units_skipped,
        lateness_p50_ns: q(500_000),
        lateness_p99_ns: q(990_000),
        lateness_max_ns: s.lateness.max_ns,
        cpu_max_ns: ns(s.cpu_max),
        wall_max_ns: ns(s.wall_max),
        cpu_total_ns: ns(s.cpu_total),
        running: c_int::from(s.running),
    }
}

fn final_stats(r: &RtuReport) -> penstock_rtu_stats_t {
    let l = &r.lateness;
    penstock_rtu_stats_t {
        activations: r.activations,
        overruns: r.overruns,
        misses: l.misses(),
        skipped: r.skipped,
        lateness_p50_ns: l.p50_ns(),
        lateness_p99_ns: l.p99_ns(),
        lateness_max_ns: l.max_ns(),
        cpu_max_ns: ns(r.cpu_max),
        wall_max_ns: ns(r.wall_max),
        cpu_total_ns: ns(r.cpu_total),
        running: 0,
    }
}

fn from_rtu_error(e: &RtuError) -> Error {
    let code = match e {
        RtuError::Refused(_) | RtuError::Reservation(_) => PENSTOCK_EREFUSED,
        RtuError::Panicked { .. } => PENSTOCK_EPANIC,
        RtuError::EngineStopped => PENSTOCK_EHANDLE,
        RtuError::Ended => crate::error::PENSTOCK_ESTATE,
        _ => crate::error::PENSTOCK_EIO,
    };
    Error::new(code, e.to_string())
}

/// The caller's `arg`, handed to the worker thread that calls the callback. The C caller
/// promises (`penstock_rtu_create`'s contract) that the callback may use it from that thread.
struct CallbackArg(*mut c_void);

// SAFETY: `arg` is only ever passed back to the caller's own callback, which the caller
// declared fit to run on another thread with it (penstock_rtu_create's contract); Rust never
// reads through it.
unsafe impl Send for CallbackArg {}

impl CallbackArg {
    /// A method, so that the closure captures the whole wrapper (and so its `Send`), not
    /// the raw pointer field alone.
    fn get(&self) -> *mut c_void {
        self.0
    }
}

/// A live upcall: its handle until `penstock_rtu_free` takes it.
struct RtuObj {
    handle: Mutex<Option<RtuHandle>>,
}

static RTUS: Registry<RtuObj> = Registry::new("penstock_rtu");

/// Creates a Real-Time Upcall on `engine`: `callback(arg)` every `period_ns`, each call
/// declared to need at most `budget_ns` of CPU time. Admission decides now: a budget of 0 or
/// above the period, a period out of range, or a set of upcalls on the chosen worker that
/// would no longer be schedulable gives `PENSTOCK_EREFUSED` (the message names the
/// utilization and the bound); nothing runs then. On success `*out` holds the upcall and
/// `PENSTOCK_OK` is returned. The callback runs on a worker of the engine, in the same
/// EDF/RM order as the streams' paced units, never preempted: it must not block
/// (`docs/rtu.md`). An overrun (more CPU than `budget_ns`) is counted, never cut short.
///
/// # Safety
/// `out` is NULL or points to a writable `penstock_rtu *`. `callback` may be called with
/// `arg` from another thread until `penstock_rtu_free(rtu)` (or `penstock_engine_free`)
/// returns; it must not unwind.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn penstock_rtu_create(
    engine: *mut penstock_engine,
    period_ns: u64,
    budget_ns: u64,
    callback: penstock_rtu_fn,
    arg: *mut c_void,
    out: *mut *mut penstock_rtu,
) -> c_int {
    guard_code(|| {
        if out.is_null() {
            return Err(Error::new(PENSTOCK_ENULL, "out is NULL"));
        }
        let Some(f) = callback else {
            return Err(Error::new(PENSTOCK_ENULL, "callback is NULL"));
        };
        if period_ns == 0 {
            return Err(Error::new(PENSTOCK_EINVAL, "period_ns is 0"));
        }
        let inner = ENGINES.get(engine as u64)?;
        let arg = CallbackArg(arg);
        let spec = RtuSpec::new(
            Duration::from_nanos(period_ns),
            Duration::from_nanos(budget_ns),
        );
        let handle = inner
            .engine
            .rtu_create(
                spec,
                Box::new(move |_| {
                    // SAFETY: the caller's function and argument, called as its contract
                    // above allows (from a worker thread, until the upcall is freed).
                    unsafe { f(arg.get()) }
                }),
            )
            .map_err(|e| from_rtu_error(&e))?;
        let h = RTUS.insert(Arc::new(RtuObj {
            handle: Mutex::new(Some(handle)),
        }));
        // SAFETY: not NULL (checked above), writable (the caller's promise).
        unsafe { out.write(h as *mut penstock_rtu) };
        Ok(PENSTOCK_OK)
    })
}

/// Fills `*stats` with the upcall's live counts. `PENSTOCK_OK`, `PENSTOCK_ENULL`, or
/// `PENSTOCK_EHANDLE` for a freed upcall.
///
/// # Safety
/// `stats` is NULL or points to a writable `penstock_rtu_stats_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn penstock_rtu_stats(
    rtu: *mut penstock_rtu,
    stats: *mut penstock_rtu_stats_t,
) -> c_int {
    guard_code(|| {
        if stats.is_null() {
            return Err(Error::new(PENSTOCK_ENULL, "stats is NULL"));
        }
        let obj = RTUS.get(rtu as u64)?;
        let s = match &*obj.handle.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(h) => live_stats(&h.stats()),
            None => {
                return Err(Error::new(
                    PENSTOCK_EHANDLE,
                    "the penstock_rtu is being freed",
                ));
            }
        };
        // SAFETY: not NULL (checked above), writable (the caller's promise).
        unsafe { stats.write(s) };
        Ok(PENSTOCK_OK)
    })
}

/// MARS's `rtu_suspend`: asks the upcall's worker to take it off its queue, which it does at
/// its next turn (an activation in progress ends first; `penstock_rtu_stats`' `activations`
/// then stop). With `keep` not 0 it keeps its
/// CPU reservation (`penstock_rtu_run` cannot be refused); with 0 the CPU goes back to
/// admission now. Suspending a suspended upcall changes nothing. `PENSTOCK_OK`;
/// `PENSTOCK_ESTATE` once the upcall has ended; `PENSTOCK_EHANDLE` for a freed one.
#[unsafe(no_mangle)]
pub extern "C" fn penstock_rtu_suspend(rtu: *mut penstock_rtu, keep: c_int) -> c_int {
    guard_code(|| {
        with_handle(rtu, |h| {
            h.suspend(if keep != 0 {
                RtuKeep::Reservation
            } else {
                RtuKeep::Nothing
            })
        })
    })
}

/// MARS's `rtu_run`: puts a suspended upcall back on its worker, its next activation
/// released at once. One suspended without its reservation asks admission again (on the
/// same worker): `PENSTOCK_EREFUSED` naming the utilization leaves it suspended. Running a
/// running upcall changes nothing. `PENSTOCK_OK`; `PENSTOCK_ESTATE` once it has ended;
/// `PENSTOCK_EHANDLE` for a freed one.
#[unsafe(no_mangle)]
pub extern "C" fn penstock_rtu_run(rtu: *mut penstock_rtu) -> c_int {
    guard_code(|| with_handle(rtu, RtuHandle::run))
}

/// `f` on the live handle of `rtu`, its error as the C API's.
fn with_handle(
    rtu: *mut penstock_rtu,
    f: impl FnOnce(&RtuHandle) -> Result<(), RtuError>,
) -> Result<c_int, Error> {
    let obj = RTUS.get(rtu as u64)?;
    let guard = obj.handle.lock().unwrap_or_else(|p| p.into_inner());
    let Some(h) = guard.as_ref() else {
        return Err(Error::new(
            PENSTOCK_EHANDLE,
            "the penstock_rtu is being freed",
        ));
    };
    f(h).map_err(|e| from_rtu_error(&e))?;
    Ok(PENSTOCK_OK)
}

/// Stops an upcall (waiting for an activation in progress to end: the callback is not
/// called after this returns) and frees it; with `report` not NULL, fills it with the
/// exact figures of its whole run. `PENSTOCK_OK`; `PENSTOCK_EHANDLE` if its engine was freed
/// first (the upcall stopped then; `*report` is not written); `PENSTOCK_EHANDLE` or
/// `PENSTOCK_ENULL` for a bad handle. The handle is dead afterwards in every case.
///
/// # Safety
/// `report` is NULL or points to a writable `penstock_rtu_stats_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn penstock_rtu_free(
    rtu: *mut penstock_rtu,
    report: *mut penstock_rtu_stats_t,
) -> c_int {
    guard_code(|| {
        let obj = RTUS.remove(rtu as u64)?;
        let handle = obj.handle.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(handle) = handle else {
            return Err(Error::new(
                PENSTOCK_EHANDLE,
                "the penstock_rtu is being freed",
            ));
        };
        let r = handle.stop().map_err(|e| from_rtu_error(&e))?;
        if !report.is_null() {
            // SAFETY: not NULL (checked above), writable (the caller's promise).
            unsafe { report.write(final_stats(&r)) };
        }
        Ok(PENSTOCK_OK)
    })
}
