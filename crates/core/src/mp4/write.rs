//! Boxes written: the fragmented-MP4 init segment of one track (`ftyp` + a `moov` with empty
//! sample tables and `mvex`/`trex`), a media segment's `moof` (`mfhd`, `traf`: `tfhd`,
//! `tfdt`, `trun`) and `mdat` header, and — for tests and fuzzing — a plain MP4's `moov` from
//! sample lists ([`plain_moov`]), which [`super::movie::parse_movie`] reads back.

use super::movie::{Codec, Movie, Sample, Track, TrackKind};

/// Appends a box: `f` writes the body, the size is patched after.
pub fn put_box(out: &mut Vec<u8>, kind: &[u8; 4], f: impl FnOnce(&mut Vec<u8>)) {
    let at = out.len();
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(kind);
    f(out);
    let size = (out.len() - at) as u32;
    out[at..at + 4].copy_from_slice(&size.to_be_bytes());
}

/// Appends a full box (version, flags).
pub fn put_full(
    out: &mut Vec<u8>,
    kind: &[u8; 4],
    version: u8,
    flags: u32,
    f: impl FnOnce(&mut Vec<u8>),
) {
    put_box(out, kind, |o| {
        o.extend_from_slice(&((u32::from(version) << 24) | (flags & 0xff_ffff)).to_be_bytes());
        f(o);
    });
}

fn u16b(o: &mut Vec<u8>, v: u16) {
    o.extend_from_slice(&v.to_be_bytes());
}
fn u32b(o: &mut Vec<u8>, v: u32) {
    o.extend_from_slice(&v.to_be_bytes());
}
fn u64b(o: &mut Vec<u8>, v: u64) {
    o.extend_from_slice(&v.to_be_bytes());
}

const MATRIX: [u32; 9] = [0x10000, 0, 0, 0, 0x10000, 0, 0, 0, 0x4000_0000];

/// The init segment of `track` alone (a rendition of its own): `ftyp` + `moov` (`mvhd`, the
/// track with its own `tkhd`, `edts`, `mdhd`, `hdlr`, media header and `stsd` copied, empty
/// `stts`/`stsc`/`stsz`/`stco`, and `mvex`/`trex`). An `hev1` sample entry is tagged `hvc1`
/// (the parameter sets are in `hvcC`; Safari plays only `hvc1`).
pub fn init_segment(movie: &Movie, track: &Track) -> Vec<u8> {
    let mut o = Vec::with_capacity(1024 + track.stsd.len());
    put_box(&mut o, b"ftyp", |o| {
        o.extend_from_slice(b"iso6");
        u32b(o, 0);
        for b in [b"iso6", b"cmfc", b"iso5", b"dash", b"mp41"] {
            o.extend_from_slice(b);
        }
    });
    put_box(&mut o, b"moov", |o| {
        put_full(o, b"mvhd", 0, 0, |o| {
            u32b(o, 0);
            u32b(o, 0);
            u32b(o, movie.timescale);
            u32b(o, 0);
            u32b(o, 0x10000);
            u16b(o, 0x100);
            o.extend_from_slice(&[0; 10]);
            for m in MATRIX {
                u32b(o, m);
            }
            o.extend_from_slice(&[0; 24]);
            u32b(o, track.id + 1);
        });
        put_box(o, b"trak", |o| {
            o.extend_from_slice(&track.tkhd);
            if let Some(e) = &track.edts {
                o.extend_from_slice(e);
            }
            put_box(o, b"mdia", |o| {
                o.extend_from_slice(&track.mdhd);
                o.extend_from_slice(&track.hdlr);
                put_box(o, b"minf", |o| {
                    o.extend_from_slice(&track.media_header);
                    put_box(o, b"dinf", |o| {
                        put_full(o, b"dref", 0, 0, |o| {
                            u32b(o, 1);
                            put_full(o, b"url ", 0, 1, |_| {});
                        });
                    });
                    put_box(o, b"stbl", |o| {
                        let at = o.len();
                        o.extend_from_slice(&track.stsd);
                        // stsd: header 8, full 4, count 4, then the entry: size 4, type 4.
                        if o.get(at + 20..at + 24) == Some(b"hev1") {
                            o[at + 20..at + 24].copy_from_slice(b"hvc1");
                        }
                        for k in [b"stts", b"stsc", b"stco"] {
                            put_full(o, k, 0, 0, |o| u32b(o, 0));
                        }
                        put_full(o, b"stsz", 0, 0, |o| {
                            u32b(o, 0);
                            u32b(o, 0);
                        });
                    });
                });
            });
        });
        put_box(o, b"mvex", |o| {
            put_full(o, b"trex", 0, 0, |o| {
                u32b(o, track.id);
                u32b(o, 1);
                u32b(o, 0);
                u32b(o, 0);
                u32b(o, 0);
            });
        });
    });
    o
}

