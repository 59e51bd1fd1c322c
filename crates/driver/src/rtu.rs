//! Real-Time Upcalls (MARS §4.5): a function of the caller's, run periodically on one of the
//! engine's workers by the same dispatcher as the streams' units, after admission against the
//! CPU it declares ([`penstock_core::admission::cpu`]).
//!
//! ```no_run
//! use std::time::Duration;
//! use penstock_driver::{Engine, EngineConfig, RtuSpec};
//! let engine = Engine::new(EngineConfig::default())?;
//! let rtu = engine.rtu_create(
//!     RtuSpec::new(Duration::from_millis(60), Duration::from_millis(5)),
//!     Box::new(|a| println!("activation {} released at {:?}", a.seq, a.release)),
//! )?;
//! std::thread::sleep(Duration::from_secs(1));
//! let report = rtu.stop()?;
//! println!("{} activations, {} overruns", report.activations, report.overruns);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What the dispatcher owes, and what the callback owes
//! Activation `n` is **released** at `start + n · period` (`start`: [`RtuSpec::start_at`], or
//! when the worker takes the upcall) and owed by the end of its period, its **deadline**.
//! The worker's queue holds it beside the streams' units and serves released entries in the
//! engine's order (EDF: by deadline, so the units due now first; RM: by period); nothing is
//! preempted: once started, the callback runs to its end on the worker's thread.
//!
//! - **Lateness** is measured as a stream's is (`core::lateness`): from the release to the
//!   moment the callback starts. A **miss** is an activation that started later than
//!   `miss_after` after its release; by default `period − budget`, the latest start that can
//!   still finish the budget by the deadline. Misses are the dispatcher's failures.
//! - An **overrun** is an activation whose callback used more CPU time than its budget (the
//!   worker thread's CPU clock across the call): the callback's failure. Its wall time is
//!   measured too; a wall time above the budget without an overrun means the thread lost the
//!   CPU to the kernel, or the callback blocked.
//! - After an activation ends, the next one is the first whose deadline is still ahead:
//!   activations whose whole period passed meanwhile (after an overrun, or a worker held up
//!   elsewhere) are **skipped** and counted, never run in a burst; the releases stay on the
//!   grid `start + n · period`.
//!
//! # Suspending (MARS's `rtu_suspend` / `rtu_run`)
//! [`RtuHandle::suspend`] takes the upcall off its worker's queue (an activation in progress
//! ends first) and either keeps its CPU reservation ([`RtuKeep::Reservation`]: `run` cannot be
//! refused) or gives it back ([`RtuKeep::Nothing`]: `run` asks admission again, on the same
//! worker, and may be refused). [`RtuHandle::run`] puts it back: its next activation is
//! released at once and the ones after on a grid from there; the activations of the
//! suspension are neither run nor counted as skipped (nothing was owed).
//!
//! The callback runs on a worker's event loop: it must not block (no sleeping, no waiting
//! on a lock or a socket, no `wait` on a stream or an upcall — its own would never end), or
//! every stream of that worker waits with it. A callback that
//! panics is caught: the upcall is cancelled, its CPU reservation given back, and
//! [`RtuHandle::wait`] reports [`RtuError::Panicked`]; the worker and its streams go on.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use penstock_core::admission::cpu::{CpuAdmission, CpuRefusal, RtuId};
use penstock_core::lateness::{LATENESS_BUCKETS, LatenessStats, lateness_bucket};
use penstock_core::time::Instant;

use crate::clock;
use crate::report::LatenessCounts;

/// A periodic upcall: its period and the CPU time one activation needs at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtuSpec {
    pub period: Duration,
    /// The CPU time one activation needs at most: what admission reserves, and what an
    /// activation may use before it counts as an overrun.
    pub budget: Duration,
    /// An activation that starts later than this after its release is a miss (default:
    /// `period − budget`).
    pub miss_after: Option<Duration>,
    /// The release of activation 0 (CLOCK_MONOTONIC, see `clock::now`); `None`: when the
    /// worker takes the upcall.
    pub start_at: Option<Instant>,
}

impl RtuSpec {
    pub fn new(period: Duration, budget: Duration) -> RtuSpec {
        RtuSpec {
            period,
            budget,
            miss_after: None,
            start_at: None,
        }
    }
}

/// What the callback is told about the activation it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtuActivation {
    /// Activation number, from 0 (skipped ones are not run, so numbers may jump).
    pub seq: u64,
    pub release: Instant,
    /// The end of its period.
    pub deadline: Instant,
    pub budget: Duration,
}

