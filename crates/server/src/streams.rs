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
//!
//! # Who may do what, and for how long (docs/security.md)
//! Every caller has an [`Identity`]: the token (may drive any stream), an allowed Unix peer
//! (its own connection's streams), or none (nothing but `HELP`, `QUIT`, `AUTH`; the control
//! server refuses the rest before it reaches the table). Endpoints are checked by
//! [`Access`] at `OPEN`, before admission. A connection and an identity hold at most
//! `streams_per_connection_max` and `streams_per_identity_max` streams; a stream not started
//! within `pending_timeout_ms` is closed, and a finished one gives its reservation back at once
//! and is forgotten `pending_timeout_ms` later.
//!
//! # Streams opened in process (the C library)
//! The table also serves `libpenstock` (crates/libpenstock): its `penstock_cue()` descriptor
//! is a control connection served by [`crate::control::serve_stream_descriptor`], and its
//! typed calls ([`Streams::status`], [`Streams::wait`], [`Streams::cancel`]) read and drive the
//! same entries. Such an `OPEN` may bring endpoints its caller opened already ([`Given`]: the
//! library's `fd:N` descriptors, duplicated when the call is made), used at `START` in place
//! of opening a name; and a stream held by a C handle does not expire (its handle closes it).
//!
//! No command blocks the table: the table's lock and an entry's lock are held only for
//! bookkeeping. `START` marks the entry `starting` and opens the endpoints with no lock held
//! (a connect is bounded by `connect_timeout_ms`); a listening endpoint is bound, the reply
//! says where, and a waiter thread accepts its peer within `accept_timeout_ms` (the entry is
//! `waiting` meanwhile; `CLOSE` or shutdown stop the wait).

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use penstock_core::admission::{Refusal, StreamQos, Usage};
use penstock_core::control::{
    Class, DataPath as CtlPath, DiskTune, KtSchedule, OpenSpec, Reply, ReplyCode, StartTime,
    StreamId, StreamSelector,
};
use penstock_core::endpoint::{Endpoint, Role};
use penstock_core::schedule::{LatePolicy, Schedule};
use penstock_core::stream::plan::{Pacing, PlanError};
use penstock_core::stream::{DataPath, Extent, PathChoice};
use penstock_core::units::Rate;
use penstock_driver::open::Opened;
use penstock_driver::{
    Admitted, CounterSnapshot, DiskClass, DiskSettings, DiskTuning, Engine, LatenessCounts,
    StreamError, StreamHandle, StreamReport, StreamSpec,
};

use crate::access::{Access, Denied, Prepared};

/// What the table needs of the world: endpoint policy and opening, and an engine to run
/// streams. [`EngineBackend`] is the real one; tests and the session fuzz target
/// (`fuzz/fuzz_targets/control_session.rs`) use a fake.
pub trait Backend: Send + Sync {
    /// Whether a client may name `ep` in this role (at `OPEN`).
    fn check(&self, ep: &Endpoint, role: Role) -> Result<(), Denied>;
    /// Opens `ep` as far as it opens without a peer (at `START`).
    fn prepare(&self, ep: &Endpoint, role: Role, truncate: bool) -> Result<Prepared, Denied>;
    /// Asks the engine's admission control now for what `spec` will ask at its start: the
    /// ticket holds the reservation (given back when dropped) and what was reserved.
    /// `datagram`: the target is a UDP socket (a paced stream's default unit depends on it).
    fn admit(
        &self,
        spec: &StreamSpec,
        datagram: bool,
    ) -> Result<Option<(Ticket, StreamQos)>, StreamError>;
    /// Starts a stream between opened endpoints, with the ticket `admit` gave.
    fn start(
        &self,
        spec: StreamSpec,
        source: Opened,
        target: Opened,
        ticket: Option<Ticket>,
    ) -> Result<Box<dyn RunningStream>, StreamError>;
    /// Admission's reservations now, and the rt capacity they are taken from.
    fn admission_usage(&self) -> (Usage, Usage);
    /// Reserved time per device and the figures charged on it (none known: empty).
    fn disk_usage(&self) -> Vec<penstock_core::admission::DeviceUsage> {
        Vec::new()
    }
    /// The largest unit a paced stream may have.
    fn buffer_bytes(&self) -> usize;
    /// Whether `path=uring` can be honoured.
    fn uring_available(&self) -> bool;
    /// The engine's disk scheduler settings in force.
    fn disk_settings(&self) -> DiskSettings;
    /// Changes them (`TUNE disk`), checked whole: on error nothing changed.
    fn tune_disk(&self, t: &DiskTuning) -> Result<DiskSettings, String>;
    /// The engine's disk classes in queue order (`rt`, `bulk`, `[disk.classes.NAME]`'s).
    fn disk_classes(&self) -> Vec<String> {
        vec!["rt".into(), "bulk".into()]
    }
}

/// An admission reservation held for a stream not started yet (opaque to the table).
pub type Ticket = Box<dyn std::any::Any + Send>;

impl<T: Backend + ?Sized> Backend for Arc<T> {
    fn check(&self, ep: &Endpoint, role: Role) -> Result<(), Denied> {
        (**self).check(ep, role)
    }
    fn prepare(&self, ep: &Endpoint, role: Role, truncate: bool) -> Result<Prepared, Denied> {
        (**self).prepare(ep, role, truncate)
    }
    fn admit(
        &self,
        spec: &StreamSpec,
        datagram: bool,
    ) -> Result<Option<(Ticket, StreamQos)>, StreamError> {
        (**self).admit(spec, datagram)
    }
    fn start(
        &self,
        spec: StreamSpec,
        source: Opened,
        target: Opened,
        ticket: Option<Ticket>,
    ) -> Result<Box<dyn RunningStream>, StreamError> {
        (**self).start(spec, source, target, ticket)
    }
    fn admission_usage(&self) -> (Usage, Usage) {
        (**self).admission_usage()
    }
    fn disk_usage(&self) -> Vec<penstock_core::admission::DeviceUsage> {
        (**self).disk_usage()
    }
    fn buffer_bytes(&self) -> usize {
        (**self).buffer_bytes()
    }
    fn uring_available(&self) -> bool {
        (**self).uring_available()
    }
    fn disk_settings(&self) -> DiskSettings {
        (**self).disk_settings()
    }
    fn tune_disk(&self, t: &DiskTuning) -> Result<DiskSettings, String> {
        (**self).tune_disk(t)
    }
    fn disk_classes(&self) -> Vec<String> {
        (**self).disk_classes()
    }
}

/// A started stream, as the table drives it (the engine's [`StreamHandle`]).
pub trait RunningStream: Send {
    fn counters(&self) -> CounterSnapshot;
    fn lateness(&self) -> LatenessCounts;
    fn pause(&self);
    fn resume(&self);
    fn is_paused(&self) -> bool;
    fn cancel(&self);
    fn wait_timeout(&self, timeout: Duration) -> Option<Result<StreamReport, StreamError>>;
    /// Moves the running stream to another disk class, re-admitted
    /// ([`StreamHandle::set_class`]); on error nothing changed.
    fn set_class(&self, class: DiskClass) -> Result<(), StreamError>;
}

impl RunningStream for StreamHandle {
    fn counters(&self) -> CounterSnapshot {
        StreamHandle::counters(self)
    }
    fn lateness(&self) -> LatenessCounts {
        StreamHandle::lateness(self)
    }
    fn pause(&self) {
        StreamHandle::pause(self)
    }
    fn resume(&self) {
        StreamHandle::resume(self)
    }
    fn is_paused(&self) -> bool {
        StreamHandle::is_paused(self)
    }
    fn cancel(&self) {
        StreamHandle::cancel(self)
    }
    fn wait_timeout(&self, timeout: Duration) -> Option<Result<StreamReport, StreamError>> {
        StreamHandle::wait_timeout(self, timeout)
    }
    fn set_class(&self, class: DiskClass) -> Result<(), StreamError> {
        StreamHandle::set_class(self, class)
    }
}

/// Which endpoints a table's streams may name, and how they are opened: the half of a
/// [`Backend`] that is policy. The server's is [`Access`] (confined); the C library's opens
/// what its own process names, as `penstock stream` does.
pub trait EndpointPolicy: Send + Sync {
    /// Whether a stream may name `ep` in this role (at `OPEN`).
    fn check(&self, ep: &Endpoint, role: Role) -> Result<(), Denied>;
    /// Opens `ep` as far as it opens without a peer (at `START`).
    fn prepare(&self, ep: &Endpoint, role: Role, truncate: bool) -> Result<Prepared, Denied>;
}

impl EndpointPolicy for Access {
    fn check(&self, ep: &Endpoint, role: Role) -> Result<(), Denied> {
        Access::check(self, ep, role)
    }
    fn prepare(&self, ep: &Endpoint, role: Role, truncate: bool) -> Result<Prepared, Denied> {
        Access::prepare(self, ep, role, truncate)
    }
}

/// The real backend: the engine, and endpoints as `policy` allows ([`Access`] for the server).
pub struct EngineBackend<P: EndpointPolicy = Access> {
    pub(crate) engine: Arc<Engine>,
    pub(crate) policy: P,
}

