//! A movie's tracks read from its `moov`: moov → trak → mdia → minf → stbl, the sample
//! description (`stsd`: avc1/avc3 + avcC, hvc1/hev1 + hvcC, mp4a + esds), and the sample
//! tables (`stts`, `ctts`, `stss`, `stsz`/`stz2`, `stsc`, `stco`/`co64`) expanded into one
//! [`Sample`] per sample, in decode order. Every count is checked against its box's length
//! before anything is allocated, the total against [`Mp4Limits::samples_max`], and every
//! sample's byte range against the file's length.

use super::boxes::{Children, Reader, child};
use super::{Mp4Error, Mp4Limits};

/// One sample (an access unit): `size` bytes of the file at `offset`, decoded at `dts` and
/// presented at `dts + cts_offset` (track timescale). 24 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub offset: u64,
    pub dts: u64,
    pub size: u32,
    pub cts_offset: i32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrackKind {
    Video,
    Audio,
}

/// What a track's samples are, with the configuration a decoder (or an SDP) needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Codec {
    /// H.264: the `avcC` body (AVCDecoderConfigurationRecord: SPS and PPS).
    Avc { config: Vec<u8> },
    /// H.265: the `hvcC` body (HEVCDecoderConfigurationRecord: VPS, SPS, PPS).
    Hevc { config: Vec<u8> },
    /// AAC: the AudioSpecificConfig from `esds`.
    Aac {
        asc: Vec<u8>,
        channels: u16,
        sample_rate: u32,
    },
}

impl Codec {
    /// The RFC 6381 `codecs` string (HLS `CODECS`, DASH `@codecs`).
    pub fn rfc6381(&self) -> String {
        match self {
            Codec::Avc { config } if config.len() >= 4 => {
                format!("avc1.{:02x}{:02x}{:02x}", config[1], config[2], config[3])
            }
            Codec::Avc { .. } => "avc1".into(),
            Codec::Hevc { config } => hevc_codecs(config),
            Codec::Aac { asc, .. } => {
                let aot = asc.first().map_or(2, |b| b >> 3);
                format!("mp4a.40.{aot}")
            }
        }
    }
}

/// `hvc1.P.C.TL.B..` (ISO/IEC 14496-15 Annex E) from an hvcC.
fn hevc_codecs(c: &[u8]) -> String {
    if c.len() < 13 {
        return "hvc1".into();
    }
    let space = c[1] >> 6;
    let tier = (c[1] >> 5) & 1;
    let profile = c[1] & 0x1f;
    let compat = u32::from_be_bytes([c[2], c[3], c[4], c[5]]).reverse_bits();
    let level = c[12];
    let space_s = ["", "A", "B", "C"][usize::from(space)];
    let mut s = format!(
        "hvc1.{space_s}{profile}.{compat:X}.{}{level}",
        if tier == 1 { 'H' } else { 'L' }
    );
    // The constraint bytes, trailing zero bytes left out.
    let cons = &c[6..12];
    let n = cons.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    for b in &cons[..n] {
        s.push_str(&format!(".{b:X}"));
    }
    s
}

/// A track's edit list, as applied: presentation starts `empty_ticks` (movie timescale) in,
/// at media time `media_time` (track timescale).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Edit {
    pub media_time: u64,
    pub empty_ticks: u64,
}

/// One video or audio track and its sample index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Track {
    pub id: u32,
    pub kind: TrackKind,
    pub timescale: u32,
    pub codec: Codec,
    pub width: u16,
    pub height: u16,
    /// The raw boxes an init segment copies: `tkhd`, `mdhd`, `hdlr`, the media header
    /// (`vmhd`/`smhd`), the sample description (`stsd`), and `edts` if any.
    pub tkhd: Vec<u8>,
    pub mdhd: Vec<u8>,
    pub hdlr: Vec<u8>,
    pub media_header: Vec<u8>,
    pub stsd: Vec<u8>,
    pub edts: Option<Vec<u8>>,
    pub edit: Edit,
    pub samples: Vec<Sample>,
    /// Indexes of the sync samples, ascending; `None` when every sample is one (no `stss`).
    pub sync: Option<Vec<u32>>,
    /// The decode time at which the last sample ends.
    pub end_dts: u64,
}

