//! The API's routes: one table ([`ROUTES`]) that both the router dispatches by and the
//! OpenAPI document ([`openapi`]) is generated from, so that the two cannot disagree.
//!
//! Each acting route writes a control protocol line from its JSON body and runs it through
//! [`crate::control::handle_line`] as an authenticated caller: the reply's code is the HTTP
//! status (a 2xx reply: 200, or 201 for `OPEN`), its text and lines the JSON body's
//! `code`, `text` and `lines`. A JSON value that is not one word (spaces, control
//! characters) would change the line's meaning: it is refused (400) before any line is made.

use std::sync::Arc;

use penstock_core::control::{Command, Reply, StreamSelector, parse_command_bytes_on};
use serde_json::{Map, Value, json};

use super::{Api, Request, Response};
use crate::control::{Session, handle_line, token_matches};
use crate::streams::Identity;

/// What a route does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Dashboard,
    DashboardJs,
    DashboardCss,
    OpenApi,
    Overview,
    Events,
    StreamsList,
    StreamOpen,
    StreamGet,
    StreamStart,
    StreamPause,
    StreamResume,
    StreamSeek,
    StreamClose,
    RtspList,
    RtspKick,
    HlsList,
    HlsKick,
    Recordings,
    Volumes,
    Admission,
    Refusals,
    TuneGet,
    TuneSet,
}

/// One route: method, path (`{name}`: one segment), what it does, whether it needs the
/// token, its request body's schema (a name in the document's components) and a summary.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    pub method: &'static str,
    pub path: &'static str,
    pub op: Op,
    pub auth: bool,
    pub body: Option<&'static str>,
    pub summary: &'static str,
}

const fn r(
    method: &'static str,
    path: &'static str,
    op: Op,
    body: Option<&'static str>,
    summary: &'static str,
) -> Route {
    Route {
        method,
        path,
        op,
        auth: true,
        body,
        summary,
    }
}

const fn open(method: &'static str, path: &'static str, op: Op, summary: &'static str) -> Route {
    Route {
        method,
        path,
        op,
        auth: false,
        body: None,
        summary,
    }
}

