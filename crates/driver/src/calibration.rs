//! `penstock calibrate`: measure the device under a path, like seastar's iotune, and keep the
//! figures in a file the engine reads at start (admission control's capacity).
//!
//! Sequential bandwidth: O_DIRECT reads of 1 MiB at depth 1 and 4. Random IOPS: O_DIRECT reads
//! of 4 KiB and 64 KiB at depth 1, 8 and 32, at uniformly random aligned offsets, each for a
//! fixed time. All reads go through io_uring (the engine's own ring).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use penstock_core::admission::Capacity;
use penstock_uring::{Ring, RingConfig};
use serde::{Deserialize, Serialize};

/// One random-read measurement.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RandomFigure {
    pub request_bytes: u64,
    pub depth: u32,
    pub iops: u64,
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
            net_bytes_per_s,
            buffer_count,
            buffer_bytes,
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

fn measure(file: &Path, opts: &CalibrateOptions) -> Result<Calibration, CalibrationError> {
    let fd = crate::open::reopen_direct(file)
        .ok_or_else(|| CalibrationError::NoDirect(file.to_path_buf()))?;
    let size =
        rustix::fs::seek(&fd, rustix::fs::SeekFrom::End(0)).map_err(|e| CalibrationError::Io {
            path: file.to_path_buf(),
            source: e.into(),
        })?;
    let (mut ring, _) = Ring::new(&RingConfig {
        buffers: 32,
        buffer_bytes: 1 << 20,
        ..RingConfig::default()
    })
    .map_err(|e| CalibrationError::Ring(e.to_string()))?;
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    let seq1 = run_reads(&mut ring, raw, size, 1 << 20, 1, Pattern::Sequential, None)?;
    let seq4 = run_reads(&mut ring, raw, size, 1 << 20, 4, Pattern::Sequential, None)?;
    let mut random = Vec::new();
    for request_bytes in [4096u64, 65536] {
        for depth in [1u32, 8, 32] {
            let per_s = run_reads(
                &mut ring,
                raw,
                size,
                request_bytes,
                depth,
                Pattern::Random,
                Some(opts.random_time),
            )?;
            random.push(RandomFigure {
                request_bytes,
                depth,
                iops: per_s / request_bytes,
            });
        }
    }
    Ok(Calibration {
        path: file.display().to_string(),
        seq_read_bytes_per_s_depth1: seq1,
        seq_read_bytes_per_s_depth4: seq4,
        random,
    })
}

#[derive(Clone, Copy)]
enum Pattern {
    Sequential,
    Random,
}

/// Reads at `depth` until the file is read (sequential) or `time` passed; bytes per second.
fn run_reads(
    ring: &mut Ring,
    fd: std::os::fd::RawFd,
    size: u64,
    request_bytes: u64,
    depth: u32,
    pattern: Pattern,
    time: Option<Duration>,
) -> Result<u64, CalibrationError> {
    let blocks = (size / request_bytes).max(1);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next_block = 0u64;
    let mut bufs = Vec::new();
    for _ in 0..depth {
        bufs.push(ring.pool_mut().alloc().expect("32 buffers cover depth 32"));
    }
    let t0 = Instant::now();
    let mut done_bytes = 0u64;
    let mut in_flight = 0u32;
    let mut out = Vec::new();
    let issue = |ring: &mut Ring, i: usize, next_block: &mut u64, rng: &mut u64| -> bool {
        let block = match pattern {
            Pattern::Sequential => {
                if *next_block >= blocks {
                    return false;
                }
                *next_block += 1;
                *next_block - 1
            }
            Pattern::Random => {
                *rng ^= *rng << 13;
                *rng ^= *rng >> 7;
                *rng ^= *rng << 17;
                *rng % blocks
            }
        };
        ring.read(
            fd,
            bufs[i],
            0,
            request_bytes as usize,
            block * request_bytes,
            0,
            0,
            i as u64,
        )
        .expect("room in the ring");
        true
    };
    for i in 0..depth as usize {
        if issue(ring, i, &mut next_block, &mut rng) {
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
            if more && issue(ring, c.token as usize, &mut next_block, &mut rng) {
                in_flight += 1;
            }
        }
    }
    for b in bufs {
        ring.pool_mut().free(b);
    }
    let secs = t0.elapsed().as_secs_f64().max(1e-9);
    Ok((done_bytes as f64 / secs) as u64)
}
