use proptest::prelude::*;

use super::rtcp::{
    PT_SDES, ReportBlock, RtcpError, RtcpItem, SenderInfo, parse, write_receiver_report,
    write_sender_report,
};
use super::session::SenderSession;
use super::*;
use crate::time::Instant;
use crate::ts::synth::cbr_ts;
use crate::ts::{PcrLimits, plan_bytes};

fn items(datagram: &[u8]) -> Result<Vec<RtcpItem>, RtcpError> {
    let mut v = Vec::new();
    parse(datagram, &mut v).map(|()| v)
}

fn block(ssrc: u32) -> ReportBlock {
    ReportBlock {
        ssrc,
        fraction_lost: 26,
        cumulative_lost: -3,
        extended_highest_sequence: 0x0001_2345,
        jitter: 450,
        lsr: 0,
        dlsr: 0,
    }
}

#[test]
fn the_header_is_rfc_2250s() {
    let p = Packetizer {
        ssrc: 0xdead_beef,
        sequence_start: 0xfffe,
        timestamp_start: 0xffff_fff0,
        payload_type: PAYLOAD_TYPE_MP2T,
        scale: crate::track::Speed::NORMAL,
    };
    let h = p.header(3, 1_000_000); // 1 ms: 90 ticks
    assert_eq!(
        h,
        [
            0x80, 33, 0x00, 0x01, 0x00, 0x00, 0x00, 0x4a, 0xde, 0xad, 0xbe, 0xef
        ]
    );
    let mut packet = h.to_vec();
    packet.extend_from_slice(&[0x47; 188]);
    let (parsed, payload) = RtpHeader::parse(&packet).unwrap();
    assert_eq!(
        (
            parsed.sequence,
            parsed.timestamp,
            parsed.ssrc,
            parsed.marker
        ),
        (1, 0x4a, 0xdead_beef, false)
    );
    assert_eq!(payload.len(), 188);
    assert!(RtpHeader::parse(&packet[..11]).is_none());
    assert!(RtpHeader::parse(&[0x47; 20]).is_none(), "TS is not RTP v2");
}

#[test]
fn random_seeds_give_different_identities() {
    let a = Packetizer::mp2t(1);
    let b = Packetizer::mp2t(2);
    assert_ne!(a.ssrc, b.ssrc);
    assert_ne!(
        (a.sequence_start, a.timestamp_start),
        (b.sequence_start, b.timestamp_start)
    );
    assert_eq!(a.payload_type, 33);
    assert_eq!(Packetizer::mp2t(1), a, "a function of its seed");
}

#[test]
fn the_sdp_names_the_port_the_payload_type_and_the_clock() {
    let sdp = sdp_mp2t(
        "127.0.0.1:5004".parse().unwrap(),
        "127.0.0.1".parse().unwrap(),
        7,
    );
    assert_eq!(
        sdp,
        "v=0\r\no=- 7 1 IN IP4 127.0.0.1\r\ns=penstock\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=video 5004 RTP/AVP 33\r\na=rtpmap:33 MP2T/90000\r\n"
    );
    let v6 = sdp_mp2t("[::1]:5004".parse().unwrap(), "::1".parse().unwrap(), 7);
    assert!(v6.contains("c=IN IP6 ::1\r\n"));
}

#[test]
fn ntp_times() {
    assert_eq!(ntp_from_unix_ns(0), NTP_UNIX_OFFSET_S << 32);
    assert_eq!(
        ntp_from_unix_ns(1_500_000_000),
        ((NTP_UNIX_OFFSET_S + 1) << 32) | 0x8000_0000
    );
    assert_eq!(ntp_middle(0x0001_0002_0003_0004), 0x0002_0003);
}

#[test]
fn timestamps_of_a_pcr_plan_are_the_pcr_base() {
    // A CBR TS at 5 Mbit/s: unit k's timestamp − the first is its PCR time / 300.
    let bytes = cbr_ts(5_000, 5_000_000, 0, 0, 9, true);
    let (_, plan) = plan_bytes(&bytes, &PcrLimits::default()).unwrap();
    let p = Packetizer::mp2t(7);
    for (k, u) in plan.units.iter().enumerate() {
        let ticks = (k * 7) as u128 * 188 * 8 * 27_000_000 / 5_000_000;
        let want = p.timestamp_start.wrapping_add((ticks / 300) as u32);
        let got = p.timestamp(u.offset_ns);
        assert!(
            got.wrapping_sub(want).wrapping_add(1) <= 2,
            "unit {k}: {got} vs {want}"
        );
    }
}

