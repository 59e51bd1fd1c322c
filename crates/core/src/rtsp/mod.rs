//! RTSP/1.0 (RFC 2326) as players use it: requests read from a connection's bytes, the
//! session state machine, replies and the SDP of an MPEG-TS file (docs/rtsp.md).
//!
//! Sans-IO: no socket, no clock. The server (`penstock_server::rtsp`) feeds the bytes a
//! connection read to [`parse`], asks [`SessionState::check`] whether a method may run in a
//! session's state, runs it (engine streams, sockets), and writes what [`Reply::encode`]
//! returns.
//!
//! **Crates.** Messages are parsed and written with `rtsp-types` (GStreamer's maintainers:
//! a nom parser of RTSP 1.0 and 2.0 messages and typed headers, no I/O); its `Transport`
//! header parser knows RTSP 1.0's `client_port`/`server_port`/`interleaved`, its `Range`
//! parser `npt=`. The SDP is written with `sdp-types` (same maintainers). Both fit a sans-IO
//! core: they take and give bytes. What they leave to us: what a request *means* here
//! ([`Request`], typed to what penstock supports), the size limit (a message is parsed from a
//! buffer that the caller bounds with [`RtspLimits::request_bytes_max`]) and the state rules.

use std::fmt::Write as _;

use rtsp_types::headers::{self, NptRange, NptTime};

pub use rtsp_types::Method;

/// Limits of the request reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtspLimits {
    /// A request (head and body) larger than this is refused (400) and the connection closed.
    pub request_bytes_max: usize,
}

/// Why a request was refused; [`RequestError::status`] is its reply's code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    #[error("malformed request")]
    Malformed,
    #[error("request larger than {0} bytes")]
    TooLarge(usize),
    #[error("not a request (a response or an unknown version)")]
    NotRequest,
    #[error("bad {header} header")]
    BadHeader { header: &'static str },
    #[error("request URI without a path")]
    NoPath,
    #[error("request path with a NUL or control character")]
    BadPath,
}

impl RequestError {
    /// The reply's status code.
    pub fn status(&self) -> u16 {
        match self {
            RequestError::NotRequest => 505,
            // RFC 2326 §11.3.15 Invalid Range.
            RequestError::BadHeader { header: "Range" } => 457,
            _ => 400,
        }
    }
}

/// The transport a SETUP asks for (RFC 2326 §12.39), as far as penstock serves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportAsk {
    /// `RTP/AVP[/UDP];unicast;client_port=a-b`: RTP to port `a`, RTCP to `b`.
    Udp { rtp_port: u16, rtcp_port: u16 },
    /// `RTP/AVP/TCP;interleaved=a-b`: RTP framed on channel `a`, RTCP on `b`.
    Interleaved { rtp_channel: u8, rtcp_channel: u8 },
}

/// Why a SETUP's transport cannot be served (both: 461).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    #[error("SETUP without a Transport header")]
    Missing,
    #[error(
        "no supported transport (RTP/AVP unicast with client_port, or RTP/AVP/TCP with interleaved): {0}"
    )]
    Unsupported(String),
}

