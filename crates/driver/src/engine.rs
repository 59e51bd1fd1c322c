//! The engine: the seeds' `stream()` / `cue()` call as a Rust library.
//!
//! ```no_run
//! use penstock_driver::engine::{Engine, EngineConfig, StreamSpec};
//! use penstock_core::endpoint::{Endpoint, Role};
//! let engine = Engine::new(EngineConfig::default())?;
//! let spec = StreamSpec::new(
//!     Endpoint::parse("movie.ts", Role::Source)?,
//!     Endpoint::parse("tcp://127.0.0.1:9000", Role::Target)?,
//! );
//! let stream = engine.open(spec)?;
//! println!("{} bytes so far", stream.counters().bytes_sent);
//! let report = stream.wait()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Endpoints are opened on the caller's thread; the stream then runs on one of the engine's
//! workers (one event loop per thread, many streams each). The caller keeps a
//! [`StreamHandle`]: counters, cancel, wait.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use penstock_core::endpoint::Endpoint;
pub use penstock_core::stream::plan::{DiskClass, Pacing, ZeroCopy, schedule_bytes_per_s};
use penstock_core::stream::plan::{
    PlanLimits, PlanRequest, admission_request, plan_schedule, plan_stream,
};
use penstock_core::stream::{CachePolicy, DataPath, Extent, PathCaps, PathChoice};

use crate::buffers::BufferGauges;
pub use crate::disk::{DiskSettings, DiskTuning};
pub use crate::files::OpenFileStats;
use crate::files::OpenFileTable;
use crate::open::{Opened, open_source, open_target};
use crate::pace::Pace;
use crate::rtu::{CpuHold, Rtu, RtuCallback, RtuCounters, RtuCtl, RtuError, RtuHandle, RtuSpec};
use crate::sched::{TimedBooks, TimedHold};
use crate::worker::{Command, Task, TimedRole, WorkerHandle, spawn_worker};
use penstock_core::admission::cpu::{CpuAdmission, CpuLoad, CpuRefusal, RtuDemand};
use penstock_core::sched::drr::SchedError;
use penstock_core::sched::policy::{
    SchedAsk, SchedPolicy, candidates as sched_candidates, deadline_params, timed_capacity_ns_per_s,
};
// Defined in modules of their own, so that the worker and the data paths need not import the
// engine; re-exported where callers have always found them (`penstock_driver::engine::*`).
pub use crate::config::{
    BUFFER_BYTES_MAX, DISPATCH_SLACK_DEFAULT, DISPATCH_SLACK_MAX, EngineConfig, EngineInfo,
    ReadDepthConfig, ReadDepthSource, SPIN_MAX, STREAM_DEPTH_LIMIT, STREAMS_MAX_LIMIT, TimerMode,
    WORKER_COMMANDS_MAX_DEFAULT, WORKER_COMMANDS_MAX_LIMIT, conservative_admission,
};
pub use crate::error::StreamError;
pub use crate::report::{
    CounterSnapshot, Counters, LATENESS_BUCKETS, LatenessCounts, MovedBytes, ReadDepthCounts,
    StreamReport, lateness_bucket,
};
use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd};

use penstock_core::admission::{
    Admission, DeviceFigures, DeviceId, DeviceUsage, FigureSource, Reservation, ReservationId,
    StreamQos, Usage,
};
use penstock_core::lateness::LatenessStats;
use penstock_core::schedule::LatePolicy;

/// What to stream, from where to where, how.
#[derive(Debug)]
pub struct StreamSpec {
    /// The endpoints [`Engine::open`] opens by name; `None` for a stream between descriptors
    /// the caller opened ([`StreamSpec::opened`], [`Engine::open_opened`]): the engine then
    /// never opens anything by a name, the source's own inode included.
    pub source: Option<Endpoint>,
    pub target: Option<Endpoint>,
    pub extent: Extent,
    /// Transfer unit in bytes: the size of each read and send (a datagram, for UDP targets);
    /// 0: the planner's default for the path, or for the pacing.
    pub unit_bytes: usize,
    pub path: PathChoice,
    pub cache: CachePolicy,
    pub zero_copy: ZeroCopy,
    /// How the caller asked units to be timed: burst, a period, a rate, (k, t), or a unit
    /// plan (media timing). The planner turns it into the stream's schedule (with the unit
    /// default and every pacing rule); the engine runs what the plan says.
    pub pacing: Pacing,
    /// A unit is a miss when later than this (default: one period).
    pub miss_after: Option<Duration>,
    /// Keep every unit's (scheduled, completed) times in the report.
    pub trace: bool,
    /// Disk class: `rt` or `bulk`; `None`: `rt` for paced streams, `bulk` for burst ones.
    /// An explicit `Rt` asks for a guarantee: the stream passes admission control first
    /// (unless `best_effort`).
    pub class: Option<DiskClass>,
    /// With `class: Some(Rt)`: the rt disk queue without a guarantee — no admission, no rate
    /// needed (an HTTP location's class).
    pub best_effort: bool,
    /// Pool buffers an admitted `rt` stream reserves (default: `min(stream_depth,
    /// client_buffers_max)`); on the uring path they are held in its worker's pool.
    pub buffers: Option<u32>,
    /// The instant unit 0 of a paced stream is due (CLOCK_MONOTONIC, see `clock::now`);
    /// `None`: when the stream first runs.
    pub start_at: Option<penstock_core::time::Instant>,
    /// The progress timeout (nginx's `send_timeout`): a stream that moves no byte, read or
    /// sent, for longer than this fails with [`StreamError::Stalled`] — a receiver that stopped
    /// reading, or a socket source that stopped sending. Time paused and time waiting for a
    /// paced unit's own deadline do not count. Checked a few times per timeout, so the stall
    /// is reported between this long and 1.5 times this long after the last byte moved. On the
    /// uring path a send is seen when it completes (a whole unit): a receiver slower than a
    /// unit per timeout counts as stalled there. `None` (or zero): wait forever.
    pub send_timeout: Option<Duration>,
    /// A paced stream's late-unit policy: units later than the miss threshold (`miss_after`,
    /// default one period) are sent anyway (`Send`, the default) or skipped (`Skip`: the
    /// position moves past them unsent, counted in `LatenessCounts::units_skipped`). The
    /// planner refuses `Skip` for a burst stream and for a source that is not a file.
    pub late: LatePolicy,
    /// Send each unit as one RTP packet with this numbering (`penstock_core::rtp`): a 12-byte
    /// header in front of each unit, its sequence number counting units, its timestamp from
    /// the unit's deadline. Needs `units` and a datagram target (the planner checks). The
    /// stream's byte counts stay payload bytes; `units_sent` counts RTP packets.
    pub rtp: Option<penstock_core::rtp::Packetizer>,
    /// RTP interleaved on an RTSP connection: the target is the connection's TCP socket, each
    /// packet framed `$ channel length` in front of its RTP header, sent while holding the
    /// connection's writer gate (docs/rtsp.md, "Interleaved writes"). Needs `rtp`.
    pub interleaved: Option<Interleaved>,
}

pub use crate::gate::Interleaved;

/// The progress timeout of [`StreamSpec::new`] (nginx's `send_timeout` default).
pub const SEND_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);

impl StreamSpec {
    /// A burst stream of the whole source with default unit, path and cache policy.
    pub fn new(source: Endpoint, target: Endpoint) -> StreamSpec {
        StreamSpec {
            source: Some(source),
            target: Some(target),
            ..StreamSpec::opened()
        }
    }

    /// The planner's request for this spec.
    pub fn plan_request(&self) -> PlanRequest {
        PlanRequest {
            path: self.path,
            cache: self.cache,
            zero_copy: self.zero_copy,
            class: self.class,
            best_effort: self.best_effort,
            pacing: self.pacing.clone(),
            unit_bytes: (self.unit_bytes != 0).then_some(self.unit_bytes as u64),
            extent: self.extent,
            buffers: self.buffers,
            late: self.late,
            rtp: self.rtp.is_some(),
            rtp_interleaved: self.rtp.is_some() && self.interleaved.is_some(),
        }
    }

