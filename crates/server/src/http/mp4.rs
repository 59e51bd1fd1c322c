//! HLS and DASH of an MP4 beneath the root (docs/hls.md). A **fragmented** MP4 (CMAF) is
//! served as byte ranges of itself: `PATH/index.m3u8` is its media playlist (`EXT-X-MAP` on
//! the init section, segments that are runs of whole fragments) and `PATH/manifest.mpd` its
//! DASH manifest (`SegmentList` of `mediaRange`s); its segments are range GETs of PATH, the
//! ordinary file path (sendfile). A **plain** MP4 is packaged on the fly: for PATH
//! an `.mp4` (`.m4v`, `.mov`), `PATH/index.m3u8` (multivariant: the audio track as an
//! `EXT-X-MEDIA` rendition, the video track a variant), `PATH/track-N.m3u8` (media playlists,
//! fMP4 with `EXT-X-MAP`), `PATH/manifest.mpd` (DASH), `PATH/track-N/init.mp4` and
//! `PATH/track-N/K.m4s`; `PATH/iframes.m3u8` (`EXT-X-I-FRAMES-ONLY`) names each key frame as
//! a segment of its own, `PATH/track-N/key-S.m4s` (`penstock_core::mp4::package`'s doc says
//! why not byte ranges). The package (sample index, segments, init segments) is built once
//! per file version by an index thread (`crate::hls`); a media segment is its `moof` + `mdat`
//! header from memory, then the samples' byte ranges of PATH by sendfile (`send.rs` corks
//! the socket around a body of several pieces). A file that is no MP4 penstock packages is a
//! 415 whose body names why.

use std::sync::Arc;
use std::time::SystemTime;

use penstock_core::http::{
    BodyPiece, ETag, Method, Request, ResponseContext, Status, respond_error,
};
use penstock_core::mp4::{
    MediaSegment, TrackKind, dash_manifest, hls_i_frames, hls_master, hls_media, key_segment,
};

use super::Worker;
use super::send::Out;
use crate::confine::Opened;

/// What a request beneath `PATH.mp4/` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mp4Request {
    Master,
    Manifest,
    Media(u32),
    Init(u32),
    Segment(u32, usize),
    IFrames,
    /// Key frame `S` (a sync sample's index) of track `N`: `track-N/key-S.m4s`.
    Key(u32, usize),
}

impl Mp4Request {
    fn parse(rest: &str) -> Option<Mp4Request> {
        match rest {
            "index.m3u8" => return Some(Mp4Request::Master),
            "manifest.mpd" => return Some(Mp4Request::Manifest),
            "iframes.m3u8" => return Some(Mp4Request::IFrames),
            _ => {}
        }
        let t = rest.strip_prefix("track-")?;
        if let Some(id) = t.strip_suffix(".m3u8") {
            return id.parse().ok().map(Mp4Request::Media);
        }
        let (id, file) = t.split_once('/')?;
        let id: u32 = id.parse().ok()?;
        if file == "init.mp4" {
            return Some(Mp4Request::Init(id));
        }
        if let Some(k) = file.strip_prefix("key-") {
            let k = k.strip_suffix(".m4s")?.parse().ok()?;
            return Some(Mp4Request::Key(id, k));
        }
        let k = file.strip_suffix(".m4s")?.parse().ok()?;
        Some(Mp4Request::Segment(id, k))
    }
}

/// `/a/b.mp4/rest` → (`/a/b.mp4`, `rest`): the first path component named as an MP4.
fn split_mp4_path(path: &str) -> Option<(&str, &str)> {
    let mut from = 0;
    while let Some(i) = path[from..].find('/') {
        let end = from + i;
        if end > 0 && crate::hls::is_mp4_name(&path[..end]) {
            return Some((&path[..end], &path[end + 1..]));
        }
        from = end + 1;
    }
    None
}

