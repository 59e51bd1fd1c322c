//! A worker's buffer books: core's [`BufferManager`] accounting the ring's [`BufferPool`].
//!
//! Every uring-path stream is a client of its worker's books. An admitted `rt` stream is an
//! `Rt` client with the buffers it reserved (the engine placed it on a worker whose pool could
//! hold them); every other stream is a `Bulk` client that borrows free buffers, at most
//! `EngineConfig::client_buffers_max`. The pool holds the memory; the books say who may take
//! a buffer. Both are updated together: a buffer is held in the books exactly when it is
//! allocated in the pool.
//!
//! Repossession. When an `rt` stream is owed a buffer and none is free, the books put a debt
//! on the biggest borrower. A debtor borrows nothing until it has paid, and pays in two ways,
//! neither of which loses data:
//! - a chunk it finished sending goes back to the pool instead of being reused (the debt is
//!   paid by the release);
//! - at its next step it gives back *full chunks at the tail of its queue that are not being
//!   sent and of which nothing was sent*, and moves its read position back to the first of
//!   them: that range is read again later. A buffer in flight (a read, a send, a zero-copy
//!   send waiting for its notification) is never taken.
//!
//! Growth. The pool starts with `pool_buffers` and may grow to the worker's share of
//! `pool_max_bytes`: when the books answer [`Grant::Grow`] (a stream could take a buffer,
//! none is free for it, the pool is below its most) a buffer is mapped, put in the ring's
//! table and added to the books before the stream asks again; an `rt` reservation beyond the
//! pool's present size grows it first. When no buffer beyond the start size has been in use
//! for `pool_shrink_after`, the free ones added by growth are taken out of the books, the ring's
//! table and memory ([`WorkerBuffers::upkeep`]).
//!
//! [`BufferPool`]: penstock_uring::BufferPool

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use penstock_core::time::Instant;

use penstock_core::buffers::{
    BufferError, BufferId, BufferManager, BufferPoolConfig, BufferState, ClientId, ClientKind,
    Grant,
};
use penstock_uring::{BufId, Ring};

use crate::clock;

/// Live figures of one worker's pool, written by the worker (relaxed atomics), read by
/// [`crate::Engine::buffer_usage`].
#[derive(Debug, Default)]
pub(crate) struct BufferGauges {
    /// Buffers in the pool now (0 without io_uring).
    pub total: AtomicU32,
    /// The most buffers the pool may grow to (0 without io_uring).
    pub max: AtomicU32,
    /// Buffers added by growth and given back by shrinking, since start.
    pub grown: AtomicU64,
    pub shrunk: AtomicU64,
    /// Buffers reserved by the `rt` streams placed on this worker. Taken by the engine when it
    /// places a stream (before the worker sees it), given back by the worker when it ends.
    pub reserved: AtomicU32,
    pub rt_held: AtomicU32,
    pub bulk_held: AtomicU32,
    /// Buffers borrowers were made to owe to an `rt` stream.
    pub repossessed: AtomicU64,
    /// Of the buffers given back, full chunks not yet sent (their range is read again).
    pub reread_chunks: AtomicU64,
}

impl BufferGauges {
    /// Reserves `n` buffers of the most this worker's pool may have for an `rt` stream, if
    /// they fit (the worker grows the pool to hold them). Err: the buffers left unreserved.
    pub(crate) fn try_reserve(&self, n: u32) -> Result<(), u32> {
        let total = self.max.load(Ordering::Relaxed);
        self.reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                (r.checked_add(n)? <= total).then_some(r + n)
            })
            .map(drop)
            .map_err(|r| total.saturating_sub(r))
    }

    pub(crate) fn unreserve(&self, n: u32) {
        let before = self.reserved.fetch_sub(n, Ordering::AcqRel);
        assert!(before >= n, "unreserving {n} of {before} reserved buffers");
    }
}

struct ClientInfo {
    slot: usize,
    rt: bool,
    reserved: u32,
}

/// The books of one worker's pool. See the module documentation.
pub(crate) struct WorkerBuffers {
    books: BufferManager,
    /// The books' id of each held pool buffer, by pool index.
    acct: Vec<Option<BufferId>>,
    clients: HashMap<ClientId, ClientInfo>,
    gauges: Arc<BufferGauges>,
    /// A bulk stream borrows at most this many buffers.
    borrow_max: u32,
    /// Streams that found no buffer they may take (worker slots); woken after a release.
    starved: Vec<usize>,
    /// Borrowers with a new debt (worker slots): stepped soon so that they pay it.
    debtors: Vec<usize>,
    /// A buffer went back to the pool since the starved were last woken.
    released: bool,
    /// Buffers at start: the pool shrinks back to them.
    start: usize,
    /// How long no buffer beyond the start size is in use before the pool shrinks.
    shrink_after: Duration,
    /// The last time more than `start` buffers were in use.
    busy_at: Instant,
    /// When `upkeep` next looks at the pool (`None`: it is at its start size).
    shrink_at: Option<Instant>,
    /// A mapping failed at growth: said once.
    grow_failed: bool,
}

