//! Response heads and body plans. The head is bytes; the body is a list of pieces that are
//! either small bytes from memory (multipart part headers, error texts) or extents of the
//! file, which the driver sends with sendfile / io_uring without the CPU touching them.

use std::fmt;
use std::time::SystemTime;

use super::Status;
use super::conditional::{ETag, Precondition, evaluate_preconditions, if_range_allows};
use super::date::format_http_date;
use super::range::{ByteRange, RangeSet, parse_range};
use super::request::{Method, Request};

/// What the driver learned from `statx` on the opened file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileMeta {
    pub len_bytes: u64,
    pub mtime: SystemTime,
    /// A version number that names this content better than length and mtime do (a volume
    /// partition's generation): the `ETag` is then [`super::ETag::for_generation`].
    pub generation: Option<u64>,
}

/// The `Connection` header we send, and so what the driver does after the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionHeader {
    /// `Connection: keep-alive`, plus `Keep-Alive: timeout=N` when a timeout is given (sent
    /// for HTTP/1.1 too: it costs a few bytes and tells clients when we will hang up).
    KeepAlive { timeout_s: Option<u64> },
    /// `Connection: close`: the driver closes after the body.
    Close,
}

/// A `Content-Range` value (RFC 9110 §14.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentRange {
    /// `bytes START-END/LEN`, in a 206.
    Bytes {
        range: ByteRange,
        complete_len_bytes: u64,
    },
    /// `bytes */LEN`, in a 416.
    Unsatisfied { complete_len_bytes: u64 },
}

impl fmt::Display for ContentRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ContentRange::Bytes {
                range,
                complete_len_bytes,
            } => {
                write!(
                    f,
                    "bytes {}-{}/{}",
                    range.start, range.end_inclusive, complete_len_bytes
                )
            }
            ContentRange::Unsatisfied { complete_len_bytes } => {
                write!(f, "bytes */{complete_len_bytes}")
            }
        }
    }
}

/// Every header a response of this server may carry. `None` fields are not written.
#[derive(Debug, Clone)]
pub struct ResponseHead<'a> {
    pub status: Status,
    /// The time the response is generated, from the driver's clock.
    pub date: SystemTime,
    /// The `Server` value; empty to omit the header.
    pub server: &'a str,
    pub content_type: Option<&'a str>,
    /// Never written for statuses without a body (304).
    pub content_length_bytes: Option<u64>,
    pub content_range: Option<ContentRange>,
    /// `Accept-Ranges: bytes`.
    pub accept_ranges: bool,
    pub etag: Option<&'a ETag>,
    pub last_modified: Option<SystemTime>,
    /// `Allow`, for 405.
    pub allow: Option<&'a str>,
    /// `Location`, for 301.
    pub location: Option<&'a str>,
    pub connection: ConnectionHeader,
}

/// Appends the status line and headers of `head`, and the empty line, to `out`.
///
/// Header values are ours except `server` and `content_type`, which come from configuration;
/// CR, LF and NUL are dropped from every value so that no value can split the head.
pub fn write_response_head(head: &ResponseHead<'_>, out: &mut Vec<u8>) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(head.status.code().to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(head.status.reason().as_bytes());
    out.extend_from_slice(b"\r\n");
    if !head.server.is_empty() {
        push_header(out, "Server", head.server);
    }
    push_header(out, "Date", &format_http_date(head.date));
    if let Some(t) = head.content_type {
        push_header(out, "Content-Type", t);
    }
    if let Some(n) = head
        .content_length_bytes
        .filter(|_| head.status.allows_body())
    {
        push_header(out, "Content-Length", &n.to_string());
    }
    if let Some(r) = head.content_range {
        push_header(out, "Content-Range", &r.to_string());
    }
    if let Some(t) = head.last_modified {
        push_header(out, "Last-Modified", &format_http_date(t));
    }
    if let Some(e) = head.etag {
        push_header(out, "ETag", e.as_str());
    }
    if head.accept_ranges {
        push_header(out, "Accept-Ranges", "bytes");
    }
    if let Some(a) = head.allow {
        push_header(out, "Allow", a);
    }
    if let Some(l) = head.location {
        push_header(out, "Location", l);
    }
    match head.connection {
        ConnectionHeader::KeepAlive { timeout_s } => {
            push_header(out, "Connection", "keep-alive");
            if let Some(t) = timeout_s {
                push_header(out, "Keep-Alive", &format!("timeout={t}"));
            }
        }
        ConnectionHeader::Close => push_header(out, "Connection", "close"),
    }
    out.extend_from_slice(b"\r\n");
}

