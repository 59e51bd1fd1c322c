//! Zero copy checked where it happens, one test per data path: `penstock stream` (and
//! `penstock serve`) run under strace (`common::zerocopy`), a real receiver on loopback takes
//! the bytes and compares them with the file, and the bytes that went through the process's
//! memory (read family on the payload's file, write family on sockets) must stay under a
//! bound stated per path. The copy path is the control: there the harness must see the
//! whole payload go through user space, or it would not see a regression either.
//!
//! The uring path's reads and sends are ring operations strace cannot see into: its test
//! reads the engine's own count of what each mechanism moved (`--json`'s `moved`), and
//! strace only confirms that no read or write system call carried the payload.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::Duration;

use common::zerocopy::{Tally, require_strace, traced};

/// The payload: a few MiB, not a multiple of a page or of a unit.
const PAYLOAD_BYTES: usize = 4 * 1024 * 1024 + 4097;

/// Bytes no payload-free run exceeds through user space on the stream paths: `penstock
/// stream` sends nothing of its own to the target (no header) and reads nothing of the
/// source itself, so the bound is 0 — any byte of the payload copied fails.
const STREAM_BOUND_BYTES: u64 = 0;

fn payload(dir: &Path) -> (PathBuf, Vec<u8>) {
    // Deterministic, not compressible, not all one byte: a wrong offset shows.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let bytes: Vec<u8> = (0..PAYLOAD_BYTES)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    let p = dir.join("payload.bin");
    std::fs::write(&p, &bytes).unwrap();
    (p, bytes)
}

/// What one traced `penstock stream` did: the syscall tally and its `--json` report.
struct Run {
    tally: Tally,
    report: serde_json::Value,
}

impl Run {
    fn moved(&self, how: &str) -> u64 {
        self.report["moved"][how]
            .as_u64()
            .unwrap_or_else(|| panic!("no moved.{how} in {}", self.report))
    }
}

/// Runs `penstock stream SRC DST ARGS…` under strace; `receive` runs beside it (the
/// receiver) and returns what arrived.
fn stream_traced<T: Send + 'static>(
    dir: &Path,
    src: &Path,
    dst: &str,
    args: &[&str],
    receive: impl FnOnce() -> T + Send + 'static,
) -> (Run, T) {
    let trace = dir.join(format!("trace-{}", args.join("_").replace('/', "")));
    let json = dir.join("report.json");
    let rx = thread::spawn(receive);
    let out = traced(&trace, env!("CARGO_BIN_EXE_penstock"))
        .arg("stream")
        .arg(src)
        .arg(dst)
        .args(args)
        .arg(format!("--json={}", json.display()))
        .args(["--no-self-calibrate", "--calibration-cache"])
        .arg(dir.join("cache"))
        .stdout(Stdio::null())
        .output()
        .expect("strace runs");
    assert!(
        out.status.success(),
        "penstock stream {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = rx.join().expect("the receiver");
    let report = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    (
        Run {
            tally: Tally::read(&trace),
            report,
        },
        got,
    )
}

/// A TCP receiver on loopback: everything up to EOF.
fn tcp_receiver() -> (String, impl FnOnce() -> Vec<u8> + Send + 'static) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("tcp://{}", l.local_addr().unwrap());
    (addr, move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        got
    })
}

