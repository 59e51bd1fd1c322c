//! Playback with the original timing (`penstock stream REC DST --timing tracks`): the unit plan
//! of a recording, from its time and packet tracks, starting at a key frame.
//!
//! Unit `n` of the plan is readable packet `first + n`: its size from the packet track, its
//! deadline the packet's receive time minus the first one's, divided by the speed. The stream's
//! bytes are the media from the first packet's offset, consecutive. `--from TIME` starts at the
//! last independent frame (frame track) received at or before `TIME`, so a decoder can start
//! there.

use crate::schedule::UnitPlan;

use super::format::{FrameRecord, PacketRecord, TimeRecord};

/// How much faster than recorded playback runs: an exact fraction `num / den`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Speed {
    num: u64,
    den: u64,
}

/// Slowest and fastest speeds accepted (1/1000 and 1000): beyond them a recording's deadlines
/// would be days apart or all due at once.
pub const SPEED_MAX: u64 = 1000;

impl Speed {
    /// The recorded timing.
    pub const NORMAL: Speed = Speed { num: 1, den: 1 };

    /// Parses `2`, `0.5`, `1.25` or `1.25x`, exactly.
    pub fn parse(s: &str) -> Result<Speed, PlaybackError> {
        let bad = || PlaybackError::Speed(s.to_string());
        let t = s.trim();
        let t = t.strip_suffix('x').unwrap_or(t);
        let (int, frac) = t.split_once('.').unwrap_or((t, ""));
        if int.is_empty() && frac.is_empty()
            || frac.len() > 6
            || !int.chars().chain(frac.chars()).all(|c| c.is_ascii_digit())
        {
            return Err(bad());
        }
        let den = 10u64.pow(frac.len() as u32);
        let int: u64 = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| bad())?
        };
        let frac: u64 = if frac.is_empty() {
            0
        } else {
            frac.parse().map_err(|_| bad())?
        };
        let num = int
            .checked_mul(den)
            .and_then(|n| n.checked_add(frac))
            .ok_or_else(bad)?;
        // num/den within [1/SPEED_MAX, SPEED_MAX], compared exactly.
        if num == 0 || num * SPEED_MAX < den || num > SPEED_MAX * den {
            return Err(bad());
        }
        Ok(Speed { num, den })
    }

    /// `num / den` when it lies within [1/[`SPEED_MAX`], [`SPEED_MAX`]] (`den` above 0).
    pub fn from_ratio(num: u64, den: u64) -> Option<Speed> {
        let ok = den > 0
            && num > 0
            && u128::from(num) * u128::from(SPEED_MAX) >= u128::from(den)
            && u128::from(num) <= u128::from(SPEED_MAX) * u128::from(den);
        ok.then_some(Speed { num, den })
    }

    pub fn num(self) -> u64 {
        self.num
    }

    pub fn den(self) -> u64 {
        self.den
    }

    /// Recorded (media) time of `ns` played at this speed, rounded down: the inverse of
    /// [`Speed::scale_ns`] (within a nanosecond per unit of `num`).
    pub fn media_ns(self, ns: u64) -> u64 {
        let media = u128::from(ns) * u128::from(self.num) / u128::from(self.den);
        u64::try_from(media).unwrap_or(u64::MAX)
    }

    /// `ns` of recorded time at this speed, rounded up (a unit is never due early).
    pub fn scale_ns(self, ns: u64) -> u64 {
        let scaled = (u128::from(ns) * u128::from(self.den)).div_ceil(u128::from(self.num));
        u64::try_from(scaled).unwrap_or(u64::MAX)
    }
}

/// Why a recording cannot be played back as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlaybackError {
    #[error("invalid speed {0:?}: expected a number from 0.001 to 1000 such as 2 or 0.5")]
    Speed(String),
    #[error("the recording has no readable packet")]
    Empty,
    #[error(
        "no independent frame at or before {from_ns} ns (the first is at {first_frame_ns:?} ns; the frame track has {frames} readable entries)"
    )]
    NoFrameBefore {
        from_ns: u64,
        first_frame_ns: Option<u64>,
        frames: usize,
    },
}

/// What to send: the media bytes `media_offset_bytes .. + media_bytes`, cut as `units`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Playback {
    /// Index of the first packet sent.
    pub first_packet: u64,
    pub media_offset_bytes: u64,
    pub media_bytes: u64,
    /// Receive time of the first packet sent (ns after the recording's start).
    pub start_time_ns: u64,
    pub units: Vec<UnitPlan>,
}

