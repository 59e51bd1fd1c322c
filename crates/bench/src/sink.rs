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
    /// TCP: SO_RCVLOWAT on each connection, so that a read returns once this many bytes are
    /// queued — the receiver is woken per that many bytes instead of per segment (on loopback
    /// each wakeup is work done in the sender's send call; a remote receiver costs it none).
    #[arg(long, value_parser = penstock_core::units::parse_size)]
    pub rcvlowat: Option<u64>,
    /// Run on this CPU only (a benchmark keeps the receiver off the sender's CPU).
    #[arg(long)]
    pub cpu: Option<usize>,
}

pub fn run(a: SinkArgs) -> Result<()> {
    if let Some(cpu) = a.cpu {
        penstock_driver::clock::pin_to_cpu(cpu).with_context(|| format!("pinning to CPU {cpu}"))?;
    }
    if a.udp {
        return crate::udp_sink::run(&a.addr, a.expect, a.idle, a.poll);
    }
    let lowat = match a.rcvlowat {
        Some(b) => Some(i32::try_from(b).context("--rcvlowat is at most 2 GiB")?),
        None => None,
    };
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
        if let Some(b) = lowat {
            penstock_driver::sys::set_rcvlowat(std::os::fd::AsFd::as_fd(&s), b)
                .context("SO_RCVLOWAT")?;
        }
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
                            crc = penstock_core::crc::crc32c_append(crc, &buf[..n]);
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
