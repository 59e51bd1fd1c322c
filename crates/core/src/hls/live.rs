//! Live and DVR HLS of a recording being written (docs/hls.md "Live and DVR"): the media
//! playlist of a live relay's recording, whose segments are byte ranges of the file the
//! recorder writes, cut at the key frames its frame track marks.
//!
//! Pure: the server gathers the facts — each key frame the recorder's frame track names (its
//! TS packet's offset in the media, the PTS of its PES, its receive time from the time track)
//! and the media length the recorder reports synced — and hands them in with
//! [`LiveIndex::handle_key_frame`] and [`LiveIndex::handle_synced`]; the playlist comes out of
//! [`LiveIndex::playlist`], with the wall-clock time passed in (the recording's start, from
//! its tracks' header). Nothing here reads a clock or a file.
//!
//! A segment is listed once it is **complete**: it runs from one cutting key frame to the
//! next, and the next is only known once the frame track naming it is synced, which the
//! recorder does after the media it describes (docs/track-format.md). So every listed byte is
//! below the synced media length ([`LiveIndex::handle_synced`] asserts it).
//!
//! Cutting: a key frame cuts when it is at least the target duration (in PTS) after the open
//! segment's start, as VOD's [`super::segments`]; or when it is a **discontinuity**: its PTS
//! stepped back, or moved by more than [`LiveIndex::jump_ticks`] away from what its receive
//! time says (the source restarted, or its clock jumped). The segment after a discontinuity
//! carries `EXT-X-DISCONTINUITY`; the segment before it ends where the new one starts, its
//! duration estimated (its PTS span up to its last key frame, plus the receive time to the
//! next one, at most one target duration).
//!
//! `EXT-X-TARGETDURATION` never changes in the life of one live playlist (RFC 8216
//! §4.3.3.1): it is fixed when the first segment is complete, at the configured target
//! rounded up or that first segment's duration rounded, whichever is larger (a source whose
//! key frames are 8 s apart under a 6 s target gets 8), and from then on no segment is listed
//! whose duration, rounded to the nearest second, exceeds it: a key frame that would make the
//! open segment too long cuts it at the key frame before (a shorter segment), and a single
//! key-frame interval longer than the target duration (the source's GOP grew past it) cannot
//! be a segment at all: its bytes are left out of the playlist, the next segment carries
//! `EXT-X-DISCONTINUITY`, and [`LiveIndex::skipped`] counts it.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::time::{Duration, UNIX_EPOCH};

use super::ts_index::{PTS_TICKS_PER_S, VideoCodec};
use crate::track::mpegts::annexb_has_key_nal;
use crate::ts::psi::{PAT_PID, pat_first_program, pmt_streams};
use crate::ts::{TS_PACKET_BYTES, parse_packet};

const PTS_MODULUS: u64 = 1 << 33;

/// One key frame of the recording: the offset of the TS packet that starts its PES, the PES's
/// PTS (33 bits, as carried) and its receive time (ns after the recording's start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveKeyFrame {
    pub offset: u64,
    pub pts: u64,
    pub time_ns: u64,
}

/// One complete segment: `len` bytes from `offset`, `duration_ticks` long (90 kHz), starting
/// at receive time `time_ns`; `discontinuity`: it follows a restart or a timestamp jump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveSegment {
    /// The recording's file it lies in: 0 for the first, one more at each
    /// [`LiveIndex::handle_next_file`] (a segmented recording's files).
    pub file: u64,
    pub offset: u64,
    pub len: u64,
    pub duration_ticks: u64,
    pub time_ns: u64,
    pub discontinuity: bool,
}

/// What a blocking playlist reload (`_HLS_msn=N`, RFC 8216bis §6.2.5.2) gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocking {
    /// Segment N is in the playlist: answer now.
    Ready,
    /// Segment N is the next or the one after: wait for it (bounded by the caller).
    Wait,
    /// N is more than two past the last segment: 400 at once.
    TooFar,
}

/// The playlist's window and the wall clock: what [`LiveIndex::playlist`] needs besides the
/// index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveView<'a> {
    /// The media's URI (relative to the playlist, escaped by the caller).
    pub uri: &'a str,
    /// `EXT-X-MAP`'s byte range (offset, length): the PAT and PMT.
    pub map: Option<(u64, u64)>,
    /// Segments listed at most (the newest); 0: all kept (`EXT-X-PLAYLIST-TYPE:EVENT`).
    pub window: usize,
    /// A segmented recording's files: (file number, URI, `EXT-X-MAP` range); a segment
    /// whose file is listed has that URI, and an `EXT-X-MAP` of its file's PSI precedes the
    /// first segment of each file. Empty: one file, `uri` and `map`.
    pub files: &'a [LiveFile<'a>],
    /// The recording's start, ns since the Unix epoch (its tracks' header): time track times
    /// count from it (`EXT-X-PROGRAM-DATE-TIME`).
    pub start_wall_ns: u64,
    /// The session token segment URIs carry, if any (appended as `?…`).
    pub query: Option<&'a str>,
}

/// One file of a segmented recording, as its playlist names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveFile<'a> {
    /// The index's number of it ([`LiveSegment::file`]).
    pub file: u64,
    /// Its URI (relative to the playlist, escaped by the caller).
    pub uri: &'a str,
    /// `EXT-X-MAP`'s byte range in it (its PAT and PMT).
    pub map: Option<(u64, u64)>,
}

