//! The sender's side of an RTCP session (RFC 3550 §6): when to send a report, what to put in
//! it, and what the receivers' reports said.
//!
//! Sans-IO, quinn-style: the caller [`SenderSession::start`]s it when the stream starts, sleeps
//! until [`SenderSession::poll_timeout`], then asks [`SenderSession::poll_report`] for the
//! bytes to send (with the counters and the times it read); it hands every datagram that
//! arrives on the RTCP port to [`SenderSession::handle_datagram`]; at the end
//! [`SenderSession::end`] gives the last report with a BYE.
//!
//! **Interval.** A report every `interval` (5 s by default: §6.2's minimum), each interval
//! drawn uniformly from 0.5 to 1.5 times it (§6.3.1, so that many senders do not
//! synchronize), the first one after half an interval (§6.2, "initial"). The rest of
//! §6.3's algorithm (bandwidth share, member count) is for sessions of many participants; a
//! stream has one sender and a few receivers, and reports every 5 s are far below 5 % of any
//! media rate penstock paces.
//!
//! **Receiver reports.** Blocks about this stream's SSRC update [`ReceiverStats`]: the last
//! fraction lost and cumulative loss, the interarrival jitter (last and largest), the highest
//! sequence number, and the round-trip time from LSR/DLSR (§6.4.1: arrival − LSR − DLSR).
//! Blocks about other sources are counted and ignored; a malformed datagram is counted and
//! changes nothing else.

use crate::time::Instant;

use super::rtcp::{self, RtcpError, RtcpItem, SenderInfo, write_sender_report};
use super::{RTP_CLOCK_HZ, ntp_middle};

/// RFC 3550's minimum report interval, penstock's default.
pub const RTCP_INTERVAL_NS_DEFAULT: u64 = 5_000_000_000;
/// The longest CNAME an SDES item holds.
pub const CNAME_BYTES_MAX: usize = 255;
/// Report items read from one datagram at most (a 1500-byte datagram holds at most 62 blocks).
const ITEMS_PER_DATAGRAM_MAX: usize = 256;

/// What the receivers reported about this stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReceiverStats {
    /// Report blocks about this stream's SSRC.
    pub reports: u64,
    /// The SSRC of the receiver that sent the last one.
    pub reporter: Option<u32>,
    /// The last report's fraction lost (of 256) and the largest seen.
    pub fraction_lost: u8,
    pub fraction_lost_max: u8,
    /// The last report's cumulative packets lost.
    pub cumulative_lost: i32,
    /// The last report's interarrival jitter and the largest, in 90 kHz units.
    pub jitter: u32,
    pub jitter_max: u32,
    pub extended_highest_sequence: u32,
    /// Round-trip time from the last report that named a sender report (LSR ≠ 0).
    pub rtt_ns: Option<u64>,
    /// BYEs received (from any source).
    pub byes: u64,
    /// Report blocks about other sources (ignored).
    pub other_sources: u64,
    /// Datagrams on the RTCP port that were not valid RTCP.
    pub malformed: u64,
}

fn rtp_units_to_ns(units: u32) -> u64 {
    u64::from(units) * 1_000_000_000 / RTP_CLOCK_HZ
}

impl ReceiverStats {
    /// The last jitter in ns.
    pub fn jitter_ns(&self) -> u64 {
        rtp_units_to_ns(self.jitter)
    }

    /// The largest jitter in ns.
    pub fn jitter_max_ns(&self) -> u64 {
        rtp_units_to_ns(self.jitter_max)
    }

    /// The last fraction lost as a ratio (0 to 255/256).
    pub fn fraction_lost_ratio(&self) -> f64 {
        f64::from(self.fraction_lost) / 256.0
    }
}

/// The sender's RTCP session of one stream (see the module doc).
#[derive(Debug, Clone)]
pub struct SenderSession {
    ssrc: u32,
    cname: String,
    interval_ns: u64,
    rng: u64,
    next_report: Option<Instant>,
    ended: bool,
    reports_sent: u64,
    stats: ReceiverStats,
    items: Vec<RtcpItem>,
}

impl SenderSession {
    /// A session for the stream with `ssrc`, named `cname` (cut to 255 bytes), reporting every
    /// `interval_ns` (at least 1 ms); `seed` randomizes the intervals.
    pub fn new(ssrc: u32, cname: &str, interval_ns: u64, seed: u64) -> SenderSession {
        let mut end = cname.len().min(CNAME_BYTES_MAX);
        while !cname.is_char_boundary(end) {
            end -= 1;
        }
        SenderSession {
            ssrc,
            cname: cname[..end].to_string(),
            interval_ns: interval_ns.max(1_000_000),
            rng: seed | 1,
            next_report: None,
            ended: false,
            reports_sent: 0,
            stats: ReceiverStats::default(),
            items: Vec::new(),
        }
    }

