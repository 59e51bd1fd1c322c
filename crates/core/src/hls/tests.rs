use proptest::prelude::*;

use super::ts_index::encode_pts;
use super::*;
use crate::ts::TS_PACKET_BYTES;
use crate::ts::synth::{SYNTH_DATA_PID, SYNTH_PCR_PID, psi_packets};

/// A video PES start on the synthetic H.264 PID with `pts`, the random-access flag when
/// `key`.
fn pes_start(pts: u64, key: bool) -> [u8; TS_PACKET_BYTES] {
    let mut p = [0xffu8; TS_PACKET_BYTES];
    p[0] = 0x47;
    p[1] = 0x40 | (SYNTH_DATA_PID >> 8) as u8;
    p[2] = SYNTH_DATA_PID as u8;
    // Adaptation field (1 flag byte) and payload.
    p[3] = 0x30;
    p[4] = 1;
    p[5] = if key { 0x40 } else { 0 };
    let pes = &mut p[6..];
    pes[..9].copy_from_slice(&[0, 0, 1, 0xe0, 0, 0, 0x80, 0x80, 5]);
    pes[9..14].copy_from_slice(&encode_pts(0b0010, pts));
    // A non-IDR slice: only the flag makes it key.
    pes[14..18].copy_from_slice(&[0, 0, 1, 0x01]);
    p
}

/// A continuation packet of the video PID.
fn pes_more() -> [u8; TS_PACKET_BYTES] {
    let mut p = [0x55u8; TS_PACKET_BYTES];
    p[0] = 0x47;
    p[1] = (SYNTH_DATA_PID >> 8) as u8;
    p[2] = SYNTH_DATA_PID as u8;
    p[3] = 0x10;
    p
}

/// PAT, PMT, then `frames` frames of `per_frame` packets at 25 fps from `pts0`, a key frame
/// every `gop` frames.
fn title(frames: u64, per_frame: usize, gop: u64, pts0: u64) -> Vec<u8> {
    title_psi(frames, per_frame, gop, pts0, false)
}

/// [`title`], with the PAT and PMT repeated before every key frame after the first when
/// `repeat_psi` (as ffmpeg's muxer writes them).
fn title_psi(frames: u64, per_frame: usize, gop: u64, pts0: u64, repeat_psi: bool) -> Vec<u8> {
    let mut v = Vec::new();
    for p in psi_packets(SYNTH_PCR_PID) {
        v.extend_from_slice(&p);
    }
    for f in 0..frames {
        if repeat_psi && f > 0 && f % gop == 0 {
            for p in psi_packets(SYNTH_PCR_PID) {
                v.extend_from_slice(&p);
            }
        }
        v.extend_from_slice(&pes_start(pts0 + f * 3600, f % gop == 0));
        for _ in 1..per_frame {
            v.extend_from_slice(&pes_more());
        }
    }
    v
}

fn index_of(bytes: &[u8], chunk: usize) -> Result<TsIndex, TsIndexError> {
    let mut ix = TsIndexer::new(TsIndexLimits::default());
    for c in bytes.chunks(chunk.max(1)) {
        ix.push(c);
    }
    ix.finish()
}