fn push_header(out: &mut Vec<u8>, name: &str, value: &str) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend(value.bytes().filter(|&b| !matches!(b, b'\r' | b'\n' | 0)));
    out.extend_from_slice(b"\r\n");
}

/// One piece of a response body, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyPiece {
    /// Bytes from memory (multipart part headers, error texts).
    Bytes(Vec<u8>),
    /// `len_bytes` bytes of the file from `offset_bytes`: sendfile / io_uring territory.
    File { offset_bytes: u64, len_bytes: u64 },
}

impl BodyPiece {
    pub fn len_bytes(&self) -> u64 {
        match self {
            BodyPiece::Bytes(b) => b.len() as u64,
            BodyPiece::File { len_bytes, .. } => *len_bytes,
        }
    }
}

/// A `multipart/byteranges` body (RFC 9110 §14.6): its pieces and their exact total.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultipartPlan {
    pub pieces: Vec<BodyPiece>,
    /// The sum of the pieces' lengths: the response's `Content-Length`.
    pub content_length_bytes: u64,
}

/// A multipart boundary from a number the driver chooses (a random u64 per response or
/// per process: the core has no randomness). 25 characters, well within RFC 2046's 70.
pub fn boundary_for(seed: u64) -> String {
    format!("penstock_{seed:016x}")
}

/// Lays out a `multipart/byteranges` body in nginx's format: every part is
/// `CRLF--BOUNDARY CRLF Content-Type CRLF Content-Range CRLF CRLF <bytes>`, and the body
/// ends with `CRLF--BOUNDARY--CRLF`. Part headers go in [`BodyPiece::Bytes`], part data in
/// [`BodyPiece::File`], so the exact `Content-Length` is known before any byte is read.
///
/// # Panics
/// If a range lies outside the file, or `boundary` is not 1 to 70 characters of RFC 2046's
/// `bchars` without a trailing space: both are the caller's bugs, not client input
/// ([`parse_range`] only yields ranges within the file).
pub fn multipart_plan(
    ranges: &[ByteRange],
    file_len_bytes: u64,
    content_type: &str,
    boundary: &str,
) -> MultipartPlan {
    assert!(
        !boundary.is_empty()
            && boundary.len() <= 70
            && !boundary.ends_with(' ')
            && boundary
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"'()+_,-./:=? ".contains(&b)),
        "invalid multipart boundary {boundary:?}"
    );
    let mut pieces = Vec::with_capacity(ranges.len() * 2 + 1);
    for r in ranges {
        assert!(
            r.start <= r.end_inclusive && r.end_inclusive < file_len_bytes,
            "{r:?} outside the file"
        );
        let mut part = Vec::with_capacity(128);
        part.extend_from_slice(b"\r\n--");
        part.extend_from_slice(boundary.as_bytes());
        part.extend_from_slice(b"\r\n");
        push_header(&mut part, "Content-Type", content_type);
        let cr = ContentRange::Bytes {
            range: *r,
            complete_len_bytes: file_len_bytes,
        };
        push_header(&mut part, "Content-Range", &cr.to_string());
        part.extend_from_slice(b"\r\n");
        pieces.push(BodyPiece::Bytes(part));
        pieces.push(BodyPiece::File {
            offset_bytes: r.start,
            len_bytes: r.len_bytes(),
        });
    }
    pieces.push(BodyPiece::Bytes(
        format!("\r\n--{boundary}--\r\n").into_bytes(),
    ));
    let content_length_bytes = pieces.iter().map(BodyPiece::len_bytes).sum();
    MultipartPlan {
        pieces,
        content_length_bytes,
    }
}

