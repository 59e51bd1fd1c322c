//! Buffer memory accounting, Clockwise style: one pool of equal buffers lent to clients
//! (streams). `rt` clients reserve their share at admission and are guaranteed it; `bulk`
//! clients borrow what is free, up to a per-client limit, and give it back when an rt client
//! needs it.
//!
//! The pool grows (MARS's `mmbinit`): it has `buffer_count` buffers now and may have
//! `buffer_count_max`. When a client could take a buffer but none is free for it, and the pool
//! is below its most, [`BufferManager::acquire`] answers [`Grant::Grow`]: the driver adds a
//! buffer ([`BufferManager::add_buffers`]) and asks again, so a stream never waits on a pool
//! that could still grow. Reservations are checked against the most
//! ([`BufferManager::reserve_growth`] says how many buffers to add first); the driver gives
//! free buffers back ([`BufferManager::remove_free_buffer`]) when the pool has been idle.
//!
//! Fairness among borrowers: a borrower refused for want of a free buffer while it holds none
//! *waits*; while any borrower waits, a free buffer goes to a waiting borrower, never to one
//! that is not waiting (a stream that holds buffers reads ahead only when no stream is left
//! with none). Otherwise the streams that came first keep every buffer — a paced stream holds
//! its buffer between units for as long as its units take to send — and the others never start.
//!
//! Repossession never loses data: the manager never takes a buffer. When an rt client is
//! entitled to a buffer and none is free, [`BufferManager::repossess`] puts *debts* on the
//! biggest borrowers (greediest first: protection from a client that grabs everything) and
//! reports which buffers they could return now (idle) and how many they must return as their
//! in-flight I/O completes. A debtor borrows nothing more until it has paid; an in-flight
//! buffer cannot be released at all. Buffers of a removed client that are still in flight
//! stay out of the pool until their completion arrives (the zero-copy buffer-lifetime rule).
//!
//! Pure accounting: buffer ids are indices; the driver owns the memory behind them.
//!
//! Invariant (checked by [`BufferManager::check`]): every outstanding rt claim is backed by a
//! free buffer, a debt, or an orphan on its way back: `claims <= free + debts + orphans`.
//! Since `Σ reserved <= buffer_count`, a new claim always finds a borrower to put a debt on.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Most buffers a pool may have (ids are u32; the state table is sized at start).
pub const BUFFERS_MAX: u32 = 1 << 24;

#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct BufferId(pub u32);

#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct ClientId(pub u64);

impl fmt::Display for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "client {}", self.0)
    }
}

impl fmt::Display for BufferId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "buffer {}", self.0)
    }
}

/// How a client gets buffers.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ClientKind {
    /// Reserved at admission: up to `reserved` buffers are guaranteed.
    Rt { reserved: u32 },
    /// Borrows free buffers, at most `borrow_max` at once; must give them back on demand.
    Bulk { borrow_max: u32 },
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct BufferPoolConfig {
    /// Buffers at start.
    pub buffer_count: u32,
    /// The most buffers the pool may grow to (at least `buffer_count`).
    pub buffer_count_max: u32,
    pub buffer_bytes: u64,
    pub clients_max: u32,
}

/// Where a buffer is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum BufferState {
    Free,
    /// Held by a client, no I/O on it: the client may release it.
    Idle {
        client: ClientId,
    },
    /// An I/O owns it until its completion; `client` is `None` once the client is gone.
    InFlight {
        client: Option<ClientId>,
    },
}

/// What one borrower must give back.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ReturnDemand {
    pub client: ClientId,
    /// Buffers newly owed.
    pub buffers: u32,
    /// Idle buffers it holds that it can release now (at most `buffers`).
    pub idle: Vec<BufferId>,
    /// Owed beyond those: to be released as its in-flight I/O completes.
    pub after_io: u32,
}

/// The plan of one repossession: who gives back what. Empty when nothing new is needed.
#[derive(Clone, PartialEq, Eq, Default, Debug)]
pub struct Repossession {
    pub demands: Vec<ReturnDemand>,
}

