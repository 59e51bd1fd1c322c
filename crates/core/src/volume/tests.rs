use std::collections::{HashMap, HashSet};

use proptest::prelude::*;

use super::format::{META_AREA_BYTES, META_SLOT_BYTES};
use super::layout::{ALIGN_BYTES, BLOCK_BYTES_DEFAULT, STRIPE_UNIT_BYTES_DEFAULT};
use super::*;

const MIB: u64 = 1 << 20;

fn member(i: usize) -> MemberIndex {
    MemberIndex::new(i).unwrap()
}

fn meta_with(sizes: Vec<u64>, stripe_unit: u64, block: u64) -> VolumeMeta {
    let layout = VolumeLayout::new(sizes, stripe_unit, block).unwrap();
    VolumeMeta::new(VolumeUuid([7; 16]), Name::new("vol0").unwrap(), layout)
}

fn meta4() -> VolumeMeta {
    meta_with(
        vec![META_AREA_BYTES + 64 * MIB; 4],
        STRIPE_UNIT_BYTES_DEFAULT,
        BLOCK_BYTES_DEFAULT,
    )
}

fn map_of(meta: &VolumeMeta, name: &str) -> PartitionMap {
    PartitionMap::new(&meta.layout, meta.partition(name).unwrap()).unwrap()
}

#[test]
fn layout_rejects_bad_geometry() {
    let ok = META_AREA_BYTES + MIB;
    assert_eq!(
        VolumeLayout::new(vec![], 65536, MIB),
        Err(LayoutError::NoMembers)
    );
    assert!(matches!(
        VolumeLayout::new(vec![ok; 17], 65536, MIB),
        Err(LayoutError::TooManyMembers { count: 17 })
    ));
    assert!(matches!(
        VolumeLayout::new(vec![ok], 3 * 4096, MIB),
        Err(LayoutError::StripeUnit { .. })
    ));
    assert!(matches!(
        VolumeLayout::new(vec![ok], 2048, MIB),
        Err(LayoutError::StripeUnit { .. })
    ));
    assert!(matches!(
        VolumeLayout::new(vec![ok], 65536, 65536 * 3 / 2),
        Err(LayoutError::BlockSize { .. })
    ));
    assert_eq!(
        VolumeLayout::new(vec![ok, ok - 1], 65536, MIB),
        Err(LayoutError::MemberTooSmall {
            member: 1,
            size_bytes: ok - 1,
            min_bytes: ok
        })
    );
}

#[test]
fn striped_is_the_ccd_layout() {
    let mut meta = meta4();
    allocate(&mut meta, "s", 8 * MIB, &Placement::Striped).unwrap();
    let map = map_of(&meta, "s");
    let su = STRIPE_UNIT_BYTES_DEFAULT;
    // Consecutive stripe units go to consecutive members, at the same row of their blocks.
    for k in 0..8u64 {
        let loc = map.locate(k * su).unwrap();
        assert_eq!(loc.member, member((k % 4) as usize));
        assert_eq!(loc.member_offset_bytes, META_AREA_BYTES + (k / 4) * su);
    }
    // The second group uses each member's second block.
    let loc = map.locate(4 * MIB).unwrap();
    assert_eq!(
        loc,
        MemberLocation {
            member: member(0),
            member_offset_bytes: META_AREA_BYTES + MIB
        }
    );
    // A 1 MiB read at 0 touches the 4 members 4 times each, 64 KiB apiece.
    let pieces = map.split(0, MIB).unwrap();
    assert_eq!(pieces.len(), 16);
    assert!(pieces.iter().all(|p| p.len_bytes == su));
}

#[test]
fn placed_uses_whole_blocks_in_turn() {
    let mut meta = meta4();
    allocate(&mut meta, "p", 3 * MIB + 1, &Placement::Placed(vec![2, 0])).unwrap();
    let p = meta.partition("p").unwrap();
    assert_eq!(p.state, PartitionState::Creating);
    assert_eq!(p.kind, PartitionKind::Placed);
    let map = map_of(&meta, "p");
    let members: Vec<usize> = (0..4)
        .map(|b| map.locate(b * MIB).unwrap().member.get())
        .collect();
    assert_eq!(members, vec![2, 0, 2, 0]);
    // Within a block, the whole block is contiguous: one piece.
    assert_eq!(map.split(0, MIB).unwrap().len(), 1);
    // The map covers the blocks (4 MiB), not just the size: a writer may go past the size.
    assert_eq!(map.capacity_bytes(), 4 * MIB);
    assert!(map.split(0, 4 * MIB + 1).is_err());
    assert_eq!(map.split(3 * MIB, 1).unwrap().len(), 1);
}

#[test]
fn single_member_pieces_merge() {
    let mut meta = meta_with(vec![META_AREA_BYTES + 8 * MIB], 65536, MIB);
    allocate(&mut meta, "x", 4 * MIB, &Placement::Striped).unwrap();
    let pieces = map_of(&meta, "x").split(4096, 3 * MIB).unwrap();
    assert_eq!(
        pieces,
        vec![MemberIo {
            member: member(0),
            member_offset_bytes: META_AREA_BYTES + 4096,
            len_bytes: 3 * MIB,
            buf_offset_bytes: 0
        }]
    );
}

#[test]
fn allocation_errors_leave_the_volume_unchanged() {
    let mut meta = meta4();
    let before = meta.clone();
    assert!(matches!(
        allocate(&mut meta, "bad/name", MIB, &Placement::Striped),
        Err(AllocError::Name(_))
    ));
    assert_eq!(
        allocate(&mut meta, "x", MIB, &Placement::Placed(vec![])),
        Err(AllocError::NoMembers)
    );
    assert_eq!(
        allocate(&mut meta, "x", MIB, &Placement::Placed(vec![4])),
        Err(AllocError::MemberOutOfRange {
            member: 4,
            count: 4
        })
    );
    assert_eq!(
        allocate(&mut meta, "x", MIB, &Placement::Placed(vec![1, 1])),
        Err(AllocError::MemberRepeated { member: 1 })
    );
    // 4 members × 64 blocks of 1 MiB.
    let err = allocate(&mut meta, "x", 256 * MIB + 1, &Placement::Striped).unwrap_err();
    assert_eq!(
        err,
        AllocError::TooLarge {
            size_bytes: 256 * MIB + 1,
            needed_bytes: 260 * MIB,
            free_bytes: 256 * MIB,
            members: 4
        }
    );
    assert!(err.to_string().contains("needs 272629760 bytes"), "{err}");
    let err = allocate(&mut meta, "x", 65 * MIB, &Placement::Placed(vec![3])).unwrap_err();
    assert!(matches!(err, AllocError::TooLarge { free_bytes, .. } if free_bytes == 64 * MIB));
    assert_eq!(meta, before);
    allocate(&mut meta, "x", 256 * MIB, &Placement::Striped).unwrap();
    assert_eq!(
        allocate(&mut meta, "x", 0, &Placement::Striped),
        Err(AllocError::Duplicate { name: "x".into() })
    );
    assert!(matches!(
        allocate(&mut meta, "y", 1, &Placement::Striped),
        Err(AllocError::TooLarge { free_bytes: 0, .. })
    ));
    free(&mut meta, "x").unwrap();
    assert_eq!(meta, before);
    assert_eq!(
        free(&mut meta, "x"),
        Err(AllocError::NotFound { name: "x".into() })
    );
}

#[test]
fn names() {
    assert!(Name::new("movie-01.ts_x").is_ok());
    assert_eq!(Name::new(""), Err(NameError::Empty));
    assert!(matches!(
        Name::new(&"a".repeat(65)),
        Err(NameError::TooLong { len: 65 })
    ));
    assert!(Name::new(&"a".repeat(64)).is_ok());
    assert!(matches!(
        Name::new("a b"),
        Err(NameError::BadCharacter { .. })
    ));
    assert!(matches!(
        Name::new("é"),
        Err(NameError::BadCharacter { .. })
    ));
    assert!(matches!(Name::new(".."), Err(NameError::Reserved { .. })));
}

