//! `penstock stream --timing pcr` and `--rtp` as a user runs them (issue 15, items 1 and 2):
//! the built binary, real loopback sockets, real receivers — the test's own sockets and
//! ffmpeg — and clips made by ffmpeg (or, without it, by `penstock_core::ts::synth`).
//!
//! Timing is never asserted as an absolute figure of this machine alone: the PCR test
//! measures, in the same run and at the same time, a baseline sender (a plain thread sleeping
//! until the same deadlines) and holds penstock to the baseline's p99 plus 1 ms. The clip's length is
//! `PENSTOCK_PCR_CLIP_S` seconds (default 10; the 60-second run of the acceptance is
//! the same test with 60, recorded under bench/results); `PENSTOCK_PCR_ARGS` adds flags to
//! penstock's command (e.g. `--realtime`).

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use penstock_core::rtp::RtpHeader;
use penstock_core::rtp::rtcp::{self, ReportBlock, RtcpItem};
use penstock_core::ts::synth::cbr_ts;

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_penstock");

/// The tests of this file one at a time: the timing test measures lateness against its
/// own baseline, and an ffmpeg encode or decode of a sibling test on the same 2 CPUs would
/// be noise in both (a flake seen under `cargo test --workspace`).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run penstock")
}

/// ffmpeg and ffprobe (penstock_testreq: SKIPPED and counted, or a failure under
/// PENSTOCK_TEST_REQUIRE=all).
fn have_ffmpeg() -> bool {
    penstock_testreq::require_all(&["ffmpeg", "ffprobe"])
}

/// A `seconds`-long MPEG-2 video TS at 4 Mbit/s in a 4.5 Mbit/s constant-rate multiplex.
fn ffmpeg_clip(path: &Path, seconds: u32) {
    let o = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi"])
        .args(["-i", "testsrc=size=320x240:rate=25", "-t"])
        .arg(seconds.to_string())
        .args([
            "-c:v",
            "mpeg2video",
            "-b:v",
            "4M",
            "-minrate",
            "4M",
            "-maxrate",
            "4M",
        ])
        .args(["-bufsize", "1M", "-muxrate", "4500000", "-f", "mpegts"])
        .arg(path)
        .output()
        .expect("ffmpeg");
    assert!(o.status.success(), "ffmpeg: {}", text(&o.stderr));
}

/// The PCR time in seconds of every TS packet of `ts`, computed here from the PCRs of the
/// first PID that carries one: linear between consecutive PCRs, extended at the end
/// intervals' rates. (The clips have no discontinuity; the 33-bit wrap is unwrapped.)
fn pcr_times(ts: &[u8]) -> Vec<f64> {
    let packets: Vec<&[u8]> = ts.chunks_exact(188).collect();
    let mut pid = None;
    let mut pcrs: Vec<(usize, f64)> = Vec::new();
    let mut last: Option<u64> = None;
    let mut unwrapped = 0u64;
    for (i, p) in packets.iter().enumerate() {
        assert_eq!(p[0], 0x47, "packet {i}: sync byte");
        let this_pid = (u16::from(p[1] & 0x1f) << 8) | u16::from(p[2]);
        let has_pcr = p[3] & 0x20 != 0 && p[4] >= 7 && p[5] & 0x10 != 0;
        if !has_pcr || *pid.get_or_insert(this_pid) != this_pid {
            continue;
        }
        let b = &p[6..12];
        let base = (u64::from(b[0]) << 25)
            | (u64::from(b[1]) << 17)
            | (u64::from(b[2]) << 9)
            | (u64::from(b[3]) << 1)
            | (u64::from(b[4]) >> 7);
        let pcr = base * 300 + ((u64::from(b[4] & 1) << 8) | u64::from(b[5]));
        let modulus = (1u64 << 33) * 300;
        if let Some(l) = last {
            unwrapped += (pcr + modulus - l) % modulus;
        }
        last = Some(pcr);
        pcrs.push((i, unwrapped as f64 / 27e6));
    }
    assert!(pcrs.len() >= 2, "the clip carries PCRs");
    (0..packets.len())
        .map(|i| {
            let k = pcrs.partition_point(|&(at, _)| at <= i);
            let (a, b) = match k {
                0 => (pcrs[0], pcrs[1]),
                k if k == pcrs.len() => (pcrs[k - 2], pcrs[k - 1]),
                k => (pcrs[k - 1], pcrs[k]),
            };
            a.1 + (b.1 - a.1) * (i as f64 - a.0 as f64) / (b.0 as f64 - a.0 as f64)
        })
        .collect()
}

