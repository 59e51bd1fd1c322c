//! The buffer memory manager in the engine (issue 5, item 5), on loopback with real files,
//! real sockets and the real io_uring: `bulk` streams borrow the worker's pool, an admitted
//! `rt` stream gets the buffers it reserved back from them without a byte lost, and no stream
//! holds more than `client_buffers_max`.
//!
//! Saturation is made deterministic with receivers that read nothing until told to: a bulk
//! stream's sends then block once the socket buffers are full, and its pool buffers stay held
//! (one in a send, the others full). Only behaviour is asserted (completion, byte-exact
//! contents, counts); time appears only as a bound on how long a hung test may take.

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Sender, channel};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use penstock_core::admission::{AdmissionConfig, Capacity};
use penstock_core::buffers::BufferError;
use penstock_core::endpoint::{Endpoint, Role};
use penstock_core::stream::plan::Pacing;
use penstock_core::stream::{DataPath, PathChoice};
use penstock_driver::{
    DiskClass, Engine, EngineConfig, EngineError, StreamError, StreamHandle, StreamReport,
    StreamSpec,
};

const BUFFER_BYTES: usize = 64 << 10;
/// Bulk sources: far more than loopback socket buffers hold, so an unread stream blocks.
const BULK_BYTES: u64 = 48 << 20;
/// The rt source: 32 units.
const RT_BYTES: u64 = 2 << 20;
const RT_PERIOD: Duration = Duration::from_millis(2);
/// How long a stream may take before it counts as hung (not a performance bound).
const HANG: Duration = Duration::from_secs(60);

/// One worker (every stream shares its pool), `pool_buffers` of 64 KiB, a read-ahead depth of
/// the whole pool, and admission with room to spare (this test is about buffers).
fn engine(pool_buffers: usize, client_buffers_max: usize) -> Option<Engine> {
    let cfg = EngineConfig {
        workers: 1,
        pool_buffers,
        buffer_bytes: BUFFER_BYTES,
        stream_depth: pool_buffers,
        client_buffers_max,
        admission: AdmissionConfig {
            capacity: Capacity {
                disk_seq_bytes_per_s: 10_000_000_000,
                disk_random_iops: 1_000_000,
                disk_random_request_bytes: 4096,
                net_bytes_per_s: 10_000_000_000,
                buffer_count: 1024,
                buffer_bytes: BUFFER_BYTES as u64,
                ..Capacity::CONSERVATIVE
            },
            bulk_share_percent: 20,
            streams_max: 64,
            rt_latency_ns: 0,
            lateness_tolerance_ns: penstock_core::admission::LATENESS_TOLERANCE_NS_DEFAULT,
        },
        // Each unit at its own deadline: with a dispatch slack a unit due within it of a
        // late one goes with it, before its deadline by design (docs/pacing.md), and the rt
        // test below checks that none goes early.
        dispatch_slack: Duration::ZERO,
        ..EngineConfig::default()
    };
    let e = Engine::new(cfg).expect("engine starts");
    // The buffer manager accounts the io_uring pool.
    penstock_testreq::require_ok("io_uring", e.info().uring.clone())?;
    Some(e)
}

/// A file of `bytes` whose every 64 KiB block starts with its index (a block out of place or
/// sent twice changes the checksum). Returns its crc32c.
fn make_file(path: &Path, bytes: u64) -> u32 {
    let mut block: Vec<u8> = (0..BUFFER_BYTES as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let mut f = BufWriter::new(File::create(path).expect("create source"));
    let mut crc = 0;
    for i in 0..bytes / BUFFER_BYTES as u64 {
        block[..8].copy_from_slice(&i.to_le_bytes());
        crc = penstock_core::crc::crc32c_append(crc, &block);
        f.write_all(&block).expect("write source");
    }
    f.into_inner().expect("flush source");
    crc
}

/// A TCP receiver that reads nothing until the gate opens (or its sender is dropped), then
/// reads to the end: bytes and crc32c.
type Received = JoinHandle<io::Result<(u64, u32)>>;

fn gated_receiver() -> (SocketAddr, Sender<()>, Received) {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let addr = l.local_addr().expect("local addr");
    let (gate, opened) = channel::<()>();
    let h = thread::spawn(move || {
        let (mut s, _) = l.accept()?;
        let _ = opened.recv();
        let mut buf = vec![0u8; 1 << 20];
        let (mut total, mut crc) = (0u64, 0u32);
        loop {
            let n = s.read(&mut buf)?;
            if n == 0 {
                return Ok((total, crc));
            }
            total += n as u64;
            crc = penstock_core::crc::crc32c_append(crc, &buf[..n]);
        }
    });
    (addr, gate, h)
}

fn spec(source: &Path, to: SocketAddr) -> StreamSpec {
    let mut s = StreamSpec::new(
        Endpoint::File {
            path: source.to_path_buf(),
        },
        Endpoint::parse(&format!("tcp://{to}"), Role::Target).expect("target endpoint"),
    );
    s.path = PathChoice::Fixed(DataPath::Uring);
    s
}

/// An admitted rt stream: 64 KiB every `RT_PERIOD`, reserving `buffers` pool buffers.
fn rt_spec(source: &Path, to: SocketAddr, buffers: u32) -> StreamSpec {
    let mut s = spec(source, to);
    s.class = Some(DiskClass::Rt);
    s.buffers = Some(buffers);
    s.pacing = Pacing::Periodic { period: RT_PERIOD };
    s.unit_bytes = (BUFFER_BYTES as u64) as usize;
    s
}

fn wait(h: StreamHandle, what: &str) -> StreamReport {
    match h.wait_timeout(HANG) {
        Some(r) => r.unwrap_or_else(|e| panic!("{what} failed: {e}")),
        None => {
            h.cancel();
            panic!("{what} hung: {:?}", h.wait());
        }
    }
}

/// Polls `cond` until it holds; panics with `what` when it does not within `HANG`.
fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < HANG, "never happened: {what}");
        thread::sleep(Duration::from_millis(1));
    }
}

