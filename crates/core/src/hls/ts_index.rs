//! The key-frame index of an MPEG-TS file: where each independently decodable picture of the
//! video stream starts (the TS packet that begins its PES), with its presentation time, and
//! where the file's PAT and PMT are. HLS segments are cut from it as byte ranges of the file
//! itself ([`super::playlist`]); nothing is remuxed.
//!
//! Fed the file's bytes in order, in chunks of any size ([`TsIndexer::push`]), as the PCR
//! planner is. The video stream is the first of the first program's PMT whose type is H.264
//! (0x1b), H.265 (0x24) or MPEG-2/MPEG-1 video (0x02, 0x01). A PES start of that stream is a
//! key frame when its TS packet carries the adaptation field's `random_access_indicator` (what
//! ffmpeg's muxer sets on key frames), or, for H.264, when the elementary stream bytes within
//! that TS packet hold an IDR or SPS NAL unit before any non-IDR slice (`track::mpegts`), or,
//! for H.265, an IRAP NAL unit (types 16-21) or a VPS/SPS before any other slice. A key frame
//! whose PES carries no PTS is not indexed (it could not be placed in time).

use super::media::{ADTS_HEADER_BYTES, find_adts, is_audio_stream_type};
use crate::track::mpegts::annexb_has_key_nal;
use crate::ts::psi::{PAT_PID, pat_first_program, pmt_streams};
use crate::ts::{TS_PACKET_BYTES, parse_packet};

/// Ticks per second of the 90 kHz clock PTS and DTS count.
pub const PTS_TICKS_PER_S: u64 = 90_000;
const PTS_MODULUS: u64 = 1 << 33;

/// Bounds on what an index may hold (a file is input like any other).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TsIndexLimits {
    /// Most key frames indexed (a 24-hour title with a key frame every 0.5 s has 172,800).
    pub key_frames_max: usize,
}

impl Default for TsIndexLimits {
    fn default() -> Self {
        TsIndexLimits {
            key_frames_max: 1 << 20,
        }
    }
}

/// Why a file has no index.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TsIndexError {
    #[error("not MPEG-TS: no sync byte at offset {0}")]
    NotTs(u64),
    #[error("no PAT and PMT naming a video stream (H.264, H.265 or MPEG-2 video)")]
    NoVideo,
    #[error("no key frame with a presentation time in the video stream")]
    NoKeyFrame,
    #[error("more than {0} key frames")]
    TooManyKeyFrames(usize),
}

/// The video codec of the indexed stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VideoCodec {
    H264,
    H265,
    Mpeg2,
}

impl VideoCodec {
    fn of_stream_type(t: u8) -> Option<VideoCodec> {
        match t {
            0x1b => Some(VideoCodec::H264),
            0x24 => Some(VideoCodec::H265),
            0x01 | 0x02 => Some(VideoCodec::Mpeg2),
            _ => None,
        }
    }
}

/// One key frame: the offset of the TS packet that starts its PES, and its PTS in 90 kHz
/// ticks, unwrapped (continuing past the 33-bit wrap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyFrame {
    pub offset: u64,
    pub pts: u64,
    /// The offset of a PAT packet that the file repeats just before this key frame: a PAT
    /// followed by the PMT, with no packet of the video stream between the PAT and the key
    /// frame (ffmpeg's muxer writes PAT and PMT before every video key frame). A segment can
    /// start there and carry its own PSI, decodable alone without `EXT-X-MAP`.
    pub psi: Option<u64>,
    /// Where the key frame's PES ends: the offset of the next PES start of the video stream
    /// (the next frame), or the end of the file. `[psi or offset, end)` holds the whole
    /// picture (an `EXT-X-I-FRAMES-ONLY` playlist's byte range).
    pub end: u64,
}

/// Bytes of the video stream searched for its first SPS, from the start of each PES, until
/// one is found (an SPS is tens of bytes and follows the access unit delimiter).
pub const SPS_SCAN_BYTES: usize = 1024;

/// The first audio stream of the first program's PMT (MPEG audio, AAC in ADTS or LATM, AC-3,
/// E-AC-3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AudioStream {
    pub pid: u16,
    pub stream_type: u8,
    /// The first ADTS header of the stream (stream type 0x0f), when one was found at the start
    /// of a PES.
    pub adts: Option<[u8; ADTS_HEADER_BYTES]>,
}

