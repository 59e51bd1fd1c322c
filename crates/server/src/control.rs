//! The control protocol server (grammar: `docs/control-protocol.md`; who may do what:
//! `docs/security.md`).
//!
//! Control connections are few and their commands may block on the connection's own
//! endpoints (a `START` connects, a `CLOSE` waits for in-flight I/O), so each gets a thread:
//! at most `tcp_connections_max` TCP and, counted apart so that TCP peers never lock them
//! out, `unix_connections_max` Unix-socket connections. A connection reads lines with
//! [`next_line`] into a buffer bounded by the line limit and answers each with exactly one
//! reply, in order. Listeners and connections wake every 200 ms to notice shutdown and their
//! timeouts. A reaper thread moves finished streams out of `running` every 5 ms (closing
//! their endpoints, so receivers see EOF) and expires stale ones.
//!
//! Identity: a Unix-socket peer whose `SO_PEERCRED` uid (or primary gid) is allowed
//! (`unix_allow_uids`, default the server's own uid) may open streams and drive its own;
//! a peer that sends the token with `AUTH` may drive any stream (Cues' remote control). A
//! loopback TCP address says nothing about who the peer is: any other peer may send only
//! `HELP`, `QUIT` and `AUTH` (401), and is closed after `auth_timeout_ms`. A wrong token is
//! answered more slowly each time and closes the connection after `auth_failures_max`.
//! A connection with no stream of its own, silent for `idle_timeout_ms`, is closed.
//! Out of descriptors, the listeners pause `accept_backoff_ms` and log once per interval.
//!
//! Descriptor hand-off: on a Unix connection lines are read with recvmsg(2), and the
//! descriptors an allowed peer passes (SCM_RIGHTS, at most [`FDS_PER_MESSAGE_MAX`] a message,
//! `unix_fds_held_max` held) are taken by the next line's `OPEN fd fd` or closed once that
//! line is answered; anyone else's are closed on arrival and the line refused (403).
//!
//! A *stream's own descriptor* (Cues' control descriptor: the C library's `penstock_cue()`)
//! is a connection made for one stream ([`Session::for_stream`], served by
//! [`serve_stream_descriptor`]): there the id may be left out of a command, and the
//! connection drives that stream only (no `OPEN`, no other id). `CUE` (an allowed Unix peer's
//! `OPEN` whose reply carries such a descriptor, by SCM_RIGHTS) makes one in the server for a
//! process that hands its descriptors over (the C library's `penstock_conn_cue()`).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use penstock_core::control::{
    Command, ControlError, Limits, Reply, ReplyCode, StreamId, StreamSelector, next_line,
    parse_command_bytes_on,
};

use penstock_core::control::OpenSpec;
use penstock_core::endpoint::Role;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use crate::config::ControlConfig;
use crate::streams::{Caller, Edit, Given, Identity, Streams};

const POLL_MS: u64 = 200;
/// Descriptors one message (one sendmsg(2)) may carry: `OPEN fd fd` needs two.
pub const FDS_PER_MESSAGE_MAX: usize = 2;

/// A message came with more descriptors than [`FDS_PER_MESSAGE_MAX`] (some of them cut off
/// by the kernel: `MSG_CTRUNC`, or all there but too many).
#[derive(Debug)]
struct TruncatedFds;

impl std::fmt::Display for TruncatedFds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a message carried more than {FDS_PER_MESSAGE_MAX} descriptors"
        )
    }
}

impl std::error::Error for TruncatedFds {}
/// At most one "accept failed" warning per listener per this long (with a count).
const ACCEPT_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// A wrong token's reply waits this long times the connection's failures so far.
const AUTH_FAIL_DELAY: Duration = Duration::from_millis(250);

/// An `OPEN` refused by admission (503) while in a cluster: the reply names a node with
/// rt bandwidth left, chosen by the ring from the stream's source (docs/control-protocol.md,
/// "Redirects"): `503 refused …; redirect node=NAME control=HOST:PORT`. The code stays 503,
/// so clients that do not look for the redirect see the refusal they always saw.
fn redirect_refused(
    shared: &ControlShared,
    reply: Reply,
    spec: &penstock_core::control::OpenSpec,
) -> Reply {
    if reply.code != ReplyCode::REFUSED || !reply.text.starts_with("refused") {
        return reply;
    }
    let Some(view) = shared.cluster.get() else {
        return reply;
    };
    // The rate asked, where it is in bytes; else any node with bandwidth left.
    let need = match spec.rate {
        Some(penstock_core::units::Rate::BitsPerSecond(b)) => b / 8,
        _ => 1,
    };
    match view.redirect_control(&spec.src, need) {
        Some((node, addr)) => Reply::new(
            reply.code,
            format!("{}; redirect node={node} control={addr}", reply.text),
        ),
        None => reply,
    }
}

/// The control server's shared state: the stream table, the configuration, the token.
pub struct ControlShared {
    pub(crate) streams: Arc<Streams>,
    pub(crate) config: ControlConfig,
    pub(crate) token: String,
    pub(crate) stop: AtomicBool,
    /// A wrong token's reply waits this long times the connection's failures so far.
    auth_fail_delay: Duration,
    tcp_conns: AtomicUsize,
    unix_conns: AtomicUsize,
    /// Unix connections of other uids than the server's own (`unix_owner_reserved`).
    unix_others: AtomicUsize,
    /// Of those, per uid (`unix_connections_per_uid_max`); a uid with none is removed.
    unix_per_uid: std::sync::Mutex<std::collections::HashMap<u32, usize>>,
    /// TCP connections per client address (`tcp_connections_per_address_max`).
    tcp_per_address: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
    next_conn: AtomicU64,
    own_uid: u32,
    /// Extra `STATS` lines from the HTTP side.
    pub(crate) http_connections: Box<dyn Fn() -> usize + Send + Sync>,
    /// The cluster's membership, for redirects of refused OPENs (set once, after start).
    pub(crate) cluster: std::sync::OnceLock<Arc<crate::cluster::View>>,
    /// The last [`REFUSALS_KEPT`] refused commands, newest last (the API's dashboard).
    refusals: std::sync::Mutex<std::collections::VecDeque<Refusal>>,
}

