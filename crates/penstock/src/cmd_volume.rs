//! `penstock volume …`: create, list, add partitions to, import into, export from, remove from
//! and check a volume (issue 6). Thin glue: `penstock_driver::volume` opens and updates the
//! volume, the engine moves partition bytes.
//!
//! VOL is the path of any member, or a name defined in `PENSTOCK_VOLUMES=NAME=PATH[,…]`
//! (for `create`, VOL is the name to record). Lines on stdout are meant for scripts:
//! `created partition NAME BYTES` is printed only once the partition is durable and `Ready`.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use penstock_core::endpoint::{Endpoint, PartitionName, VolumeName};
use penstock_core::units::{parse_duration, parse_size};
use penstock_core::volume::layout::{BLOCK_BYTES_DEFAULT, STRIPE_UNIT_BYTES_DEFAULT};
use penstock_core::volume::{MemberIndex, MemberState, PartitionKind, PartitionState, Placement};
use penstock_driver::open::{open_source, open_target, opened_partition};
use penstock_driver::rebuild::RebuildOptions;
use penstock_driver::volume::{Access, CreateSpec, Volume, resolve};
use penstock_driver::{Engine, EngineConfig, StreamReport, StreamSpec, ZeroCopy};

/// `penstock volume [--grow-step SIZE] [--lock-wait DURATION] COMMAND`.
#[derive(Args, Debug)]
pub struct VolumeArgs {
    #[command(flatten)]
    pub limits: VolumeLimitArgs,
    #[command(subcommand)]
    pub cmd: VolumeCommand,
}

/// The limits of volume updates made by this process (`penstock volume`, `penstock record`).
#[derive(Args, Debug, Default)]
pub struct VolumeLimitArgs {
    /// The largest step a growing partition allocates ahead of its writes (rounded up to one
    /// block per member of the partition; given back when the writer finishes, or by `volume
    /// check --repair` after it was killed).
    #[arg(long, global = true, value_parser = parse_size, default_value = "256MiB")]
    pub grow_step: u64,
    /// How long a metadata update (growth, truncation, add, rm) waits for another process's
    /// update to finish before failing.
    #[arg(long, global = true, value_parser = parse_duration, default_value = "30s")]
    pub lock_wait: std::time::Duration,
}

impl VolumeLimitArgs {
    /// Sets them for this process.
    pub fn apply(&self) -> Result<()> {
        if self.grow_step == 0 {
            bail!("--grow-step must be above 0");
        }
        penstock_driver::volume::set_limits(penstock_driver::volume::VolumeLimits {
            update_lock_wait: self.lock_wait,
            grow_step_bytes: self.grow_step,
        })?;
        Ok(())
    }
}

#[derive(Subcommand, Debug)]
pub enum VolumeCommand {
    /// Create volume VOL (a name) over the members.
    Create(CreateArgs),
    /// List a volume's geometry, members and partitions.
    Ls(VolArg),
    /// Add an empty partition; it grows as it is written (--size reserves blocks ahead).
    AddPartition(AddArgs),
    /// Create partition NAME holding FILE's bytes (a stream through the engine).
    Import(ImportArgs),
    /// Copy partition NAME to FILE (a stream through the engine).
    Export(ExportArgs),
    /// Remove a partition and free its blocks.
    Rm(RmArgs),
    /// Cut a partition to SIZE bytes and give back the blocks beyond (its reservation is
    /// lowered to SIZE too).
    Truncate(TruncateArgs),
    /// Verify both metadata copies of every member, the allocation map and (mirrored) every
    /// member's health; --repair fixes what can be proven and rebuilds replaced members from
    /// the mirror as bulk-class engine streams, with progress on stderr (SIGINT stops it; the
    /// member stays rebuilding) (exit 1 while problems remain).
    Check(CheckArgs),
    /// Mount the volume's partitions as regular files in DIR (FUSE); unmount with
    /// `fusermount3 -u DIR`, `umount DIR` or SIGTERM (see docs/volume-format.md, "Mount").
    Mount(crate::cmd_mount::MountArgs),
    /// Replace member OLD (its index or recorded path) of a mirrored volume by NEW (a block
    /// device, or a plain file created with OLD's size when missing); then
    /// `volume check --repair` copies its blocks from the mirror.
    Replace(ReplaceArgs),
    /// Read every copy of every partition's bytes and check their block checksums; a block
    /// bad on one copy and good on the other is rewritten from it (unless --no-repair).
    /// Exit 1 while a bad block remains.
    Scrub(ScrubArgs),
}

