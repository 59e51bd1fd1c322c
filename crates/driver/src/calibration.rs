//! `penstock calibrate`: measure the device under a path, like seastar's iotune, and keep the
//! figures in a file the engine reads at start (admission control's capacity).
//!
//! Sequential bandwidth: O_DIRECT reads of 1 MiB at depths 1, 2, 4, 8 and 16; the smallest
//! depth within 5% of the best is the device's read depth (`read_depth`), which the uring
//! path's benches use when the file is on the calibrated device. Random IOPS: O_DIRECT reads
//! of 4 KiB and 64 KiB at depth 1, 8 and 32, at uniformly random aligned offsets, each for a
//! fixed time. All reads go through io_uring (the engine's own ring).
//!
//! The same measurement, brief, on a device's first use: `calibration/self_calibration.rs`.
//! Which device a file is on: [`crate::device`]. The engine's CPU cost of a send (measured by
//! running an engine, so above it): [`crate::send_cost`]; only its figures' type is here,
//! since the calibration file keeps them.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use penstock_core::admission::Capacity;
use penstock_uring::{Ring, RingConfig};
use serde::{Deserialize, Serialize};

use crate::device::device_of;

mod self_calibration;
pub use self_calibration::{
    COLD_FILE_ENTRIES_MAX, DEVICE_PROBE, DeviceRecord, SELF_CALIBRATION_FILE_BYTES_MIN,
    SELF_CALIBRATION_TIME_MAX, SelfCalibration, SelfCalibrationError, cold_file_under,
    default_cache_dir, device_figures,
};

/// One random-read measurement.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RandomFigure {
    pub request_bytes: u64,
    pub depth: u32,
    pub iops: u64,
}

/// One sequential-read measurement at a read depth.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct DepthFigure {
    pub depth: u32,
    pub bytes_per_s: u64,
}

/// The read depths `penstock calibrate` (and [`measure_read_depth`], and self-calibration)
/// try.
pub const READ_DEPTHS: [u32; 5] = [1, 2, 4, 8, 16];

/// The uring path's read depth (a stream's disk reads in flight) on a device nothing is known
/// of: no calibration file covers it and self-calibration is off or failed. 4 was the engine's
/// one depth before depths were measured: deep enough to keep a disk that scales busy (the
/// VMs here measured 1 to 8 best), shallow enough that a stream holds 5 pool buffers (4 reads
/// and the one being sent) — a device that wants more is measured, not guessed.
pub const READ_DEPTH_DEFAULT: usize = 4;

/// The deepest read depth measured ([`READ_DEPTHS`]): the engine's default cap.
pub const READ_DEPTH_MAX: usize = 16;

/// The depth to read a stream at: the smallest whose rate is within 5% of the best measured
/// (a deeper queue holds more buffers and adds latency for other streams' requests, so it
/// must buy more than noise). `None` for no figures.
pub fn best_read_depth(figures: &[DepthFigure]) -> Option<u32> {
    let best = figures.iter().map(|f| f.bytes_per_s).max()?;
    figures
        .iter()
        .filter(|f| f.bytes_per_s as f64 >= best as f64 * 0.95)
        .map(|f| f.depth)
        .min()
}

/// What `penstock calibrate` measured.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Calibration {
    /// The file measured (on the device of interest).
    pub path: String,
    /// Sequential O_DIRECT reads, 1 MiB each, at depth 1 and 4.
    pub seq_read_bytes_per_s_depth1: u64,
    pub seq_read_bytes_per_s_depth4: u64,
    pub random: Vec<RandomFigure>,
    /// Sequential O_DIRECT reads of 1 MiB at each of [`READ_DEPTHS`] (absent in files
    /// written before it was measured).
    #[serde(default)]
    pub seq_read_by_depth: Vec<DepthFigure>,
    /// [`best_read_depth`] of `seq_read_by_depth`: the read depth for streams on this device.
    #[serde(default)]
    pub read_depth: Option<u32>,
    /// CPU time of one send, in ns (absent in files written before it was measured): with
    /// `send_byte_ps`, the part that does not depend on the bytes (what admission charges per
    /// send); without it (files of before issue 22), a whole 1316-byte datagram's.
    #[serde(default)]
    pub send_ns: Option<u64>,
    /// CPU time per byte sent, in picoseconds ([`crate::cpu_probe::byte_ps`]; absent in older
    /// files, which are then charged the conservative figure per byte).
    #[serde(default)]
    pub send_byte_ps: Option<u64>,
    /// CPU time per byte when 1 MiB units fall due at once ([`crate::cpu_probe::burst_byte_ps`]:
    /// admission's CPU burst test); absent in older files, which then use `send_byte_ps`.
    #[serde(default)]
    pub send_burst_byte_ps: Option<u64>,
}

