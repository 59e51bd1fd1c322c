//! Self-calibration: a device no calibration file covers is measured briefly on first use and
//! its figures cached per device (`penstock calibrate`'s full measurement is the parent
//! module's job).

use super::{
    CalibrationError, DepthFigure, Pattern, READ_DEPTH_MAX, Region, best_read_depth, run_reads,
    sequential_by_depth, write_atomically,
};
use crate::device::{device_node, identity, major_minor};
use penstock_uring::{Ring, RingConfig};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The engine's self-calibration: on the first stream from a device no calibration file
/// covers (for its read depth), or the first rt admission on a device without figures (and
/// only when no calibration file gave them), a short measurement of that device —
/// sequential O_DIRECT reads of 1 MiB and random O_DIRECT reads of 64 KiB, each at depth 1,
/// `time` each, then sequential reads of 1 MiB at each of [`READ_DEPTHS`](super::READ_DEPTHS), `time / 4` each
/// (the read depth, [`best_read_depth`]) — kept in a cache file per device and used again
/// while the device is the same (its size and model, read from `/sys/dev/block/MAJ:MIN`)
/// and the record is of this probe ([`DEVICE_PROBE`]).
///
/// Cold reads: each measurement reads its own region of the device or file, and no block is
/// read twice in one calibration ([`DEVICE_PROBE`] 2). Data that was written or read a moment
/// ago can still be served by a cache no O_DIRECT read bypasses (a VM host's page cache, a
/// drive's): the record says how old the measured file's data was (`data_age_s`), and the
/// server measures its root's device through the oldest large file it finds there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelfCalibration {
    /// Off: devices without figures are charged with the default figures.
    pub enabled: bool,
    /// Where measured devices are cached (`None`: not cached, measured at each engine start).
    pub cache_dir: Option<PathBuf>,
    /// Time per measurement (two of them); at most [`SELF_CALIBRATION_TIME_MAX`].
    pub time: Duration,
}

/// The longest self-calibration measurement (two are made, then five of a quarter of it:
/// under 5 s in all).
pub const SELF_CALIBRATION_TIME_MAX: Duration = Duration::from_millis(1500);

impl Default for SelfCalibration {
    /// Off (the library's default; `penstock stream` and `penstock serve` turn it on).
    fn default() -> Self {
        SelfCalibration {
            enabled: false,
            cache_dir: None,
            time: Duration::from_millis(1000),
        }
    }
}

/// `$XDG_CACHE_HOME/penstock`, else `~/.cache/penstock`.
pub fn default_cache_dir() -> Option<PathBuf> {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .map(|b| b.join("penstock"))
}

/// One device's self-calibration, as cached.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeviceRecord {
    /// `MAJ:MIN`.
    pub device: String,
    /// From `/sys/dev/block/MAJ:MIN`: size in 512-byte sectors and model ("" when absent).
    pub size_sectors: u64,
    pub model: String,
    pub seq_read_bytes_per_s: u64,
    pub random_iops: u64,
    pub random_request_bytes: u64,
    /// When it was measured (Unix seconds).
    pub measured_unix_s: u64,
    /// [`best_read_depth`] of `seq_read_by_depth`: the uring path's read depth on this device
    /// (absent in records cached before it was measured: those are measured again).
    #[serde(default)]
    pub read_depth: Option<u32>,
    #[serde(default)]
    pub seq_read_by_depth: Vec<DepthFigure>,
    /// [`DEVICE_PROBE`] when measured (0 in records of the probe that read a file over and
    /// over, which a cache below the device answered: those are measured again).
    #[serde(default)]
    pub probe: u32,
    /// Bytes the measurement read, every block once (at most the file's or device's size).
    #[serde(default)]
    pub bytes_read: u64,
    /// How long before the measurement the measured file's data was last written (its
    /// mtime), in seconds; `None` for a device node read in place. Data written a moment ago
    /// may still be in a cache below the device, and then the figures are too high.
    #[serde(default)]
    pub data_age_s: Option<u64>,
}