#[derive(Args, Debug)]
pub struct ScrubArgs {
    pub vol: String,
    /// Report only; rewrite nothing.
    #[arg(long)]
    pub no_repair: bool,
    /// An average rate limit on the bytes read (every copy counted; bytes: 50MB/s,
    /// 200MiB/s; bits: 400Mbps), enforced between 1 MiB chunks. Default: none. The scrub's
    /// reads run at the idle I/O priority whatever the rate (streams of the same disks go
    /// first where the disk's scheduler honours priorities: mq-deadline, bfq).
    #[arg(long, value_parser = parse_byte_rate)]
    pub rate: Option<u64>,
}

#[derive(Args, Debug)]
pub struct ReplaceArgs {
    pub vol: String,
    /// The member to replace: its index (as `volume ls` shows) or its recorded path.
    pub old: String,
    /// The replacement.
    pub new: PathBuf,
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    /// The volume's name (recorded on every member).
    pub vol: String,
    /// A member: a block device or a plain file (repeat, in order; at most 16).
    #[arg(long = "member", required = true)]
    pub members: Vec<PathBuf>,
    /// Create missing members as plain files of this size (and extend smaller files to it).
    #[arg(long, value_parser = parse_size)]
    pub member_size: Option<u64>,
    /// Stripe unit of striped partitions (a power of two, ≥ 4KiB).
    #[arg(long, value_parser = parse_size, default_value_t = STRIPE_UNIT_BYTES_DEFAULT)]
    pub stripe_unit: u64,
    /// Allocation block (a multiple of the stripe unit).
    #[arg(long, value_parser = parse_size, default_value_t = BLOCK_BYTES_DEFAULT)]
    pub block: u64,
    /// Overwrite members that belong to another volume.
    #[arg(long)]
    pub force: bool,
    /// Copies of every block: 2 keeps each block on two members on different devices
    /// (st_dev; a block device is its own), so the volume survives the loss of one member.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub mirror: u8,
    /// Block checksums: `on` keeps a crc32c per 4 KiB of data, checked on every read
    /// (metadata format version 5, which penstocks before it do not open); `off` writes the
    /// format of before (no verification: a damaged block is read as it is).
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub checksums: String,
}

#[derive(Args, Debug)]
pub struct VolArg {
    /// A member's path or a name from PENSTOCK_VOLUMES.
    pub vol: String,
}

#[derive(Args, Debug)]
pub struct AddArgs {
    pub vol: String,
    pub name: String,
    /// Reserve blocks for this many bytes now (the partition still starts empty and grows
    /// past it as written). Default: none, blocks are allocated as the partition is written.
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Place whole blocks on these members in turn (index or path; Clockwise). Default:
    /// striped over every member (ccd).
    #[arg(long, num_args = 1..)]
    pub place: Vec<String>,
}

#[derive(Args, Debug)]
pub struct ImportArgs {
    pub vol: String,
    pub name: String,
    pub file: PathBuf,
    /// As for add-partition.
    #[arg(long, num_args = 1..)]
    pub place: Vec<String>,
}

#[derive(Args, Debug)]
pub struct ExportArgs {
    pub vol: String,
    pub name: String,
    pub file: PathBuf,
}

#[derive(Args, Debug)]
pub struct RmArgs {
    pub vol: String,
    pub name: String,
}