/// One request, typed to what penstock serves.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub method: Method,
    /// The request URI as written (`*` for `OPTIONS *`).
    pub uri: String,
    /// The URI's path, percent-decoded, without its leading `/`; a trailing
    /// `/trackID=N` or `/streamid=N` control suffix is removed (SETUP's track URL).
    pub path: Option<String>,
    /// The `N` of a `/trackID=N` (or `/streamid=N`) control suffix, when the URI has one
    /// (an MP4's tracks are `trackID=<track id>`; an MPEG-TS file's one track is `trackID=0`).
    pub track: Option<u32>,
    pub cseq: Option<u32>,
    pub session: Option<String>,
    /// `None`: no Transport header.
    pub transport: Option<Result<TransportAsk, TransportError>>,
    /// `Range: npt=FROM-`: FROM in ns (`None`: no header, or `npt=now-`).
    pub range_from_ns: Option<u64>,
    /// `Scale`, when given.
    pub scale: Option<f64>,
    /// `User-Agent`, when given (at most [`USER_AGENT_BYTES_MAX`] bytes kept).
    pub user_agent: Option<String>,
    /// The URI's path in the HTTP server's canonical form (percent-decoded, dot segments
    /// resolved, [`crate::http::normalize_path`]) with the track suffix removed: what a
    /// signed URL signs. `None` when it does not normalize (a `..` above the root).
    pub canonical_path: Option<String>,
    /// The URI's query as sent (without `?`); a `/trackID=0` or `/streamid=0` a client
    /// appended to a content base with a query is removed.
    pub query: Option<String>,
    /// The `Authorization` value (a `Bearer` JWT), when given. Never logged.
    pub authorization: Option<String>,
    /// The Transport header asks `mode=record` (a publisher's SETUP, after ANNOUNCE).
    pub record_mode: bool,
    /// `Content-Type`, when given (ANNOUNCE's `application/sdp`).
    pub content_type: Option<String>,
    /// The body (ANNOUNCE's SDP); bounded by [`RtspLimits::request_bytes_max`] with the
    /// head.
    pub body: Vec<u8>,
}

/// The bytes of a `User-Agent` kept (what names the client is at its start).
pub const USER_AGENT_BYTES_MAX: usize = 64;

/// Whether the client named by `user_agent` asks `Range: npt=T+S-` to seek to T, S being the
/// stream's first presentation time: libavformat's RTSP demuxer does (`ffmpeg -ss T` adds
/// the input's start time, which for MPEG-TS over RTP is the first PTS of the TS, not 0),
/// and so does mpv, which plays through it. Its user agent is `Lavf<version>` (ffmpeg,
/// ffplay, ffprobe) or `libmpv` (mpv's default).
pub fn adds_stream_start(user_agent: Option<&str>) -> bool {
    user_agent.is_some_and(|ua| ua.starts_with("Lavf") || ua.starts_with("libmpv"))
}

/// What [`parse`] found at the start of a connection's bytes.
#[derive(Debug, Clone, PartialEq)]
pub enum Parsed {
    /// More bytes are needed.
    Incomplete,
    /// A request, and the bytes it took.
    Request(Box<Request>, usize),
    /// An interleaved binary frame (`$ channel length`, RTCP receiver reports over TCP), and
    /// the bytes it took: its payload.
    Data {
        channel: u8,
        payload_at: usize,
        consumed: usize,
    },
    /// A whole request whose content cannot be served (a bad header, a path with a NUL): it
    /// is answered with `error`'s status and the connection goes on, the request's bytes
    /// (`consumed`) dropped. `cseq` when its CSeq could be read.
    Refused {
        error: RequestError,
        cseq: Option<u32>,
        consumed: usize,
    },
}

/// The control suffix of a track URL in our SDP.
pub const TRACK_CONTROL: &str = "trackID=0";

/// Reads the message at the start of `buf`.
pub fn parse(buf: &[u8], limits: &RtspLimits) -> Result<Parsed, RequestError> {
    if buf.first() == Some(&b'$') {
        if buf.len() < 4 {
            return Ok(Parsed::Incomplete);
        }
        let len = usize::from(u16::from_be_bytes([buf[2], buf[3]]));
        if buf.len() < 4 + len {
            return Ok(Parsed::Incomplete);
        }
        return Ok(Parsed::Data {
            channel: buf[1],
            payload_at: 4,
            consumed: 4 + len,
        });
    }
    let window = &buf[..buf.len().min(limits.request_bytes_max)];
    match rtsp_types::Message::<Vec<u8>>::parse(window) {
        Ok((rtsp_types::Message::Request(r), consumed)) => match typed(&r) {
            Ok(req) => Ok(Parsed::Request(Box::new(req), consumed)),
            // A version we do not speak ends the connection (the next bytes may not be
            // RTSP/1.0 framing); anything else is one request refused.
            Err(RequestError::NotRequest) => Err(RequestError::NotRequest),
            Err(error) => Ok(Parsed::Refused {
                error,
                cseq: r.typed_header::<headers::CSeq>().ok().flatten().map(|c| *c),
                consumed,
            }),
        },
        Ok(_) => Err(RequestError::NotRequest),
        Err(rtsp_types::ParseError::Incomplete(_)) => {
            if buf.len() >= limits.request_bytes_max {
                Err(RequestError::TooLarge(limits.request_bytes_max))
            } else {
                Ok(Parsed::Incomplete)
            }
        }
        Err(rtsp_types::ParseError::Error) => Err(RequestError::Malformed),
    }
}

