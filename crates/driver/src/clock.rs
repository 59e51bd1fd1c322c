//! The driver's clock: CLOCK_MONOTONIC as the core's [`Instant`], and CPU time.

use penstock_core::time::Instant;
pub use penstock_uring::sys::{CpuTimes, CpuWho, cpu_times};

/// Now, on CLOCK_MONOTONIC (the clock io_uring's absolute timeouts use).
pub fn now() -> Instant {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    Instant::from_nanos(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}
