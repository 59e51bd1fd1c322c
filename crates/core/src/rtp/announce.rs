//! The SDP a publisher announces (RTSP ANNOUNCE, RFC 2326 §10.3; RFC 4566): its `m=` lines
//! with their `a=rtpmap`, `a=fmtp` and `a=control`, read into what the depacketizers
//! ([`super::depack`]) and the TS muxer ([`crate::ts::mux`]) need — H.264 (RFC 6184: the
//! `sprop-parameter-sets`, `packetization-mode`) and AAC (RFC 3640 `mpeg4-generic`: `config`,
//! `sizelength`, `indexlength`, `indexdeltalength`). Other tracks are kept as
//! [`AnnouncedCodec::Other`] with their encoding name, for the caller to refuse by name.
//!
//! Parsed with `sdp-types` (the line grammar); the attribute values are read here. Bounded
//! by [`SdpLimits`]: the body's bytes and the number of `m=` lines.

use base64::Engine as _;

/// Limits of [`read_sdp`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SdpLimits {
    /// An SDP body larger than this is refused.
    pub bytes_max: usize,
    /// More `m=` lines than this are refused.
    pub tracks_max: usize,
}

impl Default for SdpLimits {
    fn default() -> Self {
        SdpLimits {
            bytes_max: 8192,
            tracks_max: 4,
        }
    }
}

/// Why an announced SDP cannot be read (RTSP 400, or 415 for [`SdpError::Codec`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SdpError {
    #[error("SDP of {0} bytes, more than the {1} allowed")]
    TooLarge(usize, usize),
    #[error("not an SDP session description: {0}")]
    Syntax(String),
    #[error("{0} tracks (m= lines), more than the {1} allowed")]
    TooManyTracks(usize, usize),
    #[error("no track (m= line) in the SDP")]
    NoTrack,
    #[error("track {track}: {what}")]
    Track { track: usize, what: String },
}

/// A track's codec as announced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnnouncedCodec {
    /// H.264 (RFC 6184), packetization mode 0 or 1; the parameter sets of
    /// `sprop-parameter-sets` (SPS and PPS NAL units, without start codes), possibly none
    /// (then they come in band).
    H264 { parameter_sets: Vec<Vec<u8>> },
    /// AAC in `mpeg4-generic` (RFC 3640), the AU-header field widths of its fmtp.
    Aac {
        /// The AudioSpecificConfig (`config=` in hex).
        config: Vec<u8>,
        size_length: u8,
        index_length: u8,
        index_delta_length: u8,
    },
    /// Anything else: the rtpmap's encoding name (or the static payload type's number).
    Other(String),
}

/// One `m=` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnouncedTrack {
    /// `video`, `audio`, …
    pub media: String,
    pub payload_type: u8,
    /// The RTP clock (the rtpmap's rate).
    pub clock_hz: u32,
    pub codec: AnnouncedCodec,
    /// `a=control`, as written (relative or absolute), when given.
    pub control: Option<String>,
}

/// What an ANNOUNCE described.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announced {
    pub tracks: Vec<AnnouncedTrack>,
}

impl Announced {
    /// The index of the track a SETUP URL names: the track whose `a=control` the URL ends
    /// with (an absolute control equals it), or with one track and no control, that one.
    pub fn track_of(&self, url: &str) -> Option<usize> {
        let url = url.split('?').next().unwrap_or(url);
        let url = url.trim_end_matches('/');
        let by_control = self.tracks.iter().position(|t| {
            t.control.as_deref().is_some_and(|c| {
                let c = c.trim_end_matches('/');
                !c.is_empty()
                    && c != "*"
                    && (url == c || url.ends_with(&format!("/{}", c.trim_start_matches('/'))))
            })
        });
        by_control.or_else(|| (self.tracks.len() == 1).then_some(0))
    }
}

