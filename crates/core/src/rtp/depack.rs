//! RTP depacketizers for what publishers send (RTSP RECORD): H.264 by RFC 6184 (single NAL
//! unit packets, STAP-A, FU-A: packetization modes 0 and 1) and AAC by RFC 3640
//! (`mpeg4-generic`, AAC-hbr and AAC-lbr: AU headers of the widths the SDP gives, fragmented
//! AUs). The inverse of [`super::mp4`]'s packetizer; the property tests run the two against
//! each other.
//!
//! **Losses.** A packet is expected with the sequence number after the last one. A gap
//! means packets were lost: a NAL unit or AU being reassembled from fragments is dropped
//! whole, and the next unit handed out carries `discontinuity` — a lost fragment never
//! yields a unit with bytes missing from its middle. A packet older than the last one (a
//! duplicate, or reordered: interleaved TCP has neither) is ignored.
//!
//! **Access units.** H.264 packets of one RTP timestamp are one access unit; it ends at the
//! packet with the marker bit, or when a packet of another timestamp arrives. An access unit
//! over [`DepackLimits::au_bytes_max`] or with more than [`DepackLimits::nals_per_au_max`]
//! NAL units is dropped whole (an error is returned once; the next unit is marked
//! discontinuous).
//!
//! Pure: packets come in parsed ([`super::RtpHeader::parse`]); units go out into a `Vec`
//! the caller drains.

use super::RtpHeader;

/// H.264's STAP-A (RFC 6184 §5.7.1).
const STAP_A: u8 = 24;
/// H.264's FU-A (RFC 6184 §5.8).
const FU_A: u8 = 28;
/// H.264's IDR slice.
pub const NAL_IDR: u8 = 5;
/// AAC's samples per frame (AAC-LC; the RTP clock is the sample rate).
pub const AAC_SAMPLES_PER_FRAME: u32 = 1024;

/// Bounds of a depacketizer's reassembly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DepackLimits {
    /// The largest access unit (all its NAL units; one AAC frame) in bytes.
    pub au_bytes_max: usize,
    /// The most NAL units of one H.264 access unit.
    pub nals_per_au_max: usize,
}

impl Default for DepackLimits {
    fn default() -> Self {
        DepackLimits {
            au_bytes_max: 4 << 20,
            nals_per_au_max: 256,
        }
    }
}

/// Why a packet was dropped (the depacketizer goes on with the next).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DepackError {
    #[error("malformed payload: {0}")]
    Malformed(&'static str),
    #[error("H.264 NAL unit type {0} is not supported (STAP-B, MTAP, FU-B: interleaved mode)")]
    Unsupported(u8),
    #[error("access unit larger than {0} bytes: dropped")]
    TooLarge(usize),
    #[error("access unit with more than {0} NAL units: dropped")]
    TooManyNals(usize),
}

/// One H.264 access unit: its NAL units (without start codes), in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VideoUnit {
    pub timestamp: u32,
    pub nals: Vec<Vec<u8>>,
    /// Holds an IDR slice.
    pub key: bool,
    /// Packets were lost (or dropped) before this unit.
    pub discontinuity: bool,
}

/// One AAC access unit (a raw frame, no ADTS header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AudioUnit {
    pub timestamp: u32,
    pub data: Vec<u8>,
    pub discontinuity: bool,
}

/// Where the last sequence number leaves a new packet.
enum Order {
    Next,
    /// Packets were lost before it.
    Gap,
    /// A duplicate or late packet.
    Old,
}

fn order(last: Option<u16>, seq: u16) -> Order {
    match last {
        None => Order::Next,
        Some(l) => match seq.wrapping_sub(l) as i16 {
            1 => Order::Next,
            d if d <= 0 => Order::Old,
            _ => Order::Gap,
        },
    }
}

#[derive(Debug)]
struct Building {
    timestamp: u32,
    nals: Vec<Vec<u8>>,
    bytes: usize,
    discontinuity: bool,
    /// Over a limit: dropped when it ends.
    broken: bool,
}

