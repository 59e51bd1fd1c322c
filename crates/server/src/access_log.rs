//! The access log: one line per HTTP request in nginx's combined format, with the request
//! time and the data path appended (and one per RTSP session at its end,
//! [`rtsp_session_line`], in the same form):
//!
//! ```text
//! 127.0.0.1 - - [24/Nov/2026:13:45:01 +0000] "GET /a.ts HTTP/1.1" 200 1048576 "-" "curl/8.5.0" rt=0.004 path=engine-sendfile
//! ```
//!
//! `$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent
//! "$http_referer" "$http_user_agent"`, then `rt=` (nginx's `$request_time`: seconds with
//! millisecond resolution, from the first byte of the request head to the last byte of the
//! response handed to the kernel) and `path=` (how the body moved: `sendfile` from the
//! connection's loop, `engine-<path>`, `memory`, `none`). The user is always `-` (no
//! authentication). Times are UTC (`+0000`): the server reads no time zone database.
//! The request line, referer and user agent are written as received, with `"`, `\`,
//! control bytes and bytes above 0x7e escaped as `\xHH` (as nginx does); an absent header
//! is `-`.
//!
//! # Which requests, and which status
//! Every request the server answers or starts to answer, errors included: 4xx/5xx, a head
//! that does not parse (400, 414, 431, 501, 505: the line as received), the 408 of a head
//! that did not complete in time. A response cut before its end (the client went away, the
//! send timeout, the shutdown deadline) is logged with its status and the body bytes
//! actually sent, as nginx does; if not even the first byte of its head was sent, with
//! nginx's 499 ("client closed request"). Not logged: connections that never sent a byte,
//! and the 503 written at `connections_max` before any request is read.
//!
//! # Off the request path
//! Each HTTP worker formats its lines into its own buffer ([`LogBuffer`]; no lock, no
//! syscall) and hands a full buffer (`access_buffer_bytes`), or one whose first line is
//! `access_flush_ms` old, to one writer thread through a bounded queue
//! (`access_queue_batches`). The writer does the blocking `write`. If the queue is full (the
//! writer is stuck: a full disk, a stdout nobody reads) the worker drops the batch rather
//! than wait, and counts its lines in `penstock_access_log_dropped_lines_total`; lines
//! handed over are counted in `penstock_access_log_lines_total`. `$time_local` is formatted
//! once per second per worker.
//!
//! SIGUSR1 ([`AccessLog::reopen`]) makes the writer open the file's path again (logrotate:
//! rename, then signal); lines still buffered at that moment go to the new file.

use std::fs::File;
use std::io::{self, Write};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::metrics::Metrics;

/// Where the lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessTarget {
    Off,
    Stdout,
    File(PathBuf),
}

impl AccessTarget {
    /// `off`, `stdout`, or a file path (anything else).
    pub fn parse(s: &str) -> AccessTarget {
        match s {
            "off" => AccessTarget::Off,
            "stdout" | "-" => AccessTarget::Stdout,
            p => AccessTarget::File(PathBuf::from(p)),
        }
    }
}

/// The writer's sizes (`[log]` in the configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccessLimits {
    pub buffer_bytes: usize,
    pub flush: Duration,
    pub queue_batches: usize,
}

/// The longest request line written (longer ones are cut there): a 414's line can be as
/// long as the head limit.
const REQUEST_LINE_LOG_BYTES_MAX: usize = 8 * 1024;
/// A referer or user agent is cut at this many bytes.
const FIELD_LOG_BYTES_MAX: usize = 2 * 1024;
/// How often the writer looks for a reopen request while no batch comes.
const WRITER_TICK: Duration = Duration::from_millis(100);
/// At most one warning about failed writes per interval.
const WRITE_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);

enum Msg {
    Batch(Vec<u8>),
    Stop,
}

/// The writer thread and its queue; shared by the HTTP workers.
pub(crate) struct AccessLog {
    tx: SyncSender<Msg>,
    reopen: Arc<AtomicBool>,
    writer: Mutex<Option<JoinHandle<()>>>,
    limits: AccessLimits,
    metrics: Arc<Metrics>,
}

