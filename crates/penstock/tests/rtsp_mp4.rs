//! RTSP of plain MP4 files (issue 36 item 3, docs/rtsp.md "MP4 files"): `penstock serve`
//! serving `assets/clip.mp4` (12 s of 640x360 H.264 and mono 44.1 kHz AAC, ffmpeg-made, key frames every 2 s) and
//! MP4s ffmpeg makes here (moov at the end, B-frames), played by ffprobe and ffmpeg over TCP
//! and UDP, and by a scripted client written here for what players do not show (the Range of
//! a seek, the first access unit after it, bad files' replies).
//!
//! What is compared, and why: over RTP an H.264 bitstream arrives as NAL units (ffmpeg's
//! depacketizer writes them Annex-B), from the file length-prefixed, so packet hashes cannot
//! match; the **decoded frames** (`-f framemd5` of the video decoded) are compared instead.
//! AAC access units are the same bytes both ways: their packets (`-c copy`) are compared.
//! The end-of-stream allowance is one frame per stream: ffmpeg's RTSP demuxer ends on the
//! RTCP BYE, and a packet that arrives after the BYE on the other socket (UDP: RTP and RTCP
//! are two sockets read in either order) is dropped.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_penstock");

fn clip() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/clip.mp4")
}

/// A running `penstock serve` over a temporary root.
struct Served {
    child: Child,
    rtsp: SocketAddr,
    dir: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let _ = self.child.wait();
    }
}