/// `penstock stream FILE tcp://…` on `path` with `extra` arguments: the bytes arrive exact,
/// the report says `path` executed, and the tally is returned for the path's own checks.
fn file_to_tcp(path: &str, extra: &[&str]) -> Option<(Run, PathBuf, tempfile::TempDir)> {
    if !require_strace() {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let (file, bytes) = payload(dir.path());
    let (addr, rx) = tcp_receiver();
    let mut args = vec!["--path", path];
    args.extend_from_slice(extra);
    let (run, got) = stream_traced(dir.path(), &file, &addr, &args, rx);
    assert!(
        got == bytes,
        "{} of {} bytes arrived, not exact",
        got.len(),
        bytes.len()
    );
    assert_eq!(run.report["bytes"], PAYLOAD_BYTES as u64);
    assert_eq!(
        run.report["path_executed"], path,
        "executed path (planned {})",
        run.report["path_planned"]
    );
    println!(
        "{path}: payload {PAYLOAD_BYTES} B; through user space {} B (read of the file {} B, \
         written to sockets {} B); sendfile/splice to sockets {} B; moved {}\n{}",
        run.tally.through_user_space(&file),
        run.tally.read_from_file(&file),
        run.tally.written_to_sockets(),
        run.tally.zero_copy_to_sockets(),
        run.report["moved"],
        run.tally
    );
    Some((run, file, dir))
}

/// The payload `file`'s bytes through user space are at most `bound_bytes`.
fn assert_within(tally: &Tally, file: &Path, bound_bytes: u64) {
    let n = tally.through_user_space(file);
    assert!(
        n <= bound_bytes,
        "{n} B through user space, bound {bound_bytes} B:\n{tally}"
    );
}

#[test]
fn the_strace_tally_reads_what_strace_prints() {
    common::zerocopy::self_check();
}

#[test]
fn file_to_tcp_by_sendfile_copies_nothing_through_user_space() {
    let Some((run, file, _dir)) = file_to_tcp("sendfile", &[]) else {
        return;
    };
    assert_eq!(run.tally.zero_copy_to_sockets(), PAYLOAD_BYTES as u64);
    assert_within(&run.tally, &file, STREAM_BOUND_BYTES);
    assert_eq!(run.moved("sendfile"), PAYLOAD_BYTES as u64);
}

#[test]
fn file_to_tcp_by_splice_copies_nothing_through_user_space() {
    let Some((run, file, _dir)) = file_to_tcp("splice", &[]) else {
        return;
    };
    assert_eq!(run.tally.zero_copy_to_sockets(), PAYLOAD_BYTES as u64);
    assert_within(&run.tally, &file, STREAM_BOUND_BYTES);
    assert_eq!(run.moved("splice"), PAYLOAD_BYTES as u64);
}

/// The uring path with O_DIRECT reads (DMA into the registered pool) and SEND_ZC from the
/// registered buffers: no system call moves the payload, and the ring's own counts say every
/// byte was read direct and sent zero-copy.
#[test]
fn file_to_tcp_by_uring_registered_buffers_copies_nothing_through_user_space() {
    if !penstock_testreq::require_io_uring() {
        return;
    }
    let Some((run, file, _dir)) = file_to_tcp("uring", &["--cache", "bypass", "--zero-copy", "on"])
    else {
        return;
    };
    assert_within(&run.tally, &file, STREAM_BOUND_BYTES);
    assert_eq!(run.tally.zero_copy_to_sockets(), 0, "{}", run.tally);
    // O_DIRECT reads whole blocks: the tail is read rounded up to the alignment.
    assert!(run.moved("ring_read_direct") >= PAYLOAD_BYTES as u64);
    assert_eq!(run.moved("ring_read_buffered"), 0);
    assert_eq!(run.moved("ring_send_zc"), PAYLOAD_BYTES as u64);
    assert_eq!(run.moved("ring_written_copied"), 0);
    assert_eq!(run.report["moved"]["through_user_space"], 0);
}

/// The control: the copy path reads the payload into the process and writes it out, and the
/// harness must see both, or it could not see a zero-copy path regress either.
#[test]
fn file_to_tcp_by_copy_is_seen_through_user_space() {
    let Some((run, file, _dir)) = file_to_tcp("copy", &[]) else {
        return;
    };
    assert_eq!(run.tally.read_from_file(&file), PAYLOAD_BYTES as u64);
    assert_eq!(run.tally.written_to_sockets(), PAYLOAD_BYTES as u64);
    assert_eq!(run.tally.zero_copy_to_sockets(), 0);
    assert_eq!(run.moved("copy_written"), PAYLOAD_BYTES as u64);
}

/// A UDP receiver on loopback with a receive buffer that holds the whole payload: datagrams
/// concatenated until `want` bytes came (or none for 30 s: then what came).
fn udp_receiver(want: usize) -> (String, impl FnOnce() -> Vec<u8> + Send + 'static) {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
    // The whole payload fits, so that a receiver thread a loaded machine does not schedule
    // for a while drops nothing: SO_RCVBUFFORCE as root (past net.core.rmem_max), else as
    // much as rmem_max allows.
    if rustix::net::sockopt::set_socket_recv_buffer_size_force(&s, 2 * want).is_err() {
        s.set_recv_buffer_size(2 * want).unwrap();
    }
    s.bind(
        &"127.0.0.1:0"
            .parse::<std::net::SocketAddr>()
            .unwrap()
            .into(),
    )
    .unwrap();
    let s: std::net::UdpSocket = s.into();
    let addr = format!("udp://{}", s.local_addr().unwrap());
    (addr, move || {
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut got = Vec::with_capacity(want);
        let mut buf = vec![0; 65536];
        while got.len() < want {
            match s.recv(&mut buf) {
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(_) => break,
            }
        }
        got
    })
}

/// file→UDP, paced: 16 KiB datagrams at 400 Mbit/s on the uring path, read O_DIRECT into the
/// registered pool and sent with SEND_ZC (`--zero-copy on`; `auto` sends datagrams with
/// copies). Bound: 0 bytes through user space — a datagram has no header of penstock's.
#[test]
fn file_to_udp_paced_by_uring_copies_nothing_through_user_space() {
    if !require_strace() || !penstock_testreq::require_io_uring() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (file, bytes) = payload(dir.path());
    let (addr, rx) = udp_receiver(bytes.len());
    let args = [
        "--rate",
        "400Mbit/s",
        "--unit",
        "16384",
        "--path",
        "uring",
        "--cache",
        "bypass",
        "--zero-copy",
        "on",
    ];
    let (run, got) = stream_traced(dir.path(), &file, &addr, &args, rx);
    assert!(
        got == bytes,
        "{} of {} bytes arrived, not exact",
        got.len(),
        bytes.len()
    );
    println!(
        "udp paced: payload {PAYLOAD_BYTES} B; through user space {} B; moved {}\n{}",
        run.tally.through_user_space(&file),
        run.report["moved"],
        run.tally
    );
    assert_eq!(run.report["path_executed"], "uring");
    // Paced: every unit went through the pacer.
    assert_eq!(
        run.report["lateness"]["units"],
        PAYLOAD_BYTES.div_ceil(16384) as u64
    );
    assert_within(&run.tally, &file, STREAM_BOUND_BYTES);
    assert_eq!(run.moved("ring_read_buffered"), 0);
    assert_eq!(run.moved("ring_send_zc"), PAYLOAD_BYTES as u64);
    assert_eq!(run.moved("ring_written_copied"), 0);
}

/// `penstock serve` under strace with `conf` (TOML) and `www` as its root: the child (strace)
/// and the HTTP address.
fn serve_traced(dir: &Path, conf: &str, www: &Path) -> (std::process::Child, String, PathBuf) {
    let conf_path = dir.join("penstock.toml");
    std::fs::write(&conf_path, conf).unwrap();
    let trace = dir.join("serve.trace");
    let mut child = traced(&trace, env!("CARGO_BIN_EXE_penstock"))
        .args(["serve", "--config"])
        .arg(&conf_path)
        .arg("--root")
        .arg(www)
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let line = common::start_line(&mut child);
    let (http, _) = common::serve_addresses(&line);
    (child, http, trace)
}

/// `curl URL` with an optional range: the body (curl fails the test on an HTTP error).
fn curl(url: &str, range: Option<&str>) -> Vec<u8> {
    let mut c = Command::new("curl");
    c.args(["-sS", "--fail", "--max-time", "60"]);
    if let Some(r) = range {
        c.args(["-r", r]);
    }
    let o = c.arg(url).output().expect("curl runs");
    assert!(
        o.status.success(),
        "curl {url}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o.stdout
}

/// The server's engine's count of what each mechanism moved
/// (`penstock_engine_moved_bytes_total{how=…}`), from its metrics page (and that page's
/// length: it went out by write, through user space, and is not payload).
fn engine_moved(http: &str) -> (std::collections::BTreeMap<String, u64>, u64) {
    let page = common::scrape(http).expect("the metrics page");
    let moved = page
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("penstock_engine_moved_bytes_total{how=\"")?;
            let (how, v) = rest.split_once("\"} ")?;
            Some((how.to_string(), v.trim().parse::<f64>().ok()? as u64))
        })
        .collect();
    (moved, page.len() as u64)
}

