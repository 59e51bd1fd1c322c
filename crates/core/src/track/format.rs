//! The track file format (specified in `docs/track-format.md`): a 64-byte header, then fixed
//! 24-byte records, each with its own crc32c.
//!
//! Per-record checksums are what make a recording survive a crash: a torn or never-written tail
//! (including the zero-filled tail a file system may expose after power loss) fails its
//! checksum, the decoder stops there, and everything before is known good. Fixed-size records
//! make "truncate to the last good record" a single `ftruncate` and let a reader seek to record
//! `n` at `64 + 24·n`.

use std::fmt::{self, Write as _};

use super::FrameRule;

/// Identifies a penstock track file ("PeNSTocK TRacK").
pub const TRACK_MAGIC: [u8; 8] = *b"PNSTKTRK";
/// The version this code writes and the only one it reads.
pub const TRACK_VERSION: u16 = 1;
/// Bytes of the file header.
pub const HEADER_BYTES: usize = 64;
/// Bytes of every record.
pub const RECORD_BYTES: usize = 24;
/// Header flag: receive times are kernel timestamps (SO_TIMESTAMPNS), not read by the recorder
/// after the datagram was dequeued.
pub const FLAG_KERNEL_TIMESTAMPS: u32 = 1;
/// All flags version 1 defines; others are refused (they would change the meaning of records).
pub const FLAGS_KNOWN: u32 = FLAG_KERNEL_TIMESTAMPS;

/// Which track a file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TrackKind {
    Time,
    Packet,
    Frame,
}

impl TrackKind {
    /// The code stored in the header (and mixed into every record checksum, so a record copied
    /// into a track of another kind fails its checksum).
    pub fn code(self) -> u8 {
        match self {
            TrackKind::Time => 1,
            TrackKind::Packet => 2,
            TrackKind::Frame => 3,
        }
    }

    /// The kind for a header code.
    pub fn from_code(code: u8) -> Option<TrackKind> {
        match code {
            1 => Some(TrackKind::Time),
            2 => Some(TrackKind::Packet),
            3 => Some(TrackKind::Frame),
            _ => None,
        }
    }

    /// The suffix of the track file beside the media file `REC`: `REC.time`, `REC.packet`,
    /// `REC.frame`.
    pub fn file_suffix(self) -> &'static str {
        match self {
            TrackKind::Time => ".time",
            TrackKind::Packet => ".packet",
            TrackKind::Frame => ".frame",
        }
    }

    /// The CSV header line (without newline) of `penstock tracks FILE`.
    pub fn csv_header(self) -> &'static str {
        match self {
            TrackKind::Time => "packet,time_ns",
            TrackKind::Packet => "packet,media_offset_bytes,size_bytes",
            TrackKind::Frame => "packet,media_offset_bytes",
        }
    }
}

impl fmt::Display for TrackKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TrackKind::Time => "time",
            TrackKind::Packet => "packet",
            TrackKind::Frame => "frame",
        })
    }
}

/// A track file's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrackHeader {
    pub kind: TrackKind,
    /// Wall-clock time of the recording's start, in ns since the Unix epoch (UTC). Informative:
    /// record times are relative to the start, on the recorder's monotonic clock.
    pub start_wall_ns: u64,
    /// How frame starts were detected (meaningful in the frame track; the same in all three).
    pub frame_rule: FrameRule,
    /// [`FLAG_KERNEL_TIMESTAMPS`] or 0.
    pub flags: u32,
}

/// Why a track file's header was refused. Record problems are not errors: the decoder stops and
/// says why ([`StopReason`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TrackError {
    #[error("track file of {len_bytes} bytes: shorter than its {HEADER_BYTES}-byte header")]
    TruncatedHeader { len_bytes: usize },
    #[error("not a penstock track file (no magic)")]
    BadMagic,
    #[error("track format version {found}: this penstock reads version {TRACK_VERSION} only")]
    UnknownVersion { found: u16 },
    #[error("track header checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    HeaderChecksum { stored: u32, computed: u32 },
    #[error("unknown track kind {code}")]
    UnknownKind { code: u8 },
    #[error("unknown frame rule {code}")]
    UnknownFrameRule { code: u8 },
    #[error("unknown header flags {flags:#x}")]
    UnknownFlags { flags: u32 },
    #[error("corrupt track header: {what}")]
    BadHeader { what: &'static str },
    #[error("a {found} track where a {expected} track was expected")]
    WrongKind {
        expected: TrackKind,
        found: TrackKind,
    },
}

