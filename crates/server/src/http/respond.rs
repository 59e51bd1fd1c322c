//! The response to a request: [`Worker::respond`] turns a parsed request into an [`Out`]:
//! `/metrics`, or the file opened beneath the root (an index in a directory), conditionals
//! and ranges by the core's `respond_file`, the rate limit of the location, and whether the
//! engine sends the body (its place reserved now, before the head, or a 503).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use penstock_core::http::{
    BodyPiece, FileMeta, HttpError, Method, Request, ResponseContext, ResponseHead, Status,
    boundary_for, connection_header, respond_error, respond_file, respond_redirect_to_directory,
    write_response_head,
};
use penstock_core::stream::IoKind;
use penstock_core::stream::plan::{EndpointFacts, SocketFacts};
use penstock_driver::StreamError;

use super::Worker;
use super::send::{Out, RateLimit};
use super::tls_io::Mode;
use crate::config::LiveConfig;
use crate::confine::{Opened, Refused};
use crate::metrics::{Format, MetricsPage};

/// The most credentials (with a `sessions` cap or a `jti`) one HTTP connection holds
/// sessions of.
const VIEWER_HOLDS_PER_CONNECTION_MAX: usize = 4;

impl Worker {
    /// The response to one parsed request, with what its location adds to every head
    /// (`crate::delivery`: CORS lines; `Cache-Control` for the playlists made here and for media
    /// files), and counted as an HLS request where it is one.
    pub(super) fn respond(
        &mut self,
        req: &Request,
        keep_alive_allowed: bool,
        live: &LiveConfig,
        metrics_format: Format,
        tls: Mode,
        peer: Option<std::net::IpAddr>,
    ) -> Out {
        self.playlist_made = false;
        self.live_cache = None;
        let mut out = self.respond_any(req, keep_alive_allowed, live, metrics_format, tls, peer);
        if req.method == Method::Options {
            // The preflight carries its own lines (and a 405 elsewhere has none to carry).
            return out;
        }
        let policy = live.policy(&req.path);
        let media = self.playlist_made || is_media_file_name(&req.path);
        let delivery = crate::delivery::Delivery {
            cors: crate::delivery::cors_lines(policy.cors_allow_origins, req.origin.as_deref()),
            cache: if let Some(short) = self.live_cache {
                if short {
                    crate::delivery::live_cache_line()
                } else {
                    crate::delivery::cache_line(self.shared.hls.cache_max_age_s())
                }
            // A playlist made for one viewer's session names its id: no cache may keep it
            // for another viewer (nor answer a 304 for it: no conditional without a copy).
            } else if self.playlist_made && policy.sessions {
                "Cache-Control: no-store\r\n".to_string()
            } else if media {
                crate::delivery::cache_line(self.shared.hls.cache_max_age_s())
            } else {
                String::new()
            },
        };
        if req.method == Method::Get && req.range.is_some() && crate::hls::is_ts_name(&req.path) {
            self.shared.metrics.hls_segments.inc();
        }
        if out.hls_wait.is_none() && out.origin_type.is_none() {
            delivery.apply(&mut out.head, out.status);
        }
        out.delivery = delivery;
        out
    }

