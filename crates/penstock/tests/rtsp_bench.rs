//! `penstock bench rtsp` at a tiny size (1 and 2 sessions, a few seconds each), as a user
//! runs it, against each server: the built binary (`penstock serve`), GStreamer's RTSP server
//! through python3-gi, ffmpeg's clip,
//! real loopback sockets.
//!
//! What is asserted is behaviour, never a time of this machine: every session reached PLAY,
//! packets arrived, none was lost at N = 1, the packets received up to the server's last RTCP
//! sender report are the packets it says it sent, and the payload bytes are the file's bytes
//! over the media time played. The lateness bound is set out of reach (`--lateness-max 1h`)
//! so that a loaded machine fails no step on timing.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_penstock");

/// The benches of this file one at a time: each is a timing measurement, and a sibling's
/// encode or server on the same CPUs would be noise in it.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs the bench for `servers` on `media` (`ts`, `mp4`); `None` (SKIPPED said) when the
/// machine lacks one.
fn bench(servers: &str, media: &str, dir: &Path) -> Option<Value> {
    // The bench makes its clip with ffmpeg and ffprobe.
    if !penstock_testreq::require_all(&["ffmpeg", "ffprobe"]) {
        return None;
    }
    let json = dir.join("rtsp.json");
    let o = Command::new(BIN)
        .args(["bench", "rtsp", "--servers", servers, "--media", media])
        .args(["--start", "1", "--max-sessions", "2", "--bisect", "0"])
        // Sessions of about 4 s: both servers send their first RTCP SR after half their 5 s
        // interval.
        .args(["--duration", "4s", "--clip", "10s", "--stagger", "300ms"])
        .args(["--lateness-max", "1h", "--dir"])
        .arg(dir.join("clip"))
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run penstock bench rtsp");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    if !penstock_testreq::require_that(
        &format!("RTSP server {servers} for the bench of {media}"),
        ((o.status.code() == Some(2) && stderr.contains("no server to measure"))
            || stdout.contains(": skipped: "))
        .then(|| stdout.trim().to_string()),
    ) {
        return None;
    }
    assert!(o.status.success(), "bench failed: {stdout}\n{stderr}");
    eprintln!("{stdout}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    Some(v)
}

fn check(v: &Value, name: &str) {
    let servers = v["servers"].as_array().expect("servers");
    assert_eq!(servers.len(), 1, "{v}");
    check_server(v, &servers[0], name, 1);
}

/// One server's steps: `flows` RTP sessions per RTSP session (TS 1; MP4 2, video and audio).
fn check_server(v: &Value, s: &Value, name: &str, flows: u64) {
    assert_eq!(s["server"], name);
    let steps = s["steps"].as_array().expect("steps");
    // With the lateness bound out of reach, N = 1 is clean and the ramp goes on to 2.
    assert_eq!(steps.len(), 2, "{v:#}");
    for (i, st) in steps.iter().enumerate() {
        let n = i as u64 + 1;
        assert_eq!(st["sessions"], n, "{st:#}");
        assert_eq!(st["error"], Value::Null, "{st:#}");
        assert_eq!(st["playing"], n, "{st:#}");
        // 8.5 Mbit/s in 1328-byte RTP packets is ~800 a second: a few seconds give thousands.
        assert!(st["packets"].as_u64().unwrap() > 1000 * n, "{st:#}");
        // The bytes received are the file's over the media time played (CBR clip), within
        // a few packets; the MP4's video is capped, not constant (its rate varies from
        // second to second), and its file carries the moov.
        let ratio = st["bytes_ratio"].as_f64().unwrap();
        let within = if flows == 1 { 0.98..=1.02 } else { 0.85..=1.2 };
        assert!(within.contains(&ratio), "bytes ratio {ratio}: {st:#}");
        // Each session's last sender report counts exactly the packets received up to it.
        assert_eq!(st["sr_match"], st["sessions_with_sr"], "{st:#}");
        // The server was measured: thousands of packets over seconds cost it some CPU (a
        // figure of 0 would be a measurement that did not happen; null is NaN, refused).
        let cpu = st["server_cpu_per_session"]
            .as_f64()
            .expect("a measured CPU share");
        let cpu_s = st["server_cpu_s"].as_f64().expect("a measured CPU time");
        assert!(cpu > 0.0 && cpu_s > 0.0, "server CPU not measured: {st:#}");
    }
    let one = &steps[0];
    assert_eq!(one["lost"], 0, "loss at N = 1: {one:#}");
    assert_eq!(one["clean"], true, "{one:#}");
    assert_eq!(
        one["sessions_with_sr"], flows,
        "an RTP session without an RTCP SR in the run: {one:#}"
    );
    // RFC 3550 jitter from real arrivals: measured (never exactly 0 over thousands of
    // packets), the mean no more than the largest.
    let (mean, max) = (
        one["jitter_ms_mean"].as_f64().expect("a jitter mean"),
        one["jitter_ms_max"].as_f64().expect("a jitter max"),
    );
    assert!(
        mean > 0.0 && max >= mean,
        "jitter mean {mean} max {max}: {one:#}"
    );
    assert!(s["largest_clean"].as_u64().unwrap() >= 1, "{v:#}");
}

#[test]
fn bench_rtsp_against_gstreamer_counts_every_packet_sent() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let Some(v) = bench("gstreamer", "ts", dir.path()) else {
        return;
    };
    check(&v, "GStreamer");
}

#[test]
fn bench_rtsp_against_penstock_counts_every_packet_sent() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let Some(v) = bench("penstock", "ts", dir.path()) else {
        return;
    };
    check(&v, "penstock");
}

/// `--media mp4` (issue 36's `bench mp4`): both servers on one H.264 + AAC MP4, each RTSP
/// session two RTP sessions (video, then audio, each on its own clock), counted the same way.
#[test]
fn bench_rtsp_of_an_mp4_counts_every_packet_of_both_tracks_on_both_servers() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let Some(v) = bench("penstock,gstreamer", "mp4", dir.path()) else {
        return;
    };
    assert_eq!(v["media"], "mp4");
    let servers = v["servers"].as_array().expect("servers");
    assert_eq!(servers.len(), 2, "{v}");
    check_server(&v, &servers[0], "penstock", 2);
    check_server(&v, &servers[1], "GStreamer", 2);
}
