//! `penstock bench paths`: MARS Table 1 and Cues' comparison, re-done on today's kernel.
//!
//! A file goes to a TCP receiver on loopback through each data path. The receiver is a child
//! process (`penstock sink`), so the CPU time measured here (getrusage of this process: the
//! engine's worker, io-wq threads included) is the sender's alone. Each repetition runs every
//! path once, in turn, so that machine noise hits all of them alike; the table shows medians.
//!
//! Baselines measured in the same run: `copy` (read+write through a user buffer, the papers'
//! user-driven transfer), a bare blocking sendfile loop (the physical limit of this machine's
//! loopback for a file), and for cold runs the device's O_DIRECT sequential read rate.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use penstock_core::endpoint::{Endpoint, Host};
use penstock_core::stream::{CachePolicy, DataPath, PathChoice};
use penstock_core::units::parse_size;
use penstock_driver::clock::{CpuWho, cpu_times};
use penstock_driver::sys::AlignedBuffer;
use penstock_driver::{Engine, EngineConfig, StreamSpec};

use crate::stats::median;

#[derive(Args, Debug)]
pub struct PathsArgs {
    /// File sizes, comma-separated.
    #[arg(long, default_value = "40MB,120MB,240MB,360MB", value_delimiter = ',', value_parser = parse_size)]
    pub sizes: Vec<u64>,
    /// Repetitions per cell (medians are reported).
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// A short run: one 40 MB file, 3 repetitions.
    #[arg(long)]
    pub quick: bool,
    /// Skip the cold-cache runs.
    #[arg(long)]
    pub no_cold: bool,
    /// Directory for the test files (on the disk to measure).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Transfer unit.
    #[arg(long, default_value = "4MiB", value_parser = parse_size)]
    pub unit: u64,
    /// Write all samples and medians as JSON here.
    /// A bare `--json` writes it on stdout (the table then goes to stderr).
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
    /// Disk reads a stream keeps in flight on the uring path, for every device. Default: the
    /// engine's choice for the file's device — the depth `penstock calibrate` measured there,
    /// else self-calibration's (measured once, before anything is timed, and cached in
    /// ~/.cache/penstock), else the engine's default (4). Disks differ: one VM's served one
    /// request at a time, another's read fastest with 8 in flight.
    #[arg(long)]
    pub depth: Option<usize>,
    /// Let the scheduler place sender and receiver (default: the sender on the first allowed
    /// CPU, the receiver on the last, when there are two or more).
    #[arg(long)]
    pub no_pin: bool,
    /// The receiver's SO_RCVLOWAT (0: none).
    #[arg(long, default_value = "256KiB", value_parser = parse_size)]
    pub rcvlowat: u64,
}

/// One row of the table: a path (or baseline) in a cache state.
#[derive(Debug, Clone)]
struct Cell {
    size: u64,
    cold: bool,
    name: String,
    mb_per_s: Vec<f64>,
    cpu_s_per_gb: Vec<f64>,
}

/// Starts `penstock sink 127.0.0.1:0` with `extra` options and reads the port from its
/// `listening HOST:PORT` line; its later lines are the caller's to read.
pub(crate) fn spawn_sink(extra: &[String]) -> Result<(Child, BufReader<ChildStdout>, u16)> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(["sink", "127.0.0.1:0"])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the receiver")?;
    let mut out = BufReader::new(child.stdout.take().context("receiver stdout")?);
    let mut line = String::new();
    out.read_line(&mut line)?;
    let port = line
        .trim()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .with_context(|| format!("receiver said {line:?}"))?;
    Ok((child, out, port))
}

pub(crate) struct Sink {
    child: Child,
    out: BufReader<ChildStdout>,
    pub(crate) port: u16,
}

impl Sink {
    pub(crate) fn start() -> Result<Sink> {
        Sink::start_with(&[])
    }

    /// A receiver with extra `penstock sink` options (`--cpu`, `--rcvlowat`).
    pub(crate) fn start_with(extra: &[String]) -> Result<Sink> {
        let (child, out, port) = spawn_sink(extra)?;
        Ok(Sink { child, out, port })
    }