    /// [`Worker::respond`] before the location's lines.
    fn respond_any(
        &mut self,
        req: &Request,
        keep_alive_allowed: bool,
        live: &LiveConfig,
        metrics_format: Format,
        tls: Mode,
        peer: Option<std::net::IpAddr>,
    ) -> Out {
        self.boundary_seed = self
            .boundary_seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let boundary = boundary_for(self.boundary_seed);
        let shared = self.shared.clone();
        let site = self.site.clone();
        let ctx = ResponseContext {
            date: SystemTime::now(),
            server: &shared.server_name,
            keep_alive_allowed,
            keep_alive_timeout_s: Some(live.limits.idle_timeout_ms / 1000),
            ranges_max: live.limits.ranges_max,
            boundary: &boundary,
        };
        let policy = live.policy(&req.path);
        let class: Arc<str> = Arc::from(policy.class);
        let memory = Out::from_response;
        if req.method == Method::Options {
            // A CORS preflight where the location allows cross-origin reads; elsewhere the
            // method is not served.
            if policy.cors_allow_origins.is_empty() {
                shared.metrics.error("method_not_allowed");
                return memory(
                    respond_error(Status::METHOD_NOT_ALLOWED, Some(req), &ctx),
                    class,
                );
            }
            return memory(
                crate::delivery::preflight(req, &ctx, policy.cors_allow_origins),
                class,
            );
        }
        if !shared.metrics_path.is_empty() && req.path == shared.metrics_path {
            return memory(
                self.metrics_response(req, &ctx, metrics_format),
                Arc::from("metrics"),
            );
        }
        if !shared.health_path.is_empty() && req.path == shared.health_path {
            return memory(health_response(req, &ctx), Arc::from("health"));
        }
        // Hidden and backup files (`/.env`, `/.git/config`, `x~`, `x.swp`) are not served
        // unless the location says so: answered as if absent (docs/security.md).
        if crate::auth::is_hidden(&req.path) && !shared.viewers.serves_hidden(&req.path) {
            shared.metrics.error("hidden");
            return memory(respond_error(Status::NOT_FOUND, Some(req), &ctx), class);
        }
        // Who may watch: the location's `auth` (docs/security.md "Viewers").
        let grant = match shared.viewers.check(
            &req.path,
            req.query.as_deref(),
            req.authorization.as_deref(),
            peer,
            "http",
        ) {
            crate::auth::Decision::Open => (None, None),
            crate::auth::Decision::Granted { grant, limits } => (grant, limits),
            crate::auth::Decision::Refused(penstock_core::auth::AuthError::Missing) => {
                shared.metrics.error("auth_missing");
                return memory(unauthorized(req, &ctx), class);
            }
            crate::auth::Decision::Refused(e) => {
                shared.metrics.error("auth_refused");
                // A revoked JWT's session token: its HLS session ends now (its admission
                // given back), not when it idles out.
                if e == penstock_core::auth::AuthError::Revoked
                    && let Ok(Some(c)) =
                        penstock_core::auth::parse_query(req.query.as_deref().unwrap_or(""))
                    && let Some(sid) = c.sid
                    && shared.hls_sessions.kick(&sid)
                {
                    tracing::info!(session = %sid, path = %req.path, "hls session ended: its token was revoked");
                    shared.metrics.hls_sessions_revoked.inc();
                }
                return memory(respond_error(Status::FORBIDDEN, Some(req), &ctx), class);
            }
        };
        let (grant, limits) = grant;
        // A token's `sessions` cap: this connection is one of its sessions from its first
        // request under the credential until it closes (docs/security.md "Viewers").
        if let Some(l) = limits
            .as_ref()
            .filter(|l| l.sessions_max.is_some() || l.jti.is_some())
            && !self
                .viewer_holds
                .iter()
                .any(|h| h.credential() == l.credential)
        {
            let refused = if self.viewer_holds.len() >= VIEWER_HOLDS_PER_CONNECTION_MAX {
                Some(format!(
                    "one connection carries at most {VIEWER_HOLDS_PER_CONNECTION_MAX} viewer credentials with a sessions cap or a jti"
                ))
            } else {
                match shared.viewers.open_session(l) {
                    Ok(Some(h)) => {
                        self.viewer_holds.push(h);
                        None
                    }
                    Ok(None) => None,
                    Err(e) => Some(e.to_string()),
                }
            };
            if let Some(why) = refused {
                shared.metrics.error("auth_sessions_cap");
                crate::peer_warn!(
                    "auth_refused",
                    protocol = "http",
                    peer = ?peer,
                    path = %req.path,
                    credential = %l.credential,
                    "refused a viewer's session: {why}"
                );
                return memory(
                    text_response(req, &ctx, Status::TOO_MANY_REQUESTS, None, &why),
                    class,
                );
            }
        }
        let token_rate_bytes_per_s = limits.as_ref().and_then(|l| l.rate_bytes_per_s);
        // A JWT's `tenant` claim: its paced download is admitted in the tenant's share.
        let token_tenant = crate::tenants::named(
            &shared.engine,
            limits.as_ref().and_then(|l| l.tenant.clone()),
        );
        if let Some(rest) = req.path.strip_prefix("/live/")
            && shared.hls.enabled()
            && shared.hls.has_live()
        {
            // A playlist answered to a credential: its segment URIs carry a session token
            // for the live source's paths (one check per viewer session).
            let dir = req.path.rsplit_once('/').map_or("", |(d, _)| d);
            let segment_query = grant.as_ref().and_then(|g| {
                shared
                    .viewers
                    .session_query(g, &format!("{dir}/{}", super::live::STREAM_NAME))
            });
            return self.respond_live(req, rest, &ctx, class, &memory, tls, segment_query);
        }
        // HLS viewer sessions (docs/hls.md "Viewer sessions"): the session a request names,
        // and its TS files served only to open sessions.
        let session = if policy.sessions && shared.hls.enabled() {
            let asked = match (&grant, policy.auth) {
                // Where viewers show credentials, the session id is the verified token's
                // `sid` (one id for both); a signed URL itself names none.
                (Some(g), _) if g.kind == penstock_core::auth::Kind::Session => Some(g.sid.clone()),
                (_, crate::config::AuthMode::None) => {
                    match penstock_core::hls::session::parse_session_id(
                        req.query.as_deref().unwrap_or(""),
                    ) {
                        Ok(id) => id.map(str::to_string),
                        Err(why) => {
                            shared.metrics.error("hls_session_malformed");
                            return memory(
                                text_response(req, &ctx, Status::BAD_REQUEST, None, why),
                                class,
                            );
                        }
                    }
                }
                _ => None,
            };
            Some(SessionAsk {
                asked,
                addr: peer.unwrap_or(std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)),
                grant: grant.clone(),
                tenant: token_tenant.clone(),
            })
        } else {
            None
        };
        // The tenant a served segment's bytes are counted for (`penstock_tenant_bytes_total`).
        let mut bytes_tenant: Option<String> = None;
        if let Some(ask) = &session
            && matches!(req.method, Method::Get | Method::Head)
            && crate::hls::is_ts_name(&req.path)
        {
            let verdict =
                shared
                    .hls_sessions
                    .for_segment(ask.asked.as_deref(), &req.path, ask.addr, || {
                        match site.root.open_path(req.relative_path()) {
                            Ok(Opened::File { file, .. }) => shared
                                .hls
                                .cached(&file)
                                .map(|i| shared.hls.peak_bits_per_s(&i)),
                            _ => None,
                        }
                    });
            let refuse = |status, retry: Option<u64>, why: &str| {
                shared.metrics.error("hls_session_refused");
                memory(text_response(req, &ctx, status, retry, why), class.clone())
            };
            match verdict {
                crate::hls_sessions::SegmentVerdict::Serve => {
                    bytes_tenant = ask
                        .asked
                        .as_deref()
                        .and_then(|id| shared.hls_sessions.tenant_of(id));
                }
                crate::hls_sessions::SegmentVerdict::NoSession => {
                    return refuse(
                        Status::FORBIDDEN,
                        None,
                        "this location serves its media to HLS sessions only: fetch the \
                         playlist (PATH/index.m3u8), whose URIs carry the session id",
                    );
                }
                crate::hls_sessions::SegmentVerdict::OtherTitle => {
                    return refuse(
                        Status::FORBIDDEN,
                        None,
                        "this session was opened for another title",
                    );
                }
                crate::hls_sessions::SegmentVerdict::Ended => {
                    return refuse(
                        Status::FORBIDDEN,
                        None,
                        "this session has ended (idle longer than hls.session_idle_ms): \
                         fetch the playlist again",
                    );
                }
                crate::hls_sessions::SegmentVerdict::Refused(r) => {
                    return refuse(
                        Status::SERVICE_UNAVAILABLE,
                        Some(r.retry_after_s),
                        &format!("hls session not admitted: {}", r.reason),
                    );
                }
            }
        }
        if let Some(rest) = req.path.strip_prefix("/vol/")
            && !site.volumes.is_empty()
        {
            if tls == Mode::User {
                // The engine writes a partition to the socket itself: not through rustls.
                not_over_user_tls("volume partitions");
                shared.metrics.error("tls_user_unsupported");
                return memory(unavailable(req, &ctx), class);
            }
            return self.respond_volume(req, rest, &ctx, class, &memory);
        }
        if let Some(out) = self.respond_mp4(req, &ctx, &class, &memory) {
            return out;
        }
        if let Some(out) =
            self.respond_hls(req, &ctx, &class, &memory, grant.as_ref(), session.as_ref())
        {
            return out;
        }
        if let Some(out) =
            self.respond_hls_master(req, &ctx, &class, &memory, grant.as_ref(), session.as_ref())
        {
            return out;
        }
        let opened = match site.root.open_path(req.relative_path()) {
            Ok(Opened::Directory(_)) if !req.path.ends_with('/') => {
                return memory(respond_redirect_to_directory(req, &ctx), class);
            }
            Ok(Opened::Directory(dir)) => match &site.index {
                Some(name) => site
                    .root
                    .open_in(&dir, name)
                    .map(|o| (o, Some(name.as_str())))
                    // A directory without its index is not listed: 403, as nginx says.
                    .map_err(|e| match e {
                        Refused::NotFound => Refused::Forbidden,
                        e => e,
                    }),
                None => Err(Refused::Forbidden),
            },
            Ok(o) => Ok((o, None)),
            Err(e) => Err(e),
        };
        let (file, len_bytes, mtime, type_name) = match opened {
            Ok((
                Opened::File {
                    file,
                    len_bytes,
                    mtime,
                },
                index,
            )) => (
                file,
                len_bytes,
                mtime,
                index.unwrap_or(&req.path).to_string(),
            ),
            Err(Refused::Denied) => {
                // Beneath the root but not readable by the server: the operator should know.
                crate::peer_warn!(
                    "unreadable",
                    protocol = "http",
                    path = %req.path,
                    "a file the server may not read (permission denied): answered 403"
                );
                shared.metrics.error("forbidden");
                return memory(respond_error(Status::FORBIDDEN, Some(req), &ctx), class);
            }
            Ok((Opened::Directory(_), _)) | Err(Refused::Forbidden) => {
                shared.metrics.error("forbidden");
                return memory(respond_error(Status::FORBIDDEN, Some(req), &ctx), class);
            }
            Err(Refused::NotFound)
                if shared.origin.is_some()
                    && matches!(req.method, Method::Get | Method::Head)
                    && !req.names_directory() =>
            {
                // Answered from the origin by a thread of its own (`origin.rs`); on a
                // `tls-user` connection the thread writes through the connection's rustls
                // session, handed to it for the response.
                let mut out = memory(respond_error(Status::NOT_FOUND, Some(req), &ctx), class);
                out.keep_alive = req.keep_alive && ctx.keep_alive_allowed;
                out.path_label = "origin";
                out.origin_type = Some(site.content_type(&req.path).to_string());
                return out;
            }
            Err(Refused::NotFound) => {
                shared.metrics.error("not_found");
                return memory(respond_error(Status::NOT_FOUND, Some(req), &ctx), class);
            }
            Err(Refused::Exhausted) => {
                // Out of descriptors: 503 and the connection closed (it holds one), never a
                // 500 kept alive.
                shared.metrics.error("open_exhausted");
                let ctx = ResponseContext {
                    keep_alive_allowed: false,
                    ..ctx
                };
                return memory(
                    respond_error(Status::SERVICE_UNAVAILABLE, Some(req), &ctx),
                    class,
                );
            }
            Err(Refused::Failed | Refused::Exists) => {
                shared.metrics.error("open_failed");
                return memory(
                    respond_error(Status::INTERNAL_SERVER_ERROR, Some(req), &ctx),
                    class,
                );
            }
        };
        let meta = FileMeta {
            len_bytes,
            mtime,
            generation: None,
        };
        let r = respond_file(req, &meta, site.content_type(&type_name), &ctx);
        // A tenant's download (a JWT's `tenant` claim): its bytes are the tenant's too.
        if let Some(t) = bytes_tenant.or_else(|| token_tenant.clone()) {
            shared
                .metrics
                .tenant_bytes
                .get_or_create(&crate::metrics::TenantLabel { tenant: t })
                .inc_by(r.body.iter().map(BodyPiece::len_bytes).sum());
        }
        if r.status == Status::RANGE_NOT_SATISFIABLE {
            shared.metrics.error("range_not_satisfiable");
        }
        let has_file = r.body.iter().any(|p| matches!(p, BodyPiece::File { .. }));
        // A token's `rate` claim: on a plain connection the engine paces the body (the
        // planner's `Pacing::Rate`); where the engine does not take it (TLS, a multipart
        // body, the engine off or full) this loop's limiter does, at the lower of the
        // token's and the location's rates.
        let one_file = r.body.len() == 1 && matches!(r.body[0], BodyPiece::File { .. });
        let engine_paces = token_rate_bytes_per_s.is_some()
            && tls == Mode::Plain
            && shared.engine_body_bytes_min > 0
            && one_file
            && policy.limit_rate_bytes_per_s == 0;
        // With `engine_paces`, `rate` is what the engine paces at (`engine::hand_off`), and
        // what this loop applies if the engine has no free place after all.
        let loop_rate = match (policy.limit_rate_bytes_per_s, token_rate_bytes_per_s) {
            (0, None) => 0,
            (0, Some(t)) => t,
            (l, None) => l,
            (l, Some(t)) => l.min(t),
        };
        let rate = (loop_rate > 0).then_some(RateLimit {
            bytes_per_s: loop_rate,
            after_bytes: if policy.limit_rate_bytes_per_s > 0 && token_rate_bytes_per_s.is_none() {
                policy.limit_rate_after_bytes
            } else {
                0
            },
            rate_start: None,
        });
        // Only plain connections hand bodies to the engine: on a TLS one this loop sends
        // them (sendfile on kTLS, rustls in user space; SEND_ZC is not planned on kTLS).
        let for_engine = engine_paces
            || (tls == Mode::Plain
                && shared.engine_body_bytes_min > 0
                && rate.is_none()
                && r.body.len() == 1
                && matches!(r.body[0], BodyPiece::File { len_bytes, .. } if len_bytes >= shared.engine_body_bytes_min));
        // Decided before the head is written: a client never gets a 200/206 head whose body
        // is then cut because the engine refused it. No free engine place: this loop sends
        // the body; a path the engine cannot run here: 503, no body.
        let mut tenant_admitted: Option<penstock_driver::Admitted> = None;
        let to_engine = if for_engine {
            // The engine's planner, on what is known before the head (a file of this size
            // to a TCP client): the one rule that will decide at the start.
            let (offset_bytes, len_bytes) = match r.body[0] {
                BodyPiece::File {
                    offset_bytes,
                    len_bytes,
                } => (offset_bytes, len_bytes),
                BodyPiece::Bytes(_) => unreachable!("for_engine is set for one file piece"),
            };
            let mut spec =
                super::engine::body_spec(shared.body_path, &class, offset_bytes, len_bytes);
            if engine_paces && let Some(t) = token_rate_bytes_per_s {
                spec.pacing = penstock_driver::engine::Pacing::Rate(
                    penstock_core::units::Rate::BitsPerSecond(t.saturating_mul(8)),
                );
                // A paced stream sends unit by unit at deadlines, which sendfile of the
                // whole body cannot: the planner picks a path that can (uring or copy).
                spec.path = penstock_core::stream::PathChoice::Auto;
                if token_tenant.is_some() {
                    // A tenant's download is an rt stream at its rate, admitted in the
                    // tenant's share (`hand_off` starts it with the same spec).
                    super::engine::for_tenant(&mut spec);
                }
            }
            let source = EndpointFacts {
                size: Some(meta.len_bytes),
                ..EndpointFacts::of(IoKind::File)
            };
            let target = EndpointFacts {
                socket: Some(SocketFacts {
                    ip: true,
                    loopback: false,
                }),
                ..EndpointFacts::of(IoKind::StreamSocket)
            };
            if let Err(e) = shared.engine.preflight(&spec, source, target) {
                return engine_refused(&shared.metrics, req, &ctx, class, &memory, &e);
            }
            // A tenant's paced download: admitted in its share before the head, as an HLS
            // session is (503 naming the tenant when the share is full).
            if engine_paces && let Some(t) = &token_tenant {
                match crate::tenants::admit(&shared.engine, &shared.metrics, &spec, false, Some(t))
                {
                    Ok(a) => tenant_admitted = a,
                    Err(why) => {
                        shared.metrics.error("tenant_refused");
                        return memory(
                            text_response(
                                req,
                                &ctx,
                                Status::SERVICE_UNAVAILABLE,
                                Some(1),
                                &format!("download not admitted: {why}"),
                            ),
                            class,
                        );
                    }
                }
            }
            match shared.engine.reserve_stream() {
                Ok(slot) => Some(slot),
                Err(StreamError::TooManyStreams(_)) => {
                    shared.metrics.error("engine_full");
                    None
                }
                Err(e) => return engine_refused(&shared.metrics, req, &ctx, class, &memory, &e),
            }
        } else {
            None
        };
        // Sent by this loop after all (no free engine place): the body asks no guarantee.
        if to_engine.is_none() {
            tenant_admitted = None;
        }
        let path_label = if has_file {
            match tls {
                Mode::Plain => "sendfile",
                Mode::Ktls => "ktls",
                Mode::User => "tls-user",
            }
        } else if req.method == Method::Head || !r.status.allows_body() {
            "none"
        } else {
            "memory"
        };
        Out {
            file: has_file.then_some(file),
            file_label: req.path.clone(),
            path_label,
            rate,
            to_engine,
            tenant_admitted,
            ..Out::from_response(r, class)
        }
    }

    /// `PATH/index.m3u8` where PATH is a `.ts` file beneath the root: its HLS playlist
    /// (`crate::hls`); `None` for every other request (and for this one when PATH is not such
    /// a file: a real `index.m3u8` in a directory is served as it is).
    fn respond_hls(
        &mut self,
        req: &Request,
        ctx: &ResponseContext<'_>,
        class: &Arc<str>,
        memory: &dyn Fn(penstock_core::http::Response, Arc<str>) -> Out,
        grant: Option<&penstock_core::auth::Grant>,
        session: Option<&SessionAsk>,
    ) -> Option<Out> {
        let shared = self.shared.clone();
        if !shared.hls.enabled() || !matches!(req.method, Method::Get | Method::Head) {
            return None;
        }
        let (ts_path, kind) = split_playlist_path(&req.path)?;
        // A playlist answered to a credential: its segment URIs carry a session token for
        // the file (one check per viewer session, not per segment).
        let segment_query = grant.and_then(|g| shared.viewers.session_query(g, ts_path));
        if !crate::hls::is_ts_name(ts_path) {
            return None;
        }
        let rel = ts_path.trim_start_matches('/');
        let Ok(Opened::File { file, mtime, .. }) = self.site.root.open_path(rel) else {
            return None;
        };
        self.playlist_made = true;
        shared.metrics.hls_playlist(kind);
        let r = match shared.hls.lookup(&file, &self.engine_waker) {
            crate::hls::Lookup::Ready(built) => hls_response(
                &shared,
                req,
                ctx,
                built,
                mtime,
                segment_query.as_deref(),
                session,
            ),
            crate::hls::Lookup::Building(build) => {
                // Not indexed yet: the connection waits off the loop for the build
                // (`indexing.rs`), which answers it with `hls_response` when it ends.
                let r = unavailable(req, ctx);
                let mut out = memory(r, class.clone());
                out.keep_alive = req.keep_alive && ctx.keep_alive_allowed;
                out.hls_wait = Some(Box::new(super::indexing::IndexPending {
                    build: super::indexing::PendingBuild::Ts(build),
                    mtime,
                    keep_alive_allowed: ctx.keep_alive_allowed,
                    segment_query,
                    session: session.cloned(),
                }));
                return Some(out);
            }
            crate::hls::Lookup::Busy => {
                // `indexers_max` builds under way: come back later, as the origin's busy
                // answer says it.
                shared.metrics.error("hls_busy");
                let closing = ResponseContext {
                    keep_alive_allowed: false,
                    ..*ctx
                };
                unavailable(req, &closing)
            }
        };
        Some(memory(r, class.clone()))
    }

    /// `DIR/master.m3u8` where that path does not exist and DIR is a directory beneath the
    /// root: the multivariant playlist of DIR's renditions (its visible `.ts`/`.m2ts` files,
    /// the first `[hls] renditions_max` by name, those that index; `crate::hls`), 404 when none
    /// does. `None` for every other request: a real `master.m3u8` is served as it is.
    fn respond_hls_master(
        &mut self,
        req: &Request,
        ctx: &ResponseContext<'_>,
        class: &Arc<str>,
        memory: &dyn Fn(penstock_core::http::Response, Arc<str>) -> Out,
        grant: Option<&penstock_core::auth::Grant>,
        session: Option<&SessionAsk>,
    ) -> Option<Out> {
        let shared = self.shared.clone();
        if !shared.hls.enabled() || !matches!(req.method, Method::Get | Method::Head) {
            return None;
        }
        let dir_path = req.path.strip_suffix("/master.m3u8")?;
        if !matches!(
            self.site.root.open_path(req.relative_path()),
            Err(Refused::NotFound)
        ) {
            return None;
        }
        let dir_rel = dir_path.trim_start_matches('/');
        let Ok(Opened::Directory(dir)) =
            self.site
                .root
                .open_path(if dir_rel.is_empty() { "." } else { dir_rel })
        else {
            return None;
        };
        self.playlist_made = true;
        shared.metrics.hls_playlist("master");
        let max = shared.hls.renditions_max();
        let listed = rustix::fs::Dir::read_from(&dir).and_then(|entries| {
            let mut names: Vec<String> = Vec::new();
            for e in entries {
                let e = e?;
                if let Ok(name) = e.file_name().to_str()
                    && crate::hls::is_rendition_name(name)
                {
                    names.push(name.to_string());
                    // Only the first `max` by name are kept, whatever the directory holds.
                    if names.len() > max.saturating_mul(2).max(64) {
                        names.sort_unstable();
                        names.truncate(max);
                    }
                }
            }
            names.sort_unstable();
            names.truncate(max);
            Ok(names)
        });
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            tracing::warn!(path = %req.path, error = %e, "{what}");
            shared.metrics.error("open_failed");
            Some(memory(
                respond_error(Status::INTERNAL_SERVER_ERROR, Some(req), ctx),
                class.clone(),
            ))
        };
        let names = match listed {
            Ok(n) => n,
            Err(e) => return fail("listing a directory of renditions", &e),
        };
        let mut variants = Vec::with_capacity(names.len());
        let mut newest = SystemTime::UNIX_EPOCH;
        for name in &names {
            let Ok(Opened::File { file, mtime, .. }) = self.site.root.open_in(&dir, name) else {
                continue;
            };
            match shared.hls.variant(&file, name) {
                Ok(v) => {
                    variants.push((name, v));
                    newest = newest.max(mtime);
                }
                Err(e @ (crate::hls::HlsError::Index(_) | crate::hls::HlsError::Mp4(_))) => {
                    tracing::debug!(path = %dir_path, file = %name, error = %e, "not a rendition");
                }
                Err(crate::hls::HlsError::Io(e)) => {
                    return fail("reading a file to index it", &e);
                }
            }
        }
        if variants.is_empty() {
            shared.metrics.error("not_found");
            return Some(memory(
                respond_error(Status::NOT_FOUND, Some(req), ctx),
                class.clone(),
            ));
        }
        // A viewer session for the title (admitted at its highest rendition's peak, so the
        // player may switch between renditions without asking again), or none.
        let sid = match session {
            Some(ask) => {
                let scope = format!("{dir_path}/");
                let peak = variants.iter().map(|(_, v)| v.bandwidth).max().unwrap_or(0);
                match shared.hls_sessions.for_playlist(
                    None,
                    &scope,
                    &scope,
                    ask.addr,
                    peak,
                    ask.tenant.as_deref(),
                ) {
                    Ok(id) => Some(id),
                    Err(r) => {
                        shared.metrics.error("hls_session_refused");
                        return Some(memory(
                            text_response(
                                req,
                                ctx,
                                Status::SERVICE_UNAVAILABLE,
                                Some(r.retry_after_s),
                                &format!("hls session not admitted: {}", r.reason),
                            ),
                            class.clone(),
                        ));
                    }
                }
            }
            None => None,
        };
        let variants: Vec<penstock_core::hls::Variant> = variants
            .into_iter()
            .map(|(name, mut v)| {
                // Answered to a credential: each media playlist's URI carries a session
                // token for it (which then mints its segments' tokens); in a sessions
                // location, the session's id (in the token where there is one).
                let query = |playlist: &str| match (grant, &sid) {
                    (Some(g), Some(id)) => shared.viewers.session_query(
                        &penstock_core::auth::Grant {
                            sid: id.clone(),
                            ..g.clone()
                        },
                        playlist,
                    ),
                    (Some(g), None) => shared.viewers.session_query(g, playlist),
                    (None, Some(id)) => Some(format!("sid={id}")),
                    (None, None) => None,
                };
                if let Some(q) = query(&format!("{dir_path}/{name}/index.m3u8")) {
                    v.uri.push('?');
                    v.uri.push_str(&q);
                }
                if let Some((uri, _)) = &mut v.i_frames
                    && let Some(q) = query(&format!("{dir_path}/{name}/iframes.m3u8"))
                {
                    uri.push('?');
                    uri.push_str(&q);
                }
                v
            })
            .collect();
        let body = penstock_core::hls::master_playlist(&variants);
        let etag = penstock_core::http::ETag::for_file(body.len() as u64, newest);
        Some(memory(
            playlist_ok(req, ctx, &etag, newest, body.into_bytes()),
            class.clone(),
        ))
    }

    /// `/vol/NAME/PART`: partition PART of the configured volume NAME, as a file whose `ETag`
    /// is the partition's generation (it changes with every committed write or truncation).
    /// Ranges (one per request), conditionals and HEAD as for files; the body always goes to
    /// the engine, which reads the members (a partition is no single file to sendfile from).
    /// Anything that does not name a ready partition of a configured volume is a 404.
    fn respond_volume(
        &mut self,
        req: &Request,
        rest: &str,
        ctx: &ResponseContext<'_>,
        class: Arc<str>,
        memory: &dyn Fn(penstock_core::http::Response, Arc<str>) -> Out,
    ) -> Out {
        use penstock_driver::volume::{Access, Volume, VolumeError};
        let shared = self.shared.clone();
        let not_found = |shared: &super::HttpShared| {
            shared.metrics.error("not_found");
            memory(
                respond_error(Status::NOT_FOUND, Some(req), ctx),
                class.clone(),
            )
        };
        let Some((vname, pname)) = rest.split_once('/') else {
            return not_found(&shared);
        };
        let valid = |n: &str| penstock_core::volume::Name::new(n).is_ok();
        if !valid(vname) || !valid(pname) {
            return not_found(&shared);
        }
        let Some(member) = self.site.volumes.get(vname).cloned() else {
            return not_found(&shared);
        };
        let opened = Volume::open(&member, Access::Shared).and_then(|v| {
            let p = v.meta().partition(pname).map(|p| p.generation);
            let pio = v.partition_io(pname, false)?;
            Ok((pio, p.unwrap_or(0)))
        });
        let (pio, generation) = match opened {
            Ok(x) => x,
            Err(VolumeError::NoSuchPartition { .. } | VolumeError::NotReady { .. }) => {
                return not_found(&shared);
            }
            Err(e) => {
                tracing::warn!(volume = vname, error = %e, "a configured volume does not open");
                shared.metrics.error("open_failed");
                return memory(
                    respond_error(Status::INTERNAL_SERVER_ERROR, Some(req), ctx),
                    class,
                );
            }
        };
        let mtime = std::fs::metadata(&member)
            .and_then(|m| m.modified())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let meta = FileMeta {
            len_bytes: pio.size_bytes,
            mtime,
            generation: Some(generation),
        };
        // One range per request: the engine sends one extent.
        let one_range = ResponseContext {
            ranges_max: 1,
            ..*ctx
        };
        let r = respond_file(req, &meta, self.site.content_type(pname), &one_range);
        if r.status == Status::RANGE_NOT_SATISFIABLE {
            shared.metrics.error("range_not_satisfiable");
        }
        let has_body = r.body.iter().any(|p| matches!(p, BodyPiece::File { .. }));
        if !has_body {
            return memory(r, class);
        }
        let to_engine = match shared.engine.reserve_stream() {
            Ok(slot) => slot,
            Err(_) => {
                shared.metrics.error("engine_full");
                return memory(unavailable(req, ctx), class);
            }
        };
        Out {
            file_label: req.path.clone(),
            path_label: "volume",
            to_engine: Some(to_engine),
            volume: Some(Box::new(pio)),
            ..Out::from_response(r, class)
        }
    }
}