impl Served {
    fn url(&self, path: &str) -> String {
        format!("rtsp://{}/{path}", self.rtsp)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

fn serve() -> Served {
    serve_with("", 1_250_000_000)
}

/// `penstock serve` with more `[rtsp]` lines and admission's network rate `net_bytes_per_s`.
fn serve_with(rtsp: &str, net_bytes_per_s: u64) -> Served {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(clip(), dir.path().join("clip.mp4")).unwrap();
    let conf = dir.path().join("penstock.toml");
    // Admission's figures are set, not measured (as tests/rtsp.rs does).
    std::fs::write(
        &conf,
        format!("[http]\nlisten = \"127.0.0.1:0\"\n[control]\nlisten = \"127.0.0.1:0\"\ntoken = \"rtsp-mp4-test-token-rtsp-mp4-test\"\n[log]\naccess = \"off\"\n[rtsp]\nlisten = \"127.0.0.1:0\"\n{rtsp}\n\
         [admission]\nself_calibrate = false\ndisk_seq_bytes_per_s = 1000000000\n\
         disk_random_iops = 100000\nnet_bytes_per_s = {net_bytes_per_s}\ncpu_send_ns = 5000\n\
         cpu_send_byte_ps = 500\n"),
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--no-control-unix", "--config"])
        .arg(&conf)
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let line = common::start_line(&mut child);
    let rtsp = line
        .split("rtsp://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("no rtsp address in {line:?}"))
        .parse()
        .unwrap();
    Served { child, rtsp, dir }
}

/// A command run with a time limit: (success, stdout, stderr).
fn run(mut cmd: Command, limit: Duration) -> (bool, String, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
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
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The (size, md5) of each line of a framemd5 output.
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

/// ffmpeg's framemd5 of `input`: the video decoded (`v`) or the audio packets copied (`a`).
fn framemd5(input: &str, stream: &str, transport: Option<&str>) -> Vec<(String, String)> {
    let mut c = Command::new("ffmpeg");
    c.args(["-hide_banner", "-loglevel", "error", "-nostdin"]);
    if let Some(t) = transport {
        c.args(["-rtsp_transport", t]);
    }
    c.args(["-i", input, "-map", &format!("0:{stream}")]);
    if stream == "a" {
        c.args(["-c", "copy"]);
    }
    c.args(["-f", "framemd5", "-"]);
    let (ok, out, err) = run(c, Duration::from_secs(120));
    assert!(ok, "ffmpeg {input} {stream}: {err}");
    md5s(&out)
}

/// Every item of `want` in `got`, in order, at most one missing at the end (module doc).
fn same_but_the_last(got: &[(String, String)], want: &[(String, String)], what: &str) {
    assert!(
        got.len() + 1 >= want.len() && got.len() <= want.len(),
        "{what}: {} of {}",
        got.len(),
        want.len()
    );
    let differ = got.iter().zip(want).position(|(a, b)| a != b);
    assert_eq!(differ, None, "{what}: first difference at {differ:?}");
}

fn have(tool: &str) -> bool {
    penstock_testreq::require(tool)
}

#[test]
fn ffprobe_sees_h264_and_aac() {
    if !have("ffprobe") {
        return;
    }
    let s = serve();
    let mut c = Command::new("ffprobe");
    c.args(["-v", "error", "-rtsp_transport", "tcp"])
        .args([
            "-show_entries",
            "stream=codec_name,sample_rate,channels,width,height",
        ])
        .args(["-of", "compact", &s.url("clip.mp4")]);
    let (ok, out, err) = run(c, Duration::from_secs(60));
    assert!(ok, "{err}");
    assert!(
        out.contains("codec_name=h264|width=640|height=360"),
        "{out}"
    );
    assert!(
        out.contains("codec_name=aac|sample_rate=44100|channels=1"),
        "{out}"
    );
}

/// The decoded video and the AAC packets over TCP and UDP are the file's.
#[test]
fn decoded_video_and_aac_packets_are_the_files_over_tcp_and_udp() {
    if !have("ffmpeg") {
        return;
    }
    let s = serve();
    let file = clip();
    let file = file.to_str().unwrap();
    let want_v = framemd5(file, "v", None);
    let want_a = framemd5(file, "a", None);
    assert_eq!(want_v.len(), 300);
    for t in ["tcp", "udp"] {
        let got_v = framemd5(&s.url("clip.mp4"), "v", Some(t));
        same_but_the_last(&got_v, &want_v, &format!("{t} video frames"));
        let got_a = framemd5(&s.url("clip.mp4"), "a", Some(t));
        same_but_the_last(&got_a, &want_a, &format!("{t} AAC packets"));
    }
}

/// An MP4 with its moov at the end and B-frames (composition offsets, an edit list).
#[test]
fn a_moov_at_the_end_with_b_frames_decodes_as_the_file() {
    if !have("ffmpeg") {
        return;
    }
    let s = serve();
    let path = s.path("late.mp4");
    let o = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y"])
        .args(["-f", "lavfi", "-i", "testsrc=size=320x240:rate=25"])
        .args(["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=44100"])
        .args([
            "-t",
            "4",
            "-c:v",
            "libx264",
            "-preset",
            "ultrafast",
            "-bf",
            "3",
        ])
        .args(["-g", "25", "-c:a", "aac", "-ac", "2"])
        .arg(&path)
        .output()
        .expect("ffmpeg");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let want_v = framemd5(path.to_str().unwrap(), "v", None);
    let got_v = framemd5(&s.url("late.mp4"), "v", Some("tcp"));
    same_but_the_last(&got_v, &want_v, "late.mp4 video frames");
    let want_a = framemd5(path.to_str().unwrap(), "a", None);
    let got_a = framemd5(&s.url("late.mp4"), "a", Some("tcp"));
    same_but_the_last(&got_a, &want_a, "late.mp4 AAC packets");
}

/// A scripted RTSP client over one TCP connection (interleaved).
struct Client {
    tcp: TcpStream,
    cseq: u32,
    buf: Vec<u8>,
    /// Interleaved frames read while waiting for a reply: (channel, payload).
    frames: Vec<(u8, Vec<u8>)>,
}

impl Client {
    fn connect(addr: SocketAddr) -> Client {
        let tcp = TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Client {
            tcp,
            cseq: 0,
            buf: Vec::new(),
            frames: Vec::new(),
        }
    }

    fn fill(&mut self) {
        let mut b = [0u8; 65536];
        let n = self.tcp.read(&mut b).expect("read");
        assert!(n > 0, "the server closed the connection");
        self.buf.extend_from_slice(&b[..n]);
    }

    /// The next interleaved frame, or the next reply (status, headers, body) when one comes
    /// first.
    fn next(&mut self) -> Result<(u8, Vec<u8>), (u16, String, String)> {
        loop {
            if self.buf.first() == Some(&b'$') && self.buf.len() >= 4 {
                let len = usize::from(u16::from_be_bytes([self.buf[2], self.buf[3]]));
                if self.buf.len() >= 4 + len {
                    let f = (self.buf[1], self.buf[4..4 + len].to_vec());
                    self.buf.drain(..4 + len);
                    return Ok(f);
                }
            } else if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.buf[..end]).to_string();
                let len = head
                    .lines()
                    .find_map(|l| l.strip_prefix("Content-Length: "))
                    .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                if self.buf.len() >= end + 4 + len {
                    let body =
                        String::from_utf8_lossy(&self.buf[end + 4..end + 4 + len]).to_string();
                    self.buf.drain(..end + 4 + len);
                    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
                    return Err((status, head, body));
                }
            }
            self.fill();
        }
    }

    fn request(&mut self, method: &str, url: &str, headers: &str) -> (u16, String, String) {
        self.cseq += 1;
        let req = format!(
            "{method} {url} RTSP/1.0\r\nCSeq: {}\r\n{headers}\r\n",
            self.cseq
        );
        self.tcp.write_all(req.as_bytes()).unwrap();
        loop {
            match self.next() {
                Ok(f) => self.frames.push(f),
                Err(r) => return r,
            }
        }
    }
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(": ")))
}

/// The session id of a SETUP reply's `Session` header (without `;timeout=`).
fn session_of(head: &str) -> String {
    header(head, "Session")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string()
}

/// The key frames' presentation times of the file's video, in s (ffprobe).
fn key_frame_times(file: &Path) -> Vec<f64> {
    let o = Command::new("ffprobe")
        .args([
            "-v",
            "error",
            "-select_streams",
            "v",
            "-skip_frame",
            "nokey",
        ])
        .args(["-show_entries", "frame=pts_time", "-of", "csv=p=0"])
        .arg(file)
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split(',').next()?.trim().parse().ok())
        .collect()
}

