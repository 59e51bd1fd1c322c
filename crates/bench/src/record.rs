//! `penstock bench record`: issue 8's acceptance, measured.
//!
//! 1. **Loss.** An ~8 Mbit/s MPEG-TS made by ffmpeg (testsrc, 640x360 H.264, a key frame per
//!    second, constant mux rate) is sent by M paced streams of the engine (`--rate 8Mbit/s
//!    --unit 1316`: 7 TS packets per datagram), each to its own recorder (`record::record`, a
//!    thread each, default settings: 1 s syncs, 32 MiB receive buffer) in this process, for M
//!    in `--streams`. **Received = sent** is checked two ways: the datagrams a recording holds
//!    equal the datagrams its sender reports sent, and the recording equals the source file
//!    byte for byte (crc32c of both): a lost, duplicated or reordered datagram changes it. The
//!    stream's own bytes are the sequence numbers, so nothing is stamped. The socket's drop
//!    counter (SO_RXQ_OVFL) is reported too.
//! 2. **Playback timing.** The first recording of the M = 1 run is played back with its
//!    recorded timing (`StreamSpec::units`, as `stream --timing tracks`) into another recorder.
//!    Both recordings hold kernel receive times (SO_TIMESTAMPNS); the error of packet n is
//!    |gap_played(n) − gap_recorded(n)| between consecutive packets. The baseline in the same
//!    run: the recorded gaps against the CBR schedule's (1.316 ms) — what the sender and the
//!    receive path added the first time.

use std::io::Write;
use std::net::UdpSocket;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use penstock_core::endpoint::{Endpoint, Host};
use penstock_core::schedule::ScheduleFlags;
use penstock_core::stream::plan::Pacing;
use penstock_core::stream::{Extent, PathChoice};
use penstock_core::time::Instant;
use penstock_core::track::{Speed, plan_playback};
use penstock_core::units::parse_duration;
use penstock_driver::clock::{self, CpuWho, cpu_times};
use penstock_driver::record::{RecordConfig, RecordReport, load_recording, record};
use penstock_driver::{Engine, EngineConfig, StreamSpec, ZeroCopy};

#[derive(Args, Debug)]
pub struct RecordBenchArgs {
    /// Length of the source and of every recording.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub duration: Duration,
    /// 10 s instead of `--duration`.
    #[arg(long)]
    pub quick: bool,
    /// Numbers of streams recorded at once, comma-separated.
    #[arg(long, default_value = "1,10,50,100", value_delimiter = ',')]
    pub streams: Vec<usize>,
    /// Use this MPEG-TS instead of generating one with ffmpeg.
    #[arg(long)]
    pub ts: Option<PathBuf>,
    /// Directory for the recordings (default: a temporary directory). Each is deleted once
    /// checked, except the one played back.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Engine workers sending the streams.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// SCHED_FIFO for the engines' workers (sender and playback), as `stream --realtime`.
    #[arg(long)]
    pub realtime: bool,
    /// Write the results as JSON here.
    /// A bare `--json` writes it on stdout (the table then goes to stderr).
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
}

const RATE: &str = "8Mbit/s";
const UNIT: u64 = 1316;
/// The CBR schedule's gap: 1316 bytes at 8 Mbit/s.
const GAP_NS: i64 = 1_316_000;

struct Row {
    streams: usize,
    sent: u64,
    recorded: u64,
    lost_streams: usize,
    identical: usize,
    socket_drops: u64,
    sender_misses: u64,
    sender_p99_us: f64,
    cpu_s: f64,
}

