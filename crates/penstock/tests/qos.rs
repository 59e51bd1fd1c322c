//! Disk QoS from the command line: calibration, admission control, bad input.

use std::process::Command;

fn penstock(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_penstock"))
        .args(args)
        .output()
        .expect("run penstock")
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn calibrate_writes_figures_the_engine_reads() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cal.toml");
    let o = penstock(&[
        "calibrate",
        dir.path().to_str().unwrap(),
        "--quick",
        "--out",
        out.to_str().unwrap(),
    ]);
    if !penstock_testreq::require_that(
        "O_DIRECT on the temp directory",
        (!o.status.success() && stderr(&o).contains("O_DIRECT refused")).then(|| stderr(&o)),
    ) {
        return;
    }
    assert!(o.status.success(), "{}", stderr(&o));
    let cal = penstock_driver::calibration::Calibration::load(&out).expect("a calibration file");
    assert!(cal.seq_read_bytes_per_s_depth1 > 0 && cal.seq_read_bytes_per_s_depth4 > 0);
    assert_eq!(cal.random.len(), 6);
    assert!(cal.random.iter().all(|r| r.iops > 0), "{cal:?}");
    // The engine's send costs, measured by running it: a send and a byte.
    assert!(
        cal.send_ns.is_some_and(|n| n > 0) && cal.send_byte_ps.is_some_and(|p| p > 0),
        "{cal:?}"
    );
    // The test file is gone.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("cal.toml")]);
}

fn small_calibration(dir: &std::path::Path) -> std::path::PathBuf {
    let cal = penstock_driver::calibration::Calibration {
        path: "test".into(),
        seq_read_bytes_per_s_depth1: 10_000_000,
        seq_read_bytes_per_s_depth4: 10_000_000,
        random: vec![penstock_driver::calibration::RandomFigure {
            request_bytes: 65536,
            depth: 1,
            iops: 1000,
        }],
        seq_read_by_depth: Vec::new(),
        read_depth: None,
        send_ns: None,
        send_byte_ps: None,
        send_burst_byte_ps: None,
    };
    let p = dir.join("small.toml");
    cal.save(&p).unwrap();
    p
}

