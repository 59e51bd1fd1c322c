//! HLS and DASH of a plain MP4, packaged on the fly: `GET /movie.mp4/index.m3u8` and
//! `/movie.mp4/manifest.mpd` for MP4s ffmpeg makes here (moov first with `+faststart`, and at
//! the end without; H.264 + AAC, and H.265 where libx265 is), played by ffmpeg, whose packets
//! must be the source's; bad files get a 415 naming why, and the server goes on serving.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

fn have_ffmpeg() -> bool {
    penstock_testreq::require("ffmpeg")
}

/// 13 s of video (a key frame every 2 s at 25 fps) and AAC in MP4.
fn movie(path: &Path, codec: &str, faststart: bool) {
    let mut c = Command::new("ffmpeg");
    c.args(["-hide_banner", "-loglevel", "error", "-y"])
        .args(["-f", "lavfi", "-i", "testsrc=size=320x240:rate=25"])
        .args(["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000"])
        .args([
            "-t",
            "13",
            "-c:v",
            codec,
            "-preset",
            "ultrafast",
            "-g",
            "50",
        ])
        .args(["-keyint_min", "50", "-sc_threshold", "0", "-c:a", "aac"]);
    if codec == "libx264" && !faststart {
        c.args(["-bf", "3"]);
    }
    if codec == "libx265" {
        // Closed GOPs of 50 frames: every key frame an IDR, as with x264's settings above.
        c.args([
            "-x265-params",
            "log-level=error:keyint=50:min-keyint=50:scenecut=0:open-gop=0",
            "-tag:v",
            "hvc1",
        ]);
    }
    if faststart {
        c.args(["-movflags", "+faststart"]);
    }
    let o = c.arg(path).output().expect("ffmpeg");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// `ffmpeg -c copy -f framemd5` of one stream of `input` (`v` or `a`): per packet its dts and
/// (duration, size, md5), the header comments left out. The MP4 demuxer applies the edit
/// lists (the AAC priming frame at -1024, the first picture at 0, with "skip samples" side
/// data on the first audio packet); the HLS and DASH demuxers put the earliest packet at 0,
/// so every packet of both streams comes 1024/48000 s later: the dts are compared as one
/// constant shift per stream, the rest exactly (side data left out).
fn packets(input: &str, stream: &str) -> Vec<(i64, i64, String)> {
    let o = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-i", input])
        .args([
            "-map",
            &format!("0:{stream}"),
            "-c",
            "copy",
            "-f",
            "framemd5",
            "-",
        ])
        .output()
        .expect("ffmpeg");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            (
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
                format!("{},{},{}", f[3], f[4], f[5]),
            )
        })
        .collect()
}

fn get(f: &Fixture, path: &str) -> (u16, String, Vec<u8>) {
    let mut r = agent().get(f.url(path)).call().unwrap();
    let ty = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (r.status().as_u16(), ty, r.body_mut().read_to_vec().unwrap())
}

fn plays_as_the_source(f: &Fixture, name: &str) {
    let src = f.path(name);
    let src = src.to_str().unwrap();
    let (status, ty, body) = get(f, &format!("/{name}/index.m3u8"));
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(ty, "application/vnd.apple.mpegurl");
    let master = String::from_utf8(body).unwrap();
    println!("{master}");
    assert!(master.contains("#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID=\"audio\""));
    assert!(master.contains("AUDIO=\"audio\""));
    let (status, _, body) = get(f, &format!("/{name}/track-1.m3u8"));
    assert_eq!(status, 200);
    let media = String::from_utf8(body).unwrap();
    assert!(media.contains("#EXT-X-MAP:URI=\"track-1/init.mp4\""));
    // Segments of ~6 s cut at key frames (every 2 s): 6, 6, 1.
    let extinf: Vec<&str> = media
        .lines()
        .filter_map(|l| l.strip_prefix("#EXTINF:"))
        .collect();
    assert_eq!(extinf, ["6.000,", "6.000,", "1.000,"], "{media}");

    let hls = f.url(&format!("/{name}/index.m3u8"));
    for stream in ["v", "a"] {
        let want = packets(src, stream);
        let got = packets(&hls, stream);
        same_packets(&got, &want, stream);
    }
    // DASH: the manifest, and ffmpeg's DASH demuxer reads the same packets.
    let (status, ty, body) = get(f, &format!("/{name}/manifest.mpd"));
    assert_eq!(status, 200);
    assert_eq!(ty, "application/dash+xml");
    let mpd = String::from_utf8(body).unwrap();
    assert!(mpd.contains("<SegmentTimeline>"), "{mpd}");
    let dash = f.url(&format!("/{name}/manifest.mpd"));
    for stream in ["v", "a"] {
        same_packets(&packets(&dash, stream), &packets(src, stream), stream);
    }
}

