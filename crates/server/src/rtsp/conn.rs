//! One RTSP connection: requests in, replies out, and — for interleaved sessions — a socket
//! shared with their engine streams.
//!
//! **Interleaved writes** (docs/rtsp.md). A file's interleaved session's engine stream sends
//! its `$ channel length` frames straight to this socket (a duplicate), each whole, holding
//! the connection's [`WriterGate`] from its first byte to its last; this thread takes the
//! same gate for every reply and RTCP frame it writes (`write_gated`), so no message lands
//! inside another. A live source's packets still arrive through a Unix datagram pair and are
//! framed here. A slow client backs the engine's sends up in its ring (the worker never
//! blocks) and, past `send_timeout`, the stream fails; a reply that waits that long for the
//! gate, or a write cut midway (the gate is then broken), ends the connection and its
//! sessions.

use std::cell::RefCell;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixDatagram;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use penstock_core::mp4::{TrackKind, Trick, trick_frames};
use penstock_core::rtp::{Packetizer, SenderSession};
use penstock_core::rtsp::{
    self, Method, Parsed, Reply, Request, RtspLimits, SessionState, TransportAsk,
};
use penstock_core::stream::plan::ZeroCopy;
use penstock_core::stream::{CachePolicy, Extent, IoKind};
use penstock_core::track::Speed;
use penstock_driver::engine::Interleaved;
use penstock_driver::gate::{GateError, WriterGate};
use penstock_driver::open::Opened;
use penstock_driver::{DiskClass, StreamError, StreamSpec, engine::Pacing};
use rustls::ServerConnection;

use super::live::LiveSource;
use super::mp4::TrickSend;
use super::{
    EndReason, LivePlaying, Playing, RtspShared, Session, SessionMedia, Source, Transport,
    random_u64,
};
use crate::confine;
use crate::tls::{Tls, TlsPath, plan};

#[path = "publish.rs"]
mod publish;

/// How long the loop waits for a request or a frame before it looks at its deadlines.
const TURN: Duration = Duration::from_millis(100);
/// Bytes read from the socket at once.
const READ_BYTES: usize = 4096;
/// Datagrams forwarded from one relay per turn at most (the others get their turn).
const FRAMES_PER_TURN_MAX: usize = 64;
/// Before unit 0 is due: time to answer PLAY before the first packet.
const START_DELAY: Duration = Duration::from_millis(20);
/// How long PLAY waits for a stream it replaces (a seek) to stop.
const STOP_WAIT: Duration = Duration::from_secs(1);
/// How long PAUSE waits for the worker to take the pause.
const PAUSE_WAIT: Duration = Duration::from_millis(500);

/// An interleaved session's frames, read here.
struct Relay {
    session: String,
    socket: UnixDatagram,
    /// The reaper's RTCP for this session, written after the pair is drained.
    rtcp_out: super::RtcpOut,
    channels: (u8, u8),
}

/// How the connection's bytes are carried: in clear, or over TLS (an `rtsps://` listener),
/// encrypted by the kernel (`ktls`: the socket takes plaintext, as a plain one) or by the
/// rustls session here (`tls-user`: every byte written goes through it).
enum Wire {
    Plain,
    Ktls,
    User(Box<RefCell<ServerConnection>>),
}

impl Wire {
    /// The TLS path, `None` for plain RTSP.
    fn path(&self) -> Option<TlsPath> {
        match self {
            Wire::Plain => None,
            Wire::Ktls => Some(TlsPath::Ktls),
            Wire::User(_) => Some(TlsPath::User),
        }
    }
}

/// Writes `bytes` on the socket as the wire says: as they are, or through rustls (flushed
/// before returning; the socket's write timeout bounds each send).
fn send_wire(mut stream: &TcpStream, wire: &Wire, bytes: &[u8]) -> io::Result<()> {
    match wire {
        Wire::Plain | Wire::Ktls => stream.write_all(bytes),
        Wire::User(tls) => {
            let mut tls = tls.borrow_mut();
            let mut off = 0;
            while off < bytes.len() {
                let n = tls.writer().write(&bytes[off..])?;
                if n == 0 && !tls.wants_write() {
                    return Err(io::Error::other("rustls took no bytes"));
                }
                off += n;
                flush_tls(&mut tls, stream)?;
            }
            flush_tls(&mut tls, stream)
        }
    }
}

/// Sends every record rustls holds.
fn flush_tls(tls: &mut ServerConnection, mut stream: &TcpStream) -> io::Result<()> {
    while tls.wants_write() {
        match tls.write_tls(&mut stream) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

struct Conn<'a> {
    shared: &'a Arc<RtspShared>,
    stream: TcpStream,
    wire: Wire,
    /// A `tls-user` connection's client sent close_notify.
    peer_closed: bool,
    peer: SocketAddr,
    local: SocketAddr,
    id: u64,
    relays: Vec<Relay>,
    /// One interleaved frame being written (allocated with the first relay).
    frame: Vec<u8>,
    /// One writer at a time on the socket: this thread (replies, RTCP, a live source's
    /// frames) or an interleaved session's engine stream (its RTP frames).
    gate: Arc<WriterGate>,
    /// The connection publishes a live source (ANNOUNCE … RECORD: `publish.rs`).
    publish: Option<publish::Publishing>,
}

/// Writes one whole message on the connection holding its writer gate (waiting at most
/// `timeout` for an engine stream's frame to go out). A write that fails midway leaves the
/// byte stream broken: the gate says so, and no one writes on it again.
fn write_gated(
    gate: &WriterGate,
    stream: &TcpStream,
    wire: &Wire,
    timeout: Duration,
    bytes: &[u8],
) -> io::Result<()> {
    gate.acquire_within(timeout).map_err(|e| match e {
        GateError::TimedOut => io::Error::new(
            io::ErrorKind::TimedOut,
            "an interleaved frame held the connection past rtsp.send_timeout_ms",
        ),
        GateError::Broken => io::Error::new(
            io::ErrorKind::BrokenPipe,
            "an interleaved frame was cut off: the connection's byte stream is broken",
        ),
    })?;
    match send_wire(stream, wire, bytes) {
        Ok(()) => {
            gate.release();
            Ok(())
        }
        Err(e) => {
            gate.break_stream();
            Err(e)
        }
    }
}

/// Answers a connection beyond a connection limit with 503 naming the limit (`why`), and
/// closes it.
pub(super) fn refuse(mut s: TcpStream, why: &str) {
    let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
    // What the client already sent is read first (bounded), so that the close is a FIN:
    // unread input would turn it into a reset.
    if s.set_nonblocking(true).is_ok() {
        let mut b = [0u8; 4096];
        for _ in 0..16 {
            if !matches!(s.read(&mut b), Ok(n) if n > 0) {
                break;
            }
        }
        let _ = s.set_nonblocking(false);
    }
    let mut r = Reply::new(503, None);
    r.body = format!("{why}\n").into_bytes();
    r.content_type = Some("text/plain");
    let _ = s.write_all(&r.encode());
    let _ = s.shutdown(std::net::Shutdown::Write);
}

pub(super) fn serve(
    shared: &Arc<RtspShared>,
    stream: TcpStream,
    peer: SocketAddr,
    id: u64,
    tls: Option<&Tls>,
) {
    let Ok(local) = stream.local_addr() else {
        return;
    };
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_nodelay(true);
    let (wire, early) = match tls {
        None => (Wire::Plain, Vec::new()),
        Some(t) => match handshake(shared, &stream, t, peer) {
            Some(w) => w,
            None => return,
        },
    };
    let _ = stream.set_read_timeout(None);
    let _ = stream.set_write_timeout(Some(shared.cfg.send_timeout()));
    let mut c = Conn {
        shared,
        stream,
        wire,
        peer_closed: false,
        peer,
        local,
        id,
        relays: Vec::new(),
        frame: Vec::new(),
        gate: Arc::new(WriterGate::new()),
        publish: None,
    };
    if let Err(e) = c.run(early) {
        tracing::debug!("rtsp connection {peer}: {e}");
    }
    // A TLS connection says close_notify before the close (best effort, and only when no
    // write was cut midway: a broken stream takes no more records): rustls's for user-space
    // TLS, an alert record made by the kernel for kTLS (docs/tls.md).
    if !matches!(c.wire, Wire::Plain) && c.gate.acquire_within(Duration::ZERO).is_ok() {
        match &c.wire {
            Wire::User(tls) => {
                let mut tls = tls.borrow_mut();
                tls.send_close_notify();
                let _ = flush_tls(&mut tls, &c.stream);
            }
            Wire::Ktls => {
                let _ = penstock_uring::ktls::send_close_notify(&c.stream);
            }
            Wire::Plain => {}
        }
        c.gate.release();
    }
}

/// What a plain RTSP (or HTTP) request sent to an `rtsps://` port reads before the close.
const PLAIN_TO_TLS: &[u8] = b"RTSP/1.0 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 51\r\n\r\nThe plain RTSP request was sent to an rtsps:// port\n";

/// Whether a connection's first bytes are a request line (a method in capitals) rather than
/// a TLS record (which starts with 0x16).
fn looks_like_text(first: &[u8]) -> bool {
    !first.is_empty() && first.iter().all(u8::is_ascii_uppercase)
}

/// The TLS handshake of a connection accepted on an `rtsps://` listener, within `[tls]
/// handshake_timeout_ms`, then its path ([`crate::tls::plan`]): the keys to the kernel
/// (`ktls`) or rustls kept (`tls-user`). Returns the wire and the plaintext that came with
/// the client's last flight; `None`: closed (a plain request answered 400 in clear, a
/// refused or stalled handshake), counted in the metrics.
fn handshake(
    shared: &Arc<RtspShared>,
    stream: &TcpStream,
    tls: &Tls,
    peer: SocketAddr,
) -> Option<(Wire, Vec<u8>)> {
    let metrics = &shared.metrics;
    let deadline = Instant::now() + tls.handshake_timeout();
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let _ = stream.set_read_timeout(Some(left()));
    let _ = stream.set_write_timeout(Some(left()));
    let mut first = [0u8; 4];
    match stream.peek(&mut first) {
        Ok(0) => {
            metrics.error("tls_handshake_eof");
            return None;
        }
        Ok(n) if looks_like_text(&first[..n.min(3)]) => {
            tracing::debug!("rtsps connection {peer}: a plain request: 400 in clear, closed");
            metrics.error("tls_plain_rtsp");
            let mut s = stream;
            let _ = s.write_all(PLAIN_TO_TLS);
            linger(stream);
            return None;
        }
        Ok(_) => {}
        Err(e) => {
            metrics.error(if timed_out(&e) {
                "tls_handshake_timeout"
            } else {
                "tls_handshake_eof"
            });
            return None;
        }
    }
    let mut conn = match tls.accept_rtsp() {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("rtsps: a TLS session could not be made: {e}");
            return None;
        }
    };
    while conn.is_handshaking() {
        let _ = stream.set_read_timeout(Some(left()));
        let _ = stream.set_write_timeout(Some(left()));
        let mut s = stream;
        if let Err(e) = conn.complete_io(&mut s) {
            let kind = if timed_out(&e) {
                "tls_handshake_timeout"
            } else if e.kind() == io::ErrorKind::InvalidData {
                "tls_handshake_failed"
            } else {
                "tls_handshake_eof"
            };
            tracing::debug!("rtsps connection {peer}: handshake: {e}");
            metrics.error(kind);
            // The alert of a refusal goes out.
            let _ = flush_tls(&mut conn, stream);
            return None;
        }
        if Instant::now() >= deadline && conn.is_handshaking() {
            metrics.error("tls_handshake_timeout");
            return None;
        }
    }
    if flush_tls(&mut conn, stream).is_err() {
        metrics.error("tls_handshake_eof");
        return None;
    }
    // A request that came with the client's Finished is decrypted already.
    let mut early = Vec::new();
    let mut b = [0u8; READ_BYTES];
    loop {
        match conn.reader().read(&mut b) {
            Ok(0) | Err(_) => break,
            Ok(n) => early.extend_from_slice(&b[..n]),
        }
    }
    let mut path = conn
        .negotiated_cipher_suite()
        .map_or(TlsPath::User, |s| plan(tls.ktls(), s.suite()));
    if path == TlsPath::Ktls
        && let Err(e) = penstock_uring::ktls::attach_ulp(stream)
    {
        tracing::warn!("rtsps: the kernel refused TCP_ULP \"tls\" ({e}): user-space TLS");
        path = TlsPath::User;
    }
    metrics
        .tls_handshakes
        .get_or_create(&crate::metrics::TlsPathLabel {
            path: path.label().to_string(),
        })
        .inc();
    tracing::debug!(
        "rtsps connection {peer}: handshake done, path={}",
        path.label()
    );
    let wire = match path {
        TlsPath::Ktls => {
            if let Err(e) = crate::tls::hand_to_kernel(stream, conn) {
                tracing::warn!("rtsps: handing the keys to the kernel failed ({e}): closed");
                metrics.error("ktls_setup_failed");
                return None;
            }
            Wire::Ktls
        }
        TlsPath::User => Wire::User(Box::new(RefCell::new(conn))),
    };
    Some((wire, early))
}

