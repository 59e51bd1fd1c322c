//! The buffer pool: the mmbuf of MARS, today.
//!
//! One anonymous mapping, sized at start, cut into `count` buffers of `buffer_bytes` each
//! (a multiple of 4096, so every buffer is aligned for O_DIRECT). The same buffer is the
//! disk-read target and the network-send source: no byte is copied by the CPU between them.
//!
//! Each buffer is in one of three states, checked at every access:
//! - free: in the free list;
//! - held: owned by the driver (empty, or full of data waiting to be sent) — readable and
//!   writable by safe code;
//! - in flight: the kernel reads it (a send or a disk write: shared, several at once) or writes
//!   it (a read: one, or several into disjoint ranges, as when one chunk of a striped volume is
//!   read from several members at once). Safe code may not touch a buffer the kernel writes,
//!   nor write one it reads.
//!
//! The state lives here so that the ring can refuse to hand a buffer to the kernel twice and
//! refuse to free a buffer the kernel still uses. That is the zero-copy buffer-lifetime rule.

use memmap2::{MmapMut, MmapOptions};

/// Index of a buffer in the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufId(pub(crate) u16);

impl BufId {
    /// The buffer's index (also its index in the ring's registered-buffer table).
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// Page size and O_DIRECT alignment the pool guarantees for every buffer.
pub const BUFFER_ALIGN: usize = 4096;
/// The ring's registered-buffer index is 16 bits wide.
pub const BUFFERS_MAX: usize = 1 << 15;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BufState {
    Free,
    Held,
    /// The kernel reads from it: `n` operations in flight.
    KernelReads(u32),
    /// The kernel writes into it: `n` operations in flight, into disjoint ranges.
    KernelWrites(u32),
}

/// Errors building a pool.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    #[error("buffer size {0} is not a positive multiple of {BUFFER_ALIGN}")]
    BufferSize(usize),
    #[error("buffer count {0} is outside 1..={BUFFERS_MAX}")]
    BufferCount(usize),
    #[error("buffer pool of {bytes} bytes could not be mapped: {source}")]
    Map {
        bytes: usize,
        source: std::io::Error,
    },
}

/// A fixed pool of aligned buffers. See the module documentation.
pub struct BufferPool {
    map: MmapMut,
    buffer_bytes: usize,
    state: Vec<BufState>,
    /// Per buffer, the end of the furthest range lent to the kernel for reading since it was
    /// last idle (0 when held): bytes past it may still be written
    /// ([`BufferPool::bytes_mut_from`]).
    read_end: Vec<usize>,
    free: Vec<u16>,
}

impl std::fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferPool")
            .field("buffer_bytes", &self.buffer_bytes)
            .field("count", &self.state.len())
            .field("free", &self.free.len())
            .finish()
    }
}

impl BufferPool {
    /// Maps `count` buffers of `buffer_bytes` each, pre-faulted.
    pub fn new(count: usize, buffer_bytes: usize) -> Result<BufferPool, PoolError> {
        if buffer_bytes == 0 || !buffer_bytes.is_multiple_of(BUFFER_ALIGN) {
            return Err(PoolError::BufferSize(buffer_bytes));
        }
        if count == 0 || count > BUFFERS_MAX {
            return Err(PoolError::BufferCount(count));
        }
        let bytes = count * buffer_bytes;
        let map = MmapOptions::new()
            .len(bytes)
            .populate()
            .map_anon()
            .map_err(|source| PoolError::Map { bytes, source })?;
        // Free list popped from the end: hand out low indices first.
        let free = (0..count as u16).rev().collect();
        Ok(BufferPool {
            map,
            buffer_bytes,
            state: vec![BufState::Free; count],
            read_end: vec![0; count],
            free,
        })
    }

    /// Size of every buffer in bytes.
    pub fn buffer_bytes(&self) -> usize {
        self.buffer_bytes
    }

    /// Number of buffers.
    pub fn count(&self) -> usize {
        self.state.len()
    }

    /// Number of free buffers.
    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    /// Takes a free buffer; it becomes held by the caller.
    pub fn alloc(&mut self) -> Option<BufId> {
        let i = self.free.pop()?;
        assert_eq!(self.state[usize::from(i)], BufState::Free);
        self.state[usize::from(i)] = BufState::Held;
        Some(BufId(i))
    }

