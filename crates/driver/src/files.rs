//! The engine's open-file table: streams of the same file share one descriptor, as nginx's
//! `open_file_cache` does, so that 10,000 streams of one file hold one source descriptor
//! between them instead of 10,000 (which, with a socket each, passed RLIMIT_NOFILE).
//!
//! Opening stays the caller's: a path is resolved (and confined: the server's openat2
//! beneath its root) exactly as before, and the table only deduplicates *after* the open.
//! [`OpenFileTable::share`] looks at the new descriptor with fstat(2) and fcntl(F_GETFL):
//! when an entry for the same (device, inode, open mode) is live, the new descriptor is closed
//! and the entry's is shared; otherwise the new one becomes the entry. A stream can thus only
//! ever share a descriptor of an inode it opened itself, with the same mode.
//!
//! - **Key**: `st_dev`, `st_ino` and the status flags that change how a read behaves
//!   ([`FileKey`]): the access mode, `O_DIRECT` (the uring path's reopened descriptor is its
//!   own entry), `O_NONBLOCK`, `O_NOATIME`, `O_APPEND`, `O_SYNC`/`O_DSYNC`. Only read-only
//!   descriptors of regular files and block devices are shared; anything else (a write
//!   target, a pipe, a socket, a read-write descriptor) is kept as the caller's own.
//! - **Lifetime**: an entry lives exactly as long as a stream holds it. The last
//!   [`Descriptor`] dropped removes the entry and closes the descriptor (on the worker that
//!   ran the stream, as an unshared one was). Nothing is cached past its last stream, so there
//!   is no stale entry to expire: a file replaced by rename is a new inode, hence a new entry;
//!   a deleted file's inode cannot be reused while an entry holds it open.
//! - **Bound**: at most two entries per running stream (its buffered descriptor and its
//!   O_DIRECT one), so the table is bounded by `EngineConfig::streams_max`; a map slot holds
//!   no descriptor of its own.
//! - **Offsets**: a shared descriptor shares its file offset, so every data path reads at an
//!   explicit offset and never uses it: pread/preadv2 (copy), sendfile and splice with an
//!   offset argument, io_uring reads with an offset (uring). What a stream sends is fixed by
//!   its own open: its size is the caller's fstat at that open (`Opened::size`), its extent
//!   is resolved against it. A file appended to while shared: a stream opened before the
//!   append sends up to its old size, one opened after it the new one. A file truncated while
//!   shared: every stream reading past the new end fails with `SourceShrank`, as each did
//!   with its own descriptor.
//! - **Read-ahead** state is per open file description, so streams of one file at different
//!   offsets share it; the kernel's context read-ahead detects interleaved sequential readers
//!   from the page cache itself, and O_DIRECT reads have none.
//!
//! The lock is held for a hash-map lookup or insertion only; descriptors are opened and
//! closed outside it.

use std::collections::HashMap;
use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use rustix::fs::{FileType, OFlags};

/// The status flags a shared descriptor must agree on (`F_GETFL` also reports flags that
/// mean nothing for reads, such as `O_LARGEFILE`, which the kernel sets itself on 64-bit).
fn key_flags() -> OFlags {
    OFlags::RWMODE
        | OFlags::DIRECT
        | OFlags::NONBLOCK
        | OFlags::NOATIME
        | OFlags::APPEND
        | OFlags::SYNC
        | OFlags::DSYNC
}

/// What identifies a shared open file: the inode and how it was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileKey {
    pub dev: u64,
    pub ino: u64,
    /// The status flags of [`key_flags`] the descriptor was opened with.
    flags: u32,
}

impl FileKey {
    /// The key of `fd` when it may be shared: a read-only descriptor of a regular file or a
    /// block device. `None` for anything else, or when fstat/fcntl fail.
    pub fn of(fd: impl AsFd) -> Option<FileKey> {
        let fd = fd.as_fd();
        let st = rustix::fs::fstat(fd).ok()?;
        let kind = FileType::from_raw_mode(st.st_mode);
        if kind != FileType::RegularFile && kind != FileType::BlockDevice {
            return None;
        }
        let flags = rustix::fs::fcntl_getfl(fd).ok()? & key_flags();
        if flags & OFlags::RWMODE != OFlags::RDONLY {
            return None;
        }
        Some(FileKey {
            dev: st.st_dev,
            ino: st.st_ino,
            flags: flags.bits(),
        })
    }

    /// This key with O_DIRECT: what the same inode reopened for direct reads is keyed by.
    fn direct(self) -> FileKey {
        FileKey {
            flags: self.flags | OFlags::DIRECT.bits(),
            ..self
        }
    }

    pub fn is_direct(&self) -> bool {
        OFlags::from_bits_retain(self.flags).contains(OFlags::DIRECT)
    }
}