/// What the driver needs from the server's configuration and state to answer.
#[derive(Debug, Clone)]
pub struct ResponseContext<'a> {
    /// Now, from the driver's wall clock, for `Date`.
    pub date: SystemTime,
    /// `Server` value (empty: no header).
    pub server: &'a str,
    /// Whether the server lets this connection live on (requests-per-connection budget
    /// left, not shutting down). The client's wish is in [`Request::keep_alive`].
    pub keep_alive_allowed: bool,
    /// Advertised in `Keep-Alive: timeout=N`.
    pub keep_alive_timeout_s: Option<u64>,
    /// See [`super::Limits::ranges_max`].
    pub ranges_max: usize,
    /// For multi-range responses; see [`boundary_for`].
    pub boundary: &'a str,
}

/// A complete answer: the head to send, then the body pieces in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: Status,
    pub head: Vec<u8>,
    /// Empty for HEAD and for 304; otherwise its lengths add up to `Content-Length`.
    pub body: Vec<BodyPiece>,
    /// Whether the connection stays open after the body.
    pub keep_alive: bool,
}

impl Response {
    /// Bytes in the body pieces (what the driver will send after the head).
    pub fn body_len_bytes(&self) -> u64 {
        self.body.iter().map(BodyPiece::len_bytes).sum()
    }
}

const ALLOWED_METHODS: &str = "GET, HEAD";

/// The response to a GET or HEAD for a regular file: 304, 200, 206 (single or multipart) or
/// 416, following RFC 9110 §13.2.2 (preconditions first, then If-Range, then Range). HEAD
/// gets exactly GET's head and an empty body.
pub fn respond_file(
    req: &Request,
    file: &FileMeta,
    content_type: &str,
    ctx: &ResponseContext<'_>,
) -> Response {
    let keep_alive = req.keep_alive && ctx.keep_alive_allowed;
    let etag = match file.generation {
        Some(g) => ETag::for_generation(g, file.len_bytes),
        None => ETag::for_file(file.len_bytes, file.mtime),
    };
    let mut head = ResponseHead {
        status: Status::OK,
        date: ctx.date,
        server: ctx.server,
        content_type: Some(content_type),
        content_length_bytes: None,
        content_range: None,
        accept_ranges: true,
        etag: Some(&etag),
        last_modified: Some(file.mtime),
        allow: None,
        location: None,
        connection: connection_header(keep_alive, ctx),
    };
    let mut body = Vec::new();
    let multipart_type;

    let ranges = match &req.range {
        Some(v) if if_range_allows(req.if_range.as_deref(), &etag, file.mtime) => {
            parse_range(v, file.len_bytes, ctx.ranges_max)
        }
        _ => RangeSet::Ignore,
    };
    if evaluate_preconditions(req, &etag, file.mtime) == Precondition::NotModified {
        head.status = Status::NOT_MODIFIED;
        head.content_type = None;
        head.accept_ranges = false;
    } else {
        match ranges {
            RangeSet::Ignore => {
                head.content_length_bytes = Some(file.len_bytes);
                if file.len_bytes > 0 {
                    body.push(BodyPiece::File {
                        offset_bytes: 0,
                        len_bytes: file.len_bytes,
                    });
                }
            }
            RangeSet::Unsatisfiable => {
                let text = error_text(Status::RANGE_NOT_SATISFIABLE);
                head.status = Status::RANGE_NOT_SATISFIABLE;
                head.content_type = Some(TEXT_PLAIN);
                head.content_length_bytes = Some(text.len() as u64);
                head.content_range = Some(ContentRange::Unsatisfied {
                    complete_len_bytes: file.len_bytes,
                });
                body.push(BodyPiece::Bytes(text.into_bytes()));
            }
            RangeSet::Satisfiable(rs) if rs.len() == 1 => {
                let r = rs[0];
                head.status = Status::PARTIAL_CONTENT;
                head.content_length_bytes = Some(r.len_bytes());
                head.content_range = Some(ContentRange::Bytes {
                    range: r,
                    complete_len_bytes: file.len_bytes,
                });
                body.push(BodyPiece::File {
                    offset_bytes: r.start,
                    len_bytes: r.len_bytes(),
                });
            }
            RangeSet::Satisfiable(rs) => {
                let plan = multipart_plan(&rs, file.len_bytes, content_type, ctx.boundary);
                multipart_type = format!("multipart/byteranges; boundary={}", ctx.boundary);
                head.status = Status::PARTIAL_CONTENT;
                head.content_type = Some(&multipart_type);
                head.content_length_bytes = Some(plan.content_length_bytes);
                body = plan.pieces;
            }
        }
    }
    let mut bytes = Vec::with_capacity(256);
    write_response_head(&head, &mut bytes);
    if req.method == Method::Head || !head.status.allows_body() {
        body.clear();
    }
    Response {
        status: head.status,
        head: bytes,
        body,
        keep_alive,
    }
}