/// The upcall's function. It runs on a worker thread and must not block (see the module
/// doc). A C caller's `void (*)(void *)` and its argument fit in one: `Box::new(move |_|
/// unsafe { f(arg) })`, with `arg` made `Send` by the wrapper.
pub type RtuCallback = Box<dyn FnMut(&RtuActivation) + Send>;

/// How an upcall went: exact figures, when it ended.
#[derive(Debug, Clone)]
pub struct RtuReport {
    pub period: Duration,
    pub budget: Duration,
    /// Activations run (their callback called).
    pub activations: u64,
    /// Activations whose callback used more CPU time than the budget.
    pub overruns: u64,
    /// Activations never run: their period had passed when the previous one ended.
    pub skipped: u64,
    /// From each activation's release to its start; `misses()` counts those later than
    /// `miss_after`.
    pub lateness: LatenessStats,
    /// The most CPU time, and wall time, one activation took; and the CPU time of all.
    pub cpu_max: Duration,
    pub wall_max: Duration,
    pub cpu_total: Duration,
}

/// A snapshot of an upcall's live counts (see [`RtuHandle::stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtuStats {
    pub activations: u64,
    pub overruns: u64,
    /// Lateness by bucket, misses, max; `units_skipped` counts skipped activations.
    pub lateness: LatenessCounts,
    pub cpu_max: Duration,
    pub wall_max: Duration,
    pub cpu_total: Duration,
    /// The upcall is still on its worker (not cancelled, its callback has not panicked).
    pub running: bool,
    /// Suspended ([`RtuHandle::suspend`]): on its worker, not activated.
    pub suspended: bool,
}

/// What a suspended upcall keeps ([`RtuHandle::suspend`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RtuKeep {
    /// Its CPU reservation: [`RtuHandle::run`] is never refused.
    Reservation,
    /// Nothing: the CPU goes back to admission now, and `run` asks for it again.
    Nothing,
}

/// Why an upcall was not created, or how it ended badly.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RtuError {
    /// Admission refused it (the message names the utilization and the bound), or the spec
    /// is invalid.
    #[error("upcall admission: {0}")]
    Refused(#[from] CpuRefusal),
    /// The timed worker's CPU reservation could not be widened for it (the kernel refused
    /// the SCHED_DEADLINE bandwidth, or it would pass the reservation's cap).
    #[error("upcall admission: cpu: {0}")]
    Reservation(String),
    /// The callback panicked: the upcall was cancelled then, and its reservation given back.
    #[error(
        "the upcall's callback panicked in activation {seq} ({message}); the upcall was cancelled"
    )]
    Panicked {
        seq: u64,
        message: String,
        report: Box<RtuReport>,
    },
    #[error("engine stopped")]
    EngineStopped,
    /// The upcall has ended (cancelled, or its callback panicked): it cannot be suspended
    /// or run.
    #[error("the upcall has ended")]
    Ended,
    /// The worker's command queue is full (`worker_commands_max`): nothing was created and
    /// the upcall's reservation was given back.
    #[error(
        "the engine's worker is busy: its command queue is full (worker_commands_max = {commands_max})"
    )]
    WorkerQueueFull { commands_max: usize },
}

/// Live counts, written by the worker, read by the handle.
#[derive(Debug, Default)]
pub(crate) struct RtuCounters {
    activations: AtomicU64,
    overruns: AtomicU64,
    misses: AtomicU64,
    skipped: AtomicU64,
    lateness: [AtomicU64; LATENESS_BUCKETS],
    lateness_max_ns: AtomicU64,
    cpu_max_ns: AtomicU64,
    wall_max_ns: AtomicU64,
    cpu_total_ns: AtomicU64,
    ended: AtomicBool,
    /// Off its worker's queue (`RtuHandle::suspend`), as the worker last set it.
    suspended: AtomicBool,
}

/// The CPU an admitted upcall holds on its worker; given back when dropped (by the worker,
/// when the upcall ends, before its report is sent).
#[derive(Debug)]
pub(crate) struct CpuHold {
    pub(crate) admission: Arc<Mutex<Vec<CpuAdmission>>>,
    pub(crate) worker: usize,
    pub(crate) id: RtuId,
    /// Its part of a timed worker's CPU reservation.
    pub(crate) timed: Option<crate::sched::TimedHold>,
}