/// The engine's send costs as admission charges them (`Capacity::cpu_send_ns`,
/// `cpu_send_byte_ps`, `cpu_burst_byte_ps`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendCost {
    /// A paced send without its bytes, in ns.
    pub send_ns: u64,
    /// A byte of a paced send, in ps.
    pub send_byte_ps: u64,
    /// A byte of a unit sent among everyone's at the critical instant, in ps.
    pub burst_byte_ps: u64,
}

/// Why calibration failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CalibrationError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}: O_DIRECT refused on this file system; calibrate a path on the disk to measure")]
    NoDirect(PathBuf),
    #[error("io_uring is needed to calibrate: {0}")]
    Ring(String),
    #[error("{path}: not a calibration file: {why}")]
    Format { path: PathBuf, why: String },
}

impl Calibration {
    /// Keeps the engine's measured send costs ([`measure_engine_send_cost`]).
    pub fn set_send_cost(&mut self, cost: SendCost) {
        self.send_ns = Some(cost.send_ns);
        self.send_byte_ps = Some(cost.send_byte_ps);
        self.send_burst_byte_ps = Some(cost.burst_byte_ps);
    }

    /// The capacity admission control works with: the sequential rate at depth 4, random
    /// IOPS of 64 KiB reads at depth 1 (a stream's read-ahead is sequential but interleaved with
    /// others: each request may cost a seek).
    pub fn capacity(&self, net_bytes_per_s: u64, buffer_count: u32, buffer_bytes: u64) -> Capacity {
        let random = self
            .random
            .iter()
            .find(|r| r.request_bytes == 65536 && r.depth == 1)
            .or_else(|| self.random.first());
        Capacity {
            disk_seq_bytes_per_s: self
                .seq_read_bytes_per_s_depth4
                .max(self.seq_read_bytes_per_s_depth1)
                .max(1),
            disk_random_iops: random
                .map_or(Capacity::CONSERVATIVE.disk_random_iops, |r| r.iops.max(1)),
            disk_random_request_bytes: random.map_or(4096, |r| r.request_bytes),
            disk_source: penstock_core::admission::FigureSource::CalibrationFile,
            net_bytes_per_s,
            buffer_count,
            buffer_bytes,
            cpu_send_ns: self.send_ns.unwrap_or(Capacity::CONSERVATIVE.cpu_send_ns),
            cpu_send_byte_ps: self
                .send_byte_ps
                .unwrap_or(Capacity::CONSERVATIVE.cpu_send_byte_ps),
            cpu_burst_byte_ps: self
                .send_burst_byte_ps
                .or(self.send_byte_ps)
                .unwrap_or(Capacity::CONSERVATIVE.cpu_burst_byte_ps),
            ..Capacity::CONSERVATIVE
        }
    }

    /// The calibrated read depth if `file` is on the device this calibration measured (same
    /// `st_dev` as its path, which must still exist); `None` otherwise.
    pub fn read_depth_for(&self, file: &Path) -> Option<u32> {
        use std::os::unix::fs::MetadataExt;
        let here = std::fs::metadata(file).ok()?.dev();
        (Some(here) == self.device()).then_some(self.read_depth?)
    }

