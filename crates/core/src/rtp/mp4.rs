//! RTP of an MP4's tracks (issue 36 item 3): each access unit (an MP4 sample) cut into RTP
//! payloads — H.264 by RFC 6184, H.265 by RFC 7798, AAC by RFC 3640 (AAC-hbr) — and the SDP
//! that describes the tracks (rtpmap, fmtp from the sample descriptions, one `m=` and
//! `a=control:trackID=N` per track).
//!
//! **Packets as pieces of the sample.** [`packetize`] does not copy the sample: each packet
//! is a [`Piece`] — at most four bytes of payload-format header (an FU indicator and header,
//! an AU-header section) and a byte range of the sample. The sender writes the 12-byte RTP
//! header, the piece's prefix and then the sample's range: the payload can go from the file's
//! bytes as an iovec without being copied into a packet buffer.
//!
//! **H.264 / H.265.** An MP4 sample is NAL units each after a big-endian length of
//! `length_size` bytes (the avcC's / hvcC's `lengthSizeMinusOne + 1`); RTP carries NAL units
//! without a length or a start code. A NAL unit that fits the payload budget goes alone
//! (single NAL unit packet); a larger one is cut into fragmentation units (FU-A, type 28; for
//! H.265 FU, type 49). For H.264, consecutive NAL units that fit the budget together — the
//! SEI, AUD or in-band SPS/PPS before an IDR slice — go as one **STAP-A** (type 24, RFC 6184
//! §5.7.1: a header with the largest NRI and any F bit, then each unit after its 16-bit
//! size); one unit alone goes as a single NAL unit packet. The marker bit is set on the last
//! packet of the access unit.
//!
//! A STAP-A is several pieces, one per unit, each with its 16-bit size in its prefix (the
//! first also with the STAP-A header) and `joined` set on all but the last: [`packets`]
//! groups the pieces of one RTP payload.
//!
//! **AAC (RFC 3640 AAC-hbr).** One AU (one MP4 sample) per packet: a 16-bit AU-headers-length
//! (16 bits: one header), a 13-bit AU size and a 3-bit index (0), then the AU. An AU larger
//! than the budget is fragmented (§3.2.3: each fragment repeats the AU header with the whole
//! AU's size; the marker bit on the last fragment only); otherwise every packet has the marker.
//!
//! **Time.** RTP timestamps are presentation times (decode time + composition offset, less
//! the edit list's media time) at the payload's clock: 90 kHz for video, the sample rate for
//! AAC ([`TrackRtp::clock_hz`]), from the track's own timescale.

use std::fmt::Write as _;
use std::ops::Range;

use base64::Engine as _;

use crate::mp4::{Codec, Track};

/// The dynamic payload type of the first track (96, then 97, …).
pub const PAYLOAD_TYPE_DYNAMIC_FIRST: u8 = 96;
/// H.264's NAL unit type of a single-time aggregation packet A (RFC 6184 §5.7.1).
const H264_STAP_A: u8 = 24;
/// H.264's NAL unit type of a fragmentation unit A (RFC 6184 §5.8).
const H264_FU_A: u8 = 28;
/// H.265's NAL unit type of a fragmentation unit (RFC 7798 §4.4.3).
const H265_FU: u8 = 49;
/// The largest AU size a 13-bit AU-size field holds.
pub const AAC_AU_BYTES_MAX: usize = (1 << 13) - 1;

/// How a track's samples become RTP payloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadFormat {
    /// RFC 6184, packetization-mode 1 (single NAL unit and FU-A packets).
    H264 { length_size: u8 },
    /// RFC 7798 (single NAL unit and FU packets).
    H265 { length_size: u8 },
    /// RFC 3640 `mode=AAC-hbr` (13-bit size, 3-bit index).
    AacHbr,
}

/// One RTP payload, or (`joined`) a part of one: `prefix[..prefix_len]` then the sample's
/// bytes `range`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub prefix: [u8; 4],
    pub prefix_len: u8,
    pub range: Range<usize>,
    pub marker: bool,
    /// The next piece belongs to the same RTP payload (the units of a STAP-A).
    pub joined: bool,
}

/// The pieces of each RTP payload, in order (a run of `joined` pieces and the one after it).
pub fn packets(pieces: &[Piece]) -> impl Iterator<Item = &[Piece]> {
    pieces.split_inclusive(|p| !p.joined)
}

impl Piece {
    pub fn prefix(&self) -> &[u8] {
        &self.prefix[..usize::from(self.prefix_len)]
    }

    /// Bytes of the RTP payload.
    pub fn payload_len(&self) -> usize {
        usize::from(self.prefix_len) + self.range.len()
    }
}

