//! Operations (issue 16): what an operator who runs nginx expects of a server.

mod common;

use std::net::TcpListener;

use common::*;
use penstock_server::{Server, ServerError, listen::ListenAddrs};

#[test]
fn a_second_server_on_the_same_http_port_fails_with_address_in_use() {
    // A port that was free a moment ago.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cfg = config();
    cfg.http.listen = format!("127.0.0.1:{port}").into();
    cfg.control.listen = String::new();
    let f = start_with(cfg.clone());
    assert_eq!(f.http.port(), port);
    let other = tempfile::tempdir().unwrap();
    let second = Server::start(&cfg, other.path());
    match second {
        Err(ServerError::Bind { what, source, .. }) => {
            assert_eq!(what, "http");
            assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse, "{source}");
        }
        Err(e) => panic!("expected address in use, got {e}"),
        Ok(s) => {
            s.shutdown(std::time::Duration::from_secs(1));
            panic!("a second server started on port {port}");
        }
    }
    // The first one still answers every request (no connection went to an intruder).
    for _ in 0..12 {
        let r = raw(
            f.http,
            b"GET /small.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(status_of(&r), 200);
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn get_status(addr: std::net::SocketAddr, path: &str) -> u16 {
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    status_of(&raw(addr, req.as_bytes()))
}

/// Issue 16, defect 4: SIGHUP's reload re-binds a changed `listen` (the old port stops
/// answering, the new one serves), keeps a kept address's sockets, applies a new root, and
/// names every other changed key as not applied. A reload that cannot bind changes nothing.
#[test]
fn reload_rebinds_a_changed_listen_and_applies_the_root() {
    let (p1, p2) = (free_port(), free_port());
    let mut cfg = config();
    cfg.http.listen = format!("127.0.0.1:{p1}").into();
    cfg.control.listen = String::new();
    let f = start_with(cfg.clone());
    let server = f.server.as_ref().unwrap();
    let old: std::net::SocketAddr = format!("127.0.0.1:{p1}").parse().unwrap();
    let new: std::net::SocketAddr = format!("127.0.0.1:{p2}").parse().unwrap();
    assert_eq!(get_status(old, "/small.txt"), 200);
    // A connection open across the reload keeps being served on the old port.
    let mut kept = std::net::TcpStream::connect(old).unwrap();

    let mut next = cfg.clone();
    next.http.listen = format!("127.0.0.1:{p2}").into();
    next.http.workers = 7; // not live: reported
    let report = server.reload(&next, None).unwrap();
    assert!(
        report
            .applied
            .iter()
            .any(|a| a.contains(&format!("127.0.0.1:{p2}"))),
        "{report:?}"
    );
    assert_eq!(report.not_applied, ["http.workers"], "{report:?}");
    assert_eq!(server.http_addrs(), [new]);
    assert_eq!(get_status(new, "/small.txt"), 200);
    // The old listeners are closed once every worker took the new ones.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::net::TcpStream::connect(old).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the old port still accepts"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    use std::io::{Read, Write};
    kept.write_all(b"GET /small.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut resp = Vec::new();
    kept.read_to_end(&mut resp).unwrap();
    assert_eq!(status_of(&resp), 200);

    // Two addresses, one of them kept: both answer.
    let p3 = free_port();
    next.http.listen = ListenAddrs(vec![format!("127.0.0.1:{p2}"), format!("127.0.0.1:{p3}")]);
    server.reload(&next, None).unwrap();
    let third: std::net::SocketAddr = format!("127.0.0.1:{p3}").parse().unwrap();
    assert_eq!(server.http_addrs(), [new, third]);
    assert_eq!(get_status(new, "/small.txt"), 200);
    assert_eq!(get_status(third, "/small.txt"), 200);

    // An address someone else holds: refused, and nothing changed (not even the limits).
    let squatter = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut bad = next.clone();
    bad.http.listen = squatter.local_addr().unwrap().to_string().into();
    bad.limits.idle_timeout_ms = 1234;
    match server.reload(&bad, None) {
        Err(ServerError::Bind { what: "http", .. }) => {}
        other => panic!("expected a bind error, got {other:?}"),
    }
    assert_eq!(server.http_addrs(), [new, third]);
    assert_eq!(get_status(third, "/small.txt"), 200);

    // A new root: served at once; a root that cannot be opened refuses the reload.
    let other = tempfile::tempdir().unwrap();
    std::fs::write(other.path().join("only-here.txt"), b"x").unwrap();
    assert_eq!(get_status(new, "/only-here.txt"), 404);
    let report = server.reload(&next, Some(other.path())).unwrap();
    assert!(
        report.applied.iter().any(|a| a.starts_with("root")),
        "{report:?}"
    );
    assert_eq!(get_status(new, "/only-here.txt"), 200);
    assert_eq!(get_status(new, "/small.txt"), 404);
    assert!(
        server
            .reload(&next, Some(std::path::Path::new("/nonexistent/penstock")))
            .is_err()
    );
    assert_eq!(get_status(new, "/only-here.txt"), 200);
}

/// Several `listen` addresses, IPv6 loopback among them when the machine has it.
#[test]
fn several_listen_addresses_all_serve() {
    let mut cfg = config();
    let v6 = TcpListener::bind("[::1]:0").is_ok();
    let mut addrs = vec!["127.0.0.1:0".to_string(), "127.0.0.2:0".to_string()];
    if v6 {
        addrs.push("[::1]:0".into());
    } else {
        eprintln!("no IPv6 loopback here: checking IPv4 addresses only");
    }
    cfg.http.listen = ListenAddrs(addrs.clone());
    cfg.control.listen = String::new();
    let f = start_with(cfg);
    let bound = f.server.as_ref().unwrap().http_addrs();
    assert_eq!(bound.len(), addrs.len());
    for a in bound {
        assert_eq!(get_status(a, "/small.txt"), 200, "{a}");
    }
}

/// `[http.types]` overrides the built-in table; `index.html` is the default index, and a
/// directory named without its slash is redirected first.
#[test]
fn configured_types_and_the_default_index() {
    let mut cfg = config();
    cfg.http
        .types
        .insert("TXT".into(), "text/x-penstock; charset=utf-8".into());
    cfg.http
        .types
        .insert("m3u8".into(), "application/x-mpegURL".into());
    let f = start_with(cfg);
    std::fs::write(f.path("dir/index.html"), b"<a href=x.html>x</a>").unwrap();
    std::fs::write(f.path("list.m3u8"), b"#EXTM3U\n").unwrap();
    let r = raw(
        f.http,
        b"GET /small.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    let head = String::from_utf8_lossy(&r);
    assert!(
        head.contains("\r\nContent-Type: text/x-penstock; charset=utf-8\r\n"),
        "{head}"
    );
    let r = raw(
        f.http,
        b"GET /list.m3u8 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(String::from_utf8_lossy(&r).contains("\r\nContent-Type: application/x-mpegURL\r\n"));
    // Not overridden: the built-in type.
    let r = raw(
        f.http,
        b"GET /dir/x.html HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(String::from_utf8_lossy(&r).contains("\r\nContent-Type: text/html; charset=utf-8\r\n"));
    let r = raw(
        f.http,
        b"GET /dir HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status_of(&r), 301);
    assert!(String::from_utf8_lossy(&r).contains("\r\nLocation: /dir/\r\n"));
    let r = raw(
        f.http,
        b"GET /dir/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status_of(&r), 200);
    assert!(r.ends_with(b"<a href=x.html>x</a>"));
}
