//! Random arrivals (bursts and idle gaps), quanta and the in-flight bound changed at run
//! time, one or two devices. Checked after every event:
//! - a class with nothing queued on a device has no deficit there (DRR drops it);
//! - EDF inside `rt`: an rt request chosen for round `r` has a deadline no later than any rt
//!   request that was already waiting when round `r` was formed and went to a later round;
//! - no starvation in `bulk`: a request waits at most `⌈(ahead + cost + M) / Q⌉` rounds,
//!   where `ahead` is the cost queued before it in its class;
//! - dispatch never exceeds the in-flight bound in force; the scheduler's counters agree
//!   with the simulation's books; everything submitted is served exactly once.

use std::collections::HashMap;

use penstock_core::sched::drr::{
    DeviceId, IoScheduler, Request, RequestId, SchedConfig, SchedError,
};
use penstock_core::time::Instant;

use crate::rng::Rng;
use crate::{Violation, ensure, tag};

const STEPS: usize = 3000;

#[derive(Clone, Copy, Debug)]
struct Submitted {
    request: Request,
    /// Rounds formed on its device when it was submitted.
    round_at_submit: u64,
    /// Cost queued ahead of it in its class on its device (bulk's starvation bound).
    ahead_bytes: u64,
    /// Smallest quantum of its class while it waited.
    quantum_min_bytes: u64,
}

#[derive(Clone, Copy, Debug)]
struct Dispatched {
    submitted: Submitted,
    round: u64,
}

pub fn run(seed: u64) -> Result<(), Violation> {
    tag(seed, "mixed", run_inner(seed))
}

fn run_inner(seed: u64) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let max_request_bytes = 128 * 1024;
    let mut config = SchedConfig::rt_bulk(
        rng.range(max_request_bytes, 8 * max_request_bytes),
        rng.range(max_request_bytes, 4 * max_request_bytes),
        max_request_bytes,
        rng.range(1, 8) as u32,
    );
    config.devices = rng.range(1, 2) as u32;
    config.classes[0].queue_max = 64;
    config.classes[1].queue_max = 64;
    let devices = config.devices as usize;
    let mut s = IoScheduler::new(config).map_err(|e| e.to_string())?;
    let (rt, bulk) = (s.class("rt").unwrap(), s.class("bulk").unwrap());
    let classes = [rt, bulk];
    let cost_max = s.cost_bytes(max_request_bytes);

    let mut waiting: HashMap<RequestId, Submitted> = HashMap::new();
    let mut inflight: Vec<RequestId> = Vec::new();
    let mut done: Vec<Dispatched> = Vec::new();
    let mut dispatched_at: HashMap<RequestId, Dispatched> = HashMap::new();
    let mut next_id = 0u64;
    let mut now = Instant::ZERO;
    let mut served = 0u64;

    for step in 0..STEPS + 10_000 {
        let draining = step >= STEPS;
        now = Instant::from_nanos(now.as_nanos() + rng.range(0, 1000));
        let action = rng.range(0, 99);
        if !draining && action < 40 {
            // A burst of submissions.
            for _ in 0..rng.range(1, 6) {
                let class = *rng.pick(&classes);
                let device = DeviceId(rng.range(0, devices as u64 - 1) as u32);
                let len_bytes = if rng.chance(5) {
                    0
                } else {
                    rng.range(1, max_request_bytes)
                };
                let deadline = (class == rt && rng.chance(90))
                    .then(|| Instant::from_nanos(now.as_nanos() + rng.range(0, 5_000_000)));
                let request = Request {
                    id: RequestId(next_id),
                    class,
                    device,
                    offset_bytes: rng.range(0, 1 << 32),
                    len_bytes,
                    deadline,
                };
                let ahead_bytes = waiting
                    .values()
                    .filter(|w| w.request.class == class && w.request.device == device)
                    .map(|w| s.cost_bytes(w.request.len_bytes))
                    .sum();
                let round_at_submit = s.rounds(device).unwrap();
                match s.submit(now, request) {
                    Ok(()) => {
                        let quantum_min_bytes = s.quantum_bytes(class).unwrap();
                        waiting.insert(
                            request.id,
                            Submitted {
                                request,
                                round_at_submit,
                                ahead_bytes,
                                quantum_min_bytes,
                            },
                        );
                        next_id += 1;
                    }
                    Err(SchedError::QueueFull { .. }) => {
                        let queued = waiting
                            .values()
                            .filter(|w| w.request.class == class)
                            .count();
                        ensure!(
                            queued == 64,
                            "QueueFull with {queued} queued (queue_max 64)"
                        );
                    }
                    Err(e) => return Err(format!("submit: {e}")),
                }
            }
        } else if !draining && action < 43 {
            let class = *rng.pick(&classes);
            let q = rng.range(cost_max, 8 * cost_max);
            s.set_quantum(class, q).map_err(|e| e.to_string())?;
            for w in waiting.values_mut().filter(|w| w.request.class == class) {
                w.quantum_min_bytes = w.quantum_min_bytes.min(q);
            }
        } else if !draining && action < 45 {
            s.set_inflight_max(rng.range(1, 8) as u32)
                .map_err(|e| e.to_string())?;
        } else if action < 75 || inflight.is_empty() {
            let inflight_before: Vec<u32> = (0..devices)
                .map(|d| s.inflight(DeviceId(d as u32)).unwrap())
                .collect();
            if let Some(r) = s.poll_dispatch(now) {
                let d = r.device.0 as usize;
                ensure!(
                    inflight_before[d] < s.inflight_max(),
                    "dispatched on device {d} with {} in flight, bound {}",
                    inflight_before[d],
                    s.inflight_max()
                );
                let submitted = waiting
                    .remove(&r.id)
                    .ok_or(format!("dispatched unknown {:?}", r.id))?;
                ensure!(
                    submitted.request == r,
                    "dispatched request differs from the submitted one"
                );
                let round = s.rounds(r.device).unwrap();
                dispatched_at.insert(r.id, Dispatched { submitted, round });
                inflight.push(r.id);
            }
        } else {
            let at = rng.range(0, inflight.len() as u64 - 1) as usize;
            let id = inflight.swap_remove(at);
            let r = s.complete(now, id).map_err(|e| format!("complete: {e}"))?;
            ensure!(r.id == id, "completed the wrong request");
            done.push(
                dispatched_at
                    .remove(&id)
                    .expect("in flight implies dispatched"),
            );
            served += 1;
        }
        // Invariants after every event.
        for &class in &classes {
            let c = s.counters(class).unwrap();
            let queued = waiting
                .values()
                .filter(|w| w.request.class == class)
                .count() as u64;
            let flying = dispatched_at
                .values()
                .filter(|d| d.submitted.request.class == class)
                .count() as u64;
            ensure!(
                c.queued == queued && c.inflight == flying,
                "counters {c:?} vs books queued {queued} in flight {flying}"
            );
            for d in 0..devices {
                let dev = DeviceId(d as u32);
                let any = waiting
                    .values()
                    .any(|w| w.request.class == class && w.request.device == dev);
                let deficit = s.deficit_bytes(dev, class).unwrap();
                ensure!(
                    any || deficit == 0,
                    "class {class:?} has nothing queued on device {d} but deficit {deficit}"
                );
            }
        }
        if draining && waiting.is_empty() && inflight.is_empty() {
            break;
        }
    }
    ensure!(
        waiting.is_empty() && inflight.is_empty(),
        "not drained: {} waiting, {} in flight",
        waiting.len(),
        inflight.len()
    );
    ensure!(served == next_id, "served {served} of {next_id} submitted");
    ensure!(s.is_idle(), "scheduler not idle after drain");
    check_edf(&done, rt)?;
    check_bulk_wait(&done, bulk, cost_max)
}