/// `Range: npt=5-` starts at the key frame at or before 5 s: the reply's Range says so, and
/// the first video access unit that arrives holds an IDR picture, at the RTP-Info's rtptime.
#[test]
fn a_seek_lands_on_the_sync_sample_at_or_before_it() {
    if !have("ffprobe") {
        return;
    }
    let s = serve();
    let url = s.url("clip.mp4");
    let mut c = Client::connect(s.rtsp);
    let (st, _, sdp) = c.request("DESCRIBE", &url, "Accept: application/sdp\r\n");
    assert_eq!(st, 200);
    assert!(sdp.contains("a=rtpmap:96 H264/90000"), "{sdp}");
    assert!(
        sdp.contains("packetization-mode=1;profile-level-id="),
        "{sdp}"
    );
    assert!(sdp.contains("sprop-parameter-sets="), "{sdp}");
    assert!(sdp.contains("a=rtpmap:97 MPEG4-GENERIC/44100/1"), "{sdp}");
    assert!(
        sdp.contains("mode=AAC-hbr;sizelength=13;indexlength=3;indexdeltalength=3;config="),
        "{sdp}"
    );
    let controls: Vec<&str> = sdp
        .lines()
        .filter_map(|l| l.strip_prefix("a=control:trackID="))
        .collect();
    assert_eq!(controls.len(), 2, "{sdp}");
    let (st, head, _) = c.request(
        "SETUP",
        &format!("{url}/trackID={}", controls[0].trim()),
        "Transport: RTP/AVP/TCP;unicast;interleaved=0-1\r\n",
    );
    assert_eq!(st, 200, "{head}");
    let session = session_of(&head);
    let (st, head, _) = c.request(
        "SETUP",
        &format!("{url}/trackID={}", controls[1].trim()),
        &format!("Transport: RTP/AVP/TCP;unicast;interleaved=2-3\r\nSession: {session}\r\n"),
    );
    assert_eq!(st, 200, "{head}");
    // A third SETUP of a track already set up is refused, the session goes on.
    let (st, _, _) = c.request(
        "SETUP",
        &format!("{url}/trackID={}", controls[1].trim()),
        &format!("Transport: RTP/AVP/TCP;unicast;interleaved=4-5\r\nSession: {session}\r\n"),
    );
    assert_eq!(st, 455);
    // A start past the movie's end is refused (457), the session goes on.
    let (st, head, _) = c.request(
        "PLAY",
        &url,
        &format!("Session: {session}\r\nRange: npt=3600.000-\r\n"),
    );
    assert_eq!(st, 457, "{head}");
    let (st, head, _) = c.request(
        "PLAY",
        &url,
        &format!("Session: {session}\r\nRange: npt=5.000-\r\n"),
    );
    assert_eq!(st, 200, "{head}");
    let range = header(&head, "Range").unwrap();
    let start: f64 = range
        .strip_prefix("npt=")
        .and_then(|r| r.split('-').next())
        .unwrap()
        .parse()
        .unwrap();
    let keys = key_frame_times(&clip());
    let key = keys
        .iter()
        .copied()
        .filter(|&k| k <= 5.0)
        .fold(0.0, f64::max);
    // ffprobe's times include the track's empty edit (tens of ms): the same key frame.
    assert!(
        start <= 5.0 && (start - key).abs() < 0.1,
        "Range {range}, key frames {keys:?}"
    );
    let info = header(&head, "RTP-Info").unwrap().to_string();
    let video_rtptime: u32 = info
        .split(',')
        .next()
        .and_then(|i| i.split("rtptime=").nth(1))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The first video access unit: its packets up to the marker.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut nal_types = Vec::new();
    let mut ts = None;
    let mut frames = std::mem::take(&mut c.frames).into_iter();
    while Instant::now() < deadline {
        let (ch, p) = match frames.next() {
            Some(f) => f,
            None => match c.next() {
                Ok(f) => f,
                Err(r) => panic!("unexpected reply {r:?}"),
            },
        };
        if ch != 0 {
            continue;
        }
        let t = u32::from_be_bytes([p[4], p[5], p[6], p[7]]);
        assert_eq!(*ts.get_or_insert(t), t, "one access unit, one timestamp");
        let nal = p[12];
        nal_types.push(match nal & 0x1f {
            28 => p[13] & 0x1f,
            t => t,
        });
        if p[1] & 0x80 != 0 {
            break;
        }
    }
    assert_eq!(ts, Some(video_rtptime), "{info}");
    assert!(
        nal_types.contains(&5),
        "no IDR slice in the first access unit: {nal_types:?}"
    );
    let (st, _, _) = c.request("TEARDOWN", &url, &format!("Session: {session}\r\n"));
    assert_eq!(st, 200);
}

