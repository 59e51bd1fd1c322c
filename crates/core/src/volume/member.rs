//! Putting a volume together from its members' metadata (pure): is this set of members one
//! whole volume, and which metadata is current?
//!
//! Every member carries the whole metadata, so each identifies the volume and its own position.
//! An update writes the same sequence number to every member, one after the other; a crash in
//! between leaves some members one sequence behind. The newest sequence present on any member is
//! the volume's state (every copy of it is complete: it passed its checksum), and the driver's
//! next update rewrites all members, bringing the stale ones forward.

use super::MEMBERS_MAX;
use super::format::{Chosen, VolumeMeta, VolumeUuid};
use super::layout::MemberIndex;

/// What the driver read from one member: its size as measured now and its chosen metadata copy.
#[derive(Debug, Clone)]
pub struct MemberCopy {
    pub size_bytes: u64,
    pub chosen: Chosen,
}

/// A whole volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assembly {
    /// The current metadata (from the newest sequence).
    pub meta: VolumeMeta,
    pub seq: u64,
    /// `positions[i]` = the position in the input of member `i`; `None` for a member of a
    /// mirrored volume that is missing (see `failed`).
    pub positions: Vec<Option<usize>>,
    /// Members of a mirrored volume that were not given or are shorter than recorded: the
    /// volume works from the other copies (the caller marks them degraded). Always empty for
    /// an unmirrored volume, which needs every member.
    pub failed: Vec<MemberIndex>,
    /// Members whose copy is older than `seq` (an interrupted update); the next write fixes them.
    pub stale: Vec<MemberIndex>,
}

/// Why a set of members is not one whole volume. `position` is the index in the caller's list
/// (the order the members were named in), so the message can name the path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MembershipError {
    #[error("no members given")]
    NoMembers,
    #[error("{count} members given: a volume has at most {MEMBERS_MAX}")]
    TooManyMembers { count: usize },
    #[error("member at position {position} belongs to another volume ({found}, not {expected})")]
    ForeignMember {
        position: usize,
        found: VolumeUuid,
        expected: VolumeUuid,
    },
    #[error(
        "member at position {position} says the volume has {found} members, the first says {expected}"
    )]
    MemberCountMismatch {
        position: usize,
        found: usize,
        expected: usize,
    },
    #[error("member {member} is listed twice (positions {first} and {second})")]
    DuplicateMember {
        member: MemberIndex,
        first: usize,
        second: usize,
    },
    #[error("member {member} of {count} is missing")]
    MissingMember { member: usize, count: usize },
    #[error(
        "member {member} (position {position}) has {size_bytes} bytes, the volume needs {need_bytes}"
    )]
    MemberTooSmall {
        member: MemberIndex,
        position: usize,
        size_bytes: u64,
        need_bytes: u64,
    },
    #[error(
        "members {failed:?} failed or are missing, and they hold both copies of some blocks of \
         partition(s) {partitions}: the volume cannot be read"
    )]
    BothCopiesLost {
        failed: Vec<usize>,
        partitions: String,
    },
    #[error("members {first} and {second} hold different metadata under the same sequence {seq}")]
    CopiesDisagree {
        seq: u64,
        first: MemberIndex,
        second: MemberIndex,
    },
}

/// Checks that `copies` are exactly the members of one volume (same uuid, indices `0..N` each
/// once, each at least as large as recorded) and returns the current metadata.
/// The first copy defines which volume is meant.
pub fn assemble(copies: &[MemberCopy]) -> Result<Assembly, MembershipError> {
    let first = copies.first().ok_or(MembershipError::NoMembers)?;
    if copies.len() > MEMBERS_MAX {
        return Err(MembershipError::TooManyMembers {
            count: copies.len(),
        });
    }
    let expected = first.chosen.decoded.meta.uuid;
    let count = first.chosen.decoded.meta.layout.member_count();
    let mut positions: Vec<Option<usize>> = vec![None; count];
    for (position, c) in copies.iter().enumerate() {
        let d = &c.chosen.decoded;
        if d.meta.uuid != expected {
            return Err(MembershipError::ForeignMember {
                position,
                found: d.meta.uuid,
                expected,
            });
        }
        if d.meta.layout.member_count() != count {
            return Err(MembershipError::MemberCountMismatch {
                position,
                found: d.meta.layout.member_count(),
                expected: count,
            });
        }
        // decode() guarantees member < member_count.
        let slot = &mut positions[d.member.get()];
        if let Some(first) = *slot {
            return Err(MembershipError::DuplicateMember {
                member: d.member,
                first,
                second: position,
            });
        }
        *slot = Some(position);
    }
    let seq = copies
        .iter()
        .map(|c| c.chosen.decoded.seq)
        .max()
        .unwrap_or(0);
    let newest: Vec<&MemberCopy> = copies
        .iter()
        .filter(|c| c.chosen.decoded.seq == seq)
        .collect();
    let current = &newest[0].chosen.decoded;
    for c in &newest[1..] {
        if c.chosen.decoded.meta != current.meta {
            return Err(MembershipError::CopiesDisagree {
                seq,
                first: current.member,
                second: c.chosen.decoded.member,
            });
        }
    }
    let mirrored = current.meta.mirrored();
    let mut failed: Vec<bool> = vec![false; count];
    for (member, p) in positions.iter().enumerate() {
        if p.is_none() {
            if !mirrored {
                return Err(MembershipError::MissingMember { member, count });
            }
            failed[member] = true;
        }
    }
    for (position, c) in copies.iter().enumerate() {
        let member = c.chosen.decoded.member;
        let need_bytes = current.meta.layout.member_sizes_bytes()[member.get()];
        if c.size_bytes < need_bytes {
            if mirrored {
                // Shorter than recorded: its tail is gone; the mirror has those blocks.
                failed[member.get()] = true;
                positions[member.get()] = None;
                continue;
            }
            return Err(MembershipError::MemberTooSmall {
                member,
                position,
                size_bytes: c.size_bytes,
                need_bytes,
            });
        }
    }
    if failed.iter().any(|&f| f) {
        let unusable: Vec<bool> = (0..count)
            .map(|m| failed[m] || !current.meta.member_states[m].readable())
            .collect();
        let lost = super::alloc::unreadable_partitions(&current.meta, &unusable);
        if !lost.is_empty() {
            let names: Vec<&str> = lost.iter().map(|n| n.as_str()).collect();
            return Err(MembershipError::BothCopiesLost {
                failed: (0..count).filter(|&m| unusable[m]).collect(),
                partitions: names.join(","),
            });
        }
    }
    let failed: Vec<MemberIndex> = (0..count)
        .filter(|&m| failed[m])
        .filter_map(MemberIndex::new)
        .collect();
    let stale = copies
        .iter()
        .filter(|c| c.chosen.decoded.seq < seq)
        .filter(|c| !failed.contains(&c.chosen.decoded.member))
        .map(|c| c.chosen.decoded.member)
        .collect();
    Ok(Assembly {
        meta: current.meta.clone(),
        seq,
        positions,
        failed,
        stale,
    })
}
