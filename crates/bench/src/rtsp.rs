//! `penstock bench rtsp` (issue 15, "Scale against the peer"): N concurrent RTSP sessions of
//! an 8 Mbit/s MPEG-TS clip over RTP/UDP from `penstock serve` and from GStreamer's RTSP
//! server (gst-rtsp-server through python3-gi, [`GST_SCRIPT`]) in the same run.
//!
//! - **The media**: a ~CBR MPEG-TS clip made once with ffmpeg (`testsrc` 1280x720, mpeg2video
//!   at `--video-bitrate` with minrate = maxrate, GOP 1 s, a fixed mux rate), kept in `--dir`.
//! - **The peer**: GStreamer's server serving the same file, `filesrc ! tsparse
//!   set-timestamps=true ! rtpmp2tpay pt=33`, one pipeline per session (not shared), UDP only.
//! - **`--media mp4`** (issue 36's `bench mp4`, RTSP half): the clip is an H.264 + AAC MP4
//!   (libx264 capped at `--video-bitrate`, the test pattern under noise so that it reaches
//!   it; no B-frames, GOP 1 s; AAC 128 kbit/s at 48 kHz;
//!   faststart), each session two RTP sessions (SETUP of the video track, then the audio
//!   track, into one RTSP session), GStreamer's pipeline `qtdemux ! h264parse ! rtph264pay`
//!   and `! aacparse ! rtpmp4gpay`. Each flow's lateness and jitter run on its own RTP clock
//!   (90 kHz video, 48 kHz audio).
//! - **The receivers**: one thread of this process, one epoll set over every session's RTP and
//!   RTCP sockets (8 MiB SO_RCVBUF where `net.core.rmem_max` allows it, recvmmsg batches), with
//!   the kernel's receive time of each datagram (SO_TIMESTAMPNS) and each socket's drop counter
//!   (SO_RXQ_OVFL); the RTSP side is a minimal client on the calling thread (`rtsp-types`:
//!   DESCRIBE, SETUP `RTP/AVP;unicast;client_port=a-b`, PLAY, OPTIONS keep-alive at half the
//!   session timeout, TEARDOWN).
//! - **Counted per session**: RTP packets and payload bytes; loss (gaps in the extended
//!   sequence numbers); the bytes received against the file's bytes over the media time played
//!   (the RTP timestamps' span); the last RTCP SR's packet count against the packets received
//!   up to it; RFC 3550 inter-arrival jitter; lateness: arrival minus due time, the due time
//!   being the first packet's arrival plus the packet's RTP time (90 kHz) since the first's.
//! - **The ramp**: per server, a fresh server for each step, N sessions opened over
//!   `--stagger`, `--duration` measured once all play; N doubles from `--start` until a step
//!   is not clean (loss, or p99 lateness above `--lateness-max`) or `--max-sessions`, then
//!   `--bisect` steps between the last clean and the first failed N. Server CPU per session is
//!   the server process's utime+stime (/proc/PID/stat, all threads) over the measured window,
//!   divided by N and the window; this process's own share is printed beside it, so that the
//!   reader can see that the receivers were not the bottleneck.
//!
//! Needs ffmpeg, and for GStreamer python3-gi with gir1.2-gst-rtsp-server-1.0 and the
//! good/bad plugins (rtpmp2tpay, tsparse); a server whose tools are missing is skipped with
//! the reason.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use penstock_core::rtp::rtcp::{self, RtcpItem};
use penstock_core::units::parse_duration;
use penstock_driver::sys::{RecvBatch, enable_receive_meta};
use rtsp_types::{Message, Method, Request, Response, StatusCode, Url, Version, headers};
use serde_json::{Value, json};

use crate::cues::{machine_line, process_cpu_s};
use crate::out;
use crate::stats::percentile;

/// GStreamer's RTSP server, written to a temporary file and run with `--python`.
pub const GST_SCRIPT: &str = include_str!("rtsp_gst.py");

/// The RTP clock of MP2T (RFC 3551): 90 kHz.
const RTP_CLOCK_HZ: f64 = 90_000.0;
/// The MP4 clip's audio sample rate, its RTP clock (RFC 3640: the sampling rate).
const AUDIO_RATE_HZ: u32 = 48_000;
/// Every wait on a server (connect, a response, its start line) ends after this long.
const PEER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the bench times UDP sends to find what one costs (`--send-cost` not given).
const SEND_COST_TIME: Duration = Duration::from_millis(500);
/// The receive buffer asked of each RTP socket (the kernel caps it at `net.core.rmem_max`;
/// the figure it kept is printed).
const RCVBUF_BYTES: usize = 8 << 20;
/// recvmmsg slots and their size: RTP packets of 7 TS packets are 1328 bytes.
const BATCH: usize = 64;
const SLOT_BYTES: usize = 2048;
/// Lateness samples kept per session (beyond it the later packets count in everything but
/// the lateness percentiles): 25 minutes of an 8 Mbit/s stream.
const LATENESS_SAMPLES_MAX: usize = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ServerKind {
    /// `penstock serve` with `[rtsp] listen`.
    Penstock,
    /// gst-rtsp-server through python3-gi.
    Gstreamer,
}

impl ServerKind {
    fn name(self) -> &'static str {
        match self {
            ServerKind::Penstock => "penstock",
            ServerKind::Gstreamer => "GStreamer",
        }
    }
}

/// What the sessions play.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Media {
    /// An MPEG-TS clip: one RTP session (MP2T) per RTSP session.
    Ts,
    /// An H.264 + AAC MP4: two RTP sessions (video, audio) per RTSP session.
    Mp4,
}

impl Media {
    fn name(self) -> &'static str {
        match self {
            Media::Ts => "ts",
            Media::Mp4 => "mp4",
        }
    }

    /// The RTP sessions of one RTSP session and their clocks, in SETUP order.
    fn clocks(self) -> &'static [f64] {
        match self {
            Media::Ts => &[RTP_CLOCK_HZ],
            Media::Mp4 => &[RTP_CLOCK_HZ, AUDIO_RATE_HZ as f64],
        }
    }
}

#[derive(Args, Debug)]
pub struct RtspArgs {
    /// What the sessions play: an MPEG-TS clip, or an H.264 + AAC MP4 (issue 36's `bench mp4`).
    #[arg(long, value_enum, default_value = "ts")]
    pub media: Media,
    /// Measured time of each step, once all its sessions play [default: 10s; --quick 3s].
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Length of the clip; it must outlast --stagger + --duration + 3 s, and the time opening
    /// the sessions takes (a step whose sessions end before its window is flagged) [default:
    /// 60s; --quick 10s].
    #[arg(long, value_parser = parse_duration)]
    pub clip: Option<Duration>,
    /// The clip's video bit rate, ffmpeg's syntax (`-b:v`, `-minrate`, `-maxrate`).
    #[arg(long, default_value = "8M")]
    pub video_bitrate: String,
    /// Sessions of the ramp's first step; each next step doubles them.
    #[arg(long, default_value_t = 1)]
    pub start: usize,
    /// The ramp's cap [default: 256; --quick 4].
    #[arg(long)]
    pub max_sessions: Option<usize>,
    /// Bisection steps between the last clean and the first failed N [default: 3; --quick 0].
    #[arg(long)]
    pub bisect: Option<u32>,
    /// The sessions of a step are opened one after another over this long.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub stagger: Duration,
    /// A step is clean when no packet was lost and the p99 lateness is at most this.
    #[arg(long, default_value = "5ms", value_parser = parse_duration)]
    pub lateness_max: Duration,
    /// The servers measured, in this order.
    #[arg(
        long,
        value_enum,
        default_value = "penstock,gstreamer",
        value_delimiter = ','
    )]
    pub servers: Vec<ServerKind>,
    /// Run both servers at SCHED_FIFO priority PRIO (`chrt -f PRIO`, all their threads) and
    /// the bench's receiving thread at PRIO + 1: the same for both, and out of reach of other
    /// work on a shared machine. Needs root (or CAP_SYS_NICE) and chrt (util-linux).
    #[arg(long, value_name = "PRIO", value_parser = clap::value_parser!(u8).range(1..=98))]
    pub fifo: Option<u8>,
    /// A short run (the defaults marked --quick above).
    #[arg(long)]
    pub quick: bool,
    /// Where the clip is made and kept for later runs [default: /dev/shm/penstock-bench-rtsp,
    /// else $TMPDIR/penstock-bench-rtsp].
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The Python that has python3-gi, for GStreamer's server [default: /usr/bin/python3
    /// where it exists (the distribution's, which python3-gi installs into), else python3].
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// penstock's dispatch slack (`[engine] dispatch_slack_us`): each wake-up of a worker
    /// sends the units due within this much more [default: the engine's, 500us].
    #[arg(long, value_parser = parse_duration)]
    pub dispatch_slack: Option<Duration>,
    /// The CPU time of one send penstock's admission charges (`[admission] cpu_send_ns`)
    /// [default: measured on this machine at the start of the run, as `penstock calibrate`
    /// measures it].
    #[arg(long, value_parser = parse_duration)]
    pub send_cost: Option<Duration>,
    /// Write the results as JSON here.
    /// A bare `--json` writes it on stdout (the tables then go to stderr).
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
}

