//! `penstock serve`'s RTSP server as players use it (issue 15, item 3): the built binary
//! serving a 30-second MPEG-2 TS clip made by ffmpeg, real players (ffprobe, ffmpeg over UDP
//! and TCP, GStreamer's rtspsrc, VLC) and a scripted client written here, all on loopback.
//!
//! What is compared, and why (docs/rtsp.md, "What clients get"):
//! - GStreamer's `rtspsrc ! rtpmp2tdepay ! filesink` writes the RTP payloads as they came:
//!   the file must be the source, byte for byte.
//! - ffmpeg `-c copy -f mpegts` *remuxes*: it writes its own PAT/PMT, continuity counters and
//!   PCR cadence, so whole files cannot match. Its video PID's packets pass through
//!   unchanged, and are compared: every video packet of the source up to the start of the
//!   last PES must come out identical and in order. The last PES (one frame) is held by
//!   ffmpeg's RTP MPEG-TS parser and never flushed at the end of the stream (the same
//!   remux from the file keeps it); that tail is the one difference allowed.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_penstock");
/// The clip's length (the command: 30 s).
const CLIP_S: u32 = 30;
const TS: usize = 188;
const VIDEO_PID: u16 = 0x100;

/// The 30-second clip, made once per test binary (ffmpeg, or `None`: SKIPPED, counted).
fn clip() -> Option<&'static Path> {
    static CLIP: OnceLock<Option<PathBuf>> = OnceLock::new();
    CLIP.get_or_init(|| common::mpeg2_ts_clip("rtsp", CLIP_S))
        .as_deref()
}

const CONTROL_TOKEN: &str = "rtsp-test-token-rtsp-test-token";

/// The tests that measure timing or packet counts against real players, and the one that
/// pushes 5 MB/s through loopback, one at a time: on 2 CPUs one beside another was noise in
/// both (a GStreamer player short of packets, a pause's tail late).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// A running `penstock serve` with the clip in its root.
struct Served {
    child: Child,
    http: String,
    control: String,
    rtsp: SocketAddr,
    dir: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let _ = self.child.wait();
        let _ = std::fs::remove_file(self.log_path());
    }
}

impl Served {
    fn url(&self, path: &str) -> String {
        format!("rtsp://{}/{path}", self.rtsp)
    }

    fn log_path(&self) -> PathBuf {
        std::env::temp_dir().join(format!(
            "penstock-rtsp-serve-{}-{}.log",
            std::process::id(),
            self.dir.path().file_name().unwrap().to_string_lossy()
        ))
    }

