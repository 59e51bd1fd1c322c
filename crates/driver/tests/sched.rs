//! The timed workers' CPU reservation is the kernel's and follows admission (issue 37): a
//! deadline worker's runtime, read back with `sched_getattr`, is the floor with nothing
//! granted, widens by exactly what admission charged the rt streams placed on it, narrows
//! again as they close; the kernel refusing the bandwidth refuses the stream; bulk streams
//! never run on a timed worker. Needs root (CAP_SYS_NICE) and io_uring.
//!
//! The tests share the machine's deadline bandwidth, so they run one at a time.

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::Path;
use std::sync::Mutex;
use std::sync::mpsc::{Sender, channel};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use penstock_core::admission::{AdmissionConfig, Capacity};
use penstock_core::endpoint::{Endpoint, Role};
use penstock_core::sched::policy::{DeadlineConfig, SchedAsk, SchedPolicy, deadline_params};
use penstock_core::stream::plan::Pacing;
use penstock_driver::sched::thread_sched;
use penstock_driver::{DiskClass, Engine, EngineConfig, StreamError, StreamHandle, StreamSpec};

const BUFFER_BYTES: usize = 64 << 10;
const FILE_BYTES: u64 = 16 << 20;
const SCHED_DEADLINE: u32 = 6;

static SERIAL: Mutex<()> = Mutex::new(());

fn engine(ask: SchedAsk, deadline: DeadlineConfig) -> Engine {
    engine_with(ask, deadline, 1)
}

fn engine_with(ask: SchedAsk, deadline: DeadlineConfig, timed_workers: usize) -> Engine {
    let cfg = EngineConfig {
        workers: 1,
        timed_workers,
        sched: ask,
        deadline,
        pool_buffers: 64,
        buffer_bytes: BUFFER_BYTES,
        stream_depth: 8,
        client_buffers_max: 8,
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
        ..EngineConfig::default()
    };
    Engine::new(cfg).expect("engine starts")
}

/// The timed worker's thread id, when it got `SCHED_DEADLINE` (else the test cannot run
/// here: a missing requirement, loud).
fn deadline_worker(e: &Engine) -> Option<i32> {
    if !penstock_testreq::require_root() || !penstock_testreq::require_io_uring() {
        return None;
    }
    let timed: Vec<_> = e.info().workers.iter().filter(|w| w.timed).collect();
    assert!(!timed.is_empty(), "timed workers: {:?}", e.info().workers);
    let w = timed[0];
    let missing = (w.policy != SchedPolicy::Deadline)
        .then(|| format!("the kernel did not grant SCHED_DEADLINE: {:?}", w.notes));
    penstock_testreq::require_that("SCHED_DEADLINE", missing).then_some(w.tid)
}