/// `PATH/index.m3u8` → (PATH, `"media"`); `PATH/iframes.m3u8` → (PATH, `"iframes"`): the
/// TS file's media playlist or its `EXT-X-I-FRAMES-ONLY` one (the metrics' kind).
fn split_playlist_path(path: &str) -> Option<(&str, &'static str)> {
    if let Some(p) = path.strip_suffix("/index.m3u8") {
        return Some((p, "media"));
    }
    path.strip_suffix("/iframes.m3u8").map(|p| (p, "iframes"))
}

/// The answer to `PATH/index.m3u8` or `PATH/iframes.m3u8` (`req.path`) once PATH's index is
/// `built`: the playlist,
/// a 415 for a file that has none, a 500 when it could not be read.
pub(super) fn hls_response(
    shared: &super::HttpShared,
    req: &Request,
    ctx: &ResponseContext<'_>,
    built: crate::hls::Built,
    mtime: SystemTime,
    segment_query: Option<&str>,
    session: Option<&SessionAsk>,
) -> penstock_core::http::Response {
    let (ts_path, kind) = split_playlist_path(&req.path).unwrap_or((&req.path, "media"));
    match built {
        Ok(index) => {
            let mut uri = crate::hls::segment_uri(ts_path);
            // In a sessions location: the viewer's session (the one its request names, or a
            // new one admitted at this rendition's peak), its id in the segments' URIs.
            let session_query = match session {
                Some(ask) => {
                    let peak = shared.hls.peak_bits_per_s(&index);
                    match shared.hls_sessions.for_playlist(
                        ask.asked.as_deref(),
                        ts_path,
                        ts_path,
                        ask.addr,
                        peak,
                        ask.tenant.as_deref(),
                    ) {
                        Ok(id) => match &ask.grant {
                            Some(g) => shared.viewers.session_query(
                                &penstock_core::auth::Grant {
                                    sid: id,
                                    ..g.clone()
                                },
                                ts_path,
                            ),
                            None => Some(format!("sid={id}")),
                        },
                        Err(r) => {
                            shared.metrics.error("hls_session_refused");
                            return text_response(
                                req,
                                ctx,
                                Status::SERVICE_UNAVAILABLE,
                                Some(r.retry_after_s),
                                &format!("hls session not admitted: {}", r.reason),
                            );
                        }
                    }
                }
                None => segment_query.map(str::to_string),
            };
            if let Some(q) = &session_query {
                uri.push('?');
                uri.push_str(q);
            }
            let p = if kind == "iframes" {
                shared.hls.i_frame_playlist(&index, &uri)
            } else {
                shared.hls.playlist(&index, &uri)
            };
            let etag = penstock_core::http::ETag::for_file(p.len() as u64, mtime);
            playlist_ok(req, ctx, &etag, mtime, p.into_bytes())
        }
        Err(e @ (crate::hls::HlsError::Index(_) | crate::hls::HlsError::Mp4(_))) => {
            tracing::debug!(path = %ts_path, error = %e, "no HLS playlist");
            shared.metrics.error("hls_not_indexable");
            respond_error(Status::UNSUPPORTED_MEDIA_TYPE, Some(req), ctx)
        }
        Err(crate::hls::HlsError::Io(e)) => {
            tracing::warn!(path = %ts_path, error = %e, "reading a file to index it");
            shared.metrics.error("open_failed");
            respond_error(Status::INTERNAL_SERVER_ERROR, Some(req), ctx)
        }
    }
}