/// A truncated moov and an unknown codec: DESCRIBE and SETUP answer 415 naming why; the good
/// file is still described and set up after them on the same connection.
#[test]
fn bad_mp4s_get_a_415_naming_why_and_nothing_else_changes() {
    let s = serve();
    let good = std::fs::read(clip()).unwrap();
    let find = |b: &[u8], kind: &[u8; 4]| b.windows(4).position(|w| w == kind).unwrap();
    let moov = find(&good, b"moov") - 4;
    let moov_len = u32::from_be_bytes(good[moov..moov + 4].try_into().unwrap()) as usize;
    std::fs::write(s.path("truncated.mp4"), &good[..moov + moov_len / 2]).unwrap();
    let mut unknown = good.clone();
    let stsd = find(&unknown, b"stsd");
    let avc1 = stsd + find(&unknown[stsd..], b"avc1");
    unknown[avc1..avc1 + 4].copy_from_slice(b"zzz9");
    std::fs::write(s.path("unknown.mp4"), &unknown).unwrap();
    let mut c = Client::connect(s.rtsp);
    for (name, says) in [
        ("truncated.mp4", "not playable as MP4"),
        ("unknown.mp4", "unsupported codec 'zzz9'"),
    ] {
        let (st, _, body) = c.request("DESCRIBE", &s.url(name), "");
        assert_eq!(st, 415, "{name}: {body}");
        assert!(body.contains(says), "{name}: {body}");
        let (st, _, body) = c.request(
            "SETUP",
            &format!("{}/trackID=1", s.url(name)),
            "Transport: RTP/AVP/TCP;unicast;interleaved=0-1\r\n",
        );
        assert_eq!(st, 415, "{name}: {body}");
        let (st, _, sdp) = c.request("DESCRIBE", &s.url("clip.mp4"), "");
        assert_eq!(st, 200, "{sdp}");
    }
    let (st, _, body) = c.request(
        "SETUP",
        &format!("{}/trackID=9", s.url("clip.mp4")),
        "Transport: RTP/AVP/TCP;unicast;interleaved=0-1\r\n",
    );
    assert_eq!(st, 404, "{body}");
    assert!(body.contains("no track 9"), "{body}");
    let (st, head, _) = c.request(
        "SETUP",
        &format!("{}/trackID=1", s.url("clip.mp4")),
        "Transport: RTP/AVP/TCP;unicast;interleaved=0-1\r\n",
    );
    assert_eq!(st, 200, "{head}");
    let session = session_of(&head);
    let (st, _, body) = c.request(
        "PLAY",
        &s.url("clip.mp4"),
        &format!("Session: {session}\r\nScale: 0.5\r\n"),
    );
    // Slow motion of an MP4 is not served (reverse and fast forward are: trick play).
    assert_eq!(st, 451, "{body}");
    assert!(body.contains("slow motion"), "{body}");
    let (st, _, _) = c.request(
        "TEARDOWN",
        &s.url("clip.mp4"),
        &format!("Session: {session}\r\n"),
    );
    assert_eq!(st, 200);
}