/// The segments of one live recording, cut as its key frames arrive.
#[derive(Debug, Clone)]
pub struct LiveIndex {
    target_ticks: u64,
    segments_max: usize,
    segments: VecDeque<LiveSegment>,
    /// The media sequence number of `segments[0]`.
    first_msn: u64,
    /// Discontinuities among segments dropped from the front (the index's own bound).
    dropped_discontinuities: u64,
    /// Whether segments were dropped from the front (the whole recording is no longer listed:
    /// no `EVENT` type).
    dropped: bool,
    /// The start of the segment being written, and whether it follows a discontinuity.
    open: Option<(LiveKeyFrame, bool)>,
    /// The last key frame seen (the discontinuity test compares with it).
    last: Option<LiveKeyFrame>,
    /// The file key frames and syncs are of now, the open segment's and the last key
    /// frame's, and the end of the file before the current one (its number and length).
    file: u64,
    open_file: u64,
    last_file: u64,
    ended: Option<(u64, u64)>,
    /// `EXT-X-TARGETDURATION`, fixed when the first segment is complete (`None` before).
    target_s: Option<u64>,
    /// Key-frame intervals longer than the target duration, left out of the playlist.
    skipped: u64,
    synced_bytes: u64,
}

/// The signed difference `b - a` of two 33-bit PTS, taken modulo 2^33 (a wrap is a step
/// forward).
pub fn pts_delta(a: u64, b: u64) -> i64 {
    let d = b.wrapping_sub(a) % PTS_MODULUS;
    if d >= PTS_MODULUS / 2 {
        d as i64 - PTS_MODULUS as i64
    } else {
        d as i64
    }
}

impl LiveIndex {
    /// An empty index cutting at `target_ticks` (above zero), keeping at most `segments_max`
    /// segments (at least one; the oldest leave first).
    pub fn new(target_ticks: u64, segments_max: usize) -> LiveIndex {
        let target_ticks = target_ticks.max(1);
        LiveIndex {
            target_ticks,
            segments_max: segments_max.max(1),
            segments: VecDeque::new(),
            first_msn: 0,
            dropped_discontinuities: 0,
            dropped: false,
            open: None,
            last: None,
            file: 0,
            open_file: 0,
            last_file: 0,
            ended: None,
            target_s: None,
            skipped: 0,
            synced_bytes: 0,
        }
    }

    /// How far a key frame's PTS may move from what its receive time says before it is a
    /// discontinuity: two target durations, at least 2 s (network and muxer jitter stay far
    /// below).
    pub fn jump_ticks(&self) -> u64 {
        (2 * self.target_ticks).max(2 * PTS_TICKS_PER_S)
    }

    /// The next key frame of the recording (offsets increasing; one at or before the open
    /// segment's start is ignored).
    pub fn handle_key_frame(&mut self, k: LiveKeyFrame) {
        let k = LiveKeyFrame {
            pts: k.pts % PTS_MODULUS,
            ..k
        };
        let Some((open, open_disc)) = self.open else {
            self.open = Some((k, false));
            self.last = Some(k);
            (self.open_file, self.last_file) = (self.file, self.file);
            return;
        };
        if self.open_file != self.file {
            return self.cross_file(k, open, open_disc);
        }
        if k.offset <= open.offset || self.last.is_some_and(|l| k.offset <= l.offset) {
            return;
        }
        self.last_file = self.file;
        let last = self.last.unwrap_or(open);
        let step = pts_delta(last.pts, k.pts);
        let recv_ticks = (k.time_ns.saturating_sub(last.time_ns) as u128
            * u128::from(PTS_TICKS_PER_S)
            / 1_000_000_000) as i64;
        let jump = step < 0 || (step - recv_ticks).unsigned_abs() > self.jump_ticks();
        self.last = Some(k);
        let limit = self.longest_ticks();
        if jump {
            let before = pts_delta(open.pts, last.pts).max(0) as u64;
            let tail = (recv_ticks.max(0) as u64).min(self.target_ticks);
            // An estimate: kept within the target duration.
            let d = (before + tail).max(1).min(limit.unwrap_or(u64::MAX));
            self.close(open, open_disc, k.offset, d);
            self.open = Some((k, true));
            return;
        }
        let span = pts_delta(open.pts, k.pts).max(0) as u64;
        if let Some(limit) = limit
            && span > limit
        {
            // Too long to be one segment: cut at the key frame before, if there is one
            // after the open segment's start (it was less than the target past it).
            let (open, open_disc) = if last.offset > open.offset {
                let before = pts_delta(open.pts, last.pts).max(1) as u64;
                self.close(open, open_disc, last.offset, before);
                (last, false)
            } else {
                (open, open_disc)
            };
            let span = pts_delta(open.pts, k.pts).max(0) as u64;
            if span > limit {
                // One key-frame interval longer than the target duration: no segment can
                // hold it. Left out; what follows is a discontinuity.
                self.skipped += 1;
                self.open = Some((k, true));
            } else if span >= self.target_ticks {
                self.close(open, open_disc, k.offset, span);
                self.open = Some((k, false));
            } else {
                self.open = Some((open, open_disc));
            }
            return;
        }
        if span >= self.target_ticks {
            self.close(open, open_disc, k.offset, span);
            self.open = Some((k, false));
        }
    }

