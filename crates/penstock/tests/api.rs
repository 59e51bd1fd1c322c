//! The operator's HTTP JSON API (issue 40, item 1; docs/api.md): the built binary serving
//! `[api] listen` on loopback, driven over real HTTP/1.1 connections, beside the control
//! protocol on its TCP port, a raw RTSP client and real TCP receivers.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_penstock");
const TOKEN: &str = "api-test-token-api-test-token";
/// The demo's 12-second H.264 + AAC clip (crates/penstock/assets/README.md).
const CLIP: &[u8] = include_bytes!("../assets/clip.ts");
/// Admission's figures set, never measured: the tests must not depend on a calibration.
const ADMISSION: &str = "[admission]\nself_calibrate = false\ndisk_seq_bytes_per_s = 1000000000\n\
     disk_random_iops = 100000\nnet_bytes_per_s = 1250000000\ncpu_send_ns = 5000\n\
     cpu_send_byte_ps = 500\n";

/// A running `penstock serve` with an API listener.
pub struct Served {
    child: Child,
    pub api: SocketAddr,
    pub control: String,
    pub rtsp: Option<SocketAddr>,
    pub dir: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let _ = self.child.wait();
    }
}

fn serve(rtsp: bool, extra: &str) -> Served {
    serve_at(rtsp, "127.0.0.1:0", "", extra, tempfile::tempdir().unwrap())
}

/// `[control]` lines added by [`serve_at`]'s `top` when it starts with this marker.
const CONTROL_MARK: &str = "#control\n";

/// [`serve`] with the API at `api_listen`, `top` before the sections (`[tls]`), in `dir`.
fn serve_at(
    rtsp: bool,
    api_listen: &str,
    top: &str,
    extra: &str,
    dir: tempfile::TempDir,
) -> Served {
    std::fs::write(dir.path().join("clip.ts"), CLIP).unwrap();
    std::fs::write(dir.path().join("a.bin"), vec![7u8; 256 * 1024]).unwrap();
    let conf = dir.path().join("penstock.toml");
    let rtsp_listen = if rtsp { "127.0.0.1:0" } else { "" };
    let (top, control_extra) = match top.strip_prefix(CONTROL_MARK) {
        Some(c) => ("", c),
        None => (top, ""),
    };
    std::fs::write(
        &conf,
        format!(
            "{top}[http]\nlisten = \"127.0.0.1:0\"\n[control]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n{control_extra}\
             [log]\naccess = \"off\"\n[rtsp]\nlisten = \"{rtsp_listen}\"\n[api]\nlisten = \"{api_listen}\"\n\
             overview_interval_ms = 250\n{extra}{ADMISSION}"
        ),
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--no-control-unix", "--config"])
        .arg(&conf)
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let line = common::start_line(&mut child);
    let (_, control) = common::serve_addresses(&line);
    let api = line
        .split(", api ")
        .nth(1)
        .and_then(|r| r.split("://").nth(1))
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("no api address in {line:?}"))
        .parse()
        .unwrap();
    let rtsp = line
        .split("rtsp://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .map(|a| a.parse().unwrap());
    Served {
        child,
        api,
        control: control.expect("a control address"),
        rtsp,
        dir,
    }
}

/// One HTTP/1.1 exchange (`Connection: close`): status, head, body.
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (n, v) in headers {
        req += &format!("{n}: {v}\r\n");
    }
    req += "\r\n";
    req += body;
    s.write_all(req.as_bytes()).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    (status, head.to_string(), body.to_string())
}

const BEARER: &str = "Bearer api-test-token-api-test-token";

/// An authenticated call: status and JSON body.
pub fn call(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    let (status, _, b) = http(addr, method, path, &[("Authorization", BEARER)], body);
    let v = serde_json::from_str(&b).unwrap_or_else(|e| panic!("{method} {path}: {e}: {b:?}"));
    (status, v)
}

/// A control protocol connection after `AUTH`.
struct Control {
    r: BufReader<TcpStream>,
}

impl Control {
    fn connect(addr: &str) -> Control {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut c = Control {
            r: BufReader::new(s),
        };
        let (code, _) = c.cmd(&format!("AUTH {TOKEN}"));
        assert_eq!(code, 200);
        c
    }

    /// The reply's code and final text.
    fn cmd(&mut self, line: &str) -> (u16, String) {
        self.r
            .get_mut()
            .write_all(format!("{line}\n").as_bytes())
            .unwrap();
        loop {
            let mut l = String::new();
            assert!(self.r.read_line(&mut l).unwrap() > 0, "control closed");
            let l = l.trim_end();
            if l.len() >= 4 && l.as_bytes()[3] == b' ' {
                return (l[..3].parse().unwrap(), l[4..].to_string());
            }
        }
    }
}

