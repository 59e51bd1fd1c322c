use proptest::prelude::*;

use super::packet::{NULL_PID, decode_pcr, encode_pcr};
use super::pcr::{PACKETS_PER_UNIT_MAX, PCR_GAP_NS_MAX_DEFAULT};
use super::synth::{
    PcrAt, SYNTH_DATA_PID, SYNTH_PCR_PID, SYNTH_PMT_PID, cbr_ts, packet, psi_packets, ts_with_pcrs,
};
use super::*;

const TICK_NS: f64 = 1000.0 / 27.0;

fn plan(bytes: &[u8]) -> Result<TsPlan, TsError> {
    plan_bytes(bytes, &PcrLimits::default()).map(|(_, p)| p)
}

/// The units cover the whole packets exactly once, in order, 7 packets each but the last.
fn assert_covers(p: &TsPlan) {
    let unit = p.unit_bytes();
    let mut total = 0u64;
    for (k, u) in p.units.iter().enumerate() {
        if k + 1 < p.units.len() {
            assert_eq!(u64::from(u.size_bytes), unit, "unit {k} is not full");
        } else {
            assert!(u.size_bytes > 0 && u64::from(u.size_bytes) <= unit);
            assert_eq!(u.size_bytes % 188, 0, "the last unit holds whole packets");
        }
        total += u64::from(u.size_bytes);
    }
    assert_eq!(total, p.media_bytes);
    assert_eq!(p.media_bytes, p.packets * 188);
    assert!(p.units.windows(2).all(|w| w[0].offset_ns <= w[1].offset_ns));
    assert_eq!(
        p.units[0].offset_ns, 0,
        "the first packet is due at the start"
    );
}

/// The PCR-derived time of every packet, computed independently: the PCRs of the PCR PID
/// unwrapped (no discontinuity in these inputs), linear between consecutive ones, extended at
/// the first and last interval's rates; in ticks as f64.
fn pcr_times(bytes: &[u8], pid: u16) -> Vec<f64> {
    let mut pcrs: Vec<(usize, f64)> = Vec::new();
    let mut last_raw: Option<u64> = None;
    let mut unwrapped = 0f64;
    for (i, p) in bytes.chunks_exact(188).enumerate() {
        let p = parse_packet(p.try_into().unwrap()).unwrap();
        if p.pid != pid {
            continue;
        }
        if let Some(v) = p.pcr {
            if let Some(l) = last_raw {
                unwrapped += ((v + PCR_MODULUS - l) % PCR_MODULUS) as f64;
            }
            last_raw = Some(v);
            pcrs.push((i, unwrapped));
        }
    }
    let n = bytes.len() / 188;
    (0..n)
        .map(|i| {
            let k = pcrs.partition_point(|&(at, _)| at <= i);
            let (a, b) = if k == 0 {
                (pcrs[0], pcrs[1])
            } else if k == pcrs.len() {
                (pcrs[k - 2], pcrs[k - 1])
            } else {
                (pcrs[k - 1], pcrs[k])
            };
            a.1 + (b.1 - a.1) * (i as f64 - a.0 as f64) / (b.0 as f64 - a.0 as f64)
        })
        .collect()
}

/// Every unit's deadline is its first packet's PCR-derived time (relative to packet 0)
/// within one tick (plus the 1 ns of rounding up).
fn assert_within_a_tick(bytes: &[u8], p: &TsPlan) {
    let t = pcr_times(bytes, p.pcr_pid);
    for (k, u) in p.units.iter().enumerate() {
        let first = k * usize::from(p.packets_per_unit);
        let expect_ns = (t[first] - t[0]) * TICK_NS;
        let err = u.offset_ns as f64 - expect_ns;
        assert!(
            err.abs() <= TICK_NS + 1.0 + expect_ns * 1e-12,
            "unit {k}: deadline {} ns, PCR time {expect_ns:.1} ns",
            u.offset_ns
        );
    }
}

#[test]
fn pcr_fields_round_trip_and_bad_extensions_are_refused() {
    for v in [0, 1, 299, 300, 27_000_000, PCR_MODULUS - 1] {
        assert_eq!(decode_pcr(&encode_pcr(v)), Some(v));
    }
    assert_eq!(decode_pcr(&encode_pcr(PCR_MODULUS + 5)), Some(5));
    let mut b = encode_pcr(0);
    b[4] |= 1;
    b[5] = 0x2c; // extension 300
    assert_eq!(decode_pcr(&b), None);
}

