//! Live and DVR HLS of a recording live relay (issue 32 item 4; docs/hls.md "Live and DVR"):
//! `penstock serve` with `[rtsp.live.cam]` recording, fed over loopback UDP by ffmpeg (H.264
//! and AAC in TS, a key frame every second, at its own pace: `-re`), answers
//! `/live/cam/index.m3u8`. Checked: the playlist grows, its window slides with the media
//! sequence right (a segment keeps its number and range across reloads), every listed range
//! is served (`/live/cam/stream.ts` answers only synced bytes: a range past them is a 416) and
//! begins with the video PES of a key frame; `ffmpeg -i …/index.m3u8 -c copy` reads packets;
//! blocking reloads (`_HLS_msn`) wait for their segment, far ahead is a 400, one waiter too
//! many a 503; an unknown source 404, a relay that does not record 409; hls.js in headless
//! Chromium plays it (video only: see that test) with a latency (against `playingDate`) of at
//! most three target durations; and the relay's recording is byte-identical to `penstock record`'s of the same
//! datagrams (one ffmpeg, its `tee` muxer sending the same stream to both).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_penstock");
const TS: usize = 188;
/// `[hls] target_duration` in these tests: short, so that the tests are quick.
const TARGET_S: u64 = 2;

struct Served {
    child: Child,
    http: String,
    source: SocketAddr,
    record: PathBuf,
    dir: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let _ = self.child.wait();
    }
}