impl Track {
    pub fn is_sync(&self, i: usize) -> bool {
        match &self.sync {
            None => true,
            Some(s) => s.binary_search(&(i as u32)).is_ok(),
        }
    }

    /// The sync sample at or before decode time `dts` (the first sample when none is).
    pub fn sync_at_or_before(&self, dts: u64) -> usize {
        let i = self
            .samples
            .partition_point(|s| s.dts <= dts)
            .saturating_sub(1);
        match &self.sync {
            None => i,
            Some(s) => {
                let k = s.partition_point(|&x| x as usize <= i);
                if k == 0 {
                    s.first().map_or(0, |&x| x as usize)
                } else {
                    s[k - 1] as usize
                }
            }
        }
    }

    /// Bytes of all samples.
    pub fn payload_bytes(&self) -> u64 {
        self.samples.iter().map(|s| u64::from(s.size)).sum()
    }

    /// Seconds × timescale of the whole track.
    pub fn duration_ticks(&self) -> u64 {
        self.end_dts
            .saturating_sub(self.samples.first().map_or(0, |s| s.dts))
    }
}

/// A movie: its timescale and its video and audio tracks (others are left out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Movie {
    pub timescale: u32,
    pub tracks: Vec<Track>,
}

impl Movie {
    pub fn video(&self) -> Option<&Track> {
        self.tracks.iter().find(|t| t.kind == TrackKind::Video)
    }

    pub fn audio(&self) -> Option<&Track> {
        self.tracks.iter().find(|t| t.kind == TrackKind::Audio)
    }

    pub fn track(&self, id: u32) -> Option<&Track> {
        self.tracks.iter().find(|t| t.id == id)
    }
}

/// The movie in `moov` (its body, without the header), from a file of `file_len` bytes.
/// A fragmented movie's `moov` (one with `mvex`) is refused with [`Mp4Error::Fragmented`]:
/// its samples are in the fragments ([`super::frag`] indexes those).
pub fn parse_movie(moov: &[u8], file_len: u64, limits: &Mp4Limits) -> Result<Movie, Mp4Error> {
    if child(moov, b"mvex")?.is_some() {
        return Err(Mp4Error::Fragmented);
    }
    parse_moov(moov, file_len, limits)
}

/// The movie in `moov` whatever its sample tables hold (a fragmented movie's are empty: its
/// tracks come back without samples).
pub(crate) fn parse_moov(
    moov: &[u8],
    file_len: u64,
    limits: &Mp4Limits,
) -> Result<Movie, Mp4Error> {
    let mvhd = child(moov, b"mvhd")?.ok_or(Mp4Error::Missing("mvhd"))?;
    let mut r = Reader::new(mvhd, "mvhd");
    let (v, _) = r.full()?;
    r.skip(if v == 1 { 16 } else { 8 })?;
    let timescale = r.u32()?;
    let mut tracks = Vec::new();
    let mut samples_total = 0u64;
    for c in Children::new(moov, 0) {
        let (kind, body) = c?;
        if &kind != b"trak" {
            continue;
        }
        if let Some(t) = parse_trak(body, file_len, limits, &mut samples_total)? {
            // Tracks are named by their ids (URLs, segments): two with one id are refused.
            if tracks.iter().any(|x: &Track| x.id == t.id) {
                return Err(Mp4Error::Inconsistent {
                    track: t.id,
                    why: "two tracks have this id",
                });
            }
            if tracks.len() >= limits.tracks_max {
                return Err(Mp4Error::TooManyTracks(limits.tracks_max));
            }
            tracks.push(t);
        }
    }
    if tracks.is_empty() {
        return Err(Mp4Error::NoTracks);
    }
    Ok(Movie {
        timescale: timescale.max(1),
        tracks,
    })
}

