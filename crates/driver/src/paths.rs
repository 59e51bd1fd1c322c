//! The readiness-driven data paths: copy, sendfile, splice.
//!
//! Each step makes system calls until the budget is spent, the transfer is done, or a socket
//! would block — then it says which descriptor to wait for. Files are read at explicit offsets
//! (pread, sendfile/splice with an offset), so the source descriptor's position never matters.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use penstock_core::stream::{CachePolicy, IoKind};
use rustix::io::Errno;

use crate::error::StreamError;
use crate::pace::Gate;
use crate::step::{Side, Step, TaskIo};

const POLLIN: u32 = libc::POLLIN as u32;
const POLLOUT: u32 = libc::POLLOUT as u32;

/// read()+write() through a user buffer.
pub(crate) struct CopyState {
    buf: Vec<u8>,
    /// Bytes in `buf` not yet written: `buf[pos..have]`.
    have: usize,
    pos: usize,
    dontcache: bool,
}

impl CopyState {
    pub(crate) fn new(unit: usize) -> CopyState {
        CopyState {
            buf: vec![0; unit],
            have: 0,
            pos: 0,
            dontcache: true,
        }
    }
}

/// The splice path's pipe holds a unit, but at most this much. Measured on loopback (bench
/// paths, 240 MB hot, medians of 5, four runs each): a 1 MiB pipe cost 0.75-1.0x the sender
/// CPU per GB of `copy`, a 64 KiB one 0.56-0.61x at 1.3x copy's throughput — sendfile's own
/// internal pipe is 64 KiB too. Why the larger pipe costs more is not established here (no
/// hardware counters in this VM); the figures are in docs/data-paths.md.
pub(crate) const SPLICE_PIPE_MAX: usize = 64 * 1024;

/// splice(2) through a pipe: source → pipe → target.
#[derive(Default)]
pub(crate) struct SpliceState {
    pipe: Option<(OwnedFd, OwnedFd)>,
    in_pipe: usize,
}

/// Said once when a UDP target answers with ICMP port-unreachable: datagrams go on.
pub(crate) const NOT_LISTENING: &str =
    "the UDP receiver is not listening (ICMP port unreachable); datagrams are sent anyway";

pub(crate) fn peer_error(op: &'static str, e: Errno, bytes_sent: u64) -> StreamError {
    let source = io::Error::from(e);
    match e {
        Errno::PIPE | Errno::CONNRESET | Errno::NOTCONN | Errno::CONNREFUSED | Errno::SHUTDOWN => {
            StreamError::PeerClosed { bytes_sent, source }
        }
        _ => StreamError::Io {
            op,
            bytes_sent,
            source,
        },
    }
}

/// The next read's length: a unit, or what is left of a file.
fn next_len(io: &TaskIo) -> usize {
    match io.remaining() {
        Some(r) => r.min(io.unit as u64) as usize,
        None => io.unit,
    }
}

fn shrank(io: &TaskIo) -> StreamError {
    let end = io.end.unwrap_or(io.pos);
    StreamError::SourceShrank {
        expected: end - io.start,
        got: io.pos - io.start,
        bytes_sent: io.sent,
    }
}

/// Drops the page-cache pages of a range just sent (`--cache drop` on paths that cannot use
/// RWF_DONTCACHE). Advice only: failure changes nothing but the cache.
fn drop_cached(io: &TaskIo, from: u64, len: usize) {
    if io.cache == CachePolicy::Drop && io.source.kind == IoKind::File {
        let _ = rustix::fs::fadvise(
            &io.source.fd,
            from,
            std::num::NonZeroU64::new(len as u64),
            rustix::fs::Advice::DontNeed,
        );
    }
}

/// A volume target's bytes are durable and the partition's size covers them when its stream
/// reports success: fdatasync the members, commit the size, give back the blocks grown ahead.
pub(crate) fn finish_volume(io: &TaskIo) -> Result<(), StreamError> {
    match &io.target.volume {
        Some(v) => {
            v.note_written(io.sent);
            v.finish().map_err(|source| StreamError::Io {
                op: "fdatasync of the volume's members and commit of the partition's size",
                bytes_sent: io.sent,
                source,
            })
        }
        None => Ok(()),
    }
}