fn typed(r: &rtsp_types::Request<Vec<u8>>) -> Result<Request, RequestError> {
    if r.version() != rtsp_types::Version::V1_0 {
        return Err(RequestError::NotRequest);
    }
    let cseq = r
        .typed_header::<headers::CSeq>()
        .map_err(|_| RequestError::BadHeader { header: "CSeq" })?
        .map(|c| *c);
    let session = r
        .typed_header::<headers::Session>()
        .map_err(|_| RequestError::BadHeader { header: "Session" })?
        .map(|s| s.0);
    let uri = r
        .request_uri()
        .map_or_else(|| "*".to_string(), |u| u.to_string());
    let (path, track) = match r.request_uri().map(|u| track_path(u.path())).transpose()? {
        Some((p, t)) => (Some(p), t),
        None => (None, None),
    };
    let canonical_path = r.request_uri().and_then(|u| {
        let p = crate::http::normalize_path(u.path()).ok()?;
        Some(split_track(&p).0.to_string())
    });
    let mut track = track;
    let query = r.request_uri().and_then(|u| {
        let q = u.query()?;
        // A client that joined a relative control to a base with a query: `?q/trackID=N`.
        let (q, t) = split_track(q);
        track = track.or(t);
        Some(q.to_string())
    });
    let transport = if r.header(&headers::TRANSPORT).is_some() {
        Some(transport(r))
    } else {
        None
    };
    let range_from_ns = match r.typed_header::<headers::Range>() {
        Ok(None) => None,
        Ok(Some(headers::Range::Npt(npt))) => match npt {
            NptRange::From(t) | NptRange::FromTo(t, _) => npt_ns(t),
            NptRange::Empty | NptRange::To(_) => None,
        },
        Ok(Some(_)) | Err(_) => return Err(RequestError::BadHeader { header: "Range" }),
    };
    let scale = r
        .typed_header::<headers::Scale>()
        .map_err(|_| RequestError::BadHeader { header: "Scale" })?
        .map(|s| *s);
    let user_agent = r.header(&headers::USER_AGENT).map(|v| {
        let v = v.as_str();
        let mut end = v.len().min(USER_AGENT_BYTES_MAX);
        while !v.is_char_boundary(end) {
            end -= 1;
        }
        v[..end].to_string()
    });
    let authorization = r
        .header(&headers::AUTHORIZATION)
        .map(|v| v.as_str().to_string());
    let record_mode = matches!(
        r.typed_header::<headers::Transports>(),
        Ok(Some(l)) if l.iter().any(|t| matches!(
            t,
            headers::transport::Transport::Rtp(rtp)
                if rtp.params.mode.contains(&headers::transport::TransportMode::Record)
        ))
    );
    let content_type = r
        .header(&headers::CONTENT_TYPE)
        .map(|v| v.as_str().trim().to_ascii_lowercase());
    Ok(Request {
        record_mode,
        content_type,
        body: r.body().clone(),
        authorization,
        canonical_path,
        query,
        user_agent,
        method: r.method().clone(),
        uri,
        path,
        track,
        cseq,
        session,
        transport,
        range_from_ns,
        scale,
    })
}