/// Whether `path` names a media file a player fetches whole or by ranges (TS, MP4 and its
/// fragments): served with the HLS `Cache-Control`.
fn is_media_file_name(path: &str) -> bool {
    let ext = path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    matches!(
        ext.as_deref(),
        Some("ts" | "m2ts" | "mp4" | "m4s" | "m4v" | "m4a")
    )
}

/// `200 ok`: the server accepts and answers (what a load balancer's health check asks; it
/// does not depend on etcd: a node cut off from etcd still serves).
/// Said once per process: what user-space TLS connections do not get yet (answered 503).
fn not_over_user_tls(what: &'static str) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "{what} are not served over user-space TLS yet (no kernel TLS here): answered 503 on https:// listeners"
        );
    }
}

fn health_response(req: &Request, ctx: &ResponseContext<'_>) -> penstock_core::http::Response {
    small_ok(req, ctx, "text/plain", b"ok\n".to_vec())
}

/// A `200` whose body is `body` in memory (none for HEAD): the health and metrics pages.
fn small_ok(
    req: &Request,
    ctx: &ResponseContext<'_>,
    content_type: &'static str,
    body: Vec<u8>,
) -> penstock_core::http::Response {
    made_ok(req, ctx, content_type, None, body)
}

/// A `200` with a playlist made in memory (none for HEAD), its `ETag` and `Last-Modified`
/// those of the files it was made from.
pub(super) fn playlist_ok(
    req: &Request,
    ctx: &ResponseContext<'_>,
    etag: &penstock_core::http::ETag,
    mtime: SystemTime,
    body: Vec<u8>,
) -> penstock_core::http::Response {
    made_ok(
        req,
        ctx,
        "application/vnd.apple.mpegurl",
        Some((etag, mtime)),
        body,
    )
}