#[test]
fn a_title_is_cut_at_key_frames_after_the_target_duration() {
    // 10 s at 25 fps, a key frame every 2 s: 6 s target → cuts at 6 s, and the rest (4 s).
    let bytes = title(250, 3, 50, 900_000);
    let ix = index_of(&bytes, 4096).unwrap();
    assert_eq!(ix.codec, VideoCodec::H264);
    assert_eq!(ix.key_frames.len(), 5);
    assert_eq!((ix.pat_offset, ix.pmt_offset), (0, 188));
    assert_eq!(ix.frame_ticks(), 3600);
    assert_eq!(ix.duration_ticks(), 250 * 3600);
    let segs = segments(&ix, 6 * PTS_TICKS_PER_S);
    assert_eq!(segs.len(), 2);
    assert_eq!(segs[0].offset, 0);
    assert_eq!(segs[1].offset, 2 * 188 + 150 * 3 * 188);
    assert_eq!(segs[0].duration_ticks, 6 * PTS_TICKS_PER_S);
    assert_eq!(segs[1].duration_ticks, 4 * PTS_TICKS_PER_S);
    let p = media_playlist(&segs, "clip.ts", map_range(&ix, &segs));
    assert_eq!(
        p,
        format!(
            "#EXTM3U\n#EXT-X-VERSION:7\n#EXT-X-TARGETDURATION:6\n#EXT-X-PLAYLIST-TYPE:VOD\n\
             #EXT-X-MEDIA-SEQUENCE:0\n#EXT-X-INDEPENDENT-SEGMENTS\n\
             #EXT-X-MAP:URI=\"clip.ts\",BYTERANGE=\"376@0\"\n\
             #EXTINF:6.000,\n#EXT-X-BYTERANGE:{}@0\nclip.ts\n\
             #EXTINF:4.000,\n#EXT-X-BYTERANGE:{}@{}\nclip.ts\n#EXT-X-ENDLIST\n",
            segs[0].len, segs[1].len, segs[1].offset
        )
    );
}

#[test]
fn segments_start_at_the_psi_repeated_before_their_key_frame_and_need_no_map() {
    // As above, with the PAT and PMT before every key frame: the second segment starts at
    // the PAT before the key frame at 6 s (two packets earlier), and no EXT-X-MAP.
    let bytes = title_psi(250, 3, 50, 900_000, true);
    let ix = index_of(&bytes, 4096).unwrap();
    assert_eq!(ix.key_frames.len(), 5);
    assert_eq!(ix.key_frames[0].psi, Some(0));
    let third = ix.key_frames[3];
    let pat = 2 * 188 + 150 * 3 * 188 + 2 * 2 * 188;
    assert_eq!((third.offset, third.psi), (pat + 2 * 188, Some(pat)));
    let segs = segments(&ix, 6 * PTS_TICKS_PER_S);
    assert_eq!(segs.len(), 2);
    assert_eq!(segs[1].offset, pat);
    assert_eq!(&bytes[pat as usize..pat as usize + 376], &bytes[..376]);
    assert_eq!(map_range(&ix, &segs), None);
    let p = media_playlist(&segs, "clip.ts", map_range(&ix, &segs));
    assert!(!p.contains("EXT-X-MAP"), "{p}");
    // A video packet between the PSI and the key frame: not a segment start, and the
    // playlist names the map again.
    let mut odd = bytes[..pat as usize].to_vec();
    odd.extend_from_slice(&bytes[pat as usize..pat as usize + 376]);
    odd.extend_from_slice(&pes_more());
    odd.extend_from_slice(&bytes[pat as usize + 376..]);
    let ix = index_of(&odd, 188).unwrap();
    assert_eq!(ix.key_frames[3].psi, None);
    let segs = segments(&ix, 6 * PTS_TICKS_PER_S);
    assert_eq!(segs[1].offset, pat + 3 * 188);
    assert_eq!(map_range(&ix, &segs), Some((0, 376)));
}

