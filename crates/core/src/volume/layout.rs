//! Where a partition's bytes live: partition offset → (member, member byte offset).
//!
//! A member's space is a metadata area ([`super::format::META_AREA_BYTES`]) followed by data
//! blocks of `block_bytes` each. A partition owns a list of blocks, kept per member as
//! [`Extent`]s. Its blocks are dealt round-robin over its members: partition block `i` is on
//! member slot `i % M` (M = the partition's member count), and it is the `i / M`-th block that
//! the partition owns on that member.
//!
//! Inside a *group* of M consecutive partition blocks (one per member), a striped partition
//! deals stripe units round-robin exactly like ccd: unit `k` of the group is on slot `k % M`,
//! at unit row `k / M` of that member's block. A placed partition uses the whole block as its
//! unit, so each block is one contiguous run on one member, as in Clockwise. One formula serves
//! both kinds (a placed partition is a striped one whose stripe unit is the block); see
//! [`PartitionMap::locate`].

use super::format::META_AREA_BYTES;
use super::{BLOCKS_PER_MEMBER_MAX, MEMBERS_MAX, Name};

/// The alignment O_DIRECT needs, and that every size and offset in the layout respects.
pub const ALIGN_BYTES: u64 = 4096;
/// Default stripe unit (ccd's interleave): large enough that one member transfer amortises a
/// seek, small enough that a 1 MiB request reaches many members.
pub const STRIPE_UNIT_BYTES_DEFAULT: u64 = 64 << 10;
/// Default block size: Clockwise's 1 MB allocation unit.
pub const BLOCK_BYTES_DEFAULT: u64 = 1 << 20;
/// Largest block: bounds the waste of rounding a partition up to whole blocks.
pub const BLOCK_BYTES_MAX: u64 = 1 << 30;
/// Largest request [`PartitionMap::split`] accepts: bounds the pieces returned.
pub const REQUEST_BYTES_MAX: u64 = 1 << 30;

/// The position of a member in its volume, `0..member_count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MemberIndex(u8);

impl MemberIndex {
    /// `Some` when `index < MEMBERS_MAX`.
    pub fn new(index: usize) -> Option<MemberIndex> {
        if index < MEMBERS_MAX {
            // MEMBERS_MAX ≤ 256, so the index fits in a u8.
            Some(MemberIndex(index as u8))
        } else {
            None
        }
    }

    /// The index as a number.
    pub fn get(self) -> usize {
        usize::from(self.0)
    }
}

impl std::fmt::Display for MemberIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Why a layout, a partition or a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    #[error("a volume needs at least one member")]
    NoMembers,
    #[error("{count} members: a volume has at most {MEMBERS_MAX}")]
    TooManyMembers { count: usize },
    #[error(
        "stripe unit of {stripe_unit_bytes} bytes: must be a power of two and a multiple of {ALIGN_BYTES}"
    )]
    StripeUnit { stripe_unit_bytes: u64 },
    #[error(
        "block of {block_bytes} bytes: must be a multiple of the stripe unit ({stripe_unit_bytes} bytes) \
         and at most {BLOCK_BYTES_MAX}"
    )]
    BlockSize {
        block_bytes: u64,
        stripe_unit_bytes: u64,
    },
    #[error(
        "data area start {data_start_bytes}: must be ≥ {META_AREA_BYTES} and a multiple of {ALIGN_BYTES}"
    )]
    DataStart { data_start_bytes: u64 },
    #[error(
        "member {member} has {size_bytes} bytes: too small, a member needs at least {min_bytes} \
         (the metadata area and one block)"
    )]
    MemberTooSmall {
        member: usize,
        size_bytes: u64,
        min_bytes: u64,
    },
    #[error("partition {name}: {why}")]
    Partition { name: String, why: String },
    #[error(
        "request of {len_bytes} bytes at {offset_bytes} is outside the partition's {size_bytes} bytes"
    )]
    OutOfRange {
        offset_bytes: u64,
        len_bytes: u64,
        size_bytes: u64,
    },
    #[error("request of {len_bytes} bytes: at most {REQUEST_BYTES_MAX} per request")]
    RequestTooLarge { len_bytes: u64 },
}

