//! Error codes, the thread-local last error, and how the engine's and the control
//! protocol's errors map onto them.

use std::cell::RefCell;
use std::ffi::{CString, c_char, c_int};

use penstock_core::control::{Reply, ReplyCode};
use penstock_driver::StreamError;
use penstock_driver::open::OpenError;

/// What a call returns when it fails (negative), or `PENSTOCK_OK`. Calls return these as an
/// `int` (a descriptor or a byte count when positive); compare with the names.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum penstock_error {
    /// Success.
    PENSTOCK_OK = 0,
    /// A NULL pointer where the call needs one.
    PENSTOCK_ENULL = -1,
    /// An invalid argument: an endpoint name, an options string, a configuration value, flags,
    /// a string that is not UTF-8; or a stream the engine's planner refuses.
    PENSTOCK_EINVAL = -2,
    /// Not a live handle: closed or freed already, or never returned by the library.
    PENSTOCK_EHANDLE = -3,
    /// An `fd:N` (or a `penstock_stream` descriptor) that is not open.
    PENSTOCK_EBADF = -4,
    /// An `fd:N` descriptor of the wrong kind or mode for its part: a directory, a listening
    /// socket, a read-only target, a UDP target that is not connected.
    PENSTOCK_EFD = -5,
    /// Not permitted: a control descriptor asked about another stream.
    PENSTOCK_EPERM = -6,
    /// No such stream: it was closed (or expired).
    PENSTOCK_ENOSTREAM = -7,
    /// The stream is not in a state that allows this (starting a started stream, pausing a
    /// pending one, anything but close on a finished one).
    PENSTOCK_ESTATE = -8,
    /// Refused by admission control or a limit (streams, buffers): try later or ask for less.
    PENSTOCK_EREFUSED = -9,
    /// An endpoint could not be opened, or the stream failed while running.
    PENSTOCK_EIO = -10,
    /// Not supported here (`path=uring` without io_uring).
    PENSTOCK_ENOTSUP = -11,
    /// The wait ended before the stream did; or the stream moved nothing for its send timeout.
    PENSTOCK_ETIMEDOUT = -12,
    /// The stream was cancelled.
    PENSTOCK_ECANCELED = -13,
    /// A system resource ran out (a socketpair, a thread).
    PENSTOCK_ESYS = -14,
    /// A bug in the library: a panic was caught at the boundary (the message says where).
    PENSTOCK_EPANIC = -15,
}

// The codes as the `int`s the entry points return.
pub(crate) const PENSTOCK_OK: c_int = penstock_error::PENSTOCK_OK as c_int;
pub(crate) const PENSTOCK_ENULL: c_int = penstock_error::PENSTOCK_ENULL as c_int;
pub(crate) const PENSTOCK_EINVAL: c_int = penstock_error::PENSTOCK_EINVAL as c_int;
pub(crate) const PENSTOCK_EHANDLE: c_int = penstock_error::PENSTOCK_EHANDLE as c_int;
pub(crate) const PENSTOCK_EBADF: c_int = penstock_error::PENSTOCK_EBADF as c_int;
pub(crate) const PENSTOCK_EFD: c_int = penstock_error::PENSTOCK_EFD as c_int;
pub(crate) const PENSTOCK_EPERM: c_int = penstock_error::PENSTOCK_EPERM as c_int;
pub(crate) const PENSTOCK_ENOSTREAM: c_int = penstock_error::PENSTOCK_ENOSTREAM as c_int;
pub(crate) const PENSTOCK_ESTATE: c_int = penstock_error::PENSTOCK_ESTATE as c_int;
pub(crate) const PENSTOCK_EREFUSED: c_int = penstock_error::PENSTOCK_EREFUSED as c_int;
pub(crate) const PENSTOCK_EIO: c_int = penstock_error::PENSTOCK_EIO as c_int;
pub(crate) const PENSTOCK_ENOTSUP: c_int = penstock_error::PENSTOCK_ENOTSUP as c_int;
pub(crate) const PENSTOCK_ETIMEDOUT: c_int = penstock_error::PENSTOCK_ETIMEDOUT as c_int;
pub(crate) const PENSTOCK_ECANCELED: c_int = penstock_error::PENSTOCK_ECANCELED as c_int;
pub(crate) const PENSTOCK_ESYS: c_int = penstock_error::PENSTOCK_ESYS as c_int;
pub(crate) const PENSTOCK_EPANIC: c_int = penstock_error::PENSTOCK_EPANIC as c_int;

/// An error on its way out: a code and a message.
#[derive(Debug, Clone)]
pub(crate) struct Error {
    pub code: c_int,
    pub message: String,
}

impl Error {
    pub fn new(code: c_int, message: impl Into<String>) -> Error {
        Error {
            code,
            message: message.into(),
        }
    }

    /// A control-protocol refusal, by its reply code.
    pub fn from_reply(r: &Reply) -> Error {
        Error::from_reply_code(r.code.code(), r.text.clone())
    }

