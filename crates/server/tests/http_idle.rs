//! Idle connections and the server's memory (issue 4's slowloris/10,000-idle guarantees),
//! in a test binary of its own: it measures the process's RSS, which tests running beside it
//! in one process (reading large bodies) would inflate.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use common::*;

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[test]
fn two_thousand_idle_connections_stay_small_and_others_are_served() {
    const N: usize = 2000;
    // Client and server share this process: 2 descriptors per connection.
    if let Some(max) = rustix::process::getrlimit(rustix::process::Resource::Nofile).maximum {
        let _ = rustix::process::setrlimit(
            rustix::process::Resource::Nofile,
            rustix::process::Rlimit {
                current: Some(max.min(65536)),
                maximum: Some(max),
            },
        );
    }
    let cur = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    if !penstock_testreq::require_that(
        "RLIMIT_NOFILE for 2000 connections",
        (cur < (2 * N + 200) as u64).then(|| format!("{cur} is below {}", 2 * N + 200)),
    ) {
        return;
    }
    let f = start();
    let before = rss_kib();
    let mut conns = Vec::with_capacity(N);
    for i in 0..N {
        let mut s = TcpStream::connect(f.http).unwrap();
        if i % 2 == 0 {
            // Half of them have sent part of a head.
            s.write_all(b"GET /small.txt HTTP/1.1\r\nHost").unwrap();
        }
        conns.push(s);
    }
    // Others are served while they wait.
    let (st, _, body) = get(&f, "/mid.bin", &[]);
    assert_eq!(st, 200);
    assert!(body == pattern(300 * 1024, 2));
    // Wait (bounded) until the server has accepted them all.
    let mut seen = 0;
    for _ in 0..6000 {
        let m = String::from_utf8(get(&f, "/metrics", &[]).2).unwrap();
        seen = m
            .lines()
            .find(|l| l.starts_with("penstock_http_connections "))
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        if seen >= N {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(seen >= N, "server saw {seen} connections");
    let grown_kib = rss_kib().saturating_sub(before);
    // Half the connections hold a partial head (a buffer of < 64 bytes that grows to the
    // read size): bound the server's user memory at 16 KiB per connection.
    assert!(
        grown_kib < (N as u64) * 16,
        "RSS grew {grown_kib} KiB for {N} connections"
    );
    drop(conns);
}
