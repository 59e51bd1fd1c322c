//! A worker's disk queue: every read of the uring path goes through core's `IoScheduler`
//! (DRR across classes, EDF inside `rt`, an elevator per round, a bound on reads in flight per
//! device) before it reaches the ring.
//!
//! A stream hands the queue a read (its buffer, file, offset, length, class and — for paced
//! streams — the deadline of the unit it feeds); the queue keeps it until the scheduler
//! dispatches it, then submits it with the class's I/O priority (IOPRIO_CLASS_RT for `rt` when
//! the kernel permits it, so that bfq/mq-deadline also put other processes' reads behind it).
//! A read whose stream was cancelled while queued is completed with ECANCELED without
//! touching the disk.
//!
//! The queue names every request itself (a sequence number in [`DISK_TOKEN_BASE`]`..`), so that
//! one stream may have several reads of the same buffer queued at once — the member pieces of a
//! volume chunk, each on its own device — and translates a completion back to the stream's
//! token ([`DiskQueue::translate`]).

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use penstock_core::sched::drr::{
    ClassId, DeviceId, IoScheduler, Request, RequestId, SchedConfig, SchedError, SchedMode,
};
use penstock_core::time::Instant;
use penstock_uring::sys::{IoprioClass, ioprio_value};
use penstock_uring::{BufId, Completion, Ring};

/// Devices one worker tells apart; more distinct devices share the last queue.
pub(crate) const DEVICES_PER_WORKER: u32 = 16;

/// The disk scheduler's settings (per worker).
#[derive(Debug, Clone)]
pub struct DiskConfig {
    /// `Drr` (the scheduler) or `Fifo` (switched off: arrival order, for comparison).
    pub mode: SchedMode,
    /// Bytes the `rt` class may read per DRR round.
    pub rt_quantum_bytes: u64,
    /// Bytes the `bulk` class may read per DRR round.
    pub bulk_quantum_bytes: u64,
    /// Reads in flight per device at most (MARS's adapter slots).
    pub disk_inflight_max: u32,
    /// Give `rt` reads IOPRIO_CLASS_RT (when the kernel permits it).
    pub rt_ioprio: bool,
    /// MARS's adaptive quanta: when set, the `rt` class's quantum in a round follows its
    /// backlog on the device, from `rt_quantum_bytes` up to this many times it
    /// ([`penstock_core::sched::drr::ClassConfig::quantum_max_bytes`]); bulk keeps its
    /// quantum, so it is never starved. `None`: fixed quanta. 2 ..= 64.
    pub adaptive_quantum_factor: Option<u32>,
    /// Classes besides `rt` and `bulk` (`[disk.classes.NAME]`): each a DRR queue of its own
    /// with its quantum, arrival order, no admission. Class `2 + i` of the worker's queue.
    pub named_classes: Vec<(String, u64)>,
}

/// Largest adaptive quantum factor: an rt round of 64 quanta is already most of a second's
/// reading on any disk.
pub const ADAPTIVE_QUANTUM_FACTOR_MAX: u32 = 64;

impl Default for DiskConfig {
    fn default() -> Self {
        DiskConfig {
            mode: SchedMode::Drr,
            rt_quantum_bytes: 4 << 20,
            bulk_quantum_bytes: 1 << 20,
            disk_inflight_max: 8,
            rt_ioprio: true,
            adaptive_quantum_factor: None,
            named_classes: Vec::new(),
        }
    }
}

impl DiskConfig {
    /// The engine's classes in queue order: `rt`, `bulk`, then the named ones.
    pub fn class_names(&self) -> Vec<String> {
        ["rt".to_string(), "bulk".to_string()]
            .into_iter()
            .chain(self.named_classes.iter().map(|(n, _)| n.clone()))
            .collect()
    }
}

/// The disk scheduler's settings that may change while the engine runs
/// ([`crate::Engine::tune_disk`]): MARS let an operator change the quanta over time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskSettings {
    pub rt_quantum_bytes: u64,
    pub bulk_quantum_bytes: u64,
    pub disk_inflight_max: u32,
    /// The named classes' quanta, in the configured order.
    pub named_quanta: Vec<(String, u64)>,
}

