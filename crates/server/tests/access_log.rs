//! The access log (issue 16): exactly one well-formed line per request, in nginx's combined
//! format with `rt=` and `path=`, errors and cut responses included; the file reopened on
//! request (what SIGUSR1 does).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use common::*;
use penstock_server::metrics::{Format, MetricsPage};

/// One access log line, taken apart. Panics on anything that is not exactly the format.
#[derive(Debug)]
pub struct Line {
    pub addr: String,
    pub request: String,
    pub status: u16,
    pub bytes: u64,
    pub referer: String,
    pub agent: String,
    pub rt_ms: u64,
    pub path: String,
}

/// A quoted field: everything up to the next `"` (a field never holds a raw quote: they
/// are escaped), then the rest after `"`.
fn quoted<'a>(s: &'a str, line: &str) -> (&'a str, &'a str) {
    let s = s
        .strip_prefix('"')
        .unwrap_or_else(|| panic!("no opening quote: {line}"));
    let end = s
        .find('"')
        .unwrap_or_else(|| panic!("no closing quote: {line}"));
    (&s[..end], &s[end + 1..])
}

pub fn parse_line(line: &str) -> Line {
    assert!(
        line.bytes().all(|b| (0x20..0x7f).contains(&b)),
        "a raw control or non-ASCII byte: {line:?}"
    );
    let (addr, rest) = line.split_once(" - - [").expect(line);
    assert!(addr.parse::<std::net::IpAddr>().is_ok(), "{line}");
    let (time, rest) = rest.split_once("] ").expect(line);
    // 06/Nov/1994:08:49:37 +0000
    let t = time.as_bytes();
    assert!(
        t.len() == 26
            && t[2] == b'/'
            && t[6] == b'/'
            && t[11] == b':'
            && time.ends_with(" +0000")
            && t[..2].iter().all(u8::is_ascii_digit)
            && t[7..11].iter().all(u8::is_ascii_digit),
        "time: {line}"
    );
    let (request, rest) = quoted(rest, line);
    let mut it = rest.trim_start().splitn(3, ' ');
    let status: u16 = it.next().unwrap().parse().expect(line);
    let bytes: u64 = it.next().unwrap().parse().expect(line);
    let rest = it.next().expect(line);
    let (referer, rest) = quoted(rest, line);
    let (agent, rest) = quoted(rest.strip_prefix(' ').expect(line), line);
    let rest = rest.strip_prefix(" rt=").expect(line);
    let (rt, path) = rest.split_once(" path=").expect(line);
    let (s, ms) = rt.split_once('.').expect(line);
    assert_eq!(ms.len(), 3, "{line}");
    assert!(!path.is_empty() && !path.contains(' '), "{line}");
    Line {
        addr: addr.into(),
        request: request.into(),
        status,
        bytes,
        referer: referer.into(),
        agent: agent.into(),
        rt_ms: s.parse::<u64>().expect(line) * 1000 + ms.parse::<u64>().expect(line),
        path: path.into(),
    }
}