/// Datagrams received until `quiet` passes without one (after the first), with their arrival.
fn receive(sock: UdpSocket, first_within: Duration, quiet: Duration) -> Vec<(Instant, Vec<u8>)> {
    sock.set_read_timeout(Some(first_within)).unwrap();
    let mut out = Vec::new();
    let mut buf = vec![0u8; 65536];
    while let Ok(n) = sock.recv(&mut buf) {
        out.push((Instant::now(), buf[..n].to_vec()));
        sock.set_read_timeout(Some(quiet)).unwrap();
    }
    out
}

/// p99 of |error − median error| in ms, where a datagram's error is its arrival minus its
/// first TS packet's PCR time (`times`, per packet of the bytes received, in order).
fn p99_ms(
    arrivals: &[(Instant, Vec<u8>)],
    times: &[f64],
    packets_of: impl Fn(&[u8]) -> usize,
) -> f64 {
    let t0 = arrivals[0].0;
    let mut packet = 0usize;
    let mut err: Vec<f64> = arrivals
        .iter()
        .map(|(at, d)| {
            let e = at.duration_since(t0).as_secs_f64() - (times[packet] - times[0]);
            packet += packets_of(d);
            e
        })
        .collect();
    let mut sorted = err.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    for e in &mut err {
        *e = (*e - median).abs();
    }
    err.sort_by(f64::total_cmp);
    err[(err.len() * 99 / 100).min(err.len() - 1)] * 1e3
}

fn clip_seconds() -> u32 {
    std::env::var("PENSTOCK_PCR_CLIP_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10)
}

/// The clip for the timing test: ffmpeg's when it is here, else a synthetic CBR TS.
fn timing_clip(dir: &Path, seconds: u32) -> (PathBuf, Vec<u8>, &'static str) {
    let path = dir.join("clip.ts");
    let what = if have_ffmpeg() {
        ffmpeg_clip(&path, seconds);
        "ffmpeg's MPEG-2 clip"
    } else {
        let packets = u64::from(seconds) * 4_500_000 / (188 * 8);
        std::fs::write(&path, cbr_ts(packets, 4_500_000, 0, 0, 20, true)).unwrap();
        "a synthetic CBR TS"
    };
    let bytes = std::fs::read(&path).unwrap();
    (path, bytes, what)
}

#[test]
fn pcr_timing_sends_every_datagram_at_its_pcr_time() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let seconds = clip_seconds();
    let (clip, bytes, what) = timing_clip(dir.path(), seconds);
    let times = pcr_times(&bytes);
    let rx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let to = rx.local_addr().unwrap();
    // The baseline: a plain thread sending the same units at the same PCR deadlines, now.
    let base_rx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let base_to = base_rx.local_addr().unwrap();
    let units: Vec<(usize, Vec<u8>)> = bytes
        .chunks(7 * 188)
        .enumerate()
        .map(|(k, c)| (k * 7, c.to_vec()))
        .collect();
    let base_times = times.clone();
    let quiet = Duration::from_secs(3);
    let penstock_rx = thread::spawn(move || receive(rx, Duration::from_secs(30), quiet));
    let baseline_rx = thread::spawn(move || receive(base_rx, Duration::from_secs(30), quiet));
    let baseline = thread::spawn(move || {
        let tx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let start = Instant::now() + Duration::from_millis(50);
        for (first, unit) in &units {
            let due = start + Duration::from_secs_f64(base_times[*first] - base_times[0]);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                thread::sleep(wait);
            }
            tx.send_to(unit, base_to).unwrap();
        }
    });
    let extra = std::env::var("PENSTOCK_PCR_ARGS").unwrap_or_default();
    let mut args = vec![
        "stream".to_string(),
        clip.display().to_string(),
        format!("udp://{to}"),
        "--timing".into(),
        "pcr".into(),
    ];
    args.extend(extra.split_whitespace().map(String::from));
    let o = Command::new(BIN)
        .args(&args)
        .output()
        .expect("run penstock");
    assert!(o.status.success(), "penstock: {}", text(&o.stderr));
    baseline.join().unwrap();
    let got = penstock_rx.join().unwrap();
    let base = baseline_rx.join().unwrap();
    // Every byte, in order: nothing lost on the way.
    let received: Vec<u8> = got.iter().flat_map(|(_, d)| d.iter().copied()).collect();
    assert_eq!(received.len(), bytes.len(), "bytes received");
    assert!(received == bytes, "the datagrams put together are the file");
    assert_eq!(
        got.len(),
        bytes.len().div_ceil(7 * 188),
        "one datagram per 7 packets"
    );
    assert_eq!(base.len(), got.len(), "the baseline lost nothing either");
    let ours = p99_ms(&got, &times, |d| d.len() / 188);
    let theirs = p99_ms(&base, &times, |d| d.len() / 188);
    let line = format!(
        "{what}, {seconds} s, {} datagrams: arrival vs PCR time p99 {ours:.3} ms (penstock), {theirs:.3} ms (baseline: a sleeping thread, same run)",
        got.len()
    );
    println!("{line}\n{}", text(&o.stderr).trim_end());
    // Against the baseline of the same run, never an absolute time (issue 31: a loaded CI
    // machine made penstock 1.11 ms beside a 0.19 ms baseline); the absolute p99 is the
    // benches' (`bench periodic`).
    assert!(
        ours <= theirs + 1.0,
        "{line}: more than the baseline + 1 ms p99"
    );
}

