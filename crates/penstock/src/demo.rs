//! `penstock demo`: penstock's main job on an embedded default, for a first run.
//!
//! Generates a sample file, starts a TCP receiver on loopback in this process, streams the
//! file to it through every data path the machine offers, and checks each copy byte for byte
//! (crc32c) — so a newcomer sees the engine work, and what each path costs, in one command.

use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::time::Instant;

use anyhow::{Result, bail};
use clap::Args;
use penstock_core::endpoint::{Endpoint, Host};
use penstock_core::stream::{DataPath, PathChoice};
use penstock_core::units::parse_size;
use penstock_driver::clock::{CpuWho, cpu_times};
use penstock_driver::{Engine, EngineConfig, StreamSpec};

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Size of the generated sample.
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    pub size: u64,
}

fn sample(path: &Path, size: u64) -> Result<u32> {
    let mut data = vec![0u8; size as usize];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for chunk in data.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
    std::fs::write(path, &data)?;
    Ok(penstock_core::crc::crc32c(&data))
}

pub fn run(a: DemoArgs) -> Result<()> {
    if a.size > (1 << 30) {
        bail!("--size is limited to 1 GiB for the demo (it is generated in memory)");
    }
    let dir = tempfile::Builder::new()
        .prefix("penstock-demo-")
        .tempdir()?;
    let file = dir.path().join("sample.bin");
    let want_crc = sample(&file, a.size)?;
    println!(
        "penstock demo: streaming a {}-byte sample to a TCP receiver on 127.0.0.1",
        a.size
    );
    let engine = Engine::new(EngineConfig {
        workers: 1,
        ..EngineConfig::default()
    })?;
    if let Err(why) = &engine.info().uring {
        println!("  note: {why}");
    }
    let mut paths = vec![DataPath::Copy, DataPath::Sendfile, DataPath::Splice];
    if engine.info().uring.is_ok() {
        paths.push(DataPath::Uring);
    }
    for path in paths {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let receiver = std::thread::spawn(move || -> std::io::Result<(u64, u32)> {
            let (mut s, _) = listener.accept()?;
            let mut buf = vec![0u8; 1 << 20];
            let (mut n, mut crc) = (0u64, 0u32);
            loop {
                let k = s.read(&mut buf)?;
                if k == 0 {
                    return Ok((n, crc));
                }
                n += k as u64;
                crc = penstock_core::crc::crc32c_append(crc, &buf[..k]);
            }
        });
        let spec = StreamSpec {
            path: PathChoice::Fixed(path),
            ..StreamSpec::new(
                Endpoint::File { path: file.clone() },
                Endpoint::TcpConnect {
                    host: Host::Ip([127, 0, 0, 1].into()),
                    port,
                    local_port: None,
                },
            )
        };
        let c0 = cpu_times(CpuWho::Process);
        let t0 = Instant::now();
        let report = engine.open(spec)?.wait()?;
        let secs = t0.elapsed().as_secs_f64();
        let c1 = cpu_times(CpuWho::Process);
        let (got, crc) = receiver
            .join()
            .map_err(|_| anyhow::anyhow!("receiver panicked"))??;
        let exact = got == a.size && crc == want_crc;
        // The receiver runs in this process too, so this CPU figure counts both ends.
        let cpu = (c1.user_ns + c1.sys_ns - c0.user_ns - c0.sys_ns) as f64 / 1e9;
        println!(
            "  {:<9} {:>10} bytes {:>8.1} MB/s  CPU (both ends) {:.2} s/GB  {}",
            path.name(),
            report.bytes,
            report.bytes as f64 / secs / 1e6,
            cpu / (report.bytes.max(1) as f64 / 1e9),
            if exact { "byte-exact" } else { "MISMATCH" }
        );
        if !exact {
            bail!(
                "{path}: received {got} bytes with crc32c {crc:08x}, expected {} and {want_crc:08x}",
                a.size
            );
        }
    }
    println!(
        "next: `penstock bench paths` for the full comparison, `penstock stream --help` to stream your own files"
    );
    Ok(())
}
