//! RTSP publishing (issue 39 item 1, docs/rtsp.md "Publishing"): `penstock serve` with
//! `[rtsp.live.cam] source = "publish"`, published by `ffmpeg -f rtsp -rtsp_transport tcp`
//! with RTSP Digest credentials, watched by an ffmpeg viewer that joins late, and recorded.
//!
//! Checked: the recording reads cleanly (`ffprobe -v error` and a full decode say nothing),
//! its decoded video frames are the source's, all of them (the publisher starts at the
//! clip's first key frame, and the recorder runs from the start), and its AAC packets are
//! the source's byte for byte, but for the last few that ffmpeg never sends; the viewer, which joins after the publisher started, decodes
//! a contiguous run of the source's frames from the first key frame it receives (the frames
//! before it cannot be decoded without the GOP it missed) and ends by itself when the
//! publisher's TEARDOWN ends the source (its RTCP BYE); a second publisher on the path is
//! refused with 455 while the first publishes; no credential is 401, a user not among the
//! path's publishers 403; a garbage SDP is 400 and leaves the path free for the next
//! publisher; the source's HLS playlist lists segments. A second path is published from an MPEG-TS clip (video only): there the SPS and
//! PPS travel in band and the stream carries its own AUDs.
//!
//! The clip is an MP4, not TS, for the path with audio: ffmpeg 5.1 cannot announce AAC read
//! from MPEG-TS with `-c copy` ("AAC with no global headers is currently not supported": the
//! AudioSpecificConfig the SDP needs is not known before the first packet). Both clips have
//! no B-frames (`-bf 0`): RTP carries presentation times only, and the muxer's DTS is the
//! PTS (docs/rtsp.md, "Publishing").

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_penstock");
const FRAMES: usize = 75;
/// AAC frames at the end that ffmpeg's RTP packetizer keeps (below).
const AAC_UNSENT_MAX: usize = 8;

struct Served {
    child: Option<Child>,
    http: String,
    rtsp: SocketAddr,
    dir: tempfile::TempDir,
}