fn timed_out(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Reads and drops what the client sent (bounded, briefly) and closes the write side, so
/// that an answer before a close is not lost to a reset.
fn linger(stream: &TcpStream) {
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let mut b = [0u8; 4096];
    let mut s = stream;
    for _ in 0..16 {
        if !matches!(s.read(&mut b), Ok(n) if n > 0) {
            break;
        }
    }
}

impl Conn<'_> {
    fn run(&mut self, early: Vec<u8>) -> io::Result<()> {
        let limits = RtspLimits {
            request_bytes_max: self.shared.cfg.request_bytes_max,
        };
        // What came with the TLS handshake's last flight is parsed at once.
        let mut kick = !early.is_empty();
        let mut buf: Vec<u8> = early;
        buf.reserve(READ_BYTES);
        let mut chunk = [0u8; READ_BYTES];
        // A `tls-user` read's plaintext beyond `chunk`.
        let mut pending = Vec::new();
        // Idle: from the last complete message (a byte alone does not count: a trickle is
        // bounded by the request deadline below, not renewed by it).
        let mut last_request = Instant::now();
        // When the first byte of the message not yet complete arrived.
        let mut request_began: Option<Instant> = None;
        let idle = self.shared.cfg.session_timeout();
        let request_timeout = self.shared.cfg.request_timeout();
        loop {
            if self.shared.stop.load(Ordering::Acquire) {
                return Ok(());
            }
            let (tcp_ready, relay_ready) = self.wait()?;
            for i in relay_ready {
                self.forward(i)?;
            }
            self.forward_rtcp()?;
            if tcp_ready || kick {
                kick = false;
                let n = match self.read_some(tcp_ready, &mut chunk, &mut pending) {
                    Ok(None) => {
                        use std::os::fd::AsRawFd;
                        tracing::debug!(
                            "rtsp connection {}: closed by the client (fd {})",
                            self.peer,
                            self.stream.as_raw_fd()
                        );
                        return Ok(());
                    }
                    Ok(Some(n)) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    // A record other than data on a kTLS socket (the client's TLS 1.3
                    // KeyUpdate, an alert such as close_notify) fails a plain read with EIO
                    // (EKEYEXPIRED after a KeyUpdate on kernels that can take new keys):
                    // penstock does not hand the kernel new keys, so the connection ends
                    // here, cleanly (docs/tls.md, "kTLS: key updates and close_notify").
                    Err(e)
                        if matches!(self.wire, Wire::Ktls)
                            && matches!(
                                e.raw_os_error(),
                                Some(x) if x == rustix::io::Errno::IO.raw_os_error()
                                    || x == rustix::io::Errno::KEYEXPIRED.raw_os_error()
                            ) =>
                    {
                        tracing::debug!(
                            "rtsps connection {}: a TLS control record on a kTLS socket (a KeyUpdate or an alert): closed",
                            self.peer
                        );
                        self.shared.metrics.error("ktls_control_record");
                        return Ok(());
                    }
                    Err(e) => return Err(e),
                };
                if n > 0 && buf.is_empty() {
                    request_began = Some(Instant::now());
                }
                buf.extend_from_slice(&chunk[..n]);
                buf.append(&mut pending);
                loop {
                    match rtsp::parse(&buf, &limits) {
                        Ok(Parsed::Incomplete) => break,
                        Ok(Parsed::Data {
                            channel,
                            payload_at,
                            consumed,
                        }) => {
                            // A publisher's RTP (or RTCP) into its source; else RTCP
                            // receiver reports over TCP: the client is alive, and what
                            // they say goes into the metrics as a UDP report's does.
                            if let Some(r) =
                                self.publisher_frame(channel, &buf[payload_at..consumed])
                            {
                                r?;
                            } else {
                                self.touch_interleaved();
                                self.rtcp_in(channel, &buf[payload_at..consumed]);
                            }
                            buf.drain(..consumed);
                            last_request = Instant::now();
                            request_began = (!buf.is_empty()).then_some(last_request);
                        }
                        Ok(Parsed::Refused {
                            error,
                            cseq,
                            consumed,
                        }) => {
                            // A whole request that cannot be served: refused alone, the
                            // connection (and its sessions) go on.
                            buf.drain(..consumed);
                            last_request = Instant::now();
                            request_began = (!buf.is_empty()).then_some(last_request);
                            tracing::debug!("rtsp connection {}: refused: {error}", self.peer);
                            self.shared.metrics.rtsp_request("refused", error.status());
                            let mut r = Reply::new(error.status(), cseq);
                            r.body = format!("{error}\n").into_bytes();
                            r.content_type = Some("text/plain");
                            self.write(&r.encode())?;
                        }
                        Ok(Parsed::Request(req, consumed)) => {
                            buf.drain(..consumed);
                            last_request = Instant::now();
                            request_began = (!buf.is_empty()).then_some(last_request);
                            let reply = self.handle(&req);
                            self.shared
                                .metrics
                                .rtsp_request(method_word(&req.method), reply.status);
                            self.write(&reply.encode())?;
                        }
                        Err(e) => {
                            tracing::debug!("rtsp connection {}: unreadable: {e}", self.peer);
                            self.shared.metrics.rtsp_request("malformed", e.status());
                            let mut r = Reply::new(e.status(), None);
                            r.body = format!("{e}\n").into_bytes();
                            r.content_type = Some("text/plain");
                            self.write(&r.encode())?;
                            return Ok(());
                        }
                    }
                }
            }
            if let Some(t) = request_began
                && t.elapsed() >= request_timeout
            {
                tracing::debug!(
                    "rtsp connection {}: request not complete within rtsp.request_timeout_ms",
                    self.peer
                );
                self.shared.metrics.rtsp_request("incomplete", 408);
                let mut r = Reply::new(408, None);
                r.body = format!(
                    "rtsp.request_timeout_ms {}: a request must be complete within it\n",
                    request_timeout.as_millis()
                )
                .into_bytes();
                r.content_type = Some("text/plain");
                self.write(&r.encode())?;
                return Ok(());
            }
            // A publisher silent for its source's idle_timeout is dropped: the source ends.
            if let Some(p) = &self.publish
                && p.last_seen.elapsed() > p.idle_timeout()
            {
                tracing::info!(
                    "rtsp connection {}: the publisher sent nothing for {:?}: closed",
                    self.peer,
                    p.idle_timeout()
                );
                self.shared.metrics.error("publish_idle");
                self.publish = None;
                return Ok(());
            }
            // Drop relays whose session is gone (torn down, timed out).
            let shared = self.shared;
            self.relays.retain(|r| shared.session(&r.session).is_some());
            if self.relays.is_empty() && last_request.elapsed() > idle {
                return Ok(());
            }
        }
    }

    /// Writes one whole message (a reply, an RTCP frame) between the engine's frames.
    fn write(&self, bytes: &[u8]) -> io::Result<()> {
        write_gated(
            &self.gate,
            &self.stream,
            &self.wire,
            self.shared.cfg.send_timeout(),
            bytes,
        )
    }

    /// One read of the socket if it is `readable`: plaintext into `chunk` — at most its
    /// size from a plain or kTLS socket; from a `tls-user` one, the records read are
    /// decrypted and their plaintext beyond what fits in `chunk` appended to `more`.
    /// `Ok(None)`: the peer's end (a close, or its TLS close_notify); `Ok(Some(0))`:
    /// nothing yet (records without plaintext).
    fn read_some(
        &mut self,
        readable: bool,
        chunk: &mut [u8],
        more: &mut Vec<u8>,
    ) -> io::Result<Option<usize>> {
        if !readable {
            return Ok(Some(0));
        }
        let Wire::User(tls) = &self.wire else {
            return match (&self.stream).read(chunk)? {
                0 => Ok(None),
                n => Ok(Some(n)),
            };
        };
        if self.peer_closed {
            return Ok(None);
        }
        let mut tls = tls.borrow_mut();
        let mut s = &self.stream;
        if tls.wants_read() {
            match tls.read_tls(&mut s) {
                Ok(0) => {
                    self.peer_closed = true;
                    return Ok(None);
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        let state = match tls.process_new_packets() {
            Ok(st) => st,
            Err(e) => {
                self.shared.metrics.error("tls_record");
                // Its alert goes out if it can; then the connection ends.
                drop(tls);
                if self.gate.acquire_within(Duration::ZERO).is_ok() {
                    if let Wire::User(t) = &self.wire {
                        let _ = flush_tls(&mut t.borrow_mut(), &self.stream);
                    }
                    self.gate.release();
                }
                return Err(io::Error::new(io::ErrorKind::InvalidData, e));
            }
        };
        let mut got = 0;
        if state.plaintext_bytes_to_read() > 0 {
            loop {
                let n = if got < chunk.len() {
                    tls.reader().read(&mut chunk[got..]).unwrap_or(0)
                } else {
                    let mut b = [0u8; READ_BYTES];
                    match tls.reader().read(&mut b) {
                        Ok(n) => {
                            more.extend_from_slice(&b[..n]);
                            n
                        }
                        Err(_) => 0,
                    }
                };
                if n == 0 {
                    break;
                }
                if got < chunk.len() {
                    got += n;
                }
            }
        }
        if state.peer_has_closed() {
            self.peer_closed = true;
        }
        // What rustls has to say after these records (its KeyUpdate after the client's
        // TLS 1.3 KeyUpdate) goes out between whole messages.
        if tls.wants_write() {
            drop(tls);
            self.write(&[])?;
        }
        if got == 0 && more.is_empty() && self.peer_closed {
            return Ok(None);
        }
        Ok(Some(got))
    }

    /// Polls the socket and the relays for one turn.
    fn wait(&self) -> io::Result<(bool, Vec<usize>)> {
        use rustix::event::{PollFd, PollFlags, Timespec};
        let mut fds = Vec::with_capacity(1 + self.relays.len());
        fds.push(PollFd::new(&self.stream, PollFlags::IN));
        for r in &self.relays {
            fds.push(PollFd::new(&r.socket, PollFlags::IN));
        }
        let t = Timespec {
            tv_sec: 0,
            tv_nsec: TURN.as_nanos() as i64,
        };
        match rustix::event::poll(&mut fds, Some(&t)) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => return Ok((false, Vec::new())),
            Err(e) => return Err(e.into()),
        }
        let ready = |f: &PollFd<'_>| {
            f.revents()
                .intersects(PollFlags::IN | PollFlags::HUP | PollFlags::ERR)
        };
        let tcp = ready(&fds[0]);
        let relays = fds[1..]
            .iter()
            .enumerate()
            .filter(|(_, f)| ready(f))
            .map(|(i, _)| i)
            .collect();
        Ok((tcp, relays))
    }

    /// Writes the datagrams waiting in relay `i` as interleaved frames: RTP on the first
    /// channel, RTCP (second byte 200..=204, RFC 5761's rule) on the second.
    /// Returns whether the relay is drained (else: `FRAMES_PER_TURN_MAX` were written).
    fn forward(&mut self, i: usize) -> io::Result<bool> {
        if self.frame.is_empty() {
            self.frame = vec![0u8; 4 + usize::from(u16::MAX)];
        }
        let frame = &mut self.frame;
        for _ in 0..FRAMES_PER_TURN_MAX {
            let n = match self.relays[i].socket.recv(&mut frame[4..]) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
                Err(e) => return Err(e),
            };
            let (rtp_ch, rtcp_ch) = self.relays[i].channels;
            let is_rtcp = n > 1 && (200..=204).contains(&frame[5]);
            frame[0] = b'$';
            frame[1] = if is_rtcp { rtcp_ch } else { rtp_ch };
            frame[2..4].copy_from_slice(&(n as u16).to_be_bytes());
            let timeout = self.shared.cfg.send_timeout();
            write_gated(
                &self.gate,
                &self.stream,
                &self.wire,
                timeout,
                &frame[..4 + n],
            )?;
        }
        Ok(false)
    }

    /// Writes the reaper's RTCP packets (sender reports, the BYE) of each relay on its RTCP
    /// channel, after the RTP packets already in its pair (a BYE never overtakes them).
    fn forward_rtcp(&mut self) -> io::Result<()> {
        for i in 0..self.relays.len() {
            if self.relays[i]
                .rtcp_out
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty()
                || !self.forward(i)?
            {
                continue;
            }
            let packets: Vec<Vec<u8>> = self.relays[i]
                .rtcp_out
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .drain(..)
                .collect();
            let ch = self.relays[i].channels.1;
            for p in packets {
                let Ok(len) = u16::try_from(p.len()) else {
                    continue;
                };
                let mut f = Vec::with_capacity(4 + p.len());
                f.extend_from_slice(&[b'$', ch]);
                f.extend_from_slice(&len.to_be_bytes());
                f.extend_from_slice(&p);
                self.write(&f)?;
            }
        }
        Ok(())
    }

    /// An interleaved frame from the client on an RTCP channel of one of this connection's
    /// sessions: into that session's RTCP state (the reaper moves it into the metrics).
    /// Frames on other channels (RTP from a client, unknown channels) are dropped.
    fn rtcp_in(&self, channel: u8, payload: &[u8]) {
        let Some(r) = self.relays.iter().find(|r| r.channels.1 == channel) else {
            return;
        };
        let Some(s) = self.shared.session(&r.session) else {
            return;
        };
        let mut s = s.lock().unwrap_or_else(|p| p.into_inner());
        let rtcp = if let Some(p) = &mut s.playing {
            p.tcp_rtcp.as_mut()
        } else if let Some(l) = &mut s.live {
            l.tcp_rtcp.as_mut()
        } else {
            None
        };
        if let Some(rtcp) = rtcp {
            // A malformed report is counted by the session and changes nothing else.
            let _ = rtcp.handle_datagram(super::wall_ntp(), payload);
        }
    }

    fn touch_interleaved(&self) {
        for r in &self.relays {
            if let Some(s) = self.shared.session(&r.session) {
                s.lock().unwrap_or_else(|p| p.into_inner()).last_seen = Instant::now();
            }
        }
    }

    fn handle(&mut self, req: &Request) -> Reply {
        // `rtsp://HOST:PORT/live/NAME` names live source NAME, as `/NAME` does (kept as an
        // alias); a source configured with a name that itself starts with `live/` wins.
        let aliased;
        let req = match self.live_alias(req) {
            Some(r) => {
                aliased = r;
                &aliased
            }
            None => req,
        };
        let Some(cseq) = req.cseq else {
            let mut r = Reply::new(400, None);
            r.body = b"no CSeq header\n".to_vec();
            r.content_type = Some("text/plain");
            return r;
        };
        if let Some(r) = self.publisher_request(req, cseq) {
            return r;
        }
        match &req.method {
            Method::Announce => self.announce(req, cseq),
            Method::Setup if req.record_mode => self.setup_record(req, cseq),
            Method::Options => {
                if let Some(id) = &req.session
                    && let Some(s) = self.shared.session(id)
                {
                    s.lock().unwrap_or_else(|p| p.into_inner()).last_seen = Instant::now();
                }
                Reply::new(200, Some(cseq)).header("Public", rtsp::PUBLIC)
            }
            Method::Describe => self.describe(req, cseq),
            Method::Setup => self.setup(req, cseq),
            Method::Play | Method::Pause | Method::GetParameter | Method::Teardown => {
                self.in_session(req, cseq)
            }
            Method::SetParameter => text(451, cseq, "SET_PARAMETER: no parameter can be set"),
            _ => Reply::new(501, Some(cseq)).header("Public", rtsp::PUBLIC),
        }
    }

    /// Opens the request's file beneath the root, or with `[volumes]` the partition
    /// `vol/NAME/PART` (404 for anything that is not a file in it, or not a ready partition
    /// of a configured volume).
    fn open(&self, req: &Request, cseq: u32) -> Result<(Source, String), Reply> {
        let path = req.path.clone().unwrap_or_default();
        if path.is_empty() {
            return Err(text(404, cseq, "no file named in the URL"));
        }
        // Hidden and backup files, as on HTTP: absent unless the location serves them.
        if crate::auth::is_hidden(&path)
            && !self
                .shared
                .viewers
                .get()
                .is_some_and(|v| v.serves_hidden(&format!("/{path}")))
        {
            return Err(text(404, cseq, "not found"));
        }
        if let Some(opened) = self.shared.open_partition(&path) {
            return opened
                .map(|s| (s, path))
                .map_err(|(code, m)| text(code, cseq, &m));
        }
        let file = |(f, p)| (Source::File(f), p);
        match self.shared.root.open_path(&path) {
            Ok(confine::Opened::File { file: f, .. }) => Ok(file((f, path))),
            Ok(confine::Opened::Directory(_)) => Err(text(404, cseq, "a directory")),
            Err(confine::Refused::Failed) => Err(text(500, cseq, "the file could not be opened")),
            Err(confine::Refused::Exhausted) => Err(text(
                503,
                cseq,
                "the server is out of descriptors: try again later",
            )),
            // Missing beneath the root: the origin's object, copied whole into the cache
            // (docs/origin.md), with the origin's answer mapped as for HTTP.
            Err(confine::Refused::NotFound) if self.shared.origin.get().is_some() => {
                let origin = self.shared.origin.get().expect("checked in the guard");
                match origin.whole_file(&format!("/{path}")) {
                    Ok(f) => Ok(file((f, path))),
                    Err(e) => {
                        let code = e.status().code();
                        if code != 404 {
                            crate::peer_warn!("rtsp_origin", path = %path, error = %e, "RTSP: origin");
                        }
                        Err(text(code, cseq, &e.to_string()))
                    }
                }
            }
            // Beneath the root but not readable by the server: 403, and the operator told.
            Err(confine::Refused::Denied) => {
                crate::peer_warn!(
                    "unreadable",
                    protocol = "rtsp",
                    path = %path,
                    "a file the server may not read (permission denied): answered 403"
                );
                Err(text(403, cseq, "the server may not read this file"))
            }
            // Outside the root, forbidden or missing: the same answer, nothing revealed.
            Err(_) => Err(text(404, cseq, "not found")),
        }
    }

    fn media(&self, file: &Source, path: &str, cseq: u32) -> Result<Arc<super::Media>, Reply> {
        self.shared
            .media_for(file, path)
            .map_err(|e| text(415, cseq, &format!("{path}: not playable as MPEG-TS: {e}")))
    }

    /// The request with its path `live/NAME` made `NAME`, when NAME is a live source (and
    /// `live/NAME` is not one).
    fn live_alias(&self, req: &Request) -> Option<Request> {
        let path = req.path.as_deref()?;
        let name = path.strip_prefix("live/")?;
        if self.shared.live.contains_key(path) || !self.shared.live.contains_key(name) {
            return None;
        }
        let mut r = req.clone();
        r.path = Some(name.to_string());
        Some(r)
    }

    /// The live source the request names (`[live.NAME]`), if it names one.
    fn live_source(&self, req: &Request) -> Option<Arc<LiveSource>> {
        self.shared.live.get(req.path.as_deref()?).cloned()
    }

    /// The location's `auth` for the request's URL (`crate::auth`): `Err` is the reply (401
    /// without a credential, 403 with a bad one).
    fn authorize(
        &self,
        req: &Request,
        cseq: u32,
    ) -> Result<Option<penstock_core::auth::ledger::ViewerLimits>, Reply> {
        let Some(v) = self.shared.viewers.get() else {
            return Ok(None);
        };
        let Some(path) = req.canonical_path.as_deref() else {
            return Err(text(404, cseq, "not found"));
        };
        if v.is_digest(path) {
            return match v.check_digest(
                path,
                method_word(&req.method),
                &req.uri,
                req.authorization.as_deref(),
                Some(self.peer.ip()),
            ) {
                Ok(()) => Ok(None),
                Err(c) => {
                    self.shared.metrics.error("auth_missing");
                    Err(text(401, cseq, "Digest credentials are required")
                        .header("WWW-Authenticate", c.0))
                }
            };
        }
        match v.check(
            path,
            req.query.as_deref(),
            req.authorization.as_deref(),
            Some(self.peer.ip()),
            "rtsp",
        ) {
            crate::auth::Decision::Open => Ok(None),
            crate::auth::Decision::Granted { limits, .. } => Ok(limits),
            crate::auth::Decision::Refused(penstock_core::auth::AuthError::Missing) => {
                self.shared.metrics.error("auth_missing");
                let mut r = text(
                    401,
                    cseq,
                    "a credential is required (a signed URL or a JWT)",
                );
                r = r.header("WWW-Authenticate", "Bearer realm=\"penstock\"");
                Err(r)
            }
            crate::auth::Decision::Refused(e) => {
                self.shared.metrics.error("auth_refused");
                Err(text(403, cseq, &format!("refused: {}", e.reason())))
            }
        }
    }

    fn describe(&self, req: &Request, cseq: u32) -> Reply {
        if let Err(r) = self.authorize(req, cseq) {
            return r;
        }
        if self.live_source(req).is_none()
            && req.path.as_deref().is_some_and(super::mp4::is_mp4_path)
        {
            return self.describe_mp4(req, cseq);
        }
        let end_ns = if self.live_source(req).is_some() {
            None
        } else {
            let (file, path) = match self.open(req, cseq) {
                Ok(f) => f,
                Err(r) => return r,
            };
            match self.media(&file, &path, cseq) {
                Ok(m) => Some(m.end_ns()),
                Err(r) => return r,
            }
        };
        // In a cluster, a media this node could not admit now is sent to a node that can,
        // before the player sets anything up: players follow a 302 to DESCRIBE (ffmpeg
        // follows none to SETUP). The reservation made for the check is dropped at once.
        if self.shared.cluster.get().is_some()
            && let Ok((file, path)) = self.open(req, cseq)
            && let Ok(media) = self.media(&file, &path, cseq)
        {
            let (spec, _) = stream_spec(
                &self.shared.cfg,
                &media,
                None,
                Packetizer::mp2t(random_u64()),
                None,
            );
            if let Err(e) = self.shared.engine.admit(&spec, UNITS_OWN_UNIT)
                && let Some(r) = self.redirect(&path, &media, cseq, &e)
            {
                return r;
            }
        }
        // A URL with a query (a signed one): the track's control is absolute and carries
        // the query, so that SETUP is checked as DESCRIBE was.
        let sdp = match req.uri.split_once('?') {
            Some((base, q)) => rtsp::describe_sdp_with_control(
                random_u64() >> 1,
                self.local.ip(),
                end_ns,
                &format!("{}/{}?{q}", base.trim_end_matches('/'), rtsp::TRACK_CONTROL),
            ),
            None => rtsp::describe_sdp(random_u64() >> 1, self.local.ip(), end_ns),
        };
        let base = if req.uri.ends_with('/') {
            req.uri.clone()
        } else {
            format!("{}/", req.uri)
        };
        let mut r = Reply::new(200, Some(cseq)).header("Content-Base", base);
        r.content_type = Some("application/sdp");
        r.body = sdp.into_bytes();
        r
    }

    /// Whether an interleaved session's engine stream writes to this connection's socket
    /// itself ([`crate::tls::interleaved_direct`]: never through user-space TLS).
    fn direct(&self) -> bool {
        crate::tls::interleaved_direct(self.shared.cfg.interleaved_direct, self.wire.path())
    }

    fn setup(&mut self, req: &Request, cseq: u32) -> Reply {
        // RTP over UDP from an rtsps:// connection would leave in clear (there is no SRTP
        // here): refused, the client asks again for interleaved TCP (ffmpeg and GStreamer
        // ask it first on rtsps://).
        if self.wire.path().is_some() && matches!(req.transport, Some(Ok(TransportAsk::Udp { .. })))
        {
            self.shared.metrics.error("rtsps_udp_refused");
            return text(
                461,
                cseq,
                "an rtsps:// connection carries RTP interleaved in its TLS stream only \
                 (Transport: RTP/AVP/TCP;unicast;interleaved=0-1): over UDP the media would \
                 leave in clear (no SRTP)",
            );
        }
        if let Some(id) = &req.session {
            return match self.shared.session(id) {
                None => text(454, cseq, "no such session"),
                Some(arc)
                    if matches!(
                        arc.lock().unwrap_or_else(|p| p.into_inner()).media,
                        SessionMedia::Mp4(_)
                    ) =>
                {
                    self.add_mp4_track(&arc, id, req, cseq)
                }
                Some(_) => text(
                    455,
                    cseq,
                    "the session's one track is set up already (TEARDOWN, then SETUP)",
                ),
            };
        }
        let limits = match self.authorize(req, cseq) {
            Ok(l) => l,
            Err(r) => return r,
        };
        let ask = match &req.transport {
            None => return text(461, cseq, "SETUP needs a Transport header"),
            Some(Err(e)) => return text(461, cseq, &e.to_string()),
            Some(Ok(a)) => *a,
        };
        // A JWT's `tenant` claim: the session is admitted in the tenant's share.
        let tenant = crate::tenants::named(
            &self.shared.engine,
            limits.as_ref().and_then(|l| l.tenant.clone()),
        );
        // The token's `sessions` cap: this session holds one of its places until it ends.
        let viewer_hold = match (limits, self.shared.viewers.get()) {
            (Some(l), Some(v)) => match v.open_session(&l) {
                Ok(h) => h,
                Err(e) => {
                    self.shared.metrics.error("auth_sessions_cap");
                    return text(453, cseq, &format!("refused: {e}"));
                }
            },
            _ => None,
        };
        let max = self.shared.cfg.sessions_max;
        if self.shared.session_count() >= max {
            self.shared.metrics.error("rtsp_sessions_max");
            return text(453, cseq, &format!("rtsp.sessions_max {max} reached"));
        }
        if let Some(r) = self.address_full(cseq) {
            return r;
        }
        if self.shared.unplayed_too_often(self.peer.ip()) {
            self.shared.metrics.error("rtsp_unplayed_setups_max");
            return text(
                453,
                cseq,
                &format!(
                    "rtsp.unplayed_setups_max {} reached for {}: sessions set up and never \
                     played; SETUP again after rtsp.session_timeout_ms",
                    self.shared.cfg.unplayed_setups_max,
                    self.peer.ip()
                ),
            );
        }
        let base = Packetizer::mp2t(random_u64());
        let mut mp4_first = None;
        let (smedia, path, admitted) = if let Some(src) = self.live_source(req) {
            // A live session sends from the source's thread, not through the engine: no
            // disk, no engine stream, nothing to admit (docs/rtsp.md, "Live relay").
            (
                SessionMedia::Live(src),
                req.path.clone().unwrap_or_default(),
                None,
            )
        } else {
            let (file, path) = match self.open(req, cseq) {
                Ok(f) => f,
                Err(r) => return r,
            };
            if super::mp4::is_mp4_path(&path) {
                match self.open_mp4_session(file, &path, req, cseq, tenant.as_deref()) {
                    Ok((m, index, admitted)) => {
                        mp4_first = Some(index);
                        (SessionMedia::Mp4(m), path, admitted)
                    }
                    Err(r) => return r,
                }
            } else {
                if let Some(t) = req.track.filter(|&t| t != 0) {
                    return text(
                        404,
                        cseq,
                        &format!("{path}: no track {t} (an MPEG-TS file has one, trackID=0)"),
                    );
                }
                let media = match self.media(&file, &path, cseq) {
                    Ok(m) => m,
                    Err(r) => return r,
                };
                // Admission now, for the whole file at its PCR rate: a refusal is a 453 before
                // any port is taken; the reservation is held until TEARDOWN or the timeout.
                let interleaved = match ask {
                    TransportAsk::Interleaved { rtp_channel, .. } if self.direct() => {
                        Some(Interleaved {
                            channel: rtp_channel,
                            gate: self.gate.clone(),
                        })
                    }
                    _ => None,
                };
                let mut spec = stream_spec(&self.shared.cfg, &media, None, base, None).0;
                interleave(&mut spec, interleaved);
                let admitted = match crate::tenants::admit(
                    &self.shared.engine,
                    &self.shared.metrics,
                    &spec,
                    UNITS_OWN_UNIT,
                    tenant.as_deref(),
                ) {
                    Ok(a) => a,
                    Err(e) => {
                        self.shared.metrics.error("rtsp_admission_refused");
                        if let crate::tenants::Refused::Engine(se) = &e
                            && let Some(r) = self.redirect(&path, &media, cseq, se)
                        {
                            return r;
                        }
                        return text(
                            453,
                            cseq,
                            &format!(
                                "admission refused (the server's rt capacity, not rtsp.sessions_max \
                             {max}): {e}"
                            ),
                        );
                    }
                };
                (SessionMedia::File { file, media }, path, admitted)
            }
        };
        let (transport, transport_reply) = match self.make_transport(ask, base.ssrc, cseq) {
            Ok(t) => t,
            Err(r) => return r,
        };
        let mut smedia = smedia;
        if let (SessionMedia::Mp4(m), Some(index)) = (&mut smedia, mp4_first) {
            let out = match super::mp4::out_of(&transport) {
                Ok(o) => o,
                Err(e) => return text(500, cseq, &format!("duplicating the transport: {e}")),
            };
            m.tracks.push(super::mp4::Mp4Track::new(
                index,
                req.uri.clone(),
                &base,
                out,
            ));
        }
        let id = format!("{:016x}", random_u64());
        let track_url = req.uri.clone();
        let session = Session {
            id: id.clone(),
            path,
            track_url,
            media: smedia,
            live: None,
            transport,
            state: SessionState::Ready,
            base,
            next_sequence: base.sequence_start,
            scale: Speed::NORMAL,
            admitted,
            admitted_at: Instant::now(),
            client: self.peer.ip(),
            playing: None,
            resume_from_ns: None,
            last_seen: Instant::now(),
            created: Instant::now(),
            user_agent: req.user_agent.clone(),
            played: false,
            done_bytes: 0,
            done_lateness: [0; penstock_driver::LATENESS_BUCKETS],
            viewer_hold,
            tenant,
        };
        self.insert_session(session, &id, transport_reply, cseq)
    }

    /// The transport a SETUP asks for: a UDP port pair connected to the client's ports, or
    /// interleaved channels on this connection (a relay pair registered, named by the next
    /// session inserted). With the Transport header of the reply.
    fn make_transport(
        &mut self,
        ask: TransportAsk,
        ssrc: u32,
        cseq: u32,
    ) -> Result<(Transport, String), Reply> {
        let base_ssrc = ssrc;
        Ok(match ask {
            TransportAsk::Udp {
                rtp_port,
                rtcp_port,
            } => {
                // Data goes to the host that asked, never to a third party (`destination`
                // is not honoured).
                let (rtp, rtcp) = match self.shared.port_pair(self.local.ip()) {
                    Ok(p) => p,
                    Err(e) => return Err(text(453, cseq, &e.to_string())),
                };
                if let Err(e) = rtp.connect((self.peer.ip(), rtp_port)) {
                    return Err(text(500, cseq, &format!("connecting the RTP socket: {e}")));
                }
                let ports = (
                    rtp.local_addr().map_or(0, |a| a.port()),
                    rtcp.local_addr().map_or(0, |a| a.port()),
                );
                let line = format!(
                    "RTP/AVP;unicast;client_port={rtp_port}-{rtcp_port};server_port={}-{};ssrc={:08X}",
                    ports.0, ports.1, base_ssrc
                );
                (
                    Transport::Udp {
                        rtp,
                        rtcp,
                        client_rtcp: SocketAddr::new(self.peer.ip(), rtcp_port),
                    },
                    line,
                )
            }
            TransportAsk::Interleaved {
                rtp_channel,
                rtcp_channel,
            } => {
                let (engine_end, conn_end) = match UnixDatagram::pair() {
                    Ok(p) => p,
                    Err(e) => return Err(text(500, cseq, &format!("socket pair: {e}"))),
                };
                if let Err(e) = conn_end.set_nonblocking(true) {
                    return Err(text(500, cseq, &format!("socket pair: {e}")));
                }
                let tcp = match self.stream.try_clone() {
                    Ok(t) => t,
                    Err(e) => {
                        return Err(text(500, cseq, &format!("duplicating the connection: {e}")));
                    }
                };
                let rtcp_out = super::RtcpOut::default();
                self.relays.push(Relay {
                    session: String::new(),
                    socket: conn_end,
                    rtcp_out: rtcp_out.clone(),
                    channels: (rtp_channel, rtcp_channel),
                });
                (
                    Transport::Interleaved {
                        engine_end,
                        tcp: tcp.into(),
                        gate: self.gate.clone(),
                        rtcp_out,
                        channels: (rtp_channel, rtcp_channel),
                        conn_id: self.id,
                        direct: self.direct(),
                        tls: self.wire.path().map(TlsPath::label),
                    },
                    format!(
                        "RTP/AVP/TCP;unicast;interleaved={rtp_channel}-{rtcp_channel};ssrc={:08X}",
                        base_ssrc
                    ),
                )
            }
        })
    }

    /// Puts a new session in the table (the limits checked again under its lock) and
    /// answers the SETUP.
    fn insert_session(
        &mut self,
        session: Session,
        id: &str,
        transport_reply: String,
        cseq: u32,
    ) -> Reply {
        let max = self.shared.cfg.sessions_max;
        let id = id.to_string();
        {
            let mut map = self
                .shared
                .sessions
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            // Checked again under the lock: two SETUPs at once never pass the limits.
            if map.len() >= max {
                self.relays.retain(|r| !r.session.is_empty());
                return text(453, cseq, &format!("rtsp.sessions_max {max} reached"));
            }
            let mut per = self
                .shared
                .sessions_per_address
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let n = per.entry(self.peer.ip()).or_insert(0);
            if *n >= self.shared.cfg.sessions_per_address_max {
                drop(per);
                self.relays.retain(|r| !r.session.is_empty());
                self.shared.metrics.error("rtsp_sessions_per_address_max");
                return self.address_refusal(cseq);
            }
            *n += 1;
            drop(per);
            map.insert(id.clone(), Arc::new(std::sync::Mutex::new(session)));
        }
        if let Some(r) = self.relays.iter_mut().find(|r| r.session.is_empty()) {
            r.session = id.clone();
        }
        self.shared.metrics.rtsp_sessions.inc();
        Reply::new(200, Some(cseq))
            .header("Transport", transport_reply)
            .header("Session", self.session_header(&id))
    }

    /// 453 when the client's address holds `sessions_per_address_max` sessions already.
    fn address_full(&self, cseq: u32) -> Option<Reply> {
        let per = self
            .shared
            .sessions_per_address
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let n = per.get(&self.peer.ip()).copied().unwrap_or(0);
        drop(per);
        (n >= self.shared.cfg.sessions_per_address_max).then(|| {
            self.shared.metrics.error("rtsp_sessions_per_address_max");
            self.address_refusal(cseq)
        })
    }

    fn address_refusal(&self, cseq: u32) -> Reply {
        text(
            453,
            cseq,
            &format!(
                "rtsp.sessions_per_address_max {} reached for {}",
                self.shared.cfg.sessions_per_address_max,
                self.peer.ip()
            ),
        )
    }

    /// `302 Moved Temporarily` to another node of the cluster with the media's rate left
    /// (docs/cluster.md, "Redirects"), when admission refused `path` here and there is one.
    fn redirect(
        &self,
        path: &str,
        media: &super::Media,
        cseq: u32,
        refusal: &StreamError,
    ) -> Option<Reply> {
        let view = self.shared.cluster.get()?;
        let d = media.plan.duration_ns().max(1);
        let bytes = media.plan.playback_from(None).media_bytes;
        let need =
            u64::try_from(u128::from(bytes) * 1_000_000_000 / u128::from(d)).unwrap_or(u64::MAX);
        let to = view.redirect_rtsp(path, need)?;
        let location = format!("rtsp://{to}/{}", path.trim_start_matches('/'));
        tracing::info!(path, to = %location, refusal = %refusal, "rtsp: redirected an open admission refused here");
        Some(Reply::new(302, Some(cseq)).header("Location", location))
    }

    fn session_header(&self, id: &str) -> String {
        rtsp::session_header(id, self.shared.cfg.session_timeout().as_secs())
    }

    /// PLAY, PAUSE, GET_PARAMETER, TEARDOWN: methods on a session.
    fn in_session(&mut self, req: &Request, cseq: u32) -> Reply {
        let Some(id) = req.session.clone() else {
            if req.method == Method::GetParameter {
                return Reply::new(200, Some(cseq));
            }
            return text(454, cseq, "no Session header");
        };
        let Some(arc) = self.shared.session(&id) else {
            return text(454, cseq, "no such session");
        };
        if req.method == Method::Teardown {
            self.shared.end_session(&id, EndReason::Teardown);
            self.relays.retain(|r| r.session != id);
            return Reply::new(200, Some(cseq)).header("Session", id);
        }
        let mut s = arc.lock().unwrap_or_else(|p| p.into_inner());
        s.last_seen = Instant::now();
        if let Err(code) = s.state.check(&req.method) {
            return text(
                code,
                cseq,
                &format!("{} in state {:?}", method_word(&req.method), s.state),
            );
        }
        let r = match req.method {
            Method::Play => self.play(&mut s, req, cseq),
            Method::Pause => pause(&mut s, cseq),
            _ => Reply::new(200, Some(cseq)),
        };
        r.header("Session", self.session_header(&id))
    }

    fn play(&self, s: &mut Session, req: &Request, cseq: u32) -> Reply {
        // An MP4 reads its own Scale (reverse too: `play_mp4`).
        if matches!(s.media, SessionMedia::Mp4(_)) {
            return self.play_mp4(s, req, cseq);
        }
        let asked = match scale_asked(req.scale, self.shared.cfg.scale_max) {
            Ok(a) => a,
            Err(why) => return text(451, cseq, &why),
        };
        let media = match &s.media {
            SessionMedia::File { media, .. } => media.clone(),
            SessionMedia::Mp4(_) => return self.play_mp4(s, req, cseq),
            SessionMedia::Live(src) => {
                if let Some(x) = asked.filter(|&x| x != Speed::NORMAL) {
                    return text(
                        451,
                        cseq,
                        &format!(
                            "Scale {}: a live source plays at scale 1 only",
                            super::scale_text(x)
                        ),
                    );
                }
                let src = src.clone();
                return self.play_live(s, &src, req, cseq);
            }
        };
        // Without a Scale header the session keeps the scale of its last PLAY.
        let scale = asked.unwrap_or(s.scale);
        let scale_hdr = super::scale_text(scale);
        let duration = media.end_ns();
        let asked_ns = seek_asked_ns(req, &media);
        if let Some(r) = past_the_end(cseq, asked_ns, duration) {
            return r;
        }
        let range = |start_ns: u64| {
            format!(
                "npt={}-{}",
                rtsp::npt_text(start_ns),
                rtsp::npt_text(duration)
            )
        };
        // A new scale without a Range goes on from where the stream is, at the new pace; a
        // session whose pause outlasted `pause_hold_ms` resumes where it stopped.
        let mut from_ns = asked_ns;
        if from_ns.is_none() && s.playing.is_none() && s.state == SessionState::Paused {
            from_ns = s.resume_from_ns;
        }
        if from_ns.is_none()
            && scale != s.scale
            && let Some(p) = &s.playing
        {
            let sent = usize::try_from(p.handle.counters().units_sent).unwrap_or(usize::MAX);
            let at_ns = p.units.get(sent).map_or(0, |u| u.offset_ns);
            from_ns = Some(p.start_time_ns + p.packetizer.scale.media_ns(at_ns));
        }
        match (s.state, from_ns, s.playing.as_mut()) {
            (SessionState::Paused, None, Some(p)) => {
                // Resume where it stopped: the same stream, its numbering continues.
                let sent = p.handle.counters().units_sent;
                p.handle.resume();
                if let Some(at) = p.paused_at.take() {
                    let now = penstock_driver::clock::now();
                    p.anchor = p.anchor.saturating_add(now.saturating_duration_since(at));
                    if let Some(l) = &mut p.link {
                        l.reanchor(p.anchor);
                    }
                }
                let at_ns = p
                    .units
                    .get(usize::try_from(sent).unwrap_or(usize::MAX))
                    .map_or(0, |u| u.offset_ns);
                let info = rtsp::rtp_info(
                    &s.track_url,
                    p.packetizer.sequence(sent),
                    p.packetizer.timestamp(at_ns),
                );
                let start = p.start_time_ns + p.packetizer.scale.media_ns(at_ns);
                s.state = SessionState::Playing;
                Reply::new(200, Some(cseq))
                    .header("Range", range(start))
                    .header("Scale", scale_hdr)
                    .header("RTP-Info", info)
            }
            (SessionState::Playing, None, Some(_)) => {
                Reply::new(200, Some(cseq)).header("Scale", scale_hdr)
            }
            _ => match self.start_stream(s, from_ns, scale) {
                Ok((start, seq, rtptime)) => {
                    s.state = SessionState::Playing;
                    s.scale = scale;
                    s.resume_from_ns = None;
                    Reply::new(200, Some(cseq))
                        .header("Range", range(start))
                        .header("Scale", scale_hdr)
                        .header("RTP-Info", rtsp::rtp_info(&s.track_url, seq, rtptime))
                }
                Err(r) => {
                    let mut r = r;
                    r.cseq = Some(cseq);
                    r
                }
            },
        }
    }

    /// Starts the session's engine stream from `from_ns` (the PCR at or before it), after
    /// stopping the one it replaces. Returns the playback's start, first sequence number and
    /// RTP time.
    fn start_stream(
        &self,
        s: &mut Session,
        from_ns: Option<u64>,
        scale: Speed,
    ) -> Result<(u64, u16, u32), Reply> {
        let was_played = s.playing.is_some();
        if let Some(p) = s.playing.take() {
            p.handle.cancel();
            // Its packets in flight leave before the new stream's first.
            let _ = p.handle.wait_timeout(STOP_WAIT);
            s.count_stream(&p.handle);
            s.next_sequence = p.packetizer.sequence(p.handle.counters().units_sent);
        }
        let packetizer_at = |start_time_ns: u64| Packetizer {
            sequence_start: s.next_sequence,
            timestamp_start: s.base.timestamp(start_time_ns),
            scale,
            ..s.base
        };
        let (file, media) = match &s.media {
            SessionMedia::File { file, media } => (file, media.clone()),
            SessionMedia::Live(_) | SessionMedia::Mp4(_) => {
                return Err(text(500, 0, "not an MPEG-TS session"));
            }
        };
        let start_time_ns = media.playback(from_ns).0.start_time_ns;
        let packetizer = packetizer_at(start_time_ns);
        let anchor_std = penstock_driver::clock::now();
        let anchor = penstock_core::time::Instant::from_nanos(
            anchor_std.as_nanos() + START_DELAY.as_nanos() as u64,
        );
        let (mut spec, pb) =
            stream_spec(&self.shared.cfg, &media, from_ns, packetizer, Some(anchor));
        interleave(&mut spec, s.transport.interleaved());
        let seek = pb.1;
        let pb = pb.0;
        tracing::debug!(
            "rtsp session {}: PLAY from {} by {} at scale {}: media {} s, unit {} of the plan",
            s.id,
            from_ns.map_or("the start".into(), rtsp::npt_text),
            seek.word(),
            super::scale_text(scale),
            rtsp::npt_text(pb.start_time_ns),
            media.plan.units.len() - pb.units.len()
        );
        let fail = |code: u16, m: String| text(code, 0, &m);
        let source = match file {
            Source::File(file) => {
                let src_file = file.try_clone().map_err(|e| fail(500, format!("{e}")))?;
                let len = src_file.metadata().map_or(0, |m| m.len());
                Opened {
                    fd: src_file.into(),
                    kind: IoKind::File,
                    size: Some(len),
                    socket: false,
                    label: s.path.clone(),
                    volume: None,
                }
            }
            // A reader of its own per stream (the engine consumes it); the session's keeps
            // the volume's shared lock until TEARDOWN.
            Source::Partition { pio, .. } => pio
                .try_clone_reader()
                .map_err(|e| e.to_string())
                .and_then(|r| penstock_driver::open::opened_partition(r).map_err(|e| e.to_string()))
                .map_err(|e| fail(500, e))?,
        };
        let (target_fd, kind): (std::os::fd::OwnedFd, IoKind) = match &s.transport {
            Transport::Udp { rtp, .. } => (
                rtp.try_clone()
                    .map(Into::into)
                    .map_err(|e| fail(500, format!("{e}")))?,
                IoKind::Datagram,
            ),
            // Not direct (`interleaved_direct` off, or a `tls-user` connection): the pair,
            // read, framed (and encrypted) by the connection.
            Transport::Interleaved {
                engine_end,
                direct: false,
                ..
            } => (
                engine_end
                    .try_clone()
                    .map(Into::into)
                    .map_err(|e| fail(500, format!("{e}")))?,
                IoKind::Datagram,
            ),
            // The connection's own socket: the engine writes each frame holding the gate.
            Transport::Interleaved { tcp, .. } => (
                tcp.try_clone().map_err(|e| fail(500, format!("{e}")))?,
                IoKind::StreamSocket,
            ),
        };
        let target = Opened {
            fd: target_fd.into(),
            kind,
            size: None,
            socket: true,
            label: format!("rtsp session {}", s.id),
            volume: None,
        };
        // The reservation from SETUP (or the one before) is used when the plan asks the same;
        // a scaled plan asks `scale` times the bit rate, and the engine asks admission afresh.
        let handle = match self
            .shared
            .engine
            .open_admitted(s.admitted.take(), spec, source, target)
        {
            Ok(h) => h,
            Err(e) => {
                // Stopped: the session keeps a scale-1 reservation for the whole file (as from
                // SETUP) when it still fits, and a PLAY starts again.
                let mut whole = stream_spec(&self.shared.cfg, &media, None, s.base, None).0;
                whole.interleaved = s.transport.interleaved();
                s.admitted = crate::tenants::admit(
                    &self.shared.engine,
                    &self.shared.metrics,
                    &whole,
                    UNITS_OWN_UNIT,
                    s.tenant.as_deref(),
                )
                .ok()
                .flatten();
                s.admitted_at = Instant::now();
                if was_played {
                    s.state = penstock_core::rtsp::SessionState::Paused;
                }
                return Err(match e {
                    StreamError::Refused(_)
                    | StreamError::TooManyStreams(_)
                    | StreamError::CpuReservation(_) => {
                        self.shared.metrics.error("rtsp_admission_refused");
                        fail(453, format!("Scale {}: {e}", super::scale_text(scale)))
                    }
                    e => fail(500, format!("{e}")),
                });
            }
        };
        let cname = format!("penstock@{}", self.local.ip());
        let interval_ns = self.shared.cfg.rtcp_interval_ms.saturating_mul(1_000_000);
        let (link, tcp_rtcp) = match &s.transport {
            Transport::Udp {
                rtcp, client_rtcp, ..
            } => {
                let session =
                    SenderSession::new(packetizer.ssrc, &cname, interval_ns, random_u64());
                let link = rtcp.try_clone().and_then(|sock| {
                    penstock_driver::rtcp::RtcpLink::open_on(
                        sock,
                        *client_rtcp,
                        packetizer,
                        anchor,
                        session,
                    )
                });
                (link.ok(), None)
            }
            Transport::Interleaved { .. } => {
                let mut session =
                    SenderSession::new(packetizer.ssrc, &cname, interval_ns, random_u64());
                session.start(anchor);
                (None, Some(session))
            }
        };
        s.played = true;
        s.playing = Some(Playing {
            handle,
            packetizer,
            units: pb.units.into(),
            start_time_ns: pb.start_time_ns,
            anchor,
            link,
            tcp_rtcp,
            paused_at: None,
            seen: Default::default(),
            rtcp_reports_seen: 0,
            rtcp_lost_seen: 0,
            ended_at: None,
            seek,
        });
        Ok((
            pb.start_time_ns,
            packetizer.sequence_start,
            packetizer.timestamp_start,
        ))
    }
}

