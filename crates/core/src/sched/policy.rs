//! Which CPU scheduling policy the kernel is asked for, for the workers that carry timed
//! streams and upcalls, and the `SCHED_DEADLINE` reservation that follows what admission
//! granted on them (issue 37; docs/io-scheduler.md §4c).
//!
//! The decision is taken here, from facts the driver gathers (may the process take a
//! real-time policy at all), and carried out by the driver; the kernel may still refuse
//! (a `SCHED_FIFO` thread outside the root cpu cgroup under `CONFIG_RT_GROUP_SCHED` without
//! an RT budget; `SCHED_DEADLINE` bandwidth beyond `sched_rt_runtime_us`), and the worker
//! then steps down the list this module gives, saying why.
//!
//! Timed workers never carry bulk streams: a `SCHED_FIFO` thread busy with a bulk transfer
//! would starve everything else on its CPU, and a deadline thread would spend its budget
//! on it. So the engine runs its timed workers beside, not instead of, its general ones.

use std::fmt;
use std::str::FromStr;

/// What the configuration asks (`[engine] sched`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum SchedAsk {
    /// The strongest policy the process may take: deadline, else FIFO, else other.
    #[default]
    Auto,
    Deadline,
    Fifo,
    /// No real-time policy: the workers stay ordinary threads and carry every class.
    Other,
}

impl SchedAsk {
    pub fn as_str(self) -> &'static str {
        match self {
            SchedAsk::Auto => "auto",
            SchedAsk::Deadline => "deadline",
            SchedAsk::Fifo => "fifo",
            SchedAsk::Other => "other",
        }
    }
}

impl fmt::Display for SchedAsk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SchedAsk {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(SchedAsk::Auto),
            "deadline" => Ok(SchedAsk::Deadline),
            "fifo" => Ok(SchedAsk::Fifo),
            "other" => Ok(SchedAsk::Other),
            _ => Err(format!(
                "sched must be \"auto\", \"deadline\", \"fifo\" or \"other\", got {s:?}"
            )),
        }
    }
}

/// A policy a worker runs under.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum SchedPolicy {
    /// `SCHED_DEADLINE`: a constant-bandwidth server with the kernel's own admission test.
    Deadline,
    /// `SCHED_FIFO` at this priority (1..=99).
    Fifo { priority: u8 },
    /// `SCHED_OTHER` (CFS/EEVDF).
    Other,
}

impl SchedPolicy {
    /// The name in metrics and replies.
    pub fn name(self) -> &'static str {
        match self {
            SchedPolicy::Deadline => "deadline",
            SchedPolicy::Fifo { .. } => "fifo",
            SchedPolicy::Other => "other",
        }
    }
}

/// What the process may do, as the driver found it at start.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct SchedFacts {
    /// CAP_SYS_NICE is in the effective set (root has it): every policy.
    pub cap_sys_nice: bool,
    /// RLIMIT_RTPRIO's soft limit: without the capability, `SCHED_FIFO` up to this priority
    /// (never `SCHED_DEADLINE`, which needs the capability).
    pub rlimit_rtprio: u64,
}

/// The policies a timed worker tries, strongest first, ending with [`SchedPolicy::Other`];
/// and why the stronger ones were left out. An empty list (only for
/// [`SchedAsk::Other`]): no timed workers at all, every worker carries every class.
pub fn candidates(ask: SchedAsk, facts: SchedFacts, fifo_priority: u8) -> Plan {
    let fifo = SchedPolicy::Fifo {
        priority: fifo_priority.clamp(1, 99),
    };
    let may_fifo = facts.cap_sys_nice || facts.rlimit_rtprio >= u64::from(fifo_priority.max(1));
    let mut list = Vec::new();
    let mut skipped = Vec::new();
    let want_deadline = matches!(ask, SchedAsk::Auto | SchedAsk::Deadline);
    let want_fifo = matches!(ask, SchedAsk::Auto | SchedAsk::Fifo);
    if ask == SchedAsk::Other {
        return Plan {
            timed: Vec::new(),
            skipped,
        };
    }
    if want_deadline {
        if facts.cap_sys_nice {
            list.push(SchedPolicy::Deadline);
        } else {
            skipped.push("deadline: needs CAP_SYS_NICE".to_string());
        }
    }
    if want_fifo {
        if may_fifo {
            list.push(fifo);
        } else {
            skipped.push(format!(
                "fifo: needs CAP_SYS_NICE or RLIMIT_RTPRIO >= {} (it is {})",
                fifo_priority.max(1),
                facts.rlimit_rtprio
            ));
        }
    }
    list.push(SchedPolicy::Other);
    Plan {
        timed: list,
        skipped,
    }
}