/// RFC 6184 receiver.
#[derive(Debug)]
pub struct H264Depacketizer {
    limits: DepackLimits,
    last_seq: Option<u16>,
    cur: Option<Building>,
    /// A fragmented NAL unit being put together (its header first).
    fu: Option<Vec<u8>>,
    /// The next unit started carries `discontinuity`.
    pending_discontinuity: bool,
}

impl H264Depacketizer {
    pub fn new(limits: DepackLimits) -> Self {
        H264Depacketizer {
            limits,
            last_seq: None,
            cur: None,
            fu: None,
            pending_discontinuity: false,
        }
    }

    /// Marks a loss: the fragment in progress dropped, the current (or next) unit marked.
    fn lose(&mut self) {
        self.fu = None;
        match &mut self.cur {
            Some(c) => c.discontinuity = true,
            None => self.pending_discontinuity = true,
        }
    }

    fn finish(&mut self, out: &mut Vec<VideoUnit>) {
        if self.fu.take().is_some() {
            // A fragment never ended within its unit: dropped, as lost.
            if let Some(c) = &mut self.cur {
                c.discontinuity = true;
            }
        }
        let Some(c) = self.cur.take() else { return };
        if c.broken {
            self.pending_discontinuity = true;
            return;
        }
        if c.nals.is_empty() {
            self.pending_discontinuity |= c.discontinuity;
            return;
        }
        let key = c.nals.iter().any(|n| n[0] & 0x1f == NAL_IDR);
        out.push(VideoUnit {
            timestamp: c.timestamp,
            nals: c.nals,
            key,
            discontinuity: c.discontinuity,
        });
    }

    /// A fragmented NAL unit whose end never came: dropped, the unit marked.
    fn drop_fragment(&mut self) {
        if self.fu.take().is_some()
            && let Some(c) = &mut self.cur
        {
            c.discontinuity = true;
        }
    }

    /// Adds a whole NAL unit to the current unit, within the limits.
    fn add(&mut self, nal: Vec<u8>) -> Result<(), DepackError> {
        let limits = self.limits;
        let c = self
            .cur
            .as_mut()
            .expect("a unit is started before NALs are added");
        if c.broken {
            return Ok(());
        }
        if c.nals.len() >= limits.nals_per_au_max {
            c.broken = true;
            c.nals.clear();
            return Err(DepackError::TooManyNals(limits.nals_per_au_max));
        }
        if c.bytes + nal.len() > limits.au_bytes_max {
            c.broken = true;
            c.nals.clear();
            return Err(DepackError::TooLarge(limits.au_bytes_max));
        }
        c.bytes += nal.len();
        c.nals.push(nal);
        Ok(())
    }

    /// One RTP packet in; finished access units appended to `out`.
    pub fn push(
        &mut self,
        h: &RtpHeader,
        payload: &[u8],
        out: &mut Vec<VideoUnit>,
    ) -> Result<(), DepackError> {
        match order(self.last_seq, h.sequence) {
            Order::Old => return Ok(()),
            Order::Gap => self.lose(),
            Order::Next => {}
        }
        self.last_seq = Some(h.sequence);
        if self
            .cur
            .as_ref()
            .is_some_and(|c| c.timestamp != h.timestamp)
        {
            self.finish(out);
        }
        if self.cur.is_none() {
            self.cur = Some(Building {
                timestamp: h.timestamp,
                nals: Vec::new(),
                bytes: 0,
                discontinuity: std::mem::take(&mut self.pending_discontinuity),
                broken: false,
            });
        }
        let r = self.payload(payload);
        if r.is_err() {
            // What the packet held is lost.
            self.fu = None;
            if let Some(c) = &mut self.cur {
                c.discontinuity = true;
            }
        }
        if h.marker {
            self.finish(out);
        }
        r
    }

