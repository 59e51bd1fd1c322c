//! Incremental, pipelining-aware request parsing on top of httparse.
//!
//! [`parse_request`] is called on the bytes read so far. httparse re-reads the head from
//! its start on each call; that is bounded by [`Limits::header_bytes_max`] and is cheaper
//! than keeping parser state per connection (10,000 idle connections must stay small).

use std::time::SystemTime;

use super::{HttpError, Limits};

/// The methods a static file server serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    Get,
    /// Same head as GET, no body (RFC 9110 §9.3.2).
    Head,
    /// `OPTIONS PATH`: a CORS preflight where the path's location allows cross-origin
    /// requests, a 405 elsewhere (the server decides; `OPTIONS *` is refused here).
    Options,
}

/// The two HTTP/1 versions; they differ in their keep-alive default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Version {
    Http10,
    Http11,
}

impl Version {
    /// As written in a status line.
    pub fn as_str(self) -> &'static str {
        match self {
            Version::Http10 => "HTTP/1.0",
            Version::Http11 => "HTTP/1.1",
        }
    }
}

/// A parsed, validated request head: only what a static file server needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: Method,
    /// Percent-decoded, normalized absolute path: starts with `/`, no empty, `.` or `..`
    /// segments, no NUL or control characters, valid UTF-8. Ends with `/` when the client
    /// named a directory (`/a/`, `/a/.`, `/a/b/..`). The query is dropped.
    pub path: String,
    /// The query as the client sent it (without `?`, still percent-encoded; visible ASCII
    /// only, as the request line is), or `None`. Only redirects use it.
    pub query: Option<String>,
    pub version: Version,
    /// The `Host` header, or the authority of an absolute-form target (which takes
    /// precedence, RFC 9112 §3.2.2). Always present for HTTP/1.1.
    pub host: Option<String>,
    /// Whether the connection stays open after the response (before the server's own
    /// limits are applied): HTTP/1.1 unless `Connection: close`, HTTP/1.0 only with
    /// `Connection: keep-alive`.
    pub keep_alive: bool,
    /// The raw `Range` value; `None` if absent, repeated or not UTF-8 (then ignored, as
    /// RFC 9110 §14.2 allows).
    pub range: Option<String>,
    /// All `If-None-Match` values joined with `, ` (a list header may be split).
    pub if_none_match: Option<String>,
    /// `If-Modified-Since`, `None` if absent, repeated or not a valid HTTP-date (RFC 9110
    /// §13.1.3: the recipient MUST ignore it then).
    pub if_modified_since: Option<SystemTime>,
    /// The raw `If-Range` value (an entity-tag or an HTTP-date); `None` if absent or repeated.
    pub if_range: Option<String>,
    /// The raw `Penstock-Fill` value (a cluster node's name and fill key, sent with a peer
    /// fill, docs/origin.md); `None` if absent or repeated. Never logged.
    pub penstock_fill: Option<String>,
    /// The `Origin` value (a browser's cross-origin request, CORS); `None` if absent,
    /// repeated or not UTF-8.
    pub origin: Option<String>,
    /// The `Authorization` value (a viewer's `Bearer` JWT, docs/security.md); `None` if
    /// absent, repeated or not UTF-8. Never logged.
    pub authorization: Option<String>,
}

impl Request {
    /// The path relative to the served root, for `openat2(root_fd, ..)`: no leading `/`,
    /// `"."` for the root itself. A trailing `/` stays: path resolution then requires a
    /// directory (POSIX; Linux fails with ENOTDIR otherwise, a symlink's target included), so
    /// `/a.txt/` is not the file `a.txt` but a 404, as in nginx (issue 20), and the rule is
    /// the kernel's, at the same instant as the open, rather than a check beside it.
    pub fn relative_path(&self) -> &str {
        let rel = self.path.trim_start_matches('/');
        if rel.is_empty() { "." } else { rel }
    }

    /// Whether the client named a directory (the path ends with `/`).
    pub fn names_directory(&self) -> bool {
        self.path.ends_with('/')
    }
}