impl Drop for CpuHold {
    fn drop(&mut self) {
        let mut a = self.admission.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(w) = a.get_mut(self.worker) {
            w.release(self.id);
        }
    }
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// An upcall as its worker holds it.
pub(crate) struct Rtu {
    pub(crate) id: u64,
    callback: RtuCallback,
    period_ns: u64,
    budget_ns: u64,
    start_at: Option<Instant>,
    /// The release of activation 0, once the worker took the upcall.
    anchor: Instant,
    /// The next activation to run.
    next: u64,
    stats: LatenessStats,
    activations: u64,
    overruns: u64,
    skipped: u64,
    cpu_max_ns: u64,
    wall_max_ns: u64,
    cpu_total_ns: u64,
    counters: Arc<RtuCounters>,
    /// Dropped (the CPU given back) before the report is sent, or when suspended with
    /// [`RtuKeep::Nothing`].
    hold: Option<CpuHold>,
    /// Off the worker's queue.
    suspended: bool,
    done: SyncSender<Result<RtuReport, RtuError>>,
}

impl Rtu {
    pub(crate) fn new(
        id: u64,
        spec: &RtuSpec,
        callback: RtuCallback,
        counters: Arc<RtuCounters>,
        hold: CpuHold,
        done: SyncSender<Result<RtuReport, RtuError>>,
    ) -> Rtu {
        let (period_ns, budget_ns) = (ns(spec.period), ns(spec.budget));
        let miss_after_ns = spec
            .miss_after
            .map_or(period_ns.saturating_sub(budget_ns), ns);
        Rtu {
            id,
            callback,
            period_ns,
            budget_ns,
            start_at: spec.start_at,
            anchor: Instant::ZERO,
            next: 0,
            stats: LatenessStats::new(miss_after_ns),
            activations: 0,
            overruns: 0,
            skipped: 0,
            cpu_max_ns: 0,
            wall_max_ns: 0,
            cpu_total_ns: 0,
            counters,
            hold: Some(hold),
            suspended: false,
            done,
        }
    }

    /// Suspended by the worker (taken off its queue): `release` gives the CPU back now.
    /// False when it already was.
    pub(crate) fn suspend(&mut self, release: bool) -> bool {
        if release {
            drop(self.hold.take());
        }
        let was = std::mem::replace(&mut self.suspended, true);
        self.counters.suspended.store(true, Ordering::Release);
        !was
    }

    /// Back on the worker's queue: the next activation released at `now`, the grid moved
    /// with it; `hold`, the CPU admitted again (for one suspended without its reservation).
    /// False when it was not suspended.
    pub(crate) fn resume(&mut self, now: Instant, hold: Option<CpuHold>) -> bool {
        if let Some(h) = hold {
            self.hold = Some(h);
        }
        if !std::mem::replace(&mut self.suspended, false) {
            return false;
        }
        let offset = u128::from(self.next) * u128::from(self.period_ns);
        self.anchor = Instant::from_nanos(
            now.as_nanos()
                .saturating_sub(u64::try_from(offset).unwrap_or(u64::MAX)),
        );
        self.counters.suspended.store(false, Ordering::Release);
        true
    }

    /// Fixes the release of activation 0: `start_at`, or `now`.
    pub(crate) fn anchor(&mut self, now: Instant) {
        self.anchor = self.start_at.unwrap_or(now);
    }

    pub(crate) fn period_ns(&self) -> u64 {
        self.period_ns
    }

    pub(crate) fn is_suspended(&self) -> bool {
        self.suspended
    }

    fn release_of(&self, n: u64) -> Instant {
        let offset = u128::from(n) * u128::from(self.period_ns);
        Instant::from_nanos(
            self.anchor
                .as_nanos()
                .saturating_add(u64::try_from(offset).unwrap_or(u64::MAX)),
        )
    }

    /// The next activation's release and deadline.
    pub(crate) fn next_job(&self) -> (Instant, Instant) {
        let release = self.release_of(self.next);
        (
            release,
            Instant::from_nanos(release.as_nanos().saturating_add(self.period_ns)),
        )
    }

