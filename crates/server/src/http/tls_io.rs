//! TLS connections in the loop (docs/tls.md). A connection accepted on an `https://`
//! listener starts in `State::Handshake` with a rustls session and the handshake's deadline
//! (`[tls] handshake_timeout_ms`, cut by the sweep). Its first bytes are looked at before
//! rustls sees them: a plain HTTP request (a method in capitals) is answered `400` in
//! clear and closed, as nginx does; anything else that is not TLS ends in a rustls error
//! and a close (with its alert). When the handshake is over, [`crate::tls::plan`] decides
//! the path, once:
//!
//! - `ktls`: `TCP_ULP "tls"`, then the keys to the kernel ([`crate::tls::hand_to_kernel`]);
//!   the connection then reads and writes plaintext like a plain one, and file bodies keep
//!   `sendfile` (`path=ktls`). A kernel that refuses the ULP leaves the session in rustls.
//! - `tls-user`: rustls stays; reads decrypt into the request buffer
//!   ([`read_tls_into`]), and [`write_out_tls`] encrypts the head and body: a file body is
//!   read with `pread` into the worker's scratch buffer (16 KiB, one TLS record) and
//!   written through rustls, whose outgoing buffer is bounded (64 KiB, rustls's default
//!   limit) and drained before more is read. Engine, origin and volume bodies write to the
//!   socket themselves: on these connections the loop sends file bodies and answers origin
//!   and volume requests 503 (said once in the log).

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::FileExt;
use std::time::Instant;

use penstock_core::http::BodyPiece;
use rustix::event::epoll;
use rustix::net::{RecvFlags, SendFlags};
use rustls::ServerConnection;

use super::send::{BUDGET_SYSCALLS, Out, Progress};
use super::{Conn, Interest, SCRATCH_BYTES, State, Worker, conn_in, set_interest, token};
use crate::metrics::{Metrics, TlsPathLabel};
use crate::tls::{TlsPath, plan};

/// A connection's TLS.
pub(super) enum ConnTls {
    Plain,
    /// The handshake is under way.
    Handshake(Box<ServerConnection>),
    /// rustls encrypts and decrypts (`path=tls-user`).
    User(Box<ServerConnection>),
    /// The kernel does (`path=ktls`): the socket carries plaintext for us.
    Ktls,
}

/// What a response may use on its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    Plain,
    Ktls,
    User,
}

impl ConnTls {
    pub(super) fn mode(&self) -> Mode {
        match self {
            ConnTls::Plain => Mode::Plain,
            ConnTls::Ktls => Mode::Ktls,
            ConnTls::Handshake(_) | ConnTls::User(_) => Mode::User,
        }
    }
}

/// What a plain HTTP request sent to a TLS port reads before the close (nginx's answer).
const PLAIN_TO_TLS: &[u8] = b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 46\r\nConnection: close\r\n\r\nThe plain HTTP request was sent to HTTPS port\n";

/// Reads of the socket per handshake event, at most (each up to rustls's buffer).
const HANDSHAKE_READS_MAX: usize = 16;

/// Whether a connection's first bytes are an HTTP request line rather than a TLS record
/// (which starts with 0x16, a handshake record): a method is capital letters.
fn looks_like_http(first: &[u8]) -> bool {
    !first.is_empty() && first.iter().take(3).all(u8::is_ascii_uppercase)
}