impl TrackHeader {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut h = [0u8; HEADER_BYTES];
        h[0..8].copy_from_slice(&TRACK_MAGIC);
        h[8..10].copy_from_slice(&TRACK_VERSION.to_le_bytes());
        h[10] = self.kind.code();
        h[11] = self.frame_rule.code();
        h[12..14].copy_from_slice(&(RECORD_BYTES as u16).to_le_bytes());
        h[14..16].copy_from_slice(&(HEADER_BYTES as u16).to_le_bytes());
        h[16..24].copy_from_slice(&self.start_wall_ns.to_le_bytes());
        h[24..28].copy_from_slice(&self.flags.to_le_bytes());
        let crc = crate::crc::crc32c(&h[0..60]);
        h[60..64].copy_from_slice(&crc.to_le_bytes());
        h
    }
}

/// Decodes a track file's header from the file's first bytes.
pub fn decode_header(bytes: &[u8]) -> Result<TrackHeader, TrackError> {
    let h = bytes
        .get(..HEADER_BYTES)
        .ok_or(TrackError::TruncatedHeader {
            len_bytes: bytes.len(),
        })?;
    if h[0..8] != TRACK_MAGIC {
        return Err(TrackError::BadMagic);
    }
    let version = u16::from_le_bytes([h[8], h[9]]);
    if version != TRACK_VERSION {
        return Err(TrackError::UnknownVersion { found: version });
    }
    let stored = u32::from_le_bytes([h[60], h[61], h[62], h[63]]);
    let computed = crate::crc::crc32c(&h[0..60]);
    if stored != computed {
        return Err(TrackError::HeaderChecksum { stored, computed });
    }
    let kind = TrackKind::from_code(h[10]).ok_or(TrackError::UnknownKind { code: h[10] })?;
    let frame_rule =
        FrameRule::from_code(h[11]).ok_or(TrackError::UnknownFrameRule { code: h[11] })?;
    if usize::from(u16::from_le_bytes([h[12], h[13]])) != RECORD_BYTES {
        return Err(TrackError::BadHeader {
            what: "record size",
        });
    }
    if usize::from(u16::from_le_bytes([h[14], h[15]])) != HEADER_BYTES {
        return Err(TrackError::BadHeader {
            what: "header size",
        });
    }
    let mut w = [0u8; 8];
    w.copy_from_slice(&h[16..24]);
    let start_wall_ns = u64::from_le_bytes(w);
    let flags = u32::from_le_bytes([h[24], h[25], h[26], h[27]]);
    if flags & !FLAGS_KNOWN != 0 {
        return Err(TrackError::UnknownFlags { flags });
    }
    if h[28..60].iter().any(|&b| b != 0) {
        return Err(TrackError::BadHeader {
            what: "reserved bytes are not zero",
        });
    }
    Ok(TrackHeader {
        kind,
        start_wall_ns,
        frame_rule,
        flags,
    })
}

/// A record of one of the three tracks. Every record names its packet by index (0 = the first
/// packet of the recording), which lets the check line the tracks up.
pub trait Record: Copy + fmt::Debug + PartialEq {
    /// The track this record belongs in.
    const KIND: TrackKind;
    /// Whether the track has a record for every packet (time, packet) or only for some (frame).
    const EVERY_PACKET: bool;
    /// The packet this record describes.
    fn packet_index(&self) -> u64;
    /// The two payload fields: a u64 and a u32.
    fn fields(&self) -> (u64, u32);
    /// The record for decoded fields; `None` when a field is invalid (a reserved field set).
    fn from_fields(packet_index: u64, a: u64, b: u32) -> Option<Self>;
    /// Appends the CSV line (without newline) for `penstock tracks FILE`; columns as in
    /// [`TrackKind::csv_header`].
    fn write_csv(&self, out: &mut String);
}