/// `trun`/`tfhd` sample flags: a sync sample (depends on no other) and a non-sync one.
pub const SYNC_FLAGS: u32 = 0x0200_0000;
pub const NON_SYNC_FLAGS: u32 = 0x0101_0000;

/// The generated part of a media segment: `moof` + the `mdat` header; the `mdat` payload is
/// the samples' bytes, `payload_bytes` of them, which the caller sends from the file.
pub fn media_segment_header(track: &Track, sequence: u32, first: usize, end: usize) -> Vec<u8> {
    // A span cut from another track cannot index past this one's samples.
    let end = end.min(track.samples.len());
    let first = first.min(end);
    let s = &track.samples[first..end];
    let payload: u64 = s.iter().map(|x| u64::from(x.size)).sum();
    let duration = |i: usize| -> u32 {
        let k = first + i;
        let next = track.samples.get(k + 1).map_or(track.end_dts, |n| n.dts);
        next.saturating_sub(track.samples[k].dts) as u32
    };
    let flags = |i: usize| {
        if track.is_sync(first + i) {
            SYNC_FLAGS
        } else {
            NON_SYNC_FLAGS
        }
    };
    let n = s.len();
    let same_duration = (1..n).all(|i| duration(i) == duration(0));
    let same_flags_after_first = (2..n).all(|i| flags(i) == flags(1));
    let first_differs = n > 1 && flags(0) != flags(1);
    let any_cto = s.iter().any(|x| x.cts_offset != 0);
    // tfhd: default-base-is-moof, and defaults where every sample agrees.
    let mut tfhd_flags = 0x02_0000;
    if same_duration && n > 0 {
        tfhd_flags |= 0x08;
    }
    if n > 0 && same_flags_after_first {
        tfhd_flags |= 0x20;
    }
    let mut trun_flags = 0x01 | 0x200; // data offset, sizes
    if tfhd_flags & 0x08 == 0 {
        trun_flags |= 0x100;
    }
    if tfhd_flags & 0x20 == 0 {
        trun_flags |= 0x400;
    } else if first_differs {
        trun_flags |= 0x004;
    }
    if any_cto {
        trun_flags |= 0x800;
    }
    let mut o = Vec::with_capacity(128 + n * 16);
    let mut data_offset_at = 0;
    put_box(&mut o, b"moof", |o| {
        put_full(o, b"mfhd", 0, 0, |o| u32b(o, sequence));
        put_box(o, b"traf", |o| {
            put_full(o, b"tfhd", 0, tfhd_flags, |o| {
                u32b(o, track.id);
                if tfhd_flags & 0x08 != 0 {
                    u32b(o, duration(0));
                }
                if tfhd_flags & 0x20 != 0 {
                    u32b(o, flags(n.min(2) - 1));
                }
            });
            put_full(o, b"tfdt", 1, 0, |o| {
                u64b(o, s.first().map_or(0, |x| x.dts))
            });
            put_full(o, b"trun", 1, trun_flags, |o| {
                u32b(o, n as u32);
                data_offset_at = o.len();
                u32b(o, 0);
                if trun_flags & 0x004 != 0 {
                    u32b(o, flags(0));
                }
                for (i, x) in s.iter().enumerate() {
                    if trun_flags & 0x100 != 0 {
                        u32b(o, duration(i));
                    }
                    u32b(o, x.size);
                    if trun_flags & 0x400 != 0 {
                        u32b(o, flags(i));
                    }
                    if trun_flags & 0x800 != 0 {
                        u32b(o, x.cts_offset as u32);
                    }
                }
            });
        });
    });
    let large = payload + 8 > u64::from(u32::MAX);
    let mdat_header = if large { 16 } else { 8 };
    let data_offset = (o.len() + mdat_header) as u32;
    o[data_offset_at..data_offset_at + 4].copy_from_slice(&data_offset.to_be_bytes());
    if large {
        u32b(&mut o, 1);
        o.extend_from_slice(b"mdat");
        u64b(&mut o, payload + 16);
    } else {
        u32b(&mut o, (payload + 8) as u32);
        o.extend_from_slice(b"mdat");
    }
    o
}

