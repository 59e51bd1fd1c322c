//! Pacing of one stream: its schedule anchored at its first step, the deadlines of units in
//! flight, and the lateness of each completed unit.
//!
//! Lateness is measured as Roadrunner measured it: from the unit's scheduled time (the start
//! of its period) to the completion of its send, read from the clock when the completion is
//! handled.
//!
//! The late-unit policy (`core::schedule::LatePolicy`) is applied at the gate: with `skip`,
//! [`Pace::gate`] answers [`Gate::Skip`] with the units later than the miss threshold (core's
//! `first_unit_in_time` decides), the data path moves its position past their bytes without
//! sending them and calls [`Pace::skipped`]; the stream goes on with the first unit in time.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::report::{Counters, lateness_bucket};

use penstock_core::lateness::{LatenessStats, TraceRecord};
use penstock_core::schedule::{Anchored, LatePolicy, Schedule, UnitPlan, first_unit_in_time};
use penstock_core::time::Instant;

/// Where deadlines come from: a schedule's formula, or a plan's list (playback of a recording).
enum Deadlines {
    Schedule {
        schedule: Schedule,
        anchored: Option<Anchored>,
    },
    /// Unit `n` is due at `start + units[n].offset_ns` and is `units[n].size_bytes` long.
    Plan {
        units: Arc<[UnitPlan]>,
        start: Option<Instant>,
    },
}

/// What the gate says about the next unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gate {
    /// It is due: send it.
    Send,
    /// It is due at this instant.
    Wait(Instant),
    /// The next this many units are later than the threshold (`late=skip`): move past them
    /// unsent, call [`Pace::skipped`], and ask again.
    Skip(u64),
}

pub(crate) struct Pace {
    deadlines: Deadlines,
    late: LatePolicy,
    next_unit: u64,
    in_flight: VecDeque<(u64, Instant)>,
    pub(crate) stats: LatenessStats,
    pub(crate) trace: Option<Vec<TraceRecord>>,
    trace_units_max: usize,
    stream: u64,
    /// Units dropped from the trace because it reached `trace_units_max`.
    pub(crate) trace_dropped: u64,
    /// A unit due at most this long after `now` is sent at `now` (`EngineConfig::dispatch_slack`).
    slack_ns: u64,
}

impl Pace {
    pub(crate) fn new(
        schedule: Schedule,
        stats: LatenessStats,
        trace: bool,
        trace_units_max: usize,
        stream: u64,
        start_at: Option<Instant>,
    ) -> Pace {
        Pace::with(
            Deadlines::Schedule {
                schedule,
                anchored: start_at.map(|t| Anchored::new(schedule, t)),
            },
            stats,
            trace,
            trace_units_max,
            stream,
        )
    }

    /// A stream whose units and deadlines are listed in a plan.
    pub(crate) fn with_plan(
        units: Arc<[UnitPlan]>,
        stats: LatenessStats,
        trace: bool,
        trace_units_max: usize,
        stream: u64,
        start_at: Option<Instant>,
    ) -> Pace {
        Pace::with(
            Deadlines::Plan {
                units,
                start: start_at,
            },
            stats,
            trace,
            trace_units_max,
            stream,
        )
    }

    fn with(
        deadlines: Deadlines,
        stats: LatenessStats,
        trace: bool,
        trace_units_max: usize,
        stream: u64,
    ) -> Pace {
        Pace {
            deadlines,
            late: LatePolicy::Send,
            next_unit: 0,
            in_flight: VecDeque::new(),
            stats,
            trace: trace.then(Vec::new),
            trace_units_max,
            stream,
            trace_dropped: 0,
            slack_ns: 0,
        }
    }

    /// The dispatch slack (0 unless set): [`Pace::gate`] answers `Send` for a unit due at
    /// most `slack` after `now`, so that one wake-up of the worker sends every unit due
    /// within it. Lateness is still measured against the unit's own deadline.
    pub(crate) fn with_slack(mut self, slack: std::time::Duration) -> Pace {
        self.slack_ns = u64::try_from(slack.as_nanos()).unwrap_or(u64::MAX);
        self
    }

    /// The late-unit policy (`Send` unless set).
    pub(crate) fn with_late(mut self, late: LatePolicy) -> Pace {
        self.late = late;
        self
    }

    /// Anchors the deadlines at `now` unless they already are (`start_at`, or an earlier call).
    fn anchor(&mut self, now: Instant) {
        match &mut self.deadlines {
            Deadlines::Schedule { schedule, anchored } => {
                anchored.get_or_insert_with(|| Anchored::new(*schedule, now));
            }
            Deadlines::Plan { start, .. } => {
                start.get_or_insert(now);
            }
        }
    }

    /// Whether the next unit goes at `now` (it is due by `now` plus the slack), waits, or
    /// (`late=skip`) is skipped with the units after it that are later than the miss
    /// threshold.
    pub(crate) fn gate(&mut self, now: Instant) -> Gate {
        self.anchor(now);
        if self.late == LatePolicy::Skip {
            let after_ns = self.stats.miss_after_ns();
            let first = first_unit_in_time(self.next_unit, now, after_ns, |u| self.deadline(u));
            if first > self.next_unit {
                return Gate::Skip(first - self.next_unit);
            }
        }
        let horizon = Instant::from_nanos(now.as_nanos().saturating_add(self.slack_ns));
        match self.deadline(self.next_unit) {
            Some(d) if d > horizon => Gate::Wait(d),
            _ => Gate::Send,
        }
    }

