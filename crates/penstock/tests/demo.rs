//! `penstock serve --demo` as a newcomer meets it (issue 40 item 4): every command its start
//! lines print works as printed and plays a picture. The lines are read from the server's
//! standard output; each `curl` command is run as printed, `ffprobe` as printed must find
//! the clip's H.264 picture, `mpv` as printed (headless: no video or audio output) must play
//! to the end, and every media URL printed (RTSP, HLS of the TS, DASH of the MP4) is decoded
//! by ffmpeg, whose first picture must not be blank. (`ffplay` needs a display: its URL is
//! decoded by ffmpeg, the same libraries.) The page the demo points a browser at plays its
//! video (the MP4) in headless Chromium with a picture that is not blank; hls.js and shaka
//! play the same playlists in `server/tests/hls.rs` and `server/tests/mp4.rs`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_penstock");

/// The printed commands: the `try:` block's entries, split where the line puts three spaces
/// between them, each without its parenthesised comment.
fn commands(lines: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for l in lines {
        let Some(body) = l.strip_prefix("try:").or_else(|| l.strip_prefix("     ")) else {
            continue;
        };
        for part in body.split("   ") {
            let part = part.trim();
            if part.is_empty() || part.starts_with('(') {
                continue;
            }
            out.push(part.to_string());
        }
    }
    out
}

/// The first picture ffmpeg decodes from `url`, as 64×36 grey levels.
fn first_picture(url: &str) -> Vec<u8> {
    // ffmpeg's own timeouts differ by protocol: coreutils' bounds the wait.
    let o = Command::new("timeout")
        .args(["120", "ffmpeg", "-hide_banner", "-loglevel", "error"])
        .args([
            "-i",
            url,
            "-frames:v",
            "1",
            "-vf",
            "scale=64:36,format=gray",
        ])
        .args(["-f", "rawvideo", "-"])
        .stdin(Stdio::null())
        .output()
        .expect("ffmpeg");
    assert!(
        o.status.success(),
        "ffmpeg {url}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(o.stdout.len(), 64 * 36, "one picture from {url}");
    o.stdout
}

/// A picture is blank when its grey levels hardly vary (a black or a flat frame).
fn spread(p: &[u8]) -> f64 {
    let n = p.len() as f64;
    let mean = p.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    (p.iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / n)
        .sqrt()
}

#[test]
fn every_command_the_demo_prints_plays_a_picture() {
    for tool in ["ffmpeg", "ffprobe", "curl", "mpv"] {
        if !penstock_testreq::require(tool) {
            return;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("penstock.toml");
    // Figures set, not self-calibrated (a test never depends on the machine's cache).
    std::fs::write(
        &conf,
        "[log]\naccess = \"off\"\n[admission]\nself_calibrate = false\n",
    )
    .unwrap();
    /// Stops the server however the test ends (a failed assertion too).
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut server = Command::new(BIN)
        .args(["serve", "--demo", "--config"])
        .arg(&conf)
        .args(["--listen", "127.0.0.1:0", "--rtsp", "127.0.0.1:0"])
        .args(["--control", "", "--no-control-unix"])
        .env("PENSTOCK_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = server.stdout.take().unwrap();
    let _server = Kill(server);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    // The DASH line is the last the demo prints.
    let mut lines = Vec::new();
    while !lines.iter().any(|l: &String| l.contains("manifest.mpd")) {
        match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(l) => lines.push(l),
            Err(e) => panic!("the demo's lines ({e}): {lines:?}"),
        }
    }
    let cmds = commands(&lines);
    let mut ran = Vec::new();
    let mut urls = Vec::new();
    let mut pages = Vec::new();
    for c in &cmds {
        let words: Vec<&str> = c.split_whitespace().collect();
        match words[0] {
            "curl" => {
                // As printed, through a shell (one of them pipes into xxd and head).
                let o = Command::new("sh")
                    .args(["-c", c])
                    .current_dir(dir.path())
                    .output()
                    .unwrap();
                assert!(o.status.success(), "{c}: {o:?}");
                if c.contains("-O") {
                    let got = std::fs::metadata(dir.path().join("small.bin")).unwrap();
                    assert_eq!(got.len(), 16 * 1024, "{c}");
                } else {
                    // The first range of the TS: a sync byte at 0 and at 188 is not in
                    // 100 bytes, but xxd's first line shows the first: 47.
                    let text = String::from_utf8_lossy(&o.stdout);
                    assert!(text.starts_with("00000000: 47"), "{c}: {text}");
                }
            }
            "ffprobe" => {
                let o = Command::new("ffprobe").args(&words[1..]).output().unwrap();
                let err = String::from_utf8_lossy(&o.stderr);
                assert!(o.status.success(), "{c}: {err}");
                assert!(
                    err.contains("Video: h264") && err.contains("640x360"),
                    "{c}: no H.264 picture in\n{err}"
                );
                assert!(err.contains("Audio: aac"), "{c}: no AAC in\n{err}");
                urls.push(words[1].to_string());
            }
            "mpv" => {
                let o = Command::new("mpv")
                    .args(["--no-config", "--vo=null", "--ao=null", "--really-quiet"])
                    .args(&words[1..])
                    .output()
                    .unwrap();
                assert!(
                    o.status.success(),
                    "{c}: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
                urls.push(words[1].to_string());
            }
            "ffplay" => urls.push(words[1].to_string()),
            "penstock" => continue,
            w if w.starts_with("http://") => {
                pages.push(w.to_string());
                for u in &words {
                    let o = Command::new("curl")
                        .args(["-sf", "-o", "/dev/null", u])
                        .output()
                        .unwrap();
                    assert!(o.status.success(), "curl {u}: {o:?}");
                }
            }
            other => {
                panic!("the demo printed a command this test does not know: {other:?} in {c:?}")
            }
        }
        ran.push(words[0].to_string());
    }
    for tool in ["curl", "ffprobe", "mpv", "ffplay"] {
        assert!(
            ran.iter().any(|r| r == tool),
            "the demo printed no {tool} command: {lines:?}"
        );
    }
    assert!(urls.iter().any(|u| u.starts_with("rtsp://")), "{urls:?}");
    assert!(urls.iter().any(|u| u.ends_with("index.m3u8")), "{urls:?}");
    assert!(urls.iter().any(|u| u.ends_with("manifest.mpd")), "{urls:?}");
    for u in &urls {
        let s = spread(&first_picture(u));
        println!("{u}: first picture's grey-level spread {s:.1}");
        assert!(s > 10.0, "{u}: a blank picture (spread {s:.1})");
    }
    // The page the demo points a browser at: headless Chromium plays its video past 2 s,
    // the picture then is not blank, and nothing is asked of another host.
    let Some(player) = penstock_testreq::require_browser_player() else {
        return;
    };
    let page = pages.first().expect("the demo printed no page");
    let (line, _, shot) =
        penstock_testreq::run_browser_player(&player, "demo.mjs", page, &[], &[], "demo");
    let v: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(v["ok"], true, "{line}");
    assert_eq!(
        (v["width"].as_u64(), v["height"].as_u64()),
        (Some(640), Some(360)),
        "{line}"
    );
    let s = v["spread"].as_f64().unwrap_or(0.0);
    println!("{page} in Chromium: {line} (screenshot {})", shot.display());
    assert!(
        s > 10.0,
        "{page}: Chromium shows a blank picture (spread {s:.1})"
    );
}
