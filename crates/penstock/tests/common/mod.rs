//! Helpers shared by the tests that run `penstock serve` as a process.
#![allow(dead_code)]

pub mod zerocopy;

/// Takes the child's piped stdout, returns its first line (`penstock serve`'s start line)
/// and drains the rest on a thread, so that the server never blocks writing to it.
pub fn start_line(child: &mut std::process::Child) -> String {
    use std::io::BufRead;
    let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout piped"));
    let mut line = String::new();
    out.read_line(&mut line).expect("the start line");
    std::thread::spawn(move || for _ in out.lines() {});
    line
}

/// The HTTP address and, when the line has one, the control TCP address from `penstock
/// serve`'s start line: `penstock serve: http://HOST:PORT, control HOST:PORT, control
/// unix:PATH, rtsp://…/`.
pub fn serve_addresses(line: &str) -> (String, Option<String>) {
    let rest = line
        .strip_prefix("penstock serve: http://")
        .unwrap_or_else(|| panic!("not a start line: {line:?}"));
    let field_end = |s: &str| {
        s.find([',', ';', ' '])
            .map_or(s, |i| &s[..i])
            .trim()
            .to_string()
    };
    let http = field_end(rest);
    let control = line
        .split(", control ")
        .nth(1)
        .filter(|c| !c.starts_with("unix:"))
        .map(field_end);
    (http, control)
}

/// GET `http://ADDR/metrics` (Prometheus text 0.0.4): the body, or `None` on any failure.
pub fn scrape(addr: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).ok()?;
    let text = String::from_utf8(out).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_string())
}

/// `promtool check metrics` on `page`: `None` when promtool is not installed, else whether
/// it passed and what it said.
pub fn promtool(page: &str) -> Option<(bool, String)> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => panic!("promtool: {e}"),
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    Some((
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    ))
}

/// Asserts that `promtool check metrics` passes `page` without a word, or says SKIPPED
/// (penstock_testreq: counted, a failure under PENSTOCK_TEST_REQUIRE=all).
pub fn assert_promtool_clean(page: &str) {
    if !penstock_testreq::require("promtool") {
        return;
    }
    let (ok, out) = promtool(page).expect("promtool runs");
    assert!(ok, "promtool check metrics failed:\n{out}\n{page}");
    assert!(
        out.trim().is_empty(),
        "promtool has something to say:\n{out}"
    );
}

/// The value of the first sample line that starts with `sample` then a space.
pub fn sample(page: &str, sample: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
}

/// Whether a `gst-launch-1.0 … rtspsrc …` run that exited non-zero failed only by
/// GStreamer's own race at the end of a stream, not by anything the server did.
///
/// At EOS (the server's RTCP BYE) gst-launch takes the pipeline down at once: the change to
/// PAUSED makes rtspsrc's command thread send PAUSE while the change to READY flushes the
/// connection from another thread. When the flush lands during the PAUSE's write, the write
/// fails before a byte leaves (GLib reports it as an error with nothing written, which
/// gstrtspconnection maps to `GST_RTSP_EEOF`), and rtspsrc posts "Could not send message.
/// (Received end-of-file)" from `gst_rtspsrc_try_send` / `gst_rtspsrc_pause`. GStreamer 1.22
/// (Debian 12) does this against GStreamer's own RTSP server too: 1 of 48 UDP clients of a
/// 3 s clip against gst-rtsp-server, 1 of 30 against penstock, each run with
/// `GST_DEBUG=rtspsrc:5` showing `connection flush busy PAUSE` just before the failed write.
/// Callers still check every byte the player wrote.
pub fn gst_teardown_race(stderr: &str) -> bool {
    let mut errors = 0;
    for block in stderr.split("ERROR: from element").skip(1) {
        // One block: the element's message and its "Additional debug info" lines, up to the
        // next ERROR.
        let block = block.split("\nERROR:").next().unwrap_or(block);
        let in_pause =
            block.contains("gst_rtspsrc_pause") || block.contains("gst_rtspsrc_try_send");
        if !(in_pause && block.contains("Could not send message. (Received end-of-file)")) {
            return false;
        }
        errors += 1;
    }
    // Any other error line (a failed preroll, a refused SETUP, …) is a real failure.
    let others = stderr
        .lines()
        .filter(|l| l.starts_with("ERROR:") && !l.starts_with("ERROR: from element"))
        .count();
    errors > 0 && others == 0
}

