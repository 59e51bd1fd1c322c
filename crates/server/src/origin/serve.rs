//! One client request answered from the origin, on a thread of its own (the HTTP loop never
//! blocks): the object is looked up (an error before the head is a 404/502/504 with a body
//! as usual), the core's `respond_file` makes the head and the body pieces as for a local
//! file (ranges, conditionals, HEAD), then each piece is sent block by block as soon as that
//! block is cached, with `sendfile` from the block's file. A failure after the head cuts the
//! connection: the client sees a body shorter than its `Content-Length`, as HTTP/1.1 says
//! for an error after the head. On a `tls-user` connection (docs/tls.md) the connection's
//! rustls session comes with the job: every byte goes through it, and a cached block is
//! read with `pread` into a 16 KiB buffer (one TLS record) instead of `sendfile`.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use penstock_core::http::{
    BodyPiece, FileMeta, Request, ResponseContext, Status, respond_error, respond_file,
};
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::net::SendFlags;

use super::{BlockData, Origin};

/// What the HTTP loop hands the thread.
pub(crate) struct OriginJob {
    pub(crate) origin: Arc<Origin>,
    pub(crate) req: Request,
    /// A `dup` of the client's (non-blocking) socket; the loop does not touch it meanwhile.
    pub(crate) sock: OwnedFd,
    pub(crate) content_type: String,
    pub(crate) server_name: String,
    pub(crate) keep_alive_allowed: bool,
    pub(crate) keep_alive_timeout_s: Option<u64>,
    pub(crate) ranges_max: usize,
    pub(crate) boundary: String,
    /// A send that makes no progress for this long ends the response.
    pub(crate) send_timeout: Duration,
    /// Set by the loop when it closes the connection.
    pub(crate) cancel: Arc<AtomicBool>,
    pub(crate) done: Arc<Mutex<Option<OriginEnd>>>,
    /// Written when `done` is set (the loop's eventfd).
    pub(crate) waker: Arc<OwnedFd>,
    /// The location's CORS and caching lines, added to the head made here.
    pub(crate) delivery: crate::delivery::Delivery,
    /// A `tls-user` connection's rustls session (`None`: the socket takes plaintext), given
    /// back to the loop through the same place.
    pub(crate) tls: TlsSession,
}

/// A connection's rustls session lent to an origin thread.
pub(crate) type TlsSession = Arc<Mutex<Option<Box<rustls::ServerConnection>>>>;

/// The non-blocking socket as `io::Write`, for rustls's records.
struct SockWrite<'a>(&'a OwnedFd);

impl std::io::Write for SockWrite<'_> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        Ok(rustix::net::send(self.0, b, SendFlags::NOSIGNAL)?)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Bytes read from a cached block at once for a `tls-user` connection (one TLS record).
const TLS_CHUNK_BYTES: usize = 16 * 1024;

/// How the response ended.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OriginEnd {
    pub(crate) status: Status,
    pub(crate) body_bytes: u64,
    pub(crate) keep_alive: bool,
    /// False when cut (the connection must close).
    pub(crate) complete: bool,
    /// When the head went out (time to first byte), if it did.
    pub(crate) head_sent: Option<Instant>,
}

/// The thread's body: serve, then tell the loop.
pub(crate) fn run(job: OriginJob) {
    let end = serve(&job);
    *job.done.lock().unwrap_or_else(|p| p.into_inner()) = Some(end);
    job.origin.requests.fetch_sub(1, Ordering::Relaxed);
    // A full counter (EAGAIN) still wakes the loop.
    let _ = rustix::io::write(&*job.waker, &1u64.to_ne_bytes());
}

fn serve(job: &OriginJob) -> OriginEnd {
    let ctx = ResponseContext {
        date: SystemTime::now(),
        server: &job.server_name,
        keep_alive_allowed: job.keep_alive_allowed,
        keep_alive_timeout_s: job.keep_alive_timeout_s,
        ranges_max: job.ranges_max,
        boundary: &job.boundary,
    };
    let origin = &job.origin;
    let mut end = OriginEnd {
        status: Status::OK,
        body_bytes: 0,
        keep_alive: false,
        complete: false,
        head_sent: None,
    };
    // `?penstock-fill` (read from the origin itself, never from a peer) is honoured only with
    // a listed node's name and fill key; from anyone else it is a plain request.
    let direct = job.req.query.as_deref() == Some(super::fetch::PEER_FILL_QUERY)
        && job
            .req
            .penstock_fill
            .as_deref()
            .is_some_and(|c| origin.is_member_fill(c));
    let object = match origin.object_from(&job.req.path, direct) {
        Ok(o) => o,
        Err(e) => {
            if !matches!(e, super::OriginError::NotFound) {
                // A client asks for paths: a line per request would be theirs to flood.
                crate::peer_warn!("http_origin", path = %job.req.path, error = %e, "origin");
            }
            let mut r = respond_error(e.status(), Some(&job.req), &ctx);
            job.delivery.apply(&mut r.head, r.status);
            end.status = r.status;
            end.keep_alive = r.keep_alive;
            if send_all(job, &r.head).is_err() {
                return end;
            }
            end.head_sent = Some(Instant::now());
            for p in &r.body {
                if let BodyPiece::Bytes(b) = p {
                    if send_all(job, b).is_err() {
                        return end;
                    }
                    end.body_bytes += b.len() as u64;
                }
            }
            end.complete = true;
            return end;
        }
    };
    let meta = FileMeta {
        len_bytes: object.size_bytes,
        mtime: object.mtime,
        generation: None,
    };
    let mut r = respond_file(&job.req, &meta, &job.content_type, &ctx);
    job.delivery.apply(&mut r.head, r.status);
    end.status = r.status;
    end.keep_alive = r.keep_alive;
    if send_all(job, &r.head).is_err() {
        return end;
    }
    end.head_sent = Some(Instant::now());
    let geometry = object.geometry(origin.block_bytes);
    for piece in &r.body {
        match piece {
            BodyPiece::Bytes(b) => {
                if send_all(job, b).is_err() {
                    return end;
                }
                end.body_bytes += b.len() as u64;
            }
            BodyPiece::File {
                offset_bytes,
                len_bytes,
            } => {
                for p in geometry.pieces(*offset_bytes, *len_bytes) {
                    if job.cancel.load(Ordering::Relaxed) {
                        return end;
                    }
                    let file = match origin.block(&object, p.block) {
                        Ok(f) => f,
                        Err(e) => {
                            crate::peer_warn!("http_origin_cut", path = %job.req.path, block = p.block, error = %e,
                                "origin: response cut after its head");
                            return end;
                        }
                    };
                    origin.read_ahead(&object, p.block);
                    let sent = match file {
                        BlockData::File(f) => sendfile_all(job, &f, p.offset_bytes, p.len_bytes),
                        BlockData::Memory(v) => {
                            let a = p.offset_bytes as usize;
                            let b = (p.offset_bytes + p.len_bytes) as usize;
                            send_all(job, &v[a..b]).map_err(|()| 0)
                        }
                    };
                    match sent {
                        Ok(()) => end.body_bytes += p.len_bytes,
                        Err(sent) => {
                            end.body_bytes += sent;
                            return end;
                        }
                    }
                }
            }
        }
    }
    end.complete = true;
    end
}

