//! When each unit of a stream is due: burst, periodic, constant bit rate and Cues' (k, t).
//!
//! A [`Schedule`] is a pure function from `(start, unit_index)` to a deadline. Nothing is
//! accumulated: the deadline of unit `n` is computed from the stream's start with exact
//! rational arithmetic every time it is asked for, so a stream cannot drift however long it
//! runs, and a unit sent late does not push the next ones back. `docs/pacing.md` gives the
//! formulas.
//!
//! The path from user input to a schedule is parse, then validate against limits:
//! [`ScheduleFlags`] (the command-line strings) → [`ScheduleSpec`] (typed, not yet checked) →
//! [`Schedule`] (checked against [`ScheduleLimits`], which the driver derives from its buffer
//! pool and what its dispatcher can meet). Every refusal is a [`ScheduleError`] raised before
//! anything is sent.
//!
//! A schedule says when units are *due*; it does not say how many there are (the file does)
//! and it reads no clock (the caller passes `start` and `now`). [`Anchored`] binds a schedule
//! to a start instant and supports pause/resume and seeking by re-anchoring.

pub mod ceiling;
mod kt;
mod late;
mod periodic;
pub mod plan;
mod rate;

use std::time::Duration;

pub use ceiling::{Ceiling, CeilingError};
pub use kt::parse_kt;
pub use late::{LatePolicy, LatePolicyError, first_unit_in_time};
pub use periodic::Period;
pub use plan::{PlanError, UnitPlan, check_plan, units_fitting};

use crate::time::Instant;
use crate::units::{Rate, UnitsError, parse_duration, parse_rate, parse_size};

/// Why a schedule was refused. Raised before anything is sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// A size, duration or rate that does not parse (a negative period among them).
    #[error(transparent)]
    Units(#[from] UnitsError),
    #[error(
        "invalid schedule {0:?}: expected K,T such as 4,40ms (k units due at the start of every cycle of length t)"
    )]
    KtSyntax(String),
    #[error("--period, --rate and --schedule exclude each other: give at most one")]
    ConflictingPacing,
    #[error("a unit of 0 bytes: a unit must carry at least one byte")]
    ZeroUnit,
    #[error(
        "a unit of {unit_bytes} bytes does not fit in a pool buffer of {unit_bytes_max} bytes: use a --unit of at most {unit_bytes_max}"
    )]
    UnitTooLarge {
        unit_bytes: u64,
        unit_bytes_max: u64,
    },
    #[error("a period of zero: the period must be a positive duration such as 33.333ms")]
    ZeroPeriod,
    #[error("invalid rate {0:?}: a rate must be positive and finite, such as 30/s or 8Mbit/s")]
    InvalidRate(Rate),
    #[error(
        "a period of {period_ns} ns is shorter than {period_ns_min} ns, the shortest the dispatcher can meet: lower the rate or use larger units"
    )]
    PeriodTooShort { period_ns: u64, period_ns_min: u64 },
    #[error("a period of {period_ns} ns is longer than the limit of {period_ns_max} ns")]
    PeriodTooLong { period_ns: u64, period_ns_max: u64 },
    #[error(
        "{units_per_s} units/s is more than the {units_per_s_max} units/s one stream may be paced at: lower the rate or use larger units"
    )]
    RateTooHigh {
        units_per_s: u64,
        units_per_s_max: u64,
    },
    #[error("a (k, t) schedule with k = 0 sends nothing: k must be at least 1")]
    ZeroCycleUnits,
    #[error(
        "a (k, t) schedule with k = {cycle_units} units per cycle is more than the limit of {cycle_units_max}"
    )]
    CycleUnitsTooMany {
        cycle_units: u64,
        cycle_units_max: u64,
    },
}

/// What the driver can honour; a schedule outside these is refused by [`Schedule::new`].
///
/// Named limits rather than constants because they depend on the machine and the
/// configuration: the pool's buffer size, how tight the dispatcher's timer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScheduleLimits {
    /// The pool's buffer size: a unit is read into and sent from one buffer.
    pub unit_bytes_max: u64,
    /// The shortest interval between deadlines the dispatcher can meet (default 1 µs).
    pub period_ns_min: u64,
    /// The longest period accepted (default one day); longer ones are taken for mistakes.
    pub period_ns_max: u64,
    /// The highest unit rate one stream may be paced at (default 1,000,000 units/s).
    pub units_per_s_max: u64,
    /// The largest `k` of a (k, t) schedule (default 1024): all `k` units are due at once,
    /// so `k` bounds the burst a stream may put on the dispatcher and the pool.
    pub cycle_units_max: u64,
}

