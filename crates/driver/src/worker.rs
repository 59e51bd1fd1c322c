//! A worker: one thread, one event loop, many streams.
//!
//! The loop, each turn: take commands (new streams, cancels) → step every runnable stream
//! within a budget → submit what they queued and wait for a completion (or readiness, or a
//! wake-up) → route each completion to its stream. A stream's step never blocks on a socket:
//! it returns what it waits for (readiness of a descriptor, or its operations in the ring).
//!
//! The reactor is io_uring when the kernel allows it (POLL_ADD for readiness, the uring data
//! path's reads and sends, an eventfd read for wake-ups) and poll(2) otherwise — then only the
//! copy, sendfile and splice paths exist, which need nothing but readiness.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, SyncSender, TrySendError, channel, sync_channel};
use std::thread::JoinHandle;

use penstock_core::stream::{CachePolicy, DataPath};
use penstock_uring::{Completion, Registration, Ring, RingConfig, RingError};

use std::time::Duration;

use penstock_core::sched::edf::{Due, EdfQueue};
use penstock_core::sched::policy::{DeadlineParams, SchedPolicy};

use crate::sched::WorkerSched;
use penstock_core::time::Instant;

use crate::buffers::{BufferGauges, WorkerBuffers};
use crate::clock;
use crate::config::{EngineConfig, EngineInfo, TimerMode};
use crate::disk::{DiskDepth, DiskQueue};
use crate::error::StreamError;
use crate::open::Opened;
use crate::pace::Pace;
use crate::paths::{self, CopyState, SpliceState};
use crate::report::{Counters, StreamReport};
use crate::rtu::Rtu;
use crate::step::{Side, Step, TAG_POLL, TaskIo};
use crate::uring_path::UringState;

/// Messages from the engine to a worker.
pub(crate) enum Command {
    Open(Box<Task>),
    Cancel(u64),
    Pause(u64),
    Resume(u64),
    /// The stream's next reads go to this disk class (`CLASS`: admission was re-checked by
    /// the engine first).
    SetClass(u64, penstock_core::sched::drr::ClassId),
    /// Call this once the stream's report is sent (at once if it already was).
    Notify(u64, DoneHook),
    /// New disk scheduler settings (checked by the engine against this worker's reads).
    TuneDisk(crate::disk::DiskSettings),
    /// An admitted upcall to run (`rtu`).
    RtuCreate(Box<Rtu>),
    RtuCancel(u64),
    /// Off the queue; `true`: its CPU given back.
    RtuSuspend(u64, bool),
    /// Back on the queue, with its CPU admitted again when it had been given back.
    RtuRun(u64, Option<Box<crate::rtu::CpuHold>>),
    Shutdown,
}

/// What the dispatcher's queue holds: a stream's next unit, or an upcall's next activation,
/// by slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Entry {
    Stream(usize),
    Rtu(usize),
}

/// Called by the worker right after a stream's report is sent: lets an event loop learn of
/// it without polling the handle (see `StreamHandle::notify_when_done`).
pub(crate) type DoneHook = Box<dyn FnOnce() + Send>;

/// The engine's way to reach a worker: a bounded channel (`EngineConfig::worker_commands_max`
/// commands), and an eventfd to wake its loop. New work (a stream, an upcall) is refused when
/// the channel is full ([`WorkerHandle::try_send`]); a command about work already there waits
/// for room ([`WorkerHandle::send`]), which the loop makes at each turn. Commands sent from the
/// worker's own thread (a done hook, an upcall) cannot wait for it: they go on a side queue
/// the loop drains with the channel.
#[derive(Debug, Clone)]
pub(crate) struct WorkerHandle {
    tx: SyncSender<Command>,
    own: Sender<Command>,
    thread: std::thread::ThreadId,
    commands_max: usize,
    wake: Arc<OwnedFd>,
    /// The worker's disk queue depth, published by its loop.
    disk_depth: Arc<DiskDepth>,
    /// System calls the worker's loop made to submit and to wait (io_uring_enter,
    /// clock_nanosleep).
    syscalls: Arc<AtomicU64>,
}

impl WorkerHandle {
    /// Disk reads (rt, bulk) queued or in flight on this worker.
    pub(crate) fn disk_depth(&self) -> (u64, u64) {
        self.disk_depth.get()
    }

    /// Disk reads of each class (queue order) queued or in flight on this worker.
    pub(crate) fn disk_depth_per_class(&self) -> Vec<u64> {
        self.disk_depth.per_class()
    }

    /// Bytes each class (queue order) read on this worker so far.
    pub(crate) fn disk_served_per_class(&self) -> Vec<u64> {
        self.disk_depth.served_per_class()
    }

    /// System calls this worker's loop made so far to submit operations and to wait.
    pub(crate) fn syscalls(&self) -> u64 {
        self.syscalls.load(Ordering::Relaxed)
    }

    /// Sends a command about work the worker has (waiting for room in its channel).
    pub(crate) fn send(&self, c: Command) {
        let sent = if std::thread::current().id() == self.thread {
            self.own.send(c).is_ok()
        } else {
            self.tx.send(c).is_ok()
        };
        if sent {
            self.wake();
        }
    }

    /// Sends new work, or [`QueueFull`] when the worker's channel holds
    /// `worker_commands_max` commands already. A worker that stopped drops the command: the
    /// opener learns it from the stream's report channel, as before.
    pub(crate) fn try_send(&self, c: Command) -> Result<(), QueueFull> {
        match self.tx.try_send(c) {
            Ok(()) => {
                self.wake();
                Ok(())
            }
            Err(TrySendError::Full(_)) => Err(QueueFull {
                commands_max: self.commands_max,
            }),
            Err(TrySendError::Disconnected(_)) => Ok(()),
        }
    }

    fn wake(&self) {
        // A full eventfd counter (EAGAIN) still wakes the loop; nothing to handle.
        let _ = rustix::io::write(&*self.wake, &1u64.to_ne_bytes());
    }
}

/// A worker's command channel was full: the new stream or upcall was not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QueueFull {
    pub commands_max: usize,
}

