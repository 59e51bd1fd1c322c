//! What a paced stream does with units whose deadline has passed: the late-unit policy.
//!
//! A stream that stalls (a receiver that stopped reading, a disk that fell behind, a pause of
//! the whole process) finds, when it can move again, every unit of the stall overdue. Sending
//! them all at once (`send`, the default) keeps every byte but ends the stall in a burst: a
//! receiver's jitter buffer overflows, a switch queue drops, and the stream stays late until
//! the burst drains. `skip` drops instead each unit later than the stream's threshold (its
//! miss threshold, one period by default) and counts it as skipped: the stream resumes on its
//! schedule, sending only units whose deadline is at most the threshold ago — what a live
//! receiver would rather have.
//!
//! [`first_unit_in_time`] is the decision, pure: which unit to send next at `now`, given the
//! deadlines. The driver's pacer calls it before each unit; the data path then moves past the
//! skipped units' bytes without sending them.

use std::fmt;
use std::str::FromStr;

use crate::time::Instant;

/// What to do with a unit whose deadline passed more than the threshold ago.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LatePolicy {
    /// Send it anyway, at once (after a stall: a burst of late units).
    #[default]
    Send,
    /// Drop it, count it as skipped, and go on with the first unit still within the
    /// threshold: no burst after a stall.
    Skip,
}

impl LatePolicy {
    pub const ALL: [(&'static str, LatePolicy); 2] =
        [("send", LatePolicy::Send), ("skip", LatePolicy::Skip)];
}

impl fmt::Display for LatePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LatePolicy::Send => "send",
            LatePolicy::Skip => "skip",
        })
    }
}

/// `"send"` or `"skip"` (any case) was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("late-unit policy {0:?}: expected send or skip")]
pub struct LatePolicyError(pub String);

impl FromStr for LatePolicy {
    type Err = LatePolicyError;

    fn from_str(s: &str) -> Result<LatePolicy, LatePolicyError> {
        LatePolicy::ALL
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(s))
            .map(|(_, p)| *p)
            .ok_or_else(|| LatePolicyError(s.chars().take(32).collect()))
    }
}

