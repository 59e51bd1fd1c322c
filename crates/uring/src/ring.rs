//! The ring: io_uring with a registered buffer pool and an operation slab.
//!
//! Every operation submitted here occupies a slot in a slab until its last completion
//! arrives; the completion's `user_data` is the slot index and a generation (never a
//! pointer). A slot remembers the caller's token, the pool buffer the operation uses and any
//! memory the kernel reads at submission (the timespec of a timeout). So an operation whose
//! owner lost interest still owns its buffer until the kernel is done with it: buffers are
//! given back to the pool on the operation's *last* completion — for SEND_ZC that is the
//! notification, not the first completion.
//!
//! On drop, all operations in flight are cancelled and their completions awaited before the
//! pool's memory is unmapped.

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

use io_uring::{IoUring, cqueue, opcode, squeue, types};

use crate::pool::{BufId, BufferPool, PoolError};

/// How to build a ring.
#[derive(Debug, Clone)]
pub struct RingConfig {
    /// Submission queue entries (rounded up to a power of two by the kernel).
    pub sq_entries: u32,
    /// Buffers in the pool at start.
    pub buffers: usize,
    /// The most buffers the pool may grow to ([`Ring::grow_pool`]); at least `buffers`
    /// (below it: `buffers`, a pool that never grows).
    pub buffers_max: usize,
    /// Bytes per buffer (a multiple of 4096).
    pub buffer_bytes: usize,
    /// Try to register the pool with the ring (READ_FIXED / SEND_ZC with a buffer index).
    pub register_buffers: bool,
    /// Operations in flight at most (slab size).
    pub ops_max: usize,
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig {
            sq_entries: 256,
            buffers: 64,
            buffers_max: 0,
            buffer_bytes: 256 * 1024,
            register_buffers: true,
            ops_max: 4096,
        }
    }
}

/// Why a ring could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RingError {
    /// io_uring is refused here (sysctl kernel.io_uring_disabled, seccomp, old kernel).
    #[error("io_uring is unavailable: {0}")]
    Unavailable(io::Error),
    #[error(transparent)]
    Pool(#[from] PoolError),
    #[error("io_uring setup failed: {0}")]
    Setup(io::Error),
}

/// Why an operation was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    #[error("too many operations in flight (ops_max reached)")]
    SlabFull,
}

/// One completion, translated back to the caller's token.
#[derive(Debug, Clone, Copy)]
pub struct Completion {
    /// The caller's token given at submission.
    pub token: u64,
    /// The kernel's result: bytes or a negated errno.
    pub result: i32,
    /// This is the zero-copy notification of a SEND_ZC (the buffer is free again).
    pub notification: bool,
    /// Another completion for the same operation will follow.
    pub more: bool,
}

impl Completion {
    /// The result as `io::Result<usize>`.
    pub fn io_result(&self) -> io::Result<usize> {
        if self.result < 0 {
            Err(io::Error::from_raw_os_error(-self.result))
        } else {
            Ok(self.result as usize)
        }
    }
}

#[derive(Debug)]
enum Slot {
    Free {
        next_generation: u32,
    },
    Busy {
        generation: u32,
        token: u64,
        buf: Option<BufId>,
        timespec: Option<Box<types::Timespec>>,
    },
}

/// Opcodes a kernel may lack, probed at start.
#[derive(Debug, Clone, Copy, Default)]
pub struct Features {
    pub read_fixed: bool,
    pub send_zc: bool,
    pub poll_add: bool,
    pub timeout: bool,
}

/// An io_uring with its buffer pool and operation slab. Not `Sync`: one per worker thread.
pub struct Ring {
    ring: IoUring,
    pool: BufferPool,
    registered: bool,
    /// The table was registered sparse with room for every buffer the pool may grow to
    /// (`IORING_RSRC_REGISTER_SPARSE`): a grown buffer is put in it by an update.
    sparse: bool,
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    in_flight: usize,
    features: Features,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("registered", &self.registered)
            .field("in_flight", &self.in_flight)
            .field("pool", &self.pool)
            .finish()
    }
}

