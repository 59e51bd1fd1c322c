//! Volumes on real members: opening (find, read, assemble), creating, crash-safe metadata
//! updates, and the per-member descriptors a partition stream reads and writes through.
//!
//! Everything that decides lives in `penstock_core::volume` (layout, the metadata image,
//! allocation, check, assembly). This module moves bytes and names paths in errors:
//! - a slot is read with `pread` and written with `pwrite` + `fdatasync`, through O_DIRECT when
//!   the member allows it (an aligned pool buffer carries the image);
//! - an update writes sequence `seq + 1` — by parity the slot not holding the newest copy — to
//!   every member in index order, each followed by `fdatasync` before the next member is
//!   touched (so at most one member's slot is ever torn; see `docs/volume-format.md`);
//! - members are `flock`ed (shared to read a partition, exclusive to change anything), so two
//!   penstock processes never interleave updates.
//!
//! Partition data itself moves through the engine's io_uring path (`uring_path.rs`), using the
//! descriptors and mapping of a [`PartitionIo`] (`volume/partition.rs`: a partition's I/O,
//! apart from the metadata here).

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use penstock_core::volume::format::{META_SLOT_BYTES, Slot};
use penstock_core::volume::layout::ALIGN_BYTES;
use penstock_core::volume::{
    self, AllocError, Assembly, Chosen, LayoutError, MemberCopy, MemberIndex, MemberState,
    MembershipError, MetaError, Name, NameError, PartitionMap, PartitionState, Placement, Problem,
    VolumeLayout, VolumeMeta, VolumeUuid,
};
use penstock_uring::BufferPool;

use crate::sums::SumIo;
use penstock_core::volume::sums::{SUM_UNIT_BYTES, needed_bytes};

mod partition;
pub(crate) use partition::queue_request_bytes_max_of;
pub use partition::{BadUnit, DEGRADED_MEMBERS, GROW_STEP_MAX_BYTES, PartitionIo, ScrubReport};

/// The environment variable naming volumes: `NAME=MEMBER_PATH[,NAME=MEMBER_PATH]…`. It stands
/// in for a configuration file until there is one, so that `vol:NAME/PARTITION` (whose NAME
/// cannot hold a `/`) can reach a volume anywhere.
pub const VOLUMES_ENV: &str = "PENSTOCK_VOLUMES";

/// Why a volume operation failed. Every variant that is not `Io` happens before anything was
/// written: the volume is unchanged.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VolumeError {
    // Causes are named `error`, not `source`: each message already includes its cause, and
    // a `source` would make anyhow print it twice.
    #[error("{path}: {what}: {error}")]
    Io {
        path: PathBuf,
        what: &'static str,
        error: io::Error,
    },
    #[error("{path}: not a usable member of a penstock volume: {error}")]
    Metadata { path: PathBuf, error: MetaError },
    #[error("member {member} of {count} is missing (recorded at {last_seen:?}): {why}")]
    MemberMissing {
        member: usize,
        count: usize,
        last_seen: String,
        why: String,
    },
    #[error("{0}")]
    Membership(String),
    #[error("{path}: listed twice (also given as {first})")]
    ListedTwice { path: PathBuf, first: PathBuf },
    #[error(
        "{path}: belongs to volume {name} ({uuid}); remove it from that volume first, or pass --force to overwrite it"
    )]
    Foreign {
        path: PathBuf,
        name: String,
        uuid: VolumeUuid,
    },
    #[error(
        "{path}: {size_bytes} bytes is too small: a member needs at least {min_bytes} (metadata and one block)"
    )]
    TooSmall {
        path: PathBuf,
        size_bytes: u64,
        min_bytes: u64,
    },
    #[error("{path}: does not exist; give --member-size to create it as a plain file")]
    NoSuchMember { path: PathBuf },
    #[error("{path}: is not a regular file or a block device")]
    NotStorage { path: PathBuf },
    #[error("{path}: in use by another penstock (the member is locked)")]
    Busy { path: PathBuf },
    #[error(
        "unknown volume {0:?}: give a member's path, or define it in {VOLUMES_ENV}=NAME=/path/of/a/member"
    )]
    UnknownVolume(String),
    #[error("volume {volume}: no partition named {name}")]
    NoSuchPartition { volume: String, name: String },
    #[error(
        "partition {name} was never completed (an interrupted create or import); `penstock volume check --repair` removes it"
    )]
    NotReady { name: String },
    #[error(transparent)]
    Name(#[from] NameError),
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error(transparent)]
    Alloc(#[from] AllocError),
    #[error("{0}")]
    Invalid(String),
    /// A rebuild stopped (cancelled, or its copy failed) after writing part of the members
    /// being rebuilt: they stay `rebuilding` (written to, never read), so the volume is as
    /// consistent as before it started, and `volume check --repair` starts the copy again.
    #[error(
        "rebuild stopped after {done_bytes} of {total_bytes} bytes: {why}; the member(s) stay \
         rebuilding (the mirror serves their blocks): run `penstock volume check --repair` again"
    )]
    RebuildStopped {
        done_bytes: u64,
        total_bytes: u64,
        why: String,
    },
}

type Result<T, E = VolumeError> = std::result::Result<T, E>;

fn io_err<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(io::Error) -> VolumeError + 'a {
    move |error| VolumeError::Io {
        path: path.to_path_buf(),
        what,
        error,
    }
}

/// Turns a `VOL` argument into a member path: a name from [`VOLUMES_ENV`], else a path.
pub fn resolve(vol: &str) -> Result<PathBuf> {
    if let Ok(list) = std::env::var(VOLUMES_ENV) {
        for entry in list.split(',') {
            if let Some((name, path)) = entry.split_once('=')
                && name.trim() == vol
            {
                return Ok(PathBuf::from(path.trim()));
            }
        }
    }
    let p = PathBuf::from(vol);
    if vol.contains('/') || p.exists() {
        Ok(p)
    } else {
        Err(VolumeError::UnknownVolume(vol.to_string()))
    }
}

/// How a volume is held. Streams share it (to read partitions, or to write a partition's
/// bytes: neither changes the metadata); changing the metadata (create, add, remove, import,
/// repair) needs it alone, so it waits for no stream and no stream sees it half-done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read partitions.
    Shared,
    /// Read and write partitions' bytes (members opened read-write), shared with other streams.
    SharedWrite,
    /// Change the metadata.
    Exclusive,
}

/// One open member.
#[derive(Debug)]
struct Member {
    path: PathBuf,
    file: File,
    /// Opened with O_DIRECT.
    direct: bool,
    /// `false`: a member of a mirrored volume that could not be opened. `file` is then
    /// `/dev/null`, so that member indices stay dense; the member is degraded, and nothing
    /// reads or writes it (see [`MemberState`]).
    present: bool,
}

/// The stand-in for a member of a mirrored volume that could not be opened.
fn absent_member(path: &Path) -> Result<Member> {
    let file = File::open("/dev/null").map_err(io_err(Path::new("/dev/null"), "open"))?;
    Ok(Member {
        path: path.to_path_buf(),
        file,
        direct: false,
        present: false,
    })
}

/// A member's failure domain: the device it is on (a block device: itself).
fn domain_of(md: &std::fs::Metadata) -> u64 {
    if md.file_type().is_block_device() {
        md.rdev()
    } else {
        md.dev()
    }
}