/// The time track's record: packet `packet_index` was received `time_ns` after the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeRecord {
    pub packet_index: u64,
    pub time_ns: u64,
}

/// The packet track's record: packet `packet_index` has `size_bytes` and is stored at
/// `media_offset_bytes` (redundant with the running sum of sizes, kept as a self-check).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketRecord {
    pub packet_index: u64,
    pub media_offset_bytes: u64,
    pub size_bytes: u32,
}

/// The frame track's record: packet `packet_index`, at `media_offset_bytes`, begins an
/// independent frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameRecord {
    pub packet_index: u64,
    pub media_offset_bytes: u64,
}

impl Record for TimeRecord {
    const KIND: TrackKind = TrackKind::Time;
    const EVERY_PACKET: bool = true;
    fn packet_index(&self) -> u64 {
        self.packet_index
    }
    fn fields(&self) -> (u64, u32) {
        (self.time_ns, 0)
    }
    fn from_fields(packet_index: u64, a: u64, b: u32) -> Option<Self> {
        (b == 0).then_some(TimeRecord {
            packet_index,
            time_ns: a,
        })
    }
    fn write_csv(&self, out: &mut String) {
        let _ = write!(out, "{},{}", self.packet_index, self.time_ns);
    }
}

impl Record for PacketRecord {
    const KIND: TrackKind = TrackKind::Packet;
    const EVERY_PACKET: bool = true;
    fn packet_index(&self) -> u64 {
        self.packet_index
    }
    fn fields(&self) -> (u64, u32) {
        (self.media_offset_bytes, self.size_bytes)
    }
    fn from_fields(packet_index: u64, a: u64, b: u32) -> Option<Self> {
        Some(PacketRecord {
            packet_index,
            media_offset_bytes: a,
            size_bytes: b,
        })
    }
    fn write_csv(&self, out: &mut String) {
        let _ = write!(
            out,
            "{},{},{}",
            self.packet_index, self.media_offset_bytes, self.size_bytes
        );
    }
}

impl Record for FrameRecord {
    const KIND: TrackKind = TrackKind::Frame;
    const EVERY_PACKET: bool = false;
    fn packet_index(&self) -> u64 {
        self.packet_index
    }
    fn fields(&self) -> (u64, u32) {
        (self.media_offset_bytes, 0)
    }
    fn from_fields(packet_index: u64, a: u64, b: u32) -> Option<Self> {
        (b == 0).then_some(FrameRecord {
            packet_index,
            media_offset_bytes: a,
        })
    }
    fn write_csv(&self, out: &mut String) {
        let _ = write!(out, "{},{}", self.packet_index, self.media_offset_bytes);
    }
}

/// A record's bytes: packet index (u64), the u64 field, the u32 field, crc32c (all
/// little-endian). The checksum covers the kind code followed by the first 20 bytes.
pub fn encode_record<R: Record>(record: &R) -> [u8; RECORD_BYTES] {
    let mut r = [0u8; RECORD_BYTES];
    let (a, b) = record.fields();
    r[0..8].copy_from_slice(&record.packet_index().to_le_bytes());
    r[8..16].copy_from_slice(&a.to_le_bytes());
    r[16..20].copy_from_slice(&b.to_le_bytes());
    let crc = record_crc(R::KIND, &r[0..20]);
    r[20..24].copy_from_slice(&crc.to_le_bytes());
    r
}

fn record_crc(kind: TrackKind, first20: &[u8]) -> u32 {
    crate::crc::crc32c_append(crate::crc::crc32c(&[kind.code()]), first20)
}

