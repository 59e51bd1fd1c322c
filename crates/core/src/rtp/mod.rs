//! MPEG-TS over RTP (RFC 3550, RFC 2250, RFC 3551): the 12-byte RTP header of each datagram
//! ([`Packetizer`]), RTCP sender reports, SDES and BYE out and receiver reports in
//! ([`rtcp`]), and the sender's RTCP session — when to report, what the receivers said
//! ([`session`]). An MP4's tracks (H.264, H.265, AAC, each its own RTP session) are cut
//! into payloads by [`mp4`].
//!
//! Pure: the driver writes the header into the pool buffer in front of each unit's payload
//! and sends; it reads the clock and passes the times in.
//!
//! **The header** (RFC 2250 §2): version 2, no padding, extension or CSRC, marker 0 (the
//! timestamps here never jump: the plan's timeline is spliced across PCR discontinuities),
//! payload type 33 (MP2T, RFC 3551), a sequence number that starts at a random value and
//! counts datagrams (a skipped unit leaves a gap, as a loss would), a 90 kHz **timestamp from
//! the PCR**: a random start plus the unit's time on the plan's PCR timeline in 90 kHz
//! (`PCR / 300`, the PCR base's own clock), and a random SSRC. The payload is the unit's whole
//! TS packets (7 × 188 bytes by default).
//!
//! **Crates.** RTCP parsing and writing use `rtcp-types` (GStreamer's maintainers; no I/O, no
//! unsafe, only `thiserror`): compound packets, SR/RR/SDES/BYE builders. The RTP header is
//! written here: twelve fixed bytes into the pool buffer in place, which `rtp-types` or
//! webrtc-rs's `rtp` (a `bytes`-based packet object, a runtime's worth of dependencies) would
//! do by building a packet around a payload we already hold in place.

pub mod announce;
pub mod depack;
pub mod ingest;
pub mod mp4;
pub mod rtcp;
pub mod session;

pub use session::{ReceiverStats, SenderSession};

use crate::track::Speed;

/// Bytes of the RTP header penstock writes (no CSRC, no extension).
pub const RTP_HEADER_BYTES: usize = 12;
/// RFC 3551's static payload type of MPEG-2 transport streams.
pub const PAYLOAD_TYPE_MP2T: u8 = 33;
/// The RTP clock of MP2T (RFC 3551): 90 kHz.
pub const RTP_CLOCK_HZ: u64 = 90_000;
/// Seconds from the NTP epoch (1900) to the Unix epoch (1970).
pub const NTP_UNIX_OFFSET_S: u64 = 2_208_988_800;

/// The fields of an RTP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtpHeader {
    pub marker: bool,
    pub payload_type: u8,
    pub sequence: u16,
    pub timestamp: u32,
    pub ssrc: u32,
}

impl RtpHeader {
    /// The 12 bytes: version 2, no padding, no extension, no CSRC.
    pub fn encode(&self) -> [u8; RTP_HEADER_BYTES] {
        let mut h = [0u8; RTP_HEADER_BYTES];
        h[0] = 0x80;
        h[1] = (u8::from(self.marker) << 7) | (self.payload_type & 0x7f);
        h[2..4].copy_from_slice(&self.sequence.to_be_bytes());
        h[4..8].copy_from_slice(&self.timestamp.to_be_bytes());
        h[8..12].copy_from_slice(&self.ssrc.to_be_bytes());
        h
    }

    /// Parses an RTP version 2 packet: the header and the payload (after CSRCs and the
    /// extension, without padding); `None` when it is not one.
    pub fn parse(packet: &[u8]) -> Option<(RtpHeader, &[u8])> {
        if packet.len() < RTP_HEADER_BYTES || packet[0] >> 6 != 2 {
            return None;
        }
        let csrcs = usize::from(packet[0] & 0x0f);
        let mut at = RTP_HEADER_BYTES + 4 * csrcs;
        if packet[0] & 0x10 != 0 {
            let ext = packet.get(at..at + 4)?;
            at += 4 + 4 * usize::from(u16::from_be_bytes([ext[2], ext[3]]));
        }
        let mut end = packet.len();
        if packet[0] & 0x20 != 0 {
            let pad = usize::from(*packet.last()?);
            if pad == 0 {
                return None;
            }
            end = end.checked_sub(pad)?;
        }
        let payload = packet.get(at..end)?;
        Some((
            RtpHeader {
                marker: packet[1] & 0x80 != 0,
                payload_type: packet[1] & 0x7f,
                sequence: u16::from_be_bytes([packet[2], packet[3]]),
                timestamp: u32::from_be_bytes([packet[4], packet[5], packet[6], packet[7]]),
                ssrc: u32::from_be_bytes([packet[8], packet[9], packet[10], packet[11]]),
            },
            payload,
        ))
    }
}

