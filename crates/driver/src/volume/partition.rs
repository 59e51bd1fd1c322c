//! A partition's I/O: the per-member descriptors a stream reads and writes through (split,
//! rerouted around a failed member, grown, sealed and verified against its sums), and what a
//! scrub of them finds. The volume's metadata (open, create, update, repair) is the parent
//! module's job; this one only moves a partition's bytes.

use super::{Access, Result, Volume, VolumeError, io_err, limits};
use crate::direct::direct_alignment;
use crate::sums::{SUM_FAILURES, SUM_REPAIRS, SUM_UNREPAIRED, SumIo};
use penstock_core::volume::layout::ALIGN_BYTES;
use penstock_core::volume::sums::{SUM_UNIT_BYTES, SumRecord, needed_bytes};
use penstock_core::volume::{
    self, AllocError, LayoutError, MemberIndex, MemberState, Partition, PartitionMap,
    PartitionState,
};
use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A sum unit that failed its checksum on one copy (`volume scrub`, `volume check`).
#[derive(Debug, Clone)]
pub struct BadUnit {
    /// `VOLUME/PARTITION`.
    pub partition: String,
    /// The partition block it is in, and its partition offset.
    pub block: u64,
    pub offset_bytes: u64,
    pub member: MemberIndex,
    pub member_path: PathBuf,
    pub member_offset_bytes: u64,
    pub why: String,
    /// Rewritten from the other copy.
    pub repaired: bool,
    /// Another copy verifies (what a repair would copy).
    pub repairable: bool,
}

impl std::fmt::Display for BadUnit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "partition {} block {} (bytes {}..{}): member {} ({}) at offset {}: {}; {}",
            self.partition,
            self.block,
            self.offset_bytes,
            self.offset_bytes + SUM_UNIT_BYTES,
            self.member,
            self.member_path.display(),
            self.member_offset_bytes,
            self.why,
            match (self.repaired, self.repairable) {
                (true, _) => "repaired from the other copy",
                (false, true) => "the other copy is good (repairable: volume scrub)",
                (false, false) => "no good copy: these bytes are lost",
            }
        )
    }
}

/// What a scrub read and found.
#[derive(Debug, Default, Clone)]
pub struct ScrubReport {
    /// Sum units verified, over every copy, and their bytes below the partitions' sizes.
    pub units: u64,
    pub bytes: u64,
    pub bad: Vec<BadUnit>,
    /// The caller's `pace` asked to stop before the end: not everything was read.
    pub stopped: bool,
}

impl ScrubReport {
    pub fn repaired(&self) -> usize {
        self.bad.iter().filter(|b| b.repaired).count()
    }

    /// Bad units not repaired.
    pub fn left(&self) -> usize {
        self.bad.len() - self.repaired()
    }
}

/// Everything a stream needs to move one partition's bytes: a descriptor per member (sharing
/// the volume's locks), the mapping, and the alignment O_DIRECT asks for.
#[derive(Debug)]
pub struct PartitionIo {
    /// Maps partition offsets to members over the size rounded up to [`PartitionIo::align_bytes`]
    /// (the partition's blocks always hold that much), so that the last aligned piece of an
    /// O_DIRECT transfer can be mapped.
    pub map: PartitionMap,
    /// The partition's size as clients see it.
    pub size_bytes: u64,
    /// One descriptor per member, by member index.
    pub members: Vec<OwnedFd>,
    /// Every member is open with O_DIRECT.
    pub direct: bool,
    /// Offsets and lengths of member I/O are multiples of this.
    pub align_bytes: u64,
    /// `VOLUME/PARTITION`, for messages.
    pub label: String,
    /// Largest member request: what every member's block queue takes without splitting it.
    piece_bytes_max: u64,
    /// The member descriptors [`make_buffered`](Self::make_buffered) replaced: kept open
    /// because the volume's locks live on their open file descriptions.
    locked: Vec<OwnedFd>,
    /// A writer's: how the partition grows and how its size is committed. `None` for readers.
    growth: Option<Growth>,
    /// Each member's state as this stream knows it ([`MemberState`] as a number:
    /// [`STATE_OK`], [`STATE_DEGRADED`], [`STATE_REBUILDING`]); a read or write failure of a
    /// mirrored partition's member turns it degraded here at once, and in the metadata soon
    /// after ([`PartitionIo::mark_failed`]).
    states: Arc<[AtomicU8]>,
    /// Member paths, by index (to record a failure through a handle of its own).
    member_paths: Vec<PathBuf>,
    /// Threads recording failures in the metadata; joined when the stream is dropped.
    recorders: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// The members' block checksums (a volume of format version 5): every read is verified
    /// ([`verify`](Self::verify)), a writer seals what it wrote when it commits.
    sums: Option<Arc<SumIo>>,
}

const STATE_OK: u8 = 0;
const STATE_DEGRADED: u8 = 1;
const STATE_REBUILDING: u8 = 2;

fn state_code(s: MemberState) -> u8 {
    match s {
        MemberState::Ok => STATE_OK,
        MemberState::Degraded => STATE_DEGRADED,
        MemberState::Rebuilding => STATE_REBUILDING,
    }
}

/// A growing partition's writer state. Writes past the blocks' capacity allocate more blocks
/// first (one metadata update, ahead by a quarter of the capacity); the size readers see is
/// committed after the data is synced ([`PartitionIo::commit`]), so every byte a committed size
/// covers is durable.
#[derive(Debug)]
struct Growth {
    /// A handle of its own on the volume (see [`Volume::reopen_for_updates`]).
    vol: Mutex<Volume>,
    name: String,
    /// The mapping over the blocks allocated so far.
    map: Mutex<PartitionMap>,
    /// The end of the bytes written, as a partition offset.
    written_end: AtomicU64,
    /// The size last committed.
    committed: AtomicU64,
    /// Bytes were written since the last commit (a rewrite inside the size too: it still
    /// needs a new generation).
    dirty: std::sync::atomic::AtomicBool,
    /// The most bytes the partition could hold at open (capacity and free blocks).
    room_bytes: u64,
    /// Opened while `Creating` (an import): nobody reads it yet, so a write within its size
    /// needs no new generation (its creator commits `Ready` after syncing).
    creating: bool,
    /// Partition byte ranges written since the last commit, whose block checksums the next
    /// commit writes (sorted, disjoint, at most [`UNSEALED_RANGES_MAX`]).
    unsealed: Mutex<Vec<(u64, u64)>>,
}