    fn payload(&mut self, p: &[u8]) -> Result<(), DepackError> {
        let Some(&first) = p.first() else {
            return Err(DepackError::Malformed("empty payload"));
        };
        if first & 0x80 != 0 {
            return Err(DepackError::Malformed("forbidden_zero_bit set"));
        }
        match first & 0x1f {
            0 => Err(DepackError::Malformed("NAL unit type 0")),
            1..=23 => {
                self.drop_fragment();
                self.add(p.to_vec())
            }
            STAP_A => {
                // Checked whole before anything is added: a bad length drops the packet.
                let mut at = 1;
                let mut nals = Vec::new();
                while at < p.len() {
                    let len = p
                        .get(at..at + 2)
                        .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
                        .ok_or(DepackError::Malformed("STAP-A size cut off"))?;
                    let nal = p
                        .get(at + 2..at + 2 + len)
                        .filter(|n| !n.is_empty())
                        .ok_or(DepackError::Malformed(
                            "STAP-A NAL unit runs past the packet",
                        ))?;
                    nals.push(nal);
                    at += 2 + len;
                }
                if nals.is_empty() {
                    return Err(DepackError::Malformed("empty STAP-A"));
                }
                self.drop_fragment();
                for n in nals {
                    self.add(n.to_vec())?;
                }
                Ok(())
            }
            FU_A => {
                let &hdr = p
                    .get(1)
                    .ok_or(DepackError::Malformed("FU-A without header"))?;
                let (start, end, typ) = (hdr & 0x80 != 0, hdr & 0x40 != 0, hdr & 0x1f);
                if start && end {
                    return Err(DepackError::Malformed("FU-A with start and end bits"));
                }
                if start {
                    if self.fu.is_some() {
                        // The previous fragment's end never came.
                        if let Some(c) = &mut self.cur {
                            c.discontinuity = true;
                        }
                    }
                    let mut nal = Vec::with_capacity(p.len() * 4);
                    nal.push((first & 0xe0) | typ);
                    nal.extend_from_slice(&p[2..]);
                    self.fu = Some(nal);
                } else {
                    let Some(nal) = &mut self.fu else {
                        // A middle or end whose start was lost: dropped, the unit marked
                        // (the first packets of a stream have no gap to show it).
                        if let Some(c) = &mut self.cur {
                            c.discontinuity = true;
                        }
                        return Ok(());
                    };
                    nal.extend_from_slice(&p[2..]);
                }
                let limit = self.limits.au_bytes_max;
                if self
                    .fu
                    .as_ref()
                    .is_some_and(|n| n.len() + self.cur.as_ref().map_or(0, |c| c.bytes) > limit)
                {
                    self.fu = None;
                    if let Some(c) = &mut self.cur {
                        c.broken = true;
                        c.nals.clear();
                    }
                    return Err(DepackError::TooLarge(limit));
                }
                if end && let Some(nal) = self.fu.take() {
                    self.add(nal)?;
                }
                Ok(())
            }
            t => Err(DepackError::Unsupported(t)),
        }
    }

    /// Hands out the unit in progress (the publisher stopped).
    pub fn flush(&mut self, out: &mut Vec<VideoUnit>) {
        self.finish(out);
    }
}

/// Reads `n` bits (at most 16) at bit `at` of `b`, big-endian.
fn bits(b: &[u8], at: usize, n: u8) -> Option<u32> {
    let mut v = 0u32;
    for i in 0..usize::from(n) {
        let bit = at + i;
        let byte = *b.get(bit / 8)?;
        v = (v << 1) | u32::from((byte >> (7 - bit % 8)) & 1);
    }
    Some(v)
}

/// RFC 3640 receiver (`mpeg4-generic`, the AU-header fields of the SDP).
#[derive(Debug)]
pub struct AacDepacketizer {
    size_length: u8,
    index_length: u8,
    index_delta_length: u8,
    au_bytes_max: usize,
    last_seq: Option<u16>,
    /// A fragmented AU: (timestamp, its size, the bytes so far).
    frag: Option<(u32, usize, Vec<u8>)>,
    pending_discontinuity: bool,
}

