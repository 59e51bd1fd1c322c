//! The typed calls: a stream of the engine's table held by a handle instead of a control
//! descriptor; the same table, the same states and refusals.

use std::ffi::{c_char, c_int};
use std::sync::Arc;
use std::time::Duration;

use penstock_core::control::{Class, ReplyCode, StreamId};
use penstock_core::lateness::lateness_bucket_quantile_ns;
use penstock_server::streams::{Caller, StreamState, StreamStatus};

use crate::cue::{open_stream, parse_open};
use crate::engine::{ENGINES, EngineInner, penstock_engine};
use crate::error::{
    Error, PENSTOCK_ECANCELED, PENSTOCK_EINVAL, PENSTOCK_EIO, PENSTOCK_ENULL, PENSTOCK_ETIMEDOUT,
    PENSTOCK_OK,
};
use crate::ffi::{Registry, guard_code, opt_str_arg, str_arg};

/// A stream held by a handle (opaque). Made by `penstock_stream_open`, ended by
/// `penstock_stream_close`. (Not `penstock_stream`: that name is the one-shot call's.)
pub struct penstock_stream_t {
    _opaque: [u8; 0],
}

/// Where a stream is in its life (`penstock_stream_state_t.state`; `STATE`'s second word).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum penstock_state {
    /// Opened, not started.
    PENSTOCK_STATE_PENDING = 0,
    /// START is opening its endpoints.
    PENSTOCK_STATE_STARTING = 1,
    /// A listening endpoint waits for its peer.
    PENSTOCK_STATE_WAITING = 2,
    /// Moving bytes.
    PENSTOCK_STATE_RUNNING = 3,
    /// Paused: no new I/O until RESUME.
    PENSTOCK_STATE_PAUSED = 4,
    /// Every byte asked for was sent.
    PENSTOCK_STATE_DONE = 5,
    /// It failed, or was cancelled: `penstock_stream_wait` says why.
    PENSTOCK_STATE_FAILED = 6,
}

/// What `penstock_stream_state` reports.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct penstock_stream_state_t {
    pub state: penstock_state,
    /// Where the stream is in its source: the next byte it sends.
    pub offset: u64,
    /// Bytes that reached the target.
    pub sent: u64,
    /// Bytes still to send; -1: to the end of the source.
    pub remaining: i64,
    /// The pace a RATE or SCHEDULE sets, in bytes per second; 0: as fast as possible.
    pub rate_bytes_per_s: u64,
    /// Paced units sent (those the lateness figures count).
    pub units_paced: u64,
    /// Lateness of the paced units, in ns: the median, the 99th percentile and the most, each
    /// as the upper end of a power-of-two bucket (never below the true figure, less than
    /// twice it); 0 for a burst stream.
    pub lateness_p50_ns: u64,
    pub lateness_p99_ns: u64,
    pub lateness_max_ns: u64,
    /// Paced units later than their deadline by more than a period.
    pub misses: u64,
}

/// A handle's stream: its table's engine, the connection that owns it, its id.
pub(crate) struct StreamObj {
    inner: Arc<EngineInner>,
    caller: Caller,
    id: StreamId,
}

static STREAMS: Registry<StreamObj> = Registry::new("penstock_stream_t");

fn reply_result(r: penstock_core::control::Reply) -> Result<c_int, Error> {
    if r.code.is_success() {
        Ok(PENSTOCK_OK)
    } else {
        Err(Error::from_reply(&r))
    }
}

/// Opens a stream as `penstock_cue` does (same names, `fd:N`, options and admission), held by
/// a handle instead of a control descriptor; `*out` receives it. It does not expire: it is
/// there until `penstock_stream_close`, whatever its state.
///
/// # Safety
/// `src`, `dst` and `options` are each NULL or a NUL-terminated string; `out` is NULL or
/// points to a writable `penstock_stream_t *`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn penstock_stream_open(
    engine: *mut penstock_engine,
    src: *const c_char,
    dst: *const c_char,
    options: *const c_char,
    out: *mut *mut penstock_stream_t,
) -> c_int {
    guard_code(|| {
        if out.is_null() {
            return Err(Error::new(PENSTOCK_ENULL, "out is NULL"));
        }
        let inner = ENGINES.get(engine as u64)?;
        // SAFETY: the caller's promise for each string argument, passed on.
        let (src, dst, options) = unsafe {
            (
                str_arg(src, "src")?,
                str_arg(dst, "dst")?,
                opt_str_arg(options, "options")?,
            )
        };
        let (spec, mut given) = parse_open(src, dst, options)?;
        given.expires = false;
        let (caller, id) = open_stream(&inner, &spec, given)?;
        let h = STREAMS.insert(Arc::new(StreamObj { inner, caller, id }));
        // SAFETY: not NULL (checked above) and writable (the caller's promise).
        unsafe { out.write(h as *mut penstock_stream_t) };
        Ok(PENSTOCK_OK)
    })
}