impl Conn<'_> {
    /// PLAY of a live session: from now only (a Range other than `now` or `0-` is 457); the first
    /// PLAY (or one after the source ended) subscribes the session's transport to the
    /// source, one after PAUSE lets it receive again. Sequence numbers continue; RTP times
    /// are arrival times (90 kHz since the subscription).
    fn play_live(&self, s: &mut Session, src: &Arc<LiveSource>, req: &Request, cseq: u32) -> Reply {
        // `npt=0-` is what players send on their first PLAY (ffmpeg does): "from the
        // start" of a live source is now. Any other start would be a seek: 457.
        if let Some(from) = req.range_from_ns.filter(|&f| f != 0) {
            return text(
                457,
                cseq,
                &format!(
                    "npt={}-: a live source plays from now only (Range: npt=now-, or no Range)",
                    rtsp::npt_text(from)
                ),
            );
        }
        let now = penstock_driver::clock::now();
        let reply = |sub: &super::live::Subscriber| {
            let at = now.saturating_duration_since(sub.anchor).as_nanos() as u64;
            Reply::new(200, Some(cseq))
                .header("Range", "npt=now-")
                .header(
                    "RTP-Info",
                    rtsp::rtp_info(
                        &s.track_url,
                        sub.next_sequence(),
                        sub.packetizer.timestamp(at),
                    ),
                )
        };
        if let Some(l) = &s.live {
            l.sub
                .paused
                .store(false, std::sync::atomic::Ordering::Release);
            let r = reply(&l.sub);
            s.state = SessionState::Playing;
            return r;
        }
        let packetizer = Packetizer {
            sequence_start: s.next_sequence,
            ..s.base
        };
        let subscribed = match &s.transport {
            Transport::Udp { rtp, .. } => {
                src.subscribe(std::os::fd::AsFd::as_fd(rtp), packetizer, now)
            }
            Transport::Interleaved { engine_end, .. } => {
                src.subscribe(std::os::fd::AsFd::as_fd(engine_end), packetizer, now)
            }
        };
        let sub = match subscribed {
            Ok(x) => x,
            Err(e) => return text(500, cseq, &format!("subscribing to the live source: {e}")),
        };
        let cname = format!("penstock@{}", self.local.ip());
        let interval_ns = self.shared.cfg.rtcp_interval_ms.saturating_mul(1_000_000);
        let mut session = SenderSession::new(packetizer.ssrc, &cname, interval_ns, random_u64());
        let (link, tcp_rtcp) = match &s.transport {
            Transport::Udp {
                rtcp, client_rtcp, ..
            } => (
                rtcp.try_clone()
                    .and_then(|sock| {
                        penstock_driver::rtcp::RtcpLink::open_on(
                            sock,
                            *client_rtcp,
                            packetizer,
                            now,
                            session,
                        )
                    })
                    .ok(),
                None,
            ),
            Transport::Interleaved { .. } => {
                session.start(now);
                (None, Some(session))
            }
        };
        let r = reply(&sub);
        s.played = true;
        s.live = Some(LivePlaying {
            sub,
            link,
            tcp_rtcp,
            rtcp_reports_seen: 0,
            rtcp_lost_seen: 0,
        });
        s.state = SessionState::Playing;
        r
    }
}

