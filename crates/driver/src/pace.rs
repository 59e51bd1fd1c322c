//! Pacing of one stream: its schedule anchored at its first step, the deadlines of units in
//! flight, and the lateness of each completed unit.
//!
//! Lateness is measured as Roadrunner measured it: from the unit's scheduled time (the start
//! of its period) to the completion of its send, read from the clock when the completion is
//! handled.

use std::collections::VecDeque;

use penstock_core::lateness::{LatenessStats, TraceRecord};
use penstock_core::schedule::{Anchored, Schedule};
use penstock_core::time::Instant;

pub(crate) struct Pace {
    schedule: Schedule,
    anchored: Option<Anchored>,
    next_unit: u64,
    in_flight: VecDeque<(u64, Instant)>,
    pub(crate) stats: LatenessStats,
    pub(crate) trace: Option<Vec<TraceRecord>>,
    trace_units_max: usize,
    stream: u64,
    /// Units dropped from the trace because it reached `trace_units_max`.
    pub(crate) trace_dropped: u64,
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
        Pace {
            schedule,
            anchored: start_at.map(|t| Anchored::new(schedule, t)),
            next_unit: 0,
            in_flight: VecDeque::new(),
            stats,
            trace: trace.then(Vec::new),
            trace_units_max,
            stream,
            trace_dropped: 0,
        }
    }

    /// `Ok(())` when the next unit is due at `now`; otherwise the instant it will be.
    pub(crate) fn gate(&mut self, now: Instant) -> Result<(), Instant> {
        let anchored = self
            .anchored
            .get_or_insert_with(|| Anchored::new(self.schedule, now));
        match anchored.deadline(self.next_unit) {
            Some(d) if d > now => Err(d),
            _ => Ok(()),
        }
    }

    /// The deadline of unit `k` (anchoring the schedule at `now` if it is not yet).
    pub(crate) fn deadline_of(&mut self, k: u64, now: Instant) -> Option<Instant> {
        let schedule = self.schedule;
        self.anchored
            .get_or_insert_with(|| Anchored::new(schedule, now))
            .deadline(k)
    }

    /// The next unit's send was issued.
    pub(crate) fn issued(&mut self) {
        let d = self
            .anchored
            .as_ref()
            .and_then(|a| a.deadline(self.next_unit))
            .expect("gate() anchors the schedule before a unit is issued");
        self.in_flight.push_back((self.next_unit, d));
        self.next_unit += 1;
    }

    /// The oldest unit in flight completed at `now`, `bytes` long.
    pub(crate) fn completed(&mut self, now: Instant, bytes: u64) {
        let Some((seq, scheduled)) = self.in_flight.pop_front() else {
            return;
        };
        self.stats.record(scheduled, now, bytes);
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
        self.schedule.period().map_or(0, |p| p.floor_ns())
    }

    /// Pauses: deadlines of later units move by the pause's length when resumed.
    pub(crate) fn resume_after(&mut self, paused_at: Instant, now: Instant) {
        if let Some(a) = &mut self.anchored {
            a.shift(now.saturating_duration_since(paused_at));
        }
    }
}