fn is_unavailable(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EPERM | libc::ENOSYS | libc::EACCES)
    )
}

/// Outcome of trying to register the pool with the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registration {
    Registered,
    /// Registration was switched off by configuration.
    Disabled,
    /// The kernel refused (typically ENOMEM: RLIMIT_MEMLOCK too small); plain buffers are used.
    Refused(i32),
}

impl Ring {
    /// Builds a ring and its pool. Returns the ring and what became of buffer registration,
    /// so that the caller can say once why it runs without registered buffers.
    pub fn new(cfg: &RingConfig) -> Result<(Ring, Registration), RingError> {
        if std::env::var_os("PENSTOCK_NO_URING").is_some() {
            return Err(RingError::Unavailable(io::Error::from_raw_os_error(
                libc::EPERM,
            )));
        }
        // Room in the completion queue for every operation the slab can hold, so that the
        // kernel never has to hold completions back (a full CQ makes submission fail with
        // EBUSY until the loop reaps).
        let cq_entries = (cfg.ops_max as u32)
            .max(cfg.sq_entries * 2)
            .next_power_of_two()
            .min(1 << 16);
        let ring = IoUring::builder()
            .setup_single_issuer()
            .setup_coop_taskrun()
            .setup_cqsize(cq_entries)
            .build(cfg.sq_entries)
            .or_else(|e| {
                if is_unavailable(&e) {
                    Err(e)
                } else {
                    IoUring::new(cfg.sq_entries)
                }
            })
            .map_err(|e| {
                if is_unavailable(&e) {
                    RingError::Unavailable(e)
                } else {
                    RingError::Setup(e)
                }
            })?;
        let mut probe = io_uring::Probe::new();
        let features = if ring.submitter().register_probe(&mut probe).is_ok() {
            Features {
                read_fixed: probe.is_supported(opcode::ReadFixed::CODE),
                send_zc: probe.is_supported(opcode::SendZc::CODE),
                poll_add: probe.is_supported(opcode::PollAdd::CODE),
                timeout: probe.is_supported(opcode::Timeout::CODE),
            }
        } else {
            Features::default()
        };
        let max = cfg.buffers_max.max(cfg.buffers);
        let mut pool = BufferPool::growable(cfg.buffers, max, cfg.buffer_bytes)?;
        let mut sparse = false;
        let registration = if !cfg.register_buffers
            || std::env::var_os("PENSTOCK_NO_REGISTER").is_some()
        {
            Registration::Disabled
        } else {
            let iovecs = pool.iovecs();
            // A pool that may grow gets a sparse table with a slot for each buffer it may
            // have (IORING_REGISTER_BUFFERS2 with IORING_RSRC_REGISTER_SPARSE, Linux 5.19),
            // its start buffers put in by an update (IORING_REGISTER_BUFFERS_UPDATE); a
            // kernel without sparse tables registers the start buffers alone and grown
            // buffers go unregistered (plain READ and SEND on them).
            if max > cfg.buffers && ring.submitter().register_buffers_sparse(max as u32).is_ok() {
                sparse = true;
            }
            let register = |r: &IoUring| {
                if iovecs.is_empty() {
                    // A pool that starts empty: its table is the sparse one alone.
                    if sparse {
                        Ok(())
                    } else {
                        Err(io::Error::from_raw_os_error(libc::EINVAL))
                    }
                } else if sparse {
                    // SAFETY: the iovecs describe the pool's start mapping, which lives in
                    // `Ring` next to the ring and is unmapped only after the ring is dropped
                    // (field order below, and Drop waits for in-flight operations first).
                    unsafe { r.submitter().register_buffers_update(0, &iovecs, None) }
                } else {
                    // SAFETY: as above.
                    unsafe { r.submitter().register_buffers(&iovecs) }
                }
            };
            match register(&ring) {
                Ok(()) => Registration::Registered,
                Err(e) if e.raw_os_error() == Some(libc::ENOMEM) => {
                    // Pinned pages count against RLIMIT_MEMLOCK: raise it if we may (for
                    // every buffer the pool may have), then retry.
                    let want = (max * cfg.buffer_bytes) as u64 + (1 << 20);
                    if crate::sys::raise_memlock(want) && register(&ring).is_ok() {
                        Registration::Registered
                    } else {
                        Registration::Refused(libc::ENOMEM)
                    }
                }
                Err(e) => Registration::Refused(e.raw_os_error().unwrap_or(0)),
            }
        };
        if registration == Registration::Registered {
            for i in 0..pool.start_count() {
                pool.set_registered(BufId(i as u16), true);
            }
        } else {
            sparse = false;
        }
        let registered = registration == Registration::Registered;
        let slots = (0..cfg.ops_max)
            .map(|_| Slot::Free { next_generation: 0 })
            .collect();
        let free_slots = (0..cfg.ops_max as u32).rev().collect();
        Ok((
            Ring {
                ring,
                pool,
                registered,
                sparse,
                slots,
                free_slots,
                in_flight: 0,
                features,
            },
            registration,
        ))
    }

