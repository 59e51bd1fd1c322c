//! HLS viewers as sessions (`[[location]] sessions = true`, docs/hls.md "Viewer sessions"):
//! admitted by the engine's one admission at their rendition's bandwidth, refused with 503 +
//! Retry-After naming the resource, ended by idling; listed in `STATE`, counted in the
//! metrics; a signed location's session id is the one its session tokens carry. And real
//! players — GStreamer's hlsdemux, VLC (as nobody), hls.js in Chromium — playing to the end.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use penstock_server::config::{AuthKeyFile, AuthMode, Location};

/// 13 s of H.264 (a key frame every 2 s) and AAC in TS, as ffmpeg writes it.
fn h264_clip(path: &Path) {
    let o = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y"])
        .args(["-f", "lavfi", "-i", "testsrc=size=320x240:rate=25"])
        .args(["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000"])
        .args(["-t", "13", "-c:v", "libx264", "-preset", "ultrafast"])
        .args(["-g", "50", "-keyint_min", "50", "-sc_threshold", "0"])
        .args(["-c:a", "aac", "-f", "mpegts"])
        .arg(path)
        .output()
        .expect("ffmpeg");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

struct Answer {
    status: u16,
    retry_after: Option<String>,
    cache_control: Option<String>,
    body: Vec<u8>,
}

fn fetch(f: &Fixture, path: &str, range: Option<&str>) -> Answer {
    let mut req = agent().get(f.url(path));
    if let Some(r) = range {
        req = req.header("Range", &format!("bytes={r}"));
    }
    let mut r = req.call().unwrap();
    let h = |n: &str| r.headers().get(n).map(|v| v.to_str().unwrap().to_string());
    let (retry_after, cache_control) = (h("retry-after"), h("cache-control"));
    Answer {
        status: r.status().as_u16(),
        retry_after,
        cache_control,
        body: r.body_mut().read_to_vec().unwrap(),
    }
}

fn text(a: &Answer) -> String {
    String::from_utf8_lossy(&a.body).into_owned()
}

fn metric(f: &Fixture, name: &str) -> f64 {
    let page = text(&fetch(f, "/metrics", None));
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing:\n{page}"))
}

/// `STATE *` over the control protocol, after `AUTH`: the lines of the reply.
fn state(f: &Fixture) -> Vec<String> {
    let s = TcpStream::connect(f.control()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut r = BufReader::new(s);
    let mut line = |cmd: &str| -> Vec<String> {
        r.get_mut()
            .write_all(format!("{cmd}\n").as_bytes())
            .unwrap();
        let mut out = Vec::new();
        loop {
            let mut l = String::new();
            assert!(r.read_line(&mut l).unwrap() > 0, "control closed on {cmd}");
            let l = l.trim_end().to_string();
            // A multi-line reply's lines are `NNN-…`; its last, `NNN …`.
            let last = l.as_bytes().get(3) != Some(&b'-');
            out.push(l);
            if last {
                return out;
            }
        }
    };
    assert!(line(&format!("AUTH {TOKEN}"))[0].starts_with("200"));
    line("STATE *")
}

/// (length, offset, URI) of each segment of a media playlist.
fn segments(playlist: &str) -> Vec<(u64, u64, String)> {
    let mut segs = Vec::new();
    let mut range = None;
    for l in playlist.lines() {
        if let Some(r) = l.strip_prefix("#EXT-X-BYTERANGE:") {
            let (len, off) = r.split_once('@').unwrap();
            range = Some((len.parse().unwrap(), off.parse().unwrap()));
        } else if !l.starts_with('#') && !l.is_empty() {
            let (len, off) = range.take().expect("a byte range before each URI");
            segs.push((len, off, l.to_string()));
        }
    }
    segs
}

/// The `sid=` of a URI's query.
fn sid_of(uri: &str) -> String {
    uri.split_once('?')
        .and_then(|(_, q)| q.split('&').find_map(|p| p.strip_prefix("sid=")))
        .unwrap_or_else(|| panic!("no sid in {uri}"))
        .to_string()
}

fn sessions_location(prefix: &str) -> Location {
    Location {
        prefix: prefix.into(),
        sessions: true,
        ..Default::default()
    }
}

/// Admission figures set so that only the network can run short: disk, CPU and buffers
/// far beyond what a few viewers need (tests never self-calibrate).
fn roomy(cfg: &mut penstock_server::ServerConfig, net_bytes_per_s: u64) {
    cfg.admission.disk_seq_bytes_per_s = Some(10_000_000_000);
    cfg.admission.disk_random_iops = Some(1_000_000);
    cfg.admission.cpu_ns_per_s = Some(1_000_000_000_000);
    cfg.admission.buffer_count = Some(65_536);
    cfg.admission.net_bytes_per_s = Some(net_bytes_per_s);
    cfg.admission.bulk_share_percent = Some(20);
}

/// Polls `cond` every 50 ms until it holds or `limit` passes (an event awaited, not a
/// fixed sleep).
fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    cond()
}

#[test]
fn sessions_are_admitted_at_their_bandwidth_refused_when_the_network_is_full_and_end_when_idle() {
    if !penstock_testreq::require("ffmpeg") {
        return;
    }
    // What one session reserves of the network, read from a server with room for many:
    // the share it takes of a known capacity (rt: 80 % of 1 GB/s).
    let per_session_bytes_per_s = {
        let mut cfg = config();
        cfg.location = vec![sessions_location("/s/")];
        roomy(&mut cfg, 1_000_000_000);
        let f = start_with(cfg);
        std::fs::create_dir(f.path("s")).unwrap();
        h264_clip(&f.path("s/clip.ts"));
        assert_eq!(fetch(&f, "/s/clip.ts/index.m3u8", None).status, 200);
        let r = metric(
            &f,
            "penstock_admission_reserved_ratio{resource=\"network\"}",
        );
        assert!(r > 0.0, "a session reserves network");
        r * 800_000_000.0
    };
    // Room for 3.5 sessions' worth: three are admitted, the fourth is not.
    let mut cfg = config();
    cfg.location = vec![sessions_location("/s/")];
    roomy(
        &mut cfg,
        (per_session_bytes_per_s * 3.5 / 0.8).ceil() as u64,
    );
    cfg.hls.session_idle_ms = Some(3000);
    let f = start_with(cfg);
    std::fs::create_dir(f.path("s")).unwrap();
    h264_clip(&f.path("s/clip.ts"));
    std::fs::copy(f.path("s/clip.ts"), f.path("plain.ts")).unwrap();
    let src = std::fs::read(f.path("s/clip.ts")).unwrap();

    let mut sids = Vec::new();
    let mut first = Vec::new();
    for i in 0..3 {
        let a = fetch(&f, "/s/clip.ts/index.m3u8", None);
        assert_eq!(a.status, 200, "session {i}: {}", text(&a));
        // A playlist made for one viewer: no cache keeps it for another.
        assert_eq!(a.cache_control.as_deref(), Some("no-store"));
        let segs = segments(&text(&a));
        assert!(segs.len() >= 3, "{}", text(&a));
        let sid = sid_of(&segs[0].2);
        assert!(
            segs.iter().all(|s| sid_of(&s.2) == sid),
            "one id per playlist"
        );
        assert!(segs[0].2.starts_with("../clip.ts?sid="), "{}", segs[0].2);
        assert_eq!(sid.len(), 22, "16 random bytes, base64url: {sid}");
        sids.push(sid);
        if i == 0 {
            first = segs;
        }
    }
    sids.sort();
    sids.dedup();
    assert_eq!(sids.len(), 3, "each viewer its own session");
    assert_eq!(metric(&f, "penstock_hls_sessions"), 3.0);
    assert_eq!(metric(&f, "penstock_hls_sessions_admitted_total"), 3.0);

    // The fourth viewer: 503, Retry-After, the resource named; nothing else changed.
    let a = fetch(&f, "/s/clip.ts/index.m3u8", None);
    assert_eq!(a.status, 503, "{}", text(&a));
    let retry: u64 = a
        .retry_after
        .as_deref()
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    assert!(
        text(&a).contains("not admitted") && text(&a).contains("network"),
        "{}",
        text(&a)
    );
    assert_eq!(metric(&f, "penstock_hls_sessions_refused_total"), 1.0);
    assert_eq!(metric(&f, "penstock_hls_sessions"), 3.0);

    // An admitted viewer's segments are the file's bytes.
    let sid = sid_of(&first[0].2);
    for (len, off, uri) in &first {
        let a = fetch(
            &f,
            &format!("/s/clip.ts/{uri}"),
            Some(&format!("{off}-{}", off + len - 1)),
        );
        assert_eq!(a.status, 206, "{uri}");
        assert!(a.body == src[*off as usize..(off + len) as usize]);
    }
    // Without a session: 403, saying where the session comes from. An id not open here
    // (never issued, or ended) is admitted again if the machine can carry it: now it
    // cannot (503 + Retry-After). A malformed one: 400. The same file outside the
    // location needs none.
    let a = fetch(&f, "/s/clip.ts", Some("0-187"));
    assert_eq!(a.status, 403);
    assert!(text(&a).contains("playlist"), "{}", text(&a));
    let a = fetch(&f, "/s/clip.ts?sid=AAAAAAAAAAAAAAAAAAAAAA", Some("0-187"));
    assert_eq!(a.status, 503, "{}", text(&a));
    assert!(a.retry_after.is_some() && text(&a).contains("network"));
    assert_eq!(fetch(&f, "/s/clip.ts?sid=a.b", Some("0-187")).status, 400);
    assert_eq!(fetch(&f, "/plain.ts", Some("0-187")).status, 206);

    // STATE lists the three sessions.
    let lines = state(&f);
    let hls: Vec<&String> = lines.iter().filter(|l| l.contains("hls-")).collect();
    assert_eq!(hls.len(), 3, "{lines:?}");
    assert!(
        hls.iter()
            .any(|l| l.contains(&format!("hls-{sid} open scope=/s/clip.ts peer=127.0.0.1"))),
        "{hls:?}"
    );
    assert!(hls.iter().all(|l| l.contains("bandwidth_bits_per_s=")));

    // Nobody fetches: every session idles out (awaited as the gauge's fall), its
    // reservation given back, and a new viewer is admitted.
    assert!(
        wait_for(Duration::from_secs(60), || metric(
            &f,
            "penstock_hls_sessions"
        ) == 0.0),
        "the sessions never ended"
    );
    assert_eq!(metric(&f, "penstock_hls_sessions_expired_total"), 3.0);
    assert_eq!(
        metric(
            &f,
            "penstock_admission_reserved_ratio{resource=\"network\"}"
        ),
        0.0
    );
    assert!(!state(&f).iter().any(|l| l.contains("hls-")));
    let a = fetch(&f, "/s/clip.ts/index.m3u8", None);
    assert_eq!(a.status, 200, "{}", text(&a));
    // The ended session's id comes back too, re-admitted at its segment (a viewer who
    // paused longer than session_idle_ms).
    let (len, off, uri) = &first[1];
    let a = fetch(
        &f,
        &format!("/s/clip.ts/{uri}"),
        Some(&format!("{off}-{}", off + len - 1)),
    );
    assert_eq!(a.status, 206, "{}", text(&a));
    assert_eq!(metric(&f, "penstock_hls_sessions"), 2.0);
    assert_eq!(metric(&f, "penstock_hls_sessions_admitted_total"), 5.0);
}

#[test]
fn a_multivariant_playlist_opens_one_session_for_the_title() {
    if !penstock_testreq::require("ffmpeg") {
        return;
    }
    let mut cfg = config();
    cfg.location = vec![sessions_location("/s/")];
    cfg.hls.sessions_per_address_max = 2;
    let f = start_with(cfg);
    std::fs::create_dir_all(f.path("s/movie")).unwrap();
    h264_clip(&f.path("s/movie/a.ts"));
    std::fs::copy(f.path("s/movie/a.ts"), f.path("s/movie/b.ts")).unwrap();
    let a = fetch(&f, "/s/movie/master.m3u8", None);
    assert_eq!(a.status, 200, "{}", text(&a));
    let master = text(&a);
    let uris: Vec<&str> = master.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(uris.len(), 2, "{master}");
    let sid = sid_of(uris[0]);
    assert_eq!(sid_of(uris[1]), sid, "one session for the title");
    // Each media playlist joins it: its segments carry the same id; no new session.
    for u in &uris {
        let a = fetch(&f, &format!("/s/movie/{u}"), None);
        assert_eq!(a.status, 200);
        let segs = segments(&text(&a));
        assert_eq!(sid_of(&segs[0].2), sid);
        let (len, off, uri) = &segs[0];
        let name = u.split('/').next().unwrap();
        let a = fetch(
            &f,
            &format!("/s/movie/{name}/{uri}"),
            Some(&format!("{off}-{}", off + len - 1)),
        );
        assert_eq!(a.status, 206);
    }
    assert_eq!(metric(&f, "penstock_hls_sessions"), 1.0);
    // Within the title only: the session's id does not open another directory's file.
    std::fs::copy(f.path("s/movie/a.ts"), f.path("s/other.ts")).unwrap();
    assert_eq!(
        fetch(&f, &format!("/s/other.ts?sid={sid}"), Some("0-187")).status,
        403
    );
    // sessions_per_address_max = 2: a second viewer from this address, then a refusal.
    assert_eq!(fetch(&f, "/s/movie/master.m3u8", None).status, 200);
    let a = fetch(&f, "/s/movie/master.m3u8", None);
    assert_eq!(a.status, 503);
    assert!(
        text(&a).contains("sessions_per_address_max"),
        "{}",
        text(&a)
    );
}

/// A signed location with sessions: the playlist is checked once (one `signed` HMAC per
/// session), and the id its session tokens carry is the session's own — one id for both.
#[test]
fn a_signed_location_checks_once_per_session_and_its_token_carries_the_session_id() {
    use std::os::unix::fs::PermissionsExt;
    if !penstock_testreq::require("ffmpeg") {
        return;
    }
    let keys = tempfile::tempdir().unwrap();
    let key_file = keys.path().join("k1.key");
    let secret = "s".repeat(48);
    std::fs::write(&key_file, &secret).unwrap();
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut cfg = config();
    cfg.auth.keys = vec![AuthKeyFile {
        id: "k1".into(),
        secret_file: key_file,
        tenant: None,
    }];
    cfg.location = vec![Location {
        auth: AuthMode::Signed,
        ..sessions_location("/premium/")
    }];
    let f = start_with(cfg);
    std::fs::create_dir(f.path("premium")).unwrap();
    h264_clip(&f.path("premium/clip.ts"));
    let src = std::fs::read(f.path("premium/clip.ts")).unwrap();
    let key = penstock_core::auth::Key::new("k1", secret.as_bytes()).unwrap();
    let expires = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3600;
    let q = penstock_core::auth::sign_query(&key, "/premium/clip.ts/index.m3u8", expires, None);
    let check = |k: &str, r: &str| {
        metric(
            &f,
            &format!("penstock_auth_checks_total{{kind=\"{k}\",result=\"{r}\"}}"),
        )
    };
    let mut seen = Vec::new();
    for viewer in 1..=2 {
        let a = fetch(&f, &format!("/premium/clip.ts/index.m3u8?{q}"), None);
        assert_eq!(a.status, 200, "{}", text(&a));
        let segs = segments(&text(&a));
        let uri = &segs[0].2;
        assert!(
            uri.starts_with("../clip.ts?expires=") && uri.contains("&sig="),
            "{uri}"
        );
        // The token's sid is the session's id: drawn at random (22 characters), not
        // derived from the signed URL (16), so two viewers of one URL are two sessions.
        let sid = sid_of(uri);
        assert_eq!(sid.len(), 22, "{uri}");
        seen.push(sid.clone());
        for (len, off, uri) in &segs {
            let a = fetch(
                &f,
                &format!("/premium/clip.ts/{uri}"),
                Some(&format!("{off}-{}", off + len - 1)),
            );
            assert_eq!(a.status, 206);
            assert!(a.body == src[*off as usize..(off + len) as usize]);
        }
        assert_eq!(check("signed", "ok"), f64::from(viewer), "one per session");
        assert_eq!(metric(&f, "penstock_hls_sessions"), f64::from(viewer));
        assert!(
            state(&f)
                .iter()
                .any(|l| l.contains(&format!("hls-{sid} open scope=/premium/clip.ts"))),
        );
    }
    assert_ne!(seen[0], seen[1]);
    // A segment without the token is refused by the credential check first (401).
    assert_eq!(fetch(&f, "/premium/clip.ts", Some("0-187")).status, 401);
}

/// The browser player (`penstock_testreq::require_browser_player`).
fn player_dir() -> Option<std::path::PathBuf> {
    penstock_testreq::require_browser_player()
}

#[test]
fn hls_js_in_chromium_plays_a_sessions_location() {
    if !penstock_testreq::require("ffmpeg") {
        return;
    }
    let Some(player) = player_dir() else {
        return;
    };
    let mut cfg = config();
    cfg.location = vec![sessions_location("/s/")];
    let f = start_with(cfg);
    std::fs::create_dir(f.path("s")).unwrap();
    h264_clip(&f.path("s/clip.ts"));
    std::fs::copy(player.join("index.html"), f.path("player.html")).unwrap();
    std::fs::copy(
        player.join("node_modules/hls.js/dist/hls.min.js"),
        f.path("hls.min.js"),
    )
    .unwrap();
    let (line, _, _) = penstock_testreq::run_browser_player(
        &player,
        "play.mjs",
        &f.url("/player.html?src=/s/clip.ts/index.m3u8"),
        &["8"],
        &[],
        "hls-sessions",
    );
    assert!(line.contains("\"ok\":true"), "{line}");
    assert!(line.contains("\"width\":320"), "{line}");
    // The player was one session, and fetched its segments through it.
    assert_eq!(metric(&f, "penstock_hls_sessions_admitted_total"), 1.0);
    assert!(metric(&f, "penstock_hls_segment_requests_total") >= 3.0);
}

/// The video packets ffprobe counts in `input` (a file or a URL).
fn video_packets(input: &str) -> u64 {
    let o = Command::new("ffprobe")
        .args(["-v", "error", "-select_streams", "v:0", "-count_packets"])
        .args(["-show_entries", "stream=nb_read_packets", "-of", "csv=p=0"])
        .arg(input)
        .output()
        .expect("ffprobe");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The stream may be listed again under its program: the first line is enough.
    let out = String::from_utf8_lossy(&o.stdout);
    out.lines()
        .map(|l| l.trim().trim_end_matches(','))
        .find(|l| !l.is_empty())
        .and_then(|l| l.parse().ok())
        .unwrap_or_else(|| panic!("{out}"))
}

/// GStreamer: `souphttpsrc ! hlsdemux ! tsdemux ! h264parse ! fakesink` plays the playlist
/// (of a sessions location: its URIs carry the session) to EOS, and its sink gets every
/// picture of the file.
///
/// GStreamer 1.22's `hlsdemux` typefinds an `EXT-X-MAP` section alone, and a 376-byte map
/// (PAT + PMT, two packets) is too short for its MPEG-TS typefinder ("Could not determine
/// type of stream"). ffmpeg's muxer repeats the PAT and PMT before every key frame, so each
/// segment starts at them and the playlist needs no map (docs/hls.md "How segments are
/// cut"): this test failed while the playlist had one.
#[test]
fn gstreamer_hlsdemux_plays_the_playlist_to_the_end() {
    if !penstock_testreq::require("ffmpeg") || !penstock_testreq::require("gst-launch-1.0") {
        return;
    }
    let mut cfg = config();
    cfg.location = vec![sessions_location("/s/")];
    let f = start_with(cfg);
    std::fs::create_dir(f.path("s")).unwrap();
    h264_clip(&f.path("s/clip.ts"));
    let frames = video_packets(f.path("s/clip.ts").to_str().unwrap());
    let o = Command::new("timeout")
        .arg("120")
        .arg("gst-launch-1.0")
        .arg("-v")
        .arg("souphttpsrc")
        .arg(format!("location={}", f.url("/s/clip.ts/index.m3u8")))
        .args(["!", "hlsdemux", "!", "tsdemux", "name=d"])
        .args(["d.", "!", "queue", "!", "h264parse", "!"])
        .args(["fakesink", "name=pictures", "sync=false", "silent=false"])
        .output()
        .expect("gst-launch-1.0");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("Got EOS from element"), "{out}\n{err}");
    let got = out
        .lines()
        .filter(|l| l.contains("pictures") && l.contains("last-message = chain"))
        .count() as u64;
    println!("gstreamer: {got} pictures of {frames}");
    assert_eq!(got, frames, "{err}");
    assert_eq!(metric(&f, "penstock_hls_sessions_admitted_total"), 1.0);
}

