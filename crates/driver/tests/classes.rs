//! Disk classes on the real engine (issue 38 item 3): N classes (`DiskConfig::named_classes`,
//! `[disk.classes.NAME]`), and a running stream moved to another class
//! (`StreamHandle::set_class`, the control protocol's `CLASS`) without stopping it — re-admitted
//! into `rt`, refused naming the resource when `rt` is full — while six bulk readers load the
//! disk with O_DIRECT reads of a real file.
//!
//! What is asserted is behaviour: which class's queue read the moved stream's bytes before
//! and after the move (the scheduler's own per-class counts), the reservation it holds, the
//! refusal's words, and every byte arriving. The lateness before and after the move is
//! printed (`--nocapture`) for the record, not asserted: on a shared VM it says as much about
//! the neighbours as about the scheduler.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use penstock_core::admission::{AdmissionConfig, Capacity};
use penstock_core::endpoint::Endpoint;
use penstock_core::stream::plan::{ClassName, DiskClass, Pacing};
use penstock_core::stream::{CachePolicy, DataPath, PathChoice};
use penstock_core::units::Rate;
use penstock_driver::disk::DiskConfig;
use penstock_driver::{
    Engine, EngineConfig, LatenessCounts, StreamError, StreamHandle, StreamSpec,
};

const MIB: u64 = 1 << 20;
/// The paced stream: 160 MB/s in 1 MiB units (153 units a second): more than the bulk class
/// gives one of its seven readers when the disk is shared (`disk_inflight_max = 1`), less
/// than rt's share (its quantum is 4 of the 5 MiB a round serves).
const PACED_BYTES_PER_S: u64 = 160_000_000;
const PACED_UNIT: u64 = MIB;
/// Its source: at least the test's two phases at the rate.
const PACED_FILE: u64 = 192 * MIB;
/// The bulk readers' file, read whole and again by each of six readers.
const BULK_FILE: u64 = 32 * MIB;
const BULK_READERS: usize = 6;

fn write_file(path: &Path, bytes: u64) {
    let mut f = std::fs::File::create(path).unwrap();
    let mut block = vec![0u8; MIB as usize];
    for i in 0..bytes / MIB {
        // Each MiB names itself: a misplaced block is a wrong byte.
        block.fill(i as u8);
        block[..8].copy_from_slice(&i.to_le_bytes());
        f.write_all(&block).unwrap();
    }
    f.sync_all().unwrap();
}

fn engine(net_bytes_per_s: u64) -> Engine {
    Engine::new(EngineConfig {
        // One worker: the disk scheduler is per worker, so the streams share one queue.
        workers: 1,
        pool_buffers: 64,
        buffer_bytes: MIB as usize,
        stream_depth: 4,
        disk: DiskConfig {
            disk_inflight_max: 1,
            named_classes: vec![("gold".into(), 2 * MIB)],
            ..DiskConfig::default()
        },
        admission: AdmissionConfig {
            capacity: Capacity {
                disk_seq_bytes_per_s: 100_000_000_000,
                disk_random_iops: 10_000_000,
                disk_random_request_bytes: 4096,
                net_bytes_per_s,
                buffer_count: 1024,
                buffer_bytes: MIB,
                ..Capacity::CONSERVATIVE
            },
            bulk_share_percent: 0,
            streams_max: 64,
            rt_latency_ns: 0,
            lateness_tolerance_ns: penstock_core::admission::LATENESS_TOLERANCE_NS_DEFAULT,
        },
        ..EngineConfig::default()
    })
    .unwrap()
}

fn bulk_reader(e: &Engine, src: &Path) -> StreamHandle {
    let mut s = StreamSpec::new(
        Endpoint::File {
            path: src.to_path_buf(),
        },
        Endpoint::File {
            path: PathBuf::from("/dev/null"),
        },
    );
    s.path = PathChoice::Fixed(DataPath::Uring);
    s.cache = CachePolicy::Bypass;
    s.class = Some(DiskClass::Bulk);
    e.open(s).unwrap()
}

/// A paced stream of `src` into `dst`, O_DIRECT, in class `class`.
fn paced(
    e: &Engine,
    src: &Path,
    dst: &Path,
    class: DiskClass,
) -> Result<StreamHandle, StreamError> {
    let mut s = StreamSpec::new(
        Endpoint::File {
            path: src.to_path_buf(),
        },
        Endpoint::File {
            path: dst.to_path_buf(),
        },
    );
    s.path = PathChoice::Fixed(DataPath::Uring);
    s.cache = CachePolicy::Bypass;
    s.unit_bytes = PACED_UNIT as usize;
    s.pacing = Pacing::Rate(Rate::BitsPerSecond(PACED_BYTES_PER_S * 8));
    s.class = Some(class);
    e.open(s)
}

fn served(e: &Engine, class: &str) -> u64 {
    e.disk_served_bytes_per_class()
        .into_iter()
        .find(|(n, _)| n == class)
        .map_or(0, |(_, b)| b)
}