#[test]
fn a_cbr_stream_is_timed_by_its_pcrs() {
    // 4 Mbit/s, a PCR every 20 packets (7.5 ms), PAT and PMT first.
    let bytes = cbr_ts(20_000, 4_000_000, 1_000_000, 3, 20, true);
    let (pid, p) = plan_bytes(&bytes, &PcrLimits::default()).unwrap();
    assert_eq!(pid.pid, SYNTH_PCR_PID);
    assert!(matches!(
        pid.source,
        PcrPidSource::Pmt {
            program: 1,
            pmt_pid: SYNTH_PMT_PID
        }
    ));
    assert_covers(&p);
    assert_within_a_tick(&bytes, &p);
    assert_eq!(p.units.len(), 20_000usize.div_ceil(7));
    assert_eq!((p.discontinuities, p.tail_bytes), (0, 0));
    // 20,000 packets at 4 Mbit/s: 7.52 s; the last unit is the last packet (19,999 = 7 · 2857).
    let last_start_ns = 19_999.0 * 188.0 * 8.0 / 4e6 * 1e9;
    assert!((p.duration_ns() as f64 - last_start_ns).abs() < 100.0);
}

#[test]
fn the_pmt_pcr_pid_wins_over_an_earlier_pcr_elsewhere() {
    // A PCR on another PID comes first; the PMT names SYNTH_PCR_PID.
    let mut bytes = packet(0x200, 0, Some((0, false)), 0).to_vec();
    let [pat, pmt] = psi_packets(SYNTH_PCR_PID);
    bytes.extend_from_slice(&pat);
    bytes.extend_from_slice(&pmt);
    let rest = cbr_ts(500, 2_000_000, 0, 5, 10, false);
    bytes.extend_from_slice(&rest[3 * 188..]);
    let (pid, _) = plan_bytes(&bytes, &PcrLimits::default()).unwrap();
    assert_eq!(pid.pid, SYNTH_PCR_PID);
    // Without PAT/PMT the first PID carrying a PCR is taken.
    let mut bytes = packet(0x200, 0, Some((0, false)), 0).to_vec();
    bytes.extend_from_slice(&packet(0x200, 1, Some((27_000, false)), 1));
    bytes.extend_from_slice(&rest);
    let (pid, p) = plan_bytes(&bytes, &PcrLimits::default()).unwrap();
    assert_eq!(
        (pid.pid, pid.source),
        (0x200, PcrPidSource::FirstPcr),
        "first PCR PID"
    );
    assert_covers(&p);
}

#[test]
fn a_pmt_without_pcr_pid_falls_back_to_the_first_pcr() {
    let [pat, _] = psi_packets(SYNTH_PCR_PID);
    let [_, pmt] = psi_packets(NULL_PID);
    let mut bytes = pat.to_vec();
    bytes.extend_from_slice(&pmt);
    bytes.extend_from_slice(&cbr_ts(100, 2_000_000, 0, 0, 10, false));
    let (pid, _) = plan_bytes(&bytes, &PcrLimits::default()).unwrap();
    assert_eq!(
        (pid.pid, pid.source),
        (SYNTH_PCR_PID, PcrPidSource::FirstPcr)
    );
}