    /// A burst stream between descriptors the caller opened ([`Engine::open_opened`]).
    pub fn opened() -> StreamSpec {
        StreamSpec {
            source: None,
            target: None,
            best_effort: false,
            extent: Extent {
                offset: 0,
                length: None,
            },
            unit_bytes: 0,
            path: PathChoice::Auto,
            cache: CachePolicy::Keep,
            zero_copy: ZeroCopy::Auto,
            pacing: Pacing::Burst,
            miss_after: None,
            trace: false,
            class: None,
            buffers: None,
            start_at: None,
            send_timeout: Some(SEND_TIMEOUT_DEFAULT),
            late: LatePolicy::Send,
            rtp: None,
            interleaved: None,
        }
    }
}

/// The default transfer unit of `path` to a `target` (the planner's rule,
/// [`penstock_core::stream::plan::default_unit_bytes`]).
pub fn default_unit_bytes(
    path: DataPath,
    target: penstock_core::stream::IoKind,
    buffer_bytes: usize,
) -> usize {
    usize::try_from(penstock_core::stream::plan::default_unit_bytes(
        path,
        target,
        buffer_bytes as u64,
    ))
    .unwrap_or(usize::MAX)
}

/// A planned unit later than this is a miss unless `miss_after` says otherwise (a plan has no
/// period to default to).
pub const PLAN_MISS_AFTER_DEFAULT: Duration = Duration::from_millis(1);

/// The caller's side of an open stream.
#[derive(Debug)]
pub struct StreamHandle {
    id: u64,
    path: DataPath,
    expected_bytes: Option<u64>,
    counters: Arc<Counters>,
    read_depth_source: ReadDepthSource,
    cancel: Arc<AtomicBool>,
    worker: WorkerHandle,
    done: Receiver<Result<StreamReport, StreamError>>,
    /// The stream's place against `streams_max`, given back on drop.
    _slot: StreamSlot,
    /// The admission reservation this stream holds, released on drop (and taken or given
    /// back by [`StreamHandle::set_class`]).
    reservation: Mutex<Option<ReservationId>>,
    admission: Arc<Mutex<Admission>>,
    /// Its disk class now.
    class: Mutex<DiskClass>,
    /// The engine's classes in queue order.
    classes: Arc<[String]>,
    /// What it asks admission for in `rt` (the planner's request; `None`: no rate).
    rt_qos: Option<StreamQos>,
    /// Its part of a timed worker's CPU reservation, given back on drop.
    _timed: Option<TimedHold>,
    /// The worker it runs on ([`EngineInfo::workers`]' index).
    worker_index: usize,
}

impl StreamHandle {
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The worker the stream runs on: an index into [`EngineInfo::workers`], which says
    /// whether it is a timed worker and the CPU policy it got.
    pub fn worker_index(&self) -> usize {
        self.worker_index
    }

    /// What admission reserved for this stream (an rt stream), with the figures it was
    /// charged with ([`Reservation::figures`]).
    pub fn reservation(&self) -> Option<Reservation> {
        let id = (*self.reservation.lock().unwrap_or_else(|p| p.into_inner()))?;
        self.admission
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .reservations()
            .find(|r| r.id == id)
            .copied()
    }

    /// Its disk class now.
    pub fn class(&self) -> DiskClass {
        *self.class.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves the running stream to disk class `class` (MARS: a stream may change class while
    /// open; `CLASS id NAME`) without stopping it: re-admitted by the engine's one admission
    /// control first — into `rt`, the rate its plan asks (refused with the resource that is
    /// short, and nothing changes); out of `rt`, its reservation is given back — then its
    /// worker queues its next reads in the new class (reads already queued or in flight keep
    /// theirs). The stream stays on its worker and keeps its pool buffers as they were
    /// reserved or borrowed at open.
    pub fn set_class(&self, class: DiskClass) -> Result<(), StreamError> {
        let index = class_index(&self.classes, class)?;
        let mut cur = self.class.lock().unwrap_or_else(|p| p.into_inner());
        if *cur == class {
            return Ok(());
        }
        let mut reservation = self.reservation.lock().unwrap_or_else(|p| p.into_inner());
        match (class == DiskClass::Rt, *reservation) {
            (true, None) => {
                let qos = self.rt_qos.ok_or(StreamError::Plan(
                    penstock_core::stream::plan::PlanError::RtNeedsRate,
                ))?;
                let r = self
                    .admission
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .admit(qos)?;
                *reservation = Some(r.id);
            }
            (false, Some(id)) => {
                self.admission
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .release(id);
                *reservation = None;
            }
            _ => {}
        }
        self.worker.send(Command::SetClass(
            self.id,
            penstock_core::sched::drr::ClassId::from_index(index),
        ));
        *cur = class;
        Ok(())
    }

    pub fn path(&self) -> DataPath {
        self.path
    }

    /// Bytes the stream will move, when known (a file source).
    pub fn expected_bytes(&self) -> Option<u64> {
        self.expected_bytes
    }

    pub fn counters(&self) -> CounterSnapshot {
        CounterSnapshot {
            bytes_read: self.counters.bytes_read.load(Ordering::Relaxed),
            bytes_sent: self.counters.bytes_sent.load(Ordering::Relaxed),
            units_sent: self.counters.units_sent.load(Ordering::Relaxed),
        }
    }

    /// The uring path's read depth this stream was given (from where) and the most reads it
    /// had in flight so far; `None` for the other paths.
    pub fn read_depth(&self) -> Option<ReadDepthCounts> {
        let depth = self.counters.read_depth.load(Ordering::Relaxed);
        (self.path == DataPath::Uring && depth > 0).then(|| ReadDepthCounts {
            depth,
            source: self.read_depth_source,
            in_flight_max: self.counters.reads_in_flight_max.load(Ordering::Relaxed),
        })
    }

    /// The live lateness counts of a paced stream (all zero for a burst stream). Read while
    /// the worker writes: each bucket is exact, a snapshot may be a unit behind across them.
    pub fn lateness(&self) -> LatenessCounts {
        LatenessCounts {
            buckets: std::array::from_fn(|i| self.counters.lateness[i].load(Ordering::Relaxed)),
            misses: self.counters.misses.load(Ordering::Relaxed),
            max_ns: self.counters.lateness_max_ns.load(Ordering::Relaxed),
            units_skipped: self.counters.units_skipped.load(Ordering::Relaxed),
            bytes_skipped: self.counters.bytes_skipped.load(Ordering::Relaxed),
        }
    }

    /// The worker has taken the last [`StreamHandle::pause`]: from then on it issues no new
    /// I/O for the stream (operations already in the ring, uring path only, still complete).
    pub fn is_paused(&self) -> bool {
        self.counters.paused.load(Ordering::Acquire)
    }

    /// Asks the worker to stop the stream; in-flight I/O completes first. `wait` then returns
    /// [`StreamError::Cancelled`] (or the report, if it had already finished).
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Release);
        self.worker.send(Command::Cancel(self.id));
    }

    /// Stops issuing new I/O (what is in flight completes); a paced stream's later deadlines
    /// move by the length of the pause.
    pub fn pause(&self) {
        self.worker.send(Command::Pause(self.id));
    }

    /// Undoes [`StreamHandle::pause`].
    pub fn resume(&self) {
        self.worker.send(Command::Resume(self.id));
    }

    /// Calls `hook` on the stream's worker right after the report is ready for
    /// [`StreamHandle::wait`] (at once, on the worker, if it already is): an event loop can
    /// then wake on it (an eventfd write) instead of polling `wait_timeout`. `hook` must not
    /// block: it runs on the worker's loop.
    pub fn notify_when_done(&self, hook: Box<dyn FnOnce() + Send>) {
        self.worker.send(Command::Notify(self.id, hook));
    }

    /// Waits for the stream to end.
    pub fn wait(self) -> Result<StreamReport, StreamError> {
        self.done.recv().unwrap_or(Err(StreamError::EngineStopped))
    }

    /// Waits at most `timeout`; `None` if still running.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<Result<StreamReport, StreamError>> {
        match self.done.recv_timeout(timeout) {
            Ok(r) => Some(r),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => None,
            Err(_) => Some(Err(StreamError::EngineStopped)),
        }
    }
}

impl Drop for StreamHandle {
    fn drop(&mut self) {
        if let Some(id) = *self.reservation.lock().unwrap_or_else(|p| p.into_inner()) {
            self.admission
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .release(id);
        }
    }
}

