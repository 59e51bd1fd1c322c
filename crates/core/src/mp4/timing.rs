//! `penstock stream movie.mp4 … --timing auto|samples`: a plain MP4's bytes paced by its
//! samples' decode times, as `--timing pcr` paces a TS file by its PCR. The result is the same
//! [`Playback`] the PCR planner makes (contiguous units of the file, each due at an offset from
//! the start), so the engine runs it unchanged.
//!
//! Every sample of every track, in file order, starts a unit that runs to the next sample's
//! start (the bytes between — chunk padding, a `moov` at the end — ride with the sample before
//! them; the bytes before the first sample, `ftyp` and a leading `moov`, with the first). A
//! unit is due at its sample's presentation-line decode time in ns (the track's decode time
//! less its edit's media time), never before the unit before it (tracks interleave by
//! chunks, each chunk a little ahead of or behind the other track). A unit larger than
//! `unit_bytes_max` is split into pieces due at the same time (one datagram each on UDP).
//! `--from` starts at the first video sync sample at or before the time (the first track's,
//! with no video): its file offset, its time as the new zero.

use super::Mp4Error;
use super::movie::{Movie, TrackKind};
use crate::schedule::plan::UnitPlan;
use crate::track::Playback;

/// Why an MP4 could not be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Mp4PlanError {
    #[error(transparent)]
    Mp4(#[from] Mp4Error),
    #[error("the plan would hold more than {0} units")]
    TooManyUnits(usize),
    #[error("no samples")]
    Empty,
}

/// The samples of all tracks in file order: (offset, due ns).
fn samples_in_file_order(movie: &Movie) -> Vec<(u64, u64)> {
    let mut v = Vec::with_capacity(movie.tracks.iter().map(|t| t.samples.len()).sum());
    for t in &movie.tracks {
        let ts = u128::from(t.timescale.max(1));
        for s in &t.samples {
            let line = s.dts.saturating_sub(t.edit.media_time);
            v.push((s.offset, (u128::from(line) * 1_000_000_000 / ts) as u64));
        }
    }
    v.sort_unstable();
    v
}

/// The playback of `movie` (a file of `file_len` bytes) from `from_ns` (the sync sample at or
/// before it), units of at most `unit_bytes_max`, at most `units_max` of them.
pub fn plan_mp4(
    movie: &Movie,
    file_len: u64,
    from_ns: Option<u64>,
    unit_bytes_max: u32,
    units_max: usize,
) -> Result<Playback, Mp4PlanError> {
    let unit_bytes_max = unit_bytes_max.max(1);
    let samples = samples_in_file_order(movie);
    if samples.is_empty() {
        return Err(Mp4PlanError::Empty);
    }
    // Where to start: the lead track's sync sample at or before `from_ns`.
    let start_offset = match from_ns {
        None => 0,
        Some(from) => {
            let lead = movie
                .tracks
                .iter()
                .find(|t| t.kind == TrackKind::Video)
                .unwrap_or(&movie.tracks[0]);
            let ticks = (u128::from(from) * u128::from(lead.timescale) / 1_000_000_000) as u64
                + lead.edit.media_time;
            let i = lead.sync_at_or_before(ticks);
            lead.samples.get(i).map_or(0, |s| s.offset)
        }
    };
    let first = samples.partition_point(|&(off, _)| off < start_offset);
    let first = first.min(samples.len() - 1);
    // From the start of the file: the bytes before the first sample ride with it.
    let media_offset_bytes = if first == 0 { 0 } else { samples[first].0 };
    let t0 = samples[first..].iter().map(|s| s.1).min().unwrap_or(0);
    let mut units = Vec::new();
    let mut due = 0u64;
    for (k, &(off, ns)) in samples.iter().enumerate().skip(first) {
        let begin = if k == first { media_offset_bytes } else { off };
        let end = samples.get(k + 1).map_or(file_len, |n| n.0);
        due = due.max(ns.saturating_sub(t0));
        let mut left = end.saturating_sub(begin);
        while left > 0 {
            if units.len() >= units_max {
                return Err(Mp4PlanError::TooManyUnits(units_max));
            }
            let n = left.min(u64::from(unit_bytes_max));
            units.push(UnitPlan {
                offset_ns: due,
                size_bytes: n as u32,
            });
            left -= n;
        }
    }
    if units.is_empty() {
        return Err(Mp4PlanError::Empty);
    }
    Ok(Playback {
        first_packet: 0,
        media_offset_bytes,
        media_bytes: file_len - media_offset_bytes,
        start_time_ns: t0,
        units,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mp4::movie::{Codec, Sample, parse_movie};
    use crate::mp4::write::{PlainTrack, plain_moov};

    fn movie() -> (Movie, u64) {
        // 10 s at 25 fps, 4000 bytes a frame, a sync sample every 2 s; samples from byte 1000.
        let samples: Vec<Sample> = (0..250)
            .map(|i| Sample {
                offset: 1000 + i * 4000,
                dts: i * 512,
                size: 4000,
                cts_offset: 0,
            })
            .collect();
        let t = PlainTrack {
            id: 1,
            kind: TrackKind::Video,
            timescale: 12800,
            codec: Codec::Avc {
                config: vec![1, 0x64, 0, 0x1f],
            },
            samples,
            last_duration: 512,
            sync: Some((0..250).step_by(50).collect()),
            co64: false,
        };
        let moov = plain_moov(1000, &[t]);
        let len = 1000 + 250 * 4000 + 500;
        let m = parse_movie(&moov[8..], len, &Default::default()).unwrap();
        (m, len)
    }

    #[test]
    fn units_cover_the_file_paced_by_decode_times() {
        let (m, len) = movie();
        let p = plan_mp4(&m, len, None, 1316, 1 << 20).unwrap();
        assert_eq!(p.media_offset_bytes, 0);
        let total: u64 = p.units.iter().map(|u| u64::from(u.size_bytes)).sum();
        assert_eq!(total, len);
        assert!(p.units.windows(2).all(|w| w[0].offset_ns <= w[1].offset_ns));
        assert!(p.units.iter().all(|u| u.size_bytes <= 1316));
        // The last frame is due at 249 × 40 ms.
        assert_eq!(p.units.last().unwrap().offset_ns, 249 * 40_000_000);
    }

    #[test]
    fn from_starts_at_the_sync_sample_at_or_before() {
        let (m, len) = movie();
        // 5 s: the sync sample at 4 s (frame 100).
        let p = plan_mp4(&m, len, Some(5_000_000_000), 1 << 20, 1 << 20).unwrap();
        assert_eq!(p.media_offset_bytes, 1000 + 100 * 4000);
        assert_eq!(p.start_time_ns, 4_000_000_000);
        assert_eq!(p.units[0].offset_ns, 0);
        assert_eq!(p.units.len(), 150);
        assert_eq!(p.media_bytes, len - p.media_offset_bytes);
        assert_eq!(
            plan_mp4(&m, len, None, 100, 10),
            Err(Mp4PlanError::TooManyUnits(10))
        );
    }
}
