//! `penstock stream SRC DST`.

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use penstock_core::endpoint::{Endpoint, Role};
use penstock_core::lateness::{LatenessSummary, TraceRecord};
use penstock_core::sched::drr::SchedMode;
use penstock_core::sched::edf::Order;
use penstock_core::schedule::{LatePolicy, ScheduleFlags};
use penstock_core::stream::plan::Pacing;
use penstock_core::stream::{CachePolicy, Extent, PathChoice};
use penstock_core::units::{parse_duration, parse_size};
use penstock_driver::clock::{CpuWho, cpu_times};
use penstock_driver::disk::DiskConfig;
use penstock_driver::{
    DiskClass, Engine, EngineConfig, MovedBytes, StreamReport, StreamSpec, TimerMode, ZeroCopy,
};
use penstock_server::metrics::{CliMetrics, StreamSeen};
use penstock_server::metrics_http::MetricsListener;

use crate::timing::{Timing, pcr_plan, pcr_playback};
use penstock_core::track::Playback;
use penstock_driver::open::Opened;

#[derive(Args, Debug)]
pub struct StreamArgs {
    /// Source: a file, `-` (stdin), tcp://, tcp-listen://, udp-listen://, unix:, /net/...
    pub src: String,
    /// Target: a file, `-` (stdout), tcp://, tcp-listen://, udp://, unix:, /net/...
    pub dst: String,
    /// Start at this byte of the source (files).
    #[arg(long, value_parser = parse_size)]
    pub offset: Option<u64>,
    /// Move this many bytes (default: to the end).
    #[arg(long, value_parser = parse_size)]
    pub length: Option<u64>,
    /// Transfer unit (bytes per read/send; one datagram for UDP). Paced streams default to
    /// 1316 bytes, a bit rate to a byte stream (TCP, a pipe, a file) to multiples of 1316
    /// bytes 1 ms apart.
    #[arg(long, value_parser = parse_size)]
    pub unit: Option<u64>,
    /// Data path: auto, copy, sendfile, splice, uring.
    #[arg(long, default_value = "auto")]
    pub path: PathChoice,
    /// Page cache: keep, bypass (O_DIRECT), drop (RWF_DONTCACHE).
    #[arg(long, default_value = "keep")]
    pub cache: CachePolicy,
    /// Zero-copy sends on the uring path: auto, on, off.
    #[arg(long, default_value = "auto", value_parser = parse_zc)]
    pub zero_copy: ZeroCopy,
    /// Pool buffer size (bounds the unit of the uring path).
    #[arg(long, value_parser = parse_size, default_value = "1MiB")]
    pub buffer_size: u64,
    /// Buffers in the pool.
    #[arg(long, default_value_t = 32)]
    pub buffers: usize,
    /// One JSON object instead of the summary line: on stdout, or with `--json=FILE` in
    /// FILE (the summary line then stays on stderr).
    #[arg(long, value_name = "FILE", num_args = 0..=1, require_equals = true, default_missing_value = "-")]
    pub json: Option<std::path::PathBuf>,
    /// Periodic: one unit every DUR (e.g. 33.333ms).
    #[arg(long, conflicts_with_all = ["rate", "schedule"])]
    pub period: Option<String>,
    /// Periodic at a frame rate (30/s) or constant bit rate (8Mbps, 8Mbit/s: bits; 1MB/s:
    /// bytes).
    #[arg(long, conflicts_with = "schedule")]
    pub rate: Option<String>,
    /// Cues' (k, t): K units at the start of every cycle of length T (e.g. 4,40ms).
    #[arg(long, value_name = "K,T")]
    pub schedule: Option<String>,
    /// Cues' (k, t) as the paper defines it: K units, then a pause of T after the last of
    /// them was sent (e.g. 4,40ms).
    #[arg(long, value_name = "K,T", conflicts_with_all = ["rate", "period", "schedule"])]
    pub pause: Option<String>,
    /// A unit later than this is a miss (default: one period).
    #[arg(long, value_parser = parse_duration)]
    pub miss_after: Option<Duration>,
    /// A paced stream's units later than the miss threshold: send (at once, after a stall a
    /// burst) or skip (drop them unsent, counted; the stream resumes on schedule). skip needs
    /// a file source.
    #[arg(long, default_value = "send", value_parser = parse_late)]
    pub late: LatePolicy,
    /// Write every unit's scheduled and completion times to this CSV file.
    #[arg(long)]
    pub trace: Option<std::path::PathBuf>,
    /// How to sleep until a deadline: uring (absolute io_uring timeout) or nanosleep.
    #[arg(long, default_value = "uring", value_parser = parse_timer)]
    pub timer: TimerMode,
    /// Wake this long before a deadline and spin until it (off by default; at most 2ms).
    #[arg(long, value_parser = parse_duration)]
    pub spin: Option<Duration>,
    /// Dispatch slack: each wake-up for a deadline also sends the units due within this much
    /// more (default 500us; 0: each unit at its own deadline; at most 1ms).
    #[arg(long, value_parser = parse_duration)]
    pub dispatch_slack: Option<Duration>,
    /// mlockall, and SCHED_FIFO for the timed worker when --sched is other (falls back
    /// with a message when refused).
    #[arg(long)]
    pub realtime: bool,
    /// CPU policy of the timed worker that carries paced and rt streams: auto (deadline
    /// where permitted, else fifo, else none), deadline, fifo, other (no timed worker).
    #[arg(long, default_value = "auto", value_parser = parse_cpu_sched)]
    pub cpu_sched: penstock_core::sched::policy::SchedAsk,
    /// Disk class: rt (a guarantee: admission control first) or bulk.
    #[arg(long, value_parser = parse_class)]
    pub class: Option<DiskClass>,
    /// Pool buffers an rt stream reserves.
    #[arg(long)]
    pub reserve_buffers: Option<u32>,
    /// Calibration file (default: ~/.config/penstock/calibration.toml).
    #[arg(long)]
    pub calibration: Option<std::path::PathBuf>,
    /// Network capacity for admission (default 10Gbit/s).
    #[arg(long)]
    pub net_rate: Option<String>,
    /// Without a calibration file, do not measure the source's device on first use (a short
    /// self-calibration, under 3 s, cached per device): admission then uses conservative
    /// defaults.
    #[arg(long)]
    pub no_self_calibrate: bool,
    /// Where self-calibrations are cached (default: $XDG_CACHE_HOME/penstock, else
    /// ~/.cache/penstock).
    #[arg(long)]
    pub calibration_cache: Option<std::path::PathBuf>,
    /// Share of disk, network and buffers rt streams may never take (percent).
    #[arg(long, default_value_t = 20)]
    pub bulk_share: u8,
    /// Disk scheduler: drr (DRR across classes, EDF in rt) or fifo (switched off).
    #[arg(long, default_value = "drr", value_parser = parse_sched)]
    pub sched: SchedMode,
    /// Disk reads in flight per device at most.
    #[arg(long, default_value_t = 8)]
    pub disk_inflight_max: u32,
    /// Dispatch order of due units: edf or rm (rate-monotonic, as MARS's RTUs).
    #[arg(long, default_value = "edf", value_parser = parse_order)]
    pub order: Order,
    /// Send each unit at its own time: `tracks` (each packet of a recording at its recorded
    /// time, from its time and packet tracks), `pcr` (an MPEG-TS file at its program clock
    /// reference: units of --ts-packets TS packets, each due at its first packet's PCR time),
    /// `samples` (a plain MP4's bytes, each sample in file order due at its decode time; units
    /// of at most --unit-max bytes), or `auto` (tracks when the recording has them, else pcr
    /// for a TS file — by extension or sync bytes —, else samples for an MP4 — by extension or
    /// `ftyp` —, else none). Excludes --period/--rate/--schedule/--offset/--length/--unit
    /// (`auto` yields to them).
    #[arg(long, value_parser = parse_timing)]
    pub timing: Option<Timing>,
    /// With --timing tracks: start at the independent frame at or before this time; with
    /// --timing pcr: at the key frame at or before it (the file's key-frame index; the last
    /// PCR at or before it where the file has no key frame); with --timing samples: at the video
    /// sync sample at or before it.
    #[arg(long, value_parser = parse_duration)]
    pub from: Option<Duration>,
    /// With --timing tracks: play this many times as fast (2, 0.5).
    #[arg(long)]
    pub speed: Option<String>,
    /// With --timing tracks and a vol: SRC: the prefix of the recording's track files (default:
    /// PARTITION, in the current directory).
    #[arg(long)]
    pub tracks: Option<std::path::PathBuf>,
    /// With --timing samples: the largest unit (one datagram on UDP), bytes.
    #[arg(long, default_value_t = 1316)]
    pub unit_max: u32,
    /// With --timing pcr: TS packets per unit (datagram), 1 to 7.
    #[arg(long, default_value_t = penstock_core::ts::pcr::PACKETS_PER_UNIT_MAX)]
    pub ts_packets: u8,
    /// With --timing pcr: a PCR further than this ahead of the previous one is a gap, spliced
    /// like a discontinuity (ISO/IEC 13818-1 wants one every 100 ms).
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub pcr_gap_max: Duration,
    /// With --timing pcr: TS packets read for the PAT and PMT (which name the PCR PID) before
    /// the first PID carrying a PCR is taken.
    #[arg(long, default_value_t = penstock_core::ts::pcr::PROBE_PACKETS_DEFAULT)]
    pub pcr_probe_packets: u64,
    /// With --timing pcr: most entries (units and PCRs, 16 bytes each) the plan may hold.
    #[arg(long, default_value_t = penstock_core::ts::pcr::PLAN_ENTRIES_MAX_DEFAULT)]
    pub plan_entries_max: u64,
    /// Send each unit as an RTP packet (RFC 2250 MPEG-TS: payload type 33, 90 kHz
    /// timestamps from the unit times) to a udp:// target, with RTCP sender reports and a BYE
    /// to its port + 1 and receiver reports taken in there. Needs --timing (default: auto).
    #[arg(long)]
    pub rtp: bool,
    /// With --rtp: write an SDP describing the stream to this file before it starts (for
    /// receivers without RTSP: `ffmpeg -protocol_whitelist file,udp,rtp -i FILE`).
    #[arg(long, requires = "rtp")]
    pub sdp: Option<std::path::PathBuf>,
    /// With --rtp: time between RTCP sender reports (each drawn from 0.5 to 1.5 times it).
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    pub rtcp_interval: Duration,
    /// Fail when no byte moves for this long (the receiver stopped reading, or a socket
    /// source stopped sending); time paused or waiting for a paced unit's deadline does not
    /// count. 0: wait forever.
    // The engine's SEND_TIMEOUT_DEFAULT.
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    pub send_timeout: Duration,
    /// Serve Prometheus metrics at http://ADDR/metrics while the stream runs (lateness by
    /// class, misses, bytes, the engine's pool, the process); port 0: the kernel chooses, the
    /// address is printed on stderr.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<std::net::SocketAddr>,
}