/// A `200` whose body is `body` in memory, with the validators when given: then a `304`
/// without a body when the request's `If-None-Match` / `If-Modified-Since` says the client's
/// copy is current (what a player's cache revalidating a playlist asks).
pub(super) fn made_ok(
    req: &Request,
    ctx: &ResponseContext<'_>,
    content_type: &'static str,
    validators: Option<(&penstock_core::http::ETag, SystemTime)>,
    body: Vec<u8>,
) -> penstock_core::http::Response {
    let len = body.len() as u64;
    pieces_ok(
        req,
        ctx,
        content_type,
        validators,
        vec![BodyPiece::Bytes(body)],
        len,
    )
}

/// [`made_ok`] with a body of `pieces` (`len` bytes): memory and byte ranges of the request's
/// file (an MP4 segment: its generated header, then its samples sent by sendfile).
pub(super) fn pieces_ok(
    req: &Request,
    ctx: &ResponseContext<'_>,
    content_type: &'static str,
    validators: Option<(&penstock_core::http::ETag, SystemTime)>,
    pieces: Vec<BodyPiece>,
    len: u64,
) -> penstock_core::http::Response {
    let keep_alive = req.keep_alive && ctx.keep_alive_allowed;
    let not_modified = validators.is_some_and(|(etag, mtime)| {
        penstock_core::http::evaluate_preconditions(req, etag, mtime)
            == penstock_core::http::Precondition::NotModified
    });
    let status = if not_modified {
        Status::NOT_MODIFIED
    } else {
        Status::OK
    };
    let head = ResponseHead {
        status,
        date: ctx.date,
        server: ctx.server,
        content_type: (!not_modified).then_some(content_type),
        content_length_bytes: (!not_modified).then_some(len),
        content_range: None,
        accept_ranges: false,
        etag: validators.map(|(e, _)| e),
        last_modified: validators.map(|(_, t)| t),
        allow: None,
        location: None,
        connection: connection_header(keep_alive, ctx),
    };
    let mut bytes = Vec::with_capacity(256);
    write_response_head(&head, &mut bytes);
    penstock_core::http::Response {
        status,
        head: bytes,
        body: if not_modified || req.method == Method::Head {
            Vec::new()
        } else {
            pieces
        },
        keep_alive,
    }
}

