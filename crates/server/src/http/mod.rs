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
//!
//! # Files
//! - this one: the shared state ([`HttpShared`]), [`start`] and the listeners, a worker's
//!   connections and its event loop (`run`, `drive`, the sweep of deadlines, stop and cut);
//! - `accept`: accepting, and the back-off out of descriptors or memory;
//! - `respond`: a parsed request → an `Out` (the file opened beneath the root, conditionals
//!   and ranges by the core, the engine place reserved or a 503);
//! - `send`: `Out` and `write_out`, the sending state machine (head, memory pieces,
//!   sendfile pieces, the rate limit);
//! - `engine`: a body handed to the engine and its report collected.
//!
//! Every request that ends, answered or cut, goes through `record` once: the request
//! metrics and the access log line (`crate::access_log`, formatted into this worker's buffer;
//! the loop never writes the log itself).

mod accept;
mod engine;
mod indexing;
mod live;
mod mp4;
mod origin;
mod respond;
mod send;
mod tls_io;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use penstock_core::http::{
    Parsed, content_type_for_path, extension_of, parse_request, respond_error,
};
use penstock_core::stream::PathChoice;
use penstock_driver::Engine;
use rustix::event::epoll;
use rustix::io::Errno;

use crate::access_log::{AccessLog, Finished, LogBuffer, LogEntry};
use crate::config::LiveConfig;
use crate::confine::Root;
use crate::metrics::{Format, Metrics};

use accept::AcceptFailures;
use engine::EngineBody;
use respond::{error_ctx, error_kind};
use send::{Out, Progress, write_out};
use tls_io::ConnTls;

const TOKEN_LISTENER: u64 = u64::MAX;
const TOKEN_WAKER: u64 = u64::MAX - 1;
const SCRATCH_BYTES: usize = 16 * 1024;
const EVENTS_MAX: usize = 256;
/// Rounds of accepts on a listener about to close (each up to the per-turn number).
const DRAIN_TURNS_MAX: usize = 64;

/// What is served: the root, the index file name and the configured types. SIGHUP may
/// replace it as a whole (a new `root`); a worker takes the new one between requests.
pub(crate) struct Site {
    pub(crate) root: Root,
    pub(crate) index: Option<String>,
    /// Extension (lower case) → `Content-Type`, ahead of the built-in table.
    pub(crate) types: HashMap<String, String>,
    /// `[volumes]`: name → the path of one of its members; served under `/vol/NAME/PART`.
    pub(crate) volumes: BTreeMap<String, std::path::PathBuf>,
}

impl Site {
    pub(crate) fn new(
        root: Root,
        index: Option<String>,
        types: &BTreeMap<String, String>,
        volumes: &BTreeMap<String, std::path::PathBuf>,
    ) -> Site {
        Site {
            root,
            index: index.filter(|i| !i.is_empty()),
            types: types
                .iter()
                .map(|(e, t)| (e.to_ascii_lowercase(), t.clone()))
                .collect(),
            volumes: volumes.clone(),
        }
    }

    pub(crate) fn content_type(&self, name: &str) -> &str {
        extension_of(name)
            .and_then(|e| self.types.get(&e.to_ascii_lowercase()))
            .map_or_else(|| content_type_for_path(name), String::as_str)
    }
}

/// What the workers share.
pub(crate) struct HttpShared {
    live: Mutex<Arc<LiveConfig>>,
    live_version: AtomicU64,
    site: Mutex<Arc<Site>>,
    /// Listeners handed over by a reload, one set per worker, taken at its next turn.
    handover: Mutex<Vec<Option<Vec<TcpListener>>>>,
    listen_version: AtomicU64,
    pub(crate) server_name: String,
    pub(crate) metrics_path: String,
    pub(crate) health_path: String,
    pub(crate) engine_body_bytes_min: u64,
    pub(crate) body_path: PathChoice,
    pub(crate) engine: Arc<Engine>,
    pub(crate) metrics: Arc<Metrics>,
    /// The access log's writer, if the log is on.
    pub(crate) access_log: Option<AccessLog>,
    conns: AtomicUsize,
    /// Stop accepting, close idle connections, close each busy one after its response.
    stopping: AtomicBool,
    /// Close everything now.
    cut: AtomicBool,
    wakers: Mutex<Vec<OwnedFd>>,
    /// `[origin]`: paths missing beneath the root are answered from there.
    pub(crate) origin: Option<Arc<crate::origin::Origin>>,
    /// `[hls]`: playlists of the TS files beneath the root.
    pub(crate) hls: Arc<crate::hls::Hls>,
    /// Who may watch (`crate::auth`).
    pub(crate) viewers: Arc<crate::auth::Viewers>,
    /// HLS viewer sessions (`[[location]] sessions = true`).
    pub(crate) hls_sessions: Arc<crate::hls_sessions::HlsSessions>,
    /// `[tls]`, when configured: the sessions of the `https://` listeners.
    pub(crate) tls: Option<Arc<crate::tls::Tls>>,
    /// The bound addresses of the `https://` listeners (a worker's listener whose address
    /// is here accepts TLS connections).
    tls_addrs: Mutex<Vec<SocketAddr>>,
}