/// HTTP bodies: a small file (sent by sendfile from the connection's loop), a large one
/// (handed to the engine, `engine_body_bytes_min` = 1 MiB) and a range of it, fetched with
/// curl. Bound: each response's head (under 512 B each here: status line, ~8 fields) plus
/// the metrics page the test scrapes; no byte of a body.
///
/// The engine's path is set (`body_path = "sendfile"`), not `auto`: `auto` takes sendfile
/// for a range in the page cache and the uring path otherwise, whose buffered reads copy the
/// page cache into the pool (docs/data-paths.md) — which one ran would depend on what the
/// machine evicted.
#[test]
fn http_bodies_leave_without_a_copy_through_user_space() {
    if !require_strace() || !penstock_testreq::require("curl") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    let (big, bytes) = payload(&www);
    let small = www.join("small.bin");
    std::fs::write(&small, &bytes[..300_001]).unwrap();
    let conf = "[rtsp]\nlisten = \"\"\n[http]\nlisten = \"127.0.0.1:0\"\n\
                engine_body_bytes_min = 1048576\nbody_path = \"sendfile\"\n[control]\nlisten = \"\"\n\
                [log]\naccess = \"off\"\n[admission]\nself_calibrate = false\n";
    let (mut child, http, trace) = serve_traced(dir.path(), conf, &www);
    let base = format!("http://{http}");
    let mut body_bytes = 0;
    assert!(curl(&format!("{base}/small.bin"), None) == bytes[..300_001]);
    body_bytes += 300_001;
    assert!(curl(&format!("{base}/payload.bin"), None) == bytes);
    body_bytes += bytes.len() as u64;
    let (at, end) = (1_000_003usize, 3_500_000usize);
    assert!(curl(&format!("{base}/payload.bin"), Some(&format!("{at}-{end}"))) == bytes[at..=end]);
    body_bytes += (end + 1 - at) as u64;
    let responses = 3;
    let (moved, metrics_page) = engine_moved(&http);
    common::zerocopy::stop_traced(&mut child);
    let tally = Tally::read(&trace);
    let through = tally.through_user_space(&big) + tally.read_from_file(&small);
    println!(
        "http: bodies {body_bytes} B; through user space {through} B (metrics page {metrics_page} B); \
         sendfile/splice to sockets {} B; engine moved {moved:?}\n{tally}",
        tally.zero_copy_to_sockets()
    );
    assert!(tally.zero_copy_to_sockets() >= body_bytes, "{tally}");
    let bound = 512 * responses + metrics_page;
    assert!(
        through <= bound,
        "{through} B through user space, bound {bound} B:\n{tally}"
    );
    // The engine's ring operations, which strace cannot see: nothing copied there either.
    for how in [
        "copy_read",
        "copy_written",
        "ring_read_buffered",
        "ring_written_copied",
    ] {
        assert_eq!(moved.get(how), Some(&0), "{how}: {moved:?}");
    }
    // The two large bodies went to the engine, whose sendfile path moved them.
    let engine_bodies = (bytes.len() + end + 1 - at) as u64;
    assert_eq!(moved.get("sendfile"), Some(&engine_bodies), "{moved:?}");
}