impl Worker {
    fn metrics_response(
        &self,
        req: &Request,
        ctx: &ResponseContext<'_>,
        format: Format,
    ) -> penstock_core::http::Response {
        // The engine's figures are read by the registry's collector at each scrape.
        // Idle HLS sessions end before they are counted.
        self.shared.hls_sessions.sweep_now();
        let body = self.shared.metrics.render(format).into_bytes();
        small_ok(req, ctx, format.content_type(), body)
    }
}

/// A body the engine cannot run here (a configuration it refuses, `body_path`): 503, said
/// once in the log, counted always.
fn engine_refused(
    metrics: &crate::metrics::Metrics,
    req: &Request,
    ctx: &ResponseContext<'_>,
    class: Arc<str>,
    memory: &dyn Fn(penstock_core::http::Response, Arc<str>) -> Out,
    e: &StreamError,
) -> Out {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        tracing::warn!(error = %e, "the engine cannot take HTTP bodies: answering 503");
    }
    metrics.error("engine_refused");
    memory(unavailable(req, ctx), class)
}

/// 503 with `Retry-After` and no body: the engine cannot take a body now and the head is
/// not written yet (see `respond`).
pub(super) fn unavailable(
    req: &Request,
    ctx: &ResponseContext<'_>,
) -> penstock_core::http::Response {
    let keep_alive = req.keep_alive && ctx.keep_alive_allowed;
    let head = ResponseHead {
        status: Status::SERVICE_UNAVAILABLE,
        date: ctx.date,
        server: ctx.server,
        content_type: None,
        content_length_bytes: Some(0),
        content_range: None,
        accept_ranges: false,
        etag: None,
        last_modified: None,
        allow: None,
        location: None,
        connection: connection_header(keep_alive, ctx),
    };
    let mut bytes = Vec::with_capacity(192);
    write_response_head(&head, &mut bytes);
    // Before the empty line that ends the head (the core's head has no Retry-After field).
    let end = bytes.len() - 2;
    bytes.splice(end..end, b"Retry-After: 1\r\n".iter().copied());
    penstock_core::http::Response {
        status: Status::SERVICE_UNAVAILABLE,
        head: bytes,
        body: Vec::new(),
        keep_alive,
    }
}