pub(crate) fn volume_write_error(io: &TaskIo, e: io::Error) -> StreamError {
    let size = io.target.volume.as_ref().map_or(0, |v| v.capacity_bytes());
    if e.raw_os_error() == Some(libc::ENOSPC) && io.sent >= size {
        StreamError::TargetFull {
            target: io.target.label.clone(),
            size_bytes: size,
            bytes_written: io.sent,
        }
    } else {
        StreamError::Io {
            op: "write to a volume member",
            bytes_sent: io.sent,
            source: e,
        }
    }
}

/// One step of the copy path: at most `budget` reads or writes.
pub(crate) fn copy_step(
    c: &mut CopyState,
    io: &mut TaskIo,
    budget: usize,
) -> Result<Step, StreamError> {
    for _ in 0..budget {
        if c.pos < c.have {
            let chunk = &c.buf[c.pos..c.have];
            if let Some(v) = &io.target.volume {
                // A volume partition (members reopened buffered): written at the stream's
                // position in it, piece by piece.
                let (n, e) = v.write_vectored_at(&[chunk], io.sent);
                io.moved.copy_written += n;
                c.pos += n as usize;
                io.add_sent(n as usize, u64::from(c.pos == c.have));
                if let Some(e) = e {
                    return Err(volume_write_error(io, e));
                }
                if c.pos == c.have
                    && let Some(p) = &mut io.pace
                {
                    p.completed(crate::clock::now(), c.have as u64, &io.counters);
                }
                continue;
            }
            let r = if io.target.socket {
                rustix::net::send(&io.target.fd, chunk, rustix::net::SendFlags::NOSIGNAL)
            } else {
                rustix::io::write(&io.target.fd, chunk)
            };
            match r {
                Ok(n) => {
                    io.moved.copy_written += n as u64;
                    c.pos += n;
                    let units = u64::from(c.pos == c.have);
                    io.add_sent(n, units);
                    if c.pos == c.have
                        && let Some(p) = &mut io.pace
                    {
                        p.completed(crate::clock::now(), c.have as u64, &io.counters);
                    }
                }
                Err(Errno::AGAIN) => return Ok(Step::WaitFd(Side::Target, POLLOUT)),
                Err(Errno::INTR) => {}
                Err(Errno::CONNREFUSED) if io.target.kind == IoKind::Datagram => {
                    // See NOT_LISTENING: the datagram was dropped; send it again.
                    io.note_once(NOT_LISTENING);
                }
                Err(e) => return Err(peer_error("write", e, io.sent)),
            }
            continue;
        }
        let want = next_len(io);
        if want == 0 {
            return Ok(Step::Finish(finish_volume(io)));
        }
        let left = io.remaining().unwrap_or(0);
        if let Some(p) = &mut io.pace {
            match p.gate(crate::clock::now()) {
                Gate::Send => {}
                Gate::Wait(at) => return Ok(Step::WaitUntil(at)),
                Gate::Skip(units) => {
                    // `late=skip` (planned for file sources only): move past the late units
                    // unsent, at most to the end.
                    let bytes = p.bytes_of_next(units, io.unit as u64).min(left);
                    let units = units.min(bytes.div_ceil(io.unit.max(1) as u64));
                    p.skipped(units, bytes, &io.counters);
                    io.pos += bytes;
                    continue;
                }
            }
        }
        let buf = &mut c.buf[..want];
        let r = match io.source.kind {
            IoKind::File => {
                let at = io.pos;
                if io.cache == CachePolicy::Drop && c.dontcache {
                    let flags = rustix::io::ReadWriteFlags::from_bits_retain(
                        penstock_uring::sys::RWF_DONTCACHE as u32,
                    );
                    match rustix::io::preadv2(
                        &io.source.fd,
                        &mut [io::IoSliceMut::new(buf)],
                        at,
                        flags,
                    ) {
                        Err(Errno::OPNOTSUPP | Errno::INVAL) => {
                            c.dontcache = false;
                            io.note_once("RWF_DONTCACHE unsupported here: dropping pages with fadvise instead");
                            continue;
                        }
                        other => other,
                    }
                } else {
                    let r = rustix::io::pread(&io.source.fd, &mut *buf, at);
                    if let Ok(n) = r {
                        drop_cached(io, at, n);
                    }
                    r
                }
            }
            IoKind::Datagram | IoKind::StreamSocket => {
                rustix::net::recv(&io.source.fd, &mut *buf, rustix::net::RecvFlags::empty())
                    .map(|(n, _)| n)
            }
            IoKind::Pipe => rustix::io::read(&io.source.fd, &mut *buf),
        };
        match r {
            Ok(0) if io.source.kind == IoKind::Datagram => {} // an empty datagram: nothing to send
            Ok(0) if io.end.is_some() => return Err(shrank(io)),
            Ok(0) => return Ok(Step::Finish(finish_volume(io))),
            Ok(n) => {
                io.moved.copy_read += n as u64;
                io.pos += n as u64;
                io.add_read(n);
                c.have = n;
                c.pos = 0;
                if let Some(p) = &mut io.pace {
                    p.issued();
                }
            }
            Err(Errno::AGAIN) => return Ok(Step::WaitFd(Side::Source, POLLIN)),
            Err(Errno::INTR) => {}
            Err(e) => {
                return Err(StreamError::Io {
                    op: "read",
                    bytes_sent: io.sent,
                    source: e.into(),
                });
            }
        }
    }
    Ok(Step::Yield)
}