impl AccessLog {
    /// Opens the target (a file: created if missing, appended to) and starts the writer.
    /// `None` for [`AccessTarget::Off`].
    pub(crate) fn start(
        target: &AccessTarget,
        limits: AccessLimits,
        metrics: Arc<Metrics>,
    ) -> io::Result<Option<AccessLog>> {
        let sink = match target {
            AccessTarget::Off => return Ok(None),
            AccessTarget::Stdout => Sink::Stdout,
            AccessTarget::File(p) => Sink::File {
                file: open_append(p)?,
                path: p.clone(),
            },
        };
        let (tx, rx) = std::sync::mpsc::sync_channel(limits.queue_batches.max(1));
        let reopen = Arc::new(AtomicBool::new(false));
        let flag = reopen.clone();
        let m = metrics.clone();
        let writer = std::thread::Builder::new()
            .name("penstock-access-log".into())
            .spawn(move || write_loop(rx, sink, &flag, &m))?;
        Ok(Some(AccessLog {
            tx,
            reopen,
            writer: Mutex::new(Some(writer)),
            limits,
            metrics,
        }))
    }

    /// A worker's buffer.
    pub(crate) fn buffer(&self) -> LogBuffer {
        LogBuffer {
            tx: self.tx.clone(),
            buf: Vec::with_capacity(self.limits.buffer_bytes + 1024),
            lines: 0,
            limits: self.limits,
            flush_at: None,
            clock: TimeCache::default(),
            addr: AddrCache::default(),
            metrics: self.metrics.clone(),
        }
    }

    /// Where single lines go from outside the HTTP workers (an RTSP session's end).
    pub(crate) fn sink(&self) -> LineSink {
        LineSink {
            tx: self.tx.clone(),
            metrics: self.metrics.clone(),
        }
    }

    /// Asks the writer to open the file again (SIGUSR1); nothing for stdout.
    pub(crate) fn reopen(&self) {
        self.reopen.store(true, Ordering::Release);
    }

    /// After the workers flushed: the writer writes what is queued and stops, waited for
    /// until `deadline` (a writer stuck on a stdout nobody reads is left behind).
    pub(crate) fn stop(&self, deadline: Instant) {
        while let Err(TrySendError::Full(_)) = self.tx.try_send(Msg::Stop) {
            if Instant::now() >= deadline {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let Some(w) = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return;
        };
        while !w.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if w.is_finished() {
            let _ = w.join();
        } else {
            tracing::warn!("the access log writer did not finish by the shutdown deadline");
        }
    }
}

enum Sink {
    Stdout,
    File { file: File, path: PathBuf },
}

fn open_append(p: &std::path::Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o644)
        .custom_flags(rustix::fs::OFlags::CLOEXEC.bits() as i32)
        .open(p)
        .map_err(|e| io::Error::new(e.kind(), format!("access log {}: {e}", p.display())))
}

fn write_loop(rx: Receiver<Msg>, mut sink: Sink, reopen: &AtomicBool, metrics: &Metrics) {
    let mut next_warning = Instant::now();
    loop {
        let msg = rx.recv_timeout(WRITER_TICK);
        if reopen.swap(false, Ordering::AcqRel)
            && let Sink::File { file, path } = &mut sink
        {
            match open_append(path) {
                Ok(f) => {
                    *file = f;
                    tracing::info!(path = %path.display(), "access log reopened");
                }
                Err(e) => {
                    tracing::error!(error = %e, "access log: reopen failed; writing to the old file")
                }
            }
        }
        let batch = match msg {
            Ok(Msg::Batch(b)) => b,
            Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => continue,
        };
        let r = match &mut sink {
            Sink::Stdout => {
                let mut out = io::stdout().lock();
                out.write_all(&batch).and_then(|()| out.flush())
            }
            Sink::File { file, .. } => file.write_all(&batch),
        };
        if let Err(e) = r {
            metrics.access_log_write_errors.inc();
            let now = Instant::now();
            if now >= next_warning {
                tracing::warn!(error = %e, "access log write failed (lines lost; counted in penstock_access_log_write_errors_total)");
                next_warning = now + WRITE_ERROR_LOG_INTERVAL;
            }
        }
    }
}

