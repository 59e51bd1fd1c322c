//! penstock's FUSE filesystem (`penstock volume mount VOL DIR`, issue 21 item 2; its own crate
//! since issue 34): a volume's partitions as regular files in one flat directory, through
//! `fuser`'s safe API (its pure-Rust mount). No `unsafe`. The binary parses the command line,
//! sets the I/O priority, mounts a [`MountFs`] and waits for the unmount or a signal.
//!
//! One FUSE thread serves every request in turn, so each operation sees the previous one
//! whole. Per partition there is at most one writer (`PartitionIo` of a `SharedWrite`
//! handle, made buffered so that any offset and length can be written): it grows the
//! partition as written; its size is committed (fdatasync of the members, then the size and
//! a new generation in the metadata, as `volume import` and recordings do) on `fsync`, on
//! `close` (FUSE flush) when bytes were written, when the last handle writing it is released,
//! and at unmount. Reads of a partition with a writer go through the writer (its mapping
//! covers the blocks grown so far), others through a reader of the newest metadata.
//!
//! Disk I/O (docs/volume-format.md, "The mount's disk I/O"): the mount is a process of its
//! own, so the engine's DRR/EDF disk scheduler, which orders the requests of one engine
//! worker, cannot order its requests. It uses what acts across processes: every read and
//! write is issued by the one FUSE thread (one request at a time), at the I/O priority of
//! `--class` (bulk: IOPRIO_CLASS_IDLE; rt: IOPRIO_CLASS_RT), and written bytes are not left
//! to the kernel's flusher threads (which write at their own priority, in bursts): each write
//! starts its writeback at once from the FUSE thread, and at most `--write-behind` bytes per
//! file are dirty or under writeback before the thread waits for the oldest; written ranges
//! are then dropped from the members' page cache.
//!
//! Unlinking or renaming over a partition that is open keeps it, under a hidden name
//! (`.unlinked.PID.INO`, not listed), readable and writable through the open handles until
//! the last is closed, when it is removed; a mount that starts removes those its dead
//! predecessors left. Renaming an open partition commits its writer first.
//!
//! Not supported (refused, never half done): directories, links, special files, xattrs,
//! fallocate, locks.

#![forbid(unsafe_code)]

use std::collections::{HashMap, VecDeque};
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use fuser::{
    BsdFileFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    TimeOrNow, WriteFlags,
};
use penstock_core::volume::{
    AllocError, NAME_BYTES_MAX, Name, NameError, PARTITIONS_MAX, PartitionState, Placement,
};
use penstock_driver::volume::{Access, PartitionIo, Volume, VolumeError};

/// Media file name endings served with FUSE direct_io by default (see
/// [`MountOptions::direct_io_ext`]).
pub const DIRECT_IO_EXT_DEFAULT: &str = "ts,m2ts,mts,mp4,m4v,mkv,mov,mpg,mpeg,webm,avi,mxf";

/// How a volume is mounted (`penstock volume mount`'s options that the filesystem reads).
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// Refuse every change (the volume is opened read-only).
    pub read_only: bool,
    /// Page-cache rule: a partition at least this large when opened is read and written with
    /// FUSE direct_io; smaller ones are cached by the kernel.
    pub direct_io_min: u64,
    /// Page-cache rule: names ending in `.EXT` for one of these are always direct_io.
    pub direct_io_ext: Vec<String>,
    /// Write-behind bound per open file (0: leave written pages to the kernel's flushers).
    pub write_behind: u64,
}

/// Why a volume was not mounted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MountError {
    #[error(
        "{}: cannot be mounted, not even read-only (`penstock volume check` says more): {error}",
        path.display()
    )]
    Unreadable { path: PathBuf, error: VolumeError },
    #[error("removing {name}, unlinked while open: {error}")]
    Orphan { name: String, error: VolumeError },
    #[error(transparent)]
    Volume(#[from] VolumeError),
}

/// Commits every writer's bytes from outside the FUSE thread (a mount whose files were still
/// open after its unmount timed out).
#[derive(Clone)]
pub struct Flusher(Arc<Mutex<State>>);

impl Flusher {
    /// The partitions whose commit failed, and why.
    pub fn flush_all(&self) -> Vec<(String, Errno)> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).flush_all()
    }
}

impl MountFs {
    /// Mounted read-only (asked, or the volume's check found problems).
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// The volume's name (the mount's FSName).
    pub fn volume_name(&self) -> &str {
        &self.volume_name
    }

    /// What commits the writers' bytes once the filesystem has moved to its FUSE session.
    pub fn flusher(&self) -> Flusher {
        Flusher(self.state.clone())
    }
}

