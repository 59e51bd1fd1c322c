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

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
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
    s.set_recv_buffer_size(2 * want).unwrap();
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