/// Runs `f` on a live handle's stream.
fn with_stream(
    s: *mut penstock_stream_t,
    f: impl FnOnce(&StreamObj) -> Result<c_int, Error>,
) -> c_int {
    guard_code(|| f(&*STREAMS.get(s as u64)?))
}

/// `START`: opens the endpoints not given as `fd:N` and starts the transfer. A listening
/// endpoint is bound now and its peer awaited in the background (`PENSTOCK_STATE_WAITING`).
#[unsafe(no_mangle)]
pub extern "C" fn penstock_stream_start(stream: *mut penstock_stream_t) -> c_int {
    with_stream(stream, |o| {
        reply_result(o.inner.streams.start(o.caller, o.id, None))
    })
}

/// `PAUSE`: no new I/O from now on (what is in flight completes); a paced stream's later
/// deadlines move by the length of the pause.
#[unsafe(no_mangle)]
pub extern "C" fn penstock_stream_pause(stream: *mut penstock_stream_t) -> c_int {
    with_stream(stream, |o| {
        reply_result(o.inner.streams.pause(o.caller, o.id))
    })
}

/// `RESUME` a paused stream.
#[unsafe(no_mangle)]
pub extern "C" fn penstock_stream_resume(stream: *mut penstock_stream_t) -> c_int {
    with_stream(stream, |o| {
        reply_result(o.inner.streams.resume(o.caller, o.id))
    })
}

/// `CLASS`: moves the stream to disk class `class` (`"rt"`, `"bulk"` or a class the engine
/// was configured with) without stopping it: the engine re-admits it there (into `rt`, the
/// rate it was opened with) and its next reads are queued in the new class.
/// `PENSTOCK_EREFUSED` when admission refuses (`penstock_last_error` names the resource, e.g.
/// disk), `PENSTOCK_EINVAL` for a class the engine does not have; nothing changes then.
///
/// # Safety
/// `class` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn penstock_stream_class(
    stream: *mut penstock_stream_t,
    class: *const c_char,
) -> c_int {
    with_stream(stream, |o| {
        // SAFETY: the caller's promise for the string, passed on.
        let name = unsafe { str_arg(class, "class")? };
        let class = match penstock_core::stream::plan::DiskClass::parse(name) {
            Ok(penstock_core::stream::plan::DiskClass::Rt) => Class::Rt,
            Ok(penstock_core::stream::plan::DiskClass::Bulk) => Class::Bulk,
            Ok(penstock_core::stream::plan::DiskClass::Named(n)) => {
                Class::Named(n.as_str().to_string())
            }
            Err(e) => return Err(Error::new(PENSTOCK_EINVAL, e.to_string())),
        };
        reply_result(o.inner.streams.set_class(o.caller, o.id, class))
    })
}

fn state_code(s: StreamState) -> penstock_state {
    match s {
        StreamState::Pending => penstock_state::PENSTOCK_STATE_PENDING,
        StreamState::Starting => penstock_state::PENSTOCK_STATE_STARTING,
        StreamState::Waiting => penstock_state::PENSTOCK_STATE_WAITING,
        StreamState::Running => penstock_state::PENSTOCK_STATE_RUNNING,
        StreamState::Paused => penstock_state::PENSTOCK_STATE_PAUSED,
        StreamState::Done => penstock_state::PENSTOCK_STATE_DONE,
        StreamState::Failed => penstock_state::PENSTOCK_STATE_FAILED,
    }
}