/// Everything a worker needs to run one stream, built by the engine.
pub(crate) struct TaskInit {
    pub id: u64,
    pub source: Opened,
    pub target: Opened,
    pub direct: Option<crate::files::Descriptor>,
    pub range: Option<(u64, u64)>,
    pub unit: usize,
    /// The uring path's read alignment and read size (the plan's).
    pub align_bytes: u64,
    pub read_bytes: usize,
    pub path: DataPath,
    pub cache: CachePolicy,
    pub zero_copy: bool,
    pub notes: Vec<String>,
    pub pace: Option<Pace>,
    /// The stream's disk class (see `TaskIo::class`).
    pub class: penstock_core::sched::drr::ClassId,
    /// RTP framing of each unit (the plan's `header_bytes` > 0).
    pub rtp: Option<penstock_core::rtp::Packetizer>,
    pub interleaved: Option<crate::gate::Interleaved>,
    /// Pool buffers reserved for an admitted `rt` stream on the uring path (the engine placed
    /// it on a worker whose pool holds them); `None`: the stream borrows.
    pub buffers_reserved: Option<u32>,
    /// The progress timeout (`StreamSpec::send_timeout`, zero already taken as `None`).
    pub send_timeout: Option<Duration>,
    pub counters: Arc<Counters>,
    pub cancel: Arc<AtomicBool>,
    pub done: SyncSender<Result<StreamReport, StreamError>>,
}

/// The per-path state machine.
pub(crate) enum Machine {
    Copy(CopyState),
    Sendfile,
    Splice(SpliceState),
    Uring(Box<UringState>),
}

pub(crate) struct Task {
    id: u64,
    path: DataPath,
    pub(crate) io: TaskIo,
    machine: Machine,
    cancel: Arc<AtomicBool>,
    done: SyncSender<Result<StreamReport, StreamError>>,
    started: Option<std::time::Instant>,
    finished_at: Option<std::time::Instant>,
    /// Operations of this task in the ring whose last completion has not arrived.
    in_ring: u32,
    /// The outcome, once decided; reported when `in_ring` reaches zero.
    outcome: Option<Result<(), StreamError>>,
    queued: bool,
    /// Paused since this instant: no new I/O is issued.
    paused: Option<Instant>,
    buffers_reserved: Option<u32>,
    /// Called after the report is sent.
    on_done: Option<DoneHook>,
    /// The progress timeout; `None`: the watchdog leaves the stream alone.
    send_timeout: Option<Duration>,
    /// Bytes read plus bytes sent when the watchdog last saw them change, and when it did
    /// (from the stream's open, a resume, or a scan while paused).
    progress_seen: u64,
    progress_at: Instant,
    /// The deadline of the last `WaitUntil`: waiting for it is not a stall.
    waited_until: Instant,
    /// The watchdog found no progress for longer than `send_timeout`: the next step cancels
    /// the stream's operations and it reports `Stalled`.
    stalled: bool,
}

impl Task {
    pub(crate) fn new(init: TaskInit) -> Task {
        let (start, end) = match init.range {
            Some((s, e)) => (s, Some(e)),
            None => (0, None),
        };
        let machine = match init.path {
            DataPath::Copy => Machine::Copy(CopyState::new(init.unit)),
            DataPath::Sendfile => Machine::Sendfile,
            DataPath::Splice => Machine::Splice(SpliceState::default()),
            DataPath::Uring => Machine::Uring(Box::default()),
        };
        Task {
            id: init.id,
            path: init.path,
            io: TaskIo {
                source: init.source,
                target: init.target,
                direct: init.direct,
                pos: start,
                end,
                start,
                unit: init.unit,
                align_bytes: init.align_bytes.max(1),
                read_bytes: init.read_bytes,
                cache: init.cache,
                zero_copy: init.zero_copy,
                sent: 0,
                units: 0,
                counters: init.counters,
                notes: init.notes,
                pace: init.pace,
                class: init.class,
                rtp: init.rtp,
                interleaved: init.interleaved,
                moved: Default::default(),
            },
            machine,
            cancel: init.cancel,
            done: init.done,
            started: None,
            finished_at: None,
            in_ring: 0,
            outcome: None,
            queued: false,
            paused: None,
            buffers_reserved: init.buffers_reserved,
            on_done: None,
            send_timeout: init.send_timeout,
            progress_seen: 0,
            progress_at: Instant::ZERO,
            waited_until: Instant::ZERO,
            stalled: false,
        }
    }
}

const WAKE_TOKEN: u64 = u64::MAX - 1;
/// Timer tokens are `TIMER_TOKEN_BASE + k` for the timer in slot `k` (below the wake token).
const TIMER_TOKEN_BASE: u64 = u64::MAX - 2 - TIMERS_MAX as u64;
/// Timers in flight at most (a newer, earlier deadline arms another one).
const TIMERS_MAX: u32 = 8;
/// Deadlines closer than this are slept to with clock_nanosleep (see `Worker::wait`).
const SHORT_SLEEP_NS: u64 = 200_000;
/// Streams made runnable by deadlines in one loop turn at most.
const DUE_BUDGET: usize = 4096;
/// The watchdog's shortest scan interval (a tiny timeout would otherwise mean a busy scan).
const WATCH_INTERVAL_MIN: Duration = Duration::from_millis(10);

/// How often the watchdog scans for a stream with this progress timeout: a quarter of it, so
/// a stall is reported between `timeout` and 1.5 × `timeout` after the last byte moved — never
/// before, since the clock starts at the scan that saw the last change.
fn watch_interval(timeout: Duration) -> Duration {
    (timeout / 4).max(WATCH_INTERVAL_MIN)
}

/// A completion token: task slot, slot generation, tag, and a 16-bit argument (a buffer).
pub(crate) fn token(slot: usize, generation: u16, tag: u64, arg: u16) -> u64 {
    ((slot as u64) << 40) | (u64::from(generation) << 24) | (tag << 16) | u64::from(arg)
}

fn token_parts(t: u64) -> (usize, u16, u64, u16) {
    (
        (t >> 40) as usize,
        (t >> 24) as u16,
        (t >> 16) & 0xff,
        t as u16,
    )
}

enum Reactor {
    Ring(Box<Ring>),
    Poll { waiting: Vec<(usize, Side, u32)> },
}

