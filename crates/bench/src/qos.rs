//! `penstock bench isolation` (MARS Table 2) and `penstock bench rtu` (MARS Table 3, and with
//! `--upcalls` its periods as Real-Time Upcalls).
//!
//! isolation: one `rt` stream of `--size` bytes (or, `--rt-streams 4,32` as MARS measured, k
//! streams each reading its k-th at the rate / k), paced at a fixed rate near its share of the
//! disk, O_DIRECT, is timed while 0, 2, 4, 6 background readers run — (a) inside penstock as
//! `bulk` burst streams of other files (through the same disk scheduler), (b) as separate
//! processes reading other files with plain read() (outside penstock: only the kernel's I/O
//! scheduler and ioprio can help). Each is run with the scheduler on (`drr`) and switched off
//! (`fifo`) in the same run. All streams go to /dev/null: the disk is what is measured.
//!
//! rtu: three periodic streams with periods 60, 75 and 120 ms share the disk and the network
//! (TCP to a receiver process); each should get the throughput its period implies and miss
//! no deadline, with and without a CPU hog, in EDF and rate-monotonic order.
//!
//! rtu --upcalls (issue 14): the same three periods as Real-Time Upcalls
//! (`Engine::rtu_create`), each activation using a fixed amount of CPU (`--work`) within its
//! declared budget (`--budget`), on one engine worker whose dispatcher also paces `--streams`
//! UDP streams (1 KiB at 30/s, to a `penstock sink --udp` child that checks sequence numbers);
//! EDF and RM order, without and with CPU hogs. Per upcall: activations, overruns, misses,
//! skipped, lateness (release → start) p50/p99/max; per run the streams' lateness and loss and
//! the CPU the process used against what admission assumed. Then an over-committed set
//! (budgets of a third of each period), which admission must refuse at create.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use penstock_core::endpoint::{Endpoint, Host};
use penstock_core::lateness::LatenessStats;
use penstock_core::sched::drr::SchedMode;
use penstock_core::sched::edf::Order;
use penstock_core::stream::plan::{Pacing, plan_schedule};
use penstock_core::stream::{CachePolicy, Extent, PathChoice};
use penstock_core::units::{parse_duration, parse_size};
use penstock_driver::clock::{self, CpuWho, cpu_times};
use penstock_driver::disk::DiskConfig;
use penstock_driver::sys::AlignedBuffer;
use penstock_driver::{DiskClass, Engine, EngineConfig, RtuSpec, StreamSpec, ZeroCopy};

#[derive(Args, Debug)]
pub struct IsolationArgs {
    /// Size of the rt stream.
    #[arg(long, default_value = "400MB", value_parser = parse_size)]
    pub size: u64,
    /// Background reader counts.
    #[arg(long, default_value = "0,2,4,6", value_delimiter = ',')]
    pub readers: Vec<usize>,
    /// rt stream counts (MARS Table 2 ran 4 and 32 stream reads): k streams share the rt
    /// data and the rate, each reading its k-th of `--size` at the rate / k.
    #[arg(long, default_value = "1", value_delimiter = ',')]
    pub rt_streams: Vec<usize>,
    /// The rt stream's rate as a fraction of the disk's O_DIRECT rate measured at start.
    #[arg(long, default_value_t = 0.25)]
    pub share: f64,
    /// Directory for the test files (on the disk to measure).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// A short run: 100 MB, readers 0 and 6.
    #[arg(long)]
    pub quick: bool,
    /// Write the table as JSON here.
    /// A bare `--json` writes it on stdout (the table then goes to stderr).
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
    /// Instead of the MARS table: the DRR shares under live tuning. Runs `penstock serve`
    /// (one engine worker: one disk scheduler) with rt and bulk streams reading this disk
    /// (O_DIRECT, 1 MiB reads, to /dev/null) opened over the control protocol, changes the
    /// quanta with `TUNE disk` while they run, and prints each class's share per phase.
    #[arg(long)]
    pub tune: bool,
    /// With --tune: how long each phase is measured.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub phase: Duration,
    /// With --tune: streams per class.
    #[arg(long, default_value_t = 2)]
    pub streams: usize,
    /// With --tune: the disk scheduler's reads in flight (`[disk] inflight_max`).
    #[arg(long, default_value_t = 2)]
    pub inflight: u32,
    /// The MARS table's engine: reads in flight per device at most (default: the engine's,
    /// `DiskConfig::default().disk_inflight_max`). A real-time read waits behind the reads
    /// already in the device, which DRR does not preempt: this bounds that wait.
    #[arg(long)]
    pub disk_inflight: Option<u32>,
    /// The MARS table's engine worker at SCHED_FIFO with mlockall (`stream --realtime`): tells
    /// the rt stream's late units that come from the worker waiting for a CPU (a loaded
    /// machine) from those the disk causes. Each row reports the worker's run-queue wait.
    #[arg(long)]
    pub realtime: bool,
    /// Instead of readers, N `cp` processes writing copies of the background files (issue 21),
    /// each started again when it finishes, for as long as the rt stream lasts: onto a plain
    /// file of this disk, onto `penstock volume mount` (its defaults: `--class bulk`,
    /// `--write-behind 8MiB`) of a volume whose member is a file on this disk, onto such a
    /// mount with `--write-behind 0` (written pages left to the kernel's flusher threads), and
    /// onto one with `--class rt` (write-behind without the idle I/O class).
    /// Use with `--readers 0,1`.
    #[arg(long)]
    pub fuse_cp: bool,
    /// The rt stream lasts about this long (its length is the rate times this, the rt file
    /// made that large) instead of `--size`.
    #[arg(long, value_parser = parse_duration)]
    pub rt_duration: Option<Duration>,
    /// The rt stream's rate (e.g. `40MB/s`) instead of `--share` of the O_DIRECT rate measured
    /// at start: a virtual disk's measurement can be its host's cache (this VM's read 235 MB/s
    /// to 3 GB/s from one run to the next).
    #[arg(long, value_parser = penstock_core::units::parse_rate)]
    pub rate: Option<penstock_core::units::Rate>,
}

#[derive(Args, Debug)]
pub struct RtuArgs {
    /// How long each run lasts.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Bytes each stream sends per period.
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    pub unit: u64,
    /// Directory for the test files.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Write the table as JSON here.
    /// A bare `--json` writes it on stdout (the table then goes to stderr).
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
    /// The upcall variant: the three periods as Real-Time Upcalls (each using --work of CPU
    /// within --budget) on one engine worker beside --streams paced UDP streams (1 KiB at
    /// 30/s), EDF and RM, without and with CPU hogs; then an over-committed set, which must
    /// be refused at create.
    #[arg(long)]
    pub upcalls: bool,
    /// With --upcalls: paced streams on the upcalls' worker.
    #[arg(long, default_value_t = 100)]
    pub streams: usize,
    /// With --upcalls: each upcall's declared budget (CPU time per activation).
    #[arg(long, default_value = "5ms", value_parser = parse_duration)]
    pub budget: Duration,
    /// With --upcalls: the CPU time each activation uses.
    #[arg(long, default_value = "1ms", value_parser = parse_duration)]
    pub work: Duration,
}