/// Samples the buffers bulk streams borrow for `time`: never above `max`. Returns the peak.
fn hold_for(e: &Engine, time: Duration, max: u64) -> u64 {
    let start = Instant::now();
    let mut peak = 0;
    while start.elapsed() < time {
        let u = e.buffer_usage();
        assert!(u.bulk_borrowed <= max, "more than {max} borrowed: {u:?}");
        peak = peak.max(u.bulk_borrowed);
        thread::sleep(Duration::from_micros(200));
    }
    peak
}

struct Bulk {
    handle: StreamHandle,
    gate: Sender<()>,
    receiver: Received,
}

fn open_bulk(e: &Engine, source: &Path) -> Bulk {
    let (addr, gate, receiver) = gated_receiver();
    let handle = e.open(spec(source, addr)).expect("bulk stream opens");
    Bulk {
        handle,
        gate,
        receiver,
    }
}

/// Lets the receiver read, and checks that every byte of the source arrived, in order.
fn finish_bulk(b: Bulk, what: &str, crc: u32) {
    b.gate.send(()).expect("receiver waits at its gate");
    let r = wait(b.handle, what);
    let (got, got_crc) = b.receiver.join().expect("receiver").expect("receive");
    assert_eq!((r.bytes, got), (BULK_BYTES, BULK_BYTES), "{what}: bytes");
    assert_eq!(got_crc, crc, "{what}: contents differ from the source");
}

fn files(dir: &Path) -> (PathBuf, u32, PathBuf, u32) {
    let bulk = dir.join("bulk");
    let rt = dir.join("rt");
    let bulk_crc = make_file(&bulk, BULK_BYTES);
    let rt_crc = make_file(&rt, RT_BYTES);
    (bulk, bulk_crc, rt, rt_crc)
}