/// The number (from 1) of the first line that is not `K=VALUE` with a one-byte key, as
/// sdp-types' line reader splits them (on `\n`, a `\r` before it dropped; empty lines
/// skipped). sdp-types 0.1.8 panics (an `assert_eq!` in `Media::parse`, found by the
/// `rtp_ingest` fuzz target) when such a line is followed by others: its peekable reader
/// drops the error and hands the next line to a parser that expects `m=`. Refusing every such
/// line first means that path is never taken.
fn malformed_line(body: &[u8]) -> Option<usize> {
    let mut pieces = body.split(|&b| b == b'\n').peekable();
    let mut n = 0;
    while let Some(mut line) = pieces.next() {
        n += 1;
        if pieces.peek().is_some()
            && let Some(l) = line.strip_suffix(b"\r")
        {
            line = l;
        }
        if !line.is_empty() && (line.len() < 2 || line[1] != b'=' || line[0] == b'=') {
            return Some(n);
        }
    }
    None
}

/// Reads an announced SDP.
pub fn read_sdp(body: &[u8], limits: &SdpLimits) -> Result<Announced, SdpError> {
    if body.len() > limits.bytes_max {
        return Err(SdpError::TooLarge(body.len(), limits.bytes_max));
    }
    if let Some(n) = malformed_line(body) {
        return Err(SdpError::Syntax(format!(
            "line {n} is not in key=value form (one-letter key)"
        )));
    }
    let session =
        sdp_types::Session::parse(body).map_err(|e| SdpError::Syntax(format!("{e:?}")))?;
    if session.medias.len() > limits.tracks_max {
        return Err(SdpError::TooManyTracks(
            session.medias.len(),
            limits.tracks_max,
        ));
    }
    if session.medias.is_empty() {
        return Err(SdpError::NoTrack);
    }
    let tracks = session
        .medias
        .iter()
        .enumerate()
        .map(|(i, m)| track(m).map_err(|what| SdpError::Track { track: i, what }))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Announced { tracks })
}

fn attr<'a>(m: &'a sdp_types::Media, name: &str, pt: u8) -> Option<&'a str> {
    m.attributes.iter().find_map(|a| {
        if !a.attribute.eq_ignore_ascii_case(name) {
            return None;
        }
        let v = a.value.as_deref()?.trim();
        let (p, rest) = v.split_once(char::is_whitespace).unwrap_or((v, ""));
        (p.parse::<u8>().ok() == Some(pt)).then_some(rest.trim())
    })
}

