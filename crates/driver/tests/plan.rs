//! The planner's promises as the engine keeps them (issue 17), on the real kernel:
//! - a stream's source is never opened again by its path: the O_DIRECT descriptor is the
//!   opened inode's own (`/proc/self/fd`), so a path swapped for a link between the open and
//!   the engine's start changes nothing that is sent;
//! - a refused plan leaves admission, the buffer books and the stream slots as they were.

use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::time::Duration;

use penstock_core::admission::{AdmissionConfig, Capacity};
use penstock_core::schedule::ScheduleError;
use penstock_core::stream::plan::{Pacing, PlanError};
use penstock_core::stream::{CachePolicy, DataPath, Extent, IoKind, PathChoice};
use penstock_driver::open::{Opened, classify_file};
use penstock_driver::{DiskClass, Engine, EngineConfig, StreamError, StreamSpec};

fn engine() -> Engine {
    Engine::new(EngineConfig {
        workers: 1,
        pool_buffers: 8,
        buffer_bytes: 1 << 20,
        stream_depth: 4,
        client_buffers_max: 8,
        streams_max: 1,
        admission: AdmissionConfig {
            capacity: Capacity {
                disk_seq_bytes_per_s: 1 << 30,
                disk_random_iops: 100_000,
                disk_random_request_bytes: 4096,
                net_bytes_per_s: 1 << 30,
                buffer_count: 64,
                buffer_bytes: 1 << 20,
                ..Capacity::CONSERVATIVE
            },
            bulk_share_percent: 20,
            streams_max: 16,
            rt_latency_ns: 0,
            lateness_tolerance_ns: penstock_core::admission::LATENESS_TOLERANCE_NS_DEFAULT,
        },
        ..EngineConfig::default()
    })
    .expect("engine starts")
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = vec![0u8; len];
    for c in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
    v
}

fn file(path: &Path) -> Opened {
    classify_file(
        std::fs::File::open(path).unwrap(),
        path.display().to_string(),
    )
    .unwrap()
}

fn receiver() -> (SocketAddr, std::thread::JoinHandle<Vec<u8>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        got
    });
    (addr, t)
}

fn socket(addr: SocketAddr) -> Opened {
    let s = std::net::TcpStream::connect(addr).unwrap();
    s.set_nonblocking(true).unwrap();
    Opened {
        fd: s.into(),
        kind: IoKind::StreamSocket,
        size: None,
        socket: true,
        label: addr.to_string(),
        volume: None,
    }
}

#[test]
fn a_source_is_never_opened_again_by_its_path() {
    let engine = engine();
    // On the target directory's file system (a real disk, where O_DIRECT works; tmpfs refuses
    // it and the stream would read through the cache, which proves less).
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let served = dir.path().join("served.bin");
    let original = pattern(3 << 20, 1);
    std::fs::write(&served, &original).unwrap();
    let outside = dir.path().join("outside.bin");
    std::fs::write(&outside, pattern(3 << 20, 2)).unwrap();
    let mut paths = vec![(DataPath::Sendfile, CachePolicy::Keep)];
    if penstock_testreq::require_ok("io_uring", engine.info().uring.clone()).is_some() {
        paths.push((DataPath::Uring, CachePolicy::Keep));
        paths.push((DataPath::Uring, CachePolicy::Bypass));
    }
    for (path, cache) in paths {
        std::fs::write(&served, &original).unwrap();
        let source = file(&served);
        // Between the open and the start, the path becomes a link to another file.
        std::fs::remove_file(&served).unwrap();
        std::os::unix::fs::symlink(&outside, &served).unwrap();
        let (addr, rx) = receiver();
        let mut spec = StreamSpec::opened();
        spec.path = PathChoice::Fixed(path);
        spec.cache = cache;
        let h = engine.open_opened(spec, source, socket(addr)).unwrap();
        let report = h.wait().unwrap();
        let got = rx.join().unwrap();
        assert!(
            got == original,
            "{path} {cache:?}: the bytes sent are not the opened file's"
        );
        if cache == CachePolicy::Bypass {
            eprintln!("{path} bypass notes: {:?}", report.notes);
        }
        std::fs::remove_file(&served).unwrap();
    }
}

#[test]
fn a_refused_plan_leaves_admission_buffers_and_slots_untouched() {
    let engine = engine();
    // The refusal tested is the uring path's.
    if penstock_testreq::require_ok("io_uring", engine.info().uring.clone()).is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("a.bin");
    std::fs::write(&src, pattern(4 << 20, 3)).unwrap();
    let usage = || {
        let (u, _) = engine.admission_usage();
        (u, engine.buffer_usage().reserved)
    };
    let before = usage();
    // An rt stream that admission would take, whose unit does not fit a pool buffer: the
    // planner's schedule refuses it (a paced unit is one pool buffer's at most).
    let (addr, _rx) = receiver();
    let mut spec = StreamSpec::opened();
    spec.path = PathChoice::Fixed(DataPath::Uring);
    spec.class = Some(DiskClass::Rt);
    spec.pacing = Pacing::Periodic {
        period: Duration::from_millis(10),
    };
    spec.unit_bytes = 2 << 20;
    let r = engine.open_opened(spec, file(&src), socket(addr));
    assert!(
        matches!(
            r,
            Err(StreamError::Plan(PlanError::Schedule(
                ScheduleError::UnitTooLarge { .. }
            )))
        ),
        "{r:?}"
    );
    assert_eq!(
        usage(),
        before,
        "admission or buffers changed by a refused plan"
    );
    // An extent past the end: refused before anything, too.
    let (addr, _rx2) = receiver();
    let mut spec = StreamSpec::opened();
    spec.extent = Extent {
        offset: 5 << 20,
        length: None,
    };
    assert!(matches!(
        engine.open_opened(spec, file(&src), socket(addr)),
        Err(StreamError::Extent(_))
    ));
    assert_eq!(usage(), before);
    // streams_max is 1: the refused streams left their slot free.
    let slot = engine.reserve_stream().expect("the one slot is free");
    drop(slot);
}