struct Worker {
    reactor: Reactor,
    rx: Receiver<Command>,
    /// Commands the worker's own thread sent itself (`WorkerHandle::send`).
    own_rx: Receiver<Command>,
    wake: Arc<OwnedFd>,
    wake_armed: bool,
    depth: usize,
    slots: Vec<(u16, Option<Box<Task>>)>,
    free: Vec<usize>,
    by_id: HashMap<u64, usize>,
    ready: VecDeque<usize>,
    completions: Vec<Completion>,
    shutting_down: bool,
    /// Paced streams waiting for their next unit's deadline, and upcalls for their next
    /// activation.
    edf: EdfQueue<Entry>,
    due: Vec<Due<Entry>>,
    /// The upcalls on this worker, by slot; free slots; slot by upcall id.
    rtus: Vec<Option<Box<Rtu>>>,
    rtu_free: Vec<usize>,
    rtu_by_id: HashMap<u64, usize>,
    timer_mode: TimerMode,
    spin: Duration,
    /// `EngineConfig::dispatch_slack`: each wake-up releases the streams due up to now plus
    /// this (none with upcalls on the worker: see `release_due`).
    slack: Duration,
    /// io_uring_enter and clock_nanosleep calls of the loop, published for
    /// `Engine::worker_syscalls`.
    syscalls: Arc<AtomicU64>,
    /// Deadline of the earliest timer armed in the ring, and how many are in flight.
    /// The deadline each timer slot is armed for (`None`: free). A timer at or before the
    /// next deadline must exist whenever the loop blocks.
    timers: [Option<Instant>; TIMERS_MAX as usize],
    /// The disk scheduler every uring-path read goes through (with a ring only).
    disk: Option<DiskQueue>,
    /// Completions of reads cancelled while queued in the disk scheduler.
    synthetic: Vec<Completion>,
    /// The books of the ring's buffer pool (with a ring only).
    bufs: Option<WorkerBuffers>,
    /// Slots the books asked to step (scratch).
    wakeups: Vec<usize>,
    /// When the watchdog next scans for stalled streams; `None`: no stream has a timeout.
    /// A blocking wait never sleeps past it.
    watch_at: Option<Instant>,
    /// When the buffer pool may next shrink (`WorkerBuffers::upkeep`).
    shrink_at: Option<Instant>,
}

/// Steps one stream may take per turn before others get theirs.
const STEP_BUDGET: usize = 16;

/// A timed worker's policies to try, strongest first, and its deadline reservation with
/// nothing granted yet (`crate::sched`).
pub(crate) struct TimedRole {
    pub(crate) tries: Vec<SchedPolicy>,
    pub(crate) floor: DeadlineParams,
}

pub(crate) fn spawn_worker(
    index: usize,
    cfg: &EngineConfig,
    pool_max: usize,
    gauges: Arc<BufferGauges>,
    timed: Option<TimedRole>,
) -> io::Result<(WorkerHandle, JoinHandle<()>, EngineInfo)> {
    let wake = Arc::new(
        rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )
        .map_err(io::Error::from)?,
    );
    let commands_max = cfg.worker_commands_max;
    let (tx, rx) = sync_channel(commands_max);
    let (own, own_rx) = channel();
    let (info_tx, info_rx) = sync_channel(1);
    let ring_cfg = RingConfig {
        sq_entries: 1024,
        buffers: cfg.pool_buffers,
        buffers_max: pool_max,
        buffer_bytes: cfg.buffer_bytes,
        register_buffers: cfg.register_buffers,
        ops_max: (4096.max(pool_max * 2 + cfg.streams_max * 2)).min(1 << 16),
    };
    let depth = cfg.stream_depth;
    let wake2 = wake.clone();
    let (timer_mode, spin, order, realtime) = (cfg.timer, cfg.spin, cfg.order, cfg.realtime);
    let slack = cfg.dispatch_slack;
    let syscalls = Arc::new(AtomicU64::new(0));
    let syscalls_pub = syscalls.clone();
    // One queue entry per stream and per upcall this worker may hold.
    let entries_max = cfg.streams_max + cfg.cpu.rtus_max as usize;
    let disk_cfg = cfg.disk.clone();
    let buffer_bytes = cfg.buffer_bytes;
    let queue_max = u32::try_from(pool_max).unwrap_or(u32::MAX);
    let shrink_after = cfg.pool_shrink_after;
    let clients_max = u32::try_from(cfg.streams_max).unwrap_or(u32::MAX);
    let borrow_max = u32::try_from(cfg.client_buffers_max).unwrap_or(u32::MAX);
    let disk_depth = Arc::new(DiskDepth::new(2 + cfg.disk.named_classes.len()));
    let depth_pub = disk_depth.clone();
    let join = std::thread::Builder::new().name(format!("penstock-w{index}")).spawn(move || {
        // Timer slack of 1 ns: the kernel's default 50 µs slack would be added to every wake-up.
        let _ = rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(1));
        let tid = rustix::thread::gettid().as_raw_nonzero().get();
        let (policy, notes) = match &timed {
            Some(t) => crate::sched::enter(&t.tries, t.floor),
            None => (SchedPolicy::Other, Vec::new()),
        };
        let sched = WorkerSched { index, timed: timed.is_some(), tid, policy, notes };
        let rt = if realtime { lock_memory() } else { Err("not asked for".to_string()) };
        // The ring is built on the thread that submits to it (IORING_SETUP_SINGLE_ISSUER).
        let (reactor, mut info) = match Ring::new(&ring_cfg) {
            Ok((ring, reg)) => {
                let registered = match reg {
                    Registration::Registered => Ok(()),
                    Registration::Disabled => Err("buffer registration disabled".to_string()),
                    Registration::Refused(errno) => Err(format!(
                        "the kernel refused to register the buffer pool ({}); RLIMIT_MEMLOCK too small? \
                         using unregistered buffers",
                        io::Error::from_raw_os_error(errno)
                    )),
                };
                (Reactor::Ring(Box::new(ring)), EngineInfo { uring: Ok(()), registered, realtime: Ok(()), rt_ioprio: false, workers: Vec::new(), sched_notes: Vec::new() })
            }
            Err(RingError::Unavailable(e)) => (
                Reactor::Poll { waiting: Vec::new() },
                EngineInfo {
                    uring: Err(format!("io_uring unavailable ({e}): using sendfile/splice/copy on poll(2)")),
                    registered: Err("no io_uring".to_string()),
                    realtime: Ok(()),
                    rt_ioprio: false,
                    workers: Vec::new(),
                    sched_notes: Vec::new(),
                },
            ),
            Err(e) => {
                let msg = format!("io_uring setup failed ({e}): using sendfile/splice/copy on poll(2)");
                (
                    Reactor::Poll { waiting: Vec::new() },
                    EngineInfo { uring: Err(msg), registered: Err("no io_uring".to_string()), realtime: Ok(()), rt_ioprio: false, workers: Vec::new(), sched_notes: Vec::new() },
                )
            }
        };
        info.realtime = rt;
        info.workers = vec![sched];
        let disk = match &reactor {
            Reactor::Ring(_) => match DiskQueue::new(&disk_cfg, buffer_bytes as u64, queue_max, depth_pub) {
                Ok(d) => {
                    info.rt_ioprio = d.rt_ioprio();
                    // A timed worker carries no bulk: its own thread's I/O class is RT too,
                    // which bfq takes from the submitting thread rather than the SQE
                    // (docs/io-scheduler.md §7).
                    if d.rt_ioprio() && info.workers.first().is_some_and(|w| w.timed) {
                        let _ = crate::sys::ioprio_set_current_thread(crate::sys::ioprio_value(
                            crate::sys::IoprioClass::RealTime,
                            0,
                        ));
                    }
                    Some(d)
                }
                Err(e) => {
                    info.uring = Err(format!("disk scheduler configuration refused: {e}"));
                    None
                }
            },
            Reactor::Poll { .. } => None,
        };
        let bufs = match &reactor {
            Reactor::Ring(ring) if disk.is_some() => {
                match WorkerBuffers::new(ring, clients_max, borrow_max, shrink_after, gauges) {
                    Ok(b) => Some(b),
                    Err(e) => {
                        info.uring = Err(format!("buffer books refused the pool: {e}"));
                        None
                    }
                }
            }
            _ => None,
        };
        let _ = info_tx.send(info);
        let mut w = Worker {
            reactor,
            rx,
            own_rx,
            wake: wake2,
            wake_armed: false,
            depth,
            slots: Vec::new(),
            free: Vec::new(),
            by_id: HashMap::new(),
            ready: VecDeque::new(),
            completions: Vec::new(),
            shutting_down: false,
            edf: EdfQueue::new(order, entries_max),
            due: Vec::new(),
            rtus: Vec::new(),
            rtu_free: Vec::new(),
            rtu_by_id: HashMap::new(),
            timer_mode,
            spin,
            slack,
            syscalls: syscalls_pub,
            timers: [None; TIMERS_MAX as usize],
            disk,
            synthetic: Vec::new(),
            bufs,
            wakeups: Vec::new(),
            watch_at: None,
            shrink_at: None,
        };
        w.run();
    })?;
    let info = info_rx
        .recv()
        .map_err(|_| io::Error::other("worker died at start"))?;
    Ok((
        WorkerHandle {
            thread: join.thread().id(),
            tx,
            own,
            commands_max,
            wake,
            disk_depth,
            syscalls,
        },
        join,
        info,
    ))
}