/// Every packet identical (duration, size, md5), but the last one's duration: the MP4
/// demuxer ends the last AAC frame where the edit list ends the track (ffmpeg's priming
/// edit makes it 384 of 1024 samples here), while a fragment carries the frame's whole
/// duration from `stts` (a fragmented track's end is its last sample's end). Its bytes
/// must still be identical.
fn same_packets(got: &[(i64, i64, String)], want: &[(i64, i64, String)], stream: &str) {
    assert!(want.len() > 100, "{} packets", want.len());
    assert_eq!(got.len(), want.len(), "{stream}: packet count");
    let shift = got[0].0 - want[0].0;
    println!("{stream}: {} packets, dts shifted by {shift}", got.len());
    let last = want.len() - 1;
    for (i, ((gd, gp, g), (wd, wp, w))) in got.iter().zip(want).enumerate() {
        assert_eq!(gd - wd, shift, "{stream} packet {i}: dts {gd} for {wd}");
        assert_eq!(gp - wp, shift, "{stream} packet {i}: pts {gp} for {wp}");
        if i == last {
            let tail = |s: &str| s.split_once(',').unwrap().1.to_string();
            assert_eq!(tail(g), tail(w), "{stream} last packet's size and md5");
        } else {
            assert_eq!(g, w, "{stream} packet {i}");
        }
    }
}

#[test]
fn an_h264_aac_mp4_plays_as_hls_and_dash_faststart_or_not() {
    if !have_ffmpeg() {
        return;
    }
    let f = start();
    movie(&f.path("fast.mp4"), "libx264", true);
    movie(&f.path("slow.mp4"), "libx264", false);
    plays_as_the_source(&f, "fast.mp4");
    plays_as_the_source(&f, "slow.mp4");
}

#[test]
fn an_h265_mp4_is_tagged_hvc1_and_plays() {
    if !have_ffmpeg() {
        return;
    }
    let enc = Command::new("ffmpeg")
        .args(["-hide_banner", "-encoders"])
        .output()
        .expect("ffmpeg");
    if !String::from_utf8_lossy(&enc.stdout).contains("libx265") {
        eprintln!("SKIP: this ffmpeg has no libx265");
        return;
    }
    let f = start();
    movie(&f.path("hevc.mp4"), "libx265", false);
    let (_, _, body) = get(&f, "/hevc.mp4/index.m3u8");
    let master = String::from_utf8(body).unwrap();
    assert!(master.contains("CODECS=\"hvc1."), "{master}");
    let (status, _, init) = get(&f, "/hevc.mp4/track-1/init.mp4");
    assert_eq!(status, 200);
    assert!(init.windows(4).any(|w| w == b"hvc1"));
    plays_as_the_source(&f, "hevc.mp4");
}

