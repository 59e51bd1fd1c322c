//! The fragmented-MP4 index against files made by our own writer (`write.rs`): both layouts
//! (every track in each `moof`; one track per fragment), then each bad input the server must
//! refuse with a clear error.

use proptest::prelude::*;

use super::boxes::{Children, child};
use super::frag::{FragmentedMp4, index_fragmented};
use super::movie::{Codec, Movie, Sample, TrackKind, parse_movie};
use super::write::{PlainTrack, init_segment, media_segment_header, plain_moov, put_box};
use super::{Mp4Error, Mp4Limits};
use crate::hls::PTS_TICKS_PER_S;

const AVCC: [u8; 11] = [1, 0x64, 0, 0x1f, 0xff, 0xe1, 0, 0, 0xe1, 0, 0];

/// A movie of a 25 fps video track (timescale 12800, a sync sample every `gop`) and, with
/// `audio`, an AAC track (48 kHz, 1024 per frame); sample sizes vary.
fn movie(frames: usize, gop: usize, audio: bool) -> Movie {
    let v = PlainTrack {
        id: 1,
        kind: TrackKind::Video,
        timescale: 12800,
        codec: Codec::Avc {
            config: AVCC.to_vec(),
        },
        samples: (0..frames)
            .map(|i| Sample {
                offset: 0,
                dts: i as u64 * 512,
                size: 100 + (i as u32 * 37) % 400,
                cts_offset: 0,
            })
            .collect(),
        last_duration: 512,
        sync: Some((0..frames as u32).step_by(gop).collect()),
        co64: false,
    };
    let mut tracks = vec![v];
    if audio {
        let n = frames * 48000 / 25 / 1024;
        tracks.push(PlainTrack {
            id: 2,
            kind: TrackKind::Audio,
            timescale: 48000,
            codec: Codec::Aac {
                asc: vec![0x11, 0x90],
                channels: 2,
                sample_rate: 48000,
            },
            samples: (0..n)
                .map(|i| Sample {
                    offset: 0,
                    dts: i as u64 * 1024,
                    size: 50 + (i as u32 * 11) % 90,
                    cts_offset: 0,
                })
                .collect(),
            last_duration: 1024,
            sync: None,
            co64: false,
        });
    }
    let moov = plain_moov(1000, &tracks);
    parse_movie(&moov[8..], 1 << 40, &Mp4Limits::default()).unwrap()
}