impl ScheduleLimits {
    /// Limits for a pool of `unit_bytes_max`-byte buffers, the rest at their defaults.
    pub fn new(unit_bytes_max: u64) -> ScheduleLimits {
        ScheduleLimits {
            unit_bytes_max,
            period_ns_min: 1_000,
            period_ns_max: 86_400 * 1_000_000_000,
            units_per_s_max: 1_000_000,
            cycle_units_max: 1024,
        }
    }
}

/// A schedule as asked for, typed but not yet checked against [`ScheduleLimits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScheduleSpec {
    /// No deadlines: every unit as soon as possible (Roadrunner's burst stream).
    Burst { unit_bytes: u64 },
    /// One unit every `period` (`--period 33.333ms --unit 1KiB`).
    Periodic { period: Duration, unit_bytes: u64 },
    /// A frame rate (`--rate 30/s`: one unit every 1/30 s) or a constant bit rate
    /// (`--rate 8Mbit/s --unit 1316`: units spaced so that bytes follow the rate).
    Rate { rate: Rate, unit_bytes: u64 },
    /// Cues' (k, t): `cycle_units` units due at the start of every cycle of length `cycle`
    /// (`--schedule 4,40ms`). See [`parse_kt`] for why `t` is the cycle length.
    Kt {
        cycle_units: u64,
        cycle: Duration,
        unit_bytes: u64,
    },
    /// Cues' (k, t) as the paper defines it: `cycle_units` units, then a pause of `pause`
    /// after the last of them was sent, and again (`pause=4,40ms`). Cycles start when the
    /// sends allow, not on a grid: see [`kt`] and [`Anchored::sent`].
    KtPause {
        cycle_units: u64,
        pause: Duration,
        unit_bytes: u64,
    },
}

/// The pacing flags of `penstock stream`, as typed. Absent flags are `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScheduleFlags<'a> {
    /// `--period DUR`
    pub period: Option<&'a str>,
    /// `--rate RATE` (`30/s`, `8Mbit/s`, `100MB/s`)
    pub rate: Option<&'a str>,
    /// `--unit SIZE`
    pub unit: Option<&'a str>,
    /// `--schedule K,T`
    pub kt: Option<&'a str>,
    /// `--pause K,T` (Cues' pause form)
    pub pause: Option<&'a str>,
}

impl ScheduleSpec {
    /// Parses the pacing flags. No pacing flag means burst; more than one is an error.
    /// Without `--unit`, units are `unit_bytes_default` (the driver passes its buffer size).
    pub fn from_flags(
        flags: &ScheduleFlags<'_>,
        unit_bytes_default: u64,
    ) -> Result<ScheduleSpec, ScheduleError> {
        let unit_bytes = match flags.unit {
            Some(s) => parse_size(s)?,
            None => unit_bytes_default,
        };
        match (flags.period, flags.rate, flags.kt, flags.pause) {
            (None, None, None, None) => Ok(ScheduleSpec::Burst { unit_bytes }),
            (Some(p), None, None, None) => Ok(ScheduleSpec::Periodic {
                period: parse_duration(p)?,
                unit_bytes,
            }),
            (None, Some(r), None, None) => Ok(ScheduleSpec::Rate {
                rate: parse_rate(r)?,
                unit_bytes,
            }),
            (None, None, Some(s), None) => {
                let (cycle_units, cycle) = parse_kt(s)?;
                Ok(ScheduleSpec::Kt {
                    cycle_units,
                    cycle,
                    unit_bytes,
                })
            }
            (None, None, None, Some(s)) => {
                let (cycle_units, pause) = parse_kt(s)?;
                Ok(ScheduleSpec::KtPause {
                    cycle_units,
                    pause,
                    unit_bytes,
                })
            }
            _ => Err(ScheduleError::ConflictingPacing),
        }
    }
}

/// Which kind of schedule, for summaries and traces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ScheduleKind {
    Burst,
    Periodic,
    ConstantBitRate,
    Kt,
    /// Cues' pause form ([`ScheduleSpec::KtPause`]).
    KtPause,
}

/// A validated schedule: the deadline of every unit as a pure function of the stream's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    kind: ScheduleKind,
    unit_bytes: u64,
    /// `None` for burst. Otherwise every `cycle_units` consecutive units share a deadline,
    /// and cycle `i` starts `ceil(i · period)` after the start.
    pace: Option<Pace>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pace {
    period: Period,
    /// Units due together at the start of each cycle: 1, or `k` for (k, t). Always ≥ 1.
    cycle_units: u64,
    /// Cues' pause form: a cycle starts `period` after the previous cycle's last unit was
    /// sent, not `period` after the previous cycle started.
    after_send: bool,
}