    /// The first key frame of a later file than the open segment's: the open segment ends
    /// with its file (cut at the key frame before when it would be too long); the new one
    /// follows it, after a discontinuity only when the timestamps jump (the files of one
    /// recording are one byte stream) or the open segment's file end is unknown (a file was
    /// passed over: its stretch is left out).
    fn cross_file(&mut self, k: LiveKeyFrame, open: LiveKeyFrame, open_disc: bool) {
        let last = self.last.unwrap_or(open);
        let last_in_open_file = self.last_file == self.open_file;
        let step = pts_delta(last.pts, k.pts);
        let recv_ticks = (k.time_ns.saturating_sub(last.time_ns) as u128
            * u128::from(PTS_TICKS_PER_S)
            / 1_000_000_000) as i64;
        let jump = step < 0 || (step - recv_ticks).unsigned_abs() > self.jump_ticks();
        let end = self
            .ended
            .filter(|&(f, len)| f == self.open_file && len > open.offset)
            .map(|(_, len)| len);
        self.last = Some(k);
        self.last_file = self.file;
        let Some(end) = end else {
            self.skipped += 1;
            self.open = Some((k, true));
            self.open_file = self.file;
            return;
        };
        let limit = self.longest_ticks();
        let (mut open, mut open_disc) = (open, open_disc);
        let span = pts_delta(open.pts, k.pts).max(0) as u64;
        if !jump
            && limit.is_some_and(|l| span > l)
            && last.offset > open.offset
            && last_in_open_file
        {
            let before = pts_delta(open.pts, last.pts).max(1) as u64;
            let file = self.open_file;
            self.close_in(file, open, open_disc, last.offset, before);
            (open, open_disc) = (last, false);
        }
        let d = if jump {
            (pts_delta(open.pts, last.pts).max(0) as u64
                + (recv_ticks.max(0) as u64).min(self.target_ticks))
            .max(1)
        } else {
            (pts_delta(open.pts, k.pts).max(0) as u64).max(1)
        };
        let file = self.open_file;
        self.close_in(file, open, open_disc, end, d.min(limit.unwrap_or(u64::MAX)));
        self.open = Some((k, jump));
        self.open_file = self.file;
    }

    /// The current file is complete at `end` bytes: key frames and syncs from now on are of
    /// the next file (a segmented recording rotated).
    pub fn handle_next_file(&mut self, end: u64) {
        self.ended = Some((self.file, end));
        self.file += 1;
        self.synced_bytes = 0;
    }

    /// File `file` is gone (retention deleted it): its segments, and those of older files,
    /// leave the playlist.
    pub fn handle_file_removed(&mut self, file: u64) {
        while self.segments.front().is_some_and(|s| s.file <= file) {
            if let Some(s) = self.segments.pop_front() {
                self.first_msn += 1;
                self.dropped = true;
                self.dropped_discontinuities += u64::from(s.discontinuity);
            }
        }
    }

    /// The longest duration a segment may have once the target duration is fixed: the
    /// longest whose `EXTINF` (milliseconds) rounds to it, `T.499` (RFC 8216 §4.3.3.1
    /// compares `EXTINF` rounded to the nearest integer; `T.500` would round up).
    fn longest_ticks(&self) -> Option<u64> {
        self.target_s
            .map(|t| t * PTS_TICKS_PER_S + PTS_TICKS_PER_S / 2 - PTS_TICKS_PER_S / 1000)
    }

    fn close(&mut self, open: LiveKeyFrame, discontinuity: bool, end: u64, duration_ticks: u64) {
        let file = self.file;
        self.close_in(file, open, discontinuity, end, duration_ticks);
    }

    fn close_in(
        &mut self,
        file: u64,
        open: LiveKeyFrame,
        discontinuity: bool,
        end: u64,
        duration_ticks: u64,
    ) {
        self.segments.push_back(LiveSegment {
            file,
            offset: open.offset,
            len: end - open.offset,
            duration_ticks,
            time_ns: open.time_ns,
            discontinuity,
        });
        if self.target_s.is_none() {
            self.target_s = Some(
                self.target_ticks
                    .div_ceil(PTS_TICKS_PER_S)
                    .max(super::playlist::extinf_rounded_s(duration_ticks))
                    .max(1),
            );
        }
        while self.segments.len() > self.segments_max {
            if let Some(s) = self.segments.pop_front() {
                self.first_msn += 1;
                self.dropped = true;
                self.dropped_discontinuities += u64::from(s.discontinuity);
            }
        }
    }

    /// Key-frame intervals left out of the playlist because each was longer than the target
    /// duration (the source's GOP grew past it).
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// The media length the recorder reports synced (never decreasing). Every listed segment
    /// lies below it: its end is a key frame the synced frame track names.
    pub fn handle_synced(&mut self, media_bytes: u64) {
        self.synced_bytes = self.synced_bytes.max(media_bytes);
        if let Some(s) = self.segments.back()
            && s.file == self.file
        {
            assert!(
                s.offset + s.len <= self.synced_bytes,
                "a listed segment ends at {} past the synced {} bytes",
                s.offset + s.len,
                self.synced_bytes
            );
        }
    }

    pub fn synced_bytes(&self) -> u64 {
        self.synced_bytes
    }

    /// The complete segments kept, oldest first.
    pub fn segments(&self) -> &VecDeque<LiveSegment> {
        &self.segments
    }

    /// The media sequence number the next complete segment will have.
    pub fn next_msn(&self) -> u64 {
        self.first_msn + self.segments.len() as u64
    }

