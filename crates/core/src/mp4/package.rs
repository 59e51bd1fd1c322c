//! A plain MP4 packaged on the fly: each video and audio track is a rendition of its own
//! (HLS: the video variant with an `EXT-X-MEDIA` audio group; DASH: one adaptation set
//! each), cut into segments at the video track's sync samples, the first at least the
//! target duration after the segment's start. Audio is cut at the same presentation times
//! (its first sample at or after each video cut), so the renditions' segments line up.
//!
//! A media segment is `moof` + `mdat` header ([`super::write::media_segment_header`]) and
//! then the segment's samples as byte ranges of the original file ([`MediaSegment::ranges`],
//! adjacent ones coalesced): the server sends the header from memory and the ranges by
//! sendfile.
//!
//! URLs, relative to `PATH/` (PATH the `.mp4`): `index.m3u8` (multivariant), `track-N.m3u8`
//! (media), `manifest.mpd`, `track-N/init.mp4`, `track-N/K.m4s` (K from 0).
//!
//! **I-frame playlist** (`iframes.m3u8`, `EXT-X-I-FRAMES-ONLY`, the first video track): each
//! key frame is a **segment of its own**, `track-N/key-S.m4s` (S the sync sample's index in
//! the track) — a `moof` + `mdat` header for that one sample, then its bytes from the file —
//! not a byte range: in fMP4 a picture needs its own `moof` in front of it, which no range of
//! the plain file holds (and a range of a media segment would start in the middle of one).
//! Each is announced for the time until the next key frame, with the track's init segment
//! as `EXT-X-MAP`; the multivariant playlist names it with `EXT-X-I-FRAME-STREAM-INF`.

use std::fmt::Write as _;

use super::movie::{Movie, Track, TrackKind};
use super::write::media_segment_header;

/// One segment of one track: samples `first..end`, starting at decode time `dts`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentSpan {
    pub first: usize,
    pub end: usize,
    pub dts: u64,
    pub duration_ticks: u64,
    pub bytes: u64,
}

/// A track's segments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CutTrack {
    pub id: u32,
    pub segments: Vec<SegmentSpan>,
}

/// The segments of every track of a movie.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packaging {
    pub tracks: Vec<CutTrack>,
}

impl Packaging {
    /// Cuts `movie` for a target segment duration of `target_ms`.
    pub fn cut(movie: &Movie, target_ms: u64) -> Packaging {
        let target_ms = target_ms.max(1);
        // Cut times in seconds-rational: (presentation ticks, timescale) of the video track.
        let lead = movie.video().or_else(|| movie.audio());
        let mut cuts_s: Vec<(u64, u32)> = Vec::new(); // (ticks since presentation start, timescale)
        if let Some(v) = lead {
            let target = target_ms * u64::from(v.timescale) / 1000;
            let start = v.samples.first().map_or(0, |s| s.dts);
            let mut seg_start = start;
            for (i, s) in v.samples.iter().enumerate().skip(1) {
                if s.dts >= seg_start + target.max(1) && v.is_sync(i) {
                    cuts_s.push((s.dts - start, v.timescale));
                    seg_start = s.dts;
                }
            }
        }
        let tracks = movie
            .tracks
            .iter()
            .map(|t| {
                let lead_track = lead.is_some_and(|l| l.id == t.id);
                let start = t.samples.first().map_or(0, |s| s.dts);
                let mut bounds = vec![0usize];
                for &(ticks, scale) in &cuts_s {
                    let at = if lead_track {
                        start + ticks
                    } else {
                        start
                            + (u128::from(ticks) * u128::from(t.timescale) / u128::from(scale))
                                as u64
                    };
                    let i = t.samples.partition_point(|s| s.dts < at);
                    if i > *bounds.last().expect("starts with 0") && i < t.samples.len() {
                        bounds.push(i);
                    }
                }
                bounds.push(t.samples.len());
                let segments = bounds
                    .windows(2)
                    .filter(|w| w[1] > w[0])
                    .map(|w| {
                        let dts = t.samples[w[0]].dts;
                        let end = t.samples.get(w[1]).map_or(t.end_dts, |s| s.dts);
                        SegmentSpan {
                            first: w[0],
                            end: w[1],
                            dts,
                            duration_ticks: end.saturating_sub(dts),
                            bytes: t.samples[w[0]..w[1]]
                                .iter()
                                .map(|s| u64::from(s.size))
                                .sum(),
                        }
                    })
                    .collect();
                CutTrack { id: t.id, segments }
            })
            .collect();
        Packaging { tracks }
    }

    pub fn track(&self, id: u32) -> Option<&CutTrack> {
        self.tracks.iter().find(|t| t.id == id)
    }
}