impl Worker {
    /// A TLS connection's socket is ready during its handshake.
    pub(super) fn handshake_event(&mut self, idx: u32, generation: u32, flags: epoll::EventFlags) {
        let metrics = self.shared.metrics.clone();
        let Some(c) = conn_in(&mut self.slots, idx, generation) else {
            return;
        };
        if flags.intersects(epoll::EventFlags::ERR) {
            metrics.error("tls_handshake_failed");
            self.close(idx);
            return;
        }
        // The first bytes, before rustls: plain HTTP gets nginx's 400 in clear.
        if c.head_started.is_none() {
            let mut first = [0u8; 4];
            if let Ok((n, _)) = rustix::net::recv(&c.sock, &mut first, RecvFlags::PEEK)
                && n > 0
            {
                c.head_started = Some(Instant::now());
                if looks_like_http(&first[..n]) {
                    let _ = rustix::net::send(&c.sock, PLAIN_TO_TLS, SendFlags::NOSIGNAL);
                    metrics.error("tls_plain_http");
                    // Lingering: the request is read and dropped, so the 400 is not lost
                    // to a reset.
                    self.linger(idx, generation);
                    return;
                }
            }
        }
        let ConnTls::Handshake(tls) = &mut c.tls else {
            return;
        };
        let mut failed = false;
        for _ in 0..HANDSHAKE_READS_MAX {
            if !tls.wants_read() {
                break;
            }
            let mut s = &c.sock;
            match tls.read_tls(&mut s) {
                Ok(0) => {
                    c.peer_eof = true;
                    break;
                }
                Ok(_) => {
                    if let Err(e) = tls.process_new_packets() {
                        tracing::debug!(peer = ?c.peer, error = %e, "TLS handshake refused");
                        failed = true;
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    c.peer_eof = true;
                    break;
                }
            }
        }
        // What rustls has to say goes out (its flight, or the alert of a failure).
        let flushed = flush(tls, &c.sock);
        if failed || c.peer_eof || flushed.is_err() {
            metrics.error(if failed {
                "tls_handshake_failed"
            } else {
                "tls_handshake_eof"
            });
            self.close(idx);
            return;
        }
        let blocked = flushed == Ok(false);
        if tls.is_handshaking() || blocked {
            let want = if blocked {
                Interest::Write
            } else {
                Interest::Read
            };
            let _ = set_interest(&self.epoll, c, token(idx, generation), want);
            return;
        }
        self.finish_handshake(idx, generation);
    }

    /// The handshake is over and everything rustls had to send is out: the path is planned
    /// and the connection starts reading requests.
    fn finish_handshake(&mut self, idx: u32, generation: u32) {
        let ktls_allowed = self.shared.tls.as_ref().is_some_and(|t| t.ktls());
        let metrics = self.shared.metrics.clone();
        let now = Instant::now();
        let idle = self.live.limits.idle_timeout();
        let cap = self.live.limits.header_bytes_max + SCRATCH_BYTES;
        let Some(c) = conn_in(&mut self.slots, idx, generation) else {
            return;
        };
        let ConnTls::Handshake(mut tls) = std::mem::replace(&mut c.tls, ConnTls::Plain) else {
            return;
        };
        c.head_started = None;
        // A request that came with the client's Finished is decrypted already.
        take_buffered(&mut tls, &mut c.inbuf, cap, &mut c.peer_eof);
        let mut path = tls
            .negotiated_cipher_suite()
            .map_or(TlsPath::User, |s| plan(ktls_allowed, s.suite()));
        if path == TlsPath::Ktls
            && let Err(e) = penstock_uring::ktls::attach_ulp(&c.sock)
        {
            say_once_ktls(&format!(
                "the kernel refused TCP_ULP \"tls\" ({e}): user-space TLS"
            ));
            path = TlsPath::User;
        }
        match path {
            TlsPath::Ktls => {
                if let Err(e) = crate::tls::hand_to_kernel(&c.sock, *tls) {
                    say_once_ktls(&format!(
                        "handing the keys to the kernel failed ({e}): such connections are closed"
                    ));
                    metrics.error("ktls_setup_failed");
                    self.close(idx);
                    return;
                }
                c.tls = ConnTls::Ktls;
            }
            TlsPath::User => c.tls = ConnTls::User(tls),
        }
        metrics
            .tls_handshakes
            .get_or_create(&TlsPathLabel {
                path: path.label().to_string(),
            })
            .inc();
        c.state = State::Reading;
        c.deadline = now + idle;
        if !c.inbuf.is_empty() {
            c.head_started = Some(now);
        }
        let _ = set_interest(&self.epoll, c, token(idx, generation), Interest::Read);
        // Data the kernel holds (kTLS) or that came early is read now.
        self.on_event(idx, generation, epoll::EventFlags::IN);
    }
}

fn say_once_ktls(what: &str) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!("kTLS: {what} (said once)");
    }
}