/// What [`plain_moov`] writes for one track.
#[derive(Debug, Clone)]
pub struct PlainTrack {
    pub id: u32,
    pub kind: TrackKind,
    pub timescale: u32,
    pub codec: Codec,
    /// Samples in decode order; their offsets are written as one chunk per sample.
    pub samples: Vec<Sample>,
    /// The last sample's duration (the others' follow from the decode times).
    pub last_duration: u32,
    pub sync: Option<Vec<u32>>,
    pub co64: bool,
}

/// A plain (non-fragmented) MP4's `moov` box (header included) holding `tracks`: for tests
/// and fuzz seeds. Sample tables are written compactly (runs in `stts`/`ctts`/`stsc`).
pub fn plain_moov(timescale: u32, tracks: &[PlainTrack]) -> Vec<u8> {
    let mut o = Vec::new();
    put_box(&mut o, b"moov", |o| {
        put_full(o, b"mvhd", 0, 0, |o| {
            u32b(o, 0);
            u32b(o, 0);
            u32b(o, timescale);
            u32b(o, 0);
            u32b(o, 0x10000);
            u16b(o, 0x100);
            o.extend_from_slice(&[0; 10]);
            for m in MATRIX {
                u32b(o, m);
            }
            o.extend_from_slice(&[0; 24]);
            u32b(o, tracks.len() as u32 + 1);
        });
        for t in tracks {
            put_box(o, b"trak", |o| plain_trak(o, t));
        }
    });
    o
}

fn plain_trak(o: &mut Vec<u8>, t: &PlainTrack) {
    put_full(o, b"tkhd", 0, 3, |o| {
        u32b(o, 0);
        u32b(o, 0);
        u32b(o, t.id);
        u32b(o, 0);
        u32b(o, 0);
        o.extend_from_slice(&[0; 8]);
        u16b(o, 0);
        u16b(o, 0);
        u16b(o, if t.kind == TrackKind::Audio { 0x100 } else { 0 });
        u16b(o, 0);
        for m in MATRIX {
            u32b(o, m);
        }
        let (w, h) = if t.kind == TrackKind::Video {
            (640u32, 360u32)
        } else {
            (0, 0)
        };
        u32b(o, w << 16);
        u32b(o, h << 16);
    });
    put_box(o, b"mdia", |o| {
        put_full(o, b"mdhd", 0, 0, |o| {
            u32b(o, 0);
            u32b(o, 0);
            u32b(o, t.timescale);
            u32b(o, 0);
            u16b(o, 0x55c4);
            u16b(o, 0);
        });
        put_full(o, b"hdlr", 0, 0, |o| {
            u32b(o, 0);
            o.extend_from_slice(if t.kind == TrackKind::Video {
                b"vide"
            } else {
                b"soun"
            });
            o.extend_from_slice(&[0; 12]);
            o.push(0);
        });
        put_box(o, b"minf", |o| {
            if t.kind == TrackKind::Video {
                put_full(o, b"vmhd", 0, 1, |o| o.extend_from_slice(&[0; 8]));
            } else {
                put_full(o, b"smhd", 0, 0, |o| o.extend_from_slice(&[0; 4]));
            }
            put_box(o, b"stbl", |o| plain_stbl(o, t));
        });
    });
}

