//! Issue 21 item 3: `penstock serve` serves the partitions of configured volumes under
//! `/vol/NAME/PART` over HTTP: Range and resume with curl, conditionals on the `ETag` made of
//! the partition's generation, ffprobe over HTTP, and bad names answered 404 by a server that
//! keeps serving.

mod common;

use common::{mpeg2_ts_clip, serve_addresses, start_line};

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn penstock() -> Command {
    Command::new(env!("CARGO_BIN_EXE_penstock"))
}

fn ok(cmd: &mut Command) -> String {
    let o: Output = cmd.output().unwrap();
    assert!(
        o.status.success(),
        "{:?}: {}{}",
        cmd,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn data(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The status line's code and the whole response of a raw request (the path sent as is).
fn raw_get(addr: &str, path: &str, extra: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, text)
}

fn header(resp: &str, name: &str) -> Option<String> {
    resp.lines().take_while(|l| !l.is_empty()).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
    })
}

fn curl(args: &[&str]) -> Output {
    Command::new("curl")
        .args(["-s", "-S", "--max-time", "30"])
        .args(args)
        .output()
        .unwrap()
}

fn stream_into(member: &Path, part: &str, src: &Path) {
    let canon = std::fs::canonicalize(member).unwrap();
    ok(penstock().args([
        "stream",
        src.to_str().unwrap(),
        &format!("vol:{}/{part}", canon.display()),
    ]));
}

