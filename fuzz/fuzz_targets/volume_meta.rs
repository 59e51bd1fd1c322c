#![no_main]
//! Volume metadata slots, structure-aware.
//!
//! Most inputs are read (with `arbitrary`) as a small description of a volume: members, stripe
//! unit, block size, data start, whether it is mirrored (one in four: failure domains, member
//! states, each partition's copies), a list of operations (allocate striped or placed, grow,
//! mark ready, free, repair, many partitions at once — empty ones too, past version 3's 256
//! up to the table's 2048 (version 4) —, and hand edits that leave the volume encodable but inconsistent,
//! the copies' members and extents too), path hints, member index and sequence. The description is turned into real metadata with the core's own
//! allocator and encoder, and then:
//!
//! 1. the image decodes to exactly that metadata (`decode(encode(x)) == x`);
//! 2. a few input-chosen mutations are applied to the image (byte flips and writes, field-sized
//!    writes, inserted or removed body bytes, a changed body length, bytes in the padding, a
//!    shorter slot), the checksums are fixed up or not, and it is decoded: never a panic, a
//!    short slot is a `SlotSize` error, and whatever decodes is checked by [`exercise`].
//!
//! One input in eight instead goes through the raw branch: its bytes are the start of a slot
//! (zero padded to the slot size), with the body length clamped to the bytes given and the
//! checksums fixed up, so byte-level mutations reach the field decoder too.
//!
//! Speed: a slot is 1 MiB. The target never checksums or copies more than the header and the
//! body the input describes, and the raw branch reuses one zeroed slot buffer. (The previous
//! version ran a bitwise CRC over a body length taken from the input — up to 1 MiB, eight
//! traced compares per byte — which is where its 318 runs/s went.) What remains is the
//! library's work: `encode` returns a fresh zeroed 1 MiB image (one or two per input; under
//! ASAN each is an mmap with its shadow poisoned), `allocate` grows with the partitions and
//! blocks, `check` compares partition names pairwise, and `check`/`repair` visit every block
//! one bit at a time, so they run only on volumes of at most `CHECK_BLOCKS_MAX` blocks. About
//! 7,000 runs/s without a sanitizer (`-s none`), about 1,400 with ASAN, on one busy core of
//! the 2-core dev machine.
//!
//! Seeds (raw-branch images of a 1-, 4- and 16-member volume) are in `fuzz/seeds/volume_meta`:
//! `cargo fuzz run volume_meta fuzz/corpus/volume_meta fuzz/seeds/volume_meta`.
use std::cell::RefCell;
use std::ops::ControlFlow;

use arbitrary::{Arbitrary, Result as ArbResult, Unstructured};
use libfuzzer_sys::fuzz_target;
use penstock_core::volume::format::{
    META_AREA_BYTES, META_HEADER_BYTES, META_SLOT_BYTES, META_VERSION, META_VERSION_WIDE,
};
use penstock_core::volume::layout::{ALIGN_BYTES, BLOCK_BYTES_MAX};
use penstock_core::volume::{
    BLOCKS_PER_MEMBER_MAX, DecodedMeta, EXTENTS_MAX, MEMBER_PATH_BYTES_MAX, MEMBERS_MAX,
    MemberIndex, MemberState, MetaError, NAME_BYTES_MAX, Name, PARTITIONS_MAX, PARTITIONS_MAX_V3, PartitionKind, PartitionMap,
    PartitionState, Placement, VolumeLayout, VolumeMeta, VolumeUuid, allocate, allocate_with,
    allocated_blocks, check, decode, encode, free, grow, mark_ready, repair, set_size, trim,
    truncate,
};
use penstock_core::volume::alloc::set_member_state;

const SLOT_BYTES: usize = META_SLOT_BYTES as usize;
const HEADER: usize = META_HEADER_BYTES;
/// Header field offsets (docs/volume-format.md, "Slot image").
const VERSION_AT: usize = 8;
const BODY_LEN_AT: usize = 24;
const BODY_CRC_AT: usize = 28;
const HEADER_CRC_AT: usize = 60;
/// Most operations and mutations one input applies: bounds the work per input.
const OPS_MAX: u32 = 48;
const MUTATIONS_MAX: u32 = 8;
/// Blocks of an ordinary member, mostly; one member in eight has up to
/// `MEMBER_BLOCKS_LARGE_MAX`, and one input in 64 makes member 0 as large as the format allows.
/// Kept small because `check` and `repair` visit every block of every member (see the module
/// documentation).
const MEMBER_BLOCKS_SMALL_MAX: u64 = 64;
const MEMBER_BLOCKS_LARGE_MAX: u64 = 1024;
/// Most blocks (over all members) of a volume that `exercise` runs `check` and `repair` on.
const CHECK_BLOCKS_MAX: u64 = 1 << 14;

