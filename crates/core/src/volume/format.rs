//! The on-disk metadata image: superblock, partition table and free-block map, in two slots.
//!
//! The format is specified (and defended) in `docs/volume-format.md`; this module is the
//! reference encoder and a strict decoder. Bytes read from a disk never cause a panic: every
//! length, count and index is checked before use, and anything unexpected is a [`MetaError`].
//!
//! Crash safety comes from two slots per member and a sequence number: an update writes the
//! slot *not* holding the newest valid copy, so a torn write can only damage the older copy.
//! The slot of a copy is fixed by its sequence parity (odd → [`Slot::A`], even → [`Slot::B`]),
//! so "write the other slot" is simply "write sequence + 1".

use std::fmt;

use super::layout::{
    Extent, MemberIndex, Mirror, Partition, PartitionKind, PartitionState, VolumeLayout,
};
use super::{
    BLOCKS_PER_MEMBER_MAX, COPIES_MAX, EXTENTS_MAX, MEMBER_PATH_BYTES_MAX, MEMBERS_MAX,
    NAME_BYTES_MAX, Name, PARTITIONS_MAX, PARTITIONS_MAX_V3,
};

/// Bytes of one metadata slot; slot A at member offset 0, slot B right after it.
pub const META_SLOT_BYTES: u64 = 1 << 20;
/// The metadata area at the start of every member: two slots.
pub const META_AREA_BYTES: u64 = 2 * META_SLOT_BYTES;
/// Identifies a penstock volume member ("PeNSTocK VOLume").
pub const META_MAGIC: [u8; 8] = *b"PNSTKVOL";
/// The newest format version this code writes: 4, the layout of version 3 with a partition
/// table of up to [`PARTITIONS_MAX`] partitions (versions 1 to 3 hold at most
/// [`PARTITIONS_MAX_V3`]). Each volume is written in the oldest version that can express it,
/// so that older penstocks keep reading what they can: version 4 only for a table of more
/// than [`PARTITIONS_MAX_V3`] partitions (an older penstock then says "unknown version",
/// not "corrupt"); version 3 for mirroring (a copy count, each member's failure domain and
/// state, each partition's mirror); else version 2 (growable partitions: a reservation and
/// a generation per partition). Version 1 is read too: its partitions become fixed-size ones
/// (reserve = size, generation 1) and are written back as version 2 by the next update.
pub const META_VERSION: u32 = 5;
/// The version written for a volume with block checksums ([`VolumeMeta::sums`]): the layout
/// of version 4 and, after the member paths, the sum unit (`docs/volume-format.md`).
pub const META_VERSION_SUMS: u32 = 5;
/// The version written for a table of more than [`PARTITIONS_MAX_V3`] partitions without
/// checksums.
pub const META_VERSION_WIDE: u32 = 4;
/// The version written for a mirrored volume (or one with a member not ok) of at most
/// [`PARTITIONS_MAX_V3`] partitions.
pub const META_VERSION_MIRRORED: u32 = 3;
/// The version written for volumes that use nothing of version 3.
pub const META_VERSION_UNMIRRORED: u32 = 2;
/// The oldest format version this code reads.
pub const META_VERSION_MIN: u32 = 1;
/// Bytes of the slot header (magic, version, sequence, lengths, checksums).
pub const META_HEADER_BYTES: usize = 64;

const SLOT_BYTES: usize = META_SLOT_BYTES as usize;
const BODY_BYTES_MAX: usize = SLOT_BYTES - META_HEADER_BYTES;
// The largest possible body (see docs/volume-format.md) fits a slot:
// superblock + partitions + extents + maps.
const _: () = assert!(
    24 + 1
        + NAME_BYTES_MAX
        + 2
        + 2
        + 8 * 3
        + 8 * MEMBERS_MAX
        + 2
        + PARTITIONS_MAX * (1 + NAME_BYTES_MAX + 1 + 1 + MEMBERS_MAX + 8 * 3 + 1 + 4)
        + EXTENTS_MAX * 9
        + MEMBERS_MAX * (4 + (BLOCKS_PER_MEMBER_MAX as usize) / 8)
        + MEMBERS_MAX * (2 + MEMBER_PATH_BYTES_MAX)
        // versions 3 and 4: copies, domain and state per member, a mirror per partition.
        + 1
        + MEMBERS_MAX * 9
        + PARTITIONS_MAX * (1 + 1 + MEMBERS_MAX + 4)
        <= BODY_BYTES_MAX
);

