//! HTTP/1.1 for a file server whose bodies never pass through this crate.
//!
//! The driver reads bytes from a socket into a buffer and calls [`parse_request`]; it gets
//! back a [`Request`] and how many bytes it used (several requests may sit in one buffer:
//! pipelining), or [`Parsed::Partial`] (read more), or an [`HttpError`] that names the status
//! to answer with before closing the connection. It then opens the file (confined to the
//! root, which is the driver's job) and calls [`respond_file`] with the file's metadata: the
//! result is the response head as bytes plus a body plan of [`BodyPiece`]s — bytes from
//! memory and `(offset, len)` extents of the file — that the driver sends with sendfile or
//! io_uring. The body itself never enters this crate.
//!
//! What is absent: no socket, no file, no clock. The `Date` header's time is passed in.
//!
//! Policy decisions made here (each documented where it is made):
//! - every [`HttpError`] ends the connection (`Connection: close`): after a malformed or
//!   refused request the framing of what follows cannot be trusted;
//! - a `..` that would climb above the root is refused with 403 ([`HttpError::PathEscape`]);
//! - a GET/HEAD carrying a body (`Content-Length` > 0 or any `Transfer-Encoding`) is refused
//!   with 413 ([`HttpError::BodyNotAllowed`]): we never read request bodies, and skipping one
//!   we did not parse would let its bytes be read as the next request (request smuggling);
//! - more ranges than [`Limits::ranges_max`] are ignored and the whole file is sent with 200
//!   (nginx's `max_ranges` behaves the same);
//! - multiple ranges are answered with `multipart/byteranges`, after sorting and coalescing
//!   overlapping or adjacent ranges (RFC 9110 §14.2 permits it).

mod conditional;
mod date;
mod mime;
mod range;
mod request;
mod response;

pub use conditional::{ETag, Precondition, evaluate_preconditions, if_range_allows};
pub use date::{format_http_date, parse_http_date};
pub use mime::{content_type_for_path, extension_of, is_valid_media_type};
pub use range::{ByteRange, RangeSet, parse_range};
pub use request::{Method, Parsed, Request, Version, normalize_path, parse_request};
pub use response::{
    BodyPiece, ConnectionHeader, ContentRange, FileMeta, MultipartPlan, Response, ResponseContext,
    ResponseHead, boundary_for, connection_header, multipart_plan, respond_error, respond_file,
    respond_redirect_to_directory, write_response_head,
};

/// Bounds on what a client may make us hold or compute. Checked on every parse; each
/// overflow maps to a status code (see [`HttpError::status`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// The request line (`GET /path HTTP/1.1`) including its CRLF. Beyond: 414.
    pub request_line_bytes_max: usize,
    /// The whole head: request line, headers and the empty line. Beyond: 431.
    pub header_bytes_max: usize,
    /// Number of header fields. Beyond: 431.
    pub headers_max: usize,
    /// Ranges in one `Range` header before we give up and send the whole file (200).
    pub ranges_max: usize,
}

impl Default for Limits {
    /// nginx-like defaults: an 8 KiB head (nginx's `large_client_header_buffers` is 8k),
    /// 100 headers (hyper's default), 16 ranges.
    fn default() -> Limits {
        Limits {
            request_line_bytes_max: 8 * 1024,
            header_bytes_max: 8 * 1024,
            headers_max: 100,
            ranges_max: 16,
        }
    }
}

/// An HTTP status code. A newtype rather than a bare `u16` so that a status cannot be mixed
/// up with a length or a count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Status(u16);

impl Status {
    pub const OK: Status = Status(200);
    /// A CORS preflight's answer.
    pub const NO_CONTENT: Status = Status(204);
    pub const PARTIAL_CONTENT: Status = Status(206);
    pub const MOVED_PERMANENTLY: Status = Status(301);
    pub const NOT_MODIFIED: Status = Status(304);
    pub const BAD_REQUEST: Status = Status(400);
    /// A location that requires a credential, asked without one (docs/security.md).
    pub const UNAUTHORIZED: Status = Status(401);
    pub const FORBIDDEN: Status = Status(403);
    pub const NOT_FOUND: Status = Status(404);
    pub const METHOD_NOT_ALLOWED: Status = Status(405);
    pub const REQUEST_TIMEOUT: Status = Status(408);
    /// The path exists but cannot answer in its state (a live relay that does not record has
    /// no HLS playlist).
    pub const CONFLICT: Status = Status(409);
    pub const PRECONDITION_FAILED: Status = Status(412);
    pub const CONTENT_TOO_LARGE: Status = Status(413);
    pub const URI_TOO_LONG: Status = Status(414);
    pub const UNSUPPORTED_MEDIA_TYPE: Status = Status(415);
    pub const RANGE_NOT_SATISFIABLE: Status = Status(416);
    /// A viewer's token holds its `sessions` cap already (docs/security.md).
    pub const TOO_MANY_REQUESTS: Status = Status(429);
    pub const REQUEST_HEADER_FIELDS_TOO_LARGE: Status = Status(431);
    pub const INTERNAL_SERVER_ERROR: Status = Status(500);
    pub const NOT_IMPLEMENTED: Status = Status(501);
    /// The origin failed or answered nonsense (docs/origin.md).
    pub const BAD_GATEWAY: Status = Status(502);
    pub const SERVICE_UNAVAILABLE: Status = Status(503);
    /// The origin did not answer in time (docs/origin.md).
    pub const GATEWAY_TIMEOUT: Status = Status(504);
    pub const HTTP_VERSION_NOT_SUPPORTED: Status = Status(505);