/// A whole box (header and body) of `kind` around `body`, for the init segment to copy.
fn boxed(kind: &[u8; 4], body: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(body.len() + 8);
    v.extend_from_slice(&((body.len() + 8) as u32).to_be_bytes());
    v.extend_from_slice(kind);
    v.extend_from_slice(body);
    v
}

fn parse_trak(
    trak: &[u8],
    file_len: u64,
    limits: &Mp4Limits,
    samples_total: &mut u64,
) -> Result<Option<Track>, Mp4Error> {
    let tkhd = child(trak, b"tkhd")?.ok_or(Mp4Error::Missing("tkhd"))?;
    let mut r = Reader::new(tkhd, "tkhd");
    let (v, _) = r.full()?;
    r.skip(if v == 1 { 16 } else { 8 })?;
    let id = r.u32()?;
    // reserved, duration, reserved×2, layer, group, volume, reserved, matrix: then width, height
    r.skip(4 + if v == 1 { 8 } else { 4 } + 8 + 2 + 2 + 2 + 2 + 36)?;
    let width = (r.u32()? >> 16) as u16;
    let height = (r.u32()? >> 16) as u16;
    let mdia = child(trak, b"mdia")?.ok_or(Mp4Error::Missing("mdia"))?;
    let hdlr = child(mdia, b"hdlr")?.ok_or(Mp4Error::Missing("hdlr"))?;
    let mut r = Reader::new(hdlr, "hdlr");
    r.full()?;
    r.skip(4)?;
    let handler: [u8; 4] = r.bytes(4)?.try_into().expect("4");
    let kind = match &handler {
        b"vide" => TrackKind::Video,
        b"soun" => TrackKind::Audio,
        _ => return Ok(None),
    };
    let mdhd = child(mdia, b"mdhd")?.ok_or(Mp4Error::Missing("mdhd"))?;
    let mut r = Reader::new(mdhd, "mdhd");
    let (v, _) = r.full()?;
    r.skip(if v == 1 { 16 } else { 8 })?;
    let timescale = r.u32()?;
    if timescale == 0 {
        return Err(Mp4Error::Inconsistent {
            track: id,
            why: "mdhd timescale is 0",
        });
    }
    let minf = child(mdia, b"minf")?.ok_or(Mp4Error::Missing("minf"))?;
    let (mh_kind, media_header) = match kind {
        TrackKind::Video => (b"vmhd", child(minf, b"vmhd")?),
        TrackKind::Audio => (b"smhd", child(minf, b"smhd")?),
    };
    let media_header = media_header.ok_or(Mp4Error::Missing("vmhd/smhd"))?;
    let stbl = child(minf, b"stbl")?.ok_or(Mp4Error::Missing("stbl"))?;
    let stsd = child(stbl, b"stsd")?.ok_or(Mp4Error::Missing("stsd"))?;
    let (codec, w2, h2) = parse_stsd(stsd, id)?;
    let (edit, edts) = match child(trak, b"edts")? {
        Some(edts) => (parse_edts(edts, id)?, Some(boxed(b"edts", edts))),
        None => (Edit::default(), None),
    };
    let (samples, sync, end_dts) = sample_index(stbl, id, file_len, limits, samples_total)?;
    Ok(Some(Track {
        id,
        kind,
        timescale,
        codec,
        width: if width > 0 { width } else { w2 },
        height: if height > 0 { height } else { h2 },
        tkhd: boxed(b"tkhd", tkhd),
        mdhd: boxed(b"mdhd", mdhd),
        hdlr: boxed(b"hdlr", hdlr),
        media_header: boxed(mh_kind, media_header),
        stsd: boxed(b"stsd", stsd),
        edts,
        edit,
        samples,
        sync,
        end_dts,
    }))
}