    /// `EXT-X-TARGETDURATION`: fixed when the first segment is complete — the configured
    /// target rounded up, or that segment's duration rounded, whichever is larger — and
    /// constant from then on (RFC 8216 §4.3.3.1); the configured target rounded up before.
    pub fn target_duration_s(&self) -> u64 {
        self.target_s
            .unwrap_or_else(|| self.target_ticks.div_ceil(PTS_TICKS_PER_S).max(1))
    }

    /// What `_HLS_msn=msn` gets now.
    pub fn blocking(&self, msn: u64) -> Blocking {
        let next = self.next_msn();
        if msn < next {
            Blocking::Ready
        } else if msn <= next + 1 {
            // The last segment is next - 1: up to two past it may be waited for.
            Blocking::Wait
        } else {
            Blocking::TooFar
        }
    }

    /// The media playlist (RFC 8216bis, version 7) of the newest `view.window` segments (or
    /// all kept), with `EXT-X-PROGRAM-DATE-TIME` on each, `EXT-X-DISCONTINUITY` where one
    /// is, and `CAN-BLOCK-RELOAD`. No `EXT-X-ENDLIST`: the recording goes on.
    pub fn playlist(&self, view: &LiveView<'_>) -> String {
        let skip = if view.window == 0 {
            0
        } else {
            self.segments.len().saturating_sub(view.window)
        };
        let shown = self.segments.iter().skip(skip);
        let discontinuity_seq = self.dropped_discontinuities
            + self
                .segments
                .iter()
                .take(skip)
                .filter(|s| s.discontinuity)
                .count() as u64;
        let uri = match view.query {
            Some(q) => format!("{}?{q}", view.uri),
            None => view.uri.to_string(),
        };
        let mut p = String::with_capacity(256 + self.segments.len().min(4096) * 128);
        p.push_str("#EXTM3U\n#EXT-X-VERSION:7\n");
        let target_s = self.target_duration_s();
        let _ = writeln!(p, "#EXT-X-TARGETDURATION:{target_s}");
        if view.window == 0 && !self.dropped {
            p.push_str("#EXT-X-PLAYLIST-TYPE:EVENT\n");
        }
        let _ = writeln!(p, "#EXT-X-MEDIA-SEQUENCE:{}", self.first_msn + skip as u64);
        if discontinuity_seq > 0 {
            let _ = writeln!(p, "#EXT-X-DISCONTINUITY-SEQUENCE:{discontinuity_seq}");
        }
        p.push_str("#EXT-X-INDEPENDENT-SEGMENTS\n");
        let _ = writeln!(
            p,
            "#EXT-X-SERVER-CONTROL:CAN-BLOCK-RELOAD=YES,HOLD-BACK={}",
            3 * target_s
        );
        if view.files.is_empty()
            && let Some((offset, len)) = view.map
        {
            let _ = writeln!(p, "#EXT-X-MAP:URI=\"{uri}\",BYTERANGE=\"{len}@{offset}\"");
        }
        let mut map_file = None;
        for s in shown {
            if s.discontinuity {
                p.push_str("#EXT-X-DISCONTINUITY\n");
            }
            let file = view.files.iter().find(|f| f.file == s.file);
            let uri = match (file, view.query) {
                (Some(f), Some(q)) => format!("{}?{q}", f.uri),
                (Some(f), None) => f.uri.to_string(),
                (None, _) => uri.clone(),
            };
            if let Some(&LiveFile {
                file: n,
                map: Some((offset, len)),
                ..
            }) = file
                && map_file != Some(n)
            {
                let _ = writeln!(p, "#EXT-X-MAP:URI=\"{uri}\",BYTERANGE=\"{len}@{offset}\"");
                map_file = Some(n);
            }
            let _ = writeln!(
                p,
                "#EXT-X-PROGRAM-DATE-TIME:{}",
                date_time(view.start_wall_ns.saturating_add(s.time_ns))
            );
            let _ = writeln!(p, "#EXTINF:{},", seconds(s.duration_ticks));
            let _ = writeln!(p, "#EXT-X-BYTERANGE:{}@{}", s.len, s.offset);
            let _ = writeln!(p, "{uri}");
        }
        p
    }
}

/// Seconds with three decimals, as `EXTINF` carries them.
fn seconds(ticks: u64) -> String {
    let ms =
        (u128::from(ticks) * 1000 + u128::from(PTS_TICKS_PER_S) / 2) / u128::from(PTS_TICKS_PER_S);
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

/// ISO 8601 / RFC 3339 with milliseconds, UTC: `2026-11-27T14:03:20.123Z`.
pub fn date_time(unix_ns: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_nanos(unix_ns)).to_string()
}

/// The PSI a live recording's segments need, found in its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TsPsi {
    pub pat_offset: u64,
    pub pmt_offset: u64,
    pub video_pid: u16,
    pub codec: VideoCodec,
}

impl TsPsi {
    /// `EXT-X-MAP`'s range: from the PAT to the end of the PMT, when the PAT comes first.
    pub fn map_range(&self) -> Option<(u64, u64)> {
        (self.pat_offset < self.pmt_offset).then(|| {
            (
                self.pat_offset,
                self.pmt_offset + TS_PACKET_BYTES as u64 - self.pat_offset,
            )
        })
    }
}