fuzz_target!(|data: &[u8]| {
    match data.split_first() {
        Some((&mode, rest)) if mode < 32 => raw(rest),
        _ => {
            let mut u = Unstructured::new(data);
            if let Ok(case) = Case::arbitrary(&mut u) {
                structured(case);
            }
        }
    }
});

/// The decoder accepts nothing the encoder cannot express: what `decode` accepted from `slot`
/// re-encodes to the same header and body bytes (the padding after the body is not read), and
/// that decodes equal.
///
/// A version 1 image (no reservation or generation per partition) re-encodes as version 2,
/// whose bytes differ, and so does a version 3 image of a volume that uses nothing of version
/// 3 (one copy, every member ok), and a version 4 image of at most 256 partitions as version
/// 3 or 2; each must still decode to the same metadata. A version 5 image (block checksums)
/// always re-encodes as version 5.
fn reencodes(d: &DecodedMeta, slot: &[u8]) {
    let again = encode(&d.meta, d.member, d.seq);
    let version = le32(slot, VERSION_AT);
    assert!((1..=META_VERSION).contains(&version), "only versions 1 to 5 decode");
    if version == d.meta.format_version() {
        let end = HEADER + le32(&again, BODY_LEN_AT) as usize;
        assert!(
            again[..end] == slot[..end],
            "decoded metadata re-encodes to different bytes"
        );
    } else if version == META_VERSION_WIDE {
        assert!(
            d.meta.partitions.len() <= PARTITIONS_MAX_V3,
            "a table of more than {PARTITIONS_MAX_V3} partitions is written as version 4"
        );
    } else if version == 3 {
        assert!(!d.meta.mirrored(), "a mirrored volume is written as version 3");
    } else {
        assert_eq!(version, 1, "a version 2 image re-encodes as version 2");
        for p in &d.meta.partitions {
            assert_eq!(p.reserve_bytes, p.size_bytes, "a version 1 partition is fixed-size");
            assert_eq!(p.generation, 1);
        }
    }
    assert_eq!(decode(&again).as_ref(), Ok(d));
}

