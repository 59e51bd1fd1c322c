//! Sending a response from the loop: [`Out`] (what a response keeps after its request) and
//! [`write_out`], the sending state machine: the head, then the body pieces, memory with
//! `send` and file extents with `sendfile`, under the location's rate limit ([`RateLimit`],
//! nginx's `limit_rate`) and a budget of send calls per turn. A body reserved for the engine
//! stops after the head ([`Progress::HandOff`]).
//!
//! A body of several adjacent file ranges (a packaged MP4 segment: its samples, interleaved
//! in the file with the other track's, about one range per frame) is gathered instead: the
//! ranges are spliced into a pipe of the worker's ([`Pipes`]), and the pipe into the socket,
//! so that the socket is written once per pipeful rather than once per range. Profiled under
//! `penstock bench hls` (100 viewers of a 2 Mbit/s MP4), the server spent 72 % of its time in
//! ~50 sendfile calls per segment; in a micro-benchmark on the same file, sending each
//! segment's ranges by sendfile cost 0.51 ms of CPU per MB sent, splicing them through a
//! 1 MiB pipe 0.29 ms, a 64 KiB (16-buffer) pipe 0.62 ms — a pipe holds one buffer per page
//! piece, so a small one must be emptied every few ranges. Zero copy either way: splice
//! moves page references, as sendfile does.

use std::collections::VecDeque;
use std::fs::File;
use std::net::TcpStream;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use penstock_core::http::{BodyPiece, Status};
use penstock_driver::engine::StreamSlot;
use penstock_driver::{SendfileCall, sendfile_call};
use rustix::io::Errno;
use rustix::net::SendFlags;

use super::RequestEnd;
use crate::access_log::LogEntry;

/// Send calls per connection per turn before the loop serves the others.
pub(super) const BUDGET_SYSCALLS: usize = 16;
/// Bytes per sendfile call from the loop (the socket buffer usually takes less).
const SENDFILE_CHUNK_BYTES: u64 = 4 << 20;
/// The size asked for a gathering pipe: the kernel's default `fs.pipe-max-size`, the most an
/// unprivileged process may ask. A pipe holds at most size / 4096 buffers, one per page piece
/// of a range; when the kernel refuses this size the body goes by sendfile (a default
/// 16-buffer pipe costs more than sendfile: see the module doc).
const GATHER_PIPE_BYTES: usize = 1 << 20;

/// A pipe that gathers a body's file ranges, and the bytes in it not yet sent.
pub(super) struct GatherPipe {
    r: OwnedFd,
    w: OwnedFd,
    held: usize,
    /// The worker's count of pipes in existence, decremented when this one is closed.
    count: Arc<AtomicUsize>,
}

impl Drop for GatherPipe {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A worker's gathering pipes: at most `max` exist (idle here or held by responses whose
/// socket has not taken their bytes yet). An idle pipe is empty: it holds no page.
#[derive(Default)]
pub(super) struct Pipes {
    idle: Vec<GatherPipe>,
    count: Arc<AtomicUsize>,
    /// Set when the kernel refused a pipe or its size: this worker sends by sendfile.
    refused: bool,
}

impl Pipes {
    /// An empty pipe, or `None` (at `max`, or refused by the kernel: sendfile then).
    fn take(&mut self, max: usize) -> Option<GatherPipe> {
        if let Some(p) = self.idle.pop() {
            return Some(p);
        }
        if self.refused || self.count.load(Ordering::Relaxed) >= max {
            return None;
        }
        use rustix::pipe::{PipeFlags, fcntl_setpipe_size, pipe_with};
        let made = pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)
            .and_then(|(r, w)| fcntl_setpipe_size(&w, GATHER_PIPE_BYTES).map(|_| (r, w)));
        match made {
            Ok((r, w)) => {
                self.count.fetch_add(1, Ordering::Relaxed);
                Some(GatherPipe {
                    r,
                    w,
                    held: 0,
                    count: self.count.clone(),
                })
            }
            Err(e) => {
                // Out of descriptors passes; a size the kernel refuses (fs.pipe-max-size,
                // the user's pipe pages) would refuse every time.
                if e != Errno::MFILE && e != Errno::NFILE {
                    self.refused = true;
                    tracing::info!(error = %e, bytes = GATHER_PIPE_BYTES, "no gathering pipe of this size: bodies of many file ranges go by sendfile");
                }
                None
            }
        }
    }

    /// A pipe whose bytes all left: idle again.
    fn give(&mut self, p: GatherPipe) {
        debug_assert_eq!(p.held, 0);
        self.idle.push(p);
    }

    /// Pipes in existence (idle or held).
    #[cfg(test)]
    fn count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }
}