/// Why a sample cannot be cut into RTP payloads (the sample is skipped, the stream goes on).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PacketizeError {
    #[error("NAL unit length at byte {at} runs past the sample's {len} bytes")]
    NalOverrun { at: usize, len: usize },
    #[error("empty or header-only NAL unit at byte {0}")]
    ShortNal(usize),
    #[error("AAC access unit of {0} bytes, more than the 13-bit AU size holds")]
    AuTooLarge(usize),
    #[error("payload budget of {0} bytes is too small")]
    Budget(usize),
}

impl PayloadFormat {
    /// The payload format of a track's codec.
    pub fn of(codec: &Codec) -> PayloadFormat {
        match codec {
            Codec::Avc { config } => PayloadFormat::H264 {
                length_size: config.get(4).map_or(4, |b| (b & 3) + 1),
            },
            Codec::Hevc { config } => PayloadFormat::H265 {
                length_size: config.get(21).map_or(4, |b| (b & 3) + 1),
            },
            Codec::Aac { .. } => PayloadFormat::AacHbr,
        }
    }
}

/// Cuts one sample into RTP payloads of at most `payload_max` bytes each (appended to
/// `out`, which is cleared first). On error `out` is left empty.
pub fn packetize(
    format: PayloadFormat,
    sample: &[u8],
    payload_max: usize,
    out: &mut Vec<Piece>,
) -> Result<(), PacketizeError> {
    out.clear();
    let r = match format {
        PayloadFormat::H264 { length_size } => nals(sample, length_size, payload_max, 1, out),
        PayloadFormat::H265 { length_size } => nals(sample, length_size, payload_max, 2, out),
        PayloadFormat::AacHbr => aac(sample, payload_max, out),
    };
    if r.is_err() {
        out.clear();
    }
    r
}

fn nals(
    sample: &[u8],
    length_size: u8,
    payload_max: usize,
    header_len: usize,
    out: &mut Vec<Piece>,
) -> Result<(), PacketizeError> {
    // An FU carries at least one byte of the NAL unit after its headers.
    let fu_header_len = header_len + 1;
    if payload_max <= fu_header_len {
        return Err(PacketizeError::Budget(payload_max));
    }
    let ls = usize::from(length_size.clamp(1, 4));
    // The NAL units' byte ranges, checked before anything is cut.
    let mut units: Vec<Range<usize>> = Vec::new();
    let mut at = 0usize;
    while at < sample.len() {
        let len_bytes = sample.get(at..at + ls).ok_or(PacketizeError::NalOverrun {
            at,
            len: sample.len(),
        })?;
        let n = len_bytes
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        let start = at + ls;
        let end = start.checked_add(n).filter(|&e| e <= sample.len()).ok_or(
            PacketizeError::NalOverrun {
                at,
                len: sample.len(),
            },
        )?;
        if n == 0 {
            // A zero-length entry carries nothing (some muxers pad with them).
            at = end;
            continue;
        }
        if n <= header_len {
            return Err(PacketizeError::ShortNal(at));
        }
        units.push(start..end);
        at = end;
    }
    let mut u = 0usize;
    while u < units.len() {
        let (start, end) = (units[u].start, units[u].end);
        let n = end - start;
        if n <= payload_max {
            // H.264: the units after it that fit one STAP-A with it (1 header byte, then a
            // 16-bit size before each unit).
            let mut group = 1usize;
            if header_len == 1 {
                let mut bytes = 1 + 2 + n;
                while let Some(next) = units.get(u + group) {
                    if bytes + 2 + next.len() > payload_max
                        || n > usize::from(u16::MAX)
                        || next.len() > usize::from(u16::MAX)
                    {
                        break;
                    }
                    bytes += 2 + next.len();
                    group += 1;
                }
            }
            if group == 1 {
                out.push(Piece {
                    prefix: [0; 4],
                    prefix_len: 0,
                    range: start..end,
                    marker: false,
                    joined: false,
                });
            } else {
                let members = &units[u..u + group];
                let f = members
                    .iter()
                    .fold(0u8, |a, r| a | (sample[r.start] & 0x80));
                let nri = members
                    .iter()
                    .map(|r| sample[r.start] & 0x60)
                    .max()
                    .unwrap_or(0);
                for (j, r) in members.iter().enumerate() {
                    let size = (r.len() as u16).to_be_bytes();
                    let (prefix, prefix_len) = if j == 0 {
                        ([f | nri | H264_STAP_A, size[0], size[1], 0], 3)
                    } else {
                        ([size[0], size[1], 0, 0], 2)
                    };
                    out.push(Piece {
                        prefix,
                        prefix_len,
                        range: r.clone(),
                        marker: false,
                        joined: j + 1 < group,
                    });
                }
            }
            u += group;
            continue;
        }
        u += 1;
        {
            let nal = &sample[start..end];
            let mut prefix = [0u8; 4];
            let typ;
            if header_len == 1 {
                // FU indicator: F and NRI of the NAL unit, type 28; FU header: its type.
                prefix[0] = (nal[0] & 0xe0) | H264_FU_A;
                typ = nal[0] & 0x1f;
            } else {
                // PayloadHdr: the NAL unit's F, LayerId and TID with type 49; FU header: its
                // type (6 bits).
                prefix[0] = (nal[0] & 0x81) | (H265_FU << 1);
                prefix[1] = nal[1];
                typ = (nal[0] >> 1) & 0x3f;
            }
            let chunk = payload_max - fu_header_len;
            let mut p = start + header_len;
            while p < end {
                let q = (p + chunk).min(end);
                let mut pre = prefix;
                let s_bit = if p == start + header_len { 0x80 } else { 0 };
                let e_bit = if q == end { 0x40 } else { 0 };
                pre[header_len] = s_bit | e_bit | typ;
                out.push(Piece {
                    prefix: pre,
                    prefix_len: fu_header_len as u8,
                    range: p..q,
                    marker: false,
                    joined: false,
                });
                p = q;
            }
        }
    }
    if let Some(last) = out.last_mut() {
        last.marker = true;
    }
    Ok(())
}