/// One RTSP request on `s` (replies read from `buf`, which keeps any interleaved frames that
/// follow): the status and the head.
fn rtsp(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    cseq: u32,
    method: &str,
    url: &str,
    headers: &str,
) -> (u16, String) {
    s.write_all(format!("{method} {url} RTSP/1.0\r\nCSeq: {cseq}\r\n{headers}\r\n").as_bytes())
        .unwrap();
    loop {
        // Frames ahead of the reply (interleaved data) are kept for the caller.
        if buf.first() != Some(&b'$')
            && let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n")
        {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length: "))
                .map_or(0, |n| n.trim().parse::<usize>().unwrap());
            let total = end + 4 + len;
            if buf.len() >= total {
                buf.drain(..total);
                let status = head[9..12].parse().unwrap();
                return (status, head);
            }
        }
        if buf.first() == Some(&b'$') && buf.len() >= 4 {
            // A frame before the reply: keep reading past it later; RTSP replies do not
            // come mid-frame, so only the reply's arrival is awaited here.
            let len = usize::from(u16::from_be_bytes([buf[2], buf[3]]));
            if buf.len() >= 4 + len && buf[4 + len..].windows(4).any(|w| w == b"\r\n\r\n") {
                let at = buf[4 + len..]
                    .iter()
                    .position(|&b| b == b'R')
                    .map(|i| i + 4 + len);
                if let Some(at) = at {
                    let frames: Vec<u8> = buf.drain(..at).collect();
                    let (st, head) = rtsp_reply_only(buf);
                    buf.splice(0..0, frames);
                    return (st, head);
                }
            }
        }
        let mut b = [0u8; 65536];
        let n = s.read(&mut b).unwrap();
        assert!(n > 0, "the RTSP connection closed");
        buf.extend_from_slice(&b[..n]);
    }
}