/// [`candidates`]' answer.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Plan {
    /// What a timed worker tries, in order (the last is always `Other`); empty: no timed
    /// workers.
    pub timed: Vec<SchedPolicy>,
    /// Why stronger policies were not tried.
    pub skipped: Vec<String>,
}

impl Plan {
    /// Whether the engine runs timed workers apart from its general ones: only when one of
    /// them may get a real-time policy (otherwise a separate worker buys nothing).
    pub fn separate_timed(&self) -> bool {
        self.timed.iter().any(|p| *p != SchedPolicy::Other)
    }
}

/// How a timed worker's `SCHED_DEADLINE` runtime follows what it was granted.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct DeadlineConfig {
    /// The reservation's period (and relative deadline), ns. Default 1 ms: twice the
    /// default dispatch slack, so a unit is never held by throttling for longer than a
    /// batching window would hold it.
    pub period_ns: u64,
    /// What every timed worker gets with nothing granted (its loop, timers, commands),
    /// in parts per million of the period. Default 100,000 (10 %).
    pub floor_ppm: u32,
    /// The granted CPU is multiplied by this (percent) for the runtime: admission's cost
    /// figures are means, and a worker's turn is not perfectly divisible. Default 200.
    pub headroom_percent: u32,
    /// The most of the period asked for, parts per million. Default 900,000 (90 %: the
    /// kernel keeps 5 % of each CPU from real-time work by default, and general workers
    /// need the rest).
    pub max_ppm: u32,
}

impl Default for DeadlineConfig {
    fn default() -> Self {
        DeadlineConfig {
            period_ns: 1_000_000,
            floor_ppm: 100_000,
            headroom_percent: 200,
            max_ppm: 900_000,
        }
    }
}

impl DeadlineConfig {
    pub fn check(&self) -> Result<(), String> {
        if !(100_000..=1_000_000_000).contains(&self.period_ns) {
            return Err(format!(
                "deadline period must be 100 µs..=1 s, got {} ns",
                self.period_ns
            ));
        }
        if self.floor_ppm == 0 || self.floor_ppm > self.max_ppm || self.max_ppm > 1_000_000 {
            return Err(format!(
                "deadline floor {} ppm and max {} ppm must satisfy 0 < floor <= max <= 1,000,000",
                self.floor_ppm, self.max_ppm
            ));
        }
        if self.headroom_percent < 100 {
            return Err(format!(
                "deadline headroom must be at least 100 %, got {}",
                self.headroom_percent
            ));
        }
        Ok(())
    }
}

/// A `SCHED_DEADLINE` reservation: `runtime_ns` of CPU every `period_ns`, by `deadline_ns`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct DeadlineParams {
    pub runtime_ns: u64,
    pub deadline_ns: u64,
    pub period_ns: u64,
}

impl DeadlineParams {
    /// The share of a CPU, parts per million, rounded up.
    pub fn ppm(&self) -> u64 {
        (u128::from(self.runtime_ns) * 1_000_000).div_ceil(u128::from(self.period_ns)) as u64
    }
}

/// The reservation for a timed worker granted `granted_ns_per_s` of CPU per second (its
/// admitted streams' sends and its upcalls): the floor plus the grant with headroom, at
/// most `max_ppm` (then without all its headroom); `None` when the floor and the bare grant
/// do not fit under `max_ppm` (admission must then refuse what asked for it).
pub fn deadline_params(granted_ns_per_s: u64, cfg: &DeadlineConfig) -> Option<DeadlineParams> {
    let p = u128::from(cfg.period_ns);
    let floor = p * u128::from(cfg.floor_ppm) / 1_000_000;
    // ns per period = granted/1e9 × period, × headroom.
    let need = (u128::from(granted_ns_per_s) * p * u128::from(cfg.headroom_percent))
        .div_ceil(1_000_000_000u128 * 100);
    let grant = (u128::from(granted_ns_per_s) * p).div_ceil(1_000_000_000);
    let max = p * u128::from(cfg.max_ppm) / 1_000_000;
    let runtime = floor + need;
    if runtime > max {
        if floor + grant > max {
            return None;
        }
        // The grant fits without all its headroom: take what the cap allows.
        return Some(DeadlineParams {
            runtime_ns: max as u64,
            deadline_ns: cfg.period_ns,
            period_ns: cfg.period_ns,
        });
    }
    // The kernel's minimum runtime is 1,024 ns.
    Some(DeadlineParams {
        runtime_ns: (runtime as u64).max(1024),
        deadline_ns: cfg.period_ns,
        period_ns: cfg.period_ns,
    })
}