/// How many refused commands [`ControlShared::refusals`] keeps.
pub const REFUSALS_KEPT: usize = 32;

/// A command the control code refused (any 4xx or 5xx reply but 401), from any caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// When, in milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// The command's verb (`OPEN`, `START`, …).
    pub verb: &'static str,
    pub code: u16,
    /// The reply's text: the reason.
    pub text: String,
}

impl ControlShared {
    pub fn new(
        streams: Arc<Streams>,
        config: ControlConfig,
        token: String,
        http_connections: Box<dyn Fn() -> usize + Send + Sync>,
    ) -> ControlShared {
        ControlShared {
            streams,
            config,
            token,
            stop: AtomicBool::new(false),
            tcp_conns: AtomicUsize::new(0),
            unix_conns: AtomicUsize::new(0),
            unix_others: AtomicUsize::new(0),
            unix_per_uid: std::sync::Mutex::new(std::collections::HashMap::new()),
            tcp_per_address: std::sync::Mutex::new(std::collections::HashMap::new()),
            next_conn: AtomicU64::new(1),
            own_uid: rustix::process::geteuid().as_raw(),
            http_connections,
            cluster: std::sync::OnceLock::new(),
            auth_fail_delay: AUTH_FAIL_DELAY,
            refusals: std::sync::Mutex::new(std::collections::VecDeque::new()),
        }
    }

    /// A fresh connection number (an API request's: the streams it opens are its own).
    pub(crate) fn new_conn_id(&self) -> u64 {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    /// The last refused commands, oldest first.
    pub fn refusals(&self) -> Vec<Refusal> {
        self.refusals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    fn note_refusal(&self, verb: &'static str, reply: &Reply) {
        let code = reply.code.code();
        if code < 400 || code == ReplyCode::AUTH_REQUIRED.code() {
            return;
        }
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut q = self.refusals.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() == REFUSALS_KEPT {
            q.pop_front();
        }
        q.push_back(Refusal {
            unix_ms,
            verb,
            code,
            text: reply.text.clone(),
        });
    }

    /// The same with another delay after a wrong token (tests and the session fuzz target
    /// use 0).
    pub fn with_auth_fail_delay(mut self, d: Duration) -> ControlShared {
        self.auth_fail_delay = d;
        self
    }

    /// The stream table.
    pub fn streams(&self) -> &Arc<Streams> {
        &self.streams
    }

    /// Tells every connection and the reaper to stop (they notice within 200 ms; each
    /// connection answers `421` and closes).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    fn conns(&self, unix: bool) -> &AtomicUsize {
        if unix {
            &self.unix_conns
        } else {
            &self.tcp_conns
        }
    }
}

/// A connection's transport.
enum Peer {
    Tcp(std::net::TcpStream, SocketAddr),
    /// A `tls://` listener's connection: the handshake runs at its first read, under the
    /// connection's read timeouts (docs/tls.md).
    Tls(
        Box<rustls::StreamOwned<rustls::ServerConnection, std::net::TcpStream>>,
        SocketAddr,
    ),
    Unix(std::os::unix::net::UnixStream),
}

impl Peer {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Peer::Tcp(s, _) => s.read(b),
            Peer::Tls(s, _) => s.read(b),
            Peer::Unix(s) => s.read(b),
        }
    }

    /// Reads like [`Peer::read`]; on a Unix connection with recvmsg(2), moving the
    /// descriptors that arrive with the bytes (SCM_RIGHTS, at most [`FDS_PER_MESSAGE_MAX`],
    /// close-on-exec) into `fds`. More descriptors than that (some cut off by the kernel,
    /// `MSG_CTRUNC`, or all there) is an error, after what arrived is closed.
    fn read_with_fds(&mut self, b: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
        let Peer::Unix(s) = self else {
            return self.read(b);
        };
        let mut space =
            [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS_PER_MESSAGE_MAX))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let got = rustix::net::recvmsg(
            &*s,
            &mut [io::IoSliceMut::new(b)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        )?;
        let mut arrived = Vec::new();
        for m in control.drain() {
            if let RecvAncillaryMessage::ScmRights(passed) = m {
                arrived.extend(passed);
            }
        }
        // The buffer is rounded up for alignment and may hold a few more than the limit:
        // those are as refused as the ones the kernel cut off.
        if got.flags.contains(ReturnFlags::CTRUNC) || arrived.len() > FDS_PER_MESSAGE_MAX {
            drop(arrived); // closes what did arrive
            return Err(io::Error::other(TruncatedFds));
        }
        fds.extend(arrived);
        Ok(got.bytes)
    }

    fn write_all(&mut self, b: &[u8]) -> io::Result<()> {
        match self {
            Peer::Tcp(s, _) => s.write_all(b),
            Peer::Tls(s, _) => s.write_all(b).and_then(|()| s.flush()),
            Peer::Unix(s) => s.write_all(b),
        }
    }

    /// Writes `b` with `fd` attached (SCM_RIGHTS) to its first byte; a Unix connection only
    /// (on TCP the descriptor is dropped, and with it what it held open).
    fn write_all_with_fd(&mut self, b: &[u8], fd: OwnedFd) -> io::Result<()> {
        let Peer::Unix(s) = self else {
            return self.write_all(b);
        };
        let fds = [fd.as_fd()];
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(io::Error::other("no room for a descriptor"));
        }
        let sent = rustix::net::sendmsg(
            &*s,
            &[io::IoSlice::new(b)],
            &mut control,
            SendFlags::NOSIGNAL,
        )?;
        // The descriptor went with the first byte; the rest of a cut line follows plainly.
        s.write_all(&b[sent..])
    }

    fn is_unix(&self) -> bool {
        matches!(self, Peer::Unix(_))
    }

    fn describe(&self) -> String {
        match self {
            Peer::Tcp(_, a) => a.to_string(),
            Peer::Tls(_, a) => format!("tls {a}"),
            Peer::Unix(s) => match rustix::net::sockopt::socket_peercred(s) {
                Ok(c) => format!("unix uid {} pid {}", c.uid.as_raw(), c.pid.as_raw_nonzero()),
                Err(_) => "unix".into(),
            },
        }
    }

    /// Who the peer is before any `AUTH`: an allowed Unix peer, or nobody in particular.
    fn identity(&self, config: &ControlConfig, own_uid: u32) -> Identity {
        match self {
            Peer::Tcp(..) | Peer::Tls(..) => Identity::Anonymous,
            Peer::Unix(s) => match rustix::net::sockopt::socket_peercred(s) {
                Ok(c) if config.unix_peer_allowed(c.uid.as_raw(), c.gid.as_raw(), own_uid) => {
                    Identity::Peer {
                        uid: c.uid.as_raw(),
                        gid: c.gid.as_raw(),
                    }
                }
                _ => Identity::Anonymous,
            },
        }
    }
}