/// The policy bits a response keeps after the request is gone.
pub(super) struct Out {
    pub(super) head: Vec<u8>,
    pub(super) head_pos: usize,
    pub(super) pieces: VecDeque<BodyPiece>,
    /// Bytes of the front piece already sent.
    pub(super) piece_pos: u64,
    pub(super) file: Option<File>,
    pub(super) file_label: String,
    pub(super) keep_alive: bool,
    pub(super) class: Arc<str>,
    /// `sendfile`, `memory` or `none`; becomes `engine-<path>` on hand-off.
    pub(super) path_label: &'static str,
    pub(super) body_sent: u64,
    pub(super) rate: Option<RateLimit>,
    /// The engine place reserved for the (single, file) body, before the head was made: hand
    /// the body to the engine once the head is out. Given back when the response is dropped.
    pub(super) to_engine: Option<StreamSlot>,
    /// What a tenant's paced body reserved in the tenant's share before the head was made
    /// (`respond`): the engine's stream starts with it (`hand_off`).
    pub(super) tenant_admitted: Option<penstock_driver::Admitted>,
    /// Set (to the path's `Content-Type`) when the path is missing beneath the root and an
    /// origin answers it: the loop hands the request to an origin thread (`origin.rs`),
    /// nothing else of this `Out` but its class, start, log entry and keep-alive is used.
    pub(super) origin_type: Option<String>,
    /// Set when the playlist asked for waits for its file's index to be built: the loop parks
    /// the connection until the build ends (`indexing.rs`); as with `origin_type`, only the
    /// class, start, log entry and keep-alive of this `Out` are used.
    pub(super) hls_wait: Option<Box<super::indexing::IndexPending>>,
    /// TCP_CORK is set for this body (several pieces: an MP4 segment's generated header and
    /// its samples' ranges leave in full packets); cleared when the body is out.
    pub(super) corked: bool,
    /// The pipe gathering this body's file ranges (see the module doc), while it has one.
    pub(super) gather: Option<GatherPipe>,
    /// The location's CORS lines and the caching of HLS media (`crate::delivery`), for the heads
    /// made after `respond` (a playlist after its index build, the origin's answer).
    pub(super) delivery: crate::delivery::Delivery,
    /// A volume partition's body (`/vol/NAME/PART`): the engine reads it from the members
    /// (its place is always reserved: the loop has no single file to sendfile from).
    pub(super) volume: Option<Box<penstock_driver::volume::PartitionIo>>,
    pub(super) status: Status,
    /// When the request's head began to arrive.
    pub(super) started: Instant,
    /// The access log's part of the request, when the log is on.
    pub(super) log: Option<LogEntry>,
}

impl Out {
    /// The response `r` sent from memory, every other field at its start (no file, no
    /// engine place, nothing paced, not corked, no log entry), started now: callers set
    /// what differs with struct update syntax.
    pub(super) fn from_response(r: penstock_core::http::Response, class: Arc<str>) -> Out {
        Out {
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
            tenant_admitted: None,
            origin_type: None,
            hls_wait: None,
            corked: false,
            gather: None,
            delivery: Default::default(),
            volume: None,
            status: r.status,
            started: Instant::now(),
            log: None,
        }
    }

    /// This response ending now with `status` and `body_bytes` sent.
    pub(super) fn request_end(&self, status: u16, body_bytes: u64) -> RequestEnd<'_> {
        RequestEnd {
            class: &self.class,
            data_path: self.path_label,
            status,
            body_bytes,
            started: self.started,
            log: self.log.as_ref(),
        }
    }
}

/// nginx's `limit_rate` / `limit_rate_after`: the first `after_bytes` go at full speed, then
/// at most `bytes_per_s`, measured from the moment `after_bytes` were sent.
#[derive(Debug, Clone, Copy)]
pub(super) struct RateLimit {
    pub(super) bytes_per_s: u64,
    pub(super) after_bytes: u64,
    pub(super) rate_start: Option<Instant>,
}

