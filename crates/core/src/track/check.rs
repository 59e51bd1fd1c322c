//! Do the tracks agree with each other and with the media, and up to where? (`penstock tracks
//! --check`.)
//!
//! After a crash the three tracks and the media end at different points: each was appended
//! independently and only what was synced is sure to be there. The rule:
//!
//! - The time and packet tracks must agree record by record: record `i` of each names packet
//!   `i`; the packet track's offsets are the running sum of its sizes; times never decrease.
//!   Where one is longer, its extra records are an unsynced tail, not an error.
//! - A packet is covered by the media when `offset + size ≤ media_len`. Media bytes past the last
//!   indexed packet are an unsynced tail too.
//! - Every frame record names a packet and carries that packet's offset, in increasing packet
//!   order. Frame records past the readable packets are a tail. A missing frame record cannot be
//!   detected (not every packet begins a frame); it only makes seeking land earlier.
//!
//! The recording is **readable up to** the longest prefix of packets that the time track, the
//! packet track and the media all cover with no disagreement. A *disagreement* (anything but a
//! tail) means the files do not belong together or were corrupted after a good checksum was
//! written; the check reports the first one and the prefix before it is still readable.

use std::fmt;

use super::format::{FrameRecord, PacketRecord, TimeRecord, TrackKind};

/// What ended the readable prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadableLimit {
    /// The time track, packet track and media all end at the same packet.
    Complete,
    /// The time track ends first (the packet track has more records).
    TimeTrack,
    /// The packet track ends first (the time track has more records).
    PacketTrack,
    /// Both tracks end at the same packet; the media holds more bytes.
    Tracks,
    /// The media ends before the next packet the tracks describe.
    Media,
    /// A disagreement; see [`CheckReport::disagreement`].
    Disagreement,
}

/// The first disagreement found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Disagreement {
    /// Record `record` of the `track` track names packet `packet_index`, not packet `record`.
    PacketIndex {
        track: TrackKind,
        record: u64,
        packet_index: u64,
    },
    /// The packet track puts packet `packet` at `media_offset_bytes`; the sizes before it sum to
    /// `expected_bytes`.
    Offset {
        packet: u64,
        media_offset_bytes: u64,
        expected_bytes: u64,
    },
    /// Packet `packet` was received at `time_ns`, before the previous packet's `previous_ns`.
    TimeDecreased {
        packet: u64,
        time_ns: u64,
        previous_ns: u64,
    },
    /// Frame record `record` names packet `packet_index`, not after the previous frame's packet.
    FrameOrder { record: u64, packet_index: u64 },
    /// Frame record `record` puts packet `packet_index` at `media_offset_bytes`; the packet
    /// track says it starts at `packet_offset_bytes`.
    FrameOffset {
        record: u64,
        packet_index: u64,
        media_offset_bytes: u64,
        packet_offset_bytes: u64,
    },
}

impl fmt::Display for Disagreement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Disagreement::PacketIndex {
                track,
                record,
                packet_index,
            } => {
                write!(
                    f,
                    "{track} track record {record} names packet {packet_index}"
                )
            }
            Disagreement::Offset {
                packet,
                media_offset_bytes,
                expected_bytes,
            } => write!(
                f,
                "packet {packet} is at media offset {media_offset_bytes}, the sizes before it sum to {expected_bytes}"
            ),
            Disagreement::TimeDecreased {
                packet,
                time_ns,
                previous_ns,
            } => {
                write!(
                    f,
                    "packet {packet} received at {time_ns} ns, before the previous packet ({previous_ns} ns)"
                )
            }
            Disagreement::FrameOrder {
                record,
                packet_index,
            } => {
                write!(
                    f,
                    "frame record {record} names packet {packet_index}, not after the previous frame"
                )
            }
            Disagreement::FrameOffset {
                record,
                packet_index,
                media_offset_bytes,
                packet_offset_bytes,
            } => write!(
                f,
                "frame record {record}: packet {packet_index} at {media_offset_bytes}, but the packet starts at {packet_offset_bytes}"
            ),
        }
    }
}

/// What [`check`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckReport {
    pub time_records: u64,
    pub packet_records: u64,
    pub frame_records: u64,
    pub media_len_bytes: u64,
    /// Packets readable: all tracks and the media cover packets `0..readable_packets`.
    pub readable_packets: u64,
    /// Media bytes those packets occupy (the length to truncate the media to).
    pub readable_media_bytes: u64,
    /// Frame records naming readable packets.
    pub readable_frames: u64,
    /// Receive time of the last readable packet (0 when none is).
    pub readable_time_ns: u64,
    pub limit: ReadableLimit,
    pub disagreement: Option<Disagreement>,
}

