//! `penstock_cue`: Cues' `cue(src, dst)`, returning a control descriptor.

use std::ffi::{c_char, c_int};
use std::os::fd::IntoRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use penstock_core::control::{Limits, OpenSpec, StreamId, parse_open_options};
use penstock_core::endpoint::{Endpoint, Role};
use penstock_driver::open::{Opened, open_fd};
use penstock_server::streams::{Caller, Given};

use crate::engine::{ENGINES, EngineInner, penstock_engine};
use crate::error::{Error, PENSTOCK_EINVAL, PENSTOCK_ESYS};
use crate::ffi::{guard_code, opt_str_arg, str_arg};

/// Parses `src`, `dst` and `options` into an `OPEN` and takes the `fd:N` endpoints now (their
/// numbers are the caller's only for the duration of the call).
pub(crate) fn parse_open(src: &str, dst: &str, options: &str) -> Result<(OpenSpec, Given), Error> {
    let spec = parse_open_options(src, dst, options, &Limits::default())
        .map_err(|e| Error::new(PENSTOCK_EINVAL, format!("options {options:?}: {e}")))?;
    let take = |name: &str, role: Role| -> Result<Option<Opened>, Error> {
        match Endpoint::parse(name, role) {
            Ok(Endpoint::Fd { fd }) => open_fd(fd, role)
                .map(Some)
                .map_err(|e| Error::from_open(&e)),
            Ok(_) => Ok(None),
            Err(e) => Err(Error::new(PENSTOCK_EINVAL, format!("{role}: {e}"))),
        }
    };
    let given = Given {
        source: take(src, Role::Source)?,
        target: take(dst, Role::Target)?,
        expires: true,
        // Once its descriptor is closed, nobody can reach a stream: a DETACHED one goes as
        // soon as it ends (a busy server's finished bodies must not hold `streams_max`).
        reachable_when_orphaned: false,
    };
    Ok((spec, given))
}

/// Opens a stream in `inner`'s table for a new caller (admission decides now).
pub(crate) fn open_stream(
    inner: &EngineInner,
    spec: &OpenSpec,
    given: Given,
) -> Result<(Caller, StreamId), Error> {
    let caller = inner.caller()?;
    let (id, _details) = inner.streams.open_given(caller, spec, given).map_err(|r| {
        let mut e = Error::from_reply(&r);
        // The table's limit is named after the control server's key; here it is the
        // engine's.
        if e.message.contains("control.streams_per_identity_max") {
            e.message = format!(
                "refused: {} streams are open (penstock_config.streams_max); close some",
                inner.streams_max
            );
        }
        e
    })?;
    Ok((caller, id))
}

/// Cues' `cue(src, dst)`: opens a stream from `src` to `dst` and returns its **control
/// descriptor** (≥ 0), or a negative `PENSTOCK_E…` code.
///
/// `src` and `dst` are endpoint names (a path, `tcp://HOST:PORT`, `udp://HOST:PORT`,
/// `unix:PATH`, `tcp-listen://…`, …) or `fd:N`, a descriptor of the caller — a regular file,
/// a block device, a pipe, a TCP, UDP or Unix socket — which is duplicated now: the caller
/// may close its own at once. A socket passed so is made non-blocking (the flag is shared
/// with the caller's descriptor). `options` (NULL or "": none) are `OPEN`'s, space-separated:
/// `class=rt|bulk rate=R period=D unit=SIZE schedule=K,T buffers=N offset=SIZE length=SIZE
/// path=auto|copy|sendfile|splice|uring DETACHED TRUNCATE` (`docs/control-protocol.md`).
/// Admission control decides now (`PENSTOCK_EREFUSED`).
///
/// The descriptor is one end of a socketpair (close-on-exec) served by a thread of the
/// library: write the control protocol's lines to it and read one reply per line — `START`,
/// `PAUSE`, `RESUME`, `SEEK n`, `LENGTH n`, `UNIT n`, `RATE r`, `SCHEDULE k,t`, `STATE`,
/// `CLOSE [NOW]`, `HELP`, `QUIT`; the stream's id may be left out, and no other stream can
/// be reached through it. It can be polled, and passed to another process. Closing it closes
/// the stream (cancelling it if still running) unless the options said `DETACHED`: a
/// detached stream runs to its end and is then forgotten (one never started, or paused, is
/// closed with its descriptor: nobody could start or resume it any more).
///
/// # Safety
/// `src`, `dst` and `options` are each NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn penstock_cue(
    engine: *mut penstock_engine,
    src: *const c_char,
    dst: *const c_char,
    options: *const c_char,
) -> c_int {
    guard_code(|| {
        let inner = ENGINES.get(engine as u64)?;
        // SAFETY: the caller's promise for each string argument, passed on.
        let (src, dst, options) = unsafe {
            (
                str_arg(src, "src")?,
                str_arg(dst, "dst")?,
                opt_str_arg(options, "options")?,
            )
        };
        let (spec, given) = parse_open(src, dst, options)?;
        let (caller, id) = open_stream(&inner, &spec, given)?;
        match cue_descriptor(&inner, caller, id) {
            Ok(fd) => Ok(fd),
            Err(e) => {
                inner.streams.connection_closed(caller.conn);
                Err(e)
            }
        }
    })
}

fn cue_descriptor(inner: &Arc<EngineInner>, caller: Caller, id: StreamId) -> Result<c_int, Error> {
    let sys = |e: std::io::Error| Error::new(PENSTOCK_ESYS, format!("control descriptor: {e}"));
    let (mine, theirs) = UnixStream::pair().map_err(sys)?;
    inner.serve_cue(mine, caller, id).map_err(sys)?;
    Ok(theirs.into_raw_fd())
}
