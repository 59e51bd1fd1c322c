//! What a multivariant playlist says of a rendition, read from its streams: the picture size
//! and the `CODECS` string of H.264 from its sequence parameter set (ITU-T H.264 §7.3.2.1.1,
//! RFC 6381 §3.3 for `avc1.PPCCLL`) and of H.265 from its own (ITU-T H.265 §7.3.2.2, ISO/IEC
//! 14496-15 Annex E for `hvc1.…`), and the AAC object type from an ADTS header (ISO/IEC
//! 13818-7 §6.2, `mp4a.40.OT`). Any bytes give a value or an error, never a panic; what cannot
//! be read is left out rather than guessed ([`stream_info`]).

use super::ts_index::{TsIndex, VideoCodec};

/// Why a parameter set or header could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MediaError {
    #[error("truncated")]
    Truncated,
    #[error("not an H.264 sequence parameter set (NAL type {0})")]
    NotSps(u8),
    #[error("invalid {0}")]
    Invalid(&'static str),
    #[error("no ADTS sync word")]
    NoAdtsSync,
}

/// What an H.264 SPS says of the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct H264Sps {
    pub profile_idc: u8,
    /// constraint_set0..5 flags and the two reserved bits, as the byte carries them.
    pub constraint_flags: u8,
    pub level_idc: u8,
    /// The picture size after the SPS's cropping, in luma samples.
    pub width: u32,
    pub height: u32,
}

impl H264Sps {
    /// RFC 6381's `avc1.PPCCLL`: profile_idc, the constraint byte and level_idc in hex.
    pub fn codecs(&self) -> String {
        format!(
            "avc1.{:02x}{:02x}{:02x}",
            self.profile_idc, self.constraint_flags, self.level_idc
        )
    }
}

/// Reads RBSP bits (emulation prevention bytes already removed).
struct Bits<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Bits<'_> {
    fn bit(&mut self) -> Result<u32, MediaError> {
        let b = *self.bytes.get(self.pos / 8).ok_or(MediaError::Truncated)?;
        let v = (b >> (7 - self.pos % 8)) & 1;
        self.pos += 1;
        Ok(u32::from(v))
    }

    fn bits(&mut self, n: u32) -> Result<u32, MediaError> {
        let mut v = 0u32;
        for _ in 0..n {
            v = (v << 1) | self.bit()?;
        }
        Ok(v)
    }

    /// ue(v): Exp-Golomb, at most 31 leading zeros (a 32-bit value).
    fn ue(&mut self) -> Result<u32, MediaError> {
        let mut zeros = 0u32;
        while self.bit()? == 0 {
            zeros += 1;
            if zeros > 31 {
                return Err(MediaError::Invalid("Exp-Golomb code"));
            }
        }
        let rest = self.bits(zeros)?;
        Ok(((1u64 << zeros) - 1 + u64::from(rest)).min(u64::from(u32::MAX)) as u32)
    }

    /// se(v).
    fn se(&mut self) -> Result<i64, MediaError> {
        let k = i64::from(self.ue()?);
        Ok(if k % 2 == 1 { (k + 1) / 2 } else { -(k / 2) })
    }
}

/// The RBSP of a NAL unit's payload: every `00 00 03` becomes `00 00`.
fn rbsp(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len());
    let mut zeros = 0;
    for &b in payload {
        if zeros >= 2 && b == 3 {
            zeros = 0;
            continue;
        }
        zeros = if b == 0 { zeros + 1 } else { 0 };
        out.push(b);
    }
    out
}

/// Skips a scaling_list() of `size` entries (§7.3.2.1.1.1).
fn skip_scaling_list(r: &mut Bits<'_>, size: usize) -> Result<(), MediaError> {
    let (mut last, mut next) = (8i64, 8i64);
    for _ in 0..size {
        if next != 0 {
            let delta = r.se()?;
            if !(-128..=127).contains(&delta) {
                return Err(MediaError::Invalid("scaling list delta"));
            }
            next = (last + delta + 256) % 256;
        }
        if next != 0 {
            last = next;
        }
    }
    Ok(())
}

