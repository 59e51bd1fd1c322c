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
//! Every stream's first unit is due at the same instant, so that one unit of each falls due
//! together every period: the critical instant, which admission's burst test promises to
//! carry within the lateness tolerance (`--miss-after`, which is also the tolerance the
//! engine's admission is configured with); `--spread` spreads the phases over one period
//! (64 offsets) instead, as independent sessions would start.
//!
//! `--loop-volume`: the streams read partitions of a volume striped over 4 loop devices, each
//! throttled (`--loop-rate`, `--loop-iops`) by a cgroup this process moves into (cgroup v1
//! `blkio.throttle.read_{bps,iops}_device`, or v2 `io.max`), so that the disk, not the CPU,
//! binds. Each member is self-calibrated through its device node on the first admission.
//! Loop devices and the cgroup are removed on every exit that unwinds (as `bench stripe`).
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
use penstock_core::endpoint::{PartitionName, VolumeName};
use penstock_core::lateness::LatenessStats;
use penstock_core::stream::CachePolicy;
use penstock_core::units::{Rate, parse_duration, parse_size};
use penstock_core::volume::Placement;
use penstock_core::volume::layout::BLOCK_BYTES_DEFAULT;
use penstock_driver::calibration::{CalibrateOptions, SelfCalibration, calibrate};
use penstock_driver::open::{open_target, opened_partition};
use penstock_driver::volume::{CreateSpec, Volume};
use penstock_driver::{DiskClass, Engine, EngineConfig, StreamError, StreamHandle, StreamSpec};

use crate::stripe::{Throttle, throttle};

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
    /// 8 Mbit/s — below this VM's timer noise); also the lateness tolerance admission's
    /// burst test is configured with. The lateness p99 and maximum are reported besides.
    #[arg(long, default_value = "50ms", value_parser = parse_duration)]
    pub miss_after: Duration,
    /// Spread the streams' phases over one period (as independent sessions would start)
    /// instead of starting all at the same instant (the critical instant, the default).
    #[arg(long)]
    pub spread: bool,
    /// Read partitions of a volume striped over 4 throttled loop devices (root; a blkio or
    /// io cgroup controller) instead of plain files.
    #[arg(long)]
    pub loop_volume: bool,
    /// With --loop-volume: each member's read rate.
    #[arg(long, default_value = "20MB", value_parser = parse_size)]
    pub loop_rate: u64,
    /// With --loop-volume: each member's reads per second.
    #[arg(long, default_value_t = 400)]
    pub loop_iops: u64,
    /// With --loop-volume: the stripe unit.
    #[arg(long, default_value = "256KiB", value_parser = parse_size)]
    pub stripe_unit: u64,
    /// The engines' workers at SCHED_FIFO with memory locked (`EngineConfig::realtime`,
    /// `[engine] realtime` of `penstock serve`), the rest of the bench at its own priority:
    /// how an rt service keeps its CPU on a machine shared with other work.
    #[arg(long)]
    pub realtime: bool,
    /// Engine workers.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Admission's bulk share (`[admission] bulk_share_percent`): what every resource keeps
    /// from rt streams; the forced runs count as clean only while the bulk readers keep it
    /// (less a tenth). The default is the server's.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u8).range(0..=90))]
    pub bulk_share: u8,
    /// Pool buffers per worker (0: room for 4 buffers a stream of `--streams-max` in the rt
    /// share, 5 a stream over the workers, plus 64, at least 512), so that admission's
    /// buffer test and not the pool binds, and forced runs can place every stream.
    #[arg(long, default_value_t = 0)]
    pub pool_buffers: usize,
    /// Growing forced runs at most, after the admitted one (+10 %, then +25 % a step).
    #[arg(long, default_value_t = 4)]
    pub force_steps: usize,
    /// Bisection probes at most between the last clean and the first missing forced count
    /// (down to 2 % of N_miss, at least one stream); the boundary is then run once more.
    #[arg(long, default_value_t = 6)]
    pub bisect_steps: usize,
    /// Directory for the test files (on the disk to measure); removed at the end.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Write the results as JSON here.
    /// A bare `--json` writes it on stdout (the table then goes to stderr).
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
}

/// Probes of loopback's drain of a burst of 1 MiB units per count tried (their median
/// counts), and counts tried at most.
const DRAIN_PROBES: usize = 3;
const DRAIN_STEPS: usize = 6;

/// Pool buffers per worker: `--pool-buffers`, else room for every stream's 4 buffers, so that
/// admission's buffer test (and not the pool) is what binds.
fn pool_buffers(a: &AdmissionArgs) -> usize {
    // 4 a stream over the rt share (80 %): 5 a stream.
    let auto = (5 * a.streams_max).div_ceil(a.workers.max(1)) + 64;
    let n = if a.pool_buffers > 0 {
        a.pool_buffers
    } else {
        auto.max(512)
    };
    n.min(penstock_driver::sys::POOL_BUFFERS_MAX)
}
const BUFFER_BYTES: usize = 1 << 20;