    /// The device this calibration measured, as the engine names it ([`device_of`]: a block
    /// device's own number, a file's `st_dev`); `None` when its path no longer exists (nor its
    /// directory: a directory's calibration names its removed test file).
    pub fn device(&self) -> Option<u64> {
        let f = std::fs::File::open(&self.path)
            .or_else(|_| {
                std::fs::File::open(Path::new(&self.path).parent().unwrap_or(Path::new("/")))
            })
            .ok()?;
        Some(device_of(&f))
    }

    /// The engine's read depths from this calibration: its device's, when it has one
    /// (`EngineConfig::read_depth`).
    pub fn read_depths(&self) -> Vec<(u64, usize)> {
        match (self.device(), self.read_depth) {
            (Some(dev), Some(d)) => vec![(dev, d as usize)],
            _ => Vec::new(),
        }
    }

    /// Reads a calibration file.
    pub fn load(path: &Path) -> Result<Calibration, CalibrationError> {
        let text = std::fs::read_to_string(path).map_err(|source| CalibrationError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| CalibrationError::Format {
            path: path.to_path_buf(),
            why: e.to_string(),
        })
    }

    /// Writes a calibration file (atomically: a temporary file renamed over it).
    pub fn save(&self, path: &Path) -> Result<(), CalibrationError> {
        let io = |source| CalibrationError::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let text = format!(
            "# penstock calibrate: O_DIRECT reads through io_uring on the device of {}\n{}",
            self.path,
            toml::to_string(self).expect("a calibration serializes")
        );
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }
}

/// Where the engine looks for the calibration by default:
/// `$PENSTOCK_CALIBRATION`, else `$XDG_CONFIG_HOME/penstock/calibration.toml`, else
/// `~/.config/penstock/calibration.toml`.
pub fn default_path() -> PathBuf {
    if let Some(p) = std::env::var_os("PENSTOCK_CALIBRATION") {
        return PathBuf::from(p);
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .unwrap_or_else(|| PathBuf::from("."));
    base.join("penstock").join("calibration.toml")
}

/// How long and how much to measure.
#[derive(Debug, Clone)]
pub struct CalibrateOptions {
    /// Size of the test file created when the path is a directory.
    pub file_bytes: u64,
    /// Time per random-read measurement.
    pub random_time: Duration,
}

/// Measures the device under `path` (a directory: a test file is created there and removed;
/// a file or block device: read in place, never written).
pub fn calibrate(path: &Path, opts: &CalibrateOptions) -> Result<Calibration, CalibrationError> {
    let io = |source| CalibrationError::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    let (file, remove) = if meta.is_dir() {
        let f = path.join(format!(".penstock-calibrate-{}", std::process::id()));
        write_test_file(&f, opts.file_bytes).map_err(io)?;
        (f, true)
    } else {
        (path.to_path_buf(), false)
    };
    let r = measure(&file, opts);
    if remove {
        let _ = std::fs::remove_file(&file);
    }
    r
}

fn write_test_file(path: &Path, bytes: u64) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    let mut block = vec![0u8; 1 << 20];
    let mut x = 0x853c_49e6_748f_ea9bu64;
    for b in block.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    for _ in 0..bytes.div_ceil(1 << 20) {
        f.write_all(&block)?;
    }
    f.sync_all()
}

/// The ring calibration reads through: 32 buffers of 1 MiB.
fn calibration_ring() -> Result<Ring, CalibrationError> {
    let (ring, _) = Ring::new(&RingConfig {
        buffers: 32,
        buffer_bytes: 1 << 20,
        ..RingConfig::default()
    })
    .map_err(|e| CalibrationError::Ring(e.to_string()))?;
    Ok(ring)
}

/// Sequential O_DIRECT reads of 1 MiB at each of [`READ_DEPTHS`], each depth over its own
/// region of `fd` (each for `time` at most when given, else its whole region): no block is
/// read twice, so no depth is timed on what an earlier one left in a cache below. The
/// figures and the bytes read.
fn sequential_by_depth(
    ring: &mut Ring,
    fd: std::os::fd::RawFd,
    regions: &[Region],
    time: Option<Duration>,
) -> Result<(Vec<DepthFigure>, u64), CalibrationError> {
    let mut bytes = 0;
    let mut figures = Vec::with_capacity(READ_DEPTHS.len());
    for (depth, &region) in READ_DEPTHS.into_iter().zip(regions) {
        let r = run_reads(ring, fd, region, 1 << 20, depth, Pattern::Sequential, time)?;
        bytes += r.bytes;
        figures.push(DepthFigure {
            depth,
            bytes_per_s: r.bytes_per_s,
        });
    }
    Ok((figures, bytes))
}