/// Lateness counted between two snapshots: (units, p50, p99, max bucket ends in µs, misses).
fn between(a: &LatenessCounts, b: &LatenessCounts) -> (u64, u64, u64, u64, u64) {
    let mut d = *b;
    for (x, y) in d.buckets.iter_mut().zip(a.buckets) {
        *x -= y;
    }
    d.misses -= a.misses;
    let units: u64 = d.buckets.iter().sum();
    let q = |ppm| {
        penstock_core::lateness::lateness_bucket_quantile_ns(&d.buckets, ppm).unwrap_or(0) / 1000
    };
    (units, q(500_000), q(990_000), q(1_000_000), d.misses)
}

/// Keeps six bulk readers running for `for_how_long`: one that finishes is started again.
fn load(e: &Engine, src: &Path, readers: &mut [StreamHandle], for_how_long: Duration) {
    let until = Instant::now() + for_how_long;
    while Instant::now() < until {
        for r in readers.iter_mut() {
            if let Some(done) = r.wait_timeout(Duration::ZERO) {
                assert_eq!(done.unwrap().bytes, BULK_FILE, "a bulk reader lost bytes");
                *r = bulk_reader(e, src);
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_running_stream_moves_from_bulk_to_rt_under_six_bulk_readers() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let bulk_src = dir.path().join("bulk.bin");
    let paced_src = dir.path().join("paced.bin");
    write_file(&bulk_src, BULK_FILE);
    write_file(&paced_src, PACED_FILE);
    // rt's share of the network: one 160 MB/s stream fits, a second does not.
    let e = engine(200_000_000);
    assert_eq!(e.disk_classes(), ["rt", "bulk", "gold"]);

    let mut readers: Vec<StreamHandle> = (0..BULK_READERS)
        .map(|_| bulk_reader(&e, &bulk_src))
        .collect();
    let out = dir.path().join("paced.out");
    let h = paced(&e, &paced_src, &out, DiskClass::Bulk).unwrap();
    assert_eq!(h.class(), DiskClass::Bulk);
    assert!(
        h.reservation().is_none(),
        "a bulk stream holds no reservation"
    );

    load(&e, &bulk_src, &mut readers, Duration::from_millis(600));
    let l0 = h.lateness();
    assert_eq!(served(&e, "rt"), 0, "nothing is in rt before the move");
    let sent_before = h.counters().bytes_sent;

    // The move: re-admitted in rt, and the same stream goes on.
    h.set_class(DiskClass::Rt).unwrap();
    assert_eq!(h.class(), DiskClass::Rt);
    let r = h.reservation().expect("rt holds a reservation");
    assert!(
        (PACED_BYTES_PER_S..=PACED_BYTES_PER_S + 1).contains(&r.qos.rate_bytes_per_s),
        "{:?}",
        r.qos
    );

    // A second paced stream, moved to rt while the first holds it: refused naming the
    // resource, left in its class.
    let out2 = dir.path().join("paced2.out");
    let h2 = paced(&e, &paced_src, &out2, DiskClass::Bulk).unwrap();
    let err = h2.set_class(DiskClass::Rt).unwrap_err();
    println!("refusal: {err}");
    assert!(
        matches!(&err, StreamError::Refused(_)) && err.to_string().contains("network"),
        "{err}"
    );
    assert_eq!(h2.class(), DiskClass::Bulk);
    assert!(h2.reservation().is_none());
    // An unknown class is refused naming the classes.
    let unknown = h2
        .set_class(DiskClass::Named(ClassName::new("platinum").unwrap()))
        .unwrap_err();
    assert!(unknown.to_string().contains("rt, bulk, gold"), "{unknown}");
    // A named class takes it, and reads there.
    let gold0 = served(&e, "gold");
    h2.set_class(DiskClass::Named(ClassName::new("gold").unwrap()))
        .unwrap();

    let rt0 = served(&e, "rt");
    let l1 = h.lateness();
    load(&e, &bulk_src, &mut readers, Duration::from_millis(600));
    let l2 = h.lateness();
    assert!(
        h.counters().bytes_sent > sent_before,
        "the moved stream kept running"
    );
    assert!(
        served(&e, "rt") > rt0,
        "the moved stream's reads are served in rt"
    );
    assert!(served(&e, "gold") > gold0, "gold reads the second stream");
    let (n_before, p50_b, p99_b, max_b, miss_b) = between(&LatenessCounts::default(), &l0);
    let (n_after, p50_a, p99_a, max_a, miss_a) = between(&l1, &l2);
    println!(
        "lateness in bulk (6 bulk readers, {n_before} units): p50 <= {p50_b} us, p99 <= {p99_b} us, max <= {max_b} us, misses {miss_b}"
    );
    println!(
        "lateness in rt   (6 bulk readers, {n_after} units): p50 <= {p50_a} us, p99 <= {p99_a} us, max <= {max_a} us, misses {miss_a}"
    );
    assert!(n_before > 0 && n_after > 0);

    // Back to bulk gives the reservation back.
    h.set_class(DiskClass::Bulk).unwrap();
    assert!(h.reservation().is_none());
    assert!(e.reservations().is_empty());

    for r in &readers {
        r.cancel();
    }
    h2.cancel();
    for r in readers {
        let _ = r.wait();
    }
    let _ = h2.wait();
    h.cancel();
    let _ = h.wait();
    // What the moved stream sent is the source's first bytes, exactly.
    let got = std::fs::read(&out).unwrap();
    let want = std::fs::read(&paced_src).unwrap();
    assert!(!got.is_empty() && got[..] == want[..got.len()]);
}