#[test]
fn a_sender_report_with_sdes_and_bye_round_trips() {
    let info = SenderInfo {
        ntp: 0xe1e2_e3e4_0102_0304,
        rtp_timestamp: 90_000,
        packets: 1234,
        octets: 1234 * 1316,
    };
    let mut buf = [0u8; 1500];
    let n = write_sender_report(7, "penstock@host", &info, None, &mut buf).unwrap();
    assert_eq!(n % 4, 0);
    assert_eq!(
        items(&buf[..n]).unwrap(),
        vec![
            RtcpItem::SenderReport { ssrc: 7, info },
            RtcpItem::Other {
                packet_type: PT_SDES
            }
        ]
    );
    let n = write_sender_report(7, "penstock@host", &info, Some("end"), &mut buf).unwrap();
    assert_eq!(
        items(&buf[..n]).unwrap().last(),
        Some(&RtcpItem::Bye { ssrc: 7 })
    );
    assert!(matches!(
        write_sender_report(7, "x", &info, Some(""), &mut buf[..20]),
        Err(RtcpError::Write(_))
    ));
}

#[test]
fn receiver_reports_round_trip_with_negative_loss() {
    let mut buf = [0u8; 1500];
    let blocks = [block(9), block(10)];
    let n = write_receiver_report(42, &blocks, true, &mut buf).unwrap();
    let got = items(&buf[..n]).unwrap();
    assert_eq!(
        got,
        vec![
            RtcpItem::Report {
                reporter: 42,
                block: blocks[0]
            },
            RtcpItem::Report {
                reporter: 42,
                block: blocks[1]
            },
            RtcpItem::Bye { ssrc: 42 },
        ]
    );
}

#[test]
fn invalid_compound_packets_are_refused_by_rule() {
    let mut buf = [0u8; 1500];
    let n = write_receiver_report(42, &[block(9)], false, &mut buf).unwrap();
    let rr = buf[..n].to_vec();
    assert_eq!(items(&[]), Err(RtcpError::Short { bytes: 0 }));
    let mut v1 = rr.clone();
    v1[0] = (v1[0] & 0x3f) | 0x40;
    assert_eq!(
        items(&v1),
        Err(RtcpError::Version {
            index: 0,
            version: 1
        })
    );
    // SDES first.
    let mut sdes_first = rr.clone();
    sdes_first[1] = PT_SDES;
    assert_eq!(
        items(&sdes_first),
        Err(RtcpError::NotReportFirst {
            packet_type: PT_SDES
        })
    );
    // A length beyond the datagram, a tail shorter than a header, padding not last.
    assert!(matches!(
        items(&rr[..n - 4]),
        Err(RtcpError::Length { index: 0, .. })
    ));
    let mut tail = rr.clone();
    tail.extend_from_slice(&[0x80, 201]);
    assert_eq!(items(&tail), Err(RtcpError::Short { bytes: 2 }));
    let mut padded = rr.clone();
    padded.extend_from_slice(&rr);
    padded[0] |= 0x20;
    assert_eq!(items(&padded), Err(RtcpError::Padding { index: 0 }));
    // A second packet of version 0 (rtcp-types' own walk misses this one).
    let mut second = rr.clone();
    second.extend_from_slice(&rr);
    second[n] &= 0x3f;
    assert_eq!(
        items(&second),
        Err(RtcpError::Version {
            index: 1,
            version: 0
        })
    );
    // An RR whose count says more blocks than it holds.
    let mut count = rr.clone();
    count[0] = (count[0] & 0xe0) | 2;
    assert!(matches!(items(&count), Err(RtcpError::Malformed { .. })));
}

#[test]
fn the_session_reports_on_a_randomized_interval_and_ends_with_a_bye() {
    let t = 5_000_000_000u64;
    let mut s = SenderSession::new(7, "a@b", t, 99);
    assert_eq!(s.poll_timeout(), None, "not started");
    let start = Instant::from_nanos(1_000);
    s.start(start);
    let first = s.poll_timeout().unwrap();
    let d = first.as_nanos() - start.as_nanos();
    assert!((t / 4..=t * 3 / 4).contains(&d), "first after {d} ns");
    let info = SenderInfo {
        ntp: 1 << 32,
        rtp_timestamp: 0,
        packets: 0,
        octets: 0,
    };
    let mut buf = [0u8; 1500];
    assert_eq!(
        s.poll_report(Instant::from_nanos(first.as_nanos() - 1), &info, &mut buf),
        Ok(None)
    );
    let mut now = first;
    let mut sum = 0u64;
    for _ in 0..200 {
        let n = s.poll_report(now, &info, &mut buf).unwrap().unwrap();
        assert!(matches!(
            items(&buf[..n]).unwrap()[0],
            RtcpItem::SenderReport { ssrc: 7, .. }
        ));
        let next = s.poll_timeout().unwrap();
        let gap = next.as_nanos() - now.as_nanos();
        assert!((t / 2..t * 3 / 2).contains(&gap), "interval {gap} ns");
        sum += gap;
        now = next;
    }
    let mean = sum / 200;
    assert!(mean > t * 9 / 10 && mean < t * 11 / 10, "mean {mean} ns");
    let n = s.end(&info, "", &mut buf).unwrap().unwrap();
    assert_eq!(
        items(&buf[..n]).unwrap().last(),
        Some(&RtcpItem::Bye { ssrc: 7 })
    );
    assert_eq!(
        (s.poll_timeout(), s.end(&info, "", &mut buf)),
        (None, Ok(None))
    );
    assert_eq!(s.reports_sent(), 201);
}