fn sample_meta() -> VolumeMeta {
    let mut meta = meta4();
    allocate(&mut meta, "a", 5 * MIB, &Placement::Striped).unwrap();
    allocate(&mut meta, "b", 3 * MIB, &Placement::Placed(vec![3, 1])).unwrap();
    mark_ready(&mut meta, "a").unwrap();
    meta.member_paths = vec![
        "/dev/loop0".to_string(),
        String::new(),
        "/srv/disk 2/member.img".to_string(),
        "/dev/disk/by-id/ata-x".to_string(),
    ];
    meta
}

#[test]
fn encode_decode_round_trip() {
    let meta = sample_meta();
    let img = encode(&meta, member(2), 7);
    assert_eq!(img.len() as u64, META_SLOT_BYTES);
    assert_eq!(img.len() as u64 % ALIGN_BYTES, 0);
    let d = decode(&img).unwrap();
    assert_eq!(
        d,
        DecodedMeta {
            meta,
            member: member(2),
            seq: 7
        }
    );
}

#[test]
fn decode_errors_are_typed() {
    let meta = sample_meta();
    let img = encode(&meta, member(0), 3);
    assert_eq!(
        decode(&img[..4096]),
        Err(MetaError::SlotSize { len_bytes: 4096 })
    );
    assert_eq!(
        decode(&vec![0; META_SLOT_BYTES as usize]),
        Err(MetaError::BadMagic)
    );
    let mut v6 = img.clone();
    v6[8] = 6;
    assert_eq!(decode(&v6), Err(MetaError::UnknownVersion { found: 6 }));
    let mut v0 = img.clone();
    v0[8] = 0;
    assert_eq!(decode(&v0), Err(MetaError::UnknownVersion { found: 0 }));
    let mut hdr = img.clone();
    hdr[17] ^= 1;
    assert!(matches!(
        decode(&hdr),
        Err(MetaError::HeaderChecksum { .. })
    ));
    let mut body = img.clone();
    body[100] ^= 0x10;
    assert!(matches!(decode(&body), Err(MetaError::BodyChecksum { .. })));
}

#[test]
fn choose_prefers_the_newest_valid_copy() {
    let meta = sample_meta();
    let mut newer = meta.clone();
    allocate(&mut newer, "c", MIB, &Placement::Striped).unwrap();
    let a = decode(&encode(&meta, member(0), 5));
    let b = decode(&encode(&newer, member(0), 6));
    let c = choose(a.clone(), b.clone()).unwrap();
    assert_eq!(
        (c.slot, c.decoded.seq, c.other_error.clone()),
        (Slot::B, 6, None)
    );
    assert_eq!(Slot::for_seq(c.next_seq()), Slot::A);
    assert_eq!(c.decoded.meta, newer);

    // A torn write of slot B (seq 6): slot A survives.
    let mut torn = encode(&newer, member(0), 6);
    torn[200..].fill(0);
    let c = choose(a.clone(), decode(&torn)).unwrap();
    assert_eq!((c.slot, c.decoded.seq), (Slot::A, 5));
    assert!(matches!(
        c.other_error,
        Some(MetaError::BodyChecksum { .. })
    ));

    // A copy in the wrong slot is refused.
    let c = choose(b.clone(), a.clone()).unwrap_err();
    let msg = c.to_string();
    assert!(
        msg.contains("slot A: sequence 6 found in slot A") && msg.contains("slot B: sequence 5"),
        "{msg}"
    );

    // Both bad: one error naming both.
    let e = choose(Err(MetaError::BadMagic), decode(&torn)).unwrap_err();
    assert!(
        matches!(&e, MetaError::BothSlotsBad { a, b } if **a == MetaError::BadMagic && matches!(**b, MetaError::BodyChecksum { .. }))
    );
}

#[test]
fn flipping_any_byte_of_a_slot_is_detected() {
    let img = encode(&sample_meta(), member(1), 9);
    let used = 64 + u32::from_le_bytes(img[24..28].try_into().unwrap()) as usize;
    for at in 0..used {
        let mut bad = img.clone();
        bad[at] ^= 0x01;
        assert!(decode(&bad).is_err(), "flip at {at} not detected");
    }
}

#[test]
fn check_finds_and_repair_fixes_what_it_can_prove() {
    let mut meta = sample_meta();
    assert_eq!(
        check(&meta),
        vec![Problem::Interrupted {
            partition: Name::new("b").unwrap()
        }]
    );
    mark_ready(&mut meta, "b").unwrap();
    assert_eq!(check(&meta), vec![]);
    let clean = meta.clone();

    // Leak: a used block nobody owns.
    meta.used[0].set(60, true);
    // Owned but free.
    let e = meta.partition("a").unwrap().extents[0];
    meta.used[e.member.get()].set(e.start_block, false);
    let problems = check(&meta);
    assert_eq!(
        problems,
        vec![
            Problem::OwnedButFree {
                member: e.member,
                start_block: e.start_block,
                blocks: 1,
                partition: Name::new("a").unwrap()
            },
            Problem::Leaked {
                member: member(0),
                start_block: 60,
                blocks: 1
            },
        ]
    );
    assert!(problems.iter().all(Problem::repairable));
    assert_eq!(repair(&mut meta), problems);
    assert_eq!(meta, clean);

    // Shared block and bad size: not repairable.
    let mut broken = clean.clone();
    let a_ext = broken.partition("a").unwrap().extents[0];
    broken.partitions[1].extents.push(Extent {
        member: a_ext.member,
        start_block: a_ext.start_block,
        blocks: 1,
    });
    broken.partitions[0].size_bytes += 64 * MIB;
    let problems = check(&broken);
    assert!(
        problems
            .iter()
            .any(|p| matches!(p, Problem::SharedBlocks { .. })),
        "{problems:?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| matches!(p, Problem::BadPartition { .. })),
        "{problems:?}"
    );
    assert!(problems.iter().filter(|p| !p.repairable()).count() >= 2);
}

#[test]
fn repair_removes_interrupted_creates_only() {
    let mut meta = sample_meta();
    let fixed = repair(&mut meta);
    assert_eq!(
        fixed,
        vec![Problem::Interrupted {
            partition: Name::new("b").unwrap()
        }]
    );
    assert!(meta.partition("b").is_none() && meta.partition("a").is_some());
    assert_eq!(check(&meta), vec![]);
}

fn copy(meta: &VolumeMeta, m: usize, seq: u64, size: u64) -> MemberCopy {
    let a = decode(&encode(meta, member(m), seq | 1));
    let b = decode(&encode(meta, member(m), (seq | 1) + 1));
    let mut chosen = choose(a, b).unwrap();
    chosen.decoded.seq = seq;
    MemberCopy {
        size_bytes: size,
        chosen,
    }
}

