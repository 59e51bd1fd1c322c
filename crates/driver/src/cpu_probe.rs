//! The CPU the engine spends to send, measured by running it (issue 22): what admission
//! charges per send (`Capacity::cpu_send_ns`) and per byte (`Capacity::cpu_send_byte_ps`).
//! `penstock calibrate` runs these at length, the engine's self-calibration
//! ([`crate::send_cost::send_cost`]) briefly; `penstock bench admission` both.
//!
//! Each probe runs a private [`Engine`] with paced streams from a page-cached file to
//! loopback receivers in this process (on loopback the receiver's copy and the kernel's
//! delivery run on the same CPUs as the workers, as a remote receiver's would not: the
//! figures are an upper bound for a real network), and divides the process's CPU time
//! over what was sent.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use penstock_core::endpoint::{Endpoint, Role};
use penstock_core::stream::Extent;
use penstock_core::units::Rate;

use crate::clock::{CpuWho, cpu_times};
use crate::{Engine, EngineConfig, StreamHandle, StreamSpec};

/// A file of `bytes` 0x47 bytes in the temporary directory, removed when dropped.
struct ScratchFile(PathBuf);

impl ScratchFile {
    fn new(bytes: u64) -> io::Result<ScratchFile> {
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "penstock-cpu-probe-{}-{}.bin",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let f = ScratchFile(path);
        let len = usize::try_from(bytes).map_err(io::Error::other)?;
        std::fs::write(&f.0, vec![0x47u8; len])?;
        Ok(f)
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The process's CPU time so far (user and system, every thread), in ns.
fn process_cpu_ns() -> u64 {
    let c = cpu_times(CpuWho::Process);
    c.user_ns + c.sys_ns
}

/// Engine settings of a probe beyond the defaults: pool buffers per worker and the read-ahead
/// a stream holds (0: the defaults).
#[derive(Clone, Copy, Default)]
struct Room {
    pool_buffers: usize,
    stream_depth: usize,
}

/// A private engine of `workers` (with `room`) running `n` streams of `src`'s first `length` bytes to
/// `target`, paced at `rate_bits_per_s` in units of `unit_bytes` (from `start_at`, else at
/// once; each unit's times in the report when `trace`); the engine must outlive the handles'
/// waits.
#[allow(clippy::too_many_arguments)]
fn paced_streams(
    (workers, room): (usize, Room),
    (rate_bits_per_s, unit_bytes): (u64, u64),
    n: usize,
    src: &ScratchFile,
    target: &Endpoint,
    length: u64,
    start_at: Option<penstock_core::time::Instant>,
    trace: bool,
) -> io::Result<(Engine, Vec<StreamHandle>)> {
    let defaults = EngineConfig::default();
    let engine = Engine::new(EngineConfig {
        workers,
        pool_buffers: if room.pool_buffers > 0 {
            room.pool_buffers
        } else {
            defaults.pool_buffers
        },
        stream_depth: if room.stream_depth > 0 {
            room.stream_depth
        } else {
            defaults.stream_depth
        },
        ..defaults
    })
    .map_err(io::Error::other)?;
    let mut handles = Vec::with_capacity(n);
    for _ in 0..n {
        handles.push(
            engine
                .open(StreamSpec {
                    pacing: crate::engine::Pacing::Rate(Rate::BitsPerSecond(rate_bits_per_s)),
                    unit_bytes: usize::try_from(unit_bytes).unwrap_or(usize::MAX),
                    start_at,
                    trace,
                    extent: Extent {
                        offset: 0,
                        length: Some(length),
                    },
                    ..StreamSpec::new(
                        Endpoint::File {
                            path: src.0.clone(),
                        },
                        target.clone(),
                    )
                })
                .map_err(io::Error::other)?,
        );
    }
    Ok((engine, handles))
}

/// CPU time per unit of `streams` paced UDP streams of 1316-byte units at 8 Mbit/s from a
/// page-cached file to a loopback socket a thread of this process reads, over `time`.
pub fn send_ns_at(time: Duration, streams: usize) -> io::Result<u64> {
    let bytes = 1_000_000 * time.as_secs_f64().ceil() as u64 + (1 << 20);
    let src = ScratchFile::new(bytes)?;
    let rx = std::net::UdpSocket::bind("127.0.0.1:0")?;
    rx.set_read_timeout(Some(Duration::from_millis(100)))?;
    let target = Endpoint::parse(&format!("udp://{}", rx.local_addr()?), Role::Target)
        .map_err(io::Error::other)?;
    let reading = Arc::new(AtomicBool::new(true));
    let receiver = {
        let reading = reading.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while reading.load(Ordering::Relaxed) {
                let _ = rx.recv(&mut buf);
            }
        })
    };
    let result = (|| {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let length = 1_000_000 * time.as_millis() as u64 / 1000;
        // Opened ahead and started together, so that the measured time is the paced run's.
        let start_at = crate::clock::now() + Duration::from_millis(100 + 2 * streams as u64);
        let (_engine, handles) = paced_streams(
            (cpus.min(streams.div_ceil(32)).max(1), Room::default()),
            (8_000_000, 1316),
            streams,
            &src,
            &target,
            length,
            Some(start_at),
            false,
        )?;
        let c0 = process_cpu_ns();
        let mut units = 0;
        for h in handles {
            units += h.wait().map_err(io::Error::other)?.units;
        }
        Ok(process_cpu_ns().saturating_sub(c0) / units.max(1))
    })();
    reading.store(false, Ordering::Relaxed);
    let _ = receiver.join();
    result
}

