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
    let mut v = Vec::new();
    for p in psi_packets(SYNTH_PCR_PID) {
        v.extend_from_slice(&p);
    }
    for f in 0..frames {
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
    let p = media_playlist(&segs, "clip.ts", map_range(&ix));
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
    ) {
        let bytes = title(frames, per_frame, gop, pts0);
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
            prop_assert!(ix.key_frames.iter().any(|k| k.offset == s.offset));
        }
        let total: u64 = segs.iter().map(|s| s.duration_ticks).sum();
        prop_assert_eq!(total, ix.duration_ticks());
        let p = media_playlist(&segs, "a.ts", map_range(&ix));
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