/// Every route of the API listener.
pub const ROUTES: &[Route] = &[
    open(
        "GET",
        "/",
        Op::Dashboard,
        "The dashboard (HTML; no data without the token)",
    ),
    open("GET", "/app.js", Op::DashboardJs, "The dashboard's script"),
    open(
        "GET",
        "/app.css",
        Op::DashboardCss,
        "The dashboard's style sheet",
    ),
    open("GET", "/api/openapi.json", Op::OpenApi, "This document"),
    r(
        "GET",
        "/api/v1/overview",
        Op::Overview,
        None,
        "Everything the dashboard shows, at once",
    ),
    r(
        "GET",
        "/api/v1/events",
        Op::Events,
        None,
        "Server-sent events: `state` per stream change, `overview` periodically",
    ),
    r(
        "GET",
        "/api/v1/streams",
        Op::StreamsList,
        None,
        "The streams (control protocol `STATE *`)",
    ),
    r(
        "POST",
        "/api/v1/streams",
        Op::StreamOpen,
        Some("OpenRequest"),
        "Opens a stream (`OPEN src dst options`)",
    ),
    r(
        "GET",
        "/api/v1/streams/{id}",
        Op::StreamGet,
        None,
        "One stream's status, with its lateness counts",
    ),
    r(
        "DELETE",
        "/api/v1/streams/{id}",
        Op::StreamClose,
        None,
        "Closes a stream (`CLOSE id`; `?now=1`: `CLOSE id NOW`)",
    ),
    r(
        "POST",
        "/api/v1/streams/{id}/start",
        Op::StreamStart,
        Some("StartRequest"),
        "Starts a stream (`START id [AT time]`)",
    ),
    r(
        "POST",
        "/api/v1/streams/{id}/pause",
        Op::StreamPause,
        None,
        "Pauses a stream (`PAUSE id`)",
    ),
    r(
        "POST",
        "/api/v1/streams/{id}/resume",
        Op::StreamResume,
        None,
        "Resumes a stream (`RESUME id`)",
    ),
    r(
        "POST",
        "/api/v1/streams/{id}/seek",
        Op::StreamSeek,
        Some("SeekRequest"),
        "Moves a stream's source offset (`SEEK id offset`)",
    ),
    r(
        "GET",
        "/api/v1/sessions/rtsp",
        Op::RtspList,
        None,
        "The RTSP sessions",
    ),
    r(
        "DELETE",
        "/api/v1/sessions/rtsp/{id}",
        Op::RtspKick,
        None,
        "Ends an RTSP session now (kick)",
    ),
    r(
        "GET",
        "/api/v1/sessions/hls",
        Op::HlsList,
        None,
        "The HLS viewer sessions",
    ),
    r(
        "DELETE",
        "/api/v1/sessions/hls/{id}",
        Op::HlsKick,
        None,
        "Ends an HLS viewer session now (kick)",
    ),
    r(
        "GET",
        "/api/v1/recordings",
        Op::Recordings,
        None,
        "Files in the recordings' directories (`[control] write_roots`)",
    ),
    r(
        "GET",
        "/api/v1/volumes",
        Op::Volumes,
        None,
        "The configured volumes (`[volumes]`)",
    ),
    r(
        "GET",
        "/api/v1/admission",
        Op::Admission,
        None,
        "Admission per resource, disk queues, workers (`STATS`)",
    ),
    r(
        "GET",
        "/api/v1/refusals",
        Op::Refusals,
        None,
        "The last refused commands, with their reasons",
    ),
    r(
        "GET",
        "/api/v1/tune/disk",
        Op::TuneGet,
        None,
        "The disk scheduler's settings (`TUNE disk`)",
    ),
    r(
        "POST",
        "/api/v1/tune/disk",
        Op::TuneSet,
        Some("TuneRequest"),
        "Changes the disk scheduler's settings (`TUNE disk options`)",
    ),
];

const INDEX_HTML: &str = include_str!("dashboard/index.html");
const APP_JS: &str = include_str!("dashboard/app.js");
const APP_CSS: &str = include_str!("dashboard/app.css");

/// Matches `path` against a route pattern, collecting the `{name}` segments.
fn matches<'a>(pattern: &str, path: &'a str) -> Option<Vec<&'a str>> {
    let (mut p, mut s) = (pattern.split('/'), path.split('/'));
    let mut params = Vec::new();
    loop {
        match (p.next(), s.next()) {
            (None, None) => return Some(params),
            (Some(a), Some(b)) if a.starts_with('{') && !b.is_empty() => params.push(b),
            (Some(a), Some(b)) if a == b => {}
            _ => return None,
        }
    }
}

/// Whether the request's `Origin` (when a browser sent one) is this listener's own.
fn origin_allowed(api: &Api, req: &Request) -> bool {
    if req
        .header("sec-fetch-site")
        .is_some_and(|v| v.eq_ignore_ascii_case("cross-site"))
    {
        return false;
    }
    let Some(origin) = req.header("origin") else {
        return true;
    };
    if origin == api.origin {
        return true;
    }
    // The same listener reached by another name (localhost, a DNS name): the Host the
    // browser sent, under this listener's scheme.
    let scheme = if api.tls.is_some() { "https" } else { "http" };
    req.header("host")
        .is_some_and(|h| origin == format!("{scheme}://{h}"))
}

fn authorized(api: &Api, req: &Request) -> bool {
    req.header("authorization")
        .and_then(|v| {
            let (kind, t) = v.split_once(' ')?;
            kind.eq_ignore_ascii_case("bearer").then_some(t.trim())
        })
        .is_some_and(|t| {
            token_matches(t, &api.deps.control.token) || {
                let now_s = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                api.deps.viewers.admin_jwt(t, now_s)
            }
        })
}