/// A volume's identity, made by the driver at creation (random) and recorded on every member.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct VolumeUuid(pub [u8; 16]);

impl fmt::Display for VolumeUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for VolumeUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VolumeUuid({self})")
    }
}

/// Which blocks of one member are in use: one bit per block, set = used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockMap {
    blocks: u32,
    words: Vec<u64>,
}

impl BlockMap {
    /// A map of `blocks` free blocks.
    pub fn new(blocks: u32) -> BlockMap {
        BlockMap {
            blocks,
            words: vec![0; (blocks as usize).div_ceil(64)],
        }
    }

    /// Number of blocks the map covers.
    pub fn blocks(&self) -> u32 {
        self.blocks
    }

    /// Whether `block` is used. Panics when `block` is outside the map (a caller bug).
    pub fn is_used(&self, block: u32) -> bool {
        assert!(
            block < self.blocks,
            "block {block} outside a map of {}",
            self.blocks
        );
        self.words[block as usize / 64] & (1 << (block % 64)) != 0
    }

    /// Marks `block` used or free.
    pub fn set(&mut self, block: u32, used: bool) {
        assert!(
            block < self.blocks,
            "block {block} outside a map of {}",
            self.blocks
        );
        let bit = 1u64 << (block % 64);
        let word = &mut self.words[block as usize / 64];
        if used { *word |= bit } else { *word &= !bit }
    }

    /// Number of free blocks.
    pub fn free_blocks(&self) -> u32 {
        let used: u32 = self.words.iter().map(|w| w.count_ones()).sum();
        self.blocks - used
    }

    /// The free blocks, lowest first.
    pub fn free_iter(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.blocks).filter(|&b| !self.is_used(b))
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.blocks.to_le_bytes());
        let bytes = (self.blocks as usize).div_ceil(8);
        let start = out.len();
        for w in &self.words {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.truncate(start + bytes);
    }
}

/// Everything a volume's metadata says, identical on every member (only the member index in the
/// superblock differs, and it is passed to [`encode`] separately).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeMeta {
    pub uuid: VolumeUuid,
    pub name: Name,
    pub layout: VolumeLayout,
    pub partitions: Vec<Partition>,
    /// One map per member, by member index.
    pub used: Vec<BlockMap>,
    /// Where each member was when the volume was created, by member index (empty: unknown).
    /// A hint, not an identity: opening a volume by one member's path finds the others here,
    /// and each is still checked by uuid and index, so a renamed device is reported missing
    /// (with the path it was last seen at) rather than silently mistaken.
    pub member_paths: Vec<String>,
    /// Copies of every block: 1, or 2 in a mirrored volume (each partition then has a
    /// [`Mirror`]).
    pub copies: u8,
    /// Each member's failure domain, by member index: the device it was on when it joined
    /// the volume (`st_dev` of a file, the device number of a block device). A block's two
    /// copies are placed in different domains. Zeros in an unmirrored volume.
    pub member_domains: Vec<u64>,
    /// Each member's health, by member index (all [`MemberState::Ok`] unless mirrored).
    pub member_states: Vec<MemberState>,
    /// Every member keeps a crc32c per 4 KiB of its data area in its sum area, between the
    /// metadata slots and the data start ([`super::sums`]; format version 5). `false` for
    /// volumes of versions 1 to 4, which are read and written without verification.
    pub sums: bool,
}

/// A member's health in a mirrored volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemberState {
    /// Both reads and writes use it.
    Ok,
    /// It failed (a read error, missing, bad metadata, shorter than recorded): nothing reads
    /// or writes it, the mirror serves its blocks. `volume replace` swaps it for a new member.
    Degraded,
    /// A replacement (or a degraded member being rebuilt in place): writes go to it, reads do
    /// not, until `volume check --repair` has copied every block it holds from the mirror.
    Rebuilding,
}

impl MemberState {
    /// Whether reads may use the member.
    pub fn readable(self) -> bool {
        self == MemberState::Ok
    }