    /// The server's debug log's RTSP lines so far.
    fn log(&self) -> String {
        std::fs::read_to_string(self.log_path())
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("rtsp"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The control protocol's `STATE *` lines after `AUTH`.
    fn state_all(&self) -> Vec<String> {
        use std::io::BufRead;
        let mut s = TcpStream::connect(&self.control).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(format!("AUTH {CONTROL_TOKEN}\nSTATE *\n").as_bytes())
            .unwrap();
        let mut r = std::io::BufReader::new(s);
        let mut lines = Vec::new();
        loop {
            let mut l = String::new();
            if r.read_line(&mut l).unwrap() == 0 {
                break;
            }
            let l = l.trim_end().to_string();
            if l.starts_with("211 end") {
                break;
            }
            if let Some(x) = l.strip_prefix("211-") {
                lines.push(x.to_string());
            }
        }
        lines
    }

    fn metrics(&self) -> String {
        common::scrape(&self.http).expect("GET /metrics")
    }

    fn metric(&self, series: &str) -> f64 {
        common::sample(&self.metrics(), series).unwrap_or(0.0)
    }

    /// Waits until `series` is `want` (true) or `deadline` passes (false).
    fn wait_metric(&self, series: &str, want: f64, deadline: Duration) -> bool {
        let t0 = Instant::now();
        while t0.elapsed() < deadline {
            if self.metric(series) == want {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }
}

fn serve(clip: &Path, rtsp_extra: &str) -> Served {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(clip, dir.path().join("clip.ts")).unwrap();
    let conf = dir.path().join("penstock.toml");
    // Admission's figures are set, never measured here: whether players play must not
    // depend on what the machine was doing when a self-calibration ran (under a loaded CI
    // a measured send cost refused the 6th session). Tests of admission set their own.
    let admission = if rtsp_extra.contains("[admission]") {
        ""
    } else {
        "[admission]\nself_calibrate = false\ndisk_seq_bytes_per_s = 1000000000\n\
         disk_random_iops = 100000\nnet_bytes_per_s = 1250000000\ncpu_send_ns = 5000\n\
         cpu_send_byte_ps = 500\n"
    };
    // A test that reads the access log names its own `[log]`.
    let log = if rtsp_extra.contains("[log]") {
        ""
    } else {
        "[log]\naccess = \"off\"\n"
    };
    std::fs::write(
        &conf,
        format!(
            "[http]\nlisten = \"127.0.0.1:0\"\n[control]\nlisten = \"127.0.0.1:0\"\ntoken = \"{CONTROL_TOKEN}\"\n{log}[rtsp]\nlisten = \"127.0.0.1:0\"\n{rtsp_extra}{admission}"
        ),
    )
    .unwrap();
    // The server's debug log, for failure messages (`Served::log`).
    let log = std::fs::File::create(std::env::temp_dir().join(format!(
        "penstock-rtsp-serve-{}-{}.log",
        std::process::id(),
        dir.path().file_name().unwrap().to_string_lossy()
    )))
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--no-control-unix", "--config"])
        .arg(&conf)
        .arg(dir.path())
        .env("PENSTOCK_LOG", "penstock_server=debug")
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let line = common::start_line(&mut child);
    let (http, control) = common::serve_addresses(&line);
    let control = control.expect("a control address");
    let rtsp = line
        .split("rtsp://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("no rtsp address in {line:?}"))
        .parse()
        .unwrap();
    Served {
        child,
        http,
        control,
        rtsp,
        dir,
    }
}

fn pid(p: &[u8]) -> u16 {
    (u16::from(p[1] & 0x1f) << 8) | u16::from(p[2])
}

/// The PCR of a TS packet, in 27 MHz ticks.
fn pcr(p: &[u8]) -> Option<u64> {
    if p[3] & 0x20 == 0 || p[4] < 7 || p[5] & 0x10 == 0 {
        return None;
    }
    let b = &p[6..12];
    let base = (u64::from(b[0]) << 25)
        | (u64::from(b[1]) << 17)
        | (u64::from(b[2]) << 9)
        | (u64::from(b[3]) << 1)
        | (u64::from(b[4]) >> 7);
    let ext = (u64::from(b[4] & 1) << 8) | u64::from(b[5]);
    Some(base * 300 + ext)
}

fn video_packets(ts: &[u8]) -> Vec<&[u8]> {
    ts.chunks_exact(TS)
        .filter(|p| pid(p) == VIDEO_PID)
        .collect()
}

/// ffmpeg's remux against the source (module doc): the number of video packets that came
/// out identical, in order, and the index of the source's last PES start.
fn ffmpeg_video_match(src: &[u8], out: &[u8]) -> (usize, usize, usize) {
    let a = video_packets(src);
    let b = video_packets(out);
    let same = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let last_pes = a.iter().rposition(|p| p[1] & 0x40 != 0).unwrap();
    (same, b.len(), last_pes)
}

/// A player run as a child with a time limit: (exit success, elapsed).
fn run_player(mut cmd: Command, limit: Duration) -> (bool, Duration, String) {
    let t0 = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn player");
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let mut out = child.stdout.take().unwrap();
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let log = reader.join().unwrap() + &out_reader.join().unwrap();
            return (st.success(), t0.elapsed(), log);
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return (false, t0.elapsed(), "killed at the time limit".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Real players, all at once on one server: ffprobe identifies the stream; ffmpeg and
/// GStreamer over UDP and over TCP (interleaved) play it to its end and exit by themselves (the RTCP BYE),
/// with the bytes the module doc says.
#[test]
fn players_play_the_clip_to_its_end() {
    let _serial = serial();
    let Some(clip) = clip() else { return };
    let src = std::fs::read(clip).unwrap();
    let s = serve(clip, "");
    let url = s.url("clip.ts");
    // Ended by the BYE, not by a client timeout: the clip's length plus a margin.
    let limit = Duration::from_secs(u64::from(CLIP_S) + 20);
    let out = |n: &str| s.dir.path().join(n);
    let mut players: Vec<(&str, Command, Option<PathBuf>)> = Vec::new();
    if penstock_testreq::require("ffmpeg") {
        for transport in ["udp", "tcp"] {
            let mut c = Command::new("ffmpeg");
            c.args(["-hide_banner", "-loglevel", "error", "-y"])
                .args(["-rtsp_transport", transport, "-i", &url])
                .args(["-c", "copy", "-f", "mpegts"])
                .arg(out(&format!("ffmpeg-{transport}.ts")));
            let name = if transport == "udp" {
                "ffmpeg-udp"
            } else {
                "ffmpeg-tcp"
            };
            players.push((name, c, Some(out(&format!("ffmpeg-{transport}.ts")))));
        }
    }
    if penstock_testreq::require("gst-launch-1.0") {
        for (name, protocols) in [("gst-udp", "udp"), ("gst-tcp", "tcp")] {
            let mut c = Command::new("gst-launch-1.0");
            c.args(["-q", "rtspsrc", &format!("protocols={protocols}")])
                .args([&format!("location={url}"), "!", "rtpmp2tdepay"])
                .args(["!", "filesink"])
                .arg(format!("location={}", out(&format!("{name}.ts")).display()));
            players.push((name, c, Some(out(&format!("{name}.ts")))));
        }
    }
    // No VLC here: Debian's VLC has no live555 RTSP access (only `access_realrtsp`, for
    // RealServer), so it opens no `rtsp://` URL, and `cvlc --play-and-exit` exits 0 all the
    // same — a player that could never fail this test (docs/rtsp.md, "Tested").
    let probe = if penstock_testreq::require("ffprobe") {
        let mut c = Command::new("ffprobe");
        c.args(["-v", "error", "-show_streams", &url]);
        Some(c)
    } else {
        None
    };
    let plays = players.len();
    let handles: Vec<_> = players
        .into_iter()
        .map(|(name, cmd, file)| {
            (
                name,
                file,
                std::thread::spawn(move || run_player(cmd, limit)),
            )
        })
        .collect();
    if let Some(c) = probe {
        let (ok, _, log) = run_player(c, Duration::from_secs(20));
        assert!(ok, "ffprobe: {log}");
        assert!(log.contains("codec_name=mpeg2video"), "ffprobe: {log}");
        assert!(log.contains("codec_type=video"), "ffprobe: {log}");
    }
    for (name, file, h) in handles {
        let (ok, elapsed, log) = h.join().unwrap();
        // GStreamer's own PAUSE-at-EOS race (`common::gst_teardown_race`) is no failure of
        // the server's: the bytes it wrote are still checked below, every one.
        let race = !ok && name.starts_with("gst") && common::gst_teardown_race(&log);
        assert!(
            ok || race,
            "{name} failed after {elapsed:?}: {log}\nserver log:\n{}",
            s.log()
        );
        if race {
            println!(
                "{name}: exited 1 after {:.1} s by GStreamer's PAUSE-at-EOS race: {log}",
                elapsed.as_secs_f64()
            );
        } else {
            println!("{name}: exited 0 after {:.1} s", elapsed.as_secs_f64());
        }
        let Some(file) = file else { continue };
        let got = std::fs::read(&file).unwrap();
        if name.starts_with("gst") {
            assert!(
                got == src,
                "gst: {} bytes, not the source's {}",
                got.len(),
                src.len()
            );
        } else {
            let (same, out_video, last_pes) = ffmpeg_video_match(&src, &got);
            println!(
                "{name}: {same} of its {out_video} video packets identical to the source's, whose last PES starts at packet {last_pes}"
            );
            assert_eq!(same, out_video, "{name}: a video packet differs");
            assert_eq!(
                same, last_pes,
                "{name}: video packets missing before the last PES"
            );
        }
    }
    // Every player's sessions were played.
    let played = common::sample(
        &s.metrics(),
        "penstock_rtsp_requests_total{method=\"PLAY\",code=\"200\"}",
    )
    .unwrap_or(0.0);
    assert!(
        played >= plays as f64,
        "{played} PLAYs answered 200 for {plays} players"
    );
    // The sessions' units in the rt lateness histogram, and the players' RTCP receiver
    // reports (loss, jitter) counted per class.
    let page = s.metrics();
    let value = |series: &str| common::sample(&page, series).unwrap_or(0.0);
    let units = value("penstock_stream_lateness_seconds_count{class=\"rt\"}");
    let reports = value("penstock_rtcp_receiver_reports_total{class=\"rt\"}");
    let jitters = value("penstock_rtcp_jitter_seconds_count{class=\"rt\"}");
    println!("rt lateness: {units} units; RTCP: {reports} receiver reports");
    assert!(units >= 927.0, "{units} units in the rt lateness histogram");
    assert!(
        reports > 0.0 && jitters == reports,
        "{reports} reports, {jitters} jitters"
    );
}

/// The scripted client's view of a reply.
#[derive(Debug)]
struct Reply {
    status: u16,
    head: String,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

struct Client {
    s: TcpStream,
    cseq: u32,
    buf: Vec<u8>,
}

impl Client {
    fn connect(addr: SocketAddr) -> Client {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Client {
            s,
            cseq: 0,
            buf: Vec::new(),
        }
    }

    fn raw(&mut self, bytes: &[u8]) -> Option<Reply> {
        self.s.write_all(bytes).ok()?;
        self.reply()
    }

    fn reply(&mut self) -> Option<Reply> {
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.buf[..end]).into_owned();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("Content-Length: "))
                    .map_or(0, |v| v.trim().parse().unwrap());
                if self.buf.len() >= end + 4 + len {
                    let body =
                        String::from_utf8_lossy(&self.buf[end + 4..end + 4 + len]).into_owned();
                    self.buf.drain(..end + 4 + len);
                    let status = head.split(' ').nth(1)?.parse().ok()?;
                    return Some(Reply { status, head, body });
                }
            }
            let mut b = [0u8; 4096];
            let n = self.s.read(&mut b).ok()?;
            if n == 0 {
                return None;
            }
            self.buf.extend_from_slice(&b[..n]);
        }
    }

    fn request(&mut self, method: &str, url: &str, headers: &[(&str, &str)]) -> Reply {
        self.cseq += 1;
        let mut t = format!("{method} {url} RTSP/1.0\r\nCSeq: {}\r\n", self.cseq);
        for (n, v) in headers {
            t += &format!("{n}: {v}\r\n");
        }
        t += "\r\n";
        let r = self.raw(t.as_bytes()).expect("a reply");
        assert_eq!(
            r.header("CSeq"),
            Some(self.cseq.to_string().as_str()),
            "{r:?}"
        );
        r
    }
}

/// A UDP receiver: an RTP socket on an even port and RTCP on the next.
struct Receiver {
    rtp: UdpSocket,
    rtcp: UdpSocket,
}

impl Receiver {
    fn new() -> Receiver {
        for _ in 0..100 {
            let rtp = UdpSocket::bind("127.0.0.1:0").unwrap();
            let p = rtp.local_addr().unwrap().port();
            if !p.is_multiple_of(2) || p == u16::MAX {
                continue;
            }
            if let Ok(rtcp) = UdpSocket::bind(("127.0.0.1", p + 1)) {
                rtp.set_read_timeout(Some(Duration::from_millis(200)))
                    .unwrap();
                rtcp.set_nonblocking(true).unwrap();
                return Receiver { rtp, rtcp };
            }
        }
        panic!("no free port pair");
    }

    fn transport(&self) -> String {
        let p = self.rtp.local_addr().unwrap().port();
        format!("RTP/AVP;unicast;client_port={}-{}", p, p + 1)
    }

    /// Packets (sequence, timestamp, payload) arriving within `d`.
    fn take(&self, d: Duration) -> Vec<(u16, u32, Vec<u8>)> {
        let t0 = Instant::now();
        let mut v = Vec::new();
        let mut b = [0u8; 2048];
        while t0.elapsed() < d {
            if let Ok(n) = self.rtp.recv(&mut b) {
                let (h, payload) = penstock_core::rtp::RtpHeader::parse(&b[..n]).unwrap();
                v.push((h.sequence, h.timestamp, payload.to_vec()));
            }
        }
        v
    }
}

fn session_id(r: &Reply) -> String {
    r.header("Session")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string()
}

fn rtp_info(r: &Reply) -> (u16, u32) {
    let v = r
        .header("RTP-Info")
        .unwrap_or_else(|| panic!("no RTP-Info: {r:?}"));
    let field = |k: &str| {
        v.split(';')
            .find_map(|f| f.strip_prefix(k))
            .unwrap_or_else(|| panic!("{k} in {v}"))
            .to_string()
    };
    (
        field("seq=").parse().unwrap(),
        field("rtptime=").parse().unwrap(),
    )
}

/// Seeking, pausing and resuming, tearing down — checked on the packets themselves.
#[test]
fn seek_pause_resume_and_teardown_as_a_scripted_client_sees_them() {
    let _serial = serial();
    let Some(clip) = clip() else { return };
    let src = std::fs::read(clip).unwrap();
    let first_pcr = src.chunks_exact(TS).find_map(pcr).unwrap();
    let s = serve(clip, "");
    let url = s.url("clip.ts");
    let mut c = Client::connect(s.rtsp);
    let d = c.request("DESCRIBE", &url, &[]);
    assert_eq!(d.status, 200, "{d:?}");
    assert!(d.body.contains("m=video 0 RTP/AVP 33"), "{}", d.body);
    assert!(d.body.contains("a=range:npt=0-30."), "{}", d.body);
    let rx = Receiver::new();
    let setup = c.request(
        "SETUP",
        &format!("{url}/trackID=0"),
        &[("Transport", &rx.transport())],
    );
    assert_eq!(setup.status, 200, "{setup:?}");
    let t = setup.header("Transport").unwrap();
    assert!(t.contains("server_port=") && t.contains("ssrc="), "{t}");
    let id = session_id(&setup);
    assert_eq!(s.metric("penstock_admission_reservations"), 1.0);

    // PLAY from 20 s: the stream starts at the last PCR at or before it, within one GOP (1 s).
    let play = c.request("PLAY", &url, &[("Session", &id), ("Range", "npt=20-")]);
    assert_eq!(play.status, 200, "{play:?}");
    let (seq0, rtptime0) = rtp_info(&play);
    let got = rx.take(Duration::from_millis(1500));
    assert!(got.len() > 10, "{} packets in 1.5 s", got.len());
    assert_eq!(
        (got[0].0, got[0].1),
        (seq0, rtptime0),
        "RTP-Info names the first packet"
    );
    let offset = src
        .windows(got[0].2.len())
        .position(|w| w == got[0].2.as_slice())
        .expect("the first payload is source bytes");
    let start_pcr = src[offset..]
        .chunks_exact(TS)
        .find_map(pcr)
        .expect("a PCR after the start");
    let start_s = (start_pcr - first_pcr) as f64 / 27e6;
    assert!(
        (19.0..=20.0).contains(&start_s),
        "PLAY npt=20- started at {start_s:.3} s of the media"
    );
    let range = play.header("Range").unwrap();
    let npt_start: f64 = range
        .strip_prefix("npt=")
        .and_then(|r| r.split('-').next())
        .unwrap()
        .parse()
        .unwrap();
    assert!((19.0..=20.0).contains(&npt_start), "{range}");
    // Consecutive packets, consecutive source bytes.
    for w in got.windows(2) {
        assert_eq!(w[1].0, w[0].0.wrapping_add(1));
    }
    let mut next_offset = offset + got.iter().map(|p| p.2.len()).sum::<usize>();

    // PAUSE: nothing more after what was in flight.
    let pause = c.request("PAUSE", &url, &[("Session", &id)]);
    assert_eq!(pause.status, 200, "{pause:?}");
    let tail = rx.take(Duration::from_millis(300));
    next_offset += tail.iter().map(|p| p.2.len()).sum::<usize>();
    let last = tail.last().or(got.last()).unwrap().clone();
    let quiet = rx.take(Duration::from_millis(700));
    assert!(quiet.is_empty(), "{} packets while paused", quiet.len());

    // PLAY without a Range resumes: the numbering and the bytes continue.
    let resume = c.request("PLAY", &url, &[("Session", &id)]);
    assert_eq!(resume.status, 200, "{resume:?}");
    let (seq1, rtptime1) = rtp_info(&resume);
    assert_eq!(
        seq1,
        last.0.wrapping_add(1),
        "RTP-Info after the pause: {resume:?}"
    );
    let more = rx.take(Duration::from_millis(500));
    assert!(!more.is_empty());
    assert_eq!((more[0].0, more[0].1), (seq1, rtptime1));
    assert!(
        rtptime1.wrapping_sub(last.1) < 90_000,
        "rtptime jumped: {} → {rtptime1}",
        last.1
    );
    assert_eq!(
        &src[next_offset..next_offset + more[0].2.len()],
        more[0].2.as_slice(),
        "the first packet after the pause continues the source"
    );
    let ka = c.request("GET_PARAMETER", &url, &[("Session", &id)]);
    assert_eq!(ka.status, 200);
    // The session's engine stream shows in the control protocol's STATE *.
    assert!(s.metric("penstock_engine_buffers{state=\"reserved\"}") > 0.0);
    let state = s.state_all();
    assert!(
        state.iter().any(|l| l
            .starts_with(&format!("rtsp-{id} running path=clip.ts transport=udp"))
            && l.contains(" sent=")),
        "STATE *: {state:?}"
    );

    // TEARDOWN frees the session and its reservation; the id is gone after.
    let down = c.request("TEARDOWN", &url, &[("Session", &id)]);
    assert_eq!(down.status, 200, "{down:?}");
    assert!(s.wait_metric("penstock_rtsp_sessions", 0.0, Duration::from_secs(2)));
    assert!(s.wait_metric(
        "penstock_admission_reservations",
        0.0,
        Duration::from_secs(2)
    ));
    assert!(
        s.wait_metric(
            "penstock_engine_buffers{state=\"reserved\"}",
            0.0,
            Duration::from_secs(2)
        ),
        "the session's pool buffers were not given back"
    );
    let again = c.request("PLAY", &url, &[("Session", &id)]);
    assert_eq!(again.status, 454, "{again:?}");
    assert!(s.state_all().iter().all(|l| !l.starts_with("rtsp-")));
    let _ = rx.take(Duration::from_millis(300));
    assert!(
        rx.take(Duration::from_millis(500)).is_empty(),
        "packets after TEARDOWN"
    );
}

/// The error answers.
#[test]
fn bad_requests_get_their_codes() {
    let Some(clip) = clip() else { return };
    let s = serve(clip, "sessions_max = 1\n");
    std::os::unix::fs::symlink("/etc/passwd", s.dir.path().join("out.ts")).unwrap();
    let url = s.url("clip.ts");
    let mut c = Client::connect(s.rtsp);
    let rx = Receiver::new();
    let tr = rx.transport();
    assert_eq!(c.request("OPTIONS", &url, &[]).status, 200);
    assert_eq!(c.request("DESCRIBE", &s.url("missing.ts"), &[]).status, 404);
    // A symlink out of the root is not followed (openat2 RESOLVE_BENEATH): 404, as missing.
    assert_eq!(c.request("DESCRIBE", &s.url("out.ts"), &[]).status, 404);
    assert_eq!(
        c.request("DESCRIBE", &s.url("../../etc/passwd"), &[])
            .status,
        404
    );
    assert_eq!(c.request("SETUP", &url, &[]).status, 461, "no Transport");
    let mc = c.request(
        "SETUP",
        &url,
        &[("Transport", "RTP/AVP;multicast;port=5000-5001")],
    );
    assert_eq!(mc.status, 461, "{mc:?}");
    assert_eq!(
        c.request("PLAY", &url, &[("Session", "nosuchsession")])
            .status,
        454
    );
    let setup = c.request("SETUP", &url, &[("Transport", &tr)]);
    assert_eq!(setup.status, 200);
    let id = session_id(&setup);
    assert_eq!(
        c.request("PAUSE", &url, &[("Session", &id)]).status,
        455,
        "PAUSE before PLAY"
    );
    // Above scale_max (4 by default): 451 (scale_plays_faster_within_scale_max_and_admission
    // tests the scales served).
    let scale = c.request("PLAY", &url, &[("Session", &id), ("Scale", "9")]);
    assert_eq!(scale.status, 451, "{scale:?}");
    assert!(scale.body.contains("rtsp.scale_max 4"), "{}", scale.body);
    let past = c.request("PLAY", &url, &[("Session", &id), ("Range", "npt=99-")]);
    assert_eq!(past.status, 457, "{past:?}");
    let full = c.request("SETUP", &url, &[("Transport", &tr)]);
    assert_eq!(full.status, 453, "sessions_max 1: {full:?}");
    assert_eq!(c.request("TEARDOWN", &url, &[("Session", &id)]).status, 200);
    // A malformed request: 400, and the connection is closed.
    let r = c.raw(b"PLAY\r\n\r\n").expect("a reply");
    assert_eq!(r.status, 400, "{r:?}");
    assert!(c.reply().is_none(), "the connection stays open after a 400");
    let mut c = Client::connect(s.rtsp);
    let no_cseq = c.raw(b"OPTIONS * RTSP/1.0\r\n\r\n").expect("a reply");
    assert_eq!(no_cseq.status, 400);
}

/// 10,000 SETUPs without PLAY: never more than `sessions_max` sessions, each timed out with
/// its reservation back, and the memory of the process bounded.
#[test]
fn ten_thousand_setups_stay_within_sessions_max_and_time_out() {
    let Some(clip) = clip() else { return };
    // Below what admission alone would allow here, so that the limit tested is this one.
    let max = 10;
    let s = serve(
        clip,
        &format!("sessions_max = {max}\nsession_timeout = \"1s\"\n"),
    );
    let url = s.url("clip.ts");
    let rx = Receiver::new();
    let tr = rx.transport();
    let mut c = Client::connect(s.rtsp);
    let (mut ok, mut full) = (0u32, 0u32);
    let mut rss_after_1000 = 0.0;
    let mut peak = 0.0f64;
    for i in 0..10_000 {
        match c.request("SETUP", &url, &[("Transport", &tr)]).status {
            200 => ok += 1,
            453 => full += 1,
            other => panic!("SETUP {i}: {other}"),
        }
        if i % 500 == 499 {
            let page = s.metrics();
            let n = common::sample(&page, "penstock_rtsp_sessions").unwrap();
            peak = peak.max(n);
            assert!(n <= max as f64, "{n} sessions after {i} SETUPs");
            let rss = common::sample(&page, "process_resident_memory_bytes").unwrap();
            if i == 999 {
                rss_after_1000 = rss;
            }
        }
    }
    let rss_end = common::sample(&s.metrics(), "process_resident_memory_bytes").unwrap();
    println!(
        "10000 SETUPs: {ok} set up, {full} refused at sessions_max {max}; peak {peak} sessions; RSS {:.1} MiB after 1000, {:.1} MiB after 10000",
        rss_after_1000 / 1048576.0,
        rss_end / 1048576.0
    );
    assert!(ok >= max as u32 && full > 0);
    // Memory does not grow with the SETUPs beyond the sessions the limit allows.
    assert!(
        rss_end < rss_after_1000 * 1.5,
        "RSS grew from {rss_after_1000} to {rss_end}"
    );
    // All time out (1 s, swept every 100 ms), their reservations back.
    assert!(s.wait_metric("penstock_rtsp_sessions", 0.0, Duration::from_secs(5)));
    assert!(s.wait_metric(
        "penstock_admission_reservations",
        0.0,
        Duration::from_secs(2)
    ));
    let timed_out = s.metric("penstock_rtsp_sessions_ended_total{reason=\"timeout\"}");
    assert_eq!(timed_out, f64::from(ok));
    // Their places are free again.
    let after = c.request("SETUP", &url, &[("Transport", &tr)]);
    assert_eq!(after.status, 200, "{after:?}");
}

/// A client that vanishes mid-PLAY: over UDP its session ends within the timeout (no request,
/// no receiver report); over TCP with its connection.
#[test]
fn a_client_vanishing_mid_play_ends_its_session() {
    let Some(clip) = clip() else { return };
    let s = serve(clip, "session_timeout = \"2s\"\n");
    let url = s.url("clip.ts");
    {
        let mut c = Client::connect(s.rtsp);
        let rx = Receiver::new();
        let setup = c.request("SETUP", &url, &[("Transport", &rx.transport())]);
        let id = session_id(&setup);
        assert_eq!(c.request("PLAY", &url, &[("Session", &id)]).status, 200);
        assert!(!rx.take(Duration::from_millis(300)).is_empty());
        // Gone: the connection and both sockets closed.
    }
    let t0 = Instant::now();
    assert!(
        s.wait_metric("penstock_rtsp_sessions", 0.0, Duration::from_secs(5)),
        "the UDP session outlived its timeout"
    );
    let gone_after = t0.elapsed();
    assert_eq!(
        s.metric("penstock_rtsp_sessions_ended_total{reason=\"timeout\"}"),
        1.0
    );
    assert!(s.wait_metric(
        "penstock_admission_reservations",
        0.0,
        Duration::from_secs(1)
    ));
    println!(
        "UDP session gone {:.2} s after its client",
        gone_after.as_secs_f64()
    );

    let mut c = Client::connect(s.rtsp);
    let setup = c.request(
        "SETUP",
        &url,
        &[("Transport", "RTP/AVP/TCP;unicast;interleaved=0-1")],
    );
    assert_eq!(setup.status, 200, "{setup:?}");
    let id = session_id(&setup);
    assert_eq!(c.request("PLAY", &url, &[("Session", &id)]).status, 200);
    // Interleaved frames arrive: `$`, channel 0, length, an RTP packet.
    while c.buf.len() < 2 {
        let mut b = [0u8; 4096];
        let n = c.s.read(&mut b).unwrap();
        assert!(n > 0, "the connection closed");
        c.buf.extend_from_slice(&b[..n]);
    }
    assert_eq!((c.buf[0], c.buf[1]), (b'$', 0));
    drop(c);
    assert!(
        s.wait_metric(
            "penstock_rtsp_sessions_ended_total{reason=\"connection_closed\"}",
            1.0,
            Duration::from_secs(2)
        ),
        "the interleaved session outlived its connection"
    );
    assert!(s.wait_metric(
        "penstock_admission_reservations",
        0.0,
        Duration::from_secs(1)
    ));
}

/// At the end of the media the client gets an RTCP BYE (after the last packet), and the
/// session stays, ready to play again.
#[test]
fn the_end_of_the_media_sends_an_rtcp_bye() {
    let Some(clip) = clip() else { return };
    let s = serve(clip, "");
    let url = s.url("clip.ts");
    let mut c = Client::connect(s.rtsp);
    let rx = Receiver::new();
    let setup = c.request("SETUP", &url, &[("Transport", &rx.transport())]);
    let id = session_id(&setup);
    let play = c.request("PLAY", &url, &[("Session", &id), ("Range", "npt=29-")]);
    assert_eq!(play.status, 200, "{play:?}");
    let t0 = Instant::now();
    let mut bye = false;
    let mut packets = 0;
    let mut b = [0u8; 2048];
    while !bye && t0.elapsed() < Duration::from_secs(5) {
        if rx.rtp.recv(&mut b).is_ok() {
            packets += 1;
        }
        while let Ok(n) = rx.rtcp.recv(&mut b) {
            // A compound packet: walk its packets' types (203: BYE).
            let mut at = 0;
            while at + 4 <= n {
                bye |= b[at + 1] == 203;
                at += 4 * (usize::from(u16::from_be_bytes([b[at + 2], b[at + 3]])) + 1);
            }
        }
    }
    assert!(
        bye,
        "no RTCP BYE within 5 s of PLAY npt=29- ({packets} packets)"
    );
    assert!(packets > 0);
    assert_eq!(
        c.request("GET_PARAMETER", &url, &[("Session", &id)]).status,
        200
    );
    let again = c.request("PLAY", &url, &[("Session", &id), ("Range", "npt=29-")]);
    assert_eq!(again.status, 200, "{again:?}");
}

/// Each RTSP session's end is one access-log line in the HTTP lines' combined form: the
/// client, `"PLAY rtsp://…/clip.ts RTSP/1.0"` (SETUP for one never played), 200, the RTP
/// payload bytes it sent (here: every byte the receiver got), the user agent, then `rt=`,
/// `transport=`, `late_p99=` and `end=`.
#[test]
fn each_rtsp_session_is_one_access_log_line_at_its_end() {
    let Some(clip) = clip() else { return };
    let dir = tempfile::tempdir().unwrap();
    let access = dir.path().join("access.log");
    let s = serve(clip, &format!("[log]\naccess = \"{}\"\n", access.display()));
    let url = s.url("clip.ts");
    let mut c = Client::connect(s.rtsp);
    let rx = Receiver::new();
    let ua = ("User-Agent", "penstock-test/1 (\"quoted\")");
    let setup = c.request("SETUP", &url, &[("Transport", &rx.transport()), ua]);
    let id = session_id(&setup);
    let play = c.request("PLAY", &url, &[("Session", &id), ("Range", "npt=29-")]);
    assert_eq!(play.status, 200, "{play:?}");
    let got = take_until_bye(&rx, Duration::from_secs(30));
    let payload: usize = got.iter().map(|p| p.3.len()).sum();
    assert!(payload > 0);
    assert_eq!(c.request("TEARDOWN", &url, &[("Session", &id)]).status, 200);
    // A session set up and torn down unplayed.
    let rx2 = Receiver::new();
    let setup = c.request("SETUP", &url, &[("Transport", &rx2.transport())]);
    let id2 = session_id(&setup);
    assert_eq!(
        c.request("TEARDOWN", &url, &[("Session", &id2)]).status,
        200
    );

    let t0 = Instant::now();
    let lines = loop {
        let text = std::fs::read_to_string(&access).unwrap_or_default();
        let lines: Vec<String> = text
            .lines()
            .filter(|l| l.contains(" RTSP/1.0\""))
            .map(str::to_string)
            .collect();
        if lines.len() >= 2 || t0.elapsed() > Duration::from_secs(30) {
            break lines;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(lines.len(), 2, "{lines:?}");
    println!("{}", lines.join("\n"));
    let played = &lines[0];
    assert!(played.starts_with("127.0.0.1 - - ["), "{played}");
    assert!(
        played.contains(&format!(
            "\"PLAY {url} RTSP/1.0\" 200 {payload} \"-\" \"penstock-test/1 (\\x22quoted\\x22)\" rt="
        )),
        "{played}\n(expected {payload} payload bytes)"
    );
    assert!(played.contains(" transport=udp late_p99=0."), "{played}");
    assert!(played.ends_with(" end=teardown"), "{played}");
    let unplayed = &lines[1];
    assert!(
        unplayed.contains(&format!("\"SETUP {url} RTSP/1.0\" 200 0 \"-\" \"-\" rt=")),
        "{unplayed}"
    );
    assert!(unplayed.contains(" late_p99=- end=teardown"), "{unplayed}");
}

/// Packets (arrival, sequence, timestamp, payload) until the stream's RTCP BYE has come and
/// the RTP socket has been quiet for 300 ms after it (or `limit` in all): the end of the
/// media, however late a loaded machine makes it.
fn take_until_bye(rx: &Receiver, limit: Duration) -> Vec<(Instant, u16, u32, Vec<u8>)> {
    let t0 = Instant::now();
    let mut last = Instant::now();
    let mut bye = false;
    let mut v = Vec::new();
    let mut b = [0u8; 2048];
    while t0.elapsed() < limit && !(bye && last.elapsed() > Duration::from_millis(300)) {
        if let Ok(n) = rx.rtp.recv(&mut b) {
            last = Instant::now();
            let (h, payload) = penstock_core::rtp::RtpHeader::parse(&b[..n]).unwrap();
            v.push((last, h.sequence, h.timestamp, payload.to_vec()));
        }
        while let Ok(n) = rx.rtcp.recv(&mut b) {
            let mut at = 0;
            while at + 4 <= n {
                bye |= b[at + 1] == 203;
                at += 4 * (usize::from(u16::from_be_bytes([b[at + 2], b[at + 3]])) + 1);
            }
        }
    }
    v
}

/// The `npt=` start of a PLAY reply's Range.
fn npt_start(r: &Reply) -> f64 {
    r.header("Range")
        .and_then(|v| v.strip_prefix("npt="))
        .and_then(|v| v.split('-').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no npt Range: {r:?}"))
}

/// Whether a TS packet's adaptation field sets random_access_indicator (a key frame).
fn random_access(p: &[u8]) -> bool {
    p[3] & 0x20 != 0 && p[4] >= 1 && p[5] & 0x40 != 0
}

/// Records `src` with `penstock record` (sent by `penstock stream` at 10 Mbit/s, 1316-byte
/// datagrams) into `rec`, with its tracks beside it.
fn record(src: &Path, rec: &Path) {
    record_with(src, &[rec.as_os_str()]);
}

/// [`record`] into a volume partition `vol:…`, with its tracks at `tracks`.
fn record_into(src: &Path, dst: &str, tracks: &Path) {
    record_with(
        src,
        &[
            std::ffi::OsStr::new(dst),
            std::ffi::OsStr::new("--tracks"),
            tracks.as_os_str(),
        ],
    );
}

fn record_with(src: &Path, dst_args: &[&std::ffi::OsStr]) {
    use std::io::BufRead;
    let mut child = Command::new(BIN)
        .args(["record", "udp-listen://127.0.0.1:0"])
        .args(dst_args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    let addr = first
        .trim()
        .strip_prefix("listening ")
        .unwrap_or_else(|| panic!("penstock record said {first:?}"))
        .to_string();
    let o = Command::new(BIN)
        .arg("stream")
        .arg(src)
        .arg(format!("udp://{addr}"))
        .args(["--rate", "10Mbit/s", "--unit", "1316"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The recorder has read every datagram (its socket's receive queue is empty): a bounded
    // poll, not a fixed wait, before the SIGTERM.
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    common::wait_udp_read(port, &mut child);
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "recorder did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// PLAY `Range: npt=20-` of a recording with its index tracks starts at the frame track's
/// last independent frame at or before 20 s (`seek=track`); the same file without tracks
/// starts at the last key frame at or before it by the file's key-frame index, the one HLS
/// cuts its segments from (`seek=key`).
#[test]
fn play_seeks_by_a_recordings_frame_track_else_by_the_key_frame_index() {
    let Some(clip) = clip() else { return };
    let src = std::fs::read(clip).unwrap();
    let first_pcr = src.chunks_exact(TS).find_map(pcr).unwrap();
    let s = serve(clip, "");
    let rec = s.dir.path().join("rec.ts");
    record(clip, &rec);
    assert!(
        std::fs::read(&rec).unwrap() == src,
        "the recording is the clip, byte for byte"
    );
    // The frame track's entries (datagram indices: datagram n starts at byte 1316·n).
    let o = Command::new(BIN)
        .args(["tracks", rec.to_str().unwrap(), "--track", "frame"])
        .output()
        .unwrap();
    let frames: Vec<usize> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .skip(1)
        .filter_map(|l| l.split(',').next()?.parse().ok())
        .collect();
    assert!(frames.len() >= 25, "a key frame per second: {frames:?}");
    // The media time of byte `offset`: its next PCR's (within a PCR interval).
    let time_at = |offset: usize| {
        let p = src[offset..]
            .chunks_exact(TS)
            .find_map(pcr)
            .expect("a PCR after the start");
        (p - first_pcr) as f64 / 27e6
    };

    for (path, seek) in [("rec.ts", "track"), ("clip.ts", "key")] {
        let url = s.url(path);
        let mut c = Client::connect(s.rtsp);
        let rx = Receiver::new();
        let setup = c.request("SETUP", &url, &[("Transport", &rx.transport())]);
        assert_eq!(setup.status, 200, "{setup:?}");
        let id = session_id(&setup);
        let play = c.request("PLAY", &url, &[("Session", &id), ("Range", "npt=20-")]);
        assert_eq!(play.status, 200, "{play:?}");
        let (seq0, rtptime0) = rtp_info(&play);
        let got = rx.take(Duration::from_millis(800));
        assert!(got.len() > 5, "{path}: {} packets", got.len());
        assert_eq!((got[0].0, got[0].1), (seq0, rtptime0), "{path}: RTP-Info");
        let offset = src
            .windows(got[0].2.len())
            .position(|w| w == got[0].2.as_slice())
            .expect("the first payload is source bytes");
        let start_s = time_at(offset);
        let npt = npt_start(&play);
        println!("{path}: PLAY npt=20- started at byte {offset}, {start_s:.3} s (Range npt={npt})");
        assert!(
            (19.0..=20.0).contains(&start_s) && (19.0..=20.0).contains(&npt),
            "{path}: started at {start_s:.3} s, Range npt={npt}: not within one GOP before 20 s"
        );
        let state = s.state_all();
        let line = state
            .iter()
            .find(|l| l.starts_with(&format!("rtsp-{id} running path={path}")))
            .unwrap_or_else(|| panic!("{path}: no running session in {state:?}"));
        assert!(line.contains(&format!(" seek={seek} ")), "{line}");
        if seek == "track" {
            // A frame track entry, the last one at or before 20 s (the next is after it;
            // media times here are the next PCR's, so within a PCR interval), and a key
            // frame there.
            assert!(
                offset % 1316 == 0 && frames.contains(&(offset / 1316)),
                "byte {offset} is no frame track entry"
            );
            let next = frames.iter().find(|&&f| f * 1316 > offset).unwrap();
            assert!(
                time_at(next * 1316) > 19.9,
                "the next key frame, at {:.3} s, was not after 20 s",
                time_at(next * 1316)
            );
        }
        assert!(
            got[0].2.chunks_exact(TS).any(random_access),
            "{path}: the first packet holds no random-access TS packet"
        );
        assert_eq!(c.request("TEARDOWN", &url, &[("Session", &id)]).status, 200);
    }
}

/// `Scale: 2` plays the last 10 s of the clip paced at twice media time (`Scale: 1` at media
/// time; neither faster), with media-time RTP timestamps; the reply names the scale; zero, negative and
/// above-`scale_max` scales are 451; a scale whose bit rate admission cannot carry is 453
/// and the session keeps playing at scale 1 after.
#[test]
fn scale_plays_faster_within_scale_max_and_admission() {
    let _serial = serial();
    let Some(clip) = clip() else { return };
    let bytes = std::fs::metadata(clip).unwrap().len();
    // Room for the clip at 3× its bit rate (RTP headers and no per-packet overhead): scale 2
    // fits, scale 4 does not.
    let net = bytes * 3 / u64::from(CLIP_S);
    let s = serve(
        clip,
        &format!(
            "scale_max = 4\n[admission]\nnet_bytes_per_s = {net}\nnet_packet_overhead_bytes = 0\nbulk_share_percent = 0\nself_calibrate = false\ndisk_seq_bytes_per_s = 1000000000\ndisk_random_iops = 100000\n"
        ),
    );
    let url = s.url("clip.ts");
    let mut c = Client::connect(s.rtsp);
    let rx = Receiver::new();
    let setup = c.request("SETUP", &url, &[("Transport", &rx.transport())]);
    assert_eq!(setup.status, 200, "{setup:?}");
    let id = session_id(&setup);
    for bad in ["0", "-1", "5", "-0.5"] {
        let r = c.request("PLAY", &url, &[("Session", &id), ("Scale", bad)]);
        assert_eq!(r.status, 451, "Scale {bad}: {r:?}");
        assert!(r.body.contains("Scale"), "{}", r.body);
    }
    let mut runs = Vec::new();
    for scale in ["1", "2"] {
        let play = c.request(
            "PLAY",
            &url,
            &[("Session", &id), ("Range", "npt=20-"), ("Scale", scale)],
        );
        assert_eq!(play.status, 200, "{play:?}");
        assert_eq!(play.header("Scale"), Some(scale), "{play:?}");
        let got = take_until_bye(&rx, Duration::from_secs(40));
        assert!(got.len() > 50, "Scale {scale}: {} packets", got.len());
        let wall = got.last().unwrap().0 - got[0].0;
        let media = got.last().unwrap().2.wrapping_sub(got[0].2) as f64 / 90_000.0;
        println!(
            "Scale {scale}: {} packets, {media:.3} s of media in {:.3} s",
            got.len(),
            wall.as_secs_f64()
        );
        runs.push((wall.as_secs_f64(), media, got.len()));
    }
    let (w1, m1, n1) = runs[0];
    let (w2, m2, n2) = runs[1];
    assert_eq!(n1, n2, "the same packets at either scale");
    assert!(
        (m2 / m1 - 1.0).abs() < 0.01,
        "RTP timestamps stay media time: {m1:.3} s at scale 1, {m2:.3} s at scale 2"
    );
    // Paced at its scale: never faster than media time / scale (lower bounds on the wall
    // time, 5 % for the first and last packets' jitter). How much faster scale 2 is in wall
    // time is not asserted (an upper bound a loaded machine breaks); the ratio is printed.
    println!("scale 2 / scale 1 wall time: {:.3}", w2 / w1);
    assert!(
        w1 >= m1 * 0.95,
        "scale 1 sent {m1:.3} s of media in {w1:.3} s: faster than real time"
    );
    assert!(
        w2 >= m2 / 2.0 * 0.95,
        "scale 2 sent {m2:.3} s of media in {w2:.3} s: faster than twice real time"
    );
    // Scale 4 needs 4× the bit rate: admission refuses it; the session is stopped, keeps
    // its reservation, and plays at scale 1 again.
    let r = c.request(
        "PLAY",
        &url,
        &[("Session", &id), ("Range", "npt=20-"), ("Scale", "4")],
    );
    assert_eq!(r.status, 453, "{r:?}");
    assert!(r.body.contains("Scale 4"), "{}", r.body);
    assert_eq!(s.metric("penstock_admission_reservations"), 1.0);
    let r = c.request(
        "PLAY",
        &url,
        &[("Session", &id), ("Range", "npt=28-"), ("Scale", "1")],
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("Scale"), Some("1"));
    assert!(!rx.take(Duration::from_millis(500)).is_empty());
}

/// GStreamer over interleaved TCP sends its RTCP receiver reports on the connection: they
/// reach the same metrics as UDP reports (count and jitter per class).
#[test]
fn gstreamer_receiver_reports_over_tcp_reach_the_metrics() {
    let Some(clip) = clip() else { return };
    if !penstock_testreq::require("gst-launch-1.0") {
        return;
    }
    let s = serve(clip, "");
    let reports = "penstock_rtcp_receiver_reports_total{class=\"rt\"}";
    assert_eq!(s.metric(reports), 0.0);
    let mut gst = Command::new("gst-launch-1.0")
        .args(["-q", "rtspsrc", "protocols=tcp"])
        .arg(format!("location={}", s.url("clip.ts")))
        .args(["!", "rtpmp2tdepay", "!", "fakesink"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let mut n = 0.0;
    while t0.elapsed() < Duration::from_secs(25) && n < 2.0 {
        std::thread::sleep(Duration::from_millis(200));
        n = s.metric(reports);
    }
    let state = s.state_all();
    let _ = gst.kill();
    let _ = gst.wait();
    assert!(
        state.iter().any(|l| l.contains("transport=tcp")),
        "GStreamer played over TCP: {state:?}"
    );
    let jitters = s.metric("penstock_rtcp_jitter_seconds_count{class=\"rt\"}");
    println!("{n} receiver reports over TCP, {jitters} jitter samples");
    assert!(n >= 2.0, "{n} receiver reports over TCP within 25 s");
    assert!(jitters >= n, "{jitters} jitter samples for {n} reports");
}

/// A client connected with a small receive buffer (its frames back up quickly).
fn connect_small_rcvbuf(addr: SocketAddr) -> Client {
    use rustix::net::{AddressFamily, SocketType, sockopt};
    let fd = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
    sockopt::set_socket_recv_buffer_size(&fd, 4096).unwrap();
    rustix::net::connect(&fd, &addr).unwrap();
    let s = TcpStream::from(fd);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    Client {
        s,
        cseq: 0,
        buf: Vec::new(),
    }
}

/// Reads an interleaved connection until the reply to `cseq` (frames skipped and counted:
/// RTP on channel 0, RTCP on channel 1), or `None` when nothing comes for 10 s.
fn reply_among_frames(c: &mut Client, cseq: u32) -> Option<(Reply, usize, usize)> {
    let (mut rtp, mut rtcp) = (0, 0);
    loop {
        while c.buf.first() == Some(&b'$') && c.buf.len() >= 4 {
            let len = usize::from(u16::from_be_bytes([c.buf[2], c.buf[3]]));
            if c.buf.len() < 4 + len {
                break;
            }
            if c.buf[1] == 0 {
                rtp += 1
            } else {
                rtcp += 1
            }
            c.buf.drain(..4 + len);
        }
        if c.buf.first().is_some_and(|&b| b != b'$')
            && let Some(end) = c.buf.windows(4).position(|w| w == b"\r\n\r\n")
        {
            let head = String::from_utf8_lossy(&c.buf[..end]).into_owned();
            c.buf.drain(..end + 4);
            let status = head.split(' ').nth(1)?.parse().ok()?;
            let r = Reply {
                status,
                head,
                body: String::new(),
            };
            if r.header("CSeq") == Some(cseq.to_string().as_str()) {
                return Some((r, rtp, rtcp));
            }
            continue;
        }
        let mut b = [0u8; 65536];
        let n = c.s.read(&mut b).ok()?;
        if n == 0 {
            return None;
        }
        c.buf.extend_from_slice(&b[..n]);
    }
}

/// An interleaved client that stops reading backs its session's frames up into the
/// server's socket pair; the reaper (sender reports every 100 ms here) must not wait on it:
/// another session still gets its end-of-media BYE, and once the client reads again its
/// keep-alive is answered and its frames flow (RTCP among them).
#[test]
fn a_stalled_interleaved_client_holds_back_neither_the_reaper_nor_its_connection() {
    let _serial = serial();
    let Some(clip) = clip() else { return };
    let s = serve(
        clip,
        "rtcp_interval_ms = \"100ms\"\nsend_timeout_ms = \"60s\"\n[admission]\nnet_bytes_per_s = 1000000000\nself_calibrate = false\ndisk_seq_bytes_per_s = 1000000000\ndisk_random_iops = 100000\n",
    );
    // A 10 Mbit/s clip, played at scale 4: 5 MB/s backs up TCP's buffers (up to 4 MiB
    // here) within a second or two, then the pair (10 datagrams: net.unix.max_dgram_qlen).
    let o = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi"])
        .args(["-i", "testsrc=size=320x240:rate=25", "-t", "10"])
        .args([
            "-c:v",
            "mpeg2video",
            "-b:v",
            "8M",
            "-minrate",
            "8M",
            "-maxrate",
            "8M",
        ])
        .args([
            "-bufsize", "2M", "-g", "25", "-muxrate", "10M", "-f", "mpegts",
        ])
        .arg(s.dir.path().join("fast.ts"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let fast = s.url("fast.ts");
    let url = s.url("clip.ts");
    let mut tcp = connect_small_rcvbuf(s.rtsp);
    let setup = tcp.request(
        "SETUP",
        &fast,
        &[("Transport", "RTP/AVP/TCP;unicast;interleaved=0-1")],
    );
    assert_eq!(setup.status, 200, "{setup:?}");
    let tcp_id = session_id(&setup);
    let play = tcp.request("PLAY", &fast, &[("Session", &tcp_id), ("Scale", "4")]);
    assert_eq!(play.status, 200, "{play:?}");
    // Not read from now on: TCP's buffers, then the session's pair, fill. The event, not a
    // fixed wait: this client's receive queue (/proc/net/tcp, `tx_queue:rx_queue`) holds
    // data and has stopped growing (the same over 20 polls in a row; bounded).
    let port = tcp.s.local_addr().unwrap().port();
    let rx_queue = || -> u64 {
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        table
            .lines()
            .skip(1)
            .find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let (_, p) = f.get(1)?.rsplit_once(':')?;
                (u16::from_str_radix(p, 16).ok()? == port)
                    .then(|| u64::from_str_radix(f.get(4)?.split_once(':')?.1, 16).ok())
                    .flatten()
            })
            .unwrap_or(0)
    };
    let t_fill = Instant::now();
    let (mut last, mut same) = (rx_queue(), 0);
    while last == 0 || same < 20 {
        assert!(
            t_fill.elapsed() < Duration::from_secs(120),
            "the stalled client's receive queue never filled ({last} bytes)"
        );
        std::thread::sleep(Duration::from_millis(50));
        let now = rx_queue();
        same = if now == last { same + 1 } else { 0 };
        last = now;
    }
    println!("the stalled client's receive queue holds {last} bytes");

    // Another session, over UDP, to the end of the media: its BYE comes from the reaper.
    let mut c = Client::connect(s.rtsp);
    let rx = Receiver::new();
    let setup = c.request("SETUP", &url, &[("Transport", &rx.transport())]);
    let id = session_id(&setup);
    let play = c.request("PLAY", &url, &[("Session", &id), ("Range", "npt=29-")]);
    assert_eq!(play.status, 200, "{play:?}");
    let t0 = Instant::now();
    let mut bye = false;
    let mut b = [0u8; 2048];
    while !bye && t0.elapsed() < Duration::from_secs(60) {
        let _ = rx.rtp.recv(&mut b);
        while let Ok(n) = rx.rtcp.recv(&mut b) {
            let mut at = 0;
            while at + 4 <= n {
                bye |= b[at + 1] == 203;
                at += 4 * (usize::from(u16::from_be_bytes([b[at + 2], b[at + 3]])) + 1);
            }
        }
    }
    assert!(
        bye,
        "no BYE for the UDP session while the TCP client stalled"
    );

    // The stalled client asks for a keep-alive, then reads again: answered, frames flow.
    tcp.cseq += 1;
    let cseq = tcp.cseq;
    tcp.s
        .write_all(
            format!("GET_PARAMETER {fast} RTSP/1.0\r\nCSeq: {cseq}\r\nSession: {tcp_id}\r\n\r\n")
                .as_bytes(),
        )
        .unwrap();
    // (reply_among_frames blocks on its reads: no wait needed.)
    let (r, rtp, rtcp) = reply_among_frames(&mut tcp, cseq).expect("no reply to GET_PARAMETER");
    assert_eq!(r.status, 200, "{r:?}");
    println!("after the stall: {rtp} RTP and {rtcp} RTCP frames before the keep-alive's reply");
    assert!(rtp > 0, "no RTP frames after the stall");
    let (r, _, rtcp_after) = {
        tcp.cseq += 1;
        let cseq = tcp.cseq;
        tcp.s
            .write_all(
                format!(
                    "GET_PARAMETER {fast} RTSP/1.0\r\nCSeq: {cseq}\r\nSession: {tcp_id}\r\n\r\n"
                )
                .as_bytes(),
            )
            .unwrap();
        std::thread::sleep(Duration::from_millis(500));
        reply_among_frames(&mut tcp, cseq).expect("no reply to the second GET_PARAMETER")
    };
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        rtcp + rtcp_after > 0,
        "no sender report framed on the RTCP channel"
    );
}

/// The classifier of GStreamer's end-of-stream race, on gst-launch's own words (from a CI run
/// and a stress run against gst-rtsp-server), and on failures it must not excuse.
#[test]
fn gstreamers_pause_at_eos_race_is_told_from_real_failures() {
    let race = "ERROR: from element /GstPipeline:pipeline0/GstRTSPSrc:rtspsrc0: Could not write to resource.
Additional debug info:
../gst/rtsp/gstrtspsrc.c(6766): gst_rtspsrc_try_send (): /GstPipeline:pipeline0/GstRTSPSrc:rtspsrc0:
Could not send message. (Received end-of-file)
ERROR: from element /GstPipeline:pipeline0/GstRTSPSrc:rtspsrc0: Could not write to resource.
Additional debug info:
../gst/rtsp/gstrtspsrc.c(9235): gst_rtspsrc_pause (): /GstPipeline:pipeline0/GstRTSPSrc:rtspsrc0:
Could not send message. (Received end-of-file)
";
    assert!(common::gst_teardown_race(race));
    assert!(!common::gst_teardown_race(""), "no error at all is no race");
    let refused = "ERROR: from element /GstPipeline:pipeline0/GstRTSPSrc:rtspsrc0: Could not open resource for reading and writing.
Additional debug info:
../gst/rtsp/gstrtspsrc.c(8331): gst_rtspsrc_retrieve_sdp (): /GstPipeline:pipeline0/GstRTSPSrc:rtspsrc0:
Failed to connect. (Generic error)
ERROR: pipeline doesn't want to preroll.
";
    assert!(!common::gst_teardown_race(refused));
    let mid_stream = "ERROR: from element /GstPipeline:pipeline0/GstRTSPSrc:rtspsrc0: Could not read from resource.
Additional debug info:
../gst/rtsp/gstrtspsrc.c(6013): gst_rtspsrc_loop_udp (): /GstPipeline:pipeline0/GstRTSPSrc:rtspsrc0:
Could not receive message. (Received end-of-file)
";
    assert!(!common::gst_teardown_race(mid_stream));
    // The race plus another error: not excused.
    assert!(!common::gst_teardown_race(&format!("{race}{refused}")));
}

/// Runs a `penstock` command that must succeed; its stdout.
fn penstock_ok(args: &[&str]) -> String {
    let o = Command::new(BIN).args(args).output().unwrap();
    assert!(
        o.status.success(),
        "penstock {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// RTSP of volume partitions (`[volumes]`, `rtsp://…/vol/NAME/PART`; issue 21 item 3): the
/// clip recorded into a partition (its tracks in `[volumes] tracks`) and imported into
/// another. ffprobe identifies the recorded one; GStreamer (interleaved) receives the
/// imported partition and the plain file, each byte for byte the clip; `PLAY npt=20-` of
/// the recording starts by its frame track within [19, 20] s, of the imported one by PCR;
/// unknown volumes and partitions are 404, a partition that is no TS 415.
#[test]
fn partitions_play_over_rtsp_and_seek_by_their_tracks() {
    let _serial = serial();
    let Some(clip) = clip() else { return };
    let src = std::fs::read(clip).unwrap();
    let first_pcr = src.chunks_exact(TS).find_map(pcr).unwrap();
    let vdir = tempfile::tempdir().unwrap();
    let d = vdir.path();
    let (m0, m1) = (d.join("pv-m0"), d.join("pv-m1"));
    penstock_ok(&[
        "volume",
        "create",
        "pv",
        "--member-size",
        "64MiB",
        "--member",
        m0.to_str().unwrap(),
        "--member",
        m1.to_str().unwrap(),
    ]);
    let m0s = m0.to_str().unwrap();
    // The recording: an empty partition grown by `penstock record`, tracks under DIR/pv/.
    penstock_ok(&["volume", "add-partition", m0s, "rec"]);
    let tracks = d.join("tracks");
    std::fs::create_dir_all(tracks.join("pv")).unwrap();
    record_into(
        clip,
        &format!("vol:{m0s}/rec"),
        &tracks.join("pv").join("rec"),
    );
    penstock_ok(&["volume", "import", m0s, "imp", clip.to_str().unwrap()]);
    let junk = d.join("junk.bin");
    std::fs::write(&junk, vec![0x47u8; 1 << 20]).unwrap();
    penstock_ok(&["volume", "import", m0s, "junk", junk.to_str().unwrap()]);
    let exported = d.join("rec.out");
    penstock_ok(&["volume", "export", m0s, "rec", exported.to_str().unwrap()]);
    assert!(
        std::fs::read(&exported).unwrap() == src,
        "the recorded partition is the clip, byte for byte"
    );

    let s = serve(
        clip,
        &format!(
            "[volumes]\npv = \"{}\"\ntracks = \"{}\"\n",
            m1.display(),
            tracks.display()
        ),
    );
    // 404s and 415, as for files.
    let mut c = Client::connect(s.rtsp);
    for (path, want) in [
        ("vol/pv/nope", 404),
        ("vol/nope/rec", 404),
        ("vol/pv/../rec", 404),
        ("vol/pv", 404),
        ("vol/pv/junk", 415),
        ("vol/pv/rec", 200),
    ] {
        let r = c.request("DESCRIBE", &s.url(path), &[("Accept", "application/sdp")]);
        assert_eq!(r.status, want, "DESCRIBE {path}: {r:?}");
    }
    if penstock_testreq::require("ffprobe") {
        let mut c = Command::new("ffprobe");
        c.args(["-v", "error", "-show_streams", &s.url("vol/pv/rec")]);
        let (ok, _, log) = run_player(c, Duration::from_secs(20));
        assert!(ok, "ffprobe: {log}");
        assert!(log.contains("codec_name=mpeg2video"), "ffprobe: {log}");
    }

    // Seeks: by the recording's frame track, by PCR for the imported partition.
    let time_at = |offset: usize| {
        let p = src[offset..]
            .chunks_exact(TS)
            .find_map(pcr)
            .expect("a PCR after the start");
        (p - first_pcr) as f64 / 27e6
    };
    for (path, seek) in [("vol/pv/rec", "track"), ("vol/pv/imp", "pcr")] {
        let url = s.url(path);
        let rx = Receiver::new();
        let setup = c.request("SETUP", &url, &[("Transport", &rx.transport())]);
        assert_eq!(setup.status, 200, "{setup:?}");
        let id = session_id(&setup);
        let play = c.request("PLAY", &url, &[("Session", &id), ("Range", "npt=20-")]);
        assert_eq!(play.status, 200, "{play:?}");
        let got = rx.take(Duration::from_millis(800));
        assert!(got.len() > 5, "{path}: {} packets", got.len());
        let offset = src
            .windows(got[0].2.len())
            .position(|w| w == got[0].2.as_slice())
            .expect("the first payload is source bytes");
        let start_s = time_at(offset);
        let npt = npt_start(&play);
        println!("{path}: PLAY npt=20- started at byte {offset}, {start_s:.3} s (Range npt={npt})");
        assert!(
            (19.0..=20.0).contains(&start_s) && (19.0..=20.0).contains(&npt),
            "{path}: started at {start_s:.3} s, Range npt={npt}"
        );
        let state = s.state_all();
        let line = state
            .iter()
            .find(|l| l.starts_with(&format!("rtsp-{id} running path={path}")))
            .unwrap_or_else(|| panic!("{path}: no running session in {state:?}"));
        assert!(line.contains(&format!(" seek={seek} ")), "{line}");
        if seek == "track" {
            assert!(offset % 1316 == 0, "byte {offset} is no datagram start");
            assert!(
                got[0].2.chunks_exact(TS).any(random_access),
                "the first packet holds no random-access TS packet"
            );
        }
        // PAUSE, then PLAY goes on from where it stopped.
        assert_eq!(c.request("PAUSE", &url, &[("Session", &id)]).status, 200);
        let again = c.request("PLAY", &url, &[("Session", &id)]);
        assert_eq!(again.status, 200, "{again:?}");
        assert!(npt_start(&again) >= npt, "{again:?}");
        assert_eq!(c.request("TEARDOWN", &url, &[("Session", &id)]).status, 200);
    }

    // Whole plays, at once: the partition and the plain file give GStreamer the same bytes.
    if !penstock_testreq::require("gst-launch-1.0") {
        return;
    }
    let limit = Duration::from_secs(u64::from(CLIP_S) + 20);
    let plays: Vec<_> = [("vol/pv/rec", "gst-rec.ts"), ("clip.ts", "gst-file.ts")]
        .into_iter()
        .map(|(path, name)| {
            let out = s.dir.path().join(name);
            let mut c = Command::new("gst-launch-1.0");
            c.args(["-q", "rtspsrc", "protocols=tcp"])
                .args([&format!("location={}", s.url(path)), "!", "rtpmp2tdepay"])
                .args(["!", "filesink"])
                .arg(format!("location={}", out.display()));
            (path, out, std::thread::spawn(move || run_player(c, limit)))
        })
        .collect();
    for (path, out, h) in plays {
        let (ok, elapsed, log) = h.join().unwrap();
        // GStreamer's own PAUSE-at-EOS race (`common::gst_teardown_race`; seen here in 2 of 7
        // runs, for the plain file and the partition alike); the bytes are compared below.
        let teardown_eof = !ok && common::gst_teardown_race(&log);
        if !ok && teardown_eof {
            println!("gst {path}: exited 1 after {elapsed:?} by GStreamer's PAUSE-at-EOS race");
        }
        assert!(
            ok || teardown_eof,
            "gst {path} failed after {elapsed:?}: {log}\n{}",
            s.log()
        );
        let got = std::fs::read(&out).unwrap();
        assert!(
            got == src,
            "gst {path}: {} bytes, not the clip's {} byte for byte",
            got.len(),
            src.len()
        );
        println!("gst {path}: {} bytes, the clip byte for byte", got.len());
    }
}

/// `seconds` of H.264 at 160x120, 25 fps, a key frame every 10 s (`-g 250`, no scene cuts),
/// in TS: what the issue tried (`ffmpeg -ss 20` and `mpv --start=20` got nothing decodable
/// when a seek landed on a PCR time 20 s after the last key frame).
fn long_gop_clip(path: &Path, seconds: u32) {
    let o = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y"])
        .args(["-f", "lavfi", "-i", "testsrc=size=160x120:rate=25"])
        .args(["-t", &seconds.to_string()])
        .args([
            "-c:v",
            "libx264",
            "-preset",
            "ultrafast",
            "-pix_fmt",
            "yuv420p",
        ])
        .args(["-g", "250", "-keyint_min", "250", "-sc_threshold", "0"])
        .args(["-f", "mpegts"])
        .arg(path)
        .output()
        .expect("ffmpeg");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// The checksums (showinfo's, of the decoded picture) of `input`'s video frames by their
/// time from the first frame, in ms: `ffmpeg ARGS -i input -vf showinfo`.
fn frame_sums(
    args: &[&str],
    input: &str,
    frames: Option<u32>,
) -> (bool, Vec<(u64, String)>, String) {
    let mut c = Command::new("ffmpeg");
    c.arg("-hide_banner").args(args).args(["-i", input]);
    if let Some(n) = frames {
        c.args(["-frames:v", &n.to_string()]);
    }
    c.args(["-an", "-vf", "showinfo", "-f", "null", "-"]);
    let (ok, _, log) = run_player(c, Duration::from_secs(120));
    let sums = log
        .lines()
        .filter(|l| l.contains("Parsed_showinfo") && l.contains(" pts_time:"))
        .filter_map(|l| {
            let t: f64 = l
                .split(" pts_time:")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()?;
            let sum = l
                .split(" checksum:")
                .nth(1)?
                .split_whitespace()
                .next()?
                .to_string();
            Some(((t * 1000.0).round() as u64, sum))
        })
        .collect();
    (ok, sums, log)
}

/// Issue 32, item 6: a seek lands on a picture. On a clip with key frames 10 s apart, PLAY
/// `Range: npt=T-` starts at the key frame at or before T (the file's key-frame index) and the
/// reply's Range says that start; `ffmpeg -ss T -i rtsp://…` (which asks `npt=T+S-`, S the
/// stream's first PTS, taken off again for it) decodes a picture, and with
/// `-fflags +discardcorrupt` exactly the source's picture at T (the packet ffmpeg still holds
/// from before its seek is the only corrupt one: docs/rtsp.md); mpv, where installed (CI
/// installs it), writes a picture with `--start=T`.
#[test]
fn seeks_land_on_the_key_frame_at_or_before_the_time_for_ffmpeg_and_mpv() {
    if !common::tool("ffmpeg", "-version") {
        assert!(
            std::env::var_os("CI").is_none(),
            "ffmpeg is needed under CI"
        );
        println!("SKIPPED: ffmpeg not found");
        return;
    }
    let _serial = serial();
    let work = tempfile::tempdir().unwrap();
    let clip = work.path().join("gop10.ts");
    long_gop_clip(&clip, 30);
    let s = serve(&clip, "");
    let url = s.url("clip.ts");
    // The source, decoded through: each picture's checksum by its time; and its key frames.
    let (ok, reference, log) = frame_sums(&[], clip.to_str().unwrap(), None);
    assert!(
        ok && reference.len() == 750,
        "{} pictures: {log}",
        reference.len()
    );
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
        .arg(&clip)
        .output()
        .unwrap();
    let keys_abs: Vec<f64> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.trim().trim_end_matches(',').parse().ok())
        .collect();
    let keys: Vec<f64> = keys_abs.iter().map(|k| k - keys_abs[0]).collect();
    assert_eq!(keys.len(), 3, "key frames at 0, 10, 20 s: {keys:?}");

    let times = [5u64, 9, 12, 20, 27];
    // The scripted client: the reply's Range start is the key frame at or before T (its
    // unit's time: within a PCR interval before the frame).
    for &t in &times {
        let mut c = Client::connect(s.rtsp);
        let rx = Receiver::new();
        let setup = c.request("SETUP", &url, &[("Transport", &rx.transport())]);
        assert_eq!(setup.status, 200, "{setup:?}");
        let id = session_id(&setup);
        let play = c.request(
            "PLAY",
            &url,
            &[("Session", &id), ("Range", &format!("npt={t}-"))],
        );
        assert_eq!(play.status, 200, "{play:?}");
        let start = npt_start(&play);
        let key = keys
            .iter()
            .rev()
            .find(|&&k| k <= t as f64)
            .copied()
            .unwrap();
        println!("PLAY npt={t}-: Range npt={start}, key frame at {key:.3} s");
        assert!(
            start <= t as f64 && (start - key).abs() < 0.1,
            "PLAY npt={t}-: Range starts at {start}, the key frame at or before is at {key}"
        );
        assert_eq!(c.request("TEARDOWN", &url, &[("Session", &id)]).status, 200);
    }

    // Real players, one thread per T (the streams are paced in real time).
    let runs: Vec<_> = times
        .iter()
        .map(|&t| {
            let url = url.clone();
            let png = work.path().join(format!("ffmpeg-{t}.png"));
            std::thread::spawn(move || {
                let mut c = Command::new("ffmpeg");
                c.args([
                    "-hide_banner",
                    "-loglevel",
                    "error",
                    "-y",
                    "-rtsp_transport",
                    "tcp",
                ])
                .args(["-ss", &t.to_string(), "-i", &url, "-frames:v", "1"])
                .arg(&png);
                let plain = run_player(c, Duration::from_secs(120));
                let exact = frame_sums(
                    &[
                        "-fflags",
                        "+discardcorrupt",
                        "-rtsp_transport",
                        "tcp",
                        "-ss",
                        &t.to_string(),
                    ],
                    &url,
                    Some(1),
                );
                (t, plain, png, exact)
            })
        })
        .collect();
    for r in runs {
        let (t, (ok, took, log), png, (exact_ok, sums, exact_log)) = r.join().unwrap();
        let size = std::fs::metadata(&png).map_or(0, |m| m.len());
        println!("ffmpeg -ss {t}: ok={ok} in {took:?}, {size}-byte picture");
        assert!(ok && size > 0, "ffmpeg -ss {t}: no picture: {log}");
        let want = reference
            .iter()
            .find(|(ms, _)| *ms == t * 1000)
            .unwrap_or_else(|| panic!("no source picture at {t} s"));
        println!("ffmpeg -fflags +discardcorrupt -ss {t}: {sums:?}, the source's: {want:?}");
        assert!(
            exact_ok && sums.first().map(|(_, s)| s) == Some(&want.1),
            "ffmpeg -ss {t}: not the source's picture at {t} s ({want:?}): {sums:?}\n{exact_log}"
        );
    }
    let log = s.log();
    assert!(
        log.contains("PLAY from 9.000 by key") && log.contains("PLAY from 27.000 by key"),
        "ffmpeg's npt=T+S is taken as T, by the key-frame index:\n{log}"
    );

    if !common::tool("mpv", "--version") {
        assert!(
            std::env::var_os("CI").is_none(),
            "mpv is needed under CI (.ci/run installs it)"
        );
        println!("SKIPPED: mpv not found (apt-get install mpv)");
        return;
    }
    let runs: Vec<_> = times
        .iter()
        .map(|&t| {
            let url = url.clone();
            let dir = work.path().join(format!("mpv-{t}"));
            std::fs::create_dir_all(&dir).unwrap();
            std::thread::spawn(move || {
                let mut c = Command::new("mpv");
                c.args(["--no-config", "--really-quiet", "--ao=null", "--vo=image"])
                    .args([
                        "--vo-image-format=png",
                        "--frames=1",
                        "--rtsp-transport=tcp",
                    ])
                    .arg(format!("--vo-image-outdir={}", dir.display()))
                    .arg(format!("--start={t}"))
                    .arg(&url);
                (t, run_player(c, Duration::from_secs(120)), dir)
            })
        })
        .collect();
    for r in runs {
        let (t, (ok, took, log), dir) = r.join().unwrap();
        let pictures: Vec<u64> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok()?.metadata().ok().map(|m| m.len()))
            .collect();
        println!("mpv --start={t}: ok={ok} in {took:?}, pictures {pictures:?}");
        assert!(
            ok && pictures.len() == 1 && pictures[0] > 0,
            "mpv --start={t}: no picture: {log}"
        );
    }
}