/// What `check` found.
#[derive(Debug, Default)]
pub struct CheckReport {
    /// Partition table and block map problems (from `penstock_core::volume::check`).
    pub problems: Vec<Problem>,
    /// Members whose older metadata slot does not decode (a torn or damaged copy).
    pub slot_errors: Vec<(MemberIndex, PathBuf, Slot, MetaError)>,
    /// Members one update behind (an update was interrupted between members).
    pub stale: Vec<(MemberIndex, PathBuf)>,
    /// Members of a mirrored volume that are not `Ok`: their state, and why they failed when
    /// that was found at this open (missing, bad metadata, shorter than recorded).
    pub degraded: Vec<(MemberIndex, PathBuf, MemberState, Option<String>)>,
}

impl CheckReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
            && self.slot_errors.is_empty()
            && self.stale.is_empty()
            && self.degraded.is_empty()
    }

    /// Whether `repair` fixes everything found (slot and stale problems always are: the next
    /// update rewrites them).
    pub fn all_repairable(&self) -> bool {
        self.problems.iter().all(Problem::repairable)
    }
}

/// An open, whole volume: every member found, read, assembled and locked.
#[derive(Debug)]
pub struct Volume {
    members: Vec<Member>,
    meta: VolumeMeta,
    seq: u64,
    stale: Vec<MemberIndex>,
    slot_errors: Vec<(MemberIndex, Slot, MetaError)>,
    /// Members of a mirrored volume found failed at open, and why (marked `Degraded` in
    /// `meta`; persisted by the next update).
    failures: Vec<(MemberIndex, String)>,
}

/// How to create a volume.
#[derive(Debug, Clone)]
pub struct CreateSpec {
    pub name: String,
    pub members: Vec<PathBuf>,
    /// Create missing members as plain files of this size, and extend smaller plain files to it.
    pub member_size_bytes: Option<u64>,
    pub stripe_unit_bytes: u64,
    pub block_bytes: u64,
    /// Overwrite members that belong to another volume.
    pub force: bool,
    /// Copies of every block: 1, or 2 for a mirrored volume (each copy on a member in
    /// another failure domain: another device).
    pub copies: u8,
    /// Keep a crc32c per 4 KiB of data (format version 5: older penstocks do not read it).
    pub sums: bool,
}

/// A device or file identity: two paths to one member are one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Identity {
    Inode(u64, u64),
    Device(u64),
}

fn identity(meta: &std::fs::Metadata) -> Identity {
    if meta.file_type().is_block_device() {
        Identity::Device(meta.rdev())
    } else {
        Identity::Inode(meta.dev(), meta.ino())
    }
}

/// Size of a regular file or block device.
fn storage_size(path: &Path, file: &File) -> Result<u64> {
    let meta = file.metadata().map_err(io_err(path, "stat"))?;
    let ft = meta.file_type();
    if ft.is_file() {
        Ok(meta.len())
    } else if ft.is_block_device() {
        let end = rustix::fs::seek(file, rustix::fs::SeekFrom::End(0))
            .map_err(|e| io_err(path, "size")(e.into()))?;
        Ok(end)
    } else {
        Err(VolumeError::NotStorage {
            path: path.to_path_buf(),
        })
    }
}

/// Opens a member for reading and writing, with O_DIRECT when the file system allows it.
fn open_member(path: &Path, writable: bool) -> Result<Member> {
    let try_open = |direct: bool| {
        let mut o = OpenOptions::new();
        o.read(true).write(writable);
        if direct {
            o.custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32);
        }
        o.open(path)
    };
    let (file, direct) = match try_open(true) {
        Ok(f) => (f, true),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            (try_open(false).map_err(io_err(path, "open"))?, false)
        }
        Err(e) => return Err(io_err(path, "open")(e)),
    };
    let ft = file.metadata().map_err(io_err(path, "stat"))?.file_type();
    if !(ft.is_file() || ft.is_block_device()) {
        return Err(VolumeError::NotStorage {
            path: path.to_path_buf(),
        });
    }
    Ok(Member {
        path: path.to_path_buf(),
        file,
        direct,
        present: true,
    })
}

fn lock(m: &Member, access: Access) -> Result<()> {
    use rustix::fs::FlockOperation as F;
    let op = match access {
        Access::Shared | Access::SharedWrite => F::NonBlockingLockShared,
        Access::Exclusive => F::NonBlockingLockExclusive,
    };
    // A penstock killed with I/O in flight lets go of its locks only when the kernel has torn
    // its io_uring down, which happens after the process is gone: a lock held that way is
    // released within moments, so a busy volume is asked again for a short while.
    let started = std::time::Instant::now();
    loop {
        match rustix::fs::flock(&m.file, op) {
            Ok(()) => return Ok(()),
            Err(rustix::io::Errno::WOULDBLOCK) if started.elapsed() < LOCK_WAIT => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(rustix::io::Errno::WOULDBLOCK) => {
                return Err(VolumeError::Busy {
                    path: m.path.clone(),
                });
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(io_err(&m.path, "lock")(e.into())),
        }
    }
}

/// How long a volume held by another process is asked again before "in use" is reported.
pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a metadata update waits for another one (of this or another process) to finish,
/// by default. An update is a few milliseconds (1 MiB and an fdatasync per member), so this is
/// hundreds of updates queued ahead. [`set_limits`] changes it for the process.
pub const UPDATE_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The process's update-lock wait in ms ([`set_limits`]; [`UPDATE_LOCK_WAIT`] by default).
static UPDATE_LOCK_WAIT_MS: AtomicU64 = AtomicU64::new(UPDATE_LOCK_WAIT.as_millis() as u64);
/// The process's largest growth step in bytes ([`set_limits`]; [`GROW_STEP_MAX_BYTES`] by
/// default).
static GROW_STEP_BYTES: AtomicU64 = AtomicU64::new(GROW_STEP_MAX_BYTES);

/// Limits of volume updates, for every volume this process opens (`penstock volume
/// --lock-wait/--grow-step`, `penstock record --lock-wait/--grow-step`, `[volumes]
/// lock_wait_ms/grow_step_bytes` of `penstock serve`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeLimits {
    /// How long a metadata update waits for another one to finish before failing.
    pub update_lock_wait: std::time::Duration,
    /// The largest step a growing partition allocates ahead of its writes (rounded up to a
    /// block per member of the partition).
    pub grow_step_bytes: u64,
}

impl Default for VolumeLimits {
    fn default() -> VolumeLimits {
        VolumeLimits {
            update_lock_wait: UPDATE_LOCK_WAIT,
            grow_step_bytes: GROW_STEP_MAX_BYTES,
        }
    }
}

/// Sets the limits of every volume update from now on in this process. A zero growth step is
/// refused (a writer would allocate one group at a time: say so with the smallest step, one
/// block).
pub fn set_limits(l: VolumeLimits) -> Result<()> {
    if l.grow_step_bytes == 0 {
        return Err(VolumeError::Invalid(
            "the growth step must be at least one byte (it is rounded up to a block per member)"
                .into(),
        ));
    }
    UPDATE_LOCK_WAIT_MS.store(
        u64::try_from(l.update_lock_wait.as_millis()).unwrap_or(u64::MAX),
        Ordering::Release,
    );
    GROW_STEP_BYTES.store(l.grow_step_bytes, Ordering::Release);
    Ok(())
}

/// The limits [`set_limits`] set (the defaults before).
pub fn limits() -> VolumeLimits {
    VolumeLimits {
        update_lock_wait: std::time::Duration::from_millis(
            UPDATE_LOCK_WAIT_MS.load(Ordering::Acquire),
        ),
        grow_step_bytes: GROW_STEP_BYTES.load(Ordering::Acquire),
    }
}