fn rtsp_reply_only(buf: &mut Vec<u8>) -> (u16, String) {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    buf.drain(..end + 4);
    (head[9..12].parse().unwrap(), head)
}

/// The payload of an RTP packet (12-byte header, CSRCs and an extension skipped).
fn rtp_payload(p: &[u8]) -> &[u8] {
    let cc = usize::from(p[0] & 0x0f);
    let mut at = 12 + 4 * cc;
    if p[0] & 0x10 != 0 {
        let words = usize::from(u16::from_be_bytes([p[at + 2], p[at + 3]]));
        at += 4 + 4 * words;
    }
    &p[at..]
}

/// Whether an RTCP compound packet holds a BYE (packet type 203).
fn rtcp_bye(mut p: &[u8]) -> bool {
    while p.len() >= 4 {
        if p[1] == 203 {
            return true;
        }
        let len = 4 * (usize::from(u16::from_be_bytes([p[2], p[3]])) + 1);
        p = &p[len.min(p.len())..];
    }
    false
}

/// RTSP of a TS file over UDP: a client written here (SETUP, PLAY, RTP payloads collected
/// until the RTCP BYE) must get the file exact, and the server's engine must have moved it
/// without a copy through its memory: its planned units read with O_DIRECT into the
/// registered pool (`ring_read_direct`), each RTP packet sent with SEND_ZC from there
/// (`ring_send_zc`), nothing read buffered or written with a copy.
///
/// Bound on the bytes system calls moved through the process: the RTSP replies (under 512 B
/// each), RTCP and the metrics page. The file's bytes read by system calls are counted
/// apart, as index building, not delivery, once per file per cache: the PCR plan's PID probe
/// (its first 1 MiB chunk: all of this small clip), the PCR plan's scan and the key-frame
/// index's scan — at most three times the clip.
#[test]
fn rtsp_of_ts_over_udp_leaves_without_a_copy_through_user_space() {
    rtsp_of_ts_without_a_copy(false);
}

/// RTSP of a TS file over interleaved TCP: as over UDP, the engine's sends going straight to
/// the RTSP connection's socket (`$`, channel and length framed in front of the RTP header in
/// the pool), not through the connection thread. The replies (SETUP, PLAY) share the socket
/// with the frames: the client here checks that every byte after PLAY's reply parses as a
/// frame (none cut by a reply).
#[test]
fn rtsp_of_ts_interleaved_leaves_without_a_copy_through_user_space() {
    rtsp_of_ts_without_a_copy(true);
}