fn measure(file: &Path, opts: &CalibrateOptions) -> Result<Calibration, CalibrationError> {
    let fd = crate::open::reopen_direct(file)
        .ok_or_else(|| CalibrationError::NoDirect(file.to_path_buf()))?;
    let size =
        rustix::fs::seek(&fd, rustix::fs::SeekFrom::End(0)).map_err(|e| CalibrationError::Io {
            path: file.to_path_buf(),
            source: e.into(),
        })?;
    let mut ring = calibration_ring()?;
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    // Half the file for the sequential depths, half for the six random measurements, each
    // its own region: every block is read once.
    let regions = Region::split(size, &[1; 11]);
    let (by_depth, _) = sequential_by_depth(&mut ring, raw, &regions[..READ_DEPTHS.len()], None)?;
    let at = |d: u32| {
        by_depth
            .iter()
            .find(|f| f.depth == d)
            .map_or(0, |f| f.bytes_per_s)
    };
    let (seq1, seq4) = (at(1), at(4));
    let mut random = Vec::new();
    let mut random_regions = regions[READ_DEPTHS.len()..].iter();
    for request_bytes in [4096u64, 65536] {
        for depth in [1u32, 8, 32] {
            let region = *random_regions
                .next()
                .expect("six regions for six measurements");
            let r = run_reads(
                &mut ring,
                raw,
                region,
                request_bytes,
                depth,
                Pattern::Random,
                Some(opts.random_time),
            )?;
            random.push(RandomFigure {
                request_bytes,
                depth,
                iops: r.bytes_per_s / request_bytes,
            });
        }
    }
    Ok(Calibration {
        path: file.display().to_string(),
        seq_read_bytes_per_s_depth1: seq1,
        seq_read_bytes_per_s_depth4: seq4,
        random,
        read_depth: best_read_depth(&by_depth),
        seq_read_by_depth: by_depth,
        send_ns: None,
        send_byte_ps: None,
        send_burst_byte_ps: None,
    })
}

/// A short measurement of the read depth for files in `dir` when no calibration covers its
/// device: writes a test file of `bytes` there (removed after), reads it with O_DIRECT
/// through io_uring at each of [`READ_DEPTHS`], and returns [`best_read_depth`] with the
/// figures.
pub fn measure_read_depth(
    dir: &Path,
    bytes: u64,
) -> Result<(u32, Vec<DepthFigure>), CalibrationError> {
    let io = |source| CalibrationError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let f = dir.join(format!(".penstock-depth-{}", std::process::id()));
    write_test_file(&f, bytes).map_err(io)?;
    let r = (|| {
        let fd =
            crate::open::reopen_direct(&f).ok_or_else(|| CalibrationError::NoDirect(f.clone()))?;
        let mut ring = calibration_ring()?;
        let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
        let regions = Region::split(bytes, &[1; READ_DEPTHS.len()]);
        let (figs, _) = sequential_by_depth(&mut ring, raw, &regions, None)?;
        Ok((best_read_depth(&figs).unwrap_or(1), figs))
    })();
    let _ = std::fs::remove_file(&f);
    r
}

#[derive(Clone, Copy)]
enum Pattern {
    Sequential,
    Random,
}

/// A part of the measured file or device that one measurement reads, each block at most
/// once. Nothing is timed on bytes read before in the same calibration: a re-read is served
/// by whatever cache sits below (a VM host's page cache served a 64 MiB file read over and
/// over at 31 GB/s, where the disk under it reads 1 GB/s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Region {
    start: u64,
    len: u64,
}