/// One step of the sendfile path: at most `budget` calls.
/// What one sendfile(2) call did, read the same way by every sendfile loop: the engine's
/// sendfile path here and the HTTP server's connection loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendfileCall {
    /// Bytes moved (fewer than asked to a non-blocking socket: its buffer is full; calling
    /// again would get EAGAIN after the kernel looked up, and dropped, a pipe's worth of
    /// page-cache pages — wait for writability instead).
    Sent(usize),
    /// 0 bytes for a positive request: the file ends before the offset asked (it shrank).
    SourceEnded,
    /// EAGAIN: wait for writability.
    WouldBlock,
    /// EINTR: call again.
    Interrupted,
    Failed(Errno),
}

/// One sendfile(2) of `want` (> 0) bytes from `source` at `*offset` to `target`; `*offset`
/// advances by what moved.
pub fn sendfile_call(
    target: std::os::fd::BorrowedFd<'_>,
    source: std::os::fd::BorrowedFd<'_>,
    offset: &mut u64,
    want: usize,
) -> SendfileCall {
    debug_assert!(want > 0, "a sendfile of 0 bytes says nothing");
    match rustix::fs::sendfile(target, source, Some(offset), want) {
        Ok(0) => SendfileCall::SourceEnded,
        Ok(n) => SendfileCall::Sent(n),
        Err(Errno::AGAIN) => SendfileCall::WouldBlock,
        Err(Errno::INTR) => SendfileCall::Interrupted,
        Err(e) => SendfileCall::Failed(e),
    }
}

pub(crate) fn sendfile_step(io: &mut TaskIo, budget: usize) -> Result<Step, StreamError> {
    for _ in 0..budget {
        let want = next_len(io);
        if want == 0 {
            return Ok(Step::Finish(Ok(())));
        }
        let mut off = io.pos;
        match sendfile_call(io.target.fd.as_fd(), io.source.fd.as_fd(), &mut off, want) {
            SendfileCall::SourceEnded => return Err(shrank(io)),
            SendfileCall::Sent(n) => {
                io.moved.sendfile += n as u64;
                drop_cached(io, io.pos, n);
                io.pos = off;
                io.add_read(n);
                io.add_sent(n, 1);
                if n < want && io.target.socket {
                    // A short write to a (non-blocking) socket: its buffer is full. Calling
                    // again would get EAGAIN after the kernel has looked up, and dropped, a
                    // pipe's worth of page-cache pages (a quarter of the calls with 64 HTTP
                    // clients were such misses): wait for POLLOUT instead.
                    return Ok(Step::WaitFd(Side::Target, POLLOUT));
                }
            }
            SendfileCall::WouldBlock => return Ok(Step::WaitFd(Side::Target, POLLOUT)),
            SendfileCall::Interrupted => {}
            SendfileCall::Failed(e) => return Err(peer_error("sendfile", e, io.sent)),
        }
    }
    Ok(Step::Yield)
}

