//! The background scrub of the served volumes (issue 30): a thread of its own reads every
//! copy of every byte of each `[volumes]` volume, checks it against its block checksum and
//! rewrites a unit bad on one copy from a copy that verifies — what `penstock volume scrub`
//! does ([`Volume::scrub`]), at a rate limit, at the idle I/O priority, one pass every
//! `[volumes] scrub_interval_ms`.
//!
//! It never blocks a real-time stream: its reads and repairs are plain buffered reads and
//! writes of this thread (not the engine's disk queue, where rt streams' reads are), issued at
//! IOPRIO_CLASS_IDLE (the kernel's scheduler serves them when no one else asks the disk:
//! bfq, mq-deadline; docs/io-scheduler.md §7), and paced to `scrub_rate_bytes_per_s` (every
//! copy counted) between 1 MiB chunks. A repair writes 4 KiB over a unit whose bytes failed,
//! the same bytes a reader's repair would write; readers meanwhile verify what they read
//! and read the other copy of a bad unit (docs/volume-format.md, "Block checksums").
//!
//! What it finds goes to the log (a line per bad unit, at most [`BAD_LINES_PER_PASS`] a
//! volume and pass, then a summary) and to the metrics ([`ScrubCounters`]); the driver's
//! `volume_checksum_{failures,repairs}_total` count its findings too.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use penstock_driver::volume::{Access, Volume};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

/// Lines naming a bad unit, per volume and pass; the rest are counted in the summary line.
pub const BAD_LINES_PER_PASS: usize = 10;

/// The default rate: 50 MB/s (every copy counted) — a 1 TB mirrored volume's pass in about
/// 11 hours, a small share of a disk's sequential rate.
pub const RATE_BYTES_PER_S_DEFAULT: u64 = 50_000_000;
/// The default interval between passes (from the end of one to the start of the next, and
/// from the server's start to the first): a week, as ZFS and btrfs distributions schedule
/// theirs.
pub const INTERVAL_DEFAULT: Duration = Duration::from_secs(7 * 24 * 3600);

/// The background scrub's metrics (`penstock_volume_scrub_*`), present from the start
/// whether the scrub is on or not.
#[derive(Debug, Clone, Default)]
pub struct ScrubCounters {
    /// Passes over every served volume completed.
    pub passes: Counter,
    /// Bytes read, every copy counted (the progress of the pass under way).
    pub read_bytes: Counter,
    /// Sum units found bad on a copy.
    pub bad_units: Counter,
    /// Of those, rewritten from a copy that verified.
    pub repaired_units: Counter,
    /// Volume passes that failed (the volume could not be opened, or an I/O error stopped it).
    pub errors: Counter,
}

impl ScrubCounters {
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "volume_scrub_passes",
            "Background scrub passes over every served volume completed",
            self.passes.clone(),
        );
        r.register(
            "volume_scrub_read_bytes",
            "Bytes the background scrub read, every copy counted",
            self.read_bytes.clone(),
        );
        r.register(
            "volume_scrub_bad_units",
            "4 KiB units the background scrub found failing their block checksum on a copy",
            self.bad_units.clone(),
        );
        r.register(
            "volume_scrub_repaired_units",
            "Of those, units the background scrub rewrote from a copy that verified",
            self.repaired_units.clone(),
        );
        r.register(
            "volume_scrub_errors",
            "Background scrubs of a volume that failed (open or I/O error)",
            self.errors.clone(),
        );
    }
}

/// A stop flag a sleeping thread wakes on.
#[derive(Debug, Default)]
struct Stop {
    stopped: Mutex<bool>,
    cv: Condvar,
}

