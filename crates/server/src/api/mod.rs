//! The operator's HTTP JSON API and dashboard (`[api] listen`, `penstock serve --api ADDR`;
//! docs/api.md).
//!
//! One listener of its own, off unless set. Routes under `/api/v1/` answer JSON; callers
//! authenticate with the control token as a Bearer token (compared in constant time, the
//! control server's [`token_matches`](crate::control::token_matches)); a browser request whose
//! `Origin` is not this listener's own is refused (403) before anything else, so that no
//! other page can drive the server (no CSRF). The dashboard's static files (`/`, `/app.js`,
//! `/app.css`) are embedded in the binary and carry no data; every figure they show comes
//! from the authenticated routes.
//!
//! **One implementation underneath**: each route that acts writes the control protocol's
//! command from the JSON body (values checked to be single words first), runs it through
//! [`crate::control::handle_line`] as an authenticated caller, and turns the typed
//! [`Reply`] into JSON with the reply's own code and text: the same checks, limits and
//! refusals as the control protocol, word for word.
//!
//! Limits: `connections_max` connections (more: 503 and closed), `request_bytes_max` per
//! request (head and body), `sse_max` event streams (more: 503), `idle_timeout_ms` between
//! requests and per read or write. A connection is a thread, as on the control port: the
//! API's callers are few (operators, a dashboard or two).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use penstock_driver::Engine;

use crate::config::{ApiConfig, VolumesConfig};
use crate::control::ControlShared;

mod events;
pub mod routes;

/// How often the accepting thread looks at its stop flag.
const TICK: Duration = Duration::from_millis(100);
/// Events queued for one event-stream reader; a reader further behind is cut off.
const SSE_QUEUE: usize = 64;
/// An event stream with nothing to say writes a comment this often (proxies, dead peers).
const SSE_KEEPALIVE: Duration = Duration::from_secs(15);
/// Requests one connection may make before it is closed.
const REQUESTS_PER_CONNECTION_MAX: u32 = 1000;

/// Ends a session by id; false: no such session.
pub type Kick = Box<dyn Fn(&str) -> bool + Send + Sync>;

/// What the API reaches: the control server (the same code the protocol runs), the engine
/// (disk queues), the RTSP and HLS session tables (list, kick), the volumes and the
/// recordings' directories.
pub struct ApiDeps {
    pub control: Arc<ControlShared>,
    pub engine: Arc<Engine>,
    /// Ends an RTSP session by id (`None`: no RTSP server).
    pub rtsp_kick: Option<Kick>,
    /// Ends an HLS viewer session by id.
    pub hls_kick: Kick,
    pub volumes: VolumesConfig,
    /// `[control] write_roots`: where recordings are written.
    pub write_roots: Vec<PathBuf>,
    /// The workers' CPU scheduling policies in a phrase.
    pub workers: String,
    /// The viewers' access rules: a JWT with `"admin": true` is taken as the token is.
    pub(crate) viewers: Arc<crate::auth::Viewers>,
}

/// The API's shared state.
pub(crate) struct Api {
    cfg: ApiConfig,
    deps: ApiDeps,
    tls: Option<Arc<crate::tls::Tls>>,
    /// `http://127.0.0.1:9997`: the listener's own origin.
    origin: String,
    stop: AtomicBool,
    conns: AtomicUsize,
    sse: AtomicUsize,
    subscribers: Mutex<Vec<SyncSender<Arc<str>>>>,
    events: Mutex<events::Tracker>,
}

/// The running API listener; stops when dropped.
pub struct ApiServer {
    addr: SocketAddr,
    tls: bool,
    api: Arc<Api>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("addr", &self.addr)
            .field("tls", &self.tls)
            .finish()
    }
}

