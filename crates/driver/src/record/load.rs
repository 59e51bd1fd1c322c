//! Reading a recording back: its three tracks decoded and checked against the media (what
//! `penstock record check`, the RTSP server and stream-by-time read). The writer is the parent
//! module; the two share only the file names ([`track_path`], [`media_path`]).

use super::{KINDS, track_path};
use penstock_core::track::{
    CheckReport, Decoded, FrameRecord, PacketRecord, StopReason, TimeRecord, TrackKind, check,
    decode, valid_records_from,
};
use std::io;
use std::path::{Path, PathBuf};

/// A recording's tracks as read back: each track's decoded good prefix and whether anything
/// good follows where its decoder stopped, the media length, and the check of the whole.
#[derive(Debug, Clone)]
pub struct LoadedRecording {
    pub time: Decoded<TimeRecord>,
    pub packet: Decoded<PacketRecord>,
    pub frame: Decoded<FrameRecord>,
    /// Per track (time, packet, frame): good-checksum records after the decoder's stop.
    pub valid_after_stop: [u64; 3],
    pub media_len_bytes: u64,
    pub report: CheckReport,
}

impl LoadedRecording {
    /// Why the recording is not clean, if it is not: a disagreement, a record with a good
    /// checksum that is out of place, or good records after a bad one (damage, not a torn
    /// tail). Torn or unsynced tails are clean.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if let Some(d) = &self.report.disagreement {
            p.push(format!("disagreement: {d}"));
        }
        let stops = [
            (TrackKind::Time, self.time.stop),
            (TrackKind::Packet, self.packet.stop),
            (TrackKind::Frame, self.frame.stop),
        ];
        for ((kind, stop), after) in stops.into_iter().zip(self.valid_after_stop) {
            match stop {
                StopReason::End => {}
                StopReason::Truncated { .. } | StopReason::BadChecksum { .. } if after == 0 => {}
                StopReason::Truncated { .. } | StopReason::BadChecksum { .. } => p.push(format!(
                    "{kind} track damaged: {stop}, and {after} good records follow it"
                )),
                other => p.push(format!("{kind} track: {other}")),
            }
        }
        p
    }
}

/// Why a recording could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: {source}")]
    Track {
        path: PathBuf,
        source: penstock_core::track::TrackError,
    },
}

/// The media file for `path`: `path` itself, or the media beside a track file given instead
/// (`REC.time` → `REC`).
pub fn media_path(path: &Path) -> PathBuf {
    let s = path.as_os_str().to_string_lossy();
    for kind in KINDS {
        if let Some(stem) = s.strip_suffix(kind.file_suffix())
            && !stem.is_empty()
            && Path::new(stem).exists()
        {
            return PathBuf::from(stem);
        }
    }
    path.to_path_buf()
}

/// Reads the tracks beside `media` (at most `records_max` records each) and checks them.
pub fn load_recording(media: &Path, records_max: u64) -> Result<LoadedRecording, LoadError> {
    let media_len_bytes = std::fs::metadata(media)
        .map_err(|source| LoadError::Io {
            path: media.to_path_buf(),
            source,
        })?
        .len();
    load_tracks(media, media_len_bytes, records_max)
}

/// Reads the tracks named after `prefix` and checks them against media of `media_len_bytes`
/// (a recording in a volume partition: the partition's size).
pub fn load_tracks(
    prefix: &Path,
    media_len_bytes: u64,
    records_max: u64,
) -> Result<LoadedRecording, LoadError> {
    load_tracks_with(prefix, media_len_bytes, records_max, |p| std::fs::read(p))
}

/// [`load_tracks`] with the track files read by `read_file` (the RTSP server reads them
/// beneath its root, confined like the media).
pub fn load_tracks_with(
    prefix: &Path,
    media_len_bytes: u64,
    records_max: u64,
    read_file: impl Fn(&Path) -> std::io::Result<Vec<u8>>,
) -> Result<LoadedRecording, LoadError> {
    let read = |path: PathBuf| {
        read_file(&path)
            .map(|b| (path.clone(), b))
            .map_err(|source| LoadError::Io { path, source })
    };
    let (tp, tb) = read(track_path(prefix, TrackKind::Time))?;
    let (pp, pb) = read(track_path(prefix, TrackKind::Packet))?;
    let (fp, fb) = read(track_path(prefix, TrackKind::Frame))?;
    let time = decode::<TimeRecord>(&tb, records_max)
        .map_err(|source| LoadError::Track { path: tp, source })?;
    let packet = decode::<PacketRecord>(&pb, records_max)
        .map_err(|source| LoadError::Track { path: pp, source })?;
    let frame = decode::<FrameRecord>(&fb, records_max)
        .map_err(|source| LoadError::Track { path: fp, source })?;
    let after =
        |bytes: &[u8], kind: TrackKind, n: usize| valid_records_from(bytes, kind, n as u64 + 1);
    let valid_after_stop = [
        after(&tb, TrackKind::Time, time.records.len()),
        after(&pb, TrackKind::Packet, packet.records.len()),
        after(&fb, TrackKind::Frame, frame.records.len()),
    ];
    let report = check(
        &time.records,
        &packet.records,
        &frame.records,
        media_len_bytes,
    );
    Ok(LoadedRecording {
        time,
        packet,
        frame,
        valid_after_stop,
        media_len_bytes,
        report,
    })
}
