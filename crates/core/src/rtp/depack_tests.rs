use proptest::prelude::*;

use super::*;
use crate::rtp::mp4::{AAC_AU_BYTES_MAX, PayloadFormat, Piece, packetize};

/// Length-prefixed NAL units (4-byte lengths) as an MP4 sample holds them.
fn sample_of(nals: &[Vec<u8>]) -> Vec<u8> {
    let mut s = Vec::new();
    for n in nals {
        s.extend_from_slice(&(n.len() as u32).to_be_bytes());
        s.extend_from_slice(n);
    }
    s
}

fn payload(sample: &[u8], p: &Piece) -> Vec<u8> {
    let mut v = p.prefix().to_vec();
    v.extend_from_slice(&sample[p.range.clone()]);
    v
}

fn nal_strategy() -> impl Strategy<Value = Vec<u8>> {
    (1usize..2500).prop_flat_map(|n| {
        proptest::collection::vec(any::<u8>(), n + 1).prop_map(|mut v| {
            // F bit 0, a type that is not an aggregation or fragment.
            v[0] = (v[0] & 0x60) | (1 + v[0] % 23);
            v
        })
    })
}

/// The RTP packets of access units (one timestamp each, 3000 ticks apart), numbered from
/// `seq0`.
fn packets_of(aus: &[Vec<Vec<u8>>], budget: usize, seq0: u16) -> Vec<(RtpHeader, Vec<u8>)> {
    let mut out = Vec::new();
    let mut pieces = Vec::new();
    let mut seq = seq0;
    for (i, au) in aus.iter().enumerate() {
        let sample = sample_of(au);
        packetize(
            PayloadFormat::H264 { length_size: 4 },
            &sample,
            budget,
            &mut pieces,
        )
        .unwrap();
        // One RTP payload per run of joined pieces (a STAP-A's units and its header).
        for group in crate::rtp::mp4::packets(&pieces) {
            let h = RtpHeader {
                marker: group.last().is_some_and(|p| p.marker),
                payload_type: 96,
                sequence: seq,
                timestamp: 0xffff_f000u32.wrapping_add(3000 * i as u32),
                ssrc: 1,
            };
            seq = seq.wrapping_add(1);
            out.push((h, group.iter().flat_map(|p| payload(&sample, p)).collect()));
        }
    }
    out
}

proptest! {
    #[test]
    fn h264_packets_give_back_the_access_units(
        aus in proptest::collection::vec(proptest::collection::vec(nal_strategy(), 1..6), 1..5),
        budget in 3usize..1500,
        seq0 in any::<u16>(),
    ) {
        let mut d = H264Depacketizer::new(DepackLimits::default());
        let mut out = Vec::new();
        for (h, p) in packets_of(&aus, budget, seq0) {
            d.push(&h, &p, &mut out).unwrap();
        }
        prop_assert_eq!(out.len(), aus.len());
        for (u, au) in out.iter().zip(&aus) {
            prop_assert_eq!(&u.nals, au);
            prop_assert!(!u.discontinuity);
            prop_assert_eq!(u.key, au.iter().any(|n| n[0] & 0x1f == NAL_IDR));
        }
    }

    /// A lost packet never yields a corrupt NAL unit: every NAL handed out is one of its
    /// unit's NALs whole, and a unit missing any is marked discontinuous.
    #[test]
    fn a_lost_packet_drops_whole_nals_and_marks_a_discontinuity(
        aus in proptest::collection::vec(proptest::collection::vec(nal_strategy(), 1..5), 2..5),
        budget in 3usize..1500,
        lose in any::<prop::sample::Index>(),
    ) {
        let packets = packets_of(&aus, budget, 100);
        let lost = lose.index(packets.len());
        // The very first and last packets' losses show no gap: nothing came before or
        // after them.
        prop_assume!(lost > 0 && lost + 1 < packets.len());
        let mut d = H264Depacketizer::new(DepackLimits::default());
        let mut out = Vec::new();
        for (i, (h, p)) in packets.iter().enumerate() {
            if i != lost {
                d.push(h, p, &mut out).unwrap();
            }
        }
        d.flush(&mut out);
        let mut marked = false;
        for u in &out {
            let i = (u.timestamp.wrapping_sub(0xffff_f000) / 3000) as usize;
            let au = &aus[i];
            // A subsequence of the unit's NAL units, each whole.
            let mut it = au.iter();
            for n in &u.nals {
                prop_assert!(it.any(|x| x == n), "a NAL unit not from its access unit");
            }
            if &u.nals != au {
                prop_assert!(u.discontinuity, "an incomplete unit not marked");
            }
            marked |= u.discontinuity;
        }
        // The loss is said on a unit, or it cost the last unit whole (the mark then waits
        // for the next unit).
        prop_assert!(marked || out.len() < aus.len(), "the loss is said");
    }

    #[test]
    fn aac_packets_give_back_the_access_units(
        aus in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..AAC_AU_BYTES_MAX), 1..4),
        budget in 5usize..1500,
    ) {
        let mut d = AacDepacketizer::new(13, 3, 3, 1 << 16);
        let mut out = Vec::new();
        let mut pieces = Vec::new();
        let mut seq = 65530u16;
        for (i, au) in aus.iter().enumerate() {
            packetize(PayloadFormat::AacHbr, au, budget, &mut pieces).unwrap();
            for p in &pieces {
                let h = RtpHeader {
                    marker: p.marker,
                    payload_type: 97,
                    sequence: seq,
                    timestamp: 1024 * i as u32,
                    ssrc: 2,
                };
                seq = seq.wrapping_add(1);
                d.push(&h, &payload(au, p), &mut out).unwrap();
            }
        }
        prop_assert_eq!(out.len(), aus.len());
        for (i, (u, au)) in out.iter().zip(&aus).enumerate() {
            prop_assert_eq!(&u.data, au);
            prop_assert_eq!(u.timestamp, 1024 * i as u32);
            prop_assert!(!u.discontinuity);
        }
    }

    #[test]
    fn a_lost_aac_fragment_drops_its_au(
        au in proptest::collection::vec(any::<u8>(), 3000..AAC_AU_BYTES_MAX),
        next in proptest::collection::vec(any::<u8>(), 1..500),
        lose in any::<prop::sample::Index>(),
    ) {
        let mut d = AacDepacketizer::new(13, 3, 3, 1 << 16);
        let mut out = Vec::new();
        let mut pieces = Vec::new();
        packetize(PayloadFormat::AacHbr, &au, 1400, &mut pieces).unwrap();
        let lost = lose.index(pieces.len());
        let mut seq = 0u16;
        for (i, p) in pieces.iter().enumerate() {
            let h = RtpHeader { marker: p.marker, payload_type: 97, sequence: seq, timestamp: 0, ssrc: 2 };
            seq += 1;
            if i != lost {
                let _ = d.push(&h, &payload(&au, p), &mut out);
            }
        }
        packetize(PayloadFormat::AacHbr, &next, 1400, &mut pieces).unwrap();
        let h = RtpHeader { marker: true, payload_type: 97, sequence: seq, timestamp: 1024, ssrc: 2 };
        d.push(&h, &payload(&next, &pieces[0]), &mut out).unwrap();
        prop_assert_eq!(out.len(), 1, "the damaged AU is never handed out");
        prop_assert_eq!(&out[0].data, &next);
        prop_assert!(out[0].discontinuity);
    }

    /// Bytes from a socket never panic a depacketizer.
    #[test]
    fn garbage_payloads_are_refused_not_panicked(
        packets in proptest::collection::vec((any::<bool>(), any::<u16>(), proptest::collection::vec(any::<u8>(), 0..300)), 1..30),
    ) {
        let mut v = H264Depacketizer::new(DepackLimits { au_bytes_max: 2000, nals_per_au_max: 8 });
        let mut a = AacDepacketizer::new(13, 3, 3, 2000);
        let (mut vo, mut ao) = (Vec::new(), Vec::new());
        for (i, (marker, seq, p)) in packets.iter().enumerate() {
            let h = RtpHeader { marker: *marker, payload_type: 96, sequence: *seq, timestamp: i as u32 / 3, ssrc: 1 };
            let _ = v.push(&h, p, &mut vo);
            let _ = a.push(&h, p, &mut ao);
        }
        for u in &vo {
            prop_assert!(u.nals.len() <= 8);
            prop_assert!(u.nals.iter().map(Vec::len).sum::<usize>() <= 2000);
        }
    }
}

