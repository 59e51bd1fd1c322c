//! `penstock_connect` / `penstock_conn_*`: hand descriptors to a *running* `penstock serve`
//! over its Unix control socket (`CUE fd fd`, the descriptors attached by SCM_RIGHTS; the
//! reply brings the stream's control descriptor back the same way), and send it any other
//! control-protocol line.

use std::ffi::{c_char, c_int};
use std::io::{IoSlice, IoSliceMut, Write};
use std::os::fd::{BorrowedFd, IntoRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use penstock_core::endpoint::{Endpoint, Role};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use crate::error::{
    Error, PENSTOCK_EBADF, PENSTOCK_EINVAL, PENSTOCK_EIO, PENSTOCK_ENULL, PENSTOCK_ETIMEDOUT,
    PENSTOCK_OK,
};
use crate::ffi::{Registry, guard, guard_code, opt_str_arg, str_arg};

/// A connection to a running server's Unix control socket (opaque). Made by
/// `penstock_connect`, ended by `penstock_conn_free`.
pub struct penstock_conn {
    _opaque: [u8; 0],
}

/// The default of `penstock_conn_set_timeout`, in ms.
pub const PENSTOCK_CONN_TIMEOUT_MS: u64 = 10_000;
/// A reply line longer than this is an error (the server's own lines are far shorter).
const REPLY_LINE_BYTES_MAX: usize = 64 * 1024;
/// A multi-line reply with more lines than this is an error.
const REPLY_LINES_MAX: usize = 100_000;

struct Conn {
    stream: UnixStream,
    /// Bytes read and not yet taken as reply lines.
    buf: Vec<u8>,
    /// Descriptors that arrived with the bytes (SCM_RIGHTS: `CUE`'s reply carries one);
    /// whatever the current reply does not take is closed with the next.
    fds: Vec<OwnedFd>,
}

struct ConnObj {
    conn: Mutex<Conn>,
}

static CONNS: Registry<ConnObj> = Registry::new("penstock_conn");

fn io_error(what: &str, e: &std::io::Error) -> Error {
    if matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    ) {
        Error::new(
            PENSTOCK_ETIMEDOUT,
            format!("{what}: the server did not answer in time (penstock_conn_set_timeout)"),
        )
    } else {
        Error::new(PENSTOCK_EIO, format!("{what}: {e}"))
    }
}

impl Conn {
    /// Reads more bytes with recvmsg(2) (the socket's timeout bounds it), keeping the
    /// descriptors that come with them (close-on-exec).
    fn read_more(&mut self) -> Result<(), Error> {
        let mut chunk = [0u8; 4096];
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let got = loop {
            match rustix::net::recvmsg(
                &self.stream,
                &mut [IoSliceMut::new(&mut chunk)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            ) {
                Err(rustix::io::Errno::INTR) => continue,
                r => break r.map_err(|e| io_error("reading the reply", &e.into()))?,
            }
        };
        for m in control.drain() {
            if let RecvAncillaryMessage::ScmRights(passed) = m {
                self.fds.extend(passed);
            }
        }
        if got.bytes == 0 {
            return Err(Error::new(PENSTOCK_EIO, "the server closed the connection"));
        }
        self.buf.extend_from_slice(&chunk[..got.bytes]);
        Ok(())
    }

    /// One line of the reply, without its line ending.
    fn line(&mut self) -> Result<String, Error> {
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return Ok(String::from_utf8_lossy(&line).trim_end().to_string());
            }
            if self.buf.len() >= REPLY_LINE_BYTES_MAX {
                return Err(Error::new(PENSTOCK_EIO, "a reply line too long"));
            }
            self.read_more()?;
        }
    }

    /// Reads one whole reply (the last line's code and text; `first`: a `DDD-` line's text,
    /// the STATE line of a STATE reply).
    fn reply(&mut self) -> Result<(u16, String, Option<String>), Error> {
        let mut first = None;
        for _ in 0..REPLY_LINES_MAX {
            let line = self.line()?;
            let code: Option<u16> = line.get(..3).and_then(|c| c.parse().ok());
            let Some(code) = code else {
                return Err(Error::new(PENSTOCK_EIO, format!("not a reply: {line:?}")));
            };
            match line.as_bytes().get(3) {
                Some(b'-') => {
                    first.get_or_insert_with(|| line[4..].to_string());
                }
                _ => return Ok((code, line.get(4..).unwrap_or("").to_string(), first)),
            }
        }
        Err(Error::new(PENSTOCK_EIO, "a reply of too many lines"))
    }

    /// Sends `line` (with its line ending) with `fds` attached to its first byte.
    fn send(&mut self, line: &str, fds: &[BorrowedFd<'_>]) -> Result<(), Error> {
        // Descriptors left from an earlier reply are nobody's.
        self.fds.clear();
        let mut sent = 0;
        if !fds.is_empty() {
            let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            if !control.push(SendAncillaryMessage::ScmRights(fds)) {
                return Err(Error::new(PENSTOCK_EIO, "no room for the descriptors"));
            }
            sent = rustix::net::sendmsg(
                &self.stream,
                &[IoSlice::new(line.as_bytes())],
                &mut control,
                SendFlags::NOSIGNAL,
            )
            .map_err(|e| io_error("sending the line", &e.into()))?;
        }
        // The descriptors went with the first byte; the rest of a cut line follows plainly.
        self.stream
            .write_all(&line.as_bytes()[sent..])
            .map_err(|e| io_error("sending the line", &e))
    }
}

