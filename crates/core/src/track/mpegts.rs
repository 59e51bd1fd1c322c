//! MPEG-TS key-frame detection over one datagram (ISO/IEC 13818-1, H.264 Annex B).
//!
//! A datagram carries 1 to 7 TS packets of 188 bytes (7 × 188 = 1316 fits an Ethernet MTU).
//! It begins an independent frame when one of its TS packets does:
//! - the adaptation field's `random_access_indicator` is set (the encoder's own statement that
//!   decoding can start here; ffmpeg's muxer sets it on key frames), or
//! - with the H.264 scan on: the packet has `payload_unit_start_indicator`, its payload is a
//!   video PES (stream id 0xE0..=0xEF) and the elementary stream bytes *within this TS packet*
//!   hold a NAL unit of type 5 (IDR slice) or 7 (SPS) before any type 1 (non-IDR slice).
//!
//! Limits: the scan looks at one TS packet (at most 184 payload bytes), so a key frame whose
//! IDR/SPS NAL header starts in a later TS packet (e.g. after a large SEI) is missed unless the
//! random-access indicator is set; H.265 and other codecs are not scanned. The frame track then
//! lacks that entry, and seeking lands on an earlier key frame — never on a wrong one.
//! The whole datagram is the unit of the frame track: when the key frame starts in its third TS
//! packet, playback from it also sends the two before it, which decoders skip.

/// Bytes of a TS packet.
pub const TS_PACKET_BYTES: usize = 188;
/// The sync byte every TS packet starts with.
pub const TS_SYNC_BYTE: u8 = 0x47;
/// Most TS packets in one datagram.
pub const TS_PACKETS_PER_DATAGRAM_MAX: usize = 7;

/// The TS packets of a datagram, or `None` when it is not 1..=7 whole TS packets each starting
/// with the sync byte.
pub fn ts_packets(datagram: &[u8]) -> Option<std::slice::ChunksExact<'_, u8>> {
    let n = datagram.len() / TS_PACKET_BYTES;
    if datagram.len() != n * TS_PACKET_BYTES || n == 0 || n > TS_PACKETS_PER_DATAGRAM_MAX {
        return None;
    }
    let packets = datagram.chunks_exact(TS_PACKET_BYTES);
    if packets.clone().any(|p| p[0] != TS_SYNC_BYTE) {
        return None;
    }
    Some(packets)
}

/// Whether the datagram begins an independent frame (see the module documentation).
pub fn begins_independent_frame(datagram: &[u8], h264_idr: bool) -> bool {
    let Some(packets) = ts_packets(datagram) else {
        return false;
    };
    packets.into_iter().any(|p| packet_is_key(p, h264_idr))
}

/// One 188-byte TS packet (caller checked length and sync byte).
fn packet_is_key(p: &[u8], h264_idr: bool) -> bool {
    let transport_error = p[1] & 0x80 != 0;
    let pid = (u16::from(p[1] & 0x1f) << 8) | u16::from(p[2]);
    if transport_error || pid == 0x1fff {
        return false;
    }
    let payload_unit_start = p[1] & 0x40 != 0;
    let adaptation = p[3] & 0x20 != 0;
    let has_payload = p[3] & 0x10 != 0;
    let mut payload_at = 4;
    if adaptation {
        let af_len = usize::from(p[4]);
        if 5 + af_len > TS_PACKET_BYTES {
            return false; // malformed
        }
        if af_len >= 1 && p[5] & 0x40 != 0 {
            return true; // random_access_indicator
        }
        payload_at = 5 + af_len;
    }
    h264_idr && payload_unit_start && has_payload && pes_starts_h264_key(&p[payload_at..])
}

/// Whether a PES packet's start (as much as this TS packet holds) is a video PES whose
/// elementary stream begins an H.264 key frame.
fn pes_starts_h264_key(pes: &[u8]) -> bool {
    // packet_start_code_prefix 00 00 01, stream_id, PES_packet_length (2), flags (2),
    // PES_header_data_length, header data, then the elementary stream.
    if pes.len() < 9 || pes[0..3] != [0, 0, 1] || !(0xe0..=0xef).contains(&pes[3]) {
        return false;
    }
    let es_at = 9 + usize::from(pes[8]);
    pes.get(es_at..).is_some_and(annexb_has_key_nal)
}

/// Scans Annex B bytes (start code 00 00 01) for an IDR (5) or SPS (7) NAL unit before the
/// first non-IDR slice (1).
pub fn annexb_has_key_nal(es: &[u8]) -> bool {
    let mut i = 0;
    while i + 3 < es.len() {
        if es[i] == 0 && es[i + 1] == 0 && es[i + 2] == 1 {
            match es[i + 3] & 0x1f {
                5 | 7 => return true,
                1 => return false,
                _ => {}
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    false
}