/// What one call to [`parse_request`] found.
// `Complete` is the common case and is moved once, to the connection that answers it: a box
// would cost an allocation per request for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// The head is not complete yet: read more bytes and call again with the whole buffer.
    Partial,
    /// One request head; `consumed_bytes` (≤ the buffer's length) is where the next
    /// pipelined request starts.
    Complete {
        request: Request,
        consumed_bytes: usize,
    },
}

const KNOWN_METHODS_NOT_ALLOWED: &[&str] = &["POST", "PUT", "DELETE", "CONNECT", "TRACE", "PATCH"];

/// Parses the request head at the start of `buf`.
///
/// Errors are final for the connection: answer with [`HttpError::status`] and close.
/// Never panics, whatever the bytes; `consumed_bytes` never exceeds `buf.len()`.
pub fn parse_request(buf: &[u8], limits: &Limits) -> Result<Parsed, HttpError> {
    check_request_line_len(buf, limits)?;

    // Parse at most `header_bytes_max` bytes: a buffer may hold several pipelined requests,
    // so its length alone says nothing about this head's size.
    let window = &buf[..buf.len().min(limits.header_bytes_max)];
    let mut headers = vec![httparse::EMPTY_HEADER; limits.headers_max];
    let mut req = httparse::Request::new(&mut headers);
    let consumed_bytes = match req.parse(window) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            if buf.len() > limits.header_bytes_max {
                return Err(HttpError::HeadTooLarge {
                    limit_bytes: limits.header_bytes_max,
                });
            }
            return Ok(Parsed::Partial);
        }
        Err(httparse::Error::TooManyHeaders) => {
            return Err(HttpError::TooManyHeaders {
                limit: limits.headers_max,
            });
        }
        Err(httparse::Error::Version) => return Err(version_error(buf)),
        Err(e) => return Err(HttpError::Malformed(httparse_error_name(e))),
    };
    debug_assert!(consumed_bytes <= window.len());

    // httparse returns Complete only with method, path and version all set.
    let (Some(method), Some(target), Some(minor)) = (req.method, req.path, req.version) else {
        return Err(HttpError::Malformed("incomplete request line"));
    };
    let version = match minor {
        0 => Version::Http10,
        1 => Version::Http11,
        _ => return Err(HttpError::VersionNotSupported),
    };
    let method = match method {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        // `OPTIONS *` asks about the server as a whole: nothing to say but the methods.
        "OPTIONS" if target == "*" => return Err(HttpError::MethodNotAllowed(method.into())),
        "OPTIONS" => Method::Options,
        m if KNOWN_METHODS_NOT_ALLOWED.contains(&m) => {
            return Err(HttpError::MethodNotAllowed(m.to_string()));
        }
        m => return Err(HttpError::MethodNotImplemented(truncated(m))),
    };
    let (authority, raw_path, query) = split_target(target)?;
    let path = normalize_path(raw_path)?;
    let fields = HeaderFields::collect(req.headers)?;

    let host = match (authority, fields.host_count) {
        (Some(a), _) if fields.host_count <= 1 => Some(a.to_string()),
        (_, 0) => None,
        (_, 1) => fields.host,
        _ => return Err(HttpError::BadHost),
    };
    if version == Version::Http11 && host.is_none() {
        return Err(HttpError::BadHost);
    }
    let keep_alive = match version {
        Version::Http11 => !fields.connection_close,
        Version::Http10 => fields.connection_keep_alive && !fields.connection_close,
    };
    let request = Request {
        method,
        path,
        query: query.map(str::to_string),
        version,
        host,
        keep_alive,
        range: fields.range.single(),
        if_none_match: fields.if_none_match,
        if_modified_since: fields
            .if_modified_since
            .single()
            .and_then(|v| super::parse_http_date(&v)),
        if_range: fields.if_range.single(),
        penstock_fill: fields.penstock_fill.single(),
        origin: fields.origin.single(),
        authorization: fields.authorization.single(),
    };
    Ok(Parsed::Complete {
        request,
        consumed_bytes,
    })
}