/// A change of [`DiskSettings`]: `None` keeps what is in force.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DiskTuning {
    pub rt_quantum_bytes: Option<u64>,
    pub bulk_quantum_bytes: Option<u64>,
    pub disk_inflight_max: Option<u32>,
    /// Named classes' new quanta; a name not configured is refused.
    pub named_quanta: Vec<(String, u64)>,
}

impl DiskSettings {
    /// The settings a worker's queue runs with for `cfg` (a quantum below the largest read,
    /// `max_request_bytes`, is raised to it, as [`DiskQueue`] does at start).
    pub(crate) fn of(cfg: &DiskConfig, max_request_bytes: u64) -> DiskSettings {
        DiskSettings {
            rt_quantum_bytes: cfg.rt_quantum_bytes.max(max_request_bytes),
            bulk_quantum_bytes: cfg.bulk_quantum_bytes.max(max_request_bytes),
            disk_inflight_max: cfg.disk_inflight_max,
            named_quanta: cfg
                .named_classes
                .iter()
                .map(|(n, q)| (n.clone(), (*q).max(max_request_bytes)))
                .collect(),
        }
    }

    /// These settings with `t` applied, checked as the scheduler checks them against reads of
    /// up to `max_request_bytes` (a quantum at least the largest read and at most
    /// [`penstock_core::sched::drr::QUANTUM_BYTES_MAX`], an in-flight bound in
    /// 1..=[`penstock_core::sched::drr::INFLIGHT_MAX_LIMIT`]). On error nothing is applied.
    pub fn tuned(
        &self,
        t: &DiskTuning,
        max_request_bytes: u64,
    ) -> Result<DiskSettings, SchedError> {
        let mut new = DiskSettings {
            rt_quantum_bytes: t.rt_quantum_bytes.unwrap_or(self.rt_quantum_bytes),
            bulk_quantum_bytes: t.bulk_quantum_bytes.unwrap_or(self.bulk_quantum_bytes),
            disk_inflight_max: t.disk_inflight_max.unwrap_or(self.disk_inflight_max),
            named_quanta: self.named_quanta.clone(),
        };
        for (name, q) in &t.named_quanta {
            let Some(slot) = new.named_quanta.iter_mut().find(|(n, _)| n == name) else {
                return Err(SchedError::UnknownClass {
                    name: name.clone(),
                    known: self.class_names().join(", "),
                });
            };
            slot.1 = *q;
        }
        // The scheduler's own checks, on a scheduler of one device built for them.
        IoScheduler::new(SchedConfig::with_classes(
            new.rt_quantum_bytes,
            new.bulk_quantum_bytes,
            &new.named_quanta,
            max_request_bytes,
            new.disk_inflight_max,
        ))?;
        Ok(new)
    }

    /// The classes' names in queue order: `rt`, `bulk`, the named ones.
    pub fn class_names(&self) -> Vec<String> {
        ["rt".to_string(), "bulk".to_string()]
            .into_iter()
            .chain(self.named_quanta.iter().map(|(n, _)| n.clone()))
            .collect()
    }
}

/// Ring tokens of dispatched reads are `DISK_TOKEN_BASE + n`: above every stream token (a
/// worker's slots stay below 2^22, see `config::STREAMS_MAX_LIMIT`) and below the timer and
/// wake tokens (which have the top bit set).
pub(crate) const DISK_TOKEN_BASE: u64 = 1 << 62;

/// The adaptive ceiling for a quantum and a factor, within the scheduler's limit.
fn adaptive_ceiling(quantum_bytes: u64, factor: u32) -> u64 {
    quantum_bytes
        .saturating_mul(u64::from(factor))
        .min(penstock_core::sched::drr::QUANTUM_BYTES_MAX)
        .max(quantum_bytes)
}

/// Whether `token` names a read the disk queue dispatched (see [`DiskQueue::translate`]).
pub(crate) fn is_disk_token(token: u64) -> bool {
    (DISK_TOKEN_BASE..2 * DISK_TOKEN_BASE).contains(&token)
}

/// A read a stream asks for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadReq {
    /// The stream's token; its completion comes back with it.
    pub token: u64,
    pub fd: RawFd,
    pub dev: u64,
    pub buf: BufId,
    /// Where in `buf` the bytes go.
    pub buf_offset: usize,
    pub len: usize,
    pub file_offset: u64,
    pub rw_flags: i32,
    pub class: ClassId,
    pub deadline: Option<Instant>,
}