    /// Runs the next activation now (it has been released), measures it, and moves to the
    /// activation after it (skipping those whose period has passed). `Err`: the callback
    /// panicked, with its message.
    pub(crate) fn activate(&mut self) -> Result<(), (u64, String)> {
        let seq = self.next;
        let (release, deadline) = self.next_job();
        let activation = RtuActivation {
            seq,
            release,
            deadline,
            budget: Duration::from_nanos(self.budget_ns),
        };
        let start = clock::now();
        let cpu0 = clock::thread_cpu_ns();
        let outcome = catch_unwind(AssertUnwindSafe(|| (self.callback)(&activation)));
        let cpu_ns = clock::thread_cpu_ns().saturating_sub(cpu0);
        let end = clock::now();
        let wall_ns = end.as_nanos().saturating_sub(start.as_nanos());

        self.stats.record(release, start, 0);
        let lateness_ns = start.as_nanos().saturating_sub(release.as_nanos());
        let c = &self.counters;
        self.activations += 1;
        c.activations.fetch_add(1, Ordering::Relaxed);
        c.lateness[lateness_bucket(lateness_ns)].fetch_add(1, Ordering::Relaxed);
        c.lateness_max_ns.fetch_max(lateness_ns, Ordering::Relaxed);
        if lateness_ns > self.stats.miss_after_ns() {
            c.misses.fetch_add(1, Ordering::Relaxed);
        }
        if cpu_ns > self.budget_ns {
            self.overruns += 1;
            c.overruns.fetch_add(1, Ordering::Relaxed);
        }
        self.cpu_max_ns = self.cpu_max_ns.max(cpu_ns);
        self.wall_max_ns = self.wall_max_ns.max(wall_ns);
        self.cpu_total_ns = self.cpu_total_ns.saturating_add(cpu_ns);
        c.cpu_max_ns.store(self.cpu_max_ns, Ordering::Relaxed);
        c.wall_max_ns.store(self.wall_max_ns, Ordering::Relaxed);
        c.cpu_total_ns.store(self.cpu_total_ns, Ordering::Relaxed);

        // The first activation whose deadline is after `end`: (k + 1) · period > end − anchor.
        let k = end.as_nanos().saturating_sub(self.anchor.as_nanos()) / self.period_ns.max(1);
        let next = (seq + 1).max(k);
        let skipped = next - seq - 1;
        self.skipped += skipped;
        c.skipped.fetch_add(skipped, Ordering::Relaxed);
        self.next = next;

        outcome.map_err(|payload| {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_string());
            (seq, message)
        })
    }

    /// Ends the upcall: gives its CPU back, then reports (`panicked`: how its callback did).
    pub(crate) fn finish(mut self, panicked: Option<(u64, String)>) {
        drop(self.hold.take());
        self.counters.ended.store(true, Ordering::Release);
        let report = RtuReport {
            period: Duration::from_nanos(self.period_ns),
            budget: Duration::from_nanos(self.budget_ns),
            activations: self.activations,
            overruns: self.overruns,
            skipped: self.skipped,
            lateness: std::mem::replace(&mut self.stats, LatenessStats::new(0)),
            cpu_max: Duration::from_nanos(self.cpu_max_ns),
            wall_max: Duration::from_nanos(self.wall_max_ns),
            cpu_total: Duration::from_nanos(self.cpu_total_ns),
        };
        let _ = self.done.send(match panicked {
            None => Ok(report),
            Some((seq, message)) => Err(RtuError::Panicked {
                seq,
                message,
                report: Box::new(report),
            }),
        });
    }
}

impl Drop for Rtu {
    /// However it ends (`finish`, or dropped with its worker at engine stop), the handle's
    /// `stats` no longer says running.
    fn drop(&mut self) {
        self.counters.ended.store(true, Ordering::Release);
    }
}

/// Admits a suspended upcall's CPU again, on its worker (see [`RtuHandle::run`]).
pub(crate) type Readmit = Box<dyn Fn() -> Result<CpuHold, RtuError> + Send + Sync>;

/// What a handle asks of its upcall's worker (the engine turns it into the worker's command).
pub(crate) enum RtuCtl {
    Cancel,
    /// Off the queue; `true`: its CPU given back.
    Suspend(bool),
    /// Back on the queue, with its CPU admitted again when it had been given back.
    Run(Option<Box<CpuHold>>),
}

/// Sends an [`RtuCtl`] to the upcall's worker.
pub(crate) type SendCtl = Box<dyn Fn(RtuCtl) + Send + Sync>;

/// The caller's side of an upcall. Dropping it cancels the upcall.
pub struct RtuHandle {
    id: u64,
    counters: Arc<RtuCounters>,
    send: SendCtl,
    readmit: Readmit,
    /// `Some(keep)` while suspended by this handle.
    suspension: Mutex<Option<RtuKeep>>,
    done: Receiver<Result<RtuReport, RtuError>>,
    /// The report was taken: nothing left to cancel.
    finished: bool,
}

