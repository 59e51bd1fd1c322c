//! `penstock bench admission` (issue 22): is admission both safe and tight?
//!
//! rt streams of real media — an ffmpeg-made 8 Mbit/s MPEG-TS (CBR mux), one file per stream,
//! cold cache (each file written, synced and dropped from the page cache with
//! `posix_fadvise(DONTNEED)` before every run), read through the engine's disk scheduler, sent
//! as UDP datagrams to a loopback receiver — are opened one by one with the engine's own
//! admission until it refuses: `N_adm`. The `N_adm` admitted streams then run for
//! `--duration` beside `--bulk-readers` bulk streams reading other files with O_DIRECT
//! through the same scheduler: they must miss nothing (lateness p99 reported). Then more are
//! *forced* in — an engine whose admission capacity no stream set reaches, built here and
//! reachable from nowhere else (the server and the CLI always test against the measured or
//! configured figures) — growing until units miss their deadlines: `N_miss`. The ratio
//! `N_adm / N_miss` says how tight the test is (goal ≥ 0.9: it admits nearly all the machine
//! can carry, and never what it cannot). Done per unit size (`--units`, 1316-byte datagrams
//! and 1 MiB units by default).
//!
//! Admission's figures: the device is self-calibrated (no calibration file, the engine's
//! first-use measurement); `N_adm` is also counted (admission only, nothing run) with the
//! figures of a full calibration (`penstock calibrate --quick` on the same directory), and
//! the two are compared (the issue asks for them within 2×).
//!
//! Stream phases are spread over one period (64 offsets), as independent sessions start; with
//! `--synchronized` every deadline coincides (the critical instant).
//!
//! `--streams-max` bounds the ramp (disk space: each stream has its own file of
//! `rate × (duration + lead)` bytes); when admission admits that many, `N_adm` is reported
//! as at least that and no ratio is claimed.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use penstock_core::admission::{AdmissionConfig, Capacity};
use penstock_core::endpoint::Endpoint;
use penstock_core::lateness::LatenessStats;
use penstock_core::schedule::{Schedule, ScheduleLimits, ScheduleSpec};
use penstock_core::stream::CachePolicy;
use penstock_core::units::{Rate, parse_duration, parse_size};
use penstock_driver::calibration::{CalibrateOptions, SelfCalibration, calibrate};
use penstock_driver::{DiskClass, Engine, EngineConfig, StreamError, StreamHandle, StreamSpec};

#[derive(Args, Debug)]
pub struct AdmissionArgs {
    /// How long the admitted (and then the forced) stream sets run.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub duration: Duration,
    /// A short run: 10 s per run.
    #[arg(long)]
    pub quick: bool,
    /// Unit sizes to test (one datagram each).
    #[arg(long, default_value = "1316,1MiB", value_delimiter = ',', value_parser = parse_size)]
    pub units: Vec<u64>,
    /// The streams' rate (the TS is muxed at this rate), in bits per second.
    #[arg(long, default_value = "8000000")]
    pub rate_bits_per_s: u64,
    /// Bulk readers beside the rt streams (O_DIRECT burst streams of their own files).
    #[arg(long, default_value_t = 2)]
    pub bulk_readers: usize,
    /// Most rt streams opened (each has a file of its own on the disk).
    #[arg(long, default_value_t = 160)]
    pub streams_max: usize,
    /// A unit is a miss when sent later than this after its deadline (a receiver's jitter
    /// buffer; the engine's own default, one period, is 1.3 ms for 1316-byte units at
    /// 8 Mbit/s — below this VM's timer noise). The lateness p99 and maximum are reported
    /// besides.
    #[arg(long, default_value = "50ms", value_parser = parse_duration)]
    pub miss_after: Duration,
    /// Start every stream at the same instant (the critical instant: all deadlines
    /// coincide) instead of spreading their phases over one period as independent sessions
    /// would.
    #[arg(long)]
    pub synchronized: bool,
    /// Engine workers.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Forced runs at most, after the admitted one.
    #[arg(long, default_value_t = 4)]
    pub force_steps: usize,
    /// Directory for the test files (on the disk to measure); removed at the end.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Write the results as JSON here.
    /// A bare `--json` writes it on stdout (the table then goes to stderr).
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
}

/// Pool buffers per worker: room for every stream's reservation, so that admission's
/// buffer test (and not the pool) is what binds.
const POOL_BUFFERS: usize = 512;
const BUFFER_BYTES: usize = 1 << 20;