/// The first PAT, and the first PMT it names that has a video stream, in `bytes` (the start
/// of a TS recording, whole packets from offset 0); `None` until both are there.
pub fn find_psi(bytes: &[u8]) -> Option<TsPsi> {
    let mut pat: Option<(u64, u16)> = None;
    for (i, p) in bytes.chunks_exact(TS_PACKET_BYTES).enumerate() {
        let at = (i * TS_PACKET_BYTES) as u64;
        let Some(pkt) = parse_packet(p.try_into().ok()?) else {
            continue;
        };
        if !pkt.payload_unit_start || pkt.transport_error {
            continue;
        }
        if pkt.pid == PAT_PID && pat.is_none() {
            pat = pat_first_program(pkt.payload).map(|(_, pmt)| (at, pmt));
            continue;
        }
        if let Some((pat_offset, pmt_pid)) = pat
            && pkt.pid == pmt_pid
            && let Some(streams) = pmt_streams(pkt.payload)
            && let Some((video_pid, codec)) = streams
                .iter()
                .find_map(|&(t, pid)| video_codec(t).map(|c| (pid, c)))
        {
            return Some(TsPsi {
                pat_offset,
                pmt_offset: at,
                video_pid,
                codec,
            });
        }
    }
    None
}

fn video_codec(stream_type: u8) -> Option<VideoCodec> {
    match stream_type {
        0x1b => Some(VideoCodec::H264),
        0x24 => Some(VideoCodec::H265),
        0x01 | 0x02 => Some(VideoCodec::Mpeg2),
        _ => None,
    }
}