/// ffprobe's video packets of a TS in decoding order, as MD5s of their data.
fn es_packets(path: &Path) -> Vec<String> {
    let o = Command::new("ffprobe")
        .args(["-v", "error", "-select_streams", "v", "-show_packets"])
        .args(["-show_data_hash", "MD5", "-of", "json"])
        .arg(path)
        .output()
        .expect("ffprobe");
    assert!(
        o.status.success(),
        "ffprobe {}: {}",
        path.display(),
        text(&o.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("ffprobe's JSON");
    let mut rows: Vec<(i64, String)> = j["packets"]
        .as_array()
        .expect("packets")
        .iter()
        .map(|p| {
            (
                p["dts"].as_i64().expect("a dts"),
                p["data_hash"].as_str().expect("a data hash").to_string(),
            )
        })
        .collect();
    assert!(
        rows.len() > 10,
        "ffprobe found video packets in {}",
        path.display()
    );
    rows.sort();
    rows.into_iter().map(|(_, h)| h).collect()
}

/// An ffmpeg receiver writing what it gets to `out` (stream copy, remuxed), ending on its own
/// (end of input: the UDP timeout, or an RTCP BYE) or killed after `limit`.
fn ffmpeg_receiver(input: &str, extra: &[&str], out: &Path, log: &Path) -> std::process::Child {
    Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "warning", "-y"])
        .args(extra)
        .args(["-i", input, "-map", "0", "-c", "copy", "-f", "mpegts"])
        .arg(out)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("ffmpeg")
}