impl Worker {
    /// A request beneath `PATH/` where PATH is an MP4 file beneath the root: its playlists,
    /// manifest, init and media segments; `None` for every other request.
    pub(super) fn respond_mp4(
        &mut self,
        req: &Request,
        ctx: &ResponseContext<'_>,
        class: &Arc<str>,
        memory: &dyn Fn(penstock_core::http::Response, Arc<str>) -> Out,
    ) -> Option<Out> {
        let shared = self.shared.clone();
        if !shared.hls.enabled() || !matches!(req.method, Method::Get | Method::Head) {
            return None;
        }
        let (mp4_path, rest) = split_mp4_path(&req.path)?;
        let what = Mp4Request::parse(rest)?;
        let rel = mp4_path.trim_start_matches('/');
        let Ok(Opened::File { file, mtime, .. }) = self.site.root.open_path(rel) else {
            return None;
        };
        self.playlist_made = true;
        match what {
            Mp4Request::Master => shared.metrics.hls_playlist("master"),
            Mp4Request::Media(_) => shared.metrics.hls_playlist("media"),
            Mp4Request::Manifest => shared.metrics.hls_playlist("dash"),
            Mp4Request::IFrames => shared.metrics.hls_playlist("iframes"),
            Mp4Request::Init(_) | Mp4Request::Segment(..) | Mp4Request::Key(..) => {
                shared.metrics.hls_segments.inc();
            }
        }
        let r = match shared.hls.lookup_mp4(&file, &self.engine_waker) {
            crate::hls::Lookup::Ready(built) => {
                let r = mp4_response(&shared, req, ctx, built, mtime, what);
                let has_file = r.body.iter().any(|p| matches!(p, BodyPiece::File { .. }));
                let mut out = memory(r, class.clone());
                if has_file {
                    out.file = Some(file);
                    out.file_label = mp4_path.to_string();
                    out.path_label = "sendfile";
                }
                return Some(out);
            }
            crate::hls::Lookup::Building(build) => {
                // Not packaged yet: the connection waits off the loop (`indexing.rs`).
                let r = super::respond::unavailable(req, ctx);
                let mut out = memory(r, class.clone());
                out.keep_alive = req.keep_alive && ctx.keep_alive_allowed;
                out.file_label = mp4_path.to_string();
                out.hls_wait = Some(Box::new(super::indexing::IndexPending {
                    build: super::indexing::PendingBuild::Mp4 { build, file, what },
                    mtime,
                    keep_alive_allowed: ctx.keep_alive_allowed,
                    // MP4 playlists do not carry session tokens yet: under a location that
                    // requires a credential each request carries its own (docs/security.md).
                    segment_query: None,
                    session: None,
                }));
                return Some(out);
            }
            crate::hls::Lookup::Busy => {
                shared.metrics.error("hls_busy");
                let closing = ResponseContext {
                    keep_alive_allowed: false,
                    ..*ctx
                };
                super::respond::unavailable(req, &closing)
            }
        };
        Some(memory(r, class.clone()))
    }
}