#[test]
fn i_frames_are_the_key_frames_whole_with_their_psi() {
    // 10 s, a key frame every 2 s, 3 packets a frame, PSI repeated before each key frame.
    let bytes = title_psi(250, 3, 50, 900_000, true);
    let ix = index_of(&bytes, 1000).unwrap();
    let f = i_frames(&ix);
    assert_eq!(f.len(), 5);
    // The first: from the PAT at 0 through its 3 packets (up to the next frame's start).
    assert_eq!(
        f[0],
        IFrame {
            offset: 0,
            len: 5 * 188,
            duration_ticks: 2 * PTS_TICKS_PER_S
        }
    );
    for (i, x) in f.iter().enumerate().skip(1) {
        let k = ix.key_frames[i];
        assert_eq!((x.offset, x.len), (k.offset - 376, 5 * 188));
        assert_eq!(
            &bytes[x.offset as usize..x.offset as usize + 376],
            &bytes[..376]
        );
    }
    assert!(f.iter().all(|x| x.duration_ticks == 2 * PTS_TICKS_PER_S));
    assert_eq!(i_frame_map(&ix), None);
    let p = i_frame_playlist(&f, "clip.ts", None);
    assert!(p.contains("#EXT-X-I-FRAMES-ONLY\n"), "{p}");
    assert!(p.contains("#EXT-X-TARGETDURATION:2\n"), "{p}");
    assert!(p.contains(&format!(
        "#EXTINF:2.000,\n#EXT-X-BYTERANGE:940@{}\nclip.ts\n",
        f[4].offset
    )));
    assert!(p.ends_with("#EXT-X-ENDLIST\n"));
    // 940 bytes shown for 2 s.
    assert_eq!(i_frame_bandwidth(&f), 940 * 8 / 2);
    // Without repeated PSI: each from its own packet, and the map.
    let ix = index_of(&title(250, 3, 50, 900_000), 1000).unwrap();
    let f = i_frames(&ix);
    assert_eq!((f[1].offset, f[1].len), (ix.key_frames[1].offset, 3 * 188));
    assert_eq!(i_frame_map(&ix), Some((0, 376)));
    let p = i_frame_playlist(&f, "clip.ts", i_frame_map(&ix));
    assert!(
        p.contains("#EXT-X-MAP:URI=\"clip.ts\",BYTERANGE=\"376@0\"\n"),
        "{p}"
    );
}

#[test]
fn what_has_no_video_or_no_key_frame_or_no_sync_is_refused() {
    let no_key = title(100, 1, 1000, 0)
        .into_iter()
        .enumerate()
        // The first frame's random-access flag cleared.
        .map(|(i, b)| if i == 2 * 188 + 5 { 0 } else { b })
        .collect::<Vec<_>>();
    assert_eq!(index_of(&no_key, 188), Err(TsIndexError::NoKeyFrame));
    let psi_less = title(100, 1, 10, 0)[2 * 188..].to_vec();
    assert_eq!(index_of(&psi_less, 188), Err(TsIndexError::NoVideo));
    let mut bad = title(10, 1, 5, 0);
    bad[3 * 188] = 0x48;
    assert_eq!(index_of(&bad, 1000), Err(TsIndexError::NotTs(3 * 188)));
    let mut ix = TsIndexer::new(TsIndexLimits { key_frames_max: 2 });
    ix.push(&title(100, 1, 10, 0));
    assert_eq!(ix.finish(), Err(TsIndexError::TooManyKeyFrames(2)));
}

#[test]
fn the_pts_wrap_is_unwrapped() {
    // Starts 2 s before the 33-bit wrap.
    let bytes = title(250, 1, 25, (1 << 33) - 2 * PTS_TICKS_PER_S);
    let ix = index_of(&bytes, 188 * 7).unwrap();
    assert_eq!(ix.duration_ticks(), 250 * 3600);
    assert!(ix.key_frames.windows(2).all(|w| w[1].pts > w[0].pts));
    let segs = segments(&ix, 4 * PTS_TICKS_PER_S);
    assert_eq!(segs.len(), 3);
}

