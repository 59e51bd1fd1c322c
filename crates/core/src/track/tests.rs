use proptest::prelude::*;

use super::format::{FLAG_KERNEL_TIMESTAMPS, HEADER_BYTES, RECORD_BYTES};
use super::mpegts::TS_PACKET_BYTES;
use super::*;

fn header(kind: TrackKind) -> TrackHeader {
    TrackHeader {
        kind,
        start_wall_ns: 1_700_000_000_000_000_000,
        frame_rule: FrameRule::MpegTs { h264_idr: true },
        flags: FLAG_KERNEL_TIMESTAMPS,
    }
}

/// Records `packets` = (time delta, size, frame start) and returns the three files.
fn record(packets: &[(u64, u32, bool)]) -> [Vec<u8>; 3] {
    let mut files =
        [TrackKind::Time, TrackKind::Packet, TrackKind::Frame].map(|k| header(k).encode().to_vec());
    let mut w = TracksWriter::new();
    let mut out = TrackBytes::default();
    let mut t = 0;
    for &(dt, size, frame) in packets {
        t += dt;
        w.push(t, size, frame, &mut out).unwrap();
    }
    files[0].extend_from_slice(&out.time);
    files[1].extend_from_slice(&out.packet);
    files[2].extend_from_slice(&out.frame);
    files
}

struct Tracks {
    time: Vec<TimeRecord>,
    packet: Vec<PacketRecord>,
    frame: Vec<FrameRecord>,
}

fn decode_all(files: &[Vec<u8>; 3]) -> Tracks {
    let time = decode::<TimeRecord>(&files[0], u64::MAX).unwrap();
    let packet = decode::<PacketRecord>(&files[1], u64::MAX).unwrap();
    let frame = decode::<FrameRecord>(&files[2], u64::MAX).unwrap();
    assert_eq!(
        (time.stop, packet.stop, frame.stop),
        (StopReason::End, StopReason::End, StopReason::End)
    );
    Tracks {
        time: time.records,
        packet: packet.records,
        frame: frame.records,
    }
}

fn sample() -> [Vec<u8>; 3] {
    record(&[
        (0, 1316, true),
        (1000, 1316, false),
        (1000, 188, false),
        (0, 1316, true),
        (500, 1316, false),
    ])
}

#[test]
fn writer_and_decoder_agree() {
    let files = sample();
    let t = decode_all(&files);
    assert_eq!(
        t.time.iter().map(|r| r.time_ns).collect::<Vec<_>>(),
        vec![0, 1000, 2000, 2000, 2500]
    );
    assert_eq!(
        t.packet[3],
        PacketRecord {
            packet_index: 3,
            media_offset_bytes: 2 * 1316 + 188,
            size_bytes: 1316
        }
    );
    assert_eq!(
        t.frame,
        vec![
            FrameRecord {
                packet_index: 0,
                media_offset_bytes: 0
            },
            FrameRecord {
                packet_index: 3,
                media_offset_bytes: 2820
            },
        ]
    );
    let d = decode::<TimeRecord>(&files[0], 2).unwrap();
    assert_eq!(
        (d.records.len(), d.stop),
        (2, StopReason::RecordsMax { max: 2 })
    );
    assert_eq!(decode_header(&files[1]).unwrap(), header(TrackKind::Packet));
}

#[test]
fn writer_refuses_time_going_backwards() {
    let mut w = TracksWriter::new();
    let mut out = TrackBytes::default();
    w.push(10, 1, true, &mut out).unwrap();
    let before = out.clone();
    assert_eq!(
        w.push(9, 1, true, &mut out),
        Err(EncodeError::TimeWentBackwards {
            previous_ns: 10,
            time_ns: 9
        })
    );
    assert_eq!((out, w.packets(), w.media_offset_bytes()), (before, 1, 1));
}

#[test]
fn header_errors() {
    let files = sample();
    assert_eq!(
        decode::<TimeRecord>(&files[0][..10], 10),
        Err(TrackError::TruncatedHeader { len_bytes: 10 })
    );
    assert_eq!(
        decode::<TimeRecord>(&[0; 64], 10),
        Err(TrackError::BadMagic)
    );
    let mut v = files[0].clone();
    v[8] = 9;
    assert_eq!(
        decode::<TimeRecord>(&v, 10),
        Err(TrackError::UnknownVersion { found: 9 })
    );
    assert_eq!(
        decode::<TimeRecord>(&files[1], 10),
        Err(TrackError::WrongKind {
            expected: TrackKind::Time,
            found: TrackKind::Packet
        })
    );
    for at in 0..HEADER_BYTES {
        let mut v = files[0].clone();
        v[at] ^= 0x04;
        assert!(
            decode::<TimeRecord>(&v, 10).is_err(),
            "header flip at {at} not detected"
        );
    }
    // A record copied from another kind of track fails its checksum.
    let mut mixed = files[0].clone();
    mixed.truncate(HEADER_BYTES);
    mixed.extend_from_slice(&files[2][HEADER_BYTES..HEADER_BYTES + RECORD_BYTES]);
    assert_eq!(
        decode::<TimeRecord>(&mixed, 10).unwrap().stop,
        StopReason::BadChecksum { record: 0 }
    );
}