/// A media segment: the generated header and the file's byte ranges after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaSegment {
    pub header: Vec<u8>,
    /// (offset, length) in the file, in order, adjacent samples coalesced.
    pub ranges: Vec<(u64, u64)>,
}

impl MediaSegment {
    /// Segment `span` (number `k`, from 0) of `track`.
    pub fn build(track: &Track, span: &SegmentSpan, k: usize) -> MediaSegment {
        let header = media_segment_header(track, k as u32 + 1, span.first, span.end);
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        let end = span.end.min(track.samples.len());
        for s in &track.samples[span.first.min(end)..end] {
            match ranges.last_mut() {
                Some((off, len)) if *off + *len == s.offset => *len += u64::from(s.size),
                _ => ranges.push((s.offset, u64::from(s.size))),
            }
        }
        MediaSegment { header, ranges }
    }

    pub fn len_bytes(&self) -> u64 {
        self.header.len() as u64 + self.ranges.iter().map(|r| r.1).sum::<u64>()
    }
}

/// One entry of an MP4's I-frame playlist: sync sample `sample` of the video track, shown
/// for `duration_ticks` (until the next sync sample, or the track's end), `bytes` long as
/// its own segment (header and sample).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeySegment {
    pub sample: usize,
    pub duration_ticks: u64,
    pub bytes: u64,
}

/// The key frames of `track` as segments of their own, in decode order (see the module doc).
pub fn key_segments(track: &Track) -> Vec<KeySegment> {
    let n = track.samples.len();
    let syncs: Vec<usize> = match &track.sync {
        None => (0..n).collect(),
        Some(s) => s.iter().map(|&x| x as usize).filter(|&x| x < n).collect(),
    };
    syncs
        .iter()
        .enumerate()
        .map(|(j, &k)| {
            let end = syncs
                .get(j + 1)
                .map_or(track.end_dts, |&x| track.samples[x].dts);
            KeySegment {
                sample: k,
                duration_ticks: end.saturating_sub(track.samples[k].dts).max(1),
                bytes: key_segment(track, k).map_or(0, |m| m.len_bytes()),
            }
        })
        .collect()
}

/// The segment of key frame `sample` of `track` (`track-N/key-S.m4s`), or `None` when that
/// sample is not a sync sample of the track.
pub fn key_segment(track: &Track, sample: usize) -> Option<MediaSegment> {
    if sample >= track.samples.len() || !track.is_sync(sample) {
        return None;
    }
    let s = &track.samples[sample];
    let span = SegmentSpan {
        first: sample,
        end: sample + 1,
        dts: s.dts,
        duration_ticks: 0,
        bytes: u64::from(s.size),
    };
    Some(MediaSegment::build(track, &span, sample))
}

/// The `EXT-X-I-FRAMES-ONLY` playlist of the movie's first video track (version 7, its init
/// segment as `EXT-X-MAP`), or `None` without a video track.
pub fn hls_i_frames(movie: &Movie) -> Option<String> {
    let t = movie.video()?;
    let keys = key_segments(t);
    let ts = u64::from(t.timescale.max(1));
    let target = keys
        .iter()
        .map(|k| (k.duration_ticks + ts / 2) / ts)
        .max()
        .unwrap_or(1)
        .max(1);
    let mut o = String::with_capacity(256 + keys.len() * 48);
    o.push_str("#EXTM3U\n#EXT-X-VERSION:7\n");
    let _ = writeln!(o, "#EXT-X-TARGETDURATION:{target}");
    o.push_str(
        "#EXT-X-PLAYLIST-TYPE:VOD\n#EXT-X-MEDIA-SEQUENCE:0\n#EXT-X-INDEPENDENT-SEGMENTS\n#EXT-X-I-FRAMES-ONLY\n",
    );
    let _ = writeln!(o, "#EXT-X-MAP:URI=\"track-{}/init.mp4\"", t.id);
    for k in &keys {
        let _ = writeln!(o, "#EXTINF:{},", seconds(k.duration_ticks, t.timescale));
        let _ = writeln!(o, "track-{}/key-{}.m4s", t.id, k.sample);
    }
    o.push_str("#EXT-X-ENDLIST\n");
    Some(o)
}

/// `BANDWIDTH` of the I-frame playlist: the largest key segment's bits over its duration.
fn i_frame_bandwidth(t: &Track) -> u64 {
    let ts = u128::from(t.timescale.max(1));
    key_segments(t)
        .iter()
        .map(|k| (u128::from(k.bytes) * 8 * ts / u128::from(k.duration_ticks.max(1))) as u64)
        .max()
        .unwrap_or(0)
        .max(1)
}

