//! HLS segments leave by sendfile, checked where it happens: `penstock serve` runs under
//! strace, a player's requests (the playlist, then every segment as a range of the file) are
//! made, and the system calls the server made are added up. The segments' bytes must have
//! gone out through sendfile; what went through write/writev/sendto/sendmsg (copied from the
//! server's memory) must be the heads and the playlist, nothing of the segments.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::zerocopy::{Tally, stop_traced, traced};
use common::{serve_addresses, start_line};

/// Whether `tool` is here; a missing tool fails under PENSTOCK_TEST_REQUIRE=all or CI
/// (`.ci/run` installs them), says SKIPPED and is counted elsewhere.
fn needs(tool: &str, _arg: &str) -> bool {
    penstock_testreq::require(tool)
}

/// One GET with `Connection: close`: the status and the body.
fn get(addr: &str, path: &str, range: Option<(u64, u64)>) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let range = range.map_or(String::new(), |(at, len)| {
        format!("Range: bytes={at}-{}\r\n", at + len - 1)
    });
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n{range}Connection: close\r\n\r\n").as_bytes(),
    )
    .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let head_end = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head")
        + 4;
    let status = String::from_utf8_lossy(&out[9..12]).parse().unwrap();
    (status, out[head_end..].to_vec())
}

/// `penstock serve` of `www` under strace (into `trace`), HTTP only on loopback, no access
/// log, no self-calibration: the child and its HTTP address.
fn serve_traced(dir: &Path, www: &Path, trace: &Path) -> (std::process::Child, String) {
    let conf = dir.join("penstock.toml");
    std::fs::write(
        &conf,
        "[rtsp]\nlisten = \"\"\n[http]\nlisten = \"127.0.0.1:0\"\n[control]\nlisten = \"\"\n\
         [log]\naccess = \"off\"\n[admission]\nself_calibrate = false\n",
    )
    .unwrap();
    let mut child = traced(trace, env!("CARGO_BIN_EXE_penstock"))
        .args(["serve", "--no-control-unix", "--config"])
        .arg(&conf)
        .arg("--root")
        .arg(www)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let line = start_line(&mut child);
    let (http, _) = serve_addresses(&line);
    (child, http)
}

#[test]
fn hls_segments_leave_by_sendfile_not_through_user_space() {
    if !needs("ffmpeg", "-version") || !needs("strace", "-V") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    let clip = www.join("clip.ts");
    let o = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y"])
        .args(["-f", "lavfi", "-i", "testsrc=size=320x240:rate=25"])
        .args([
            "-t",
            "13",
            "-c:v",
            "libx264",
            "-preset",
            "ultrafast",
            "-g",
            "50",
        ])
        .args(["-keyint_min", "50", "-sc_threshold", "0", "-f", "mpegts"])
        .arg(&clip)
        .output()
        .expect("ffmpeg");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let file = std::fs::read(&clip).unwrap();
    let trace_path = dir.path().join("trace");
    let (mut child, http) = serve_traced(dir.path(), &www, &trace_path);

    // A player: the playlist, then every segment (and the map) as a range of the file.
    let (status, playlist) = get(&http, "/clip.ts/index.m3u8", None);
    assert_eq!(status, 200);
    let playlist = String::from_utf8(playlist).unwrap();
    let mut ranges = Vec::new();
    for l in playlist.lines() {
        let r = l.strip_prefix("#EXT-X-BYTERANGE:").or_else(|| {
            l.strip_prefix("#EXT-X-MAP:URI=\"../clip.ts\",BYTERANGE=\"")
                .and_then(|r| r.strip_suffix('"'))
        });
        if let Some((len, at)) = r.and_then(|r| r.split_once('@')) {
            ranges.push((at.parse::<u64>().unwrap(), len.parse::<u64>().unwrap()));
        }
    }
    assert!(ranges.len() >= 3, "{playlist}");
    let mut segment_bytes = 0;
    for &(at, len) in &ranges {
        let (status, body) = get(&http, "/clip.ts", Some((at, len)));
        assert_eq!(status, 206);
        assert_eq!(body, file[at as usize..(at + len) as usize]);
        segment_bytes += len;
    }
    stop_traced(&mut child);

    let tally = Tally::read(&trace_path);
    let zero_copy = tally.zero_copy_to_sockets();
    // What the write family sent to sockets went through the server's memory: heads and the
    // playlist only. The read family on the clip is the index thread's one pass over the
    // file (key frames for the playlist), at most the file once: a segment read to be sent
    // would add its length, and its write would show above.
    let copied = tally.written_to_sockets();
    let indexed = tally.read_from_file(&clip);
    println!(
        "segments {segment_bytes} B; sendfile/splice to sockets {zero_copy} B; written to sockets {copied} B, read from the clip {indexed} B (playlist {} B)\n{tally}",
        playlist.len()
    );
    assert!(
        indexed <= file.len() as u64,
        "{indexed} B read from a {} B clip:\n{tally}",
        file.len()
    );
    assert!(zero_copy >= segment_bytes, "{zero_copy} < {segment_bytes}");
    // Heads (~250 B each), the playlist, the start line and a few eventfd writes: not one
    // segment's worth.
    let smallest = ranges.iter().map(|r| r.1).min().unwrap();
    assert!(
        copied < playlist.len() as u64 + 2048 * (ranges.len() as u64 + 2),
        "{copied} B copied out of user space"
    );
    assert!(copied < smallest.max(4096) * 2, "{copied} vs {smallest}");
}

