//! The engine's CPU cost of a send, for admission's CPU charge: measured by running the
//! engine ([`crate::cpu_probe`]) or a bare send loop, and cached per machine. Above the
//! engine (it runs one): the engine itself reads device figures only
//! ([`crate::calibration`]), never this.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::calibration::{SELF_CALIBRATION_TIME_MAX, SendCost, write_atomically};

/// The engine's send costs as admission charges them, from a paced 1316-byte datagram's
/// CPU (`datagram_ns`, [`crate::cpu_probe::send_ns_probes`]) and the CPU per byte
/// (`byte_ps`, [`crate::cpu_probe::byte_ps`]): (ns a send without its bytes, ps a byte).
pub fn split_send_cost(datagram_ns: u64, byte_ps: u64) -> (u64, u64) {
    (
        datagram_ns.saturating_sub(1316 * byte_ps / 1000).max(1),
        byte_ps,
    )
}

/// The engine's send costs measured by running it ([`crate::cpu_probe`]): paced 1316-byte
/// datagrams at the rate admission would fill (`time` a probe, three probes), 1 MiB units
/// over TCP (`bytes` in all; [`split_send_cost`] of the two), and as many 1 MiB units as
/// fit in `bytes` due at once. With the paced probes, `(streams, ns a datagram)` each (the
/// last one counts), for a caller that shows them.
pub fn measure_engine_send_cost(
    time: Duration,
    bytes: u64,
) -> std::io::Result<(SendCost, Vec<(usize, u64)>)> {
    let probes = crate::cpu_probe::send_ns_probes(time, 256)?;
    let datagram = probes.last().map_or(1, |&(_, ns)| ns);
    let byte_ps = crate::cpu_probe::byte_ps(bytes)?;
    let (send_ns, send_byte_ps) = split_send_cost(datagram, byte_ps);
    let burst_byte_ps = crate::cpu_probe::burst_byte_ps(burst_probe_units(bytes))?;
    let cost = SendCost {
        send_ns,
        send_byte_ps,
        burst_byte_ps,
    };
    Ok((cost, probes))
}

/// The 1 MiB units [`crate::cpu_probe::burst_byte_ps`] sends at once for a budget of `bytes`
/// (16 to 256: one receiving thread each).
pub fn burst_probe_units(bytes: u64) -> usize {
    (bytes >> 20).clamp(16, 256) as usize
}

/// The CPU time one 1316-byte UDP send to a loopback receiver costs the sending thread
/// (its thread CPU time over the sends made in `time`; on loopback the receive path runs in
/// the sender's context too, as it does for the engine's workers).
pub fn measure_send_ns(time: Duration) -> std::io::Result<u64> {
    use std::net::UdpSocket;
    let rx = UdpSocket::bind("127.0.0.1:0")?;
    rx.set_read_timeout(Some(Duration::from_millis(200)))?;
    let tx = UdpSocket::bind("127.0.0.1:0")?;
    tx.connect(rx.local_addr()?)?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let drain = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = rx.recv(&mut buf);
            }
        })
    };
    let unit = [0x47u8; 1316];
    let cpu = || rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    let ns = |t: rustix::time::Timespec| t.tv_sec as u128 * 1_000_000_000 + t.tv_nsec as u128;
    let (t0, c0) = (Instant::now(), cpu());
    let mut sends = 0u64;
    while t0.elapsed() < time {
        for _ in 0..64 {
            // A full receive queue drops datagrams; the send's cost is paid all the same.
            let _ = tx.send(&unit);
            sends += 1;
        }
    }
    let used = ns(cpu()).saturating_sub(ns(c0));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = drain.join();
    Ok(u64::try_from(used / u128::from(sends.max(1)))
        .unwrap_or(u64::MAX)
        .max(1))
}

/// How long each of [`send_cost`]'s three paced probes runs when it measures (about 2 s
/// in all with the per-byte probe and the probes' start-up).
pub const SEND_COST_TIME: Duration = Duration::from_millis(250);

/// What [`send_cost`]'s per-byte probe sends (1 MiB units over loopback TCP).
pub const SEND_COST_BYTES: u64 = 64 << 20;