    /// Whether writes (data and metadata) go to the member.
    pub fn writable(self) -> bool {
        self != MemberState::Degraded
    }
}

impl fmt::Display for MemberState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MemberState::Ok => "ok",
            MemberState::Degraded => "degraded",
            MemberState::Rebuilding => "rebuilding",
        })
    }
}

impl VolumeMeta {
    /// A new volume with no partition and every block free.
    pub fn new(uuid: VolumeUuid, name: Name, layout: VolumeLayout) -> VolumeMeta {
        let used = layout
            .members()
            .map(|m| BlockMap::new(layout.member_blocks(m)))
            .collect();
        let member_paths = vec![String::new(); layout.member_count()];
        let member_domains = vec![0; layout.member_count()];
        let member_states = vec![MemberState::Ok; layout.member_count()];
        VolumeMeta {
            uuid,
            name,
            layout,
            partitions: Vec::new(),
            used,
            member_paths,
            copies: 1,
            member_domains,
            member_states,
            sums: false,
        }
    }

    /// Whether the volume keeps two copies of every block.
    pub fn mirrored(&self) -> bool {
        self.copies >= 2
    }

    /// The format version [`encode`] writes for this meta, the oldest that expresses it: 4
    /// for more than [`PARTITIONS_MAX_V3`] partitions, else 3 when it uses mirroring, else 2.
    pub fn format_version(&self) -> u32 {
        let v3 = self.copies > 1
            || self.member_states.iter().any(|s| *s != MemberState::Ok)
            || self.partitions.iter().any(|p| p.mirror.is_some());
        if self.sums {
            META_VERSION_SUMS
        } else if self.partitions.len() > PARTITIONS_MAX_V3 {
            META_VERSION_WIDE
        } else if v3 {
            META_VERSION_MIRRORED
        } else {
            META_VERSION_UNMIRRORED
        }
    }

    /// The partition called `name`.
    pub fn partition(&self, name: &str) -> Option<&Partition> {
        self.partitions.iter().find(|p| p.name.as_str() == name)
    }
}

/// One of the two metadata copies at the start of a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Slot {
    /// At member offset 0; holds odd sequence numbers.
    A,
    /// At member offset [`META_SLOT_BYTES`]; holds even sequence numbers.
    B,
}

impl Slot {
    /// The slot a copy with sequence `seq` is written to.
    pub fn for_seq(seq: u64) -> Slot {
        if seq % 2 == 1 { Slot::A } else { Slot::B }
    }

    /// The slot's byte offset on the member.
    pub fn offset_bytes(self) -> u64 {
        match self {
            Slot::A => 0,
            Slot::B => META_SLOT_BYTES,
        }
    }
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Slot::A => "A",
            Slot::B => "B",
        })
    }
}

/// A decoded slot: the metadata, the member it was read from, its sequence number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedMeta {
    pub meta: VolumeMeta,
    pub member: MemberIndex,
    pub seq: u64,
}

/// Why a metadata slot was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MetaError {
    #[error("metadata slot of {len_bytes} bytes: a slot is {META_SLOT_BYTES} bytes")]
    SlotSize { len_bytes: usize },
    #[error(
        "no penstock volume magic: not a member of any penstock volume (or the header is destroyed)"
    )]
    BadMagic,
    #[error(
        "metadata format version {found}: this penstock reads versions {META_VERSION_MIN} to {META_VERSION} (a newer penstock wrote it?)"
    )]
    UnknownVersion { found: u32 },
    #[error(
        "header checksum mismatch (stored {stored:#010x}, computed {computed:#010x}): corrupt header"
    )]
    HeaderChecksum { stored: u32, computed: u32 },
    #[error(
        "body checksum mismatch (stored {stored:#010x}, computed {computed:#010x}): corrupt or torn write"
    )]
    BodyChecksum { stored: u32, computed: u32 },
    #[error("corrupt metadata: {what}")]
    Corrupt { what: String },
    #[error("sequence {seq} found in slot {slot}: slot {slot} holds {} sequences", if *.slot == Slot::A { "odd" } else { "even" })]
    WrongSlot { slot: Slot, seq: u64 },
    #[error("both metadata copies are bad: slot A: {a}; slot B: {b}")]
    BothSlotsBad {
        a: Box<MetaError>,
        b: Box<MetaError>,
    },
}