/// One run of a stream set.
#[derive(Debug, Clone, Copy, Default)]
struct RunResult {
    streams: usize,
    units: u64,
    misses: u64,
    p99_ns: u64,
    max_ns: u64,
    /// Streams that failed (other than by missing deadlines).
    failed: usize,
}

struct Bench<'a> {
    a: &'a AdmissionArgs,
    dir: PathBuf,
    ts: PathBuf,
    file_bytes: u64,
    files: Vec<PathBuf>,
    bulk_files: Vec<PathBuf>,
    /// Datagram target (units that fit one) and stream target (larger units).
    udp: Endpoint,
    tcp: Endpoint,
    rate_bytes_per_s: u64,
}

impl Bench<'_> {
    fn file(&mut self, i: usize) -> Result<PathBuf> {
        while self.files.len() <= i {
            let p = self.dir.join(format!("s{:04}.ts", self.files.len()));
            std::fs::copy(&self.ts, &p).with_context(|| format!("copying to {}", p.display()))?;
            std::fs::File::open(&p)?.sync_all()?;
            self.files.push(p);
        }
        Ok(self.files[i].clone())
    }

    fn evict_all(&self) {
        for f in self.files.iter().chain(&self.bulk_files) {
            evict(f);
        }
    }

    fn spec(&self, file: &Path, unit: u64, start_at: penstock_core::time::Instant) -> StreamSpec {
        let schedule = Schedule::new(
            &ScheduleSpec::Rate {
                rate: Rate::BitsPerSecond(self.a.rate_bits_per_s),
                unit_bytes: unit,
            },
            &ScheduleLimits::new(BUFFER_BYTES as u64),
        )
        .expect("a valid rate and unit");
        StreamSpec {
            schedule: Some(schedule),
            class: Some(DiskClass::Rt),
            cache: CachePolicy::Keep,
            start_at: Some(start_at),
            miss_after: Some(self.a.miss_after),
            extent: penstock_core::stream::Extent {
                offset: 0,
                length: Some(self.rate_bytes_per_s * self.a.duration.as_secs().max(1)),
            },
            ..StreamSpec::new(
                Endpoint::File {
                    path: file.to_path_buf(),
                },
                if unit <= penstock_core::stream::plan::DATAGRAM_BYTES_MAX {
                    self.udp.clone()
                } else {
                    self.tcp.clone()
                },
            )
        }
    }

    /// Opens streams one by one until `engine` refuses (or `limit` are open): the handles,
    /// and the refusal.
    fn ramp(
        &mut self,
        engine: &Engine,
        unit: u64,
        limit: usize,
        start_at: penstock_core::time::Instant,
    ) -> Result<(Vec<StreamHandle>, Option<String>)> {
        let mut handles = Vec::new();
        // One period of the stream (a unit at the rate), in ns: phases spread over it.
        let period_ns = u128::from(unit) * 1_000_000_000 / u128::from(self.rate_bytes_per_s.max(1));
        for i in 0..limit {
            let f = self.file(i)?;
            let phase = if self.a.synchronized {
                Duration::ZERO
            } else {
                Duration::from_nanos((period_ns * (i as u128 % 64) / 64) as u64)
            };
            match engine.open(self.spec(&f, unit, start_at + phase)) {
                Ok(h) => handles.push(h),
                Err(StreamError::Refused(r)) => return Ok((handles, Some(r.to_string()))),
                // The pool or the engine's own limits: no further stream can be placed.
                Err(e) => return Ok((handles, Some(format!("not placed: {e}")))),
            }
        }
        Ok((handles, None))
    }

    /// Runs `handles` (due at `start_at`) to their end beside the bulk readers.
    fn run(
        &self,
        engine: &Arc<Engine>,
        handles: Vec<StreamHandle>,
        start_at: penstock_core::time::Instant,
    ) -> Result<RunResult> {
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = self
            .bulk_files
            .iter()
            .map(|f| {
                let (engine, stop, f) = (engine.clone(), stop.clone(), f.clone());
                std::thread::spawn(move || {
                    let wait = start_at.signed_nanos_since(penstock_driver::clock::now());
                    if wait > 0 {
                        std::thread::sleep(Duration::from_nanos(wait as u64));
                    }
                    while !stop.load(Ordering::Relaxed) {
                        let spec = StreamSpec {
                            class: Some(DiskClass::Bulk),
                            cache: CachePolicy::Bypass,
                            ..StreamSpec::new(
                                Endpoint::File { path: f.clone() },
                                Endpoint::File {
                                    path: PathBuf::from("/dev/null"),
                                },
                            )
                        };
                        let Ok(h) = engine.open(spec) else { break };
                        let _ = h.wait();
                    }
                })
            })
            .collect();
        let mut r = RunResult {
            streams: handles.len(),
            ..RunResult::default()
        };
        let mut all = LatenessStats::new(1);
        let mut first = true;
        for h in handles {
            match h.wait() {
                Ok(rep) => {
                    if let Some(l) = rep.lateness {
                        if first {
                            all = l;
                            first = false;
                        } else {
                            all.merge(&l);
                        }
                    }
                }
                Err(_) => r.failed += 1,
            }
        }
        stop.store(true, Ordering::Relaxed);
        for t in readers {
            let _ = t.join();
        }
        if !first {
            r.units = all.units();
            r.misses = all.misses();
            r.p99_ns = all.p99_ns();
            r.max_ns = all.max_ns();
        }
        Ok(r)
    }
}