fn parse_timing(s: &str) -> Result<Timing, String> {
    s.parse()
}

fn parse_late(s: &str) -> Result<LatePolicy, String> {
    s.parse()
        .map_err(|e: penstock_core::schedule::LatePolicyError| e.to_string())
}

fn parse_timer(s: &str) -> Result<TimerMode, String> {
    match s {
        "uring" => Ok(TimerMode::Uring),
        "nanosleep" => Ok(TimerMode::Nanosleep),
        _ => Err(format!("expected uring or nanosleep, got {s:?}")),
    }
}

pub fn parse_class(s: &str) -> Result<DiskClass, String> {
    match s {
        "rt" => Ok(DiskClass::Rt),
        "bulk" => Ok(DiskClass::Bulk),
        // `penstock stream`'s engine has the two built-in classes only
        // (`[disk.classes.NAME]` is the server's).
        _ => Err(format!("unknown class {s:?}: expected rt or bulk")),
    }
}

pub fn parse_sched(s: &str) -> Result<SchedMode, String> {
    match s {
        "drr" => Ok(SchedMode::Drr),
        "fifo" => Ok(SchedMode::Fifo),
        _ => Err(format!("expected drr or fifo, got {s:?}")),
    }
}

fn parse_order(s: &str) -> Result<Order, String> {
    match s {
        "edf" => Ok(Order::EarliestDeadline),
        "rm" => Ok(Order::RateMonotonic),
        _ => Err(format!("expected edf or rm, got {s:?}")),
    }
}