#[derive(Args, Debug)]
pub struct TruncateArgs {
    pub vol: String,
    pub name: String,
    /// The new size (at most the current one), e.g. 0, 100MiB.
    #[arg(value_parser = parse_size)]
    pub size: u64,
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    pub vol: String,
    #[arg(long)]
    pub repair: bool,
    /// Check the metadata only: do not read the data to verify its block checksums
    /// (`volume scrub` does that alone).
    #[arg(long)]
    pub no_data: bool,
    /// With --repair: the largest run of bytes one rebuild stream copies (a multiple of 4KiB,
    /// at most 1GiB). The rebuild is a sequence of bulk-class engine streams; SIGINT stops it
    /// within one poll (100 ms), cancelling the stream under way.
    #[arg(long, value_parser = parse_size, default_value = "16MiB")]
    pub rebuild_chunk: u64,
    /// With --repair: an average rate limit for the rebuild (bytes: 50MB/s, 200MiB/s; bits:
    /// 400Mbps). Default: none, the rebuild takes the bulk class's share of the disk.
    #[arg(long, value_parser = parse_byte_rate)]
    pub rebuild_rate: Option<u64>,
    /// With --repair: time between two rebuild progress lines on stderr (at least 100ms).
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub progress_interval: std::time::Duration,
}

/// A rate in bytes per second (`parse_rate`'s bit and byte rates; not units per second).
fn parse_byte_rate(s: &str) -> Result<u64, String> {
    match penstock_core::units::parse_rate(s).map_err(|e| e.to_string())? {
        penstock_core::units::Rate::BitsPerSecond(bits) if bits >= 8 => Ok(bits / 8),
        _ => Err(format!(
            "{s:?}: a rate of bytes (50MB/s, 200MiB/s) or bits (400Mbps) per second, at least 1 byte/s"
        )),
    }
}

pub fn run(a: VolumeArgs) -> Result<()> {
    a.limits.apply()?;
    match a.cmd {
        VolumeCommand::Create(a) => create(a),
        VolumeCommand::Ls(a) => ls(&a.vol),
        VolumeCommand::AddPartition(a) => add_partition(a),
        VolumeCommand::Import(a) => import(a),
        VolumeCommand::Export(a) => export(a),
        VolumeCommand::Rm(a) => rm(a),
        VolumeCommand::Truncate(a) => truncate(a),
        VolumeCommand::Check(a) => check(a),
        VolumeCommand::Mount(a) => crate::cmd_mount::run(a),
        VolumeCommand::Replace(a) => replace(a),
        VolumeCommand::Scrub(a) => scrub(a),
    }
}

fn open(vol: &str, access: Access) -> Result<Volume> {
    let path = resolve(vol)?;
    Ok(Volume::open(&path, access)?)
}

fn create(a: CreateArgs) -> Result<()> {
    let v = Volume::create(&CreateSpec {
        name: a.vol,
        members: a.members,
        member_size_bytes: a.member_size,
        stripe_unit_bytes: a.stripe_unit,
        block_bytes: a.block,
        force: a.force,
        copies: a.mirror,
        sums: a.checksums == "on",
    })?;
    let m = v.meta();
    let blocks: u64 = m.used.iter().map(|b| u64::from(b.blocks())).sum();
    println!(
        "created volume {} ({}): {} members, {} blocks of {} bytes, stripe unit {} bytes{}{}",
        m.name,
        m.uuid,
        m.layout.member_count(),
        blocks,
        m.layout.block_bytes(),
        m.layout.stripe_unit_bytes(),
        if m.mirrored() {
            ", mirrored (2 copies)"
        } else {
            ""
        },
        if m.sums { ", block checksums" } else { "" }
    );
    Ok(())
}

