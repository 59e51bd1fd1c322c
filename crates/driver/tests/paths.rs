//! Byte-exact transfers through every data path, on loopback with the real kernel (issue 3's
//! first acceptance test), and the engine's refusals and peer-disconnect reports.
//!
//! Each table-driven test runs every case, collects every failure with a name saying which
//! case it was (path, cache policy, target, size, offset, length, unit), and fails once at the
//! end with the whole list. Received bytes are compared with the source range byte for byte
//! (small files) or by a crc32c computed while receiving (the multi-hundred-MB file).
//!
//! The poll(2) fallback (io_uring unavailable) is a process-wide switch (PENSTOCK_NO_URING), so
//! it is tested through the `penstock` binary in `crates/penstock/tests/cli.rs`, not here.

use std::fmt;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use penstock_core::endpoint::{Endpoint, Host};
use penstock_core::schedule::LatePolicy;
use penstock_core::stream::PathError;
use penstock_core::stream::plan::{DATAGRAM_UNIT_BYTES_DEFAULT, Pacing, PlanError};
use penstock_core::stream::{CachePolicy, DataPath, Extent, ExtentError, IoKind, PathChoice};
use penstock_driver::engine::SEND_TIMEOUT_DEFAULT;
use penstock_driver::open::{OpenError, Opened, open_target};
use penstock_driver::{Engine, EngineConfig, StreamError, StreamReport, StreamSpec, ZeroCopy};

/// The sizes the issue names (the multi-hundred-MB file has its own test).
const SIZES: [u64; 6] = [0, 1, 4095, 4096, 4097, (1 << 20) + 7];

/// Transfer units: the default (1 MiB, or 1316 for UDP), and an odd one that is neither a
/// divisor nor a multiple of the 4096-byte block, so units straddle blocks and buffers.
const UNITS: [usize; 2] = [0, 3000];

/// Longest a single small case may take before it counts as hung (not a performance bound:
/// the case is cancelled and reported).
const CASE_TIMEOUT: Duration = Duration::from_secs(60);

/// A data path and page-cache policy under test.
#[derive(Clone, Copy, Debug)]
struct Mode {
    path: DataPath,
    cache: CachePolicy,
    zero_copy: ZeroCopy,
}

const fn mode(path: DataPath, cache: CachePolicy) -> Mode {
    Mode {
        path,
        cache,
        zero_copy: ZeroCopy::Auto,
    }
}

/// SEND_ZC forced on (auto never uses it on loopback): the buffer is held until the
/// notification.
const URING_ZC: Mode = Mode {
    path: DataPath::Uring,
    cache: CachePolicy::Keep,
    zero_copy: ZeroCopy::On,
};

const MODES: [Mode; 8] = [
    mode(DataPath::Copy, CachePolicy::Keep),
    mode(DataPath::Copy, CachePolicy::Drop),
    mode(DataPath::Sendfile, CachePolicy::Keep),
    mode(DataPath::Splice, CachePolicy::Keep),
    mode(DataPath::Uring, CachePolicy::Keep),
    mode(DataPath::Uring, CachePolicy::Bypass),
    mode(DataPath::Uring, CachePolicy::Drop),
    URING_ZC,
];

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.path, self.cache.name())?;
        if self.zero_copy == ZeroCopy::On {
            f.write_str("/zero-copy")?;
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TargetKind {
    Tcp,
    Unix,
    File,
    Udp,
}

/// Which targets a path can carry (core's `check_path`: only copy and uring keep datagrams).
fn supports(path: DataPath, target: TargetKind) -> bool {
    target != TargetKind::Udp || matches!(path, DataPath::Copy | DataPath::Uring)
}

/// One transfer: what the failure message names.
#[derive(Clone, Copy, Debug)]
struct Case {
    mode: Mode,
    target: TargetKind,
    size: u64,
    offset: u64,
    length: Option<u64>,
    unit: usize,
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} -> {:?}: size {}, offset {}, length {:?}, unit {}",
            self.mode,
            self.target,
            self.size,
            self.offset,
            self.length,
            if self.unit == 0 {
                "default".to_string()
            } else {
                self.unit.to_string()
            }
        )
    }
}

/// Offsets and lengths at and around the 4096-byte block boundaries, those that fit `size`.
fn extents(size: u64) -> Vec<(u64, Option<u64>)> {
    let candidates = [
        (0, None),
        (1, None),
        (0, Some(0)),
        (size, None),
        (1, Some(4095)),
        (1, Some(4096)),
        (4095, None),
        (4095, Some(2)),
        (4096, None),
        (4096, Some(4096)),
        (4097, None),
        (4097, Some(4095)),
        (4095, Some(8193)),
        (4097, Some(1 << 20)),
    ];
    let mut out: Vec<(u64, Option<u64>)> = Vec::new();
    for (offset, length) in candidates {
        let fits = offset <= size && length.is_none_or(|l| offset + l <= size);
        if fits && !out.contains(&(offset, length)) {
            out.push((offset, length));
        }
    }
    out
}

