//! Allocation (placement policies over the free-block map) and the consistency check.
//!
//! The partition table is the authority; the free-block map is a cache of "which blocks does
//! some partition list", kept in the same checksummed image so that both change atomically.
//! That makes the map provably repairable from the table (see [`repair`]).

use std::fmt;

use super::format::{MemberState, VolumeMeta};
use super::layout::{
    Extent, LayoutError, MemberIndex, Mirror, Partition, PartitionKind, PartitionMap,
    PartitionState, partition_blocks, slot_blocks,
};
use super::{EXTENTS_MAX, Name, NameError, PARTITIONS_MAX};

/// Most problems [`check`] lists; beyond, one [`Problem::More`] says how many were left out.
pub const PROBLEMS_MAX: usize = 1000;

/// Where a new partition's blocks go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Striped over every member of the volume, in index order (ccd).
    Striped,
    /// Whole blocks on these members, in turn, in the order given (Clockwise, `--place`).
    Placed(Vec<usize>),
}

/// Why an allocation or a free was refused. The volume is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AllocError {
    #[error("partition name: {0}")]
    Name(#[from] NameError),
    #[error("a partition named {name} already exists")]
    Duplicate { name: String },
    #[error("no partition named {name}")]
    NotFound { name: String },
    #[error("no members given: --place needs at least one member")]
    NoMembers,
    #[error("member {member} is out of range: the volume has members 0 to {}", .count - 1)]
    MemberOutOfRange { member: usize, count: usize },
    #[error("member {member} given twice")]
    MemberRepeated { member: usize },
    #[error(
        "partition of {size_bytes} bytes is too large: it needs {needed_bytes} bytes \
         (whole blocks on {members} member(s)), and only {free_bytes} bytes are free for this placement"
    )]
    TooLarge {
        size_bytes: u64,
        needed_bytes: u64,
        free_bytes: u64,
        members: usize,
    },
    #[error(
        "the volume already has {PARTITIONS_MAX} partitions, the most its partition table \
         holds (a mount: files): remove one first (volume rm)"
    )]
    TooManyPartitions,
    #[error(
        "the partition table would exceed {EXTENTS_MAX} extents (runs of blocks; a partition \
         takes one per member it is on, two when mirrored, more when the free space is \
         fragmented): remove partitions, or place small ones on fewer members (--place)"
    )]
    TooManyExtents,
    #[error(
        "the volume is full: partition {name} cannot grow to {wanted_bytes} bytes \
         (it holds {capacity_bytes}; {free_bytes} bytes are free for its placement)"
    )]
    Full {
        name: String,
        wanted_bytes: u64,
        capacity_bytes: u64,
        free_bytes: u64,
    },
    #[error(
        "partition {name} has {size_bytes} bytes: truncate only shrinks a partition, not to {to_bytes}"
    )]
    TruncateGrows {
        name: String,
        size_bytes: u64,
        to_bytes: u64,
    },
    #[error("partition {name} cannot grow: {why}")]
    Inconsistent { name: String, why: String },
    #[error(
        "no member can hold the copies of partition {name}: each copy of a block must be on \
         another member in another failure domain (device) than the block, and these members \
         are on too few devices ({why})"
    )]
    NoMirror { name: String, why: String },
    #[error("partition {name}: size {size_bytes} beyond its blocks' {capacity_bytes} bytes")]
    BeyondCapacity {
        name: String,
        size_bytes: u64,
        capacity_bytes: u64,
    },
}

/// Allocates a partition of `size_bytes` called `name` (all of it reserved), in state
/// [`PartitionState::Creating`], taking the lowest free blocks of each member (so a fresh
/// volume gives one extent per member). On error `meta` is unchanged.
pub fn allocate(
    meta: &mut VolumeMeta,
    name: &str,
    size_bytes: u64,
    placement: &Placement,
) -> Result<(), AllocError> {
    allocate_with(meta, name, size_bytes, size_bytes, placement)
}

