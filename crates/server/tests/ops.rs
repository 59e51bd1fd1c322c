//! Operations (issue 16): what an operator who runs nginx expects of a server.

mod common;

use std::net::TcpListener;

use common::*;
use penstock_server::{Server, ServerError};

#[test]
fn a_second_server_on_the_same_http_port_fails_with_address_in_use() {
    // A port that was free a moment ago.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cfg = config();
    cfg.http.listen = format!("127.0.0.1:{port}");
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
