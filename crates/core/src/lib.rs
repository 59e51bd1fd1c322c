//! penstock's core: a deterministic, sans-IO model of streams and their schedules.
//!
//! What is absent here is the point: this crate performs no I/O, reads no clock, spawns no
//! thread and contains no `unsafe`. Time comes in as an argument ([`time::Instant`], built by
//! the caller), so every scheduler, pacer and parser is tested by feeding it events and
//! advancing `now` by hand. The Linux driver (`penstock-driver`) executes what this crate
//! decides; it makes no policy decision of its own.
#![forbid(unsafe_code)]
#![warn(missing_debug_implementations)]

pub mod admission;
pub mod auth;
pub mod buffers;
pub mod cluster;
pub mod control;
pub mod crc;
pub mod endpoint;
pub mod hls;
pub mod http;
pub mod lateness;
pub mod mp4;
pub mod origin;
pub mod rtp;
pub mod rtsp;
pub mod sched;
pub mod schedule;
pub mod stream;
pub mod time;
pub mod track;
pub mod ts;
pub mod units;
pub mod volume;
