//! The workers' CPU scheduling policies, carried out as [`penstock_core::sched::policy`]
//! decided: the facts it decides from, entering a policy on a worker thread (stepping down
//! when the kernel refuses), and the `SCHED_DEADLINE` reservation of each timed worker
//! following what admission granted on it.

use std::sync::{Arc, Mutex};

use penstock_core::sched::policy::{
    DeadlineConfig, DeadlineParams, SchedFacts, SchedPolicy, deadline_params,
};
use penstock_uring::sys::{
    SCHED_DEADLINE, SCHED_FLAG_RECLAIM, SCHED_FLAG_RESET_ON_FORK, SchedAttr, sched_getattr,
    sched_setattr,
};

/// What one worker runs under, for `STATE`, metrics and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSched {
    /// The worker's index in the engine.
    pub index: usize,
    /// Whether it is a timed worker (paced and `rt` streams, upcalls) or a general one.
    pub timed: bool,
    /// Its thread id (for `sched_getattr`, `/proc/PID/task/TID`).
    pub tid: i32,
    /// The policy it got.
    pub policy: SchedPolicy,
    /// Why it did not get a stronger one (empty when it got the first it tried).
    pub notes: Vec<String>,
}

/// The kernel's real-time throttle, parts per million of a CPU (`sched_rt_runtime_us` of
/// `sched_rt_period_us`; -1, no throttle, is a million): what a `SCHED_FIFO` worker may
/// take. The kernel's default where unreadable.
pub fn rt_runtime_ppm() -> u32 {
    let read = |name: &str| -> Option<i64> {
        std::fs::read_to_string(format!("/proc/sys/kernel/{name}"))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    match (read("sched_rt_runtime_us"), read("sched_rt_period_us")) {
        (Some(r), _) if r < 0 => 1_000_000,
        (Some(r), Some(p)) if p > 0 => {
            u32::try_from((i128::from(r) * 1_000_000 / i128::from(p)).min(1_000_000))
                .unwrap_or(1_000_000)
        }
        _ => penstock_core::sched::policy::RT_RUNTIME_PPM_DEFAULT,
    }
}

/// CAP_SYS_NICE's bit in the capability sets.
const CAP_SYS_NICE: u32 = 23;

/// What the process may do: CAP_SYS_NICE in the effective set (from /proc/self/status),
/// RLIMIT_RTPRIO.
pub fn gather_facts() -> SchedFacts {
    let cap_sys_nice = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        })
        .is_some_and(|eff| eff & (1 << CAP_SYS_NICE) != 0);
    let rt = rustix::process::getrlimit(rustix::process::Resource::Rtprio);
    SchedFacts {
        cap_sys_nice,
        rlimit_rtprio: rt.current.unwrap_or(u64::MAX),
    }
}

fn deadline_attr(d: DeadlineParams) -> SchedAttr {
    SchedAttr {
        policy: SCHED_DEADLINE,
        flags: SCHED_FLAG_RESET_ON_FORK | SCHED_FLAG_RECLAIM,
        runtime_ns: d.runtime_ns,
        deadline_ns: d.deadline_ns,
        period_ns: d.period_ns,
        ..SchedAttr::default()
    }
}

/// Puts the calling thread under the first of `tries` the kernel grants (a deadline
/// reservation starts at `floor`), and says why the stronger ones were refused.
pub(crate) fn enter(tries: &[SchedPolicy], floor: DeadlineParams) -> (SchedPolicy, Vec<String>) {
    let mut notes = Vec::new();
    for &p in tries {
        let r = match p {
            SchedPolicy::Deadline => sched_setattr(0, &deadline_attr(floor)),
            SchedPolicy::Fifo { priority } => sched_setattr(
                0,
                &SchedAttr {
                    policy: libc::SCHED_FIFO as u32,
                    flags: SCHED_FLAG_RESET_ON_FORK,
                    priority: u32::from(priority),
                    ..SchedAttr::default()
                },
            ),
            SchedPolicy::Other => return (p, notes),
        };
        match r {
            Ok(()) => return (p, notes),
            Err(e) => notes.push(format!(
                "{} refused by the kernel ({e}){}",
                p.name(),
                hint(p, &e)
            )),
        }
    }
    (SchedPolicy::Other, notes)
}

/// What a refusal most likely means.
fn hint(p: SchedPolicy, e: &std::io::Error) -> &'static str {
    match (p, e.raw_os_error()) {
        (SchedPolicy::Fifo { .. }, Some(libc::EPERM)) => {
            ": outside the root cpu cgroup with CONFIG_RT_GROUP_SCHED, the group needs cpu.rt_runtime_us"
        }
        (SchedPolicy::Deadline, Some(libc::EBUSY)) => {
            ": the machine's deadline bandwidth (sched_rt_runtime_us) is taken"
        }
        (SchedPolicy::Deadline, Some(libc::EPERM)) => {
            ": the thread's CPU affinity must span its whole root domain"
        }
        _ => "",
    }
}

/// The timed workers' books: what admission granted on each, and the deadline
/// reservation that follows it.
#[derive(Debug)]
pub(crate) struct TimedBooks {
    cfg: DeadlineConfig,
    workers: Vec<TimedWorker>,
}

#[derive(Debug)]
struct TimedWorker {
    tid: i32,
    policy: SchedPolicy,
    granted_ns_per_s: u64,
    /// The runtime fixed before the process gave up the right to change it
    /// ([`TimedBooks::fix`]): grants are then checked against it, with no system call.
    fixed_runtime_ns: Option<u64>,
}

