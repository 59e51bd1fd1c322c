//! Volumes: several members (disks, partitions or plain files) combined into one store of
//! dynamic partitions.
//!
//! Two papers meet here. MARS §4.4 (ccd) stripes a virtual disk across component disks in
//! stripe units so that one large request becomes parallel requests to every disk. Clockwise
//! §3 groups 1 MiB blocks into *dynamic partitions* listed in a partition table with the member
//! each block is on, and lets the application choose the placement. A penstock volume does
//! both: a partition is either [`PartitionKind::Striped`] (ccd: consecutive stripe units on
//! consecutive members) or [`PartitionKind::Placed`] (Clockwise: whole blocks, on members the
//! application named, in turn).
//!
//! Everything here is pure: the mapping from a partition offset to member locations
//! ([`layout`]), the on-disk metadata image ([`format`], documented in `docs/volume-format.md`),
//! allocation and consistency checks ([`alloc`]) and the cross-member membership checks
//! ([`member`]). The driver reads and writes the bytes; it decides nothing.

pub mod alloc;
pub mod format;
pub mod layout;
pub mod member;
pub mod sums;

pub use alloc::{
    AllocError, Placement, Problem, allocate, allocate_with, allocated_blocks, capacity_bytes,
    check, free, grow, mark_ready, rename, repair, room_bytes, set_size, trim, truncate,
};
pub use format::{
    BlockMap, Chosen, DecodedMeta, MemberState, MetaError, Slot, VolumeMeta, VolumeUuid, choose,
    decode, encode,
};
pub use layout::{
    CopyPair, Extent, LayoutError, MemberIndex, MemberIo, MemberLocation, Mirror, Partition,
    PartitionKind, PartitionMap, PartitionState, VolumeLayout,
};
pub use member::{Assembly, MemberCopy, MembershipError, assemble};
pub use sums::{SumEntry, SumFailure, SumRecord};

use std::fmt;

/// Most members in one volume. A bound so that per-member tables are small and fixed, and
/// because the metadata image must hold one free-block map per member (see
/// [`format::META_SLOT_BYTES`]).
pub const MEMBERS_MAX: usize = 16;
/// Most partitions in one volume: bounds the partition table in the metadata image. A mount
/// shows each partition as a file, so this is also the most files a mounted volume holds.
/// 2048 is what the 1 MiB metadata slot holds next to the other bounds at their largest
/// (see [`format::META_SLOT_BYTES`] and docs/volume-format.md: about 988 KiB of the slot's
/// 1 MiB); more needs a larger slot, that is a new data start and a new member layout.
/// A table of more than [`PARTITIONS_MAX_V3`] partitions is written as format version 4.
pub const PARTITIONS_MAX: usize = 2048;
/// Most partitions format versions 1 to 3 hold (what penstocks before version 4 accept).
pub const PARTITIONS_MAX_V3: usize = 256;
/// Most extents over all partitions of a volume: bounds the partition table in the metadata
/// image. A fresh volume uses one extent per member per partition; fragmentation adds more.
pub const EXTENTS_MAX: usize = 16_384;
/// Most data blocks used on one member. With the default 1 MiB block that is 256 GiB per
/// member; a larger member leaves the excess unused (choose a larger block to use it). The
/// bound keeps the free-block map of 16 members within the metadata slot.
pub const BLOCKS_PER_MEMBER_MAX: u32 = 1 << 18;
/// Longest member path hint recorded in the metadata, in bytes: Linux's `PATH_MAX` less the NUL.
pub const MEMBER_PATH_BYTES_MAX: usize = 4095;
/// Most copies of each block: 1 (unmirrored) or 2 (`volume create --mirror 2`).
pub const COPIES_MAX: u8 = 2;
/// Longest volume or partition name, in bytes (ASCII).
pub const NAME_BYTES_MAX: usize = 64;

/// A volume or partition name: 1..=64 characters from `[A-Za-z0-9._-]`.
///
/// Restricted so that a name is safe in a path (`vol:VOL/PARTITION`), in a shell and in a
/// CSV/log line without quoting; `.` and `..` are refused because they mean something in paths.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Name(String);

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    #[error("empty name: a name has 1 to {NAME_BYTES_MAX} characters")]
    Empty,
    #[error("name of {len} bytes is too long: at most {NAME_BYTES_MAX} characters")]
    TooLong { len: usize },
    #[error("name {name:?} has a character outside [A-Za-z0-9._-]")]
    BadCharacter { name: String },
    #[error("name {name:?} is reserved (it means something in a path)")]
    Reserved { name: String },
}

impl Name {
    /// Parses a name; see the type's documentation for the rules.
    pub fn new(name: &str) -> Result<Name, NameError> {
        if name.is_empty() {
            return Err(NameError::Empty);
        }
        if name.len() > NAME_BYTES_MAX {
            return Err(NameError::TooLong { len: name.len() });
        }
        let ok = |b: u8| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-';
        if !name.bytes().all(ok) {
            return Err(NameError::BadCharacter {
                name: name.escape_default().to_string(),
            });
        }
        if name == "." || name == ".." {
            return Err(NameError::Reserved {
                name: name.to_string(),
            });
        }
        Ok(Name(name.to_string()))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests;