/// The first unit at or after `next` that is late by at most `late_after_ns` at `now`: the
/// unit a [`LatePolicy::Skip`] stream sends next (units `next ..` the result are skipped).
///
/// `deadline(u)` is unit `u`'s deadline, non-decreasing in `u`; `None` means there is no such
/// unit (past the end of a plan) or it is never due, and counts as not late. A unit is late
/// by `now − deadline`; a unit due now or later is not late.
///
/// O(log k) calls of `deadline` for k skipped units (a doubling search, then a bisection), so
/// a stall of any length costs the same few steps.
pub fn first_unit_in_time(
    next: u64,
    now: Instant,
    late_after_ns: u64,
    deadline: impl Fn(u64) -> Option<Instant>,
) -> u64 {
    let in_time = |u: u64| match deadline(u) {
        None => true,
        Some(d) => d.as_nanos().saturating_add(late_after_ns) >= now.as_nanos(),
    };
    if in_time(next) {
        return next;
    }
    // `lo` is late; find an `hi` in time by doubling the step.
    let mut lo = next;
    let mut step = 1u64;
    let hi = loop {
        let probe = lo.saturating_add(step);
        if in_time(probe) {
            break probe;
        }
        if probe == u64::MAX {
            // Every unit up to u64::MAX is late: no unit index is left to send.
            return u64::MAX;
        }
        lo = probe;
        step = step.saturating_mul(2);
    };
    // Invariant: `lo` late, `hi` in time, lo < hi.
    let mut hi = hi;
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if in_time(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{Anchored, Schedule, ScheduleLimits, ScheduleSpec};
    use proptest::prelude::*;
    use std::time::Duration;

    fn t(ns: u64) -> Instant {
        Instant::from_nanos(ns)
    }

    #[test]
    fn policy_text_round_trips() {
        for (name, p) in LatePolicy::ALL {
            assert_eq!(p.to_string(), name);
            assert_eq!(name.to_uppercase().parse::<LatePolicy>(), Ok(p));
        }
        assert_eq!(
            "drop".parse::<LatePolicy>().unwrap_err().to_string(),
            "late-unit policy \"drop\": expected send or skip"
        );
        assert_eq!(LatePolicy::default(), LatePolicy::Send);
    }

    #[test]
    fn first_unit_in_time_by_hand() {
        // Unit u due at 10·u ns; threshold 10 ns.
        let dl = |u: u64| Some(t(10 * u));
        assert_eq!(first_unit_in_time(0, t(0), 10, dl), 0);
        assert_eq!(first_unit_in_time(0, t(10), 10, dl), 0); // late by 10: kept
        assert_eq!(first_unit_in_time(0, t(11), 10, dl), 1);
        assert_eq!(first_unit_in_time(3, t(1000), 10, dl), 99);
        assert_eq!(first_unit_in_time(3, t(1000), 0, dl), 100);
        // The end of a plan counts as in time: all remaining units skipped.
        let plan = |u: u64| (u < 5).then(|| t(10 * u));
        assert_eq!(first_unit_in_time(0, t(1000), 10, plan), 5);
        // Never in time.
        assert_eq!(
            first_unit_in_time(0, t(u64::MAX), 0, |_| Some(t(0))),
            u64::MAX
        );
    }

    /// How the driver's pacer runs a stream on `schedule` from `start`, woken at each
    /// deadline, except that nothing runs during `[stall_from, stall_from + stall)`: returns
    /// the instants at which units were sent, and the count skipped.
    fn simulate(
        schedule: Schedule,
        policy: LatePolicy,
        late_after_ns: u64,
        units: u64,
        stall_from: u64,
        stall: u64,
    ) -> (Vec<u64>, u64) {
        let a = Anchored::new(schedule, t(0));
        let mut now = 0u64;
        let mut next = 0u64;
        let mut sent = Vec::new();
        let mut skipped = 0;
        while next < units {
            if now >= stall_from && now < stall_from + stall {
                now = stall_from + stall;
            }
            if policy == LatePolicy::Skip {
                let u =
                    first_unit_in_time(next, t(now), late_after_ns, |u| a.deadline(u)).min(units);
                skipped += u - next;
                next = u;
                if next == units {
                    break;
                }
            }
            let due = a.deadline(next).unwrap().as_nanos();
            if due <= now {
                sent.push(now);
                next += 1;
            } else {
                now = due;
            }
        }
        (sent, skipped)
    }

    fn schedule_of(period_ns: u64, k: u64) -> Schedule {
        let spec = if k == 1 {
            ScheduleSpec::Periodic {
                period: Duration::from_nanos(period_ns),
                unit_bytes: 1316,
            }
        } else {
            ScheduleSpec::Kt {
                cycle_units: k,
                cycle: Duration::from_nanos(period_ns),
                unit_bytes: 1316,
            }
        };
        let mut limits = ScheduleLimits::new(1 << 20);
        limits.period_ns_min = 1;
        limits.units_per_s_max = u64::MAX;
        Schedule::new(&spec, &limits).unwrap()
    }

    proptest! {
        /// With `skip`, a stall ends with no burst: in the period after the stream moves
        /// again it sends only units due within the threshold before it or during that
        /// period — at most `k·(threshold/period + 2)` — while `send` sends every unit of
        /// the stall at once. Every unit is either sent or skipped, never both.
        #[test]
        fn skip_leaves_no_burst_after_a_stall(
            period_ns in 1_000u64..50_000_000,
            k in 1u64..4,
            after_periods in 0u64..3,
            stall_periods in 3u64..200,
            stall_at in 0u64..20,
        ) {
            let s = schedule_of(period_ns, k);
            let late_after_ns = after_periods * period_ns;
            let units = k * (stall_at + stall_periods + 40);
            let stall_from = stall_at * period_ns + period_ns / 2;
            let stall = stall_periods * period_ns;
            let resume = stall_from + stall;
            let in_window = |sent: &[u64]| {
                sent.iter().filter(|&&at| at >= resume && at < resume + period_ns).count() as u64
            };

            let (sent, skipped) = simulate(s, LatePolicy::Skip, late_after_ns, units, stall_from, stall);
            prop_assert_eq!(sent.len() as u64 + skipped, units);
            let bound = k * (after_periods + 2);
            prop_assert!(
                in_window(&sent) <= bound,
                "skip: {} units in the period after the stall (bound {bound})", in_window(&sent)
            );
            prop_assert!(skipped >= k * (stall_periods - after_periods - 1));

            let (sent, skipped) = simulate(s, LatePolicy::Send, late_after_ns, units, stall_from, stall);
            prop_assert_eq!((sent.len() as u64, skipped), (units, 0));
            prop_assert!(in_window(&sent) >= k * (stall_periods - 1), "send bursts");
        }
    }
}