impl<P: EndpointPolicy> EngineBackend<P> {
    /// A backend running `engine`'s streams between endpoints `policy` allows.
    pub fn new(engine: Arc<Engine>, policy: P) -> EngineBackend<P> {
        EngineBackend { engine, policy }
    }
}

impl<P: EndpointPolicy> Backend for EngineBackend<P> {
    fn check(&self, ep: &Endpoint, role: Role) -> Result<(), Denied> {
        self.policy.check(ep, role)
    }
    fn prepare(&self, ep: &Endpoint, role: Role, truncate: bool) -> Result<Prepared, Denied> {
        self.policy.prepare(ep, role, truncate)
    }
    fn admit(
        &self,
        spec: &StreamSpec,
        datagram: bool,
    ) -> Result<Option<(Ticket, StreamQos)>, StreamError> {
        Ok(self.engine.admit(spec, datagram)?.map(|a| {
            let qos = a.qos();
            (Box::new(a) as Ticket, qos)
        }))
    }
    fn start(
        &self,
        spec: StreamSpec,
        source: Opened,
        target: Opened,
        ticket: Option<Ticket>,
    ) -> Result<Box<dyn RunningStream>, StreamError> {
        let admitted = ticket.and_then(|t| t.downcast::<Admitted>().ok().map(|a| *a));
        self.engine
            .open_admitted(admitted, spec, source, target)
            .map(|h| Box::new(h) as Box<dyn RunningStream>)
    }
    fn admission_usage(&self) -> (Usage, Usage) {
        self.engine.admission_usage()
    }
    fn disk_usage(&self) -> Vec<penstock_core::admission::DeviceUsage> {
        self.engine.disk_usage()
    }
    fn buffer_bytes(&self) -> usize {
        self.engine.config().buffer_bytes
    }
    fn uring_available(&self) -> bool {
        self.engine.info().uring.is_ok()
    }
    fn disk_settings(&self) -> DiskSettings {
        self.engine.disk_settings()
    }
    fn tune_disk(&self, t: &DiskTuning) -> Result<DiskSettings, String> {
        self.engine.tune_disk(t).map_err(|e| e.to_string())
    }
    fn disk_classes(&self) -> Vec<String> {
        self.engine.disk_classes()
    }
}

type Handle = Box<dyn RunningStream>;
use crate::config::ControlConfig;
use crate::metrics::{Metrics, ResourceLabel};

/// Who a control connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Identity {
    /// Neither the token nor an allowed Unix peer: `HELP`, `QUIT` and `AUTH` only.
    Anonymous,
    /// Sent the server's token: may drive any stream.
    Token,
    /// A Unix-socket peer allowed by `SO_PEERCRED` (`control.unix_allow_uids`/`gids`), with
    /// its primary gid (for `[control.limits]`).
    Peer { uid: u32, gid: u32 },
}

/// Who is asking: a control connection and its identity.
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    pub conn: u64,
    pub identity: Identity,
}

impl Caller {
    /// May open and drive streams at all.
    pub fn may_act(&self) -> bool {
        self.identity != Identity::Anonymous
    }

    /// May drive streams other connections opened (Cues' remote control).
    pub fn may_drive_any(&self) -> bool {
        self.identity == Identity::Token
    }
}

struct Ends {
    source: Opened,
    target: Opened,
}

/// What an `OPEN` brings besides its spec ([`Streams::open_given`]).
pub struct Given {
    /// The source, opened already by the caller (its name in the spec is only a label):
    /// used at `START` instead of [`Backend::prepare`], and never put to [`Backend::check`]
    /// (what the caller could open, it may stream).
    pub source: Option<Opened>,
    /// The target, likewise.
    pub target: Option<Opened>,
    /// Expires like any control stream (not started within `pending_timeout_ms`, forgotten
    /// that long after it ended); `false` for a stream a C handle holds: it goes only when
    /// closed.
    pub expires: bool,
    /// A `DETACHED` stream whose connection is gone stays reachable by id for holders of
    /// the token (the server's remote control). `false` where nobody can reach it once its
    /// connection is gone (the C library's control descriptors, with no token): it is then
    /// closed as soon as it is not moving bytes (ended, or pending or paused, which nobody
    /// could start or resume any more) instead of holding its place for `pending_timeout_ms`.
    pub reachable_when_orphaned: bool,
}

impl Default for Given {
    fn default() -> Given {
        Given {
            source: None,
            target: None,
            expires: true,
            reachable_when_orphaned: true,
        }
    }
}

/// Where a stream is in its life (`STATE`'s second word).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamState {
    Pending,
    Starting,
    Waiting,
    Running,
    Paused,
    Done,
    Failed,
}

impl StreamState {
    /// The word `STATE` writes.
    pub fn as_str(self) -> &'static str {
        match self {
            StreamState::Pending => "pending",
            StreamState::Starting => "starting",
            StreamState::Waiting => "waiting",
            StreamState::Running => "running",
            StreamState::Paused => "paused",
            StreamState::Done => "done",
            StreamState::Failed => "failed",
        }
    }

    /// Done or failed: nothing more will move.
    pub fn is_final(self) -> bool {
        matches!(self, StreamState::Done | StreamState::Failed)
    }
}

/// A stream's state as values: what `STATE` writes as a line ([`Streams::status`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamStatus {
    pub id: StreamId,
    pub state: StreamState,
    /// Where the stream is in its source: the next byte it sends.
    pub offset_bytes: u64,
    /// Bytes that reached the target, all engine runs together.
    pub sent_bytes: u64,
    /// Bytes still to send, when a length was set.
    pub remaining_bytes: Option<u64>,
    pub unit_bytes: Option<u64>,
    pub class: Class,
    /// A RATE or SCHEDULE paces it...
    pub paced: bool,
    /// ...at this many bytes per second (`None`: a burst stream, or a pace the engine would
    /// refuse).
    pub pace_bytes_per_s: Option<u64>,
    /// The lateness counts of its current (or last) engine run: all zero for a burst stream.
    pub lateness: LatenessCounts,
    pub detached: bool,
    /// Where a listening endpoint waits for its peer (`waiting`).
    pub peer_on: Option<String>,
    /// Why it failed (`failed`).
    pub error: Option<String>,
}

impl StreamStatus {
    /// The `STATE` reply's line for this stream.
    pub fn line(&self) -> String {
        let mut s = format!(
            "{} {} offset={} sent={} class={}",
            self.id,
            self.state.as_str(),
            self.offset_bytes,
            self.sent_bytes,
            self.class
        );
        if let Some(r) = self.remaining_bytes {
            s.push_str(&format!(" remaining={r}"));
        }
        if let Some(u) = self.unit_bytes {
            s.push_str(&format!(" unit={u}"));
        }
        if self.paced {
            s.push_str(" paced=yes");
        }
        if self.detached {
            s.push_str(" detached");
        }
        if let Some(on) = &self.peer_on {
            s.push_str(&format!(" peer_on={on}"));
        }
        if let Some(e) = &self.error {
            s.push_str(&format!(" error={}", e.replace(' ', "_")));
        }
        s
    }
}

enum Run {
    Pending,
    /// `START` is opening the endpoints (no lock held); `cancel` stops it.
    Starting {
        cancel: Arc<AtomicBool>,
    },
    /// A listening endpoint waits for its peer on `on`; `cancel` stops the wait.
    Waiting {
        cancel: Arc<AtomicBool>,
        on: String,
    },
    Running {
        handle: Handle,
        ends: Ends,
    },
    /// Paused in the engine (`handle`: the stream and its schedule are kept), or stopped by
    /// an edit (`None`: its bytes are folded into the offset; RESUME restarts it there).
    Paused {
        handle: Option<Handle>,
        ends: Ends,
    },
    Done,
    Failed(String),
}

/// How long `PAUSE` waits for the worker to take the pause before it answers anyway (the
/// pause still takes effect; the reply's offset may then be a little short).
pub const PAUSE_ACK_WAIT: Duration = Duration::from_secs(2);

/// How long `CLOSE` (without `NOW`) waits for a cancelled stream's in-flight operations.
pub const CLOSE_WAIT: Duration = Duration::from_secs(10);

struct Entry {
    id: StreamId,
    detached: bool,
    src: Endpoint,
    dst: Endpoint,
    /// A file target may be cut (`TRUNCATE`); otherwise it must be new.
    truncate: bool,
    /// When it was opened, and when it ended (done, failed): for expiry.
    created: Instant,
    ended: Option<Instant>,
    class: Class,
    /// Where the next transfer starts in the source.
    offset_bytes: u64,
    /// Bytes still to transfer; `None`: to the end of the source.
    remaining_bytes: Option<u64>,
    unit_bytes: Option<u64>,
    rate: Option<Rate>,
    schedule: Option<KtSchedule>,
    /// `pause=K,T`: Cues' pause form.
    pause: Option<KtSchedule>,
    buffers: Option<u32>,
    path: CtlPath,
    /// Bytes that reached the target in earlier engine streams (before restarts).
    sent_before_bytes: u64,
    /// The current engine stream's lateness counts already added to the metrics.
    lateness_seen: LatenessCounts,
    /// Lateness counts of the engine streams that ended (before restarts, or at the end).
    lateness_past: LatenessCounts,
    /// `late=send|skip`.
    late: LatePolicy,
    /// `cache=keep|bypass|drop`.
    cache: penstock_core::stream::CachePolicy,
    /// `START … AT`: when unit 0 of the next engine stream is due (the engine's clock);
    /// used once.
    start_at: Option<penstock_core::time::Instant>,
    /// Since when the entry has been running (`None`: not running), and how long it ran
    /// before: `STATE`'s measured rate excludes pauses.
    active_since: Option<Instant>,
    active_before: Duration,
    /// The admission reservation of a stream not (or no longer) running in the engine; a
    /// running one's is held by its engine stream.
    ticket: Option<Ticket>,
    /// Holds an admission reservation (in `ticket`, or through its engine stream).
    admitted: bool,
    /// Endpoints the caller opened already ([`Given`]), taken by `START`.
    given_source: Option<Opened>,
    given_target: Option<Opened>,
    run: Run,
}

