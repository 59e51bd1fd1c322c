//! The FUSE file system: inodes over backing paths, pending data per inode, and the log of
//! name changes not yet durable.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    BsdFileFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, KernelConfig, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    TimeOrNow, WriteFlags,
};

use crate::{OpKind, Pending, Power};

/// Where unlinked (or replaced) entries wait, at the backing root, until their directory is
/// synced (then deleted) or the power is cut (then put back). Hidden from the mount.
const TRASH: &str = ".crashfs-trash";
const ROOT: u64 = 1;
/// No attribute or entry caching: every size the kernel shows comes from the layer.
const TTL: Duration = Duration::ZERO;
/// How long an unmount waits for the mount to stop being busy.
const UNMOUNT_WAIT: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct Node {
    /// Relative to the backing directory ("" for the root).
    path: PathBuf,
    dir: bool,
    file: Option<Arc<File>>,
    pending: Option<Pending>,
}

#[derive(Debug)]
enum NameOp {
    Created {
        path: PathBuf,
    },
    Renamed {
        from: PathBuf,
        to: PathBuf,
        displaced: Option<PathBuf>,
    },
    Unlinked {
        path: PathBuf,
        trash: PathBuf,
    },
}

#[derive(Debug)]
struct Logged {
    op: NameOp,
    /// The directories still to be fsynced before the change is durable.
    dirs: Vec<u64>,
}

#[derive(Debug)]
struct Handle {
    sync_writes: bool,
}

#[derive(Debug)]
struct State {
    backing: PathBuf,
    nodes: HashMap<u64, Node>,
    by_path: HashMap<PathBuf, u64>,
    next_ino: u64,
    log: Vec<Logged>,
    handles: HashMap<u64, Handle>,
    next_fh: u64,
    next_trash: u64,
}

fn errno(e: &io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
    } else {
        UNIX_EPOCH
    }
}

impl State {
    fn full(&self, rel: &Path) -> PathBuf {
        self.backing.join(rel)
    }

    fn ino_for(&mut self, rel: PathBuf, dir: bool) -> u64 {
        if let Some(&ino) = self.by_path.get(&rel) {
            return ino;
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.by_path.insert(rel.clone(), ino);
        self.nodes.insert(
            ino,
            Node {
                path: rel,
                dir,
                file: None,
                pending: None,
            },
        );
        ino
    }

    fn node(&self, ino: u64) -> Result<&Node, Errno> {
        self.nodes.get(&ino).ok_or(Errno::ENOENT)
    }

    fn child(&self, parent: u64, name: &OsStr) -> Result<PathBuf, Errno> {
        let p = self.node(parent)?;
        if !p.dir {
            return Err(Errno::ENOTDIR);
        }
        if parent == ROOT && name == TRASH {
            return Err(Errno::ENOENT);
        }
        Ok(p.path.join(name))
    }

    /// The node's backing file, opened once (read and write) and kept: it survives renames.
    fn file(&mut self, ino: u64) -> Result<Arc<File>, Errno> {
        let full = self.full(&self.node(ino)?.path);
        let n = self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
        if n.dir {
            return Err(Errno::EISDIR);
        }
        if n.file.is_none() {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&full)
                .map_err(|e| errno(&e))?;
            n.file = Some(Arc::new(f));
        }
        Ok(n.file.clone().expect("opened above"))
    }

    fn pending(&mut self, ino: u64) -> Result<(Arc<File>, &mut Pending), Errno> {
        let f = self.file(ino)?;
        let n = self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
        if n.pending.is_none() {
            let len = f.metadata().map_err(|e| errno(&e))?.len();
            n.pending = Some(Pending::new(len));
        }
        Ok((f, n.pending.as_mut().expect("made above")))
    }