/// The index of one TS file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TsIndex {
    /// The file's size: whole TS packets (a torn last packet is left out of every range).
    pub size: u64,
    pub codec: VideoCodec,
    pub video_pid: u16,
    /// Key frames in file order.
    pub key_frames: Vec<KeyFrame>,
    /// The smallest and largest video PTS seen (unwrapped), and the video PES count: the
    /// title's span and its mean frame interval.
    pub first_pts: u64,
    pub last_pts: u64,
    pub frames: u64,
    /// Offsets of the first PAT and of the first PMT packet (the PSI a segment needs to be
    /// decoded alone: HLS's `EXT-X-MAP`).
    pub pat_offset: u64,
    pub pmt_offset: u64,
    /// The video stream's first sequence parameter set NAL unit (its header byte first, as in
    /// the stream), at most [`SPS_SCAN_BYTES`]: H.264 (type 7) or H.265 (type 33).
    pub sps: Option<Vec<u8>>,
    pub audio: Option<AudioStream>,
}

impl TsIndex {
    /// The mean interval between frames, in 90 kHz ticks (0 with one frame).
    pub fn frame_ticks(&self) -> u64 {
        if self.frames < 2 {
            return 0;
        }
        (self.last_pts - self.first_pts) / (self.frames - 1)
    }

    /// Presentation span from the first key frame to the end of the last frame, in ticks
    /// (at least one: a title of one frame has no interval to measure).
    pub fn duration_ticks(&self) -> u64 {
        let start = self.key_frames.first().map_or(self.first_pts, |k| k.pts);
        (self.last_pts + self.frame_ticks())
            .saturating_sub(start)
            .max(1)
    }
}

/// Builds a [`TsIndex`] from a file's bytes, fed in order.
#[derive(Debug)]
pub struct TsIndexer {
    limits: TsIndexLimits,
    /// Bytes of a packet split between two pushes.
    carry: Vec<u8>,
    /// Offset of the next whole packet.
    offset: u64,
    pmt_pid: Option<u16>,
    video: Option<(u16, VideoCodec)>,
    pat_offset: Option<u64>,
    pmt_offset: Option<u64>,
    key_frames: Vec<KeyFrame>,
    /// The last PTS seen (raw, 33 bits) and the ticks added for wraps so far.
    last_raw_pts: Option<u64>,
    wrap_ticks: u64,
    first_pts: Option<u64>,
    last_pts: u64,
    frames: u64,
    error: Option<TsIndexError>,
    audio: Option<AudioStream>,
    sps: Option<Vec<u8>>,
    /// The start of the current video PES, while no SPS is found (at most SPS_SCAN_BYTES).
    sps_scan: Vec<u8>,
    /// The last PAT packet since the last packet of the video stream, and whether a PMT
    /// followed it (what [`KeyFrame::psi`] reports).
    psi_since_video: Option<(u64, bool)>,
    /// What `psi_since_video` held when the current video packet came.
    key_psi: Option<u64>,
}

impl TsIndexer {
    pub fn new(limits: TsIndexLimits) -> TsIndexer {
        TsIndexer {
            limits,
            carry: Vec::with_capacity(TS_PACKET_BYTES),
            offset: 0,
            pmt_pid: None,
            video: None,
            pat_offset: None,
            pmt_offset: None,
            key_frames: Vec::new(),
            last_raw_pts: None,
            wrap_ticks: 0,
            first_pts: None,
            last_pts: 0,
            frames: 0,
            error: None,
            audio: None,
            sps: None,
            sps_scan: Vec::new(),
            psi_since_video: None,
            key_psi: None,
        }
    }

    /// The next bytes of the file. After an error, the rest is ignored and
    /// [`TsIndexer::finish`] returns it.
    pub fn push(&mut self, mut bytes: &[u8]) {
        if self.error.is_some() {
            return;
        }
        if !self.carry.is_empty() {
            let need = TS_PACKET_BYTES - self.carry.len();
            let take = need.min(bytes.len());
            self.carry.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.carry.len() < TS_PACKET_BYTES {
                return;
            }
            let p: [u8; TS_PACKET_BYTES] =
                self.carry[..].try_into().expect("a whole packet carried");
            self.carry.clear();
            self.packet(&p);
        }
        let mut chunks = bytes.chunks_exact(TS_PACKET_BYTES);
        for p in &mut chunks {
            if self.error.is_some() {
                return;
            }
            self.packet(p.try_into().expect("chunks of a packet"));
        }
        self.carry.extend_from_slice(chunks.remainder());
    }