#[test]
fn rt_stream_gets_its_reserved_buffers_back_from_bulk_streams_that_fill_the_pool() {
    let Some(e) = engine(8, 6) else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let (bulk_src, bulk_crc, rt_src, rt_crc) = files(dir.path());

    // Two bulk streams whose receivers read nothing: they borrow the whole pool (6 + 2).
    let bulk: Vec<Bulk> = (0..2).map(|_| open_bulk(&e, &bulk_src)).collect();
    until("bulk streams hold every pool buffer", || {
        e.buffer_usage().bulk_borrowed == 8
    });
    // ... and their sends are stuck (the socket buffers are full): no byte moves for a while.
    let mut sent: Vec<u64> = Vec::new();
    let mut still = Instant::now();
    until("bulk sends block", || {
        let now: Vec<u64> = bulk
            .iter()
            .map(|b| b.handle.counters().bytes_sent)
            .collect();
        if now != sent {
            sent = now;
            still = Instant::now();
        }
        still.elapsed() >= Duration::from_millis(100)
    });
    let before = e.buffer_usage();
    assert_eq!((before.buffers_total, before.reserved), (8, 0));
    assert_eq!(before.repossessions, 0);

    // An rt stream reserving 2: its buffers come back from the borrowers while their sends
    // stay blocked, so it can only finish by repossession.
    let (addr, gate, receiver) = gated_receiver();
    gate.send(()).expect("open the rt receiver's gate");
    let rt = e
        .open(rt_spec(&rt_src, addr, 2))
        .expect("rt stream admitted");
    assert_eq!(e.buffer_usage().reserved, 2, "reserved at open");
    let mut rt_peak = 0;
    let report = loop {
        rt_peak = rt_peak.max(e.buffer_usage().rt_in_use);
        if let Some(r) = rt.wait_timeout(Duration::from_millis(1)) {
            break r.expect("rt stream completes");
        }
    };
    let (got, got_crc) = receiver.join().expect("rt receiver").expect("receive");
    assert_eq!((report.bytes, got), (RT_BYTES, RT_BYTES));
    assert_eq!(got_crc, rt_crc, "rt contents differ from the source");
    // Paced: every unit went out, none before its deadline.
    let lateness = report
        .lateness
        .expect("a paced stream reports lateness")
        .summary();
    assert_eq!(lateness.units, RT_BYTES / BUFFER_BYTES as u64);
    assert_eq!(lateness.early_units, 0, "units sent before their deadline");
    assert!(
        rt_peak <= 2,
        "the rt stream held {rt_peak} buffers, reserved 2"
    );

    let during = e.buffer_usage();
    assert!(during.repossessions > 0, "no repossession: {during:?}");
    assert!(
        during.reread_chunks > 0,
        "blocked borrowers can only pay with full chunks: {during:?}"
    );
    assert!(
        bulk.iter()
            .all(|b| b.handle.wait_timeout(Duration::ZERO).is_none())
    );

    // The borrowers read again what they gave back: every byte arrives, in order.
    for (i, b) in bulk.into_iter().enumerate() {
        finish_bulk(b, &format!("bulk stream {i}"), bulk_crc);
    }
    let after = e.buffer_usage();
    assert_eq!(
        (after.reserved, after.rt_in_use, after.bulk_borrowed),
        (0, 0, 0),
        "buffers still accounted after every stream ended: {after:?}"
    );
}

#[test]
fn no_stream_holds_more_than_client_buffers_max() {
    let Some(e) = engine(8, 3) else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let (bulk_src, bulk_crc, rt_src, rt_crc) = files(dir.path());

    // One borrower alone, with a depth of 8 and 8 free buffers, holds 3 at most; with a
    // second one, 6 at most are borrowed.
    let first = open_bulk(&e, &bulk_src);
    let peak = hold_for(&e, Duration::from_millis(200), 3);
    assert_eq!(peak, 3, "the borrower reached its limit");
    let second = open_bulk(&e, &bulk_src);
    let peak = hold_for(&e, Duration::from_millis(200), 6);
    assert_eq!(peak, 6, "both borrowers reached their limit");

    // An rt reservation is a share of one pool, within the per-client limit.
    let (addr, _gate, _r) = gated_receiver();
    match e.open(rt_spec(&rt_src, addr, 4)) {
        Err(e @ StreamError::Plan(_)) => {
            let why = e.to_string();
            assert!(why.contains("client_buffers_max"), "{why}")
        }
        other => panic!("a reservation above client_buffers_max: {other:?}"),
    }
    let mut rts = Vec::new();
    for _ in 0..2 {
        let (addr, gate, receiver) = gated_receiver();
        let h = e
            .open(rt_spec(&rt_src, addr, 3))
            .expect("rt stream admitted");
        rts.push((h, gate, receiver));
    }
    assert_eq!(e.buffer_usage().reserved, 6);
    let (addr, _gate, _r) = gated_receiver();
    match e.open(rt_spec(&rt_src, addr, 3)) {
        Err(StreamError::Buffers(BufferError::ReserveShort {
            need: 3, left: 2, ..
        })) => {}
        other => panic!("a third reservation of 3 in a pool of 8: {other:?}"),
    }
    assert!(
        e.reservations().len() == 2,
        "a refused stream keeps no admission"
    );
    for (i, (h, gate, receiver)) in rts.into_iter().enumerate() {
        gate.send(()).expect("gate");
        let r = wait(h, &format!("rt stream {i}"));
        let (got, crc) = receiver.join().expect("receiver").expect("receive");
        assert_eq!((r.bytes, got, crc), (RT_BYTES, RT_BYTES, rt_crc), "rt {i}");
    }
    finish_bulk(first, "first borrower", bulk_crc);
    finish_bulk(second, "second borrower", bulk_crc);
    assert_eq!(e.buffer_usage().reserved, 0);
}

#[test]
fn zero_client_buffers_max_is_refused() {
    let cfg = EngineConfig {
        workers: 1,
        client_buffers_max: 0,
        ..EngineConfig::default()
    };
    match Engine::new(cfg) {
        Err(EngineError::Config(why)) => assert!(why.contains("client_buffers_max"), "{why}"),
        other => panic!("client_buffers_max 0 accepted: {other:?}"),
    }
}