impl Conn<'_> {
    /// The movie of an MP4 path, or the 415 naming why it cannot be played.
    fn mp4_media(
        &self,
        file: &Source,
        path: &str,
        cseq: u32,
    ) -> Result<super::mp4::Mp4Media, Reply> {
        let Source::File(f) = file else {
            return Err(text(
                415,
                cseq,
                &format!("{path}: MP4 from a volume partition is not served"),
            ));
        };
        super::mp4::Mp4Media::open(f).map_err(|e| {
            self.shared.metrics.error("rtsp_mp4_refused");
            text(415, cseq, &format!("{path}: not playable as MP4: {e}"))
        })
    }

    /// DESCRIBE of an MP4: one `m=` per track, from its sample descriptions.
    fn describe_mp4(&self, req: &Request, cseq: u32) -> Reply {
        let (file, path) = match self.open(req, cseq) {
            Ok(f) => f,
            Err(r) => return r,
        };
        let media = match self.mp4_media(&file, &path, cseq) {
            Ok(m) => m,
            Err(r) => return r,
        };
        let sdp = match req.uri.split_once('?') {
            Some((base, q)) => media.sdp(
                random_u64() >> 1,
                self.local.ip(),
                Some((base.trim_end_matches('/'), q)),
            ),
            None => media.sdp(random_u64() >> 1, self.local.ip(), None),
        };
        let base = if req.uri.ends_with('/') {
            req.uri.clone()
        } else {
            format!("{}/", req.uri)
        };
        let mut r = Reply::new(200, Some(cseq)).header("Content-Base", base);
        r.content_type = Some("application/sdp");
        r.body = sdp.into_bytes();
        r
    }

    /// The first SETUP of an MP4's track: the movie indexed, the track found, the movie's
    /// rate admitted (class `rt`, held until TEARDOWN).
    #[allow(clippy::type_complexity)]
    fn open_mp4_session(
        &self,
        file: Source,
        path: &str,
        req: &Request,
        cseq: u32,
        tenant: Option<&str>,
    ) -> Result<
        (
            Box<super::mp4::Mp4Session>,
            usize,
            Option<penstock_driver::engine::Admitted>,
        ),
        Reply,
    > {
        let media = self.mp4_media(&file, path, cseq)?;
        let Source::File(file) = file else {
            return Err(text(415, cseq, "MP4 from a volume partition is not served"));
        };
        let Some(track) = req.track else {
            return Err(text(
                459,
                cseq,
                "an MP4 is set up track by track: SETUP each a=control URL of the SDP (trackID=N)",
            ));
        };
        let Some(index) = media.track_index(track) else {
            return Err(text(404, cseq, &format!("{path}: no track {track}")));
        };
        let admitted = match crate::tenants::admit(
            &self.shared.engine,
            &self.shared.metrics,
            &media.admission_spec(),
            UNITS_OWN_UNIT,
            tenant,
        ) {
            Ok(a) => a,
            Err(e) => {
                self.shared.metrics.error("rtsp_admission_refused");
                return Err(text(
                    453,
                    cseq,
                    &format!("admission refused (the server's rt capacity): {e}"),
                ));
            }
        };
        let m = super::mp4::Mp4Session {
            media: Arc::new(media),
            file,
            tracks: Vec::new(),
            sender: None,
            alive: Default::default(),
            sent_bytes: Default::default(),
            ended: Default::default(),
            cname: format!("penstock@{}", self.local.ip()),
            rtcp_interval: Duration::from_millis(self.shared.cfg.rtcp_interval_ms),
            trick: Trick::NORMAL,
            reserved: Some(Trick::NORMAL),
            trick_stopped_at: None,
            paused_at: None,
        };
        Ok((Box::new(m), index, admitted))
    }

    /// A further SETUP into an MP4 session: another of the movie's tracks, its own RTP
    /// session (SSRC, numbering, transport).
    fn add_mp4_track(
        &mut self,
        arc: &Arc<std::sync::Mutex<Session>>,
        id: &str,
        req: &Request,
        cseq: u32,
    ) -> Reply {
        if let Err(r) = self.authorize(req, cseq) {
            return r;
        }
        let ask = match &req.transport {
            None => return text(461, cseq, "SETUP needs a Transport header"),
            Some(Err(e)) => return text(461, cseq, &e.to_string()),
            Some(Ok(a)) => *a,
        };
        let index = {
            let s = arc.lock().unwrap_or_else(|p| p.into_inner());
            let SessionMedia::Mp4(m) = &s.media else {
                return text(455, cseq, "not an MP4 session");
            };
            if s.state != SessionState::Ready {
                return text(455, cseq, "tracks are set up before PLAY");
            }
            if req.path.as_deref() != Some(s.path.as_str()) {
                return text(
                    459,
                    cseq,
                    "a session plays one file: SETUP of another file's track",
                );
            }
            let Some(track) = req.track else {
                return text(459, cseq, "SETUP of a track needs its trackID=N URL");
            };
            let Some(index) = m.media.track_index(track) else {
                return text(404, cseq, &format!("{}: no track {track}", s.path));
            };
            if m.tracks.iter().any(|t| t.index == index) {
                return text(455, cseq, &format!("track {track} is set up already"));
            }
            index
        };
        let base = Packetizer::mp2t(random_u64());
        let (transport, line) = match self.make_transport(ask, base.ssrc, cseq) {
            Ok(t) => t,
            Err(r) => return r,
        };
        let out = match super::mp4::out_of(&transport) {
            Ok(o) => o,
            Err(e) => return text(500, cseq, &format!("duplicating the transport: {e}")),
        };
        {
            let mut s = arc.lock().unwrap_or_else(|p| p.into_inner());
            s.last_seen = Instant::now();
            let SessionMedia::Mp4(m) = &mut s.media else {
                return text(455, cseq, "not an MP4 session");
            };
            m.tracks.push(super::mp4::Mp4Track::new(
                index,
                req.uri.clone(),
                &base,
                out,
            ));
        }
        // The transport (its sockets, or the relay pair registered for this session) is
        // kept by the track's output; the relay is named by the session.
        if let Some(r) = self.relays.iter_mut().find(|r| r.session.is_empty()) {
            r.session = id.to_string();
        }
        drop(transport);
        Reply::new(200, Some(cseq))
            .header("Transport", line)
            .header("Session", self.session_header(id))
    }

    /// PLAY of an MP4 session: from the sync sample at or before `Range: npt=T-` (the start
    /// without one), or where PAUSE (or a trick play) stopped. `Scale` above 1 or negative:
    /// trick play, the video track's key frames only (`penstock_core::mp4::trick`); without
    /// a `Scale` header the PLAY is at scale 1 again.
    fn play_mp4(&self, s: &mut Session, req: &Request, cseq: u32) -> Reply {
        let trick = match scale_signed(req.scale, self.shared.cfg.scale_max) {
            Ok(None) => Trick::NORMAL,
            Ok(Some((speed, reverse))) => Trick { speed, reverse },
            Err(why) => return text(451, cseq, &why),
        };
        let scale_hdr = trick_text(trick);
        if trick != Trick::NORMAL && !trick.key_frames_only() {
            return text(
                451,
                cseq,
                &format!(
                    "Scale {scale_hdr}: an MP4 plays at scale 1, above 1 or reversed (key frames only); slow motion is not served"
                ),
            );
        }
        let send_timeout = self.shared.cfg.send_timeout();
        let state = s.state;
        let Session {
            media, admitted, ..
        } = s;
        let SessionMedia::Mp4(m) = media else {
            return text(500, cseq, "not an MP4 session");
        };
        let duration = m.media.duration_ns;
        if let Some(r) = past_the_end(cseq, req.range_from_ns, duration) {
            return r;
        }
        let lead = m.media.lead();
        let lead_slot = m.tracks.iter().position(|t| t.index == lead);
        if trick.key_frames_only()
            && (m.media.movie.tracks[lead].kind != TrackKind::Video || lead_slot.is_none())
        {
            return text(
                451,
                cseq,
                &format!(
                    "Scale {scale_hdr}: trick play sends the video track's key frames, and this session has no video track set up"
                ),
            );
        }
        if state == SessionState::Playing
            && req.range_from_ns.is_none()
            && m.sender.is_some()
            && m.trick == trick
        {
            return Reply::new(200, Some(cseq)).header("Scale", scale_hdr);
        }
        m.stop();
        // Where this PLAY starts: a Range; else where a trick play stopped, or (scale 1 to
        // scale 1) each track's next sample; else the start (reverse: the end).
        let lead_track = &m.media.movie.tracks[lead];
        let after_trick = m
            .trick_stopped_at
            .filter(|_| m.trick.key_frames_only() && state != SessionState::Ready);
        let resume = req.range_from_ns.is_none() && state != SessionState::Ready;
        let lead_pos = |sample: usize| {
            lead_track.samples.get(sample).map_or(duration, |x| {
                m.media.rtp[lead].presentation_ns(x.dts as i64).max(0) as u64
            })
        };
        let mut trick_send = None;
        let start_ns = if trick.key_frames_only() {
            let from = match (req.range_from_ns, after_trick) {
                (Some(ns), _) => m.media.lead_sample_at(ns),
                (None, Some(k)) if resume => k,
                _ if resume => lead_slot.map_or(0, |k| m.tracks[k].next_sample),
                _ if trick.reverse => usize::MAX,
                _ => 0,
            };
            let frames = trick_frames(lead_track, from, trick);
            let Some(first) = frames.first() else {
                return text(457, cseq, "the video track has no sample to play");
            };
            let slot = lead_slot.unwrap_or(0);
            let x = &lead_track.samples[first.sample];
            let ts_start = m.media.rtp[lead].timestamp(
                m.tracks[slot].ts_base,
                x.dts as i64 + i64::from(x.cts_offset),
            );
            let start_ns =
                m.media.rtp[lead].presentation_ns(x.dts as i64 + i64::from(x.cts_offset));
            trick_send = Some(TrickSend {
                slot,
                frames,
                ts_start,
            });
            start_ns
        } else if let (None, Some(k)) = (req.range_from_ns, after_trick.filter(|_| resume)) {
            // Back to scale 1 where the trick play stopped.
            let (firsts, start_ns) = m.media.start(Some(lead_pos(k)));
            for t in &mut m.tracks {
                t.next_sample = firsts[t.index];
            }
            start_ns
        } else if resume && req.range_from_ns.is_none() {
            // Resume: each track from its next sample; the clock from the earliest due.
            m.tracks
                .iter()
                .filter_map(|t| {
                    let tr = &m.media.movie.tracks[t.index];
                    tr.samples
                        .get(t.next_sample)
                        .map(|x| m.media.rtp[t.index].presentation_ns(x.dts as i64))
                })
                .min()
                .unwrap_or(duration as i64)
        } else {
            let (firsts, start_ns) = m.media.start(req.range_from_ns);
            for t in &mut m.tracks {
                t.next_sample = firsts[t.index];
            }
            start_ns
        };
        // The reservation: the session holds one for what it plays now (scale 1: the movie's
        // rate; a trick play: its key frames). Another scale, or one given back by a long
        // pause or a SETUP not played in time, asks admission afresh — the one it replaces
        // given back first, as the TS path does (docs/rtsp.md "Scale").
        if m.reserved != Some(trick) || admitted.is_none() {
            let spec = match &trick_send {
                Some(t) => m.media.trick_spec(&t.frames),
                None => m.media.admission_spec(),
            };
            let had = admitted.take().is_some() || m.reserved.is_some();
            m.reserved = None;
            match self.shared.engine.admit(&spec, UNITS_OWN_UNIT) {
                Ok(a) => {
                    *admitted = a;
                    m.reserved = Some(trick);
                }
                Err(e) => {
                    self.shared.metrics.error("rtsp_admission_refused");
                    // Refused: a session that held a reservation keeps a scale-1 one when it
                    // still fits, and stays paused for another PLAY.
                    if had && trick != Trick::NORMAL {
                        *admitted = self
                            .shared
                            .engine
                            .admit(&m.media.admission_spec(), UNITS_OWN_UNIT)
                            .ok()
                            .flatten();
                        if admitted.is_some() {
                            m.reserved = Some(Trick::NORMAL);
                        }
                    }
                    m.paused_at = Some(Instant::now());
                    if state != SessionState::Ready {
                        s.state = SessionState::Paused;
                    }
                    return text(
                        453,
                        cseq,
                        &format!(
                            "Scale {scale_hdr}: admission refused (the server's rt capacity): {e}"
                        ),
                    );
                }
            }
        }
        let was_trick = trick_send.is_some();
        let info = match m.play(
            if was_trick { 0 } else { start_ns },
            send_timeout,
            trick_send,
        ) {
            Ok(i) => i,
            Err(e) => return text(500, cseq, &format!("starting the sender: {e}")),
        };
        m.trick = trick;
        if !was_trick {
            m.trick_stopped_at = None;
        }
        let rtp_info: Vec<String> = m
            .tracks
            .iter()
            .zip(&info)
            .map(|(t, &(seq, ts))| rtsp::rtp_info(&t.url, seq, ts))
            .collect();
        tracing::debug!(
            "rtsp session {}: MP4 PLAY from {} (npt {} asked) at scale {scale_hdr}, {} tracks",
            s.id,
            rtsp::npt_text(start_ns.max(0) as u64),
            req.range_from_ns.map_or("none".into(), rtsp::npt_text),
            rtp_info.len()
        );
        s.state = SessionState::Playing;
        let range = if trick.reverse {
            format!("npt={}-0", rtsp::npt_text(start_ns.max(0) as u64))
        } else {
            format!(
                "npt={}-{}",
                rtsp::npt_text(start_ns.max(0) as u64),
                rtsp::npt_text(duration)
            )
        };
        Reply::new(200, Some(cseq))
            .header("Range", range)
            .header("Scale", scale_hdr)
            .header("RTP-Info", rtp_info.join(","))
    }
}