impl Entry {
    /// The engine stream of a running or engine-paused entry.
    fn handle(&self) -> Option<&Handle> {
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

    /// Bytes the current engine stream moved past unsent (`late=skip`), not yet folded into
    /// the offset.
    fn engine_skipped_bytes(&self) -> u64 {
        self.handle().map_or(0, |h| h.lateness().bytes_skipped)
    }

    /// The entry starts (or resumes) running now.
    fn mark_active(&mut self) {
        self.active_since.get_or_insert_with(Instant::now);
    }

    /// The entry stops running (paused, done, failed, closed).
    fn mark_idle(&mut self) {
        if let Some(t) = self.active_since.take() {
            self.active_before += t.elapsed();
        }
    }

    /// Bytes per second sent while running (pauses excluded), since `START`.
    fn rate_bytes_per_s(&self) -> u64 {
        let ran = self.active_before + self.active_since.map_or(Duration::ZERO, |t| t.elapsed());
        if ran.is_zero() {
            return 0;
        }
        (self.sent_bytes() as f64 / ran.as_secs_f64()) as u64
    }

    /// Lateness counts of every engine stream of this entry, the current one's so far.
    fn lateness_counts(&self) -> LatenessCounts {
        let mut all = self.lateness_past;
        if let Some(h) = self.handle() {
            add_counts(&mut all, &h.lateness());
        }
        all
    }

    /// The current engine stream ended with these counts: keep them.
    fn keep_lateness(&mut self, last: &LatenessCounts) {
        let mut past = self.lateness_past;
        add_counts(&mut past, last);
        self.lateness_past = past;
    }

    fn sent_bytes(&self) -> u64 {
        self.sent_before_bytes + self.engine_sent_bytes()
    }

    /// Adds the current engine stream's new lateness counts to the metrics.
    fn feed_lateness(&mut self, metrics: &Metrics) {
        if let Some(now) = self.handle().map(|h| h.lateness()) {
            metrics.add_lateness(&self.disk_class(), &now, &mut self.lateness_seen);
        }
    }

    /// The engine's disk class of this stream (the `class` label of lateness).
    fn disk_class(&self) -> String {
        self.class.to_string()
    }

    /// Paced by `rate=`, `schedule=` or `pause=`.
    fn paced(&self) -> bool {
        self.rate.is_some() || self.schedule.is_some() || self.pause.is_some()
    }

    fn state(&self) -> StreamState {
        match self.run {
            Run::Pending => StreamState::Pending,
            Run::Starting { .. } => StreamState::Starting,
            Run::Waiting { .. } => StreamState::Waiting,
            Run::Running { .. } => StreamState::Running,
            Run::Paused { .. } => StreamState::Paused,
            Run::Done => StreamState::Done,
            Run::Failed(_) => StreamState::Failed,
        }
    }

    fn state_name(&self) -> &'static str {
        self.state().as_str()
    }

    /// The entry as values (`pace_bytes_per_s` is the table's to fill: it needs the engine's
    /// limits).
    fn status(&self) -> StreamStatus {
        let running_sent = self.engine_sent_bytes();
        StreamStatus {
            id: self.id,
            state: self.state(),
            offset_bytes: self.offset_bytes + running_sent,
            sent_bytes: self.sent_bytes(),
            remaining_bytes: self.remaining_bytes.map(|r| r.saturating_sub(running_sent)),
            unit_bytes: self.unit_bytes,
            class: self.class.clone(),
            paced: self.paced(),
            pace_bytes_per_s: None,
            lateness: self.handle().map_or(self.lateness_seen, |h| h.lateness()),
            detached: self.detached,
            peer_on: match &self.run {
                Run::Waiting { on, .. } => Some(on.clone()),
                _ => None,
            },
            error: match &self.run {
                Run::Failed(e) => Some(e.clone()),
                _ => None,
            },
        }
    }

    /// `STATE`'s line: `<id> <state> key=value…` (docs/control-protocol.md lists the keys).
    fn state_line(&self, backend: &dyn Backend) -> String {
        let moved = self.engine_sent_bytes() + self.engine_skipped_bytes();
        let mut s = format!(
            "{} {} offset={} sent={} class={}",
            self.id,
            self.state_name(),
            self.offset_bytes + moved,
            self.sent_bytes(),
            self.class
        );
        if let Some(r) = self.remaining_bytes {
            s.push_str(&format!(" remaining={}", r.saturating_sub(moved)));
        }
        // The plan: a paced stream's schedule as the engine runs it.
        match planned_schedule(backend, self) {
            Some(sched) => {
                s.push_str(&format!(" unit={} paced=yes", sched.unit_bytes()));
                s.push_str(&format!(
                    " plan_bytes_per_s={}",
                    penstock_driver::engine::schedule_bytes_per_s(&sched)
                ));
                if let Some(p) = sched.period() {
                    s.push_str(&format!(" period_ns={}", p.ceil_ns()));
                }
                if let Some(k) = sched.cycle_units().filter(|&k| k > 1) {
                    s.push_str(&format!(" cycle_units={k}"));
                }
                if sched.is_pause_form() {
                    s.push_str(" pause_form=yes");
                }
                if self.late != LatePolicy::Send {
                    s.push_str(&format!(" late={}", self.late));
                }
            }
            _ => {
                if let Some(u) = self.unit_bytes {
                    s.push_str(&format!(" unit={u}"));
                }
            }
        }
        // What happened: measured rate and lateness, once started.
        if self.active_since.is_some() || !self.active_before.is_zero() {
            s.push_str(&format!(" rate_bytes_per_s={}", self.rate_bytes_per_s()));
            if self.paced() {
                let l = self.lateness_counts();
                s.push_str(&format!(
                    " late_p50_ns={} late_p99_ns={} late_max_ns={} misses={} skipped={}",
                    l.quantile_ns_max(500_000),
                    l.quantile_ns_max(990_000),
                    l.max_ns,
                    l.misses,
                    l.units_skipped
                ));
            }
        }
        if self.detached {
            s.push_str(" detached");
        }
        if let Run::Waiting { on, .. } = &self.run {
            s.push_str(&format!(" peer_on={on}"));
        }
        if let Run::Failed(e) = &self.run {
            s.push_str(&format!(" error={}", e.replace(' ', "_")));
        }
        s
    }

    /// Stops a `START` under way (opening or waiting for a peer).
    fn cancel_start(&self) {
        if let Run::Starting { cancel } | Run::Waiting { cancel, .. } = &self.run {
            cancel.store(true, Ordering::Release);
        }
    }
}

/// An identity's key for the per-identity stream limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum IdentityKey {
    Token,
    Uid(u32),
}

/// A table row: what is needed to count and select streams without locking their entries.
struct Slot {
    owner: u64,
    identity: Option<IdentityKey>,
    detached: bool,
    /// Expires by `pending_timeout_ms` ([`Given::expires`]).
    expires: bool,
    /// Its connection is gone and nobody can reach it ([`Given::reachable_when_orphaned`]):
    /// closed once it does not move bytes.
    unreachable: bool,
    reachable_when_orphaned: bool,
    entry: Arc<Mutex<Entry>>,
}

/// The table, shared by every control connection.
pub struct Streams {
    backend: Box<dyn Backend>,
    table: Mutex<HashMap<u64, Slot>>,
    next_id: AtomicU64,
    metrics: Arc<Metrics>,
    config: ControlConfig,
    /// Set at shutdown: waiters stop waiting.
    stopping: AtomicBool,
    /// Counts streams that ended (done, failed, closed), with `ended` notified each time:
    /// what [`Streams::wait`] sleeps on.
    ended_count: Mutex<u64>,
    ended: Condvar,
    /// Streams of other servers in the process (RTSP sessions): their `STATE *` lines.
    others: Mutex<Vec<StateSource>>,
}

/// The `STATE` lines of streams the table does not hold (an RTSP server's sessions).
pub type StateSource = Box<dyn Fn() -> Vec<String> + Send + Sync>;

impl std::fmt::Debug for Streams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Streams")
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `in 250.000 ms` or `1.500 ms ago`, for a time `ahead_ns` from now.
fn due_text(ahead_ns: i128) -> String {
    let ms = ahead_ns.unsigned_abs() as f64 / 1e6;
    if ahead_ns >= 0 {
        format!("in {ms:.3} ms")
    } else {
        format!("{ms:.3} ms ago")
    }
}