/// What the rest of penstock does with decoded metadata must not panic either.
fn exercise(d: &DecodedMeta) {
    // Every partition the table maps consistently can be located and split, up to its
    // blocks' capacity (a growing partition's writer writes ahead of its size) and no further.
    for p in &d.meta.partitions {
        let Ok(map) = PartitionMap::new(&d.meta.layout, p) else {
            continue;
        };
        let capacity = allocated_blocks(p) * d.meta.layout.block_bytes();
        assert_eq!(map.capacity_bytes(), capacity);
        assert!(capacity >= p.size_bytes);
        assert!(map.locate(capacity).is_err());
        if capacity > 0 {
            map.locate(capacity - 1).expect("last byte of the blocks");
        }
        if p.size_bytes == 0 {
            continue;
        }
        map.locate(0).expect("offset 0 of a non-empty partition");
        map.locate(p.size_bytes - 1)
            .expect("last byte of a partition");
        let len_bytes = p.size_bytes.min(1 << 20);
        let offset_bytes = p.size_bytes - len_bytes;
        let pieces = map.split(offset_bytes, len_bytes).expect("split in range");
        let mut at = 0;
        for piece in &pieces {
            assert_eq!(piece.buf_offset_bytes, at);
            assert!(piece.len_bytes > 0);
            assert!(piece.member_offset_bytes >= d.meta.layout.data_start_bytes());
            at += piece.len_bytes;
        }
        assert_eq!(at, len_bytes);
        // A mirrored partition: every piece has its copy, of the same length, elsewhere.
        let pairs = map.split_copies(offset_bytes, len_bytes).expect("split in range");
        let mut at = 0;
        for pair in &pairs {
            assert_eq!(pair.primary.buf_offset_bytes, at);
            if let Some(c) = pair.mirror {
                assert_eq!(c.len_bytes, pair.primary.len_bytes);
                assert_eq!(c.buf_offset_bytes, at);
                assert_ne!(c.member, pair.primary.member);
            }
            at += pair.primary.len_bytes;
        }
        assert_eq!(at, len_bytes);
    }

    // check() and repair() run on metadata read from disk (`volume check --repair`). Both visit
    // every block of every member, one bit at a time; past CHECK_BLOCKS_MAX that costs tens of
    // milliseconds an input under the fuzzer's instrumentation, for no new branch.
    let blocks_total: u64 = d.meta.used.iter().map(|m| u64::from(m.blocks())).sum();
    if blocks_total > CHECK_BLOCKS_MAX {
        return;
    }
    let problems = check(&d.meta);
    // On a consistent volume, growing, resizing and truncating any partition keep it
    // consistent: no block handed out twice, the map equal to what the table lists.
    if problems.is_empty()
        && let Some(p) = d.meta.partitions.first()
    {
        let name = p.name.as_str();
        let mut m = d.meta.clone();
        let before = allocated_blocks(p);
        let block = m.layout.block_bytes();
        let cap = before * block;
        if let Ok(grown) = grow(&mut m, name, cap.saturating_add(block * 3)) {
            // Committed as a writer does (blocks grown and never written are "past the end",
            // which check reports, rightly).
            set_size(&mut m, name, grown).expect("within the grown blocks");
            assert!(check(&m).is_empty(), "grow broke the volume: {:?}", check(&m));
        }
        let grown = m.partition(name).expect("still there");
        let (size, had) = (grown.size_bytes, allocated_blocks(grown));
        let free_before: u64 = m.used.iter().map(|u| u64::from(u.free_blocks())).sum();
        let freed = truncate(&mut m, name, size / 2).expect("a shrink");
        assert!(check(&m).is_empty(), "truncate broke the volume: {:?}", check(&m));
        let after = m.partition(name).expect("still there");
        assert_eq!(allocated_blocks(after) + freed, had, "truncate lost blocks");
        let free_after: u64 = m.used.iter().map(|u| u64::from(u.free_blocks())).sum();
        // `freed` counts the partition's own blocks; its copies free as many again.
        let copies = if after.mirror.is_some() { 2 } else { 1 };
        assert_eq!(free_after, free_before + copies * freed, "truncate freed other blocks");
        assert!(before <= had);
        let _ = trim(&mut m, name);
        assert!(check(&m).is_empty());
    }
    let mut repaired = d.meta.clone();
    repair(&mut repaired);
    let left = check(&repaired);
    assert!(
        !left.iter().any(|p| p.repairable()),
        "repair left repairable problems: {left:?}"
    );
}

/// The raw branch: the input is the start of a slot image.
fn raw(data: &[u8]) {
    // As read from a device of the wrong size: refused, never a panic.
    if data.len() != SLOT_BYTES {
        assert!(matches!(decode(data), Err(MetaError::SlotSize { .. })));
    } else if let Ok(d) = decode(data) {
        reencodes(&d, data);
        exercise(&d);
    }
    thread_local! {
        static SLOT: RefCell<Vec<u8>> = RefCell::new(vec![0; SLOT_BYTES]);
    }
    SLOT.with(|slot| {
        let slot = &mut slot.borrow_mut()[..];
        let n = data.len().min(SLOT_BYTES);
        slot[..n].copy_from_slice(&data[..n]);
        // A body length past the bytes given would only checksum zeros: fold it into range.
        let given = n.saturating_sub(HEADER) as u32;
        let claimed = le32(slot, BODY_LEN_AT);
        if claimed > given {
            put32(slot, BODY_LEN_AT, claimed % (given + 1));
        }
        fix_checksums(slot, true, true);
        if let Ok(d) = decode(slot) {
            reencodes(&d, slot);
            exercise(&d);
        }
        // Back to all zeros for the next input (only the header and the bytes copied changed).
        slot[..n.max(HEADER)].fill(0);
    });
}