/// Answers one request.
pub(crate) fn dispatch(api: &Arc<Api>, req: &Request) -> Response {
    if !origin_allowed(api, req) {
        return Response::error(
            403,
            format!(
                "cross-origin request refused: Origin {:?} is not this listener's ({})",
                req.header("origin").unwrap_or(""),
                api.origin
            ),
        );
    }
    let mut methods = Vec::new();
    for route in ROUTES {
        let Some(params) = matches(route.path, &req.path) else {
            continue;
        };
        let method_ok =
            route.method == req.method || (route.method == "GET" && req.method == "HEAD");
        if !method_ok {
            methods.push(route.method);
            continue;
        }
        if route.auth && !authorized(api, req) {
            let mut r = Response::error(
                401,
                "Authorization: Bearer <control token> needed (the token of [control] token / token_file)",
            );
            if let Response::Body { extra, .. } = &mut r {
                extra.push_str("WWW-Authenticate: Bearer realm=\"penstock\"\r\n");
            }
            return r;
        }
        return run(api, route.op, req, &params);
    }
    if methods.is_empty() {
        Response::error(404, format!("no such route: {}", req.path))
    } else {
        let mut r = Response::error(405, format!("{} takes {}", req.path, methods.join(", ")));
        if let Response::Body { extra, .. } = &mut r {
            extra.push_str(&format!("Allow: {}\r\n", methods.join(", ")));
        }
        r
    }
}

fn static_file(content_type: &'static str, text: &str) -> Response {
    Response::Body {
        status: 200,
        content_type,
        body: text.as_bytes().to_vec(),
        extra: String::new(),
    }
}

fn run(api: &Arc<Api>, op: Op, req: &Request, params: &[&str]) -> Response {
    let p0 = params.first().copied().unwrap_or("");
    match op {
        Op::Dashboard => static_file("text/html; charset=utf-8", INDEX_HTML),
        Op::DashboardJs => static_file("text/javascript; charset=utf-8", APP_JS),
        Op::DashboardCss => static_file("text/css; charset=utf-8", APP_CSS),
        Op::OpenApi => Response::json(200, &openapi()),
        Op::Overview => Response::json(200, &overview(api, false)),
        Op::Events => Response::Events,
        Op::StreamsList => Response::json(
            200,
            &Value::Array(state_all(api).into_iter().filter(is_stream_id).collect()),
        ),
        Op::StreamOpen => match open_line(&req.body) {
            Ok(line) => command(api, req, &line),
            Err(e) => Response::error(400, e),
        },
        Op::StreamGet => stream_get(api, req, p0),
        Op::StreamStart => {
            let at = match body_fields(&req.body, &["at"]) {
                Ok(f) => f.into_iter().next().map(|(_, v)| v),
                Err(e) => return Response::error(400, e),
            };
            match at {
                Some(at) => command(api, req, &format!("START {p0} AT {at}")),
                None => command(api, req, &format!("START {p0}")),
            }
        }
        Op::StreamPause => command(api, req, &format!("PAUSE {p0}")),
        Op::StreamResume => command(api, req, &format!("RESUME {p0}")),
        Op::StreamSeek => match body_fields(&req.body, &["offset"]) {
            Ok(f) => match f.into_iter().next() {
                Some((_, off)) => command(api, req, &format!("SEEK {p0} {off}")),
                None => Response::error(400, "the body needs \"offset\" (bytes, or \"4KiB\")"),
            },
            Err(e) => Response::error(400, e),
        },
        Op::StreamClose => {
            let now = req
                .query_value("now")
                .is_some_and(|v| v != "0" && v != "false");
            command(
                api,
                req,
                &format!("CLOSE {p0}{}", if now { " NOW" } else { "" }),
            )
        }
        Op::RtspList => Response::json(200, &Value::Array(sessions(api, "rtsp-"))),
        Op::HlsList => Response::json(200, &Value::Array(sessions(api, "hls-"))),
        Op::RtspKick => match &api.deps.rtsp_kick {
            None => Response::error(404, "no RTSP server ([rtsp] listen is empty)"),
            Some(kick) => kicked(kick(p0.strip_prefix("rtsp-").unwrap_or(p0)), "RTSP", p0),
        },
        Op::HlsKick => kicked(
            (api.deps.hls_kick)(p0.strip_prefix("hls-").unwrap_or(p0)),
            "HLS",
            p0,
        ),
        Op::Recordings => Response::json(200, &recordings(api)),
        Op::Volumes => Response::json(200, &volumes(api)),
        Op::Admission => Response::json(200, &admission(api)),
        Op::Refusals => Response::json(200, &refusals(api)),
        Op::TuneGet => command(api, req, "TUNE disk"),
        Op::TuneSet => match body_fields(&req.body, &["rt_quantum", "bulk_quantum", "inflight"]) {
            Ok(f) => {
                let mut line = "TUNE disk".to_string();
                for (k, v) in f {
                    line.push_str(&format!(" {k}={v}"));
                }
                command(api, req, &line)
            }
            Err(e) => Response::error(400, e),
        },
    }
}

