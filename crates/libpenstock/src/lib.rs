//! libpenstock: penstock's engine for any program with a C FFI.
//!
//! Three ways in, all over one in-process engine (`penstock_engine_new`):
//! - **`penstock_cue(engine, src, dst, options)`** — Cues' call: a *control descriptor* (one
//!   end of a socketpair) that speaks the control protocol's stream commands (`START`,
//!   `SEEK 4096`, `PAUSE`, `STATE`, ...; the stream's id may be left out). A thread of the
//!   library serves the other end with the control server's own code
//!   (`penstock_server::control::serve_stream_descriptor`, over `penstock_server::streams::Streams`),
//!   so its replies, states and refusals are the control protocol's.
//! - **Typed calls** on the same table: `penstock_stream_open`, `_start`, `_pause`,
//!   `_resume`, `_state`, `_wait`, `_cancel`, `_close`.
//! - **`penstock_stream(src_fd, dst_fd, flags, period_ns, unit)`** — Roadrunner's one-shot,
//!   blocking call on a private engine.
//!
//! Beside them: **`penstock_connect` + `penstock_conn_cue`** hand descriptors to a *running*
//! `penstock serve` over its Unix control socket (`OPEN fd fd`, SCM_RIGHTS), and
//! **`penstock_rtu_create`** runs a periodic upcall on an engine's worker (MARS's RTUs).
//!
//! Endpoints are the one namespace's names (`docs/control-protocol.md`), plus `fd:N`: a
//! descriptor the caller owns, duplicated when the call is made (the caller may close its own
//! right after).
//!
//! # The boundary
//! Every `extern "C"` function runs its body through [`ffi::guard`]: a panic is caught (and
//! reported as `PENSTOCK_EPANIC`), never unwound into C. Every pointer is checked before use:
//! NULL gives `PENSTOCK_ENULL`; a handle is an opaque number looked up in a registry, never
//! dereferenced, so a closed or made-up handle gives `PENSTOCK_EHANDLE` instead of undefined
//! behaviour; strings must be NUL-terminated UTF-8 (`PENSTOCK_EINVAL` otherwise). A failed call
//! leaves a message for `penstock_last_error()` on the calling thread. The only `unsafe` is
//! reading and writing through the caller's pointers (each block says why it is sound).
//!
//! The header, `include/penstock.h`, is generated from this crate by cbindgen
//! (`tests/header.rs` fails when it drifts; `PENSTOCK_BLESS=1` rewrites it).

#![allow(non_camel_case_types)]

mod backend;
mod conn;
mod cue;
mod engine;
mod error;
mod ffi;
mod oneshot;
mod rtu;
mod stream;

pub use conn::{
    PENSTOCK_CONN_TIMEOUT_MS, penstock_conn, penstock_conn_command, penstock_conn_cue,
    penstock_conn_free, penstock_conn_set_timeout, penstock_connect,
};
pub use cue::penstock_cue;
pub use engine::{
    penstock_config, penstock_config_default, penstock_engine, penstock_engine_drain,
    penstock_engine_free, penstock_engine_new,
};
pub use error::{penstock_error, penstock_last_error, penstock_last_error_code, penstock_strerror};
pub use oneshot::{PENSTOCK_STREAM_COPY, PENSTOCK_STREAM_RT, penstock_stream};
pub use rtu::{
    penstock_rtu, penstock_rtu_create, penstock_rtu_fn, penstock_rtu_free, penstock_rtu_run,
    penstock_rtu_stats, penstock_rtu_stats_t, penstock_rtu_suspend,
};
pub use stream::{
    penstock_state, penstock_stream_cancel, penstock_stream_close, penstock_stream_open,
    penstock_stream_pause, penstock_stream_resume, penstock_stream_start, penstock_stream_state,
    penstock_stream_state_t, penstock_stream_t, penstock_stream_wait,
};

/// The library's version, `MAJOR.MINOR.PATCH` (a static string; never free it).
#[unsafe(no_mangle)]
pub extern "C" fn penstock_version() -> *const std::ffi::c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}
