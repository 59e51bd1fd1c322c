use proptest::prelude::*;

use super::*;

/// Length-prefixed NAL units (4-byte lengths) as an MP4 sample holds them.
fn sample_of(nals: &[Vec<u8>], length_size: usize) -> Vec<u8> {
    let mut s = Vec::new();
    for n in nals {
        let len = (n.len() as u32).to_be_bytes();
        s.extend_from_slice(&len[4 - length_size..]);
        s.extend_from_slice(n);
    }
    s
}

/// A receiver's depacketizer (RFC 6184 / RFC 7798): the NAL units back from the payloads
/// (single NAL unit packets, FU-A / FU, and H.264 STAP-A).
fn depacketize_nals(sample: &[u8], pieces: &[Piece], header_len: usize) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    let mut fu: Option<Vec<u8>> = None;
    for packet in packets(pieces) {
        let mut payload = Vec::new();
        for p in packet {
            payload.extend_from_slice(p.prefix());
            payload.extend_from_slice(&sample[p.range.clone()]);
        }
        let typ = if header_len == 1 {
            payload[0] & 0x1f
        } else {
            (payload[0] >> 1) & 0x3f
        };
        if header_len == 1 && typ == 24 {
            assert!(fu.is_none(), "a STAP-A inside a fragmented unit");
            // STAP-A: 16-bit size, unit, … ; the header's NRI the largest, F any.
            let mut at = 1;
            let (mut nri, mut f) = (0, 0);
            while at < payload.len() {
                let n = usize::from(u16::from_be_bytes([payload[at], payload[at + 1]]));
                let unit = payload[at + 2..at + 2 + n].to_vec();
                nri = nri.max(unit[0] & 0x60);
                f |= unit[0] & 0x80;
                out.push(unit);
                at += 2 + n;
            }
            assert_eq!(payload[0] & 0x60, nri, "STAP-A NRI");
            assert_eq!(payload[0] & 0x80, f, "STAP-A F");
            continue;
        }
        let is_fu = (header_len == 1 && typ == 28) || (header_len == 2 && typ == 49);
        if !is_fu {
            assert!(fu.is_none(), "a single NAL packet inside a fragmented one");
            out.push(payload);
            continue;
        }
        let fu_hdr = payload[header_len];
        let (start, end, t) = (fu_hdr & 0x80 != 0, fu_hdr & 0x40 != 0, fu_hdr & 0x3f);
        if start {
            assert!(fu.is_none());
            let mut nal = if header_len == 1 {
                vec![(payload[0] & 0xe0) | (t & 0x1f)]
            } else {
                vec![(payload[0] & 0x81) | (t << 1), payload[1]]
            };
            nal.extend_from_slice(&payload[header_len + 1..]);
            fu = Some(nal);
        } else {
            fu.as_mut()
                .expect("FU continuation without a start")
                .extend_from_slice(&payload[header_len + 1..]);
        }
        if end {
            out.push(fu.take().expect("started"));
        }
    }
    assert!(fu.is_none(), "an FU never ended");
    out
}

/// Bytes of each RTP payload.
fn payload_sizes(pieces: &[Piece]) -> Vec<usize> {
    packets(pieces)
        .map(|p| p.iter().map(Piece::payload_len).sum())
        .collect()
}

fn nal_strategy(header_len: usize) -> impl Strategy<Value = Vec<u8>> {
    (1usize..3000).prop_flat_map(move |n| {
        proptest::collection::vec(any::<u8>(), n + header_len).prop_map(move |mut v| {
            // A valid NAL header: F bit 0, type not an aggregation or fragment type.
            if header_len == 1 {
                v[0] = (v[0] & 0x60) | (1 + v[0] % 23);
            } else {
                v[0] = ((v[0] % 40) << 1) | (v[0] & 1);
                v[1] = (v[1] & 0xf8) | 1;
            }
            v
        })
    })
}