    /// A control-protocol refusal by its three digits (a reply read from a server).
    pub fn from_reply_code(reply_code: u16, text: String) -> Error {
        let is = |c: ReplyCode| reply_code == c.code();
        let code = if is(ReplyCode::BAD_SYNTAX) || is(ReplyCode::LINE_TOO_LONG) {
            PENSTOCK_EINVAL
        } else if is(ReplyCode::AUTH_REQUIRED) || is(ReplyCode::FORBIDDEN) {
            PENSTOCK_EPERM
        } else if is(ReplyCode::NO_SUCH_STREAM) {
            PENSTOCK_ENOSTREAM
        } else if is(ReplyCode::WRONG_STATE) {
            PENSTOCK_ESTATE
        } else if is(ReplyCode::REFUSED) {
            PENSTOCK_EREFUSED
        } else if is(ReplyCode::NOT_IMPLEMENTED) {
            PENSTOCK_ENOTSUP
        } else {
            PENSTOCK_EIO
        };
        Error::new(code, text)
    }

    /// An `fd:N` that could not be taken.
    pub fn from_open(e: &OpenError) -> Error {
        let code = match e {
            _ if e.raw_os_error() == Some(libc::EBADF) => PENSTOCK_EBADF,
            OpenError::Descriptor { .. } | OpenError::Directory { .. } => PENSTOCK_EFD,
            _ => PENSTOCK_EIO,
        };
        Error::new(code, e.to_string())
    }

    /// How an engine stream ended badly.
    pub fn from_stream(e: &StreamError) -> Error {
        let code = match e {
            StreamError::Open(o) => return Error::from_open(o),
            StreamError::Path(_) | StreamError::Extent(_) | StreamError::Plan(_) => PENSTOCK_EINVAL,
            StreamError::Refused(_)
            | StreamError::TooManyStreams(_)
            | StreamError::Buffers(_)
            | StreamError::CpuReservation(_) => PENSTOCK_EREFUSED,
            StreamError::Cancelled { .. } => PENSTOCK_ECANCELED,
            StreamError::Stalled { .. } => PENSTOCK_ETIMEDOUT,
            _ => PENSTOCK_EIO,
        };
        Error::new(code, e.to_string())
    }
}

thread_local! {
    /// The last error of a call made on this thread, kept until the next failing call.
    static LAST: RefCell<(c_int, CString)> = RefCell::new((PENSTOCK_OK, CString::default()));
}

/// Records `e` as this thread's last error and returns its code.
pub(crate) fn set_last(e: Error) -> c_int {
    // A message holds no NUL (ours never do); one that did is cut there.
    let text = e.message.split('\0').next().unwrap_or("").to_string();
    let c = CString::new(text).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = (e.code, c));
    e.code
}

/// The message of the last call on this thread that failed: what went wrong and, where it
/// helps, what would be accepted. An empty string when no call has failed yet. The pointer
/// stays valid until the next failing call on this thread; copy the text to keep it.
#[unsafe(no_mangle)]
pub extern "C" fn penstock_last_error() -> *const c_char {
    LAST.with(|l| l.borrow().1.as_ptr())
}

/// The code (`PENSTOCK_E…`) of the last call on this thread that failed; `PENSTOCK_OK` when
/// none has. For calls that return a pointer (`penstock_engine_new`), this is how the code
/// of a NULL return is found.
#[unsafe(no_mangle)]
pub extern "C" fn penstock_last_error_code() -> c_int {
    LAST.with(|l| l.borrow().0)
}

/// A short fixed description of an error code (a static string; never free it).
#[unsafe(no_mangle)]
pub extern "C" fn penstock_strerror(code: c_int) -> *const c_char {
    let s: &'static str = match code {
        PENSTOCK_OK => "success\0",
        PENSTOCK_ENULL => "a NULL pointer where one is needed\0",
        PENSTOCK_EINVAL => "invalid argument\0",
        PENSTOCK_EHANDLE => "not a live handle (closed, freed, or never made)\0",
        PENSTOCK_EBADF => "descriptor not open\0",
        PENSTOCK_EFD => "descriptor of the wrong kind or mode\0",
        PENSTOCK_EPERM => "not permitted\0",
        PENSTOCK_ENOSTREAM => "no such stream\0",
        PENSTOCK_ESTATE => "wrong state for this call\0",
        PENSTOCK_EREFUSED => "refused by admission control or a limit\0",
        PENSTOCK_EIO => "endpoint or stream failed\0",
        PENSTOCK_ENOTSUP => "not supported here\0",
        PENSTOCK_ETIMEDOUT => "timed out\0",
        PENSTOCK_ECANCELED => "cancelled\0",
        PENSTOCK_ESYS => "out of a system resource\0",
        PENSTOCK_EPANIC => "internal error (a bug in libpenstock)\0",
        _ => "unknown error code\0",
    };
    s.as_ptr().cast()
}