/// The geometry of a volume: member sizes, stripe unit, block size, where data starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeLayout {
    member_sizes_bytes: Vec<u64>,
    stripe_unit_bytes: u64,
    block_bytes: u64,
    data_start_bytes: u64,
}

impl VolumeLayout {
    /// A layout for members of the given sizes, with data starting right after the metadata
    /// area.
    pub fn new(
        member_sizes_bytes: Vec<u64>,
        stripe_unit_bytes: u64,
        block_bytes: u64,
    ) -> Result<VolumeLayout, LayoutError> {
        VolumeLayout::with_data_start(
            member_sizes_bytes,
            stripe_unit_bytes,
            block_bytes,
            META_AREA_BYTES,
        )
    }

    /// As [`VolumeLayout::new`] with an explicit data area start (as recorded in a superblock).
    pub fn with_data_start(
        member_sizes_bytes: Vec<u64>,
        stripe_unit_bytes: u64,
        block_bytes: u64,
        data_start_bytes: u64,
    ) -> Result<VolumeLayout, LayoutError> {
        if member_sizes_bytes.is_empty() {
            return Err(LayoutError::NoMembers);
        }
        if member_sizes_bytes.len() > MEMBERS_MAX {
            return Err(LayoutError::TooManyMembers {
                count: member_sizes_bytes.len(),
            });
        }
        // Masks, not `%`: both divisors are powers of two (ALIGN_BYTES by definition, the stripe
        // unit once the first test passes).
        if !stripe_unit_bytes.is_power_of_two() || stripe_unit_bytes & (ALIGN_BYTES - 1) != 0 {
            return Err(LayoutError::StripeUnit { stripe_unit_bytes });
        }
        if block_bytes == 0
            || block_bytes & (stripe_unit_bytes - 1) != 0
            || block_bytes > BLOCK_BYTES_MAX
        {
            return Err(LayoutError::BlockSize {
                block_bytes,
                stripe_unit_bytes,
            });
        }
        if data_start_bytes < META_AREA_BYTES
            || data_start_bytes & (ALIGN_BYTES - 1) != 0
            || data_start_bytes > (1 << 40)
        {
            return Err(LayoutError::DataStart { data_start_bytes });
        }
        let min_bytes = data_start_bytes + block_bytes;
        for (member, &size_bytes) in member_sizes_bytes.iter().enumerate() {
            if size_bytes < min_bytes {
                return Err(LayoutError::MemberTooSmall {
                    member,
                    size_bytes,
                    min_bytes,
                });
            }
        }
        Ok(VolumeLayout {
            member_sizes_bytes,
            stripe_unit_bytes,
            block_bytes,
            data_start_bytes,
        })
    }

    /// Number of members.
    pub fn member_count(&self) -> usize {
        self.member_sizes_bytes.len()
    }

    /// Every member's size, by index.
    pub fn member_sizes_bytes(&self) -> &[u64] {
        &self.member_sizes_bytes
    }

    /// The stripe unit of striped partitions.
    pub fn stripe_unit_bytes(&self) -> u64 {
        self.stripe_unit_bytes
    }

    /// The allocation unit.
    pub fn block_bytes(&self) -> u64 {
        self.block_bytes
    }

    /// Where block 0 starts on every member.
    pub fn data_start_bytes(&self) -> u64 {
        self.data_start_bytes
    }

    /// Smallest member size this layout accepts: the data start and one block.
    pub fn member_size_min_bytes(&self) -> u64 {
        self.data_start_bytes + self.block_bytes
    }

    /// Data blocks usable on `member`: whole blocks after the data start, at most
    /// [`BLOCKS_PER_MEMBER_MAX`]. Panics when `member` is not in the volume (a caller bug).
    pub fn member_blocks(&self, member: MemberIndex) -> u32 {
        let size = self.member_sizes_bytes[member.get()];
        let blocks = (size - self.data_start_bytes) / self.block_bytes;
        blocks.min(u64::from(BLOCKS_PER_MEMBER_MAX)) as u32
    }

