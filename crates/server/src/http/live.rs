//! `/live/NAME/index.m3u8` and `/live/NAME/stream.ts` (docs/hls.md "Live and DVR"): the
//! live/DVR playlist of a live relay's recording (`crate::hls_live`), and the recording
//! itself up to its synced length, by ranges, with sendfile.
//!
//! A blocking reload (`_HLS_msn=N`, RFC 8216bis §6.2.5.2) whose segment is not there yet is
//! parked as an index wait is (`indexing.rs`): out of epoll, woken by the recorder's next sync
//! point (the feed writes the loop's eventfd) or by its deadline (`[hls]
//! blocking_reload_timeout_ms`, the loop's wait is bounded by the nearest one), then answered
//! with the playlist, or 503 at the deadline. At most `blocking_reload_waiters_max` wait at
//! once (all loops together); one more is a 503 at once. N more than two past the last
//! segment is a 400 at once.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use penstock_core::hls::Blocking;
use penstock_core::http::{
    BodyPiece, FileMeta, Method, Request, ResponseContext, Status, respond_error, respond_file,
};

use super::Worker;
use super::respond::{made_ok, unavailable};
use super::send::Out;
use super::tls_io::Mode;
use crate::hls_live::{LiveFeed, LiveMedia, LivePlaylist, WaitTicket};

/// The segment path's name, relative to the playlist.
pub(super) const STREAM_NAME: &str = "stream.ts";

/// A blocking reload parked until its segment exists or its deadline.
pub(super) struct LiveWait {
    pub(super) feed: Arc<LiveFeed>,
    pub(super) msn: u64,
    pub(super) deadline: Instant,
    pub(super) _ticket: WaitTicket,
}

impl LiveWait {
    pub(super) fn done(&self, now: Instant) -> bool {
        now >= self.deadline || self.feed.blocking(self.msn) == Blocking::Ready
    }
}

/// The `_HLS_msn` of a playlist request: `Ok(None)` when absent; `Err` with the reason when
/// malformed, or `_HLS_part` comes without it (RFC 8216bis §6.2.5.2: 400).
fn blocking_msn(query: Option<&str>) -> Result<Option<u64>, String> {
    let (mut msn, mut part) = (None, false);
    for kv in query.unwrap_or("").split('&') {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        match k {
            "_HLS_msn" => {
                msn = Some(
                    v.parse::<u64>()
                        .map_err(|_| format!("_HLS_msn={v:.32}: not a media sequence number"))?,
                );
            }
            "_HLS_part" => part = true,
            _ => {}
        }
    }
    if part && msn.is_none() {
        return Err("_HLS_part without _HLS_msn".into());
    }
    Ok(msn)
}

/// The live playlist of `feed` now, or a 503 when no segment is complete yet.
pub(super) fn playlist_response(
    shared: &super::HttpShared,
    req: &Request,
    ctx: &ResponseContext<'_>,
    feed: &LiveFeed,
    query: Option<&str>,
) -> penstock_core::http::Response {
    let window = shared.hls.cfg().live_window;
    match feed.playlist(STREAM_NAME, window, query) {
        LivePlaylist::Ready(p) => made_ok(
            req,
            ctx,
            "application/vnd.apple.mpegurl",
            None,
            p.into_bytes(),
        ),
        LivePlaylist::NotYet(why) => {
            if let Some(why) = why {
                tracing::warn!(live = %feed.name, reason = %why, "live HLS playlist unavailable");
                shared.metrics.error("live_unreadable");
            } else {
                shared.metrics.error("live_not_yet");
            }
            unavailable(req, ctx)
        }
    }
}