impl AacDepacketizer {
    pub fn new(
        size_length: u8,
        index_length: u8,
        index_delta_length: u8,
        au_bytes_max: usize,
    ) -> Self {
        AacDepacketizer {
            size_length,
            index_length,
            index_delta_length,
            au_bytes_max,
            last_seq: None,
            frag: None,
            pending_discontinuity: false,
        }
    }

    fn lose(&mut self) {
        self.frag = None;
        self.pending_discontinuity = true;
    }

    fn emit(&mut self, timestamp: u32, data: Vec<u8>, out: &mut Vec<AudioUnit>) {
        out.push(AudioUnit {
            timestamp,
            data,
            discontinuity: std::mem::take(&mut self.pending_discontinuity),
        });
    }

    /// One RTP packet in; whole AUs appended to `out`.
    pub fn push(
        &mut self,
        h: &RtpHeader,
        payload: &[u8],
        out: &mut Vec<AudioUnit>,
    ) -> Result<(), DepackError> {
        match order(self.last_seq, h.sequence) {
            Order::Old => return Ok(()),
            Order::Gap => self.lose(),
            Order::Next => {}
        }
        self.last_seq = Some(h.sequence);
        let r = self.payload(h, payload, out);
        if r.is_err() {
            self.lose();
        }
        r
    }

    fn payload(
        &mut self,
        h: &RtpHeader,
        p: &[u8],
        out: &mut Vec<AudioUnit>,
    ) -> Result<(), DepackError> {
        let headers_bits = p
            .get(..2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
            .ok_or(DepackError::Malformed("no AU-headers-length"))?;
        let headers = p
            .get(2..2 + headers_bits.div_ceil(8))
            .ok_or(DepackError::Malformed("AU headers run past the packet"))?;
        let mut data = &p[2 + headers_bits.div_ceil(8)..];
        let mut sizes = Vec::new();
        let mut at = 0usize;
        while at < headers_bits {
            let idx_len = if sizes.is_empty() {
                self.index_length
            } else {
                self.index_delta_length
            };
            let need = usize::from(self.size_length) + usize::from(idx_len);
            if at + need > headers_bits {
                return Err(DepackError::Malformed("an AU header cut off"));
            }
            let size = bits(headers, at, self.size_length)
                .ok_or(DepackError::Malformed("an AU header cut off"))?;
            sizes.push(size as usize);
            at += need;
        }
        if sizes.is_empty() {
            return Err(DepackError::Malformed("no AU header"));
        }
        // A fragment: one AU header naming more bytes than the packet holds (§3.2.3), or
        // the continuation of one.
        if let Some((ts, size, buf)) = &mut self.frag {
            if *ts != h.timestamp || sizes.len() != 1 || sizes[0] != *size {
                self.frag = None;
                self.pending_discontinuity = true;
            } else {
                buf.extend_from_slice(data);
                if buf.len() > *size {
                    self.frag = None;
                    return Err(DepackError::Malformed("fragments longer than their AU"));
                }
                if buf.len() == *size {
                    let (ts, _, buf) = self.frag.take().expect("checked above");
                    self.emit(ts, buf, out);
                } else if h.marker {
                    self.frag = None;
                    return Err(DepackError::Malformed("last fragment short of its AU"));
                }
                return Ok(());
            }
        }
        if sizes.len() == 1 && sizes[0] > data.len() {
            if sizes[0] > self.au_bytes_max {
                return Err(DepackError::TooLarge(self.au_bytes_max));
            }
            if h.marker {
                return Err(DepackError::Malformed("AU larger than its packet"));
            }
            self.frag = Some((h.timestamp, sizes[0], data.to_vec()));
            return Ok(());
        }
        if sizes.iter().sum::<usize>() > data.len() {
            return Err(DepackError::Malformed("AUs run past the packet"));
        }
        for (i, size) in sizes.into_iter().enumerate() {
            let (au, rest) = data.split_at(size);
            data = rest;
            if au.is_empty() {
                continue;
            }
            let ts = h
                .timestamp
                .wrapping_add(AAC_SAMPLES_PER_FRAME.wrapping_mul(i as u32));
            self.emit(ts, au.to_vec(), out);
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "depack_tests.rs"]
mod tests;