/// Reads server-sent events from `/api/v1/events` until `done` says so or `deadline`.
fn watch_events(
    addr: SocketAddr,
    deadline: Duration,
    mut done: impl FnMut(&str, &serde_json::Value) -> bool,
) -> bool {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    s.write_all(
        format!("GET /api/v1/events HTTP/1.1\r\nHost: {addr}\r\nAuthorization: {BEARER}\r\n\r\n")
            .as_bytes(),
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let t0 = Instant::now();
    let (mut name, mut data) = (String::new(), String::new());
    let mut status_seen = false;
    while t0.elapsed() < deadline {
        let mut l = String::new();
        match r.read_line(&mut l) {
            Ok(0) => return false,
            Ok(_) => {}
            Err(_) => continue,
        }
        let l = l.trim_end_matches(['\r', '\n']);
        if !status_seen {
            assert!(l.starts_with("HTTP/1.1 200"), "events: {l}");
            status_seen = true;
        } else if let Some(n) = l.strip_prefix("event: ") {
            name = n.to_string();
        } else if let Some(d) = l.strip_prefix("data: ") {
            data.push_str(d);
        } else if l.is_empty() && !data.is_empty() {
            let v: serde_json::Value = serde_json::from_str(&data).unwrap();
            if done(&name, &v) {
                return true;
            }
            data.clear();
        }
    }
    false
}

/// Open a stream through the API, start it, and watch it finish by SSE; the receiver gets
/// every byte.
#[test]
fn a_stream_opened_through_the_api_is_seen_finishing_by_sse() {
    let s = serve(false, "");
    let rx = TcpListener::bind("127.0.0.1:0").unwrap();
    let rx_addr = rx.local_addr().unwrap();
    let receiver = std::thread::spawn(move || {
        let (mut c, _) = rx.accept().unwrap();
        let mut v = Vec::new();
        c.read_to_end(&mut v).unwrap();
        v.len()
    });
    let src = s.dir.path().join("a.bin");
    let (status, opened) = call(
        s.api,
        "POST",
        "/api/v1/streams",
        &format!(
            r#"{{"src":"file:{}","dst":"tcp://{rx_addr}","rate":"512KB/s","unit":"16KiB"}}"#,
            src.display()
        ),
    );
    assert_eq!(status, 201, "{opened}");
    let id = opened["id"].as_u64().unwrap().to_string();
    assert_eq!(
        opened["text"].as_str().unwrap().split(' ').next(),
        Some(&*id)
    );
    let (status, listed) = call(s.api, "GET", "/api/v1/streams", "");
    assert_eq!(status, 200);
    assert!(
        listed.as_array().unwrap().iter().any(|v| v["id"] == *id),
        "{listed}"
    );
    // The watcher connects first, then the stream starts: the events carry the change.
    let api = s.api;
    let want = id.clone();
    let (connected, is_connected) = std::sync::mpsc::channel();
    let watcher = std::thread::spawn(move || {
        let mut states = Vec::new();
        let finished = watch_events(api, Duration::from_secs(30), |name, v| {
            if name == "overview" {
                let _ = connected.send(());
            }
            if name == "state" && v["id"] == *want {
                states.push(v["state"].as_str().unwrap_or("").to_string());
            }
            states.last().is_some_and(|s| s == "done")
        });
        (finished, states)
    });
    // Started once the watcher reads events (its first is the overview).
    is_connected
        .recv_timeout(Duration::from_secs(20))
        .expect("no overview event");
    let (status, started) = call(s.api, "POST", &format!("/api/v1/streams/{id}/start"), "");
    assert_eq!((status, started["text"].as_str()), (200, Some("started")));
    let (finished, states) = watcher.join().unwrap();
    assert!(finished, "no `done` state event: saw {states:?}");
    assert_eq!(receiver.join().unwrap(), 256 * 1024);
    let (status, st) = call(s.api, "GET", &format!("/api/v1/streams/{id}"), "");
    assert_eq!(status, 200);
    assert_eq!(st["state"], "done");
    assert_eq!(st["sent"], 256 * 1024);
    assert!(st["lateness"]["units"].as_u64().unwrap() >= 16, "{st}");
    // Closed through the API: gone from the list.
    let (status, closed) = call(s.api, "DELETE", &format!("/api/v1/streams/{id}"), "");
    assert_eq!(status, 200, "{closed}");
}

/// Unauthenticated or wrongly authenticated calls get 401 on every route that needs the
/// token; a foreign Origin gets 403 even with the token; the listener's own Origin passes.
#[test]
fn calls_without_the_token_get_401_and_foreign_origins_403() {
    let s = serve(false, "");
    let (_, _, doc) = http(s.api, "GET", "/api/openapi.json", &[], "");
    let doc: serde_json::Value = serde_json::from_str(&doc).unwrap();
    let mut checked = 0;
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            if op["security"].as_array().is_some_and(|a| a.is_empty()) {
                continue;
            }
            let path = path.replace("{id}", "1");
            let m = method.to_uppercase();
            for auth in [None, Some("Bearer wrong"), Some("Basic YTpi")] {
                let headers: Vec<(&str, &str)> =
                    auth.map(|a| vec![("Authorization", a)]).unwrap_or_default();
                let (status, head, _) = http(s.api, &m, &path, &headers, "");
                assert_eq!(status, 401, "{m} {path} with {auth:?}");
                assert!(head.contains("WWW-Authenticate: Bearer"), "{head}");
                checked += 1;
            }
        }
    }
    assert!(checked >= 3 * 20, "{checked} calls");
    let own = format!("http://{}", s.api);
    for (origin, want) in [
        ("http://evil.example", 403),
        ("null", 403),
        (own.as_str(), 200),
    ] {
        let (status, _, body) = http(
            s.api,
            "GET",
            "/api/v1/streams",
            &[("Authorization", BEARER), ("Origin", origin)],
            "",
        );
        assert_eq!(status, want, "Origin {origin}: {body}");
    }
    // A cross-site POST that would open a stream changes nothing.
    let (status, _, _) = http(
        s.api,
        "POST",
        "/api/v1/streams",
        &[("Authorization", BEARER), ("Origin", "http://evil.example")],
        r#"{"src":"file:/x","dst":"tcp://127.0.0.1:9"}"#,
    );
    assert_eq!(status, 403);
    let (_, listed) = call(s.api, "GET", "/api/v1/streams", "");
    assert_eq!(listed, serde_json::json!([]));
}