/// ftyp + a moov with every track of `m` and a trex each (from the one-track init segments).
fn init_of(m: &Movie) -> Vec<u8> {
    let mut ftyp = Vec::new();
    let mut mvhd = Vec::new();
    let mut traks = Vec::new();
    let mut trexs = Vec::new();
    for t in &m.tracks {
        let init = init_segment(m, t);
        for c in Children::new(&init, 0) {
            let (kind, body) = c.unwrap();
            match &kind {
                b"ftyp" if ftyp.is_empty() => put_box(&mut ftyp, b"ftyp", |o| o.extend(body)),
                b"moov" => {
                    for c in Children::new(body, 0) {
                        let (k, b) = c.unwrap();
                        match &k {
                            b"mvhd" if mvhd.is_empty() => {
                                put_box(&mut mvhd, b"mvhd", |o| o.extend(b))
                            }
                            b"trak" => put_box(&mut traks, b"trak", |o| o.extend(b)),
                            b"mvex" => trexs.extend_from_slice(b),
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
    }
    let mut o = ftyp;
    put_box(&mut o, b"moov", |o| {
        o.extend(&mvhd);
        o.extend(&traks);
        put_box(o, b"mvex", |o| o.extend(&trexs));
    });
    o
}

/// Where the `trun` data offset of the `k`th traf of a moof lies.
fn data_offset_at(moof: &[u8], k: usize) -> usize {
    let at = moof
        .windows(4)
        .enumerate()
        .filter(|(_, w)| *w == b"trun")
        .nth(k)
        .unwrap()
        .0;
    at + 4 + 4 + 4
}

/// The file: init, then fragments of `gop` video frames (`movie`'s GOP or a part of one), each with (muxed) or followed by
/// (one track per fragment) the audio of the same time; payload bytes are the sample index.
fn fragmented(m: &Movie, gop: usize, muxed: bool) -> Vec<u8> {
    let mut o = init_of(m);
    let v = m.video().unwrap();
    let a = m.audio();
    let mut seq = 1;
    let mut ai = 0;
    for first in (0..v.samples.len()).step_by(gop) {
        let end = (first + gop).min(v.samples.len());
        let t_end = if end == v.samples.len() {
            u64::MAX
        } else {
            v.samples[end].dts
        };
        let a_range = a.map(|a| {
            let from = ai;
            while ai < a.samples.len() && a.samples[ai].dts * 12800 / 48000 < t_end {
                ai += 1;
            }
            (a, from, ai)
        });
        let payload = |t: &super::Track, f: usize, e: usize| -> Vec<u8> {
            t.samples[f..e]
                .iter()
                .flat_map(|s| std::iter::repeat_n((s.dts % 251) as u8, s.size as usize))
                .collect()
        };
        let vh = media_segment_header(v, seq, first, end);
        seq += 1;
        let vp = payload(v, first, end);
        match a_range {
            Some((a, af, ae)) if muxed => {
                // One moof with both trafs, one mdat: video data, then audio data.
                let ah = media_segment_header(a, seq, af, ae);
                let ap = payload(a, af, ae);
                let moof_of = |h: &[u8]| -> Vec<u8> {
                    let n = u32::from_be_bytes(h[0..4].try_into().unwrap()) as usize;
                    h[..n].to_vec()
                };
                let (vm, am) = (moof_of(&vh), moof_of(&ah));
                let vtraf = child(&vm[8..], b"traf").unwrap().unwrap().to_vec();
                let atraf = child(&am[8..], b"traf").unwrap().unwrap().to_vec();
                let mfhd = child(&vm[8..], b"mfhd").unwrap().unwrap().to_vec();
                let mut moof = Vec::new();
                put_box(&mut moof, b"moof", |o| {
                    put_box(o, b"mfhd", |o| o.extend(&mfhd));
                    put_box(o, b"traf", |o| o.extend(&vtraf));
                    put_box(o, b"traf", |o| o.extend(&atraf));
                });
                let data = moof.len() as u32 + 8;
                let at = data_offset_at(&moof, 0);
                moof[at..at + 4].copy_from_slice(&data.to_be_bytes());
                let at = data_offset_at(&moof, 1);
                moof[at..at + 4].copy_from_slice(&(data + vp.len() as u32).to_be_bytes());
                o.extend(&moof);
                o.extend(((vp.len() + ap.len() + 8) as u32).to_be_bytes());
                o.extend(b"mdat");
                o.extend(&vp);
                o.extend(&ap);
            }
            other => {
                o.extend(&vh);
                o.extend(&vp);
                if let Some((a, af, ae)) = other
                    && ae > af
                {
                    o.extend(media_segment_header(a, seq, af, ae));
                    seq += 1;
                    o.extend(payload(a, af, ae));
                }
            }
        }
    }
    o
}

fn index(data: &[u8]) -> Result<FragmentedMp4, Mp4Error> {
    index_fragmented(data, Mp4Limits::default())
}

/// Each segment of `f` is a run of whole fragments that starts with a video sync sample,
/// they tile the file from the first fragment to the last one's end, and their durations
/// add up to the video's.
fn check_segments(f: &FragmentedMp4, target_ms: u64, frames: usize) {
    let segs = f.segments(target_ms);
    assert!(!segs.is_empty());
    assert_eq!(segs[0].offset, f.fragments[0].offset);
    for w in segs.windows(2) {
        assert_eq!(w[0].offset + w[0].len, w[1].offset, "contiguous");
    }
    let last = segs.last().unwrap();
    assert_eq!(last.offset + last.len, f.fragments.last().unwrap().end());
    for s in &segs {
        let frag = f
            .fragments
            .iter()
            .find(|x| x.offset == s.offset)
            .expect("a segment starts at a fragment");
        let lead = f
            .fragments
            .iter()
            .skip_while(|x| x.offset < frag.offset)
            .find_map(|x| x.run(1))
            .unwrap();
        assert!(lead.starts_sync);
    }
    let total: u64 = segs.iter().map(|s| s.duration_ticks).sum();
    assert_eq!(total, frames as u64 * 512 * PTS_TICKS_PER_S / 12800);
    // Every segment but the last lasts at least the target.
    for s in &segs[..segs.len() - 1] {
        assert!(s.duration_ticks * 1000 >= target_ms * PTS_TICKS_PER_S);
    }
}

#[test]
fn a_muxed_fragmented_file_is_indexed_fragment_by_fragment() {
    let m = movie(250, 25, true);
    let data = fragmented(&m, 25, true);
    let f = index(&data).unwrap();
    assert_eq!(f.fragments.len(), 10);
    assert_eq!(f.movie.tracks.len(), 2);
    assert!(f.movie.tracks.iter().all(|t| t.samples.is_empty()));
    assert_eq!(f.init.0, 0);
    assert_eq!(f.init.1, f.fragments[0].offset);
    assert_eq!(f.codecs(), "avc1.64001f,mp4a.40.2");
    for (k, fr) in f.fragments.iter().enumerate() {
        assert_eq!(fr.runs.len(), 2);
        let v = fr.run(1).unwrap();
        assert_eq!(
            (v.base_dts, v.duration, v.samples),
            (k as u64 * 25 * 512, 25 * 512, 25)
        );
        assert!(v.starts_sync);
        // The video data is what the writer put there: sample k*25's marker byte.
        assert_eq!(data[v.data.0 as usize], ((k as u64 * 25 * 512) % 251) as u8);
        assert!(fr.run(2).unwrap().starts_sync);
    }
    check_segments(&f, 2000, 250);
    assert_eq!(f.segments(2000).len(), 5);
    assert_eq!(f.segments(1).len(), 10);
}

#[test]
fn one_track_per_fragment_is_indexed_and_cut_at_video_fragments() {
    let m = movie(200, 20, true);
    let data = fragmented(&m, 20, false);
    let f = index(&data).unwrap();
    assert_eq!(f.fragments.len(), 20);
    assert!(f.fragments.iter().all(|x| x.runs.len() == 1));
    // Audio runs follow on from each other without tfdt too (the writer writes tfdt: it is
    // checked against the summed durations here).
    let mut next = 0;
    for fr in &f.fragments {
        if let Some(a) = fr.run(2) {
            assert_eq!(a.base_dts, next);
            next = a.base_dts + a.duration;
        }
    }
    check_segments(&f, 2000, 200);
    // Segments start at video fragments only.
    for s in f.segments(1500) {
        let fr = f.fragments.iter().find(|x| x.offset == s.offset).unwrap();
        assert!(fr.run(1).is_some());
    }
}

proptest! {
    /// Any GOP, target and layout: segments tile the fragments, start at sync, sum up.
    #[test]
    fn segments_are_runs_of_whole_fragments(
        frames in 30usize..300, gop in 5usize..60, target_ms in 500u64..8000, muxed in any::<bool>(),
        per_gop in 1usize..4,
    ) {
        // Fragments of a GOP, or of a half or a third of one (those that start mid-GOP do
        // not start with a sync sample, and never start a segment).
        let m = movie(frames, gop, true);
        let frag = gop.div_ceil(per_gop);
        let data = fragmented(&m, frag, muxed);
        let f = index(&data).unwrap();
        check_segments(&f, target_ms, frames);
    }

    /// Any bytes after a valid init: an error or an index, never a panic.
    #[test]
    fn arbitrary_fragments_never_panic(b in prop::collection::vec(any::<u8>(), 0..400), cut in 0usize..2000) {
        let m = movie(20, 5, true);
        let mut data = fragmented(&m, 5, true);
        let cut = cut.min(data.len());
        data.truncate(data.len() - cut);
        data.extend(&b);
        let _ = index(&data);
    }
}

#[test]
fn a_moof_pointing_past_the_end_is_refused() {
    let m = movie(50, 25, false);
    let mut data = fragmented(&m, 25, true);
    let f = index(&data).unwrap();
    let moof_at = f.fragments[1].offset as usize;
    let at = moof_at + data_offset_at(&data[moof_at..], 0);
    data[at..at + 4].copy_from_slice(&(1u32 << 30).to_be_bytes());
    assert!(matches!(
        index(&data),
        Err(Mp4Error::FragmentPastEnd { track: 1, .. })
    ));
    // Pointing inside the file but outside its own fragment (into the first one).
    let back = -(f.fragments[1].offset as i64 - 100) as i32;
    data[at..at + 4].copy_from_slice(&back.to_be_bytes());
    assert!(matches!(
        index(&data),
        Err(Mp4Error::FragmentDataOutside { track: 1, .. })
    ));
}

#[test]
fn a_trun_with_2_pow_32_samples_is_refused() {
    let m = movie(50, 25, false);
    let mut data = fragmented(&m, 25, true);
    let at = data.windows(4).position(|w| w == b"trun").unwrap();
    // count = 2^32 - 1: with per-sample fields, more than the box holds.
    data[at + 8..at + 12].copy_from_slice(&u32::MAX.to_be_bytes());
    assert!(matches!(
        index(&data),
        Err(Mp4Error::TableOverrun { table: "trun", .. })
    ));
    // Without per-sample fields (flags: data offset only), against the samples limit.
    data[at + 5..at + 8].copy_from_slice(&[0, 0, 1]);
    assert!(matches!(index(&data), Err(Mp4Error::TooManySamples(..))));
}

#[test]
fn fragments_before_the_moov_are_refused() {
    let m = movie(50, 25, false);
    let data = fragmented(&m, 25, true);
    let f = index(&data).unwrap();
    let (init, frags) = data.split_at(f.init.1 as usize);
    let ftyp_len = u32::from_be_bytes(init[0..4].try_into().unwrap()) as usize;
    let mut swapped = init[..ftyp_len].to_vec();
    swapped.extend(frags);
    swapped.extend(&init[ftyp_len..]);
    assert_eq!(
        index(&swapped),
        Err(Mp4Error::FragmentBeforeMoov {
            offset: ftyp_len as u64
        })
    );
}

#[test]
fn a_truncated_last_fragment_is_refused() {
    let m = movie(50, 25, true);
    let data = fragmented(&m, 25, true);
    let f = index(&data).unwrap();
    let last = &f.fragments[1];
    // Cut in the mdat, in the moof, and right after the moof (no mdat at all).
    let moof_len = u32::from_be_bytes(
        data[last.offset as usize..last.offset as usize + 4]
            .try_into()
            .unwrap(),
    ) as u64;
    for cut_at in [
        data.len() as u64 - 10,
        last.offset + 20,
        last.offset + moof_len,
    ] {
        let r = index(&data[..cut_at as usize]);
        assert!(
            matches!(r, Err(Mp4Error::FragmentTruncated { .. })),
            "cut at {cut_at}: {r:?}"
        );
    }
}

#[test]
fn a_plain_movie_is_not_fragmented_and_a_fragmented_one_not_plain() {
    let m = movie(50, 25, false);
    let data = fragmented(&m, 25, true);
    let f = index(&data).unwrap();
    let moov_at = u32::from_be_bytes(data[0..4].try_into().unwrap()) as usize;
    assert_eq!(
        parse_movie(
            &data[moov_at + 8..f.init.1 as usize],
            1 << 20,
            &Mp4Limits::default()
        ),
        Err(Mp4Error::Fragmented)
    );
    let plain = plain_moov(1000, &[]);
    assert!(matches!(
        index(&plain),
        Err(Mp4Error::NotFragmented | Mp4Error::NoTracks)
    ));
}

#[test]
fn the_fragment_limits_hold() {
    let m = movie(100, 10, false);
    let data = fragmented(&m, 10, true);
    let limits = Mp4Limits {
        fragments_max: 5,
        ..Mp4Limits::default()
    };
    assert_eq!(
        index_fragmented(&data, limits),
        Err(Mp4Error::TooManyFragments(5))
    );
    let limits = Mp4Limits {
        moof_bytes_max: 16,
        ..Mp4Limits::default()
    };
    assert!(matches!(
        index_fragmented(&data, limits),
        Err(Mp4Error::MoofTooLarge { max: 16, .. })
    ));
}

/// A `sidx` between the moov and the first moof and a `styp` before each moof (CMAF
/// segments' brands) belong to the fragment that follows; a trailing `mfra` to none.
#[test]
fn boxes_before_a_moof_belong_to_its_fragment() {
    let m = movie(100, 25, true);
    let plain = fragmented(&m, 25, true);
    let f0 = index(&plain).unwrap();
    let init_end = f0.init.1 as usize;
    let styp = {
        let mut b = Vec::new();
        put_box(&mut b, b"styp", |o| o.extend(b"cmfs\0\0\0\0cmfs"));
        b
    };
    let mut data = plain[..init_end].to_vec();
    put_box(&mut data, b"sidx", |o| o.extend([0u8; 24]));
    let mut starts = Vec::new();
    for fr in &f0.fragments {
        starts.push(data.len() as u64);
        data.extend(&styp);
        data.extend(&plain[fr.offset as usize..fr.end() as usize]);
    }
    let last_end = data.len() as u64;
    put_box(&mut data, b"mfra", |o| o.extend([0u8; 16]));
    let f = index(&data).unwrap();
    assert_eq!(f.sidx, Some((init_end as u64, 32)));
    // The first fragment from the sidx, the others from their styp.
    let got: Vec<u64> = f.fragments.iter().map(|x| x.offset).collect();
    let mut want = starts.clone();
    want[0] = init_end as u64;
    assert_eq!(got, want);
    assert_eq!(f.fragments.last().unwrap().end(), last_end);
    check_segments(&f, 2000, 100);
}

/// A moov with mvex whose own tables hold samples (ffmpeg without `empty_moov`) is refused:
/// no player's init section may hold samples, and they are in no fragment.
#[test]
fn samples_in_a_fragmented_moov_are_refused() {
    let m = movie(50, 25, false);
    let data = fragmented(&m, 25, true);
    let f = index(&data).unwrap();
    // A moov with the plain movie's tables and an mvex.
    let v = m.video().unwrap();
    let tracks = [PlainTrack {
        id: 1,
        kind: TrackKind::Video,
        timescale: v.timescale,
        codec: v.codec.clone(),
        samples: vec![Sample {
            offset: 0,
            dts: 0,
            size: 10,
            cts_offset: 0,
        }],
        last_duration: 512,
        sync: None,
        co64: false,
    }];
    let plain_moov = plain_moov(1000, &tracks);
    let mut moov = Vec::new();
    put_box(&mut moov, b"moov", |o| {
        o.extend(&plain_moov[8..]);
        let init = &data[..f.init.1 as usize];
        let mvex = init.windows(4).position(|w| w == b"mvex").unwrap() - 4;
        let n = u32::from_be_bytes(init[mvex..mvex + 4].try_into().unwrap()) as usize;
        o.extend(&init[mvex..mvex + n]);
    });
    let ftyp = u32::from_be_bytes(data[0..4].try_into().unwrap()) as usize;
    let mut file = data[..ftyp].to_vec();
    file.extend(&moov);
    file.extend(&data[f.init.1 as usize..]);
    assert_eq!(
        index(&file),
        Err(Mp4Error::SamplesInFragmentedMoov { track: 1 })
    );
}