const ROOT: u64 = 1;
/// Attributes and entries are cached by the kernel this long; every change goes through us,
/// so only another process changing the volume could make them stale (see the docs).
const TTL: Duration = Duration::from_secs(1);
/// Zeros written at a time to fill a gap (a write past the end, a truncate that extends).
const ZERO_CHUNK: usize = 1 << 20;

/// Per partition while it is open or known.
#[derive(Default)]
struct Part {
    /// The size clients see (what was written, committed or not).
    size: u64,
    writer: Option<PartitionIo>,
    reader: Option<PartitionIo>,
    /// Bytes written since the last commit.
    dirty: bool,
    open_handles: u32,
    open_writers: u32,
    /// The writer's member ranges (member, offset, length) whose writeback was started and
    /// not yet waited for, oldest first, and their bytes (see [`MountOptions::write_behind`]).
    behind: VecDeque<(usize, u64, u64)>,
    behind_bytes: u64,
}

struct Handle {
    ino: u64,
    write: bool,
}

struct State {
    vol: Volume,
    names: HashMap<u64, String>,
    inos: HashMap<String, u64>,
    next_ino: u64,
    parts: HashMap<String, Part>,
    handles: HashMap<u64, Handle>,
    next_fh: u64,
    mtime: SystemTime,
    write_behind: u64,
}

/// An unlinked partition that is still open is kept under a name starting so until its last
/// close (`.unlinked.PID.INO`); such names are not listed and cannot be made by clients.
const HIDDEN_PREFIX: &str = ".unlinked.";

fn hidden_name(ino: u64) -> String {
    format!("{HIDDEN_PREFIX}{}.{ino}", std::process::id())
}

/// The pid of the mount that hid a partition under `name`, if it is such a name.
fn hidden_owner(name: &str) -> Option<u32> {
    name.strip_prefix(HIDDEN_PREFIX)?
        .split_once('.')?
        .0
        .parse()
        .ok()
}

/// sync_file_range(2) on a member range; errors are left to the commit's fdatasync, which
/// reports a failed writeback.
fn sync_range(fd: &std::os::fd::OwnedFd, offset: u64, len: u64, flags: libc::c_uint) {
    use std::os::fd::AsRawFd;
    let (Ok(off), Ok(n)) = (i64::try_from(offset), i64::try_from(len)) else {
        return;
    };
    if let Err(e) = penstock_driver::sys::sync_file_range(fd.as_raw_fd(), off, n, flags) {
        tracing::debug!("sync_file_range: {e}");
    }
}

pub struct MountFs {
    state: Arc<Mutex<State>>,
    read_only: bool,
    volume_name: String,
    direct_io_min: u64,
    direct_io_ext: Vec<String>,
    uid: u32,
    gid: u32,
}

/// FUSE error for a volume error.
fn errno_of(e: &VolumeError) -> Errno {
    match e {
        VolumeError::NoSuchPartition { .. } => Errno::ENOENT,
        VolumeError::NotReady { .. } => Errno::EBUSY,
        VolumeError::Name(n) | VolumeError::Alloc(AllocError::Name(n)) => name_errno(n),
        VolumeError::Alloc(AllocError::Duplicate { .. }) => Errno::EEXIST,
        VolumeError::Alloc(AllocError::TooManyPartitions) => Errno::ENOSPC,
        VolumeError::Alloc(
            AllocError::Full { .. } | AllocError::TooLarge { .. } | AllocError::TooManyExtents,
        ) => Errno::ENOSPC,
        VolumeError::Busy { .. } => Errno::EBUSY,
        VolumeError::Io { error, .. } => io_errno(error),
        _ => Errno::EIO,
    }
}

fn io_errno(e: &io::Error) -> Errno {
    e.raw_os_error().map_or(Errno::EIO, Errno::from_i32)
}

/// A name the volume refuses: too long → ENAMETOOLONG; '/', NUL, other characters outside
/// `[A-Za-z0-9._-]`, empty, `.`, `..` → EINVAL.
fn name_errno(e: &NameError) -> Errno {
    match e {
        NameError::TooLong { .. } => Errno::ENAMETOOLONG,
        _ => Errno::EINVAL,
    }
}

/// A FUSE name as a partition name.
fn part_name(name: &OsStr) -> Result<String, Errno> {
    let s = std::str::from_utf8(name.as_bytes()).map_err(|_| {
        if name.len() > NAME_BYTES_MAX {
            Errno::ENAMETOOLONG
        } else {
            Errno::EINVAL
        }
    })?;
    Name::new(s).map_err(|e| name_errno(&e))?;
    if s.starts_with(HIDDEN_PREFIX) {
        // Kept for unlinked partitions still open.
        return Err(Errno::EINVAL);
    }
    Ok(s.to_string())
}

