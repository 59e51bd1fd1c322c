//! The HTTP/1.1 server: N worker threads, each with its own epoll loop and its own
//! SO_REUSEPORT listener on the same address (the kernel spreads new connections), so
//! workers share nothing on the request path but the configuration snapshot and the metrics.
//!
//! # A connection
//! `Reading` (bytes → [`penstock_core::http::parse_request`]) → `Sending` (the head, then the
//! body pieces: memory with `send`, file extents with `sendfile` from this loop) → back to
//! `Reading` for keep-alive and pipelined requests, or closed. A body of at least
//! `engine_body_bytes_min` bytes without a rate limit is handed to the engine instead
//! (`Engine::open_reserved` with a `dup` of the socket, so the connection survives for
//! keep-alive): the connection leaves epoll (`Engine` state) until the engine's report says
//! the extent went out. The engine's worker writes the loop's waker eventfd right after the
//! report ([`penstock_driver::StreamHandle::notify_when_done`]); the loop then collects the
//! reports, and also at every sweep (a fallback that costs one `try_recv` per body). Before,
//! the loop woke every 1 ms while such bodies existed: 1,000 wake-ups a second per worker
//! for nothing during a long download.
//!
//! Whether the engine takes a body is settled before its head is made: an engine place is
//! reserved then (`Engine::reserve_stream`); with none free the loop sends the body itself
//! (counted as `engine_full`), and a path the engine cannot run is a 503 with `Retry-After`.
//! A client never gets a 200/206 head whose body the engine then refuses. The engine stream
//! carries `send_timeout` as its progress timeout: a client that stops reading is cut.
//!
//! # Bounds
//! - An idle connection holds a slot (a few dozen bytes) and no buffer: the read buffer is
//!   freed whenever it is empty, and reads go through one scratch buffer per worker.
//! - A connection's read buffer never exceeds `header_bytes_max` + the scratch size.
//! - Every state has a deadline: `idle_timeout` from when the loop starts waiting for a
//!   request head, however slowly its bytes come (slowloris), and `send_timeout` from the
//!   last progress of a response. A sweep every `idle_timeout / 8` (10 ms ..= 1 s) cuts the
//!   late ones; sweeping all slots is cheap next to keeping a timer per connection.
//! - Each turn serves at most `BUDGET_SYSCALLS` send calls per connection, then moves on.
//! - `connections_max` across all workers; beyond it a new connection gets a 503 and is
//!   closed at once.
//! - Out of a resource accept needs (EMFILE, ENFILE, ENOBUFS, ENOMEM), a worker takes its
//!   listener out of epoll for `accept_backoff_ms` (as nginx's `ngx_event_accept.c` does), and
//!   puts it back after: retrying at once spins, as the listener stays readable while its
//!   backlog waits (issue 20 measured 16.8 CPU-seconds in 10 s and 4.28 M log lines in 12 s
//!   with 256 descriptors and 400 idle clients; docs/http.md has this fix's figures). Failures
//!   are logged as one line per worker per `ACCEPT_LOG_INTERVAL` at most, with their count by
//!   errno since the last line.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::fs::File;
use std::io::{self, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use penstock_core::http::{
    BodyPiece, ConnectionHeader, FileMeta, HttpError, Method, Parsed, Request, ResponseContext,
    ResponseHead, Status, boundary_for, content_type_for_path, parse_request, respond_error,
    respond_file, write_response_head,
};
use penstock_core::stream::{CachePolicy, Extent, IoKind, PathChoice, choose_path};
use penstock_driver::engine::StreamSlot;
use penstock_driver::open::Opened as EngineOpened;
use penstock_driver::{Engine, StreamError, StreamHandle, StreamSpec};
use rustix::event::epoll;
use rustix::io::Errno;
use rustix::net::SendFlags;

use crate::config::LiveConfig;
use crate::confine::{Opened, Refused, Root};
use crate::metrics::Metrics;

const TOKEN_LISTENER: u64 = u64::MAX;
const TOKEN_WAKER: u64 = u64::MAX - 1;
/// Send calls per connection per turn before the loop serves the others.
const BUDGET_SYSCALLS: usize = 16;
/// Bytes per sendfile call from the loop (the socket buffer usually takes less).
const SENDFILE_CHUNK_BYTES: u64 = 4 << 20;
const SCRATCH_BYTES: usize = 16 * 1024;
const EVENTS_MAX: usize = 256;
const ACCEPTS_PER_TURN: usize = 64;
/// At most one log line about failed accepts per worker per interval.
const ACCEPT_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Distinct errnos counted between two log lines (more are lumped into the last).
const ACCEPT_ERRNOS_MAX: usize = 8;

/// What the workers share.
pub(crate) struct HttpShared {
    live: Mutex<Arc<LiveConfig>>,
    live_version: AtomicU64,
    pub(crate) root: Root,
    pub(crate) index: Option<String>,
    pub(crate) server_name: String,
    pub(crate) metrics_path: String,
    pub(crate) engine_body_bytes_min: u64,
    pub(crate) body_path: PathChoice,
    pub(crate) engine: Arc<Engine>,
    pub(crate) metrics: Arc<Metrics>,
    conns: AtomicUsize,
    /// Stop accepting, close idle connections, close each busy one after its response.
    stopping: AtomicBool,
    /// Close everything now.
    cut: AtomicBool,
    wakers: Mutex<Vec<OwnedFd>>,
}

impl HttpShared {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        live: LiveConfig,
        root: Root,
        index: Option<String>,
        server_name: String,
        metrics_path: String,
        engine_body_bytes_min: u64,
        body_path: PathChoice,
        engine: Arc<Engine>,
        metrics: Arc<Metrics>,
    ) -> HttpShared {
        HttpShared {
            live: Mutex::new(Arc::new(live)),
            live_version: AtomicU64::new(0),
            root,
            index,
            server_name,
            metrics_path,
            engine_body_bytes_min,
            body_path,
            engine,
            metrics,
            conns: AtomicUsize::new(0),
            stopping: AtomicBool::new(false),
            cut: AtomicBool::new(false),
            wakers: Mutex::new(Vec::new()),
        }
    }

    fn live(&self) -> Arc<LiveConfig> {
        self.live.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces the live configuration; workers pick it up on their next turn.
    pub(crate) fn set_live(&self, live: LiveConfig) {
        *self.live.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(live);
        self.live_version.fetch_add(1, Ordering::Release);
        self.wake();
    }

    pub(crate) fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        self.wake();
    }

    pub(crate) fn cut(&self) {
        self.cut.store(true, Ordering::Release);
        self.wake();
    }

    pub(crate) fn connections(&self) -> usize {
        self.conns.load(Ordering::Relaxed)
    }

    fn wake(&self) {
        for w in self.wakers.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            // A full eventfd counter still wakes the loop.
            let _ = rustix::io::write(w, &1u64.to_ne_bytes());
        }
    }
}