fn kicked(found: bool, what: &str, id: &str) -> Response {
    if found {
        Response::json(200, &json!({ "kicked": id }))
    } else {
        Response::error(404, format!("no {what} session {id}"))
    }
}

/// A JSON value as one word of a control line: a string without spaces or control
/// characters, a number, or a boolean.
fn word(key: &str, v: &Value) -> Result<String, String> {
    let s = match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        _ => return Err(format!("\"{key}\" must be a string or a number")),
    };
    if s.is_empty() {
        return Err(format!("\"{key}\" is empty"));
    }
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "\"{key}\" must be one word (no spaces or control characters)"
        ));
    }
    Ok(s)
}

/// The body's JSON object (an empty body: `{}`).
fn body_object(body: &[u8]) -> Result<Map<String, Value>, String> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err("the body must be a JSON object".into()),
        Err(e) => Err(format!("the body is not JSON: {e}")),
    }
}

/// The body's fields among `allowed`, in that order, as words.
fn body_fields(body: &[u8], allowed: &[&str]) -> Result<Vec<(String, String)>, String> {
    let m = body_object(body)?;
    if let Some(k) = m.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(format!(
            "unknown field \"{k}\" (known: {})",
            allowed.join(", ")
        ));
    }
    let mut out = Vec::new();
    for k in allowed {
        if let Some(v) = m.get(*k) {
            out.push((k.to_string(), word(k, v)?));
        }
    }
    Ok(out)
}

/// The `OPEN` options a body may carry (docs/control-protocol.md).
const OPEN_OPTIONS: &[&str] = &[
    "class", "rate", "period", "unit", "schedule", "buffers", "offset", "length", "path", "late",
    "cache",
];

/// `OPEN src dst options` from `{"src":…, "dst":…, "rate":…, "detached": true, …}`.
fn open_line(body: &[u8]) -> Result<String, String> {
    let m = body_object(body)?;
    let known =
        |k: &str| ["src", "dst", "detached", "truncate"].contains(&k) || OPEN_OPTIONS.contains(&k);
    if let Some(k) = m.keys().find(|k| !known(k)) {
        return Err(format!(
            "unknown field \"{k}\" (known: src, dst, detached, truncate, {})",
            OPEN_OPTIONS.join(", ")
        ));
    }
    let src = m.get("src").ok_or("the body needs \"src\" and \"dst\"")?;
    let dst = m.get("dst").ok_or("the body needs \"src\" and \"dst\"")?;
    let mut line = format!("OPEN {} {}", word("src", src)?, word("dst", dst)?);
    for k in OPEN_OPTIONS {
        if let Some(v) = m.get(*k) {
            line.push_str(&format!(" {k}={}", word(k, v)?));
        }
    }
    for (k, w) in [("detached", "DETACHED"), ("truncate", "TRUNCATE")] {
        match m.get(k) {
            None | Some(Value::Bool(false)) => {}
            Some(Value::Bool(true)) => line.push_str(&format!(" {w}")),
            Some(_) => return Err(format!("\"{k}\" must be true or false")),
        }
    }
    Ok(line)
}