/// Most ranges a writer keeps apart for its next seal; beyond, they merge into one (a seal
/// then reads back what lies between them too: more work, never a wrong checksum).
const UNSEALED_RANGES_MAX: usize = 64;

/// Adds `lo .. hi` to sorted, disjoint `ranges`, merging what touches.
fn add_range(ranges: &mut Vec<(u64, u64)>, lo: u64, hi: u64) {
    if hi <= lo {
        return;
    }
    ranges.push((lo, hi));
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for &(a, z) in ranges.iter() {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(z),
            _ => out.push((a, z)),
        }
    }
    if out.len() > UNSEALED_RANGES_MAX {
        let (a, z) = (out[0].0, out[out.len() - 1].1);
        out = vec![(a, z)];
    }
    *ranges = out;
}

/// Members found failed by streams of this process since it started (a metric).
pub static DEGRADED_MEMBERS: AtomicU64 = AtomicU64::new(0);

/// Growth steps: a quarter of the capacity, at least one block per member of the partition and
/// at most this by default ([`set_limits`]) (so a writer holds at most this much ahead of what
/// it wrote; the ahead part is given back when it finishes, or by `volume check --repair`
/// after a writer was killed).
pub const GROW_STEP_MAX_BYTES: u64 = 256 << 20;

fn lock_ignoring_poison<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn enospc() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOSPC)
}

impl PartitionIo {
    pub(super) fn new(vol: &Volume, p: &Partition) -> Result<PartitionIo> {
        let direct = vol.direct();
        let mut align_bytes = ALIGN_BYTES;
        let mut members = Vec::with_capacity(vol.members.len());
        for m in &vol.members {
            if direct && m.present {
                align_bytes = align_bytes.max(direct_alignment(&m.file));
            }
            let fd = m.file.try_clone().map_err(io_err(&m.path, "dup"))?;
            members.push(OwnedFd::from(fd));
        }
        if align_bytes > ALIGN_BYTES {
            return Err(VolumeError::Invalid(format!(
                "a member needs O_DIRECT alignment of {align_bytes} bytes; volumes use {ALIGN_BYTES}"
            )));
        }
        let map = PartitionMap::new(&vol.meta.layout, p)?;
        // The access the members were opened with (a mirrored volume's stand-in for a missing
        // member is read-only whatever it is: ask a present one).
        let probe = vol
            .members
            .iter()
            .find(|m| m.present)
            .unwrap_or(&vol.members[0]);
        let writable = rustix::fs::fcntl_getfl(&probe.file)
            .map(|f| f & rustix::fs::OFlags::RWMODE != rustix::fs::OFlags::RDONLY)
            .unwrap_or(false);
        let growth = if writable {
            Some(Growth {
                vol: Mutex::new(vol.reopen_for_updates()?),
                name: p.name.to_string(),
                map: Mutex::new(map.clone()),
                written_end: AtomicU64::new(0),
                committed: AtomicU64::new(p.size_bytes),
                dirty: std::sync::atomic::AtomicBool::new(false),
                room_bytes: volume::room_bytes(&vol.meta, p),
                creating: p.state == PartitionState::Creating,
                unsealed: Mutex::new(Vec::new()),
            })
        } else {
            None
        };
        let piece_bytes_max = vol
            .members
            .iter()
            .filter_map(|m| queue_request_bytes_max(&m.file))
            .min()
            .unwrap_or(u64::MAX);
        Ok(PartitionIo {
            map,
            size_bytes: p.size_bytes,
            direct,
            align_bytes: ALIGN_BYTES,
            label: format!("{}/{}", vol.meta.name, p.name),
            piece_bytes_max,
            locked: Vec::new(),
            growth,
            states: vol
                .meta
                .member_states
                .iter()
                .zip(&vol.members)
                .map(|(s, m)| {
                    AtomicU8::new(if m.present {
                        state_code(*s)
                    } else {
                        STATE_DEGRADED
                    })
                })
                .collect(),
            member_paths: vol.members.iter().map(|m| m.path.clone()).collect(),
            recorders: Mutex::new(Vec::new()),
            sums: if vol.meta.sums {
                // Read-write when the process may: a reader repairs a bad block in place.
                let fds: Vec<_> = members.iter().map(AsRawFd::as_raw_fd).collect();
                let s = SumIo::open(&vol.meta.layout, &fds, true)
                    .map_err(io_err(&vol.members[0].path, "reopen for block checksums"))?;
                Some(Arc::new(s))
            } else {
                None
            },
            members,
        })
    }

    /// Whether every block has a second copy.
    pub fn mirrored(&self) -> bool {
        self.map.mirror().is_some()
    }

    fn state(&self, member: MemberIndex) -> u8 {
        self.states
            .get(member.get())
            .map_or(STATE_DEGRADED, |s| s.load(Ordering::Acquire))
    }

    /// The pieces to read `len_bytes` at `offset_bytes` (cut as [`split`](Self::split)). A
    /// mirrored partition reads each piece from one of its two copies: not from a member
    /// that is degraded or being rebuilt, and otherwise from the one whose device is less
    /// loaded — `load(member)` is the disk queue's depth (queued and in flight) on that
    /// member's device; the pieces chosen here count too, so one chunk spreads over both.
    pub fn split_read(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        load: &mut dyn FnMut(MemberIndex) -> u64,
    ) -> Result<Vec<volume::MemberIo>, LayoutError> {
        if !self.mirrored() {
            return self.split(offset_bytes, len_bytes);
        }
        let pairs = self.map_split_copies(offset_bytes, len_bytes)?;
        let mut chosen_here = [0u64; volume::MEMBERS_MAX];
        let mut out = Vec::with_capacity(pairs.len());
        for pair in pairs {
            let copy = pair.mirror.expect("a mirrored partition's pairs");
            let a_ok = self.state(pair.primary.member) == STATE_OK;
            let b_ok = self.state(copy.member) == STATE_OK;
            let pick = match (a_ok, b_ok) {
                (true, false) => pair.primary,
                (false, true) => copy,
                // Neither is readable: try the primary; its failure ends the stream.
                (false, false) => pair.primary,
                (true, true) => {
                    let la = load(pair.primary.member) + chosen_here[pair.primary.member.get()];
                    let lb = load(copy.member) + chosen_here[copy.member.get()];
                    if lb < la { copy } else { pair.primary }
                }
            };
            chosen_here[pick.member.get()] += 1;
            out.push(pick);
        }
        Ok(self.cut(out))
    }