impl Worker {
    fn run(&mut self) {
        loop {
            self.take_commands();
            if self.shutting_down && self.by_id.is_empty() {
                return;
            }
            self.watch();
            self.pool_upkeep();
            self.release_due();
            self.step_ready();
            self.wake_buffer_waiters();
            self.wait();
            self.wake_buffer_waiters();
        }
    }

    /// Steps every stream runnable now, once (a stream that yields is stepped next turn).
    fn step_ready(&mut self) {
        let mut turns = self.ready.len();
        while turns > 0 {
            turns -= 1;
            let Some(slot) = self.ready.pop_front() else {
                break;
            };
            self.step(slot);
        }
    }

    /// Shrinks the buffer pool back towards its start size once it has been idle
    /// (`WorkerBuffers::upkeep`); `shrink_at` bounds the next blocking wait.
    fn pool_upkeep(&mut self) {
        if let (Some(b), Reactor::Ring(ring)) = (&mut self.bufs, &mut self.reactor) {
            self.shrink_at = b.upkeep(ring);
        }
    }

    /// Steps the streams the buffer books ask for: borrowers that owe buffers, and streams
    /// that found none once one was released.
    fn wake_buffer_waiters(&mut self) {
        let Some(b) = &mut self.bufs else {
            return;
        };
        let mut wakeups = std::mem::take(&mut self.wakeups);
        b.take_wakeups(&mut wakeups);
        for &slot in &wakeups {
            self.schedule(slot);
        }
        wakeups.clear();
        self.wakeups = wakeups;
    }