    /// Opcodes this kernel supports.
    pub fn features(&self) -> Features {
        self.features
    }

    /// Whether the pool is registered (reads use READ_FIXED).
    pub fn registered(&self) -> bool {
        self.registered
    }

    /// The buffer pool.
    pub fn pool(&self) -> &BufferPool {
        &self.pool
    }

    /// The buffer pool, mutably (alloc, free, fill).
    pub fn pool_mut(&mut self) -> &mut BufferPool {
        &mut self.pool
    }

    /// Adds one free buffer to the pool (up to its most) and puts it in the ring's sparse
    /// table when there is one; a buffer the kernel would not register (RLIMIT_MEMLOCK) is
    /// used unregistered. Err: the pool holds its most, or the memory could not be mapped.
    pub fn grow_pool(&mut self) -> Result<BufId, PoolError> {
        let id = self.pool.grow()?;
        if self.sparse {
            let iov = [self.pool.iovec(id)];
            let update = |ring: &IoUring| {
                // SAFETY: the iovec describes the buffer's own mapping, which the pool unmaps
                // only in `shrink_pool` after this slot was emptied again, or after the ring
                // is dropped (field order; Drop waits for in-flight operations first).
                unsafe {
                    ring.submitter()
                        .register_buffers_update(u32::from(id.0), &iov, None)
                }
            };
            let mut r = update(&self.ring);
            if r.as_ref()
                .is_err_and(|e| e.raw_os_error() == Some(libc::ENOMEM))
            {
                // Pinned pages count against RLIMIT_MEMLOCK: raise it for the pool's most
                // if we may, then retry once.
                let p = &self.pool;
                let want = (p.max_count() * p.buffer_bytes()) as u64 + (1 << 20);
                if crate::sys::raise_memlock(want) {
                    r = update(&self.ring);
                }
            }
            self.pool.set_registered(id, r.is_ok());
        }
        Ok(id)
    }

