//! The disk request scheduler: Deficit Round Robin between classes, EDF inside deadline
//! classes, an elevator-sorted work queue per round, and a bound on requests in flight per
//! device.
//!
//! This is MARS §4.3 (Buddhikot et al.) re-done sans-IO. Each device has one queue per class.
//! When a device's work queue is empty and it has an in-flight slot free, a *round* is formed:
//! every backlogged class (the active list of Shreedhar & Varghese) gets its quantum added to
//! its deficit and moves requests from the head of its queue into the work queue while the
//! head's cost fits in the deficit. A class whose queue empties loses its deficit (MARS: "its
//! quantum is not carried over to the next round"). The work queue is then sorted by offset
//! (C-SCAN from the head's position, see [`IoScheduler::poll_dispatch`]) and drained in that
//! order, never more than `disk_inflight_max` at a time per device: the in-flight bound is the
//! lever (MARS's adapter slots) that keeps the device's own queue short, so that our order is
//! the order the disk sees.
//!
//! Cost: round formation visits each backlogged class once and moves each request once, so
//! the work per request is O(1) plus the heap step of a deadline class and the sort of the
//! round (O(log k) for a round of k requests).
//!
//! What is absent: no clock (time comes in as `now`), no I/O, no allocation that is not
//! bounded by the configured limits. Guarantees and the arithmetic behind them are in
//! `docs/io-scheduler.md`.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fmt;

use crate::time::Instant;

/// Most classes a scheduler may have. Round formation is O(classes), so keep it small.
pub const CLASSES_MAX: usize = 64;
/// Most devices one scheduler may serve; `poll_dispatch` scans devices, so keep it bounded.
pub const DEVICES_MAX: u32 = 4096;
/// Largest quantum a class may have (1 TiB of cost per round). A deficit stays below a
/// quantum plus the largest cost, so the bound keeps every deficit sum far from `u64`
/// overflow; no device serves a round of this size in useful time anyway.
pub const QUANTUM_BYTES_MAX: u64 = 1 << 40;
/// Largest `disk_inflight_max`: far beyond any device's useful queue depth (NVMe queues hold
/// 1024 and more, but past a few dozen the device, not the scheduler, orders the requests).
pub const INFLIGHT_MAX_LIMIT: u32 = 4096;

/// A class, as an index into the configured class list (see [`IoScheduler::class`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct ClassId(u16);

impl ClassId {
    /// The position of this class in [`SchedConfig::classes`].
    pub const fn index(self) -> usize {
        self.0 as usize
    }

    /// The class at position `index` of the configured list (checked when used).
    pub const fn from_index(index: u16) -> ClassId {
        ClassId(index)
    }
}

/// A device (disk) the driver numbers from 0 to `devices - 1`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct DeviceId(pub u32);

/// The caller's name for a request, unique among requests queued or in flight.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct RequestId(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// One disk read (or write) as the scheduler sees it: where, how much, for whom, and by when.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Request {
    pub id: RequestId,
    pub class: ClassId,
    pub device: DeviceId,
    pub offset_bytes: u64,
    pub len_bytes: u64,
    /// When the data must be in memory (the start of the period it feeds). Orders requests
    /// inside a [`QueueOrder::Deadline`] class; `None` sorts after every deadline.
    pub deadline: Option<Instant>,
}

/// How a class orders its own queue.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum QueueOrder {
    /// First come, first served (bulk).
    Arrival,
    /// Earliest deadline first, ties in arrival order (rt, Clockwise's EDF queue).
    Deadline,
}

/// One class of service.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ClassConfig {
    pub name: String,
    /// Service per round, in bytes of cost. Weights are the ratios of quanta.
    pub quantum_bytes: u64,
    /// Adaptive quantum (MARS varied the quanta with the real-time queue's backlog): when
    /// set, the class's quantum in a round on a device is its backlog there (the cost of
    /// the requests it has queued), at least `quantum_bytes` and at most this. The other
    /// classes keep their quanta, so none of them is starved: the adaptive class's share of a
    /// round follows its backlog up to `max ÷ (max + the others' quanta)`.
    pub quantum_max_bytes: Option<u64>,
    /// Bound on requests queued (not yet dispatched) in this class, all devices together.
    /// A full queue is [`SchedError::QueueFull`]: backpressure, not unbounded memory.
    pub queue_max: u32,
    pub order: QueueOrder,
}

/// Whether the scheduler schedules.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum SchedMode {
    /// DRR between classes, EDF inside deadline classes, elevator within a round.
    Drr,
    /// The scheduler switched off: plain arrival order per device, same interface, same
    /// in-flight bound. The baseline benchmarks compare against.
    Fifo,
}

/// Everything fixed at start (quanta and the in-flight bound may change later).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SchedConfig {
    pub mode: SchedMode,
    pub classes: Vec<ClassConfig>,
    /// Number of devices; requests name a device below this.
    pub devices: u32,
    /// Largest `len_bytes` a request may have. Every quantum must cover the largest cost,
    /// otherwise a class could wait rounds for a deficit large enough to send its head.
    pub max_request_bytes: u64,
    /// Cost charged per request on top of its length: the device's positioning time
    /// expressed in bytes of bandwidth (seek_s × bandwidth). Makes a 4 KiB random read cost
    /// what it takes from the disk, not 4 KiB. Zero charges bytes only.
    pub request_overhead_bytes: u64,
    /// Requests in flight per device at most (`disk_inflight_max`).
    pub disk_inflight_max: u32,
}

impl SchedConfig {
    /// The usual two classes: `rt` (EDF, weight `rt_quantum_bytes`) then `bulk` (arrival).
    pub fn rt_bulk(
        rt_quantum_bytes: u64,
        bulk_quantum_bytes: u64,
        max_request_bytes: u64,
        disk_inflight_max: u32,
    ) -> SchedConfig {
        SchedConfig {
            mode: SchedMode::Drr,
            classes: vec![
                ClassConfig {
                    name: "rt".into(),
                    quantum_bytes: rt_quantum_bytes,
                    quantum_max_bytes: None,
                    queue_max: 1024,
                    order: QueueOrder::Deadline,
                },
                ClassConfig {
                    name: "bulk".into(),
                    quantum_bytes: bulk_quantum_bytes,
                    quantum_max_bytes: None,
                    queue_max: 1024,
                    order: QueueOrder::Arrival,
                },
            ],
            devices: 1,
            max_request_bytes,
            request_overhead_bytes: 0,
            disk_inflight_max,
        }
    }
}

impl SchedConfig {
    /// `rt` (EDF) and `bulk` as [`SchedConfig::rt_bulk`], then each named class (arrival
    /// order, its own quantum): the engine's `[disk.classes.NAME]`. Class `i` of the list is
    /// `ClassId::from_index(i)`.
    pub fn with_classes(
        rt_quantum_bytes: u64,
        bulk_quantum_bytes: u64,
        named: &[(String, u64)],
        max_request_bytes: u64,
        disk_inflight_max: u32,
    ) -> SchedConfig {
        let mut c = SchedConfig::rt_bulk(
            rt_quantum_bytes,
            bulk_quantum_bytes,
            max_request_bytes,
            disk_inflight_max,
        );
        c.classes.extend(named.iter().map(|(name, q)| ClassConfig {
            name: name.clone(),
            quantum_bytes: *q,
            quantum_max_bytes: None,
            queue_max: 1024,
            order: QueueOrder::Arrival,
        }));
        c
    }
}

