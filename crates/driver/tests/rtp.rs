//! RTP out of the engine (issue 15): a TS file's PCR plan sent with `StreamSpec::rtp` to a UDP
//! socket on loopback, read back datagram by datagram. Each datagram is one unit behind a
//! 12-byte RTP header whose sequence number counts units and whose timestamp is the unit's
//! PCR time at 90 kHz; the payloads put together are the file. The header is written in
//! place in the pool buffer, so buffers that hold few units (many chunks) and late units
//! skipped unsent (`late = skip`) are the cases where the in-place framing could go wrong.
//! Also the RTCP link beside it: sender reports and a BYE reach a receiver's RTCP port, and a
//! receiver report sent back lands in the link's statistics.

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use penstock_core::endpoint::Endpoint;
use penstock_core::rtp::rtcp::{self, ReportBlock, RtcpItem};
use penstock_core::rtp::{Packetizer, RTP_HEADER_BYTES, RtpHeader, SenderSession};
use penstock_core::schedule::LatePolicy;
use penstock_core::stream::Extent;
use penstock_core::stream::plan::Pacing;
use penstock_core::ts::synth::cbr_ts;
use penstock_core::ts::{PcrLimits, TsPlan, plan_bytes};
use penstock_driver::rtcp::{RtcpLink, RtpCounts, socket_addrs};
use penstock_driver::{Engine, EngineConfig, StreamHandle, StreamReport, StreamSpec};

/// 3,000 packets at 40 Mbit/s (113 ms), a PCR every 10 packets.
fn ts(dir: &std::path::Path) -> (PathBuf, Vec<u8>, TsPlan) {
    let bytes = cbr_ts(3_000, 40_000_000, 5_000, 0, 10, true);
    let (_, plan) = plan_bytes(&bytes, &PcrLimits::default()).unwrap();
    let path = dir.join("clip.ts");
    std::fs::write(&path, &bytes).unwrap();
    (path, bytes, plan)
}

fn engine(buffer_bytes: usize) -> Engine {
    Engine::new(EngineConfig {
        workers: 1,
        pool_buffers: 16,
        buffer_bytes,
        stream_depth: 4,
        ..EngineConfig::default()
    })
    .unwrap()
}

/// Every datagram `rx` gets while the stream `h` runs, and what is queued when it has ended,
/// with the stream's report: it waits for the stream's end, not for a quiet time (a loaded
/// machine paused a sender longer than the 500 ms this once waited, and units went missing).
/// Loopback UDP queues a datagram in the send call, so once the stream has ended the queue
/// only shrinks.
fn receive(rx: &UdpSocket, h: StreamHandle) -> (Vec<Vec<u8>>, StreamReport) {
    // Room for the whole clip (429 datagrams, about 0.6 MB) in the receive buffer: a late
    // start sends half of it at once, and a reader slowed by a loaded machine must not lose
    // datagrams to the kernel (the CI saw 4 of 428 go) — the test checks the sender's gaps.
    // Root may pass net.core.rmem_max (SO_RCVBUFFORCE).
    let _ = rustix::net::sockopt::set_socket_recv_buffer_size_force(rx, 8 << 20)
        .or_else(|_| rustix::net::sockopt::set_socket_recv_buffer_size(rx, 8 << 20));
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            rx.set_read_timeout(Some(Duration::from_millis(20)))
                .unwrap();
            let mut out = Vec::new();
            let mut buf = [0u8; 2048];
            loop {
                match rx.recv(&mut buf) {
                    Ok(n) => out.push(buf[..n].to_vec()),
                    Err(_) if done.load(Ordering::Acquire) => return out,
                    Err(_) => {}
                }
            }
        });
        let report = h.wait().unwrap();
        done.store(true, Ordering::Release);
        (reader.join().unwrap(), report)
    })
}