fn free_udp_port() -> SocketAddr {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn serve(hls_extra: &str) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let source = free_udp_port();
    let plain = free_udp_port();
    let record = dir.path().join("cam.ts");
    let conf = dir.path().join("penstock.toml");
    std::fs::create_dir(dir.path().join("root")).unwrap();
    std::fs::write(
        &conf,
        format!(
            "[http]\nlisten = \"127.0.0.1:0\"\n[control]\nlisten = \"\"\n[log]\naccess = \"off\"\n[hls]\ntarget_duration_ms = \"{TARGET_S}s\"\n{hls_extra}\n[rtsp]\nlisten = \"127.0.0.1:0\"\n[rtsp.live.cam]\nsource = \"udp-listen://{source}\"\nrecord = \"{}\"\n[rtsp.live.plain]\nsource = \"udp-listen://{plain}\"\n",
            record.display()
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.path().join("serve.log")).unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--no-control-unix", "--config"])
        .arg(&conf)
        .arg(dir.path().join("root"))
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let line = common::start_line(&mut child);
    let (http, _) = common::serve_addresses(&line);
    Served {
        child,
        http,
        source,
        record,
        dir,
    }
}

struct Reply {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

fn get(http: &str, path: &str, extra: &str) -> Reply {
    let mut s = TcpStream::connect(http).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n").as_bytes(),
    )
    .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let end = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head");
    let head = String::from_utf8_lossy(&out[..end]).into_owned();
    let status = head[9..12].parse().unwrap();
    Reply {
        status,
        head,
        body: out[end + 4..].to_vec(),
    }
}

/// ffmpeg encoding `seconds` of test picture and tone (H.264 with a key frame every 25 frames
/// = 1 s, AAC) in TS at its own pace (`-re`) to `outputs` (ffmpeg output URLs; two or more go
/// through the `tee` muxer: one encode, the same stream to each).
fn feed(seconds: u32, outputs: &[String]) -> Child {
    feed_with(seconds, outputs, true)
}

/// [`feed`], with or without the audio stream.
fn feed_with(seconds: u32, outputs: &[String], audio: bool) -> Child {
    let mut c = Command::new("ffmpeg");
    c.args(["-hide_banner", "-loglevel", "error", "-re", "-f", "lavfi"])
        .args(["-i", "testsrc=size=320x240:rate=25", "-f", "lavfi"])
        .args(["-i", "sine=frequency=440:sample_rate=48000", "-t"])
        .arg(seconds.to_string())
        .args(["-map", "0:v"])
        .args(if audio { &["-map", "1:a"][..] } else { &[][..] })
        .args(["-c:v", "libx264", "-preset", "ultrafast"])
        .args(["-tune", "zerolatency", "-g", "25", "-keyint_min", "25"])
        .args([
            "-sc_threshold",
            "0",
            "-b:v",
            "600k",
            "-c:a",
            "aac",
            "-b:a",
            "64k",
        ]);
    if outputs.len() == 1 {
        c.args(["-f", "mpegts"]).arg(&outputs[0]);
    } else {
        let slaves: Vec<String> = outputs.iter().map(|o| format!("[f=mpegts]{o}")).collect();
        c.args(["-f", "tee"]).arg(slaves.join("|"));
    }
    c.stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("ffmpeg")
}

fn udp_url(a: SocketAddr) -> String {
    format!("udp://{a}?pkt_size=1316")
}

fn have_tools() -> bool {
    penstock_testreq::require("ffmpeg")
}

/// One segment of a playlist: its media sequence number, range, duration and date.
#[derive(Debug, Clone, PartialEq)]
struct Seg {
    msn: u64,
    offset: u64,
    len: u64,
    duration_s: f64,
    date: Option<String>,
}

fn parse(p: &str) -> (u64, Vec<Seg>) {
    let seq: u64 = p
        .lines()
        .find_map(|l| l.strip_prefix("#EXT-X-MEDIA-SEQUENCE:"))
        .expect("EXT-X-MEDIA-SEQUENCE")
        .parse()
        .unwrap();
    let mut segs = Vec::new();
    let (mut dur, mut date) = (None, None);
    for l in p.lines() {
        if let Some(d) = l.strip_prefix("#EXTINF:") {
            dur = Some(d.trim_end_matches(',').parse::<f64>().unwrap());
        } else if let Some(d) = l.strip_prefix("#EXT-X-PROGRAM-DATE-TIME:") {
            date = Some(d.to_string());
        } else if let Some(r) = l.strip_prefix("#EXT-X-BYTERANGE:") {
            let (len, offset) = r.split_once('@').expect("LEN@OFFSET");
            segs.push(Seg {
                msn: seq + segs.len() as u64,
                offset: offset.parse().unwrap(),
                len: len.parse().unwrap(),
                duration_s: dur.take().expect("EXTINF before the range"),
                date: date.take(),
            });
        }
    }
    (seq, segs)
}

/// Whether the first TS packet of `bytes` starts the video PES (PID 0x100, ffmpeg's) of a key
/// frame: payload_unit_start, the random-access indicator, a PES start code with a PTS.
fn starts_with_key_frame(bytes: &[u8]) -> bool {
    let p = &bytes[..TS];
    let pid = (u16::from(p[1] & 0x1f) << 8) | u16::from(p[2]);
    let pusi = p[1] & 0x40 != 0;
    let has_af = p[3] & 0x20 != 0;
    let rai = has_af && p[4] > 0 && p[5] & 0x40 != 0;
    let pes = if has_af {
        &p[5 + usize::from(p[4])..]
    } else {
        &p[4..]
    };
    p[0] == 0x47
        && pid == 0x100
        && pusi
        && rai
        && pes.starts_with(&[0, 0, 1, 0xe0])
        && pes[7] & 0x80 != 0
}

/// Polls the playlist until `until` holds for it (a bounded wait, never a fixed sleep).
fn poll_playlist(s: &Served, deadline: Duration, until: impl Fn(u64, &[Seg]) -> bool) -> String {
    let t0 = Instant::now();
    loop {
        let r = get(&s.http, "/live/cam/index.m3u8", "");
        if r.status == 200 {
            let text = r.text();
            let (seq, segs) = parse(&text);
            if until(seq, &segs) {
                return text;
            }
        } else {
            assert_eq!(r.status, 503, "before the first segment: {}", r.head);
        }
        assert!(
            t0.elapsed() < deadline,
            "the live playlist never got there; last answer {} {}",
            r.head,
            r.text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn live_playlist_grows_slides_and_lists_only_synced_key_frame_ranges() {
    if !have_tools() {
        return;
    }
    let s = serve(
        "live_window = 3\nblocking_reload_waiters_max = 2\nblocking_reload_timeout_ms = \"20s\"",
    );
    // Bad input first: nothing of it changes the rest.
    let r = get(&s.http, "/live/nope/index.m3u8", "");
    assert_eq!(r.status, 404, "{}", r.head);
    let r = get(&s.http, "/live/plain/index.m3u8", "");
    assert_eq!(r.status, 409, "{}", r.head);
    assert!(r.text().contains("not recorded"), "{}", r.text());
    // ffmpeg's plain `udp://` output, as users type it: 1,472-byte datagrams that cut TS
    // packets anywhere. The relay puts them back into whole packets (core `ts::align`), or the
    // key-frame ranges below would never appear (before, every datagram was counted garbage).
    let mut ff = feed(60, &[format!("udp://{}", s.source)]);

    // Reloads until the window has slid twice; every segment seen keeps its number and range,
    // every range is served (only synced bytes are) and starts with a key frame's video PES.
    let mut seen: std::collections::BTreeMap<u64, Seg> = Default::default();
    let t0 = Instant::now();
    let last_playlist = loop {
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "the window never slid"
        );
        let r = get(&s.http, "/live/cam/index.m3u8", "");
        if r.status == 503 {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        assert_eq!(r.status, 200, "{}", r.head);
        assert_eq!(
            r.header("Content-Type"),
            Some("application/vnd.apple.mpegurl")
        );
        assert_eq!(r.header("Cache-Control"), Some("public, max-age=1"));
        let text = r.text();
        assert!(
            text.contains(&format!("#EXT-X-TARGETDURATION:{TARGET_S}\n")),
            "{text}"
        );
        assert!(
            text.contains("#EXT-X-MAP:URI=\"stream.ts\",BYTERANGE=\"376@"),
            "{text}"
        );
        assert!(
            !text.contains("EXT-X-ENDLIST") && !text.contains("PLAYLIST-TYPE"),
            "{text}"
        );
        let (seq, segs) = parse(&text);
        assert!(!segs.is_empty() && segs.len() <= 3, "{text}");
        for g in &segs {
            if let Some(before) = seen.get(&g.msn) {
                assert_eq!(before, g, "segment {} changed between reloads", g.msn);
            }
            assert!(g.date.is_some(), "no EXT-X-PROGRAM-DATE-TIME: {text}");
            assert!(g.duration_s <= TARGET_S as f64 + 0.5, "{text}");
            let r = get(
                &s.http,
                "/live/cam/stream.ts",
                &format!("Range: bytes={}-{}\r\n", g.offset, g.offset + g.len - 1),
            );
            assert_eq!(r.status, 206, "segment {} range: {}", g.msn, r.head);
            assert_eq!(r.body.len() as u64, g.len);
            assert!(
                starts_with_key_frame(&r.body),
                "segment {} does not start with a key frame's PES",
                g.msn
            );
            seen.insert(g.msn, g.clone());
        }
        // Contiguous: each segment starts where the one before ended.
        for w in segs.windows(2) {
            assert_eq!(w[0].offset + w[0].len, w[1].offset, "{text}");
        }
        if seq >= 3 {
            break text;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    println!("{last_playlist}");
    // The served length is the synced one: past it, 416; the file may hold more.
    let whole = get(&s.http, "/live/cam/stream.ts", "Range: bytes=0-0\r\n");
    let synced: u64 = whole
        .header("Content-Range")
        .and_then(|v| v.rsplit('/').next())
        .unwrap()
        .parse()
        .unwrap();
    assert!(synced <= std::fs::metadata(&s.record).unwrap().len());
    let (_, segs) = parse(&last_playlist);
    assert!(segs.last().map(|g| g.offset + g.len).unwrap() <= synced);
    let r = get(
        &s.http,
        "/live/cam/stream.ts",
        &format!("Range: bytes={}-\r\n", synced + 1_000_000_000),
    );
    assert_eq!(r.status, 416, "{}", r.head);

    // Blocking reloads: far ahead 400; two segments ahead waits and comes (both waiters);
    // a third waiter is 503 at once.
    let (seq, segs) = parse(&get(&s.http, "/live/cam/index.m3u8", "").text());
    let last = seq + segs.len() as u64 - 1;
    let r = get(
        &s.http,
        &format!("/live/cam/index.m3u8?_HLS_msn={}", last + 10),
        "",
    );
    assert_eq!(r.status, 400, "{}", r.head);
    let r = get(&s.http, "/live/cam/index.m3u8?_HLS_part=1", "");
    assert_eq!(r.status, 400, "{}", r.head);
    let want = last + 2;
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let http = s.http.clone();
            std::thread::spawn(move || {
                get(&http, &format!("/live/cam/index.m3u8?_HLS_msn={want}"), "")
            })
        })
        .collect();
    let answers: Vec<Reply> = waiters.into_iter().map(|t| t.join().unwrap()).collect();
    let codes: Vec<u16> = answers.iter().map(|r| r.status).collect();
    assert_eq!(codes.iter().filter(|&&c| c == 503).count(), 1, "{codes:?}");
    for r in answers.iter().filter(|r| r.status == 200) {
        let (seq, segs) = parse(&r.text());
        assert!(
            seq + segs.len() as u64 > want,
            "segment {want} not in {}",
            r.text()
        );
    }

    // ffmpeg reads the live playlist: packets of both streams.
    let url = format!("http://{}/live/cam/index.m3u8", s.http);
    let o = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-i", &url])
        .args(["-c", "copy", "-t", "3", "-f", "framemd5", "-"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    let video = out.lines().filter(|l| l.starts_with("0,")).count();
    let audio = out.lines().filter(|l| l.starts_with("1,")).count();
    assert!(
        video >= 25 && audio > 0,
        "ffmpeg read {video} video, {audio} audio packets"
    );
    let _ = ff.kill();
    let _ = ff.wait();
}

#[test]
fn live_recording_is_byte_identical_to_penstock_record() {
    if !have_tools() {
        return;
    }
    let s = serve("");
    let rec_path = s.dir.path().join("by-record.ts");
    let mut rec = Command::new(BIN)
        .args(["record", "udp-listen://127.0.0.1:0"])
        .arg(&rec_path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(rec.stdout.as_mut().unwrap()),
        &mut first,
    )
    .unwrap();
    let rec_addr: SocketAddr = first
        .trim()
        .strip_prefix("listening ")
        .unwrap()
        .parse()
        .unwrap();
    let mut ff = feed(6, &[udp_url(s.source), udp_url(rec_addr)]);
    assert!(ff.wait().unwrap().success(), "ffmpeg");
    // Both have read their sockets empty; then both files hold every datagram (written
    // before the tracks, whatever the sync).
    common::wait_udp_read(rec_addr.port(), &mut rec);
    let t0 = Instant::now();
    loop {
        let a = std::fs::metadata(&s.record).map(|m| m.len()).unwrap_or(0);
        let b = std::fs::metadata(&rec_path).map(|m| m.len()).unwrap_or(0);
        if a == b && a > 0 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "sizes {a} vs {b}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = rustix::process::Pid::from_raw(rec.id() as i32).unwrap();
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::INT);
    assert!(rec.wait().unwrap().success());
    let a = std::fs::read(&s.record).unwrap();
    let b = std::fs::read(&rec_path).unwrap();
    assert!(a.len() > 100_000, "only {} bytes recorded", a.len());
    assert!(
        a == b,
        "the relay's recording differs from penstock record's ({} vs {} bytes)",
        a.len(),
        b.len()
    );
}

/// The browser player (`penstock_testreq::require_browser_player`).
fn player_dir() -> Option<PathBuf> {
    penstock_testreq::require_browser_player()
}

#[test]
fn hls_js_plays_the_live_relay_within_three_target_durations() {
    if !have_tools() {
        return;
    }
    let Some(player) = player_dir() else {
        return;
    };
    let s = serve("");
    let root = s.dir.path().join("root");
    std::fs::copy(player.join("live.html"), root.join("live.html")).unwrap();
    std::fs::copy(
        player.join("node_modules/hls.js/dist/hls.min.js"),
        root.join("hls.min.js"),
    )
    .unwrap();
    // Video only: with the AAC stream, hls.js 1.7.4 resets the `start` of some fragments to
    // one audio PES's duration (0.171 s) after parsing them, and its `playingDate` (the
    // fragment's date plus the time played since its start) jumps by that error, ±10 s
    // (docs/hls.md "Limits"); the pictures play on either way.
    let mut ff = feed_with(60, &[udp_url(s.source)], false);
    // hls.js starts at the live edge: let two segments be there first.
    poll_playlist(&s, Duration::from_secs(60), |_, segs| segs.len() >= 2);
    let (line, _, _) = penstock_testreq::run_browser_player(
        &player,
        "live.mjs",
        &format!(
            "http://{}/live.html?src=/live/cam/index.m3u8&sync={TARGET_S}",
            s.http
        ),
        &["8"],
        &[],
        "hls-live",
    );
    assert!(line.contains("\"ok\":true"), "{line}");
    let lat: Vec<f64> = line
        .split("\"latencies_s\":[")
        .nth(1)
        .and_then(|r| r.split(']').next())
        .unwrap()
        .split(',')
        .map(|x| x.parse().unwrap())
        .collect();
    let worst = lat.iter().cloned().fold(0.0, f64::max);
    let best = lat.iter().cloned().fold(f64::INFINITY, f64::min);
    println!("hls.js latency vs playingDate: {lat:?} s, best {best:.2} s, worst {worst:.2} s");
    assert!(lat.len() >= 4 && best > 0.0, "{lat:?}");
    // The player reaches the live edge within three target durations. Gated on the best
    // sample, not the worst: on a loaded machine one rebuffer took a sample from 4.6 s to
    // 9.5 s (CI rehearsal, load 10) while every other was 4.6 s; a wall-time bound on
    // every sample would be a timing test (issue 31), the figures are printed.
    assert!(
        best <= 3.0 * TARGET_S as f64,
        "latency never within three target durations ({lat:?})"
    );
    let _ = ff.kill();
    let _ = ff.wait();
}
