//! Segmented recordings of live sources (issue 39 items 1, 2 and 4; docs/recording.md
//! "Segments and retention"): `penstock serve` with three `[live.NAME]` sources on loopback
//! `udp-listen://` sockets, fed the same datagrams (an ffmpeg MPEG-TS, seven TS packets each,
//! at about twice its real-time rate) by this test:
//!
//! - `single` records into one file (`record = "…/single.ts"`), the reference;
//! - `seg` records into 1-second segments: rotated at key frames (each segment's first
//!   datagram is a frame-track entry and begins with the PAT), named by their start time in
//!   order (each name the second of its tracks' header time), every segment decodes clean
//!   (ffmpeg, `-v error`), its tracks check clean, and the segments end to end are the single
//!   recording byte for byte;
//! - `ret` records into 64 KiB segments under `max_bytes = "160KiB"`, filled more than three times
//!   over: the directory sampled all along never holds more than the budget plus one segment,
//!   the kept segments are the newest (end to end, the single recording's tail), every
//!   deleted one is older than every kept one, and a reader that opened the oldest segment
//!   before it was deleted reads it to its end; the metrics and `STATE` say what was kept
//!   and deleted.
//!
//! A second server checks the forms: `[rtsp.live.NAME]` is still read with one warning naming
//! `[live.NAME]`, an `rtsp://` camera source is refused as not built yet, and a live source
//! answers DESCRIBE at `rtsp://HOST:PORT/live/NAME` and at the old `/NAME`.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_penstock");
const TS: usize = 188;
const CONTROL_TOKEN: &str = "live-segments-test-token-live-segments";
const RET_SEGMENT_BYTES: u64 = 64 << 10;
const RET_MAX_BYTES: u64 = 160 << 10;