/// A caller with the token: what an API request is to the control code. Each request is a
/// connection of its own (the streams it opens are not bound to a connection's life nor
/// counted against one connection's `streams_per_connection_max`).
fn session(api: &Api, req: &Request) -> Session {
    Session::new(
        api.deps.control.new_conn_id(),
        Identity::Token,
        format!("api {}", req.peer),
    )
}

/// Runs one control line; its reply as JSON.
fn run_line(api: &Api, req: &Request, line: &str) -> Reply {
    let mut s = session(api, req);
    handle_line(&api.deps.control, &mut s, line.as_bytes()).0
}

fn reply_status(reply: &Reply) -> u16 {
    let c = reply.code.code();
    match c {
        201 => 201,
        200..=299 => 200,
        400..=599 => c,
        _ => 500,
    }
}

fn reply_json(reply: &Reply) -> Value {
    let mut v = json!({
        "code": reply.code.code(),
        "text": reply.text,
    });
    if !reply.lines.is_empty() {
        v["lines"] = json!(reply.lines);
    }
    if let Some(id) = reply.stream_id() {
        v["id"] = json!(id.0);
    }
    v
}

fn command(api: &Api, req: &Request, line: &str) -> Response {
    let reply = run_line(api, req, line);
    Response::json(reply_status(&reply), &reply_json(&reply))
}

/// `id state k=v … word …` (a `STATE` line) as an object: `k=v` numbers as numbers, bare
/// words as `true`.
fn state_object(line: &str) -> Value {
    let mut words = line.split(' ');
    let mut m = Map::new();
    m.insert("id".into(), json!(words.next().unwrap_or("")));
    m.insert("state".into(), json!(words.next().unwrap_or("")));
    for w in words {
        match w.split_once('=') {
            Some((k, v)) => {
                let v = v
                    .parse::<u64>()
                    .map_or_else(|_| json!(v.replace("%20", " ")), |n| json!(n));
                m.insert(k.into(), v);
            }
            None if !w.is_empty() => {
                m.insert(w.into(), json!(true));
            }
            None => {}
        }
    }
    Value::Object(m)
}

fn is_stream_id(v: &Value) -> bool {
    v.get("id")
        .and_then(Value::as_str)
        .is_some_and(|s| s.bytes().all(|b| b.is_ascii_digit()))
}

/// `STATE *` as the token sees it: streams, RTSP and HLS sessions.
pub(crate) fn state_all(api: &Api) -> Vec<Value> {
    let mut s = Session::new(
        api.deps.control.new_conn_id(),
        Identity::Token,
        "api".into(),
    );
    let reply = handle_line(&api.deps.control, &mut s, b"STATE *").0;
    reply.lines.iter().map(|l| state_object(l)).collect()
}

fn sessions(api: &Api, prefix: &str) -> Vec<Value> {
    state_all(api)
        .into_iter()
        .filter(|v| {
            v.get("id")
                .and_then(Value::as_str)
                .is_some_and(|s| s.starts_with(prefix))
        })
        .collect()
}

/// `GET /api/v1/streams/{id}`: the id checked as `STATE` checks it, then the stream's
/// typed status.
fn stream_get(api: &Api, req: &Request, id: &str) -> Response {
    let line = format!("STATE {id}");
    let limits = penstock_core::control::Limits::default();
    let id = match parse_command_bytes_on(line.as_bytes(), &limits, None) {
        Ok(Command::State(StreamSelector::Ids(ids))) if ids.len() == 1 => ids[0],
        Ok(_) => return Response::error(400, "one stream id"),
        Err(e) => {
            let r = e.to_reply();
            return Response::json(reply_status(&r), &reply_json(&r));
        }
    };
    let caller = crate::streams::Caller {
        conn: session(api, req).conn(),
        identity: Identity::Token,
    };
    match api.deps.control.streams.status(caller, id) {
        Ok(st) => Response::json(200, &status_json(api, &st, false)),
        Err(r) => Response::json(reply_status(&r), &reply_json(&r)),
    }
}

