//! Synthetic MPEG-TS with PCRs exactly where a test wants them: the property tests here, the
//! driver's and the CLI's loopback tests, the fuzz seeds. Not a muxer: the payloads are a
//! counter pattern, not media.

use super::packet::{TS_PACKET_BYTES, TS_SYNC_BYTE, encode_pcr};
use super::psi::section_payload;

/// The PID the synthetic PMT names as PCR PID (and which carries the PCRs).
pub const SYNTH_PCR_PID: u16 = 0x100;
/// The PID of the synthetic payload packets without PCR.
pub const SYNTH_DATA_PID: u16 = 0x101;
/// The PMT's PID in the synthetic PAT.
pub const SYNTH_PMT_PID: u16 = 0x1000;

/// One PCR to place: in packet `packet`, value `pcr` (27 MHz ticks, taken modulo the PCR's
/// range), with the `discontinuity_indicator` when `discontinuity`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PcrAt {
    pub packet: u64,
    pub pcr: u64,
    pub discontinuity: bool,
}

/// A packet of `pid` with an adaptation field holding `pcr` (and the discontinuity flag), the
/// rest payload bytes derived from `index`.
pub fn packet(pid: u16, index: u64, pcr: Option<(u64, bool)>, cc: u8) -> [u8; TS_PACKET_BYTES] {
    let mut p = [0u8; TS_PACKET_BYTES];
    p[0] = TS_SYNC_BYTE;
    p[1] = (pid >> 8) as u8 & 0x1f;
    p[2] = pid as u8;
    let mut at = 4;
    match pcr {
        Some((pcr, disc)) => {
            p[3] = 0x30 | (cc & 0xf); // adaptation field and payload
            p[4] = 7;
            p[5] = 0x10 | if disc { 0x80 } else { 0 };
            p[6..12].copy_from_slice(&encode_pcr(pcr));
            at = 12;
        }
        None => p[3] = 0x10 | (cc & 0xf),
    }
    for (k, b) in p[at..].iter_mut().enumerate() {
        *b = (index as u8).wrapping_mul(31).wrapping_add(k as u8);
    }
    p
}

/// A PAT naming program 1 on [`SYNTH_PMT_PID`], and that program's PMT naming `pcr_pid`
/// (one H.264 stream on [`SYNTH_DATA_PID`]).
pub fn psi_packets(pcr_pid: u16) -> [[u8; TS_PACKET_BYTES]; 2] {
    let mut pat = [0u8; TS_PACKET_BYTES];
    pat[..4].copy_from_slice(&[TS_SYNC_BYTE, 0x40, 0x00, 0x10]);
    let mut body = 1u16.to_be_bytes().to_vec();
    body.extend_from_slice(&(0xe000 | SYNTH_PMT_PID).to_be_bytes());
    pat[4..].copy_from_slice(&section_payload(0x00, 1, &body, 184).expect("fits"));
    let mut pmt = [0u8; TS_PACKET_BYTES];
    pmt[..4].copy_from_slice(&[
        TS_SYNC_BYTE,
        0x40 | (SYNTH_PMT_PID >> 8) as u8,
        SYNTH_PMT_PID as u8,
        0x10,
    ]);
    let mut body = (0xe000 | pcr_pid).to_be_bytes().to_vec();
    body.extend_from_slice(&[0xf0, 0x00]); // program_info_length 0
    body.push(0x1b); // H.264
    body.extend_from_slice(&(0xe000 | SYNTH_DATA_PID).to_be_bytes());
    body.extend_from_slice(&[0xf0, 0x00]);
    pmt[4..].copy_from_slice(&section_payload(0x02, 1, &body, 184).expect("fits"));
    [pat, pmt]
}

/// `packets` packets: a PAT and PMT first when `psi`, the PCRs where `pcrs` says (on
/// [`SYNTH_PCR_PID`]), the other packets on [`SYNTH_DATA_PID`].
pub fn ts_with_pcrs(packets: u64, pcrs: &[PcrAt], psi: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(packets as usize * TS_PACKET_BYTES);
    let psi_packets = psi_packets(SYNTH_PCR_PID);
    let mut next = pcrs.iter().peekable();
    let mut cc = 0u8;
    for i in 0..packets {
        if psi && (i as usize) < psi_packets.len() {
            out.extend_from_slice(&psi_packets[i as usize]);
            // A PCR asked for here is not placed.
            while next.peek().is_some_and(|p| p.packet <= i) {
                next.next();
            }
            continue;
        }
        let pcr = match next.peek() {
            Some(p) if p.packet == i => {
                let p = next.next().expect("peeked");
                Some((p.pcr, p.discontinuity))
            }
            _ => None,
        };
        let pid = if pcr.is_some() {
            SYNTH_PCR_PID
        } else {
            SYNTH_DATA_PID
        };
        out.extend_from_slice(&packet(pid, i, pcr, cc));
        cc = cc.wrapping_add(1);
    }
    out
}

/// The exact PCR time of packet `i` of a constant-rate multiplex of `bits_per_s` whose packet
/// 0 is at `start` ticks: `start + i · 188 · 8 · 27e6 / bits_per_s`, as a fraction
/// `(numerator, denominator)` of ticks.
pub fn cbr_ticks(start: u64, i: u64, bits_per_s: u64) -> (u128, u128) {
    let num = u128::from(start) * u128::from(bits_per_s)
        + u128::from(i) * (TS_PACKET_BYTES as u128) * 8 * 27_000_000;
    (num, u128::from(bits_per_s))
}

/// A constant-rate multiplex of `packets` packets at `bits_per_s`, a PCR every `pcr_every`
/// packets from packet `first_pcr` on (the PCR value rounded down to a tick), PAT and PMT
/// first when `psi`.
pub fn cbr_ts(
    packets: u64,
    bits_per_s: u64,
    start: u64,
    first_pcr: u64,
    pcr_every: u64,
    psi: bool,
) -> Vec<u8> {
    let pcrs: Vec<PcrAt> = (first_pcr..packets)
        .step_by(pcr_every.max(1) as usize)
        .map(|i| {
            let (n, d) = cbr_ticks(start, i, bits_per_s);
            PcrAt {
                packet: i,
                pcr: (n / d) as u64,
                discontinuity: false,
            }
        })
        .collect();
    ts_with_pcrs(packets, &pcrs, psi)
}