/// Waits until the socket takes bytes, at most the send timeout.
fn writable(job: &OriginJob) -> Result<(), ()> {
    let t = job.send_timeout;
    let ts = Timespec {
        tv_sec: t.as_secs() as i64,
        tv_nsec: i64::from(t.subsec_nanos()),
    };
    let mut fds = [PollFd::new(&job.sock, PollFlags::OUT)];
    match rustix::event::poll(&mut fds, Some(&ts)) {
        Ok(0) => Err(()),
        Ok(_) if fds[0].revents().intersects(PollFlags::ERR | PollFlags::HUP) => Err(()),
        Ok(_) | Err(Errno::INTR) => Ok(()),
        Err(_) => Err(()),
    }
}

fn send_all(job: &OriginJob, mut b: &[u8]) -> Result<(), ()> {
    if let Some(tls) = job.tls.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
        return send_tls(job, tls, b);
    }
    while !b.is_empty() {
        if job.cancel.load(Ordering::Relaxed) {
            return Err(());
        }
        match rustix::net::send(&job.sock, b, SendFlags::NOSIGNAL) {
            Ok(n) => b = &b[n..],
            Err(Errno::AGAIN) => writable(job)?,
            Err(Errno::INTR) => {}
            Err(_) => return Err(()),
        }
    }
    Ok(())
}

/// Encrypts `b` with the connection's session and sends the records, waiting (at most the
/// send timeout each time) while the socket is full.
fn send_tls(job: &OriginJob, tls: &mut rustls::ServerConnection, mut b: &[u8]) -> Result<(), ()> {
    loop {
        while tls.wants_write() {
            if job.cancel.load(Ordering::Relaxed) {
                return Err(());
            }
            match tls.write_tls(&mut SockWrite(&job.sock)) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => writable(job)?,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return Err(()),
            }
        }
        if b.is_empty() {
            return Ok(());
        }
        let n = std::io::Write::write(&mut tls.writer(), b).map_err(|_| ())?;
        if n == 0 && !tls.wants_write() {
            return Err(());
        }
        b = &b[n..];
    }
}

/// Sends `len` bytes of `file` from `offset`; on failure, the bytes that went.
fn sendfile_all(job: &OriginJob, file: &std::fs::File, offset: u64, len: u64) -> Result<(), u64> {
    if job.tls.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
        return pread_tls(job, file, offset, len);
    }
    let mut off = offset;
    let end = offset + len;
    while off < end {
        if job.cancel.load(Ordering::Relaxed) {
            return Err(off - offset);
        }
        let want = usize::try_from(end - off)
            .unwrap_or(usize::MAX)
            .min(1 << 30);
        match rustix::fs::sendfile(job.sock.as_fd(), file.as_fd(), Some(&mut off), want) {
            // The block file is complete (checked before it was kept): 0 is a bug or a
            // truncation behind our back.
            Ok(0) => return Err(off - offset),
            Ok(_) => {}
            Err(Errno::AGAIN) => writable(job).map_err(|()| off - offset)?,
            Err(Errno::INTR) => {}
            Err(_) => return Err(off - offset),
        }
    }
    Ok(())
}

/// [`sendfile_all`] on a `tls-user` connection: the block read in one-record chunks and
/// written through rustls.
fn pread_tls(job: &OriginJob, file: &std::fs::File, offset: u64, len: u64) -> Result<(), u64> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; TLS_CHUNK_BYTES];
    let mut done = 0u64;
    while done < len {
        if job.cancel.load(Ordering::Relaxed) {
            return Err(done);
        }
        let want = usize::try_from(len - done)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let n = match file.read_at(&mut buf[..want], offset + done) {
            Ok(0) => return Err(done),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return Err(done),
        };
        send_all(job, &buf[..n]).map_err(|()| done)?;
        done += n as u64;
    }
    Ok(())
}
