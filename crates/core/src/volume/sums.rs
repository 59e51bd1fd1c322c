//! Block checksums (format version 5): one crc32c per 4 KiB *sum unit* of every member's data
//! area, kept in the member's *sum area* between the metadata slots and the data
//! (`docs/volume-format.md`, "Block checksums").
//!
//! Pure bookkeeping: where a unit's entry lives, how an entry is encoded, what it takes for
//! a unit's bytes to verify, and the geometry of a volume that has a sum area. The driver reads
//! and writes entries and data; it decides nothing here.
//!
//! A unit's *record* holds two checksums, the newest and the one before it: each covers the
//! first `len` bytes of the unit (`len` ≤ 4096; a partition's last unit is partly written).
//! A writer seals the units it wrote when it commits: the new record's older checksum is
//! the previous record's newest — the one the last commit made durable — so whether a crash
//! leaves a unit's old bytes or its new ones (an overwrite, or an append into a partial unit,
//! interrupted while data and record were being written back), one of the two still matches
//! (`docs/volume-format.md`, "Block checksums"). A unit verifies for a reader that needs its
//! first `need` bytes when one of the two is well-formed, covers `len ≥ need` bytes and
//! `crc32c(unit[..len])` is its crc.

use std::ops::Range;

use super::BLOCKS_PER_MEMBER_MAX;
use super::format::META_AREA_BYTES;
use super::layout::{ALIGN_BYTES, LayoutError, VolumeLayout};

/// Bytes one entry covers: the O_DIRECT alignment, so that every aligned read covers whole
/// units, and a partial write rereads at most one page on each side.
pub const SUM_UNIT_BYTES: u64 = ALIGN_BYTES;
/// Bytes of one unit's record on disk: two checksums of 8 bytes, each a crc32c (u32), a
/// covered length (u16) and a tag (u16); the newest first.
pub const SUM_ENTRY_BYTES: u64 = 16;
/// The tag of a written entry; an entry without it (a never-written, zeroed area, or damage)
/// verifies nothing.
pub const SUM_TAG: u16 = 0x5053; // "SP" little-endian

/// One unit's checksum: `crc32c` of the unit's first `len` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SumEntry {
    pub crc: u32,
    pub len: u16,
}

/// Why a unit did not verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SumFailure {
    #[error("no checksum recorded")]
    Missing,
    #[error("the checksum covers {covered} bytes, {need} are needed")]
    Short { covered: u16, need: u16 },
    #[error("checksum mismatch (recorded {recorded:#010x}, computed {computed:#010x})")]
    Mismatch { recorded: u32, computed: u32 },
}

impl SumEntry {
    /// The entry for `bytes`, a unit's first `bytes.len()` bytes (at most a unit).
    pub fn of(bytes: &[u8]) -> SumEntry {
        assert!(
            bytes.len() as u64 <= SUM_UNIT_BYTES,
            "an entry covers at most one unit"
        );
        SumEntry {
            crc: crate::crc::crc32c(bytes),
            len: bytes.len() as u16,
        }
    }

    /// The on-disk bytes.
    pub fn encode(self) -> [u8; 8] {
        let mut out = [0u8; 8];
        out[0..4].copy_from_slice(&self.crc.to_le_bytes());
        out[4..6].copy_from_slice(&self.len.to_le_bytes());
        out[6..8].copy_from_slice(&SUM_TAG.to_le_bytes());
        out
    }

    /// An entry read from disk; `None` when it is not a written entry (no tag, or a length
    /// over a unit).
    pub fn decode(bytes: &[u8]) -> Option<SumEntry> {
        let b: &[u8; 8] = bytes.get(..8)?.try_into().ok()?;
        let tag = u16::from_le_bytes([b[6], b[7]]);
        let len = u16::from_le_bytes([b[4], b[5]]);
        if tag != SUM_TAG || u64::from(len) > SUM_UNIT_BYTES {
            return None;
        }
        Some(SumEntry {
            crc: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            len,
        })
    }
}

/// A unit's record: its newest checksum and the one before it (see the module's doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SumRecord {
    pub new: Option<SumEntry>,
    pub old: Option<SumEntry>,
}