fn evict(path: &Path) {
    if let Ok(f) = std::fs::File::open(path) {
        let _ = rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed);
    }
}

fn make_ts(path: &Path, seconds: u64, rate_bits_per_s: u64) -> Result<()> {
    let rate = rate_bits_per_s.to_string();
    let video = (rate_bits_per_s * 3 / 4).to_string();
    let status = std::process::Command::new("ffmpeg")
        .args(["-loglevel", "error", "-y", "-f", "lavfi"])
        .args([
            "-i",
            "testsrc=size=640x360:rate=25",
            "-t",
            &seconds.to_string(),
        ])
        .args(["-c:v", "mpeg2video", "-b:v", &video, "-maxrate", &video])
        .args(["-bufsize", "1M", "-muxrate", &rate, "-f", "mpegts"])
        .arg(path)
        .status()
        .context("running ffmpeg (needed to make the media)")?;
    if !status.success() {
        bail!("ffmpeg failed making {}", path.display());
    }
    Ok(())
}

fn make_bulk_file(path: &Path, bytes: u64) -> Result<()> {
    let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let mut block = vec![0u8; 1 << 20];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for b in block.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    for _ in 0..bytes.div_ceil(1 << 20) {
        f.write_all(&block)?;
    }
    f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    Ok(())
}

fn capacity(workers: usize, pool_total: u32) -> Capacity {
    Capacity {
        // Loopback: the network is not what binds; the CPU (sends) is charged apart.
        net_bytes_per_s: 1_250_000_000,
        buffer_count: pool_total,
        buffer_bytes: BUFFER_BYTES as u64,
        cpu_ns_per_s: 1_000_000_000 * workers as u64,
        ..Capacity::CONSERVATIVE
    }
}

fn engine_config(a: &AdmissionArgs, admission: AdmissionConfig, cache: &Path) -> EngineConfig {
    EngineConfig {
        workers: a.workers,
        pool_buffers: POOL_BUFFERS,
        buffer_bytes: BUFFER_BYTES,
        stream_depth: 4,
        client_buffers_max: 8,
        streams_max: 4096,
        admission,
        self_calibration: SelfCalibration {
            enabled: true,
            cache_dir: Some(cache.to_path_buf()),
            ..SelfCalibration::default()
        },
        ..EngineConfig::default()
    }
}

/// The bench-only override: a capacity no stream set here reaches, so that streams beyond
/// what admission allows can be run. Built only in this module.
fn forced_admission(workers: usize, pool_total: u32) -> AdmissionConfig {
    AdmissionConfig {
        capacity: Capacity {
            disk_seq_bytes_per_s: 1 << 50,
            disk_random_iops: 1 << 40,
            disk_source: penstock_core::admission::FigureSource::Configured,
            net_bytes_per_s: 1 << 50,
            cpu_send_ns: 0,
            ..capacity(workers, pool_total)
        },
        bulk_share_percent: 0,
        streams_max: 65_536,
        rt_latency_ns: 0,
    }
}