fn corrupt(what: impl Into<String>) -> MetaError {
    MetaError::Corrupt { what: what.into() }
}

/// Encodes `meta` as the slot image for `member` with sequence `seq`: exactly
/// [`META_SLOT_BYTES`] bytes (zero padded), to be written at [`Slot::for_seq`]`(seq)`.
///
/// Panics if `meta` exceeds the format's limits (more than [`PARTITIONS_MAX`] partitions or
/// [`EXTENTS_MAX`] extents, maps not matching the layout): [`super::allocate`] never builds
/// such a meta, so that is a caller bug, and writing it would make an unreadable member.
pub fn encode(meta: &VolumeMeta, member: MemberIndex, seq: u64) -> Vec<u8> {
    let layout = &meta.layout;
    assert!(
        member.get() < layout.member_count(),
        "member {member} not in the volume"
    );
    assert!(
        meta.partitions.len() <= PARTITIONS_MAX,
        "too many partitions"
    );
    let extents: usize = meta
        .partitions
        .iter()
        .map(|p| p.all_extents().count())
        .sum();
    assert!(extents <= EXTENTS_MAX, "too many extents");
    let version = meta.format_version();
    let v3 = version >= 3;
    assert!(
        (1..=COPIES_MAX).contains(&meta.copies),
        "copies must be 1..={COPIES_MAX}"
    );
    assert_eq!(
        meta.member_domains.len(),
        layout.member_count(),
        "one domain per member"
    );
    assert_eq!(
        meta.member_states.len(),
        layout.member_count(),
        "one state per member"
    );
    assert_eq!(
        meta.used.len(),
        layout.member_count(),
        "one block map per member"
    );

    let mut body = Vec::with_capacity(64 << 10);
    // Superblock.
    body.extend_from_slice(&meta.uuid.0);
    put_name(&mut body, &meta.name);
    body.extend_from_slice(&(member.get() as u16).to_le_bytes());
    body.extend_from_slice(&(layout.member_count() as u16).to_le_bytes());
    body.extend_from_slice(&layout.stripe_unit_bytes().to_le_bytes());
    body.extend_from_slice(&layout.block_bytes().to_le_bytes());
    body.extend_from_slice(&layout.data_start_bytes().to_le_bytes());
    for size in layout.member_sizes_bytes() {
        body.extend_from_slice(&size.to_le_bytes());
    }
    if v3 {
        body.push(meta.copies);
        for (domain, state) in meta.member_domains.iter().zip(&meta.member_states) {
            body.extend_from_slice(&domain.to_le_bytes());
            body.push(match state {
                MemberState::Ok => 1,
                MemberState::Degraded => 2,
                MemberState::Rebuilding => 3,
            });
        }
    }
    // Partition table.
    body.extend_from_slice(&(meta.partitions.len() as u16).to_le_bytes());
    for p in &meta.partitions {
        put_name(&mut body, &p.name);
        body.push(match p.kind {
            PartitionKind::Striped => 1,
            PartitionKind::Placed => 2,
        });
        assert!(p.members.len() <= MEMBERS_MAX, "too many partition members");
        body.push(p.members.len() as u8);
        body.extend(p.members.iter().map(|m| m.get() as u8));
        body.extend_from_slice(&p.size_bytes.to_le_bytes());
        body.extend_from_slice(&p.reserve_bytes.to_le_bytes());
        body.extend_from_slice(&p.generation.to_le_bytes());
        body.push(match p.state {
            PartitionState::Creating => 1,
            PartitionState::Ready => 2,
        });
        put_extents(&mut body, &p.extents);
        if v3 {
            match &p.mirror {
                None => body.push(0),
                Some(m) => {
                    body.push(1);
                    assert!(m.members.len() <= MEMBERS_MAX, "too many mirror members");
                    body.push(m.members.len() as u8);
                    body.extend(m.members.iter().map(|m| m.get() as u8));
                    put_extents(&mut body, &m.extents);
                }
            }
        }
    }
    // Free-block maps.
    for (m, map) in layout.members().zip(&meta.used) {
        assert_eq!(
            map.blocks(),
            layout.member_blocks(m),
            "block map of member {m} does not match the layout"
        );
        map.encode(&mut body);
    }
    // Member path hints.
    assert_eq!(
        meta.member_paths.len(),
        layout.member_count(),
        "one path hint per member"
    );
    for path in &meta.member_paths {
        assert!(
            path.len() <= MEMBER_PATH_BYTES_MAX && !path.contains('\0'),
            "member path hint too long or with a NUL"
        );
        body.extend_from_slice(&(path.len() as u16).to_le_bytes());
        body.extend_from_slice(path.as_bytes());
    }
    if version >= META_VERSION_SUMS {
        assert!(
            super::sums::area_fits(layout),
            "the sum area holds every member's entries"
        );
        body.extend_from_slice(&(super::sums::SUM_UNIT_BYTES as u32).to_le_bytes());
    }
    assert!(
        body.len() <= BODY_BYTES_MAX,
        "metadata body of {} bytes exceeds the slot",
        body.len()
    );

    let mut out = vec![0u8; SLOT_BYTES];
    out[0..8].copy_from_slice(&META_MAGIC);
    out[8..12].copy_from_slice(&version.to_le_bytes());
    out[12..16].copy_from_slice(&(META_HEADER_BYTES as u32).to_le_bytes());
    out[16..24].copy_from_slice(&seq.to_le_bytes());
    out[24..28].copy_from_slice(&(body.len() as u32).to_le_bytes());
    out[28..32].copy_from_slice(&crate::crc::crc32c(&body).to_le_bytes());
    let header_crc = crate::crc::crc32c(&out[0..60]);
    out[60..64].copy_from_slice(&header_crc.to_le_bytes());
    out[META_HEADER_BYTES..META_HEADER_BYTES + body.len()].copy_from_slice(&body);
    out
}