    /// The member byte offset of the start of `block`.
    pub fn block_offset_bytes(&self, block: u32) -> u64 {
        self.data_start_bytes + u64::from(block) * self.block_bytes
    }

    /// Every member index of this volume.
    pub fn members(&self) -> impl Iterator<Item = MemberIndex> + '_ {
        // member_count ≤ MEMBERS_MAX, checked at construction.
        (0..self.member_count()).filter_map(MemberIndex::new)
    }
}

/// How a partition spreads over its members.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PartitionKind {
    /// ccd: consecutive stripe units on consecutive members.
    Striped,
    /// Clockwise: whole blocks on the members the application chose, in turn.
    Placed,
}

/// Whether a partition was reported created.
///
/// An add-partition first persists the partition as `Creating`, then (after the data, for an
/// import) as `Ready`, and only then reports success. After a crash a `Creating` partition is
/// provably one that nobody was told exists, so `volume check --repair` may free it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PartitionState {
    Creating,
    Ready,
}

/// `blocks` consecutive blocks starting at `start_block` on `member`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Extent {
    pub member: MemberIndex,
    pub start_block: u32,
    pub blocks: u32,
}

/// A partition table entry. Plain data: [`PartitionMap::new`] and [`super::check`] say whether
/// it is consistent.
///
/// `extents` lists the blocks the partition owns; the blocks on one member are taken in the
/// order of that member's extents (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    pub name: Name,
    pub kind: PartitionKind,
    /// The members, in slot order: partition block `i` is on `members[i % members.len()]`.
    pub members: Vec<MemberIndex>,
    /// The size clients see: the bytes written so far (or given at creation). The blocks hold
    /// at least this much; usually more (rounding up, a reservation, growth ahead).
    pub size_bytes: u64,
    /// Bytes kept allocated even while the partition is smaller (`--size` of add-partition):
    /// trimming after a write never goes below it. 0: grow only as written.
    pub reserve_bytes: u64,
    /// Bumped by every change of the partition's size or bytes made through penstock (a write
    /// that was committed, a truncate): the HTTP `ETag` of the partition.
    pub generation: u64,
    pub state: PartitionState,
    pub extents: Vec<Extent>,
    /// The second copy of every block, in a mirrored volume (`volume create --mirror 2`);
    /// `None` in an unmirrored one.
    pub mirror: Option<Mirror>,
}

/// Where a mirrored partition's second copies live: the same dealing as the partition's own
/// blocks (same kind, width and block count, so partition block `i` is on slot `i % M` in
/// both), over other members. Slot `j`'s copy is never on the member of slot `j` (and
/// allocation puts it in another failure domain, see [`super::format::VolumeMeta::member_domains`]),
/// so losing one member loses one copy of each of its blocks, never both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mirror {
    /// The members of the copies, in slot order.
    pub members: Vec<MemberIndex>,
    /// The copies' blocks, per member in slot order (as [`Partition::extents`]).
    pub extents: Vec<Extent>,
}

impl Partition {
    /// The partition with its mirror's members and extents in place of its own (and its own
    /// as the mirror): every rule for a partition's blocks then applies to the copies.
    pub fn swap_mirror(&mut self) {
        if let Some(m) = &mut self.mirror {
            std::mem::swap(&mut self.members, &mut m.members);
            std::mem::swap(&mut self.extents, &mut m.extents);
        }
    }

    /// Every extent the partition owns: its own, then its mirror's.
    pub fn all_extents(&self) -> impl Iterator<Item = &Extent> + '_ {
        self.extents
            .iter()
            .chain(self.mirror.iter().flat_map(|m| m.extents.iter()))
    }
}