impl Region {
    /// Splits `size` bytes into consecutive regions in proportion to `weights`, each
    /// boundary on a 1 MiB multiple (the largest request; O_DIRECT's alignment); the last
    /// takes what is left.
    fn split(size: u64, weights: &[u64]) -> Vec<Region> {
        const ALIGN: u64 = 1 << 20;
        let total: u64 = weights.iter().sum::<u64>().max(1);
        let mut start = 0;
        let mut out = Vec::with_capacity(weights.len());
        for (i, w) in weights.iter().enumerate() {
            let end = if i + 1 == weights.len() {
                size
            } else {
                let share = u64::try_from(u128::from(size) * u128::from(*w) / u128::from(total))
                    .unwrap_or(size);
                (start + share / ALIGN * ALIGN).min(size)
            };
            out.push(Region {
                start,
                len: end - start,
            });
            start = end;
        }
        out
    }
}

/// What one measurement read.
#[derive(Debug, Clone, Copy)]
struct Reads {
    bytes_per_s: u64,
    bytes: u64,
}

/// A step through `blocks` that visits each once: the smallest stride from about 0.618 of
/// them (golden ratio: far apart, no pattern a read-ahead follows) that is coprime with them.
fn coprime_stride(blocks: u64) -> u64 {
    fn gcd(mut a: u64, mut b: u64) -> u64 {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    }
    let mut s = (blocks as f64 * 0.618_033_988_7) as u64;
    s = s.max(1);
    while gcd(s, blocks) != 1 {
        s += 1;
    }
    s
}

/// Reads `region` at `depth`, each block of `request_bytes` at most once: in order
/// (sequential) or in a permutation of its blocks (random), until every block was read or
/// `time` passed. The rate and the bytes read.
fn run_reads(
    ring: &mut Ring,
    fd: std::os::fd::RawFd,
    region: Region,
    request_bytes: u64,
    depth: u32,
    pattern: Pattern,
    time: Option<Duration>,
) -> Result<Reads, CalibrationError> {
    let blocks = region.len / request_bytes;
    if blocks == 0 {
        return Ok(Reads {
            bytes_per_s: 0,
            bytes: 0,
        });
    }
    let stride = match pattern {
        Pattern::Sequential => 1,
        Pattern::Random => coprime_stride(blocks),
    };
    let mut next = 0u64;
    let mut bufs = Vec::new();
    for _ in 0..depth {
        bufs.push(ring.pool_mut().alloc().expect("32 buffers cover depth 32"));
    }
    let t0 = Instant::now();
    let mut done_bytes = 0u64;
    let mut in_flight = 0u32;
    let mut out = Vec::new();
    let issue = |ring: &mut Ring, i: usize, next: &mut u64| -> bool {
        if *next >= blocks {
            return false;
        }
        // The n-th block visited: n × stride modulo the blocks, a permutation (coprime).
        let block = u64::try_from(u128::from(*next) * u128::from(stride) % u128::from(blocks))
            .expect("below blocks");
        *next += 1;
        ring.read(
            fd,
            bufs[i],
            0,
            request_bytes as usize,
            region.start + block * request_bytes,
            0,
            0,
            i as u64,
        )
        .expect("room in the ring");
        true
    };
    for i in 0..depth as usize {
        if issue(ring, i, &mut next) {
            in_flight += 1;
        }
    }
    while in_flight > 0 {
        ring.submit_and_wait(1, None)
            .map_err(|e| CalibrationError::Ring(e.to_string()))?;
        out.clear();
        ring.reap(&mut out);
        for c in &out {
            in_flight -= 1;
            let n = c.io_result().map_err(|e| CalibrationError::Io {
                path: PathBuf::from("read"),
                source: e,
            })?;
            done_bytes += n as u64;
            let more = time.is_none_or(|t| t0.elapsed() < t);
            if more && issue(ring, c.token as usize, &mut next) {
                in_flight += 1;
            }
        }
    }
    for b in bufs {
        ring.pool_mut().free(b);
    }
    let secs = t0.elapsed().as_secs_f64().max(1e-9);
    Ok(Reads {
        bytes_per_s: (done_bytes as f64 / secs) as u64,
        bytes: done_bytes,
    })
}