/// The way [`device_figures`] measures; a cached record of another way is measured again.
pub const DEVICE_PROBE: u32 = 2;

impl DeviceRecord {
    pub fn figures(&self) -> penstock_core::admission::DeviceFigures {
        penstock_core::admission::DeviceFigures {
            disk: penstock_core::admission::DiskCapacity {
                seq_bytes_per_s: self.seq_read_bytes_per_s.max(1),
                random_iops: self.random_iops.max(1),
                random_request_bytes: self.random_request_bytes,
            },
            source: penstock_core::admission::FigureSource::SelfCalibrated {
                unix_s: self.measured_unix_s,
            },
        }
    }
}

/// Why a device was not self-calibrated (said once per device; it is then charged with the
/// default figures).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SelfCalibrationError {
    #[error("device {0}: no block device behind it (no /sys/dev/block entry)")]
    NotBlock(String),
    #[error(
        "device {0}: neither the device node nor a file on it of at least 16 MiB opens with O_DIRECT"
    )]
    NoDirect(String),
    #[error(transparent)]
    Measure(#[from] CalibrationError),
}

/// The figures of device `dev` from the cache when its identity is unchanged, else measured
/// now (the block device node read in place when this process may open it, else `file`, a
/// file on it, reopened with O_DIRECT) and cached. Never writes to the device.
pub fn device_figures(
    dev: u64,
    file: Option<std::os::fd::BorrowedFd<'_>>,
    cfg: &SelfCalibration,
) -> Result<DeviceRecord, SelfCalibrationError> {
    let (major, minor) = major_minor(dev);
    let name = format!("{major}:{minor}");
    let (size_sectors, model) =
        identity(dev).ok_or_else(|| SelfCalibrationError::NotBlock(name.clone()))?;
    let cache = cfg
        .cache_dir
        .as_ref()
        .map(|d| d.join("devices").join(format!("{major}-{minor}.toml")));
    if let Some(path) = &cache
        && let Ok(text) = std::fs::read_to_string(path)
        && let Ok(r) = toml::from_str::<DeviceRecord>(&text)
        && r.device == name
        && r.size_sectors == size_sectors
        && r.model == model
        && r.read_depth.is_some()
        && r.probe == DEVICE_PROBE
    {
        return Ok(r);
    }
    let node = device_node(dev).unwrap_or_else(|| PathBuf::from(format!("/dev/block/{name}")));
    let fd = crate::open::reopen_direct(&node)
        .or_else(|| {
            let fd = file?;
            // A file too small to time sequential reads on says little about the device.
            let st = rustix::fs::fstat(fd).ok()?;
            if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile
                || st.st_size < SELF_CALIBRATION_FILE_BYTES_MIN as i64
            {
                return None;
            }
            let proc = PathBuf::from(format!(
                "/proc/self/fd/{}",
                std::os::fd::AsRawFd::as_raw_fd(&fd)
            ));
            crate::open::reopen_direct(&proc)
        })
        .ok_or_else(|| SelfCalibrationError::NoDirect(name.clone()))?;
    // A first start is otherwise silent for these seconds.
    let what = if model.is_empty() {
        name.clone()
    } else {
        format!("{name} ({model})")
    };
    tracing::info!(
        "measuring device {what}, once, by reading it (a few seconds; cached{})",
        cache.as_ref().map_or(String::new(), |p| format!(
            " in {} for later starts",
            p.display()
        ))
    );
    let time = cfg.time.min(SELF_CALIBRATION_TIME_MAX);
    let size =
        rustix::fs::seek(&fd, rustix::fs::SeekFrom::End(0)).map_err(|e| CalibrationError::Io {
            path: node.clone(),
            source: e.into(),
        })?;
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let data_age_s = rustix::fs::fstat(&fd).ok().and_then(|st| {
        (rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile)
            .then(|| now_s.saturating_sub(u64::try_from(st.st_mtime).unwrap_or(0)))
    });
    let (mut ring, _) = Ring::new(&RingConfig {
        buffers: READ_DEPTH_MAX,
        buffer_bytes: 1 << 20,
        ..RingConfig::default()
    })
    .map_err(|e| CalibrationError::Ring(e.to_string()))?;
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    // Requests the device's queue takes whole (a loop device splits a 1 MiB read of scattered
    // pages in two, which its cgroup throttle charges twice: half the rate); the volume path
    // cuts its pieces to the same size.
    let seq_request = crate::volume::queue_request_bytes_max_of(major, minor)
        .unwrap_or(1 << 20)
        .min(1 << 20);
    // Each measurement its own region, every block read once: sequential and random twice
    // the share of a depth (they are timed twice as long), then one for each depth.
    let regions = Region::split(size, &[2, 2, 1, 1, 1, 1, 1]);
    let seq = run_reads(
        &mut ring,
        raw,
        regions[0],
        seq_request,
        1,
        Pattern::Sequential,
        Some(time),
    )?;
    let random_request_bytes = 65536;
    let random = run_reads(
        &mut ring,
        raw,
        regions[1],
        random_request_bytes,
        1,
        Pattern::Random,
        Some(time),
    )?;
    let (by_depth, depth_bytes) =
        sequential_by_depth(&mut ring, raw, &regions[2..], Some(time / 4))?;
    let record = DeviceRecord {
        device: name,
        size_sectors,
        model,
        seq_read_bytes_per_s: seq.bytes_per_s.max(1),
        random_iops: (random.bytes_per_s / random_request_bytes).max(1),
        random_request_bytes,
        measured_unix_s: now_s,
        read_depth: best_read_depth(&by_depth),
        seq_read_by_depth: by_depth,
        probe: DEVICE_PROBE,
        bytes_read: seq.bytes + random.bytes + depth_bytes,
        data_age_s,
    };
    if let Some(path) = &cache {
        // A cache that cannot be written costs a measurement next time, nothing more.
        let _ = write_atomically(
            path,
            &toml::to_string(&record).expect("a record serializes"),
        );
    }
    Ok(record)
}