/// PAUSE stops the tracks and PLAY without Range resumes them where they stopped: over one
/// interleaved connection, each track's sequence numbers run on without a gap or a repeat
/// across the pause, and its RTP times never go back.
#[test]
fn pause_and_resume_continue_each_track_where_it_stopped() {
    let s = serve();
    let url = s.url("clip.mp4");
    let mut c = Client::connect(s.rtsp);
    let (st, head, _) = c.request(
        "SETUP",
        &format!("{url}/trackID=1"),
        "Transport: RTP/AVP/TCP;unicast;interleaved=0-1\r\n",
    );
    assert_eq!(st, 200, "{head}");
    let session = session_of(&head);
    let (st, head, _) = c.request(
        "SETUP",
        &format!("{url}/trackID=2"),
        &format!("Transport: RTP/AVP/TCP;unicast;interleaved=2-3\r\nSession: {session}\r\n"),
    );
    assert_eq!(st, 200, "{head}");
    let (st, _, _) = c.request("PLAY", &url, &format!("Session: {session}\r\n"));
    assert_eq!(st, 200);
    // Some of both tracks, then PAUSE, then PLAY again, then some more.
    let mut frames = Vec::new();
    let read_until = |c: &mut Client, frames: &mut Vec<(u8, Vec<u8>)>, n: usize| {
        let deadline = Instant::now() + Duration::from_secs(20);
        let count = |f: &Vec<(u8, Vec<u8>)>, ch| f.iter().filter(|x| x.0 == ch).count();
        while (count(frames, 0) < n || count(frames, 2) < n / 4) && Instant::now() < deadline {
            match c.next() {
                Ok(f) => frames.push(f),
                Err(r) => panic!("unexpected reply {r:?}"),
            }
        }
    };
    read_until(&mut c, &mut frames, 40);
    let (st, _, _) = c.request("PAUSE", &url, &format!("Session: {session}\r\n"));
    assert_eq!(st, 200);
    frames.append(&mut c.frames);
    let before = frames.len();
    let (st, head, _) = c.request("PLAY", &url, &format!("Session: {session}\r\n"));
    assert_eq!(st, 200, "{head}");
    frames.append(&mut c.frames);
    read_until(&mut c, &mut frames, before + 80);
    for ch in [0u8, 2] {
        let rtp: Vec<(u16, u32)> = frames
            .iter()
            .filter(|f| f.0 == ch)
            .map(|(_, p)| {
                (
                    u16::from_be_bytes([p[2], p[3]]),
                    u32::from_be_bytes([p[4], p[5], p[6], p[7]]),
                )
            })
            .collect();
        assert!(rtp.len() > 10, "channel {ch}: {} packets", rtp.len());
        for w in rtp.windows(2) {
            assert_eq!(
                w[1].0,
                w[0].0.wrapping_add(1),
                "channel {ch}: a gap or repeat"
            );
        }
        if ch == 2 {
            // AAC: one access unit per packet, presentation order.
            assert!(
                rtp.windows(2)
                    .all(|w| w[1].1.wrapping_sub(w[0].1) < 1 << 31)
            );
        }
    }
    let (st, _, _) = c.request("TEARDOWN", &url, &format!("Session: {session}\r\n"));
    assert_eq!(st, 200);
}

/// GStreamer (`rtspsrc`, both tracks decoded) and mpv play the clip to its end and exit by
/// themselves.
#[test]
fn gstreamer_and_mpv_play_it_to_the_end() {
    if !have("gst-launch-1.0") || !have("mpv") {
        return;
    }
    let s = serve();
    let url = s.url("clip.mp4");
    let mut gst = Command::new("gst-launch-1.0");
    gst.arg("rtspsrc")
        .arg(format!("location={url}"))
        .args(["name=s", "s.", "!", "decodebin", "!", "fakesink"])
        .args(["s.", "!", "decodebin", "!", "fakesink"]);
    let (ok, out, err) = run(gst, Duration::from_secs(120));
    assert!(
        ok && out.contains("Got EOS"),
        "gst-launch-1.0: {out}\n{err}"
    );
    let mut mpv = Command::new("mpv");
    mpv.args([
        "--no-config",
        "--vo=null",
        "--ao=null",
        "--msg-level=all=warn",
    ])
    .arg(&url);
    let (ok, out, err) = run(mpv, Duration::from_secs(120));
    assert!(ok, "mpv: {out}\n{err}");
}

/// H.265 (RFC 7798, `sprop-vps/sps/pps` from the hvcC): the decoded frames over TCP are the
/// file's. Skipped where ffmpeg has no libx265.
#[test]
fn an_h265_mp4_decodes_as_the_file() {
    if !have("ffmpeg") {
        return;
    }
    let enc = Command::new("ffmpeg")
        .args(["-hide_banner", "-encoders"])
        .output()
        .expect("ffmpeg");
    if !String::from_utf8_lossy(&enc.stdout).contains("libx265") {
        eprintln!("SKIP: this ffmpeg has no libx265");
        return;
    }
    let s = serve();
    let path = s.path("hevc.mp4");
    let o = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y"])
        .args(["-f", "lavfi", "-i", "testsrc=size=320x240:rate=25"])
        .args(["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000"])
        .args(["-t", "4", "-c:v", "libx265", "-preset", "ultrafast"])
        .args([
            "-x265-params",
            "log-level=error:keyint=25:min-keyint=25:scenecut=0:open-gop=0",
            "-tag:v",
            "hvc1",
            "-c:a",
            "aac",
        ])
        .arg(&path)
        .output()
        .expect("ffmpeg");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let want = framemd5(path.to_str().unwrap(), "v", None);
    let got = framemd5(&s.url("hevc.mp4"), "v", Some("tcp"));
    same_but_the_last(&got, &want, "hevc.mp4 video frames");
}