    fn packet(&mut self, p: &[u8; TS_PACKET_BYTES]) {
        let at = self.offset;
        self.offset += TS_PACKET_BYTES as u64;
        let Some(pkt) = parse_packet(p) else {
            if p[0] != crate::ts::TS_SYNC_BYTE {
                self.error = Some(TsIndexError::NotTs(at));
            }
            return;
        };
        if pkt.transport_error {
            return;
        }
        if self.video.is_some_and(|(pid, _)| pid == pkt.pid) {
            // Whatever PSI came before this video packet is not right before a key frame
            // that follows it.
            self.key_psi = self
                .psi_since_video
                .take()
                .filter(|&(_, pmt)| pmt)
                .map(|(at, _)| at);
        }
        if !pkt.payload_unit_start {
            if self.sps.is_none()
                && !self.sps_scan.is_empty()
                && self.video.is_some_and(|(pid, _)| pid == pkt.pid)
            {
                let room = SPS_SCAN_BYTES - self.sps_scan.len();
                let take = room.min(pkt.payload.len());
                self.sps_scan.extend_from_slice(&pkt.payload[..take]);
                self.find_sps(false);
            }
            return;
        }
        if pkt.pid == PAT_PID {
            self.psi_since_video = Some((at, false));
            if self.pmt_pid.is_none()
                && let Some((_, pmt)) = pat_first_program(pkt.payload)
            {
                self.pmt_pid = Some(pmt);
                self.pat_offset = Some(at);
            }
            return;
        }
        if Some(pkt.pid) == self.pmt_pid {
            if let Some((_, pmt)) = &mut self.psi_since_video {
                *pmt = true;
            }
            if self.video.is_none()
                && let Some(streams) = pmt_streams(pkt.payload)
            {
                self.video = streams
                    .iter()
                    .find_map(|&(t, pid)| VideoCodec::of_stream_type(t).map(|c| (pid, c)));
                if self.video.is_some() {
                    self.pmt_offset = Some(at);
                    self.audio = streams.iter().find(|&&(t, _)| is_audio_stream_type(t)).map(
                        |&(stream_type, pid)| AudioStream {
                            pid,
                            stream_type,
                            adts: None,
                        },
                    );
                }
            }
            return;
        }
        let Some((pid, codec)) = self.video else {
            return;
        };
        if let Some(a) = &mut self.audio
            && a.pid == pkt.pid
        {
            if a.stream_type == 0x0f
                && a.adts.is_none()
                && let Some(es) = pes_es(pkt.payload)
                && let Some(i) = find_adts(es)
            {
                a.adts = es[i..i + ADTS_HEADER_BYTES].try_into().ok();
            }
            return;
        }
        if pkt.pid != pid {
            return;
        }
        if self.sps.is_none() && codec != VideoCodec::Mpeg2 {
            // The previous PES ended: an SPS begun in it runs to its end.
            self.find_sps(true);
            if self.sps.is_none() {
                self.sps_scan.clear();
                if let Some(es) = pes_es(pkt.payload) {
                    self.sps_scan
                        .extend_from_slice(&es[..es.len().min(SPS_SCAN_BYTES)]);
                    self.find_sps(false);
                }
            }
        }
        if let Some(k) = self.key_frames.last_mut()
            && k.end == 0
        {
            k.end = at;
        }
        let Some(raw) = pes_pts(pkt.payload) else {
            return;
        };
        let pts = self.unwrap_pts(raw);
        self.frames += 1;
        self.first_pts = Some(self.first_pts.map_or(pts, |f| f.min(pts)));
        self.last_pts = self.last_pts.max(pts);
        let key = pkt.random_access
            || match codec {
                VideoCodec::H264 => pes_es(pkt.payload).is_some_and(annexb_has_key_nal),
                VideoCodec::H265 => pes_es(pkt.payload).is_some_and(annexb_has_h265_key_nal),
                VideoCodec::Mpeg2 => false,
            };
        if key {
            if self.key_frames.len() >= self.limits.key_frames_max {
                self.error = Some(TsIndexError::TooManyKeyFrames(self.limits.key_frames_max));
                return;
            }
            self.key_frames.push(KeyFrame {
                offset: at,
                pts,
                psi: self.key_psi,
                end: 0,
            });
        }
    }

    /// A PTS on the unwrapped line: a step back of more than half the 33-bit range is a wrap.
    /// (B-frames step back a little; that is not a wrap.)
    fn unwrap_pts(&mut self, raw: u64) -> u64 {
        if let Some(last) = self.last_raw_pts
            && raw < last
            && last - raw > PTS_MODULUS / 2
        {
            self.wrap_ticks += PTS_MODULUS;
        }
        self.last_raw_pts = Some(raw);
        raw + self.wrap_ticks
    }