/// Adds `b`'s counts to `a` (the maximum is the larger).
fn add_counts(a: &mut LatenessCounts, b: &LatenessCounts) {
    for (x, y) in a.buckets.iter_mut().zip(b.buckets) {
        *x += y;
    }
    a.misses += b.misses;
    a.max_ns = a.max_ns.max(b.max_ns);
    a.units_skipped += b.units_skipped;
    a.bytes_skipped += b.bytes_skipped;
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
        fd: o.fd.as_fd().try_clone_to_owned()?.into(),
        kind: o.kind,
        size: o.size,
        socket: o.socket,
        label: o.label.clone(),
        volume: None,
    })
}

/// The engine's spec of an entry (its endpoints are opened apart: descriptors only).
fn spec_of(e: &Entry) -> StreamSpec {
    let mut spec = StreamSpec::opened();
    spec.extent = Extent {
        offset: e.offset_bytes,
        length: e.remaining_bytes,
    };
    spec.unit_bytes = e
        .unit_bytes
        .map_or(0, |u| usize::try_from(u).unwrap_or(usize::MAX));
    spec.path = engine_path(e.path);
    spec.pacing = pacing_of(e);
    spec.class = Some(disk_class_of(&e.class));
    spec.buffers = e.buffers;
    spec.late = e.late;
    spec.cache = e.cache;
    spec.start_at = e.start_at;
    spec
}

/// Starts (or restarts, after an edit while paused) the engine stream of `e` on dups of its
/// endpoints, at its offset, with its admission ticket.
fn run(
    backend: &dyn Backend,
    e: &mut Entry,
    ends: &Ends,
    send_timeout: Option<Duration>,
) -> Result<Handle, String> {
    e.lateness_seen = LatenessCounts::default();
    let mut spec = spec_of(e);
    spec.send_timeout = send_timeout;
    // `START … AT` holds for the first engine stream only: a restart after an edit starts
    // its schedule anew, at the resume.
    e.start_at = None;
    let source = dup(&ends.source).map_err(|x| x.to_string())?;
    let target = dup(&ends.target).map_err(|x| x.to_string())?;
    backend
        .start(spec, source, target, e.ticket.take())
        .map_err(|x| x.to_string())
}

/// The engine's class of a protocol class (a named one was checked against the engine's
/// classes at `OPEN`/`CLASS`; its syntax is the parser's, the same as the core's).
fn disk_class_of(c: &Class) -> DiskClass {
    match c {
        Class::Rt => DiskClass::Rt,
        Class::Bulk => DiskClass::Bulk,
        Class::Named(n) => DiskClass::parse(n).unwrap_or(DiskClass::Bulk),
    }
}

/// What an entry's RATE, SCHEDULE or pause asks of the planner (none: burst).
fn pacing_of(e: &Entry) -> Pacing {
    match (&e.rate, &e.schedule, &e.pause) {
        (None, None, None) => Pacing::Burst,
        (Some(rate), _, _) => Pacing::Rate(*rate),
        (None, Some(kt), _) => Pacing::Kt {
            cycle_units: u64::from(kt.blocks),
            cycle: kt.delay,
        },
        (None, None, Some(kt)) => Pacing::KtPause {
            cycle_units: u64::from(kt.blocks),
            pause: kt.delay,
        },
    }
}

/// The schedule the planner gives an entry's pacing (for `STATE` before and while it runs);
/// `None` for a burst stream or a pacing the planner refuses.
fn planned_schedule(backend: &dyn Backend, e: &Entry) -> Option<Schedule> {
    penstock_core::stream::plan::plan_schedule(
        &pacing_of(e),
        e.unit_bytes,
        matches!(e.dst, Endpoint::UdpSend { .. }),
        backend.buffer_bytes() as u64,
    )
    .ok()
    .flatten()
}

/// Stops the engine stream of a paused entry and folds what it sent into the entry's offset
/// (before an edit).
fn suspend(e: &mut Entry, handle: Handle, metrics: &Metrics) -> Result<(), String> {
    handle.cancel();
    // The report comes only after every in-flight operation completed, so the counters read
    // then are final. (The `Cancelled` error's own count is taken when the cancel is seen,
    // before in-flight sends complete: on the uring path it can be short by a unit.)
    let Some(outcome) = handle.wait_timeout(CLOSE_WAIT) else {
        return Err(format!(
            "the paused stream did not stop within {CLOSE_WAIT:?}: CLOSE it"
        ));
    };
    let counted = handle.counters().bytes_sent;
    let last = handle.lateness();
    metrics.add_lateness(&e.disk_class(), &last, &mut e.lateness_seen);
    e.keep_lateness(&last);
    let sent = match outcome {
        Ok(report) => report.bytes.max(counted),
        Err(penstock_driver::StreamError::Cancelled { .. }) => counted,
        Err(other) => return Err(other.to_string()),
    };
    // Units skipped (`late=skip`) were moved past too.
    let moved = sent + last.bytes_skipped;
    e.offset_bytes += moved;
    e.sent_before_bytes += sent;
    if let Some(r) = &mut e.remaining_bytes {
        *r = r.saturating_sub(moved);
    }
    Ok(())
}

impl Streams {
    /// The table over `backend`, with `config`'s limits.
    pub fn new(backend: Box<dyn Backend>, metrics: Arc<Metrics>, config: ControlConfig) -> Streams {
        Streams {
            backend,
            table: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            metrics,
            config,
            stopping: AtomicBool::new(false),
            ended_count: Mutex::new(0),
            others: Mutex::new(Vec::new()),
            ended: Condvar::new(),
        }
    }

    /// A stream ended: wakes [`Streams::wait`]ers.
    fn notify_ended(&self) {
        *lock(&self.ended_count) += 1;
        self.ended.notify_all();
    }

    fn denied_reply(d: Denied) -> Reply {
        match d {
            Denied::Forbidden(m) => Reply::new(ReplyCode::FORBIDDEN, format!("not permitted: {m}")),
            Denied::Failed(m) => Reply::new(ReplyCode::INTERNAL_ERROR, m),
        }
    }

    /// Admission for an entry as it stands (the engine's, the one admission): its ticket, or
    /// the reply refusing it.
    fn admit(&self, e: &Entry) -> Result<Option<(Ticket, StreamQos)>, Reply> {
        let spec = spec_of(e);
        let datagram = matches!(e.dst, Endpoint::UdpSend { .. });
        self.backend
            .admit(&spec, datagram)
            .map_err(|err| self.error_reply(err))
    }

    /// Re-admits an edited entry: its old ticket goes first; refused, `restore` puts the old
    /// values back and they get a ticket again (they fitted before, and nothing else changed
    /// under the entry's lock), and the refusal is returned.
    fn readmit(&self, e: &mut Entry, restore: impl FnOnce(&mut Entry)) -> Result<(), Reply> {
        drop(e.ticket.take());
        let (t, refused) = match self.admit(e) {
            Ok(t) => (t, None),
            Err(reply) => {
                restore(e);
                (self.admit(e).ok().flatten(), Some(reply))
            }
        };
        e.admitted = t.is_some();
        e.ticket = t.map(|(t, _)| t);
        refused.map_or(Ok(()), Err)
    }

    /// An engine's refusal (admission, the planner) in the protocol's words.
    fn error_reply(&self, err: StreamError) -> Reply {
        match err {
            StreamError::Refused(r) => self.refusal_reply(r),
            // The planner's refusals, in the protocol's words.
            StreamError::Plan(PlanError::RtNeedsRate) => Reply::new(
                ReplyCode::BAD_SYNTAX,
                "class=rt needs rate= or schedule= (a guarantee is for a known bandwidth)",
            ),
            StreamError::Plan(PlanError::SkipNeedsPacing) => Reply::new(
                ReplyCode::BAD_SYNTAX,
                "late=skip needs rate= or schedule= (a burst stream has no late units)",
            ),
            StreamError::Plan(PlanError::Schedule(why)) => {
                Reply::new(ReplyCode::BAD_SYNTAX, format!("invalid stream: {why}"))
            }
            other => Reply::new(ReplyCode::BAD_SYNTAX, other.to_string()),
        }
    }

    /// A class the engine has (`rt`, `bulk`, `[disk.classes.NAME]`), or the refusal naming
    /// them.
    fn known_class(&self, class: &Class) -> Result<(), Reply> {
        let names = self.backend.disk_classes();
        let name = class.to_string();
        if names.contains(&name) {
            return Ok(());
        }
        Err(Reply::new(
            ReplyCode::BAD_SYNTAX,
            format!(
                "unknown class {name}: the classes are {} ([disk.classes.NAME])",
                names.join(", ")
            ),
        ))
    }