impl Worker {
    /// `/live/REST`: REST is `NAME/index.m3u8` or `NAME/stream.ts` of a live source this
    /// server runs; anything else 404.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn respond_live(
        &mut self,
        req: &Request,
        rest: &str,
        ctx: &ResponseContext<'_>,
        class: Arc<str>,
        memory: &dyn Fn(penstock_core::http::Response, Arc<str>) -> Out,
        tls: Mode,
        segment_query: Option<String>,
    ) -> Out {
        let shared = self.shared.clone();
        let not_found = |why: &str| {
            shared.metrics.error("not_found");
            memory(
                super::respond::text_response(req, ctx, Status::NOT_FOUND, None, why),
                class.clone(),
            )
        };
        let Some((name, tail)) = rest.rsplit_once('/') else {
            return not_found("a live path is /live/NAME/index.m3u8");
        };
        let Some(feed) = shared.hls.live(name) else {
            return not_found("no live source of that name is configured");
        };
        // A segmented recording's files are served by the names its playlist lists.
        let segment = match &feed.media {
            LiveMedia::Segments(_) if tail != "index.m3u8" => match feed.segment_file(tail) {
                Some(f) => Some(f),
                None => {
                    return not_found(
                        "not a file of this live recording that its index.m3u8 lists",
                    );
                }
            },
            _ => None,
        };
        if segment.is_none() && tail != "index.m3u8" && tail != STREAM_NAME {
            return not_found("a live source has index.m3u8 and stream.ts");
        }
        if !matches!(req.method, Method::Get | Method::Head) {
            shared.metrics.error("method_not_allowed");
            return memory(
                respond_error(Status::METHOD_NOT_ALLOWED, Some(req), ctx),
                class,
            );
        }
        if matches!(feed.media, LiveMedia::None) {
            shared.metrics.error("live_not_recorded");
            return memory(
                super::respond::text_response(
                    req,
                    ctx,
                    Status::CONFLICT,
                    None,
                    &format!(
                        "live source {name:?} is relayed but not recorded: HLS segments are byte ranges of its recording (set `record` in [live.{name}])"
                    ),
                ),
                class,
            );
        }
        self.live_cache = Some(tail == "index.m3u8" || req.range.is_none());
        if let Some((path, len)) = segment {
            return self.respond_live_media(req, ctx, class, memory, tls, &feed, &path, len);
        }
        if tail == STREAM_NAME {
            let LiveMedia::File(media) = &feed.media else {
                return not_found(
                    "this live source records segments: their names are in its index.m3u8",
                );
            };
            let len = feed.synced_bytes();
            return self.respond_live_media(req, ctx, class, memory, tls, &feed, media, len);
        }
        shared.metrics.hls_playlist("live");
        let msn = match blocking_msn(req.query.as_deref()) {
            Ok(m) => m,
            Err(why) => {
                shared.metrics.error("hls_bad_blocking");
                return memory(
                    super::respond::text_response(req, ctx, Status::BAD_REQUEST, None, &why),
                    class,
                );
            }
        };
        let query = segment_query.as_deref();
        let Some(msn) = msn else {
            return memory(playlist_response(&shared, req, ctx, &feed, query), class);
        };
        match feed.blocking(msn) {
            Blocking::Ready => memory(playlist_response(&shared, req, ctx, &feed, query), class),
            Blocking::TooFar => {
                shared.metrics.error("hls_bad_blocking");
                memory(
                    super::respond::text_response(
                        req,
                        ctx,
                        Status::BAD_REQUEST,
                        None,
                        "_HLS_msn is more than two past the last segment (RFC 8216bis 6.2.5.2)",
                    ),
                    class,
                )
            }
            Blocking::Wait => {
                let cfg = shared.hls.cfg();
                let Some(ticket) =
                    WaitTicket::take(&shared.hls.live_waiting, cfg.blocking_reload_waiters_max)
                else {
                    shared.metrics.error("hls_blocking_full");
                    return memory(unavailable(req, ctx), class);
                };
                feed.wake_at_sync(&self.engine_waker);
                let deadline =
                    Instant::now() + Duration::from_millis(cfg.blocking_reload_timeout_ms);
                let mut out = memory(unavailable(req, ctx), class);
                out.keep_alive = req.keep_alive && ctx.keep_alive_allowed;
                out.hls_wait = Some(Box::new(super::indexing::IndexPending {
                    build: super::indexing::PendingBuild::Live(LiveWait {
                        feed,
                        msn,
                        deadline,
                        _ticket: ticket,
                    }),
                    mtime: SystemTime::now(),
                    keep_alive_allowed: ctx.keep_alive_allowed,
                    segment_query,
                    // Live playlists are not viewer sessions yet (docs/hls.md "Limits").
                    session: None,
                }));
                out
            }
        }
    }

    /// `/live/NAME/stream.ts` (or a segmented recording's file): the recording as a file of
    /// its synced length (ranges, sendfile).
    #[allow(clippy::too_many_arguments)]
    fn respond_live_media(
        &mut self,
        req: &Request,
        ctx: &ResponseContext<'_>,
        class: Arc<str>,
        memory: &dyn Fn(penstock_core::http::Response, Arc<str>) -> Out,
        tls: Mode,
        feed: &LiveFeed,
        media: &std::path::Path,
        len_bytes: u64,
    ) -> Out {
        let shared = self.shared.clone();
        let file = match std::fs::File::open(media) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(live = %feed.name, error = %e, "opening the live recording");
                shared.metrics.error("open_failed");
                return memory(unavailable(req, ctx), class);
            }
        };
        let start_ns = feed.start_wall_ns();
        let meta = FileMeta {
            len_bytes,
            mtime: SystemTime::UNIX_EPOCH + Duration::from_nanos(start_ns),
            // The recording only grows: its bytes never change once synced.
            generation: Some(start_ns),
        };
        let r = respond_file(req, &meta, "video/mp2t", ctx);
        if r.status == Status::RANGE_NOT_SATISFIABLE {
            shared.metrics.error("range_not_satisfiable");
        }
        // A range of it is counted as an HLS segment by `respond` (a `.ts` path).
        let has_file = r.body.iter().any(|p| matches!(p, BodyPiece::File { .. }));
        let mut out = memory(r, class);
        if has_file {
            out.file = Some(file);
            out.file_label = req.path.clone();
            out.path_label = match tls {
                Mode::Plain => "sendfile",
                Mode::Ktls => "ktls",
                Mode::User => "tls-user",
            };
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocking_query_is_read_and_bad_ones_refused() {
        assert_eq!(blocking_msn(None), Ok(None));
        assert_eq!(blocking_msn(Some("s=abc")), Ok(None));
        assert_eq!(blocking_msn(Some("_HLS_msn=12&s=x")), Ok(Some(12)));
        assert_eq!(blocking_msn(Some("_HLS_msn=12&_HLS_part=1")), Ok(Some(12)));
        assert!(blocking_msn(Some("_HLS_msn=-1")).is_err());
        assert!(blocking_msn(Some("_HLS_msn=")).is_err());
        assert!(blocking_msn(Some("_HLS_part=2")).is_err());
    }
}
