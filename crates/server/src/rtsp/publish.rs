//! RTSP publishing (docs/rtsp.md "Publishing"): ANNOUNCE with an SDP, SETUP of each track
//! with `mode=record` over interleaved TCP, RECORD, then RTP in interleaved frames — into a
//! `source = "publish"` live source. A child of `conn`: a publisher is a state of its
//! connection, not a session of the shared table (no engine stream, no admission: the
//! relay sends to viewers as for a UDP source).
//!
//! Each RTP frame goes through the core's ingest (`penstock_core::rtp::ingest`: depacketized,
//! muxed into MPEG-TS) and the TS into the source's relay ([`super::live::PublishSlot`]):
//! from there on it is the live relay's path — viewers, HLS, the recorder.
//!
//! **One publisher per path.** ANNOUNCE takes the source's slot; another ANNOUNCE on the path
//! while it is held gets **455 Method Not Valid in This State**: the request is well formed
//! and authorized, but the path's state (being published) does not allow another publisher
//! (453 Not Enough Bandwidth would send the client to retry later for a resource that is not
//! the reason). The slot is given back at TEARDOWN, when the connection closes, or when the
//! publisher sends nothing for the source's `idle_timeout` — and the source's viewers get
//! their RTCP BYE at once.
//!
//! **Who may publish.** Every ANNOUNCE is checked by RTSP Digest against `[auth]
//! digest_users_file`, and the user must be in the source's `publishers`: 401 with a
//! challenge without a valid credential, 403 for a user not listed.

use std::sync::Arc;
use std::time::Instant;

use penstock_core::rtp::announce::{SdpError, read_sdp};
use penstock_core::rtp::depack::DepackLimits;
use penstock_core::rtp::ingest::{Ingest, IngestError};
use penstock_core::rtsp::{Reply, Request, TransportAsk};

use super::{Conn, method_word, text};
use crate::rtsp::live::LiveSource;

/// A connection's publisher state.
pub(super) struct Publishing {
    source: Arc<LiveSource>,
    conn: u64,
    session: String,
    user: String,
    announced: penstock_core::rtp::announce::Announced,
    ingest: Ingest,
    /// RTP channel → track.
    channels: Vec<(u8, usize)>,
    recording: bool,
    /// The last request or frame of the publisher (its `idle_timeout`).
    pub(super) last_seen: Instant,
    out: Vec<u8>,
    /// Packets refused by the ingest (counted, logged once).
    refused: u64,
}

impl Drop for Publishing {
    fn drop(&mut self) {
        // Whatever the end (TEARDOWN, a closed connection, the idle timeout), the unit in
        // progress goes out and the source ends.
        if let Some(slot) = &self.source.publish {
            self.out.clear();
            self.ingest.flush(&mut self.out);
            slot.feed(&self.out);
            slot.release(self.conn);
        }
        let c = self.ingest.counts;
        tracing::info!(
            "live {}: {} stopped publishing: {} packets, {} video and {} audio units, {} video units skipped waiting for a key frame, {} discontinuities, {} packets refused",
            self.source.name,
            self.user,
            c.packets,
            c.video_units,
            c.audio_units,
            c.video_skipped,
            c.discontinuities,
            self.refused
        );
    }
}

impl Publishing {
    /// The source's idle timeout: a publisher silent this long is dropped.
    pub(super) fn idle_timeout(&self) -> std::time::Duration {
        self.source
            .publish
            .as_ref()
            .map_or(std::time::Duration::from_secs(5), |p| p.cfg.idle_timeout())
    }

    fn frame_bytes_max(&self) -> usize {
        self.source
            .publish
            .as_ref()
            .map_or(usize::from(u16::MAX), |p| p.cfg.frame_bytes_max)
    }

    fn is_session(&self, req: &Request) -> bool {
        req.session.as_deref() == Some(self.session.as_str())
    }
}