fn put_extents(body: &mut Vec<u8>, extents: &[Extent]) {
    body.extend_from_slice(&(extents.len() as u32).to_le_bytes());
    for e in extents {
        body.push(e.member.get() as u8);
        body.extend_from_slice(&e.start_block.to_le_bytes());
        body.extend_from_slice(&e.blocks.to_le_bytes());
    }
}

fn put_name(out: &mut Vec<u8>, name: &Name) {
    out.push(name.as_str().len() as u8);
    out.extend_from_slice(name.as_str().as_bytes());
}

/// Decodes one slot image (exactly [`META_SLOT_BYTES`] bytes). Checks, in order: size, magic,
/// version, header checksum, body checksum, then every field (counts within limits, indices
/// within the volume, names valid, maps matching the layout, no trailing bytes).
pub fn decode(slot: &[u8]) -> Result<DecodedMeta, MetaError> {
    if slot.len() != SLOT_BYTES {
        return Err(MetaError::SlotSize {
            len_bytes: slot.len(),
        });
    }
    if slot[0..8] != META_MAGIC {
        return Err(MetaError::BadMagic);
    }
    let le32 = |at: usize| u32::from_le_bytes([slot[at], slot[at + 1], slot[at + 2], slot[at + 3]]);
    let version = le32(8);
    if !(META_VERSION_MIN..=META_VERSION).contains(&version) {
        return Err(MetaError::UnknownVersion { found: version });
    }
    let stored = le32(60);
    let computed = crate::crc::crc32c(&slot[0..60]);
    if stored != computed {
        return Err(MetaError::HeaderChecksum { stored, computed });
    }
    if le32(12) as usize != META_HEADER_BYTES {
        return Err(corrupt("header length"));
    }
    if slot[32..60].iter().any(|&b| b != 0) {
        return Err(corrupt("reserved header bytes are not zero"));
    }
    let mut seq_bytes = [0u8; 8];
    seq_bytes.copy_from_slice(&slot[16..24]);
    let seq = u64::from_le_bytes(seq_bytes);
    if seq == 0 {
        return Err(corrupt("sequence 0 (sequences start at 1)"));
    }
    let body_bytes = le32(24) as usize;
    if body_bytes > BODY_BYTES_MAX {
        return Err(corrupt(format!(
            "body length {body_bytes} exceeds the slot"
        )));
    }
    let body = &slot[META_HEADER_BYTES..META_HEADER_BYTES + body_bytes];
    let stored = le32(28);
    let computed = crate::crc::crc32c(body);
    if stored != computed {
        return Err(MetaError::BodyChecksum { stored, computed });
    }
    let (meta, member) = decode_body(body, version)?;
    Ok(DecodedMeta { meta, member, seq })
}