    /// Bytes the receiver got on its last connection.
    pub(crate) fn received(&mut self) -> Result<u64> {
        let mut line = String::new();
        self.out.read_line(&mut line)?;
        let n = line
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("receiver said {line:?}"))?;
        Ok(n)
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn make_file(path: &Path, size: u64) -> Result<()> {
    if std::fs::metadata(path).is_ok_and(|m| m.len() == size) {
        return Ok(());
    }
    let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let mut block = vec![0u8; 1 << 20];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for b in block.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let mut left = size;
    let mut i = 0u64;
    while left > 0 {
        block[..8].copy_from_slice(&i.to_le_bytes());
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n])?;
        left -= n as u64;
        i += 1;
    }
    f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    Ok(())
}

/// Evicts the file's pages from the page cache (clean pages: always allowed, no root needed).
fn evict(path: &Path) -> Result<()> {
    let f = std::fs::File::open(path)?;
    rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed)?;
    Ok(())
}

fn warm(path: &Path) -> Result<()> {
    let mut f = std::fs::File::open(path)?;
    std::io::copy(&mut f, &mut std::io::sink())?;
    Ok(())
}

struct Sample {
    mb_per_s: f64,
    cpu_s_per_gb: f64,
}

fn measure(bytes: u64, f: impl FnOnce() -> Result<()>) -> Result<Sample> {
    let c0 = cpu_times(CpuWho::Process);
    let t0 = Instant::now();
    f()?;
    let secs = t0.elapsed().as_secs_f64();
    let c1 = cpu_times(CpuWho::Process);
    let cpu = (c1.user_ns + c1.sys_ns - c0.user_ns - c0.sys_ns) as f64 / 1e9;
    Ok(Sample {
        mb_per_s: bytes as f64 / secs / 1e6,
        cpu_s_per_gb: cpu / (bytes as f64 / 1e9),
    })
}

fn run_engine(
    engine: &Engine,
    file: &Path,
    port: u16,
    path: DataPath,
    cache: CachePolicy,
    unit: usize,
) -> Result<u64> {
    let spec = StreamSpec {
        unit_bytes: unit,
        path: PathChoice::Fixed(path),
        cache,
        ..StreamSpec::new(
            Endpoint::File {
                path: file.to_path_buf(),
            },
            Endpoint::TcpConnect {
                host: Host::Ip([127, 0, 0, 1].into()),
                port,
                local_port: None,
            },
        )
    };
    let h = engine.open(spec)?;
    let in_flight_max = h.read_depth().map_or(0, |d| d.in_flight_max);
    let report = h.wait()?;
    if report.notes.iter().any(|n| n.contains("O_DIRECT refused")) {
        bail!("{}", report.notes.join("; "));
    }
    Ok(in_flight_max)
}

