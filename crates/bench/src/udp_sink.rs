//! `penstock sink --udp ADDR`: a UDP receiver that checks sequence numbers.
//!
//! Every datagram is expected to start with its unit's sequence number (u64, little endian)
//! — the bench's generated files carry one at the start of every unit. Datagrams are told apart
//! by their source address (one socket per stream on the sending side). When the senders are
//! done (no datagram for `--idle`, or SIGTERM) it prints one JSON line: received, lost,
//! out-of-order and duplicate counts, and how many sources it heard from.

use std::collections::HashMap;
use std::io::Write;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

#[derive(Default)]
struct Source {
    next: u64,
    received: u64,
    out_of_order: u64,
    duplicates: u64,
    seen_max: Option<u64>,
}

pub fn run(addr: &str, expect_per_source: Option<u64>, idle: Duration, poll: bool) -> Result<()> {
    let sock = UdpSocket::bind(addr).with_context(|| format!("bind {addr}"))?;
    let s2 = socket2::SockRef::from(&sock);
    let _ = s2.set_recv_buffer_size(64 << 20);
    let rcvbuf = s2.recv_buffer_size().unwrap_or(0);
    if poll {
        sock.set_nonblocking(true)?;
    } else {
        sock.set_read_timeout(Some(Duration::from_millis(100)))?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone())?;
    println!("listening {}", sock.local_addr()?);
    std::io::stdout().flush()?;
    let mut sources: HashMap<SocketAddr, Source> = HashMap::new();
    let mut buf = vec![0u8; 65536];
    let mut last = None::<Instant>;
    let (mut total, mut short) = (0u64, 0u64);
    while !stop.load(Ordering::Relaxed) {
        match sock.recv_from(&mut buf) {
            Ok((n, from)) => {
                last = Some(Instant::now());
                total += 1;
                if n < 8 {
                    short += 1;
                    continue;
                }
                let seq = u64::from_le_bytes(buf[..8].try_into().expect("8 bytes"));
                let s = sources.entry(from).or_default();
                s.received += 1;
                if seq == s.next {
                    s.next += 1;
                } else if seq > s.next {
                    s.out_of_order += u64::from(s.seen_max.is_some_and(|m| seq < m));
                    s.next = seq + 1;
                } else if s.seen_max.is_some_and(|m| seq <= m) {
                    s.duplicates += 1;
                    s.received -= 1;
                }
                s.seen_max = Some(s.seen_max.map_or(seq, |m| m.max(seq)));
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if last.is_some_and(|t| t.elapsed() >= idle) {
                    break;
                }
                if poll {
                    std::hint::spin_loop();
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let received: u64 = sources.values().map(|s| s.received).sum();
    let lost: u64 = match expect_per_source {
        Some(n) => sources.values().map(|s| n.saturating_sub(s.received)).sum(),
        // Without a count: the gaps below the highest sequence seen.
        None => sources
            .values()
            .map(|s| s.seen_max.map_or(0, |m| m + 1).saturating_sub(s.received))
            .sum(),
    };
    let out = serde_json::json!({
        "datagrams": total,
        "received": received,
        "lost": lost,
        "sources": sources.len(),
        "out_of_order": sources.values().map(|s| s.out_of_order).sum::<u64>(),
        "duplicates": sources.values().map(|s| s.duplicates).sum::<u64>(),
        "short": short,
        "rcvbuf_bytes": rcvbuf,
    });
    println!("{out}");
    Ok(())
}