/// What admission charges for a self-calibrated send cost, in per cent of the figures
/// measured ([`SendCostRecord::charged`]). The first-use probe is short (a quarter second a
/// probe) and runs whenever a server first starts, busy machine or not: issue 22's run found
/// it 1.31× below `penstock calibrate`'s on the same machine minutes apart (3.3 vs 4.3 µs a
/// datagram), and the set it admitted 0.8 % late. `penstock calibrate`'s figures are charged
/// as measured.
pub const SELF_CALIBRATED_SEND_MARGIN_PERCENT: u64 = 150;

/// The way [`send_cost`] measures; a cached record of another way is measured again.
pub const SEND_COST_PROBE: u32 = 3;

/// One machine's measured send costs ([`measure_engine_send_cost`]), as cached in
/// `<cache dir>/send.toml`, with what it was measured on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SendCostRecord {
    /// CPU a send costs without its bytes, in ns.
    pub send_ns: u64,
    /// CPU a byte sent costs, in ps (0 in a record of the first probe, which is not used).
    #[serde(default)]
    pub send_byte_ps: u64,
    /// CPU a byte costs at the critical instant, in ps (0 in a record of before probe 3).
    #[serde(default)]
    pub burst_byte_ps: u64,
    /// [`SEND_COST_PROBE`] when measured (0: the first probe, a bare send loop that
    /// nobody read, which issue 22 found too low at load).
    #[serde(default)]
    pub probe: u32,
    /// The kernel release (`uname -r`) and the CPU (model name × CPUs): measured again when
    /// either changes.
    pub kernel: String,
    pub cpu: String,
    /// When it was measured (Unix seconds).
    pub measured_unix_s: u64,
}

impl SendCostRecord {
    /// The costs as admission charges them: the measured figures plus
    /// [`SELF_CALIBRATED_SEND_MARGIN_PERCENT`].
    pub fn charged(&self) -> SendCost {
        let m = |v: u64| v.saturating_mul(SELF_CALIBRATED_SEND_MARGIN_PERCENT) / 100;
        SendCost {
            send_ns: m(self.send_ns),
            send_byte_ps: m(self.send_byte_ps),
            burst_byte_ps: m(self.burst_byte_ps),
        }
    }
}

/// Which of admission's CPU figures a caller set itself (a server's `[admission]`): kept as
/// set by [`capacity_with_send_cost`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendCostKept {
    pub send_ns: bool,
    pub send_byte_ps: bool,
    pub burst_byte_ps: bool,
}

/// The one builder of admission's capacity from device figures and the engine's send cost
/// (`penstock serve`, `penstock stream`, `penstock bench admission`): `capacity` (its disk,
/// network, buffer and CPU-time figures as the caller found them) with `cost`'s charged
/// figures per send, per byte and per byte in a burst, except those `kept`. A figure a byte
/// kept stands for the burst's too.
pub fn capacity_with_send_cost(
    capacity: penstock_core::admission::Capacity,
    cost: &SendCost,
    kept: SendCostKept,
) -> penstock_core::admission::Capacity {
    let mut cap = capacity;
    if !kept.send_ns {
        cap.cpu_send_ns = cost.send_ns;
    }
    if !kept.send_byte_ps {
        cap.cpu_send_byte_ps = cost.send_byte_ps;
    }
    if !kept.burst_byte_ps && !kept.send_byte_ps {
        cap.cpu_burst_byte_ps = cost.burst_byte_ps;
    }
    cap
}

fn this_machine() -> (String, String) {
    let kernel = rustix::system::uname()
        .release()
        .to_string_lossy()
        .into_owned();
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (kernel, format!("{model} x {cpus}"))
}