proptest! {
    /// Chunking changes nothing; the segments tile the file, each after the first starts at
    /// a key frame, their durations add up to the title's, and every EXTINF rounded is at
    /// most the target duration the playlist states.
    #[test]
    fn segments_tile_the_file_at_key_frames(
        frames in 1u64..400,
        per_frame in 1usize..4,
        gop in 1u64..80,
        pts0 in 0u64..(1 << 33),
        target_s in 1u64..10,
        chunk in 1usize..5000,
        repeat_psi in any::<bool>(),
    ) {
        let bytes = title_psi(frames, per_frame, gop, pts0, repeat_psi);
        let ix = index_of(&bytes, chunk).unwrap();
        prop_assert_eq!(&ix, &index_of(&bytes, bytes.len()).unwrap());
        let segs = segments(&ix, target_s * PTS_TICKS_PER_S);
        prop_assert_eq!(segs[0].offset, 0);
        let mut end = 0;
        for s in &segs {
            prop_assert_eq!(s.offset, end);
            prop_assert!(s.len > 0);
            end = s.offset + s.len;
        }
        prop_assert_eq!(end, bytes.len() as u64);
        for s in &segs[1..] {
            // At a key frame, or (PSI repeated) at the PAT two packets before it, which
            // begins with the file's own PAT and PMT.
            if repeat_psi {
                prop_assert!(ix.key_frames.iter().any(|k| k.psi == Some(s.offset)));
                let at = s.offset as usize;
                prop_assert_eq!(&bytes[at..at + 376], &bytes[..376]);
            } else {
                prop_assert!(ix.key_frames.iter().any(|k| k.offset == s.offset));
            }
        }
        let total: u64 = segs.iter().map(|s| s.duration_ticks).sum();
        prop_assert_eq!(total, ix.duration_ticks());
        let map = map_range(&ix, &segs);
        prop_assert_eq!(map.is_none(), repeat_psi || segs.len() == 1);
        let p = media_playlist(&segs, "a.ts", map);
        let target: u64 = p
            .lines()
            .find_map(|l| l.strip_prefix("#EXT-X-TARGETDURATION:"))
            .unwrap()
            .parse()
            .unwrap();
        for l in p.lines().filter_map(|l| l.strip_prefix("#EXTINF:")) {
            let secs: f64 = l.trim_end_matches(',').parse().unwrap();
            prop_assert!(secs.round() as u64 <= target, "{} > {}", secs, target);
        }
        prop_assert_eq!(p.matches("#EXT-X-BYTERANGE:").count(), segs.len());

        // I-frames: one per key frame, inside the file, each holding its key frame's
        // packets up to the next frame's PES start and beginning with its PSI when
        // repeated; their durations add up to the title's.
        let f = i_frames(&ix);
        prop_assert_eq!(f.len(), ix.key_frames.len());
        for (x, k) in f.iter().zip(&ix.key_frames) {
            prop_assert!(x.offset + x.len <= bytes.len() as u64);
            prop_assert_eq!(x.offset + x.len, k.end);
            let frame = (per_frame * 188) as u64;
            prop_assert!(k.end - k.offset == frame || (repeat_psi && k.end - k.offset == frame + 376));
            prop_assert_eq!(x.offset, k.psi.unwrap_or(k.offset));
            prop_assert!(x.offset <= k.offset);
        }
        let total: u64 = f.iter().map(|x| x.duration_ticks).sum();
        prop_assert_eq!(total, ix.duration_ticks());
        prop_assert_eq!(i_frame_map(&ix).is_none(), repeat_psi || ix.key_frames.len() == 1);
    }

    /// Any bytes: an index or an error, never a panic; an index's key frames lie inside the
    /// file, in order, on packet boundaries.
    #[test]
    fn any_bytes_give_an_index_or_an_error(bytes in proptest::collection::vec(any::<u8>(), 0..4000)) {
        if let Ok(ix) = index_of(&bytes, 333) {
            prop_assert!(ix.key_frames.windows(2).all(|w| w[0].offset < w[1].offset));
            prop_assert!(ix.key_frames.iter().all(|k| k.offset % 188 == 0 && k.offset < ix.size));
        }
    }
}

// ---- Renditions: SPS and ADTS read while indexing, bandwidth, the multivariant playlist ----

