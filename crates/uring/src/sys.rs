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

/// Duplicates descriptor number `fd` of this process (fcntl `F_DUPFD_CLOEXEC`), for an
/// `fd:N` endpoint: the caller names a descriptor it owns and keeps it, penstock works on its
/// own copy (which shares the open file description: its offset and status flags). `EBADF`
/// when no descriptor `fd` is open (a negative number included).
pub fn dup_fd_number(fd: i32) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    if fd < 0 {
        return Err(std::io::Error::from_raw_os_error(libc::EBADF));
    }
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) takes integers and touches no memory of ours: on a number
    // that is not open it fails with EBADF, and it never changes descriptor `fd` itself.
    let r = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `r` is a descriptor the kernel just made for this call; nothing else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(r) })
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

/// sync_file_range(2) on `fd` (a descriptor the caller holds open for the call).
pub fn sync_file_range(
    fd: std::os::fd::RawFd,
    offset: i64,
    len: i64,
    flags: libc::c_uint,
) -> std::io::Result<()> {
    // SAFETY: sync_file_range takes a descriptor and integers; it touches no memory of ours
    // (a descriptor that is not open is EBADF, not undefined behaviour).
    let r = unsafe { libc::sync_file_range(fd, offset, len, flags) };
    if r != 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Makes the child that `cmd` spawns start a session of its own (setsid(2) between fork and
/// exec), detached from the caller's terminal and process group.
pub fn setsid_on_exec(cmd: &mut std::process::Command) {
    // SAFETY: the closure runs in the forked child before exec; setsid is async-signal-safe,
    // allocates nothing and touches no memory shared with the parent.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(cmd, || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A thread's scheduling policy as `sched_getattr(2)` reports it (the fields penstock sets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SchedAttr {
    /// `SCHED_OTHER` (0), `SCHED_FIFO` (1), `SCHED_DEADLINE` (6), …
    pub policy: u32,
    /// `SCHED_FLAG_*`.
    pub flags: u64,
    /// The nice value (`SCHED_OTHER`).
    pub nice: i32,
    /// The static priority (`SCHED_FIFO`).
    pub priority: u32,
    /// `SCHED_DEADLINE`'s budget per period, in ns (and, on Linux 6.12+, `SCHED_OTHER`'s
    /// requested slice).
    pub runtime_ns: u64,
    pub deadline_ns: u64,
    pub period_ns: u64,
}

/// `SCHED_DEADLINE` (not in rustix).
pub const SCHED_DEADLINE: u32 = 6;
/// `SCHED_FLAG_RESET_ON_FORK`: children (io_uring's io-wq workers among them) start at
/// `SCHED_OTHER`; the kernel refuses to fork a `SCHED_DEADLINE` task without it.
pub const SCHED_FLAG_RESET_ON_FORK: u64 = libc::SCHED_FLAG_RESET_ON_FORK as u64;
/// `SCHED_FLAG_RECLAIM`: a `SCHED_DEADLINE` task may use bandwidth other deadline tasks
/// leave unused (GRUB) rather than be throttled at its runtime.
pub const SCHED_FLAG_RECLAIM: u64 = libc::SCHED_FLAG_RECLAIM as u64;

/// `sched_setattr(2)` for thread `tid` (0: the calling thread).
pub fn sched_setattr(tid: i32, a: &SchedAttr) -> std::io::Result<()> {
    let mut attr = libc::sched_attr {
        size: std::mem::size_of::<libc::sched_attr>() as u32,
        sched_policy: a.policy,
        sched_flags: a.flags,
        sched_nice: a.nice,
        sched_priority: a.priority,
        sched_runtime: a.runtime_ns,
        sched_deadline: a.deadline_ns,
        sched_period: a.period_ns,
    };
    // SAFETY: `attr` is a valid, fully initialised sched_attr whose `size` field is its own
    // size; the kernel only reads it for the call's duration. A bad tid is ESRCH.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_setattr,
            tid,
            &mut attr as *mut libc::sched_attr,
            0,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `sched_getattr(2)` of thread `tid` (0: the calling thread).
pub fn sched_getattr(tid: i32) -> std::io::Result<SchedAttr> {
    let size = std::mem::size_of::<libc::sched_attr>() as u32;
    let mut attr = libc::sched_attr {
        size,
        sched_policy: 0,
        sched_flags: 0,
        sched_nice: 0,
        sched_priority: 0,
        sched_runtime: 0,
        sched_deadline: 0,
        sched_period: 0,
    };
    // SAFETY: the kernel writes at most `size` bytes into `attr`, which is that large and
    // lives for the call's duration.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            tid,
            &mut attr as *mut libc::sched_attr,
            size,
            0,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(SchedAttr {
        policy: attr.sched_policy,
        flags: attr.sched_flags,
        nice: attr.sched_nice,
        priority: attr.sched_priority,
        runtime_ns: attr.sched_runtime,
        deadline_ns: attr.sched_deadline,
        period_ns: attr.sched_period,
    })
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

/// Sets an integer socket option (`setsockopt(fd, level, name, &value, 4)`), for the options
/// neither rustix nor socket2 names (SO_RXQ_OVFL, SO_TIMESTAMPNS).
pub fn set_socket_int(
    fd: std::os::fd::BorrowedFd<'_>,
    level: i32,
    name: i32,
    value: i32,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: `value` is a valid c_int for the call's duration and its size is passed with it;
    // `fd` is a live descriptor borrowed for the call.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&value as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// cachestat(2) (Linux 6.5): how many of the pages of `fd`'s byte range `off..off+len` are in
/// the page cache, and how many pages the range spans. `None` where the kernel lacks the call
/// (ENOSYS) or refuses it for this file.
pub fn cached_pages(fd: std::os::fd::BorrowedFd<'_>, off: u64, len: u64) -> Option<(u64, u64)> {
    use std::os::fd::AsRawFd;
    /// `struct cachestat_range` of <linux/mman.h>.
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    /// `struct cachestat` of <linux/mman.h>.
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    /// The syscall's number, the same on every architecture (the unified table).
    const SYS_CACHESTAT: libc::c_long = 451;
    if len == 0 {
        return Some((0, 0)); // cachestat reads len 0 as "to the end of the file"
    }
    let page = rustix::param::page_size() as u64;
    let range = Range { off, len };
    let mut stat = Stat::default();
    // SAFETY: `range` and `stat` are live, properly laid out (repr(C), as the kernel's structs)
    // and writable for the call's duration; flags must be 0; `fd` is a live descriptor.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            fd.as_raw_fd(),
            &range as *const Range,
            &mut stat as *mut Stat,
            0u32,
        )
    };
    if r != 0 {
        return None;
    }
    let pages = (off + len).div_ceil(page) - off / page;
    Some((stat.nr_cache, pages))
}

/// SO_RCVLOWAT: a blocking read of this socket returns only once `bytes` are queued (or the
/// peer closed), so a bulk receiver is woken once per that many bytes, not per segment.
pub fn set_rcvlowat(fd: std::os::fd::BorrowedFd<'_>, bytes: i32) -> std::io::Result<()> {
    set_socket_int(fd, libc::SOL_SOCKET, libc::SO_RCVLOWAT, bytes)
}

/// What the kernel said about one datagram received by [`RecvBatch::recv`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecvMeta {
    /// Bytes stored in the slot (at most the slot size).
    pub len: usize,
    /// The datagram was longer than the slot and was cut (MSG_TRUNC).
    pub truncated: bool,
    /// SO_TIMESTAMPNS: when the kernel received it, CLOCK_REALTIME ns since the epoch.
    pub kernel_time_ns: Option<u64>,
    /// SO_RXQ_OVFL: datagrams the socket dropped (receive buffer full) since it was opened.
    pub drops: Option<u32>,
}

/// Control-message space per datagram: CMSG_SPACE(timespec) + CMSG_SPACE(u32) = 32 + 24 on
/// 64-bit Linux, rounded up. Kept in u64 words so that cmsghdr alignment holds.
const CMSG_WORDS: usize = 8;

/// A batch of receive slots for recvmmsg(2): `batch` slots of `slot_bytes` each in one
/// allocation, with their iovecs, message headers and control buffers.
///
/// Datagrams stay in their slots until the next `recv`, so the caller can hand them to a
/// vectored write (pwritev) without copying them into a staging block.
pub struct RecvBatch {
    slot_bytes: usize,
    buf: Vec<u8>,
    cmsg: Vec<u64>,
    iov: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    meta: Vec<RecvMeta>,
}

impl std::fmt::Debug for RecvBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvBatch")
            .field("slot_bytes", &self.slot_bytes)
            .field("batch", &self.hdrs.len())
            .field("received", &self.meta.len())
            .finish()
    }
}