/// Why the decoder stopped reading records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopReason {
    /// Every byte was a good record.
    End,
    /// The file ends inside record `record` (`trailing_bytes` of it present): a torn append.
    Truncated { record: u64, trailing_bytes: usize },
    /// Record `record` fails its checksum: torn, never written (zeros) or corrupt.
    BadChecksum { record: u64 },
    /// Record `record` has a good checksum but names packet `packet_index` where the track's
    /// order needs `expected` (time/packet: exactly; frame: more than the previous).
    OutOfSequence {
        record: u64,
        packet_index: u64,
        expected: u64,
    },
    /// Record `record` has a good checksum but a reserved field set.
    BadRecord { record: u64 },
    /// The caller's `records_max` was reached; more may follow.
    RecordsMax { max: u64 },
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::End => write!(f, "end of file"),
            StopReason::Truncated {
                record,
                trailing_bytes,
            } => {
                write!(
                    f,
                    "record {record} truncated ({trailing_bytes} of {RECORD_BYTES} bytes)"
                )
            }
            StopReason::BadChecksum { record } => write!(f, "record {record} has a bad checksum"),
            StopReason::OutOfSequence {
                record,
                packet_index,
                expected,
            } => {
                write!(
                    f,
                    "record {record} names packet {packet_index}, expected {expected}"
                )
            }
            StopReason::BadRecord { record } => {
                write!(f, "record {record} has a reserved field set")
            }
            StopReason::RecordsMax { max } => write!(f, "stopped after {max} records (limit)"),
        }
    }
}

/// A decoded track: its header, the good records, and why decoding stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded<R> {
    pub header: TrackHeader,
    pub records: Vec<R>,
    /// Bytes of header and good records: the length to truncate the file to before appending.
    pub good_bytes: u64,
    pub stop: StopReason,
}

/// Decodes a whole track file of record type `R`, reading records until the first bad one or
/// `records_max` (a memory bound: 24 bytes of file are 24 bytes of memory).
pub fn decode<R: Record>(bytes: &[u8], records_max: u64) -> Result<Decoded<R>, TrackError> {
    let header = decode_header(bytes)?;
    if header.kind != R::KIND {
        return Err(TrackError::WrongKind {
            expected: R::KIND,
            found: header.kind,
        });
    }
    let body = &bytes[HEADER_BYTES..];
    let mut records: Vec<R> = Vec::with_capacity(
        (body.len() / RECORD_BYTES)
            .min(records_max as usize)
            .min(1 << 20),
    );
    let mut stop = StopReason::End;
    for (n, chunk) in body.chunks(RECORD_BYTES).enumerate() {
        let record = n as u64;
        if record >= records_max {
            stop = StopReason::RecordsMax { max: records_max };
            break;
        }
        if chunk.len() < RECORD_BYTES {
            stop = StopReason::Truncated {
                record,
                trailing_bytes: chunk.len(),
            };
            break;
        }
        let stored = u32::from_le_bytes([chunk[20], chunk[21], chunk[22], chunk[23]]);
        if stored != record_crc(R::KIND, &chunk[0..20]) {
            stop = StopReason::BadChecksum { record };
            break;
        }
        let le64 = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&chunk[at..at + 8]);
            u64::from_le_bytes(w)
        };
        let packet_index = le64(0);
        let b = u32::from_le_bytes([chunk[16], chunk[17], chunk[18], chunk[19]]);
        let Some(r) = R::from_fields(packet_index, le64(8), b) else {
            stop = StopReason::BadRecord { record };
            break;
        };
        let (in_order, expected) = match (R::EVERY_PACKET, records.last()) {
            (true, _) => (packet_index == record, record),
            (false, None) => (true, 0),
            (false, Some(prev)) => match prev.packet_index().checked_add(1) {
                Some(e) => (packet_index >= e, e),
                None => (false, u64::MAX),
            },
        };
        if !in_order {
            stop = StopReason::OutOfSequence {
                record,
                packet_index,
                expected,
            };
            break;
        }
        records.push(r);
    }
    let good_bytes = (HEADER_BYTES + records.len() * RECORD_BYTES) as u64;
    Ok(Decoded {
        header,
        records,
        good_bytes,
        stop,
    })
}