/// Starts the reaper alone: a thread that moves finished streams out of `running` every 5 ms
/// (closing their endpoints, so receivers see EOF) and expires stale ones, until
/// [`ControlShared::stop`]. [`start`] runs it beside the listeners; a table without listeners
/// (the C library's) runs it on its own.
pub fn start_reaper(shared: Arc<ControlShared>) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("penstock-ctl-reaper".into())
        .spawn(move || {
            // Every 5 ms while streams are open; with none, every 50 ms (a stream opened
            // meanwhile is first looked at up to 50 ms later), so that an idle control
            // server does not wake 200 times a second on a server busy with HTTP.
            while !shared.stop.load(Ordering::Acquire) {
                let idle = shared.streams.is_empty();
                shared.streams.reap();
                std::thread::sleep(Duration::from_millis(if idle { 50 } else { 5 }));
            }
        })
}

/// Starts the TCP listener (if `addr`), the Unix listener (if `unix`) and the reaper.
pub(crate) fn start(
    shared: Arc<ControlShared>,
    tcp: Option<TcpListener>,
    unix: Option<(UnixListener, PathBuf)>,
    tls: Option<Arc<crate::tls::Tls>>,
) -> io::Result<Vec<JoinHandle<()>>> {
    let mut threads = Vec::new();
    if let Some(l) = tcp {
        l.set_nonblocking(true)?;
        let s = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("penstock-ctl-tcp".into())
                .spawn(move || {
                    accept_loop(&s, &l, "tcp", |l| {
                        let (c, a) = l.accept()?;
                        let _ = c.set_nonblocking(false);
                        match &tls {
                            None => Ok(Peer::Tcp(c, a)),
                            Some(t) => {
                                let session = t.accept().map_err(io::Error::other)?;
                                Ok(Peer::Tls(Box::new(rustls::StreamOwned::new(session, c)), a))
                            }
                        }
                    })
                })?,
        );
    }
    if let Some((l, path)) = unix {
        l.set_nonblocking(true)?;
        let s = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("penstock-ctl-unix".into())
                .spawn(move || {
                    accept_loop(&s, &l, "unix", |l| {
                        l.accept().map(|(c, _)| {
                            let _ = c.set_nonblocking(false);
                            Peer::Unix(c)
                        })
                    });
                    let _ = std::fs::remove_file(&path);
                })?,
        );
    }
    threads.push(start_reaper(shared)?);
    Ok(threads)
}

/// Whether an accept error means the process or system is out of a resource (then accepting
/// again at once would fail the same way: back off).
fn out_of_resources(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc_errno::EMFILE | libc_errno::ENFILE | libc_errno::ENOBUFS | libc_errno::ENOMEM)
    )
}

/// The few errno values the accept loop tells apart.
mod libc_errno {
    pub const EMFILE: i32 = rustix::io::Errno::MFILE.raw_os_error();
    pub const ENFILE: i32 = rustix::io::Errno::NFILE.raw_os_error();
    pub const ENOBUFS: i32 = rustix::io::Errno::NOBUFS.raw_os_error();
    pub const ENOMEM: i32 = rustix::io::Errno::NOMEM.raw_os_error();
}