const UNIT: u64 = 1 << 20;

fn make_file(path: &Path, size: u64) -> Result<()> {
    if std::fs::metadata(path).is_ok_and(|m| m.len() >= size) {
        return Ok(());
    }
    let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let mut block = vec![0u8; 1 << 20];
    let mut x = 0x1234_5678_9abc_def1u64;
    for b in block.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    for i in 0..size.div_ceil(1 << 20) {
        block[..8].copy_from_slice(&i.to_le_bytes());
        f.write_all(&block)?;
    }
    f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    Ok(())
}

fn evict(path: &Path) {
    if let Ok(f) = std::fs::File::open(path) {
        let _ = rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed);
    }
}

/// The device's O_DIRECT sequential rate over `bytes` of `file` (1 MiB reads, depth 1).
fn device_rate(file: &Path, bytes: u64) -> Result<f64> {
    let fd = penstock_driver::open::reopen_direct(file).context("O_DIRECT refused here")?;
    let mut buf = AlignedBuffer::new(1 << 20)?;
    let t0 = std::time::Instant::now();
    let mut off = 0;
    while off < bytes {
        let n = rustix::io::pread(&fd, buf.bytes_mut(), off)?;
        if n == 0 {
            break;
        }
        off += n as u64;
    }
    Ok(off as f64 / t0.elapsed().as_secs_f64())
}

/// Admission is not what these benches measure: a capacity no stream here reaches.
fn roomy_admission() -> penstock_core::admission::AdmissionConfig {
    penstock_core::admission::AdmissionConfig {
        capacity: penstock_core::admission::Capacity {
            disk_seq_bytes_per_s: 100_000_000_000,
            disk_random_iops: 10_000_000,
            disk_random_request_bytes: 4096,
            net_bytes_per_s: 100_000_000_000,
            buffer_count: 1024,
            buffer_bytes: UNIT,
            ..penstock_core::admission::Capacity::CONSERVATIVE
        },
        bulk_share_percent: 20,
        streams_max: 1024,
        rt_latency_ns: 0,
        lateness_tolerance_ns: penstock_core::admission::LATENESS_TOLERANCE_NS_DEFAULT,
    }
}

/// The kernel I/O scheduler of the block device a file lives on (its queue, or for a partition
/// its disk's), as /sys shows it: `[mq-deadline] none`.
fn kernel_scheduler_of(path: &Path) -> String {
    let Ok(st) = rustix::fs::stat(path) else {
        return "unknown".to_string();
    };
    let (maj, min) = (rustix::fs::major(st.st_dev), rustix::fs::minor(st.st_dev));
    let base = PathBuf::from(format!("/sys/dev/block/{maj}:{min}"));
    for q in [
        base.join("queue/scheduler"),
        base.join("../queue/scheduler"),
    ] {
        if let Ok(s) = std::fs::read_to_string(&q) {
            return s.trim().to_string();
        }
    }
    format!("none (device {maj}:{min} has no request queue)")
}

/// The engine's worker threads' names start so (`penstock-w0`, …).
const WORKER_PREFIX: &str = "penstock-w";

/// Reads each isolation stream keeps ahead (the rt stream's slack: this many periods).
const ISOLATION_STREAM_DEPTH: usize = 4;

fn engine(
    mode: SchedMode,
    order: Order,
    inflight: Option<u32>,
    realtime: bool,
    rt_streams: usize,
) -> Result<Engine> {
    // One worker: the disk scheduler is per worker, so the streams that compete for the disk
    // must share one to be scheduled against each other. The pool: each rt stream reserves
    // its depth of buffers, and rt may hold 80 % of the pool; room for the bulk streams
    // besides.
    Ok(Engine::new(EngineConfig {
        workers: 1,
        pool_buffers: 64.max(2 * rt_streams * ISOLATION_STREAM_DEPTH + 16),
        buffer_bytes: UNIT as usize,
        stream_depth: ISOLATION_STREAM_DEPTH,
        order,
        disk: DiskConfig {
            mode,
            disk_inflight_max: inflight.unwrap_or(DiskConfig::default().disk_inflight_max),
            ..DiskConfig::default()
        },
        admission: roomy_admission(),
        realtime,
        ..EngineConfig::default()
    })?)
}

fn devnull() -> Endpoint {
    Endpoint::File {
        path: PathBuf::from("/dev/null"),
    }
}

struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn proc_read_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("read_bytes: ")
                    .and_then(|v| v.trim().parse().ok())
            })
        })
        .unwrap_or(0)
}

/// A background process's bytes: a reader's from the disk (`read_bytes`), a `cp`'s copied
/// (`rchar`: a copy onto the FUSE mount is written to the disk by the mount's server).
fn proc_bg_bytes(pid: u32, cp: bool) -> u64 {
    if !cp {
        return proc_read_bytes(pid);
    }
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("rchar: ")
                    .and_then(|v| v.trim().parse().ok())
            })
        })
        .unwrap_or(0)
}

/// `--fuse-cp`: a one-member volume on the measured disk, mounted with `penstock volume
/// mount`; unmounted when dropped.
struct FuseCp {
    member: PathBuf,
    mnt: PathBuf,
}

impl FuseCp {
    fn mount(
        exe: &Path,
        dir: &Path,
        tag: &str,
        bg_size: u64,
        copies: usize,
        extra: &[&str],
    ) -> Result<FuseCp> {
        let member = dir.join(format!("fusevol-{tag}-m0"));
        let mnt = dir.join(format!("fuse-mnt-{tag}"));
        if member.exists() {
            std::fs::remove_file(&member)?;
        }
        std::fs::create_dir_all(&mnt)?;
        let member_size = bg_size * copies.max(1) as u64 + (256 << 20);
        let run = |args: &[&std::ffi::OsStr]| -> Result<()> {
            let o = Command::new(exe).args(args).output()?;
            if !o.status.success() {
                bail!(
                    "penstock {args:?}: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
            }
            Ok(())
        };
        run(&[
            "volume".as_ref(),
            "create".as_ref(),
            "isolation".as_ref(),
            "--member".as_ref(),
            member.as_os_str(),
            "--member-size".as_ref(),
            member_size.to_string().as_ref(),
        ])?;
        let mut args: Vec<&std::ffi::OsStr> = vec![
            "volume".as_ref(),
            "mount".as_ref(),
            member.as_os_str(),
            mnt.as_os_str(),
        ];
        args.extend(extra.iter().map(std::ffi::OsStr::new));
        run(&args)?;
        Ok(FuseCp { member, mnt })
    }

    /// Removes the copies of the previous run and writes back dirty pages, so that each run
    /// starts from the same state.
    fn clear(&self, dir: &Path) -> Result<()> {
        for d in [dir, self.mnt.as_path()] {
            for e in std::fs::read_dir(d)? {
                let p = e?.path();
                if p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("cp"))
                {
                    std::fs::remove_file(&p)
                        .with_context(|| format!("removing {}", p.display()))?;
                }
            }
        }
        rustix::fs::sync();
        Ok(())
    }
}