#[test]
fn garbage_is_refused_with_the_reason() {
    assert_eq!(plan(&[]), Err(TsError::Empty));
    assert_eq!(plan(b"hello"), Err(TsError::NotTs { m2ts: false }));
    assert_eq!(plan(&[0u8; 1000]), Err(TsError::NotTs { m2ts: false }));
    // M2TS: a 4-byte timecode before each packet.
    let ts = cbr_ts(20, 1_000_000, 0, 0, 5, false);
    let m2ts: Vec<u8> = ts
        .chunks(188)
        .flat_map(|p| [0u8, 0, 0, 0].into_iter().chain(p.iter().copied()))
        .collect();
    assert_eq!(plan(&m2ts), Err(TsError::NotTs { m2ts: true }));
    assert!(TsError::NotTs { m2ts: true }.to_string().contains("M2TS"));
    // Sync lost at packet 7.
    let mut bad = cbr_ts(20, 1_000_000, 0, 0, 5, false);
    bad[7 * 188] = 0;
    assert_eq!(
        plan(&bad),
        Err(TsError::SyncLost {
            packet: 7,
            offset_bytes: 7 * 188
        })
    );
    // No PCR at all; with a PMT naming a PCR PID that carries none.
    let no_pcr = ts_with_pcrs(50, &[], false);
    assert_eq!(plan(&no_pcr), Err(TsError::NoPcr { packets: 50 }));
    let no_pcr = ts_with_pcrs(50, &[], true);
    assert_eq!(
        plan(&no_pcr),
        Err(TsError::TooFewPcrs {
            pid: SYNTH_PCR_PID,
            found: 0
        })
    );
    // One PCR.
    let one = ts_with_pcrs(
        50,
        &[PcrAt {
            packet: 4,
            pcr: 1000,
            discontinuity: false,
        }],
        true,
    );
    assert_eq!(
        plan(&one),
        Err(TsError::TooFewPcrs {
            pid: SYNTH_PCR_PID,
            found: 1
        })
    );
    // Two PCRs, the second a jump back: no continuous interval.
    let pcrs = [
        PcrAt {
            packet: 4,
            pcr: 1_000_000,
            discontinuity: false,
        },
        PcrAt {
            packet: 9,
            pcr: 5,
            discontinuity: false,
        },
    ];
    assert_eq!(
        plan(&ts_with_pcrs(50, &pcrs, true)),
        Err(TsError::NoPcrInterval {
            pid: SYNTH_PCR_PID,
            pcrs: 2
        })
    );
    // The plan's size limit.
    let big = cbr_ts(1000, 1_000_000, 0, 0, 10, true);
    let limits = PcrLimits {
        plan_entries_max: 100,
        ..PcrLimits::default()
    };
    assert!(matches!(
        plan_bytes(&big, &limits),
        Err(TsError::PlanTooLarge {
            entries_max: 100,
            ..
        })
    ));
    let limits = PcrLimits {
        packets_per_unit: 8,
        ..PcrLimits::default()
    };
    assert_eq!(plan_bytes(&big, &limits), Err(TsError::PacketsPerUnit(8)));
}

#[test]
fn a_truncated_last_packet_is_left_out_and_said() {
    let mut bytes = cbr_ts(100, 2_000_000, 0, 0, 10, true);
    bytes.extend_from_slice(&[0x47, 1, 2]);
    let p = plan(&bytes).unwrap();
    assert_eq!((p.packets, p.tail_bytes), (100, 3));
    assert_covers(&p);
}

#[test]
fn the_probe_gives_up_on_the_pmt_after_its_limit() {
    // No PAT/PMT; the PCRs start after the probe's limit: no PCR found.
    let bytes = cbr_ts(300, 2_000_000, 0, 120, 10, false);
    let limits = PcrLimits {
        probe_packets: 100,
        ..PcrLimits::default()
    };
    assert_eq!(
        plan_bytes(&bytes, &limits),
        Err(TsError::NoPcr { packets: 100 })
    );
    let limits = PcrLimits {
        probe_packets: 200,
        ..PcrLimits::default()
    };
    assert!(plan_bytes(&bytes, &limits).is_ok());
}

#[test]
fn the_33_bit_wrap_continues_the_timeline() {
    // Starts 0.2 s before the wrap, runs 1.5 s at 2 Mbit/s.
    let start = PCR_MODULUS - 27_000_000 / 5;
    let bytes = cbr_ts(2_000, 2_000_000, start, 0, 13, true);
    let p = plan(&bytes).unwrap();
    assert_eq!(p.discontinuities, 0);
    assert_covers(&p);
    assert_within_a_tick(&bytes, &p);
    let expect = 1995.0 * 188.0 * 8.0 / 2e6 * 1e9;
    assert!((p.duration_ns() as f64 - expect).abs() < 100.0);
}

/// A CBR stream whose second half has a new time base at packet `at` (the first PCR there
/// carries `discontinuity`), `new_base` ticks: the spliced plan is the CBR timeline of the
/// first half continued (within a few ticks).
fn spliced(new_base: u64, discontinuity: bool) -> (TsPlan, Vec<u8>) {
    let (bits, every, at, n) = (3_000_000u64, 11u64, 1_001u64, 2_000u64);
    let mut pcrs = Vec::new();
    for i in (2..n).step_by(every as usize) {
        let exact = |base: u64, k: u64| {
            let (num, den) = synth::cbr_ticks(base, k, bits);
            (num / den) as u64
        };
        pcrs.push(PcrAt {
            packet: i,
            pcr: if i < at {
                exact(500, i)
            } else {
                exact(new_base, i - at)
            },
            discontinuity: discontinuity && i >= at && i < at + every,
        });
    }
    let bytes = ts_with_pcrs(n, &pcrs, true);
    (plan(&bytes).unwrap(), bytes)
}