impl WorkerBuffers {
    pub(crate) fn new(
        ring: &Ring,
        clients_max: u32,
        borrow_max: u32,
        shrink_after: Duration,
        gauges: Arc<BufferGauges>,
    ) -> Result<WorkerBuffers, BufferError> {
        let pool = ring.pool();
        let count = u32::try_from(pool.count()).expect("the pool holds at most 2^15 buffers");
        let max = u32::try_from(pool.max_count()).expect("the pool holds at most 2^15 buffers");
        let books = BufferManager::new(BufferPoolConfig {
            buffer_count: count,
            buffer_count_max: max,
            buffer_bytes: pool.buffer_bytes() as u64,
            clients_max,
        })?;
        gauges.total.store(count, Ordering::Relaxed);
        gauges.max.store(max, Ordering::Relaxed);
        Ok(WorkerBuffers {
            books,
            acct: vec![None; pool.max_count()],
            clients: HashMap::new(),
            gauges,
            borrow_max: borrow_max.clamp(1, max),
            starved: Vec::new(),
            debtors: Vec::new(),
            released: false,
            start: pool.start_count(),
            shrink_after,
            busy_at: clock::now(),
            shrink_at: None,
            grow_failed: false,
        })
    }

    /// Adds one buffer to the pool and the books. False: the memory could not be mapped
    /// (said once); the stream waits for a release as on a pool at its most.
    fn grow(&mut self, ring: &mut Ring) -> bool {
        match ring.grow_pool() {
            Ok(_) => {
                self.books
                    .add_buffers(1)
                    .expect("the books and the pool have the same most");
                self.gauges.total.fetch_add(1, Ordering::Relaxed);
                self.gauges.grown.fetch_add(1, Ordering::Relaxed);
                self.shrink_at
                    .get_or_insert(self.busy_at + self.shrink_after);
                true
            }
            Err(e) => {
                if !self.grow_failed {
                    self.grow_failed = true;
                    tracing::warn!("the buffer pool could not grow: {e}");
                }
                false
            }
        }
    }

    /// Shrinks the pool back towards its start size once no buffer beyond it has been in use
    /// for `shrink_after`: every free buffer added by growth goes (books, ring, memory).
    /// Returns when to look again (`None`: at its start size).
    pub(crate) fn upkeep(&mut self, ring: &mut Ring) -> Option<Instant> {
        let at = self.shrink_at?;
        let now = clock::now();
        if now < at {
            return Some(at);
        }
        let due = self.busy_at + self.shrink_after;
        if now < due {
            self.shrink_at = Some(due);
            return self.shrink_at;
        }
        while ring.pool().count() > self.start && ring.pool().shrinkable().is_some() {
            // The books choose no particular buffer: any free one of theirs goes with the
            // pool's highest free one (a buffer is held in the books exactly when in the pool).
            if self.books.remove_free_buffer().is_none() {
                break;
            }
            if !ring.shrink_pool() {
                self.books
                    .add_buffers(1)
                    .expect("a buffer just taken out fits again");
                break;
            }
            self.gauges.total.fetch_sub(1, Ordering::Relaxed);
            self.gauges.shrunk.fetch_add(1, Ordering::Relaxed);
        }
        // Buffers added by growth still held: look again soon after they may be free.
        self.shrink_at = (ring.pool().count() > self.start)
            .then(|| now + self.shrink_after.min(Duration::from_secs(1)));
        self.shrink_at
    }

    /// Opens an account for the stream in worker slot `slot`: an `rt` one with `reserved`
    /// buffers (already counted in the gauges by the engine), else a borrower.
    pub(crate) fn register(
        &mut self,
        ring: &mut Ring,
        slot: usize,
        reserved: Option<u32>,
    ) -> Result<ClientId, BufferError> {
        if let Some(n) = reserved {
            // The engine reserved against the most the pool may have: grow it to hold the
            // reservation now, so that the rt client's buffers exist when it asks.
            let grow = self.books.reserve_growth(n).unwrap_or(0);
            for _ in 0..grow {
                if !self.grow(ring) {
                    break;
                }
            }
        }
        let kind = match reserved {
            Some(reserved) => ClientKind::Rt { reserved },
            None => ClientKind::Bulk {
                borrow_max: self.borrow_max,
            },
        };
        let id = match self.books.add_client(kind) {
            Ok(id) => id,
            Err(e) => {
                if let Some(n) = reserved {
                    self.gauges.unreserve(n);
                }
                return Err(e);
            }
        };
        self.clients.insert(
            id,
            ClientInfo {
                slot,
                rt: reserved.is_some(),
                reserved: reserved.unwrap_or(0),
            },
        );
        Ok(id)
    }

    /// Closes an account; the stream holds no buffer any more (`UringState::release`).
    /// Gives its reservation back to the gauges.
    pub(crate) fn unregister(&mut self, client: ClientId) {
        let usage = self.books.usage(client).expect("a registered client");
        assert_eq!(usage.held, 0, "{client} ends holding buffers");
        self.books
            .remove_client(client)
            .expect("a registered client");
        let info = self.clients.remove(&client).expect("a registered client");
        if info.reserved > 0 {
            self.gauges.unreserve(info.reserved);
        }
        self.starved.retain(|&s| s != info.slot);
        self.debtors.retain(|&s| s != info.slot);
    }

