//! `penstock bench hls` (issue 32; issue 36's HLS half): HLS viewers of penstock against nginx
//! in the same run.
//!
//! **The titles.** ffmpeg makes one H.264 + AAC title (`--title-s` long, `--kbps` video,
//! 128 kbit/s audio, a key frame every `--segment-s`) as MP4 and as MPEG-TS. penstock serves
//! the two files as they are: the TS's playlist is byte ranges of the `.ts` (sent by
//! sendfile), the MP4 is packaged as fMP4 on the fly (a generated `moof` + `mdat` header, then
//! the samples' bytes of the MP4 by sendfile; audio and video as separate renditions). nginx
//! serves ffmpeg's pre-segmented copies of the same title (`-f hls`, TS segments and fMP4
//! segments), the usual VOD set-up; their size on disk is reported as the copies penstock does
//! not need.
//!
//! **The viewers.** One event-driven emulator (this process, one epoll set, one keep-alive
//! connection per viewer) plays N viewers against one server at a time. A viewer asks for the
//! playlists it would (the multivariant playlist, then each media playlist), the init
//! segments, then segment 0 of each rendition; when those are in, it "starts playing" at
//! `t0`. Segment i (i ≥ 1) is then asked for one target duration before it is needed, at
//! `t0 + start(i) − target`, and it is **late** if its last byte arrives after `t0 + start(i)`
//! (`start(i)`: the sum of the EXTINF durations before it). A viewer that reaches the end of
//! the playlist goes on from its first segment (the times keep adding up). Viewers start spread
//! over the first target duration, so they do not ask in step. A response that is not 200/206
//! with a `Content-Length`, a closed connection or a timeout (10 s) is an error.
//!
//! **What is measured**, per step of N viewers and server: late segments (and the segments
//! asked), the p99 of a segment's fetch time as a fraction of its duration, the server's CPU
//! (utime + stime of every server process, /proc/PID/stat) over the window after the ramp,
//! per viewer (CPU-milliseconds per viewer per second of playback), the emulator's own CPU
//! (it shares the machine), and errors. Servers run on the first half of the CPUs, the
//! emulator on the rest (`--no-pin`: anywhere), as `bench http` places them.

use std::collections::{BinaryHeap, HashMap};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::http::{
    Child2, cpu_s, ensure_tools, free_port, machine_line, proc_cpu_s, start_nginx, wait_listening,
};

#[derive(Args, Debug)]
pub struct HlsArgs {
    /// Shorter title (24 s), steps 10,50 and 8 s windows.
    #[arg(long)]
    pub quick: bool,
    /// Viewer counts, comma-separated (default 10,50,100,200; --quick 10,50).
    #[arg(long)]
    pub viewers: Option<String>,
    /// Seconds each step is measured after its ramp (default 20; --quick 8).
    #[arg(long)]
    pub duration_s: Option<u64>,
    /// Length of the title in seconds (default 60; --quick 24).
    #[arg(long)]
    pub title_s: Option<u64>,
    /// Segment target duration (both servers) and the title's key-frame interval, in seconds.
    #[arg(long, default_value_t = 2)]
    pub segment_s: u64,
    /// The title's video bitrate, kbit/s.
    #[arg(long, default_value_t = 2000)]
    pub kbps: u64,
    /// Which packagings: `ts`, `mp4` or both (default ts,mp4).
    #[arg(long, default_value = "ts,mp4")]
    pub formats: String,
    /// Let the scheduler place the servers and the emulator (default: servers on the first
    /// half of the CPUs, the emulator on the rest).
    #[arg(long)]
    pub no_pin: bool,
    /// Also write the table (Markdown) here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write every cell's figures as JSON here; a bare `--json` writes them on stdout (the
    /// table then goes to stderr).
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
}

/// One request a viewer makes: a path and, for a byte-range segment, its range.
#[derive(Clone, Debug, PartialEq)]
struct Fetch {
    path: String,
    range: Option<(u64, u64)>,
}

/// What a viewer of one title asks: its start-up requests (playlists and init segments), then
/// per segment index one request per rendition, with the segment's duration.
#[derive(Clone, Debug)]
struct Plan {
    startup: Vec<Fetch>,
    /// segments[i] = (duration s, one fetch per rendition).
    segments: Vec<(f64, Vec<Fetch>)>,
}

