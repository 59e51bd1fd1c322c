use proptest::prelude::*;

use super::boxes::{Children, Reader, child};
use super::movie::{Codec, Sample, TrackKind, parse_movie};
use super::write::{PlainTrack, init_segment, plain_moov};
use super::*;

const AVCC: [u8; 11] = [1, 0x64, 0, 0x1f, 0xff, 0xe1, 0, 0, 0xe1, 0, 0];

fn video(n: usize, frame: u32, base: u64, gop: usize) -> PlainTrack {
    let samples = (0..n)
        .map(|i| Sample {
            offset: base + i as u64 * 1000,
            dts: i as u64 * u64::from(frame),
            size: 1000,
            cts_offset: if i % 3 == 1 { 2 * frame as i32 } else { 0 },
        })
        .collect();
    PlainTrack {
        id: 1,
        kind: TrackKind::Video,
        timescale: 12800,
        codec: Codec::Avc {
            config: AVCC.to_vec(),
        },
        samples,
        last_duration: frame,
        sync: Some((0..n as u32).step_by(gop).collect()),
        co64: false,
    }
}

fn body(moov: &[u8]) -> &[u8] {
    &moov[8..]
}

fn parse(moov: &[u8], file_len: u64) -> Result<Movie, Mp4Error> {
    parse_movie(body(moov), file_len, &Mp4Limits::default())
}

proptest! {
    /// Tables written by our own minimal writer read back sample for sample.
    #[test]
    fn sample_tables_round_trip(
        sizes in prop::collection::vec(1u32..5000, 1..300),
        deltas in prop::collection::vec(1u32..3000, 1..300),
        ctos in prop::collection::vec(-3i32..4, 1..300),
        gaps in prop::collection::vec(0u64..3, 1..300),
        sync_every in 1usize..40,
        co64 in any::<bool>(),
    ) {
        let n = sizes.len();
        let mut off = if co64 { 5 << 32 } else { 48 };
        let mut dts = 0u64;
        let mut samples = Vec::new();
        for i in 0..n {
            off += gaps[i % gaps.len()] * 7;
            samples.push(Sample { offset: off, dts, size: sizes[i], cts_offset: ctos[i % ctos.len()] * 100 });
            off += u64::from(sizes[i]);
            dts += u64::from(deltas[i % deltas.len()]);
        }
        let last = deltas[(n - 1) % deltas.len()];
        let sync: Vec<u32> = (0..n as u32).step_by(sync_every).collect();
        let t = PlainTrack {
            id: 7, kind: TrackKind::Video, timescale: 90000,
            codec: Codec::Avc { config: AVCC.to_vec() },
            samples: samples.clone(), last_duration: last, sync: Some(sync.clone()), co64,
        };
        let moov = plain_moov(1000, &[t]);
        let m = parse(&moov, off).unwrap();
        let tr = &m.tracks[0];
        prop_assert_eq!(&tr.samples, &samples);
        prop_assert_eq!(tr.sync.as_ref(), Some(&sync));
        prop_assert_eq!(tr.end_dts, samples[n - 1].dts + u64::from(last));
        // The sync sample at or before any time is a sync sample, and no later one is.
        for probe in [0, dts / 3, dts / 2, dts] {
            let i = tr.sync_at_or_before(probe);
            prop_assert!(tr.is_sync(i));
            prop_assert!(tr.samples[i].dts <= probe.max(tr.samples[0].dts));
        }
        // One byte short of the last sample: refused, naming the sample.
        let short = parse(&moov, off - 1);
        let is_past_end = matches!(short, Err(Mp4Error::SamplePastEnd { .. }));
        prop_assert!(is_past_end);
    }

    /// Any bytes: an error or a movie, never a panic (the fuzz target does this at scale).
    #[test]
    fn arbitrary_moov_bytes_never_panic(b in prop::collection::vec(any::<u8>(), 0..600)) {
        let _ = parse_movie(&b, 1 << 40, &Mp4Limits::default());
    }
}

#[test]
fn a_2_pow_32_entry_stsz_is_refused_before_allocating() {
    let mut moov = plain_moov(1000, &[video(10, 512, 100, 5)]);
    // stsz: size field 0 (a table), count 2^32-1: the table would need 16 GiB of box.
    let at = moov.windows(4).position(|w| w == b"stsz").unwrap();
    moov[at + 12..at + 16].copy_from_slice(&u32::MAX.to_be_bytes());
    assert!(matches!(
        parse(&moov, 1 << 20),
        Err(Mp4Error::TableOverrun { table: "stsz", .. })
    ));
    // A fixed size with 2^32-1 samples: more bytes than the file has.
    moov[at + 8..at + 12].copy_from_slice(&1u32.to_be_bytes());
    assert!(matches!(
        parse(&moov, 1 << 20),
        Err(Mp4Error::TableOverrun { table: "stsz", .. })
    ));
}