impl Served {
    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let pid = rustix::process::Pid::from_raw(c.id() as i32).unwrap();
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            let _ = c.wait();
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn url(&self, userinfo: &str, name: &str) -> String {
        format!("rtsp://{userinfo}{}/{name}", self.rtsp)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path("serve.log")).unwrap_or_default()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `printf %s TEXT | md5sum`: the hex digest by coreutils (apart from the server's).
fn md5_hex(text: &str) -> String {
    let o = Command::new("sh")
        .args(["-c", &format!("printf %s '{text}' | md5sum")])
        .output()
        .unwrap();
    String::from_utf8(o.stdout)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

fn serve() -> Served {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("root")).unwrap();
    let users = dir.path().join("users");
    std::fs::write(
        &users,
        format!(
            "pub:penstock:{}\neve:penstock:{}\n",
            md5_hex("pub:penstock:secret"),
            md5_hex("eve:penstock:x")
        ),
    )
    .unwrap();
    // A credentials file others may read is refused (docs/security.md).
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&users, std::fs::Permissions::from_mode(0o600)).unwrap();
    let conf = dir.path().join("penstock.toml");
    std::fs::write(
        &conf,
        format!(
            "[http]\nlisten = \"127.0.0.1:0\"\n[control]\nlisten = \"127.0.0.1:0\"\ntoken = \"rtsp-publish-test-token-rtsp-publish\"\n[log]\naccess = \"off\"\n[hls]\ntarget_duration_ms = \"1s\"\n\
             [auth]\ndigest_users_file = \"{}\"\n[rtsp]\nlisten = \"127.0.0.1:0\"\n\
             [rtsp.live.cam]\nsource = \"publish\"\npublishers = [\"pub\"]\nrecord = \"{}\"\nidle_timeout = \"3s\"\n\
             [rtsp.live.tscam]\nsource = \"publish\"\npublishers = [\"pub\"]\nrecord = \"{}\"\n",
            users.display(),
            dir.path().join("rec.ts").display(),
            dir.path().join("rec-ts.ts").display(),
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.path().join("serve.log")).unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--no-control-unix", "--config"])
        .arg(&conf)
        .arg(dir.path().join("root"))
        .env("PENSTOCK_LOG", "penstock_server=info")
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let line = common::start_line(&mut child);
    if !line.contains("rtsp://") {
        let _ = child.wait();
        panic!(
            "the server did not start: {}",
            std::fs::read_to_string(dir.path().join("serve.log")).unwrap_or_default()
        );
    }
    let rtsp = line
        .split("rtsp://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("no rtsp address in {line:?}"))
        .parse()
        .unwrap();
    Served {
        child: Some(child),
        http: common::serve_addresses(&line).0,
        rtsp,
        dir,
    }
}

/// A 3-second 320x240 25 fps H.264 (no B-frames, a key frame a second) clip, with stereo
/// AAC in `clip.mp4`, video alone in `clip.ts`.
fn clips(dir: &Path) {
    for (name, audio) in [("clip.mp4", true), ("clip.ts", false)] {
        let mut c = Command::new("ffmpeg");
        c.args(["-hide_banner", "-loglevel", "error", "-y"]).args([
            "-f",
            "lavfi",
            "-i",
            "testsrc=size=320x240:rate=25",
        ]);
        if audio {
            c.args(["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=44100"])
                .args(["-c:a", "aac", "-b:a", "64k", "-ac", "2"]);
        }
        let o = c
            .args([
                "-t",
                "3",
                "-c:v",
                "libx264",
                "-preset",
                "ultrafast",
                "-bf",
                "0",
            ])
            .args(["-g", "25", "-pix_fmt", "yuv420p"])
            .arg(dir.join(name))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
}

/// A command run with a time limit: (success, stdout, stderr).
fn run(mut cmd: Command, limit: Duration) -> (bool, String, String) {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    finish(child, limit)
}

fn finish(mut child: Child, limit: Duration) -> (bool, String, String) {
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let o = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let e = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return (st.success(), o.join().unwrap(), e.join().unwrap());
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return (false, o.join().unwrap(), "killed at the time limit".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn publish(input: &Path, url: &str, realtime: bool, extra: &[&str]) -> Command {
    let mut c = Command::new("ffmpeg");
    c.args(["-hide_banner", "-loglevel", "error", "-nostdin"]);
    if realtime {
        c.arg("-re");
    }
    c.arg("-i").arg(input).args(extra).args([
        "-c",
        "copy",
        "-f",
        "rtsp",
        "-rtsp_transport",
        "tcp",
        url,
    ]);
    c
}

/// The (size, md5) of each frame of a framemd5 output.
fn md5s(framemd5: &str) -> Vec<(String, String)> {
    framemd5
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            (f[4].to_string(), f[5].to_string())
        })
        .collect()
}

/// The decoded video frames (`v`) or the AAC packets as raw access units (`a`) of `input`.
fn framemd5(input: &str, stream: &str, extra: &[&str]) -> Vec<(String, String)> {
    let mut c = Command::new("ffmpeg");
    c.args(["-hide_banner", "-loglevel", "error", "-nostdin"])
        .args(extra)
        .args(["-i", input, "-map", &format!("0:{stream}")]);
    if stream == "a" {
        // The recording carries ADTS; the MP4 raw AUs: compared without the headers.
        c.args(["-c", "copy", "-bsf:a", "aac_adtstoasc"]);
    }
    c.args(["-f", "framemd5", "-"]);
    let (ok, out, err) = run(c, Duration::from_secs(60));
    assert!(ok, "ffmpeg {input} {stream}: {err}");
    md5s(&out)
}

/// Waits (bounded) until `path` holds at least `bytes`.
fn wait_size(path: &Path, bytes: u64, limit: Duration) {
    let t0 = Instant::now();
    while std::fs::metadata(path).map_or(0, |m| m.len()) < bytes {
        assert!(
            t0.elapsed() < limit,
            "{} never reached {bytes} bytes",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One request on a raw connection: (status, head).
fn request(c: &mut TcpStream, text: &str) -> (u16, String) {
    c.write_all(text.as_bytes()).unwrap();
    let mut got = Vec::new();
    let mut b = [0u8; 4096];
    let t0 = Instant::now();
    loop {
        let n = c.read(&mut b).unwrap();
        assert!(n > 0, "closed before a reply");
        got.extend_from_slice(&b[..n]);
        let s = String::from_utf8_lossy(&got).to_string();
        if let Some(end) = s.find("\r\n\r\n") {
            let head = &s[..end];
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length: "))
                .map_or(0, |v| v.trim().parse().unwrap());
            if got.len() >= end + 4 + len {
                let status = head[9..12].parse().unwrap();
                return (status, s);
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no reply");
    }
}

/// An ANNOUNCE of `sdp` by `pub` with RTSP Digest (qop=auth, the challenge of a first
/// ANNOUNCE without a credential): the status.
fn announce_as_pub(rtsp: SocketAddr, url: &str, sdp: &str) -> u16 {
    let mut c = TcpStream::connect(rtsp).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let ask = |cseq: u32, auth: &str| {
        format!(
            "ANNOUNCE {url} RTSP/1.0\r\nCSeq: {cseq}\r\n{auth}Content-Type: application/sdp\r\nContent-Length: {}\r\n\r\n{sdp}",
            sdp.len()
        )
    };
    let (status, head) = request(&mut c, &ask(1, ""));
    assert_eq!(status, 401, "{head}");
    let nonce = head
        .split("nonce=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("a nonce in the challenge");
    let ha1 = md5_hex("pub:penstock:secret");
    let ha2 = md5_hex(&format!("ANNOUNCE:{url}"));
    let response = md5_hex(&format!("{ha1}:{nonce}:00000001:c0ffee:auth:{ha2}"));
    let auth = format!(
        "Authorization: Digest username=\"pub\", realm=\"penstock\", nonce=\"{nonce}\", uri=\"{url}\", qop=auth, nc=00000001, cnonce=\"c0ffee\", response=\"{response}\"\r\n"
    );
    request(&mut c, &ask(2, &auth)).0
}

#[test]
fn ffmpeg_publishes_viewers_and_the_recording_get_its_frames_and_others_are_refused() {
    if !penstock_testreq::require_all(&["ffmpeg", "ffprobe"]) {
        return;
    }
    let mut s = serve();
    clips(s.dir.path());
    let mp4 = s.path("clip.mp4");
    let ts = s.path("clip.ts");
    let creds = "pub:secret@";

    // No credential: 401; a user who is not a publisher of the path: 403.
    for (userinfo, code) in [("", "401"), ("eve:x@", "403")] {
        let (ok, _, err) = run(
            publish(&mp4, &s.url(userinfo, "cam"), false, &[]),
            Duration::from_secs(30),
        );
        assert!(!ok && err.contains(code), "{userinfo:?}: {err}");
    }
    // A garbage SDP: 400, and the path stays free (the publisher below takes it).
    let url = s.url("", "cam");
    assert_eq!(
        announce_as_pub(s.rtsp, &url, "v=0\r\nthis is not SDP\r\n"),
        400
    );

    // The publisher, at the clip's pace; the viewer joins once the recording has grown.
    let publisher = publish(&mp4, &s.url(creds, "cam"), true, &[])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_size(&s.path("rec.ts"), 20 * 188, Duration::from_secs(15));
    // A second publisher on the path while the first publishes: 455.
    let (ok, _, err) = run(
        publish(&mp4, &s.url(creds, "cam"), false, &[]),
        Duration::from_secs(30),
    );
    assert!(!ok && err.contains("455"), "the second publisher: {err}");
    let mut viewer = Command::new("ffmpeg");
    viewer
        .args(["-hide_banner", "-loglevel", "error", "-nostdin"])
        .args(["-rtsp_transport", "tcp", "-i", &s.url("", "cam")])
        .args(["-map", "0:v", "-f", "framemd5", "-"]);
    let viewer = viewer
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (ok, _, err) = finish(publisher, Duration::from_secs(30));
    assert!(ok, "the publisher: {err}\n{}", s.log());
    // The publisher's TEARDOWN ends the source: the viewer gets its BYE and stops by itself.
    let (_, seen, verr) = finish(viewer, Duration::from_secs(20));
    assert!(
        !verr.contains("killed at the time limit"),
        "the viewer never ended: {verr}"
    );

    // HLS of the published source (docs/hls.md "Live and DVR"): segments cut at its key
    // frames, one a second (a 1 s target: the first segment closes at the third key frame).
    let t0 = Instant::now();
    loop {
        let page = ureq::get(format!("http://{}/live/cam/index.m3u8", s.http))
            .call()
            .ok()
            .and_then(|mut r| r.body_mut().read_to_string().ok())
            .unwrap_or_default();
        if page.matches("#EXTINF").count() >= 1 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the live playlist: {page}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // The TS-only path, as fast as ffmpeg sends.
    let (ok, _, err) = run(
        publish(&ts, &s.url(creds, "tscam"), false, &[]),
        Duration::from_secs(30),
    );
    assert!(ok, "the TS publisher: {err}\n{}", s.log());
    s.stop();

    let want_v = framemd5(mp4.to_str().unwrap(), "v", &[]);
    assert_eq!(want_v.len(), FRAMES);
    for rec in ["rec.ts", "rec-ts.ts"] {
        let rec = s.path(rec);
        let rec = rec.to_str().unwrap();
        // Read cleanly: ffprobe and a whole decode say nothing.
        let (ok, _, err) = run(
            {
                let mut c = Command::new("ffprobe");
                c.args(["-v", "error", "-show_packets", rec]);
                c
            },
            Duration::from_secs(30),
        );
        assert!(ok && err.trim().is_empty(), "ffprobe {rec}: {err}");
        let (ok, _, err) = run(
            {
                let mut c = Command::new("ffmpeg");
                c.args(["-v", "error", "-nostdin", "-i", rec, "-f", "null", "-"]);
                c
            },
            Duration::from_secs(30),
        );
        assert!(ok && err.trim().is_empty(), "decoding {rec}: {err}");
        assert_eq!(framemd5(rec, "v", &[]), want_v, "{rec}: the decoded frames");
    }
    // The AAC packets: the source's, in order, but for the last few, which ffmpeg's AAC
    // packetizer never sends (it gathers frames up to the muxer's max_delay into one packet
    // and does not flush what it holds at its end: 5 of 131 here).
    let want_a = framemd5(mp4.to_str().unwrap(), "a", &[]);
    assert!(want_a.len() > 100, "{} AAC packets", want_a.len());
    let got_a = framemd5(s.path("rec.ts").to_str().unwrap(), "a", &[]);
    assert!(
        got_a.len() <= want_a.len() && got_a.len() + AAC_UNSENT_MAX >= want_a.len(),
        "{} of {} AAC packets",
        got_a.len(),
        want_a.len()
    );
    assert_eq!(got_a[..], want_a[..got_a.len()], "the AAC packets");

    // The late viewer: a contiguous run of the source's frames, a second of them at least.
    let seen = md5s(&seen);
    assert!(
        seen.len() >= 25,
        "the viewer decoded {} frames: {verr}",
        seen.len()
    );
    let at = want_v
        .iter()
        .position(|f| *f == seen[0])
        .expect("the viewer's first frame is one of the source's");
    assert_eq!(
        &want_v[at..(at + seen.len()).min(FRAMES)],
        &seen[..],
        "the viewer's frames"
    );
}
