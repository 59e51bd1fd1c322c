//! `penstock bench stripe`: Clockwise Fig. 1 and MARS Table 1's ccd column — read and write
//! throughput of a partition striped over 1, 2, 3 and 4 members.
//!
//! Members must behave like independent disks for the ratio to mean anything. Where this
//! process may (root, `losetup`, a blkio/io cgroup), each member is a loop device over a sparse
//! file, and a cgroup throttles reads and writes of each loop device to `--rate` (cgroup v1
//! `blkio.throttle.{read,write}_bps_device` or v2 `io.max rbps= wbps=`); this process moves
//! into that cgroup before its engine starts, so its io_uring reads and writes are the ones
//! throttled. Otherwise members are plain sparse files, and the table shows only the striping
//! overhead (holes read at memory speed), which the output says.
//!
//! Writes: a file of `--size` bytes (in the page cache: the source costs no disk) streamed
//! into the striped partition, timed up to the members' data being synced; the baselines are
//! the members' own rate (`k × --rate`) and the same stream into a plain file beside the
//! members (same disk, not throttled), synced likewise.
//!
//! Loop devices and the cgroup are removed on every exit path that unwinds (errors included);
//! a SIGKILL leaves them behind (`losetup -d`, `rmdir` the `penstock-bench-*` cgroup).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use penstock_core::endpoint::{Endpoint, PartitionName, VolumeName};
use penstock_core::units::parse_size;
use penstock_core::volume::Placement;
use penstock_core::volume::layout::BLOCK_BYTES_DEFAULT;
use penstock_driver::clock::{CpuWho, cpu_times};

use crate::stats::median;
use penstock_driver::open::{open_target, opened_partition};
use penstock_driver::volume::{CreateSpec, Volume};
use penstock_driver::{Engine, EngineConfig, StreamSpec, ZeroCopy};

#[derive(Args, Debug)]
pub struct StripeArgs {
    /// Partition size read in each run.
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    pub size: u64,
    /// Read rate of each throttled member, bytes per second.
    #[arg(long, default_value = "100MB", value_parser = parse_size)]
    pub rate: u64,
    /// Stripe unit.
    #[arg(long, default_value = "64KiB", value_parser = parse_size)]
    pub stripe_unit: u64,
    /// Repetitions per member count (medians are reported).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Reads (and writes) a stream keeps in flight on each member.
    #[arg(long, default_value_t = 8)]
    pub depth: usize,
    /// Directory for the member files.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Use plain files even where throttled loop devices are possible.
    #[arg(long)]
    pub no_throttle: bool,
    /// Compare reads of a mirrored volume (`volume create --mirror 2`) over the 4 members
    /// with an unmirrored one over the same members, instead of the 1..4 member table.
    #[arg(long)]
    pub mirror: bool,
    /// The block checksums' cost: reads of the same bytes from a volume with checksums
    /// (verified on every read) and from one without, over plain member files in `--dir`
    /// (tmpfs, e.g. /dev/shm, so that the disk's noise does not hide it), runs alternating,
    /// instead of the 1..4 member table.
    #[arg(long, conflicts_with = "mirror")]
    pub checksums: bool,
    /// With `--checksums`: the members of both volumes are loop devices over the files in
    /// `--dir`, each read-throttled to `--rate` by a cgroup (a disk-bound read: the cost
    /// that shows when the disk, not the CPU, sets the pace), instead of plain files.
    #[arg(long, requires = "checksums")]
    pub throttled: bool,
    /// Write the table as JSON here; a bare `--json` writes it on stdout (the table then
    /// goes to stderr).
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
}

const MEMBERS_MAX: usize = 4;
const CGROUP_V1: &str = "/sys/fs/cgroup/blkio";
const CGROUP_V2: &str = "/sys/fs/cgroup";

/// Loop devices and a cgroup, torn down on drop.
#[derive(Default)]
pub(crate) struct Throttle {
    loops: Vec<String>,
    cgroup: Option<PathBuf>,
    /// The cgroup this process came from (to move back before removing ours).
    parent_procs: Option<PathBuf>,
}

impl Drop for Throttle {
    fn drop(&mut self) {
        if let (Some(cg), Some(parent)) = (&self.cgroup, &self.parent_procs) {
            let _ = std::fs::write(parent, std::process::id().to_string());
            if let Err(e) = std::fs::remove_dir(cg) {
                eprintln!(
                    "penstock: warning: could not remove cgroup {}: {e}",
                    cg.display()
                );
            }
        }
        for dev in self.loops.drain(..) {
            match Command::new("losetup").args(["-d", &dev]).status() {
                Ok(s) if s.success() => {}
                _ => eprintln!("penstock: warning: could not detach {dev} (losetup -d {dev})"),
            }
        }
    }
}