fn spec(src: &std::path::Path, to: SocketAddr, plan: &TsPlan, rtp: Packetizer) -> StreamSpec {
    let mut s = StreamSpec::new(
        Endpoint::File {
            path: src.to_path_buf(),
        },
        Endpoint::parse(
            &format!("udp://{to}"),
            penstock_core::endpoint::Role::Target,
        )
        .unwrap(),
    );
    s.pacing = Pacing::Units(Arc::from(plan.units.clone()));
    s.extent = Extent {
        offset: 0,
        length: Some(plan.media_bytes),
    };
    s.rtp = Some(rtp);
    s
}

/// Checks every datagram against the unit its sequence number names; returns the unit
/// indices received, in order.
fn check_datagrams(got: &[Vec<u8>], bytes: &[u8], plan: &TsPlan, rtp: &Packetizer) -> Vec<u64> {
    let mut units = Vec::new();
    for d in got {
        let (h, payload) = RtpHeader::parse(d).expect("an RTP packet");
        assert_eq!((h.payload_type, h.ssrc, h.marker), (33, rtp.ssrc, false));
        let k = u64::from(h.sequence.wrapping_sub(rtp.sequence_start));
        let u = plan.units[k as usize];
        assert_eq!(
            h.timestamp,
            rtp.timestamp(u.offset_ns),
            "unit {k}: the PCR time at 90 kHz"
        );
        let at = (k * plan.unit_bytes()) as usize;
        assert_eq!(d.len(), RTP_HEADER_BYTES + u.size_bytes as usize);
        assert!(
            payload == &bytes[at..at + u.size_bytes as usize],
            "unit {k}'s bytes"
        );
        units.push(k);
    }
    units
}

#[test]
fn each_unit_leaves_whole_behind_its_rtp_header_in_any_buffer_size() {
    let dir = tempfile::tempdir().unwrap();
    let (src, bytes, plan) = ts(dir.path());
    // 1 MiB buffers hold the whole clip's 429 units; 8 KiB ones 6 units each (72 chunks).
    for (buffer_bytes, seed) in [(1 << 20, 1u64), (8 << 10, 2)] {
        let rx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let rtp = Packetizer::mp2t(seed);
        let e = engine(buffer_bytes);
        let h = e
            .open(spec(&src, rx.local_addr().unwrap(), &plan, rtp))
            .unwrap();
        let (got, report) = receive(&rx, h);
        let units = check_datagrams(&got, &bytes, &plan, &rtp);
        assert_eq!(
            units,
            (0..plan.units.len() as u64).collect::<Vec<_>>(),
            "{buffer_bytes}-byte buffers: every unit once, in order"
        );
        // The stream's counts are the file's bytes and one unit per datagram.
        assert_eq!(
            (report.bytes, report.units),
            (plan.media_bytes, plan.units.len() as u64)
        );
    }
}

#[test]
fn late_units_skipped_leave_gaps_in_the_sequence_and_the_rest_go_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (src, bytes, plan) = ts(dir.path());
    let rx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let rtp = Packetizer::mp2t(3);
    let e = engine(8 << 10);
    let mut s = spec(&src, rx.local_addr().unwrap(), &plan, rtp);
    s.late = LatePolicy::Skip;
    // Unit 0 was due 60 ms ago: about half the clip is late by more than the 1 ms threshold.
    let now = penstock_driver::clock::now();
    s.start_at = Some(penstock_core::time::Instant::from_nanos(
        now.as_nanos() - 60_000_000,
    ));
    let h = e.open(s).unwrap();
    let (got, report) = receive(&rx, h);
    let units = check_datagrams(&got, &bytes, &plan, &rtp);
    let skipped = report.lateness.as_ref().unwrap().skipped_units();
    assert!(skipped > 50, "{skipped} units skipped");
    assert_eq!(
        units.len() as u64 + skipped,
        plan.units.len() as u64,
        "received {} datagrams, the engine sent {} units and skipped {skipped} of {}",
        units.len(),
        report.units,
        plan.units.len()
    );
    assert!(units.windows(2).all(|w| w[0] < w[1]), "in order");
    assert_eq!(*units.last().unwrap(), plan.units.len() as u64 - 1);
}