/// A descriptor of an opened endpoint: its own, or one shared with other streams through an
/// [`OpenFileTable`]. Dropping it closes an own descriptor; a shared one is closed when its
/// last holder drops it.
pub struct Descriptor(Repr);

enum Repr {
    Own(OwnedFd),
    Shared(Arc<SharedFile>),
}

impl Descriptor {
    /// Whether this descriptor is an entry of an open-file table.
    pub fn is_shared(&self) -> bool {
        matches!(self.0, Repr::Shared(_))
    }

    /// A new descriptor of the same open file description (dup(2)), owned by the caller.
    pub fn try_clone_to_owned(&self) -> std::io::Result<OwnedFd> {
        self.as_fd().try_clone_to_owned()
    }
}

impl From<OwnedFd> for Descriptor {
    fn from(fd: OwnedFd) -> Descriptor {
        Descriptor(Repr::Own(fd))
    }
}

/// What callers hand over as their own descriptor (`x.into()`, as for an `OwnedFd`).
macro_rules! own_from {
    ($($t:ty),*) => {$(
        impl From<$t> for Descriptor {
            fn from(x: $t) -> Descriptor {
                Descriptor(Repr::Own(x.into()))
            }
        }
    )*};
}
own_from!(
    std::fs::File,
    std::net::TcpStream,
    std::net::UdpSocket,
    std::os::unix::net::UnixStream
);

impl AsFd for Descriptor {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match &self.0 {
            Repr::Own(fd) => fd.as_fd(),
            Repr::Shared(s) => s.fd.as_fd(),
        }
    }
}

impl AsRawFd for Descriptor {
    fn as_raw_fd(&self) -> RawFd {
        self.as_fd().as_raw_fd()
    }
}

impl fmt::Debug for Descriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Repr::Own(fd) => f.debug_tuple("Own").field(fd).finish(),
            Repr::Shared(s) => f
                .debug_struct("Shared")
                .field("fd", &s.fd)
                .field("key", &s.key)
                .finish(),
        }
    }
}

/// One entry: the descriptor, and where to remove itself from when its last holder is gone.
struct SharedFile {
    fd: OwnedFd,
    key: FileKey,
    table: Weak<Table>,
}

impl Drop for SharedFile {
    fn drop(&mut self) {
        let Some(table) = self.table.upgrade() else {
            return; // The table is gone (the engine was dropped first): nothing to remove.
        };
        let mut entries = table.lock();
        // Remove the slot only if it is still this entry's: a `share` that found it dying
        // (its upgrade failed) has put a new entry there already, which must stay.
        if entries
            .get(&self.key)
            .is_some_and(|w| std::ptr::eq(w.as_ptr(), self))
        {
            entries.remove(&self.key);
        }
        // `self.fd` closes after the lock is released, when the fields drop.
    }
}

#[derive(Default)]
struct Table {
    entries: Mutex<HashMap<FileKey, Weak<SharedFile>>>,
    /// Shares of an entry that was already open (each saved a descriptor).
    hits: AtomicU64,
}

impl Table {
    fn lock(&self) -> MutexGuard<'_, HashMap<FileKey, Weak<SharedFile>>> {
        // A panic while the lock was held cannot leave the map half-changed (one insert or
        // remove): keep using it.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The open-file table's figures now ([`OpenFileTable::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenFileStats {
    /// Open files in the table (each one descriptor, shared by one or more streams).
    pub files: u64,
    /// Since the table was made: opens whose descriptor was closed at once because an entry
    /// for the same file was open (each saved a descriptor while both streams ran).
    pub shares: u64,
}

/// Shared read-only descriptors by (device, inode, open mode); see the module's doc.
#[derive(Clone, Default)]
pub struct OpenFileTable {
    table: Arc<Table>,
}

impl fmt::Debug for OpenFileTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenFileTable")
            .field("stats", &self.stats())
            .finish()
    }
}

impl OpenFileTable {
    pub fn new() -> OpenFileTable {
        OpenFileTable::default()
    }

    /// `fd`, shared: the table's descriptor for the same open file when one is live (`fd` is
    /// then closed), else `fd` made the entry. A descriptor that may not be shared (see
    /// [`FileKey::of`]), or one already shared, comes back as it was.
    pub fn share(&self, fd: Descriptor) -> Descriptor {
        let own = match fd.0 {
            Repr::Own(own) => own,
            shared @ Repr::Shared(_) => return Descriptor(shared),
        };
        let Some(key) = FileKey::of(&own) else {
            return Descriptor(Repr::Own(own));
        };
        let mut entries = self.table.lock();
        if let Some(entry) = entries.get(&key).and_then(Weak::upgrade) {
            drop(entries);
            self.table.hits.fetch_add(1, Ordering::Relaxed);
            drop(own); // closed outside the lock
            return Descriptor(Repr::Shared(entry));
        }
        let entry = Arc::new(SharedFile {
            fd: own,
            key,
            table: Arc::downgrade(&self.table),
        });
        entries.insert(key, Arc::downgrade(&entry));
        drop(entries);
        Descriptor(Repr::Shared(entry))
    }