    fn take_commands(&mut self) {
        while let Ok(cmd) = self.rx.try_recv().or_else(|_| self.own_rx.try_recv()) {
            match cmd {
                Command::Open(task) => {
                    let slot = match self.free.pop() {
                        Some(s) => s,
                        None => {
                            self.slots.push((0, None));
                            self.slots.len() - 1
                        }
                    };
                    let mut task = task;
                    if let Some(timeout) = task.send_timeout {
                        let now = clock::now();
                        task.progress_at = now;
                        let at = now + watch_interval(timeout);
                        self.watch_at = Some(self.watch_at.map_or(at, |w| w.min(at)));
                    }
                    if let (Machine::Uring(u), Some(b), Reactor::Ring(ring)) =
                        (&mut task.machine, &mut self.bufs, &mut self.reactor)
                    {
                        match b.register(ring, slot, task.buffers_reserved) {
                            Ok(c) => u.client = Some(c),
                            Err(e) => task.outcome = Some(Err(StreamError::Buffers(e))),
                        }
                    }
                    self.by_id.insert(task.id, slot);
                    self.slots[slot].1 = Some(task);
                    self.schedule(slot);
                }
                Command::Cancel(id) => {
                    if let Some(&slot) = self.by_id.get(&id) {
                        self.edf.cancel(Entry::Stream(slot));
                        self.schedule(slot);
                    }
                }
                Command::Pause(id) => {
                    if let Some(t) = self.by_id.get(&id).and_then(|&s| self.slots[s].1.as_mut()) {
                        t.paused.get_or_insert_with(clock::now);
                        t.io.counters.paused.store(true, Ordering::Release);
                    }
                }
                Command::SetClass(id, class) => {
                    if let Some(t) = self.by_id.get(&id).and_then(|&s| self.slots[s].1.as_mut()) {
                        t.io.class = class;
                    }
                }
                Command::Resume(id) => {
                    if let Some(&slot) = self.by_id.get(&id) {
                        if let Some(t) = self.slots[slot].1.as_mut() {
                            t.io.counters.paused.store(false, Ordering::Release);
                            let now = clock::now();
                            // The progress clock starts again: a pause is not a stall.
                            t.progress_at = now;
                            if let Some(at) = t.paused.take()
                                && let Some(p) = &mut t.io.pace
                            {
                                p.resume_after(at, now);
                            }
                        }
                        self.edf.cancel(Entry::Stream(slot));
                        self.schedule(slot);
                    }
                }
                Command::Notify(id, hook) => {
                    // A task leaves `by_id` only in `finish`, right after its report: not
                    // found means the report is there already.
                    match self.by_id.get(&id).and_then(|&s| self.slots[s].1.as_mut()) {
                        Some(t) => t.on_done = Some(hook),
                        None => hook(),
                    }
                }
                Command::TuneDisk(settings) => {
                    if let Some(disk) = &mut self.disk
                        && let Err(e) = disk.tune(&settings)
                    {
                        // The engine checked the settings against the same largest read
                        // (`buffer_bytes`): a refusal here is a bug, and the old settings stay.
                        debug_assert!(false, "the disk queue refused checked settings: {e}");
                    }
                }
                Command::RtuCreate(mut rtu) => {
                    rtu.anchor(clock::now());
                    let k = match self.rtu_free.pop() {
                        Some(k) => k,
                        None => {
                            self.rtus.push(None);
                            self.rtus.len() - 1
                        }
                    };
                    let (release, deadline) = rtu.next_job();
                    self.edf
                        .push_job(Entry::Rtu(k), release, deadline, rtu.period_ns())
                        .expect("the queue holds rtus_max entries beside the streams");
                    self.rtu_by_id.insert(rtu.id, k);
                    self.rtus[k] = Some(rtu);
                }
                Command::RtuCancel(id) => {
                    if let Some(k) = self.rtu_by_id.remove(&id) {
                        self.edf.cancel(Entry::Rtu(k));
                        let rtu = self.rtus[k].take().expect("an upcall by id has a slot");
                        self.rtu_free.push(k);
                        rtu.finish(None);
                    }
                }
                Command::RtuSuspend(id, release) => {
                    if let Some(&k) = self.rtu_by_id.get(&id)
                        && let Some(rtu) = self.rtus[k].as_mut()
                        && rtu.suspend(release)
                    {
                        self.edf.cancel(Entry::Rtu(k));
                    }
                }
                Command::RtuRun(id, hold) => {
                    if let Some(&k) = self.rtu_by_id.get(&id)
                        && let Some(rtu) = self.rtus[k].as_mut()
                        && rtu.resume(clock::now(), hold.map(|h| *h))
                    {
                        let (release, deadline) = rtu.next_job();
                        self.edf
                            .push_job(Entry::Rtu(k), release, deadline, rtu.period_ns())
                            .expect("a suspended upcall's entry was taken off the queue");
                    }
                }
                Command::Shutdown => {
                    self.shutting_down = true;
                    // Upcalls end with the engine: their handles see `EngineStopped`, their
                    // CPU is given back.
                    for k in 0..self.rtus.len() {
                        if self.rtus[k].take().is_some() {
                            self.edf.cancel(Entry::Rtu(k));
                        }
                    }
                    self.rtu_by_id.clear();
                    let slots: Vec<usize> = self.by_id.values().copied().collect();
                    for (_, t) in self.slots.iter_mut() {
                        if let Some(t) = t {
                            t.cancel.store(true, Ordering::Release);
                        }
                    }
                    for s in slots {
                        self.schedule(s);
                    }
                }
            }
        }
    }

    fn schedule(&mut self, slot: usize) {
        if let Some(t) = self.slots[slot].1.as_mut()
            && !t.queued
        {
            t.queued = true;
            self.ready.push_back(slot);
        }
    }