/// SPS NAL units x264 wrote (ffmpeg's testsrc; the first three yuv444p, High 4:4:4
/// Predictive, the last yuv420p High), as ffprobe describes them.
const SPS_SAMPLES: &[(&str, u32, u32, &str)] = &[
    (
        "67f40028919680780227e27011000003000100000300320f1832a0",
        1920,
        1080,
        "avc1.f40028",
    ),
    (
        "67f4000c919681419f8dc044000003000400000300c83c50aa80",
        320,
        180,
        "avc1.f4000c",
    ),
    (
        "67f4001e919680a02ff89c0440000003004000000c83c58ba8",
        640,
        360,
        "avc1.f4001e",
    ),
    (
        "6764001facd9405005bb011000000300100000030320f1831960",
        1280,
        720,
        "avc1.64001f",
    ),
];

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// An ADTS header: AAC LC (profile 1), 48 kHz (index 3), stereo, a 256-byte frame.
const ADTS_LC_48K_STEREO: [u8; 7] = [0xff, 0xf1, 0x4c, 0x80, 0x20, 0x1f, 0xfc];

#[test]
fn an_h264_sps_gives_the_picture_size_and_codecs() {
    for &(h, w, ht, codecs) in SPS_SAMPLES {
        let sps = parse_h264_sps(&hex(h)).unwrap();
        assert_eq!(
            (sps.width, sps.height, sps.codecs().as_str()),
            (w, ht, codecs)
        );
    }
    // x264's Constrained Baseline at 640x360 (what `-preset ultrafast -pix_fmt yuv420p`
    // writes): 368 lines coded, 8 cropped.
    let sps = parse_h264_sps(&hex("6742c01eda0280bfe5c044000003000400000300c83c58ba80")).unwrap();
    assert_eq!(
        (sps.width, sps.height, sps.codecs().as_str()),
        (640, 360, "avc1.42c01e")
    );
    // Not an SPS, empty, truncated before the size: errors.
    assert_eq!(parse_h264_sps(&[0x68, 0xce]), Err(MediaError::NotSps(8)));
    assert_eq!(parse_h264_sps(&[]), Err(MediaError::Truncated));
    let full = hex(SPS_SAMPLES[0].0);
    assert_eq!(parse_h264_sps(&full[..6]), Err(MediaError::Truncated));
}

/// SPS NAL units x265 wrote (yuv420p, Main), as ffprobe describes them (level 63 and 120:
/// level_idc is 30 × the level).
const H265_SPS_SAMPLES: &[(&str, u32, u32, &str)] = &[
    (
        "42010101600000030090000003000003003fa00502016965959a4932bc05a0200000030020000003032100",
        640,
        360,
        "hvc1.1.6.L63.90",
    ),
    (
        "420101016000000300900000030000030078a003c08010e596566924caf0168080000003008000000c84",
        1920,
        1080,
        "hvc1.1.6.L120.90",
    ),
];

#[test]
fn an_h265_sps_gives_the_picture_size_and_codecs() {
    for &(h, w, ht, codecs) in H265_SPS_SAMPLES {
        let sps = parse_h265_sps(&hex(h)).unwrap();
        assert_eq!(
            (sps.width, sps.height, sps.codecs().as_str()),
            (w, ht, codecs)
        );
    }
    // Profile space, tier, constraint bytes past the first.
    let s = H265Sps {
        profile_space: 1,
        tier: true,
        profile_idc: 2,
        compatibility_flags: 0x2000_0000,
        constraint_flags: [0xb0, 0, 0x01, 0, 0, 0],
        level_idc: 153,
        width: 1,
        height: 1,
    };
    assert_eq!(s.codecs(), "hvc1.A2.4.H153.B0.0.1");
    assert_eq!(parse_h265_sps(&[0x40, 0x01]), Err(MediaError::NotSps(32)));
    assert_eq!(parse_h265_sps(&[0x42]), Err(MediaError::Truncated));
    let full = hex(H265_SPS_SAMPLES[0].0);
    assert_eq!(parse_h265_sps(&full[..10]), Err(MediaError::Truncated));
}

