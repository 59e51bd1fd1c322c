//! An MPEG-TS muxer (ISO/IEC 13818-1) for one program of H.264 video and AAC audio: what a
//! publisher's RTP becomes (RTSP RECORD, docs/rtsp.md "Publishing") before it joins the live
//! relay's path as if it had arrived as raw TS.
//!
//! - **PSI**: a PAT (program 1 on PID [`PMT_PID`]) and a PMT (H.264, stream type 0x1B, on
//!   [`VIDEO_PID`]; AAC in ADTS, 0x0F, on [`AUDIO_PID`]) before the first unit, before every
//!   key frame and at least every [`PSI_UNITS_MAX`] units: a reader joining anywhere finds
//!   them before the next key frame.
//! - **Video PES**: Annex B with an access unit delimiter first, the SPS and PPS before each
//!   IDR unless the unit carries them (the latest seen in band, else the SDP's), the
//!   unit's own AUDs dropped; PTS and DTS (`PTS_DTS_flags` 11 when they differ); the first
//!   TS packet carries the PCR and, on a key frame, `random_access_indicator`.
//! - **Audio PES**: one AAC frame behind a 7-byte ADTS header, PTS only; the PCR rides here
//!   when there is no video.
//! - **PCR** [`PCR_LEAD_90K`] below the DTS of the unit it travels with, so that every PTS and
//!   DTS is ahead of the clock; continuity counters per PID; packets end with
//!   adaptation-field stuffing, never with padding in the PES.
//!
//! Times are 90 kHz ticks, taken modulo 2^33 when written. Pure: units in, 188-byte packets
//! appended to a `Vec`.

use super::packet::{TS_PACKET_BYTES, TS_SYNC_BYTE, encode_pcr};
use super::psi::section_payload;

pub const PMT_PID: u16 = 0x1000;
pub const VIDEO_PID: u16 = 0x100;
pub const AUDIO_PID: u16 = 0x101;
/// H.264 video (ISO/IEC 13818-1 table 2-34).
pub const STREAM_TYPE_H264: u8 = 0x1b;
/// AAC with ADTS transport syntax.
pub const STREAM_TYPE_AAC_ADTS: u8 = 0x0f;
/// The PCR runs this far (90 kHz) behind the DTS of the unit that carries it: 100 ms.
pub const PCR_LEAD_90K: u64 = 9_000;
/// Units (video or audio) between two PAT/PMT pairs at most.
pub const PSI_UNITS_MAX: u32 = 50;
/// An ADTS frame's 13-bit length holds this much, header included.
pub const ADTS_FRAME_BYTES_MAX: usize = (1 << 13) - 1;
const ADTS_HEADER_BYTES: usize = 7;
/// An access unit delimiter (primary_pic_type 7: any slice type), with its start code.
const AUD: [u8; 6] = [0, 0, 0, 1, 0x09, 0xf0];
const START_CODE: [u8; 4] = [0, 0, 0, 1];
const TIME_MASK: u64 = (1 << 33) - 1;

/// The AAC track's ADTS fields (from its AudioSpecificConfig:
/// `rtp::announce::asc_adts_fields`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdtsConfig {
    /// The MPEG-4 audio object type (2: AAC LC); ADTS holds 1..=4.
    pub object_type: u8,
    pub frequency_index: u8,
    pub channels: u8,
}

/// What the program carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MuxConfig {
    /// An H.264 track, with the parameter sets known before the first unit (the SDP's).
    pub video: Option<Vec<Vec<u8>>>,
    pub audio: Option<AdtsConfig>,
}

/// Why a unit cannot be muxed (it is skipped; the stream goes on).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MuxError {
    #[error("the program has no {0} track")]
    NoTrack(&'static str),
    #[error("AAC frame of {0} bytes, more than an ADTS frame holds")]
    AudioTooLarge(usize),
    #[error("empty unit")]
    Empty,
    #[error("AudioSpecificConfig that ADTS cannot carry")]
    Adts,
}