fn write(path: &Path, what: &str) -> Result<()> {
    std::fs::write(path, what).with_context(|| format!("write {what:?} to {}", path.display()))
}

/// Makes each file a loop device and throttles its reads (to `rate` bytes/s, and `iops`
/// reads/s if given) in a new cgroup holding this process.
pub(crate) fn throttle(
    files: &[PathBuf],
    rate: u64,
    iops: Option<u64>,
    t: &mut Throttle,
) -> Result<Vec<PathBuf>> {
    if !rustix::process::geteuid().is_root() {
        bail!("not root");
    }
    let v1 = Path::new(CGROUP_V1)
        .join("blkio.throttle.read_bps_device")
        .exists();
    let v2 = std::fs::read_to_string(Path::new(CGROUP_V2).join("cgroup.subtree_control"))
        .is_ok_and(|c| c.split_whitespace().any(|x| x == "io"));
    if !v1 && !v2 {
        bail!("no blkio (v1) or io (v2) cgroup controller to throttle with");
    }
    let mut devs = Vec::new();
    for f in files {
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(f)
            .output()
            .context("losetup")?;
        if !out.status.success() {
            bail!("losetup: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        t.loops.push(dev.clone());
        devs.push(PathBuf::from(dev));
    }
    let root = if v1 { CGROUP_V1 } else { CGROUP_V2 };
    let cg = Path::new(root).join(format!("penstock-bench-{}", std::process::id()));
    std::fs::create_dir(&cg).with_context(|| format!("mkdir {}", cg.display()))?;
    t.cgroup = Some(cg.clone());
    t.parent_procs = Some(Path::new(root).join("cgroup.procs"));
    for d in &devs {
        let rdev = std::fs::metadata(d)
            .map(|m| std::os::unix::fs::MetadataExt::rdev(&m))
            .with_context(|| format!("stat {}", d.display()))?;
        let (maj, min) = (rustix::fs::major(rdev), rustix::fs::minor(rdev));
        if v1 {
            write(
                &cg.join("blkio.throttle.read_bps_device"),
                &format!("{maj}:{min} {rate}"),
            )?;
            write(
                &cg.join("blkio.throttle.write_bps_device"),
                &format!("{maj}:{min} {rate}"),
            )?;
            if let Some(iops) = iops {
                write(
                    &cg.join("blkio.throttle.read_iops_device"),
                    &format!("{maj}:{min} {iops}"),
                )?;
            }
        } else {
            let iops = iops.map(|n| format!(" riops={n}")).unwrap_or_default();
            write(
                &cg.join("io.max"),
                &format!("{maj}:{min} rbps={rate} wbps={rate}{iops}"),
            )?;
        }
    }
    write(&cg.join("cgroup.procs"), &std::process::id().to_string())?;
    Ok(devs)
}

pub fn run(a: StripeArgs) -> Result<()> {
    if a.reps == 0 || a.size == 0 {
        bail!("--reps and --size must be positive");
    }
    let dir = match &a.dir {
        Some(d) => tempfile::Builder::new()
            .prefix("penstock-stripe")
            .tempdir_in(d)?,
        None => tempfile::Builder::new()
            .prefix("penstock-stripe")
            .tempdir()?,
    };
    // One member must hold the whole partition: data, the metadata area, a spare block.
    let member_bytes = a.size.div_ceil(BLOCK_BYTES_DEFAULT) * BLOCK_BYTES_DEFAULT + (4 << 20);
    let mut files = Vec::new();
    for i in 0..MEMBERS_MAX {
        let p = dir.path().join(format!("member{i}"));
        let f = std::fs::File::create(&p)?;
        f.set_len(member_bytes)?; // sparse: reads of holes cost no disk
        files.push(p);
    }
    let mut guard = Throttle::default();
    // The checksums' cost is CPU: plain files in `--dir` (tmpfs), never throttled devices.
    let (members, mode) = if a.no_throttle || a.checksums {
        (
            files.clone(),
            if a.checksums {
                "--checksums: two volumes over members of their own (said below)".to_string()
            } else {
                "plain files (--no-throttle): the table shows only overhead".to_string()
            },
        )
    } else {
        match throttle(&files, a.rate, None, &mut guard) {
            Ok(devs) => (
                devs,
                format!(
                    "loop devices over sparse files, each read- and write-throttled to {} MB/s by a cgroup",
                    a.rate as f64 / 1e6
                ),
            ),
            Err(e) => {
                drop(std::mem::take(&mut guard));
                (
                    files.clone(),
                    format!(
                        "plain files (no throttled loop devices here: {e:#}): the table shows only overhead"
                    ),
                )
            }
        }
    };
    eprintln!("penstock bench stripe: {mode}");
    // `--depth` reads in flight on every member (loop devices: nothing calibrated them), and
    // the buffer being sent or written.
    let depth = a.depth.max(1);
    let engine = Engine::new(EngineConfig {
        workers: 1,
        pool_buffers: (depth + 1) * 2,
        buffer_bytes: 1 << 20,
        stream_depth: depth + 1,
        client_buffers_max: depth + 1,
        read_depth: penstock_driver::ReadDepthConfig {
            fixed: Some(depth),
            ..Default::default()
        },
        ..EngineConfig::default()
    })?;
    if a.checksums {
        if let Err(why) = &engine.info().uring {
            bail!("the volume data path needs io_uring: {why}");
        }
        let rows = checksum_rows(&a, dir.path(), member_bytes, &engine, &mut guard)?;
        drop(engine);
        drop(guard);
        return checksum_table(&a, depth, &rows);
    }
    if a.mirror {
        if let Err(why) = &engine.info().uring {
            bail!("the volume data path needs io_uring: {why}");
        }
        let rows = mirror_rows(&a, &members, &engine)?;
        drop(engine);
        drop(guard);
        return mirror_table(&a, &mode, depth, &rows);
    }
    // The writes' source: `--size` bytes in the page cache.
    let source_path = dir.path().join("source");
    {
        let mut f = std::fs::File::create(&source_path)?;
        let block: Vec<u8> = (0..1u32 << 20).map(|i| (i * 31 + 7) as u8).collect();
        let mut left = a.size;
        while left > 0 {
            let n = left.min(block.len() as u64) as usize;
            f.write_all(&block[..n])?;
            left -= n as u64;
        }
    }
    let file_ep = Endpoint::File {
        path: source_path.clone(),
    };
    // The baseline of the writes: the same stream into a plain file on the members' disk.
    let plain_path = dir.path().join("plain");
    let mut plain_mbps = Vec::new();
    for _ in 0..a.reps {
        let _ = std::fs::remove_file(&plain_path);
        let plain_ep = Endpoint::File {
            path: plain_path.clone(),
        };
        let t0 = Instant::now();
        let report = engine
            .open(StreamSpec {
                zero_copy: ZeroCopy::Off,
                ..StreamSpec::new(file_ep.clone(), plain_ep)
            })?
            .wait()?;
        std::fs::File::open(&plain_path)?.sync_all()?;
        let secs = t0.elapsed().as_secs_f64();
        if report.bytes != a.size {
            bail!("wrote {} bytes of {} to a plain file", report.bytes, a.size);
        }
        plain_mbps.push(a.size as f64 / secs / 1e6);
    }
    let _ = std::fs::remove_file(&plain_path);
    let plain_mbps = median(&plain_mbps);
    if let Err(why) = &engine.info().uring {
        bail!("the volume data path needs io_uring: {why}");
    }
    let mut rows = Vec::new();
    for k in 1..=MEMBERS_MAX {
        let mut v = Volume::create(&CreateSpec {
            name: "bench".to_string(),
            members: members[..k].to_vec(),
            member_size_bytes: None,
            stripe_unit_bytes: a.stripe_unit,
            block_bytes: BLOCK_BYTES_DEFAULT,
            force: true,
            copies: 1,
            // Unwritten blocks (allocated, never written) have no checksums to verify.
            sums: false,
        })?;
        v.begin_partition("p", a.size, &Placement::Striped)?;
        v.finish_partition("p")?;
        let (mut mbps, mut cpu) = (Vec::new(), Vec::new());
        for _ in 0..a.reps {
            let (r, c) = read_partition(&engine, &v, "bench", a.size)?;
            mbps.push(r);
            cpu.push(c);
        }
        // Writes: the source file streamed into the same partition, up to the members'
        // data synced.
        let (mut wmbps, mut wcpu) = (Vec::new(), Vec::new());
        for _ in 0..a.reps {
            let source = penstock_driver::open::open_source(&file_ep, &mut |_| {})?;
            let target = opened_partition(v.partition_io("p", false)?)?;
            let spec = StreamSpec {
                zero_copy: ZeroCopy::Off,
                ..StreamSpec::new(
                    file_ep.clone(),
                    Endpoint::Volume {
                        volume: VolumeName::parse("bench")?,
                        partition: PartitionName::parse("p")?,
                    },
                )
            };
            let c0 = cpu_times(CpuWho::Process);
            let t0 = Instant::now();
            let report = engine.open_opened(spec, source, target)?.wait()?;
            for m in &members[..k] {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(m)?
                    .sync_data()?;
            }
            let secs = t0.elapsed().as_secs_f64();
            let c1 = cpu_times(CpuWho::Process);
            if report.bytes != a.size {
                bail!("wrote {} bytes of {}", report.bytes, a.size);
            }
            let gb = a.size as f64 / 1e9;
            wmbps.push(a.size as f64 / secs / 1e6);
            wcpu.push(((c1.user_ns - c0.user_ns) + (c1.sys_ns - c0.sys_ns)) as f64 / 1e9 / gb);
        }
        rows.push(Row {
            members: k,
            read_mbps: median(&mbps),
            read_cpu: median(&cpu),
            write_mbps: median(&wmbps),
            write_cpu: median(&wcpu),
        });
    }
    drop(engine);
    drop(guard);
    let mut h = crate::out::human(a.json.as_deref());
    writeln!(
        h,
        "read and write of a {} MiB striped partition (stripe unit {} KiB, {} x 1 MiB in flight), median of {}",
        a.size >> 20,
        a.stripe_unit >> 10,
        depth,
        a.reps
    )?;
    writeln!(h, "members: {mode}")?;
    writeln!(
        h,
        "writes: a {} MiB file in the page cache streamed in, timed up to the members synced; \
         the same stream into a plain file on the members' disk (synced): {plain_mbps:.1} MB/s",
        a.size >> 20
    )?;
    writeln!(
        h,
        "| members | read MB/s | read × 1 member | read CPU s/GB | write MB/s | write × 1 member | write CPU s/GB |"
    )?;
    writeln!(h, "|---:|---:|---:|---:|---:|---:|---:|")?;
    let (rbase, wbase) = (rows[0].read_mbps, rows[0].write_mbps);
    for r in &rows {
        writeln!(
            h,
            "| {} | {:.1} | {:.2} | {:.3} | {:.1} | {:.2} | {:.3} |",
            r.members,
            r.read_mbps,
            r.read_mbps / rbase,
            r.read_cpu,
            r.write_mbps,
            r.write_mbps / wbase,
            r.write_cpu
        )?;
    }
    if let Some(p) = &a.json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({"members": r.members, "mb_per_s": r.read_mbps,
                    "ratio_to_1": r.read_mbps / rbase, "cpu_s_per_gb": r.read_cpu,
                    "write_mb_per_s": r.write_mbps, "write_ratio_to_1": r.write_mbps / wbase,
                    "write_cpu_s_per_gb": r.write_cpu})
            })
            .collect();
        crate::out::write_json(
            p,
            &serde_json::json!({"bench": "stripe", "members": mode.to_string(), "size": a.size,
                "stripe_unit": a.stripe_unit, "depth": depth, "reps": a.reps,
                "member_rate_bytes_per_s": a.rate, "plain_file_write_mb_per_s": plain_mbps,
                "rows": v}),
        )?;
    }
    Ok(())
}