impl Schedule {
    /// Checks `spec` against `limits`: refuses a unit of zero bytes or larger than a pool
    /// buffer, a zero period or rate, a period shorter than the dispatcher can meet or absurdly
    /// long, a unit rate above the per-stream maximum, and a (k, t) with k = 0 or too large.
    pub fn new(spec: &ScheduleSpec, limits: &ScheduleLimits) -> Result<Schedule, ScheduleError> {
        let (kind, unit_bytes, pace) = match *spec {
            ScheduleSpec::Burst { unit_bytes } => (ScheduleKind::Burst, unit_bytes, None),
            ScheduleSpec::Periodic { period, unit_bytes } => (
                ScheduleKind::Periodic,
                unit_bytes,
                Some((duration_period(period)?, 1)),
            ),
            ScheduleSpec::Rate { rate, unit_bytes } => {
                let kind = match rate {
                    Rate::UnitsPerSecond { .. } => ScheduleKind::Periodic,
                    Rate::BitsPerSecond(_) => ScheduleKind::ConstantBitRate,
                };
                (
                    kind,
                    unit_bytes,
                    Some((rate::unit_period(rate, unit_bytes)?, 1)),
                )
            }
            ScheduleSpec::Kt {
                cycle_units,
                cycle: t,
                unit_bytes,
            }
            | ScheduleSpec::KtPause {
                cycle_units,
                pause: t,
                unit_bytes,
            } => {
                if cycle_units == 0 {
                    return Err(ScheduleError::ZeroCycleUnits);
                }
                if cycle_units > limits.cycle_units_max {
                    return Err(ScheduleError::CycleUnitsTooMany {
                        cycle_units,
                        cycle_units_max: limits.cycle_units_max,
                    });
                }
                let kind = if matches!(spec, ScheduleSpec::KtPause { .. }) {
                    ScheduleKind::KtPause
                } else {
                    ScheduleKind::Kt
                };
                (kind, unit_bytes, Some((duration_period(t)?, cycle_units)))
            }
        };
        check_unit(unit_bytes, limits)?;
        let pace = match pace {
            None => None,
            Some((period, cycle_units)) => {
                check_period(period, cycle_units, limits)?;
                Some(Pace {
                    period,
                    cycle_units,
                    after_send: kind == ScheduleKind::KtPause,
                })
            }
        };
        Ok(Schedule {
            kind,
            unit_bytes,
            pace,
        })
    }

    /// Which kind of schedule this is.
    pub fn kind(&self) -> ScheduleKind {
        self.kind
    }

    /// Bytes per unit; only a stream's last unit may be shorter.
    pub fn unit_bytes(&self) -> u64 {
        self.unit_bytes
    }

    /// `true` for a burst schedule (no deadlines).
    pub fn is_burst(&self) -> bool {
        self.pace.is_none()
    }

    /// The exact time between consecutive cycles (between units, except for (k, t)); `None`
    /// for burst. For the pause form, the pause: the shortest time between cycles, so the
    /// rate it gives ([`Schedule::bytes_per_s`]) is the most the stream
    /// can send, what admission reserves and an operator's ceiling bounds. Its [`Period::ceil_ns`] is the rate-monotonic priority and the default miss
    /// threshold.
    pub fn period(&self) -> Option<Period> {
        self.pace.map(|p| p.period)
    }

    /// Units due together at the start of each cycle: `k` for (k, t), 1 for periodic and
    /// constant bit rate; `None` for burst.
    pub fn cycle_units(&self) -> Option<u64> {
        self.pace.map(|p| p.cycle_units)
    }

    /// Bytes per second (rounded up) at the most the schedule sends: `k` units of
    /// `unit_bytes` every period; 0 for burst. What an rt stream reserves
    /// (`stream::plan::schedule_bytes_per_s`) and a rate ceiling bounds.
    pub fn bytes_per_s(&self) -> u64 {
        let Some(pace) = self.pace else {
            return 0;
        };
        let p = pace.period;
        // cycle_units units of unit_bytes every num_ns/den nanoseconds.
        let bytes = u128::from(pace.cycle_units)
            * u128::from(self.unit_bytes)
            * 1_000_000_000
            * u128::from(p.den());
        u64::try_from(bytes.div_ceil(p.num_ns().max(1))).unwrap_or(u64::MAX)
    }