/// The answer to [`BufferManager::acquire`].
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Grant {
    Buffer(BufferId),
    /// An rt client is owed a buffer that is lent out: the plan says who must return it;
    /// acquire again after they do.
    Wait(Repossession),
    /// No buffer is free for the client and the pool is below its most: add one
    /// ([`BufferManager::add_buffers`]) and acquire again.
    Grow,
}

/// What happened to a buffer whose I/O completed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum IoDone {
    /// Still held (idle) by its client.
    Held,
    /// Its client is gone: back in the pool.
    Freed,
}

/// One client's account.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ClientUsage {
    pub kind: ClientKind,
    pub held: u32,
    pub in_flight: u32,
    /// rt: buffers promised but not yet granted (waiting on repossession).
    pub claims: u32,
    /// bulk: buffers owed back.
    pub debt: u32,
}

#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BufferError {
    #[error("buffer pool of {buffer_count} buffers is outside 1..={BUFFERS_MAX}")]
    PoolSize { buffer_count: u32 },
    #[error(
        "buffer pool's most, {buffer_count_max} buffers, is outside {buffer_count}..={BUFFERS_MAX}"
    )]
    PoolMax {
        buffer_count: u32,
        buffer_count_max: u32,
    },
    #[error("the pool holds its most buffers ({buffer_count_max})")]
    PoolFull { buffer_count_max: u32 },
    #[error("buffer_bytes is zero")]
    ZeroBufferBytes,
    #[error("{clients_max} clients already registered (clients_max)")]
    ClientsMax { clients_max: u32 },
    #[error("buffers: need {need}, {left} left unreserved of {buffer_count}")]
    ReserveShort {
        need: u32,
        left: u32,
        buffer_count: u32,
    },
    #[error("unknown {0}")]
    UnknownClient(ClientId),
    #[error("unknown {0}")]
    UnknownBuffer(BufferId),
    #[error("{buffer} is not held idle by {client}")]
    NotHeld { client: ClientId, buffer: BufferId },
    #[error("{buffer} is in flight: it is released only after its completion")]
    InFlight { buffer: BufferId },
    #[error("{buffer} has no I/O in flight")]
    NotInFlight { buffer: BufferId },
    #[error("{client} already holds all {reserved} reserved buffers")]
    ReservationExhausted { client: ClientId, reserved: u32 },
    #[error("{client} already borrows {borrow_max} buffers (its limit)")]
    BorrowLimit { client: ClientId, borrow_max: u32 },
    #[error("{client} owes {debt} buffers back; it borrows nothing until it returns them")]
    InDebt { client: ClientId, debt: u32 },
    #[error("no free buffer to lend; retry after buffers are released")]
    NoFreeBuffer,
}

#[derive(Debug)]
struct Client {
    kind: ClientKind,
    held: BTreeSet<BufferId>,
    in_flight: u32,
    claims: u32,
    debt: u32,
}

/// The pool's books. Every call either succeeds and keeps the invariant or changes nothing.
#[derive(Debug)]
pub struct BufferManager {
    config: BufferPoolConfig,
    states: Vec<BufferState>,
    /// Free buffer ids, used as a stack (the most recently freed buffer is warm in cache).
    free: Vec<BufferId>,
    /// Ids of buffers taken out of the pool ([`BufferManager::remove_free_buffer`]), reused
    /// first when it grows.
    absent: Vec<BufferId>,
    /// Borrowers refused while holding none, in the order they were refused: the free
    /// buffers are theirs before anyone else's.
    waiting: Vec<ClientId>,
    clients: BTreeMap<ClientId, Client>,
    next_client: u64,
    reserved_total: u32,
    claims_total: u32,
    debt_total: u32,
    orphans: u32,
}