/// 414 as soon as the request line is known to be too long, even before its end arrives,
/// so a client cannot make us buffer a huge target.
fn check_request_line_len(buf: &[u8], limits: &Limits) -> Result<(), HttpError> {
    // httparse skips empty lines before the request line (RFC 9112 §2.2); so do we.
    let lead = buf
        .iter()
        .take_while(|&&b| b == b'\r' || b == b'\n')
        .count();
    let rest = &buf[lead..];
    let line_len = rest
        .iter()
        .position(|&b| b == b'\n')
        .map_or(rest.len(), |i| i + 1);
    if line_len > limits.request_line_bytes_max {
        return Err(HttpError::RequestLineTooLong {
            limit_bytes: limits.request_line_bytes_max,
        });
    }
    Ok(())
}

/// httparse says `Version` both for `HTTP/2.0` and for garbage; only the former is a 505.
fn version_error(buf: &[u8]) -> HttpError {
    let lead = buf
        .iter()
        .take_while(|&&b| b == b'\r' || b == b'\n')
        .count();
    let rest = &buf[lead..];
    let line = &rest[..rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len())];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let last = line.rsplit(|&b| b == b' ').next().unwrap_or(&[]);
    let looks_like_version = last.len() == 8
        && last.starts_with(b"HTTP/")
        && last[5].is_ascii_digit()
        && last[6] == b'.'
        && last[7].is_ascii_digit();
    if looks_like_version {
        HttpError::VersionNotSupported
    } else {
        HttpError::Malformed("bad request line")
    }
}

fn httparse_error_name(e: httparse::Error) -> &'static str {
    match e {
        httparse::Error::HeaderName => "bad header name",
        httparse::Error::HeaderValue => "bad header value",
        httparse::Error::NewLine => "bad line ending",
        httparse::Error::Token => "bad token in request line",
        _ => "bad request line",
    }
}

/// Keeps error messages (which may be logged) short whatever the client sent.
fn truncated(s: &str) -> String {
    s.chars().take(32).collect()
}

/// Splits origin-form `/p?q` or absolute-form `http://host/p?q` into (authority, path,
/// query); a fragment is dropped.
fn split_target(target: &str) -> Result<(Option<&str>, &str, Option<&str>), HttpError> {
    let (authority, path_and_query) = if target.starts_with('/') {
        (None, target)
    } else {
        let lower_scheme = target
            .get(..8)
            .map(str::to_ascii_lowercase)
            .unwrap_or_default();
        let rest = if lower_scheme.starts_with("http://") {
            &target[7..]
        } else if lower_scheme.starts_with("https://") {
            &target[8..]
        } else {
            return Err(HttpError::BadTarget("not an absolute path"));
        };
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let authority = &rest[..end];
        if authority.is_empty() {
            return Err(HttpError::BadTarget("empty authority"));
        }
        let path = &rest[end..];
        (
            Some(authority),
            if path.starts_with('/') { path } else { "/" },
        )
    };
    let end = path_and_query
        .find(['?', '#'])
        .unwrap_or(path_and_query.len());
    let query = path_and_query[end..].strip_prefix('?').map(|q| {
        let q_end = q.find('#').unwrap_or(q.len());
        &q[..q_end]
    });
    Ok((authority, &path_and_query[..end], query))
}

/// Percent-decodes and normalizes `raw` (which starts with `/`).
///
/// Decoding happens before `.`/`..` resolution, so `%2e%2e` is a `..` and `%2f` a separator:
/// the filesystem would see them that way, so must we. A `..` that climbs above the root is
/// [`HttpError::PathEscape`] (403: the request is understood and refused; the driver's
/// openat2 RESOLVE_BENEATH refusal of symlink escapes gets the same status).
pub fn normalize_path(raw: &str) -> Result<String, HttpError> {
    let decoded = percent_decode(raw.as_bytes())?;
    if decoded.contains(&0) {
        return Err(HttpError::BadTarget("NUL in path"));
    }
    if decoded.iter().any(|&b| b < 0x20 || b == 0x7f) {
        // Names with control characters are legal on Linux but only ever seen in attacks
        // (log injection); refuse rather than serve.
        return Err(HttpError::BadTarget("control character in path"));
    }
    let decoded =
        String::from_utf8(decoded).map_err(|_| HttpError::BadTarget("path is not UTF-8"))?;
    let mut segments: Vec<&str> = Vec::new();
    let mut names_directory = false;
    for seg in decoded.split('/') {
        names_directory = true;
        match seg {
            "" | "." => {}
            ".." => {
                if segments.pop().is_none() {
                    return Err(HttpError::PathEscape);
                }
            }
            s => {
                segments.push(s);
                names_directory = false;
            }
        }
    }
    let mut path = String::with_capacity(decoded.len());
    for s in &segments {
        path.push('/');
        path.push_str(s);
    }
    if segments.is_empty() || names_directory {
        path.push('/');
    }
    Ok(path)
}