/// `rel` resolved against the directory of `base` (both paths on the same server, RFC 3986's
/// merge and dot-segment removal for the forms playlists use).
fn resolve(base: &str, rel: &str) -> String {
    if rel.starts_with('/') {
        return rel.to_string();
    }
    let base = base.split('?').next().unwrap_or(base);
    let mut parts: Vec<&str> = base.split('/').collect();
    parts.pop(); // the playlist's own name
    let (rel_path, query) = match rel.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rel, None),
    };
    for seg in rel_path.split('/') {
        match seg {
            "." => {}
            ".." => {
                if parts.len() > 1 {
                    parts.pop();
                }
            }
            s => parts.push(s),
        }
    }
    let mut out = parts.join("/");
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

/// The value of `KEY=` in an attribute list (quoted or not).
fn attr<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let at = line.find(&format!("{key}="))? + key.len() + 1;
    let rest = &line[at..];
    if let Some(q) = rest.strip_prefix('"') {
        q.split('"').next()
    } else {
        rest.split(',').next()
    }
}

/// `LEN[@OFF]` (OFF defaulting to the end of the previous range of the same URI).
fn byterange(v: &str, next: u64) -> Option<(u64, u64)> {
    let (len, off) = match v.split_once('@') {
        Some((l, o)) => (l.parse().ok()?, o.parse().ok()?),
        None => (v.parse().ok()?, next),
    };
    Some((off, len))
}

/// A media playlist: its init segment (if any) and its segments with their durations.
type MediaPlaylist = (Option<Fetch>, Vec<(f64, Fetch)>);

/// A media playlist's init segment (if any) and segments.
fn media_playlist(url: &str, text: &str) -> Result<MediaPlaylist> {
    let mut map = None;
    let mut segs = Vec::new();
    let (mut dur, mut range): (Option<f64>, Option<(u64, u64)>) = (None, None);
    let mut next_off: HashMap<String, u64> = HashMap::new();
    for l in text.lines().map(str::trim) {
        if let Some(v) = l.strip_prefix("#EXT-X-MAP:") {
            let uri = attr(v, "URI").context("EXT-X-MAP without URI")?;
            let r = attr(v, "BYTERANGE").and_then(|b| byterange(b, 0));
            map = Some(Fetch {
                path: resolve(url, uri),
                range: r,
            });
        } else if let Some(v) = l.strip_prefix("#EXTINF:") {
            dur = Some(v.split(',').next().unwrap_or("").parse()?);
        } else if let Some(v) = l.strip_prefix("#EXT-X-BYTERANGE:") {
            // OFF may be missing: resolved when the URI is known, below.
            range = byterange(v, u64::MAX);
        } else if !l.is_empty() && !l.starts_with('#') {
            let path = resolve(url, l);
            let r = range.take().map(|(off, len)| {
                let off = if off == u64::MAX {
                    next_off.get(&path).copied().unwrap_or(0)
                } else {
                    off
                };
                next_off.insert(path.clone(), off + len);
                (off, len)
            });
            let d = dur.take().context("a segment without EXTINF")?;
            segs.push((d, Fetch { path, range: r }));
        }
    }
    if segs.is_empty() {
        bail!("no segment in {url}");
    }
    Ok((map, segs))
}

/// A blocking GET (for building the plans before a step): status and body.
fn get(port: u16, path: &str) -> Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    let end = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no response head")?;
    let status = std::str::from_utf8(out.get(9..12).unwrap_or(b""))?.parse()?;
    Ok((status, out[end + 4..].to_vec()))
}