/// One record of a track of `R`'s kind (24 bytes, read alone: a live reader's pread of
/// record `n` at `HEADER_BYTES + 24·n`), or `None` when its checksum fails, a reserved field is
/// set or `bytes` is not one record long.
pub fn decode_one<R: Record>(bytes: &[u8]) -> Option<R> {
    let chunk: &[u8; RECORD_BYTES] = bytes.try_into().ok()?;
    let stored = u32::from_le_bytes([chunk[20], chunk[21], chunk[22], chunk[23]]);
    if stored != record_crc(R::KIND, &chunk[0..20]) {
        return None;
    }
    let mut a = [0u8; 8];
    a.copy_from_slice(&chunk[8..16]);
    let mut n = [0u8; 8];
    n.copy_from_slice(&chunk[0..8]);
    let b = u32::from_le_bytes([chunk[16], chunk[17], chunk[18], chunk[19]]);
    R::from_fields(u64::from_le_bytes(n), u64::from_le_bytes(a), b)
}

/// Whole records with a good checksum at or after record `from_record` of a track file of
/// `kind` (`bytes` is the whole file). Tells a torn tail (nothing good follows the first bad
/// record) from damage in the middle of a file (good records follow it).
pub fn valid_records_from(bytes: &[u8], kind: TrackKind, from_record: u64) -> u64 {
    let body = bytes.get(HEADER_BYTES..).unwrap_or(&[]);
    body.chunks_exact(RECORD_BYTES)
        .skip(usize::try_from(from_record).unwrap_or(usize::MAX))
        .filter(|r| u32::from_le_bytes([r[20], r[21], r[22], r[23]]) == record_crc(kind, &r[0..20]))
        .count() as u64
}

/// Bytes to append to the three track files, produced by [`TracksWriter::push`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrackBytes {
    pub time: Vec<u8>,
    pub packet: Vec<u8>,
    pub frame: Vec<u8>,
}

impl TrackBytes {
    /// Empties the buffers (keeping their capacity) after the driver wrote them.
    pub fn clear(&mut self) {
        self.time.clear();
        self.packet.clear();
        self.frame.clear();
    }
}

/// Why a packet could not be recorded in the tracks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    #[error("receive time {time_ns} ns is before the previous packet's {previous_ns} ns")]
    TimeWentBackwards { previous_ns: u64, time_ns: u64 },
    #[error("media offset overflows 64 bits")]
    MediaOffsetOverflow,
}

/// Produces the records of the three tracks as packets arrive, keeping the running packet
/// index and media offset. The headers are written first with [`TrackHeader::encode`].
#[derive(Debug, Clone, Default)]
pub struct TracksWriter {
    next_packet_index: u64,
    media_offset_bytes: u64,
    last_time_ns: u64,
}

impl TracksWriter {
    /// A writer at the start of a recording.
    pub fn new() -> TracksWriter {
        TracksWriter::default()
    }

    /// Packets recorded so far.
    pub fn packets(&self) -> u64 {
        self.next_packet_index
    }

    /// Media bytes recorded so far (where the next packet goes).
    pub fn media_offset_bytes(&self) -> u64 {
        self.media_offset_bytes
    }

    /// Records one packet of `size_bytes` received `time_ns` after the start, appending its
    /// time and packet records (and a frame record when `frame_start`) to `out`. Returns the
    /// packet's index. On error nothing is appended and the writer is unchanged.
    pub fn push(
        &mut self,
        time_ns: u64,
        size_bytes: u32,
        frame_start: bool,
        out: &mut TrackBytes,
    ) -> Result<u64, EncodeError> {
        if time_ns < self.last_time_ns {
            return Err(EncodeError::TimeWentBackwards {
                previous_ns: self.last_time_ns,
                time_ns,
            });
        }
        let next_offset = self
            .media_offset_bytes
            .checked_add(u64::from(size_bytes))
            .ok_or(EncodeError::MediaOffsetOverflow)?;
        let packet_index = self.next_packet_index;
        out.time.extend_from_slice(&encode_record(&TimeRecord {
            packet_index,
            time_ns,
        }));
        out.packet.extend_from_slice(&encode_record(&PacketRecord {
            packet_index,
            media_offset_bytes: self.media_offset_bytes,
            size_bytes,
        }));
        if frame_start {
            out.frame.extend_from_slice(&encode_record(&FrameRecord {
                packet_index,
                media_offset_bytes: self.media_offset_bytes,
            }));
        }
        self.next_packet_index += 1;
        self.media_offset_bytes = next_offset;
        self.last_time_ns = time_ns;
        Ok(packet_index)
    }
}