fn status_json(api: &Api, st: &crate::streams::StreamStatus, interval: bool) -> Value {
    let l = st.lateness;
    let mut v = json!({
        "id": st.id.0.to_string(),
        "state": st.state.as_str(),
        "offset": st.offset_bytes,
        "sent": st.sent_bytes,
        "remaining": st.remaining_bytes,
        "unit": st.unit_bytes,
        "class": st.class.to_string(),
        "paced": st.paced,
        "pace_bytes_per_s": st.pace_bytes_per_s,
        "detached": st.detached,
        "peer_on": st.peer_on,
        "error": st.error,
        "lateness": {
            "units": l.units(),
            "misses": l.misses,
            "max_ns": l.max_ns,
            "p99_ns": l.quantile_ns_max(990_000),
            "units_skipped": l.units_skipped,
        },
    });
    if interval {
        let mut t = api.events.lock().unwrap_or_else(|p| p.into_inner());
        let p = t.interval_p99(st.id.0, l);
        t.recent_p99_ns.insert(st.id.0, p);
        v["lateness"]["recent_p99_ns"] = json!(p);
    }
    v
}

/// The streams' typed statuses (`interval`: with each one's lateness since the last call,
/// for the events thread only).
fn streams_status(api: &Api, interval: bool) -> Vec<Value> {
    let caller = crate::streams::Caller {
        conn: 0,
        identity: Identity::Token,
    };
    state_all(api)
        .into_iter()
        .filter(is_stream_id)
        .filter_map(|v| v.get("id")?.as_str()?.parse::<u64>().ok())
        .filter_map(|id| {
            let st = api
                .deps
                .control
                .streams
                .status(caller, penstock_core::control::StreamId(id))
                .ok()?;
            let mut v = status_json(api, &st, interval);
            if !interval {
                let t = api.events.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(p) = t.recent_p99_ns.get(&id) {
                    v["lateness"]["recent_p99_ns"] = json!(p);
                }
            }
            Some(v)
        })
        .collect()
}

/// `STATS` as JSON: `name U of C` lines as `{used, capacity}`, `name N` as numbers, the
/// disk devices as a list; the engine's disk queues and the workers' policies beside.
pub(crate) fn admission(api: &Api) -> Value {
    let mut s = Session::new(
        api.deps.control.new_conn_id(),
        Identity::Token,
        "api".into(),
    );
    let reply = handle_line(&api.deps.control, &mut s, b"STATS").0;
    let mut resources = Map::new();
    let mut counts = Map::new();
    let mut devices = Vec::new();
    for l in &reply.lines {
        let w: Vec<&str> = l.split(' ').collect();
        if w.first() == Some(&"rt_disk_device") && w.len() >= 5 {
            let mut d = json!({
                "device": w[1],
                "used_ns_per_s": w[2].parse::<u64>().unwrap_or(0),
                "capacity_ns_per_s": w[4].parse::<u64>().unwrap_or(0),
            });
            for kv in &w[5..] {
                if let Some((k, v)) = kv.split_once('=') {
                    d[k] = v.parse::<u64>().map_or_else(|_| json!(v), |n| json!(n));
                }
            }
            devices.push(d);
        } else if w.len() == 4 && w[2] == "of" {
            resources.insert(
                w[0].trim_start_matches("rt_").into(),
                json!({
                    "used": w[1].parse::<u64>().unwrap_or(0),
                    "capacity": w[3].parse::<u64>().unwrap_or(0),
                }),
            );
        } else if w.len() == 2 {
            counts.insert(
                w[0].into(),
                w[1].parse::<u64>()
                    .map_or_else(|_| json!(w[1]), |n| json!(n)),
            );
        }
    }
    let q = api.deps.engine.disk_queue_depth();
    let classes: serde_json::Map<String, Value> = api
        .deps
        .engine
        .disk_queue_depth_per_class()
        .into_iter()
        .map(|(n, d)| (n, json!(d)))
        .collect();
    json!({
        "resources": resources,
        "devices": devices,
        "counts": counts,
        "disk_queue": { "rt": q.rt, "bulk": q.bulk },
        "disk_queue_classes": classes,
        "workers": api.deps.workers,
    })
}