fn accept_loop<L: AsFd>(
    shared: &Arc<ControlShared>,
    l: &L,
    what: &'static str,
    accept: impl Fn(&L) -> io::Result<Peer>,
) {
    let mut failed = 0u64;
    let mut last_error = String::new();
    let mut logged_at: Option<Instant> = None;
    // Out of descriptors, a waiting connection is refused through this one.
    let mut spare = crate::listen::spare_descriptor();
    while !shared.stop.load(Ordering::Acquire) {
        if failed > 0 && logged_at.is_none_or(|t| t.elapsed() >= ACCEPT_LOG_INTERVAL) {
            tracing::warn!(
                listener = what,
                failures = failed,
                error = %last_error,
                backoff_ms = shared.config.accept_backoff_ms,
                "control accept failed; pausing accepts after each failure"
            );
            failed = 0;
            logged_at = Some(Instant::now());
        }
        let mut fds = [rustix::event::PollFd::new(l, rustix::event::PollFlags::IN)];
        let ts = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: (POLL_MS * 1_000_000) as i64,
        };
        if !matches!(rustix::event::poll(&mut fds, Some(&ts)), Ok(n) if n > 0) {
            continue;
        }
        let mut peer = match accept(l) {
            Ok(p) => p,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) if out_of_resources(&e) => {
                failed += 1;
                last_error = e.to_string();
                // Out of descriptors: the spare makes room to refuse one waiting connection
                // (503, closed) instead of leaving it in silence.
                if crate::listen::out_of_descriptors(&e) && spare.take().is_some() {
                    let refused = accept(l).ok();
                    let was_one = refused.is_some();
                    if let Some(mut p) = refused {
                        let _ =
                            p.write_all(b"503 the server is out of descriptors: try again later\n");
                    }
                    spare = crate::listen::spare_descriptor();
                    // Accept fails with EMFILE even when nobody waits: then back off, never
                    // spin.
                    if was_one && spare.is_some() {
                        continue;
                    }
                }
                // The pending connection stays in the backlog; try again after a pause
                // instead of spinning on a listener that stays readable.
                let until = Instant::now() + shared.config.accept_backoff();
                while Instant::now() < until && !shared.stop.load(Ordering::Acquire) {
                    std::thread::sleep(
                        Duration::from_millis(POLL_MS).min(shared.config.accept_backoff()),
                    );
                }
                if spare.is_none() {
                    spare = crate::listen::spare_descriptor();
                }
                continue;
            }
            Err(_) => continue, // ECONNABORTED and the like: that peer is gone.
        };
        let place = match ConnPlace::take(shared, &peer) {
            Ok(p) => p,
            Err(why) => {
                let _ = peer.write_all(format!("503 {why}\n").as_bytes());
                continue;
            }
        };
        let s = shared.clone();
        // A thread that does not start drops the closure, and the place with it.
        let _ = std::thread::Builder::new()
            .name("penstock-ctl".into())
            .spawn(move || {
                let conn = s.next_conn.fetch_add(1, Ordering::Relaxed);
                serve(&s, peer, conn);
                s.streams.connection_closed(conn);
                drop(place);
            });
    }
}

/// A control connection's place among the connection limits, given back when dropped:
/// `tcp_connections_max` and `tcp_connections_per_address_max` for TCP;
/// `unix_connections_max` for the Unix socket, of which other uids than the server's own
/// hold at most `unix_connections_max - unix_owner_reserved`, each at most
/// `unix_connections_per_uid_max`.
struct ConnPlace {
    shared: Arc<ControlShared>,
    unix: bool,
    /// A Unix peer of another uid (counted in `unix_others`).
    other_uid: bool,
    /// That peer's uid, when counted in `unix_per_uid` (`None`: its credentials could not
    /// be read; it is held to `unix_others` alone).
    uid: Option<u32>,
    /// A TCP peer's address (counted in `tcp_per_address`).
    ip: Option<std::net::IpAddr>,
}

impl ConnPlace {
    /// A place for `peer`, or why there is none (the refusal's text, after `503 `).
    fn take(shared: &Arc<ControlShared>, peer: &Peer) -> Result<ConnPlace, String> {
        let cfg = &shared.config;
        let unix = peer.is_unix();
        let (count, cap, key) = if unix {
            (
                &shared.unix_conns,
                cfg.unix_connections_max,
                "control.unix_connections_max",
            )
        } else {
            (
                &shared.tcp_conns,
                cfg.tcp_connections_max,
                "control.tcp_connections_max",
            )
        };
        if count.fetch_add(1, Ordering::AcqRel) >= cap {
            count.fetch_sub(1, Ordering::AcqRel);
            return Err(format!("too many control connections ({key} {cap})"));
        }
        // From here on, dropping `place` gives back what it counted.
        let mut place = ConnPlace {
            shared: shared.clone(),
            unix,
            other_uid: false,
            uid: None,
            ip: None,
        };
        match peer {
            Peer::Unix(s) => {
                let uid = rustix::net::sockopt::socket_peercred(s)
                    .map(|c| c.uid.as_raw())
                    .ok();
                if uid != Some(shared.own_uid) {
                    place.other_uid = true;
                    let others = cfg.unix_others_max();
                    if shared.unix_others.fetch_add(1, Ordering::AcqRel) >= others {
                        // Dropping `place` gives back both counts.
                        return Err(format!(
                            "too many control connections of other users than the server's \
                             ({others}: control.unix_connections_max {cap} less \
                             control.unix_owner_reserved {})",
                            cfg.unix_owner_reserved
                        ));
                    }
                    if let Some(u) = uid {
                        let max = cfg.unix_connections_per_uid_max;
                        let mut m = shared
                            .unix_per_uid
                            .lock()
                            .unwrap_or_else(|p| p.into_inner());
                        let n = m.entry(u).or_insert(0);
                        if *n >= max {
                            return Err(format!(
                                "too many control connections of uid {u} \
                                 (control.unix_connections_per_uid_max {max})"
                            ));
                        }
                        *n += 1;
                        place.uid = Some(u);
                    }
                }
            }
            Peer::Tcp(_, addr) | Peer::Tls(_, addr) => {
                let ip = addr.ip();
                let max = cfg.tcp_connections_per_address_max;
                let mut m = shared
                    .tcp_per_address
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                let n = m.entry(ip).or_insert(0);
                if *n >= max {
                    drop(m);
                    return Err(format!(
                        "too many control connections from {ip} \
                         (control.tcp_connections_per_address_max {max})"
                    ));
                }
                *n += 1;
                place.ip = Some(ip);
            }
        }
        Ok(place)
    }
}

