//! CPU admission of Real-Time Upcalls (MARS §4.5): a periodic callback declares its period
//! `T` and its computation time, its **budget** `C`; it is admitted onto a worker only if
//! every activation of every upcall on that worker can still start in time to finish its
//! budget by the end of its period.
//!
//! # The model, and what it assumes
//! A worker's dispatcher runs the upcalls' activations and the streams' units in one queue
//! ([`crate::sched::edf`]), in EDF or rate-monotonic order, and **without preemption**: an
//! activation, once started, runs to its end (as MARS's RTUs did). Each upcall is a task of
//! utilization `U = C / T` whose deadline is the end of its period. A non-preemptive task can
//! be delayed by one lower-priority piece of work that started just before it: here the
//! longest budget among upcalls of longer period, or the streams' own work (one turn of the
//! worker's loop, at most `stream_blocking_ns` by assumption). So the test, with upcalls
//! sorted by period and `B_i = max(stream_blocking_ns, max C_j over j after i)`, is
//!
//! ```text
//! for every i:   Σ_{j ≤ i} C_j / T_j  +  B_i / T_i  +  stream_reserve  ≤  bound(i)
//! ```
//!
//! with `bound(i) = utilization_max` under EDF (Baker's stack-resource test: a whole job is
//! one critical section), and `min(utilization_max, i·(2^{1/i} − 1))` under RM (Liu and
//! Layland's bound with blocking, Sha, Rajkumar and Lehoczky). Both are sufficient
//! conditions: an admitted set meets every deadline if its upcalls keep to their budgets and
//! the streams keep to their assumed share; a refused set might have been schedulable.
//!
//! The streams are not tasks of this test: what their dispatch costs per worker is not
//! declared by them, so the configuration reserves a share of each worker for it
//! (`stream_reserve_percent`) and bounds how long one turn of it may hold the worker
//! (`stream_blocking_ns`). Both are assumptions the operator sets (the defaults are checked
//! by `penstock bench rtu --upcalls`, which measures the worker beside 100 paced streams);
//! `utilization_max_percent` keeps headroom for what neither covers (the kernel taking the
//! CPU away, cache effects). Utilizations are integers in parts per billion, rounded up, so
//! the test is exact and errs on the side of refusing.

use std::collections::BTreeMap;
use std::fmt;

use crate::sched::edf::Order;

/// Parts per billion: a whole worker.
const PPB: u64 = 1_000_000_000;

/// The most upcalls one worker may be configured to hold.
pub const RTUS_MAX_LIMIT: u32 = 4096;

/// How much of each worker upcalls may take, and what is assumed about the streams beside
/// them. Fixed at start.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CpuConfig {
    /// The bound of the test: the share of one worker that the upcalls, the streams' reserve
    /// and the blocking term may fill together, in percent (1..=100). Default 70.
    pub utilization_max_percent: u8,
    /// The share of each worker kept for the streams' own dispatch, in percent (below
    /// `utilization_max_percent`). Default 20.
    pub stream_reserve_percent: u8,
    /// The longest the worker may be busy with streams (one turn of its loop) before it looks
    /// at its queue again: an activation released meanwhile waits that long. Default 1 ms.
    pub stream_blocking_ns: u64,
    /// Upcalls one worker holds at most (1..=[`RTUS_MAX_LIMIT`]). Default 64.
    pub rtus_max: u32,
    /// The shortest period accepted. Default 1 ms.
    pub period_ns_min: u64,
    /// The longest period accepted. Default 1 day.
    pub period_ns_max: u64,
}

impl Default for CpuConfig {
    fn default() -> Self {
        CpuConfig {
            utilization_max_percent: 70,
            stream_reserve_percent: 20,
            stream_blocking_ns: 1_000_000,
            rtus_max: 64,
            period_ns_min: 1_000_000,
            period_ns_max: 86_400 * PPB,
        }
    }
}

/// Why a CPU admission configuration was refused.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CpuConfigError {
    #[error("utilization_max_percent {percent} is outside 1..=100")]
    UtilizationMax { percent: u8 },
    #[error(
        "stream_reserve_percent {reserve} leaves nothing of utilization_max_percent {max} for upcalls"
    )]
    Reserve { reserve: u8, max: u8 },
    #[error("rtus_max {rtus_max} is outside 1..={RTUS_MAX_LIMIT}")]
    RtusMax { rtus_max: u32 },
    #[error("period_ns_min {min} must be at least 1 and at most period_ns_max {max}")]
    Periods { min: u64, max: u64 },
}