#[test]
fn segments_are_headers_then_the_files_bytes() {
    if !have_ffmpeg() {
        return;
    }
    let f = start();
    movie(&f.path("m.mp4"), "libx264", false);
    let file = std::fs::read(f.path("m.mp4")).unwrap();
    let (status, ty, seg) = get(&f, "/m.mp4/track-1/1.m4s");
    assert_eq!((status, ty.as_str()), (200, "video/mp4"));
    assert_eq!(&seg[4..8], b"moof");
    let moof = u32::from_be_bytes(seg[0..4].try_into().unwrap()) as usize;
    assert_eq!(&seg[moof + 4..moof + 8], b"mdat");
    // Byte for byte what the core's packager says: the header, then the sample ranges of
    // the file (read here from the file itself).
    let moov = find(&file, b"moov") - 4;
    let moov_len = u32::from_be_bytes(file[moov..moov + 4].try_into().unwrap()) as usize;
    let movie = penstock_core::mp4::parse_movie(
        &file[moov + 8..moov + moov_len],
        file.len() as u64,
        &Default::default(),
    )
    .unwrap();
    let p = penstock_core::mp4::Packaging::cut(&movie, 6000);
    let t = movie.track(1).unwrap();
    let want = penstock_core::mp4::MediaSegment::build(t, &p.track(1).unwrap().segments[1], 1);
    let mut bytes = want.header.clone();
    for &(off, len) in &want.ranges {
        bytes.extend_from_slice(&file[off as usize..(off + len) as usize]);
    }
    assert_eq!(seg.len(), bytes.len());
    assert!(
        seg == bytes,
        "the segment differs from header + the file's ranges"
    );
    // (The ≤ 2 % bound on generated bytes is checked at 2 Mbit/s, under strace, in
    // penstock/tests/hls_syscalls.rs: this clip is a few hundred kbit/s of B-frames.)
    let payload = (seg.len() - want.header.len()) as f64;
    println!(
        "segment 1: {} header bytes, {payload} payload bytes in {} ranges",
        want.header.len(),
        want.ranges.len()
    );
    // HEAD: the length, no body.
    let r = agent().head(f.url("/m.mp4/track-1/1.m4s")).call().unwrap();
    let len: usize = r.headers()["content-length"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(len, seg.len());
    // Past the last segment, an unknown track: 404.
    let r = agent().get(f.url("/m.mp4/track-1/99.m4s")).call().unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let r = agent().get(f.url("/m.mp4/track-9.m3u8")).call().unwrap();
    assert_eq!(r.status().as_u16(), 404);
}

/// Offset of the first `kind` box's type field in `b` (the size is 4 bytes before).
fn find(b: &[u8], kind: &[u8; 4]) -> usize {
    b.windows(4).position(|w| w == kind).unwrap()
}

#[test]
fn bad_mp4s_get_a_415_naming_why_and_the_server_goes_on() {
    if !have_ffmpeg() {
        return;
    }
    let f = start();
    movie(&f.path("good.mp4"), "libx264", true);
    let good = std::fs::read(f.path("good.mp4")).unwrap();
    let moov = find(&good, b"moov") - 4;
    let moov_len = u32::from_be_bytes(good[moov..moov + 4].try_into().unwrap()) as usize;

    // The moov cut short (the file truncated inside it).
    std::fs::write(f.path("truncated.mp4"), &good[..moov + moov_len / 2]).unwrap();
    // A sample table pointing past the end: the first stco entry moved to the far end.
    let mut past = good.clone();
    let stco = find(&past, b"stco");
    past[stco + 12..stco + 16].copy_from_slice(&(good.len() as u32 - 10).to_be_bytes());
    std::fs::write(f.path("past.mp4"), &past).unwrap();
    // A 2^32-1-entry stsz.
    let mut huge = good.clone();
    let stsz = find(&huge, b"stsz");
    huge[stsz + 12..stsz + 16].copy_from_slice(&u32::MAX.to_be_bytes());
    std::fs::write(f.path("huge.mp4"), &huge).unwrap();
    // A box that does not advance: size 4 at the top level.
    let mut looped = good.clone();
    looped[0..4].copy_from_slice(&4u32.to_be_bytes());
    std::fs::write(f.path("loop.mp4"), &looped).unwrap();
    // An unknown codec.
    let mut unknown = good.clone();
    let avc1 = find(&unknown, b"stsd") + find(&unknown[find(&unknown, b"stsd")..], b"avc1");
    unknown[avc1..avc1 + 4].copy_from_slice(b"zzz9");
    std::fs::write(f.path("unknown.mp4"), &unknown).unwrap();

    for (name, says) in [
        ("truncated.mp4", "runs past"),
        ("past.mp4", "past the end of the file"),
        ("huge.mp4", "stsz claims 4294967295 entries"),
        ("loop.mp4", "smaller than its header"),
        ("unknown.mp4", "unsupported codec 'zzz9'"),
    ] {
        let mut r = agent()
            .get(f.url(&format!("/{name}/index.m3u8")))
            .call()
            .unwrap();
        let status = r.status().as_u16();
        let body = r.body_mut().read_to_string().unwrap();
        assert_eq!(status, 415, "{name}: {body}");
        assert!(body.contains(says), "{name}: {body}");
        // The file itself is still served as a file; the good one still packages.
        let r = agent().get(f.url(&format!("/{name}"))).call().unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let (status, _, _) = get(&f, "/good.mp4/track-1/0.m4s");
        assert_eq!(status, 200);
    }
}

/// The (size, md5) of each frame ffmpeg decodes from the video of `input` (`nokey`: the key
/// frames only).
fn decoded(input: &str, key_frames_only: bool) -> Vec<(String, String)> {
    let mut c = Command::new("ffmpeg");
    c.args(["-hide_banner", "-loglevel", "error", "-nostdin"]);
    if key_frames_only {
        c.args(["-skip_frame", "nokey"]);
    }
    let o = c
        .args(["-i", input, "-map", "0:v", "-f", "framemd5", "-"])
        .output()
        .expect("ffmpeg");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            (f[4].to_string(), f[5].to_string())
        })
        .collect()
}