    /// A pool buffer for `client`, or `None`: it may take none now (its limit, a debt, or
    /// nothing free that is not promised to an `rt` stream). A stream that may be owed one
    /// later is woken when a buffer is released.
    pub(crate) fn alloc(&mut self, ring: &mut Ring, client: ClientId) -> Option<BufId> {
        let mut grant = self.books.acquire(client);
        if matches!(grant, Ok(Grant::Grow)) {
            // A stream never waits on a pool that could still grow.
            grant = if self.grow(ring) {
                self.books.acquire(client)
            } else {
                Err(BufferError::NoFreeBuffer)
            };
        }
        match grant {
            Ok(Grant::Buffer(b)) => {
                // Invariant: the books and the pool hold the same buffers, so a buffer free in
                // the books is free in the pool.
                let buf = ring
                    .pool_mut()
                    .alloc()
                    .expect("the pool has a free buffer when the books do");
                assert!(self.acct[buf.index()].is_none(), "{buf:?} held twice");
                self.acct[buf.index()] = Some(b);
                let info = &self.clients[&client];
                let gauge = if info.rt {
                    &self.gauges.rt_held
                } else {
                    &self.gauges.bulk_held
                };
                gauge.fetch_add(1, Ordering::Relaxed);
                let pool = ring.pool();
                if pool.count() - pool.free_count() > self.start {
                    self.busy_at = clock::now();
                }
                Some(buf)
            }
            Ok(Grant::Grow) => unreachable!("a pool just grown has a free buffer"),
            Ok(Grant::Wait(plan)) => {
                push_once(&mut self.starved, self.clients[&client].slot);
                for d in plan.demands {
                    self.gauges
                        .repossessed
                        .fetch_add(u64::from(d.buffers), Ordering::Relaxed);
                    if let Some(i) = self.clients.get(&d.client) {
                        push_once(&mut self.debtors, i.slot);
                    }
                }
                None
            }
            Err(BufferError::NoFreeBuffer) => {
                push_once(&mut self.starved, self.clients[&client].slot);
                None
            }
            // The stream holds buffers: their completions wake it.
            Err(
                BufferError::InDebt { .. }
                | BufferError::BorrowLimit { .. }
                | BufferError::ReservationExhausted { .. },
            ) => None,
            Err(e) => panic!("buffer books refused {client}: {e}"),
        }
    }

    /// Gives a held buffer back; the kernel no longer uses it. A debt is paid first.
    pub(crate) fn free(&mut self, ring: &mut Ring, client: ClientId, buf: BufId) {
        let b = self.acct[buf.index()]
            .take()
            .expect("freeing a buffer the books do not hold");
        if matches!(self.books.state(b), Ok(BufferState::InFlight { .. })) {
            // An operation that ended in an error or a cancel is not finished one by one:
            // the stream only frees a buffer once nothing of its operations is in flight.
            self.books.finish_io(b).expect("in flight in the books");
        }
        self.books
            .release(client, b)
            .expect("the client holds the buffer idle");
        ring.pool_mut().free(buf);
        let gauge = if self.clients[&client].rt {
            &self.gauges.rt_held
        } else {
            &self.gauges.bulk_held
        };
        gauge.fetch_sub(1, Ordering::Relaxed);
        self.released = true;
    }

    /// An operation (a read, a send, a write; all pieces of a volume chunk at once) now owns
    /// `buf`: it cannot be given back until [`WorkerBuffers::finish_io`].
    pub(crate) fn start_io(&mut self, client: ClientId, buf: BufId) {
        let b = self.acct[buf.index()].expect("I/O on a buffer the books do not hold");
        self.books
            .start_io(client, b)
            .expect("I/O on a buffer held idle by its stream");
    }

    pub(crate) fn finish_io(&mut self, buf: BufId) {
        let b = self.acct[buf.index()].expect("I/O on a buffer the books do not hold");
        self.books
            .finish_io(b)
            .expect("finishing I/O that was started");
    }

    /// Buffers `client` owes to an `rt` stream.
    pub(crate) fn owed(&self, client: ClientId) -> u32 {
        self.books.usage(client).map_or(0, |u| u.debt)
    }

    /// Counts a full chunk given back before it was sent.
    pub(crate) fn note_reread(&self) {
        self.gauges.reread_chunks.fetch_add(1, Ordering::Relaxed);
    }

    /// Slots to step: debtors (to pay), and the starved once a buffer was released.
    pub(crate) fn take_wakeups(&mut self, out: &mut Vec<usize>) {
        out.append(&mut self.debtors);
        if self.released {
            self.released = false;
            out.append(&mut self.starved);
        }
    }
}

/// Lists of waiting slots stay short (streams of one worker): a linear check is enough.
fn push_once(v: &mut Vec<usize>, slot: usize) {
    if !v.contains(&slot) {
        v.push(slot);
    }
}