/// The muxer's state: continuity counters, parameter sets, the PSI rhythm.
#[derive(Debug)]
pub struct TsMuxer {
    cfg: MuxConfig,
    /// The latest SPS and PPS (NAL units without start codes).
    sps: Vec<Vec<u8>>,
    pps: Vec<Vec<u8>>,
    cc_pat: u8,
    cc_pmt: u8,
    cc_video: u8,
    cc_audio: u8,
    units_since_psi: u32,
    pes: Vec<u8>,
}

impl TsMuxer {
    pub fn new(cfg: MuxConfig) -> Result<Self, MuxError> {
        if let Some(a) = cfg.audio
            && !((1..=4).contains(&a.object_type) && a.frequency_index < 13 && a.channels <= 7)
        {
            return Err(MuxError::Adts);
        }
        let mut m = TsMuxer {
            sps: Vec::new(),
            pps: Vec::new(),
            cc_pat: 0,
            cc_pmt: 0,
            cc_video: 0,
            cc_audio: 0,
            // The first unit is preceded by the PSI.
            units_since_psi: PSI_UNITS_MAX,
            pes: Vec::new(),
            cfg,
        };
        for set in m.cfg.video.clone().unwrap_or_default() {
            m.learn(&set);
        }
        Ok(m)
    }

    /// Keeps an SPS or PPS (by NAL unit type).
    fn learn(&mut self, nal: &[u8]) {
        let slot = match nal.first().map(|b| b & 0x1f) {
            Some(7) => &mut self.sps,
            Some(8) => &mut self.pps,
            _ => return,
        };
        if !slot.iter().any(|s| s == nal) {
            // One of each id in practice; a new one replaces the older ones.
            slot.clear();
            slot.push(nal.to_vec());
        }
    }

    /// The PCR's PID: the video's, else the audio's.
    fn pcr_pid(&self) -> u16 {
        if self.cfg.video.is_some() {
            VIDEO_PID
        } else {
            AUDIO_PID
        }
    }

    /// The PAT and PMT, two packets.
    pub fn psi(&mut self, out: &mut Vec<u8>) {
        let mut body = 1u16.to_be_bytes().to_vec();
        body.extend_from_slice(&(0xe000 | PMT_PID).to_be_bytes());
        let pat = section_payload(0x00, 1, &body, 184).expect("a one-program PAT fits");
        psi_packet(0, &mut self.cc_pat, &pat, out);
        let mut body = (0xe000 | self.pcr_pid()).to_be_bytes().to_vec();
        body.extend_from_slice(&[0xf0, 0x00]);
        if self.cfg.video.is_some() {
            body.extend_from_slice(&[STREAM_TYPE_H264, 0xe0 | (VIDEO_PID >> 8) as u8]);
            body.extend_from_slice(&[VIDEO_PID as u8, 0xf0, 0x00]);
        }
        if self.cfg.audio.is_some() {
            body.extend_from_slice(&[STREAM_TYPE_AAC_ADTS, 0xe0 | (AUDIO_PID >> 8) as u8]);
            body.extend_from_slice(&[AUDIO_PID as u8, 0xf0, 0x00]);
        }
        let pmt = section_payload(0x02, 1, &body, 184).expect("a two-stream PMT fits");
        psi_packet(PMT_PID, &mut self.cc_pmt, &pmt, out);
        self.units_since_psi = 0;
    }

    fn psi_due(&mut self, key: bool, out: &mut Vec<u8>) {
        if key || self.units_since_psi >= PSI_UNITS_MAX {
            self.psi(out);
        }
        self.units_since_psi += 1;
    }