    /// The O_DIRECT descriptor of the file `source` is open on: the table's when one is live,
    /// else `reopen(source)` shared. `None` when `source` cannot be shared (then nothing is
    /// looked up) and `reopen` fails.
    pub(crate) fn direct_of(
        &self,
        source: &Descriptor,
        reopen: impl FnOnce(&Descriptor) -> Option<OwnedFd>,
    ) -> Option<Descriptor> {
        if let Some(key) = FileKey::of(source).map(FileKey::direct)
            && let Some(entry) = self.find(key)
        {
            return Some(entry);
        }
        reopen(source).map(|fd| self.share(fd.into()))
    }

    /// The live entry for `key`, shared.
    fn find(&self, key: FileKey) -> Option<Descriptor> {
        let entries = self.table.lock();
        let entry = entries.get(&key).and_then(Weak::upgrade);
        drop(entries);
        let entry = entry?;
        self.table.hits.fetch_add(1, Ordering::Relaxed);
        Some(Descriptor(Repr::Shared(entry)))
    }

    /// Entries now, and shares so far.
    pub fn stats(&self) -> OpenFileStats {
        let files = self.table.lock().len() as u64;
        OpenFileStats {
            files,
            shares: self.table.hits.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    use std::path::{Path, PathBuf};

    /// A file of `bytes` in `dir`, by its canonical path (what /proc/self/fd links name).
    fn file_with(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
        let p = dir.join(name);
        File::create(&p).unwrap().write_all(bytes).unwrap();
        p.canonicalize().unwrap()
    }

    fn open(p: &Path) -> Descriptor {
        File::open(p).unwrap().into()
    }

    /// This process's descriptors open on `p` now. (Tests run in parallel threads of one
    /// process: a bare descriptor number may be reused by another test at once, a path
    /// of this test's own directory is not.)
    fn fds_on(p: &Path) -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|target| target == p)
            .count()
    }

