//! DRR shares with every class backlogged (the seastar `fair_queue_test` shape: no clock, no
//! disk; dispatch and complete by hand).
//!
//! Checked, per device, over every window of consecutive complete rounds (all O(R²) of
//! them), for every class `i` with quantum `Q_i` and largest request cost `M`:
//! - the weighted-share bound: `|served_i - total · Q_i / ΣQ| ≤ Q_i + M`;
//! - the tighter per-round identity: `|served_i - k · Q_i| < M` over `k` rounds (it follows
//!   from `0 ≤ deficit < M` at round boundaries);
//! - no starvation: every round serves every (backlogged) class at least once;
//! - the deficit stays below `M` while the class is backlogged.
//!
//! Halfway through, quanta change at run time; windows never straddle the change.

use std::collections::HashMap;

use penstock_core::sched::drr::{
    ClassConfig, ClassId, DeviceId, IoScheduler, QueueOrder, Request, RequestId, SchedConfig,
    SchedMode,
};
use penstock_core::time::Instant;

use crate::rng::Rng;
use crate::{Violation, ensure, tag};

const DISPATCHES: usize = 3000;

/// Requests served in one round, per class, in cost bytes.
type RoundCosts = Vec<u64>;

pub fn run(seed: u64) -> Result<(), Violation> {
    tag(seed, "fairness", run_inner(seed))
}

fn run_inner(seed: u64) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let classes = rng.range(2, 4) as usize;
    let devices = rng.range(1, 2) as u32;
    let max_request_bytes = 64 * 1024;
    let overhead_bytes = *rng.pick(&[0, 4096, 32 * 1024]);
    let cost_max = max_request_bytes + overhead_bytes;
    let len_min = max_request_bytes / 16;
    let inflight_max = rng.range(1, 4) as u32;
    let mut quanta: Vec<u64> = (0..classes)
        .map(|_| rng.range(cost_max, 4 * cost_max))
        .collect();
    let config = SchedConfig {
        mode: SchedMode::Drr,
        classes: (0..classes)
            .map(|i| ClassConfig {
                name: format!("c{i}"),
                quantum_bytes: quanta[i],
                quantum_max_bytes: None,
                queue_max: 4096,
                order: if i == 0 {
                    QueueOrder::Deadline
                } else {
                    QueueOrder::Arrival
                },
            })
            .collect(),
        devices,
        max_request_bytes,
        request_overhead_bytes: overhead_bytes,
        disk_inflight_max: inflight_max,
    };
    let mut s = IoScheduler::new(config).map_err(|e| e.to_string())?;
    // Enough queued per class for two rounds of the largest quantum in the smallest requests,
    // so that every class is backlogged at every round formation.
    let target = (2 * 4 * cost_max).div_ceil(len_min) as usize + 2;
    let mut queued = vec![vec![0usize; classes]; devices as usize];
    let mut inflight: Vec<Request> = Vec::new();
    let mut next_id = 0u64;
    // Per device: the rounds, and the quanta in force for each.
    let mut rounds: Vec<Vec<RoundCosts>> = vec![Vec::new(); devices as usize];
    let mut round_quanta: Vec<Vec<Vec<u64>>> = vec![Vec::new(); devices as usize];
    let mut dispatched = 0;
    let now = Instant::ZERO;
    while dispatched < DISPATCHES {
        if dispatched == DISPATCHES / 2 {
            for (i, q) in quanta.iter_mut().enumerate() {
                *q = rng.range(cost_max, 4 * cost_max);
                s.set_quantum(ClassId::from_index(i as u16), *q)
                    .map_err(|e| e.to_string())?;
            }
        }
        for (d, per_class) in queued.iter_mut().enumerate() {
            for (c, queued_dc) in per_class.iter_mut().enumerate() {
                while *queued_dc < target {
                    let len_bytes = rng.range(len_min, max_request_bytes);
                    let deadline = (c == 0).then(|| Instant::from_nanos(rng.range(0, 1_000_000)));
                    let r = Request {
                        id: RequestId(next_id),
                        class: ClassId::from_index(c as u16),
                        device: DeviceId(d as u32),
                        offset_bytes: rng.range(0, 1 << 30),
                        len_bytes,
                        deadline,
                    };
                    next_id += 1;
                    s.submit(now, r).map_err(|e| format!("submit: {e}"))?;
                    *queued_dc += 1;
                }
            }
        }
        match s.poll_dispatch(now) {
            Some(r) => {
                let d = r.device.0 as usize;
                let c = r.class.index();
                queued[d][c] -= 1;
                dispatched += 1;
                let round = s.rounds(r.device).map_err(|e| e.to_string())? as usize;
                ensure!(round >= 1, "dispatch before any round was formed");
                if rounds[d].len() < round {
                    rounds[d].resize(round, vec![0; classes]);
                    round_quanta[d].resize(round, quanta.clone());
                    for (c2, &q) in quanta.iter().enumerate() {
                        let deficit = s
                            .deficit_bytes(r.device, ClassId::from_index(c2 as u16))
                            .unwrap();
                        ensure!(
                            deficit < cost_max,
                            "class {c2} deficit {deficit} >= max cost {cost_max} (quantum {q})"
                        );
                    }
                }
                ensure!(
                    rounds[d].len() == round,
                    "round numbers skipped on device {d}"
                );
                rounds[d][round - 1][c] += s.cost_bytes(r.len_bytes);
                inflight.push(r);
            }
            None => {
                ensure!(
                    !inflight.is_empty(),
                    "nothing dispatched while every class is backlogged"
                );
                let at = rng.range(0, inflight.len() as u64 - 1) as usize;
                let r = inflight.swap_remove(at);
                s.complete(now, r.id)
                    .map_err(|e| format!("complete: {e}"))?;
            }
        }
        let mut per_device: HashMap<u32, u32> = HashMap::new();
        for r in &inflight {
            *per_device.entry(r.device.0).or_default() += 1;
        }
        ensure!(
            per_device.values().all(|&n| n <= inflight_max),
            "in-flight bound {inflight_max} exceeded"
        );
    }
    for d in 0..devices as usize {
        // The last round may be partly dispatched: only complete rounds are judged.
        let complete = rounds[d].len().saturating_sub(1);
        check_windows(
            &rounds[d][..complete],
            &round_quanta[d][..complete],
            cost_max,
        )
        .map_err(|e| format!("device {d}: {e}"))?;
    }
    Ok(())
}