/// `[24/Nov/2026:13:45:01 +0000]`'s inside, formatted once per second.
#[derive(Default)]
struct TimeCache {
    secs: u64,
    text: Vec<u8>,
}

impl TimeCache {
    fn get(&mut self, now: SystemTime) -> &[u8] {
        let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        if secs != self.secs || self.text.is_empty() {
            self.secs = secs;
            self.text = time_local(UNIX_EPOCH + Duration::from_secs(secs)).into_bytes();
        }
        &self.text
    }
}

/// nginx's `$time_local` in UTC: `06/Nov/1994:08:49:37 +0000`.
fn time_local(t: SystemTime) -> String {
    // `Sun, 06 Nov 1994 08:49:37 GMT`: fixed positions.
    let d = penstock_core::http::format_http_date(t);
    format!(
        "{}/{}/{}:{} +0000",
        &d[5..7],
        &d[8..11],
        &d[12..16],
        &d[17..25]
    )
}

/// What a request's line needs from its head, escaped when the request is read (the head's
/// bytes are gone by the time the response ends).
#[derive(Debug, Clone, Default)]
pub(crate) struct LogEntry {
    /// The request line, escaped; then from `split` on, `"referer" "user agent"`.
    text: String,
    split: usize,
}

impl LogEntry {
    /// From the raw bytes of a request head (or of the part that arrived).
    pub(crate) fn from_head(head: &[u8]) -> LogEntry {
        let mut text = String::with_capacity(128);
        let line = request_line(head);
        if line.is_empty() {
            text.push('-');
        } else {
            escape_into(
                &mut text,
                &line[..line.len().min(REQUEST_LINE_LOG_BYTES_MAX)],
            );
        }
        let split = text.len();
        // One pass over the fields for both.
        let (mut referer, mut agent) = (None, None);
        for (name, value) in header_fields(head) {
            if referer.is_none() && name.eq_ignore_ascii_case(b"referer") {
                referer = Some(value);
            } else if agent.is_none() && name.eq_ignore_ascii_case(b"user-agent") {
                agent = Some(value);
            }
        }
        for (i, v) in [referer, agent].into_iter().enumerate() {
            if i > 0 {
                text.push(' ');
            }
            text.push('"');
            match v {
                Some(v) => escape_into(&mut text, &v[..v.len().min(FIELD_LOG_BYTES_MAX)]),
                None => text.push('-'),
            }
            text.push('"');
        }
        LogEntry { text, split }
    }
}

/// The first line of a head (after the empty lines a client may send first), without its
/// line end.
pub(crate) fn request_line(head: &[u8]) -> &[u8] {
    let start = head
        .iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .unwrap_or(head.len());
    let rest = &head[start..];
    let end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
    let line = &rest[..end];
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// The header fields of a head, `(name, value)`, the value without the white space around
/// it; ends at the empty line.
fn header_fields(head: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    let start = head
        .iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .unwrap_or(head.len());
    head[start..]
        .split(|&b| b == b'\n')
        .skip(1)
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .take_while(|l| !l.is_empty())
        .filter_map(|l| {
            let colon = l.iter().position(|&b| b == b':')?;
            Some((&l[..colon], l[colon + 1..].trim_ascii()))
        })
}

/// The value of the first header field called `name` in a head (any case), without the
/// white space around it.
pub(crate) fn header_value<'a>(head: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    header_fields(head).find_map(|(n, v)| n.eq_ignore_ascii_case(name).then_some(v))
}