/// The structured branch.
fn structured(case: Case) {
    let Case {
        meta,
        member,
        seq,
        mutations,
        fixup,
    } = case;
    let original = DecodedMeta { meta, member, seq };
    let mut slot = encode(&original.meta, member, seq);
    assert_eq!(
        decode(&slot).as_ref(),
        Ok(&original),
        "decode(encode(x)) != x"
    );
    if mutations.is_empty() {
        // Re-encoding would repeat the line above (encode is deterministic).
        exercise(&original);
        return;
    }

    // `end`: the end of the bytes the mutations aim at (header and body as they now stand).
    let mut end = HEADER + le32(&slot, BODY_LEN_AT) as usize;
    let mut len = SLOT_BYTES;
    for m in &mutations {
        match *m {
            Mutation::Flip { at, xor } => slot[pick(at, end)] ^= xor | 1,
            Mutation::Set { at, value } => slot[pick(at, end)] = value,
            Mutation::Header { at, value } => slot[usize::from(at) % HEADER] = value,
            Mutation::Put16 { at, value } => put(&mut slot, pick(at, end), &value.to_le_bytes()),
            Mutation::Put32 { at, value } => put(&mut slot, pick(at, end), &value.to_le_bytes()),
            Mutation::Put64 { at, value } => put(&mut slot, pick(at, end), &value.to_le_bytes()),
            Mutation::Insert { at, bytes, count } => {
                let count = (usize::from(count) % bytes.len() + 1).min(SLOT_BYTES - end);
                let at = HEADER + pick(at, end - HEADER + 1);
                slot.copy_within(at..end, at + count);
                slot[at..at + count].copy_from_slice(&bytes[..count]);
                end += count;
                put32(&mut slot, BODY_LEN_AT, (end - HEADER) as u32);
            }
            Mutation::Remove { at, count } => {
                let at = HEADER + pick(at, end - HEADER + 1);
                let count = (usize::from(count) % 16 + 1).min(end - at);
                slot.copy_within(at + count..end, at);
                slot[end - count..end].fill(0);
                end -= count;
                put32(&mut slot, BODY_LEN_AT, (end - HEADER) as u32);
            }
            Mutation::BodyLen { value, wild } => {
                // Mostly near the real length; now and then anything (even past the slot).
                let value = if wild {
                    value
                } else {
                    value % (end - HEADER + 64) as u32
                };
                put32(&mut slot, BODY_LEN_AT, value);
            }
            Mutation::Padding { at, value } => {
                if end < SLOT_BYTES {
                    slot[end + pick(at, SLOT_BYTES - end)] = value | 1;
                }
            }
            Mutation::Truncate { keep } => len = len.min(keep as usize % SLOT_BYTES),
        }
    }
    fix_checksums(&mut slot, fixup.body(), fixup.header());
    let view = &slot[..len];
    match decode(view) {
        Ok(d) => {
            reencodes(&d, view);
            exercise(&d);
        }
        Err(MetaError::SlotSize { .. }) => assert!(len != SLOT_BYTES),
        Err(_) => assert!(len == SLOT_BYTES),
    }
}

/// An index below `end` from an input number (`end` > 0).
fn pick(at: u32, end: usize) -> usize {
    at as usize % end
}

/// Writes `bytes` at `at`, cut at the end of the slot.
fn put(slot: &mut [u8], at: usize, bytes: &[u8]) {
    let n = bytes.len().min(slot.len() - at);
    slot[at..at + n].copy_from_slice(&bytes[..n]);
}

fn le32(slot: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([slot[at], slot[at + 1], slot[at + 2], slot[at + 3]])
}

