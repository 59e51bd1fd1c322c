//! `penstock record SRC DST`, `penstock tracks FILE [--check]`, and the plan behind
//! `penstock stream REC DST --timing tracks`.
//!
//! Exit codes of `record`: 0 stopped as asked (signal or `--duration`); 1 failed, or stopped
//! early because the destination was full (the summary says how much was kept, and the kept
//! part checks clean). `tracks --check`: 0 clean, 1 not clean or unreadable.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use penstock_core::endpoint::{Endpoint, Role};
use penstock_core::track::{FrameRule, Playback, Record, Speed, plan_playback};
use penstock_core::units::{parse_duration, parse_size};
use penstock_driver::open::{open_partition, open_source};
use penstock_driver::record::{
    FrameChoice, LoadedRecording, RecordConfig, RecordDst, RecordReport, StopCause, SyncPoint,
    load_tracks, media_path, record_to,
};
use penstock_driver::volume::Access;
use penstock_server::metrics::CliMetrics;
use penstock_server::metrics_http::MetricsListener;

/// Track records read at most per track (24 bytes each: 2.4 GB).
const RECORDS_MAX: u64 = 100_000_000;

#[derive(Args, Debug)]
pub struct RecordArgs {
    /// Growth step and update-lock wait of a vol: destination (as for `penstock volume`).
    #[command(flatten)]
    pub volume_limits: crate::cmd_volume::VolumeLimitArgs,
    /// Source: udp-listen://HOST:PORT or /net/udp/PORT (port 0: the kernel chooses; the bound
    /// address is printed on stdout as `listening ADDR`, on stderr with a bare --json).
    pub src: String,
    /// The media: a file (the tracks are written beside it: DST.time, DST.packet, DST.frame),
    /// or a ready volume partition `vol:VOLUME/PARTITION` (its size bounds the recording; the
    /// tracks go to `--tracks`).
    pub dst: String,
    /// With a vol: DST: the prefix of the track files (default: PARTITION, in the current
    /// directory).
    #[arg(long)]
    pub tracks: Option<PathBuf>,
    /// What begins an independent frame: auto (from the first datagram), mpegts (random-access
    /// indicator or H.264 IDR), mpegts-rai, rtp (after a marker), rtp-h264, every.
    #[arg(long, default_value = "auto", value_parser = parse_frames)]
    pub frames: FrameChoice,
    /// Stop after this long (default: at SIGINT or SIGTERM).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Make the media and then the tracks durable this often (0: only at the end).
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub sync_every: Duration,
    /// Largest datagram recorded (a longer one is counted as truncated and not kept).
    #[arg(long, value_parser = parse_size, default_value = "9216")]
    pub datagram_max: u64,
    /// Datagrams per recvmmsg and per vectored write (1..=1024).
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Socket receive buffer (SO_RCVBUFFORCE when permitted, else capped by rmem_max).
    #[arg(long, value_parser = parse_size, default_value = "32MiB")]
    pub rcvbuf: u64,
    /// Time packets when the loop reads them, not with the kernel's receive time.
    #[arg(long)]
    pub user_timestamps: bool,
    /// Print a line on stdout for every durable sync point.
    #[arg(long)]
    pub progress: bool,
    /// The summary as one JSON object: on stdout, and nothing else there (the listening
    /// address and `--progress` lines then go to stderr; the address is in the JSON as
    /// `listen`); or with `--json=FILE` in FILE, stdout unchanged.
    #[arg(long, value_name = "FILE", num_args = 0..=1, require_equals = true, default_missing_value = "-")]
    pub json: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics while recording (packets, bytes and
    /// syncs as of the last sync point, the process); port 0: the kernel chooses, the address
    /// is printed on stderr.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<std::net::SocketAddr>,
}

fn parse_frames(s: &str) -> Result<FrameChoice, String> {
    Ok(match s {
        "auto" => FrameChoice::Auto,
        "mpegts" => FrameChoice::Fixed(FrameRule::MpegTs { h264_idr: true }),
        "mpegts-rai" => FrameChoice::Fixed(FrameRule::MpegTs { h264_idr: false }),
        "rtp" => FrameChoice::Fixed(FrameRule::Rtp { h264: false }),
        "rtp-h264" => FrameChoice::Fixed(FrameRule::Rtp { h264: true }),
        "every" => FrameChoice::Fixed(FrameRule::EveryPacket),
        _ => {
            return Err(format!(
                "expected auto, mpegts, mpegts-rai, rtp, rtp-h264 or every, got {s:?}"
            ));
        }
    })
}

/// A frame rule's name as `--frames` spells it.
pub fn frame_rule_name(r: FrameRule) -> &'static str {
    match r {
        FrameRule::EveryPacket => "every",
        FrameRule::MpegTs { h264_idr: true } => "mpegts",
        FrameRule::MpegTs { h264_idr: false } => "mpegts-rai",
        FrameRule::Rtp { h264: false } => "rtp",
        FrameRule::Rtp { h264: true } => "rtp-h264",
    }
}

