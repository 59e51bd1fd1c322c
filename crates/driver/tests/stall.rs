//! The progress timeout (`StreamSpec::send_timeout`, issue 20 defect 5) and the stream slot
//! reserved ahead of a start (`Engine::reserve_stream`), on loopback with the real kernel.
//!
//! A stalled peer is a real socket nobody reads (or nobody writes to); a stream that is not
//! stalled — paused, or a paced stream waiting for its next unit — must not be cut. Time
//! appears only as generous upper bounds on how long a timeout may take to fire, never as a
//! lower bound or a measured figure.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use penstock_core::endpoint::{Endpoint, Host, Role};
use penstock_core::stream::plan::Pacing;
use penstock_core::stream::{DataPath, PathChoice};
use penstock_driver::engine::SEND_TIMEOUT_DEFAULT;
use penstock_driver::open::{open_source, open_target};
use penstock_driver::{Engine, EngineConfig, StreamError, StreamHandle, StreamSpec};

/// Far more than loopback socket buffers hold: a stream to a receiver that reads nothing
/// blocks long before its end. Sparse, so it costs no disk.
const BIG_BYTES: u64 = 256 << 20;
/// A timeout fires within this much more than itself (the watchdog scans every quarter of
/// it; the rest is slack for a loaded machine). An upper bound, never a measurement.
const FIRE_SLACK: Duration = Duration::from_secs(5);
/// How long a stream that should finish may take before it counts as hung.
const HANG: Duration = Duration::from_secs(60);

fn engine(streams_max: usize) -> Engine {
    Engine::new(EngineConfig {
        workers: 1,
        pool_buffers: 16,
        buffer_bytes: 1 << 20,
        stream_depth: 4,
        streams_max,
        ..EngineConfig::default()
    })
    .expect("engine starts")
}

fn sparse_file(dir: &Path, name: &str, len: u64) -> PathBuf {
    let p = dir.join(name);
    File::create(&p)
        .and_then(|f| f.set_len(len))
        .expect("sparse source");
    p
}

fn tcp_target(addr: SocketAddr) -> Endpoint {
    Endpoint::parse(&format!("tcp://{addr}"), Role::Target).expect("target endpoint")
}

fn spec(source: &Path, target: Endpoint, path: DataPath, timeout: Duration) -> StreamSpec {
    let mut s = StreamSpec::new(
        Endpoint::File {
            path: source.to_path_buf(),
        },
        target,
    );
    s.path = PathChoice::Fixed(path);
    s.send_timeout = Some(timeout);
    s
}

/// The paths that can run here (the uring path needs io_uring; skipped loudly without it).
fn paths(engine: &Engine) -> Vec<DataPath> {
    let mut v = vec![DataPath::Copy, DataPath::Sendfile, DataPath::Splice];
    if penstock_testreq::require_ok("io_uring", engine.info().uring.clone()).is_some() {
        v.push(DataPath::Uring);
    }
    v
}

/// Waits at most `bound` for the stream's report.
fn report_within(
    h: &StreamHandle,
    bound: Duration,
    what: &str,
) -> Result<penstock_driver::StreamReport, StreamError> {
    match h.wait_timeout(bound) {
        Some(r) => r,
        None => {
            h.cancel();
            panic!("{what}: no report within {bound:?}");
        }
    }
}

/// A receiver that reads everything and counts it, once `go` says so.
fn reader(l: TcpListener, go: std::sync::mpsc::Receiver<()>) -> thread::JoinHandle<u64> {
    thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        let _ = go.recv();
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return total,
                Ok(n) => total += n as u64,
            }
        }
    })
}

#[test]
fn stream_new_has_the_default_send_timeout() {
    let s = StreamSpec::new(Endpoint::Stdio, Endpoint::Stdio);
    assert_eq!(s.send_timeout, Some(SEND_TIMEOUT_DEFAULT));
    assert_eq!(SEND_TIMEOUT_DEFAULT, Duration::from_secs(60));
}