/// Held while an update runs; unlocks when dropped. It holds its own descriptor of member 0
/// (a duplicate: the same open file description, which owns the lock).
struct UpdateLock {
    fd: OwnedFd,
}

impl Drop for UpdateLock {
    fn drop(&mut self) {
        let _ = penstock_uring::sys::ofd_lock_byte0(self.fd.as_fd(), None);
    }
}

/// An aligned buffer for one metadata area (both slots), usable with O_DIRECT.
fn meta_buffer() -> Result<(BufferPool, penstock_uring::BufId)> {
    let mut pool = BufferPool::new(1, 2 * META_SLOT_BYTES as usize)
        .map_err(|e| VolumeError::Invalid(format!("metadata buffer: {e}")))?;
    let id = pool
        .alloc()
        .expect("a fresh pool of one buffer has it free");
    Ok((pool, id))
}

/// Reads as much of `buf.len()` bytes at `offset` as the member has (zeros past its end).
fn pread_full(m: &Member, buf: &mut [u8], offset: u64) -> Result<()> {
    buf.fill(0);
    let mut done = 0usize;
    while done < buf.len() {
        match rustix::io::pread(&m.file, &mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => {}
            // O_DIRECT reads past the end of a short member may fail: what was read counts.
            Err(rustix::io::Errno::INVAL) if done > 0 => break,
            Err(e) => return Err(io_err(&m.path, "read metadata")(e.into())),
        }
    }
    Ok(())
}

fn pwrite_full(m: &Member, buf: &[u8], offset: u64) -> Result<()> {
    let mut done = 0usize;
    while done < buf.len() {
        match rustix::io::pwrite(&m.file, &buf[done..], offset + done as u64) {
            Ok(0) => {
                return Err(io_err(&m.path, "write metadata")(io::Error::from(
                    io::ErrorKind::WriteZero,
                )));
            }
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(io_err(&m.path, "write metadata")(e.into())),
        }
    }
    Ok(())
}

fn fdatasync(m: &Member) -> Result<()> {
    rustix::fs::fdatasync(&m.file).map_err(|e| io_err(&m.path, "fdatasync")(e.into()))
}

/// Reads and decodes both slots of a member; picks the newest valid copy.
fn read_slots(m: &Member) -> std::result::Result<Chosen, MetaError> {
    let slot = META_SLOT_BYTES as usize;
    let (mut pool, id) = match meta_buffer() {
        Ok(b) => b,
        Err(e) => {
            return Err(MetaError::Corrupt {
                what: e.to_string(),
            });
        }
    };
    let buf = pool.bytes_mut(id);
    if let Err(e) = pread_full(m, buf, 0) {
        return Err(MetaError::Corrupt {
            what: e.to_string(),
        });
    }
    volume::choose(
        volume::decode(&buf[..slot]),
        volume::decode(&buf[slot..2 * slot]),
    )
}

/// Writes `meta` as sequence `seq` to every member, in index order, each synced before the next.
fn write_all(members: &[Member], meta: &VolumeMeta, seq: u64) -> Result<()> {
    let (mut pool, id) = meta_buffer()?;
    let slot = Slot::for_seq(seq);
    for (i, m) in members.iter().enumerate() {
        let member = MemberIndex::new(i).expect("member count ≤ MEMBERS_MAX");
        // A degraded member is left as it is: its copy of the metadata stays older, and
        // assembly goes by the newest sequence.
        if !m.present || !meta.member_states[i].writable() {
            continue;
        }
        let image = volume::encode(meta, member, seq);
        let buf = &mut pool.bytes_mut(id)[..image.len()];
        buf.copy_from_slice(&image);
        pwrite_full(m, buf, slot.offset_bytes())?;
        fdatasync(m)?;
    }
    Ok(())
}

fn describe_membership(e: &MembershipError, paths: &[PathBuf]) -> String {
    let p = |i: usize| {
        paths
            .get(i)
            .map_or("?".to_string(), |p| p.display().to_string())
    };
    match e {
        MembershipError::ForeignMember {
            position,
            found,
            expected,
        } => format!(
            "{}: belongs to another volume ({found}), not this one ({expected})",
            p(*position)
        ),
        MembershipError::DuplicateMember {
            member,
            first,
            second,
        } => format!(
            "member {member} found twice: at {} and at {}",
            p(*first),
            p(*second)
        ),
        MembershipError::MemberTooSmall {
            member,
            position,
            size_bytes,
            need_bytes,
        } => format!(
            "{} (member {member}) has {size_bytes} bytes, the volume needs {need_bytes}: it shrank",
            p(*position)
        ),
        MembershipError::MemberCountMismatch {
            position,
            found,
            expected,
        } => format!(
            "{} says the volume has {found} members, {} says {expected}",
            p(*position),
            p(0)
        ),
        other => other.to_string(),
    }
}

impl Volume {
    /// Opens the volume one member of which is at `path`: reads that member, finds the others
    /// through the recorded member paths, reads them, checks they form one whole volume, and
    /// locks them all.
    pub fn open(path: &Path, access: Access) -> Result<Volume> {
        let writable = access != Access::Shared;
        let first = open_member(path, writable)?;
        lock(&first, access)?;
        let chosen = read_slots(&first).map_err(|error| VolumeError::Metadata {
            path: path.to_path_buf(),
            error,
        })?;
        let count = chosen.decoded.meta.layout.member_count();
        let hints = chosen.decoded.meta.member_paths.clone();
        let own = chosen.decoded.member.get();
        // A mirrored volume opens without a member that is missing or whose metadata is bad
        // (assembly then checks that every block still has a copy).
        let mirrored = chosen.decoded.meta.mirrored();
        let mut opened: Vec<(Member, Chosen)> = vec![(first, chosen)];
        let mut failed: Vec<(usize, Member, String)> = Vec::new();
        for (i, hint) in hints.iter().enumerate() {
            if i == own {
                continue;
            }
            let missing = |why: String| VolumeError::MemberMissing {
                member: i,
                count,
                last_seen: hint.clone(),
                why,
            };
            if hint.is_empty() {
                return Err(missing("no path recorded".to_string()));
            }
            let m = match open_member(Path::new(hint), writable) {
                Ok(m) => m,
                Err(e) if mirrored => {
                    failed.push((i, absent_member(Path::new(hint))?, format!("missing: {e}")));
                    continue;
                }
                Err(e) => return Err(missing(e.to_string())),
            };
            lock(&m, access)?;
            match read_slots(&m) {
                Ok(c) => opened.push((m, c)),
                Err(error) if mirrored => {
                    failed.push((i, m, format!("bad metadata: {error}")));
                }
                Err(error) => {
                    return Err(VolumeError::Metadata {
                        path: PathBuf::from(hint),
                        error,
                    });
                }
            }
        }
        let mut v = Self::assemble(opened, failed)?;
        // Record what was found, when this handle may write (a read-only one reports it;
        // the next update by anyone records it).
        if writable && !v.failures.is_empty() {
            let _lock = v.lock_updates()?;
            // Another process may have committed since: re-read (the failed members stay
            // marked), then commit.
            v.reload()?;
            let meta = v.meta.clone();
            v.commit(meta)?;
        }
        Ok(v)
    }