    fn step(&mut self, slot: usize) {
        let generation = self.slots[slot].0;
        let Some(mut task) = self.slots[slot].1.take() else {
            return;
        };
        task.queued = false;
        let cancelled = task.cancel.load(Ordering::Acquire);
        if task.outcome.is_none() && (cancelled || task.stalled) {
            // A stall ends the stream exactly as a cancel does; only the report differs.
            task.outcome = Some(Err(if cancelled {
                StreamError::Cancelled {
                    bytes_sent: task.io.sent,
                }
            } else {
                StreamError::Stalled {
                    bytes_sent: task.io.sent,
                    timeout: task.send_timeout.unwrap_or_default(),
                }
            }));
            if let Reactor::Ring(ring) = &mut self.reactor
                && task.in_ring > 0
            {
                let mine = |t: u64| token_parts(t).0 == slot && token_parts(t).1 == generation;
                ring.cancel_where(mine);
                if let Some(disk) = &mut self.disk {
                    disk.cancel_where(mine, ring);
                }
            }
            if let Reactor::Poll { waiting } = &mut self.reactor {
                waiting.retain(|(s, _, _)| *s != slot);
            }
        }
        if task.outcome.is_none() && task.paused.is_some() {
            // Paused: issue nothing; a Resume command schedules the task again. Buffers owed
            // to an rt stream are still given back (a paused borrower would hold them).
            if let (Machine::Uring(u), Reactor::Ring(ring), Some(bufs)) =
                (&mut task.machine, &mut self.reactor, &mut self.bufs)
                && u.client.is_some()
            {
                u.pay_debt(ring, bufs);
            }
            self.slots[slot].1 = Some(task);
            return;
        }
        if task.outcome.is_none() {
            task.started.get_or_insert_with(std::time::Instant::now);
            let step = match &mut task.machine {
                // The readiness-driven paths: an error ends the stream like a `Finish`.
                Machine::Copy(c) => paths::copy_step(c, &mut task.io, STEP_BUDGET)
                    .unwrap_or_else(|e| Step::Finish(Err(e))),
                Machine::Sendfile => paths::sendfile_step(&mut task.io, STEP_BUDGET)
                    .unwrap_or_else(|e| Step::Finish(Err(e))),
                Machine::Splice(sp) => paths::splice_step(sp, &mut task.io, STEP_BUDGET)
                    .unwrap_or_else(|e| Step::Finish(Err(e))),
                Machine::Uring(u) => match &mut self.reactor {
                    Reactor::Ring(ring) => {
                        let disk = self.disk.as_mut().expect("a ring comes with a disk queue");
                        let bufs = self.bufs.as_mut().expect("a ring comes with buffer books");
                        let mut issued = 0u32;
                        let mut refused = false;
                        let s = u.step(
                            &mut task.io,
                            ring,
                            disk,
                            bufs,
                            self.depth,
                            &mut |tag, arg| {
                                issued += 1;
                                token(slot, generation, tag, arg)
                            },
                            &mut refused,
                        );
                        task.in_ring += issued;
                        if refused && task.in_ring == 0 && matches!(s, Step::WaitRing) {
                            // Nothing in flight will wake it: try again next turn.
                            Step::Yield
                        } else {
                            s
                        }
                    }
                    Reactor::Poll { .. } => {
                        unreachable!("the uring path is only chosen when io_uring works")
                    }
                },
            };
            match step {
                Step::Yield => {
                    self.slots[slot].1 = Some(task);
                    self.schedule(slot);
                    return;
                }
                Step::WaitFd(side, events) => match &mut self.reactor {
                    Reactor::Ring(ring) => {
                        ring.poll(
                            task.io.fd(side).as_raw_fd(),
                            events,
                            token(slot, generation, TAG_POLL, 0),
                        )
                        .expect("ops_max exceeds what streams can hold in flight");
                        task.in_ring += 1;
                    }
                    Reactor::Poll { waiting } => waiting.push((slot, side, events)),
                },
                Step::WaitRing => {}
                Step::WaitUntil(deadline) => {
                    task.waited_until = deadline;
                    let period_ns = task.io.pace.as_ref().map_or(0, |p| p.period_ns());
                    self.edf.cancel(Entry::Stream(slot));
                    self.edf
                        .push(Entry::Stream(slot), deadline, period_ns)
                        .expect("the queue holds streams_max entries, one per stream");
                }
                Step::Finish(r) => {
                    task.finished_at = Some(std::time::Instant::now());
                    task.outcome = Some(r);
                }
            }
        }
        if task.outcome.is_some() && task.in_ring == 0 {
            self.finish(slot, task);
        } else {
            self.slots[slot].1 = Some(task);
        }
    }

    fn finish(&mut self, slot: usize, mut task: Box<Task>) {
        if let Machine::Uring(u) = &mut task.machine
            && let Reactor::Ring(ring) = &mut self.reactor
            && let Some(bufs) = &mut self.bufs
        {
            u.release(ring, bufs);
            u.release_gate(&task.io);
            if let Some(c) = u.client.take() {
                bufs.unregister(c);
            }
        }
        let outcome = task.outcome.take().expect("finish with an outcome");
        let started = task.started.unwrap_or_else(std::time::Instant::now);
        let ended = task.finished_at.unwrap_or_else(std::time::Instant::now);
        self.edf.cancel(Entry::Stream(slot));
        let mut pace = task.io.pace.take();
        if let Some(p) = &pace
            && p.trace_dropped > 0
        {
            task.io
                .note_once(&format!("trace full: {} units not kept", p.trace_dropped));
        }
        task.io.moved.add_to_process_total();
        let report = outcome.map(|()| StreamReport {
            bytes: task.io.sent,
            units: task.io.units,
            planned: task.path,
            executed: task.io.moved.path(),
            moved: task.io.moved,
            cache: task.io.cache,
            elapsed: ended.duration_since(started),
            notes: std::mem::take(&mut task.io.notes),
            lateness: pace.as_ref().map(|p| p.stats.clone()),
            trace: pace
                .as_mut()
                .and_then(|p| p.trace.take())
                .unwrap_or_default(),
        });
        // Close the descriptors (the receiver sees EOF) before telling the caller it is done.
        let done = task.done.clone();
        let on_done = task.on_done.take();
        self.by_id.remove(&task.id);
        drop(task);
        let _ = done.send(report);
        if let Some(hook) = on_done {
            hook();
        }
        self.slots[slot].0 = self.slots[slot].0.wrapping_add(1);
        self.free.push(slot);
    }

    /// Makes every paced stream whose deadline has come — or comes within the dispatch slack —
    /// runnable and runs every upcall activation released (spinning up to `spin` for a
    /// deadline that is that close), in the queue's order: before an activation runs, the
    /// streams popped ahead of it are stepped and their sends handed to the kernel, so that a
    /// callback never delays a unit the order puts first (under EDF, every unit due now).
    ///
    /// The slack batches: the streams released here are stepped in this turn and their sends
    /// go to the kernel in one submission (`wait`), and their gates (`Pace::gate`) use the same
    /// slack. It applies only while the worker holds no upcall, whose activations must never
    /// run before their release (after the first upcall arrives, an activation released
    /// within one slack of an earlier wake-up may still run at that wake-up's horizon, once).
    fn release_due(&mut self) {
        let Some(next) = self.edf.peek_deadline() else {
            return;
        };
        let mut now = clock::now();
        if next > now && !self.spin.is_zero() && self.ready.is_empty() && next - now <= self.spin {
            while now < next {
                std::hint::spin_loop();
                now = clock::now();
            }
        }
        let horizon = if self.rtu_by_id.is_empty() {
            now + self.slack
        } else {
            now
        };
        self.due.clear();
        self.edf.pop_due(horizon, DUE_BUDGET, &mut self.due);
        for i in 0..self.due.len() {
            match self.due[i].key {
                Entry::Stream(slot) => self.schedule(slot),
                Entry::Rtu(k) => {
                    self.step_ready();
                    if let Reactor::Ring(ring) = &mut self.reactor
                        && let Err(e) = {
                            self.syscalls.fetch_add(1, Ordering::Relaxed);
                            ring.submit()
                        }
                    {
                        panic!("io_uring submit failed: {e}");
                    }
                    self.run_rtu(k);
                }
            }
        }
    }