/// The bare baseline: sendfile of the whole file, unit by unit, on a non-blocking socket with
/// poll(2) when it is full (a blocking sendfile measured half as fast here: each sleep on a
/// full socket buffer waits for the receiver's window update).
fn bare_sendfile(file: &Path, port: u16, unit: usize) -> Result<()> {
    use rustix::event::{PollFd, PollFlags, poll};
    let f = std::fs::File::open(file)?;
    let size = f.metadata()?.len();
    let s = TcpStream::connect(("127.0.0.1", port))?;
    // The engine's TCP sockets are TCP_NODELAY; so is this one.
    s.set_nodelay(true)?;
    s.set_nonblocking(true)?;
    let mut off = 0u64;
    while off < size {
        match rustix::fs::sendfile(s.as_fd(), f.as_fd(), Some(&mut off), unit) {
            Ok(0) => bail!("sendfile returned 0 at {off} of {size}"),
            Ok(_) => {}
            Err(rustix::io::Errno::AGAIN) => {
                let mut fds = [PollFd::new(&s, PollFlags::OUT)];
                poll(&mut fds, None)?;
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The device's O_DIRECT sequential read rate: one aligned buffer, pread in a loop.
fn odirect_read(file: &Path, unit: usize) -> Result<()> {
    let fd = penstock_driver::open::reopen_direct(file)
        .context("O_DIRECT refused on this file system")?;
    let mut buf = AlignedBuffer::new(unit)?;
    let mut off = 0u64;
    loop {
        let n = rustix::io::pread(&fd, buf.bytes_mut(), off)?;
        if n == 0 {
            break;
        }
        off += n as u64;
    }
    Ok(())
}

/// The engine's read depth settings: `--depth` for every device, else the engine's own
/// choice per device — the calibration file's depth for its device (`penstock calibrate`),
/// else self-calibration (cached per device in `~/.cache/penstock`), else its default.
fn read_depth_config(given: Option<usize>) -> penstock_driver::ReadDepthConfig {
    use penstock_driver::calibration::{Calibration, default_path};
    penstock_driver::ReadDepthConfig {
        fixed: given.map(|d| d.max(1)),
        calibrated: Calibration::load(&default_path())
            .map(|c| c.read_depths())
            .unwrap_or_default(),
        ..Default::default()
    }
}

pub fn run(mut a: PathsArgs) -> Result<()> {
    if a.quick {
        a.sizes = vec![40_000_000];
        a.reps = a.reps.min(3);
    }
    if a.reps == 0 {
        bail!("--reps must be at least 1");
    }
    let unit = usize::try_from(a.unit)?;
    let tmp;
    let dir = match &a.dir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile::Builder::new()
                .prefix("penstock-bench-")
                .tempdir_in(std::env::temp_dir())?;
            tmp.path().to_path_buf()
        }
    };
    // Placement. On loopback the receiver's TCP processing and every wakeup of the receiver
    // run inside the sender's send calls; left to itself the scheduler's wake-affine placement
    // pulls the receiver onto the sender's CPU now and then, and the same command measured
    // 0.13 to 0.50 s/GB of sender CPU. Pinned apart, and with the receiver woken per 256 KiB
    // rather than per 64 KiB segment, the sender pays for what a remote receiver would cost it.
    let cpus = penstock_driver::clock::allowed_cpus();
    let mut sink_args: Vec<String> = Vec::new();
    let placement = match (a.no_pin, cpus.first(), cpus.last()) {
        (false, Some(&first), Some(&last)) if first != last => {
            penstock_driver::clock::pin_to_cpu(first).context("pinning the sender")?;
            sink_args.extend(["--cpu".to_string(), last.to_string()]);
            format!("sender on CPU {first}, receiver on CPU {last}")
        }
        _ => "sender and receiver placed by the scheduler".to_string(),
    };
    if a.rcvlowat > 0 {
        sink_args.extend(["--rcvlowat".to_string(), a.rcvlowat.to_string()]);
    }
    let engine = Engine::new(EngineConfig {
        workers: 1,
        pool_buffers: 32,
        buffer_bytes: unit.div_ceil(4096) * 4096,
        read_depth: read_depth_config(a.depth),
        self_calibration: penstock_driver::calibration::SelfCalibration {
            enabled: true,
            cache_dir: penstock_driver::calibration::default_cache_dir(),
            ..Default::default()
        },
        ..EngineConfig::default()
    })?;
    let uring = engine.info().uring.is_ok();
    if let Err(why) = &engine.info().uring {
        eprintln!("penstock: note: {why}");
    }
    let mut sink = Sink::start_with(&sink_args)?;
    let mut cells: Vec<Cell> = Vec::new();
    // The uring path's read depth the engine chose (and from where), and the most reads a
    // uring stream had in flight (from its counters).
    let mut depth: Option<(usize, String)> = None;
    let mut in_flight_max = 0u64;
    let hot_paths: Vec<(String, Option<(DataPath, CachePolicy)>)> = {
        let mut v = vec![
            (
                "copy".to_string(),
                Some((DataPath::Copy, CachePolicy::Keep)),
            ),
            (
                "sendfile".to_string(),
                Some((DataPath::Sendfile, CachePolicy::Keep)),
            ),
            (
                "splice".to_string(),
                Some((DataPath::Splice, CachePolicy::Keep)),
            ),
        ];
        if uring {
            // The uring path: O_DIRECT reads into registered buffers. Its `keep`
            // variant reads through the page cache (an in-kernel copy into the buffer).
            v.push((
                "uring".to_string(),
                Some((DataPath::Uring, CachePolicy::Bypass)),
            ));
            v.push((
                "uring keep".to_string(),
                Some((DataPath::Uring, CachePolicy::Keep)),
            ));
        }
        v.push(("bare sendfile loop".to_string(), None));
        v
    };
    for &size in &a.sizes {
        let file = dir.join(format!("bench-{size}.bin"));
        eprintln!(
            "penstock: bench paths: preparing {} ({size} bytes)",
            file.display()
        );
        make_file(&file, size)?;
        if depth.is_none() {
            // The engine's choice for the file's device, asked (and self-calibrated, when
            // nothing is known of it) before anything is timed.
            let f = std::fs::File::open(&file)?;
            let (d, from) =
                engine.device_read_depth(penstock_driver::device::device_of(&f), f.as_fd());
            eprintln!("penstock bench paths: the engine's uring read depth here: {d} ({from})");
            depth = Some((d, from.to_string()));
        }
        for cold in [false, true] {
            if cold && a.no_cold {
                continue;
            }
            let mut rows: Vec<(String, Option<(DataPath, CachePolicy)>)> = hot_paths.clone();
            if cold {
                rows.retain(|(n, _)| n != "bare sendfile loop");
                rows.push(("O_DIRECT read (device rate)".to_string(), None));
            } else {
                warm(&file)?;
            }
            let first = cells.len();
            for (name, _) in &rows {
                cells.push(Cell {
                    size,
                    cold,
                    name: name.clone(),
                    mb_per_s: vec![],
                    cpu_s_per_gb: vec![],
                });
            }
            for rep in 0..a.reps {
                for (i, (name, how)) in rows.iter().enumerate() {
                    if cold {
                        evict(&file)?;
                    }
                    let s = match how {
                        Some((path, cache)) => {
                            let s = measure(size, || {
                                let m = run_engine(&engine, &file, sink.port, *path, *cache, unit)?;
                                in_flight_max = in_flight_max.max(m);
                                Ok(())
                            })?;
                            check_received(&mut sink, size, name)?;
                            s
                        }
                        None if name == "bare sendfile loop" => {
                            let s = measure(size, || bare_sendfile(&file, sink.port, unit))?;
                            check_received(&mut sink, size, name)?;
                            s
                        }
                        None => measure(size, || odirect_read(&file, unit))?,
                    };
                    eprintln!(
                        "  {size} {} rep {rep}: {name:<28} {:8.1} MB/s {:6.3} s/GB",
                        if cold { "cold" } else { "hot " },
                        s.mb_per_s,
                        s.cpu_s_per_gb
                    );
                    cells[first + i].mb_per_s.push(s.mb_per_s);
                    cells[first + i].cpu_s_per_gb.push(s.cpu_s_per_gb);
                }
            }
        }
        if a.dir.is_none() {
            let _ = std::fs::remove_file(&file);
        }
    }
    let (depth, depth_from) = match (a.depth, depth) {
        (Some(d), _) => (d.max(1), "--depth".to_string()),
        (None, Some(d)) => d,
        (None, None) => (0, "no file streamed".to_string()),
    };
    let setup = format!(
        "{placement}; receiver SO_RCVLOWAT {}; unit {unit} bytes; uring read depth {depth} \
         ({depth_from}), at most {in_flight_max} reads in flight",
        if a.rcvlowat > 0 {
            a.rcvlowat.to_string()
        } else {
            "none".to_string()
        }
    );
    let table = render(&cells, a.reps, &setup);
    let mut h = crate::out::human(a.json.as_deref());
    writeln!(h, "{table}")?;
    let verdicts = verdicts(&cells);
    for v in &verdicts {
        writeln!(h, "{v}")?;
    }
    if let Some(p) = &a.json {
        let rows: Vec<serde_json::Value> = cells
            .iter()
            .map(|c| {
                serde_json::json!({
                    "size": c.size, "cache": if c.cold { "cold" } else { "hot" }, "path": c.name,
                    "mb_per_s": c.mb_per_s, "cpu_s_per_gb": c.cpu_s_per_gb,
                    "mb_per_s_median": median(&c.mb_per_s), "cpu_s_per_gb_median": median(&c.cpu_s_per_gb),
                })
            })
            .collect();
        let doc = serde_json::json!({ "bench": "paths", "reps": a.reps, "unit": unit, "setup": setup,
            "depth": depth, "depth_from": depth_from, "reads_in_flight_max": in_flight_max, "rows": rows, "verdicts": verdicts });
        crate::out::write_json(p, &doc)?;
    }
    Ok(())
}

fn check_received(sink: &mut Sink, size: u64, name: &str) -> Result<()> {
    let got = sink.received()?;
    if got != size {
        bail!("{name}: the receiver got {got} bytes of {size}");
    }
    Ok(())
}

fn render(cells: &[Cell], reps: usize, setup: &str) -> String {
    let mut s = format!(
        "\nbench paths: file -> TCP loopback receiver (separate process), medians of {reps} repetitions\n\
         {setup}\n\
         {:>12} {:<5} {:<28} {:>10} {:>10} {:>12} {:>12}\n",
        "size", "cache", "path", "MB/s", "CPU s/GB", "MB/s / copy", "CPU / copy"
    );
    for c in cells {
        let copy = cells
            .iter()
            .find(|x| x.size == c.size && x.cold == c.cold && x.name == "copy");
        let (rt, rc) = match copy {
            Some(k) => (
                median(&c.mb_per_s) / median(&k.mb_per_s),
                median(&c.cpu_s_per_gb) / median(&k.cpu_s_per_gb),
            ),
            None => (f64::NAN, f64::NAN),
        };
        s.push_str(&format!(
            "{:>12} {:<5} {:<28} {:>10.1} {:>10.3} {:>12.2} {:>12.2}\n",
            c.size,
            if c.cold { "cold" } else { "hot" },
            c.name,
            median(&c.mb_per_s),
            median(&c.cpu_s_per_gb),
            rt,
            rc
        ));
    }
    s
}

/// The acceptance criteria, checked against this run's medians.
fn verdicts(cells: &[Cell]) -> Vec<String> {
    let mut out = Vec::new();
    let find = |size: u64, cold: bool, name: &str| {
        cells
            .iter()
            .find(|c| c.size == size && c.cold == cold && c.name == name)
    };
    let mut sizes: Vec<u64> = cells.iter().map(|c| c.size).collect();
    sizes.dedup();
    for size in sizes {
        if let Some(copy) = find(size, false, "copy") {
            for p in ["sendfile", "splice", "uring"] {
                if let Some(c) = find(size, false, p) {
                    let cpu = median(&c.cpu_s_per_gb) / median(&copy.cpu_s_per_gb);
                    let thr = median(&c.mb_per_s) / median(&copy.mb_per_s);
                    let ok = cpu <= 0.7 && thr >= 1.0;
                    out.push(format!(
                        "{} hot {size}: {p} CPU/GB = {cpu:.2}x copy (<= 0.7), throughput = {thr:.2}x copy (>= 1.0)",
                        if ok { "PASS" } else { "FAIL" }
                    ));
                }
            }
            if let Some(bare) = find(size, false, "bare sendfile loop") {
                let best = ["copy", "sendfile", "splice", "uring", "uring keep"]
                    .iter()
                    .filter_map(|p| find(size, false, p))
                    .map(|c| median(&c.mb_per_s))
                    .fold(0.0, f64::max);
                let r = best / median(&bare.mb_per_s);
                out.push(format!(
                    "{} hot {size}: best path = {r:.2}x the bare sendfile loop (>= 0.90)",
                    if r >= 0.9 { "PASS" } else { "FAIL" }
                ));
            }
        }
        if let (Some(u), Some(d)) = (
            find(size, true, "uring"),
            find(size, true, "O_DIRECT read (device rate)"),
        ) {
            let r = median(&u.mb_per_s) / median(&d.mb_per_s);
            out.push(format!(
                "{} cold {size}: uring (O_DIRECT) = {r:.2}x the device's O_DIRECT read rate (>= 0.90)",
                if r >= 0.9 { "PASS" } else { "FAIL" }
            ));
        }
    }
    out
}
