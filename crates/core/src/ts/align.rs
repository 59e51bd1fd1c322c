//! Raw MPEG-TS over UDP read as the byte stream it is: a sender may cut its datagrams anywhere.
//! ffmpeg's `udp://` output without `?pkt_size=1316` sends 1,472-byte datagrams that split TS
//! packets; GStreamer's `udpsink` after a muxer can do the same. [`Realigner`] turns such
//! datagrams back into whole 188-byte packets, so that every datagram a live relay passes on
//! (to its sessions, its recorder and the recorder's key-frame index) starts with a packet.
//!
//! Aligned datagrams (the common case: 7 packets each) pass through without a copy. A lost
//! datagram leaves a partial packet behind: it is dropped at the next sync byte that another
//! follows 188 bytes later (or that ends the data), never delivered as a packet. (A payload
//! with a 0x47 byte at the same place in consecutive packets could hold a wrong phase for as
//! long as that lasts; the first packet that breaks the pattern puts it back in phase.)

use super::packet::{TS_PACKET_BYTES, TS_SYNC_BYTE};

/// The carried tail of the last datagram (less than a packet) and what was thrown away.
#[derive(Debug, Default, Clone)]
pub struct Realigner {
    carry: Vec<u8>,
    /// Bytes dropped because they belonged to no packet that could be checked (a loss, garbage).
    pub dropped_bytes: u64,
}

/// Whether `d` is whole packets, each starting with the sync byte.
pub fn is_aligned(d: &[u8]) -> bool {
    !d.is_empty()
        && d.len().is_multiple_of(TS_PACKET_BYTES)
        && d.chunks(TS_PACKET_BYTES).all(|p| p[0] == TS_SYNC_BYTE)
}

/// A header no encoder writes: adaptation_field_control `00` is reserved (ISO/IEC 13818-1
/// 2.4.3.3; decoders discard such packets). A run of 0x47 bytes has it.
fn reserved_header(p: &[u8]) -> bool {
    (p[3] >> 4) & 0b11 == 0
}

impl Realigner {
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes carried into the next datagram (always fewer than a packet).
    pub fn carried(&self) -> usize {
        self.carry.len()
    }