/// Parses an H.264 SPS NAL unit (its header byte first, emulation prevention bytes as in the
/// stream) as far as the picture size and cropping.
pub fn parse_h264_sps(nal: &[u8]) -> Result<H264Sps, MediaError> {
    let (&header, payload) = nal.split_first().ok_or(MediaError::Truncated)?;
    if header & 0x80 != 0 {
        return Err(MediaError::Invalid("NAL forbidden_zero_bit"));
    }
    if header & 0x1f != 7 {
        return Err(MediaError::NotSps(header & 0x1f));
    }
    let bytes = rbsp(payload);
    let mut r = Bits {
        bytes: &bytes,
        pos: 0,
    };
    let profile_idc = r.bits(8)? as u8;
    let constraint_flags = r.bits(8)? as u8;
    let level_idc = r.bits(8)? as u8;
    if r.ue()? > 31 {
        return Err(MediaError::Invalid("seq_parameter_set_id"));
    }
    let mut chroma_format_idc = 1;
    let mut separate_colour_plane = false;
    if matches!(
        profile_idc,
        100 | 110 | 122 | 244 | 44 | 83 | 86 | 118 | 128 | 138 | 139 | 134 | 135
    ) {
        chroma_format_idc = r.ue()?;
        if chroma_format_idc > 3 {
            return Err(MediaError::Invalid("chroma_format_idc"));
        }
        if chroma_format_idc == 3 {
            separate_colour_plane = r.bit()? == 1;
        }
        if r.ue()? > 6 || r.ue()? > 6 {
            return Err(MediaError::Invalid("bit depth"));
        }
        r.bit()?; // qpprime_y_zero_transform_bypass_flag
        if r.bit()? == 1 {
            let lists = if chroma_format_idc == 3 { 12 } else { 8 };
            for i in 0..lists {
                if r.bit()? == 1 {
                    skip_scaling_list(&mut r, if i < 6 { 16 } else { 64 })?;
                }
            }
        }
    }
    if r.ue()? > 12 {
        return Err(MediaError::Invalid("log2_max_frame_num_minus4"));
    }
    match r.ue()? {
        0 => {
            if r.ue()? > 12 {
                return Err(MediaError::Invalid("log2_max_pic_order_cnt_lsb_minus4"));
            }
        }
        1 => {
            r.bit()?;
            r.se()?;
            r.se()?;
            let cycle = r.ue()?;
            if cycle > 255 {
                return Err(MediaError::Invalid("num_ref_frames_in_pic_order_cnt_cycle"));
            }
            for _ in 0..cycle {
                r.se()?;
            }
        }
        2 => {}
        _ => return Err(MediaError::Invalid("pic_order_cnt_type")),
    }
    r.ue()?; // max_num_ref_frames
    r.bit()?; // gaps_in_frame_num_value_allowed_flag
    let width_mbs = u64::from(r.ue()?) + 1;
    let height_map_units = u64::from(r.ue()?) + 1;
    let frame_mbs_only = u64::from(r.bit()?);
    if frame_mbs_only == 0 {
        r.bit()?; // mb_adaptive_frame_field_flag
    }
    r.bit()?; // direct_8x8_inference_flag
    let (mut left, mut right, mut top, mut bottom) = (0u64, 0u64, 0u64, 0u64);
    if r.bit()? == 1 {
        left = r.ue()?.into();
        right = r.ue()?.into();
        top = r.ue()?.into();
        bottom = r.ue()?.into();
    }
    let chroma_array_type = if separate_colour_plane {
        0
    } else {
        chroma_format_idc
    };
    let (crop_x, crop_y) = match chroma_array_type {
        0 => (1, 2 - frame_mbs_only),
        1 => (2, 2 * (2 - frame_mbs_only)),
        2 => (2, 2 - frame_mbs_only),
        _ => (1, 2 - frame_mbs_only),
    };
    let width = (width_mbs * 16)
        .checked_sub(crop_x * (left + right))
        .filter(|&w| w > 0)
        .ok_or(MediaError::Invalid("cropping"))?;
    let height = ((2 - frame_mbs_only) * height_map_units * 16)
        .checked_sub(crop_y * (top + bottom))
        .filter(|&h| h > 0)
        .ok_or(MediaError::Invalid("cropping"))?;
    Ok(H264Sps {
        profile_idc,
        constraint_flags,
        level_idc,
        width: u32::try_from(width).map_err(|_| MediaError::Invalid("width"))?,
        height: u32::try_from(height).map_err(|_| MediaError::Invalid("height"))?,
    })
}

/// What an H.265 SPS says of the stream: the general profile, tier and level and the picture
/// size after the conformance window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct H265Sps {
    pub profile_space: u8,
    pub tier: bool,
    pub profile_idc: u8,
    pub compatibility_flags: u32,
    /// The 48 bits after the compatibility flags (progressive, interlaced, non-packed,
    /// frame-only and the rest), as six bytes.
    pub constraint_flags: [u8; 6],
    pub level_idc: u8,
    pub width: u32,
    pub height: u32,
}

