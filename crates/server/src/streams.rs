//! The control protocol's stream table: Cues' control descriptors.
//!
//! A stream is created by `OPEN` (admission decides; nothing is opened yet), edited while it
//! is pending or paused (`SEEK`, `UNIT`, `LENGTH`, `RATE`, `SCHEDULE`), started by `START`
//! (the endpoints are opened on the caller's thread — a `tcp-listen` target waits for its
//! peer there — and kept for the stream's life), paused and resumed, and closed.
//!
//! # Pause and resume
//! `PAUSE` is the engine's own: [`StreamHandle::pause`] keeps the engine stream, its
//! descriptors and its schedule; the reply waits (at most [`PAUSE_ACK_WAIT`]) until the
//! worker has taken the pause, after which it issues no new I/O. On the readiness paths
//! (sendfile, splice, copy) nothing moves after that, so the offset in the reply is exact; on
//! the uring path the sends already in the ring (at most the stream's read-ahead depth of
//! units) still complete and `STATE` counts them. `RESUME` is [`StreamHandle::resume`]: a
//! paced stream's later deadlines move by the length of the pause (no burst to catch up).
//!
//! An edit while paused (`SEEK`, `UNIT`, `LENGTH`, `RATE`, `SCHEDULE`) cannot be applied to
//! the running engine stream: the first edit stops it ([`suspend`]: cancel, wait for the
//! report, fold the bytes sent into the offset) and `RESUME` then starts a new engine stream
//! at the (edited) offset with [`run`], on `dup`s of the *same* endpoint descriptors, so a TCP
//! receiver still sees one connection and one byte sequence. A restarted paced stream's
//! schedule starts anew at the resume.
//!
//! RATE and SCHEDULE become the engine stream's schedule (`STATE` says `paced=yes`): units
//! go out at their deadlines on the engine's EDF dispatcher.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use penstock_core::admission::{Admission, QosClass, Refusal, Resource, StreamQos};
use penstock_core::control::{
    Class, DataPath as CtlPath, KtSchedule, OpenSpec, Reply, ReplyCode, StreamId, StreamSelector,
};
use penstock_core::endpoint::{Endpoint, Role};
use penstock_core::schedule::{Schedule, ScheduleLimits, ScheduleSpec};
use penstock_core::stream::{DataPath, Extent, PathChoice};
use penstock_core::units::Rate;
use penstock_driver::open::{Opened, open_source, open_target};
use penstock_driver::{
    Engine, LatenessCounts, StreamError, StreamHandle, StreamReport, StreamSpec,
};

use crate::metrics::{Metrics, PoolLabel, ResourceLabel};

/// Who is asking: a control connection.
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    pub conn: u64,
    /// Sent the server's token: may drive any stream.
    pub authed: bool,
}

struct Ends {
    source: Opened,
    target: Opened,
}

enum Run {
    Pending,
    Running {
        handle: StreamHandle,
        ends: Ends,
    },
    /// Paused in the engine (`handle`: the stream and its schedule are kept), or stopped by
    /// an edit (`None`: its bytes are folded into the offset; RESUME restarts it there).
    Paused {
        handle: Option<StreamHandle>,
        ends: Ends,
    },
    Done,
    Failed(String),
}

/// How long `PAUSE` waits for the worker to take the pause before it answers anyway (the
/// pause still takes effect; the reply's offset may then be a little short).
pub const PAUSE_ACK_WAIT: Duration = Duration::from_secs(2);

struct Entry {
    id: StreamId,
    owner: u64,
    detached: bool,
    src: Endpoint,
    dst: Endpoint,
    class: Class,
    /// Where the next transfer starts in the source.
    offset_bytes: u64,
    /// Bytes still to transfer; `None`: to the end of the source.
    remaining_bytes: Option<u64>,
    unit_bytes: Option<u64>,
    rate: Option<Rate>,
    schedule: Option<KtSchedule>,
    buffers: Option<u32>,
    path: CtlPath,
    /// Bytes that reached the target in earlier engine streams (before restarts).
    sent_before_bytes: u64,
    /// The current engine stream's lateness counts already added to the metrics.
    lateness_seen: LatenessCounts,
    reservation: Option<penstock_core::admission::ReservationId>,
    run: Run,
}

