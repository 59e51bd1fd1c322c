//! `penstock bench periodic`: Roadrunner's experiment, and beyond it.
//!
//! N periodic UDP streams — 1 KiB every 33.333 ms by default — go from files to a receiver
//! on loopback (a child process, `penstock sink --udp`) that checks every stream's sequence
//! numbers and counts losses. The same load is driven, in the same run, by:
//! - penstock: the engine's EDF dispatcher (one per worker), absolute timers, read-ahead;
//! - `usleep loop`: a thread per stream doing send + sleep(period) — the paper's BSD loop;
//! - `nanosleep abs`: a thread per stream sleeping with clock_nanosleep(TIMER_ABSTIME) to each
//!   period's start (timer slack 1 ns), then sending.
//!
//! Each is repeated with no load, with both cores loaded by CPU hogs, and with a disk-read hog.
//! Lateness is measured, as Roadrunner did, from the start of each unit's period to the end
//! of its send. Stream i's periods start at t0 + i·period/N for every sender, so all face the
//! same phases.

use penstock_core::sched::policy::SchedAsk;
use std::io::{BufRead, BufReader, Write};
use std::net::UdpSocket;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use penstock_core::endpoint::{Endpoint, Host};
use penstock_core::lateness::{LatenessStats, TraceRecord};
use penstock_core::stream::plan::{Pacing, plan_schedule};
use penstock_core::stream::{Extent, PathChoice};
use penstock_core::time::Instant;
use penstock_core::units::{parse_duration, parse_size};
use penstock_driver::clock::{self, CpuWho, cpu_times};
use penstock_driver::{Engine, EngineConfig, StreamSpec, TimerMode, ZeroCopy};

#[derive(Args, Debug)]
pub struct PeriodicArgs {
    /// Stream counts to run, comma-separated.
    #[arg(long, default_value = "1,100,1000,10000", value_delimiter = ',')]
    pub streams: Vec<usize>,
    /// How long each run sends.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Period of every stream.
    #[arg(long, default_value = "33.333ms", value_parser = parse_duration)]
    pub period: Duration,
    /// Unit (datagram) size.
    #[arg(long, default_value = "1KiB", value_parser = parse_size)]
    pub unit: u64,
    /// Loads to run under: none, cpu (both cores spun by hogs), disk (an O_DIRECT read hog).
    #[arg(long, default_value = "none,cpu,disk", value_delimiter = ',')]
    pub loads: Vec<String>,
    /// Senders: penstock (as `penstock serve` and `penstock stream` start: `sched = auto`,
    /// timed workers under SCHED_DEADLINE where permitted), penstock-rt (`--realtime`:
    /// SCHED_FIFO and mlockall), penstock-other (no timed workers: ordinary threads), usleep,
    /// nanosleep.
    #[arg(
        long,
        default_value = "penstock,penstock-rt,penstock-other,usleep,nanosleep",
        value_delimiter = ','
    )]
    pub senders: Vec<String>,
    /// Thread-per-stream baselines run only up to this many streams.
    #[arg(long, default_value_t = 1000)]
    pub threads_max: usize,
    /// Engine workers (default: one per core but one, left to the receiver).
    #[arg(long)]
    pub workers: Option<usize>,
    /// The engine's data path: auto (the uring path, reading ahead into the pool), copy
    /// (pread + send per unit), or another of `penstock stream --path`.
    #[arg(long, default_value = "auto")]
    pub path: PathChoice,
    /// Engine timer: uring or nanosleep.
    #[arg(long, default_value = "uring")]
    pub timer: String,
    /// The receiver polls its socket without sleeping (a core busy), so that no sender pays
    /// loopback's receiver wake-up per datagram (a remote receiver costs a sender nothing).
    #[arg(long)]
    pub receiver_poll: bool,
    /// Engine workers spin (instead of sleeping) when the next deadline is this close
    /// (0: never; at most 1ms).
    #[arg(long, value_parser = penstock_core::units::parse_duration, default_value = "0s")]
    pub spin: Duration,
    /// A short run: 1, 100 and 1000 streams for 5 s, no disk load.
    #[arg(long)]
    pub quick: bool,
    /// Write the table and all figures as JSON here.
    /// A bare `--json` writes it on stdout (the table then goes to stderr).
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
    /// Write traces (CSV, for `penstock plot`) of the 1-stream runs into this directory.
    #[arg(long)]
    pub traces: Option<PathBuf>,
}

