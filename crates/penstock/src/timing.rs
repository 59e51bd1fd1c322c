//! `penstock stream --timing pcr|auto`: the unit plan of a TS file from its PCR
//! (`penstock_core::ts`), read from the source the stream will send — the same open
//! descriptor, in chunks — and `auto`'s choice between a recording's tracks, the PCR and the
//! burst.

use std::os::unix::fs::FileExt;
use std::path::Path;

use anyhow::{Context, Result};
use penstock_core::endpoint::Endpoint;
use penstock_core::track::{Playback, TrackKind};
use penstock_core::ts::{PcrLimits, PcrPid, PcrPidSource, TsPlan};
use penstock_driver::record::track_path;

/// Bytes `auto` reads to recognise MPEG-TS (five packets).
const PROBE_BYTES: usize = 5 * 188;

/// Extensions of MPEG-TS files (M2TS's `.m2ts`/`.mts` have 192-byte packets: not these).
const TS_EXTENSIONS: [&str; 5] = ["ts", "m2t", "trp", "tsv", "mpegts"];

/// What `--timing` asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timing {
    /// A recording's tracks.
    Tracks,
    /// The PCR of a TS file.
    Pcr,
    /// The samples' decode times of a plain MP4 (`penstock_core::mp4::timing`).
    Samples,
    /// Tracks if the recording has them, else the PCR for a TS file, else none.
    Auto,
}

impl std::str::FromStr for Timing {
    type Err = String;
    fn from_str(s: &str) -> Result<Timing, String> {
        match s {
            "tracks" => Ok(Timing::Tracks),
            "pcr" => Ok(Timing::Pcr),
            "samples" => Ok(Timing::Samples),
            "auto" => Ok(Timing::Auto),
            _ => Err(format!("expected tracks, pcr, samples or auto, got {s:?}")),
        }
    }
}

/// `--timing auto`'s choice for a source (`None`: no timing of its own, the burst or the
/// flags' schedule).
pub fn auto(source: &Endpoint, tracks: Option<&Path>) -> Option<Timing> {
    match source {
        Endpoint::File { path } => {
            let has_tracks = [TrackKind::Time, TrackKind::Packet]
                .iter()
                .all(|&k| track_path(path, k).exists());
            if has_tracks {
                return Some(Timing::Tracks);
            }
            let by_name = path
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| TS_EXTENSIONS.iter().any(|t| e.eq_ignore_ascii_case(t)));
            if by_name || starts_like_ts(path) {
                return Some(Timing::Pcr);
            }
            let mp4_by_name = path
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| MP4_EXTENSIONS.iter().any(|t| e.eq_ignore_ascii_case(t)));
            (mp4_by_name || starts_like_mp4(path)).then_some(Timing::Samples)
        }
        Endpoint::Volume { partition, .. } => {
            let prefix = tracks.map_or_else(|| partition.as_str().into(), Path::to_path_buf);
            let has_tracks = [TrackKind::Time, TrackKind::Packet]
                .iter()
                .all(|&k| track_path(&prefix, k).exists());
            has_tracks.then_some(Timing::Tracks)
        }
        _ => None,
    }
}

/// Extensions of MP4 files timed by their samples.
const MP4_EXTENSIONS: [&str; 3] = ["mp4", "m4v", "mov"];

/// Whether a file starts with an `ftyp` box (an ISO BMFF file).
fn starts_like_mp4(path: &Path) -> bool {
    let Ok(f) = std::fs::File::open(path) else {
        return false;
    };
    let mut buf = [0u8; 8];
    f.read_exact_at(&mut buf, 0).is_ok() && &buf[4..8] == b"ftyp"
}