    pub fn ssrc(&self) -> u32 {
        self.ssrc
    }

    pub fn cname(&self) -> &str {
        &self.cname
    }

    /// `base` times a factor drawn uniformly from [0.5, 1.5).
    fn randomized(&mut self, base: u64) -> u64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let r = self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32; // 0 .. 2^32
        let scaled = (u128::from(base) * u128::from((1u64 << 31) + r)) >> 32;
        u64::try_from(scaled).unwrap_or(u64::MAX)
    }

    /// The stream's first unit goes at `now`: the first report is due half an interval later
    /// (randomized).
    pub fn start(&mut self, now: Instant) {
        if self.next_report.is_none() && !self.ended {
            let d = self.randomized(self.interval_ns / 2);
            self.next_report = Some(Instant::from_nanos(now.as_nanos().saturating_add(d)));
        }
    }

    /// When the next report is due (`None`: not started, or ended).
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.ended { None } else { self.next_report }
    }

    /// The report due at `now`, written into `buf` (`None`: none is due yet).
    pub fn poll_report(
        &mut self,
        now: Instant,
        info: &SenderInfo,
        buf: &mut [u8],
    ) -> Result<Option<usize>, RtcpError> {
        match self.poll_timeout() {
            Some(due) if due <= now => {}
            _ => return Ok(None),
        }
        let n = write_sender_report(self.ssrc, &self.cname, info, None, buf)?;
        let d = self.randomized(self.interval_ns);
        self.next_report = Some(Instant::from_nanos(now.as_nanos().saturating_add(d)));
        self.reports_sent += 1;
        Ok(Some(n))
    }

    /// The last report, with a BYE (`reason`, may be empty), written into `buf`; no report is
    /// due after it. `None` when the session already ended.
    pub fn end(
        &mut self,
        info: &SenderInfo,
        reason: &str,
        buf: &mut [u8],
    ) -> Result<Option<usize>, RtcpError> {
        if self.ended {
            return Ok(None);
        }
        let n = write_sender_report(self.ssrc, &self.cname, info, Some(reason), buf)?;
        self.ended = true;
        self.reports_sent += 1;
        Ok(Some(n))
    }

    /// Reports written so far (the BYE's included).
    pub fn reports_sent(&self) -> u64 {
        self.reports_sent
    }

    /// A datagram arrived on the RTCP port at `arrival_ntp` (wall clock, NTP format).
    /// Malformed datagrams are counted and change nothing else.
    pub fn handle_datagram(&mut self, arrival_ntp: u64, datagram: &[u8]) -> Result<(), RtcpError> {
        let mut items = std::mem::take(&mut self.items);
        items.clear();
        let r = rtcp::parse(datagram, &mut items);
        if let Err(e) = r {
            self.stats.malformed += 1;
            self.items = items;
            return Err(e);
        }
        for item in items.iter().take(ITEMS_PER_DATAGRAM_MAX) {
            match *item {
                RtcpItem::Report { reporter, block } if block.ssrc == self.ssrc => {
                    let s = &mut self.stats;
                    s.reports += 1;
                    s.reporter = Some(reporter);
                    s.fraction_lost = block.fraction_lost;
                    s.fraction_lost_max = s.fraction_lost_max.max(block.fraction_lost);
                    s.cumulative_lost = block.cumulative_lost;
                    s.jitter = block.jitter;
                    s.jitter_max = s.jitter_max.max(block.jitter);
                    s.extended_highest_sequence = block.extended_highest_sequence;
                    if block.lsr != 0 {
                        // §6.4.1: A − LSR − DLSR, in 1/65536 s, modulo 2^32; a "negative"
                        // result (clocks, or a report about an SR we never sent) is dropped.
                        let units = ntp_middle(arrival_ntp)
                            .wrapping_sub(block.lsr)
                            .wrapping_sub(block.dlsr);
                        if units < 1 << 31 {
                            s.rtt_ns = Some(u64::from(units) * 1_000_000_000 / 65_536);
                        }
                    }
                }
                RtcpItem::Report { .. } => self.stats.other_sources += 1,
                RtcpItem::Bye { .. } => self.stats.byes += 1,
                RtcpItem::SenderReport { .. } | RtcpItem::Other { .. } => {}
            }
        }
        self.items = items;
        Ok(())
    }

    /// What the receivers said so far.
    pub fn stats(&self) -> &ReceiverStats {
        &self.stats
    }
}
