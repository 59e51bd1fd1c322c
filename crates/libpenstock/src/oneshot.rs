//! `penstock_stream`: Roadrunner's one call for any two descriptors, blocking.

use std::ffi::c_int;
use std::time::Duration;

use penstock_core::endpoint::Role;
use penstock_core::stream::plan::{Pacing, PlanError};
use penstock_core::stream::{DataPath, PathChoice};
use penstock_driver::engine::BUFFER_BYTES_MAX;
use penstock_driver::open::open_fd;
use penstock_driver::{DiskClass, Engine, EngineConfig, StreamError, StreamSpec};

use crate::error::{Error, PENSTOCK_EINVAL};
use crate::ffi::guard;

/// `penstock_stream` flag: move the bytes with read(2)/write(2) through a buffer (the
/// baseline data path) instead of the one the planner picks (sendfile, splice, io_uring).
pub const PENSTOCK_STREAM_COPY: u32 = 1;
/// `penstock_stream` flag: the `rt` class — the stream is admitted against the engine's disk
/// and network capacity first (`PENSTOCK_EREFUSED` when it does not fit) and its reads go
/// first. Needs a `period_ns`.
pub const PENSTOCK_STREAM_RT: u32 = 2;

const FLAGS_KNOWN: u32 = PENSTOCK_STREAM_COPY | PENSTOCK_STREAM_RT;

/// The one-shot engine's pool: a few buffers of at least 1 MiB, enough for any unit it takes.
const ONESHOT_POOL_BUFFERS: usize = 8;

/// Streams `src_fd` to `dst_fd` and returns when done: the bytes sent (≥ 0), or a negative
/// `PENSTOCK_E…` code with `penstock_last_error()` saying why (how many bytes had gone is in
/// the message).
///
/// Both are descriptors of the caller, as with `fd:N` (duplicated; the caller's stay open and
/// are the caller's to close): a regular file or block device is read from its start to its
/// end; a pipe or socket until end of file. `period_ns` 0 sends as fast as possible (a burst);
/// otherwise one `unit` every `period_ns` (a periodic stream, paced by the engine's EDF
/// dispatcher). `unit` is the bytes per read and send, one datagram on UDP (0: the planner's
/// default; 1316 for a periodic stream). `flags`: 0, or `PENSTOCK_STREAM_COPY`,
/// `PENSTOCK_STREAM_RT`.
///
/// Each call runs a private engine of one worker (set up and torn down by the call: a ring
/// and a pool of at least 8 MiB), so a program that streams often is better served by
/// `penstock_engine_new` and `penstock_cue` or `penstock_stream_open`.
#[unsafe(no_mangle)]
pub extern "C" fn penstock_stream(
    src_fd: c_int,
    dst_fd: c_int,
    flags: u32,
    period_ns: u64,
    unit: u64,
) -> i64 {
    guard(i64::from, || {
        if flags & !FLAGS_KNOWN != 0 {
            return Err(Error::new(
                PENSTOCK_EINVAL,
                format!(
                    "flags {flags:#x}: only PENSTOCK_STREAM_COPY ({PENSTOCK_STREAM_COPY}) and \
                     PENSTOCK_STREAM_RT ({PENSTOCK_STREAM_RT}) are defined"
                ),
            ));
        }
        // 0: the planner's default unit (for a period, seven MPEG-TS packets).
        let unit_bytes = unit;
        if unit_bytes > BUFFER_BYTES_MAX as u64 {
            return Err(Error::new(
                PENSTOCK_EINVAL,
                format!(
                    "unit {unit_bytes} is larger than the engine's largest buffer ({BUFFER_BYTES_MAX})"
                ),
            ));
        }
        let buffer_bytes = usize::try_from(unit_bytes.next_multiple_of(4096))
            .unwrap_or(BUFFER_BYTES_MAX)
            .max(1 << 20);
        let source = open_fd(src_fd, Role::Source).map_err(|e| Error::from_open(&e))?;
        let target = open_fd(dst_fd, Role::Target).map_err(|e| Error::from_open(&e))?;
        let engine = Engine::new(EngineConfig {
            workers: 1,
            pool_buffers: ONESHOT_POOL_BUFFERS,
            client_buffers_max: ONESHOT_POOL_BUFFERS,
            buffer_bytes,
            streams_max: 1,
            ..EngineConfig::default()
        })
        .map_err(|e| Error::new(PENSTOCK_EINVAL, e.to_string()))?;
        let mut spec = StreamSpec::opened();
        spec.unit_bytes = usize::try_from(unit_bytes).unwrap_or(usize::MAX);
        spec.pacing = if period_ns == 0 {
            Pacing::Burst
        } else {
            Pacing::Periodic {
                period: Duration::from_nanos(period_ns),
            }
        };
        if flags & PENSTOCK_STREAM_COPY != 0 {
            spec.path = PathChoice::Fixed(DataPath::Copy);
        }
        if flags & PENSTOCK_STREAM_RT != 0 {
            spec.class = Some(DiskClass::Rt);
        }
        let report = engine
            .open_opened(spec, source, target)
            .and_then(|h| h.wait())
            .map_err(|e| match e {
                // The planner's refusal, in this call's words.
                StreamError::Plan(PlanError::RtNeedsRate) => Error::new(
                    PENSTOCK_EINVAL,
                    "PENSTOCK_STREAM_RT needs a period_ns: a guarantee is for a known bandwidth",
                ),
                e => Error::from_stream(&e),
            })?;
        Ok(i64::try_from(report.bytes).unwrap_or(i64::MAX))
    })
}