pub(crate) fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figs(rates: &[(u32, u64)]) -> Vec<DepthFigure> {
        rates
            .iter()
            .map(|&(depth, bytes_per_s)| DepthFigure { depth, bytes_per_s })
            .collect()
    }

    #[test]
    fn regions_cover_the_size_once_on_mebibyte_boundaries() {
        for size in [0u64, 1 << 20, (64 << 20) + 4096, 256 << 30, 123_456_789] {
            for weights in [&[1u64; 11][..], &[2, 2, 1, 1, 1, 1, 1], &[1]] {
                let r = Region::split(size, weights);
                assert_eq!(r.len(), weights.len());
                assert_eq!(r[0].start, 0);
                for w in r.windows(2) {
                    assert_eq!(w[0].start + w[0].len, w[1].start);
                    assert_eq!(w[1].start % (1 << 20), 0);
                }
                let last = r.last().unwrap();
                assert_eq!(last.start + last.len, size);
            }
        }
    }

    #[test]
    fn the_random_stride_visits_every_block_once() {
        for blocks in [1u64, 2, 3, 10, 64, 97, 1000, 1024, 4096] {
            let s = coprime_stride(blocks);
            let mut seen = vec![false; blocks as usize];
            for n in 0..blocks {
                let b = (n * s % blocks) as usize;
                assert!(!seen[b], "block {b} of {blocks} twice (stride {s})");
                seen[b] = true;
            }
        }
    }

    #[test]
    fn best_read_depth_is_the_shallowest_within_five_per_cent_of_the_best() {
        // A disk that scales to depth 8 (fio on one VM): 8.
        let d = figs(&[(1, 400), (2, 600), (4, 800), (8, 1000), (16, 1010)]);
        assert_eq!(best_read_depth(&d), Some(8));
        // A disk that serves one request at a time: 1.
        let d = figs(&[(1, 1000), (2, 990), (4, 970), (8, 980), (16, 960)]);
        assert_eq!(best_read_depth(&d), Some(1));
        assert_eq!(best_read_depth(&[]), None);
    }

    #[test]
    fn send_cost_figures_become_the_capacitys_cpu_charge() {
        let c = Calibration {
            path: "x".into(),
            seq_read_bytes_per_s_depth1: 1,
            seq_read_bytes_per_s_depth4: 1,
            random: Vec::new(),
            seq_read_by_depth: Vec::new(),
            read_depth: None,
            send_ns: Some(3_835),
            send_byte_ps: Some(430),
            send_burst_byte_ps: Some(230),
        };
        let cap = c.capacity(1, 1, 1);
        assert_eq!(
            (cap.cpu_send_ns, cap.cpu_send_byte_ps, cap.cpu_burst_byte_ps),
            (3_835, 430, 230)
        );
        // A file of before the burst figure: the paced one stands for it.
        let no_burst = Calibration {
            send_burst_byte_ps: None,
            ..c.clone()
        };
        assert_eq!(no_burst.capacity(1, 1, 1).cpu_burst_byte_ps, 430);
        // A file of before the per-byte figure: the conservative one per byte.
        let old = Calibration {
            send_byte_ps: None,
            send_burst_byte_ps: None,
            ..c
        };
        assert_eq!(
            old.capacity(1, 1, 1).cpu_send_byte_ps,
            Capacity::CONSERVATIVE.cpu_send_byte_ps
        );
        assert_eq!(
            old.capacity(1, 1, 1).cpu_burst_byte_ps,
            Capacity::CONSERVATIVE.cpu_burst_byte_ps
        );
    }

    #[test]
    fn a_calibration_file_without_depth_figures_still_loads() {
        let text = "path = \"x\"\nseq_read_bytes_per_s_depth1 = 1\nseq_read_bytes_per_s_depth4 = 2\nrandom = []\n";
        let c: Calibration = toml::from_str(text).unwrap();
        assert!(c.seq_read_by_depth.is_empty());
        assert_eq!(c.read_depth, None);
    }
}