fn aac(sample: &[u8], payload_max: usize, out: &mut Vec<Piece>) -> Result<(), PacketizeError> {
    const HEADER: usize = 4;
    if payload_max <= HEADER {
        return Err(PacketizeError::Budget(payload_max));
    }
    if sample.len() > AAC_AU_BYTES_MAX {
        return Err(PacketizeError::AuTooLarge(sample.len()));
    }
    // AU-headers-length 16 (bits), then AU-size (13 bits) << 3 | AU-Index 0.
    let size = (sample.len() as u16) << 3;
    let prefix = [0x00, 0x10, (size >> 8) as u8, size as u8];
    let chunk = payload_max - HEADER;
    let mut p = 0;
    loop {
        let q = (p + chunk).min(sample.len());
        out.push(Piece {
            prefix,
            prefix_len: HEADER as u8,
            range: p..q,
            marker: q == sample.len(),
            joined: false,
        });
        if q == sample.len() {
            return Ok(());
        }
        p = q;
    }
}

/// A track's RTP clock and payload type, and how its times map to RTP timestamps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrackRtp {
    pub format: PayloadFormat,
    pub payload_type: u8,
    /// 90 kHz for video, the sample rate for AAC.
    pub clock_hz: u32,
    /// The track's timescale (its sample times' unit).
    pub timescale: u32,
    /// The edit list's media time (track timescale): presentation 0 is this media time.
    pub media_time: u64,
}

impl TrackRtp {
    /// The RTP description of `track`, the `index`-th in the SDP.
    pub fn of(track: &Track, index: usize) -> TrackRtp {
        let clock_hz = match &track.codec {
            Codec::Aac { sample_rate, .. } if *sample_rate > 0 => *sample_rate,
            Codec::Aac { .. } => track.timescale.max(1),
            _ => 90_000,
        };
        TrackRtp {
            format: PayloadFormat::of(&track.codec),
            payload_type: PAYLOAD_TYPE_DYNAMIC_FIRST.saturating_add(index as u8),
            clock_hz,
            timescale: track.timescale.max(1),
            media_time: track.edit.media_time,
        }
    }

    /// A presentation time (track timescale, before the edit list) in ns since presentation
    /// 0 (negative before it: B-frame reordering before the edit's start).
    pub fn presentation_ns(&self, track_ticks: i64) -> i64 {
        let t = i128::from(track_ticks) - i128::from(self.media_time);
        (t * 1_000_000_000 / i128::from(self.timescale)) as i64
    }

    /// RTP clock ticks of `ns` of presentation time (may be negative; RTP time wraps).
    pub fn rtp_ticks(&self, ns: i64) -> i64 {
        (i128::from(ns) * i128::from(self.clock_hz)).div_euclid(1_000_000_000) as i64
    }

    /// The RTP timestamp of a sample presented `track_ticks` (track timescale, before the
    /// edit list), for a track whose presentation 0 has RTP time `base`.
    pub fn timestamp(&self, base: u32, track_ticks: i64) -> u32 {
        let t = i128::from(track_ticks) - i128::from(self.media_time);
        let ticks = (t * i128::from(self.clock_hz)).div_euclid(i128::from(self.timescale));
        base.wrapping_add(ticks as u32)
    }
}

/// Hex of bytes, lower case.
fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