fn lines_of(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Waits (bounded) until `p` holds `n` lines; returns them.
fn wait_lines(p: &Path, n: usize) -> Vec<String> {
    for _ in 0..2000 {
        let l = lines_of(p);
        if l.len() >= n {
            return l;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    lines_of(p)
}

fn logged_config(log: &Path) -> penstock_server::ServerConfig {
    let mut c = config();
    c.log.access = log.display().to_string();
    c.log.access_flush_ms = 20;
    c
}

fn metric(m: &str, name: &str) -> f64 {
    m.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing:\n{m}"))
}

#[test]
fn every_request_gets_exactly_one_well_formed_line() {
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("access.log");
    let mut f = start_with(logged_config(&log));
    const HUGE: usize = 32 << 20;
    std::fs::write(f.path("huge.bin"), pattern(HUGE, 5)).unwrap();
    let a = agent();
    let ok = |path: &str| {
        let mut r = a
            .get(f.url(path))
            .header("Referer", "http://example.test/page")
            .header("User-Agent", "test-agent/1.0")
            .call()
            .unwrap();
        let st = r.status().as_u16();
        let n = r.body_mut().read_to_vec().unwrap().len();
        (st, n)
    };
    // Each request says which it is in its query (dropped by the server, kept in the log).
    assert_eq!(ok("/small.txt?t=get"), (200, 1000));
    assert_eq!(ok("/big.bin?t=engine"), (200, 3 << 20));
    assert_eq!(ok("/nope?t=404").0, 404);
    let mut r = a
        .get(f.url("/mid.bin?t=range"))
        .header("Range", "bytes=0-99")
        .call()
        .unwrap();
    assert_eq!(r.status().as_u16(), 206);
    assert_eq!(r.body_mut().read_to_vec().unwrap().len(), 100);
    let r = a.head(f.url("/small.txt?t=head")).call().unwrap();
    assert_eq!(r.status().as_u16(), 200);
    // Malformed: a control byte in the method; quotes and bytes above 0x7e in a header.
    let r = raw(f.http, b"GE\x01T /?t=bad HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status_of(&r), 400);
    let r = raw(
        f.http,
        b"GET /small.txt?t=escape HTTP/1.1\r\nHost: x\r\nUser-Agent: say \"hi\" \\ \xc3\xa9\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status_of(&r), 200);
    // Two pipelined requests on one connection: two lines.
    let r = raw(
        f.http,
        b"GET /small.txt?t=pipe1 HTTP/1.1\r\nHost: x\r\n\r\nGET /small.txt?t=pipe2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.windows(12).filter(|w| w == b"HTTP/1.1 200").count(), 2);
    // A client that reads a little of a large engine body and resets the connection.
    {
        let mut s = TcpStream::connect(f.http).unwrap();
        s.write_all(b"GET /huge.bin?t=abort HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut b = [0u8; 4096];
        s.read_exact(&mut b).unwrap();
    }
    // A client that sends half a request and goes away is not a request; nothing is logged.
    {
        let mut s = TcpStream::connect(f.http).unwrap();
        s.write_all(b"GET /small.txt HTTP/1.1\r\nHo").unwrap();
    }
    const LINES: usize = 10;
    let lines = wait_lines(&log, LINES);
    assert_eq!(lines.len(), LINES, "{lines:#?}");
    // The server counted as many as were written, and dropped none.
    let server = f.server.take().unwrap();
    // A worker counts a batch once its send to the writer returned, so the writer may have
    // written the lines a moment before they are counted: wait for the count (bounded).
    let t0 = std::time::Instant::now();
    let mut m = server.metrics().render(Format::Text004);
    while metric(&m, "penstock_access_log_lines_total") < LINES as f64
        && t0.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(10));
        m = server.metrics().render(Format::Text004);
    }
    assert_eq!(metric(&m, "penstock_access_log_lines_total"), LINES as f64);
    assert_eq!(metric(&m, "penstock_access_log_dropped_lines_total"), 0.0);
    let requests: f64 = m
        .lines()
        .filter(|l| l.starts_with("penstock_http_requests_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert_eq!(requests, LINES as f64, "{m}");
    server.shutdown(Duration::from_secs(5));
    // Nothing more after the shutdown.
    assert_eq!(lines_of(&log).len(), LINES);

    let parsed: Vec<Line> = lines.iter().map(|l| parse_line(l)).collect();
    let by = |tag: &str| -> &Line {
        let hits: Vec<&Line> = parsed
            .iter()
            .filter(|l| l.request.contains(&format!("t={tag} ")))
            .collect();
        assert_eq!(hits.len(), 1, "{tag}: {lines:#?}");
        hits[0]
    };
    let l = by("get");
    assert_eq!(l.addr, "127.0.0.1");
    assert_eq!(l.request, "GET /small.txt?t=get HTTP/1.1");
    assert_eq!((l.status, l.bytes), (200, 1000));
    assert_eq!(l.referer, "http://example.test/page");
    assert_eq!(l.agent, "test-agent/1.0");
    assert_eq!(l.path, "sendfile");
    let l = by("engine");
    assert_eq!((l.status, l.bytes), (200, 3 << 20));
    assert_eq!(l.path, "engine-sendfile");
    let l = by("404");
    assert_eq!(l.status, 404);
    assert_eq!(l.path, "memory");
    let l = by("range");
    assert_eq!((l.status, l.bytes, l.path.as_str()), (206, 100, "sendfile"));
    let l = by("head");
    assert_eq!(l.request, "HEAD /small.txt?t=head HTTP/1.1");
    assert_eq!((l.status, l.bytes, l.path.as_str()), (200, 0, "none"));
    let l = by("bad");
    assert_eq!(l.request, "GE\\x01T /?t=bad HTTP/1.1");
    assert_eq!(l.status, 400);
    assert_eq!((l.referer.as_str(), l.agent.as_str()), ("-", "-"));
    let l = by("escape");
    assert_eq!(l.agent, "say \\x22hi\\x22 \\x5C \\xC3\\xA9");
    assert_eq!((by("pipe1").status, by("pipe2").status), (200, 200));
    let l = by("abort");
    assert_eq!(
        l.status, 200,
        "the head went out: its status, as nginx logs it"
    );
    assert!(
        l.bytes < HUGE as u64,
        "a cut body logs what was sent: {l:?}"
    );
    assert_eq!(l.path, "engine-sendfile");
    // Request times are small here, but present and well-formed on every line.
    assert!(parsed.iter().all(|l| l.rt_ms < 60_000), "{parsed:#?}");
}

#[test]
fn a_reopen_sends_new_lines_to_a_new_file_at_the_same_path() {
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("access.log");
    let rotated = logs.path().join("access.log.1");
    let f = start_with(logged_config(&log));
    for i in 0..3 {
        assert_eq!(get(&f, &format!("/small.txt?before={i}"), &[]).0, 200);
    }
    assert_eq!(wait_lines(&log, 3).len(), 3);
    // logrotate: rename, then signal (here the call SIGUSR1 makes).
    std::fs::rename(&log, &rotated).unwrap();
    f.server.as_ref().unwrap().reopen_access_log();
    for _ in 0..2000 {
        if log.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(log.exists(), "the writer did not open the path again");
    for i in 0..4 {
        assert_eq!(get(&f, &format!("/small.txt?after={i}"), &[]).0, 200);
    }
    let new = wait_lines(&log, 4);
    assert_eq!(new.len(), 4, "{new:#?}");
    assert!(new.iter().all(|l| l.contains("?after=")), "{new:#?}");
    let old = lines_of(&rotated);
    assert_eq!(old.len(), 3, "{old:#?}");
    assert!(old.iter().all(|l| l.contains("?before=")), "{old:#?}");
}

#[test]
fn a_slow_head_is_logged_as_408() {
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("access.log");
    let mut cfg = logged_config(&log);
    cfg.limits.idle_timeout_ms = 300;
    let f = start_with(cfg);
    let mut s = TcpStream::connect(f.http).unwrap();
    s.write_all(b"GET /small.txt?t=slow HTTP/1.1\r\nHost")
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut r = Vec::new();
    let _ = s.read_to_end(&mut r);
    assert_eq!(status_of(&r), 408);
    let lines = wait_lines(&log, 1);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    let l = parse_line(&lines[0]);
    assert_eq!(l.request, "GET /small.txt?t=slow HTTP/1.1");
    assert_eq!((l.status, l.bytes, l.path.as_str()), (408, 0, "memory"));
}