/// Blocks a partition of `size_bytes` needs: whole blocks for a placed partition, whole groups
/// of `width` blocks for a striped one (a group is striped across all its members, so it is
/// only usable whole). `None` on overflow.
pub fn partition_blocks(
    kind: PartitionKind,
    width: usize,
    size_bytes: u64,
    block_bytes: u64,
) -> Option<u64> {
    let width = width as u64;
    match kind {
        PartitionKind::Placed => Some(size_bytes.div_ceil(block_bytes)),
        PartitionKind::Striped => {
            let group_bytes = width.checked_mul(block_bytes)?;
            size_bytes.div_ceil(group_bytes).checked_mul(width)
        }
    }
}

/// Of `total_blocks` dealt round-robin over `width` slots, how many land on slot `slot`.
pub fn slot_blocks(total_blocks: u64, width: usize, slot: usize) -> u64 {
    let width = width as u64;
    total_blocks / width + u64::from((slot as u64) < total_blocks % width)
}

/// A contiguous byte range on one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberLocation {
    pub member: MemberIndex,
    pub member_offset_bytes: u64,
}

/// One member's share of a request: `len_bytes` at `member_offset_bytes` on `member`, to or
/// from `buf_offset_bytes` in the caller's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberIo {
    pub member: MemberIndex,
    pub member_offset_bytes: u64,
    pub len_bytes: u64,
    pub buf_offset_bytes: u64,
}

/// The blocks one member slot owns, as runs with prefix counts for binary search.
#[derive(Debug, Clone)]
struct SlotRuns {
    /// `first[i]` = slot blocks before run `i`.
    first: Vec<u64>,
    runs: Vec<(u32, u32)>,
}

impl SlotRuns {
    /// The member block holding the slot's `nth` block. The caller guarantees `nth` is below
    /// the slot's block count (checked in `PartitionMap::new`).
    fn block(&self, nth: u64) -> u32 {
        let i = self.first.partition_point(|&f| f <= nth) - 1;
        let (start, _) = self.runs[i];
        start + (nth - self.first[i]) as u32
    }
}

/// A validated partition, ready to map offsets. Built once per open partition.
#[derive(Debug, Clone)]
pub struct PartitionMap {
    size_bytes: u64,
    /// Bytes the partition's blocks hold: offsets below it map (writes may go there).
    capacity_bytes: u64,
    /// Stripe unit for striped partitions, the block for placed ones.
    unit_bytes: u64,
    block_bytes: u64,
    data_start_bytes: u64,
    members: Vec<MemberIndex>,
    slots: Vec<SlotRuns>,
    /// A mirrored partition's copies (a map of the same shape over other members).
    mirror: Option<Box<PartitionMap>>,
}

/// One piece of a request on a mirrored partition: the same bytes on two members.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyPair {
    pub primary: MemberIo,
    /// `None` for an unmirrored partition.
    pub mirror: Option<MemberIo>,
}