const TEXT_PLAIN: &str = "text/plain; charset=utf-8";

fn error_text(status: Status) -> String {
    format!("{} {}\n", status.code(), status.reason())
}

/// An error response with a short text body: for [`super::HttpError::status`] (then `req`
/// is `None` and the connection closes) and for the driver's own refusals (403 directory or
/// symlink escape, 404, 500, 503) of a parsed request, which may keep the connection.
/// 405 carries `Allow: GET, HEAD`.
pub fn respond_error(status: Status, req: Option<&Request>, ctx: &ResponseContext<'_>) -> Response {
    short_text(status, req, None, ctx)
}

/// 301 to the directory form of a request that named a directory without the final `/`
/// (`/media` → `/media/`), as nginx does before serving its index: relative links in the
/// index then resolve against the directory. The `Location` is path-absolute: the
/// normalized path percent-encoded again, a `/`, and the client's query.
pub fn respond_redirect_to_directory(req: &Request, ctx: &ResponseContext<'_>) -> Response {
    let mut location = percent_encode_path(&req.path);
    if !location.ends_with('/') {
        location.push('/');
    }
    if let Some(q) = &req.query {
        location.push('?');
        location.push_str(q);
    }
    short_text(Status::MOVED_PERMANENTLY, Some(req), Some(&location), ctx)
}

/// A response whose body is its status line as text (`404 Not Found`), with a `Location`
/// when given; no body for HEAD or a status without one.
fn short_text(
    status: Status,
    req: Option<&Request>,
    location: Option<&str>,
    ctx: &ResponseContext<'_>,
) -> Response {
    let keep_alive = req.is_some_and(|r| r.keep_alive) && ctx.keep_alive_allowed;
    let text = error_text(status);
    let head = ResponseHead {
        status,
        date: ctx.date,
        server: ctx.server,
        content_type: Some(TEXT_PLAIN),
        content_length_bytes: Some(text.len() as u64),
        content_range: None,
        accept_ranges: false,
        etag: None,
        last_modified: None,
        allow: (status == Status::METHOD_NOT_ALLOWED).then_some(ALLOWED_METHODS),
        location,
        connection: connection_header(keep_alive, ctx),
    };
    let mut bytes = Vec::with_capacity(256);
    write_response_head(&head, &mut bytes);
    let is_head = req.is_some_and(|r| r.method == Method::Head);
    let body = if is_head || !status.allows_body() {
        Vec::new()
    } else {
        vec![BodyPiece::Bytes(text.into_bytes())]
    };
    Response {
        status,
        head: bytes,
        body,
        keep_alive,
    }
}

