//! RTCP packets (RFC 3550 §6) as a sender writes and reads them.
//!
//! Out: a compound packet of a sender report (NTP time, RTP time, packet and octet counts; no
//! report blocks: penstock receives no RTP), an SDES with the CNAME (every compound packet
//! must carry one, §6.1) and, at the end, a BYE. In: compound packets from receivers,
//! checked as §A.2 says (version 2 in every packet, the first an SR or RR, padding only in
//! the last, lengths that add up to the datagram), of which the reception report blocks,
//! sender reports and BYEs are returned; other types are named and passed over.
//!
//! Writing and the per-packet parsing are `rtcp-types`'; the compound walk and its checks are
//! here (that crate's `Compound::parse` checks the first packet's version only).

use rtcp_types::{
    Bye, CompoundBuilder, Packet, ReceiverReport, RtcpPacketParser, RtcpPacketWriterExt, Sdes,
    SdesChunk, SdesItem, SenderReport,
};

pub const PT_SR: u8 = 200;
pub const PT_RR: u8 = 201;
pub const PT_SDES: u8 = 202;
pub const PT_BYE: u8 = 203;

/// The sender information of an SR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SenderInfo {
    /// Wall-clock time, 64-bit NTP format.
    pub ntp: u64,
    /// The RTP time of the same instant.
    pub rtp_timestamp: u32,
    /// RTP packets sent (modulo 2^32).
    pub packets: u32,
    /// Payload octets sent, headers not counted (modulo 2^32).
    pub octets: u32,
}

/// A reception report block: what one receiver says of one source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportBlock {
    /// The source reported on.
    pub ssrc: u32,
    /// Packets lost since the previous report, as a fraction of 256.
    pub fraction_lost: u8,
    /// Packets lost since the start (24-bit signed: duplicates can make it negative).
    pub cumulative_lost: i32,
    pub extended_highest_sequence: u32,
    /// Interarrival jitter, in RTP timestamp units.
    pub jitter: u32,
    /// The middle 32 bits of the NTP time of the last SR received (0: none yet).
    pub lsr: u32,
    /// Delay since that SR, in 1/65536 s.
    pub dlsr: u32,
}

/// What a compound packet held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RtcpItem {
    /// A reception report block of an RR or SR sent by `reporter`.
    Report { reporter: u32, block: ReportBlock },
    /// Another sender's report.
    SenderReport { ssrc: u32, info: SenderInfo },
    /// A source left.
    Bye { ssrc: u32 },
    /// A packet of a type not read here (SDES, APP, feedback, XR, …).
    Other { packet_type: u8 },
}

/// Why a datagram is not a valid RTCP compound packet, or a report could not be written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RtcpError {
    #[error("not RTCP: {bytes} bytes left, fewer than a 4-byte header")]
    Short { bytes: usize },
    #[error("not RTCP: version {version} in packet {index} (RTCP is version 2)")]
    Version { index: usize, version: u8 },
    #[error("RTCP packet {index} claims {length} bytes where {left} are left")]
    Length {
        index: usize,
        length: usize,
        left: usize,
    },
    #[error("an RTCP compound packet starts with an SR or RR, not packet type {packet_type}")]
    NotReportFirst { packet_type: u8 },
    #[error("RTCP packet {index} is padded but is not the last")]
    Padding { index: usize },
    #[error("malformed RTCP packet {index} (type {packet_type}): {reason}")]
    Malformed {
        index: usize,
        packet_type: u8,
        reason: String,
    },
    #[error("cannot write the RTCP packet: {0}")]
    Write(String),
}

/// Reads a compound packet into `out` (appended; nothing appended on an error).
pub fn parse(datagram: &[u8], out: &mut Vec<RtcpItem>) -> Result<(), RtcpError> {
    let start = out.len();
    let r = parse_into(datagram, out);
    if r.is_err() {
        out.truncate(start);
    }
    r
}