/// The sequence number in a slot's header, when the header is whole (magic, a version this
/// code reads, its checksum): enough to tell whether a member holds a newer update than one
/// already read, without decoding the body. `None` for anything else.
pub fn header_seq(header: &[u8]) -> Option<u64> {
    if header.len() < META_HEADER_BYTES || header[0..8] != META_MAGIC {
        return None;
    }
    let le32 = |at: usize| {
        u32::from_le_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
    };
    if !(META_VERSION_MIN..=META_VERSION).contains(&le32(8))
        || le32(60) != crate::crc::crc32c(&header[0..60])
    {
        return None;
    }
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&header[16..24]);
    Some(u64::from_le_bytes(seq))
}

/// Reads little-endian fields from a byte slice, failing with the field's name at the end.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], MetaError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| corrupt(format!("body ends inside {what}")))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }
    fn u8(&mut self, what: &str) -> Result<u8, MetaError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, MetaError> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self, what: &str) -> Result<u32, MetaError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, what: &str) -> Result<u64, MetaError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn name(&mut self, what: &str) -> Result<Name, MetaError> {
        let len = self.u8(what)? as usize;
        let bytes = self.take(len, what)?;
        let text =
            std::str::from_utf8(bytes).map_err(|_| corrupt(format!("{what} is not UTF-8")))?;
        Name::new(text).map_err(|e| corrupt(format!("{what}: {e}")))
    }
    fn member(&mut self, count: usize, what: &str) -> Result<MemberIndex, MetaError> {
        let m = self.u8(what)? as usize;
        if m >= count {
            return Err(corrupt(format!(
                "{what} {m} outside the volume's {count} members"
            )));
        }
        MemberIndex::new(m).ok_or_else(|| corrupt(what.to_string()))
    }
}