fn percent_decode(raw: &[u8]) -> Result<Vec<u8>, HttpError> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' {
            let hi = raw.get(i + 1).and_then(|&b| hex_value(b));
            let lo = raw.get(i + 2).and_then(|&b| hex_value(b));
            let (Some(hi), Some(lo)) = (hi, lo) else {
                return Err(HttpError::BadTarget("bad percent-escape"));
            };
            out.push(hi << 4 | lo);
            i += 3;
        } else {
            out.push(raw[i]);
            i += 1;
        }
    }
    Ok(out)
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// A header that must appear at most once to mean anything.
#[derive(Default)]
struct Singleton {
    value: Option<String>,
    count: usize,
}

impl Singleton {
    fn add(&mut self, value: &[u8]) {
        self.count += 1;
        self.value = std::str::from_utf8(value)
            .ok()
            .map(|s| s.trim().to_string());
    }

    fn single(self) -> Option<String> {
        if self.count == 1 { self.value } else { None }
    }
}

#[derive(Default)]
struct HeaderFields {
    host: Option<String>,
    host_count: usize,
    connection_close: bool,
    connection_keep_alive: bool,
    range: Singleton,
    if_none_match: Option<String>,
    if_modified_since: Singleton,
    if_range: Singleton,
    penstock_fill: Singleton,
    origin: Singleton,
    authorization: Singleton,
}

impl HeaderFields {
    fn collect(headers: &[httparse::Header<'_>]) -> Result<HeaderFields, HttpError> {
        let mut f = HeaderFields::default();
        let mut content_length: Option<u64> = None;
        let mut transfer_encoding = false;
        for h in headers {
            let name = h.name;
            if name.eq_ignore_ascii_case("host") {
                f.host_count += 1;
                let v = std::str::from_utf8(h.value)
                    .map_err(|_| HttpError::BadHost)?
                    .trim();
                if v.contains(|c: char| c.is_ascii_whitespace() || c == '/') {
                    return Err(HttpError::BadHost);
                }
                f.host = Some(v.to_string());
            } else if name.eq_ignore_ascii_case("connection") {
                for token in h.value.split(|&b| b == b',') {
                    let token = token.trim_ascii();
                    if token.eq_ignore_ascii_case(b"close") {
                        f.connection_close = true;
                    } else if token.eq_ignore_ascii_case(b"keep-alive") {
                        f.connection_keep_alive = true;
                    }
                }
            } else if name.eq_ignore_ascii_case("content-length") {
                // RFC 9112 §6.3: a list of identical values is one value; differing values
                // or non-digits are unrecoverable framing errors.
                for part in h.value.split(|&b| b == b',') {
                    let n =
                        parse_content_length(part.trim_ascii()).ok_or(HttpError::BadHeader {
                            name: "Content-Length",
                        })?;
                    if content_length.is_some_and(|prev| prev != n) {
                        return Err(HttpError::BadHeader {
                            name: "Content-Length",
                        });
                    }
                    content_length = Some(n);
                }
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                transfer_encoding = true;
            } else if name.eq_ignore_ascii_case("range") {
                f.range.add(h.value);
            } else if name.eq_ignore_ascii_case("if-none-match") {
                if let Ok(v) = std::str::from_utf8(h.value) {
                    let v = v.trim();
                    match &mut f.if_none_match {
                        Some(all) => {
                            all.push_str(", ");
                            all.push_str(v);
                        }
                        None => f.if_none_match = Some(v.to_string()),
                    }
                }
            } else if name.eq_ignore_ascii_case("if-modified-since") {
                f.if_modified_since.add(h.value);
            } else if name.eq_ignore_ascii_case("if-range") {
                f.if_range.add(h.value);
            } else if name.eq_ignore_ascii_case("penstock-fill") {
                f.penstock_fill.add(h.value);
            } else if name.eq_ignore_ascii_case("origin") {
                f.origin.add(h.value);
            } else if name.eq_ignore_ascii_case("authorization") {
                f.authorization.add(h.value);
            }
        }
        if transfer_encoding && content_length.is_some() {
            // Both framings at once is the classic smuggling vector (RFC 9112 §6.1).
            return Err(HttpError::BadHeader {
                name: "Transfer-Encoding",
            });
        }
        if transfer_encoding || content_length.is_some_and(|n| n > 0) {
            return Err(HttpError::BodyNotAllowed);
        }
        Ok(f)
    }
}

/// Digits only (`u64::from_str` would accept `+5`); at most 19 of them, so no overflow.
fn parse_content_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(v.iter().fold(0u64, |n, &d| n * 10 + u64::from(d - b'0')))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::Status;