pub fn run(a: RecordBenchArgs) -> Result<()> {
    let duration = if a.quick {
        Duration::from_secs(10)
    } else {
        a.duration
    };
    let tmp = tempfile::tempdir()?;
    let dir = a.dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir)?;
    let ts = match &a.ts {
        Some(p) => p.clone(),
        None => {
            let p = dir.join("source.ts");
            make_ts(&p, duration)?;
            p
        }
    };
    let src = std::fs::read(&ts).with_context(|| format!("reading {}", ts.display()))?;
    let src_crc = penstock_core::crc::crc32c(&src);
    let src_units = (src.len() as u64).div_ceil(UNIT);
    eprintln!(
        "source: {} ({} bytes, {} datagrams of {UNIT} bytes, {:.1} s at {RATE})",
        ts.display(),
        src.len(),
        src_units,
        src.len() as f64 * 8.0 / 8e6
    );
    drop(src);
    let mut rows = Vec::new();
    let mut keep: Option<PathBuf> = None;
    for &m in &a.streams {
        eprintln!("recording {m} stream(s) ...");
        let (row, first) = run_streams(
            m,
            &ts,
            src_crc,
            src_units,
            &dir,
            (a.workers, a.realtime),
            keep.is_none(),
        )?;
        eprintln!(
            "  {} of {} datagrams recorded, {} of {m} recordings identical to the source",
            row.recorded, row.sent, row.identical
        );
        if keep.is_none() {
            keep = first;
        }
        rows.push(row);
    }
    let timing = match &keep {
        Some(rec) => Some(playback_timing(rec, &dir, a.realtime)?),
        None => None,
    };
    print_table(
        &mut crate::out::human(a.json.as_deref()),
        &rows,
        timing.as_ref(),
        duration,
    )?;
    if let Some(path) = &a.json {
        let v = serde_json::json!({
            "duration_s": duration.as_secs_f64(),
            "rows": rows.iter().map(|r| serde_json::json!({
                "streams": r.streams, "sent": r.sent, "recorded": r.recorded,
                "lost_streams": r.lost_streams, "identical": r.identical,
                "socket_drops": r.socket_drops, "sender_misses": r.sender_misses,
                "sender_p99_us": r.sender_p99_us, "cpu_s": r.cpu_s,
            })).collect::<Vec<_>>(),
            "playback": timing.as_ref().map(|t| serde_json::json!({
                "packets": t.packets, "baseline_p50_us": t.baseline.0, "baseline_p99_us": t.baseline.1,
                "baseline_max_us": t.baseline.2, "playback_p50_us": t.playback.0,
                "playback_p99_us": t.playback.1, "playback_max_us": t.playback.2,
                "playback_sender_p50_us": t.sender.0, "playback_sender_p99_us": t.sender.1,
            })),
        });
        crate::out::write_json(path, &v)?;
    }
    Ok(())
}

fn make_ts(path: &Path, duration: Duration) -> Result<()> {
    let secs = duration.as_secs().max(1).to_string();
    let o = Command::new("ffmpeg")
        .args([
            "-hide_banner",
            "-loglevel",
            "error",
            "-y",
            "-f",
            "lavfi",
            "-i",
            "testsrc=size=640x360:rate=25",
            "-t",
            &secs,
            "-c:v",
            "libx264",
            "-preset",
            "ultrafast",
            "-g",
            "25",
            "-keyint_min",
            "25",
            "-sc_threshold",
            "0",
            "-b:v",
            "7M",
            "-minrate",
            "7M",
            "-maxrate",
            "7M",
            "-bufsize",
            "2M",
            "-muxrate",
            "8000000",
            "-f",
            "mpegts",
        ])
        .arg(path)
        .output()
        .context("running ffmpeg (apt-get install ffmpeg), or pass --ts FILE")?;
    if !o.status.success() {
        bail!("ffmpeg failed: {}", String::from_utf8_lossy(&o.stderr));
    }
    Ok(())
}

fn file_crc(path: &Path) -> Result<u32> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut crc = 0u32;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(crc);
        }
        crc = penstock_core::crc::crc32c_append(crc, &buf[..n]);
    }
}