#[test]
fn membership() {
    let meta = sample_meta();
    let size = META_AREA_BYTES + 64 * MIB;
    let all: Vec<MemberCopy> = (0..4).map(|m| copy(&meta, m, 10, size)).collect();
    let asm = assemble(&all).unwrap();
    assert_eq!(
        (asm.seq, asm.positions.clone(), asm.stale.clone()),
        (10, vec![Some(0), Some(1), Some(2), Some(3)], vec![])
    );

    let mut shuffled = all.clone();
    shuffled.swap(0, 3);
    shuffled[1] = copy(&meta, 1, 9, size);
    let asm = assemble(&shuffled).unwrap();
    assert_eq!(
        (asm.positions.clone(), asm.stale.clone()),
        (vec![Some(3), Some(1), Some(2), Some(0)], vec![member(1)])
    );

    assert_eq!(assemble(&[]).unwrap_err(), MembershipError::NoMembers);
    assert_eq!(
        assemble(&all[..3]).unwrap_err(),
        MembershipError::MissingMember {
            member: 3,
            count: 4
        }
    );
    let twice = vec![
        all[0].clone(),
        all[1].clone(),
        all[1].clone(),
        all[3].clone(),
    ];
    assert!(matches!(
        assemble(&twice),
        Err(MembershipError::DuplicateMember {
            first: 1,
            second: 2,
            ..
        })
    ));
    let mut other = meta.clone();
    other.uuid = VolumeUuid([9; 16]);
    let foreign = vec![
        all[0].clone(),
        all[1].clone(),
        copy(&other, 2, 10, size),
        all[3].clone(),
    ];
    assert!(matches!(
        assemble(&foreign),
        Err(MembershipError::ForeignMember { position: 2, .. })
    ));
    let small = vec![
        all[0].clone(),
        copy(&meta, 1, 10, size - 1),
        all[2].clone(),
        all[3].clone(),
    ];
    assert!(matches!(
        assemble(&small),
        Err(MembershipError::MemberTooSmall { position: 1, .. })
    ));
    let mut diff = meta.clone();
    mark_ready(&mut diff, "b").unwrap();
    let split_brain = vec![
        all[0].clone(),
        copy(&diff, 1, 10, size),
        all[2].clone(),
        all[3].clone(),
    ];
    assert!(matches!(
        assemble(&split_brain),
        Err(MembershipError::CopiesDisagree { seq: 10, .. })
    ));
}

/// A volume with 1..=4 members, some partitions already allocated (fragmenting the free space),
/// then the partition under test.
fn arb_volume() -> impl Strategy<Value = (VolumeMeta, bool)> {
    (
        1usize..=4,
        0u32..3,
        0u32..2,
        prop::collection::vec(1u64..6 * MIB, 0..4),
        any::<bool>(),
        1u64..40 * MIB,
    )
        .prop_map(|(members, su_shift, block_shift, others, placed, size)| {
            let su = 4096u64 << (su_shift * 3); // 4 KiB, 32 KiB, 256 KiB
            let block = MIB.max(su) << block_shift;
            let mut meta = meta_with(vec![META_AREA_BYTES + 128 * MIB; members], su, block);
            for (i, &o) in others.iter().enumerate() {
                let place = if i % 2 == 0 {
                    Placement::Striped
                } else {
                    Placement::Placed(vec![i % members])
                };
                allocate(&mut meta, &format!("o{i}"), o, &place).unwrap();
            }
            // Free one to leave holes.
            if others.len() > 1 {
                free(&mut meta, "o0").unwrap();
            }
            let placement = if placed {
                Placement::Placed((0..members).rev().collect())
            } else {
                Placement::Striped
            };
            allocate(&mut meta, "t", size, &placement).unwrap();
            (meta, placed)
        })
}

proptest! {
    #[test]
    fn split_tiles_the_request((meta, _placed) in arb_volume(), a in any::<u64>(), b in any::<u64>(), aligned in any::<bool>()) {
        let map = map_of(&meta, "t");
        let size = map.size_bytes();
        let (mut off, mut len) = (a % size, b % (size + 1));
        if aligned { off -= off % 4096; len -= len % 4096; }
        len = len.min(size - off);
        if aligned { len -= len % 4096; }
        let pieces = map.split(off, len).unwrap();
        let mut at = 0;
        let p = meta.partition("t").unwrap();
        for piece in &pieces {
            prop_assert_eq!(piece.buf_offset_bytes, at, "gap or overlap");
            prop_assert!(piece.len_bytes > 0);
            at += piece.len_bytes;
            if aligned {
                prop_assert_eq!(piece.member_offset_bytes % 4096, 0);
                prop_assert_eq!(piece.len_bytes % 4096, 0);
            }
            // Within one allocated block of this partition on that member.
            let block = (piece.member_offset_bytes - meta.layout.data_start_bytes()) / meta.layout.block_bytes();
            let last = (piece.member_offset_bytes + piece.len_bytes - 1 - meta.layout.data_start_bytes()) / meta.layout.block_bytes();
            for blk in block..=last {
                prop_assert!(p.extents.iter().any(|e| e.member == piece.member
                    && u64::from(e.start_block) <= blk && blk < u64::from(e.start_block + e.blocks)));
            }
            // Each piece agrees with locate() at its start and end.
            let loc = map.locate(off + piece.buf_offset_bytes).unwrap();
            prop_assert_eq!((loc.member, loc.member_offset_bytes), (piece.member, piece.member_offset_bytes));
        }
        prop_assert_eq!(at, len);
        for w in pieces.windows(2) {
            prop_assert!(!(w[0].member == w[1].member && w[0].member_offset_bytes + w[0].len_bytes == w[1].member_offset_bytes), "unmerged");
        }
    }

    #[test]
    fn mapping_is_injective_and_balanced((meta, placed) in arb_volume()) {
        let map = map_of(&meta, "t");
        let granule = if placed { meta.layout.block_bytes() } else { meta.layout.stripe_unit_bytes() };
        let mut seen = HashSet::new();
        let mut per_member: HashMap<MemberIndex, u64> = HashMap::new();
        let mut o = 0;
        while o < map.size_bytes() {
            // Check the first and last byte of every unit: units are contiguous runs.
            let last = (o + granule - 1).min(map.size_bytes() - 1);
            // A one-byte last unit has one byte to check, not two.
            for x in if last == o { vec![o] } else { vec![o, last] } {
                let loc = map.locate(x).unwrap();
                prop_assert!(seen.insert((loc.member, loc.member_offset_bytes)), "two offsets map to one place");
            }
            *per_member.entry(map.locate(o).unwrap().member).or_default() += 1;
            o += granule;
        }
        let counts: Vec<u64> = per_member.values().copied().collect();
        let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        prop_assert!(max - min <= 1, "unbalanced: {:?}", per_member);
        let only_interrupted = check(&meta).iter().all(|p| matches!(p, Problem::Interrupted { .. }));
        prop_assert!(only_interrupted);
    }

    #[test]
    fn meta_round_trips((meta, _) in arb_volume(), seq in 1u64..u64::MAX) {
        let m = member(0);
        prop_assert_eq!(decode(&encode(&meta, m, seq)).unwrap(), DecodedMeta { meta, member: m, seq });
    }
}

