//! The buffer pool: the mmbuf of MARS, which grows on demand and shrinks back.
//!
//! Buffers of `buffer_bytes` each (a multiple of 4096, so every buffer is aligned for
//! O_DIRECT). The pool starts with `start` buffers in one anonymous mapping and may grow to
//! `max`: each buffer added later is a mapping of its own, so that it can be unmapped again
//! when the pool shrinks back ([`BufferPool::grow`], [`BufferPool::shrink`]). The same buffer
//! is the disk-read target and the network-send source: no byte is copied by the CPU between
//! them.
//!
//! Each buffer is in one of four states, checked at every access:
//! - absent: beyond the pool's current size (no memory behind it);
//! - free: in the free list;
//! - held: owned by the driver (empty, or full of data waiting to be sent) — readable and
//!   writable by safe code;
//! - in flight: the kernel reads it (a send or a disk write: shared, several at once) or writes
//!   it (a read: one, or several into disjoint ranges, as when one chunk of a striped volume is
//!   read from several members at once). Safe code may not touch a buffer the kernel writes,
//!   nor write one it reads.
//!
//! The state lives here so that the ring can refuse to hand a buffer to the kernel twice and
//! refuse to free (or unmap) a buffer the kernel still uses. That is the zero-copy
//! buffer-lifetime rule.

use std::collections::BTreeSet;

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
    /// Beyond the pool's current size: not mapped.
    Absent,
    Free,
    Held,
    /// The kernel reads from it: `n` operations in flight.
    KernelReads(u32),
    /// The kernel writes into it: `n` operations in flight, into disjoint ranges.
    KernelWrites(u32),
}

/// Errors building or growing a pool.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    #[error("buffer size {0} is not a positive multiple of {BUFFER_ALIGN}")]
    BufferSize(usize),
    #[error("buffer count {0} is outside 1..={BUFFERS_MAX}")]
    BufferCount(usize),
    #[error("most buffers {max} is below the start size {start}")]
    MaxBelowStart { start: usize, max: usize },
    #[error("buffer pool of {bytes} bytes could not be mapped: {source}")]
    Map {
        bytes: usize,
        source: std::io::Error,
    },
    #[error("the pool holds its most buffers ({0})")]
    Full(usize),
}

/// A pool of aligned buffers that grows from `start` to `max`. See the module documentation.
pub struct BufferPool {
    /// The start buffers, `start * buffer_bytes` long (none: a pool that starts empty).
    base: Option<MmapMut>,
    /// Buffers added since start, by index − `start`: one mapping each, `None` when absent.
    grown: Vec<Option<MmapMut>>,
    start: usize,
    buffer_bytes: usize,
    state: Vec<BufState>,
    /// Per buffer, the end of the furthest range lent to the kernel for reading since it was
    /// last idle (0 when held): bytes past it may still be written
    /// ([`BufferPool::bytes_mut_from`]).
    read_end: Vec<usize>,
    /// Per buffer, whether the ring's table holds it (fixed reads and zero-copy sends by
    /// index); set by the ring.
    registered: Vec<bool>,
    /// Free buffers; the lowest goes first, so that buffers added by growth fall idle and
    /// can be unmapped again.
    free: BTreeSet<u16>,
    /// Buffers present (start + grown).
    count: usize,
}

impl std::fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferPool")
            .field("buffer_bytes", &self.buffer_bytes)
            .field("count", &self.count)
            .field("start", &self.start)
            .field("max", &self.state.len())
            .field("free", &self.free.len())
            .finish()
    }
}

fn map_buffers(bytes: usize) -> Result<MmapMut, PoolError> {
    MmapOptions::new()
        .len(bytes)
        .populate()
        .map_anon()
        .map_err(|source| PoolError::Map { bytes, source })
}

impl BufferPool {
    /// Maps `count` buffers of `buffer_bytes` each, pre-faulted; the pool never grows.
    pub fn new(count: usize, buffer_bytes: usize) -> Result<BufferPool, PoolError> {
        BufferPool::growable(count, count, buffer_bytes)
    }

