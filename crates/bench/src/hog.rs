//! `penstock hog cpu|disk|read|meter`: background load for the benchmarks.
//!
//! `cpu` spins one core until killed; `disk FILE` reads FILE with O_DIRECT in 1 MiB requests,
//! over and over, until killed; `meter` spins on CPU 0 printing its iteration count every
//! 100 ms (`penstock bench cues`, §4.3). The benches start them as child processes and kill them.

use std::path::Path;

use anyhow::{Context, Result, bail};
use penstock_driver::sys::AlignedBuffer;

pub fn run(kind: &str, file: Option<&Path>) -> Result<()> {
    match kind {
        "cpu" => {
            let mut x = 1u64;
            loop {
                for _ in 0..1_000_000 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                }
                std::hint::black_box(x);
            }
        }
        "disk" => {
            let file = file.context("hog disk needs a FILE")?;
            let fd = penstock_driver::open::reopen_direct(file)
                .or_else(|| std::fs::File::open(file).ok().map(Into::into))
                .with_context(|| format!("open {}", file.display()))?;
            let mut buf = AlignedBuffer::new(1 << 20)?;
            loop {
                let mut off = 0u64;
                loop {
                    let n = rustix::io::pread(&fd, buf.bytes_mut(), off)?;
                    if n == 0 {
                        break;
                    }
                    off += n as u64;
                }
                // Without O_DIRECT, keep the reads going to the disk.
                let _ = rustix::fs::fadvise(&fd, 0, None, rustix::fs::Advice::DontNeed);
            }
        }
        "read" => {
            // Plain buffered read() of a file that is kept out of the cache: a process
            // outside penstock competing for the disk.
            use std::io::Read;
            let file = file.context("hog read needs a FILE")?;
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let mut f = std::fs::File::open(file)
                    .with_context(|| format!("open {}", file.display()))?;
                let _ = rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed);
                while f.read(&mut buf)? > 0 {}
            }
        }
        "meter" => crate::cues::meter(),
        other => bail!("unknown hog {other:?}: expected cpu, disk, read or meter"),
    }
}
