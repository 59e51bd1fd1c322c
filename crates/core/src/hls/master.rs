//! Multivariant playlists (RFC 8216 §4.3.4): the renditions of one title, each a media
//! playlist penstock cuts ([`super::playlist`]), with the figures a player chooses by
//! measured from the segments themselves ([`bandwidth`]) and what the streams say of
//! themselves ([`super::media::stream_info`]).

use std::fmt::Write as _;

use super::playlist::Segment;
use super::ts_index::PTS_TICKS_PER_S;

/// One rendition as the multivariant playlist lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variant {
    /// The media playlist, relative to the multivariant one (escaped by the caller).
    pub uri: String,
    /// Peak bits per second: the largest of any segment's.
    pub bandwidth: u64,
    /// The whole file's bits over its duration.
    pub average_bandwidth: u64,
    pub resolution: Option<(u32, u32)>,
    pub codecs: Option<String>,
    /// Its `EXT-X-I-FRAMES-ONLY` playlist (relative to the multivariant one) and that
    /// playlist's peak bits per second, announced by `EXT-X-I-FRAME-STREAM-INF`.
    pub i_frames: Option<(String, u64)>,
}

/// Bits per second of `bytes` over `ticks` (90 kHz), rounded up (at least one tick).
fn bits_per_s(bytes: u64, ticks: u64) -> u64 {
    let v =
        (u128::from(bytes) * 8 * u128::from(PTS_TICKS_PER_S)).div_ceil(u128::from(ticks.max(1)));
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// `(BANDWIDTH, AVERAGE-BANDWIDTH)` of a rendition cut into `segments`: the largest segment's
/// bits per second, and all the segments' bits over their summed duration. The peak is never
/// below the average (the average is a weighted mean of the segments' rates). `(0, 0)`
/// without segments.
pub fn bandwidth(segments: &[Segment]) -> (u64, u64) {
    let peak = segments
        .iter()
        .map(|s| bits_per_s(s.len, s.duration_ticks))
        .max()
        .unwrap_or(0);
    if segments.is_empty() {
        return (0, 0);
    }
    let bytes = segments
        .iter()
        .map(|s| s.len)
        .fold(0u64, u64::saturating_add);
    let ticks = segments
        .iter()
        .map(|s| s.duration_ticks.max(1))
        .fold(0u64, u64::saturating_add);
    (peak, bits_per_s(bytes, ticks).min(peak))
}

/// The multivariant playlist of `variants`, listed by `BANDWIDTH`, lowest first (then by
/// URI, so the order is stable). `CODECS` and `RESOLUTION` only where known.
pub fn master_playlist(variants: &[Variant]) -> String {
    let mut sorted: Vec<&Variant> = variants.iter().collect();
    sorted.sort_by(|a, b| (a.bandwidth, &a.uri).cmp(&(b.bandwidth, &b.uri)));
    let mut p = String::with_capacity(64 + variants.len() * 160);
    p.push_str("#EXTM3U\n#EXT-X-INDEPENDENT-SEGMENTS\n");
    for v in &sorted {
        let _ = write!(
            p,
            "#EXT-X-STREAM-INF:BANDWIDTH={},AVERAGE-BANDWIDTH={}",
            v.bandwidth, v.average_bandwidth
        );
        if let Some(c) = &v.codecs {
            let _ = write!(p, ",CODECS=\"{c}\"");
        }
        if let Some((w, h)) = v.resolution {
            let _ = write!(p, ",RESOLUTION={w}x{h}");
        }
        let _ = writeln!(p, "\n{}", v.uri);
    }
    for v in &sorted {
        let Some((uri, bandwidth)) = &v.i_frames else {
            continue;
        };
        let _ = write!(p, "#EXT-X-I-FRAME-STREAM-INF:BANDWIDTH={bandwidth}");
        if let Some(c) = &v.codecs {
            // The video codec only: an I-frame playlist carries no audio worth decoding.
            let video = c.split(',').next().unwrap_or(c);
            let _ = write!(p, ",CODECS=\"{video}\"");
        }
        if let Some((w, h)) = v.resolution {
            let _ = write!(p, ",RESOLUTION={w}x{h}");
        }
        let _ = writeln!(p, ",URI=\"{uri}\"");
    }
    p
}

/// `BANDWIDTH` of an I-frame playlist: the largest I-frame's bits over its duration.
pub fn i_frame_bandwidth(frames: &[super::playlist::IFrame]) -> u64 {
    frames
        .iter()
        .map(|f| bits_per_s(f.len, f.duration_ticks))
        .max()
        .unwrap_or(0)
}