/// What the pacing flags ask for (parsed only: the planner decides the schedule, its unit
/// default and its limits when the stream is opened, before anything is sent).
pub fn pacing_from_flags(
    period: Option<&str>,
    rate: Option<&str>,
    kt: Option<&str>,
    pause: Option<&str>,
) -> Result<Pacing> {
    Ok(Pacing::from_flags(&ScheduleFlags {
        period,
        rate,
        unit: None,
        kt,
        pause,
    })?)
}

fn parse_zc(s: &str) -> Result<ZeroCopy, String> {
    match s {
        "auto" => Ok(ZeroCopy::Auto),
        "on" => Ok(ZeroCopy::On),
        "off" => Ok(ZeroCopy::Off),
        _ => Err(format!("expected auto, on or off, got {s:?}")),
    }
}

/// What one stream run measured.
pub struct Outcome {
    pub report: StreamReport,
    pub seconds: f64,
    pub cpu_user_s: f64,
    pub cpu_sys_s: f64,
    pub rtp: Option<RtpOutcome>,
}

/// An RTP stream's identity and what its RTCP session saw.
pub struct RtpOutcome {
    pub packetizer: penstock_core::rtp::Packetizer,
    pub sender_reports: u64,
    pub receivers: penstock_core::rtp::ReceiverStats,
}

fn rtcp_line(r: &RtpOutcome) -> String {
    let s = &r.receivers;
    let mut line = format!(
        "; RTP SSRC {:#010x}, {} RTCP sender reports",
        r.packetizer.ssrc, r.sender_reports
    );
    if s.reports == 0 {
        line += ", no receiver report";
    } else {
        line += &format!(
            ", {} receiver reports (last: {:.1} % lost, {} lost in all, jitter {:.3} ms; largest jitter {:.3} ms",
            s.reports,
            s.fraction_lost_ratio() * 100.0,
            s.cumulative_lost,
            s.jitter_ns() as f64 / 1e6,
            s.jitter_max_ns() as f64 / 1e6,
        );
        if let Some(rtt) = s.rtt_ns {
            line += &format!(", round trip {:.3} ms", rtt as f64 / 1e6);
        }
        line += ")";
    }
    line
}