/// A sample entry for `codec` (avc1 + avcC, hvc1 + hvcC, mp4a + esds).
pub fn sample_entry(o: &mut Vec<u8>, codec: &Codec) {
    match codec {
        Codec::Avc { config } | Codec::Hevc { config } => {
            let (k, c) = if matches!(codec, Codec::Avc { .. }) {
                (b"avc1", b"avcC")
            } else {
                (b"hvc1", b"hvcC")
            };
            put_box(o, k, |o| {
                o.extend_from_slice(&[0; 6]);
                u16b(o, 1);
                o.extend_from_slice(&[0; 16]);
                u16b(o, 640);
                u16b(o, 360);
                u32b(o, 0x48_0000);
                u32b(o, 0x48_0000);
                u32b(o, 0);
                u16b(o, 1);
                o.extend_from_slice(&[0; 32]);
                u16b(o, 0x18);
                u16b(o, 0xffff);
                put_box(o, c, |o| o.extend_from_slice(config));
            });
        }
        Codec::Aac {
            asc,
            channels,
            sample_rate,
        } => {
            put_box(o, b"mp4a", |o| {
                o.extend_from_slice(&[0; 6]);
                u16b(o, 1);
                o.extend_from_slice(&[0; 8]);
                u16b(o, *channels);
                u16b(o, 16);
                u32b(o, 0);
                u32b(o, sample_rate << 16);
                put_full(o, b"esds", 0, 0, |o| {
                    let dsi_len = asc.len() as u8;
                    let dc_len = 13 + 2 + dsi_len;
                    let es_len = 3 + 2 + dc_len + 3;
                    o.extend_from_slice(&[3, es_len, 0, 1, 0]);
                    o.extend_from_slice(&[4, dc_len, 0x40, 0x15, 0, 0, 0]);
                    o.extend_from_slice(&[0; 8]);
                    o.extend_from_slice(&[5, dsi_len]);
                    o.extend_from_slice(asc);
                    o.extend_from_slice(&[6, 1, 2]);
                });
            });
        }
    }
}

fn plain_stbl(o: &mut Vec<u8>, t: &PlainTrack) {
    put_full(o, b"stsd", 0, 0, |o| {
        u32b(o, 1);
        sample_entry(o, &t.codec);
    });
    // stts: runs of equal deltas.
    let deltas: Vec<u32> = (0..t.samples.len())
        .map(|i| match t.samples.get(i + 1) {
            Some(n) => (n.dts - t.samples[i].dts) as u32,
            None => t.last_duration,
        })
        .collect();
    let runs = |v: &[u32]| -> Vec<(u32, u32)> {
        let mut r: Vec<(u32, u32)> = Vec::new();
        for &x in v {
            match r.last_mut() {
                Some((c, y)) if *y == x => *c += 1,
                _ => r.push((1, x)),
            }
        }
        r
    };
    put_full(o, b"stts", 0, 0, |o| {
        let r = runs(&deltas);
        u32b(o, r.len() as u32);
        for (c, d) in r {
            u32b(o, c);
            u32b(o, d);
        }
    });
    if t.samples.iter().any(|s| s.cts_offset != 0) {
        let ctos: Vec<u32> = t.samples.iter().map(|s| s.cts_offset as u32).collect();
        put_full(o, b"ctts", 1, 0, |o| {
            let r = runs(&ctos);
            u32b(o, r.len() as u32);
            for (c, d) in r {
                u32b(o, c);
                u32b(o, d);
            }
        });
    }
    if let Some(sync) = &t.sync {
        put_full(o, b"stss", 0, 0, |o| {
            u32b(o, sync.len() as u32);
            for s in sync {
                u32b(o, s + 1);
            }
        });
    }
    // One chunk per run of contiguous samples.
    let mut chunks: Vec<(u64, u32)> = Vec::new();
    let mut end = None;
    for s in &t.samples {
        match chunks.last_mut() {
            Some((_, n)) if end == Some(s.offset) => *n += 1,
            _ => chunks.push((s.offset, 1)),
        }
        end = Some(s.offset + u64::from(s.size));
    }
    put_full(o, b"stsc", 0, 0, |o| {
        let mut r: Vec<(u32, u32)> = Vec::new();
        for (i, &(_, n)) in chunks.iter().enumerate() {
            if r.last().is_none_or(|&(_, m)| m != n) {
                r.push((i as u32 + 1, n));
            }
        }
        u32b(o, r.len() as u32);
        for (first, n) in r {
            u32b(o, first);
            u32b(o, n);
            u32b(o, 1);
        }
    });
    put_full(o, b"stsz", 0, 0, |o| {
        u32b(o, 0);
        u32b(o, t.samples.len() as u32);
        for s in &t.samples {
            u32b(o, s.size);
        }
    });
    if t.co64 {
        put_full(o, b"co64", 0, 0, |o| {
            u32b(o, chunks.len() as u32);
            for &(off, _) in &chunks {
                u64b(o, off);
            }
        });
    } else {
        put_full(o, b"stco", 0, 0, |o| {
            u32b(o, chunks.len() as u32);
            for &(off, _) in &chunks {
                u32b(o, off as u32);
            }
        });
    }
}