/// The engine's send costs on this machine, for admission's CPU charge
/// (`Capacity::cpu_send_ns`, `cpu_send_byte_ps`): the cached record (`<cache_dir>/send.toml`)
/// when the kernel, the CPU and the probe are those it was measured with, else
/// [`measure_engine_send_cost`] now (`time` a paced probe, [`SEND_COST_BYTES`]), cached (a
/// cache that cannot be written costs a measurement next time, nothing more). With no cache
/// directory it is measured at each call.
pub fn send_cost(cache_dir: Option<&Path>, time: Duration) -> std::io::Result<SendCostRecord> {
    let (kernel, cpu) = this_machine();
    let path = cache_dir.map(|d| d.join("send.toml"));
    let cached = || {
        let text = std::fs::read_to_string(path.as_ref()?).ok()?;
        let r = toml::from_str::<SendCostRecord>(&text).ok()?;
        (r.kernel == kernel
            && r.cpu == cpu
            && r.send_ns > 0
            && r.send_byte_ps > 0
            && r.burst_byte_ps > 0
            && r.probe == SEND_COST_PROBE)
            .then_some(r)
    };
    if let Some(r) = cached() {
        return Ok(r);
    }
    // One process measures at a time (servers and tests started together on a fresh
    // machine): the others wait on the lock, then read its record. Without a lock file
    // (a cache directory that cannot be written) each measures.
    let _lock = cache_dir.and_then(|d| {
        std::fs::create_dir_all(d).ok()?;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(d.join("send.lock"))
            .ok()?;
        rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive).ok()?;
        Some(f)
    });
    if let Some(r) = cached() {
        return Ok(r);
    }
    // A first start is otherwise silent for these seconds.
    tracing::info!(
        "measuring what a send costs this machine's CPU, once (a few seconds; cached{})",
        path.as_ref().map_or(String::new(), |p| format!(
            " in {} for later starts",
            p.display()
        ))
    );
    let (cost, _) = measure_engine_send_cost(time.min(SELF_CALIBRATION_TIME_MAX), SEND_COST_BYTES)?;
    let record = SendCostRecord {
        send_ns: cost.send_ns,
        send_byte_ps: cost.send_byte_ps,
        burst_byte_ps: cost.burst_byte_ps,
        probe: SEND_COST_PROBE,
        kernel,
        cpu,
        measured_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    if let Some(path) = &path {
        let _ = write_atomically(
            path,
            &toml::to_string(&record).expect("a record serializes"),
        );
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_datagrams_cost_splits_into_a_send_and_its_bytes() {
        // 4.4 µs a 1316-byte datagram at 430 ps a byte: 3.834 µs a send.
        assert_eq!(split_send_cost(4_400, 430), (3_835, 430));
        // Bytes that cost more than the whole datagram (noise): at least 1 ns a send.
        assert_eq!(split_send_cost(100, 1_000), (1, 1_000));
    }

    #[test]
    fn the_send_cost_is_measured_once_then_read_from_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let first = send_cost(Some(dir.path()), Duration::from_millis(50)).unwrap();
        assert!(first.send_ns > 0 && first.send_byte_ps > 0 && first.burst_byte_ps > 0);
        assert_eq!(first.probe, SEND_COST_PROBE);
        assert!(dir.path().join("send.toml").exists());
        // The same machine: the cached record, not a new measurement (which would differ
        // at least in its time stamp or its figure).
        let mut cached = first.clone();
        cached.send_ns = 12_345;
        std::fs::write(
            dir.path().join("send.toml"),
            toml::to_string(&cached).unwrap(),
        )
        .unwrap();
        assert_eq!(
            send_cost(Some(dir.path()), Duration::from_millis(50)).unwrap(),
            cached
        );
        // Another kernel: measured again.
        cached.kernel.push_str("-other");
        std::fs::write(
            dir.path().join("send.toml"),
            toml::to_string(&cached).unwrap(),
        )
        .unwrap();
        let again = send_cost(Some(dir.path()), Duration::from_millis(50)).unwrap();
        assert_eq!(again.kernel, first.kernel);
        // A record of the first probe (a bare send loop, no per-byte figure): measured again.
        let mut old = again.clone();
        old.probe = 0;
        old.send_byte_ps = 0;
        old.send_ns = 12_345;
        std::fs::write(dir.path().join("send.toml"), toml::to_string(&old).unwrap()).unwrap();
        let remeasured = send_cost(Some(dir.path()), Duration::from_millis(50)).unwrap();
        assert_eq!(remeasured.probe, SEND_COST_PROBE);
        assert!(remeasured.send_byte_ps > 0);
        // A record of probe 2 (no burst figure): measured again.
        let mut two = remeasured.clone();
        two.probe = 2;
        two.burst_byte_ps = 0;
        std::fs::write(dir.path().join("send.toml"), toml::to_string(&two).unwrap()).unwrap();
        let three = send_cost(Some(dir.path()), Duration::from_millis(50)).unwrap();
        assert_eq!(three.probe, SEND_COST_PROBE);
        assert!(three.burst_byte_ps > 0);
    }
}