// SAFETY: the raw pointers in `iov` and `hdrs` point only into `buf` and `cmsg`, heap
// allocations owned by the same value and never shared; they are rewritten before every use.
// Moving the value to another thread moves their owner with them.
unsafe impl Send for RecvBatch {}

impl RecvBatch {
    /// `batch` slots (1..=1024, IOV_MAX bounds the vectored write of one batch) of
    /// `slot_bytes` (1..=65536) each.
    pub fn new(batch: usize, slot_bytes: usize) -> RecvBatch {
        assert!(
            (1..=1024).contains(&batch),
            "batch {batch} outside 1..=1024"
        );
        assert!(
            (1..=65536).contains(&slot_bytes),
            "slot of {slot_bytes} bytes outside 1..=65536"
        );
        RecvBatch {
            slot_bytes,
            buf: vec![0u8; batch * slot_bytes],
            cmsg: vec![0u64; batch * CMSG_WORDS],
            iov: vec![
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0
                };
                batch
            ],
            // SAFETY: an all-zero mmsghdr (null pointers, zero lengths) is a valid value of this
            // plain C struct; every field is set before the kernel sees it.
            hdrs: vec![unsafe { std::mem::zeroed() }; batch],
            meta: Vec::with_capacity(batch),
        }
    }

    /// Slots in the batch.
    pub fn batch(&self) -> usize {
        self.hdrs.len()
    }

    /// Receives up to `batch` datagrams without blocking (recvmmsg with MSG_DONTWAIT). Returns
    /// how many arrived; `WouldBlock` when none had. The previous batch's datagrams are gone.
    pub fn recv(&mut self, fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<usize> {
        use std::os::fd::AsRawFd;
        self.meta.clear();
        let base = self.buf.as_mut_ptr();
        let cbase = self.cmsg.as_mut_ptr();
        for i in 0..self.hdrs.len() {
            // SAFETY: i < batch, so slot i lies within `buf` (batch · slot_bytes bytes) and
            // control block i within `cmsg` (batch · CMSG_WORDS words).
            let (slot, control) =
                unsafe { (base.add(i * self.slot_bytes), cbase.add(i * CMSG_WORDS)) };
            self.iov[i] = libc::iovec {
                iov_base: slot.cast(),
                iov_len: self.slot_bytes,
            };
            let h = &mut self.hdrs[i];
            h.msg_len = 0;
            h.msg_hdr.msg_name = std::ptr::null_mut();
            h.msg_hdr.msg_namelen = 0;
            h.msg_hdr.msg_iov = &mut self.iov[i];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = control.cast();
            h.msg_hdr.msg_controllen = CMSG_WORDS * 8;
            h.msg_hdr.msg_flags = 0;
        }
        // SAFETY: every header points to one iovec of a slot in `buf` and to its control block
        // in `cmsg`, all owned by `self`, borrowed mutably for the call, and the kernel writes
        // within the lengths given. `vlen` is the headers' count. No timeout pointer.
        let n = unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
                self.hdrs.as_mut_ptr(),
                self.hdrs.len() as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let n = n as usize;
        for h in &self.hdrs[..n] {
            let mut m = RecvMeta {
                len: (h.msg_len as usize).min(self.slot_bytes),
                truncated: h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
                kernel_time_ns: None,
                drops: None,
            };
            // SAFETY: the kernel filled `msg_control` up to `msg_controllen` with well-formed
            // control messages; CMSG_FIRSTHDR/NXTHDR stay within it and return null at its end.
            // Payloads are read unaligned, with the size their type has.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&h.msg_hdr);
                while !c.is_null() {
                    let data = libc::CMSG_DATA(c);
                    match ((*c).cmsg_level, (*c).cmsg_type) {
                        (libc::SOL_SOCKET, libc::SCM_TIMESTAMPNS) => {
                            let ts: libc::timespec = std::ptr::read_unaligned(data.cast());
                            m.kernel_time_ns = Some(
                                (ts.tv_sec as u64)
                                    .saturating_mul(1_000_000_000)
                                    .saturating_add(ts.tv_nsec as u64),
                            );
                        }
                        (libc::SOL_SOCKET, libc::SO_RXQ_OVFL) => {
                            m.drops = Some(std::ptr::read_unaligned(data.cast::<u32>()));
                        }
                        _ => {}
                    }
                    c = libc::CMSG_NXTHDR(&h.msg_hdr, c);
                }
            }
            self.meta.push(m);
        }
        Ok(n)
    }

    /// Datagrams of the last `recv`.
    pub fn received(&self) -> usize {
        self.meta.len()
    }

    /// What the kernel said about datagram `i` of the last `recv`.
    pub fn meta(&self, i: usize) -> RecvMeta {
        self.meta[i]
    }

    /// The bytes of datagram `i` of the last `recv` (cut to the slot when truncated).
    pub fn datagram(&self, i: usize) -> &[u8] {
        let m = self.meta[i];
        &self.buf[i * self.slot_bytes..i * self.slot_bytes + m.len]
    }
}

