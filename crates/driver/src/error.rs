//! Why a stream failed: [`StreamError`], from the refusals at open to the failures a worker
//! reports.

use std::io;
use std::time::Duration;

use penstock_core::admission::Refusal;
use penstock_core::stream::plan::PlanError;
use penstock_core::stream::{ExtentError, PathError};

use crate::open::OpenError;

/// Why a stream failed. Every variant that can happen after bytes moved says how many did.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error(transparent)]
    Path(#[from] PathError),
    #[error(transparent)]
    Extent(#[from] ExtentError),
    /// The planner refused the stream (before anything was admitted or placed).
    #[error(transparent)]
    Plan(PlanError),
    #[error("the stream slot was reserved on another engine")]
    ForeignSlot,
    /// A disk class the engine was not configured with (`[disk.classes.NAME]`).
    #[error("unknown disk class {name:?}: the classes are {known}")]
    UnknownClass { name: String, known: String },
    #[error("Engine::open needs the endpoints' names (StreamSpec::new)")]
    NoEndpoints,
    /// A volume partition target is full: the source is longer than it.
    #[error(
        "the source is longer than {target} ({size_bytes} bytes): {bytes_written} bytes written, the rest refused"
    )]
    TargetFull {
        target: String,
        size_bytes: u64,
        bytes_written: u64,
    },
    /// A transfer does not map onto the volume's members (a bug or a changed volume).
    #[error("volume layout: {0}")]
    Layout(#[from] penstock_core::volume::LayoutError),
    #[error("too many streams open (streams_max = {0})")]
    TooManyStreams(usize),
    /// The worker the stream was placed on has `worker_commands_max` commands waiting: its
    /// loop is behind. Nothing was started and nothing is held; the open may be tried again.
    #[error(
        "the engine's worker is busy: its command queue is full (worker_commands_max = {commands_max})"
    )]
    WorkerQueueFull { commands_max: usize },
    #[error("the receiver disconnected after {bytes_sent} bytes were sent ({source})")]
    PeerClosed { bytes_sent: u64, source: io::Error },
    #[error("{op} failed after {bytes_sent} bytes were sent: {source}")]
    Io {
        op: &'static str,
        bytes_sent: u64,
        source: io::Error,
    },
    #[error("the source ended early: {got} of {expected} bytes were there ({bytes_sent} sent)")]
    SourceShrank {
        expected: u64,
        got: u64,
        bytes_sent: u64,
    },
    #[error("cancelled after {bytes_sent} bytes were sent")]
    Cancelled { bytes_sent: u64 },
    /// No byte moved for longer than the stream's `send_timeout` (not paused, not waiting for
    /// its own deadline): the peer stopped reading, or a source peer stopped sending.
    #[error(
        "no progress for {timeout:?} (send timeout): the peer stopped reading or sending after {bytes_sent} bytes were sent"
    )]
    Stalled { bytes_sent: u64, timeout: Duration },
    #[error("engine stopped")]
    EngineStopped,
    /// Admission control refused the stream; the refusal names what is short, by how much.
    #[error("admission: cpu: {0}")]
    CpuReservation(String),
    #[error("admission: {0}")]
    Refused(#[from] Refusal),
    /// The pool buffers an `rt` stream reserves do not fit (the message says what is short).
    #[error("buffer pool: {0}")]
    Buffers(#[from] penstock_core::buffers::BufferError),
}

impl From<PlanError> for StreamError {
    fn from(e: PlanError) -> StreamError {
        match e {
            PlanError::Path(p) => StreamError::Path(p),
            PlanError::Extent(x) => StreamError::Extent(x),
            other => StreamError::Plan(other),
        }
    }
}