impl MountFs {
    /// Opens the volume at `path` for a mount. A volume whose metadata `check` finds problems
    /// in is mounted read-only (the note says why); one that does not open at all is refused.
    pub fn open(path: &Path, a: &MountOptions) -> Result<(MountFs, Option<String>), MountError> {
        let mut read_only = a.read_only;
        let mut note = None;
        let probe = Volume::open(path, Access::Shared).map_err(|error| MountError::Unreadable {
            path: path.to_path_buf(),
            error,
        })?;
        let report = probe.check();
        if !report.is_clean() && !read_only {
            let mut what: Vec<String> = report.problems.iter().map(|p| p.to_string()).collect();
            what.extend(
                report
                    .slot_errors
                    .iter()
                    .map(|(m, p, s, e)| format!("member {m} ({}): {s}: {e}", p.display())),
            );
            what.extend(
                report
                    .stale
                    .iter()
                    .map(|(m, p)| format!("member {m} ({}) is one update behind", p.display())),
            );
            note = Some(format!(
                "volume {} has problems, mounted read-only (run `penstock volume check --repair`): {}",
                probe.meta().name,
                what.join("; ")
            ));
            read_only = true;
        }
        let mut vol = if read_only {
            probe
        } else {
            drop(probe);
            Volume::open(path, Access::SharedWrite)?
        };
        if !read_only {
            // Unlinked partitions a mount kept open when it died: nobody can reach them.
            let orphans: Vec<String> = vol
                .meta()
                .partitions
                .iter()
                .map(|p| p.name.to_string())
                .filter(|n| {
                    hidden_owner(n).is_some_and(|pid| {
                        rustix::process::Pid::from_raw(pid as i32).is_none_or(|p| {
                            rustix::process::test_kill_process(p) == Err(rustix::io::Errno::SRCH)
                        })
                    })
                })
                .collect();
            for n in orphans {
                vol.remove_partition(&n)
                    .map_err(|error| MountError::Orphan {
                        name: n.clone(),
                        error,
                    })?;
            }
        }
        let mtime = std::fs::metadata(path)
            .and_then(|m| m.modified())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let volume_name = vol.meta().name.to_string();
        let fs = MountFs {
            state: Arc::new(Mutex::new(State {
                vol,
                names: HashMap::new(),
                inos: HashMap::new(),
                next_ino: ROOT + 1,
                parts: HashMap::new(),
                handles: HashMap::new(),
                next_fh: 1,
                mtime,
                write_behind: a.write_behind,
            })),
            read_only,
            volume_name,
            direct_io_min: a.direct_io_min,
            direct_io_ext: a
                .direct_io_ext
                .iter()
                .filter(|e| !e.is_empty())
                .map(|e| e.trim_start_matches('.').to_ascii_lowercase())
                .collect(),
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
        };
        Ok((fs, note))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The page-cache rule (see [`MountOptions::direct_io_min`]).
    fn direct_io(&self, name: &str, size: u64) -> bool {
        if size >= self.direct_io_min {
            return true;
        }
        let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
        ext.is_some_and(|e| self.direct_io_ext.contains(&e))
    }

    fn dir_attr(&self, st: &State) -> FileAttr {
        FileAttr {
            ino: INodeNo(ROOT),
            size: 0,
            blocks: 0,
            atime: st.mtime,
            mtime: st.mtime,
            ctime: st.mtime,
            crtime: st.mtime,
            kind: FileType::Directory,
            perm: if self.read_only { 0o555 } else { 0o755 },
            nlink: 2,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    fn file_attr(&self, st: &State, ino: u64, size: u64) -> FileAttr {
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            kind: FileType::RegularFile,
            perm: if self.read_only { 0o444 } else { 0o644 },
            nlink: u32::from(
                !st.names
                    .get(&ino)
                    .is_some_and(|n| n.starts_with(HIDDEN_PREFIX)),
            ),
            ..self.dir_attr(st)
        }
    }
}

impl State {
    /// Reads the newest table when it can: a read-only volume's descriptors cannot take the
    /// update lock, and a table that cannot be re-read leaves the last one read in use.
    fn refresh(&mut self) {
        if let Err(e) = self.vol.refresh() {
            tracing::debug!("re-reading the volume's table: {e}");
        }
    }

    fn ino_of(&mut self, name: &str) -> u64 {
        if let Some(i) = self.inos.get(name) {
            return *i;
        }
        let i = self.next_ino;
        self.next_ino += 1;
        self.inos.insert(name.to_string(), i);
        self.names.insert(i, name.to_string());
        i
    }

    /// The size of a ready partition (ours while we know it, else the metadata's).
    fn size_of(&mut self, name: &str) -> Result<u64, Errno> {
        if let Some(p) = self.parts.get(name) {
            return Ok(p.size);
        }
        self.refresh();
        match self.vol.meta().partition(name) {
            Some(p) if p.state == PartitionState::Ready => Ok(p.size_bytes),
            _ => Err(Errno::ENOENT),
        }
    }

    /// The known state of `name`, loaded from the metadata when first needed.
    fn part(&mut self, name: &str) -> Result<&mut Part, Errno> {
        if !self.parts.contains_key(name) {
            let size = self.size_of(name)?;
            self.parts.insert(
                name.to_string(),
                Part {
                    size,
                    ..Part::default()
                },
            );
        }
        Ok(self.parts.get_mut(name).expect("just inserted"))
    }

    fn name_of(&self, ino: u64) -> Result<String, Errno> {
        self.names.get(&ino).cloned().ok_or(Errno::ENOENT)
    }

    /// The writer of `name`, opened when first needed (buffered: any offset and length).
    fn writer(&mut self, name: &str) -> Result<&PartitionIo, Errno> {
        if self.part(name)?.writer.is_none() {
            self.refresh();
            let mut w = self
                .vol
                .partition_io(name, false)
                .map_err(|e| errno_of(&e))?;
            w.make_buffered().map_err(|e| io_errno(&e))?;
            let p = self.part(name)?;
            p.reader = None;
            p.writer = Some(w);
        }
        Ok(self.parts[name].writer.as_ref().expect("just opened"))
    }

    /// What reads `name`: its writer if it has one, else a reader of the newest metadata.
    fn reader(&mut self, name: &str) -> Result<&PartitionIo, Errno> {
        let p = self.part(name)?;
        if p.writer.is_none() && p.reader.is_none() {
            self.refresh();
            let mut r = self
                .vol
                .partition_io(name, false)
                .map_err(|e| errno_of(&e))?;
            r.make_buffered().map_err(|e| io_errno(&e))?;
            self.parts.get_mut(name).expect("known").reader = Some(r);
        }
        let p = &self.parts[name];
        Ok(p.writer
            .as_ref()
            .or(p.reader.as_ref())
            .expect("one is open"))
    }

    /// Commits what was written to `name` (fdatasync, then size and generation).
    fn commit(&mut self, name: &str) -> Result<(), Errno> {
        let Some(p) = self.parts.get_mut(name) else {
            return Ok(());
        };
        if !p.dirty {
            return Ok(());
        }
        if let Some(w) = &p.writer {
            w.commit().map_err(|e| io_errno(&e))?;
        }
        p.dirty = false;
        Ok(())
    }

    /// Commits and closes the writer of `name` (giving back blocks grown ahead).
    fn close_writer(&mut self, name: &str) -> Result<(), Errno> {
        let Some(p) = self.parts.get_mut(name) else {
            return Ok(());
        };
        p.reader = None;
        p.behind.clear();
        p.behind_bytes = 0;
        if let Some(w) = p.writer.take() {
            w.finish().map_err(|e| io_errno(&e))?;
            p.dirty = false;
        }
        Ok(())
    }

    /// Renames `from`, open or not, to `to` (`replace`: over an existing one), and moves
    /// what is known of it and its inode along. An open writer is committed and closed
    /// first (its growth names the partition); the next write reopens it under `to`.
    fn move_part(&mut self, from: &str, to: &str, replace: bool) -> Result<(), Errno> {
        self.close_writer(from)?;
        self.vol
            .rename_partition(from, to, replace)
            .map_err(|e| errno_of(&e))?;
        if from == to {
            return Ok(());
        }
        self.parts.remove(to);
        if let Some(mut p) = self.parts.remove(from) {
            p.reader = None;
            self.parts.insert(to.to_string(), p);
        }
        if let Some(i) = self.inos.remove(to) {
            self.names.remove(&i);
        }
        if let Some(i) = self.inos.remove(from) {
            self.names.insert(i, to.to_string());
            self.inos.insert(to.to_string(), i);
        }
        Ok(())
    }

    /// Whether `name` has open handles.
    fn busy(&self, name: &str) -> bool {
        self.parts.get(name).is_some_and(|p| p.open_handles > 0)
    }

    /// Keeps open partition `name` under a hidden name until its last close (unlink, or a
    /// rename over it).
    fn hide(&mut self, name: &str) -> Result<(), Errno> {
        let ino = self.ino_of(name);
        self.move_part(name, &hidden_name(ino), false)
    }

    /// Removes a hidden partition once nothing has it open.
    fn remove_if_hidden_and_closed(&mut self, name: &str) -> Result<(), Errno> {
        if !name.starts_with(HIDDEN_PREFIX) || self.busy(name) {
            return Ok(());
        }
        if let Some(p) = self.parts.remove(name) {
            // Nobody can read it again: what it holds need not be committed.
            drop(p);
        }
        if let Some(i) = self.inos.remove(name) {
            self.names.remove(&i);
        }
        self.vol.remove_partition(name).map_err(|e| errno_of(&e))
    }

    /// Write-behind (see [`MountOptions::write_behind`]) of bytes `from..to` just written to
    /// `name`: starts their writeback from this thread, then waits for the oldest ranges
    /// while more than the bound is outstanding and drops them from the page cache.
    fn write_behind(&mut self, name: &str, from: u64, to: u64) {
        let window = self.write_behind;
        if window == 0 || to <= from {
            return;
        }
        let Some(Part {
            writer: Some(w),
            behind,
            behind_bytes,
            ..
        }) = self.parts.get_mut(name)
        else {
            return;
        };
        let Ok(pieces) = w.split_write(from, to - from) else {
            return;
        };
        for p in pieces {
            let m = p.member.get();
            sync_range(
                &w.members[m],
                p.member_offset_bytes,
                p.len_bytes,
                libc::SYNC_FILE_RANGE_WRITE,
            );
            behind.push_back((m, p.member_offset_bytes, p.len_bytes));
            *behind_bytes += p.len_bytes;
        }
        while *behind_bytes > window {
            let Some((m, off, len)) = behind.pop_front() else {
                break;
            };
            *behind_bytes -= len;
            sync_range(
                &w.members[m],
                off,
                len,
                libc::SYNC_FILE_RANGE_WAIT_BEFORE
                    | libc::SYNC_FILE_RANGE_WRITE
                    | libc::SYNC_FILE_RANGE_WAIT_AFTER,
            );
            let _ = rustix::fs::fadvise(
                &w.members[m],
                off,
                std::num::NonZeroU64::new(len),
                rustix::fs::Advice::DontNeed,
            );
        }
    }

    /// Forgets what is known of `name` unless it is open.
    fn forget_if_closed(&mut self, name: &str) {
        if self.parts.get(name).is_some_and(|p| p.open_handles == 0) {
            self.parts.remove(name);
        }
    }

    /// Writes `data` at `offset` of `name` through its writer; bytes between the end and
    /// `offset` are written as zeros first (blocks may hold old bytes of a removed partition).
    fn write(&mut self, name: &str, offset: u64, data: &[u8]) -> Result<u64, Errno> {
        let end = offset.checked_add(data.len() as u64).ok_or(Errno::EFBIG)?;
        let size = self.part(name)?.size;
        let (written_to, result) = {
            let w = self.writer(name)?;
            if end > w.room_bytes() {
                // More than the partition's blocks and every free block of its members.
                return Err(if offset >= w.room_bytes() {
                    Errno::EFBIG
                } else {
                    Errno::ENOSPC
                });
            }
            let zeros = vec![0u8; ZERO_CHUNK.min(offset.saturating_sub(size) as usize)];
            let mut at = size;
            let mut result = Ok(0);
            while at < offset {
                let n = (offset - at).min(ZERO_CHUNK as u64) as usize;
                let (done, err) = w.write_vectored_at(&[&zeros[..n]], at);
                at += done;
                if let Some(e) = err {
                    result = Err(io_errno(&e));
                    break;
                }
            }
            if result.is_ok() && !data.is_empty() {
                let (done, err) = w.write_vectored_at(&[data], offset);
                at = at.max(offset + done);
                result = match err {
                    Some(e) if done == 0 => Err(io_errno(&e)),
                    _ => Ok(done),
                };
            }
            (at, result)
        };
        if written_to > size || result.as_ref().is_ok_and(|n| *n > 0) {
            self.note_written(name, written_to);
            self.write_behind(name, size.min(offset), written_to);
        }
        result
    }

    fn note_written(&mut self, name: &str, end: u64) {
        if let Some(p) = self.parts.get_mut(name) {
            p.size = p.size.max(end);
            p.dirty = true;
        }
    }

    /// Reads up to `len` bytes at `offset` of `name` (short at the end).
    fn read(&mut self, name: &str, offset: u64, len: u32) -> Result<Vec<u8>, Errno> {
        let size = self.part(name)?.size;
        if offset >= size {
            return Ok(Vec::new());
        }
        let len = (size - offset).min(u64::from(len));
        let r = self.reader(name)?;
        let pieces = r.split(offset, len).map_err(|_| Errno::EIO)?;
        let mut buf = vec![0u8; len as usize];
        for p in pieces {
            let b = p.buf_offset_bytes as usize;
            let dst = &mut buf[b..b + p.len_bytes as usize];
            let mut done = 0usize;
            while done < dst.len() {
                match rustix::io::pread(
                    &r.members[p.member.get()],
                    &mut dst[done..],
                    p.member_offset_bytes + done as u64,
                ) {
                    // A member shorter than its recorded size: what is missing reads as zeros.
                    Ok(0) => break,
                    Ok(n) => done += n,
                    Err(rustix::io::Errno::INTR) => {}
                    Err(e) => return Err(Errno::from_i32(e.raw_os_error())),
                }
            }
        }
        // Block checksums: what this mount's writer wrote and has not committed yet has
        // none so far (they are written by its commit), the rest is checked; a bad block
        // comes from the other copy, or the read fails with EIO (logged, naming the block).
        let unsealed = r.unsealed();
        if let Err(e) = r.verify(offset, &mut buf, size, &unsealed) {
            tracing::error!("{e}");
            return Err(Errno::EIO);
        }
        Ok(buf)
    }

    /// Sets `name`'s size: shorter gives blocks back (`volume truncate`), longer writes zeros.
    fn set_size(&mut self, name: &str, new_size: u64) -> Result<(), Errno> {
        let size = self.part(name)?.size;
        if new_size > size {
            let w = self.writer(name)?;
            if new_size > w.room_bytes() {
                return Err(Errno::EFBIG);
            }
            // A write of nothing at the new size fills the gap with zeros.
            self.write(name, new_size, &[])?;
            return self.commit(name);
        }
        if new_size == size {
            return Ok(());
        }
        self.close_writer(name)?;
        self.vol
            .truncate_partition(name, new_size)
            .map_err(|e| errno_of(&e))?;
        let p = self.part(name)?;
        p.size = new_size;
        p.reader = None;
        Ok(())
    }

    /// Commits every writer and removes the unlinked partitions still open (unmount).
    fn flush_all(&mut self) -> Vec<(String, Errno)> {
        let names: Vec<String> = self.parts.keys().cloned().collect();
        let mut failed = Vec::new();
        for n in names {
            let r = if n.starts_with(HIDDEN_PREFIX) {
                if let Some(p) = self.parts.get_mut(&n) {
                    p.open_handles = 0;
                }
                self.remove_if_hidden_and_closed(&n)
            } else {
                self.close_writer(&n)
            };
            if let Err(e) = r {
                failed.push((n, e));
            }
        }
        failed
    }
}

impl Filesystem for MountFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Larger writes: fewer requests for a copy (the kernel caps it to what it allows).
        if let Err(max) = config.set_max_write(1 << 20) {
            let _ = config.set_max_write(max);
        }
        Ok(())
    }