/// An open-file-description (OFD) record lock on byte 0 of `fd`: `Some(true)` exclusive,
/// `Some(false)` shared, `None` unlock; never waits (EAGAIN when held elsewhere). Unlike POSIX
/// record locks (rustix's `fcntl_lock`), an OFD lock belongs to the open file description, so
/// two descriptions of one file in one process exclude each other, and closing another
/// descriptor of the file does not drop it. Independent of `flock`.
pub fn ofd_lock_byte0(fd: std::os::fd::BorrowedFd<'_>, lock: Option<bool>) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let kind = match lock {
        Some(true) => libc::F_WRLCK,
        Some(false) => libc::F_RDLCK,
        None => libc::F_UNLCK,
    };
    let fl = libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: 0,
        l_len: 1,
        l_pid: 0,
    };
    // SAFETY: F_OFD_SETLK reads one `struct flock`, which `fl` is; it lives across the call,
    // and `fd` is a valid descriptor for the call's duration (borrowed).
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &fl as *const libc::flock) };
    if r == -1 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Threads of this process, from `/proc/self/stat` (field 20, after the command's closing
/// parenthesis); `None` when it cannot be read.
fn thread_count() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // Fields from 3 (state) on: num_threads is field 20, the 18th here.
    after_comm.split_whitespace().nth(17)?.parse().ok()
}