/// Allocates partition `name` of `size_bytes`, with blocks for `reserve_bytes` at least
/// (`allocate_with(meta, name, 0, 0, p)` makes an empty partition that owns no block and grows
/// as it is written, see [`grow`]). In state [`PartitionState::Creating`], generation 1. On
/// error `meta` is unchanged.
pub fn allocate_with(
    meta: &mut VolumeMeta,
    name: &str,
    size_bytes: u64,
    reserve_bytes: u64,
    placement: &Placement,
) -> Result<(), AllocError> {
    let hold_bytes = size_bytes.max(reserve_bytes);
    let name = Name::new(name)?;
    if meta.partition(name.as_str()).is_some() {
        return Err(AllocError::Duplicate {
            name: name.to_string(),
        });
    }
    if meta.partitions.len() >= PARTITIONS_MAX {
        return Err(AllocError::TooManyPartitions);
    }
    let count = meta.layout.member_count();
    let (kind, members) = match placement {
        Placement::Striped => (
            PartitionKind::Striped,
            meta.layout.members().collect::<Vec<_>>(),
        ),
        Placement::Placed(list) => {
            if list.is_empty() {
                return Err(AllocError::NoMembers);
            }
            let mut members = Vec::with_capacity(list.len());
            for (i, &m) in list.iter().enumerate() {
                if m >= count {
                    return Err(AllocError::MemberOutOfRange { member: m, count });
                }
                if list[..i].contains(&m) {
                    return Err(AllocError::MemberRepeated { member: m });
                }
                // m < count ≤ MEMBERS_MAX.
                members.push(
                    MemberIndex::new(m).ok_or(AllocError::MemberOutOfRange { member: m, count })?,
                );
            }
            (PartitionKind::Placed, members)
        }
    };
    let width = members.len();
    let block_bytes = meta.layout.block_bytes();
    let free: Vec<u64> = members
        .iter()
        .map(|m| u64::from(meta.used[m.get()].free_blocks()))
        .collect();
    let free_bytes = usable_blocks(kind, &free).saturating_mul(block_bytes);
    let too_large = |needed_bytes: u64| AllocError::TooLarge {
        size_bytes,
        needed_bytes,
        free_bytes,
        members: width,
    };
    let size_bytes_asked = size_bytes;
    let size_bytes = hold_bytes;
    let total =
        partition_blocks(kind, width, size_bytes, block_bytes).ok_or(too_large(u64::MAX))?;
    let needed_bytes = total.saturating_mul(block_bytes);
    if (0..width).any(|slot| slot_blocks(total, width, slot) > free[slot]) {
        return Err(too_large(needed_bytes));
    }
    let mirror_members = if meta.mirrored() {
        Some(
            mirror_members(meta, &members).map_err(|why| AllocError::NoMirror {
                name: name.to_string(),
                why,
            })?,
        )
    } else {
        None
    };
    // Plan on a copy, keep it only when everything fits: on any error the meta is unchanged.
    let mut planned = meta.clone();
    let extents = take_blocks(&mut planned, &members, total).ok_or(too_large(needed_bytes))?;
    let mirror = match mirror_members {
        None => None,
        Some(mm) => {
            let me = take_blocks(&mut planned, &mm, total).ok_or(too_large(needed_bytes))?;
            Some(Mirror {
                members: mm,
                extents: me,
            })
        }
    };
    let added = extents.len() + mirror.as_ref().map_or(0, |m| m.extents.len());
    if extents_total(meta) + added > EXTENTS_MAX {
        return Err(AllocError::TooManyExtents);
    }
    *meta = planned;
    let partition = Partition {
        name,
        kind,
        members,
        size_bytes: size_bytes_asked,
        reserve_bytes,
        generation: 1,
        state: PartitionState::Creating,
        extents,
        mirror,
    };
    debug_assert!(PartitionMap::new(&meta.layout, &partition).is_ok());
    meta.partitions.push(partition);
    Ok(())
}

/// Takes `total` blocks dealt round-robin over `members` (slot `j` gets
/// [`slot_blocks`]`(total, width, j)`), the lowest free blocks of each member, and marks them
/// used. `None` when a member has too few free blocks (the maps may then be half-marked: the
/// caller works on a copy).
fn take_blocks(meta: &mut VolumeMeta, members: &[MemberIndex], total: u64) -> Option<Vec<Extent>> {
    let width = members.len();
    let mut extents: Vec<Extent> = Vec::new();
    for (slot, &member) in members.iter().enumerate() {
        let want = slot_blocks(total, width, slot);
        let blocks: Vec<u32> = meta.used[member.get()]
            .free_iter()
            .take(want as usize)
            .collect();
        if (blocks.len() as u64) < want {
            return None;
        }
        for b in blocks {
            meta.used[member.get()].set(b, true);
            match extents.last_mut() {
                Some(e) if e.member == member && e.start_block + e.blocks == b => e.blocks += 1,
                _ => extents.push(Extent {
                    member,
                    start_block: b,
                    blocks: 1,
                }),
            }
        }
    }
    Some(extents)
}

