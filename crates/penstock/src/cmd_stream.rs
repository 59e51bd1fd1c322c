//! `penstock stream SRC DST`.

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use penstock_core::endpoint::{Endpoint, Role};
use penstock_core::stream::{CachePolicy, Extent, PathChoice};
use penstock_core::units::parse_size;
use penstock_driver::clock::{CpuWho, cpu_times};
use penstock_driver::{Engine, EngineConfig, StreamReport, StreamSpec, ZeroCopy};

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
    /// Transfer unit (bytes per read/send; one datagram for UDP).
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
    /// Print one JSON object instead of the summary line.
    #[arg(long)]
    pub json: bool,
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
}

pub fn run(a: StreamArgs) -> Result<()> {
    let source = Endpoint::parse(&a.src, Role::Source)?;
    let target = Endpoint::parse(&a.dst, Role::Target)?;
    let cfg = EngineConfig {
        workers: 1,
        pool_buffers: a.buffers,
        buffer_bytes: usize::try_from(a.buffer_size).context("buffer size")?,
        stream_depth: 4.min(a.buffers.max(1)),
        ..EngineConfig::default()
    };
    let engine = Engine::new(cfg)?;
    if let Err(why) = &engine.info().uring {
        eprintln!("penstock: note: {why}");
    }
    let spec = StreamSpec {
        source,
        target,
        extent: Extent {
            offset: a.offset.unwrap_or(0),
            length: a.length,
        },
        unit_bytes: usize::try_from(a.unit.unwrap_or(0)).context("unit")?,
        path: a.path,
        cache: a.cache,
        zero_copy: a.zero_copy,
    };
    let cpu0 = cpu_times(CpuWho::Process);
    let t0 = std::time::Instant::now();
    let handle = engine.open_with(spec, &mut |addr| eprintln!("penstock: listening on {addr}"))?;
    if let Err(why) = &engine.info().registered
        && handle.path() == penstock_core::stream::DataPath::Uring
    {
        eprintln!("penstock: note: {why}");
    }
    let bar = (std::io::stderr().is_terminal() && !a.json).then(|| {
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
    let result = loop {
        if let Some(r) = handle.wait_timeout(Duration::from_millis(100)) {
            break r;
        }
        if let Some(b) = &bar {
            b.set_position(handle.counters().bytes_sent);
        }
    };
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
    };
    for n in &out.report.notes {
        eprintln!("penstock: note: {n}");
    }
    if a.json {
        println!("{}", summary_json(&out));
    } else {
        eprintln!("{}", summary_line(&out));
    }
    Ok(())
}

fn cpu_s_per_gb(o: &Outcome) -> f64 {
    if o.report.bytes == 0 {
        0.0
    } else {
        (o.cpu_user_s + o.cpu_sys_s) / (o.report.bytes as f64 / 1e9)
    }
}

pub fn summary_line(o: &Outcome) -> String {
    format!(
        "penstock: {} bytes in {:.3} s, {:.1} MB/s, path {} (cache {}), CPU {:.3} s/GB (user {:.3} s, sys {:.3} s)",
        o.report.bytes,
        o.seconds,
        o.report.bytes as f64 / o.seconds.max(1e-9) / 1e6,
        o.report.path,
        o.report.cache.name(),
        cpu_s_per_gb(o),
        o.cpu_user_s,
        o.cpu_sys_s
    )
}

pub fn summary_json(o: &Outcome) -> serde_json::Value {
    serde_json::json!({
        "bytes": o.report.bytes,
        "units": o.report.units,
        "seconds": o.seconds,
        "mb_per_s": o.report.bytes as f64 / o.seconds.max(1e-9) / 1e6,
        "path": o.report.path.name(),
        "cache": o.report.cache.name(),
        "cpu_user_s": o.cpu_user_s,
        "cpu_sys_s": o.cpu_sys_s,
        "cpu_s_per_gb": cpu_s_per_gb(o),
        "notes": o.report.notes,
    })
}