impl Entry {
    /// The engine stream of a running or engine-paused entry.
    fn handle(&self) -> Option<&StreamHandle> {
        match &self.run {
            Run::Running { handle, .. } => Some(handle),
            Run::Paused { handle, .. } => handle.as_ref(),
            _ => None,
        }
    }

    /// Bytes the current engine stream has sent (not yet folded into the offset).
    fn engine_sent_bytes(&self) -> u64 {
        self.handle().map_or(0, |h| h.counters().bytes_sent)
    }

    fn sent_bytes(&self) -> u64 {
        self.sent_before_bytes + self.engine_sent_bytes()
    }

    /// Adds the current engine stream's new lateness counts to the metrics.
    fn feed_lateness(&mut self, metrics: &Metrics) {
        if let Some(now) = self.handle().map(StreamHandle::lateness) {
            metrics.add_lateness(&now, &mut self.lateness_seen);
        }
    }

    fn state_name(&self) -> &'static str {
        match self.run {
            Run::Pending => "pending",
            Run::Running { .. } => "running",
            Run::Paused { .. } => "paused",
            Run::Done => "done",
            Run::Failed(_) => "failed",
        }
    }

    fn state_line(&self) -> String {
        let running_sent = self.engine_sent_bytes();
        let mut s = format!(
            "{} {} offset={} sent={} class={}",
            self.id,
            self.state_name(),
            self.offset_bytes + running_sent,
            self.sent_bytes(),
            self.class
        );
        if let Some(r) = self.remaining_bytes {
            s.push_str(&format!(" remaining={}", r.saturating_sub(running_sent)));
        }
        if let Some(u) = self.unit_bytes {
            s.push_str(&format!(" unit={u}"));
        }
        if self.rate.is_some() || self.schedule.is_some() {
            s.push_str(" paced=yes");
        }
        if self.detached {
            s.push_str(" detached");
        }
        if let Run::Failed(e) = &self.run {
            s.push_str(&format!(" error={}", e.replace(' ', "_")));
        }
        s
    }
}

/// The table, shared by every control connection.
pub struct Streams {
    engine: Arc<Engine>,
    admission: Mutex<Admission>,
    table: Mutex<HashMap<u64, Arc<Mutex<Entry>>>>,
    next_id: AtomicU64,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Streams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Streams")
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn engine_path(p: CtlPath) -> PathChoice {
    match p {
        CtlPath::Auto => PathChoice::Auto,
        CtlPath::Copy => PathChoice::Fixed(DataPath::Copy),
        CtlPath::Sendfile => PathChoice::Fixed(DataPath::Sendfile),
        CtlPath::Splice => PathChoice::Fixed(DataPath::Splice),
        CtlPath::Uring => PathChoice::Fixed(DataPath::Uring),
    }
}

fn dup(o: &Opened) -> std::io::Result<Opened> {
    Ok(Opened {
        fd: o.fd.as_fd().try_clone_to_owned()?,
        kind: o.kind,
        size: o.size,
        socket: o.socket,
        label: o.label.clone(),
        volume: None,
    })
}

/// Starts (or restarts, after an edit while paused) the engine stream of `e` on dups of its
/// endpoints, at its offset.
fn run(engine: &Engine, e: &mut Entry, ends: &Ends) -> Result<StreamHandle, String> {
    e.lateness_seen = LatenessCounts::default();
    let mut spec = StreamSpec::new(e.src.clone(), e.dst.clone());
    spec.extent = Extent {
        offset: e.offset_bytes,
        length: e.remaining_bytes,
    };
    spec.unit_bytes = e
        .unit_bytes
        .map_or(0, |u| usize::try_from(u).unwrap_or(usize::MAX));
    spec.path = engine_path(e.path);
    spec.schedule = schedule_of(engine, e)?;
    let source = dup(&ends.source).map_err(|x| x.to_string())?;
    let target = dup(&ends.target).map_err(|x| x.to_string())?;
    engine
        .open_opened(spec, source, target)
        .map_err(|x| x.to_string())
}

/// The engine schedule for an entry's RATE or SCHEDULE (units default to 1316 bytes: seven
/// MPEG-TS packets); `None` for a burst stream. Checked against the engine's buffer size.
fn schedule_of(engine: &Engine, e: &Entry) -> Result<Option<Schedule>, String> {
    let unit_bytes = e.unit_bytes.unwrap_or(1316);
    let spec = match (&e.rate, &e.schedule) {
        (None, None) => return Ok(None),
        (Some(rate), _) => ScheduleSpec::Rate {
            rate: *rate,
            unit_bytes,
        },
        (None, Some(kt)) => ScheduleSpec::Kt {
            cycle_units: u64::from(kt.blocks),
            cycle: kt.delay,
            unit_bytes,
        },
    };
    let limits = ScheduleLimits::new(engine.config().buffer_bytes as u64);
    Schedule::new(&spec, &limits)
        .map(Some)
        .map_err(|x| x.to_string())
}

/// Stops the engine stream of a paused entry and folds what it sent into the entry's offset
/// (before an edit).
fn suspend(e: &mut Entry, handle: StreamHandle, metrics: &Metrics) -> Result<(), String> {
    handle.cancel();
    // The report comes only after every in-flight operation completed, so the counters read
    // then are final. (The `Cancelled` error's own count is taken when the cancel is seen,
    // before in-flight sends complete: on the uring path it can be short by a unit.)
    let outcome = loop {
        if let Some(r) = handle.wait_timeout(Duration::from_secs(3600)) {
            break r;
        }
    };
    let counted = handle.counters().bytes_sent;
    metrics.add_lateness(&handle.lateness(), &mut e.lateness_seen);
    let sent = match outcome {
        Ok(report) => report.bytes.max(counted),
        Err(penstock_driver::StreamError::Cancelled { .. }) => counted,
        Err(other) => return Err(other.to_string()),
    };
    e.offset_bytes += sent;
    e.sent_before_bytes += sent;
    if let Some(r) = &mut e.remaining_bytes {
        *r = r.saturating_sub(sent);
    }
    Ok(())
}

impl Streams {
    pub fn new(engine: Arc<Engine>, admission: Admission, metrics: Arc<Metrics>) -> Streams {
        let total = admission.rt_capacity().buffers;
        metrics
            .buffer_pool
            .get_or_create(&PoolLabel {
                state: "total".into(),
            })
            .set(i64::from(total));
        Streams {
            engine,
            admission: Mutex::new(admission),
            table: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            metrics,
        }
    }