fn deadline_key(r: &Request) -> Instant {
    r.deadline.unwrap_or(Instant::MAX)
}

fn check_edf(done: &[Dispatched], rt: penstock_core::sched::drr::ClassId) -> Result<(), String> {
    let rt_done: Vec<&Dispatched> = done
        .iter()
        .filter(|d| d.submitted.request.class == rt)
        .collect();
    for x in &rt_done {
        for y in &rt_done {
            let (xr, yr) = (&x.submitted.request, &y.submitted.request);
            if xr.device != yr.device {
                continue;
            }
            // y's round was formed while x waited, and x was left for later.
            if y.round > x.submitted.round_at_submit && y.round < x.round {
                ensure!(
                    deadline_key(yr) <= deadline_key(xr),
                    "EDF: {:?} (deadline {:?}) went in round {} before {:?} (deadline {:?}, waiting since round {}, served in round {})",
                    yr.id,
                    yr.deadline,
                    y.round,
                    xr.id,
                    xr.deadline,
                    x.submitted.round_at_submit,
                    x.round
                );
            }
        }
    }
    Ok(())
}

fn check_bulk_wait(
    done: &[Dispatched],
    bulk: penstock_core::sched::drr::ClassId,
    cost_max: u64,
) -> Result<(), String> {
    for d in done.iter().filter(|d| d.submitted.request.class == bulk) {
        let w = &d.submitted;
        let cost = w.request.len_bytes.max(1);
        let bound = (w.ahead_bytes + cost + cost_max).div_ceil(w.quantum_min_bytes);
        let waited = d.round - w.round_at_submit;
        ensure!(
            waited <= bound,
            "bulk {:?} waited {waited} rounds, bound {bound} ({} B ahead, quantum >= {} B)",
            w.request.id,
            w.ahead_bytes,
            w.quantum_min_bytes
        );
    }
    Ok(())
}