    /// Puts the members in index order: `opened` read their metadata; `failed` (members of a
    /// mirrored volume, by index) did not, and why.
    fn assemble(
        opened: Vec<(Member, Chosen)>,
        failed: Vec<(usize, Member, String)>,
    ) -> Result<Volume> {
        let paths: Vec<PathBuf> = opened.iter().map(|(m, _)| m.path.clone()).collect();
        let mut copies = Vec::with_capacity(opened.len());
        for (m, c) in &opened {
            copies.push(MemberCopy {
                size_bytes: storage_size(&m.path, &m.file)?,
                chosen: c.clone(),
            });
        }
        let Assembly {
            mut meta,
            seq,
            positions,
            failed: lost,
            stale,
        } = volume::assemble(&copies)
            .map_err(|e| VolumeError::Membership(describe_membership(&e, &paths)))?;
        if !meta.mirrored()
            && let Some((i, m, why)) = failed.first()
        {
            return Err(VolumeError::MemberMissing {
                member: *i,
                count: meta.layout.member_count(),
                last_seen: m.path.display().to_string(),
                why: why.clone(),
            });
        }
        let mut slots: Vec<Option<(Member, Chosen)>> = opened.into_iter().map(Some).collect();
        let mut failed: Vec<Option<(usize, Member, String)>> =
            failed.into_iter().map(Some).collect();
        let mut members = Vec::with_capacity(positions.len());
        let mut slot_errors = Vec::new();
        let mut failures = Vec::new();
        for (i, &pos) in positions.iter().enumerate() {
            let index = MemberIndex::new(i).expect("i < count");
            if let Some(pos) = pos {
                let (m, c) = slots[pos]
                    .take()
                    .expect("assemble gives each position once");
                if let Some(e) = c.other_error {
                    let other = if c.slot == Slot::A { Slot::B } else { Slot::A };
                    slot_errors.push((index, other, e));
                }
                members.push(m);
                continue;
            }
            // Lost: not opened, bad metadata, or shorter than recorded.
            let (m, why) = if let Some(f) = failed
                .iter_mut()
                .find(|f| f.as_ref().is_some_and(|f| f.0 == i))
            {
                let (_, m, why) = f.take().expect("found");
                (m, why)
            } else if let Some(sl) = slots
                .iter_mut()
                .find(|s| s.as_ref().is_some_and(|(_, c)| c.decoded.member == index))
            {
                let (m, _) = sl.take().expect("found");
                (m, "shorter than recorded".to_string())
            } else {
                let hint = meta.member_paths.get(i).cloned().unwrap_or_default();
                (absent_member(Path::new(&hint))?, "missing".to_string())
            };
            debug_assert!(lost.contains(&index));
            if meta.member_states[i] != MemberState::Degraded {
                meta.member_states[i] = MemberState::Degraded;
                failures.push((index, why));
            }
            members.push(m);
        }
        Ok(Volume {
            members,
            meta,
            seq,
            stale,
            slot_errors,
            failures,
        })
    }

