//! The engine's configuration, fixed at start ([`EngineConfig`], its limits), and what the
//! engine found at start ([`EngineInfo`]). Read by the engine and by every worker.

use std::time::Duration;

use penstock_core::admission::cpu::CpuConfig;
use penstock_core::admission::{AdmissionConfig, Capacity};
use penstock_core::sched::edf::Order;
use penstock_core::sched::policy::{DeadlineConfig, SchedAsk};

use crate::disk::DiskConfig;

/// The largest [`EngineConfig::buffer_bytes`] the engine accepts: 64 MiB, the largest unit
/// ([`penstock_core::stream::plan::UNIT_BYTES_MAX`]). Each worker maps `pool_buffers` of them
/// at start.
pub const BUFFER_BYTES_MAX: usize = 64 << 20;

/// The default [`EngineConfig::pool_shrink_after`]: half a minute with no buffer beyond the
/// start size in use.
pub const POOL_SHRINK_AFTER_DEFAULT: Duration = Duration::from_secs(30);

impl EngineConfig {
    /// The most buffers each worker's pool may grow to (see `pool_max_bytes`).
    pub fn pool_buffers_max(&self) -> usize {
        let most = match self.pool_max_bytes {
            Some(bytes) => bytes / (self.buffer_bytes.max(1) as u64),
            None => 0,
        };
        usize::try_from(most).unwrap_or(usize::MAX).clamp(
            self.pool_buffers,
            crate::sys::POOL_BUFFERS_MAX.max(self.pool_buffers),
        )
    }
}

/// The largest [`EngineConfig::stream_depth`] the engine accepts.
pub const STREAM_DEPTH_LIMIT: usize = 1024;

/// The largest `streams_max`: completion tokens carry a worker's stream slot in 22 bits.
pub const STREAMS_MAX_LIMIT: usize = 1 << 20;