/// The settings of one run, `--quick` applied.
struct Plan {
    duration: Duration,
    clip: Duration,
    max_sessions: usize,
    bisect: u32,
    /// `[engine] dispatch_slack_us` for penstock (`None`: its default).
    slack_us: Option<u64>,
    /// `[admission] cpu_send_ns` for penstock: `--send-cost`, else measured by `run`.
    send_ns: u64,
}

impl Plan {
    fn of(a: &RtspArgs) -> Result<Plan> {
        let p = Plan {
            duration: a
                .duration
                .unwrap_or(Duration::from_secs(if a.quick { 3 } else { 10 })),
            clip: a
                .clip
                .unwrap_or(Duration::from_secs(if a.quick { 10 } else { 60 })),
            max_sessions: a.max_sessions.unwrap_or(if a.quick { 4 } else { 256 }),
            bisect: a.bisect.unwrap_or(if a.quick { 0 } else { 3 }),
            slack_us: a
                .dispatch_slack
                .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
            send_ns: a
                .send_cost
                .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        };
        if a.start == 0 || p.max_sessions < a.start {
            bail!("--start must be at least 1 and at most --max-sessions");
        }
        if p.duration.is_zero() {
            bail!("--duration must be more than 0");
        }
        let need = a.stagger + p.duration + Duration::from_secs(3);
        if p.clip < need {
            bail!(
                "--clip {:?} is shorter than --stagger + --duration + 3 s = {need:?}: the sessions would end before the measurement",
                p.clip
            );
        }
        Ok(p)
    }
}

/// The clip: its path, size and media duration.
struct Clip {
    path: PathBuf,
    bytes: u64,
    seconds: f64,
    media: Media,
}

/// Makes the clip with ffmpeg, or takes the one a previous run made with the same settings.
fn make_clip(dir: &Path, seconds: u64, video_bitrate: &str, media: Media) -> Result<Clip> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    if video_bitrate.is_empty()
        || !video_bitrate
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.')
    {
        bail!("--video-bitrate {video_bitrate:?}: a number with an optional k/M suffix");
    }
    let ext = media.name();
    let path = dir.join(format!("clip-{seconds}s-{video_bitrate}.{ext}"));
    if !path.is_file() {
        // A temporary name first: an interrupted encode leaves no clip that looks finished.
        let part = dir.join(format!("clip-{seconds}s-{video_bitrate}.part.{ext}"));
        let bitrate_bps = ffmpeg_rate(video_bitrate)?;
        // The mux rate a little above the video's: room for PAT/PMT/PCR and padding, so that
        // the file is constant-rate at the TS level.
        let muxrate = bitrate_bps + bitrate_bps / 16;
        let mut cmd = Command::new("ffmpeg");
        cmd.args([
            "-hide_banner",
            "-loglevel",
            "error",
            "-y",
            "-f",
            "lavfi",
            "-i",
        ])
        .arg("testsrc=size=1280x720:rate=25");
        match media {
            Media::Ts => {
                cmd.arg("-t")
                    .arg(seconds.to_string())
                    .args(["-c:v", "mpeg2video", "-g", "25"])
                    .args(["-b:v", video_bitrate, "-minrate", video_bitrate])
                    .args(["-maxrate", video_bitrate, "-bufsize"])
                    .arg((bitrate_bps / 4).to_string())
                    .arg("-muxrate")
                    .arg(muxrate.to_string())
                    .args(["-f", "mpegts"]);
            }
            Media::Mp4 => {
                // No B-frames: the RTP timestamps (presentation times) then rise in sending
                // order, so that lateness is not a reordering's artefact. Noise over the test
                // pattern, which x264 would otherwise squeeze far below the asked rate.
                cmd.args(["-f", "lavfi", "-i"])
                    .arg(format!("sine=frequency=440:sample_rate={AUDIO_RATE_HZ}"))
                    .arg("-t")
                    .arg(seconds.to_string())
                    .args(["-vf", "noise=alls=24:allf=t", "-pix_fmt", "yuv420p"])
                    .args(["-c:v", "libx264", "-preset", "veryfast", "-bf", "0"])
                    .args(["-g", "25", "-b:v", video_bitrate, "-maxrate", video_bitrate])
                    .arg("-bufsize")
                    .arg((bitrate_bps / 4).to_string())
                    .args(["-c:a", "aac", "-b:a", "128k", "-ac", "2"])
                    .args(["-movflags", "+faststart", "-f", "mp4"]);
            }
        }
        let st = cmd
            .arg(&part)
            .stdin(Stdio::null())
            .status()
            .context("running ffmpeg (is it installed?)")?;
        if !st.success() {
            bail!("ffmpeg failed to make the clip ({st})");
        }
        std::fs::rename(&part, &path)?;
    }
    let bytes = std::fs::metadata(&path)?.len();
    let seconds = ffprobe_duration(&path).unwrap_or(seconds as f64);
    Ok(Clip {
        path,
        bytes,
        seconds,
        media,
    })
}

/// "8M", "8000k", "8000000" → bits per second.
fn ffmpeg_rate(s: &str) -> Result<u64> {
    let (num, mul) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1e3),
        Some('M' | 'm') => (&s[..s.len() - 1], 1e6),
        _ => (s, 1.0),
    };
    let v: f64 = num
        .parse()
        .with_context(|| format!("--video-bitrate {s:?}"))?;
    if !v.is_finite() || v <= 0.0 {
        bail!("--video-bitrate {s:?} must be more than 0");
    }
    Ok((v * mul) as u64)
}

fn ffprobe_duration(path: &Path) -> Option<f64> {
    let o = Command::new("ffprobe")
        .args(["-v", "error", "-show_entries", "format=duration", "-of"])
        .arg("default=noprint_wrappers=1:nokey=1")
        .arg(path)
        .output()
        .ok()?;
    String::from_utf8_lossy(&o.stdout).trim().parse().ok()
}