#[test]
fn partitions_are_served_over_http_with_ranges_resume_etags_and_404s() {
    if !penstock_testreq::require("curl") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let members = [d.join("hv-m0"), d.join("hv-m1")];
    ok(penstock().args([
        "volume",
        "create",
        "hv",
        "--member-size",
        "64MiB",
        "--member",
        members[0].to_str().unwrap(),
        "--member",
        members[1].to_str().unwrap(),
    ]));
    let m0 = members[0].to_str().unwrap();
    ok(penstock().args(["volume", "add-partition", m0, "data.bin"]));
    let bytes = data(5 * 1024 * 1024 + 12_345, 21);
    let src = d.join("data.in");
    std::fs::write(&src, &bytes).unwrap();
    stream_into(&members[0], "data.bin", &src);
    let clip = mpeg2_ts_clip("serve-volume", 4);
    if let Some(clip) = &clip {
        ok(penstock().args(["volume", "import", m0, "clip.ts", clip.to_str().unwrap()]));
    }

    let root = d.join("www");
    std::fs::create_dir(&root).unwrap();
    let conf = d.join("penstock.toml");
    std::fs::write(
        &conf,
        format!(
            "[rtsp]\nlisten = \"\"\n[control]\nlisten = \"\"\n[http]\nlisten = \"127.0.0.1:0\"\nroot = \"{}\"\n[volumes]\nhv = \"{}\"\n",
            root.display(),
            members[1].display()
        ),
    )
    .unwrap();
    let mut child = penstock()
        .args(["serve", "--no-control-unix", "--config"])
        .arg(&conf)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let line = start_line(&mut child);
    let (http, _) = serve_addresses(&line);
    let url = format!("http://{http}/vol/hv/data.bin");

    // The whole partition.
    let whole = d.join("whole.out");
    let o = curl(&["-f", "-o", whole.to_str().unwrap(), &url]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::read(&whole).unwrap() == bytes, "the body differs");

    // One range: 206 with exactly those bytes.
    let o = curl(&[
        "-f",
        "-r",
        "1000000-1999999",
        "-D",
        "-",
        "-o",
        "/dev/null",
        &url,
    ]);
    let head = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(head.starts_with("HTTP/1.1 206"), "{head}");
    let part = d.join("range.out");
    let o = curl(&[
        "-f",
        "-r",
        "1000000-1999999",
        "-o",
        part.to_str().unwrap(),
        &url,
    ]);
    assert!(o.status.success());
    assert!(std::fs::read(&part).unwrap() == bytes[1_000_000..2_000_000]);

    // Resume: a partial download completed with `curl -C -`.
    let resumed = d.join("resumed.out");
    std::fs::write(&resumed, &bytes[..777_777]).unwrap();
    let o = curl(&["-f", "-C", "-", "-o", resumed.to_str().unwrap(), &url]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        std::fs::read(&resumed).unwrap() == bytes,
        "resumed body differs"
    );

    // The ETag is the generation: a conditional GET with it is 304; a new write changes it.
    let (code, resp) = raw_get(&http, "/vol/hv/data.bin", "Range: bytes=0-0\r\n");
    assert_eq!(code, 206, "{resp}");
    let etag = header(&resp, "ETag").expect("an ETag");
    assert!(etag.starts_with("\"g"), "{etag}");
    let (code, _) = raw_get(
        &http,
        "/vol/hv/data.bin",
        &format!("If-None-Match: {etag}\r\n"),
    );
    assert_eq!(code, 304);
    let bytes2 = data(3 * 1024 * 1024, 22);
    let src2 = d.join("data2.in");
    std::fs::write(&src2, &bytes2).unwrap();
    stream_into(&members[0], "data.bin", &src2); // while the server runs: shared volume
    let (code, resp) = raw_get(
        &http,
        "/vol/hv/data.bin",
        &format!("If-None-Match: {etag}\r\nRange: bytes=0-0\r\n"),
    );
    assert_eq!(code, 206, "a new generation is a new tag: {resp}");
    let etag2 = header(&resp, "ETag").unwrap();
    assert_ne!(etag, etag2);
    // If-Range with the old tag: the whole (changed) partition, not a stale range.
    let (code, resp) = raw_get(
        &http,
        "/vol/hv/data.bin",
        &format!("If-Range: {etag}\r\nRange: bytes=0-9\r\n"),
    );
    assert_eq!(code, 200, "{}", &resp[..resp.len().min(400)]);
    let o = curl(&["-f", "-r", "0-3145727", &url]);
    assert!(o.stdout == bytes2, "the rewritten bytes are served");

    // ffprobe reads a recorded TS from the volume over HTTP.
    if clip.is_some() && penstock_testreq::require("ffprobe") {
        let o = Command::new("ffprobe")
            .args([
                "-v",
                "error",
                "-show_entries",
                "format=format_name,duration",
            ])
            .args(["-of", "default=nw=1"])
            .arg(format!("http://{http}/vol/hv/clip.ts"))
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(out.contains("format_name=mpegts"), "{out}");
        let duration: f64 = out
            .lines()
            .find_map(|l| l.strip_prefix("duration="))
            .and_then(|v| v.parse().ok())
            .expect("a duration");
        assert!((3.5..4.5).contains(&duration), "{out}");
    }

    // Bad names: 404, and the server keeps serving.
    for bad in [
        "/vol/hv/nope",
        "/vol/other/data.bin",
        "/vol/hv",
        "/vol/hv/",
        "/vol/hv/data.bin/x",
        "/vol/hv/..",
        "/vol/hv/%2e%2e",
        "/vol/../vol/hv/data.bin/..",
        "/vol/hv/a%00b",
        &format!("/vol/hv/{}", "x".repeat(300)),
    ] {
        let (code, resp) = raw_get(&http, bad, "");
        assert!(
            code == 404 || code == 400 || code == 403,
            "{bad}: {}",
            &resp[..resp.len().min(300)]
        );
        if bad.starts_with("/vol/hv/") && !bad.contains("..") && !bad.contains('%') {
            assert_eq!(code, 404, "{bad}");
        }
    }
    let (code, _) = raw_get(&http, "/vol/other/x", "");
    assert_eq!(code, 404);
    let (code, _) = raw_get(&http, "/vol/hv/data.bin", "Range: bytes=0-0\r\n");
    assert_eq!(code, 206, "the server still serves after the bad names");

    rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    assert!(child.wait().unwrap().success());
}