/// An admission reservation taken ahead of a start ([`Engine::admit`]); given back when
/// dropped unused.
#[derive(Debug)]
#[must_use = "a reservation is given back when dropped"]
pub struct Admitted {
    id: Option<ReservationId>,
    qos: StreamQos,
    reservation: Reservation,
    admission: Arc<Mutex<Admission>>,
}

impl Admitted {
    /// What was asked for.
    pub fn qos(&self) -> StreamQos {
        self.qos
    }

    /// What was reserved, and with which figures ([`Reservation::figures`]).
    pub fn reservation(&self) -> &Reservation {
        &self.reservation
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.admission
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .release(id);
        }
    }
}

/// One of the engine's `streams_max` places, taken ahead of [`Engine::open_reserved`] with
/// [`Engine::reserve_stream`]: a caller that must not start what it cannot finish (an HTTP
/// server about to write a response head) learns first whether the engine will take the
/// stream. Dropping it, unused or with the handle that holds it, gives the place back.
#[derive(Debug)]
#[must_use = "a slot is given back when dropped"]
pub struct StreamSlot {
    open_count: Arc<AtomicUsize>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.open_count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Disk reads waiting in the scheduler or in flight, by class ([`Engine::disk_queue_depth`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskQueueDepth {
    pub rt: u64,
    pub bulk: u64,
}

/// Use of the uring path's buffer pools, all workers together (see `buffers`): cheap to
/// read (relaxed atomics the workers update), for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BufferUsage {
    /// Pool buffers now, all workers (`workers × pool_buffers` at start and when idle; more
    /// while a pool has grown; 0 without io_uring).
    pub buffers_total: u64,
    /// The most buffers the pools may grow to, all workers (`pool_max_bytes`).
    pub buffers_max: u64,
    /// Bytes of one buffer.
    pub buffer_bytes: u64,
    /// Buffers added by growth and given back by shrinking, since start, all workers.
    pub grown: u64,
    pub shrunk: u64,
    /// Reserved by the admitted `rt` streams running on the uring path.
    pub reserved: u64,
    /// Held now by `rt` streams (reading, full, sending).
    pub rt_in_use: u64,
    /// Borrowed now by `bulk` streams.
    pub bulk_borrowed: u64,
    /// Buffers `bulk` streams were made to give back to an `rt` stream, since start.
    pub repossessions: u64,
    /// Of those, full chunks given back before they were sent (their range is read again).
    pub reread_chunks: u64,
}

/// The engine. Dropping it stops its workers (streams still running are cancelled).
#[derive(Debug)]
pub struct Engine {
    cfg: EngineConfig,
    /// The most buffers each worker's pool may grow to (`EngineConfig::pool_buffers_max`).
    pool_max: usize,
    workers: Vec<WorkerHandle>,
    /// Each worker's buffer figures, by worker index.
    gauges: Vec<Arc<BufferGauges>>,
    joins: Mutex<Vec<JoinHandle<()>>>,
    next_id: AtomicU64,
    next_worker: AtomicUsize,
    open_count: Arc<AtomicUsize>,
    info: EngineInfo,
    admission: Arc<Mutex<Admission>>,
    /// The disk scheduler settings every worker runs with; the lock also orders changes.
    disk: Mutex<DiskSettings>,
    /// Read-only file sources shared among streams by (device, inode, open mode).
    files: OpenFileTable,
    /// Each worker's CPU as upcall admission sees it, by worker index.
    cpu: Arc<Mutex<Vec<CpuAdmission>>>,
    /// Devices self-calibrated (or tried): their figures, or why not. Held while one is
    /// measured, so that a device is measured once.
    measured: Mutex<BTreeMap<DeviceId, Result<DeviceFigures, String>>>,
    /// Read depths self-calibration found, by device (`None`: measuring failed; the default
    /// depth applies). Held while one is measured, so that a device is measured once.
    depths: Mutex<BTreeMap<u64, Option<usize>>>,
    /// Timed workers, after the `cfg.workers` general ones (0: every worker carries every
    /// class; `crate::sched`).
    timed_count: usize,
    /// What admission granted on each timed worker, and its deadline reservation.
    timed_books: Arc<Mutex<TimedBooks>>,
    next_timed: AtomicUsize,
}

/// Why the engine could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    #[error("invalid engine configuration: {0}")]
    Config(String),
    #[error("could not start a worker: {0}")]
    Worker(String),
}

impl Engine {
    /// Starts the workers. io_uring being refused is not an error: the engine then runs the
    /// copy, sendfile and splice paths on a poll(2) loop, and says so in [`Engine::info`].
    pub fn new(cfg: EngineConfig) -> Result<Engine, EngineError> {
        if cfg.workers == 0 || cfg.workers > 1024 {
            return Err(EngineError::Config(format!(
                "workers must be 1..=1024, got {}",
                cfg.workers
            )));
        }
        if cfg.buffer_bytes == 0
            || !cfg.buffer_bytes.is_multiple_of(4096)
            || cfg.buffer_bytes > BUFFER_BYTES_MAX
        {
            return Err(EngineError::Config(format!(
                "buffer_bytes must be a multiple of 4096 up to 64 MiB, got {}",
                cfg.buffer_bytes
            )));
        }
        if let Some(f) = cfg.disk.adaptive_quantum_factor
            && !(2..=crate::disk::ADAPTIVE_QUANTUM_FACTOR_MAX).contains(&f)
        {
            return Err(EngineError::Config(format!(
                "disk.adaptive_quantum_factor must be 2..={}, got {f}",
                crate::disk::ADAPTIVE_QUANTUM_FACTOR_MAX
            )));
        }
        if cfg.spin > SPIN_MAX {
            return Err(EngineError::Config(format!(
                "spin must be at most {SPIN_MAX:?}, got {:?}",
                cfg.spin
            )));
        }
        if cfg.dispatch_slack > DISPATCH_SLACK_MAX {
            return Err(EngineError::Config(format!(
                "dispatch_slack must be at most {DISPATCH_SLACK_MAX:?}, got {:?}",
                cfg.dispatch_slack
            )));
        }
        // Counts of 1 up to a limit.
        let counts = [
            (
                "worker_commands_max",
                cfg.worker_commands_max,
                WORKER_COMMANDS_MAX_LIMIT,
            ),
            ("streams_max", cfg.streams_max, STREAMS_MAX_LIMIT),
            // A cap: a stream holds at most `min(stream_depth, pool_buffers)`, so the default
            // (the deepest calibrated depth and one) fits a smaller pool too.
            ("stream_depth", cfg.stream_depth, STREAM_DEPTH_LIMIT),
        ];
        for (name, n, limit) in counts {
            if n == 0 || n > limit {
                return Err(EngineError::Config(format!(
                    "{name} must be 1..={limit}, got {n}"
                )));
            }
        }
        let rd = &cfg.read_depth;
        if rd.default == 0 || rd.fixed == Some(0) || rd.calibrated.iter().any(|&(_, d)| d == 0) {
            return Err(EngineError::Config(
                "read depths must be at least 1 (a stream reads one buffer at a time at least)"
                    .into(),
            ));
        }
        if cfg.client_buffers_max == 0 {
            return Err(EngineError::Config(
                "client_buffers_max must be at least 1 (a stream needs a buffer)".into(),
            ));
        }
        if cfg.timed_workers > 64 {
            return Err(EngineError::Config(format!(
                "timed_workers must be 0..=64 (0: as many as workers), got {}",
                cfg.timed_workers
            )));
        }
        cfg.deadline.check().map_err(EngineError::Config)?;
        // The one decision on CPU policy (penstock_core::sched::policy), from what this
        // process may do; `realtime` alone asks FIFO, as it always did.
        let ask = if cfg.sched == SchedAsk::Other && cfg.realtime {
            SchedAsk::Fifo
        } else {
            cfg.sched
        };
        let sched_plan = sched_candidates(ask, crate::sched::gather_facts(), cfg.fifo_priority);
        let timed_count = if sched_plan.separate_timed() {
            if cfg.timed_workers == 0 {
                cfg.workers.min(64)
            } else {
                cfg.timed_workers
            }
        } else {
            0
        };
        let floor = deadline_params(0, &cfg.deadline)
            .ok_or_else(|| EngineError::Config("deadline floor above its maximum".into()))?;
        // Each worker's pool may grow to `pool_max_bytes`.
        let pool_max = cfg.pool_buffers_max();
        let mut workers = Vec::new();
        let mut joins = Vec::new();
        let mut gauges = Vec::new();
        let mut info: Option<EngineInfo> = None;
        let mut scheds = Vec::new();
        let mut mlock: Result<(), String> = Err("not asked for".to_string());
        for i in 0..cfg.workers + timed_count {
            let g = Arc::new(BufferGauges::default());
            let role = (i >= cfg.workers).then(|| TimedRole {
                tries: sched_plan.timed.clone(),
                floor,
            });
            let (handle, join, mut winfo) = spawn_worker(i, &cfg, pool_max, g.clone(), role)
                .map_err(|e| EngineError::Worker(e.to_string()))?;
            workers.push(handle);
            joins.push(join);
            gauges.push(g);
            scheds.append(&mut winfo.workers);
            if i == 0 {
                mlock = winfo.realtime.clone();
            }
            info.get_or_insert(winfo);
        }
        let mut info = info.expect("at least one worker");
        info.realtime = if cfg.realtime {
            let timed_rt = scheds
                .iter()
                .any(|w| w.timed && w.policy != SchedPolicy::Other);
            match (mlock, timed_rt) {
                (Err(e), _) => Err(e),
                (Ok(()), true) => Ok(()),
                (Ok(()), false) => {
                    let mut why = sched_plan.skipped.clone();
                    why.extend(scheds.iter().flat_map(|w| w.notes.iter().cloned()));
                    Err(format!("no real-time policy: {}", why.join("; ")))
                }
            }
        } else {
            Err("not asked for".to_string())
        };
        info.sched_notes = sched_plan.skipped.clone();
        info.workers = scheds;
        let timed_books = Arc::new(Mutex::new(TimedBooks::new(cfg.deadline, &info.workers)));
        let mut admission = Admission::new(cfg.admission)
            .map_err(|e| EngineError::Config(format!("admission: {e}")))?;
        // Rt streams run only on the timed workers: admission promises no more CPU than
        // their reservations carry (issue 37 item 4).
        let timed: Vec<SchedPolicy> = info
            .workers
            .iter()
            .filter(|w| w.timed)
            .map(|w| w.policy)
            .collect();
        if let Some(bound) =
            timed_capacity_ns_per_s(&timed, &cfg.deadline, crate::sched::rt_runtime_ppm())
            && admission.bound_rt_cpu(bound)
        {
            info.sched_notes.push(format!(
                "admission: rt CPU bounded to {:.1} ms/s, what the {} timed workers' \
                 reservations carry",
                bound as f64 / 1e6,
                timed.len()
            ));
        }
        let cpu = (0..cfg.workers + timed_count)
            .map(|_| CpuAdmission::new(cfg.order, cfg.cpu))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| EngineError::Config(format!("upcall admission (cpu): {e}")))?;
        let disk = Mutex::new(DiskSettings::of(&cfg.disk, cfg.buffer_bytes as u64));
        Ok(Engine {
            disk,
            pool_max,
            cfg,
            workers,
            gauges,
            joins: Mutex::new(joins),
            next_id: AtomicU64::new(1),
            next_worker: AtomicUsize::new(0),
            open_count: Arc::new(AtomicUsize::new(0)),
            info,
            admission: Arc::new(Mutex::new(admission)),
            files: OpenFileTable::new(),
            cpu: Arc::new(Mutex::new(cpu)),
            measured: Mutex::new(BTreeMap::new()),
            depths: Mutex::new(BTreeMap::new()),
            timed_count,
            timed_books,
            next_timed: AtomicUsize::new(0),
        })
    }