    #[test]
    fn same_inode_shares_one_descriptor_and_the_last_drop_closes_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = file_with(dir.path(), "a", b"hello");
        let t = OpenFileTable::new();
        let first = open(&p);
        let first_raw = first.as_raw_fd();
        let a = t.share(first);
        assert!(a.is_shared());
        assert_eq!(a.as_raw_fd(), first_raw, "the first open becomes the entry");
        let b = t.share(open(&p));
        assert_eq!(
            b.as_raw_fd(),
            first_raw,
            "a second open of the inode shares the entry"
        );
        assert_eq!(fds_on(&p), 1, "the second descriptor was closed");
        assert_eq!(
            t.stats(),
            OpenFileStats {
                files: 1,
                shares: 1
            }
        );
        drop(a);
        assert_eq!(fds_on(&p), 1, "still held by b");
        assert_eq!(t.stats().files, 1);
        drop(b);
        assert_eq!(fds_on(&p), 0, "the last holder's drop closes it");
        assert_eq!(t.stats().files, 0, "and removes the entry");
        // A later open starts a new entry.
        let c = t.share(open(&p));
        assert!(c.is_shared());
        assert_eq!(
            t.stats(),
            OpenFileStats {
                files: 1,
                shares: 1
            }
        );
    }

    #[test]
    fn different_inodes_and_modes_do_not_share() {
        let dir = tempfile::tempdir().unwrap();
        let p = file_with(dir.path(), "a", b"one");
        let q = file_with(dir.path(), "b", b"two");
        let t = OpenFileTable::new();
        let a = t.share(open(&p));
        let b = t.share(open(&q));
        assert_ne!(a.as_raw_fd(), b.as_raw_fd());
        // The same inode opened read-write is not shared (nor entered): a writer's own.
        let rw = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        let rw = t.share(rw.into());
        assert!(!rw.is_shared());
        // Read-only with O_NOATIME is another mode, another entry.
        let noatime = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOATIME)
            .open(&p)
            .unwrap();
        let noatime = t.share(noatime.into());
        assert!(noatime.is_shared());
        assert_ne!(noatime.as_raw_fd(), a.as_raw_fd());
        assert_eq!(fds_on(&p), 3, "read-only, read-write, read-only O_NOATIME");
        assert_eq!(
            t.stats(),
            OpenFileStats {
                files: 3,
                shares: 0
            }
        );
    }

    #[test]
    fn a_file_replaced_by_rename_is_a_new_entry() {
        let dir = tempfile::tempdir().unwrap();
        let p = file_with(dir.path(), "a", b"old");
        let t = OpenFileTable::new();
        let old = t.share(open(&p));
        let n = file_with(dir.path(), "a.new", b"new bytes");
        std::fs::rename(&n, &p).unwrap();
        let new = t.share(open(&p));
        assert_ne!(old.as_raw_fd(), new.as_raw_fd());
        let read = |d: &Descriptor| {
            let mut b = [0u8; 16];
            let n = rustix::io::pread(d, &mut b, 0).unwrap();
            b[..n].to_vec()
        };
        assert_eq!(read(&old), b"old");
        assert_eq!(read(&new), b"new bytes");
        assert_eq!(
            t.stats(),
            OpenFileStats {
                files: 2,
                shares: 0
            }
        );
    }

    #[test]
    fn pipes_sockets_and_write_only_files_are_kept_as_they_are() {
        let dir = tempfile::tempdir().unwrap();
        let t = OpenFileTable::new();
        let (r, w) = rustix::pipe::pipe().unwrap();
        assert!(!t.share(r.into()).is_shared());
        assert!(!t.share(w.into()).is_shared());
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(!t.share(OwnedFd::from(s).into()).is_shared());
        let wo = File::create(dir.path().join("out")).unwrap();
        assert!(!t.share(wo.into()).is_shared());
        assert_eq!(t.stats().files, 0);
    }

    #[test]
    fn direct_reopen_is_its_own_entry_and_is_looked_up_before_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let p = file_with(dir.path(), "a", &[7u8; 8192]);
        let t = OpenFileTable::new();
        let src = t.share(open(&p));
        let reopen = |d: &Descriptor| {
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(format!("/proc/self/fd/{}", d.as_raw_fd()))
                .ok()
                .map(OwnedFd::from)
        };
        let Some(d1) = t.direct_of(&src, reopen) else {
            eprintln!(
                "SKIPPED: O_DIRECT refused by the file system of {}",
                p.display()
            );
            return;
        };
        assert_ne!(d1.as_raw_fd(), src.as_raw_fd());
        let mut reopened = 0;
        let d2 = t
            .direct_of(&src, |d| {
                reopened += 1;
                reopen(d)
            })
            .unwrap();
        assert_eq!(
            reopened, 0,
            "the live O_DIRECT entry is found without a reopen"
        );
        assert_eq!(d1.as_raw_fd(), d2.as_raw_fd());
        assert_eq!(fds_on(&p), 2, "one buffered, one O_DIRECT");
        assert_eq!(
            t.stats(),
            OpenFileStats {
                files: 2,
                shares: 1
            }
        );
    }

    #[test]
    fn an_entry_outlives_its_table() {
        let dir = tempfile::tempdir().unwrap();
        let p = file_with(dir.path(), "a", b"x");
        let t = OpenFileTable::new();
        let a = t.share(open(&p));
        drop(t);
        assert_eq!(fds_on(&p), 1);
        drop(a);
        assert_eq!(fds_on(&p), 0);
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        /// Steps on a table over three files: open file k (a new holder), or drop holder i.
        #[derive(Debug, Clone)]
        enum Op {
            Open(usize),
            Drop(usize),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                (0usize..3).prop_map(Op::Open),
                any::<usize>().prop_map(Op::Drop)
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]
            /// Against a model (holders per file): a file with holders has one descriptor, the
            /// same for all of them; a file without has none; the table has an entry per
            /// file with holders; shares = opens that found the file open.
            #[test]
            fn the_table_matches_a_refcount_model(ops in proptest::collection::vec(op(), 1..60)) {
                let dir = tempfile::tempdir().unwrap();
                let paths: Vec<_> = (0..3u8)
                    .map(|k| file_with(dir.path(), &format!("f{k}"), &[k]))
                    .collect();
                let t = OpenFileTable::new();
                let mut held: Vec<(usize, Descriptor)> = Vec::new();
                let mut shares = 0u64;
                for op in ops {
                    match op {
                        Op::Open(k) => {
                            shares += u64::from(held.iter().any(|(f, _)| *f == k));
                            held.push((k, t.share(open(&paths[k]))));
                        }
                        Op::Drop(i) if !held.is_empty() => {
                            held.remove(i % held.len());
                        }
                        Op::Drop(_) => {}
                    }
                    let mut files = 0;
                    for (k, p) in paths.iter().enumerate() {
                        let mut holders = held.iter().filter(|(f, _)| *f == k).map(|(_, d)| d);
                        let want = match holders.next() {
                            Some(first) => {
                                files += 1;
                                let raw = first.as_raw_fd();
                                prop_assert!(holders.all(|d| d.as_raw_fd() == raw));
                                1
                            }
                            None => 0,
                        };
                        prop_assert_eq!(fds_on(p), want, "descriptors open on file {}", k);
                    }
                    prop_assert_eq!(t.stats(), OpenFileStats { files, shares });
                }
            }
        }
    }
}