/// The plan of a viewer of the playlist at `url` on `port`: a multivariant playlist is followed
/// to its first variant and its audio rendition (as a player that picks one level does).
fn plan(port: u16, url: &str) -> Result<Plan> {
    let (status, body) = get(port, url)?;
    if status != 200 {
        bail!("{url}: {status}");
    }
    let text = String::from_utf8(body)?;
    let mut startup = vec![Fetch {
        path: url.to_string(),
        range: None,
    }];
    let mut medias = Vec::new();
    if text.contains("#EXT-X-STREAM-INF") {
        let mut lines = text.lines().map(str::trim);
        while let Some(l) = lines.next() {
            if l.starts_with("#EXT-X-MEDIA:")
                && attr(l, "TYPE") == Some("AUDIO")
                && let Some(u) = attr(l, "URI")
                && medias.is_empty()
            {
                medias.push(resolve(url, u));
            }
            if l.starts_with("#EXT-X-STREAM-INF") {
                let v = lines.next().context("EXT-X-STREAM-INF without URI")?;
                medias.insert(0, resolve(url, v));
                break;
            }
        }
    } else {
        medias.push(url.to_string());
    }
    let mut tracks = Vec::new();
    for m in &medias {
        let text = if m == url {
            text.clone()
        } else {
            startup.push(Fetch {
                path: m.clone(),
                range: None,
            });
            let (status, body) = get(port, m)?;
            if status != 200 {
                bail!("{m}: {status}");
            }
            String::from_utf8(body)?
        };
        let (map, segs) = media_playlist(m, &text)?;
        if let Some(f) = map {
            startup.push(f);
        }
        tracks.push(segs);
    }
    let n = tracks.iter().map(Vec::len).min().unwrap_or(0);
    let segments = (0..n)
        .map(|i| {
            (
                tracks[0][i].0,
                tracks.iter().map(|t| t[i].1.clone()).collect(),
            )
        })
        .collect();
    Ok(Plan { startup, segments })
}

/// One viewer's connection and where it is in its plan.
struct Viewer {
    conn: Option<TcpStream>,
    /// The request being sent or answered: (bytes to send, sent so far).
    out: Vec<u8>,
    sent: usize,
    /// Response head bytes gathered so far (until the blank line).
    head: Vec<u8>,
    /// Body bytes still to come (None: head not complete).
    body_left: Option<u64>,
    /// Index of the next request: startup requests first, then segment requests.
    next: usize,
    /// When the current request was made, and the time its last byte is needed (None: a
    /// start-up request).
    asked_at: Instant,
    need: Option<Instant>,
    seg_dur: f64,
    busy: bool,
    t0: Option<Instant>,
    start_at: Instant,
}

#[derive(Default, Debug, Clone)]
struct StepResult {
    segments: u64,
    late: u64,
    errors: u64,
    bytes: u64,
    /// Fetch time / segment duration of each segment request.
    fetch_ratio: Vec<f64>,
    server_cpu_s: f64,
    emulator_cpu_s: f64,
    window_s: f64,
    startup_ms: Vec<f64>,
}

/// This process's own utime + stime (not its children's: the servers are), seconds.
fn self_cpu_s() -> f64 {
    proc_cpu_s("self").map_or(f64::NAN, |(_, t)| t)
}

