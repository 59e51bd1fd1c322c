//! HLS media playlists (RFC 8216) whose segments are byte ranges of one TS file, cut at its
//! key frames ([`super::ts_index`]).
//!
//! A segment starts at a key frame and ends where the next segment starts (the first key
//! frame at least the target duration after its own start), or at the end of the file; the
//! first segment starts at offset 0, so whatever precedes the first key frame (the PAT and
//! PMT, audio) is in it. Where the file repeats its PAT and PMT right before a key frame (no
//! video packet between them: ffmpeg's muxer does so before every video key frame), the
//! segment starts at that PAT instead of the key frame's own packet, so that it carries its
//! PSI and decodes alone, as RFC 8216 §3.2 asks of TS segments ("a PAT and a PMT at the start
//! of each segment") and Apple's authoring rules and GStreamer's `hlsdemux` expect. When
//! every segment does, the playlist has no `EXT-X-MAP`; otherwise ([`map_range`]) it names
//! the file's first PAT and PMT with `EXT-X-MAP` (one byte range from the first PAT packet to
//! the end of the first PMT packet), which hls.js and ffmpeg prepend to every segment they
//! decode (docs/hls.md says why).

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
        let at = k.psi.unwrap_or(k.offset);
        if k.pts >= start_pts + target_ticks && at > start_offset {
            out.push(Segment {
                offset: start_offset,
                len: at - start_offset,
                duration_ticks: k.pts - start_pts,
            });
            (start_offset, start_pts) = (at, k.pts);
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

/// `EXT-X-MAP`'s byte range for `segments` of `index`: from the first PAT packet to the end
/// of the first PMT packet, when the PAT comes first; `None` when every segment carries its
/// own PSI (the first, from offset 0, has the file's first PAT and PMT before its first key
/// frame; every other starts at a key frame's repeated PAT, [`super::KeyFrame::psi`]).
pub fn map_range(index: &TsIndex, segments: &[Segment]) -> Option<(u64, u64)> {
    let kf = &index.key_frames;
    let first_has_psi = kf
        .first()
        .is_some_and(|k| index.pat_offset < index.pmt_offset && index.pmt_offset < k.offset);
    let each_has_psi = segments.iter().skip(1).all(|s| {
        let i = kf.partition_point(|k| k.offset < s.offset);
        kf.get(i).is_some_and(|k| k.psi == Some(s.offset))
    });
    if first_has_psi && each_has_psi {
        return None;
    }
    (index.pat_offset < index.pmt_offset).then(|| {
        (
            index.pat_offset,
            index.pmt_offset + TS_PACKET_BYTES as u64 - index.pat_offset,
        )
    })
}

/// An `EXTINF` of `ticks` as written ([`seconds`]: milliseconds) rounded to the nearest
/// second, half up: what RFC 8216 §4.3.3.1 compares with `EXT-X-TARGETDURATION` (rounding
/// the ticks themselves could say 12 for 12.4996 s, written `12.500`).
pub(crate) fn extinf_rounded_s(ticks: u64) -> u64 {
    let ms =
        (u128::from(ticks) * 1000 + u128::from(PTS_TICKS_PER_S) / 2) / u128::from(PTS_TICKS_PER_S);
    u64::try_from(ms.saturating_add(500) / 1000).unwrap_or(u64::MAX)
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
        .map(|s| extinf_rounded_s(s.duration_ticks))
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

/// One picture of an `EXT-X-I-FRAMES-ONLY` playlist (RFC 8216 §4.3.3.6): `len` bytes of the
/// file from `offset` holding one key frame whole (from its repeated PAT where the file has
/// one just before it, else from its own TS packet, to the next video PES start), shown for
/// `duration_ticks` (90 kHz: until the next key frame, or the end of the title).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IFrame {
    pub offset: u64,
    pub len: u64,
    pub duration_ticks: u64,
}

/// The I-frames of `index`: every key frame, in file order. A key frame whose time does not
/// move forward from the one before (a discontinuity the index did not unwrap) is left out.
pub fn i_frames(index: &TsIndex) -> Vec<IFrame> {
    let kf = &index.key_frames;
    let end_pts = index.last_pts + index.frame_ticks();
    let mut out: Vec<IFrame> = Vec::with_capacity(kf.len());
    let mut last_pts: Option<u64> = None;
    for (i, k) in kf.iter().enumerate() {
        if last_pts.is_some_and(|p| k.pts <= p) {
            continue;
        }
        last_pts = Some(k.pts);
        let next_pts = kf[i + 1..]
            .iter()
            .map(|n| n.pts)
            .find(|&p| p > k.pts)
            .unwrap_or(end_pts);
        let offset = k.psi.unwrap_or(k.offset);
        out.push(IFrame {
            offset,
            len: k.end.max(k.offset + TS_PACKET_BYTES as u64).min(index.size) - offset,
            duration_ticks: next_pts.saturating_sub(k.pts).max(1),
        });
    }
    out
}

/// `EXT-X-MAP`'s byte range for an I-frame playlist: `None` when every I-frame starts at a
/// repeated PAT and PMT ([`super::KeyFrame::psi`]), else the first PAT and PMT.
pub fn i_frame_map(index: &TsIndex) -> Option<(u64, u64)> {
    if index.key_frames.iter().all(|k| k.psi.is_some()) {
        return None;
    }
    (index.pat_offset < index.pmt_offset).then(|| {
        (
            index.pat_offset,
            index.pmt_offset + TS_PACKET_BYTES as u64 - index.pat_offset,
        )
    })
}

/// The `EXT-X-I-FRAMES-ONLY` VOD playlist of `frames` of the file at `uri` (escaped by the
/// caller), with `EXT-X-MAP` on `map` when given. Version 7 (I-frame playlists need 4, a map
/// in one 5). `EXT-X-TARGETDURATION` is the longest I-frame duration rounded to the nearest
/// second.
pub fn i_frame_playlist(frames: &[IFrame], uri: &str, map: Option<(u64, u64)>) -> String {
    let target = frames
        .iter()
        .map(|s| extinf_rounded_s(s.duration_ticks))
        .max()
        .unwrap_or(0)
        .max(1);
    let mut p = String::with_capacity(160 + frames.len() * (uri.len() + 48));
    p.push_str("#EXTM3U\n#EXT-X-VERSION:7\n");
    let _ = writeln!(p, "#EXT-X-TARGETDURATION:{target}");
    p.push_str(
        "#EXT-X-PLAYLIST-TYPE:VOD\n#EXT-X-MEDIA-SEQUENCE:0\n#EXT-X-INDEPENDENT-SEGMENTS\n\
         #EXT-X-I-FRAMES-ONLY\n",
    );
    if let Some((offset, len)) = map {
        let _ = writeln!(p, "#EXT-X-MAP:URI=\"{uri}\",BYTERANGE=\"{len}@{offset}\"");
    }
    for f in frames {
        let _ = writeln!(p, "#EXTINF:{},", seconds(f.duration_ticks));
        let _ = writeln!(p, "#EXT-X-BYTERANGE:{}@{}", f.len, f.offset);
        let _ = writeln!(p, "{uri}");
    }
    p.push_str("#EXT-X-ENDLIST\n");
    p
}