    /// The operator's ceiling for `identity` (`[control.limits]`) against what `e` asks.
    fn within_ceiling(&self, identity: Identity, e: &Entry) -> Result<(), Reply> {
        let (token, uid, gid) = match identity {
            Identity::Token => (true, None, None),
            Identity::Peer { uid, gid } => (false, Some(uid), Some(gid)),
            Identity::Anonymous => return Ok(()),
        };
        let Some((who, ceiling)) = self.config.ceiling_of(token, uid, gid) else {
            return Ok(());
        };
        let schedule = planned_schedule(&*self.backend, e);
        if e.paced() && schedule.is_none() {
            // A pacing the planner refuses: admission says why.
            return Ok(());
        }
        ceiling.check(schedule.as_ref()).map_err(|why| {
            self.metrics
                .admission_refusals
                .get_or_create(&ResourceLabel {
                    resource: "ceiling".into(),
                })
                .inc();
            Reply::new(
                ReplyCode::REFUSED,
                format!("refused: {why}: the ceiling of {who} (control.limits)"),
            )
        })
    }

    /// `CLASS`: moves a stream to another disk class. A running (or engine-paused) stream
    /// keeps running: the engine re-admits it in the new class ([`StreamHandle::set_class`])
    /// and its next reads are queued there; a pending one is re-admitted as edited. On a
    /// refusal nothing changes.
    pub fn set_class(&self, caller: Caller, id: StreamId, class: Class) -> Reply {
        let e = match self.get(caller, id) {
            Ok(e) => e,
            Err(r) => return r,
        };
        if let Err(r) = self.known_class(&class) {
            return r;
        }
        let mut e = lock(&e);
        if e.class == class {
            return Reply::ok(format!("class={class}"));
        }
        let moved = match &e.run {
            Run::Running { handle, .. }
            | Run::Paused {
                handle: Some(handle),
                ..
            } => Some(handle.set_class(disk_class_of(&class))),
            Run::Pending | Run::Paused { handle: None, .. } => None,
            _ => {
                return Reply::new(
                    ReplyCode::WRONG_STATE,
                    format!("stream {id} is {}: no class to change", e.state_name()),
                );
            }
        };
        match moved {
            Some(Err(err)) => return self.error_reply(err),
            Some(Ok(())) => {
                // Lateness so far goes to the old class's metrics.
                e.feed_lateness(&self.metrics);
                e.admitted = class == Class::Rt;
                e.class = class.clone();
            }
            None => {
                let old = std::mem::replace(&mut e.class, class.clone());
                if let Err(reply) = self.readmit(&mut e, |e| e.class = old) {
                    return reply;
                }
            }
        }
        Reply::ok(format!("class={class}"))
    }

    fn refusal_reply(&self, r: Refusal) -> Reply {
        let resources: Vec<&str> = match &r {
            Refusal::Short { shortages, .. } | Refusal::NeverFits { shortages, .. } => {
                shortages.iter().map(|s| s.resource.name()).collect()
            }
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
        match self.open_given(caller, spec, Given::default()) {
            Ok((id, details)) => Reply::opened(id, &details),
            Err(reply) => reply,
        }
    }

    /// `OPEN` with what the caller brings besides the spec ([`Given`]): the new stream's id and
    /// the details `OPEN`'s reply gives (class, what admission reserved), or the refusal.
    pub fn open_given(
        &self,
        caller: Caller,
        spec: &OpenSpec,
        given: Given,
    ) -> Result<(StreamId, String), Reply> {
        let identity = match caller.identity {
            Identity::Anonymous => {
                return Err(Reply::new(ReplyCode::AUTH_REQUIRED, "AUTH <token> first"));
            }
            Identity::Token => IdentityKey::Token,
            Identity::Peer { uid, .. } => IdentityKey::Uid(uid),
        };
        let src = Endpoint::parse(&spec.src, Role::Source)
            .map_err(|e| Reply::new(ReplyCode::BAD_SYNTAX, format!("source: {e}")))?;
        let dst = Endpoint::parse(&spec.dst, Role::Target)
            .map_err(|e| Reply::new(ReplyCode::BAD_SYNTAX, format!("target: {e}")))?;
        for (ep, role, opened) in [
            (&src, Role::Source, given.source.is_some()),
            (&dst, Role::Target, given.target.is_some()),
        ] {
            if opened {
                continue;
            }
            if let Err(d) = self.backend.check(ep, role) {
                self.metrics
                    .admission_refusals
                    .get_or_create(&ResourceLabel {
                        resource: "permission".into(),
                    })
                    .inc();
                return Err(Self::denied_reply(d));
            }
        }
        if spec.path == Some(CtlPath::Uring) && !self.backend.uring_available() {
            return Err(Reply::new(
                ReplyCode::NOT_IMPLEMENTED,
                "path=uring: io_uring is not available here",
            ));
        }
        // The planner's rules (class=rt and late=skip need pacing, the schedule's limits)
        // are the admission's below: `admit` maps its refusals.
        let late = spec.late.unwrap_or_default();
        let class = spec.class.clone().unwrap_or(Class::Bulk);
        self.known_class(&class)?;
        if spec.pause.is_some() && (spec.rate.is_some() || spec.schedule.is_some()) {
            return Err(Reply::new(
                ReplyCode::BAD_SYNTAX,
                "pause= is a pacing of its own: give one of rate=, schedule= (the cycle form) or pause= (k units, then a pause)",
            ));
        }
        // Counted and inserted under the table's lock, so two OPENs cannot both take the last
        // place. A full count is taken again after one reap: a stream whose receiver already
        // saw EOF may not be reaped yet (the reaper runs every few milliseconds), and a caller
        // that opens its next stream at once must find that place free.
        let count = |table: &HashMap<u64, Slot>| {
            table.values().fold((0, 0), |(c, i), s| {
                (
                    c + usize::from(s.owner == caller.conn),
                    i + usize::from(s.identity == Some(identity)),
                )
            })
        };
        let full = |(mine, ours): (usize, usize)| {
            mine >= self.config.streams_per_connection_max
                || ours >= self.config.streams_per_identity_max
        };
        let mut table = lock(&self.table);
        if full(count(&table)) {
            drop(table);
            self.reap();
            table = lock(&self.table);
        }
        let (mine, ours) = count(&table);
        if mine >= self.config.streams_per_connection_max {
            return Err(Reply::new(
                ReplyCode::REFUSED,
                format!(
                    "refused: this connection holds {mine} streams (control.streams_per_connection_max)"
                ),
            ));
        }
        if ours >= self.config.streams_per_identity_max {
            return Err(Reply::new(
                ReplyCode::REFUSED,
                format!(
                    "refused: this identity holds {ours} streams (control.streams_per_identity_max); CLOSE some"
                ),
            ));
        }
        let id = StreamId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let entry = Entry {
            id,
            detached: spec.detached,
            src,
            dst,
            truncate: spec.truncate,
            created: Instant::now(),
            ended: None,
            class,
            offset_bytes: spec.offset_bytes.unwrap_or(0),
            remaining_bytes: spec.length_bytes,
            unit_bytes: spec.unit_bytes,
            rate: spec.rate,
            schedule: spec.schedule,
            pause: spec.pause,
            buffers: spec.buffers,
            path: spec.path.unwrap_or(CtlPath::Auto),
            sent_before_bytes: 0,
            lateness_seen: LatenessCounts::default(),
            lateness_past: LatenessCounts::default(),
            late,
            cache: spec.cache.unwrap_or_default(),
            start_at: None,
            active_since: None,
            active_before: Duration::ZERO,
            ticket: None,
            admitted: false,
            given_source: given.source,
            given_target: given.target,
            run: Run::Pending,
        };
        self.within_ceiling(caller.identity, &entry)?;
        let (ticket, qos) = match self.admit(&entry)? {
            Some((t, q)) => (Some(t), Some(q)),
            None => (None, None),
        };
        let mut entry = entry;
        entry.admitted = ticket.is_some();
        entry.ticket = ticket;
        let details = format!(
            "class={}{}",
            entry.class,
            qos.map_or(String::new(), |q| format!(
                " rate={}B/s unit={} buffers={}",
                q.rate_bytes_per_s, q.unit_bytes, q.buffers
            ))
        );
        table.insert(
            id.0,
            Slot {
                owner: caller.conn,
                identity: Some(identity),
                detached: spec.detached,
                expires: given.expires,
                unreachable: false,
                reachable_when_orphaned: given.reachable_when_orphaned,
                entry: Arc::new(Mutex::new(entry)),
            },
        );
        Ok((id, details))
    }

    /// The entry if it exists and `caller` may drive it; otherwise the reply (404, 401).
    fn get(&self, caller: Caller, id: StreamId) -> Result<Arc<Mutex<Entry>>, Reply> {
        let table = lock(&self.table);
        let slot = table
            .get(&id.0)
            .ok_or_else(|| Reply::new(ReplyCode::NO_SUCH_STREAM, format!("no stream {id}")))?;
        if !caller.may_act() || (slot.owner != caller.conn && !caller.may_drive_any()) {
            return Err(Reply::new(
                ReplyCode::AUTH_REQUIRED,
                format!("stream {id} belongs to another connection: AUTH <token> first"),
            ));
        }
        Ok(slot.entry.clone())
    }

    /// Whether connection `conn` holds any stream (then it is not idle).
    pub fn holds_streams(&self, conn: u64) -> bool {
        lock(&self.table).values().any(|s| s.owner == conn)
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
        let old = (e.rate, e.unit_bytes, e.schedule, e.pause);
        match f {
            Edit::Seek(n) => e.offset_bytes = n,
            Edit::Length(n) => e.remaining_bytes = Some(n),
            Edit::Schedule(s) => {
                e.schedule = Some(s);
                e.pause = None;
            }
            Edit::Unit(n) => e.unit_bytes = Some(n),
            Edit::Rate(r) => e.rate = Some(r),
        }
        // The operator's ceiling holds for edits as for OPEN.
        if let Err(reply) = self.within_ceiling(caller.identity, &e) {
            (e.rate, e.unit_bytes, e.schedule, e.pause) = old;
            return reply;
        }
        if e.class == Class::Rt {
            // Re-admit as edited (a paused stream's engine stream, stopped for the edit, gave
            // its reservation back; a pending one's ticket is for the old rate): the old
            // ticket goes first, and on refusal the old values come back with a ticket for
            // them (they fitted before, and nothing else changed under the lock).
            if let Err(reply) = self.readmit(&mut e, |e| {
                (e.rate, e.unit_bytes, e.schedule, e.pause) = old;
            }) {
                return reply;
            }
        }
        Reply::ok("OK")
    }

    /// `START` a pending stream: open its endpoints (no lock held) and hand it to the
    /// engine; a listening endpoint is bound, and its peer awaited by a waiter thread.
    ///
    /// With `at` (`START id AT time`), unit 0 of the paced stream is due at that time: a
    /// wall-clock time is turned into the engine's monotonic clock once, here, so a later
    /// step of the wall clock (NTP) does not move the schedule.
    pub fn start(self: &Arc<Self>, caller: Caller, id: StreamId, at: Option<StartTime>) -> Reply {
        let entry = match self.get(caller, id) {
            Ok(e) => e,
            Err(r) => return r,
        };
        let start_at = match at.map(|t| self.start_instant(t)).transpose() {
            Ok(s) => s,
            Err(r) => return r,
        };
        let cancel = Arc::new(AtomicBool::new(false));
        let (src, dst, truncate, given_source, given_target) = {
            let mut e = lock(&entry);
            if !matches!(e.run, Run::Pending) {
                return Reply::new(
                    ReplyCode::WRONG_STATE,
                    format!("stream {id} is {}, not pending", e.state_name()),
                );
            }
            if start_at.is_some() && e.rate.is_none() && e.schedule.is_none() {
                return Reply::new(
                    ReplyCode::BAD_SYNTAX,
                    "START AT needs a paced stream (OPEN with rate= or schedule=): a burst \
                     stream has no schedule to start at a time",
                );
            }
            e.start_at = start_at.map(|(instant, _)| instant);
            e.run = Run::Starting {
                cancel: cancel.clone(),
            };
            (
                e.src.clone(),
                e.dst.clone(),
                e.truncate,
                e.given_source.take(),
                e.given_target.take(),
            )
        };
        // Endpoints the caller opened already are used as they are; the others are opened now.
        let prepare = |given: Option<Opened>, ep: &Endpoint, role: Role, truncate: bool| match given
        {
            Some(o) => Ok(Prepared::Ready(o)),
            None => self.backend.prepare(ep, role, truncate),
        };
        let prepared = prepare(given_source, &src, Role::Source, false)
            .and_then(|s| Ok((s, prepare(given_target, &dst, Role::Target, truncate)?)));
        let (source, target) = match prepared {
            Ok(p) => p,
            Err(d) => {
                let reply = Self::denied_reply(d);
                self.start_failed(&entry, &cancel, reply.text.clone());
                return reply;
            }
        };
        let due = |reply: Reply| match start_at {
            Some((_, ahead_ns)) if reply.code.is_success() => Reply::new(
                reply.code,
                format!("{}; unit 0 due {}", reply.text, due_text(ahead_ns)),
            ),
            _ => reply,
        };
        match (source, target) {
            (Prepared::Ready(source), Prepared::Ready(target)) => {
                due(self.launch(&entry, &cancel, Ends { source, target }))
            }
            (source, target) => {
                let on: Vec<String> = [&source, &target]
                    .into_iter()
                    .filter_map(|p| match p {
                        Prepared::Listening(l) => Some(l.addr.clone()),
                        Prepared::Ready(_) => None,
                    })
                    .collect();
                let on = on.join(",");
                {
                    let mut e = lock(&entry);
                    if cancel.load(Ordering::Acquire) {
                        return Reply::new(
                            ReplyCode::NO_SUCH_STREAM,
                            format!("stream {id} was closed while starting"),
                        );
                    }
                    e.run = Run::Waiting {
                        cancel: cancel.clone(),
                        on: on.clone(),
                    };
                }
                let me = self.clone();
                let deadline = Instant::now() + self.config.accept_timeout();
                let spawned = std::thread::Builder::new()
                    .name("penstock-ctl-wait".into())
                    .spawn({
                        let entry = entry.clone();
                        let cancel = cancel.clone();
                        move || me.await_peers(&entry, &cancel, source, target, deadline)
                    });
                match spawned {
                    Ok(_) => due(Reply::ok(format!("started, waiting for a peer on {on}"))),
                    Err(err) => {
                        let text = format!("could not start a waiter: {err}");
                        self.start_failed(&entry, &cancel, text.clone());
                        Reply::new(ReplyCode::INTERNAL_ERROR, text)
                    }
                }
            }
        }
    }

    /// The engine-clock instant of a `START … AT` time and how far ahead of now it is (ns,
    /// negative when past), or the refusal: more than `start_at_late_max_ms` past, or more
    /// than `start_at_ahead_max_ms` ahead.
    fn start_instant(&self, t: StartTime) -> Result<(penstock_core::time::Instant, i128), Reply> {
        let now = penstock_driver::clock::now();
        let ahead_ns: i128 = match t {
            StartTime::In(d) => i128::try_from(d.as_nanos()).unwrap_or(i128::MAX),
            StartTime::At { unix_ns } => {
                let wall_ns = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos());
                i128::from(unix_ns) - i128::try_from(wall_ns).unwrap_or(i128::MAX)
            }
        };
        let late_max = self.config.start_at_late_max();
        let ahead_max = self.config.start_at_ahead_max();
        if ahead_ns < -(late_max.as_nanos() as i128) {
            return Err(Reply::new(
                ReplyCode::BAD_SYNTAX,
                format!(
                    "START AT {t}: that was {} ago, more than control.start_at_late_max_ms \
                     ({} ms) allows",
                    due_text(-ahead_ns).trim_start_matches("in "),
                    late_max.as_millis()
                ),
            ));
        }
        if ahead_ns > ahead_max.as_nanos() as i128 {
            return Err(Reply::new(
                ReplyCode::BAD_SYNTAX,
                format!(
                    "START AT {t}: that is {}, further than control.start_at_ahead_max_ms \
                     ({} ms) allows",
                    due_text(ahead_ns),
                    ahead_max.as_millis()
                ),
            ));
        }
        let at_ns = i128::from(now.as_nanos()) + ahead_ns;
        let at = penstock_core::time::Instant::from_nanos(
            u64::try_from(at_ns.max(0)).unwrap_or(u64::MAX),
        );
        Ok((at, ahead_ns))
    }