/// Binds `workers` SO_REUSEPORT listeners on `addr` (the first decides the port when it is
/// 0) and starts one loop thread per listener. Returns the bound address and the threads.
pub(crate) fn start(
    shared: Arc<HttpShared>,
    addr: SocketAddr,
    workers: usize,
) -> io::Result<(SocketAddr, Vec<JoinHandle<()>>)> {
    if addr.port() != 0 {
        port_is_free(addr)?;
    }
    let mut bound = addr;
    let mut listeners = Vec::new();
    for _ in 0..workers.max(1) {
        let l = reuseport_listener(bound)?;
        bound = l.local_addr()?;
        listeners.push(l);
    }
    let mut threads = Vec::new();
    for (i, l) in listeners.into_iter().enumerate() {
        let mut w = Worker::new(shared.clone(), l, i)?;
        let t = std::thread::Builder::new()
            .name(format!("penstock-http-{i}"))
            .spawn(move || w.run())?;
        threads.push(t);
    }
    Ok((bound, threads))
}

/// SO_REUSEPORT lets any process of the same user join a port silently (a second `penstock
/// serve` on the same address would take half the connections): before the workers bind
/// their group, a socket without SO_REUSEPORT must be able to bind the address, which fails
/// with "address in use" while anyone listens there (as nginx and the control port do).
fn port_is_free(addr: SocketAddr) -> io::Result<()> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM.cloexec(), None)?;
    s.set_reuse_address(true)?;
    s.bind(&addr.into())
}

fn reuseport_listener(addr: SocketAddr) -> io::Result<TcpListener> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM.cloexec(), None)?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(4096)?;
    Ok(s.into())
}

/// The policy bits a response keeps after the request is gone.
struct Out {
    head: Vec<u8>,
    head_pos: usize,
    pieces: VecDeque<BodyPiece>,
    /// Bytes of the front piece already sent.
    piece_pos: u64,
    file: Option<File>,
    file_label: String,
    keep_alive: bool,
    class: Arc<str>,
    /// `sendfile`, `memory` or `none`; becomes `engine-<path>` on hand-off.
    path_label: &'static str,
    body_sent: u64,
    rate: Option<RateLimit>,
    /// The engine place reserved for the (single, file) body, before the head was made: hand
    /// the body to the engine once the head is out. Given back when the response is dropped.
    to_engine: Option<StreamSlot>,
    status: Status,
}

/// nginx's `limit_rate` / `limit_rate_after`: the first `after_bytes` go at full speed, then
/// at most `bytes_per_s`, measured from the moment `after_bytes` were sent.
#[derive(Debug, Clone, Copy)]
struct RateLimit {
    bytes_per_s: u64,
    after_bytes: u64,
    rate_start: Option<Instant>,
}

impl RateLimit {
    /// Bytes that may go now (`body_sent` so far), or when to come back.
    fn allowance(&mut self, now: Instant, body_sent: u64) -> Result<u64, Instant> {
        if body_sent < self.after_bytes {
            return Ok(self.after_bytes - body_sent);
        }
        let start = *self.rate_start.get_or_insert(now);
        let elapsed_ns = now.duration_since(start).as_nanos();
        let credit = u128::from(self.bytes_per_s) * elapsed_ns / 1_000_000_000;
        let sent_limited = u128::from(body_sent - self.after_bytes);
        // Let a burst of 1/20 s (at least 1 KiB) through at once to keep calls few.
        let burst = (self.bytes_per_s / 20).max(1024);
        let allowed = credit + u128::from(burst);
        if allowed > sent_limited {
            Ok(u64::try_from(allowed - sent_limited).unwrap_or(u64::MAX))
        } else {
            let wait_ns = (sent_limited - credit) * 1_000_000_000 / u128::from(self.bytes_per_s);
            Err(now
                + Duration::from_nanos(u64::try_from(wait_ns).unwrap_or(u64::MAX))
                + Duration::from_millis(1))
        }
    }
}

struct EngineBody {
    handle: StreamHandle,
    keep_alive: bool,
    class: Arc<str>,
    path_label: &'static str,
    status: Status,
    head_bytes: u64,
}

enum State {
    Reading,
    Sending(Box<Out>),
    Engine(Box<EngineBody>),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Interest {
    Read,
    Write,
    /// Registered with no events (waiting for a rate timer); HUP and ERR still arrive.
    Nothing,
    /// Not in epoll (the engine holds the body).
    Removed,
}

struct Conn {
    sock: TcpStream,
    inbuf: Vec<u8>,
    requests: u32,
    state: State,
    deadline: Instant,
    interest: Interest,
    peer_eof: bool,
}

struct Slot {
    generation: u32,
    conn: Option<Conn>,
}

enum Progress {
    Done,
    WouldBlock,
    RateWait(Instant),
    Yield,
    HandOff,
    Failed(&'static str),
}

struct Worker {
    shared: Arc<HttpShared>,
    epoll: OwnedFd,
    listener: Option<TcpListener>,
    waker: OwnedFd,
    slots: Vec<Slot>,
    free: Vec<u32>,
    ready: Vec<(u32, u32)>,
    timers: BinaryHeap<Reverse<(Instant, u32, u32)>>,
    engine_conns: Vec<(u32, u32)>,
    /// The waker, for engine workers to write when a body's report is ready.
    engine_waker: Arc<OwnedFd>,
    /// Woken since the last look at the engine bodies' reports.
    engine_woken: bool,
    live: Arc<LiveConfig>,
    live_version: u64,
    next_sweep: Instant,
    boundary_seed: u64,
    scratch: Box<[u8]>,
    /// This worker's number (log lines).
    index: usize,
    /// While set, the listener is out of epoll until then (see the module doc).
    accept_paused_until: Option<Instant>,
    accept_failures: AcceptFailures,
}

/// Failed accepts counted between two log lines.
struct AcceptFailures {
    /// (errno, count) since the last line; at most `ACCEPT_ERRNOS_MAX` entries.
    counts: Vec<(Errno, u64)>,
    /// No line before then.
    next_log: Instant,
}

impl AcceptFailures {
    fn add(&mut self, e: Errno) {
        if let Some(c) = self.counts.iter_mut().find(|(x, _)| *x == e) {
            c.1 += 1;
        } else if self.counts.len() < ACCEPT_ERRNOS_MAX {
            self.counts.push((e, 1));
        } else if let Some(last) = self.counts.last_mut() {
            last.1 += 1;
        }
    }