/// Position-dependent bytes: a block sent to the wrong place, or twice, shows.
fn pattern(len: u64) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let x = (i as u32).wrapping_mul(2_654_435_761);
            (x >> 24) as u8 ^ (i >> 12) as u8
        })
        .collect()
}

/// The small source files, one per size.
fn make_sources(dir: &Path) -> Vec<(u64, PathBuf, Vec<u8>)> {
    SIZES
        .iter()
        .map(|&size| {
            let data = pattern(size);
            let p = dir.join(format!("src-{size}"));
            fs::write(&p, &data).expect("write a source file");
            (size, p, data)
        })
        .collect()
}

fn engine() -> Engine {
    let cfg = EngineConfig {
        workers: 1,
        pool_buffers: 16,
        buffer_bytes: 1 << 20,
        stream_depth: 4,
        ..EngineConfig::default()
    };
    Engine::new(cfg).expect("engine starts")
}

/// Whether `m` can run here: the uring modes need io_uring (refused by a sysctl or seccomp in
/// some sandboxes). A mode that cannot run is skipped, loudly.
fn runnable(engine: &Engine, m: &Mode) -> bool {
    match (&engine.info().uring, m.path) {
        (Err(why), DataPath::Uring) => {
            penstock_testreq::require_that(&format!("io_uring ({m})"), Some(why.to_string()))
        }
        _ => true,
    }
}

fn loopback() -> Host {
    Host::Ip(Ipv4Addr::LOCALHOST.into())
}

fn spec(case: &Case, source: &Path, target: Endpoint) -> StreamSpec {
    StreamSpec {
        source: Some(Endpoint::File {
            path: source.to_path_buf(),
        }),
        target: Some(target),
        extent: Extent {
            offset: case.offset,
            length: case.length,
        },
        unit_bytes: case.unit,
        path: PathChoice::Fixed(case.mode.path),
        cache: case.mode.cache,
        zero_copy: case.mode.zero_copy,
        pacing: Pacing::Burst,
        miss_after: None,
        trace: false,
        class: None,
        best_effort: false,
        buffers: None,
        start_at: None,
        send_timeout: Some(SEND_TIMEOUT_DEFAULT),
        late: LatePolicy::Send,
        rtp: None,
        interleaved: None,
    }
}

/// Reads a stream socket to its end.
fn read_all(mut s: impl Read) -> io::Result<Vec<u8>> {
    let mut v = Vec::new();
    s.read_to_end(&mut v)?;
    Ok(v)
}

/// Where the first difference is, for the failure message.
fn compare(got: &[u8], want: &[u8]) -> Result<(), String> {
    if got == want {
        return Ok(());
    }
    let first = got
        .iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(want.len()));
    Err(format!(
        "received {} bytes, expected {}; first difference at byte {first}",
        got.len(),
        want.len()
    ))
}

fn wait(h: penstock_driver::StreamHandle) -> Result<StreamReport, String> {
    match h.wait_timeout(CASE_TIMEOUT) {
        Some(r) => r.map_err(|e| format!("stream failed: {e}")),
        None => {
            h.cancel();
            Err(format!("no result after {CASE_TIMEOUT:?}: {:?}", h.wait()))
        }
    }
}

fn check_report(case: &Case, r: &StreamReport, want: usize) -> Result<(), String> {
    if r.bytes != want as u64 {
        return Err(format!("report says {} bytes, expected {want}", r.bytes));
    }
    // The path that *ran*: the one whose calls moved the bytes, as the data path counted
    // them where each call returned (`planned` only echoes the request).
    let want_path = (want > 0).then_some(case.mode.path);
    if r.planned != case.mode.path || r.executed != want_path || r.cache != case.mode.cache {
        return Err(format!(
            "report says planned {}, executed {:?}, cache {} (moved {:?})",
            r.planned,
            r.executed,
            r.cache.name(),
            r.moved
        ));
    }
    let m = &r.moved;
    let (by_path, copied) = match case.mode.path {
        DataPath::Copy => (m.copy_written, m.copy_written),
        DataPath::Sendfile => (m.sendfile, m.through_user_space()),
        DataPath::Splice => (m.splice, m.through_user_space()),
        DataPath::Uring => (
            m.ring_send_zc + m.ring_written_copied,
            m.copy_read + m.copy_written,
        ),
    };
    if by_path != want as u64 || (case.mode.path != DataPath::Copy && copied != 0) {
        return Err(format!(
            "{} moved {by_path} of {want} bytes, {copied} through user space calls ({m:?})",
            case.mode.path
        ));
    }
    // The only note a small transfer may carry: O_DIRECT refused (then reads are buffered).
    let unexpected: Vec<&String> = r
        .notes
        .iter()
        .filter(|n| !(case.mode.cache == CachePolicy::Bypass && n.contains("O_DIRECT")))
        .filter(|n| {
            !(case.mode.zero_copy == ZeroCopy::On
                && case.target != TargetKind::Tcp
                && n.contains("zero-copy"))
        })
        .collect();
    if !unexpected.is_empty() {
        return Err(format!("unexpected notes: {unexpected:?}"));
    }
    Ok(())
}