fn decode_body(body: &[u8], version: u32) -> Result<(VolumeMeta, MemberIndex), MetaError> {
    let mut r = Reader { bytes: body, at: 0 };
    let mut uuid = [0u8; 16];
    uuid.copy_from_slice(r.take(16, "volume uuid")?);
    let name = r.name("volume name")?;
    let member = r.u16("member index")? as usize;
    let count = r.u16("member count")? as usize;
    if count == 0 || count > MEMBERS_MAX {
        return Err(corrupt(format!("member count {count}")));
    }
    if member >= count {
        return Err(corrupt(format!("member index {member} of {count}")));
    }
    let stripe_unit_bytes = r.u64("stripe unit")?;
    let block_bytes = r.u64("block size")?;
    let data_start_bytes = r.u64("data start")?;
    let mut sizes = Vec::with_capacity(count);
    for _ in 0..count {
        sizes.push(r.u64("member size")?);
    }
    let layout =
        VolumeLayout::with_data_start(sizes, stripe_unit_bytes, block_bytes, data_start_bytes)
            .map_err(|e| corrupt(format!("superblock: {e}")))?;
    let (copies, member_domains, member_states) = if version >= 3 {
        let copies = r.u8("copy count")?;
        if !(1..=COPIES_MAX).contains(&copies) {
            return Err(corrupt(format!("{copies} copies, 1 to {COPIES_MAX}")));
        }
        let mut domains = Vec::with_capacity(count);
        let mut states = Vec::with_capacity(count);
        for m in 0..count {
            domains.push(r.u64("member domain")?);
            states.push(match r.u8("member state")? {
                1 => MemberState::Ok,
                2 => MemberState::Degraded,
                3 => MemberState::Rebuilding,
                s => return Err(corrupt(format!("member {m}: unknown state {s}"))),
            });
        }
        (copies, domains, states)
    } else {
        (1, vec![0; count], vec![MemberState::Ok; count])
    };

    let partition_count = r.u16("partition count")? as usize;
    let partitions_max = if version >= 4 {
        PARTITIONS_MAX
    } else {
        PARTITIONS_MAX_V3
    };
    if partition_count > partitions_max {
        return Err(corrupt(format!(
            "{partition_count} partitions, at most {partitions_max} in version {version}"
        )));
    }
    let mut partitions = Vec::with_capacity(partition_count);
    let mut extents_total = 0usize;
    for _ in 0..partition_count {
        let pname = r.name("partition name")?;
        let kind = match r.u8("partition kind")? {
            1 => PartitionKind::Striped,
            2 => PartitionKind::Placed,
            k => return Err(corrupt(format!("partition {pname}: unknown kind {k}"))),
        };
        let width = r.u8("partition member count")? as usize;
        if width == 0 || width > count {
            return Err(corrupt(format!("partition {pname}: {width} members")));
        }
        let mut members = Vec::with_capacity(width);
        for _ in 0..width {
            members.push(r.member(count, "partition member")?);
        }
        let size_bytes = r.u64("partition size")?;
        // Version 1 partitions had a fixed size: all of it reserved.
        let (reserve_bytes, generation) = if version >= 2 {
            (
                r.u64("partition reservation")?,
                r.u64("partition generation")?,
            )
        } else {
            (size_bytes, 1)
        };
        let state = match r.u8("partition state")? {
            1 => PartitionState::Creating,
            2 => PartitionState::Ready,
            s => return Err(corrupt(format!("partition {pname}: unknown state {s}"))),
        };
        let extents = read_extents(&mut r, &layout, &pname, &mut extents_total)?;
        let mirror = if version >= 3 {
            match r.u8("mirror flag")? {
                0 => None,
                1 => {
                    let w = r.u8("mirror member count")? as usize;
                    if w != width {
                        return Err(corrupt(format!(
                            "partition {pname}: mirror over {w} members, the partition over {width}"
                        )));
                    }
                    let mut members = Vec::with_capacity(w);
                    for _ in 0..w {
                        members.push(r.member(count, "mirror member")?);
                    }
                    let extents = read_extents(&mut r, &layout, &pname, &mut extents_total)?;
                    Some(Mirror { members, extents })
                }
                f => return Err(corrupt(format!("partition {pname}: mirror flag {f}"))),
            }
        } else {
            None
        };
        if mirror.is_some() != (copies >= 2) {
            return Err(corrupt(format!(
                "partition {pname}: {} in a volume of {copies} copies",
                if mirror.is_some() {
                    "mirrored"
                } else {
                    "unmirrored"
                }
            )));
        }
        partitions.push(Partition {
            name: pname,
            kind,
            members,
            size_bytes,
            reserve_bytes,
            generation,
            state,
            extents,
            mirror,
        });
    }

    let mut used = Vec::with_capacity(count);
    for m in layout.members() {
        let blocks = r.u32("block map length")?;
        if blocks != layout.member_blocks(m) {
            return Err(corrupt(format!(
                "block map of member {m} has {blocks} blocks, the layout says {}",
                layout.member_blocks(m)
            )));
        }
        let bytes = r.take((blocks as usize).div_ceil(8), "block map")?;
        let mut map = BlockMap::new(blocks);
        for (i, chunk) in bytes.chunks(8).enumerate() {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            map.words[i] = u64::from_le_bytes(w);
        }
        if blocks % 64 != 0 && map.words.last().is_some_and(|w| w >> (blocks % 64) != 0) {
            return Err(corrupt(format!(
                "block map of member {m} has bits past its end"
            )));
        }
        used.push(map);
    }
    let mut member_paths = Vec::with_capacity(count);
    for m in layout.members() {
        let len = r.u16("member path length")? as usize;
        if len > MEMBER_PATH_BYTES_MAX {
            return Err(corrupt(format!("path of member {m}: {len} bytes")));
        }
        let bytes = r.take(len, "member path")?;
        let path = std::str::from_utf8(bytes)
            .ok()
            .filter(|p| !p.contains('\0'))
            .ok_or_else(|| corrupt(format!("path of member {m} is not UTF-8 without NUL")))?;
        member_paths.push(path.to_string());
    }
    let sums = version >= META_VERSION_SUMS;
    if sums {
        let unit = r.u32("sum unit")?;
        if u64::from(unit) != super::sums::SUM_UNIT_BYTES {
            return Err(corrupt(format!(
                "sum unit of {unit} bytes, not {}",
                super::sums::SUM_UNIT_BYTES
            )));
        }
        if !super::sums::area_fits(&layout) {
            return Err(corrupt("the data start leaves no room for the sum area"));
        }
    }
    if r.at != body.len() {
        return Err(corrupt(format!(
            "{} bytes after the member paths",
            body.len() - r.at
        )));
    }
    // member < count ≤ MEMBERS_MAX, checked above.
    let member = MemberIndex::new(member).ok_or_else(|| corrupt("member index"))?;
    Ok((
        VolumeMeta {
            uuid: VolumeUuid(uuid),
            name,
            layout,
            partitions,
            used,
            member_paths,
            copies,
            member_domains,
            member_states,
            sums,
        },
        member,
    ))
}

