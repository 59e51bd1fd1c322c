//! penstock's benchmarks and their helpers: `penstock bench …`, the `penstock sink` receiver
//! and the hidden `penstock hog` background load, as a library the `penstock` binary calls.
//!
//! Each module's `Args` struct is the subcommand's clap arguments and its `run` (for `qos`:
//! `isolation`, `rtu`) the subcommand; the binary only names them.
//!
//! The benches start their receivers, loads and servers as child processes of the *running
//! executable* (`std::env::current_exe()`: `penstock sink`, `penstock hog`, `penstock serve`),
//! so they work only when called from the `penstock` binary, never from a test harness of
//! this crate.
//!
//! The benches measure the engine from outside, through `penstock-driver`; the raw layer's
//! few pieces they need (an O_DIRECT-aligned buffer, SO_RCVLOWAT, the pool's size limit, recvmmsg
//! batches with kernel receive times) come
//! through `penstock_driver::sys`, so this crate depends on neither `penstock-uring` nor any
//! `unsafe`.
#![forbid(unsafe_code)]

pub mod admission;
pub mod cues;
pub mod hls;
pub mod hog;
pub mod http;
pub mod out;
pub mod paths;
pub mod periodic;
pub mod qos;
pub mod record;
pub mod rtsp;
pub mod schedstat;
pub mod sink;
mod stats;
pub mod stripe;
pub mod udp_sink;