fn assert_cbr_timeline(p: &TsPlan, bits: f64) {
    for (k, u) in p.units.iter().enumerate() {
        let expect = (k * 7) as f64 * 188.0 * 8.0 / bits * 1e9;
        assert!(
            (u.offset_ns as f64 - expect).abs() <= 3.0 * TICK_NS,
            "unit {k}: {} ns, expected {expect:.0} ns",
            u.offset_ns
        );
    }
}

#[test]
fn a_discontinuity_indicator_splices_the_timeline() {
    // A new base far ahead, behind, and even one that happens to continue: all spliced.
    for base in [10_000_000_000, 7, 500 + 1_001 * 13_536] {
        let (p, _) = spliced(base, true);
        assert_eq!(p.discontinuities, 1, "base {base}");
        assert_covers(&p);
        assert_cbr_timeline(&p, 3e6);
    }
}

#[test]
fn a_backward_jump_or_a_gap_without_the_flag_is_spliced_too() {
    for base in [7, 500 + 27_000_000 * 5] {
        let (p, _) = spliced(base, false);
        assert_eq!(p.discontinuities, 1, "base {base}");
        assert_covers(&p);
        assert_cbr_timeline(&p, 3e6);
    }
    // A gap shorter than the limit is taken as real time: it is not spliced.
    let (p, _) = spliced(500 + 27_000_000 / 2, false);
    assert_eq!(p.discontinuities, 0);
    const { assert!(PCR_GAP_NS_MAX_DEFAULT > 500_000_000) };
}