#[test]
fn zero_filled_tail_is_not_a_record() {
    let mut f = sample()[1].clone();
    f.extend_from_slice(&[0; 3 * RECORD_BYTES]);
    let d = decode::<PacketRecord>(&f, 100).unwrap();
    assert_eq!(
        (d.records.len(), d.stop),
        (5, StopReason::BadChecksum { record: 5 })
    );
    assert_eq!(d.good_bytes, (HEADER_BYTES + 5 * RECORD_BYTES) as u64);
}

#[test]
fn out_of_sequence_records_stop_the_decoder() {
    let mut f = header(TrackKind::Time).encode().to_vec();
    f.extend_from_slice(&encode_record(&TimeRecord {
        packet_index: 0,
        time_ns: 5,
    }));
    f.extend_from_slice(&encode_record(&TimeRecord {
        packet_index: 2,
        time_ns: 6,
    }));
    let d = decode::<TimeRecord>(&f, 10).unwrap();
    assert_eq!(
        d.stop,
        StopReason::OutOfSequence {
            record: 1,
            packet_index: 2,
            expected: 1
        }
    );
    let mut f = header(TrackKind::Frame).encode().to_vec();
    f.extend_from_slice(&encode_record(&FrameRecord {
        packet_index: 4,
        media_offset_bytes: 5,
    }));
    f.extend_from_slice(&encode_record(&FrameRecord {
        packet_index: 4,
        media_offset_bytes: 5,
    }));
    let d = decode::<FrameRecord>(&f, 10).unwrap();
    assert_eq!(
        d.stop,
        StopReason::OutOfSequence {
            record: 1,
            packet_index: 4,
            expected: 5
        }
    );
}

#[test]
fn csv() {
    let t = decode_all(&sample());
    let mut line = String::new();
    t.packet[1].write_csv(&mut line);
    assert_eq!(line, "1,1316,1316");
    assert_eq!(
        TrackKind::Packet.csv_header(),
        "packet,media_offset_bytes,size_bytes"
    );
    line.clear();
    t.time[4].write_csv(&mut line);
    assert_eq!(line, "4,2500");
    line.clear();
    t.frame[1].write_csv(&mut line);
    assert_eq!(line, "3,2820");
}

#[test]
fn check_accepts_consistent_tracks_and_reports_tails() {
    let t = decode_all(&sample());
    let media = 4 * 1316 + 188;
    let r = check(&t.time, &t.packet, &t.frame, media);
    assert!(r.is_clean(), "{r}");
    assert_eq!(
        (
            r.readable_packets,
            r.readable_media_bytes,
            r.readable_frames,
            r.readable_time_ns,
            r.limit
        ),
        (5, media, 2, 2500, ReadableLimit::Complete)
    );
    // Media longer than the tracks: unsynced media tail.
    assert_eq!(
        check(&t.time, &t.packet, &t.frame, media + 7).limit,
        ReadableLimit::Tracks
    );
    // Media shorter: readable up to the last whole packet.
    let r = check(&t.time, &t.packet, &t.frame, media - 1);
    assert_eq!(
        (
            r.readable_packets,
            r.readable_media_bytes,
            r.limit,
            r.is_clean()
        ),
        (4, media - 1316, ReadableLimit::Media, true)
    );
    let r = check(&t.time, &t.packet, &t.frame, 2000);
    assert_eq!((r.readable_packets, r.readable_frames), (1, 1));
    // One track shorter.
    let r = check(&t.time[..3], &t.packet, &t.frame, media);
    assert_eq!(
        (r.readable_packets, r.readable_frames, r.limit),
        (3, 1, ReadableLimit::TimeTrack)
    );
    let r = check(&t.time, &t.packet[..2], &t.frame, media);
    assert_eq!(
        (r.readable_packets, r.limit),
        (2, ReadableLimit::PacketTrack)
    );
    let r = check(&[], &[], &[], 0);
    assert_eq!(
        (r.readable_packets, r.limit, r.is_clean()),
        (0, ReadableLimit::Complete, true)
    );
}