impl Drop for ConnPlace {
    fn drop(&mut self) {
        self.shared.conns(self.unix).fetch_sub(1, Ordering::AcqRel);
        if self.other_uid {
            self.shared.unix_others.fetch_sub(1, Ordering::AcqRel);
        }
        if let Some(u) = self.uid {
            let mut m = self
                .shared
                .unix_per_uid
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if let Some(n) = m.get_mut(&u) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    m.remove(&u);
                }
            }
        }
        if let Some(ip) = self.ip {
            let mut m = self
                .shared
                .tcp_per_address
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if let Some(n) = m.get_mut(&ip) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    m.remove(&ip);
                }
            }
        }
    }
}

/// Compares without an early exit on the first differing byte.
pub(crate) fn token_matches(given: &str, token: &str) -> bool {
    let (a, b) = (given.as_bytes(), token.as_bytes());
    let mut diff = u8::from(a.len() != b.len());
    for (i, &x) in b.iter().enumerate() {
        diff |= x ^ a.get(i).copied().unwrap_or(0);
    }
    diff == 0 && !token.is_empty()
}

/// A connection's own state between commands.
#[derive(Debug)]
pub struct Session {
    caller: Caller,
    auth_failures: u32,
    peer: String,
    /// The one stream a stream's own descriptor drives.
    own: Option<StreamId>,
    /// The peer's `SO_PEERCRED` is allowed (`ControlConfig::unix_peer_allowed`): it may pass
    /// descriptors. The token never allows that.
    may_pass_fds: bool,
    /// Descriptors passed with the line being read, for its `OPEN fd …`; closed after the
    /// next line is answered, whatever it was.
    held_fds: Vec<OwnedFd>,
    /// Why the descriptors that came with the next line were closed on arrival: that line
    /// is answered with this refusal.
    fds_refused: Option<Reply>,
    /// A descriptor to send with the reply being written (`CUE`'s: the stream's own).
    reply_fd: Option<OwnedFd>,
}

impl Session {
    /// Connection `conn`, known as `identity` before any `AUTH`; `peer` names it in logs.
    pub fn new(conn: u64, identity: Identity, peer: String) -> Session {
        Session {
            caller: Caller { conn, identity },
            auth_failures: 0,
            peer,
            own: None,
            may_pass_fds: false,
            held_fds: Vec::new(),
            fds_refused: None,
            reply_fd: None,
        }
    }

    /// Stream `own`'s own descriptor (Cues' control descriptor), on connection `conn` (the
    /// stream's owner): commands may leave the id out, and drive `own` only.
    pub fn for_stream(conn: u64, identity: Identity, peer: String, own: StreamId) -> Session {
        Session {
            own: Some(own),
            ..Session::new(conn, identity, peer)
        }
    }

    /// The stream this connection was made for, if it is a stream's own descriptor.
    pub fn own(&self) -> Option<StreamId> {
        self.own
    }

    pub fn identity(&self) -> Identity {
        self.caller.identity
    }

    /// The connection's number (its streams' owner).
    pub fn conn(&self) -> u64 {
        self.caller.conn
    }
}

/// Answers one command line of `session` (without its line ending): the reply, and whether
/// the connection is to be closed after it.
pub fn handle_line(
    shared: &Arc<ControlShared>,
    session: &mut Session,
    line: &[u8],
) -> (Reply, bool) {
    let limits = Limits {
        line_bytes_max: shared.config.line_bytes_max,
        ..Limits::default()
    };
    let answer = if let Some(refusal) = session.fds_refused.take() {
        (refusal, false)
    } else {
        match parse_command_bytes_on(line, &limits, session.own) {
            Ok(cmd) => execute(shared, session, cmd),
            Err(e) => (e.to_reply(), matches!(e, ControlError::LineTooLong { .. })),
        }
    };
    // Descriptors belong to the line they came with: whatever it did not take is closed.
    session.held_fds.clear();
    answer
}

/// Takes the descriptors just received on `session`'s connection: held for the next line if
/// the peer may pass them and the connection's limit allows, else closed now and that line
/// refused (saying why).
fn receive_fds(shared: &ControlShared, session: &mut Session, mut fds: Vec<OwnedFd>) {
    if fds.is_empty() {
        return;
    }
    let n = fds.len();
    if !session.may_pass_fds {
        fds.clear();
        crate::peer_warn!("control_fds_refused", peer = %session.peer, fds = n, "control: descriptors from a peer not allowed to pass them; closed");
        session.fds_refused = Some(Reply::new(
            ReplyCode::FORBIDDEN,
            format!(
                "descriptors refused and closed: only a Unix-socket peer whose SO_PEERCRED uid \
                 or gid is allowed (control.unix_allow_uids, control.unix_allow_gids) may pass \
                 them, not {} (the token does not allow it)",
                session.peer
            ),
        ));
        return;
    }
    let held_max = shared.config.unix_fds_held_max;
    if session.held_fds.len() + n > held_max {
        fds.clear();
        session.held_fds.clear();
        session.fds_refused = Some(Reply::new(
            ReplyCode::REFUSED,
            format!(
                "descriptors refused and closed: this connection may hold {held_max} at once \
                 (control.unix_fds_held_max); send them with the OPEN line that uses them"
            ),
        ));
        return;
    }
    session.held_fds.append(&mut fds);
}

/// `OPEN` whose source and/or target is `fd`: the descriptors passed with the line, in
/// order (source first), opened as `fd:N` would be and given to the stream.
fn open_passed(shared: &ControlShared, session: &mut Session, spec: &OpenSpec) -> Reply {
    let (spec, given) = match passed_endpoints(session, spec, Given::default()) {
        Ok(x) => x,
        Err(reply) => return reply,
    };
    match shared.streams.open_given(session.caller, &spec, given) {
        Ok((id, details)) => Reply::opened(id, &details),
        Err(reply) => reply,
    }
}