impl TimedBooks {
    pub(crate) fn new(cfg: DeadlineConfig, workers: &[WorkerSched]) -> TimedBooks {
        TimedBooks {
            cfg,
            workers: workers
                .iter()
                .filter(|w| w.timed)
                .map(|w| TimedWorker {
                    tid: w.tid,
                    policy: w.policy,
                    granted_ns_per_s: 0,
                    fixed_runtime_ns: None,
                })
                .collect(),
        }
    }

    /// Adds `ns_per_s` to timed worker `k`'s grant, widening its deadline reservation
    /// first; the reason when it cannot (then nothing changed).
    pub(crate) fn grant(&mut self, k: usize, ns_per_s: u64) -> Result<(), String> {
        let cfg = self.cfg;
        let w = &mut self.workers[k];
        let total = w.granted_ns_per_s.saturating_add(ns_per_s);
        if w.policy == SchedPolicy::Deadline && ns_per_s > 0 {
            let Some(d) = deadline_params(total, &cfg) else {
                return Err(format!(
                    "the timed worker's SCHED_DEADLINE reservation cannot cover {:.1} ms/s of CPU \
                     (at most {} ppm of each {} µs period)",
                    total as f64 / 1e6,
                    cfg.max_ppm,
                    cfg.period_ns / 1000
                ));
            };
            if let Some(fixed) = w.fixed_runtime_ns {
                if d.runtime_ns > fixed {
                    return Err(format!(
                        "the timed worker's SCHED_DEADLINE reservation was fixed at {} µs every                          {} µs when the server gave up CAP_SYS_NICE; {:.1} ms/s of CPU needs {} µs",
                        fixed / 1000,
                        d.period_ns / 1000,
                        total as f64 / 1e6,
                        d.runtime_ns / 1000
                    ));
                }
                w.granted_ns_per_s = total;
                return Ok(());
            }
            sched_setattr(w.tid, &deadline_attr(d)).map_err(|e| {
                format!(
                    "the kernel refused the timed worker's SCHED_DEADLINE reservation of {} µs \
                     every {} µs ({e}){}",
                    d.runtime_ns / 1000,
                    d.period_ns / 1000,
                    hint(SchedPolicy::Deadline, &e)
                )
            })?;
        }
        w.granted_ns_per_s = total;
        Ok(())
    }

    /// Takes `ns_per_s` back from timed worker `k` and narrows its reservation.
    pub(crate) fn release(&mut self, k: usize, ns_per_s: u64) {
        let cfg = self.cfg;
        let w = &mut self.workers[k];
        w.granted_ns_per_s = w.granted_ns_per_s.saturating_sub(ns_per_s);
        if w.policy == SchedPolicy::Deadline
            && ns_per_s > 0
            && w.fixed_runtime_ns.is_none()
            && let Some(d) = deadline_params(w.granted_ns_per_s, &cfg)
        {
            // Narrowing never needs bandwidth the kernel could refuse.
            let _ = sched_setattr(w.tid, &deadline_attr(d));
        }
    }

    /// Before the process gives up CAP_SYS_NICE (a switch to an unprivileged user): each
    /// deadline worker's runtime is widened to the most it may ask (`max_ppm`; the
    /// bandwidth is only used when the worker runs) and fixed there; later grants are
    /// checked against it. Where the kernel refuses the widening, the runtime stays where
    /// it is, fixed. Says what each got.
    pub(crate) fn fix(&mut self) -> Vec<String> {
        let cfg = self.cfg;
        let max = DeadlineParams {
            runtime_ns: cfg.period_ns * u64::from(cfg.max_ppm) / 1_000_000,
            deadline_ns: cfg.period_ns,
            period_ns: cfg.period_ns,
        };
        let mut said = Vec::new();
        for w in self
            .workers
            .iter_mut()
            .filter(|w| w.policy == SchedPolicy::Deadline)
        {
            let now = sched_getattr(w.tid).map(|a| a.runtime_ns).unwrap_or(0);
            let fixed = match sched_setattr(w.tid, &deadline_attr(max)) {
                Ok(()) => max.runtime_ns,
                Err(e) => {
                    said.push(format!(
                        "the timed worker {} keeps {} µs every {} µs: widening to {} µs refused ({e})",
                        w.tid,
                        now / 1000,
                        cfg.period_ns / 1000,
                        max.runtime_ns / 1000
                    ));
                    now
                }
            };
            w.fixed_runtime_ns = Some(fixed);
        }
        said
    }

    /// Timed worker `k`'s grant now.
    pub(crate) fn granted(&self, k: usize) -> u64 {
        self.workers[k].granted_ns_per_s
    }
}

/// A stream's or an upcall's part of a timed worker's grant, given back on drop.
#[derive(Debug)]
pub(crate) struct TimedHold {
    pub(crate) books: Arc<Mutex<TimedBooks>>,
    pub(crate) timed_index: usize,
    pub(crate) ns_per_s: u64,
}

impl Drop for TimedHold {
    fn drop(&mut self) {
        self.books
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .release(self.timed_index, self.ns_per_s);
    }
}

/// A thread's policy and reservation as the kernel reports them (tests, `STATE`).
pub fn thread_sched(tid: i32) -> std::io::Result<SchedAttr> {
    sched_getattr(tid)
}

pub use penstock_uring::sys::SchedAttr as KernelSchedAttr;

/// `sched_setattr(2)` for thread `tid` (0: the calling thread): tests and benches that set
/// up competing reservations.
pub use penstock_uring::sys::sched_setattr as set_thread_sched;