fn ls(vol: &str) -> Result<()> {
    let v = open(vol, Access::Shared)?;
    let m = v.meta();
    let l = &m.layout;
    let states = v.member_states();
    let degraded = states.iter().filter(|(s, _)| *s != MemberState::Ok).count();
    println!(
        "volume {} ({}) seq {}: stripe unit {} bytes, block {} bytes, data from byte {}{}{}{}",
        m.name,
        m.uuid,
        v.seq(),
        l.stripe_unit_bytes(),
        l.block_bytes(),
        l.data_start_bytes(),
        if v.direct() { "" } else { " (no O_DIRECT)" },
        match (m.mirrored(), degraded) {
            (false, _) => String::new(),
            (true, 0) => ", mirrored (2 copies)".to_string(),
            (true, n) => format!(", mirrored (2 copies), DEGRADED: {n} member(s) not ok"),
        },
        if m.sums { ", block checksums" } else { "" }
    );
    for (i, path) in v.member_paths().iter().enumerate() {
        let map = &m.used[i];
        let (state, why) = states[i];
        println!(
            "member {i} {}: {} bytes, {} blocks, {} free{}",
            path.display(),
            l.member_sizes_bytes()[i],
            map.blocks(),
            map.free_blocks(),
            match (m.mirrored(), state, why) {
                (false, _, _) => String::new(),
                (true, s, None) => format!(", {s}"),
                (true, s, Some(why)) => format!(", {s} ({why})"),
            }
        );
    }
    for p in &m.partitions {
        let members: Vec<String> = p.members.iter().map(|x| x.to_string()).collect();
        println!(
            "partition {} {} bytes (allocated {}, reserved {}, generation {}) {} on members {} ({} extents){}",
            p.name,
            p.size_bytes,
            penstock_core::volume::capacity_bytes(p, l.block_bytes()),
            p.reserve_bytes,
            p.generation,
            match p.kind {
                PartitionKind::Striped => "striped",
                PartitionKind::Placed => "placed",
            },
            match &p.mirror {
                None => members.join(","),
                Some(mi) => {
                    let copies: Vec<String> = mi.members.iter().map(|x| x.to_string()).collect();
                    format!("{} (copies on {})", members.join(","), copies.join(","))
                }
            },
            p.all_extents().count(),
            if p.state == PartitionState::Creating {
                " [creating: interrupted, see volume check]"
            } else {
                ""
            }
        );
    }
    Ok(())
}

/// `--place` members: indices, or paths of members.
fn placement(v: &Volume, place: &[String]) -> Result<Placement> {
    if place.is_empty() {
        return Ok(Placement::Striped);
    }
    let paths = v.member_paths();
    let mut list = Vec::with_capacity(place.len());
    for p in place {
        if let Ok(i) = p.parse::<usize>() {
            list.push(i);
            continue;
        }
        let want = std::fs::canonicalize(p).with_context(|| format!("--place {p}"))?;
        let i = paths
            .iter()
            .position(|m| std::fs::canonicalize(m).is_ok_and(|c| c == want))
            .with_context(|| format!("--place {p}: not a member of this volume"))?;
        list.push(i);
    }
    Ok(Placement::Placed(list))
}

/// Adding a partition shares the volume with running streams (its update takes the volume's
/// update lock, re-reading the table first), so partitions are created while others grow.
fn add_partition(a: AddArgs) -> Result<()> {
    let mut v = open(&a.vol, Access::SharedWrite)?;
    let place = placement(&v, &a.place)?;
    v.begin_growable_partition(&a.name, a.size.unwrap_or(0), &place)?;
    v.finish_partition(&a.name)?;
    println!(
        "created partition {} 0 (reserved {})",
        a.name,
        a.size.unwrap_or(0)
    );
    Ok(())
}

/// Truncating frees blocks, so it waits for no stream: the volume alone (as rm).
fn truncate(a: TruncateArgs) -> Result<()> {
    let mut v = open(&a.vol, Access::Exclusive)?;
    let freed = v.truncate_partition(&a.name, a.size)?;
    println!(
        "truncated partition {} {} ({} blocks freed)",
        a.name, a.size, freed
    );
    Ok(())
}

fn engine() -> Result<Engine> {
    engine_with(penstock_driver::disk::DiskConfig::default())
}

