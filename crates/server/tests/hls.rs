//! HLS cut from a TS file's own key frames: `GET /clip.ts/index.m3u8` answers a playlist whose
//! segments are byte ranges of clip.ts, checked against RFC 8216's rules here and played by
//! ffmpeg, whose packets must be the source's, each identical.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

/// Whether ffmpeg is here (penstock_testreq: a failure under PENSTOCK_TEST_REQUIRE=all, or
/// CI; `.ci/run` installs it, and a suite that skips quietly would hide that it did not).
fn have_ffmpeg() -> bool {
    penstock_testreq::require("ffmpeg")
}

/// 13 s of H.264 (key frame every 2 s, as `-g 50` at 25 fps) and AAC in TS, as a
/// camera or an encoder writes them.
fn h264_clip(path: &Path) {
    let o = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y"])
        .args(["-f", "lavfi", "-i", "testsrc=size=320x240:rate=25"])
        .args(["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000"])
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
        .args(["-keyint_min", "50", "-sc_threshold", "0", "-c:a", "aac"])
        .args(["-f", "mpegts"])
        .arg(path)
        .output()
        .expect("ffmpeg");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// `ffmpeg -c copy -f framemd5` of `input`: one line per packet (stream, dts, pts, duration,
/// size, md5), the header comments left out.
fn packets(input: &str) -> Vec<String> {
    let o = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-i", input])
        .args(["-map", "0", "-c", "copy", "-f", "framemd5", "-"])
        .output()
        .expect("ffmpeg");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

fn get(f: &Fixture, path: &str) -> (u16, String, Vec<u8>) {
    let mut r = agent().get(f.url(path)).call().unwrap();
    let ty = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (r.status().as_u16(), ty, r.body_mut().read_to_vec().unwrap())
}

#[test]
fn a_ts_file_plays_as_hls_from_byte_ranges_of_itself() {
    if !have_ffmpeg() {
        return;
    }
    let f = start();
    let clip = f.path("clip.ts");
    h264_clip(&clip);
    let file = std::fs::read(&clip).unwrap();

    let (status, ty, body) = get(&f, "/clip.ts/index.m3u8");
    assert_eq!(status, 200);
    assert_eq!(ty, "application/vnd.apple.mpegurl");
    let playlist = String::from_utf8(body).unwrap();
    println!("{playlist}");

    // RFC 8216's rules, as the checker applies them (`common::check_media_playlist`).
    let (ranged, map) = check_media_playlist(
        &playlist,
        file.len() as u64,
        "../clip.ts",
        Some(0),
        file.len() as u64,
    );
    // ffmpeg's muxer repeats the PAT and PMT before every video key frame: each segment
    // starts at them and carries its own PSI, so the playlist has no EXT-X-MAP (which
    // GStreamer's hlsdemux could not typefind: docs/hls.md).
    assert_eq!(
        map, None,
        "segments that carry their PSI need no map: {playlist}"
    );
    let pid = |p: &[u8]| (u16::from(p[1] & 0x1f) << 8) | u16::from(p[2]);
    let mut total = 0.0;
    let mut n = 0;
    for r in &ranged {
        total += r.secs;
        let (at, end) = (r.offset, r.offset + r.len);
        // Every segment starts with the PAT and the PMT, and its first packet of the video
        // stream (PID 0x100, ffmpeg's) is a key frame: a PES start whose adaptation field
        // says random access.
        let seg = &file[at as usize..end as usize];
        let first = &seg[..188];
        if n > 0 {
            assert_eq!(
                (first[0], pid(first)),
                (0x47, 0),
                "segment {n}: no PAT first"
            );
        }
        let pmt = seg
            .chunks(188)
            .position(|p| p[1] & 0x40 != 0 && p[4] == 0 && p[5] == 0x02)
            .unwrap_or_else(|| panic!("segment {n}: no PMT"));
        let video = seg
            .chunks(188)
            .position(|p| pid(p) == 0x100)
            .unwrap_or_else(|| panic!("segment {n}: no video"));
        assert!(pmt < video, "segment {n}: the PMT after the video");
        let p = &seg[video * 188..video * 188 + 188];
        assert!(p[1] & 0x40 != 0, "segment {n} does not begin a PES");
        assert!(
            p[3] & 0x20 != 0 && p[5] & 0x40 != 0,
            "segment {n}: no key frame"
        );
        n += 1;
    }
    // 13 s in 6 s segments cut at 2 s key frames: 6, 6, 1.
    assert_eq!(n, 3, "{playlist}");
    assert!((total - 13.0).abs() < 0.05, "{total}");

    // A player: ffmpeg's packets through the playlist are the file's, in order, identical.
    let through_hls = packets(&f.url("/clip.ts/index.m3u8"));
    let direct = packets(clip.to_str().unwrap());
    assert!(direct.len() > 300, "{}", direct.len());
    assert_eq!(through_hls, direct);

    // Cached: the same playlist again; a changed file gets a new one.
    assert_eq!(get(&f, "/clip.ts/index.m3u8").2, playlist.as_bytes());
    let o = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y", "-i"])
        .arg(&clip)
        .args(["-t", "7", "-c", "copy", "-f", "mpegts"])
        .arg(f.path("short.ts"))
        .output()
        .unwrap();
    assert!(o.status.success());
    std::fs::rename(f.path("short.ts"), &clip).unwrap();
    let again = String::from_utf8(get(&f, "/clip.ts/index.m3u8").2).unwrap();
    assert_ne!(again, playlist);
    assert_eq!(again.matches("#EXTINF:").count(), 2, "{again}");
}

#[test]
fn what_is_not_a_playable_ts_file_gets_no_playlist() {
    let f = start();
    // Not TS: 415, and the server goes on serving.
    std::fs::write(f.path("fake.ts"), pattern(100_000, 9)).unwrap();
    assert_eq!(get(&f, "/fake.ts/index.m3u8").0, 415);
    // TS without video: 415.
    let psi_only: Vec<u8> = penstock_core::ts::synth::psi_packets(0x100).concat();
    std::fs::write(f.path("empty.ts"), psi_only).unwrap();
    assert_eq!(get(&f, "/empty.ts/index.m3u8").0, 415);
    // Not a .ts name, missing files, directories: the ordinary answers.
    assert_eq!(get(&f, "/small.txt/index.m3u8").0, 404);
    assert_eq!(get(&f, "/none.ts/index.m3u8").0, 404);
    std::fs::create_dir(f.path("d.ts")).unwrap();
    std::fs::write(f.path("d.ts/index.m3u8"), b"#EXTM3U\n").unwrap();
    let (status, _, body) = get(&f, "/d.ts/index.m3u8");
    assert_eq!((status, body.as_slice()), (200, b"#EXTM3U\n".as_slice()));
    assert_eq!(get(&f, "/small.txt").0, 200);
}

/// The browser player (`penstock_testreq::require_browser_player`).
fn player_dir() -> Option<std::path::PathBuf> {
    penstock_testreq::require_browser_player()
}

/// hls.js in Chromium (`tests/player/play.mjs ARGS`) on the page penstock serves from the
/// fixture's root, playing `src`: its last line (JSON, checked to say `"ok":true`) and the
/// screenshot's path.
fn play(
    f: &Fixture,
    player: &Path,
    src: &str,
    args: &[&str],
    tag: &str,
) -> (String, std::path::PathBuf) {
    let (line, shot, err) = play_page(f, player, src, args, tag, None);
    assert!(line.contains("\"ok\":true"), "{line}\n{err}");
    (line, shot)
}

/// [`play`] without the check: the player's last line, the screenshot's path, its stderr.
fn play_page(
    f: &Fixture,
    player: &Path,
    src: &str,
    args: &[&str],
    tag: &str,
    cross_origin_url: Option<&str>,
) -> (String, std::path::PathBuf, String) {
    std::fs::copy(player.join("index.html"), f.path("player.html")).unwrap();
    std::fs::copy(
        player.join("node_modules/hls.js/dist/hls.min.js"),
        f.path("hls.min.js"),
    )
    .unwrap();
    let (line, err, shot) = penstock_testreq::run_browser_player(
        player,
        "play.mjs",
        &f.url(&format!("/player.html?src={src}")),
        args,
        &[("CROSS_ORIGIN_URL", cross_origin_url.unwrap_or_default())],
        tag,
    );
    (line, shot, err)
}

#[test]
fn hls_js_in_chromium_plays_the_playlist_and_a_seek() {
    if !have_ffmpeg() {
        return;
    }
    let Some(player) = player_dir() else {
        return;
    };
    let f = start();
    h264_clip(&f.path("clip.ts"));
    // Past the first segment: the second and third begin without PAT/PMT of their own.
    let (line, shot) = play(&f, &player, "/clip.ts/index.m3u8", &["8"], "hls");
    assert!(line.contains("\"width\":320"), "{line}");
    let t: f64 = line
        .split("\"currentTime\":")
        .nth(1)
        .and_then(|r| r.split([',', '}']).next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(t > 9.0, "{line}");
    assert!(std::fs::metadata(&shot).is_ok_and(|m| m.len() > 0));
}

#[test]
fn hls_js_in_chromium_plays_an_mp4_packaged_on_the_fly_and_a_seek() {
    if !have_ffmpeg() {
        return;
    }
    let Some(player) = player_dir() else {
        return;
    };
    let f = start();
    // H.264 + AAC, moov at the end: video and audio as separate renditions (the audio an
    // EXT-X-MEDIA group), fMP4 segments of the file's own samples.
    let o = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y"])
        .args(["-f", "lavfi", "-i", "testsrc=size=320x240:rate=25"])
        .args(["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000"])
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
        .args(["-keyint_min", "50", "-sc_threshold", "0", "-c:a", "aac"])
        .arg(f.path("movie.mp4"))
        .output()
        .expect("ffmpeg");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (line, shot) = play(&f, &player, "/movie.mp4/index.m3u8", &["8"], "hls-mp4");
    assert!(line.contains("\"width\":320"), "{line}");
    let t: f64 = line
        .split("\"currentTime\":")
        .nth(1)
        .and_then(|r| r.split([',', '}']).next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(t > 9.0, "{line}");
    assert!(std::fs::metadata(&shot).is_ok_and(|m| m.len() > 0));
}

#[test]
fn shaka_player_in_chromium_plays_an_mp4s_dash_manifest_and_a_seek() {
    if !have_ffmpeg() {
        return;
    }
    let Some(player) = player_dir() else {
        return;
    };
    let shaka = player.join("node_modules/shaka-player/dist/shaka-player.compiled.js");
    if !penstock_testreq::require_that(
        "shaka-player",
        (!shaka.is_file()).then(|| "`npm ci --prefix crates/server/tests/player`".to_string()),
    ) {
        return;
    }
    let f = start();
    let o = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y"])
        .args(["-f", "lavfi", "-i", "testsrc=size=320x240:rate=25"])
        .args(["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000"])
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
        .args(["-keyint_min", "50", "-sc_threshold", "0", "-c:a", "aac"])
        .args(["-movflags", "+faststart"])
        .arg(f.path("movie.mp4"))
        .output()
        .expect("ffmpeg");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::copy(player.join("shaka.html"), f.path("shaka.html")).unwrap();
    std::fs::copy(&shaka, f.path("shaka-player.compiled.js")).unwrap();
    let shot = std::env::temp_dir().join(format!("penstock-dash-{}.png", std::process::id()));
    let o = Command::new("node")
        .arg(player.join("play.mjs"))
        .arg(f.url("/shaka.html?src=/movie.mp4/manifest.mpd"))
        .arg("8")
        .env("SCREENSHOT", &shot)
        .output()
        .expect("node");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    println!("{out}\n{err}\nscreenshot: {}", shot.display());
    let line = out.lines().last().unwrap_or_default();
    assert!(line.contains("\"ok\":true"), "{line}\n{err}");
    assert!(line.contains("\"width\":320"), "{line}");
    let t: f64 = line
        .split("\"currentTime\":")
        .nth(1)
        .and_then(|r| r.split([',', '}']).next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(t > 9.0, "{line}");
}

/// The `currentTime` a player's JSON line reports.
fn current_time(line: &str) -> f64 {
    line.split("\"currentTime\":")
        .nth(1)
        .and_then(|r| r.split([',', '}']).next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{line}"))
}

/// A CMAF file (`ffmpeg -f mp4 -movflags +cmaf`: H.264 + AAC in each fragment) played from
/// byte ranges of itself: hls.js its `index.m3u8` (the init section as `EXT-X-MAP`), and
/// shaka-player its `manifest.mpd` (a `SegmentList` of `mediaRange`s), each past 5 s, then a
/// seek to 8 s that plays on, with no error.
#[test]
fn hls_js_and_shaka_play_a_cmaf_file_from_byte_ranges_of_itself() {
    if !have_ffmpeg() {
        return;
    }
    let Some(player) = player_dir() else {
        return;
    };
    let f = start();
    let o = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y"])
        .args(["-f", "lavfi", "-i", "testsrc=size=320x240:rate=25"])
        .args(["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000"])
        .args(["-t", "13", "-c:v", "libx264", "-preset", "ultrafast"])
        .args([
            "-g",
            "50",
            "-keyint_min",
            "50",
            "-sc_threshold",
            "0",
            "-c:a",
            "aac",
        ])
        .args(["-f", "mp4", "-movflags", "+cmaf"])
        .arg(f.path("cmaf.mp4"))
        .output()
        .expect("ffmpeg");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (line, shot) = play(&f, &player, "/cmaf.mp4/index.m3u8", &["8"], "hls-cmaf");
    assert!(line.contains("\"width\":320"), "{line}");
    assert!(current_time(&line) > 9.0, "{line}");
    assert!(std::fs::metadata(&shot).is_ok_and(|m| m.len() > 0));

    let shaka = player.join("node_modules/shaka-player/dist/shaka-player.compiled.js");
    if !penstock_testreq::require_that(
        "shaka-player",
        (!shaka.is_file()).then(|| "`npm ci --prefix crates/server/tests/player`".to_string()),
    ) {
        return;
    }
    std::fs::copy(player.join("shaka.html"), f.path("shaka.html")).unwrap();
    std::fs::copy(&shaka, f.path("shaka-player.compiled.js")).unwrap();
    let (line, err, shot) = penstock_testreq::run_browser_player(
        &player,
        "play.mjs",
        &f.url("/shaka.html?src=/cmaf.mp4/manifest.mpd"),
        &["8"],
        &[],
        "dash-cmaf",
    );
    assert!(line.contains("\"ok\":true"), "{line}\n{err}");
    assert!(line.contains("\"width\":320"), "{line}");
    assert!(current_time(&line) > 9.0, "{line}");
    assert!(std::fs::metadata(&shot).is_ok_and(|m| m.len() > 0));
}

/// `n` TS null packets (PID 0x1FFF): stuffing, as a constant-bitrate mux writes it. The
/// indexer reads them as any other packet.
fn null_packets(n: usize) -> Vec<u8> {
    let mut p = [0xFFu8; 188];
    p[..4].copy_from_slice(&[0x47, 0x1F, 0xFF, 0x10]);
    p.repeat(n)
}

/// A GET with `Connection: close` on a fresh connection, not read yet.
fn send_get(f: &Fixture, path: &str) -> std::net::TcpStream {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(f.http).unwrap();
    // A bound on a hung server, not a measure of anything.
    s.set_read_timeout(Some(std::time::Duration::from_secs(300)))
        .unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    s
}

/// The whole response (the server closes after it), non-UTF-8 bytes replaced.
fn read_all(mut s: std::net::TcpStream) -> String {
    use std::io::Read;
    let mut v = Vec::new();
    s.read_to_end(&mut v).unwrap();
    String::from_utf8_lossy(&v).into_owned()
}

/// Whether a byte of the response has arrived (without waiting or taking it).
fn has_answer(s: &std::net::TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let r = s.peek(&mut [0u8; 1]);
    s.set_nonblocking(false).unwrap();
    match r {
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(e) => panic!("{e}"),
    }
}

/// Whether this process (the server runs in it) has `path` open: the server is indexing it.
fn open_here(path: &Path) -> bool {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| std::fs::read_link(e.path()).is_ok_and(|l| l == path))
}

fn body_of(resp: &str) -> &str {
    resp.split_once("\r\n\r\n").map_or("", |(_, b)| b)
}

/// The key-frame index of a large title is built by a thread, not by the HTTP worker: with one
/// worker, `/small.txt` is answered while the worker's own playlist request waits for its
/// index. Requests for the file being indexed share its build (with `indexers_max = 1`, a
/// second build would be a 503), and another file's playlist meanwhile is a 503 with
/// `Retry-After`.
///
/// Not a race the test can lose by being slow: the order is taken from events, never from
/// a clock. The small request is sent only once the server has big.ts open (it has read the
/// playlist request: a worker that indexed on its loop would answer nothing else until the
/// playlist), and "the playlist not answered yet" is read off its socket after the small
/// answer came. Where a build ends before the checks (the 256 MiB read faster than a
/// loopback GET: never seen, but not impossible), that attempt proves nothing either way and
/// the next one indexes a new version of the file (a new mtime), five at most.
#[test]
fn the_index_is_built_off_the_loop_once_per_file_within_indexers_max() {
    if !have_ffmpeg() {
        return;
    }
    let mut c = config();
    c.http.workers = 1;
    c.hls.indexers_max = 1;
    let f = start_with(c);
    let clip_path = f.path("clip.ts");
    h264_clip(&clip_path);
    let clip = std::fs::read(&clip_path).unwrap();
    let big = f.path("big.ts");
    {
        use std::io::Write;
        let mut w = std::io::BufWriter::new(std::fs::File::create(&big).unwrap());
        w.write_all(&clip).unwrap();
        let stuffing = null_packets(1 << 14); // 3 MiB
        for _ in 0..(256 << 20) / stuffing.len() {
            w.write_all(&stuffing).unwrap();
        }
        w.flush().unwrap();
    }
    std::fs::write(f.path("other.ts"), &clip).unwrap();
    let big2 = f.path("big2.ts");
    std::fs::copy(&big, &big2).unwrap();
    let (mut proven_free, mut proven_busy) = (false, false);
    for attempt in 0..5u64 {
        if attempt > 0 {
            // New versions of both files: not cached any more.
            let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000 + attempt);
            for name in ["big.ts", "other.ts"] {
                let file = std::fs::File::options()
                    .write(true)
                    .open(f.path(name))
                    .unwrap();
                file.set_modified(t).unwrap();
            }
        }
        let a = send_get(&f, "/big.ts/index.m3u8");
        // Until the server has read the request: big.ts open (or already answered).
        let hung = std::time::Instant::now() + std::time::Duration::from_secs(300);
        while !open_here(&big) && !has_answer(&a) {
            assert!(
                std::time::Instant::now() < hung,
                "the request was never read"
            );
            std::thread::yield_now();
        }
        let small = read_all(send_get(&f, "/small.txt"));
        assert!(small.starts_with("HTTP/1.1 200 "), "{small}");
        assert!(small.contains("\r\nContent-Length: 1000\r\n"), "{small}");
        let free = !has_answer(&a);
        let same: Vec<_> = (0..3).map(|_| send_get(&f, "/big.ts/index.m3u8")).collect();
        let other = read_all(send_get(&f, "/other.ts/index.m3u8"));
        let a = read_all(a);
        assert!(a.starts_with("HTTP/1.1 200 "), "{a}");
        let playlist = body_of(&a);
        assert!(playlist.starts_with("#EXTM3U\n"), "{playlist}");
        assert!(playlist.contains("#EXT-X-ENDLIST"), "{playlist}");
        for s in same {
            let r = read_all(s);
            assert!(r.starts_with("HTTP/1.1 200 "), "{r}");
            assert_eq!(body_of(&r), playlist);
        }
        if other.starts_with("HTTP/1.1 503 ") {
            let head = other.split_once("\r\n\r\n").unwrap().0;
            assert!(head.contains("\r\nRetry-After: 1"), "{other}");
            assert!(head.contains("\r\nConnection: close"), "{other}");
            proven_busy = true;
        } else {
            // The build had ended (the playlist was answered or about to be).
            assert!(other.starts_with("HTTP/1.1 200 "), "{other}");
        }
        // big.ts's build has ended (its answer came): other.ts is indexed now.
        let again = read_all(send_get(&f, "/other.ts/index.m3u8"));
        assert!(again.starts_with("HTTP/1.1 200 "), "{again}");
        // And big.ts's playlist is the cached one.
        assert_eq!(
            body_of(&read_all(send_get(&f, "/big.ts/index.m3u8"))),
            playlist
        );
        proven_free |= free;
        println!(
            "attempt {attempt}: loop free {free}, other file {}",
            &other[9..12]
        );
        if proven_free && proven_busy {
            break;
        }
    }
    assert!(
        proven_free,
        "small.txt was never answered while big.ts was being indexed"
    );
    assert!(
        proven_busy,
        "no 503 for a second file while one was indexed"
    );
    let m = read_all(send_get(&f, "/metrics"));
    assert!(
        m.lines()
            .any(|l| l.contains("kind=\"hls_busy\"") && !l.ends_with(" 0")),
        "{m}"
    );

    // A client that leaves while its index is built: the build goes on and is kept. Proof
    // that it was kept: big.ts's playlist is a 200 while big2.ts's build holds the one
    // indexer (a new build of big.ts would be a 503). Conclusive when big2.ts was still
    // being indexed after that answer came; else the next attempt, with new versions.
    let mut proven_kept = false;
    for attempt in 0..5u64 {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(2_000_000 + attempt);
        for name in ["big.ts", "big2.ts"] {
            let file = std::fs::File::options()
                .write(true)
                .open(f.path(name))
                .unwrap();
            file.set_modified(t).unwrap();
        }
        let hung = std::time::Instant::now() + std::time::Duration::from_secs(300);
        let a = send_get(&f, "/big.ts/index.m3u8");
        while !open_here(&big) && !has_answer(&a) {
            assert!(
                std::time::Instant::now() < hung,
                "the request was never read"
            );
            std::thread::yield_now();
        }
        drop(a);
        // The build ends (its thread closes the file) with no one to answer.
        while open_here(&big) {
            assert!(std::time::Instant::now() < hung, "the build never ended");
            std::thread::yield_now();
        }
        let b = send_get(&f, "/big2.ts/index.m3u8");
        while !open_here(&big2) && !has_answer(&b) {
            assert!(
                std::time::Instant::now() < hung,
                "the request was never read"
            );
            std::thread::yield_now();
        }
        let r = read_all(send_get(&f, "/big.ts/index.m3u8"));
        assert!(r.starts_with("HTTP/1.1 200 "), "{r}");
        let kept = !has_answer(&b);
        let b = read_all(b);
        assert!(b.starts_with("HTTP/1.1 200 "), "{b}");
        assert_eq!(body_of(&b), body_of(&r).replace("../big.ts", "../big2.ts"));
        println!("gone client, attempt {attempt}: conclusive {kept}");
        if kept {
            proven_kept = true;
            break;
        }
    }
    assert!(proven_kept, "big2.ts's build always ended first");
}

/// One rendition: 20 s of H.264 at `size` and about `kbit` kbit/s (yuv420p, `-preset
/// ultrafast`: Constrained Baseline), a key frame every 2 s in both renditions, and AAC LC.
fn rendition(path: &Path, size: &str, kbit: u32) {
    let o = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y"])
        .args(["-f", "lavfi", "-i", &format!("testsrc=size={size}:rate=25")])
        .args(["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000"])
        .args(["-t", "20", "-c:v", "libx264", "-preset", "ultrafast"])
        .args(["-pix_fmt", "yuv420p", "-b:v", &format!("{kbit}k")])
        .args([
            "-maxrate",
            &format!("{kbit}k"),
            "-bufsize",
            &format!("{kbit}k"),
        ])
        .args(["-g", "50", "-keyint_min", "50", "-sc_threshold", "0"])
        .args(["-c:a", "aac", "-b:a", "64k", "-f", "mpegts"])
        .arg(path)
        .output()
        .expect("ffmpeg");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// What ffprobe says of `path`'s streams: one map of `key=value` per stream.
fn ffprobe_streams(path: &Path) -> Vec<std::collections::HashMap<String, String>> {
    let o = Command::new("ffprobe")
        .args(["-v", "error", "-show_entries"])
        .args([
            "stream=codec_name,profile,level,width,height",
            "-of",
            "default=nw=0",
        ])
        .arg(path)
        .output()
        .expect("ffprobe");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout)
        .unwrap()
        .split("[/STREAM]")
        .filter(|s| s.contains("codec_name="))
        .map(|s| {
            s.lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

/// The `CODECS` that ffprobe's description of `path` implies: `avc1.` with its profile's
/// profile_idc and its level (the constraint byte is not in ffprobe's output, so it is left
/// as `..`), `mp4a.40.2` for AAC LC.
fn codecs_per_ffprobe(path: &Path) -> (String, String, (u32, u32)) {
    let streams = ffprobe_streams(path);
    let v = streams.iter().find(|s| s["codec_name"] == "h264").unwrap();
    let a = streams.iter().find(|s| s["codec_name"] == "aac").unwrap();
    let idc = match v["profile"].as_str() {
        "Baseline" | "Constrained Baseline" => 66,
        "Main" => 77,
        "High" => 100,
        p => panic!("profile {p}"),
    };
    let level: u8 = v["level"].parse().unwrap();
    assert_eq!(a["profile"], "LC");
    (
        format!("avc1.{idc:02x}..{level:02x}"),
        "mp4a.40.2".to_string(),
        (v["width"].parse().unwrap(), v["height"].parse().unwrap()),
    )
}

/// One `EXT-X-STREAM-INF` of a multivariant playlist: its attributes and its URI.
#[derive(Debug)]
struct StreamInf {
    bandwidth: u64,
    average: u64,
    codecs: Option<String>,
    resolution: Option<(u32, u32)>,
    uri: String,
}

fn stream_infs(master: &str) -> Vec<StreamInf> {
    let lines: Vec<&str> = master.lines().collect();
    assert_eq!(lines[0], "#EXTM3U");
    lines
        .windows(2)
        .filter_map(|w| Some((w[0].strip_prefix("#EXT-X-STREAM-INF:")?, w[1])))
        .map(|(attrs, uri)| {
            // Attributes split at commas outside quotes.
            let mut fields = Vec::new();
            let (mut cur, mut quoted) = (String::new(), false);
            for c in attrs.chars() {
                match c {
                    '"' => quoted = !quoted,
                    ',' if !quoted => fields.push(std::mem::take(&mut cur)),
                    c => cur.push(c),
                }
            }
            fields.push(cur);
            let get = |k: &str| {
                fields
                    .iter()
                    .find_map(|f| f.strip_prefix(&format!("{k}=")).map(str::to_string))
            };
            StreamInf {
                bandwidth: get("BANDWIDTH").unwrap().parse().unwrap(),
                average: get("AVERAGE-BANDWIDTH").unwrap().parse().unwrap(),
                codecs: get("CODECS"),
                resolution: get("RESOLUTION").map(|r| {
                    let (w, h) = r.split_once('x').unwrap();
                    (w.parse().unwrap(), h.parse().unwrap())
                }),
                uri: uri.to_string(),
            }
        })
        .collect()
}

/// `movie/`: high.ts (640x360, ~800 kbit/s) and low.ts (320x180, ~300 kbit/s), beside a
/// hidden copy, a text file and garbage named `.ts` that the playlist leaves out.
fn title_dir(f: &Fixture) -> std::path::PathBuf {
    let dir = f.path("movie");
    std::fs::create_dir(&dir).unwrap();
    rendition(&dir.join("high.ts"), "640x360", 800);
    rendition(&dir.join("low.ts"), "320x180", 300);
    std::fs::copy(dir.join("low.ts"), dir.join(".hidden.ts")).unwrap();
    std::fs::write(dir.join("notes.txt"), b"not a rendition").unwrap();
    std::fs::write(dir.join("junk.ts"), pattern(50_000, 5)).unwrap();
    dir
}

#[test]
fn a_directory_of_renditions_gets_a_multivariant_playlist_measured_from_the_files() {
    if !have_ffmpeg() {
        return;
    }
    let f = start();
    let dir = title_dir(&f);

    let (status, ty, body) = get(&f, "/movie/master.m3u8");
    assert_eq!(status, 200);
    assert_eq!(ty, "application/vnd.apple.mpegurl");
    let master = String::from_utf8(body).unwrap();
    println!("{master}");
    let infs = stream_infs(&master);
    // Sorted by bandwidth: low first. The hidden copy, the text and the garbage are not listed.
    let uris: Vec<&str> = infs.iter().map(|i| i.uri.as_str()).collect();
    assert_eq!(
        uris,
        ["low.ts/index.m3u8", "high.ts/index.m3u8"],
        "{master}"
    );
    assert!(infs[0].bandwidth <= infs[1].bandwidth);
    for (inf, name) in infs.iter().zip(["low.ts", "high.ts"]) {
        let path = dir.join(name);
        let (video, audio, size) = codecs_per_ffprobe(&path);
        assert_eq!(inf.resolution, Some(size), "{name}");
        let codecs = inf.codecs.as_deref().unwrap_or_else(|| panic!("{master}"));
        let (v, a) = codecs.split_once(',').unwrap();
        // avc1.PPCCLL: profile and level as ffprobe has them.
        assert_eq!(
            (&v[..7], &v[9..]),
            (&video[..7], &video[9..]),
            "{codecs} vs {video}"
        );
        assert_eq!(v.len(), 11);
        assert_eq!(a, audio);
        // Peak over average; the average is the file's bits over its 20 s (within 5%: the
        // last frame's duration and the audio's tail).
        assert!(inf.bandwidth >= inf.average, "{inf:?}");
        let file_bps = std::fs::metadata(&path).unwrap().len() as f64 * 8.0 / 20.0;
        assert!(
            (inf.average as f64 - file_bps).abs() < file_bps * 0.05,
            "{inf:?} vs {file_bps}"
        );
        // Each URI is the media playlist penstock already answers.
        assert_eq!(get(&f, &format!("/movie/{}", inf.uri)).0, 200);
        // And its I-frame playlist is announced, with the video codec and the size.
        let iframes = format!(
            "#EXT-X-I-FRAME-STREAM-INF:BANDWIDTH=\\d+,CODECS=\"{v}\",RESOLUTION={}x{},URI=\"{name}/iframes.m3u8\"",
            size.0, size.1
        );
        assert!(
            master.lines().any(|l| regex_like(l, &iframes)),
            "{iframes}\n{master}"
        );
        let (status, _, body) = get(&f, &format!("/movie/{name}/iframes.m3u8"));
        assert_eq!(status, 200);
        assert!(
            String::from_utf8(body)
                .unwrap()
                .contains("#EXT-X-I-FRAMES-ONLY\n")
        );
    }
    // ~300 and ~800 kbit/s of video, + 64 kbit/s AAC and the TS overhead.
    assert!(
        infs[0].average > 250_000 && infs[0].average < 600_000,
        "{master}"
    );
    assert!(
        infs[1].average > 600_000 && infs[1].average < 1_300_000,
        "{master}"
    );

    // ffmpeg plays the multivariant playlist: the higher variant's packets are high.ts's.
    let o = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-i"])
        .arg(f.url("/movie/master.m3u8"))
        .args(["-map", "0:p:1", "-c", "copy", "-f", "framemd5", "-"])
        .output()
        .expect("ffmpeg");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let through_master: Vec<String> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(str::to_string)
        .collect();
    assert_eq!(
        through_master,
        packets(dir.join("high.ts").to_str().unwrap())
    );

    // A real master.m3u8 is served as it is.
    std::fs::create_dir(f.path("own")).unwrap();
    std::fs::copy(dir.join("low.ts"), f.path("own/a.ts")).unwrap();
    std::fs::write(f.path("own/master.m3u8"), b"#EXTM3U\n# mine\n").unwrap();
    assert_eq!(get(&f, "/own/master.m3u8").2, b"#EXTM3U\n# mine\n");
    // No playable TS file: 404; not a directory: 404; the server goes on.
    std::fs::create_dir(f.path("none")).unwrap();
    std::fs::write(f.path("none/junk.ts"), pattern(10_000, 6)).unwrap();
    std::fs::copy(dir.join("low.ts"), f.path("none/.hidden.ts")).unwrap();
    assert_eq!(get(&f, "/none/master.m3u8").0, 404);
    assert_eq!(get(&f, "/dir/master.m3u8").0, 404);
    assert_eq!(get(&f, "/small.txt/master.m3u8").0, 404);
    assert_eq!(get(&f, "/nowhere/master.m3u8").0, 404);
    assert_eq!(get(&f, "/movie/master.m3u8").2, master.as_bytes());
}

#[test]
fn a_multivariant_playlist_lists_at_most_renditions_max_files() {
    if !have_ffmpeg() {
        return;
    }
    let mut cfg = config();
    cfg.hls.renditions_max = 1;
    let f = start_with(cfg);
    title_dir(&f);
    // The first by name: high.ts (junk.ts and low.ts come after it).
    let infs = stream_infs(&String::from_utf8(get(&f, "/movie/master.m3u8").2).unwrap());
    let uris: Vec<&str> = infs.iter().map(|i| i.uri.as_str()).collect();
    assert_eq!(uris, ["high.ts/index.m3u8"]);
}

#[test]
fn hls_js_in_chromium_plays_the_multivariant_playlist_and_a_level_switch() {
    if !have_ffmpeg() {
        return;
    }
    let Some(player) = player_dir() else {
        return;
    };
    let f = start();
    title_dir(&f);
    let (line, shot) = play(
        &f,
        &player,
        "/movie/master.m3u8",
        &["-", "switch"],
        "hls-master",
    );
    assert!(line.contains("\"levels\":[\"320x180@"), "{line}");
    assert!(line.contains("\"640x360@"), "{line}");
    let field = |k: &str| -> f64 {
        line.rsplit(&format!("\"{k}\":"))
            .next()
            .and_then(|r| r.split([',', '}']).next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{k}: {line}"))
    };
    // Ended on the level it was forced to, showing that level's pictures, played on 4 s past
    // the switch.
    let (to, level, at) = (field("to"), field("level"), field("at"));
    assert_eq!(level, to, "{line}");
    let width = field("width");
    assert_eq!(width, if to == 0.0 { 320.0 } else { 640.0 }, "{line}");
    assert!(field("currentTime") > at + 4.0, "{line}");
    assert!(std::fs::metadata(&shot).is_ok_and(|m| m.len() > 0));
}

#[test]
fn an_h265_rendition_is_listed_with_its_size_and_codecs() {
    if !have_ffmpeg() {
        return;
    }
    let f = start();
    std::fs::create_dir(f.path("hevc")).unwrap();
    let path = f.path("hevc/main.ts");
    let o = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y"])
        .args(["-f", "lavfi", "-i", "testsrc=size=320x180:rate=25"])
        .args(["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000"])
        .args([
            "-t",
            "4",
            "-pix_fmt",
            "yuv420p",
            "-c:v",
            "libx265",
            "-preset",
            "ultrafast",
        ])
        .args(["-x265-params", "log-level=none:keyint=50:min-keyint=50"])
        .args(["-c:a", "aac", "-f", "mpegts"])
        .arg(&path)
        .output()
        .expect("ffmpeg");
    // An ffmpeg built without libx265 cannot.
    if !penstock_testreq::require_that(
        "ffmpeg with libx265",
        (!o.status.success()).then(|| String::from_utf8_lossy(&o.stderr).into_owned()),
    ) {
        return;
    }
    let master = String::from_utf8(get(&f, "/hevc/master.m3u8").2).unwrap();
    println!("{master}");
    let infs = stream_infs(&master);
    assert_eq!(infs.len(), 1, "{master}");
    let streams = ffprobe_streams(&path);
    let v = streams.iter().find(|s| s["codec_name"] == "hevc").unwrap();
    assert_eq!(v["profile"], "Main");
    assert_eq!(infs[0].resolution, Some((320, 180)));
    // hvc1, general_profile_idc 1 (Main), tier L and level_idc as ffprobe reports it.
    let codecs = infs[0]
        .codecs
        .as_deref()
        .unwrap_or_else(|| panic!("{master}"));
    let (video, audio) = codecs.split_once(',').unwrap();
    assert!(video.starts_with("hvc1.1."), "{codecs}");
    assert_eq!(
        video.split('.').nth(3),
        Some(format!("L{}", v["level"]).as_str()),
        "{codecs} vs {v:?}"
    );
    assert_eq!(audio, "mp4a.40.2");
}

/// The head of the answer to `METHOD path` with `headers` (one request, then the server
/// closes): its status and its header lines.
fn ask(f: &Fixture, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n");
    for (n, v) in headers {
        req += &format!("{n}: {v}\r\n");
    }
    req += "\r\n";
    let resp = raw(f.http, req.as_bytes());
    let text = String::from_utf8_lossy(&resp);
    let head = text
        .split("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_string();
    (status_of(&resp), head)
}

/// The value of header `name` in `head` (`None`: absent).
fn field<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

const PLAYER_ORIGIN: &str = "https://player.example";
const EXPOSED: &str = "Content-Range, Content-Length, Accept-Ranges, ETag";

fn location(prefix: &str, origins: &[&str]) -> penstock_server::config::Location {
    penstock_server::config::Location {
        prefix: prefix.into(),
        class: None,
        limit_rate_bytes_per_s: None,
        limit_rate_after_bytes: None,
        cors_allow_origins: origins.iter().map(|o| o.to_string()).collect(),
        ..Default::default()
    }
}

/// Issue 32, item 5: delivery like a CDN origin. Each response of a location with
/// `cors_allow_origins` says so (the listed origin echoed with `Vary: Origin`, or `*`; the
/// range headers exposed; no `Access-Control-Allow-Origin` for another origin): playlists
/// (the first one answered after its index build), segments (ranges), 304s and 404s; `OPTIONS`
/// is its preflight; the media types are a player's; playlists and media files carry the
/// configured `Cache-Control` and an `ETag`; a location without CORS has none of it and
/// answers `OPTIONS` 405; the metrics count playlists and segments.
#[test]
fn cors_caching_and_types_per_location_on_every_response() {
    if !have_ffmpeg() {
        return;
    }
    let mut cfg = config();
    cfg.location.push(location("/", &[PLAYER_ORIGIN]));
    cfg.location.push(location("/open/", &["*"]));
    cfg.location.push(location("/plain/", &[]));
    cfg.hls.cache_max_age_s = 600;
    let f = start_with(cfg);
    h264_clip(&f.path("clip.ts"));
    for d in ["open", "plain"] {
        std::fs::create_dir(f.path(d)).unwrap();
        std::fs::copy(f.path("clip.ts"), f.path(&format!("{d}/clip.ts"))).unwrap();
    }
    let allowed = [("Origin", PLAYER_ORIGIN)];
    let cors_ok = |head: &str, what: &str| {
        assert_eq!(
            field(head, "Access-Control-Allow-Origin"),
            Some(PLAYER_ORIGIN),
            "{what}: {head}"
        );
        assert_eq!(field(head, "Vary"), Some("Origin"), "{what}: {head}");
        assert_eq!(
            field(head, "Access-Control-Expose-Headers"),
            Some(EXPOSED),
            "{what}: {head}"
        );
    };

    // The first playlist request waits for the index build: its head gets the lines too.
    let (st, head) = ask(&f, "GET", "/clip.ts/index.m3u8", &allowed);
    assert_eq!(st, 200, "{head}");
    assert_eq!(
        field(&head, "Content-Type"),
        Some("application/vnd.apple.mpegurl")
    );
    assert_eq!(
        field(&head, "Cache-Control"),
        Some("public, max-age=600"),
        "{head}"
    );
    cors_ok(&head, "playlist after its build");
    let etag = field(&head, "ETag").expect("a playlist ETag").to_string();
    // Cached now: the same.
    let (_, again) = ask(&f, "GET", "/clip.ts/index.m3u8", &allowed);
    cors_ok(&again, "cached playlist");
    assert_eq!(field(&again, "ETag"), Some(etag.as_str()));
    let (st, nm) = ask(
        &f,
        "GET",
        "/clip.ts/index.m3u8",
        &[("Origin", PLAYER_ORIGIN), ("If-None-Match", &etag)],
    );
    assert_eq!(st, 304, "{nm}");
    cors_ok(&nm, "304");
    assert_eq!(
        field(&nm, "Cache-Control"),
        Some("public, max-age=600"),
        "{nm}"
    );

    // A segment: a range of the TS file.
    let (st, seg) = ask(
        &f,
        "GET",
        "/clip.ts",
        &[("Origin", PLAYER_ORIGIN), ("Range", "bytes=0-1879")],
    );
    assert_eq!(st, 206, "{seg}");
    assert_eq!(field(&seg, "Content-Type"), Some("video/mp2t"));
    assert!(field(&seg, "Content-Range").is_some_and(|v| v.starts_with("bytes 0-1879/")));
    assert_eq!(field(&seg, "Cache-Control"), Some("public, max-age=600"));
    assert!(field(&seg, "ETag").is_some());
    cors_ok(&seg, "segment");
    // Another origin: no Access-Control-Allow-Origin (the browser refuses the script), and
    // Vary, so that a shared cache does not hand the allowed answer to it.
    let (st, evil) = ask(
        &f,
        "GET",
        "/clip.ts",
        &[("Origin", "https://evil.example"), ("Range", "bytes=0-187")],
    );
    assert_eq!(st, 206);
    assert_eq!(field(&evil, "Access-Control-Allow-Origin"), None, "{evil}");
    assert_eq!(field(&evil, "Vary"), Some("Origin"));
    // Errors carry the lines too (a player must be able to read a 404).
    let (st, nf) = ask(&f, "GET", "/nothing.ts", &allowed);
    assert_eq!(st, 404);
    cors_ok(&nf, "404");
    assert_eq!(field(&nf, "Cache-Control"), None, "{nf}");

    // The preflight.
    let (st, pf) = ask(
        &f,
        "OPTIONS",
        "/clip.ts",
        &[
            ("Origin", PLAYER_ORIGIN),
            ("Access-Control-Request-Method", "GET"),
            ("Access-Control-Request-Headers", "range"),
        ],
    );
    assert_eq!(st, 204, "{pf}");
    assert_eq!(
        field(&pf, "Access-Control-Allow-Origin"),
        Some(PLAYER_ORIGIN),
        "{pf}"
    );
    assert_eq!(
        field(&pf, "Access-Control-Allow-Methods"),
        Some("GET, HEAD")
    );
    assert_eq!(field(&pf, "Access-Control-Allow-Headers"), Some("Range"));
    assert!(field(&pf, "Access-Control-Max-Age").is_some_and(|v| v.parse::<u64>().is_ok()));
    assert_eq!(
        field(&pf, "Content-Length"),
        None,
        "a 204 has no body: {pf}"
    );
    let (st, pf_evil) = ask(
        &f,
        "OPTIONS",
        "/clip.ts",
        &[
            ("Origin", "https://evil.example"),
            ("Access-Control-Request-Method", "GET"),
        ],
    );
    assert_eq!(st, 204);
    assert_eq!(
        field(&pf_evil, "Access-Control-Allow-Origin"),
        None,
        "{pf_evil}"
    );
    assert_eq!(
        field(&pf_evil, "Access-Control-Allow-Methods"),
        None,
        "{pf_evil}"
    );

    // `*`: any origin, not echoed.
    let (st, open) = ask(
        &f,
        "GET",
        "/open/clip.ts/index.m3u8",
        &[("Origin", "https://any.example")],
    );
    assert_eq!(st, 200, "{open}");
    assert_eq!(
        field(&open, "Access-Control-Allow-Origin"),
        Some("*"),
        "{open}"
    );
    assert_eq!(field(&open, "Access-Control-Expose-Headers"), Some(EXPOSED));
    // No CORS: nothing, and OPTIONS is not served.
    let (st, plain) = ask(
        &f,
        "GET",
        "/plain/clip.ts",
        &[("Origin", PLAYER_ORIGIN), ("Range", "bytes=0-187")],
    );
    assert_eq!(st, 206);
    assert!(!plain.contains("Access-Control-"), "{plain}");
    assert_eq!(field(&plain, "Vary"), None);
    assert_eq!(field(&plain, "Cache-Control"), Some("public, max-age=600"));
    let (st, _) = ask(&f, "OPTIONS", "/plain/clip.ts", &allowed);
    assert_eq!(st, 405);
    // Not media: no Cache-Control.
    let (st, txt) = ask(&f, "GET", "/small.txt", &allowed);
    assert_eq!(st, 200);
    assert_eq!(field(&txt, "Cache-Control"), None, "{txt}");
    cors_ok(&txt, "a plain file");

    // Types of what players fetch.
    for (name, ty) in [
        ("a.m3u8", "application/vnd.apple.mpegurl"),
        ("a.ts", "video/mp2t"),
        ("a.mp4", "video/mp4"),
        ("a.m4s", "video/mp4"),
        ("a.mpd", "application/dash+xml"),
    ] {
        std::fs::write(f.path(name), b"0123456789").unwrap();
        let (st, h) = ask(&f, "HEAD", &format!("/{name}"), &[]);
        assert_eq!(
            (st, field(&h, "Content-Type")),
            (200, Some(ty)),
            "{name}: {h}"
        );
    }

    // The metrics: 4 media playlists asked (3 at /, 1 at /open/), 3 ranges of TS files (2
    // at /, 1 at /plain/: counted wherever they are).
    let m = String::from_utf8(get(&f, "/metrics").2).unwrap();
    let value = |series: &str| {
        m.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{m}"))
    };
    assert_eq!(
        value("penstock_hls_playlist_requests_total{kind=\"media\"}"),
        4.0
    );
    assert_eq!(
        value("penstock_hls_playlist_requests_total{kind=\"master\"}"),
        0.0
    );
    assert_eq!(value("penstock_hls_segment_requests_total"), 3.0);
}

/// A location's `cors_allow_origins` is checked at load: origins as browsers send them, or
/// `*` alone.
#[test]
fn cors_origins_are_checked_at_load() {
    for (origins, ok) in [
        (vec!["https://player.example"], true),
        (vec!["http://127.0.0.1:8080", "https://b.example"], true),
        (vec!["*"], true),
        (vec!["*", "https://a.example"], false),
        (vec!["player.example"], false),
        (vec!["https://player.example/"], false),
        (vec!["https://a.example/path"], false),
        (vec!["ftp://a.example"], false),
        (vec!["https://a b"], false),
    ] {
        let mut cfg = config();
        cfg.location.push(location("/", &origins));
        assert_eq!(cfg.check().is_ok(), ok, "{origins:?}: {:?}", cfg.check());
    }
}

/// A player page on one origin (a penstock on one port) plays the playlist of another (a
/// second penstock, its own port) in hls.js when the second's location allows the first's
/// origin; when it does not, hls.js reports an error (the browser refuses the playlist).
#[test]
fn hls_js_plays_across_origins_only_where_cors_allows_the_page() {
    if !have_ffmpeg() {
        return;
    }
    let Some(player) = player_dir() else {
        return;
    };
    // Origin A: the page.
    let page = start();
    let page_origin = format!("http://{}", page.http);
    // Origin B: the media, allowing A; origin C: the same media, allowing someone else.
    let log_dir = tempfile::tempdir().unwrap();
    let access = log_dir.path().join("access.log");
    let mut cfg = config();
    cfg.location.push(location("/", &[&page_origin]));
    cfg.log.access = access.to_str().unwrap().into();
    let media = start_with(cfg);
    let mut cfg = config();
    cfg.location
        .push(location("/", &["https://player.example"]));
    let refused = start_with(cfg);
    h264_clip(&media.path("clip.ts"));
    std::fs::copy(media.path("clip.ts"), refused.path("clip.ts")).unwrap();

    let src = media.url("/clip.ts/index.m3u8");
    let (line, shot, err) = play_page(
        &page,
        &player,
        &src,
        &["8"],
        "hls-cors",
        Some(&media.url("/clip.ts")),
    );
    assert!(line.contains("\"ok\":true"), "{line}\n{err}");
    assert!(line.contains("\"width\":320"), "{line}");
    // The page's script reads a range and the exposed headers; two ranges go through the
    // preflight.
    assert!(
        line.contains("\"single\":{\"status\":206,\"contentRange\":\"bytes 0-187/")
            && line.contains("\"bytes\":188")
            && !line.contains("\"etag\":null"),
        "{line}"
    );
    assert!(line.contains("\"preflighted\":{\"status\":206}"), "{line}");
    assert!(std::fs::metadata(&shot).is_ok_and(|m| m.len() > 0));
    // Segments were fetched cross-origin, as ranges of the file.
    let m = String::from_utf8(get(&media, "/metrics").2).unwrap();
    let segments: f64 = m
        .lines()
        .find_map(|l| {
            l.strip_prefix("penstock_hls_segment_requests_total")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap();
    assert!(segments >= 2.0, "{segments} segment requests");
    // The access log is written by a thread of its own: wait (bounded) for the preflight.
    let t0 = std::time::Instant::now();
    let preflights = loop {
        let log = std::fs::read_to_string(&access).unwrap_or_default();
        let n = log.lines().filter(|l| l.contains("\"OPTIONS ")).count();
        if n > 0 || t0.elapsed() > std::time::Duration::from_secs(10) {
            println!(
                "media server's access log: {} lines, {n} preflights",
                log.lines().count()
            );
            break n;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(
        preflights >= 1,
        "no OPTIONS in the media server's access log"
    );

    let (line, _, err) = play_page(
        &page,
        &player,
        &refused.url("/clip.ts/index.m3u8"),
        &[],
        "hls-cors-refused",
        None,
    );
    assert!(
        line.contains("\"ok\":false") && line.contains("networkError"),
        "hls.js must fail on a playlist its page's origin may not read: {line}\n{err}"
    );
}

/// Whether `line` matches `pattern`, where `\\d+` stands for one or more digits (the rest
/// literal).
fn regex_like(line: &str, pattern: &str) -> bool {
    let Some((head, tail)) = pattern.split_once("\\d+") else {
        return line == pattern;
    };
    let Some(rest) = line.strip_prefix(head) else {
        return false;
    };
    let digits = rest.chars().take_while(char::is_ascii_digit).count();
    digits > 0 && regex_like(&rest[digits..], tail)
}

/// The byte ranges (offset, length) and durations an HLS playlist names.
fn byte_ranges(playlist: &str) -> Vec<(u64, u64, f64)> {
    let lines: Vec<&str> = playlist.lines().collect();
    lines
        .windows(2)
        .filter_map(|w| {
            let secs: f64 = w[0]
                .strip_prefix("#EXTINF:")?
                .trim_end_matches(',')
                .parse()
                .ok()?;
            let (len, at) = w[1].strip_prefix("#EXT-X-BYTERANGE:")?.split_once('@')?;
            Some((at.parse().ok()?, len.parse().ok()?, secs))
        })
        .collect()
}

/// `EXT-X-I-FRAMES-ONLY` (issue 36 item 4): `PATH/iframes.m3u8` names every key frame of the
/// TS as a byte range of the file; each range, fetched as a player would (a range GET),
/// begins with the PAT and the PMT and its first video packet starts a PES whose adaptation
/// field says random access and whose bytes hold an IDR NAL unit; the ranges end where the
/// next picture begins; ffprobe reads the playlist and finds only key frames.
#[test]
fn an_i_frame_playlist_names_each_key_frame_as_a_byte_range() {
    if !have_ffmpeg() {
        return;
    }
    let f = start();
    let clip = f.path("clip.ts");
    h264_clip(&clip);
    let file = std::fs::read(&clip).unwrap();
    let (status, ty, body) = get(&f, "/clip.ts/iframes.m3u8");
    assert_eq!(status, 200);
    assert_eq!(ty, "application/vnd.apple.mpegurl");
    let playlist = String::from_utf8(body).unwrap();
    println!("{playlist}");
    assert!(playlist.contains("#EXT-X-I-FRAMES-ONLY\n"));
    assert!(playlist.ends_with("#EXT-X-ENDLIST\n"));
    assert!(!playlist.contains("#EXT-X-MAP"), "{playlist}");
    let target: f64 = playlist
        .lines()
        .find_map(|l| l.strip_prefix("#EXT-X-TARGETDURATION:"))
        .unwrap()
        .parse()
        .unwrap();
    let ranges = byte_ranges(&playlist);
    // 13 s, a key frame every 2 s: 0, 2, …, 12.
    assert_eq!(ranges.len(), 7, "{playlist}");
    let total: f64 = ranges.iter().map(|r| r.2).sum();
    assert!((total - 13.0).abs() < 0.05, "{total}");
    let pid = |p: &[u8]| (u16::from(p[1] & 0x1f) << 8) | u16::from(p[2]);
    let mut last_end = 0;
    for (n, &(at, len, secs)) in ranges.iter().enumerate() {
        assert!(secs.round() <= target);
        assert!(at >= last_end && at + len <= file.len() as u64, "{n}");
        last_end = at + len;
        let mut r = agent()
            .get(f.url("/clip.ts"))
            .header("Range", format!("bytes={at}-{}", at + len - 1))
            .call()
            .unwrap();
        assert_eq!(r.status().as_u16(), 206);
        let body = r.body_mut().read_to_vec().unwrap();
        assert_eq!(body, file[at as usize..(at + len) as usize]);
        assert_eq!(body.len() % 188, 0);
        let packets: Vec<&[u8]> = body.chunks(188).collect();
        assert_eq!(pid(packets[0]), 0, "I-frame {n}: no PAT first");
        assert!(
            packets[1][1] & 0x40 != 0 && packets[1][5] == 0x02,
            "I-frame {n}: no PMT"
        );
        let video: Vec<&&[u8]> = packets.iter().filter(|p| pid(p) == 0x100).collect();
        let first = video[0];
        assert!(
            first[1] & 0x40 != 0 && first[3] & 0x20 != 0 && first[5] & 0x40 != 0,
            "{n}"
        );
        // The picture's elementary stream (its PES, all in the range) holds an IDR slice
        // (NAL type 5; x264's first picture has its SEI before it).
        let mut es = Vec::new();
        for (i, p) in video.iter().enumerate() {
            let payload = if p[3] & 0x20 != 0 {
                &p[5 + usize::from(p[4])..]
            } else {
                &p[4..]
            };
            let payload = if i == 0 {
                &payload[9 + usize::from(payload[8])..]
            } else {
                payload
            };
            es.extend_from_slice(payload);
        }
        assert!(
            es.windows(4)
                .any(|w| w[..3] == [0, 0, 1] && w[3] & 0x1f == 5),
            "I-frame {n}: no IDR"
        );
        // One picture: no other video PES starts in the range, and the next byte after it
        // (if any) is the next picture's PES start.
        assert!(
            video[1..].iter().all(|p| p[1] & 0x40 == 0),
            "I-frame {n}: two pictures"
        );
        let next = &file[(at + len) as usize..];
        if let Some(p) = next.chunks(188).find(|p| pid(p) == 0x100) {
            assert!(p[1] & 0x40 != 0, "I-frame {n} ends inside its picture");
        }
    }
    // ffprobe reads the I-frame playlist: its video packets are the 7 key frames.
    let o = Command::new("ffprobe")
        .args(["-hide_banner", "-loglevel", "error", "-select_streams", "v"])
        .args(["-show_entries", "packet=flags", "-of", "csv=p=0"])
        .arg(f.url("/clip.ts/iframes.m3u8"))
        .output()
        .expect("ffprobe");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let flags = String::from_utf8(o.stdout).unwrap();
    // One line per packet (`K_,`), with blank lines between.
    let flags: Vec<&str> = flags.lines().filter(|l| !l.trim().is_empty()).collect();
    println!("ffprobe of the I-frame playlist: {flags:?}");
    assert_eq!(flags.len(), 7, "{flags:?}");
    assert!(flags.iter().all(|l| l.starts_with('K')), "{flags:?}");
    // Another file's name, or a non-TS: no I-frame playlist.
    assert_eq!(get(&f, "/small.txt/iframes.m3u8").0, 404);
}
