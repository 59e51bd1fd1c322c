//! `penstock serve`'s HTTP side on loopback, with the real kernel: byte-exact downloads,
//! ranges, HEAD, conditionals, bad input, confinement, slowloris, many idle connections,
//! clients vanishing. No assertion depends on wall-clock time; waits are bounded loops.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::*;

fn header<'a>(hs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    hs.iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

#[test]
fn downloads_are_byte_exact_through_the_loop_and_the_engine() {
    let f = start();
    for (name, seed, len) in [
        ("small.txt", 1, 1000),
        ("mid.bin", 2, 300 * 1024),
        ("big.bin", 3, 3 << 20),
    ] {
        let (st, hs, body) = get(&f, &format!("/{name}"), &[]);
        assert_eq!(st, 200, "{name}");
        assert_eq!(
            header(&hs, "content-length"),
            Some(len.to_string().as_str())
        );
        assert!(body == pattern(len, seed), "{name} differs");
    }
    let (st, _, body) = get(&f, "/empty.txt", &[]);
    assert_eq!((st, body.len()), (200, 0));
    // A symlink inside the root is fine.
    let (st, _, body) = get(&f, "/in", &[]);
    assert_eq!(st, 200);
    assert!(body == pattern(1000, 1));
    let m = String::from_utf8(get(&f, "/metrics", &[]).2).unwrap();
    assert!(m.contains("data_path=\"engine-sendfile\""), "{m}");
    assert!(m.contains("data_path=\"sendfile\""), "{m}");
    // Without an Accept naming OpenMetrics: the Prometheus text format 0.0.4 (no # EOF).
    assert!(!m.contains("# EOF"), "{m}");
    // A scraper that asks for OpenMetrics gets it.
    let (st, hs, body) = get(
        &f,
        "/metrics",
        &[(
            "accept",
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
        )],
    );
    assert_eq!(st, 200);
    assert!(
        header(&hs, "content-type").is_some_and(|t| t.starts_with("application/openmetrics-text")),
        "{hs:?}"
    );
    assert!(String::from_utf8(body).unwrap().ends_with("# EOF\n"));
}

#[test]
fn ranges_single_multi_suffix_unsatisfiable_and_malformed() {
    let f = start();
    let big = pattern(3 << 20, 3);
    // Single range, in the engine's file (one extent) and in the loop's.
    let (st, hs, body) = get(&f, "/big.bin", &[("Range", "bytes=1000000-1999999")]);
    assert_eq!(st, 206);
    assert_eq!(
        header(&hs, "content-range"),
        Some("bytes 1000000-1999999/3145728")
    );
    assert!(body == big[1_000_000..2_000_000]);
    let mid = pattern(300 * 1024, 2);
    let (st, _, body) = get(&f, "/mid.bin", &[("Range", "bytes=-100")]);
    assert_eq!(st, 206);
    assert!(body == mid[mid.len() - 100..]);
    let (st, _, body) = get(&f, "/mid.bin", &[("Range", "bytes=307000-")]);
    assert_eq!(st, 206);
    assert!(body == mid[307000..]);
    // Multiple ranges: multipart/byteranges with both parts, byte-exact.
    let (st, hs, body) = get(&f, "/mid.bin", &[("Range", "bytes=0-9,200-209")]);
    assert_eq!(st, 206);
    let ct = header(&hs, "content-type").unwrap();
    assert!(ct.starts_with("multipart/byteranges; boundary="), "{ct}");
    assert_eq!(
        header(&hs, "content-length")
            .unwrap()
            .parse::<usize>()
            .unwrap(),
        body.len()
    );
    let find = |needle: &[u8]| {
        body.windows(needle.len())
            .position(|w| w == needle)
            .map(|p| p + needle.len())
    };
    let p0 = find(b"Content-Range: bytes 0-9/307200\r\n\r\n").unwrap();
    assert!(body[p0..p0 + 10] == mid[..10]);
    let p1 = find(b"Content-Range: bytes 200-209/307200\r\n\r\n").unwrap();
    assert!(body[p1..p1 + 10] == mid[200..210]);
    // Unsatisfiable: 416 with the length.
    let (st, hs, _) = get(&f, "/small.txt", &[("Range", "bytes=5000-6000")]);
    assert_eq!(st, 416);
    assert_eq!(header(&hs, "content-range"), Some("bytes */1000"));
    // Malformed and overflowing ranges are ignored: the whole file.
    for r in [
        "bytes=abc",
        "bytes=99999999999999999999999-",
        "items=0-1",
        "bytes=5-1",
    ] {
        let (st, _, body) = get(&f, "/small.txt", &[("Range", r)]);
        assert!(st == 200 || st == 416, "{r}: {st}");
        if st == 200 {
            assert!(body == pattern(1000, 1), "{r}");
        }
    }
}