/// Why [`take_listen_fds`] took nothing.
#[derive(Debug, thiserror::Error)]
pub enum ListenFdsError {
    /// Unsetting the environment is sound only while no other thread can read it.
    #[error(
        "socket activation must be taken before the process starts threads ({threads} running)"
    )]
    Threads { threads: u64 },
    #[error("socket activation: {0}")]
    Io(#[from] std::io::Error),
}

/// The descriptors the service manager passed this process (`LISTEN_FDS`, sd_listen_fds(3)),
/// with their `FileDescriptorName=`s, owned; the `LISTEN_*` variables are unset so children
/// do not inherit them (and a second call finds none). Empty when none were passed. Refused
/// while the process has more than one thread: the variables are unset, which is sound only
/// while no other thread can read the environment, and checked here rather than promised.
pub fn take_listen_fds() -> Result<Vec<(std::os::fd::OwnedFd, String)>, ListenFdsError> {
    use std::os::fd::FromRawFd;
    if std::env::var_os("LISTEN_FDS").is_none() {
        return Ok(Vec::new());
    }
    let threads = thread_count().unwrap_or(u64::MAX);
    if threads != 1 {
        return Err(ListenFdsError::Threads { threads });
    }
    // SAFETY: this process has one thread (checked just above, and only this thread could
    // start another), so nothing reads the environment while it is changed, which is
    // `std::env::remove_var`'s precondition that this call inherits.
    let fds = unsafe { sd_notify::listen_fds_with_names_and_unset_env() }?;
    Ok(fds
        .map(|(raw, name)| {
            // SAFETY: the service manager passed `raw` to this process for it to own
            // (sd_listen_fds(3)); `listen_fds` checked LISTEN_PID is ours and that the number
            // is within LISTEN_FDS, and the variables are now unset, so no other call takes
            // it again.
            (unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) }, name)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_thread_count_is_read_from_proc() {
        let n = thread_count().expect("/proc/self/stat");
        assert!(n >= 1, "{n}");
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || rx.recv());
        assert_eq!(thread_count(), Some(n + 1));
        drop(tx);
        let _ = t.join();
    }

    #[test]
    fn cached_pages_sees_a_file_leave_the_cache() {
        use std::io::Write;
        use std::os::fd::AsFd;
        // In the crate's directory, not /tmp: on tmpfs, DONTNEED cannot drop pages.
        let mut f = tempfile::tempfile_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        f.write_all(&vec![7u8; 1 << 20]).unwrap();
        let Some((cached, pages)) = cached_pages(f.as_fd(), 0, 1 << 20) else {
            return; // a kernel before 6.5: nothing to check
        };
        assert_eq!(
            pages,
            (1u64 << 20).div_ceil(rustix::param::page_size() as u64)
        );
        assert_eq!(cached, pages, "a file just written is in the cache");
        assert_eq!(cached_pages(f.as_fd(), 4095, 2).map(|c| c.1), Some(2));
        f.sync_all().unwrap();
        rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
        let (cached, _) = cached_pages(f.as_fd(), 0, 1 << 20).unwrap();
        assert!(
            cached < pages,
            "DONTNEED of clean pages drops them ({cached} of {pages} left)"
        );
    }

    #[test]
    fn recv_batch_takes_several_datagrams_with_kernel_times_and_truncation() {
        use std::os::fd::AsFd;
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        set_socket_int(rx.as_fd(), libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1).unwrap();
        set_socket_int(rx.as_fd(), libc::SOL_SOCKET, libc::SO_RXQ_OVFL, 1).unwrap();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut batch = RecvBatch::new(4, 16);
        assert_eq!(
            batch.recv(rx.as_fd()).unwrap_err().kind(),
            std::io::ErrorKind::WouldBlock
        );
        for d in [&b"one"[..], b"two!", &[7u8; 20]] {
            tx.send_to(d, rx.local_addr().unwrap()).unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(batch.recv(rx.as_fd()).unwrap(), 3);
        assert_eq!(batch.datagram(0), b"one");
        assert_eq!(batch.datagram(1), b"two!");
        assert_eq!(batch.datagram(2), &[7u8; 16]);
        assert!(!batch.meta(1).truncated && batch.meta(2).truncated);
        assert!(batch.meta(0).kernel_time_ns.is_some());
        assert!(batch.meta(0).kernel_time_ns <= batch.meta(2).kernel_time_ns);
    }

    #[test]
    fn dup_fd_number_copies_an_open_descriptor_and_refuses_a_closed_one() {
        use std::io::{Read, Seek, Write};
        use std::os::fd::AsRawFd;
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(b"hello").unwrap();
        let copy = dup_fd_number(f.as_raw_fd()).unwrap();
        assert_ne!(copy.as_raw_fd(), f.as_raw_fd());
        // The same open file: the offset is shared.
        let mut c = std::fs::File::from(copy);
        c.rewind().unwrap();
        let mut s = String::new();
        f.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello");
        // Numbers no descriptor has (a number closed here could be reused at once by another
        // test's thread).
        for bad in [-1, 1_000_000, i32::MAX] {
            let e = dup_fd_number(bad).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EBADF), "{bad}");
        }
    }

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