impl CpuConfig {
    fn check(&self) -> Result<(), CpuConfigError> {
        if !(1..=100).contains(&self.utilization_max_percent) {
            return Err(CpuConfigError::UtilizationMax {
                percent: self.utilization_max_percent,
            });
        }
        if self.stream_reserve_percent >= self.utilization_max_percent {
            return Err(CpuConfigError::Reserve {
                reserve: self.stream_reserve_percent,
                max: self.utilization_max_percent,
            });
        }
        if self.rtus_max == 0 || self.rtus_max > RTUS_MAX_LIMIT {
            return Err(CpuConfigError::RtusMax {
                rtus_max: self.rtus_max,
            });
        }
        if self.period_ns_min == 0 || self.period_ns_min > self.period_ns_max {
            return Err(CpuConfigError::Periods {
                min: self.period_ns_min,
                max: self.period_ns_max,
            });
        }
        Ok(())
    }

    fn utilization_max_ppb(&self) -> u64 {
        u64::from(self.utilization_max_percent) * (PPB / 100)
    }

    fn reserve_ppb(&self) -> u64 {
        u64::from(self.stream_reserve_percent) * (PPB / 100)
    }
}

/// What an upcall declares: its period and the CPU time one activation needs at most.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct RtuDemand {
    pub period_ns: u64,
    pub budget_ns: u64,
}

impl RtuDemand {
    /// `C / T` in parts per billion, rounded up.
    pub fn utilization_ppb(&self) -> u64 {
        ppb_of(self.budget_ns, self.period_ns)
    }
}

/// `part / whole` in parts per billion, rounded up (`whole` > 0).
fn ppb_of(part: u64, whole: u64) -> u64 {
    let v = (u128::from(part) * u128::from(PPB)).div_ceil(u128::from(whole.max(1)));
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// Liu and Layland's bound `n · (2^{1/n} − 1)` in parts per billion, rounded down, less one
/// part so that the last bit of the floating-point power cannot admit what exact arithmetic
/// would refuse.
pub fn liu_layland_ppb(n: u32) -> u64 {
    let n = f64::from(n.max(1));
    let bound = n * ((1.0 / n).exp2() - 1.0);
    ((bound * PPB as f64).floor() as u64).saturating_sub(1)
}

/// The test's bound for the `rank`-th upcall by period (from 1).
fn bound_ppb(order: Order, config: &CpuConfig, rank: u32) -> u64 {
    match order {
        Order::EarliestDeadline => config.utilization_max_ppb(),
        Order::RateMonotonic => config.utilization_max_ppb().min(liu_layland_ppb(rank)),
    }
}

/// The first condition of the test that a set fails: at the upcall of period
/// `period_ns`, the sum on the left exceeds the bound.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Unschedulable {
    pub order: Order,
    /// The period at which the condition fails.
    pub period_ns: u64,
    /// `Σ C_j / T_j` of the upcalls of period up to it.
    pub rtus_ppb: u64,
    /// The blocking term `B / T` and its `B`.
    pub blocking_ns: u64,
    pub blocking_ppb: u64,
    pub reserve_ppb: u64,
    pub bound_ppb: u64,
    /// `Σ C / T` of the whole set.
    pub utilization_ppb: u64,
}

impl Unschedulable {
    /// The left side of the failed condition.
    pub fn need_ppb(&self) -> u64 {
        self.rtus_ppb
            .saturating_add(self.blocking_ppb)
            .saturating_add(self.reserve_ppb)
    }
}

fn frac(ppb: u64) -> String {
    format!("{:.3}", ppb as f64 / PPB as f64)
}

fn ms(ns: u64) -> String {
    let v = ns as f64 / 1e6;
    if v.fract() == 0.0 {
        format!("{v:.0} ms")
    } else {
        format!("{v:.3} ms")
    }
}

impl fmt::Display for Unschedulable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let order = match self.order {
            Order::EarliestDeadline => "EDF",
            Order::RateMonotonic => "RM",
        };
        write!(
            f,
            "under {order} the upcall set (utilization {} of a worker) is not schedulable: at period {}, \
             upcalls {} + blocking {} / {} = {} + stream reserve {} = {} > bound {}",
            frac(self.utilization_ppb),
            ms(self.period_ns),
            frac(self.rtus_ppb),
            ms(self.blocking_ns),
            ms(self.period_ns),
            frac(self.blocking_ppb),
            frac(self.reserve_ppb),
            frac(self.need_ppb()),
            frac(self.bound_ppb),
        )
    }
}

