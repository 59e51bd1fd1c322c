#![no_main]
//! RTSP publishing's parsers on arbitrary bytes (`core::rtp::announce`, `rtp::depack`,
//! `ts::mux` through `rtp::ingest`): the input up to its first NUL is a publisher's SDP (when
//! it does not read as one, ffmpeg's H.264 + AAC announcement is used, so the packets below
//! still reach both depacketizers); the rest is a run of RTP packets, each `[track][len u16
//! BE][bytes]`. Every SDP is read or refused, every packet taken or refused, never a panic;
//! what the muxer writes is whole 188-byte TS packets, each starting with the sync byte.
use libfuzzer_sys::fuzz_target;
use penstock_core::rtp::announce::{SdpLimits, read_sdp};
use penstock_core::rtp::depack::DepackLimits;
use penstock_core::rtp::ingest::Ingest;

const FFMPEG_SDP: &str = "v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=No Name\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\na=fmtp:96 packetization-mode=1; sprop-parameter-sets=Z2QADKzZQUH7ARAAAAMAEAAAAwMg8UKZYA==,aOvjyyLA; profile-level-id=64000C\r\na=control:streamid=0\r\nm=audio 0 RTP/AVP 97\r\na=rtpmap:97 MPEG4-GENERIC/44100/2\r\na=fmtp:97 profile-level-id=1;mode=AAC-hbr;sizelength=13;indexlength=3;indexdeltalength=3; config=1210\r\na=control:streamid=1\r\n";

fuzz_target!(|data: &[u8]| {
    let (sdp, mut rest) = match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    let limits = SdpLimits::default();
    let announced = match read_sdp(sdp, &limits) {
        Ok(a) => a,
        Err(_) => read_sdp(FFMPEG_SDP.as_bytes(), &limits).expect("ffmpeg's SDP reads"),
    };
    let Ok(mut ingest) = Ingest::new(&announced, DepackLimits::default()) else {
        return;
    };
    let mut out = Vec::new();
    let mut at_ns = 0u64;
    while rest.len() >= 3 {
        let track = usize::from(rest[0] % 4);
        let len = usize::from(u16::from_be_bytes([rest[1], rest[2]])).min(rest.len() - 3);
        let packet = &rest[3..3 + len];
        rest = &rest[3 + len..];
        at_ns += 1_000_000;
        let _ = ingest.handle_rtp(track, packet, at_ns, &mut out);
    }
    ingest.flush(&mut out);
    assert_eq!(out.len() % 188, 0, "a partial TS packet");
    assert!(out.chunks(188).all(|p| p[0] == 0x47), "a TS packet without its sync byte");
});
