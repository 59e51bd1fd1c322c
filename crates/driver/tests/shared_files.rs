//! Streams of one file share one descriptor (the engine's open-file table, `files`), and each
//! still sends exactly its own extent on every data path: a shared descriptor's file position
//! is never used (pread, sendfile and splice with an offset, io_uring reads at an offset), so
//! concurrent streams at different offsets of one file cannot move one another's reads.
//! Real files, real loopback TCP receivers.

use std::io::Read;
use std::net::{Ipv4Addr, TcpListener};
use std::path::Path;
use std::thread;
use std::time::Duration;

use penstock_core::endpoint::{Endpoint, Host};
use penstock_core::stream::{CachePolicy, DataPath, Extent, PathChoice};
use penstock_driver::{Engine, EngineConfig, StreamSpec};

/// Streams of the file at once, each at its own offset.
const OFFSETS: [u64; 4] = [0, 4097, (1 << 20) + 3, (3 << 20) - 5];
/// More than loopback TCP buffers hold (a sender's send buffer grows to 4 MiB), so that every
/// stream is still running, holding its descriptor, when the receivers start reading.
const LENGTH: u64 = (6 << 20) + 11;
/// Neither a divisor nor a multiple of 4096: reads of the streams interleave off-block.
const UNIT: usize = 3000;

/// Position-dependent bytes: a read at another stream's position shows.
fn pattern(len: u64) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let x = (i as u32).wrapping_mul(2_654_435_761);
            (x >> 24) as u8 ^ (i >> 12) as u8
        })
        .collect()
}

fn spec(source: &Path, port: u16, offset: u64, path: DataPath, cache: CachePolicy) -> StreamSpec {
    StreamSpec {
        extent: Extent {
            offset,
            length: Some(LENGTH),
        },
        unit_bytes: UNIT,
        path: PathChoice::Fixed(path),
        cache,
        ..StreamSpec::new(
            Endpoint::File {
                path: source.to_path_buf(),
            },
            Endpoint::TcpConnect {
                host: Host::Ip(Ipv4Addr::LOCALHOST.into()),
                port,
                local_port: None,
            },
        )
    }
}

#[test]
fn streams_of_one_file_share_a_descriptor_and_send_their_own_bytes_on_every_path() {
    // Beside the build (a disk file system): O_DIRECT is refused on tmpfs.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let size = OFFSETS.iter().max().unwrap() + LENGTH;
    let data = pattern(size);
    let source = dir.path().join("shared.bin");
    std::fs::write(&source, &data).unwrap();
    let engine = Engine::new(EngineConfig {
        workers: 1,
        pool_buffers: 32,
        buffer_bytes: 64 * 1024,
        stream_depth: 4,
        ..EngineConfig::default()
    })
    .unwrap();
    let direct_ok = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&source)
            .is_ok()
    };
    let modes = [
        (DataPath::Copy, CachePolicy::Keep),
        (DataPath::Copy, CachePolicy::Drop),
        (DataPath::Sendfile, CachePolicy::Keep),
        (DataPath::Splice, CachePolicy::Keep),
        (DataPath::Uring, CachePolicy::Keep),
        (DataPath::Uring, CachePolicy::Bypass),
    ];
    let mut failures = Vec::new();
    for (path, cache) in modes {
        let name = format!("{path}/{}", cache.name());
        if path == DataPath::Uring
            && penstock_testreq::require_ok("io_uring", engine.info().uring.clone()).is_none()
        {
            continue;
        }
        let before = engine.open_files();
        assert_eq!(before.files, 0, "{name}: an entry outlived its streams");
        let mut streams = Vec::new();
        for &offset in &OFFSETS {
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
            let port = listener.local_addr().unwrap().port();
            let h = engine
                .open(spec(&source, port, offset, path, cache))
                .unwrap();
            h.pause();
            streams.push((offset, listener, h));
        }
        // Every stream is open (none can have sent LENGTH yet): one buffered descriptor for
        // all, and with `--cache bypass` one O_DIRECT descriptor for all (where the file
        // system grants O_DIRECT).
        let during = engine.open_files();
        let k = OFFSETS.len() as u64;
        let want_files = 1 + u64::from(cache == CachePolicy::Bypass && direct_ok);
        if during.files != want_files {
            failures.push(format!(
                "{name}: {} open files for {k} streams, expected {want_files}",
                during.files
            ));
        }
        if during.shares - before.shares < (k - 1) * want_files {
            failures.push(format!(
                "{name}: {} shares for {k} streams of one file",
                during.shares - before.shares
            ));
        }
        let mut receivers = Vec::new();
        for (offset, listener, h) in streams {
            h.resume();
            let rx = thread::spawn(move || {
                let (mut s, _) = listener.accept()?;
                s.set_read_timeout(Some(Duration::from_secs(60)))?;
                let mut got = Vec::new();
                s.read_to_end(&mut got)?;
                std::io::Result::Ok(got)
            });
            receivers.push((offset, h, rx));
        }
        for (offset, h, rx) in receivers {
            let got = rx.join().unwrap();
            let report = h.wait_timeout(Duration::from_secs(120));
            let want = &data[offset as usize..(offset + LENGTH) as usize];
            match (got, report) {
                (Ok(got), Some(Ok(r))) if got == want && r.bytes == LENGTH => {}
                (Ok(got), r) => {
                    let first = got.iter().zip(want).position(|(a, b)| a != b);
                    failures.push(format!(
                        "{name} offset {offset}: received {} bytes (first difference at {first:?}), report {r:?}",
                        got.len()
                    ));
                }
                (Err(e), r) => failures.push(format!("{name} offset {offset}: {e}, report {r:?}")),
            }
        }
        let after = engine.open_files();
        if after.files != 0 {
            failures.push(format!("{name}: {after:?} after every stream ended"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