/// The SPS and PPS in an avcC (AVCDecoderConfigurationRecord), in order.
pub fn avcc_parameter_sets(avcc: &[u8]) -> Vec<&[u8]> {
    let mut sets = Vec::new();
    let Some(&n_sps) = avcc.get(5) else {
        return sets;
    };
    let mut at = 6usize;
    // SPS count, then (after them) the PPS count.
    let mut left = usize::from(n_sps & 0x1f);
    let mut in_pps = false;
    loop {
        if left == 0 {
            if in_pps {
                return sets;
            }
            let Some(&n_pps) = avcc.get(at) else {
                return sets;
            };
            at += 1;
            left = usize::from(n_pps);
            in_pps = true;
            continue;
        }
        let Some(l) = avcc
            .get(at..at + 2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
        else {
            return sets;
        };
        let Some(set) = avcc.get(at + 2..at + 2 + l) else {
            return sets;
        };
        sets.push(set);
        at += 2 + l;
        left -= 1;
    }
}

/// The parameter sets of an hvcC by NAL unit type (32 VPS, 33 SPS, 34 PPS; others too).
pub fn hvcc_parameter_sets(hvcc: &[u8]) -> Vec<(u8, &[u8])> {
    let mut sets = Vec::new();
    let Some(&arrays) = hvcc.get(22) else {
        return sets;
    };
    let mut at = 23usize;
    for _ in 0..arrays {
        let (Some(&t), Some(n)) = (
            hvcc.get(at),
            hvcc.get(at + 1..at + 3)
                .map(|b| u16::from_be_bytes([b[0], b[1]])),
        ) else {
            return sets;
        };
        at += 3;
        for _ in 0..n {
            let Some(l) = hvcc
                .get(at..at + 2)
                .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
            else {
                return sets;
            };
            let Some(set) = hvcc.get(at + 2..at + 2 + l) else {
                return sets;
            };
            sets.push((t & 0x3f, set));
            at += 2 + l;
        }
    }
    sets
}

/// The `a=rtpmap` and `a=fmtp` values of a track (without the `a=` names).
pub fn sdp_attributes(track: &Track, rtp: &TrackRtp) -> (String, String) {
    let pt = rtp.payload_type;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    match &track.codec {
        Codec::Avc { config } => {
            let sets = avcc_parameter_sets(config);
            let sprop: Vec<String> = sets.iter().map(|s| b64(s)).collect();
            let mut fmtp = format!("{pt} packetization-mode=1");
            if let Some(pli) = config.get(1..4) {
                let _ = write!(fmtp, ";profile-level-id={}", hex(pli));
            }
            if !sprop.is_empty() {
                let _ = write!(fmtp, ";sprop-parameter-sets={}", sprop.join(","));
            }
            (format!("{pt} H264/{}", rtp.clock_hz), fmtp)
        }
        Codec::Hevc { config } => {
            let sets = hvcc_parameter_sets(config);
            let mut fmtp = format!("{pt} ");
            let mut parts = Vec::new();
            for (t, name) in [(32u8, "sprop-vps"), (33, "sprop-sps"), (34, "sprop-pps")] {
                let v: Vec<String> = sets
                    .iter()
                    .filter(|(x, _)| *x == t)
                    .map(|(_, s)| b64(s))
                    .collect();
                if !v.is_empty() {
                    parts.push(format!("{name}={}", v.join(",")));
                }
            }
            fmtp.push_str(&parts.join(";"));
            (format!("{pt} H265/{}", rtp.clock_hz), fmtp)
        }
        Codec::Aac { asc, channels, .. } => (
            format!(
                "{pt} MPEG4-GENERIC/{}/{}",
                rtp.clock_hz,
                asc_channels(asc).unwrap_or((*channels).max(1))
            ),
            format!(
                "{pt} streamtype=5;profile-level-id=1;mode=AAC-hbr;sizelength=13;indexlength=3;indexdeltalength=3;config={}",
                hex(asc)
            ),
        ),
    }
}

/// The channel configuration of an AudioSpecificConfig (ISO/IEC 14496-3 1.6.2.1), when it
/// names one (the `mp4a` box's channel count is often 2 whatever the stream is).
pub fn asc_channels(asc: &[u8]) -> Option<u16> {
    let bits = u16::from_be_bytes([*asc.first()?, *asc.get(1)?]);
    let aot = bits >> 11;
    let freq_index = (bits >> 7) & 0xf;
    if aot == 31 || freq_index == 15 {
        return None;
    }
    let ch = (bits >> 3) & 0xf;
    (1..=7)
        .contains(&ch)
        .then_some(if ch == 7 { 8 } else { ch })
}

/// The control suffix of track `id` (relative to the content base).
pub fn track_control(id: u32) -> String {
    format!("trackID={id}")
}

#[cfg(test)]
#[path = "mp4_tests.rs"]
mod tests;