    fn update_pool_metric(&self, adm: &Admission) {
        self.metrics
            .buffer_pool
            .get_or_create(&PoolLabel {
                state: "reserved".into(),
            })
            .set(i64::from(adm.usage().buffers));
    }

    fn qos(
        spec_class: &Class,
        rate: Option<Rate>,
        unit: Option<u64>,
        buffers: Option<u32>,
    ) -> Result<StreamQos, Reply> {
        match spec_class {
            Class::Rt => {
                let Some(rate) = rate else {
                    return Err(Reply::new(
                        ReplyCode::BAD_SYNTAX,
                        "class=rt needs rate= (and unit= for a rate in units per second)",
                    ));
                };
                let unit_bytes = unit.unwrap_or(1 << 20);
                let (num, den) = rate.bytes_per_second(unit_bytes);
                let rate_bytes_per_s = u64::try_from(num.div_ceil(den.max(1))).unwrap_or(u64::MAX);
                Ok(StreamQos {
                    class: QosClass::Rt,
                    rate_bytes_per_s,
                    unit_bytes,
                    buffers: buffers.unwrap_or(2),
                })
            }
            _ => Ok(StreamQos {
                class: QosClass::Bulk,
                rate_bytes_per_s: 0,
                unit_bytes: unit.unwrap_or(0),
                buffers: 0,
            }),
        }
    }

    fn refusal_reply(&self, r: Refusal) -> Reply {
        let resources: Vec<&str> = match &r {
            Refusal::Short { shortages } | Refusal::NeverFits { shortages } => shortages
                .iter()
                .map(|s| match s.resource {
                    Resource::Disk => "disk",
                    Resource::Network => "network",
                    Resource::Buffers => "buffers",
                })
                .collect(),
            Refusal::StreamsMax { .. } => vec!["streams"],
            Refusal::InvalidQos { reason } => {
                return Reply::new(ReplyCode::BAD_SYNTAX, format!("invalid QoS: {reason}"));
            }
            _ => vec!["other"],
        };
        for res in resources {
            self.metrics
                .admission_refusals
                .get_or_create(&ResourceLabel {
                    resource: res.into(),
                })
                .inc();
        }
        // Refusal's text starts with "refused".
        Reply::new(ReplyCode::REFUSED, r.to_string())
    }