#[test]
fn an_adts_header_gives_the_object_type() {
    let h = parse_adts(&ADTS_LC_48K_STEREO).unwrap();
    assert_eq!(
        (
            h.object_type,
            h.sampling_frequency_index,
            h.channel_configuration
        ),
        (2, 3, 2)
    );
    assert_eq!(h.codecs(), "mp4a.40.2");
    assert_eq!(h.frame_length, 256);
    // Found at the start of a PES, or later only when the next frame's header follows.
    let mut es = vec![0x11; 5];
    es.extend_from_slice(&ADTS_LC_48K_STEREO);
    assert_eq!(media::find_adts(&es), None);
    es.resize(5 + 256, 0x11);
    es.extend_from_slice(&ADTS_LC_48K_STEREO);
    assert_eq!(media::find_adts(&es), Some(5));
    assert_eq!(media::find_adts(&ADTS_LC_48K_STEREO), Some(0));
    assert_eq!(
        parse_adts(&ADTS_LC_48K_STEREO[..6]),
        Err(MediaError::Truncated)
    );
    assert_eq!(parse_adts(&[0; 7]), Err(MediaError::NoAdtsSync));
    let mut bad = ADTS_LC_48K_STEREO;
    bad[2] |= 0x3c; // sampling frequency index 15
    assert!(parse_adts(&bad).is_err());
}

/// The packets of one PES on `pid` (the first with the random-access flag when `key`), the
/// last padded with 0xff in the payload.
fn pes_packets(pid: u16, pts: u64, stream_id: u8, es: &[u8], key: bool) -> Vec<u8> {
    let mut pes = vec![0, 0, 1, stream_id, 0, 0, 0x80, 0x80, 5];
    pes.extend_from_slice(&encode_pts(0b0010, pts));
    pes.extend_from_slice(es);
    let mut out = Vec::new();
    let mut first = true;
    let mut rest = &pes[..];
    while first || !rest.is_empty() {
        let mut p = [0xffu8; TS_PACKET_BYTES];
        p[0] = 0x47;
        p[1] = if first { 0x40 } else { 0 } | (pid >> 8) as u8;
        p[2] = pid as u8;
        let at = if first {
            p[3] = 0x30;
            p[4] = 1;
            p[5] = if key { 0x40 } else { 0 };
            6
        } else {
            p[3] = 0x10;
            4
        };
        let n = rest.len().min(TS_PACKET_BYTES - at);
        p[at..at + n].copy_from_slice(&rest[..n]);
        rest = &rest[n..];
        out.extend_from_slice(&p);
        first = false;
    }
    out
}

const AUDIO_PID: u16 = 0x102;

/// PAT, a PMT naming H.264 on the synthetic PID and `audio_type` on [`AUDIO_PID`], a key
/// frame whose SPS (`sps`) straddles its first two TS packets, an audio PES beginning with
/// `adts`, then 49 frames more (2 s at 25 fps).
fn rendition(sps: &[u8], audio_type: u8, adts: &[u8]) -> Vec<u8> {
    let mut v = psi_packets(SYNTH_PCR_PID)[0].to_vec();
    let mut body = (0xe000 | SYNTH_DATA_PID).to_be_bytes().to_vec();
    body.extend_from_slice(&[0xf0, 0x00]);
    for (t, pid) in [(0x1b, SYNTH_DATA_PID), (audio_type, AUDIO_PID)] {
        body.push(t);
        body.extend_from_slice(&(0xe000 | pid).to_be_bytes());
        body.extend_from_slice(&[0xf0, 0x00]);
    }
    let mut pmt = [0u8; TS_PACKET_BYTES];
    pmt[..4].copy_from_slice(&[
        0x47,
        0x40 | (crate::ts::synth::SYNTH_PMT_PID >> 8) as u8,
        crate::ts::synth::SYNTH_PMT_PID as u8,
        0x10,
    ]);
    pmt[4..].copy_from_slice(&crate::ts::psi::section_payload(0x02, 1, &body, 184).expect("fits"));
    v.extend_from_slice(&pmt);
    // AUD, a filler NAL unit, then SPS and PPS: the SPS starts ~10 bytes before the end of the
    // first packet.
    let mut es = vec![0, 0, 0, 1, 0x09, 0xf0, 0, 0, 0, 1, 0x0c];
    es.resize(160, 0xff);
    es.extend_from_slice(&[0, 0, 0, 1]);
    es.extend_from_slice(sps);
    es.extend_from_slice(&[0, 0, 0, 1, 0x68, 0xce, 0x3c, 0x80, 0, 0, 1, 0x65, 0x88]);
    v.extend_from_slice(&pes_packets(SYNTH_DATA_PID, 0, 0xe0, &es, true));
    v.extend_from_slice(&pes_packets(AUDIO_PID, 0, 0xc0, adts, false));
    for f in 1..50 {
        v.extend_from_slice(&pes_start(f * 3600, false));
    }
    v
}

