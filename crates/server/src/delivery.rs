//! Delivery like a CDN origin, for the HTTP loop and the origin threads alike (docs/hls.md "Delivery"): CORS per `[[location]]`
//! (`cors_allow_origins`), the preflight `OPTIONS`, and the `Cache-Control` of HLS playlists
//! and media files. The lines are added to a head the core already wrote, before its empty
//! line, so every response of a location carries them: files, ranges, 304s, errors,
//! playlists (also those answered after their index build, `indexing.rs`) and the origin's.

use std::time::SystemTime;

use penstock_core::http::{
    Request, ResponseContext, ResponseHead, Status, connection_header, write_response_head,
};

/// What a location adds to the heads of its responses: its CORS lines (every response) and
/// the `Cache-Control` line of HLS media (responses that carry or confirm the media: 200,
/// 206, 304).
#[derive(Debug, Clone, Default)]
pub(crate) struct Delivery {
    pub(crate) cors: String,
    pub(crate) cache: String,
}

impl Delivery {
    /// Adds the lines that apply to a response of `status` to its `head`.
    pub(crate) fn apply(&self, head: &mut Vec<u8>, status: Status) {
        add_lines(head, &self.cors);
        if matches!(status.code(), 200 | 206 | 304) {
            add_lines(head, &self.cache);
        }
    }
}

/// The response headers a browser's script may read besides the safelisted ones: what a
/// player needs to follow byte ranges and revalidate.
const EXPOSE: &str = "Content-Range, Content-Length, Accept-Ranges, ETag";

/// How long a browser may keep a preflight's answer (Chromium keeps at most 2 hours).
pub(crate) const PREFLIGHT_MAX_AGE_S: u64 = 7200;

/// The CORS header lines for a request from `origin` to a location allowing `allow` (each
/// line ending in CRLF; empty where the location has no CORS). `*` in the list allows any
/// origin (`Access-Control-Allow-Origin: *`, no credentials); otherwise a listed origin is
/// echoed with `Vary: Origin`, so that a shared cache keeps one copy per origin, and an
/// origin not listed gets `Vary: Origin` alone: no `Access-Control-Allow-Origin`, and the
/// browser refuses the page's script the answer.
pub(crate) fn cors_lines(allow: &[String], origin: Option<&str>) -> String {
    if allow.is_empty() {
        return String::new();
    }
    if allow.iter().any(|a| a == "*") {
        return format!(
            "Access-Control-Allow-Origin: *\r\nAccess-Control-Expose-Headers: {EXPOSE}\r\n"
        );
    }
    match origin {
        Some(o) if allow.iter().any(|a| a.eq_ignore_ascii_case(o)) => format!(
            // `o` equals a configured origin (checked at load: visible ASCII, no CR or LF).
            "Access-Control-Allow-Origin: {o}\r\nVary: Origin\r\nAccess-Control-Expose-Headers: {EXPOSE}\r\n"
        ),
        _ => "Vary: Origin\r\n".to_string(),
    }
}

/// Whether `lines` (from [`cors_lines`]) allow the request's origin.
fn allows(lines: &str) -> bool {
    lines.starts_with("Access-Control-Allow-Origin:")
}

/// `Cache-Control` for a VOD playlist or media file: cached `max_age_s` seconds by browsers
/// and shared caches (the `ETag` changes with the file, so a revalidation is cheap); with 0,
/// every use revalidates (`no-cache`).
pub(crate) fn cache_line(max_age_s: u64) -> String {
    if max_age_s == 0 {
        "Cache-Control: no-cache\r\n".to_string()
    } else {
        format!("Cache-Control: public, max-age={max_age_s}\r\n")
    }
}

/// `Cache-Control` for a live playlist (and a live recording fetched whole): it changes with
/// every segment, so a cache may keep it one second at most (RFC 8216bis §6.2.2's advice for
/// live playlists: shorter than a target duration).
pub(crate) fn live_cache_line() -> String {
    "Cache-Control: public, max-age=1\r\n".to_string()
}

/// Adds `lines` (each ending in CRLF) to a complete response head, before its empty line.
pub(crate) fn add_lines(head: &mut Vec<u8>, lines: &str) {
    if lines.is_empty() || head.len() < 4 || !head.ends_with(b"\r\n\r\n") {
        return;
    }
    let end = head.len() - 2;
    head.splice(end..end, lines.bytes());
}

/// The answer to `OPTIONS PATH` in a location allowing `allow` (not empty): a CORS
/// preflight. `204` with the allowed methods (`GET, HEAD`) and request header (`Range`),
/// how long to keep the answer, and the origin's lines from [`cors_lines`] (none for an
/// origin not allowed: the browser then refuses the real request).
pub(crate) fn preflight(
    req: &Request,
    ctx: &ResponseContext<'_>,
    allow: &[String],
) -> penstock_core::http::Response {
    let keep_alive = req.keep_alive && ctx.keep_alive_allowed;
    let head = ResponseHead {
        status: Status::NO_CONTENT,
        date: ctx.date,
        server: ctx.server,
        content_type: None,
        content_length_bytes: None,
        content_range: None,
        accept_ranges: false,
        etag: None,
        last_modified: None::<SystemTime>,
        allow: Some("GET, HEAD, OPTIONS"),
        location: None,
        connection: connection_header(keep_alive, ctx),
    };
    let mut bytes = Vec::with_capacity(384);
    write_response_head(&head, &mut bytes);
    let lines = cors_lines(allow, req.origin.as_deref());
    let mut extra = lines.clone();
    if allows(&lines) {
        extra.push_str(&format!(
            "Access-Control-Allow-Methods: GET, HEAD\r\nAccess-Control-Allow-Headers: Range\r\nAccess-Control-Max-Age: {PREFLIGHT_MAX_AGE_S}\r\n"
        ));
    }
    add_lines(&mut bytes, &extra);
    penstock_core::http::Response {
        status: Status::NO_CONTENT,
        head: bytes,
        body: Vec::new(),
        keep_alive,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_listed_origin_is_echoed_with_vary_and_another_gets_no_allow_origin() {
        let allow = list(&["https://player.example"]);
        let ok = cors_lines(&allow, Some("https://player.example"));
        assert!(ok.starts_with("Access-Control-Allow-Origin: https://player.example\r\n"));
        assert!(ok.contains("Vary: Origin\r\n"));
        assert!(ok.contains(
            "Access-Control-Expose-Headers: Content-Range, Content-Length, Accept-Ranges, ETag\r\n"
        ));
        let other = cors_lines(&allow, Some("https://evil.example"));
        assert_eq!(other, "Vary: Origin\r\n");
        assert_eq!(cors_lines(&allow, None), "Vary: Origin\r\n");
        assert_eq!(cors_lines(&[], Some("https://player.example")), "");
    }

    #[test]
    fn a_star_allows_every_origin_without_echoing_it() {
        let l = cors_lines(&list(&["*"]), Some("https://any.example"));
        assert!(l.starts_with("Access-Control-Allow-Origin: *\r\n"));
        assert!(!l.contains("Vary"));
    }

    #[test]
    fn lines_go_before_the_empty_line_of_the_head() {
        let mut h = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n".to_vec();
        add_lines(&mut h, "A: 1\r\nB: 2\r\n");
        assert_eq!(
            h,
            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nA: 1\r\nB: 2\r\n\r\n".to_vec()
        );
        assert_eq!(cache_line(0), "Cache-Control: no-cache\r\n");
        assert_eq!(cache_line(60), "Cache-Control: public, max-age=60\r\n");
    }
}