/// Why the scheduler refused a configuration, a change or a request. Nothing changed.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SchedError {
    #[error("unknown class {name:?} (configured: {known})")]
    UnknownClass { name: String, known: String },
    #[error("no classes configured: at least one is needed")]
    NoClasses,
    #[error("{classes} classes configured, at most {CLASSES_MAX} allowed")]
    TooManyClasses { classes: usize },
    #[error("class {name:?} configured twice")]
    DuplicateClass { name: String },
    #[error("class {class:?}: quantum is zero; a class with no quantum would never be served")]
    ZeroQuantum { class: String },
    #[error(
        "class {class:?}: quantum {quantum_bytes} B is below the largest request cost \
         {request_cost_max_bytes} B (max_request_bytes + request_overhead_bytes); \
         DRR needs quantum >= largest request"
    )]
    QuantumBelowMaxRequest {
        class: String,
        quantum_bytes: u64,
        request_cost_max_bytes: u64,
    },
    #[error("class {class:?}: queue_max is zero; the class could never queue a request")]
    ZeroQueueMax { class: String },
    #[error("max_request_bytes is zero")]
    ZeroMaxRequest,
    #[error("disk_inflight_max is zero: no request could ever be dispatched")]
    ZeroInflightMax,
    #[error(
        "class {class:?}: quantum {quantum_bytes} B is above the limit {QUANTUM_BYTES_MAX} B (1 TiB)"
    )]
    QuantumTooLarge { class: String, quantum_bytes: u64 },
    #[error(
        "class {class:?}: adaptive quantum ceiling {quantum_max_bytes} B is below its quantum {quantum_bytes} B"
    )]
    QuantumMaxBelowQuantum {
        class: String,
        quantum_bytes: u64,
        quantum_max_bytes: u64,
    },
    #[error("disk_inflight_max {inflight_max} is above the limit {INFLIGHT_MAX_LIMIT}")]
    InflightMaxTooLarge { inflight_max: u32 },
    #[error("{devices} devices configured; between 1 and {DEVICES_MAX} allowed")]
    DeviceCount { devices: u32 },
    #[error("unknown device {device} (devices 0..{devices})")]
    UnknownDevice { device: u32, devices: u32 },
    #[error("request {id}: {len_bytes} B is larger than max_request_bytes {max_request_bytes} B")]
    RequestTooLarge {
        id: RequestId,
        len_bytes: u64,
        max_request_bytes: u64,
    },
    #[error("request {id}: class {class:?} queue is full ({queue_max} requests); retry later")]
    QueueFull {
        id: RequestId,
        class: String,
        queue_max: u32,
    },
    #[error("request {id} is already queued or in flight")]
    DuplicateRequest { id: RequestId },
    #[error("request {id} is not known to the scheduler")]
    UnknownRequest { id: RequestId },
    #[error("request {id} completed while still queued (never dispatched)")]
    NotInFlight { id: RequestId },
}

/// What the scheduler has done for one class (all devices together).
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct ClassCounters {
    /// Requests waiting (in the class queue or a formed round), now.
    pub queued: u64,
    /// Requests dispatched and not yet completed, now.
    pub inflight: u64,
    pub dispatched_requests: u64,
    pub dispatched_bytes: u64,
    /// Completed requests and their bytes.
    pub served_requests: u64,
    pub served_bytes: u64,
    /// Submissions refused because the class queue was full (backpressure applied).
    pub refused_requests: u64,
    /// Requests dispatched when their deadline had already passed.
    pub late_dispatches: u64,
    /// Requests completed after their deadline.
    pub deadline_misses: u64,
}

/// A request queued in a deadline class: the heap is a max-heap, so `Ord` is reversed to
/// pop the earliest (deadline, sequence) first. The sequence keeps ties in arrival order
/// and makes the order total, hence deterministic.
#[derive(Debug)]
struct ByDeadline {
    deadline: Instant,
    seq: u64,
    request: Request,
}

impl ByDeadline {
    fn key(&self) -> (Instant, u64) {
        (self.deadline, self.seq)
    }
}

impl PartialEq for ByDeadline {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}
impl Eq for ByDeadline {}
impl PartialOrd for ByDeadline {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for ByDeadline {
    fn cmp(&self, other: &Self) -> Ordering {
        other.key().cmp(&self.key())
    }
}

#[derive(Debug)]
enum ClassQueue {
    Arrival(VecDeque<Request>),
    Deadline(BinaryHeap<ByDeadline>),
}

impl ClassQueue {
    fn new(order: QueueOrder) -> ClassQueue {
        match order {
            QueueOrder::Arrival => ClassQueue::Arrival(VecDeque::new()),
            QueueOrder::Deadline => ClassQueue::Deadline(BinaryHeap::new()),
        }
    }

    fn push(&mut self, request: Request, seq: u64) {
        match self {
            ClassQueue::Arrival(q) => q.push_back(request),
            ClassQueue::Deadline(h) => h.push(ByDeadline {
                deadline: request.deadline.unwrap_or(Instant::MAX),
                seq,
                request,
            }),
        }
    }

    fn peek(&self) -> Option<&Request> {
        match self {
            ClassQueue::Arrival(q) => q.front(),
            ClassQueue::Deadline(h) => h.peek().map(|e| &e.request),
        }
    }