    fn parse(s: &str) -> Result<Parsed, HttpError> {
        parse_request(s.as_bytes(), &Limits::default())
    }

    fn complete(s: &str) -> (Request, usize) {
        match parse(s) {
            Ok(Parsed::Complete {
                request,
                consumed_bytes,
            }) => (request, consumed_bytes),
            other => panic!("expected a complete request from {s:?}, got {other:?}"),
        }
    }

    fn status_of(s: &str) -> u16 {
        match parse(s) {
            Err(e) => e.status().code(),
            other => panic!("expected an error from {s:?}, got {other:?}"),
        }
    }

    #[test]
    fn simple_get() {
        let s = "GET /movies/a.ts?x=1 HTTP/1.1\r\nHost: example\r\n\r\n";
        let (r, n) = complete(s);
        assert_eq!(n, s.len());
        assert_eq!(r.method, Method::Get);
        assert_eq!(r.path, "/movies/a.ts");
        assert_eq!(r.relative_path(), "movies/a.ts");
        assert_eq!(r.version, Version::Http11);
        assert_eq!(r.host.as_deref(), Some("example"));
        assert!(r.keep_alive);
        assert_eq!(r.range, None);
    }

    #[test]
    fn partial_until_the_empty_line() {
        let s = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        for cut in 0..s.len() {
            assert_eq!(parse(&s[..cut]), Ok(Parsed::Partial), "cut at {cut}");
        }
        assert!(matches!(parse(s), Ok(Parsed::Complete { .. })));
    }

    #[test]
    fn pipelined_requests_are_consumed_one_at_a_time() {
        let one = "GET /a HTTP/1.1\r\nHost: x\r\n\r\n";
        let two = "HEAD /b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        let buf = format!("{one}{two}GET /c HT");
        let (r1, n1) = complete(&buf);
        assert_eq!((r1.path.as_str(), n1), ("/a", one.len()));
        let (r2, n2) = complete(&buf[n1..]);
        assert_eq!(
            (r2.method, r2.path.as_str(), n2),
            (Method::Head, "/b", two.len())
        );
        assert!(!r2.keep_alive);
        assert_eq!(parse(&buf[n1 + n2..]), Ok(Parsed::Partial));
    }

    #[test]
    fn pipelined_buffer_longer_than_the_head_limit_is_not_a_431() {
        let one = "GET /a HTTP/1.1\r\nHost: x\r\n\r\n";
        let limits = Limits {
            header_bytes_max: one.len(),
            ..Limits::default()
        };
        let buf = one.repeat(10);
        let r = parse_request(buf.as_bytes(), &limits).unwrap();
        assert!(
            matches!(r, Parsed::Complete { consumed_bytes, .. } if consumed_bytes == one.len())
        );
    }

