#![no_main]
//! Arbitrary bytes as an MP4: the top-level walk (as the server reads the file, 16 header
//! bytes per box) and, for the bytes of a `moov`, the movie and its sample index, then the
//! packaging (segments, every media segment header, the playlists and the manifest, the
//! I-frame playlist and its key segments) and the trick plays of RTSP `Scale` (forward and
//! reverse from the middle). Never a panic; every sample lies inside the file; every
//! segment's byte ranges sum to its samples' bytes and its header's `mdat` size covers them;
//! a trick play sends only sync samples. The same bytes as a fragmented MP4
//! (`mp4::frag`): an index or an error, never a panic; every fragment lies inside the file
//! after the init section, fragments in order without overlap, every track run's data inside
//! its fragment; the segments tile the fragments; the DASH manifest is made.
use libfuzzer_sys::fuzz_target;
use penstock_core::mp4::{
    MediaSegment, Mp4Limits, index_fragmented, Packaging, Trick, dash_manifest, hls_i_frames, hls_master,
    hls_media, key_segment, key_segments, parse_movie, top_level, trick_frames,
};
use penstock_core::track::Speed;

fuzz_target!(|data: &[u8]| {
    let limits = Mp4Limits {
        samples_max: 1 << 16,
        ..Mp4Limits::default()
    };
    let len = data.len() as u64;
    // The top-level walk, as the server does it.
    let mut at = 0u64;
    let mut moov = None;
    for _ in 0..limits.top_boxes_max {
        if at >= len {
            break;
        }
        let head = &data[at as usize..(at as usize + 16).min(data.len())];
        let Ok(b) = top_level(head, at, len) else { break };
        if &b.kind == b"moov" {
            moov = Some(&data[(at + u64::from(b.header_len)) as usize..b.end() as usize]);
            break;
        }
        at = b.end();
    }
    // Also the whole input as a moov body, so the fuzzer reaches the tables directly.
    for body in [moov, Some(data)].into_iter().flatten() {
        let Ok(movie) = parse_movie(body, len.max(1 << 20), &limits) else {
            continue;
        };
        for t in &movie.tracks {
            for s in &t.samples {
                assert!(s.offset + u64::from(s.size) <= len.max(1 << 20));
            }
        }
        let p = Packaging::cut(&movie, 2000);
        for c in &p.tracks {
            let t = movie.track(c.id).expect("cut from the movie");
            for (k, span) in c.segments.iter().enumerate().take(64) {
                let seg = MediaSegment::build(t, span, k);
                let payload: u64 = seg.ranges.iter().map(|r| r.1).sum();
                assert_eq!(payload, span.bytes);
            }
            let _ = hls_media(&movie, &p, c.id);
        }
        let _ = hls_master(&movie, &p);
        let _ = dash_manifest(&movie, &p);
        let _ = hls_i_frames(&movie);
        for t in &movie.tracks {
            for k in key_segments(t).iter().take(64) {
                let seg = key_segment(t, k.sample).expect("a key segment of a sync sample");
                assert_eq!(seg.len_bytes(), k.bytes);
            }
            for reverse in [false, true] {
                let trick = Trick {
                    speed: Speed::from_ratio(4, 1).expect("4"),
                    reverse,
                };
                for f in trick_frames(t, t.samples.len() / 2, trick) {
                    assert!(t.is_sync(f.sample) || t.sync.as_ref().is_some_and(|s| s.is_empty()));
                }
            }
        }
    }
    // As a fragmented MP4.
    if let Ok(f) = index_fragmented(data, limits) {
        let mut at = f.init.0 + f.init.1;
        for fr in &f.fragments {
            assert!(fr.offset >= at && fr.end() <= len, "fragments in order, inside");
            at = fr.end();
            for r in &fr.runs {
                assert!(r.samples == 0 || (r.data.0 >= fr.offset && r.data.1 <= fr.end()));
            }
        }
        for target_ms in [1, 2000] {
            let cuts = f.cut(target_ms);
            if let (Some(first), Some(last)) = (cuts.first(), cuts.last()) {
                assert_eq!(first.offset, f.fragments[0].offset);
                assert_eq!(last.offset + last.len, f.fragments.last().expect("cut").end());
                for w in cuts.windows(2) {
                    assert_eq!(w[0].offset + w[0].len, w[1].offset);
                }
            }
            let _ = penstock_core::mp4::frag::dash_manifest(&f, &cuts, "../x.mp4");
            let _ = penstock_core::hls::media_playlist(&f.hls_segments(&cuts), "x", Some(f.init));
        }
    }
});