    /// Cues' pause form: a cycle starts a pause after the previous one's last unit was sent.
    pub fn is_pause_form(&self) -> bool {
        self.pace.is_some_and(|p| p.after_send)
    }

    /// When unit `unit_index` (counting from 0) is due, as an offset from the stream's start:
    /// `ceil((unit_index / k) · period)` ns (integer division, `k` = 1 unless (k, t)),
    /// saturating at `u64::MAX`; `None` for burst.
    pub fn offset_ns(&self, unit_index: u64) -> Option<u64> {
        let pace = self.pace?;
        Some(pace.period.offset_ns(unit_index / pace.cycle_units))
    }

    /// When unit `unit_index` is due for a stream that started at `start`: `start` plus
    /// [`Schedule::offset_ns`], saturating at [`Instant::MAX`] ("never"); `None` for burst.
    /// Unit 0 is due at `start`.
    pub fn deadline(&self, start: Instant, unit_index: u64) -> Option<Instant> {
        let offset_ns = self.offset_ns(unit_index)?;
        Some(Instant::from_nanos(
            start.as_nanos().saturating_add(offset_ns),
        ))
    }

    /// How many units may have been sent by `now`: the number of units whose deadline is at
    /// or before `now` (0 before `start`), saturating at `u64::MAX`; `u64::MAX` for burst.
    pub fn units_due_by(&self, start: Instant, now: Instant) -> u64 {
        if self.pace.is_none() {
            return u64::MAX;
        }
        if now < start {
            return 0;
        }
        self.units_due_at_offset(now.as_nanos() - start.as_nanos())
    }

    /// Upper bound of the bytes that may have been sent by `now`: [`Schedule::units_due_by`]
    /// full units (a short last unit only makes the true figure smaller), saturating.
    pub fn bytes_due_by(&self, start: Instant, now: Instant) -> u64 {
        self.units_due_by(start, now)
            .saturating_mul(self.unit_bytes)
    }

    /// Units whose offset is at most `elapsed_ns`.
    fn units_due_at_offset(&self, elapsed_ns: u64) -> u64 {
        let Some(pace) = self.pace else {
            return u64::MAX;
        };
        pace.period
            .cycles_due_at(elapsed_ns)
            .saturating_mul(pace.cycle_units)
    }
}

fn duration_period(d: Duration) -> Result<Period, ScheduleError> {
    let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    Period::from_nanos(ns).ok_or(ScheduleError::ZeroPeriod)
}

fn check_unit(unit_bytes: u64, limits: &ScheduleLimits) -> Result<(), ScheduleError> {
    if unit_bytes == 0 {
        return Err(ScheduleError::ZeroUnit);
    }
    if unit_bytes > limits.unit_bytes_max {
        return Err(ScheduleError::UnitTooLarge {
            unit_bytes,
            unit_bytes_max: limits.unit_bytes_max,
        });
    }
    Ok(())
}

fn check_period(
    period: Period,
    cycle_units: u64,
    limits: &ScheduleLimits,
) -> Result<(), ScheduleError> {
    if period.is_shorter_than_ns(limits.period_ns_min) {
        return Err(ScheduleError::PeriodTooShort {
            period_ns: period.floor_ns(),
            period_ns_min: limits.period_ns_min,
        });
    }
    if period.is_longer_than_ns(limits.period_ns_max) {
        return Err(ScheduleError::PeriodTooLong {
            period_ns: period.ceil_ns(),
            period_ns_max: limits.period_ns_max,
        });
    }
    // units/s = k · 10^9 · den / num_ns; compare k · 10^9 · den ≤ max · num_ns exactly.
    // num_ns ≤ period_ns_max · den < 2^128 here, so only the products can overflow, and
    // an overflowing left side is certainly too high.
    let asked = u128::from(cycle_units)
        .checked_mul(1_000_000_000)
        .and_then(|x| x.checked_mul(u128::from(period.den())));
    let allowed = u128::from(limits.units_per_s_max).checked_mul(period.num_ns());
    let too_high = match (asked, allowed) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(a), Some(b)) => a > b,
    };
    if too_high {
        let units_per_s = u128::from(cycle_units) * 1_000_000_000 * u128::from(period.den());
        let units_per_s = u64::try_from(units_per_s.div_ceil(period.num_ns())).unwrap_or(u64::MAX);
        return Err(ScheduleError::RateTooHigh {
            units_per_s,
            units_per_s_max: limits.units_per_s_max,
        });
    }
    Ok(())
}