impl H265Sps {
    /// ISO/IEC 14496-15 E.3's `hvc1.[A-C]P.C.TL.B…`: profile space (none, A, B, C) and
    /// profile_idc; the compatibility flags bit-reversed, in hex; tier (L or H) and level_idc;
    /// the constraint bytes in hex, trailing zero bytes left out. `hvc1` as Apple's HLS
    /// authoring rules ask of HEVC.
    pub fn codecs(&self) -> String {
        let space = ["", "A", "B", "C"][usize::from(self.profile_space & 3)];
        let mut c = format!(
            "hvc1.{space}{}.{:X}.{}{}",
            self.profile_idc,
            self.compatibility_flags.reverse_bits(),
            if self.tier { 'H' } else { 'L' },
            self.level_idc
        );
        let used = self
            .constraint_flags
            .iter()
            .rposition(|&b| b != 0)
            .map_or(0, |i| i + 1);
        for b in &self.constraint_flags[..used] {
            c.push_str(&format!(".{b:X}"));
        }
        c
    }
}

/// Parses an H.265 SPS NAL unit (its two header bytes first, emulation prevention bytes as in
/// the stream) as far as the picture size and conformance window.
pub fn parse_h265_sps(nal: &[u8]) -> Result<H265Sps, MediaError> {
    let header = nal.get(..2).ok_or(MediaError::Truncated)?;
    if header[0] & 0x80 != 0 {
        return Err(MediaError::Invalid("NAL forbidden_zero_bit"));
    }
    let nal_type = (header[0] >> 1) & 0x3f;
    if nal_type != 33 {
        return Err(MediaError::NotSps(nal_type));
    }
    let bytes = rbsp(&nal[2..]);
    let mut r = Bits {
        bytes: &bytes,
        pos: 0,
    };
    r.bits(4)?; // sps_video_parameter_set_id
    let sub_layers = r.bits(3)?; // sps_max_sub_layers_minus1
    if sub_layers > 6 {
        return Err(MediaError::Invalid("sps_max_sub_layers_minus1"));
    }
    r.bit()?; // sps_temporal_id_nesting_flag
    // profile_tier_level(1, sps_max_sub_layers_minus1)
    let profile_space = r.bits(2)? as u8;
    let tier = r.bit()? == 1;
    let profile_idc = r.bits(5)? as u8;
    let compatibility_flags = r.bits(32)?;
    let mut constraint_flags = [0u8; 6];
    for b in &mut constraint_flags {
        *b = r.bits(8)? as u8;
    }
    let level_idc = r.bits(8)? as u8;
    let mut present = Vec::with_capacity(sub_layers as usize);
    for _ in 0..sub_layers {
        present.push((r.bit()? == 1, r.bit()? == 1));
    }
    if sub_layers > 0 {
        for _ in sub_layers..8 {
            r.bits(2)?;
        }
    }
    for (profile, level) in present {
        if profile {
            r.bits(32)?;
            r.bits(32)?;
            r.bits(24)?;
        }
        if level {
            r.bits(8)?;
        }
    }
    if r.ue()? > 15 {
        return Err(MediaError::Invalid("sps_seq_parameter_set_id"));
    }
    let chroma_format_idc = r.ue()?;
    if chroma_format_idc > 3 {
        return Err(MediaError::Invalid("chroma_format_idc"));
    }
    let separate_colour_plane = chroma_format_idc == 3 && r.bit()? == 1;
    let width = u64::from(r.ue()?);
    let height = u64::from(r.ue()?);
    let (mut left, mut right, mut top, mut bottom) = (0u64, 0u64, 0u64, 0u64);
    if r.bit()? == 1 {
        left = r.ue()?.into();
        right = r.ue()?.into();
        top = r.ue()?.into();
        bottom = r.ue()?.into();
    }
    let (sub_w, sub_h) = match (separate_colour_plane, chroma_format_idc) {
        (false, 1) => (2, 2),
        (false, 2) => (2, 1),
        _ => (1, 1),
    };
    let width = width
        .checked_sub(sub_w * (left + right))
        .filter(|&w| w > 0)
        .ok_or(MediaError::Invalid("conformance window"))?;
    let height = height
        .checked_sub(sub_h * (top + bottom))
        .filter(|&h| h > 0)
        .ok_or(MediaError::Invalid("conformance window"))?;
    Ok(H265Sps {
        profile_space,
        tier,
        profile_idc,
        compatibility_flags,
        constraint_flags,
        level_idc,
        width: u32::try_from(width).map_err(|_| MediaError::Invalid("width"))?,
        height: u32::try_from(height).map_err(|_| MediaError::Invalid("height"))?,
    })
}

/// The bytes of an ADTS header penstock keeps (the fixed header and the frame length).
pub const ADTS_HEADER_BYTES: usize = 7;