#[test]
fn receiver_reports_fill_the_stats_and_give_the_round_trip_time() {
    let mut s = SenderSession::new(7, "a@b", 5_000_000_000, 1);
    let sr_ntp = ntp_from_unix_ns(1_000_000_000_000);
    let mut b = block(7);
    b.lsr = ntp_middle(sr_ntp);
    b.dlsr = 65_536 / 2; // the receiver held it 0.5 s
    let mut buf = [0u8; 1500];
    let n = write_receiver_report(42, &[b, block(8)], false, &mut buf).unwrap();
    // It arrives 0.6 s after the SR left: 0.1 s round trip.
    let arrival = ntp_from_unix_ns(1_000_600_000_000);
    s.handle_datagram(arrival, &buf[..n]).unwrap();
    let st = s.stats().clone();
    assert_eq!(
        (
            st.reports,
            st.reporter,
            st.fraction_lost,
            st.cumulative_lost
        ),
        (1, Some(42), 26, -3)
    );
    assert_eq!(
        (st.jitter, st.jitter_ns(), st.other_sources),
        (450, 5_000_000, 1)
    );
    let rtt = st.rtt_ns.unwrap();
    assert!(rtt.abs_diff(100_000_000) < 100_000, "rtt {rtt} ns");
    // Garbage is counted and changes nothing else.
    assert!(s.handle_datagram(arrival, b"\x47garbage").is_err());
    assert_eq!(s.stats().malformed, 1);
    assert_eq!(
        ReceiverStats {
            malformed: 0,
            ..s.stats().clone()
        },
        st
    );
}

proptest! {
    #[test]
    fn headers_round_trip(seq in any::<u16>(), ts in any::<u32>(), ssrc in any::<u32>(), m in any::<bool>(), pt in 0u8..128) {
        let h = RtpHeader { marker: m, payload_type: pt, sequence: seq, timestamp: ts, ssrc };
        let bytes = h.encode();
        prop_assert_eq!(RtpHeader::parse(&bytes), Some((h, &[][..])));
    }

    /// A plan's offsets are PCR ticks rounded up to the ns; the 90 kHz timestamp gives back
    /// the PCR base (ticks / 300) exactly.
    #[test]
    fn rtp_ticks_of_a_pcr_offset_are_its_base(ticks in 0u64..(1u64 << 50)) {
        let ns = (u128::from(ticks) * 1000).div_ceil(27) as u64;
        prop_assert_eq!(rtp_ticks(ns), ticks / 300);
    }

    #[test]
    fn sequence_numbers_count_units_modulo_2_16(start in any::<u16>(), unit in any::<u64>()) {
        let p = Packetizer { ssrc: 1, sequence_start: start, timestamp_start: 0, payload_type: 33, scale: crate::track::Speed::NORMAL };
        prop_assert_eq!(p.sequence(unit), start.wrapping_add(unit as u16));
        prop_assert_eq!(p.sequence(unit.wrapping_add(1)), p.sequence(unit).wrapping_add(1));
    }

    /// Any bytes: a typed refusal or items, never a panic; a session counts the refusal.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = items(&bytes);
        let mut s = SenderSession::new(1, "x", 5_000_000_000, 3);
        let before = s.stats().malformed;
        if s.handle_datagram(0, &bytes).is_err() {
            prop_assert_eq!(s.stats().malformed, before + 1);
        }
    }
}

/// RTSP `Scale`: deadlines run `scale` times faster than media time; timestamps stay media
/// time (1 ms of deadline at scale 2 is 2 ms of media: 180 ticks), sequence numbers unchanged.
#[test]
fn a_scaled_packetizer_stamps_media_time() {
    use crate::track::Speed;
    let normal = Packetizer::mp2t(7);
    let fast = Packetizer {
        scale: Speed::from_ratio(2, 1).unwrap(),
        ..normal
    };
    let slow = Packetizer {
        scale: Speed::from_ratio(1, 2).unwrap(),
        ..normal
    };
    for ms in [0u64, 1, 40, 1000, 7_000] {
        let ns = ms * 1_000_000;
        assert_eq!(
            fast.timestamp(ns).wrapping_sub(normal.timestamp_start),
            (ms * 180) as u32
        );
        assert_eq!(
            slow.timestamp(ns).wrapping_sub(normal.timestamp_start),
            (ms * 45) as u32
        );
        assert_eq!(fast.sequence(ms), normal.sequence(ms));
    }
    // A deadline made by `scale_ns` maps back to its media time within one tick.
    let s = Speed::from_ratio(3, 1).unwrap();
    for media_ns in [0u64, 1, 333, 11_111_111, 40_000_001, 29_999_999_999] {
        let back = s.media_ns(s.scale_ns(media_ns));
        assert!(
            back >= media_ns && back - media_ns < 3,
            "{media_ns} → {back}"
        );
    }
    assert!(Speed::from_ratio(0, 1).is_none());
    assert!(Speed::from_ratio(1, 0).is_none());
    assert!(Speed::from_ratio(1001, 1).is_none());
}