/// `n` viewers of `plan` against the server on `port` (its processes under `pid`): a ramp of
/// one target duration, then `window` measured.
fn run_step(
    port: u16,
    pid: u32,
    plan: &Plan,
    n: usize,
    target: Duration,
    window: Duration,
) -> Result<StepResult> {
    use rustix::event::epoll;
    let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
    let begin = Instant::now();
    let ramp_end = begin + target;
    let end = ramp_end + window;
    // Each segment's start in the title, and the title's length, summed once.
    let starts: Vec<f64> = plan
        .segments
        .iter()
        .scan(0.0, |at, s| {
            let start = *at;
            *at += s.0;
            Some(start)
        })
        .collect();
    let total_per_loop: f64 = plan.segments.iter().map(|s| s.0).sum();
    let per_seg = plan.segments.first().map_or(1, |s| s.1.len());
    let mut viewers: Vec<Viewer> = (0..n)
        .map(|i| Viewer {
            conn: None,
            out: Vec::new(),
            sent: 0,
            head: Vec::new(),
            body_left: None,
            next: 0,
            asked_at: begin,
            need: None,
            seg_dur: 0.0,
            busy: false,
            t0: None,
            start_at: begin + target.mul_f64(i as f64 / n.max(1) as f64),
        })
        .collect();
    // (Reverse(when), viewer): the next request time of idle viewers.
    let mut wake: BinaryHeap<std::cmp::Reverse<(Instant, usize)>> = viewers
        .iter()
        .enumerate()
        .map(|(i, v)| std::cmp::Reverse((v.start_at, i)))
        .collect();
    let mut r = StepResult::default();
    let mut cpu0_self = self_cpu_s();
    let mut cpu_server_start = f64::NAN;
    let mut scratch = vec![0u8; 256 * 1024];
    let mut events: Vec<epoll::Event> = Vec::with_capacity(256);
    let timeout = Duration::from_secs(10);

    // The request of viewer `v`'s index `k`: (fetch, need time offset from t0 or None).
    let request_of = |k: usize| -> (Fetch, Option<(f64, f64)>) {
        if k < plan.startup.len() {
            return (plan.startup[k].clone(), None);
        }
        let k = k - plan.startup.len();
        let (seg, track) = (k / per_seg, k % per_seg);
        let loops = seg / plan.segments.len();
        let i = seg % plan.segments.len();
        let start: f64 = loops as f64 * total_per_loop + starts[i];
        let fetch = plan.segments[i].1[track].clone();
        if seg == 0 {
            // Segment 0 is part of the start-up: playing starts when it is in.
            (fetch, None)
        } else {
            (fetch, Some((start, plan.segments[i].0)))
        }
    };
    let startup_len = plan.startup.len() + per_seg;

    loop {
        let now = Instant::now();
        if cpu_server_start.is_nan() && now >= ramp_end {
            cpu_server_start = cpu_s(pid);
            cpu0_self = self_cpu_s();
        }
        if now >= end {
            break;
        }
        // Start every request that is due.
        while let Some(std::cmp::Reverse((at, i))) = wake.peek().copied() {
            if at > now {
                break;
            }
            wake.pop();
            let v = &mut viewers[i];
            if v.conn.is_none() {
                let c = TcpStream::connect(("127.0.0.1", port))?;
                c.set_nonblocking(true)?;
                c.set_nodelay(true)?;
                epoll::add(
                    &ep,
                    c.as_fd(),
                    epoll::EventData::new_u64(i as u64),
                    epoll::EventFlags::IN | epoll::EventFlags::OUT | epoll::EventFlags::ET,
                )?;
                v.conn = Some(c);
            }
            let (fetch, need) = request_of(v.next);
            let range = fetch.range.map_or(String::new(), |(off, len)| {
                format!("Range: bytes={off}-{}\r\n", off + len - 1)
            });
            v.out = format!(
                "GET {} HTTP/1.1\r\nHost: 127.0.0.1\r\n{range}\r\n",
                fetch.path
            )
            .into_bytes();
            v.sent = 0;
            v.head.clear();
            v.body_left = None;
            v.asked_at = now;
            v.need = need.and_then(|(start, _)| v.t0.map(|t0| t0 + Duration::from_secs_f64(start)));
            v.seg_dur = need.map_or(0.0, |(_, d)| d);
            v.busy = true;
            pump(v, &mut scratch, &mut r)?;
            if !v.busy {
                finish(v, i, &mut wake, &mut r, startup_len, &request_of, target);
            }
        }
        let next_wake = wake.peek().map(|w| w.0.0).unwrap_or(end).min(end);
        let wait = next_wake
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(100));
        events.clear();
        match epoll::wait(
            &ep,
            rustix::buffer::spare_capacity(&mut events),
            Some(&rustix::time::Timespec {
                tv_sec: wait.as_secs() as i64,
                tv_nsec: i64::from(wait.subsec_nanos()),
            }),
        ) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
        for e in &events {
            let i = e.data.u64() as usize;
            let v = &mut viewers[i];
            if !v.busy {
                continue;
            }
            pump(v, &mut scratch, &mut r)?;
            if !v.busy {
                finish(v, i, &mut wake, &mut r, startup_len, &request_of, target);
            }
        }
        // Timeouts: a request unanswered for 10 s is an error; the viewer reconnects.
        let now = Instant::now();
        for (i, v) in viewers.iter_mut().enumerate() {
            if v.busy && now.duration_since(v.asked_at) > timeout {
                r.errors += 1;
                v.conn = None;
                v.busy = false;
                wake.push(std::cmp::Reverse((now, i)));
            }
        }
    }
    // Segments needed within the run but not yet in are late too.
    let now = Instant::now();
    for v in &viewers {
        if v.busy && v.need.is_some_and(|n| n < now) {
            r.segments += 1;
            r.late += 1;
        }
    }
    r.server_cpu_s = cpu_s(pid) - cpu_server_start;
    r.emulator_cpu_s = self_cpu_s() - cpu0_self;
    r.window_s = now.duration_since(ramp_end).as_secs_f64();
    Ok(r)
}

