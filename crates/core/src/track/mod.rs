//! Index tracks written beside a recording (Clockwise §3.1): a **time** track (receive time of
//! each packet, relative to the start), a **packet** track (each packet's size and media
//! offset; Clockwise's tile track) and a **frame** track (the packets that begin an independent
//! frame, for seeking).
//!
//! Pure: the file format ([`format`], specified in `docs/track-format.md`), the key-frame
//! detectors that decide what goes into the frame track ([`mpegts`], [`rtp`], [`FrameDetector`])
//! and the consistency check behind `penstock tracks --check` ([`check`]). The driver appends the
//! bytes the encoder produces and feeds the decoder what it reads.
//!
//! Here a *packet* is one received datagram, stored whole and consecutively in the media.

pub mod check;
pub mod format;
pub mod mpegts;
pub mod playback;
pub mod rtp;
pub mod segments;

pub use check::{CheckReport, Disagreement, ReadableLimit, check};
pub use format::{
    Decoded, EncodeError, FrameRecord, PacketRecord, Record, StopReason, TimeRecord, TrackBytes,
    TrackError, TrackHeader, TrackKind, TracksWriter, decode, decode_header, encode_record,
    valid_records_from,
};
pub use playback::{Playback, PlaybackError, Speed, plan_playback};

/// How the recorder decides that a packet begins an independent frame. Recorded in the frame
/// track's header so a reader knows what the entries mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameRule {
    /// Every packet is a frame start (unknown payloads: seeking works at packet granularity).
    EveryPacket,
    /// MPEG-TS: a TS packet with the random-access indicator; with `h264_idr`, also a PES start
    /// whose first TS packet holds an H.264 IDR slice or SPS (see [`mpegts`]).
    MpegTs { h264_idr: bool },
    /// RTP: a packet that follows a packet with the marker bit (the marker ends a video frame);
    /// with `h264`, only when the packet also starts an H.264 IDR or SPS (see [`rtp`]).
    Rtp { h264: bool },
}

impl FrameRule {
    /// The code stored in a track header.
    pub fn code(self) -> u8 {
        match self {
            FrameRule::EveryPacket => 0,
            FrameRule::MpegTs { h264_idr: false } => 1,
            FrameRule::MpegTs { h264_idr: true } => 2,
            FrameRule::Rtp { h264: false } => 3,
            FrameRule::Rtp { h264: true } => 4,
        }
    }

    /// `--frames auto`: the rule for a stream whose first datagram is `datagram`. MPEG-TS when
    /// it is 1..=7 whole TS packets with sync bytes (with the H.264 IDR scan), RTP (marker only:
    /// the payload type does not say which codec) when it has RTP version 2, else every packet.
    /// TS is tried first: a TS datagram starts with 0x47, which is not RTP version 2.
    pub fn detect(datagram: &[u8]) -> FrameRule {
        if mpegts::ts_packets(datagram).is_some() {
            FrameRule::MpegTs { h264_idr: true }
        } else if rtp::parse(datagram).is_some() {
            FrameRule::Rtp { h264: false }
        } else {
            FrameRule::EveryPacket
        }
    }

    /// The rule for a header code; `None` for an unknown code.
    pub fn from_code(code: u8) -> Option<FrameRule> {
        Some(match code {
            0 => FrameRule::EveryPacket,
            1 => FrameRule::MpegTs { h264_idr: false },
            2 => FrameRule::MpegTs { h264_idr: true },
            3 => FrameRule::Rtp { h264: false },
            4 => FrameRule::Rtp { h264: true },
            _ => return None,
        })
    }
}

/// Decides, packet by packet, whether a packet begins an independent frame.
///
/// Stateful only for RTP, where a frame boundary is known from the *previous* packet's marker.
#[derive(Debug, Clone)]
pub struct FrameDetector {
    rule: FrameRule,
    /// RTP: whether the next RTP packet starts a frame (true at the start of the recording:
    /// the first packet is where playback can begin at the earliest).
    rtp_frame_boundary: bool,
}

impl FrameDetector {
    /// A detector at the start of a recording.
    pub fn new(rule: FrameRule) -> FrameDetector {
        FrameDetector {
            rule,
            rtp_frame_boundary: true,
        }
    }

    /// The rule in force.
    pub fn rule(&self) -> FrameRule {
        self.rule
    }

    /// Whether `datagram` begins an independent frame. Malformed datagrams (not TS, not RTP
    /// version 2) never do, and do not disturb the RTP frame boundary.
    pub fn observe(&mut self, datagram: &[u8]) -> bool {
        match self.rule {
            FrameRule::EveryPacket => true,
            FrameRule::MpegTs { h264_idr } => mpegts::begins_independent_frame(datagram, h264_idr),
            FrameRule::Rtp { h264 } => {
                let Some(header) = rtp::parse(datagram) else {
                    return false;
                };
                let at_boundary = std::mem::replace(&mut self.rtp_frame_boundary, header.marker);
                at_boundary && (!h264 || rtp::h264_key_start(header.payload))
            }
        }
    }
}

#[cfg(test)]
mod tests;