    /// One H.264 access unit (NAL units without start codes), presented at `pts` and decoded
    /// at `dts` (90 kHz).
    pub fn video(
        &mut self,
        pts: u64,
        dts: u64,
        key: bool,
        nals: &[Vec<u8>],
        out: &mut Vec<u8>,
    ) -> Result<(), MuxError> {
        if self.cfg.video.is_none() {
            return Err(MuxError::NoTrack("video"));
        }
        if nals.iter().all(|n| n.is_empty() || n[0] & 0x1f == 9) {
            return Err(MuxError::Empty);
        }
        for n in nals {
            self.learn(n);
        }
        self.psi_due(key, out);
        let mut pes = std::mem::take(&mut self.pes);
        pes.clear();
        let both = dts != pts;
        pes_header(&mut pes, 0xe0, None, pts, both.then_some(dts));
        pes.extend_from_slice(&AUD);
        let has = |t: u8| {
            nals.iter()
                .any(|n| n.first().is_some_and(|b| b & 0x1f == t))
        };
        if key && !(has(7) && has(8)) {
            for set in self.sps.iter().chain(&self.pps) {
                pes.extend_from_slice(&START_CODE);
                pes.extend_from_slice(set);
            }
        }
        for n in nals {
            if n.is_empty() || n[0] & 0x1f == 9 {
                continue;
            }
            pes.extend_from_slice(&START_CODE);
            pes.extend_from_slice(n);
        }
        let pcr = (self.pcr_pid() == VIDEO_PID).then(|| pcr_of(dts));
        let mut cc = self.cc_video;
        write_pes(VIDEO_PID, &mut cc, &pes, pcr, key, out);
        self.cc_video = cc;
        self.pes = pes;
        Ok(())
    }

    /// One AAC frame (raw, no ADTS header), presented at `pts` (90 kHz).
    pub fn audio(&mut self, pts: u64, frame: &[u8], out: &mut Vec<u8>) -> Result<(), MuxError> {
        let Some(a) = self.cfg.audio else {
            return Err(MuxError::NoTrack("audio"));
        };
        if frame.is_empty() {
            return Err(MuxError::Empty);
        }
        let len = frame.len() + ADTS_HEADER_BYTES;
        if len > ADTS_FRAME_BYTES_MAX {
            return Err(MuxError::AudioTooLarge(frame.len()));
        }
        let audio_only = self.cfg.video.is_none();
        self.psi_due(false, out);
        let mut pes = std::mem::take(&mut self.pes);
        pes.clear();
        pes_header(&mut pes, 0xc0, Some(len), pts, None);
        pes.extend_from_slice(&adts_header(a, len));
        pes.extend_from_slice(frame);
        let pcr = audio_only.then(|| pcr_of(pts));
        let mut cc = self.cc_audio;
        // Every AAC frame can be decoded alone: a random access point when it is the only
        // track (the recorder's frame track and HLS cut there).
        write_pes(AUDIO_PID, &mut cc, &pes, pcr, audio_only, out);
        self.cc_audio = cc;
        self.pes = pes;
        Ok(())
    }
}

fn pcr_of(dts: u64) -> u64 {
    (dts.wrapping_sub(PCR_LEAD_90K) & TIME_MASK) * 300
}

/// The 7-byte ADTS header of a frame of `len` bytes (header included).
pub fn adts_header(a: AdtsConfig, len: usize) -> [u8; ADTS_HEADER_BYTES] {
    let profile = a.object_type - 1;
    let len = len as u16;
    [
        0xff,
        0xf1, // MPEG-4, layer 0, no CRC
        (profile << 6) | (a.frequency_index << 2) | (a.channels >> 2),
        ((a.channels & 3) << 6) | ((len >> 11) as u8 & 3),
        (len >> 3) as u8,
        ((len as u8 & 7) << 5) | 0x1f, // buffer fullness 0x7ff: variable rate
        0xfc,                          // … and one raw data block
    ]
}