/// `key=value` pairs of an fmtp value, keys lowercase.
fn fmtp_params(v: &str) -> Vec<(String, String)> {
    v.split(';')
        .filter_map(|p| {
            let (k, v) = p.trim().split_once('=')?;
            Some((k.trim().to_ascii_lowercase(), v.trim().to_string()))
        })
        .collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn track(m: &sdp_types::Media) -> Result<AnnouncedTrack, String> {
    let pt: u8 = m
        .fmt
        .split_whitespace()
        .next()
        .and_then(|f| f.parse().ok())
        .filter(|&p| p < 128)
        .ok_or_else(|| format!("m={} has no payload type in {:?}", m.media, m.fmt))?;
    if !m.proto.to_ascii_uppercase().starts_with("RTP/AVP") {
        return Err(format!("transport protocol {:?} is not RTP/AVP", m.proto));
    }
    let control = m
        .attributes
        .iter()
        .find(|a| a.attribute.eq_ignore_ascii_case("control"))
        .and_then(|a| a.value.clone());
    let Some(rtpmap) = attr(m, "rtpmap", pt) else {
        return Ok(AnnouncedTrack {
            media: m.media.clone(),
            payload_type: pt,
            clock_hz: 90_000,
            codec: AnnouncedCodec::Other(format!("payload type {pt}")),
            control,
        });
    };
    let mut parts = rtpmap.split('/');
    let name = parts.next().unwrap_or("").trim().to_ascii_uppercase();
    let clock_hz: u32 = parts
        .next()
        .and_then(|r| r.trim().parse().ok())
        .filter(|&r| r > 0)
        .ok_or_else(|| format!("rtpmap {rtpmap:?} without a clock rate"))?;
    let params = attr(m, "fmtp", pt).map(fmtp_params).unwrap_or_default();
    let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let codec = match name.as_str() {
        "H264" => {
            if let Some(mode) = get("packetization-mode")
                && mode != "0"
                && mode != "1"
            {
                return Err(format!(
                    "H.264 packetization-mode {mode} (interleaved) is not supported: 0 or 1"
                ));
            }
            let mut parameter_sets = Vec::new();
            if let Some(sprop) = get("sprop-parameter-sets") {
                for s in sprop.split(',').filter(|s| !s.is_empty()) {
                    let set = base64::engine::general_purpose::STANDARD
                        .decode(s.trim())
                        .map_err(|e| format!("sprop-parameter-sets {s:?}: {e}"))?;
                    if set.is_empty() {
                        return Err("an empty parameter set".into());
                    }
                    parameter_sets.push(set);
                }
            }
            AnnouncedCodec::H264 { parameter_sets }
        }
        "MPEG4-GENERIC" => {
            let mode = get("mode").unwrap_or("");
            if !mode.eq_ignore_ascii_case("AAC-hbr") && !mode.eq_ignore_ascii_case("AAC-lbr") {
                return Err(format!(
                    "mpeg4-generic mode {mode:?}: AAC-hbr or AAC-lbr is supported"
                ));
            }
            let config = get("config")
                .and_then(unhex)
                .filter(|c| c.len() >= 2)
                .ok_or("mpeg4-generic without a config (AudioSpecificConfig in hex)")?;
            let width = |k: &str, default: u8| -> Result<u8, String> {
                match get(k) {
                    None => Ok(default),
                    Some(v) => v
                        .parse::<u8>()
                        .ok()
                        .filter(|&n| n <= 16)
                        .ok_or_else(|| format!("{k}={v}: want 0..=16")),
                }
            };
            let size_length = width("sizelength", 0)?;
            if size_length == 0 {
                return Err("mpeg4-generic without sizelength".into());
            }
            AnnouncedCodec::Aac {
                config,
                size_length,
                index_length: width("indexlength", 0)?,
                index_delta_length: width("indexdeltalength", 0)?,
            }
        }
        _ => AnnouncedCodec::Other(name),
    };
    Ok(AnnouncedTrack {
        media: m.media.clone(),
        payload_type: pt,
        clock_hz,
        codec,
        control,
    })
}

/// The fields of an AudioSpecificConfig an ADTS header repeats: (object type, sampling
/// frequency index, channel configuration); `None` when the config names an escape value
/// ADTS cannot carry (object type 31 or above 4, an explicit frequency).
pub fn asc_adts_fields(asc: &[u8]) -> Option<(u8, u8, u8)> {
    let bits = u16::from_be_bytes([*asc.first()?, *asc.get(1)?]);
    let aot = (bits >> 11) as u8;
    let freq_index = ((bits >> 7) & 0xf) as u8;
    let ch = ((bits >> 3) & 0xf) as u8;
    // ADTS's 2-bit profile is object type − 1: Main, LC, SSR, LTP.
    ((1..=4).contains(&aot) && freq_index < 13 && ch <= 7).then_some((aot, freq_index, ch))
}

#[cfg(test)]
mod tests {
    /// The `rtp_ingest` fuzz target's find: sdp-types panicked on a malformed line followed by
    /// another; now a syntax error naming the line.
    #[test]
    fn a_malformed_line_before_others_is_refused_not_panicked_on() {
        let crash = b"v=0\nv\x7f\xff\xff\xff\xff\xff\xff\xf8=2\xa8=0\xff\xff\xff\xff\xff\xff\xff\xff\n\nv=2\xa8";
        let e = super::read_sdp(crash, &super::SdpLimits::default()).unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        for bad in [
            &b"v=0\r\nno equals\r\nm=video 0 RTP/AVP 96\r\n"[..],
            b"v=0\n=x\nm=a\n",
            b"v=0\nab=c\nz=1\n",
        ] {
            assert!(super::read_sdp(bad, &super::SdpLimits::default()).is_err());
        }
        assert_eq!(
            super::malformed_line(b"v=0\r\n\r\nm=video 0 RTP/AVP 96\r\n"),
            None
        );
    }

    use super::*;

    const FFMPEG_SDP: &str = "v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=No Name\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\na=tool:libavformat 59.27.100\r\nm=video 0 RTP/AVP 96\r\nb=AS:200\r\na=rtpmap:96 H264/90000\r\na=fmtp:96 packetization-mode=1; sprop-parameter-sets=Z2QADKzZQUH7ARAAAAMAEAAAAwMg8UKZYA==,aOvjyyLA; profile-level-id=64000C\r\na=control:streamid=0\r\nm=audio 0 RTP/AVP 97\r\nb=AS:128\r\na=rtpmap:97 MPEG4-GENERIC/44100/2\r\na=fmtp:97 profile-level-id=1;mode=AAC-hbr;sizelength=13;indexlength=3;indexdeltalength=3; config=1210\r\na=control:streamid=1\r\n";

    #[test]
    fn ffmpegs_announce_is_read() {
        let a = read_sdp(FFMPEG_SDP.as_bytes(), &SdpLimits::default()).unwrap();
        assert_eq!(a.tracks.len(), 2);
        let v = &a.tracks[0];
        assert_eq!((v.payload_type, v.clock_hz), (96, 90_000));
        let AnnouncedCodec::H264 { parameter_sets } = &v.codec else {
            panic!("{v:?}")
        };
        assert_eq!(parameter_sets.len(), 2);
        assert_eq!(parameter_sets[0][0] & 0x1f, 7);
        assert_eq!(parameter_sets[1][0] & 0x1f, 8);
        let au = &a.tracks[1];
        assert_eq!((au.payload_type, au.clock_hz), (97, 44_100));
        assert_eq!(
            au.codec,
            AnnouncedCodec::Aac {
                config: vec![0x12, 0x10],
                size_length: 13,
                index_length: 3,
                index_delta_length: 3
            }
        );
        assert_eq!(asc_adts_fields(&[0x12, 0x10]), Some((2, 4, 2)));
        assert_eq!(a.track_of("rtsp://h:1/cam/streamid=1"), Some(1));
        assert_eq!(a.track_of("rtsp://h:1/cam/streamid=0?x=1"), Some(0));
        assert_eq!(a.track_of("rtsp://h:1/cam/streamid=7"), None);
    }

    #[test]
    fn bad_sdps_are_refused_with_a_reason() {
        let l = SdpLimits::default();
        assert!(matches!(
            read_sdp(b"hello world", &l),
            Err(SdpError::Syntax(_))
        ));
        assert!(matches!(
            read_sdp(
                FFMPEG_SDP.as_bytes(),
                &SdpLimits {
                    bytes_max: 100,
                    ..l
                }
            ),
            Err(SdpError::TooLarge(..))
        ));
        assert!(matches!(
            read_sdp(FFMPEG_SDP.as_bytes(), &SdpLimits { tracks_max: 1, ..l }),
            Err(SdpError::TooManyTracks(2, 1))
        ));
        let no_config = FFMPEG_SDP.replace("; config=1210", "");
        assert!(matches!(
            read_sdp(no_config.as_bytes(), &l),
            Err(SdpError::Track { track: 1, .. })
        ));
        let mode2 = FFMPEG_SDP.replace("packetization-mode=1", "packetization-mode=2");
        assert!(matches!(
            read_sdp(mode2.as_bytes(), &l),
            Err(SdpError::Track { track: 0, .. })
        ));
        let opus = FFMPEG_SDP.replace("MPEG4-GENERIC/44100/2", "opus/48000/2");
        let a = read_sdp(opus.as_bytes(), &l).unwrap();
        assert_eq!(a.tracks[1].codec, AnnouncedCodec::Other("OPUS".into()));
    }
}