/// The `moof` + `mdat` header length of a media segment (`moof`'s size, plus 8 or 16).
fn fmp4_header_len(seg: &[u8]) -> u64 {
    assert_eq!(&seg[4..8], b"moof");
    let moof = u64::from(u32::from_be_bytes(seg[0..4].try_into().unwrap()));
    let m = moof as usize;
    assert_eq!(&seg[m + 4..m + 8], b"mdat");
    moof + if seg[m..m + 4] == [0, 0, 0, 1] { 16 } else { 8 }
}

#[test]
fn mp4_segments_send_their_samples_by_sendfile_and_only_headers_from_memory() {
    if !needs("ffmpeg", "-version") || !needs("strace", "-V") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    // A 2 Mbit/s H.264 + 128 kbit/s AAC MP4, moov at the end.
    let o = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y"])
        .args(["-f", "lavfi", "-i", "testsrc2=size=640x360:rate=25"])
        .args(["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000"])
        .args(["-t", "13", "-c:v", "libx264", "-preset", "ultrafast"])
        .args(["-b:v", "2M", "-maxrate", "2M", "-bufsize", "4M", "-g", "50"])
        .args(["-keyint_min", "50", "-sc_threshold", "0"])
        .args(["-c:a", "aac", "-b:a", "128k"])
        .arg(www.join("movie.mp4"))
        .output()
        .expect("ffmpeg");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let trace_path = dir.path().join("trace");
    let (mut child, http) = serve_traced(dir.path(), &www, &trace_path);

    // A player: the multivariant playlist, each media playlist, init and every segment.
    let mut made_in_memory = 0u64; // playlists and init segments
    let (status, master) = get(&http, "/movie.mp4/index.m3u8", None);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&master));
    made_in_memory += master.len() as u64;
    let mut requests = 1u64;
    let (mut payload, mut headers, mut segments) = (0u64, 0u64, 0u64);
    let medias: Vec<String> = String::from_utf8(master)
        .unwrap()
        .lines()
        // The I-frame playlist's segments are key frames only: a player plays the renditions.
        .filter(|l| !l.starts_with("#EXT-X-I-FRAME-STREAM-INF"))
        .filter_map(|l| match l.split_once("URI=\"") {
            Some((_, r)) => r.split('"').next().map(str::to_string),
            None => (!l.starts_with('#') && !l.is_empty()).then(|| l.to_string()),
        })
        .collect();
    assert_eq!(medias, ["track-2.m3u8", "track-1.m3u8"]);
    for media in medias {
        let (status, playlist) = get(&http, &format!("/movie.mp4/{media}"), None);
        assert_eq!(status, 200, "{media}");
        made_in_memory += playlist.len() as u64;
        requests += 1;
        for l in String::from_utf8(playlist).unwrap().lines() {
            let uri = l
                .strip_prefix("#EXT-X-MAP:URI=\"")
                .map(|r| r.trim_end_matches('"'))
                .or_else(|| (!l.starts_with('#') && !l.is_empty()).then_some(l));
            let Some(uri) = uri else { continue };
            let (status, body) = get(&http, &format!("/movie.mp4/{uri}"), None);
            assert_eq!(status, 200, "{uri}");
            requests += 1;
            if uri.ends_with("init.mp4") {
                made_in_memory += body.len() as u64;
            } else {
                let h = fmp4_header_len(&body);
                headers += h;
                payload += body.len() as u64 - h;
                segments += 1;
            }
        }
    }
    stop_traced(&mut child);

    let tally = Tally::read(&trace_path);
    let zero_copy = tally.zero_copy_to_sockets();
    let zero_copy_calls = tally.zero_copy_calls_to_sockets();
    let copied = tally.written_to_sockets();
    println!(
        "{segments} segments: payload {payload} B, moof+mdat headers {headers} B ({:.3} %); \
         sendfile/splice {zero_copy} B in {zero_copy_calls} calls to sockets; write family \
         {copied} B (playlists and inits {made_in_memory} B, {requests} requests)",
        headers as f64 * 100.0 / payload as f64
    );
    assert!(segments >= 6);
    // A segment's samples are about one byte range per frame (ffmpeg interleaves audio and
    // video frame by frame): gathered through a pipe (send.rs), the socket is written a few
    // times per segment, not once per range (a sendfile each was ~50 calls per 2 s segment).
    assert!(
        zero_copy_calls <= 8 * segments,
        "{zero_copy_calls} calls to sockets for {segments} segments: the ranges were not gathered"
    );
    // Every sample byte left by sendfile.
    assert!(zero_copy >= payload, "{zero_copy} < {payload}");
    // The generated headers are at most 2 % of the payload.
    assert!(
        headers * 50 <= payload,
        "{headers} header bytes for {payload}"
    );
    // What left from memory: those headers, the playlists and inits, the HTTP heads
    // (< 512 B each) and the start line: nothing of the samples.
    assert!(
        copied <= headers + made_in_memory + 512 * requests + 4096,
        "{copied} B copied out of user space"
    );
}