fn h(seq: u16, ts: u32, marker: bool) -> RtpHeader {
    RtpHeader {
        marker,
        payload_type: 96,
        sequence: seq,
        timestamp: ts,
        ssrc: 9,
    }
}

#[test]
fn stap_a_gives_its_nal_units_and_a_bad_one_is_dropped() {
    let sps = [0x67u8, 0x64, 0x00, 0x1f];
    let pps = [0x68u8, 0xee, 0x3c];
    let mut stap = vec![0x78u8];
    for n in [&sps[..], &pps[..]] {
        stap.extend_from_slice(&(n.len() as u16).to_be_bytes());
        stap.extend_from_slice(n);
    }
    let idr = [0x65u8, 0x88, 0x80];
    let mut d = H264Depacketizer::new(DepackLimits::default());
    let mut out = Vec::new();
    d.push(&h(1, 10, false), &stap, &mut out).unwrap();
    d.push(&h(2, 10, true), &idr, &mut out).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].nals, vec![sps.to_vec(), pps.to_vec(), idr.to_vec()]);
    assert!(out[0].key);
    // A size that runs past the packet: the packet is refused, the unit marked.
    let mut bad = stap.clone();
    bad[2] = 200;
    assert!(d.push(&h(3, 20, false), &bad, &mut out).is_err());
    d.push(&h(4, 20, true), &[0x41, 1, 2], &mut out).unwrap();
    assert_eq!(out[1].nals, vec![vec![0x41, 1, 2]]);
    assert!(out[1].discontinuity);
    // Interleaved-mode types are refused by name.
    assert_eq!(
        d.push(&h(5, 30, true), &[0x19, 0, 0], &mut out),
        Err(DepackError::Unsupported(25))
    );
}

#[test]
fn an_access_unit_over_its_limits_is_dropped_whole() {
    let limits = DepackLimits {
        au_bytes_max: 100,
        nals_per_au_max: 2,
    };
    let mut d = H264Depacketizer::new(limits);
    let mut out = Vec::new();
    d.push(&h(1, 0, false), &[0x41; 60], &mut out).unwrap();
    assert_eq!(
        d.push(&h(2, 0, true), &[0x41; 60], &mut out),
        Err(DepackError::TooLarge(100))
    );
    assert!(out.is_empty());
    for (i, s) in [3u16, 4].into_iter().enumerate() {
        d.push(&h(s, 1, false), &[0x41, i as u8], &mut out).unwrap();
    }
    assert_eq!(
        d.push(&h(5, 1, true), &[0x41, 9], &mut out),
        Err(DepackError::TooManyNals(2))
    );
    assert!(out.is_empty());
    d.push(&h(6, 2, true), &[0x41, 7], &mut out).unwrap();
    assert_eq!(out.len(), 1);
    assert!(out[0].discontinuity, "the dropped units are said");
}