    /// `OPEN`: admission, then a pending stream.
    pub fn open(&self, caller: Caller, spec: &OpenSpec) -> Reply {
        let src = match Endpoint::parse(&spec.src, Role::Source) {
            Ok(e) => e,
            Err(e) => return Reply::new(ReplyCode::BAD_SYNTAX, format!("source: {e}")),
        };
        let dst = match Endpoint::parse(&spec.dst, Role::Target) {
            Ok(e) => e,
            Err(e) => return Reply::new(ReplyCode::BAD_SYNTAX, format!("target: {e}")),
        };
        if spec.path == Some(CtlPath::Uring) && self.engine.info().uring.is_err() {
            return Reply::new(
                ReplyCode::NOT_IMPLEMENTED,
                "path=uring: io_uring is not available here",
            );
        }
        let class = spec.class.clone().unwrap_or(Class::Bulk);
        let qos = match Self::qos(&class, spec.rate, spec.unit_bytes, spec.buffers) {
            Ok(q) => q,
            Err(r) => return r,
        };
        let reservation = {
            let mut adm = lock(&self.admission);
            let r = adm.admit(qos);
            self.update_pool_metric(&adm);
            match r {
                Ok(r) => r,
                Err(refusal) => return self.refusal_reply(refusal),
            }
        };
        let id = StreamId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let details = format!(
            "class={class}{}",
            if qos.class == QosClass::Rt {
                format!(
                    " rate={}B/s unit={} buffers={}",
                    qos.rate_bytes_per_s, qos.unit_bytes, qos.buffers
                )
            } else {
                String::new()
            }
        );
        let entry = Entry {
            id,
            owner: caller.conn,
            detached: spec.detached,
            src,
            dst,
            class,
            offset_bytes: spec.offset_bytes.unwrap_or(0),
            remaining_bytes: spec.length_bytes,
            unit_bytes: spec.unit_bytes,
            rate: spec.rate,
            schedule: spec.schedule,
            buffers: spec.buffers,
            path: spec.path.unwrap_or(CtlPath::Auto),
            sent_before_bytes: 0,
            lateness_seen: LatenessCounts::default(),
            reservation: Some(reservation.id),
            run: Run::Pending,
        };
        lock(&self.table).insert(id.0, Arc::new(Mutex::new(entry)));
        Reply::opened(id, &details)
    }

    /// The entry if it exists and `caller` may drive it; otherwise the reply (404, 401).
    fn get(&self, caller: Caller, id: StreamId) -> Result<Arc<Mutex<Entry>>, Reply> {
        let e = lock(&self.table)
            .get(&id.0)
            .cloned()
            .ok_or_else(|| Reply::new(ReplyCode::NO_SUCH_STREAM, format!("no stream {id}")))?;
        let owner = lock(&e).owner;
        if owner != caller.conn && !caller.authed {
            return Err(Reply::new(
                ReplyCode::AUTH_REQUIRED,
                format!("stream {id} belongs to another connection: AUTH <token> first"),
            ));
        }
        Ok(e)
    }

    /// `SEEK`, `UNIT`, `LENGTH`, `RATE`, `SCHEDULE`: edits of a pending or paused stream.
    pub fn edit(&self, caller: Caller, id: StreamId, f: Edit) -> Reply {
        let e = match self.get(caller, id) {
            Ok(e) => e,
            Err(r) => return r,
        };
        let mut e = lock(&e);
        if !matches!(e.run, Run::Pending | Run::Paused { .. }) {
            return Reply::new(
                ReplyCode::WRONG_STATE,
                format!("stream {id} is {}: PAUSE it first", e.state_name()),
            );
        }
        if let Err(r) = self.stop_paused(&mut e) {
            return r;
        }
        let (mut rate, mut unit) = (e.rate, e.unit_bytes);
        match f {
            Edit::Seek(n) => e.offset_bytes = n,
            Edit::Length(n) => e.remaining_bytes = Some(n),
            Edit::Schedule(s) => e.schedule = Some(s),
            Edit::Unit(n) => unit = Some(n),
            Edit::Rate(r) => rate = Some(r),
        }
        if (rate, unit) != (e.rate, e.unit_bytes) && e.class == Class::Rt {
            // Re-admit at the new rate; on refusal, put the old reservation back (it fitted
            // before and nothing else changed under the lock).
            let qos = match Self::qos(&e.class, rate, unit, e.buffers) {
                Ok(q) => q,
                Err(r) => return r,
            };
            let mut adm = lock(&self.admission);
            let old = e.reservation.and_then(|r| adm.release(r));
            match adm.admit(qos) {
                Ok(r) => e.reservation = Some(r.id),
                Err(refusal) => {
                    if let Some(old) = old {
                        e.reservation = adm.admit(old.qos).ok().map(|r| r.id);
                    }
                    self.update_pool_metric(&adm);
                    return self.refusal_reply(refusal);
                }
            }
            self.update_pool_metric(&adm);
        }
        e.rate = rate;
        e.unit_bytes = unit;
        Reply::ok("OK")
    }