/// Connects to a running `penstock serve`'s Unix control socket (`--control-unix PATH`,
/// `control.unix`) and writes the connection to `*out`. Waits on the server (each reply, each
/// send) are bounded by a timeout, 10 s unless `penstock_conn_set_timeout` says otherwise.
/// What the connection may do is the server's decision (`docs/security.md`): a peer whose
/// uid or gid the socket allows may open streams and pass descriptors.
///
/// # Safety
/// `socket_path` is NULL or a NUL-terminated string; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn penstock_connect(
    socket_path: *const c_char,
    out: *mut *mut penstock_conn,
) -> c_int {
    guard_code(|| {
        if out.is_null() {
            return Err(Error::new(PENSTOCK_ENULL, "out is NULL"));
        }
        // SAFETY: the caller's promise for the string, passed on.
        let path = unsafe { str_arg(socket_path, "socket_path")? };
        let stream = UnixStream::connect(path)
            .map_err(|e| Error::new(PENSTOCK_EIO, format!("connecting to {path}: {e}")))?;
        let timeout = Some(Duration::from_millis(PENSTOCK_CONN_TIMEOUT_MS));
        stream
            .set_read_timeout(timeout)
            .and_then(|()| stream.set_write_timeout(timeout))
            .map_err(|e| Error::new(PENSTOCK_EIO, format!("{path}: {e}")))?;
        let h = CONNS.insert(Arc::new(ConnObj {
            conn: Mutex::new(Conn {
                stream,
                buf: Vec::new(),
                fds: Vec::new(),
            }),
        }));
        // SAFETY: not NULL (checked above), writable (the caller's promise).
        unsafe { out.write(h as *mut penstock_conn) };
        Ok(PENSTOCK_OK)
    })
}

/// Sets how long the connection's calls wait for the server (each send, each reply), in ms,
/// at least 1. `PENSTOCK_OK`, or `PENSTOCK_EINVAL` for 0.
#[unsafe(no_mangle)]
pub extern "C" fn penstock_conn_set_timeout(conn: *mut penstock_conn, timeout_ms: u64) -> c_int {
    guard_code(|| {
        let obj = CONNS.get(conn as u64)?;
        if timeout_ms == 0 || timeout_ms > u64::MAX / 2_000_000 {
            return Err(Error::new(
                PENSTOCK_EINVAL,
                format!("timeout_ms is {timeout_ms}; it must be 1 or more"),
            ));
        }
        let c = obj.conn.lock().unwrap_or_else(|p| p.into_inner());
        let t = Some(Duration::from_millis(timeout_ms));
        c.stream
            .set_read_timeout(t)
            .and_then(|_| c.stream.set_write_timeout(t))
            .map_err(|e| Error::new(PENSTOCK_EIO, e.to_string()))?;
        Ok(PENSTOCK_OK)
    })
}

/// Closes the connection. Streams it opened are closed by the server (cancelled if running)
/// unless they were opened `DETACHED`. NULL is ignored.
#[unsafe(no_mangle)]
pub extern "C" fn penstock_conn_free(conn: *mut penstock_conn) {
    if conn.is_null() {
        return;
    }
    guard(
        |_| (),
        || {
            CONNS.remove(conn as u64)?;
            Ok(())
        },
    );
}

fn check_open(fd: c_int, what: &str) -> Result<(), Error> {
    // SAFETY: fcntl(F_GETFD) on any number reads only the descriptor table; EBADF if none.
    if fd < 0 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(Error::new(
            PENSTOCK_EBADF,
            format!("{what} {fd} is not an open descriptor"),
        ));
    }
    Ok(())
}

/// One endpoint of `penstock_conn_cue`: `fd:N` goes as the word `fd` with descriptor N
/// attached; any other name is sent as it is, for the server to open under its own policy.
fn cue_word(name: &str, role: Role) -> Result<(String, Option<c_int>), Error> {
    if name.is_empty() || name.contains(char::is_whitespace) {
        return Err(Error::new(
            PENSTOCK_EINVAL,
            format!("{role} {name:?}: an endpoint name without white space"),
        ));
    }
    match Endpoint::parse(name, role) {
        Ok(Endpoint::Fd { fd }) => {
            check_open(fd, &format!("{role} descriptor"))?;
            Ok(("fd".into(), Some(fd)))
        }
        Ok(_) => Ok((name.to_string(), None)),
        Err(e) => Err(Error::new(PENSTOCK_EINVAL, format!("{role}: {e}"))),
    }
}