fn parse_into(datagram: &[u8], out: &mut Vec<RtcpItem>) -> Result<(), RtcpError> {
    let mut at = 0usize;
    let mut index = 0usize;
    if datagram.is_empty() {
        return Err(RtcpError::Short { bytes: 0 });
    }
    while at < datagram.len() {
        let rest = &datagram[at..];
        if rest.len() < 4 {
            return Err(RtcpError::Short { bytes: rest.len() });
        }
        let version = rest[0] >> 6;
        if version != 2 {
            return Err(RtcpError::Version { index, version });
        }
        let packet_type = rest[1];
        if index == 0 && packet_type != PT_SR && packet_type != PT_RR {
            return Err(RtcpError::NotReportFirst { packet_type });
        }
        let length = 4 * (usize::from(u16::from_be_bytes([rest[2], rest[3]])) + 1);
        if length > rest.len() {
            return Err(RtcpError::Length {
                index,
                length,
                left: rest.len(),
            });
        }
        if rest[0] & 0x20 != 0 && length != rest.len() {
            return Err(RtcpError::Padding { index });
        }
        let bytes = &rest[..length];
        let malformed = |e: rtcp_types::RtcpParseError| RtcpError::Malformed {
            index,
            packet_type,
            reason: e.to_string(),
        };
        match Packet::parse(bytes).map_err(malformed)? {
            Packet::Sr(sr) => {
                out.push(RtcpItem::SenderReport {
                    ssrc: sr.ssrc(),
                    info: SenderInfo {
                        ntp: sr.ntp_timestamp(),
                        rtp_timestamp: sr.rtp_timestamp(),
                        packets: sr.packet_count(),
                        octets: sr.octet_count(),
                    },
                });
                push_blocks(sr.ssrc(), sr.report_blocks(), out);
            }
            Packet::Rr(rr) => push_blocks(rr.ssrc(), rr.report_blocks(), out),
            Packet::Bye(bye) => out.extend(bye.ssrcs().map(|ssrc| RtcpItem::Bye { ssrc })),
            _ => out.push(RtcpItem::Other { packet_type }),
        }
        at += length;
        index += 1;
    }
    Ok(())
}

fn push_blocks<'a>(
    reporter: u32,
    blocks: impl Iterator<Item = rtcp_types::ReportBlock<'a>>,
    out: &mut Vec<RtcpItem>,
) {
    for b in blocks {
        // 24-bit two's complement.
        let lost = b.cumulative_lost() & 0x00ff_ffff;
        let cumulative_lost = ((lost << 8) as i32) >> 8;
        out.push(RtcpItem::Report {
            reporter,
            block: ReportBlock {
                ssrc: b.ssrc(),
                fraction_lost: b.fraction_lost(),
                cumulative_lost,
                extended_highest_sequence: b.extended_sequence_number(),
                jitter: b.interarrival_jitter(),
                lsr: b.last_sender_report_timestamp(),
                dlsr: b.delay_since_last_sender_report_timestamp(),
            },
        });
    }
}

fn write(builder: CompoundBuilder<'_>, buf: &mut [u8]) -> Result<usize, RtcpError> {
    builder
        .write_into(buf)
        .map_err(|e| RtcpError::Write(e.to_string()))
}

/// Writes SR + SDES (CNAME), and a BYE when `bye` (with that reason, if not empty), into
/// `buf`; the bytes written.
pub fn write_sender_report(
    ssrc: u32,
    cname: &str,
    info: &SenderInfo,
    bye: Option<&str>,
    buf: &mut [u8],
) -> Result<usize, RtcpError> {
    let sr = SenderReport::builder(ssrc)
        .ntp_timestamp(info.ntp)
        .rtp_timestamp(info.rtp_timestamp)
        .packet_count(info.packets)
        .octet_count(info.octets);
    let sdes = Sdes::builder()
        .add_chunk(SdesChunk::builder(ssrc).add_item(SdesItem::builder(SdesItem::CNAME, cname)));
    let mut c = CompoundBuilder::default().add_packet(sr).add_packet(sdes);
    if let Some(reason) = bye {
        c = c.add_packet(Bye::builder().add_source(ssrc).reason(reason));
    }
    write(c, buf)
}

/// Writes an RR from `reporter` with `blocks` (and a BYE when `bye`): what a receiver sends
/// (tests, and a relay later).
pub fn write_receiver_report(
    reporter: u32,
    blocks: &[ReportBlock],
    bye: bool,
    buf: &mut [u8],
) -> Result<usize, RtcpError> {
    let mut rr = ReceiverReport::builder(reporter);
    for b in blocks {
        rr = rr.add_report_block(
            rtcp_types::ReportBlock::builder(b.ssrc)
                .fraction_lost(b.fraction_lost)
                .cumulative_lost((b.cumulative_lost as u32) & 0x00ff_ffff)
                .extended_sequence_number(b.extended_highest_sequence)
                .interarrival_jitter(b.jitter)
                .last_sender_report_timestamp(b.lsr)
                .delay_since_last_sender_report_timestamp(b.dlsr),
        );
    }
    let mut c = CompoundBuilder::default().add_packet(rr);
    if bye {
        c = c.add_packet(Bye::builder().add_source(reporter));
    }
    write(c, buf)
}