impl PartitionMap {
    /// Checks that `partition` is consistent with `layout` (members in range and distinct,
    /// extents within their members, on members of the partition, its blocks dealt round-robin
    /// over its members — whole groups for a striped one — and at least as many as its size
    /// needs) and prepares the mapping. Offsets up to the blocks' capacity map, so that a
    /// growing partition's writer can write ahead of the committed size.
    pub fn new(layout: &VolumeLayout, partition: &Partition) -> Result<PartitionMap, LayoutError> {
        let bad = |why: String| LayoutError::Partition {
            name: partition.name.to_string(),
            why,
        };
        let width = partition.members.len();
        if width == 0 || width > layout.member_count() {
            return Err(bad(format!(
                "{width} members; the volume has {}",
                layout.member_count()
            )));
        }
        for (i, m) in partition.members.iter().enumerate() {
            if m.get() >= layout.member_count() {
                return Err(bad(format!("member {m} is not in the volume")));
            }
            if partition.members[..i].contains(m) {
                return Err(bad(format!("member {m} listed twice")));
            }
        }
        let need = partition_blocks(
            partition.kind,
            width,
            partition.size_bytes,
            layout.block_bytes,
        )
        .ok_or_else(|| bad("size overflows".to_string()))?;
        let total: u64 = partition.extents.iter().map(|e| u64::from(e.blocks)).sum();
        if total < need {
            return Err(bad(format!(
                "{total} blocks; its size of {} bytes needs {need}",
                partition.size_bytes
            )));
        }
        if partition.kind == PartitionKind::Striped && !total.is_multiple_of(width as u64) {
            return Err(bad(format!(
                "striped over {width} members with {total} blocks (not whole groups)"
            )));
        }
        let mut slots = Vec::with_capacity(width);
        for (slot, &member) in partition.members.iter().enumerate() {
            let member_blocks = layout.member_blocks(member);
            let mut runs = SlotRuns {
                first: Vec::new(),
                runs: Vec::new(),
            };
            let mut count: u64 = 0;
            for e in partition.extents.iter().filter(|e| e.member == member) {
                let end = u64::from(e.start_block) + u64::from(e.blocks);
                if e.blocks == 0 || end > u64::from(member_blocks) {
                    return Err(bad(format!(
                        "extent {}+{} on member {member} outside its {member_blocks} blocks",
                        e.start_block, e.blocks
                    )));
                }
                runs.first.push(count);
                runs.runs.push((e.start_block, e.blocks));
                count += u64::from(e.blocks);
            }
            let want = slot_blocks(total, width, slot);
            if count != want {
                return Err(bad(format!(
                    "{count} blocks on member {member}; {total} blocks dealt over {width} members put {want} there"
                )));
            }
            slots.push(runs);
        }
        if let Some(e) = partition
            .extents
            .iter()
            .find(|e| !partition.members.contains(&e.member))
        {
            return Err(bad(format!(
                "extent on member {}, which the partition does not use",
                e.member
            )));
        }
        let unit_bytes = match partition.kind {
            PartitionKind::Striped => layout.stripe_unit_bytes,
            PartitionKind::Placed => layout.block_bytes,
        };
        let mirror = match &partition.mirror {
            None => None,
            Some(m) => {
                if m.members.len() != width {
                    return Err(bad(format!(
                        "mirror over {} members, the partition over {width}",
                        m.members.len()
                    )));
                }
                if let Some(j) = (0..width).find(|&j| m.members[j] == partition.members[j]) {
                    return Err(bad(format!(
                        "slot {j}'s copy is on its own member {}",
                        m.members[j]
                    )));
                }
                let shadow = Partition {
                    members: m.members.clone(),
                    extents: m.extents.clone(),
                    mirror: None,
                    ..partition.clone()
                };
                let map =
                    PartitionMap::new(layout, &shadow).map_err(|e| bad(format!("mirror: {e}")))?;
                if map.capacity_bytes != total * layout.block_bytes {
                    return Err(bad(format!(
                        "mirror holds {} bytes, the partition {}",
                        map.capacity_bytes,
                        total * layout.block_bytes
                    )));
                }
                Some(Box::new(map))
            }
        };
        Ok(PartitionMap {
            size_bytes: partition.size_bytes,
            capacity_bytes: total * layout.block_bytes,
            unit_bytes,
            block_bytes: layout.block_bytes,
            data_start_bytes: layout.data_start_bytes,
            members: partition.members.clone(),
            slots,
            mirror,
        })
    }

    /// The map of a mirrored partition's copies.
    pub fn mirror(&self) -> Option<&PartitionMap> {
        self.mirror.as_deref()
    }

