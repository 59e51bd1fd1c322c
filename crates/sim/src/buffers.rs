//! Buffer lending and repossession under random operations.
//!
//! A few rt and bulk clients acquire, start and finish I/O, and release buffers at random;
//! the driver side (this simulation) honours every repossession: it releases the idle
//! buffers it is asked for, and owed in-flight ones as soon as their I/O completes. Checked:
//! - the books balance after every operation ([`BufferManager::check`]);
//! - an in-flight buffer is never released (data is never lost);
//! - an rt client below its reservation is never refused; while it waits it retries every
//!   step, and the first retry after every debt is paid is granted;
//! - bulk never holds more than its limit.

use penstock_core::buffers::{
    BufferError, BufferId, BufferManager, BufferPoolConfig, ClientId, ClientKind, Grant,
};

use crate::rng::Rng;
use crate::{Violation, ensure, tag};

const STEPS: usize = 3000;
/// A generous bound on how long an rt client may wait for a repossessed buffer (it waits
/// only for the borrowers' I/O completions, which happen at random here); the exact
/// property is "granted on the first retry after every debt is paid".
const WAIT_STEPS_MAX: usize = 2000;

#[derive(Debug)]
struct Sim {
    id: ClientId,
    rt: bool,
    idle: Vec<BufferId>,
    flying: Vec<BufferId>,
    limit: u32,
    waiting_since: Option<usize>,
}

pub fn run(seed: u64) -> Result<(), Violation> {
    tag(seed, "buffers", run_inner(seed))
}

fn run_inner(seed: u64) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let buffer_count = rng.range(4, 32) as u32;
    let mut m = BufferManager::new(BufferPoolConfig {
        buffer_count,
        // A pool that never grows: repossession is what this simulation checks.
        buffer_count_max: buffer_count,
        buffer_bytes: 1 << 20,
        clients_max: 16,
    })
    .map_err(|e| e.to_string())?;
    let mut clients: Vec<Sim> = Vec::new();
    for _ in 0..rng.range(1, 3) {
        let reserved = rng.range(1, u64::from(m.unreserved_count()).max(1)) as u32;
        if let Ok(id) = m.add_client(ClientKind::Rt { reserved }) {
            clients.push(Sim {
                id,
                rt: true,
                idle: vec![],
                flying: vec![],
                limit: reserved,
                waiting_since: None,
            });
        }
    }
    for _ in 0..rng.range(1, 4) {
        let borrow_max = rng.range(1, u64::from(buffer_count)) as u32;
        let id = m
            .add_client(ClientKind::Bulk { borrow_max })
            .map_err(|e| e.to_string())?;
        clients.push(Sim {
            id,
            rt: false,
            idle: vec![],
            flying: vec![],
            limit: borrow_max,
            waiting_since: None,
        });
    }
    for step in 0..STEPS {
        let ci = rng.range(0, clients.len() as u64 - 1) as usize;
        let action = rng.range(0, 99);
        let c = &mut clients[ci];
        if action < 35 {
            let held = (c.idle.len() + c.flying.len()) as u32;
            match m.acquire(c.id) {
                Ok(Grant::Buffer(b)) => {
                    c.idle.push(b);
                    c.waiting_since = None;
                }
                Ok(Grant::Grow) => return Err("a pool at its most asked to grow".into()),
                Ok(Grant::Wait(plan)) => {
                    ensure!(c.rt, "bulk got Wait");
                    c.waiting_since.get_or_insert(step);
                    honour(&mut m, &mut clients, plan)?;
                }
                Err(BufferError::ReservationExhausted { .. }) => {
                    ensure!(c.rt && held >= c.limit, "rt refused below reservation")
                }
                Err(BufferError::BorrowLimit { .. }) => {
                    ensure!(!c.rt && held >= c.limit, "bulk refused below its limit")
                }
                Err(BufferError::InDebt { .. } | BufferError::NoFreeBuffer) => {
                    ensure!(!c.rt, "rt refused: lent-out")
                }
                Err(e) => return Err(format!("acquire: {e}")),
            }
        } else if action < 60 {
            if let Some(b) = c.idle.pop() {
                m.start_io(c.id, b).map_err(|e| format!("start_io: {e}"))?;
                c.flying.push(b);
            }
        } else if action < 85 {
            if !c.flying.is_empty() {
                let at = rng.range(0, c.flying.len() as u64 - 1) as usize;
                let b = c.flying.swap_remove(at);
                ensure!(
                    m.release(c.id, b) == Err(BufferError::InFlight { buffer: b }),
                    "in-flight buffer released"
                );
                m.finish_io(b).map_err(|e| format!("finish_io: {e}"))?;
                c.idle.push(b);
            }
        } else if let Some(b) = c.idle.pop() {
            m.release(c.id, b).map_err(|e| format!("release: {e}"))?;
        }
        // Debtors pay with idle buffers as soon as they have them (the driver's duty).
        for c in clients.iter_mut().filter(|c| !c.rt) {
            let debt = m.usage(c.id).map_err(|e| e.to_string())?.debt;
            for _ in 0..debt.min(c.idle.len() as u32) {
                let b = c.idle.pop().expect("bounded by idle.len()");
                m.release(c.id, b).map_err(|e| e.to_string())?;
            }
        }
        // Waiting rt clients retry; once every debt is paid, the retry must be granted.
        let debts: u32 = clients
            .iter()
            .map(|c| m.usage(c.id).map_or(0, |u| u.debt))
            .sum();
        for i in 0..clients.len() {
            if clients[i].waiting_since.is_none() {
                continue;
            }
            match m
                .acquire(clients[i].id)
                .map_err(|e| format!("rt retry: {e}"))?
            {
                Grant::Buffer(b) => {
                    clients[i].idle.push(b);
                    clients[i].waiting_since = None;
                }
                Grant::Grow => return Err("a pool at its most asked to grow".into()),
                Grant::Wait(plan) => {
                    ensure!(
                        debts > 0,
                        "all debts paid, yet rt {} still waits",
                        clients[i].id
                    );
                    honour(&mut m, &mut clients, plan)?;
                }
            }
        }
        m.check();
        for c in &clients {
            let u = m.usage(c.id).map_err(|e| e.to_string())?;
            ensure!(
                u.held as usize == c.idle.len() + c.flying.len(),
                "books differ for {}",
                c.id
            );
            ensure!(
                c.rt || u.held <= c.limit,
                "bulk {} holds {} over its limit {}",
                c.id,
                u.held,
                c.limit
            );
            if let Some(since) = c.waiting_since {
                ensure!(
                    step - since <= WAIT_STEPS_MAX,
                    "rt {} waited {} steps for a reserved buffer",
                    c.id,
                    step - since
                );
            }
        }
    }
    Ok(())
}

/// The driver's side of a repossession: each borrower releases the idle buffers named now;
/// the rest is paid as in-flight I/O completes (see the debt loop in `run_inner`).
fn honour(
    m: &mut BufferManager,
    clients: &mut [Sim],
    plan: penstock_core::buffers::Repossession,
) -> Result<(), String> {
    for d in plan.demands {
        ensure!(
            d.idle.len() as u32 + d.after_io == d.buffers,
            "demand does not add up: {d:?}"
        );
        let owner = clients
            .iter_mut()
            .find(|o| o.id == d.client)
            .ok_or("demand on unknown client")?;
        ensure!(!owner.rt, "repossession from an rt client");
        for b in d.idle {
            owner.idle.retain(|&x| x != b);
            m.release(owner.id, b)
                .map_err(|e| format!("release demanded idle: {e}"))?;
        }
    }
    Ok(())
}