/// Standard base64 (the SDP's `sprop-parameter-sets`), for the test only.
fn base64_decode(s: &str) -> Vec<u8> {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes().filter(|&c| c != b'=') {
        let v = A.iter().position(|&a| a == c).expect("base64") as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// One access unit as received: its RTP timestamp, its packets' sequence numbers and its
/// NAL units (single NAL unit packets, STAP-A and FU-A undone; an FU-A left unfinished
/// fails the test).
#[derive(Debug)]
struct AccessUnit {
    ts: u32,
    seqs: Vec<u16>,
    nals: Vec<Vec<u8>>,
}

/// The access units of H.264 RTP packets (RFC 6184), each ended by the marker bit.
fn access_units(packets: &[Vec<u8>]) -> Vec<AccessUnit> {
    let mut out = Vec::new();
    let mut cur: Option<AccessUnit> = None;
    let mut fu: Option<Vec<u8>> = None;
    for p in packets {
        let ts = u32::from_be_bytes([p[4], p[5], p[6], p[7]]);
        let seq = u16::from_be_bytes([p[2], p[3]]);
        let au = cur.get_or_insert_with(|| AccessUnit {
            ts,
            seqs: Vec::new(),
            nals: Vec::new(),
        });
        assert_eq!(au.ts, ts, "one access unit, one timestamp");
        au.seqs.push(seq);
        let payload = &p[12..];
        match payload[0] & 0x1f {
            24 => {
                let mut at = 1;
                while at + 2 <= payload.len() {
                    let n = usize::from(u16::from_be_bytes([payload[at], payload[at + 1]]));
                    au.nals.push(payload[at + 2..at + 2 + n].to_vec());
                    at += 2 + n;
                }
                assert_eq!(at, payload.len(), "a STAP-A's sizes add up");
            }
            28 => {
                let (start, end) = (payload[1] & 0x80 != 0, payload[1] & 0x40 != 0);
                if start {
                    assert!(fu.is_none(), "an FU-A started inside another");
                    fu = Some(vec![(payload[0] & 0xe0) | (payload[1] & 0x1f)]);
                }
                fu.as_mut()
                    .expect("an FU-A continued without its start")
                    .extend_from_slice(&payload[2..]);
                if end {
                    au.nals.push(fu.take().unwrap());
                }
            }
            _ => au.nals.push(payload.to_vec()),
        }
        if p[1] & 0x80 != 0 {
            assert!(fu.is_none(), "an access unit ended inside an FU-A");
            out.push(cur.take().unwrap());
        }
    }
    out
}

/// The (size, md5) of each picture ffmpeg decodes from an H.264 elementary stream.
fn decode_annex_b(path: &Path) -> Vec<(String, String)> {
    let mut c = Command::new("ffmpeg");
    c.args(["-hide_banner", "-loglevel", "error", "-nostdin"])
        .args(["-f", "h264", "-i"])
        .arg(path)
        .args(["-f", "framemd5", "-"]);
    let (ok, out, err) = run(c, Duration::from_secs(60));
    assert!(ok, "ffmpeg: {err}");
    md5s(&out)
}

/// Trick play (issue 36, docs/rtsp.md "MP4 files"): `Scale: -4` from 11.9 s sends the
/// clip's key frames at 10, 8, …, 0 s — each a whole access unit with an IDR slice, in
/// decreasing decode order (decoded, they are the file's key frames reversed), RTP times
/// advancing by 2 s / 4 each, no audio; `Scale: 2` from 6 s sends 6, 8, 10 s, 1 s apart;
/// slow motion and scale 0 are 451; a PLAY without Scale is at scale 1 again, audio and all.
#[test]
fn reverse_and_fast_forward_send_the_key_frames_in_order() {
    if !have("ffmpeg") {
        return;
    }
    let s = serve();
    let url = s.url("clip.mp4");
    let mut c = Client::connect(s.rtsp);
    let (st, _, sdp) = c.request("DESCRIBE", &url, "Accept: application/sdp\r\n");
    assert_eq!(st, 200);
    let sprop = sdp
        .split("sprop-parameter-sets=")
        .nth(1)
        .unwrap()
        .split([';', '\r', '\n'])
        .next()
        .unwrap();
    let mut parameter_sets = Vec::new();
    for set in sprop.split(',') {
        parameter_sets.extend_from_slice(&[0, 0, 0, 1]);
        parameter_sets.extend(base64_decode(set));
    }
    let (st, head, _) = c.request(
        "SETUP",
        &format!("{url}/trackID=1"),
        "Transport: RTP/AVP/TCP;unicast;interleaved=0-1\r\n",
    );
    assert_eq!(st, 200, "{head}");
    let session = session_of(&head);
    let (st, head, _) = c.request(
        "SETUP",
        &format!("{url}/trackID=2"),
        &format!("Transport: RTP/AVP/TCP;unicast;interleaved=2-3\r\nSession: {session}\r\n"),
    );
    assert_eq!(st, 200, "{head}");
    for bad in ["0.5", "0"] {
        let (st, _, body) = c.request(
            "PLAY",
            &url,
            &format!("Session: {session}\r\nScale: {bad}\r\n"),
        );
        assert_eq!(st, 451, "Scale {bad}: {body}");
    }
    // Reads the video packets of `n` access units (and counts the audio ones meanwhile).
    let read_units = |c: &mut Client, n: usize| -> (Vec<AccessUnit>, usize) {
        let mut video = Vec::new();
        let mut audio = 0;
        let mut frames = std::mem::take(&mut c.frames).into_iter();
        let deadline = Instant::now() + Duration::from_secs(20);
        while video.iter().filter(|p: &&Vec<u8>| p[1] & 0x80 != 0).count() < n {
            assert!(
                Instant::now() < deadline,
                "{} packets by the deadline",
                video.len()
            );
            let (ch, p) = match frames.next() {
                Some(f) => f,
                None => match c.next() {
                    Ok(f) => f,
                    Err(r) => panic!("unexpected reply {r:?}"),
                },
            };
            match ch {
                0 => video.push(p),
                2 => audio += 1,
                _ => {}
            }
        }
        (access_units(&video), audio)
    };
    let (st, head, _) = c.request(
        "PLAY",
        &url,
        &format!("Session: {session}\r\nRange: npt=11.900-\r\nScale: -4\r\n"),
    );
    assert_eq!(st, 200, "{head}");
    assert_eq!(header(&head, "Scale"), Some("-4"), "{head}");
    let info = header(&head, "RTP-Info").unwrap().to_string();
    let rtptime: u32 = info
        .split(',')
        .next()
        .and_then(|i| i.split("rtptime=").nth(1))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let (units, audio) = read_units(&mut c, 6);
    assert_eq!(audio, 0, "audio during trick play");
    assert_eq!(units.len(), 6, "{units:?}");
    assert_eq!(units[0].ts, rtptime, "{info}");
    let seqs: Vec<u16> = units.iter().flat_map(|u| u.seqs.clone()).collect();
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0].wrapping_add(1)),
        "sequence numbers run on"
    );
    for (i, w) in units.windows(2).enumerate() {
        // 2 s of media at scale 4: 0.5 s, 45000 ticks at 90 kHz, forward.
        let d = w[1].ts.wrapping_sub(w[0].ts);
        assert!((44_900..=45_100).contains(&d), "unit {i} to {}: {d}", i + 1);
    }
    let mut es = Vec::new();
    for (i, u) in units.iter().enumerate() {
        assert!(
            u.nals.iter().any(|n| n[0] & 0x1f == 5),
            "unit {i}: no IDR slice"
        );
        assert!(
            u.nals.iter().all(|n| matches!(n[0] & 0x1f, 5..=9)),
            "unit {i}: a non-IDR slice in a key frame"
        );
        es.extend_from_slice(&parameter_sets);
        for n in &u.nals {
            es.extend_from_slice(&[0, 0, 0, 1]);
            es.extend_from_slice(n);
        }
    }
    let h264 = s.path("reverse.h264");
    std::fs::write(&h264, &es).unwrap();
    let got = decode_annex_b(&h264);
    let clip = clip();
    let mut want = {
        let mut c = Command::new("ffmpeg");
        c.args(["-hide_banner", "-loglevel", "error", "-nostdin"])
            .args(["-skip_frame", "nokey", "-i"])
            .arg(&clip)
            .args(["-map", "0:v", "-f", "framemd5", "-"]);
        let (ok, out, err) = run(c, Duration::from_secs(60));
        assert!(ok, "{err}");
        md5s(&out)
    };
    assert_eq!(want.len(), 6);
    want.reverse();
    assert_eq!(got, want, "the key frames, last first");
    // Fast forward from 6 s: the key frames at 6, 8 and 10 s, one a second.
    let (st, head, _) = c.request(
        "PLAY",
        &url,
        &format!("Session: {session}\r\nRange: npt=6.000-\r\nScale: 2\r\n"),
    );
    assert_eq!(st, 200, "{head}");
    assert_eq!(header(&head, "Scale"), Some("2"), "{head}");
    let (units, audio) = read_units(&mut c, 3);
    assert_eq!(audio, 0);
    assert_eq!(units.len(), 3);
    for w in units.windows(2) {
        let d = w[1].ts.wrapping_sub(w[0].ts);
        assert!((89_900..=90_100).contains(&d), "{d}");
    }
    let mut es = Vec::new();
    for u in &units {
        es.extend_from_slice(&parameter_sets);
        for n in &u.nals {
            es.extend_from_slice(&[0, 0, 0, 1]);
            es.extend_from_slice(n);
        }
    }
    std::fs::write(&h264, &es).unwrap();
    want.reverse();
    assert_eq!(
        decode_annex_b(&h264),
        want[3..6],
        "the key frames at 6, 8, 10 s"
    );
    // A PLAY without Scale: scale 1 again, from the start, audio too.
    let (st, head, _) = c.request(
        "PLAY",
        &url,
        &format!("Session: {session}\r\nRange: npt=0-\r\n"),
    );
    assert_eq!(st, 200, "{head}");
    assert_eq!(header(&head, "Scale"), Some("1"), "{head}");
    let (_, audio) = read_units(&mut c, 10);
    assert!(audio > 0, "no audio at scale 1");
    let (st, _, _) = c.request("TEARDOWN", &url, &format!("Session: {session}\r\n"));
    assert_eq!(st, 200);
}