/// Pool buffers' size: 1 MiB, or 2 MiB on a volume (its members are read with O_DIRECT:
/// a chunk of whole 1316-byte units on 4 KiB boundaries is 1,347,584 bytes).
fn buffer_bytes(a: &AdmissionArgs) -> usize {
    if a.loop_volume { 2 << 20 } else { BUFFER_BYTES }
}

/// Bisection stops when the last clean and the first missing counts are this close: 2 % of
/// the missing count, at least one stream.
fn resolution(missed: usize) -> usize {
    (missed / 50).max(1)
}

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
    /// What the bulk readers read while the rt streams ran, per second.
    bulk_bytes_per_s: u64,
}

impl RunResult {
    /// Clean: nothing missed or failed, and the bulk readers kept their share (`bulk_min`
    /// bytes a second; 0 when not asked).
    fn clean(&self, bulk_min: u64) -> bool {
        self.misses == 0 && self.failed == 0 && self.bulk_bytes_per_s >= bulk_min
    }
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
    /// With --loop-volume: the volume (partitions `s0000`… per stream, `bulk0`… for the
    /// bulk readers); its loop devices and cgroup are in `run`'s guard.
    volume: Option<Arc<Volume>>,
}

impl Bench<'_> {
    fn file(&mut self, i: usize) -> Result<PathBuf> {
        if self.volume.is_some() {
            // Every partition was written when the volume was made.
            return Ok(PathBuf::from(format!("s{i:04}")));
        }
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
        if let Some(v) = &self.volume {
            for m in v.member_paths() {
                evict(m);
            }
        }
    }

    /// Opens `spec` on the engine: a volume's partition (named by the spec's source path)
    /// through its member devices, or a plain file.
    fn open(&self, engine: &Engine, spec: StreamSpec) -> Result<Result<StreamHandle, StreamError>> {
        open_on(engine, self.volume.as_deref(), spec)
    }

    fn spec(&self, file: &Path, unit: u64, start_at: penstock_core::time::Instant) -> StreamSpec {
        StreamSpec {
            pacing: penstock_core::stream::plan::Pacing::Rate(Rate::BitsPerSecond(
                self.a.rate_bits_per_s,
            )),
            unit_bytes: usize::try_from(unit).unwrap_or(usize::MAX),
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

    /// How fast loopback TCP drains `n` units of 1 MiB due at the same instant (one stream
    /// each, from the page cache, nothing else running): `n` MiB over the largest lateness
    /// of their units, the worst of 3 periods. Loopback has no wire: this is what the
    /// machine's CPUs (senders and receivers) and TCP do with a burst.
    fn loopback_drain_bytes_per_s(&self, n: usize) -> Result<u64> {
        let engine = Engine::new(engine_config(
            self.a,
            forced_admission(
                self.a.workers,
                (pool_buffers(self.a) * self.a.workers) as u32,
                buffer_bytes(self.a) as u64,
            ),
            &self.dir.join("probe-cache"),
        ))?;
        let start_at = penstock_driver::clock::now()
            + Duration::from_secs(1)
            + Duration::from_millis(20) * n as u32;
        let mut handles = Vec::new();
        for _ in 0..n {
            let spec = StreamSpec {
                extent: penstock_core::stream::Extent {
                    offset: 0,
                    length: Some(3 << 20),
                },
                ..self.spec(&self.ts, 1 << 20, start_at)
            };
            handles.push(engine.open(spec)?);
        }
        let mut max_ns = 0;
        for h in handles {
            let rep = h.wait()?;
            max_ns = max_ns.max(rep.lateness.map_or(0, |l| l.max_ns()));
        }
        let bytes = (n as u128) << 20;
        Ok(u64::try_from(bytes * 1_000_000_000 / u128::from(max_ns.max(1))).unwrap_or(u64::MAX))
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
            let phase = if !self.a.spread {
                Duration::ZERO
            } else {
                Duration::from_nanos((period_ns * (i as u128 % 64) / 64) as u64)
            };
            match self.open(engine, self.spec(&f, unit, start_at + phase))? {
                Ok(h) => handles.push(h),
                Err(StreamError::Refused(r)) => return Ok((handles, Some(r.to_string()))),
                // The pool or the engine's own limits: no further stream can be placed.
                Err(e) => return Ok((handles, Some(format!("not placed: {e}")))),
            }
        }
        Ok((handles, None))
    }

    /// One forced run of `n` streams (an engine whose admission nothing reaches): its result,
    /// printed, or `None` when the engine could not place them all.
    fn forced(
        &mut self,
        out: &mut dyn Write,
        unit: u64,
        n: usize,
        pool_total: u32,
        cache: &Path,
        what: &str,
    ) -> Result<Option<RunResult>> {
        for i in 0..n {
            self.file(i)?;
        }
        self.evict_all();
        let engine = Arc::new(Engine::new(engine_config(
            self.a,
            forced_admission(self.a.workers, pool_total, buffer_bytes(self.a) as u64),
            cache,
        ))?);
        let lead = Duration::from_secs(2) + Duration::from_millis(20) * self.a.streams_max as u32;
        let start_at = penstock_driver::clock::now() + lead;
        let (handles, refused) = self.ramp(&engine, unit, n, start_at)?;
        if let Some(why) = refused {
            writeln!(
                out,
                "  forced {n}: the engine placed only {} ({why}); stopping",
                handles.len()
            )?;
            for h in &handles {
                h.cancel();
            }
            return Ok(None);
        }
        let r = self.run(&engine, handles, start_at)?;
        writeln!(
            out,
            "  forced {n} ({what}): {} units, {} misses, lateness p99 {:.2} ms, max {:.2} ms, {} failed, bulk {:.1} MB/s",
            r.units,
            r.misses,
            r.p99_ns as f64 / 1e6,
            r.max_ns as f64 / 1e6,
            r.failed,
            r.bulk_bytes_per_s as f64 / 1e6
        )?;
        Ok(Some(r))
    }

    /// Runs `handles` (due at `start_at`) to their end beside the bulk readers; with no
    /// handles, the bulk readers alone for `--duration` (their rate alone).
    fn run(
        &self,
        engine: &Arc<Engine>,
        handles: Vec<StreamHandle>,
        start_at: penstock_core::time::Instant,
    ) -> Result<RunResult> {
        let stop = Arc::new(AtomicBool::new(false));
        // Bytes the bulk readers read, finished streams and the one under way.
        let bulk_bytes = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let readers: Vec<_> = self
            .bulk_files
            .iter()
            .map(|f| {
                let (engine, stop, f) = (engine.clone(), stop.clone(), f.clone());
                let bulk_bytes = bulk_bytes.clone();
                let volume = self.volume.clone();
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
                        let Ok(Ok(h)) = open_on(&engine, volume.as_deref(), spec) else {
                            break;
                        };
                        // Counted as it goes: the stream under way at the end counts
                        // what it read by then, and is cancelled.
                        let mut counted = 0;
                        loop {
                            let done = h.wait_timeout(Duration::from_millis(20));
                            let now = h.counters().bytes_read;
                            bulk_bytes.fetch_add(now.saturating_sub(counted), Ordering::Relaxed);
                            counted = counted.max(now);
                            if done.is_some() {
                                break;
                            }
                            if stop.load(Ordering::Relaxed) {
                                h.cancel();
                                let _ = h.wait_timeout(Duration::from_secs(30));
                                break;
                            }
                        }
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
        let alone = handles.is_empty();
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
        if alone {
            let wait = start_at.signed_nanos_since(penstock_driver::clock::now());
            std::thread::sleep(Duration::from_nanos(wait.max(0) as u64) + self.a.duration);
        }
        // The rt streams' run: from their start to the last one's end.
        let ran = penstock_driver::clock::now()
            .signed_nanos_since(start_at)
            .max(1) as u128;
        let read = u128::from(bulk_bytes.load(Ordering::Relaxed));
        r.bulk_bytes_per_s = u64::try_from(read * 1_000_000_000 / ran).unwrap_or(u64::MAX);
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

/// Opens `spec` on `engine`: with a volume, the source's path names its partition.
fn open_on(
    engine: &Engine,
    volume: Option<&Volume>,
    spec: StreamSpec,
) -> Result<Result<StreamHandle, StreamError>> {
    let Some(v) = volume else {
        return Ok(engine.open(spec));
    };
    let Some(Endpoint::File { path }) = &spec.source else {
        bail!("a volume stream's source names its partition");
    };
    let name = path.display().to_string();
    let pio = v
        .partition_io(&name, false)
        .with_context(|| format!("partition {name}"))?;
    let source = match opened_partition(pio) {
        Ok(s) => s,
        Err(e) => return Ok(Err(e.into())),
    };
    let target_ep = spec.target.clone().context("no target")?;
    let target = match open_target(&target_ep, &mut |_| {}) {
        Ok(t) => t,
        Err(e) => return Ok(Err(e.into())),
    };
    let spec = StreamSpec {
        source: Some(Endpoint::Volume {
            volume: VolumeName::parse("admission")?,
            partition: PartitionName::parse(&name)?,
        }),
        ..spec
    };
    Ok(engine.open_opened(spec, source, target))
}

/// Makes a volume striped over 4 throttled loop devices holding `streams` partitions of the
/// media (`s0000`…) and `bulk` unwritten partitions of 256 MiB for the bulk readers.
fn loop_volume(
    a: &AdmissionArgs,
    dir: &Path,
    ts: &Path,
    streams: usize,
    bulk: usize,
    guard: &mut Throttle,
) -> Result<Volume> {
    let media = std::fs::read(ts)?;
    let part = |bytes: u64| bytes.div_ceil(BLOCK_BYTES_DEFAULT) * BLOCK_BYTES_DEFAULT;
    let total = part(media.len() as u64) * streams as u64 + part(256 << 20) * bulk as u64;
    let member_bytes = part(total.div_ceil(4)) + 64 * BLOCK_BYTES_DEFAULT;
    let mut files = Vec::new();
    for i in 0..4 {
        let p = dir.join(format!("member{i}"));
        let f = std::fs::File::create(&p)?;
        f.set_len(member_bytes)?;
        files.push(p);
    }
    let members = throttle(&files, a.loop_rate, Some(a.loop_iops), guard)
        .context("throttled loop devices (--loop-volume needs root and a blkio/io cgroup)")?;
    let mut v = Volume::create(&CreateSpec {
        name: "admission".to_string(),
        members,
        member_size_bytes: None,
        stripe_unit_bytes: a.stripe_unit,
        block_bytes: BLOCK_BYTES_DEFAULT,
        force: true,
        copies: 1,
        sums: true,
    })?;
    for i in 0..streams {
        let name = format!("s{i:04}");
        v.begin_partition(&name, media.len() as u64, &Placement::Striped)?;
        let mut pio = v.partition_io(&name, true)?;
        pio.make_buffered()?;
        let (n, e) = pio.write_vectored_at(&[&media], 0);
        if let Some(e) = e {
            bail!("writing partition {name}: {e} after {n} bytes");
        }
        pio.sync_data()?;
        drop(pio);
        v.finish_partition(&name)?;
    }
    for i in 0..bulk {
        let name = format!("bulk{i}");
        v.begin_partition(&name, 256 << 20, &Placement::Striped)?;
        v.finish_partition(&name)?;
    }
    Ok(v)
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

/// Loopback has no wire: its cost is the CPU's (charged per send and per byte).
const LOOPBACK_BYTES_PER_S: u64 = 1 << 40;

fn capacity(workers: usize, pool_total: u32, buffer_bytes: u64) -> Capacity {
    Capacity {
        net_bytes_per_s: LOOPBACK_BYTES_PER_S,
        buffer_count: pool_total,
        buffer_bytes,
        cpu_ns_per_s: 1_000_000_000 * workers as u64,
        ..Capacity::CONSERVATIVE
    }
}

fn engine_config(a: &AdmissionArgs, admission: AdmissionConfig, cache: &Path) -> EngineConfig {
    EngineConfig {
        workers: a.workers,
        pool_buffers: pool_buffers(a),
        realtime: a.realtime,
        buffer_bytes: buffer_bytes(a),
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
fn forced_admission(workers: usize, pool_total: u32, buffer_bytes: u64) -> AdmissionConfig {
    AdmissionConfig {
        capacity: Capacity {
            disk_seq_bytes_per_s: 1 << 50,
            disk_random_iops: 1 << 40,
            disk_source: penstock_core::admission::FigureSource::Configured,
            net_bytes_per_s: 1 << 50,
            cpu_send_ns: 0,
            cpu_send_byte_ps: 0,
            cpu_burst_byte_ps: 0,
            ..capacity(workers, pool_total, buffer_bytes)
        },
        bulk_share_percent: 0,
        streams_max: 65_536,
        rt_latency_ns: 0,
        lateness_tolerance_ns: 1_000_000_000_000,
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
    // Declared before the volume: dropped after it (the loop devices outlive its descriptors).
    let mut guard = Throttle::default();
    let volume = if a.loop_volume {
        let v = loop_volume(&a, &dir, &ts, a.streams_max, a.bulk_readers, &mut guard)?;
        Some(Arc::new(v))
    } else {
        None
    };
    let mut bulk_files = Vec::new();
    for i in 0..a.bulk_readers {
        if volume.is_some() {
            bulk_files.push(PathBuf::from(format!("bulk{i}")));
            continue;
        }
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
        volume,
    };
    let pool_total = (pool_buffers(&a) * a.workers) as u32;
    let tolerance_ns = u64::try_from(a.miss_after.as_nanos()).unwrap_or(u64::MAX);
    // The network is loopback: its rate is how fast it drains a burst of large units, measured
    // at about the size the tolerance lets through (16 MiB first, then at that rate's
    // admissible burst plus a quarter); the lower of the two.
    let mut net_bytes_per_s = LOOPBACK_BYTES_PER_S;
    let mut drain_probes = Vec::new();
    if a.units
        .iter()
        .any(|&u| u > penstock_core::stream::plan::DATAGRAM_BYTES_MAX)
    {
        // The drain of one burst is noisy here (0.74-4.29 GB/s in one session) and slower
        // for larger bursts (queues fill): the figure is found at the burst size in
        // question. Bisection on the count n of 1 MiB units due at once for the largest n
        // whose median drain time (DRAIN_PROBES probes) fits the rt share of the tolerance;
        // the figure is the rate that admits exactly that n.
        let share_ns = u128::from(tolerance_ns) * 8 / 10;
        let first = b.loopback_drain_bytes_per_s(16)?;
        // The probe's engine places at most its pool over the streams' 4 buffers.
        let limit = (4 * a.streams_max.max(1)).min(pool_buffers(&a) * a.workers / 4);
        let mut n =
            ((u128::from(first) * share_ns / 1_000_000_000) >> 20).clamp(4, limit as u128) as usize;
        let (mut lo, mut hi) = (0usize, None::<usize>);
        let mut lo_rate = first;
        for _ in 0..DRAIN_STEPS {
            let mut probes = Vec::new();
            for _ in 0..DRAIN_PROBES {
                probes.push(b.loopback_drain_bytes_per_s(n)?);
            }
            probes.sort_unstable();
            let median = probes[probes.len() / 2];
            let took_ns = ((n as u128) << 20) * 1_000_000_000 / u128::from(median.max(1));
            let fits = took_ns <= share_ns;
            writeln!(
                out,
                "loopback drain of {n} 1 MiB units at once: {} MB/s (median {:.0} MB/s, {:.1} ms): {}",
                probes
                    .iter()
                    .map(|p| format!("{:.0}", *p as f64 / 1e6))
                    .collect::<Vec<_>>()
                    .join(", "),
                median as f64 / 1e6,
                took_ns as f64 / 1e6,
                if fits { "fits" } else { "too slow" }
            )?;
            drain_probes.push(serde_json::json!({"units": n, "bytes_per_s": probes, "fits": fits}));
            if fits {
                lo = n;
                lo_rate = median;
            } else {
                hi = Some(n);
            }
            let next = match hi {
                Some(h) => lo + (h - lo) / 2,
                None => (n * 2).min(limit),
            };
            if next == n || next <= lo || hi.is_some_and(|h| h - lo <= (h / 20).max(1)) {
                break;
            }
            n = next;
        }
        net_bytes_per_s = if lo > 0 {
            u64::try_from(((lo as u128) << 20) * 1_000_000_000 / share_ns).unwrap_or(u64::MAX)
        } else {
            lo_rate
        };
        writeln!(
            out,
            "loopback TCP drains {lo} 1 MiB units due at once within the rt share of the tolerance: the network figure {:.0} MB/s",
            net_bytes_per_s as f64 / 1e6
        )?;
    }
    // Without a calibration file: the engine's send costs as `penstock serve` measures them on
    // first use (self-calibration, about 2 s; a cache of this run's own, so measured now).
    let self_cal = penstock_driver::send_cost::send_cost(
        Some(&dir.join("send-cache")),
        penstock_driver::send_cost::SEND_COST_TIME,
    )
    .context("the self-calibration of the send cost")?;
    let self_charged = self_cal.charged();
    writeln!(
        out,
        "self-calibrated send cost (what `penstock serve` measures on first use): {} ns + {} ps a byte ({} ps a byte in a burst), charged {} ns + {} ps ({} ps)",
        self_cal.send_ns,
        self_cal.send_byte_ps,
        self_cal.burst_byte_ps,
        self_charged.send_ns,
        self_charged.send_byte_ps,
        self_charged.burst_byte_ps
    )?;
    let admission = AdmissionConfig {
        capacity: penstock_driver::send_cost::capacity_with_send_cost(
            Capacity {
                net_bytes_per_s,
                ..capacity(a.workers, pool_total, buffer_bytes(&a) as u64)
            },
            &self_charged,
            penstock_driver::send_cost::SendCostKept::default(),
        ),
        bulk_share_percent: a.bulk_share,
        streams_max: 4096,
        rt_latency_ns: 0,
        lateness_tolerance_ns: tolerance_ns,
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
    // What `penstock calibrate` adds: the engine's send costs at length.
    let mut cal = cal;
    // As `penstock calibrate` without --quick measures them: 2 s a paced probe (0.5 s probes
    // varied by ±15 % between runs here), 256 MiB of 1 MiB units over loopback TCP,
    // receivers included, paced and (for the CPU burst test) due at once.
    let (send_cost, send_probes) =
        penstock_driver::send_cost::measure_engine_send_cost(Duration::from_secs(2), 256 << 20)
            .context("measuring the engine's send costs")?;
    cal.set_send_cost(send_cost);
    writeln!(
        out,
        "the engine's CPU per paced 1316-byte datagram, receiver included (streams: ns): {}",
        send_probes
            .iter()
            .map(|(n, ns)| format!("{n}: {ns}"))
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    let mut cal_capacity = cal.capacity(net_bytes_per_s, pool_total, buffer_bytes(&a) as u64);
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
        "calibration (--quick): {:.0} MB/s sequential, 64 KiB random {} IOPS, send {} ns + {} ps a byte ({} ps a byte in a burst); {}; phases: {}",
        cal_capacity.disk_seq_bytes_per_s as f64 / 1e6,
        cal_capacity.disk_random_iops,
        cal_capacity.cpu_send_ns,
        cal_capacity.cpu_send_byte_ps,
        cal_capacity.cpu_burst_byte_ps,
        if a.loop_volume {
            format!(
                "streams read a volume striped ({} KiB) over 4 loop devices, each throttled to {:.0} MB/s and {} reads/s",
                a.stripe_unit >> 10,
                a.loop_rate as f64 / 1e6,
                a.loop_iops
            )
        } else {
            "streams read plain files".to_string()
        },
        if a.spread {
            "spread over one period"
        } else {
            "all due at one instant"
        }
    )?;
    let mut bulk_min = None;
    let mut rows = Vec::new();
    for &unit in &a.units.clone() {
        // 1. Admission with self-calibration (no calibration file): ramp, then run.
        // Measured through a file of 256 MiB on the same device (the device node may not be
        // readable here); the first rt admission would measure through the stream's own file.
        // With a volume, each member is measured through its device node on the first
        // admission.
        let probe = match b.bulk_files.first() {
            Some(f) if b.volume.is_none() => Some(f.clone()),
            Some(_) => None,
            None => {
                let p = dir.join("probe.bin");
                make_bulk_file(&p, 64 << 20)?;
                Some(p)
            }
        };
        let self_calibrate = |engine: &Engine| -> Result<_> {
            let Some(probe) = &probe else {
                return Ok(None);
            };
            let probe_fd = std::fs::File::open(probe)?;
            Ok(engine.self_calibrate(std::os::fd::AsFd::as_fd(&probe_fd)))
        };
        // A ramp with nothing run first (all due in an hour, then cancelled) makes each
        // stream's file, so that the timed ramp only opens (copying a file during it could
        // outlast the lead); the self-calibration is cached for the engine that runs.
        {
            let dry = Engine::new(engine_config(&a, admission, &cache))?;
            self_calibrate(&dry)?;
            let far = penstock_driver::clock::now() + Duration::from_secs(3600);
            let (handles, _) = b.ramp(&dry, unit, a.streams_max, far)?;
            for h in &handles {
                h.cancel();
            }
        }
        b.evict_all();
        let engine = Arc::new(Engine::new(engine_config(&a, admission, &cache))?);
        let figures = self_calibrate(&engine)?;
        match &figures {
            Some(Ok(f)) => writeln!(
                out,
                "self-calibration: {:.0} MB/s sequential, 64 KiB random {} IOPS ({})",
                f.disk.seq_bytes_per_s as f64 / 1e6,
                f.disk.random_iops,
                f.source
            )?,
            Some(Err(why)) => writeln!(out, "self-calibration failed: {why}")?,
            None if b.volume.is_some() => {}
            None => writeln!(out, "self-calibration off")?,
        }
        let start_at = penstock_driver::clock::now() + lead;
        let (handles, refusal) = b.ramp(&engine, unit, a.streams_max, start_at)?;
        let n_adm = handles.len();
        let reserved = handles.first().and_then(|h| h.reservation());
        for (dev, f) in engine.self_calibrations() {
            match f {
                Ok(f) => writeln!(
                    out,
                    "self-calibration of {}: {:.1} MB/s sequential, 64 KiB random {} IOPS",
                    dev,
                    f.disk.seq_bytes_per_s as f64 / 1e6,
                    f.disk.random_iops
                )?,
                Err(e) => writeln!(out, "self-calibration of {dev} failed: {e}")?,
            }
        }
        let admitted = b.run(&engine, handles, start_at)?;
        drop(engine);
        // The bulk readers alone, once, through an engine like the admitting one (its
        // devices' self-calibration cached by now: measured first, it would take the run's
        // first seconds): their rate, of which a forced run must leave them their share
        // (`bulk_share_percent`, less a tenth for the noise of a run) to count as clean.
        // Forcing rt streams past admission takes time from bulk before it makes rt units
        // late (the DRR quanta give bulk its share only while it is backlogged); a machine
        // that carries more rt streams only by starving bulk does not carry them under the
        // share the operator set (issue 22).
        let bulk_min = match bulk_min {
            Some(m) => m,
            None => {
                let bulk_alone = if b.bulk_files.is_empty() {
                    0
                } else {
                    let engine = Arc::new(Engine::new(engine_config(&a, admission, &cache))?);
                    b.evict_all();
                    b.run(
                        &engine,
                        Vec::new(),
                        penstock_driver::clock::now() + Duration::from_millis(200),
                    )?
                    .bulk_bytes_per_s
                };
                let m = bulk_alone / 100 * u64::from(admission.bulk_share_percent) * 9 / 10;
                writeln!(
                    out,
                    "bulk readers alone: {:.1} MB/s; a forced run is clean when no unit misses and they keep {:.1} MB/s ({} % of that, less a tenth)",
                    bulk_alone as f64 / 1e6,
                    m as f64 / 1e6,
                    admission.bulk_share_percent
                )?;
                bulk_min = Some(m);
                m
            }
        };
        // 2. N_adm with the full calibration's figures, and that set run too when it differs
        // from the self-calibrated one (the ratio is claimed for it: it must be safe).
        // A dry ramp first (nothing run) makes the files the calibrated set needs.
        {
            let dry = Engine::new(engine_config(
                &a,
                AdmissionConfig {
                    capacity: cal_capacity,
                    ..admission
                },
                &cache,
            ))?;
            let far = penstock_driver::clock::now() + Duration::from_secs(3600);
            let (handles, _) = b.ramp(&dry, unit, a.streams_max, far)?;
            for h in &handles {
                h.cancel();
            }
        }
        b.evict_all();
        let cal_engine = Arc::new(Engine::new(engine_config(
            &a,
            AdmissionConfig {
                capacity: cal_capacity,
                ..admission
            },
            &cache,
        ))?);
        let cal_start = penstock_driver::clock::now() + lead;
        let (cal_handles, cal_refusal) = b.ramp(&cal_engine, unit, a.streams_max, cal_start)?;
        let n_adm_cal = cal_handles.len();
        // On the loop volume `penstock calibrate`'s figures are the bench directory's disk,
        // not the throttled members: the count is shown, the set not run, no ratio claimed.
        let cal_run = if n_adm_cal == n_adm || b.volume.is_some() {
            for h in &cal_handles {
                h.cancel();
            }
            drop(cal_handles);
            None
        } else {
            Some(b.run(&cal_engine, cal_handles, cal_start)?)
        };
        drop(cal_engine);
        let cal_admitted = cal_run.unwrap_or(admitted);
        writeln!(
            out,
            "  calibrated: N_adm {n_adm_cal} ({}); {}",
            cal_refusal
                .as_deref()
                .unwrap_or("the ramp's limit, not a refusal"),
            match cal_run {
                Some(r) => format!(
                    "run: {} units, {} misses, lateness p99 {:.2} ms, max {:.2} ms, {} failed",
                    r.units,
                    r.misses,
                    r.p99_ns as f64 / 1e6,
                    r.max_ns as f64 / 1e6,
                    r.failed
                ),
                None if b.volume.is_some() => {
                    "not run (the figures of the bench directory's disk, not the volume's members)"
                        .to_string()
                }
                None => "the same set as above".to_string(),
            }
        )?;
        writeln!(
            out,
            "unit {unit} B: N_adm {}{} ({}), calibrated N_adm {}{}; admitted set: {} units, {} misses, lateness p99 {:.2} ms, max {:.2} ms, {} failed, bulk {:.1} MB/s",
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
            admitted.failed,
            admitted.bulk_bytes_per_s as f64 / 1e6
        )?;
        if let Some(r) = &reserved {
            writeln!(
                out,
                "  one stream reserves: disk {:.3} ms/s, network {:.3} MB/s, {} buffers, cpu {:.3} ms/s, {:.3} ms of cpu at the critical instant; figures: {}",
                r.disk_ns_per_s as f64 / 1e6,
                r.net_bytes_per_s as f64 / 1e6,
                r.buffers,
                r.cpu_ns_per_s as f64 / 1e6,
                r.burst_cpu_ns as f64 / 1e6,
                r.figures()
            )?;
        }
        // 3. Forced: more than admission allows, growing (+10 %, then +25 % a step) until
        // units miss; then bisection between the last clean count and the first that missed,
        // each probe a full-length run, a probe clean only with 0 misses; the boundary (the
        // largest clean and the smallest missing count) is run again to show it is stable.
        let mut forced = Vec::new();
        let mut boundary = None;
        // What the admitted sets already showed: the larger clean one bounds N_miss from
        // below, a set that missed from above (then bisection starts at once).
        let mut shown = vec![(n_adm, admitted)];
        if let Some(r) = cal_run {
            shown.push((n_adm_cal, r));
        }
        let clean_lo = shown
            .iter()
            .filter(|(_, r)| r.clean(bulk_min))
            .map(|&(n, _)| n)
            .max();
        let mut n_miss = shown
            .iter()
            .filter(|(_, r)| !r.clean(bulk_min))
            .map(|&(n, _)| n)
            .min();
        if refusal.is_some() && (clean_lo.is_some() || n_miss.is_some()) {
            let mut clean = clean_lo.unwrap_or(0);
            let mut n = clean + (clean / 10).max(1);
            for _ in 0..a.force_steps {
                if n_miss.is_some() {
                    break;
                }
                if n > a.streams_max {
                    break;
                }
                let Some(r) = b.forced(&mut *out, unit, n, pool_total, &cache, "step")? else {
                    break;
                };
                forced.push(r);
                if !r.clean(bulk_min) {
                    n_miss = Some(n);
                    break;
                }
                clean = n;
                n += (n / 4).max(1);
            }
            if let Some(mut missed) = n_miss {
                let mut probes = 0;
                while missed - clean > resolution(missed) && probes < a.bisect_steps {
                    let mid = clean + (missed - clean) / 2;
                    let Some(r) = b.forced(&mut *out, unit, mid, pool_total, &cache, "bisect")?
                    else {
                        break;
                    };
                    forced.push(r);
                    probes += 1;
                    if !r.clean(bulk_min) {
                        missed = mid;
                    } else {
                        clean = mid;
                    }
                }
                // The boundary again: the largest clean count must stay clean and the
                // smallest missing one miss again; a clean count that misses now is the new
                // N_miss (the smaller figure, against admission).
                let mut again = Vec::new();
                for m in [clean, missed] {
                    if m == 0 || shown.iter().any(|&(n, _)| n == m) {
                        continue;
                    }
                    if let Some(r) = b.forced(&mut *out, unit, m, pool_total, &cache, "repeat")? {
                        forced.push(r);
                        again.push((m, !r.clean(bulk_min)));
                    }
                }
                if let Some(&(m, true)) = again.iter().find(|&&(m, _)| m == clean)
                    && m != missed
                {
                    writeln!(
                        out,
                        "  the clean boundary {m} missed when run again: N_miss {m}"
                    )?;
                    missed = m;
                }
                boundary = Some(serde_json::json!({
                    "largest_clean": clean,
                    "smallest_missing": missed,
                    "repeated": again.iter().map(|&(m, miss)| serde_json::json!({"streams": m, "missed": miss})).collect::<Vec<_>>(),
                }));
                n_miss = Some(missed);
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
        let cal_safe = cal_admitted.misses == 0 && cal_admitted.failed == 0;
        let ratio_cal = n_miss
            .filter(|_| cal_safe && cal_refusal.is_some() && b.volume.is_none())
            .map(|m| n_adm_cal as f64 / m as f64);
        if !cal_safe {
            writeln!(
                out,
                "  UNSAFE: the calibrated set itself missed deadlines ({} of {} units)",
                cal_admitted.misses, cal_admitted.units
            )?;
        }
        writeln!(
            out,
            "  N_adm / N_miss: {}",
            match (ratio, n_miss) {
                (Some(r), Some(m)) => format!("{n_adm} / {m} = {r:.2}"),
                _ if !safe => "none (the admitted set missed)".into(),
                _ => "not measured (no misses up to the forced runs' limit, or no refusal)".into(),
            }
        )?;
        writeln!(
            out,
            "  calibrated N_adm / N_miss: {}",
            match (ratio_cal, n_miss) {
                (Some(r), Some(m)) => format!("{n_adm_cal} / {m} = {r:.2}"),
                _ if !cal_safe => "none (the calibrated set missed)".into(),
                _ => "not measured".into(),
            }
        )?;
        rows.push(serde_json::json!({
            "unit_bytes": unit,
            "n_adm": n_adm,
            "n_adm_is_limit": refusal.is_none(),
            "refusal": refusal,
            "n_adm_calibrated": n_adm_cal,
            "refusal_calibrated": cal_refusal,
            "calibrated_run": cal_run.map(|r| serde_json::json!({"streams": r.streams, "units": r.units,
                "misses": r.misses, "p99_ns": r.p99_ns, "max_ns": r.max_ns, "failed": r.failed,
                "bulk_bytes_per_s": r.bulk_bytes_per_s})),
            "ratio_calibrated": ratio_cal,
            "figures": figures.map(|f| match f {
                Ok(f) => format!("{:?}", f),
                Err(e) => e,
            }),
            "admitted": {"streams": admitted.streams, "units": admitted.units, "misses": admitted.misses,
                "p99_ns": admitted.p99_ns, "max_ns": admitted.max_ns, "failed": admitted.failed,
                "bulk_bytes_per_s": admitted.bulk_bytes_per_s},
            "forced": forced.iter().map(|r| serde_json::json!({"streams": r.streams, "units": r.units,
                "misses": r.misses, "p99_ns": r.p99_ns, "max_ns": r.max_ns, "failed": r.failed,
                "bulk_bytes_per_s": r.bulk_bytes_per_s, "clean": r.clean(bulk_min)})).collect::<Vec<_>>(),
            "n_miss": n_miss,
            "boundary": boundary,
            "admitted_set_safe": safe,
            "ratio": ratio,
                        "bulk_min_bytes_per_s": bulk_min,
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
                "spread": a.spread,
                "loop_volume": a.loop_volume.then(|| serde_json::json!({
                    "members": 4, "rate_bytes_per_s": a.loop_rate, "iops": a.loop_iops,
                    "stripe_unit": a.stripe_unit})),
                "lateness_tolerance_ns": tolerance_ns,
                "bulk_share_percent": a.bulk_share,
                "net_bytes_per_s": net_bytes_per_s,
                "drain_probes_bytes_per_s": drain_probes,
                "send_probes_streams_ns": send_probes,
                "calibration": {
                    "seq_bytes_per_s": cal_capacity.disk_seq_bytes_per_s,
                    "random_iops": cal_capacity.disk_random_iops,
                    "send_ns": cal_capacity.cpu_send_ns,
                    "send_byte_ps": cal_capacity.cpu_send_byte_ps,
                    "burst_byte_ps": cal_capacity.cpu_burst_byte_ps,
                },
                "self_calibration": {
                    "send_ns": self_cal.send_ns,
                    "send_byte_ps": self_cal.send_byte_ps,
                    "burst_byte_ps": self_cal.burst_byte_ps,
                    "margin_percent": penstock_driver::send_cost::SELF_CALIBRATED_SEND_MARGIN_PERCENT,
                },
                "rows": rows,
            }),
        )?;
    }
    Ok(())
}