    #[test]
    fn keep_alive_rules() {
        let ka = |s: &str| complete(s).0.keep_alive;
        assert!(ka("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
        assert!(!ka(
            "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        ));
        assert!(!ka(
            "GET / HTTP/1.1\r\nHost: x\r\nConnection: Keep-Alive, CLOSE\r\n\r\n"
        ));
        assert!(!ka("GET / HTTP/1.0\r\n\r\n"));
        assert!(ka("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
        assert!(ka(
            "GET / HTTP/1.0\r\nconnection: Upgrade, Keep-Alive\r\n\r\n"
        ));
    }

    #[test]
    fn host_rules() {
        assert_eq!(status_of("GET / HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(
            status_of("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"),
            400
        );
        assert_eq!(status_of("GET / HTTP/1.1\r\nHost: a/b\r\n\r\n"), 400);
        // HTTP/1.0 may omit Host.
        assert_eq!(complete("GET / HTTP/1.0\r\n\r\n").0.host, None);
        // Absolute-form: the target's authority wins.
        let (r, _) = complete("GET http://media.example/a%20b.ts HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(
            (r.host.as_deref(), r.path.as_str()),
            (Some("media.example"), "/a b.ts")
        );
        let (r, _) = complete("GET HTTP://h HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(r.path, "/");
    }

    #[test]
    fn request_line_garbage_is_400() {
        assert_eq!(status_of("garbage\r\n\r\n"), 400);
        assert_eq!(status_of("GET\r\n\r\n"), 400);
        assert_eq!(status_of("GET /\r\n\r\n"), 400); // HTTP/0.9
        assert_eq!(status_of("GET  / HTTP/1.1\r\nHost: x\r\n\r\n"), 400);
        assert_eq!(status_of("GET / FOO/1.1\r\nHost: x\r\n\r\n"), 400);
        assert_eq!(
            status_of("\x16\x03\x01\x02\x00\x01\x00\x01\x7c\x03\x03\r\n\r\n"),
            400
        );
        assert_eq!(status_of("GET * HTTP/1.1\r\nHost: x\r\n\r\n"), 400);
        assert_eq!(status_of("GET ftp://x/ HTTP/1.1\r\nHost: x\r\n\r\n"), 400);
    }

    #[test]
    fn bad_header_is_400() {
        assert_eq!(
            status_of("GET / HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n"),
            400
        );
        assert_eq!(status_of("GET / HTTP/1.1\r\nHost: x\r\n: y\r\n\r\n"), 400);
        assert_eq!(
            status_of("GET / HTTP/1.1\r\nHost: x\r\nA: b\rc\r\n\r\n"),
            400
        );
        // obs-fold is refused (RFC 9112 §5.2 allows that).
        assert_eq!(
            status_of("GET / HTTP/1.1\r\nHost: x\r\nA: b\r\n c\r\n\r\n"),
            400
        );
    }

    #[test]
    fn versions() {
        assert_eq!(status_of("GET / HTTP/2.0\r\nHost: x\r\n\r\n"), 505);
        assert_eq!(status_of("GET / HTTP/1.2\r\nHost: x\r\n\r\n"), 505);
        assert_eq!(
            complete("GET / HTTP/1.0\r\n\r\n").0.version,
            Version::Http10
        );
    }

    #[test]
    fn methods() {
        assert_eq!(status_of("POST / HTTP/1.1\r\nHost: x\r\n\r\n"), 405);
        assert_eq!(status_of("DELETE / HTTP/1.1\r\nHost: x\r\n\r\n"), 405);
        assert_eq!(status_of("BREW / HTTP/1.1\r\nHost: x\r\n\r\n"), 501);
        // Methods are case-sensitive (RFC 9110 §9.1).
        assert_eq!(status_of("get / HTTP/1.1\r\nHost: x\r\n\r\n"), 501);
        assert_eq!(
            complete("HEAD / HTTP/1.1\r\nHost: x\r\n\r\n").0.method,
            Method::Head
        );
    }

    /// A CORS preflight parses (the server decides what it gets); `OPTIONS *` does not.
    #[test]
    fn options_with_an_origin_is_a_preflight_and_options_star_is_405() {
        let r = complete(
            "OPTIONS /v/a.ts HTTP/1.1\r\nHost: x\r\nOrigin: https://p.example\r\nAccess-Control-Request-Method: GET\r\n\r\n",
        )
        .0;
        assert_eq!(r.method, Method::Options);
        assert_eq!(r.origin.as_deref(), Some("https://p.example"));
        assert_eq!(status_of("OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n"), 405);
        let twice = complete("GET / HTTP/1.1\r\nHost: x\r\nOrigin: a\r\nOrigin: b\r\n\r\n").0;
        assert_eq!(twice.origin, None);
    }

    #[test]
    fn oversized_head_is_431_and_long_line_is_414() {
        let limits = Limits {
            header_bytes_max: 64,
            request_line_bytes_max: 32,
            ..Limits::default()
        };
        let head = format!(
            "GET / HTTP/1.1\r\nHost: x\r\nX: {}\r\n\r\n",
            "a".repeat(100)
        );
        let e = parse_request(head.as_bytes(), &limits).unwrap_err();
        assert_eq!(e.status(), Status::REQUEST_HEADER_FIELDS_TOO_LARGE);
        // Still incomplete but already too big: 431 without waiting for the end.
        let e = parse_request(&head.as_bytes()[..70], &limits).unwrap_err();
        assert_eq!(e.status().code(), 431);
        // Slowloris sending empty lines forever also hits the head limit.
        let e = parse_request("\r\n".repeat(40).as_bytes(), &limits).unwrap_err();
        assert_eq!(e.status().code(), 431);
        let line = format!("GET /{} HTTP/1.1\r\n", "b".repeat(40));
        let e = parse_request(line.as_bytes(), &limits).unwrap_err();
        assert_eq!(e.status(), Status::URI_TOO_LONG);
        // Known to be too long before the line ends.
        let e = parse_request(&line.as_bytes()[..33], &limits).unwrap_err();
        assert_eq!(e.status().code(), 414);
    }

    #[test]
    fn too_many_headers_is_431() {
        let limits = Limits {
            headers_max: 3,
            ..Limits::default()
        };
        let head = "GET / HTTP/1.1\r\nHost: x\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n";
        let e = parse_request(head.as_bytes(), &limits).unwrap_err();
        assert_eq!(e, HttpError::TooManyHeaders { limit: 3 });
        assert_eq!(e.status().code(), 431);
    }

    #[test]
    fn dot_dot_escapes_are_403() {
        for p in [
            "/..",
            "/../etc/passwd",
            "/a/../../etc/passwd",
            "/%2e%2e/etc/passwd",
            "/%2E%2e",
            "/a/%2e%2e%2f%2e%2e/x",
            "/./../x",
        ] {
            let s = format!("GET {p} HTTP/1.1\r\nHost: x\r\n\r\n");
            assert_eq!(status_of(&s), 403, "{p}");
        }
    }

    #[test]
    fn paths_are_normalized() {
        let path = |p: &str| {
            complete(&format!("GET {p} HTTP/1.1\r\nHost: x\r\n\r\n"))
                .0
                .path
        };
        assert_eq!(path("/"), "/");
        assert_eq!(path("//a///b"), "/a/b");
        assert_eq!(path("/a/./b/../c"), "/a/c");
        assert_eq!(path("/a/b/.."), "/a/");
        assert_eq!(path("/a/"), "/a/");
        assert_eq!(path("/a/."), "/a/");
        assert_eq!(path("/a/.."), "/");
        assert_eq!(path("/%41%62%2fc"), "/Ab/c");
        assert_eq!(path("/caf%C3%A9.mp4"), "/café.mp4");
        assert_eq!(path("/a?../../x"), "/a");
        assert_eq!(path("/.hidden"), "/.hidden");
        assert_eq!(path("/..."), "/...");
        let (r, _) = complete("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(r.relative_path(), ".");
        assert!(r.names_directory());
    }

    /// Issue 20: `/sub/a.txt/` must not open `sub/a.txt`; the trailing slash goes to the
    /// kernel, which resolves it only to a directory.
    #[test]
    fn relative_path_keeps_the_trailing_slash() {
        let rel = |p: &str| {
            complete(&format!("GET {p} HTTP/1.1\r\nHost: x\r\n\r\n"))
                .0
                .relative_path()
                .to_string()
        };
        assert_eq!(rel("/sub/a.txt/"), "sub/a.txt/");
        assert_eq!(rel("/sub/a.txt/."), "sub/a.txt/");
        assert_eq!(rel("/sub/a.txt"), "sub/a.txt");
        assert_eq!(rel("/sub/"), "sub/");
        assert_eq!(rel("/sub/x/.."), "sub/");
        assert_eq!(rel("/"), ".");
    }

    #[test]
    fn nul_bad_escapes_and_non_utf8_are_400() {
        for p in ["/a%00b", "/a%", "/a%4", "/a%zz", "/%ff%fe", "/a%0ab"] {
            let s = format!("GET {p} HTTP/1.1\r\nHost: x\r\n\r\n");
            assert_eq!(status_of(&s), 400, "{p}");
        }
        // A raw NUL is already refused by httparse.
        assert_eq!(status_of("GET /a\0b HTTP/1.1\r\nHost: x\r\n\r\n"), 400);
    }

    #[test]
    fn bodies_are_refused() {
        assert_eq!(
            status_of("GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"),
            413
        );
        assert_eq!(
            status_of("GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"),
            413
        );
        assert_eq!(
            status_of(
                "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n"
            ),
            400
        );
        assert_eq!(
            status_of("GET / HTTP/1.1\r\nHost: x\r\nContent-Length: +0\r\n\r\n"),
            400
        );
        assert_eq!(
            status_of(
                "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 1\r\n\r\n"
            ),
            400
        );
        assert_eq!(
            status_of(
                "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n"
            ),
            400
        );
        let (_, n) = complete("GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 0, 0\r\n\r\n");
        assert!(n > 0);
    }

    #[test]
    fn conditional_and_range_headers() {
        let s = "GET /v.mp4 HTTP/1.1\r\nHost: x\r\nRange: bytes=0-99\r\nIf-None-Match: \"a\"\r\n\
                 if-none-match: W/\"b\"\r\nIf-Modified-Since: Sun, 06 Nov 1994 08:49:37 GMT\r\n\
                 If-Range: \"a\"\r\n\r\n";
        let (r, _) = complete(s);
        assert_eq!(r.range.as_deref(), Some("bytes=0-99"));
        assert_eq!(r.if_none_match.as_deref(), Some("\"a\", W/\"b\""));
        assert_eq!(
            r.if_modified_since,
            Some(std::time::UNIX_EPOCH + std::time::Duration::from_secs(784111777))
        );
        assert_eq!(r.if_range.as_deref(), Some("\"a\""));
        assert_eq!(r.penstock_fill, None);
        let (r, _) = complete("GET /v HTTP/1.1\r\nHost: x\r\npenstock-fill: b 00ff\r\n\r\n");
        assert_eq!(r.penstock_fill.as_deref(), Some("b 00ff"));
        let (r, _) = complete(
            "GET /v HTTP/1.1\r\nHost: x\r\nPenstock-Fill: b 1\r\nPenstock-Fill: b 1\r\n\r\n",
        );
        assert_eq!(r.penstock_fill, None, "repeated: ignored");
        // Repeated Range and invalid dates are ignored, not errors.
        let s = "GET / HTTP/1.1\r\nHost: x\r\nRange: bytes=0-1\r\nRange: bytes=2-3\r\n\
                 If-Modified-Since: yesterday\r\n\r\n";
        let (r, _) = complete(s);
        assert_eq!((r.range, r.if_modified_since), (None, None));
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn never_panics_never_overconsumes(buf in proptest::collection::vec(any::<u8>(), 0..512)) {
                if let Ok(Parsed::Complete { consumed_bytes, .. }) = parse_request(&buf, &Limits::default()) {
                    prop_assert!(consumed_bytes <= buf.len());
                    prop_assert!(consumed_bytes > 0);
                }
            }

            #[test]
            fn valid_heads_with_noise(
                path in "/[a-zA-Z0-9%./_-]{0,40}",
                extra in proptest::collection::vec(any::<u8>(), 0..64),
            ) {
                let head = format!("GET {path} HTTP/1.1\r\nHost: h\r\n\r\n");
                let mut buf = head.clone().into_bytes();
                buf.extend_from_slice(&extra);
                match parse_request(&buf, &Limits::default()) {
                    Ok(Parsed::Complete { request, consumed_bytes }) => {
                        prop_assert_eq!(consumed_bytes, head.len());
                        prop_assert!(request.path.starts_with('/'));
                        prop_assert!(!request.path.split('/').any(|s| s == ".." || s == "."));
                    }
                    Ok(Parsed::Partial) => prop_assert!(false, "complete head reported partial"),
                    Err(e) => prop_assert!(matches!(e, HttpError::BadTarget(_) | HttpError::PathEscape)),
                }
            }
        }
    }
}