proptest! {
    /// Single NAL units, STAP-A and FU-A give the sample's NAL units back, every payload
    /// within the budget, the marker on the last only; and no two neighbouring payloads could
    /// have been one STAP-A (small units are aggregated whenever they fit).
    #[test]
    fn h264_payloads_give_back_the_nal_units(
        nals in proptest::collection::vec(
            prop_oneof![nal_strategy(1), proptest::collection::vec(any::<u8>(), 2..40).prop_map(|mut v| {
                v[0] = (v[0] & 0x60) | (1 + v[0] % 23);
                v
            })],
            1..8,
        ),
        budget in 3usize..1500,
        ls in 1usize..=4,
    ) {
        prop_assume!(nals.iter().all(|n| n.len() < 1usize << (8 * ls).min(31)));
        let sample = sample_of(&nals, ls);
        let mut out = Vec::new();
        packetize(PayloadFormat::H264 { length_size: ls as u8 }, &sample, budget, &mut out).unwrap();
        prop_assert!(payload_sizes(&out).iter().all(|&n| n <= budget));
        prop_assert!(out.iter().rev().skip(1).all(|p| !p.marker));
        prop_assert!(out.last().unwrap().marker);
        prop_assert_eq!(depacketize_nals(&sample, &out, 1), nals.clone());
        // Aggregation is greedy: a unit sent alone (not fragmented) never fitted into the
        // STAP-A or single unit before it.
        let groups: Vec<&[Piece]> = packets(&out).collect();
        for w in groups.windows(2) {
            let (a, b) = (w[0], w[1]);
            let unfragmented = |g: &[Piece]| g.len() > 1 || g[0].prefix_len == 0;
            if unfragmented(a) && unfragmented(b) {
                let a_units: usize = a.iter().map(|p| p.range.len()).sum();
                let a_bytes = 1 + 2 * a.len() + a_units;
                let b_first = b[0].range.len();
                prop_assert!(a_bytes + 2 + b_first > budget, "{:?} then {:?} fit one STAP-A", a, b);
            }
        }
    }

    #[test]
    fn h265_payloads_give_back_the_nal_units(
        nals in proptest::collection::vec(nal_strategy(2), 1..8),
        budget in 4usize..1500,
    ) {
        let sample = sample_of(&nals, 4);
        let mut out = Vec::new();
        packetize(PayloadFormat::H265 { length_size: 4 }, &sample, budget, &mut out).unwrap();
        prop_assert!(out.iter().all(|p| p.payload_len() <= budget && !p.joined));
        prop_assert!(out.last().unwrap().marker);
        prop_assert_eq!(depacketize_nals(&sample, &out, 2), nals);
    }

    #[test]
    fn aac_payloads_give_back_the_access_unit(
        au in proptest::collection::vec(any::<u8>(), 1..AAC_AU_BYTES_MAX),
        budget in 5usize..1500,
    ) {
        let mut out = Vec::new();
        packetize(PayloadFormat::AacHbr, &au, budget, &mut out).unwrap();
        let mut back = Vec::new();
        for (i, p) in out.iter().enumerate() {
            prop_assert!(p.payload_len() <= budget);
            prop_assert_eq!(p.marker, i + 1 == out.len());
            // One AU header of 16 bits; its size is the whole AU's.
            prop_assert_eq!(&p.prefix()[..2], &[0u8, 16][..]);
            let size = usize::from(u16::from_be_bytes([p.prefix[2], p.prefix[3]]) >> 3);
            prop_assert_eq!(size, au.len());
            back.extend_from_slice(&au[p.range.clone()]);
        }
        prop_assert_eq!(back, au);
    }

    #[test]
    fn truncated_samples_are_refused_not_panicked(
        nals in proptest::collection::vec(nal_strategy(1), 1..4),
        cut in 1usize..100,
    ) {
        let sample = sample_of(&nals, 4);
        let short = &sample[..sample.len().saturating_sub(cut)];
        let mut out = Vec::new();
        match packetize(PayloadFormat::H264 { length_size: 4 }, short, 1400, &mut out) {
            Ok(()) => prop_assert!(short.is_empty() || out.last().unwrap().marker),
            Err(_) => prop_assert!(out.is_empty()),
        }
    }
}