impl BufferManager {
    pub fn new(config: BufferPoolConfig) -> Result<BufferManager, BufferError> {
        // A pool may start empty when it may grow.
        if config.buffer_count_max == 0 || config.buffer_count > BUFFERS_MAX {
            return Err(BufferError::PoolSize {
                buffer_count: config.buffer_count,
            });
        }
        if config.buffer_count_max < config.buffer_count || config.buffer_count_max > BUFFERS_MAX {
            return Err(BufferError::PoolMax {
                buffer_count: config.buffer_count,
                buffer_count_max: config.buffer_count_max,
            });
        }
        if config.buffer_bytes == 0 {
            return Err(BufferError::ZeroBufferBytes);
        }
        Ok(BufferManager {
            config,
            states: vec![BufferState::Free; config.buffer_count as usize],
            free: (0..config.buffer_count).rev().map(BufferId).collect(),
            absent: Vec::new(),
            waiting: Vec::new(),
            clients: BTreeMap::new(),
            next_client: 0,
            reserved_total: 0,
            claims_total: 0,
            debt_total: 0,
            orphans: 0,
        })
    }

    pub fn config(&self) -> &BufferPoolConfig {
        &self.config
    }

    /// Buffers in the pool now.
    pub fn buffer_count(&self) -> u32 {
        self.config.buffer_count
    }

    /// Adds `n` free buffers (the driver mapped them). Err, and nothing added, past the most.
    pub fn add_buffers(&mut self, n: u32) -> Result<(), BufferError> {
        let max = self.config.buffer_count_max;
        if self.config.buffer_count.saturating_add(n) > max {
            return Err(BufferError::PoolFull {
                buffer_count_max: max,
            });
        }
        for _ in 0..n {
            let id = self.absent.pop().unwrap_or_else(|| {
                self.states.push(BufferState::Free);
                BufferId(self.states.len() as u32 - 1)
            });
            self.states[id.0 as usize] = BufferState::Free;
            self.free.push(id);
        }
        self.config.buffer_count += n;
        self.check();
        Ok(())
    }

    /// Takes one free buffer out of the pool, if one is free that no rt claim or waiting
    /// borrower is owed and the reservations still fit without it; the driver unmaps its own.
    pub fn remove_free_buffer(&mut self) -> Option<BufferId> {
        let promised = self.claims_total + self.waiting.len() as u32;
        if self.free.len() as u32 <= promised || self.config.buffer_count <= self.reserved_total {
            return None;
        }
        let id = self.free.pop()?;
        self.absent.push(id);
        self.config.buffer_count -= 1;
        self.check();
        Some(id)
    }

    /// Buffers to add before an rt reservation of `reserved` fits the pool as it is now
    /// (0: it fits); Err when it would not fit even in the most the pool may have.
    pub fn reserve_growth(&self, reserved: u32) -> Result<u32, BufferError> {
        let max = self.config.buffer_count_max;
        let left = max - self.reserved_total;
        if reserved > left {
            return Err(BufferError::ReserveShort {
                need: reserved,
                left,
                buffer_count: max,
            });
        }
        Ok((self.reserved_total + reserved).saturating_sub(self.config.buffer_count))
    }

    /// Registers a client. An rt client's reservation must fit in what is not reserved yet
    /// (lent-out buffers count as available: they will be repossessed).
    pub fn add_client(&mut self, kind: ClientKind) -> Result<ClientId, BufferError> {
        if self.clients.len() >= self.config.clients_max as usize {
            return Err(BufferError::ClientsMax {
                clients_max: self.config.clients_max,
            });
        }
        if let ClientKind::Rt { reserved } = kind {
            let left = self.config.buffer_count - self.reserved_total;
            if reserved > left {
                return Err(BufferError::ReserveShort {
                    need: reserved,
                    left,
                    buffer_count: self.config.buffer_count,
                });
            }
            self.reserved_total += reserved;
        }
        let id = ClientId(self.next_client);
        self.next_client += 1;
        let client = Client {
            kind,
            held: BTreeSet::new(),
            in_flight: 0,
            claims: 0,
            debt: 0,
        };
        self.clients.insert(id, client);
        Ok(id)
    }