/// Extents over all partitions, their mirrors' included (bounded by [`EXTENTS_MAX`]).
pub fn extents_total(meta: &VolumeMeta) -> usize {
    meta.partitions
        .iter()
        .map(|p| p.all_extents().count())
        .sum()
}

/// The members that hold the copies of a partition over `members`: slot `j`'s copy on a
/// member that is not `members[j]` and is in another failure domain
/// ([`VolumeMeta::member_domains`]). The volume's members, rotated by the smallest shift that
/// satisfies every slot (a striped partition over 4 members on 2 devices, members 0,1 on one
/// and 2,3 on the other, gets copies on 2,3,0,1). Why none exists, when none does.
pub fn mirror_members(
    meta: &VolumeMeta,
    members: &[MemberIndex],
) -> Result<Vec<MemberIndex>, String> {
    let n = meta.layout.member_count();
    let domain = |m: usize| meta.member_domains.get(m).copied().unwrap_or(0);
    for shift in 1..n {
        let cand: Vec<usize> = members.iter().map(|m| (m.get() + shift) % n).collect();
        let ok = members
            .iter()
            .zip(&cand)
            .all(|(m, &c)| domain(m.get()) != domain(c) && meta.member_states[c].writable());
        if ok {
            return Ok(cand.into_iter().filter_map(MemberIndex::new).collect());
        }
    }
    let mut domains: Vec<u64> = meta.member_domains.clone();
    domains.sort_unstable();
    domains.dedup();
    Err(format!(
        "{n} member(s) in {} failure domain(s)",
        domains.len()
    ))
}

/// Partitions that some member in `failed` (by member index, `true` = unusable) leaves
/// without a readable copy of some block: an unmirrored partition on a failed member, or a
/// mirrored one with both copies of a slot on failed members.
pub fn unreadable_partitions(meta: &VolumeMeta, failed: &[bool]) -> Vec<Name> {
    let bad = |m: &MemberIndex| failed.get(m.get()).copied().unwrap_or(true);
    meta.partitions
        .iter()
        .filter(|p| match &p.mirror {
            None => p.members.iter().any(bad),
            Some(mirror) => p
                .members
                .iter()
                .zip(&mirror.members)
                .any(|(a, b)| bad(a) && bad(b)),
        })
        .map(|p| p.name.clone())
        .collect()
}

/// Sets member `member`'s state (see [`MemberState`]). Only a mirrored volume has states
/// other than `Ok`: in an unmirrored one, a failed member is simply missing data.
pub fn set_member_state(
    meta: &mut VolumeMeta,
    member: MemberIndex,
    state: MemberState,
) -> Result<(), AllocError> {
    if !meta.mirrored() && state != MemberState::Ok {
        return Err(AllocError::Inconsistent {
            name: meta.name.to_string(),
            why: "an unmirrored volume has no member states".to_string(),
        });
    }
    let count = meta.layout.member_count();
    let s = meta
        .member_states
        .get_mut(member.get())
        .ok_or(AllocError::MemberOutOfRange {
            member: member.get(),
            count,
        })?;
    *s = state;
    Ok(())
}

/// The most blocks a partition over slots with `free` blocks each can take, dealt round-robin.
fn usable_blocks(kind: PartitionKind, free: &[u64]) -> u64 {
    let width = free.len() as u64;
    let min = free.iter().copied().min().unwrap_or(0);
    match kind {
        PartitionKind::Striped => min * width,
        // After `min` full rounds, the round continues while slots have one more block.
        PartitionKind::Placed => min * width + free.iter().take_while(|&&f| f > min).count() as u64,
    }
}

/// Blocks partition `p` owns.
pub fn allocated_blocks(p: &Partition) -> u64 {
    p.extents.iter().map(|e| u64::from(e.blocks)).sum()
}

/// Bytes partition `p`'s blocks hold: offsets below it can be written.
pub fn capacity_bytes(p: &Partition, block_bytes: u64) -> u64 {
    allocated_blocks(p).saturating_mul(block_bytes)
}

fn find_mut<'a>(meta: &'a mut VolumeMeta, name: &str) -> Result<&'a mut Partition, AllocError> {
    meta.partitions
        .iter_mut()
        .find(|p| p.name.as_str() == name)
        .ok_or_else(|| AllocError::NotFound {
            name: name.to_string(),
        })
}

