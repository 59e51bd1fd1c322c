//! The driver's clock: CLOCK_MONOTONIC as the core's [`Instant`], CPU time, and CPU placement.

use penstock_core::time::Instant;
pub use penstock_uring::sys::{CpuTimes, CpuWho, cpu_times};

/// Now, on CLOCK_MONOTONIC (the clock io_uring's absolute timeouts use).
pub fn now() -> Instant {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    Instant::from_nanos(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// The wall clock (CLOCK_REALTIME) in nanoseconds since the Unix epoch (0 before it): what
/// recordings' track headers and RTCP's NTP times say.
pub fn wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The CPUs this thread may run on, in ascending order (empty if the kernel will not say).
pub fn allowed_cpus() -> Vec<usize> {
    match rustix::thread::sched_getaffinity(None) {
        Ok(set) => (0..rustix::thread::CpuSet::MAX_CPU)
            .filter(|&c| set.is_set(c))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Pin the calling thread to one CPU. Threads it spawns afterwards (an engine's workers, the
/// kernel's io-wq workers for its rings) inherit the mask.
pub fn pin_to_cpu(cpu: usize) -> std::io::Result<()> {
    pin_to_cpus(&[cpu])
}

/// Pin the calling thread to a set of CPUs (see [`pin_to_cpu`]).
pub fn pin_to_cpus(cpus: &[usize]) -> std::io::Result<()> {
    let mut set = rustix::thread::CpuSet::new();
    for &cpu in cpus {
        if cpu >= rustix::thread::CpuSet::MAX_CPU {
            return Err(std::io::Error::other(format!("no CPU {cpu}")));
        }
        set.set(cpu);
    }
    rustix::thread::sched_setaffinity(None, &set).map_err(std::io::Error::from)
}

/// CPU time the calling thread has used, in ns (CLOCK_THREAD_CPUTIME_ID): what an upcall's
/// callback costs, whatever the kernel did with the thread meanwhile.
pub fn thread_cpu_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