/// The most one `SCHED_DEADLINE` timed worker can be granted, ns of CPU per second: its cap
/// less its floor, by the same arithmetic as [`deadline_params`] (a grant of this much fits,
/// one more period's worth does not).
pub fn deadline_grant_max_ns_per_s(cfg: &DeadlineConfig) -> u64 {
    let p = u128::from(cfg.period_ns);
    let floor = p * u128::from(cfg.floor_ppm) / 1_000_000;
    let max = p * u128::from(cfg.max_ppm) / 1_000_000;
    u64::try_from(max.saturating_sub(floor) * 1_000_000_000 / p).unwrap_or(u64::MAX)
}

/// The kernel's default real-time throttle (`sched_rt_runtime_us` 950,000 of
/// `sched_rt_period_us` 1,000,000), used where the driver cannot read the machine's.
pub const RT_RUNTIME_PPM_DEFAULT: u32 = 950_000;

/// What the timed workers can carry together, ns of CPU per second: the bound on the CPU
/// admission may promise rt streams once they run only there (issue 37 item 4). A deadline
/// worker takes grants up to [`deadline_grant_max_ns_per_s`]; a FIFO worker is throttled
/// by the kernel to `rt_runtime_ppm` of its CPU; one that got neither is still one thread
/// (one CPU at most, unreserved). `None` without timed workers: the general workers carry
/// rt streams and the configured capacity stands.
pub fn timed_capacity_ns_per_s(
    timed: &[SchedPolicy],
    cfg: &DeadlineConfig,
    rt_runtime_ppm: u32,
) -> Option<u64> {
    if timed.is_empty() {
        return None;
    }
    let fifo = u64::from(rt_runtime_ppm.min(1_000_000)) * 1_000;
    Some(
        timed
            .iter()
            .map(|p| match p {
                SchedPolicy::Deadline => deadline_grant_max_ns_per_s(cfg),
                SchedPolicy::Fifo { .. } => fifo,
                SchedPolicy::Other => 1_000_000_000,
            })
            .fold(0u64, u64::saturating_add),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn auto_as_root_tries_deadline_then_fifo_then_other() {
        let p = candidates(
            SchedAsk::Auto,
            SchedFacts {
                cap_sys_nice: true,
                rlimit_rtprio: 0,
            },
            50,
        );
        assert_eq!(
            p.timed,
            vec![
                SchedPolicy::Deadline,
                SchedPolicy::Fifo { priority: 50 },
                SchedPolicy::Other
            ]
        );
        assert!(p.separate_timed());
    }

    #[test]
    fn rtprio_without_the_capability_gives_fifo_only() {
        let p = candidates(
            SchedAsk::Auto,
            SchedFacts {
                cap_sys_nice: false,
                rlimit_rtprio: 60,
            },
            50,
        );
        assert_eq!(
            p.timed,
            vec![SchedPolicy::Fifo { priority: 50 }, SchedPolicy::Other]
        );
        assert_eq!(p.skipped, vec!["deadline: needs CAP_SYS_NICE".to_string()]);
    }

    #[test]
    fn nobody_gets_no_timed_workers_and_is_told_why() {
        let p = candidates(SchedAsk::Auto, SchedFacts::default(), 50);
        assert_eq!(p.timed, vec![SchedPolicy::Other]);
        assert!(!p.separate_timed());
        assert_eq!(p.skipped.len(), 2);
        assert!(p.skipped[1].contains("RLIMIT_RTPRIO >= 50 (it is 0)"));
        let other = candidates(
            SchedAsk::Other,
            SchedFacts {
                cap_sys_nice: true,
                rlimit_rtprio: 99,
            },
            50,
        );
        assert!(other.timed.is_empty() && !other.separate_timed());
    }

    #[test]
    fn asked_fifo_never_tries_deadline() {
        let p = candidates(
            SchedAsk::Fifo,
            SchedFacts {
                cap_sys_nice: true,
                rlimit_rtprio: 0,
            },
            0,
        );
        assert_eq!(
            p.timed,
            vec![SchedPolicy::Fifo { priority: 1 }, SchedPolicy::Other]
        );
    }

    #[test]
    fn nothing_granted_is_the_floor() {
        let cfg = DeadlineConfig::default();
        let d = deadline_params(0, &cfg).unwrap();
        assert_eq!(d.runtime_ns, 100_000);
        assert_eq!((d.deadline_ns, d.period_ns), (1_000_000, 1_000_000));
        assert_eq!(d.ppm(), 100_000);
    }

    #[test]
    fn a_grant_too_large_is_refused() {
        let cfg = DeadlineConfig::default();
        // 0.5 s/s with 200 % headroom is a whole CPU, beyond 90 %; half the headroom fits.
        assert_eq!(deadline_params(500_000_000, &cfg).unwrap().ppm(), 900_000);
        assert!(deadline_params(900_000_000, &cfg).is_none());
    }

    proptest! {
        #[test]
        fn the_runtime_covers_the_grant_and_stays_in_bounds(
            granted in 0u64..2_000_000_000,
            period_us in 100u64..100_000,
            floor in 1u32..500_000,
            head in 100u32..400,
        ) {
            let cfg = DeadlineConfig {
                period_ns: period_us * 1000,
                floor_ppm: floor,
                headroom_percent: head,
                max_ppm: 900_000,
            };
            prop_assert!(cfg.check().is_ok());
            match deadline_params(granted, &cfg) {
                Some(d) => {
                    // At least the grant itself (ns per period), at most the cap, never above
                    // the period.
                    let grant_per_period =
                        u128::from(granted) * u128::from(cfg.period_ns) / 1_000_000_000;
                    prop_assert!(u128::from(d.runtime_ns) >= grant_per_period);
                    prop_assert!(d.runtime_ns <= cfg.period_ns * 9 / 10 + 1024);
                    prop_assert!(d.runtime_ns >= 1024);
                    // Monotone: less granted never asks more.
                    if let Some(less) = deadline_params(granted / 2, &cfg) {
                        prop_assert!(less.runtime_ns <= d.runtime_ns);
                    }
                }
                None => {
                    let grant_per_period =
                        u128::from(granted) * u128::from(cfg.period_ns) / 1_000_000_000;
                    prop_assert!(grant_per_period > 0);
                }
            }
        }
    }

    #[test]
    fn timed_capacity_sums_what_each_policy_may_take() {
        let cfg = DeadlineConfig::default();
        assert_eq!(deadline_grant_max_ns_per_s(&cfg), 800_000_000);
        assert_eq!(timed_capacity_ns_per_s(&[], &cfg, 950_000), None);
        assert_eq!(
            timed_capacity_ns_per_s(
                &[
                    SchedPolicy::Deadline,
                    SchedPolicy::Fifo { priority: 50 },
                    SchedPolicy::Other
                ],
                &cfg,
                950_000
            ),
            Some(800_000_000 + 950_000_000 + 1_000_000_000)
        );
        // No throttle (-1 read as a million parts): a whole CPU.
        assert_eq!(
            timed_capacity_ns_per_s(&[SchedPolicy::Fifo { priority: 1 }], &cfg, 1_000_000),
            Some(1_000_000_000)
        );
    }

    proptest! {
        /// The bound is the grant the reservation takes and no more: a deadline worker
        /// granted exactly it gets a runtime; one period's worth more is refused.
        #[test]
        fn the_deadline_grant_max_is_exactly_what_fits(
            period_ns in 100_000u64..=1_000_000_000,
            floor_ppm in 1u32..=1_000_000,
            max_extra in 0u32..=1_000_000,
            headroom_percent in 100u32..=400,
        ) {
            let cfg = DeadlineConfig {
                period_ns,
                floor_ppm,
                max_ppm: floor_ppm.saturating_add(max_extra).min(1_000_000),
                headroom_percent,
            };
            prop_assume!(cfg.check().is_ok());
            let g = deadline_grant_max_ns_per_s(&cfg);
            prop_assert!(deadline_params(g, &cfg).is_some());
            let one_more_period = 1_000_000_000u64.div_ceil(period_ns);
            prop_assert!(deadline_params(g + one_more_period, &cfg).is_none());
        }
    }
}