impl Stop {
    /// Waits `d` or until stopped; whether stopped.
    fn wait(&self, d: Duration) -> bool {
        let deadline = Instant::now() + d;
        let mut s = self.stopped.lock().unwrap_or_else(|p| p.into_inner());
        while !*s {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            s = self
                .cv
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        *s
    }

    fn set(&self) {
        *self.stopped.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.cv.notify_all();
    }
}

/// The running background scrub; [`Scrubber::stop`] ends it (at the next 1 MiB chunk).
#[derive(Debug)]
pub struct Scrubber {
    stop: Arc<Stop>,
    thread: Option<JoinHandle<()>>,
}

impl Scrubber {
    /// Starts the thread scrubbing `volumes` (name → a member's path) at `rate_bytes_per_s`,
    /// a pass every `interval`. Both above 0 (0 turns the scrub off: not started).
    pub fn start(
        volumes: BTreeMap<String, PathBuf>,
        rate_bytes_per_s: u64,
        interval: Duration,
        counters: ScrubCounters,
    ) -> std::io::Result<Scrubber> {
        assert!(rate_bytes_per_s > 0 && !interval.is_zero());
        let stop = Arc::new(Stop::default());
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("volume-scrub".into())
            .spawn(move || run(&volumes, rate_bytes_per_s, interval, &counters, &s))?;
        Ok(Scrubber {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the scrub and waits for its thread (it stops within one chunk of 1 MiB).
    pub fn stop(&mut self) {
        self.stop.set();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Scrubber {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(
    volumes: &BTreeMap<String, PathBuf>,
    rate_bytes_per_s: u64,
    interval: Duration,
    counters: &ScrubCounters,
    stop: &Stop,
) {
    // The bulk class's place in the kernel's queue, as `volume scrub` and `volume mount
    // --class bulk` take; the thread's buffered reads and writes carry it.
    use penstock_driver::sys::{IoprioClass, ioprio_set_current_thread, ioprio_value};
    if let Err(e) = ioprio_set_current_thread(ioprio_value(IoprioClass::Idle, 0)) {
        tracing::warn!(
            "volume scrub: the idle I/O priority was refused ({e}); scrubbing at the default priority, rate-limited"
        );
    }
    tracing::info!(
        "volume scrub: {} volume(s), a pass every {} s at most {rate_bytes_per_s} B/s",
        volumes.len(),
        interval.as_secs_f64()
    );
    loop {
        if stop.wait(interval) {
            return;
        }
        for (name, member) in volumes {
            if !scrub_one(name, member, rate_bytes_per_s, counters, stop) {
                return;
            }
        }
        counters.passes.inc();
    }
}

/// One volume's pass; `false` when stopped.
fn scrub_one(
    name: &str,
    member: &Path,
    rate_bytes_per_s: u64,
    counters: &ScrubCounters,
    stop: &Stop,
) -> bool {
    // Read-write to repair; read-only (report only) where this process may not write.
    let v = match Volume::open(member, Access::SharedWrite)
        .or_else(|_| Volume::open(member, Access::Shared))
    {
        Ok(v) => v,
        Err(e) => {
            counters.errors.inc();
            tracing::warn!("volume scrub: volume {name} ({}): {e}", member.display());
            return true;
        }
    };
    let started = Instant::now();
    let mut read = 0u64;
    let mut pace = |n: u64| {
        read += n;
        counters.read_bytes.inc_by(n);
        let due = Duration::from_secs_f64(read as f64 / rate_bytes_per_s as f64);
        match due.checked_sub(started.elapsed()) {
            Some(wait) => !stop.wait(wait),
            None => !stop.wait(Duration::ZERO),
        }
    };
    let report = match v.scrub(true, &mut pace) {
        Ok(Some(r)) => r,
        Ok(None) => {
            tracing::debug!("volume scrub: volume {name} has no block checksums: skipped");
            return true;
        }
        Err(e) => {
            counters.errors.inc();
            tracing::warn!("volume scrub: volume {name}: {e}");
            return !stop.wait(Duration::ZERO);
        }
    };
    counters.bad_units.inc_by(report.bad.len() as u64);
    counters.repaired_units.inc_by(report.repaired() as u64);
    for b in report.bad.iter().take(BAD_LINES_PER_PASS) {
        tracing::warn!("volume scrub: {b}");
    }
    let said = if report.stopped {
        "stopped"
    } else {
        "scrubbed"
    };
    if report.bad.is_empty() {
        tracing::info!(
            "volume scrub: {said} volume {name}: {} units ({} bytes) verified over every copy, 0 bad",
            report.units,
            report.bytes
        );
    } else {
        tracing::warn!(
            "volume scrub: {said} volume {name}: {} units ({} bytes) verified over every copy, {} bad ({} not listed), {} repaired, {} left",
            report.units,
            report.bytes,
            report.bad.len(),
            report.bad.len().saturating_sub(BAD_LINES_PER_PASS),
            report.repaired(),
            report.left()
        );
    }
    !report.stopped
}