/// The plan for packets `0 .. readable_packets` (from [`super::check`]), from the start or from
/// the independent frame at or before `from_ns`.
pub fn plan_playback(
    time: &[TimeRecord],
    packets: &[PacketRecord],
    frames: &[FrameRecord],
    readable_packets: u64,
    from_ns: Option<u64>,
    speed: Speed,
) -> Result<Playback, PlaybackError> {
    let readable = usize::try_from(readable_packets)
        .unwrap_or(usize::MAX)
        .min(time.len())
        .min(packets.len());
    if readable == 0 {
        return Err(PlaybackError::Empty);
    }
    let first = match from_ns {
        None => 0,
        Some(from_ns) => {
            let readable_frames: Vec<&FrameRecord> = frames
                .iter()
                .take_while(|f| (f.packet_index as usize) < readable)
                .collect();
            let at_or_before = readable_frames
                .iter()
                .rev()
                .find(|f| time[f.packet_index as usize].time_ns <= from_ns);
            match at_or_before {
                Some(f) => f.packet_index as usize,
                None => {
                    return Err(PlaybackError::NoFrameBefore {
                        from_ns,
                        first_frame_ns: readable_frames
                            .first()
                            .map(|f| time[f.packet_index as usize].time_ns),
                        frames: readable_frames.len(),
                    });
                }
            }
        }
    };
    let t0 = time[first].time_ns;
    let units: Vec<UnitPlan> = (first..readable)
        .map(|i| UnitPlan {
            // Times never decrease in a readable prefix (the check verified it).
            offset_ns: speed.scale_ns(time[i].time_ns.saturating_sub(t0)),
            size_bytes: packets[i].size_bytes,
        })
        .collect();
    let media_offset_bytes = packets[first].media_offset_bytes;
    let last = &packets[readable - 1];
    let media_bytes = last.media_offset_bytes + u64::from(last.size_bytes) - media_offset_bytes;
    Ok(Playback {
        first_packet: first as u64,
        media_offset_bytes,
        media_bytes,
        start_time_ns: t0,
        units,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::track::format::TrackKind;
    use crate::track::{TrackBytes, TracksWriter, decode};

    fn recording(
        packets: &[(u64, u32, bool)],
    ) -> (Vec<TimeRecord>, Vec<PacketRecord>, Vec<FrameRecord>) {
        let mut w = TracksWriter::new();
        let mut out = TrackBytes::default();
        for &(t, s, f) in packets {
            w.push(t, s, f, &mut out).unwrap();
        }
        let with_header = |kind: TrackKind, body: &[u8]| {
            let mut b = crate::track::TrackHeader {
                kind,
                start_wall_ns: 0,
                frame_rule: crate::track::FrameRule::EveryPacket,
                flags: 0,
            }
            .encode()
            .to_vec();
            b.extend_from_slice(body);
            b
        };
        (
            decode(&with_header(TrackKind::Time, &out.time), 1000)
                .unwrap()
                .records,
            decode(&with_header(TrackKind::Packet, &out.packet), 1000)
                .unwrap()
                .records,
            decode(&with_header(TrackKind::Frame, &out.frame), 1000)
                .unwrap()
                .records,
        )
    }

    #[test]
    fn speed_parses_exactly_and_refuses_nonsense() {
        assert_eq!(Speed::parse("1").unwrap(), Speed::NORMAL);
        assert_eq!(Speed::parse("2").unwrap().scale_ns(1000), 500);
        assert_eq!(Speed::parse("0.5x").unwrap().scale_ns(1000), 2000);
        assert_eq!(Speed::parse("3").unwrap().scale_ns(1000), 334); // rounded up
        for bad in ["", "0", "-1", "abc", "1.2.3", "1001", "0.0009", "1e3", "."] {
            assert!(Speed::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(Speed::parse("1000").is_ok() && Speed::parse("0.001").is_ok());
    }

    #[test]
    fn whole_recording_keeps_sizes_and_relative_times() {
        let (t, p, f) = recording(&[(100, 10, true), (150, 20, false), (400, 5, true)]);
        let pb = plan_playback(&t, &p, &f, 3, None, Speed::NORMAL).unwrap();
        assert_eq!(pb.first_packet, 0);
        assert_eq!((pb.media_offset_bytes, pb.media_bytes), (0, 35));
        let got: Vec<(u64, u32)> = pb
            .units
            .iter()
            .map(|u| (u.offset_ns, u.size_bytes))
            .collect();
        assert_eq!(got, vec![(0, 10), (50, 20), (300, 5)]);
    }

    #[test]
    fn from_starts_at_the_frame_at_or_before_and_speed_scales() {
        let (t, p, f) = recording(&[
            (0, 10, true),
            (100, 10, false),
            (200, 7, true),
            (300, 3, false),
            (400, 4, false),
        ]);
        let pb = plan_playback(&t, &p, &f, 5, Some(350), Speed::parse("2").unwrap()).unwrap();
        assert_eq!(pb.first_packet, 2);
        assert_eq!((pb.media_offset_bytes, pb.media_bytes), (20, 14));
        assert_eq!(pb.start_time_ns, 200);
        let offsets: Vec<u64> = pb.units.iter().map(|u| u.offset_ns).collect();
        assert_eq!(offsets, vec![0, 50, 100]);
        // Exactly at a frame's time starts there.
        assert_eq!(
            plan_playback(&t, &p, &f, 5, Some(200), Speed::NORMAL)
                .unwrap()
                .first_packet,
            2
        );
        // Readable prefix bounds both the packets and the frames considered.
        let pb = plan_playback(&t, &p, &f, 2, Some(350), Speed::NORMAL).unwrap();
        assert_eq!((pb.first_packet, pb.units.len()), (0, 2));
    }

    #[test]
    fn no_frame_before_from_is_an_error_not_a_guess() {
        let (t, p, f) = recording(&[(0, 10, false), (100, 10, true)]);
        assert_eq!(
            plan_playback(&t, &p, &f, 2, Some(50), Speed::NORMAL),
            Err(PlaybackError::NoFrameBefore {
                from_ns: 50,
                first_frame_ns: Some(100),
                frames: 1
            })
        );
        assert_eq!(
            plan_playback(&t, &p, &f, 0, None, Speed::NORMAL),
            Err(PlaybackError::Empty)
        );
    }
}