/// The first sample entry of `stsd`: its codec, and a visual entry's width and height.
fn parse_stsd(stsd: &[u8], track: u32) -> Result<(Codec, u16, u16), Mp4Error> {
    let mut r = Reader::new(stsd, "stsd");
    r.full()?;
    let n = r.u32()?;
    if n == 0 {
        return Err(Mp4Error::Missing("a sample entry in stsd"));
    }
    let rest = &stsd[r.pos..];
    let Some(first) = Children::new(rest, 0).next() else {
        return Err(Mp4Error::Missing("a sample entry in stsd"));
    };
    let (fourcc, entry) = first?;
    let name = String::from_utf8_lossy(&fourcc).into_owned();
    match &fourcc {
        b"avc1" | b"avc3" | b"hvc1" | b"hev1" => {
            // VisualSampleEntry: 6 reserved + 2 index + 16 pre-defined/reserved, then width,
            // height, and 50 more bytes before the child boxes.
            let mut r = Reader::new(entry, "visual sample entry");
            r.skip(24)?;
            let w = r.u16()?;
            let h = r.u16()?;
            r.skip(50)?;
            let boxes = &entry[r.pos..];
            let codec = if fourcc.starts_with(b"avc") {
                let c = child(boxes, b"avcC")?.ok_or(Mp4Error::Missing("avcC"))?;
                Codec::Avc { config: c.to_vec() }
            } else {
                let c = child(boxes, b"hvcC")?.ok_or(Mp4Error::Missing("hvcC"))?;
                Codec::Hevc { config: c.to_vec() }
            };
            Ok((codec, w, h))
        }
        b"mp4a" => {
            // AudioSampleEntry: 6 + 2, 8 reserved, channels, sample size, 4, rate 16.16.
            let mut r = Reader::new(entry, "audio sample entry");
            r.skip(16)?;
            let channels = r.u16()?;
            r.skip(6)?;
            let rate = r.u32()? >> 16;
            let esds = child(&entry[r.pos..], b"esds")?.ok_or(Mp4Error::Missing("esds"))?;
            let asc = parse_esds(esds).ok_or(Mp4Error::UnknownCodec {
                track,
                codec: "mp4a without an AAC AudioSpecificConfig".into(),
            })?;
            Ok((
                Codec::Aac {
                    asc,
                    channels,
                    sample_rate: rate,
                },
                0,
                0,
            ))
        }
        _ => Err(Mp4Error::UnknownCodec { track, codec: name }),
    }
}

/// The AudioSpecificConfig in an `esds` (ES_Descriptor → DecoderConfigDescriptor of an
/// MPEG-4 audio object type 0x40 → DecoderSpecificInfo).
fn parse_esds(esds: &[u8]) -> Option<Vec<u8>> {
    let mut r = Reader::new(esds, "esds");
    r.full().ok()?;
    let mut b = &esds[r.pos..];
    // Descriptors: tag, a length of 1-4 bytes of 7 bits each.
    fn desc(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
        let tag = *b.first()?;
        let mut len = 0usize;
        let mut i = 1;
        loop {
            let x = *b.get(i)?;
            len = (len << 7) | usize::from(x & 0x7f);
            i += 1;
            if x & 0x80 == 0 || i > 4 {
                break;
            }
        }
        let body = b.get(i..i.checked_add(len)?)?;
        Some((tag, body, &b[i + len..]))
    }
    let (tag, es, _) = desc(b)?;
    if tag != 3 {
        return None;
    }
    let flags = *es.get(2)?;
    let mut skip = 3;
    if flags & 0x80 != 0 {
        skip += 2;
    }
    if flags & 0x40 != 0 {
        skip += 1 + usize::from(*es.get(skip)?);
    }
    if flags & 0x20 != 0 {
        skip += 2;
    }
    b = es.get(skip..)?;
    let (tag, dc, _) = desc(b)?;
    if tag != 4 || *dc.first()? != 0x40 {
        return None;
    }
    let (tag, dsi, _) = desc(dc.get(13..)?)?;
    (tag == 5 && !dsi.is_empty()).then(|| dsi.to_vec())
}