/// Sends what rustls holds: `Ok(true)` all out, `Ok(false)` the socket is full.
fn flush(tls: &mut ServerConnection, sock: &TcpStream) -> Result<bool, &'static str> {
    while tls.wants_write() {
        let mut s = sock;
        match tls.write_tls(&mut s) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_kind(&e)),
        }
    }
    Ok(true)
}

fn io_kind(e: &io::Error) -> &'static str {
    match e.kind() {
        io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::NotConnected => "client_vanished",
        _ => "send_failed",
    }
}

/// Moves plaintext rustls has decrypted into `inbuf` (up to `cap`), without touching the
/// socket; sets `peer_eof` at the client's close_notify or a close without one. Returns
/// the bytes moved.
pub(super) fn take_buffered(
    tls: &mut ServerConnection,
    inbuf: &mut Vec<u8>,
    cap: usize,
    peer_eof: &mut bool,
) -> usize {
    let mut got = 0;
    while inbuf.len() < cap && !*peer_eof {
        let old = inbuf.len();
        let want = (cap - old).min(SCRATCH_BYTES);
        inbuf.resize(old + want, 0);
        match tls.reader().read(&mut inbuf[old..]) {
            Ok(0) => {
                inbuf.truncate(old);
                *peer_eof = true;
            }
            Ok(n) => {
                inbuf.truncate(old + n);
                got += n;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                inbuf.truncate(old);
                break;
            }
            Err(_) => {
                inbuf.truncate(old);
                *peer_eof = true;
            }
        }
    }
    got
}