    /// The whole packets that `d` completes, in order: `d` itself when nothing is carried and
    /// it is aligned, else the packets assembled in `scratch`. Empty when `d` completes none.
    pub fn push<'a>(&mut self, d: &'a [u8], scratch: &'a mut Vec<u8>) -> &'a [u8] {
        if is_aligned(d) {
            // A datagram of whole packets starts a packet: what was carried (the tail of an
            // earlier datagram whose rest never came) was no packet's beginning after all.
            self.dropped_bytes += self.carry.len() as u64;
            self.carry.clear();
            return d;
        }
        scratch.clear();
        scratch.extend_from_slice(&self.carry);
        scratch.extend_from_slice(d);
        self.carry.clear();
        let n = scratch.len();
        let (mut read, mut write) = (0usize, 0usize);
        while read < n {
            let rest = n - read;
            if scratch[read] != TS_SYNC_BYTE {
                read += 1;
                self.dropped_bytes += 1;
                continue;
            }
            if rest < TS_PACKET_BYTES {
                // A packet's beginning: the next datagram completes it.
                self.carry.extend_from_slice(&scratch[read..]);
                break;
            }
            // A sync byte whose packet another sync byte follows (or that ends the data), with
            // a header that is not reserved, is taken as a packet; otherwise it was a payload
            // byte that looked like one.
            if (rest > TS_PACKET_BYTES && scratch[read + TS_PACKET_BYTES] != TS_SYNC_BYTE)
                || reserved_header(&scratch[read..read + TS_PACKET_BYTES])
            {
                read += 1;
                self.dropped_bytes += 1;
                continue;
            }
            scratch.copy_within(read..read + TS_PACKET_BYTES, write);
            write += TS_PACKET_BYTES;
            read += TS_PACKET_BYTES;
        }
        scratch.truncate(write);
        &scratch[..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn packets(n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n * TS_PACKET_BYTES);
        for i in 0..n {
            // A payload-only packet of PID 0x100 with its continuity counter.
            v.extend_from_slice(&[TS_SYNC_BYTE, 0x01, 0x00, 0x10 | (i as u8 & 0x0f)]);
            // One payload byte that looks like a sync byte, at a place that moves from packet
            // to packet (as in real payloads); the others below 0x40.
            let fake = 4 + (i * 37) % (TS_PACKET_BYTES - 5);
            v.extend((4..TS_PACKET_BYTES).map(|k| {
                if k == fake {
                    TS_SYNC_BYTE
                } else {
                    ((i + k) as u8) & 0x3f
                }
            }));
        }
        v
    }

    fn feed(r: &mut Realigner, input: &[u8], cuts: &[usize]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut scratch = Vec::new();
        let mut at = 0;
        for &c in cuts.iter().chain(std::iter::once(&input.len())) {
            let c = c.clamp(at, input.len());
            out.extend_from_slice(r.push(&input[at..c], &mut scratch));
            at = c;
        }
        out
    }

    #[test]
    fn aligned_datagrams_pass_through_without_a_copy() {
        let d = packets(7);
        let mut r = Realigner::new();
        let mut scratch = Vec::new();
        let got = r.push(&d, &mut scratch);
        assert_eq!(got.as_ptr(), d.as_ptr());
        assert!(scratch.is_empty());
    }

    #[test]
    fn ffmpegs_1472_byte_datagrams_become_whole_packets() {
        let input = packets(100);
        let cuts: Vec<usize> = (1..)
            .map(|k| k * 1472)
            .take_while(|&c| c < input.len())
            .collect();
        let mut r = Realigner::new();
        let out = feed(&mut r, &input, &cuts);
        assert_eq!(out, input);
        assert_eq!(r.carried(), 0);
        assert_eq!(r.dropped_bytes, 0);
    }

    #[test]
    fn a_lost_datagram_drops_the_broken_packet_only() {
        let input = packets(50);
        // Datagrams of 1,000 bytes; the third (2000..3000) never arrives.
        let mut r = Realigner::new();
        let mut scratch = Vec::new();
        let mut out = Vec::new();
        for (i, d) in input.chunks(1000).enumerate() {
            if i == 2 {
                continue;
            }
            out.extend_from_slice(r.push(d, &mut scratch));
        }
        assert!(is_aligned(&out));
        // Every packet delivered is one of the input's, in order.
        let originals: Vec<&[u8]> = input.chunks(TS_PACKET_BYTES).collect();
        let mut next = 0;
        for p in out.chunks(TS_PACKET_BYTES) {
            let k = originals[next..]
                .iter()
                .position(|o| *o == p)
                .expect("a packet of the input");
            next += k + 1;
        }
        // Only the packets the loss touched are missing: 2000..3000 spans packets 10..=15,
        // and the carried start of packet 10 (byte 1880) is dropped with it.
        assert_eq!(out.len() / TS_PACKET_BYTES, 50 - 6);
    }

    #[test]
    fn a_run_of_sync_bytes_is_no_packet_and_leaves_aligned_datagrams_alone() {
        let mut r = Realigner::new();
        let mut scratch = Vec::new();
        assert!(r.push(&[0x47u8; 200], &mut scratch).is_empty());
        // Its tail may be carried; the next aligned datagram passes whole and drops it.
        let d = packets(7);
        let got = r.push(&d, &mut scratch);
        assert_eq!(got.as_ptr(), d.as_ptr());
        assert_eq!(r.carried(), 0);
        assert_eq!(r.dropped_bytes, 200);
    }

    #[test]
    fn garbage_gives_no_packets() {
        let mut r = Realigner::new();
        let mut scratch = Vec::new();
        assert!(r.push(&[0u8; 1472], &mut scratch).is_empty());
        assert_eq!(r.dropped_bytes, 1472);
        assert_eq!(r.carried(), 0);
    }

    proptest! {
        /// Cut anywhere, the stream comes back whole and in order.
        #[test]
        fn any_cuts_give_back_the_stream(n in 1usize..60, mut cuts in prop::collection::vec(0usize..60 * 188, 0..40)) {
            let input = packets(n);
            cuts.sort_unstable();
            let mut r = Realigner::new();
            let out = feed(&mut r, &input, &cuts);
            prop_assert_eq!(out, input);
            prop_assert_eq!(r.dropped_bytes, 0);
        }

        /// Whatever arrives, what comes out is whole packets.
        #[test]
        fn output_is_always_whole_packets(data in prop::collection::vec(prop::sample::select(vec![0x47u8, 0, 1, 0xff]), 0..4000), cut in 1usize..2000) {
            let mut r = Realigner::new();
            let mut scratch = Vec::new();
            for d in data.chunks(cut) {
                let got = r.push(d, &mut scratch);
                prop_assert!(got.is_empty() || is_aligned(got));
            }
            prop_assert!(r.carried() < TS_PACKET_BYTES);
        }
    }
}