fn state_of(st: &StreamStatus) -> penstock_stream_state_t {
    let b = &st.lateness.buckets;
    let q = |per_million| lateness_bucket_quantile_ns(b, per_million).unwrap_or(0);
    penstock_stream_state_t {
        state: state_code(st.state),
        offset: st.offset_bytes,
        sent: st.sent_bytes,
        remaining: st
            .remaining_bytes
            .map_or(-1, |r| i64::try_from(r).unwrap_or(i64::MAX)),
        rate_bytes_per_s: st.pace_bytes_per_s.unwrap_or(0),
        units_paced: b.iter().sum(),
        lateness_p50_ns: q(500_000),
        lateness_p99_ns: q(990_000),
        lateness_max_ns: q(1_000_000),
        misses: st.lateness.misses,
    }
}

/// `STATE`, as a struct: `*out` receives the stream's state and figures.
///
/// # Safety
/// `out` is NULL or points to a writable `penstock_stream_state_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn penstock_stream_state(
    stream: *mut penstock_stream_t,
    out: *mut penstock_stream_state_t,
) -> c_int {
    with_stream(stream, |o| {
        if out.is_null() {
            return Err(Error::new(PENSTOCK_ENULL, "out is NULL"));
        }
        let st = o
            .inner
            .streams
            .status(o.caller, o.id)
            .map_err(|r| Error::from_reply(&r))?;
        // SAFETY: not NULL (checked above) and writable (the caller's promise).
        unsafe { out.write(state_of(&st)) };
        Ok(PENSTOCK_OK)
    })
}

/// Waits for the stream to end, at most `timeout_ms` (negative: as long as it takes).
/// `PENSTOCK_OK` when it is done (every byte asked for sent); `PENSTOCK_ETIMEDOUT` when the
/// wait ended first; `PENSTOCK_ECANCELED` after `penstock_stream_cancel`; when it failed,
/// `PENSTOCK_EIO` (or `PENSTOCK_ETIMEDOUT` for a stream that stalled) with the engine's reason
/// in `penstock_last_error()`. A stream that was never started waits until it is (from
/// another thread) or the timeout.
#[unsafe(no_mangle)]
pub extern "C" fn penstock_stream_wait(stream: *mut penstock_stream_t, timeout_ms: i64) -> c_int {
    with_stream(stream, |o| {
        let timeout = u64::try_from(timeout_ms).ok().map(Duration::from_millis);
        let st = o
            .inner
            .streams
            .wait(o.caller, o.id, timeout)
            .map_err(|r| Error::from_reply(&r))?;
        match st {
            None => Err(Error::new(
                PENSTOCK_ETIMEDOUT,
                format!("stream {} still running after {timeout_ms} ms", o.id),
            )),
            Some(st) if st.state == StreamState::Done => Ok(PENSTOCK_OK),
            Some(st) => {
                let why = st.error.unwrap_or_default();
                let code = if why == "cancelled" {
                    PENSTOCK_ECANCELED
                } else if why.contains("(send timeout)") {
                    PENSTOCK_ETIMEDOUT
                } else {
                    PENSTOCK_EIO
                };
                Err(Error::new(code, format!("stream {} failed: {why}", o.id)))
            }
        }
    })
}

/// Stops the stream (in-flight I/O completes first) and keeps the handle: its state becomes
/// `PENSTOCK_STATE_FAILED`, `penstock_stream_wait` returns `PENSTOCK_ECANCELED`.
/// `PENSTOCK_ESTATE` when it had ended already.
#[unsafe(no_mangle)]
pub extern "C" fn penstock_stream_cancel(stream: *mut penstock_stream_t) -> c_int {
    with_stream(stream, |o| {
        reply_result(o.inner.streams.cancel(o.caller, o.id))
    })
}

/// Closes the stream (cancelling it if it still runs; in-flight I/O completes first) and
/// frees the handle, which is dead from then on (a later call with it gives
/// `PENSTOCK_EHANDLE`). NULL gives `PENSTOCK_ENULL`.
#[unsafe(no_mangle)]
pub extern "C" fn penstock_stream_close(stream: *mut penstock_stream_t) -> c_int {
    guard_code(|| {
        let o = STREAMS.remove(stream as u64)?;
        let r = o.inner.streams.close(o.caller, o.id, false);
        // After penstock_engine_free the table forgot every stream: the handle is freed all
        // the same.
        if r.code == ReplyCode::NO_SUCH_STREAM {
            return Ok(PENSTOCK_OK);
        }
        reply_result(r)
    })
}