fn make_file(path: &Path) {
    let block: Vec<u8> = (0..BUFFER_BYTES as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let mut f = File::create(path).expect("create source");
    for _ in 0..FILE_BYTES / BUFFER_BYTES as u64 {
        f.write_all(&block).expect("write source");
    }
}

type Received = JoinHandle<io::Result<u64>>;

/// A receiver that accepts and reads nothing until its gate opens: the stream stays open
/// (its sends wait for room) while the test looks at the worker.
fn gated_receiver() -> (SocketAddr, Sender<()>, Received) {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let addr = l.local_addr().expect("local addr");
    let (gate, opened) = channel::<()>();
    let h = thread::spawn(move || {
        let (mut s, _) = l.accept()?;
        let _ = opened.recv();
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        loop {
            let n = s.read(&mut buf)?;
            if n == 0 {
                return Ok(total);
            }
            total += n as u64;
        }
    });
    (addr, gate, h)
}

fn spec(source: &Path, to: SocketAddr, period: Option<Duration>) -> StreamSpec {
    let mut s = StreamSpec::new(
        Endpoint::File {
            path: source.to_path_buf(),
        },
        Endpoint::parse(&format!("tcp://{to}"), Role::Target).expect("target endpoint"),
    );
    if let Some(period) = period {
        s.class = Some(DiskClass::Rt);
        s.pacing = Pacing::Periodic { period };
        s.unit_bytes = (BUFFER_BYTES as u64) as usize;
    }
    s
}

fn runtime_of(tid: i32) -> u64 {
    let a = thread_sched(tid).expect("sched_getattr");
    assert_eq!(a.policy, SCHED_DEADLINE, "{a:?}");
    a.runtime_ns
}

struct Open {
    handle: StreamHandle,
    gate: Sender<()>,
    rx: Received,
}

fn open(e: &Engine, file: &Path, period: Option<Duration>) -> Result<Open, StreamError> {
    let (addr, gate, rx) = gated_receiver();
    let handle = e.open(spec(file, addr, period))?;
    Ok(Open { handle, gate, rx })
}

fn finish(o: Open) {
    o.handle.cancel();
    let _ = o.gate.send(());
    let _ = o.handle.wait();
    let _ = o.rx.join();
}

#[test]
fn a_deadline_workers_runtime_follows_what_admission_granted() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let cfg = DeadlineConfig::default();
    let e = engine(SchedAsk::Deadline, cfg);
    let Some(tid) = deadline_worker(&e) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("src.bin");
    make_file(&file);
    let floor = deadline_params(0, &cfg).unwrap().runtime_ns;
    assert_eq!(runtime_of(tid), floor, "nothing granted: the floor");
    let a = thread_sched(tid).unwrap();
    assert_eq!((a.deadline_ns, a.period_ns), (cfg.period_ns, cfg.period_ns));

    let mut open_ones = Vec::new();
    let mut granted = 0u64;
    for period_ms in [2, 4, 8] {
        let o = open(&e, &file, Some(Duration::from_millis(period_ms))).expect("rt stream opens");
        let r = o
            .handle
            .reservation()
            .expect("an rt stream holds a reservation");
        assert!(r.cpu_ns_per_s > 0, "{r:?}");
        granted += r.cpu_ns_per_s;
        let timed = &e.info().workers[o.handle.worker_index()];
        assert!(timed.timed, "a paced rt stream runs on the timed worker");
        assert_eq!(e.timed_granted(), vec![granted]);
        let want = deadline_params(granted, &cfg).unwrap().runtime_ns;
        assert!(want > floor);
        assert_eq!(runtime_of(tid), want, "granted {granted} ns/s");
        open_ones.push(o);
    }
    // Closing gives it back, one stream at a time.
    while let Some(o) = open_ones.pop() {
        let r = o.handle.reservation().unwrap();
        finish(o);
        granted -= r.cpu_ns_per_s;
        assert_eq!(e.timed_granted(), vec![granted]);
        assert_eq!(
            runtime_of(tid),
            deadline_params(granted, &cfg).unwrap().runtime_ns
        );
    }
    assert_eq!(runtime_of(tid), floor);
}

#[test]
fn bulk_never_runs_on_a_timed_worker() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let e = engine(SchedAsk::Deadline, DeadlineConfig::default());
    if deadline_worker(&e).is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("src.bin");
    make_file(&file);
    for _ in 0..4 {
        let o = open(&e, &file, None).expect("bulk stream opens");
        let w = &e.info().workers[o.handle.worker_index()];
        assert!(!w.timed, "bulk placed on {w:?}");
        assert_eq!(w.policy, SchedPolicy::Other);
        let _ = o.gate.send(());
        let report = o.handle.wait().expect("bulk stream ends");
        assert_eq!(report.bytes, FILE_BYTES);
        assert_eq!(o.rx.join().unwrap().unwrap(), FILE_BYTES);
    }
}

/// Admission knows the CPU the timed workers can be given (issue 37 item 4): its rt CPU is
/// bounded by the deadline workers' cap less their floor, so a stream the reservation
/// could not take is refused by admission itself, naming the reservations, before any
/// placement; nothing changes, and bulk still runs.
#[test]
fn a_grant_past_the_reservations_cap_is_refused_and_changes_nothing() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // A cap just above the floor: the first rt stream's CPU cannot fit.
    let cfg = DeadlineConfig {
        floor_ppm: 100_000,
        max_ppm: 100_001,
        ..DeadlineConfig::default()
    };
    let e = engine(SchedAsk::Deadline, cfg);
    let Some(tid) = deadline_worker(&e) else {
        return;
    };
    let bound = penstock_core::sched::policy::deadline_grant_max_ns_per_s(&cfg);
    assert_eq!(bound, 1_000, "1 ns a 1 ms period");
    assert_eq!(e.admission_usage().1.cpu_ns_per_s, bound);
    assert!(
        e.info()
            .sched_notes
            .iter()
            .any(|n| n.contains("rt CPU bounded")),
        "{:?}",
        e.info().sched_notes
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("src.bin");
    make_file(&file);
    let before = runtime_of(tid);
    let refused = open(&e, &file, Some(Duration::from_millis(2))).err();
    match refused {
        Some(StreamError::Refused(why)) => {
            let why = why.to_string();
            assert!(
                why.contains("cpu") && why.contains("timed workers' CPU reservations"),
                "{why}"
            )
        }
        other => panic!(
            "expected admission to refuse for the reservations, got {:?}",
            other.map(|e| e.to_string())
        ),
    }
    assert_eq!(runtime_of(tid), before);
    assert_eq!(e.timed_granted(), vec![0]);
    assert!(e.reservations().is_empty(), "the admission was given back");
    // Bulk still runs.
    let o = open(&e, &file, None).expect("bulk opens");
    let _ = o.gate.send(());
    assert_eq!(o.handle.wait().expect("bulk ends").bytes, FILE_BYTES);
}