pub fn run(mut a: AdmissionArgs) -> Result<()> {
    if a.quick {
        a.duration = Duration::from_secs(10);
    }
    let mut out = crate::out::human(a.json.as_deref());
    let dir = a
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(".penstock-bench-admission"));
    std::fs::create_dir_all(&dir)?;
    let cache = dir.join("cache");
    let _ = std::fs::remove_dir_all(&cache);
    let rate_bytes_per_s = a.rate_bits_per_s / 8;
    let lead = Duration::from_secs(2) + Duration::from_millis(20) * a.streams_max as u32;
    let ts = dir.join("media.ts");
    let seconds = a.duration.as_secs() + 2;
    make_ts(&ts, seconds, a.rate_bits_per_s)?;
    let file_bytes = std::fs::metadata(&ts)?.len();
    if file_bytes < rate_bytes_per_s * a.duration.as_secs() {
        bail!(
            "ffmpeg made {file_bytes} bytes, less than {} s at the rate",
            a.duration.as_secs()
        );
    }
    let mut bulk_files = Vec::new();
    for i in 0..a.bulk_readers {
        let p = dir.join(format!("bulk{i}.bin"));
        make_bulk_file(&p, 256 << 20)?;
        bulk_files.push(p);
    }
    let rx = std::net::UdpSocket::bind("127.0.0.1:0")?;
    let target = Endpoint::parse(
        &format!("udp://{}", rx.local_addr()?),
        penstock_core::endpoint::Role::Target,
    )?;
    // Units larger than a datagram go over TCP: one connection per stream, each drained by a
    // thread of its own.
    let tcp_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let tcp = Endpoint::parse(
        &format!("tcp://{}", tcp_listener.local_addr()?),
        penstock_core::endpoint::Role::Target,
    )?;
    std::thread::spawn(move || {
        for conn in tcp_listener.incoming() {
            let Ok(mut c) = conn else { break };
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 16];
                while matches!(std::io::Read::read(&mut c, &mut buf), Ok(n) if n > 0) {}
            });
        }
    });
    let draining = Arc::new(AtomicBool::new(true));
    let drain = {
        let draining = draining.clone();
        rx.set_read_timeout(Some(Duration::from_millis(100)))?;
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 65_536];
            while draining.load(Ordering::Relaxed) {
                let _ = rx.recv(&mut buf);
            }
        })
    };
    let mut b = Bench {
        a: &a,
        dir: dir.clone(),
        ts,
        file_bytes,
        files: Vec::new(),
        bulk_files,
        udp: target,
        tcp,
        rate_bytes_per_s,
    };
    let pool_total = (POOL_BUFFERS * a.workers) as u32;
    let admission = AdmissionConfig {
        capacity: capacity(a.workers, pool_total),
        bulk_share_percent: 20,
        streams_max: 4096,
        rt_latency_ns: 0,
    };

    // The full calibration, for the comparison of N_adm.
    let cal = calibrate(
        &dir,
        &CalibrateOptions {
            file_bytes: 256 << 20,
            random_time: Duration::from_millis(500),
        },
    )
    .context("penstock calibrate --quick on the bench directory")?;
    let mut cal = cal;
    if let Ok(ns) = engine_send_ns(Duration::from_millis(500)) {
        cal.send_ns = Some(cal.send_ns.unwrap_or(0).max(ns));
    }
    let mut cal_capacity = cal.capacity(1_250_000_000, pool_total, BUFFER_BYTES as u64);
    cal_capacity.cpu_ns_per_s = 1_000_000_000 * a.workers as u64;
    writeln!(
        out,
        "penstock bench admission: {} Mbit/s TS ({} bytes a file, one file per stream, cold cache), {} workers, {} bulk readers, {} s runs, miss = later than {:?}",
        a.rate_bits_per_s as f64 / 1e6,
        b.file_bytes,
        a.workers,
        a.bulk_readers,
        a.duration.as_secs(),
        a.miss_after
    )?;
    writeln!(
        out,
        "calibration (--quick): {:.0} MB/s sequential, 64 KiB random {} IOPS, send {} ns",
        cal_capacity.disk_seq_bytes_per_s as f64 / 1e6,
        cal_capacity.disk_random_iops,
        cal_capacity.cpu_send_ns
    )?;
    let mut rows = Vec::new();
    for &unit in &a.units.clone() {
        // 1. Admission with self-calibration (no calibration file): ramp, then run.
        b.evict_all();
        let engine = Arc::new(Engine::new(engine_config(&a, admission, &cache))?);
        // Measured through a file of 256 MiB on the same device (the device node may not be
        // readable here); the first rt admission would measure through the stream's own file.
        let probe = match b.bulk_files.first() {
            Some(f) => f.clone(),
            None => {
                let p = dir.join("probe.bin");
                make_bulk_file(&p, 64 << 20)?;
                p
            }
        };
        let probe_fd = std::fs::File::open(&probe)?;
        let figures = engine.self_calibrate(std::os::fd::AsFd::as_fd(&probe_fd));
        match &figures {
            Some(Ok(f)) => writeln!(
                out,
                "self-calibration: {:.0} MB/s sequential, 64 KiB random {} IOPS ({})",
                f.disk.seq_bytes_per_s as f64 / 1e6,
                f.disk.random_iops,
                f.source
            )?,
            Some(Err(why)) => writeln!(out, "self-calibration failed: {why}")?,
            None => writeln!(out, "self-calibration off")?,
        }
        let start_at = penstock_driver::clock::now() + lead;
        let (handles, refusal) = b.ramp(&engine, unit, a.streams_max, start_at)?;
        let n_adm = handles.len();
        let reserved = handles.first().and_then(|h| h.reservation());
        let admitted = b.run(&engine, handles, start_at)?;
        drop(engine);
        // 2. N_adm with the full calibration's figures (admission only).
        let cal_engine = Engine::new(engine_config(
            &a,
            AdmissionConfig {
                capacity: cal_capacity,
                ..admission
            },
            &cache,
        ))?;
        let far = penstock_driver::clock::now() + Duration::from_secs(3600);
        let (cal_handles, _) = b.ramp(&cal_engine, unit, a.streams_max, far)?;
        let n_adm_cal = cal_handles.len();
        for h in &cal_handles {
            h.cancel();
        }
        drop(cal_handles);
        drop(cal_engine);
        writeln!(
            out,
            "unit {unit} B: N_adm {}{} ({}), calibrated N_adm {}{}; admitted set: {} units, {} misses, lateness p99 {:.2} ms, max {:.2} ms, {} failed",
            n_adm,
            if refusal.is_none() { "+" } else { "" },
            refusal
                .as_deref()
                .unwrap_or("the ramp's limit, not a refusal"),
            n_adm_cal,
            if n_adm_cal >= a.streams_max { "+" } else { "" },
            admitted.units,
            admitted.misses,
            admitted.p99_ns as f64 / 1e6,
            admitted.max_ns as f64 / 1e6,
            admitted.failed
        )?;
        if let Some(r) = &reserved {
            writeln!(
                out,
                "  one stream reserves: disk {:.3} ms/s, network {:.3} MB/s, {} buffers, cpu {:.3} ms/s; figures: {}",
                r.disk_ns_per_s as f64 / 1e6,
                r.net_bytes_per_s as f64 / 1e6,
                r.buffers,
                r.cpu_ns_per_s as f64 / 1e6,
                r.figures()
            )?;
        }
        // 3. Forced: more than admission allows, until units miss.
        let mut forced = Vec::new();
        let mut n_miss = None;
        if refusal.is_some() {
            let mut n = n_adm + (n_adm / 10).max(1);
            for _ in 0..a.force_steps {
                if n > a.streams_max {
                    break;
                }
                b.evict_all();
                let engine = Arc::new(Engine::new(engine_config(
                    &a,
                    forced_admission(a.workers, pool_total),
                    &cache,
                ))?);
                let start_at = penstock_driver::clock::now() + lead;
                let (handles, refused) = b.ramp(&engine, unit, n, start_at)?;
                if let Some(why) = refused {
                    writeln!(
                        out,
                        "  forced {n}: the engine placed only {} ({why}); stopping",
                        handles.len()
                    )?;
                    for h in &handles {
                        h.cancel();
                    }
                    break;
                }
                let r = b.run(&engine, handles, start_at)?;
                writeln!(
                    out,
                    "  forced {n}: {} units, {} misses, lateness p99 {:.2} ms, max {:.2} ms, {} failed",
                    r.units,
                    r.misses,
                    r.p99_ns as f64 / 1e6,
                    r.max_ns as f64 / 1e6,
                    r.failed
                )?;
                forced.push(r);
                if r.misses > 0 || r.failed > 0 {
                    n_miss = Some(n);
                    break;
                }
                n += (n / 4).max(1);
            }
        }
        // A ratio only for an admitted set that missed nothing: otherwise admission was not
        // safe here, and that is the result.
        let safe = admitted.misses == 0 && admitted.failed == 0;
        if !safe {
            writeln!(
                out,
                "  UNSAFE: the admitted set itself missed deadlines ({} of {} units)",
                admitted.misses, admitted.units
            )?;
        }
        let ratio = n_miss.filter(|_| safe).map(|m| n_adm as f64 / m as f64);
        writeln!(
            out,
            "  N_adm / N_miss: {}",
            match (ratio, n_miss) {
                (Some(r), Some(m)) => format!("{n_adm} / {m} = {r:.2}"),
                _ if !safe => "none (the admitted set missed)".into(),
                _ => "not measured (no misses up to the forced runs' limit, or no refusal)".into(),
            }
        )?;
        rows.push(serde_json::json!({
            "unit_bytes": unit,
            "n_adm": n_adm,
            "n_adm_is_limit": refusal.is_none(),
            "refusal": refusal,
            "n_adm_calibrated": n_adm_cal,
            "figures": figures.map(|f| match f {
                Ok(f) => format!("{:?}", f),
                Err(e) => e,
            }),
            "admitted": {"streams": admitted.streams, "units": admitted.units, "misses": admitted.misses,
                "p99_ns": admitted.p99_ns, "max_ns": admitted.max_ns, "failed": admitted.failed},
            "forced": forced.iter().map(|r| serde_json::json!({"streams": r.streams, "units": r.units,
                "misses": r.misses, "p99_ns": r.p99_ns, "max_ns": r.max_ns, "failed": r.failed})).collect::<Vec<_>>(),
            "n_miss": n_miss,
            "admitted_set_safe": safe,
            "ratio": ratio,
        }));
    }
    draining.store(false, Ordering::Relaxed);
    let _ = drain.join();
    let _ = std::fs::remove_dir_all(&dir);
    if let Some(dest) = a.json.as_deref() {
        crate::out::write_json(
            dest,
            &serde_json::json!({
                "bench": "admission",
                "rate_bits_per_s": a.rate_bits_per_s,
                "duration_s": a.duration.as_secs(),
                "workers": a.workers,
                "bulk_readers": a.bulk_readers,
                "miss_after_ns": a.miss_after.as_nanos() as u64,
                "synchronized": a.synchronized,
                "calibration": {
                    "seq_bytes_per_s": cal_capacity.disk_seq_bytes_per_s,
                    "random_iops": cal_capacity.disk_random_iops,
                    "send_ns": cal_capacity.cpu_send_ns,
                },
                "rows": rows,
            }),
        )?;
    }
    Ok(())
}