    pub fn info(&self) -> &EngineInfo {
        &self.info
    }

    /// The admitted `rt` streams and what each reserved.
    pub fn reservations(&self) -> Vec<Reservation> {
        self.admission
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .reservations()
            .cloned()
            .collect()
    }

    /// Disk reads queued in the scheduler or in flight, per class, all workers together.
    pub fn disk_queue_depth(&self) -> DiskQueueDepth {
        let mut d = DiskQueueDepth::default();
        for w in &self.workers {
            let (rt, bulk) = w.disk_depth();
            d.rt += rt;
            d.bulk += bulk;
        }
        d
    }

    /// Totals reserved now, and the `rt` capacity they are taken from.
    pub fn admission_usage(&self) -> (Usage, Usage) {
        let a = self.admission.lock().unwrap_or_else(|p| p.into_inner());
        (a.usage(), a.rt_capacity())
    }

    /// System calls (io_uring_enter, clock_nanosleep) the workers' loops made so far to
    /// submit operations and to wait, all workers: with `units_sent`, what dispatch costs per
    /// unit (`EngineConfig::dispatch_slack` batches many units into one submission).
    pub fn worker_syscalls(&self) -> u64 {
        self.workers.iter().map(|w| w.syscalls()).sum()
    }

    /// Each device with a reservation or figures of its own: its reserved time per second
    /// (of `rt_capacity().disk_ns_per_s`) and the figures charges on it use.
    pub fn disk_usage(&self) -> Vec<DeviceUsage> {
        self.admission
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .disk_usage()
    }