/// Sends what is left of the request and reads what has arrived; clears `busy` when the
/// response is complete (or failed: then the connection is dropped and an error counted).
fn pump(v: &mut Viewer, scratch: &mut [u8], r: &mut StepResult) -> Result<()> {
    let Some(c) = v.conn.as_mut() else {
        return Ok(());
    };
    let mut failed = false;
    while v.sent < v.out.len() {
        match c.write(&v.out[v.sent..]) {
            Ok(k) => v.sent += k,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    while !failed {
        match c.read(scratch) {
            Ok(0) => {
                failed = true;
            }
            Ok(k) => {
                let data = &scratch[..k];
                let Some(left) = v.body_left.as_mut() else {
                    v.head.extend_from_slice(data);
                    let Some(at) = v.head.windows(4).position(|w| w == b"\r\n\r\n") else {
                        if v.head.len() > 16 * 1024 {
                            failed = true;
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&v.head[..at]).to_string();
                    let status = head.get(9..12).unwrap_or("");
                    let len = head.lines().find_map(|l| {
                        let (k, val) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| val.trim().parse::<u64>().ok())?
                    });
                    let (true, Some(len)) = (status == "200" || status == "206", len) else {
                        failed = true;
                        continue;
                    };
                    let extra = (v.head.len() - (at + 4)) as u64;
                    r.bytes += extra;
                    let left = len.saturating_sub(extra);
                    v.body_left = Some(left);
                    if left == 0 {
                        v.busy = false;
                        return Ok(());
                    }
                    continue;
                };
                *left = left.saturating_sub(data.len() as u64);
                r.bytes += data.len() as u64;
                if *left == 0 {
                    v.busy = false;
                    return Ok(());
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
            Err(_) => failed = true,
        }
    }
    r.errors += 1;
    v.conn = None;
    v.busy = false;
    // The request is made again on a new connection: `next` is not advanced.
    v.need = None;
    v.out.clear();
    Ok(())
}

/// A viewer's request has ended: account it and schedule the next one.
fn finish(
    v: &mut Viewer,
    i: usize,
    wake: &mut BinaryHeap<std::cmp::Reverse<(Instant, usize)>>,
    r: &mut StepResult,
    startup_len: usize,
    request_of: &dyn Fn(usize) -> (Fetch, Option<(f64, f64)>),
    target: Duration,
) {
    let now = Instant::now();
    if v.out.is_empty() {
        // Failed: ask again at once on a new connection.
        wake.push(std::cmp::Reverse((now, i)));
        return;
    }
    if let Some(need) = v.need {
        r.segments += 1;
        if now > need {
            r.late += 1;
        }
        if v.seg_dur > 0.0 {
            r.fetch_ratio
                .push(now.duration_since(v.asked_at).as_secs_f64() / v.seg_dur);
        }
    }
    v.next += 1;
    if v.next == startup_len {
        v.t0 = Some(now);
        r.startup_ms
            .push(now.duration_since(v.start_at).as_secs_f64() * 1000.0);
    }
    let at = match (request_of(v.next).1, v.t0) {
        (Some((start, _)), Some(t0)) => (t0 + Duration::from_secs_f64(start))
            .checked_sub(target)
            .unwrap_or(now)
            .max(now),
        _ => now,
    };
    wake.push(std::cmp::Reverse((at, i)));
}

fn p99(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[((s.len() as f64 * 0.99).ceil() as usize).clamp(1, s.len()) - 1]
}

fn ffmpeg(args: &[&str]) -> Result<()> {
    let o = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y"])
        .args(args)
        .stdout(Stdio::null())
        .output()
        .context("running ffmpeg")?;
    if !o.status.success() {
        bail!(
            "ffmpeg {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(())
}

fn dir_bytes(d: &Path) -> u64 {
    std::fs::read_dir(d)
        .map(|it| {
            it.flatten()
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

pub fn run(a: HlsArgs) -> Result<()> {
    ensure_tools(&["nginx", "ffmpeg"])?;
    let steps: Vec<usize> = a
        .viewers
        .as_deref()
        .unwrap_or(if a.quick { "10,50" } else { "10,50,100,200" })
        .split(',')
        .map(|s| s.trim().parse().context("--viewers"))
        .collect::<Result<_>>()?;
    if steps.contains(&0) {
        bail!("--viewers: every step needs at least one viewer");
    }
    let formats: Vec<&str> = a.formats.split(',').map(str::trim).collect();
    if formats.iter().any(|f| !matches!(*f, "ts" | "mp4")) {
        bail!("--formats: ts and/or mp4");
    }
    let duration_s = a.duration_s.unwrap_or(if a.quick { 8 } else { 20 });
    let title_s = a.title_s.unwrap_or(if a.quick { 24 } else { 60 });
    if a.segment_s == 0 || title_s < 2 * a.segment_s {
        bail!("--segment-s must be at least 1 and the title at least two segments long");
    }
    let machine = machine_line();
    let cpus = penstock_driver::clock::allowed_cpus();
    let pinned = !a.no_pin && cpus.len() >= 2;
    let (server_cpus, client_cpus) = if pinned {
        let half = cpus.len() / 2;
        (cpus[..half].to_vec(), cpus[half..].to_vec())
    } else {
        (cpus.clone(), cpus.clone())
    };
    let workers = if pinned {
        server_cpus.len()
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    };

    let dir = tempfile::Builder::new()
        .prefix("penstock-bench-hls-")
        .tempdir()?;
    let www = dir.path().join("www");
    let ngx = dir.path().join("nginx-www");
    for d in [&www, &ngx.join("ts"), &ngx.join("fmp4")] {
        std::fs::create_dir_all(d)?;
    }
    // The title: H.264 with a key frame every segment, AAC; MP4 (moov first), and the same
    // streams as TS.
    let (mp4, ts) = (www.join("title.mp4"), www.join("title.ts"));
    let gop = (a.segment_s * 25).to_string();
    let (vb, title) = (format!("{}k", a.kbps), title_s.to_string());
    eprintln!("bench hls: making the {title_s} s title and nginx's segment copies");
    ffmpeg(&[
        "-f",
        "lavfi",
        "-i",
        "testsrc2=size=960x540:rate=25",
        "-f",
        "lavfi",
        "-i",
        "sine=frequency=440:sample_rate=48000",
        "-t",
        &title,
        "-c:v",
        "libx264",
        "-preset",
        "ultrafast",
        "-b:v",
        &vb,
        "-maxrate",
        &vb,
        "-bufsize",
        &format!("{}k", 2 * a.kbps),
        "-g",
        &gop,
        "-keyint_min",
        &gop,
        "-sc_threshold",
        "0",
        "-c:a",
        "aac",
        "-b:a",
        "128k",
        "-movflags",
        "+faststart",
        mp4.to_str().context("path")?,
    ])?;
    ffmpeg(&[
        "-i",
        mp4.to_str().context("path")?,
        "-c",
        "copy",
        "-f",
        "mpegts",
        ts.to_str().context("path")?,
    ])?;
    let seg = a.segment_s.to_string();
    let ngx_ts = ngx.join("ts");
    let ngx_fmp4 = ngx.join("fmp4");
    ffmpeg(&[
        "-i",
        ts.to_str().context("path")?,
        "-c",
        "copy",
        "-f",
        "hls",
        "-hls_time",
        &seg,
        "-hls_playlist_type",
        "vod",
        "-hls_segment_filename",
        ngx_ts.join("s%04d.ts").to_str().context("path")?,
        ngx_ts.join("index.m3u8").to_str().context("path")?,
    ])?;
    ffmpeg(&[
        "-i",
        mp4.to_str().context("path")?,
        "-c",
        "copy",
        "-f",
        "hls",
        "-hls_time",
        &seg,
        "-hls_playlist_type",
        "vod",
        "-hls_segment_type",
        "fmp4",
        "-hls_fmp4_init_filename",
        "init.mp4",
        "-hls_segment_filename",
        ngx_fmp4.join("s%04d.m4s").to_str().context("path")?,
        ngx_fmp4.join("index.m3u8").to_str().context("path")?,
    ])?;
    let copies = [("ts", dir_bytes(&ngx_ts)), ("mp4", dir_bytes(&ngx_fmp4))];
    for f in [&mp4, &ts] {
        std::io::copy(&mut std::fs::File::open(f)?, &mut std::io::sink())?;
    }
    for d in [&ngx_ts, &ngx_fmp4] {
        for e in std::fs::read_dir(d)?.flatten() {
            std::io::copy(&mut std::fs::File::open(e.path())?, &mut std::io::sink())?;
        }
    }

    if pinned {
        penstock_driver::clock::pin_to_cpus(&server_cpus).context("pinning the servers")?;
    }
    let p_port = free_port()?;
    let conf = dir.path().join("penstock.toml");
    std::fs::write(
        &conf,
        format!(
            "[rtsp]\nlisten = \"\"\n[http]\nlisten = \"127.0.0.1:{p_port}\"\nworkers = {workers}\n[engine]\nworkers = {workers}\n\
             [limits]\nrequests_per_connection_max = 1000000\n[log]\naccess = \"off\"\n[hls]\ntarget_duration_ms = {}\n",
            a.segment_s * 1000
        ),
    )?;
    let mut penstock = Child2(
        Command::new(std::env::current_exe()?)
            .args(["serve", "--config"])
            .arg(&conf)
            .arg("--root")
            .arg(&www)
            .args(["--control", "", "--no-control-unix"])
            .stdout(Stdio::null())
            .spawn()
            .context("starting penstock serve")?,
    );
    wait_listening(p_port, &mut penstock.0)?;
    let n_port = free_port()?;
    let nginx = start_nginx(
        &dir.path().join("nginx"),
        workers,
        n_port,
        "",
        &ngx,
        "application/vnd.apple.mpegurl m3u8; video/mp2t ts; video/mp4 mp4 m4s;",
    )?;
    let placement = if pinned {
        penstock_driver::clock::pin_to_cpus(&client_cpus).context("pinning the emulator")?;
        format!("servers on CPUs {server_cpus:?}, the viewer emulator on CPUs {client_cpus:?}")
    } else {
        "servers and the emulator placed by the scheduler".to_string()
    };

    let target = Duration::from_secs(a.segment_s);
    let window = Duration::from_secs(duration_s);
    let mut table = format!(
        "penstock bench hls: {machine}; {workers} workers each; {placement}; a {title_s} s title, H.264 {} kbit/s + AAC 128 kbit/s, {} s segments; {duration_s} s measured per step after a {} s ramp\n\n\
         | format | viewers | server | segments | late | p99 fetch / segment duration | server CPU ms per viewer-second | emulator CPU s | errors | segment copies on disk |\n|---|---|---|---|---|---|---|---|---|---|\n",
        a.kbps, a.segment_s, a.segment_s
    );
    let mut ratios = String::from(
        "\n| format | viewers | late penstock/nginx | CPU per viewer penstock/nginx |\n|---|---|---|---|\n",
    );
    let mut rows = Vec::new();
    // The first playlist of the TS title: the server has just started, so its key-frame index
    // is built for this request (the whole file scanned: a VOD TS does not read recorder
    // tracks), then the same playlist again from the cache.
    let ts_len = std::fs::metadata(&ts)?.len();
    let first_playlist_ms = {
        let t = Instant::now();
        let (status, _) = get(p_port, "/title.ts/index.m3u8")?;
        if status != 200 {
            bail!("penstock's /title.ts/index.m3u8: {status}");
        }
        t.elapsed().as_secs_f64() * 1000.0
    };
    let cached_playlist_ms = {
        let t = Instant::now();
        get(p_port, "/title.ts/index.m3u8")?;
        t.elapsed().as_secs_f64() * 1000.0
    };
    let first_line = format!(
        "First playlist of the {title_s} s TS ({:.1} MB, index built by scanning it): {first_playlist_ms:.1} ms; again from the index cache: {cached_playlist_ms:.1} ms. \
         The scan grows with the file: a 2-hour recording at this rate is {:.0}x the bytes (timed apart: docs/hls.md \"Measured\").\n\n",
        ts_len as f64 / 1e6,
        7200.0 / title_s as f64
    );
    // Above the table (after the heading line).
    let at = table.find("| format").unwrap_or(table.len());
    table.insert_str(at, &first_line);
    for &format in &formats {
        let (p_url, n_url) = match format {
            "ts" => ("/title.ts/index.m3u8", "/ts/index.m3u8"),
            _ => ("/title.mp4/index.m3u8", "/fmp4/index.m3u8"),
        };
        let p_plan = plan(p_port, p_url).with_context(|| format!("penstock's {p_url}"))?;
        let n_plan = plan(n_port, n_url).with_context(|| format!("nginx's {n_url}"))?;
        let copy_bytes = copies.iter().find(|c| c.0 == format).map_or(0, |c| c.1);
        for &n in &steps {
            let p = run_step(p_port, penstock.0.id(), &p_plan, n, target, window)?;
            let g = run_step(n_port, nginx.0.id(), &n_plan, n, target, window)?;
            let json_of = |m: &StepResult| {
                let per = m.server_cpu_s * 1000.0 / (n as f64 * m.window_s);
                serde_json::json!({
                    "segments": m.segments, "late": m.late, "errors": m.errors, "bytes": m.bytes,
                    "p99_fetch_ratio": p99(&m.fetch_ratio), "server_cpu_s": m.server_cpu_s,
                    "cpu_ms_per_viewer_s": per, "emulator_cpu_s": m.emulator_cpu_s,
                    "window_s": m.window_s, "startup_p99_ms": p99(&m.startup_ms),
                })
            };
            let (pj, nj) = (json_of(&p), json_of(&g));
            for (server, m, j, disk) in [("penstock", &p, &pj, 0), ("nginx", &g, &nj, copy_bytes)] {
                table.push_str(&format!(
                    "| {format} | {n} | {server} | {} | {} | {:.3} | {:.3} | {:.2} | {} | {:.1} MB |\n",
                    m.segments,
                    m.late,
                    j["p99_fetch_ratio"].as_f64().unwrap_or(f64::NAN),
                    j["cpu_ms_per_viewer_s"].as_f64().unwrap_or(f64::NAN),
                    m.emulator_cpu_s,
                    m.errors,
                    disk as f64 / 1e6
                ));
            }
            let cpu_ratio = pj["cpu_ms_per_viewer_s"].as_f64().unwrap_or(f64::NAN)
                / nj["cpu_ms_per_viewer_s"].as_f64().unwrap_or(f64::NAN);
            ratios.push_str(&format!(
                "| {format} | {n} | {}/{} | {cpu_ratio:.2} |\n",
                p.late, g.late
            ));
            rows.push(serde_json::json!({
                "format": format, "viewers": n, "penstock": pj, "nginx": nj,
                "penstock_disk_bytes": 0, "nginx_disk_bytes": copy_bytes,
            }));
            eprintln!("bench hls: {format} {n} viewers done");
        }
    }
    table.push_str(&ratios);
    write!(crate::out::human(a.json.as_deref()), "{table}")?;
    if let Some(o) = &a.out {
        std::fs::write(o, &table)?;
    }
    if let Some(j) = &a.json {
        crate::out::write_json(
            j,
            &serde_json::json!({"bench": "hls", "machine": machine, "placement": placement,
                "first_playlist_ms": first_playlist_ms, "cached_playlist_ms": cached_playlist_ms,
                "ts_bytes": ts_len,
                "duration_s": duration_s, "title_s": title_s, "segment_s": a.segment_s,
                "kbps": a.kbps, "rows": rows}),
        )?;
    }
    drop(nginx);
    drop(penstock);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_uris_resolve_against_the_playlist() {
        assert_eq!(resolve("/a/b.ts/index.m3u8", "../b.ts"), "/a/b.ts");
        assert_eq!(
            resolve("/a/m.mp4/index.m3u8", "track-1.m3u8"),
            "/a/m.mp4/track-1.m3u8"
        );
        assert_eq!(resolve("/ts/index.m3u8", "s0001.ts"), "/ts/s0001.ts");
        assert_eq!(resolve("/x/i.m3u8?s=1", "/abs?q=2"), "/abs?q=2");
        assert_eq!(resolve("/x/i.m3u8", "y/../z.ts?s=a"), "/x/z.ts?s=a");
    }

    #[test]
    fn a_byte_range_playlist_gives_ranges_and_a_map() {
        let text = "#EXTM3U\n#EXT-X-TARGETDURATION:2\n#EXT-X-MAP:URI=\"../t.ts\",BYTERANGE=\"376@0\"\n\
                    #EXTINF:2.000,\n#EXT-X-BYTERANGE:1000@376\n../t.ts\n#EXTINF:1.5,\n#EXT-X-BYTERANGE:500\n../t.ts\n#EXT-X-ENDLIST\n";
        let (map, segs) = media_playlist("/t.ts/index.m3u8", text).unwrap();
        assert_eq!(
            map,
            Some(Fetch {
                path: "/t.ts".into(),
                range: Some((0, 376))
            })
        );
        assert_eq!(segs.len(), 2);
        assert_eq!(
            segs[0],
            (
                2.0,
                Fetch {
                    path: "/t.ts".into(),
                    range: Some((376, 1000))
                }
            )
        );
        assert_eq!(
            segs[1],
            (
                1.5,
                Fetch {
                    path: "/t.ts".into(),
                    range: Some((1376, 500))
                }
            )
        );
    }

    #[test]
    fn p99_is_the_99th_percentile() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(p99(&v), 99.0);
        assert!(p99(&[]).is_nan());
    }
}
