//! `penstock sink ADDR`: accept TCP connections and count what arrives.
//!
//! A receiver for the tests and benchmarks: it prints `listening HOST:PORT` on stdout once
//! bound, then for each connection one line `bytes N crc32c X` when the peer closes. It runs
//! in its own process so that a benchmark's sender CPU time is the sender's alone.

use std::io::{BufWriter, Read, Write};
use std::net::TcpListener;

use anyhow::{Context, Result};
use clap::Args;

#[derive(Args, Debug)]
pub struct SinkArgs {
    /// Address to listen on (port 0: any free port).
    #[arg(default_value = "127.0.0.1:0")]
    pub addr: String,
    /// Stop after this many connections (default: never).
    #[arg(long)]
    pub count: Option<u64>,
    /// Also compute a crc32c of each connection's bytes (costs CPU in the receiver).
    #[arg(long)]
    pub checksum: bool,
    /// Receive UDP datagrams instead and check their sequence numbers (see `udp_sink`).
    #[arg(long)]
    pub udp: bool,
    /// UDP: datagrams expected from each source (to count lost tails too).
    #[arg(long)]
    pub expect: Option<u64>,
    /// UDP: stop after this long without a datagram.
    #[arg(long, default_value = "2s", value_parser = penstock_core::units::parse_duration)]
    pub idle: std::time::Duration,
    /// UDP: poll the socket without sleeping (one core busy), so that no sender pays for
    /// waking the receiver on every datagram — a loopback artefact: a receiver on another
    /// host costs the sender nothing.
    #[arg(long)]
    pub poll: bool,
}

pub fn run(a: SinkArgs) -> Result<()> {
    if a.udp {
        return crate::udp_sink::run(&a.addr, a.expect, a.idle, a.poll);
    }
    let l = TcpListener::bind(&a.addr).with_context(|| format!("bind {}", a.addr))?;
    let out = std::sync::Arc::new(std::sync::Mutex::new(BufWriter::new(std::io::stdout())));
    {
        let mut o = out.lock().expect("stdout");
        writeln!(o, "listening {}", l.local_addr()?)?;
        o.flush()?;
    }
    // Connections are served concurrently (a thread each): a bench with several streams
    // must not have one wait for another's receiver.
    let mut served = 0u64;
    let mut threads = Vec::new();
    while a.count.is_none_or(|c| served < c) {
        let (mut s, _) = l.accept()?;
        let (out, checksum) = (out.clone(), a.checksum);
        threads.push(std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 20];
            let mut total = 0u64;
            let mut crc = 0u32;
            let mut line = None;
            loop {
                match s.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        total += n as u64;
                        if checksum {
                            crc = crc32c::crc32c_append(crc, &buf[..n]);
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        line = Some(format!("error {e} after {total}"));
                        break;
                    }
                }
            }
            let mut o = out.lock().expect("stdout");
            let _ = writeln!(
                o,
                "{}",
                line.unwrap_or_else(|| format!("bytes {total} crc32c {crc:08x}"))
            );
            let _ = o.flush();
        }));
        served += 1;
    }
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}