/// The most bytes partition `p` can hold by growing now: its blocks' capacity and the free
/// blocks of its members, as its placement can use them.
pub fn room_bytes(meta: &VolumeMeta, p: &Partition) -> u64 {
    if p.mirror.is_some() {
        let mut copies = p.clone();
        copies.swap_mirror();
        copies.mirror = None;
        let mut own = p.clone();
        own.mirror = None;
        return room_bytes(meta, &own).min(room_bytes(meta, &copies));
    }
    let block_bytes = meta.layout.block_bytes();
    let free: Vec<u64> = p
        .members
        .iter()
        .map(|m| {
            meta.used
                .get(m.get())
                .map_or(0, |u| u64::from(u.free_blocks()))
        })
        .collect();
    let have = allocated_blocks(p);
    let width = p.members.len().max(1);
    // Continue the round-robin where it stands: with whole groups for a striped partition.
    let more = match p.kind {
        PartitionKind::Striped => free.iter().copied().min().unwrap_or(0) * width as u64,
        PartitionKind::Placed => {
            let mut free = free;
            let mut n = 0u64;
            let min = free.iter().copied().min().unwrap_or(0);
            n += min * width as u64;
            free.iter_mut().for_each(|f| *f -= min);
            let mut slot = (have % width as u64) as usize;
            while free[slot] > 0 {
                free[slot] -= 1;
                n += 1;
                slot = (slot + 1) % width;
            }
            n
        }
    };
    (have + more).saturating_mul(block_bytes)
}

/// Grows partition `name` until its blocks hold `capacity_bytes` at least, dealing new blocks
/// round-robin over its members exactly as [`allocate`] would have (so the mapping of every
/// offset already written stays the same), each the lowest free block of its member. Returns
/// the new capacity. Nothing changes when it already holds that much, or on error (the volume
/// is full for this placement, or too fragmented).
///
/// A mirrored partition's copies grow the same way, on their members; both or neither.
pub fn grow(meta: &mut VolumeMeta, name: &str, capacity_wanted: u64) -> Result<u64, AllocError> {
    let mirrored = meta.partition(name).is_some_and(|p| p.mirror.is_some());
    if !mirrored {
        return grow_one(meta, name, capacity_wanted);
    }
    let mut planned = meta.clone();
    let got = grow_one(&mut planned, name, capacity_wanted)?;
    on_mirror(&mut planned, name, |m| grow_one(m, name, capacity_wanted))?;
    *meta = planned;
    Ok(got)
}

/// Runs `f` with partition `name`'s mirror in place of its own blocks (see
/// [`Partition::swap_mirror`]), and puts them back.
fn on_mirror<T>(
    meta: &mut VolumeMeta,
    name: &str,
    f: impl FnOnce(&mut VolumeMeta) -> Result<T, AllocError>,
) -> Result<T, AllocError> {
    let swap = |meta: &mut VolumeMeta| {
        if let Some(p) = meta.partitions.iter_mut().find(|p| p.name.as_str() == name) {
            p.swap_mirror();
        }
    };
    swap(meta);
    let out = f(meta);
    swap(meta);
    out
}

/// `p` as an unmirrored partition (its own blocks only).
fn without_mirror(p: &Partition) -> Partition {
    Partition {
        mirror: None,
        ..p.clone()
    }
}

fn grow_one(meta: &mut VolumeMeta, name: &str, capacity_wanted: u64) -> Result<u64, AllocError> {
    let block_bytes = meta.layout.block_bytes();
    let i = meta.partitions.iter().position(|p| p.name.as_str() == name);
    let i = i.ok_or_else(|| AllocError::NotFound {
        name: name.to_string(),
    })?;
    let p = &meta.partitions[i];
    // Only a partition that maps can grow (one edited by hand or damaged is left to check).
    // Its own blocks only: a mirror grows after them (see `grow`).
    if let Err(e) = PartitionMap::new(&meta.layout, &without_mirror(p)) {
        return Err(AllocError::Inconsistent {
            name: name.to_string(),
            why: e.to_string(),
        });
    }
    let have = allocated_blocks(p);
    let width = p.members.len();
    let full = |free_bytes: u64| AllocError::Full {
        name: name.to_string(),
        wanted_bytes: capacity_wanted,
        capacity_bytes: have * block_bytes,
        free_bytes,
    };
    let free: Vec<u64> = p
        .members
        .iter()
        .map(|m| u64::from(meta.used[m.get()].free_blocks()))
        .collect();
    let free_bytes = usable_blocks(p.kind, &free).saturating_mul(block_bytes);
    let want = partition_blocks(p.kind, width, capacity_wanted, block_bytes)
        .ok_or_else(|| full(free_bytes))?;
    if want <= have {
        return Ok(have * block_bytes);
    }
    // Plan first: per slot, the lowest free blocks of its member.
    let mut new: Vec<(MemberIndex, Vec<u32>)> = Vec::with_capacity(width);
    for (slot, &member) in p.members.iter().enumerate() {
        let n = slot_blocks(want, width, slot) - slot_blocks(have, width, slot);
        let blocks: Vec<u32> = meta.used[member.get()]
            .free_iter()
            .take(n as usize)
            .collect();
        if (blocks.len() as u64) < n {
            return Err(full(free_bytes));
        }
        new.push((member, blocks));
    }
    let mut extents = p.extents.clone();
    for (member, blocks) in &new {
        for &b in blocks {
            let last = extents.iter().rposition(|e| e.member == *member);
            match last {
                Some(l) if extents[l].start_block + extents[l].blocks == b => {
                    extents[l].blocks += 1
                }
                _ => extents.push(Extent {
                    member: *member,
                    start_block: b,
                    blocks: 1,
                }),
            }
        }
    }
    let extents_now = extents_total(meta);
    if extents_now - meta.partitions[i].extents.len() + extents.len() > EXTENTS_MAX {
        return Err(AllocError::TooManyExtents);
    }
    for (member, blocks) in &new {
        for &b in blocks {
            meta.used[member.get()].set(b, true);
        }
    }
    meta.partitions[i].extents = extents;
    debug_assert!(PartitionMap::new(&meta.layout, &without_mirror(&meta.partitions[i])).is_ok());
    Ok(want * block_bytes)
}