/// What a request of a sessions location asks of the HLS session book: the session id it
/// names (verified, or well-formed where no credential is asked), the peer's address (a Unix
/// peer's: `::`), and the credential's grant that signs the ids written into a playlist.
#[derive(Debug, Clone)]
pub(super) struct SessionAsk {
    pub(super) asked: Option<String>,
    pub(super) addr: std::net::IpAddr,
    pub(super) grant: Option<penstock_core::auth::Grant>,
    /// The credential's tenant (a JWT's `tenant` claim): a new session is admitted in its
    /// share.
    pub(super) tenant: Option<String>,
}

/// A short `text/plain` answer saying why (`Retry-After` when given): a session refused
/// or missing.
pub(super) fn text_response(
    req: &Request,
    ctx: &ResponseContext<'_>,
    status: Status,
    retry_after_s: Option<u64>,
    why: &str,
) -> penstock_core::http::Response {
    let keep_alive = req.keep_alive && ctx.keep_alive_allowed;
    let body = format!("{why}\n").into_bytes();
    let head = ResponseHead {
        status,
        date: ctx.date,
        server: ctx.server,
        content_type: Some("text/plain; charset=utf-8"),
        content_length_bytes: Some(body.len() as u64),
        content_range: None,
        accept_ranges: false,
        etag: None,
        last_modified: None,
        allow: None,
        location: None,
        connection: connection_header(keep_alive, ctx),
    };
    let mut bytes = Vec::with_capacity(256);
    write_response_head(&head, &mut bytes);
    if let Some(s) = retry_after_s {
        let end = bytes.len() - 2;
        bytes.splice(end..end, format!("Retry-After: {s}\r\n").bytes());
    }
    penstock_core::http::Response {
        status,
        head: bytes,
        body: if req.method == Method::Head {
            Vec::new()
        } else {
            vec![BodyPiece::Bytes(body)]
        },
        keep_alive,
    }
}