    /// A status from its number; `None` outside 100..=599.
    pub const fn from_code(code: u16) -> Option<Status> {
        if code >= 100 && code <= 599 {
            Some(Status(code))
        } else {
            None
        }
    }

    /// The three-digit number.
    pub const fn code(self) -> u16 {
        self.0
    }

    /// The reason phrase of RFC 9110 §15 (empty for codes we never send).
    pub const fn reason(self) -> &'static str {
        match self.0 {
            200 => "OK",
            204 => "No Content",
            206 => "Partial Content",
            301 => "Moved Permanently",
            304 => "Not Modified",
            400 => "Bad Request",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "Not Found",
            405 => "Method Not Allowed",
            408 => "Request Timeout",
            409 => "Conflict",
            412 => "Precondition Failed",
            413 => "Content Too Large",
            414 => "URI Too Long",
            415 => "Unsupported Media Type",
            416 => "Range Not Satisfiable",
            429 => "Too Many Requests",
            431 => "Request Header Fields Too Large",
            500 => "Internal Server Error",
            501 => "Not Implemented",
            502 => "Bad Gateway",
            503 => "Service Unavailable",
            504 => "Gateway Timeout",
            505 => "HTTP Version Not Supported",
            _ => "",
        }
    }

    /// 1xx, 204 and 304 responses never carry a body (RFC 9110 §6.4.1), so they get no
    /// `Content-Length` either.
    pub const fn allows_body(self) -> bool {
        !(self.0 < 200 || self.0 == 204 || self.0 == 304)
    }
}

/// Why a request was refused. Each variant maps to one status ([`HttpError::status`]); after
/// any of them the server answers and closes the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HttpError {
    /// The request line or a header is not HTTP/1.x syntax (httparse refused it). → 400
    #[error("malformed request: {0}")]
    Malformed(&'static str),
    /// The request line exceeds [`Limits::request_line_bytes_max`]. → 414
    #[error("request line longer than {limit_bytes} bytes")]
    RequestLineTooLong { limit_bytes: usize },
    /// The head exceeds [`Limits::header_bytes_max`]. → 431
    #[error("request head longer than {limit_bytes} bytes")]
    HeadTooLarge { limit_bytes: usize },
    /// More than [`Limits::headers_max`] header fields. → 431
    #[error("more than {limit} header fields")]
    TooManyHeaders { limit: usize },
    /// A version other than HTTP/1.0 or HTTP/1.1. → 505
    #[error("unsupported HTTP version")]
    VersionNotSupported,
    /// A method we know but do not allow on static files (POST, PUT, ...). → 405 with
    /// `Allow: GET, HEAD`
    #[error("method {0} not allowed")]
    MethodNotAllowed(String),
    /// A method token we do not know at all. → 501
    #[error("method {0} not implemented")]
    MethodNotImplemented(String),
    /// HTTP/1.1 without `Host`, or more than one `Host` (RFC 9112 §3.2). → 400
    #[error("missing or repeated Host header")]
    BadHost,
    /// A request target that is not an absolute path (or an absolute URI), or that
    /// percent-decodes to invalid UTF-8, a NUL, or a bad escape. → 400
    #[error("bad request target: {0}")]
    BadTarget(&'static str),
    /// A `..` segment that would climb above the served root. → 403
    #[error("path escapes the root")]
    PathEscape,
    /// A header we need is malformed (e.g. two different `Content-Length`s). → 400
    #[error("bad {name} header")]
    BadHeader { name: &'static str },
    /// A GET or HEAD with a body. → 413 (we never read request bodies)
    #[error("request bodies are not accepted")]
    BodyNotAllowed,
}

impl HttpError {
    /// The status the server answers with.
    pub fn status(&self) -> Status {
        match self {
            HttpError::Malformed(_)
            | HttpError::BadHost
            | HttpError::BadTarget(_)
            | HttpError::BadHeader { .. } => Status::BAD_REQUEST,
            HttpError::RequestLineTooLong { .. } => Status::URI_TOO_LONG,
            HttpError::HeadTooLarge { .. } | HttpError::TooManyHeaders { .. } => {
                Status::REQUEST_HEADER_FIELDS_TOO_LARGE
            }
            HttpError::VersionNotSupported => Status::HTTP_VERSION_NOT_SUPPORTED,
            HttpError::MethodNotAllowed(_) => Status::METHOD_NOT_ALLOWED,
            HttpError::MethodNotImplemented(_) => Status::NOT_IMPLEMENTED,
            HttpError::PathEscape => Status::FORBIDDEN,
            HttpError::BodyNotAllowed => Status::CONTENT_TOO_LARGE,
        }
    }
}