#[test]
fn head_matches_get_and_conditionals_give_304() {
    let f = start();
    for path in ["/small.txt", "/big.bin", "/nope", "/dir/"] {
        let strip = |resp: Vec<u8>| -> Vec<String> {
            let text = String::from_utf8_lossy(&resp).to_string();
            let head = text.split("\r\n\r\n").next().unwrap().to_string();
            head.lines()
                .filter(|l| !l.starts_with("Date:"))
                .map(str::to_string)
                .collect()
        };
        let g = raw(
            f.http,
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        );
        let h = raw(
            f.http,
            format!("HEAD {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        );
        let head_only = String::from_utf8_lossy(&h).to_string();
        assert!(head_only.ends_with("\r\n\r\n"), "HEAD {path} has a body");
        assert_eq!(strip(g), strip(h), "{path}");
    }
    let (_, hs, _) = get(&f, "/small.txt", &[]);
    let etag = header(&hs, "etag").unwrap().to_string();
    let lm = header(&hs, "last-modified").unwrap().to_string();
    let (st, _, body) = get(&f, "/small.txt", &[("If-None-Match", &etag)]);
    assert_eq!((st, body.len()), (304, 0));
    let (st, _, _) = get(&f, "/small.txt", &[("If-Modified-Since", &lm)]);
    assert_eq!(st, 304);
    let (st, _, _) = get(&f, "/small.txt", &[("If-None-Match", "\"other\"")]);
    assert_eq!(st, 200);
}

#[test]
fn keep_alive_and_pipelining() {
    let f = start();
    let mut s = TcpStream::connect(f.http).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(
        b"GET /small.txt HTTP/1.1\r\nHost: x\r\n\r\nGET /mid.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=0-4\r\n\r\nGET /big.bin HTTP/1.1\r\nHost: x\r\n\r\nGET /small.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    // Walk the four responses: head, then Content-Length bytes of body.
    let small = pattern(1000, 1);
    let expected: [(u16, Vec<u8>); 4] = [
        (200, small.clone()),
        (206, pattern(300 * 1024, 2)[..5].to_vec()),
        (200, pattern(3 << 20, 3)),
        (200, small),
    ];
    let mut rest = &all[..];
    for (status, body) in expected {
        let end = rest.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let head = String::from_utf8_lossy(&rest[..end]).to_string();
        assert_eq!(status_of(rest), status, "{head}");
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(len, body.len());
        assert!(rest[end..end + len] == body[..]);
        rest = &rest[end + len..];
    }
    assert!(rest.is_empty());
}

#[test]
fn bad_input_gets_its_status_and_others_are_still_served() {
    let f = start();
    let long_header = format!(
        "GET /small.txt HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(10_000)
    );
    let cases: Vec<(Vec<u8>, u16)> = vec![
        (b"GARBAGE\r\n\r\n".to_vec(), 400),
        (
            b"GET /small.txt HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n".to_vec(),
            400,
        ),
        (b"GET /small.txt HTTP/1.1\r\n\r\n".to_vec(), 400), // no Host
        (b"GET /small.txt HTTP/2.0\r\nHost: x\r\n\r\n".to_vec(), 505),
        (
            b"POST /small.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".to_vec(),
            405,
        ),
        (b"BREW /small.txt HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), 501),
        (long_header.into_bytes(), 431),
        (
            format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(9000)).into_bytes(),
            414,
        ),
        (
            b"GET /../etc/passwd HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(),
            403,
        ),
        (
            b"GET /%2e%2e/%2e%2e/etc/passwd HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                .to_vec(),
            403,
        ),
        (
            b"GET /pw HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(),
            403,
        ),
        (
            b"GET /up/etc/passwd HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(),
            403,
        ),
        (
            b"GET /up/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(),
            403,
        ),
        (
            b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(),
            404,
        ),
        (
            b"GET /dir/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(),
            403,
        ),
        (
            b"GET /small.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello".to_vec(),
            413,
        ),
    ];
    let passwd = std::fs::read("/etc/passwd").unwrap_or_default();
    for (req, want) in cases {
        let resp = raw(f.http, &req);
        assert_eq!(
            status_of(&resp),
            want,
            "{}",
            String::from_utf8_lossy(&req[..req.len().min(60)])
        );
        if !passwd.is_empty() {
            assert!(
                !resp
                    .windows(passwd.len().min(32))
                    .any(|w| w == &passwd[..passwd.len().min(32)])
            );
        }
        // Everyone else is still served.
        let (st, _, body) = get(&f, "/small.txt", &[]);
        assert_eq!(st, 200);
        assert!(body == pattern(1000, 1));
    }
}

#[test]
fn slowloris_is_cut_at_the_idle_limit_and_others_are_served() {
    let mut cfg = config();
    cfg.limits.idle_timeout_ms = 300;
    let f = start_with(cfg);
    let mut s = TcpStream::connect(f.http).unwrap();
    s.write_all(b"GET /small.txt HTTP/1.1\r\n").unwrap();
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    // Dribble one header byte at a time; the server must hang up (408) however long we go on.
    let mut got = Vec::new();
    let mut cut = false;
    for _ in 0..400 {
        if s.write_all(b"X").is_err() {
            cut = true;
            break;
        }
        let mut b = [0u8; 256];
        match s.read(&mut b) {
            Ok(0) => {
                cut = true;
                break;
            }
            Ok(n) => got.extend_from_slice(&b[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => {
                cut = true;
                break;
            }
        }
        // Meanwhile, a well-behaved client is served.
        if got.is_empty() {
            let (st, _, _) = get(&f, "/small.txt", &[]);
            assert_eq!(st, 200);
        }
    }
    assert!(cut || !got.is_empty(), "the slow client was never cut");
    if !got.is_empty() {
        assert_eq!(status_of(&got), 408);
    }
    // An idle keep-alive connection is cut too (read returns EOF).
    let mut idle = TcpStream::connect(f.http).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut b = [0u8; 16];
    // A close (EOF) or a reset is a cut; a read timeout is not (the server never cut it).
    match idle.read(&mut b) {
        Ok(0) => {}
        Ok(n) => panic!("an idle connection got {n} bytes: {:?}", &b[..n]),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the idle connection was not cut within 20 s: {e}"),
    }
}

#[test]
fn clients_vanishing_mid_body_leave_the_server_serving() {
    let f = start();
    for path in ["/big.bin", "/mid.bin"] {
        for _ in 0..5 {
            let mut s = TcpStream::connect(f.http).unwrap();
            s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                .unwrap();
            let mut b = [0u8; 4096];
            let _ = s.read(&mut b);
            // Reset, not a polite close: unread data makes close send RST.
            drop(s);
        }
    }
    let (st, _, body) = get(&f, "/big.bin", &[]);
    assert_eq!(st, 200);
    assert!(body == pattern(3 << 20, 3));
    // Every engine stream of a vanished client ends (bounded wait).
    let mut active = usize::MAX;
    for _ in 0..3000 {
        let m = String::from_utf8(get(&f, "/metrics", &[]).2).unwrap();
        active = m
            .lines()
            .find(|l| l.starts_with("penstock_streams_active "))
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(usize::MAX);
        if active == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(active, 0);
}

#[test]
fn rate_limit_per_location_still_delivers_exact_bytes() {
    let mut cfg = config();
    cfg.location.push(penstock_server::config::Location {
        prefix: "/mid".into(),
        class: Some("rt".into()),
        limit_rate_bytes_per_s: Some(2 << 20),
        limit_rate_after_bytes: Some(100 * 1024),
        cors_allow_origins: Vec::new(),
        ..Default::default()
    });
    let f = start_with(cfg);
    let (st, _, body) = get(&f, "/mid.bin", &[]);
    assert_eq!(st, 200);
    assert!(body == pattern(300 * 1024, 2));
    // The server counts a body once its last byte is handed to the kernel, which can be
    // just after the client has read it: poll (bounded) rather than race.
    let want = "penstock_http_body_bytes_total{class=\"rt\",data_path=\"sendfile\"} 307200";
    let mut m = String::new();
    for _ in 0..1000 {
        m = String::from_utf8(get(&f, "/metrics", &[]).2).unwrap();
        if m.contains(want) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(m.contains(want), "{m}");
}

#[test]
fn curl_resumes_with_c_dash() {
    if !penstock_testreq::require("curl") {
        return;
    }
    let out = std::process::Command::new("curl")
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    let f = start();
    let big = pattern(3 << 20, 3);
    let dst = f.path("resumed.bin");
    std::fs::write(&dst, &big[..1_234_567]).unwrap();
    let st = std::process::Command::new("curl")
        .args(["-s", "-f", "-C", "-", "-o"])
        .arg(&dst)
        .arg(f.url("/big.bin"))
        .status()
        .unwrap();
    assert!(st.success());
    assert!(std::fs::read(&dst).unwrap() == big);
}

/// Issue 20: a path ending in `/` names a directory. On a file (or a symlink to one) it is
/// 404, as in nginx, never the file's bytes; directories answer as before.
#[test]
fn trailing_slash_on_a_file_is_404() {
    let f = start();
    for p in [
        "/small.txt/",
        "/dir/x.html/",
        "/in/",
        "/small.txt/.",
        "/empty.txt/",
    ] {
        let (st, _, body) = get(&f, p, &[]);
        assert_eq!(st, 404, "{p}");
        assert!(body != pattern(1000, 1), "{p} sent the file");
    }
    assert_eq!(get(&f, "/small.txt", &[]).0, 200);
    assert_eq!(get(&f, "/dir/x.html", &[]).0, 200);
    // No index file in it: a directory is 403 (no listings); without its slash it is first
    // redirected to the slash form, the query kept.
    assert_eq!(get(&f, "/dir/", &[]).0, 403);
    let r = raw(
        f.http,
        b"GET /dir?a=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status_of(&r), 301);
    let head = String::from_utf8_lossy(&r);
    assert!(head.contains("\r\nLocation: /dir/?a=1\r\n"), "{head}");
    // With an index, `/dir/` serves it; `/dir/x.html/` stays 404.
    let mut cfg = config();
    cfg.http.index = Some("x.html".into());
    let f = start_with(cfg);
    let (st, _, body) = get(&f, "/dir/", &[]);
    assert_eq!((st, body.as_slice()), (200, &b"<p>x</p>"[..]));
    assert_eq!(get(&f, "/dir/x.html/", &[]).0, 404);
}

/// Issue 20: numerals too large for 64 bits are numbers (RFC 9110 §14.1.2): a huge last-pos
/// or suffix is clamped (206 with the remainder or the whole file), a huge first-pos is
/// unsatisfiable (416, `bytes */LEN`); an inverted range is invalid (§14.1.1) and ignored
/// (200) even when both ends are huge; a suffix of an empty file is ignored (200), not 416.
/// docs/http.md has the table beside nginx's answers.
#[test]
fn huge_and_edge_ranges_follow_rfc_9110() {
    let f = start();
    let small = pattern(1000, 1);
    let huge = "99999999999999999999999";
    for (range, want_st, want_cr, want_body) in [
        (
            format!("bytes=0-{huge}"),
            206,
            Some("bytes 0-999/1000"),
            &small[..],
        ),
        (
            format!("bytes=990-{huge}"),
            206,
            Some("bytes 990-999/1000"),
            &small[990..],
        ),
        (
            format!("bytes=-{huge}"),
            206,
            Some("bytes 0-999/1000"),
            &small[..],
        ),
        (format!("bytes={huge}-"), 416, Some("bytes */1000"), &[][..]),
        (
            format!("bytes=0-0,{huge}-"),
            206,
            Some("bytes 0-0/1000"),
            &small[..1],
        ),
        (
            "bytes=20000000000000000000000-10000000000000000000000".to_string(),
            200,
            None,
            &small[..],
        ),
    ] {
        let (st, hs, body) = get(&f, "/small.txt", &[("Range", &range)]);
        assert_eq!(st, want_st, "{range}");
        assert_eq!(header(&hs, "content-range"), want_cr, "{range}");
        if st != 416 {
            assert!(body == want_body, "{range}: body differs");
        }
    }
    for range in ["bytes=-1", "bytes=0-0,-1"] {
        let (st, hs, body) = get(&f, "/empty.txt", &[("Range", range)]);
        assert_eq!((st, body.len()), (200, 0), "{range}");
        assert_eq!(header(&hs, "content-range"), None, "{range}");
    }
    let (st, hs, _) = get(&f, "/empty.txt", &[("Range", "bytes=0-0")]);
    assert_eq!(st, 416);
    assert_eq!(header(&hs, "content-range"), Some("bytes */0"));
}

/// The sum of the OpenMetrics samples named `name` whose labels contain `label`.
fn metric_sum(f: &Fixture, name: &str, label: &str) -> u64 {
    let m = String::from_utf8(get(f, "/metrics", &[]).2).unwrap();
    m.lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Issue 20 (defect 5): engine `streams_max = 4`, `send_timeout` 1.5 s. Four clients GET a
/// 32 MiB file and never read: they hold the engine's four places. A fifth GET receives the
/// complete, byte-exact body (the loop sends it) or a 503 without a 200 head, never a 200 cut
/// short. At the timeout the server closes the four, and the engine's places are free again:
/// a new GET goes through the engine.
#[test]
fn engine_full_never_cuts_a_200_and_stalled_clients_are_cut_at_send_timeout() {
    const HUGE: usize = 32 << 20;
    const TIMEOUT: Duration = Duration::from_millis(1500);
    /// A generous upper bound on the cut, past the timeout (never a measurement).
    const BOUND: Duration = Duration::from_secs(20);
    let mut cfg = config();
    cfg.engine.streams_max = Some(4);
    cfg.limits.send_timeout_ms = TIMEOUT.as_millis() as u64;
    cfg.http.engine_body_bytes_min = 1 << 20;
    let f = start_with(cfg);
    let want = pattern(HUGE, 9);
    std::fs::write(f.path("huge.bin"), &want).unwrap();
    let request = b"GET /huge.bin HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

    let first_sent = std::time::Instant::now();
    let mut stalled = Vec::new();
    for i in 0..4 {
        let mut s = TcpStream::connect(f.http).unwrap();
        s.write_all(request).unwrap();
        // The head is out, so the engine place was reserved (before the head was made).
        let mut b = [0u8; 12];
        s.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"HTTP/1.1 200", "stalled client {i}");
        stalled.push(s);
    }

    // The fifth: a whole 200, or a 503 and nothing else.
    let mut s = TcpStream::connect(f.http).unwrap();
    s.set_read_timeout(Some(BOUND)).unwrap();
    s.write_all(request).unwrap();
    let mut resp = Vec::new();
    let mut b = [0u8; 1];
    s.read_exact(&mut b).unwrap();
    // No stream could have stalled yet if the head came before one timeout had passed since
    // the first request: then the engine was full for certain.
    let full_for_certain = first_sent.elapsed() < TIMEOUT;
    resp.push(b[0]);
    s.read_to_end(&mut resp).unwrap();
    let head_end = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete head")
        + 4;
    let head = String::from_utf8_lossy(&resp[..head_end]).to_string();
    let body = &resp[head_end..];
    match status_of(&resp) {
        200 => {
            assert!(
                head.contains(&format!("Content-Length: {HUGE}\r\n")),
                "{head}"
            );
            assert_eq!(body.len(), HUGE, "a 200 cut short: {head}");
            assert!(body == &want[..], "the 200's body differs");
        }
        503 => {
            assert!(head.contains("Retry-After:"), "{head}");
            assert!(body.is_empty(), "a 503 with a body");
        }
        other => panic!("fifth GET: {other}\n{head}"),
    }
    if full_for_certain {
        assert!(
            metric_sum(&f, "penstock_errors_total", "kind=\"engine_full\"") >= 1,
            "the engine was full but the fifth body was not counted as engine_full"
        );
    }

    // The four stalled clients are cut by the engine's progress timeout.
    let waited = std::time::Instant::now();
    while metric_sum(&f, "penstock_errors_total", "kind=\"send_timeout\"") < 4 {
        assert!(
            waited.elapsed() < TIMEOUT + BOUND,
            "the stalled clients were not cut"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for (i, mut s) in stalled.into_iter().enumerate() {
        // What the socket buffers held, then EOF (or a reset): never the whole body.
        s.set_read_timeout(Some(BOUND)).unwrap();
        let mut got = 0usize;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                Err(e) => panic!("stalled client {i}: {e} after {got} bytes (not closed)"),
            }
        }
        assert!(got < HUGE, "stalled client {i} got the whole body");
    }

    // The engine's places are free: a new large GET goes through the engine again.
    let before = metric_sum(
        &f,
        "penstock_http_requests_total",
        "data_path=\"engine-sendfile\"",
    );
    let (st, _, body) = get(&f, "/huge.bin", &[]);
    assert_eq!(st, 200);
    assert!(body == want, "the body after the cut differs");
    let after = metric_sum(
        &f,
        "penstock_http_requests_total",
        "data_path=\"engine-sendfile\"",
    );
    assert_eq!(
        after,
        before + 1,
        "the GET after the cut did not use the engine"
    );
}