/// An extent list (count, then member, start, length each), counted into `total`.
fn read_extents(
    r: &mut Reader<'_>,
    layout: &VolumeLayout,
    pname: &Name,
    total: &mut usize,
) -> Result<Vec<Extent>, MetaError> {
    let count = layout.member_count();
    let n = r.u32("extent count")? as usize;
    *total = total.saturating_add(n);
    if *total > EXTENTS_MAX {
        return Err(corrupt(format!("more than {EXTENTS_MAX} extents")));
    }
    let mut extents = Vec::with_capacity(n);
    for _ in 0..n {
        let member = r.member(count, "extent member")?;
        let start_block = r.u32("extent start")?;
        let blocks = r.u32("extent length")?;
        // Range-checked here so that check() and the map never index outside a BlockMap.
        let end = u64::from(start_block) + u64::from(blocks);
        if blocks == 0 || end > u64::from(layout.member_blocks(member)) {
            return Err(corrupt(format!(
                "partition {pname}: extent {start_block}+{blocks} outside member {member}"
            )));
        }
        extents.push(Extent {
            member,
            start_block,
            blocks,
        });
    }
    Ok(extents)
}

/// The copy [`choose`] picked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chosen {
    pub decoded: DecodedMeta,
    pub slot: Slot,
    /// Why the other slot was not chosen when it is unreadable (`None`: it is valid and older).
    /// `volume check` reports it; the next update overwrites it anyway.
    pub other_error: Option<MetaError>,
}

impl Chosen {
    /// The sequence number of the next update; it goes to `Slot::for_seq(next_seq)`, which is
    /// always the slot not chosen.
    pub fn next_seq(&self) -> u64 {
        self.decoded.seq + 1
    }
}

/// Picks the newest valid copy of a member's two slots. A copy in the slot its sequence parity
/// does not belong to is refused ([`MetaError::WrongSlot`]): it was written to the wrong place.
/// Both bad → [`MetaError::BothSlotsBad`] naming both problems.
pub fn choose(
    slot_a: Result<DecodedMeta, MetaError>,
    slot_b: Result<DecodedMeta, MetaError>,
) -> Result<Chosen, MetaError> {
    let in_slot = |r: Result<DecodedMeta, MetaError>, slot: Slot| {
        r.and_then(|d| {
            if Slot::for_seq(d.seq) == slot {
                Ok(d)
            } else {
                Err(MetaError::WrongSlot { slot, seq: d.seq })
            }
        })
    };
    match (in_slot(slot_a, Slot::A), in_slot(slot_b, Slot::B)) {
        (Ok(a), Ok(b)) => {
            // Parity makes the sequences distinct.
            if a.seq > b.seq {
                Ok(Chosen {
                    decoded: a,
                    slot: Slot::A,
                    other_error: None,
                })
            } else {
                Ok(Chosen {
                    decoded: b,
                    slot: Slot::B,
                    other_error: None,
                })
            }
        }
        (Ok(a), Err(e)) => Ok(Chosen {
            decoded: a,
            slot: Slot::A,
            other_error: Some(e),
        }),
        (Err(e), Ok(b)) => Ok(Chosen {
            decoded: b,
            slot: Slot::B,
            other_error: Some(e),
        }),
        (Err(a), Err(b)) => Err(MetaError::BothSlotsBad {
            a: Box::new(a),
            b: Box::new(b),
        }),
    }
}