    /// As [`PartitionMap::split`], each piece with where its copy is (mirrored partitions):
    /// pieces are cut where either copy stops being contiguous, so that each piece can be
    /// read whole from either member.
    pub fn split_copies(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<Vec<CopyPair>, LayoutError> {
        let Some(mirror) = &self.mirror else {
            return Ok(self
                .split(offset_bytes, len_bytes)?
                .into_iter()
                .map(|primary| CopyPair {
                    primary,
                    mirror: None,
                })
                .collect());
        };
        // Both maps cut at the same unit boundaries (same kind, unit and width): a run of one
        // unit is contiguous on both; runs merge while both stay contiguous.
        let primary = self.split(offset_bytes, len_bytes)?;
        let mut out: Vec<CopyPair> = Vec::with_capacity(primary.len());
        let mut done: u64 = 0;
        while done < len_bytes {
            let at = offset_bytes + done;
            let p = self.locate(at)?;
            let m = mirror.locate(at)?;
            let piece_bytes = self.run_bytes(at).min(len_bytes - done);
            let merged = out.last_mut().is_some_and(|last| {
                let lm = last.mirror.as_mut().expect("mirrored pairs");
                let ok = last.primary.member == p.member
                    && last.primary.member_offset_bytes + last.primary.len_bytes
                        == p.member_offset_bytes
                    && lm.member == m.member
                    && lm.member_offset_bytes + lm.len_bytes == m.member_offset_bytes;
                if ok {
                    last.primary.len_bytes += piece_bytes;
                    lm.len_bytes += piece_bytes;
                }
                ok
            });
            if !merged {
                out.push(CopyPair {
                    primary: MemberIo {
                        member: p.member,
                        member_offset_bytes: p.member_offset_bytes,
                        len_bytes: piece_bytes,
                        buf_offset_bytes: done,
                    },
                    mirror: Some(MemberIo {
                        member: m.member,
                        member_offset_bytes: m.member_offset_bytes,
                        len_bytes: piece_bytes,
                        buf_offset_bytes: done,
                    }),
                });
            }
            done += piece_bytes;
        }
        Ok(out)
    }

    /// The partition's size as clients see it.
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// Bytes its blocks hold (≥ the size): [`PartitionMap::locate`] and
    /// [`PartitionMap::split`] map offsets below it.
    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    /// Bytes that stay contiguous on one member from `offset_bytes` on (to the end of its unit).
    fn run_bytes(&self, offset_bytes: u64) -> u64 {
        self.unit_bytes - offset_bytes % self.unit_bytes
    }

    /// Where the byte at `offset_bytes` of the partition lives.
    ///
    /// group `g = o / (M·block)`, `r = o mod (M·block)`, unit `k = r / unit`; slot `j = k mod M`;
    /// within that slot's `g`-th block the byte is at `(k / M)·unit + r mod unit`.
    pub fn locate(&self, offset_bytes: u64) -> Result<MemberLocation, LayoutError> {
        if offset_bytes >= self.capacity_bytes {
            return Err(LayoutError::OutOfRange {
                offset_bytes,
                len_bytes: 1,
                size_bytes: self.capacity_bytes,
            });
        }
        let width = self.members.len() as u64;
        let group_bytes = width * self.block_bytes;
        let group = offset_bytes / group_bytes;
        let rest = offset_bytes % group_bytes;
        let unit = rest / self.unit_bytes;
        let slot = (unit % width) as usize;
        let within_block = (unit / width) * self.unit_bytes + rest % self.unit_bytes;
        // `group` < the slot's block count: offset < capacity, and PartitionMap::new checked
        // that the blocks are dealt round-robin (whole groups for a striped partition).
        let block = self.slots[slot].block(group);
        Ok(MemberLocation {
            member: self.members[slot],
            member_offset_bytes: self.data_start_bytes
                + u64::from(block) * self.block_bytes
                + within_block,
        })
    }

    /// The members this partition spreads over, in slot order.
    pub fn members(&self) -> &[MemberIndex] {
        &self.members
    }

    /// Stripe unit of a striped partition, the block of a placed one.
    pub fn unit_bytes(&self) -> u64 {
        self.unit_bytes
    }

    pub fn block_bytes(&self) -> u64 {
        self.block_bytes
    }

    /// The most pieces and bytes [`PartitionMap::split`] gives any one member for a request
    /// of `len_bytes` at any offset (see [`pieces_per_member_max`]).
    pub fn pieces_per_member_max(&self, len_bytes: u64) -> (u32, u64) {
        pieces_per_member_max(
            len_bytes,
            self.unit_bytes,
            self.block_bytes,
            self.members.len(),
        )
    }

    /// Splits a request of `len_bytes` at `offset_bytes` into per-member pieces, ordered by
    /// `buf_offset_bytes`; adjacent pieces that are contiguous on the same member are merged.
    /// When `offset_bytes` and `len_bytes` are multiples of 4096, so is every piece (stripe unit,
    /// block and data start all are), as O_DIRECT requires.
    pub fn split(&self, offset_bytes: u64, len_bytes: u64) -> Result<Vec<MemberIo>, LayoutError> {
        if len_bytes > REQUEST_BYTES_MAX {
            return Err(LayoutError::RequestTooLarge { len_bytes });
        }
        let end = offset_bytes.checked_add(len_bytes);
        if end.is_none_or(|end| end > self.capacity_bytes) {
            return Err(LayoutError::OutOfRange {
                offset_bytes,
                len_bytes,
                size_bytes: self.capacity_bytes,
            });
        }
        let mut pieces: Vec<MemberIo> =
            Vec::with_capacity((len_bytes / self.unit_bytes + 2) as usize);
        let mut done: u64 = 0;
        while done < len_bytes {
            let at = offset_bytes + done;
            let loc = self.locate(at)?;
            let piece_bytes = self.run_bytes(at).min(len_bytes - done);
            match pieces.last_mut() {
                Some(last)
                    if last.member == loc.member
                        && last.member_offset_bytes + last.len_bytes == loc.member_offset_bytes =>
                {
                    last.len_bytes += piece_bytes;
                }
                _ => pieces.push(MemberIo {
                    member: loc.member,
                    member_offset_bytes: loc.member_offset_bytes,
                    len_bytes: piece_bytes,
                    buf_offset_bytes: done,
                }),
            }
            done += piece_bytes;
        }
        Ok(pieces)
    }
}

/// What one member reads of a sequential reader's requests of `len_bytes` each over a
/// partition of `width` members with units of `unit_bytes`, in the long run: at most
/// `mean_bytes` a request on average, and over any run of consecutive requests at most
/// `excess_bytes` more than that (a `(σ, ρ)` bound). Consecutive units go to consecutive
/// members, so a contiguous range of `X` bytes gives a member at most `X / width` plus one
/// unit: `mean_bytes = ceil(len / width)`, `excess_bytes = unit`. One member: the request
/// itself, nothing in excess.
pub fn member_bytes_sequential(len_bytes: u64, unit_bytes: u64, width: usize) -> (u64, u64) {
    let width = width.max(1) as u64;
    if width == 1 || len_bytes == 0 {
        return (len_bytes, 0);
    }
    (len_bytes.div_ceil(width), unit_bytes.max(1))
}

/// The most pieces and bytes one member gets from a request of `len_bytes` at any offset of a
/// partition over `width` members with units of `unit_bytes` in blocks of `block_bytes` (what
/// admission charges a volume stream's chunk, per member). [`PartitionMap::split`] cuts at
/// unit boundaries and sends consecutive units to consecutive slots, so a request touches at
/// most `ceil(len / unit) + 1` units and one member at most `ceil(that / width)` of them; with
/// one member, merged pieces break only where the member's blocks do:
/// `ceil(len / block) + 1`. Each piece is at most one unit (one member: the request).
pub fn pieces_per_member_max(
    len_bytes: u64,
    unit_bytes: u64,
    block_bytes: u64,
    width: usize,
) -> (u32, u64) {
    if len_bytes == 0 {
        return (0, 0);
    }
    let unit = unit_bytes.max(1);
    let units_touched = len_bytes.div_ceil(unit) + 1;
    let width = width.max(1) as u64;
    let pieces = if width == 1 {
        units_touched.min(len_bytes.div_ceil(block_bytes.max(1)) + 1)
    } else {
        units_touched.div_ceil(width)
    };
    let bytes = if width == 1 {
        len_bytes
    } else {
        len_bytes.min(pieces.saturating_mul(unit))
    };
    (u32::try_from(pieces).unwrap_or(u32::MAX), bytes)
}