/// `EXT-X-I-FRAMES-ONLY` for a plain MP4 (issue 36 item 4): the multivariant playlist
/// announces `iframes.m3u8` with `EXT-X-I-FRAME-STREAM-INF`; it names each key frame (13 s,
/// one every 2 s: 7) as a segment of its own after the track's init segment; each, decoded
/// after the init segment, is exactly one picture — the source's key frame, decoded the
/// same; ffprobe reads the playlist and finds only key frames; a sample that is no key
/// frame is 404.
#[test]
fn an_i_frame_playlist_names_each_key_frame_as_a_segment_of_its_own() {
    if !have_ffmpeg() {
        return;
    }
    let f = start();
    movie(&f.path("k.mp4"), "libx264", false);
    let src = f.path("k.mp4");
    let (_, _, body) = get(&f, "/k.mp4/index.m3u8");
    let master = String::from_utf8(body).unwrap();
    let inf = master
        .lines()
        .find(|l| l.starts_with("#EXT-X-I-FRAME-STREAM-INF:BANDWIDTH="))
        .unwrap_or_else(|| panic!("no I-frame variant:\n{master}"));
    assert!(
        inf.contains(",CODECS=\"avc1.")
            && inf.ends_with(",RESOLUTION=320x240,URI=\"iframes.m3u8\""),
        "{inf}"
    );
    let (status, ty, body) = get(&f, "/k.mp4/iframes.m3u8");
    assert_eq!(status, 200);
    assert_eq!(ty, "application/vnd.apple.mpegurl");
    let playlist = String::from_utf8(body).unwrap();
    println!("{playlist}");
    assert!(playlist.contains("#EXT-X-I-FRAMES-ONLY\n"), "{playlist}");
    assert!(playlist.contains("#EXT-X-MAP:URI=\"track-1/init.mp4\"\n"));
    assert!(playlist.ends_with("#EXT-X-ENDLIST\n"));
    let secs: f64 = playlist
        .lines()
        .filter_map(|l| l.strip_prefix("#EXTINF:"))
        .map(|l| l.trim_end_matches(',').parse::<f64>().unwrap())
        .sum();
    assert!((secs - 13.0).abs() < 0.05, "{secs}");
    let uris: Vec<&str> = playlist
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect();
    assert_eq!(uris.len(), 7, "{playlist}");
    let want = decoded(src.to_str().unwrap(), true);
    assert_eq!(want.len(), 7);
    let (status, _, init) = get(&f, "/k.mp4/track-1/init.mp4");
    assert_eq!(status, 200);
    for (n, uri) in uris.iter().enumerate() {
        let (status, ty, seg) = get(&f, &format!("/k.mp4/{uri}"));
        assert_eq!((status, ty.as_str()), (200, "video/mp4"), "{uri}");
        assert_eq!(&seg[4..8], b"moof", "{uri}");
        let one = f.path(&format!("key-{n}.mp4"));
        let mut bytes = init.clone();
        bytes.extend_from_slice(&seg);
        std::fs::write(&one, &bytes).unwrap();
        let got = decoded(one.to_str().unwrap(), false);
        assert_eq!(got, [want[n].clone()], "I-frame {n} ({uri})");
    }
    // ffprobe reads the I-frame playlist: 7 video packets, each a key frame.
    let o = Command::new("ffprobe")
        .args(["-hide_banner", "-loglevel", "error", "-select_streams", "v"])
        .args(["-show_entries", "packet=flags", "-of", "csv=p=0"])
        .arg(f.url("/k.mp4/iframes.m3u8"))
        .output()
        .expect("ffprobe");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let flags = String::from_utf8(o.stdout).unwrap();
    let flags: Vec<&str> = flags.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(flags.len(), 7, "{flags:?}");
    assert!(flags.iter().all(|l| l.starts_with('K')), "{flags:?}");
    // A sample that is no key frame, or past the end: 404.
    assert_eq!(get(&f, "/k.mp4/track-1/key-1.m4s").0, 404);
    assert_eq!(get(&f, "/k.mp4/track-1/key-100000.m4s").0, 404);
    assert_eq!(get(&f, "/k.mp4/track-2/key-0.m4s").0, 404);
}