#[test]
fn check_rejects_each_disagreement() {
    let t = decode_all(&sample());
    let media = 4 * 1316 + 188;
    let run = |time: &[TimeRecord], packet: &[PacketRecord], frame: &[FrameRecord]| {
        let r = check(time, packet, frame, media);
        assert!(!r.is_clean());
        assert_eq!(r.limit, ReadableLimit::Disagreement);
        (r.readable_packets, r.disagreement.unwrap())
    };
    let mut packet = t.packet.clone();
    packet[2].media_offset_bytes += 1;
    assert_eq!(
        run(&t.time, &packet, &t.frame),
        (
            2,
            Disagreement::Offset {
                packet: 2,
                media_offset_bytes: 2633,
                expected_bytes: 2632
            }
        )
    );
    let mut time = t.time.clone();
    time[3].time_ns = 1;
    assert!(matches!(
        run(&time, &t.packet, &t.frame),
        (3, Disagreement::TimeDecreased { packet: 3, .. })
    ));
    let mut time = t.time.clone();
    time[1].packet_index = 7;
    assert!(matches!(
        run(&time, &t.packet, &t.frame),
        (
            1,
            Disagreement::PacketIndex {
                track: TrackKind::Time,
                ..
            }
        )
    ));
    let mut frame = t.frame.clone();
    frame[1].media_offset_bytes = 2821;
    assert!(matches!(
        run(&t.time, &t.packet, &frame),
        (
            3,
            Disagreement::FrameOffset {
                record: 1,
                packet_index: 3,
                ..
            }
        )
    ));
    let r = check(&t.time, &t.packet, &frame, media);
    assert_eq!((r.readable_media_bytes, r.readable_frames), (2820, 1));
    let frame = vec![t.frame[1], t.frame[0]];
    assert!(matches!(
        run(&t.time, &t.packet, &frame),
        (
            0,
            Disagreement::FrameOrder {
                record: 1,
                packet_index: 0
            }
        )
    ));
}

#[test]
fn frame_detector_mpegts() {
    let mut ts = [0u8; TS_PACKET_BYTES];
    ts[0] = 0x47;
    ts[1] = 0x01; // PID 0x100
    ts[3] = 0x10; // payload only
    let plain = ts;
    let mut rai = ts;
    rai[3] = 0x30; // adaptation + payload
    rai[4] = 1;
    rai[5] = 0x40;
    let mut idr = ts;
    idr[1] |= 0x40; // payload_unit_start
    let pes = [
        0, 0, 1, 0xe0, 0, 0, 0x80, 0x80, 5, 0x21, 0, 1, 0, 1, 0xff, 0, 0, 0, 1, 0x09, 0xf0, 0, 0,
        0, 1, 0x67,
    ];
    idr[4..4 + pes.len()].copy_from_slice(&pes);
    let mut p_frame = idr;
    p_frame[4 + pes.len() - 1] = 0x41; // non-IDR slice

    let mut d = FrameDetector::new(FrameRule::MpegTs { h264_idr: true });
    let cat = |ps: &[[u8; TS_PACKET_BYTES]]| ps.concat();
    assert!(!d.observe(&cat(&[plain; 7])));
    assert!(d.observe(&cat(&[plain, plain, rai])));
    assert!(d.observe(&cat(&[idr])));
    assert!(!d.observe(&cat(&[p_frame, plain])));
    assert!(!FrameDetector::new(FrameRule::MpegTs { h264_idr: false }).observe(&idr));
    // Malformed: partial packet, bad sync byte, too many packets.
    assert!(!d.observe(&rai[..187]));
    let mut bad = rai;
    bad[0] = 0x48;
    assert!(!d.observe(&bad));
    assert!(!d.observe(&cat(&[rai; 8])));
    // A lying adaptation field length does not panic.
    let mut lie = rai;
    lie[4] = 255;
    assert!(!d.observe(&lie));
    assert!(FrameDetector::new(FrameRule::EveryPacket).observe(b"anything"));
}

fn rtp(marker: bool, payload: &[u8]) -> Vec<u8> {
    let mut p = vec![
        0x80,
        if marker { 0x80 | 96 } else { 96 },
        0,
        1,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        1,
    ];
    p.extend_from_slice(payload);
    p
}

#[test]
fn frame_detector_rtp() {
    let mut d = FrameDetector::new(FrameRule::Rtp { h264: false });
    // The first packet, and each packet after a marked one, begin a frame.
    let seen: Vec<bool> = [false, true, false, false, true, false]
        .iter()
        .map(|&m| d.observe(&rtp(m, b"x")))
        .collect();
    assert_eq!(seen, vec![true, false, true, false, false, true]);
    assert!(!d.observe(&[0x40; 20]), "version 1 is not RTP");
    let mut d = FrameDetector::new(FrameRule::Rtp { h264: true });
    assert!(
        !d.observe(&rtp(true, &[0x41, 0])),
        "frame start but a P slice"
    );
    assert!(
        d.observe(&rtp(false, &[0x7c, 0x85, 0])),
        "FU-A start of an IDR"
    );
    assert!(
        !d.observe(&rtp(true, &[0x7c, 0x45, 0])),
        "FU-A end, mid frame"
    );
    assert!(
        d.observe(&rtp(true, &[0x78, 0, 2, 0x09, 0x10, 0, 2, 0x67, 0])),
        "STAP-A with SPS"
    );
    assert!(
        !d.observe(&rtp(false, &[0x78, 0, 9, 0x09])),
        "truncated STAP-A"
    );
    // Padding and extension are skipped; lying lengths do not panic.
    let mut padded = rtp(false, &[0x65, 1, 2]);
    padded[0] |= 0x20;
    padded.push(200);
    assert!(rtp::parse(&padded).is_none());
}

