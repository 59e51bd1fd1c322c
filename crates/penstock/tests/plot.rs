//! `penstock plot` end to end: the binary on generated traces.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const HEADER: &str = "stream,seq,scheduled_ns,completed_ns,lateness_ns,bytes";
/// 30 units a second, as in Roadrunner's Figure 2.
const PERIOD_NS: u64 = 33_333_334;

/// A trace of `units` units per stream on `streams` streams at 30/s, lateness from `lateness`.
fn write_trace(
    path: &Path,
    streams: u64,
    units: u64,
    lateness: impl Fn(u64, u64) -> i64,
) -> PathBuf {
    let mut text = String::from(HEADER);
    text.push('\n');
    for seq in 0..units {
        for stream in 0..streams {
            let scheduled = 1_000_000_000 + seq * PERIOD_NS;
            let l = lateness(stream, seq);
            let completed = scheduled.checked_add_signed(l).unwrap();
            text.push_str(&format!(
                "{stream},{seq},{scheduled},{completed},{l},1024\n"
            ));
        }
    }
    std::fs::write(path, text).unwrap();
    path.to_path_buf()
}

/// Two traces: an engine with tight lateness (two streams) and a sleep loop with the
/// saw-tooth that Roadrunner's BSD trace shows, and a miss every 500 units.
fn two_traces(dir: &Path) -> (PathBuf, PathBuf) {
    let engine = write_trace(&dir.join("engine.csv"), 2, 3_000, |stream, seq| {
        40_000 + ((seq * 7_919 + stream * 13) % 30_000) as i64
    });
    let usleep = write_trace(&dir.join("usleep-loop.csv"), 1, 3_000, |_, seq| {
        let saw = ((seq % 97) * 150_000) as i64;
        if seq % 500 == 499 {
            45_000_000
        } else {
            2_000_000 + saw
        }
    });
    (engine, usleep)
}

fn plot(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_penstock"))
        .arg("plot")
        .args(args)
        .output()
        .expect("run penstock")
}

fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "exit {:?}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn plot_two_traces_to_png() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_traces(dir.path());
    let png = dir.path().join("compare.png");
    let out = plot(&[a.as_os_str(), b.as_os_str(), "-o".as_ref(), png.as_os_str()]);
    assert_ok(&out);
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "a PNG signature");
    assert!(bytes.len() > 20_000, "a PNG of {} bytes", bytes.len());
    // The IHDR chunk: width and height as asked (the defaults).
    assert_eq!(&bytes[16..24], &[0, 0, 5, 0, 0, 0, 3, 192]);
}

#[test]
fn plot_two_traces_to_svg_with_labels_and_log_axes() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_traces(dir.path());
    let svg = dir.path().join("compare.svg");
    let out = plot(&[
        a.as_os_str(),
        b.as_os_str(),
        "--label".as_ref(),
        "penstock EDF".as_ref(),
        "--log".as_ref(),
        "-o".as_ref(),
        svg.as_os_str(),
    ]);
    assert_ok(&out);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg"), "{}", &text[..100.min(text.len())]);
    assert!(text.len() > 20_000, "an SVG of {} bytes", text.len());
    // The first trace is labelled as asked, the second by its file stem.
    assert!(
        text.contains("penstock EDF: 6000 units, 2 streams"),
        "legend of trace 1"
    );
    assert!(
        text.contains("usleep-loop: 3000 units, 1 stream"),
        "legend of trace 2"
    );
    // One period (33.3 ms) is the default miss threshold: the usleep trace misses every 500th.
    assert!(
        text.contains("misses (&gt; one period, 33.3 ms): 6")
            || text.contains("misses (> one period, 33.3 ms): 6"),
        "miss count of trace 2"
    );
    assert!(text.contains("lateness (µs, log)"), "axis description");
    assert!(text.contains("sequence number"), "axis description");
}

#[test]
fn plot_one_stream_with_a_miss_threshold() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = two_traces(dir.path());
    let svg = dir.path().join("one.svg");
    let out = plot(&[
        a.as_os_str(),
        "--stream".as_ref(),
        "1".as_ref(),
        "--miss-after".as_ref(),
        "60us".as_ref(),
        "-o".as_ref(),
        svg.as_os_str(),
    ]);
    assert_ok(&out);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.contains("engine: 3000 units, 1 stream"),
        "only stream 1"
    );
    assert!(text.contains("60.0 µs"), "the threshold given");

    let out = plot(&[
        a.as_os_str(),
        "--stream".as_ref(),
        "7".as_ref(),
        "-o".as_ref(),
        svg.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no units of stream 7"));
}

#[test]
fn malformed_trace_fails_naming_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.csv");
    std::fs::write(
        &bad,
        format!("{HEADER}\n0,0,100,150,50,1024\n0,1,200,x,50,1024\n"),
    )
    .unwrap();
    let png = dir.path().join("out.png");
    let out = plot(&[bad.as_os_str(), "-o".as_ref(), png.as_os_str()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bad.csv:3:"), "{stderr}");
    assert!(stderr.contains("completed_ns"), "{stderr}");
    assert!(!png.exists(), "no image from a bad trace");

    // Not a trace at all: the header is checked.
    std::fs::write(&bad, "a,b,c\n1,2,3\n").unwrap();
    let out = plot(&[bad.as_os_str(), "-o".as_ref(), png.as_os_str()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad.csv:1:"));

    // A missing file and a wrong output extension are errors too.
    let out = plot(&[
        dir.path().join("nope.csv").as_os_str(),
        "-o".as_ref(),
        png.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope.csv"));
    let jpg = dir.path().join("out.jpg");
    let out = plot(&[bad.as_os_str(), "-o".as_ref(), jpg.as_os_str()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains(".png or .svg"));
}