    /// `START` a pending stream: open its endpoints and hand it to the engine.
    pub fn start(&self, caller: Caller, id: StreamId) -> Reply {
        let e = match self.get(caller, id) {
            Ok(e) => e,
            Err(r) => return r,
        };
        let mut e = lock(&e);
        if !matches!(e.run, Run::Pending) {
            return Reply::new(
                ReplyCode::WRONG_STATE,
                format!("stream {id} is {}, not pending", e.state_name()),
            );
        }
        let ends = match open_source(&e.src, &mut |_| {}).and_then(|source| {
            Ok(Ends {
                source,
                target: open_target(&e.dst, &mut |_| {})?,
            })
        }) {
            Ok(x) => x,
            Err(err) => return Reply::new(ReplyCode::INTERNAL_ERROR, err.to_string()),
        };
        match run(&self.engine, &mut e, &ends) {
            Ok(handle) => {
                self.metrics.streams_active.inc();
                e.run = Run::Running { handle, ends };
                Reply::ok("started")
            }
            Err(err) => Reply::new(ReplyCode::INTERNAL_ERROR, err),
        }
    }

    pub fn pause(&self, caller: Caller, id: StreamId) -> Reply {
        let e = match self.get(caller, id) {
            Ok(e) => e,
            Err(r) => return r,
        };
        let mut e = lock(&e);
        match std::mem::replace(&mut e.run, Run::Pending) {
            Run::Running { handle, ends } => {
                self.metrics.streams_active.dec();
                handle.pause();
                let asked = std::time::Instant::now();
                while !handle.is_paused() && asked.elapsed() < PAUSE_ACK_WAIT {
                    // A stream that ended before the worker took the pause is done.
                    if let Some(result) = handle.wait_timeout(Duration::from_millis(1)) {
                        e.run = Run::Paused {
                            handle: Some(handle),
                            ends,
                        };
                        self.finished(&mut e, result);
                        return Reply::new(
                            ReplyCode::WRONG_STATE,
                            format!("stream {id} is {}, not running", e.state_name()),
                        );
                    }
                }
                let offset = e.offset_bytes + handle.counters().bytes_sent;
                e.run = Run::Paused {
                    handle: Some(handle),
                    ends,
                };
                Reply::ok(format!("paused at offset {offset}"))
            }
            other => {
                e.run = other;
                Reply::new(
                    ReplyCode::WRONG_STATE,
                    format!("stream {id} is {}, not running", e.state_name()),
                )
            }
        }
    }

    pub fn resume(&self, caller: Caller, id: StreamId) -> Reply {
        let e = match self.get(caller, id) {
            Ok(e) => e,
            Err(r) => return r,
        };
        let mut e = lock(&e);
        match std::mem::replace(&mut e.run, Run::Pending) {
            Run::Paused {
                handle: Some(handle),
                ends,
            } => {
                handle.resume();
                self.metrics.streams_active.inc();
                e.run = Run::Running { handle, ends };
                Reply::ok("resumed")
            }
            Run::Paused { handle: None, ends } => match run(&self.engine, &mut e, &ends) {
                Ok(handle) => {
                    self.metrics.streams_active.inc();
                    e.run = Run::Running { handle, ends };
                    Reply::ok("resumed")
                }
                Err(err) => {
                    e.run = Run::Failed(err.clone());
                    Reply::new(ReplyCode::INTERNAL_ERROR, err)
                }
            },
            other => {
                e.run = other;
                Reply::new(
                    ReplyCode::WRONG_STATE,
                    format!("stream {id} is {}, not paused", e.state_name()),
                )
            }
        }
    }