/// Runs one case and checks the received bytes and the report.
fn run_case(
    engine: &Engine,
    case: &Case,
    source: &Path,
    data: &[u8],
    dir: &Path,
    n: usize,
) -> Result<(), String> {
    let end = case.length.map_or(case.size, |l| case.offset + l);
    let want = &data[case.offset as usize..end as usize];
    match case.target {
        TargetKind::Tcp => {
            let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(|e| e.to_string())?;
            let addr = l.local_addr().map_err(|e| e.to_string())?;
            let rx = thread::spawn(move || read_all(l.accept()?.0));
            let target = Endpoint::TcpConnect {
                host: loopback(),
                port: addr.port(),
                local_port: None,
            };
            let r = engine.open(spec(case, source, target));
            let report = finish_with_receiver(r, rx, || {
                let _ = TcpStream::connect(addr);
            })?;
            check_report(case, &report.0, want.len())?;
            compare(&report.1, want)
        }
        TargetKind::Unix => {
            let p = dir.join(format!("sock-{n}"));
            let l = UnixListener::bind(&p).map_err(|e| e.to_string())?;
            let rx = thread::spawn(move || read_all(l.accept()?.0));
            let target = Endpoint::Unix { path: p.clone() };
            let r = engine.open(spec(case, source, target));
            let report = finish_with_receiver(r, rx, || {
                let _ = std::os::unix::net::UnixStream::connect(&p);
            })?;
            check_report(case, &report.0, want.len())?;
            compare(&report.1, want)
        }
        TargetKind::File => {
            let p = dir.join(format!("out-{n}"));
            let target = Endpoint::File { path: p.clone() };
            let report = wait(
                engine
                    .open(spec(case, source, target))
                    .map_err(|e| format!("open failed: {e}"))?,
            )?;
            check_report(case, &report, want.len())?;
            let got = fs::read(&p).map_err(|e| e.to_string())?;
            let _ = fs::remove_file(&p);
            compare(&got, want)
        }
        TargetKind::Udp => run_udp(engine, case, source, want),
    }
}

/// Waits for the stream, then for the receiver; unblocks the receiver when the open failed.
fn finish_with_receiver(
    opened: Result<penstock_driver::StreamHandle, StreamError>,
    rx: JoinHandle<io::Result<Vec<u8>>>,
    unblock: impl FnOnce(),
) -> Result<(StreamReport, Vec<u8>), String> {
    let report = match opened {
        Ok(h) => wait(h),
        Err(e) => {
            unblock();
            Err(format!("open failed: {e}"))
        }
    };
    let got = rx
        .join()
        .expect("receiver thread")
        .map_err(|e| format!("receiver: {e}"))?;
    Ok((report?, got))
}

