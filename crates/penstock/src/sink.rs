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
}

pub fn run(a: SinkArgs) -> Result<()> {
    if a.udp {
        return crate::udp_sink::run(&a.addr, a.expect, a.idle);
    }
    let l = TcpListener::bind(&a.addr).with_context(|| format!("bind {}", a.addr))?;
    let mut out = BufWriter::new(std::io::stdout().lock());
    writeln!(out, "listening {}", l.local_addr()?)?;
    out.flush()?;
    let mut buf = vec![0u8; 1 << 20];
    let mut served = 0u64;
    while a.count.is_none_or(|c| served < c) {
        let (mut s, _) = l.accept()?;
        let mut total = 0u64;
        let mut crc = 0u32;
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    total += n as u64;
                    if a.checksum {
                        crc = crc32c::crc32c_append(crc, &buf[..n]);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    writeln!(out, "error {e} after {total}")?;
                    break;
                }
            }
        }
        writeln!(out, "bytes {total} crc32c {crc:08x}")?;
        out.flush()?;
        served += 1;
    }
    Ok(())
}
