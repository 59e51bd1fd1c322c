//! How long this process's threads waited for a CPU: `/proc/self/task/TID/schedstat`'s second
//! field (time spent runnable on a run queue, not running), per thread, by thread-name prefix.
//! The benches use it to tell a late unit's CPU share (the engine's worker was ready but not
//! running, e.g. on a machine loaded by other work) from its disk share.

use std::collections::HashMap;
use std::time::Duration;

/// Run-queue wait (ns) of each live thread of this process whose name starts with a prefix.
#[derive(Debug, Clone, Default)]
pub struct Snapshot(HashMap<u32, u64>);

/// The threads named `prefix…` now, with their run-queue wait so far. Threads whose files
/// cannot be read (exited meanwhile, or a kernel without schedstats) are left out.
pub fn snapshot(prefix: &str) -> Snapshot {
    let mut m = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Snapshot(m);
    };
    for e in dir.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|t| t.parse::<u32>().ok()) else {
            continue;
        };
        let p = e.path();
        let named =
            std::fs::read_to_string(p.join("comm")).is_ok_and(|c| c.trim_end().starts_with(prefix));
        if !named {
            continue;
        }
        if let Some(wait) = std::fs::read_to_string(p.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        {
            m.insert(tid, wait);
        }
    }
    Snapshot(m)
}

impl Snapshot {
    /// The run-queue wait the threads named `prefix…` accumulated since `self` was taken
    /// (threads started since count from zero). Call while those threads still live.
    pub fn waited_since(&self, prefix: &str) -> Duration {
        let now = snapshot(prefix);
        let ns: u64 = now
            .0
            .iter()
            .map(|(tid, w)| w.saturating_sub(self.0.get(tid).copied().unwrap_or(0)))
            .sum();
        Duration::from_nanos(ns)
    }
}

/// Reads completed and milliseconds spent reading (queued in the kernel and in the device) by
/// the block device holding `path`, from `/sys/dev/block/MAJ:MIN/stat`; None when unknown.
pub fn disk_reads(path: &std::path::Path) -> Option<(u64, u64)> {
    let st = rustix::fs::stat(path).ok()?;
    let (maj, min) = (rustix::fs::major(st.st_dev), rustix::fs::minor(st.st_dev));
    let s = std::fs::read_to_string(format!("/sys/dev/block/{maj}:{min}/stat")).ok()?;
    let f: Vec<u64> = s
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    Some((*f.first()?, *f.get(3)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_kept_off_the_cpu_by_a_busy_one_shows_run_queue_wait() {
        // Two threads pinned to one CPU, both spinning: each is runnable while the other runs.
        let cpu = rustix::thread::sched_getcpu();
        let spin = move |name: &str| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    let mut set = rustix::thread::CpuSet::new();
                    set.set(cpu);
                    let _ = rustix::thread::sched_setaffinity(None, &set);
                    let t0 = std::time::Instant::now();
                    while t0.elapsed() < Duration::from_millis(300) {
                        std::hint::spin_loop();
                    }
                })
                .unwrap()
        };
        let before = snapshot("ssw-");
        let (a, b) = (spin("ssw-a"), spin("ssw-b"));
        std::thread::sleep(Duration::from_millis(250));
        let waited = before.waited_since("ssw-");
        a.join().unwrap();
        b.join().unwrap();
        if !std::path::Path::new("/proc/self/schedstat").exists() {
            eprintln!("SKIPPED: no schedstats in this kernel");
            return;
        }
        // Sharing one CPU for 250 ms, the two waited at least a fifth of that between them.
        assert!(waited >= Duration::from_millis(50), "waited {waited:?}");
        assert_eq!(snapshot("no-such-thread-").0.len(), 0);
    }
}