/// Whether `name arg` runs and exits 0 (a tool is installed: `tool("ffmpeg", "-version")`).
pub fn tool(name: &str, arg: &str) -> bool {
    std::process::Command::new(name)
        .arg(arg)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A `seconds`-long MPEG-2 video TS at 2 Mbit/s, GOP 1 s (ffmpeg's testsrc), written to
/// `clip.ts` in a temporary directory named after `tag` and this process; `None` with a
/// SKIPPED line (counted; a failure under PENSTOCK_TEST_REQUIRE=all) when ffmpeg is missing.
pub fn mpeg2_ts_clip(tag: &str, seconds: u32) -> Option<std::path::PathBuf> {
    if !penstock_testreq::require("ffmpeg") {
        return None;
    }
    let dir = std::env::temp_dir().join(format!("penstock-{tag}-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("clip.ts");
    let o = std::process::Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi"])
        .args(["-i", "testsrc=size=320x240:rate=25", "-t"])
        .arg(seconds.to_string())
        .args([
            "-c:v",
            "mpeg2video",
            "-b:v",
            "2M",
            "-g",
            "25",
            "-f",
            "mpegts",
        ])
        .arg(&path)
        .output()
        .expect("ffmpeg");
    assert!(
        o.status.success(),
        "ffmpeg: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    Some(path)
}

/// Bytes waiting in the receive queue of the UDP socket bound to local `port`
/// (/proc/net/udp's `tx_queue:rx_queue`, hex), or `None` when no socket has that port.
pub fn udp_rx_queue(port: u16) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/udp").ok()?;
    table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (_, p) = f.get(1)?.rsplit_once(':')?;
        (u16::from_str_radix(p, 16).ok()? == port)
            .then(|| u64::from_str_radix(f.get(4)?.split_once(':')?.1, 16).ok())
            .flatten()
    })
}

/// Waits (a bounded poll, never a fixed sleep) until the process `child`, which reads the UDP
/// socket on `port`, has read everything queued on it, or has exited.
pub fn wait_udp_read(port: u16, child: &mut std::process::Child) {
    let t0 = std::time::Instant::now();
    while udp_rx_queue(port).is_some_and(|q| q > 0) {
        if child.try_wait().expect("wait").is_some() {
            return;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(60),
            "the receiver on port {port} never read its socket empty"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Runs the `openssl` command in `dir`; its failure fails the test.
pub fn openssl(args: &[&str], dir: &std::path::Path) {
    let o = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl (apt-get install openssl)");
    assert!(
        o.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A throwaway CA (`ca.pem`) and a certificate for localhost / 127.0.0.1 signed by it
/// (`NAME.pem`, the chain leaf first; `NAME.key`, mode 0600) with subject CN `cn`.
pub fn make_ca(dir: &std::path::Path) {
    openssl(
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=penstock-test-ca",
        ],
        dir,
    );
}

pub fn make_cert(
    dir: &std::path::Path,
    name: &str,
    cn: &str,
) -> (std::path::PathBuf, std::path::PathBuf) {
    make_cert_for(dir, name, cn, "DNS:localhost,IP:127.0.0.1")
}

/// [`make_cert`] for the subjectAltName `san` (`DNS:x,IP:127.0.0.2`).
pub fn make_cert_for(
    dir: &std::path::Path,
    name: &str,
    cn: &str,
    san: &str,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let key = format!("{name}.key");
    let csr = format!("{name}.csr");
    let leaf = format!("{name}.leaf");
    openssl(
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={cn}"),
        ],
        dir,
    );
    std::fs::write(dir.join("ext.cnf"), format!("subjectAltName={san}\n")).unwrap();
    openssl(
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
            "-out",
            &leaf,
        ],
        dir,
    );
    // The chain as served: leaf, then the CA (an intermediate's place).
    let mut chain = std::fs::read(dir.join(&leaf)).unwrap();
    chain.extend(std::fs::read(dir.join("ca.pem")).unwrap());
    let cert = dir.join(format!("{name}.pem"));
    std::fs::write(&cert, chain).unwrap();
    let key = dir.join(key);
    set_mode(&key, 0o600);
    (cert, key)
}

pub fn set_mode(p: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}