    fn pop(&mut self) -> Option<Request> {
        match self {
            ClassQueue::Arrival(q) => q.pop_front(),
            ClassQueue::Deadline(h) => h.pop().map(|e| e.request),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            ClassQueue::Arrival(q) => q.is_empty(),
            ClassQueue::Deadline(h) => h.is_empty(),
        }
    }
}

#[derive(Debug)]
struct Device {
    /// One queue per class (DRR mode).
    queues: Vec<ClassQueue>,
    /// Backlogged classes, each at most once, in round-robin order.
    active: VecDeque<ClassId>,
    /// `active_flag[c]` iff `c` is in `active`: keeps membership O(1).
    active_flag: Vec<bool>,
    deficit_bytes: Vec<u64>,
    /// Per class: the cost of its queued requests (an adaptive quantum follows it).
    backlog_bytes: Vec<u64>,
    /// The current round, already in dispatch (elevator) order.
    work: VecDeque<Request>,
    /// Arrival order (FIFO mode).
    fifo: VecDeque<Request>,
    inflight: u32,
    /// Where the head will be after the last dispatched request: the C-SCAN sweep origin.
    head_offset_bytes: u64,
    rounds: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Place {
    Queued,
    InFlight,
}

#[derive(Clone, Copy, Debug)]
struct Known {
    place: Place,
    class: ClassId,
    device: DeviceId,
    request: Request,
}

/// The scheduler. Feed it with [`submit`](Self::submit) and [`complete`](Self::complete),
/// drain it with [`poll_dispatch`](Self::poll_dispatch) until it returns `None`; call
/// `poll_dispatch` again after every submit or completion (either may free a slot or add
/// work). The driver issues what comes out, in that order.
#[derive(Debug)]
pub struct IoScheduler {
    mode: SchedMode,
    classes: Vec<ClassConfig>,
    counters: Vec<ClassCounters>,
    devices: Vec<Device>,
    max_request_bytes: u64,
    request_overhead_bytes: u64,
    disk_inflight_max: u32,
    known: HashMap<RequestId, Known>,
    seq: u64,
    /// Device to try first on the next poll, so that no device starves another.
    device_cursor: usize,
}

impl IoScheduler {
    /// Checks the whole configuration; any error names the class or limit at fault.
    pub fn new(config: SchedConfig) -> Result<IoScheduler, SchedError> {
        let SchedConfig {
            mode,
            classes,
            devices,
            max_request_bytes,
            request_overhead_bytes,
            disk_inflight_max,
        } = config;
        if classes.is_empty() {
            return Err(SchedError::NoClasses);
        }
        if classes.len() > CLASSES_MAX {
            return Err(SchedError::TooManyClasses {
                classes: classes.len(),
            });
        }
        if devices == 0 || devices > DEVICES_MAX {
            return Err(SchedError::DeviceCount { devices });
        }
        if max_request_bytes == 0 {
            return Err(SchedError::ZeroMaxRequest);
        }
        check_inflight_max(disk_inflight_max)?;
        let cost_max = request_cost_bytes(max_request_bytes, request_overhead_bytes);
        for (i, c) in classes.iter().enumerate() {
            check_quantum(&c.name, c.quantum_bytes, cost_max)?;
            check_quantum_max(&c.name, c.quantum_bytes, c.quantum_max_bytes)?;
            if c.queue_max == 0 {
                return Err(SchedError::ZeroQueueMax {
                    class: c.name.clone(),
                });
            }
            if classes[..i].iter().any(|o| o.name == c.name) {
                return Err(SchedError::DuplicateClass {
                    name: c.name.clone(),
                });
            }
        }
        let devices = (0..devices)
            .map(|_| Device {
                queues: classes.iter().map(|c| ClassQueue::new(c.order)).collect(),
                active: VecDeque::with_capacity(classes.len()),
                active_flag: vec![false; classes.len()],
                deficit_bytes: vec![0; classes.len()],
                backlog_bytes: vec![0; classes.len()],
                work: VecDeque::new(),
                fifo: VecDeque::new(),
                inflight: 0,
                head_offset_bytes: 0,
                rounds: 0,
            })
            .collect();
        Ok(IoScheduler {
            mode,
            counters: vec![ClassCounters::default(); classes.len()],
            classes,
            devices,
            max_request_bytes,
            request_overhead_bytes,
            disk_inflight_max,
            known: HashMap::new(),
            seq: 0,
            device_cursor: 0,
        })
    }

    /// The class named `name`.
    pub fn class(&self, name: &str) -> Result<ClassId, SchedError> {
        self.classes
            .iter()
            .position(|c| c.name == name)
            // Fits: `new` refuses more than CLASSES_MAX (64) classes.
            .map(|i| ClassId(i as u16))
            .ok_or_else(|| SchedError::UnknownClass {
                name: name.into(),
                known: self.class_names(),
            })
    }

    /// The configured name of `class`.
    pub fn class_name(&self, class: ClassId) -> Result<&str, SchedError> {
        self.class_config(class).map(|c| c.name.as_str())
    }

    /// All classes, in configuration order.
    pub fn classes(&self) -> impl Iterator<Item = ClassId> + '_ {
        (0..self.classes.len()).map(|i| ClassId(i as u16))
    }

    pub fn mode(&self) -> SchedMode {
        self.mode
    }

    pub fn max_request_bytes(&self) -> u64 {
        self.max_request_bytes
    }

    pub fn quantum_bytes(&self, class: ClassId) -> Result<u64, SchedError> {
        self.class_config(class).map(|c| c.quantum_bytes)
    }

    pub fn inflight_max(&self) -> u32 {
        self.disk_inflight_max
    }

    /// Changes a class's quantum at run time (MARS: "quanta changed over time"). Takes effect
    /// from the next round formed on each device; deficits already earned are kept.
    pub fn set_quantum(&mut self, class: ClassId, quantum_bytes: u64) -> Result<(), SchedError> {
        let cost_max = request_cost_bytes(self.max_request_bytes, self.request_overhead_bytes);
        let c = self.class_config(class)?;
        check_quantum(&c.name, quantum_bytes, cost_max)?;
        check_quantum_max(&c.name, quantum_bytes, c.quantum_max_bytes)?;
        self.classes[class.index()].quantum_bytes = quantum_bytes;
        Ok(())
    }

    /// The class's adaptive ceiling ([`ClassConfig::quantum_max_bytes`]); `None`: fixed.
    pub fn quantum_max_bytes(&self, class: ClassId) -> Result<Option<u64>, SchedError> {
        self.class_config(class).map(|c| c.quantum_max_bytes)
    }

    /// Makes a class's quantum adaptive up to `max` (or fixed again with `None`), from the
    /// next round on.
    pub fn set_quantum_max(&mut self, class: ClassId, max: Option<u64>) -> Result<(), SchedError> {
        let c = self.class_config(class)?;
        check_quantum_max(&c.name, c.quantum_bytes, max)?;
        self.classes[class.index()].quantum_max_bytes = max;
        Ok(())
    }

    /// The cost of the requests `class` has queued (not yet in a round) on `device`: what an
    /// adaptive quantum follows.
    pub fn backlog_bytes(&self, device: DeviceId, class: ClassId) -> Result<u64, SchedError> {
        self.class_config(class)?;
        Ok(self.device(device)?.backlog_bytes[class.index()])
    }

    /// Changes the in-flight bound at run time. Lowering it below what is in flight
    /// dispatches nothing more on that device until enough requests complete.
    pub fn set_inflight_max(&mut self, disk_inflight_max: u32) -> Result<(), SchedError> {
        check_inflight_max(disk_inflight_max)?;
        self.disk_inflight_max = disk_inflight_max;
        Ok(())
    }

    /// The cost DRR charges for a request of `len_bytes`: its length plus the per-request
    /// overhead, and never less than 1. A zero cost would let a class send unboundedly many
    /// requests in one round and monopolize the device (seastar's fair_queue clamps for the
    /// same reason).
    pub fn cost_bytes(&self, len_bytes: u64) -> u64 {
        request_cost_bytes(len_bytes, self.request_overhead_bytes)
    }