/// A 6-second MPEG-2 TS with a key frame every 5 frames (0.2 s), so that segments of a
/// second or of 96 KiB hold several; or `None`: SKIPPED, counted.
fn clip(dir: &Path) -> Option<PathBuf> {
    if !penstock_testreq::require("ffmpeg") {
        return None;
    }
    let path = dir.join("clip.ts");
    let o = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi"])
        .args(["-i", "testsrc=size=320x240:rate=25", "-t", "6"])
        .args([
            "-c:v",
            "mpeg2video",
            "-b:v",
            "2M",
            "-g",
            "5",
            "-f",
            "mpegts",
        ])
        .arg(&path)
        .output()
        .expect("ffmpeg");
    assert!(
        o.status.success(),
        "ffmpeg: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    Some(path)
}

struct Served {
    child: Child,
    http: String,
    control: Option<String>,
    rtsp: SocketAddr,
    log: PathBuf,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Served {
    fn start(dir: &Path, conf_text: &str) -> Served {
        let conf = dir.join("penstock.toml");
        let root = dir.join("root");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(
            &conf,
            format!(
                "[http]\nlisten = \"127.0.0.1:0\"\n[control]\nlisten = \"127.0.0.1:0\"\ntoken = \"{CONTROL_TOKEN}\"\n[log]\naccess = \"off\"\n[rtsp]\nlisten = \"127.0.0.1:0\"\n{conf_text}"
            ),
        )
        .unwrap();
        let log = dir.join("serve.log");
        let mut child = Command::new(BIN)
            .args(["serve", "--no-control-unix", "--config"])
            .arg(&conf)
            .arg(&root)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let line = common::start_line(&mut child);
        let (http, control) = common::serve_addresses(&line);
        let rtsp = line
            .split("rtsp://")
            .nth(1)
            .and_then(|r| r.split('/').next())
            .unwrap_or_else(|| panic!("no rtsp address in {line:?} ({})", read(&log)))
            .parse()
            .unwrap();
        Served {
            child,
            http,
            control,
            rtsp,
            log,
        }
    }

    /// SIGTERM, then wait: the recordings are synced and closed.
    fn stop(&mut self) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let _ = self.child.wait();
    }

    fn state_all(&self) -> Vec<String> {
        use std::io::BufRead;
        let mut s = TcpStream::connect(self.control.as_ref().unwrap()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(format!("AUTH {CONTROL_TOKEN}\nSTATE *\n").as_bytes())
            .unwrap();
        let mut lines = Vec::new();
        for l in std::io::BufReader::new(s).lines() {
            let l = l.unwrap();
            if l.starts_with("211 end") {
                break;
            }
            if let Some(x) = l.strip_prefix("211-") {
                lines.push(x.to_string());
            }
        }
        lines
    }

    fn describe(&self, path: &str) -> u16 {
        let mut s = TcpStream::connect(self.rtsp).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "DESCRIBE rtsp://{}/{path} RTSP/1.0\r\nCSeq: 1\r\nAccept: application/sdp\r\n\r\n",
            self.rtsp
        )
        .unwrap();
        let mut buf = [0u8; 4096];
        let n = s.read(&mut buf).unwrap();
        let head = String::from_utf8_lossy(&buf[..n]);
        head.split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0)
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

fn free_udp_port() -> SocketAddr {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// The `.ts` segments of `dir`, by name (the recorder's names sort by start time).
fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "ts"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Bytes of a segment and its three tracks (0 for what is gone).
fn segment_bytes(p: &Path) -> u64 {
    ["", ".time", ".packet", ".frame"]
        .iter()
        .map(|s| {
            let mut q = p.as_os_str().to_os_string();
            q.push(s);
            std::fs::metadata(q).map_or(0, |m| m.len())
        })
        .sum()
}

fn concat(files: &[PathBuf]) -> Vec<u8> {
    files
        .iter()
        .flat_map(|f| std::fs::read(f).unwrap())
        .collect()
}

/// `penstock tracks FILE --track T` as CSV rows (header skipped).
fn track_rows(file: &Path, track: &str) -> Vec<Vec<String>> {
    let o = Command::new(BIN)
        .arg("tracks")
        .arg(file)
        .args(["--track", track])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "tracks {}: {}",
        file.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .skip(1)
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect()
}

/// The tracks' header start time of a recording, seconds since the epoch (`penstock tracks
/// --check` prints nothing of it; the time track's header holds it at bytes 16..24, LE ns:
/// docs/track-format.md).
fn header_start_s(file: &Path) -> u64 {
    let mut p = file.as_os_str().to_os_string();
    p.push(".time");
    let h = std::fs::read(p).unwrap();
    u64::from_le_bytes(h[16..24].try_into().unwrap()) / 1_000_000_000
}

/// `20261127T140320Z` (with an optional `_N`) as seconds since the epoch.
fn name_s(file: &Path) -> u64 {
    let stem = file.file_stem().unwrap().to_str().unwrap();
    let t = stem.split('_').next().unwrap();
    let rfc = format!(
        "{}-{}-{}T{}:{}:{}Z",
        &t[..4],
        &t[4..6],
        &t[6..8],
        &t[9..11],
        &t[11..13],
        &t[13..15]
    );
    humantime::parse_rfc3339(&rfc)
        .unwrap_or_else(|e| panic!("{stem}: {e}"))
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[test]
fn segments_rotate_at_key_frames_join_to_the_single_recording_and_retention_keeps_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let Some(clip) = clip(dir.path()) else {
        return;
    };
    let src = std::fs::read(&clip).unwrap();
    let (a, b, c) = (free_udp_port(), free_udp_port(), free_udp_port());
    let rec = dir.path().join("rec");
    let single = dir.path().join("single.ts");
    let mut s = Served::start(
        dir.path(),
        &format!(
            "[hls]\ntarget_duration_ms = 1000\n\
             [live.single]\nsource = \"udp-listen://{a}\"\nrecord = \"{}\"\n\
             [live.seg]\nsource = \"udp-listen://{b}\"\nrecord = {{ dir = \"{}\", segment = \"1s\" }}\n\
             [live.ret]\nsource = \"udp-listen://{c}\"\nrecord = {{ dir = \"{}\", segment = \"{RET_SEGMENT_BYTES}\", max_bytes = \"{RET_MAX_BYTES}\" }}\n",
            single.display(),
            rec.display(),
            rec.display()
        ),
    );
    let (seg_dir, ret_dir) = (rec.join("seg"), rec.join("ret"));

    // The sender: seven TS packets a datagram to the three sources, at about twice the clip's
    // real-time rate (6 s in 3 s); meanwhile the retention directory is sampled.
    let sender = std::thread::spawn({
        let src = src.clone();
        move || {
            let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
            let chunks: Vec<&[u8]> = src.chunks(7 * TS).collect();
            let per_ms = chunks.len() as f64 / 3000.0;
            let t0 = Instant::now();
            for (i, d) in chunks.iter().enumerate() {
                for to in [a, b, c] {
                    tx.send_to(d, to).unwrap();
                }
                // Pace: datagram i leaves at i / per_ms milliseconds.
                let due = Duration::from_secs_f64(i as f64 / per_ms / 1000.0);
                if let Some(w) = due.checked_sub(t0.elapsed()) {
                    std::thread::sleep(w);
                }
            }
        }
    });
    let mut seen: BTreeSet<PathBuf> = BTreeSet::new();
    let mut largest_segment = 0u64;
    let mut most_on_disk = 0u64;
    let mut oldest_reader: Option<(PathBuf, std::fs::File)> = None;
    let settled = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let t0 = Instant::now();
    loop {
        let done = sender.is_finished() && settled(&single) as usize == src.len();
        let now = segments(&ret_dir);
        if oldest_reader.is_none()
            && let Some(first) = now.first()
            && let Ok(f) = std::fs::File::open(first)
        {
            oldest_reader = Some((first.clone(), f));
        }
        let on_disk: u64 = now.iter().map(|p| segment_bytes(p)).sum();
        most_on_disk = most_on_disk.max(on_disk);
        for p in &now {
            largest_segment = largest_segment.max(segment_bytes(p));
            seen.insert(p.clone());
        }
        if done {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the single recording has {} of {} bytes after 60 s ({})",
            settled(&single),
            src.len(),
            read(&s.log)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    sender.join().unwrap();

    // Metrics and STATE, before the server stops: what `ret` keeps and deleted.
    let kept_now = segments(&ret_dir).len() as f64;
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut kept_metric, mut deleted_metric) = (0.0, 0.0);
    while Instant::now() < deadline {
        let page = common::scrape(&s.http).unwrap_or_default();
        kept_metric =
            common::sample(&page, "penstock_recording_segments{source=\"ret\"}").unwrap_or(0.0);
        deleted_metric =
            common::sample(&page, "penstock_recording_deletions_total{source=\"ret\"}")
                .unwrap_or(0.0);
        if kept_metric == kept_now && deleted_metric > 0.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(kept_metric, kept_now, "penstock_recording_segments");
    assert!(deleted_metric > 0.0, "penstock_recording_deletions_total");
    let state = s.state_all();
    let line = state
        .iter()
        .find(|l| l.starts_with("record-ret running "))
        .unwrap_or_else(|| panic!("no record-ret line in STATE: {state:?}"));
    assert!(line.contains(&format!(" segments={kept_now} ")), "{line}");

    // HLS: `/live/seg/index.m3u8` spans the segment files, each with its EXT-X-MAP, every
    // listed range the bytes of its file; `/live/ret/index.m3u8` lists no deleted file.
    let get = |path: &str, range: Option<(u64, u64)>| -> (u16, Vec<u8>) {
        let mut r = ureq::get(format!("http://{}{path}", s.http))
            .config()
            .http_status_as_error(false)
            .build();
        if let Some((off, len)) = range {
            r = r.header("Range", &format!("bytes={off}-{}", off + len - 1));
        }
        let mut resp = r.call().unwrap();
        let status = resp.status().as_u16();
        (status, resp.body_mut().read_to_vec().unwrap())
    };
    let (status, page) = get("/live/seg/index.m3u8", None);
    let page = String::from_utf8(page).unwrap();
    assert_eq!(status, 200, "{page}");
    let mut files_listed = BTreeSet::new();
    let mut ranges = 0;
    let mut lines = page.lines();
    while let Some(l) = lines.next() {
        if let Some(br) = l.strip_prefix("#EXT-X-BYTERANGE:") {
            let (len, off) = br.split_once('@').unwrap();
            let (len, off): (u64, u64) = (len.parse().unwrap(), off.parse().unwrap());
            let uri = lines.next().unwrap();
            let (st, got) = get(&format!("/live/seg/{uri}"), Some((off, len)));
            assert_eq!(st, 206, "{uri} {off}+{len}");
            let file = std::fs::read(seg_dir.join(uri)).unwrap();
            assert!(
                got == file[off as usize..(off + len) as usize],
                "{uri} {off}+{len}: not the file's bytes"
            );
            files_listed.insert(uri.to_string());
            ranges += 1;
        }
    }
    let maps = page.matches("#EXT-X-MAP:").count();
    assert!(files_listed.len() >= 2, "one file listed: {page}");
    assert_eq!(maps, files_listed.len(), "an EXT-X-MAP per file: {page}");
    assert_eq!(get("/live/seg/stream.ts", None).0, 404);
    assert_eq!(get("/live/seg/../single.ts", None).0, 404);
    let (_, ret_page) = get("/live/ret/index.m3u8", None);
    let ret_page = String::from_utf8(ret_page).unwrap();
    let ret_now = segments(&ret_dir);
    for uri in ret_page.lines().filter(|l| l.ends_with(".ts")) {
        assert!(
            ret_now.iter().any(|p| p.file_name().unwrap() == uri),
            "/live/ret/index.m3u8 lists {uri}, deleted: {ret_page}"
        );
    }
    println!(
        "HLS: /live/seg/index.m3u8 lists {ranges} ranges of {} files ({maps} EXT-X-MAP), each the file's bytes",
        files_listed.len()
    );
    s.stop();

    // The reference: the single recording is the bytes sent.
    let whole = std::fs::read(&single).unwrap();
    assert!(whole == src, "the single recording is not the source");

    // `seg`: in order, rotated at key frames beginning with the PAT, each playable alone, and
    // end to end the single recording.
    let segs = segments(&seg_dir);
    assert!(
        segs.len() >= 3,
        "{} segments of 1 s from 3 s of input",
        segs.len()
    );
    let mut last_s = 0;
    for (i, p) in segs.iter().enumerate() {
        let start_s = name_s(p);
        assert_eq!(
            start_s,
            header_start_s(p),
            "{}: named by its start",
            p.display()
        );
        assert!(
            start_s > last_s || i == 0,
            "{} not after the one before",
            p.display()
        );
        last_s = start_s;
        let check = Command::new(BIN)
            .arg("tracks")
            .arg(p)
            .arg("--check")
            .output()
            .unwrap();
        assert!(
            check.status.success(),
            "{}: tracks --check: {}",
            p.display(),
            String::from_utf8_lossy(&check.stdout)
        );
        let bytes = std::fs::read(p).unwrap();
        if bytes.is_empty() {
            continue;
        }
        if i > 0 {
            let frames = track_rows(p, "frame");
            assert_eq!(
                frames[0][0],
                "0",
                "{}: the first datagram is a key frame",
                p.display()
            );
            let pid = (u16::from(bytes[1] & 0x1f) << 8) | u16::from(bytes[2]);
            assert_eq!(
                (bytes[0], pid),
                (0x47, 0),
                "{}: begins with the PAT",
                p.display()
            );
        }
        if penstock_testreq::require("ffmpeg") {
            let o = Command::new("ffmpeg")
                .args(["-hide_banner", "-v", "error", "-i"])
                .arg(p)
                .args(["-f", "null", "-"])
                .output()
                .unwrap();
            assert!(
                o.status.success() && o.stderr.is_empty(),
                "{}: ffmpeg says {}",
                p.display(),
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }
    assert!(
        concat(&segs) == whole,
        "the segments end to end are not the single recording"
    );
    println!(
        "seg: {} segments, names {:?}..{:?}, each decodes clean, end to end = the single recording ({} bytes)",
        segs.len(),
        segs[0].file_name().unwrap(),
        segs.last().unwrap().file_name().unwrap(),
        whole.len()
    );

    // `ret`: within the budget plus one segment, the newest kept, the oldest's reader read on.
    let kept = segments(&ret_dir);
    let written = seen.len();
    assert!(
        whole.len() as u64 >= 3 * RET_MAX_BYTES,
        "the budget is filled {:.1} times, not 3",
        whole.len() as f64 / RET_MAX_BYTES as f64
    );
    assert!(
        most_on_disk <= RET_MAX_BYTES + largest_segment,
        "{most_on_disk} bytes on disk at most, above the budget {RET_MAX_BYTES} + one segment {largest_segment}"
    );
    let deleted: Vec<&PathBuf> = seen.iter().filter(|p| !kept.contains(p)).collect();
    assert!(!deleted.is_empty(), "nothing was deleted");
    assert!(
        deleted.iter().all(|d| *d < &kept[0]),
        "a deleted segment is newer than a kept one: deleted {deleted:?}, kept {kept:?}"
    );
    let tail = concat(&kept);
    assert!(
        whole.ends_with(&tail),
        "the kept segments end to end are not the single recording's tail"
    );
    let (oldest, mut f) = oldest_reader.expect("the oldest segment was opened");
    assert!(!oldest.exists(), "{} was not deleted", oldest.display());
    let mut got = Vec::new();
    f.read_to_end(&mut got).unwrap();
    assert!(
        got.len() as u64 >= RET_SEGMENT_BYTES && whole.starts_with(&got),
        "the open reader of the deleted {} read {} bytes, not the recording's first segment",
        oldest.display(),
        got.len()
    );
    println!(
        "ret: {} bytes into {written} segments of ~{} KiB, budget {} KiB: at most {} bytes on disk (budget + largest segment {} = {}), {} deleted oldest first, {} kept = the recording's tail; the reader of the deleted oldest read its {} bytes",
        whole.len(),
        RET_SEGMENT_BYTES >> 10,
        RET_MAX_BYTES >> 10,
        most_on_disk,
        largest_segment,
        RET_MAX_BYTES + largest_segment,
        deleted.len(),
        kept.len(),
        got.len()
    );
}

#[test]
fn the_old_form_warns_a_camera_source_is_refused_and_live_paths_have_an_alias() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (free_udp_port(), free_udp_port());
    let s = Served::start(
        dir.path(),
        &format!(
            "[live.cam]\nsource = \"udp-listen://{a}\"\n[rtsp.live.old]\nsource = \"udp-listen://{b}\"\n"
        ),
    );
    for path in ["live/cam", "cam", "live/old", "old"] {
        assert_eq!(s.describe(path), 200, "DESCRIBE /{path}");
    }
    assert_eq!(s.describe("live/nope"), 404);
    let log = read(&s.log);
    let warned: Vec<&str> = log.lines().filter(|l| l.contains("old form")).collect();
    assert_eq!(warned.len(), 1, "{log}");
    assert!(
        warned[0].contains("[rtsp.live.old]") && warned[0].contains("[live.old]"),
        "{log}"
    );
    drop(s);

    // A camera pull is not built: the server refuses to start, saying so.
    let conf = dir.path().join("cam.toml");
    std::fs::write(
        &conf,
        "[rtsp]\nlisten = \"127.0.0.1:0\"\n[live.cam]\nsource = \"rtsp://camera/stream\"\n",
    )
    .unwrap();
    let o = Command::new(BIN)
        .args(["serve", "--no-control-unix", "--check-config", "--config"])
        .arg(&conf)
        .arg(dir.path())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && said.contains("not built yet"),
        "{said}"
    );
    println!(
        "old form: {}; camera source: {}",
        warned[0].trim(),
        said.trim()
    );
}
