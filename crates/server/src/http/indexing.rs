//! A playlist request whose TS file is not indexed yet (`crate::hls`): the file is read through
//! by an index thread, never by the loop. [`Worker::wait_for_index`] takes the connection out
//! of epoll (as an origin request's, `origin.rs`) and parks it; the index thread writes the
//! loop's eventfd when the build ends (every loop with a connection waiting for it: requests
//! for the same file share one build), and [`Worker::poll_index`] answers each parked
//! connection from the build's result with the loop's ordinary sending (non-blocking, the
//! send timeout, keep-alive), the connection back in epoll. A client gone meanwhile costs the
//! build only: its connection is closed as any other, the index is kept in the cache.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use penstock_core::http::{Request, ResponseContext};
use rustix::event::epoll;

use super::send::Out;
use super::{Interest, State, Worker, conn_in, set_interest, token};

/// What `respond` hands the loop for a playlist whose index is being built.
pub(super) struct IndexPending {
    pub(super) build: PendingBuild,
    /// The TS file's modification time (the playlist's `Last-Modified` and `ETag`).
    pub(super) mtime: SystemTime,
    pub(super) keep_alive_allowed: bool,
    /// The session token the playlist's segment URIs carry (a signed request's), if any.
    pub(super) segment_query: Option<String>,
    /// The request's HLS session ask, in a sessions location.
    pub(super) session: Option<super::respond::SessionAsk>,
}

/// The build a parked request waits for: a TS file's key-frame index (its playlist), or an
/// MP4's package (any of `PATH.mp4/…`: the file kept for the segments' sendfile).
pub(super) enum PendingBuild {
    Ts(Arc<crate::hls::Build>),
    Mp4 {
        build: Arc<crate::hls::Build<crate::hls::Mp4Package>>,
        file: std::fs::File,
        what: super::mp4::Mp4Request,
    },
    /// A blocking live playlist reload (`live.rs`): its segment, or its deadline.
    Live(super::live::LiveWait),
}

impl PendingBuild {
    fn done(&self, now: Instant) -> bool {
        match self {
            PendingBuild::Ts(b) => b.result().is_some(),
            PendingBuild::Mp4 { build, .. } => build.result().is_some(),
            PendingBuild::Live(w) => w.done(now),
        }
    }
}

/// A parked connection: its request, and the `Out` made for it (its class, start, log entry;
/// `hls_wait` set).
pub(super) struct IndexWait {
    req: Request,
    pub(super) out: Box<Out>,
}

impl Worker {
    /// `out.hls_wait` is set: park the connection until the build ends.
    pub(super) fn wait_for_index(&mut self, idx: u32, generation: u32, req: Request, out: Out) {
        let Some(c) = conn_in(&mut self.slots, idx, generation) else {
            return;
        };
        if epoll::delete(&self.epoll, &c.sock).is_ok() {
            c.interest = Interest::Removed;
        }
        if let Some(PendingBuild::Live(w)) = out.hls_wait.as_ref().map(|p| &p.build) {
            self.live_deadline = Some(self.live_deadline.map_or(w.deadline, |d| d.min(w.deadline)));
        }
        c.state = State::Index(Box::new(IndexWait {
            req,
            out: Box::new(out),
        }));
        self.index_conns.push((idx, generation));
    }

    /// Answers the parked connections whose build has ended.
    pub(super) fn poll_index(&mut self) {
        let list = std::mem::take(&mut self.index_conns);
        let now = Instant::now();
        self.live_deadline = None;
        for (idx, generation) in list {
            let shared = self.shared.clone();
            let live = self.live.clone();
            let Some(c) = conn_in(&mut self.slots, idx, generation) else {
                continue;
            };
            let State::Index(w) = &c.state else { continue };
            if !w.out.hls_wait.as_ref().is_some_and(|p| p.build.done(now)) {
                if let Some(PendingBuild::Live(lw)) = w.out.hls_wait.as_ref().map(|p| &p.build) {
                    // Not there yet: woken again at the feed's next sync, or by the deadline.
                    lw.feed.wake_at_sync(&self.engine_waker);
                    self.live_deadline = Some(
                        self.live_deadline
                            .map_or(lw.deadline, |d| d.min(lw.deadline)),
                    );
                }
                self.index_conns.push((idx, generation));
                continue;
            }
            let State::Index(w) = std::mem::replace(&mut c.state, State::Reading) else {
                unreachable!("matched Index above")
            };
            let IndexWait { req, mut out } = *w;
            let pending = out.hls_wait.take().expect("checked above");
            let ctx = ResponseContext {
                date: SystemTime::now(),
                server: &shared.server_name,
                keep_alive_allowed: pending.keep_alive_allowed,
                keep_alive_timeout_s: Some(live.limits.idle_timeout_ms / 1000),
                ranges_max: live.limits.ranges_max,
                boundary: "",
            };
            let r = match pending.build {
                PendingBuild::Ts(build) => {
                    let built = build.result().expect("checked above");
                    super::respond::hls_response(
                        &shared,
                        &req,
                        &ctx,
                        built,
                        pending.mtime,
                        pending.segment_query.as_deref(),
                        pending.session.as_ref(),
                    )
                }
                PendingBuild::Live(lw) => {
                    if lw.feed.blocking(lw.msn) == penstock_core::hls::Blocking::Ready {
                        super::live::playlist_response(
                            &shared,
                            &req,
                            &ctx,
                            &lw.feed,
                            pending.segment_query.as_deref(),
                        )
                    } else {
                        // RFC 8216bis 6.2.5.2: not there within the wait: 503.
                        shared.metrics.error("hls_blocking_timeout");
                        super::respond::unavailable(&req, &ctx)
                    }
                }
                PendingBuild::Mp4 { build, file, what } => {
                    let built = build.result().expect("checked above");
                    let r =
                        super::mp4::mp4_response(&shared, &req, &ctx, built, pending.mtime, what);
                    if r.body
                        .iter()
                        .any(|p| matches!(p, penstock_core::http::BodyPiece::File { .. }))
                    {
                        out.file = Some(file);
                        out.path_label = "sendfile";
                    }
                    r
                }
            };
            out.head = r.head;
            out.delivery.apply(&mut out.head, r.status);
            out.head_pos = 0;
            out.pieces = r.body.into();
            out.piece_pos = 0;
            out.keep_alive = r.keep_alive;
            out.status = r.status;
            let tok = token(idx, generation);
            let registered = if c.interest == Interest::Removed {
                epoll::add(
                    &self.epoll,
                    &c.sock,
                    epoll::EventData::new_u64(tok),
                    epoll::EventFlags::IN,
                )
                .map(|()| c.interest = Interest::Read)
                .map_err(std::io::Error::from)
            } else {
                set_interest(&self.epoll, c, tok, Interest::Read)
            };
            c.state = State::Sending(out);
            if registered.is_err() {
                self.close(idx);
                continue;
            }
            c.deadline = Instant::now() + live.limits.send_timeout();
            self.ready.push((idx, generation));
        }
    }
}