impl Drop for FuseCp {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
        let _ = std::fs::remove_file(&self.member);
    }
}

/// `--fuse-cp` backgrounds.
const CP_PLAIN: &str = "cp to a plain file";
const FUSE_DEFAULT: &str = "cp to the mount";
const FUSE_WB0: &str = "cp to mount, wb 0";
const FUSE_RT: &str = "cp to mount, class rt";

struct IsoRow {
    background: &'static str,
    mode: &'static str,
    /// rt streams sharing the rt data and rate.
    rt_streams: usize,
    readers: usize,
    seconds: f64,
    misses: u64,
    units: u64,
    p99_ms: f64,
    background_mb_s: f64,
    /// How long the engine's worker was runnable but not running during the rt stream.
    worker_wait_ms: f64,
    /// The device's mean time per completed read during the rt stream (kernel queue + device).
    disk_read_ms: Option<f64>,
}

pub fn isolation(mut a: IsolationArgs) -> Result<()> {
    if a.quick {
        a.size = 100_000_000;
        a.readers = vec![0, 6];
    }
    if a.tune {
        return isolation_tune(&a);
    }
    if !(0.01..=1.0).contains(&a.share) {
        bail!("--share must be within 0.01..=1");
    }
    if a.rt_streams.is_empty() || a.rt_streams.iter().any(|&k| k == 0 || k > 1024) {
        bail!("--rt-streams: counts from 1 to 1024");
    }
    let tmp;
    let dir = match &a.dir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile::Builder::new()
                .prefix("penstock-isolation-")
                .tempdir_in(".")?;
            tmp.path().to_path_buf()
        }
    };
    let max_readers = a.readers.iter().copied().max().unwrap_or(0);
    let rt_file = dir.join("rt.bin");
    make_file(&rt_file, a.size)?;
    let bg_size = a.size.max(256 << 20) * 2;
    let bg_files: Vec<PathBuf> = (0..max_readers)
        .map(|i| dir.join(format!("bg{i}.bin")))
        .collect();
    for f in &bg_files {
        make_file(f, bg_size)?;
    }
    let device = device_rate(&rt_file, a.size.min(200 << 20))?;
    let rate = match a.rate {
        Some(r) => {
            let (num, den) = r.bytes_per_second(UNIT);
            num as f64 / den as f64
        }
        None => device * a.share,
    };
    if let Some(d) = a.rt_duration {
        // Whole units: the stream's length is what the schedule sends in `d`.
        a.size = ((rate * d.as_secs_f64()) as u64).div_ceil(UNIT).max(1) * UNIT;
        make_file(&rt_file, a.size)?;
    }
    let kernel_sched = kernel_scheduler_of(&rt_file);
    eprintln!(
        "penstock bench isolation: rt stream {} bytes paced at {:.1} MB/s ({:.0}% of this disk's O_DIRECT rate, {:.1} MB/s at start); kernel I/O scheduler: {}",
        a.size,
        rate / 1e6,
        rate / device * 100.0,
        device / 1e6,
        kernel_sched.trim()
    );
    let units_per_s = rate / UNIT as f64;
    let period = Duration::from_secs_f64(1.0 / units_per_s);
    if let Some(&k) = a.rt_streams.iter().find(|&&k| k as u64 > a.size / UNIT) {
        bail!(
            "--rt-streams {k}: the rt data ({} bytes) holds fewer units of {UNIT} bytes",
            a.size
        );
    }
    let mut rows = Vec::new();
    let exe = std::env::current_exe()?;
    // (mount, the background's name) for --fuse-cp: the mount's defaults, and write-behind off.
    let mounts: Vec<(FuseCp, &'static str)> = if a.fuse_cp {
        vec![
            (
                FuseCp::mount(&exe, &dir, "bulk", bg_size, max_readers, &[])?,
                FUSE_DEFAULT,
            ),
            (
                FuseCp::mount(
                    &exe,
                    &dir,
                    "wb0",
                    bg_size,
                    max_readers,
                    &["--write-behind", "0"],
                )?,
                FUSE_WB0,
            ),
            (
                FuseCp::mount(&exe, &dir, "rt", bg_size, max_readers, &["--class", "rt"])?,
                FUSE_RT,
            ),
        ]
    } else {
        Vec::new()
    };
    let backgrounds: &[&'static str] = if a.fuse_cp {
        &[CP_PLAIN, FUSE_DEFAULT, FUSE_WB0, FUSE_RT]
    } else {
        &["penstock bulk streams", "read() processes"]
    };
    let modes: &[(SchedMode, &'static str)] = if a.fuse_cp {
        &[(SchedMode::Drr, "drr")]
    } else {
        &[(SchedMode::Drr, "drr"), (SchedMode::Fifo, "fifo")]
    };
    // (rt streams, readers) of each cell, in the table's order.
    let cells: Vec<(usize, usize)> = a
        .rt_streams
        .iter()
        .flat_map(|&k| a.readers.iter().map(move |&n| (k, n)))
        .collect();
    for &background in backgrounds {
        for &(mode, mode_name) in modes {
            for &(k, n) in &cells {
                let before = crate::schedstat::snapshot(WORKER_PREFIX);
                let e = engine(
                    mode,
                    Order::EarliestDeadline,
                    a.disk_inflight,
                    a.realtime,
                    k,
                )?;
                if a.realtime
                    && let Err(why) = &e.info().realtime
                {
                    bail!("--realtime: {why}");
                }
                evict(&rt_file);
                for f in &bg_files {
                    evict(f);
                }
                let mut bulk = Vec::new();
                let mut procs = Procs(Vec::new());
                for (fuse, _) in &mounts {
                    fuse.clear(&dir)?;
                }
                // --fuse-cp: each cp's command, started again when it finishes.
                let mut cps: Vec<Command> = Vec::new();
                for (i, f) in bg_files.iter().enumerate().take(n) {
                    if a.fuse_cp {
                        let to = match mounts.iter().find(|(_, name)| *name == background) {
                            Some((fuse, _)) => fuse.mnt.join(format!("cp{i}.bin")),
                            None => dir.join(format!("cp{i}.bin")),
                        };
                        let mut c = Command::new("cp");
                        c.arg(f).arg(to);
                        procs.0.push(c.spawn()?);
                        cps.push(c);
                    } else if background.starts_with("penstock") {
                        let mut s = StreamSpec::new(Endpoint::File { path: f.clone() }, devnull());
                        s.path = PathChoice::Fixed(penstock_core::stream::DataPath::Uring);
                        s.cache = CachePolicy::Bypass;
                        s.unit_bytes = UNIT as usize;
                        s.class = Some(DiskClass::Bulk);
                        bulk.push(e.open(s)?);
                    } else {
                        procs
                            .0
                            .push(Command::new(&exe).args(["hog", "read"]).arg(f).spawn()?);
                    }
                }
                std::thread::sleep(Duration::from_millis(300));
                let read0: u64 = procs
                    .0
                    .iter()
                    .map(|c| proc_bg_bytes(c.id(), a.fuse_cp))
                    .sum();
                let bulk0: u64 = bulk.iter().map(|h| h.counters().bytes_read).sum();
                // Bytes of the cp processes that finished during the rt stream.
                let mut copied_before = 0u64;
                let wait0 = before.waited_since(WORKER_PREFIX);
                let disk0 = crate::schedstat::disk_reads(&rt_file);
                let t0 = std::time::Instant::now();
                // k rt streams: stream i reads the i-th k-th of the rt data (whole units) at
                // the rate / k (a period k times as long).
                let units = a.size / UNIT;
                let mut handles = Vec::with_capacity(k);
                for i in 0..k as u64 {
                    let (first, last) = (units * i / k as u64, units * (i + 1) / k as u64);
                    let mut s = StreamSpec::new(
                        Endpoint::File {
                            path: rt_file.clone(),
                        },
                        devnull(),
                    );
                    s.path = PathChoice::Fixed(penstock_core::stream::DataPath::Uring);
                    s.cache = CachePolicy::Bypass;
                    s.pacing = Pacing::Periodic {
                        period: period * k as u32,
                    };
                    s.unit_bytes = UNIT as usize;
                    s.class = Some(DiskClass::Rt);
                    s.extent = Extent {
                        offset: first * UNIT,
                        length: Some((last - first) * UNIT),
                    };
                    s.zero_copy = ZeroCopy::Off;
                    handles.push(e.open(s)?);
                }
                let wait_all = move || -> Result<Vec<penstock_driver::StreamReport>> {
                    handles
                        .into_iter()
                        .map(|h| h.wait().map_err(anyhow::Error::from))
                        .collect()
                };
                let reports = if cps.is_empty() {
                    wait_all()?
                } else {
                    let (tx, rx) = std::sync::mpsc::channel();
                    let waiter = std::thread::spawn(move || {
                        let r = wait_all();
                        let _ = tx.send(());
                        r
                    });
                    // Keeps a cp running for as long as the rt streams: their own schedules
                    // bound this wait.
                    while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                        rx.recv_timeout(Duration::from_millis(20))
                    {
                        for (c, cmd) in procs.0.iter_mut().zip(cps.iter_mut()) {
                            if c.try_wait()?.is_some() {
                                copied_before += bg_size;
                                *c = cmd.spawn()?;
                            }
                        }
                    }
                    waiter
                        .join()
                        .map_err(|_| anyhow::anyhow!("the rt streams' waiter panicked"))??
                };
                let secs = t0.elapsed().as_secs_f64();
                let worker_wait = before.waited_since(WORKER_PREFIX).saturating_sub(wait0);
                let disk_read_ms = match (disk0, crate::schedstat::disk_reads(&rt_file)) {
                    (Some((n0, ms0)), Some((n1, ms1))) if n1 > n0 => {
                        Some((ms1 - ms0) as f64 / (n1 - n0) as f64)
                    }
                    _ => None,
                };
                let bg_bytes = bulk.iter().map(|h| h.counters().bytes_read).sum::<u64>() - bulk0
                    + procs
                        .0
                        .iter()
                        .map(|c| proc_bg_bytes(c.id(), a.fuse_cp))
                        .sum::<u64>()
                    + copied_before
                    - read0;
                for h in &bulk {
                    h.cancel();
                }
                for h in bulk {
                    let _ = h.wait();
                }
                drop(procs);
                // The streams' late units and units added up; the p99 the worst stream's.
                let (mut misses, mut units_sent, mut p99_ns) = (0, 0, 0);
                for r in reports {
                    let l = r
                        .lateness
                        .unwrap_or_else(|| LatenessStats::new(0))
                        .summary();
                    misses += l.misses;
                    units_sent += l.units;
                    p99_ns = p99_ns.max(l.p99_ns);
                }
                let row = IsoRow {
                    background,
                    mode: mode_name,
                    rt_streams: k,
                    readers: n,
                    seconds: secs,
                    misses,
                    units: units_sent,
                    p99_ms: p99_ns as f64 / 1e6,
                    background_mb_s: bg_bytes as f64 / secs / 1e6,
                    worker_wait_ms: worker_wait.as_secs_f64() * 1e3,
                    disk_read_ms,
                };
                eprintln!(
                    "  {background:<22} {mode_name:<4} rt streams {k} readers {n}: {secs:.2} s, misses {} of {}, background {:.1} MB/s, worker run-queue wait {:.1} ms, disk {} ms/read",
                    row.misses,
                    row.units,
                    row.background_mb_s,
                    row.worker_wait_ms,
                    row.disk_read_ms.map_or("?".into(), |d| format!("{d:.2}"))
                );
                rows.push(row);
            }
        }
    }
    let mut t = format!(
        "\nbench isolation (MARS Table 2): rt data of {} bytes at {:.1} MB/s in all (O_DIRECT, 1 MiB units; k rt streams each read a k-th at the rate / k), /dev/null targets\n\
         {:<22} {:<5} {:>10} {:>7} {:>10} {:>12} {:>14} {:>12} {:>14} {:>14} {:>12}\n",
        a.size,
        rate / 1e6,
        "background",
        "sched",
        "rt streams",
        "readers",
        "rt time s",
        "x unloaded",
        "rt misses",
        "rt p99 ms",
        "background MB/s",
        "worker wait ms",
        "disk ms/read"
    );
    for r in &rows {
        let base = rows
            .iter()
            .find(|x| {
                x.background == r.background
                    && x.mode == r.mode
                    && x.rt_streams == r.rt_streams
                    && x.readers == 0
            })
            .map_or(f64::NAN, |x| x.seconds);
        t.push_str(&format!(
            "{:<22} {:<5} {:>10} {:>7} {:>10.2} {:>12.2} {:>9} of {:<4} {:>10.2} {:>14.1} {:>14.1} {:>12}\n",
            r.background,
            r.mode,
            r.rt_streams,
            r.readers,
            r.seconds,
            r.seconds / base,
            r.misses,
            r.units,
            r.p99_ms,
            r.background_mb_s,
            r.worker_wait_ms,
            r.disk_read_ms.map_or("?".into(), |d| format!("{d:.2}"))
        ));
    }
    let mut h = crate::out::human(a.json.as_deref());
    writeln!(h, "{t}")?;
    if let Some(p) = &a.json {
        let v: Vec<_> = rows
            .iter()
            .map(|r| {
                serde_json::json!({"background": r.background, "sched": r.mode,
                "rt_streams": r.rt_streams, "readers": r.readers,
                "seconds": r.seconds, "misses": r.misses, "units": r.units, "p99_ms": r.p99_ms,
                "background_mb_s": r.background_mb_s, "worker_wait_ms": r.worker_wait_ms,
                "disk_read_ms": r.disk_read_ms})
            })
            .collect();
        crate::out::write_json(
            p,
            &serde_json::json!({"bench": "isolation", "rate_bytes_per_s": rate, "kernel_scheduler": kernel_sched.trim(),
                "unit_bytes": UNIT, "stream_depth": ISOLATION_STREAM_DEPTH, "device_rate_bytes_per_s": device,
                "disk_inflight_max": a.disk_inflight.unwrap_or(DiskConfig::default().disk_inflight_max),
                "realtime": a.realtime, "rows": v}),
        )?;
    }
    Ok(())
}