    /// The pieces to write `len_bytes` at `offset_bytes`: each copy's, on every member that
    /// is written (not degraded), cut as [`split`](Self::split). The same buffer range
    /// appears twice in a mirrored partition's pieces.
    pub fn split_write(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<Vec<volume::MemberIo>, LayoutError> {
        if !self.mirrored() {
            return self.split(offset_bytes, len_bytes);
        }
        let pairs = self.map_split_copies(offset_bytes, len_bytes)?;
        let mut out = Vec::with_capacity(2 * pairs.len());
        for pair in pairs {
            for p in std::iter::once(pair.primary).chain(pair.mirror) {
                if self.state(p.member) != STATE_DEGRADED {
                    out.push(p);
                }
            }
        }
        Ok(self.cut(out))
    }

    /// A mirrored partition's read of `len_bytes` at partition offset `offset_bytes` failed
    /// on the member read through `fd` (`why`): marks that member failed and returns the
    /// pieces that read the same bytes from the other copies (buffer offsets from 0 at
    /// `offset_bytes`). `None` when there is no other copy to read.
    pub fn reroute(
        &self,
        fd: std::os::fd::RawFd,
        offset_bytes: u64,
        len_bytes: u64,
        why: &str,
    ) -> Option<Vec<volume::MemberIo>> {
        if !self.mirrored() {
            return None;
        }
        let failed = self.members.iter().position(|m| m.as_raw_fd() == fd)?;
        self.mark_failed(MemberIndex::new(failed)?, why);
        let pairs = self.map_split_copies(offset_bytes, len_bytes).ok()?;
        let mut out = Vec::with_capacity(pairs.len());
        for pair in pairs {
            let copy = pair.mirror?;
            let pick = [pair.primary, copy]
                .into_iter()
                .find(|p| self.state(p.member) == STATE_OK)?;
            out.push(pick);
        }
        Some(self.cut(out))
    }

    /// Reads every copy of every byte below the size and checks it against its checksum;
    /// with `repair`, a unit that fails on one copy and verifies on another is rewritten from
    /// it (synced). Adds what it found to `report`; `pace(bytes)` is called after each chunk
    /// (up to 1 MiB of the partition) with the bytes read for it over every copy, for the
    /// caller's rate limit; when it returns `false` the scrub stops there
    /// ([`ScrubReport::stopped`]). A volume without checksums: nothing.
    pub fn scrub(
        &self,
        repair: bool,
        report: &mut ScrubReport,
        pace: &mut dyn FnMut(u64) -> bool,
    ) -> io::Result<()> {
        let Some(s) = &self.sums else {
            return Ok(());
        };
        const CHUNK_BYTES: u64 = 1 << 20;
        let unit = SUM_UNIT_BYTES;
        let size = self.size_bytes;
        let mut off = 0;
        while off < size {
            let len = (size - off).min(CHUNK_BYTES);
            let pairs = self
                .map_split_copies(off, len)
                .map_err(|e| io::Error::other(format!("{}: {e}", self.label)))?;
            let mut chunk_read = 0u64;
            for pair in pairs {
                let copies: Vec<volume::MemberIo> = std::iter::once(pair.primary)
                    .chain(pair.mirror)
                    .filter(|c| self.state(c.member) == STATE_OK)
                    .collect();
                let p0 = off + pair.primary.buf_offset_bytes;
                // Each copy's bytes and records, whole units (pieces start at a unit).
                let mut read = Vec::with_capacity(copies.len());
                chunk_read += pair.primary.len_bytes * copies.len() as u64;
                for c in &copies {
                    let n = c.len_bytes.div_ceil(unit);
                    let bytes =
                        s.read_bytes(c.member, c.member_offset_bytes, (n * unit) as usize)?;
                    let recs = s.read_records(c.member, c.member_offset_bytes, n as usize)?;
                    read.push((bytes, recs));
                }
                let n = pair.primary.len_bytes.div_ceil(unit) as usize;
                for i in 0..n {
                    let u_part = p0 + i as u64 * unit;
                    let need = needed_bytes(u_part, size);
                    if need == 0 {
                        continue;
                    }
                    let unit_of = |c: usize| {
                        let b = &read[c].0;
                        let a = (i as u64 * unit) as usize;
                        &b[a.min(b.len())..(a + unit as usize).min(b.len())]
                    };
                    let verdicts: Vec<Result<(), volume::SumFailure>> = (0..copies.len())
                        .map(|c| read[c].1[i].verify(unit_of(c), need))
                        .collect();
                    report.units += copies.len() as u64;
                    report.bytes += need as u64 * copies.len() as u64;
                    let good = verdicts.iter().position(Result::is_ok);
                    for (c, v) in verdicts.iter().enumerate() {
                        let Err(why) = v else { continue };
                        SUM_FAILURES.fetch_add(1, Ordering::Relaxed);
                        let copy = &copies[c];
                        let at = copy.member_offset_bytes + i as u64 * unit;
                        let repaired = match good {
                            Some(g) if repair && s.writable() => {
                                let (bytes, rec) = (unit_of(g).to_vec(), read[g].1[i]);
                                s.write_unit(copy.member, at, &bytes, rec)?;
                                SUM_REPAIRS.fetch_add(1, Ordering::Relaxed);
                                true
                            }
                            _ => false,
                        };
                        report.bad.push(BadUnit {
                            partition: self.label.clone(),
                            block: u_part / self.map.block_bytes(),
                            offset_bytes: u_part,
                            member: copy.member,
                            member_path: self.member_paths[copy.member.get()].clone(),
                            member_offset_bytes: at,
                            why: why.to_string(),
                            repaired,
                            repairable: good.is_some(),
                        });
                    }
                }
            }
            off += len;
            if !pace(chunk_read) && off < size {
                report.stopped = true;
                return Ok(());
            }
        }
        Ok(())
    }

    /// Member `member` failed (`why`): nothing of this stream reads or writes it from now
    /// on, and the failure is recorded in the volume's metadata by a thread of its own (a
    /// metadata update syncs every member: not work for the engine's loop).
    pub fn mark_failed(&self, member: MemberIndex, why: &str) {
        let Some(state) = self.states.get(member.get()) else {
            return;
        };
        if state.swap(STATE_DEGRADED, Ordering::AcqRel) == STATE_DEGRADED {
            return;
        }
        tracing::warn!(
            "{}: member {member} ({}) failed: {why}; reading its blocks from the mirror",
            self.label,
            self.member_paths[member.get()].display()
        );
        DEGRADED_MEMBERS.fetch_add(1, Ordering::Relaxed);
        let Some(via) = (0..self.states.len())
            .find(|&i| self.states[i].load(Ordering::Acquire) == STATE_OK)
            .map(|i| self.member_paths[i].clone())
        else {
            return;
        };
        let label = self.label.clone();
        let spawned = std::thread::Builder::new()
            .name("penstock-degrade".to_string())
            .spawn(move || {
                let r = Volume::open(&via, Access::SharedWrite).and_then(|mut v| {
                    if v.meta.member_states[member.get()] == MemberState::Degraded {
                        return Ok(());
                    }
                    v.mark_degraded(member)
                });
                if let Err(e) = r {
                    tracing::warn!("{label}: recording member {member} as degraded: {e}");
                }
            });
        if let Ok(h) = spawned {
            lock_ignoring_poison(&self.recorders).push(h);
        }
    }

    fn map_split_copies(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<Vec<volume::CopyPair>, LayoutError> {
        match &self.growth {
            Some(g) => lock_ignoring_poison(&g.map).split_copies(offset_bytes, len_bytes),
            None => self.map.split_copies(offset_bytes, len_bytes),
        }
    }

    /// Cuts pieces to what every member's queue takes whole (see [`split`](Self::split)).
    fn cut(&self, pieces: Vec<volume::MemberIo>) -> Vec<volume::MemberIo> {
        if pieces.iter().all(|p| p.len_bytes <= self.piece_bytes_max) {
            return pieces;
        }
        let mut out = Vec::with_capacity(pieces.len() * 2);
        for p in pieces {
            let mut done = 0;
            while done < p.len_bytes {
                let len = (p.len_bytes - done).min(self.piece_bytes_max);
                out.push(volume::MemberIo {
                    member: p.member,
                    member_offset_bytes: p.member_offset_bytes + done,
                    len_bytes: len,
                    buf_offset_bytes: p.buf_offset_bytes + done,
                });
                done += len;
            }
        }
        out
    }

    /// Bytes the partition's blocks hold now (a writer's grow as it writes).
    pub fn capacity_bytes(&self) -> u64 {
        match &self.growth {
            Some(g) => lock_ignoring_poison(&g.map).capacity_bytes(),
            None => self.map.capacity_bytes(),
        }
    }

    /// The most bytes this partition takes: a writer's, its blocks and the free blocks of its
    /// members (at open); a reader's, its size.
    pub fn room_bytes(&self) -> u64 {
        self.growth
            .as_ref()
            .map_or(self.size_bytes, |g| g.room_bytes)
    }

    /// The end of the bytes written through this writer (0 for a reader).
    pub fn written_end(&self) -> u64 {
        self.growth
            .as_ref()
            .map_or(0, |g| g.written_end.load(Ordering::Acquire))
    }

    /// Records that the bytes from 0 up to `end` were written (a stream's member writes,
    /// which start at offset 0).
    pub fn note_written(&self, end: u64) {
        self.note_range(0, end);
    }

    /// Records that the bytes `lo .. hi` were written: the size to commit, and the range
    /// whose block checksums the next commit writes.
    fn note_range(&self, lo: u64, hi: u64) {
        if let Some(g) = &self.growth
            && hi > lo
        {
            g.written_end.fetch_max(hi, Ordering::AcqRel);
            g.dirty.store(true, Ordering::Release);
            if self.sums.is_some() {
                add_range(&mut lock_ignoring_poison(&g.unsealed), lo, hi);
            }
        }
    }

    /// The partition ranges this writer wrote and has not sealed yet (their block checksums
    /// are written by the next commit): a reader of the same process reads them unverified
    /// (see [`verify`](Self::verify)). Empty for readers and volumes without checksums.
    pub fn unsealed(&self) -> Vec<(u64, u64)> {
        self.growth
            .as_ref()
            .map_or_else(Vec::new, |g| lock_ignoring_poison(&g.unsealed).clone())
    }

    /// Whether the volume keeps block checksums (format version 5).
    pub fn has_sums(&self) -> bool {
        self.sums.is_some()
    }

    fn has_unsealed(&self) -> bool {
        self.growth
            .as_ref()
            .is_some_and(|g| !lock_ignoring_poison(&g.unsealed).is_empty())
    }

    /// Before a write of `bufs` at `offset` that rewrites bytes below the committed size:
    /// makes what was written so far durable, then writes and syncs the records of the units
    /// the write touches below that size as their committed bytes will be after it (each
    /// unit's durable checksum kept as its older one; bytes past the size are not covered,
    /// since a later append may change them unsealed), so that a crash leaving either the old bytes or the
    /// new ones leaves a checksum that matches (an append needs none of this: it never changes
    /// the bytes a committed checksum covers). Two fdatasyncs per such write: the price of
    /// rewriting committed bytes in place.
    pub fn seal_ahead(&self, bufs: &[&[u8]], offset: u64, len: u64) -> io::Result<()> {
        let (Some(s), Some(g)) = (&self.sums, &self.growth) else {
            return Ok(());
        };
        let committed = g.committed.load(Ordering::Acquire);
        let end = offset + len;
        if offset >= committed {
            return Ok(());
        }
        let unit = SUM_UNIT_BYTES;
        let lo = offset / unit * unit;
        let hi = end.min(committed).div_ceil(unit) * unit;
        self.sync_data()?;
        let pieces = self
            .split_write(lo, hi - lo)
            .map_err(|e| io::Error::other(e.to_string()))?;
        for p in pieces {
            let n = (p.len_bytes / unit) as usize;
            let prev = s.read_records(p.member, p.member_offset_bytes, n)?;
            let mut records = Vec::with_capacity(n);
            for (k, prev) in prev.into_iter().enumerate() {
                let u_part = lo + p.buf_offset_bytes + k as u64 * unit;
                let at = p.member_offset_bytes + k as u64 * unit;
                let mut content = s.read_unit(p.member, at)?;
                content.resize(unit as usize, 0);
                // The write's bytes over the unit's.
                let (a, z) = (u_part.max(offset), (u_part + unit).min(end));
                for (i, b) in gather(bufs, a - offset, z - a)
                    .iter()
                    .scan(a - u_part, |pos, sl| {
                        let at = *pos;
                        *pos += sl.len() as u64;
                        Some((at, sl))
                    })
                {
                    let i = i as usize;
                    content[i..i + b.len()].copy_from_slice(b);
                }
                // The committed bytes only: a later write past the size into the same
                // unit is not sealed ahead (an append), so the checksum must not cover
                // what it may change (the commit after it seals the unit whole).
                let valid = (committed - u_part).min(unit) as usize;
                records.push(prev.sealed(&content[..valid]));
            }
            s.write_records(p.member, p.member_offset_bytes, &records)?;
        }
        self.sync_data()
    }

    /// Writes the block checksums of every range written since the last seal, each unit's
    /// covering its bytes below `size` (the size about to be committed), on every copy
    /// written. Not synced: the commit's fdatasync follows, before the size.
    fn seal(&self, g: &Growth, size: u64) -> io::Result<()> {
        let Some(s) = &self.sums else {
            return Ok(());
        };
        let ranges = std::mem::take(&mut *lock_ignoring_poison(&g.unsealed));
        let cap = self.capacity_bytes();
        let unit = SUM_UNIT_BYTES;
        let r = (|| -> io::Result<()> {
            for &(lo, hi) in &ranges {
                let mut at = lo / unit * unit;
                let end = hi.div_ceil(unit).saturating_mul(unit).min(cap);
                while at < end {
                    let len = (end - at).min(64 << 20);
                    let pieces = self
                        .split_write(at, len)
                        .map_err(|e| io::Error::other(e.to_string()))?;
                    for p in pieces {
                        let p0 = at + p.buf_offset_bytes;
                        let mo = p.member_offset_bytes;
                        s.seal(p.member, mo, p.len_bytes, &|u| {
                            size.saturating_sub(p0 + (u - mo))
                        })?;
                    }
                    at += len;
                }
            }
            Ok(())
        })();
        let mut u = lock_ignoring_poison(&g.unsealed);
        for (lo, hi) in ranges {
            if r.is_err() {
                add_range(&mut u, lo, hi);
            } else if hi > size {
                // Written past the size this commit covers (a writer thread beside the
                // committing one): the unit holding `size` and what follows are sealed again
                // by the next commit, for the size it covers.
                add_range(&mut u, lo.max(size / unit * unit), hi);
            }
        }
        r
    }

    /// Verifies `buf`, the partition's bytes at `offset` (read from either copy, through any
    /// pieces), against the members' block checksums, for a reader of a partition of
    /// `size_bytes` (bytes at or past it are not checked: no reader gets them). Ranges in
    /// `unverified` (a writer's of this process, not yet sealed) are not checked either.
    ///
    /// A sum unit that matches neither copy's checksum is read again from each copy; the
    /// bytes of a copy that verifies replace it in `buf` and are written over every copy that
    /// does not (repaired in place, synced; when this process may write the member), each
    /// counted ([`crate::sums::counters`]) and logged. Without a copy that verifies, the read
    /// fails with an I/O error naming the block: never wrong bytes. A volume without checksums:
    /// nothing to do.
    pub fn verify(
        &self,
        offset: u64,
        buf: &mut [u8],
        size_bytes: u64,
        unverified: &[(u64, u64)],
    ) -> io::Result<()> {
        let Some(s) = &self.sums else {
            return Ok(());
        };
        let unit = SUM_UNIT_BYTES;
        let len = (buf.len() as u64).min(size_bytes.saturating_sub(offset));
        if len == 0 {
            return Ok(());
        }
        let pairs = self
            .map_split_copies(offset, len)
            .map_err(|e| io::Error::other(format!("{}: {e}", self.label)))?;
        let mut failed = 0u64;
        let mut first_bad: Option<u64> = None;
        for pair in pairs {
            let copies: Vec<volume::MemberIo> = std::iter::once(pair.primary)
                .chain(pair.mirror)
                .filter(|c| self.state(c.member) == STATE_OK)
                .collect();
            let Some(lead) = copies.first() else {
                continue; // no readable copy: the read itself failed already
            };
            let p0 = offset + lead.buf_offset_bytes;
            let units = volume::sums::units_of(lead.member_offset_bytes, lead.len_bytes);
            let n = ((units.end - units.start) / unit) as usize;
            // Each copy's records, read when first needed.
            let mut records: Vec<Option<Vec<SumRecord>>> = vec![None; copies.len()];
            for i in 0..n {
                let u_mo = units.start + i as u64 * unit; // on the lead copy
                // Units are aligned alike on members and in the partition: never below 0.
                let u_part = (p0 + u_mo) - lead.member_offset_bytes;
                let need = needed_bytes(u_part, size_bytes);
                if need == 0
                    || unverified
                        .iter()
                        .any(|&(a, z)| a < u_part + unit && u_part < z)
                {
                    continue;
                }
                // The unit's bytes in `buf`, when it holds the whole unit.
                let b0 = u_part.checked_sub(offset);
                let whole = b0.filter(|b| b + unit <= buf.len() as u64);
                let mut ok = false;
                if let Some(b) = whole {
                    let bytes = &buf[b as usize..(b + unit) as usize];
                    for (c, copy) in copies.iter().enumerate() {
                        if records[c].is_none() {
                            let at =
                                (units.start + copy.member_offset_bytes) - lead.member_offset_bytes;
                            records[c] = Some(s.read_records(copy.member, at, n)?);
                        }
                        let rec = records[c].as_ref().expect("read above")[i];
                        if rec.verify(bytes, need).is_ok() {
                            ok = true;
                            break;
                        }
                    }
                }
                if ok {
                    continue;
                }
                // A unit only partly in `buf`, or one that failed: each copy from the disk.
                let (good, had_bad) = self.recover_unit(s, &copies, lead, u_mo, u_part, need)?;
                if had_bad {
                    failed += 1;
                    first_bad.get_or_insert(u_part);
                }
                // Copy the verified bytes over what `buf` holds of the unit.
                let (from, to) = (
                    u_part.max(offset),
                    (u_part + unit).min(offset + buf.len() as u64),
                );
                let (bf, bt) = ((from - offset) as usize, (to - offset) as usize);
                let (gf, gt) = ((from - u_part) as usize, (to - u_part) as usize);
                if gt <= good.len() {
                    buf[bf..bt].copy_from_slice(&good[gf..gt]);
                }
            }
        }
        if failed > 0 {
            let at = first_bad.unwrap_or(offset);
            tracing::warn!(
                "{}: {failed} block checksum failure(s) reading bytes {offset}..{} (first in \
                 partition block {}): read from the other copy",
                self.label,
                offset + len,
                at / self.map.block_bytes()
            );
        }
        Ok(())
    }

    /// The unit at partition offset `u_part` (at `u_mo` on the `lead` copy) read from each
    /// readable copy and checked; returns the bytes of one that verifies, after rewriting the
    /// copies that do not with them, and whether one did not. (The caller's bytes may have
    /// failed only because a writer of another process sealed the unit between its reads of
    /// the data and of the records: then every copy verifies here, and nothing is counted.)
    fn recover_unit(
        &self,
        s: &SumIo,
        copies: &[volume::MemberIo],
        lead: &volume::MemberIo,
        u_mo: u64,
        u_part: u64,
        need: usize,
    ) -> io::Result<(Vec<u8>, bool)> {
        let mut good: Option<(Vec<u8>, SumRecord)> = None;
        let mut bad: Vec<(MemberIndex, u64, String)> = Vec::new();
        for copy in copies {
            let at = (u_mo + copy.member_offset_bytes) - lead.member_offset_bytes;
            let bytes = s.read_unit(copy.member, at)?;
            let rec = s.read_records(copy.member, at, 1)?[0];
            match rec.verify(&bytes, need) {
                Ok(()) if good.is_none() => good = Some((bytes, rec)),
                Ok(()) => {}
                Err(e) => bad.push((copy.member, at, e.to_string())),
            }
        }
        let block = u_part / self.map.block_bytes();
        if !bad.is_empty() {
            SUM_FAILURES.fetch_add(1, Ordering::Relaxed);
        }
        let Some((bytes, rec)) = good else {
            let (m, at, why) =
                bad.first()
                    .cloned()
                    .unwrap_or((lead.member, u_mo, "no readable copy".into()));
            tracing::warn!(
                "{}: partition block {block} (bytes {u_part}..{}) fails its checksum on every copy: {why}",
                self.label,
                u_part + SUM_UNIT_BYTES
            );
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: block checksum failure in partition block {block} (bytes {u_part}..{}, \
                     member {m} ({}) at offset {at}): {why}; {}",
                    self.label,
                    u_part + SUM_UNIT_BYTES,
                    self.member_paths[m.get()].display(),
                    if self.mirrored() {
                        "the other copy fails too"
                    } else {
                        "no other copy"
                    }
                ),
            ));
        };
        let had_bad = !bad.is_empty();
        for (m, at, why) in bad {
            let repaired = s.writable() && s.write_unit(m, at, &bytes, rec).is_ok();
            if repaired {
                SUM_REPAIRS.fetch_add(1, Ordering::Relaxed);
            } else {
                SUM_UNREPAIRED.fetch_add(1, Ordering::Relaxed);
            }
            tracing::warn!(
                "{}: partition block {block} (bytes {u_part}..{}) on member {m} ({}) at offset \
                 {at}: {why}; {}",
                self.label,
                u_part + SUM_UNIT_BYTES,
                self.member_paths[m.get()].display(),
                if repaired {
                    "repaired from the other copy"
                } else {
                    "read from the other copy (not repaired: the member is not writable here)"
                }
            );
        }
        Ok((bytes, had_bad))
    }

    /// Makes sure the blocks hold `end` bytes, growing the partition when they do not
    /// (ENOSPC: the volume is full for this partition's placement; the partition is then as
    /// it was).
    pub fn ensure_capacity(&self, end: u64) -> io::Result<()> {
        let Some(g) = &self.growth else {
            return if end <= self.map.capacity_bytes() {
                Ok(())
            } else {
                Err(enospc())
            };
        };
        if end <= lock_ignoring_poison(&g.map).capacity_bytes() {
            return Ok(());
        }
        let mut vol = lock_ignoring_poison(&g.vol);
        let cap = lock_ignoring_poison(&g.map).capacity_bytes();
        if end <= cap {
            return Ok(());
        }
        let group = self.map.block_bytes() * self.map.members().len() as u64;
        let step_max = limits().grow_step_bytes.max(group);
        let step = (cap / 4).clamp(group, step_max);
        let ahead = end.max(cap.saturating_add(step));
        let name = g.name.as_str();
        let full = |e: &VolumeError| {
            matches!(
                e,
                VolumeError::Alloc(AllocError::Full { .. } | AllocError::TooManyExtents)
            )
        };
        let grown = match vol.update(|m| volume::grow(m, name, ahead)) {
            Err(e) if full(&e) && ahead > end => vol.update(|m| volume::grow(m, name, end)),
            r => r,
        };
        match grown {
            Ok(_) => {}
            Err(e) if full(&e) => return Err(enospc()),
            Err(e) => return Err(io::Error::other(e.to_string())),
        }
        let meta = vol.meta();
        let p = meta
            .partition(name)
            .ok_or_else(|| io::Error::other(format!("partition {name} vanished")))?;
        let map =
            PartitionMap::new(&meta.layout, p).map_err(|e| io::Error::other(e.to_string()))?;
        *lock_ignoring_poison(&g.map) = map;
        Ok(())
    }

    /// Makes every byte written so far durable and part of the partition: fdatasync the
    /// members, then commit the size (the end written before the sync, when it grew) with a
    /// new generation. A reader's: nothing to do.
    pub fn commit(&self) -> io::Result<()> {
        let Some(g) = &self.growth else {
            return Ok(());
        };
        // Taken before the sync: what the sync covers.
        let dirty = g.dirty.swap(false, Ordering::AcqRel);
        let end = g.written_end.load(Ordering::Acquire);
        let committed = |r: io::Result<()>| {
            if r.is_err() {
                g.dirty.store(true, Ordering::Release);
            }
            r
        };
        // The data first, then the block checksums of what was written (each unit's previous
        // checksum kept as its older one: it matches what was durable before this commit,
        // whichever of the two a crash leaves), then the size that makes the data readable.
        committed(self.sync_data())?;
        if self.has_unsealed() {
            committed(self.seal(g, g.committed.load(Ordering::Acquire).max(end)))?;
            committed(self.sync_data())?;
        }
        if !dirty || (g.creating && end <= g.committed.load(Ordering::Acquire)) {
            return Ok(());
        }
        let mut vol = lock_ignoring_poison(&g.vol);
        let name = g.name.as_str();
        committed(
            vol.update(|m| {
                let cur = m.partition(name).map_or(0, |p| p.size_bytes);
                volume::set_size(m, name, cur.max(end))
            })
            .map(|_| ())
            .map_err(|e| io::Error::other(e.to_string())),
        )?;
        g.committed.fetch_max(end, Ordering::AcqRel);
        Ok(())
    }

    /// [`commit`](Self::commit), then gives back the blocks grown ahead that the size (and the
    /// reservation) do not need. A writer calls it when done; dropping a writer does it too.
    pub fn finish(&self) -> io::Result<()> {
        self.commit()?;
        let Some(g) = &self.growth else {
            return Ok(());
        };
        let mut vol = lock_ignoring_poison(&g.vol);
        let name = g.name.as_str();
        let needs_trim = vol.meta().partition(name).is_some_and(|p| {
            let need = volume::layout::partition_blocks(
                p.kind,
                p.members.len(),
                p.size_bytes.max(p.reserve_bytes),
                vol.meta().layout.block_bytes(),
            );
            need.is_some_and(|n| n < volume::allocated_blocks(p))
        });
        if needs_trim {
            vol.update(|m| volume::trim(m, name))
                .map_err(|e| io::Error::other(e.to_string()))?;
            let meta = vol.meta();
            if let Some(p) = meta.partition(name)
                && let Ok(map) = PartitionMap::new(&meta.layout, p)
            {
                *lock_ignoring_poison(&g.map) = map;
            }
        }
        Ok(())
    }

    /// Reopens every member without O_DIRECT — new open file descriptions, so the volume's own
    /// descriptors keep theirs — for I/O at any offset and length through the page cache: a
    /// recording's appends, and streams whose source is not a file. Access (read, or read and
    /// write) is what the member descriptors had.
    pub fn make_buffered(&mut self) -> io::Result<()> {
        for fd in &mut self.members {
            let mode = rustix::fs::fcntl_getfl(&*fd)? & rustix::fs::OFlags::RWMODE;
            let f = OpenOptions::new()
                .read(true)
                .write(mode != rustix::fs::OFlags::RDONLY)
                .open(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
            self.locked.push(std::mem::replace(fd, OwnedFd::from(f)));
        }
        self.direct = false;
        self.align_bytes = 1;
        Ok(())
    }

    /// Writes `bufs`, one run of bytes, at partition offset `offset`, piece by piece in
    /// partition order (buffered members: see [`make_buffered`](Self::make_buffered)). Bytes past
    /// the partition's size are not written: the error is then ENOSPC. Returns the bytes written
    /// (always a prefix of the run) and the error that stopped it early, if any.
    pub fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> (u64, Option<io::Error>) {
        let total: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        if total == 0 {
            return (0, None);
        }
        // Grow first when the blocks do not hold the run (a reader's partition never grows).
        let grow_error = self
            .ensure_capacity(offset.saturating_add(total))
            .err()
            .filter(|e| e.raw_os_error() != Some(libc::ENOSPC));
        if let Some(e) = grow_error {
            return (0, Some(e));
        }
        let room = self.capacity_bytes().saturating_sub(offset);
        let len = total.min(room);
        let full = |done: u64| (done, Some(io::Error::from_raw_os_error(libc::ENOSPC)));
        if len == 0 {
            return full(0);
        }
        if let Err(e) = self.seal_ahead(bufs, offset, len) {
            return (0, Some(e));
        }
        let mut pieces = match self.split_write(offset, len) {
            Ok(p) => p,
            Err(e) => {
                return (
                    0,
                    Some(io::Error::new(io::ErrorKind::InvalidInput, e.to_string())),
                );
            }
        };
        pieces.sort_by_key(|p| p.buf_offset_bytes);
        let mirrored = self.mirrored();
        // The run's prefix every copy holds when piece `p` stopped after `wrote` bytes.
        let prefix = |p: &volume::MemberIo, wrote: u64| {
            if mirrored {
                p.buf_offset_bytes
            } else {
                p.buf_offset_bytes + wrote
            }
        };
        // Ranges (by buffer offset) whose one copy failed: the other copy must not.
        let mut one_copy_failed: Vec<u64> = Vec::new();
        for p in &pieces {
            let mut slices = gather(bufs, p.buf_offset_bytes, p.len_bytes);
            let mut slices = &mut slices[..];
            let mut at = p.member_offset_bytes;
            let mut wrote = 0u64;
            while !slices.is_empty() {
                match rustix::io::pwritev(&self.members[p.member.get()], slices, at) {
                    Ok(0) => return full(prefix(p, wrote)),
                    Ok(n) => {
                        let from = offset + p.buf_offset_bytes + wrote;
                        wrote += n as u64;
                        at += n as u64;
                        self.note_range(from, offset + p.buf_offset_bytes + wrote);
                        IoSlice::advance_slices(&mut slices, n);
                    }
                    Err(rustix::io::Errno::INTR) => {}
                    Err(e) if mirrored && !one_copy_failed.contains(&p.buf_offset_bytes) => {
                        // The other copy carries the range; this member is degraded.
                        self.mark_failed(p.member, &format!("write: {e}"));
                        one_copy_failed.push(p.buf_offset_bytes);
                        break;
                    }
                    Err(e) => return (prefix(p, wrote), Some(e.into())),
                }
            }
        }
        let done = len;
        if len < total {
            full(done)
        } else {
            (done, None)
        }
    }

    /// Another reader of the same bytes: duplicates of the member descriptors (the same open
    /// file descriptions, so it holds the volume's locks as this one does), the same mapping
    /// and size, no writer state. What a stream consumes while its opener keeps the original
    /// (an RTSP session plays its partition once per PLAY).
    pub fn try_clone_reader(&self) -> io::Result<PartitionIo> {
        let dup = |fds: &[OwnedFd]| -> io::Result<Vec<OwnedFd>> {
            fds.iter().map(OwnedFd::try_clone).collect()
        };
        Ok(PartitionIo {
            map: self.map.clone(),
            size_bytes: self.size_bytes,
            members: dup(&self.members)?,
            direct: self.direct,
            align_bytes: self.align_bytes,
            label: self.label.clone(),
            piece_bytes_max: self.piece_bytes_max,
            locked: dup(&self.locked)?,
            growth: None,
            // The same member states: a failure one reader finds, the other sees.
            states: self.states.clone(),
            member_paths: self.member_paths.clone(),
            recorders: Mutex::new(Vec::new()),
            sums: self.sums.clone(),
        })
    }

    /// Reads partition bytes at `offset` into `buf` with pread, piece by piece (buffered members
    /// only: see [`make_buffered`](Self::make_buffered)). Stops at the partition's size; returns
    /// the bytes read (0 at or past the end).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if self.direct {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "read_at needs buffered members (make_buffered)",
            ));
        }
        let len = (buf.len() as u64).min(self.size_bytes.saturating_sub(offset));
        if len == 0 {
            return Ok(0);
        }
        let pieces = self
            .split(offset, len)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        for p in pieces {
            let fd = self.members.get(p.member.get()).ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidData, "a piece on no member")
            })?;
            let (a, z) = (
                p.buf_offset_bytes as usize,
                (p.buf_offset_bytes + p.len_bytes) as usize,
            );
            let mut done = 0usize;
            while a + done < z {
                match rustix::io::pread(
                    fd,
                    &mut buf[a + done..z],
                    p.member_offset_bytes + done as u64,
                ) {
                    Ok(0) => {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("{}: a member ends inside the partition", self.label),
                        ));
                    }
                    Ok(n) => done += n,
                    Err(rustix::io::Errno::INTR) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        self.verify(offset, &mut buf[..len as usize], self.size_bytes, &[])?;
        Ok(len as usize)
    }

    /// fdatasync every member.
    pub fn sync_data(&self) -> io::Result<()> {
        for (i, m) in self.members.iter().enumerate() {
            if self.states[i].load(Ordering::Acquire) == STATE_DEGRADED {
                continue;
            }
            rustix::fs::fdatasync(m)?;
        }
        Ok(())
    }

    /// [`PartitionMap::split`], with pieces cut to what every member's queue takes whole.
    ///
    /// The kernel would split a larger request itself; we do it because a split request is
    /// charged twice by the blkio throttle (measured on loop devices: a 1 MiB O_DIRECT read from
    /// 4 KiB pool pages, more than `max_segments` = 128 pages, ran at half the throttled rate).
    pub fn split(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<Vec<volume::MemberIo>, LayoutError> {
        let pieces = match &self.growth {
            Some(g) => lock_ignoring_poison(&g.map).split(offset_bytes, len_bytes)?,
            None => self.map.split(offset_bytes, len_bytes)?,
        };
        Ok(self.cut(pieces))
    }

    /// The bytes the padding of an O_DIRECT write must carry: `out` covers partition offsets
    /// `offset .. offset + out.len()` past a write's last byte, up to the end of its last
    /// block. Below the committed size (a stream rewriting a partition with fewer bytes than
    /// it holds) they are the partition's own bytes, read from a copy in good state and
    /// verified against its checksums, so the padding rewrites them as they were; past it,
    /// zeros (no reader sees them). Buffered reads through the member's path: the stream's
    /// descriptors are O_DIRECT, whose buffers must be aligned.
    pub fn fill_kept_tail(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        out.fill(0);
        let size = match &self.growth {
            Some(g) => g.committed.load(Ordering::Acquire),
            None => self.size_bytes,
        };
        let len = (out.len() as u64).min(size.saturating_sub(offset));
        if len == 0 {
            return Ok(());
        }
        let pairs = self
            .map_split_copies(offset, len)
            .map_err(|e| io::Error::other(format!("{}: {e}", self.label)))?;
        for pair in pairs {
            let copy = std::iter::once(pair.primary)
                .chain(pair.mirror)
                .find(|c| self.state(c.member) == STATE_OK)
                .ok_or_else(|| {
                    io::Error::other(format!(
                        "{}: no copy in good state holds offset {offset}",
                        self.label
                    ))
                })?;
            let file = File::open(&self.member_paths[copy.member.get()])?;
            let (a, z) = (
                copy.buf_offset_bytes as usize,
                (copy.buf_offset_bytes + copy.len_bytes) as usize,
            );
            std::os::unix::fs::FileExt::read_exact_at(
                &file,
                &mut out[a..z],
                copy.member_offset_bytes,
            )?;
        }
        self.verify(offset, &mut out[..len as usize], size, &[])
    }
}

