//! RTP frame-boundary detection (RFC 3550, RFC 6184 for H.264).
//!
//! For video the RTP marker bit marks the *last* packet of a frame (RFC 3550 §5.1, RFC 6184
//! §5.1), so the packet that begins a frame is the one *after* a marked packet; the detector
//! ([`super::FrameDetector`]) carries that one bit of state. The marker alone says "frame
//! boundary", not "independent frame": with the H.264 option the packet must also start an
//! IDR slice or an SPS (single NAL unit, first NAL of a STAP-A, or the start fragment of an
//! FU-A). Without it every frame boundary is recorded, and seeking may land on a dependent frame
//! (the decoder shows garbage until the next key frame) — the price of not knowing the codec.

/// The fields of an RTP header the detector needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtpHeader<'a> {
    pub marker: bool,
    pub payload_type: u8,
    pub sequence: u16,
    /// The payload after the fixed header, CSRCs and extension, without padding.
    pub payload: &'a [u8],
}

/// Parses an RTP version 2 packet; `None` when it is not one (too short, other version,
/// lengths that do not fit).
pub fn parse(datagram: &[u8]) -> Option<RtpHeader<'_>> {
    if datagram.len() < 12 || datagram[0] >> 6 != 2 {
        return None;
    }
    let padding = datagram[0] & 0x20 != 0;
    let extension = datagram[0] & 0x10 != 0;
    let csrc_count = usize::from(datagram[0] & 0x0f);
    let mut at = 12 + 4 * csrc_count;
    if extension {
        let ext = datagram.get(at..at + 4)?;
        at += 4 + 4 * usize::from(u16::from_be_bytes([ext[2], ext[3]]));
    }
    let mut end = datagram.len();
    if padding {
        let pad = usize::from(*datagram.last()?);
        end = end.checked_sub(pad)?;
    }
    let payload = datagram.get(at..end)?;
    Some(RtpHeader {
        marker: datagram[1] & 0x80 != 0,
        payload_type: datagram[1] & 0x7f,
        sequence: u16::from_be_bytes([datagram[2], datagram[3]]),
        payload,
    })
}

/// Whether an RTP H.264 payload (RFC 6184) starts with an IDR slice (5) or SPS (7).
pub fn h264_key_start(payload: &[u8]) -> bool {
    let Some(&first) = payload.first() else {
        return false;
    };
    match first & 0x1f {
        5 | 7 => true,
        // STAP-A: 16-bit size, NAL unit, ...; look at each aggregated NAL's type.
        24 => {
            let mut at = 1;
            while let Some(size) = payload.get(at..at + 2) {
                let size = usize::from(u16::from_be_bytes([size[0], size[1]]));
                match payload.get(at + 2).map(|h| h & 0x1f) {
                    Some(5 | 7) => return true,
                    Some(_) if size > 0 => at += 2 + size,
                    _ => return false,
                }
            }
            false
        }
        // FU-A: FU header with the start bit and the fragmented NAL's type.
        28 => payload
            .get(1)
            .is_some_and(|fu| fu & 0x80 != 0 && matches!(fu & 0x1f, 5 | 7)),
        _ => false,
    }
}