/// 401 with `WWW-Authenticate`: the location asks for a credential and the request carries
/// none (docs/security.md "Viewers").
fn unauthorized(req: &Request, ctx: &ResponseContext<'_>) -> penstock_core::http::Response {
    let mut r = respond_error(Status::UNAUTHORIZED, Some(req), ctx);
    // Before the empty line that ends the head (the core's head has no such field).
    let end = r.head.len() - 2;
    r.head.splice(
        end..end,
        b"WWW-Authenticate: Bearer realm=\"penstock\", error=\"invalid_request\", error_description=\"a signed URL or a JWT is required\"\r\n"
            .iter()
            .copied(),
    );
    r
}

/// The context of an answer to a request that did not parse (the connection closes).
pub(super) fn error_ctx(live: &LiveConfig) -> ResponseContext<'static> {
    ResponseContext {
        date: SystemTime::now(),
        server: "",
        keep_alive_allowed: false,
        keep_alive_timeout_s: Some(live.limits.idle_timeout_ms / 1000),
        ranges_max: live.limits.ranges_max,
        boundary: "",
    }
}

pub(super) fn error_kind(e: &HttpError) -> &'static str {
    match e.status().code() {
        414 => "uri_too_long",
        431 => "header_too_large",
        403 => "path_escape",
        405 => "method_not_allowed",
        501 => "method_not_implemented",
        505 => "version_not_supported",
        413 => "body_not_allowed",
        _ => "bad_request",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use penstock_core::http::{Parsed, parse_request};

    /// Issue 20: the engine's refusal known before the head is a 503 with Retry-After and no
    /// body, keeping the connection when the request allows it.
    #[test]
    fn unavailable_is_a_bodiless_503_with_retry_after() {
        let Ok(Parsed::Complete { request, .. }) = parse_request(
            b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n",
            &penstock_core::http::Limits::default(),
        ) else {
            panic!("request parses");
        };
        let ctx = ResponseContext {
            date: SystemTime::UNIX_EPOCH,
            server: "penstock",
            keep_alive_allowed: true,
            keep_alive_timeout_s: Some(60),
            ranges_max: 16,
            boundary: "",
        };
        let r = unavailable(&request, &ctx);
        let head = String::from_utf8(r.head).expect("ascii head");
        assert!(
            head.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{head}"
        );
        assert!(head.contains("\r\nRetry-After: 1\r\n"), "{head}");
        assert!(head.contains("\r\nContent-Length: 0\r\n"), "{head}");
        assert!(head.ends_with("\r\n\r\n") && !head.ends_with("\r\n\r\n\r\n"));
        assert!(r.body.is_empty() && r.keep_alive);
    }
}