impl SumRecord {
    /// The record of a unit sealed with `bytes` (its first `bytes.len()` bytes) after `self`:
    /// the newest checksum becomes the older one. A unit sealed again unchanged keeps its
    /// record (both checksums stay what they were).
    pub fn sealed(self, bytes: &[u8]) -> SumRecord {
        let e = SumEntry::of(bytes);
        if self.new == Some(e) {
            return self;
        }
        SumRecord {
            new: Some(e),
            old: self.new,
        }
    }

    /// A record holding one checksum (a repair: the other copy's bytes, newly written).
    pub fn only(e: SumEntry) -> SumRecord {
        SumRecord {
            new: Some(e),
            old: None,
        }
    }

    /// The on-disk bytes ([`SUM_ENTRY_BYTES`]); a missing checksum is zeros.
    pub fn encode(self) -> [u8; SUM_ENTRY_BYTES as usize] {
        let mut out = [0u8; SUM_ENTRY_BYTES as usize];
        if let Some(e) = self.new {
            out[..8].copy_from_slice(&e.encode());
        }
        if let Some(e) = self.old {
            out[8..].copy_from_slice(&e.encode());
        }
        out
    }

    /// A record read from disk (anything that is not a written checksum reads as missing).
    pub fn decode(bytes: &[u8]) -> SumRecord {
        SumRecord {
            new: bytes.get(..8).and_then(SumEntry::decode),
            old: bytes.get(8..16).and_then(SumEntry::decode),
        }
    }

    /// Checks a unit: `unit` is its bytes as read (the whole unit, or at least what the
    /// checksums cover), `need` the bytes of it a reader delivers (those below the
    /// partition's size). The newest checksum first; the older one is what a crash during
    /// the last seal may have left current. The failure reported is the newest's.
    pub fn verify(self, unit: &[u8], need: usize) -> Result<(), SumFailure> {
        let first = verify(self.new, unit, need);
        if first.is_ok() || need == 0 || self.old.is_none() {
            return first;
        }
        verify(self.old, unit, need).or(first)
    }
}

/// Checks a unit against one checksum: `unit` is its bytes as read (at least what the
/// checksum covers, when the unit was read whole), `need` the bytes of it a reader delivers.
/// `entry` is the decoded checksum (`None`: missing).
pub fn verify(entry: Option<SumEntry>, unit: &[u8], need: usize) -> Result<(), SumFailure> {
    assert!(
        need as u64 <= SUM_UNIT_BYTES,
        "a unit holds at most 4096 bytes"
    );
    if need == 0 {
        return Ok(());
    }
    let e = entry.ok_or(SumFailure::Missing)?;
    if usize::from(e.len) < need {
        return Err(SumFailure::Short {
            covered: e.len,
            need: need as u16,
        });
    }
    let covered = unit.get(..usize::from(e.len)).ok_or(SumFailure::Short {
        covered: unit.len().min(usize::from(u16::MAX)) as u16,
        need: e.len,
    })?;
    let computed = crate::crc::crc32c(covered);
    if computed != e.crc {
        return Err(SumFailure::Mismatch {
            recorded: e.crc,
            computed,
        });
    }
    Ok(())
}

/// Bytes of the sum area for `blocks` data blocks of `block_bytes`: an entry per unit,
/// rounded up to the alignment.
pub fn area_bytes(blocks: u64, block_bytes: u64) -> u64 {
    let entries = blocks * (block_bytes / SUM_UNIT_BYTES);
    (entries * SUM_ENTRY_BYTES).div_ceil(ALIGN_BYTES) * ALIGN_BYTES
}