    /// Takes one free buffer added by growth out of the pool: out of the ring's table first
    /// (an update with an empty iovec), then unmapped. `false`: nothing to take (no such
    /// buffer is free), or the kernel kept it in its table — then it stays in the pool, so
    /// that its slot is never reused while the table still points at its pages.
    pub fn shrink_pool(&mut self) -> bool {
        let Some(id) = self.pool.shrinkable() else {
            return false;
        };
        if self.pool.registered(id) {
            let empty = [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }];
            // SAFETY: an empty iovec clears the slot (the kernel's dummy buffer); no operation
            // uses the buffer (it is free in the pool), and one in flight on another buffer
            // is unaffected. The kernel drops its page pins when the old entry's last user is
            // gone; the mapping is ours to unmap after.
            let r = unsafe {
                self.ring
                    .submitter()
                    .register_buffers_update(u32::from(id.0), &empty, None)
            };
            if r.is_err() {
                return false;
            }
            self.pool.set_registered(id, false);
        }
        self.pool.shrink(id);
        true
    }

    /// Operations submitted or queued whose last completion has not arrived.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Operations that can still be queued before [`QueueError::SlabFull`]: a caller about to
    /// queue several operations that only make sense together checks this first.
    pub fn ops_available(&self) -> usize {
        self.free_slots.len()
    }

    fn take_slot(&mut self, token: u64, buf: Option<BufId>) -> Result<u64, QueueError> {
        let idx = self.free_slots.pop().ok_or(QueueError::SlabFull)?;
        let slot = &mut self.slots[idx as usize];
        let generation = match *slot {
            Slot::Free { next_generation } => next_generation,
            Slot::Busy { .. } => unreachable!("slot {idx} on the free list is busy"),
        };
        *slot = Slot::Busy {
            generation,
            token,
            buf,
            timespec: None,
        };
        self.in_flight += 1;
        Ok(u64::from(idx) | (u64::from(generation) << 32))
    }

    /// Pushes an entry; when the submission queue is full, submits first to make room.
    ///
    /// # Safety
    /// Every pointer in `entry` must stay valid until the operation's last completion.
    unsafe fn push(&mut self, entry: squeue::Entry) {
        loop {
            // SAFETY: forwarded from the caller.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                return;
            }
            // Queue full: hand the queued entries to the kernel and retry. An error here
            // (EBUSY: completion queue overflow) is retried after reaping by the caller's loop;
            // submitting cannot fail in a way that loses the entry, which is still ours.
            if let Err(e) = self.ring.submit() {
                if e.raw_os_error() != Some(libc::EBUSY) && e.raw_os_error() != Some(libc::EAGAIN) {
                    panic!("io_uring submit failed: {e}");
                }
                std::thread::yield_now();
            }
        }
    }

    /// Reads `len` bytes at `file_offset` of `fd` into `buf[buf_offset..]`
    /// (READ_FIXED when the pool is registered, READ otherwise). The buffer is the kernel's
    /// until the completion arrives. `rw_flags` are preadv2 flags (e.g. RWF_DONTCACHE),
    /// `ioprio` the I/O priority.
    #[allow(clippy::too_many_arguments)]
    pub fn read(
        &mut self,
        fd: RawFd,
        buf: BufId,
        buf_offset: usize,
        len: usize,
        file_offset: u64,
        rw_flags: i32,
        ioprio: u16,
        token: u64,
    ) -> Result<(), QueueError> {
        let user_data = self.take_slot(token, Some(buf))?;
        let ptr = self.pool.lend_for_kernel_write(buf, buf_offset, len);
        let len32 = u32::try_from(len).expect("read length fits u32 (buffer sizes are bounded)");
        let entry = if self.pool.registered(buf) && self.features.read_fixed {
            opcode::ReadFixed::new(types::Fd(fd), ptr, len32, buf.0)
                .offset(file_offset)
                .rw_flags(rw_flags)
                .ioprio(ioprio)
                .build()
        } else {
            opcode::Read::new(types::Fd(fd), ptr, len32)
                .offset(file_offset)
                .rw_flags(rw_flags)
                .ioprio(ioprio)
                .build()
        };
        // SAFETY: `ptr..ptr+len` lies inside the pool's mapping (checked by lend_*), which
        // outlives the operation: the buffer is marked in flight until the last completion,
        // and Ring::drop waits for all completions before the mapping goes.
        unsafe { self.push(entry.user_data(user_data)) };
        Ok(())
    }

    /// Writes `buf[buf_offset..buf_offset+len]` at `file_offset` of `fd` (a file or pipe;
    /// `u64::MAX` as offset means "current position").
    pub fn write(
        &mut self,
        fd: RawFd,
        buf: BufId,
        buf_offset: usize,
        len: usize,
        file_offset: u64,
        token: u64,
    ) -> Result<(), QueueError> {
        let user_data = self.take_slot(token, Some(buf))?;
        let ptr = self.pool.lend_for_kernel_read(buf, buf_offset, len);
        let len32 = u32::try_from(len).expect("write length fits u32");
        let entry = if self.pool.registered(buf) {
            opcode::WriteFixed::new(types::Fd(fd), ptr, len32, buf.0)
                .offset(file_offset)
                .build()
        } else {
            opcode::Write::new(types::Fd(fd), ptr, len32)
                .offset(file_offset)
                .build()
        };
        // SAFETY: as in `read`: the range is inside the pool, held in flight until completion.
        unsafe { self.push(entry.user_data(user_data)) };
        Ok(())
    }

    /// Sends `buf[buf_offset..buf_offset+len]` on socket `fd` with `msg_flags`
    /// (IORING_OP_SEND, equal to send(2)); with `zero_copy`, IORING_OP_SEND_ZC: then two
    /// completions arrive, the second being the notification that frees the buffer.
    #[allow(clippy::too_many_arguments)]
    pub fn send(
        &mut self,
        fd: RawFd,
        buf: BufId,
        buf_offset: usize,
        len: usize,
        msg_flags: i32,
        zero_copy: bool,
        token: u64,
    ) -> Result<(), QueueError> {
        let zc = zero_copy && self.features.send_zc;
        let user_data = self.take_slot(token, Some(buf))?;
        let ptr = self.pool.lend_for_kernel_read(buf, buf_offset, len);
        let len32 = u32::try_from(len).expect("send length fits u32");
        let entry = if zc {
            let idx = self.pool.registered(buf).then_some(buf.0);
            opcode::SendZc::new(types::Fd(fd), ptr, len32)
                .buf_index(idx)
                .flags(msg_flags)
                .build()
        } else {
            opcode::Send::new(types::Fd(fd), ptr, len32)
                .flags(msg_flags)
                .build()
        };
        // SAFETY: as in `read`: the range is inside the pool, held in flight until the last
        // completion (the notification for SEND_ZC).
        unsafe { self.push(entry.user_data(user_data)) };
        Ok(())
    }

    /// Receives into `buf[buf_offset..buf_offset+len]` from socket `fd`.
    pub fn recv(
        &mut self,
        fd: RawFd,
        buf: BufId,
        buf_offset: usize,
        len: usize,
        msg_flags: i32,
        token: u64,
    ) -> Result<(), QueueError> {
        let user_data = self.take_slot(token, Some(buf))?;
        let ptr = self.pool.lend_for_kernel_write(buf, buf_offset, len);
        let len32 = u32::try_from(len).expect("recv length fits u32");
        let entry = opcode::Recv::new(types::Fd(fd), ptr, len32)
            .flags(msg_flags)
            .build();
        // SAFETY: as in `read`.
        unsafe { self.push(entry.user_data(user_data)) };
        Ok(())
    }

    /// Waits (one shot) until `fd` has one of the poll `events` (POLLIN, POLLOUT...).
    pub fn poll(&mut self, fd: RawFd, events: u32, token: u64) -> Result<(), QueueError> {
        let user_data = self.take_slot(token, None)?;
        let entry = opcode::PollAdd::new(types::Fd(fd), events).build();
        // SAFETY: the entry holds no pointer.
        unsafe { self.push(entry.user_data(user_data)) };
        Ok(())
    }

    /// Completes at the absolute CLOCK_MONOTONIC time `deadline_ns` (result -ETIME).
    pub fn timeout_at(&mut self, deadline_ns: u64, token: u64) -> Result<(), QueueError> {
        let user_data = self.take_slot(token, None)?;
        let ts = Box::new(
            types::Timespec::new()
                .sec(deadline_ns / 1_000_000_000)
                .nsec((deadline_ns % 1_000_000_000) as u32),
        );
        let ptr: *const types::Timespec = &*ts;
        let idx = (user_data & 0xffff_ffff) as usize;
        if let Slot::Busy { timespec, .. } = &mut self.slots[idx] {
            *timespec = Some(ts);
        }
        let entry = opcode::Timeout::new(ptr)
            .flags(types::TimeoutFlags::ABS)
            .build();
        // SAFETY: the timespec is boxed in the operation's slot, which is freed only on the
        // operation's completion; the kernel reads it at submission.
        unsafe { self.push(entry.user_data(user_data)) };
        Ok(())
    }

    /// Asks the kernel to cancel every operation in flight (their completions still arrive).
    pub fn cancel_all(&mut self) {
        if self.in_flight == 0 {
            return;
        }
        let entry = opcode::AsyncCancel2::new(types::CancelBuilder::any().all())
            .build()
            .user_data(u64::MAX);
        // SAFETY: the entry holds no pointer. Its own completion carries user_data u64::MAX,
        // which `reap` ignores.
        unsafe { self.push(entry) };
    }

    /// Asks the kernel to cancel every operation in flight whose token satisfies `pred`
    /// (their completions still arrive, usually with -ECANCELED).
    pub fn cancel_where(&mut self, pred: impl Fn(u64) -> bool) {
        let targets: Vec<u64> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match s {
                Slot::Busy {
                    generation, token, ..
                } if pred(*token) => Some(i as u64 | (u64::from(*generation) << 32)),
                _ => None,
            })
            .collect();
        for user_data in targets {
            let entry = opcode::AsyncCancel::new(user_data)
                .build()
                .user_data(u64::MAX);
            // SAFETY: the entry holds no pointer; its completion (user_data u64::MAX) is ignored.
            unsafe { self.push(entry) };
        }
    }

    /// Submits queued entries without waiting.
    pub fn submit(&mut self) -> io::Result<usize> {
        self.ring.submit()
    }

    /// Submits queued entries and waits for at least `want` completions, or until `timeout`.
    pub fn submit_and_wait(&mut self, want: usize, timeout: Option<Duration>) -> io::Result<()> {
        let r = match timeout {
            None => self.ring.submit_and_wait(want).map(drop),
            Some(d) => {
                let ts = types::Timespec::from(d);
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring
                    .submitter()
                    .submit_with_args(want, &args)
                    .map(drop)
            }
        };
        match r {
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EBUSY)
                ) =>
            {
                Ok(())
            }
            other => other,
        }
    }

    /// Moves available completions into `out`, giving buffers back to the pool on each
    /// operation's last completion.
    pub fn reap(&mut self, out: &mut Vec<Completion>) {
        for cqe in self.ring.completion() {
            let user_data = cqe.user_data();
            if user_data == u64::MAX {
                continue; // a cancel request's own completion
            }
            let idx = (user_data & 0xffff_ffff) as usize;
            let generation = (user_data >> 32) as u32;
            let flags = cqe.flags();
            let notification = cqueue::notif(flags);
            let more = cqueue::more(flags);
            let Slot::Busy {
                generation: g,
                token,
                buf,
                ..
            } = &self.slots[idx]
            else {
                panic!("completion for free slot {idx}");
            };
            assert_eq!(*g, generation, "completion for a stale slot generation");
            let (token, buf) = (*token, *buf);
            out.push(Completion {
                token,
                result: cqe.result(),
                notification,
                more,
            });
            // The operation is over when no further completion is announced. A SEND_ZC that
            // failed before sending announces no notification either.
            let last = !more;
            if last {
                if let Some(b) = buf {
                    self.pool.give_back(b);
                }
                self.slots[idx] = Slot::Free {
                    next_generation: generation.wrapping_add(1),
                };
                self.free_slots.push(idx as u32);
                self.in_flight -= 1;
            }
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // The kernel may still write into the pool: cancel, then wait for every completion
        // before the pool is unmapped. A bounded wait: after it, leak the pool rather than
        // free memory the kernel may still touch.
        self.cancel_all();
        let mut sink = Vec::new();
        for _ in 0..1000 {
            if self.in_flight == 0 {
                return;
            }
            let _ = self.submit_and_wait(1, Some(Duration::from_millis(10)));
            sink.clear();
            self.reap(&mut sink);
        }
        if self.in_flight > 0 {
            let pool =
                std::mem::replace(&mut self.pool, BufferPool::new(1, 4096).expect("tiny pool"));
            std::mem::forget(pool);
        }
    }
}