pub fn sync_line(p: &SyncPoint) -> String {
    format!(
        "synced packets={} media_bytes={} time_bytes={} packet_bytes={} frame_bytes={}",
        p.packets, p.media_bytes, p.time_bytes, p.packet_bytes, p.frame_bytes
    )
}

pub fn run(a: RecordArgs) -> Result<()> {
    a.volume_limits.apply()?;
    let source = Endpoint::parse(&a.src, Role::Source)?;
    if !matches!(source, Endpoint::UdpListen { .. }) {
        bail!(
            "record receives datagrams: SRC must be udp-listen://HOST:PORT or /net/udp/PORT, not {source}"
        );
    }
    let dst = match Endpoint::parse(&a.dst, Role::Target)? {
        Endpoint::File { path } => {
            if a.tracks.is_some() {
                bail!("--tracks is for vol: destinations; a file's tracks go beside it");
            }
            RecordDst::File(path)
        }
        Endpoint::Volume { volume, partition } => RecordDst::Partition {
            io: Box::new(open_partition(
                volume.as_str(),
                partition.as_str(),
                Access::SharedWrite,
            )?),
            tracks: tracks_prefix(a.tracks.as_deref(), partition.as_str()),
        },
        other => bail!("record writes a file or a vol: partition: DST must be one, not {other}"),
    };
    let tracks_prefix = dst.tracks_prefix().to_path_buf();
    let dst_label = a.dst.clone();
    let cfg = RecordConfig {
        datagram_bytes_max: usize::try_from(a.datagram_max).context("--datagram-max")?,
        batch_max: a.batch,
        rcvbuf_bytes: usize::try_from(a.rcvbuf).context("--rcvbuf")?,
        sync_every: (!a.sync_every.is_zero()).then_some(a.sync_every),
        duration: a.duration,
        frames: a.frames,
        kernel_timestamps: !a.user_timestamps,
    };
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone())?;
    // A file size limit (RLIMIT_FSIZE) sends SIGXFSZ, which kills by default: handle it, so
    // the write fails with EFBIG and the recording stops cleanly as for ENOSPC.
    signal_hook::flag::register(
        signal_hook::consts::SIGXFSZ,
        Arc::new(AtomicBool::new(false)),
    )?;
    // With --json, stdout carries the JSON object only: the address and the progress lines
    // go to stderr (the address is in the JSON too).
    let json = penstock_bench::out::json_on_stdout(a.json.as_deref());
    let mut listening = None;
    let opened = open_source(&source, &mut |addr| {
        listening = Some(addr);
        if json {
            eprintln!("listening {addr}");
        } else {
            println!("listening {addr}");
            let _ = std::io::stdout().flush();
        }
    })?;
    let progress = a.progress;
    let metrics = match a.metrics {
        Some(addr) => {
            let m = Arc::new(CliMetrics::record());
            let l = MetricsListener::start(addr, m.clone())
                .with_context(|| format!("--metrics {addr}"))?;
            eprintln!("penstock: metrics on http://{}/metrics", l.local_addr());
            Some((m, l))
        }
        None => None,
    };
    let report = record_to(
        std::os::fd::AsFd::as_fd(&opened.fd),
        dst,
        &cfg,
        &stop,
        &mut |p| {
            if let Some((m, _)) = &metrics {
                m.feed_record(p.packets, p.media_bytes);
            }
            if progress && json {
                eprintln!("{}", sync_line(p));
            } else if progress {
                println!("{}", sync_line(p));
                let _ = std::io::stdout().flush();
            }
        },
    )?;
    if let Some(dest) = &a.json {
        let mut v = report_json(&report);
        v["listen"] = listening.map_or(serde_json::Value::Null, |a| a.to_string().into());
        penstock_bench::out::write_json(dest, &v)?;
    }
    eprintln!("{}", summary(Path::new(&dst_label), &report));
    if dst_label.starts_with("vol:") {
        eprintln!(
            "penstock: tracks: {}.{{time,packet,frame}}",
            tracks_prefix.display()
        );
    }
    if let StopCause::NoSpace { errno } = report.cause {
        let clean = report.kept.as_ref().is_some_and(|k| k.is_clean());
        bail!(
            "{} is out of space ({}): recording stopped; kept {} packets ({} bytes){}",
            dst_label,
            std::io::Error::from_raw_os_error(errno),
            report.packets,
            report.media_bytes,
            if clean {
                ", which check clean"
            } else {
                ", which do NOT check clean"
            }
        );
    }
    Ok(())
}