/// The path of a request URI: percent-decoded, the leading `/` and a track suffix removed.
fn track_path(raw: &str) -> Result<(String, Option<u32>), RequestError> {
    let decoded = percent_decode(raw).ok_or(RequestError::NoPath)?;
    // A NUL cannot name a file (open(2) would refuse it: a 500), nor can other controls here.
    if decoded.chars().any(char::is_control) {
        return Err(RequestError::BadPath);
    }
    let (p, track) = split_track(decoded.trim_start_matches('/'));
    Ok((p.to_string(), track))
}

/// `s` without a trailing `/trackID=N` or `/streamid=N` (N decimal, at most 9 digits), and N.
fn split_track(s: &str) -> (&str, Option<u32>) {
    for key in ["/trackID=", "/streamid="] {
        if let Some(at) = s.rfind(key) {
            let n = &s[at + key.len()..];
            if !n.is_empty() && n.len() <= 9 && n.bytes().all(|b| b.is_ascii_digit()) {
                return (&s[..at], n.parse().ok());
            }
        }
    }
    (s, None)
}

/// `%XX` decoded; `None` for a bad escape or bytes that are not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// NPT in ns (`None` for `now`); saturates.
fn npt_ns(t: NptTime) -> Option<u64> {
    let (secs, nanos) = match t {
        NptTime::Now => return None,
        NptTime::Seconds(s, n) => (s, n.unwrap_or(0)),
        NptTime::Hms(h, m, s, n) => (
            h.saturating_mul(3600)
                .saturating_add(u64::from(m) * 60)
                .saturating_add(u64::from(s)),
            n.unwrap_or(0),
        ),
    };
    Some(
        secs.saturating_mul(1_000_000_000)
            .saturating_add(u64::from(nanos.min(999_999_999))),
    )
}

/// The first transport of the list penstock serves.
fn transport(r: &rtsp_types::Request<Vec<u8>>) -> Result<TransportAsk, TransportError> {
    use headers::transport::{RtpLowerTransport, RtpProfile, Transport};
    let raw = r
        .header(&headers::TRANSPORT)
        .map(|v| v.as_str().to_string())
        .unwrap_or_default();
    let list = match r.typed_header::<headers::Transports>() {
        Ok(Some(l)) => l,
        Ok(None) => return Err(TransportError::Missing),
        Err(_) => return Err(TransportError::Unsupported(raw)),
    };
    for t in list.iter() {
        let Transport::Rtp(rtp) = t else { continue };
        if rtp.profile != RtpProfile::Avp || rtp.params.multicast {
            continue;
        }
        match &rtp.lower_transport {
            None | Some(RtpLowerTransport::Udp) => {
                if let Some((a, b)) = rtp.params.client_port {
                    let rtcp = b.unwrap_or(a.wrapping_add(1));
                    if a != 0 && rtcp != 0 {
                        return Ok(TransportAsk::Udp {
                            rtp_port: a,
                            rtcp_port: rtcp,
                        });
                    }
                }
            }
            Some(RtpLowerTransport::Tcp) => {
                let (a, b) = rtp.params.interleaved.unwrap_or((0, Some(1)));
                return Ok(TransportAsk::Interleaved {
                    rtp_channel: a,
                    rtcp_channel: b.unwrap_or(a.wrapping_add(1)),
                });
            }
            Some(RtpLowerTransport::Other(_)) => {}
        }
    }
    Err(TransportError::Unsupported(raw))
}

/// Where a session is (RFC 2326 appendix A, server side: Init is "no session yet").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionState {
    /// Set up, not playing (also: played to its end).
    Ready,
    Playing,
    /// Paused by PAUSE: PLAY resumes where it stopped.
    Paused,
}

impl SessionState {
    /// Whether `method` may run on a session in this state (455 if not). OPTIONS,
    /// GET_PARAMETER and TEARDOWN always may; SETUP again (a transport change) may not while
    /// playing; PAUSE needs a PLAY first.
    pub fn check(self, method: &Method) -> Result<(), u16> {
        let ok = match method {
            Method::Options | Method::GetParameter | Method::SetParameter | Method::Teardown => {
                true
            }
            Method::Play => true,
            Method::Pause => self != SessionState::Ready,
            Method::Setup => self != SessionState::Playing,
            Method::Describe => true,
            _ => false,
        };
        if ok { Ok(()) } else { Err(455) }
    }