/// The map of a 32 MiB partition over `width` members of 64 MiB with stripe units of
/// `2^unit_pow` bytes: striped, or placed on the members in reverse order.
fn split_map(width: usize, unit_pow: u32, placed: bool) -> PartitionMap {
    let mut meta = meta_with(
        vec![META_AREA_BYTES + 64 * MIB; width],
        1 << unit_pow,
        BLOCK_BYTES_DEFAULT,
    );
    let placement = if placed {
        Placement::Placed((0..width).rev().collect())
    } else {
        Placement::Striped
    };
    allocate(&mut meta, "p", 32 * MIB, &placement).unwrap();
    map_of(&meta, "p")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// What admission charges a volume chunk per member bounds what `split` (the executor's
    /// pieces) gives any member, for any request size and offset.
    #[test]
    fn pieces_per_member_max_bounds_every_split(
        width in 1usize..=4,
        unit_pow in 12u32..=17,
        len_blocks in 1u64..=512,
        offset_blocks in 0u64..=4096,
        placed: bool,
    ) {
        let map = split_map(width, unit_pow, placed);
        let len = len_blocks * ALIGN_BYTES;
        let offset = (offset_blocks * ALIGN_BYTES).min(32 * MIB - len);
        let (pieces_max, bytes_max) = map.pieces_per_member_max(len);
        let pieces = map.split(offset, len).unwrap();
        for m in 0..width {
            let mine: Vec<_> = pieces.iter().filter(|p| p.member == member(m)).collect();
            prop_assert!(mine.len() as u32 <= pieces_max, "{} > {pieces_max}", mine.len());
            let bytes: u64 = mine.iter().map(|p| p.len_bytes).sum();
            prop_assert!(bytes <= bytes_max, "{bytes} > {bytes_max}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// A sequential reader's consecutive requests (the executor's chunks) give each member
    /// at most `member_bytes_sequential`'s mean a request plus its excess, over every run
    /// from the first request: what admission charges a volume stream's rate and what its
    /// read-ahead must cover beyond it.
    #[test]
    fn consecutive_requests_give_each_member_its_mean_and_at_most_the_excess_more(
        width in 1usize..=4,
        unit_pow in 12u32..=18,
        len_blocks in 1u64..=400,
        offset_blocks in 0u64..=2048,
        placed: bool,
    ) {
        let map = split_map(width, unit_pow, placed);
        let len = len_blocks * ALIGN_BYTES;
        let (mean, excess) =
            crate::volume::layout::member_bytes_sequential(len, map.unit_bytes(), width);
        let mut got = vec![0u64; width];
        let mut at = offset_blocks * ALIGN_BYTES;
        let mut n = 0u64;
        while at + len <= 32 * MIB && n < 200 {
            for p in map.split(at, len).unwrap() {
                got[p.member.get()] += p.len_bytes;
            }
            n += 1;
            at += len;
            for (m, bytes) in got.iter().enumerate() {
                prop_assert!(*bytes <= n * mean + excess,
                    "member {m}: {bytes} B after {n} requests of {len} B, mean {mean}, excess {excess}");
            }
        }
    }
}

/// A version 1 image (no reservation, no generation): the partition entries of version 2
/// without those two fields.
fn encode_v1(meta: &VolumeMeta, m: MemberIndex, seq: u64) -> Vec<u8> {
    let v2 = encode(meta, m, seq);
    let body_len = u32::from_le_bytes(v2[24..28].try_into().unwrap()) as usize;
    let body = &v2[64..64 + body_len];
    // Walk the v2 body, dropping 16 bytes after each partition's size.
    let mut out = Vec::new();
    let name_len = body[16] as usize;
    let mut at = 16 + 1 + name_len + 2 + 2 + 24 + 8 * meta.layout.member_count();
    out.extend_from_slice(&body[..at]);
    let count = u16::from_le_bytes([body[at], body[at + 1]]) as usize;
    out.extend_from_slice(&body[at..at + 2]);
    at += 2;
    for _ in 0..count {
        let start = at;
        at += 1 + body[at] as usize; // name
        at += 1; // kind
        at += 1 + body[at] as usize; // width, members
        at += 8; // size
        out.extend_from_slice(&body[start..at]);
        at += 16; // reserve, generation: not in v1
        let n = u32::from_le_bytes(body[at + 1..at + 5].try_into().unwrap()) as usize;
        let end = at + 1 + 4 + 9 * n;
        out.extend_from_slice(&body[at..end]);
        at = end;
    }
    out.extend_from_slice(&body[at..]);
    let mut img = vec![0u8; META_SLOT_BYTES as usize];
    img[..64].copy_from_slice(&v2[..64]);
    img[8..12].copy_from_slice(&1u32.to_le_bytes());
    img[24..28].copy_from_slice(&(out.len() as u32).to_le_bytes());
    img[28..32].copy_from_slice(&crate::crc::crc32c(&out).to_le_bytes());
    let crc = crate::crc::crc32c(&img[0..60]);
    img[60..64].copy_from_slice(&crc.to_le_bytes());
    img[64..64 + out.len()].copy_from_slice(&out);
    img
}

#[test]
fn version_1_images_still_decode_as_fixed_size_partitions() {
    let mut meta = sample_meta();
    for p in &mut meta.partitions {
        p.reserve_bytes = p.size_bytes;
        p.generation = 1;
    }
    let img = encode_v1(&meta, member(0), 5);
    assert_eq!(u32::from_le_bytes(img[8..12].try_into().unwrap()), 1);
    let d = decode(&img).unwrap();
    assert_eq!(d.meta, meta);
    assert_eq!(d.seq, 5);
    // Written back as version 2.
    let again = encode(&d.meta, member(0), 6);
    assert_eq!(u32::from_le_bytes(again[8..12].try_into().unwrap()), 2);
    assert_eq!(decode(&again).unwrap().meta, meta);
}

#[test]
fn an_empty_partition_grows_writes_map_and_truncate_gives_blocks_back() {
    let mut meta = meta4();
    let free0: u32 = meta.used.iter().map(|m| m.free_blocks()).sum();
    allocate_with(&mut meta, "g", 0, 0, &Placement::Striped).unwrap();
    let p = meta.partition("g").unwrap();
    assert!(p.extents.is_empty());
    assert_eq!(map_of(&meta, "g").capacity_bytes(), 0);
    // Growing takes whole groups (4 members × 1 MiB).
    assert_eq!(grow(&mut meta, "g", 1).unwrap(), 4 * MIB);
    assert_eq!(grow(&mut meta, "g", 4 * MIB).unwrap(), 4 * MIB);
    assert_eq!(grow(&mut meta, "g", 9 * MIB).unwrap(), 12 * MIB);
    set_size(&mut meta, "g", 9 * MIB).unwrap();
    assert_eq!(meta.partition("g").unwrap().generation, 2);
    assert!(set_size(&mut meta, "g", 12 * MIB + 1).is_err());
    assert!(
        check(&meta)
            .iter()
            .all(|p| matches!(p, Problem::Interrupted { .. }))
    );
    // Truncate: only shrinks, frees what the new size does not need.
    assert!(matches!(
        truncate(&mut meta, "g", 10 * MIB),
        Err(AllocError::TruncateGrows { .. })
    ));
    assert_eq!(truncate(&mut meta, "g", 3 * MIB).unwrap(), 8);
    assert_eq!(map_of(&meta, "g").capacity_bytes(), 4 * MIB);
    assert_eq!(truncate(&mut meta, "g", 0).unwrap(), 4);
    let free1: u32 = meta.used.iter().map(|m| m.free_blocks()).sum();
    assert_eq!(free0, free1);
    // A full volume: refused, unchanged.
    let before = meta.clone();
    assert!(matches!(
        grow(&mut meta, "g", 1 << 40),
        Err(AllocError::Full { .. })
    ));
    assert_eq!(meta, before);
}

/// Random interleaved growth, size changes and truncations of several partitions.
fn arb_growth() -> impl Strategy<Value = (usize, u64, Vec<(usize, u8, u64)>)> {
    (
        1usize..=4,
        0u32..2,
        prop::collection::vec((0usize..5, 0u8..4, 0u64..24 * MIB), 1..60),
    )
        .prop_map(|(members, block_shift, ops)| (members, MIB << block_shift, ops))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Growth never hands out a block twice, keeps the map equal to what the table lists,
    /// never moves a byte already placed, truncate frees exactly the blocks the new size no
    /// longer needs, and every offset below the written size maps.
    #[test]
    fn growth_and_truncation_keep_the_volume_consistent((members, block, ops) in arb_growth()) {
        let mut meta = meta_with(vec![META_AREA_BYTES + 40 * block; members], 64 << 10, block);
        for i in 0..5 {
            let place = if i % 2 == 0 {
                Placement::Striped
            } else {
                Placement::Placed((0..members).rev().take(1 + i % members).collect())
            };
            allocate_with(&mut meta, &format!("p{i}"), 0, (i as u64) * block / 2, &place).unwrap();
            mark_ready(&mut meta, &format!("p{i}")).unwrap();
        }
        for (i, op, arg) in ops {
            let name = format!("p{i}");
            let before_map = map_of(&meta, &name);
            let before = meta.partition(&name).unwrap().clone();
            let free_before: u64 = meta.used.iter().map(|m| u64::from(m.free_blocks())).sum();
            match op {
                0 | 1 => {
                    let want = before.size_bytes + arg;
                    match grow(&mut meta, &name, want) {
                        Ok(cap) => {
                            prop_assert!(cap >= want);
                            prop_assert_eq!(map_of(&meta, &name).capacity_bytes(), cap);
                            set_size(&mut meta, &name, want).unwrap();
                        }
                        Err(AllocError::Full { .. }) | Err(AllocError::TooManyExtents) => {
                            prop_assert_eq!(meta.partition(&name).unwrap(), &before);
                        }
                        Err(e) => prop_assert!(false, "{e}"),
                    }
                }
                2 => {
                    let to = arg.min(before.size_bytes);
                    let freed = truncate(&mut meta, &name, to).unwrap();
                    let after = meta.partition(&name).unwrap();
                    let need = layout::partition_blocks(after.kind, after.members.len(), to.max(after.reserve_bytes), block).unwrap();
                    let had = allocated_blocks(&before);
                    prop_assert_eq!(allocated_blocks(after), need.min(had));
                    prop_assert_eq!(freed, had - allocated_blocks(after));
                    let free_after: u64 = meta.used.iter().map(|m| u64::from(m.free_blocks())).sum();
                    prop_assert_eq!(free_after, free_before + freed);
                    prop_assert!(after.generation > before.generation);
                }
                _ => {
                    trim(&mut meta, &name).unwrap();
                }
            }
            // No block in two partitions, the map is exactly what the table lists.
            prop_assert!(check(&meta).is_empty(), "{:?}", check(&meta));
            // Bytes below the smaller of the old and new sizes did not move.
            let map = map_of(&meta, &name);
            let keep = before.size_bytes.min(map.size_bytes());
            let mut o = 0;
            while o < keep {
                prop_assert_eq!(map.locate(o).unwrap(), before_map.locate(o).unwrap());
                o += 61 * 4096;
            }
            // Everything below the size maps; nothing at or past the capacity does.
            if map.size_bytes() > 0 {
                map.locate(map.size_bytes() - 1).unwrap();
                prop_assert!(map.split(0, map.size_bytes().min(1 << 30)).is_ok());
            }
            prop_assert!(map.locate(map.capacity_bytes()).is_err());
        }
        // Every partition's blocks are distinct across the volume.
        let mut seen = HashSet::new();
        for p in &meta.partitions {
            for e in &p.extents {
                for b in e.start_block..e.start_block + e.blocks {
                    prop_assert!(seen.insert((e.member, b)), "block given twice");
                }
            }
        }
    }
}

#[test]
fn header_seq_reads_whole_headers_only() {
    let img = encode(&sample_meta(), member(0), 41);
    assert_eq!(format::header_seq(&img[..64]), Some(41));
    let mut bad = img[..64].to_vec();
    bad[20] ^= 1; // the sequence, without fixing the header checksum
    assert_eq!(format::header_seq(&bad), None);
    assert_eq!(format::header_seq(&[0u8; 64]), None);
    assert_eq!(format::header_seq(&img[..63]), None);
}

#[test]
fn a_block_listed_twice_by_one_partition_is_reported() {
    let mut meta = meta4();
    allocate(&mut meta, "p", 4 * MIB, &Placement::Placed(vec![0])).unwrap();
    mark_ready(&mut meta, "p").unwrap();
    assert!(check(&meta).is_empty());
    // Hand edit: its 4 blocks become blocks 0, 1, 0, 1 (two offsets, one place).
    let p = meta
        .partitions
        .iter_mut()
        .find(|p| p.name.as_str() == "p")
        .unwrap();
    p.extents = vec![
        Extent {
            member: member(0),
            start_block: 0,
            blocks: 2,
        },
        Extent {
            member: member(0),
            start_block: 0,
            blocks: 2,
        },
    ];
    let problems = check(&meta);
    assert!(
        problems
            .iter()
            .any(|p| p.to_string().contains("listed twice by p") && !p.repairable()),
        "{problems:?}"
    );
}

/// Blocks grown ahead past a partition's committed size (a writer killed before it gave them
/// back) are reported as reclaimable, and `repair` gives back exactly those: the bytes of the
/// size keep their places, the free map is the table's again.
#[test]
fn blocks_allocated_past_the_end_are_reported_and_repaired() {
    let mut meta = meta4();
    let free0: u64 = meta.used.iter().map(|m| u64::from(m.free_blocks())).sum();
    allocate_with(&mut meta, "g", 0, 0, &Placement::Striped).unwrap();
    mark_ready(&mut meta, "g").unwrap();
    // Grown ahead to 3 groups (12 blocks), committed 3 MiB (one group's worth).
    assert_eq!(grow(&mut meta, "g", 9 * MIB).unwrap(), 12 * MIB);
    set_size(&mut meta, "g", 3 * MIB).unwrap();
    let before = map_of(&meta, "g");
    let problems = check(&meta);
    assert_eq!(
        problems,
        vec![Problem::AllocatedPastEnd {
            partition: Name::new("g").unwrap(),
            blocks: 8
        }]
    );
    assert!(problems[0].repairable());
    assert!(
        problems[0]
            .to_string()
            .contains("allocated past the end, reclaimable")
    );
    assert_eq!(repair(&mut meta), problems);
    assert!(check(&meta).is_empty(), "{:?}", check(&meta));
    let p = meta.partition("g").unwrap();
    assert_eq!((p.size_bytes, allocated_blocks(p)), (3 * MIB, 4));
    let free: u64 = meta.used.iter().map(|m| u64::from(m.free_blocks())).sum();
    assert_eq!(free, free0 - 4);
    let after = map_of(&meta, "g");
    for o in (0..3 * MIB).step_by(4096 * 7) {
        assert_eq!(after.locate(o).unwrap(), before.locate(o).unwrap());
    }
    // A reservation is not past the end: 12 MiB reserved keeps its 12 blocks.
    allocate_with(&mut meta, "r", 0, 12 * MIB, &Placement::Striped).unwrap();
    mark_ready(&mut meta, "r").unwrap();
    assert!(check(&meta).is_empty(), "{:?}", check(&meta));
}

#[test]
fn rename_moves_the_name_and_replaces_only_when_asked() {
    let mut meta = meta4();
    allocate(&mut meta, "a", 3 * MIB, &Placement::Striped).unwrap();
    allocate(&mut meta, "b", 5 * MIB, &Placement::Striped).unwrap();
    mark_ready(&mut meta, "a").unwrap();
    mark_ready(&mut meta, "b").unwrap();
    let free_before: u32 = meta.used.iter().map(BlockMap::free_blocks).sum();
    let gen_a = meta.partition("a").unwrap().generation;
    // Bad names and missing sources change nothing.
    let before = meta.clone();
    assert!(matches!(
        rename(&mut meta, "a", "x/y", true),
        Err(AllocError::Name(_))
    ));
    assert!(matches!(
        rename(&mut meta, "nope", "c", true),
        Err(AllocError::NotFound { .. })
    ));
    assert!(matches!(
        rename(&mut meta, "a", "b", false),
        Err(AllocError::Duplicate { .. })
    ));
    assert_eq!(meta, before);
    rename(&mut meta, "a", "a", true).unwrap();
    assert_eq!(meta, before);
    // Over an existing partition: it is removed, its blocks freed, the source keeps its blocks.
    let extents_a = meta.partition("a").unwrap().extents.clone();
    let blocks_b = allocated_blocks(meta.partition("b").unwrap());
    rename(&mut meta, "a", "b", true).unwrap();
    assert!(meta.partition("a").is_none());
    let b = meta.partition("b").unwrap();
    assert_eq!(b.extents, extents_a);
    assert!(b.generation > gen_a);
    let free_after: u32 = meta.used.iter().map(BlockMap::free_blocks).sum();
    assert_eq!(u64::from(free_after - free_before), blocks_b);
    assert_eq!(check(&meta), vec![]);
}

/// meta4 mirrored, members 0,1 in one failure domain and 2,3 in another.
fn mirrored4() -> VolumeMeta {
    let mut m = meta4();
    m.copies = 2;
    m.member_domains = vec![10, 10, 20, 20];
    m
}

#[test]
fn mirrored_partitions_keep_each_copy_in_another_domain() {
    let mut m = mirrored4();
    allocate(&mut m, "s", 10 * MIB, &Placement::Striped).unwrap();
    allocate_with(&mut m, "p", 0, 3 * MIB, &Placement::Placed(vec![1])).unwrap();
    let grown = grow(&mut m, "p", 7 * MIB).unwrap();
    // Committed as a writer does: blocks grown and not written would be "past the end".
    set_size(&mut m, "p", grown).unwrap();
    for p in &m.partitions {
        let mirror = p
            .mirror
            .as_ref()
            .expect("every partition of a mirrored volume");
        for (a, b) in p.members.iter().zip(&mirror.members) {
            assert_ne!(m.member_domains[a.get()], m.member_domains[b.get()]);
        }
        let map = PartitionMap::new(&m.layout, p).unwrap();
        let copies = map.mirror().unwrap();
        assert_eq!(map.capacity_bytes(), copies.capacity_bytes());
        // split_copies: each pair is the same partition bytes on two members, and the pairs
        // cover the request in order.
        let len = map.capacity_bytes() - 8192;
        let pairs = map.split_copies(4096, len).unwrap();
        let mut next = 0;
        for pair in &pairs {
            let c = pair.mirror.unwrap();
            assert_eq!(pair.primary.buf_offset_bytes, next);
            assert_eq!(c.buf_offset_bytes, next);
            assert_eq!(pair.primary.len_bytes, c.len_bytes);
            assert_ne!(pair.primary.member, c.member);
            for at in [0, pair.primary.len_bytes - 1] {
                let off = 4096 + next + at;
                let (lp, lc) = (map.locate(off).unwrap(), copies.locate(off).unwrap());
                assert_eq!(lp.member, pair.primary.member);
                assert_eq!(
                    lp.member_offset_bytes,
                    pair.primary.member_offset_bytes + at
                );
                assert_eq!(lc.member, c.member);
                assert_eq!(lc.member_offset_bytes, c.member_offset_bytes + at);
            }
            next += pair.primary.len_bytes;
        }
        assert_eq!(next, len);
    }
    mark_ready(&mut m, "s").unwrap();
    mark_ready(&mut m, "p").unwrap();
    assert_eq!(check(&m), vec![]);
    // Copies take blocks too: the free maps count both.
    let used: u64 = m
        .used
        .iter()
        .map(|u| u64::from(u.blocks() - u.free_blocks()))
        .sum();
    let owned: u64 = m
        .partitions
        .iter()
        .flat_map(|p| p.all_extents())
        .map(|e| u64::from(e.blocks))
        .sum();
    assert_eq!(used, owned);
    assert_eq!(owned, 2 * (12 + 7));
    // Version 3 round trip; trim and truncate give back both copies' blocks.
    let img = encode(&m, member(2), 5);
    assert_eq!(u32::from_le_bytes(img[8..12].try_into().unwrap()), 3);
    assert_eq!(decode(&img).unwrap().meta, m);
    set_size(&mut m, "p", 5 * MIB).unwrap();
    truncate(&mut m, "p", MIB).unwrap();
    free(&mut m, "s").unwrap();
    assert_eq!(check(&m), vec![]);
    let owned: u64 = m
        .partitions
        .iter()
        .flat_map(|p| p.all_extents())
        .map(|e| u64::from(e.blocks))
        .sum();
    assert_eq!(owned, 2);
}

#[test]
fn unmirrored_volumes_are_still_written_as_version_2() {
    let mut m = meta4();
    allocate(&mut m, "a", 3 * MIB, &Placement::Striped).unwrap();
    let img = encode(&m, member(0), 1);
    assert_eq!(u32::from_le_bytes(img[8..12].try_into().unwrap()), 2);
    assert_eq!(decode(&img).unwrap().meta, m);
}

#[test]
fn a_mirror_in_one_failure_domain_is_refused() {
    let mut m = mirrored4();
    m.member_domains = vec![10; 4];
    let before = m.clone();
    let e = allocate(&mut m, "s", MIB, &Placement::Striped).unwrap_err();
    assert!(matches!(e, AllocError::NoMirror { .. }), "{e}");
    assert_eq!(m, before, "a refused allocation changes nothing");
}

#[test]
fn assembly_of_a_mirrored_volume_survives_one_lost_member() {
    let mut m = mirrored4();
    allocate(&mut m, "s", 8 * MIB, &Placement::Striped).unwrap();
    mark_ready(&mut m, "s").unwrap();
    let copy = |i: usize| MemberCopy {
        size_bytes: m.layout.member_sizes_bytes()[i],
        chosen: Chosen {
            decoded: DecodedMeta {
                meta: m.clone(),
                member: member(i),
                seq: 4,
            },
            slot: Slot::B,
            other_error: None,
        },
    };
    // Member 1 missing: its blocks' copies are on member 3 (and its copies' blocks on 0).
    let a = assemble(&[copy(0), copy(2), copy(3)]).unwrap();
    assert_eq!(a.failed, vec![member(1)]);
    assert_eq!(a.positions, vec![Some(0), None, Some(1), Some(2)]);
    // Members 1 and 3 hold both copies of slot 1: nothing can read it.
    let e = assemble(&[copy(0), copy(2)]).unwrap_err();
    assert!(matches!(e, MembershipError::BothCopiesLost { .. }), "{e}");
    // A member shorter than recorded is a failed one too.
    let mut short = copy(2);
    short.size_bytes -= MIB;
    let a = assemble(&[copy(0), copy(1), short, copy(3)]).unwrap();
    assert_eq!(a.failed, vec![member(2)]);
    // Unmirrored volumes still need every member.
    let mut plain = copy(0);
    plain.chosen.decoded.meta.copies = 1;
    assert!(matches!(
        assemble(&[plain]),
        Err(MembershipError::MissingMember { .. })
    ));
}

/// Sets the version field of a slot image and its header checksum.
fn with_version(img: &[u8], version: u32) -> Vec<u8> {
    let mut img = img.to_vec();
    img[8..12].copy_from_slice(&version.to_le_bytes());
    let crc = crate::crc::crc32c(&img[0..60]);
    img[60..64].copy_from_slice(&crc.to_le_bytes());
    img
}

/// A mount shows partitions as files: a table of PARTITIONS_MAX (2048) one-block partitions,
/// every one of them empty-grown as a small file is, round-trips; the next one is refused;
/// the version written is the oldest that holds the table (4 only above 256).
#[test]
fn partition_table_holds_partitions_max_and_refuses_one_more() {
    let blocks = PARTITIONS_MAX as u64 + 8;
    for mirrored in [false, true] {
        let mut m = meta_with(
            vec![META_AREA_BYTES + blocks * 64 * 1024; 2],
            64 * 1024,
            64 * 1024,
        );
        if mirrored {
            m.copies = 2;
            m.member_domains = vec![1, 2];
        }
        let place = Placement::Placed(vec![0]);
        for i in 0..PARTITIONS_MAX {
            allocate_with(&mut m, &format!("f{i:04}.idx"), 0, 0, &place).unwrap();
            let name = format!("f{i:04}.idx");
            let grown = grow(&mut m, &name, 100).unwrap();
            set_size(&mut m, &name, grown.min(100)).unwrap();
            mark_ready(&mut m, &name).unwrap();
            let expect = if i + 1 > PARTITIONS_MAX_V3 {
                4
            } else if mirrored {
                3
            } else {
                2
            };
            if i + 1 == PARTITIONS_MAX_V3 || i + 1 == PARTITIONS_MAX_V3 + 1 {
                assert_eq!(m.format_version(), expect, "{} partitions", i + 1);
            }
        }
        assert_eq!(m.format_version(), format::META_VERSION_WIDE);
        assert_eq!(check(&m), vec![]);
        let img = encode(&m, member(1), 9);
        let d = decode(&img).unwrap();
        assert_eq!(d.meta, m);
        assert_eq!(d.meta.partitions.len(), PARTITIONS_MAX);
        // One more: refused, the meta unchanged.
        let before = m.clone();
        assert_eq!(
            allocate_with(&mut m, "one-more", 0, 0, &place),
            Err(AllocError::TooManyPartitions)
        );
        assert_eq!(m, before);
        let msg = AllocError::TooManyPartitions.to_string();
        assert!(msg.contains("2048 partitions"), "{msg}");
        // Back to 256: written as version 2 (3 mirrored) again, for older penstocks.
        while m.partitions.len() > PARTITIONS_MAX_V3 {
            let name = m.partitions.last().unwrap().name.to_string();
            free(&mut m, &name).unwrap();
        }
        let img = encode(&m, member(0), 10);
        assert_eq!(img[8..12], (if mirrored { 3u32 } else { 2 }).to_le_bytes());
        assert_eq!(decode(&img).unwrap().meta, m);
    }
}

/// Versions 1 to 3 hold at most 256 partitions: an image claiming more under those
/// versions is refused as corrupt, naming the limit of its version; a version 4 image of
/// few partitions (never written, but harmless) reads.
#[test]
fn versions_before_4_hold_at_most_256_partitions() {
    let mut m = meta_with(vec![META_AREA_BYTES + 64 * MIB; 1], 64 * 1024, 64 * 1024);
    for i in 0..=PARTITIONS_MAX_V3 {
        allocate_with(&mut m, &format!("p{i}"), 0, 0, &Placement::Striped).unwrap();
    }
    let v4 = encode(&m, member(0), 3);
    assert_eq!(v4[8..12], 4u32.to_le_bytes());
    let v3 = with_version(&v4, 3);
    match decode(&v3) {
        Err(MetaError::Corrupt { what }) => {
            assert!(
                what.contains("257 partitions, at most 256 in version 3"),
                "{what}"
            )
        }
        other => panic!("{other:?}"),
    }
    // Version 4 has version 3's layout: a version 3 image relabelled 4 reads the same.
    let mut few = mirrored4();
    allocate(&mut few, "one", MIB, &Placement::Striped).unwrap();
    let v3 = encode(&few, member(0), 3);
    assert_eq!(v3[8..12], 3u32.to_le_bytes());
    assert_eq!(decode(&with_version(&v3, 4)).unwrap().meta, few);
}

/// On a wide striped volume the extent bound, not the partition bound, limits the files of a
/// mount: each one-block file of a 16-member volume takes 16 extents, so 1024 fit (16384
/// extents) and the next one's growth is refused, saying why, the meta unchanged.
#[test]
fn extents_bound_the_small_partitions_of_a_wide_volume() {
    let mut m = meta_with(
        vec![META_AREA_BYTES + 1100 * 64 * 1024; MEMBERS_MAX],
        64 * 1024,
        64 * 1024,
    );
    for i in 0..1024 {
        let name = format!("f{i}");
        allocate_with(&mut m, &name, 0, 0, &Placement::Striped).unwrap();
        grow(&mut m, &name, 1).unwrap();
        set_size(&mut m, &name, 1).unwrap();
        mark_ready(&mut m, &name).unwrap();
    }
    assert_eq!(alloc::extents_total(&m), EXTENTS_MAX);
    allocate_with(&mut m, "next", 0, 0, &Placement::Striped).unwrap();
    let before = m.clone();
    let e = grow(&mut m, "next", 1).unwrap_err();
    assert_eq!(e, AllocError::TooManyExtents);
    assert!(e.to_string().contains("--place"), "{e}");
    assert_eq!(m, before);
    // Placed on one member, a small partition takes one extent: refused all the same here
    // (the table is full), and accepted once a striped one is gone.
    assert_eq!(
        grow(&mut m, "next", 1).unwrap_err(),
        AllocError::TooManyExtents
    );
    free(&mut m, "f0").unwrap();
    allocate_with(&mut m, "one", 0, 0, &Placement::Placed(vec![3])).unwrap();
    grow(&mut m, "one", 1).unwrap();
    set_size(&mut m, "one", 1).unwrap();
    for name in ["one", "next"] {
        mark_ready(&mut m, name).unwrap();
    }
    let problems = check(&m);
    assert!(
        problems.is_empty(),
        "{} problems: {:?}",
        problems.len(),
        problems.first()
    );
}

// ---- Block checksums (format version 5) ----

use super::sums::{
    self, SUM_ENTRY_BYTES, SUM_UNIT_BYTES, entry_offset_bytes, layout_with_sums, needed_bytes,
    sealed_records, units_of,
};

#[test]
fn a_volume_with_sums_is_version_5_and_round_trips() {
    let layout =
        layout_with_sums(vec![64 * MIB, 80 * MIB], STRIPE_UNIT_BYTES_DEFAULT, MIB).unwrap();
    assert!(sums::area_fits(&layout));
    // 80 MiB: 2 MiB of metadata, then 77 blocks of 1 MiB need 77 × 256 × 16 bytes of records.
    assert_eq!(layout.data_start_bytes(), META_AREA_BYTES + 77 * 256 * 16);
    let mut m = VolumeMeta::new(VolumeUuid([3; 16]), Name::new("v").unwrap(), layout);
    m.sums = true;
    assert_eq!(m.format_version(), format::META_VERSION_SUMS);
    allocate(&mut m, "p", 3 * MIB, &Placement::Striped).unwrap();
    mark_ready(&mut m, "p").unwrap();
    let d = decode(&encode(&m, member(1), 4)).unwrap();
    assert_eq!(d.meta, m);
    // Without sums: the version of before, no trailer.
    let mut plain = m.clone();
    plain.sums = false;
    assert_eq!(plain.format_version(), format::META_VERSION_UNMIRRORED);
    assert_eq!(decode(&encode(&plain, member(0), 4)).unwrap().meta, plain);
}

#[test]
fn a_version_5_image_whose_data_start_leaves_no_sum_area_is_corrupt() {
    // The encoder refuses such a meta (a bug), so forge one: a version 3 image (no
    // partitions, 2 copies) whose data starts one page after the slots, made version 5 by its
    // trailer, the body's length and both checksums rewritten.
    let layout = VolumeLayout::with_data_start(
        vec![64 * MIB, 64 * MIB],
        STRIPE_UNIT_BYTES_DEFAULT,
        MIB,
        META_AREA_BYTES + ALIGN_BYTES,
    )
    .unwrap();
    let mut m = VolumeMeta::new(VolumeUuid([3; 16]), Name::new("v").unwrap(), layout);
    m.copies = 2;
    let mut img = encode(&m, member(0), 1);
    assert_eq!(img[8], 3);
    img[8] = 5;
    let h = format::META_HEADER_BYTES;
    let body_len = u32::from_le_bytes(img[24..28].try_into().unwrap()) as usize;
    img[h + body_len..h + body_len + 4].copy_from_slice(&4096u32.to_le_bytes());
    let body_len = body_len + 4;
    img[24..28].copy_from_slice(&(body_len as u32).to_le_bytes());
    let crc = crate::crc::crc32c(&img[h..h + body_len]);
    img[28..32].copy_from_slice(&crc.to_le_bytes());
    let hcrc = crate::crc::crc32c(&img[0..60]);
    img[60..64].copy_from_slice(&hcrc.to_le_bytes());
    match decode(&img) {
        Err(MetaError::Corrupt { what }) => assert!(what.contains("sum area"), "{what}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_record_is_tagged_and_a_zeroed_one_is_missing() {
    let e = SumEntry::of(b"hello");
    assert_eq!(SumEntry::decode(&e.encode()), Some(e));
    assert_eq!(SumEntry::decode(&[0u8; 8]), None);
    let mut over = SumEntry { crc: 1, len: 4097 }.encode();
    assert_eq!(SumEntry::decode(&over), None);
    over[4..6].copy_from_slice(&4096u16.to_le_bytes());
    assert!(SumEntry::decode(&over).is_some());
    let r = SumRecord::default().sealed(b"hello").sealed(b"hello world");
    assert_eq!(SumRecord::decode(&r.encode()), r);
    assert_eq!(r.old, Some(e));
    assert_eq!(SumRecord::decode(&[0u8; 16]), SumRecord::default());
    assert_eq!(
        SumRecord::default().verify(b"x", 1),
        Err(SumFailure::Missing)
    );
    assert_eq!(SumRecord::default().verify(b"", 0), Ok(()));
    // The older checksum still verifies the bytes it covered; the newest the new ones.
    assert_eq!(r.verify(b"hello", 5), Ok(()));
    assert_eq!(r.verify(b"hello world", 11), Ok(()));
    assert!(r.verify(b"jello world", 11).is_err());
}

/// A member's data and records as the driver keeps them, and what is durable: a write that
/// rewrites committed bytes first syncs, then writes and syncs the records of the units it
/// touches below the committed size as they will be (the previous newest checksum kept as the
/// older one), then the data; a commit syncs the data, seals the units written since the last
/// one (each record covering its unit's bytes below the new size), syncs the records.
#[derive(Clone)]
struct FakeMember {
    data: Vec<u8>,
    records: Vec<SumRecord>,
    dirty: Vec<bool>,
    durable: (Vec<u8>, Vec<SumRecord>),
    committed: usize,
}

const UNIT: usize = SUM_UNIT_BYTES as usize;

impl FakeMember {
    fn new(units: usize) -> FakeMember {
        let data = vec![0; units * UNIT];
        let records = vec![SumRecord::default(); units];
        FakeMember {
            durable: (data.clone(), records.clone()),
            data,
            records,
            dirty: vec![false; units],
            committed: 0,
        }
    }

    fn write(&mut self, offset: usize, bytes: &[u8]) {
        let end = offset + bytes.len();
        if offset < self.committed {
            // Seal ahead: sync, the records as they will be, sync, then the data.
            self.durable.0 = self.data.clone();
            let r = units_of(offset as u64, (end.min(self.committed) - offset) as u64);
            for u in r.start as usize / UNIT..r.end as usize / UNIT {
                let a = u * UNIT;
                let mut content = self.data[a..a + UNIT].to_vec();
                let (from, to) = (a.max(offset), (a + UNIT).min(end));
                content[from - a..to - a].copy_from_slice(&bytes[from - offset..to - offset]);
                // The committed bytes only: bytes past the size may be written again
                // before the next commit (no seal then), and must not be covered.
                let valid = (self.committed - a).min(UNIT);
                self.records[u] = self.records[u].sealed(&content[..valid]);
            }
            self.durable.1 = self.records.clone();
        }
        self.data[offset..end].copy_from_slice(bytes);
        let r = units_of(offset as u64, bytes.len() as u64);
        for u in r.start as usize / UNIT..r.end as usize / UNIT {
            self.dirty[u] = true;
        }
    }

    /// Syncs the data and seals the dirty units for `size`: a commit up to its last sync.
    fn sync_and_seal(&mut self, size: usize) {
        self.durable.0 = self.data.clone();
        for u in 0..self.dirty.len() {
            if std::mem::take(&mut self.dirty[u]) {
                let a = u * UNIT;
                let sealed = sealed_records(
                    &self.data[a..a + UNIT],
                    size.saturating_sub(a),
                    &self.records[u..u + 1],
                );
                self.records[u] = sealed[0];
            }
        }
    }

    fn commit(&mut self, size: usize) {
        self.sync_and_seal(size);
        self.durable.1 = self.records.clone();
        self.committed = size;
    }

    /// A crash: each unit's data and record are independently what is durable or what was
    /// written since (whole units: no torn page), `pick(unit)` saying which; the size is the
    /// committed one.
    fn crash(&mut self, pick: impl Fn(usize) -> (bool, bool)) {
        for u in 0..self.records.len() {
            let (new_data, new_record) = pick(u);
            let a = u * UNIT;
            if !new_data {
                self.data[a..a + UNIT].copy_from_slice(&self.durable.0[a..a + UNIT]);
            }
            if !new_record {
                self.records[u] = self.durable.1[u];
            }
        }
        self.dirty.fill(false);
    }

    /// The units that do not verify for a size of `size`.
    fn bad_units(&self, size: usize) -> Vec<usize> {
        (0..self.records.len())
            .filter(|&u| {
                let need = needed_bytes((u * UNIT) as u64, size as u64);
                self.records[u]
                    .verify(&self.data[u * UNIT..(u + 1) * UNIT], need)
                    .is_err()
            })
            .collect()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Appends and overwrites of any sizes, committed now and then: after each commit every
    /// byte below the size verifies; a flipped bit in a byte a reader gets fails exactly its
    /// unit; and a crash at any point — each unit's bytes and record independently old or
    /// new — leaves every unit below the committed size verifying.
    #[test]
    fn checksum_bookkeeping_survives_crashes_and_finds_every_flip(
        writes in prop::collection::vec(
            (0usize..40_000, 1usize..9_000, any::<u8>(), any::<bool>(), any::<bool>()),
            1..24,
        ),
        crash_picks in any::<u64>(),
        flip in 0usize..48_000,
        bit in 0u8..8,
    ) {
        let units = 12;
        let cap = units * UNIT;
        let mut m = FakeMember::new(units);
        let mut end = 0usize;
        for (at, len, fill, append, commit) in writes {
            let at = if append { end } else { at.min(end) };
            let len = len.min(cap - at);
            if len > 0 {
                let bytes: Vec<u8> = (0..len).map(|i| fill.wrapping_add(i as u8)).collect();
                m.write(at, &bytes);
                end = end.max(at + len);
            }
            if commit {
                m.commit(end);
                prop_assert_eq!(m.bad_units(end), Vec::<usize>::new());
            }
        }
        // A crash now, between writes: what was committed still reads.
        let pick = |u: usize| (crash_picks >> (2 * u) & 1 == 1, crash_picks >> (2 * u + 1) & 1 == 1);
        let mut crashed = m.clone();
        crashed.crash(pick);
        prop_assert_eq!(crashed.bad_units(m.committed), Vec::<usize>::new());
        // And in the middle of the next commit (data synced, sealed, records not synced).
        let mut crashed = m.clone();
        crashed.sync_and_seal(end);
        crashed.crash(pick);
        prop_assert_eq!(crashed.bad_units(m.committed), Vec::<usize>::new());
        // A flip in a byte a reader gets, after a final commit: found, in its unit only.
        m.commit(end);
        prop_assume!(end > 0);
        let flip = flip % end;
        m.data[flip] ^= 1 << bit;
        prop_assert_eq!(m.bad_units(end), vec![flip / UNIT]);
    }

    /// The geometry: any member sizes give a layout whose sum area holds a record for every
    /// unit of every member's blocks, inside the area, and costs no more blocks than the
    /// records and a page take.
    #[test]
    fn the_sum_area_holds_every_units_record(
        sizes in prop::collection::vec(3u64..4000, 1..5),
        block_shift in 0u32..5,
    ) {
        let block = (64 << 10) << block_shift;
        let sizes: Vec<u64> = sizes.iter().map(|s| META_AREA_BYTES + s * 256 * 1024).collect();
        let Ok(layout) = layout_with_sums(sizes.clone(), 64 << 10, block) else {
            return Ok(()); // members too small for one block after the area
        };
        prop_assert!(sums::area_fits(&layout));
        for m in layout.members() {
            let blocks = layout.member_blocks(m);
            let last = layout.block_offset_bytes(blocks - 1) + block - SUM_UNIT_BYTES;
            prop_assert_eq!(entry_offset_bytes(&layout, layout.data_start_bytes()), META_AREA_BYTES);
            prop_assert!(entry_offset_bytes(&layout, last) + SUM_ENTRY_BYTES <= layout.data_start_bytes());
        }
        let plain = VolumeLayout::new(sizes, 64 << 10, block).unwrap();
        let largest = layout.members().max_by_key(|m| layout.member_sizes_bytes()[m.get()]).unwrap();
        let (with, without) = (u64::from(layout.member_blocks(largest)), u64::from(plain.member_blocks(largest)));
        let cost_bytes = without * (block / SUM_UNIT_BYTES) * SUM_ENTRY_BYTES + ALIGN_BYTES;
        prop_assert!(with <= without);
        prop_assert!((without - with) * block <= cost_bytes + block, "{} of {}", with, without);
    }
}