/// A PES header: stream id, `PES_packet_length` (0: unbounded, for video), PTS and DTS.
fn pes_header(out: &mut Vec<u8>, stream_id: u8, es_len: Option<usize>, pts: u64, dts: Option<u64>) {
    let header_data = if dts.is_some() { 10 } else { 5 };
    let pes_len = es_len
        .map(|n| n + 3 + header_data)
        .filter(|&n| n <= usize::from(u16::MAX))
        .unwrap_or(0);
    out.extend_from_slice(&[0, 0, 1, stream_id]);
    out.extend_from_slice(&(pes_len as u16).to_be_bytes());
    out.push(0x80); // '10', not scrambled, no priority, no alignment flag, original
    out.push(if dts.is_some() { 0xc0 } else { 0x80 });
    out.push(header_data as u8);
    let prefix = if dts.is_some() { 0x3 } else { 0x2 };
    out.extend_from_slice(&timestamp(prefix, pts));
    if let Some(d) = dts {
        out.extend_from_slice(&timestamp(0x1, d));
    }
}

/// A 33-bit PTS or DTS in its 5 bytes with marker bits.
fn timestamp(prefix: u8, t: u64) -> [u8; 5] {
    let t = t & TIME_MASK;
    [
        (prefix << 4) | (((t >> 30) as u8 & 0x7) << 1) | 1,
        (t >> 22) as u8,
        (((t >> 15) as u8) << 1) | 1,
        (t >> 7) as u8,
        ((t as u8) << 1) | 1,
    ]
}

/// Reads a 5-byte PTS/DTS back (for tests and the fuzz target).
pub fn read_timestamp(b: &[u8]) -> Option<u64> {
    let b: &[u8; 5] = b.get(..5)?.try_into().ok()?;
    Some(
        (u64::from((b[0] >> 1) & 7) << 30)
            | (u64::from(b[1]) << 22)
            | (u64::from(b[2] >> 1) << 15)
            | (u64::from(b[3]) << 7)
            | u64::from(b[4] >> 1),
    )
}

fn header(pid: u16, pusi: bool, cc: &mut u8, adaptation: bool) -> [u8; 4] {
    let h = [
        TS_SYNC_BYTE,
        (u8::from(pusi) << 6) | ((pid >> 8) as u8 & 0x1f),
        pid as u8,
        (if adaptation { 0x30 } else { 0x10 }) | (*cc & 0xf),
    ];
    *cc = (*cc + 1) & 0xf;
    h
}

fn psi_packet(pid: u16, cc: &mut u8, payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&header(pid, true, cc, false));
    out.extend_from_slice(payload);
}

/// A PES cut into TS packets: the first carries `payload_unit_start_indicator`, the PCR and
/// the random access flag; the last is filled up with adaptation-field stuffing.
fn write_pes(pid: u16, cc: &mut u8, pes: &[u8], pcr: Option<u64>, rai: bool, out: &mut Vec<u8>) {
    let mut rest = pes;
    let mut first = true;
    while first || !rest.is_empty() {
        let mut af: Vec<u8> = Vec::new();
        if first && (pcr.is_some() || rai) {
            af.push((if rai { 0x40 } else { 0 }) | (if pcr.is_some() { 0x10 } else { 0 }));
            if let Some(p) = pcr {
                af.extend_from_slice(&encode_pcr(p));
            }
        }
        // Bytes of the adaptation field, its length byte included (0: none).
        let af_min = if af.is_empty() { 0 } else { 1 + af.len() };
        let room = TS_PACKET_BYTES - 4 - af_min;
        let take = rest.len().min(room);
        let af_total = TS_PACKET_BYTES - 4 - take;
        let start = out.len();
        out.extend_from_slice(&header(pid, first, cc, af_total > 0));
        if af_total > 0 {
            out.push((af_total - 1) as u8);
            if af_total > 1 {
                if af.is_empty() {
                    af.push(0);
                }
                out.extend_from_slice(&af);
                out.resize(start + 4 + af_total, 0xff);
            }
        }
        out.extend_from_slice(&rest[..take]);
        debug_assert_eq!(out.len() - start, TS_PACKET_BYTES);
        rest = &rest[take..];
        first = false;
    }
}

#[cfg(test)]
#[path = "mux_tests.rs"]
mod tests;