/// The RTP identity and numbering of one stream: unit `n` of the plan, due `offset_ns` after
/// the plan's start, goes out with sequence `sequence_start + n` and timestamp
/// `timestamp_start + offset · 90 kHz` (both modulo their width).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packetizer {
    pub ssrc: u32,
    pub sequence_start: u16,
    pub timestamp_start: u32,
    pub payload_type: u8,
    /// How much faster than media time the plan's deadlines run (RTSP `Scale`): a unit due
    /// `offset_ns` after the start carries the media time `offset_ns · scale`, so that a
    /// player sees the media's own timestamps go by faster. [`Speed::NORMAL`] for plans whose
    /// deadlines are media time.
    pub scale: Speed,
}

/// 90 kHz ticks in `ns`, rounded down. A plan's offsets are its PCR times rounded up to the
/// ns, so this gives back the PCR's own `PCR / 300` (the base) exactly.
pub fn rtp_ticks(ns: u64) -> u64 {
    u64::try_from(u128::from(ns) * u128::from(RTP_CLOCK_HZ) / 1_000_000_000).unwrap_or(u64::MAX)
}

impl Packetizer {
    /// MP2T with SSRC, first sequence number and first timestamp taken from `random` (the
    /// caller's randomness: RFC 3550 §5.1 wants all three random).
    pub fn mp2t(random: u64) -> Packetizer {
        // splitmix64 spreads one seed over the three fields.
        let mut s = random;
        let mut next = || {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        Packetizer {
            ssrc: next() as u32,
            sequence_start: next() as u16,
            timestamp_start: next() as u32,
            payload_type: PAYLOAD_TYPE_MP2T,
            scale: Speed::NORMAL,
        }
    }

    /// The sequence number of unit `unit`.
    pub fn sequence(&self, unit: u64) -> u16 {
        self.sequence_start.wrapping_add(unit as u16)
    }

    /// The RTP timestamp of a unit due `offset_ns` after the plan's start (also: the RTP time
    /// that corresponds to that instant, for a sender report).
    pub fn timestamp(&self, offset_ns: u64) -> u32 {
        let media_ns = if self.scale == Speed::NORMAL {
            offset_ns
        } else {
            self.scale.media_ns(offset_ns)
        };
        self.timestamp_start
            .wrapping_add(rtp_ticks(media_ns) as u32)
    }

    /// The header of unit `unit`, due `offset_ns` after the plan's start.
    pub fn header(&self, unit: u64, offset_ns: u64) -> [u8; RTP_HEADER_BYTES] {
        RtpHeader {
            marker: false,
            payload_type: self.payload_type,
            sequence: self.sequence(unit),
            timestamp: self.timestamp(offset_ns),
            ssrc: self.ssrc,
        }
        .encode()
    }
}

/// A 64-bit NTP timestamp (seconds since 1900 in the high half, the fraction in the low half)
/// of a time given in ns since the Unix epoch.
pub fn ntp_from_unix_ns(unix_ns: u64) -> u64 {
    let secs = unix_ns / 1_000_000_000 + NTP_UNIX_OFFSET_S;
    let frac = ((u128::from(unix_ns % 1_000_000_000) << 32) / 1_000_000_000) as u64;
    (secs << 32) | frac
}

/// A minimal SDP (RFC 4566) of an MP2T RTP stream sent to `dest` from `origin`: what a
/// receiver without RTSP needs (`ffmpeg -protocol_whitelist file,udp,rtp -i FILE.sdp`, VLC,
/// GStreamer's `sdpdemux`). The RTCP port is the convention, `dest`'s port + 1.
pub fn sdp_mp2t(dest: std::net::SocketAddr, origin: std::net::IpAddr, session_id: u32) -> String {
    let family = |ip: std::net::IpAddr| if ip.is_ipv4() { "IP4" } else { "IP6" };
    format!(
        "v=0\r\no=- {session_id} 1 IN {} {origin}\r\ns=penstock\r\nc=IN {} {}\r\nt=0 0\r\nm=video {} RTP/AVP {PAYLOAD_TYPE_MP2T}\r\na=rtpmap:{PAYLOAD_TYPE_MP2T} MP2T/{RTP_CLOCK_HZ}\r\n",
        family(origin),
        family(dest.ip()),
        dest.ip(),
        dest.port(),
    )
}

/// The middle 32 bits of an NTP timestamp: the unit of RTCP's LSR and DLSR (1/65536 s).
pub fn ntp_middle(ntp: u64) -> u32 {
    (ntp >> 16) as u32
}

#[cfg(test)]
mod tests;
