//! `penstock_connect` / `penstock_conn_*`: hand descriptors to a *running* `penstock serve`
//! over its Unix control socket (`OPEN fd fd`, the descriptors attached by SCM_RIGHTS), and
//! drive the streams so opened with the control protocol's lines.

use std::ffi::{c_char, c_int};
use std::io::{BufRead, BufReader, IoSlice, Read, Write};
use std::os::fd::BorrowedFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

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
    reader: BufReader<UnixStream>,
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
    /// Reads one whole reply (the last line's code and text; `first`: a `DDD-` line's text,
    /// the STATE line of a STATE reply).
    fn reply(&mut self) -> Result<(u16, String, Option<String>), Error> {
        let mut first = None;
        for _ in 0..REPLY_LINES_MAX {
            let mut line = Vec::new();
            let n = (&mut self.reader)
                .take(REPLY_LINE_BYTES_MAX as u64)
                .read_until(b'\n', &mut line)
                .map_err(|e| io_error("reading the reply", &e))?;
            if n == 0 {
                return Err(Error::new(PENSTOCK_EIO, "the server closed the connection"));
            }
            if line.last() != Some(&b'\n') {
                return Err(Error::new(
                    PENSTOCK_EIO,
                    "a reply line too long, or cut short",
                ));
            }
            let line = String::from_utf8_lossy(&line).trim_end().to_string();
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
        let reader = stream
            .try_clone()
            .and_then(|r| {
                stream.set_read_timeout(timeout)?;
                stream.set_write_timeout(timeout)?;
                Ok(BufReader::new(r))
            })
            .map_err(|e| Error::new(PENSTOCK_EIO, format!("{path}: {e}")))?;
        let h = CONNS.insert(Arc::new(ConnObj {
            conn: Mutex::new(Conn { stream, reader }),
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

/// Hands `src_fd` and `dst_fd` to the server (`OPEN fd fd options`, both attached to the
/// line by SCM_RIGHTS) and returns the new stream's id (≥ 0), or a negative `PENSTOCK_E…`
/// code with the server's reply in `penstock_last_error()`. The server holds duplicates:
/// the caller may close its own at once. `options` as `penstock_cue`'s (NULL: none). The
/// stream then runs like any of the server's (admission, QoS class, pacing, metrics); drive
/// it with `penstock_conn_command` (`START <id>`, `STATE <id>`, ...). Refused (`PENSTOCK_EPERM`)
/// unless the server allows this process's uid or gid by SO_PEERCRED.
///
/// # Safety
/// `options` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn penstock_conn_cue(
    conn: *mut penstock_conn,
    src_fd: c_int,
    dst_fd: c_int,
    options: *const c_char,
) -> c_int {
    guard_code(|| {
        let obj = CONNS.get(conn as u64)?;
        // SAFETY: the caller's promise for the string, passed on.
        let options = unsafe { opt_str_arg(options, "options")? };
        if options.contains(['\n', '\r']) {
            return Err(Error::new(PENSTOCK_EINVAL, "options hold a line break"));
        }
        check_open(src_fd, "src_fd")?;
        check_open(dst_fd, "dst_fd")?;
        let line = format!("OPEN fd fd {options}\n");
        let mut c = obj.conn.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: both are open (checked above) and the caller keeps them open for the call.
        let fds = unsafe {
            [
                BorrowedFd::borrow_raw(src_fd),
                BorrowedFd::borrow_raw(dst_fd),
            ]
        };
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(Error::new(PENSTOCK_EIO, "no room for two descriptors"));
        }
        let sent = rustix::net::sendmsg(
            &c.stream,
            &[IoSlice::new(line.as_bytes())],
            &mut control,
            SendFlags::NOSIGNAL,
        )
        .map_err(|e| io_error("sending OPEN", &e.into()))?;
        // The descriptors went with the first byte; the rest of a cut line follows plainly.
        c.stream
            .write_all(&line.as_bytes()[sent..])
            .map_err(|e| io_error("sending OPEN", &e))?;
        let (code, text, _) = c.reply()?;
        if code != 201 {
            return Err(Error::from_reply_code(code, format!("{code} {text}")));
        }
        text.split_whitespace()
            .next()
            .and_then(|id| id.parse::<c_int>().ok())
            .ok_or_else(|| Error::new(PENSTOCK_EIO, format!("an OPEN reply without an id: {text}")))
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
        c.stream
            .write_all(format!("{line}\n").as_bytes())
            .map_err(|e| io_error("sending the line", &e))?;
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