/// Reads of a `--size` striped partition over all members, unmirrored then mirrored (each
/// piece read from the copy on the less loaded member): (copies, median MB/s, median CPU
/// s/GB). The members are the same devices in both runs, so the ratio is the mirror's cost.
fn mirror_rows(
    a: &StripeArgs,
    members: &[PathBuf],
    engine: &Engine,
) -> Result<Vec<(u8, f64, f64)>> {
    let mut rows = Vec::new();
    for copies in [1u8, 2] {
        let mut v = Volume::create(&CreateSpec {
            name: "bench".to_string(),
            members: members.to_vec(),
            member_size_bytes: None,
            stripe_unit_bytes: a.stripe_unit,
            block_bytes: BLOCK_BYTES_DEFAULT,
            force: true,
            copies,
            sums: false,
        })?;
        v.begin_partition("p", a.size, &Placement::Striped)?;
        v.finish_partition("p")?;
        let (mut mbps, mut cpu) = (Vec::new(), Vec::new());
        for _ in 0..a.reps {
            let (m, c) = read_partition(engine, &v, "bench", a.size)?;
            mbps.push(m);
            cpu.push(c);
        }
        rows.push((copies, median(&mbps), median(&cpu)));
    }
    Ok(rows)
}

fn mirror_table(a: &StripeArgs, mode: &str, depth: usize, rows: &[(u8, f64, f64)]) -> Result<()> {
    let mut h = crate::out::human(a.json.as_deref());
    writeln!(
        h,
        "read of a {} MiB partition striped over {MEMBERS_MAX} members (stripe unit {} KiB, {} x 1 MiB in flight), unmirrored and mirrored, median of {}",
        a.size >> 20,
        a.stripe_unit >> 10,
        depth,
        a.reps
    )?;
    writeln!(h, "members: {mode}")?;
    writeln!(h, "| copies | read MB/s | × unmirrored | read CPU s/GB |")?;
    writeln!(h, "|---:|---:|---:|---:|")?;
    let base = rows[0].1;
    for (copies, mbps, cpu) in rows {
        writeln!(
            h,
            "| {copies} | {mbps:.1} | {:.2} | {cpu:.3} |",
            mbps / base
        )?;
    }
    if let Some(p) = &a.json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|(c, m, cpu)| {
                serde_json::json!({"copies": c, "mb_per_s": m, "ratio_to_unmirrored": m / base,
                    "cpu_s_per_gb": cpu})
            })
            .collect();
        crate::out::write_json(
            p,
            &serde_json::json!({"bench": "stripe-mirror", "members": mode.to_string(),
                "size": a.size, "stripe_unit": a.stripe_unit, "depth": depth, "reps": a.reps,
                "member_rate_bytes_per_s": a.rate, "rows": v}),
        )?;
    }
    Ok(())
}