/// UDP: every unit is one datagram, in order, of exactly the unit's size (the last may be
/// shorter); nothing more arrives.
fn run_udp(engine: &Engine, case: &Case, source: &Path, want: &[u8]) -> Result<(), String> {
    let unit = if case.unit == 0 {
        DATAGRAM_UNIT_BYTES_DEFAULT as usize
    } else {
        case.unit
    };
    let rx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).map_err(|e| e.to_string())?;
    // Loopback drops datagrams that do not fit the receive buffer: make it hold the whole
    // transfer (a 1 MiB file in 1316-byte datagrams), even if this thread is slow to read.
    rustix::net::sockopt::set_socket_recv_buffer_size(&rx, 4 << 20).map_err(|e| e.to_string())?;
    rx.set_read_timeout(Some(CASE_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let addr = rx.local_addr().map_err(|e| e.to_string())?;
    let expected: Vec<usize> = want.chunks(unit).map(<[u8]>::len).collect();
    let count = expected.len();
    let rx2 = rx.try_clone().map_err(|e| e.to_string())?;
    let receiver = thread::spawn(move || -> io::Result<Vec<Vec<u8>>> {
        let mut buf = vec![0u8; 65536];
        let mut got = Vec::with_capacity(count);
        while got.len() < count {
            let n = rx2.recv(&mut buf)?;
            got.push(buf[..n].to_vec());
        }
        Ok(got)
    });
    let target = Endpoint::UdpSend {
        host: loopback(),
        port: addr.port(),
        local_port: None,
    };
    let report = match engine.open(spec(case, source, target)) {
        Ok(h) => wait(h),
        Err(e) => Err(format!("open failed: {e}")),
    };
    let got = receiver
        .join()
        .expect("receiver thread")
        .map_err(|e| format!("receiver, {count} datagrams expected: {e}"))?;
    let report = report?;
    check_report(case, &report, want.len())?;
    if report.units != count as u64 {
        return Err(format!(
            "report says {} units, expected {count}",
            report.units
        ));
    }
    let sizes: Vec<usize> = got.iter().map(Vec::len).collect();
    if sizes != expected {
        return Err(format!("datagram sizes {sizes:?}, expected {expected:?}"));
    }
    compare(&got.concat(), want)?;
    rx.set_nonblocking(true).map_err(|e| e.to_string())?;
    match rx.recv(&mut [0u8; 16]) {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
        other => Err(format!("an extra datagram arrived: {other:?}")),
    }
}

/// Every path that supports `target` × every size × every extent × every unit.
fn matrix(target: TargetKind) {
    let dir = tempfile::tempdir().expect("temp dir");
    let sources = make_sources(dir.path());
    let engine = engine();
    let mut failures = Vec::new();
    let mut runs = 0usize;
    for m in MODES
        .iter()
        .filter(|m| supports(m.path, target) && runnable(&engine, m))
    {
        for (size, src, data) in &sources {
            for (offset, length) in extents(*size) {
                for unit in UNITS {
                    let case = Case {
                        mode: *m,
                        target,
                        size: *size,
                        offset,
                        length,
                        unit,
                    };
                    runs += 1;
                    if let Err(e) = run_case(&engine, &case, src, data, dir.path(), runs) {
                        failures.push(format!("{case}: {e}"));
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {runs} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn every_path_to_tcp_is_byte_exact() {
    matrix(TargetKind::Tcp);
}

#[test]
fn every_path_to_unix_socket_is_byte_exact() {
    matrix(TargetKind::Unix);
}

#[test]
fn every_path_to_file_is_byte_exact() {
    matrix(TargetKind::File);
}

#[test]
fn copy_and_uring_to_udp_keep_datagram_sizes_and_order() {
    matrix(TargetKind::Udp);
}

/// A source that is a stream (TCP, pipe) rather than a file.
#[derive(Clone, Copy, Debug)]
enum StreamSource {
    Tcp,
    Pipe,
}

/// Opens the source of kind `kind` and starts a writer that feeds it `data`, then closes it.
fn open_stream_source(kind: StreamSource, data: Vec<u8>) -> (Opened, JoinHandle<io::Result<()>>) {
    match kind {
        StreamSource::Tcp => {
            let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
            let addr = l.local_addr().expect("local addr");
            let writer = thread::spawn(move || TcpStream::connect(addr)?.write_all(&data));
            let (s, _) = l.accept().expect("accept");
            s.set_nonblocking(true).expect("nonblocking");
            let opened = Opened {
                fd: s.into(),
                kind: IoKind::StreamSocket,
                size: None,
                socket: true,
                label: "tcp source".into(),
                volume: None,
            };
            (opened, writer)
        }
        StreamSource::Pipe => {
            let (r, w) = rustix::pipe::pipe().expect("pipe");
            rustix::io::ioctl_fionbio(&r, true).expect("nonblocking");
            let writer = thread::spawn(move || File::from(w).write_all(&data));
            let opened = Opened {
                fd: r.into(),
                kind: IoKind::Pipe,
                size: None,
                socket: false,
                label: "pipe source".into(),
                volume: None,
            };
            (opened, writer)
        }
    }
}

/// TCP and pipe sources, read until the writer closes, into a file and a TCP socket, through
/// the paths that read streams (splice, copy).
#[test]
fn stream_sources_through_splice_and_copy_are_byte_exact() {
    let dir = tempfile::tempdir().expect("temp dir");
    let engine = engine();
    let mut failures = Vec::new();
    let mut runs = 0usize;
    for path in [DataPath::Splice, DataPath::Copy] {
        for kind in [StreamSource::Tcp, StreamSource::Pipe] {
            for target in [TargetKind::File, TargetKind::Tcp] {
                for size in SIZES {
                    for unit in UNITS {
                        runs += 1;
                        let name =
                            format!("{kind:?} -> {target:?} by {path}: size {size}, unit {unit}");
                        let data = pattern(size);
                        let r = run_stream_source(
                            &engine,
                            path,
                            kind,
                            target,
                            &data,
                            unit,
                            dir.path(),
                            runs,
                        );
                        if let Err(e) = r {
                            failures.push(format!("{name}: {e}"));
                        }
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {runs} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[allow(clippy::too_many_arguments)]
fn run_stream_source(
    engine: &Engine,
    path: DataPath,
    kind: StreamSource,
    target: TargetKind,
    data: &[u8],
    unit: usize,
    dir: &Path,
    n: usize,
) -> Result<(), String> {
    let (source, writer) = open_stream_source(kind, data.to_vec());
    let spec = |target: Endpoint| StreamSpec {
        source: None, // not opened again: open_opened takes the opened source
        target: Some(target),
        extent: Extent {
            offset: 0,
            length: None,
        },
        unit_bytes: unit,
        path: PathChoice::Fixed(path),
        cache: CachePolicy::Keep,
        zero_copy: ZeroCopy::Auto,
        pacing: Pacing::Burst,
        miss_after: None,
        trace: false,
        class: None,
        best_effort: false,
        buffers: None,
        start_at: None,
        send_timeout: Some(SEND_TIMEOUT_DEFAULT),
        late: LatePolicy::Send,
        rtp: None,
        interleaved: None,
    };
    let got = match target {
        TargetKind::File => {
            let p = dir.join(format!("stream-out-{n}"));
            let ep = Endpoint::File { path: p.clone() };
            let t = open_target(&ep, &mut |_| {}).map_err(|e| e.to_string())?;
            let h = engine
                .open_opened(spec(ep), source, t)
                .map_err(|e| format!("open failed: {e}"))?;
            let report = wait(h)?;
            let got = fs::read(&p).map_err(|e| e.to_string())?;
            if report.bytes != data.len() as u64 {
                return Err(format!("report says {} bytes", report.bytes));
            }
            got
        }
        TargetKind::Tcp => {
            let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(|e| e.to_string())?;
            let addr = l.local_addr().map_err(|e| e.to_string())?;
            let rx = thread::spawn(move || read_all(l.accept()?.0));
            let ep = Endpoint::TcpConnect {
                host: loopback(),
                port: addr.port(),
                local_port: None,
            };
            let t = open_target(&ep, &mut |_| {}).map_err(|e| e.to_string())?;
            let opened = engine.open_opened(spec(ep), source, t);
            let (report, got) = finish_with_receiver(opened, rx, || {})?;
            if report.bytes != data.len() as u64 {
                return Err(format!("report says {} bytes", report.bytes));
            }
            got
        }
        other => unreachable!("not a target of this test: {other:?}"),
    };
    writer
        .join()
        .expect("writer thread")
        .map_err(|e| format!("writer: {e}"))?;
    compare(&got, data)
}

/// `length` on a stream source moves that many bytes and stops, even though the writer has
/// more; a source that ends before `length` is an error, not a short success.
#[test]
fn length_bounds_stream_sources() {
    let dir = tempfile::tempdir().expect("temp dir");
    let engine = engine();
    let mut failures = Vec::new();
    let data = pattern((1 << 20) + 7);
    for path in [DataPath::Splice, DataPath::Copy] {
        for kind in [StreamSource::Tcp, StreamSource::Pipe] {
            for (length, ok) in [
                (0u64, true),
                (1, true),
                (4097, true),
                (1 << 20, true),
                ((1 << 20) + 8, false),
            ] {
                let name = format!("{kind:?} -> file by {path}: length {length}");
                let (source, writer) = open_stream_source(kind, data.clone());
                let p = dir.path().join("out");
                let ep = Endpoint::File { path: p.clone() };
                let target = open_target(&ep, &mut |_| {}).expect("open target");
                let mut spec = StreamSpec::new(Endpoint::Stdio, ep);
                spec.extent.length = Some(length);
                spec.path = PathChoice::Fixed(path);
                let r = engine
                    .open_opened(spec, source, target)
                    .map_err(|e| format!("open failed: {e}"))
                    .and_then(wait);
                let _ = writer.join(); // fails with EPIPE when the stream stopped reading first
                let got = fs::read(&p).expect("read target");
                let r = match (r, ok) {
                    (Ok(rep), true) if rep.bytes == length => {
                        compare(&got, &data[..length as usize])
                    }
                    (Ok(rep), true) => Err(format!("report says {} bytes", rep.bytes)),
                    (Err(e), true) => Err(e),
                    (Ok(rep), false) => {
                        Err(format!("a short source succeeded with {} bytes", rep.bytes))
                    }
                    (Err(e), false) if e.contains("ended early") => Ok(()),
                    (Err(e), false) => Err(format!("expected \"the source ended early\", got {e}")),
                };
                if let Err(e) = r {
                    failures.push(format!("{name}: {e}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A UDP source has no end: a length ends it, after whole datagrams (copy keeps each one).
#[test]
fn udp_source_with_a_length_ends() {
    let dir = tempfile::tempdir().expect("temp dir");
    let engine = engine();
    let rx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let tx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    tx.connect(rx.local_addr().expect("addr")).expect("connect");
    let data = pattern(10 * 1000);
    for d in data.chunks(1000) {
        tx.send(d).expect("send a datagram");
    }
    rx.set_nonblocking(true).expect("nonblocking");
    let source = Opened {
        fd: rx.into(),
        kind: IoKind::Datagram,
        size: None,
        socket: true,
        label: "udp source".into(),
        volume: None,
    };
    let p = dir.path().join("out");
    let ep = Endpoint::File { path: p.clone() };
    let target = open_target(&ep, &mut |_| {}).expect("open target");
    let mut spec = StreamSpec::new(Endpoint::Stdio, ep);
    spec.extent.length = Some(5000);
    spec.unit_bytes = 1000;
    let h = engine.open_opened(spec, source, target).expect("open");
    assert_eq!(h.path(), DataPath::Copy, "auto path from a datagram source");
    let report = wait(h).expect("stream ends after its length");
    assert_eq!((report.bytes, report.units), (5000, 5));
    assert_eq!(fs::read(&p).expect("read target"), &data[..5000]);
}

/// The big file: `mib` MiB of a 1 MiB pattern whose first 8 bytes of each MiB hold the MiB's
/// index (so a block out of place changes the checksum). Returns its crc32c.
fn make_big(path: &Path, mib: u64) -> u32 {
    let mut block = pattern(1 << 20);
    let mut f = io::BufWriter::with_capacity(1 << 20, File::create(path).expect("create big file"));
    let mut crc = 0u32;
    for i in 0..mib {
        block[..8].copy_from_slice(&i.to_le_bytes());
        crc = penstock_core::crc::crc32c_append(crc, &block);
        f.write_all(&block).expect("write big file");
    }
    f.into_inner()
        .expect("flush big file")
        .sync_all()
        .expect("sync big file");
    crc
}

/// A TCP receiver that counts and checksums what arrives; with `stop_after`, it closes the
/// connection once it has read that many bytes (a receiver that goes away mid-transfer).
fn tcp_checksum_receiver(
    stop_after: Option<u64>,
) -> (SocketAddr, JoinHandle<io::Result<(u64, u32)>>) {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let addr = l.local_addr().expect("local addr");
    let h = thread::spawn(move || {
        let (mut s, _) = l.accept()?;
        let mut buf = vec![0u8; 1 << 20];
        let (mut total, mut crc) = (0u64, 0u32);
        loop {
            let n = s.read(&mut buf)?;
            if n == 0 {
                return Ok((total, crc));
            }
            total += n as u64;
            crc = penstock_core::crc::crc32c_append(crc, &buf[..n]);
            if stop_after.is_some_and(|stop| total >= stop) {
                return Ok((total, crc)); // drops the socket with unread data: the peer sees RST
            }
        }
    });
    (addr, h)
}

/// One multi-hundred-MB file (hot cache) per path to a TCP receiver, checked by crc32c; then
/// a receiver that leaves after ~1 MB: the sender reports a disconnect and how many bytes it
/// had sent, never success.
#[test]
fn big_file_every_path_and_receiver_that_leaves() {
    const MIB: u64 = 300;
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path().join("big");
    let crc = make_big(&src, MIB);
    let engine = engine();
    let mut failures = Vec::new();
    // Drop last: RWF_DONTCACHE may evict the pages the others read hot.
    let modes = [
        mode(DataPath::Copy, CachePolicy::Keep),
        mode(DataPath::Sendfile, CachePolicy::Keep),
        mode(DataPath::Splice, CachePolicy::Keep),
        mode(DataPath::Uring, CachePolicy::Keep),
        URING_ZC,
        mode(DataPath::Uring, CachePolicy::Bypass),
        mode(DataPath::Uring, CachePolicy::Drop),
    ];
    for m in modes.iter().filter(|m| runnable(&engine, m)) {
        let case = Case {
            mode: *m,
            target: TargetKind::Tcp,
            size: MIB << 20,
            offset: 0,
            length: None,
            unit: 0,
        };
        let (addr, rx) = tcp_checksum_receiver(None);
        let target = Endpoint::TcpConnect {
            host: loopback(),
            port: addr.port(),
            local_port: None,
        };
        let r = match engine.open(spec(&case, &src, target)) {
            Ok(h) => h.wait().map_err(|e| format!("stream failed: {e}")),
            Err(e) => {
                let _ = TcpStream::connect(addr);
                Err(format!("open failed: {e}"))
            }
        };
        let got = rx.join().expect("receiver thread");
        let r = r.and_then(|report| {
            check_report(&case, &report, (MIB << 20) as usize)?;
            match got {
                Ok((n, c)) if n == MIB << 20 && c == crc => Ok(()),
                Ok((n, c)) => Err(format!(
                    "received {n} bytes crc32c {c:08x}, expected {} crc32c {crc:08x}",
                    MIB << 20
                )),
                Err(e) => Err(format!("receiver: {e}")),
            }
        });
        if let Err(e) = r {
            failures.push(format!("{case}: {e}"));
        }
    }
    for m in modes.iter().take(5).filter(|m| runnable(&engine, m)) {
        let case = Case {
            mode: *m,
            target: TargetKind::Tcp,
            size: MIB << 20,
            offset: 0,
            length: None,
            unit: 0,
        };
        let (addr, rx) = tcp_checksum_receiver(Some(1 << 20));
        let target = Endpoint::TcpConnect {
            host: loopback(),
            port: addr.port(),
            local_port: None,
        };
        let h = engine.open(spec(&case, &src, target)).expect("open");
        let r = h.wait();
        let (received, _) = rx.join().expect("receiver thread").expect("receiver");
        match r {
            Err(StreamError::PeerClosed { bytes_sent, .. })
                if bytes_sent >= received && bytes_sent < MIB << 20 => {}
            other => failures.push(format!(
                "{m} to a receiver that left after {received} bytes: expected PeerClosed with \
                 {received}..{} bytes sent, got {other:?}",
                MIB << 20
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A stream can be cancelled while its receiver does not read: `wait` says so, with the bytes
/// sent so far.
#[test]
fn cancel_stops_a_blocked_stream() {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path().join("src");
    make_big(&src, 32);
    let engine = engine();
    for m in [
        mode(DataPath::Copy, CachePolicy::Keep),
        mode(DataPath::Sendfile, CachePolicy::Keep),
        mode(DataPath::Splice, CachePolicy::Keep),
        mode(DataPath::Uring, CachePolicy::Keep),
    ]
    .iter()
    .filter(|m| runnable(&engine, m))
    {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        let port = l.local_addr().expect("addr").port();
        let case = Case {
            mode: *m,
            target: TargetKind::Tcp,
            size: 32 << 20,
            offset: 0,
            length: None,
            unit: 0,
        };
        let target = Endpoint::TcpConnect {
            host: loopback(),
            port,
            local_port: None,
        };
        let h = engine.open(spec(&case, &src, target)).expect("open");
        let (_peer, _) = l.accept().expect("accept"); // held open, never read
        // Wait until the socket buffers are full and the stream is blocked on its peer.
        let mut last = u64::MAX;
        loop {
            thread::sleep(Duration::from_millis(50));
            let now = h.counters().bytes_sent;
            if now == last && now > 0 {
                break;
            }
            last = now;
        }
        h.cancel();
        match h.wait_timeout(CASE_TIMEOUT) {
            Some(Err(StreamError::Cancelled { bytes_sent })) => {
                assert!(
                    (last..32 << 20).contains(&bytes_sent),
                    "{m}: cancelled after {bytes_sent} bytes, the counters said {last}"
                );
            }
            other => panic!("{m}: expected Cancelled, got {other:?}"),
        }
    }
}

/// The engine refuses what it cannot do, with a typed error, before moving a byte.
#[test]
fn bad_streams_are_refused_with_typed_errors() {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path().join("src");
    fs::write(&src, pattern(4097)).expect("write source");
    let out = dir.path().join("out");
    let engine = engine();
    let open = |source: &Path, offset: u64, length: Option<u64>, unit: usize, path: DataPath| {
        engine.open(StreamSpec {
            source: Some(Endpoint::File {
                path: source.to_path_buf(),
            }),
            target: Some(Endpoint::File { path: out.clone() }),
            extent: Extent { offset, length },
            unit_bytes: unit,
            path: PathChoice::Fixed(path),
            cache: CachePolicy::Keep,
            zero_copy: ZeroCopy::Auto,
            pacing: Pacing::Burst,
            miss_after: None,
            trace: false,
            class: None,
            best_effort: false,
            buffers: None,
            start_at: None,
            send_timeout: Some(SEND_TIMEOUT_DEFAULT),
            late: LatePolicy::Send,
            rtp: None,
            interleaved: None,
        })
    };
    let r = open(&dir.path().join("missing"), 0, None, 0, DataPath::Copy);
    assert!(
        matches!(&r, Err(StreamError::Open(OpenError::Io { source, .. })) if source.kind() == io::ErrorKind::NotFound),
        "missing source: {r:?}"
    );
    let r = open(dir.path(), 0, None, 0, DataPath::Copy);
    assert!(
        matches!(r, Err(StreamError::Open(OpenError::Directory { .. }))),
        "directory source: {r:?}"
    );
    let r = open(&src, 4098, None, 0, DataPath::Sendfile);
    assert!(
        matches!(
            r,
            Err(StreamError::Extent(ExtentError::OffsetPastEnd {
                offset: 4098,
                size: 4097
            }))
        ),
        "offset past the end: {r:?}"
    );
    let r = open(&src, 4096, Some(2), 0, DataPath::Sendfile);
    assert!(
        matches!(
            r,
            Err(StreamError::Extent(ExtentError::LengthPastEnd { .. }))
        ),
        "length past the end: {r:?}"
    );
    if runnable(&engine, &mode(DataPath::Uring, CachePolicy::Keep)) {
        let r = open(&src, 0, None, 2 << 20, DataPath::Uring);
        assert!(
            matches!(
                r,
                Err(StreamError::Plan(PlanError::UnitOverBuffer {
                    unit_bytes: 2097152,
                    ..
                }))
            ),
            "unit larger than the pool's buffers: {r:?}"
        );
    }
    let (pipe, _w) = rustix::pipe::pipe().expect("pipe");
    let source = Opened {
        fd: pipe.into(),
        kind: IoKind::Pipe,
        size: None,
        socket: false,
        label: "pipe".into(),
        volume: None,
    };
    let ep = Endpoint::File { path: out.clone() };
    let target = open_target(&ep, &mut |_| {}).expect("open target");
    let mut spec = StreamSpec::new(Endpoint::Stdio, ep);
    spec.extent.offset = 1;
    let r = engine.open_opened(spec, source, target).map(|_| ());
    assert!(
        matches!(
            r,
            Err(StreamError::Extent(ExtentError::OffsetOnStream(
                IoKind::Pipe
            )))
        ),
        "offset on a pipe source: {r:?}"
    );
}

/// An offset or length past the end of the source is refused before the target is opened: an
/// existing target file is not truncated by a stream that never starts.
#[test]
fn refused_extent_leaves_the_target_file_alone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path().join("src");
    fs::write(&src, pattern(4097)).expect("write source");
    let out = dir.path().join("precious");
    let engine = engine();
    for (offset, length) in [(4098, None), (0, Some(4098))] {
        fs::write(&out, b"keep me").expect("write target");
        let mut spec = StreamSpec::new(
            Endpoint::File { path: src.clone() },
            Endpoint::File { path: out.clone() },
        );
        spec.extent = Extent { offset, length };
        let r = engine.open(spec).map(|_| ());
        assert!(
            matches!(r, Err(StreamError::Extent(_))),
            "offset {offset} length {length:?}: {r:?}"
        );
        assert_eq!(
            fs::read(&out).expect("read target"),
            b"keep me",
            "offset {offset} length {length:?}: the target was changed"
        );
    }
}

/// Sendfile and uring need a file source; bypass needs uring. (`choose_path`'s rules, through
/// the engine with real descriptors.)
#[test]
fn impossible_paths_are_refused() {
    let engine = engine();
    for (path, cache) in [
        (DataPath::Sendfile, CachePolicy::Keep),
        (DataPath::Uring, CachePolicy::Keep),
        (DataPath::Copy, CachePolicy::Bypass),
    ] {
        let (pipe, _w) = rustix::pipe::pipe().expect("pipe");
        let source = Opened {
            fd: pipe.into(),
            kind: IoKind::Pipe,
            size: None,
            socket: false,
            label: "pipe".into(),
            volume: None,
        };
        let (_r, w) = rustix::pipe::pipe().expect("pipe");
        let target = Opened {
            fd: w.into(),
            kind: IoKind::Pipe,
            size: None,
            socket: false,
            label: "pipe".into(),
            volume: None,
        };
        let mut spec = StreamSpec::new(Endpoint::Stdio, Endpoint::Stdio);
        spec.path = PathChoice::Fixed(path);
        spec.cache = cache;
        let r = engine.open_opened(spec, source, target).map(|_| ());
        assert!(
            matches!(
                r,
                Err(StreamError::Path(
                    PathError::NeedsFileSource { .. }
                        | PathError::BypassNeedsUring { .. }
                        | PathError::NoUring { .. }
                ))
            ),
            "{path}/{}: {r:?}",
            cache.name()
        );
    }
}