struct Queued {
    req: ReadReq,
    cancelled: bool,
}

/// A worker's disk queue depth per class (reads queued in the scheduler plus in flight),
/// published by the worker after every change for [`crate::Engine::disk_queue_depth`].
#[derive(Debug)]
pub(crate) struct DiskDepth {
    /// Per class, in queue order (`rt`, `bulk`, the named ones).
    classes: Vec<AtomicU64>,
    /// Bytes read so far per class (completed requests), in the same order.
    served: Vec<AtomicU64>,
}

impl DiskDepth {
    pub(crate) fn new(classes: usize) -> DiskDepth {
        DiskDepth {
            classes: (0..classes.max(2)).map(|_| AtomicU64::new(0)).collect(),
            served: (0..classes.max(2)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Every class's bytes read so far, in queue order.
    pub(crate) fn served_per_class(&self) -> Vec<u64> {
        self.served
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }

    /// (rt, bulk).
    pub(crate) fn get(&self) -> (u64, u64) {
        (
            self.classes[0].load(Ordering::Relaxed),
            self.classes[1].load(Ordering::Relaxed),
        )
    }

    /// Every class's depth, in queue order.
    pub(crate) fn per_class(&self) -> Vec<u64> {
        self.classes
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }
}

pub(crate) struct DiskQueue {
    /// Where the depth is published.
    depth: Arc<DiskDepth>,
    sched: IoScheduler,
    devices: HashMap<u64, DeviceId>,
    /// Queued reads by request number.
    queued: HashMap<u64, Queued>,
    /// Dispatched reads: request number → the read (its stream's token in it).
    inflight: HashMap<u64, ReadReq>,
    /// Reads queued, not yet dispatched, per device (`ReadReq::dev`).
    queued_per_dev: HashMap<u64, u64>,
    /// The next request number.
    next_id: u64,
    rt: ClassId,
    bulk: ClassId,
    rt_ioprio: Option<u16>,
    queue_max: u32,
    /// Completions made up for reads cancelled before dispatch.
    synthetic: Vec<Completion>,
    /// [`DiskConfig::adaptive_quantum_factor`].
    adaptive_quantum_factor: Option<u32>,
}

impl DiskQueue {
    pub(crate) fn new(
        cfg: &DiskConfig,
        max_request_bytes: u64,
        queue_max: u32,
        depth: Arc<DiskDepth>,
    ) -> Result<DiskQueue, SchedError> {
        let named: Vec<(String, u64)> = cfg
            .named_classes
            .iter()
            .map(|(n, q)| (n.clone(), (*q).max(max_request_bytes)))
            .collect();
        let mut sc = SchedConfig::with_classes(
            cfg.rt_quantum_bytes.max(max_request_bytes),
            cfg.bulk_quantum_bytes.max(max_request_bytes),
            &named,
            max_request_bytes,
            cfg.disk_inflight_max,
        );
        sc.mode = cfg.mode;
        sc.devices = DEVICES_PER_WORKER;
        for c in &mut sc.classes {
            c.queue_max = queue_max.max(1);
        }
        if let Some(f) = cfg.adaptive_quantum_factor {
            sc.classes[0].quantum_max_bytes =
                Some(adaptive_ceiling(sc.classes[0].quantum_bytes, f));
        }
        let sched = IoScheduler::new(sc)?;
        let rt = sched.class("rt")?;
        let bulk = sched.class("bulk")?;
        let rt_ioprio = (cfg.rt_ioprio && rt_ioprio_permitted())
            .then(|| ioprio_value(IoprioClass::RealTime, 0));
        Ok(DiskQueue {
            depth,
            sched,
            devices: HashMap::new(),
            queued: HashMap::new(),
            inflight: HashMap::new(),
            queued_per_dev: HashMap::new(),
            next_id: 0,
            rt,
            bulk,
            rt_ioprio,
            queue_max: queue_max.max(1),
            synthetic: Vec::new(),
            adaptive_quantum_factor: cfg.adaptive_quantum_factor,
        })
    }

    /// Applies new settings: quanta from the next round formed on each device (deficits
    /// earned are kept), the in-flight bound from the next dispatch. `s` was checked by
    /// [`DiskSettings::tuned`] against the same largest read, so the scheduler takes it.
    pub(crate) fn tune(&mut self, s: &DiskSettings) -> Result<(), SchedError> {
        let old = (
            self.sched.quantum_bytes(self.rt)?,
            self.sched.quantum_bytes(self.bulk)?,
            self.sched.inflight_max(),
        );
        let old_named: Vec<(ClassId, u64)> = s
            .named_quanta
            .iter()
            .filter_map(|(n, _)| self.sched.class(n).ok())
            .filter_map(|c| Some((c, self.sched.quantum_bytes(c).ok()?)))
            .collect();
        // An adaptive ceiling moves with the rt quantum: lifted for the change, set after.
        let factor = self.adaptive_quantum_factor;
        if factor.is_some() {
            self.sched.set_quantum_max(self.rt, None)?;
        }
        let applied = self
            .sched
            .set_quantum(self.rt, s.rt_quantum_bytes)
            .and_then(|()| self.sched.set_quantum(self.bulk, s.bulk_quantum_bytes))
            .and_then(|()| self.sched.set_inflight_max(s.disk_inflight_max))
            .and_then(|()| {
                s.named_quanta.iter().try_for_each(|(n, q)| {
                    let c = self.sched.class(n)?;
                    self.sched.set_quantum(c, *q)
                })
            });
        if applied.is_err() {
            for (c, q) in old_named {
                let _ = self.sched.set_quantum(c, q);
            }
            // Put back what was set before the refusal (these values were accepted once).
            let _ = self.sched.set_quantum(self.rt, old.0);
            let _ = self.sched.set_quantum(self.bulk, old.1);
            let _ = self.sched.set_inflight_max(old.2);
        }
        if let Some(f) = factor {
            let q = self.sched.quantum_bytes(self.rt)?;
            self.sched
                .set_quantum_max(self.rt, Some(adaptive_ceiling(q, f)))?;
        }
        applied
    }

    /// Publishes the depth of each class (a relaxed store per class: cheap enough for every
    /// change; classes are few).
    fn publish_depth(&self) {
        for (i, (slot, served)) in self
            .depth
            .classes
            .iter()
            .zip(&self.depth.served)
            .enumerate()
        {
            let c = ClassId::from_index(i as u16);
            let (d, s) = self
                .sched
                .counters(c)
                .map_or((0, 0), |c| (c.queued + c.inflight, c.served_bytes));
            slot.store(d, Ordering::Relaxed);
            served.store(s, Ordering::Relaxed);
        }
    }

    /// Whether `class`'s queue can take `n` more reads (an empty queue takes any number: the
    /// pieces of one volume chunk may outnumber the bound, and must still go).
    pub(crate) fn has_room(&self, class: ClassId, n: usize) -> bool {
        self.sched.counters(class).is_ok_and(|c| {
            c.queued == 0 || c.queued.saturating_add(n as u64) <= u64::from(self.queue_max)
        })
    }

    /// Whether rt reads carry IOPRIO_CLASS_RT.
    pub(crate) fn rt_ioprio(&self) -> bool {
        self.rt_ioprio.is_some()
    }

    fn device(&mut self, dev: u64) -> DeviceId {
        let n = self.devices.len() as u32;
        *self
            .devices
            .entry(dev)
            .or_insert(DeviceId(n.min(DEVICES_PER_WORKER - 1)))
    }

    /// Queues a read. An error is backpressure (the class's queue is full): the caller keeps
    /// its buffer and asks again later.
    pub(crate) fn submit(&mut self, now: Instant, req: ReadReq) -> Result<(), SchedError> {
        let device = self.device(req.dev);
        let id = self.next_id;
        self.sched.submit(
            now,
            Request {
                id: RequestId(id),
                class: req.class,
                device,
                offset_bytes: req.file_offset,
                len_bytes: req.len as u64,
                deadline: req.deadline,
            },
        )?;
        self.next_id = (id + 1) % DISK_TOKEN_BASE;
        *self.queued_per_dev.entry(req.dev).or_insert(0) += 1;
        self.queued.insert(
            id,
            Queued {
                req,
                cancelled: false,
            },
        );
        self.publish_depth();
        Ok(())
    }

    /// Cancels every read whose stream token satisfies `pred`: queued ones are completed with
    /// ECANCELED without reaching the disk, dispatched ones are cancelled in the ring.
    pub(crate) fn cancel_where(&mut self, pred: impl Fn(u64) -> bool, ring: &mut Ring) {
        for q in self.queued.values_mut() {
            if pred(q.req.token) {
                q.cancelled = true;
            }
        }
        let mine: Vec<u64> = self
            .inflight
            .iter()
            .filter(|(_, r)| pred(r.token))
            .map(|(id, _)| DISK_TOKEN_BASE + id)
            .collect();
        if !mine.is_empty() {
            ring.cancel_where(|t| mine.contains(&t));
        }
    }

    /// Hands the ring every read the scheduler lets through now (as many as the ring takes).
    pub(crate) fn dispatch(&mut self, now: Instant, ring: &mut Ring) {
        while ring.ops_available() > 0
            && let Some(r) = self.sched.poll_dispatch(now)
        {
            let q = self
                .queued
                .remove(&r.id.0)
                .expect("a dispatched read was queued");
            if let Some(n) = self.queued_per_dev.get_mut(&q.req.dev) {
                *n = n.saturating_sub(1);
            }
            if q.cancelled {
                let _ = self.sched.complete(now, r.id);
                self.publish_depth();
                self.synthetic.push(Completion {
                    token: q.req.token,
                    result: -libc_ecanceled(),
                    notification: false,
                    more: false,
                });
                continue;
            }
            let ioprio = if r.class == self.rt {
                self.rt_ioprio.unwrap_or(0)
            } else {
                0
            };
            ring.read(
                q.req.fd,
                q.req.buf,
                q.req.buf_offset,
                q.req.len,
                q.req.file_offset,
                q.req.rw_flags,
                ioprio,
                DISK_TOKEN_BASE + r.id.0,
            )
            .expect("the ring had room for one more operation");
            self.inflight.insert(r.id.0, q.req);
        }
    }

    /// Reads on device `dev` queued or in flight in this worker's queue: how loaded it is
    /// (a mirrored volume reads each piece from the copy on the less loaded device).
    pub(crate) fn device_depth(&self, dev: u64) -> u64 {
        let queued = self.queued_per_dev.get(&dev).copied().unwrap_or(0);
        let inflight = self
            .devices
            .get(&dev)
            .and_then(|d| self.sched.inflight(*d).ok())
            .map_or(0, u64::from);
        queued + inflight
    }

    /// Translates a completion of a dispatched read back to its stream's token and frees the
    /// read's device slot; any other completion is returned as it is. A read that failed
    /// (an error other than ECANCELED) or came back short is returned too, so that a
    /// mirrored volume's stream can read those bytes from the other copy.
    pub(crate) fn translate(
        &mut self,
        now: Instant,
        c: Completion,
    ) -> (Completion, Option<ReadReq>) {
        if !is_disk_token(c.token) {
            return (c, None);
        }
        let id = c.token - DISK_TOKEN_BASE;
        let Some(req) = self.inflight.remove(&id) else {
            return (c, None);
        };
        let _ = self.sched.complete(now, RequestId(id));
        self.publish_depth();
        let failed = (c.result != -libc_ecanceled()
            && (c.result < 0 || (c.result as usize) < req.len))
            .then_some(req);
        (
            Completion {
                token: req.token,
                ..c
            },
            failed,
        )
    }

    /// Completions of reads cancelled before they reached the disk.
    pub(crate) fn take_synthetic(&mut self, out: &mut Vec<Completion>) {
        out.append(&mut self.synthetic);
    }
}

fn libc_ecanceled() -> i32 {
    rustix::io::Errno::CANCELED.raw_os_error()
}

/// Whether this thread may use IOPRIO_CLASS_RT (CAP_SYS_ADMIN, or CAP_SYS_NICE on newer
/// kernels): try it on the thread, then restore best-effort.
fn rt_ioprio_permitted() -> bool {
    let ok = penstock_uring::sys::ioprio_set_current_thread(ioprio_value(IoprioClass::RealTime, 0))
        .is_ok();
    let _ =
        penstock_uring::sys::ioprio_set_current_thread(ioprio_value(IoprioClass::BestEffort, 4));
    ok
}
