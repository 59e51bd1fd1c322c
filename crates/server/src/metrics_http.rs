//! A small listener that serves one thing, `GET /metrics` (and `HEAD`), for
//! `penstock stream --metrics ADDR`, `penstock record --metrics ADDR` and the server's
//! `[http] metrics_listen`.
//!
//! Kept small and confined: one thread, one connection at a time, `Connection: close`; a
//! connection gets [`CONNECTION_TIME_MAX`] in all to send a head of at most
//! [`HEAD_BYTES_MAX`] and read the answer, then it is closed; any other path is a 404, any
//! other method a 405 (the core's parser). Scrapes are rare (every few seconds) and small:
//! a slow scraper delays the next one by at most that time, and holds nothing else.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use penstock_core::http::{Method, Parsed, parse_request};

use crate::access_log::header_value;
use crate::metrics::{Format, MetricsPage};

/// A request head larger than this is refused (431).
pub const HEAD_BYTES_MAX: usize = 8 * 1024;
/// A connection's whole life: its head, the page, the close.
pub const CONNECTION_TIME_MAX: Duration = Duration::from_secs(5);
/// How often the accepting thread looks at its stop flag.
const TICK: Duration = Duration::from_millis(100);

/// The running listener; stops when dropped.
pub struct MetricsListener {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for MetricsListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsListener")
            .field("addr", &self.addr)
            .finish()
    }
}

impl MetricsListener {
    /// Binds `addr` (port 0: the kernel chooses; see [`MetricsListener::local_addr`]) and
    /// serves `page` until dropped.
    pub fn start(addr: SocketAddr, page: Arc<dyn MetricsPage>) -> io::Result<MetricsListener> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("penstock-metrics".into())
            .spawn(move || accept_loop(&listener, &*page, &flag))?;
        Ok(MetricsListener {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            // Within a tick, or a connection's time if one is being served.
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, page: &dyn MetricsPage, stop: &AtomicBool) {
    use rustix::event::{PollFd, PollFlags, poll};
    let tick = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: TICK.as_nanos() as i64,
    };
    while !stop.load(Ordering::Acquire) {
        let mut fds = [PollFd::new(listener, PollFlags::IN)];
        match poll(&mut fds, Some(&tick)) {
            Ok(0) | Err(rustix::io::Errno::INTR) => continue,
            Ok(_) => {}
            Err(e) => {
                tracing::error!(error = %e, "metrics listener: poll failed; it stops");
                return;
            }
        }
        match listener.accept() {
            Ok((s, _)) => {
                if let Err(e) = serve(s, page) {
                    tracing::debug!(error = %e, "metrics connection");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => {
                // Out of descriptors and the like: do not spin on a readable listener.
                crate::peer_warn!("metrics_accept_failed", error = %e, "metrics listener: accept failed");
                std::thread::sleep(TICK);
            }
        }
    }
}

fn serve(mut s: TcpStream, page: &dyn MetricsPage) -> io::Result<()> {
    let deadline = Instant::now() + CONNECTION_TIME_MAX;
    s.set_nonblocking(false)?;
    let _ = s.set_nodelay(true);
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let limits = penstock_core::http::Limits {
        header_bytes_max: HEAD_BYTES_MAX,
        request_line_bytes_max: HEAD_BYTES_MAX,
        ..penstock_core::http::Limits::default()
    };
    let answer = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        s.set_read_timeout(Some(left))?;
        let n = match s.read(&mut chunk) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        buf.extend_from_slice(&chunk[..n]);
        match parse_request(&buf, &limits) {
            Ok(Parsed::Partial) => continue,
            Ok(Parsed::Complete {
                request,
                consumed_bytes,
            }) => {
                if request.path != "/metrics" {
                    break Answer::empty("404 Not Found");
                }
                let format = Format::from_accept(header_value(&buf[..consumed_bytes], b"accept"));
                let text = page.render(format);
                break Answer {
                    status: "200 OK",
                    content_type: format.content_type(),
                    len: text.len(),
                    body: if request.method == Method::Get {
                        text
                    } else {
                        String::new()
                    },
                };
            }
            Err(e) => {
                break Answer::empty(match e.status().code() {
                    405 => "405 Method Not Allowed",
                    414 | 431 => "431 Request Header Fields Too Large",
                    _ => "400 Bad Request",
                });
            }
        }
    };
    let allow = if answer.status.starts_with("405") {
        "Allow: GET, HEAD\r\n"
    } else {
        ""
    };
    let head = format!(
        "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
        answer.status, answer.content_type, answer.len
    );
    s.set_write_timeout(Some(
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1)),
    ))?;
    s.write_all(head.as_bytes())?;
    s.write_all(answer.body.as_bytes())?;
    s.flush()
}

struct Answer {
    status: &'static str,
    content_type: &'static str,
    /// The page's length (also for HEAD, which gets no body).
    len: usize,
    body: String,
}

impl Answer {
    fn empty(status: &'static str) -> Answer {
        Answer {
            status,
            content_type: "text/plain; charset=utf-8",
            len: 0,
            body: String::new(),
        }
    }
}