    /// Creates a volume: checks every member first (so that a refusal changes nothing), then
    /// creates or extends plain-file members, and writes the metadata twice (sequence 1 to slot
    /// A of every member, then sequence 2 to slot B), so both slots are valid from the start.
    pub fn create(spec: &CreateSpec) -> Result<Volume> {
        let name = Name::new(&spec.name)?;
        if spec.members.is_empty() {
            return Err(VolumeError::Invalid(
                "a volume needs at least one --member".to_string(),
            ));
        }
        if spec.members.len() > volume::MEMBERS_MAX {
            return Err(VolumeError::Layout(LayoutError::TooManyMembers {
                count: spec.members.len(),
            }));
        }
        // 1. Resolve every path, find duplicates, measure sizes. Nothing is written yet.
        struct Planned {
            path: PathBuf,
            exists: bool,
            size_bytes: u64,
            extend_to: Option<u64>,
            identity: Option<Identity>,
            /// The failure domain (device) it is on.
            domain: u64,
        }
        let mut planned: Vec<Planned> = Vec::new();
        for given in &spec.members {
            let mut parent_domain = 0;
            let (path, exists) = match std::fs::canonicalize(given) {
                Ok(p) => (p, true),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    if spec.member_size_bytes.is_none() {
                        return Err(VolumeError::NoSuchMember {
                            path: given.clone(),
                        });
                    }
                    let parent = given
                        .parent()
                        .filter(|p| !p.as_os_str().is_empty())
                        .unwrap_or(Path::new("."));
                    let parent =
                        std::fs::canonicalize(parent).map_err(io_err(given, "parent directory"))?;
                    parent_domain = std::fs::metadata(&parent)
                        .map(|md| domain_of(&md))
                        .map_err(io_err(&parent, "stat"))?;
                    let file = given.file_name().ok_or_else(|| {
                        VolumeError::Invalid(format!("{}: not a file path", given.display()))
                    })?;
                    (parent.join(file), false)
                }
                Err(e) => return Err(io_err(given, "resolve")(e)),
            };
            let (size_bytes, extend_to, ident, domain) = if exists {
                let f = File::open(&path).map_err(io_err(&path, "open"))?;
                let md = f.metadata().map_err(io_err(&path, "stat"))?;
                let size = storage_size(&path, &f)?;
                match spec.member_size_bytes {
                    Some(want) if md.file_type().is_file() && want > size => {
                        (want, Some(want), Some(identity(&md)), domain_of(&md))
                    }
                    _ => (size, None, Some(identity(&md)), domain_of(&md)),
                }
            } else {
                let size = spec.member_size_bytes.expect("checked above");
                (size, Some(size), None, parent_domain)
            };
            if let Some(first) = planned
                .iter()
                .find(|p| p.path == path || (ident.is_some() && p.identity == ident))
            {
                return Err(VolumeError::ListedTwice {
                    path: given.clone(),
                    first: first.path.clone(),
                });
            }
            planned.push(Planned {
                path,
                exists,
                size_bytes,
                extend_to,
                identity: ident,
                domain,
            });
        }
        let sizes: Vec<u64> = planned.iter().map(|p| p.size_bytes).collect();
        let layout = if spec.sums {
            volume::sums::layout_with_sums(sizes, spec.stripe_unit_bytes, spec.block_bytes)
        } else {
            VolumeLayout::new(sizes, spec.stripe_unit_bytes, spec.block_bytes)
        };
        let layout = match layout {
            Ok(l) => l,
            Err(LayoutError::MemberTooSmall {
                member,
                size_bytes,
                min_bytes,
            }) => {
                return Err(VolumeError::TooSmall {
                    path: planned[member].path.clone(),
                    size_bytes,
                    min_bytes,
                });
            }
            Err(e) => return Err(e.into()),
        };
        let mut member_paths = Vec::with_capacity(planned.len());
        for p in &planned {
            let s = p
                .path
                .to_str()
                .filter(|s| s.len() <= volume::MEMBER_PATH_BYTES_MAX && !s.contains('\0'));
            let s = s.ok_or_else(|| {
                VolumeError::Invalid(format!(
                    "{}: a member path must be UTF-8 and at most {} bytes",
                    p.path.display(),
                    volume::MEMBER_PATH_BYTES_MAX
                ))
            })?;
            member_paths.push(s.to_string());
        }
        let mut meta = VolumeMeta::new(random_uuid()?, name, layout);
        meta.member_paths = member_paths;
        meta.sums = spec.sums;
        if !(1..=volume::COPIES_MAX).contains(&spec.copies) {
            return Err(VolumeError::Invalid(format!(
                "--mirror {}: a volume keeps 1 or {} copies of each block",
                spec.copies,
                volume::COPIES_MAX
            )));
        }
        if spec.copies > 1 {
            meta.copies = spec.copies;
            meta.member_domains = planned.iter().map(|p| p.domain).collect();
            // A striped partition spreads over every member: its copies need a member in
            // another domain for each, so this is the test that the mirror is possible.
            let all: Vec<MemberIndex> = meta.layout.members().collect();
            if let Err(why) = volume::alloc::mirror_members(&meta, &all) {
                let on: Vec<String> = planned
                    .iter()
                    .map(|p| format!("{} (device {:#x})", p.path.display(), p.domain))
                    .collect();
                return Err(VolumeError::Invalid(format!(
                    "--mirror {}: each block's copy must be on a member on another device, and \
                     these members cannot pair up that way ({why}): {}",
                    spec.copies,
                    on.join(", ")
                )));
            }
        }
        // 2. Members that already hold penstock metadata belong to someone.
        if !spec.force {
            for p in planned.iter().filter(|p| p.exists) {
                let m = open_member(&p.path, false)?;
                if let Ok(c) = read_slots(&m) {
                    return Err(VolumeError::Foreign {
                        path: p.path.clone(),
                        name: c.decoded.meta.name.to_string(),
                        uuid: c.decoded.meta.uuid,
                    });
                }
            }
        }
        // 3. From here on the members change.
        let mut members = Vec::with_capacity(planned.len());
        for p in &planned {
            if let Some(size) = p.extend_to {
                let f = OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .mode(0o644)
                    .open(&p.path)
                    .map_err(io_err(&p.path, "create"))?;
                if f.metadata().map_err(io_err(&p.path, "stat"))?.len() < size {
                    f.set_len(size).map_err(io_err(&p.path, "extend"))?;
                }
                if !p.exists {
                    // The new member's name survives a power cut (its size is made durable
                    // by the fdatasync after the metadata write).
                    crate::sys::sync_parent_dir(&p.path)
                        .map_err(io_err(&p.path, "fsync of its directory"))?;
                }
            }
            let m = open_member(&p.path, true)?;
            lock(&m, Access::Exclusive)?;
            members.push(m);
        }
        write_all(&members, &meta, 1)?;
        write_all(&members, &meta, 2)?;
        Ok(Volume {
            members,
            meta,
            seq: 2,
            stale: Vec::new(),
            slot_errors: Vec::new(),
            failures: Vec::new(),
        })
    }

    /// The current metadata.
    pub fn meta(&self) -> &VolumeMeta {
        &self.meta
    }

    /// The current sequence number.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Member paths, by index (as opened now).
    pub fn member_paths(&self) -> Vec<&Path> {
        self.members.iter().map(|m| m.path.as_path()).collect()
    }

    /// Whether every member is open with O_DIRECT.
    pub fn direct(&self) -> bool {
        self.members.iter().filter(|m| m.present).all(|m| m.direct)
    }

    /// Each member's state (all `Ok` in an unmirrored volume), with why it failed when that
    /// was found by this open.
    pub fn member_states(&self) -> Vec<(MemberState, Option<&str>)> {
        self.meta
            .member_states
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let why = self
                    .failures
                    .iter()
                    .find(|(m, _)| m.get() == i)
                    .map(|(_, w)| w.as_str());
                (*s, why)
            })
            .collect()
    }

    /// Persists `meta` as the next sequence on every member (see the module documentation).
    /// On success every member holds it; after a crash inside, the volume reads as before or
    /// as after (never in between): each member's other slot is untouched.
    pub fn commit(&mut self, meta: VolumeMeta) -> Result<()> {
        let seq = self.seq + 1;
        write_all(&self.members, &meta, seq)?;
        self.meta = meta;
        self.seq = seq;
        self.stale.clear();
        // The slot just written on every member was the one not chosen: any damage in it is gone.
        self.slot_errors
            .retain(|(_, slot, _)| *slot != Slot::for_seq(seq));
        Ok(())
    }

    /// One change of the metadata, safe against other processes and streams changing it too
    /// (growing partitions, adding ones): takes the volume's update lock, reads the newest
    /// metadata from the members, applies `change` and commits the result. On an error from
    /// `change` nothing is written.
    pub fn update<T>(
        &mut self,
        change: impl FnOnce(&mut VolumeMeta) -> std::result::Result<T, AllocError>,
    ) -> Result<T> {
        let _lock = self.lock_updates()?;
        self.reload()?;
        let mut meta = self.meta.clone();
        let volume = self.meta.name.to_string();
        let out = change(&mut meta).map_err(|e| match e {
            AllocError::NotFound { name } => VolumeError::NoSuchPartition { volume, name },
            e => e.into(),
        })?;
        self.commit(meta)?;
        Ok(out)
    }

    /// The update lock: an open-file-description lock on member 0's first metadata byte,
    /// taken by every metadata change (as well as the `flock` that keeps streams and table
    /// changes apart). Waits up to [`limits`]' `update_lock_wait` for another update to finish.
    fn lock_updates(&self) -> Result<UpdateLock> {
        // Member 0, or in a mirrored volume the first member still written to.
        let m = self
            .members
            .iter()
            .enumerate()
            .find(|(i, m)| m.present && self.meta.member_states[*i].writable())
            .map_or(&self.members[0], |(_, m)| m);
        let wait = limits().update_lock_wait;
        let started = std::time::Instant::now();
        loop {
            match penstock_uring::sys::ofd_lock_byte0(m.file.as_fd(), Some(true)) {
                Ok(()) => {
                    let fd = m.file.try_clone().map_err(io_err(&m.path, "dup"));
                    let fd = match fd {
                        Ok(f) => OwnedFd::from(f),
                        Err(e) => {
                            let _ = penstock_uring::sys::ofd_lock_byte0(m.file.as_fd(), None);
                            return Err(e);
                        }
                    };
                    return Ok(UpdateLock { fd });
                }
                Err(e)
                    if (e.raw_os_error() == Some(libc::EAGAIN)
                        || e.raw_os_error() == Some(libc::EACCES))
                        && started.elapsed() < wait =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                    return Err(VolumeError::Busy {
                        path: m.path.clone(),
                    });
                }
                Err(e) => return Err(io_err(&m.path, "lock for an update")(e)),
            }
        }
    }

    /// Reads every member's metadata again and assembles it (another process may have
    /// committed since this one read it).
    fn reload(&mut self) -> Result<()> {
        if self.newest_seq_on_disk()? == Some(self.seq) {
            return Ok(());
        }
        let mut opened = Vec::with_capacity(self.members.len());
        let mut failed = Vec::new();
        for (i, m) in self.members.iter().enumerate() {
            let file = m.file.try_clone().map_err(io_err(&m.path, "dup"))?;
            let copy = Member {
                path: m.path.clone(),
                file,
                direct: m.direct,
                present: m.present,
            };
            if !m.present || self.meta.member_states[i] == MemberState::Degraded {
                failed.push((i, copy, "degraded".to_string()));
                continue;
            }
            match read_slots(m) {
                Ok(c) => opened.push((copy, c)),
                Err(error) if self.meta.mirrored() => {
                    failed.push((i, copy, format!("bad metadata: {error}")));
                }
                Err(error) => {
                    return Err(VolumeError::Metadata {
                        path: m.path.clone(),
                        error,
                    });
                }
            }
        }
        let fresh = Self::assemble(opened, failed)?;
        if fresh.meta.uuid != self.meta.uuid {
            return Err(VolumeError::Membership(
                "the members now hold another volume".to_string(),
            ));
        }
        // Same members in the same order (assemble orders them by index, as they were).
        self.meta = fresh.meta;
        self.seq = fresh.seq;
        self.stale = fresh.stale;
        self.slot_errors = fresh.slot_errors;
        self.failures.extend(fresh.failures);
        Ok(())
    }

    /// The highest sequence in any whole slot header of any member (4 KiB read per slot):
    /// when it is the one this handle read, nobody committed since and a full re-read is
    /// not needed.
    fn newest_seq_on_disk(&self) -> Result<Option<u64>> {
        let mut pool = BufferPool::new(1, ALIGN_BYTES as usize)
            .map_err(|e| VolumeError::Invalid(format!("metadata buffer: {e}")))?;
        let id = pool
            .alloc()
            .expect("a fresh pool of one buffer has it free");
        let mut newest = None;
        for m in self.members.iter().filter(|m| m.present) {
            for slot in [Slot::A, Slot::B] {
                let buf = pool.bytes_mut(id);
                pread_full(m, buf, slot.offset_bytes())?;
                let seq = volume::format::header_seq(buf);
                newest = newest.max(seq);
            }
        }
        Ok(newest)
    }

    /// A second handle on this volume for metadata updates (a growing partition's writer):
    /// every member reopened (new open file descriptions, so its update lock is its own),
    /// read-write, without `flock` (the streams' descriptors hold those).
    pub fn reopen_for_updates(&self) -> Result<Volume> {
        let mut members = Vec::with_capacity(self.members.len());
        for m in &self.members {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(format!("/proc/self/fd/{}", m.file.as_raw_fd()))
                .map_err(io_err(&m.path, "reopen"))?;
            members.push(Member {
                path: m.path.clone(),
                file,
                direct: false,
                present: m.present,
            });
        }
        Ok(Volume {
            members,
            meta: self.meta.clone(),
            seq: self.seq,
            stale: self.stale.clone(),
            slot_errors: self.slot_errors.clone(),
            failures: self.failures.clone(),
        })
    }

    /// Allocates partition `name` and persists it as `Creating`: nobody is told it exists yet.
    pub fn begin_partition(
        &mut self,
        name: &str,
        size_bytes: u64,
        placement: &Placement,
    ) -> Result<()> {
        self.update(|meta| volume::allocate(meta, name, size_bytes, placement))
    }

    /// As [`Volume::begin_partition`] for an empty partition that grows as it is written,
    /// with blocks for `reserve_bytes` allocated now.
    pub fn begin_growable_partition(
        &mut self,
        name: &str,
        reserve_bytes: u64,
        placement: &Placement,
    ) -> Result<()> {
        self.update(|meta| volume::allocate_with(meta, name, 0, reserve_bytes, placement))
    }

    /// Makes every write to the members durable, then persists partition `name` as `Ready`.
    /// Only after this returns may the partition be reported created.
    pub fn finish_partition(&mut self, name: &str) -> Result<()> {
        self.sync_data()?;
        self.update(|meta| volume::mark_ready(meta, name))
    }

    /// Removes partition `name` and frees its blocks.
    pub fn remove_partition(&mut self, name: &str) -> Result<()> {
        self.update(|meta| volume::free(meta, name))
    }

    /// Cuts partition `name` to `size_bytes` and gives back the blocks beyond; returns the
    /// blocks freed.
    pub fn truncate_partition(&mut self, name: &str, size_bytes: u64) -> Result<u64> {
        self.update(|meta| volume::truncate(meta, name, size_bytes))
    }

    /// Renames partition `from` to `to`; with `replace`, a partition called `to` is removed
    /// first (see `penstock_core::volume::rename`).
    pub fn rename_partition(&mut self, from: &str, to: &str, replace: bool) -> Result<()> {
        self.update(|meta| volume::rename(meta, from, to, replace))
    }

    /// Reads the newest metadata (what other handles and processes committed since this
    /// handle last did), under the update lock so that no update is seen half-written.
    pub fn refresh(&mut self) -> Result<()> {
        let _lock = self.lock_updates()?;
        self.reload()
    }

    /// `fdatasync` on every member (data written through other descriptors of the same files
    /// included: the sync is per file).
    pub fn sync_data(&self) -> Result<()> {
        self.members
            .iter()
            .enumerate()
            .filter(|(i, m)| m.present && self.meta.member_states[*i].writable())
            .try_for_each(|(_, m)| fdatasync(m))
    }

    /// Checks the metadata copies and the partition table.
    pub fn check(&self) -> CheckReport {
        CheckReport {
            problems: volume::check(&self.meta),
            slot_errors: self
                .slot_errors
                .iter()
                .map(|(m, s, e)| (*m, self.members[m.get()].path.clone(), *s, e.clone()))
                .collect(),
            stale: self
                .stale
                .iter()
                .map(|m| (*m, self.members[m.get()].path.clone()))
                .collect(),
            degraded: self
                .member_states()
                .into_iter()
                .enumerate()
                .filter(|(_, (s, _))| *s != MemberState::Ok)
                .map(|(i, (s, why))| {
                    (
                        MemberIndex::new(i).expect("i < count"),
                        self.members[i].path.clone(),
                        s,
                        why.map(str::to_string),
                    )
                })
                .collect(),
        }
    }

    /// Marks member `member` of a mirrored volume degraded (it failed a read or a write):
    /// persisted, so that every reader and writer leaves it alone until it is replaced and
    /// rebuilt.
    pub fn mark_degraded(&mut self, member: MemberIndex) -> Result<()> {
        self.update(|m| volume::alloc::set_member_state(m, member, MemberState::Degraded))
    }

    /// Repairs what can be proven (`penstock_core::volume::repair`) and rewrites both slots of
    /// every member (two updates), so that stale members and damaged copies are current again.
    /// Returns the problems that were fixed.
    pub fn repair(&mut self) -> Result<Vec<Problem>> {
        let _lock = self.lock_updates()?;
        self.reload()?;
        let mut meta = self.meta.clone();
        let fixed = volume::repair(&mut meta);
        self.commit(meta.clone())?;
        self.commit(meta)?;
        self.slot_errors.clear();
        Ok(fixed)
    }

    /// Replaces member `old` of a mirrored volume by the storage at `new` (a block device, or
    /// a plain file, created with the member's recorded size when missing): `new` becomes
    /// member `old`, in state `Rebuilding` — written to, not read — until
    /// [`Volume::rebuild_with`] has copied every block it holds from the other copies. `new` must
    /// be on another device than every member its blocks are paired with. Needs the volume
    /// alone ([`Access::Exclusive`]); on a refusal nothing changes.
    pub fn replace(&mut self, old: MemberIndex, new: &Path) -> Result<()> {
        if !self.meta.mirrored() {
            return Err(VolumeError::Invalid(
                "replace needs a mirrored volume (created with --mirror 2): without a second \
                 copy there is nothing to rebuild the member from"
                    .to_string(),
            ));
        }
        let count = self.meta.layout.member_count();
        let i = old.get();
        if i >= count {
            return Err(VolumeError::Alloc(AllocError::MemberOutOfRange {
                member: i,
                count,
            }));
        }
        let need_bytes = self.meta.layout.member_sizes_bytes()[i];
        // A missing file is created only once every check passed (a refusal changes nothing).
        let (path, exists) = match std::fs::canonicalize(new) {
            Ok(p) => (p, true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let parent = new
                    .parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .unwrap_or(Path::new("."));
                let parent =
                    std::fs::canonicalize(parent).map_err(io_err(new, "parent directory"))?;
                let file = new.file_name().ok_or_else(|| {
                    VolumeError::Invalid(format!("{}: not a file path", new.display()))
                })?;
                (parent.join(file), false)
            }
            Err(e) => return Err(io_err(new, "resolve")(e)),
        };
        let md_path = if exists {
            path.clone()
        } else {
            path.parent().map(Path::to_path_buf).unwrap_or_default()
        };
        let md = std::fs::metadata(&md_path).map_err(io_err(&md_path, "stat"))?;
        if exists {
            for (j, m) in self.members.iter().enumerate() {
                let same = m.present
                    && m.file
                        .metadata()
                        .is_ok_and(|o| identity(&o) == identity(&md));
                if same && j != i {
                    return Err(VolumeError::ListedTwice {
                        path: path.clone(),
                        first: m.path.clone(),
                    });
                }
            }
            let f = File::open(&path).map_err(io_err(&path, "open"))?;
            let size = storage_size(&path, &f)?;
            if size < need_bytes {
                return Err(VolumeError::TooSmall {
                    path,
                    size_bytes: size,
                    min_bytes: need_bytes,
                });
            }
            let m = open_member(&path, false)?;
            if let Ok(c) = read_slots(&m)
                && c.decoded.meta.uuid != self.meta.uuid
            {
                return Err(VolumeError::Foreign {
                    path,
                    name: c.decoded.meta.name.to_string(),
                    uuid: c.decoded.meta.uuid,
                });
            }
        }
        let domain = domain_of(&md);
        let paired_on_same_device = self.meta.partitions.iter().find_map(|p| {
            let mirror = p.mirror.as_ref()?;
            p.members.iter().zip(&mirror.members).find_map(|(a, b)| {
                let other = if a.get() == i {
                    *b
                } else if b.get() == i {
                    *a
                } else {
                    return None;
                };
                (self.meta.member_domains[other.get()] == domain)
                    .then(|| (p.name.to_string(), other))
            })
        });
        if let Some((name, other)) = paired_on_same_device {
            return Err(VolumeError::Invalid(format!(
                "{}: on the same device as member {other} ({}), which holds the other copy of \
                 blocks of partition {name}: a mirror's copies must be on different devices",
                path.display(),
                self.members[other.get()].path.display()
            )));
        }
        let hint = path
            .to_str()
            .filter(|s| s.len() <= volume::MEMBER_PATH_BYTES_MAX && !s.contains('\0'))
            .ok_or_else(|| {
                VolumeError::Invalid(format!(
                    "{}: a member path must be UTF-8 and at most {} bytes",
                    path.display(),
                    volume::MEMBER_PATH_BYTES_MAX
                ))
            })?
            .to_string();
        if !exists {
            let f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(&path)
                .map_err(io_err(&path, "create"))?;
            f.set_len(need_bytes).map_err(io_err(&path, "extend"))?;
            // Before the metadata names it, its size and then its name are durable: a power
            // cut after the commit must not leave a member shorter than recorded, or none.
            f.sync_all().map_err(io_err(&path, "fsync"))?;
            crate::sys::sync_parent_dir(&path).map_err(io_err(&path, "fsync of its directory"))?;
        }
        let m = open_member(&path, true)?;
        lock(&m, Access::Exclusive)?;
        let _lock = self.lock_updates()?;
        self.reload()?;
        let mut meta = self.meta.clone();
        meta.member_paths[i] = hint;
        meta.member_domains[i] = domain;
        meta.member_states[i] = MemberState::Rebuilding;
        self.members[i] = m;
        self.failures.retain(|(f, _)| f.get() != i);
        self.stale.retain(|s| s.get() != i);
        self.slot_errors.retain(|(s, _, _)| s.get() != i);
        // Twice: both metadata slots of the new member hold a valid copy.
        self.commit(meta.clone())?;
        self.commit(meta)?;
        Ok(())
    }

    /// Rebuilds every member being rebuilt (state `Rebuilding`, or a `Degraded` member that
    /// is present: rebuilt in place, marked `Rebuilding` first): works out every run of bytes
    /// it holds whose other copy is on a healthy member, hands them to `copy` (which moves
    /// them; `penstock volume check --repair` streams them through the engine's disk
    /// scheduler in the bulk class, [`crate::rebuild`]), then syncs the members and marks them
    /// `Ok`. Holds the update lock throughout (no partition grows or is added meanwhile).
    /// When `copy` fails nothing is marked: the members stay `Rebuilding` and a later call
    /// starts again. Returns the bytes copied (0: nothing to rebuild).
    pub fn rebuild_with(
        &mut self,
        copy: &mut dyn FnMut(&RebuildJob<'_>) -> Result<()>,
    ) -> Result<u64> {
        if !self.meta.mirrored() {
            return Ok(0);
        }
        let _lock = self.lock_updates()?;
        self.reload()?;
        let targets: Vec<usize> = (0..self.members.len())
            .filter(|&i| self.members[i].present && self.meta.member_states[i] != MemberState::Ok)
            .collect();
        if targets.is_empty() {
            return Ok(0);
        }
        // A plain-file member shorter than recorded (cut short by hand, or by a power cut
        // that lost its growth) gets its recorded size back first, durably: the copies below
        // fill only the blocks partitions use, and a member left short is degraded again at
        // the next open.
        for &i in &targets {
            let m = &self.members[i];
            let want = self.meta.layout.member_sizes_bytes()[i];
            let md = m.file.metadata().map_err(io_err(&m.path, "stat"))?;
            if md.file_type().is_file() && md.len() < want {
                m.file.set_len(want).map_err(io_err(&m.path, "extend"))?;
                m.file.sync_all().map_err(io_err(&m.path, "fsync"))?;
            }
        }
        // A degraded member rebuilt in place takes writes (its metadata too) from now on.
        if targets
            .iter()
            .any(|&i| self.meta.member_states[i] == MemberState::Degraded)
        {
            let mut meta = self.meta.clone();
            for &i in &targets {
                meta.member_states[i] = MemberState::Rebuilding;
            }
            self.commit(meta.clone())?;
            self.commit(meta)?;
        }
        let mut copies: Vec<RebuildCopy> = Vec::new();
        for p in &self.meta.partitions {
            let map = PartitionMap::new(&self.meta.layout, p)?;
            let Some(mirror) = map.mirror() else {
                continue;
            };
            let unit = map.unit_bytes();
            let mut off = 0;
            while off < map.capacity_bytes() {
                let a = map.locate(off)?;
                let b = mirror.locate(off)?;
                let (src, dst) = if targets.contains(&a.member.get()) {
                    (b, a)
                } else if targets.contains(&b.member.get()) {
                    (a, b)
                } else {
                    off += unit;
                    continue;
                };
                if self.meta.member_states[src.member.get()] != MemberState::Ok {
                    return Err(VolumeError::Invalid(format!(
                        "partition {}: both copies of bytes at {off} are on members being \
                         rebuilt or degraded ({} and {}): nothing to rebuild them from",
                        p.name, src.member, dst.member
                    )));
                }
                let next = RebuildCopy {
                    from: src.member,
                    from_offset_bytes: src.member_offset_bytes,
                    to: dst.member,
                    to_offset_bytes: dst.member_offset_bytes,
                    len_bytes: unit,
                };
                // Consecutive units that continue on both members make one run.
                match copies.last_mut() {
                    Some(c)
                        if c.from == next.from
                            && c.to == next.to
                            && c.from_offset_bytes + c.len_bytes == next.from_offset_bytes
                            && c.to_offset_bytes + c.len_bytes == next.to_offset_bytes =>
                    {
                        c.len_bytes += unit
                    }
                    _ => copies.push(next),
                }
                off += unit;
            }
        }
        // No bad block is copied onto the member: every source unit verifies first.
        self.verify_rebuild_sources(&targets)?;
        let total_bytes = copies.iter().map(|c| c.len_bytes).sum();
        let job = RebuildJob {
            copies,
            total_bytes,
            members: &self.members,
        };
        copy(&job)?;
        self.copy_rebuild_records(&job.copies)?;
        for &i in &targets {
            fdatasync(&self.members[i])?;
        }
        let mut meta = self.meta.clone();
        for &i in &targets {
            meta.member_states[i] = MemberState::Ok;
        }
        self.commit(meta)?;
        self.failures.clear();
        Ok(total_bytes)
    }

    /// Whether the volume keeps block checksums (format version 5).
    pub fn has_sums(&self) -> bool {
        self.meta.sums
    }

    /// Scrubs every `Ready` partition ([`PartitionIo::scrub`]): reads every copy of every
    /// byte, checks it, and with `repair` rewrites a bad unit from a copy that verifies;
    /// `pace` as there (returning `false` stops the scrub: [`ScrubReport::stopped`]). `None`
    /// for a volume without checksums.
    pub fn scrub(
        &self,
        repair: bool,
        pace: &mut dyn FnMut(u64) -> bool,
    ) -> Result<Option<ScrubReport>> {
        if !self.meta.sums {
            return Ok(None);
        }
        let mut report = ScrubReport::default();
        for p in &self.meta.partitions {
            if p.state != PartitionState::Ready {
                continue;
            }
            let pio = self.partition_io(p.name.as_str(), false)?;
            pio.scrub(repair, &mut report, pace)
                .map_err(io_err(&self.members[0].path, "scrub"))?;
            if report.stopped {
                break;
            }
        }
        Ok(Some(report))
    }

    /// Before a rebuild: every byte below a partition's size that the rebuild copies from
    /// `sources` (member, offset) verifies there, or the rebuild must not copy it.
    fn verify_rebuild_sources(&self, targets: &[usize]) -> Result<()> {
        if !self.meta.sums {
            return Ok(());
        }
        let fds: Vec<_> = self.members.iter().map(|m| m.file.as_raw_fd()).collect();
        let s = SumIo::open(&self.meta.layout, &fds, false)
            .map_err(io_err(&self.members[0].path, "reopen for block checksums"))?;
        let unit = SUM_UNIT_BYTES;
        for p in &self.meta.partitions {
            let map = PartitionMap::new(&self.meta.layout, p)?;
            let Some(mirror) = map.mirror() else {
                continue;
            };
            // A stripe unit (placed: a block) at a time: one contiguous run on each copy.
            let run = map.unit_bytes();
            let mut off = 0;
            while off < p.size_bytes {
                let a = map.locate(off)?;
                let b = mirror.locate(off)?;
                let len = run.min(p.size_bytes - off).div_ceil(unit) * unit;
                let src = if targets.contains(&a.member.get()) {
                    b
                } else if targets.contains(&b.member.get()) {
                    a
                } else {
                    off += run;
                    continue;
                };
                let path = &self.members[src.member.get()].path;
                let bytes = s
                    .read_bytes(src.member, src.member_offset_bytes, len as usize)
                    .map_err(io_err(path, "read"))?;
                let recs = s
                    .read_records(src.member, src.member_offset_bytes, (len / unit) as usize)
                    .map_err(io_err(path, "read"))?;
                for (i, rec) in recs.iter().enumerate() {
                    let u = i as u64 * unit;
                    let need = needed_bytes(off + u, p.size_bytes);
                    let from = (u as usize).min(bytes.len());
                    let unit_bytes = &bytes[from..(from + unit as usize).min(bytes.len())];
                    if let Err(why) = rec.verify(unit_bytes, need) {
                        return Err(VolumeError::Invalid(format!(
                            "partition {} block {} (bytes {}..{}): the copy on member {} ({}) \
                             at offset {} fails its checksum ({why}) and the other copy is the \
                             one being rebuilt: nothing good to rebuild it from; nothing was \
                             copied",
                            p.name,
                            (off + u) / map.block_bytes(),
                            off + u,
                            off + u + unit,
                            src.member,
                            path.display(),
                            src.member_offset_bytes + u
                        )));
                    }
                }
                off += run;
            }
        }
        Ok(())
    }

    /// After a rebuild's copy: the records of what was copied, from the source's sum area to
    /// the target's (the same bytes, so the same checksums).
    fn copy_rebuild_records(&self, copies: &[RebuildCopy]) -> Result<()> {
        if !self.meta.sums {
            return Ok(());
        }
        let fds: Vec<_> = self.members.iter().map(|m| m.file.as_raw_fd()).collect();
        let s = SumIo::open(&self.meta.layout, &fds, true)
            .map_err(io_err(&self.members[0].path, "reopen for block checksums"))?;
        let unit = SUM_UNIT_BYTES;
        for c in copies {
            let mut done = 0;
            while done < c.len_bytes {
                let n = ((c.len_bytes - done).min(64 << 20) / unit) as usize;
                let recs = s
                    .read_records(c.from, c.from_offset_bytes + done, n)
                    .map_err(io_err(&self.members[c.from.get()].path, "read"))?;
                s.write_records(c.to, c.to_offset_bytes + done, &recs)
                    .map_err(io_err(&self.members[c.to.get()].path, "write"))?;
                done += n as u64 * unit;
            }
        }
        Ok(())
    }

    /// The descriptors and mapping to stream partition `name`. Reading needs a `Ready`
    /// partition; `allow_creating` lets the creator of a partition write it before it is.
    pub fn partition_io(&self, name: &str, allow_creating: bool) -> Result<PartitionIo> {
        let p = self
            .meta
            .partition(name)
            .ok_or_else(|| VolumeError::NoSuchPartition {
                volume: self.meta.name.to_string(),
                name: name.to_string(),
            })?;
        if p.state == PartitionState::Creating && !allow_creating {
            return Err(VolumeError::NotReady {
                name: name.to_string(),
            });
        }
        PartitionIo::new(self, p)
    }
}