fn wait_with_limit(
    child: &mut std::process::Child,
    limit: Duration,
) -> Option<std::process::ExitStatus> {
    let until = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// Waits (a bounded poll, no fixed sleep) until a UDP socket is bound to each of `ports`
/// (the kernel's /proc/net/udp and udp6 tables: local address `HEXADDR:HEXPORT`), i.e. until
/// the receiver `child` listens; fails if the receiver exits first or never binds.
fn wait_udp_bound(child: &mut std::process::Child, ports: &[u16], log: &Path) {
    let bound = |port: u16| {
        ["/proc/net/udp", "/proc/net/udp6"].iter().any(|t| {
            std::fs::read_to_string(t).is_ok_and(|table| {
                table.lines().skip(1).any(|l| {
                    l.split_whitespace()
                        .nth(1)
                        .and_then(|local| local.rsplit_once(':'))
                        .is_some_and(|(_, p)| u16::from_str_radix(p, 16) == Ok(port))
                })
            })
        })
    };
    let t0 = Instant::now();
    while !ports.iter().all(|&p| bound(p)) {
        if let Some(st) = child.try_wait().unwrap() {
            panic!(
                "the receiver exited ({st}) before binding {ports:?}: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the receiver did not bind {ports:?}"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

/// A free UDP port on loopback whose successor is free too (an RTP/RTCP pair); the sockets are
/// closed again for the receiver to bind.
fn free_port_pair() -> u16 {
    for _ in 0..50 {
        let a = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let p = a.local_addr().unwrap().port();
        if p.is_multiple_of(2) && UdpSocket::bind((Ipv4Addr::LOCALHOST, p + 1)).is_ok() {
            return p;
        }
    }
    panic!("no free port pair");
}

#[test]
fn ffmpeg_receives_every_packet_of_a_pcr_paced_stream() {
    let _serial = serial();
    if !have_ffmpeg() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let clip = dir.path().join("clip.ts");
    ffmpeg_clip(&clip, 5);
    let port = free_port_pair();
    let (out, log) = (dir.path().join("out.ts"), dir.path().join("ffmpeg.log"));
    // ffmpeg's UDP input ends after 2 s without data.
    let mut ff = ffmpeg_receiver(
        &format!("udp://127.0.0.1:{port}?timeout=2000000&fifo_size=1000000&overrun_nonfatal=1"),
        &[],
        &out,
        &log,
    );
    wait_udp_bound(&mut ff, &[port], &log);
    let o = run(&[
        "stream",
        clip.to_str().unwrap(),
        &format!("udp://127.0.0.1:{port}"),
        "--timing",
        "auto",
    ]);
    assert!(o.status.success(), "penstock: {}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("--timing auto: the PCR"),
        "{}",
        text(&o.stderr)
    );
    let status = wait_with_limit(&mut ff, Duration::from_secs(30));
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(status.is_some(), "ffmpeg did not end: {log}");
    let (src, got) = (es_packets(&clip), es_packets(&out));
    assert_eq!(
        got.len(),
        src.len(),
        "every video packet reached ffmpeg; its log: {log}"
    );
    assert_eq!(
        got, src,
        "identical video packets (ffmpeg remuxes the TS around them)"
    );
    assert!(
        !log.contains("Continuity check failed") && !log.contains("discontinuity"),
        "ffmpeg saw a gap: {log}"
    );
}

#[test]
fn ffmpeg_receives_rtp_from_an_sdp_and_ends_at_the_bye() {
    let _serial = serial();
    if !have_ffmpeg() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let clip = dir.path().join("clip.ts");
    ffmpeg_clip(&clip, 5);
    let port = free_port_pair();
    let to: SocketAddr = (Ipv4Addr::LOCALHOST, port).into();
    // The SDP penstock writes (--sdp), written ahead here so that ffmpeg listens first.
    let sdp = dir.path().join("stream.sdp");
    std::fs::write(
        &sdp,
        penstock_core::rtp::sdp_mp2t(to, Ipv4Addr::LOCALHOST.into(), 1),
    )
    .unwrap();
    let (out, log) = (dir.path().join("out.ts"), dir.path().join("ffmpeg.log"));
    let mut ff = ffmpeg_receiver(
        sdp.to_str().unwrap(),
        &["-protocol_whitelist", "file,udp,rtp"],
        &out,
        &log,
    );
    // ffmpeg's RTP input binds the RTP port and the RTCP port after it.
    wait_udp_bound(&mut ff, &[port, port + 1], &log);
    let written = dir.path().join("written.sdp");
    let o = run(&[
        "stream",
        clip.to_str().unwrap(),
        &format!("udp://{to}"),
        "--rtp",
        "--sdp",
        written.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "penstock: {}", text(&o.stderr));
    // No timeout on ffmpeg's side: the RTCP BYE ends its input.
    let status = wait_with_limit(&mut ff, Duration::from_secs(15));
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        status.is_some_and(|s| s.success()),
        "ffmpeg did not end at the BYE: {status:?} {log}"
    );
    let (src, got) = (es_packets(&clip), es_packets(&out));
    // ffmpeg's RTP MP2T depacketizer is not flushed at the BYE: the last video packet (whose
    // PES has no length, so it ends only at the end of input) stays in it (docs/rtp.md).
    assert!(
        got.len() + 1 >= src.len() && got[..] == src[..got.len()],
        "{} of {} video packets, identical from the first; ffmpeg's log: {log}",
        got.len(),
        src.len()
    );
    // The SDP penstock wrote is the one ffmpeg read, but for its session id.
    let mine = std::fs::read_to_string(&written).unwrap();
    let theirs = std::fs::read_to_string(&sdp).unwrap();
    let body = |s: &str| {
        s.lines()
            .filter(|l| !l.starts_with("o="))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(body(&mine), body(&theirs));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["rtp"]["payload_type"], 33);
    assert!(
        j["rtp"]["rtcp_sender_reports"].as_u64().unwrap() >= 1,
        "{j}"
    );
}

#[test]
fn rtp_packets_are_the_file_and_receiver_reports_reach_the_summary_and_the_metrics() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    // 3 s of a synthetic 4 Mbit/s TS.
    let bytes = cbr_ts(8_000, 4_000_000, 123, 0, 15, true);
    let clip = dir.path().join("clip.ts");
    std::fs::write(&clip, &bytes).unwrap();
    let port = free_port_pair();
    let rtp_rx = UdpSocket::bind((Ipv4Addr::LOCALHOST, port)).unwrap();
    let rtcp_rx = UdpSocket::bind((Ipv4Addr::LOCALHOST, port + 1)).unwrap();
    let media =
        thread::spawn(move || receive(rtp_rx, Duration::from_secs(30), Duration::from_secs(2)));
    // The receiver's RTCP: answer each SR with an RR naming it; stop at the BYE.
    let control = thread::spawn(move || {
        rtcp_rx
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut buf = [0u8; 1500];
        let (mut srs, mut bye) = (0, false);
        while let Ok((n, from)) = rtcp_rx.recv_from(&mut buf) {
            let mut items = Vec::new();
            rtcp::parse(&buf[..n], &mut items).unwrap();
            for item in items {
                match item {
                    RtcpItem::SenderReport { ssrc, info } => {
                        srs += 1;
                        let block = ReportBlock {
                            ssrc,
                            fraction_lost: 64,
                            cumulative_lost: 5,
                            extended_highest_sequence: 1,
                            jitter: 180,
                            lsr: penstock_core::rtp::ntp_middle(info.ntp),
                            dlsr: 0,
                        };
                        let mut out = [0u8; 200];
                        let n =
                            rtcp::write_receiver_report(4242, &[block], false, &mut out).unwrap();
                        rtcp_rx.send_to(&out[..n], from).unwrap();
                    }
                    RtcpItem::Bye { .. } => bye = true,
                    _ => {}
                }
            }
            if bye {
                break;
            }
        }
        (srs, bye)
    });
    let mut child = Command::new(BIN)
        .args(["stream", clip.to_str().unwrap()])
        .arg(format!("udp://127.0.0.1:{port}"))
        .args(["--rtp", "--rtcp-interval", "200ms", "--json"])
        .args(["--metrics", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The metrics address from stderr; the rest of stderr kept for messages.
    let stderr = child.stderr.take().unwrap();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let err_lines = thread::spawn(move || {
        use std::io::BufRead;
        let mut all = String::new();
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(a) = line
                .strip_prefix("penstock: metrics on http://")
                .and_then(|r| r.strip_suffix("/metrics"))
            {
                let _ = addr_tx.send(a.to_string());
            }
            all += &line;
            all.push('\n');
        }
        all
    });
    let addr = addr_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("a metrics address");
    // Scrape while the stream runs until the receiver's report shows (bounded wait).
    let reports = "penstock_rtcp_receiver_reports_total";
    let mut page = String::new();
    for _ in 0..1000 {
        page = common::scrape(&addr).unwrap_or_default();
        if common::sample(&page, reports).is_some_and(|n| n >= 1.0) {
            break;
        }
        thread::sleep(Duration::from_millis(5));
    }
    assert!(
        common::sample(&page, reports).is_some_and(|n| n >= 1.0),
        "{page}"
    );
    assert_eq!(
        common::sample(&page, "penstock_rtcp_packets_lost"),
        Some(5.0),
        "{page}"
    );
    assert_eq!(
        common::sample(&page, "penstock_rtcp_fraction_lost_ratio"),
        Some(0.25)
    );
    assert_eq!(
        common::sample(&page, "penstock_rtcp_jitter_seconds"),
        Some(0.002)
    );
    common::assert_promtool_clean(&page);
    let o = child.wait_with_output().unwrap();
    let err = err_lines.join().unwrap();
    assert!(o.status.success(), "penstock: {err}");
    let got = media.join().unwrap();
    let (srs, bye) = control.join().unwrap();
    assert!(srs >= 2 && bye, "{srs} sender reports, BYE {bye}");
    // Every datagram: an RTP header, consecutive sequence numbers, the file's next 7 packets.
    let mut payload = Vec::new();
    let mut seq = None;
    for (_, d) in &got {
        let (h, p) = RtpHeader::parse(d).expect("RTP");
        assert_eq!(h.payload_type, 33);
        if let Some(s) = seq {
            assert_eq!(h.sequence, u16::wrapping_add(s, 1));
        }
        seq = Some(h.sequence);
        payload.extend_from_slice(p);
    }
    assert!(payload == bytes, "the payloads put together are the file");
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let r = &j["rtp"];
    assert!(r["rtcp_receiver_reports"].as_u64().unwrap() >= 1, "{j}");
    assert_eq!(
        (r["cumulative_lost"].as_i64(), r["fraction_lost"].as_f64()),
        (Some(5), Some(0.25))
    );
    assert_eq!(r["jitter_ns"].as_u64(), Some(2_000_000));
    assert!(r["rtt_ns"].as_u64().is_some(), "a round trip from LSR: {j}");
    assert_eq!(j["bytes"].as_u64(), Some(bytes.len() as u64));
}

#[test]
fn bad_media_and_bad_flags_are_refused_before_anything_is_sent() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.ts");
    std::fs::write(&junk, vec![0u8; 5000]).unwrap();
    let rx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let to = format!("udp://{}", rx.local_addr().unwrap());
    let o = run(&["stream", junk.to_str().unwrap(), &to, "--timing", "pcr"]);
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("not MPEG-TS"),
        "{}",
        text(&o.stderr)
    );
    // No PCR.
    let nopcr = dir.path().join("nopcr.ts");
    std::fs::write(
        &nopcr,
        penstock_core::ts::synth::ts_with_pcrs(100, &[], false),
    )
    .unwrap();
    let o = run(&["stream", nopcr.to_str().unwrap(), &to, "--timing", "pcr"]);
    assert!(text(&o.stderr).contains("no PCR"), "{}", text(&o.stderr));
    // Nothing arrived from either.
    rx.set_nonblocking(true).unwrap();
    assert!(rx.recv(&mut [0u8; 2048]).is_err(), "nothing was sent");
    let good = dir.path().join("good.ts");
    std::fs::write(&good, cbr_ts(100, 1_000_000, 0, 0, 10, true)).unwrap();
    let g = good.to_str().unwrap();
    for (args, says) in [
        (
            vec!["--timing", "pcr", "--rate", "1Mbit/s"],
            "drop --period",
        ),
        (vec!["--timing", "pcr", "--speed", "2"], "--timing tracks"),
        (vec!["--timing", "pcr", "--ts-packets", "8"], "1 to 7"),
        (vec!["--from", "1s"], "--timing tracks or pcr"),
    ] {
        let mut a = vec!["stream", g, &to];
        a.extend(args.iter().copied());
        let o = run(&a);
        assert!(!o.status.success(), "{args:?} accepted");
        assert!(
            text(&o.stderr).contains(says),
            "{args:?}: {}",
            text(&o.stderr)
        );
    }
    let o = run(&["stream", g, "tcp://127.0.0.1:9", "--rtp"]);
    assert!(
        text(&o.stderr).contains("--rtp sends to a udp:// target"),
        "{}",
        text(&o.stderr)
    );
    // auto on a file that is not TS: no timing of its own, a burst.
    let plain = dir.path().join("notes.txt");
    std::fs::write(&plain, b"hello\n").unwrap();
    let out = dir.path().join("copy.txt");
    let o = run(&[
        "stream",
        plain.to_str().unwrap(),
        out.to_str().unwrap(),
        "--timing",
        "auto",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("burst"), "{}", text(&o.stderr));
    assert_eq!(std::fs::read(&out).unwrap(), b"hello\n");
}

/// A 6 s H.264 + AAC MP4 (moov at the end), key frames every 2 s.
fn mp4_clip(path: &Path) {
    let o = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y"])
        .args(["-f", "lavfi", "-i", "testsrc=size=320x240:rate=25"])
        .args(["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000"])
        .args([
            "-t",
            "6",
            "-c:v",
            "libx264",
            "-preset",
            "ultrafast",
            "-g",
            "50",
        ])
        .args(["-keyint_min", "50", "-sc_threshold", "0", "-c:a", "aac"])
        .arg(path)
        .output()
        .expect("ffmpeg");
    assert!(o.status.success(), "{}", text(&o.stderr));
}

/// The movie of an MP4 file, read by the core (the moov found by its type).
fn mp4_movie(file: &[u8]) -> penstock_core::mp4::Movie {
    let at = file.windows(4).position(|w| w == b"moov").unwrap() - 4;
    let len = u32::from_be_bytes(file[at..at + 4].try_into().unwrap()) as usize;
    penstock_core::mp4::parse_movie(
        &file[at + 8..at + len],
        file.len() as u64,
        &Default::default(),
    )
    .unwrap()
}

#[test]
fn an_mp4_is_paced_by_its_samples_and_from_starts_at_a_sync_sample() {
    let _serial = serial();
    if !have_ffmpeg() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let clip = dir.path().join("clip.mp4");
    mp4_clip(&clip);
    let bytes = std::fs::read(&clip).unwrap();
    let movie = mp4_movie(&bytes);
    let video = movie.video().unwrap();

    // --timing auto: the samples' decode times (the whole file, in order, over ~6 s).
    let rx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let to = rx.local_addr().unwrap();
    let got = thread::spawn(move || receive(rx, Duration::from_secs(30), Duration::from_secs(3)));
    let o = run(&[
        "stream",
        clip.to_str().unwrap(),
        &format!("udp://{to}"),
        "--timing",
        "auto",
    ]);
    assert!(o.status.success(), "penstock: {}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(err.contains("the samples' decode times of an MP4"), "{err}");
    assert!(err.contains("MP4 samples: track 1 avc1."), "{err}");
    let got = got.join().unwrap();
    let received: Vec<u8> = got.iter().flat_map(|(_, d)| d.iter().copied()).collect();
    assert!(received == bytes, "the datagrams put together are the file");
    // Paced, not a burst: the last video sample is due 5.96 s after the first; the datagrams
    // arrive spread over (at least most of) that. A lower bound only.
    let span = got.last().unwrap().0.duration_since(got[0].0).as_secs_f64();
    let last_due = (video.samples.last().unwrap().dts - video.edit.media_time) as f64
        / f64::from(video.timescale);
    println!(
        "{} datagrams over {span:.3} s; last video sample due at {last_due:.3} s",
        got.len()
    );
    assert!(
        span >= 0.9 * last_due,
        "{span} s for {last_due} s of samples"
    );

    // --from 3s: the video sync sample at or before 3 s is the one at 2 s (frame 50).
    let rx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let to = rx.local_addr().unwrap();
    let got = thread::spawn(move || receive(rx, Duration::from_secs(30), Duration::from_secs(3)));
    let o = run(&[
        "stream",
        clip.to_str().unwrap(),
        &format!("udp://{to}"),
        "--timing",
        "auto",
        "--from",
        "3s",
    ]);
    assert!(o.status.success(), "penstock: {}", text(&o.stderr));
    let got = got.join().unwrap();
    let received: Vec<u8> = got.iter().flat_map(|(_, d)| d.iter().copied()).collect();
    let sync = video.sync_at_or_before(3 * u64::from(video.timescale) + video.edit.media_time);
    assert_eq!(sync, 50);
    // From the first sample of any track at or after that sync sample's offset.
    let from = video.samples[sync].offset;
    let first = movie
        .tracks
        .iter()
        .flat_map(|t| t.samples.iter().map(|s| s.offset))
        .filter(|&o| o >= from)
        .min()
        .unwrap();
    assert_eq!(first, from);
    assert!(
        text(&o.stderr).contains(&format!("from byte {from}")),
        "{}",
        text(&o.stderr)
    );
    assert!(
        received == bytes[from as usize..],
        "the bytes from the sync sample on"
    );

    // --timing samples of a file that is no MP4: refused, nothing sent.
    let o = run(&[
        "stream",
        "/etc/hostname",
        &format!("udp://{to}"),
        "--timing",
        "samples",
    ]);
    assert!(!o.status.success());
}

/// `--from` with `--timing pcr` starts at the key frame at or before the time (the file's
/// key-frame index: the one RTSP's `Range: npt=` and HLS use), not at the PCR at or before
/// it, which lands mid-GOP: nothing decodes until the next key frame (issue 32 item 6).
#[test]
fn from_starts_a_ts_at_the_key_frame_at_or_before_it() {
    if !have_ffmpeg() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let clip = dir.path().join("gop2s.ts");
    // 6 s of H.264, a key frame every 2 s exactly (0, 2, 4 s).
    let o = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi"])
        .args(["-i", "testsrc=size=320x240:rate=25", "-t", "6"])
        .args(["-c:v", "libx264", "-preset", "ultrafast", "-bf", "0"])
        .args(["-g", "50", "-keyint_min", "50", "-sc_threshold", "0"])
        .args(["-f", "mpegts"])
        .arg(&clip)
        .output()
        .expect("ffmpeg");
    assert!(o.status.success(), "ffmpeg: {}", text(&o.stderr));
    let bytes = std::fs::read(&clip).unwrap();
    // ffprobe's key packets: their times and the byte offsets their PES start at.
    let o = Command::new("ffprobe")
        .args(["-v", "error", "-select_streams", "v", "-show_entries"])
        .args(["packet=pts_time,pos,flags", "-of", "csv=p=0"])
        .arg(&clip)
        .output()
        .expect("ffprobe");
    assert!(o.status.success(), "ffprobe: {}", text(&o.stderr));
    let packets: Vec<(f64, u64, bool)> = text(&o.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            Some((
                f[0].parse().ok()?,
                f[1].parse().ok()?,
                f[2].starts_with('K'),
            ))
        })
        .collect();
    let t0 = packets[0].0;
    let keys: Vec<(f64, u64)> = packets
        .iter()
        .filter(|p| p.2)
        .map(|p| (p.0 - t0, p.1))
        .collect();
    assert!(keys.len() >= 3, "key frames at 0, 2 and 4 s: {keys:?}");
    // --from 3.5s: the key frame at 2 s, whose unit (7 packets a datagram) starts the stream.
    let (at, pos) = *keys.iter().rev().find(|k| k.0 <= 3.5).unwrap();
    assert!((at - 2.0).abs() < 0.05, "{keys:?}");
    let unit = 7 * 188;
    let start = (pos / unit) * unit;
    let rx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let to = rx.local_addr().unwrap();
    let got = thread::spawn(move || receive(rx, Duration::from_secs(30), Duration::from_secs(3)));
    let o = run(&[
        "stream",
        clip.to_str().unwrap(),
        &format!("udp://{to}"),
        "--timing",
        "pcr",
        "--from",
        "3.5s",
    ]);
    let err = text(&o.stderr);
    assert!(o.status.success(), "penstock: {err}");
    assert!(err.contains("at the key frame at or before it"), "{err}");
    assert!(err.contains(&format!("from byte {start} ")), "{err}");
    let received: Vec<u8> = got
        .join()
        .unwrap()
        .iter()
        .flat_map(|(_, d)| d.iter().copied())
        .collect();
    assert!(
        received == bytes[start as usize..],
        "{} bytes received; want the {} from the key frame's unit at byte {start}",
        received.len(),
        bytes.len() - start as usize
    );
}
