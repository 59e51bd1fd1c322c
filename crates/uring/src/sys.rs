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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioprio_encoding() {
        assert_eq!(ioprio_value(IoprioClass::RealTime, 0), 1 << 13);
        assert_eq!(ioprio_value(IoprioClass::BestEffort, 4), (2 << 13) | 4);
        assert_eq!(ioprio_value(IoprioClass::Idle, 99), (3 << 13) | 7);
    }
}