/// The schedulability test (see the module doc) of `set` on one worker.
pub fn check_set(order: Order, config: &CpuConfig, set: &[RtuDemand]) -> Result<(), Unschedulable> {
    let mut sorted = set.to_vec();
    sorted.sort_unstable();
    let utilization_ppb = sorted
        .iter()
        .fold(0u64, |a, d| a.saturating_add(d.utilization_ppb()));
    // Blocking of the i-th: the longest budget after it (suffix maximum), or the streams'.
    let mut blocking = vec![config.stream_blocking_ns; sorted.len()];
    let mut longest_after = 0;
    for i in (0..sorted.len()).rev() {
        blocking[i] = blocking[i].max(longest_after);
        longest_after = longest_after.max(sorted[i].budget_ns);
    }
    let mut rtus_ppb = 0u64;
    for (i, d) in sorted.iter().enumerate() {
        rtus_ppb = rtus_ppb.saturating_add(d.utilization_ppb());
        let rank = u32::try_from(i + 1).unwrap_or(u32::MAX);
        let u = Unschedulable {
            order,
            period_ns: d.period_ns,
            rtus_ppb,
            blocking_ns: blocking[i],
            blocking_ppb: ppb_of(blocking[i], d.period_ns),
            reserve_ppb: config.reserve_ppb(),
            bound_ppb: bound_ppb(order, config, rank),
            utilization_ppb,
        };
        if u.need_ppb() > u.bound_ppb {
            return Err(u);
        }
    }
    Ok(())
}

/// Why an upcall was not admitted. Nothing changed: the upcalls already admitted stay.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CpuRefusal {
    #[error("invalid upcall: {reason}")]
    Invalid { reason: String },
    #[error("refused: {rtus_max} upcalls already on this worker (rtus_max)")]
    RtusMax { rtus_max: u32 },
    /// With it the set would fail the test; `alone`: it fails even on an idle worker.
    #[error("refused: {detail}{}", if *alone { " (it would not fit even alone)" } else { "" })]
    Unschedulable { detail: Unschedulable, alone: bool },
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct RtuId(pub u64);

/// What an admitted upcall holds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RtuReservation {
    pub id: RtuId,
    pub demand: RtuDemand,
}

/// A worker's CPU as admission sees it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CpuLoad {
    pub rtus: u32,
    /// `Σ C / T` of the admitted upcalls.
    pub utilization_ppb: u64,
    pub reserve_ppb: u64,
    /// `utilization_max`.
    pub bound_ppb: u64,
}

/// The upcalls admitted onto one worker's CPU.
#[derive(Debug, Clone)]
pub struct CpuAdmission {
    order: Order,
    config: CpuConfig,
    rtus: BTreeMap<RtuId, RtuDemand>,
    next_id: u64,
}

impl CpuAdmission {
    /// A worker whose dispatcher serves in `order`.
    pub fn new(order: Order, config: CpuConfig) -> Result<CpuAdmission, CpuConfigError> {
        config.check()?;
        Ok(CpuAdmission {
            order,
            config,
            rtus: BTreeMap::new(),
            next_id: 0,
        })
    }

    pub fn config(&self) -> &CpuConfig {
        &self.config
    }

    pub fn order(&self) -> Order {
        self.order
    }

    /// Checks a demand on its own: budget and period within the configured limits.
    pub fn check_demand(&self, d: RtuDemand) -> Result<(), CpuRefusal> {
        let invalid = |reason: String| Err(CpuRefusal::Invalid { reason });
        let c = &self.config;
        if d.period_ns < c.period_ns_min || d.period_ns > c.period_ns_max {
            return invalid(format!(
                "period {} ns is outside {}..={} ns (period_ns_min, period_ns_max)",
                d.period_ns, c.period_ns_min, c.period_ns_max
            ));
        }
        if d.budget_ns == 0 {
            return invalid("a budget of 0 ns: declare the CPU time one activation needs".into());
        }
        if d.budget_ns > d.period_ns {
            return invalid(format!(
                "budget {} ns is longer than the period {} ns",
                d.budget_ns, d.period_ns
            ));
        }
        Ok(())
    }