impl std::fmt::Debug for RtuHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RtuHandle")
            .field("id", &self.id)
            .field("stats", &self.stats())
            .finish()
    }
}

impl RtuHandle {
    pub(crate) fn new(
        id: u64,
        counters: Arc<RtuCounters>,
        send: SendCtl,
        readmit: Readmit,
        done: Receiver<Result<RtuReport, RtuError>>,
    ) -> RtuHandle {
        RtuHandle {
            id,
            counters,
            send,
            readmit,
            suspension: Mutex::new(None),
            done,
            finished: false,
        }
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// The live counts. Read while the worker writes: each is exact, a snapshot may be an
    /// activation behind across them.
    pub fn stats(&self) -> RtuStats {
        let c = &self.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RtuStats {
            activations: load(&c.activations),
            overruns: load(&c.overruns),
            lateness: LatenessCounts {
                buckets: std::array::from_fn(|i| load(&c.lateness[i])),
                misses: load(&c.misses),
                max_ns: load(&c.lateness_max_ns),
                units_skipped: load(&c.skipped),
                bytes_skipped: 0,
            },
            cpu_max: Duration::from_nanos(load(&c.cpu_max_ns)),
            wall_max: Duration::from_nanos(load(&c.wall_max_ns)),
            cpu_total: Duration::from_nanos(load(&c.cpu_total_ns)),
            running: !c.ended.load(Ordering::Acquire),
            suspended: c.suspended.load(Ordering::Acquire),
        }
    }

    /// Asks the worker to stop the upcall (an activation in progress ends first). Its CPU
    /// is given back when the worker takes the request.
    pub fn cancel(&self) {
        (self.send)(RtuCtl::Cancel);
    }

    /// MARS's `rtu_suspend`: asks the worker to take the upcall off its queue (an activation
    /// in progress ends first; [`RtuStats::suspended`] says when the worker has), keeping
    /// its CPU reservation or giving it back (`keep`). Suspending a suspended upcall changes
    /// nothing (its first `keep` holds). [`RtuError::Ended`] once the upcall has ended.
    pub fn suspend(&self, keep: RtuKeep) -> Result<(), RtuError> {
        let mut s = self.suspension.lock().unwrap_or_else(|p| p.into_inner());
        if self.counters.ended.load(Ordering::Acquire) {
            return Err(RtuError::Ended);
        }
        if s.is_some() {
            return Ok(());
        }
        (self.send)(RtuCtl::Suspend(keep == RtuKeep::Nothing));
        *s = Some(keep);
        Ok(())
    }

    /// MARS's `rtu_run`: puts a suspended upcall back on its worker's queue, its next
    /// activation released at once. One suspended with [`RtuKeep::Nothing`] asks admission
    /// again first, on the same worker: refused ([`RtuError::Refused`] naming the
    /// utilization, or [`RtuError::Reservation`]), it stays suspended. Running a running
    /// upcall changes nothing.
    pub fn run(&self) -> Result<(), RtuError> {
        let mut s = self.suspension.lock().unwrap_or_else(|p| p.into_inner());
        if self.counters.ended.load(Ordering::Acquire) {
            return Err(RtuError::Ended);
        }
        let Some(keep) = *s else {
            return Ok(());
        };
        let hold = match keep {
            RtuKeep::Reservation => None,
            RtuKeep::Nothing => Some((self.readmit)()?),
        };
        (self.send)(RtuCtl::Run(hold.map(Box::new)));
        *s = None;
        Ok(())
    }

    /// Waits for the upcall to end — after [`RtuHandle::cancel`], or when its callback
    /// panicked ([`RtuError::Panicked`]) — and returns its report. Without a cancel, waits as
    /// long as the upcall runs.
    pub fn wait(mut self) -> Result<RtuReport, RtuError> {
        self.finished = true;
        self.done.recv().unwrap_or(Err(RtuError::EngineStopped))
    }

    /// [`RtuHandle::cancel`], then [`RtuHandle::wait`].
    pub fn stop(self) -> Result<RtuReport, RtuError> {
        self.cancel();
        self.wait()
    }
}

impl Drop for RtuHandle {
    fn drop(&mut self) {
        if !self.finished {
            self.cancel();
        }
    }
}
