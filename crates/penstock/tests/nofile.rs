//! Issue 16, defect 3: 10,000 streams of one file failed with EMFILE where the hard
//! RLIMIT_NOFILE was 20,000 — one source descriptor per stream beside its socket, and a soft
//! limit left at what the shell gave. Now the engine shares one descriptor among the streams
//! of a file (`penstock_driver::files`) and every streaming command raises the soft limit to
//! the hard one at start.
//!
//! `penstock bench periodic` (the reproduction) runs as a child under
//! `prlimit --nofile=4096:HARD`, HARD being this machine's hard limit, read at run time: 10,000
//! paced UDP streams of one file, 2 units of 1 KiB each, a period of 1 s. The receiver (a child
//! of the bench) checks every stream's sequence numbers, which are the file's own bytes read at
//! each stream's offsets: a stream reading at a shared descriptor's file position would send
//! the wrong units. The copy path (pread + send per unit), because the uring path's pool books
//! check their invariants over every stream after each change in a debug build: quadratic in
//! the stream count, minutes at 10,000. The descriptor count is the same on every path.

use std::process::Command;

const STREAMS: u64 = 10_000;
const UNITS: u64 = 2;
const SOFT: u64 = 4096;
/// A UDP socket per stream, the one shared source, and the engine's and the process's own
/// (rings, eventfds, pipes, stdio, the receiver's pipe): a margin.
const NEED: u64 = STREAMS + 512;

#[test]
fn periodic_10000_streams_of_one_file_fit_a_soft_nofile_of_4096() {
    let hard = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .maximum
        .unwrap_or(u64::MAX);
    if !penstock_testreq::require_that(
        "hard RLIMIT_NOFILE for 10000 streams",
        (hard < NEED)
            .then(|| format!("{hard} is below the {NEED} descriptors {STREAMS} streams need")),
    ) {
        return;
    }
    let hard_arg = if hard == u64::MAX {
        "unlimited".to_string()
    } else {
        hard.to_string()
    };
    if !penstock_testreq::require("prlimit") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("periodic.json");
    let started = std::time::Instant::now();
    let out = Command::new("prlimit")
        .arg(format!("--nofile={SOFT}:{hard_arg}"))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_penstock"))
        .args(["bench", "periodic", "--streams", &STREAMS.to_string()])
        .args(["--senders", "penstock", "--loads", "none", "--path", "copy"])
        .args(["--period", "1s", "--duration", &format!("{UNITS}s")])
        .arg("--json")
        .arg(&json)
        .env("PENSTOCK_LOG", "penstock_driver=info")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "bench periodic, {STREAMS} streams: {:.1} s\n{stderr}",
        started.elapsed().as_secs_f64()
    );
    assert!(out.status.success(), "bench periodic failed: {stderr}");
    assert!(
        !stderr.contains("FAILED") && !stderr.contains("Too many open files"),
        "{stderr}"
    );
    // The raise is said at info level, from the soft limit the process started with.
    let ceiling = hard.min(
        std::fs::read_to_string("/proc/sys/fs/nr_open")
            .map(|s| s.trim().parse().unwrap())
            .unwrap_or(u64::MAX),
    );
    assert!(
        stderr.contains(&format!(
            "RLIMIT_NOFILE soft raised from {SOFT} to {ceiling}"
        )),
        "{stderr}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{v}");
    let row = &rows[0];
    assert_eq!(row["streams"], STREAMS, "{row}");
    // Every unit of every stream was sent by the engine ...
    assert_eq!(row["units"], STREAMS * UNITS, "{row}");
    // ... and received: per source, sequence numbers 0 and 1, each once.
    assert_eq!(row["expected"], STREAMS * UNITS, "{row}");
    assert_eq!(row["received"], STREAMS * UNITS, "{row}");
    assert_eq!(row["lost"], 0, "{row}");
    // One source descriptor for all the streams of the file.
    assert_eq!(row["source_files"], 1, "{row}");
}