/// The descriptors passed with the line for `spec`'s `fd` endpoints (none: `spec` as it is),
/// opened into `given`, with `spec`'s names for them made `fd:N` labels.
fn passed_endpoints(
    session: &mut Session,
    spec: &OpenSpec,
    mut given: Given,
) -> Result<(OpenSpec, Given), Reply> {
    let held = std::mem::take(&mut session.held_fds);
    if spec.src != PASSED_FD && spec.dst != PASSED_FD && held.is_empty() {
        return Ok((spec.clone(), given));
    }
    if !session.may_pass_fds {
        return Err(Reply::new(
            ReplyCode::FORBIDDEN,
            format!(
                "OPEN fd: only a Unix-socket peer whose SO_PEERCRED uid or gid is allowed \
                 (control.unix_allow_uids, control.unix_allow_gids) may pass descriptors, not \
                 {} (the token does not allow it)",
                session.peer
            ),
        ));
    }
    let roles: Vec<Role> = [(&spec.src, Role::Source), (&spec.dst, Role::Target)]
        .into_iter()
        .filter(|(name, _)| name.as_str() == PASSED_FD)
        .map(|(_, r)| r)
        .collect();
    if held.len() != roles.len() {
        return Err(Reply::new(
            ReplyCode::BAD_SYNTAX,
            format!(
                "the line names {} passed descriptor(s) ('fd') but {} came with it: send \
                 them by SCM_RIGHTS in the same sendmsg(2) as the line, source first",
                roles.len(),
                held.len()
            ),
        ));
    }
    let mut spec = spec.clone();
    for (fd, role) in held.into_iter().zip(roles) {
        // open_fd duplicates it; the received one is closed when `fd` drops here.
        let opened = match penstock_driver::open::open_fd(fd.as_raw_fd(), role) {
            Ok(o) => o,
            Err(e) => {
                return Err(Reply::new(
                    ReplyCode::BAD_SYNTAX,
                    format!("passed {role}: {e}"),
                ));
            }
        };
        let label = format!("fd:{}", opened.fd.as_raw_fd());
        match role {
            Role::Source => {
                spec.src = label;
                given.source = Some(opened);
            }
            Role::Target => {
                spec.dst = label;
                given.target = Some(opened);
            }
        }
    }
    Ok((spec, given))
}

/// `CUE`: `OPEN` (with passed descriptors or names) whose stream belongs to a new
/// connection of its own — one end of a socketpair served like any stream's own descriptor
/// ([`serve_stream_descriptor`]) — and whose other end goes back with the reply
/// (`session.reply_fd`). Counted against `unix_connections_max` while it is open. Only a
/// peer that may pass descriptors may ask (a descriptor can only travel over the Unix
/// socket, and the token does not allow it).
fn cue(shared: &Arc<ControlShared>, session: &mut Session, spec: &OpenSpec) -> Reply {
    if !session.may_pass_fds {
        session.held_fds.clear();
        return Reply::new(
            ReplyCode::FORBIDDEN,
            format!(
                "CUE: only a Unix-socket peer whose SO_PEERCRED uid or gid is allowed \
                 (control.unix_allow_uids, control.unix_allow_gids) receives a stream's \
                 descriptor, not {}; use OPEN",
                session.peer
            ),
        );
    }
    // Like the C library's control descriptors: nobody reaches the stream once its
    // descriptor is closed, so a DETACHED one goes as soon as it ends.
    let given = Given {
        reachable_when_orphaned: false,
        ..Given::default()
    };
    let (spec, given) = match passed_endpoints(session, spec, given) {
        Ok(x) => x,
        Err(reply) => return reply,
    };
    let count = shared.conns(true);
    let cap = shared.config.unix_connections_max;
    if count.fetch_add(1, Ordering::AcqRel) >= cap {
        count.fetch_sub(1, Ordering::AcqRel);
        return Reply::new(
            ReplyCode::REFUSED,
            format!(
                "CUE: {cap} Unix control connections and stream descriptors are open \
                 (control.unix_connections_max); close some"
            ),
        );
    }
    let release = |r: Reply| {
        shared.conns(true).fetch_sub(1, Ordering::AcqRel);
        r
    };
    let (mine, theirs) = match std::os::unix::net::UnixStream::pair() {
        Ok(p) => p,
        Err(e) => {
            return release(Reply::new(
                ReplyCode::REFUSED,
                format!("CUE: socketpair: {e}"),
            ));
        }
    };
    let caller = Caller {
        conn: shared.next_conn.fetch_add(1, Ordering::Relaxed),
        identity: session.caller.identity,
    };
    let (id, details) = match shared.streams.open_given(caller, &spec, given) {
        Ok(x) => x,
        Err(reply) => return release(reply),
    };
    let own = Session::for_stream(
        caller.conn,
        caller.identity,
        format!("{} (stream {id}'s descriptor)", session.peer),
        id,
    );
    let s = shared.clone();
    let spawned = std::thread::Builder::new()
        .name("penstock-ctl-cue".into())
        .spawn(move || {
            serve_stream_descriptor(&s, mine, own);
            s.streams.connection_closed(caller.conn);
            s.conns(true).fetch_sub(1, Ordering::AcqRel);
        });
    if let Err(e) = spawned {
        shared.streams.connection_closed(caller.conn);
        return release(Reply::new(
            ReplyCode::REFUSED,
            format!("CUE: could not start a thread: {e}"),
        ));
    }
    session.reply_fd = Some(OwnedFd::from(theirs));
    Reply::opened(id, &details)
}

/// The endpoint word of `OPEN` that means "a descriptor passed with this line".
pub const PASSED_FD: &str = "fd";

