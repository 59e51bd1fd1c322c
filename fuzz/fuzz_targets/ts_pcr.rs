#![no_main]
//! Arbitrary bytes as an MPEG-TS file for `--timing pcr`: the PCR PID probe and the planner,
//! fed in chunks whose size the first byte picks. Never a panic; a plan covers the whole
//! packets exactly once, in order, with deadlines that never decrease, and the same bytes fed
//! whole give the same plan; seeking and playing from any time stay inside the plan.
use libfuzzer_sys::fuzz_target;
use penstock_core::ts::{PcrLimits, PcrPidProbe, PcrPlanner, TsError, plan_bytes};

fn plan_in_chunks(data: &[u8], chunk: usize, limits: &PcrLimits) -> Result<penstock_core::ts::TsPlan, TsError> {
    let mut probe = PcrPidProbe::new(limits);
    let mut pid = None;
    for c in data.chunks(chunk) {
        if let Some(p) = probe.handle(c)? {
            pid = Some(p);
            break;
        }
    }
    let pid = match pid {
        Some(p) => p,
        None => probe.finish()?,
    };
    let mut planner = PcrPlanner::new(pid.pid, limits)?;
    for c in data.chunks(chunk) {
        planner.handle(c)?;
    }
    planner.finish()
}

fuzz_target!(|input: &[u8]| {
    let Some((&knobs, data)) = input.split_first() else {
        return;
    };
    let limits = PcrLimits {
        probe_packets: 1 + u64::from(knobs & 0x0f) * 8,
        pcr_gap_ns_max: 1 + u64::from(knobs >> 4) * 100_000_000,
        plan_entries_max: 1 << 16,
        packets_per_unit: 1 + (knobs % 7),
    };
    let chunk = 1 + usize::from(knobs) * 3;
    let whole = plan_bytes(data, &limits).map(|(_, p)| p);
    let chunked = plan_in_chunks(data, chunk, &limits);
    assert_eq!(whole, chunked, "chunking changed the plan");
    let Ok(plan) = whole else {
        return;
    };
    let total: u64 = plan.units.iter().map(|u| u64::from(u.size_bytes)).sum();
    assert_eq!(total, plan.media_bytes);
    assert_eq!(plan.media_bytes, plan.packets * 188);
    assert!(plan.media_bytes + plan.tail_bytes == data.len() as u64);
    assert!(plan.units.windows(2).all(|w| w[0].offset_ns <= w[1].offset_ns));
    assert!(plan.units.iter().all(|u| u.size_bytes > 0 && u.size_bytes % 188 == 0));
    assert!(plan.pcrs.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
    for t in [0, plan.duration_ns() / 2, plan.duration_ns(), u64::MAX] {
        if let Some(p) = plan.pcr_at_or_before(t) {
            assert!(p.time_ns <= t && p.offset_bytes < plan.media_bytes);
        }
        let pb = plan.playback_from(Some(t));
        assert_eq!(pb.media_offset_bytes + pb.media_bytes, plan.media_bytes);
        let sum: u64 = pb.units.iter().map(|u| u64::from(u.size_bytes)).sum();
        assert_eq!(sum, pb.media_bytes);
    }
});