fn pause(s: &mut Session, cseq: u32) -> Reply {
    if let SessionMedia::Mp4(m) = &mut s.media {
        // The sender stops; each track remembers its next sample and sequence number.
        m.stop();
        m.paused_at = Some(Instant::now());
    }
    if let Some(l) = &s.live {
        // A live session stops receiving: its queue is emptied, nothing more is queued.
        l.sub.pause();
    }
    if s.state == SessionState::Playing
        && let Some(p) = &mut s.playing
    {
        p.handle.pause();
        let t0 = Instant::now();
        while !p.handle.is_paused() && t0.elapsed() < PAUSE_WAIT {
            std::thread::sleep(Duration::from_millis(1));
        }
        p.paused_at = Some(penstock_driver::clock::now());
    }
    s.state = SessionState::Paused;
    Reply::new(200, Some(cseq))
}

/// Where a PLAY's `Range: npt=T-` asks to start on the media's timeline. libavformat's
/// clients (ffmpeg, mpv) ask `T + S` for a seek to T, S the stream's first presentation time
/// (`penstock_core::rtsp::adds_stream_start`): S is taken off again for them when the file's
/// key-frame index knows it (a start of 0, their first PLAY, stays 0).
fn seek_asked_ns(req: &Request, media: &super::Media) -> Option<u64> {
    let t = req.range_from_ns?;
    match media.pts_start_ns {
        Some(s) if t > 0 && rtsp::adds_stream_start(req.user_agent.as_deref()) => {
            Some(t.saturating_sub(s))
        }
        _ => Some(t),
    }
}