    /// Returns a held buffer to the free list. Panics if the kernel still uses it: freeing an
    /// in-flight buffer is the bug this pool exists to prevent.
    pub fn free(&mut self, id: BufId) {
        let s = &mut self.state[id.index()];
        assert_eq!(*s, BufState::Held, "freeing buffer {id:?} in state {s:?}");
        *s = BufState::Free;
        self.free.push(id.0);
    }

    /// The buffer's bytes, for reading. Panics while the kernel writes into it.
    pub fn bytes(&self, id: BufId) -> &[u8] {
        let s = self.state[id.index()];
        assert!(
            matches!(s, BufState::Held | BufState::KernelReads(_)),
            "reading buffer {id:?} in state {s:?}"
        );
        let start = id.index() * self.buffer_bytes;
        &self.map[start..start + self.buffer_bytes]
    }

    /// The buffer's bytes, for writing. Panics unless the buffer is held and idle.
    pub fn bytes_mut(&mut self, id: BufId) -> &mut [u8] {
        let s = self.state[id.index()];
        assert_eq!(s, BufState::Held, "writing buffer {id:?} in state {s:?}");
        let start = id.index() * self.buffer_bytes;
        &mut self.map[start..start + self.buffer_bytes]
    }

    /// The buffer's bytes from `from` on, for writing: allowed while the kernel reads the
    /// buffer only before `from` (sends of earlier ranges in flight, as a zero-copy send of
    /// one RTP packet while the next is framed behind it). Panics while the kernel writes it,
    /// or reads any byte at or past `from`.
    pub fn bytes_mut_from(&mut self, id: BufId, from: usize) -> &mut [u8] {
        let s = self.state[id.index()];
        match s {
            BufState::Held => {}
            BufState::KernelReads(_) => assert!(
                self.read_end[id.index()] <= from,
                "writing buffer {id:?} from {from}: the kernel reads it up to {}",
                self.read_end[id.index()]
            ),
            other => panic!("writing buffer {id:?} in state {other:?}"),
        }
        let start = id.index() * self.buffer_bytes;
        &mut self.map[start + from..start + self.buffer_bytes]
    }

    /// Whether the kernel currently uses the buffer.
    pub fn in_flight(&self, id: BufId) -> bool {
        matches!(
            self.state[id.index()],
            BufState::KernelReads(_) | BufState::KernelWrites(_)
        )
    }

    /// One `iovec` per buffer, for registration with the ring.
    pub(crate) fn iovecs(&mut self) -> Vec<libc::iovec> {
        let base = self.map.as_mut_ptr();
        (0..self.count())
            .map(|i| libc::iovec {
                // `wrapping_add` keeps this free of `unsafe`; the offset is inside the mapping
                // because i < count and the mapping is count * buffer_bytes long.
                iov_base: base.wrapping_add(i * self.buffer_bytes).cast(),
                iov_len: self.buffer_bytes,
            })
            .collect()
    }

    /// Marks the buffer as read by the kernel and returns a pointer to `range` of it.
    pub(crate) fn lend_for_kernel_read(
        &mut self,
        id: BufId,
        start: usize,
        len: usize,
    ) -> *const u8 {
        assert!(
            start
                .checked_add(len)
                .is_some_and(|end| end <= self.buffer_bytes)
        );
        let s = &mut self.state[id.index()];
        *s = match *s {
            BufState::Held => BufState::KernelReads(1),
            BufState::KernelReads(n) => BufState::KernelReads(n + 1),
            other => panic!("lending buffer {id:?} for a send in state {other:?}"),
        };
        let end = &mut self.read_end[id.index()];
        *end = (*end).max(start + len);
        self.map
            .as_ptr()
            .wrapping_add(id.index() * self.buffer_bytes + start)
    }