/// Records `m` streams of the source at once; returns the row and, when `keep_first`, the
/// path of the first recording (kept for the playback measurement).
fn run_streams(
    m: usize,
    ts: &Path,
    src_crc: u32,
    src_units: u64,
    dir: &Path,
    (workers, realtime): (usize, bool),
    keep_first: bool,
) -> Result<(Row, Option<PathBuf>)> {
    let cpu0 = cpu_times(CpuWho::Process);
    let stop = Arc::new(AtomicBool::new(false));
    let mut recorders = Vec::new();
    let mut ports = Vec::new();
    let mut paths = Vec::new();
    for i in 0..m {
        let sock = UdpSocket::bind("127.0.0.1:0")?;
        ports.push(sock.local_addr()?.port());
        let path = dir.join(format!("rec-{m}-{i}.ts"));
        paths.push(path.clone());
        let stop = stop.clone();
        recorders.push(
            std::thread::Builder::new()
                .name(format!("rec-{i}"))
                .spawn(move || {
                    record(
                        sock.as_fd(),
                        &path,
                        &RecordConfig::default(),
                        &stop,
                        &mut |_| {},
                    )
                })?,
        );
    }
    let engine = Engine::new(EngineConfig {
        workers,
        pool_buffers: 2 * m.div_ceil(workers) + 4,
        buffer_bytes: 64 << 10,
        stream_depth: 2,
        streams_max: m.max(1),
        realtime,
        ..EngineConfig::default()
    })?;
    // What `penstock stream --rate RATE --unit UNIT` builds.
    let flags = ScheduleFlags {
        rate: Some(RATE),
        ..ScheduleFlags::default()
    };
    let pacing = Pacing::from_flags(&flags)?;
    let t0 = clock::now().saturating_add(Duration::from_millis(200));
    let mut handles = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let mut spec = StreamSpec::new(
            Endpoint::File {
                path: ts.to_path_buf(),
            },
            Endpoint::UdpSend {
                host: Host::parse("127.0.0.1").expect("an IPv4 literal"),
                port: *port,
                local_port: None,
            },
        );
        spec.extent = Extent {
            offset: 0,
            length: None,
        };
        spec.unit_bytes = UNIT as usize;
        spec.path = PathChoice::Auto;
        spec.zero_copy = ZeroCopy::Off;
        spec.pacing = pacing.clone();
        // Phases spread over one period, as Roadrunner's streams.
        spec.start_at = Some(Instant::from_nanos(
            t0.as_nanos() + (GAP_NS as u64) * i as u64 / m as u64,
        ));
        handles.push(engine.open(spec)?);
    }
    let mut sent = 0u64;
    let mut stats: Option<penstock_core::lateness::LatenessStats> = None;
    let mut sent_per = Vec::new();
    for h in handles {
        let r = h.wait()?;
        sent += r.units;
        sent_per.push(r.units);
        if let Some(l) = &r.lateness {
            match &mut stats {
                Some(s) => s.merge(l),
                None => stats = Some(l.clone()),
            }
        }
    }
    drop(engine);
    // Let the last datagrams land, then stop the recorders (they sync and close).
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Release);
    let mut reports: Vec<RecordReport> = Vec::new();
    for r in recorders {
        reports.push(
            r.join()
                .map_err(|_| anyhow::anyhow!("a recorder panicked"))??,
        );
    }
    let cpu1 = cpu_times(CpuWho::Process);
    let mut row = Row {
        streams: m,
        sent,
        recorded: reports.iter().map(|r| r.packets).sum(),
        lost_streams: 0,
        identical: 0,
        socket_drops: reports.iter().filter_map(|r| r.socket_drops).sum(),
        sender_misses: stats.as_ref().map_or(0, |s| s.misses()),
        sender_p99_us: stats.as_ref().map_or(0.0, |s| s.p99_ns() as f64 / 1e3),
        cpu_s: (cpu1.user_ns + cpu1.sys_ns - cpu0.user_ns - cpu0.sys_ns) as f64 / 1e9,
    };
    for (i, (rep, path)) in reports.iter().zip(&paths).enumerate() {
        if rep.packets != sent_per[i] {
            row.lost_streams += 1;
        }
        if sent_per[i] == src_units && file_crc(path)? == src_crc {
            row.identical += 1;
        }
        if !(keep_first && i == 0) {
            for p in [
                path.clone(),
                PathBuf::from(format!("{}.time", path.display())),
                PathBuf::from(format!("{}.packet", path.display())),
                PathBuf::from(format!("{}.frame", path.display())),
            ] {
                let _ = std::fs::remove_file(p);
            }
        }
    }
    Ok((row, keep_first.then(|| paths[0].clone())))
}

struct Timing {
    packets: usize,
    /// p50, p99, max in µs: recorded gaps vs the CBR schedule.
    baseline: (f64, f64, f64),
    /// p50, p99, max in µs: played-back gaps vs recorded gaps.
    playback: (f64, f64, f64),
    /// The playback sender's own lateness (deadline to send completion): p50, p99 in µs.
    sender: (f64, f64),
}

fn quantiles_us(mut v: Vec<i64>) -> (f64, f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    v.sort_unstable();
    let at = |q: f64| v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1] as f64 / 1e3;
    (
        at(0.5),
        at(0.99),
        *v.last().expect("not empty") as f64 / 1e3,
    )
}

fn gaps(times: &[u64]) -> Vec<i64> {
    times
        .windows(2)
        .map(|w| w[1] as i64 - w[0] as i64)
        .collect()
}