fn check_windows(rounds: &[RoundCosts], quanta: &[Vec<u64>], cost_max: u64) -> Result<(), String> {
    for (r, costs) in rounds.iter().enumerate() {
        ensure!(
            costs.iter().all(|&c| c > 0),
            "round {r}: a backlogged class got nothing: {costs:?}"
        );
    }
    let classes = quanta.first().map_or(0, Vec::len);
    for a in 0..rounds.len() {
        let mut served = vec![0u64; classes];
        for b in a..rounds.len() {
            if quanta[b] != quanta[a] {
                break; // Windows do not straddle a quantum change.
            }
            let q = &quanta[a];
            let k = (b - a + 1) as i128;
            for (s, c) in served.iter_mut().zip(&rounds[b]) {
                *s += c;
            }
            let total: u64 = served.iter().sum();
            let q_sum: u64 = q.iter().sum();
            for i in 0..classes {
                let served_i = i128::from(served[i]);
                let round_err = (served_i - k * i128::from(q[i])).abs();
                ensure!(
                    round_err < i128::from(cost_max),
                    "rounds {a}..={b}: class {i} served {served_i} B, k·Q = {} B: error {round_err} >= max cost {cost_max}",
                    k * i128::from(q[i])
                );
                // |served_i - total·Q_i/ΣQ| ≤ Q_i + M, cross-multiplied to stay in integers.
                let share_err =
                    (served_i * i128::from(q_sum) - i128::from(total) * i128::from(q[i])).abs();
                let bound = (i128::from(q[i]) + i128::from(cost_max)) * i128::from(q_sum);
                ensure!(
                    share_err <= bound,
                    "rounds {a}..={b}: class {i} served {served_i} B of {total} B, share {:.0} B, bound Q+M = {} B",
                    total as f64 * q[i] as f64 / q_sum as f64,
                    q[i] + cost_max
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_check_catches_an_unfair_round() {
        let q = vec![vec![100, 100]; 3];
        let fair = vec![vec![100, 100], vec![120, 80], vec![80, 120]];
        assert!(check_windows(&fair, &q, 100).is_ok());
        let unfair = vec![vec![100, 100], vec![300, 50], vec![100, 100]];
        assert!(check_windows(&unfair, &q, 100).is_err());
        let starved = vec![vec![200, 0]];
        assert!(check_windows(&starved, &q[..1], 100).is_err());
    }
}