// ---- Fragmented MP4 (CMAF): served as byte ranges of the file itself ----

/// `src` remuxed by ffmpeg (`-c copy`: no encoding) into the fragmented MP4 `dst`, written
/// with `args` (`-movflags …`).
fn fragment(src: &Path, dst: &Path, args: &[&str]) {
    let o = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y", "-i"])
        .arg(src)
        .args(["-c", "copy"])
        .args(args)
        .arg(dst)
        .output()
        .expect("ffmpeg");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// The three layouts ffmpeg writes: every track in each moof (`frag_keyframe`, and `-f mp4
/// +cmaf`, here with a `sidx`), and one track per moof (`separate_moof`).
const LAYOUTS: [(&str, &[&str]); 3] = [
    (
        "frag.mp4",
        &["-movflags", "+frag_keyframe+empty_moov+default_base_moof"],
    ),
    // With a global sidx (two, here) between the moov and the first moof.
    ("cmaf.mp4", &["-f", "mp4", "-movflags", "+cmaf+global_sidx"]),
    (
        "separate.mp4",
        &[
            "-movflags",
            "+frag_keyframe+empty_moov+default_base_moof+separate_moof",
        ],
    ),
];

/// The top-level boxes of `b`: (type, offset, size).
fn top_boxes(b: &[u8]) -> Vec<([u8; 4], usize, usize)> {
    let mut at = 0;
    let mut out = Vec::new();
    while at + 8 <= b.len() {
        let size = u32::from_be_bytes(b[at..at + 4].try_into().unwrap()) as usize;
        assert!(size >= 8);
        out.push((b[at + 4..at + 8].try_into().unwrap(), at, size));
        at += size;
    }
    out
}

/// Whether the first video frame ffprobe reads from `path` is a key frame (an I picture).
fn first_video_frame_is_key(path: &Path) -> String {
    let o = Command::new("ffprobe")
        .args(["-v", "error", "-select_streams", "v:0", "-show_frames"])
        .args([
            "-read_intervals",
            "%+#1",
            "-show_entries",
            "frame=key_frame,pict_type",
        ])
        .args(["-of", "csv=p=0"])
        .arg(path)
        .output()
        .expect("ffprobe");
    // key_frame,pict_type (side data, if any, follows).
    let out = String::from_utf8_lossy(&o.stdout);
    let first = out.lines().next().unwrap_or_default();
    first.split(',').take(2).collect::<Vec<_>>().join(",")
}

/// A range GET of `path` as a player makes one: (status, Content-Range, body).
fn range_get(f: &Fixture, path: &str, at: u64, len: u64) -> (u16, String, Vec<u8>) {
    let mut r = agent()
        .get(f.url(path))
        .header("Range", &format!("bytes={}-{}", at, at + len - 1))
        .call()
        .unwrap();
    let cr = r
        .headers()
        .get("content-range")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (r.status().as_u16(), cr, r.body_mut().read_to_vec().unwrap())
}

/// A fragmented MP4 in each of ffmpeg's layouts: `NAME/index.m3u8` is a media playlist the
/// checker accepts, its map the file's ftyp+moov and its segments runs of whole fragments
/// from the end of the moov (a sidx there in the first) to the last mdat's end; each segment, fetched as a player does (a
/// range GET of the file), is those bytes of the file, and with the map decodes from a key
/// frame; ffmpeg reads the same packets through the playlist as from the file; the DASH
/// manifest names the same init section and ranges.
#[test]
fn a_fragmented_mp4_is_served_as_byte_ranges_of_itself_in_hls_and_dash() {
    if !have_ffmpeg() {
        return;
    }
    let f = start();
    let src = f.path("src.mp4");
    movie(&src, "libx264", false);
    for (name, args) in LAYOUTS {
        fragment(&src, &f.path(name), args);
        let file = std::fs::read(f.path(name)).unwrap();
        let boxes = top_boxes(&file);
        let moov = boxes.iter().find(|b| &b.0 == b"moov").unwrap();
        let first_moof = boxes.iter().find(|b| &b.0 == b"moof").unwrap().1 as u64;
        let init_end = (moov.1 + moov.2) as u64;
        if name == "cmaf.mp4" {
            // The sidx boxes lie between the moov and the first moof: in the first segment.
            assert_eq!(&file[init_end as usize + 4..init_end as usize + 8], b"sidx");
            assert!(first_moof > init_end);
        } else {
            assert_eq!(first_moof, init_end);
        }
        let last_mdat = boxes.iter().rfind(|b| &b.0 == b"mdat").unwrap();
        let end = (last_mdat.1 + last_mdat.2) as u64;
        if name == "separate.mp4" {
            // One track per moof indeed: more moofs than the others' six or seven.
            assert!(boxes.iter().filter(|b| &b.0 == b"moof").count() > 10);
        }

        let (status, ty, body) = get(&f, &format!("/{name}/index.m3u8"));
        let playlist = String::from_utf8(body).unwrap();
        assert_eq!(status, 200, "{name}: {playlist}");
        assert_eq!(ty, "application/vnd.apple.mpegurl");
        println!("{name}:\n{playlist}");
        let uri = format!("../{name}");
        let (ranged, map) =
            check_media_playlist(&playlist, file.len() as u64, &uri, Some(init_end), end);
        assert_eq!(
            map,
            Some((0, (moov.1 + moov.2) as u64)),
            "{name}: the map is ftyp+moov"
        );
        // 13 s, key frames every 2 s, target 6 s: 6, 6, 1.
        let secs: Vec<f64> = ranged.iter().map(|r| r.secs).collect();
        assert_eq!(secs, [6.0, 6.0, 1.0], "{name}");
        let init = &file[..moov.1 + moov.2];
        for (k, r) in ranged.iter().enumerate() {
            // The segment is the file's own bytes, by the ordinary range code.
            let (status, cr, body) = range_get(&f, &format!("/{name}"), r.offset, r.len);
            assert_eq!(status, 206);
            assert_eq!(
                cr,
                format!("bytes {}-{}/{}", r.offset, r.offset + r.len - 1, file.len())
            );
            assert!(
                body == file[r.offset as usize..(r.offset + r.len) as usize],
                "{name} segment {k}: not the file's bytes"
            );
            // The map and the segment alone decode from a key frame.
            let alone = f.path(&format!("alone-{k}.mp4"));
            std::fs::write(&alone, [init, &body[..]].concat()).unwrap();
            assert_eq!(
                first_video_frame_is_key(&alone),
                "1,I",
                "{name} segment {k}"
            );
        }
        // ffmpeg through the playlist: the file's packets, in order, identical.
        let hls = f.url(&format!("/{name}/index.m3u8"));
        let direct = f.path(name);
        for stream in ["v", "a"] {
            same_packets(
                &packets(&hls, stream),
                &packets(direct.to_str().unwrap(), stream),
                stream,
            );
        }
        // Cached per file version: the same playlist again.
        assert_eq!(
            get(&f, &format!("/{name}/index.m3u8")).2,
            playlist.as_bytes()
        );

        // DASH: the init section and the playlist's ranges, and ffmpeg reads the packets.
        let (status, ty, body) = get(&f, &format!("/{name}/manifest.mpd"));
        let mpd = String::from_utf8(body).unwrap();
        assert_eq!(status, 200, "{mpd}");
        assert_eq!(ty, "application/dash+xml");
        assert!(
            mpd.contains(&format!(
                "<Initialization range=\"0-{}\"/>",
                moov.1 + moov.2 - 1
            )),
            "{mpd}"
        );
        assert!(mpd.contains(&format!("<BaseURL>{uri}</BaseURL>")), "{mpd}");
        let media: Vec<String> = mpd
            .lines()
            .filter_map(|l| l.trim().strip_prefix("<SegmentURL mediaRange=\""))
            .map(|l| l.trim_end_matches("\"/>").to_string())
            .collect();
        let want: Vec<String> = ranged
            .iter()
            .map(|r| format!("{}-{}", r.offset, r.offset + r.len - 1))
            .collect();
        assert_eq!(media, want, "{mpd}");
        assert!(
            mpd.contains("codecs=\"avc1.") && mpd.contains(",mp4a.40.2\""),
            "{mpd}"
        );
        assert!(mpd.contains("width=\"320\" height=\"240\""), "{mpd}");
        // (ffmpeg's DASH demuxer takes one stream per representation: it reads this muxed
        // one's audio packets as video. shaka-player plays it: hls.rs.)
        // Nothing else is made of a fragmented file.
        assert_eq!(get(&f, &format!("/{name}/track-1.m3u8")).0, 404);
        assert_eq!(get(&f, &format!("/{name}/track-1/0.m4s")).0, 404);
    }
}

/// Fragmented MP4s broken as issue 32 lists: a moof pointing past the end, a trun of 2^32
/// samples, fragments before the moov, a truncated last fragment (and one whose moov holds
/// samples, which no player's init section may); each a 415 whose text names why, and the
/// server goes on serving the good one.
#[test]
fn bad_fragmented_mp4s_get_a_415_naming_why() {
    if !have_ffmpeg() {
        return;
    }
    let f = start();
    let src = f.path("src.mp4");
    movie(&src, "libx264", true);
    fragment(&src, &f.path("good.mp4"), LAYOUTS[0].1);
    let good = std::fs::read(f.path("good.mp4")).unwrap();
    let boxes = top_boxes(&good);
    let trun = find(&good, b"trun");

    // The first trun's data offset (its flags say one is present) far past the end.
    let mut past = good.clone();
    assert!(past[trun + 7] & 1 != 0);
    past[trun + 12..trun + 16].copy_from_slice(&0x7fff_0000u32.to_be_bytes());
    std::fs::write(f.path("past.mp4"), &past).unwrap();
    // A trun of 2^32-1 samples.
    let mut huge = good.clone();
    huge[trun + 8..trun + 12].copy_from_slice(&u32::MAX.to_be_bytes());
    std::fs::write(f.path("huge.mp4"), &huge).unwrap();
    // The fragments before the moov: ftyp, the moofs and mdats, then the moov.
    let moov = boxes.iter().find(|b| &b.0 == b"moov").unwrap();
    let ftyp_end = boxes[0].2;
    let mut before = good[..ftyp_end].to_vec();
    before.extend_from_slice(&good[moov.1 + moov.2..]);
    before.extend_from_slice(&good[moov.1..moov.1 + moov.2]);
    std::fs::write(f.path("before.mp4"), &before).unwrap();
    // The file cut short in its last mdat (as a copy or a recording stopped midway).
    let last_mdat = boxes.iter().rfind(|b| &b.0 == b"mdat").unwrap();
    std::fs::write(
        f.path("truncated.mp4"),
        &good[..last_mdat.1 + last_mdat.2 / 2],
    )
    .unwrap();

    // The first fragment's samples in the moov's own tables (ffmpeg without empty_moov).
    fragment(
        &src,
        &f.path("early.mp4"),
        &["-movflags", "+frag_keyframe+default_base_moof"],
    );

    for (name, says) in [
        ("early.mp4", "moov holds samples of its own"),
        ("past.mp4", "run past the end of the file"),
        ("huge.mp4", "trun claims 4294967295 entries"),
        ("before.mp4", "comes before the moov"),
        ("truncated.mp4", "is truncated"),
    ] {
        for what in ["index.m3u8", "manifest.mpd"] {
            let mut r = agent()
                .get(f.url(&format!("/{name}/{what}")))
                .call()
                .unwrap();
            let status = r.status().as_u16();
            let body = r.body_mut().read_to_string().unwrap();
            assert_eq!(status, 415, "{name}: {body}");
            assert!(body.contains(says), "{name}: {body}");
        }
        let (status, _, body) = get(&f, "/good.mp4/index.m3u8");
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    }
}

/// A directory of CMAF renditions of one title gets a multivariant playlist: each fragmented
/// file listed with its bandwidth measured from its segments and its codecs and picture size
/// read from its moov; a plain MP4 beside them is no rendition (its own index.m3u8 is a
/// multivariant playlist) and is left out.
#[test]
fn a_directory_of_cmaf_renditions_gets_a_multivariant_playlist() {
    if !have_ffmpeg() {
        return;
    }
    let f = start();
    let dir = f.path("title");
    std::fs::create_dir(&dir).unwrap();
    movie(&dir.join("plain.mp4"), "libx264", true);
    fragment(&dir.join("plain.mp4"), &dir.join("hi.mp4"), LAYOUTS[1].1);
    let o = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y", "-i"])
        .arg(dir.join("plain.mp4"))
        .args([
            "-vf",
            "scale=160:120",
            "-c:v",
            "libx264",
            "-preset",
            "ultrafast",
        ])
        .args([
            "-g",
            "50",
            "-keyint_min",
            "50",
            "-sc_threshold",
            "0",
            "-b:v",
            "100k",
        ])
        .args(["-c:a", "copy", "-f", "mp4", "-movflags", "+cmaf"])
        .arg(dir.join("lo.mp4"))
        .output()
        .expect("ffmpeg");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (status, ty, body) = get(&f, "/title/master.m3u8");
    let master = String::from_utf8(body).unwrap();
    println!("{master}");
    assert_eq!(
        (status, ty.as_str()),
        (200, "application/vnd.apple.mpegurl")
    );
    let infs: Vec<(&str, &str)> = master
        .lines()
        .zip(master.lines().skip(1))
        .filter(|(l, _)| l.starts_with("#EXT-X-STREAM-INF:"))
        .collect();
    assert_eq!(infs.len(), 2, "{master}");
    for (inf, uri) in infs {
        let name = uri.strip_suffix("/index.m3u8").unwrap();
        let field = |k: &str| {
            inf.split(&format!("{k}="))
                .nth(1)
                .unwrap()
                .split(',')
                .next()
                .unwrap()
                .to_string()
        };
        let peak: u64 = field("BANDWIDTH").parse().unwrap();
        let avg: u64 = field("AVERAGE-BANDWIDTH").parse().unwrap();
        assert!(avg > 0 && avg <= peak, "{inf}");
        // Measured: the segments' bytes over the title's 13 s.
        let file = std::fs::read(dir.join(name)).unwrap();
        let b = top_boxes(&file);
        let first = b.iter().find(|x| &x.0 == b"moof").unwrap().1;
        let last = b.iter().rfind(|x| &x.0 == b"mdat").unwrap();
        let want = ((last.1 + last.2 - first) * 8) as f64 / 13.0;
        assert!(
            (avg as f64 - want).abs() / want < 0.02,
            "{name}: {avg} for {want}"
        );
        assert!(
            inf.contains("CODECS=\"avc1.") && inf.contains(",mp4a.40.2\""),
            "{inf}"
        );
        let size = if name == "hi.mp4" {
            "320x240"
        } else {
            "160x120"
        };
        assert!(inf.contains(&format!("RESOLUTION={size}")), "{inf}");
        assert_eq!(get(&f, &format!("/title/{uri}")).0, 200);
    }
    assert!(!master.contains("plain.mp4"), "{master}");
}