impl ApiServer {
    /// Serves `listener` (bound by the caller, so that a bind error is the start's) until
    /// dropped; TLS with `tls` when given.
    pub(crate) fn start(
        cfg: &ApiConfig,
        listener: TcpListener,
        tls: Option<Arc<crate::tls::Tls>>,
        deps: ApiDeps,
    ) -> io::Result<ApiServer> {
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let is_tls = tls.is_some();
        let origin = format!("{}://{addr}", if is_tls { "https" } else { "http" });
        let api = Arc::new(Api {
            cfg: cfg.clone(),
            deps,
            tls,
            origin,
            stop: AtomicBool::new(false),
            conns: AtomicUsize::new(0),
            sse: AtomicUsize::new(0),
            subscribers: Mutex::new(Vec::new()),
            events: Mutex::new(events::Tracker::default()),
        });
        let mut threads = Vec::new();
        let a = api.clone();
        threads.push(
            std::thread::Builder::new()
                .name("penstock-api".into())
                .spawn(move || accept_loop(&a, &listener))?,
        );
        let a = api.clone();
        threads.push(
            std::thread::Builder::new()
                .name("penstock-api-events".into())
                .spawn(move || events::run(&a))?,
        );
        Ok(ApiServer {
            addr,
            tls: is_tls,
            api,
            threads,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR/` or `https://ADDR/`.
    pub fn url(&self) -> String {
        format!("{}/", self.api.origin)
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.api.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn accept_loop(api: &Arc<Api>, listener: &TcpListener) {
    use rustix::event::{PollFd, PollFlags, poll};
    let tick = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: TICK.as_nanos() as i64,
    };
    while !api.stop.load(Ordering::Acquire) {
        let mut fds = [PollFd::new(listener, PollFlags::IN)];
        match poll(&mut fds, Some(&tick)) {
            Ok(0) | Err(rustix::io::Errno::INTR) => continue,
            Ok(_) => {}
            Err(e) => {
                tracing::error!(error = %e, "api listener: poll failed; it stops");
                return;
            }
        }
        let (s, peer) = match listener.accept() {
            Ok(x) => x,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                crate::peer_warn!("api_accept_failed", error = %e, "api listener: accept failed");
                std::thread::sleep(TICK);
                continue;
            }
        };
        let _ = s.set_nonblocking(false);
        let _ = s.set_nodelay(true);
        if api.conns.fetch_add(1, Ordering::AcqRel) >= api.cfg.connections_max {
            api.conns.fetch_sub(1, Ordering::AcqRel);
            // Plain text even on a TLS listener would be garbage: just close there.
            if api.tls.is_none() {
                let mut s = s;
                let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
                let _ = s.write_all(
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 52\r\nConnection: close\r\n\r\n{\"error\":\"api connections_max reached: try again\"}\r\n",
                );
            }
            continue;
        }
        let a = api.clone();
        let spawned = std::thread::Builder::new()
            .name("penstock-api-conn".into())
            .spawn(move || {
                let r = serve_connection(&a, s, peer);
                a.conns.fetch_sub(1, Ordering::AcqRel);
                if let Err(e) = r {
                    tracing::debug!(error = %e, %peer, "api connection");
                }
            });
        if spawned.is_err() {
            api.conns.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// A connection's transport.
enum Conn {
    Tcp(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ServerConnection, TcpStream>>),
}

impl Conn {
    fn tcp(&self) -> &TcpStream {
        match self {
            Conn::Tcp(s) => s,
            Conn::Tls(s) => &s.sock,
        }
    }
}

impl Read for Conn {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.read(b),
            Conn::Tls(s) => s.read(b),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.write(b),
            Conn::Tls(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Conn::Tcp(s) => s.flush(),
            Conn::Tls(s) => s.flush(),
        }
    }
}

/// One request, parsed.
pub(crate) struct Request {
    pub(crate) method: String,
    /// The path without its query.
    pub(crate) path: String,
    pub(crate) query: String,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
    pub(crate) peer: SocketAddr,
}

impl Request {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// `name=value` from the query (`now=1`).
    pub(crate) fn query_value(&self, name: &str) -> Option<&str> {
        self.query
            .split('&')
            .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v)
    }
}

/// An answer: a whole body, or the start of an event stream.
pub(crate) enum Response {
    Body {
        status: u16,
        content_type: &'static str,
        body: Vec<u8>,
        /// Extra header lines, each ending in CRLF.
        extra: String,
    },
    Events,
}

impl Response {
    pub(crate) fn json(status: u16, v: &serde_json::Value) -> Response {
        let mut body = serde_json::to_vec_pretty(v).unwrap_or_default();
        body.push(b'\n');
        Response::Body {
            status,
            content_type: "application/json",
            body,
            extra: String::new(),
        }
    }

    pub(crate) fn error(status: u16, text: impl Into<String>) -> Response {
        Response::json(status, &serde_json::json!({ "error": text.into() }))
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        414 => "URI Too Long",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

/// What reading one request gave.
enum Read1 {
    Request(Request, bool),
    /// The peer closed (or went silent) between requests.
    Closed,
    /// A bad request: answer this and close.
    Bad(u16, String),
}

fn serve_connection(api: &Arc<Api>, s: TcpStream, peer: SocketAddr) -> io::Result<()> {
    let idle = Duration::from_millis(api.cfg.idle_timeout_ms);
    s.set_read_timeout(Some(idle))?;
    s.set_write_timeout(Some(idle))?;
    let mut conn = match &api.tls {
        None => Conn::Tcp(s),
        Some(t) => {
            let session = t.accept().map_err(io::Error::other)?;
            // The handshake runs at the first read, under the read timeout.
            Conn::Tls(Box::new(rustls::StreamOwned::new(session, s)))
        }
    };
    let mut buf: Vec<u8> = Vec::new();
    for _ in 0..REQUESTS_PER_CONNECTION_MAX {
        if api.stop.load(Ordering::Acquire) {
            break;
        }
        let (req, keep) = match read_request(api, &mut conn, &mut buf, peer)? {
            Read1::Closed => return Ok(()),
            Read1::Bad(status, text) => {
                write_response(&mut conn, Response::error(status, text), false)?;
                linger(&mut conn, api.cfg.request_bytes_max);
                return Ok(());
            }
            Read1::Request(r, keep) => (r, keep),
        };
        let resp = routes::dispatch(api, &req);
        match resp {
            Response::Events => return events::serve(api, conn),
            r => write_response(&mut conn, r, keep)?,
        }
        if !keep {
            break;
        }
    }
    Ok(())
}

/// After refusing a request whose rest is still coming: stop writing, then read and drop
/// up to `bytes_max` more for at most a second, so that the peer reads the answer instead of
/// a reset (a close with unread data sends RST).
fn linger(conn: &mut Conn, bytes_max: usize) {
    let _ = conn.tcp().shutdown(std::net::Shutdown::Write);
    let _ = conn
        .tcp()
        .set_read_timeout(Some(Duration::from_millis(200)));
    let t0 = Instant::now();
    let mut left = bytes_max;
    let mut b = [0u8; 4096];
    while left > 0 && t0.elapsed() < Duration::from_secs(1) {
        match conn.tcp().read(&mut b) {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

fn read_request(
    api: &Api,
    conn: &mut Conn,
    buf: &mut Vec<u8>,
    peer: SocketAddr,
) -> io::Result<Read1> {
    let max = api.cfg.request_bytes_max;
    let mut chunk = [0u8; 4096];
    let started = Instant::now();
    let idle = Duration::from_millis(api.cfg.idle_timeout_ms);
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut r = httparse::Request::new(&mut headers);
        match r.parse(buf) {
            Ok(httparse::Status::Complete(head_len)) => {
                let method = r.method.unwrap_or("").to_string();
                let target = r.path.unwrap_or("").to_string();
                let version = r.version.unwrap_or(1);
                let headers: Vec<(String, String)> = r
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_string(),
                            String::from_utf8_lossy(h.value).trim().to_string(),
                        )
                    })
                    .collect();
                let find = |n: &str| {
                    headers
                        .iter()
                        .find(|(k, _)| k.eq_ignore_ascii_case(n))
                        .map(|(_, v)| v.clone())
                };
                if find("transfer-encoding").is_some() {
                    return Ok(Read1::Bad(
                        411,
                        "a body needs Content-Length (no chunked bodies here)".into(),
                    ));
                }
                let len: usize = match find("content-length") {
                    None => 0,
                    Some(v) => match v.parse() {
                        Ok(n) => n,
                        Err(_) => return Ok(Read1::Bad(400, format!("Content-Length {v:?}"))),
                    },
                };
                if head_len + len > max {
                    return Ok(Read1::Bad(
                        413,
                        format!("a request is at most {max} bytes (api.request_bytes_max)"),
                    ));
                }
                while buf.len() < head_len + len {
                    if started.elapsed() > idle {
                        return Ok(Read1::Bad(400, "the body came too slowly".into()));
                    }
                    let n = conn.read(&mut chunk)?;
                    if n == 0 {
                        return Ok(Read1::Closed);
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                let body = buf[head_len..head_len + len].to_vec();
                buf.drain(..head_len + len);
                let close = find("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
                let keep = !close && version == 1;
                let (path, query) = match target.split_once('?') {
                    Some((p, q)) => (p.to_string(), q.to_string()),
                    None => (target, String::new()),
                };
                return Ok(Read1::Request(
                    Request {
                        method,
                        path,
                        query,
                        headers,
                        body,
                        peer,
                    },
                    keep,
                ));
            }
            Ok(httparse::Status::Partial) => {
                if buf.len() >= max {
                    return Ok(Read1::Bad(
                        431,
                        format!("a request head is at most {max} bytes (api.request_bytes_max)"),
                    ));
                }
            }
            Err(e) => return Ok(Read1::Bad(400, format!("bad request: {e}"))),
        }
        if !buf.is_empty() && started.elapsed() > idle {
            return Ok(Read1::Bad(400, "the request came too slowly".into()));
        }
        let n = match conn.read(&mut chunk) {
            Ok(n) => n,
            Err(e)
                if buf.is_empty()
                    && matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::ConnectionReset
                    ) =>
            {
                return Ok(Read1::Closed);
            }
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Ok(Read1::Closed);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn write_response(conn: &mut Conn, r: Response, keep: bool) -> io::Result<()> {
    let Response::Body {
        status,
        content_type,
        body,
        extra,
    } = r
    else {
        return Ok(());
    };
    let head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n\
         Content-Security-Policy: default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'\r\n\
         Referrer-Policy: no-referrer\r\n{extra}{}\r\n",
        reason(status),
        body.len(),
        if keep { "" } else { "Connection: close\r\n" }
    );
    let mut out = head.into_bytes();
    out.extend_from_slice(&body);
    conn.write_all(&out)?;
    conn.flush()
}

impl Api {
    /// Adds an event-stream reader, within `sse_max`.
    fn subscribe(&self) -> Option<Receiver<Arc<str>>> {
        if self.sse.fetch_add(1, Ordering::AcqRel) >= self.cfg.sse_max {
            self.sse.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        let (tx, rx) = sync_channel(SSE_QUEUE);
        self.subscribers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(tx);
        Some(rx)
    }

    fn has_subscribers(&self) -> bool {
        !self
            .subscribers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// Sends `event` to every reader; a reader whose queue is full (not reading) is cut off.
    fn publish(&self, event: Arc<str>) {
        self.subscribers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|tx| match tx.try_send(event.clone()) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => false,
            });
    }
}

/// Waits for the next event of `rx`, at most `d`.
fn next_event(rx: &Receiver<Arc<str>>, d: Duration) -> Result<Arc<str>, RecvTimeoutError> {
    rx.recv_timeout(d)
}