/// What an ADTS header says of an AAC stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Adts {
    /// The MPEG-4 audio object type: the header's profile + 1 (2 is AAC LC).
    pub object_type: u8,
    pub sampling_frequency_index: u8,
    pub channel_configuration: u8,
    /// The frame's length, this header included.
    pub frame_length: u16,
}

impl Adts {
    /// RFC 6381's `mp4a.40.OT`.
    pub fn codecs(&self) -> String {
        format!("mp4a.40.{}", self.object_type)
    }
}

/// Parses an ADTS header at the start of `b`.
pub fn parse_adts(b: &[u8]) -> Result<Adts, MediaError> {
    let h = b.get(..ADTS_HEADER_BYTES).ok_or(MediaError::Truncated)?;
    if h[0] != 0xff || h[1] & 0xf0 != 0xf0 {
        return Err(MediaError::NoAdtsSync);
    }
    if h[1] & 0x06 != 0 {
        return Err(MediaError::Invalid("ADTS layer"));
    }
    let sampling_frequency_index = (h[2] >> 2) & 0x0f;
    if sampling_frequency_index > 12 {
        return Err(MediaError::Invalid("ADTS sampling frequency index"));
    }
    let frame_length =
        (u16::from(h[3] & 0x03) << 11) | (u16::from(h[4]) << 3) | u16::from(h[5] >> 5);
    if usize::from(frame_length) < ADTS_HEADER_BYTES {
        return Err(MediaError::Invalid("ADTS frame length"));
    }
    Ok(Adts {
        object_type: (h[2] >> 6) + 1,
        sampling_frequency_index,
        channel_configuration: ((h[2] & 0x01) << 2) | (h[3] >> 6),
        frame_length,
    })
}

/// The offset in `es` (the start of an audio PES) of the first ADTS header: at the start, or
/// further on only where the next frame's header follows it (a sync word inside audio data
/// is not taken for a header).
pub fn find_adts(es: &[u8]) -> Option<usize> {
    (0..es.len().saturating_sub(ADTS_HEADER_BYTES - 1)).find(|&i| match parse_adts(&es[i..]) {
        Ok(_) if i == 0 => true,
        Ok(h) => es
            .get(i + usize::from(h.frame_length)..)
            .is_some_and(|next| parse_adts(next).is_ok()),
        Err(_) => false,
    })
}

/// Stream types of audio in a PMT that penstock names (ISO/IEC 13818-1 table 2-34, ATSC A/52
/// for AC-3 and E-AC-3).
pub fn is_audio_stream_type(t: u8) -> bool {
    matches!(t, 0x03 | 0x04 | 0x0f | 0x11 | 0x81 | 0x87)
}

/// What a multivariant playlist can say of a rendition's streams.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StreamInfo {
    /// Width and height of the video, when its SPS was read.
    pub resolution: Option<(u32, u32)>,
    /// `CODECS`: every stream named, or `None` when one of them could not be (a partial list
    /// would tell a player the title has no such stream).
    pub codecs: Option<String>,
}

/// The [`StreamInfo`] of an indexed file: H.264's and H.265's SPS and AAC's ADTS header read;
/// MP3, AC-3 and E-AC-3 named by their stream type alone; anything else (MPEG-2 video, LATM,
/// an SPS or header that did not parse) left out.
pub fn stream_info(index: &TsIndex) -> StreamInfo {
    let sps = match (index.codec, &index.sps) {
        (VideoCodec::H264, Some(nal)) => parse_h264_sps(nal)
            .ok()
            .map(|s| (s.codecs(), (s.width, s.height))),
        (VideoCodec::H265, Some(nal)) => parse_h265_sps(nal)
            .ok()
            .map(|s| (s.codecs(), (s.width, s.height))),
        _ => None,
    };
    let (video, resolution) = match sps {
        Some((c, r)) => (Some(c), Some(r)),
        None => (None, None),
    };
    let audio = match &index.audio {
        None => Some(None),
        Some(a) => match a.stream_type {
            0x0f => a
                .adts
                .as_ref()
                .and_then(|h| parse_adts(h).ok())
                .map(|h| Some(h.codecs())),
            0x03 | 0x04 => Some(Some("mp4a.40.34".to_string())),
            0x81 => Some(Some("ac-3".to_string())),
            0x87 => Some(Some("ec-3".to_string())),
            _ => None,
        },
    };
    let codecs = match (video, audio) {
        (Some(v), Some(None)) => Some(v),
        (Some(v), Some(Some(a))) => Some(format!("{v},{a}")),
        _ => None,
    };
    StreamInfo { resolution, codecs }
}