impl Conn<'_> {
    /// ANNOUNCE: checks the publisher, reads the SDP, takes the source's slot.
    pub(super) fn announce(&mut self, req: &Request, cseq: u32) -> Reply {
        let Some(source) = self.live_source(req) else {
            return text(
                405,
                cseq,
                "ANNOUNCE: this path is not a live source with source = \"publish\"",
            )
            .header("Allow", "OPTIONS, DESCRIBE, SETUP, PLAY, PAUSE, TEARDOWN");
        };
        let Some(slot) = &source.publish else {
            return text(
                405,
                cseq,
                "ANNOUNCE: this live source is fed by its udp-listen:// socket, not published",
            )
            .header("Allow", "OPTIONS, DESCRIBE, SETUP, PLAY, PAUSE, TEARDOWN");
        };
        let path = req.canonical_path.clone().unwrap_or_default();
        let Some(viewers) = self.shared.viewers.get() else {
            return text(401, cseq, "publishing needs credentials");
        };
        let user = match viewers.digest_user(
            &path,
            method_word(&req.method),
            &req.uri,
            req.authorization.as_deref(),
            Some(self.peer.ip()),
        ) {
            Ok(u) => u,
            Err(c) => {
                self.shared.metrics.error("publish_auth_missing");
                return text(401, cseq, "Digest credentials are required to publish")
                    .header("WWW-Authenticate", c.0);
            }
        };
        if !slot.publishers.contains(&user) {
            self.shared.metrics.error("publish_auth_refused");
            crate::peer_warn!("publish_refused", peer = %self.peer, path = %path, user = %user, "a user not in the source's publishers tried to publish");
            return text(403, cseq, &format!("{user} may not publish here"));
        }
        if self.publish.is_some() {
            return text(
                455,
                cseq,
                "this connection publishes already (TEARDOWN first)",
            );
        }
        if req
            .content_type
            .as_deref()
            .is_some_and(|t| !t.starts_with("application/sdp"))
        {
            return text(415, cseq, "ANNOUNCE takes an application/sdp body");
        }
        let announced = match read_sdp(&req.body, &slot.cfg.sdp_limits()) {
            Ok(a) => a,
            Err(e) => {
                self.shared.metrics.error("publish_bad_sdp");
                let code = if matches!(e, SdpError::TooLarge(..)) {
                    413
                } else {
                    400
                };
                return text(code, cseq, &format!("the SDP: {e}"));
            }
        };
        let limits = DepackLimits {
            au_bytes_max: slot.cfg.access_unit_bytes_max,
            ..DepackLimits::default()
        };
        let ingest = match Ingest::new(&announced, limits) {
            Ok(i) => i,
            Err(e @ IngestError::Codec(..)) => return text(415, cseq, &e.to_string()),
            Err(e) => return text(400, cseq, &e.to_string()),
        };
        if !slot.claim(self.id) {
            self.shared.metrics.error("publish_path_busy");
            return text(
                455,
                cseq,
                &format!(
                    "{}: another publisher is publishing on this path; one at a time",
                    source.name
                ),
            );
        }
        tracing::info!(
            "live {}: {user} from {} announced {} track(s)",
            source.name,
            self.peer,
            announced.tracks.len()
        );
        self.publish = Some(Publishing {
            source,
            conn: self.id,
            session: format!("{:016x}", super::random_u64()),
            user,
            announced,
            ingest,
            channels: Vec::new(),
            recording: false,
            last_seen: Instant::now(),
            out: Vec::new(),
            refused: 0,
        });
        Reply::new(200, Some(cseq))
    }

    /// SETUP with `mode=record`: a track of this connection's announcement, interleaved.
    pub(super) fn setup_record(&mut self, req: &Request, cseq: u32) -> Reply {
        let timeout = self.shared.cfg.session_timeout().as_secs();
        let Some(p) = &mut self.publish else {
            return text(455, cseq, "SETUP mode=record: ANNOUNCE the session first");
        };
        if req.path.as_deref() != Some(p.source.name.as_str()) {
            return text(
                455,
                cseq,
                "SETUP mode=record of another path than the ANNOUNCE's",
            );
        }
        if req.session.is_some() && !p.is_session(req) {
            return text(454, cseq, "no such session");
        }
        let Some(track) = p.announced.track_of(&req.uri) else {
            return text(
                404,
                cseq,
                "no track of the announced SDP has this control URL",
            );
        };
        let (rtp_channel, rtcp_channel) = match &req.transport {
            Some(Ok(TransportAsk::Interleaved {
                rtp_channel,
                rtcp_channel,
            })) => (*rtp_channel, *rtcp_channel),
            _ => {
                return text(
                    461,
                    cseq,
                    "publishing takes RTP/AVP/TCP;unicast;interleaved=N-M;mode=record (UDP is not supported)",
                );
            }
        };
        if p.channels
            .iter()
            .any(|&(c, t)| c == rtp_channel || t == track)
        {
            return text(455, cseq, "this track or channel is set up already");
        }
        p.channels.push((rtp_channel, track));
        p.last_seen = Instant::now();
        Reply::new(200, Some(cseq))
            .header(
                "Transport",
                format!("RTP/AVP/TCP;unicast;interleaved={rtp_channel}-{rtcp_channel};mode=record"),
            )
            .header(
                "Session",
                penstock_core::rtsp::session_header(&p.session, timeout),
            )
    }

    /// RECORD, or TEARDOWN / GET_PARAMETER / OPTIONS of the publisher's session; `None`
    /// when the request is not for it.
    pub(super) fn publisher_request(&mut self, req: &Request, cseq: u32) -> Option<Reply> {
        use penstock_core::rtsp::Method;
        if !matches!(
            req.method,
            Method::Record | Method::Teardown | Method::GetParameter
        ) {
            return None;
        }
        let timeout = self.shared.cfg.session_timeout().as_secs();
        let Some(p) = &mut self.publish else {
            return (req.method == penstock_core::rtsp::Method::Record)
                .then(|| text(455, cseq, "RECORD: ANNOUNCE and SETUP first"));
        };
        if !p.is_session(req) {
            return (req.method == penstock_core::rtsp::Method::Record)
                .then(|| text(454, cseq, "no such session"));
        }
        p.last_seen = Instant::now();
        let session = penstock_core::rtsp::session_header(&p.session, timeout);
        match req.method {
            penstock_core::rtsp::Method::Record => {
                if p.channels.is_empty() {
                    return Some(text(455, cseq, "RECORD: no track is set up"));
                }
                p.recording = true;
                tracing::info!("live {}: {} records", p.source.name, p.user);
                Some(Reply::new(200, Some(cseq)).header("Session", session))
            }
            penstock_core::rtsp::Method::Teardown => {
                self.publish = None;
                Some(Reply::new(200, Some(cseq)).header("Session", session))
            }
            _ => Some(Reply::new(200, Some(cseq)).header("Session", session)),
        }
    }

    /// An interleaved frame from the publisher: `Some(Err)` ends the connection (a frame
    /// over `frame_bytes_max`); `None` when this connection does not publish on `channel`.
    pub(super) fn publisher_frame(
        &mut self,
        channel: u8,
        payload: &[u8],
    ) -> Option<std::io::Result<()>> {
        let p = self.publish.as_mut()?;
        p.last_seen = Instant::now();
        if payload.len() > p.frame_bytes_max() {
            self.shared.metrics.error("publish_frame_too_large");
            return Some(Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "an interleaved frame of {} bytes, above frame_bytes_max {}",
                    payload.len(),
                    p.frame_bytes_max()
                ),
            )));
        }
        // RTCP from the publisher (its sender reports) and frames before RECORD: dropped.
        let track = p
            .channels
            .iter()
            .find(|&&(c, _)| c == channel)
            .map(|&(_, t)| t);
        let (Some(track), true) = (track, p.recording) else {
            return Some(Ok(()));
        };
        p.out.clear();
        let now_ns = penstock_driver::clock::now().as_nanos();
        if let Err(e) = p.ingest.handle_rtp(track, payload, now_ns, &mut p.out) {
            p.refused += 1;
            if p.refused == 1 {
                tracing::info!(
                    "live {}: a packet of track {track} refused: {e} (more are counted, not logged)",
                    p.source.name
                );
            }
        }
        if !p.out.is_empty()
            && let Some(slot) = &p.source.publish
        {
            slot.feed(&p.out);
        }
        Some(Ok(()))
    }
}