#[test]
fn an_rt_stream_beyond_capacity_is_refused_naming_the_shortage() {
    let dir = tempfile::tempdir().unwrap();
    let cal = small_calibration(dir.path());
    let src = dir.path().join("src.bin");
    std::fs::write(&src, vec![7u8; 64 * 1024]).unwrap();
    let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    rx.set_nonblocking(true).unwrap();
    let target = format!("udp://{}", rx.local_addr().unwrap());
    // 8 KiB at 2000/s = 16 MB/s, more than the 10 MB/s disk.
    let o = penstock(&[
        "stream",
        src.to_str().unwrap(),
        &target,
        "--class",
        "rt",
        "--rate",
        "2000/s",
        "--unit",
        "8KiB",
        "--calibration",
        cal.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("penstock: error: admission:"), "{err}");
    assert!(
        err.contains("disk (device ") && err.contains("): need"),
        "the refusal names the disk shortage: {err}"
    );
    assert!(!err.contains("panicked"));
    let mut buf = [0u8; 16];
    assert!(rx.recv(&mut buf).is_err(), "nothing was sent");

    // Within capacity: admitted and sent.
    let o = penstock(&[
        "stream",
        src.to_str().unwrap(),
        &target,
        "--class",
        "rt",
        "--rate",
        "100/s",
        "--unit",
        "8KiB",
        "--calibration",
        cal.to_str().unwrap(),
        "--length",
        "16KiB",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn qos_bad_input_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.bin");
    std::fs::write(&src, vec![7u8; 4096]).unwrap();
    let s = src.to_str().unwrap();
    let o = penstock(&[
        "stream",
        s,
        "udp://127.0.0.1:9",
        "--class",
        "gold",
        "--rate",
        "10/s",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("expected rt or bulk"), "{}", stderr(&o));
    let o = penstock(&["stream", s, "udp://127.0.0.1:9", "--class", "rt"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("needs a rate or a period"),
        "{}",
        stderr(&o)
    );
    let missing = dir.path().join("nope.toml");
    let o = penstock(&[
        "stream",
        s,
        "udp://127.0.0.1:9",
        "--class",
        "rt",
        "--rate",
        "10/s",
        "--calibration",
        missing.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("nope.toml"), "{}", stderr(&o));
    let o = penstock(&["stream", s, "udp://127.0.0.1:9", "--sched", "elevator"]);
    assert_eq!(o.status.code(), Some(2));
    let o = penstock(&[
        "calibrate",
        "/definitely/not/here",
        "--quick",
        "--out",
        "/dev/null",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("/definitely/not/here"),
        "{}",
        stderr(&o)
    );
}

/// Overload: streams are admitted until the capacity is used; the next is refused and the
/// admitted ones are unaffected (they finish, byte counts exact). Lateness is reported by the
/// bench, not asserted here.
#[test]
fn overload_is_refused_and_admitted_streams_finish() {
    use penstock_core::admission::{AdmissionConfig, Capacity};
    use penstock_core::endpoint::{Endpoint, Host};
    use penstock_core::stream::Extent;
    use penstock_core::stream::plan::Pacing;
    use penstock_driver::{DiskClass, Engine, EngineConfig, StreamError, StreamSpec};
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.bin");
    std::fs::write(&src, vec![3u8; 64 * 1024]).unwrap();
    let capacity = Capacity {
        disk_seq_bytes_per_s: 10_000_000,
        disk_random_iops: 100_000,
        disk_random_request_bytes: 4096,
        net_bytes_per_s: 1_000_000_000,
        buffer_count: 64,
        buffer_bytes: 1 << 20,
        ..Capacity::CONSERVATIVE
    };
    let engine = Engine::new(EngineConfig {
        workers: 1,
        admission: AdmissionConfig {
            capacity,
            bulk_share_percent: 20,
            streams_max: 64,
            rt_latency_ns: 0,
            lateness_tolerance_ns: penstock_core::admission::LATENESS_TOLERANCE_NS_DEFAULT,
        },
        ..EngineConfig::default()
    })
    .unwrap();
    let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = rx.local_addr().unwrap().port();
    // 2 MB/s each: 4 fit in the 8 MB/s rt share (minus seek costs: fewer may).
    let mut admitted = Vec::new();
    let refusal = loop {
        let mut spec = StreamSpec::new(
            Endpoint::File { path: src.clone() },
            Endpoint::UdpSend {
                host: Host::Ip([127, 0, 0, 1].into()),
                port,
                local_port: None,
            },
        );
        spec.pacing = Pacing::Periodic {
            period: std::time::Duration::from_millis(4),
        };
        spec.unit_bytes = 8192;
        spec.class = Some(DiskClass::Rt);
        spec.extent = Extent {
            offset: 0,
            length: Some(32 * 1024),
        };
        match engine.open(spec) {
            Ok(h) => admitted.push(h),
            Err(e) => break e,
        }
        assert!(admitted.len() <= 8, "admission never refused");
    };
    assert!(matches!(refusal, StreamError::Refused(_)), "{refusal}");
    assert!(refusal.to_string().contains("disk"), "{refusal}");
    assert!(!admitted.is_empty(), "nothing was admitted");
    assert_eq!(engine.reservations().len(), admitted.len());
    for h in admitted {
        let r = h.wait().expect("an admitted stream finishes");
        assert_eq!(r.bytes, 32 * 1024);
    }
    assert!(
        engine.reservations().is_empty(),
        "reservations are released when streams end"
    );
}

/// The new user (issue 22): no calibration file, a 2 Mbit/s rt stream of an
/// ffmpeg-made TS in 1316-byte datagrams. Admission charges the executor's 1 MiB read-ahead
/// chunks, not one seek per datagram: admitted on the device's self-calibration, and on the
/// conservative defaults too (self-calibration off). The reply names the figures used.
#[test]
fn a_2_mbit_rt_stream_is_admitted_without_a_calibration_file() {
    let dir = tempfile::tempdir().unwrap();
    let ts = dir.path().join("movie.ts");
    let made = Command::new("ffmpeg")
        .args([
            "-loglevel",
            "error",
            "-f",
            "lavfi",
            "-i",
            "testsrc=size=160x120:rate=25",
        ])
        .args([
            "-t",
            "2",
            "-c:v",
            "mpeg2video",
            "-b:v",
            "1500k",
            "-f",
            "mpegts",
        ])
        .arg(&ts)
        .status();
    assert!(made.is_ok_and(|s| s.success()), "ffmpeg made no TS");
    let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let target = format!("udp://{}", rx.local_addr().unwrap());
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_penstock"))
            .args(["stream", ts.to_str().unwrap(), &target])
            .args(["--class", "rt", "--rate", "2Mbit/s", "--unit", "1316"])
            .args(["--length", "64KiB"])
            .args(extra)
            .env("PENSTOCK_CALIBRATION", dir.path().join("absent.toml"))
            .env("XDG_CACHE_HOME", dir.path().join("cache"))
            .output()
            .expect("run penstock")
    };
    let o = run(&[]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("penstock: admitted rt: disk "), "{err}");
    assert!(
        err.contains("(self-calibrated at ") || err.contains("(conservative defaults)"),
        "the figures are named: {err}"
    );
    let o = run(&["--no-self-calibrate"]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("(conservative defaults)"), "{err}");
    let mut buf = [0u8; 2048];
    assert_eq!(rx.recv(&mut buf).unwrap(), 1316);
}