struct Row {
    streams: usize,
    load: String,
    sender: String,
    stats: LatenessStats,
    received: u64,
    lost: u64,
    expected: u64,
    cpu_percent: f64,
    note: String,
    /// Source descriptors the engine held with every stream open (its open-file table: one
    /// per file, whatever the stream count); `None` for thread-per-stream senders.
    source_files: Option<u64>,
    /// The engine's workers: time runnable but not running (waiting for a CPU), % of the run.
    worker_wait_percent: Option<f64>,
}

/// The sequence-stamped source: unit k starts with k as u64 LE.
pub(crate) fn make_source(path: &Path, units: u64, unit: u64) -> Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut block = vec![0xA5u8; unit as usize];
    for k in 0..units {
        block[..8].copy_from_slice(&k.to_le_bytes());
        f.write_all(&block)?;
    }
    f.flush()?;
    Ok(())
}

pub(crate) struct Receiver {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
    pub(crate) port: u16,
}

impl Receiver {
    pub(crate) fn start(expect: u64, poll: bool) -> Result<Receiver> {
        let mut args = vec![
            "--udp".to_string(),
            "--idle".into(),
            "1500ms".into(),
            "--expect".into(),
            expect.to_string(),
        ];
        if poll {
            args.push("--poll".into());
        }
        let (child, out, port) = crate::paths::spawn_sink(&args)?;
        Ok(Receiver { child, out, port })
    }