fn refusals(api: &Api) -> Value {
    Value::Array(
        api.deps
            .control
            .refusals()
            .into_iter()
            .rev()
            .map(
                |r| json!({ "unix_ms": r.unix_ms, "verb": r.verb, "code": r.code, "text": r.text }),
            )
            .collect(),
    )
}

/// Files in the recordings' directories, newest first, at most 200.
fn recordings(api: &Api) -> Value {
    let mut out = Vec::new();
    for root in &api.deps.write_roots {
        let Ok(rd) = std::fs::read_dir(root) else {
            continue;
        };
        for e in rd.flatten().take(1000) {
            let Ok(m) = e.metadata() else { continue };
            if !m.is_file() {
                continue;
            }
            let mtime = m
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs());
            out.push(json!({
                "path": e.path().display().to_string(),
                "bytes": m.len(),
                "modified_unix_s": mtime,
            }));
        }
    }
    out.sort_by_key(|v| std::cmp::Reverse(v["modified_unix_s"].as_u64().unwrap_or(0)));
    out.truncate(200);
    Value::Array(out)
}

fn volumes(api: &Api) -> Value {
    Value::Array(
        api.deps
            .volumes
            .members
            .iter()
            .map(|(name, path)| {
                let m = std::fs::metadata(path).ok();
                json!({
                    "name": name,
                    "member": path.display().to_string(),
                    "present": m.is_some(),
                    "bytes": m.map(|m| m.len()),
                })
            })
            .collect(),
    )
}

/// What the dashboard shows, at once (`interval`: the events thread's, which moves each
/// stream's lateness interval on).
pub(crate) fn overview(api: &Api, interval: bool) -> Value {
    let unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    json!({
        "unix_ms": unix_ms,
        "streams": streams_status(api, interval),
        "rtsp_sessions": sessions(api, "rtsp-"),
        "hls_sessions": sessions(api, "hls-"),
        "admission": admission(api),
        "refusals": refusals(api),
        "recordings": recordings(api),
        "volumes": volumes(api),
    })
}

fn schema(name: &str) -> Value {
    let word = json!({ "oneOf": [ { "type": "string" }, { "type": "integer" } ] });
    match name {
        "OpenRequest" => {
            let mut props = Map::new();
            props.insert("src".into(), json!({ "type": "string", "description": "source endpoint: file:/a.ts, vol:NAME/PART, tcp://…" }));
            props.insert(
                "dst".into(),
                json!({ "type": "string", "description": "target endpoint" }),
            );
            for k in OPEN_OPTIONS {
                props.insert((*k).into(), word.clone());
            }
            props.insert("detached".into(), json!({ "type": "boolean" }));
            props.insert("truncate".into(), json!({ "type": "boolean" }));
            json!({ "type": "object", "required": ["src", "dst"], "properties": props, "additionalProperties": false })
        }
        "StartRequest" => {
            json!({ "type": "object", "properties": { "at": { "type": "string", "description": "+2s or an RFC 3339 time" } }, "additionalProperties": false })
        }
        "SeekRequest" => {
            json!({ "type": "object", "required": ["offset"], "properties": { "offset": word }, "additionalProperties": false })
        }
        "TuneRequest" => {
            json!({ "type": "object", "properties": { "rt_quantum": word, "bulk_quantum": word, "inflight": { "type": "integer" } }, "additionalProperties": false })
        }
        "Reply" => json!({
            "type": "object",
            "description": "The control protocol's reply: its code (also the HTTP status), text and lines",
            "required": ["code", "text"],
            "properties": {
                "code": { "type": "integer" },
                "text": { "type": "string" },
                "lines": { "type": "array", "items": { "type": "string" } },
                "id": { "type": "integer", "description": "the stream opened (OPEN)" },
            },
        }),
        _ => json!({ "type": "object" }),
    }
}