fn engine_with(disk: penstock_driver::disk::DiskConfig) -> Result<Engine> {
    let engine = Engine::new(EngineConfig {
        workers: 1,
        pool_buffers: 16,
        buffer_bytes: 1 << 20,
        stream_depth: 8,
        disk,
        ..EngineConfig::default()
    })?;
    if let Err(why) = &engine.info().uring {
        bail!("volume data moves through io_uring, which is unavailable: {why}");
    }
    Ok(engine)
}

fn endpoint(v: &Volume, name: &str) -> Result<Endpoint> {
    Ok(Endpoint::Volume {
        volume: VolumeName::parse(v.meta().name.as_str())?,
        partition: PartitionName::parse(name)?,
    })
}

fn spec(source: Endpoint, target: Endpoint) -> StreamSpec {
    StreamSpec {
        zero_copy: ZeroCopy::Off,
        ..StreamSpec::new(source, target)
    }
}

fn import(a: ImportArgs) -> Result<()> {
    let file_ep = Endpoint::File {
        path: a.file.clone(),
    };
    let source = open_source(&file_ep, &mut |_| {})?;
    let Some(size) = source.size.filter(|_| source.volume.is_none()) else {
        bail!("{}: import needs a regular file", a.file.display());
    };
    let mut v = open(&a.vol, Access::SharedWrite)?;
    let place = placement(&v, &a.place)?;
    let target_ep = endpoint(&v, &a.name)?;
    let engine = engine()?;
    // 1. The partition exists as `Creating` (durable): after a crash, check --repair frees it.
    v.begin_partition(&a.name, size, &place)?;
    let moved = v
        .partition_io(&a.name, true)
        .map_err(anyhow::Error::from)
        .and_then(|pio| Ok(opened_partition(pio)?))
        .and_then(|target| Ok(engine.open_opened(spec(file_ep, target_ep), source, target)?))
        .and_then(|h| Ok(h.wait()?));
    // 2. The data, then 3. `Ready` (finish_partition syncs the members first).
    match moved {
        Ok(report) => {
            check_bytes(&report, size)?;
            v.finish_partition(&a.name)?;
            println!("created partition {} {}", a.name, size);
            Ok(())
        }
        Err(e) => {
            // Give the blocks back; if even that fails, check --repair will.
            let _ = v.remove_partition(&a.name);
            Err(e.context(format!("import of {} failed", a.file.display())))
        }
    }
}

fn check_bytes(r: &StreamReport, want: u64) -> Result<()> {
    if r.bytes != want {
        bail!("moved {} bytes, expected {want}", r.bytes);
    }
    Ok(())
}

fn export(a: ExportArgs) -> Result<()> {
    let v = open(&a.vol, Access::Shared)?;
    let source_ep = endpoint(&v, &a.name)?;
    let pio = v.partition_io(&a.name, false)?;
    let size = pio.size_bytes;
    let source = opened_partition(pio)?;
    drop(v); // the partition's descriptors keep the shared locks
    let target_ep = Endpoint::File {
        path: a.file.clone(),
    };
    let target = open_target(&target_ep, &mut |_| {})?;
    let engine = engine()?;
    let report = engine
        .open_opened(spec(source_ep, target_ep), source, target)?
        .wait()?;
    check_bytes(&report, size)?;
    let f = std::fs::File::open(&a.file)?;
    f.sync_data()
        .with_context(|| format!("fsync {}", a.file.display()))?;
    println!("exported partition {} {}", a.name, size);
    print_sum_counters();
    Ok(())
}

/// The block checksum failures this process's reads met, when there were any.
fn print_sum_counters() {
    let (failed, repaired, unrepaired) = penstock_driver::sums::counters();
    if failed > 0 {
        println!(
            "block checksum failures: {failed} unit(s) of 4096 bytes; {repaired} repaired from \
             the other copy, {unrepaired} read from it without repair"
        );
    }
}