impl HttpShared {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        live: LiveConfig,
        site: Site,
        server_name: String,
        metrics_path: String,
        health_path: String,
        engine_body_bytes_min: u64,
        body_path: PathChoice,
        engine: Arc<Engine>,
        metrics: Arc<Metrics>,
        access_log: Option<AccessLog>,
    ) -> HttpShared {
        let viewers = Arc::new(crate::auth::Viewers::open(metrics.clone()));
        let hls_sessions = Arc::new(crate::hls_sessions::HlsSessions::new(
            &crate::config::HlsConfig::default(),
            engine.clone(),
            metrics.clone(),
        ));
        HttpShared {
            live: Mutex::new(Arc::new(live)),
            live_version: AtomicU64::new(0),
            site: Mutex::new(Arc::new(site)),
            handover: Mutex::new(Vec::new()),
            listen_version: AtomicU64::new(0),
            server_name,
            metrics_path,
            health_path,
            engine_body_bytes_min,
            body_path,
            engine,
            metrics,
            access_log,
            conns: AtomicUsize::new(0),
            stopping: AtomicBool::new(false),
            cut: AtomicBool::new(false),
            wakers: Mutex::new(Vec::new()),
            origin: None,
            hls: Arc::new(crate::hls::Hls::new(crate::config::HlsConfig::default())),
            hls_sessions,
            viewers,
            tls: None,
            tls_addrs: Mutex::new(Vec::new()),
        }
    }

    /// Serves the `https://` listeners with `tls`.
    pub(crate) fn with_tls(mut self, tls: Option<Arc<crate::tls::Tls>>) -> HttpShared {
        self.tls = tls;
        self
    }

    /// Which bound addresses are TLS listeners; set before the listeners are handed over.
    pub(crate) fn set_tls_addrs(&self, addrs: Vec<SocketAddr>) {
        *self.tls_addrs.lock().unwrap_or_else(|p| p.into_inner()) = addrs;
    }

    /// For each listener, whether it is a TLS one.
    fn tls_flags(&self, listeners: &[TcpListener]) -> Vec<bool> {
        let addrs = self.tls_addrs.lock().unwrap_or_else(|p| p.into_inner());
        listeners
            .iter()
            .map(|l| l.local_addr().is_ok_and(|a| addrs.contains(&a)))
            .collect()
    }

    /// Answers `PATH/index.m3u8` for the TS files beneath the root with `hls`.
    pub(crate) fn with_viewers(mut self, viewers: Arc<crate::auth::Viewers>) -> HttpShared {
        self.viewers = viewers;
        self
    }

    /// Keeps the HLS viewer sessions in `sessions`.
    pub(crate) fn with_hls_sessions(
        mut self,
        sessions: Arc<crate::hls_sessions::HlsSessions>,
    ) -> HttpShared {
        self.hls_sessions = sessions;
        self
    }

    pub(crate) fn with_hls(mut self, hls: Arc<crate::hls::Hls>) -> HttpShared {
        self.hls = hls;
        self
    }

    /// Answers paths missing beneath the root from `origin`.
    pub(crate) fn with_origin(mut self, origin: Option<Arc<crate::origin::Origin>>) -> HttpShared {
        self.origin = origin;
        self
    }

    fn live(&self) -> Arc<LiveConfig> {
        self.live.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn site(&self) -> Arc<Site> {
        self.site.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces what is served; workers pick it up on their next turn (responses under way
    /// keep their open files).
    pub(crate) fn set_site(&self, site: Site) {
        *self.site.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(site);
        self.live_version.fetch_add(1, Ordering::Release);
        self.wake();
    }

    /// Hands each worker its new listeners (`groups[address][worker]`); each drops the ones
    /// it had at its next turn (connections already accepted stay).
    pub(crate) fn hand_over(&self, groups: Vec<Vec<TcpListener>>, workers: usize) {
        let mut per_worker = per_worker(groups, workers);
        {
            let mut h = self.handover.lock().unwrap_or_else(|p| p.into_inner());
            h.clear();
            h.extend(per_worker.drain(..).map(Some));
        }
        self.listen_version.fetch_add(1, Ordering::Release);
        self.wake();
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
/// 0): one per worker, so the kernel spreads connections among them.
pub(crate) fn bind_group(addr: SocketAddr, workers: usize) -> io::Result<Vec<TcpListener>> {
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
    Ok(listeners)
}

/// One listener given from outside (socket activation) shared by every worker: each polls
/// a descriptor of the same socket.
pub(crate) fn shared_group(l: TcpListener, workers: usize) -> io::Result<Vec<TcpListener>> {
    l.set_nonblocking(true)?;
    let mut v = Vec::with_capacity(workers.max(1));
    for _ in 1..workers.max(1) {
        v.push(l.try_clone()?);
    }
    v.push(l);
    Ok(v)
}

/// `groups[address][worker]` → `[worker][address]`.
fn per_worker(groups: Vec<Vec<TcpListener>>, workers: usize) -> Vec<Vec<TcpListener>> {
    let mut out: Vec<Vec<TcpListener>> = (0..workers.max(1)).map(|_| Vec::new()).collect();
    for g in groups {
        for (w, l) in g.into_iter().enumerate() {
            out[w].push(l);
        }
    }
    out
}

/// Starts one loop thread per worker, each polling its listener of every group
/// (`groups[address][worker]`, see [`bind_group`]).
pub(crate) fn start(
    shared: Arc<HttpShared>,
    groups: Vec<Vec<TcpListener>>,
    workers: usize,
) -> io::Result<Vec<JoinHandle<()>>> {
    let mut threads = Vec::new();
    for (i, ls) in per_worker(groups, workers).into_iter().enumerate() {
        let mut w = Worker::new(shared.clone(), ls, i)?;
        let t = std::thread::Builder::new()
            .name(format!("penstock-http-{i}"))
            .spawn(move || w.run())?;
        threads.push(t);
    }
    Ok(threads)
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

enum State {
    /// A TLS connection before its handshake ended (`tls_io.rs`), under the handshake's
    /// deadline.
    Handshake,
    Reading,
    Sending(Box<Out>),
    Engine(Box<EngineBody>),
    /// A thread answers from the origin (`origin.rs`); not in epoll meanwhile.
    Origin(Box<origin::OriginBody>),
    /// Waits for an HLS index built by a thread (`indexing.rs`); not in epoll meanwhile.
    Index(Box<indexing::IndexWait>),
    /// Closing lingering ([`Worker::linger`]): the write side shut down, the client's bytes
    /// read and dropped until its EOF, `lingering_bytes_max` or the deadline.
    Lingering {
        dropped_bytes: u64,
    },
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
    /// The client's address (the access log's `$remote_addr`), from accept.
    peer: Option<IpAddr>,
    /// When the first byte of the request head being read arrived (`rt=` and the duration
    /// and time-to-first-byte metrics start there).
    head_started: Option<Instant>,
    inbuf: Vec<u8>,
    requests: u32,
    state: State,
    deadline: Instant,
    interest: Interest,
    peer_eof: bool,
    /// Plain, or TLS: in its handshake, encrypted by rustls, or by the kernel.
    tls: ConnTls,
    /// The places this connection holds under its viewers' `sessions` caps (one per
    /// credential, at most `VIEWER_HOLDS_PER_CONNECTION_MAX`), given back when it closes.
    viewer_holds: Vec<crate::auth::SessionHold>,
}

struct Slot {
    generation: u32,
    conn: Option<Conn>,
}

struct Worker {
    shared: Arc<HttpShared>,
    epoll: OwnedFd,
    /// One per listening address; all polled under one token (accept tries each).
    listeners: Vec<TcpListener>,
    /// For each listener, whether it is an `https://` one.
    listener_tls: Vec<bool>,
    listen_version: u64,
    site: Arc<Site>,
    waker: OwnedFd,
    slots: Vec<Slot>,
    free: Vec<u32>,
    ready: Vec<(u32, u32)>,
    timers: BinaryHeap<Reverse<(Instant, u32, u32)>>,
    engine_conns: Vec<(u32, u32)>,
    /// Connections answered by an origin thread.
    origin_conns: Vec<(u32, u32)>,
    /// Connections waiting for an HLS index (`State::Index`).
    index_conns: Vec<(u32, u32)>,
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
    /// A descriptor held in reserve (`/dev/null`): out of descriptors, it is closed to
    /// accept one waiting connection, answer it 503 and close it, then taken again
    /// (`accept::refuse_exhausted`), so that clients get a refusal rather than silence.
    spare_fd: Option<OwnedFd>,
    /// This worker's access log lines not yet handed to the writer.
    access: Option<LogBuffer>,
    /// Set by `respond` when the answer is a playlist made here (its `Cache-Control`).
    playlist_made: bool,
    /// Set by `respond` for a `/live/` answer: `Some(true)` a short `Cache-Control` (a live
    /// playlist, the whole growing recording), `Some(false)` the media one (a range of it).
    live_cache: Option<bool>,
    /// The nearest deadline of a parked blocking reload (`live.rs`): the loop wakes by then.
    live_deadline: Option<Instant>,
    /// The viewer places of the connection whose request `respond` answers, lent for the
    /// call (`Conn::viewer_holds`): `respond` adds the place a capped credential opens.
    viewer_holds: Vec<crate::auth::SessionHold>,
    /// The viewers' deny-list generation last acted on (`Worker::end_revoked`).
    deny_seen: u64,
    /// Pipes gathering bodies of many file ranges (`send.rs`).
    pipes: send::Pipes,
}

fn token(idx: u32, generation: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(idx)
}

impl Worker {
    fn new(shared: Arc<HttpShared>, listeners: Vec<TcpListener>, i: usize) -> io::Result<Worker> {
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        for l in &listeners {
            epoll::add(
                &epoll,
                l,
                epoll::EventData::new_u64(TOKEN_LISTENER),
                epoll::EventFlags::IN,
            )?;
        }
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
        let access = shared.access_log.as_ref().map(|l| l.buffer());
        let live_version = shared.live_version.load(Ordering::Acquire);
        let listen_version = shared.listen_version.load(Ordering::Acquire);
        let live = shared.live();
        let site = shared.site();
        let seed = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ ((i as u64) << 56);
        let listener_tls = shared.tls_flags(&listeners);
        Ok(Worker {
            shared,
            epoll,
            listeners,
            listener_tls,
            listen_version,
            site,
            waker,
            slots: Vec::new(),
            free: Vec::new(),
            ready: Vec::new(),
            timers: BinaryHeap::new(),
            engine_conns: Vec::new(),
            origin_conns: Vec::new(),
            index_conns: Vec::new(),
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
            spare_fd: accept::spare_fd(),
            playlist_made: false,
            live_cache: None,
            live_deadline: None,
            viewer_holds: Vec::new(),
            deny_seen: 0,
            pipes: send::Pipes::default(),
            access,
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
                self.flush_log_at_exit();
                return;
            }
            if self.shared.stopping.load(Ordering::Acquire) {
                self.begin_stop();
                if self.live_conns() == 0 {
                    self.flush_log_at_exit();
                    return;
                }
            }
            let now = Instant::now();
            let mut timeout = self.next_sweep.saturating_duration_since(now);
            if let Some(Reverse((t, _, _))) = self.timers.peek() {
                timeout = timeout.min(t.saturating_duration_since(now));
            }
            if let Some(t) = self.accept_paused_until {
                timeout = timeout.min(t.saturating_duration_since(now));
            }
            if let Some(t) = self.access.as_ref().and_then(|a| a.flush_at()) {
                timeout = timeout.min(t.saturating_duration_since(now));
            }
            if let Some(t) = self.live_deadline {
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
                    self.flush_log_at_exit();
                    return;
                }
            }
            // After the wait: a reload that woke this loop is seen before the events that
            // came with the wake-up (a request right after `reload` returns is served with
            // the new site and limits).
            self.refresh();
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
            if self.engine_woken && !self.origin_conns.is_empty() {
                self.poll_origin();
            }
            if (self.engine_woken || self.live_deadline.is_some_and(|t| now >= t))
                && !self.index_conns.is_empty()
            {
                self.poll_index();
            }
            self.engine_woken = false;
            if self.accept_paused_until.is_some_and(|t| now >= t) {
                self.resume_accepting(now);
            }
            if let Some(a) = &mut self.access
                && a.flush_at().is_some_and(|t| now >= t)
            {
                a.flush();
            }
            if now >= self.next_sweep {
                if !self.engine_conns.is_empty() {
                    self.poll_engine();
                }
                if !self.origin_conns.is_empty() {
                    self.poll_origin();
                }
                if !self.index_conns.is_empty() {
                    self.poll_index();
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

    /// The worker ends: its last lines go to the writer (waiting a little for room).
    fn flush_log_at_exit(&mut self) {
        if let Some(a) = &mut self.access {
            a.flush_before(Instant::now() + Duration::from_secs(1));
        }
    }

    fn live_conns(&self) -> usize {
        self.slots.iter().filter(|s| s.conn.is_some()).count()
    }

    /// Takes a reload's configuration, site and listeners, when there are new ones.
    fn refresh(&mut self) {
        let v = self.shared.live_version.load(Ordering::Acquire);
        if v != self.live_version {
            self.live = self.shared.live();
            self.site = self.shared.site();
            self.live_version = v;
        }
        let v = self.shared.listen_version.load(Ordering::Acquire);
        if v != self.listen_version {
            self.listen_version = v;
            self.take_listeners();
        }
    }

    /// A reload's listeners replace this worker's (unless it is stopping).
    fn take_listeners(&mut self) {
        let new = self
            .shared
            .handover
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(self.index)
            .and_then(Option::take);
        let Some(new) = new else { return };
        if self.shared.stopping.load(Ordering::Acquire) {
            return;
        }
        // A listener whose address goes away is closed with this descriptor: first accept
        // what already waits in its backlog (connections the clients see as established),
        // which closing would reset. A kept address has a descriptor in `new`.
        let kept: Vec<Option<SocketAddr>> = new.iter().map(|l| l.local_addr().ok()).collect();
        for i in 0..self.listeners.len() {
            let addr = self.listeners[i].local_addr().ok();
            if addr.is_some() && !kept.contains(&addr) {
                for _ in 0..DRAIN_TURNS_MAX {
                    if !self.accept_from(i) {
                        break;
                    }
                }
            }
        }
        for l in self.listeners.drain(..) {
            let _ = epoll::delete(&self.epoll, &l);
        }
        self.listener_tls = self.shared.tls_flags(&new);
        self.listeners = new;
        if self.accept_paused_until.is_none() {
            for l in &self.listeners {
                if let Err(e) = epoll::add(
                    &self.epoll,
                    l,
                    epoll::EventData::new_u64(TOKEN_LISTENER),
                    epoll::EventFlags::IN,
                ) {
                    tracing::error!(worker = self.index, error = %e, "a new listener could not join the loop");
                }
            }
        }
    }

    fn begin_stop(&mut self) {
        for l in self.listeners.drain(..) {
            let _ = epoll::delete(&self.epoll, &l);
        }
        // Idle connections (waiting for a head, nothing buffered, or still in their TLS
        // handshake) go now.
        for idx in 0..self.slots.len() {
            let idle = matches!(
                &self.slots[idx].conn,
                Some(c) if (matches!(c.state, State::Reading) && c.inbuf.is_empty())
                    || matches!(c.state, State::Handshake)
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
        if matches!(
            c.state,
            State::Engine(_) | State::Origin(_) | State::Index(_)
        ) {
            return;
        }
        if matches!(c.state, State::Handshake) {
            self.handshake_event(idx, generation, flags);
            return;
        }
        if let State::Lingering { dropped_bytes } = &mut c.state {
            let max = self.live.limits.lingering_bytes_max;
            let scratch = &mut self.scratch;
            let done = loop {
                if *dropped_bytes > max {
                    break true;
                }
                match c.sock.read(scratch) {
                    Ok(0) => break true,
                    Ok(n) => *dropped_bytes += n as u64,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break false,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break true,
                }
            };
            if done || flags.intersects(epoll::EventFlags::ERR) {
                self.close(idx);
            }
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
        if reading
            && flags.intersects(epoll::EventFlags::IN | epoll::EventFlags::HUP)
            && let ConnTls::User(tls) = &mut c.tls
        {
            tls_io::read_tls_into(
                tls,
                &c.sock,
                &mut c.inbuf,
                cap,
                &mut c.peer_eof,
                &mut c.head_started,
                &self.shared.metrics,
            );
        } else if reading && flags.intersects(epoll::EventFlags::IN | epoll::EventFlags::HUP) {
            let scratch = &mut self.scratch;
            // Read what is there, up to the cap (the rest waits in the socket).
            while c.inbuf.len() < cap && !c.peer_eof {
                let want = (cap - c.inbuf.len()).min(scratch.len());
                match c.sock.read(&mut scratch[..want]) {
                    Ok(0) => c.peer_eof = true,
                    Ok(n) => {
                        if c.inbuf.is_empty() {
                            c.head_started = Some(Instant::now());
                        }
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
        let cap = live.limits.header_bytes_max + SCRATCH_BYTES;
        let mut budget = 8; // requests per turn (pipelining)
        loop {
            let stopping = self.shared.stopping.load(Ordering::Relaxed);
            let Some(c) = conn_in(&mut self.slots, idx, generation) else {
                return;
            };
            match &mut c.state {
                State::Engine(_)
                | State::Origin(_)
                | State::Index(_)
                | State::Lingering { .. }
                | State::Handshake => {
                    return;
                }
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
                            // Plaintext rustls already decrypted is not in the socket: no
                            // event would announce it.
                            if let ConnTls::User(tls) = &mut c.tls
                                && tls_io::take_buffered(tls, &mut c.inbuf, cap, &mut c.peer_eof)
                                    > 0
                            {
                                continue;
                            }
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
                            let head = &c.inbuf[..consumed_bytes];
                            let log = self.access.is_some().then(|| LogEntry::from_head(head));
                            let metrics_format = if request.path == self.shared.metrics_path {
                                Format::from_accept(crate::access_log::header_value(
                                    head, b"accept",
                                ))
                            } else {
                                Format::Text004
                            };
                            c.inbuf.drain(..consumed_bytes);
                            let now = Instant::now();
                            let started = c.head_started.take().unwrap_or(now);
                            // A pipelined request already buffered starts now.
                            if !c.inbuf.is_empty() {
                                c.head_started = Some(now);
                            }
                            c.requests += 1;
                            let allowed =
                                c.requests < live.limits.requests_per_connection_max && !stopping;
                            let mode = c.tls.mode();
                            let peer = c.peer;
                            self.viewer_holds = std::mem::take(&mut c.viewer_holds);
                            let mut out =
                                self.respond(&request, allowed, &live, metrics_format, mode, peer);
                            let holds = std::mem::take(&mut self.viewer_holds);
                            if let Some(c) = self.conn_mut(idx, generation) {
                                c.viewer_holds = holds;
                            }
                            out.started = started;
                            out.log = log;
                            if out.origin_type.is_some() {
                                self.hand_to_origin(idx, generation, request, out);
                                return;
                            }
                            if out.hls_wait.is_some() {
                                self.wait_for_index(idx, generation, request, out);
                                return;
                            }
                            let c = self.conn_mut(idx, generation).expect("present above");
                            c.state = State::Sending(Box::new(out));
                            c.deadline = Instant::now() + live.limits.send_timeout();
                        }
                        Err(e) => {
                            self.shared.metrics.error(error_kind(&e));
                            let ctx = error_ctx(&live);
                            let r = respond_error(e.status(), None, &ctx);
                            let log = self.access.is_some().then(|| LogEntry::from_head(&c.inbuf));
                            let out = Out {
                                keep_alive: false,
                                started: c.head_started.take().unwrap_or_else(Instant::now),
                                log,
                                ..Out::from_response(r, Arc::from("none"))
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
                    let head_was_unsent = out.head_pos == 0;
                    let p = match &mut c.tls {
                        ConnTls::User(tls) => tls_io::write_out_tls(
                            &c.sock,
                            tls,
                            out,
                            Instant::now(),
                            &mut self.scratch,
                        ),
                        _ => write_out(
                            &c.sock,
                            out,
                            Instant::now(),
                            &mut self.pipes,
                            live.limits.splice_pipes_max,
                        ),
                    };
                    if out.body_sent + out.head_pos as u64 > before {
                        let now = Instant::now();
                        c.deadline = now + live.limits.send_timeout();
                        if head_was_unsent {
                            self.shared
                                .metrics
                                .first_byte(&out.class, now.saturating_duration_since(out.started));
                        }
                    }
                    match p {
                        Progress::Done => {
                            let State::Sending(out) =
                                std::mem::replace(&mut c.state, State::Reading)
                            else {
                                unreachable!("matched Sending above")
                            };
                            record(
                                &self.shared,
                                &mut self.access,
                                c.peer,
                                &out.request_end(out.status.code(), out.body_sent),
                            );
                            if stopping {
                                self.close(idx);
                                return;
                            }
                            if !out.keep_alive {
                                self.linger(idx, generation);
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

    /// Closes the connections of newly revoked tokens (`[auth] deny_file`): shut down both
    /// ways first, so that a body the engine sends through a duplicate of the socket ends
    /// too.
    fn end_revoked(&mut self) {
        let g = self.shared.viewers.deny_generation();
        if g == self.deny_seen {
            return;
        }
        self.deny_seen = g;
        for idx in 0..self.slots.len() {
            let Some(c) = &self.slots[idx].conn else {
                continue;
            };
            if !c
                .viewer_holds
                .iter()
                .any(|h| h.jti().is_some_and(|j| self.shared.viewers.is_revoked(j)))
            {
                continue;
            }
            let _ = rustix::net::shutdown(&c.sock, rustix::net::Shutdown::Both);
            self.shared.metrics.error("auth_revoked_closed");
            tracing::info!(peer = ?c.peer, "closed an HTTP connection: its viewer's token was revoked");
            if !matches!(
                c.state,
                State::Engine(_) | State::Origin(_) | State::Index(_)
            ) {
                self.close(idx as u32);
            }
        }
    }

    fn sweep(&mut self, now: Instant) {
        crate::peer_log::flush();
        self.end_revoked();
        for idx in 0..self.slots.len() {
            let Some(c) = &self.slots[idx].conn else {
                continue;
            };
            // Engine bodies and origin threads have their own timeouts; a connection waiting
            // for an HLS index waits for the read of a local file, which ends.
            if c.deadline > now
                || matches!(
                    c.state,
                    State::Engine(_) | State::Origin(_) | State::Index(_)
                )
            {
                continue;
            }
            match c.state {
                State::Handshake => self.shared.metrics.error("tls_handshake_timeout"),
                // The lingering time is over: closed (what the client sent since is lost
                // with it, the responses were all delivered or given up on).
                State::Lingering { .. } => {}
                State::Reading => {
                    if !c.inbuf.is_empty() {
                        // A head that did not complete in time (slowloris): 408, best effort.
                        let c = self.slots[idx].conn.as_mut().expect("present above");
                        tls_io::send_small(
                            c,
                            b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                        );
                        let c = self.slots[idx].conn.as_ref().expect("present above");
                        self.shared.metrics.error("header_timeout");
                        let log = self.access.is_some().then(|| LogEntry::from_head(&c.inbuf));
                        record(
                            &self.shared,
                            &mut self.access,
                            c.peer,
                            &RequestEnd {
                                class: "none",
                                data_path: "memory",
                                status: 408,
                                body_bytes: 0,
                                started: c.head_started.unwrap_or(now),
                                log: log.as_ref(),
                            },
                        );
                        // The client is still sending its head: closed lingering, so that
                        // the 408 is not lost to a reset.
                        let generation = self.slots[idx].generation;
                        self.linger(idx as u32, generation);
                        continue;
                    } else {
                        self.shared.metrics.error("idle_timeout");
                    }
                }
                _ => self.shared.metrics.error("send_timeout"),
            }
            self.close(idx as u32);
        }
    }

    /// Closes a connection after its last response as nginx's `lingering_close` does: the
    /// write side is shut down (the responses already queued are delivered, then a FIN), and
    /// the client's bytes (pipelined requests that will not be answered) are read and
    /// dropped until its EOF, `lingering_bytes_max` or `lingering_time_ms`. A close with
    /// unread input would send a reset instead, and the client's kernel would drop the
    /// responses it had not read yet.
    pub(super) fn linger(&mut self, idx: u32, generation: u32) {
        let time = self.live.limits.lingering_time();
        let Some(c) = conn_in(&mut self.slots, idx, generation) else {
            return;
        };
        tls_io::close_notify(c);
        if time.is_zero() || rustix::net::shutdown(&c.sock, rustix::net::Shutdown::Write).is_err() {
            self.close(idx);
            return;
        }
        c.inbuf = Vec::new();
        c.state = State::Lingering { dropped_bytes: 0 };
        c.deadline = Instant::now() + time;
        let tok = token(idx, generation);
        let registered = if c.interest == Interest::Removed {
            epoll::add(
                &self.epoll,
                &c.sock,
                epoll::EventData::new_u64(tok),
                epoll::EventFlags::IN,
            )
            .map(|()| c.interest = Interest::Read)
            .map_err(io::Error::from)
        } else {
            set_interest(&self.epoll, c, tok, Interest::Read)
        };
        if registered.is_err() {
            self.close(idx);
            return;
        }
        // What is already there is dropped now (an EOF already seen ends it at once).
        if c.peer_eof {
            self.close(idx);
            return;
        }
        self.on_event(idx, generation, epoll::EventFlags::IN);
    }

    fn close(&mut self, idx: u32) {
        let slot = &mut self.slots[idx as usize];
        if let Some(c) = slot.conn.take() {
            if c.interest != Interest::Removed {
                let _ = epoll::delete(&self.epoll, &c.sock);
            }
            // A response cut before its end is logged with what it sent (`access_log`).
            match &c.state {
                State::Sending(out) => {
                    let status = if out.head_pos == 0 {
                        CLIENT_CLOSED_REQUEST
                    } else {
                        out.status.code()
                    };
                    record(
                        &self.shared,
                        &mut self.access,
                        c.peer,
                        &out.request_end(status, out.body_sent),
                    );
                }
                State::Engine(e) => {
                    e.handle.cancel();
                    self.shared.metrics.streams_active.dec();
                    record(
                        &self.shared,
                        &mut self.access,
                        c.peer,
                        &e.request_end(e.handle.counters().bytes_sent),
                    );
                }
                State::Index(w) => {
                    // The build goes on (the next request finds the index cached).
                    record(
                        &self.shared,
                        &mut self.access,
                        c.peer,
                        &w.out.request_end(CLIENT_CLOSED_REQUEST, 0),
                    );
                }
                State::Origin(o) => {
                    o.cancel.store(true, Ordering::Relaxed);
                    record(
                        &self.shared,
                        &mut self.access,
                        c.peer,
                        &o.request_end(CLIENT_CLOSED_REQUEST, 0),
                    );
                }
                State::Reading | State::Lingering { .. } | State::Handshake => {}
            }
            drop(c);
            slot.generation = slot.generation.wrapping_add(1);
            self.free.push(idx);
            self.release_count();
            self.retake_spare();
        }
    }
}

/// nginx's status for a request whose client went away before any byte of the response.
const CLIENT_CLOSED_REQUEST: u16 = 499;

/// A request at its end, as the metrics and the access log see it.
pub(super) struct RequestEnd<'a> {
    pub(super) class: &'a str,
    pub(super) data_path: &'a str,
    pub(super) status: u16,
    pub(super) body_bytes: u64,
    pub(super) started: Instant,
    pub(super) log: Option<&'a LogEntry>,
}

/// Counts a request that ended (answered or cut) and writes its access log line.
fn record(
    shared: &HttpShared,
    access: &mut Option<LogBuffer>,
    peer: Option<IpAddr>,
    r: &RequestEnd<'_>,
) {
    let now = Instant::now();
    let elapsed = now.saturating_duration_since(r.started);
    shared
        .metrics
        .request(r.class, r.data_path, r.status, r.body_bytes, elapsed);
    if let (Some(a), Some(entry)) = (access.as_mut(), r.log) {
        a.line(
            &Finished {
                peer,
                entry,
                status: r.status,
                body_bytes: r.body_bytes,
                elapsed,
                data_path: r.data_path,
            },
            now,
        );
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
