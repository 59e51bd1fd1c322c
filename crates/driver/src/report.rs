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