#[test]
fn the_indexer_keeps_the_first_sps_and_adts_header() {
    let sps = hex(SPS_SAMPLES[2].0);
    let mut adts = ADTS_LC_48K_STEREO.to_vec();
    adts.extend_from_slice(&[0x21; 40]);
    let bytes = rendition(&sps, 0x0f, &adts);
    for chunk in [1, 7, 188, 1000, bytes.len()] {
        let ix = index_of(&bytes, chunk).unwrap();
        assert_eq!(ix.sps.as_deref(), Some(&sps[..]), "chunk {chunk}");
        let a = ix.audio.as_ref().unwrap();
        assert_eq!((a.pid, a.stream_type), (AUDIO_PID, 0x0f));
        assert_eq!(a.adts, Some(ADTS_LC_48K_STEREO));
        assert_eq!(
            stream_info(&ix),
            StreamInfo {
                resolution: Some((640, 360)),
                codecs: Some("avc1.f4001e,mp4a.40.2".into()),
            }
        );
    }
    // AC-3 is named by its stream type; AAC without a readable header, or video whose SPS does
    // not parse, leaves CODECS out (a partial list would deny a stream); the size stays when
    // only the audio is unknown.
    let ix = index_of(&rendition(&sps, 0x81, &[0; 8]), 188).unwrap();
    assert_eq!(stream_info(&ix).codecs.as_deref(), Some("avc1.f4001e,ac-3"));
    let ix = index_of(&rendition(&sps, 0x0f, &[0; 8]), 188).unwrap();
    assert_eq!(
        stream_info(&ix),
        StreamInfo {
            resolution: Some((640, 360)),
            codecs: None
        }
    );
    let ix = index_of(&rendition(&[0x67, 0x42], 0x0f, &adts), 188).unwrap();
    assert_eq!(stream_info(&ix), StreamInfo::default());
    // Bounded: an SPS longer than the scan is kept cut at the bound (and then fails to parse).
    let mut long = sps.clone();
    long.resize(3 * SPS_SCAN_BYTES, 0x55);
    let ix = index_of(&rendition(&long, 0x0f, &adts), 188).unwrap();
    assert!(ix.sps.unwrap().len() <= SPS_SCAN_BYTES);
}

fn seg(len: u64, secs: f64) -> Segment {
    Segment {
        offset: 0,
        len,
        duration_ticks: (secs * PTS_TICKS_PER_S as f64) as u64,
    }
}

#[test]
fn bandwidth_is_the_peak_segment_and_the_whole_file_average() {
    // 750,000 bytes over 6 s (1 Mbit/s), 250,000 over 4 s (500 kbit/s).
    let (peak, avg) = bandwidth(&[seg(750_000, 6.0), seg(250_000, 4.0)]);
    assert_eq!((peak, avg), (1_000_000, 800_000));
    assert_eq!(bandwidth(&[]), (0, 0));
}