/// The engine stream of a playback of `media` from `from_ns` (the whole file with `None`).
/// At `packetizer.scale` (RTSP `Scale`) the deadlines are the media's divided by the scale: the
/// plan asks admission for `scale` times the bit rate.
fn stream_spec(
    cfg: &crate::config::RtspConfig,
    media: &super::Media,
    from_ns: Option<u64>,
    packetizer: Packetizer,
    start_at: Option<penstock_core::time::Instant>,
) -> (StreamSpec, (penstock_core::track::Playback, super::Seek)) {
    let (mut pb, seek) = media.playback(from_ns);
    if packetizer.scale != Speed::NORMAL {
        for u in &mut pb.units {
            u.offset_ns = packetizer.scale.scale_ns(u.offset_ns);
        }
    }
    let spec = StreamSpec {
        extent: Extent {
            offset: pb.media_offset_bytes,
            length: Some(pb.media_bytes),
        },
        pacing: Pacing::Units(pb.units.clone().into()),
        class: Some(DiskClass::Rt),
        rtp: Some(packetizer),
        start_at,
        send_timeout: Some(cfg.send_timeout()),
        // Zero copy (docs/rtsp.md): O_DIRECT reads into the registered pool, SEND_ZC out of
        // it; the planner falls back (and says so in the stream's notes) where the file
        // system or the kernel cannot.
        cache: if cfg.direct_reads {
            CachePolicy::Bypass
        } else {
            CachePolicy::Keep
        },
        zero_copy: if cfg.zero_copy_sends {
            ZeroCopy::On
        } else {
            ZeroCopy::Off
        },
        ..StreamSpec::opened()
    };
    (spec, (pb, seek))
}