    /// Marks the buffer as written by the kernel and returns a pointer to `range` of it.
    ///
    /// Several reads may write one buffer at once (the pieces of a striped read); the caller
    /// gives them disjoint ranges. Overlapping ranges would only garble the bytes (no reference
    /// to the buffer exists while the kernel writes it), never break memory safety.
    pub(crate) fn lend_for_kernel_write(&mut self, id: BufId, start: usize, len: usize) -> *mut u8 {
        assert!(
            start
                .checked_add(len)
                .is_some_and(|end| end <= self.buffer_bytes)
        );
        let s = &mut self.state[id.index()];
        *s = match *s {
            BufState::Held => BufState::KernelWrites(1),
            BufState::KernelWrites(n) => BufState::KernelWrites(n + 1),
            other => panic!("lending buffer {id:?} for a read in state {other:?}"),
        };
        self.map
            .as_mut_ptr()
            .wrapping_add(id.index() * self.buffer_bytes + start)
    }

    /// The kernel is done with one operation on the buffer.
    pub(crate) fn give_back(&mut self, id: BufId) {
        let s = &mut self.state[id.index()];
        *s = match *s {
            BufState::KernelWrites(1) | BufState::KernelReads(1) => {
                self.read_end[id.index()] = 0;
                BufState::Held
            }
            BufState::KernelReads(n) if n > 1 => BufState::KernelReads(n - 1),
            BufState::KernelWrites(n) if n > 1 => BufState::KernelWrites(n - 1),
            other => panic!("buffer {id:?} given back in state {other:?}"),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_past_a_send_in_flight_stay_writable() {
        let mut p = BufferPool::new(1, 8192).unwrap();
        let a = p.alloc().unwrap();
        p.lend_for_kernel_read(a, 0, 100);
        p.lend_for_kernel_read(a, 100, 50);
        p.bytes_mut_from(a, 150)[0] = 9;
        assert_eq!(p.bytes(a)[150], 9);
        let inside = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            p.bytes_mut_from(a, 149);
        }));
        assert!(inside.is_err(), "a byte the kernel reads is not writable");
        p.give_back(a);
        p.give_back(a);
        p.bytes_mut_from(a, 0)[0] = 1;
        p.bytes_mut(a)[1] = 2;
    }

    #[test]
    fn alloc_free_and_alignment() {
        let mut p = BufferPool::new(3, 8192).unwrap();
        let a = p.alloc().unwrap();
        let b = p.alloc().unwrap();
        assert_ne!(a, b);
        assert_eq!(p.bytes(a).as_ptr() as usize % BUFFER_ALIGN, 0);
        assert_eq!(p.bytes(b).as_ptr() as usize % BUFFER_ALIGN, 0);
        p.bytes_mut(a)[0] = 7;
        assert_eq!(p.bytes(a)[0], 7);
        p.free(a);
        assert_eq!(p.free_count(), 2);
        assert!(BufferPool::new(1, 100).is_err());
        assert!(BufferPool::new(0, 4096).is_err());
    }

    #[test]
    #[should_panic(expected = "freeing buffer")]
    fn freeing_an_in_flight_buffer_panics() {
        let mut p = BufferPool::new(1, 4096).unwrap();
        let a = p.alloc().unwrap();
        let _ = p.lend_for_kernel_write(a, 0, 4096);
        p.free(a);
    }

    #[test]
    fn disjoint_kernel_writes_count_down() {
        let mut p = BufferPool::new(1, 8192).unwrap();
        let a = p.alloc().unwrap();
        let _ = p.lend_for_kernel_write(a, 0, 4096);
        let _ = p.lend_for_kernel_write(a, 4096, 4096);
        p.give_back(a);
        assert!(p.in_flight(a));
        p.give_back(a);
        assert!(!p.in_flight(a));
        p.free(a);
    }

    #[test]
    #[should_panic(expected = "for a read")]
    fn a_read_into_a_buffer_being_sent_panics() {
        let mut p = BufferPool::new(1, 4096).unwrap();
        let a = p.alloc().unwrap();
        let _ = p.lend_for_kernel_read(a, 0, 10);
        let _ = p.lend_for_kernel_write(a, 0, 10);
    }

    #[test]
    fn shared_kernel_reads_count_down() {
        let mut p = BufferPool::new(1, 4096).unwrap();
        let a = p.alloc().unwrap();
        let _ = p.lend_for_kernel_read(a, 0, 10);
        let _ = p.lend_for_kernel_read(a, 10, 10);
        assert!(p.in_flight(a));
        assert_eq!(p.bytes(a).len(), 4096);
        p.give_back(a);
        assert!(p.in_flight(a));
        p.give_back(a);
        assert!(!p.in_flight(a));
        p.free(a);
    }
}
