//! crashfs: a FUSE pass-through over a backing directory that loses, when the power is cut,
//! everything that was not made durable — in the spirit of LazyFS and CrashMonkey, for
//! penstock's power-cut tests (issue 31 item 3; `crates/penstock/tests/powercut.rs`).
//!
//! A SIGKILL keeps every write in the page cache; a power cut does not. Mounted with
//! [`CrashFs::mount`], the layer keeps in memory every write not yet made durable, and
//! [`CrashFs::crash`] throws them away and unmounts: the backing directory then holds what a
//! disk would hold after the cut, and a fresh mount over it is the "reboot".
//!
//! # What it models
//!
//! - **File data and size.** `write`, `ftruncate` and `fallocate` (mode 0: extend) of a file
//!   change an in-memory view of it (dirty 4 KiB pages over the durable bytes, and a size); the
//!   writer reads its own writes. `fsync` or `fdatasync` of *that* file — or a write through a
//!   descriptor opened `O_SYNC`/`O_DSYNC` — writes them into the backing file: durable. Both
//!   calls make data and size durable (fdatasync covers the size the data needs).
//! - **Names (strict POSIX).** A created file or directory, a rename and an unlink are applied
//!   to the backing directory at once but logged; the entry becomes durable only when its
//!   directory is fsynced (for a rename: both directories). At a cut the log is undone, newest
//!   first: created names vanish, renamed ones go back (a replaced target comes back),
//!   unlinked ones return (from a hidden `.crashfs-trash` at the root). ext4 and XFS in
//!   practice also make a new file's name durable with the file's own fsync; this layer does
//!   **not** model that and is therefore stricter than they are: a program that relies on it
//!   fails here.
//! - **The cut** is [`Power`]: shared by several mounts (a mirror's members on two "devices"),
//!   it counts the mutating requests (writes, truncations, syncs, name changes) and can be
//!   set to cut *before* the k-th one ([`Power::cut_before`]) — that request and every later
//!   one fail with EIO, as a dead disk would, until the test kills the process and calls
//!   [`CrashFs::crash`]. So a test cuts at a chosen point of a program's write/fsync sequence,
//!   deterministically, whatever the program's timing.
//!
//! # What it does not model
//!
//! - **O_DIRECT**: accepted (the kernel sends the transfers to the layer like any other), and
//!   treated as a drive with a volatile write cache treats it: not durable until fsync. The
//!   alignment a real device would demand is not checked (statx reports no DIO alignment on
//!   FUSE; callers assume 4096).
//! - **sync_file_range** never reaches a FUSE file system: it makes nothing durable here
//!   (it is not a durability call on real file systems either). `syncfs`/`sync` are not seen
//!   (fuser 0.18 has no SYNCFS request): they make nothing durable here.
//! - **mmap** writes arrive as writes (when the kernel writes the pages back) and are modelled
//!   as such, with no guarantee of when; **locks** (flock, OFD, POSIX) are the kernel's local
//!   locks and are not affected by a cut; **hard links, symlinks, device nodes, xattrs** are
//!   refused.
//! - **Partial-page tearing and reordering**: a cut loses whole 4 KiB pages and all of a
//!   file's dirty pages at once; it never keeps some of the writes made before a sync and not
//!   others, and never tears a page. Real disks can keep any subset of unsynced sectors: a
//!   program's checksums must cover that, and this layer does not test it.
//! - **Times, modes, owners**: applied to the backing file at once (not undone by a cut).
//! - The backing file system's own durability: a sync writes into the backing file without
//!   fsyncing it — the backing directory stands for the disk, which does not crash here.
//!
//! Needs `/dev/fuse` and the right to mount (root here, or `fusermount3`).

#![forbid(unsafe_code)]

mod fs;
mod pending;

pub use fs::CrashFs;
pub use pending::{PAGE_BYTES, Pending};

use std::sync::{Arc, Mutex, MutexGuard};

/// The kinds of mutating request counted by [`Power`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// A write, truncation or allocation of file data.
    Write,
    /// fsync/fdatasync of a file or a directory.
    Sync,
    /// A name created, renamed or removed.
    Name,
}

/// The counts of mutating requests seen so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpCounts {
    /// Every mutating request (the sum of the three below).
    pub ops: u64,
    pub writes: u64,
    pub syncs: u64,
    pub names: u64,
}

#[derive(Debug, Default)]
struct PowerState {
    counts: OpCounts,
    cut_before: Option<u64>,
    cut: bool,
}

/// The power supply of one or more [`CrashFs`] mounts: counts their mutating requests and
/// cuts them all at once.
#[derive(Clone, Debug, Default)]
pub struct Power(Arc<Mutex<PowerState>>);

impl Power {
    /// Power on, no cut planned.
    pub fn new() -> Power {
        Power::default()
    }

    fn state(&self) -> MutexGuard<'_, PowerState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Plans the cut just before the `k`-th mutating request (1-based: `k = 1` cuts before
    /// the first). That request and every later one fail with EIO.
    pub fn cut_before(&self, k: u64) {
        assert!(k >= 1, "requests are counted from 1");
        self.state().cut_before = Some(k);
    }

    /// Cuts now: every later request fails with EIO.
    pub fn cut(&self) {
        self.state().cut = true;
    }

    /// Whether the power is off.
    pub fn is_cut(&self) -> bool {
        self.state().cut
    }

    /// The mutating requests admitted so far (the one a planned cut refused is not counted).
    pub fn counts(&self) -> OpCounts {
        self.state().counts
    }

    /// Counts one mutating request; `false` when the power is (or just went) off.
    fn admit(&self, kind: OpKind) -> bool {
        let mut s = self.state();
        if s.cut {
            return false;
        }
        if s.cut_before == Some(s.counts.ops + 1) {
            s.cut = true;
            return false;
        }
        s.counts.ops += 1;
        match kind {
            OpKind::Write => s.counts.writes += 1,
            OpKind::Sync => s.counts.syncs += 1,
            OpKind::Name => s.counts.names += 1,
        }
        true
    }
}