/// Serves a stream's own descriptor (the local end of a socketpair whose other end the
/// caller holds) with `session` ([`Session::for_stream`]) until the peer closes it, sends
/// `QUIT`, or the table stops; then returns. The caller then calls
/// [`Streams::connection_closed`] (the stream is closed unless it was opened `DETACHED`).
/// Lines, replies, limits and timeouts are those of any control connection.
pub fn serve_stream_descriptor(
    shared: &Arc<ControlShared>,
    stream: std::os::unix::net::UnixStream,
    session: Session,
) {
    serve_session(shared, Peer::Unix(stream), session);
}

fn serve(shared: &Arc<ControlShared>, peer: Peer, conn: u64) {
    let identity = peer.identity(&shared.config, shared.own_uid);
    let mut session = Session::new(conn, identity, peer.describe());
    session.may_pass_fds = matches!(identity, Identity::Peer { .. });
    serve_session(shared, peer, session);
}

fn serve_session(shared: &Arc<ControlShared>, mut peer: Peer, mut session: Session) {
    let conn = session.conn();
    let identity = session.identity();
    let timeout = Some(Duration::from_millis(POLL_MS));
    let _ = match &peer {
        Peer::Tcp(s, _) => s.set_read_timeout(timeout),
        Peer::Tls(s, _) => s.sock.set_read_timeout(timeout),
        Peer::Unix(s) => s.set_read_timeout(timeout),
    };
    let _ = match &peer {
        Peer::Tcp(s, _) => s.set_write_timeout(Some(shared.config.idle_timeout())),
        Peer::Tls(s, _) => s.sock.set_write_timeout(Some(shared.config.idle_timeout())),
        Peer::Unix(s) => s.set_write_timeout(Some(shared.config.idle_timeout())),
    };
    let limits = Limits {
        line_bytes_max: shared.config.line_bytes_max,
        ..Limits::default()
    };
    let connected = Instant::now();
    let mut last_command = Instant::now();
    // When the first byte of the line not yet complete arrived: the line must be complete
    // within `request_timeout_ms`, however slowly it trickles.
    let mut line_began: Option<Instant> = None;
    let mut buf: Vec<u8> = Vec::with_capacity(512);
    let mut chunk = [0u8; 4096];
    tracing::debug!(conn, peer = %session.peer, ?identity, "control connection");
    loop {
        // Answer every complete line already buffered.
        loop {
            let (reply, consumed, close) = match next_line(&buf, &limits) {
                Ok(None) => break,
                Ok(Some((line, consumed))) => {
                    last_command = Instant::now();
                    line_began = None;
                    let (reply, close) = handle_line(shared, &mut session, line);
                    (reply, consumed, close)
                }
                Err(e) => (e.to_reply(), buf.len(), true),
            };
            buf.drain(..consumed);
            let line = reply.to_line();
            let written = match session.reply_fd.take() {
                Some(fd) => peer.write_all_with_fd(line.as_bytes(), fd),
                None => peer.write_all(line.as_bytes()),
            };
            if written.is_err() || close {
                return;
            }
        }
        if buf.is_empty() {
            line_began = None;
        } else if line_began.is_none() {
            line_began = Some(Instant::now());
        }
        if shared.stop.load(Ordering::Acquire) {
            let _ = peer.write_all(b"421 server shutting down\n");
            return;
        }
        if line_began.is_some_and(|t| t.elapsed() >= shared.config.request_timeout()) {
            let _ = peer.write_all(
                format!(
                    "421 request timeout: a line must be complete within \
                     control.request_timeout_ms {}\n",
                    shared.config.request_timeout_ms
                )
                .as_bytes(),
            );
            return;
        }
        if !session.caller.may_act() && connected.elapsed() >= shared.config.auth_timeout() {
            let _ = peer.write_all(b"421 authentication timeout: AUTH <token> sooner\n");
            return;
        }
        if last_command.elapsed() >= shared.config.idle_timeout()
            && !shared.streams.holds_streams(conn)
        {
            let _ = peer.write_all(b"421 idle timeout\n");
            return;
        }
        let mut fds = Vec::new();
        let got = peer.read_with_fds(&mut chunk, &mut fds);
        receive_fds(shared, &mut session, fds);
        match got {
            Ok(0) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.get_ref().is_some_and(|i| i.is::<TruncatedFds>()) => {
                let _ = peer.write_all(format!("400 {e}; all were closed\n").as_bytes());
                return;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(_) => return,
        }
    }
}

const HELP: &[&str] = &[
    "OPEN fd fd [options]   (Unix socket, allowed peers: the descriptors passed by SCM_RIGHTS with the line, source first; either side may be an endpoint name instead)",
    "CUE <src>|fd <dst>|fd [options]   (Unix socket, allowed peers: OPEN whose reply carries the stream's own descriptor by SCM_RIGHTS; closing it closes the stream unless DETACHED)",
    "OPEN <src> <dst> [class=rt|bulk|NAME] [rate=R] [period=D] [unit=SIZE] [schedule=K,T | pause=K,T] [buffers=N] [offset=SIZE] [length=SIZE] [path=auto|copy|sendfile|splice|uring] [late=send|skip] [cache=keep|bypass|drop] [DETACHED] [TRUNCATE]",
    "SEEK|UNIT|LENGTH <id> <size>   (pending or paused streams)",
    "RATE <id> <rate>   SCHEDULE <id> <k>,<t>",
    "START <id> [AT +DURATION|RFC3339]   PAUSE|RESUME <id>",
    "CLASS <id> rt|bulk|NAME   (moves a stream to another disk class, re-admitted, without stopping it)",
    "TUNE disk [rt_quantum=SIZE] [bulk_quantum=SIZE] [NAME_quantum=SIZE...] [inflight=N]   (a change: the token or the server's own uid)",
    "STATE <id>[,<id>...] | STATE *",
    "CLOSE <id> [NOW]",
    "STATS   AUTH <token>   HELP   QUIT",
    "Before AUTH (or over the Unix socket as an allowed user) only HELP, QUIT and AUTH are answered.",
    "On a stream's own descriptor (penstock_cue) the <id> may be left out: START, SEEK 4096, STATE, CLOSE.",
];

/// The streams a command names (`STATE`: each one), for the own-descriptor rule.
fn named_streams(cmd: &Command) -> Vec<StreamId> {
    match cmd {
        Command::State(StreamSelector::Ids(ids)) => ids.clone(),
        other => other.stream_id().into_iter().collect(),
    }
}

/// Runs one command; returns the reply and whether to close the connection after it.
fn execute(shared: &Arc<ControlShared>, session: &mut Session, cmd: Command) -> (Reply, bool) {
    let streams = &shared.streams;
    match &cmd {
        Command::Help => {
            return (
                Reply::multi(ReplyCode::HELP, HELP.iter().map(|s| s.to_string()), "end"),
                false,
            );
        }
        Command::Quit => return (Reply::new(ReplyCode::BYE, "bye"), true),
        Command::Auth(t) => {
            if token_matches(t.as_str(), &shared.token) {
                session.caller.identity = Identity::Token;
                session.auth_failures = 0;
                return (Reply::ok("authenticated"), false);
            }
            session.auth_failures += 1;
            let n = session.auth_failures;
            crate::peer_warn!("control_wrong_token", peer = %session.peer, failures = n, "control: wrong token");
            // Slower each time (guessing costs time), bounded by the few tries allowed.
            std::thread::sleep(shared.auth_fail_delay * n.min(8));
            let last = n >= shared.config.auth_failures_max;
            let text = if last {
                format!("wrong token ({n} tries): closing")
            } else {
                "wrong token".to_string()
            };
            return (Reply::new(ReplyCode::FORBIDDEN, text), last);
        }
        _ => {}
    }
    if !session.caller.may_act() {
        return (
            Reply::new(
                ReplyCode::AUTH_REQUIRED,
                "AUTH <token> first (or connect to the Unix socket as an allowed user)",
            ),
            false,
        );
    }
    if let Some(own) = session.own {
        // A stream's own descriptor is a capability for that stream, whoever holds it now
        // (it may have been passed to another process): nothing else is reachable through it.
        if matches!(cmd, Command::Open(_) | Command::Cue(_)) {
            return (
                Reply::new(
                    ReplyCode::FORBIDDEN,
                    format!(
                        "this descriptor drives stream {own} only; OPEN on a control connection"
                    ),
                ),
                false,
            );
        }
        if let Some(other) = named_streams(&cmd).into_iter().find(|id| *id != own) {
            return (
                Reply::new(
                    ReplyCode::FORBIDDEN,
                    format!("this descriptor drives stream {own} only, not {other}"),
                ),
                false,
            );
        }
    }
    let c = session.caller;
    let verb = cmd.verb();
    let reply = match cmd {
        Command::Open(spec) if spec.src == PASSED_FD || spec.dst == PASSED_FD => {
            open_passed(shared, session, &spec)
        }
        Command::Open(spec) => redirect_refused(shared, streams.open(c, &spec), &spec),
        Command::Cue(spec) => cue(shared, session, &spec),
        Command::Seek { id, offset_bytes } => streams.edit(c, id, Edit::Seek(offset_bytes)),
        Command::Unit { id, unit_bytes } => streams.edit(c, id, Edit::Unit(unit_bytes)),
        Command::Length { id, length_bytes } => streams.edit(c, id, Edit::Length(length_bytes)),
        Command::Rate { id, rate } => streams.edit(c, id, Edit::Rate(rate)),
        Command::Schedule { id, schedule } => streams.edit(c, id, Edit::Schedule(schedule)),
        Command::Start { id, at } => streams.start(c, id, at),
        Command::TuneDisk(t) => {
            // Every stream on the server shares the disk scheduler: a change is the
            // operator's, not any one client's. A query only reads.
            let operator = match c.identity {
                Identity::Token => true,
                Identity::Peer { uid, .. } => uid == shared.own_uid,
                Identity::Anonymous => false,
            };
            if !t.is_query() && !operator {
                Reply::new(
                    ReplyCode::FORBIDDEN,
                    "TUNE changes the disk scheduler of every stream: it needs the token (AUTH) \
                     or the server's own uid on the Unix socket",
                )
            } else {
                let reply = streams.tune_disk(&t);
                if !t.is_query() && reply.code.is_success() {
                    tracing::info!(peer = %session.peer, "control: {}", reply.text);
                }
                reply
            }
        }
        Command::Pause { id } => streams.pause(c, id),
        Command::Class { id, class } => streams.set_class(c, id, class),
        Command::Resume { id } => streams.resume(c, id),
        Command::State(sel) => streams.state(c, &sel),
        Command::Close { id, now } => streams.close(c, id, now),
        Command::Stats => {
            let mut lines = streams.stats_lines();
            lines.push(format!("http_connections {}", (shared.http_connections)()));
            let (tcp, unix) = (
                shared.tcp_conns.load(Ordering::Relaxed),
                shared.unix_conns.load(Ordering::Relaxed),
            );
            lines.push(format!("control_connections {}", tcp + unix));
            lines.push(format!("control_connections_tcp {tcp}"));
            lines.push(format!("control_connections_unix {unix}"));
            Reply::multi(ReplyCode::STATS, lines, "end")
        }
        _ => Reply::new(ReplyCode::NOT_IMPLEMENTED, "not implemented"),
    };
    shared.note_refusal(verb, &reply);
    (reply, false)
}

#[cfg(test)]
mod tests {
    use super::token_matches;

    #[test]
    fn tokens_compare_whole() {
        assert!(token_matches("abc", "abc"));
        assert!(!token_matches("ab", "abc"));
        assert!(!token_matches("abcd", "abc"));
        assert!(!token_matches("", ""));
    }
}