pub fn summary(dst: &std::path::Path, r: &RecordReport) -> String {
    let drops = r
        .socket_drops
        .map_or("unknown".to_string(), |d| d.to_string());
    format!(
        "penstock: recorded {} packets, {} bytes, {} frame starts ({} frames) in {:.3} s to {}; \
         socket drops {drops}, truncated {}, empty {}; {} syncs; rcvbuf {} bytes; largest batch {}; \
         times from the {}; stopped: {}",
        r.packets,
        r.media_bytes,
        r.frames,
        frame_rule_name(r.frame_rule),
        r.elapsed.as_secs_f64(),
        dst.display(),
        r.truncated,
        r.empty,
        r.syncs,
        r.rcvbuf_bytes,
        r.batch_largest,
        if r.kernel_timestamps {
            "kernel (SO_TIMESTAMPNS)"
        } else {
            "recorder's clock"
        },
        match r.cause {
            StopCause::Stopped => "signal".to_string(),
            StopCause::Duration => "duration".to_string(),
            StopCause::NoSpace { errno } => format!(
                "out of space ({})",
                std::io::Error::from_raw_os_error(errno)
            ),
        }
    )
}

pub fn report_json(r: &RecordReport) -> serde_json::Value {
    serde_json::json!({
        "packets": r.packets,
        "bytes": r.media_bytes,
        "frames": r.frames,
        "frame_rule": frame_rule_name(r.frame_rule),
        "socket_drops": r.socket_drops,
        "truncated": r.truncated,
        "empty": r.empty,
        "syncs": r.syncs,
        "rcvbuf_bytes": r.rcvbuf_bytes,
        "batch_largest": r.batch_largest,
        "seconds": r.elapsed.as_secs_f64(),
        "kernel_timestamps": r.kernel_timestamps,
        "stopped": match r.cause {
            StopCause::Stopped => "signal",
            StopCause::Duration => "duration",
            StopCause::NoSpace { .. } => "no-space",
        },
        "kept_clean": r.kept.as_ref().map(|k| k.is_clean()),
    })
}

#[derive(Args, Debug)]
pub struct TracksArgs {
    /// A recording's media file (or one of its track files: REC.time, REC.packet, REC.frame),
    /// or its vol:VOLUME/PARTITION.
    pub file: String,
    /// A vol: recording's track prefix (default: PARTITION, in the current directory).
    #[arg(long)]
    pub tracks: Option<PathBuf>,
    /// Check the tracks against each other and the media instead of dumping them: says how
    /// far the recording is readable; exit 0 when clean, 1 otherwise.
    #[arg(long)]
    pub check: bool,
    /// Dump only this track: time, packet or frame (default: one joined table).
    #[arg(long)]
    pub track: Option<String>,
}

pub fn run_tracks(a: TracksArgs) -> Result<()> {
    match dump_tracks(a) {
        // `penstock tracks REC | head`: the reader left, which is not an error.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            Ok(())
        }
        r => r,
    }
}

/// The track files' prefix of a recording in partition `partition`: `--tracks`, else the
/// partition's name in the current directory.
fn tracks_prefix(given: Option<&Path>, partition: &str) -> PathBuf {
    given.map_or_else(|| PathBuf::from(partition), Path::to_path_buf)
}

/// A recording named on the command line: where its tracks are, how long its media is, and
/// a name for messages.
pub struct Recording {
    pub prefix: PathBuf,
    pub media_len_bytes: u64,
    pub label: String,
}

/// Finds the recording `name`: a media file or one of its track files, or
/// `vol:VOLUME/PARTITION` with its tracks at `tracks` (default: PARTITION).
pub fn recording(name: &str, tracks: Option<&Path>) -> Result<Recording> {
    match Endpoint::parse(name, Role::Source)? {
        Endpoint::Volume { volume, partition } => {
            let io = open_partition(volume.as_str(), partition.as_str(), Access::Shared)?;
            Ok(Recording {
                prefix: tracks_prefix(tracks, partition.as_str()),
                media_len_bytes: io.size_bytes,
                label: name.to_string(),
            })
        }
        Endpoint::File { path } => {
            if tracks.is_some() {
                bail!("--tracks is for vol: recordings; a file's tracks are beside it");
            }
            let media = media_path(&path);
            let media_len_bytes = std::fs::metadata(&media)
                .with_context(|| media.display().to_string())?
                .len();
            Ok(Recording {
                label: media.display().to_string(),
                prefix: media,
                media_len_bytes,
            })
        }
        other => bail!("a recording is a file or a vol: partition, not {other}"),
    }
}