    /// Bytes of the next `units` units: a plan's own sizes, else `unit_bytes` each.
    pub(crate) fn bytes_of_next(&self, units: u64, unit_bytes: u64) -> u64 {
        match self.plan() {
            Some(plan) => {
                let from = usize::try_from(self.next_unit).unwrap_or(usize::MAX);
                let n = usize::try_from(units).unwrap_or(usize::MAX);
                plan.iter()
                    .skip(from)
                    .take(n)
                    .map(|u| u64::from(u.size_bytes))
                    .sum()
            }
            None => units.saturating_mul(unit_bytes),
        }
    }

    /// The data path moved past the next `units` units, `bytes` in all, without sending them.
    pub(crate) fn skipped(&mut self, units: u64, bytes: u64, live: &Counters) {
        self.next_unit = self.next_unit.saturating_add(units);
        self.stats.skipped(units, bytes);
        live.units_skipped.fetch_add(units, Ordering::Relaxed);
        live.bytes_skipped.fetch_add(bytes, Ordering::Relaxed);
    }

    /// The deadline of `unit` once anchored (`None` before the first `gate`, for burst, or
    /// past the end of a plan).
    fn deadline(&self, unit: u64) -> Option<Instant> {
        match &self.deadlines {
            Deadlines::Schedule { anchored, .. } => anchored.as_ref()?.deadline(unit),
            Deadlines::Plan { units, start } => {
                let u = units.get(usize::try_from(unit).ok()?)?;
                Some(Instant::from_nanos(
                    start.as_ref()?.as_nanos().saturating_add(u.offset_ns),
                ))
            }
        }
    }

    /// The plan's units, for a stream cut by a plan rather than into equal units.
    pub(crate) fn plan(&self) -> Option<&[UnitPlan]> {
        match &self.deadlines {
            Deadlines::Plan { units, .. } => Some(units),
            Deadlines::Schedule { .. } => None,
        }
    }

    /// The next unit's index and its plan entry (`None`: not a plan, or past its end): the RTP
    /// header's sequence number and timestamp come from them.
    pub(crate) fn next_planned(&self) -> Option<(u64, UnitPlan)> {
        let units = self.plan()?;
        let u = *units.get(usize::try_from(self.next_unit).ok()?)?;
        Some((self.next_unit, u))
    }

    /// Bytes of the next unit when a plan says (`None`: the stream's fixed unit).
    pub(crate) fn next_unit_bytes(&self) -> Option<usize> {
        let units = self.plan()?;
        Some(units.get(usize::try_from(self.next_unit).ok()?)?.size_bytes as usize)
    }

    /// The deadline of unit `k` (anchoring the schedule at `now` if it is not yet).
    pub(crate) fn deadline_of(&mut self, k: u64, now: Instant) -> Option<Instant> {
        self.anchor(now);
        self.deadline(k)
    }

    /// The next unit's send was issued.
    pub(crate) fn issued(&mut self) {
        let d = self
            .deadline(self.next_unit)
            .expect("gate() anchors the schedule before a unit is issued");
        self.in_flight.push_back((self.next_unit, d));
        self.next_unit += 1;
    }

    /// The oldest unit in flight completed at `now`, `bytes` long; its lateness also goes to
    /// the stream's live counters.
    pub(crate) fn completed(&mut self, now: Instant, bytes: u64, live: &Counters) {
        let Some((seq, scheduled)) = self.in_flight.pop_front() else {
            return;
        };
        // Cues' pause form: the last unit of a cycle sent starts the pause (core decides).
        if let Deadlines::Schedule {
            anchored: Some(a), ..
        } = &mut self.deadlines
        {
            a.sent(seq, now);
        }
        self.stats.record(scheduled, now, bytes);
        // As `LatenessStats::record` measures it: early counts as on time.
        let lateness_ns = now
            .checked_duration_since(scheduled)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        live.lateness_max_ns
            .fetch_max(lateness_ns, Ordering::Relaxed);
        live.lateness[lateness_bucket(lateness_ns)].fetch_add(1, Ordering::Relaxed);
        if lateness_ns > self.stats.miss_after_ns() {
            live.misses.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(t) = &mut self.trace {
            if t.len() < self.trace_units_max {
                t.push(TraceRecord {
                    stream: self.stream,
                    seq,
                    scheduled,
                    completed: now,
                    bytes,
                });
            } else {
                self.trace_dropped += 1;
            }
        }
    }

    /// The period between units, for the EDF queue's rate-monotonic order (0 if none).
    pub(crate) fn period_ns(&self) -> u64 {
        match &self.deadlines {
            Deadlines::Schedule { schedule, .. } => schedule.period().map_or(0, |p| p.floor_ns()),
            Deadlines::Plan { .. } => 0,
        }
    }

    /// Pauses: deadlines of later units move by the pause's length when resumed.
    pub(crate) fn resume_after(&mut self, paused_at: Instant, now: Instant) {
        let pause = now.saturating_duration_since(paused_at);
        match &mut self.deadlines {
            Deadlines::Schedule {
                anchored: Some(a), ..
            } => a.shift(pause),
            Deadlines::Plan { start: Some(s), .. } => *s = s.saturating_add(pause),
            _ => {}
        }
    }
}