fn rtsp_of_ts_without_a_copy(interleaved: bool) {
    if !require_strace() {
        return;
    }
    // A clip of its own per test: the two run at once, and one tag is one path per process.
    let tag = if interleaved {
        "zero-copy-rtsp-tcp"
    } else {
        "zero-copy-rtsp-udp"
    };
    let Some(clip) = common::mpeg2_ts_clip(tag, 3) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    let file = www.join("clip.ts");
    std::fs::copy(&clip, &file).unwrap();
    let bytes = std::fs::read(&file).unwrap();
    let conf = "[http]\nlisten = \"127.0.0.1:0\"\n[control]\nlisten = \"\"\n[log]\naccess = \"off\"\n\
                [rtsp]\nlisten = \"127.0.0.1:0\"\ninterleaved_direct = true\n[admission]\nself_calibrate = false\n\
                disk_seq_bytes_per_s = 1000000000\ndisk_random_iops = 100000\n\
                net_bytes_per_s = 1250000000\ncpu_send_ns = 5000\ncpu_send_byte_ps = 500\n";
    let conf_path = dir.path().join("penstock.toml");
    std::fs::write(&conf_path, conf).unwrap();
    let trace = dir.path().join("serve.trace");
    let mut child = traced(&trace, env!("CARGO_BIN_EXE_penstock"))
        .args(["serve", "--no-control-unix", "--config"])
        .arg(&conf_path)
        .arg(&www)
        .env("XDG_CACHE_HOME", dir.path().join("cache"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let line = common::start_line(&mut child);
    let (http, _) = common::serve_addresses(&line);
    let rtsp_addr = line
        .split("rtsp://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("no rtsp address in {line:?}"))
        .to_string();
    let url = format!("rtsp://{rtsp_addr}/clip.ts");
    let session = |head: &str| {
        head.lines()
            .find_map(|l| l.strip_prefix("Session: "))
            .expect("a session")
            .split(';')
            .next()
            .unwrap()
            .to_string()
    };
    let mut packets = 0u64;

    if interleaved {
        let mut s = TcpStream::connect(&rtsp_addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut buf = Vec::new();
        let (st, head) = rtsp(
            &mut s,
            &mut buf,
            1,
            "SETUP",
            &url,
            "Transport: RTP/AVP/TCP;unicast;interleaved=0-1\r\n",
        );
        assert_eq!(st, 200, "{head}");
        let id = session(&head);
        let (st, head) = rtsp(
            &mut s,
            &mut buf,
            2,
            "PLAY",
            &url,
            &format!("Session: {id}\r\n"),
        );
        assert_eq!(st, 200, "{head}");
        let mut got = Vec::new();
        'tcp: loop {
            while buf.len() >= 4 && buf[0] == b'$' {
                let len = usize::from(u16::from_be_bytes([buf[2], buf[3]]));
                if buf.len() < 4 + len {
                    break;
                }
                let frame: Vec<u8> = buf.drain(..4 + len).collect();
                match frame[1] {
                    0 => {
                        got.extend_from_slice(rtp_payload(&frame[4..]));
                        packets += 1;
                    }
                    _ if rtcp_bye(&frame[4..]) => break 'tcp,
                    _ => {}
                }
            }
            assert!(
                buf.is_empty() || buf[0] == b'$',
                "not a frame: {:?}",
                &buf[..8.min(buf.len())]
            );
            let mut b = [0u8; 65536];
            let n = s.read(&mut b).expect("frames until the RTCP BYE");
            assert!(n > 0, "the connection closed before the BYE");
            buf.extend_from_slice(&b[..n]);
        }
        assert!(
            got == bytes,
            "interleaved: {} of {} bytes, not exact",
            got.len(),
            bytes.len()
        );
        drop(s);
    } else {
        let rtp = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = rtp.local_addr().unwrap().port();
        let rtcp = UdpSocket::bind(("127.0.0.1", port + 1))
            .expect("the RTCP port beside the RTP one (free on a quiet machine)");
        let mut s = TcpStream::connect(&rtsp_addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut buf = Vec::new();
        let (st, head) = rtsp(
            &mut s,
            &mut buf,
            1,
            "SETUP",
            &url,
            &format!(
                "Transport: RTP/AVP;unicast;client_port={port}-{}\r\n",
                port + 1
            ),
        );
        assert_eq!(st, 200, "{head}");
        let id = session(&head);
        let rx = thread::spawn(move || {
            rtp.set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            rtcp.set_read_timeout(Some(Duration::from_millis(1)))
                .unwrap();
            let (mut got, mut packets, mut b) = (Vec::new(), 0u64, vec![0u8; 65536]);
            let mut quiet = 0;
            let mut bye = false;
            // Until the BYE has come and the RTP socket is empty (it came after the last
            // packet); 150 quiet reads (30 s) without one fail.
            while quiet < 150 {
                if let Ok(n) = rtcp.recv(&mut b) {
                    bye |= rtcp_bye(&b[..n]);
                }
                match rtp.recv(&mut b) {
                    Ok(n) => {
                        got.extend_from_slice(rtp_payload(&b[..n]));
                        packets += 1;
                        quiet = 0;
                    }
                    Err(_) if bye => break,
                    Err(_) => quiet += 1,
                }
            }
            (got, packets)
        });
        let (st, head) = rtsp(
            &mut s,
            &mut buf,
            2,
            "PLAY",
            &url,
            &format!("Session: {id}\r\n"),
        );
        assert_eq!(st, 200, "{head}");
        let (got, n) = rx.join().unwrap();
        packets += n;
        assert!(
            got == bytes,
            "UDP: {} of {} bytes, not exact",
            got.len(),
            bytes.len()
        );
        let (st, _) = rtsp(
            &mut s,
            &mut buf,
            3,
            "TEARDOWN",
            &url,
            &format!("Session: {id}\r\n"),
        );
        assert_eq!(st, 200);
        drop(s);
    }

    let (moved, metrics_page) = engine_moved(&http);
    common::zerocopy::stop_traced(&mut child);
    let tally = Tally::read(&trace);
    let through = tally.written_to_sockets();
    let index = tally.read_from_file(&file);
    let payload_bytes = bytes.len() as u64;
    let how = if interleaved {
        "interleaved TCP"
    } else {
        "UDP"
    };
    println!(
        "rtsp over {how}: payload {payload_bytes} B in {packets} packets; through user space \
         {through} B written to sockets (metrics page {metrics_page} B), {index} B of the file \
         read by the indexes; engine moved {moved:?}\n{tally}"
    );
    // The replies (SETUP, PLAY, TEARDOWN), the metrics request's answer, RTCP.
    let bound = 512 * 3 + 1024 + metrics_page;
    assert!(
        through <= bound,
        "{through} B through user space, bound {bound} B:\n{tally}"
    );
    assert!(
        index <= 3 * payload_bytes,
        "{index} B read from the file by system calls: more than its index scans\n{tally}"
    );
    // UDP datagrams leave by SEND_ZC; interleaved TCP frames (1,328 B) by plain ring SENDs
    // from the pool, which the kernel copies into the socket (docs/rtsp.md, "Zero copy": the
    // planner's `auto` for a TCP unit that small), never through user space.
    let (sent, not_sent) = if interleaved {
        ("ring_written_copied", "ring_send_zc")
    } else {
        ("ring_send_zc", "ring_written_copied")
    };
    for how in ["ring_read_direct", sent] {
        assert!(
            moved.get(how).is_some_and(|&b| b >= payload_bytes),
            "{how} below the payload: {moved:?}"
        );
    }
    for how in ["copy_read", "copy_written", "ring_read_buffered", not_sent] {
        assert_eq!(moved.get(how), Some(&0), "{how}: {moved:?}");
    }
}