    /// The devices self-calibrated so far: their figures, or why they could not be measured
    /// (they are then charged with the default figures).
    pub fn self_calibrations(&self) -> Vec<(DeviceId, Result<DeviceFigures, String>)> {
        self.measured
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(d, r)| (*d, r.clone()))
            .collect()
    }

    /// Self-calibrates the device `file` is on now (a server's root at start), unless
    /// self-calibration is off or a calibration file gave the figures; the device's figures
    /// also become the default device's (what [`Engine::admit`] charges ahead of the open)
    /// when it has none measured yet. The figures, or why not.
    pub fn self_calibrate(&self, file: BorrowedFd<'_>) -> Option<Result<DeviceFigures, String>> {
        let dev = DeviceId(crate::device::device_of(file));
        self.measure(dev, Some(file))?;
        let r = self
            .measured
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&dev)
            .cloned();
        if let Some(Ok(f)) = &r {
            let mut a = self.admission.lock().unwrap_or_else(|p| p.into_inner());
            if !a.has_figures(DeviceId::UNKNOWN) {
                let _ = a.set_device(DeviceId::UNKNOWN, *f);
            }
        }
        r
    }

    /// Measures the devices `qos` reads from that have no figures yet (see
    /// [`Engine::self_calibrate`]).
    fn measure_devices(&self, qos: &StreamQos, source: &Opened) {
        for d in qos.reads.disks() {
            if d.device == DeviceId::UNKNOWN {
                continue;
            }
            let file = match &source.volume {
                Some(v) => v
                    .members
                    .iter()
                    .find(|m| crate::device::device_of(*m) == d.device.0)
                    .map(|m| m.as_fd()),
                None => Some(source.fd.as_fd()),
            };
            let _ = self.measure(d.device, file);
            let first = self
                .measured
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&d.device)
                .cloned();
            if let Some(Ok(f)) = first {
                let mut a = self.admission.lock().unwrap_or_else(|p| p.into_inner());
                if !a.has_figures(DeviceId::UNKNOWN) {
                    let _ = a.set_device(DeviceId::UNKNOWN, f);
                }
            }
        }
    }

    /// Measures `dev` once (through `file`, a file on it, when its node cannot be read).
    /// `None` when self-calibration does not apply.
    fn measure(&self, dev: DeviceId, file: Option<BorrowedFd<'_>>) -> Option<()> {
        let cfg = &self.cfg.self_calibration;
        if !cfg.enabled
            || self.cfg.admission.capacity.disk_source != FigureSource::Defaults
            || dev == DeviceId::UNKNOWN
        {
            return None;
        }
        let mut measured = self.measured.lock().unwrap_or_else(|p| p.into_inner());
        if measured.contains_key(&dev) {
            return Some(());
        }
        let r = crate::calibration::device_figures(dev.0, file, cfg)
            .map(|rec| rec.figures())
            .map_err(|e| e.to_string());
        if let Ok(f) = &r {
            let _ = self
                .admission
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .set_device(dev, *f);
        }
        measured.insert(dev, r);
        Some(())
    }

    /// The configuration the engine started with (the disk settings in force are
    /// [`Engine::disk_settings`]).
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The disk scheduler settings in force on every worker.
    pub fn disk_settings(&self) -> DiskSettings {
        self.disk.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The disk classes, in queue order: `rt`, `bulk`, then `[disk.classes.NAME]`'s.
    pub fn disk_classes(&self) -> Vec<String> {
        self.cfg.disk.class_names()
    }

    /// Disk reads queued or in flight per class (as [`Engine::disk_classes`] names them),
    /// all workers together.
    pub fn disk_queue_depth_per_class(&self) -> Vec<(String, u64)> {
        self.per_class(WorkerHandle::disk_depth_per_class)
    }

    /// Bytes each class (as [`Engine::disk_classes`] names them) read through the disk
    /// scheduler so far, all workers together.
    pub fn disk_served_bytes_per_class(&self) -> Vec<(String, u64)> {
        self.per_class(WorkerHandle::disk_served_per_class)
    }

    /// A per-class figure of every worker (`of`, in queue order), added up and named.
    fn per_class(&self, of: impl Fn(&WorkerHandle) -> Vec<u64>) -> Vec<(String, u64)> {
        let mut d: Vec<(String, u64)> = self.disk_classes().into_iter().map(|n| (n, 0)).collect();
        for w in &self.workers {
            for (slot, n) in d.iter_mut().zip(of(w)) {
                slot.1 += n;
            }
        }
        d
    }

    /// Changes the disk scheduler's quanta and in-flight bound on a running engine (MARS
    /// allowed the quanta to change over time; `TUNE disk`, SIGHUP). Checked first against
    /// the scheduler's rules for reads of up to `buffer_bytes` (every quantum at least one
    /// read); on error nothing changed. Each worker takes the change between two turns of its
    /// loop: new quanta apply from the next DRR round formed there, a new bound from the next
    /// dispatch (a lower one dispatches nothing until enough reads complete). Returns the
    /// settings now in force.
    pub fn tune_disk(&self, t: &DiskTuning) -> Result<DiskSettings, SchedError> {
        let mut cur = self.disk.lock().unwrap_or_else(|p| p.into_inner());
        let new = cur.tuned(t, self.cfg.buffer_bytes as u64)?;
        if new != *cur {
            for w in &self.workers {
                w.send(Command::TuneDisk(new.clone()));
            }
            *cur = new.clone();
        }
        Ok(new)
    }

    /// The open-file table now: files open for streams, and opens it saved by sharing.
    pub fn open_files(&self) -> OpenFileStats {
        self.files.stats()
    }

    /// The buffer pools' use now, all workers together.
    pub fn buffer_usage(&self) -> BufferUsage {
        let mut u = BufferUsage {
            buffer_bytes: self.cfg.buffer_bytes as u64,
            ..BufferUsage::default()
        };
        for g in &self.gauges {
            u.buffers_total += u64::from(g.total.load(Ordering::Relaxed));
            u.buffers_max += u64::from(g.max.load(Ordering::Relaxed));
            u.grown += g.grown.load(Ordering::Relaxed);
            u.shrunk += g.shrunk.load(Ordering::Relaxed);
            u.reserved += u64::from(g.reserved.load(Ordering::Relaxed));
            u.rt_in_use += u64::from(g.rt_held.load(Ordering::Relaxed));
            u.bulk_borrowed += u64::from(g.bulk_held.load(Ordering::Relaxed));
            u.repossessions += g.repossessed.load(Ordering::Relaxed);
            u.reread_chunks += g.reread_chunks.load(Ordering::Relaxed);
        }
        u
    }

    /// The engine's sizes, as the planner checks them (an rt stream reserving by default
    /// what a stream at the default read depth uses).
    pub fn plan_limits(&self) -> PlanLimits {
        let depth = self.clamp_depth(
            self.cfg
                .read_depth
                .fixed
                .unwrap_or(self.cfg.read_depth.default),
        );
        self.plan_limits_at(depth)
    }

    /// [`Engine::plan_limits`] for a stream at read depth `depth`.
    fn plan_limits_at(&self, depth: usize) -> PlanLimits {
        PlanLimits {
            buffer_bytes: self.cfg.buffer_bytes as u64,
            rt_buffers_default: self.default_rt_buffers(depth),
            rt_buffers_max: u32::try_from(self.cfg.client_buffers_max.min(self.pool_max))
                .unwrap_or(u32::MAX),
        }
    }

    /// What an `rt` stream reserves unless it says: the buffers it can use at read depth
    /// `depth` (its reads and the one being sent).
    fn default_rt_buffers(&self, depth: usize) -> u32 {
        let n = (depth + 1)
            .min(self.stream_buffers_max())
            .min(self.cfg.client_buffers_max);
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// The pool buffers one uring-path stream holds at most.
    fn stream_buffers_max(&self) -> usize {
        self.cfg.stream_depth.min(self.pool_max).max(1)
    }

    /// A read depth within what a stream may hold: one buffer is being sent while the others
    /// are read (a stream allowed one buffer reads and sends it in turn).
    fn clamp_depth(&self, depth: usize) -> usize {
        depth
            .min(self.stream_buffers_max().saturating_sub(1))
            .min(self.cfg.client_buffers_max.saturating_sub(1))
            .max(1)
    }

    /// The uring path's read depth for a stream from `source` and where it came from
    /// ([`ReadDepthConfig`]): a volume's, the smallest of its members' (each chunk is one
    /// read per member); self-calibrates a device not yet measured when self-calibration is
    /// on (once per device; cached across runs).
    pub fn read_depth_of(&self, source: &Opened) -> (usize, ReadDepthSource) {
        let devs: Vec<(u64, BorrowedFd<'_>)> = match &source.volume {
            Some(v) => v
                .members
                .iter()
                .map(|m| (crate::device::device_of(m), m.as_fd()))
                .collect(),
            None => vec![(crate::device::device_of(&source.fd), source.fd.as_fd())],
        };
        let mut worst: Option<(usize, ReadDepthSource)> = None;
        for (dev, fd) in devs {
            let d = self.device_read_depth(dev, fd);
            if worst.is_none_or(|w| d.0 < w.0) {
                worst = Some(d);
            }
        }
        let (d, from) = worst.unwrap_or((self.cfg.read_depth.default, ReadDepthSource::Default));
        (self.clamp_depth(d), from)
    }

    /// The read depth of device `dev` (see [`Engine::read_depth_of`]); `file` is on it.
    pub fn device_read_depth(&self, dev: u64, file: BorrowedFd<'_>) -> (usize, ReadDepthSource) {
        let rd = &self.cfg.read_depth;
        if let Some(d) = rd.fixed {
            return (d, ReadDepthSource::Fixed);
        }
        if let Some(&(_, d)) = rd.calibrated.iter().find(|(c, _)| *c == dev) {
            return (d, ReadDepthSource::CalibrationFile);
        }
        let sc = &self.cfg.self_calibration;
        if sc.enabled && dev != 0 {
            let mut depths = self.depths.lock().unwrap_or_else(|p| p.into_inner());
            let d = match depths.get(&dev) {
                Some(d) => *d,
                None => match crate::calibration::device_figures(dev, Some(file), sc) {
                    Ok(r) => *depths
                        .entry(dev)
                        .or_insert(r.read_depth.map(|d| d as usize)),
                    // Neither the node nor this file opened with O_DIRECT (a small file):
                    // a later stream's file may do; the default until then.
                    Err(crate::calibration::SelfCalibrationError::NoDirect(_)) => None,
                    Err(_) => *depths.entry(dev).or_insert(None),
                },
            };
            if let Some(d) = d {
                return (d, ReadDepthSource::SelfCalibrated);
            }
        }
        (rd.default, ReadDepthSource::Default)
    }

    /// Places a stream on a worker: round robin among the timed workers for a `timed` stream
    /// (paced or `rt`) when there are any, else among the general ones; an `rt` stream on
    /// the uring path reserving `reserve` pool buffers goes to the first worker from there
    /// whose pool still holds them.
    fn place(&self, reserve: Option<u32>, timed: bool) -> Result<usize, StreamError> {
        let (base, count, next) = if timed && self.timed_count > 0 {
            (self.cfg.workers, self.timed_count, &self.next_timed)
        } else if self.timed_count > 0 {
            (0, self.cfg.workers, &self.next_worker)
        } else {
            (0, self.workers.len(), &self.next_worker)
        };
        let first = base + next.fetch_add(1, Ordering::Relaxed) % count;
        let Some(n) = reserve else {
            return Ok(first);
        };
        // The planner checked `n` against `PlanLimits::rt_buffers_max`.
        debug_assert!(n >= 1 && n as usize <= self.cfg.client_buffers_max.min(self.pool_max));
        let mut most_left = 0;
        for k in 0..count {
            let w = base + (first - base + k) % count;
            match self.gauges[w].try_reserve(n) {
                Ok(()) => return Ok(w),
                Err(left) => most_left = most_left.max(left),
            }
        }
        Err(penstock_core::buffers::BufferError::ReserveShort {
            need: n,
            left: most_left,
            buffer_count: u32::try_from(self.pool_max).unwrap_or(u32::MAX),
        }
        .into())
    }

    /// Creates a Real-Time Upcall (MARS §4.5, see [`crate::rtu`]): `callback` runs every
    /// `spec.period` on a worker's dispatcher beside the streams' units, after admission
    /// against the CPU it declares (`spec.budget`). It goes to the worker with the least
    /// upcall utilization whose set stays schedulable; when none does it is refused with
    /// [`RtuError::Refused`], naming the utilization and the bound, and nothing changes.
    /// The callback must not block: it runs on the worker's event loop.
    pub fn rtu_create(&self, spec: RtuSpec, callback: RtuCallback) -> Result<RtuHandle, RtuError> {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let demand = RtuDemand {
            period_ns: ns(spec.period),
            budget_ns: ns(spec.budget),
        };
        let (w, id) = {
            let mut cpu = self.cpu.lock().unwrap_or_else(|p| p.into_inner());
            // Upcalls run on the timed workers when there are any.
            let first = if self.timed_count > 0 {
                self.cfg.workers
            } else {
                0
            };
            let mut order: Vec<usize> = (first..cpu.len()).collect();
            order.sort_by_key(|&w| (cpu[w].load().utilization_ppb, w));
            let mut first_refusal: Option<CpuRefusal> = None;
            let mut placed = None;
            for w in order {
                match cpu[w].admit(demand) {
                    Ok(r) => {
                        placed = Some((w, r.id));
                        break;
                    }
                    Err(e) => {
                        first_refusal.get_or_insert(e);
                    }
                }
            }
            match placed {
                Some(p) => p,
                None => {
                    return Err(first_refusal
                        .expect("at least one worker, so a refusal")
                        .into());
                }
            }
        };
        let timed_k = w
            .checked_sub(self.cfg.workers)
            .filter(|_| self.timed_count > 0);
        let hold = rtu_hold(&self.cpu, &self.timed_books, w, id, timed_k, demand)?;
        let rtu_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let counters = Arc::new(RtuCounters::default());
        let (done_tx, done) = sync_channel(1);
        let rtu = Rtu::new(rtu_id, &spec, callback, counters.clone(), hold, done_tx);
        let worker = self.workers[w].clone();
        // Refused unsent, the upcall (and the CPU hold in it) is dropped: its reservation
        // goes back.
        worker
            .try_send(Command::RtuCreate(Box::new(rtu)))
            .map_err(|full| RtuError::WorkerQueueFull {
                commands_max: full.commands_max,
            })?;
        // `run` after a suspension that gave the CPU back: admitted again on this worker.
        let readmit = {
            let (cpu, books) = (self.cpu.clone(), self.timed_books.clone());
            Box::new(move || {
                let id = {
                    let mut a = cpu.lock().unwrap_or_else(|p| p.into_inner());
                    a[w].admit(demand)?.id
                };
                rtu_hold(&cpu, &books, w, id, timed_k, demand)
            })
        };
        let send = Box::new(move |ctl| {
            worker.send(match ctl {
                RtuCtl::Cancel => Command::RtuCancel(rtu_id),
                RtuCtl::Suspend(release) => Command::RtuSuspend(rtu_id, release),
                RtuCtl::Run(hold) => Command::RtuRun(rtu_id, hold),
            })
        });
        Ok(RtuHandle::new(rtu_id, counters, send, readmit, done))
    }

    /// Each worker's CPU as upcall admission sees it, by worker index.
    pub fn cpu_load(&self) -> Vec<CpuLoad> {
        self.cpu
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(CpuAdmission::load)
            .collect()
    }

    /// What io_uring offers here, for path selection.
    pub fn caps(&self) -> PathCaps {
        PathCaps {
            uring: self.info.uring.is_ok(),
        }
    }

    /// Opens a stream's endpoints (may block: listen, connect), chooses its path and starts it
    /// on a worker.
    pub fn open(&self, spec: StreamSpec) -> Result<StreamHandle, StreamError> {
        self.open_with(spec, &mut |_| {})
    }

    /// Like [`Engine::open`], calling `on_listen` with the bound address of a listening
    /// endpoint before it waits for its peer.
    pub fn open_with(
        &self,
        spec: StreamSpec,
        on_listen: &mut dyn FnMut(std::net::SocketAddr),
    ) -> Result<StreamHandle, StreamError> {
        let (Some(source_ep), Some(target_ep)) = (&spec.source, &spec.target) else {
            return Err(StreamError::NoEndpoints);
        };
        // The pacing is the planner's to check before anything is opened (a listening
        // endpoint would wait for its peer first): the same rule the plan applies at the start.
        plan_schedule(
            &spec.pacing,
            (spec.unit_bytes != 0).then_some(spec.unit_bytes as u64),
            matches!(target_ep, Endpoint::UdpSend { .. }),
            self.cfg.buffer_bytes as u64,
        )?;
        let source = open_source(source_ep, on_listen)?;
        // Refuse an extent that does not fit before opening the target, which truncates files.
        if let (penstock_core::stream::IoKind::File, Some(size)) = (source.kind, source.size) {
            spec.extent.resolve_in_file(size)?;
        }
        let target = open_target(target_ep, on_listen)?;
        self.open_opened(spec, source, target)
    }

    /// Takes one of the `streams_max` places for a stream opened later with
    /// [`Engine::open_reserved`]; [`StreamError::TooManyStreams`] when none is free.
    pub fn reserve_stream(&self) -> Result<StreamSlot, StreamError> {
        let prev = self.open_count.fetch_add(1, Ordering::AcqRel);
        // The slot decrements on drop, also when refused here.
        let slot = StreamSlot {
            open_count: self.open_count.clone(),
        };
        if prev >= self.cfg.streams_max {
            return Err(StreamError::TooManyStreams(self.cfg.streams_max));
        }
        Ok(slot)
    }

    /// Starts a stream between endpoints the caller already opened (the server's sockets).
    pub fn open_opened(
        &self,
        spec: StreamSpec,
        source: Opened,
        target: Opened,
    ) -> Result<StreamHandle, StreamError> {
        self.start(spec, source, target, None, None)
    }

    /// Like [`Engine::open_opened`], in a place taken with [`Engine::reserve_stream`]: never
    /// [`StreamError::TooManyStreams`]. Refused (and the slot given back) for the reasons
    /// `open_opened` has; for a plain file → stream-socket burst stream on a path the
    /// engine's caps allow, only when the extent no longer fits the file.
    pub fn open_reserved(
        &self,
        slot: StreamSlot,
        spec: StreamSpec,
        source: Opened,
        target: Opened,
    ) -> Result<StreamHandle, StreamError> {
        if !Arc::ptr_eq(&slot.open_count, &self.open_count) {
            return Err(StreamError::ForeignSlot);
        }
        self.start(spec, source, target, Some(slot), None)
    }

    /// [`Engine::open_reserved`] with what [`Engine::admit_for`] reserved ahead (as
    /// [`Engine::open_admitted`] uses it: kept, in its tenant's share, when the plan asks
    /// the same): a server that admits a body before it writes the head.
    pub fn open_reserved_admitted(
        &self,
        slot: StreamSlot,
        admitted: Option<Admitted>,
        spec: StreamSpec,
        source: Opened,
        target: Opened,
    ) -> Result<StreamHandle, StreamError> {
        if !Arc::ptr_eq(&slot.open_count, &self.open_count) {
            return Err(StreamError::ForeignSlot);
        }
        self.start(spec, source, target, Some(slot), admitted)
    }

    /// Plans `spec` against what a caller knows of endpoints it has not handed over yet
    /// (an HTTP server before it writes a head): the same planner, so a stream that would be
    /// refused at its start is refused here, by the same rule. Admits nothing.
    pub fn preflight(
        &self,
        spec: &StreamSpec,
        source: penstock_core::stream::plan::EndpointFacts,
        target: penstock_core::stream::plan::EndpointFacts,
    ) -> Result<penstock_core::stream::plan::StreamPlan, StreamError> {
        let request = spec.plan_request();
        let facts = penstock_core::stream::plan::Facts {
            source,
            target,
            resident: false,
        };
        Ok(plan_stream(
            &request,
            &facts,
            self.caps(),
            &self.plan_limits(),
        )?)
    }

    /// Asks admission control now for what `spec` will ask when it starts (the planner's
    /// admission request, which does not depend on the endpoints: its reads charged as a
    /// paced stream's whole-unit read-ahead on the default device): a server admits a stream
    /// when it is opened and starts it later with [`Engine::open_admitted`], which charges it
    /// again for the reads planned on its real device, in one step (a refusal there fails the
    /// start and gives the reservation back). `None`: the stream asks for no guarantee. The
    /// reservation is released when the [`Admitted`] is dropped unused, or with the stream's
    /// handle. `datagram`: the target will be a UDP socket (a paced stream's default unit
    /// depends on it).
    pub fn admit(
        &self,
        spec: &StreamSpec,
        datagram: bool,
    ) -> Result<Option<Admitted>, StreamError> {
        self.admit_for(spec, datagram, None)
    }

    /// [`Engine::admit`] within `tenant`'s share of the rt capacity
    /// ([`penstock_core::admission::Admission::admit_for`]; `None`: the part of no tenant).
    /// A later [`Engine::open_admitted`] keeps the reservation's tenant.
    pub fn admit_for(
        &self,
        spec: &StreamSpec,
        datagram: bool,
        tenant: Option<penstock_core::admission::TenantId>,
    ) -> Result<Option<Admitted>, StreamError> {
        let Some(qos) = admission_request(&spec.plan_request(), datagram, &self.plan_limits())?
        else {
            return Ok(None);
        };
        let id = self
            .admission
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .admit_for(qos, tenant)?;
        Ok(Some(Admitted {
            id: Some(id.id),
            qos,
            reservation: id,
            admission: self.admission.clone(),
        }))
    }

    /// Partitions the rt capacity among tenants (`(name, share in parts per million)`;
    /// [`penstock_core::admission::Admission::set_tenants`]): at start, before any stream.
    pub fn set_tenants(
        &self,
        shares: &[(String, u32)],
    ) -> Result<(), penstock_core::admission::CapacityError> {
        self.admission
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .set_tenants(shares)
    }

    /// The id of tenant `name`, if set.
    pub fn tenant_id(&self, name: &str) -> Option<penstock_core::admission::TenantId> {
        self.admission
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .tenant_id(name)
    }

    /// Each tenant's name, share (ppm) and holdings, then the part of no tenant (name "").
    pub fn tenant_usage(&self) -> Vec<(String, u32, penstock_core::admission::PartitionUsage)> {
        self.admission
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .tenant_usage()
    }

    /// Like [`Engine::open_opened`], with what [`Engine::admit`] reserved (used when the plan
    /// asks admission for the same; otherwise released and asked afresh).
    pub fn open_admitted(
        &self,
        admitted: Option<Admitted>,
        spec: StreamSpec,
        source: Opened,
        target: Opened,
    ) -> Result<StreamHandle, StreamError> {
        self.start(spec, source, target, None, admitted)
    }

    /// `open_opened`, in `slot` when the caller reserved one, with `admitted` when the caller
    /// asked admission ahead.
    fn start(
        &self,
        spec: StreamSpec,
        mut source: Opened,
        mut target: Opened,
        slot: Option<StreamSlot>,
        admitted: Option<Admitted>,
    ) -> Result<StreamHandle, StreamError> {
        let request = spec.plan_request();
        // A file source shares the descriptor of other streams of its file (the caller's is
        // closed): one descriptor per file, not per stream. Targets are never shared.
        if source.kind == penstock_core::stream::IoKind::File && source.volume.is_none() {
            source.fd = self.files.share(source.fd);
        }
        // The read depth on the source's device(s), for the uring path: what an rt stream
        // reserves by default depends on it. Only a file (or volume) source has one.
        let (read_depth, read_depth_source) = if source.kind == penstock_core::stream::IoKind::File
            && self.caps().uring
            && matches!(
                request.path,
                PathChoice::Auto | PathChoice::Fixed(DataPath::Uring)
            ) {
            self.read_depth_of(&source)
        } else {
            (
                self.clamp_depth(self.cfg.read_depth.default),
                ReadDepthSource::Default,
            )
        };
        // The one decision: everything below carries it out.
        let gathered = crate::facts::gather(&source, &target, &request, &self.files);
        let plan = plan_stream(
            &request,
            &gathered.facts,
            self.caps(),
            &self.plan_limits_at(read_depth),
        )?;
        let class_index = class_index(&self.disk_classes(), plan.class)?;
        // What the stream would ask admission for in `rt` (`CLASS id rt` while it runs): the
        // planner's answer for the same request in that class; `None` when it has no rate.
        let rt_qos = if plan.rt {
            plan.admission
        } else {
            plan_stream(
                &PlanRequest {
                    class: Some(DiskClass::Rt),
                    best_effort: false,
                    ..request.clone()
                },
                &gathered.facts,
                self.caps(),
                &self.plan_limits_at(read_depth),
            )
            .ok()
            .and_then(|p| p.admission)
        };
        let reopen = |v: &mut crate::volume::PartitionIo| {
            v.make_buffered().map_err(|source| StreamError::Io {
                op: "reopening the volume's members",
                bytes_sent: 0,
                source,
            })
        };
        if plan.buffered_target_volume
            && let Some(v) = target.volume.as_mut()
        {
            reopen(v)?;
        }
        if plan.buffered_source_volume
            && let Some(v) = source.volume.as_mut()
        {
            reopen(v)?;
        }
        // Admission control, for streams that ask for a guarantee, charged the reads just
        // planned on the source's real devices (self-calibrated first where the engine has
        // no figures for them). What was reserved ahead (`Engine::admit`, charged on the
        // default device) is replaced in one step; a refusal gives it back. The reservation
        // is released when the caller drops the handle.
        if let Some(qos) = &plan.admission {
            self.measure_devices(qos, &source);
        }
        let reservation = match (plan.admission, admitted) {
            (Some(qos), Some(mut a)) => {
                let ahead = a.id.take();
                let mut adm = self.admission.lock().unwrap_or_else(|p| p.into_inner());
                let r = match ahead {
                    Some(id) => adm.replace(id, qos),
                    None => adm.admit(qos),
                };
                drop(adm);
                match r {
                    Ok(r) => Some(r.id),
                    Err(e) => {
                        a.id = ahead;
                        drop(a);
                        return Err(e.into());
                    }
                }
            }
            (qos, other) => {
                // Reserved ahead for a stream that asks for no guarantee now: give it back.
                drop(other);
                match qos {
                    Some(qos) => Some(
                        self.admission
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .admit(qos)?
                            .id,
                    ),
                    None => None,
                }
            }
        };
        let direct = gathered.direct.filter(|_| plan.direct);
        let range = plan.range;
        let path = plan.path;
        let unit = usize::try_from(plan.unit_bytes).unwrap_or(usize::MAX);
        let notes = plan.notes.clone();
        let zero_copy = plan.zero_copy;

        // A refusal from here on gives the admission reservation back.
        let refuse = |e: StreamError| {
            if let Some(id) = reservation {
                self.admission
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .release(id);
            }
            Err(e)
        };
        let slot = match slot {
            Some(s) => s,
            None => match self.reserve_stream() {
                Ok(s) => s,
                Err(e) => return refuse(e),
            },
        };
        // An admitted rt stream on the uring path holds its buffers in its worker's pool.
        let buffers_reserved = plan.buffers_reserved;
        // Paced and rt streams go to a timed worker (when there are any); bulk never does.
        let timed = plan.rt || plan.units.is_some() || plan.schedule.is_some();
        let placed = if timed && self.timed_count > 0 && reservation.is_some() {
            // An admitted stream: to the timed worker with the least CPU granted that can
            // take its CPU (and its buffers), widening that worker's reservation
            // (SCHED_DEADLINE); the kernel refusing it everywhere is an admission refusal.
            self.place_granted(buffers_reserved, reservation)
        } else {
            self.place(buffers_reserved, timed).map(|w| (w, None))
        };
        let (w, timed_hold) = match placed {
            Ok(p) => p,
            Err(e) => {
                drop(slot);
                return refuse(e);
            }
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let worker = self.workers[w].clone();
        let counters = Arc::new(Counters::default());
        if path == DataPath::Uring {
            counters
                .read_depth
                .store(read_depth as u64, Ordering::Relaxed);
        }
        let cancel = Arc::new(AtomicBool::new(false));
        let (done_tx, done): (SyncSender<_>, _) = sync_channel(1);
        let expected_bytes = range.map(|(s, e)| e - s);
        let task = Task::new(crate::worker::TaskInit {
            id,
            source,
            target,
            direct,
            range,
            unit,
            align_bytes: plan.align_bytes,
            read_bytes: usize::try_from(plan.read_bytes).unwrap_or(usize::MAX),
            path,
            cache: spec.cache,
            zero_copy,
            notes,
            class: penstock_core::sched::drr::ClassId::from_index(class_index),
            rtp: spec.rtp.filter(|_| plan.header_bytes > 0),
            interleaved: spec.interleaved.clone().filter(|_| plan.header_bytes > 0),
            buffers_reserved,
            pace: if let Some(units) = plan.units.clone() {
                let miss_after = spec.miss_after.unwrap_or(PLAN_MISS_AFTER_DEFAULT);
                Some(
                    Pace::with_plan(
                        units,
                        LatenessStats::new(
                            u64::try_from(miss_after.as_nanos()).unwrap_or(u64::MAX),
                        ),
                        spec.trace,
                        self.cfg.trace_units_max,
                        id,
                        spec.start_at,
                    )
                    .with_late(plan.late)
                    .with_slack(self.cfg.dispatch_slack),
                )
            } else {
                plan.schedule.map(|s| {
                    let stats = LatenessStats::for_schedule(&s, spec.miss_after);
                    Pace::new(
                        s,
                        stats,
                        spec.trace,
                        self.cfg.trace_units_max,
                        id,
                        spec.start_at,
                    )
                    .with_late(plan.late)
                    .with_slack(self.cfg.dispatch_slack)
                })
            },
            send_timeout: spec.send_timeout.filter(|t| !t.is_zero()),
            counters: counters.clone(),
            cancel: cancel.clone(),
            done: done_tx,
        });
        if let Err(full) = worker.try_send(Command::Open(Box::new(task))) {
            // The task is dropped unsent: its place, timed CPU and reservation go back.
            return refuse(StreamError::WorkerQueueFull {
                commands_max: full.commands_max,
            });
        }
        Ok(StreamHandle {
            id,
            path,
            expected_bytes,
            counters,
            read_depth_source,
            cancel,
            worker,
            done,
            _slot: slot,
            reservation: Mutex::new(reservation),
            admission: self.admission.clone(),
            class: Mutex::new(plan.class),
            classes: self.disk_classes().into(),
            rt_qos,
            _timed: timed_hold,
            worker_index: w,
        })
    }

    /// Places an admitted timed stream: the timed workers in order of the CPU granted on
    /// them (least first: the load spreads, and a worker whose reservation cannot widen is
    /// passed over), the first whose pool holds `reserve` buffers and whose reservation
    /// takes the stream's CPU. The first refusal when none does.
    fn place_granted(
        &self,
        reserve: Option<u32>,
        reservation: Option<ReservationId>,
    ) -> Result<(usize, Option<TimedHold>), StreamError> {
        let ns_per_s = reservation.map_or(0, |id| {
            self.admission
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .reservations()
                .find(|r| r.id == id)
                .map_or(0, |r| r.cpu_ns_per_s)
        });
        let mut order: Vec<(u64, usize)> = {
            let b = self.timed_books.lock().unwrap_or_else(|p| p.into_inner());
            (0..self.timed_count).map(|k| (b.granted(k), k)).collect()
        };
        order.sort_unstable();
        let mut first_refusal = None;
        for (_, k) in order {
            let w = self.cfg.workers + k;
            if let Some(n) = reserve
                && let Err(left) = self.gauges[w].try_reserve(n)
            {
                first_refusal.get_or_insert(StreamError::from(
                    penstock_core::buffers::BufferError::ReserveShort {
                        need: n,
                        left,
                        buffer_count: u32::try_from(self.pool_max).unwrap_or(u32::MAX),
                    },
                ));
                continue;
            }
            let granted = self
                .timed_books
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .grant(k, ns_per_s);
            match granted {
                Ok(()) => {
                    return Ok((
                        w,
                        Some(TimedHold {
                            books: self.timed_books.clone(),
                            timed_index: k,
                            ns_per_s,
                        }),
                    ));
                }
                Err(why) => {
                    if let Some(n) = reserve {
                        self.gauges[w].unreserve(n);
                    }
                    first_refusal.get_or_insert(StreamError::CpuReservation(why));
                }
            }
        }
        Err(first_refusal.expect("at least one timed worker, so a refusal"))
    }

    /// Fixes the timed workers' SCHED_DEADLINE reservations at their widest before the
    /// process gives up the right to change them (`TimedBooks::fix`); what could not be.
    pub fn fix_timed_reservations(&self) -> Vec<String> {
        self.timed_books
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .fix()
    }

    /// CPU time per second granted on each timed worker now (streams' sends and upcalls),
    /// by timed worker (worker index minus the general workers).
    pub fn timed_granted(&self) -> Vec<u64> {
        let b = self.timed_books.lock().unwrap_or_else(|p| p.into_inner());
        (0..self.timed_count).map(|k| b.granted(k)).collect()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        for w in &self.workers {
            w.send(Command::Shutdown);
        }
        let joins = std::mem::take(&mut *self.joins.lock().unwrap_or_else(|p| p.into_inner()));
        for j in joins {
            let _ = j.join();
        }
    }
}

/// The queue index of `class` among the engine's classes `names` (in queue order), or the
/// refusal naming them.
fn class_index(names: &[String], class: DiskClass) -> Result<u16, StreamError> {
    names
        .iter()
        .position(|n| n == class.name())
        .map(|i| i as u16)
        .ok_or_else(|| StreamError::UnknownClass {
            name: class.name().to_string(),
            known: names.join(", "),
        })
}

/// The hold of an upcall admitted on worker `w` as `id`: given back when dropped. Its CPU
/// widens timed worker `timed_k`'s reservation, as an rt stream's does (refused: the
/// admission is given back with the hold).
fn rtu_hold(
    cpu: &Arc<Mutex<Vec<CpuAdmission>>>,
    books: &Arc<Mutex<TimedBooks>>,
    w: usize,
    id: penstock_core::admission::cpu::RtuId,
    timed_k: Option<usize>,
    demand: RtuDemand,
) -> Result<CpuHold, RtuError> {
    let mut hold = CpuHold {
        admission: cpu.clone(),
        worker: w,
        id,
        timed: None,
    };
    if let Some(k) = timed_k {
        let ns_per_s = u64::try_from(
            u128::from(demand.budget_ns) * 1_000_000_000 / u128::from(demand.period_ns.max(1)),
        )
        .unwrap_or(u64::MAX);
        books
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .grant(k, ns_per_s)
            .map_err(RtuError::Reservation)?;
        hold.timed = Some(TimedHold {
            books: books.clone(),
            timed_index: k,
            ns_per_s,
        });
    }
    Ok(hold)
}