/// Reads of one `--size` partition striped over 4 plain member files, from a volume with
/// block checksums and from one without (the same bytes, members side by side in `dir`), the
/// runs alternating.
fn checksum_rows(
    a: &StripeArgs,
    dir: &Path,
    member_bytes: u64,
    engine: &Engine,
    guard: &mut Throttle,
) -> Result<Vec<ChecksumRow>> {
    let media: Vec<u8> = {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        (0..a.size)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    };
    let mut files: Vec<Vec<PathBuf>> = Vec::new();
    for name in ["plain", "sums"] {
        let members: Vec<PathBuf> = (0..MEMBERS_MAX)
            .map(|i| dir.join(format!("{name}{i}")))
            .collect();
        for m in &members {
            // Room for the sum area too (a few hundred KiB per GiB).
            std::fs::File::create(m)?.set_len(member_bytes + (1 << 20))?;
        }
        files.push(members);
    }
    if a.throttled {
        let all: Vec<PathBuf> = files.concat();
        let devs = throttle(&all, a.rate, None, guard).context("--throttled")?;
        eprintln!(
            "penstock bench stripe: members are loop devices, each read-throttled to {} MB/s",
            a.rate as f64 / 1e6
        );
        files = devs.chunks(MEMBERS_MAX).map(<[PathBuf]>::to_vec).collect();
    }
    let mut vols = Vec::new();
    for (sums, members) in [false, true].into_iter().zip(files) {
        let name = if sums { "sums" } else { "plain" };
        let mut v = Volume::create(&CreateSpec {
            name: name.to_string(),
            members: members.clone(),
            member_size_bytes: None,
            stripe_unit_bytes: a.stripe_unit,
            block_bytes: BLOCK_BYTES_DEFAULT,
            force: true,
            copies: 1,
            sums,
        })?;
        v.begin_partition("p", a.size, &Placement::Striped)?;
        {
            let mut pio = v.partition_io("p", true)?;
            pio.make_buffered()?;
            let (n, e) = pio.write_vectored_at(&[&media], 0);
            if let Some(e) = e {
                bail!("writing the partition: {e} after {n} bytes");
            }
            pio.finish()?; // seals the checksums, syncs
        }
        v.finish_partition("p")?;
        vols.push((sums, name, v));
    }
    let mut runs: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); 2];
    for _ in 0..a.reps {
        for (i, (_, name, v)) in vols.iter().enumerate() {
            let (r, c) = read_partition(engine, v, name, a.size)?;
            runs[i].0.push(r);
            runs[i].1.push(c);
        }
    }
    let (failed, _, _) = penstock_driver::sums::counters();
    if failed > 0 {
        bail!("{failed} block checksum failures while reading what was just written");
    }
    Ok(vols
        .iter()
        .zip(runs)
        .map(|((sums, _, _), (mbps, cpu))| ChecksumRow {
            sums: *sums,
            mbps: median(&mbps),
            cpu: median(&cpu),
            runs: mbps,
        })
        .collect())
}