    /// One warn line with the counts since the last one, if any and if the interval allows.
    /// Returns whether it wrote one.
    fn report(&mut self, now: Instant, worker: usize, backoff: Duration) -> bool {
        if self.counts.is_empty() || now < self.next_log {
            return false;
        }
        let failed: u64 = self.counts.iter().map(|c| c.1).sum();
        let errors = self
            .counts
            .iter()
            .map(|(e, n)| format!("{} x{n}", errno_name(*e)))
            .collect::<Vec<_>>()
            .join(", ");
        tracing::warn!(
            worker,
            failed,
            errors = %errors,
            backoff_ms = backoff.as_millis() as u64,
            "HTTP accepts failed since the last report (at most one a {} s); out of descriptors or memory, accepting pauses for backoff_ms",
            ACCEPT_LOG_INTERVAL.as_secs()
        );
        self.counts.clear();
        self.next_log = now + ACCEPT_LOG_INTERVAL;
        true
    }
}

/// What a failed accept means for the listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AcceptFailure {
    /// The pending connection's own trouble (accept(2): Linux passes network errors of the
    /// new socket to accept, "treat them like EAGAIN by retrying"): try the next one.
    Connection,
    /// Out of descriptors or kernel memory, or a reason we do not know: retrying at once
    /// would fail the same way while the listener stays readable. Pause.
    Resource,
}

fn accept_failure(e: Errno) -> AcceptFailure {
    match e {
        Errno::CONNABORTED
        | Errno::PROTO
        | Errno::PERM
        | Errno::NETDOWN
        | Errno::NOPROTOOPT
        | Errno::HOSTDOWN
        | Errno::NONET
        | Errno::HOSTUNREACH
        | Errno::OPNOTSUPP
        | Errno::NETUNREACH
        | Errno::TIMEDOUT => AcceptFailure::Connection,
        _ => AcceptFailure::Resource,
    }
}

/// `EMFILE` and so on: the name, for logs and metric labels.
fn errno_name(e: Errno) -> std::borrow::Cow<'static, str> {
    let name = match e {
        Errno::MFILE => "EMFILE",
        Errno::NFILE => "ENFILE",
        Errno::NOBUFS => "ENOBUFS",
        Errno::NOMEM => "ENOMEM",
        Errno::CONNABORTED => "ECONNABORTED",
        Errno::PROTO => "EPROTO",
        Errno::PERM => "EPERM",
        Errno::NETDOWN => "ENETDOWN",
        Errno::NOPROTOOPT => "ENOPROTOOPT",
        Errno::HOSTDOWN => "EHOSTDOWN",
        Errno::NONET => "ENONET",
        Errno::HOSTUNREACH => "EHOSTUNREACH",
        Errno::OPNOTSUPP => "EOPNOTSUPP",
        Errno::NETUNREACH => "ENETUNREACH",
        Errno::TIMEDOUT => "ETIMEDOUT",
        e => return format!("errno {}", e.raw_os_error()).into(),
    };
    name.into()
}

fn token(idx: u32, generation: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(idx)
}