fn put32(slot: &mut [u8], at: usize, value: u32) {
    slot[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

/// Recomputes the body checksum (when the body length fits the slot) and then the header
/// checksum, as the encoder would have.
fn fix_checksums(slot: &mut [u8], body: bool, header: bool) {
    let body_bytes = le32(slot, BODY_LEN_AT) as usize;
    if body && body_bytes <= SLOT_BYTES - HEADER {
        let crc = penstock_core::crc::crc32c(&slot[HEADER..HEADER + body_bytes]);
        put32(slot, BODY_CRC_AT, crc);
    }
    if header {
        let crc = penstock_core::crc::crc32c(&slot[..HEADER_CRC_AT]);
        put32(slot, HEADER_CRC_AT, crc);
    }
}

/// One structured input: valid metadata, where it is written, and what happens to the image.
#[derive(Debug)]
struct Case {
    meta: VolumeMeta,
    member: MemberIndex,
    seq: u64,
    mutations: Vec<Mutation>,
    fixup: Fixup,
}

/// A change to the encoded image. Offsets are folded into the header and body (`pick`).
#[derive(Debug, Arbitrary)]
enum Mutation {
    Flip {
        at: u32,
        xor: u8,
    },
    Set {
        at: u32,
        value: u8,
    },
    Header {
        at: u8,
        value: u8,
    },
    Put16 {
        at: u32,
        value: u16,
    },
    Put32 {
        at: u32,
        value: u32,
    },
    Put64 {
        at: u32,
        value: u64,
    },
    /// Inserts 1..=8 body bytes and grows the body length to match.
    Insert {
        at: u32,
        bytes: [u8; 8],
        count: u8,
    },
    /// Removes 1..=16 body bytes and shrinks the body length to match.
    Remove {
        at: u32,
        count: u8,
    },
    BodyLen {
        value: u32,
        wild: bool,
    },
    /// A non-zero byte after the body.
    Padding {
        at: u32,
        value: u8,
    },
    /// Hands the decoder a slot shorter than a slot.
    Truncate {
        keep: u32,
    },
}

/// Which checksums are made right after the mutations: both, mostly (and when the input is
/// used up, which reads as 0); one in eight neither, body only, header only.
#[derive(Debug)]
struct Fixup(u8);

impl Fixup {
    fn body(&self) -> bool {
        !matches!(self.0 % 8, 5 | 7)
    }
    fn header(&self) -> bool {
        !matches!(self.0 % 8, 5 | 6)
    }
}

/// Something done to the metadata before it is encoded. Indices are folded into range.
#[derive(Debug, Arbitrary)]
enum Op {
    Allocate {
        name: ArbName,
        size: Size,
        placement: Place,
    },
    /// `count` placed partitions of `blocks` blocks each, to reach the table's limits quickly.
    Many {
        count: u8,
        blocks: u8,
        member: u8,
    },
    MarkReady(u8),
    MarkAllReady,
    Free(u8),
    Repair,
    /// Hand edits, encodable but inconsistent (what `check` is for):
    FlipUsed {
        member: u8,
        block: u32,
    },
    /// A second partition with the same name and blocks.
    Duplicate(u8),
    Resize {
        index: u8,
        size_bytes: u64,
    },
    ToggleKind(u8),
    SetMembers {
        index: u8,
        members: [u8; 4],
        width: u8,
    },
    DropExtent {
        index: u8,
        extent: u16,
    },
    /// Growable partitions (format version 2): empty with a reservation, grown, sized, trimmed,
    /// truncated, and the two new fields edited by hand.
    AllocateEmpty {
        name: ArbName,
        reserve_blocks: u16,
        placement: Place,
    },
    Grow {
        index: u8,
        blocks: u16,
    },
    SetSize {
        index: u8,
        size_bytes: u64,
    },
    Trim(u8),
    Truncate {
        index: u8,
        size_bytes: u64,
    },
    SetReserveGeneration {
        index: u8,
        reserve_bytes: u64,
        generation: u64,
    },
    /// Mirroring (format version 3): a member's state, a partition's copies swapped with its
    /// own blocks, a copy's extent dropped, a copy moved onto another member.
    SetState {
        member: u8,
        state: u8,
    },
    SwapMirror(u8),
    DropMirrorExtent {
        index: u8,
        extent: u16,
    },
    SetMirrorMember {
        index: u8,
        slot: u8,
        member: u8,
    },
}

#[derive(Debug, Arbitrary)]
enum Size {
    /// Whole blocks less a little, the usual case.
    Blocks {
        blocks: u16,
        slack: u32,
    },
    Bytes(u64),
}

#[derive(Debug, Arbitrary)]
enum Place {
    Striped,
    Placed([u8; 4], u8),
}

/// A valid name: 1..=64 characters of `[A-Za-z0-9._-]`, mostly short.
#[derive(Debug)]
struct ArbName(Name);

impl<'a> Arbitrary<'a> for ArbName {
    fn arbitrary(u: &mut Unstructured<'a>) -> ArbResult<Self> {
        const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-";
        let len = if rarely(u, 16)? {
            u.int_in_range(1..=NAME_BYTES_MAX)?
        } else {
            u.int_in_range(1..=6)?
        };
        let mut s = String::with_capacity(len);
        for _ in 0..len {
            s.push(char::from(CHARS[u.choose_index(CHARS.len())?]));
        }
        // "." and ".." are the only strings of these characters a name may not be.
        Ok(ArbName(Name::new(&s).unwrap_or_else(|_| {
            Name::new("dot").expect("a valid name")
        })))
    }
}

/// True about once in `n` (false when the input is used up).
fn rarely(u: &mut Unstructured<'_>, n: u32) -> ArbResult<bool> {
    Ok(u.int_in_range(0..=n - 1)? == n - 1)
}

fn layout(u: &mut Unstructured<'_>) -> ArbResult<VolumeLayout> {
    let count = u.int_in_range(1..=MEMBERS_MAX)?;
    let stripe_unit_bytes = ALIGN_BYTES << u.int_in_range(0..=8u32)?;
    let units_per_block = if rarely(u, 8)? {
        u.int_in_range(1..=1u64 << 18)?
    } else {
        u.int_in_range(1..=16u64)?
    };
    let block_bytes = (stripe_unit_bytes * units_per_block)
        .min(BLOCK_BYTES_MAX / stripe_unit_bytes * stripe_unit_bytes);
    let data_start_bytes = if rarely(u, 8)? {
        META_AREA_BYTES + ALIGN_BYTES * u64::from(u.arbitrary::<u16>()?)
    } else {
        META_AREA_BYTES
    };
    let mut sizes = Vec::with_capacity(count);
    for m in 0..count {
        let blocks = if m == 0 && rarely(u, 64)? {
            // At (or just past) the per-member bound: the largest block map.
            u64::from(BLOCKS_PER_MEMBER_MAX) + u.int_in_range(0..=2)?
        } else if rarely(u, 8)? {
            u.int_in_range(1..=MEMBER_BLOCKS_LARGE_MAX)?
        } else {
            u.int_in_range(1..=MEMBER_BLOCKS_SMALL_MAX)?
        };
        let tail_bytes = u.int_in_range(0..=block_bytes - 1)?;
        sizes.push(data_start_bytes + blocks * block_bytes + tail_bytes);
    }
    Ok(
        VolumeLayout::with_data_start(sizes, stripe_unit_bytes, block_bytes, data_start_bytes)
            .expect("the layout is built within the rules"),
    )
}

impl<'a> Arbitrary<'a> for Case {
    fn arbitrary(u: &mut Unstructured<'a>) -> ArbResult<Self> {
        let uuid = VolumeUuid(u.arbitrary()?);
        let ArbName(name) = u.arbitrary()?;
        let layout = layout(u)?;
        let count = layout.member_count();
        let mut meta = VolumeMeta::new(uuid, name, layout);
        // One volume in four is mirrored, its members in up to 3 failure domains.
        if count > 1 && rarely(u, 4)? {
            meta.copies = 2;
            for d in &mut meta.member_domains {
                *d = u64::from(u.int_in_range(0..=2u8)?);
            }
        }
        // Block checksums (format version 5) where the data start leaves room for them.
        if penstock_core::volume::sums::area_fits(&meta.layout) && rarely(u, 2)? {
            meta.sums = true;
        }
        u.arbitrary_loop(None, Some(OPS_MAX), |u| {
            apply(&mut meta, u.arbitrary()?);
            Ok(ControlFlow::Continue(()))
        })?;
        for path in &mut meta.member_paths {
            *path = path_hint(u)?;
        }
        let member = MemberIndex::new(u.int_in_range(0..=count - 1)?).expect("below MEMBERS_MAX");
        let seq = u.arbitrary::<u64>()?.max(1);
        let mut mutations = Vec::new();
        u.arbitrary_loop(None, Some(MUTATIONS_MAX), |u| {
            mutations.push(u.arbitrary()?);
            Ok(ControlFlow::Continue(()))
        })?;
        let fixup = Fixup(u.arbitrary()?);
        Ok(Case {
            meta,
            member,
            seq,
            mutations,
            fixup,
        })
    }
}

/// A member path hint: mostly none, else some text without NUL, now and then the longest.
fn path_hint(u: &mut Unstructured<'_>) -> ArbResult<String> {
    if !u.arbitrary::<bool>()? {
        return Ok(String::new());
    }
    if rarely(u, 32)? {
        return Ok("p".repeat(MEMBER_PATH_BYTES_MAX));
    }
    let mut s: String = u.arbitrary::<&str>()?.replace('\0', "");
    while s.len() > MEMBER_PATH_BYTES_MAX {
        s.pop();
    }
    Ok(s)
}

fn index(i: impl Into<usize>, len: usize) -> Option<usize> {
    (len > 0).then(|| i.into() % len)
}

fn placement_of(place: Place, count: usize) -> Placement {
    match place {
        Place::Striped => Placement::Striped,
        Place::Placed(members, width) => {
            let mut list: Vec<usize> = Vec::new();
            for &m in &members[..usize::from(width) % members.len() + 1] {
                let m = usize::from(m) % count;
                if !list.contains(&m) {
                    list.push(m);
                }
            }
            Placement::Placed(list)
        }
    }
}

/// Applies `op` to `meta`, keeping it encodable and decodable (within the format's limits,
/// extents inside their members) but not necessarily consistent. Refused operations are fine.
fn apply(meta: &mut VolumeMeta, op: Op) {
    let count = meta.layout.member_count();
    let block_bytes = meta.layout.block_bytes();
    let extents_total: usize = meta.partitions.iter().map(|p| p.all_extents().count()).sum();
    let member_of = |m: u8| usize::from(m) % count;
    match op {
        Op::Allocate {
            name,
            size,
            placement,
        } => {
            let size_bytes = match size {
                Size::Blocks { blocks, slack } => (u64::from(blocks) % 2048 * block_bytes)
                    .saturating_sub(u64::from(slack) % block_bytes),
                Size::Bytes(b) => b,
            };
            let placement = placement_of(placement, count);
            let _ = allocate(meta, name.0.as_str(), size_bytes, &placement);
        }
        Op::AllocateEmpty {
            name,
            reserve_blocks,
            placement,
        } => {
            let placement = placement_of(placement, count);
            let reserve = u64::from(reserve_blocks % 512) * block_bytes;
            let _ = allocate_with(meta, name.0.as_str(), 0, reserve, &placement);
        }
        Op::Grow { index: i, blocks } => {
            if let Some(i) = index(i, meta.partitions.len()) {
                let name = meta.partitions[i].name.clone();
                let want = (allocated_blocks(&meta.partitions[i]) + u64::from(blocks % 512))
                    * block_bytes;
                let _ = grow(meta, name.as_str(), want);
            }
        }
        Op::SetSize {
            index: i,
            size_bytes,
        } => {
            if let Some(i) = index(i, meta.partitions.len()) {
                let name = meta.partitions[i].name.clone();
                let _ = set_size(meta, name.as_str(), size_bytes);
            }
        }
        Op::Trim(i) => {
            if let Some(i) = index(i, meta.partitions.len()) {
                let name = meta.partitions[i].name.clone();
                let _ = trim(meta, name.as_str());
            }
        }
        Op::Truncate {
            index: i,
            size_bytes,
        } => {
            if let Some(i) = index(i, meta.partitions.len()) {
                let name = meta.partitions[i].name.clone();
                let _ = truncate(meta, name.as_str(), size_bytes);
            }
        }
        Op::SetReserveGeneration {
            index: i,
            reserve_bytes,
            generation,
        } => {
            if let Some(i) = index(i, meta.partitions.len()) {
                meta.partitions[i].reserve_bytes = reserve_bytes;
                meta.partitions[i].generation = generation;
            }
        }
        Op::Many {
            count: n,
            blocks,
            member,
        } => {
            let first = meta.partitions.len();
            let placement = Placement::Placed(vec![member_of(member)]);
            // One in eight: empty growable partitions, which own no block, so that a few
            // ops pass the 256 partitions of version 3 and reach PARTITIONS_MAX (version 4).
            let size_bytes = if blocks % 8 == 7 {
                0
            } else {
                u64::from(blocks % 4 + 1) * block_bytes
            };
            for k in 0..usize::from(n) {
                let name = format!("m{}", first + k);
                if allocate(meta, &name, size_bytes, &placement).is_err() {
                    break;
                }
            }
        }
        Op::MarkReady(i) => {
            if let Some(i) = index(i, meta.partitions.len()) {
                let name = meta.partitions[i].name.clone();
                mark_ready(meta, name.as_str()).expect("the partition exists");
            }
        }
        Op::MarkAllReady => {
            for p in &mut meta.partitions {
                p.state = PartitionState::Ready;
            }
        }
        Op::Free(i) => {
            if let Some(i) = index(i, meta.partitions.len()) {
                let name = meta.partitions[i].name.clone();
                free(meta, name.as_str()).expect("the partition exists");
            }
        }
        Op::Repair => {
            // As in `exercise`: repair visits every block.
            let blocks_total: u64 = meta.used.iter().map(|m| u64::from(m.blocks())).sum();
            if blocks_total <= CHECK_BLOCKS_MAX {
                repair(meta);
            }
        }
        Op::FlipUsed { member, block } => {
            let map = &mut meta.used[member_of(member)];
            let block = block % map.blocks();
            let used = map.is_used(block);
            map.set(block, !used);
        }
        Op::Duplicate(i) => {
            if let Some(i) = index(i, meta.partitions.len()) {
                let p = meta.partitions[i].clone();
                if meta.partitions.len() < PARTITIONS_MAX
                    && extents_total + p.all_extents().count() <= EXTENTS_MAX
                {
                    meta.partitions.push(p);
                }
            }
        }
        Op::Resize {
            index: i,
            size_bytes,
        } => {
            if let Some(i) = index(i, meta.partitions.len()) {
                meta.partitions[i].size_bytes = size_bytes;
            }
        }
        Op::ToggleKind(i) => {
            if let Some(i) = index(i, meta.partitions.len()) {
                let p = &mut meta.partitions[i];
                p.kind = match p.kind {
                    PartitionKind::Striped => PartitionKind::Placed,
                    PartitionKind::Placed => PartitionKind::Striped,
                };
            }
        }
        Op::SetMembers {
            index: i,
            members,
            width,
        } => {
            if let Some(i) = index(i, meta.partitions.len()) {
                // Possibly repeated members; the width stays within the volume's, as decode wants.
                let width = (usize::from(width) % members.len() + 1).min(count);
                meta.partitions[i].members = members[..width]
                    .iter()
                    .map(|&m| MemberIndex::new(member_of(m)).expect("below MEMBERS_MAX"))
                    .collect();
                // The format keeps a mirror as wide as its partition.
                if let Some(mirror) = &mut meta.partitions[i].mirror {
                    mirror.members.resize(
                        width,
                        MemberIndex::new(member_of(members[0])).expect("below MEMBERS_MAX"),
                    );
                }
            }
        }
        Op::SetState { member, state } => {
            let state = match state % 3 {
                0 => MemberState::Ok,
                1 => MemberState::Degraded,
                _ => MemberState::Rebuilding,
            };
            let m = MemberIndex::new(member_of(member)).expect("below MEMBERS_MAX");
            let _ = set_member_state(meta, m, state);
        }
        Op::SwapMirror(i) => {
            if let Some(i) = index(i, meta.partitions.len()) {
                meta.partitions[i].swap_mirror();
            }
        }
        Op::DropMirrorExtent { index: i, extent } => {
            if let Some(i) = index(i, meta.partitions.len())
                && let Some(mirror) = &mut meta.partitions[i].mirror
                && let Some(e) = index(extent, mirror.extents.len())
            {
                mirror.extents.remove(e);
            }
        }
        Op::SetMirrorMember {
            index: i,
            slot,
            member,
        } => {
            if let Some(i) = index(i, meta.partitions.len())
                && let Some(mirror) = &mut meta.partitions[i].mirror
                && let Some(slot) = index(slot, mirror.members.len())
            {
                mirror.members[slot] = MemberIndex::new(member_of(member)).expect("below MEMBERS_MAX");
            }
        }
        Op::DropExtent { index: i, extent } => {
            if let Some(i) = index(i, meta.partitions.len()) {
                let extents = &mut meta.partitions[i].extents;
                if let Some(e) = index(extent, extents.len()) {
                    extents.remove(e);
                }
            }
        }
    }
}
