//! `penstock volume mount VOL DIR`: parses the command line, sets the mount's I/O priority,
//! mounts the volume's filesystem (`crates/mount`, [`penstock_mount::MountFs`], which says how
//! it works) and waits for the unmount or a signal; without `--foreground` it serves from a
//! background process of its own.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use fuser::MountOption;
use penstock_core::units::parse_size;
use penstock_driver::volume::resolve;
use penstock_mount::{MountFs, MountOptions};

#[derive(Args, Debug)]
pub struct MountArgs {
    /// A member's path or a name from PENSTOCK_VOLUMES.
    pub vol: String,
    /// An existing empty directory to mount on.
    pub dir: PathBuf,
    /// Refuse every change (the volume is opened read-only).
    #[arg(long)]
    pub read_only: bool,
    /// Stay in the foreground until unmounted (default: return once mounted, serving from a
    /// background process).
    #[arg(long)]
    pub foreground: bool,
    /// Page-cache rule: a partition at least this large when opened is read and written with
    /// FUSE direct_io (no kernel page cache: a copy of a large file does not evict what
    /// streams need); smaller ones are cached by the kernel (index files read again and
    /// again).
    #[arg(long, value_parser = parse_size, default_value = "4MiB")]
    pub direct_io_min: u64,
    /// Page-cache rule: names ending in `.EXT` for one of these are always direct_io (media
    /// partitions, also while they are still small: a copy onto the mount starts at 0 bytes).
    /// Empty: by size only.
    #[arg(long, value_delimiter = ',', default_value = penstock_mount::DIRECT_IO_EXT_DEFAULT)]
    pub direct_io_ext: Vec<String>,
    /// With --foreground: how long to wait for the mount to appear before giving up
    /// (without --foreground the parent waits this long for its server to mount).
    #[arg(long, value_parser = penstock_core::units::parse_duration, default_value = "10s")]
    pub mount_timeout: Duration,
    /// After SIGTERM/SIGINT/SIGHUP on a busy mount (files open): how long open files are
    /// still served after the mount is detached, before what was written is committed and
    /// the server stops.
    #[arg(long, value_parser = penstock_core::units::parse_duration, default_value = "30s")]
    pub unmount_timeout: Duration,
    /// Disk class of the mount's reads and writes. The mount is a process of its own: the
    /// engine's DRR/EDF scheduler (one per engine worker) does not see its requests, so the
    /// class is carried by the kernel's I/O priority, which `mq-deadline` and `bfq` honour
    /// (`none` and `kyber` ignore it): `bulk` = IOPRIO_CLASS_IDLE (served when the device has
    /// nothing of a higher class waiting: a copy onto the mount yields to streams' reads);
    /// `rt` = IOPRIO_CLASS_RT (needs CAP_SYS_ADMIN or CAP_SYS_NICE; refused otherwise).
    #[arg(long, value_enum, default_value = "bulk")]
    pub class: MountClass,
    /// Write-behind bound per open file: each write's writeback is started at once by the
    /// mount's thread (at --class's priority), and once more than this is dirty or being
    /// written back, the thread waits for the oldest writes to reach the disk and drops them
    /// from the page cache. 0: leave written pages to the kernel's flusher threads (at their
    /// priority, not --class's).
    #[arg(long, value_parser = parse_size, default_value = "8MiB")]
    pub write_behind: u64,
}

/// `--class`: the engine's disk classes.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum MountClass {
    Bulk,
    Rt,
}

impl MountClass {
    fn ioprio(self) -> u16 {
        use penstock_driver::sys::{IoprioClass, ioprio_value};
        match self {
            MountClass::Bulk => ioprio_value(IoprioClass::Idle, 0),
            MountClass::Rt => ioprio_value(IoprioClass::RealTime, 0),
        }
    }

    fn name(self) -> &'static str {
        match self {
            MountClass::Bulk => "bulk",
            MountClass::Rt => "rt",
        }
    }
}