impl Worker {
    fn new(shared: Arc<HttpShared>, listener: TcpListener, i: usize) -> io::Result<Worker> {
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        epoll::add(
            &epoll,
            &listener,
            epoll::EventData::new_u64(TOKEN_LISTENER),
            epoll::EventFlags::IN,
        )?;
        let waker = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )?;
        epoll::add(
            &epoll,
            &waker,
            epoll::EventData::new_u64(TOKEN_WAKER),
            epoll::EventFlags::IN,
        )?;
        shared
            .wakers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(waker.try_clone()?);
        let engine_waker = Arc::new(waker.try_clone()?);
        let live = shared.live();
        let live_version = shared.live_version.load(Ordering::Acquire);
        let seed = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ ((i as u64) << 56);
        Ok(Worker {
            shared,
            epoll,
            listener: Some(listener),
            waker,
            slots: Vec::new(),
            free: Vec::new(),
            ready: Vec::new(),
            timers: BinaryHeap::new(),
            engine_conns: Vec::new(),
            engine_waker,
            engine_woken: false,
            live,
            live_version,
            next_sweep: Instant::now(),
            boundary_seed: seed,
            scratch: vec![0u8; SCRATCH_BYTES].into_boxed_slice(),
            index: i,
            accept_paused_until: None,
            accept_failures: AcceptFailures {
                counts: Vec::new(),
                next_log: Instant::now(),
            },
        })
    }

    fn sweep_interval(&self) -> Duration {
        (self.live.limits.idle_timeout() / 8)
            .clamp(Duration::from_millis(10), Duration::from_secs(1))
    }

    fn run(&mut self) {
        let mut events: Vec<epoll::Event> = Vec::with_capacity(EVENTS_MAX);
        loop {
            if self.shared.cut.load(Ordering::Acquire) {
                self.close_all();
                return;
            }
            if self.shared.stopping.load(Ordering::Acquire) {
                self.begin_stop();
                if self.live_conns() == 0 {
                    return;
                }
            }
            let v = self.shared.live_version.load(Ordering::Acquire);
            if v != self.live_version {
                self.live = self.shared.live();
                self.live_version = v;
            }
            let now = Instant::now();
            let mut timeout = self.next_sweep.saturating_duration_since(now);
            if let Some(Reverse((t, _, _))) = self.timers.peek() {
                timeout = timeout.min(t.saturating_duration_since(now));
            }
            if let Some(t) = self.accept_paused_until {
                timeout = timeout.min(t.saturating_duration_since(now));
            }
            if !self.ready.is_empty() {
                timeout = Duration::ZERO;
            }
            let ts = rustix::time::Timespec {
                tv_sec: timeout.as_secs() as i64,
                tv_nsec: i64::from(timeout.subsec_nanos()),
            };
            events.clear();
            match epoll::wait(
                &self.epoll,
                rustix::buffer::spare_capacity(&mut events),
                Some(&ts),
            ) {
                Ok(_) | Err(Errno::INTR) => {}
                Err(e) => {
                    tracing::error!(error = %e, "epoll_wait failed; worker stops");
                    self.close_all();
                    return;
                }
            }
            for ev in events.iter() {
                let (flags, data) = (ev.flags, ev.data.u64());
                match data {
                    TOKEN_LISTENER => self.accept(),
                    TOKEN_WAKER => {
                        let mut b = [0u8; 8];
                        let _ = rustix::io::read(&self.waker, &mut b);
                        self.engine_woken = true;
                    }
                    t => self.on_event(t as u32, (t >> 32) as u32, flags),
                }
            }
            let ready = std::mem::take(&mut self.ready);
            for (idx, generation) in ready {
                self.drive(idx, generation);
            }
            let now = Instant::now();
            while let Some(Reverse((t, idx, generation))) = self.timers.peek().copied() {
                if t > now {
                    break;
                }
                self.timers.pop();
                self.drive(idx, generation);
            }
            if self.engine_woken && !self.engine_conns.is_empty() {
                self.poll_engine();
            }
            self.engine_woken = false;
            if self.accept_paused_until.is_some_and(|t| now >= t) {
                self.resume_accepting(now);
            }
            if now >= self.next_sweep {
                if !self.engine_conns.is_empty() {
                    self.poll_engine();
                }
                self.sweep(now);
                self.next_sweep = now + self.sweep_interval();
                // The last failures of a burst, once the interval allows.
                let _ =
                    self.accept_failures
                        .report(now, self.index, self.live.limits.accept_backoff());
            }
        }
    }

    fn live_conns(&self) -> usize {
        self.slots.iter().filter(|s| s.conn.is_some()).count()
    }

    fn begin_stop(&mut self) {
        if let Some(l) = self.listener.take() {
            let _ = epoll::delete(&self.epoll, &l);
        }
        // Idle connections (waiting for a head, nothing buffered) go now.
        for idx in 0..self.slots.len() {
            let idle = matches!(
                &self.slots[idx].conn,
                Some(c) if matches!(c.state, State::Reading) && c.inbuf.is_empty()
            );
            if idle {
                self.close(idx as u32);
            }
        }
    }

    fn close_all(&mut self) {
        for idx in 0..self.slots.len() {
            if let Some(c) = &self.slots[idx].conn
                && let State::Engine(e) = &c.state
            {
                e.handle.cancel();
            }
            if self.slots[idx].conn.is_some() {
                self.close(idx as u32);
            }
        }
    }

    /// Takes the listener out of epoll for `accept_backoff_ms`: the loop's wait then ends at
    /// the latest when the pause does ([`Worker::resume_accepting`]).
    fn pause_accepting(&mut self) {
        let Some(l) = &self.listener else { return };
        if self.accept_paused_until.is_some() {
            return;
        }
        // Fails only if it is not registered, which is the state wanted.
        let _ = epoll::delete(&self.epoll, l);
        self.accept_paused_until = Some(Instant::now() + self.live.limits.accept_backoff());
        self.shared.metrics.accept_paused("http");
    }

    /// The pause is over: the listener goes back into epoll (level-triggered, so a waiting
    /// backlog is reported at the next wait).
    fn resume_accepting(&mut self, now: Instant) {
        self.accept_paused_until = None;
        let backoff = self.live.limits.accept_backoff();
        let Some(l) = &self.listener else { return };
        if let Err(e) = epoll::add(
            &self.epoll,
            l,
            epoll::EventData::new_u64(TOKEN_LISTENER),
            epoll::EventFlags::IN,
        ) {
            // ENOMEM or ENOSPC (max_user_watches): try again after another back-off. Counted
            // with the failed accepts in the log line (rate-limited like them).
            self.accept_failures.add(e);
            self.shared.metrics.error("accept_rearm");
            self.accept_paused_until = Some(now + backoff);
            self.shared.metrics.accept_paused("http");
        }
        let _ = self.accept_failures.report(now, self.index, backoff);
    }

    fn accept(&mut self) {
        for _ in 0..ACCEPTS_PER_TURN {
            if self.accept_paused_until.is_some() {
                // An event of the same epoll_wait batch as the failure.
                return;
            }
            let Some(l) = &self.listener else { return };
            // accept4 with SOCK_NONBLOCK: no separate call to make the socket non-blocking.
            let sock = match rustix::net::accept_with(
                l,
                rustix::net::SocketFlags::NONBLOCK | rustix::net::SocketFlags::CLOEXEC,
            ) {
                Ok(fd) => TcpStream::from(fd),
                Err(Errno::AGAIN) => return,
                Err(Errno::INTR) => continue,
                Err(e) => {
                    self.shared.metrics.error("accept");
                    self.shared
                        .metrics
                        .accept_failed("http", &errno_name(e).to_lowercase());
                    self.accept_failures.add(e);
                    let failure = accept_failure(e);
                    if failure == AcceptFailure::Resource {
                        self.pause_accepting();
                    }
                    let _ = self.accept_failures.report(
                        Instant::now(),
                        self.index,
                        self.live.limits.accept_backoff(),
                    );
                    match failure {
                        AcceptFailure::Connection => continue,
                        AcceptFailure::Resource => return,
                    }
                }
            };
            let limits = &self.live.limits;
            if self.shared.conns.fetch_add(1, Ordering::AcqRel) >= limits.connections_max {
                self.shared.conns.fetch_sub(1, Ordering::AcqRel);
                self.shared.metrics.connections_refused.inc();
                let _ = rustix::net::send(
                    &sock,
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    SendFlags::NOSIGNAL,
                );
                continue;
            }
            self.shared.metrics.connections.inc();
            let _ = sock.set_nodelay(true);
            let idx = match self.free.pop() {
                Some(i) => i,
                None => {
                    self.slots.push(Slot {
                        generation: 0,
                        conn: None,
                    });
                    (self.slots.len() - 1) as u32
                }
            };
            let slot = &mut self.slots[idx as usize];
            slot.generation = slot.generation.wrapping_add(1);
            let generation = slot.generation;
            if epoll::add(
                &self.epoll,
                &sock,
                epoll::EventData::new_u64(token(idx, generation)),
                epoll::EventFlags::IN,
            )
            .is_err()
            {
                self.free.push(idx);
                self.release_count();
                continue;
            }
            slot.conn = Some(Conn {
                sock,
                inbuf: Vec::new(),
                requests: 0,
                state: State::Reading,
                deadline: Instant::now() + self.live.limits.idle_timeout(),
                interest: Interest::Read,
                peer_eof: false,
            });
            // A client sends its request right after connecting: read it now rather than a
            // loop turn later (under load a turn is every other connection's work; the probe
            // of `bench http` measured nginx's p99 time to first byte at about half
            // penstock's without this).
            self.on_event(idx, generation, epoll::EventFlags::IN);
        }
    }

    fn release_count(&self) {
        self.shared.conns.fetch_sub(1, Ordering::AcqRel);
        self.shared.metrics.connections.dec();
    }

    fn conn_mut(&mut self, idx: u32, generation: u32) -> Option<&mut Conn> {
        conn_in(&mut self.slots, idx, generation)
    }

    fn on_event(&mut self, idx: u32, generation: u32, flags: epoll::EventFlags) {
        let cap = self.live.limits.header_bytes_max + SCRATCH_BYTES;
        let Some(c) = conn_in(&mut self.slots, idx, generation) else {
            return;
        };
        if matches!(c.state, State::Engine(_)) {
            return;
        }
        let reading = matches!(c.state, State::Reading);
        if flags.intersects(epoll::EventFlags::ERR)
            || (flags.contains(epoll::EventFlags::HUP) && !reading)
        {
            let vanished = matches!(c.state, State::Sending(_));
            self.shared.metrics.error(if vanished {
                "client_vanished"
            } else {
                "socket_error"
            });
            self.close(idx);
            return;
        }
        if reading && flags.intersects(epoll::EventFlags::IN | epoll::EventFlags::HUP) {
            let scratch = &mut self.scratch;
            // Read what is there, up to the cap (the rest waits in the socket).
            while c.inbuf.len() < cap && !c.peer_eof {
                let want = (cap - c.inbuf.len()).min(scratch.len());
                match c.sock.read(&mut scratch[..want]) {
                    Ok(0) => c.peer_eof = true,
                    Ok(n) => {
                        c.inbuf.extend_from_slice(&scratch[..n]);
                        if n < want {
                            break;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        c.peer_eof = true;
                        c.inbuf.clear();
                    }
                }
            }
        }
        self.drive(idx, generation);
    }

    /// Runs a connection's state machine as far as it goes without waiting.
    fn drive(&mut self, idx: u32, generation: u32) {
        let live = self.live.clone();
        let mut budget = 8; // requests per turn (pipelining)
        loop {
            let stopping = self.shared.stopping.load(Ordering::Relaxed);
            let Some(c) = conn_in(&mut self.slots, idx, generation) else {
                return;
            };
            match &mut c.state {
                State::Engine(_) => return,
                State::Reading => {
                    if budget == 0 {
                        self.ready.push((idx, generation));
                        return;
                    }
                    budget -= 1;
                    if c.inbuf.is_empty() && c.inbuf.capacity() > 0 {
                        c.inbuf = Vec::new();
                    }
                    if stopping && c.inbuf.is_empty() {
                        self.close(idx);
                        return;
                    }
                    match parse_request(&c.inbuf, &live.limits.parse_limits()) {
                        Ok(Parsed::Partial) => {
                            if c.peer_eof {
                                if !c.inbuf.is_empty() {
                                    self.shared.metrics.error("incomplete_request");
                                }
                                self.close(idx);
                                return;
                            }
                            let _ = set_interest(
                                &self.epoll,
                                c,
                                token(idx, generation),
                                Interest::Read,
                            );
                            return;
                        }
                        Ok(Parsed::Complete {
                            request,
                            consumed_bytes,
                        }) => {
                            c.inbuf.drain(..consumed_bytes);
                            c.requests += 1;
                            let allowed =
                                c.requests < live.limits.requests_per_connection_max && !stopping;
                            let out = self.respond(&request, allowed, &live);
                            let c = self.conn_mut(idx, generation).expect("present above");
                            c.state = State::Sending(Box::new(out));
                            c.deadline = Instant::now() + live.limits.send_timeout();
                        }
                        Err(e) => {
                            self.shared.metrics.error(error_kind(&e));
                            let ctx = error_ctx(&live);
                            let r = respond_error(e.status(), None, &ctx);
                            let out = Out {
                                head: r.head,
                                head_pos: 0,
                                pieces: r.body.into(),
                                piece_pos: 0,
                                file: None,
                                file_label: String::new(),
                                keep_alive: false,
                                class: Arc::from("none"),
                                path_label: "memory",
                                body_sent: 0,
                                rate: None,
                                to_engine: None,
                                status: r.status,
                            };
                            let c = self.conn_mut(idx, generation).expect("present above");
                            c.inbuf.clear();
                            c.state = State::Sending(Box::new(out));
                            c.deadline = Instant::now() + live.limits.send_timeout();
                        }
                    }
                }
                State::Sending(out) => {
                    let before = out.body_sent + out.head_pos as u64;
                    let p = write_out(&c.sock, out, Instant::now());
                    if out.body_sent + out.head_pos as u64 > before {
                        c.deadline = Instant::now() + live.limits.send_timeout();
                    }
                    match p {
                        Progress::Done => {
                            let State::Sending(out) =
                                std::mem::replace(&mut c.state, State::Reading)
                            else {
                                unreachable!("matched Sending above")
                            };
                            self.shared
                                .metrics
                                .request(&out.class, out.path_label, out.body_sent);
                            if !out.keep_alive || stopping {
                                self.close(idx);
                                return;
                            }
                            let c = self.conn_mut(idx, generation).expect("present above");
                            c.deadline = Instant::now() + live.limits.idle_timeout();
                        }
                        Progress::WouldBlock => {
                            let _ = set_interest(
                                &self.epoll,
                                c,
                                token(idx, generation),
                                Interest::Write,
                            );
                            return;
                        }
                        Progress::RateWait(at) => {
                            let _ = set_interest(
                                &self.epoll,
                                c,
                                token(idx, generation),
                                Interest::Nothing,
                            );
                            self.timers.push(Reverse((at, idx, generation)));
                            return;
                        }
                        Progress::Yield => {
                            self.ready.push((idx, generation));
                            return;
                        }
                        Progress::HandOff => {
                            self.hand_off(idx, generation);
                            return;
                        }
                        Progress::Failed(kind) => {
                            self.shared.metrics.error(kind);
                            self.close(idx);
                            return;
                        }
                    }
                }
            }
        }
    }

    /// The response to one parsed request.
    fn respond(&mut self, req: &Request, keep_alive_allowed: bool, live: &LiveConfig) -> Out {
        self.boundary_seed = self
            .boundary_seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let boundary = boundary_for(self.boundary_seed);
        let shared = self.shared.clone();
        let ctx = ResponseContext {
            date: SystemTime::now(),
            server: &shared.server_name,
            keep_alive_allowed,
            keep_alive_timeout_s: Some(live.limits.idle_timeout_ms / 1000),
            ranges_max: live.limits.ranges_max,
            boundary: &boundary,
        };
        let policy = live.policy(&req.path);
        let class: Arc<str> = Arc::from(policy.class);
        let memory = |r: penstock_core::http::Response, class: Arc<str>| Out {
            head: r.head,
            head_pos: 0,
            pieces: r.body.into(),
            piece_pos: 0,
            file: None,
            file_label: String::new(),
            keep_alive: r.keep_alive,
            class,
            path_label: "memory",
            body_sent: 0,
            rate: None,
            to_engine: None,
            status: r.status,
        };
        if !shared.metrics_path.is_empty() && req.path == shared.metrics_path {
            return memory(self.metrics_response(req, &ctx), Arc::from("metrics"));
        }
        let opened = match shared.root.open_path(req.relative_path()) {
            Ok(Opened::Directory(dir)) => match &shared.index {
                Some(name) => shared
                    .root
                    .open_in(&dir, name)
                    .map(|o| (o, Some(name.as_str()))),
                None => Err(Refused::Forbidden),
            },
            Ok(o) => Ok((o, None)),
            Err(e) => Err(e),
        };
        let (file, len_bytes, mtime, type_name) = match opened {
            Ok((
                Opened::File {
                    file,
                    len_bytes,
                    mtime,
                },
                index,
            )) => (
                file,
                len_bytes,
                mtime,
                index.unwrap_or(&req.path).to_string(),
            ),
            Ok((Opened::Directory(_), _)) | Err(Refused::Forbidden) => {
                shared.metrics.error("forbidden");
                return memory(respond_error(Status::FORBIDDEN, Some(req), &ctx), class);
            }
            Err(Refused::NotFound) => {
                shared.metrics.error("not_found");
                return memory(respond_error(Status::NOT_FOUND, Some(req), &ctx), class);
            }
            Err(Refused::Failed | Refused::Exists) => {
                shared.metrics.error("open_failed");
                return memory(
                    respond_error(Status::INTERNAL_SERVER_ERROR, Some(req), &ctx),
                    class,
                );
            }
        };
        let meta = FileMeta { len_bytes, mtime };
        let r = respond_file(req, &meta, content_type_for_path(&type_name), &ctx);
        if r.status == Status::RANGE_NOT_SATISFIABLE {
            shared.metrics.error("range_not_satisfiable");
        }
        let has_file = r.body.iter().any(|p| matches!(p, BodyPiece::File { .. }));
        let rate = (policy.limit_rate_bytes_per_s > 0).then_some(RateLimit {
            bytes_per_s: policy.limit_rate_bytes_per_s,
            after_bytes: policy.limit_rate_after_bytes,
            rate_start: None,
        });
        let for_engine = shared.engine_body_bytes_min > 0
            && rate.is_none()
            && r.body.len() == 1
            && matches!(r.body[0], BodyPiece::File { len_bytes, .. } if len_bytes >= shared.engine_body_bytes_min);
        // Decided before the head is written: a client never gets a 200/206 head whose body
        // is then cut because the engine refused it. No free engine place: this loop sends
        // the body; a path the engine cannot run here: 503, no body.
        let to_engine = if for_engine {
            let (source, target) = (IoKind::File, IoKind::StreamSocket);
            let caps = shared.engine.caps();
            let path = choose_path(
                shared.body_path,
                source,
                target,
                CachePolicy::Keep,
                caps,
                false,
            );
            match path
                .map_err(StreamError::from)
                .and_then(|_| shared.engine.reserve_stream())
            {
                Ok(slot) => Some(slot),
                Err(StreamError::TooManyStreams(_)) => {
                    shared.metrics.error("engine_full");
                    None
                }
                Err(e) => {
                    // A configuration the engine cannot run (`body_path`): said once, counted
                    // always.
                    static SAID: AtomicBool = AtomicBool::new(false);
                    if !SAID.swap(true, Ordering::Relaxed) {
                        tracing::warn!(error = %e, "the engine cannot take HTTP bodies: answering 503");
                    }
                    shared.metrics.error("engine_refused");
                    return memory(unavailable(req, &ctx), class);
                }
            }
        } else {
            None
        };
        Out {
            head: r.head,
            head_pos: 0,
            pieces: r.body.into(),
            piece_pos: 0,
            file: has_file.then_some(file),
            file_label: req.path.clone(),
            keep_alive: r.keep_alive,
            class,
            path_label: if has_file {
                "sendfile"
            } else if req.method == Method::Head || !r.status.allows_body() {
                "none"
            } else {
                "memory"
            },
            body_sent: 0,
            rate,
            to_engine,
            status: r.status,
        }
    }

    fn metrics_response(
        &self,
        req: &Request,
        ctx: &ResponseContext<'_>,
    ) -> penstock_core::http::Response {
        // Gauges read at scrape time: exact now, no feeder needed.
        self.shared
            .metrics
            .set_disk_queue_depth(self.shared.engine.disk_queue_depth());
        self.shared
            .metrics
            .set_engine_buffers(self.shared.engine.buffer_usage());
        let body = self.shared.metrics.encode().into_bytes();
        let keep_alive = req.keep_alive && ctx.keep_alive_allowed;
        let head = ResponseHead {
            status: Status::OK,
            date: ctx.date,
            server: ctx.server,
            content_type: Some("application/openmetrics-text; version=1.0.0; charset=utf-8"),
            content_length_bytes: Some(body.len() as u64),
            content_range: None,
            accept_ranges: false,
            etag: None,
            last_modified: None,
            allow: None,
            connection: if keep_alive {
                ConnectionHeader::KeepAlive {
                    timeout_s: ctx.keep_alive_timeout_s,
                }
            } else {
                ConnectionHeader::Close
            },
        };
        let mut bytes = Vec::with_capacity(256);
        write_response_head(&head, &mut bytes);
        penstock_core::http::Response {
            status: Status::OK,
            head: bytes,
            body: if req.method == Method::Head {
                Vec::new()
            } else {
                vec![BodyPiece::Bytes(body)]
            },
            keep_alive,
        }
    }

    /// The head is out; the engine sends the one file extent through the socket's dup.
    fn hand_off(&mut self, idx: u32, generation: u32) {
        let shared = self.shared.clone();
        let epoll_fd = &self.epoll;
        let Some(c) = self.slots[idx as usize].conn.as_mut() else {
            return;
        };
        let State::Sending(out) = std::mem::replace(&mut c.state, State::Reading) else {
            return;
        };
        let mut out = out;
        let slot = out
            .to_engine
            .take()
            .expect("write_out hands off only with a reserved engine place");
        let target_fd = match c.sock.as_fd().try_clone_to_owned() {
            Ok(fd) => fd,
            Err(_) => {
                // The head is out: this loop sends the body instead of cutting it.
                shared.metrics.error("dup_failed");
                drop(slot);
                c.state = State::Sending(out);
                self.ready.push((idx, generation));
                return;
            }
        };
        let (
            Some(BodyPiece::File {
                offset_bytes,
                len_bytes,
            }),
            Some(file),
        ) = (out.pieces.pop_front(), out.file.take())
        else {
            unreachable!("to_engine is set only for one file piece")
        };
        let peer = c.sock.peer_addr().ok();
        let file_len = file
            .metadata()
            .map_or(offset_bytes + len_bytes, |m| m.len());
        let source = EngineOpened {
            fd: file.into(),
            kind: IoKind::File,
            size: Some(file_len),
            socket: false,
            label: out.file_label.clone(),
            volume: None,
        };
        let target = EngineOpened {
            fd: target_fd,
            kind: IoKind::StreamSocket,
            size: None,
            socket: true,
            label: peer.map_or_else(|| "http client".to_string(), |p| p.to_string()),
            volume: None,
        };
        // Descriptors, not names: the engine never opens anything by the URL path.
        let mut spec = StreamSpec::opened();
        // The location's class is the disk queue the body's reads wait in (no admission: an
        // HTTP body has no rate to guarantee).
        spec.class = Some(if &*out.class == "rt" {
            penstock_driver::DiskClass::Rt
        } else {
            penstock_driver::DiskClass::Bulk
        });
        spec.best_effort = true;
        spec.extent = Extent {
            offset: offset_bytes,
            length: Some(len_bytes),
        };
        spec.path = shared.body_path;
        // nginx's send_timeout, as the loop applies it to its own bodies.
        spec.send_timeout = Some(self.live.limits.send_timeout());
        // Leave epoll while the engine owns the socket's writes.
        if epoll::delete(epoll_fd, &c.sock).is_ok() {
            c.interest = Interest::Removed;
        }
        // Refused only if the file shrank since the head was made (the place is reserved and
        // the path was checked in `respond`).
        match shared.engine.open_reserved(slot, spec, source, target) {
            Ok(handle) => {
                shared.metrics.streams_active.inc();
                let waker = self.engine_waker.clone();
                handle.notify_when_done(Box::new(move || {
                    // A full counter (EAGAIN) still wakes the loop.
                    let _ = rustix::io::write(&*waker, &1u64.to_ne_bytes());
                }));
                let path_label = match handle.path() {
                    penstock_core::stream::DataPath::Sendfile => "engine-sendfile",
                    penstock_core::stream::DataPath::Splice => "engine-splice",
                    penstock_core::stream::DataPath::Uring => "engine-uring",
                    _ => "engine-copy",
                };
                c.state = State::Engine(Box::new(EngineBody {
                    handle,
                    keep_alive: out.keep_alive,
                    class: out.class.clone(),
                    path_label,
                    status: out.status,
                    head_bytes: out.head.len() as u64,
                }));
                self.engine_conns.push((idx, generation));
            }
            Err(e) => {
                tracing::warn!(error = %e, "engine refused an HTTP body");
                shared.metrics.error("engine_refused");
                self.close(idx);
            }
        }
    }

    fn poll_engine(&mut self) {
        let list = std::mem::take(&mut self.engine_conns);
        for (idx, generation) in list {
            let shared = self.shared.clone();
            let Some(c) = conn_in(&mut self.slots, idx, generation) else {
                continue;
            };
            let State::Engine(e) = &c.state else { continue };
            let Some(result) = e.handle.wait_timeout(Duration::ZERO) else {
                self.engine_conns.push((idx, generation));
                continue;
            };
            shared.metrics.streams_active.dec();
            let State::Engine(e) = std::mem::replace(&mut c.state, State::Reading) else {
                unreachable!("matched Engine above")
            };
            let _ = (e.status, e.head_bytes);
            match result {
                Ok(report) => {
                    shared.metrics.request(&e.class, e.path_label, report.bytes);
                    if !e.keep_alive || shared.stopping.load(Ordering::Relaxed) {
                        self.close(idx);
                        continue;
                    }
                    c.deadline = Instant::now() + self.live.limits.idle_timeout();
                    if epoll::add(
                        &self.epoll,
                        &c.sock,
                        epoll::EventData::new_u64(token(idx, generation)),
                        epoll::EventFlags::IN,
                    )
                    .is_err()
                    {
                        self.close(idx);
                        continue;
                    }
                    c.interest = Interest::Read;
                    // Pipelined requests may already be buffered.
                    self.ready.push((idx, generation));
                }
                Err(err) => {
                    tracing::debug!(error = %err, "HTTP body stream ended early");
                    shared.metrics.error(match err {
                        StreamError::Stalled { .. } => "send_timeout",
                        _ => "client_vanished",
                    });
                    self.close(idx);
                }
            }
        }
    }

    fn sweep(&mut self, now: Instant) {
        for idx in 0..self.slots.len() {
            let Some(c) = &self.slots[idx].conn else {
                continue;
            };
            if c.deadline > now || matches!(c.state, State::Engine(_)) {
                continue;
            }
            match c.state {
                State::Reading => {
                    if !c.inbuf.is_empty() {
                        // A head that did not complete in time (slowloris): 408, best effort.
                        let _ = rustix::net::send(
                            &c.sock,
                            b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                            SendFlags::NOSIGNAL,
                        );
                        self.shared.metrics.error("header_timeout");
                    } else {
                        self.shared.metrics.error("idle_timeout");
                    }
                }
                _ => self.shared.metrics.error("send_timeout"),
            }
            self.close(idx as u32);
        }
    }

    fn close(&mut self, idx: u32) {
        let slot = &mut self.slots[idx as usize];
        if let Some(c) = slot.conn.take() {
            if c.interest != Interest::Removed {
                let _ = epoll::delete(&self.epoll, &c.sock);
            }
            if let State::Engine(e) = &c.state {
                e.handle.cancel();
                self.shared.metrics.streams_active.dec();
            }
            drop(c);
            slot.generation = slot.generation.wrapping_add(1);
            self.free.push(idx);
            self.release_count();
        }
    }
}