    /// Queues a request. On error nothing changed; [`SchedError::QueueFull`] is backpressure:
    /// the caller keeps the request and retries after a completion.
    pub fn submit(&mut self, now: Instant, request: Request) -> Result<(), SchedError> {
        let _ = now; // Part of the interface: the scheduler's decisions do not depend on it yet.
        let class = self.class_config(request.class)?;
        let device_count = self.devices.len() as u32;
        if request.device.0 >= device_count {
            return Err(SchedError::UnknownDevice {
                device: request.device.0,
                devices: device_count,
            });
        }
        if request.len_bytes > self.max_request_bytes {
            return Err(SchedError::RequestTooLarge {
                id: request.id,
                len_bytes: request.len_bytes,
                max_request_bytes: self.max_request_bytes,
            });
        }
        if self.known.contains_key(&request.id) {
            return Err(SchedError::DuplicateRequest { id: request.id });
        }
        let ci = request.class.index();
        if self.counters[ci].queued >= u64::from(class.queue_max) {
            let err = SchedError::QueueFull {
                id: request.id,
                class: class.name.clone(),
                queue_max: class.queue_max,
            };
            self.counters[ci].refused_requests += 1;
            return Err(err);
        }
        let dev = &mut self.devices[request.device.0 as usize];
        match self.mode {
            SchedMode::Fifo => dev.fifo.push_back(request),
            SchedMode::Drr => {
                dev.queues[ci].push(request, self.seq);
                dev.backlog_bytes[ci] +=
                    request_cost_bytes(request.len_bytes, self.request_overhead_bytes);
                if !dev.active_flag[ci] {
                    dev.active_flag[ci] = true;
                    dev.active.push_back(request.class);
                }
            }
        }
        self.seq += 1;
        self.counters[ci].queued += 1;
        self.known.insert(
            request.id,
            Known {
                place: Place::Queued,
                class: request.class,
                device: request.device,
                request,
            },
        );
        Ok(())
    }

    /// The next request to issue, or `None` when every device is either idle or at its
    /// in-flight bound.
    ///
    /// DRR mode: when a device's round is used up, the next round is formed (see the module
    /// docs) and sorted C-SCAN: requests at or beyond the head's position in ascending
    /// offset, then, after one return sweep, the rest in ascending offset. C-SCAN rather than
    /// the two-way elevator because it treats both ends of the disk alike, and a round is
    /// short, so the return sweep is paid once per round.
    pub fn poll_dispatch(&mut self, now: Instant) -> Option<Request> {
        let n = self.devices.len();
        for step in 0..n {
            let d = (self.device_cursor + step) % n;
            if self.devices[d].inflight >= self.disk_inflight_max {
                continue;
            }
            let request = match self.mode {
                SchedMode::Fifo => self.devices[d].fifo.pop_front(),
                SchedMode::Drr => {
                    if self.devices[d].work.is_empty() {
                        self.form_round(d);
                    }
                    self.devices[d].work.pop_front()
                }
            };
            let Some(request) = request else { continue };
            let dev = &mut self.devices[d];
            dev.inflight += 1;
            dev.head_offset_bytes = request.offset_bytes.saturating_add(request.len_bytes);
            let c = &mut self.counters[request.class.index()];
            c.queued -= 1;
            c.inflight += 1;
            c.dispatched_requests += 1;
            c.dispatched_bytes += request.len_bytes;
            if request.deadline.is_some_and(|dl| dl < now) {
                c.late_dispatches += 1;
            }
            let known = self.known.get_mut(&request.id);
            // A queued request is always in `known`: submit inserts before queueing.
            let known = known.expect("queued request missing from the request table");
            assert_eq!(known.place, Place::Queued);
            known.place = Place::InFlight;
            self.device_cursor = (d + 1) % n;
            return Some(request);
        }
        None
    }

    /// The device finished request `id`; its slot is free. Returns the request.
    pub fn complete(&mut self, now: Instant, id: RequestId) -> Result<Request, SchedError> {
        let known = *self
            .known
            .get(&id)
            .ok_or(SchedError::UnknownRequest { id })?;
        if known.place != Place::InFlight {
            return Err(SchedError::NotInFlight { id });
        }
        self.known.remove(&id);
        let dev = &mut self.devices[known.device.0 as usize];
        assert!(
            dev.inflight > 0,
            "completion on a device with nothing in flight"
        );
        dev.inflight -= 1;
        let c = &mut self.counters[known.class.index()];
        c.inflight -= 1;
        c.served_requests += 1;
        c.served_bytes += known.request.len_bytes;
        if known.request.deadline.is_some_and(|dl| now > dl) {
            c.deadline_misses += 1;
        }
        Ok(known.request)
    }

    pub fn counters(&self, class: ClassId) -> Result<&ClassCounters, SchedError> {
        self.class_config(class)?;
        Ok(&self.counters[class.index()])
    }

    /// Deficit a class carries on a device between rounds (always < its quantum; zero when
    /// the class has no backlog there).
    pub fn deficit_bytes(&self, device: DeviceId, class: ClassId) -> Result<u64, SchedError> {
        self.class_config(class)?;
        Ok(self.device(device)?.deficit_bytes[class.index()])
    }

    /// Rounds formed so far on `device` (DRR mode).
    pub fn rounds(&self, device: DeviceId) -> Result<u64, SchedError> {
        Ok(self.device(device)?.rounds)
    }

    /// Requests in flight on `device`.
    pub fn inflight(&self, device: DeviceId) -> Result<u32, SchedError> {
        Ok(self.device(device)?.inflight)
    }

    /// True when nothing is queued or in flight anywhere.
    pub fn is_idle(&self) -> bool {
        self.known.is_empty()
    }

    fn class_config(&self, class: ClassId) -> Result<&ClassConfig, SchedError> {
        self.classes
            .get(class.index())
            .ok_or_else(|| SchedError::UnknownClass {
                name: format!("#{}", class.index()),
                known: self.class_names(),
            })
    }