fn seconds(ticks: u64, timescale: u32) -> String {
    let ms = (u128::from(ticks) * 1000 + u128::from(timescale) / 2) / u128::from(timescale.max(1));
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

/// The peak and average bits per second of a track's segments.
fn bandwidth(t: &Track, c: &CutTrack) -> (u64, u64) {
    let ts = u128::from(t.timescale.max(1));
    let bps =
        |bytes: u64, ticks: u64| (u128::from(bytes) * 8 * ts / u128::from(ticks.max(1))) as u64;
    let peak = c
        .segments
        .iter()
        .map(|s| bps(s.bytes, s.duration_ticks))
        .max()
        .unwrap_or(0);
    let total: u64 = c.segments.iter().map(|s| s.bytes).sum();
    let dur: u64 = c.segments.iter().map(|s| s.duration_ticks).sum();
    (peak.max(1), bps(total, dur).max(1))
}

/// The media playlist of track `id`: `EXT-X-MAP` on its init segment, one `EXTINF` per
/// segment. Version 7.
pub fn hls_media(movie: &Movie, p: &Packaging, id: u32) -> Option<String> {
    let t = movie.track(id)?;
    let c = p.track(id)?;
    let ts = u64::from(t.timescale.max(1));
    let target = c
        .segments
        .iter()
        .map(|s| (s.duration_ticks + ts / 2) / ts)
        .max()
        .unwrap_or(1)
        .max(1);
    let mut o = String::with_capacity(256 + c.segments.len() * 40);
    o.push_str("#EXTM3U\n#EXT-X-VERSION:7\n");
    let _ = writeln!(o, "#EXT-X-TARGETDURATION:{target}");
    o.push_str("#EXT-X-PLAYLIST-TYPE:VOD\n#EXT-X-MEDIA-SEQUENCE:0\n#EXT-X-INDEPENDENT-SEGMENTS\n");
    let _ = writeln!(o, "#EXT-X-MAP:URI=\"track-{id}/init.mp4\"");
    for (k, s) in c.segments.iter().enumerate() {
        let _ = writeln!(o, "#EXTINF:{},", seconds(s.duration_ticks, t.timescale));
        let _ = writeln!(o, "track-{id}/{k}.m4s");
    }
    o.push_str("#EXT-X-ENDLIST\n");
    Some(o)
}

/// The multivariant playlist: the first audio track as an `EXT-X-MEDIA` audio rendition, each
/// video track a variant in that group (an audio-only movie: the audio track as the variant).
pub fn hls_master(movie: &Movie, p: &Packaging) -> String {
    let mut o = String::from("#EXTM3U\n#EXT-X-VERSION:7\n#EXT-X-INDEPENDENT-SEGMENTS\n");
    let audio = movie.audio();
    let audio_bw = audio
        .and_then(|a| p.track(a.id).map(|c| bandwidth(a, c)))
        .unwrap_or((0, 0));
    let videos: Vec<&Track> = movie
        .tracks
        .iter()
        .filter(|t| t.kind == TrackKind::Video)
        .collect();
    if let Some(a) = audio
        && !videos.is_empty()
    {
        let _ = writeln!(
            o,
            "#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID=\"audio\",NAME=\"audio\",DEFAULT=YES,AUTOSELECT=YES,URI=\"track-{}.m3u8\"",
            a.id
        );
    }
    for v in &videos {
        let Some(c) = p.track(v.id) else { continue };
        let (peak, avg) = bandwidth(v, c);
        let mut codecs = v.codec.rfc6381();
        if let Some(a) = audio {
            codecs.push(',');
            codecs.push_str(&a.codec.rfc6381());
        }
        let _ = write!(
            o,
            "#EXT-X-STREAM-INF:BANDWIDTH={},AVERAGE-BANDWIDTH={},CODECS=\"{codecs}\"",
            peak + audio_bw.0,
            avg + audio_bw.1
        );
        if v.width > 0 && v.height > 0 {
            let _ = write!(o, ",RESOLUTION={}x{}", v.width, v.height);
        }
        if audio.is_some() {
            o.push_str(",AUDIO=\"audio\"");
        }
        let _ = writeln!(o, "\ntrack-{}.m3u8", v.id);
    }
    if let Some(v) = videos.first() {
        let _ = write!(
            o,
            "#EXT-X-I-FRAME-STREAM-INF:BANDWIDTH={},CODECS=\"{}\"",
            i_frame_bandwidth(v),
            v.codec.rfc6381()
        );
        if v.width > 0 && v.height > 0 {
            let _ = write!(o, ",RESOLUTION={}x{}", v.width, v.height);
        }
        o.push_str(",URI=\"iframes.m3u8\"\n");
    }
    if videos.is_empty()
        && let Some(a) = audio
    {
        let _ = writeln!(
            o,
            "#EXT-X-STREAM-INF:BANDWIDTH={},AVERAGE-BANDWIDTH={},CODECS=\"{}\"\ntrack-{}.m3u8",
            audio_bw.0,
            audio_bw.1,
            a.codec.rfc6381(),
            a.id
        );
    }
    o
}

/// ISO 8601 duration with milliseconds.
fn iso_duration(ticks: u64, timescale: u32) -> String {
    format!("PT{}S", seconds(ticks, timescale))
}

/// The DASH manifest (static, `isoff-live` profile): one adaptation set per track, each a
/// `SegmentTemplate` with a `SegmentTimeline` of the segments' decode times.
pub fn dash_manifest(movie: &Movie, p: &Packaging) -> String {
    let dur = movie
        .tracks
        .iter()
        .map(|t| (t.duration_ticks(), t.timescale))
        .max_by(|a, b| {
            (u128::from(a.0) * u128::from(b.1)).cmp(&(u128::from(b.0) * u128::from(a.1)))
        })
        .unwrap_or((0, 1));
    let max_seg = movie
        .tracks
        .iter()
        .filter_map(|t| {
            p.track(t.id).map(|c| {
                c.segments
                    .iter()
                    .map(|s| s.duration_ticks * 1000 / u64::from(t.timescale.max(1)))
                    .max()
                    .unwrap_or(0)
            })
        })
        .max()
        .unwrap_or(0);
    let mut o = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        o,
        "<MPD xmlns=\"urn:mpeg:dash:schema:mpd:2011\" profiles=\"urn:mpeg:dash:profile:isoff-live:2011\" type=\"static\" mediaPresentationDuration=\"{}\" minBufferTime=\"{}\">",
        iso_duration(dur.0, dur.1),
        iso_duration(max_seg.max(1000), 1000)
    );
    o.push_str("  <Period id=\"0\" start=\"PT0S\">\n");
    for t in &movie.tracks {
        let Some(c) = p.track(t.id) else { continue };
        let (peak, _) = bandwidth(t, c);
        let (content, mime) = match t.kind {
            TrackKind::Video => ("video", "video/mp4"),
            TrackKind::Audio => ("audio", "audio/mp4"),
        };
        let _ = writeln!(
            o,
            "    <AdaptationSet id=\"{}\" contentType=\"{content}\" mimeType=\"{mime}\" segmentAlignment=\"true\" startWithSAP=\"1\">",
            t.id
        );
        let _ = write!(
            o,
            "      <Representation id=\"{}\" codecs=\"{}\" bandwidth=\"{peak}\"",
            t.id,
            t.codec.rfc6381()
        );
        match (&t.kind, &t.codec) {
            (TrackKind::Video, _) => {
                let _ = writeln!(o, " width=\"{}\" height=\"{}\">", t.width, t.height);
            }
            (
                TrackKind::Audio,
                super::movie::Codec::Aac {
                    channels,
                    sample_rate,
                    ..
                },
            ) => {
                let _ = writeln!(o, " audioSamplingRate=\"{sample_rate}\">");
                let _ = writeln!(
                    o,
                    "        <AudioChannelConfiguration schemeIdUri=\"urn:mpeg:dash:23003:3:audio_channel_configuration:2011\" value=\"{channels}\"/>"
                );
            }
            _ => o.push_str(">\n"),
        }
        let _ = writeln!(
            o,
            "        <SegmentTemplate timescale=\"{}\" presentationTimeOffset=\"{}\" initialization=\"track-$RepresentationID$/init.mp4\" media=\"track-$RepresentationID$/$Number$.m4s\" startNumber=\"0\">",
            t.timescale, t.edit.media_time
        );
        o.push_str("          <SegmentTimeline>\n");
        let mut i = 0;
        while i < c.segments.len() {
            let s = &c.segments[i];
            let mut r = 0;
            while i + r + 1 < c.segments.len()
                && c.segments[i + r + 1].duration_ticks == s.duration_ticks
            {
                r += 1;
            }
            let _ = write!(
                o,
                "            <S t=\"{}\" d=\"{}\"",
                s.dts, s.duration_ticks
            );
            if r > 0 {
                let _ = write!(o, " r=\"{r}\"");
            }
            o.push_str("/>\n");
            i += r + 1;
        }
        o.push_str("          </SegmentTimeline>\n        </SegmentTemplate>\n      </Representation>\n    </AdaptationSet>\n");
    }
    o.push_str("  </Period>\n</MPD>\n");
    o
}