/// 503 with `Retry-After` and no body: the engine cannot take a body now and the head is
/// not written yet (see `respond`).
fn unavailable(req: &Request, ctx: &ResponseContext<'_>) -> penstock_core::http::Response {
    let keep_alive = req.keep_alive && ctx.keep_alive_allowed;
    let head = ResponseHead {
        status: Status::SERVICE_UNAVAILABLE,
        date: ctx.date,
        server: ctx.server,
        content_type: None,
        content_length_bytes: Some(0),
        content_range: None,
        accept_ranges: false,
        etag: None,
        last_modified: None,
        allow: None,
        connection: if keep_alive {
            ConnectionHeader::KeepAlive {
                timeout_s: ctx.keep_alive_timeout_s,
            }
        } else {
            ConnectionHeader::Close
        },
    };
    let mut bytes = Vec::with_capacity(192);
    write_response_head(&head, &mut bytes);
    // Before the empty line that ends the head (the core's head has no Retry-After field).
    let end = bytes.len() - 2;
    bytes.splice(end..end, b"Retry-After: 1\r\n".iter().copied());
    penstock_core::http::Response {
        status: Status::SERVICE_UNAVAILABLE,
        head: bytes,
        body: Vec::new(),
        keep_alive,
    }
}

/// The context of an answer to a request that did not parse (the connection closes).
fn error_ctx(live: &LiveConfig) -> ResponseContext<'static> {
    ResponseContext {
        date: SystemTime::now(),
        server: "",
        keep_alive_allowed: false,
        keep_alive_timeout_s: Some(live.limits.idle_timeout_ms / 1000),
        ranges_max: live.limits.ranges_max,
        boundary: "",
    }
}