impl Drop for PartitionIo {
    /// A writer that was not finished commits what it wrote and gives back the blocks grown
    /// ahead (best effort: `volume check` reports leftovers as repairable).
    fn drop(&mut self) {
        // Failures found by this stream are in the metadata before it is reported done.
        for h in lock_ignoring_poison(&self.recorders).drain(..) {
            let _ = h.join();
        }
        let Some(g) = &self.growth else {
            return;
        };
        if !g.dirty.load(Ordering::Acquire) && g.written_end.load(Ordering::Acquire) == 0 {
            return;
        }
        if let Err(e) = self.finish() {
            tracing::warn!("{}: committing the partition's size: {e}", self.label);
        }
    }
}

/// The slices of `bufs` (one run of bytes) covering `len` bytes from `from`.
fn gather<'a>(bufs: &[&'a [u8]], from: u64, len: u64) -> Vec<IoSlice<'a>> {
    let (mut out, mut pos, end) = (Vec::new(), 0u64, from + len);
    for b in bufs {
        let (start, stop) = (pos, pos + b.len() as u64);
        pos = stop;
        if stop <= from || b.is_empty() {
            continue;
        }
        if start >= end {
            break;
        }
        let a = (from.max(start) - start) as usize;
        let z = (end.min(stop) - start) as usize;
        out.push(IoSlice::new(&b[a..z]));
    }
    out
}

/// For a block device: the largest request its queue takes without splitting, assuming
/// scattered 4 KiB pages: `min(max_sectors_kb, max_segments × 4 KiB)`, at least 4 KiB and a
/// multiple of it. `None` for files (their file system splits as it likes, unthrottled).
fn queue_request_bytes_max(file: &File) -> Option<u64> {
    let md = file.metadata().ok()?;
    if !md.file_type().is_block_device() {
        return None;
    }
    queue_request_bytes_max_of(
        u64::from(rustix::fs::major(md.rdev())),
        u64::from(rustix::fs::minor(md.rdev())),
    )
}

/// [`queue_request_bytes_max`] of block device `maj:min` (`None` when sysfs does not say).
pub(crate) fn queue_request_bytes_max_of(maj: u64, min: u64) -> Option<u64> {
    let read = |name: &str| -> Option<u64> {
        std::fs::read_to_string(format!("/sys/dev/block/{maj}:{min}/queue/{name}"))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    let sectors = read("max_sectors_kb").map(|kb| kb * 1024);
    let segments = read("max_segments").map(|n| n * ALIGN_BYTES);
    let max = sectors.into_iter().chain(segments).min()?;
    Some((max / ALIGN_BYTES).max(1) * ALIGN_BYTES)
}
