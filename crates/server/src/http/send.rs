//! Sending a response from the loop: [`Out`] (what a response keeps after its request) and
//! [`write_out`], the sending state machine: the head, then the body pieces, memory with
//! `send` and file extents with `sendfile`, under the location's rate limit ([`RateLimit`],
//! nginx's `limit_rate`) and a budget of send calls per turn. A body reserved for the engine
//! stops after the head ([`Progress::HandOff`]).

use std::collections::VecDeque;
use std::fs::File;
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::sync::Arc;
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

/// Sends as much of `out` as the socket, the rate and the budget allow.
pub(super) fn write_out(sock: &TcpStream, out: &mut Out, now: Instant) -> Progress {
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
    if out.corked {
        // Uncorking pushes what is queued.
        let _ = rustix::net::sockopt::set_tcp_cork(sock, false);
        out.corked = false;
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