pub fn run(a: MountArgs) -> Result<()> {
    if !a.foreground {
        return run_in_background(&a);
    }
    // Set on this thread before the FUSE thread exists: threads inherit it.
    penstock_driver::sys::ioprio_set_current_thread(a.class.ioprio()).with_context(|| {
        format!(
            "--class {}: the kernel refused its I/O priority{}",
            a.class.name(),
            if a.class == MountClass::Rt {
                " (IOPRIO_CLASS_RT needs CAP_SYS_ADMIN or CAP_SYS_NICE)"
            } else {
                ""
            }
        )
    })?;
    let md = std::fs::metadata(&a.dir).with_context(|| format!("{}", a.dir.display()))?;
    if !md.is_dir() {
        bail!("{}: not a directory", a.dir.display());
    }
    let path = resolve(&a.vol)?;
    let (fs, note) = MountFs::open(
        &path,
        &MountOptions {
            read_only: a.read_only,
            direct_io_min: a.direct_io_min,
            direct_io_ext: a.direct_io_ext.clone(),
            write_behind: a.write_behind,
        },
    )?;
    if let Some(note) = &note {
        eprintln!("penstock: {note}");
    }
    let read_only = fs.read_only();
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::FSName(format!("penstock:{}", fs.volume_name())),
        MountOption::Subtype("penstock".to_string()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::NoExec,
        if read_only {
            MountOption::RO
        } else {
            MountOption::RW
        },
    ];
    let flusher = fs.flusher();
    let session = fuser::Session::new(fs, &a.dir, &config)
        .with_context(|| format!("mounting on {}", a.dir.display()))?;
    let (tx, rx) = std::sync::mpsc::channel::<&'static str>();
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ])?;
    let handle = signals.handle();
    let sig_tx = tx.clone();
    let sig_thread = std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            let _ = sig_tx.send("signal");
        }
    });
    let serve = std::thread::Builder::new()
        .name("fuse".to_string())
        .spawn(move || {
            let r = session.run();
            let _ = tx.send("unmounted");
            r
        })?;
    println!(
        "mounted {} on {}{}",
        a.vol,
        a.dir.display(),
        if read_only { " (read-only)" } else { "" }
    );
    // Waits for an unmount (fusermount -u, umount) or a signal: neither is a peer's answer.
    let why = rx.recv().unwrap_or("unmounted");
    handle.close();
    let _ = sig_thread.join();
    if why == "signal" {
        match umount2(&a.dir, rustix::mount::UnmountFlags::empty()) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                eprintln!(
                    "penstock: {} is busy: detached; open files are served until closed (at most {:?})",
                    a.dir.display(),
                    a.unmount_timeout
                );
                umount2(&a.dir, rustix::mount::UnmountFlags::DETACH)
                    .with_context(|| format!("unmounting {}", a.dir.display()))?;
            }
            Err(e) => {
                return Err(e).with_context(|| format!("unmounting {}", a.dir.display()));
            }
        }
        if rx.recv_timeout(a.unmount_timeout).is_err() {
            // Files still open after the timeout: commit what was written and stop.
            let failed = flusher.flush_all();
            bail!(
                "files on {} still open {:?} after the unmount; committed what was written{}",
                a.dir.display(),
                a.unmount_timeout,
                if failed.is_empty() {
                    String::new()
                } else {
                    format!(" except {failed:?}")
                }
            );
        }
    }
    let served = serve
        .join()
        .map_err(|_| anyhow::anyhow!("the FUSE thread panicked"))?;
    served.context("serving FUSE requests")?;
    println!("unmounted {}", a.dir.display());
    Ok(())
}

/// umount2(2), through rustix.
fn umount2(dir: &Path, flags: rustix::mount::UnmountFlags) -> io::Result<()> {
    rustix::mount::unmount(dir, flags).map_err(io::Error::from)
}

/// Without --foreground: runs `penstock volume mount … --foreground` as a child in its own
/// session, waits until DIR is mounted (or the child fails, whose message is then shown), and
/// returns; the child serves until unmounted.
fn run_in_background(a: &MountArgs) -> Result<()> {
    let exe = std::env::current_exe()?;
    let log = tempfile::NamedTempFile::new()?;
    let dir = std::fs::canonicalize(&a.dir).with_context(|| format!("{}", a.dir.display()))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["volume", "mount", "--foreground"])
        .arg(&a.vol)
        .arg(&dir)
        .arg(format!("--direct-io-min={}", a.direct_io_min))
        .arg(format!("--direct-io-ext={}", a.direct_io_ext.join(",")))
        .arg(format!("--class={}", a.class.name()))
        .arg(format!("--write-behind={}", a.write_behind))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log.reopen()?);
    if a.read_only {
        cmd.arg("--read-only");
    }
    penstock_driver::sys::setsid_on_exec(&mut cmd);
    let mut child = cmd.spawn()?;
    let started = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            let msg = std::fs::read_to_string(log.path()).unwrap_or_default();
            bail!("mount failed ({status}): {}", msg.trim());
        }
        if is_mounted(&dir) {
            println!(
                "mounted {} on {} (pid {})",
                a.vol,
                dir.display(),
                child.id()
            );
            return Ok(());
        }
        if started.elapsed() > a.mount_timeout {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "{} was not mounted within {:?}; stopped the server",
                dir.display(),
                a.mount_timeout
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether a FUSE file system of ours is mounted on `dir` (per /proc/self/mountinfo).
pub fn is_mounted(dir: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = dir.to_string_lossy();
    info.lines().any(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let tail: Vec<&str> = l.split(" - ").nth(1).unwrap_or("").split(' ').collect();
        f.len() > 4
            && f[4] == want
            && tail.len() > 1
            && tail[0].starts_with("fuse")
            && tail[1].starts_with("penstock:")
    })
}