/// `penstock_cue()`'s shape over a connection to a running server: opens a stream from
/// `src` to `dst` *in the server* and returns its **control descriptor** (≥ 0), or a
/// negative `PENSTOCK_E…` code with the server's reply in `penstock_last_error()`.
///
/// `src` and `dst` are `fd:N` — a descriptor of this process (a file, an accepted socket, a
/// pipe…), handed to the server by SCM_RIGHTS with the line (the server holds its own
/// duplicate: the caller may close N at once) — or an endpoint name the server opens under
/// its own access policy. `options` as `penstock_cue`'s (NULL: none). The line sent is
/// `CUE src dst options` (docs/control-protocol.md); the server answers with the stream's
/// own descriptor attached, which this call returns: write the control protocol's lines to
/// it (`START`, `STATE`, `SEEK n`, `CLOSE`…, the id left out) and read one reply per line,
/// exactly as on `penstock_cue()`'s. The stream runs like any of the server's (admission,
/// QoS class, pacing, metrics) and belongs to that descriptor, not to `conn`: closing it
/// closes the stream unless the options said `DETACHED` (then it runs to its end), and
/// `penstock_conn_free` leaves it alone. Refused (`PENSTOCK_EPERM`) unless the server allows
/// this process's uid or gid by SO_PEERCRED.
///
/// # Safety
/// `src`, `dst` and `options` are each NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn penstock_conn_cue(
    conn: *mut penstock_conn,
    src: *const c_char,
    dst: *const c_char,
    options: *const c_char,
) -> c_int {
    guard_code(|| {
        let obj = CONNS.get(conn as u64)?;
        // SAFETY: the caller's promise for each string argument, passed on.
        let (src, dst, options) = unsafe {
            (
                str_arg(src, "src")?,
                str_arg(dst, "dst")?,
                opt_str_arg(options, "options")?,
            )
        };
        if options.contains(['\n', '\r']) {
            return Err(Error::new(PENSTOCK_EINVAL, "options hold a line break"));
        }
        let (src_word, src_fd) = cue_word(src, Role::Source)?;
        let (dst_word, dst_fd) = cue_word(dst, Role::Target)?;
        let line = format!("CUE {src_word} {dst_word} {options}\n");
        // SAFETY: each is open (checked by cue_word) and the caller keeps it open for the
        // call.
        let fds: Vec<BorrowedFd<'_>> = [src_fd, dst_fd]
            .into_iter()
            .flatten()
            .map(|fd| unsafe { BorrowedFd::borrow_raw(fd) })
            .collect();
        let mut c = obj.conn.lock().unwrap_or_else(|p| p.into_inner());
        c.send(&line, &fds)?;
        let (code, text, _) = c.reply()?;
        let got = std::mem::take(&mut c.fds);
        if code != 201 {
            return Err(Error::from_reply_code(code, format!("{code} {text}")));
        }
        let mut got = got.into_iter();
        match (got.next(), got.next()) {
            (Some(fd), None) => Ok(fd.into_raw_fd()),
            _ => Err(Error::new(
                PENSTOCK_EIO,
                format!(
                    "the server's CUE reply came without exactly one descriptor ({text}); \
                     is it older than this library?"
                ),
            )),
        }
    })
}

/// Sends one control-protocol line (`START 7`, `STATE 7`, `CLOSE 7`, ...; no line break) and
/// reads its reply: returns the reply code (200 to 599) and copies the reply's text — for a
/// multi-line reply its first line (the STATE line) — NUL-terminated, cut to fit, into
/// `reply` (`reply_len` bytes; NULL or 0: not copied). A negative `PENSTOCK_E…` code when the
/// line could not be sent or no reply came in time.
///
/// # Safety
/// `line` is NULL or a NUL-terminated string; `reply` is NULL or `reply_len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn penstock_conn_command(
    conn: *mut penstock_conn,
    line: *const c_char,
    reply: *mut c_char,
    reply_len: usize,
) -> c_int {
    guard_code(|| {
        let obj = CONNS.get(conn as u64)?;
        // SAFETY: the caller's promise for the string, passed on.
        let line = unsafe { str_arg(line, "line")? };
        if line.contains(['\n', '\r']) {
            return Err(Error::new(PENSTOCK_EINVAL, "line holds a line break"));
        }
        let mut c = obj.conn.lock().unwrap_or_else(|p| p.into_inner());
        c.send(&format!("{line}\n"), &[])?;
        let (code, text, first) = c.reply()?;
        if !reply.is_null() && reply_len > 0 {
            let t = first.unwrap_or(text);
            let n = t.len().min(reply_len - 1);
            // SAFETY: `reply` has `reply_len` writable bytes (the caller's promise); we write
            // n + 1 ≤ reply_len of them.
            unsafe {
                std::ptr::copy_nonoverlapping(t.as_ptr(), reply.cast::<u8>(), n);
                reply.add(n).write(0);
            }
        }
        Ok(c_int::from(code))
    })
}