#[test]
fn too_many_samples_are_refused_by_the_limit() {
    let moov = plain_moov(1000, &[video(100, 512, 100, 5)]);
    let limits = Mp4Limits {
        samples_max: 50,
        ..Mp4Limits::default()
    };
    assert_eq!(
        parse_movie(body(&moov), 1 << 20, &limits),
        Err(Mp4Error::TooManySamples(100, 50))
    );
}

#[test]
fn a_truncated_moov_is_refused() {
    let moov = plain_moov(1000, &[video(10, 512, 100, 5)]);
    for cut in [20, moov.len() / 2, moov.len() - 3] {
        let r = parse(&moov[..cut], 1 << 20);
        assert!(r.is_err(), "cut at {cut}: {r:?}");
    }
}

#[test]
fn boxes_that_do_not_advance_or_overrun_are_refused() {
    // A box claiming 4 bytes (smaller than its header), and one past its parent.
    let tiny = [0, 0, 0, 4, b'f', b'r', b'e', b'e', 0, 0, 0, 0];
    assert!(matches!(
        Children::new(&tiny, 0).next(),
        Some(Err(Mp4Error::BadBox { .. }))
    ));
    let over = [0, 0, 0, 99, b'f', b'r', b'e', b'e'];
    assert!(matches!(
        Children::new(&over, 0).next(),
        Some(Err(Mp4Error::BadBox { .. }))
    ));
    // 64-bit size 0 (would loop in place): smaller than its header.
    let big0 = [0, 0, 0, 1, b'm', b'd', b'a', b't', 0, 0, 0, 0, 0, 0, 0, 0];
    assert!(boxes::top_level(&big0, 0, 1000).is_err());
    // size 0: to the end of the file.
    let to_end = [0, 0, 0, 0, b'm', b'd', b'a', b't'];
    assert_eq!(boxes::top_level(&to_end, 100, 1000).unwrap().size, 900);
    let h64 = [0, 0, 0, 1, b'm', b'd', b'a', b't', 0, 0, 0, 1, 0, 0, 0, 0];
    assert_eq!(boxes::top_level(&h64, 0, 1 << 33).unwrap().size, 1 << 32);
}

#[test]
fn an_unknown_codec_is_named() {
    let mut moov = plain_moov(1000, &[video(4, 512, 100, 2)]);
    let at = moov.windows(4).position(|w| w == b"avc1").unwrap();
    moov[at..at + 4].copy_from_slice(b"av01");
    assert_eq!(
        parse(&moov, 1 << 20),
        Err(Mp4Error::UnknownCodec {
            track: 1,
            codec: "av01".into()
        })
    );
}

#[test]
fn the_aac_config_is_read_from_esds() {
    let aac = PlainTrack {
        id: 2,
        kind: TrackKind::Audio,
        timescale: 48000,
        codec: Codec::Aac {
            asc: vec![0x11, 0x90],
            channels: 2,
            sample_rate: 48000,
        },
        samples: (0..50)
            .map(|i| Sample {
                offset: 200_000 + i * 300,
                dts: i * 1024,
                size: 300,
                cts_offset: 0,
            })
            .collect(),
        last_duration: 1024,
        sync: None,
        co64: true,
    };
    let m = parse(&plain_moov(1000, &[video(30, 512, 100, 10), aac]), 1 << 20).unwrap();
    let a = m.audio().unwrap();
    assert_eq!(
        a.codec,
        Codec::Aac {
            asc: vec![0x11, 0x90],
            channels: 2,
            sample_rate: 48000
        }
    );
    assert_eq!(a.codec.rfc6381(), "mp4a.40.2");
    assert_eq!(m.video().unwrap().codec.rfc6381(), "avc1.64001f");
}

/// A `moof` as the packager writes it, read back: the fields a player uses.
fn read_trun(header: &[u8]) -> (u32, u64, u32, u32, Vec<u32>) {
    let moof = child(header, b"moof").unwrap().unwrap();
    let traf = child(moof, b"traf").unwrap().unwrap();
    let tfhd = child(traf, b"tfhd").unwrap().unwrap();
    let tfdt = child(traf, b"tfdt").unwrap().unwrap();
    let trun = child(traf, b"trun").unwrap().unwrap();
    let mut r = Reader::new(tfhd, "tfhd");
    let (_, tf_flags) = r.full().unwrap();
    let id = r.u32().unwrap();
    let mut r = Reader::new(tfdt, "tfdt");
    r.full().unwrap();
    let base = r.u64().unwrap();
    let mut r = Reader::new(trun, "trun");
    let (_, flags) = r.full().unwrap();
    let n = r.u32().unwrap();
    let data_offset = r.u32().unwrap();
    if flags & 4 != 0 {
        r.u32().unwrap();
    }
    let mut sizes = Vec::new();
    for _ in 0..n {
        if flags & 0x100 != 0 {
            r.u32().unwrap();
        }
        sizes.push(r.u32().unwrap());
        if flags & 0x400 != 0 {
            r.u32().unwrap();
        }
        if flags & 0x800 != 0 {
            r.u32().unwrap();
        }
    }
    assert_eq!(r.remaining(), 0);
    assert_eq!(tf_flags & 0x02_0000, 0x02_0000, "default-base-is-moof");
    (id, base, data_offset, n, sizes)
}

