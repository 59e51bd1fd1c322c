//! One MPEG-TS packet (ISO/IEC 13818-1 §2.4.3): the 4-byte header, the adaptation field's
//! flags and its program clock reference.

/// Bytes of a TS packet.
pub const TS_PACKET_BYTES: usize = 188;
/// The sync byte every TS packet starts with.
pub const TS_SYNC_BYTE: u8 = 0x47;
/// The null packet's PID (stuffing: carries nothing).
pub const NULL_PID: u16 = 0x1fff;
/// Ticks per second of the 27 MHz system clock the PCR counts.
pub const PCR_TICKS_PER_S: u64 = 27_000_000;
/// The PCR counts modulo this: a 33-bit base at 90 kHz times 300, plus the 0..300 extension
/// (it wraps after 2^33 / 90,000 s, 26.5 hours).
pub const PCR_MODULUS: u64 = (1 << 33) * 300;

/// The fields of a TS packet the PCR planner and the PSI probe read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TsPacket<'a> {
    pub pid: u16,
    /// `payload_unit_start_indicator`: a PES packet or a PSI section starts in this payload.
    pub payload_unit_start: bool,
    /// `transport_error_indicator`: a demodulator marked the packet damaged.
    pub transport_error: bool,
    /// From the adaptation field: the time base (PCR) or continuity restarts here.
    pub discontinuity: bool,
    /// From the adaptation field: decoding can start here.
    pub random_access: bool,
    /// The program clock reference in 27 MHz ticks (`base · 300 + extension`), when the
    /// adaptation field carries a well-formed one (extension below 300).
    pub pcr: Option<u64>,
    /// The payload after the header and the adaptation field (empty when there is none).
    pub payload: &'a [u8],
}

/// Parses one 188-byte packet; `None` when it does not start with the sync byte, or its
/// adaptation field does not fit in the packet (a malformed packet carries no PCR and no
/// payload we would read).
pub fn parse_packet(p: &[u8; TS_PACKET_BYTES]) -> Option<TsPacket<'_>> {
    if p[0] != TS_SYNC_BYTE {
        return None;
    }
    let pid = (u16::from(p[1] & 0x1f) << 8) | u16::from(p[2]);
    let afc = (p[3] >> 4) & 0x3;
    let mut packet = TsPacket {
        pid,
        payload_unit_start: p[1] & 0x40 != 0,
        transport_error: p[1] & 0x80 != 0,
        discontinuity: false,
        random_access: false,
        pcr: None,
        payload: &[],
    };
    let mut payload_at = 4;
    if afc & 0x2 != 0 {
        let af_len = usize::from(p[4]);
        // adaptation_field_length: 0..=183 with a payload, 183 without one.
        if 5 + af_len > TS_PACKET_BYTES {
            return None;
        }
        if af_len > 0 {
            let flags = p[5];
            packet.discontinuity = flags & 0x80 != 0;
            packet.random_access = flags & 0x40 != 0;
            if flags & 0x10 != 0 && af_len >= 7 {
                packet.pcr = decode_pcr(&p[6..12]);
            }
        }
        payload_at = 5 + af_len;
    }
    if afc & 0x1 != 0 {
        packet.payload = &p[payload_at..];
    }
    Some(packet)
}

/// The 6 PCR bytes: a 33-bit base at 90 kHz, 6 reserved bits, a 9-bit extension at 27 MHz;
/// `None` for an extension of 300 or more (not a valid clock value).
pub fn decode_pcr(b: &[u8]) -> Option<u64> {
    let b: &[u8; 6] = b.try_into().ok()?;
    let base = (u64::from(b[0]) << 25)
        | (u64::from(b[1]) << 17)
        | (u64::from(b[2]) << 9)
        | (u64::from(b[3]) << 1)
        | (u64::from(b[4]) >> 7);
    let ext = (u64::from(b[4] & 1) << 8) | u64::from(b[5]);
    (ext < 300).then_some(base * 300 + ext)
}

/// The 6 PCR bytes of `pcr` (27 MHz ticks, taken modulo [`PCR_MODULUS`]); reserved bits set,
/// as the standard asks.
pub fn encode_pcr(pcr: u64) -> [u8; 6] {
    let pcr = pcr % PCR_MODULUS;
    let (base, ext) = (pcr / 300, pcr % 300);
    [
        (base >> 25) as u8,
        (base >> 17) as u8,
        (base >> 9) as u8,
        (base >> 1) as u8,
        (((base & 1) << 7) as u8) | 0x7e | ((ext >> 8) as u8),
        ext as u8,
    ]
}

/// Whether `bytes` look like MPEG-TS: at least one packet, and a sync byte at every
/// 188-byte step of the first (up to) five packets. `penstock stream --timing auto` asks this
/// of a file's first kilobyte.
pub fn looks_like_ts(bytes: &[u8]) -> bool {
    let packets = (bytes.len() / TS_PACKET_BYTES).min(5);
    packets > 0 && (0..packets).all(|i| bytes[i * TS_PACKET_BYTES] == TS_SYNC_BYTE)
}