#[test]
fn seeking_finds_the_last_pcr_at_or_before_a_time() {
    let bytes = cbr_ts(10_000, 4_000_000, 0, 5, 20, true);
    let p = plan(&bytes).unwrap();
    assert!(p.pcrs.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
    assert_eq!(p.pcrs.len(), (10_000 - 5usize).div_ceil(20));
    // Before the first PCR: none; exactly at one: that one; between: the earlier.
    assert_eq!(p.pcr_at_or_before(0), None);
    let third = p.pcrs[2];
    assert_eq!(p.pcr_at_or_before(third.time_ns), Some(third));
    assert_eq!(p.pcr_at_or_before(third.time_ns + 1), Some(third));
    assert_eq!(p.pcr_at_or_before(p.pcrs[3].time_ns - 1), Some(third));
    assert_eq!(p.pcr_at_or_before(u64::MAX), p.pcrs.last().copied());
    assert_eq!(third.offset_bytes, (5 + 40) * 188);
    // Playing from 2 s: the unit holding that PCR, deadlines from 0, bytes to the end.
    let pcr = p.pcr_at_or_before(2_000_000_000).unwrap();
    assert!(pcr.time_ns <= 2_000_000_000 && 2_000_000_000 - pcr.time_ns < 10_000_000);
    let pb = p.playback_from(Some(2_000_000_000));
    assert_eq!(pb.media_offset_bytes, pcr.offset_bytes / 1316 * 1316);
    assert_eq!(pb.media_offset_bytes + pb.media_bytes, p.media_bytes);
    assert_eq!(pb.units[0].offset_ns, 0);
    assert!(pb.start_time_ns <= pcr.time_ns);
    assert_eq!(
        pb.units
            .iter()
            .map(|u| u64::from(u.size_bytes))
            .sum::<u64>(),
        pb.media_bytes
    );
    // From the start, and from before the first PCR: the whole plan.
    assert_eq!(p.playback_from(None).units, p.units);
    assert_eq!(p.playback_from(Some(0)).media_offset_bytes, 0);
    // From a unit picked by other means (a recording's frame track): that unit's bytes and
    // time; a byte offset maps to the unit holding it; past the end: the last unit.
    let u = p.unit_at_offset(pcr.offset_bytes + 100);
    assert_eq!(u as u64, (pcr.offset_bytes + 100) / 1316);
    let at = p.playback_at_unit(u);
    assert_eq!(at, pb);
    assert_eq!(p.unit_at_offset(u64::MAX), p.units.len() - 1);
    let last = p.playback_at_unit(usize::MAX);
    assert_eq!(last.units.len(), 1);
    assert_eq!(last.start_time_ns, p.duration_ns());
}

#[test]
fn fewer_packets_per_unit_cut_smaller_units() {
    let bytes = cbr_ts(1_000, 4_000_000, 0, 0, 10, true);
    for ppu in 1..=PACKETS_PER_UNIT_MAX {
        let limits = PcrLimits {
            packets_per_unit: ppu,
            ..PcrLimits::default()
        };
        let (_, p) = plan_bytes(&bytes, &limits).unwrap();
        assert_eq!(p.units.len(), 1_000usize.div_ceil(usize::from(ppu)));
        assert_covers(&p);
        assert_within_a_tick(&bytes, &p);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A synthetic CBR TS with a PCR every N packets: every unit's deadline is its first
    /// packet's PCR-derived time within a tick, the units cover the file once, in order.
    #[test]
    fn cbr_deadlines_are_pcr_times(
        packets in 30u64..3_000,
        kbits in 500u64..40_000,
        start in any::<u64>(),
        first in 0u64..15,
        every in 1u64..60,
        psi in any::<bool>(),
    ) {
        let bytes = cbr_ts(packets, kbits * 1000, start % PCR_MODULUS, first, every, psi);
        match plan(&bytes) {
            Ok(p) => {
                assert_covers(&p);
                assert_within_a_tick(&bytes, &p);
                prop_assert_eq!(p.discontinuities, 0);
            }
            // Too few PCRs fit in a short stream with a sparse PCR.
            Err(TsError::TooFewPcrs { .. }) => {
                let placed = (first.max(if psi { 2 } else { 0 })..packets).step_by(every as usize).count();
                prop_assert!(placed < 3, "{} PCRs placed", placed);
            }
            Err(e) => prop_assert!(false, "{}", e),
        }
    }

    /// Any PCR values, any flags: a plan covers the file once with deadlines that never
    /// decrease, or a typed refusal; never a panic.
    #[test]
    fn arbitrary_pcrs_never_break_the_plan(
        packets in 1u64..600,
        pcrs in proptest::collection::vec((0u64..600, any::<u64>(), any::<bool>()), 0..40),
        psi in any::<bool>(),
    ) {
        let mut at: Vec<PcrAt> = pcrs
            .into_iter()
            .map(|(packet, pcr, d)| PcrAt { packet, pcr: pcr % PCR_MODULUS, discontinuity: d })
            .collect();
        at.sort_by_key(|p| p.packet);
        at.dedup_by_key(|p| p.packet);
        let bytes = ts_with_pcrs(packets, &at, psi);
        match plan(&bytes) {
            Ok(p) => {
                assert_covers(&p);
                prop_assert!(p.pcrs.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
            }
            Err(TsError::NoPcr { .. } | TsError::TooFewPcrs { .. } | TsError::NoPcrInterval { .. }) => {}
            Err(e) => prop_assert!(false, "unexpected {}", e),
        }
    }

    /// The bytes may come in chunks of any size: the same plan.
    #[test]
    fn chunking_does_not_change_the_plan(
        cuts in proptest::collection::vec(1usize..700, 1..30),
        every in 1u64..30,
    ) {
        let bytes = cbr_ts(800, 3_000_000, 12_345, 1, every, true);
        let whole = plan(&bytes).unwrap();
        let limits = PcrLimits::default();
        let mut probe = PcrPidProbe::new(&limits);
        let mut planner = None;
        let mut at = 0;
        let mut k = 0;
        let mut chunks = Vec::new();
        while at < bytes.len() {
            let n = cuts[k % cuts.len()].min(bytes.len() - at);
            chunks.push(&bytes[at..at + n]);
            at += n;
            k += 1;
        }
        for c in &chunks {
            if planner.is_none() && let Some(pid) = probe.handle(c).unwrap() {
                planner = Some(pid);
            }
        }
        let pid = planner.unwrap_or_else(|| probe.finish().unwrap());
        let mut pl = PcrPlanner::new(pid.pid, &limits).unwrap();
        for c in &chunks {
            pl.handle(c).unwrap();
        }
        prop_assert_eq!(pl.finish().unwrap(), whole);
    }

    /// Splices at a random place to a random new base, flagged or not: the timeline is the
    /// first half's CBR timeline continued.
    #[test]
    fn splices_continue_at_the_last_rate(base in any::<u64>(), flag in any::<bool>()) {
        let base = base % PCR_MODULUS;
        let (p, _) = spliced(base, flag);
        assert_covers(&p);
        assert_cbr_timeline(&p, 3e6);
    }
}

#[test]
fn data_pid_is_not_the_pcr_pid() {
    // Sanity of the synthetic stream the other tests rely on.
    let bytes = cbr_ts(50, 1_000_000, 0, 2, 10, true);
    let pids: Vec<u16> = bytes
        .chunks(188)
        .map(|p| parse_packet(p.try_into().unwrap()).unwrap().pid)
        .collect();
    assert_eq!(&pids[..3], &[0, SYNTH_PMT_PID, SYNTH_PCR_PID]);
    assert!(pids.contains(&SYNTH_DATA_PID));
    assert!(looks_like_ts(&bytes) && !looks_like_ts(b"GET / HTTP/1.1\r\n"));
}

#[test]
fn the_probe_reads_nothing_past_its_limit_or_its_decision() {
    // Found by the ts_pcr fuzz target: garbage after the probe's last packet was reported as
    // lost sync when the bytes came whole, and not when they came in small chunks.
    let mut bytes = cbr_ts(20, 1_000_000, 0, 5, 5, false);
    bytes[10 * 188] = 0; // sync lost at packet 10
    let limits = PcrLimits {
        probe_packets: 1,
        ..PcrLimits::default()
    };
    let whole = PcrPidProbe::new(&limits).handle(&bytes);
    let mut chunked = PcrPidProbe::new(&limits);
    let mut answer = Ok(None);
    for b in bytes.chunks(1) {
        answer = chunked.handle(b);
        if !matches!(answer, Ok(None)) {
            break;
        }
    }
    assert_eq!(whole, Err(TsError::NoPcr { packets: 1 }));
    assert_eq!(answer, whole);
    // Decided by the PMT at packet 1: packet 10's lost sync is the planner's to find.
    let mut bytes = cbr_ts(20, 1_000_000, 0, 5, 5, true);
    bytes[10 * 188] = 0;
    let pid = PcrPidProbe::new(&PcrLimits::default())
        .handle(&bytes)
        .unwrap();
    assert_eq!(pid.map(|p| p.pid), Some(SYNTH_PCR_PID));
    assert_eq!(
        plan(&bytes),
        Err(TsError::SyncLost {
            packet: 10,
            offset_bytes: 1880
        })
    );
}

#[test]
fn seeking_by_key_frame_starts_at_the_last_key_unit_at_or_before_a_time() {
    let bytes = cbr_ts(10_000, 4_000_000, 0, 5, 20, true);
    let p = plan(&bytes).unwrap();
    let unit = p.unit_bytes();
    // Key frames (byte offsets, out of order and two in one unit): units 10, 30, 100.
    let keys = p.key_units([100 * unit + 5, 10 * unit, 30 * unit + 1, 10 * unit + 188]);
    assert_eq!(keys, vec![10, 30, 100]);
    let t = |u: usize| p.units[u].offset_ns;
    // Before the first key frame: from the start; at one: that one; between: the earlier.
    assert_eq!(p.playback_from_key(&keys, 0).media_offset_bytes, 0);
    assert_eq!(
        p.playback_from_key(&keys, t(30)).media_offset_bytes,
        30 * unit
    );
    assert_eq!(
        p.playback_from_key(&keys, t(99)).media_offset_bytes,
        30 * unit
    );
    assert_eq!(
        p.playback_from_key(&keys, u64::MAX).media_offset_bytes,
        100 * unit
    );
    // Not the PCR rule: that one starts later, mid-GOP.
    assert!(p.playback_from(Some(t(99))).media_offset_bytes > 30 * unit);
    let pb = p.playback_from_key(&keys, t(99));
    assert_eq!(pb.units[0].offset_ns, 0);
    assert_eq!(pb.media_offset_bytes + pb.media_bytes, p.media_bytes);
    // No key frame: from the start.
    assert_eq!(p.playback_from_key(&[], t(99)).media_offset_bytes, 0);
}
