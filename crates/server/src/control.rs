//! The control protocol server (grammar: `docs/control-protocol.md`).
//!
//! Control connections are few and their commands may block (a `START` opens endpoints, a
//! `CLOSE` waits for in-flight I/O), so each gets a thread, at most `connections_max` of
//! them. A connection reads lines with [`next_line`] into a buffer bounded by the line
//! limit, answers each with exactly one reply, in order. Listeners and connections wake
//! every 200 ms to notice shutdown. A reaper thread moves finished streams out of
//! `running` every 5 ms (closing their endpoints, so receivers see EOF).
//!
//! Authentication: a peer whose address counts as local (`control.local_peers`, default
//! loopback) and every Unix-socket peer may open streams and drive its own. Any other peer
//! must `AUTH <token>` before anything but `HELP` and `QUIT` (401). Driving a stream another
//! connection opened needs `AUTH` too (Cues' remote control: the id plus the token).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsFd;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use penstock_core::control::{
    Command, ControlError, Limits, Reply, ReplyCode, next_line, parse_command_bytes,
};

use crate::config::ControlConfig;
use crate::streams::{Caller, Edit, Streams};

const POLL_MS: u64 = 200;

pub(crate) struct ControlShared {
    pub(crate) streams: Arc<Streams>,
    pub(crate) config: ControlConfig,
    pub(crate) token: String,
    pub(crate) stop: AtomicBool,
    conns: AtomicUsize,
    next_conn: AtomicU64,
    /// Extra `STATS` lines from the HTTP side.
    pub(crate) http_connections: Box<dyn Fn() -> usize + Send + Sync>,
}

impl ControlShared {
    pub(crate) fn new(
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
            conns: AtomicUsize::new(0),
            next_conn: AtomicU64::new(1),
            http_connections,
        }
    }
}

/// A connection's transport.
enum Peer {
    Tcp(std::net::TcpStream, SocketAddr),
    Unix(std::os::unix::net::UnixStream),
}

impl Peer {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Peer::Tcp(s, _) => s.read(b),
            Peer::Unix(s) => s.read(b),
        }
    }

    fn write_all(&mut self, b: &[u8]) -> io::Result<()> {
        match self {
            Peer::Tcp(s, _) => s.write_all(b),
            Peer::Unix(s) => s.write_all(b),
        }
    }
}