/// The `Reading` state's read on a `tls-user` connection: records from the socket through
/// rustls into `inbuf`, up to `cap` (the rest waits, in rustls or the socket).
#[allow(clippy::too_many_arguments)]
pub(super) fn read_tls_into(
    tls: &mut ServerConnection,
    sock: &TcpStream,
    inbuf: &mut Vec<u8>,
    cap: usize,
    peer_eof: &mut bool,
    head_started: &mut Option<Instant>,
    metrics: &Metrics,
) {
    let was_empty = inbuf.is_empty();
    // Each turn moves plaintext or reads the socket once; bounded like the plain read.
    for _ in 0..64 {
        if inbuf.len() >= cap || *peer_eof {
            break;
        }
        if take_buffered(tls, inbuf, cap, peer_eof) > 0 || *peer_eof {
            continue;
        }
        let mut s = sock;
        match tls.read_tls(&mut s) {
            Ok(0) => *peer_eof = true,
            Ok(_) => {
                if let Err(e) = tls.process_new_packets() {
                    tracing::debug!(error = %e, "TLS record refused");
                    metrics.error("tls_record");
                    let _ = flush(tls, sock);
                    *peer_eof = true;
                    inbuf.clear();
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => *peer_eof = true,
        }
    }
    if was_empty && !inbuf.is_empty() {
        *head_started = Some(Instant::now());
    }
}

/// [`super::send::write_out`] for a `tls-user` connection: the same pieces, encrypted by
/// rustls. Plaintext goes in a chunk (`buf.len()` bytes) at a time until rustls's bounded
/// outgoing buffer (64 KiB) refuses more; then the records go out, and more is added only
/// once they all left.
pub(super) fn write_out_tls(
    sock: &TcpStream,
    tls: &mut ServerConnection,
    out: &mut Out,
    now: Instant,
    buf: &mut [u8],
) -> Progress {
    let mut calls = 0;
    // rustls's outgoing buffer refused part of the last chunk: send before adding more.
    let mut full = false;
    loop {
        let more = out.head_pos < out.head.len() || !out.pieces.is_empty();
        // Records go out when the buffer is full or nothing more is to be added: a few
        // records per `write` call rather than one.
        if tls.wants_write() && (full || !more) {
            if calls >= BUDGET_SYSCALLS {
                return Progress::Yield;
            }
            calls += 1;
            match flush(tls, sock) {
                Ok(true) => full = false,
                Ok(false) => return Progress::WouldBlock,
                Err(kind) => return Progress::Failed(kind),
            }
        }
        if !more {
            return Progress::Done;
        }
        if out.head_pos < out.head.len() {
            let want = out.head.len() - out.head_pos;
            match tls.writer().write(&out.head[out.head_pos..]) {
                // Nothing taken with nothing to send would never end.
                Ok(0) if !tls.wants_write() => return Progress::Failed("tls_write"),
                Ok(n) => {
                    out.head_pos += n;
                    full = n < want;
                }
                Err(_) => return Progress::Failed("tls_write"),
            }
            continue;
        }
        let Some(front) = out.pieces.front() else {
            continue;
        };
        let allowance = match out.rate.as_mut().map(|r| r.allowance(now, out.body_sent)) {
            None => u64::MAX,
            Some(Ok(n)) => n,
            Some(Err(at)) => {
                // What is buffered goes now, not after the wait.
                return match flush(tls, sock) {
                    Ok(true) => Progress::RateWait(at),
                    Ok(false) => Progress::WouldBlock,
                    Err(kind) => Progress::Failed(kind),
                };
            }
        };
        let left = front.len_bytes() - out.piece_pos;
        let want = left.min(allowance).min(buf.len() as u64) as usize;
        let written = match front {
            BodyPiece::Bytes(b) => {
                let start = out.piece_pos as usize;
                tls.writer().write(&b[start..start + want]).inspect(|&n| {
                    if n < want {
                        full = true;
                    }
                })
            }
            BodyPiece::File { offset_bytes, .. } => {
                let Some(file) = &out.file else {
                    return Progress::Failed("internal");
                };
                let off = offset_bytes + out.piece_pos;
                let got = loop {
                    match file.read_at(&mut buf[..want], off) {
                        Ok(0) => return Progress::Failed("file_shrank"),
                        Ok(n) => break n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => return Progress::Failed("read_failed"),
                    }
                };
                tls.writer().write(&buf[..got]).inspect(|&n| {
                    // Bytes read but refused are read again next time (from the page cache).
                    if n < got {
                        full = true;
                    }
                })
            }
        };
        let n = match written {
            Ok(n) => n as u64,
            Err(_) => return Progress::Failed("tls_write"),
        };
        if n == 0 {
            full = true;
            if !tls.wants_write() {
                return Progress::Failed("tls_write");
            }
        }
        out.piece_pos += n;
        out.body_sent += n;
        if out.piece_pos == front.len_bytes() {
            out.pieces.pop_front();
            out.piece_pos = 0;
        }
    }
}

/// A short answer outside a response (the 408 of a slow head): through rustls on a
/// `tls-user` connection, nothing during a handshake, as is otherwise. Best effort.
pub(super) fn send_small(c: &mut Conn, bytes: &[u8]) {
    match &mut c.tls {
        ConnTls::User(tls) => {
            let _ = tls.writer().write_all(bytes);
            let _ = flush(tls, &c.sock);
        }
        ConnTls::Handshake(_) => {}
        ConnTls::Plain | ConnTls::Ktls => {
            let _ = rustix::net::send(&c.sock, bytes, SendFlags::NOSIGNAL);
        }
    }
}

/// Before the write side closes: a TLS connection says close_notify (best effort):
/// rustls's record for `tls-user`, an alert record the kernel makes (a `TLS_SET_RECORD_TYPE`
/// control message) for kTLS.
pub(super) fn close_notify(c: &mut Conn) {
    match &mut c.tls {
        ConnTls::User(tls) => {
            tls.send_close_notify();
            let _ = flush(tls, &c.sock);
        }
        ConnTls::Ktls => {
            let _ = penstock_uring::ktls::send_close_notify(&c.sock);
        }
        ConnTls::Handshake(_) | ConnTls::Plain => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_http_method_is_not_a_tls_record() {
        assert!(looks_like_http(b"GET "));
        assert!(looks_like_http(b"HEAD"));
        assert!(!looks_like_http(b"\x16\x03\x01\x02"));
        assert!(!looks_like_http(b""));
        assert!(!looks_like_http(b"get "));
    }
}