/// Percent-encodes a decoded path for a header: RFC 3986 `pchar` and `/` stay, every other
/// byte (of the UTF-8) becomes `%HH`.
fn percent_encode_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len() + 8);
    for &b in path.as_bytes() {
        let keep = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'/' | b'-'
                    | b'.'
                    | b'_'
                    | b'~'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
                    | b':'
                    | b'@'
            );
        if keep {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The `Connection` field of a response that keeps the connection (with the context's
/// keep-alive timeout) or closes it.
pub fn connection_header(keep_alive: bool, ctx: &ResponseContext<'_>) -> ConnectionHeader {
    if keep_alive {
        ConnectionHeader::KeepAlive {
            timeout_s: ctx.keep_alive_timeout_s,
        }
    } else {
        ConnectionHeader::Close
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::{Limits, Parsed, parse_request};
    use std::time::{Duration, UNIX_EPOCH};

    const MTIME_S: u64 = 784_111_777;

    fn ctx() -> ResponseContext<'static> {
        ResponseContext {
            date: UNIX_EPOCH + Duration::from_secs(MTIME_S + 10),
            server: "penstock",
            keep_alive_allowed: true,
            keep_alive_timeout_s: Some(75),
            ranges_max: 16,
            boundary: "penstock_00000000000000ab",
        }
    }

    fn file(len_bytes: u64) -> FileMeta {
        FileMeta {
            len_bytes,
            mtime: UNIX_EPOCH + Duration::from_secs(MTIME_S),
            generation: None,
        }
    }

    fn req(method: &str, extra: &str) -> Request {
        let s = format!("{method} /v.ts HTTP/1.1\r\nHost: x\r\n{extra}\r\n");
        match parse_request(s.as_bytes(), &Limits::default()) {
            Ok(Parsed::Complete { request, .. }) => request,
            other => panic!("{other:?}"),
        }
    }

    fn head_text(r: &Response) -> String {
        String::from_utf8(r.head.clone()).unwrap()
    }

    fn parse(line: &str) -> Request {
        let s = format!("{line}\r\nHost: x\r\n\r\n");
        match parse_request(s.as_bytes(), &Limits::default()) {
            Ok(Parsed::Complete { request, .. }) => request,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_directory_without_its_slash_is_redirected_with_the_query_kept() {
        let r = respond_redirect_to_directory(&parse("GET /media?x=1&y=%20 HTTP/1.1"), &ctx());
        assert_eq!(r.status, Status::MOVED_PERMANENTLY);
        let h = head_text(&r);
        assert!(h.starts_with("HTTP/1.1 301 Moved Permanently\r\n"), "{h}");
        assert!(h.contains("\r\nLocation: /media/?x=1&y=%20\r\n"), "{h}");
        assert_eq!(content_length(&r), Some(r.body_len_bytes()));
        // Decoded characters go out encoded again; a fragment is not part of the target.
        let r = respond_redirect_to_directory(&parse("GET /a%20b/%C3%A9#frag HTTP/1.1"), &ctx());
        assert!(head_text(&r).contains("\r\nLocation: /a%20b/%C3%A9/\r\n"));
        // HEAD: no body; the dot segments are gone.
        let r = respond_redirect_to_directory(&parse("HEAD /a/./b/../c HTTP/1.1"), &ctx());
        assert!(head_text(&r).contains("\r\nLocation: /a/c/\r\n"));
        assert!(r.body.is_empty());
    }

    /// The Content-Length header of a head, parsed back with httparse.
    fn content_length(r: &Response) -> Option<u64> {
        let mut hs = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut hs);
        assert!(resp.parse(&r.head).unwrap().is_complete());
        resp.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("content-length"))
            .map(|h| std::str::from_utf8(h.value).unwrap().parse().unwrap())
    }

    #[test]
    fn full_file_200() {
        let r = respond_file(&req("GET", ""), &file(1000), "video/mp2t", &ctx());
        assert_eq!(r.status, Status::OK);
        assert_eq!(
            r.body,
            vec![BodyPiece::File {
                offset_bytes: 0,
                len_bytes: 1000
            }]
        );
        assert_eq!(content_length(&r), Some(1000));
        let h = head_text(&r);
        assert!(
            h.starts_with(
                "HTTP/1.1 200 OK\r\nServer: penstock\r\nDate: Sun, 06 Nov 1994 08:49:47 GMT\r\n"
            ),
            "{h}"
        );
        assert!(h.contains("\r\nContent-Type: video/mp2t\r\n"));
        assert!(h.contains("\r\nLast-Modified: Sun, 06 Nov 1994 08:49:37 GMT\r\n"));
        assert!(h.contains(&format!(
            "\r\nETag: {}\r\n",
            ETag::for_file(1000, file(1000).mtime)
        )));
        assert!(h.contains("\r\nAccept-Ranges: bytes\r\n"));
        assert!(h.ends_with("\r\nConnection: keep-alive\r\nKeep-Alive: timeout=75\r\n\r\n"));
        assert!(r.keep_alive);
    }

    #[test]
    fn head_has_gets_head_and_no_body() {
        for extra in [
            "",
            "Range: bytes=0-9\r\n",
            "Range: bytes=0-1,5-6\r\n",
            "Range: bytes=5000-\r\n",
        ] {
            let get = respond_file(&req("GET", extra), &file(1000), "video/mp2t", &ctx());
            let head = respond_file(&req("HEAD", extra), &file(1000), "video/mp2t", &ctx());
            assert_eq!(get.head, head.head, "{extra}");
            assert!(head.body.is_empty());
            assert_eq!(content_length(&get), Some(get.body_len_bytes()));
        }
    }

    #[test]
    fn single_range_206() {
        let r = respond_file(
            &req("GET", "Range: bytes=-100\r\n"),
            &file(1000),
            "video/mp4",
            &ctx(),
        );
        assert_eq!(r.status, Status::PARTIAL_CONTENT);
        assert_eq!(
            r.body,
            vec![BodyPiece::File {
                offset_bytes: 900,
                len_bytes: 100
            }]
        );
        assert!(head_text(&r).contains("\r\nContent-Range: bytes 900-999/1000\r\n"));
        assert_eq!(content_length(&r), Some(100));
    }

    #[test]
    fn unsatisfiable_416() {
        let r = respond_file(
            &req("GET", "Range: bytes=1000-\r\n"),
            &file(1000),
            "video/mp4",
            &ctx(),
        );
        assert_eq!(r.status, Status::RANGE_NOT_SATISFIABLE);
        assert!(head_text(&r).contains("\r\nContent-Range: bytes */1000\r\n"));
        assert_eq!(content_length(&r), Some(r.body_len_bytes()));
        assert!(r.keep_alive);
        let r = respond_file(
            &req("GET", "Range: bytes=0-\r\n"),
            &file(0),
            "video/mp4",
            &ctx(),
        );
        assert_eq!(r.status.code(), 416);
        assert!(head_text(&r).contains("\r\nContent-Range: bytes */0\r\n"));
    }

    #[test]
    fn malformed_range_serves_200() {
        let r = respond_file(
            &req("GET", "Range: bytes=9-1\r\n"),
            &file(1000),
            "video/mp4",
            &ctx(),
        );
        assert_eq!(r.status, Status::OK);
        assert_eq!(r.body_len_bytes(), 1000);
    }

    #[test]
    fn empty_file_200_has_no_pieces() {
        let r = respond_file(&req("GET", ""), &file(0), "text/plain", &ctx());
        assert_eq!(
            (r.status, r.body.len(), content_length(&r)),
            (Status::OK, 0, Some(0))
        );
    }

    #[test]
    fn multipart_206_exact_length() {
        let r = respond_file(
            &req("GET", "Range: bytes=0-9,20-29,-5\r\n"),
            &file(1000),
            "video/mp2t",
            &ctx(),
        );
        assert_eq!(r.status, Status::PARTIAL_CONTENT);
        let h = head_text(&r);
        assert!(h.contains(
            "\r\nContent-Type: multipart/byteranges; boundary=penstock_00000000000000ab\r\n"
        ));
        assert!(!h.contains("Content-Range"));
        assert_eq!(content_length(&r), Some(r.body_len_bytes()));
        // Render the body against a fake file and check it byte for byte.
        let data: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
        let mut body = Vec::new();
        for p in &r.body {
            match p {
                BodyPiece::Bytes(b) => body.extend_from_slice(b),
                BodyPiece::File {
                    offset_bytes,
                    len_bytes,
                } => {
                    body.extend_from_slice(&data[*offset_bytes as usize..][..*len_bytes as usize]);
                }
            }
        }
        let b = "penstock_00000000000000ab";
        let mut expected = Vec::new();
        for (s, e) in [(0usize, 9usize), (20, 29), (995, 999)] {
            expected.extend_from_slice(
                format!("\r\n--{b}\r\nContent-Type: video/mp2t\r\nContent-Range: bytes {s}-{e}/1000\r\n\r\n").as_bytes(),
            );
            expected.extend_from_slice(&data[s..=e]);
        }
        expected.extend_from_slice(format!("\r\n--{b}--\r\n").as_bytes());
        assert_eq!(body, expected);
    }

    #[test]
    fn multipart_plan_lengths_add_up() {
        let rs = [
            ByteRange {
                start: 0,
                end_inclusive: 0,
            },
            ByteRange {
                start: 5,
                end_inclusive: 99,
            },
        ];
        let plan = multipart_plan(&rs, 100, "application/octet-stream", &boundary_for(7));
        let sum: u64 = plan.pieces.iter().map(BodyPiece::len_bytes).sum();
        assert_eq!(sum, plan.content_length_bytes);
        assert_eq!(plan.pieces.len(), 5);
    }

    #[test]
    fn not_modified_304() {
        let etag = ETag::for_file(1000, file(1000).mtime);
        let r = respond_file(
            &req("GET", &format!("If-None-Match: {etag}\r\n")),
            &file(1000),
            "video/mp4",
            &ctx(),
        );
        assert_eq!(r.status, Status::NOT_MODIFIED);
        assert!(r.body.is_empty());
        let h = head_text(&r);
        assert!(!h.contains("Content-Length") && !h.contains("Content-Type"));
        assert!(h.contains(&format!("\r\nETag: {etag}\r\n")));
        // 304 wins over Range.
        let r = respond_file(
            &req(
                "GET",
                "If-Modified-Since: Sun, 06 Nov 1994 08:49:37 GMT\r\nRange: bytes=0-1\r\n",
            ),
            &file(1000),
            "video/mp4",
            &ctx(),
        );
        assert_eq!(r.status, Status::NOT_MODIFIED);
    }

    #[test]
    fn if_range_mismatch_sends_everything() {
        let r = respond_file(
            &req("GET", "Range: bytes=0-1\r\nIf-Range: \"stale\"\r\n"),
            &file(1000),
            "video/mp4",
            &ctx(),
        );
        assert_eq!((r.status, r.body_len_bytes()), (Status::OK, 1000));
        let etag = ETag::for_file(1000, file(1000).mtime);
        let r = respond_file(
            &req("GET", &format!("Range: bytes=0-1\r\nIf-Range: {etag}\r\n")),
            &file(1000),
            "video/mp4",
            &ctx(),
        );
        assert_eq!((r.status, r.body_len_bytes()), (Status::PARTIAL_CONTENT, 2));
    }

    #[test]
    fn connection_close_rules() {
        let r = respond_file(
            &req("GET", "Connection: close\r\n"),
            &file(10),
            "text/plain",
            &ctx(),
        );
        assert!(!r.keep_alive);
        assert!(head_text(&r).ends_with("\r\nConnection: close\r\n\r\n"));
        let c = ResponseContext {
            keep_alive_allowed: false,
            ..ctx()
        };
        assert!(!respond_file(&req("GET", ""), &file(10), "text/plain", &c).keep_alive);
    }

    #[test]
    fn errors() {
        let r = respond_error(Status::METHOD_NOT_ALLOWED, None, &ctx());
        let h = head_text(&r);
        assert!(h.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"));
        assert!(h.contains("\r\nAllow: GET, HEAD\r\n"));
        assert!(h.contains("\r\nConnection: close\r\n"));
        assert!(!r.keep_alive);
        assert_eq!(content_length(&r), Some(r.body_len_bytes()));
        assert_eq!(
            r.body,
            vec![BodyPiece::Bytes(b"405 Method Not Allowed\n".to_vec())]
        );
        // A 404 for a parsed keep-alive request keeps the connection; HEAD gets no body.
        let r = respond_error(Status::NOT_FOUND, Some(&req("HEAD", "")), &ctx());
        assert!(r.keep_alive && r.body.is_empty());
        assert_eq!(content_length(&r), Some(14));
    }

    #[test]
    fn header_values_cannot_split_the_head() {
        let c = ResponseContext {
            server: "evil\r\nSet-Cookie: x",
            ..ctx()
        };
        let r = respond_error(Status::NOT_FOUND, None, &c);
        assert!(head_text(&r).contains("\r\nServer: evilSet-Cookie: x\r\n"));
    }
}