#[test]
fn a_small_nal_goes_alone_and_a_large_one_as_fu_a() {
    let nals = vec![vec![0x06, 1, 2, 3], {
        let mut v = vec![0x65];
        v.extend(std::iter::repeat_n(7u8, 3000));
        v
    }];
    let sample = sample_of(&nals, 4);
    let mut out = Vec::new();
    packetize(
        PayloadFormat::H264 { length_size: 4 },
        &sample,
        1400,
        &mut out,
    )
    .unwrap();
    assert_eq!(out[0].prefix_len, 0);
    assert_eq!(out[0].range, 4..8);
    // 3000 bytes after the NAL header, 1398 per FU-A: three fragments.
    assert_eq!(out.len(), 4);
    assert_eq!(out[1].prefix(), &[0x60 | 28, 0x80 | 5]);
    assert_eq!(out[2].prefix(), &[0x60 | 28, 5]);
    assert_eq!(out[3].prefix(), &[0x60 | 28, 0x40 | 5]);
    assert!(out[3].marker && !out[2].marker);
}

#[test]
fn sps_pps_and_sei_before_an_idr_go_as_one_stap_a() {
    let nals = vec![
        vec![0x67, 0x64, 0x00, 0x1f],
        vec![0x68, 0xee, 0x3c],
        vec![0x06, 5, 1, 2],
        {
            let mut v = vec![0x65];
            v.extend(std::iter::repeat_n(7u8, 3000));
            v
        },
    ];
    let sample = sample_of(&nals, 4);
    let mut out = Vec::new();
    packetize(
        PayloadFormat::H264 { length_size: 4 },
        &sample,
        1400,
        &mut out,
    )
    .unwrap();
    let groups: Vec<&[Piece]> = packets(&out).collect();
    // The three small units in one STAP-A (NRI 3 from the SPS/PPS), then three FU-As.
    assert_eq!(groups.len(), 4);
    assert_eq!(groups[0].len(), 3);
    assert_eq!(groups[0][0].prefix(), &[0x60 | 24, 0, 4]);
    assert_eq!(groups[0][1].prefix(), &[0, 3]);
    assert_eq!(groups[0][2].prefix(), &[0, 4]);
    assert!(groups[0].iter().all(|p| !p.marker));
    assert_eq!(groups[1][0].prefix(), &[0x60 | 28, 0x80 | 5]);
    assert_eq!(depacketize_nals(&sample, &out, 1), nals);
}

#[test]
fn timestamps_follow_presentation_time_at_the_payload_clock() {
    let rtp = TrackRtp {
        format: PayloadFormat::H264 { length_size: 4 },
        payload_type: 96,
        clock_hz: 90_000,
        timescale: 12_800,
        media_time: 1024,
    };
    assert_eq!(rtp.timestamp(1000, 1024), 1000);
    // One 25 fps frame (512 ticks of 12.8 kHz) later: 3600 at 90 kHz.
    assert_eq!(rtp.timestamp(1000, 1024 + 512), 4600);
    // Before the edit (a B-frame's decode time): wraps below the base.
    assert_eq!(rtp.timestamp(0, 512), 0u32.wrapping_sub(3600));
    assert_eq!(rtp.presentation_ns(1024 + 12_800), 1_000_000_000);
}

#[test]
fn avcc_parameter_sets_are_read_in_order() {
    // version 1, profile 0x64, compat 0, level 0x1f, 0xff (4-byte lengths), 1 SPS, 1 PPS.
    let avcc = [
        1, 0x64, 0, 0x1f, 0xff, 0xe1, 0, 3, 0x67, 0x64, 0x1f, 1, 0, 2, 0x68, 0xee,
    ];
    let sets = avcc_parameter_sets(&avcc);
    assert_eq!(sets, vec![&[0x67, 0x64, 0x1f][..], &[0x68, 0xee][..]]);
    // Truncated: what was whole is kept, nothing panics.
    assert_eq!(avcc_parameter_sets(&avcc[..10]).len(), 0);
    assert_eq!(avcc_parameter_sets(&avcc[..13]).len(), 1);
}

#[test]
fn aac_channels_come_from_the_audio_specific_config() {
    // AAC LC, 44.1 kHz, mono (what ffmpeg writes for a mono stream in a 2-channel mp4a).
    assert_eq!(asc_channels(&[0x12, 0x08]), Some(1));
    // AAC LC, 48 kHz, stereo.
    assert_eq!(asc_channels(&[0x11, 0x90]), Some(2));
    // Channel configuration 0 (in the program config element): not named here.
    assert_eq!(asc_channels(&[0x11, 0x80]), None);
    assert_eq!(asc_channels(&[0x11]), None);
}