    fn destroy(&mut self) {
        let mut st = self.state();
        for (name, e) in st.flush_all() {
            eprintln!("penstock: {name}: committing at unmount: {e:?}");
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent.0 != ROOT {
            return reply.error(Errno::ENOENT);
        }
        let name = match part_name(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let mut st = self.state();
        match st.size_of(&name) {
            Ok(size) => {
                let ino = st.ino_of(&name);
                reply.entry(&TTL, &self.file_attr(&st, ino, size), Generation(0));
            }
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let mut st = self.state();
        if ino.0 == ROOT {
            return reply.attr(&TTL, &self.dir_attr(&st));
        }
        let r = st.name_of(ino.0).and_then(|n| st.size_of(&n));
        match r {
            Ok(size) => reply.attr(&TTL, &self.file_attr(&st, ino.0, size)),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut st = self.state();
        if ino.0 == ROOT {
            return reply.attr(&TTL, &self.dir_attr(&st));
        }
        // Owner and mode are fixed (the mounting user, 0644): changing them is refused;
        // setting them to what they are (rsync -a, cp -p) is accepted. Times are not kept.
        if uid.is_some_and(|u| u != self.uid) || gid.is_some_and(|g| g != self.gid) {
            return reply.error(Errno::EPERM);
        }
        if mode.is_some_and(|m| m & 0o7000 != 0) {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let name = match st.name_of(ino.0) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        if let Some(new_size) = size {
            if self.read_only {
                return reply.error(Errno::EROFS);
            }
            if let Err(e) = st.set_size(&name, new_size) {
                return reply.error(e);
            }
            st.forget_if_closed(&name);
        }
        match st.size_of(&name) {
            Ok(s) => reply.attr(&TTL, &self.file_attr(&st, ino.0, s)),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let write = flags.acc_mode() != OpenAccMode::O_RDONLY;
        if write && self.read_only {
            return reply.error(Errno::EROFS);
        }
        let mut st = self.state();
        let name = match st.name_of(ino.0) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let size = match st.part(&name) {
            Ok(p) => {
                p.open_handles += 1;
                p.open_writers += u32::from(write);
                p.size
            }
            Err(e) => return reply.error(e),
        };
        if flags.0 & libc::O_TRUNC != 0
            && write
            && size > 0
            && let Err(e) = st.set_size(&name, 0)
        {
            let p = st.part(&name).expect("known");
            p.open_handles -= 1;
            p.open_writers -= 1;
            return reply.error(e);
        }
        let fh = st.next_fh;
        st.next_fh += 1;
        st.handles.insert(fh, Handle { ino: ino.0, write });
        reply.opened(FileHandle(fh), self.fopen_flags(&name, size));
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        if parent.0 != ROOT {
            return reply.error(Errno::ENOENT);
        }
        if self.read_only {
            return reply.error(Errno::EROFS);
        }
        if mode & libc::S_IFMT != 0 && mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let name = match part_name(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let mut st = self.state();
        if st.size_of(&name).is_ok() {
            // O_CREAT without O_EXCL on an existing partition comes as open, not create.
            return reply.error(Errno::EEXIST);
        }
        let made = st
            .vol
            .begin_growable_partition(&name, 0, &Placement::Striped)
            .and_then(|()| st.vol.finish_partition(&name));
        if let Err(e) = made {
            let _ = st.vol.remove_partition(&name);
            return reply.error(errno_of(&e));
        }
        let write = (flags & libc::O_ACCMODE) != libc::O_RDONLY;
        let ino = st.ino_of(&name);
        st.parts.insert(
            name.clone(),
            Part {
                open_handles: 1,
                open_writers: u32::from(write),
                ..Part::default()
            },
        );
        let fh = st.next_fh;
        st.next_fh += 1;
        st.handles.insert(fh, Handle { ino, write });
        reply.created(
            &TTL,
            &self.file_attr(&st, ino, 0),
            Generation(0),
            FileHandle(fh),
            self.fopen_flags(&name, 0),
        );
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut st = self.state();
        let r = st.name_of(ino.0).and_then(|n| st.read(&n, offset, size));
        match r {
            Ok(buf) => reply.data(&buf),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if self.read_only {
            return reply.error(Errno::EROFS);
        }
        let mut st = self.state();
        if !st.handles.get(&fh.0).is_some_and(|h| h.write) {
            return reply.error(Errno::EBADF);
        }
        let r = st.name_of(ino.0).and_then(|n| st.write(&n, offset, data));
        match r {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.commit_ino(ino, reply);
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.commit_ino(ino, reply);
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let mut st = self.state();
        let Some(h) = st.handles.remove(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        let Ok(name) = st.name_of(h.ino) else {
            return reply.ok();
        };
        let mut result = Ok(());
        if let Some(p) = st.parts.get_mut(&name) {
            p.open_handles = p.open_handles.saturating_sub(1);
            if h.write {
                p.open_writers = p.open_writers.saturating_sub(1);
            }
            if p.open_writers == 0 && !name.starts_with(HIDDEN_PREFIX) {
                result = st.close_writer(&name);
            }
        }
        if let Err(e) = st.remove_if_hidden_and_closed(&name) {
            result = result.and(Err(e));
        }
        st.forget_if_closed(&name);
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if parent.0 != ROOT {
            return reply.error(Errno::ENOENT);
        }
        if self.read_only {
            return reply.error(Errno::EROFS);
        }
        let name = match part_name(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let mut st = self.state();
        if st.busy(&name) {
            // POSIX: the name goes, the open file stays until its last close.
            return match st.hide(&name) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            };
        }
        st.parts.remove(&name);
        match st.vol.remove_partition(&name) {
            Ok(()) => {
                if let Some(i) = st.inos.remove(&name) {
                    st.names.remove(&i);
                }
                reply.ok()
            }
            Err(e) => reply.error(errno_of(&e)),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if parent.0 != ROOT || newparent.0 != ROOT {
            return reply.error(Errno::ENOENT);
        }
        if self.read_only {
            return reply.error(Errno::EROFS);
        }
        // RENAME_EXCHANGE / RENAME_WHITEOUT are not supported; NOREPLACE is.
        let noreplace = flags.bits() == libc::RENAME_NOREPLACE;
        if flags.bits() != 0 && !noreplace {
            return reply.error(Errno::EINVAL);
        }
        let (from, to) = match (part_name(name), part_name(newname)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return reply.error(e),
        };
        let mut st = self.state();
        if from != to && st.busy(&to) {
            // Replacing an open file: it stays open under a hidden name, as if unlinked.
            if noreplace || st.size_of(&from).is_err() {
                return reply.error(if noreplace {
                    Errno::EEXIST
                } else {
                    Errno::ENOENT
                });
            }
            if let Err(e) = st.hide(&to) {
                return reply.error(e);
            }
        }
        match st.move_part(&from, &to, !noreplace) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino.0 != ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let mut st = self.state();
        st.refresh();
        let names: Vec<String> = st
            .vol
            .meta()
            .partitions
            .iter()
            .filter(|p| p.state == PartitionState::Ready)
            .map(|p| p.name.to_string())
            .filter(|n| !n.starts_with(HIDDEN_PREFIX))
            .collect();
        let mut entries = vec![
            (ROOT, FileType::Directory, ".".to_string()),
            (ROOT, FileType::Directory, "..".to_string()),
        ];
        for n in names {
            let i = st.ino_of(&n);
            entries.push((i, FileType::RegularFile, n));
        }
        for (k, (i, kind, n)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(i), k as u64 + 1, kind, n) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let mut st = self.state();
        st.refresh();
        let meta = st.vol.meta();
        let block = meta.layout.block_bytes();
        let total: u64 = meta
            .layout
            .members()
            .map(|m| u64::from(meta.layout.member_blocks(m)))
            .sum();
        let free: u64 = meta.used.iter().map(|u| u64::from(u.free_blocks())).sum();
        // A mirrored volume keeps every block twice: what a file can use is half the blocks
        // (issue 30: `df` showed the raw space, twice what could be written).
        let copies = u64::from(meta.copies.max(1));
        let (total, free) = (total / copies, free / copies);
        let frsize = 4096u64;
        let per = block / frsize;
        let files = PARTITIONS_MAX as u64;
        reply.statfs(
            total * per,
            free * per,
            free * per,
            files,
            files.saturating_sub(meta.partitions.len() as u64),
            frsize as u32,
            NAME_BYTES_MAX as u32,
            frsize as u32,
        );
    }

    // Not supported: refused, so that nothing pretends to work.

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EOPNOTSUPP);
    }

    fn mkdir(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EOPNOTSUPP);
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _link_name: &OsStr,
        _target: &Path,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EOPNOTSUPP);
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EOPNOTSUPP);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EOPNOTSUPP);
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: fuser::ReplyXattr,
    ) {
        reply.error(Errno::EOPNOTSUPP);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: fuser::ReplyXattr) {
        reply.error(Errno::EOPNOTSUPP);
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EOPNOTSUPP);
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EOPNOTSUPP);
    }
}

impl MountFs {
    /// Commits the writer of `ino` (`close`, `fsync`: the same commit).
    fn commit_ino(&self, ino: INodeNo, reply: ReplyEmpty) {
        let mut st = self.state();
        let r = st.name_of(ino.0).and_then(|n| st.commit(&n));
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fopen_flags(&self, name: &str, size: u64) -> FopenFlags {
        if self.direct_io(name, size) {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::empty()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_volume_refuses_get_their_errno() {
        assert_eq!(part_name(OsStr::new("a.ts")), Ok("a.ts".to_string()));
        assert_eq!(part_name(OsStr::new("a/b")), Err(Errno::EINVAL));
        assert_eq!(part_name(OsStr::from_bytes(b"a\0b")), Err(Errno::EINVAL));
        assert_eq!(part_name(OsStr::from_bytes(b"\xff")), Err(Errno::EINVAL));
        assert_eq!(part_name(OsStr::new("a b")), Err(Errno::EINVAL));
        assert_eq!(part_name(OsStr::new("..")), Err(Errno::EINVAL));
        let long = "x".repeat(NAME_BYTES_MAX + 1);
        assert_eq!(part_name(OsStr::new(&long)), Err(Errno::ENAMETOOLONG));
        assert_eq!(
            part_name(OsStr::new(&"x".repeat(NAME_BYTES_MAX))),
            Ok("x".repeat(NAME_BYTES_MAX))
        );
    }
}