/// A receiver that accepts and never reads: every path reports `Stalled` with the bytes it
/// had sent, within the timeout plus slack, and the message says what happened.
#[test]
fn receiver_that_never_reads_is_reported_stalled_on_every_path() {
    const TIMEOUT: Duration = Duration::from_secs(1);
    let dir = tempfile::tempdir().expect("temp dir");
    let src = sparse_file(dir.path(), "big", BIG_BYTES);
    let engine = engine(64);
    let mut running = Vec::new();
    for path in paths(&engine) {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        let mut s = spec(
            &src,
            tcp_target(l.local_addr().expect("addr")),
            path,
            TIMEOUT,
        );
        if path == DataPath::Uring {
            // A send is seen when it completes: units small enough to fit the socket buffers.
            s.unit_bytes = 64 << 10;
        }
        let h = engine.open(s).expect("open");
        // Accepted (the kernel already did) and held, never read.
        let (peer, _) = l.accept().expect("accept");
        running.push((path, h, peer, Instant::now()));
    }
    let mut failures = Vec::new();
    for (path, h, peer, opened) in running {
        let r = report_within(&h, TIMEOUT + FIRE_SLACK, &format!("{path}"));
        let waited = opened.elapsed();
        match r {
            Err(StreamError::Stalled {
                bytes_sent,
                timeout,
            }) => {
                let msg = r
                    .as_ref()
                    .err()
                    .map(ToString::to_string)
                    .unwrap_or_default();
                if bytes_sent == 0 || bytes_sent >= BIG_BYTES {
                    failures.push(format!("{path}: Stalled after {bytes_sent} bytes"));
                }
                if timeout != TIMEOUT || !msg.contains("no progress for 1s") {
                    failures.push(format!("{path}: {msg:?} (timeout {timeout:?})"));
                }
            }
            other => failures.push(format!("{path}: {other:?} after {waited:?}")),
        }
        drop(peer);
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A socket source whose peer sends a little and then nothing (the connection stays open):
/// waiting for a source is a wait on a peer too.
#[test]
fn source_that_stops_sending_is_reported_stalled() {
    const TIMEOUT: Duration = Duration::from_millis(800);
    let dir = tempfile::tempdir().expect("temp dir");
    let engine = engine(64);
    for path in [DataPath::Copy, DataPath::Splice] {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        let addr = l.local_addr().expect("addr");
        let sender = thread::spawn(move || {
            let (mut s, _) = l.accept().expect("accept");
            s.write_all(&[7u8; 1000]).expect("send");
            // Silent, the connection open, until the engine closes its side (EOF).
            let mut b = [0u8; 1];
            let _ = s.read(&mut b);
        });
        let mut s = StreamSpec::new(
            Endpoint::TcpConnect {
                host: Host::Ip(addr.ip()),
                port: addr.port(),
                local_port: None,
            },
            Endpoint::File {
                path: dir.path().join(format!("out-{path}")),
            },
        );
        s.path = PathChoice::Fixed(path);
        s.send_timeout = Some(TIMEOUT);
        let h = engine.open(s).expect("open");
        match report_within(&h, TIMEOUT + FIRE_SLACK, &format!("{path} from a socket")) {
            Err(StreamError::Stalled { bytes_sent, .. }) => assert_eq!(bytes_sent, 1000, "{path}"),
            other => panic!("{path}: expected Stalled after 1000 bytes, got {other:?}"),
        }
        // The report comes after the engine closed its descriptors: the peer sees EOF.
        sender.join().expect("sender");
    }
}

/// Streams paused for six timeouts are not stalled: resumed, they finish byte-complete.
#[test]
fn paused_stream_is_not_a_stall() {
    const TIMEOUT: Duration = Duration::from_millis(500);
    const LEN: u64 = 32 << 20;
    let dir = tempfile::tempdir().expect("temp dir");
    let src = sparse_file(dir.path(), "src", LEN);
    let engine = engine(64);
    let mut running = Vec::new();
    for path in paths(&engine) {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        let addr = l.local_addr().expect("addr");
        let (go, gate) = std::sync::mpsc::channel();
        let rx = reader(l, gate);
        let h = engine
            .open(spec(&src, tcp_target(addr), path, TIMEOUT))
            .expect("open");
        h.pause();
        running.push((path, h, go, rx));
    }
    for (path, h, _, _) in &running {
        let t0 = Instant::now();
        while !h.is_paused() {
            assert!(t0.elapsed() < HANG, "{path}: the pause was never taken");
            thread::sleep(Duration::from_millis(1));
        }
    }
    // Six timeouts paused, the receivers reading nothing meanwhile.
    thread::sleep(TIMEOUT * 6);
    for (path, h, go, rx) in running {
        assert!(
            h.wait_timeout(Duration::ZERO).is_none(),
            "{path}: a paused stream ended"
        );
        h.resume();
        go.send(()).expect("receiver waits");
        let r = report_within(&h, HANG, &format!("{path} after resume"))
            .unwrap_or_else(|e| panic!("{path}: paused stream failed: {e}"));
        assert_eq!(r.bytes, LEN, "{path}");
        assert_eq!(rx.join().expect("receiver"), LEN, "{path}");
    }
}

/// A paced stream whose period (2 s) is four times its timeout (500 ms), to a receiver that
/// reads: waiting for its own next deadline is not a stall.
#[test]
fn paced_stream_with_a_period_longer_than_the_timeout_is_not_a_stall() {
    const TIMEOUT: Duration = Duration::from_millis(500);
    const UNIT: u64 = 4096;
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path().join("two-units");
    std::fs::write(&src, vec![5u8; 2 * UNIT as usize]).expect("source");
    let engine = engine(64);
    let mut paced_paths = vec![DataPath::Copy];
    if engine.info().uring.is_ok() {
        paced_paths.push(DataPath::Uring);
    }
    for path in paced_paths {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        let addr = l.local_addr().expect("addr");
        let (go, gate) = std::sync::mpsc::channel();
        go.send(()).expect("open gate");
        let rx = reader(l, gate);
        let mut s = spec(&src, tcp_target(addr), path, TIMEOUT);
        s.pacing = Pacing::Periodic {
            period: Duration::from_secs(2),
        };
        s.unit_bytes = (UNIT) as usize;
        let h = engine.open(s).expect("open");
        let r = report_within(&h, HANG, &format!("paced {path}"))
            .unwrap_or_else(|e| panic!("{path}: paced stream failed: {e}"));
        assert_eq!((r.bytes, r.units), (2 * UNIT, 2), "{path}");
        assert_eq!(rx.join().expect("receiver"), 2 * UNIT, "{path}");
    }
}

/// `reserve_stream` takes a place against `streams_max` ahead of the start; `open_reserved`
/// spends it, the handle holds it, and dropping either gives it back.
#[test]
fn reserved_slots_count_against_streams_max() {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path().join("src");
    std::fs::write(&src, vec![1u8; 4096]).expect("source");
    let engine = engine(1);
    let slot = engine.reserve_stream().expect("one place");
    assert!(matches!(
        engine.reserve_stream(),
        Err(StreamError::TooManyStreams(1))
    ));
    let out = dir.path().join("out");
    let file_spec = || {
        StreamSpec::new(
            Endpoint::File { path: src.clone() },
            Endpoint::File { path: out.clone() },
        )
    };
    let opened = |s: &StreamSpec| {
        (
            open_source(s.source.as_ref().unwrap(), &mut |_| {}).expect("source"),
            open_target(s.target.as_ref().unwrap(), &mut |_| {}).expect("target"),
        )
    };
    let s = file_spec();
    let (a, b) = opened(&s);
    assert!(matches!(
        engine.open_opened(s, a, b),
        Err(StreamError::TooManyStreams(1))
    ));
    let s = file_spec();
    let (a, b) = opened(&s);
    let h = engine
        .open_reserved(slot, s, a, b)
        .expect("open in the slot");
    assert!(
        engine.reserve_stream().is_err(),
        "the handle holds the place"
    );
    let r = report_within(&h, HANG, "reserved stream").expect("reserved stream");
    assert_eq!(r.bytes, 4096);
    assert!(
        engine.reserve_stream().is_err(),
        "the place is the handle's until it is dropped"
    );
    drop(h);
    let slot = engine.reserve_stream().expect("given back with the handle");
    drop(slot);
    drop(
        engine
            .reserve_stream()
            .expect("given back when dropped unused"),
    );
    // A slot of another engine is refused.
    let other = self::engine(2);
    let foreign = other.reserve_stream().expect("other engine's place");
    let s = file_spec();
    let (a, b) = opened(&s);
    assert!(matches!(
        engine.open_reserved(foreign, s, a, b),
        Err(StreamError::ForeignSlot)
    ));
}
