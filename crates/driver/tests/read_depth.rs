//! The uring path reads at the depth chosen for its source's device (issue 19, item 3c): a
//! calibration file's depth for its device, else self-calibration's, else the documented
//! default, capped by what a stream may hold — observed through the stream's own counters
//! (`StreamHandle::read_depth`: the most reads it had in flight at once).

use std::path::{Path, PathBuf};
use std::time::Duration;

use penstock_core::endpoint::Endpoint;
use penstock_core::stream::{CachePolicy, DataPath, PathChoice};
use penstock_driver::calibration::{Calibration, READ_DEPTH_DEFAULT};
use penstock_driver::{Engine, EngineConfig, ReadDepthConfig, ReadDepthSource, StreamSpec};

/// A 64 MiB source on the device under the build directory (a real disk, not tmpfs), one
/// per test (they run at once).
fn source(name: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("read-depth-{name}.bin"));
    std::fs::write(&p, vec![0x5au8; 64 << 20]).unwrap();
    p
}

/// A calibration file's contents: `path` measured, read depth `depth`.
fn calibration(path: &Path, depth: u32) -> Calibration {
    Calibration {
        path: path.display().to_string(),
        seq_read_bytes_per_s_depth1: 1,
        seq_read_bytes_per_s_depth4: 1,
        random: vec![],
        seq_read_by_depth: vec![],
        read_depth: Some(depth),
        send_ns: None,
        send_byte_ps: None,
        send_burst_byte_ps: None,
    }
}

/// Streams `src` to a file through the uring path (O_DIRECT reads) on an engine with
/// `read_depth` and `stream_depth`; the depth it was given, from where, and the most reads
/// it had in flight. `None` when io_uring is refused here.
fn run(
    src: &Path,
    read_depth: ReadDepthConfig,
    stream_depth: usize,
) -> Option<(u64, ReadDepthSource, u64)> {
    let engine = Engine::new(EngineConfig {
        workers: 1,
        pool_buffers: 32,
        buffer_bytes: 1 << 20,
        stream_depth,
        read_depth,
        ..EngineConfig::default()
    })
    .expect("engine starts");
    penstock_testreq::require_ok("io_uring", engine.info().uring.clone())?;
    let out = tempfile::tempdir().unwrap();
    let mut spec = StreamSpec::new(
        Endpoint::File {
            path: src.to_path_buf(),
        },
        Endpoint::File {
            path: out.path().join("dst.bin"),
        },
    );
    spec.path = PathChoice::Fixed(DataPath::Uring);
    spec.cache = CachePolicy::Bypass;
    let h = engine.open(spec).expect("the stream opens");
    let report = h
        .wait_timeout(Duration::from_secs(120))
        .expect("the stream ends")
        .expect("the stream ends well");
    assert_eq!(report.bytes, 64 << 20);
    let d = h.read_depth().expect("a uring stream has a read depth");
    Some((d.depth, d.source, d.in_flight_max))
}

#[test]
fn the_stream_reads_at_the_calibrated_depth_of_its_device() {
    let src = source("calibrated");
    for k in [2u32, 6, 11] {
        let depths = ReadDepthConfig {
            calibrated: calibration(&src, k).read_depths(),
            ..ReadDepthConfig::default()
        };
        assert_eq!(depths.calibrated.len(), 1, "the calibration names a device");
        let Some((depth, from, max)) = run(&src, depths, EngineConfig::default().stream_depth)
        else {
            return;
        };
        assert_eq!(
            (depth, from, max),
            (u64::from(k), ReadDepthSource::CalibrationFile, u64::from(k)),
            "calibrated depth {k}: given {depth} ({from}), {max} reads in flight at most"
        );
    }
}

#[test]
fn a_device_nothing_is_known_of_reads_at_the_default_depth() {
    let src = source("default");
    // A calibration of another device (/proc is not on the build directory's disk) says
    // nothing about this one; self-calibration is off (the library's default).
    let other = ReadDepthConfig {
        calibrated: calibration(Path::new("/proc/self/status"), 9).read_depths(),
        ..ReadDepthConfig::default()
    };
    let Some(got) = run(&src, other, EngineConfig::default().stream_depth) else {
        return;
    };
    let d = READ_DEPTH_DEFAULT as u64;
    assert_eq!(got, (d, ReadDepthSource::Default, d));
}

#[test]
fn the_read_depth_leaves_one_buffer_to_send_within_stream_depth() {
    let src = source("capped");
    let deep = ReadDepthConfig {
        calibrated: calibration(&src, 16).read_depths(),
        ..ReadDepthConfig::default()
    };
    // A stream may hold 5 buffers: 4 reads and the one being sent.
    let Some(got) = run(&src, deep, 5) else {
        return;
    };
    assert_eq!(got, (4, ReadDepthSource::CalibrationFile, 4));
}

#[test]
fn a_zero_read_depth_is_refused_at_start() {
    let e = Engine::new(EngineConfig {
        read_depth: ReadDepthConfig {
            default: 0,
            ..ReadDepthConfig::default()
        },
        ..EngineConfig::default()
    });
    assert!(e.is_err(), "a read depth of 0 must be refused");
}