impl CheckReport {
    /// No disagreement: the tracks and media agree, apart from unsynced tails.
    pub fn is_clean(&self) -> bool {
        self.disagreement.is_none()
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.disagreement {
            None => write!(f, "clean: ")?,
            Some(d) => write!(f, "DISAGREE ({d}): ")?,
        }
        write!(
            f,
            "readable up to packet {} ({} media bytes, {} ns, {} frames); tracks: {} time, {} packet, {} frame records; media {} bytes; limited by {:?}",
            self.readable_packets,
            self.readable_media_bytes,
            self.readable_time_ns,
            self.readable_frames,
            self.time_records,
            self.packet_records,
            self.frame_records,
            self.media_len_bytes,
            self.limit
        )
    }
}

/// Checks decoded tracks (the good prefixes the decoder returned) against each other and the
/// media length. See the module documentation for the rules.
pub fn check(
    time: &[TimeRecord],
    packets: &[PacketRecord],
    frames: &[FrameRecord],
    media_len_bytes: u64,
) -> CheckReport {
    let both = time.len().min(packets.len());
    let mut readable = 0usize;
    let mut offset_bytes = 0u64;
    let mut disagreement = None;
    let mut media_cut = false;
    for i in 0..both {
        let (t, p, index) = (time[i], packets[i], i as u64);
        if t.packet_index != index {
            disagreement = Some(Disagreement::PacketIndex {
                track: TrackKind::Time,
                record: index,
                packet_index: t.packet_index,
            });
            break;
        }
        if p.packet_index != index {
            disagreement = Some(Disagreement::PacketIndex {
                track: TrackKind::Packet,
                record: index,
                packet_index: p.packet_index,
            });
            break;
        }
        if p.media_offset_bytes != offset_bytes {
            disagreement = Some(Disagreement::Offset {
                packet: index,
                media_offset_bytes: p.media_offset_bytes,
                expected_bytes: offset_bytes,
            });
            break;
        }
        if i > 0 && t.time_ns < time[i - 1].time_ns {
            disagreement = Some(Disagreement::TimeDecreased {
                packet: index,
                time_ns: t.time_ns,
                previous_ns: time[i - 1].time_ns,
            });
            break;
        }
        match offset_bytes.checked_add(u64::from(p.size_bytes)) {
            Some(end) if end <= media_len_bytes => offset_bytes = end,
            _ => {
                media_cut = true;
                break;
            }
        }
        readable = i + 1;
    }

    let verified = readable;
    let mut readable_frames = 0u64;
    let mut previous: Option<u64> = None;
    for (r, f) in frames.iter().enumerate() {
        if f.packet_index >= readable as u64 {
            break;
        }
        let record = r as u64;
        let found = if previous.is_some_and(|q| f.packet_index <= q) {
            Some(Disagreement::FrameOrder {
                record,
                packet_index: f.packet_index,
            })
        } else {
            // f.packet_index < readable ≤ packets.len().
            let packet_offset_bytes = packets[f.packet_index as usize].media_offset_bytes;
            (f.media_offset_bytes != packet_offset_bytes).then_some(Disagreement::FrameOffset {
                record,
                packet_index: f.packet_index,
                media_offset_bytes: f.media_offset_bytes,
                packet_offset_bytes,
            })
        };
        if let Some(d) = found {
            // Earlier than any packet disagreement (that one is at packet `readable`).
            disagreement = Some(d);
            readable = f.packet_index as usize;
            break;
        }
        readable_frames += 1;
        previous = Some(f.packet_index);
    }

    let readable_media_bytes = if readable < verified {
        // Cut back by a frame disagreement: packet `readable` was verified above, its offset is
        // the sum of the sizes before it.
        packets[readable].media_offset_bytes
    } else {
        offset_bytes
    };
    let limit = if disagreement.is_some() {
        ReadableLimit::Disagreement
    } else if media_cut {
        ReadableLimit::Media
    } else if time.len() < packets.len() {
        ReadableLimit::TimeTrack
    } else if packets.len() < time.len() {
        ReadableLimit::PacketTrack
    } else if media_len_bytes > readable_media_bytes {
        ReadableLimit::Tracks
    } else {
        ReadableLimit::Complete
    };
    CheckReport {
        time_records: time.len() as u64,
        packet_records: packets.len() as u64,
        frame_records: frames.len() as u64,
        media_len_bytes,
        readable_packets: readable as u64,
        readable_media_bytes,
        readable_frames,
        readable_time_ns: readable.checked_sub(1).map_or(0, |i| time[i].time_ns),
        limit,
        disagreement,
    }
}