/// The answer to `what` once the MP4's package is `built`.
pub(super) fn mp4_response(
    shared: &super::HttpShared,
    req: &Request,
    ctx: &ResponseContext<'_>,
    built: crate::hls::Built<crate::hls::Mp4Package>,
    mtime: SystemTime,
    what: Mp4Request,
) -> penstock_core::http::Response {
    let pkg = match built {
        Ok(p) => p,
        Err(crate::hls::HlsError::Io(e)) => {
            tracing::warn!(path = %req.path, error = %e, "reading an MP4 to package it");
            shared.metrics.error("open_failed");
            return respond_error(Status::INTERNAL_SERVER_ERROR, Some(req), ctx);
        }
        Err(e) => {
            tracing::debug!(path = %req.path, error = %e, "no HLS/DASH for this MP4");
            shared.metrics.error("hls_not_indexable");
            return unsupported(req, ctx, &e.to_string());
        }
    };
    let not_found = || {
        shared.metrics.error("not_found");
        respond_error(Status::NOT_FOUND, Some(req), ctx)
    };
    let text = |body: String, content_type: &'static str| {
        let etag = ETag::for_file(body.len() as u64, mtime);
        super::respond::made_ok(
            req,
            ctx,
            content_type,
            Some((&etag, mtime)),
            body.into_bytes(),
        )
    };
    let pkg = match &*pkg {
        crate::hls::Mp4Package::Plain(p) => p,
        crate::hls::Mp4Package::Fragmented(frag) => {
            // A fragmented MP4 is its own segments: `index.m3u8` is its media playlist and
            // `manifest.mpd` its DASH manifest, both naming byte ranges of the file (one level
            // up: `../NAME`), which are ordinary range GETs of it. Nothing else is made.
            let uri = crate::hls::segment_uri(split_mp4_path(&req.path).map_or("", |p| p.0));
            return match what {
                Mp4Request::Master => text(frag.playlist(&uri), "application/vnd.apple.mpegurl"),
                Mp4Request::Manifest => text(frag.manifest(&uri), "application/dash+xml"),
                _ => not_found(),
            };
        }
    };
    match what {
        Mp4Request::Master => text(
            hls_master(&pkg.movie, &pkg.packaging),
            "application/vnd.apple.mpegurl",
        ),
        Mp4Request::Media(id) => match hls_media(&pkg.movie, &pkg.packaging, id) {
            Some(p) => text(p, "application/vnd.apple.mpegurl"),
            None => not_found(),
        },
        Mp4Request::Manifest => text(
            dash_manifest(&pkg.movie, &pkg.packaging),
            "application/dash+xml",
        ),
        Mp4Request::Init(id) => match pkg.inits.iter().find(|(t, _)| *t == id) {
            Some((_, init)) => {
                let etag = ETag::for_file(init.len() as u64, mtime);
                super::respond::made_ok(req, ctx, "video/mp4", Some((&etag, mtime)), init.clone())
            }
            None => not_found(),
        },
        Mp4Request::IFrames => match hls_i_frames(&pkg.movie) {
            Some(p) => text(p, "application/vnd.apple.mpegurl"),
            None => not_found(),
        },
        Mp4Request::Segment(..) | Mp4Request::Key(..) => {
            let seg = match what {
                Mp4Request::Segment(id, k) => {
                    let (Some(track), Some(cut)) = (pkg.movie.track(id), pkg.packaging.track(id))
                    else {
                        return not_found();
                    };
                    let Some(span) = cut.segments.get(k) else {
                        return not_found();
                    };
                    MediaSegment::build(track, span, k)
                }
                Mp4Request::Key(id, k) => {
                    match pkg.movie.track(id).filter(|t| t.kind == TrackKind::Video) {
                        Some(track) => match key_segment(track, k) {
                            Some(seg) => seg,
                            None => return not_found(),
                        },
                        None => return not_found(),
                    }
                }
                _ => return not_found(),
            };
            // Key segments' validators are told apart from media segments' by their number.
            let k = match what {
                Mp4Request::Key(_, k) => (1usize << 32) + k,
                Mp4Request::Segment(_, k) => k,
                _ => 0,
            };
            let len = seg.len_bytes();
            let mut pieces = Vec::with_capacity(1 + seg.ranges.len());
            pieces.push(BodyPiece::Bytes(seg.header));
            pieces.extend(
                seg.ranges
                    .iter()
                    .map(|&(offset_bytes, len_bytes)| BodyPiece::File {
                        offset_bytes,
                        len_bytes,
                    }),
            );
            // The segment's validator: its size and the file's mtime, with its number mixed
            // into the time (two segments of one size differ).
            let etag = ETag::for_file(len, mtime + std::time::Duration::from_nanos(k as u64 + 1));
            super::respond::pieces_ok(req, ctx, "video/mp4", Some((&etag, mtime)), pieces, len)
        }
    }
}

/// `415 Unsupported Media Type` whose text names why (the codec, the table, the box).
fn unsupported(
    req: &Request,
    ctx: &ResponseContext<'_>,
    why: &str,
) -> penstock_core::http::Response {
    super::respond::text_response(
        req,
        ctx,
        Status::UNSUPPORTED_MEDIA_TYPE,
        None,
        &format!("415 Unsupported Media Type: {why}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mp4_paths_split_at_the_mp4_component() {
        assert_eq!(
            split_mp4_path("/films/a b.mp4/track-1/3.m4s"),
            Some(("/films/a b.mp4", "track-1/3.m4s"))
        );
        assert_eq!(
            split_mp4_path("/x.MP4/index.m3u8"),
            Some(("/x.MP4", "index.m3u8"))
        );
        assert_eq!(split_mp4_path("/x.ts/index.m3u8"), None);
        assert_eq!(
            Mp4Request::parse("track-2/17.m4s"),
            Some(Mp4Request::Segment(2, 17))
        );
        assert_eq!(
            Mp4Request::parse("track-2/init.mp4"),
            Some(Mp4Request::Init(2))
        );
        assert_eq!(
            Mp4Request::parse("track-1.m3u8"),
            Some(Mp4Request::Media(1))
        );
        assert_eq!(
            Mp4Request::parse("manifest.mpd"),
            Some(Mp4Request::Manifest)
        );
        assert_eq!(Mp4Request::parse("track-x/1.m4s"), None);
        assert_eq!(Mp4Request::parse("iframes.m3u8"), Some(Mp4Request::IFrames));
        assert_eq!(
            Mp4Request::parse("track-1/key-50.m4s"),
            Some(Mp4Request::Key(1, 50))
        );
        assert_eq!(Mp4Request::parse("track-1/key-x.m4s"), None);
        assert_eq!(Mp4Request::parse("other"), None);
    }
}
