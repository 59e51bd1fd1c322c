//! A publisher's RTP made MPEG-TS (RTSP RECORD, docs/rtsp.md "Publishing"): the announced
//! tracks ([`super::announce`]) each get a depacketizer ([`super::depack`]), their units get
//! 90 kHz times, and [`crate::ts::mux`] writes the program.
//!
//! **Time.** RTP timestamps start at a random value per track and count at the track's
//! clock. Each track's times are counted from its first packet, extended past the 32-bit
//! wrap, converted to 90 kHz, and placed on one timeline by the arrival time of that first
//! packet (handed in by the caller, `arrival_ns` of any monotonic clock): the tracks of a
//! publisher that starts them together (ffmpeg, OBS) line up within the spacing of their
//! first packets. The timeline begins at [`TIMELINE_START_90K`], so that the PCR, which runs
//! [`crate::ts::mux::PCR_LEAD_90K`] behind, never goes below zero. RTCP sender reports are
//! not used (a later refinement: they give each track's wall-clock time exactly).
//!
//! **DTS.** RTP carries presentation times only; the DTS written is the PTS, which is right
//! for streams without B-frames (baseline profile, x264's `-bf 0`, most cameras and live
//! encoders); a stream with B-frames is muxed with DTS = PTS, which players decode but
//! report as non-monotonic DTS.
//!
//! **Losses.** Video after a loss (a unit marked `discontinuity`) is dropped until the next
//! key frame, and so is video before the first key frame: what is muxed always decodes.

use super::RtpHeader;
use super::announce::{Announced, AnnouncedCodec, asc_adts_fields};
use super::depack::{
    AacDepacketizer, AudioUnit, DepackError, DepackLimits, H264Depacketizer, VideoUnit,
};
use crate::ts::mux::{AdtsConfig, MuxConfig, MuxError, TsMuxer};

/// Where the timeline's 0 is put: 1 s (90 kHz).
pub const TIMELINE_START_90K: u64 = 90_000;

