//! HLS media playlists (RFC 8216) whose segments are byte ranges of one TS file, cut at its
//! key frames ([`super::ts_index`]).
//!
//! A segment starts at a key frame's TS packet and ends where the next segment starts (the
//! first key frame at least the target duration after its own start), or at the end of the
//! file; the first segment starts at offset 0, so whatever precedes the first key frame (the
//! PAT and PMT, audio) is in it. Every segment but the first lacks the PAT and PMT, so the
//! playlist names them with `EXT-X-MAP`: one byte range from the first PAT packet to the end
//! of the first PMT packet (two packets when they are adjacent, as ffmpeg writes them), which
//! the player prepends to every segment it decodes (docs/hls.md says why this and not ranges
//! that begin at a repeated PAT).

use std::fmt::Write as _;

use super::ts_index::{PTS_TICKS_PER_S, TsIndex};
use crate::ts::TS_PACKET_BYTES;

/// One segment: `len` bytes of the file from `offset`, lasting `duration_ticks` (90 kHz).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub offset: u64,
    pub len: u64,
    pub duration_ticks: u64,
}

/// The segments of `index` for a target duration of `target_ticks` (90 kHz, above zero).
pub fn segments(index: &TsIndex, target_ticks: u64) -> Vec<Segment> {
    let target_ticks = target_ticks.max(1);
    let kf = &index.key_frames;
    let mut out = Vec::new();
    let Some(first) = kf.first() else {
        return out;
    };
    let (mut start_offset, mut start_pts) = (0u64, first.pts);
    for k in &kf[1..] {
        // Key frames in file order; their times may step back only across a discontinuity
        // the index did not unwrap: such a key frame does not cut.
        if k.pts >= start_pts + target_ticks && k.offset > start_offset {
            out.push(Segment {
                offset: start_offset,
                len: k.offset - start_offset,
                duration_ticks: k.pts - start_pts,
            });
            (start_offset, start_pts) = (k.offset, k.pts);
        }
    }
    let end_pts = index.last_pts + index.frame_ticks();
    out.push(Segment {
        offset: start_offset,
        len: index.size - start_offset,
        duration_ticks: end_pts.saturating_sub(start_pts).max(1),
    });
    out
}

/// `EXT-X-MAP`'s byte range: from the first PAT packet to the end of the first PMT packet,
/// when the PAT comes first.
pub fn map_range(index: &TsIndex) -> Option<(u64, u64)> {
    (index.pat_offset < index.pmt_offset).then(|| {
        (
            index.pat_offset,
            index.pmt_offset + TS_PACKET_BYTES as u64 - index.pat_offset,
        )
    })
}

/// Seconds with three decimals, as `EXTINF` carries them.
fn seconds(ticks: u64) -> String {
    let ms =
        (u128::from(ticks) * 1000 + u128::from(PTS_TICKS_PER_S) / 2) / u128::from(PTS_TICKS_PER_S);
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

/// The VOD media playlist of `segments` of the file at `uri` (relative to the playlist, as
/// written: the caller escapes it), with `EXT-X-MAP` on `map` when given. Version 7 (byte
/// ranges need 4, a map on a non-I-frame playlist 6). `EXT-X-TARGETDURATION` is the longest
/// segment rounded to the nearest second (RFC 8216 §4.3.3.1: every `EXTINF`, rounded, is at
/// most it).
pub fn media_playlist(segments: &[Segment], uri: &str, map: Option<(u64, u64)>) -> String {
    let target = segments
        .iter()
        .map(|s| (s.duration_ticks + PTS_TICKS_PER_S / 2) / PTS_TICKS_PER_S)
        .max()
        .unwrap_or(0)
        .max(1);
    let mut p = String::with_capacity(128 + segments.len() * (uri.len() + 48));
    p.push_str("#EXTM3U\n#EXT-X-VERSION:7\n");
    let _ = writeln!(p, "#EXT-X-TARGETDURATION:{target}");
    p.push_str("#EXT-X-PLAYLIST-TYPE:VOD\n#EXT-X-MEDIA-SEQUENCE:0\n#EXT-X-INDEPENDENT-SEGMENTS\n");
    if let Some((offset, len)) = map {
        let _ = writeln!(p, "#EXT-X-MAP:URI=\"{uri}\",BYTERANGE=\"{len}@{offset}\"");
    }
    for s in segments {
        let _ = writeln!(p, "#EXTINF:{},", seconds(s.duration_ticks));
        let _ = writeln!(p, "#EXT-X-BYTERANGE:{}@{}", s.len, s.offset);
        let _ = writeln!(p, "{uri}");
    }
    p.push_str("#EXT-X-ENDLIST\n");
    p
}