/// [`send_ns_at`] at 32 streams, then at the number of 8 Mbit/s streams the previous figure
/// would let admission fill (80 % of this machine's CPUs, 32 to `streams_max` streams),
/// twice: `(streams, ns a send)` per probe. The cost of a send depends on the rate: at a low
/// rate each of the workers' wake-ups sends few units and the receiver sleeps between
/// datagrams (a wake-up each), at a high one the dispatch slack batches sends and the
/// receiver finds datagrams queued; a figure taken at one rate and used at another is wrong
/// either way (issue 22: 12.1 µs a send at 32 streams, 3.4-3.7 µs at 174-256).
pub fn send_ns_probes(time: Duration, streams_max: usize) -> io::Result<Vec<(usize, u64)>> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let mut probes = vec![(32, send_ns_at(time, 32)?)];
    for _ in 0..2 {
        let last = probes.last().map_or(1, |&(_, ns)| ns);
        // 8 Mbit/s in 1316-byte units: 760 sends a second a stream.
        let n = (cpus * 800_000_000 / (760 * last.max(1))).clamp(32, streams_max.max(32) as u64)
            as usize;
        probes.push((n, send_ns_at(time, n)?));
    }
    Ok(probes)
}

/// A loopback TCP listener for `n` connections, each read to its end by a thread of its own
/// (a read waits 10 s at most): the target to name, and the thread that accepts them (for
/// `accept_for`, then gives up: nothing connects when the engine fails to start) and
/// returns the bytes they all received.
fn tcp_receivers(
    n: usize,
    accept_for: Duration,
) -> io::Result<(Endpoint, std::thread::JoinHandle<u64>)> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let target = Endpoint::parse(&format!("tcp://{}", listener.local_addr()?), Role::Target)
        .map_err(io::Error::other)?;
    listener.set_nonblocking(true)?;
    let receivers = std::thread::spawn(move || {
        let mut threads = Vec::new();
        let t0 = std::time::Instant::now();
        while threads.len() < n && t0.elapsed() < accept_for {
            let Ok((c, _)) = listener.accept() else {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            };
            threads.push(std::thread::spawn(move || {
                let mut c = c;
                let _ = c.set_nonblocking(false);
                let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
                let mut buf = vec![0u8; 1 << 16];
                let mut got = 0u64;
                while let Ok(k) = io::Read::read(&mut c, &mut buf) {
                    if k == 0 {
                        break;
                    }
                    got += k as u64;
                }
                got
            }));
        }
        threads
            .into_iter()
            .map(|t| t.join().unwrap_or(0))
            .sum::<u64>()
    });
    Ok((target, receivers))
}