fn conn_in(slots: &mut [Slot], idx: u32, generation: u32) -> Option<&mut Conn> {
    let s = slots.get_mut(idx as usize)?;
    if s.generation != generation {
        return None;
    }
    s.conn.as_mut()
}

fn set_interest(ep: &OwnedFd, c: &mut Conn, tok: u64, want: Interest) -> io::Result<()> {
    if c.interest == want {
        return Ok(());
    }
    let flags = match want {
        Interest::Read => epoll::EventFlags::IN,
        Interest::Write => epoll::EventFlags::OUT,
        Interest::Nothing | Interest::Removed => epoll::EventFlags::empty(),
    };
    epoll::modify(ep, &c.sock, epoll::EventData::new_u64(tok), flags)?;
    c.interest = want;
    Ok(())
}

fn error_kind(e: &HttpError) -> &'static str {
    match e.status().code() {
        414 => "uri_too_long",
        431 => "header_too_large",
        403 => "path_escape",
        405 => "method_not_allowed",
        501 => "method_not_implemented",
        505 => "version_not_supported",
        413 => "body_not_allowed",
        _ => "bad_request",
    }
}

/// Sends as much of `out` as the socket, the rate and the budget allow.
fn write_out(sock: &TcpStream, out: &mut Out, now: Instant) -> Progress {
    let mut calls = 0;
    while out.head_pos < out.head.len() {
        let more = if !out.pieces.is_empty() && out.to_engine.is_none() {
            SendFlags::MORE
        } else {
            SendFlags::empty()
        };
        match rustix::net::send(sock, &out.head[out.head_pos..], SendFlags::NOSIGNAL | more) {
            Ok(n) => out.head_pos += n,
            Err(Errno::AGAIN) => return Progress::WouldBlock,
            Err(Errno::INTR) => {}
            Err(e) => return Progress::Failed(peer_kind(e)),
        }
        calls += 1;
    }
    if out.to_engine.is_some() {
        return Progress::HandOff;
    }
    while let Some(front) = out.pieces.front() {
        if calls >= BUDGET_SYSCALLS {
            return Progress::Yield;
        }
        calls += 1;
        let allowance = match out.rate.as_mut().map(|r| r.allowance(now, out.body_sent)) {
            None => u64::MAX,
            Some(Ok(n)) => n,
            Some(Err(at)) => return Progress::RateWait(at),
        };
        let left = front.len_bytes() - out.piece_pos;
        let asked;
        let r = match front {
            BodyPiece::Bytes(b) => {
                let start = out.piece_pos as usize;
                let end = start + left.min(allowance) as usize;
                asked = end - start;
                rustix::net::send(sock, &b[start..end], SendFlags::NOSIGNAL)
            }
            BodyPiece::File { offset_bytes, .. } => {
                let Some(file) = &out.file else {
                    return Progress::Failed("internal");
                };
                let mut off = offset_bytes + out.piece_pos;
                let want = left.min(allowance).min(SENDFILE_CHUNK_BYTES) as usize;
                asked = want;
                match rustix::fs::sendfile(sock, file, Some(&mut off), want) {
                    Ok(0) => return Progress::Failed("file_shrank"),
                    r => r,
                }
            }
        };
        match r {
            Ok(n) => {
                out.piece_pos += n as u64;
                out.body_sent += n as u64;
                if out.piece_pos == front.len_bytes() {
                    out.pieces.pop_front();
                    out.piece_pos = 0;
                }
                if n < asked && !out.pieces.is_empty() {
                    // A short write to a non-blocking socket: its buffer is full. Asking
                    // again now would only get EAGAIN, and a sendfile that gets EAGAIN has
                    // already looked up (and then dropped) a pipe's worth of page-cache pages
                    // (measured: a quarter of the engine's sendfile calls were such misses
                    // with 64 clients). Wait for EPOLLOUT instead, as nginx does.
                    return Progress::WouldBlock;
                }
            }
            Err(Errno::AGAIN) => return Progress::WouldBlock,
            Err(Errno::INTR) => {}
            Err(e) => return Progress::Failed(peer_kind(e)),
        }
    }
    Progress::Done
}