fn rtp_json(r: &RtpOutcome) -> serde_json::Value {
    let s = &r.receivers;
    serde_json::json!({
        "ssrc": r.packetizer.ssrc,
        "sequence_start": r.packetizer.sequence_start,
        "timestamp_start": r.packetizer.timestamp_start,
        "payload_type": r.packetizer.payload_type,
        "rtcp_sender_reports": r.sender_reports,
        "rtcp_receiver_reports": s.reports,
        "fraction_lost": s.fraction_lost_ratio(),
        "cumulative_lost": s.cumulative_lost,
        "jitter_ns": s.jitter_ns(),
        "jitter_max_ns": s.jitter_max_ns(),
        "rtt_ns": s.rtt_ns,
        "rtcp_byes": s.byes,
        "rtcp_malformed": s.malformed,
    })
}

pub fn run(a: StreamArgs) -> Result<()> {
    let source = Endpoint::parse(&a.src, Role::Source)?;
    let target = Endpoint::parse(&a.dst, Role::Target)?;
    // Parsed before anything is opened; the engine has the planner check it before it
    // opens the endpoints.
    let pacing = pacing_from_flags(
        a.period.as_deref(),
        a.rate.as_deref(),
        a.schedule.as_deref(),
        a.pause.as_deref(),
    )?;
    if a.rtp && !matches!(target, Endpoint::UdpSend { .. }) {
        return Err(crate::Usage(format!("--rtp sends to a udp:// target, not {target}")).into());
    }
    let timing = media_timing(&a, &source, pacing.is_paced())?;
    let (opened, playback) = open_timed(&a, &source, &target, timing)?;
    let engine = std::sync::Arc::new(Engine::new(engine_config(&a)?)?);
    let metrics = match a.metrics {
        Some(addr) => {
            let m = std::sync::Arc::new(CliMetrics::stream(engine.clone()));
            if a.rtp {
                m.register_rtcp();
            }
            let l = MetricsListener::start(addr, m.clone())
                .with_context(|| format!("--metrics {addr}"))?;
            eprintln!("penstock: metrics on http://{}/metrics", l.local_addr());
            Some((m, l))
        }
        None => None,
    };
    if let Err(why) = &engine.info().uring {
        eprintln!("penstock: note: {why}");
    }
    if a.realtime
        && let Err(why) = &engine.info().realtime
    {
        eprintln!("penstock: note: --realtime: {why}; running with normal scheduling");
    }
    // RTP: random identity and numbering (RFC 3550 §5.1), the stream's unit 0 due a moment
    // from now (the anchor the RTCP link times its reports by), the RTCP link beside it.
    let rtp = a
        .rtp
        .then(|| penstock_core::rtp::Packetizer::mp2t(random_u64()));
    let start_at = rtp.map(|_| {
        let now = penstock_driver::clock::now();
        penstock_core::time::Instant::from_nanos(now.as_nanos() + RTP_START_DELAY_NS)
    });
    let link = rtcp_link(&a, rtp, start_at, &opened)?;
    let spec = stream_spec(&a, source, target, pacing, playback, rtp, start_at)?;
    let out = run_stream(&a, &engine, spec, opened, metrics, link, rtp)?;
    let json_stdout = penstock_bench::out::json_on_stdout(a.json.as_deref());
    for n in &out.report.notes {
        eprintln!("penstock: note: {n}");
    }
    if let Some(path) = &a.trace {
        write_trace(path, &out.report.trace)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(dest) = &a.json {
        penstock_bench::out::write_json(dest, &summary_json(&out))?;
    }
    if !json_stdout {
        eprintln!("{}", summary_line(&out));
    }
    Ok(())
}

/// The stream's media timing (`--timing`, implied by `--rtp`), checked against the other
/// flags and the source: `None` for a stream paced by flags or sent in a burst.
fn media_timing(a: &StreamArgs, source: &Endpoint, paced: bool) -> Result<Option<Timing>> {
    let extent_flags = a.offset.is_some() || a.length.is_some() || a.unit.is_some();
    // --rtp needs unit times: it implies --timing auto.
    let asked = a.timing.or(a.rtp.then_some(Timing::Auto));
    let timing = match asked {
        Some(Timing::Auto) if paced || extent_flags => None,
        Some(Timing::Auto) => {
            let t = crate::timing::auto(source, a.tracks.as_deref());
            eprintln!(
                "penstock: note: --timing auto: {}",
                match t {
                    Some(Timing::Tracks) => "the recording's tracks",
                    Some(Timing::Samples) => "the samples' decode times of an MP4",
                    Some(_) => "the PCR of an MPEG-TS file",
                    None => "no timing of its own (not a recording, not MPEG-TS): burst",
                }
            );
            t
        }
        t => t,
    };
    match timing {
        None if a.from.is_some() || a.speed.is_some() || a.tracks.is_some() => {
            return Err(crate::Usage(
                "--from needs --timing tracks or pcr; --speed and --tracks need --timing tracks"
                    .into(),
            )
            .into());
        }
        Some(Timing::Tracks | Timing::Pcr | Timing::Samples) if paced || extent_flags => {
            return Err(crate::Usage(
                "--timing tracks, pcr and samples take units, times and the extent from the media: drop --period/--rate/--schedule/--offset/--length/--unit".into(),
            )
            .into());
        }
        Some(Timing::Tracks)
            if !matches!(source, Endpoint::File { .. } | Endpoint::Volume { .. }) =>
        {
            anyhow::bail!(
                "--timing tracks plays a recording: SRC must be a file or a vol: partition"
            );
        }
        Some(Timing::Pcr) if !matches!(source, Endpoint::File { .. }) => {
            anyhow::bail!("--timing pcr reads the PCR of an MPEG-TS file: SRC must be a file");
        }
        Some(Timing::Samples) if !matches!(source, Endpoint::File { .. }) => {
            anyhow::bail!("--timing samples reads an MP4's sample tables: SRC must be a file");
        }
        Some(Timing::Samples) if a.rtp => {
            return Err(crate::Usage(
                "--rtp sends MPEG-TS (RFC 2250): not an MP4's bytes (RTSP of MP4 is issue 36)"
                    .into(),
            )
            .into());
        }
        Some(Timing::Pcr | Timing::Samples) if a.speed.is_some() || a.tracks.is_some() => {
            return Err(crate::Usage("--speed and --tracks are for --timing tracks".into()).into());
        }
        _ => {}
    }
    Ok(timing)
}

/// A stream timed by its media, or sent as RTP, opens its endpoints here (the PCR is read
/// from the very descriptor the engine sends, and RTCP pairs with the RTP socket), and its
/// unit plan is read from the media.
#[allow(clippy::type_complexity)]
fn open_timed(
    a: &StreamArgs,
    source: &Endpoint,
    target: &Endpoint,
    timing: Option<Timing>,
) -> Result<(Option<(Opened, Option<Opened>)>, Option<Playback>)> {
    let pcr_limits = penstock_core::ts::PcrLimits {
        probe_packets: a.pcr_probe_packets,
        pcr_gap_ns_max: u64::try_from(a.pcr_gap_max.as_nanos()).unwrap_or(u64::MAX),
        plan_entries_max: a.plan_entries_max,
        packets_per_unit: a.ts_packets,
    };
    if !(1..=penstock_core::ts::pcr::PACKETS_PER_UNIT_MAX).contains(&a.ts_packets) {
        return Err(crate::Usage(format!("--ts-packets {}: 1 to 7", a.ts_packets)).into());
    }
    // A stream timed by its media, or sent as RTP, opens its endpoints here: the PCR is read
    // from the very descriptor the engine sends, and RTCP pairs with the RTP socket.
    let mut opened = None;
    if matches!(timing, Some(Timing::Pcr | Timing::Samples)) || a.rtp {
        let mut on_listen = |addr| eprintln!("penstock: listening on {addr}");
        let src = penstock_driver::open::open_source(source, &mut on_listen)?;
        opened = Some((src, None));
    }
    let playback = match timing {
        None | Some(Timing::Auto) => None,
        Some(Timing::Tracks) => Some(crate::cmd_record::playback_plan(
            &crate::cmd_record::recording(&a.src, a.tracks.as_deref())?,
            a.from,
            a.speed.as_deref(),
        )?),
        Some(Timing::Pcr) => {
            use std::os::fd::AsFd;
            let (src, _) = opened.as_ref().expect("opened above for --timing pcr");
            let file = std::fs::File::from(src.fd.as_fd().try_clone_to_owned()?);
            let (pid, plan) = pcr_plan(&file, &a.src, &pcr_limits)?;
            let from_ns = a
                .from
                .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
            // A seek starts at the key frame at or before it (the file's key-frame index,
            // the one RTSP's `Range: npt=` and HLS use), by PCR only where the file has none.
            let keys = from_ns.map(|_| {
                let len = file.metadata().map(|m| m.len()).unwrap_or(0);
                penstock_driver::media::ts_key_frames(
                    &file,
                    len,
                    penstock_core::hls::TsIndexLimits::default(),
                )
                .map(|i| plan.key_units(i.key_frames.iter().map(|k| k.offset)))
            });
            let (pb, line) = pcr_playback(&pid, &plan, from_ns, keys);
            eprintln!("penstock: {}: {line}", a.src);
            Some(pb)
        }
        Some(Timing::Samples) => {
            use std::os::fd::AsFd;
            let (src, _) = opened.as_ref().expect("opened above for --timing samples");
            let file = std::fs::File::from(src.fd.as_fd().try_clone_to_owned()?);
            let from_ns = a
                .from
                .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
            let (pb, line) = crate::timing::samples_playback(
                &file,
                &a.src,
                from_ns,
                a.unit_max,
                usize::try_from(a.plan_entries_max).unwrap_or(usize::MAX),
            )?;
            eprintln!("penstock: {}: {line}", a.src);
            Some(pb)
        }
    };
    if let Some((_, dst)) = &mut opened {
        let mut on_listen = |addr| eprintln!("penstock: listening on {addr}");
        *dst = Some(penstock_driver::open::open_target(target, &mut on_listen)?);
    }
    Ok((opened, playback))
}

/// The engine `penstock stream` runs: one worker, the admission figures of the calibration
/// file (else the defaults, with the self-calibrated send cost for an rt stream), and the
/// flags' pool, timer and scheduling.
fn engine_config(a: &StreamArgs) -> Result<EngineConfig> {
    let (mut admission, admission_note) = crate::calibrate::admission_config(
        a.calibration.as_deref(),
        a.net_rate.as_deref(),
        u32::try_from(a.buffers).unwrap_or(u32::MAX),
        a.buffer_size,
        a.bulk_share,
    )?;
    if let (Some(note), Some(DiskClass::Rt)) = (&admission_note, a.class) {
        eprintln!("penstock: note: {note}");
    }
    let self_calibration = penstock_driver::calibration::SelfCalibration {
        enabled: !a.no_self_calibrate,
        cache_dir: a
            .calibration_cache
            .clone()
            .or_else(penstock_driver::calibration::default_cache_dir),
        ..Default::default()
    };
    if admission_note.is_some() && a.class == Some(DiskClass::Rt) && self_calibration.enabled {
        crate::calibrate::charge_self_calibrated_send_cost(
            &mut admission,
            self_calibration.cache_dir.as_deref(),
        );
    }
    Ok(EngineConfig {
        admission,
        self_calibration,
        disk: DiskConfig {
            mode: a.sched,
            disk_inflight_max: a.disk_inflight_max,
            ..DiskConfig::default()
        },
        workers: 1,
        pool_buffers: a.buffers,
        buffer_bytes: usize::try_from(a.buffer_size).context("buffer size")?,
        // A cap; the read depth is the source device's (calibration file, else
        // self-calibration, else the engine's default).
        stream_depth: (penstock_driver::calibration::READ_DEPTH_MAX + 1).min(a.buffers.max(1)),
        read_depth: penstock_driver::ReadDepthConfig {
            calibrated: crate::calibrate::read_depths(a.calibration.as_deref()),
            ..Default::default()
        },
        timer: a.timer,
        spin: a.spin.unwrap_or_default(),
        dispatch_slack: a
            .dispatch_slack
            .unwrap_or(penstock_driver::engine::DISPATCH_SLACK_DEFAULT),
        realtime: a.realtime,
        sched: a.cpu_sched,
        order: a.order,
        ..EngineConfig::default()
    })
}

/// The RTCP link beside an RTP stream (and its SDP file, `--sdp`); `None` without `--rtp`.
fn rtcp_link(
    a: &StreamArgs,
    rtp: Option<penstock_core::rtp::Packetizer>,
    start_at: Option<penstock_core::time::Instant>,
    opened: &Option<(Opened, Option<Opened>)>,
) -> Result<Option<penstock_driver::rtcp::RtcpLink>> {
    Ok(match (rtp, start_at, opened) {
        (Some(rtp), Some(anchor), Some((_, Some(dst)))) => {
            use std::os::fd::AsFd;
            let (local, peer) = penstock_driver::rtcp::socket_addrs(dst.fd.as_fd())
                .context("the RTP socket's addresses")?;
            let session = penstock_core::rtp::SenderSession::new(
                rtp.ssrc,
                &format!("penstock-{}@{}", std::process::id(), local.ip()),
                u64::try_from(a.rtcp_interval.as_nanos()).unwrap_or(u64::MAX),
                random_u64(),
            );
            let link = penstock_driver::rtcp::RtcpLink::open(local, peer, rtp, anchor, session)
                .context("opening the RTCP socket")?;
            if let Some(path) = &a.sdp {
                std::fs::write(
                    path,
                    penstock_core::rtp::sdp_mp2t(peer, local.ip(), rtp.ssrc),
                )
                .with_context(|| format!("writing {}", path.display()))?;
            }
            eprintln!(
                "penstock: RTP to {peer} (SSRC {:#010x}, payload type 33, first sequence number {}), RTCP from {} to {}{}",
                rtp.ssrc,
                rtp.sequence_start,
                link.local_addr()?,
                link.peer(),
                if link.paired() {
                    ""
                } else {
                    " (the RTP port + 1 was taken)"
                }
            );
            Some(link)
        }
        _ => None,
    })
}

/// What the engine is asked to run: the flags' extent, unit, path and pacing, or the media's
/// unit plan.
fn stream_spec(
    a: &StreamArgs,
    source: Endpoint,
    target: Endpoint,
    pacing: Pacing,
    playback: Option<Playback>,
    rtp: Option<penstock_core::rtp::Packetizer>,
    start_at: Option<penstock_core::time::Instant>,
) -> Result<StreamSpec> {
    Ok(StreamSpec {
        extent: match &playback {
            Some(p) => Extent {
                offset: p.media_offset_bytes,
                length: Some(p.media_bytes),
            },
            None => Extent {
                offset: a.offset.unwrap_or(0),
                length: a.length,
            },
        },
        unit_bytes: usize::try_from(a.unit.unwrap_or(0)).context("unit")?,
        path: a.path,
        cache: a.cache,
        zero_copy: a.zero_copy,
        pacing: match playback {
            Some(p) => Pacing::Units(p.units.into()),
            None => pacing,
        },
        miss_after: a.miss_after,
        trace: a.trace.is_some(),
        class: a.class,
        buffers: a.reserve_buffers,
        send_timeout: (!a.send_timeout.is_zero()).then_some(a.send_timeout),
        late: a.late,
        rtp,
        start_at,
        ..StreamSpec::new(source, target)
    })
}

/// Opens the stream, shows its progress, feeds the metrics and turns the RTCP link until it
/// ends, then says what it did.
#[allow(clippy::too_many_arguments)]
fn run_stream(
    a: &StreamArgs,
    engine: &Engine,
    spec: StreamSpec,
    opened: Option<(Opened, Option<Opened>)>,
    metrics: Option<(std::sync::Arc<CliMetrics>, MetricsListener)>,
    mut link: Option<penstock_driver::rtcp::RtcpLink>,
    rtp: Option<penstock_core::rtp::Packetizer>,
) -> Result<Outcome> {
    let metrics_class = if a.class == Some(DiskClass::Rt) {
        "rt"
    } else {
        "bulk"
    };
    let mut metrics_seen = StreamSeen::default();
    let cpu0 = cpu_times(CpuWho::Process);
    let t0 = std::time::Instant::now();
    let handle = match opened {
        Some((src, Some(dst))) => engine.open_opened(spec, src, dst)?,
        _ => engine.open_with(spec, &mut |addr| eprintln!("penstock: listening on {addr}"))?,
    };
    if let Some(r) = handle.reservation() {
        eprintln!(
            "penstock: admitted rt: disk {:.2} ms/s, network {:.2} MB/s, {} buffers, cpu {:.2} ms/s; figures: {}",
            r.disk_ns_per_s as f64 / 1e6,
            r.net_bytes_per_s as f64 / 1e6,
            r.buffers,
            r.cpu_ns_per_s as f64 / 1e6,
            r.figures()
        );
    }
    if let Err(why) = &engine.info().registered
        && handle.path() == penstock_core::stream::DataPath::Uring
    {
        eprintln!("penstock: note: {why}");
    }
    let json_stdout = penstock_bench::out::json_on_stdout(a.json.as_deref());
    let bar = (std::io::stderr().is_terminal() && !json_stdout).then(|| {
        let b = match handle.expected_bytes() {
            Some(n) => indicatif::ProgressBar::new(n),
            None => indicatif::ProgressBar::new_spinner(),
        };
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let feed = |seen: &mut StreamSeen| {
        if let Some((m, _)) = &metrics {
            let c = handle.counters();
            m.feed_stream(
                metrics_class,
                &handle.lateness(),
                c.bytes_sent,
                c.units_sent,
                seen,
            );
        }
    };
    let rtp_counts = || {
        let c = handle.counters();
        penstock_driver::rtcp::RtpCounts {
            packets: c.units_sent,
            octets: c.bytes_sent,
        }
    };
    let turn_rtcp = |link: &mut Option<penstock_driver::rtcp::RtcpLink>| {
        let Some(l) = link else { return };
        if let Err(e) = l.turn(rtp_counts()) {
            eprintln!("penstock: note: RTCP stopped: {e}");
            *link = None;
            return;
        }
        if let Some((m, _)) = &metrics {
            m.feed_rtcp(l.stats());
        }
    };
    let result = loop {
        if let Some(r) = handle.wait_timeout(penstock_driver::rtcp::TURN_INTERVAL_MAX) {
            break r;
        }
        if let Some(b) = &bar {
            b.set_position(handle.counters().bytes_sent);
        }
        feed(&mut metrics_seen);
        turn_rtcp(&mut link);
    };
    feed(&mut metrics_seen);
    turn_rtcp(&mut link);
    if let Some(l) = &mut link
        && let Err(e) = l.finish(rtp_counts(), "end of stream")
    {
        eprintln!("penstock: note: RTCP BYE not sent: {e}");
    }
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let report = result?;
    let seconds = t0.elapsed().as_secs_f64();
    let cpu1 = cpu_times(CpuWho::Process);
    let out = Outcome {
        report,
        seconds,
        cpu_user_s: (cpu1.user_ns - cpu0.user_ns) as f64 / 1e9,
        cpu_sys_s: (cpu1.sys_ns - cpu0.sys_ns) as f64 / 1e9,
        rtp: rtp.zip(link.as_ref()).map(|(p, l)| RtpOutcome {
            packetizer: p,
            sender_reports: l.reports_sent(),
            receivers: l.stats().clone(),
        }),
    };
    Ok(out)
}

/// How long after the RTP stream is set up its unit 0 is due: the time to hand it to a worker,
/// so that the RTCP link's anchor is the stream's.
const RTP_START_DELAY_NS: u64 = 20_000_000;

/// 64 random bits from the standard library's per-process random keys (RFC 3550 wants SSRC,
/// first sequence number and timestamp random; no cryptographic strength is needed).
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

fn cpu_s_per_gb(o: &Outcome) -> f64 {
    if o.report.bytes == 0 {
        0.0
    } else {
        (o.cpu_user_s + o.cpu_sys_s) / (o.report.bytes as f64 / 1e9)
    }
}

/// Writes a trace as CSV (`penstock plot` reads it back).
pub fn write_trace(path: &std::path::Path, trace: &[TraceRecord]) -> std::io::Result<()> {
    use std::io::Write;
    let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(w, "{}", TraceRecord::CSV_HEADER)?;
    for r in trace {
        writeln!(w, "{}", r.to_csv_line())?;
    }
    w.flush()
}

fn lateness_line(l: &LatenessSummary) -> String {
    format!(
        "lateness p50 {:.1} µs, p99 {:.1} µs, p99.9 {:.1} µs, max {:.1} µs; {} of {} units missed (> {:.3} ms)",
        l.p50_ns as f64 / 1e3,
        l.p99_ns as f64 / 1e3,
        l.p999_ns as f64 / 1e3,
        l.max_ns as f64 / 1e3,
        l.misses,
        l.units,
        l.miss_after_ns as f64 / 1e6
    ) + &if l.skipped_units > 0 {
        format!(
            "; {} late units ({} bytes) skipped",
            l.skipped_units, l.skipped_bytes
        )
    } else {
        String::new()
    }
}

pub fn lateness_json(l: &LatenessSummary) -> serde_json::Value {
    serde_json::json!({
        "units": l.units, "misses": l.misses, "miss_after_ns": l.miss_after_ns,
        "p50_ns": l.p50_ns, "p99_ns": l.p99_ns, "p999_ns": l.p999_ns, "max_ns": l.max_ns,
        "skipped_units": l.skipped_units, "skipped_bytes": l.skipped_bytes,
    })
}

pub fn summary_line(o: &Outcome) -> String {
    let lateness = o
        .report
        .lateness
        .as_ref()
        .map(|l| format!("; {}", lateness_line(&l.summary())))
        .unwrap_or_default();
    format!(
        "penstock: {} bytes in {:.3} s, {:.1} MB/s, path {}{} (cache {}), CPU {:.3} s/GB (user {:.3} s, sys {:.3} s)",
        o.report.bytes,
        o.seconds,
        o.report.bytes as f64 / o.seconds.max(1e-9) / 1e6,
        executed_path(&o.report),
        match o.report.executed {
            Some(p) if p != o.report.planned => format!(" (planned {p})", p = o.report.planned),
            Some(_) => String::new(),
            None if o.report.bytes == 0 => String::new(),
            None => format!(" (planned {})", o.report.planned),
        },
        o.report.cache.name(),
        cpu_s_per_gb(o),
        o.cpu_user_s,
        o.cpu_sys_s
    ) + &lateness
        + &o.rtp.as_ref().map(rtcp_line).unwrap_or_default()
}

/// The path the stream executed: the one whose calls moved its bytes (`StreamReport::executed`);
/// "mixed" when calls of several paths did, the planned one when no byte moved.
pub fn executed_path(r: &StreamReport) -> &'static str {
    match r.executed {
        Some(p) => p.name(),
        None if r.bytes == 0 => r.planned.name(),
        None => "mixed",
    }
}

/// The bytes each mechanism moved (`StreamReport::moved`), for `--json`.
pub fn moved_json(m: &MovedBytes) -> serde_json::Value {
    let mut o: serde_json::Map<String, serde_json::Value> = m
        .by_name()
        .iter()
        .map(|(k, v)| (k.to_string(), (*v).into()))
        .collect();
    o.insert("through_user_space".into(), m.through_user_space().into());
    serde_json::Value::Object(o)
}

pub fn summary_json(o: &Outcome) -> serde_json::Value {
    serde_json::json!({
        "bytes": o.report.bytes,
        "units": o.report.units,
        "seconds": o.seconds,
        "mb_per_s": o.report.bytes as f64 / o.seconds.max(1e-9) / 1e6,
        "path": executed_path(&o.report),
        "path_planned": o.report.planned.name(),
        "path_executed": o.report.executed.map(|p| p.name()),
        "moved": moved_json(&o.report.moved),
        "cache": o.report.cache.name(),
        "cpu_user_s": o.cpu_user_s,
        "cpu_sys_s": o.cpu_sys_s,
        "cpu_s_per_gb": cpu_s_per_gb(o),
        "notes": o.report.notes,
        "lateness": o.report.lateness.as_ref().map(|l| lateness_json(&l.summary())),
        "rtp": o.rtp.as_ref().map(rtp_json),
    })
}

fn parse_cpu_sched(s: &str) -> Result<penstock_core::sched::policy::SchedAsk, String> {
    s.parse()
}