/// Sets partition `name`'s size (what was written and made durable) and bumps its generation.
/// The size must be within its blocks.
pub fn set_size(meta: &mut VolumeMeta, name: &str, size_bytes: u64) -> Result<(), AllocError> {
    let block_bytes = meta.layout.block_bytes();
    let p = find_mut(meta, name)?;
    let capacity = capacity_bytes(p, block_bytes);
    if size_bytes > capacity {
        return Err(AllocError::BeyondCapacity {
            name: name.to_string(),
            size_bytes,
            capacity_bytes: capacity,
        });
    }
    p.size_bytes = size_bytes;
    p.generation = p.generation.wrapping_add(1);
    Ok(())
}

/// Gives back the blocks of partition `name` beyond what its size and reservation need (the
/// last ones dealt: every offset below the size keeps its place). Returns the blocks freed.
pub fn trim(meta: &mut VolumeMeta, name: &str) -> Result<u64, AllocError> {
    let freed = trim_one(meta, name)?;
    if meta.partition(name).is_some_and(|p| p.mirror.is_some()) {
        on_mirror(meta, name, |m| trim_one(m, name))?;
    }
    Ok(freed)
}

fn trim_one(meta: &mut VolumeMeta, name: &str) -> Result<u64, AllocError> {
    let block_bytes = meta.layout.block_bytes();
    let i = meta.partitions.iter().position(|p| p.name.as_str() == name);
    let i = i.ok_or_else(|| AllocError::NotFound {
        name: name.to_string(),
    })?;
    let p = &meta.partitions[i];
    let width = p.members.len();
    let have = allocated_blocks(p);
    let keep = partition_blocks(
        p.kind,
        width,
        p.size_bytes.max(p.reserve_bytes),
        block_bytes,
    )
    .unwrap_or(u64::MAX);
    if keep >= have {
        return Ok(0);
    }
    let mut left: Vec<u64> = (0..width).map(|s| slot_blocks(keep, width, s)).collect();
    let mut kept: Vec<Extent> = Vec::with_capacity(p.extents.len());
    let mut freed: Vec<Extent> = Vec::new();
    for e in &p.extents {
        // An extent on a member the partition does not use is left alone (check reports it).
        let Some(slot) = p.members.iter().position(|m| *m == e.member) else {
            kept.push(*e);
            continue;
        };
        let k = left[slot].min(u64::from(e.blocks)) as u32;
        left[slot] -= u64::from(k);
        if k > 0 {
            kept.push(Extent { blocks: k, ..*e });
        }
        if k < e.blocks {
            freed.push(Extent {
                member: e.member,
                start_block: e.start_block + k,
                blocks: e.blocks - k,
            });
        }
    }
    meta.partitions[i].extents = kept;
    let mut count = 0u64;
    for e in &freed {
        for b in e.start_block..e.start_block + e.blocks {
            if !listed(meta, e.member, b) {
                meta.used[e.member.get()].set(b, false);
            }
            count += 1;
        }
    }
    Ok(count)
}