/// A running server, stopped (SIGTERM, then SIGKILL after 5 s) and reaped when dropped.
struct Server {
    child: Child,
    /// Kept until the server is gone (the GStreamer script, penstock's configuration).
    _files: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn python(a: &RtspArgs) -> PathBuf {
    a.python.clone().unwrap_or_else(|| {
        let sys = Path::new("/usr/bin/python3");
        if sys.is_file() {
            sys.to_path_buf()
        } else {
            PathBuf::from("python3")
        }
    })
}

/// Whether this machine can run `kind`; `Err` says what is missing.
fn check_server(kind: ServerKind, python: &Path, media: Media) -> std::result::Result<(), String> {
    match kind {
        ServerKind::Penstock => Ok(()),
        ServerKind::Gstreamer => {
            let elements = match media {
                Media::Ts => "'filesrc', 'tsparse', 'rtpmp2tpay'",
                Media::Mp4 => {
                    "'filesrc', 'qtdemux', 'h264parse', 'rtph264pay', 'aacparse', 'rtpmp4gpay'"
                }
            };
            let probe = format!(
                "import gi\n\
                 gi.require_version('Gst', '1.0')\n\
                 gi.require_version('GstRtspServer', '1.0')\n\
                 from gi.repository import Gst, GstRtspServer\n\
                 Gst.init(None)\n\
                 missing = [e for e in ({elements}) if Gst.ElementFactory.find(e) is None]\n\
                 assert not missing, 'no GStreamer element ' + ', '.join(missing)\n"
            );
            match Command::new(python).arg("-c").arg(probe).output() {
                Ok(o) if o.status.success() => Ok(()),
                Ok(o) => Err(format!(
                    "{} cannot run GStreamer's RTSP server (python3-gi, gir1.2-gst-rtsp-server-1.0, gstreamer1.0-plugins-good/-bad): {}",
                    python.display(),
                    String::from_utf8_lossy(&o.stderr)
                        .lines()
                        .last()
                        .unwrap_or("")
                )),
                Err(e) => Err(format!("{}: {e}", python.display())),
            }
        }
    }
}

/// Starts a fresh server of `kind` serving `clip`; returns it and the URL of the clip.
/// `program`, under `chrt -f PRIO` when `fifo` says so.
fn command(fifo: Option<u8>, program: &Path) -> Command {
    match fifo {
        Some(p) => {
            let mut c = Command::new("chrt");
            c.args(["-f", &p.to_string()]).arg(program);
            c
        }
        None => Command::new(program),
    }
}

fn start_server(
    kind: ServerKind,
    sessions: usize,
    fifo: Option<u8>,
    clip: &Clip,
    python: &Path,
    plan: &Plan,
) -> Result<(Server, Url)> {
    let media = clip.media;
    let clip = clip.path.as_path();
    let files = tempfile::tempdir()?;
    let name = clip
        .file_name()
        .and_then(|n| n.to_str())
        .context("clip name")?
        .to_string();
    let root = clip.parent().context("clip directory")?;
    match kind {
        ServerKind::Penstock => {
            let port = free_port()?;
            let http_port = free_port()?;
            let conf = files.path().join("penstock.toml");
            // Room for the step's sessions (the defaults allow 256; every client is on
            // 127.0.0.1, so the per-address caps too), and an admission capacity
            // for loopback and a page-cached clip: the defaults (Capacity::CONSERVATIVE,
            // 100 Mbit/s of network, 50 MB/s and 75 seeks/s of disk, 64 buffers) would refuse the 10th
            // 8.5 Mbit/s session with 453. GStreamer's server admits without limit.
            let limit = sessions.max(256) + 16;
            // Each rt session reserves 4 pool buffers (the engine's stream depth) and the rt
            // class may hold 80% of the pool: 5 per session plus room. 256 KiB buffers (the
            // default is 1 MiB) keep that pool at 1.3 GiB for 1024 sessions.
            let buffers = limit * 5 + 64;
            // Admission's CPU charge per send: the cost measured on this machine (not the
            // conservative 20 µs default, which refused the 100th session).
            let send_ns = plan.send_ns;
            let slack = plan
                .slack_us
                .map_or(String::new(), |us| format!("dispatch_slack_us = {us}\n"));
            std::fs::write(
                &conf,
                format!(
                    "[http]\nlisten = \"127.0.0.1:{http_port}\"\n[rtsp]\nlisten = \"127.0.0.1:{port}\"\nsessions_max = {limit}\nconnections_max = {limit}\nsessions_per_address_max = {limit}\nconnections_per_address_max = {limit}\n[engine]\npool_buffers = {buffers}\nbuffer_bytes = \"256KiB\"\n{slack}[admission]\nnet_bytes_per_s = 10000000000\ndisk_seq_bytes_per_s = 10000000000\ndisk_random_iops = 100000000\nstreams_max = {limit}\nbuffer_count = {buffers}\nbuffer_bytes = \"256KiB\"\ncpu_send_ns = {send_ns}\n[log]\naccess = \"off\"\n"
                ),
            )?;
            let mut child = command(fifo, &std::env::current_exe()?)
                .args(["serve", "--config"])
                .arg(&conf)
                .arg("--root")
                .arg(root)
                .args(["--control", "", "--no-control-unix"])
                // Its errors only: the start lines and the root warning would break the table.
                .env("PENSTOCK_LOG", "error")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .context("starting penstock serve")?;
            let start = Instant::now();
            loop {
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    break;
                }
                if let Some(st) = child.try_wait()? {
                    bail!("penstock serve exited early ({st}): does this build serve RTSP?");
                }
                if start.elapsed() > PEER_TIMEOUT {
                    let _ = child.kill();
                    let _ = child.wait();
                    bail!(
                        "penstock serve did not listen on RTSP port {port} within {PEER_TIMEOUT:?}"
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let url = Url::parse(&format!("rtsp://127.0.0.1:{port}/{name}"))?;
            Ok((
                Server {
                    child,
                    _files: files,
                },
                url,
            ))
        }
        ServerKind::Gstreamer => {
            let script = files.path().join("rtsp_gst.py");
            std::fs::write(&script, GST_SCRIPT)?;
            let mount = format!("/{name}");
            let mut child = command(fifo, python)
                .arg(&script)
                .arg(clip)
                .arg(&mount)
                .arg(media.name())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .spawn()
                .with_context(|| format!("starting {}", python.display()))?;
            let stdout = child.stdout.take().context("server stdout")?;
            let (tx, rx) = std::sync::mpsc::channel();
            // A thread reads the start line so that the wait has a timeout; it ends with the
            // server's stdout.
            std::thread::spawn(move || {
                let mut r = BufReader::new(stdout);
                let mut line = String::new();
                let _ = r.read_line(&mut line);
                let _ = tx.send(line);
                let mut sink = Vec::new();
                let _ = r.read_to_end(&mut sink);
            });
            let line = rx.recv_timeout(PEER_TIMEOUT).unwrap_or_default();
            let port = line
                .trim()
                .strip_prefix("port ")
                .and_then(|p| p.parse::<u16>().ok());
            let Some(port) = port else {
                let _ = child.kill();
                let _ = child.wait();
                bail!("GStreamer's RTSP server did not start (its first line: {line:?})");
            };
            let url = Url::parse(&format!("rtsp://127.0.0.1:{port}{mount}"))?;
            Ok((
                Server {
                    child,
                    _files: files,
                },
                url,
            ))
        }
    }
}

/// One RTSP control connection, the minimal client: one request at a time, each answered
/// within [`PEER_TIMEOUT`].
struct RtspConn {
    sock: TcpStream,
    buf: Vec<u8>,
    cseq: u32,
}

impl RtspConn {
    fn connect(url: &Url) -> Result<RtspConn> {
        let port = url.port().unwrap_or(554);
        let addr: SocketAddr = format!("{}:{port}", url.host_str().unwrap_or("127.0.0.1"))
            .parse()
            .context("server address")?;
        let sock = TcpStream::connect_timeout(&addr, PEER_TIMEOUT)
            .with_context(|| format!("connecting to {addr}"))?;
        sock.set_read_timeout(Some(PEER_TIMEOUT))?;
        sock.set_write_timeout(Some(PEER_TIMEOUT))?;
        sock.set_nodelay(true)?;
        Ok(RtspConn {
            sock,
            buf: Vec::new(),
            cseq: 0,
        })
    }

    /// Sends one request and returns its response (status checked by the caller).
    fn request(
        &mut self,
        method: Method,
        uri: &Url,
        extra: &[(headers::HeaderName, String)],
    ) -> Result<Response<Vec<u8>>> {
        self.cseq += 1;
        let mut b = Request::builder(method.clone(), Version::V1_0)
            .request_uri(uri.clone())
            .header(headers::CSEQ, self.cseq.to_string())
            .header(headers::USER_AGENT, "penstock-bench-rtsp");
        for (n, v) in extra {
            b = b.header(n.clone(), v.clone());
        }
        let req = b.empty();
        let mut out = Vec::new();
        req.write(&mut out)
            .map_err(|e| anyhow::anyhow!("writing {method:?}: {e}"))?;
        self.sock.write_all(&out)?;
        let deadline = Instant::now() + PEER_TIMEOUT;
        loop {
            match Message::<Vec<u8>>::parse(&self.buf) {
                Ok((msg, used)) => {
                    self.buf.drain(..used);
                    match msg {
                        Message::Response(r) => {
                            let cseq = r
                                .header(&headers::CSEQ)
                                .map(|v| v.as_str().trim().to_string());
                            if cseq.as_deref() != Some(self.cseq.to_string().as_str()) {
                                // A late answer to an earlier request: skip it.
                                continue;
                            }
                            return Ok(r);
                        }
                        // Requests from the server (none expected) and interleaved data
                        // (none: the transport is UDP) are skipped.
                        _ => continue,
                    }
                }
                Err(rtsp_types::ParseError::Incomplete(_)) => {}
                Err(rtsp_types::ParseError::Error) => {
                    bail!("{method:?}: the server's answer does not parse as RTSP")
                }
            }
            if Instant::now() > deadline {
                bail!("{method:?}: no answer within {PEER_TIMEOUT:?}");
            }
            let mut chunk = [0u8; 4096];
            let n = self
                .sock
                .read(&mut chunk)
                .with_context(|| format!("{method:?}: reading the answer"))?;
            if n == 0 {
                bail!("{method:?}: the server closed the connection");
            }
            if self.buf.len() + n > 1 << 20 {
                bail!("{method:?}: an answer over 1 MiB");
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

fn expect_ok(r: &Response<Vec<u8>>, what: &str) -> Result<()> {
    if r.status() != StatusCode::Ok {
        // The body says why, where the server writes one (penstock does).
        let body = String::from_utf8_lossy(r.body());
        let body: String = body.trim().chars().take(300).collect();
        bail!(
            "{what}: {} {}{}{body}",
            u16::from(r.status()),
            r.reason_phrase(),
            if body.is_empty() { "" } else { ": " }
        );
    }
    Ok(())
}

/// One playing session's control side.
struct Session {
    conn: RtspConn,
    /// The aggregate URL PLAY, OPTIONS and TEARDOWN name.
    url: Url,
    id: String,
    timeout: Duration,
    last_keepalive: Instant,
}

/// DESCRIBE, SETUP of each RTP session (to the receiver's `ports[i]`, `ports[i] + 1`, in
/// [`Media::clocks`]' order: TS's one MP2T stream; MP4's video, then its audio, each checked
/// to run on the clock the receiver assumes) and PLAY.
fn open_session(url: &Url, ports: &[u16], media: Media) -> Result<Session> {
    let mut conn = RtspConn::connect(url)?;
    let r = conn.request(
        Method::Describe,
        url,
        &[(headers::ACCEPT, "application/sdp".into())],
    )?;
    expect_ok(&r, "DESCRIBE")?;
    let sdp = String::from_utf8_lossy(r.body()).into_owned();
    let base = r
        .header(&headers::CONTENT_BASE)
        .and_then(|v| Url::parse(v.as_str().trim()).ok())
        .unwrap_or_else(|| url.clone());
    // (the media section's kind, the encoding its rtpmap names) per RTP session.
    let wanted: &[(&str, &str)] = match media {
        Media::Ts => &[("", "MP2T")],
        Media::Mp4 => &[("video", "H264"), ("audio", "MPEG4-GENERIC")],
    };
    let mut id: Option<(String, Duration)> = None;
    for ((kind, encoding), (&port, &clock)) in wanted.iter().zip(ports.iter().zip(media.clocks())) {
        let section = sdp
            .split("\nm=")
            .skip(1)
            .find(|m| m.starts_with(kind))
            .with_context(|| format!("DESCRIBE: the SDP has no {kind} section:\n{sdp}"))?;
        let want = format!("{encoding}/{}", clock as u32);
        if !section
            .lines()
            .any(|l| l.trim().starts_with("a=rtpmap:") && l.to_ascii_uppercase().contains(&want))
        {
            bail!("DESCRIBE: the SDP's {kind} section names no {want} payload:\n{sdp}");
        }
        let setup_url = section_control_url(section, &base)?;
        let mut h = vec![(
            headers::TRANSPORT,
            format!("RTP/AVP;unicast;client_port={port}-{}", port + 1),
        )];
        if let Some((id, _)) = &id {
            h.push((headers::SESSION, id.clone()));
        }
        let r = conn.request(Method::Setup, &setup_url, &h)?;
        expect_ok(&r, "SETUP")?;
        if id.is_none() {
            let session = r
                .typed_header::<headers::Session>()
                .map_err(|e| anyhow::anyhow!("SETUP: Session header: {e:?}"))?
                .context("SETUP: no Session header")?;
            id = Some((
                session.0,
                Duration::from_secs(session.1.unwrap_or(60).max(2)),
            ));
        }
    }
    let (id, timeout) = id.context("no RTP session to set up")?;
    let play_url = session_control_url(&sdp, &base);
    let r = conn.request(
        Method::Play,
        &play_url,
        &[
            (headers::SESSION, id.clone()),
            (headers::RANGE, "npt=0-".into()),
        ],
    )?;
    expect_ok(&r, "PLAY")?;
    Ok(Session {
        conn,
        url: play_url,
        id,
        timeout,
        last_keepalive: Instant::now(),
    })
}

/// `a=control:` resolved against `base` (RFC 2326 C.1.1): absolute as is, `*` the base, else
/// relative to it.
fn resolve_control(control: &str, base: &Url) -> Result<Url> {
    let control = control.trim();
    if control == "*" {
        return Ok(base.clone());
    }
    if let Ok(u) = Url::parse(control) {
        return Ok(u);
    }
    let mut b = base.as_str().to_string();
    if !b.ends_with('/') {
        b.push('/');
    }
    Ok(Url::parse(&b)?.join(control)?)
}

/// A media section's control URL (the base when it names none).
fn section_control_url(section: &str, base: &Url) -> Result<Url> {
    match section
        .lines()
        .find_map(|l| l.trim().strip_prefix("a=control:"))
    {
        Some(c) => resolve_control(c, base),
        None => Ok(base.clone()),
    }
}

/// The session-level control URL (for PLAY, OPTIONS, TEARDOWN): the base unless the session
/// section says otherwise.
fn session_control_url(sdp: &str, base: &Url) -> Url {
    let session = sdp.split("\nm=").next().unwrap_or("");
    session
        .lines()
        .find_map(|l| l.trim().strip_prefix("a=control:"))
        .and_then(|c| resolve_control(c, base).ok())
        .unwrap_or_else(|| base.clone())
}

impl Session {
    /// OPTIONS with the session at half its timeout (GStreamer and penstock both take it as
    /// a keep-alive).
    fn keepalive_if_due(&mut self) -> Result<()> {
        if self.last_keepalive.elapsed() < self.timeout / 2 {
            return Ok(());
        }
        let url = self.url.clone();
        let r = self.conn.request(
            Method::Options,
            &url,
            &[(headers::SESSION, self.id.clone())],
        )?;
        expect_ok(&r, "OPTIONS keep-alive")?;
        self.last_keepalive = Instant::now();
        Ok(())
    }

    fn teardown(mut self) -> Result<()> {
        let url = self.url.clone();
        let r = self.conn.request(
            Method::Teardown,
            &url,
            &[(headers::SESSION, self.id.clone())],
        )?;
        expect_ok(&r, "TEARDOWN")
    }
}

/// A session's RTP and RTCP sockets: an even port and the next.
fn bind_pair() -> Result<(UdpSocket, UdpSocket)> {
    for _ in 0..200 {
        let rtp = UdpSocket::bind("127.0.0.1:0")?;
        let port = rtp.local_addr()?.port();
        if port % 2 != 0 || port == u16::MAX {
            continue;
        }
        if let Ok(rtcp) = UdpSocket::bind(("127.0.0.1", port + 1)) {
            return Ok((rtp, rtcp));
        }
    }
    bail!("no free pair of UDP ports (even, even + 1) in 200 tries")
}

/// What one RTP session's receiver saw.
#[derive(Debug, Default)]
struct Flow {
    /// The RTP clock, Hz (set before the first packet).
    clock_hz: f64,
    /// The first packet: its extended sequence number is 0, its timestamp and arrival anchor
    /// the due times.
    first: Option<(u16, u32, i128)>,
    /// The highest extended sequence number seen (relative to the first packet's).
    ext_max: i64,
    /// Which extended sequence numbers arrived (relative to the first; earlier ones, from a
    /// reordered start, are counted in `before_first`).
    seen: Vec<u64>,
    before_first: u64,
    received: u64,
    duplicates: u64,
    payload_bytes: u64,
    /// The RTP timestamps' span, first to last packet (`clock_hz` units).
    ts_span_max: i64,
    /// RFC 3550 A.8, in RTP timestamp units.
    jitter: f64,
    last_transit: Option<f64>,
    lateness_ns: Vec<i64>,
    /// The SRs: arrival (CLOCK_REALTIME ns) and the packets each says were sent.
    srs: Vec<(i128, u32)>,
    /// When the first RTCP BYE arrived (CLOCK_REALTIME ns): the media's end, or the server
    /// giving the session up.
    bye_at_ns: Option<i128>,
    /// SO_RXQ_OVFL's last value: datagrams the RTP socket dropped (receive buffer full).
    socket_drops: u32,
}

impl Flow {
    fn on_rtp(&mut self, d: &[u8], arrival_ns: i128) {
        if d.len() < 12 || d[0] >> 6 != 2 {
            return;
        }
        let seq = u16::from_be_bytes([d[2], d[3]]);
        let ts = u32::from_be_bytes([d[4], d[5], d[6], d[7]]);
        let cc = usize::from(d[0] & 0x0f);
        let payload = d.len().saturating_sub(12 + 4 * cc) as u64;
        let (seq0, ts0, t0) = *self.first.get_or_insert((seq, ts, arrival_ns));
        // Extended sequence number: the 16-bit distance from the highest seen so far.
        let highest16 = seq0.wrapping_add(self.ext_max as u16);
        let ext = self.ext_max + i64::from(seq.wrapping_sub(highest16) as i16);
        self.received += 1;
        self.payload_bytes += payload;
        if ext < 0 {
            self.before_first += 1;
        } else {
            let (w, bit) = ((ext / 64) as usize, ext % 64);
            if self.seen.len() <= w {
                self.seen.resize(w + 1, 0);
            }
            if self.seen[w] & (1 << bit) != 0 {
                self.duplicates += 1;
            }
            self.seen[w] |= 1 << bit;
            self.ext_max = self.ext_max.max(ext);
        }
        let rtp_since = i64::from(ts.wrapping_sub(ts0) as i32);
        self.ts_span_max = self.ts_span_max.max(rtp_since);
        let due_ns = t0 + (rtp_since as f64 * 1e9 / self.clock_hz) as i128;
        if self.lateness_ns.len() < LATENESS_SAMPLES_MAX {
            self.lateness_ns.push((arrival_ns - due_ns) as i64);
        }
        // RFC 3550 A.8: transit in timestamp units; J += (|D| - J) / 16.
        let transit = arrival_ns as f64 * self.clock_hz / 1e9 - f64::from(ts);
        if let Some(prev) = self.last_transit {
            let mut dd = transit - prev;
            // The timestamp term wraps at 2^32; the arrival term never does here.
            if dd > 2f64.powi(31) {
                dd -= 2f64.powi(32);
            } else if dd < -(2f64.powi(31)) {
                dd += 2f64.powi(32);
            }
            self.jitter += (dd.abs() - self.jitter) / 16.0;
        }
        self.last_transit = Some(transit);
    }

    fn on_rtcp(&mut self, d: &[u8], items: &mut Vec<RtcpItem>, arrival_ns: i128) {
        items.clear();
        if rtcp::parse(d, items).is_err() {
            return;
        }
        for it in items.iter() {
            match it {
                // At most 4096 kept (one every few seconds: hours of a session).
                RtcpItem::SenderReport { info, .. } if self.srs.len() < 4096 => {
                    self.srs.push((arrival_ns, info.packets));
                }
                RtcpItem::Bye { .. } => {
                    self.bye_at_ns.get_or_insert(arrival_ns);
                }
                _ => {}
            }
        }
    }

    /// Distinct packets received at extended sequence numbers below `n`.
    fn distinct_below(&self, n: u64) -> u64 {
        let full = (n / 64) as usize;
        let mut c: u64 = self
            .seen
            .iter()
            .take(full)
            .map(|w| u64::from(w.count_ones()))
            .sum();
        if let Some(w) = self.seen.get(full) {
            let rem = n % 64;
            if rem > 0 {
                c += u64::from((w & ((1u64 << rem) - 1)).count_ones());
            }
        }
        c
    }

    /// Packets the sequence numbers say were sent (first to highest) and did not arrive.
    fn lost(&self) -> u64 {
        if self.first.is_none() {
            return 0;
        }
        let expected = self.ext_max as u64 + 1;
        expected - self.distinct_below(expected)
    }
}

/// The receiving thread: one epoll set over every session's two sockets; RTP on even tokens,
/// RTCP on odd ones. Returns the flows when `stop` is set.
fn receive(
    sockets: Vec<(UdpSocket, UdpSocket)>,
    clocks: Vec<f64>,
    stop: Arc<AtomicBool>,
) -> Result<Vec<Flow>> {
    use rustix::event::epoll;
    let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
    let mut kernel_times = true;
    for (i, (rtp, rtcp)) in sockets.iter().enumerate() {
        for (k, s) in [(0u64, rtp), (1, rtcp)] {
            s.set_nonblocking(true)?;
            let (ts, _) = enable_receive_meta(s.as_fd());
            kernel_times &= ts;
            epoll::add(
                &ep,
                s,
                epoll::EventData::new_u64(2 * i as u64 + k),
                epoll::EventFlags::IN,
            )?;
        }
    }
    if !kernel_times {
        note("SO_TIMESTAMPNS refused: arrivals timed by the receiving loop's clock");
    }
    let mut flows: Vec<Flow> = clocks
        .iter()
        .map(|&clock_hz| Flow {
            clock_hz,
            ..Flow::default()
        })
        .collect();
    let mut batch = RecvBatch::new(BATCH, SLOT_BYTES);
    let mut events: Vec<epoll::Event> = Vec::with_capacity(256);
    let mut items = Vec::new();
    let wait = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 50_000_000,
    };
    // Sockets with more to read than one turn's budget are served again next turn.
    let mut again: VecDeque<usize> = VecDeque::new();
    while !stop.load(Ordering::Relaxed) {
        events.clear();
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        match epoll::wait(
            &ep,
            rustix::buffer::spare_capacity(&mut events),
            Some(if again.is_empty() { &wait } else { &zero }),
        ) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
        let mut ready: Vec<usize> = events.iter().map(|e| e.data.u64() as usize).collect();
        ready.extend(again.drain(..));
        ready.sort_unstable();
        ready.dedup();
        for tok in ready {
            let (i, is_rtcp) = (tok / 2, tok % 2 == 1);
            let sock = if is_rtcp {
                &sockets[i].1
            } else {
                &sockets[i].0
            };
            // A budget of 4 batches per socket and turn: no session starves the others.
            let mut drained = false;
            for _ in 0..4 {
                match batch.recv(sock.as_fd()) {
                    Ok(n) => {
                        let now = realtime_ns();
                        for j in 0..n {
                            let meta = batch.meta(j);
                            let d = batch.datagram(j);
                            if is_rtcp {
                                flows[i].on_rtcp(d, &mut items, now);
                            } else {
                                let t = meta.kernel_time_ns.map_or(now, i128::from);
                                flows[i].on_rtp(d, t);
                                if let Some(dr) = meta.drops {
                                    flows[i].socket_drops = dr;
                                }
                            }
                        }
                        if n < batch.batch() {
                            drained = true;
                            break;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        drained = true;
                        break;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    // ECONNREFUSED and the like from an earlier send: nothing to count.
                    Err(_) => {
                        drained = true;
                        break;
                    }
                }
            }
            if !drained {
                again.push_back(tok);
            }
        }
    }
    Ok(flows)
}

fn note(s: &str) {
    eprintln!("penstock bench rtsp: {s}");
}

fn realtime_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

/// One step of the ramp: N sessions of one server.
#[derive(Debug, Clone)]
struct Step {
    sessions: usize,
    /// Sessions that reached PLAY.
    playing: usize,
    /// Why the step could not run (a session refused, a server that did not start).
    error: Option<String>,
    packets: u64,
    lost: u64,
    /// Of the lost: dropped by the receiving sockets themselves (SO_RXQ_OVFL).
    receiver_drops: u64,
    duplicates: u64,
    /// Payload bytes received / the file's bytes over the media time played (the RTP
    /// timestamps' span plus one packet), over all sessions.
    bytes_ratio: f64,
    /// Sessions with at least one SR, and those whose last SR's packet count equals the
    /// packets received up to it.
    sessions_with_sr: usize,
    sr_match: usize,
    jitter_ms_mean: f64,
    jitter_ms_max: f64,
    lateness_ms_p50: f64,
    lateness_ms_p99: f64,
    lateness_ms_max: f64,
    window_s: f64,
    server_cpu_s: f64,
    /// The server's CPU per session: CPU seconds per second per session (1.0 = one CPU).
    server_cpu_per_session: f64,
    /// This process's (receivers and clients) CPU seconds per second over the window.
    receiver_cpu_share: f64,
    clean: bool,
}

impl Step {
    fn failed(n: usize, why: String) -> Step {
        Step {
            sessions: n,
            playing: 0,
            error: Some(why),
            packets: 0,
            lost: 0,
            receiver_drops: 0,
            duplicates: 0,
            bytes_ratio: f64::NAN,
            sessions_with_sr: 0,
            sr_match: 0,
            jitter_ms_mean: f64::NAN,
            jitter_ms_max: f64::NAN,
            lateness_ms_p50: f64::NAN,
            lateness_ms_p99: f64::NAN,
            lateness_ms_max: f64::NAN,
            window_s: 0.0,
            server_cpu_s: f64::NAN,
            server_cpu_per_session: f64::NAN,
            receiver_cpu_share: f64::NAN,
            clean: false,
        }
    }

    fn json(&self) -> Value {
        json!({
            "sessions": self.sessions, "playing": self.playing, "error": self.error,
            "packets": self.packets, "lost": self.lost, "receiver_drops": self.receiver_drops,
            "duplicates": self.duplicates, "bytes_ratio": finite(self.bytes_ratio),
            "sessions_with_sr": self.sessions_with_sr, "sr_match": self.sr_match,
            "jitter_ms_mean": finite(self.jitter_ms_mean), "jitter_ms_max": finite(self.jitter_ms_max),
            "lateness_ms_p50": finite(self.lateness_ms_p50), "lateness_ms_p99": finite(self.lateness_ms_p99),
            "lateness_ms_max": finite(self.lateness_ms_max), "window_s": self.window_s,
            "server_cpu_s": finite(self.server_cpu_s),
            "server_cpu_per_session": finite(self.server_cpu_per_session),
            "receiver_cpu_share": finite(self.receiver_cpu_share), "clean": self.clean,
        })
    }
}

fn finite(v: f64) -> Value {
    if v.is_finite() { json!(v) } else { Value::Null }
}

/// Runs N sessions against a fresh server of `kind`.
fn run_step(
    kind: ServerKind,
    n: usize,
    clip: &Clip,
    plan: &Plan,
    a: &RtspArgs,
    python: &Path,
) -> Result<Step> {
    let (server, url) = start_server(kind, n, a.fifo, clip, python, plan)?;
    let clocks: Vec<f64> = (0..n).flat_map(|_| clip.media.clocks()).copied().collect();
    let mut pairs = Vec::with_capacity(clocks.len());
    for _ in 0..clocks.len() {
        let (rtp, rtcp) = bind_pair()?;
        // The kernel caps it at net.core.rmem_max; `run` prints what it kept.
        let _ = socket2::SockRef::from(&rtp).set_recv_buffer_size(RCVBUF_BYTES);
        pairs.push((rtp, rtcp));
    }
    let ports: Vec<u16> = pairs
        .iter()
        .map(|(r, _)| r.local_addr().map(|a| a.port()))
        .collect::<std::io::Result<_>>()?;
    let stop = Arc::new(AtomicBool::new(false));
    let receiver = {
        let stop = stop.clone();
        let fifo = a.fifo;
        std::thread::Builder::new()
            .name("rtsp-receiver".into())
            .spawn(move || {
                if let Some(p) = fifo {
                    // This thread alone, by its id: chrt -p on a thread id sets that thread.
                    let tid = rustix::thread::gettid().as_raw_nonzero().get();
                    let ok = Command::new("chrt")
                        .args([
                            "-f",
                            "-p",
                            &(u32::from(p) + 1).to_string(),
                            &tid.to_string(),
                        ])
                        .stdout(Stdio::null())
                        .status()
                        .is_ok_and(|s| s.success());
                    if !ok {
                        bail!(
                            "chrt -f -p {} {tid}: could not make the receiver SCHED_FIFO",
                            u32::from(p) + 1
                        );
                    }
                }
                receive(pairs, clocks, stop)
            })?
    };
    // From here the receiver must be stopped on every way out.
    let result = drive(&server, &url, &ports, clip.media, plan, a);
    stop.store(true, Ordering::Relaxed);
    let flows = receiver
        .join()
        .map_err(|_| anyhow::anyhow!("the receiving thread panicked"))??;
    drop(server);
    let (sessions, window) = match result {
        Ok(v) => v,
        Err(e) => return Ok(Step::failed(n, format!("{e:#}"))),
    };
    Ok(summarize(n, sessions, window, &flows, clip, a))
}

/// What `drive` measured over the window.
struct Window {
    seconds: f64,
    /// The window's end, CLOCK_REALTIME ns (the receivers' clock).
    end_ns: i128,
    server_cpu_s: f64,
    self_cpu_s: f64,
}

/// Opens the sessions over `--stagger`, measures `--duration`, tears them down.
fn drive(
    server: &Server,
    url: &Url,
    ports: &[u16],
    media: Media,
    plan: &Plan,
    a: &RtspArgs,
) -> Result<(usize, Window)> {
    let per_session = media.clocks().len();
    let n = ports.len() / per_session;
    let gap = a.stagger / n.max(1) as u32;
    let mut sessions = Vec::with_capacity(n);
    for (i, p) in ports.chunks(per_session).enumerate() {
        let s = open_session(url, p, media).with_context(|| format!("session {} of {n}", i + 1))?;
        sessions.push(s);
        std::thread::sleep(gap);
    }
    let pid = server.child.id();
    let self_pid = std::process::id();
    let (c0, s0, t0) = (
        process_cpu_s(pid)?,
        process_cpu_s(self_pid)?,
        Instant::now(),
    );
    let end = t0 + plan.duration;
    while Instant::now() < end {
        std::thread::sleep((end - Instant::now()).min(Duration::from_millis(200)));
        for s in &mut sessions {
            s.keepalive_if_due()?;
        }
    }
    let (c1, s1, t1) = (
        process_cpu_s(pid)?,
        process_cpu_s(self_pid)?,
        Instant::now(),
    );
    let end_ns = realtime_ns();
    let playing = sessions.len();
    for s in sessions {
        // A refused TEARDOWN is said, not fatal: the server is stopped next anyway.
        if let Err(e) = s.teardown() {
            eprintln!("penstock bench rtsp: TEARDOWN: {e:#}");
        }
    }
    // The last datagrams in flight.
    std::thread::sleep(Duration::from_millis(100));
    Ok((
        playing,
        Window {
            seconds: (t1 - t0).as_secs_f64(),
            end_ns,
            server_cpu_s: c1 - c0,
            self_cpu_s: s1 - s0,
        },
    ))
}

fn summarize(
    n: usize,
    playing: usize,
    w: Window,
    flows: &[Flow],
    clip: &Clip,
    a: &RtspArgs,
) -> Step {
    let packets: u64 = flows.iter().map(|f| f.received).sum();
    let lost: u64 = flows.iter().map(Flow::lost).sum();
    let receiver_drops: u64 = flows.iter().map(|f| u64::from(f.socket_drops)).sum();
    let duplicates: u64 = flows.iter().map(|f| f.duplicates).sum();
    let bytes_per_s = clip.bytes as f64 / clip.seconds;
    let mut got = 0.0;
    let mut expected = 0.0;
    // Per session (its RTP sessions together carry the file's rate): the media time played
    // is its flows' longest span; each span runs from the first packet's timestamp to the
    // last's, so one packet more per flow.
    for session in flows.chunks(clip.media.clocks().len()) {
        let played = session.iter().filter(|f| f.received > 1);
        let span_s = played
            .clone()
            .map(|f| f.ts_span_max as f64 / f.clock_hz)
            .fold(0.0, f64::max);
        if span_s == 0.0 {
            continue;
        }
        for f in played {
            got += f.payload_bytes as f64;
            expected += f.payload_bytes as f64 / f.received as f64;
        }
        expected += span_s * bytes_per_s;
    }
    // The last SR that arrived within the window: the one a server sends with its BYE at
    // TEARDOWN may count packets it then dropped from its queues (GStreamer's does).
    let last_sr = |f: &Flow| {
        f.srs
            .iter()
            .rev()
            .find(|(t, _)| *t < w.end_ns)
            .map(|&(_, c)| u64::from(c))
    };
    let with_sr: Vec<u64> = flows
        .iter()
        .filter_map(|f| last_sr(f).map(|c| u64::from(f.distinct_below(c) == c)))
        .collect();
    let sr_match = with_sr.iter().sum::<u64>() as usize;
    let jitters: Vec<f64> = flows
        .iter()
        .filter(|f| f.received > 1)
        .map(|f| f.jitter / f.clock_hz * 1e3)
        .collect();
    let lateness: Vec<f64> = flows
        .iter()
        .flat_map(|f| f.lateness_ns.iter().map(|&l| l as f64 / 1e6))
        .collect();
    let p99 = percentile(&lateness, 99);
    // A session whose media ended before the window did (opening N sessions took longer than
    // the clip allows) was not measured for the whole window: the step says so and is not
    // clean.
    let ended = flows
        .iter()
        .filter(|f| f.bye_at_ns.is_some_and(|t| t < w.end_ns))
        .count();
    let error = (ended > 0).then(|| {
        format!("{ended} of {n} sessions ended (RTCP BYE) before the measured window did: opening them took too long for the clip; raise --clip")
    });
    let clean = ended == 0
        && playing == n
        && flows.iter().all(|f| f.received > 0)
        && lost == 0
        && p99 <= a.lateness_max.as_secs_f64() * 1e3;
    Step {
        sessions: n,
        playing,
        error,
        packets,
        lost,
        receiver_drops,
        duplicates,
        bytes_ratio: got / expected,
        sessions_with_sr: with_sr.len(),
        sr_match,
        jitter_ms_mean: jitters.iter().sum::<f64>() / jitters.len() as f64,
        jitter_ms_max: jitters.iter().copied().fold(f64::NAN, f64::max),
        lateness_ms_p50: percentile(&lateness, 50),
        lateness_ms_p99: p99,
        lateness_ms_max: lateness.iter().copied().fold(f64::NAN, f64::max),
        window_s: w.seconds,
        server_cpu_s: w.server_cpu_s,
        server_cpu_per_session: w.server_cpu_s / w.seconds / n as f64,
        receiver_cpu_share: w.self_cpu_s / w.seconds,
        clean,
    }
}

/// The ramp of one server: doubling from `--start`, then bisection.
fn ramp(
    kind: ServerKind,
    clip: &Clip,
    plan: &Plan,
    a: &RtspArgs,
    python: &Path,
    h: &mut dyn Write,
) -> Result<Vec<Step>> {
    let mut steps: Vec<Step> = Vec::new();
    let run = |n: usize, steps: &mut Vec<Step>, h: &mut dyn Write| -> Result<bool> {
        let s = match run_step(kind, n, clip, plan, a, python) {
            Ok(s) => s,
            Err(e) => Step::failed(n, format!("{e:#}")),
        };
        writeln!(h, "{}", row(kind, &s))?;
        h.flush()?;
        let clean = s.clean;
        steps.push(s);
        Ok(clean)
    };
    let (mut lo, mut hi): (Option<usize>, Option<usize>) = (None, None);
    let mut n = a.start;
    loop {
        if run(n, &mut steps, h)? {
            lo = Some(n);
            if n >= plan.max_sessions {
                break;
            }
            n = (n * 2).min(plan.max_sessions);
        } else {
            hi = Some(n);
            break;
        }
    }
    for _ in 0..plan.bisect {
        let (Some(l), Some(u)) = (lo, hi) else { break };
        if u - l <= 1 {
            break;
        }
        let m = l + (u - l) / 2;
        if run(m, &mut steps, h)? {
            lo = Some(m);
        } else {
            hi = Some(m);
        }
    }
    Ok(steps)
}

const HEADER: &str = "| server | N | clean | playing | RTP packets | lost (receiver drops) | bytes / file's | SR count = received | jitter mean / max ms | lateness p50 / p99 / max ms | server CPU per session | receiver CPU |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|";

fn row(kind: ServerKind, s: &Step) -> String {
    let note = s
        .error
        .as_ref()
        .map(|e| format!("\n\n  (not clean: {})\n", e.replace('\n', " ")))
        .unwrap_or_default();
    if let (Some(e), 0) = (&s.error, s.packets) {
        return format!(
            "| {} | {} | no | {} | – | – | – | – | – | – | – | – |\n\n  (failed: {})\n",
            kind.name(),
            s.sessions,
            s.playing,
            e.replace('\n', " ")
        );
    }
    format!(
        "| {} | {} | {} | {} | {} | {} ({}) | {:.4} | {}/{} | {:.3} / {:.3} | {:.2} / {:.2} / {:.2} | {:.2}% | {:.1}% |",
        kind.name(),
        s.sessions,
        if s.clean { "yes" } else { "**no**" },
        s.playing,
        s.packets,
        s.lost,
        s.receiver_drops,
        s.bytes_ratio,
        s.sr_match,
        s.sessions_with_sr,
        s.jitter_ms_mean,
        s.jitter_ms_max,
        s.lateness_ms_p50,
        s.lateness_ms_p99,
        s.lateness_ms_max,
        s.server_cpu_per_session * 100.0,
        s.receiver_cpu_share * 100.0
    ) + &note
}

/// A server's summary: the largest clean N and its step.
fn best(steps: &[Step]) -> Option<&Step> {
    steps.iter().filter(|s| s.clean).max_by_key(|s| s.sessions)
}

/// /dev/shm where it exists (the clip in memory: the servers are measured, not the disk,
/// and another process's I/O on a shared disk would show as lateness), else the temp dir.
fn default_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.join("penstock-bench-rtsp")
    } else {
        std::env::temp_dir().join("penstock-bench-rtsp")
    }
}

pub fn run(a: RtspArgs) -> Result<()> {
    let mut plan = Plan::of(&a)?;
    let send_cost = if plan.send_ns > 0 {
        "given (--send-cost)"
    } else {
        plan.send_ns = penstock_driver::send_cost::measure_send_ns(SEND_COST_TIME)
            .context("measuring the CPU cost of a UDP send")?;
        "measured here at the start"
    };
    let dest = out::dest(&a.json);
    let mut h = out::human(dest);
    let python = python(&a);
    let dir = a.dir.clone().unwrap_or_else(default_dir);
    let mut notes = Vec::new();
    let rcvbuf = {
        let (rtp, _) = bind_pair()?;
        let s = socket2::SockRef::from(&rtp);
        let _ = s.set_recv_buffer_size(RCVBUF_BYTES);
        s.recv_buffer_size().unwrap_or(0)
    };
    let mut servers = Vec::new();
    for &k in &a.servers {
        match check_server(k, &python, a.media) {
            Ok(()) => servers.push(k),
            Err(why) => {
                writeln!(h, "{}: skipped: {why}", k.name())?;
                notes.push(format!("{}: skipped: {why}", k.name()));
            }
        }
    }
    if servers.is_empty() {
        eprintln!("penstock bench rtsp: no server to measure");
        std::process::exit(2);
    }
    let machine = machine_line();
    let clip = make_clip(&dir, plan.clip.as_secs().max(1), &a.video_bitrate, a.media)?;
    writeln!(h, "# penstock bench rtsp\n\n{machine}\n")?;
    writeln!(
        h,
        "Clip: {} ({} bytes, {:.1} s, {:.2} Mbit/s). Each step: a fresh server, N sessions opened over {:?}, {:?} measured once all play; clean = no loss and p99 lateness ≤ {:?}. Server CPU per session: the server process's CPU over the window / N / seconds (100% = one CPU); receiver CPU: this process's (one receiving thread, the RTSP clients); RTP sockets' receive buffer {rcvbuf} bytes. Scheduling: {}.\n",
        clip.path.display(),
        clip.bytes,
        clip.seconds,
        clip.bytes as f64 * 8.0 / clip.seconds / 1e6,
        a.stagger,
        plan.duration,
        a.lateness_max,
        match a.fifo {
            Some(p) => format!(
                "both servers SCHED_FIFO {p} (chrt), the receiving thread {}",
                u32::from(p) + 1
            ),
            None => "the default (SCHED_OTHER) for servers and receiver".to_string(),
        }
    )?;
    writeln!(
        h,
        "penstock: admission charges {} ns of CPU per send ({send_cost}; 1316-byte UDP sends to a loopback receiver); dispatch slack {}.\n",
        plan.send_ns,
        plan.slack_us
            .map_or("the engine's default".to_string(), |us| format!("{us} µs"))
    )?;
    writeln!(h, "{HEADER}")?;
    let mut results = Vec::new();
    for &k in &servers {
        let steps = ramp(k, &clip, &plan, &a, &python, &mut *h)?;
        results.push((k, steps));
    }
    writeln!(
        h,
        "\n| server | largest clean N | server CPU per session at it | jitter mean ms | lateness p99 ms |\n|---|---:|---:|---:|---:|"
    )?;
    for (k, steps) in &results {
        match best(steps) {
            Some(s) => writeln!(
                h,
                "| {} | {}{} | {:.2}% | {:.3} | {:.2} |",
                k.name(),
                s.sessions,
                if s.sessions >= plan.max_sessions {
                    " (the cap)"
                } else {
                    ""
                },
                s.server_cpu_per_session * 100.0,
                s.jitter_ms_mean,
                s.lateness_ms_p99
            )?,
            None => writeln!(h, "| {} | 0 | – | – | – |", k.name())?,
        }
    }
    let steps_of = |kind| results.iter().find(|(k, _)| *k == kind).map(|(_, s)| s);
    let goal = match (
        steps_of(ServerKind::Penstock),
        steps_of(ServerKind::Gstreamer),
    ) {
        (Some(ps), Some(gs)) => {
            let (p, g) = (best(ps), best(gs));
            let pn = p.map_or(0, |s| s.sessions);
            let gn = g.map_or(0, |s| s.sessions);
            // CPU per session falls with N (fixed costs shared, batches fuller), so it is
            // compared twice: each at its own largest clean N, and both at the largest N both
            // kept clean (the same load).
            let own = match (p, g) {
                (Some(p), Some(g)) => p.server_cpu_per_session / g.server_cpu_per_session,
                _ => f64::NAN,
            };
            let common = ps
                .iter()
                .filter(|s| s.clean)
                .filter_map(|p| {
                    gs.iter()
                        .find(|g| g.clean && g.sessions == p.sessions)
                        .map(|g| {
                            (
                                p.sessions,
                                p.server_cpu_per_session / g.server_cpu_per_session,
                            )
                        })
                })
                .max_by_key(|(n, _)| *n);
            let (common_n, same) = common.unwrap_or((0, f64::NAN));
            let met = gn > 0 && pn >= 2 * gn && own <= 0.5 && same <= 0.5;
            let capped = pn >= plan.max_sessions && pn < 2 * gn;
            let line = if gn == 0 || pn == 0 {
                // No ratio exists: say which server kept no step clean instead of
                // printing NaN or inf (a stalled machine does this to both).
                format!(
                    "Goal: ≥ 2× GStreamer's sessions at ≤ 0.5× its CPU per session: NOT judged ({} kept no step clean: sessions {pn} vs {gn})",
                    match (pn, gn) {
                        (0, 0) => "neither server",
                        (0, _) => "penstock",
                        _ => "GStreamer",
                    }
                )
            } else {
                format!(
                    "Goal: ≥ 2× GStreamer's sessions at ≤ 0.5× its CPU per session: {} (sessions {pn} vs {gn}, {:.2}×{}; CPU per session {:.2}× at each one's largest clean N, {:.2}× at N = {common_n}, the largest both kept clean){}",
                    if met { "met" } else { "NOT met" },
                    pn as f64 / gn as f64,
                    if pn >= plan.max_sessions {
                        ", penstock at the cap"
                    } else {
                        ""
                    },
                    own,
                    same,
                    if capped {
                        " — penstock reached --max-sessions: raise it"
                    } else {
                        ""
                    }
                )
            };
            writeln!(h, "\n{line}")?;
            Some(json!({
                "met": met, "sessions_ratio": finite(pn as f64 / gn as f64),
                "cpu_per_session_ratio": finite(own),
                "common_sessions": common_n, "cpu_per_session_ratio_at_common": finite(same),
                "line": line,
            }))
        }
        _ => None,
    };
    if let Some(d) = dest {
        let v = json!({
            "bench": "rtsp",
            "media": a.media.name(),
            "machine": machine,
            "clip": {"path": clip.path, "bytes": clip.bytes, "seconds": clip.seconds, "media": clip.media.name()},
            "duration_s": plan.duration.as_secs_f64(),
            "stagger_s": a.stagger.as_secs_f64(),
            "lateness_max_ms": a.lateness_max.as_secs_f64() * 1e3,
            "max_sessions": plan.max_sessions,
            "fifo": a.fifo,
            "penstock_cpu_send_ns": plan.send_ns,
            "penstock_dispatch_slack_us": plan.slack_us,
            "notes": notes,
            "servers": results.iter().map(|(k, steps)| json!({
                "server": k.name(),
                "largest_clean": best(steps).map_or(0, |s| s.sessions),
                "steps": steps.iter().map(Step::json).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "goal": goal,
        });
        out::write_json(d, &v)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rtp(seq: u16, ts: u32) -> Vec<u8> {
        let mut d = vec![0u8; 12 + 1316];
        d[0] = 0x80;
        d[1] = 33;
        d[2..4].copy_from_slice(&seq.to_be_bytes());
        d[4..8].copy_from_slice(&ts.to_be_bytes());
        d
    }

    #[test]
    fn a_gap_in_the_sequence_is_loss_across_the_wrap() {
        let mut f = Flow {
            clock_hz: RTP_CLOCK_HZ,
            ..Flow::default()
        };
        // 65534, 65535, 0, (1 lost), 2: the wrap is no loss, the hole is one.
        for (i, seq) in [65534u16, 65535, 0, 2].into_iter().enumerate() {
            f.on_rtp(&rtp(seq, 1000 + 90 * i as u32), 1_000_000 * i as i128);
        }
        assert_eq!(f.received, 4);
        assert_eq!(f.ext_max, 4);
        assert_eq!(f.lost(), 1);
        assert_eq!(f.payload_bytes, 4 * 1316);
        // A late duplicate counts as one, not as negative loss.
        f.on_rtp(&rtp(0, 1180), 5_000_000);
        assert_eq!(f.duplicates, 1);
        assert_eq!(f.lost(), 1);
        assert_eq!(f.distinct_below(3), 3);
    }

    #[test]
    fn lateness_is_arrival_minus_due_from_the_first_packet() {
        let mut f = Flow {
            clock_hz: RTP_CLOCK_HZ,
            ..Flow::default()
        };
        // 1 ms of RTP time = 90 ticks. The second packet arrives 3 ms after its due time.
        f.on_rtp(&rtp(10, u32::MAX - 45), 0);
        f.on_rtp(&rtp(11, 44), 4_000_000);
        assert_eq!(f.lateness_ns, vec![0, 3_000_000]);
        // RFC 3550: D = 3 ms in ticks (270); J = 270/16.
        assert!((f.jitter - 270.0 / 16.0).abs() < 1e-6, "{}", f.jitter);
        assert_eq!(f.ts_span_max, 90);
    }

    #[test]
    fn control_urls_resolve_as_rfc_2326_says() {
        let base = Url::parse("rtsp://127.0.0.1:8554/clip.ts/").unwrap();
        assert_eq!(
            resolve_control("stream=0", &base).unwrap().as_str(),
            "rtsp://127.0.0.1:8554/clip.ts/stream=0"
        );
        let base = Url::parse("rtsp://127.0.0.1:8554/clip.ts").unwrap();
        assert_eq!(
            resolve_control("trackID=1", &base).unwrap().as_str(),
            "rtsp://127.0.0.1:8554/clip.ts/trackID=1"
        );
        assert_eq!(resolve_control("*", &base).unwrap(), base);
        assert_eq!(
            resolve_control("rtsp://h:1/x", &base).unwrap().as_str(),
            "rtsp://h:1/x"
        );
        let sdp = "v=0\r\na=control:*\r\nm=video 0 RTP/AVP 33\r\na=rtpmap:33 MP2T/90000\r\na=control:stream=0\r\n";
        assert_eq!(
            section_control_url(sdp.split("\nm=").nth(1).unwrap(), &base)
                .unwrap()
                .as_str(),
            "rtsp://127.0.0.1:8554/clip.ts/stream=0"
        );
        assert_eq!(session_control_url(sdp, &base), base);
    }

    #[test]
    fn rates_in_ffmpeg_syntax() {
        assert_eq!(ffmpeg_rate("8M").unwrap(), 8_000_000);
        assert_eq!(ffmpeg_rate("500k").unwrap(), 500_000);
        assert_eq!(ffmpeg_rate("1000").unwrap(), 1000);
        assert!(ffmpeg_rate("0").is_err());
        assert!(ffmpeg_rate("x").is_err());
    }
}