/// One side of `--checksums`: medians over the runs, and each run's MB/s.
struct ChecksumRow {
    sums: bool,
    mbps: f64,
    /// CPU seconds per GB read (= ns per byte).
    cpu: f64,
    runs: Vec<f64>,
}

/// Partition `p` of `v` (volume `name`) read once through the engine to /dev/null, checked
/// to be `size` bytes: MB/s and the process's CPU (user + system) in ns per byte.
fn read_partition(engine: &Engine, v: &Volume, name: &str, size: u64) -> Result<(f64, f64)> {
    let source = opened_partition(v.partition_io("p", false)?)?;
    let null = Endpoint::File {
        path: PathBuf::from("/dev/null"),
    };
    let target = open_target(&null, &mut |_| {})?;
    let spec = StreamSpec {
        zero_copy: ZeroCopy::Off,
        ..StreamSpec::new(
            Endpoint::Volume {
                volume: VolumeName::parse(name)?,
                partition: PartitionName::parse("p")?,
            },
            null,
        )
    };
    let c0 = cpu_times(CpuWho::Process);
    let t0 = Instant::now();
    let report = engine.open_opened(spec, source, target)?.wait()?;
    let secs = t0.elapsed().as_secs_f64();
    let c1 = cpu_times(CpuWho::Process);
    if report.bytes != size {
        bail!("read {} bytes of {}", report.bytes, size);
    }
    let gb = size as f64 / 1e9;
    Ok((
        size as f64 / secs / 1e6,
        ((c1.user_ns - c0.user_ns) + (c1.sys_ns - c0.sys_ns)) as f64 / 1e9 / gb,
    ))
}