/// CPU time per byte of 1 MiB units paced at 100 MB/s each by 2 streams from a page-cached
/// file over loopback TCP to receivers in this process, `total` bytes in all: the process's
/// CPU time over the bytes, in picoseconds.
pub fn byte_ps(total: u64) -> io::Result<u64> {
    let per_stream = (total / 2).max(1 << 20);
    let src = ScratchFile::new(per_stream)?;
    let (target, receivers) = tcp_receivers(2, Duration::from_secs(10))?;
    let mut bytes = 0;
    let c0 = process_cpu_ns();
    let sent = (|| {
        let (_engine, handles) = paced_streams(
            (2, Room::default()),
            (800_000_000, 1 << 20),
            2,
            &src,
            &target,
            per_stream,
            None,
            false,
        )?;
        for h in handles {
            bytes += h.wait().map_err(io::Error::other)?.bytes;
        }
        Ok::<(), io::Error>(())
    })();
    // The engine is gone: its connections are closed and the receivers end.
    let received = receivers
        .join()
        .map_err(|_| io::Error::other("a receiver panicked"))?;
    let used = process_cpu_ns().saturating_sub(c0);
    sent?;
    if received < bytes {
        return Err(io::Error::other(format!(
            "sent {bytes} bytes, received {received}"
        )));
    }
    Ok(u64::try_from(u128::from(used) * 1000 / u128::from(bytes.max(1))).unwrap_or(u64::MAX))
}

/// The workers' time a byte costs when `units` streams' 1 MiB units fall due at the same
/// instant (admission's critical instant), in picoseconds: each stream sends a unit of a
/// page-cached file over loopback TCP to a receiver in this process every 210 ms, the
/// engine has a worker per CPU (at most one a stream), and a burst's drain — from the
/// instant to its last unit's send, the largest lateness of the second and third bursts —
/// times the workers, over the burst's bytes. That is the quantity the CPU burst test
/// charges (`Σ cost ≤ ρ · cpu_ns_per_s · tolerance`, the workers sharing the burst); it
/// counts whatever kept the units from going out sooner (the receivers' copies on the same
/// CPUs, the sockets' buffers filling), so on loopback it is what the bench's forced runs
/// meet, and above what a remote receiver costs. Sent back to back, units batch what paced
/// ones do one by one: issue 22 found 400 units due at once out within 49 ms on 2 CPUs,
/// where the paced figure ([`byte_ps`]) charged 0.43 ms of CPU a unit.
pub fn burst_byte_ps(units: usize) -> io::Result<u64> {
    const UNIT: u64 = 1 << 20;
    // Three bursts 210 ms apart (40 Mbit/s a stream); the first (connections new, receivers
    // starting) is not counted.
    const BURSTS: u64 = 3;
    let units = units.max(1);
    let src = ScratchFile::new(BURSTS * UNIT)?;
    let (target, receivers) = tcp_receivers(units, Duration::from_secs(30))?;
    // A worker per CPU, but no idle ones: the drain times the workers would count a worker
    // with no unit to send as busy.
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(units);
    let mut bytes = 0;
    let mut drain_ns = 0;
    let sent = (|| {
        // Opened ahead (each connects to its receiver) and due together.
        let start_at = crate::clock::now() + Duration::from_millis(200 + 5 * units as u64);
        // Room for every stream's unit and the next one read ahead, as a server sized for
        // its streams has (the bench's pool: 5 buffers a stream): a stream waiting for a
        // buffer would be the pool's limit, not the burst's cost.
        let room = Room {
            pool_buffers: 2 * units.div_ceil(workers) + 4,
            stream_depth: 2,
        };
        let (_engine, handles) = paced_streams(
            (workers, room),
            (40_000_000, UNIT),
            units,
            &src,
            &target,
            BURSTS * UNIT,
            Some(start_at),
            true,
        )?;
        for h in handles {
            let report = h.wait().map_err(io::Error::other)?;
            bytes += report.bytes;
            for t in report.trace.iter().filter(|t| t.seq > 0) {
                drain_ns = drain_ns.max(
                    t.completed
                        .saturating_duration_since(t.scheduled)
                        .as_nanos() as u64,
                );
            }
        }
        Ok::<(), io::Error>(())
    })();
    let received = receivers
        .join()
        .map_err(|_| io::Error::other("a receiver panicked"))?;
    sent?;
    if received < bytes || bytes < units as u64 * BURSTS * UNIT {
        return Err(io::Error::other(format!(
            "sent {bytes} bytes, received {received}, of {units} units of {UNIT} B"
        )));
    }
    let worker_ns = u128::from(drain_ns) * workers as u128;
    let burst_bytes = units as u128 * u128::from(UNIT);
    Ok(u64::try_from(worker_ns * 1000 / burst_bytes).unwrap_or(u64::MAX))
}
