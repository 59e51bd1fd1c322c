//! Small system calls and constants that rustix does not cover, kept beside the ring so that
//! all of penstock's `unsafe` lives in this crate.

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

/// `RWF_DONTCACHE` (Linux 6.14): buffered I/O that drops its pages from the cache once done.
pub const RWF_DONTCACHE: i32 = 0x0000_0080;

/// Raises RLIMIT_MEMLOCK to at least `bytes` (soft and, if needed and permitted, hard).
/// Returns whether the limit is now high enough.
pub fn raise_memlock(bytes: u64) -> bool {
    let cur = getrlimit(Resource::Memlock);
    if cur.current.is_none() || cur.current.is_some_and(|c| c >= bytes) {
        return true;
    }
    let hard_ok = cur.maximum.is_none_or(|m| m >= bytes);
    let new = Rlimit {
        current: Some(bytes),
        maximum: if hard_ok { cur.maximum } else { Some(bytes) },
    };
    setrlimit(Resource::Memlock, new).is_ok()
}

/// I/O priority classes of ioprio_set(2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoprioClass {
    /// IOPRIO_CLASS_RT: served before best-effort by bfq and mq-deadline.
    RealTime = 1,
    /// IOPRIO_CLASS_BE: the default.
    BestEffort = 2,
    /// IOPRIO_CLASS_IDLE: served only when the disk is otherwise idle.
    Idle = 3,
}

/// The 16-bit ioprio value (class << 13 | level) carried by an io_uring SQE or ioprio_set.
pub fn ioprio_value(class: IoprioClass, level: u8) -> u16 {
    ((class as u16) << 13) | u16::from(level.min(7))
}

/// Sets the calling thread's I/O priority (ioprio_set(IOPRIO_WHO_PROCESS, 0, value)).
pub fn ioprio_set_current_thread(value: u16) -> std::io::Result<()> {
    const IOPRIO_WHO_PROCESS: libc::c_long = 1;
    // SAFETY: ioprio_set takes three integers and touches no memory of ours.
    let r = unsafe {
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            0 as libc::c_long,
            libc::c_long::from(value),
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Puts the calling thread in SCHED_FIFO at `priority` (1..=99).
pub fn set_fifo_scheduling(priority: i32) -> std::io::Result<()> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: `param` is a valid sched_param for the call's duration; pid 0 is this thread.
    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// CPU time consumed, in nanoseconds of user and system time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTimes {
    pub user_ns: u64,
    pub sys_ns: u64,
}

/// Whose CPU time [`cpu_times`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuWho {
    /// The whole process: every thread, including io_uring's io-wq workers.
    Process,
    /// Waited-for children (a bench's receiver or baseline processes).
    Children,
    /// The calling thread only.
    Thread,
}

/// getrusage(2) as user and system nanoseconds.
pub fn cpu_times(who: CpuWho) -> CpuTimes {
    let who = match who {
        CpuWho::Process => libc::RUSAGE_SELF,
        CpuWho::Children => libc::RUSAGE_CHILDREN,
        CpuWho::Thread => libc::RUSAGE_THREAD,
    };
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage for the call's duration.
    let r = unsafe { libc::getrusage(who, &mut ru) };
    assert_eq!(r, 0, "getrusage with a valid `who` cannot fail");
    let ns = |tv: libc::timeval| tv.tv_sec as u64 * 1_000_000_000 + tv.tv_usec as u64 * 1_000;
    CpuTimes {
        user_ns: ns(ru.ru_utime),
        sys_ns: ns(ru.ru_stime),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioprio_encoding() {
        assert_eq!(ioprio_value(IoprioClass::RealTime, 0), 1 << 13);
        assert_eq!(ioprio_value(IoprioClass::BestEffort, 4), (2 << 13) | 4);
        assert_eq!(ioprio_value(IoprioClass::Idle, 99), (3 << 13) | 7);
    }

    #[test]
    fn cpu_times_grow_with_work() {
        let before = cpu_times(CpuWho::Thread);
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let after = cpu_times(CpuWho::Thread);
        assert!(after.user_ns + after.sys_ns > before.user_ns + before.sys_ns);
    }
}