/// One run of a rebuild: `len_bytes` of member `from` (the healthy copy) at
/// `from_offset_bytes`, onto member `to` (being rebuilt) at `to_offset_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RebuildCopy {
    pub from: MemberIndex,
    pub from_offset_bytes: u64,
    pub to: MemberIndex,
    pub to_offset_bytes: u64,
    pub len_bytes: u64,
}

/// What [`Volume::rebuild_with`] hands its copier: the runs to copy (in partition order,
/// consecutive stripe units merged) and access to the members.
#[derive(Debug)]
pub struct RebuildJob<'a> {
    pub copies: Vec<RebuildCopy>,
    pub total_bytes: u64,
    members: &'a [Member],
}

impl RebuildJob<'_> {
    /// Where member `m` is.
    pub fn member_path(&self, m: MemberIndex) -> &Path {
        &self.members[m.get()].path
    }

    /// A new descriptor of member `m` — the same inode, reopened through `/proc/self/fd`
    /// without O_DIRECT (never by its path, which may name another file by now) — for
    /// reading, or for writing (never truncated).
    pub fn reopen_member(&self, m: MemberIndex, write: bool) -> Result<File> {
        let member = &self.members[m.get()];
        let proc = PathBuf::from(format!("/proc/self/fd/{}", member.file.as_raw_fd()));
        OpenOptions::new()
            .read(!write)
            .write(write)
            .open(&proc)
            .map_err(io_err(&member.path, "reopen for the rebuild"))
    }
}

fn random_uuid() -> Result<VolumeUuid> {
    let mut b = [0u8; 16];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(io_err(Path::new("/dev/urandom"), "read"))?;
    // RFC 9562 version 4 (random) and variant bits.
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    Ok(VolumeUuid(b))
}