/// The OpenAPI 3.0 document, generated from [`ROUTES`].
pub fn openapi() -> Value {
    let mut paths = Map::new();
    for route in ROUTES {
        let mut op = Map::new();
        op.insert(
            "operationId".into(),
            json!(format!("{:?}", route.op).replace("Op::", "")),
        );
        op.insert("summary".into(), json!(route.summary));
        let params: Vec<Value> = route
            .path
            .split('/')
            .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
            .map(|n| json!({ "name": n, "in": "path", "required": true, "schema": { "type": "string" } }))
            .chain(
                (route.op == Op::StreamClose)
                    .then(|| json!({ "name": "now", "in": "query", "required": false, "schema": { "type": "string", "enum": ["0", "1", "true", "false"] } })),
            )
            .collect();
        if !params.is_empty() {
            op.insert("parameters".into(), Value::Array(params));
        }
        if let Some(b) = route.body {
            op.insert(
                "requestBody".into(),
                json!({ "required": false, "content": { "application/json": { "schema": { "$ref": format!("#/components/schemas/{b}") } } } }),
            );
        }
        let content = match route.op {
            Op::Dashboard => json!({ "text/html": {} }),
            Op::DashboardJs => json!({ "text/javascript": {} }),
            Op::DashboardCss => json!({ "text/css": {} }),
            Op::Events => json!({ "text/event-stream": {} }),
            _ => json!({ "application/json": {} }),
        };
        let mut responses = Map::new();
        responses.insert(
            "200".into(),
            json!({ "description": "done", "content": content }),
        );
        if route.auth {
            responses.insert(
                "401".into(),
                json!({ "description": "no or wrong Bearer token" }),
            );
            responses.insert(
                "default".into(),
                json!({ "description": "the control protocol's refusal (its code is the status)", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Reply" } } } }),
            );
            op.insert("security".into(), json!([{ "bearer": [] }]));
        } else {
            op.insert("security".into(), json!([]));
        }
        op.insert("responses".into(), Value::Object(responses));
        let entry = paths
            .entry(route.path.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        entry[route.method.to_ascii_lowercase()] = Value::Object(op);
    }
    let mut schemas = Map::new();
    for n in [
        "OpenRequest",
        "StartRequest",
        "SeekRequest",
        "TuneRequest",
        "Reply",
    ] {
        schemas.insert(n.into(), schema(n));
    }
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "penstock operator API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "The control protocol's commands as JSON (docs/api.md); the same checks and refusals.",
        },
        "paths": paths,
        "components": {
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
            "schemas": schemas,
        },
        "security": [{ "bearer": [] }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_whole_segments() {
        assert_eq!(
            matches("/api/v1/streams/{id}", "/api/v1/streams/7"),
            Some(vec!["7"])
        );
        assert_eq!(matches("/api/v1/streams/{id}", "/api/v1/streams/"), None);
        assert_eq!(matches("/api/v1/streams/{id}", "/api/v1/streams/7/x"), None);
        assert_eq!(matches("/", "/"), Some(vec![]));
    }

    #[test]
    fn json_values_must_be_one_word() {
        assert!(open_line(br#"{"src":"file:/a b","dst":"tcp://1.2.3.4:5"}"#).is_err());
        assert!(open_line(br#"{"src":"file:/a","dst":"tcp://1.2.3.4:5\nSTATS"}"#).is_err());
        assert_eq!(
            open_line(br#"{"src":"file:/a","dst":"tcp://h:5","rate":"1MB/s","detached":true}"#)
                .unwrap(),
            "OPEN file:/a tcp://h:5 rate=1MB/s DETACHED"
        );
        assert!(open_line(br#"{"src":"a","dst":"b","bogus":1}"#).is_err());
    }

    #[test]
    fn every_route_is_in_the_document() {
        let doc = openapi();
        for r in ROUTES {
            assert!(
                doc["paths"][r.path][r.method.to_ascii_lowercase()].is_object(),
                "{} {}",
                r.method,
                r.path
            );
        }
    }
}