/// A refusal's text without the one figure that moves between two sends: how long ago a
/// start time was (`that was 817530635417.134 ms ago`).
fn timeless(text: &str) -> String {
    match (text.find("that was "), text.find(" ms ago")) {
        (Some(a), Some(b)) if a < b => format!("{}that was … ms ago{}", &text[..a], &text[b + 7..]),
        _ => text.to_string(),
    }
}

/// The control protocol's bad input, sent both ways: the API's refusal has the same code
/// and the same text, and nothing else changes.
#[test]
fn refusals_carry_the_control_protocols_reasons() {
    let s = serve(false, "");
    let mut c = Control::connect(&s.control);
    let root = s.dir.path().display().to_string();
    let a = format!("file:{root}/a.bin");
    // One pending stream, opened on the control port, for the state refusals.
    let (code, text) = c.cmd(&format!("OPEN {a} tcp://127.0.0.1:9 DETACHED"));
    assert_eq!(code, 201, "{text}");
    let pending = text.split(' ').next().unwrap().to_string();
    let table: Vec<(String, &str, String, String)> = vec![
        (
            "OPEN file:/etc/passwd tcp://127.0.0.1:9".into(),
            "POST",
            "/api/v1/streams".into(),
            r#"{"src":"file:/etc/passwd","dst":"tcp://127.0.0.1:9"}"#.into(),
        ),
        (
            format!("OPEN {a} tcp://127.0.0.1:9 rate=fast"),
            "POST",
            "/api/v1/streams".into(),
            format!(r#"{{"src":"{a}","dst":"tcp://127.0.0.1:9","rate":"fast"}}"#),
        ),
        (
            format!("OPEN {a} tcp://127.0.0.1:9 buffers=many"),
            "POST",
            "/api/v1/streams".into(),
            format!(r#"{{"src":"{a}","dst":"tcp://127.0.0.1:9","buffers":"many"}}"#),
        ),
        (
            format!("OPEN {a} tcp://127.0.0.1:9 unit=0"),
            "POST",
            "/api/v1/streams".into(),
            format!(r#"{{"src":"{a}","dst":"tcp://127.0.0.1:9","unit":0}}"#),
        ),
        (
            format!("OPEN {a} tcp://127.0.0.1:9 late=never"),
            "POST",
            "/api/v1/streams".into(),
            format!(r#"{{"src":"{a}","dst":"tcp://127.0.0.1:9","late":"never"}}"#),
        ),
        (
            format!("OPEN {a} gopher://127.0.0.1:9"),
            "POST",
            "/api/v1/streams".into(),
            format!(r#"{{"src":"{a}","dst":"gopher://127.0.0.1:9"}}"#),
        ),
        (
            format!("OPEN {a} tcp://127.0.0.1:9 rate=1TB/s class=rt"),
            "POST",
            "/api/v1/streams".into(),
            format!(r#"{{"src":"{a}","dst":"tcp://127.0.0.1:9","rate":"1TB/s","class":"rt"}}"#),
        ),
        (
            "START 999999".into(),
            "POST",
            "/api/v1/streams/999999/start".into(),
            String::new(),
        ),
        (
            "START abc".into(),
            "POST",
            "/api/v1/streams/abc/start".into(),
            String::new(),
        ),
        (
            format!("START {pending} AT yesterday"),
            "POST",
            format!("/api/v1/streams/{pending}/start"),
            r#"{"at":"yesterday"}"#.into(),
        ),
        (
            format!("START {pending} AT 2001-01-01T00:00:00Z"),
            "POST",
            format!("/api/v1/streams/{pending}/start"),
            r#"{"at":"2001-01-01T00:00:00Z"}"#.into(),
        ),
        (
            format!("PAUSE {pending}"),
            "POST",
            format!("/api/v1/streams/{pending}/pause"),
            String::new(),
        ),
        (
            format!("RESUME {pending}"),
            "POST",
            format!("/api/v1/streams/{pending}/resume"),
            String::new(),
        ),
        (
            "SEEK 999999 10".into(),
            "POST",
            "/api/v1/streams/999999/seek".into(),
            r#"{"offset":10}"#.into(),
        ),
        (
            format!("SEEK {pending} lots"),
            "POST",
            format!("/api/v1/streams/{pending}/seek"),
            r#"{"offset":"lots"}"#.into(),
        ),
        (
            "CLOSE 999999".into(),
            "DELETE",
            "/api/v1/streams/999999".into(),
            String::new(),
        ),
        (
            "TUNE disk inflight=0".into(),
            "POST",
            "/api/v1/tune/disk".into(),
            r#"{"inflight":0}"#.into(),
        ),
        (
            "TUNE disk rt_quantum=1".into(),
            "POST",
            "/api/v1/tune/disk".into(),
            r#"{"rt_quantum":1}"#.into(),
        ),
    ];
    let before = c.cmd("TUNE disk");
    for (line, method, path, body) in &table {
        let (code, text) = c.cmd(line);
        assert!(
            code >= 400,
            "{line}: {code} {text} (the table is of refusals)"
        );
        let (status, v) = call(s.api, method, path, body);
        assert_eq!(
            (status, v["code"].as_u64(), v["text"].as_str().map(timeless)),
            (code, Some(u64::from(code)), Some(timeless(&text))),
            "{line} vs {method} {path} {body}"
        );
    }
    // Nothing changed: the one pending stream, the disk settings.
    let (_, listed) = call(s.api, "GET", "/api/v1/streams", "");
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["state"], "pending");
    assert_eq!(c.cmd("TUNE disk"), before);
    // The refusals are listed, newest first, with their reasons.
    let (_, refusals) = call(s.api, "GET", "/api/v1/refusals", "");
    assert_eq!(refusals[0]["verb"], "TUNE", "{refusals}");
    assert!(
        refusals
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["text"].as_str().unwrap().contains("/etc/passwd")),
        "{refusals}"
    );
    // The API's own refusals: JSON that is not one word per value is never made a line.
    let (status, v) = call(
        s.api,
        "POST",
        "/api/v1/streams",
        &format!(r#"{{"src":"{a}","dst":"tcp://127.0.0.1:9 DETACHED"}}"#),
    );
    assert_eq!(status, 400, "{v}");
    let (status, _) = call(s.api, "POST", "/api/v1/streams", "{not json");
    assert_eq!(status, 400);
}

/// A raw RTSP client's session is listed and kicked through the API: gone from the list,
/// and its next request is answered 454 (Session Not Found).
#[test]
fn an_rtsp_session_is_kicked_through_the_api() {
    let s = serve(true, "");
    let rtsp = s.rtsp.expect("an rtsp address");
    let url = format!("rtsp://{rtsp}/clip.ts");
    let rtp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = rtp.local_addr().unwrap().port();
    let mut c = TcpStream::connect(rtsp).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut cseq = 0;
    let mut req = |c: &mut TcpStream, method: &str, url: &str, extra: &str| -> String {
        cseq += 1;
        c.write_all(format!("{method} {url} RTSP/1.0\r\nCSeq: {cseq}\r\n{extra}\r\n").as_bytes())
            .unwrap();
        let mut buf = Vec::new();
        let mut b = [0u8; 4096];
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("Content-Length: "))
                    .map_or(0, |v| v.trim().parse().unwrap());
                while buf.len() < end + 4 + len {
                    let n = c.read(&mut b).unwrap();
                    buf.extend_from_slice(&b[..n]);
                }
                return head;
            }
            let n = c.read(&mut b).unwrap();
            assert!(n > 0, "the RTSP server closed");
            buf.extend_from_slice(&b[..n]);
        }
    };
    let setup = req(
        &mut c,
        "SETUP",
        &format!("{url}/trackID=0"),
        &format!(
            "Transport: RTP/AVP;unicast;client_port={port}-{}\r\n",
            port + 1
        ),
    );
    assert!(setup.starts_with("RTSP/1.0 200"), "{setup}");
    let session = setup
        .lines()
        .find_map(|l| l.strip_prefix("Session: "))
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .trim()
        .to_string();
    let play = req(&mut c, "PLAY", &url, &format!("Session: {session}\r\n"));
    assert!(play.starts_with("RTSP/1.0 200"), "{play}");
    rtp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 2048];
    assert!(rtp.recv(&mut b).is_ok(), "no RTP packet while playing");
    let (status, list) = call(s.api, "GET", "/api/v1/sessions/rtsp", "");
    assert_eq!(status, 200);
    let listed = list.as_array().unwrap();
    assert_eq!(listed.len(), 1, "{list}");
    assert_eq!(listed[0]["id"], format!("rtsp-{session}"));
    assert_eq!(listed[0]["state"], "running");
    let (status, v) = call(
        s.api,
        "DELETE",
        &format!("/api/v1/sessions/rtsp/rtsp-{session}"),
        "",
    );
    assert_eq!(status, 200, "{v}");
    let (_, list) = call(s.api, "GET", "/api/v1/sessions/rtsp", "");
    assert_eq!(list, serde_json::json!([]));
    let again = req(&mut c, "PLAY", &url, &format!("Session: {session}\r\n"));
    assert!(again.starts_with("RTSP/1.0 454"), "{again}");
    // A second kick finds nothing.
    let (status, _) = call(
        s.api,
        "DELETE",
        &format!("/api/v1/sessions/rtsp/rtsp-{session}"),
        "",
    );
    assert_eq!(status, 404);
}

fn validator() -> Option<String> {
    let ok = Command::new("openapi-spec-validator")
        .arg("--help")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok.then(|| "openapi-spec-validator".to_string())
}

/// The document validates (openapi-spec-validator from PyPI, installed by .ci/run), and it
/// and the router agree: every documented method and path is routed, every other method
/// on a documented path is a 405, and undocumented paths are 404s.
#[test]
fn the_openapi_document_validates_and_matches_the_router() {
    let s = serve(true, "");
    let (status, _, body) = http(s.api, "GET", "/api/openapi.json", &[], "");
    assert_eq!(status, 200);
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    let file = s.dir.path().join("openapi.json");
    std::fs::write(&file, &body).unwrap();
    let v = validator().expect(
        "openapi-spec-validator is missing: pip install openapi-spec-validator (.ci/run does)",
    );
    let out = Command::new(v).arg(&file).output().unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut routed = 0;
    for (path, ops) in doc["paths"].as_object().unwrap() {
        let concrete = path.replace("{id}", "999999");
        let ops = ops.as_object().unwrap();
        for method in ["GET", "POST", "DELETE", "PUT", "PATCH"] {
            let documented = ops.contains_key(&method.to_lowercase());
            if method == "GET" && path == "/api/v1/events" {
                // A stream: its status line is enough.
                let mut c = TcpStream::connect(s.api).unwrap();
                c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                c.write_all(
                    format!("GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {BEARER}\r\n\r\n")
                        .as_bytes(),
                )
                .unwrap();
                let mut line = String::new();
                BufReader::new(c).read_line(&mut line).unwrap();
                assert!(line.starts_with("HTTP/1.1 200"), "{line}");
                routed += 1;
                continue;
            }
            let (status, _, body) =
                http(s.api, method, &concrete, &[("Authorization", BEARER)], "");
            if documented {
                assert!(
                    status != 405 && !body.contains("no such route"),
                    "{method} {path} is documented but not routed: {status} {body}"
                );
                routed += 1;
            } else {
                assert_eq!(status, 405, "{method} {path} is not documented: {body}");
            }
        }
    }
    let documented: usize = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .map(|o| o.as_object().unwrap().len())
        .sum();
    assert_eq!(routed, documented);
    for path in [
        "/api/v1/nope",
        "/api/v2/streams",
        "/api/v1/streams/1/2/3",
        "/index.html",
    ] {
        let (status, _, body) = http(s.api, "GET", path, &[("Authorization", BEARER)], "");
        assert_eq!(status, 404, "{path}: {body}");
        assert!(body.contains("no such route"), "{body}");
    }
}

/// The limits: a request larger than `request_bytes_max` is refused, and event streams
/// beyond `sse_max` get 503 while the others stay open.
#[test]
fn requests_and_event_streams_are_limited() {
    let s = serve(false, "sse_max = 2\nrequest_bytes_max = 4096\n");
    let big = "x".repeat(8000);
    let (status, _, _) = http(
        s.api,
        "POST",
        "/api/v1/streams",
        &[("Authorization", BEARER)],
        &big,
    );
    assert_eq!(status, 413);
    let open = || {
        let mut c = TcpStream::connect(s.api).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(
            format!("GET /api/v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: {BEARER}\r\n\r\n")
                .as_bytes(),
        )
        .unwrap();
        let mut r = BufReader::new(c);
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        (line, r)
    };
    let (a, _ka) = open();
    let (b, _kb) = open();
    let (c, _) = open();
    assert!(
        a.starts_with("HTTP/1.1 200") && b.starts_with("HTTP/1.1 200"),
        "{a}{b}"
    );
    assert!(c.starts_with("HTTP/1.1 503"), "{c}");
}

/// Sets up and plays one RTSP session over UDP (nobody reads the packets: the kernel drops
/// them); returns its control connection, which keeps it.
fn rtsp_session(rtsp: SocketAddr, rtp: &UdpSocket) -> TcpStream {
    let port = rtp.local_addr().unwrap().port();
    let mut c = TcpStream::connect(rtsp).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let read_head = |c: &mut TcpStream| {
        let mut buf = Vec::new();
        let mut b = [0u8; 1];
        while !buf.ends_with(b"\r\n\r\n") {
            assert_eq!(c.read(&mut b).unwrap(), 1, "the RTSP server closed");
            buf.push(b[0]);
        }
        String::from_utf8_lossy(&buf).into_owned()
    };
    let url = format!("rtsp://{rtsp}/clip.ts");
    c.write_all(
        format!(
            "SETUP {url}/trackID=0 RTSP/1.0\r\nCSeq: 1\r\nTransport: RTP/AVP;unicast;client_port={port}-{}\r\n\r\n",
            port + 1
        )
        .as_bytes(),
    )
    .unwrap();
    let setup = read_head(&mut c);
    assert!(setup.starts_with("RTSP/1.0 200"), "{setup}");
    let session = setup
        .lines()
        .find_map(|l| l.strip_prefix("Session: "))
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .trim()
        .to_string();
    c.write_all(format!("PLAY {url} RTSP/1.0\r\nCSeq: 2\r\nSession: {session}\r\n\r\n").as_bytes())
        .unwrap();
    let play = read_head(&mut c);
    assert!(play.starts_with("RTSP/1.0 200"), "{play}");
    c
}

/// The dashboard in headless Chromium with 50 paced streams, 5 RTSP sessions and a bulk
/// transfer running: its lateness plots move (their data differ between two screenshots 2 s
/// apart), every stream and session is shown, and the page asks nothing of any other host.
/// The screenshots are left in the test's output directory (printed).
#[test]
fn the_dashboard_shows_live_figures_in_chromium() {
    let Some(player) = penstock_testreq::require_browser_player() else {
        return;
    };
    let s = serve(true, "");
    let big = s.dir.path().join("big.bin");
    std::fs::write(&big, vec![1u8; 2 * 1024 * 1024]).unwrap();
    // One receiver for every stream: each connection drained on its own thread.
    let rx = TcpListener::bind("127.0.0.1:0").unwrap();
    let rx_addr = rx.local_addr().unwrap();
    std::thread::spawn(move || {
        for c in rx.incoming() {
            let Ok(mut c) = c else { return };
            std::thread::spawn(move || {
                let mut b = [0u8; 65536];
                while c.read(&mut b).is_ok_and(|n| n > 0) {}
            });
        }
    });
    let mut c = Control::connect(&s.control);
    for i in 0..50 {
        let (code, text) = c.cmd(&format!(
            "OPEN file:{} tcp://{rx_addr} rate=48KB/s unit=4KiB DETACHED",
            big.display()
        ));
        assert_eq!(code, 201, "stream {i}: {text}");
        let id = text.split(' ').next().unwrap();
        assert_eq!(c.cmd(&format!("START {id}")).0, 200);
    }
    // The bulk transfer: an unpaced stream of 256 MiB (a sparse file) beside them.
    let bulk = s.dir.path().join("bulk.bin");
    std::fs::File::create(&bulk)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    let (code, text) = c.cmd(&format!(
        "OPEN file:{} tcp://{rx_addr} class=bulk DETACHED",
        bulk.display()
    ));
    assert_eq!(code, 201, "{text}");
    let id = text.split(' ').next().unwrap();
    assert_eq!(c.cmd(&format!("START {id}")).0, 200);
    let rtsp = s.rtsp.unwrap();
    let sockets: Vec<UdpSocket> = (0..5)
        .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    let _sessions: Vec<TcpStream> = sockets.iter().map(|u| rtsp_session(rtsp, u)).collect();
    let out = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("api-dashboard-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    let origin = format!("http://{}", s.api);
    let (line, err, _) = penstock_testreq::run_browser_player(
        &player,
        "dashboard.mjs",
        &format!("{origin}/"),
        &[],
        &[
            ("TOKEN", TOKEN),
            ("OUT_DIR", out.to_str().unwrap()),
            ("MIN_STREAMS", "50"),
            ("MIN_SESSIONS", "5"),
        ],
        "api-dashboard",
    );
    let r: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}\n{err}"));
    assert_eq!(r["ok"], true, "{line}\n{err}");
    for shot in r["shots"].as_array().unwrap() {
        let p = Path::new(shot.as_str().unwrap());
        assert!(
            std::fs::metadata(p).unwrap().len() > 10_000,
            "{}",
            p.display()
        );
        println!("screenshot: {}", p.display());
    }
    let (first, second) = (&r["first"], &r["second"]);
    // 50 paced streams and the bulk one.
    assert!(first["plots"].as_object().unwrap().len() >= 51, "{first}");
    assert!(second["sessions"].as_u64().unwrap() >= 5, "{second}");
    assert_ne!(
        first["plots"], second["plots"],
        "the lateness plots did not move in 2 s"
    );
    assert_ne!(first["points"], second["points"]);
    let changed = first["plots"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(id, v)| second["plots"][id.as_str()] != **v)
        .count();
    assert!(changed >= 50, "{changed} plots of 51 changed");
    // New lateness figures arrived between the two: samples added after the first shot,
    // non-zero for the streams that send (a paced unit is never exactly on time here).
    let samples = |v: &serde_json::Value| -> Vec<u64> {
        v.as_str()
            .unwrap_or("")
            .split(',')
            .filter_map(|x| x.parse().ok())
            .collect()
    };
    let live = first["plots"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(id, v)| {
            let (a, b) = (samples(v), samples(&second["plots"][id.as_str()]));
            b.len() > a.len() && b[a.len()..].iter().any(|&x| x > 0)
        })
        .count();
    assert!(
        live >= 25,
        "only {live} plots got new non-zero lateness samples"
    );
    for label in ["disk time", "network", "CPU", "buffers"] {
        assert!(
            first["meters"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m == label),
            "no {label} bar: {first}"
        );
    }
    assert!(
        first["queues"].as_str().unwrap().contains("rt queue"),
        "{first}"
    );
    assert_eq!(first["unlabelled"], 0, "controls or plots without a label");
    let requests = r["requests"].as_array().unwrap();
    assert!(requests.len() >= 4, "{requests:?}");
    for u in requests {
        assert!(
            u.as_str().unwrap().starts_with(&format!("{origin}/")),
            "a request left the API listener: {u}"
        );
    }
}

/// `https://` with the `[tls]` certificates: curl with the test CA gets JSON with the token
/// and 401 without; plain HTTP to the TLS port gets no answer.
#[test]
fn an_https_listener_serves_the_api_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    common::make_ca(dir.path());
    let (cert, key) = common::make_cert(dir.path(), "srv", "penstock-api-test");
    let top = format!(
        "[[tls.certificates]]\ncert = \"{}\"\nkey = \"{}\"\n",
        cert.display(),
        key.display()
    );
    let ca = dir.path().join("ca.pem");
    let s = serve_at(false, "https://127.0.0.1:0", &top, "", dir);
    let url = format!("https://localhost:{}/api/v1/streams", s.api.port());
    let curl = |args: &[&str]| {
        let o = Command::new("curl")
            .args(["-sS", "--max-time", "20", "--cacert"])
            .arg(&ca)
            .args(args)
            .arg(&url)
            .output()
            .expect("curl");
        (
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (out, err) = curl(&[
        "-w",
        "\n%{http_code}",
        "-H",
        &format!("Authorization: {BEARER}"),
    ]);
    assert!(
        out.ends_with("\n200") && out.starts_with("[]"),
        "{out}{err}"
    );
    let own = format!("Origin: https://localhost:{}", s.api.port());
    let (out, err) = curl(&[
        "-w",
        "\n%{http_code}",
        "-H",
        &format!("Authorization: {BEARER}"),
        "-H",
        &own,
    ]);
    assert!(out.ends_with("\n200"), "{out}{err}");
    let (out, err) = curl(&["-o", "/dev/null", "-w", "%{http_code}"]);
    assert_eq!(out, "401", "{err}");
    // Plain HTTP on the TLS port: no HTTP answer.
    let (status, _, _) = {
        let mut c = TcpStream::connect(s.api).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(b"GET /api/v1/streams HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut v = Vec::new();
        let _ = c.read_to_end(&mut v);
        (
            String::from_utf8_lossy(&v).starts_with("HTTP/1.1 200"),
            (),
            (),
        )
    };
    assert!(!status, "plain HTTP was answered on the TLS listener");
}

/// `penstock serve --api ADDR` without an `[api]` section: the start line names the API and
/// the dashboard is served; without the flag there is no API listener.
#[test]
fn the_api_flag_opens_the_listener() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("penstock.toml");
    std::fs::write(
        &conf,
        format!(
            "[http]\nlisten = \"127.0.0.1:0\"\n[control]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n\
             [log]\naccess = \"off\"\n[rtsp]\nlisten = \"\"\n{ADMISSION}"
        ),
    )
    .unwrap();
    let start = |api: Option<&str>| {
        let mut cmd = Command::new(BIN);
        cmd.args(["serve", "--no-control-unix", "--config"])
            .arg(&conf)
            .arg(dir.path());
        if let Some(a) = api {
            cmd.args(["--api", a]);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let line = common::start_line(&mut child);
        let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
        (line, child, pid)
    };
    let (line, mut child, pid) = start(Some("127.0.0.1:0"));
    let api: SocketAddr = line
        .split(", api http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("no api in {line:?}"))
        .parse()
        .unwrap();
    let (status, head, body) = http(api, "GET", "/", &[], "");
    assert_eq!(status, 200);
    assert!(
        head.contains("text/html") && body.contains("penstock dashboard"),
        "{head}"
    );
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    let _ = child.wait();
    let (line, mut child, pid) = start(None);
    assert!(!line.contains(", api "), "{line}");
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    let _ = child.wait();
}

/// The success case of each acting and reading endpoint: pause, resume, seek and close a
/// stream, `TUNE disk` asked and changed, the recordings' directory listed, the overview,
/// HLS sessions (none) and volumes (none configured) read.
#[test]
fn every_endpoint_answers_its_success_case() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("rec");
    std::fs::create_dir(&rec).unwrap();
    std::fs::write(rec.join("one.ts"), vec![0x47u8; 1880]).unwrap();
    let top = format!("{CONTROL_MARK}write_roots = [\"{}\"]\n", rec.display());
    let s = serve_at(false, "127.0.0.1:0", &top, "", dir);
    let rx = TcpListener::bind("127.0.0.1:0").unwrap();
    let rx_addr = rx.local_addr().unwrap();
    std::thread::spawn(move || {
        for c in rx.incoming() {
            let Ok(mut c) = c else { return };
            std::thread::spawn(move || {
                let mut b = [0u8; 65536];
                while c.read(&mut b).is_ok_and(|n| n > 0) {}
            });
        }
    });
    let a = s.dir.path().join("a.bin");
    let open = |extra: &str| {
        let (status, v) = call(
            s.api,
            "POST",
            "/api/v1/streams",
            &format!(
                r#"{{"src":"file:{}","dst":"tcp://{rx_addr}","rate":"16KB/s","unit":"4KiB"{extra}}}"#,
                a.display()
            ),
        );
        assert_eq!(status, 201, "{v}");
        v["id"].as_u64().unwrap()
    };
    let id = open("");
    let (status, v) = call(
        s.api,
        "POST",
        &format!("/api/v1/streams/{id}/seek"),
        r#"{"offset":"8KiB"}"#,
    );
    assert_eq!(status, 200, "{v}");
    let (_, st) = call(s.api, "GET", &format!("/api/v1/streams/{id}"), "");
    assert_eq!(st["offset"], 8192, "{st}");
    let (status, v) = call(
        s.api,
        "POST",
        &format!("/api/v1/streams/{id}/start"),
        r#"{"at":"+1ms"}"#,
    );
    assert_eq!(status, 200, "{v}");
    // Running, then paused and resumed: polled, each within a bounded deadline.
    let wait_state = |want: &str| {
        let t0 = Instant::now();
        loop {
            let (_, st) = call(s.api, "GET", &format!("/api/v1/streams/{id}"), "");
            if st["state"] == want {
                return st;
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "never {want}: {st}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_state("running");
    let (status, v) = call(s.api, "POST", &format!("/api/v1/streams/{id}/pause"), "");
    assert_eq!(status, 200, "{v}");
    wait_state("paused");
    let (status, v) = call(s.api, "POST", &format!("/api/v1/streams/{id}/resume"), "");
    assert_eq!(status, 200, "{v}");
    wait_state("running");
    let (status, v) = call(s.api, "DELETE", &format!("/api/v1/streams/{id}?now=1"), "");
    assert_eq!(status, 200, "{v}");
    let (_, listed) = call(s.api, "GET", "/api/v1/streams", "");
    assert!(
        !listed
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["id"].as_str() == Some(id.to_string().as_str())),
        "{listed}"
    );
    let (status, t) = call(s.api, "GET", "/api/v1/tune/disk", "");
    assert_eq!(status, 200);
    assert!(
        t["text"].as_str().unwrap().starts_with("disk rt_quantum="),
        "{t}"
    );
    let (status, t2) = call(s.api, "POST", "/api/v1/tune/disk", r#"{"inflight":5}"#);
    assert_eq!(status, 200, "{t2}");
    assert!(t2["text"].as_str().unwrap().ends_with("inflight=5"), "{t2}");
    let (status, recs) = call(s.api, "GET", "/api/v1/recordings", "");
    assert_eq!(status, 200);
    assert_eq!(recs[0]["bytes"], 1880, "{recs}");
    assert!(recs[0]["path"].as_str().unwrap().ends_with("rec/one.ts"));
    let (status, hls) = call(s.api, "GET", "/api/v1/sessions/hls", "");
    assert_eq!((status, hls), (200, serde_json::json!([])));
    let (status, _) = call(s.api, "DELETE", "/api/v1/sessions/hls/hls-nobody", "");
    assert_eq!(status, 404);
    let (status, vols) = call(s.api, "GET", "/api/v1/volumes", "");
    assert_eq!((status, vols), (200, serde_json::json!([])));
    let (status, o) = call(s.api, "GET", "/api/v1/overview", "");
    assert_eq!(status, 200);
    for k in [
        "streams",
        "rtsp_sessions",
        "hls_sessions",
        "admission",
        "refusals",
        "recordings",
        "volumes",
    ] {
        assert!(!o[k].is_null(), "no {k} in {o}");
    }
    assert!(o["admission"]["disk_queue"]["rt"].is_u64(), "{o}");
}

/// Mints the admin test's JWTs with PyJWT (an issuer independent of the server's
/// jsonwebtoken) and writes their JWKS (one HS256 secret).
const MINT_ADMIN: &str = r#"
import sys, json, time, base64, jwt
d = sys.argv[1]
b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
secret = b"api-admin-secret-api-admin-secret-0123"
open(d + "/jwks.json", "w").write(json.dumps({"keys": [{"kty": "oct", "kid": "a1", "alg": "HS256", "k": b64(secret)}]}))
now = int(time.time())
hs = lambda c: jwt.encode(dict({"exp": now + 3600}, **c), secret, algorithm="HS256", headers={"kid": "a1"})
print(json.dumps({
    "admin": hs({"admin": True}),
    "viewer": hs({}),
    "admin_false": hs({"admin": False}),
    "admin_paths": hs({"admin": True, "paths": ["/movies/"]}),
    "admin_expired": jwt.encode({"exp": now - 10, "admin": True}, secret, algorithm="HS256", headers={"kid": "a1"}),
}))
"#;

/// The API takes a JWT of the viewers' JWKS (`[auth] jwks_file`) that carries `"admin": true`
/// and no `paths`, as it takes the control token; a viewer's JWT, an admin one limited to
/// paths, one saying `admin: false` and an expired one get 401.
#[test]
fn an_admin_jwt_drives_the_api_and_a_viewers_does_not() {
    if !penstock_testreq::require("python3") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Debian's python3, with PyJWT (`.ci/run` installs python3-jwt).
    let o = Command::new("/usr/bin/python3")
        .args(["-c", MINT_ADMIN])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "PyJWT: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let tokens: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let jwks = dir.path().join("jwks.json");
    std::fs::set_permissions(&jwks, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let extra = format!("[auth]\njwks_file = \"{}\"\n", jwks.display());
    let s = serve_at(false, "127.0.0.1:0", "", &extra, dir);
    for (name, want) in [
        ("admin", 200),
        ("viewer", 401),
        ("admin_false", 401),
        ("admin_paths", 401),
        ("admin_expired", 401),
    ] {
        let bearer = format!("Bearer {}", tokens[name].as_str().unwrap());
        let (status, _, body) = http(
            s.api,
            "GET",
            "/api/v1/streams",
            &[("Authorization", bearer.as_str())],
            "",
        );
        assert_eq!(status, want, "{name}: {body}");
    }
}
