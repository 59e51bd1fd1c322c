//! The engine's configuration, fixed at start ([`EngineConfig`], its limits), and what the
//! engine found at start ([`EngineInfo`]). Read by the engine and by every worker.

use std::time::Duration;

use penstock_core::admission::cpu::CpuConfig;
use penstock_core::admission::{AdmissionConfig, Capacity};
use penstock_core::sched::edf::Order;

use crate::disk::DiskConfig;

/// The largest [`EngineConfig::buffer_bytes`] the engine accepts: 64 MiB, the largest unit
/// ([`penstock_core::stream::plan::UNIT_BYTES_MAX`]). Each worker maps `pool_buffers` of them
/// at start.
pub const BUFFER_BYTES_MAX: usize = 64 << 20;

/// The largest `streams_max`: completion tokens carry a worker's stream slot in 22 bits.
pub const STREAMS_MAX_LIMIT: usize = 1 << 20;

/// Engine-wide limits and sizes, fixed at start.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Worker threads (event loops).
    pub workers: usize,
    /// Buffers in each worker's pool.
    pub pool_buffers: usize,
    /// Bytes per pool buffer (a multiple of 4096). Bounds the transfer unit of the uring path.
    pub buffer_bytes: usize,
    /// Pool buffers one stream keeps in flight at most (read-ahead depth).
    pub stream_depth: usize,
    /// Pool buffers one uring-path stream may hold at once: what a `bulk` stream borrows at
    /// most, and the most an `rt` stream may reserve. At least 1; a cap above `pool_buffers`
    /// is the whole pool. A stream holds at most `min(stream_depth, client_buffers_max)`.
    pub client_buffers_max: usize,
    /// Streams open at once, all workers together.
    pub streams_max: usize,
    /// Register the pool with io_uring (READ_FIXED); off only to measure the difference.
    pub register_buffers: bool,
    /// How a worker sleeps until the next deadline of a periodic stream.
    pub timer: TimerMode,
    /// Wake this much before a deadline and spin until it (0: off). Bounded by `SPIN_MAX`.
    pub spin: Duration,
    /// Order of the dispatch queue: earliest deadline first, or rate-monotonic (MARS's RTU).
    pub order: Order,
    /// SCHED_FIFO for the workers and mlockall; falls back (with a message) when refused.
    pub realtime: bool,
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

/// The longest spin before a deadline the engine accepts.
pub const SPIN_MAX: Duration = Duration::from_millis(2);

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
            buffer_bytes: 1 << 20,
            stream_depth: 4,
            client_buffers_max: 32,
            streams_max: 4096,
            register_buffers: true,
            timer: TimerMode::Uring,
            spin: Duration::ZERO,
            order: Order::EarliestDeadline,
            realtime: false,
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
    /// Real-time scheduling as asked (`EngineConfig::realtime`); otherwise why not.
    pub realtime: Result<(), String>,
    /// `rt` disk reads carry IOPRIO_CLASS_RT (permitted here).
    pub rt_ioprio: bool,
}