fn playback_timing(rec: &Path, dir: &Path, realtime: bool) -> Result<Timing> {
    eprintln!(
        "playing {} back with its recorded timing ...",
        rec.display()
    );
    let original = load_recording(rec, u64::MAX)?;
    let plan = plan_playback(
        &original.time.records,
        &original.packet.records,
        &original.frame.records,
        original.report.readable_packets,
        None,
        Speed::NORMAL,
    )?;
    let sock = UdpSocket::bind("127.0.0.1:0")?;
    let port = sock.local_addr()?.port();
    let cap = dir.join("playback.ts");
    let stop = Arc::new(AtomicBool::new(false));
    let (stop2, cap2) = (stop.clone(), cap.clone());
    let recorder = std::thread::spawn(move || {
        record(
            sock.as_fd(),
            &cap2,
            &RecordConfig::default(),
            &stop2,
            &mut |_| {},
        )
    });
    let engine = Engine::new(EngineConfig {
        workers: 1,
        pool_buffers: 8,
        buffer_bytes: 64 << 10,
        stream_depth: 2,
        realtime,
        ..EngineConfig::default()
    })?;
    let mut spec = StreamSpec::new(
        Endpoint::File {
            path: rec.to_path_buf(),
        },
        Endpoint::UdpSend {
            host: Host::parse("127.0.0.1").expect("an IPv4 literal"),
            port,
            local_port: None,
        },
    );
    spec.extent = Extent {
        offset: plan.media_offset_bytes,
        length: Some(plan.media_bytes),
    };
    spec.zero_copy = ZeroCopy::Off;
    spec.pacing = Pacing::Units(plan.units.into());
    let report = engine.open(spec)?.wait()?;
    let sender = report.lateness.as_ref().map_or((0.0, 0.0), |l| {
        (l.p50_ns() as f64 / 1e3, l.p99_ns() as f64 / 1e3)
    });
    drop(engine);
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Release);
    recorder
        .join()
        .map_err(|_| anyhow::anyhow!("the capture recorder panicked"))??;
    let played = load_recording(&cap, u64::MAX)?;
    let t_rec: Vec<u64> = original.time.records.iter().map(|r| r.time_ns).collect();
    let t_play: Vec<u64> = played.time.records.iter().map(|r| r.time_ns).collect();
    if t_play.len() != t_rec.len() {
        eprintln!(
            "note: {} packets played back and captured, {} recorded",
            t_play.len(),
            t_rec.len()
        );
    }
    let (g_rec, g_play) = (gaps(&t_rec), gaps(&t_play));
    let baseline = quantiles_us(g_rec.iter().map(|g| (g - GAP_NS).abs()).collect());
    let playback = quantiles_us(
        g_rec
            .iter()
            .zip(&g_play)
            .map(|(r, p)| (p - r).abs())
            .collect(),
    );
    Ok(Timing {
        packets: t_play.len(),
        baseline,
        playback,
        sender,
    })
}

fn print_table(
    h: &mut dyn Write,
    rows: &[Row],
    timing: Option<&Timing>,
    duration: Duration,
) -> std::io::Result<()> {
    writeln!(
        h,
        "## penstock bench record — {:.0} s of an ~8 Mbit/s MPEG-TS per stream\n",
        duration.as_secs_f64()
    )?;
    writeln!(
        h,
        "| streams | datagrams sent | recorded | streams with loss | recordings identical to source | socket drops | sender misses (>1.316 ms) | sender lateness p99 | CPU (s) |"
    )?;
    writeln!(h, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    for r in rows {
        writeln!(
            h,
            "| {} | {} | {} | {} | {}/{} | {} | {} | {:.0} µs | {:.1} |",
            r.streams,
            r.sent,
            r.recorded,
            r.lost_streams,
            r.identical,
            r.streams,
            r.socket_drops,
            r.sender_misses,
            r.sender_p99_us,
            r.cpu_s
        )?;
    }
    let lossless = rows
        .iter()
        .filter(|r| r.lost_streams == 0 && r.identical == r.streams)
        .map(|r| r.streams)
        .max();
    writeln!(
        h,
        "\nLargest count recorded without loss: {}",
        lossless.map_or("none".to_string(), |n| n.to_string())
    )?;
    if let Some(t) = timing {
        writeln!(
            h,
            "\n| inter-packet gap error ({} packets, kernel receive times) | p50 | p99 | max |",
            t.packets
        )?;
        writeln!(h, "|---|---:|---:|---:|")?;
        writeln!(
            h,
            "| baseline: recorded gaps vs the CBR schedule (1.316 ms) | {:.1} µs | {:.1} µs | {:.1} µs |",
            t.baseline.0, t.baseline.1, t.baseline.2
        )?;
        writeln!(
            h,
            "| playback (`--timing tracks`) vs recorded gaps | {:.1} µs | {:.1} µs | {:.1} µs |",
            t.playback.0, t.playback.1, t.playback.2
        )?;
        writeln!(
            h,
            "\nPlayback sender lateness (deadline to send completion): p50 {:.1} µs, p99 {:.1} µs.",
            t.sender.0, t.sender.1
        )?;
    }
    Ok(())
}