    /// The state after `method` succeeded.
    pub fn after(self, method: &Method) -> SessionState {
        match method {
            Method::Play => SessionState::Playing,
            Method::Pause => SessionState::Paused,
            _ => self,
        }
    }
}

/// Methods penstock answers (the `Public` header of OPTIONS).
pub const PUBLIC: &str =
    "OPTIONS, DESCRIBE, SETUP, PLAY, PAUSE, TEARDOWN, GET_PARAMETER, ANNOUNCE, RECORD";

/// A reply to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub cseq: Option<u32>,
    pub headers: Vec<(&'static str, String)>,
    pub content_type: Option<&'static str>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn new(status: u16, cseq: Option<u32>) -> Reply {
        Reply {
            status,
            cseq,
            headers: Vec::new(),
            content_type: None,
            body: Vec::new(),
        }
    }

    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Reply {
        self.headers.push((name, value.into()));
        self
    }

    /// The reply's bytes (`Server`, `CSeq`, the headers, `Content-Length` with a body).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = rtsp_types::Response::builder(
            rtsp_types::Version::V1_0,
            rtsp_types::StatusCode::from(self.status),
        )
        .header(headers::SERVER, "penstock");
        if let Some(c) = self.cseq {
            b = b.header(headers::CSEQ, c.to_string());
        }
        for (n, v) in &self.headers {
            if let Ok(name) = rtsp_types::HeaderName::try_from(*n) {
                b = b.header(name, v.as_str());
            }
        }
        if let Some(t) = self.content_type {
            b = b.header(headers::CONTENT_TYPE, t);
        }
        let resp = b.build(self.body.clone());
        let mut out = Vec::with_capacity(256 + self.body.len());
        // Writing into a Vec fails only on allocation failure.
        resp.write(&mut out).expect("writing into a Vec");
        out
    }
}

/// The `Session` header of a reply: `id;timeout=N`.
pub fn session_header(id: &str, timeout_s: u64) -> String {
    format!("{id};timeout={timeout_s}")
}