#[test]
fn the_kernel_refusing_deadline_bandwidth_refuses_the_stream() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let cfg = DeadlineConfig::default();
    let e = engine(SchedAsk::Deadline, cfg);
    let Some(tid) = deadline_worker(&e) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("src.bin");
    make_file(&file);
    // Take the machine's deadline bandwidth with sleeping threads, 10 % at a time, until
    // the kernel refuses one more: then no widening can be had.
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let stop_rx = std::sync::Arc::new(Mutex::new(stop_rx));
    let mut hogs = Vec::new();
    loop {
        let (ok_tx, ok_rx) = channel();
        let stop = stop_rx.clone();
        hogs.push(thread::spawn(move || {
            let attr = penstock_driver::sched::KernelSchedAttr {
                policy: SCHED_DEADLINE,
                runtime_ns: 100_000,
                deadline_ns: 1_000_000,
                period_ns: 1_000_000,
                ..Default::default()
            };
            let got = penstock_driver::sched::set_thread_sched(0, &attr).is_ok();
            let _ = ok_tx.send(got);
            if got {
                let _ = stop.lock().unwrap().recv();
            }
        }));
        if !ok_rx.recv().unwrap() || hogs.len() > 4096 {
            break;
        }
    }
    let refused = open(&e, &file, Some(Duration::from_millis(2))).err();
    drop(stop_tx);
    for h in hogs {
        let _ = h.join();
    }
    match refused {
        Some(StreamError::CpuReservation(why)) => {
            assert!(why.contains("kernel refused"), "{why}")
        }
        other => panic!(
            "expected the kernel's refusal, got {:?}",
            other.map(|e| e.to_string())
        ),
    }
    assert_eq!(e.timed_granted(), vec![0]);
    assert!(e.reservations().is_empty());
    // With the bandwidth back, the same stream is admitted.
    let o = open(&e, &file, Some(Duration::from_millis(2))).expect("admitted now");
    assert!(runtime_of(tid) > deadline_params(0, &cfg).unwrap().runtime_ns);
    finish(o);
}

#[test]
fn admitted_streams_go_to_the_timed_worker_with_the_least_granted() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let cfg = DeadlineConfig::default();
    let e = engine_with(SchedAsk::Deadline, cfg, 2);
    if deadline_worker(&e).is_none() {
        return;
    }
    let tids: Vec<i32> = e
        .info()
        .workers
        .iter()
        .filter(|w| w.timed)
        .map(|w| w.tid)
        .collect();
    assert_eq!(tids.len(), 2);
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("src.bin");
    make_file(&file);
    let mut open_ones = Vec::new();
    for _ in 0..4 {
        open_ones.push(open(&e, &file, Some(Duration::from_millis(4))).expect("rt stream opens"));
    }
    // Four equal streams: two on each timed worker, each worker's runtime the same.
    let on: Vec<usize> = open_ones.iter().map(|o| o.handle.worker_index()).collect();
    let first = e.info().workers.iter().position(|w| w.timed).unwrap();
    assert_eq!(on.iter().filter(|&&w| w == first).count(), 2, "{on:?}");
    assert_eq!(on.iter().filter(|&&w| w == first + 1).count(), 2, "{on:?}");
    let g = e.timed_granted();
    assert_eq!(g[0], g[1]);
    assert!(g[0] > 0);
    assert_eq!(runtime_of(tids[0]), runtime_of(tids[1]));
    assert_eq!(
        runtime_of(tids[0]),
        deadline_params(g[0], &cfg).unwrap().runtime_ns
    );
    for o in open_ones {
        finish(o);
    }
    assert_eq!(e.timed_granted(), vec![0, 0]);
}
