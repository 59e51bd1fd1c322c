//! The machine a report ran on, read from /proc and /sys, and the commit it ran.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

/// CPU model, cores, kernel, memory, the disk under `dir` (its name, model, rotational, I/O
/// scheduler) and the load average now.
pub fn describe(dir: &Path) -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown".to_string(), |(_, v)| v.trim().to_string());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = read_trim("/proc/sys/kernel/osrelease");
    let mem_kib: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    json!({
        "cpu_model": cpu_model,
        "cores": cores,
        "kernel": kernel,
        "memory_bytes": mem_kib * 1024,
        "disk": disk_of(dir),
        "load_average_start": loadavg(),
    })
}

/// `/proc/loadavg`'s first three fields.
pub fn loadavg() -> String {
    read_trim("/proc/loadavg")
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn read_trim(p: &str) -> String {
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The block device holding `dir`: /sys/dev/block/MAJ:MIN, its whole disk when it is a
/// partition.
fn disk_of(dir: &Path) -> Value {
    let Ok(meta) = std::fs::metadata(dir) else {
        return json!({"name": "unknown"});
    };
    let dev = meta.dev();
    let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
    let sys = format!("/sys/dev/block/{major}:{minor}");
    let Ok(real) = std::fs::canonicalize(&sys) else {
        return json!({"name": format!("{major}:{minor} (not a block device: e.g. tmpfs or overlay)")});
    };
    // A partition's directory sits inside its disk's and has a `partition` file.
    let disk_dir = if real.join("partition").exists() {
        real.parent().map(Path::to_path_buf).unwrap_or(real.clone())
    } else {
        real.clone()
    };
    let name = disk_dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("?")
        .to_string();
    let q = |f: &str| {
        std::fs::read_to_string(disk_dir.join("queue").join(f))
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let model = std::fs::read_to_string(disk_dir.join("device").join("model"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let size_bytes = std::fs::read_to_string(disk_dir.join("size"))
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map_or(0, |sectors| sectors * 512);
    json!({
        "name": name,
        "model": model,
        "size_bytes": size_bytes,
        "rotational": q("rotational") == "1",
        "scheduler": q("scheduler"),
    })
}

/// `git rev-parse HEAD` (and whether the tree had changes), else the build's version.
pub fn commit() -> Value {
    // Where the run started, else the tree this binary was built from (when it is still
    // there).
    let here = git_commit(None);
    here.or_else(|| git_commit(Some(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))))
        .unwrap_or_else(|| json!({"source": "build", "rev": format!("penstock {}", env!("CARGO_PKG_VERSION")), "dirty": false}))
}

fn git_commit(dir: Option<&str>) -> Option<Value> {
    let git = |args: &[&str]| {
        let mut c = Command::new("git");
        if let Some(d) = dir {
            c.arg("-C").arg(d);
        }
        c.args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let rev = git(&["rev-parse", "HEAD"]).filter(|r| !r.is_empty())?;
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    Some(
        json!({"source": if dir.is_some() { "git (the build's source tree)" } else { "git" }, "rev": rev, "dirty": dirty}),
    )
}