/// The quanta of each `--tune` phase (rt, bulk), in MiB: the first is the configuration's,
/// the others are set with `TUNE disk` while the streams run.
const TUNE_PHASES: [(u64, u64); 3] = [(4, 1), (1, 4), (2, 2)];

/// A control connection to the `penstock serve` child.
struct Control {
    r: std::io::BufReader<std::net::TcpStream>,
}

impl Control {
    /// Sends a line; returns the reply's lines (continuations and final).
    fn cmd(&mut self, line: &str) -> Result<Vec<String>> {
        use std::io::BufRead;
        self.r.get_mut().write_all(format!("{line}\n").as_bytes())?;
        let mut out = Vec::new();
        loop {
            let mut l = String::new();
            if self.r.read_line(&mut l)? == 0 {
                bail!("penstock serve closed the control connection after {line:?}");
            }
            let l = l.trim_end().to_string();
            let last = l.as_bytes().get(3) != Some(&b'-');
            out.push(l);
            if last {
                return Ok(out);
            }
        }
    }

    /// Like `cmd`, failing unless the reply is 2xx.
    fn ok(&mut self, line: &str) -> Result<Vec<String>> {
        let r = self.cmd(line)?;
        let last = r.last().map(String::as_str).unwrap_or("");
        if !last.starts_with('2') {
            bail!("{line:?}: {last}");
        }
        Ok(r)
    }
}