    /// Looks for the first SPS NAL unit in the bytes kept of the current video PES: kept when
    /// the next start code ends it, or when `ended` (the PES is over) or the scan is full (it
    /// runs to there). Once the scan is full without an SPS, the rest of this PES is skipped.
    fn find_sps(&mut self, ended: bool) {
        let Some((_, codec)) = self.video else {
            return;
        };
        let is_sps = |header: u8| match codec {
            VideoCodec::H264 => header & 0x1f == 7,
            VideoCodec::H265 => (header >> 1) & 0x3f == 33,
            VideoCodec::Mpeg2 => false,
        };
        let b = &self.sps_scan;
        let full = b.len() >= SPS_SCAN_BYTES;
        let Some(start) = start_codes(b).find(|&i| is_sps(b[i])) else {
            if full {
                // Nothing to find in this PES: stop collecting it (an empty scan is idle).
                self.sps_scan.clear();
            }
            return;
        };
        let end = start_codes(&b[start..]).next().map(|e| start + e - 3);
        let nal = match end {
            Some(end) => &b[start..end],
            None if ended || full => &b[start..],
            None => return,
        };
        // A NAL unit ends with its stop bit: zeros after it belong to the next start code.
        let len = nal.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
        self.sps = Some(nal[..len].to_vec());
        self.sps_scan = Vec::new();
    }

    /// The index, or why there is none.
    pub fn finish(mut self) -> Result<TsIndex, TsIndexError> {
        if self.sps.is_none() {
            self.find_sps(true);
        }
        if let Some(e) = self.error {
            return Err(e);
        }
        let (Some((video_pid, codec)), Some(pat_offset), Some(pmt_offset)) =
            (self.video, self.pat_offset, self.pmt_offset)
        else {
            return Err(TsIndexError::NoVideo);
        };
        if self.key_frames.is_empty() {
            return Err(TsIndexError::NoKeyFrame);
        }
        if let Some(k) = self.key_frames.last_mut()
            && k.end == 0
        {
            k.end = self.offset;
        }
        Ok(TsIndex {
            size: self.offset,
            codec,
            video_pid,
            first_pts: self.first_pts.unwrap_or(0),
            last_pts: self.last_pts,
            frames: self.frames,
            key_frames: self.key_frames,
            pat_offset,
            pmt_offset,
            sps: self.sps,
            audio: self.audio,
        })
    }
}

/// The offsets just after each `00 00 01` start code in `b` (where a NAL header byte is).
fn start_codes(b: &[u8]) -> impl Iterator<Item = usize> + '_ {
    (3..b.len()).filter(move |&i| b[i - 3] == 0 && b[i - 2] == 0 && b[i - 1] == 1)
}

/// The PTS of a PES packet's header, when the payload starts a PES that carries one.
fn pes_pts(pes: &[u8]) -> Option<u64> {
    if pes.len() < 14 || pes[0..3] != [0, 0, 1] {
        return None;
    }
    // PTS_DTS_flags: '10' or '11'.
    if pes[7] & 0x80 == 0 {
        return None;
    }
    let b = &pes[9..14];
    Some(
        (u64::from(b[0] >> 1) & 0x07) << 30
            | u64::from(b[1]) << 22
            | (u64::from(b[2]) >> 1) << 15
            | u64::from(b[3]) << 7
            | u64::from(b[4]) >> 1,
    )
}

/// The elementary stream bytes after a PES header (as much as the TS packet holds).
fn pes_es(pes: &[u8]) -> Option<&[u8]> {
    if pes.len() < 9 || pes[0..3] != [0, 0, 1] {
        return None;
    }
    pes.get(9 + usize::from(pes[8])..)
}

/// Annex B bytes of H.265: an IRAP slice (NAL types 16-21) or a VPS/SPS (32, 33) before any
/// other slice (0-15).
fn annexb_has_h265_key_nal(es: &[u8]) -> bool {
    let mut i = 0;
    while i + 3 < es.len() {
        if es[i] == 0 && es[i + 1] == 0 && es[i + 2] == 1 {
            match (es[i + 3] >> 1) & 0x3f {
                16..=21 | 32 | 33 => return true,
                0..=15 => return false,
                _ => {}
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    false
}

/// Encodes a 33-bit PTS in a PES header's 5 bytes with the given 4-bit prefix ('0010' for a
/// lone PTS): for tests and synthetic streams.
pub fn encode_pts(prefix: u8, pts: u64) -> [u8; 5] {
    let pts = pts % PTS_MODULUS;
    [
        (prefix << 4) | (((pts >> 30) as u8 & 0x07) << 1) | 1,
        (pts >> 22) as u8,
        (((pts >> 15) as u8) << 1) | 1,
        (pts >> 7) as u8,
        ((pts as u8) << 1) | 1,
    ]
}