    /// Maps `start` buffers of `buffer_bytes` each, pre-faulted; the pool may grow to `max`.
    /// A pool that may grow may start empty (`start` 0): it holds no memory until a stream
    /// needs a buffer.
    pub fn growable(
        start: usize,
        max: usize,
        buffer_bytes: usize,
    ) -> Result<BufferPool, PoolError> {
        if buffer_bytes == 0 || !buffer_bytes.is_multiple_of(BUFFER_ALIGN) {
            return Err(PoolError::BufferSize(buffer_bytes));
        }
        if start > BUFFERS_MAX {
            return Err(PoolError::BufferCount(start));
        }
        if max == 0 || max > BUFFERS_MAX {
            return Err(PoolError::BufferCount(max));
        }
        if max < start {
            return Err(PoolError::MaxBelowStart { start, max });
        }
        let base = if start > 0 {
            Some(map_buffers(start * buffer_bytes)?)
        } else {
            None
        };
        let mut state = vec![BufState::Free; start];
        state.resize(max, BufState::Absent);
        Ok(BufferPool {
            base,
            grown: (start..max).map(|_| None).collect(),
            start,
            buffer_bytes,
            state,
            read_end: vec![0; max],
            registered: vec![false; max],
            free: (0..start as u16).collect(),
            count: start,
        })
    }

    /// Size of every buffer in bytes.
    pub fn buffer_bytes(&self) -> usize {
        self.buffer_bytes
    }

    /// Number of buffers present now.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Buffers at start: the pool never shrinks below them.
    pub fn start_count(&self) -> usize {
        self.start
    }

    /// The most buffers the pool may have.
    pub fn max_count(&self) -> usize {
        self.state.len()
    }

    /// Number of free buffers.
    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    /// Adds one buffer (a new pre-faulted mapping), free; the ring registers it.
    pub(crate) fn grow(&mut self) -> Result<BufId, PoolError> {
        let Some(i) = (self.start..self.state.len()).find(|&i| self.state[i] == BufState::Absent)
        else {
            return Err(PoolError::Full(self.state.len()));
        };
        self.grown[i - self.start] = Some(map_buffers(self.buffer_bytes)?);
        self.state[i] = BufState::Free;
        self.registered[i] = false;
        // Bounded by BUFFERS_MAX (checked at construction): fits u16.
        self.free.insert(i as u16);
        self.count += 1;
        Ok(BufId(i as u16))
    }

    /// A free buffer added by growth, the highest first: what [`BufferPool::shrink`] may take.
    pub fn shrinkable(&self) -> Option<BufId> {
        self.free
            .iter()
            .next_back()
            .filter(|&&i| usize::from(i) >= self.start)
            .map(|&i| BufId(i))
    }

    /// Unmaps a free buffer added by growth. The ring takes it out of its table first.
    /// Panics if the buffer is not free (held, or used by the kernel) or is a start buffer.
    pub(crate) fn shrink(&mut self, id: BufId) {
        let i = id.index();
        assert!(i >= self.start, "shrinking start buffer {id:?}");
        assert_eq!(self.state[i], BufState::Free, "shrinking buffer {id:?}");
        assert!(!self.registered[i], "shrinking registered buffer {id:?}");
        self.free.remove(&id.0);
        self.state[i] = BufState::Absent;
        self.grown[i - self.start] = None;
        self.count -= 1;
    }

    /// Whether the ring's table holds the buffer.
    pub fn registered(&self, id: BufId) -> bool {
        self.registered[id.index()]
    }

    pub(crate) fn set_registered(&mut self, id: BufId, on: bool) {
        self.registered[id.index()] = on;
    }

    /// Takes a free buffer; it becomes held by the caller.
    pub fn alloc(&mut self) -> Option<BufId> {
        let i = self.free.pop_first()?;
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
        self.free.insert(id.0);
    }

    /// The buffer's memory: `(start, whole mapping)` of the mapping that holds it.
    fn region(&self, id: BufId) -> (usize, &[u8]) {
        let i = id.index();
        if i < self.start {
            let base = self
                .base
                .as_ref()
                .expect("a pool with start buffers maps them");
            (i * self.buffer_bytes, &base[..])
        } else {
            let m = self.grown[i - self.start]
                .as_ref()
                .expect("a present buffer is mapped");
            (0, &m[..])
        }
    }

    fn region_mut(&mut self, id: BufId) -> (usize, &mut [u8]) {
        let i = id.index();
        if i < self.start {
            let base = self
                .base
                .as_mut()
                .expect("a pool with start buffers maps them");
            (i * self.buffer_bytes, &mut base[..])
        } else {
            let m = self.grown[i - self.start]
                .as_mut()
                .expect("a present buffer is mapped");
            (0, &mut m[..])
        }
    }