/// Cuts partition `name` to `size_bytes` (at most its size), lowers its reservation to that,
/// gives back the blocks beyond it and bumps its generation. Returns the blocks freed.
pub fn truncate(meta: &mut VolumeMeta, name: &str, size_bytes: u64) -> Result<u64, AllocError> {
    let p = find_mut(meta, name)?;
    if size_bytes > p.size_bytes {
        return Err(AllocError::TruncateGrows {
            name: name.to_string(),
            size_bytes: p.size_bytes,
            to_bytes: size_bytes,
        });
    }
    p.size_bytes = size_bytes;
    p.reserve_bytes = p.reserve_bytes.min(size_bytes);
    p.generation = p.generation.wrapping_add(1);
    trim(meta, name)
}

/// Whether some partition lists block `b` of `member`.
fn listed(meta: &VolumeMeta, member: MemberIndex, b: u32) -> bool {
    meta.partitions.iter().any(|p| {
        p.all_extents()
            .any(|o| o.member == member && o.start_block <= b && b < o.start_block + o.blocks)
    })
}

/// Marks partition `name` ready: from now on it may be reported as created.
pub fn mark_ready(meta: &mut VolumeMeta, name: &str) -> Result<(), AllocError> {
    let p = meta.partitions.iter_mut().find(|p| p.name.as_str() == name);
    let p = p.ok_or_else(|| AllocError::NotFound {
        name: name.to_string(),
    })?;
    p.state = PartitionState::Ready;
    Ok(())
}

/// Removes partition `name` and frees its blocks (those no other partition also lists, so that
/// freeing never hands out a block still in use, even in an inconsistent volume).
pub fn free(meta: &mut VolumeMeta, name: &str) -> Result<(), AllocError> {
    let i = meta.partitions.iter().position(|p| p.name.as_str() == name);
    let i = i.ok_or_else(|| AllocError::NotFound {
        name: name.to_string(),
    })?;
    let gone = meta.partitions.remove(i);
    for e in gone.all_extents() {
        for b in e.start_block..e.start_block + e.blocks {
            if !listed(meta, e.member, b) {
                meta.used[e.member.get()].set(b, false);
            }
        }
    }
    Ok(())
}

/// Renames partition `from` to `to` (a new generation: its name is part of what a client
/// addressed). With `replace`, a partition already called `to` is removed first and its blocks
/// freed (POSIX `rename` over an existing file); without, that is [`AllocError::Duplicate`].
/// Renaming a partition to its own name changes nothing. On error `meta` is unchanged.
pub fn rename(
    meta: &mut VolumeMeta,
    from: &str,
    to: &str,
    replace: bool,
) -> Result<(), AllocError> {
    let new_name = Name::new(to)?;
    find_mut(meta, from)?;
    if from == to {
        return Ok(());
    }
    if meta.partition(to).is_some() {
        if !replace {
            return Err(AllocError::Duplicate {
                name: to.to_string(),
            });
        }
        free(meta, to)?;
    }
    let p = find_mut(meta, from)?;
    p.name = new_name;
    p.generation = p.generation.wrapping_add(1);
    Ok(())
}

/// One inconsistency found by [`check`]. Block problems are reported as runs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// Two partitions share a name; lookups by name are ambiguous.
    DuplicateName { name: Name },
    /// The partition's members, extents and size disagree; it cannot be mapped.
    BadPartition { error: LayoutError },
    /// A block listed by more than one partition: writes to one corrupt the other.
    SharedBlocks {
        member: MemberIndex,
        start_block: u32,
        blocks: u32,
        first: Name,
        second: Name,
    },
    /// Blocks a partition lists but the map says free: the next allocation would reuse them.
    /// Repairable: mark them used (the table is the authority).
    OwnedButFree {
        member: MemberIndex,
        start_block: u32,
        blocks: u32,
        partition: Name,
    },
    /// Blocks marked used that no partition lists (a leak). Repairable: provably free.
    Leaked {
        member: MemberIndex,
        start_block: u32,
        blocks: u32,
    },
    /// A partition still `Creating`: its add-partition or import was interrupted and never
    /// reported success. Repairable: remove it and free its blocks.
    Interrupted { partition: Name },
    /// Blocks a partition holds beyond what its committed size and reservation need: grown
    /// ahead by a writer that was killed before it gave them back (a running writer holds
    /// some too). Repairable (with no writer left: `--repair` takes the volume exclusively):
    /// give back the last ones dealt, as a finishing writer does; no byte of the size moves.
    AllocatedPastEnd { partition: Name, blocks: u64 },
    /// More problems than [`PROBLEMS_MAX`]; this many were left out.
    More { omitted: usize },
}