    /// Removes a client: idle buffers go back to the pool now, in-flight ones when their
    /// completion arrives; its reservation, claims and debts end.
    pub fn remove_client(&mut self, client: ClientId) -> Result<(), BufferError> {
        let c = self
            .clients
            .remove(&client)
            .ok_or(BufferError::UnknownClient(client))?;
        for &b in &c.held {
            match self.states[b.0 as usize] {
                BufferState::Idle { .. } => {
                    self.states[b.0 as usize] = BufferState::Free;
                    self.free.push(b);
                }
                BufferState::InFlight { .. } => {
                    self.states[b.0 as usize] = BufferState::InFlight { client: None };
                    self.orphans += 1;
                }
                BufferState::Free => unreachable!("a held buffer is never free"),
            }
        }
        self.waiting.retain(|&w| w != client);
        if let ClientKind::Rt { reserved } = c.kind {
            self.reserved_total -= reserved;
        }
        self.claims_total -= c.claims;
        self.debt_total -= c.debt;
        self.check();
        Ok(())
    }

    /// A buffer for `client`. rt: within its reservation, always granted or (when lent out)
    /// `Wait` with the repossession plan; an rt client has at most one claim outstanding, so
    /// it gets lent-out buffers back one at a time and a retry while waiting claims nothing
    /// more. bulk: a free buffer not promised to an rt claim,
    /// within its limit, unless it owes buffers.
    pub fn acquire(&mut self, client: ClientId) -> Result<Grant, BufferError> {
        let claims_total = self.claims_total;
        let free = self.free.len() as u32;
        let can_grow = self.config.buffer_count < self.config.buffer_count_max;
        let waiting = self.waiting.len() as u32;
        let is_waiting = self.waiting.contains(&client);
        let c = self
            .clients
            .get_mut(&client)
            .ok_or(BufferError::UnknownClient(client))?;
        let held = c.held.len() as u32;
        match c.kind {
            ClientKind::Rt { reserved } => {
                if held >= reserved {
                    return Err(BufferError::ReservationExhausted { client, reserved });
                }
                if free > claims_total - c.claims {
                    if c.claims > 0 {
                        c.claims -= 1;
                        self.claims_total -= 1;
                    }
                } else if can_grow && c.claims == 0 {
                    return Ok(Grant::Grow);
                } else {
                    // One claim outstanding per client: a retry while waiting must not
                    // repossess more than the client can use.
                    if c.claims == 0 {
                        c.claims += 1;
                        self.claims_total += 1;
                    }
                    let plan = self.repossess();
                    return Ok(Grant::Wait(plan));
                }
            }
            ClientKind::Bulk { borrow_max } => {
                if c.debt > 0 {
                    return Err(BufferError::InDebt {
                        client,
                        debt: c.debt,
                    });
                }
                if held >= borrow_max {
                    return Err(BufferError::BorrowLimit { client, borrow_max });
                }
                // Free buffers are the waiting borrowers' first; a waiting one takes any
                // (its turn comes as buffers are released; the driver steps them in order).
                let owed = claims_total + if is_waiting { 0 } else { waiting };
                if free <= owed {
                    if can_grow {
                        return Ok(Grant::Grow);
                    }
                    if held == 0 && !is_waiting {
                        self.waiting.push(client);
                    }
                    return Err(BufferError::NoFreeBuffer);
                }
                if is_waiting {
                    self.waiting.retain(|&w| w != client);
                }
            }
        }
        // Invariant: `free > 0` was established by the checks above.
        let b = self
            .free
            .pop()
            .expect("free list empty after a free-count check");
        self.states[b.0 as usize] = BufferState::Idle { client };
        self.clients
            .get_mut(&client)
            .expect("client looked up above")
            .held
            .insert(b);
        self.check();
        Ok(Grant::Buffer(b))
    }