/// Appends `bytes` as nginx writes a variable in a log: `"`, `\`, bytes below 0x20 and
/// from 0x7f up as `\xHH`.
pub(crate) fn escape_into(out: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in bytes {
        if b == b'"' || b == b'\\' || !(0x20..0x7f).contains(&b) {
            out.push_str("\\x");
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 0xf)] as char);
        } else {
            out.push(b as char);
        }
    }
}

/// Hands whole lines to the writer one at a time, for events that are rare beside HTTP
/// requests (an RTSP session's end): no buffer, the same bounded queue; a full queue drops
/// the line and counts it.
#[derive(Clone)]
pub(crate) struct LineSink {
    tx: SyncSender<Msg>,
    metrics: Arc<Metrics>,
}

impl LineSink {
    pub(crate) fn send(&self, line: Vec<u8>) {
        match self.tx.try_send(Msg::Batch(line)) {
            Ok(()) => {
                self.metrics.access_log_lines.inc_by(1);
            }
            Err(_) => {
                self.metrics.access_log_dropped.inc_by(1);
            }
        }
    }
}

/// An RTSP session that ended, as its access-log line needs it.
pub(crate) struct RtspSessionEnd<'a> {
    pub(crate) peer: IpAddr,
    /// `PLAY` when the session played, else `SETUP`.
    pub(crate) method: &'static str,
    /// The presentation's URL as the client named it.
    pub(crate) url: &'a str,
    pub(crate) user_agent: Option<&'a str>,
    /// RTP payload bytes sent over the session's life.
    pub(crate) bytes: u64,
    /// From SETUP to the end.
    pub(crate) elapsed: Duration,
    /// `udp` or `tcp`.
    pub(crate) transport: &'static str,
    /// An `rtsps://` session's TLS path (`ktls`, `tls-user`), written `tls=` after the
    /// transport; `None` for plain RTSP.
    pub(crate) tls: Option<&'static str>,
    /// The p99 of its units' lateness (engine streams only).
    pub(crate) late_p99_ns: Option<u64>,
    /// Why it ended: `teardown`, `timeout`, `connection_closed`, `shutdown`.
    pub(crate) end: &'static str,
}

/// One RTSP session's line in the combined form of the HTTP lines (status 200, the bytes its
/// RTP payloads carried), then `rt=` (its life), `transport=`, `tls=` (`rtsps://` sessions
/// only), `late_p99=` (seconds, or `-`) and `end=`:
///
/// ```text
/// 127.0.0.1 - - [27/Nov/2026:14:03:20 +0000] "PLAY rtsp://h:8554/clip.ts RTSP/1.0" 200 1562400 "-" "Lavf/59.27.100" rt=12.410 transport=udp late_p99=0.000131 end=teardown
/// ```
pub(crate) fn rtsp_session_line(e: &RtspSessionEnd<'_>, now: SystemTime) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    let _ = write!(out, "{} - - [", e.peer);
    out.extend_from_slice(time_local(now).as_bytes());
    out.extend_from_slice(b"] \"");
    out.extend_from_slice(e.method.as_bytes());
    out.push(b' ');
    let mut url = String::new();
    escape_into(&mut url, e.url.as_bytes());
    out.extend_from_slice(url.as_bytes());
    out.extend_from_slice(b" RTSP/1.0\" 200 ");
    push_u64(&mut out, e.bytes);
    out.extend_from_slice(b" \"-\" \"");
    match e.user_agent {
        Some(ua) => {
            let mut t = String::new();
            escape_into(&mut t, ua.as_bytes());
            out.extend_from_slice(t.as_bytes());
        }
        None => out.push(b'-'),
    }
    let ms = u64::try_from(e.elapsed.as_millis()).unwrap_or(u64::MAX);
    let _ = write!(
        out,
        "\" rt={}.{:03} transport={}",
        ms / 1000,
        ms % 1000,
        e.transport
    );
    if let Some(t) = e.tls {
        let _ = write!(out, " tls={t}");
    }
    match e.late_p99_ns {
        Some(ns) => {
            let _ = write!(
                out,
                " late_p99={}.{:06}",
                ns / 1_000_000_000,
                ns % 1_000_000_000 / 1000
            );
        }
        None => out.extend_from_slice(b" late_p99=-"),
    }
    let _ = writeln!(out, " end={}", e.end);
    out
}