fn peer_kind(e: Errno) -> &'static str {
    match e {
        Errno::PIPE | Errno::CONNRESET | Errno::NOTCONN | Errno::SHUTDOWN => "client_vanished",
        _ => "send_failed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 20: out of descriptors, at most one line per interval, and it counts by errno.
    #[test]
    fn accept_failures_are_reported_once_per_interval_with_counts() {
        let t0 = Instant::now();
        let backoff = Duration::from_millis(500);
        let mut f = AcceptFailures {
            counts: Vec::new(),
            next_log: t0,
        };
        assert!(!f.report(t0, 0, backoff), "nothing to report");
        f.add(Errno::MFILE);
        assert!(
            f.report(t0, 0, backoff),
            "the first failure is reported at once"
        );
        for _ in 0..1000 {
            f.add(Errno::MFILE);
        }
        f.add(Errno::NFILE);
        assert!(!f.report(t0 + Duration::from_secs(9), 0, backoff));
        assert_eq!(f.counts, vec![(Errno::MFILE, 1000), (Errno::NFILE, 1)]);
        assert!(f.report(t0 + ACCEPT_LOG_INTERVAL, 0, backoff));
        assert!(f.counts.is_empty());
        // Distinct errnos are bounded.
        for raw in 1..100 {
            f.add(Errno::from_raw_os_error(raw));
        }
        assert_eq!(f.counts.len(), ACCEPT_ERRNOS_MAX);
        assert_eq!(f.counts.iter().map(|c| c.1).sum::<u64>(), 99);
    }

    #[test]
    fn resource_errors_pause_and_connection_errors_do_not() {
        for e in [
            Errno::MFILE,
            Errno::NFILE,
            Errno::NOBUFS,
            Errno::NOMEM,
            Errno::BADF,
        ] {
            assert_eq!(accept_failure(e), AcceptFailure::Resource, "{e:?}");
        }
        for e in [Errno::CONNABORTED, Errno::PROTO, Errno::NETUNREACH] {
            assert_eq!(accept_failure(e), AcceptFailure::Connection, "{e:?}");
        }
        assert_eq!(errno_name(Errno::MFILE), "EMFILE");
    }

    #[test]
    fn rate_limit_lets_after_bytes_through_then_paces() {
        let t0 = Instant::now();
        let mut r = RateLimit {
            bytes_per_s: 1000,
            after_bytes: 500,
            rate_start: None,
        };
        assert_eq!(r.allowance(t0, 0), Ok(500));
        assert_eq!(r.allowance(t0, 100), Ok(400));
        // At the boundary the clock starts; a 1 KiB burst is allowed at once.
        assert_eq!(r.allowance(t0, 500), Ok(1024));
        let back = r.allowance(t0, 500 + 1024).unwrap_err();
        assert!(back > t0);
        // One second later, 1000 more bytes.
        assert_eq!(
            r.allowance(t0 + Duration::from_secs(1), 500 + 1024),
            Ok(1000)
        );
    }

    /// Issue 20: the engine's refusal known before the head is a 503 with Retry-After and no
    /// body, keeping the connection when the request allows it.
    #[test]
    fn unavailable_is_a_bodiless_503_with_retry_after() {
        let Ok(Parsed::Complete { request, .. }) = parse_request(
            b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n",
            &penstock_core::http::Limits::default(),
        ) else {
            panic!("request parses");
        };
        let ctx = ResponseContext {
            date: SystemTime::UNIX_EPOCH,
            server: "penstock",
            keep_alive_allowed: true,
            keep_alive_timeout_s: Some(60),
            ranges_max: 16,
            boundary: "",
        };
        let r = unavailable(&request, &ctx);
        let head = String::from_utf8(r.head).expect("ascii head");
        assert!(
            head.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{head}"
        );
        assert!(head.contains("\r\nRetry-After: 1\r\n"), "{head}");
        assert!(head.contains("\r\nContent-Length: 0\r\n"), "{head}");
        assert!(head.ends_with("\r\n\r\n") && !head.ends_with("\r\n\r\n\r\n"));
        assert!(r.body.is_empty() && r.keep_alive);
    }
}
