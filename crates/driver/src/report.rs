//! What a stream reports: the live [`Counters`] its worker updates and the caller reads (with
//! their snapshots), and the [`StreamReport`] of a stream that ended well.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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

/// The bytes each mechanism moved for one stream, counted by the data path where the call
/// (or the ring operation's completion) returned: what the stream *executed*, as against the
/// path it planned. "Copied" bytes went through the process's memory by a CPU copy in the
/// kernel (copy_to_user / copy_from_user: read, write, recv, send of a user buffer).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MovedBytes {
    /// read/pread/recv into a user buffer (the copy path).
    pub copy_read: u64,
    /// write/send from a user buffer, or writes to a volume's members (the copy path).
    pub copy_written: u64,
    /// sendfile(2): page-cache pages to the target.
    pub sendfile: u64,
    /// splice(2) out of the pipe to the target (the bytes spliced in are the same ones).
    pub splice: u64,
    /// Ring reads into the pool with O_DIRECT (DMA, no CPU copy).
    pub ring_read_direct: u64,
    /// Ring reads into the pool through the page cache (a CPU copy into process memory).
    pub ring_read_buffered: u64,
    /// Ring SEND_ZC from the pool (pages pinned and referenced, not copied, except where the
    /// kernel copies on delivery to a local socket).
    pub ring_send_zc: u64,
    /// Ring SEND, WRITE or WRITE_FIXED from the pool (copied out of process memory).
    pub ring_written_copied: u64,
}

impl MovedBytes {
    /// Bytes the kernel copied into or out of the process's memory: what a zero-copy path
    /// keeps at 0.
    pub fn through_user_space(&self) -> u64 {
        self.copy_read + self.copy_written + self.ring_read_buffered + self.ring_written_copied
    }

    /// The path whose mechanism moved the bytes out, when exactly one did (`None`: nothing
    /// moved, or more than one path's calls moved bytes).
    pub fn path(&self) -> Option<DataPath> {
        let by = [
            (DataPath::Copy, self.copy_written),
            (DataPath::Sendfile, self.sendfile),
            (DataPath::Splice, self.splice),
            (
                DataPath::Uring,
                self.ring_send_zc + self.ring_written_copied,
            ),
        ];
        let mut moved = by.iter().filter(|(_, n)| *n > 0);
        match (moved.next(), moved.next()) {
            (Some((p, _)), None) => Some(*p),
            _ => None,
        }
    }
}

/// [`MovedBytes`] of every stream of this process that ended (well or not), added up when
/// it ends: what a server's metrics say its engine executed (`engine_moved_bytes`).
static MOVED_TOTAL: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];

impl MovedBytes {
    fn fields(&self) -> [u64; 8] {
        [
            self.copy_read,
            self.copy_written,
            self.sendfile,
            self.splice,
            self.ring_read_direct,
            self.ring_read_buffered,
            self.ring_send_zc,
            self.ring_written_copied,
        ]
    }

    /// Each field's name, in the order of the process total's (metrics labels, JSON keys).
    pub const NAMES: [&'static str; 8] = [
        "copy_read",
        "copy_written",
        "sendfile",
        "splice",
        "ring_read_direct",
        "ring_read_buffered",
        "ring_send_zc",
        "ring_written_copied",
    ];

    /// `(name, bytes)` of every field, in [`MovedBytes::NAMES`] order.
    pub fn by_name(&self) -> [(&'static str, u64); 8] {
        let f = self.fields();
        std::array::from_fn(|i| (Self::NAMES[i], f[i]))
    }

    /// What the streams of this process that ended so far moved, all added up.
    pub fn process_total() -> MovedBytes {
        let f: [u64; 8] = std::array::from_fn(|i| MOVED_TOTAL[i].load(Ordering::Relaxed));
        MovedBytes {
            copy_read: f[0],
            copy_written: f[1],
            sendfile: f[2],
            splice: f[3],
            ring_read_direct: f[4],
            ring_read_buffered: f[5],
            ring_send_zc: f[6],
            ring_written_copied: f[7],
        }
    }

    /// Adds a stream that ended to the process total.
    pub(crate) fn add_to_process_total(&self) {
        for (t, n) in MOVED_TOTAL.iter().zip(self.fields()) {
            t.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// How a stream ended well.
#[derive(Debug, Clone)]
pub struct StreamReport {
    pub bytes: u64,
    pub units: u64,
    /// The path the planner chose (`core::stream::plan`).
    pub planned: DataPath,
    /// The path whose calls moved the bytes (from `moved`): `None` when nothing moved or
    /// more than one path's calls did. Tests read this one, not `planned`.
    pub executed: Option<DataPath>,
    /// What each mechanism moved.
    pub moved: MovedBytes,
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