/// Engine-wide limits and sizes, fixed at start.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Worker threads (event loops).
    pub workers: usize,
    /// Buffers in each worker's pool at start (and after it shrank back).
    pub pool_buffers: usize,
    /// The most bytes each worker's pool (timed workers' included) may grow to, MARS's
    /// growing mmbuf pool: `pool_max_bytes / buffer_bytes` buffers, added one at a time when
    /// a stream finds no free buffer. Never fewer than `pool_buffers`; `None` (the library's
    /// default): `pool_buffers`, a pool that never grows.
    pub pool_max_bytes: Option<u64>,
    /// A pool shrinks back to `pool_buffers` once no buffer beyond them has been in use for
    /// this long.
    pub pool_shrink_after: Duration,
    /// Bytes per pool buffer (a multiple of 4096). Bounds the transfer unit of the uring path.
    pub buffer_bytes: usize,
    /// Pool buffers one uring-path stream keeps in flight at most: the cap of its read depth
    /// plus the buffer being sent (the read depth itself is chosen per device: `read_depth`).
    pub stream_depth: usize,
    /// The uring path's read depth (disk reads one stream keeps in flight) per device: from
    /// a calibration file, else self-calibration, else a safe default.
    pub read_depth: ReadDepthConfig,
    /// Pool buffers one uring-path stream may hold at once: what a `bulk` stream borrows at
    /// most, and the most an `rt` stream may reserve. At least 1; a cap above `pool_buffers`
    /// is the whole pool. A stream holds at most `min(stream_depth, client_buffers_max)`.
    pub client_buffers_max: usize,
    /// Streams open at once, all workers together.
    pub streams_max: usize,
    /// Commands one worker's channel holds before the engine refuses new work for it
    /// ([`crate::StreamError::WorkerQueueFull`], [`crate::RtuError::WorkerQueueFull`]): what
    /// openers may queue while the worker's loop is busy between two turns. Commands about
    /// work already there (cancel, pause, ...) wait for room instead. 1..=
    /// [`WORKER_COMMANDS_MAX_LIMIT`]; [`WORKER_COMMANDS_MAX_DEFAULT`] by default.
    pub worker_commands_max: usize,
    /// Register the pool with io_uring (READ_FIXED); off only to measure the difference.
    pub register_buffers: bool,
    /// How a worker sleeps until the next deadline of a periodic stream.
    pub timer: TimerMode,
    /// Wake this much before a deadline and spin until it (0: off). Bounded by `SPIN_MAX`.
    pub spin: Duration,
    /// The dispatch slack: each time a worker wakes for a deadline it sends every paced unit
    /// due by now plus this much, across all its streams, in one submission — never a unit
    /// earlier than its deadline minus the slack; the earliest goes at its deadline. 0: each
    /// unit at its own deadline (one wake-up each, unless deadlines coincide). Bounded by
    /// [`DISPATCH_SLACK_MAX`]; docs/pacing.md says why the default is what it is.
    pub dispatch_slack: Duration,
    /// Order of the dispatch queue: earliest deadline first, or rate-monotonic (MARS's RTU).
    pub order: Order,
    /// mlockall, and (with `sched` left at `Other`) `SCHED_FIFO` for timed workers: the
    /// older switch, kept for `--realtime`. Falls back (with a message) when refused.
    pub realtime: bool,
    /// The CPU policy asked for the timed workers (`penstock_core::sched::policy`): `Auto`
    /// takes the strongest the process may (deadline, FIFO); `Other` (the library's
    /// default) runs no timed workers, every worker carrying every class as before.
    pub sched: SchedAsk,
    /// Timed workers beside the `workers` general ones, when a real-time policy may be had
    /// (0..=64; 0, the default: as many as `workers`, so paced streams spread over as many
    /// threads as without timed workers). They carry the paced and `rt` streams and the
    /// upcalls, never bulk.
    pub timed_workers: usize,
    /// `SCHED_FIFO`'s priority for timed workers (1..=99; default 50).
    pub fifo_priority: u8,
    /// How a timed worker's `SCHED_DEADLINE` runtime follows its grant.
    pub deadline: DeadlineConfig,
    /// Units kept in a stream's trace at most (the rest are counted, not kept).
    pub trace_units_max: usize,
    /// The disk request scheduler every uring-path read goes through.
    pub disk: DiskConfig,
    /// Admission control for streams opened with `class: Some(DiskClass::Rt)` (the capacity
    /// comes from `penstock calibrate`).
    pub admission: AdmissionConfig,
    /// Measure a device on its first rt admission when no calibration file gave figures
    /// (`calibration::SelfCalibration`; off by default in the library).
    pub self_calibration: crate::calibration::SelfCalibration,
    /// Admission of Real-Time Upcalls (`Engine::rtu_create`) against each worker's CPU: the
    /// test's bound, the share kept for the streams, how many upcalls a worker holds
    /// (`penstock_core::admission::cpu`). The test follows `order`.
    pub cpu: CpuConfig,
}

/// How the engine chooses a uring-path stream's read depth: the disk reads it keeps in
/// flight on its source's device (for a volume: on each member's). The first that applies:
/// `fixed`; the device's depth in `calibrated` (a `penstock calibrate` file:
/// `Calibration::read_depths`); the depth self-calibration measured for the device (cached in
/// `self_calibration.cache_dir`, when self-calibration is on); `default`. Always at most
/// `stream_depth - 1` (one buffer is being sent while the others are read), at least 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadDepthConfig {
    /// One depth for every device (a bench comparing depths); `None`: per device.
    pub fixed: Option<usize>,
    /// Depths measured by a calibration: (device as `device::device_of` names it, depth).
    pub calibrated: Vec<(u64, usize)>,
    /// The depth on a device nothing is known of
    /// ([`crate::calibration::READ_DEPTH_DEFAULT`]).
    pub default: usize,
}

impl Default for ReadDepthConfig {
    fn default() -> Self {
        ReadDepthConfig {
            fixed: None,
            calibrated: Vec::new(),
            default: crate::calibration::READ_DEPTH_DEFAULT,
        }
    }
}

/// Where a stream's read depth came from ([`ReadDepthConfig`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadDepthSource {
    Fixed,
    CalibrationFile,
    SelfCalibrated,
    Default,
}