impl Problem {
    /// Whether [`repair`] fixes this problem without any risk to data that was reported written.
    pub fn repairable(&self) -> bool {
        matches!(
            self,
            Problem::OwnedButFree { .. }
                | Problem::Leaked { .. }
                | Problem::Interrupted { .. }
                | Problem::AllocatedPastEnd { .. }
        )
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::DuplicateName { name } => write!(f, "two partitions are named {name}"),
            Problem::BadPartition { error } => write!(f, "{error}"),
            Problem::SharedBlocks {
                member,
                start_block,
                blocks,
                first,
                second,
            } if first == second => write!(
                f,
                "member {member} blocks {start_block}..{}: listed twice by {first}",
                start_block + blocks
            ),
            Problem::SharedBlocks {
                member,
                start_block,
                blocks,
                first,
                second,
            } => write!(
                f,
                "member {member} blocks {start_block}..{}: listed by both {first} and {second}",
                start_block + blocks
            ),
            Problem::OwnedButFree {
                member,
                start_block,
                blocks,
                partition,
            } => write!(
                f,
                "member {member} blocks {start_block}..{}: used by {partition} but marked free (repairable)",
                start_block + blocks
            ),
            Problem::Leaked {
                member,
                start_block,
                blocks,
            } => write!(
                f,
                "member {member} blocks {start_block}..{}: marked used but owned by no partition (repairable)",
                start_block + blocks
            ),
            Problem::Interrupted { partition } => {
                write!(
                    f,
                    "partition {partition} was never completed (interrupted create; repairable: removed)"
                )
            }
            Problem::AllocatedPastEnd { partition, blocks } => write!(
                f,
                "partition {partition}: {blocks} block(s) allocated past the end, reclaimable (grown ahead by a writer that did not finish; repairable)"
            ),
            Problem::More { omitted } => write!(f, "... and {omitted} more problems"),
        }
    }
}

const NO_OWNER: u16 = u16::MAX;
// A partition index always fits below NO_OWNER.
const _: () = assert!(PARTITIONS_MAX < NO_OWNER as usize);

/// Checks the partition table against itself and the free-block map: every listed block is
/// owned by exactly one partition and marked used, no used block is unowned, every partition's
/// size matches its blocks, names are unique, no partition is left `Creating`.
pub fn check(meta: &VolumeMeta) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut omitted = 0usize;
    let mut report = |p: Problem, problems: &mut Vec<Problem>| {
        if problems.len() < PROBLEMS_MAX {
            problems.push(p)
        } else {
            omitted += 1
        }
    };
    // How many partitions carry each name (a hash map: a table holds up to PARTITIONS_MAX).
    let mut named: std::collections::HashMap<&str, usize> =
        std::collections::HashMap::with_capacity(meta.partitions.len());
    for p in &meta.partitions {
        *named.entry(p.name.as_str()).or_default() += 1;
    }
    let mut seen: std::collections::HashSet<&str> =
        std::collections::HashSet::with_capacity(meta.partitions.len());
    for p in &meta.partitions {
        let unique = named.get(p.name.as_str()) == Some(&1);
        if !seen.insert(p.name.as_str()) {
            report(
                Problem::DuplicateName {
                    name: p.name.clone(),
                },
                &mut problems,
            );
        }
        let mappable = PartitionMap::new(&meta.layout, p);
        let mappable_ok = mappable.is_ok();
        if let Err(error) = mappable {
            report(Problem::BadPartition { error }, &mut problems);
        } else if p.mirror.is_some() != meta.mirrored() {
            let why = if meta.mirrored() {
                "no mirror in a mirrored volume"
            } else {
                "a mirror in an unmirrored volume"
            };
            let error = LayoutError::Partition {
                name: p.name.to_string(),
                why: why.to_string(),
            };
            report(Problem::BadPartition { error }, &mut problems);
        }
        if p.state == PartitionState::Creating {
            report(
                Problem::Interrupted {
                    partition: p.name.clone(),
                },
                &mut problems,
            );
        } else if let Some(blocks) = past_end_blocks(meta, p).filter(|_| unique && mappable_ok) {
            // Only for a partition its name designates and that maps: repair gives the blocks
            // back by name (trim), and a duplicate name or a bad map is a human's problem
            // already.
            report(
                Problem::AllocatedPastEnd {
                    partition: p.name.clone(),
                    blocks,
                },
                &mut problems,
            );
        }
    }
    // Owner of every block (partition index), member by member; PARTITIONS_MAX < NO_OWNER.
    for member in meta.layout.members() {
        let map = &meta.used[member.get()];
        let mut owner = vec![NO_OWNER; map.blocks() as usize];
        let mut shared: Vec<(u32, u16, u16)> = Vec::new();
        for (pi, p) in meta.partitions.iter().enumerate() {
            for e in p.all_extents().filter(|e| e.member == member) {
                // decode() and allocate() keep extents within the member's blocks; an extent
                // built by hand that is not is reported by PartitionMap::new above.
                let end = (e.start_block.saturating_add(e.blocks)).min(map.blocks());
                for b in e.start_block.min(end)..end {
                    let o = &mut owner[b as usize];
                    if *o == NO_OWNER {
                        *o = pi as u16;
                    } else {
                        // Another partition's, or this one's twice (two of its offsets would
                        // land on one place).
                        shared.push((b, *o, pi as u16));
                    }
                }
            }
        }
        for run in runs(shared.iter().map(|&(b, x, y)| (b, (x, y)))) {
            let (start_block, blocks, (x, y)) = run;
            let (first, second) = (
                meta.partitions[x as usize].name.clone(),
                meta.partitions[y as usize].name.clone(),
            );
            report(
                Problem::SharedBlocks {
                    member,
                    start_block,
                    blocks,
                    first,
                    second,
                },
                &mut problems,
            );
        }
        let owned_free =
            (0..map.blocks()).filter(|&b| owner[b as usize] != NO_OWNER && !map.is_used(b));
        for (start_block, blocks, pi) in runs(owned_free.map(|b| (b, owner[b as usize]))) {
            let partition = meta.partitions[pi as usize].name.clone();
            report(
                Problem::OwnedButFree {
                    member,
                    start_block,
                    blocks,
                    partition,
                },
                &mut problems,
            );
        }
        let leaked = (0..map.blocks()).filter(|&b| owner[b as usize] == NO_OWNER && map.is_used(b));
        for (start_block, blocks, ()) in runs(leaked.map(|b| (b, ()))) {
            report(
                Problem::Leaked {
                    member,
                    start_block,
                    blocks,
                },
                &mut problems,
            );
        }
    }
    if omitted > 0 {
        problems.push(Problem::More { omitted });
    }
    problems
}