/// One step of the splice path: at most `budget` splices into or out of the pipe.
pub(crate) fn splice_step(
    s: &mut SpliceState,
    io: &mut TaskIo,
    budget: usize,
) -> Result<Step, StreamError> {
    use rustix::pipe::SpliceFlags;
    if s.pipe.is_none() {
        let (r, w) = rustix::pipe::pipe_with(
            rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK,
        )
        .map_err(|e| StreamError::Io {
            op: "pipe",
            bytes_sent: 0,
            source: e.into(),
        })?;
        // The pipe is sized for the unit, up to SPLICE_PIPE_MAX. The kernel also caps it at
        // /proc/sys/fs/pipe-max-size (1 MiB by default); a smaller pipe only means more calls
        // per unit, so that is not worth a note. Failing even that is.
        let size = io.unit.min(SPLICE_PIPE_MAX);
        if rustix::pipe::fcntl_setpipe_size(&w, size).is_err() {
            let max = std::fs::read_to_string("/proc/sys/fs/pipe-max-size")
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok())
                .unwrap_or(1 << 20);
            if rustix::pipe::fcntl_setpipe_size(&w, max.min(size)).is_err() {
                io.note_once("pipe could not be sized to the unit: splicing in smaller pieces");
            }
        }
        s.pipe = Some((r, w));
    }
    let (pr, pw) = s.pipe.as_ref().expect("pipe made above");
    let flags = SpliceFlags::MOVE | SpliceFlags::NONBLOCK;
    for _ in 0..budget {
        if s.in_pipe > 0 {
            // MSG_MORE while more of a known length follows (as sendfile does), so that a
            // pipe's tail waits for the next pipe's bytes; the last piece, and every piece of
            // a source of unknown length (a live socket or pipe), is pushed at once.
            let more = io.remaining().is_some_and(|r| r > 0);
            let out_flags = if more {
                flags | SpliceFlags::MORE
            } else {
                flags
            };
            match rustix::pipe::splice(pr.as_fd(), None, &io.target.fd, None, s.in_pipe, out_flags)
            {
                Ok(0) => return Err(peer_error("splice", Errno::PIPE, io.sent)),
                Ok(n) => {
                    io.moved.splice += n as u64;
                    s.in_pipe -= n;
                    io.add_sent(n, u64::from(s.in_pipe == 0));
                }
                Err(Errno::AGAIN) => return Ok(Step::WaitFd(Side::Target, POLLOUT)),
                Err(Errno::INTR) => {}
                Err(e) => return Err(peer_error("splice", e, io.sent)),
            }
            continue;
        }
        let want = next_len(io);
        if want == 0 {
            return Ok(Step::Finish(Ok(())));
        }
        let is_file = io.source.kind == IoKind::File;
        let mut off = io.pos;
        let off_arg = if is_file { Some(&mut off) } else { None };
        match rustix::pipe::splice(&io.source.fd, off_arg, pw.as_fd(), None, want, flags) {
            Ok(0) if io.end.is_some() => return Err(shrank(io)),
            Ok(0) => return Ok(Step::Finish(Ok(()))),
            Ok(n) => {
                drop_cached(io, io.pos, n);
                io.pos += n as u64;
                io.add_read(n);
                s.in_pipe = n;
            }
            Err(Errno::AGAIN) => return Ok(Step::WaitFd(Side::Source, POLLIN)),
            Err(Errno::INTR) => {}
            Err(e) => {
                return Err(StreamError::Io {
                    op: "splice",
                    bytes_sent: io.sent,
                    source: e.into(),
                });
            }
        }
    }
    Ok(Step::Yield)
}