    /// A waiter thread: accepts each listening endpoint's peer, then starts the stream.
    fn await_peers(
        &self,
        entry: &Mutex<Entry>,
        cancel: &AtomicBool,
        source: Prepared,
        target: Prepared,
        deadline: Instant,
    ) {
        let give_up = || cancel.load(Ordering::Acquire) || self.stopping.load(Ordering::Acquire);
        let accept = |p: Prepared| match p {
            Prepared::Ready(o) => Ok(o),
            Prepared::Listening(l) => l.accept(deadline, &give_up),
        };
        let ends = accept(source).and_then(|source| {
            Ok(Ends {
                source,
                target: accept(target)?,
            })
        });
        match ends {
            Ok(ends) => {
                let _ = self.launch(entry, cancel, ends);
            }
            Err(d) => self.start_failed(entry, cancel, d.to_string()),
        }
    }

    /// Hands a starting entry's opened endpoints to the engine, unless it was closed
    /// meanwhile (then the endpoints are simply dropped).
    fn launch(&self, entry: &Mutex<Entry>, cancel: &AtomicBool, ends: Ends) -> Reply {
        let mut e = lock(entry);
        let id = e.id;
        if cancel.load(Ordering::Acquire)
            || !matches!(e.run, Run::Starting { .. } | Run::Waiting { .. })
        {
            return Reply::new(
                ReplyCode::NO_SUCH_STREAM,
                format!("stream {id} was closed while starting"),
            );
        }
        match run(&*self.backend, &mut e, &ends, self.config.send_timeout()) {
            Ok(handle) => {
                self.metrics.streams_active.inc();
                e.mark_active();
                e.run = Run::Running { handle, ends };
                Reply::ok("started")
            }
            Err(err) => {
                drop(e);
                self.start_failed(entry, cancel, err.clone());
                Reply::new(ReplyCode::INTERNAL_ERROR, err)
            }
        }
    }

    /// A `START` failed: the entry is failed and gives its reservation back (unless it was
    /// closed meanwhile, which did both).
    fn start_failed(&self, entry: &Mutex<Entry>, cancel: &AtomicBool, why: String) {
        let mut e = lock(entry);
        if cancel.load(Ordering::Acquire)
            || !matches!(e.run, Run::Starting { .. } | Run::Waiting { .. })
        {
            return;
        }
        self.fail(&mut e, why);
    }