    /// Admits `d` if the set with it passes the test; otherwise says which condition fails
    /// and by how much. A refusal changes nothing.
    pub fn admit(&mut self, d: RtuDemand) -> Result<RtuReservation, CpuRefusal> {
        self.check_demand(d)?;
        if self.rtus.len() >= self.config.rtus_max as usize {
            return Err(CpuRefusal::RtusMax {
                rtus_max: self.config.rtus_max,
            });
        }
        let mut set: Vec<RtuDemand> = self.rtus.values().copied().collect();
        set.push(d);
        if let Err(detail) = check_set(self.order, &self.config, &set) {
            let alone = check_set(self.order, &self.config, &[d]).is_err();
            return Err(CpuRefusal::Unschedulable { detail, alone });
        }
        let id = RtuId(self.next_id);
        self.next_id += 1;
        self.rtus.insert(id, d);
        Ok(RtuReservation { id, demand: d })
    }

    /// Gives back what `id` held; `None` if it is not (or no longer) admitted.
    pub fn release(&mut self, id: RtuId) -> Option<RtuDemand> {
        self.rtus.remove(&id)
    }

    /// The admitted upcalls, in admission order.
    pub fn demands(&self) -> impl Iterator<Item = (RtuId, RtuDemand)> + '_ {
        self.rtus.iter().map(|(&id, &d)| (id, d))
    }

    pub fn load(&self) -> CpuLoad {
        CpuLoad {
            rtus: self.rtus.len() as u32, // ≤ rtus_max ≤ RTUS_MAX_LIMIT
            utilization_ppb: self
                .rtus
                .values()
                .fold(0u64, |a, d| a.saturating_add(d.utilization_ppb())),
            reserve_ppb: self.config.reserve_ppb(),
            bound_ppb: self.config.utilization_max_ppb(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;

    fn d(period_ms: u64, budget_ms: u64) -> RtuDemand {
        RtuDemand {
            period_ns: period_ms * MS,
            budget_ns: budget_ms * MS,
        }
    }

    fn edf() -> CpuAdmission {
        CpuAdmission::new(Order::EarliestDeadline, CpuConfig::default()).unwrap()
    }

    #[test]
    fn the_mars_set_is_admitted_and_an_overcommitted_one_refused() {
        let mut a = edf();
        for (p, c) in [(60, 5), (75, 5), (120, 5)] {
            a.admit(d(p, c)).unwrap();
        }
        // 5/60 + 5/75 + 5/120 = 0.19167; + reserve 0.2 + blocking 1/120.
        let load = a.load();
        assert_eq!(load.rtus, 3);
        assert_eq!(load.utilization_ppb, 83_333_334 + 66_666_667 + 41_666_667);
        // 30 ms every 120 ms fits alone (0.25 + reserve 0.2 + blocking 1/120), but beside
        // the others it may hold the 60 ms one for 30 ms: 0.083 + 0.5 + 0.2 > 0.7.
        let e = a.admit(d(120, 30)).unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(e, CpuRefusal::Unschedulable { alone: false, .. }),
            "{msg}"
        );
        assert!(
            msg.starts_with("refused: under EDF the upcall set (utilization 0.442 of a worker)"),
            "{msg}"
        );
        assert!(
            msg.ends_with(
                "at period 60 ms, upcalls 0.083 + blocking 30 ms / 60 ms = 0.500 \
                 + stream reserve 0.200 = 0.783 > bound 0.700"
            ),
            "{msg}"
        );
        assert_eq!(a.load().rtus, 3, "a refusal changes nothing");
    }

    #[test]
    fn blocking_by_a_long_budget_refuses_a_short_period() {
        // Alone, 1/5 fits; beside a 40 ms budget (any period) it may wait 40 ms: 8 periods.
        let mut a = edf();
        a.admit(d(1000, 40)).unwrap();
        let e = a.admit(d(5, 1)).unwrap_err();
        let CpuRefusal::Unschedulable { detail, alone } = e else {
            panic!("{e}");
        };
        assert!(!alone);
        assert_eq!((detail.period_ns, detail.blocking_ns), (5 * MS, 40 * MS));
        assert!(a.admit(d(5, 1)).is_err());
        assert_eq!(a.release(RtuId(0)), Some(d(1000, 40)));
        assert_eq!(a.release(RtuId(0)), None);
        a.admit(d(5, 1)).unwrap();
    }

    #[test]
    fn rate_monotonic_uses_the_liu_layland_bound() {
        assert_eq!(liu_layland_ppb(1), 999_999_999);
        assert_eq!(liu_layland_ppb(2), 828_427_123);
        assert_eq!(liu_layland_ppb(3), 779_763_148);
        let cfg = CpuConfig {
            utilization_max_percent: 100,
            stream_reserve_percent: 0,
            stream_blocking_ns: 0,
            ..CpuConfig::default()
        };
        // Three near 0.27 each: 0.802 ≤ 1 passes EDF, fails RM's 0.780 for three (the
        // first two, 0.537 + blocking 27/101, pass RM's 0.828 for two).
        let set = [d(100, 27), d(101, 27), d(102, 27)];
        assert!(check_set(Order::EarliestDeadline, &cfg, &set).is_ok());
        let e = check_set(Order::RateMonotonic, &cfg, &set).unwrap_err();
        assert_eq!((e.period_ns, e.bound_ppb), (102 * MS, 779_763_148));
        assert!(e.to_string().contains("under RM"), "{e}");
    }

    #[test]
    fn bad_demands_and_configurations_are_refused_clearly() {
        let mut a = edf();
        for (bad, what) in [
            (d(60, 0), "budget of 0"),
            (d(60, 61), "longer than the period"),
            (
                RtuDemand {
                    period_ns: 10,
                    budget_ns: 1,
                },
                "period_ns_min",
            ),
        ] {
            let e = a.admit(bad).unwrap_err();
            assert!(matches!(e, CpuRefusal::Invalid { .. }), "{e}");
            assert!(e.to_string().contains(what), "{e}");
        }
        // More than a worker even alone.
        let e = a.admit(d(60, 59)).unwrap_err();
        assert!(
            e.to_string().ends_with("(it would not fit even alone)"),
            "{e}"
        );
        assert_eq!(a.load().rtus, 0);
        let mut c = CpuConfig {
            rtus_max: 1,
            ..CpuConfig::default()
        };
        let mut one = CpuAdmission::new(Order::EarliestDeadline, c).unwrap();
        one.admit(d(100, 1)).unwrap();
        assert_eq!(
            one.admit(d(100, 1)),
            Err(CpuRefusal::RtusMax { rtus_max: 1 })
        );
        c.stream_reserve_percent = 70;
        assert!(matches!(
            CpuAdmission::new(Order::EarliestDeadline, c),
            Err(CpuConfigError::Reserve { .. })
        ));
        c.stream_reserve_percent = 0;
        c.utilization_max_percent = 101;
        assert!(CpuAdmission::new(Order::RateMonotonic, c).is_err());
    }

    /// A job of the non-preemptive simulation.
    #[derive(Debug)]
    struct Job {
        task: usize,
        release: u64,
        deadline: u64,
        run: u64,
    }

    /// Runs `tasks` (period, budget, first release ≥ 1) on one non-preemptive processor in
    /// `order` until `horizon`, after a blocking job of `blocker` ticks started at 0 (the
    /// worst moment: just before the first releases). Every job runs its whole budget.
    /// Returns the first job to finish after its deadline.
    fn simulate(
        order: Order,
        tasks: &[(u64, u64, u64)],
        blocker: u64,
        horizon: u64,
    ) -> Option<(usize, u64, u64)> {
        let mut next: Vec<u64> = tasks.iter().map(|t| t.2).collect();
        let mut ready: Vec<Job> = Vec::new();
        let mut t = blocker;
        while t < horizon {
            for (i, &(period, budget, _)) in tasks.iter().enumerate() {
                while next[i] <= t {
                    ready.push(Job {
                        task: i,
                        release: next[i],
                        deadline: next[i] + period,
                        run: budget,
                    });
                    next[i] += period;
                }
            }
            let pick = match order {
                Order::EarliestDeadline => ready
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, j)| (j.deadline, j.release, j.task)),
                Order::RateMonotonic => ready
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, j)| (tasks[j.task].0, j.release, j.task)),
            }
            .map(|(k, _)| k);
            match pick {
                None => t = *next.iter().min().expect("at least one task"),
                Some(k) => {
                    let job = ready.swap_remove(k);
                    t += job.run;
                    if t > job.deadline {
                        return Some((job.task, job.release, t));
                    }
                }
            }
        }
        None
    }

    #[test]
    fn the_simulation_finds_a_miss_when_there_is_one() {
        // 6 of 10 and 6 of 12 (utilization 1.1): the second job of either is late.
        assert!(simulate(Order::EarliestDeadline, &[(10, 6, 1), (12, 6, 1)], 0, 200).is_some());
        // Utilization 0.2, but a blocker holds the first release 9 ticks: 1 + 9 + 2 > 11.
        assert!(simulate(Order::EarliestDeadline, &[(10, 2, 1)], 10, 2000).is_some());
        assert!(simulate(Order::EarliestDeadline, &[(10, 2, 1)], 9, 2000).is_none());
        assert!(simulate(Order::RateMonotonic, &[(10, 2, 1), (20, 4, 1)], 0, 2000).is_none());
    }

    fn demand() -> impl Strategy<Value = RtuDemand> {
        (10u64..=200, 1u64..=100).prop_map(|(period, pct)| RtuDemand {
            period_ns: period,
            budget_ns: (period * pct / 200).max(1),
        })
    }

    #[derive(Debug, Clone)]
    enum Op {
        Admit(RtuDemand),
        Release(usize),
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        prop::collection::vec(
            prop_oneof![
                3 => demand().prop_map(Op::Admit),
                1 => (0usize..16).prop_map(Op::Release),
            ],
            0..60,
        )
    }

    fn config(blocking: u64, reserve: u8) -> CpuConfig {
        CpuConfig {
            utilization_max_percent: 100,
            stream_reserve_percent: reserve,
            stream_blocking_ns: blocking,
            rtus_max: 8,
            period_ns_min: 1,
            period_ns_max: 1_000,
        }
    }

    fn order() -> impl Strategy<Value = Order> {
        prop_oneof![Just(Order::EarliestDeadline), Just(Order::RateMonotonic)]
    }

    proptest! {
        /// Admission is the test: what is admitted passes it, an upcall that would break it is
        /// refused (and changes nothing), and releasing one frees what it held.
        #[test]
        fn admission_is_the_schedulability_test(
            order in order(),
            blocking in 0u64..20,
            reserve in 0u8..50,
            ops in ops(),
        ) {
            let cfg = config(blocking, reserve);
            let mut a = CpuAdmission::new(order, cfg).unwrap();
            let mut held: Vec<RtuReservation> = Vec::new();
            for op in ops {
                match op {
                    Op::Admit(d) => {
                        let mut with: Vec<RtuDemand> = held.iter().map(|r| r.demand).collect();
                        with.push(d);
                        let fits = check_set(order, &cfg, &with).is_ok();
                        let before: Vec<_> = a.demands().collect();
                        match a.admit(d) {
                            Ok(r) => {
                                prop_assert!(fits);
                                held.push(r);
                            }
                            Err(CpuRefusal::RtusMax { .. }) => prop_assert_eq!(held.len(), 8),
                            Err(e) => {
                                prop_assert!(!fits, "refused a set that passes: {}", e);
                                prop_assert_eq!(a.demands().collect::<Vec<_>>(), before);
                            }
                        }
                    }
                    Op::Release(k) if !held.is_empty() => {
                        let r = held.remove(k % held.len());
                        prop_assert_eq!(a.release(r.id), Some(r.demand));
                        prop_assert_eq!(a.release(r.id), None);
                        // Removing frees: the same demand fits again at once.
                        let again = a.admit(r.demand);
                        prop_assert!(again.is_ok(), "{:?}", again);
                        held.push(again.unwrap());
                    }
                    Op::Release(_) => {}
                }
                let set: Vec<RtuDemand> = a.demands().map(|(_, d)| d).collect();
                prop_assert_eq!(set.len(), held.len());
                prop_assert!(check_set(order, &cfg, &set).is_ok());
            }
        }

        /// The test is sufficient: a set it admits meets every deadline on a non-preemptive
        /// processor whatever the phases, behind a blocker of `stream_blocking_ns`, with every
        /// job running its whole budget.
        #[test]
        fn an_admitted_set_meets_every_deadline_without_preemption(
            order in order(),
            blocking in 0u64..20,
            demands in prop::collection::vec(demand(), 1..8),
            phases in prop::collection::vec(0u64..200, 8),
            synchronous in any::<bool>(),
        ) {
            let mut a = CpuAdmission::new(order, config(blocking, 0)).unwrap();
            let admitted: Vec<RtuDemand> =
                demands.into_iter().filter(|&d| a.admit(d).is_ok()).collect();
            prop_assert!(!admitted.is_empty() || blocking > 0);
            let tasks: Vec<(u64, u64, u64)> = admitted
                .iter()
                .zip(&phases)
                .map(|(d, &p)| {
                    let first = if synchronous { 1 } else { 1 + p % d.period_ns };
                    (d.period_ns, d.budget_ns, first)
                })
                .collect();
            if !tasks.is_empty() {
                // Started at 0, the blocker holds the first releases (at 1) `blocking` ticks.
                let miss = simulate(order, &tasks, blocking + 1, 4_000);
                prop_assert!(miss.is_none(), "{:?} missed: {:?}", tasks, miss);
            }
        }
    }
}