#[test]
fn segments_cut_at_sync_samples_and_their_headers_read_back() {
    // 25 fps in 12800: 512 ticks a frame; a sync sample every 50 frames (2 s).
    let m = parse(&plain_moov(1000, &[video(300, 512, 100, 50)]), 1 << 20).unwrap();
    let p = Packaging::cut(&m, 6000);
    let segs = &p.tracks[0].segments;
    assert_eq!(segs.len(), 2);
    assert_eq!((segs[0].first, segs[0].end), (0, 150));
    assert_eq!((segs[1].first, segs[1].end), (150, 300));
    let t = m.video().unwrap();
    for (k, s) in segs.iter().enumerate() {
        assert!(t.is_sync(s.first));
        let seg = MediaSegment::build(t, s, k);
        // One range: the samples are contiguous in this file.
        assert_eq!(seg.ranges, vec![(100 + s.first as u64 * 1000, 150_000)]);
        let (id, base, data_offset, n, sizes) = read_trun(&seg.header);
        assert_eq!((id, base, n), (1, s.dts, 150));
        assert_eq!(data_offset as usize, seg.header.len());
        assert!(sizes.iter().all(|&x| x == 1000));
        // The mdat header's size covers the payload.
        let mdat = &seg.header[seg.header.len() - 8..];
        assert_eq!(&mdat[4..], b"mdat");
        assert_eq!(u32::from_be_bytes(mdat[..4].try_into().unwrap()), 150_008);
        // Headers are a small part of a 2 Mbit/s-like payload.
        assert!(seg.header.len() as u64 * 50 <= 150_000);
    }
    let media = hls_media(&m, &p, 1).unwrap();
    assert!(media.contains("#EXT-X-MAP:URI=\"track-1/init.mp4\"\n"));
    assert!(media.contains("#EXTINF:6.000,\ntrack-1/0.m4s\n"));
    assert!(media.contains("#EXT-X-TARGETDURATION:6\n"));
    let mpd = dash_manifest(&m, &p);
    assert!(mpd.contains("<S t=\"0\" d=\"76800\" r=\"1\"/>"), "{mpd}");
}

#[test]
fn the_init_segment_reads_back_with_empty_tables_and_mvex() {
    let mut t = video(4, 512, 100, 2);
    t.codec = Codec::Hevc {
        config: vec![
            1, 0x01, 0x60, 0, 0, 0, 0x90, 0, 0, 0, 0, 0, 93, 0xf0, 0, 0xfc,
        ],
    };
    let moov = plain_moov(1000, &[t]);
    let m = parse(&moov, 1 << 20).unwrap();
    assert_eq!(m.tracks[0].codec.rfc6381(), "hvc1.1.6.L93.90");
    let init = init_segment(&m, &m.tracks[0]);
    let moov = child(&init, b"moov").unwrap().unwrap();
    assert!(child(moov, b"mvex").unwrap().is_some());
    // Read back as a movie: no samples, the codec kept (mvex makes parse_movie say
    // fragmented: strip it by reading the trak directly).
    let trak = child(moov, b"trak").unwrap().unwrap();
    let stbl = child(
        child(child(trak, b"mdia").unwrap().unwrap(), b"minf")
            .unwrap()
            .unwrap(),
        b"stbl",
    )
    .unwrap()
    .unwrap();
    assert!(stbl.windows(4).any(|w| w == b"hvc1"));
    assert_eq!(child(stbl, b"stsz").unwrap().unwrap(), &[0u8; 12][..]);
    assert_eq!(
        parse_movie(moov, 1 << 20, &Mp4Limits::default()),
        Err(Mp4Error::Fragmented)
    );
}

/// Found by the fuzz target: two tracks with one id made a segment of one index the other's
/// samples (a panic where the server looks a track up by id).
#[test]
fn two_tracks_with_one_id_are_refused() {
    let mut a = video(10, 512, 100, 5);
    let mut b = video(20, 512, 100_000, 5);
    a.id = 3;
    b.id = 3;
    assert!(matches!(
        parse(&plain_moov(1000, &[a, b]), 1 << 20),
        Err(Mp4Error::Inconsistent { track: 3, .. })
    ));
}