    fn class_names(&self) -> String {
        self.classes
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn device(&self, device: DeviceId) -> Result<&Device, SchedError> {
        self.devices
            .get(device.0 as usize)
            .ok_or(SchedError::UnknownDevice {
                device: device.0,
                devices: self.devices.len() as u32,
            })
    }

    /// One DRR round on device `d`: each backlogged class, once, in active-list order.
    fn form_round(&mut self, d: usize) {
        let overhead = self.request_overhead_bytes;
        let dev = &mut self.devices[d];
        debug_assert!(dev.work.is_empty());
        let backlogged = dev.active.len();
        for _ in 0..backlogged {
            // Bounded by the loop count: `active` holds `backlogged` entries.
            let Some(class) = dev.active.pop_front() else {
                break;
            };
            let ci = class.index();
            let c = &self.classes[ci];
            let quantum = match c.quantum_max_bytes {
                Some(max) => dev.backlog_bytes[ci].clamp(c.quantum_bytes, max),
                None => c.quantum_bytes,
            };
            let queue = &mut dev.queues[ci];
            dev.deficit_bytes[ci] += quantum;
            while let Some(head) = queue.peek() {
                let cost = request_cost_bytes(head.len_bytes, overhead);
                if cost > dev.deficit_bytes[ci] {
                    break;
                }
                dev.deficit_bytes[ci] -= cost;
                dev.backlog_bytes[ci] -= cost;
                let request = queue.pop().expect("peeked request vanished");
                dev.work.push_back(request);
            }
            if queue.is_empty() {
                // No backlog: the unused deficit is not carried (DRR; MARS §4.3).
                dev.deficit_bytes[ci] = 0;
                dev.active_flag[ci] = false;
            } else {
                // Quantum >= largest cost, so the head was refused with a deficit < its cost.
                assert!(
                    dev.deficit_bytes[ci] < quantum.max(1),
                    "deficit grew past a quantum"
                );
                dev.active.push_back(class);
            }
        }
        if dev.work.is_empty() {
            return;
        }
        let head = dev.head_offset_bytes;
        dev.work
            .make_contiguous()
            .sort_by_key(|r| (r.offset_bytes < head, r.offset_bytes));
        dev.rounds += 1;
    }
}

fn request_cost_bytes(len_bytes: u64, overhead_bytes: u64) -> u64 {
    len_bytes.saturating_add(overhead_bytes).max(1)
}

fn check_quantum_max(class: &str, quantum_bytes: u64, max: Option<u64>) -> Result<(), SchedError> {
    match max {
        Some(m) if m < quantum_bytes => Err(SchedError::QuantumMaxBelowQuantum {
            class: class.into(),
            quantum_bytes,
            quantum_max_bytes: m,
        }),
        Some(m) if m > QUANTUM_BYTES_MAX => Err(SchedError::QuantumTooLarge {
            class: class.into(),
            quantum_bytes: m,
        }),
        _ => Ok(()),
    }
}

fn check_quantum(class: &str, quantum_bytes: u64, cost_max: u64) -> Result<(), SchedError> {
    if quantum_bytes == 0 {
        return Err(SchedError::ZeroQuantum {
            class: class.into(),
        });
    }
    if quantum_bytes < cost_max {
        return Err(SchedError::QuantumBelowMaxRequest {
            class: class.into(),
            quantum_bytes,
            request_cost_max_bytes: cost_max,
        });
    }
    if quantum_bytes > QUANTUM_BYTES_MAX {
        return Err(SchedError::QuantumTooLarge {
            class: class.into(),
            quantum_bytes,
        });
    }
    Ok(())
}

fn check_inflight_max(disk_inflight_max: u32) -> Result<(), SchedError> {
    if disk_inflight_max == 0 {
        return Err(SchedError::ZeroInflightMax);
    }
    if disk_inflight_max > INFLIGHT_MAX_LIMIT {
        return Err(SchedError::InflightMaxTooLarge {
            inflight_max: disk_inflight_max,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u64 = 1024;

    fn t(ns: u64) -> Instant {
        Instant::from_nanos(ns)
    }

    fn req(id: u64, class: ClassId, offset_bytes: u64, len_bytes: u64) -> Request {
        Request {
            id: RequestId(id),
            class,
            device: DeviceId(0),
            offset_bytes,
            len_bytes,
            deadline: None,
        }
    }

    /// Per round formed, the bytes each class got (rt, bulk), dispatching and completing one
    /// request at a time at the given time; `feed` runs before each dispatch and may submit.
    fn rounds_served(
        s: &mut IoScheduler,
        mut feed: impl FnMut(&mut IoScheduler, u64, Instant),
    ) -> Vec<(u64, u64)> {
        let mut per_round: Vec<(u64, u64)> = Vec::new();
        let mut now_ns = 0u64;
        loop {
            now_ns += 1_000_000; // 1 ms a dispatch: hand-built time
            feed(s, per_round.len() as u64, t(now_ns));
            let before = s.rounds(DeviceId(0)).unwrap();
            let Some(r) = s.poll_dispatch(t(now_ns)) else {
                break;
            };
            if s.rounds(DeviceId(0)).unwrap() != before {
                per_round.push((0, 0));
            }
            let last = per_round.last_mut().unwrap();
            if r.class.index() == 0 {
                last.0 += r.len_bytes;
            } else {
                last.1 += r.len_bytes;
            }
            s.complete(t(now_ns), r.id).unwrap();
        }
        per_round
    }

    /// MARS's adaptive quanta: the rt class's service per round follows its backlog (between
    /// its quantum and its ceiling) while bulk keeps its quantum every round it is backlogged.
    #[test]
    fn an_adaptive_quantum_follows_the_rt_backlog_and_bulk_is_never_starved() {
        const MIB: u64 = 1024 * KIB;
        let mut c = SchedConfig::rt_bulk(MIB, MIB, 256 * KIB, 1);
        c.classes[0].quantum_max_bytes = Some(8 * MIB);
        c.classes[0].queue_max = 4096;
        c.classes[1].queue_max = 4096;
        let mut s = IoScheduler::new(c).unwrap();
        let (rt, bulk) = (ClassId(0), ClassId(1));
        // Bulk: 64 MiB queued from the start. Rt: a backlog that steps 1, 4, 16 MiB (above the
        // ceiling), then 2 MiB, submitted at the start of rounds 0, 3, 6 and 9.
        let mut id = 0u64;
        for _ in 0..256 {
            id += 1;
            s.submit(t(0), req(id, bulk, id * 256 * KIB, 256 * KIB))
                .unwrap();
        }
        let steps = [(0u64, MIB), (3, 4 * MIB), (6, 16 * MIB), (9, 2 * MIB)];
        let mut fed = std::collections::HashSet::new();
        let served = rounds_served(&mut s, |s, round, now| {
            for &(at, bytes) in &steps {
                if round == at && fed.insert(at) {
                    for _ in 0..bytes / (256 * KIB) {
                        id += 1;
                        let mut r = req(id, rt, (1 << 40) + id * 256 * KIB, 256 * KIB);
                        r.deadline = Some(now);
                        s.submit(now, r).unwrap();
                    }
                }
            }
        });
        // Round 0: rt's backlog 1 MiB (its quantum); round 3: 4 MiB; round 6: the ceiling,
        // 8 MiB, and round 7 the remaining 8 MiB; round 9: 2 MiB. Bulk 1 MiB in every one.
        assert_eq!(served[0], (MIB, MIB), "{served:?}");
        assert_eq!(served[3], (4 * MIB, MIB), "{served:?}");
        assert_eq!(served[6], (8 * MIB, MIB), "{served:?}");
        assert_eq!(served[7], (8 * MIB, MIB), "{served:?}");
        assert_eq!(served[9], (2 * MIB, MIB), "{served:?}");
        // Every round while bulk had work gave it its quantum: never starved.
        let bulk_rounds = served.iter().take_while(|r| r.1 > 0).count();
        assert!(
            served[..bulk_rounds].iter().all(|r| r.1 == MIB),
            "{served:?}"
        );
        assert_eq!(s.backlog_bytes(DeviceId(0), rt).unwrap(), 0);
        assert_eq!(s.backlog_bytes(DeviceId(0), bulk).unwrap(), 0);
        // The same load with fixed quanta: rt gets 1 MiB a round, whatever its backlog.
        let mut s2 = IoScheduler::new(SchedConfig::rt_bulk(MIB, MIB, 256 * KIB, 1)).unwrap();
        for i in 0..64 {
            let mut r = req(i + 1, rt, i * 256 * KIB, 256 * KIB);
            r.deadline = Some(t(0));
            s2.submit(t(0), r).unwrap();
        }
        let fixed = rounds_served(&mut s2, |_, _, _| {});
        assert!(fixed.iter().all(|r| r.0 == MIB), "{fixed:?}");
    }

    #[test]
    fn an_adaptive_ceiling_below_the_quantum_is_refused() {
        let mut c = SchedConfig::rt_bulk(1 << 20, 1 << 20, 256 * KIB, 1);
        c.classes[0].quantum_max_bytes = Some(512 * KIB);
        assert!(matches!(
            IoScheduler::new(c.clone()),
            Err(SchedError::QuantumMaxBelowQuantum { .. })
        ));
        c.classes[0].quantum_max_bytes = None;
        let mut s = IoScheduler::new(c).unwrap();
        let rt = s.class("rt").unwrap();
        assert!(s.set_quantum_max(rt, Some(512 * KIB)).is_err());
        assert_eq!(s.quantum_max_bytes(rt).unwrap(), None);
        s.set_quantum_max(rt, Some(4 << 20)).unwrap();
        assert_eq!(s.quantum_max_bytes(rt).unwrap(), Some(4 << 20));
        // A quantum raised above the ceiling is refused too.
        assert!(s.set_quantum(rt, 8 << 20).is_err());
    }

    fn drain(s: &mut IoScheduler) -> Vec<Request> {
        let mut out = Vec::new();
        while let Some(r) = s.poll_dispatch(t(0)) {
            s.complete(t(0), r.id).unwrap();
            out.push(r);
        }
        out
    }

    #[test]
    fn config_errors_are_typed() {
        let good = SchedConfig::rt_bulk(256 * KIB, 128 * KIB, 128 * KIB, 4);
        let mut c = good.clone();
        c.classes[1].quantum_bytes = 0;
        assert!(matches!(
            IoScheduler::new(c),
            Err(SchedError::ZeroQuantum { .. })
        ));
        let mut c = good.clone();
        c.classes[1].quantum_bytes = 64 * KIB;
        let err = IoScheduler::new(c).unwrap_err();
        assert!(matches!(err, SchedError::QuantumBelowMaxRequest { .. }));
        assert!(err.to_string().contains("bulk"), "{err}");
        let mut c = good.clone();
        c.disk_inflight_max = 0;
        assert_eq!(
            IoScheduler::new(c).unwrap_err(),
            SchedError::ZeroInflightMax
        );
        let mut c = good.clone();
        c.classes[1].name = "rt".into();
        assert!(matches!(
            IoScheduler::new(c),
            Err(SchedError::DuplicateClass { .. })
        ));
        let mut c = good.clone();
        c.request_overhead_bytes = 200 * KIB; // cost max 328 KiB > bulk quantum
        assert!(matches!(
            IoScheduler::new(c),
            Err(SchedError::QuantumBelowMaxRequest { .. })
        ));
        let mut c = good;
        c.classes.clear();
        assert_eq!(IoScheduler::new(c).unwrap_err(), SchedError::NoClasses);
    }

    #[test]
    fn bad_requests_change_nothing() {
        let mut s =
            IoScheduler::new(SchedConfig::rt_bulk(256 * KIB, 128 * KIB, 128 * KIB, 4)).unwrap();
        let err = s.class("video").unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown class \"video\" (configured: rt, bulk)"
        );
        let rt = s.class("rt").unwrap();
        assert!(matches!(
            s.submit(t(0), req(1, ClassId(7), 0, 1)),
            Err(SchedError::UnknownClass { .. })
        ));
        assert!(matches!(
            s.submit(t(0), req(1, rt, 0, 129 * KIB)),
            Err(SchedError::RequestTooLarge { .. })
        ));
        let mut r = req(1, rt, 0, 1);
        r.device = DeviceId(1);
        assert!(matches!(
            s.submit(t(0), r),
            Err(SchedError::UnknownDevice { .. })
        ));
        assert!(s.is_idle());
        s.submit(t(0), req(1, rt, 0, 1)).unwrap();
        assert_eq!(
            s.submit(t(0), req(1, rt, 0, 1)),
            Err(SchedError::DuplicateRequest { id: RequestId(1) })
        );
        assert_eq!(
            s.complete(t(0), RequestId(1)),
            Err(SchedError::NotInFlight { id: RequestId(1) })
        );
        assert_eq!(
            s.complete(t(0), RequestId(9)),
            Err(SchedError::UnknownRequest { id: RequestId(9) })
        );
        assert!(s.set_quantum(rt, 0).is_err());
        assert!(s.set_quantum(rt, KIB).is_err());
        assert_eq!(s.quantum_bytes(rt).unwrap(), 256 * KIB);
        assert_eq!(s.set_inflight_max(0), Err(SchedError::ZeroInflightMax));
        assert_eq!(s.inflight_max(), 4);
    }

    #[test]
    fn full_queue_is_backpressure() {
        let mut cfg = SchedConfig::rt_bulk(256 * KIB, 128 * KIB, 128 * KIB, 1);
        cfg.classes[1].queue_max = 2;
        let mut s = IoScheduler::new(cfg).unwrap();
        let bulk = s.class("bulk").unwrap();
        s.submit(t(0), req(1, bulk, 0, KIB)).unwrap();
        s.submit(t(0), req(2, bulk, 0, KIB)).unwrap();
        let err = s.submit(t(0), req(3, bulk, 0, KIB)).unwrap_err();
        assert!(
            matches!(err, SchedError::QueueFull { queue_max: 2, .. }),
            "{err}"
        );
        assert_eq!(s.counters(bulk).unwrap().refused_requests, 1);
        // Dispatching frees queue space.
        let r = s.poll_dispatch(t(0)).unwrap();
        s.submit(t(0), req(3, bulk, 0, KIB)).unwrap();
        assert_eq!(r.id, RequestId(1));
    }

    #[test]
    fn inflight_bound_holds_and_completion_frees_a_slot() {
        let mut s =
            IoScheduler::new(SchedConfig::rt_bulk(256 * KIB, 128 * KIB, 128 * KIB, 2)).unwrap();
        let bulk = s.class("bulk").unwrap();
        for i in 0..5 {
            s.submit(t(0), req(i, bulk, i * KIB, KIB)).unwrap();
        }
        let a = s.poll_dispatch(t(0)).unwrap();
        let _b = s.poll_dispatch(t(0)).unwrap();
        assert_eq!(s.poll_dispatch(t(0)), None);
        assert_eq!(s.inflight(DeviceId(0)).unwrap(), 2);
        s.complete(t(1), a.id).unwrap();
        assert!(s.poll_dispatch(t(1)).is_some());
        assert_eq!(s.poll_dispatch(t(1)), None);
        s.set_inflight_max(1).unwrap();
        assert_eq!(s.counters(bulk).unwrap().inflight, 2);
    }

    #[test]
    fn rt_is_served_in_deadline_order_and_rounds_are_cscan_sorted() {
        // One round takes everything (quanta large); the round is sorted by offset.
        let mut s = IoScheduler::new(SchedConfig::rt_bulk(1 << 30, 1 << 30, 128 * KIB, 1)).unwrap();
        let rt = s.class("rt").unwrap();
        for (id, off) in [(1, 500), (2, 100), (3, 300)] {
            s.submit(t(0), req(id, rt, off, 10)).unwrap();
        }
        let order: Vec<u64> = drain(&mut s).iter().map(|r| r.offset_bytes).collect();
        assert_eq!(order, [100, 300, 500]);
        // Head now at 510: C-SCAN serves >= 510 first, then wraps.
        for (id, off) in [(4, 20), (5, 900), (6, 600)] {
            s.submit(t(0), req(id, rt, off, 10)).unwrap();
        }
        let order: Vec<u64> = drain(&mut s).iter().map(|r| r.offset_bytes).collect();
        assert_eq!(order, [600, 900, 20]);

        // Quantum = one request: each round takes exactly the earliest deadline.
        let mut s = IoScheduler::new(SchedConfig::rt_bulk(10, 10, 10, 1)).unwrap();
        for (id, dl) in [(1, 30), (2, 10), (3, 20), (4, 10)] {
            let mut r = req(id, rt, 1000 - id, 10);
            r.deadline = Some(t(dl));
            s.submit(t(0), r).unwrap();
        }
        let mut r = req(5, rt, 0, 10);
        r.deadline = None;
        s.submit(t(0), r).unwrap();
        let ids: Vec<u64> = drain(&mut s).iter().map(|r| r.id.0).collect();
        assert_eq!(ids, [2, 4, 3, 1, 5]);
    }

    #[test]
    fn drr_shares_follow_quanta_and_empty_class_loses_deficit() {
        let mut s = IoScheduler::new(SchedConfig::rt_bulk(3 * KIB, KIB, KIB, 1)).unwrap();
        let (rt, bulk) = (s.class("rt").unwrap(), s.class("bulk").unwrap());
        for i in 0..30 {
            s.submit(t(0), req(i, rt, 0, KIB)).unwrap();
            s.submit(t(0), req(100 + i, bulk, 0, KIB)).unwrap();
        }
        // First 40 dispatches: 10 rounds of 3 rt + 1 bulk.
        let mut rt_n = 0;
        for _ in 0..40 {
            let r = s.poll_dispatch(t(0)).unwrap();
            s.complete(t(0), r.id).unwrap();
            rt_n += u32::from(r.class == rt);
        }
        assert_eq!(rt_n, 30);
        assert_eq!(
            s.deficit_bytes(DeviceId(0), rt).unwrap(),
            0,
            "rt emptied: deficit dropped"
        );

        // A 700 B remainder carried while backlogged, dropped when the queue empties.
        let mut s = IoScheduler::new(SchedConfig::rt_bulk(KIB, KIB, KIB, 1)).unwrap();
        let bulk = s.class("bulk").unwrap();
        s.submit(t(0), req(1, bulk, 0, 324)).unwrap();
        s.submit(t(0), req(2, bulk, 0, 1000)).unwrap();
        s.poll_dispatch(t(0)).unwrap();
        assert_eq!(s.deficit_bytes(DeviceId(0), bulk).unwrap(), 700);
        s.complete(t(0), RequestId(1)).unwrap();
        s.poll_dispatch(t(0)).unwrap();
        assert_eq!(s.deficit_bytes(DeviceId(0), bulk).unwrap(), 0);
    }

    #[test]
    fn zero_length_requests_cost_one_byte() {
        let mut s = IoScheduler::new(SchedConfig::rt_bulk(4, 4, 4, 64)).unwrap();
        let (rt, bulk) = (s.class("rt").unwrap(), s.class("bulk").unwrap());
        for i in 0..20 {
            s.submit(t(0), req(i, rt, 0, 0)).unwrap();
        }
        s.submit(t(0), req(99, bulk, 0, 4)).unwrap();
        let first: Vec<u64> = (0..5)
            .map(|_| s.poll_dispatch(t(0)).unwrap().id.0)
            .collect();
        assert!(
            first.contains(&99),
            "bulk must get into the first round: {first:?}"
        );
    }

    #[test]
    fn fifo_mode_is_arrival_order() {
        let mut cfg = SchedConfig::rt_bulk(KIB, KIB, KIB, 1);
        cfg.mode = SchedMode::Fifo;
        let mut s = IoScheduler::new(cfg).unwrap();
        let (rt, bulk) = (s.class("rt").unwrap(), s.class("bulk").unwrap());
        s.submit(t(0), req(1, bulk, 900, 10)).unwrap();
        let mut r = req(2, rt, 0, 10);
        r.deadline = Some(t(1));
        s.submit(t(0), r).unwrap();
        s.submit(t(0), req(3, bulk, 100, 10)).unwrap();
        let ids: Vec<u64> = drain(&mut s).iter().map(|r| r.id.0).collect();
        assert_eq!(ids, [1, 2, 3]);
    }

    #[test]
    fn quanta_and_inflight_limits_are_typed() {
        let mut s = IoScheduler::new(SchedConfig::rt_bulk(KIB, KIB, KIB, 1)).unwrap();
        let rt = s.class("rt").unwrap();
        assert!(matches!(
            s.set_quantum(rt, QUANTUM_BYTES_MAX + 1),
            Err(SchedError::QuantumTooLarge { .. })
        ));
        s.set_quantum(rt, QUANTUM_BYTES_MAX).unwrap();
        assert_eq!(
            s.set_inflight_max(INFLIGHT_MAX_LIMIT + 1),
            Err(SchedError::InflightMaxTooLarge {
                inflight_max: INFLIGHT_MAX_LIMIT + 1
            })
        );
        assert_eq!(s.inflight_max(), 1);
        let mut c = SchedConfig::rt_bulk(KIB, KIB, KIB, 1);
        c.disk_inflight_max = INFLIGHT_MAX_LIMIT + 1;
        assert!(IoScheduler::new(c).is_err());
    }

    /// Quanta changed at run time, between or in the middle of rounds (MARS: "quanta changed
    /// over time"; `TUNE disk`): the new quanta take effect from the next round formed, the
    /// carried deficit never reaches the quantum in force, and over every run of rounds
    /// formed under one set of quanta, with both classes backlogged, each class is served
    /// within one largest cost of `rounds × quantum` — DRR's share guarantee holds across the
    /// change.
    mod quantum_changes {
        use super::*;
        use proptest::prelude::*;

        const MAX: u64 = 64 * KIB;

        /// (quanta in force at formation, bytes of cost served per class) per round.
        type Rounds = Vec<([u64; 2], [u64; 2])>;

        fn run(
            quanta0: [u64; 2],
            changes: &[(usize, [u64; 2])],
            lens: &[u64],
            dispatches: usize,
        ) -> Result<Rounds, TestCaseError> {
            let mut s =
                IoScheduler::new(SchedConfig::rt_bulk(quanta0[0], quanta0[1], MAX, 1)).unwrap();
            let classes = [s.class("rt").unwrap(), s.class("bulk").unwrap()];
            let mut quanta = quanta0;
            let mut queued = [0usize; 2];
            let mut next_id = 0u64;
            let mut rounds: Rounds = Vec::new();
            let mut change = changes.iter().peekable();
            for step in 0..dispatches {
                while let Some((_, q)) = change.next_if(|(at, _)| *at == step) {
                    for (c, &qc) in classes.iter().zip(q) {
                        s.set_quantum(*c, qc).unwrap();
                    }
                    quanta = *q;
                }
                // Both classes stay backlogged: more queued than any round can take.
                for (ci, &c) in classes.iter().enumerate() {
                    while queued[ci] < 2 * (8 * MAX / (MAX / 4)) as usize + 2 {
                        let len = lens[next_id as usize % lens.len()];
                        s.submit(t(0), req(next_id, c, next_id * MAX, len)).unwrap();
                        next_id += 1;
                        queued[ci] += 1;
                    }
                }
                let before = s.rounds(DeviceId(0)).unwrap();
                let r = s.poll_dispatch(t(0)).expect("backlogged");
                if s.rounds(DeviceId(0)).unwrap() > before {
                    rounds.push((quanta, [0, 0]));
                }
                let ci = usize::from(r.class == classes[1]);
                queued[ci] -= 1;
                rounds.last_mut().expect("a round was formed").1[ci] += s.cost_bytes(r.len_bytes);
                s.complete(t(0), r.id).unwrap();
                for (ci, &c) in classes.iter().enumerate() {
                    let deficit = s.deficit_bytes(DeviceId(0), c).unwrap();
                    prop_assert!(
                        deficit < s.quantum_bytes(c).unwrap(),
                        "class {ci}: deficit {deficit} not below its quantum"
                    );
                }
            }
            // The last round may be only partly dispatched.
            rounds.pop();
            Ok(rounds)
        }

        proptest! {
            #[test]
            fn shares_follow_the_quanta_in_force(
                quanta0 in [MAX..=8 * MAX, MAX..=8 * MAX],
                changes in proptest::collection::vec(
                    (0usize..3000, [MAX..=8 * MAX, MAX..=8 * MAX]), 1..6),
                lens in proptest::collection::vec(MAX / 4..=MAX, 1..50),
            ) {
                let mut changes = changes;
                changes.sort_by_key(|(at, _)| *at);
                let rounds = run(quanta0, &changes, &lens, 3000)?;
                prop_assert!(rounds.len() > 10);
                // Runs of consecutive rounds formed under the same quanta.
                let mut i = 0;
                while i < rounds.len() {
                    let q = rounds[i].0;
                    let mut served = [0u64; 2];
                    let mut k = 0u64;
                    while i < rounds.len() && rounds[i].0 == q {
                        served[0] += rounds[i].1[0];
                        served[1] += rounds[i].1[1];
                        k += 1;
                        i += 1;
                    }
                    for c in 0..2 {
                        let due = k * q[c];
                        prop_assert!(
                            served[c].abs_diff(due) < MAX,
                            "class {c}: {served:?} in {k} rounds of quanta {q:?}"
                        );
                    }
                }
            }
        }

        #[test]
        fn a_change_mid_round_applies_from_the_next_round() {
            // rt 4 requests per round, bulk 1; after the change bulk 4, rt 1.
            let rounds = run([4 * MAX, MAX], &[(7, [MAX, 4 * MAX])], &[MAX], 40).unwrap();
            assert_eq!(rounds[0], ([4 * MAX, MAX], [4 * MAX, MAX]));
            // Dispatch 7 falls in round 2 (dispatches 5..=9): that round keeps the old quanta.
            assert_eq!(rounds[1], ([4 * MAX, MAX], [4 * MAX, MAX]));
            assert_eq!(rounds[2], ([MAX, 4 * MAX], [MAX, 4 * MAX]));
        }
    }

    /// N classes (`[disk.classes.NAME]`), every one backlogged: over any run of whole rounds
    /// each class is served its quantum per round within one largest request, so shares are
    /// proportional to the quanta; and every class is served in every round (none starved,
    /// whatever the quanta's ratios).
    mod n_classes {
        use super::*;
        use proptest::prelude::*;

        const MAX: u64 = 64 * KIB;

        proptest! {
            #[test]
            fn shares_are_proportional_to_quanta_and_none_starves(
                quanta in proptest::collection::vec(MAX..=16 * MAX, 2..8),
                lens in proptest::collection::vec(MAX / 8..=MAX, 1..40),
            ) {
                let named: Vec<(String, u64)> = quanta[2..]
                    .iter()
                    .enumerate()
                    .map(|(i, q)| (format!("c{i}"), *q))
                    .collect();
                let mut s = IoScheduler::new(SchedConfig::with_classes(
                    quanta[0], quanta[1], &named, MAX, 1,
                ))
                .unwrap();
                let n = quanta.len();
                let classes: Vec<ClassId> =
                    (0..n).map(|i| ClassId::from_index(i as u16)).collect();
                prop_assert_eq!(s.class("c0").ok(), named.first().map(|_| classes[2]));
                let mut queued = vec![0u64; n];
                let mut next_id = 0u64;
                let mut served: Vec<Vec<u64>> = Vec::new();
                for _ in 0..4000 {
                    for (ci, &c) in classes.iter().enumerate() {
                        // More queued than one round can take from any class (a quantum
                        // plus the deficit carried, below one request).
                        while queued[ci] < 18 * MAX {
                            let len = lens[next_id as usize % lens.len()];
                            s.submit(t(0), req(next_id, c, next_id, len)).unwrap();
                            next_id += 1;
                            queued[ci] += len;
                        }
                    }
                    let before = s.rounds(DeviceId(0)).unwrap();
                    let r = s.poll_dispatch(t(0)).expect("backlogged");
                    if s.rounds(DeviceId(0)).unwrap() > before {
                        served.push(vec![0; n]);
                    }
                    let ci = r.class.index();
                    queued[ci] -= r.len_bytes;
                    served.last_mut().expect("a round")[ci] += s.cost_bytes(r.len_bytes);
                    s.complete(t(0), r.id).unwrap();
                }
                served.pop(); // the last round may be partly dispatched
                prop_assert!(served.len() >= 3);
                for (i, round) in served.iter().enumerate() {
                    for c in 0..n {
                        prop_assert!(round[c] > 0, "round {i}: class {c} starved: {round:?}");
                    }
                }
                let k = served.len() as u64;
                for c in 0..n {
                    let total: u64 = served.iter().map(|r| r[c]).sum();
                    prop_assert!(
                        total.abs_diff(k * quanta[c]) < MAX,
                        "class {c}: {total} B in {k} rounds of quantum {}", quanta[c]
                    );
                }
            }
        }
    }

    #[test]
    fn deadline_misses_are_counted() {
        let mut s = IoScheduler::new(SchedConfig::rt_bulk(KIB, KIB, KIB, 1)).unwrap();
        let rt = s.class("rt").unwrap();
        let mut r = req(1, rt, 0, 10);
        r.deadline = Some(t(100));
        s.submit(t(0), r).unwrap();
        s.poll_dispatch(t(150)).unwrap();
        s.complete(t(200), r.id).unwrap();
        let c = s.counters(rt).unwrap();
        assert_eq!(
            (c.late_dispatches, c.deadline_misses, c.served_bytes),
            (1, 1, 10)
        );
    }
}