    /// `CLOSE`: stops the stream (in-flight I/O completes first unless `now`), releases its
    /// reservation and forgets it.
    pub fn close(&self, caller: Caller, id: StreamId, now: bool) -> Reply {
        if let Err(r) = self.get(caller, id) {
            return r;
        }
        let Some(e) = lock(&self.table).remove(&id.0) else {
            return Reply::new(ReplyCode::NO_SUCH_STREAM, format!("no stream {id}"));
        };
        let sent = self.finish_entry(&e, now);
        Reply::ok(format!("closed {id} sent={sent}"))
    }

    fn finish_entry(&self, e: &Mutex<Entry>, now: bool) -> u64 {
        let mut e = lock(e);
        let handle = match std::mem::replace(&mut e.run, Run::Done) {
            Run::Running { handle, .. } => {
                self.metrics.streams_active.dec();
                Some(handle)
            }
            Run::Paused { handle, .. } => handle,
            _ => None,
        };
        if let Some(handle) = handle {
            handle.cancel();
            if now {
                // The engine finishes the in-flight operations on its own; the handle's
                // drop does not wait for them.
                e.sent_before_bytes += handle.counters().bytes_sent;
            } else {
                // As in `suspend`: the counters are final once the report is in.
                while handle.wait_timeout(Duration::from_secs(3600)).is_none() {}
                e.sent_before_bytes += handle.counters().bytes_sent;
            }
            self.metrics
                .add_lateness(&handle.lateness(), &mut e.lateness_seen);
        }
        if let Some(r) = e.reservation.take() {
            let mut adm = lock(&self.admission);
            adm.release(r);
            self.update_pool_metric(&adm);
        }
        e.sent_bytes()
    }

    /// `STATE`: one line per selected stream.
    pub fn state(&self, caller: Caller, sel: &StreamSelector) -> Reply {
        let lines: Vec<String> = match sel {
            StreamSelector::All => {
                let mut all: Vec<(u64, Arc<Mutex<Entry>>)> = lock(&self.table)
                    .iter()
                    .map(|(k, v)| (*k, v.clone()))
                    .collect();
                all.sort_by_key(|(k, _)| *k);
                all.into_iter()
                    .filter_map(|(_, e)| {
                        let e = lock(&e);
                        (e.owner == caller.conn || caller.authed).then(|| e.state_line())
                    })
                    .collect()
            }
            StreamSelector::Ids(ids) => ids
                .iter()
                .map(|id| match self.get(caller, *id) {
                    Ok(e) => lock(&e).state_line(),
                    Err(r) if r.code == ReplyCode::AUTH_REQUIRED => format!("{id} forbidden"),
                    Err(_) => format!("{id} unknown"),
                })
                .collect(),
        };
        let n = lines.len();
        Reply::multi(ReplyCode::STATE, lines, format!("end {n}"))
    }

    /// `STATS` lines (the control server adds its own).
    pub fn stats_lines(&self) -> Vec<String> {
        let entries: Vec<Arc<Mutex<Entry>>> = lock(&self.table).values().cloned().collect();
        let mut counts = [0usize; 5];
        for e in &entries {
            let i = match lock(e).run {
                Run::Pending => 0,
                Run::Running { .. } => 1,
                Run::Paused { .. } => 2,
                Run::Done => 3,
                Run::Failed(_) => 4,
            };
            counts[i] += 1;
        }
        let adm = lock(&self.admission);
        let u = adm.usage();
        let cap = adm.rt_capacity();
        vec![
            format!("streams {}", entries.len()),
            format!("streams_pending {}", counts[0]),
            format!("streams_running {}", counts[1]),
            format!("streams_paused {}", counts[2]),
            format!("streams_done {}", counts[3]),
            format!("streams_failed {}", counts[4]),
            format!("admitted {}", u.streams),
            format!(
                "rt_disk_ns_per_s {} of {}",
                u.disk_ns_per_s, cap.disk_ns_per_s
            ),
            format!(
                "rt_net_bytes_per_s {} of {}",
                u.net_bytes_per_s, cap.net_bytes_per_s
            ),
            format!("rt_buffers {} of {}", u.buffers, cap.buffers),
        ]
    }