/// A schedule bound to the instant a given unit is due: the state a stream keeps to pace
/// itself across pauses and seeks.
///
/// Unit `first_unit` is due at `start`, and every later unit `u` at
/// `start + offset(u) − offset(first_unit)`: still computed from the anchor each time, so
/// re-anchoring never introduces drift, and the (k, t) cycle phase of `first_unit` is kept.
/// Units before `first_unit` were sent before the anchor and count as due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Anchored {
    schedule: Schedule,
    start: Instant,
    first_unit: u64,
    /// `schedule.offset_ns(first_unit)`, 0 for burst; cached because every call needs it.
    first_offset_ns: u64,
}

impl Anchored {
    /// A stream whose unit 0 is due at `start`.
    pub fn new(schedule: Schedule, start: Instant) -> Anchored {
        Anchored::at_unit(schedule, 0, start)
    }

    /// A stream resuming (or seeking) at `first_unit`, which is due at `start`.
    pub fn at_unit(schedule: Schedule, first_unit: u64, start: Instant) -> Anchored {
        let first_offset_ns = schedule.offset_ns(first_unit).unwrap_or(0);
        Anchored {
            schedule,
            start,
            first_unit,
            first_offset_ns,
        }
    }

    /// Re-anchors so that `next_unit` is due at `now`: resume after a pause, or a seek.
    pub fn reanchor(&mut self, next_unit: u64, now: Instant) {
        *self = Anchored::at_unit(self.schedule, next_unit, now);
    }

    /// Unit `unit_index` was sent at `now`. In the pause form, the last unit of the anchor's
    /// cycle starts the pause: the next cycle's units are due `t` after `now` (Cues: "k
    /// read/write operations are executed, and then the processor is relinquished for time
    /// t"). Nothing for the other schedules, whose deadlines never depend on sends.
    pub fn sent(&mut self, unit_index: u64, now: Instant) {
        let Some(k) = self.pause_cycle_units() else {
            return;
        };
        if unit_index / k == self.first_unit / k && unit_index % k == k - 1 {
            let pause_ns = self.schedule.period().map_or(0, |p| p.ceil_ns());
            let start = Instant::from_nanos(now.as_nanos().saturating_add(pause_ns));
            *self = Anchored::at_unit(self.schedule, unit_index + 1, start);
        }
    }

    /// `k` when the schedule is Cues' pause form.
    fn pause_cycle_units(&self) -> Option<u64> {
        self.schedule
            .pace
            .filter(|p| p.after_send)
            .map(|p| p.cycle_units)
    }

    /// Moves every deadline `pause` later, keeping the grid: resume after a pause of known
    /// length. Saturates at [`Instant::MAX`].
    pub fn shift(&mut self, pause: Duration) {
        self.start = self.start.saturating_add(pause);
    }

    /// The schedule.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// The instant `first_unit` is due.
    pub fn start(&self) -> Instant {
        self.start
    }

    /// The unit due at [`Anchored::start`].
    pub fn first_unit(&self) -> u64 {
        self.first_unit
    }

    /// When unit `unit_index` is due; `None` for burst. Units before `first_unit` are due at
    /// the anchor (they are overdue, not "never"). In the pause form the units of the
    /// anchor's cycle are due at the anchor, and a later cycle's at [`Instant::MAX`] until
    /// [`Anchored::sent`] learns when the cycle before it ended.
    pub fn deadline(&self, unit_index: u64) -> Option<Instant> {
        let unit_index = unit_index.max(self.first_unit);
        if let Some(k) = self.pause_cycle_units() {
            return Some(if unit_index / k == self.first_unit / k {
                self.start
            } else {
                Instant::MAX
            });
        }
        let offset_ns = self.schedule.offset_ns(unit_index)?;
        // offsets are non-decreasing in the unit index, so this cannot underflow.
        let since_anchor_ns = offset_ns - self.first_offset_ns;
        Some(Instant::from_nanos(
            self.start.as_nanos().saturating_add(since_anchor_ns),
        ))
    }

    /// The units `0 .. n` that may have been sent by `now` (so `n` is an index, not a count
    /// since the anchor); at least `first_unit`; `u64::MAX` for burst.
    pub fn units_due_by(&self, now: Instant) -> u64 {
        if self.schedule.is_burst() {
            return u64::MAX;
        }
        if now < self.start {
            return self.first_unit;
        }
        if let Some(k) = self.pause_cycle_units() {
            return (self.first_unit / k + 1).saturating_mul(k);
        }
        let elapsed_ns =
            (now.as_nanos() - self.start.as_nanos()).saturating_add(self.first_offset_ns);
        self.schedule
            .units_due_at_offset(elapsed_ns)
            .max(self.first_unit)
    }
}

#[cfg(test)]
mod tests;