/// Bytes sent (rt, bulk) by every stream in the table, and the ids of those done.
fn class_totals(c: &mut Control) -> Result<((u64, u64), Vec<String>)> {
    let mut t = (0, 0);
    let mut done = Vec::new();
    for l in c.ok("STATE *")? {
        let Some(line) = l.strip_prefix("211-") else {
            continue;
        };
        let field = |k: &str| {
            line.split(' ')
                .find_map(|w| w.strip_prefix(k))
                .map(str::to_string)
        };
        let sent: u64 = field("sent=").and_then(|v| v.parse().ok()).unwrap_or(0);
        match field("class=").as_deref() {
            Some("rt") => t.0 += sent,
            _ => t.1 += sent,
        }
        if line.split(' ').nth(1) == Some("done") {
            done.push(line.split(' ').next().unwrap_or("").to_string());
        }
        if line.split(' ').nth(1) == Some("failed") {
            bail!("a stream failed: {line}");
        }
    }
    Ok((t, done))
}

/// `bench isolation --tune`: see `IsolationArgs::tune`.
fn isolation_tune(a: &IsolationArgs) -> Result<()> {
    use std::io::BufRead;
    let tmp;
    let dir = match &a.dir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile::Builder::new()
                .prefix("penstock-isolation-")
                .tempdir_in(".")?;
            tmp.path().to_path_buf()
        }
    };
    let dir = std::fs::canonicalize(&dir)?;
    if a.streams == 0 {
        bail!("--streams must be at least 1");
    }
    // Files are read again and again: O_DIRECT reads go to the disk each time.
    let size = a.size.min(256 << 20);
    let files: Vec<(bool, PathBuf)> = (0..a.streams)
        .map(|i| (true, dir.join(format!("rt{i}.bin"))))
        .chain((0..a.streams).map(|i| (false, dir.join(format!("bulk{i}.bin")))))
        .collect();
    for (_, f) in &files {
        make_file(f, size)?;
    }
    let kernel_sched = kernel_scheduler_of(&files[0].1);
    let token = format!(
        "bench-isolation-{:016x}",
        std::process::id() as u64 * 0x9e37_79b9
    );
    let (q_rt, q_bulk) = TUNE_PHASES[0];
    let conf = dir.join("penstock.toml");
    std::fs::write(
        &conf,
        format!(
            "[rtsp]\nlisten = \"\"\n[http]\nlisten = \"127.0.0.1:0\"\nworkers = 1\n\
             [control]\nlisten = \"127.0.0.1:0\"\ntoken = \"{token}\"\n\
             read_roots = [\"{d}\"]\ndevices = [\"/dev/null\"]\n\
             pending_timeout_ms = 3600000\nstreams_per_connection_max = 100000\n\
             streams_per_identity_max = 100000\n\
             [engine]\nworkers = 1\npool_buffers = 64\nbuffer_bytes = {UNIT}\n\
             [disk]\nrt_quantum_bytes = {}\nbulk_quantum_bytes = {}\ninflight_max = {}\n\
             [admission]\ndisk_seq_bytes_per_s = 100000000000\ndisk_random_iops = 10000000\n\
             net_bytes_per_s = 100000000000\n\
             buffer_count = 1024\nbuffer_bytes = {UNIT}\nstreams_max = 65536\n",
            q_rt << 20,
            q_bulk << 20,
            a.inflight,
            d = dir.display(),
        ),
    )?;
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args(["serve", "--config"])
        .arg(&conf)
        .arg("--root")
        .arg(&dir)
        .arg("--no-control-unix")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("starting penstock serve")?;
    let mut out = std::io::BufReader::new(child.stdout.take().context("serve's stdout")?);
    let serve = Procs(vec![child]);
    let mut line = String::new();
    out.read_line(&mut line)?;
    if line.is_empty() {
        bail!(
            "penstock serve did not start (run it with --config {} to see why)",
            conf.display()
        );
    }
    let addr = line
        .split(", control ")
        .nth(1)
        .and_then(|c| c.split([',', ';']).next())
        .with_context(|| format!("no control address in {line:?}"))?
        .trim()
        .to_string();
    let stream = std::net::TcpStream::connect(&addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut c = Control {
        r: std::io::BufReader::new(stream),
    };
    c.ok(&format!("AUTH {token}"))?;
    // rt streams ask for far more than the disk gives (4000 MiB/s): paced, but always behind
    // their schedule, so both classes always have reads waiting — DRR's quanta decide.
    let open = |c: &mut Control, rt: bool, f: &Path| -> Result<String> {
        let class = if rt {
            "class=rt rate=4000/s unit=1MiB"
        } else {
            "class=bulk"
        };
        let r = c.ok(&format!(
            "OPEN file:{} file:/dev/null {class} path=uring cache=bypass",
            f.display()
        ))?;
        let id = r
            .last()
            .and_then(|l| l.split(' ').nth(1))
            .context("no stream id")?
            .to_string();
        c.ok(&format!("START {id}"))?;
        Ok(id)
    };
    // Stream id → the file it reads.
    let mut which = std::collections::HashMap::new();
    for (i, (rt, f)) in files.iter().enumerate() {
        which.insert(open(&mut c, *rt, f)?, i);
    }
    // Keeps every stream running: one that finished its file is opened again (the finished
    // one stays in the table, so the sums of `sent=` only grow).
    let mut tick = |c: &mut Control| -> Result<(u64, u64)> {
        let (t, done) = class_totals(c)?;
        for id in done {
            if let Some(i) = which.remove(&id) {
                which.insert(open(c, files[i].0, &files[i].1)?, i);
            }
        }
        Ok(t)
    };
    eprintln!(
        "penstock bench isolation --tune: {n} rt + {n} bulk streams, O_DIRECT 1 MiB reads of {size}-byte files to /dev/null, \
         one engine worker, inflight {inflight}; kernel I/O scheduler: {}",
        kernel_sched.trim(),
        n = a.streams,
        inflight = a.inflight,
    );
    let mut rows = Vec::new();
    for (phase, &(q_rt, q_bulk)) in TUNE_PHASES.iter().enumerate() {
        let how = if phase == 0 {
            format!(
                "[disk] rt_quantum_bytes={} bulk_quantum_bytes={}",
                q_rt << 20,
                q_bulk << 20
            )
        } else {
            let line = format!("TUNE disk rt_quantum={q_rt}MiB bulk_quantum={q_bulk}MiB");
            let r = c.ok(&line)?;
            eprintln!("  {line} -> {}", r.join(" | "));
            line
        };
        // Let the rounds formed under the old quanta drain.
        let settle = std::time::Instant::now();
        while settle.elapsed() < Duration::from_millis(300) {
            tick(&mut c)?;
            std::thread::sleep(Duration::from_millis(50));
        }
        let t0 = tick(&mut c)?;
        let start = std::time::Instant::now();
        while start.elapsed() < a.phase {
            std::thread::sleep(Duration::from_millis(50));
            tick(&mut c)?;
        }
        let t1 = tick(&mut c)?;
        let secs = start.elapsed().as_secs_f64();
        let (rt, bulk) = (t1.0 - t0.0, t1.1 - t0.1);
        let share = rt as f64 / (rt + bulk).max(1) as f64;
        let due = q_rt as f64 / (q_rt + q_bulk) as f64;
        eprintln!(
            "  phase {}: rt {:.1} MB/s, bulk {:.1} MB/s, rt share {:.3} (quanta say {:.3})",
            phase + 1,
            rt as f64 / secs / 1e6,
            bulk as f64 / secs / 1e6,
            share,
            due
        );
        rows.push((
            phase + 1,
            how,
            q_rt,
            q_bulk,
            rt as f64 / secs,
            bulk as f64 / secs,
            share,
            due,
        ));
    }
    drop(c);
    drop(serve);
    let mut t = format!(
        "\nbench isolation --tune: DRR shares of the disk while `TUNE disk` changes the quanta \
         ({n} rt + {n} bulk streams, O_DIRECT 1 MiB reads to /dev/null, one disk scheduler, inflight {inflight}, {phase:?} per phase)\n\
         {:<6} {:<58} {:>9} {:>10} {:>9} {:>13}\n",
        "phase",
        "quanta set by",
        "rt MB/s",
        "bulk MB/s",
        "rt share",
        "quanta share",
        n = a.streams,
        inflight = a.inflight,
        phase = a.phase,
    );
    for (phase, how, _, _, rt, bulk, share, due) in &rows {
        t.push_str(&format!(
            "{phase:<6} {how:<58} {:>9.1} {:>10.1} {share:>9.3} {due:>13.3}\n",
            rt / 1e6,
            bulk / 1e6
        ));
    }
    let mut h = crate::out::human(a.json.as_deref());
    writeln!(h, "{t}")?;
    if let Some(p) = &a.json {
        let v: Vec<_> = rows
            .iter()
            .map(|(phase, how, q_rt, q_bulk, rt, bulk, share, due)| {
                serde_json::json!({"phase": phase, "set_by": how, "rt_quantum_mib": q_rt,
                    "bulk_quantum_mib": q_bulk, "rt_bytes_per_s": rt, "bulk_bytes_per_s": bulk,
                    "rt_share": share, "quanta_share": due})
            })
            .collect();
        crate::out::write_json(
            p,
            &serde_json::json!({"bench": "isolation --tune",
                "streams_per_class": a.streams, "inflight": a.inflight,
                "phase_s": a.phase.as_secs_f64(), "kernel_scheduler": kernel_sched.trim(), "rows": v}),
        )?;
    }
    Ok(())
}

