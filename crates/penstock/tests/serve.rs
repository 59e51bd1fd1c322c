//! `penstock serve` as a process: the start line, `penstock ctl`, SIGHUP reload, and SIGTERM
//! → exit 0. Waits are bounded loops; nothing asserts a duration.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

fn signal(pid: u32, sig: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(pid as i32).unwrap();
    rustix::process::kill_process(pid, sig).unwrap();
}

fn get_status(addr: &str, path: &str) -> u16 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // A head of about 130 bytes: under the default limit, over the reloaded one.
    let pad = "a".repeat(64);
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nX-Pad: {pad}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out[..out.len().min(12)])
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[test]
fn serve_prints_its_addresses_reloads_on_sighup_and_exits_0_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    std::fs::write(www.join("a.txt"), b"hello").unwrap();
    let conf = dir.path().join("penstock.toml");
    std::fs::write(
        &conf,
        "[http]\nlisten = \"127.0.0.1:0\"\n[control]\nlisten = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    let sock = dir.path().join("ctl.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_penstock"))
        .args(["serve", "--config"])
        .arg(&conf)
        .arg("--root")
        .arg(&www)
        .arg("--control-unix")
        .arg(&sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    // "penstock serve: http://127.0.0.1:PORT, control 127.0.0.1:PORT, control unix:..., ..."
    assert!(line.starts_with("penstock serve: http://"), "{line}");
    assert!(line.contains("http bodies:"), "{line}");
    let http = line["penstock serve: http://".len()..]
        .split(',')
        .next()
        .unwrap()
        .to_string();
    let control = line.split(", control ").nth(1).unwrap().to_string();
    assert_eq!(get_status(&http, "/a.txt"), 200);

    // The client, over TCP and over the Unix socket.
    let ctl = Command::new(env!("CARGO_BIN_EXE_penstock"))
        .args(["ctl", &control, "STATS"])
        .output()
        .unwrap();
    assert!(ctl.status.success());
    assert!(String::from_utf8_lossy(&ctl.stdout).contains("212 end"));
    let ctl = Command::new(env!("CARGO_BIN_EXE_penstock"))
        .args(["ctl", &format!("unix:{}", sock.display())])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    ctl.stdin
        .as_ref()
        .unwrap()
        .write_all(b"HELP\nSTATE *\nQUIT\n")
        .unwrap();
    let o = ctl.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        text.contains("214 end") && text.contains("211 end 0") && text.contains("221 bye"),
        "{text}"
    );

    // SIGHUP: a smaller head limit applies; a bad file is refused and the server keeps running.
    std::fs::write(
        &conf,
        "[http]\nlisten = \"127.0.0.1:0\"\n[limits]\nheader_bytes_max = 100\n",
    )
    .unwrap();
    signal(child.id(), rustix::process::Signal::HUP);
    let mut reloaded = false;
    for _ in 0..3000 {
        if get_status(&http, "/a.txt") == 431 {
            reloaded = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(reloaded, "SIGHUP did not apply header_bytes_max");
    std::fs::write(&conf, "[limits]\nnot_a_key = 1\n").unwrap();
    signal(child.id(), rustix::process::Signal::HUP);
    assert_eq!(get_status(&http, "/a.txt"), 431);

    signal(child.id(), rustix::process::Signal::TERM);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(!sock.exists(), "the Unix socket was not removed");
}