    /// Stops a receiver whose run failed: it would wait for datagrams that never come.
    pub(crate) fn abandon(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub(crate) fn finish(mut self) -> Result<serde_json::Value> {
        let mut line = String::new();
        self.out.read_line(&mut line)?;
        let _ = self.child.wait();
        serde_json::from_str(line.trim()).with_context(|| format!("receiver said {line:?}"))
    }
}

pub(crate) struct Hogs(Vec<Child>);

impl Hogs {
    fn start(load: &str, disk_file: &Path) -> Result<Hogs> {
        let exe = std::env::current_exe()?;
        let mut v = Vec::new();
        match load {
            "none" => {}
            "cpu" => {
                let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
                for _ in 0..cores {
                    v.push(Command::new(&exe).args(["hog", "cpu"]).spawn()?);
                }
            }
            "disk" => v.push(
                Command::new(&exe)
                    .args(["hog", "disk"])
                    .arg(disk_file)
                    .spawn()?,
            ),
            other => bail!("unknown load {other:?}: expected none, cpu or disk"),
        }
        std::thread::sleep(Duration::from_millis(300));
        Ok(Hogs(v))
    }
}

/// Starts the background load `load` (none, cpu, disk) for a benchmark.
pub(crate) fn start_hogs(load: &str, disk_file: &Path) -> Result<Hogs> {
    Hogs::start(load, disk_file)
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Raises net.core.rmem_max so the receiver's 64 MiB buffer is granted; restores it on drop.
pub(crate) struct RmemMax(Option<String>);

impl RmemMax {
    pub(crate) fn raise() -> RmemMax {
        const P: &str = "/proc/sys/net/core/rmem_max";
        let old = std::fs::read_to_string(P).ok();
        if old
            .as_deref()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .is_some_and(|v| v < (64 << 20))
            && std::fs::write(P, format!("{}", 64u64 << 20)).is_ok()
        {
            return RmemMax(old);
        }
        RmemMax(None)
    }
}

impl Drop for RmemMax {
    fn drop(&mut self) {
        if let Some(old) = &self.0 {
            let _ = std::fs::write("/proc/sys/net/core/rmem_max", old.trim());
        }
    }
}

struct RunSpec<'a> {
    streams: usize,
    units: u64,
    unit: u64,
    period: Duration,
    file: &'a Path,
    port: u16,
    trace: bool,
}

fn phase(spec: &RunSpec<'_>, t0: Instant, i: usize) -> Instant {
    t0 + spec.period.mul_f64(i as f64 / spec.streams as f64)
}

fn run_engine(
    spec: &RunSpec<'_>,
    path: PathChoice,
    sched: SchedAsk,
    realtime: bool,
    workers: usize,
    timer: TimerMode,
    spin: Duration,
) -> Result<EngineRun> {
    let per_worker = spec.streams.div_ceil(workers);
    let before = crate::schedstat::snapshot(WORKER_PREFIX);
    let w0 = std::time::Instant::now();
    let depth = 2;
    let engine = Engine::new(EngineConfig {
        workers,
        pool_buffers: (per_worker * depth + 8).min(penstock_driver::sys::POOL_BUFFERS_MAX),
        buffer_bytes: 16 * 1024,
        stream_depth: depth,
        streams_max: spec.streams + 16,
        realtime,
        sched,
        timer,
        spin,
        ..EngineConfig::default()
    })?;
    // The policy each timed worker got, in the table.
    let timed: Vec<&str> = engine
        .info()
        .workers
        .iter()
        .filter(|w| w.timed)
        .map(|w| w.policy.name())
        .collect();
    let mut note = if timed.is_empty() {
        "workers: other".to_string()
    } else {
        format!("timed workers: {}", timed.join(","))
    };
    if realtime && let Err(why) = &engine.info().realtime {
        note.push_str(&format!("; realtime refused: {why}"));
    }
    // The planner's schedule of these streams, for the lateness figures.
    let pacing = Pacing::Periodic {
        period: spec.period,
    };
    let schedule =
        plan_schedule(&pacing, Some(spec.unit), true, 16 * 1024)?.expect("a periodic schedule");
    let slack = Duration::from_millis(200) + Duration::from_micros(40) * spec.streams as u32;
    let t0 = clock::now() + slack;
    let mut handles = Vec::with_capacity(spec.streams);
    for i in 0..spec.streams {
        let s = StreamSpec {
            extent: Extent {
                offset: 0,
                length: Some(spec.units * spec.unit),
            },
            unit_bytes: spec.unit as usize,
            path,
            zero_copy: ZeroCopy::Off,
            pacing: pacing.clone(),
            trace: spec.trace,
            start_at: Some(phase(spec, t0, i)),
            ..StreamSpec::new(
                Endpoint::File {
                    path: spec.file.to_path_buf(),
                },
                Endpoint::UdpSend {
                    host: Host::Ip([127, 0, 0, 1].into()),
                    port: spec.port,
                    local_port: None,
                },
            )
        };
        handles.push(engine.open(s)?);
    }
    if clock::now() > t0 {
        note.push_str(" opening took longer than the start slack");
    }
    let source_files = engine.open_files().files;
    let mut stats = LatenessStats::for_schedule(&schedule, None);
    let mut trace = Vec::new();
    for h in handles {
        let r = h.wait()?;
        if let Some(l) = &r.lateness {
            stats.merge(l);
        }
        trace.extend(r.trace);
    }
    // While the engine (its workers) still lives: their run-queue wait over the run.
    let waited = before.waited_since(WORKER_PREFIX).as_secs_f64();
    let wait_percent = waited / (w0.elapsed().as_secs_f64() * workers as f64) * 100.0;
    Ok((
        stats,
        trace,
        note.trim().to_string(),
        Some(source_files),
        Some(wait_percent),
    ))
}

/// The engine's worker threads' names start so (`penstock-w0`, …).
const WORKER_PREFIX: &str = "penstock-w";

/// A sender's run: its lateness, trace, note, source descriptors (the engine's) and its
/// workers' run-queue wait as a % of their time (the engine's).
type EngineRun = (
    LatenessStats,
    Vec<TraceRecord>,
    String,
    Option<u64>,
    Option<f64>,
);

fn run_threads(spec: &RunSpec<'_>, absolute: bool) -> Result<(LatenessStats, Vec<TraceRecord>)> {
    // The schedule the planner gives the engine's streams, kept by these threads alike.
    let schedule = plan_schedule(
        &Pacing::Periodic {
            period: spec.period,
        },
        Some(spec.unit),
        true,
        16 * 1024,
    )?
    .expect("a periodic schedule");
    let merged = Arc::new(Mutex::new((
        LatenessStats::for_schedule(&schedule, None),
        Vec::new(),
    )));
    let barrier = Arc::new(Barrier::new(spec.streams + 1));
    let slack = Duration::from_millis(200) + Duration::from_micros(100) * spec.streams as u32;
    let mut joins = Vec::new();
    let t0_cell = Arc::new(Mutex::new(Instant::ZERO));
    for i in 0..spec.streams {
        let file = std::fs::File::open(spec.file)?;
        let sock = UdpSocket::bind("127.0.0.1:0")?;
        sock.connect(("127.0.0.1", spec.port))?;
        let (barrier, merged, t0_cell) = (barrier.clone(), merged.clone(), t0_cell.clone());
        let (units, unit, period, streams, trace) = (
            spec.units,
            spec.unit as usize,
            spec.period,
            spec.streams,
            spec.trace,
        );
        let j =
            std::thread::Builder::new()
                .stack_size(128 * 1024)
                .spawn(move || -> Result<()> {
                    if absolute {
                        let _ =
                            rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(1));
                    }
                    let mut stats = LatenessStats::for_schedule(&schedule, None);
                    let mut tr = Vec::new();
                    let mut buf = vec![0u8; unit];
                    barrier.wait();
                    let t0 = *t0_cell.lock().expect("t0");
                    let start = t0 + period.mul_f64(i as f64 / streams as f64);
                    sleep_until(start);
                    for k in 0..units {
                        let scheduled = schedule.deadline(start, k).expect("periodic");
                        if absolute {
                            sleep_until(scheduled);
                        }
                        let n = rustix::io::pread(file.as_fd(), &mut buf[..], k * unit as u64)?;
                        sock.send(&buf[..n])?;
                        let done = clock::now();
                        stats.record(scheduled, done, n as u64);
                        if trace {
                            tr.push(TraceRecord {
                                stream: i as u64,
                                seq: k,
                                scheduled,
                                completed: done,
                                bytes: n as u64,
                            });
                        }
                        if !absolute {
                            std::thread::sleep(period); // the BSD loop: usleep(period) after each send
                        }
                    }
                    let mut m = merged.lock().expect("merge");
                    m.0.merge(&stats);
                    m.1.extend(tr);
                    Ok(())
                })?;
        joins.push(j);
    }
    *t0_cell.lock().expect("t0") = clock::now() + slack;
    barrier.wait();
    for j in joins {
        j.join()
            .map_err(|_| anyhow::anyhow!("a sender thread panicked"))??;
    }
    let m = Arc::try_unwrap(merged).map_err(|_| anyhow::anyhow!("threads still hold the stats"))?;
    Ok(m.into_inner().expect("stats"))
}