/// CPU time per unit of 32 paced UDP streams of 1316-byte units at 8 Mbit/s from memory-cached
/// data to a loopback socket nobody reads (its queue full, datagrams dropped: the receive
/// path's cost stays with the sender, no reader's), over `time`: the process's CPU time over
/// the units sent.
pub fn engine_send_ns(time: Duration) -> Result<u64> {
    use penstock_core::endpoint::Endpoint;
    use penstock_core::schedule::{Schedule, ScheduleLimits, ScheduleSpec};
    use penstock_core::units::Rate;
    use penstock_driver::clock::{CpuWho, cpu_times};
    use penstock_driver::{Engine, EngineConfig, StreamSpec};
    let dir = tempfile::tempdir()?;
    let src = dir.path().join("units.bin");
    let bytes = 1_000_000 * time.as_secs_f64().ceil() as u64 + (1 << 20);
    std::fs::write(&src, vec![0x47u8; bytes as usize])?;
    let rx = std::net::UdpSocket::bind("127.0.0.1:0")?;
    let target = Endpoint::parse(
        &format!("udp://{}", rx.local_addr()?),
        penstock_core::endpoint::Role::Target,
    )?;
    let engine = Engine::new(EngineConfig {
        workers: 1,
        ..EngineConfig::default()
    })?;
    let schedule = Schedule::new(
        &ScheduleSpec::Rate {
            rate: Rate::BitsPerSecond(8_000_000),
            unit_bytes: 1316,
        },
        &ScheduleLimits::new(1 << 20),
    )?;
    let length = 1_000_000 * time.as_millis() as u64 / 1000;
    let cpu0 = cpu_times(CpuWho::Process);
    let mut handles = Vec::new();
    for _ in 0..32 {
        handles.push(engine.open(StreamSpec {
            schedule: Some(schedule),
            extent: penstock_core::stream::Extent {
                offset: 0,
                length: Some(length),
            },
            ..StreamSpec::new(Endpoint::File { path: src.clone() }, target.clone())
        })?);
    }
    let mut units = 0;
    for h in handles {
        units += h.wait()?.units;
    }
    let cpu1 = cpu_times(CpuWho::Process);
    drop(rx);
    let used = (cpu1.user_ns + cpu1.sys_ns).saturating_sub(cpu0.user_ns + cpu0.sys_ns);
    Ok(used / units.max(1))
}