impl RateLimit {
    /// Bytes that may go now (`body_sent` so far), or when to come back.
    pub(super) fn allowance(&mut self, now: Instant, body_sent: u64) -> Result<u64, Instant> {
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

pub(super) enum Progress {
    Done,
    WouldBlock,
    RateWait(Instant),
    Yield,
    HandOff,
    Failed(&'static str),
}

/// Sends as much of `out` as the socket, the rate and the budget allow; a body of several
/// adjacent file ranges is gathered through one of `pipes` (at most `pipes_max` of them).
pub(super) fn write_out(
    sock: &TcpStream,
    out: &mut Out,
    now: Instant,
    pipes: &mut Pipes,
    pipes_max: usize,
) -> Progress {
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
    if !out.corked && out.body_sent == 0 && out.pieces.len() > 1 {
        // A body of several pieces (memory then file ranges): corked, so the pieces' seams
        // do not each end a short packet. Best effort: a socket that refuses it still works.
        out.corked = rustix::net::sockopt::set_tcp_cork(sock, true).is_ok();
    }
    if out.gather.is_none()
        && out.body_sent == 0
        && out.piece_pos == 0
        && out.rate.is_none()
        && adjacent_file_pieces(&out.pieces)
    {
        out.gather = pipes.take(pipes_max);
    }
    let p = if out.gather.is_some() {
        match write_gathered(sock, out, &mut calls) {
            Some(p) => p,
            None => {
                // The file cannot be spliced (nothing of it went into the pipe): sendfile.
                out.gather = None;
                write_pieces(sock, out, now, &mut calls)
            }
        }
    } else {
        write_pieces(sock, out, now, &mut calls)
    };
    if matches!(p, Progress::Done) {
        if let Some(g) = out.gather.take() {
            pipes.give(g);
        }
        if out.corked {
            // Uncorking pushes what is queued.
            let _ = rustix::net::sockopt::set_tcp_cork(sock, false);
            out.corked = false;
        }
    }
    p
}

/// Whether two file ranges follow each other in `pieces` (a body worth gathering).
fn adjacent_file_pieces(pieces: &VecDeque<BodyPiece>) -> bool {
    pieces
        .iter()
        .zip(pieces.iter().skip(1))
        .any(|(a, b)| matches!((a, b), (BodyPiece::File { .. }, BodyPiece::File { .. })))
}

/// The body's pieces through `out.gather`: file ranges spliced into the pipe until it is full
/// or a memory piece comes, the pipe spliced into the socket, memory pieces sent when the pipe
/// is empty. `None` when the first splice from the file is refused (a file system without
/// splice): nothing moved, the caller sends by sendfile.
fn write_gathered(sock: &TcpStream, out: &mut Out, calls: &mut usize) -> Option<Progress> {
    use rustix::pipe::{SpliceFlags, splice};
    let flags = SpliceFlags::MOVE | SpliceFlags::NONBLOCK;
    loop {
        let g = out.gather.as_mut().expect("the caller checked");
        // Fill the pipe from the file ranges at the front.
        while let Some(&BodyPiece::File {
            offset_bytes,
            len_bytes,
        }) = out.pieces.front()
        {
            let Some(file) = &out.file else {
                return Some(Progress::Failed("internal"));
            };
            let mut off = offset_bytes + out.piece_pos;
            let want = usize::try_from(len_bytes - out.piece_pos).unwrap_or(usize::MAX);
            match splice(file.as_fd(), Some(&mut off), g.w.as_fd(), None, want, flags) {
                Ok(0) => return Some(Progress::Failed("file_shrank")),
                Ok(n) => {
                    g.held += n;
                    out.piece_pos += n as u64;
                    if out.piece_pos == len_bytes {
                        out.pieces.pop_front();
                        out.piece_pos = 0;
                    }
                }
                // The pipe is full.
                Err(Errno::AGAIN) if g.held > 0 => break,
                Err(Errno::INTR) => {}
                Err(_) if g.held == 0 && out.body_sent == 0 && out.piece_pos == 0 => return None,
                Err(_) => return Some(Progress::Failed("splice_failed")),
            }
        }
        if g.held > 0 {
            if *calls >= BUDGET_SYSCALLS {
                return Some(Progress::Yield);
            }
            *calls += 1;
            // MSG_MORE while pieces follow (the cork holds them anyway; this says it to a
            // socket that refused the cork).
            let more = if out.pieces.is_empty() {
                flags
            } else {
                flags | SpliceFlags::MORE
            };
            match splice(g.r.as_fd(), None, sock.as_fd(), None, g.held, more) {
                Ok(0) => return Some(Progress::Failed("client_vanished")),
                Ok(n) => {
                    g.held -= n;
                    out.body_sent += n as u64;
                    if g.held > 0 {
                        // A short write: the socket's buffer is full (as in `write_pieces`).
                        return Some(Progress::WouldBlock);
                    }
                }
                Err(Errno::AGAIN) => return Some(Progress::WouldBlock),
                Err(Errno::INTR) => {}
                Err(e) => return Some(Progress::Failed(peer_kind(e))),
            }
            continue;
        }
        // The pipe is empty: a memory piece, or the end.
        let Some(BodyPiece::Bytes(b)) = out.pieces.front() else {
            return Some(Progress::Done);
        };
        if *calls >= BUDGET_SYSCALLS {
            return Some(Progress::Yield);
        }
        *calls += 1;
        let more = if out.pieces.len() > 1 {
            SendFlags::MORE
        } else {
            SendFlags::empty()
        };
        let start = out.piece_pos as usize;
        match rustix::net::send(sock, &b[start..], SendFlags::NOSIGNAL | more) {
            Ok(n) => {
                out.piece_pos += n as u64;
                out.body_sent += n as u64;
                if out.piece_pos as usize == b.len() {
                    out.pieces.pop_front();
                    out.piece_pos = 0;
                } else {
                    return Some(Progress::WouldBlock);
                }
            }
            Err(Errno::AGAIN) => return Some(Progress::WouldBlock),
            Err(Errno::INTR) => {}
            Err(e) => return Some(Progress::Failed(peer_kind(e))),
        }
    }
}

/// The body's pieces one call each: memory by `send`, file ranges by `sendfile`.
fn write_pieces(sock: &TcpStream, out: &mut Out, now: Instant, calls: &mut usize) -> Progress {
    let mut calls = *calls;
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
                let more = if out.pieces.len() > 1 {
                    SendFlags::MORE
                } else {
                    SendFlags::empty()
                };
                rustix::net::send(sock, &b[start..end], SendFlags::NOSIGNAL | more)
            }
            BodyPiece::File { offset_bytes, .. } => {
                let Some(file) = &out.file else {
                    return Progress::Failed("internal");
                };
                let mut off = offset_bytes + out.piece_pos;
                let want = left.min(allowance).min(SENDFILE_CHUNK_BYTES) as usize;
                asked = want;
                // The engine's sendfile path reads a call the same way.
                match sendfile_call(sock.as_fd(), file.as_fd(), &mut off, want) {
                    SendfileCall::SourceEnded => return Progress::Failed("file_shrank"),
                    SendfileCall::Sent(n) => Ok(n),
                    SendfileCall::WouldBlock => Err(Errno::AGAIN),
                    SendfileCall::Interrupted => Err(Errno::INTR),
                    SendfileCall::Failed(e) => Err(e),
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

    #[test]
    fn a_worker_keeps_at_most_its_pipes_and_reuses_them() {
        let mut pipes = Pipes::default();
        let a = pipes.take(2).expect("a pipe");
        let b = pipes.take(2).expect("a second pipe");
        assert!(pipes.take(2).is_none(), "a third beyond the maximum");
        assert_eq!(pipes.count(), 2);
        pipes.give(a);
        let _a = pipes.take(2).expect("the idle one again");
        assert_eq!(pipes.count(), 2, "reused, not made");
        drop(b);
        assert_eq!(pipes.count(), 1, "a pipe dropped with its response is gone");
        assert!(pipes.take(2).is_some(), "room for one again");
    }

    /// A body of a memory piece and file ranges, gathered: the client gets the bytes in
    /// order, and the pipe goes back to the worker.
    #[test]
    fn gathered_ranges_arrive_in_order() {
        use std::io::{Read, Write};
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        f.write_all(&data).unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server, _) = l.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        let ranges = [(10u64, 5000u64), (9000, 300), (9300, 70_000), (150_000, 1)];
        let mut pieces: Vec<BodyPiece> = vec![BodyPiece::Bytes(b"header".to_vec())];
        for &(offset_bytes, len_bytes) in &ranges {
            pieces.push(BodyPiece::File {
                offset_bytes,
                len_bytes,
            });
        }
        let mut want = b"header".to_vec();
        for &(o, n) in &ranges {
            want.extend_from_slice(&data[o as usize..(o + n) as usize]);
        }
        let r = penstock_core::http::Response {
            status: Status::OK,
            head: b"H".to_vec(),
            body: pieces,
            keep_alive: true,
        };
        let mut out = Out {
            file: Some(f),
            path_label: "sendfile",
            ..Out::from_response(r, Arc::from("x"))
        };
        let mut pipes = Pipes::default();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            let mut c = client;
            c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
                .unwrap();
            let mut buf = [0u8; 65536];
            while got.len() < 1 + 6 + 75_301 {
                let n = c.read(&mut buf).unwrap();
                assert!(n > 0, "closed early");
                got.extend_from_slice(&buf[..n]);
            }
            got
        });
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match write_out(&server, &mut out, Instant::now(), &mut pipes, 4) {
                Progress::Done => break,
                Progress::WouldBlock | Progress::Yield => {
                    assert!(Instant::now() < deadline, "no progress");
                    std::thread::yield_now();
                }
                _ => panic!("failed"),
            }
        }
        let got = reader.join().unwrap();
        assert_eq!(&got[..1], b"H");
        assert!(got[1..] == want[..], "the body's bytes differ");
        assert_eq!(out.body_sent, want.len() as u64);
        assert!(out.gather.is_none(), "the pipe went back");
        assert_eq!(pipes.count(), 1, "one pipe made, now idle");
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
}