#[test]
fn the_multivariant_playlist_lists_renditions_by_bandwidth() {
    let v = |uri: &str, bw, res, codecs: Option<&str>| Variant {
        uri: uri.into(),
        bandwidth: bw,
        average_bandwidth: bw / 2,
        resolution: res,
        codecs: codecs.map(str::to_string),
        i_frames: None,
    };
    let p = master_playlist(&[
        v(
            "hi.ts/index.m3u8",
            900_000,
            Some((640, 360)),
            Some("avc1.42c01e,mp4a.40.2"),
        ),
        v("lo.ts/index.m3u8", 300_000, None, None),
    ]);
    assert_eq!(
        p,
        "#EXTM3U\n#EXT-X-INDEPENDENT-SEGMENTS\n\
         #EXT-X-STREAM-INF:BANDWIDTH=300000,AVERAGE-BANDWIDTH=150000\nlo.ts/index.m3u8\n\
         #EXT-X-STREAM-INF:BANDWIDTH=900000,AVERAGE-BANDWIDTH=450000,\
         CODECS=\"avc1.42c01e,mp4a.40.2\",RESOLUTION=640x360\nhi.ts/index.m3u8\n"
    );
    let mut hi = v(
        "hi.ts/index.m3u8",
        900_000,
        Some((640, 360)),
        Some("avc1.42c01e,mp4a.40.2"),
    );
    hi.i_frames = Some(("hi.ts/iframes.m3u8".into(), 120_000));
    let p = master_playlist(&[hi]);
    assert!(
        p.ends_with(
            "hi.ts/index.m3u8\n#EXT-X-I-FRAME-STREAM-INF:BANDWIDTH=120000,\
             CODECS=\"avc1.42c01e\",RESOLUTION=640x360,URI=\"hi.ts/iframes.m3u8\"\n"
        ),
        "{p}"
    );
}

proptest! {
    /// Any bytes: a value or an error, never a panic, for the SPS and ADTS readers; an SPS
    /// that parses has a picture.
    #[test]
    fn any_bytes_give_an_sps_adts_or_an_error(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let mut nal = vec![0x67];
        nal.extend_from_slice(&bytes);
        if let Ok(s) = parse_h264_sps(&nal) {
            prop_assert!(s.width > 0 && s.height > 0);
        }
        let _ = parse_h264_sps(&bytes);
        let mut nal = vec![0x42, 0x01];
        nal.extend_from_slice(&bytes);
        if let Ok(s) = parse_h265_sps(&nal) {
            prop_assert!(s.width > 0 && s.height > 0);
        }
        let _ = parse_h265_sps(&bytes);
        let _ = parse_adts(&bytes);
        let _ = media::find_adts(&bytes);
    }

    /// Every prefix of a real SPS: a value or an error.
    #[test]
    fn truncated_sps_is_an_error_or_a_value(cut in 0usize..60, which in 0usize..4) {
        let full = hex(SPS_SAMPLES[which].0);
        let _ = parse_h264_sps(&full[..cut.min(full.len())]);
        let full = hex(H265_SPS_SAMPLES[which % 2].0);
        let _ = parse_h265_sps(&full[..cut.min(full.len())]);
    }

    /// The peak is never below the average; the average lies between the slowest and the
    /// fastest segment.
    #[test]
    fn peak_bandwidth_is_at_least_the_average(
        segs in proptest::collection::vec((1u64..10_000_000, 1u64..2_000_000), 1..50),
    ) {
        let segs: Vec<Segment> = segs
            .into_iter()
            .map(|(len, t)| Segment { offset: 0, len, duration_ticks: t })
            .collect();
        let (peak, avg) = bandwidth(&segs);
        prop_assert!(peak >= avg);
        let slowest = segs.iter().map(|s| s.len * 8 * PTS_TICKS_PER_S / s.duration_ticks).min().unwrap();
        prop_assert!(avg >= slowest);
    }
}