/// One finished request, as the log line needs it.
pub(crate) struct Finished<'a> {
    pub(crate) peer: Option<IpAddr>,
    pub(crate) entry: &'a LogEntry,
    pub(crate) status: u16,
    pub(crate) body_bytes: u64,
    pub(crate) elapsed: Duration,
    pub(crate) data_path: &'a str,
}

/// Appends `n` in decimal (no formatting machinery: this runs once per field per line).
fn push_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// Formats one line into `out`; `addr` is the client's address as text.
fn format_line(out: &mut Vec<u8>, f: &Finished<'_>, addr: &[u8], time: &[u8]) {
    out.extend_from_slice(addr);
    out.extend_from_slice(b" - - [");
    out.extend_from_slice(time);
    out.extend_from_slice(b"] \"");
    out.extend_from_slice(&f.entry.text.as_bytes()[..f.entry.split]);
    out.extend_from_slice(b"\" ");
    push_u64(out, u64::from(f.status));
    out.push(b' ');
    push_u64(out, f.body_bytes);
    out.push(b' ');
    out.extend_from_slice(&f.entry.text.as_bytes()[f.entry.split..]);
    let ms = u64::try_from(f.elapsed.as_millis()).unwrap_or(u64::MAX);
    out.extend_from_slice(b" rt=");
    push_u64(out, ms / 1000);
    out.push(b'.');
    let frac = ms % 1000;
    out.extend_from_slice(&[
        b'0' + (frac / 100) as u8,
        b'0' + (frac / 10 % 10) as u8,
        b'0' + (frac % 10) as u8,
    ]);
    out.extend_from_slice(b" path=");
    out.extend_from_slice(f.data_path.as_bytes());
    out.push(b'\n');
}

/// The text of the last client address logged (most lines in a row come from the same few
/// clients), formatted again only when the address changes.
#[derive(Default)]
struct AddrCache {
    addr: Option<IpAddr>,
    text: Vec<u8>,
}

impl AddrCache {
    fn get(&mut self, addr: Option<IpAddr>) -> &[u8] {
        if addr != self.addr || self.text.is_empty() {
            self.addr = addr;
            self.text.clear();
            match addr {
                Some(a) => {
                    let _ = write!(self.text, "{a}");
                }
                None => self.text.push(b'-'),
            }
        }
        &self.text
    }
}

/// A worker's lines not yet handed to the writer.
pub(crate) struct LogBuffer {
    tx: SyncSender<Msg>,
    buf: Vec<u8>,
    lines: u64,
    limits: AccessLimits,
    /// When the buffer must go even if not full (its first line plus `flush`).
    flush_at: Option<Instant>,
    clock: TimeCache,
    addr: AddrCache,
    metrics: Arc<Metrics>,
}

impl LogBuffer {
    /// Adds one line; hands the buffer over when it is full.
    pub(crate) fn line(&mut self, f: &Finished<'_>, now: Instant) {
        let time = self.clock.get(SystemTime::now());
        let addr = self.addr.get(f.peer);
        format_line(&mut self.buf, f, addr, time);
        self.lines += 1;
        if self.flush_at.is_none() {
            self.flush_at = Some(now + self.limits.flush);
        }
        if self.buf.len() >= self.limits.buffer_bytes {
            self.flush();
        }
    }

    /// When the buffer is due, if it holds anything.
    pub(crate) fn flush_at(&self) -> Option<Instant> {
        self.flush_at
    }