    /// Backs every outstanding rt claim: for claims not covered by free buffers, existing
    /// debts and orphans, puts new debts on the borrowers holding the most (not yet owed)
    /// buffers, one at a time, so the greediest give back first. Returns the new demands.
    pub fn repossess(&mut self) -> Repossession {
        let backed = self.free.len() as u32 + self.debt_total + self.orphans;
        let mut shortfall = self.claims_total.saturating_sub(backed);
        let mut added: BTreeMap<ClientId, u32> = BTreeMap::new();
        while shortfall > 0 {
            let victim = self
                .clients
                .iter()
                .filter(|(_, c)| matches!(c.kind, ClientKind::Bulk { .. }))
                .map(|(&id, c)| (c.held.len() as u32 - c.debt, id))
                .filter(|&(owable, _)| owable > 0)
                // Most owable first; ties to the lowest id (max_by_key keeps the last max).
                .max_by_key(|&(owable, id)| (owable, std::cmp::Reverse(id)));
            // Σ reserved <= buffer_count guarantees a borrower exists (module docs).
            let (_, id) = victim.expect("rt claim with no borrower to repossess from");
            self.clients.get_mut(&id).expect("victim exists").debt += 1;
            self.debt_total += 1;
            *added.entry(id).or_default() += 1;
            shortfall -= 1;
        }
        let demands = added
            .into_iter()
            .map(|(client, buffers)| {
                let c = &self.clients[&client];
                let idle: Vec<BufferId> = c
                    .held
                    .iter()
                    .copied()
                    .filter(|b| matches!(self.states[b.0 as usize], BufferState::Idle { .. }))
                    .take(buffers as usize)
                    .collect();
                let after_io = buffers - idle.len() as u32;
                ReturnDemand {
                    client,
                    buffers,
                    idle,
                    after_io,
                }
            })
            .collect();
        self.check();
        Repossession { demands }
    }

    /// Marks an idle buffer of `client` as the target of an I/O.
    pub fn start_io(&mut self, client: ClientId, buffer: BufferId) -> Result<(), BufferError> {
        self.held_idle(client, buffer)?;
        self.states[buffer.0 as usize] = BufferState::InFlight {
            client: Some(client),
        };
        self.clients
            .get_mut(&client)
            .expect("checked by held_idle")
            .in_flight += 1;
        Ok(())
    }

    /// The I/O on `buffer` completed: it is idle again, or free if its client is gone.
    pub fn finish_io(&mut self, buffer: BufferId) -> Result<IoDone, BufferError> {
        let state = *self
            .states
            .get(buffer.0 as usize)
            .ok_or(BufferError::UnknownBuffer(buffer))?;
        let BufferState::InFlight { client } = state else {
            return Err(BufferError::NotInFlight { buffer });
        };
        match client {
            Some(client) => {
                self.states[buffer.0 as usize] = BufferState::Idle { client };
                self.clients
                    .get_mut(&client)
                    .expect("in-flight owner exists")
                    .in_flight -= 1;
                Ok(IoDone::Held)
            }
            None => {
                self.states[buffer.0 as usize] = BufferState::Free;
                self.free.push(buffer);
                self.orphans -= 1;
                self.check();
                Ok(IoDone::Freed)
            }
        }
    }

    /// `client` gives an idle buffer back; it pays a debt first if there is one.
    pub fn release(&mut self, client: ClientId, buffer: BufferId) -> Result<(), BufferError> {
        self.held_idle(client, buffer)?;
        self.states[buffer.0 as usize] = BufferState::Free;
        self.free.push(buffer);
        let c = self.clients.get_mut(&client).expect("checked by held_idle");
        c.held.remove(&buffer);
        if c.debt > 0 {
            c.debt -= 1;
            self.debt_total -= 1;
        }
        self.check();
        Ok(())
    }

    pub fn state(&self, buffer: BufferId) -> Result<BufferState, BufferError> {
        self.states
            .get(buffer.0 as usize)
            .copied()
            .ok_or(BufferError::UnknownBuffer(buffer))
    }