    /// A control connection ended: its streams not opened `DETACHED` are closed (at once).
    pub fn connection_closed(&self, conn: u64) {
        let mine: Vec<Arc<Mutex<Entry>>> = {
            let mut t = lock(&self.table);
            let ids: Vec<u64> = t
                .iter()
                .filter(|(_, e)| {
                    let e = lock(e);
                    e.owner == conn && !e.detached
                })
                .map(|(k, _)| *k)
                .collect();
            ids.iter().filter_map(|k| t.remove(k)).collect()
        };
        for e in mine {
            self.finish_entry(&e, true);
        }
    }

    /// No stream is open (the reaper then polls less often).
    pub fn is_empty(&self) -> bool {
        lock(&self.table).is_empty()
    }

    /// Moves finished engine streams to `done`/`failed` and closes their endpoints (so a
    /// receiver sees EOF). Called by the control server's reaper every few milliseconds.
    pub fn reap(&self) {
        let entries: Vec<Arc<Mutex<Entry>>> = lock(&self.table).values().cloned().collect();
        for e in entries {
            let Ok(mut e) = e.try_lock() else { continue };
            e.feed_lateness(&self.metrics);
            let result = e.handle().and_then(|h| h.wait_timeout(Duration::ZERO));
            if let Some(result) = result {
                self.finished(&mut e, result);
            }
        }
    }

    /// The engine stream of a running or engine-paused entry reported `result`: the entry is
    /// done or failed.
    fn finished(&self, e: &mut Entry, result: Result<StreamReport, StreamError>) {
        e.feed_lateness(&self.metrics);
        if matches!(e.run, Run::Running { .. }) {
            self.metrics.streams_active.dec();
        }
        // The report's count is final; the counters agree once it is in.
        let sent = e.engine_sent_bytes();
        e.run = match result {
            Ok(report) => {
                let sent = report.bytes.max(sent);
                e.sent_before_bytes += sent;
                e.offset_bytes += sent;
                if let Some(r) = &mut e.remaining_bytes {
                    *r = r.saturating_sub(sent);
                }
                Run::Done
            }
            Err(err) => {
                e.sent_before_bytes += sent;
                Run::Failed(err.to_string())
            }
        };
    }

    /// Before an edit of a stream paused in the engine: stops its engine stream and folds
    /// what it sent into the offset (RESUME restarts it there with the edits).
    fn stop_paused(&self, e: &mut Entry) -> Result<(), Reply> {
        let Run::Paused { handle, ends } = std::mem::replace(&mut e.run, Run::Pending) else {
            return Ok(());
        };
        let Some(handle) = handle else {
            e.run = Run::Paused { handle: None, ends };
            return Ok(());
        };
        match suspend(e, handle, &self.metrics) {
            Ok(()) => {
                // Even with nothing left at the old position it stays paused: the edit (a
                // SEEK, a LENGTH) may give it more to send.
                e.run = Run::Paused { handle: None, ends };
                Ok(())
            }
            Err(err) => {
                e.run = Run::Failed(err.clone());
                Err(Reply::new(ReplyCode::INTERNAL_ERROR, err))
            }
        }
    }

    /// Cancels every running stream (shutdown) and waits for each at most `deadline` in total.
    pub fn shutdown(&self, deadline: Duration) {
        let start = std::time::Instant::now();
        let entries: Vec<Arc<Mutex<Entry>>> = lock(&self.table).drain().map(|(_, v)| v).collect();
        for e in entries {
            let mut e = lock(&e);
            let handle = match std::mem::replace(&mut e.run, Run::Done) {
                Run::Running { handle, .. } => Some(handle),
                Run::Paused { handle, .. } => handle,
                _ => None,
            };
            if let Some(handle) = handle {
                handle.cancel();
                let left = deadline.saturating_sub(start.elapsed());
                let _ = handle.wait_timeout(left);
            }
        }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }
}

/// An edit of a pending or paused stream.
#[derive(Debug, Clone, Copy)]
pub enum Edit {
    Seek(u64),
    Unit(u64),
    Length(u64),
    Rate(Rate),
    Schedule(KtSchedule),
}