pub fn rtu(a: RtuArgs) -> Result<()> {
    if a.upcalls {
        return rtu_upcalls(&a);
    }
    let tmp;
    let dir = match &a.dir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile::Builder::new()
                .prefix("penstock-rtu-")
                .tempdir_in(".")?;
            tmp.path().to_path_buf()
        }
    };
    let periods_ms = [60u64, 75, 120];
    let mut files = Vec::new();
    for p in periods_ms {
        let units = (a.duration.as_millis() as u64).div_ceil(p) + 1;
        let f = dir.join(format!("rtu-{p}ms.bin"));
        make_file(&f, units * a.unit)?;
        files.push((p, f, units));
    }
    let mut lines = Vec::new();
    let mut json = Vec::new();
    for load in ["none", "cpu"] {
        for (order, order_name) in [
            (Order::EarliestDeadline, "edf"),
            (Order::RateMonotonic, "rm"),
        ] {
            let _hogs = crate::periodic::start_hogs(load, Path::new("/dev/null"))?;
            let e = Engine::new(EngineConfig {
                workers: 1,
                pool_buffers: 32,
                buffer_bytes: a.unit as usize,
                stream_depth: 2,
                order,
                admission: roomy_admission(),
                ..EngineConfig::default()
            })?;
            let mut sink = crate::paths::Sink::start()?;
            let mut handles = Vec::new();
            for (p, f, units) in &files {
                evict(f);
                let pacing = Pacing::Periodic {
                    period: Duration::from_millis(*p),
                };
                let mut s = StreamSpec::new(
                    Endpoint::File { path: f.clone() },
                    Endpoint::TcpConnect {
                        host: Host::Ip([127, 0, 0, 1].into()),
                        port: sink.port,
                        local_port: None,
                    },
                );
                s.cache = CachePolicy::Bypass;
                s.pacing = pacing;
                s.unit_bytes = usize::try_from(a.unit)?;
                s.class = Some(DiskClass::Rt);
                s.extent = Extent {
                    offset: 0,
                    length: Some(units * a.unit),
                };
                handles.push((*p, units * a.unit, e.open(s)?));
            }
            let mut results = Vec::new();
            for (p, bytes, h) in handles {
                results.push((p, bytes, h.wait()?));
            }
            // The receiver reports connections as they end, in any order.
            let mut got_all = Vec::new();
            for _ in 0..results.len() {
                got_all.push(sink.received()?);
            }
            for (p, bytes, r) in results {
                let got = got_all
                    .iter()
                    .position(|&g| g == bytes)
                    .map(|i| got_all.swap_remove(i))
                    .unwrap_or(0);
                let l = r
                    .lateness
                    .unwrap_or_else(|| LatenessStats::new(0))
                    .summary();
                let implied = a.unit as f64 / (p as f64 / 1e3) / 1e6;
                // Throughput over the stream's scheduled span: units·period.
                let achieved = bytes as f64 / (r.elapsed.as_secs_f64().max(1e-9)) / 1e6;
                let line = format!(
                    "{load:<5} {order_name:<4} {p:>4} ms {implied:>10.2} {achieved:>10.2} {:>8} {:>8} {:>10.2} {:>10}",
                    l.units,
                    l.misses,
                    l.p99_ns as f64 / 1e6,
                    if got == bytes { "exact" } else { "SHORT" }
                );
                eprintln!("  {line}");
                lines.push(line);
                json.push(serde_json::json!({"load": load, "order": order_name, "period_ms": p,
                    "implied_mb_s": implied, "achieved_mb_s": achieved, "units": l.units, "misses": l.misses,
                    "p99_ms": l.p99_ns as f64 / 1e6, "received_exact": got == bytes}));
            }
        }
    }
    let mut h = crate::out::human(a.json.as_deref());
    writeln!(
        h,
        "\nbench rtu (MARS Table 3): three periodic streams of {} B units, O_DIRECT, TCP to a receiver process\n\
         {:<5} {:<4} {:>7} {:>10} {:>10} {:>8} {:>8} {:>10} {:>10}\n{}",
        a.unit,
        "load",
        "order",
        "period",
        "MB/s due",
        "MB/s got",
        "units",
        "misses",
        "p99 ms",
        "bytes",
        lines.join("\n")
    )?;
    if let Some(p) = &a.json {
        crate::out::write_json(p, &serde_json::json!({"bench": "rtu", "rows": json}))?;
    }
    Ok(())
}