/// The smallest file self-calibration measures a device through (when its node cannot be
/// read).
pub const SELF_CALIBRATION_FILE_BYTES_MIN: u64 = 16 << 20;

/// The file under `dir` that self-calibration measures `dir`'s device through when its node
/// cannot be read: of the regular files of at least [`SELF_CALIBRATION_FILE_BYTES_MIN`] on
/// the same device, the one written longest ago (its data the least likely to sit in a cache
/// below the device), looking at no more than `entries_max` directory entries (breadth
/// first, symbolic links not followed). `None` when there is none.
/// How many directory entries a server's start looks at for [`cold_file_under`] its root.
pub const COLD_FILE_ENTRIES_MAX: usize = 4096;

pub fn cold_file_under(dir: &Path, entries_max: usize) -> Option<std::fs::File> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(dir).ok()?.dev();
    let mut queue = std::collections::VecDeque::from([dir.to_path_buf()]);
    let mut seen = 0usize;
    let mut best: Option<(i64, PathBuf)> = None;
    while let Some(d) = queue.pop_front() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            seen += 1;
            if seen > entries_max {
                queue.clear();
                break;
            }
            // symlink_metadata: a link is not followed out of the tree.
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            if m.dev() != dev {
                continue;
            }
            if m.is_dir() {
                queue.push_back(e.path());
            } else if m.is_file()
                && m.len() >= SELF_CALIBRATION_FILE_BYTES_MIN
                && best.as_ref().is_none_or(|(t, _)| m.mtime() < *t)
            {
                best = Some((m.mtime(), e.path()));
            }
        }
    }
    std::fs::File::open(best?.1).ok()
}