    /// The entry failed: it says why, gives its reservation back, and is forgotten later.
    fn fail(&self, e: &mut Entry, why: String) {
        e.run = Run::Failed(why);
        e.ended = Some(Instant::now());
        self.release(e);
        self.notify_ended();
    }

    /// Gives an entry's admission reservation back: its ticket (a running engine stream's is
    /// given back with its handle, which the caller has dropped or is dropping).
    fn release(&self, e: &mut Entry) {
        drop(e.ticket.take());
        e.admitted = false;
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
                let offset =
                    e.offset_bytes + handle.counters().bytes_sent + handle.lateness().bytes_skipped;
                e.mark_idle();
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
                e.mark_active();
                e.run = Run::Running { handle, ends };
                Reply::ok("resumed")
            }
            Run::Paused { handle: None, ends } => {
                match run(&*self.backend, &mut e, &ends, self.config.send_timeout()) {
                    Ok(handle) => {
                        self.metrics.streams_active.inc();
                        e.mark_active();
                        e.run = Run::Running { handle, ends };
                        Reply::ok("resumed")
                    }
                    Err(err) => {
                        self.fail(&mut e, err.clone());
                        Reply::new(ReplyCode::INTERNAL_ERROR, err)
                    }
                }
            }
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
        let Some(slot) = lock(&self.table).remove(&id.0) else {
            return Reply::new(ReplyCode::NO_SUCH_STREAM, format!("no stream {id}"));
        };
        let sent = self.finish_entry(&slot.entry, now);
        Reply::ok(format!("closed {id} sent={sent}"))
    }

    fn finish_entry(&self, e: &Mutex<Entry>, now: bool) -> u64 {
        let mut e = lock(e);
        self.stop(&mut e, Run::Done, now);
        self.release(&mut e);
        self.notify_ended();
        e.sent_bytes()
    }

    /// Stops whatever an entry runs — a `START` under way, its engine stream (folding what it
    /// sent into the entry, see [`Streams::stop_engine`]) — and leaves it in state `then`.
    fn stop(&self, e: &mut Entry, then: Run, now: bool) {
        e.cancel_start();
        e.mark_idle();
        let handle = match std::mem::replace(&mut e.run, then) {
            Run::Running { handle, .. } => {
                self.metrics.streams_active.dec();
                Some(handle)
            }
            Run::Paused { handle, .. } => handle,
            _ => None,
        };
        if let Some(handle) = handle {
            self.stop_engine(e, handle, now);
        }
    }

    /// Cancels an entry's engine stream and folds what it sent into the entry's counts and
    /// offset (waiting, unless `now`, at most [`CLOSE_WAIT`] for its in-flight operations).
    fn stop_engine(&self, e: &mut Entry, handle: Handle, now: bool) {
        handle.cancel();
        if !now {
            // As in `suspend`: the counters are final once the report is in. A cancelled
            // stream reports as soon as its in-flight operations complete; bounded all the
            // same (the count is then as of the cancel). With `now` the engine finishes the
            // in-flight operations on its own; the handle's drop does not wait for them.
            let _ = handle.wait_timeout(CLOSE_WAIT);
        }
        let sent = handle.counters().bytes_sent;
        let last = handle.lateness();
        self.metrics
            .add_lateness(&e.disk_class(), &last, &mut e.lateness_seen);
        e.keep_lateness(&last);
        // Units skipped (`late=skip`) were moved past too.
        let moved = sent + last.bytes_skipped;
        e.sent_before_bytes += sent;
        e.offset_bytes += moved;
        if let Some(r) = &mut e.remaining_bytes {
            *r = r.saturating_sub(moved);
        }
    }

    /// Stops a stream and keeps it, `failed` with the error "cancelled" (the C library's
    /// `penstock_stream_cancel`; `CLOSE` also forgets it). In-flight I/O completes first.
    pub fn cancel(&self, caller: Caller, id: StreamId) -> Reply {
        let e = match self.get(caller, id) {
            Ok(e) => e,
            Err(r) => return r,
        };
        let mut e = lock(&e);
        if e.state().is_final() {
            return Reply::new(
                ReplyCode::WRONG_STATE,
                format!("stream {id} is {} already", e.state_name()),
            );
        }
        self.stop(&mut e, Run::Pending, false);
        self.fail(&mut e, "cancelled".into());
        Reply::ok(format!(
            "cancelled {id} sent={} offset={}",
            e.sent_bytes(),
            e.offset_bytes
        ))
    }

    /// [`Streams::state`] of one stream as values.
    pub fn status(&self, caller: Caller, id: StreamId) -> Result<StreamStatus, Reply> {
        let e = self.get(caller, id)?;
        let e = lock(&e);
        let mut st = e.status();
        st.pace_bytes_per_s = planned_schedule(&*self.backend, &e)
            .map(|s| penstock_core::stream::plan::schedule_bytes_per_s(&s));
        Ok(st)
    }

    /// Waits until stream `id` is done or failed, at most `timeout` (`None`: for as long as
    /// it takes): its final status, or `Ok(None)` at the timeout. A stream closed meanwhile is
    /// answered like any unknown one (404).
    pub fn wait(
        &self,
        caller: Caller,
        id: StreamId,
        timeout: Option<Duration>,
    ) -> Result<Option<StreamStatus>, Reply> {
        self.wait_until(timeout, || {
            let st = self.status(caller, id)?;
            Ok(st.state.is_final().then_some(st))
        })
    }

    /// Waits until no stream is starting, waiting for its peer or running (pending and paused
    /// ones move nothing until told, and do not count), at most `timeout`: whether that came
    /// (a graceful stop: the C library's `penstock_engine_drain`).
    pub fn wait_idle(&self, timeout: Option<Duration>) -> bool {
        let busy = || {
            let entries: Vec<Arc<Mutex<Entry>>> = lock(&self.table)
                .values()
                .map(|s| s.entry.clone())
                .collect();
            entries.iter().any(|e| {
                matches!(
                    lock(e).run,
                    Run::Starting { .. } | Run::Waiting { .. } | Run::Running { .. }
                )
            })
        };
        matches!(
            self.wait_until(timeout, || Ok::<_, Reply>((!busy()).then_some(()))),
            Ok(Some(()))
        )
    }

    /// Calls `look` until it gives a value (or an error), sleeping between looks until a
    /// stream ends (or 200 ms pass), at most `timeout`: `Ok(None)` at the timeout.
    fn wait_until<T>(
        &self,
        timeout: Option<Duration>,
        mut look: impl FnMut() -> Result<Option<T>, Reply>,
    ) -> Result<Option<T>, Reply> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let seen = *lock(&self.ended_count);
            if let Some(v) = look()? {
                return Ok(Some(v));
            }
            let count = lock(&self.ended_count);
            if *count != seen {
                continue; // something ended between the look and the lock: look again
            }
            // Bounded slices, so that a change that ends nothing is seen too.
            let slice = match deadline {
                None => Duration::from_millis(200),
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => left.min(Duration::from_millis(200)),
                    _ => return Ok(None),
                },
            };
            drop(
                self.ended
                    .wait_timeout(count, slice)
                    .unwrap_or_else(|p| p.into_inner()),
            );
        }
    }

    /// Adds the streams `f` lists to `STATE *` (for authenticated callers): an RTSP
    /// server's sessions, which live in its own table.
    pub fn add_state_source(&self, f: StateSource) {
        lock(&self.others).push(f);
    }

    /// `STATE`: one line per selected stream.
    pub fn state(&self, caller: Caller, sel: &StreamSelector) -> Reply {
        let lines: Vec<String> = match sel {
            StreamSelector::All => {
                let mut all: Vec<(u64, Arc<Mutex<Entry>>)> = lock(&self.table)
                    .iter()
                    .filter(|(_, s)| s.owner == caller.conn || caller.may_drive_any())
                    .map(|(k, s)| (*k, s.entry.clone()))
                    .collect();
                all.sort_by_key(|(k, _)| *k);
                let mut lines: Vec<String> = all
                    .into_iter()
                    .map(|(_, e)| lock(&e).state_line(&*self.backend))
                    .collect();
                // Every stream after AUTH: the RTSP sessions too (docs/control-protocol.md).
                if caller.may_drive_any() {
                    for f in lock(&self.others).iter() {
                        lines.extend(f());
                    }
                }
                lines
            }
            StreamSelector::Ids(ids) => ids
                .iter()
                .map(|id| match self.get(caller, *id) {
                    Ok(e) => lock(&e).state_line(&*self.backend),
                    Err(r) if r.code == ReplyCode::AUTH_REQUIRED => format!("{id} forbidden"),
                    Err(_) => format!("{id} unknown"),
                })
                .collect(),
        };
        let n = lines.len();
        Reply::multi(ReplyCode::STATE, lines, format!("end {n}"))
    }

    /// `TUNE disk`: changes the engine's disk scheduler settings (a query when nothing is
    /// asked), replying with those in force. Who may is the control server's decision.
    pub fn tune_disk(&self, t: &DiskTune) -> Reply {
        let asked = DiskTuning {
            rt_quantum_bytes: t.rt_quantum_bytes,
            bulk_quantum_bytes: t.bulk_quantum_bytes,
            disk_inflight_max: t.inflight_max,
            named_quanta: t.class_quanta.clone(),
        };
        match self.backend.tune_disk(&asked) {
            Ok(d) => {
                let mut line = format!(
                    "disk rt_quantum={} bulk_quantum={} inflight={}",
                    d.rt_quantum_bytes, d.bulk_quantum_bytes, d.disk_inflight_max
                );
                for (name, q) in &d.named_quanta {
                    line.push_str(&format!(" {name}_quantum={q}"));
                }
                Reply::ok(line)
            }
            Err(e) => Reply::new(ReplyCode::BAD_SYNTAX, format!("TUNE disk refused: {e}")),
        }
    }

    /// `STATS` lines (the control server adds its own).
    pub fn stats_lines(&self) -> Vec<String> {
        let entries: Vec<Arc<Mutex<Entry>>> = lock(&self.table)
            .values()
            .map(|s| s.entry.clone())
            .collect();
        let mut counts = [0usize; 5];
        for e in &entries {
            let i = match lock(e).run {
                Run::Pending | Run::Starting { .. } | Run::Waiting { .. } => 0,
                Run::Running { .. } => 1,
                Run::Paused { .. } => 2,
                Run::Done => 3,
                Run::Failed(_) => 4,
            };
            counts[i] += 1;
        }
        let admitted = entries.iter().filter(|e| lock(e).admitted).count();
        let (u, cap) = self.backend.admission_usage();
        // Per disk class: its quantum and the table's streams in it now.
        let settings = self.backend.disk_settings();
        let class_names: Vec<String> = entries.iter().map(|e| lock(e).class.to_string()).collect();
        let classes: Vec<String> = self
            .backend
            .disk_classes()
            .into_iter()
            .map(|name| {
                let quantum = match name.as_str() {
                    "rt" => settings.rt_quantum_bytes,
                    "bulk" => settings.bulk_quantum_bytes,
                    _ => settings
                        .named_quanta
                        .iter()
                        .find(|(n, _)| *n == name)
                        .map_or(0, |(_, q)| *q),
                };
                let streams = class_names.iter().filter(|c| **c == name).count();
                format!("disk_class {name} quantum={quantum} streams={streams}")
            })
            .collect();
        vec![
            format!("streams {}", entries.len()),
            format!("streams_pending {}", counts[0]),
            format!("streams_running {}", counts[1]),
            format!("streams_paused {}", counts[2]),
            format!("streams_done {}", counts[3]),
            format!("streams_failed {}", counts[4]),
            format!("admitted {admitted}"),
            format!(
                "rt_disk_ns_per_s {} of {}",
                u.disk_ns_per_s, cap.disk_ns_per_s
            ),
            format!(
                "rt_net_bytes_per_s {} of {}",
                u.net_bytes_per_s, cap.net_bytes_per_s
            ),
            format!("rt_buffers {} of {}", u.buffers, cap.buffers),
            format!("rt_cpu_ns_per_s {} of {}", u.cpu_ns_per_s, cap.cpu_ns_per_s),
            format!(
                "rt_burst_net_bytes {} of {}",
                u.burst_net_bytes, cap.burst_net_bytes
            ),
            format!("rt_burst_cpu_ns {} of {}", u.burst_cpu_ns, cap.burst_cpu_ns),
        ]
        .into_iter()
        .chain(classes)
        .chain(self.backend.disk_usage().into_iter().map(|d| {
            format!(
                "rt_disk_device {} {} of {} figures={} seq_bytes_per_s={} iops={}",
                d.device.name(),
                d.used_ns_per_s,
                cap.disk_ns_per_s,
                d.figures.source.label(),
                d.figures.disk.seq_bytes_per_s,
                d.figures.disk.random_iops
            )
        }))
        .chain(self.disk_lines())
        .collect()
    }

    fn disk_lines(&self) -> [String; 3] {
        let d = self.backend.disk_settings();
        [
            format!("disk_rt_quantum_bytes {}", d.rt_quantum_bytes),
            format!("disk_bulk_quantum_bytes {}", d.bulk_quantum_bytes),
            format!("disk_inflight_max {}", d.disk_inflight_max),
        ]
    }

    /// A control connection ended: its streams not opened `DETACHED` are closed (at once).
    pub fn connection_closed(&self, conn: u64) {
        let mine: Vec<Slot> = {
            let mut t = lock(&self.table);
            for s in t.values_mut() {
                if s.owner == conn && s.detached && !s.reachable_when_orphaned {
                    s.unreachable = true;
                }
            }
            let ids: Vec<u64> = t
                .iter()
                .filter(|(_, s)| s.owner == conn && !s.detached)
                .map(|(k, _)| *k)
                .collect();
            ids.iter().filter_map(|k| t.remove(k)).collect()
        };
        for s in mine {
            self.finish_entry(&s.entry, true);
        }
    }

    /// No stream is open (the reaper then polls less often).
    pub fn is_empty(&self) -> bool {
        lock(&self.table).is_empty()
    }

    /// Streams in the table now.
    pub fn len(&self) -> usize {
        lock(&self.table).len()
    }

    /// Moves finished engine streams to `done`/`failed` and closes their endpoints (so a
    /// receiver sees EOF). Called by the control server's reaper every few milliseconds.
    ///
    /// Also expires what would otherwise hold places for good: a stream not started within
    /// `pending_timeout_ms` is closed (its reservation returns), and a finished one is
    /// forgotten that long after it ended.
    pub fn reap(&self) {
        let entries: Vec<(u64, bool, bool, Arc<Mutex<Entry>>)> = lock(&self.table)
            .iter()
            .map(|(k, s)| (*k, s.expires, s.unreachable, s.entry.clone()))
            .collect();
        let linger = self.config.pending_timeout();
        let mut expired = Vec::new();
        for (k, expires, unreachable, e) in entries {
            let Ok(mut e) = e.try_lock() else { continue };
            e.feed_lateness(&self.metrics);
            let result = e.handle().and_then(|h| h.wait_timeout(Duration::ZERO));
            if let Some(result) = result {
                self.finished(&mut e, result);
            }
            let idle = matches!(
                e.run,
                Run::Pending | Run::Paused { .. } | Run::Done | Run::Failed(_)
            );
            if unreachable && idle {
                expired.push(k);
                continue;
            }
            if !expires {
                continue;
            }
            let stale = match (&e.run, e.ended) {
                (Run::Pending, _) => e.created.elapsed() > linger,
                (Run::Done | Run::Failed(_), Some(at)) => at.elapsed() > linger,
                _ => false,
            };
            if stale {
                expired.push(k);
            }
        }
        if expired.is_empty() {
            return;
        }
        let gone: Vec<Slot> = {
            let mut t = lock(&self.table);
            expired.iter().filter_map(|k| t.remove(k)).collect()
        };
        for s in gone {
            tracing::debug!(id = lock(&s.entry).id.0, "control stream expired");
            self.finish_entry(&s.entry, true);
        }
    }

    /// The engine stream of a running or engine-paused entry reported `result`: the entry is
    /// done or failed.
    fn finished(&self, e: &mut Entry, result: Result<StreamReport, StreamError>) {
        e.feed_lateness(&self.metrics);
        if matches!(e.run, Run::Running { .. }) {
            self.metrics.streams_active.dec();
        }
        e.mark_idle();
        // The report's count is final; the counters agree once it is in.
        let sent = e.engine_sent_bytes();
        let last = e.handle().map(|h| h.lateness()).unwrap_or_default();
        e.keep_lateness(&last);
        e.ended = Some(Instant::now());
        self.release(e);
        e.run = match result {
            Ok(report) => {
                let sent = report.bytes.max(sent);
                let moved = sent + last.bytes_skipped;
                e.sent_before_bytes += sent;
                e.offset_bytes += moved;
                if let Some(r) = &mut e.remaining_bytes {
                    *r = r.saturating_sub(moved);
                }
                Run::Done
            }
            Err(err) => {
                e.sent_before_bytes += sent;
                Run::Failed(err.to_string())
            }
        };
        self.notify_ended();
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
                self.fail(e, err.clone());
                Err(Reply::new(ReplyCode::INTERNAL_ERROR, err))
            }
        }
    }

    /// Cancels every stream (shutdown: waiters stop waiting too) and waits for each at most
    /// `deadline` in total; an entry whose lock is busy past the deadline is left to the
    /// engine's own shutdown.
    pub fn shutdown(&self, deadline: Duration) {
        let start = Instant::now();
        self.stopping.store(true, Ordering::Release);
        let entries: Vec<Arc<Mutex<Entry>>> =
            lock(&self.table).drain().map(|(_, s)| s.entry).collect();
        for e in entries {
            let mut e = loop {
                match e.try_lock() {
                    Ok(g) => break Some(g),
                    Err(std::sync::TryLockError::Poisoned(p)) => break Some(p.into_inner()),
                    Err(std::sync::TryLockError::WouldBlock) if start.elapsed() < deadline => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(std::sync::TryLockError::WouldBlock) => break None,
                }
            };
            let Some(e) = e.as_mut() else { continue };
            e.cancel_start();
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