impl std::fmt::Display for ReadDepthSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ReadDepthSource::Fixed => "fixed",
            ReadDepthSource::CalibrationFile => "calibration file",
            ReadDepthSource::SelfCalibrated => "self-calibrated",
            ReadDepthSource::Default => "default",
        })
    }
}

/// Admission with what is used when no calibration file exists.
pub fn conservative_admission() -> AdmissionConfig {
    AdmissionConfig {
        capacity: Capacity::CONSERVATIVE,
        bulk_share_percent: 20,
        streams_max: 4096,
        rt_latency_ns: 0,
        lateness_tolerance_ns: penstock_core::admission::LATENESS_TOLERANCE_NS_DEFAULT,
    }
}

/// `EngineConfig::worker_commands_max` by default: more than a worker's loop sees arrive in
/// one turn under any load measured here, small enough that a stuck loop refuses soon.
pub const WORKER_COMMANDS_MAX_DEFAULT: usize = 1024;

/// The largest `EngineConfig::worker_commands_max` the engine accepts.
pub const WORKER_COMMANDS_MAX_LIMIT: usize = 1 << 20;

/// The longest spin before a deadline the engine accepts.
pub const SPIN_MAX: Duration = Duration::from_millis(2);

/// The largest [`EngineConfig::dispatch_slack`] the engine accepts: units sent this early
/// would no longer keep a media stream's timing (issue 15: arrival within 1 ms of the PCR).
pub const DISPATCH_SLACK_MAX: Duration = Duration::from_millis(1);

/// The default [`EngineConfig::dispatch_slack`] (docs/pacing.md, "Dispatch slack").
pub const DISPATCH_SLACK_DEFAULT: Duration = Duration::from_micros(500);

/// How a worker waits for the next deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TimerMode {
    /// An io_uring timeout with an absolute CLOCK_MONOTONIC time (completions still wake it);
    /// a deadline less than 200 µs away is slept to with clock_nanosleep, which costs less.
    #[default]
    Uring,
    /// clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME) when nothing else is runnable.
    Nanosleep,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            pool_buffers: 32,
            pool_max_bytes: None,
            pool_shrink_after: POOL_SHRINK_AFTER_DEFAULT,
            buffer_bytes: 1 << 20,
            // The deepest calibrated depth and the buffer being sent.
            stream_depth: crate::calibration::READ_DEPTH_MAX + 1,
            read_depth: ReadDepthConfig::default(),
            client_buffers_max: 32,
            streams_max: 4096,
            worker_commands_max: WORKER_COMMANDS_MAX_DEFAULT,
            register_buffers: true,
            timer: TimerMode::Uring,
            spin: Duration::ZERO,
            dispatch_slack: DISPATCH_SLACK_DEFAULT,
            order: Order::EarliestDeadline,
            realtime: false,
            sched: SchedAsk::Other,
            timed_workers: 0,
            fifo_priority: 50,
            deadline: DeadlineConfig::default(),
            trace_units_max: 10_000_000,
            disk: DiskConfig::default(),
            admission: conservative_admission(),
            self_calibration: crate::calibration::SelfCalibration::default(),
            cpu: CpuConfig::default(),
        }
    }
}

/// What the engine found at start.
#[derive(Debug, Clone)]
pub struct EngineInfo {
    /// io_uring works; otherwise why not.
    pub uring: Result<(), String>,
    /// Buffers registered with the ring; otherwise why not.
    pub registered: Result<(), String>,
    /// Real-time scheduling as asked (`EngineConfig::realtime`, or a real-time policy for
    /// the timed workers); otherwise why not.
    pub realtime: Result<(), String>,
    /// Every worker's policy, general ones first (`crate::sched`).
    pub workers: Vec<crate::sched::WorkerSched>,
    /// Why stronger policies were not even tried (what the process may not do), and where
    /// the timed workers' reservations bound admission's rt CPU.
    pub sched_notes: Vec<String>,
    /// `rt` disk reads carry IOPRIO_CLASS_RT (permitted here).
    pub rt_ioprio: bool,
}