/// Why an announced session cannot be ingested, or a packet was dropped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IngestError {
    #[error("track {0}: codec {1} is not supported (H.264 and AAC are)")]
    Codec(usize, String),
    #[error("track {0}: a second {1} track (one of each is supported)")]
    Duplicate(usize, &'static str),
    #[error("track {0}: AudioSpecificConfig that ADTS cannot carry")]
    Adts(usize),
    #[error("no such track {0}")]
    NoTrack(usize),
    #[error("not an RTP packet")]
    NotRtp,
    #[error("payload type {got} on track {track}, announced {want}")]
    PayloadType { track: usize, got: u8, want: u8 },
    #[error(transparent)]
    Depack(#[from] DepackError),
    #[error(transparent)]
    Mux(#[from] MuxError),
}

/// Counts of what came in and went out.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IngestCounts {
    pub packets: u64,
    pub video_units: u64,
    pub audio_units: u64,
    /// Video units dropped while waiting for a key frame (the start, after a loss).
    pub video_skipped: u64,
    /// Units marked discontinuous (packets lost or refused before them).
    pub discontinuities: u64,
}

#[derive(Debug)]
enum Depack {
    Video(H264Depacketizer),
    Audio(AacDepacketizer),
}

#[derive(Debug)]
struct Track {
    payload_type: u8,
    clock_hz: u32,
    depack: Depack,
    /// First RTP timestamp, last extended timestamp, the first packet's arrival.
    first: Option<(u32, i64, u64)>,
}

impl Track {
    /// The 90 kHz time of RTP timestamp `ts` on the timeline starting at `start_ns`.
    fn time_90k(&mut self, ts: u32, start_ns: u64) -> u64 {
        let (first, last, arrival) = self.first.expect("set at the first packet");
        // Extended across the 32-bit wrap: the nearest value to the last one.
        let last32 = first.wrapping_add(last as u32);
        let ext = last + i64::from(ts.wrapping_sub(last32) as i32);
        self.first = Some((first, ext, arrival));
        let offset_90k = i128::from(arrival.saturating_sub(start_ns)) * 90_000 / 1_000_000_000;
        let media_90k = i128::from(ext) * 90_000 / i128::from(self.clock_hz);
        (i128::from(TIMELINE_START_90K) + offset_90k + media_90k).max(0) as u64
    }
}

/// One publisher's tracks and its program.
#[derive(Debug)]
pub struct Ingest {
    tracks: Vec<Track>,
    mux: TsMuxer,
    /// The first packet's arrival (any track): the timeline's start.
    start_ns: Option<u64>,
    /// Video waits for a key frame.
    want_key: bool,
    pub counts: IngestCounts,
    video: Vec<VideoUnit>,
    audio: Vec<AudioUnit>,
}

impl Ingest {
    /// The ingest of an announced session: H.264 and AAC, at most one of each.
    pub fn new(a: &Announced, limits: DepackLimits) -> Result<Ingest, IngestError> {
        let mut tracks = Vec::new();
        let mut cfg = MuxConfig {
            video: None,
            audio: None,
        };
        for (i, t) in a.tracks.iter().enumerate() {
            let depack = match &t.codec {
                AnnouncedCodec::H264 { parameter_sets } => {
                    if cfg.video.is_some() {
                        return Err(IngestError::Duplicate(i, "video"));
                    }
                    cfg.video = Some(parameter_sets.clone());
                    Depack::Video(H264Depacketizer::new(limits))
                }
                AnnouncedCodec::Aac {
                    config,
                    size_length,
                    index_length,
                    index_delta_length,
                } => {
                    if cfg.audio.is_some() {
                        return Err(IngestError::Duplicate(i, "audio"));
                    }
                    let (object_type, frequency_index, channels) =
                        asc_adts_fields(config).ok_or(IngestError::Adts(i))?;
                    cfg.audio = Some(AdtsConfig {
                        object_type,
                        frequency_index,
                        channels,
                    });
                    Depack::Audio(AacDepacketizer::new(
                        *size_length,
                        *index_length,
                        *index_delta_length,
                        limits.au_bytes_max,
                    ))
                }
                AnnouncedCodec::Other(name) => return Err(IngestError::Codec(i, name.clone())),
            };
            tracks.push(Track {
                payload_type: t.payload_type,
                clock_hz: t.clock_hz,
                depack,
                first: None,
            });
        }
        Ok(Ingest {
            tracks,
            mux: TsMuxer::new(cfg)?,
            start_ns: None,
            want_key: true,
            counts: IngestCounts::default(),
            video: Vec::new(),
            audio: Vec::new(),
        })
    }

    /// One RTP packet of track `track`, arrived at `arrival_ns`: the TS packets it completes
    /// appended to `out` (whole 188-byte packets). An error drops the packet (or a unit) and
    /// changes nothing else.
    pub fn handle_rtp(
        &mut self,
        track: usize,
        packet: &[u8],
        arrival_ns: u64,
        out: &mut Vec<u8>,
    ) -> Result<(), IngestError> {
        let t = self
            .tracks
            .get_mut(track)
            .ok_or(IngestError::NoTrack(track))?;
        let (h, payload) = RtpHeader::parse(packet).ok_or(IngestError::NotRtp)?;
        if h.payload_type != t.payload_type {
            return Err(IngestError::PayloadType {
                track,
                got: h.payload_type,
                want: t.payload_type,
            });
        }
        self.counts.packets += 1;
        let start = *self.start_ns.get_or_insert(arrival_ns);
        if t.first.is_none() {
            t.first = Some((h.timestamp, 0, arrival_ns));
        }
        let r = match &mut t.depack {
            Depack::Video(d) => d.push(&h, payload, &mut self.video),
            Depack::Audio(d) => d.push(&h, payload, &mut self.audio),
        };
        let mut mux_err = None;
        for u in std::mem::take(&mut self.video) {
            self.counts.discontinuities += u64::from(u.discontinuity);
            if u.discontinuity {
                self.want_key = true;
            }
            if self.want_key && !u.key {
                self.counts.video_skipped += 1;
                continue;
            }
            self.want_key = false;
            let pts = self.tracks[track].time_90k(u.timestamp, start);
            match self.mux.video(pts, pts, u.key, &u.nals, out) {
                Ok(()) => self.counts.video_units += 1,
                Err(e) => mux_err = Some(e),
            }
        }
        for u in std::mem::take(&mut self.audio) {
            self.counts.discontinuities += u64::from(u.discontinuity);
            let pts = self.tracks[track].time_90k(u.timestamp, start);
            match self.mux.audio(pts, &u.data, out) {
                Ok(()) => self.counts.audio_units += 1,
                Err(e) => mux_err = Some(e),
            }
        }
        r?;
        mux_err.map_or(Ok(()), |e| Err(e.into()))
    }

    /// The unit in progress of each video track, muxed (the publisher stopped).
    pub fn flush(&mut self, out: &mut Vec<u8>) {
        for i in 0..self.tracks.len() {
            if let Depack::Video(d) = &mut self.tracks[i].depack {
                d.flush(&mut self.video);
            }
            let Some(start) = self.start_ns else { continue };
            for u in std::mem::take(&mut self.video) {
                if (self.want_key || u.discontinuity) && !u.key {
                    continue;
                }
                let pts = self.tracks[i].time_90k(u.timestamp, start);
                if self.mux.video(pts, pts, u.key, &u.nals, out).is_ok() {
                    self.counts.video_units += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rtp::announce::{SdpLimits, read_sdp};
    use crate::rtp::mp4::{PayloadFormat, packetize};
    use crate::ts::packet::{TS_PACKET_BYTES, parse_packet};

    const SDP: &str = "v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=x\r\nt=0 0\r\nm=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\na=fmtp:96 packetization-mode=1\r\na=control:streamid=0\r\nm=audio 0 RTP/AVP 97\r\na=rtpmap:97 MPEG4-GENERIC/48000/2\r\na=fmtp:97 mode=AAC-hbr;sizelength=13;indexlength=3;indexdeltalength=3;config=1190\r\na=control:streamid=1\r\n";

    fn rtp(pt: u8, seq: u16, ts: u32, marker: bool, payload: &[u8]) -> Vec<u8> {
        let mut v = RtpHeader {
            marker,
            payload_type: pt,
            sequence: seq,
            timestamp: ts,
            ssrc: 5,
        }
        .encode()
        .to_vec();
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn video_waits_for_a_key_frame_and_times_follow_the_tracks() {
        let a = read_sdp(SDP.as_bytes(), &SdpLimits::default()).unwrap();
        let mut ing = Ingest::new(&a, DepackLimits::default()).unwrap();
        let mut out = Vec::new();
        // A P frame first: skipped.
        ing.handle_rtp(0, &rtp(96, 1, u32::MAX - 10, true, &[0x41, 1]), 0, &mut out)
            .unwrap();
        assert!(out.is_empty());
        assert_eq!(ing.counts.video_skipped, 1);
        // The key frame, with SPS/PPS in band; the RTP timestamp wraps.
        for (i, n) in [&[0x67u8, 1, 2][..], &[0x68, 3][..], &[0x65, 4, 5][..]]
            .iter()
            .enumerate()
        {
            ing.handle_rtp(
                0,
                &rtp(96, 2 + i as u16, 3590, i == 2, n),
                1_000_000,
                &mut out,
            )
            .unwrap();
        }
        // Audio 40 ms after the video's first packet, its own clock from there.
        let mut pieces = Vec::new();
        packetize(PayloadFormat::AacHbr, &[9u8; 100], 1400, &mut pieces).unwrap();
        let mut pl = pieces[0].prefix().to_vec();
        pl.extend_from_slice(&[9u8; 100]);
        ing.handle_rtp(1, &rtp(97, 7, 5000, true, &pl), 40_000_000, &mut out)
            .unwrap();
        ing.handle_rtp(
            1,
            &rtp(97, 8, 5000 + 48_000, true, &pl),
            41_000_000,
            &mut out,
        )
        .unwrap();
        assert_eq!(out.len() % TS_PACKET_BYTES, 0);
        let mut pts = Vec::new();
        for p in out.chunks(TS_PACKET_BYTES) {
            let p = parse_packet(p.try_into().unwrap()).unwrap();
            if p.payload_unit_start && p.pid >= 0x100 && p.pid < 0x1000 {
                pts.push((
                    p.pid,
                    crate::ts::mux::read_timestamp(&p.payload[9..]).unwrap(),
                ));
            }
        }
        assert_eq!(
            pts,
            [
                (0x100, TIMELINE_START_90K + 3601),
                (0x101, TIMELINE_START_90K + 3600),
                (0x101, TIMELINE_START_90K + 3600 + 90_000)
            ]
        );
        assert_eq!(ing.counts.video_units, 1);
        assert_eq!(ing.counts.audio_units, 2);
        // Wrong payload type, not RTP, no such track: refused, nothing written.
        let n = out.len();
        assert!(matches!(
            ing.handle_rtp(0, &rtp(97, 9, 0, true, &[0x41]), 0, &mut out),
            Err(IngestError::PayloadType { .. })
        ));
        assert_eq!(
            ing.handle_rtp(0, b"xx", 0, &mut out),
            Err(IngestError::NotRtp)
        );
        assert_eq!(
            ing.handle_rtp(5, &rtp(96, 9, 0, true, &[0x41]), 0, &mut out),
            Err(IngestError::NoTrack(5))
        );
        assert_eq!(out.len(), n);
    }

    #[test]
    fn unsupported_codecs_are_named() {
        let sdp = SDP.replace("MPEG4-GENERIC/48000/2", "opus/48000/2");
        let a = read_sdp(sdp.as_bytes(), &SdpLimits::default()).unwrap();
        assert_eq!(
            Ingest::new(&a, DepackLimits::default()).err(),
            Some(IngestError::Codec(1, "OPUS".into()))
        );
    }
}