fn checksum_table(a: &StripeArgs, depth: usize, rows: &[ChecksumRow]) -> Result<()> {
    let mut h = crate::out::human(a.json.as_deref());
    writeln!(
        h,
        "read of a {} MiB partition striped over {MEMBERS_MAX} {} (stripe unit {} KiB, {} x 1 MiB in flight), without and with block checksums, runs alternating, median of {}",
        a.size >> 20,
        if a.throttled {
            format!(
                "loop devices each read-throttled to {} MB/s",
                a.rate as f64 / 1e6
            )
        } else {
            "plain member files".to_string()
        },
        a.stripe_unit >> 10,
        depth,
        a.reps
    )?;
    writeln!(
        h,
        "| checksums | read MB/s | × without | read CPU s/GB | runs MB/s |"
    )?;
    writeln!(h, "|---|---:|---:|---:|---|")?;
    let (base, base_cpu) = (rows[0].mbps, rows[0].cpu);
    for r in rows {
        let all: Vec<String> = r.runs.iter().map(|m| format!("{m:.0}")).collect();
        writeln!(
            h,
            "| {} | {:.1} | {:.3} | {:.3} | {} |",
            if r.sums { "verified" } else { "none" },
            r.mbps,
            r.mbps / base,
            r.cpu,
            all.join(", ")
        )?;
    }
    // CPU s/GB is ns/B.
    let added_ns_per_byte = rows[1].cpu - base_cpu;
    writeln!(
        h,
        "checksums cost {:.1} % of the read throughput and {added_ns_per_byte:.3} CPU ns per byte",
        (1.0 - rows[1].mbps / base) * 100.0,
    )?;
    if let Some(p) = &a.json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({"checksums": r.sums, "mb_per_s": r.mbps,
                    "ratio_to_none": r.mbps / base, "cpu_s_per_gb": r.cpu,
                    "runs_mb_per_s": r.runs})
            })
            .collect();
        crate::out::write_json(
            p,
            &serde_json::json!({"bench": "stripe-checksums", "size": a.size,
                "throttled_rate_bytes_per_s": a.throttled.then_some(a.rate),
                "stripe_unit": a.stripe_unit, "depth": depth, "reps": a.reps,
                "added_cpu_ns_per_byte": added_ns_per_byte, "rows": v}),
        )?;
    }
    Ok(())
}

/// One member count's medians.
struct Row {
    members: usize,
    read_mbps: f64,
    read_cpu: f64,
    write_mbps: f64,
    write_cpu: f64,
}