/// SETUP of both tracks of clip.mp4 over one interleaved connection: the session id, or the
/// refusal (status, body).
fn setup_both(c: &mut Client, url: &str) -> Result<String, (u16, String)> {
    let (st, head, body) = c.request(
        "SETUP",
        &format!("{url}/trackID=1"),
        "Transport: RTP/AVP/TCP;unicast;interleaved=0-1\r\n",
    );
    if st != 200 {
        return Err((st, body));
    }
    let session = session_of(&head);
    let (st, head, _) = c.request(
        "SETUP",
        &format!("{url}/trackID=2"),
        &format!("Transport: RTP/AVP/TCP;unicast;interleaved=2-3\r\nSession: {session}\r\n"),
    );
    assert_eq!(st, 200, "{head}");
    Ok(session)
}

/// A paused MP4 session gives its admission reservation back after `pause_hold_ms` (issue
/// 36): with room for one session's rate, a second client refused while the first plays
/// sets up once the first has been paused past the hold; the first's PLAY is then refused
/// (453, admission's reason) and, once the second is torn down, admitted again — resuming
/// where it paused (Range past the start, video numbering going on).
#[test]
fn a_paused_mp4_session_gives_its_reservation_back_and_play_takes_it_again() {
    let s = serve_with(
        "pause_hold = \"300ms\"\nsession_timeout = \"60s\"",
        PAUSE_TEST_NET_BYTES_PER_S,
    );
    let url = s.url("clip.mp4");
    let mut a = Client::connect(s.rtsp);
    let a_id = setup_both(&mut a, &url).expect("the first session fits");
    let (st, head, _) = a.request("PLAY", &url, &format!("Session: {a_id}\r\n"));
    assert_eq!(st, 200, "{head}");
    // Some packets, then PAUSE.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut video = Vec::new();
    while video.len() < 20 {
        assert!(Instant::now() < deadline);
        match a.next() {
            Ok((0, p)) => video.push(p),
            Ok(_) => {}
            Err(r) => panic!("unexpected reply {r:?}"),
        }
    }
    let mut b = Client::connect(s.rtsp);
    let (st, body) = setup_both(&mut b, &url).expect_err("no room for a second session");
    assert_eq!(st, 453, "{body}");
    assert!(body.contains("admission refused"), "{body}");
    let (st, _, _) = a.request("PAUSE", &url, &format!("Session: {a_id}\r\n"));
    assert_eq!(st, 200);
    video.extend(a.frames.drain(..).filter(|f| f.0 == 0).map(|f| f.1));
    let last_seq = video
        .iter()
        .map(|p| u16::from_be_bytes([p[2], p[3]]))
        .next_back()
        .unwrap();
    // B sets up once A's reservation is back (A kept alive meanwhile).
    let deadline = Instant::now() + Duration::from_secs(30);
    let b_id = loop {
        let (st, _, _) = a.request("GET_PARAMETER", &url, &format!("Session: {a_id}\r\n"));
        assert_eq!(st, 200);
        match setup_both(&mut b, &url) {
            Ok(id) => break id,
            Err((453, _)) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100))
            }
            Err(e) => panic!("the paused session's reservation never came back: {e:?}"),
        }
    };
    // A's PLAY asks admission afresh: refused while B holds the room, the session kept.
    let (st, _, body) = a.request("PLAY", &url, &format!("Session: {a_id}\r\n"));
    assert_eq!(st, 453, "{body}");
    assert!(body.contains("admission refused"), "{body}");
    let (st, _, _) = b.request("TEARDOWN", &url, &format!("Session: {b_id}\r\n"));
    assert_eq!(st, 200);
    let (st, head, _) = a.request("PLAY", &url, &format!("Session: {a_id}\r\n"));
    assert_eq!(st, 200, "{head}");
    let from: f64 = header(&head, "Range")
        .and_then(|r| r.strip_prefix("npt="))
        .and_then(|r| r.split('-').next())
        .unwrap()
        .parse()
        .unwrap();
    assert!(from > 0.0, "resumed from the start: {head}");
    let info = header(&head, "RTP-Info").unwrap();
    let seq: u16 = info
        .split("seq=")
        .nth(1)
        .and_then(|v| v.split([';', ',']).next())
        .unwrap()
        .parse()
        .unwrap();
    // Numbering goes on (packets sent before PAUSE may still have been on their way).
    assert!(
        (1..1000).contains(&seq.wrapping_sub(last_seq)),
        "seq {seq} after {last_seq}: {info}"
    );
    let (st, _, _) = a.request("TEARDOWN", &url, &format!("Session: {a_id}\r\n"));
    assert_eq!(st, 200);
}

/// Admission's network rate for the pause test: room for one session of clip.mp4 (its unit
/// plan's rate), not two.
const PAUSE_TEST_NET_BYTES_PER_S: u64 = 100_000;