/// PLAY's 457 for a `Range` that starts after the media's end (`duration_ns`).
fn past_the_end(cseq: u32, from_ns: Option<u64>, duration_ns: u64) -> Option<Reply> {
    let from = from_ns.filter(|&f| f > duration_ns)?;
    Some(text(
        457,
        cseq,
        &format!(
            "npt={} is past the end (npt=0-{})",
            rtsp::npt_text(from),
            rtsp::npt_text(duration_ns)
        ),
    ))
}

/// An interleaved session's engine stream writes its frames to the connection's socket
/// (`il`). Its sends ask zero copy `auto`, not `on`: the planner then copies a TCP unit under
/// `ZERO_COPY_UNIT_BYTES_MIN` into the socket (one ring SEND from the pool, no copy through
/// user space), since a 1,328-byte frame's SEND_ZC notification costs more than its copy
/// (the kernel's msg_zerocopy.rst: zero copy pays from ~10 KB), and a SEND_ZC'd frame to a client
/// that stopped reading and read again held the writer gate past `send_timeout_ms` (rtsp.rs's
/// stalled-client test: 135 s and no reply with SEND_ZC, 7.8 s and every reply without; why the
/// frame's rest did not go is not known yet).
fn interleave(spec: &mut StreamSpec, il: Option<Interleaved>) {
    if il.is_some() && spec.zero_copy == ZeroCopy::On {
        spec.zero_copy = ZeroCopy::Auto;
    }
    spec.interleaved = il;
}
/// An RTSP stream's units are its media's (a unit plan): the target's kind decides no
/// default unit, whatever the transport ([`penstock_driver::Engine::admit`]'s `datagram`).
const UNITS_OWN_UNIT: bool = true;