/// In one recorded datagram (whole TS packets) that the frame track marks: the index of the
/// TS packet that starts a key frame's PES on `video_pid` and that PES's PTS. `None` when the
/// datagram holds no such packet (the frame rule also marks audio packets that carry the
/// random-access indicator) or the PES has no PTS.
pub fn key_frame_in(datagram: &[u8], video_pid: u16, codec: VideoCodec) -> Option<(usize, u64)> {
    for (i, p) in datagram.chunks_exact(TS_PACKET_BYTES).enumerate() {
        let Some(pkt) = parse_packet(p.try_into().ok()?) else {
            continue;
        };
        if pkt.pid != video_pid || !pkt.payload_unit_start || pkt.transport_error {
            continue;
        }
        let pes = pkt.payload;
        if pes.len() < 14 || pes[0..3] != [0, 0, 1] || pes[7] & 0x80 == 0 {
            continue;
        }
        let es = pes.get(9 + usize::from(pes[8])..).unwrap_or(&[]);
        let key = pkt.random_access
            || match codec {
                VideoCodec::H264 => annexb_has_key_nal(es),
                _ => false,
            };
        if !key {
            continue;
        }
        let b = &pes[9..14];
        let pts = (u64::from(b[0] >> 1) & 0x07) << 30
            | u64::from(b[1]) << 22
            | (u64::from(b[2]) >> 1) << 15
            | u64::from(b[3]) << 7
            | u64::from(b[4]) >> 1;
        return Some((i, pts));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: u64 = PTS_TICKS_PER_S;
    const NS: u64 = 1_000_000_000;

    fn kf(offset: u64, pts_s_x10: u64, time_s_x10: u64) -> LiveKeyFrame {
        LiveKeyFrame {
            offset,
            pts: pts_s_x10 * S / 10,
            time_ns: time_s_x10 * NS / 10,
        }
    }

    fn view(window: usize) -> LiveView<'static> {
        LiveView {
            uri: "stream.ts",
            map: Some((0, 376)),
            window,
            start_wall_ns: 1_795_000_000 * NS,
            query: None,
            files: &[],
        }
    }

    #[test]
    fn a_segmented_recording_spans_its_files_and_drops_the_deleted_ones() {
        let mut x = LiveIndex::new(2 * S, 100);
        // File 0: key frames at 0, 1, 2, 3 s; it ends at 3500 bytes (a rotation at 3.5 s's
        // key frame). File 1 starts with that key frame at offset 376 (after PAT and PMT).
        for i in 0..4 {
            x.handle_key_frame(kf(1000 * i, 10 * i, 10 * i));
        }
        x.handle_synced(3500);
        x.handle_next_file(3500);
        x.handle_key_frame(kf(376, 35, 35));
        x.handle_key_frame(kf(1376, 45, 45));
        x.handle_key_frame(kf(2376, 55, 55));
        x.handle_synced(2500);
        let segs: Vec<_> = x
            .segments()
            .iter()
            .map(|s| (s.file, s.offset, s.len, s.discontinuity))
            .collect();
        assert_eq!(
            segs,
            vec![
                (0, 0, 2000, false),
                (0, 2000, 1500, false),
                (1, 376, 2000, false)
            ]
        );
        assert_eq!(x.segments()[1].duration_ticks, 15 * S / 10);
        let file = |file, uri| LiveFile {
            file,
            uri,
            map: Some((0, 376)),
        };
        let files = [file(0, "a.ts"), file(1, "b.ts")];
        let p = x.playlist(&LiveView {
            files: &files,
            ..view(0)
        });
        assert!(
            p.contains("#EXT-X-MAP:URI=\"a.ts\",BYTERANGE=\"376@0\"\n#EXT-X-PROGRAM-DATE-TIME"),
            "{p}"
        );
        assert!(p.contains("#EXT-X-BYTERANGE:1500@2000\na.ts\n"), "{p}");
        assert!(
            p.contains("#EXT-X-MAP:URI=\"b.ts\",BYTERANGE=\"376@0\"\n#EXT-X-PROGRAM-DATE-TIME"),
            "{p}"
        );
        assert!(p.contains("#EXT-X-BYTERANGE:2000@376\nb.ts\n"), "{p}");
        assert!(!p.contains("stream.ts"), "{p}");
        assert!(
            !p.contains("DISCONTINUITY"),
            "one byte stream across files: {p}"
        );
        // Retention deleted file 0: its segments leave, the sequence numbers go on.
        x.handle_file_removed(0);
        assert_eq!(x.segments().len(), 1);
        let p = x.playlist(&LiveView {
            files: &files[1..],
            ..view(0)
        });
        assert!(p.contains("#EXT-X-MEDIA-SEQUENCE:2\n"), "{p}");
        assert!(!p.contains("a.ts") && !p.contains("EVENT"), "{p}");
    }

    #[test]
    fn cuts_at_the_first_key_frame_past_the_target_and_lists_only_complete_segments() {
        let mut x = LiveIndex::new(2 * S, 100);
        // Key frames every second, 1000 bytes apart.
        for i in 0..7 {
            x.handle_key_frame(kf(1000 * i, 10 * i, 10 * i));
        }
        x.handle_synced(6500);
        let segs: Vec<_> = x.segments().iter().map(|s| (s.offset, s.len)).collect();
        assert_eq!(segs, vec![(0, 2000), (2000, 2000), (4000, 2000)]);
        assert!(x.segments().iter().all(|s| s.duration_ticks == 2 * S));
        assert_eq!(x.next_msn(), 3);
        let p = x.playlist(&view(0));
        assert!(p.contains("#EXT-X-PLAYLIST-TYPE:EVENT\n"), "{p}");
        assert!(p.contains("#EXT-X-MEDIA-SEQUENCE:0\n"));
        assert!(p.contains("#EXT-X-TARGETDURATION:2\n"));
        assert!(p.contains("#EXT-X-MAP:URI=\"stream.ts\",BYTERANGE=\"376@0\"\n"));
        assert!(p.contains("#EXT-X-BYTERANGE:2000@4000\nstream.ts\n"));
        assert!(!p.contains("ENDLIST"));
        assert!(
            p.contains("#EXT-X-PROGRAM-DATE-TIME:2026-11-18T11:06:40.000Z\n"),
            "{p}"
        );
        assert!(
            p.contains("#EXT-X-PROGRAM-DATE-TIME:2026-11-18T11:06:42.000Z\n"),
            "{p}"
        );
    }

    #[test]
    fn a_sliding_window_moves_the_media_sequence() {
        let mut x = LiveIndex::new(S, 100);
        for i in 0..11 {
            x.handle_key_frame(kf(100 * i, 10 * i, 10 * i));
        }
        assert_eq!(x.next_msn(), 10);
        let p = x.playlist(&view(3));
        assert!(p.contains("#EXT-X-MEDIA-SEQUENCE:7\n"), "{p}");
        assert!(!p.contains("PLAYLIST-TYPE"));
        assert_eq!(p.matches("#EXTINF").count(), 3);
        assert!(p.contains("#EXT-X-BYTERANGE:100@700\n"));
        assert!(p.contains("#EXT-X-BYTERANGE:100@900\n"));
    }

    #[test]
    fn the_bound_drops_the_oldest_and_the_event_type() {
        let mut x = LiveIndex::new(S, 4);
        for i in 0..11 {
            x.handle_key_frame(kf(100 * i, 10 * i, 10 * i));
        }
        assert_eq!(x.segments().len(), 4);
        let p = x.playlist(&view(0));
        assert!(p.contains("#EXT-X-MEDIA-SEQUENCE:6\n"), "{p}");
        assert!(!p.contains("EVENT"));
    }

    #[test]
    fn a_restart_and_a_jump_are_discontinuities() {
        let mut x = LiveIndex::new(2 * S, 100);
        for i in 0..5 {
            x.handle_key_frame(kf(1000 * i, 14 + 10 * i, 10 * i));
        }
        // The source restarts 10 s later: its PTS begins again.
        x.handle_key_frame(kf(5000, 14, 140));
        x.handle_key_frame(kf(6000, 24, 150));
        x.handle_key_frame(kf(7000, 34, 160));
        // Then its PTS jumps an hour ahead while the receive time moves one second.
        x.handle_key_frame(kf(8000, 36034, 170));
        x.handle_key_frame(kf(9000, 36044, 180));
        x.handle_key_frame(kf(10000, 36054, 190));
        let segs: Vec<_> = x.segments().iter().copied().collect();
        let disc: Vec<_> = segs.iter().map(|s| s.discontinuity).collect();
        assert_eq!(
            segs.iter().map(|s| s.offset).collect::<Vec<_>>(),
            vec![0, 2000, 4000, 5000, 7000, 8000]
        );
        assert_eq!(disc, vec![false, false, false, true, false, true]);
        // Cut before the restart: one second of PTS, plus at most one target of the gap.
        assert_eq!(segs[2].duration_ticks, 2 * S);
        let p = x.playlist(&view(0));
        assert_eq!(p.matches("#EXT-X-DISCONTINUITY\n").count(), 2);
        let p = x.playlist(&view(2));
        assert!(p.contains("#EXT-X-DISCONTINUITY-SEQUENCE:1\n"), "{p}");
    }

    #[test]
    fn a_pts_wrap_is_not_a_discontinuity() {
        let mut x = LiveIndex::new(S, 100);
        let base = PTS_MODULUS - S / 2;
        for i in 0..4u64 {
            x.handle_key_frame(LiveKeyFrame {
                offset: 100 * i,
                pts: (base + i * S) % PTS_MODULUS,
                time_ns: i * NS,
            });
        }
        assert!(
            x.segments()
                .iter()
                .all(|s| !s.discontinuity && s.duration_ticks == S)
        );
    }

    #[test]
    fn blocking_reload_answers_waits_or_refuses() {
        let mut x = LiveIndex::new(S, 100);
        for i in 0..4 {
            x.handle_key_frame(kf(100 * i, 10 * i, 10 * i));
        }
        // Segments 0..=2 exist.
        assert_eq!(x.blocking(2), Blocking::Ready);
        assert_eq!(x.blocking(3), Blocking::Wait);
        assert_eq!(x.blocking(4), Blocking::Wait);
        assert_eq!(x.blocking(5), Blocking::TooFar);
        assert_eq!(LiveIndex::new(S, 1).blocking(2), Blocking::TooFar);
    }

    #[test]
    #[should_panic(expected = "past the synced")]
    fn a_segment_past_the_synced_length_is_a_broken_invariant() {
        let mut x = LiveIndex::new(S, 100);
        x.handle_key_frame(kf(0, 0, 0));
        x.handle_key_frame(kf(1000, 10, 10));
        x.handle_synced(999);
    }

    #[test]
    fn psi_and_key_frames_are_found_in_ffmpeg_like_packets() {
        use crate::hls::ts_index::encode_pts;
        // PAT (program 1 → PMT 0x1000), PMT (H.264 on 0x100), a video PES start with RAI.
        let mut pat = vec![0x47, 0x40, 0x00, 0x10, 0x00];
        let sec = [
            0x00, 0xb0, 0x0d, 0x00, 0x01, 0xc1, 0x00, 0x00, 0x00, 0x01, 0xf0, 0x00,
        ];
        pat.extend_from_slice(&sec);
        pat.extend_from_slice(&crate::ts::psi::crc32_mpeg2(&sec).to_be_bytes());
        pat.resize(188, 0xff);
        let mut pmt = vec![0x47, 0x50, 0x00, 0x10, 0x00];
        let sec = [
            0x02, 0xb0, 0x12, 0x00, 0x01, 0xc1, 0x00, 0x00, 0xe1, 0x00, 0xf0, 0x00, 0x1b, 0xe1,
            0x00, 0xf0, 0x00,
        ];
        pmt.extend_from_slice(&sec);
        pmt.extend_from_slice(&crate::ts::psi::crc32_mpeg2(&sec).to_be_bytes());
        pmt.resize(188, 0xff);
        let mut v = vec![0x47, 0x41, 0x00, 0x30, 0x01, 0x40];
        v.extend_from_slice(&[0, 0, 1, 0xe0, 0, 0, 0x80, 0x80, 5]);
        v.extend_from_slice(&encode_pts(2, 123_456));
        v.extend_from_slice(&[0, 0, 0, 1, 0x09, 0xf0]);
        v.resize(188, 0xff);
        let mut bytes = pat.clone();
        bytes.extend_from_slice(&pmt);
        let psi = find_psi(&bytes).expect("psi");
        assert_eq!(
            (psi.pat_offset, psi.pmt_offset, psi.video_pid),
            (0, 188, 0x100)
        );
        assert_eq!(psi.map_range(), Some((0, 376)));
        let mut d = pat.clone();
        d.extend_from_slice(&v);
        assert_eq!(
            key_frame_in(&d, 0x100, VideoCodec::H264),
            Some((1, 123_456))
        );
        assert_eq!(key_frame_in(&d, 0x101, VideoCodec::H264), None);
        assert_eq!(key_frame_in(&[0u8; 100], 0x100, VideoCodec::H264), None);
    }

    /// The duration of each `EXTINF` of a playlist, and its `EXT-X-TARGETDURATION`.
    fn durations(p: &str) -> (u64, Vec<f64>) {
        let target = p
            .lines()
            .find_map(|l| l.strip_prefix("#EXT-X-TARGETDURATION:"))
            .unwrap()
            .parse()
            .unwrap();
        let d = p
            .lines()
            .filter_map(|l| l.strip_prefix("#EXTINF:"))
            .map(|l| l.trim_end_matches(',').parse().unwrap())
            .collect();
        (target, d)
    }

    #[test]
    fn the_target_duration_holds_when_the_gop_grows() {
        // 2 s target, key frames 1 s apart, then 3 s apart (cut before the first too long
        // span: a 1 s segment, then 3 s segments do not fit 2: left out), then 1.5 s apart.
        let mut x = LiveIndex::new(2 * S, 100);
        let mut at = 0;
        let mut add = |x: &mut LiveIndex, pts_x10: u64| {
            at += 1000;
            x.handle_key_frame(kf(at, pts_x10, pts_x10));
        };
        for t in [0, 10, 20, 30, 40] {
            add(&mut x, t);
        }
        assert_eq!(x.target_duration_s(), 2);
        let first = x.playlist(&view(0));
        for t in [50, 80, 110, 140, 155, 170, 185, 200] {
            add(&mut x, t);
            let (target, d) = durations(&x.playlist(&view(0)));
            assert_eq!(target, 2);
            assert!(d.iter().all(|d| d.round() as u64 <= target), "{d:?}");
        }
        assert!(first.contains(
            "#EXT-X-TARGETDURATION:2
"
        ));
        let segs: Vec<_> = x
            .segments()
            .iter()
            .map(|s| (s.offset, s.duration_ticks * 10 / S, s.discontinuity))
            .collect();
        // 0-2 s, 2-4 s, 4-5 s (cut at 5 s, the key frame before 8 s), the 5-8 s, 8-11 s
        // and 11-14 s intervals left out, 14-17 s (three 1.5 s intervals: 2 s would end
        // at 15.5, 17 is 3 s past 14: cut at 15.5), …
        assert_eq!(
            segs,
            vec![
                (1000, 20, false),
                (3000, 20, false),
                (5000, 10, false),
                (9000, 15, true),
                (10000, 15, false),
                (11000, 15, false),
            ]
        );
        assert_eq!(x.skipped(), 3);
    }

    #[test]
    fn the_first_segment_sets_a_longer_target_for_a_longer_gop() {
        // 6 s target, key frames 8 s apart: 8 s segments, TARGETDURATION 8 throughout.
        let mut x = LiveIndex::new(6 * S, 100);
        for i in 0..6 {
            x.handle_key_frame(kf(1000 * i, 80 * i, 80 * i));
            if !x.segments().is_empty() {
                assert_eq!(durations(&x.playlist(&view(0))).0, 8);
            }
        }
        assert_eq!(x.segments().len(), 5);
        assert_eq!(x.skipped(), 0);
    }

    proptest! {
        /// Across the successive playlists of one live stream, `EXT-X-TARGETDURATION` never
        /// changes once the first segment is listed, and every `EXTINF` rounded to the
        /// nearest second is at most it, whatever the key-frame intervals (growing,
        /// shrinking, jittered), the target and the window.
        #[test]
        fn the_target_duration_is_constant_and_bounds_every_extinf(
            gaps in proptest::collection::vec(1u64..(12 * S), 1..150),
            target_ms in 500u64..9000,
            window in 0usize..6,
        ) {
            let mut x = LiveIndex::new(target_ms * S / 1000, 1000);
            let (mut off, mut pts) = (0u64, 0u64);
            let mut fixed = None;
            for g in gaps {
                off += 188;
                pts += g;
                x.handle_key_frame(LiveKeyFrame { offset: off, pts: pts % PTS_MODULUS, time_ns: pts * NS / S });
                if x.segments().is_empty() {
                    continue;
                }
                let (target, d) = durations(&x.playlist(&view(window)));
                prop_assert_eq!(*fixed.get_or_insert(target), target);
                prop_assert!(target >= target_ms.div_ceil(1000));
                for d in d {
                    // Rounded half up (the RFC's nearest integer).
                    prop_assert!((d + 0.5).floor() as u64 <= target, "{} > {}", d, target);
                }
            }
        }

        /// Whatever key frames arrive (steady, jittered, restarting), the listed segments are
        /// contiguous, each starts at a key frame handed in, ends at or before the last synced
        /// one, has a positive duration, and the media sequence plus the count never moves
        /// back.
        #[test]
        fn segments_are_contiguous_key_frame_ranges(
            steps in proptest::collection::vec((1u64..5000, 0u64..(3 * S), 0u64..(3 * NS), 0u8..20), 1..200),
            target_s in 1u64..8,
            window in 0usize..6,
            max in 1usize..50,
        ) {
            let mut x = LiveIndex::new(target_s * S, max);
            let (mut off, mut pts, mut t) = (0u64, 0u64, 0u64);
            let mut offsets = std::collections::HashSet::new();
            let mut next_before = 0;
            for (d_off, d_pts, d_t, kind) in steps {
                off += d_off;
                t += d_t;
                pts = if kind == 0 { d_pts } else { (pts + d_pts) % PTS_MODULUS };
                offsets.insert(off);
                x.handle_key_frame(LiveKeyFrame { offset: off, pts, time_ns: t });
                x.handle_synced(off + 188);
                prop_assert!(x.next_msn() >= next_before);
                next_before = x.next_msn();
                let segs: Vec<_> = x.segments().iter().copied().collect();
                for w in segs.windows(2) {
                    // Contiguous, but for a key-frame interval too long to list (left out,
                    // a discontinuity after it).
                    let end = w[0].offset + w[0].len;
                    prop_assert!(
                        end == w[1].offset || (end < w[1].offset && w[1].discontinuity),
                        "{:?}", w
                    );
                }
                for s in &segs {
                    prop_assert!(offsets.contains(&s.offset) || s.offset == 0);
                    prop_assert!(offsets.contains(&(s.offset + s.len)));
                    prop_assert!(s.duration_ticks > 0);
                    prop_assert!(s.offset + s.len <= x.synced_bytes());
                    prop_assert!((s.duration_ticks + S / 2) / S <= x.target_duration_s());
                }
                let p = x.playlist(&view(window));
                let shown = p.matches("#EXTINF").count();
                prop_assert!(window == 0 || shown <= window);
                let seq: u64 = p.lines().find_map(|l| l.strip_prefix("#EXT-X-MEDIA-SEQUENCE:")).unwrap().parse().unwrap();
                prop_assert_eq!(seq + shown as u64, x.next_msn());
            }
        }
    }
}
