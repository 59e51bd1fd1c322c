//! The operator's ceiling on what a caller may ask (Cues §4.4: "very simple checks for
//! transfer requests to be no more aggressive than a preset (k, t)"): per control identity,
//! the most aggressive (k, t) and the highest rate an `OPEN` may ask for.
//!
//! A schedule is within a (K, T) ceiling when its burst is at most K units (`k ≤ K`: the
//! units due at once, 1 for a period or a rate) and its unit rate is at most K per T
//! (`k / t ≤ K / T`, with `t` the cycle: for the pause form the pause, the shortest cycle it
//! can have). It is within a rate ceiling when the bytes per second it can send
//! ([`Schedule::bytes_per_s`]) are at most the ceiling. An unpaced
//! (burst) stream is above any ceiling: it asks for all the disk and network it can get.

use std::fmt;
use std::time::Duration;

use super::Schedule;

/// The most a caller may ask; an absent part bounds nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ceiling {
    /// The most aggressive (k, t): at most `k` units at once, at most `k` per `t`.
    pub kt_max: Option<(u64, Duration)>,
    /// Bytes per second at most.
    pub bytes_per_s_max: Option<u64>,
}

/// Why a schedule is above a ceiling; the text names the ceiling.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CeilingError {
    #[error(
        "an unpaced stream is above the ceiling ({ceiling}): ask rate=, schedule= or pause= within it"
    )]
    Unpaced { ceiling: String },
    #[error("{k} units at once is above the ceiling's {k_max} ({ceiling})")]
    Burst { k: u64, k_max: u64, ceiling: String },
    #[error(
        "{k} units every {t_ns} ns is faster than the ceiling's {k_max} every {t_min_ns} ns ({ceiling})"
    )]
    UnitRate {
        k: u64,
        t_ns: u64,
        k_max: u64,
        t_min_ns: u64,
        ceiling: String,
    },
    #[error("{bytes_per_s} B/s is above the ceiling's {bytes_per_s_max} B/s ({ceiling})")]
    Rate {
        bytes_per_s: u64,
        bytes_per_s_max: u64,
        ceiling: String,
    },
}

impl fmt::Display for Ceiling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sep = "";
        if let Some((k, t)) = self.kt_max {
            write!(f, "schedule_max={k},{}", humantime::format_duration(t))?;
            sep = " ";
        }
        if let Some(b) = self.bytes_per_s_max {
            write!(f, "{sep}rate_max={b}B/s")?;
            sep = " ";
        }
        if sep.is_empty() {
            f.write_str("none")?;
        }
        Ok(())
    }
}

impl Ceiling {
    /// Whether a stream on `schedule` (`None`: unpaced) is within the ceiling.
    pub fn check(&self, schedule: Option<&Schedule>) -> Result<(), CeilingError> {
        if self.kt_max.is_none() && self.bytes_per_s_max.is_none() {
            return Ok(());
        }
        let name = || self.to_string();
        let Some((Some(period), Some(k))) = schedule.map(|s| (s.period(), s.cycle_units())) else {
            return Err(CeilingError::Unpaced { ceiling: name() });
        };
        if let Some((k_max, t_min)) = self.kt_max {
            if k > k_max {
                return Err(CeilingError::Burst {
                    k,
                    k_max,
                    ceiling: name(),
                });
            }
            // k / t <= K / T  ⇔  k · T <= K · t (t the exact cycle: num_ns / den).
            let t_min_ns = t_min.as_nanos();
            let lhs = u128::from(k)
                .saturating_mul(t_min_ns)
                .saturating_mul(u128::from(period.den()));
            let rhs = u128::from(k_max).saturating_mul(period.num_ns());
            if lhs > rhs {
                return Err(CeilingError::UnitRate {
                    k,
                    t_ns: period.floor_ns(),
                    k_max,
                    t_min_ns: u64::try_from(t_min_ns).unwrap_or(u64::MAX),
                    ceiling: name(),
                });
            }
        }
        if let Some(max) = self.bytes_per_s_max {
            let bytes_per_s = schedule.map_or(0, Schedule::bytes_per_s);
            if bytes_per_s > max {
                return Err(CeilingError::Rate {
                    bytes_per_s,
                    bytes_per_s_max: max,
                    ceiling: name(),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{ScheduleLimits, ScheduleSpec};
    use crate::units::Rate;

    fn kt(k: u64, ms: u64, pause: bool) -> Schedule {
        let spec = if pause {
            ScheduleSpec::KtPause {
                cycle_units: k,
                pause: Duration::from_millis(ms),
                unit_bytes: 1000,
            }
        } else {
            ScheduleSpec::Kt {
                cycle_units: k,
                cycle: Duration::from_millis(ms),
                unit_bytes: 1000,
            }
        };
        Schedule::new(&spec, &ScheduleLimits::new(1 << 20)).unwrap()
    }

    #[test]
    fn a_kt_ceiling_bounds_the_burst_and_the_unit_rate() {
        let c = Ceiling {
            kt_max: Some((4, Duration::from_millis(40))),
            bytes_per_s_max: None,
        };
        for pause in [false, true] {
            c.check(Some(&kt(4, 40, pause))).unwrap();
            c.check(Some(&kt(2, 20, pause))).unwrap();
            c.check(Some(&kt(1, 100, pause))).unwrap();
            assert!(matches!(
                c.check(Some(&kt(5, 1000, pause))),
                Err(CeilingError::Burst { k: 5, k_max: 4, .. })
            ));
            let e = c.check(Some(&kt(4, 39, pause))).unwrap_err();
            assert!(matches!(e, CeilingError::UnitRate { .. }));
            assert!(e.to_string().contains("schedule_max=4,40ms"), "{e}");
        }
        // A rate of 1000 units/s is 40 per 40 ms: above 4 per 40 ms.
        let rate = Schedule::new(
            &ScheduleSpec::Rate {
                rate: Rate::UnitsPerSecond { num: 1000, den: 1 },
                unit_bytes: 1000,
            },
            &ScheduleLimits::new(1 << 20),
        )
        .unwrap();
        assert!(c.check(Some(&rate)).is_err());
        assert!(matches!(c.check(None), Err(CeilingError::Unpaced { .. })));
    }

    #[test]
    fn a_rate_ceiling_bounds_bytes_per_second() {
        let c = Ceiling {
            kt_max: None,
            bytes_per_s_max: Some(100_000),
        };
        // 4 × 1000 B per 40 ms = 100 kB/s: at the ceiling.
        c.check(Some(&kt(4, 40, true))).unwrap();
        let e = c.check(Some(&kt(5, 40, false))).unwrap_err();
        assert!(
            e.to_string().contains("125000 B/s") && e.to_string().contains("rate_max=100000B/s"),
            "{e}"
        );
        Ceiling::default().check(None).unwrap();
    }
}