    pub fn usage(&self, client: ClientId) -> Result<ClientUsage, BufferError> {
        let c = self
            .clients
            .get(&client)
            .ok_or(BufferError::UnknownClient(client))?;
        Ok(ClientUsage {
            kind: c.kind,
            held: c.held.len() as u32,
            in_flight: c.in_flight,
            claims: c.claims,
            debt: c.debt,
        })
    }

    pub fn free_count(&self) -> u32 {
        self.free.len() as u32
    }

    /// Buffers still reservable by a new rt client.
    pub fn unreserved_count(&self) -> u32 {
        self.config.buffer_count - self.reserved_total
    }

    /// Asserts the books balance. Cheap in debug builds' terms: O(buffers + clients).
    pub fn check(&self) {
        if !cfg!(debug_assertions) {
            return;
        }
        let held: usize = self.clients.values().map(|c| c.held.len()).sum();
        assert_eq!(
            self.free.len() + held + self.orphans as usize,
            self.states.len() - self.absent.len(),
            "buffers lost"
        );
        assert_eq!(
            self.config.buffer_count as usize,
            self.states.len() - self.absent.len()
        );
        assert!(self.config.buffer_count <= self.config.buffer_count_max);
        assert!(self.waiting.iter().all(|w| self.clients.contains_key(w)));
        assert!(self.reserved_total <= self.config.buffer_count);
        assert_eq!(
            self.claims_total,
            self.clients.values().map(|c| c.claims).sum::<u32>()
        );
        assert_eq!(
            self.debt_total,
            self.clients.values().map(|c| c.debt).sum::<u32>()
        );
        assert!(
            self.claims_total <= self.free.len() as u32 + self.debt_total + self.orphans,
            "an rt claim is not backed"
        );
        for (id, c) in &self.clients {
            assert!(
                c.debt as usize <= c.held.len(),
                "{id} owes more than it holds"
            );
            if let ClientKind::Rt { reserved } = c.kind {
                assert!(
                    c.held.len() as u32 + c.claims <= reserved,
                    "{id} holds beyond its reservation"
                );
            }
            for b in &c.held {
                let s = self.states[b.0 as usize];
                assert!(
                    s == BufferState::Idle { client: *id }
                        || s == BufferState::InFlight { client: Some(*id) },
                    "{b} held by {id} but in state {s:?}"
                );
            }
        }
    }