    /// Runs upcall `k`'s released activation, then queues its next one; a callback that
    /// panicked ends the upcall (reported by its handle).
    fn run_rtu(&mut self, k: usize) {
        let Some(rtu) = self.rtus.get_mut(k).and_then(Option::as_mut) else {
            return;
        };
        if rtu.is_suspended() {
            return;
        }
        match rtu.activate() {
            Ok(()) => {
                let (release, deadline) = rtu.next_job();
                let period_ns = rtu.period_ns();
                self.edf
                    .push_job(Entry::Rtu(k), release, deadline, period_ns)
                    .expect("the upcall's entry was just popped");
            }
            Err(panicked) => {
                let rtu = self.rtus[k].take().expect("checked above");
                self.rtu_by_id.remove(&rtu.id);
                self.rtu_free.push(k);
                rtu.finish(Some(panicked));
            }
        }
    }

    /// The watchdog of `StreamSpec::send_timeout`, at most every `watch_interval` of the
    /// shortest timeout: a stream whose bytes read plus sent have not changed for longer than
    /// its timeout — not paused, not waiting for its own next deadline — is marked stalled
    /// and stepped; the step cancels its operations as a `Cancel` does, and it reports
    /// `Stalled` once they have completed. Costs one clock read per loop turn while a stream
    /// has a timeout and, per scan, a counter compare per stream; nothing per unit.
    fn watch(&mut self) {
        let Some(at) = self.watch_at else {
            return;
        };
        let now = clock::now();
        if now < at {
            return;
        }
        let mut shortest: Option<Duration> = None;
        for slot in 0..self.slots.len() {
            let Some(t) = self.slots[slot].1.as_mut() else {
                continue;
            };
            let Some(timeout) = t.send_timeout else {
                continue;
            };
            if t.outcome.is_some() || t.stalled {
                continue;
            }
            shortest = Some(shortest.map_or(timeout, |s| s.min(timeout)));
            let seen =
                t.io.sent
                    .wrapping_add(t.io.counters.bytes_read.load(Ordering::Relaxed));
            if seen != t.progress_seen || t.paused.is_some() {
                t.progress_seen = seen;
                t.progress_at = now;
                continue;
            }
            // A paced stream's clock starts when its unit is due (a period may be longer
            // than the timeout); until then `now` is before `since`.
            let since = t.progress_at.max(t.waited_until);
            if now.saturating_duration_since(since) > timeout {
                t.stalled = true;
                self.edf.cancel(Entry::Stream(slot));
                self.schedule(slot);
            }
        }
        self.watch_at = shortest.map(|s| now + watch_interval(s));
    }

