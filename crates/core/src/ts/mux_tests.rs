use proptest::prelude::*;

use super::*;
use crate::ts::packet::parse_packet;
use crate::ts::psi::{pat_first_program, pmt_pcr_pid, pmt_streams};

const AAC_LC_44K_STEREO: AdtsConfig = AdtsConfig {
    object_type: 2,
    frequency_index: 4,
    channels: 2,
};

/// What a demuxer reads back: PES packets per PID (payload after the PES header, with PTS
/// and DTS), PCRs, random access flags, after checking every packet and continuity counter.
#[derive(Debug, Default)]
struct Demuxed {
    pes: Vec<(u16, u64, u64, Vec<u8>, bool)>,
    pcrs: Vec<u64>,
    pmt_streams: Vec<(u8, u16)>,
    pcr_pid: Option<u16>,
}

fn demux(ts: &[u8]) -> Demuxed {
    assert_eq!(ts.len() % TS_PACKET_BYTES, 0);
    let mut d = Demuxed::default();
    let mut cc: std::collections::HashMap<u16, u8> = Default::default();
    let mut open: std::collections::HashMap<u16, (Vec<u8>, bool)> = Default::default();
    for raw in ts.chunks(TS_PACKET_BYTES) {
        let p = parse_packet(raw.try_into().unwrap()).expect("a well-formed packet");
        let c = raw[3] & 0xf;
        if let Some(prev) = cc.insert(p.pid, c) {
            assert_eq!(
                c,
                (prev + 1) & 0xf,
                "continuity counter of PID {:#x}",
                p.pid
            );
        }
        if let Some(pcr) = p.pcr {
            d.pcrs.push(pcr);
        }
        match p.pid {
            0 => assert_eq!(pat_first_program(p.payload), Some((1, PMT_PID))),
            PMT_PID => {
                d.pmt_streams = pmt_streams(p.payload).unwrap();
                d.pcr_pid = pmt_pcr_pid(p.payload);
            }
            pid => {
                if p.payload_unit_start {
                    if let Some((buf, rai)) = open.remove(&pid) {
                        finish(pid, buf, rai, &mut d);
                    }
                    open.insert(pid, (Vec::new(), p.random_access));
                }
                open.get_mut(&pid)
                    .expect("a PES starts with payload_unit_start")
                    .0
                    .extend_from_slice(p.payload);
            }
        }
    }
    let mut rest: Vec<_> = open.into_iter().collect();
    rest.sort_by_key(|(pid, _)| *pid);
    for (pid, (buf, rai)) in rest {
        finish(pid, buf, rai, &mut d);
    }
    d
}

/// One PES read back: its header checked, its times and payload kept.
fn finish(pid: u16, buf: Vec<u8>, rai: bool, d: &mut Demuxed) {
    assert_eq!(&buf[..3], &[0, 0, 1]);
    let flags = buf[7] >> 6;
    let pts = read_timestamp(&buf[9..]).unwrap();
    let dts = if flags == 3 {
        read_timestamp(&buf[14..]).unwrap()
    } else {
        pts
    };
    let body = buf[9 + usize::from(buf[8])..].to_vec();
    let len = usize::from(u16::from_be_bytes([buf[4], buf[5]]));
    if len != 0 {
        assert_eq!(len, buf.len() - 6, "PES_packet_length");
    }
    d.pes.push((pid, pts, dts, body, rai));
}

fn annexb(nals: &[Vec<u8>]) -> Vec<u8> {
    let mut v = AUD.to_vec();
    for n in nals {
        v.extend_from_slice(&START_CODE);
        v.extend_from_slice(n);
    }
    v
}

fn nal(t: u8, len: usize, seed: u8) -> Vec<u8> {
    let mut v = vec![0x60 | t];
    v.extend((0..len).map(|i| seed.wrapping_add(i as u8) | 1));
    v
}