    fn attr(&mut self, ino: u64) -> Result<FileAttr, Errno> {
        let n = self.node(ino)?;
        let md = match &n.file {
            Some(f) => f.metadata(),
            None => std::fs::symlink_metadata(self.full(&n.path)),
        }
        .map_err(|e| errno(&e))?;
        let size = n.pending.as_ref().map_or(md.len(), Pending::size);
        let kind = if md.is_dir() {
            FileType::Directory
        } else if md.is_file() {
            FileType::RegularFile
        } else {
            return Err(Errno::EOPNOTSUPP);
        };
        Ok(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: time(md.atime(), md.atime_nsec()),
            mtime: time(md.mtime(), md.mtime_nsec()),
            ctime: time(md.ctime(), md.ctime_nsec()),
            crtime: UNIX_EPOCH,
            kind,
            perm: (md.mode() & 0o7777) as u16,
            nlink: if md.is_dir() { 2 } else { 1 },
            uid: md.uid(),
            gid: md.gid(),
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    fn lookup(&mut self, parent: u64, name: &OsStr) -> Result<FileAttr, Errno> {
        let rel = self.child(parent, name)?;
        let md = std::fs::symlink_metadata(self.full(&rel)).map_err(|e| errno(&e))?;
        let ino = self.ino_for(rel, md.is_dir());
        self.attr(ino)
    }

    /// Moves every node at or under `from` to `to`.
    fn repath(&mut self, from: &Path, to: &Path) {
        let moved: Vec<(PathBuf, u64)> = self
            .by_path
            .iter()
            .filter(|(p, _)| p.starts_with(from))
            .map(|(p, &i)| (p.clone(), i))
            .collect();
        for (p, _) in &moved {
            self.by_path.remove(p);
        }
        for (p, ino) in moved {
            let rest = p.strip_prefix(from).expect("filtered on the prefix");
            // `to.join("")` would end in a slash, which a file's path must not.
            let np = if rest.as_os_str().is_empty() {
                to.to_path_buf()
            } else {
                to.join(rest)
            };
            if let Some(n) = self.nodes.get_mut(&ino) {
                n.path = np.clone();
            }
            self.by_path.insert(np, ino);
        }
    }

    /// Moves the entry at `rel` into the trash; returns its trash path.
    fn move_to_trash(&mut self, rel: &Path) -> io::Result<PathBuf> {
        std::fs::create_dir_all(self.backing.join(TRASH))?;
        let t = Path::new(TRASH).join(self.next_trash.to_string());
        self.next_trash += 1;
        std::fs::rename(self.full(rel), self.full(&t))?;
        self.repath(rel, &t);
        Ok(t)
    }

    fn remove_backing(&self, rel: &Path) {
        let full = self.full(rel);
        let _ = std::fs::remove_file(&full).or_else(|_| std::fs::remove_dir_all(&full));
    }

    /// Whether the entry exists in the backing directory (ignoring the trash).
    fn exists(&self, rel: &Path) -> bool {
        std::fs::symlink_metadata(self.full(rel)).is_ok()
    }

    fn sync_file(&mut self, ino: u64) -> Result<(), Errno> {
        let Some(n) = self.nodes.get_mut(&ino) else {
            return Err(Errno::ENOENT);
        };
        if let (Some(f), Some(p)) = (n.file.clone(), n.pending.as_mut()) {
            p.sync(&f).map_err(|e| errno(&e))?;
        }
        Ok(())
    }

    /// fsync of directory `dir`: the name changes in it are durable.
    fn sync_dir(&mut self, dir: u64) {
        for l in &mut self.log {
            l.dirs.retain(|&d| d != dir);
        }
        let (durable, kept): (Vec<Logged>, Vec<Logged>) = std::mem::take(&mut self.log)
            .into_iter()
            .partition(|l| l.dirs.is_empty());
        self.log = kept;
        for l in durable {
            match l.op {
                NameOp::Unlinked { trash, .. } => self.remove_backing(&trash),
                NameOp::Renamed {
                    displaced: Some(t), ..
                } => self.remove_backing(&t),
                _ => {}
            }
        }
    }

    /// Every pending write and name change made durable (a clean unmount).
    fn sync_all(&mut self) {
        let inos: Vec<u64> = self.nodes.keys().copied().collect();
        for ino in inos {
            let _ = self.sync_file(ino);
        }
        self.log.clear();
        let _ = std::fs::remove_dir_all(self.backing.join(TRASH));
    }

    /// The power cut: pending data dropped, name changes undone newest first.
    fn lose_volatile(&mut self) {
        for n in self.nodes.values_mut() {
            n.pending = None;
            n.file = None;
        }
        for l in std::mem::take(&mut self.log).into_iter().rev() {
            // An undo may find its entry already moved by a later durable change (a file
            // created, then renamed into a synced directory): that step is skipped.
            match l.op {
                NameOp::Created { path } => self.remove_backing(&path),
                NameOp::Renamed {
                    from,
                    to,
                    displaced,
                } => {
                    let _ = std::fs::rename(self.full(&to), self.full(&from));
                    if let Some(t) = displaced {
                        let _ = std::fs::rename(self.full(&t), self.full(&to));
                    }
                }
                NameOp::Unlinked { path, trash } => {
                    let _ = std::fs::rename(self.full(&trash), self.full(&path));
                }
            }
        }
        let _ = std::fs::remove_dir_all(self.backing.join(TRASH));
        self.nodes.retain(|&i, _| i == ROOT);
        self.by_path.retain(|_, &mut i| i == ROOT);
    }
}

struct Fs {
    state: Arc<Mutex<State>>,
    power: Power,
}

fn lock(s: &Mutex<State>) -> MutexGuard<'_, State> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

impl Fs {
    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// `Err(EIO)` when the power is off (or goes off at this request).
    fn admit(&self, kind: OpKind) -> Result<(), Errno> {
        if self.power.admit(kind) {
            Ok(())
        } else {
            Err(Errno::EIO)
        }
    }

    fn alive(&self) -> Result<(), Errno> {
        if self.power.is_cut() {
            Err(Errno::EIO)
        } else {
            Ok(())
        }
    }
}

impl Filesystem for Fs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        if let Err(max) = config.set_max_write(1 << 20) {
            let _ = config.set_max_write(max);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let r = self
            .alive()
            .and_then(|()| self.state().lookup(parent.0, name));
        match r {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let r = self.alive().and_then(|()| self.state().attr(ino.0));
        match r {
            Ok(a) => reply.attr(&TTL, &a),
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
        let r = (|| {
            self.alive()?;
            if let Some(size) = size {
                self.admit(OpKind::Write)?;
                let mut st = self.state();
                let (_, p) = st.pending(ino.0)?;
                p.set_size(size);
            }
            let mut st = self.state();
            let full = st.full(&st.node(ino.0)?.path);
            if let Some(m) = mode {
                std::fs::set_permissions(&full, std::fs::Permissions::from_mode(m & 0o7777))
                    .map_err(|e| errno(&e))?;
            }
            if uid.is_some() || gid.is_some() {
                std::os::unix::fs::chown(&full, uid, gid).map_err(|e| errno(&e))?;
            }
            st.attr(ino.0)
        })();
        match r {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let r = (|| {
            self.alive()?;
            let rel = self.state().child(parent.0, name)?;
            self.admit(OpKind::Name)?;
            let mut st = self.state();
            std::fs::create_dir(st.full(&rel)).map_err(|e| errno(&e))?;
            let _ = std::fs::set_permissions(
                st.full(&rel),
                std::fs::Permissions::from_mode(mode & 0o7777),
            );
            st.log.push(Logged {
                op: NameOp::Created { path: rel.clone() },
                dirs: vec![parent.0],
            });
            let ino = st.ino_for(rel, true);
            st.attr(ino)
        })();
        match r {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
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
        if mode & libc::S_IFMT != 0 && mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let r = (|| {
            self.alive()?;
            let rel = self.state().child(parent.0, name)?;
            self.admit(OpKind::Name)?;
            let mut st = self.state();
            let existed = st.exists(&rel);
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(mode & 0o7777)
                .open(st.full(&rel))
                .map_err(|e| errno(&e))?;
            if !existed {
                st.log.push(Logged {
                    op: NameOp::Created { path: rel.clone() },
                    dirs: vec![parent.0],
                });
            }
            let ino = st.ino_for(rel, false);
            let n = st.nodes.get_mut(&ino).expect("made above");
            if n.file.is_none() {
                n.file = Some(Arc::new(f));
            }
            if flags & libc::O_TRUNC != 0 {
                let (_, p) = st.pending(ino)?;
                p.set_size(0);
            }
            let fh = st.next_fh;
            st.next_fh += 1;
            st.handles.insert(
                fh,
                Handle {
                    sync_writes: flags & (libc::O_SYNC | libc::O_DSYNC) != 0,
                },
            );
            Ok((st.attr(ino)?, fh))
        })();
        match r {
            Ok((a, fh)) => {
                reply.created(&TTL, &a, Generation(0), FileHandle(fh), FopenFlags::empty())
            }
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let r = (|| {
            self.alive()?;
            let mut st = self.state();
            st.file(ino.0)?;
            if flags.0 & libc::O_TRUNC != 0 && flags.0 & libc::O_ACCMODE != libc::O_RDONLY {
                drop(st);
                self.admit(OpKind::Write)?;
                st = self.state();
                let (_, p) = st.pending(ino.0)?;
                p.set_size(0);
            }
            let fh = st.next_fh;
            st.next_fh += 1;
            st.handles.insert(
                fh,
                Handle {
                    sync_writes: flags.0 & (libc::O_SYNC | libc::O_DSYNC) != 0,
                },
            );
            Ok(fh)
        })();
        match r {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
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
        let r = (|| {
            self.alive()?;
            let mut st = self.state();
            let f = st.file(ino.0)?;
            let n = st.nodes.get(&ino.0).ok_or(Errno::ENOENT)?;
            match &n.pending {
                Some(p) => p.read(&f, offset, u64::from(size)),
                None => Pending::new(f.metadata()?.len()).read(&f, offset, u64::from(size)),
            }
            .map_err(|e| errno(&e))
        })();
        match r {
            Ok(b) => reply.data(&b),
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
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let r = (|| {
            self.admit(OpKind::Write)?;
            let mut st = self.state();
            let sync_writes = st.handles.get(&fh.0).is_some_and(|h| h.sync_writes)
                || flags.0 & (libc::O_SYNC | libc::O_DSYNC) != 0;
            let (f, p) = st.pending(ino.0)?;
            p.write(&f, offset, data).map_err(|e| errno(&e))?;
            if sync_writes {
                st.sync_file(ino.0)?;
            }
            Ok(data.len())
        })();
        match r {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) makes nothing durable.
        reply.ok();
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
        self.state().handles.remove(&fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let r = self
            .admit(OpKind::Sync)
            .and_then(|()| self.state().sync_file(ino.0));
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.admit(OpKind::Sync) {
            Ok(()) => {
                self.state().sync_dir(ino.0);
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, false, reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, true, reply);
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
        let r = (|| {
            self.alive()?;
            let noreplace = flags.bits() & libc::RENAME_NOREPLACE != 0;
            if flags.bits() & !libc::RENAME_NOREPLACE != 0 {
                return Err(Errno::EINVAL);
            }
            let (from, to) = {
                let st = self.state();
                (st.child(parent.0, name)?, st.child(newparent.0, newname)?)
            };
            let st = self.state();
            if !st.exists(&from) {
                return Err(Errno::ENOENT);
            }
            if from == to {
                // rename(2) of a name onto itself changes nothing.
                return Ok(());
            }
            if st.exists(&to) && noreplace {
                return Err(Errno::EEXIST);
            }
            drop(st);
            self.admit(OpKind::Name)?;
            let mut st = self.state();
            let displaced = if st.exists(&to) {
                let to_dir = std::fs::symlink_metadata(st.full(&to))
                    .map_err(|e| errno(&e))?
                    .is_dir();
                let from_dir = std::fs::symlink_metadata(st.full(&from))
                    .map_err(|e| errno(&e))?
                    .is_dir();
                if to_dir != from_dir {
                    return Err(if to_dir {
                        Errno::EISDIR
                    } else {
                        Errno::ENOTDIR
                    });
                }
                if to_dir
                    && std::fs::read_dir(st.full(&to))
                        .map_err(|e| errno(&e))?
                        .next()
                        .is_some()
                {
                    return Err(Errno::ENOTEMPTY);
                }
                Some(st.move_to_trash(&to).map_err(|e| errno(&e))?)
            } else {
                None
            };
            std::fs::rename(st.full(&from), st.full(&to)).map_err(|e| errno(&e))?;
            st.repath(&from, &to);
            let mut dirs = vec![parent.0];
            if newparent.0 != parent.0 {
                dirs.push(newparent.0);
            }
            st.log.push(Logged {
                op: NameOp::Renamed {
                    from,
                    to,
                    displaced,
                },
                dirs,
            });
            Ok(())
        })();
        match r {
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
        let r = (|| {
            self.alive()?;
            let mut st = self.state();
            let n = st.node(ino.0)?;
            if !n.dir {
                return Err(Errno::ENOTDIR);
            }
            let rel = n.path.clone();
            let mut entries = vec![
                (ino.0, FileType::Directory, ".".into()),
                (ino.0, FileType::Directory, "..".into()),
            ];
            let mut names: Vec<(std::ffi::OsString, bool)> = Vec::new();
            for e in std::fs::read_dir(st.full(&rel)).map_err(|e| errno(&e))? {
                let e = e.map_err(|e| errno(&e))?;
                if ino.0 == ROOT && e.file_name() == TRASH {
                    continue;
                }
                let dir = e.file_type().map(|t| t.is_dir()).unwrap_or(false);
                names.push((e.file_name(), dir));
            }
            names.sort();
            for (name, dir) in names {
                let child = st.ino_for(rel.join(&name), dir);
                let kind = if dir {
                    FileType::Directory
                } else {
                    FileType::RegularFile
                };
                entries.push((child, kind, name));
            }
            Ok(entries)
        })();
        match r {
            Ok(entries) => {
                for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize)
                {
                    if reply.add(INodeNo(ino), (i + 1) as u64, kind, &name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let backing = self.state().backing.clone();
        match rustix::fs::statvfs(&backing) {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                255,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(Errno::from_i32(e.raw_os_error())),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let r = (|| {
            if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
                return Err(Errno::EOPNOTSUPP);
            }
            self.admit(OpKind::Write)?;
            if mode & libc::FALLOC_FL_KEEP_SIZE == 0 {
                let mut st = self.state();
                let (_, p) = st.pending(ino.0)?;
                let end = offset.saturating_add(length);
                if end > p.size() {
                    p.set_size(end);
                }
            }
            Ok(())
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}

impl Fs {
    fn remove(&self, parent: INodeNo, name: &OsStr, dir: bool, reply: ReplyEmpty) {
        let r = (|| {
            self.alive()?;
            let rel = self.state().child(parent.0, name)?;
            {
                let st = self.state();
                let md = std::fs::symlink_metadata(st.full(&rel)).map_err(|e| errno(&e))?;
                if dir && !md.is_dir() {
                    return Err(Errno::ENOTDIR);
                }
                if !dir && md.is_dir() {
                    return Err(Errno::EISDIR);
                }
                if dir
                    && std::fs::read_dir(st.full(&rel))
                        .map_err(|e| errno(&e))?
                        .next()
                        .is_some()
                {
                    return Err(Errno::ENOTEMPTY);
                }
            }
            self.admit(OpKind::Name)?;
            let mut st = self.state();
            let trash = st.move_to_trash(&rel).map_err(|e| errno(&e))?;
            st.log.push(Logged {
                op: NameOp::Unlinked { path: rel, trash },
                dirs: vec![parent.0],
            });
            Ok(())
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}

/// One mount of the layer over a backing directory.
pub struct CrashFs {
    session: Option<fuser::BackgroundSession>,
    state: Arc<Mutex<State>>,
    power: Power,
    mountpoint: PathBuf,
}

impl CrashFs {
    /// Mounts the layer on `mountpoint` (an existing empty directory) over `backing`. What
    /// `backing` holds when mounted is durable.
    pub fn mount(backing: &Path, mountpoint: &Path, power: &Power) -> io::Result<CrashFs> {
        let backing = std::fs::canonicalize(backing)?;
        let _ = std::fs::remove_dir_all(backing.join(TRASH));
        let mut nodes = HashMap::new();
        nodes.insert(
            ROOT,
            Node {
                path: PathBuf::new(),
                dir: true,
                file: None,
                pending: None,
            },
        );
        let mut by_path = HashMap::new();
        by_path.insert(PathBuf::new(), ROOT);
        let state = Arc::new(Mutex::new(State {
            backing,
            nodes,
            by_path,
            next_ino: ROOT + 1,
            log: Vec::new(),
            handles: HashMap::new(),
            next_fh: 1,
            next_trash: 0,
        }));
        let fs = Fs {
            state: state.clone(),
            power: power.clone(),
        };
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            MountOption::FSName("crashfs".to_string()),
            MountOption::Subtype("crashfs".to_string()),
            MountOption::RW,
        ];
        let session = fuser::spawn_mount(fs, mountpoint, &config)?;
        Ok(CrashFs {
            session: Some(session),
            state,
            power: power.clone(),
            mountpoint: mountpoint.to_path_buf(),
        })
    }

    /// Where it is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Whether something would be lost by a cut now (dirty data or an unsynced name).
    pub fn has_volatile(&self) -> bool {
        let st = lock(&self.state);
        !st.log.is_empty()
            || st
                .nodes
                .values()
                .any(|n| n.pending.as_ref().is_some_and(Pending::is_dirty))
    }

    /// The power cut: cuts [`Power`] (every mount sharing it fails its requests from now on),
    /// throws away this mount's writes and name changes that were not made durable, and
    /// unmounts. Kill the processes using the mount first: unmounting waits for none.
    pub fn crash(mut self) -> io::Result<()> {
        self.power.cut();
        lock(&self.state).lose_volatile();
        self.unmount_session()
    }

    /// A clean unmount: everything written is made durable first (as umount(8) would).
    pub fn unmount(mut self) -> io::Result<()> {
        lock(&self.state).sync_all();
        self.unmount_session()
    }

    /// Unmounts; a mount still busy (a killed process's descriptors are closed as the kernel
    /// reaps it) is asked again for up to [`UNMOUNT_WAIT`], then detached.
    fn unmount_session(&mut self) -> io::Result<()> {
        let Some(s) = self.session.take() else {
            return Ok(());
        };
        let deadline = std::time::Instant::now() + UNMOUNT_WAIT;
        loop {
            match rustix::mount::unmount(&self.mountpoint, rustix::mount::UnmountFlags::empty()) {
                Ok(()) => break,
                Err(rustix::io::Errno::BUSY) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(rustix::io::Errno::BUSY) => {
                    rustix::mount::unmount(&self.mountpoint, rustix::mount::UnmountFlags::DETACH)?;
                    return Err(io::Error::other(format!(
                        "{}: still busy after {UNMOUNT_WAIT:?}: detached",
                        self.mountpoint.display()
                    )));
                }
                Err(e) => return Err(e.into()),
            }
        }
        // The kernel closed the connection: the session's thread ends.
        s.join()
    }
}

impl Drop for CrashFs {
    fn drop(&mut self) {
        let _ = self.unmount_session();
    }
}
