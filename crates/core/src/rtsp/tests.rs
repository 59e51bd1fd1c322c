use super::*;
use proptest::prelude::*;

const LIMITS: RtspLimits = RtspLimits {
    request_bytes_max: 4096,
};

fn request(text: &str) -> Request {
    match parse(text.as_bytes(), &LIMITS) {
        Ok(Parsed::Request(r, n)) => {
            assert_eq!(n, text.len());
            *r
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn setup_udp_reads_client_ports_and_track_path() {
    let r = request(
        "SETUP rtsp://127.0.0.1:8554/dir/clip%20a.ts/trackID=0 RTSP/1.0\r\nCSeq: 3\r\nTransport: RTP/AVP;unicast;client_port=5000-5001\r\n\r\n",
    );
    assert_eq!(r.method, Method::Setup);
    assert_eq!(r.cseq, Some(3));
    assert_eq!(r.path.as_deref(), Some("dir/clip a.ts"));
    assert_eq!(
        r.transport,
        Some(Ok(TransportAsk::Udp {
            rtp_port: 5000,
            rtcp_port: 5001
        }))
    );
}

#[test]
fn setup_tcp_reads_interleaved_channels() {
    let r = request(
        "SETUP rtsp://h/c.ts RTSP/1.0\r\nCSeq: 1\r\nTransport: RTP/AVP/TCP;unicast;interleaved=2-3\r\n\r\n",
    );
    assert_eq!(
        r.transport,
        Some(Ok(TransportAsk::Interleaved {
            rtp_channel: 2,
            rtcp_channel: 3
        }))
    );
}

#[test]
fn multicast_only_transport_is_unsupported() {
    let r = request(
        "SETUP rtsp://h/c.ts RTSP/1.0\r\nCSeq: 1\r\nTransport: RTP/AVP;multicast;port=5000-5001\r\n\r\n",
    );
    assert!(matches!(
        r.transport,
        Some(Err(TransportError::Unsupported(_)))
    ));
}

#[test]
fn play_range_and_session() {
    let r = request(
        "PLAY rtsp://h/c.ts RTSP/1.0\r\nCSeq: 5\r\nSession: abc;timeout=60\r\nRange: npt=20.5-\r\nScale: 1\r\n\r\n",
    );
    assert_eq!(r.session.as_deref(), Some("abc"));
    assert_eq!(r.range_from_ns, Some(20_500_000_000));
    assert_eq!(r.scale, Some(1.0));
}

#[test]
fn incomplete_then_too_large() {
    let part = b"OPTIONS * RTSP/1.0\r\nCSeq: 1\r\n";
    assert_eq!(parse(part, &LIMITS), Ok(Parsed::Incomplete));
    let small = RtspLimits {
        request_bytes_max: part.len(),
    };
    assert_eq!(parse(part, &small), Err(RequestError::TooLarge(part.len())));
}

#[test]
fn garbage_is_malformed_400() {
    let e = parse(b"HELLO\r\n\r\n", &LIMITS).unwrap_err();
    assert_eq!(e.status(), 400);
}

#[test]
fn interleaved_frame_is_skipped_whole() {
    let mut b = vec![b'$', 1, 0, 3, 9, 9, 9];
    b.extend_from_slice(b"OPTIONS");
    assert_eq!(
        parse(&b, &LIMITS),
        Ok(Parsed::Data {
            channel: 1,
            payload_at: 4,
            consumed: 7
        })
    );
}

#[test]
fn state_rules() {
    assert_eq!(SessionState::Ready.check(&Method::Pause), Err(455));
    assert_eq!(SessionState::Playing.check(&Method::Setup), Err(455));
    assert_eq!(SessionState::Paused.check(&Method::Play), Ok(()));
    assert_eq!(
        SessionState::Paused.after(&Method::Play),
        SessionState::Playing
    );
    assert_eq!(
        SessionState::Playing.after(&Method::Pause),
        SessionState::Paused
    );
}

#[test]
fn reply_encodes_cseq_and_headers() {
    let r = Reply::new(454, Some(7))
        .header("Session", "x;timeout=60")
        .encode();
    let s = String::from_utf8(r).unwrap();
    assert!(s.starts_with("RTSP/1.0 454 "), "{s}");
    assert!(s.contains("CSeq: 7\r\n"), "{s}");
    assert!(s.contains("Session: x;timeout=60\r\n"), "{s}");
}

#[test]
fn sdp_names_one_mp2t_track_and_its_range() {
    let live = describe_sdp(1, "127.0.0.1".parse().unwrap(), None);
    assert!(live.contains("a=range:npt=now-\r\n"), "{live}");
    let s = describe_sdp(1, "127.0.0.1".parse().unwrap(), Some(30_040_000_000));
    assert!(s.contains("m=video 0 RTP/AVP 33\r\n"), "{s}");
    assert!(s.contains("a=rtpmap:33 MP2T/90000\r\n"), "{s}");
    assert!(s.contains("a=range:npt=0-30.040\r\n"), "{s}");
    assert!(s.contains("a=control:trackID=0\r\n"), "{s}");
    sdp_types::Session::parse(s.as_bytes()).expect("our SDP parses back");
}

proptest! {
    /// Bytes from a socket never panic the reader, and what it takes is within the buffer.
    #[test]
    fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        match parse(&bytes, &LIMITS) {
            Ok(Parsed::Request(_, n)) => prop_assert!(n <= bytes.len()),
            Ok(Parsed::Data { consumed, .. }) => prop_assert!(consumed <= bytes.len()),
            _ => {}
        }
    }

    /// Any request line with a CSeq parses back to its method and CSeq.
    #[test]
    fn cseq_round_trips(cseq in any::<u32>(), m in 0usize..4) {
        let method = ["OPTIONS", "DESCRIBE", "TEARDOWN", "GET_PARAMETER"][m];
        let text = format!("{method} rtsp://h/a.ts RTSP/1.0\r\nCSeq: {cseq}\r\n\r\n");
        let r = request(&text);
        prop_assert_eq!(r.cseq, Some(cseq));
    }
}

/// Issue 30, finding 8: a request that is whole but cannot be served is one refusal, not the
/// end of the connection: a malformed `Range` is 457, a `%00` in the path 400, each with
/// the request's CSeq and the bytes it took.
#[test]
fn a_whole_request_with_a_bad_range_or_path_is_refused_alone() {
    for (text, status) in [
        (
            "PLAY rtsp://h/c.ts RTSP/1.0\r\nCSeq: 7\r\nRange: npt=abc-\r\n\r\n",
            457,
        ),
        ("DESCRIBE rtsp://h/c%00.ts RTSP/1.0\r\nCSeq: 7\r\n\r\n", 400),
        ("DESCRIBE rtsp://h/c%0a.ts RTSP/1.0\r\nCSeq: 7\r\n\r\n", 400),
    ] {
        match parse(text.as_bytes(), &LIMITS) {
            Ok(Parsed::Refused {
                error,
                cseq,
                consumed,
            }) => {
                assert_eq!(error.status(), status, "{text}");
                assert_eq!(cseq, Some(7));
                assert_eq!(consumed, text.len());
            }
            other => panic!("{text}: {other:?}"),
        }
    }
}

/// ffmpeg and mpv (libavformat) add the stream's start time to a seek's npt: told by their
/// user agents.
#[test]
fn libavformat_clients_are_told_by_their_user_agent() {
    let r = request(
        "PLAY rtsp://h/clip.ts RTSP/1.0\r\nCSeq: 5\r\nUser-Agent: Lavf60.16.100\r\nRange: npt=21.400-\r\n\r\n",
    );
    assert_eq!(r.user_agent.as_deref(), Some("Lavf60.16.100"));
    assert_eq!(r.range_from_ns, Some(21_400_000_000));
    assert!(adds_stream_start(r.user_agent.as_deref()));
    assert!(adds_stream_start(Some("libmpv")));
    assert!(!adds_stream_start(Some("GStreamer/1.22.0")));
    assert!(!adds_stream_start(Some(
        "LibVLC/3.0.18 (LIVE555 Streaming Media v2016.11.28)"
    )));
    assert!(!adds_stream_start(None));
    let long = format!(
        "OPTIONS * RTSP/1.0\r\nCSeq: 1\r\nUser-Agent: {}\r\n\r\n",
        "é".repeat(100)
    );
    let ua = request(&long).user_agent.unwrap();
    assert!(ua.len() <= USER_AGENT_BYTES_MAX && ua.chars().all(|c| c == 'é'));
}

/// Issue 35: what a signed URL signs — the canonical path without the track suffix — and
/// its query, also when a client appended the track control to a content base with a query;
/// an `Authorization` header is kept for a JWT.
#[test]
fn the_canonical_path_and_query_of_a_signed_url() {
    let r = request(
        "SETUP rtsp://h/p/./cl%69p.ts/trackID=0?expires=9&kid=k1&sig=x RTSP/1.0\r\nCSeq: 2\r\nTransport: RTP/AVP;unicast;client_port=5000-5001\r\nAuthorization: Bearer a.b.c\r\n\r\n",
    );
    assert_eq!(r.canonical_path.as_deref(), Some("/p/clip.ts"));
    assert_eq!(r.query.as_deref(), Some("expires=9&kid=k1&sig=x"));
    assert_eq!(r.authorization.as_deref(), Some("Bearer a.b.c"));
    let joined =
        request("SETUP rtsp://h/p/clip.ts?expires=9&sig=x/trackID=0 RTSP/1.0\r\nCSeq: 3\r\n\r\n");
    assert_eq!(joined.canonical_path.as_deref(), Some("/p/clip.ts"));
    assert_eq!(joined.query.as_deref(), Some("expires=9&sig=x"));
    let up = request("DESCRIBE rtsp://h/../x.ts RTSP/1.0\r\nCSeq: 4\r\n\r\n");
    assert!(up.canonical_path.is_none() || up.canonical_path.as_deref() == Some("/x.ts"));
    let sdp = describe_sdp_with_control(
        1,
        "127.0.0.1".parse().unwrap(),
        Some(1_000_000_000),
        "rtsp://h/p/clip.ts/trackID=0?expires=9&kid=k1&sig=x",
    );
    assert!(
        sdp.contains("a=control:rtsp://h/p/clip.ts/trackID=0?expires=9&kid=k1&sig=x\r\n"),
        "{sdp}"
    );
}

#[test]
fn a_track_control_suffix_names_the_track() {
    let r = request("SETUP rtsp://h/m/movie.mp4/trackID=2 RTSP/1.0\r\nCSeq: 1\r\n\r\n");
    assert_eq!(r.path.as_deref(), Some("m/movie.mp4"));
    assert_eq!(r.track, Some(2));
    assert_eq!(r.canonical_path.as_deref(), Some("/m/movie.mp4"));
    let r = request("SETUP rtsp://h/movie.mp4?sig=x/trackID=1 RTSP/1.0\r\nCSeq: 1\r\n\r\n");
    assert_eq!((r.track, r.query.as_deref()), (Some(1), Some("sig=x")));
    // Not a number: part of the path, no track.
    let r = request("DESCRIBE rtsp://h/a/trackID=x RTSP/1.0\r\nCSeq: 1\r\n\r\n");
    assert_eq!((r.path.as_deref(), r.track), (Some("a/trackID=x"), None));
    let r = request("DESCRIBE rtsp://h/movie.mp4 RTSP/1.0\r\nCSeq: 1\r\n\r\n");
    assert_eq!(r.track, None);
}