#[test]
fn the_rtcp_link_reports_ends_with_a_bye_and_takes_receiver_reports_in() {
    let rtp_rx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    // The receiver's RTCP port is its RTP port + 1 (bind both: find a free pair).
    let (rtp_rx, rtcp_rx) = (0..20)
        .find_map(|_| {
            let a = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).ok()?;
            let port = a.local_addr().ok()?.port().checked_add(1)?;
            let b = UdpSocket::bind((Ipv4Addr::LOCALHOST, port)).ok()?;
            Some((a, b))
        })
        .unwrap_or_else(|| panic!("no free port pair near {:?}", rtp_rx.local_addr()));
    let tx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    tx.connect(rtp_rx.local_addr().unwrap()).unwrap();
    let (local, peer) = {
        use std::os::fd::AsFd;
        socket_addrs(tx.as_fd()).unwrap()
    };
    assert_eq!(peer, rtp_rx.local_addr().unwrap());
    let rtp = Packetizer::mp2t(9);
    let anchor = penstock_driver::clock::now();
    // A 20 ms interval: reports within the test's time.
    let session = SenderSession::new(rtp.ssrc, "penstock@test", 20_000_000, 4);
    let mut link = RtcpLink::open(local, peer, rtp, anchor, session).unwrap();
    assert_eq!(link.peer(), rtcp_rx.local_addr().unwrap());
    if link.paired() {
        assert_eq!(link.local_addr().unwrap().port(), local.port() + 1);
    }
    rtcp_rx
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let counts = RtpCounts {
        packets: 10,
        octets: 13_160,
    };
    // Turn until a report arrives.
    let mut buf = [0u8; 1500];
    let mut srs = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while srs.is_empty() && std::time::Instant::now() < deadline {
        link.turn(counts).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        rtcp_rx.set_nonblocking(true).unwrap();
        while let Ok(n) = rtcp_rx.recv(&mut buf) {
            let mut items = Vec::new();
            rtcp::parse(&buf[..n], &mut items).unwrap();
            srs.extend(items);
        }
    }
    let Some(RtcpItem::SenderReport { ssrc, info }) = srs.first().copied() else {
        panic!("no sender report: {srs:?}");
    };
    assert_eq!((ssrc, info.packets, info.octets), (rtp.ssrc, 10, 13_160));
    // The report's RTP time is the anchor's timestamp plus the time since (a few ms here).
    let since = info.rtp_timestamp.wrapping_sub(rtp.timestamp_start);
    assert!(since < 90_000 * 5, "{since} ticks after the anchor");
    // A receiver report from the peer's address reaches the stats.
    let block = ReportBlock {
        ssrc: rtp.ssrc,
        fraction_lost: 3,
        cumulative_lost: 7,
        extended_highest_sequence: 99,
        jitter: 900,
        lsr: 0,
        dlsr: 0,
    };
    let n = rtcp::write_receiver_report(77, &[block], false, &mut buf).unwrap();
    rtcp_rx
        .send_to(&buf[..n], link.local_addr().unwrap())
        .unwrap();
    rtcp_rx
        .send_to(b"garbage", link.local_addr().unwrap())
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while link.stats().reports == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
        link.turn(counts).unwrap();
    }
    let st = link.stats().clone();
    assert_eq!(
        (
            st.reports,
            st.fraction_lost,
            st.cumulative_lost,
            st.jitter_ns()
        ),
        (1, 3, 7, 10_000_000)
    );
    // The end: a BYE.
    link.finish(counts, "end of stream").unwrap();
    rtcp_rx.set_nonblocking(false).unwrap();
    let mut bye = false;
    while let Ok(n) = rtcp_rx.recv(&mut buf) {
        let mut items = Vec::new();
        rtcp::parse(&buf[..n], &mut items).unwrap();
        if items.contains(&RtcpItem::Bye { ssrc: rtp.ssrc }) {
            bye = true;
            break;
        }
    }
    assert!(bye, "a BYE at the end");
    assert_eq!(link.stats().malformed, 1, "the garbage was counted");
}
