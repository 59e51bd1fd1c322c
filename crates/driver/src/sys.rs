//! The few pieces of the raw layer that commands and benchmarks use directly, under safe
//! names of the driver, so that no crate above the driver depends on `penstock-uring`.
//!
//! Nothing here is new mechanism: re-exported syscalls (SO_RCVLOWAT; cachestat, which the
//! engine's `--path auto` asks too; recvmmsg with kernel receive times, which `record` uses),
//! the pool's size limit, and one O_DIRECT-aligned buffer
//! for a caller's own `pread` loop (a baseline, a background load).

use penstock_uring::{BufId, BufferPool, PoolError};

pub use penstock_uring::BUFFER_ALIGN;
pub use penstock_uring::sys::{IoprioClass, ioprio_set_current_thread, ioprio_value};
pub use penstock_uring::sys::{RecvBatch, RecvMeta, cached_pages, set_rcvlowat};
pub use penstock_uring::sys::{setsid_on_exec, sync_file_range};

/// Asks the kernel for each datagram's receive time (SO_TIMESTAMPNS) and the socket's drop
/// counter (SO_RXQ_OVFL), which [`RecvBatch::recv`] then reports in [`RecvMeta`]; a receiver
/// that times packets by the kernel's clock leaves its own scheduling delay out. Says which
/// of the two the kernel took: `(timestamps, drops)`.
pub fn enable_receive_meta(fd: std::os::fd::BorrowedFd<'_>) -> (bool, bool) {
    use penstock_uring::sys::set_socket_int;
    let ts = set_socket_int(fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1).is_ok();
    let drops = set_socket_int(fd, libc::SOL_SOCKET, libc::SO_RXQ_OVFL, 1).is_ok();
    (ts, drops)
}

/// The largest [`EngineConfig::pool_buffers`](crate::EngineConfig::pool_buffers) a pool can
/// hold: the ring's registered-buffer index is 16 bits wide.
pub const POOL_BUFFERS_MAX: usize = penstock_uring::pool::BUFFERS_MAX;

/// One buffer aligned to [`BUFFER_ALIGN`] and a multiple of it long: usable as the target of
/// an O_DIRECT read. It is a pool of one, so its memory is mapped and pre-faulted once, at
/// [`AlignedBuffer::new`].
#[derive(Debug)]
pub struct AlignedBuffer {
    pool: BufferPool,
    id: BufId,
}

impl AlignedBuffer {
    /// A buffer of at least `bytes` (rounded up to a multiple of [`BUFFER_ALIGN`], at least
    /// one). Fails only when the mapping fails.
    pub fn new(bytes: usize) -> std::io::Result<AlignedBuffer> {
        let len = bytes.max(1).div_ceil(BUFFER_ALIGN) * BUFFER_ALIGN;
        let mut pool = BufferPool::new(1, len).map_err(|e| match e {
            PoolError::Map { source, .. } => source,
            other => std::io::Error::new(std::io::ErrorKind::InvalidInput, other),
        })?;
        let id = pool
            .alloc()
            .expect("a fresh pool of one buffer has it free");
        Ok(AlignedBuffer { pool, id })
    }

    /// The buffer's length in bytes (a multiple of [`BUFFER_ALIGN`]).
    pub fn len(&self) -> usize {
        self.pool.buffer_bytes()
    }

    /// Never: a buffer is at least [`BUFFER_ALIGN`] long.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The bytes, for reading.
    pub fn bytes(&self) -> &[u8] {
        self.pool.bytes(self.id)
    }

    /// The bytes, for writing (the target of a read).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.pool.bytes_mut(self.id)
    }
}

/// fsyncs the directory holding `path`, so that a file just created there (or renamed into
/// it) keeps its name after a power cut: POSIX makes a new name durable only with its
/// directory's fsync (ext4 and XFS happen to do it with the file's own, other file systems
/// do not; `crates/crashfs` models the POSIX rule).
pub fn sync_parent_dir(path: &std::path::Path) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffer_rounds_up_and_is_aligned() {
        let mut b = AlignedBuffer::new(5000).unwrap();
        assert_eq!(b.len(), 2 * BUFFER_ALIGN);
        assert_eq!(b.bytes().as_ptr() as usize % BUFFER_ALIGN, 0);
        let last = b.len() - 1;
        b.bytes_mut()[last] = 7;
        assert_eq!(b.bytes()[last], 7);
        assert_eq!(AlignedBuffer::new(0).unwrap().len(), BUFFER_ALIGN);
    }
}