    fn wait(&mut self) {
        if let (Some(disk), Reactor::Ring(ring)) = (&mut self.disk, &mut self.reactor) {
            disk.dispatch(clock::now(), ring);
            disk.take_synthetic(&mut self.synthetic);
        }
        if !self.synthetic.is_empty() {
            let synthetic = std::mem::take(&mut self.synthetic);
            for c in &synthetic {
                self.route(c);
            }
            return;
        }
        let block = self.ready.is_empty();
        let next_deadline = if block {
            self.edf.peek_deadline()
        } else {
            None
        };
        let spin_ns = self.spin.as_nanos() as u64;
        let wake_at =
            next_deadline.map(|d| Instant::from_nanos(d.as_nanos().saturating_sub(spin_ns)));
        // The watchdog's next scan bounds every blocking wait, though it wakes no stream.
        let watch_at = if block {
            match (self.watch_at, self.shrink_at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        } else {
            None
        };
        let wake_or_watch = match (wake_at, watch_at) {
            (Some(a), Some(w)) => Some(a.min(w)),
            (a, w) => a.or(w),
        };
        // A deadline this close is slept to with clock_nanosleep even in `Uring` mode: an
        // io_uring timeout costs more per wake-up (measured: 1,000 streams × 30/s on one
        // worker, 88% of a core and p99 132 µs, against 68% and 83 µs), and a completion or a
        // new stream waits at most this long.
        let short = wake_at.is_some_and(|at| {
            at.as_nanos().saturating_sub(clock::now().as_nanos()) <= SHORT_SLEEP_NS
        });
        if let (Some(at), mode, Reactor::Ring(ring)) = (wake_at, self.timer_mode, &mut self.reactor)
            && (mode == TimerMode::Nanosleep || short)
        {
            // Hand queued sends to the kernel, take what completed, then sleep to the deadline.
            self.syscalls.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = ring.submit() {
                panic!("io_uring submit failed: {e}");
            }
            self.completions.clear();
            ring.reap(&mut self.completions);
            if self.completions.is_empty() {
                let at = wake_or_watch.unwrap_or(at);
                let ts = rustix::time::Timespec {
                    tv_sec: (at.as_nanos() / 1_000_000_000) as i64,
                    tv_nsec: (at.as_nanos() % 1_000_000_000) as i64,
                };
                self.syscalls.fetch_add(1, Ordering::Relaxed);
                let _ = rustix::thread::clock_nanosleep_absolute(
                    rustix::thread::ClockId::Monotonic,
                    &ts,
                );
                ring.reap(&mut self.completions);
            }
            let completions = std::mem::take(&mut self.completions);
            for c in &completions {
                self.route(c);
            }
            self.completions = completions;
            return;
        }
        match &mut self.reactor {
            Reactor::Ring(ring) => {
                if !self.wake_armed {
                    ring.poll(self.wake.as_raw_fd(), libc::POLLIN as u32, WAKE_TOKEN)
                        .expect("room for the wake poll");
                    self.wake_armed = true;
                }
                // Sleep no later than `at` (the next deadline, then the watchdog's next scan):
                // an armed timer at or before it already does; otherwise arm one in a free
                // slot, or (all slots busy with later timers) bound the wait itself.
                let mut bound: Option<Duration> = None;
                for at in [wake_at, watch_at].into_iter().flatten() {
                    let covered = self.timers.iter().flatten().any(|&t| t <= at);
                    if !covered {
                        match self.timers.iter().position(Option::is_none) {
                            Some(k) => {
                                ring.timeout_at(at.as_nanos(), TIMER_TOKEN_BASE + k as u64)
                                    .expect("room for a timer");
                                self.timers[k] = Some(at);
                            }
                            None => {
                                let d = at.saturating_duration_since(clock::now());
                                bound = Some(bound.map_or(d, |b| b.min(d)));
                            }
                        }
                    }
                }
                self.syscalls.fetch_add(1, Ordering::Relaxed);
                let r = if block {
                    ring.submit_and_wait(1, bound)
                } else {
                    ring.submit().map(drop)
                };
                if let Err(e) = r {
                    panic!("io_uring submit failed: {e}");
                }
                self.completions.clear();
                ring.reap(&mut self.completions);
            }
            Reactor::Poll { waiting } => {
                let slots = &self.slots;
                let mut fds: Vec<rustix::event::PollFd<'_>> = waiting
                    .iter()
                    .map(|&(slot, side, ev)| {
                        let task = slots[slot]
                            .1
                            .as_ref()
                            .expect("a waiting task is parked in its slot");
                        rustix::event::PollFd::from_borrowed_fd(task.io.fd(side), poll_flags(ev))
                    })
                    .collect();
                fds.push(rustix::event::PollFd::new(
                    &*self.wake,
                    rustix::event::PollFlags::IN,
                ));
                let until_deadline = wake_or_watch.map(|at| {
                    let d = at.saturating_duration_since(clock::now());
                    rustix::time::Timespec {
                        tv_sec: d.as_secs() as i64,
                        tv_nsec: i64::from(d.subsec_nanos()),
                    }
                });
                let zero = rustix::time::Timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                let timeout = if block {
                    until_deadline.as_ref()
                } else {
                    Some(&zero)
                };
                match rustix::event::poll(&mut fds, timeout) {
                    Ok(_) | Err(rustix::io::Errno::INTR) => {}
                    Err(e) => panic!("poll failed: {e}"),
                }
                let ready: Vec<bool> = fds[..waiting.len()]
                    .iter()
                    .map(|f| !f.revents().is_empty())
                    .collect();
                let wake_ready = !fds[waiting.len()].revents().is_empty();
                drop(fds);
                if wake_ready {
                    let mut b = [0u8; 8];
                    let _ = rustix::io::read(&*self.wake, &mut b);
                }
                let mut still = Vec::with_capacity(waiting.len());
                let mut woke = Vec::new();
                for (r, w) in ready.into_iter().zip(waiting.drain(..)) {
                    if r { woke.push(w.0) } else { still.push(w) }
                }
                *waiting = still;
                for s in woke {
                    self.schedule(s);
                }
                return;
            }
        }
        let completions = std::mem::take(&mut self.completions);
        for c in &completions {
            self.route(c);
        }
        self.completions = completions;
    }

    fn route(&mut self, c: &Completion) {
        // Only a dispatched read's completion needs the disk queue (and the clock): sends,
        // the bulk of completions, pass straight through.
        let (c, failed) = match &mut self.disk {
            Some(disk) if crate::disk::is_disk_token(c.token) => disk.translate(clock::now(), *c),
            _ => (*c, None),
        };
        let c = &c;
        if (TIMER_TOKEN_BASE..TIMER_TOKEN_BASE + TIMERS_MAX as u64).contains(&c.token) {
            self.timers[(c.token - TIMER_TOKEN_BASE) as usize] = None;
            return;
        }
        if c.token == WAKE_TOKEN {
            self.wake_armed = false;
            let mut b = [0u8; 8];
            let _ = rustix::io::read(&*self.wake, &mut b);
            return;
        }
        let (slot, generation, tag, arg) = token_parts(c.token);
        if self.slots.get(slot).map(|s| s.0) != Some(generation) {
            return; // a stale completion of a finished task (cannot happen: tasks wait for theirs)
        }
        let Some(task) = self.slots[slot].1.as_mut() else {
            return;
        };
        if !c.more {
            task.in_ring -= 1;
        }
        if tag != TAG_POLL
            && let (Machine::Uring(u), Reactor::Ring(ring), Some(bufs)) =
                (&mut task.machine, &mut self.reactor, &mut self.bufs)
            && let Err(e) = u.on_completion(&mut task.io, ring, bufs, tag, arg, c, failed.as_ref())
            && task.outcome.is_none()
        {
            task.finished_at = Some(std::time::Instant::now());
            task.outcome = Some(Err(e));
            let mine = |t: u64| token_parts(t).0 == slot && token_parts(t).1 == generation;
            ring.cancel_where(mine);
            if let Some(disk) = &mut self.disk {
                disk.cancel_where(mine, ring);
            }
        }
        if task.outcome.is_some() && task.in_ring == 0 {
            let task = self.slots[slot].1.take().expect("task present");
            self.finish(slot, task);
        } else if task.outcome.is_none() {
            self.schedule(slot);
        }
    }
}

/// mlockall for the process (`EngineConfig::realtime`); the reason when refused. The policy
/// itself is the timed workers' (`crate::sched`).
fn lock_memory() -> Result<(), String> {
    rustix::mm::mlockall(rustix::mm::MlockAllFlags::CURRENT | rustix::mm::MlockAllFlags::FUTURE)
        .map_err(|e| format!("mlockall refused ({e})"))?;
    Ok(())
}

fn poll_flags(events: u32) -> rustix::event::PollFlags {
    let mut f = rustix::event::PollFlags::empty();
    if events & libc::POLLIN as u32 != 0 {
        f |= rustix::event::PollFlags::IN;
    }
    if events & libc::POLLOUT as u32 != 0 {
        f |= rustix::event::PollFlags::OUT;
    }
    f
}