    /// The buffer's bytes, for reading. Panics while the kernel writes into it.
    pub fn bytes(&self, id: BufId) -> &[u8] {
        let s = self.state[id.index()];
        assert!(
            matches!(s, BufState::Held | BufState::KernelReads(_)),
            "reading buffer {id:?} in state {s:?}"
        );
        let n = self.buffer_bytes;
        let (start, map) = self.region(id);
        &map[start..start + n]
    }

    /// The buffer's bytes, for writing. Panics unless the buffer is held and idle.
    pub fn bytes_mut(&mut self, id: BufId) -> &mut [u8] {
        let s = self.state[id.index()];
        assert_eq!(s, BufState::Held, "writing buffer {id:?} in state {s:?}");
        let n = self.buffer_bytes;
        let (start, map) = self.region_mut(id);
        &mut map[start..start + n]
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
        let n = self.buffer_bytes;
        let (start, map) = self.region_mut(id);
        &mut map[start + from..start + n]
    }

    /// Whether the kernel currently uses the buffer.
    pub fn in_flight(&self, id: BufId) -> bool {
        matches!(
            self.state[id.index()],
            BufState::KernelReads(_) | BufState::KernelWrites(_)
        )
    }

    /// The `iovec` of one present buffer, for registration with the ring.
    pub(crate) fn iovec(&mut self, id: BufId) -> libc::iovec {
        assert_ne!(self.state[id.index()], BufState::Absent, "{id:?} is absent");
        let n = self.buffer_bytes;
        let (start, map) = self.region_mut(id);
        libc::iovec {
            // `wrapping_add` keeps this free of `unsafe`; the offset is inside the mapping
            // (`region_mut` gives the buffer's start in a mapping at least `n` past it).
            iov_base: map.as_mut_ptr().wrapping_add(start).cast(),
            iov_len: n,
        }
    }

    /// One `iovec` per start buffer, for registration with the ring.
    pub(crate) fn iovecs(&mut self) -> Vec<libc::iovec> {
        (0..self.start as u16)
            .map(|i| self.iovec(BufId(i)))
            .collect()
    }

    fn ptr_mut(&mut self, id: BufId, offset: usize) -> *mut u8 {
        let (start, map) = self.region_mut(id);
        map.as_mut_ptr().wrapping_add(start + offset)
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
        self.ptr_mut(id, start).cast_const()
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
        self.ptr_mut(id, start)
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
        let mut empty = BufferPool::growable(0, 1, 4096).unwrap();
        assert!(empty.alloc().is_none());
        let g = empty.grow().unwrap();
        assert_eq!(empty.alloc(), Some(g));
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
    fn grows_to_its_most_and_shrinks_back_to_its_start() {
        let mut p = BufferPool::growable(1, 3, 4096).unwrap();
        let a = p.alloc().unwrap();
        assert!(p.alloc().is_none());
        let b = p.grow().unwrap();
        let c = p.grow().unwrap();
        assert!(matches!(p.grow(), Err(PoolError::Full(3))));
        assert_eq!((p.count(), p.free_count()), (3, 2));
        // The lowest free buffer goes first: grown ones fall idle.
        assert_eq!(p.alloc(), Some(b));
        p.bytes_mut(b)[4095] = 5;
        assert_eq!(p.bytes(b)[4095], 5);
        assert_eq!(p.bytes(b).as_ptr() as usize % BUFFER_ALIGN, 0);
        assert_eq!(p.shrinkable(), Some(c));
        p.shrink(c);
        assert_eq!(p.shrinkable(), None, "a held buffer is never shrunk");
        p.free(b);
        p.shrink(p.shrinkable().unwrap());
        assert_eq!((p.count(), p.free_count()), (1, 0));
        assert_eq!(p.shrinkable(), None, "the start buffers stay");
        p.free(a);
        assert!(p.grow().is_ok(), "an absent slot is mapped again");
    }

    #[test]
    #[should_panic(expected = "shrinking buffer")]
    fn shrinking_a_held_buffer_panics() {
        let mut p = BufferPool::growable(1, 2, 4096).unwrap();
        let g = p.grow().unwrap();
        let _ = p.alloc();
        let h = p.alloc().unwrap();
        assert_eq!(h, g);
        p.shrink(g);
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
