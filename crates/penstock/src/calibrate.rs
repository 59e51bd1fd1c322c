//! `penstock calibrate [PATH]`: measure the device, write the figures the engine reads.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use penstock_core::admission::{AdmissionConfig, Capacity};
use penstock_core::units::{parse_duration, parse_rate, parse_size};
use penstock_driver::calibration::{CalibrateOptions, Calibration, calibrate, default_path};

#[derive(Args, Debug)]
pub struct CalibrateArgs {
    /// A directory on the disk to measure (a test file is written there and removed), or a
    /// file / block device to read in place.
    #[arg(default_value = ".")]
    pub path: PathBuf,
    /// Where to write the figures (default: $PENSTOCK_CALIBRATION, else
    /// ~/.config/penstock/calibration.toml).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Size of the test file written in a directory.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    pub size: u64,
    /// Time per random-read measurement.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub time: Duration,
    /// A short run: 256 MiB, 0.5 s per measurement.
    #[arg(long)]
    pub quick: bool,
}

pub fn run(a: CalibrateArgs) -> Result<()> {
    let opts = if a.quick {
        CalibrateOptions {
            file_bytes: 256 << 20,
            random_time: Duration::from_millis(500),
        }
    } else {
        CalibrateOptions {
            file_bytes: a.size,
            random_time: a.time,
        }
    };
    eprintln!(
        "penstock calibrate: measuring {} (O_DIRECT through io_uring)…",
        a.path.display()
    );
    let mut c = calibrate(&a.path, &opts)?;
    // What admission charges per send and per byte is the engine's whole cost of paced
    // units (timer, dispatch, completion, the kernel's send and loopback delivery), not a
    // bare send(2): measured by running paced streams at the rate admission would fill.
    match penstock_driver::send_cost::measure_engine_send_cost(
        opts.random_time.max(Duration::from_millis(500)),
        256 << 20,
    ) {
        Ok((cost, _)) => c.set_send_cost(cost),
        Err(e) => eprintln!("penstock calibrate: note: the engine's send cost not measured: {e}"),
    }
    println!(
        "sequential read, 1 MiB requests: {:.1} MB/s at depth 1, {:.1} MB/s at depth 4",
        c.seq_read_bytes_per_s_depth1 as f64 / 1e6,
        c.seq_read_bytes_per_s_depth4 as f64 / 1e6
    );
    for f in &c.seq_read_by_depth {
        println!(
            "sequential read, 1 MiB requests, depth {:>2}: {:.1} MB/s",
            f.depth,
            f.bytes_per_s as f64 / 1e6
        );
    }
    if let Some(d) = c.read_depth {
        println!(
            "read depth for streams on this device: {d} (the shallowest within 5% of the best)"
        );
    }
    for r in &c.random {
        println!(
            "random read, {:>6} B requests, depth {:>2}: {:>8} IOPS",
            r.request_bytes, r.depth, r.iops
        );
    }
    if let (Some(ns), Some(ps)) = (c.send_ns, c.send_byte_ps) {
        println!(
            "the engine's CPU for a paced send: {ns} ns + {ps} ps a byte ({} ns a 1316-byte datagram)",
            ns + 1316 * ps / 1000
        );
    }
    if let Some(ps) = c.send_burst_byte_ps {
        println!(
            "the engine's CPU a byte when 1 MiB units fall due at once: {ps} ps ({:.3} ms a unit)",
            (ps as f64 * (1u64 << 20) as f64) / 1e9
        );
    }
    let out = a.out.unwrap_or_else(default_path);
    c.save(&out)?;
    println!("wrote {}", out.display());
    Ok(())
}

/// The read depths of the calibration file (`--calibration`, else the default path) for the
/// engine (`EngineConfig::read_depth`): its device's, when it still exists; none without a
/// file (the engine then self-calibrates the device, or uses its default depth).
pub fn read_depths(calibration: Option<&Path>) -> Vec<(u64, usize)> {
    let path = calibration.map(PathBuf::from).unwrap_or_else(default_path);
    Calibration::load(&path)
        .map(|c| c.read_depths())
        .unwrap_or_default()
}

/// Without a calibration file: admission's CPU figures from the engine's send costs, measured
/// once and cached under `cache_dir` (as `penstock serve` does; docs/io-scheduler.md, "CPU").
/// A measurement that fails leaves the defaults, with a note.
pub fn charge_self_calibrated_send_cost(admission: &mut AdmissionConfig, cache_dir: Option<&Path>) {
    use penstock_driver::send_cost::{
        SEND_COST_TIME, SendCostKept, capacity_with_send_cost, send_cost,
    };
    match send_cost(cache_dir, SEND_COST_TIME) {
        Ok(r) => {
            admission.capacity =
                capacity_with_send_cost(admission.capacity, &r.charged(), SendCostKept::default());
        }
        Err(e) => eprintln!(
            "penstock: note: the CPU cost of a send could not be measured ({e}): admission charges the defaults"
        ),
    }
}

/// The admission configuration for a CLI run: the calibration file's capacity, or the
/// conservative default with a note (said once by the caller).
pub fn admission_config(
    calibration: Option<&std::path::Path>,
    net_rate: Option<&str>,
    buffer_count: u32,
    buffer_bytes: u64,
    bulk_share_percent: u8,
) -> Result<(AdmissionConfig, Option<String>)> {
    let net_bytes_per_s = match net_rate {
        Some(r) => {
            let (num, den) = parse_rate(r)?.bytes_per_second(1);
            u64::try_from(num / den.max(1))?
        }
        None => 1_250_000_000, // 10 Gbit/s
    };
    let path = calibration.map(PathBuf::from).unwrap_or_else(default_path);
    let (capacity, note) = match Calibration::load(&path) {
        Ok(c) => (
            c.capacity(net_bytes_per_s, buffer_count, buffer_bytes),
            None,
        ),
        Err(e) if calibration.is_some() => return Err(e.into()),
        Err(_) => (
            Capacity {
                net_bytes_per_s,
                buffer_count,
                buffer_bytes,
                ..Capacity::CONSERVATIVE
            },
            Some(format!(
                "no calibration at {} (run `penstock calibrate` for the full measurement): the \
                 source's device is self-calibrated on first use (under 3 s, cached), else \
                 admission uses conservative defaults (50 MB/s, 75 IOPS)",
                path.display()
            )),
        ),
    };
    Ok((
        AdmissionConfig {
            capacity,
            bulk_share_percent,
            streams_max: 4096,
            rt_latency_ns: 0,
            lateness_tolerance_ns: penstock_core::admission::LATENESS_TOLERANCE_NS_DEFAULT,
        },
        note,
    ))
}