fn sleep_until(t: Instant) {
    let ts = rustix::time::Timespec {
        tv_sec: (t.as_nanos() / 1_000_000_000) as i64,
        tv_nsec: (t.as_nanos() % 1_000_000_000) as i64,
    };
    while rustix::thread::clock_nanosleep_absolute(rustix::thread::ClockId::Monotonic, &ts).is_err()
    {
    }
}

/// A `--trace` file in the format `penstock stream --trace` writes and `penstock plot` reads.
fn write_trace(path: &Path, trace: &[TraceRecord]) -> std::io::Result<()> {
    let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(w, "{}", TraceRecord::CSV_HEADER)?;
    for r in trace {
        writeln!(w, "{}", r.to_csv_line())?;
    }
    w.flush()
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

pub fn run(mut a: PeriodicArgs) -> Result<()> {
    if a.quick {
        a.streams = vec![1, 100, 1000];
        a.duration = Duration::from_secs(5);
        a.loads.retain(|l| l != "disk");
    }
    let timer = match a.timer.as_str() {
        "uring" => TimerMode::Uring,
        "nanosleep" => TimerMode::Nanosleep,
        other => bail!("--timer: expected uring or nanosleep, got {other:?}"),
    };
    if a.period.is_zero() {
        bail!("--period must be positive");
    }
    // One core is left to the loopback receiver, which is part of the measurement: on two
    // cores, two workers and the receiver contend, and one worker has the lower tail (measured
    // at 1,000 streams: p99.9 0.2-0.4 ms with one worker against 2-3.6 ms with two).
    let workers = a.workers.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, |n| n.get().saturating_sub(1).max(1))
    });
    let units = (a.duration.as_secs_f64() / a.period.as_secs_f64())
        .floor()
        .max(1.0) as u64;
    let dir = tempfile::Builder::new()
        .prefix("penstock-periodic-")
        .tempdir()?;
    let file = dir.path().join("source.bin");
    make_source(&file, units, a.unit)?;
    let disk_file = dir.path().join("disk-hog.bin");
    if a.loads.iter().any(|l| l == "disk") {
        let f = std::fs::File::create(&disk_file)?;
        let mut w = std::io::BufWriter::new(f);
        let block = vec![0x5Au8; 1 << 20];
        for _ in 0..512 {
            w.write_all(&block)?;
        }
        w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    }
    // A penstock cell holds a UDP socket per stream and one source descriptor in all (the
    // engine shares it among streams of one file); a thread-per-stream cell holds a socket
    // and a file per stream, up to `threads_max`.
    let max_streams = a.streams.iter().copied().max().unwrap_or(1) as u64;
    let need = max_streams.max(2 * a.threads_max.min(max_streams as usize) as u64) + 256;
    let nofile = penstock_driver::rlimit::raise_nofile();
    if nofile.soft < need {
        eprintln!(
            "penstock: bench periodic: RLIMIT_NOFILE {} (hard {}) is below the ~{need} descriptors {max_streams} streams need: cells beyond it fail with EMFILE",
            nofile.soft, nofile.hard
        );
    }
    let rmem = RmemMax::raise();
    if rmem.0.is_some() {
        eprintln!(
            "penstock: bench periodic: raised net.core.rmem_max to 64 MiB for the receiver (restored at the end)"
        );
    }
    if let Some(d) = &a.traces {
        std::fs::create_dir_all(d)?;
    }
    let mut rows: Vec<Row> = Vec::new();
    for &n in &a.streams {
        for load in &a.loads {
            let _hogs = Hogs::start(load, &disk_file)?;
            for sender in &a.senders {
                let threads = matches!(sender.as_str(), "usleep" | "nanosleep");
                if threads && n > a.threads_max {
                    continue;
                }
                let rx = Receiver::start(units, a.receiver_poll)?;
                let spec = RunSpec {
                    streams: n,
                    units,
                    unit: a.unit,
                    period: a.period,
                    file: &file,
                    port: rx.port,
                    trace: n == 1 && a.traces.is_some(),
                };
                let c0 = cpu_times(CpuWho::Process);
                let w0 = std::time::Instant::now();
                let run = match sender.as_str() {
                    "penstock" => {
                        run_engine(&spec, a.path, SchedAsk::Auto, false, workers, timer, a.spin)
                    }
                    "penstock-rt" => {
                        run_engine(&spec, a.path, SchedAsk::Other, true, workers, timer, a.spin)
                    }
                    "penstock-other" => run_engine(
                        &spec,
                        a.path,
                        SchedAsk::Other,
                        false,
                        workers,
                        timer,
                        a.spin,
                    ),
                    _ => Ok((LatenessStats::new(0), Vec::new(), String::new(), None, None)),
                };
                // A cell that cannot run here (e.g. more descriptors than RLIMIT_NOFILE allows)
                // is reported and skipped; the other cells still count.
                let run = match run {
                    Ok(r) => r,
                    Err(e) => {
                        eprintln!("  N={n:<5} load={load:<4} {sender:<11} FAILED: {e:#}");
                        rx.abandon();
                        continue;
                    }
                };
                let (stats, trace, note, source_files, worker_wait_percent) = match sender.as_str()
                {
                    "penstock" | "penstock-rt" | "penstock-other" => run,
                    "usleep" => {
                        let (s, t) = run_threads(&spec, false)?;
                        (s, t, String::new(), None, None)
                    }
                    "nanosleep" => {
                        let (s, t) = run_threads(&spec, true)?;
                        (s, t, String::new(), None, None)
                    }
                    other => bail!("unknown sender {other:?}"),
                };
                let wall = w0.elapsed().as_secs_f64();
                let c1 = cpu_times(CpuWho::Process);
                let cpu = (c1.user_ns + c1.sys_ns - c0.user_ns - c0.sys_ns) as f64 / 1e9;
                let got = rx.finish()?;
                if let Some(d) = &a.traces
                    && !trace.is_empty()
                {
                    let p = d.join(format!("periodic-n{n}-{load}-{sender}.csv"));
                    write_trace(&p, &trace)?;
                }
                let row = Row {
                    streams: n,
                    load: load.clone(),
                    sender: sender.clone(),
                    received: got["received"].as_u64().unwrap_or(0),
                    lost: got["lost"].as_u64().unwrap_or(0),
                    expected: units * n as u64,
                    cpu_percent: cpu / wall * 100.0,
                    source_files,
                    worker_wait_percent,
                    stats,
                    note,
                };
                let s = row.stats.summary();
                eprintln!(
                    "  N={n:<5} load={load:<4} {sender:<11} p50 {:>9.1} µs p99 {:>9.1} µs p99.9 {:>9.1} µs max {:>10.1} µs misses {:>6} lost {:>6} CPU {:>5.1}%{} {}",
                    us(s.p50_ns),
                    us(s.p99_ns),
                    us(s.p999_ns),
                    us(s.max_ns),
                    s.misses,
                    row.lost,
                    row.cpu_percent,
                    row.worker_wait_percent
                        .map_or(String::new(), |w| format!(" worker run-queue wait {w:.1}%")),
                    row.note
                );
                rows.push(row);
            }
        }
    }
    let table = render(&rows, &a, units);
    let mut h = crate::out::human(a.json.as_deref());
    writeln!(h, "{table}")?;
    if let Some(p) = &a.json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                let s = r.stats.summary();
                serde_json::json!({
                    "streams": r.streams, "load": r.load, "sender": r.sender,
                    "p50_ns": s.p50_ns, "p99_ns": s.p99_ns, "p999_ns": s.p999_ns, "max_ns": s.max_ns,
                    "misses": s.misses, "units": s.units, "received": r.received, "lost": r.lost,
                    "expected": r.expected, "cpu_percent": r.cpu_percent, "note": r.note,
                    "source_files": r.source_files, "worker_wait_percent": r.worker_wait_percent,
                })
            })
            .collect();
        crate::out::write_json(p, &serde_json::json!({"bench": "periodic", "rows": v}))?;
    }
    Ok(())
}

fn render(rows: &[Row], a: &PeriodicArgs, units: u64) -> String {
    let mut s = format!(
        "\nbench periodic: {} B every {:?} per stream, {} units per stream, UDP to a loopback receiver (child process)\n\
         lateness = completion of the send - start of its period; miss = later than one period; CPU = sender process, % of one core\n\
         {:>6} {:<5} {:<12} {:>10} {:>10} {:>10} {:>11} {:>8} {:>8} {:>7}\n",
        a.unit,
        a.period,
        units,
        "N",
        "load",
        "sender",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "max µs",
        "misses",
        "lost",
        "CPU %"
    );
    for r in rows {
        let x = r.stats.summary();
        s.push_str(&format!(
            "{:>6} {:<5} {:<12} {:>10.1} {:>10.1} {:>10.1} {:>11.1} {:>8} {:>8} {:>7.1}{}\n",
            r.streams,
            r.load,
            r.sender,
            us(x.p50_ns),
            us(x.p99_ns),
            us(x.p999_ns),
            us(x.max_ns),
            x.misses,
            r.lost,
            r.cpu_percent,
            if r.note.is_empty() {
                String::new()
            } else {
                format!("  ({})", r.note)
            }
        ));
    }
    s
}