proptest! {
    #[test]
    fn the_muxers_packets_give_back_every_unit(
        units in proptest::collection::vec((any::<bool>(), 1usize..6000, any::<u8>(), 0u64..3000, 1usize..2000), 1..20),
    ) {
        let sps = nal(7, 10, 1);
        let pps = nal(8, 4, 2);
        let mut m = TsMuxer::new(MuxConfig {
            video: Some(vec![sps.clone(), pps.clone()]),
            audio: Some(AAC_LC_44K_STEREO),
        }).unwrap();
        let mut out = Vec::new();
        let mut want = Vec::new();
        let mut t = 90_000u64;
        for (i, (key, len, seed, delay, alen)) in units.iter().enumerate() {
            let key = *key || i == 0;
            let nals = vec![nal(if key { 5 } else { 1 }, *len, *seed)];
            let (pts, dts) = (t + delay, t);
            m.video(pts, dts, key, &nals, &mut out).unwrap();
            let mut es = nals.clone();
            if key {
                es.insert(0, pps.clone());
                es.insert(0, sps.clone());
            }
            want.push((VIDEO_PID, pts, dts, annexb(&es), key));
            let frame = vec![*seed; *alen];
            m.audio(t, &frame, &mut out).unwrap();
            let mut adts = adts_header(AAC_LC_44K_STEREO, alen + 7).to_vec();
            adts.extend_from_slice(&frame);
            want.push((AUDIO_PID, t, t, adts, false));
            t += 3600;
        }
        let d = demux(&out);
        prop_assert_eq!(d.pmt_streams, vec![(STREAM_TYPE_H264, VIDEO_PID), (STREAM_TYPE_AAC_ADTS, AUDIO_PID)]);
        prop_assert_eq!(d.pcr_pid, Some(VIDEO_PID));
        // Per PID, in order.
        for pid in [VIDEO_PID, AUDIO_PID] {
            let got: Vec<_> = d.pes.iter().filter(|p| p.0 == pid).collect();
            let exp: Vec<_> = want.iter().filter(|p| p.0 == pid).collect();
            prop_assert_eq!(got, exp);
        }
        // One PCR per video unit, never ahead of a DTS that follows it.
        prop_assert_eq!(d.pcrs.len(), units.len());
        prop_assert!(d.pcrs.windows(2).all(|w| w[0] <= w[1]));
    }
}

#[test]
fn an_idr_without_parameter_sets_gets_the_latest_and_auds_are_replaced() {
    let mut m = TsMuxer::new(MuxConfig {
        video: Some(vec![nal(7, 5, 1), nal(8, 3, 1)]),
        audio: None,
    })
    .unwrap();
    let mut out = Vec::new();
    let new_sps = nal(7, 6, 9);
    let new_pps = nal(8, 3, 9);
    // In band: a new SPS/PPS (kept), an AUD (dropped: the muxer writes its own).
    let first = vec![
        vec![0x09, 0xf0],
        new_sps.clone(),
        new_pps.clone(),
        nal(5, 50, 3),
    ];
    m.video(100_000, 100_000, true, &first, &mut out).unwrap();
    m.video(103_600, 103_600, false, &[nal(1, 20, 4)], &mut out)
        .unwrap();
    m.video(107_200, 107_200, true, &[nal(5, 40, 5)], &mut out)
        .unwrap();
    let d = demux(&out);
    assert_eq!(d.pmt_streams, vec![(STREAM_TYPE_H264, VIDEO_PID)]);
    assert_eq!(d.pes.len(), 3);
    assert_eq!(d.pes[0].3, annexb(&first[1..]));
    assert_eq!(d.pes[2].3, annexb(&[new_sps, new_pps, nal(5, 40, 5)]));
    assert_eq!(
        d.pes.iter().map(|p| p.4).collect::<Vec<_>>(),
        [true, false, true]
    );
    // PSI before each key frame: two PATs.
    let pats = out
        .chunks(TS_PACKET_BYTES)
        .filter(|p| p[1] & 0x1f == 0 && p[2] == 0)
        .count();
    assert_eq!(pats, 2);
    assert_eq!(d.pcrs[0], (100_000 - PCR_LEAD_90K) * 300);
}

#[test]
fn audio_alone_carries_the_pcr_and_random_access() {
    let mut m = TsMuxer::new(MuxConfig {
        video: None,
        audio: Some(AAC_LC_44K_STEREO),
    })
    .unwrap();
    let mut out = Vec::new();
    for i in 0..3u64 {
        m.audio(20_000 + i * 2090, &[7u8; 300], &mut out).unwrap();
    }
    let d = demux(&out);
    assert_eq!(d.pcr_pid, Some(AUDIO_PID));
    assert_eq!(d.pcrs.len(), 3);
    assert!(d.pes.iter().all(|p| p.4));
    assert_eq!(
        m.audio(0, &vec![0u8; ADTS_FRAME_BYTES_MAX], &mut out),
        Err(MuxError::AudioTooLarge(ADTS_FRAME_BYTES_MAX))
    );
    assert_eq!(
        m.video(0, 0, true, &[nal(5, 3, 0)], &mut out),
        Err(MuxError::NoTrack("video"))
    );
    assert!(
        TsMuxer::new(MuxConfig {
            video: None,
            audio: Some(AdtsConfig {
                object_type: 5,
                frequency_index: 3,
                channels: 2
            })
        })
        .is_err()
    );
}

#[test]
fn timestamps_wrap_at_33_bits() {
    let t = (1u64 << 33) + 12_345;
    assert_eq!(read_timestamp(&timestamp(2, t)), Some(12_345));
    assert_eq!(
        read_timestamp(&timestamp(3, (1 << 33) - 1)),
        Some((1 << 33) - 1)
    );
}