fn scrub(a: ScrubArgs) -> Result<()> {
    let v = open(&a.vol, Access::SharedWrite)?;
    // The bulk class's place in the kernel's queue (as `volume mount --class bulk`).
    use penstock_driver::sys::{IoprioClass, ioprio_value};
    penstock_driver::sys::ioprio_set_current_thread(ioprio_value(IoprioClass::Idle, 0))
        .context("setting the idle I/O priority")?;
    let started = std::time::Instant::now();
    let mut read_bytes = 0u64;
    let mut pace = |n: u64| {
        read_bytes += n;
        if let Some(rate) = a.rate {
            let due = std::time::Duration::from_secs_f64(read_bytes as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        true
    };
    let Some(report) = v.scrub(!a.no_repair, &mut pace)? else {
        println!(
            "volume {} has no block checksums (format version {}): nothing to scrub; a volume \
             created by this penstock has them (export, create, import to move data over)",
            v.meta().name,
            v.meta().format_version()
        );
        return Ok(());
    };
    for b in &report.bad {
        println!("{b}");
    }
    println!(
        "scrubbed volume {}: {} units ({} bytes) verified over every copy, {} bad, {} repaired",
        v.meta().name,
        report.units,
        report.bytes,
        report.bad.len(),
        report.repaired()
    );
    if report.left() > 0 {
        bail!(
            "{} bad block unit(s) remain{}",
            report.left(),
            if a.no_repair { " (--no-repair)" } else { "" }
        );
    }
    Ok(())
}

fn rm(a: RmArgs) -> Result<()> {
    let mut v = open(&a.vol, Access::Exclusive)?;
    v.remove_partition(&a.name)?;
    println!("removed partition {}", a.name);
    Ok(())
}

fn check(a: CheckArgs) -> Result<()> {
    let access = if a.repair {
        Access::Exclusive
    } else {
        Access::Shared
    };
    let mut v = open(&a.vol, access)?;
    let report = v.check();
    for (m, path, slot, e) in &report.slot_errors {
        println!(
            "member {m} {}: metadata slot {slot} is bad ({e}); the other copy is used (repairable)",
            path.display()
        );
    }
    for (m, path) in &report.stale {
        println!(
            "member {m} {}: one update behind (an interrupted update; repairable)",
            path.display()
        );
    }
    for (m, path, state, why) in &report.degraded {
        let why = why.as_deref().map_or(String::new(), |w| format!(": {w}"));
        let fix = match state {
            MemberState::Rebuilding => "check --repair rebuilds it from the mirror",
            _ if v.member_states()[m.get()]
                .1
                .is_some_and(|w| w.starts_with("missing")) =>
            {
                "replace it: penstock volume replace VOL OLD NEW, then check --repair"
            }
            _ => "check --repair rebuilds it in place, or replace it",
        };
        println!(
            "member {m} {}: {state}{why}; the mirror serves its blocks ({fix})",
            path.display()
        );
    }
    for p in &report.problems {
        println!("{p}");
    }
    // Block checksums: every copy of every byte, read and checked (rewriting a bad unit from
    // its good copy only with --repair).
    let sums = if a.no_data {
        println!("block checksums: data not read (--no-data)");
        Some(penstock_driver::volume::ScrubReport::default())
    } else {
        v.scrub(a.repair, &mut |_| true)?
    };
    let bad_left = match &sums {
        None => {
            println!(
                "no block checksums (format version {}): data not verified",
                v.meta().format_version()
            );
            0
        }
        Some(r) => {
            for b in &r.bad {
                println!("{b}");
            }
            println!(
                "block checksums: {} units verified over every copy, {} bad{}",
                r.units,
                r.bad.len(),
                if a.repair {
                    format!(", {} repaired", r.repaired())
                } else {
                    String::new()
                }
            );
            r.left()
        }
    };
    if report.is_clean() && bad_left == 0 {
        println!("volume {} is consistent", v.meta().name);
        return Ok(());
    }
    if report.is_clean() {
        let repairable = sums
            .as_ref()
            .is_some_and(|r| r.bad.iter().all(|b| b.repairable));
        if repairable && !a.repair {
            bail!(
                "bad blocks found, all with a good copy: run `penstock volume scrub` or `penstock volume check --repair`"
            );
        }
        bail!("bad blocks found without a good copy (see above): those bytes are lost");
    }
    if !a.repair {
        if report.all_repairable() {
            bail!("problems found, all repairable: run `penstock volume check --repair`");
        }
        bail!("problems found that need a human (see above)");
    }
    let fixed = v.repair()?;
    println!("repaired {} problem(s)", fixed.len());
    let opts = RebuildOptions {
        chunk_bytes: a.rebuild_chunk,
        rate_bytes_per_s: a.rebuild_rate,
        progress_interval: a.progress_interval,
        ..RebuildOptions::default()
    };
    let rebuilt = rebuild(&mut v, &opts)?;
    if rebuilt > 0 {
        println!("rebuilt {rebuilt} bytes from the mirror");
    }
    let after = v.check();
    if !after.is_clean() {
        for p in &after.problems {
            println!("remaining: {p}");
        }
        bail!("problems remain that repair cannot prove safe to fix");
    }
    if bad_left > 0 {
        bail!(
            "{bad_left} bad block unit(s) without a good copy remain (see above): those bytes are lost"
        );
    }
    println!("volume {} is consistent", v.meta().name);
    Ok(())
}

/// `check --repair`'s rebuild of replaced (or degraded, present) members: bulk-class engine
/// streams (`penstock_driver::rebuild`), a progress line on stderr every `progress_interval`
/// and at the end, stopped by SIGINT or SIGTERM (the members stay `rebuilding`).
fn rebuild(v: &mut Volume, opts: &RebuildOptions) -> Result<u64> {
    opts.check()?;
    let pending = v.meta().mirrored()
        && v.member_states()
            .iter()
            .any(|(state, _)| *state != MemberState::Ok);
    if !pending {
        return Ok(0);
    }
    // The engine's worker inherits it: the rebuild yields to other processes' I/O too. (No
    // rt reads here, so the worker does not probe IOPRIO_CLASS_RT, which would reset it.)
    if let Err(e) = penstock_driver::rebuild::background_io_priority() {
        eprintln!("rebuild: I/O priority left as it was ({e})");
    }
    let engine = engine_with(penstock_driver::disk::DiskConfig {
        rt_ioprio: false,
        ..Default::default()
    })?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut ids = Vec::new();
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        ids.push(
            signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?,
        );
    }
    let result = penstock_driver::rebuild::rebuild(&engine, v, opts, &stop, &mut |p| {
        let pct = (p.done_bytes * 100)
            .checked_div(p.total_bytes)
            .unwrap_or(100);
        eprintln!(
            "rebuild: {} of {} MiB ({pct}%), {:.1} MiB/s, {:.1} s",
            p.done_bytes >> 20,
            p.total_bytes >> 20,
            p.rate_bytes_per_s() as f64 / f64::from(1u32 << 20),
            p.elapsed.as_secs_f64()
        );
    });
    for id in ids {
        signal_hook::low_level::unregister(id);
    }
    Ok(result?)
}

fn replace(a: ReplaceArgs) -> Result<()> {
    let mut v = open(&a.vol, Access::Exclusive)?;
    let count = v.meta().layout.member_count();
    let old = match a.old.parse::<usize>() {
        Ok(i) => i,
        Err(_) => {
            let want = std::path::Path::new(&a.old);
            let canonical = std::fs::canonicalize(want).ok();
            v.member_paths()
                .iter()
                .position(|m| *m == want || canonical.as_deref() == Some(*m))
                .with_context(|| format!("{}: not a member of this volume", a.old))?
        }
    };
    let member = MemberIndex::new(old)
        .filter(|m| m.get() < count)
        .with_context(|| format!("member {old}: the volume has members 0 to {}", count - 1))?;
    v.replace(member, &a.new)?;
    println!(
        "replaced member {old} by {}: rebuilding; run `penstock volume check --repair {}`",
        a.new.display(),
        a.vol
    );
    Ok(())
}