/// Starts the TCP listener (if `addr`), the Unix listener (if `unix`) and the reaper.
pub(crate) fn start(
    shared: Arc<ControlShared>,
    tcp: Option<TcpListener>,
    unix: Option<(UnixListener, PathBuf)>,
) -> io::Result<Vec<JoinHandle<()>>> {
    let mut threads = Vec::new();
    if let Some(l) = tcp {
        l.set_nonblocking(true)?;
        let s = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("penstock-ctl-tcp".into())
                .spawn(move || {
                    accept_loop(&s, &l, |l| {
                        l.accept().map(|(c, a)| {
                            let _ = c.set_nonblocking(false);
                            Peer::Tcp(c, a)
                        })
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
                    accept_loop(&s, &l, |l| {
                        l.accept().map(|(c, _)| {
                            let _ = c.set_nonblocking(false);
                            Peer::Unix(c)
                        })
                    });
                    let _ = std::fs::remove_file(&path);
                })?,
        );
    }
    let s = shared.clone();
    threads.push(
        std::thread::Builder::new()
            .name("penstock-ctl-reaper".into())
            .spawn(move || {
                // Every 5 ms while streams are open; with none, every 50 ms (a stream opened
                // meanwhile is first looked at up to 50 ms later), so that an idle control
                // server does not wake 200 times a second on a server busy with HTTP.
                while !s.stop.load(Ordering::Acquire) {
                    let idle = s.streams.is_empty();
                    s.streams.reap();
                    std::thread::sleep(Duration::from_millis(if idle { 50 } else { 5 }));
                }
            })?,
    );
    Ok(threads)
}

fn accept_loop<L: AsFd>(
    shared: &Arc<ControlShared>,
    l: &L,
    accept: impl Fn(&L) -> io::Result<Peer>,
) {
    while !shared.stop.load(Ordering::Acquire) {
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
            Err(_) => continue,
        };
        if shared.conns.fetch_add(1, Ordering::AcqRel) >= shared.config.connections_max {
            shared.conns.fetch_sub(1, Ordering::AcqRel);
            let _ = peer.write_all(b"503 too many control connections\n");
            continue;
        }
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("penstock-ctl".into())
            .spawn(move || {
                let conn = s.next_conn.fetch_add(1, Ordering::Relaxed);
                serve(&s, peer, conn);
                s.streams.connection_closed(conn);
                s.conns.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            shared.conns.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Compares without an early exit on the first differing byte.
fn token_matches(given: &str, token: &str) -> bool {
    let (a, b) = (given.as_bytes(), token.as_bytes());
    let mut diff = u8::from(a.len() != b.len());
    for (i, &x) in b.iter().enumerate() {
        diff |= x ^ a.get(i).copied().unwrap_or(0);
    }
    diff == 0 && !token.is_empty()
}

fn serve(shared: &ControlShared, mut peer: Peer, conn: u64) {
    let local = match &peer {
        Peer::Tcp(_, a) => shared.config.is_local(a.ip()),
        Peer::Unix(_) => true,
    };
    let timeout = Some(Duration::from_millis(POLL_MS));
    let _ = match &peer {
        Peer::Tcp(s, _) => s.set_read_timeout(timeout),
        Peer::Unix(s) => s.set_read_timeout(timeout),
    };
    let limits = Limits {
        line_bytes_max: shared.config.line_bytes_max,
        ..Limits::default()
    };
    let mut caller = Caller {
        conn,
        authed: false,
    };
    let mut buf: Vec<u8> = Vec::with_capacity(512);
    let mut chunk = [0u8; 4096];
    tracing::debug!(conn, local, "control connection");
    loop {
        // Answer every complete line already buffered.
        loop {
            let (reply, consumed, close) = match next_line(&buf, &limits) {
                Ok(None) => break,
                Ok(Some((line, consumed))) => {
                    let (reply, close) = match parse_command_bytes(line, &limits) {
                        Ok(cmd) => execute(shared, &mut caller, local, cmd),
                        Err(e) => (e.to_reply(), matches!(e, ControlError::LineTooLong { .. })),
                    };
                    (reply, consumed, close)
                }
                Err(e) => (e.to_reply(), buf.len(), true),
            };
            buf.drain(..consumed);
            if peer.write_all(reply.to_line().as_bytes()).is_err() || close {
                return;
            }
        }
        if shared.stop.load(Ordering::Acquire) {
            let _ = peer.write_all(b"421 server shutting down\n");
            return;
        }
        match peer.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
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
    "OPEN <src> <dst> [class=rt|bulk|NAME] [rate=R] [period=D] [unit=SIZE] [schedule=K,T] [buffers=N] [offset=SIZE] [length=SIZE] [path=auto|copy|sendfile|splice|uring] [DETACHED]",
    "SEEK|UNIT|LENGTH <id> <size>   (pending or paused streams)",
    "RATE <id> <rate>   SCHEDULE <id> <k>,<t>",
    "START|PAUSE|RESUME <id>",
    "STATE <id>[,<id>...] | STATE *",
    "CLOSE <id> [NOW]",
    "STATS   AUTH <token>   HELP   QUIT",
];

/// Runs one command; returns the reply and whether to close the connection after it.
fn execute(
    shared: &ControlShared,
    caller: &mut Caller,
    local: bool,
    cmd: Command,
) -> (Reply, bool) {
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
            return if token_matches(t.as_str(), &shared.token) {
                caller.authed = true;
                (Reply::ok("authenticated"), false)
            } else {
                (Reply::new(ReplyCode::FORBIDDEN, "wrong token"), false)
            };
        }
        _ => {}
    }
    if !local && !caller.authed {
        return (
            Reply::new(ReplyCode::AUTH_REQUIRED, "remote peer: AUTH <token> first"),
            false,
        );
    }
    let c = *caller;
    let reply = match cmd {
        Command::Open(spec) => streams.open(c, &spec),
        Command::Seek { id, offset_bytes } => streams.edit(c, id, Edit::Seek(offset_bytes)),
        Command::Unit { id, unit_bytes } => streams.edit(c, id, Edit::Unit(unit_bytes)),
        Command::Length { id, length_bytes } => streams.edit(c, id, Edit::Length(length_bytes)),
        Command::Rate { id, rate } => streams.edit(c, id, Edit::Rate(rate)),
        Command::Schedule { id, schedule } => streams.edit(c, id, Edit::Schedule(schedule)),
        Command::Start { id } => streams.start(c, id),
        Command::Pause { id } => streams.pause(c, id),
        Command::Resume { id } => streams.resume(c, id),
        Command::State(sel) => streams.state(c, &sel),
        Command::Close { id, now } => streams.close(c, id, now),
        Command::Stats => {
            let mut lines = streams.stats_lines();
            lines.push(format!("http_connections {}", (shared.http_connections)()));
            lines.push(format!(
                "control_connections {}",
                shared.conns.load(Ordering::Relaxed)
            ));
            Reply::multi(ReplyCode::STATS, lines, "end")
        }
        _ => Reply::new(ReplyCode::NOT_IMPLEMENTED, "not implemented"),
    };
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
