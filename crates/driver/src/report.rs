//! What a stream reports: the live [`Counters`] its worker updates and the caller reads (with
//! their snapshots), and the [`StreamReport`] of a stream that ended well.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;

use penstock_core::lateness::{LatenessStats, TraceRecord};
use penstock_core::stream::{CachePolicy, DataPath};

// The live buckets (`StreamHandle::lateness`) are core's: a pure function of the lateness.
pub use penstock_core::lateness::{LATENESS_BUCKETS, lateness_bucket};

/// Live counters of a stream, updated by its worker.
#[derive(Debug, Default)]
pub struct Counters {
    pub(crate) bytes_read: AtomicU64,
    pub(crate) bytes_sent: AtomicU64,
    pub(crate) units_sent: AtomicU64,
    /// Completed paced units by lateness bucket (see [`LATENESS_BUCKETS`]).
    pub(crate) lateness: [AtomicU64; LATENESS_BUCKETS],
    /// Paced units later than the stream's miss threshold.
    pub(crate) misses: AtomicU64,
    /// The largest lateness of a completed paced unit, in ns.
    pub(crate) lateness_max_ns: AtomicU64,
    /// Units the late-unit policy `skip` dropped unsent, and their bytes.
    pub(crate) units_skipped: AtomicU64,
    pub(crate) bytes_skipped: AtomicU64,
    /// The uring path's read depth the engine chose for the stream (0: another path), and
    /// the most reads it had in flight at once.
    pub(crate) read_depth: AtomicU64,
    pub(crate) reads_in_flight_max: AtomicU64,
    /// The worker has taken a [`StreamHandle::pause`](crate::engine::StreamHandle::pause) (cleared when it takes the resume).
    pub(crate) paused: AtomicBool,
}

/// A snapshot of a paced stream's live lateness counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LatenessCounts {
    /// Units by lateness bucket (see [`LATENESS_BUCKETS`]).
    pub buckets: [u64; LATENESS_BUCKETS],
    /// Units later than the miss threshold (`StreamSpec::miss_after`, default one period).
    pub misses: u64,
    /// The largest lateness so far, exactly, in ns.
    pub max_ns: u64,
    /// Units dropped unsent by the late-unit policy `skip` (`StreamSpec::late`), and their
    /// bytes: the stream's position moved past them.
    pub units_skipped: u64,
    pub bytes_skipped: u64,
}

impl LatenessCounts {
    /// Completed units counted.
    pub fn units(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// An upper bound of the nearest-rank quantile `per_million / 10^6` of lateness, in ns:
    /// the top of the power-of-two bucket that holds it, never above the exact maximum (the
    /// live counts keep buckets only; the report's `LatenessStats` is exact to 1/2048). 0
    /// when no unit completed.
    pub fn quantile_ns_max(&self, per_million: u32) -> u64 {
        let total = self.units();
        if total == 0 {
            return 0;
        }
        let rank = (u128::from(total) * u128::from(per_million.min(1_000_000)))
            .div_ceil(1_000_000)
            .max(1);
        let mut seen = 0u128;
        for (i, &n) in self.buckets.iter().enumerate() {
            seen += u128::from(n);
            if seen >= rank {
                // Bucket i ≥ 1 holds [2^(i-1), 2^i); bucket 0 on time; the last, the rest.
                let top = if i == 0 { 0 } else { (1u64 << i) - 1 };
                return if i == LATENESS_BUCKETS - 1 {
                    self.max_ns
                } else {
                    top.min(self.max_ns)
                };
            }
        }
        self.max_ns
    }
}

/// A uring-path stream's read depth ([`StreamHandle::read_depth`](crate::engine::StreamHandle::read_depth)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadDepthCounts {
    /// Disk reads the stream may keep in flight on its device.
    pub depth: u64,
    /// Where the depth came from (`EngineConfig::read_depth`).
    pub source: crate::config::ReadDepthSource,
    /// The most reads it had in flight at once so far.
    pub in_flight_max: u64,
}

/// A snapshot of [`Counters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CounterSnapshot {
    pub bytes_read: u64,
    pub bytes_sent: u64,
    pub units_sent: u64,
}

/// How a stream ended well.
#[derive(Debug, Clone)]
pub struct StreamReport {
    pub bytes: u64,
    pub units: u64,
    pub path: DataPath,
    pub cache: CachePolicy,
    /// From the worker's first step to the last byte accepted by the target.
    pub elapsed: Duration,
    /// Things the stream did differently than asked, and why (said once per stream).
    pub notes: Vec<String>,
    /// Lateness of a paced stream's units (`summary()` for the figures; `merge` across streams).
    pub lateness: Option<LatenessStats>,
    /// Every unit's times, when asked for with `StreamSpec::trace`.
    pub trace: Vec<TraceRecord>,
}