/// VLC (`cvlc --play-and-exit`, as nobody: it refuses root) plays the playlist to the end,
/// writing what it demuxed to a file (`--sout`): the same pictures as VLC writes from the
/// file itself (its TS muxer leaves out the last 200 ms either way: 320 of 325 here).
#[test]
fn vlc_plays_the_playlist_to_the_end() {
    use std::os::unix::fs::PermissionsExt;
    if !penstock_testreq::require("ffmpeg")
        || !penstock_testreq::require("cvlc")
        || !penstock_testreq::require("runuser")
    {
        return;
    }
    let f = start();
    h264_clip(&f.path("clip.ts"));
    let frames = video_packets(f.path("clip.ts").to_str().unwrap());
    let out_dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(out_dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let play = |input: &str, name: &str| {
        let out = out_dir.path().join(name);
        let o = Command::new("timeout")
            .arg("120")
            .args(["runuser", "-u", "nobody", "--", "cvlc"])
            .args(["-I", "dummy", "--play-and-exit", "--no-one-instance"])
            .arg(format!(
                "--sout=#std{{access=file,mux=ts,dst={}}}",
                out.display()
            ))
            .arg(input)
            .env("HOME", out_dir.path())
            .output()
            .expect("cvlc");
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{input}: {err}");
        assert!(err.contains("end of playlist"), "{input}: {err}");
        (video_packets(out.to_str().unwrap()), err)
    };
    // The source is readable by nobody only through the server (the fixture's directory
    // is private): a copy of it for VLC's own reading.
    let copy = out_dir.path().join("clip.ts");
    std::fs::copy(f.path("clip.ts"), &copy).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (direct, _) = play(copy.to_str().unwrap(), "direct.ts");
    let (got, err) = play(&f.url("/clip.ts/index.m3u8"), "hls.ts");
    println!("vlc: {got} pictures through HLS, {direct} from the file, of {frames}");
    assert!(err.contains("adaptive"), "VLC's HLS demuxer: {err}");
    assert_eq!(got, direct, "{err}");
    assert!(direct + 10 >= frames, "{direct} of {frames}");
}