/// The blocks partition `p` holds beyond what its size and reservation need (`None`: none).
fn past_end_blocks(meta: &VolumeMeta, p: &Partition) -> Option<u64> {
    let keep = partition_blocks(
        p.kind,
        p.members.len(),
        p.size_bytes.max(p.reserve_bytes),
        meta.layout.block_bytes(),
    )?;
    allocated_blocks(p).checked_sub(keep).filter(|&n| n > 0)
}

/// Groups ascending `(block, tag)` pairs into runs of consecutive blocks with equal tags.
fn runs<T: PartialEq + Copy>(items: impl Iterator<Item = (u32, T)>) -> Vec<(u32, u32, T)> {
    let mut out: Vec<(u32, u32, T)> = Vec::new();
    for (b, t) in items {
        match out.last_mut() {
            Some((start, len, tag)) if *tag == t && *start + *len == b => *len += 1,
            _ => out.push((b, 1, t)),
        }
    }
    out
}

/// Fixes what can be proven: removes partitions left `Creating` (never reported created), gives
/// back the blocks of the others beyond their size and reservation ([`trim`]), then rebuilds
/// every free-block map from the partition table (a block is used iff some partition
/// lists it), which fixes leaks and owned-but-free blocks and never frees a listed block.
/// Returns the repairable problems found before; what [`check`] still reports afterwards needs
/// a human.
pub fn repair(meta: &mut VolumeMeta) -> Vec<Problem> {
    let fixed: Vec<Problem> = check(meta)
        .into_iter()
        .filter(Problem::repairable)
        .collect();
    meta.partitions
        .retain(|p| p.state != PartitionState::Creating);
    let past_end: Vec<String> = fixed
        .iter()
        .filter_map(|p| match p {
            Problem::AllocatedPastEnd { partition, .. } => Some(partition.to_string()),
            _ => None,
        })
        .collect();
    for name in past_end {
        // Found by check just above (a unique, mappable partition); a name now missing is
        // nothing left to give back.
        let _ = trim(meta, &name);
    }
    for member in meta.layout.members() {
        let map = &mut meta.used[member.get()];
        for b in 0..map.blocks() {
            map.set(b, false);
        }
        for e in meta
            .partitions
            .iter()
            .flat_map(|p| p.all_extents())
            .filter(|e| e.member == member)
        {
            let end = e.start_block.saturating_add(e.blocks).min(map.blocks());
            for b in e.start_block.min(end)..end {
                map.set(b, true);
            }
        }
    }
    fixed
}