/// The `Scale` of a PLAY: `None` without the header; 451's reason for a scale not served
/// (zero or negative: no reverse play or stills; above `rtsp.scale_max`; finer than 0.001).
fn scale_asked(scale: Option<f64>, scale_max: u32) -> Result<Option<Speed>, String> {
    match scale_signed(scale, scale_max)? {
        Some((_, true)) => Err(format!(
            "Scale {}: only positive scales are served (no reverse play, no stills)",
            scale.unwrap_or_default()
        )),
        x => Ok(x.map(|(s, _)| s)),
    }
}

/// The `Scale` of a PLAY as a speed and whether it is reversed (negative): `None` without
/// the header; 451's reason for zero (stills are not served), a magnitude above
/// `rtsp.scale_max` or finer than 0.001. The one reading of `Scale` for TS and MP4.
fn scale_signed(scale: Option<f64>, scale_max: u32) -> Result<Option<(Speed, bool)>, String> {
    let Some(x) = scale else { return Ok(None) };
    if !x.is_finite() || x == 0.0 {
        return Err(format!("Scale {x}: stills (scale 0) are not served"));
    }
    let (m, reverse) = (x.abs(), x < 0.0);
    if m > f64::from(scale_max) {
        return Err(format!("Scale {x}: above rtsp.scale_max {scale_max}"));
    }
    // Finer than 0.001 is not served (docs/rtsp.md); rounding to the nearest thousandth
    // would make 0.0005 a scale of 0.001.
    if m < 0.001 {
        return Err(format!("Scale {x}: below 0.001"));
    }
    let num = (m * 1000.0).round() as u64;
    let g = gcd(num, 1000);
    Speed::from_ratio(num / g.max(1), 1000 / g.max(1))
        .map(|s| Some((s, reverse)))
        .ok_or_else(|| format!("Scale {x}: below 0.001"))
}

/// A trick play's scale as RTSP writes it (`-2`, `4`, `1`).
fn trick_text(t: Trick) -> String {
    let s = super::scale_text(t.speed);
    if t.reverse { format!("-{s}") } else { s }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn text(status: u16, cseq: u32, msg: &str) -> Reply {
    let mut r = Reply::new(status, (cseq != 0).then_some(cseq));
    r.body = format!("{msg}\n").into_bytes();
    r.content_type = Some("text/plain");
    r
}

fn method_word(m: &Method) -> &'static str {
    match m {
        Method::Options => "OPTIONS",
        Method::Describe => "DESCRIBE",
        Method::Setup => "SETUP",
        Method::Play => "PLAY",
        Method::Pause => "PAUSE",
        Method::Teardown => "TEARDOWN",
        Method::GetParameter => "GET_PARAMETER",
        Method::SetParameter => "SET_PARAMETER",
        Method::Announce => "ANNOUNCE",
        Method::Record => "RECORD",
        _ => "other",
    }
}