/// `npt` seconds with millisecond precision, as RTSP writes them.
pub fn npt_text(ns: u64) -> String {
    let ms = ns / 1_000_000;
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

/// The SDP of an MP4's tracks (`crate::rtp::mp4` packetizes them): one `m=` per track (`video`/`audio`, port 0, `RTP/AVP`, its
/// dynamic payload type) with its rtpmap, fmtp and `a=control:trackID=N` — relative, or
/// `control_base/trackID=N?query` when `query` is given (a signed URL carries its credential
/// into each SETUP). `duration_ns` is the movie's length.
pub fn mp4_sdp(
    tracks: &[(&crate::mp4::Track, crate::rtp::mp4::TrackRtp)],
    session_id: u64,
    origin: std::net::IpAddr,
    duration_ns: u64,
    control: Option<(&str, &str)>,
) -> String {
    let addrtype = if origin.is_ipv4() { "IP4" } else { "IP6" };
    let any = if origin.is_ipv4() { "0.0.0.0" } else { "::" };
    let mut s = format!(
        "v=0\r\no=- {session_id} 1 IN {addrtype} {origin}\r\ns=penstock\r\nc=IN {addrtype} {any}\r\nt=0 0\r\na=control:*\r\na=range:npt=0-{}\r\n",
        npt_text(duration_ns)
    );
    for (t, rtp) in tracks {
        let media = match t.kind {
            crate::mp4::TrackKind::Video => "video",
            crate::mp4::TrackKind::Audio => "audio",
        };
        let (rtpmap, fmtp) = crate::rtp::mp4::sdp_attributes(t, rtp);
        let ctl = match control {
            Some((base, q)) => format!("{base}/{}?{q}", crate::rtp::mp4::track_control(t.id)),
            None => crate::rtp::mp4::track_control(t.id),
        };
        let _ = write!(
            s,
            "m={media} 0 RTP/AVP {}\r\na=rtpmap:{rtpmap}\r\na=fmtp:{fmtp}\r\na=control:{ctl}\r\n",
            rtp.payload_type
        );
    }
    s
}

/// The SDP (RFC 4566) of an MPEG-TS file served as one RTP/AVP 33 track (RFC 2250):
/// `a=control` relative to the content base, `a=range:npt=0-DURATION` — or, for a live
/// source (`duration_ns` `None`), `a=range:npt=now-` (RFC 2326 §C.1.5). `origin` is the
/// server's address on the connection.
pub fn describe_sdp(session_id: u64, origin: std::net::IpAddr, duration_ns: Option<u64>) -> String {
    describe_sdp_with_control(session_id, origin, duration_ns, TRACK_CONTROL)
}

/// [`describe_sdp`] with the track's `a=control` given: an absolute URL carrying the
/// request's query (a signed URL's credential), so that SETUP carries it too whatever way
/// the client joins a base and a relative control.
pub fn describe_sdp_with_control(
    session_id: u64,
    origin: std::net::IpAddr,
    duration_ns: Option<u64>,
    track_control: &str,
) -> String {
    let addrtype = if origin.is_ipv4() { "IP4" } else { "IP6" };
    let any = if origin.is_ipv4() { "0.0.0.0" } else { "::" };
    let attr = |a: &str, v: Option<String>| sdp_types::Attribute {
        attribute: a.to_string(),
        value: v,
    };
    let s = sdp_types::Session {
        origin: sdp_types::Origin {
            username: None,
            sess_id: session_id.to_string(),
            sess_version: 1,
            nettype: "IN".into(),
            addrtype: addrtype.into(),
            unicast_address: origin.to_string(),
        },
        session_name: "penstock".into(),
        session_description: None,
        uri: None,
        emails: Vec::new(),
        phones: Vec::new(),
        connection: Some(sdp_types::Connection {
            nettype: "IN".into(),
            addrtype: addrtype.into(),
            connection_address: any.into(),
        }),
        bandwidths: Vec::new(),
        times: vec![sdp_types::Time {
            start_time: 0,
            stop_time: 0,
            repeats: Vec::new(),
        }],
        time_zones: Vec::new(),
        key: None,
        attributes: vec![
            attr("control", Some("*".into())),
            attr(
                "range",
                Some(match duration_ns {
                    Some(d) => format!("npt=0-{}", npt_text(d)),
                    None => "npt=now-".into(),
                }),
            ),
        ],
        medias: vec![sdp_types::Media {
            media: "video".into(),
            port: 0,
            num_ports: None,
            proto: "RTP/AVP".into(),
            fmt: crate::rtp::PAYLOAD_TYPE_MP2T.to_string(),
            media_title: None,
            connections: Vec::new(),
            bandwidths: Vec::new(),
            key: None,
            attributes: vec![
                attr(
                    "rtpmap",
                    Some(format!(
                        "{} MP2T/{}",
                        crate::rtp::PAYLOAD_TYPE_MP2T,
                        crate::rtp::RTP_CLOCK_HZ
                    )),
                ),
                attr("control", Some(track_control.into())),
            ],
        }],
    };
    let mut out = Vec::new();
    // Writing into a Vec fails only on allocation failure.
    s.write(&mut out).expect("writing into a Vec");
    String::from_utf8_lossy(&out).into_owned()
}

/// `RTP-Info: url=URL;seq=S;rtptime=T`.
pub fn rtp_info(url: &str, seq: u16, rtptime: u32) -> String {
    let mut s = String::new();
    let _ = write!(s, "url={url};seq={seq};rtptime={rtptime}");
    s
}

#[cfg(test)]
mod tests;