fn dump_tracks(a: TracksArgs) -> Result<()> {
    let r = recording(&a.file, a.tracks.as_deref())?;
    let rec = load_tracks(&r.prefix, r.media_len_bytes, RECORDS_MAX)?;
    let media = PathBuf::from(&r.label);
    if a.check {
        return check_report(&media, &rec);
    }
    let out = std::io::stdout();
    let mut w = std::io::BufWriter::new(out.lock());
    let mut line = String::new();
    fn dump<R: Record>(
        w: &mut impl Write,
        line: &mut String,
        records: &[R],
    ) -> std::io::Result<()> {
        writeln!(w, "{}", R::KIND.csv_header())?;
        for r in records {
            line.clear();
            r.write_csv(line);
            writeln!(w, "{line}")?;
        }
        Ok(())
    }
    match a.track.as_deref() {
        Some("time") => dump(&mut w, &mut line, &rec.time.records)?,
        Some("packet") => dump(&mut w, &mut line, &rec.packet.records)?,
        Some("frame") => dump(&mut w, &mut line, &rec.frame.records)?,
        Some(other) => bail!("--track must be time, packet or frame, not {other:?}"),
        None => {
            // One row per readable packet: the three tracks joined.
            writeln!(
                w,
                "packet,time_ns,media_offset_bytes,size_bytes,frame_start"
            )?;
            let mut frames = rec.frame.records.iter().peekable();
            for i in 0..rec.report.readable_packets as usize {
                let (t, p) = (&rec.time.records[i], &rec.packet.records[i]);
                let frame = frames.next_if(|f| f.packet_index == i as u64).is_some();
                writeln!(
                    w,
                    "{},{},{},{},{}",
                    i,
                    t.time_ns,
                    p.media_offset_bytes,
                    p.size_bytes,
                    u8::from(frame)
                )?;
            }
        }
    }
    w.flush()?;
    if !rec.report.is_clean() || !rec.problems().is_empty() {
        eprintln!(
            "penstock: note: {}: not clean, run `penstock tracks --check`",
            media.display()
        );
    }
    Ok(())
}

fn check_report(media: &std::path::Path, rec: &LoadedRecording) -> Result<()> {
    let h = rec.time.header;
    println!(
        "{}: frame rule {}, times from the {}",
        media.display(),
        frame_rule_name(h.frame_rule),
        if h.flags & penstock_core::track::format::FLAG_KERNEL_TIMESTAMPS != 0 {
            "kernel"
        } else {
            "recorder's clock"
        }
    );
    println!(
        "tracks: time {} records ({}), packet {} records ({}), frame {} records ({}); media {} bytes",
        rec.time.records.len(),
        rec.time.stop,
        rec.packet.records.len(),
        rec.packet.stop,
        rec.frame.records.len(),
        rec.frame.stop,
        rec.media_len_bytes
    );
    let r = &rec.report;
    println!(
        "readable up to packet {} ({} media bytes, {:.6} s, {} frames); limited by {:?}",
        r.readable_packets,
        r.readable_media_bytes,
        r.readable_time_ns as f64 / 1e9,
        r.readable_frames,
        r.limit
    );
    let problems = rec.problems();
    if problems.is_empty() {
        println!("clean");
        Ok(())
    } else {
        for p in &problems {
            println!("NOT clean: {p}");
        }
        std::process::exit(1);
    }
}

/// The plan for `penstock stream REC DST --timing tracks [--from T] [--speed X]`.
pub fn playback_plan(
    recording: &Recording,
    from: Option<Duration>,
    speed: Option<&str>,
) -> Result<Playback> {
    let rec = load_tracks(&recording.prefix, recording.media_len_bytes, RECORDS_MAX)?;
    let problems = rec.problems();
    if !problems.is_empty() {
        eprintln!(
            "penstock: note: {}: {}; playing the readable prefix ({} packets)",
            recording.label,
            problems.join("; "),
            rec.report.readable_packets
        );
    }
    let speed = match speed {
        Some(s) => Speed::parse(s)?,
        None => Speed::NORMAL,
    };
    let from_ns = from.map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    Ok(plan_playback(
        &rec.time.records,
        &rec.packet.records,
        &rec.frame.records,
        rec.report.readable_packets,
        from_ns,
        speed,
    )?)
}
