//! penstock's Linux driver: the engine (a library: open a stream, run it, watch it, cancel
//! it), its per-thread event loops, endpoint opening, the data paths and the clock.
//!
//! The driver executes; the core decides. Path selection, extents, schedules and parsers live
//! in `penstock-core`; all `unsafe` lives in `penstock-uring`. This crate has none.
#![forbid(unsafe_code)]

mod buffers;
pub mod calibration;
pub mod clock;
mod config;
pub mod cpu_probe;
pub mod device;
mod direct;
pub mod disk;
pub mod engine;
mod error;
mod facts;
pub mod files;
pub mod gate;
pub mod media;
pub mod open;
mod pace;
mod paths;
pub mod rebuild;
pub mod record;
mod report;
pub mod rlimit;
pub mod rtcp;
pub mod rtu;
pub mod sched;
pub mod send_cost;
mod step;
pub mod sums;
pub mod sys;
mod uring_path;
pub mod volume;
mod worker;

pub use engine::{
    Admitted, BufferUsage, CounterSnapshot, DiskClass, DiskQueueDepth, DiskSettings, DiskTuning,
    Engine, EngineConfig, EngineError, EngineInfo, LATENESS_BUCKETS, LatenessCounts, MovedBytes,
    OpenFileStats, ReadDepthConfig, ReadDepthCounts, ReadDepthSource, StreamError, StreamHandle,
    StreamReport, StreamSpec, TimerMode, ZeroCopy,
};
pub use paths::{SendfileCall, sendfile_call};
pub use rtu::{
    RtuActivation, RtuCallback, RtuError, RtuHandle, RtuKeep, RtuReport, RtuSpec, RtuStats,
};