/// The samples' playback of the MP4 behind `file` from `from_ns`, units of at most
/// `unit_bytes_max`, and a line saying what was planned.
pub fn samples_playback(
    file: &std::fs::File,
    label: &str,
    from_ns: Option<u64>,
    unit_bytes_max: u32,
    units_max: usize,
) -> Result<(Playback, String)> {
    let len = file.metadata().with_context(|| label.to_string())?.len();
    let movie = penstock_driver::media::mp4_movie(file, len, &Default::default())
        .with_context(|| label.to_string())?;
    let pb = penstock_core::mp4::plan_mp4(&movie, len, from_ns, unit_bytes_max, units_max)
        .with_context(|| label.to_string())?;
    let tracks: Vec<String> = movie
        .tracks
        .iter()
        .map(|t| {
            format!(
                "track {} {} ({} samples, {:.3} s)",
                t.id,
                t.codec.rfc6381(),
                t.samples.len(),
                t.duration_ticks() as f64 / f64::from(t.timescale.max(1))
            )
        })
        .collect();
    let mut line = format!(
        "MP4 samples: {}; {} units of up to {unit_bytes_max} bytes over {:.3} s",
        tracks.join(", "),
        pb.units.len(),
        pb.units.last().map_or(0, |u| u.offset_ns) as f64 / 1e9
    );
    if pb.media_offset_bytes > 0 {
        line += &format!(
            "; from byte {} ({:.3} s)",
            pb.media_offset_bytes,
            pb.start_time_ns as f64 / 1e9
        );
    }
    Ok((pb, line))
}

/// Whether a file's first bytes are MPEG-TS packets (sync bytes 188 apart).
fn starts_like_ts(path: &Path) -> bool {
    let Ok(f) = std::fs::File::open(path) else {
        return false;
    };
    let mut buf = [0u8; PROBE_BYTES];
    let n = f.read_at(&mut buf, 0).unwrap_or(0);
    penstock_core::ts::looks_like_ts(&buf[..n])
}

/// The PCR plan of the file behind `file` (`penstock_driver::media::pcr_plan`).
pub fn pcr_plan(file: &std::fs::File, label: &str, limits: &PcrLimits) -> Result<(PcrPid, TsPlan)> {
    penstock_driver::media::pcr_plan(file, limits).with_context(|| label.to_string())
}

/// The playback of a PCR plan from `from_ns`, and a line saying what was planned: from the
/// key frame at or before `from_ns` where `keys` (the plan's units holding the file's key
/// frames, `TsPlan::key_units`) could be read, else from the PCR at or before it.
pub fn pcr_playback(
    pid: &PcrPid,
    plan: &TsPlan,
    from_ns: Option<u64>,
    keys: Option<Result<Vec<usize>, penstock_driver::media::MediaError>>,
) -> (Playback, String) {
    let (pb, seek) = match (from_ns, keys) {
        (None, _) => (plan.playback_from(None), String::new()),
        (Some(t), Some(Ok(keys))) if !keys.is_empty() => (
            plan.playback_from_key(&keys, t),
            format!(
                " at the key frame at or before it ({} key frames)",
                keys.len()
            ),
        ),
        (Some(t), Some(Err(e))) => (
            plan.playback_from(Some(t)),
            format!(" at the PCR at or before it (no key-frame index: {e})"),
        ),
        (Some(t), _) => (
            plan.playback_from(Some(t)),
            " at the PCR at or before it (no key frame)".to_string(),
        ),
    };
    let seconds = plan.duration_ns() as f64 / 1e9;
    let why = match pid.source {
        PcrPidSource::Pmt { program, .. } => format!("the PMT of program {program}"),
        PcrPidSource::FirstPcr => "the first PID carrying a PCR".to_string(),
    };
    let mut line = format!(
        "PCR of PID {:#x} ({why}): {} units of up to {} bytes over {seconds:.3} s, {:.2} Mbit/s",
        pid.pid,
        plan.units.len(),
        plan.unit_bytes(),
        if seconds > 0.0 {
            plan.media_bytes as f64 * 8.0 / seconds / 1e6
        } else {
            0.0
        },
    );
    if plan.discontinuities > 0 {
        line += &format!("; {} PCR discontinuities spliced", plan.discontinuities);
    }
    if plan.tail_bytes > 0 {
        line += &format!(
            "; {} bytes after the last whole packet not sent",
            plan.tail_bytes
        );
    }
    if pb.media_offset_bytes > 0 {
        line += &format!(
            "; from byte {} ({:.3} s){seek}",
            pb.media_offset_bytes,
            pb.start_time_ns as f64 / 1e9
        );
    }
    (pb, line)
}