/// The layout of a new volume with block checksums: the data area starts after a sum area
/// large enough for the largest member's blocks (so every member's entries fit).
pub fn layout_with_sums(
    member_sizes_bytes: Vec<u64>,
    stripe_unit_bytes: u64,
    block_bytes: u64,
) -> Result<VolumeLayout, LayoutError> {
    // Validate the geometry first (and get its errors) with the plain layout.
    let plain = VolumeLayout::new(member_sizes_bytes.clone(), stripe_unit_bytes, block_bytes)?;
    let largest = plain
        .member_sizes_bytes()
        .iter()
        .copied()
        .max()
        .unwrap_or(0);
    // Each block costs its bytes and its entries; the area's rounding at most one page.
    let entry_bytes = (block_bytes / SUM_UNIT_BYTES) * SUM_ENTRY_BYTES;
    let room = largest.saturating_sub(META_AREA_BYTES + ALIGN_BYTES);
    let blocks = (room / (block_bytes + entry_bytes)).min(u64::from(BLOCKS_PER_MEMBER_MAX));
    let mut data_start = META_AREA_BYTES + area_bytes(blocks.max(1), block_bytes);
    // The floor above can leave room for one block more than the area holds: grow the area
    // until it holds what the members then have (each step lowers the block count, so this
    // settles at once; bounded anyway).
    for _ in 0..4 {
        let layout = VolumeLayout::with_data_start(
            member_sizes_bytes.clone(),
            stripe_unit_bytes,
            block_bytes,
            data_start,
        )?;
        if area_fits(&layout) {
            return Ok(layout);
        }
        let blocks = layout
            .members()
            .map(|m| u64::from(layout.member_blocks(m)))
            .max()
            .unwrap_or(0);
        data_start = META_AREA_BYTES + area_bytes(blocks, block_bytes);
    }
    unreachable!("the sum area settles within two steps")
}

/// Whether `layout`'s sum area (between the metadata and the data) holds an entry for every
/// unit of every member's blocks.
pub fn area_fits(layout: &VolumeLayout) -> bool {
    let blocks = layout
        .members()
        .map(|m| u64::from(layout.member_blocks(m)))
        .max()
        .unwrap_or(0);
    META_AREA_BYTES + area_bytes(blocks, layout.block_bytes()) <= layout.data_start_bytes()
}

/// The member offset of the entry of the unit at member offset `member_offset_bytes` (a data
/// offset: at or after the data start).
pub fn entry_offset_bytes(layout: &VolumeLayout, member_offset_bytes: u64) -> u64 {
    let data = layout.data_start_bytes();
    assert!(member_offset_bytes >= data, "an offset in the data area");
    META_AREA_BYTES + (member_offset_bytes - data) / SUM_UNIT_BYTES * SUM_ENTRY_BYTES
}

/// The units (as member offsets of their first byte, one every [`SUM_UNIT_BYTES`]) that the
/// member range `offset .. offset + len` touches: from its start rounded down to its end
/// rounded up.
pub fn units_of(offset_bytes: u64, len_bytes: u64) -> Range<u64> {
    let start = offset_bytes / SUM_UNIT_BYTES * SUM_UNIT_BYTES;
    let end = (offset_bytes + len_bytes).div_ceil(SUM_UNIT_BYTES) * SUM_UNIT_BYTES;
    start..end
}

/// The bytes a unit must verify for a reader of a partition of `size_bytes`, the unit holding
/// partition offsets from `partition_offset_bytes` on (units are aligned alike in the partition
/// and on its members: every stripe unit and block is a multiple of a sum unit).
pub fn needed_bytes(partition_offset_bytes: u64, size_bytes: u64) -> usize {
    size_bytes
        .saturating_sub(partition_offset_bytes)
        .min(SUM_UNIT_BYTES) as usize
}

/// The records sealing the bytes of a member range starting at a unit boundary, after the
/// records `prev` (one per unit): each unit's newest checksum covers its bytes below
/// `valid_end` (a length from the range's start: the bytes below the partition's new size);
/// a unit with nothing valid keeps its record.
pub fn sealed_records(bytes: &[u8], valid_end: usize, prev: &[SumRecord]) -> Vec<SumRecord> {
    bytes
        .chunks(SUM_UNIT_BYTES as usize)
        .zip(prev)
        .enumerate()
        .map(|(i, (unit, prev))| {
            let start = i * SUM_UNIT_BYTES as usize;
            let valid = valid_end.saturating_sub(start).min(unit.len());
            if valid > 0 {
                prev.sealed(&unit[..valid])
            } else {
                *prev
            }
        })
        .collect()
}