    fn held_idle(&self, client: ClientId, buffer: BufferId) -> Result<(), BufferError> {
        if !self.clients.contains_key(&client) {
            return Err(BufferError::UnknownClient(client));
        }
        match self.state(buffer)? {
            BufferState::Idle { client: c } if c == client => Ok(()),
            BufferState::InFlight { client: Some(c) } if c == client => {
                Err(BufferError::InFlight { buffer })
            }
            _ => Err(BufferError::NotHeld { client, buffer }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(buffer_count: u32) -> BufferManager {
        BufferManager::new(BufferPoolConfig {
            buffer_count,
            buffer_count_max: buffer_count,
            buffer_bytes: 1 << 20,
            clients_max: 8,
        })
        .unwrap()
    }

    fn take(m: &mut BufferManager, c: ClientId) -> BufferId {
        match m.acquire(c).unwrap() {
            Grant::Buffer(b) => b,
            g => panic!("expected a buffer, got {g:?}"),
        }
    }

    #[test]
    fn rt_reservation_is_guaranteed_through_repossession() {
        let mut m = pool(4);
        let rt = m.add_client(ClientKind::Rt { reserved: 3 }).unwrap();
        let bulk = m.add_client(ClientKind::Bulk { borrow_max: 4 }).unwrap();
        let b: Vec<BufferId> = (0..4).map(|_| take(&mut m, bulk)).collect();
        m.start_io(bulk, b[0]).unwrap();
        m.start_io(bulk, b[1]).unwrap();
        // The pool is lent out: rt asks, bulk is told what to give back.
        let Grant::Wait(plan) = m.acquire(rt).unwrap() else {
            panic!("pool is empty")
        };
        assert_eq!(plan.demands.len(), 1);
        let d = &plan.demands[0];
        assert_eq!((d.client, d.buffers, d.after_io), (bulk, 1, 0));
        assert_eq!(d.idle, [b[2]]);
        // Asking again does not double the claim.
        assert_eq!(m.acquire(rt).unwrap(), Grant::Wait(Repossession::default()));
        assert_eq!(
            m.acquire(bulk),
            Err(BufferError::InDebt {
                client: bulk,
                debt: 1
            })
        );
        // In-flight buffers cannot be taken back.
        assert_eq!(
            m.release(bulk, b[0]),
            Err(BufferError::InFlight { buffer: b[0] })
        );
        m.release(bulk, b[2]).unwrap();
        assert_eq!(take(&mut m, rt), b[2]);
        // Second and third: one idle left, then only in-flight ones, owed after I/O.
        let Grant::Wait(plan) = m.acquire(rt).unwrap() else {
            panic!()
        };
        assert_eq!(plan.demands[0].idle, [b[3]]);
        m.release(bulk, b[3]).unwrap();
        take(&mut m, rt);
        let Grant::Wait(plan) = m.acquire(rt).unwrap() else {
            panic!()
        };
        assert_eq!((plan.demands[0].buffers, plan.demands[0].after_io), (1, 1));
        assert_eq!(m.finish_io(b[0]), Ok(IoDone::Held));
        m.release(bulk, b[0]).unwrap();
        take(&mut m, rt);
        assert!(matches!(
            m.acquire(rt),
            Err(BufferError::ReservationExhausted { reserved: 3, .. })
        ));
    }

    #[test]
    fn bulk_cannot_borrow_a_buffer_promised_to_rt_and_respects_its_limit() {
        let mut m = pool(2);
        let rt = m.add_client(ClientKind::Rt { reserved: 1 }).unwrap();
        let b1 = m.add_client(ClientKind::Bulk { borrow_max: 1 }).unwrap();
        let b2 = m.add_client(ClientKind::Bulk { borrow_max: 2 }).unwrap();
        let x = take(&mut m, b1);
        assert!(matches!(
            m.acquire(b1),
            Err(BufferError::BorrowLimit { .. })
        ));
        take(&mut m, b2);
        assert!(matches!(m.acquire(rt).unwrap(), Grant::Wait(_)));
        // b1 and b2 hold one each; the tie goes to the lower id, b1.
        assert_eq!(m.usage(b1).unwrap().debt, 1);
        m.release(b1, x).unwrap();
        // The freed buffer is promised to rt: bulk b2 cannot take it.
        assert_eq!(m.acquire(b2), Err(BufferError::NoFreeBuffer));
        take(&mut m, rt);
    }

    #[test]
    fn removed_client_in_flight_buffer_returns_on_completion() {
        let mut m = pool(2);
        let bulk = m.add_client(ClientKind::Bulk { borrow_max: 2 }).unwrap();
        let a = take(&mut m, bulk);
        let b = take(&mut m, bulk);
        m.start_io(bulk, a).unwrap();
        m.remove_client(bulk).unwrap();
        assert_eq!(m.state(b), Ok(BufferState::Free));
        assert_eq!(m.state(a), Ok(BufferState::InFlight { client: None }));
        assert_eq!(m.free_count(), 1);
        // An rt client may reserve both: the orphan is on its way back.
        let rt = m.add_client(ClientKind::Rt { reserved: 2 }).unwrap();
        take(&mut m, rt);
        assert_eq!(m.acquire(rt), Ok(Grant::Wait(Repossession::default())));
        assert_eq!(m.finish_io(a), Ok(IoDone::Freed));
        assert_eq!(take(&mut m, rt), a);
    }

    #[test]
    fn bad_input_changes_nothing() {
        let mut m = pool(4);
        let rt = m.add_client(ClientKind::Rt { reserved: 3 }).unwrap();
        assert_eq!(
            m.add_client(ClientKind::Rt { reserved: 2 }),
            Err(BufferError::ReserveShort {
                need: 2,
                left: 1,
                buffer_count: 4
            })
        );
        assert_eq!(m.unreserved_count(), 1);
        let b = take(&mut m, rt);
        assert_eq!(m.finish_io(b), Err(BufferError::NotInFlight { buffer: b }));
        assert_eq!(
            m.release(ClientId(99), b),
            Err(BufferError::UnknownClient(ClientId(99)))
        );
        assert_eq!(
            m.release(rt, BufferId(77)),
            Err(BufferError::UnknownBuffer(BufferId(77)))
        );
        assert!(
            BufferManager::new(BufferPoolConfig {
                buffer_count: 0,
                buffer_count_max: 0,
                buffer_bytes: 1,
                clients_max: 1
            })
            .is_err()
        );
        m.check();
    }

    #[test]
    fn a_pool_below_its_most_grows_instead_of_refusing_and_gives_back_when_idle() {
        let mut m = BufferManager::new(BufferPoolConfig {
            buffer_count: 1,
            buffer_count_max: 3,
            buffer_bytes: 1 << 20,
            clients_max: 8,
        })
        .unwrap();
        let a = m.add_client(ClientKind::Bulk { borrow_max: 4 }).unwrap();
        let b = m.add_client(ClientKind::Bulk { borrow_max: 4 }).unwrap();
        let x = take(&mut m, a);
        assert_eq!(m.acquire(b), Ok(Grant::Grow));
        m.add_buffers(1).unwrap();
        let y = take(&mut m, b);
        assert_eq!(m.acquire(a), Ok(Grant::Grow));
        m.add_buffers(1).unwrap();
        let z = take(&mut m, a);
        assert_eq!(m.acquire(b), Err(BufferError::NoFreeBuffer), "at its most");
        assert_eq!(
            m.add_buffers(1),
            Err(BufferError::PoolFull {
                buffer_count_max: 3
            })
        );
        // An rt reservation is checked against the most, and says what to add first.
        assert_eq!(m.reserve_growth(3), Ok(0));
        assert!(m.reserve_growth(4).is_err());
        for (c, buf) in [(a, x), (b, y), (a, z)] {
            m.release(c, buf).unwrap();
        }
        assert!(m.remove_free_buffer().is_some());
        assert!(m.remove_free_buffer().is_some());
        assert_eq!(m.buffer_count(), 1);
        assert_eq!(m.reserve_growth(2), Ok(1));
        m.add_buffers(2).unwrap();
        assert_eq!(m.buffer_count(), 3);
        m.check();
    }

    #[test]
    fn a_borrower_holding_none_gets_the_next_free_buffer_before_one_that_holds_some() {
        let mut m = pool(2);
        let a = m.add_client(ClientKind::Bulk { borrow_max: 4 }).unwrap();
        let b = m.add_client(ClientKind::Bulk { borrow_max: 4 }).unwrap();
        let c = m.add_client(ClientKind::Bulk { borrow_max: 4 }).unwrap();
        let x = take(&mut m, a);
        let y = take(&mut m, a);
        assert_eq!(m.acquire(b), Err(BufferError::NoFreeBuffer));
        assert_eq!(m.acquire(c), Err(BufferError::NoFreeBuffer));
        // `a` gives one back and asks again at once: the buffer is b's, then c's.
        m.release(a, x).unwrap();
        assert_eq!(m.acquire(a), Err(BufferError::NoFreeBuffer));
        let bx = take(&mut m, b);
        m.release(a, y).unwrap();
        assert_eq!(
            m.acquire(a),
            Err(BufferError::NoFreeBuffer),
            "c waits first"
        );
        assert_eq!(m.acquire(b), Err(BufferError::NoFreeBuffer), "b holds one");
        let cy = take(&mut m, c);
        m.release(b, bx).unwrap();
        let ax = take(&mut m, a);
        m.remove_client(c).unwrap();
        let _ = (cy, ax);
        m.check();
    }
}