/// Uses `cpu` of the calling thread's CPU time (an upcall's work, whatever the machine).
fn burn(cpu: Duration) {
    let t0 = clock::thread_cpu_ns();
    let mut x = 0u64;
    while clock::thread_cpu_ns().saturating_sub(t0) < cpu.as_nanos() as u64 {
        x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
    }
}

/// The upcalls' periods: MARS Table 3's.
const UPCALL_PERIODS_MS: [u64; 3] = [60, 75, 120];

/// `bench rtu --upcalls`: see `RtuArgs::upcalls`.
fn rtu_upcalls(a: &RtuArgs) -> Result<()> {
    const STREAM_UNIT: u64 = 1024;
    let stream_period = Duration::from_nanos(1_000_000_000 / 30);
    if a.work > a.budget {
        eprintln!(
            "penstock bench rtu --upcalls: --work {:?} is above --budget {:?}: every activation will overrun",
            a.work, a.budget
        );
    }
    let tmp;
    let dir = match &a.dir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile::Builder::new()
                .prefix("penstock-rtu-")
                .tempdir_in(".")?;
            tmp.path().to_path_buf()
        }
    };
    let units = (a.duration.as_nanos() / stream_period.as_nanos()) as u64 + 1;
    let file = dir.join("stamped.bin");
    crate::periodic::make_source(&file, units, STREAM_UNIT)?;
    let _rmem = crate::periodic::RmemMax::raise();
    let n = a.streams;
    let mut upcall_rows = Vec::new();
    let mut run_rows = Vec::new();
    let mut json_rows = Vec::new();
    let mut json_runs = Vec::new();
    for load in ["none", "cpu"] {
        for (order, order_name) in [
            (Order::EarliestDeadline, "edf"),
            (Order::RateMonotonic, "rm"),
        ] {
            let _hogs = crate::periodic::start_hogs(load, Path::new("/dev/null"))?;
            let e = Engine::new(EngineConfig {
                workers: 1,
                pool_buffers: (n * 2 + 8).min(penstock_driver::sys::POOL_BUFFERS_MAX),
                buffer_bytes: 16 * 1024,
                stream_depth: 2,
                streams_max: n + 16,
                order,
                ..EngineConfig::default()
            })?;
            let rx = crate::periodic::Receiver::start(units, false)?;
            let slack = Duration::from_millis(300) + Duration::from_micros(100) * n as u32;
            let t0 = clock::now() + slack;
            let mut rtus = Vec::new();
            for p in UPCALL_PERIODS_MS {
                let mut spec = RtuSpec::new(Duration::from_millis(p), a.budget);
                spec.start_at = Some(t0);
                let work = a.work;
                rtus.push(e.rtu_create(spec, Box::new(move |_| burn(work)))?);
            }
            // The planner's schedule of these streams, for the lateness figures.
            let pacing = Pacing::Periodic {
                period: stream_period,
            };
            let schedule = plan_schedule(&pacing, Some(STREAM_UNIT), true, 16 * 1024)?
                .expect("a periodic schedule");
            let mut streams = Vec::with_capacity(n);
            for i in 0..n {
                let mut s = StreamSpec::new(
                    Endpoint::File { path: file.clone() },
                    Endpoint::UdpSend {
                        host: Host::Ip([127, 0, 0, 1].into()),
                        port: rx.port,
                        local_port: None,
                    },
                );
                s.unit_bytes = STREAM_UNIT as usize;
                s.zero_copy = ZeroCopy::Off;
                s.pacing = pacing.clone();
                s.extent = Extent {
                    offset: 0,
                    length: Some(units * STREAM_UNIT),
                };
                s.start_at = Some(t0 + stream_period.mul_f64(i as f64 / n.max(1) as f64));
                match e.open(s) {
                    Ok(h) => streams.push(h),
                    Err(err) => {
                        rx.abandon();
                        return Err(err.into());
                    }
                }
            }
            let mut note = String::new();
            if clock::now() > t0 {
                note.push_str("opening took longer than the start slack; ");
            }
            while clock::now() < t0 {
                std::thread::sleep(Duration::from_millis(5));
            }
            let c0 = cpu_times(CpuWho::Process);
            let mut stream_stats = LatenessStats::for_schedule(&schedule, None);
            let mut sent = 0;
            for h in streams {
                let r = h.wait()?;
                sent += r.units;
                if let Some(l) = &r.lateness {
                    stream_stats.merge(l);
                }
            }
            let elapsed_ns = clock::now().as_nanos() - t0.as_nanos();
            let c1 = cpu_times(CpuWho::Process);
            let mut reports = Vec::new();
            for h in rtus {
                reports.push(h.stop()?);
            }
            let got = rx.finish()?;
            let cpu_s = (c1.user_ns + c1.sys_ns - c0.user_ns - c0.sys_ns) as f64 / 1e9;
            let secs = elapsed_ns as f64 / 1e9;
            let upcall_cpu_s: f64 = reports.iter().map(|r| r.cpu_total.as_secs_f64()).sum();
            for (p, r) in UPCALL_PERIODS_MS.iter().zip(&reports) {
                let l = r.lateness.summary();
                let periods = elapsed_ns as f64 / (*p as f64 * 1e6);
                let line = format!(
                    "{load:<5} {order_name:<5} {p:>4} ms {periods:>8.1} {:>11} {:>9} {:>7} {:>8} {:>9.1} {:>9.1} {:>9.1} {:>11.1} {:>11.1}",
                    r.activations,
                    r.overruns,
                    l.misses,
                    r.skipped,
                    l.p50_ns as f64 / 1e3,
                    l.p99_ns as f64 / 1e3,
                    l.max_ns as f64 / 1e3,
                    r.cpu_max.as_secs_f64() * 1e6,
                    r.wall_max.as_secs_f64() * 1e6,
                );
                eprintln!("  {line}");
                upcall_rows.push(line);
                json_rows.push(serde_json::json!({"load": load, "order": order_name, "period_ms": p,
                    "periods": periods, "activations": r.activations, "overruns": r.overruns,
                    "misses": l.misses, "miss_after_ns": l.miss_after_ns, "skipped": r.skipped,
                    "lateness_p50_ns": l.p50_ns, "lateness_p99_ns": l.p99_ns, "lateness_max_ns": l.max_ns,
                    "cpu_max_ns": r.cpu_max.as_nanos() as u64, "wall_max_ns": r.wall_max.as_nanos() as u64,
                    "cpu_total_ns": r.cpu_total.as_nanos() as u64}));
            }
            let s = stream_stats.summary();
            let lost = got["lost"].as_u64().unwrap_or(0);
            let received = got["received"].as_u64().unwrap_or(0);
            let line = format!(
                "{load:<5} {order_name:<5} {:>9} {:>9} {:>7} {:>9.1} {:>9.1} {:>9} {:>6} {:>12.1} {:>12.1}  {}",
                sent,
                units * n as u64,
                s.misses,
                s.p99_ns as f64 / 1e3,
                s.max_ns as f64 / 1e3,
                received,
                lost,
                cpu_s / secs * 100.0,
                upcall_cpu_s / secs * 100.0,
                note.trim_end_matches("; "),
            );
            eprintln!("  {line}");
            run_rows.push(line);
            json_runs.push(
                serde_json::json!({"load": load, "order": order_name, "seconds": secs,
                "stream_units_sent": sent, "stream_units_due": units * n as u64,
                "stream_misses": s.misses, "stream_p99_ns": s.p99_ns, "stream_max_ns": s.max_ns,
                "received": received, "lost": lost, "process_cpu_percent": cpu_s / secs * 100.0,
                "upcalls_cpu_percent": upcall_cpu_s / secs * 100.0, "note": note}),
            );
        }
    }
    // An over-committed set: MARS's periods, each asking a third of its period.
    let e = Engine::new(EngineConfig {
        workers: 1,
        ..EngineConfig::default()
    })?;
    let mut over = Vec::new();
    let mut json_over = Vec::new();
    let mut held = Vec::new();
    for p in UPCALL_PERIODS_MS {
        let spec = RtuSpec::new(Duration::from_millis(p), Duration::from_millis(p / 3));
        let outcome = match e.rtu_create(spec, Box::new(|_| {})) {
            Ok(h) => {
                held.push(h);
                "admitted".to_string()
            }
            Err(err) => err.to_string(),
        };
        over.push(format!("  {p} ms / {} ms: {outcome}", p / 3));
        json_over.push(serde_json::json!({"period_ms": p, "budget_ms": p / 3, "outcome": outcome}));
    }
    for h in held {
        h.stop()?;
    }
    let cpu = EngineConfig::default().cpu;
    let mut h = crate::out::human(a.json.as_deref());
    writeln!(
        h,
        "\nbench rtu --upcalls (MARS §4.5, Table 3's periods as Real-Time Upcalls): three upcalls using {:?} of CPU per activation \
         within a {:?} budget, on one engine worker beside {n} paced UDP streams (1 KiB at 30/s), {:?} per run\n\
         (lateness: release → start of the callback; a miss starts later than period − budget; an overrun uses more CPU than the budget)\n\
         {:<5} {:<5} {:>7} {:>8} {:>11} {:>9} {:>7} {:>8} {:>9} {:>9} {:>9} {:>11} {:>11}\n{}\n\n\
         the streams of each run (misses: later than one period; CPU: the process's, against admission's stream reserve {}% + the upcalls' declared {:.1}%)\n\
         {:<5} {:<5} {:>9} {:>9} {:>7} {:>9} {:>9} {:>9} {:>6} {:>12} {:>12}\n{}\n\n\
         an over-committed set (each upcall asks a third of its period), created in turn on one worker:\n{}",
        a.work,
        a.budget,
        a.duration,
        "load",
        "order",
        "period",
        "periods",
        "activations",
        "overruns",
        "misses",
        "skipped",
        "p50 µs",
        "p99 µs",
        "max µs",
        "cpu max µs",
        "wall max µs",
        upcall_rows.join("\n"),
        cpu.stream_reserve_percent,
        UPCALL_PERIODS_MS
            .iter()
            .map(|p| a.budget.as_secs_f64() / (*p as f64 / 1e3))
            .sum::<f64>()
            * 100.0,
        "load",
        "order",
        "units",
        "due",
        "misses",
        "p99 µs",
        "max µs",
        "received",
        "lost",
        "process CPU%",
        "upcalls CPU%",
        run_rows.join("\n"),
        over.join("\n"),
    )?;
    if let Some(p) = &a.json {
        crate::out::write_json(
            p,
            &serde_json::json!({"bench": "rtu --upcalls", "streams": n, "duration_s": a.duration.as_secs_f64(),
                "budget_ns": a.budget.as_nanos() as u64, "work_ns": a.work.as_nanos() as u64,
                "upcalls": json_rows, "runs": json_runs, "overcommitted": json_over}),
        )?;
    }
    Ok(())
}