fn arb_packets() -> impl Strategy<Value = Vec<(u64, u32, bool)>> {
    prop::collection::vec((0u64..10_000_000, 0u32..70_000, any::<bool>()), 0..40)
}

proptest! {
    #[test]
    fn round_trip_and_check_clean(packets in arb_packets()) {
        let files = record(&packets);
        let t = decode_all(&files);
        prop_assert_eq!(t.time.len(), packets.len());
        prop_assert_eq!(t.frame.len(), packets.iter().filter(|p| p.2).count());
        let media: u64 = packets.iter().map(|p| u64::from(p.1)).sum();
        let r = check(&t.time, &t.packet, &t.frame, media);
        prop_assert!(r.is_clean());
        prop_assert_eq!(r.readable_packets, packets.len() as u64);
        prop_assert_eq!(r.readable_media_bytes, media);
    }

    #[test]
    fn truncation_yields_the_good_prefix(packets in arb_packets(), cut in any::<prop::sample::Index>(), kind in 0usize..3) {
        let files = record(&packets);
        let file = &files[kind];
        let len = cut.index(file.len() + 1);
        let whole = (len.saturating_sub(HEADER_BYTES)) / RECORD_BYTES;
        let partial = len.saturating_sub(HEADER_BYTES) % RECORD_BYTES;
        let check_prefix = |good: usize, stop: StopReason, good_bytes: u64| {
            prop_assert_eq!(good, whole);
            prop_assert_eq!(good_bytes, (HEADER_BYTES + whole * RECORD_BYTES) as u64);
            if partial == 0 {
                prop_assert_eq!(stop, StopReason::End);
            } else {
                prop_assert_eq!(stop, StopReason::Truncated { record: whole as u64, trailing_bytes: partial });
            }
            Ok(())
        };
        if len < HEADER_BYTES {
            prop_assert_eq!(decode_header(&file[..len]), Err(TrackError::TruncatedHeader { len_bytes: len }));
        } else {
            let t = decode_all(&files);
            match kind {
                0 => { let d = decode::<TimeRecord>(&file[..len], u64::MAX).unwrap(); prop_assert_eq!(&d.records[..], &t.time[..whole]); check_prefix(d.records.len(), d.stop, d.good_bytes)?; }
                1 => { let d = decode::<PacketRecord>(&file[..len], u64::MAX).unwrap(); prop_assert_eq!(&d.records[..], &t.packet[..whole]); check_prefix(d.records.len(), d.stop, d.good_bytes)?; }
                _ => { let d = decode::<FrameRecord>(&file[..len], u64::MAX).unwrap(); prop_assert_eq!(&d.records[..], &t.frame[..whole]); check_prefix(d.records.len(), d.stop, d.good_bytes)?; }
            }
        }
    }

    #[test]
    fn any_flipped_record_byte_is_detected(packets in arb_packets(), at in any::<prop::sample::Index>(), bit in 0u8..8) {
        prop_assume!(!packets.is_empty());
        let mut file = record(&packets)[1].clone();
        let body = file.len() - HEADER_BYTES;
        let i = HEADER_BYTES + at.index(body);
        file[i] ^= 1 << bit;
        let d = decode::<PacketRecord>(&file, u64::MAX).unwrap();
        let record = ((i - HEADER_BYTES) / RECORD_BYTES) as u64;
        prop_assert_eq!(d.records.len() as u64, record);
        prop_assert_eq!(d.stop, StopReason::BadChecksum { record });
    }

    #[test]
    fn detectors_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..1400), first in any::<u8>()) {
        let mut bytes = bytes;
        if let Some(b) = bytes.first_mut() { *b = first | 0x80; }
        for rule in [FrameRule::MpegTs { h264_idr: true }, FrameRule::Rtp { h264: true }] {
            FrameDetector::new(rule).observe(&bytes);
        }
        let mut ts = bytes.clone();
        ts.resize(188, 0);
        ts[0] = 0x47;
        FrameDetector::new(FrameRule::MpegTs { h264_idr: true }).observe(&ts);
    }
}