    /// Hands the buffer to the writer now, or drops it (counted) if the queue is full.
    pub(crate) fn flush(&mut self) {
        if self.lines == 0 {
            return;
        }
        let batch = std::mem::replace(
            &mut self.buf,
            Vec::with_capacity(self.limits.buffer_bytes + 1024),
        );
        match self.tx.try_send(Msg::Batch(batch)) {
            Ok(()) => {
                self.metrics.access_log_lines.inc_by(self.lines);
            }
            Err(TrySendError::Full(Msg::Batch(mut b))) => {
                self.metrics.access_log_dropped.inc_by(self.lines);
                b.clear();
                self.buf = b;
            }
            Err(_) => {
                self.metrics.access_log_dropped.inc_by(self.lines);
            }
        }
        self.lines = 0;
        self.flush_at = None;
    }

    /// At a worker's end: hands the buffer over, waiting for room until `deadline`.
    pub(crate) fn flush_before(&mut self, deadline: Instant) {
        if self.lines == 0 {
            return;
        }
        let mut batch = Msg::Batch(std::mem::take(&mut self.buf));
        loop {
            match self.tx.try_send(batch) {
                Ok(()) => {
                    self.metrics.access_log_lines.inc_by(self.lines);
                    break;
                }
                Err(TrySendError::Full(b)) if Instant::now() < deadline => {
                    batch = b;
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(_) => {
                    self.metrics.access_log_dropped.inc_by(self.lines);
                    break;
                }
            }
        }
        self.lines = 0;
        self.flush_at = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line_of(head: &[u8], status: u16, bytes: u64, ms: u64, path: &str) -> String {
        let entry = LogEntry::from_head(head);
        let mut out = Vec::new();
        let peer = Some("192.0.2.7".parse().unwrap());
        format_line(
            &mut out,
            &Finished {
                peer,
                entry: &entry,
                status,
                body_bytes: bytes,
                elapsed: Duration::from_millis(ms),
                data_path: path,
            },
            AddrCache::default().get(peer),
            b"06/Nov/1994:08:49:37 +0000",
        );
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn combined_format_with_request_time_and_path() {
        let l = line_of(
            b"GET /a.ts?x=1 HTTP/1.1\r\nHost: h\r\nReferer: http://r/\r\nUser-Agent: curl/8.5.0\r\n\r\n",
            200,
            1_048_576,
            4,
            "engine-sendfile",
        );
        assert_eq!(
            l,
            "192.0.2.7 - - [06/Nov/1994:08:49:37 +0000] \"GET /a.ts?x=1 HTTP/1.1\" 200 1048576 \"http://r/\" \"curl/8.5.0\" rt=0.004 path=engine-sendfile\n"
        );
        // Absent headers are '-'; seconds and milliseconds.
        let l = line_of(b"HEAD / HTTP/1.0\r\n\r\n", 404, 0, 61_234, "none");
        assert!(
            l.ends_with("\"HEAD / HTTP/1.0\" 404 0 \"-\" \"-\" rt=61.234 path=none\n"),
            "{l}"
        );
    }

    #[test]
    fn quotes_backslashes_and_control_bytes_are_escaped_as_nginx_does() {
        let l = line_of(
            b"\r\nGET /\"q\\ HTTP/1.1\r\nuser-agent:  a \"b\"\x01\xff  \r\nREFERER:\tx\x7f\r\n\r\n",
            400,
            0,
            0,
            "memory",
        );
        assert!(
            l.contains(
                "\"GET /\\x22q\\x5C HTTP/1.1\" 400 0 \"x\\x7F\" \"a \\x22b\\x22\\x01\\xFF\""
            ),
            "{l}"
        );
        // No raw quote inside a field: the line splits into exactly 6 quotes.
        assert_eq!(l.matches('"').count(), 6, "{l}");
        // A line that is not HTTP at all, and an empty head.
        let l = line_of(b"\x16\x03\x01\x02\x00", 400, 0, 0, "memory");
        assert!(l.contains("\"\\x16\\x03\\x01\\x02\\x00\" 400"), "{l}");
        let l = line_of(b"", 408, 0, 0, "memory");
        assert!(l.contains("\"-\" 408"), "{l}");
    }

    #[test]
    fn long_fields_are_cut() {
        let mut head = b"GET /".to_vec();
        head.extend(std::iter::repeat_n(b'a', 20_000));
        head.extend_from_slice(b" HTTP/1.1\r\nUser-Agent: ");
        head.extend(std::iter::repeat_n(b'u', 5000));
        head.extend_from_slice(b"\r\n\r\n");
        let e = LogEntry::from_head(&head);
        assert_eq!(e.split, REQUEST_LINE_LOG_BYTES_MAX);
        assert!(e.text.len() < REQUEST_LINE_LOG_BYTES_MAX + FIELD_LOG_BYTES_MAX + 16);
    }

    #[test]
    fn numbers_and_addresses_are_written_as_display_writes_them() {
        for n in [0, 7, 10, 999, 1000, 16384, u64::MAX] {
            let mut v = Vec::new();
            push_u64(&mut v, n);
            assert_eq!(v, n.to_string().into_bytes());
        }
        let mut c = AddrCache::default();
        assert_eq!(c.get(None), b"-");
        assert_eq!(c.get(Some("::1".parse().unwrap())), b"::1");
        assert_eq!(c.get(Some("10.0.0.1".parse().unwrap())), b"10.0.0.1");
        assert_eq!(c.get(None), b"-");
        // The first header of a name counts; the body after the empty line is not a header.
        let head = b"GET / HTTP/1.1\r\nuser-agent: one\r\nUser-Agent: two\r\n\r\nReferer: body\r\n";
        let e = LogEntry::from_head(head);
        assert_eq!(&e.text[e.split..], "\"-\" \"one\"");
        assert_eq!(header_value(head, b"USER-AGENT"), Some(&b"one"[..]));
        assert_eq!(header_value(head, b"referer"), None);
    }

    #[test]
    fn time_local_is_nginx_shaped() {
        let t = UNIX_EPOCH + Duration::from_secs(784_111_777);
        assert_eq!(time_local(t), "06/Nov/1994:08:49:37 +0000");
        let mut c = TimeCache::default();
        assert_eq!(c.get(t), b"06/Nov/1994:08:49:37 +0000");
        assert_eq!(
            c.get(t + Duration::from_millis(999)),
            b"06/Nov/1994:08:49:37 +0000"
        );
        assert_eq!(
            c.get(t + Duration::from_secs(1)),
            b"06/Nov/1994:08:49:38 +0000"
        );
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_blocking() {
        let metrics = Arc::new(Metrics::new());
        // A queue of one batch that nobody reads.
        let (tx, _rx) = std::sync::mpsc::sync_channel(1);
        let mut b = LogBuffer {
            tx,
            buf: Vec::new(),
            lines: 0,
            limits: AccessLimits {
                buffer_bytes: 1,
                flush: Duration::from_secs(1),
                queue_batches: 1,
            },
            flush_at: None,
            clock: TimeCache::default(),
            addr: AddrCache::default(),
            metrics: metrics.clone(),
        };
        let entry = LogEntry::from_head(b"GET / HTTP/1.1\r\n\r\n");
        let f = Finished {
            peer: None,
            entry: &entry,
            status: 200,
            body_bytes: 1,
            elapsed: Duration::ZERO,
            data_path: "sendfile",
        };
        let now = Instant::now();
        for _ in 0..3 {
            b.line(&f, now);
        }
        assert_eq!(metrics.access_log_lines.get(), 1);
        assert_eq!(metrics.access_log_dropped.get(), 2);
        // At a worker's end the wait is bounded too.
        b.line(&f, now);
        assert_eq!(metrics.access_log_dropped.get(), 3);
        b.buffer_bytes_for_test(1 << 20);
        b.line(&f, now);
        b.flush_before(Instant::now() + Duration::from_millis(20));
        assert_eq!(metrics.access_log_dropped.get(), 4);
        assert_eq!(b.flush_at(), None);
    }

    impl LogBuffer {
        fn buffer_bytes_for_test(&mut self, n: usize) {
            self.limits.buffer_bytes = n;
        }
    }
}