fn parse_edts(edts: &[u8], track: u32) -> Result<Edit, Mp4Error> {
    let Some(elst) = child(edts, b"elst")? else {
        return Ok(Edit::default());
    };
    let mut r = Reader::new(elst, "elst");
    let (v, _) = r.full()?;
    let entry_bytes = if v == 1 { 20 } else { 12 };
    let n = r.count(entry_bytes)?;
    let mut entries = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let (dur, mt) = if v == 1 {
            (r.u64()?, r.u64()? as i64)
        } else {
            (u64::from(r.u32()?), i64::from(r.u32()? as i32))
        };
        r.skip(4)?; // rate
        entries.push((dur, mt));
    }
    match entries.as_slice() {
        [] => Ok(Edit::default()),
        [(_, mt)] if *mt >= 0 => Ok(Edit {
            media_time: *mt as u64,
            empty_ticks: 0,
        }),
        [(empty, -1), (_, mt)] if *mt >= 0 => Ok(Edit {
            media_time: *mt as u64,
            empty_ticks: *empty,
        }),
        _ => Err(Mp4Error::EditList { track, entries: n }),
    }
}

/// The samples of one `stbl`, their sync list and the end of the last one.
#[allow(clippy::type_complexity)]
fn sample_index(
    stbl: &[u8],
    track: u32,
    file_len: u64,
    limits: &Mp4Limits,
    samples_total: &mut u64,
) -> Result<(Vec<Sample>, Option<Vec<u32>>, u64), Mp4Error> {
    let bad = |why| Mp4Error::Inconsistent { track, why };
    // Sizes: stsz (a fixed size, or one u32 each) or stz2 (4, 8 or 16 bits each).
    enum Sizes<'a> {
        Fixed(u32),
        Table(&'a [u8], u8),
    }
    let (count, sizes) = if let Some(stsz) = child(stbl, b"stsz")? {
        let mut r = Reader::new(stsz, "stsz");
        r.full()?;
        let fixed = r.u32()?;
        let n = r.u32()?;
        if fixed == 0 {
            r.check_count(u64::from(n), 4)?;
            (n, Sizes::Table(&stsz[r.pos..], 32))
        } else {
            // A fixed size: the count is bounded by the file (every sample is in it).
            if u64::from(n).saturating_mul(u64::from(fixed)) > file_len {
                return Err(Mp4Error::TableOverrun {
                    table: "stsz",
                    count: u64::from(n),
                    bytes: stsz.len(),
                });
            }
            (n, Sizes::Fixed(fixed))
        }
    } else if let Some(stz2) = child(stbl, b"stz2")? {
        let mut r = Reader::new(stz2, "stz2");
        r.full()?;
        r.skip(3)?;
        let field = r.u8()?;
        if !matches!(field, 4 | 8 | 16) {
            return Err(bad("stz2 field size is not 4, 8 or 16"));
        }
        let n = r.u32()?;
        let need = (u64::from(n) * u64::from(field)).div_ceil(8);
        if need > r.remaining() as u64 {
            return Err(Mp4Error::TableOverrun {
                table: "stz2",
                count: u64::from(n),
                bytes: r.remaining(),
            });
        }
        (n, Sizes::Table(&stz2[r.pos..], field))
    } else {
        return Err(Mp4Error::Missing("stsz"));
    };
    let count64 = u64::from(count);
    if *samples_total + count64 > limits.samples_max {
        return Err(Mp4Error::TooManySamples(
            *samples_total + count64,
            limits.samples_max,
        ));
    }
    *samples_total += count64;
    let size_of = |i: usize| -> u32 {
        match sizes {
            Sizes::Fixed(s) => s,
            Sizes::Table(t, 32) => u32::from_be_bytes(t[i * 4..i * 4 + 4].try_into().expect("4")),
            Sizes::Table(t, 16) => u32::from(u16::from_be_bytes([t[i * 2], t[i * 2 + 1]])),
            Sizes::Table(t, 8) => u32::from(t[i]),
            Sizes::Table(t, _) => u32::from(if i.is_multiple_of(2) {
                t[i / 2] >> 4
            } else {
                t[i / 2] & 0xf
            }),
        }
    };
    let mut samples: Vec<Sample> = Vec::with_capacity(count as usize);

    // Chunk offsets.
    let (co, co_bytes) = if let Some(b) = child(stbl, b"stco")? {
        (b, 4)
    } else if let Some(b) = child(stbl, b"co64")? {
        (b, 8)
    } else {
        return Err(Mp4Error::Missing("stco/co64"));
    };
    let mut r = Reader::new(co, if co_bytes == 4 { "stco" } else { "co64" });
    r.full()?;
    let chunks = r.count(co_bytes)?;
    let co_table = &co[r.pos..];
    let chunk_offset = |c: usize| -> u64 {
        if co_bytes == 4 {
            u64::from(u32::from_be_bytes(
                co_table[c * 4..c * 4 + 4].try_into().expect("4"),
            ))
        } else {
            u64::from_be_bytes(co_table[c * 8..c * 8 + 8].try_into().expect("8"))
        }
    };
    // Sample-to-chunk runs.
    let stsc = child(stbl, b"stsc")?.ok_or(Mp4Error::Missing("stsc"))?;
    let mut r = Reader::new(stsc, "stsc");
    r.full()?;
    let runs = r.count(12)?;
    let mut run_list = Vec::with_capacity(runs as usize);
    for _ in 0..runs {
        let first = r.u32()?;
        let per = r.u32()?;
        r.skip(4)?;
        run_list.push((first, per));
    }
    let mut i = 0usize;
    'runs: for (k, &(first, per)) in run_list.iter().enumerate() {
        let next_first = run_list
            .get(k + 1)
            .map_or(chunks.saturating_add(1), |r| r.0);
        if first == 0 || next_first < first || next_first > chunks.saturating_add(1) {
            return Err(bad("stsc chunk numbers out of order or past stco"));
        }
        for c in first..next_first {
            let mut off = chunk_offset(c as usize - 1);
            for _ in 0..per {
                if i >= count as usize {
                    break 'runs;
                }
                let size = size_of(i);
                let end = off.saturating_add(u64::from(size));
                if end > file_len {
                    return Err(Mp4Error::SamplePastEnd {
                        track,
                        sample: i as u64,
                        end,
                        file_len,
                    });
                }
                samples.push(Sample {
                    offset: off,
                    dts: 0,
                    size,
                    cts_offset: 0,
                });
                off = end;
                i += 1;
            }
        }
    }
    if samples.len() != count as usize {
        return Err(bad("stsc and stco place fewer samples than stsz counts"));
    }

    // Decode times.
    let stts = child(stbl, b"stts")?.ok_or(Mp4Error::Missing("stts"))?;
    let mut r = Reader::new(stts, "stts");
    r.full()?;
    let n = r.count(8)?;
    let mut dts = 0u64;
    let mut i = 0usize;
    for _ in 0..n {
        let c = r.u32()?;
        let delta = r.u32()?;
        for _ in 0..c {
            if i >= samples.len() {
                break;
            }
            samples[i].dts = dts;
            dts += u64::from(delta);
            i += 1;
        }
    }
    if i != samples.len() {
        return Err(bad("stts times fewer samples than stsz counts"));
    }
    // Composition offsets.
    if let Some(ctts) = child(stbl, b"ctts")? {
        let mut r = Reader::new(ctts, "ctts");
        r.full()?;
        let n = r.count(8)?;
        let mut i = 0usize;
        for _ in 0..n {
            let c = r.u32()?;
            // Version 0 says unsigned, but writers put negative offsets there too: read both
            // as signed, as ffmpeg does.
            let off = r.u32()? as i32;
            for _ in 0..c {
                if i >= samples.len() {
                    break;
                }
                samples[i].cts_offset = off;
                i += 1;
            }
        }
    }
    // Sync samples.
    let sync = match child(stbl, b"stss")? {
        None => None,
        Some(stss) => {
            let mut r = Reader::new(stss, "stss");
            r.full()?;
            let n = r.count(4)?;
            let mut v = Vec::with_capacity(n as usize);
            for _ in 0..n {
                let s = r.u32()?;
                if s == 0 || s > count {
                    return Err(bad("stss names a sample that does not exist"));
                }
                v.push(s - 1);
            }
            v.sort_unstable();
            v.dedup();
            Some(v)
        }
    };
    Ok((samples, sync, dts))
}
