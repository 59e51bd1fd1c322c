//! `penstock ctl` never leaks the control token (issue 35, item 6): the token in the default
//! token file goes only to the server that wrote it (the file names its addresses); a
//! listener that is not that server, recording what it receives, gets the command and no
//! `AUTH`; a silent listener makes ctl give up after `--reply-timeout` with an error. A token
//! named on the command line is sent where the user says.

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_penstock");

struct Served {
    child: Child,
    control: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A server with the default control socket beneath `runtime` (`XDG_RUNTIME_DIR`), so that
/// it writes the default token file there, and a TCP control port.
fn serve(runtime: &std::path::Path, root: &std::path::Path) -> Served {
    let conf = runtime.join("penstock.toml");
    std::fs::write(
        &conf,
        "[http]\nlisten = \"127.0.0.1:0\"\n[control]\nlisten = \"127.0.0.1:0\"\n[log]\naccess = \"off\"\n[rtsp]\nlisten = \"\"\n",
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&conf)
        .arg(root)
        .arg("--control-unix")
        .arg(runtime.join("penstock.sock"))
        .env("XDG_RUNTIME_DIR", runtime)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    std::thread::spawn(move || for _ in out.lines() {});
    let control = line
        .split(", control ")
        .nth(1)
        .filter(|c| !c.starts_with("unix:"))
        .and_then(|c| c.split([',', ';', ' ']).next())
        .unwrap_or_else(|| panic!("no control address: {line}"))
        .to_string();
    Served { child, control }
}

/// `penstock ctl ARGS` with the test's runtime directory; waits at most `deadline` (then
/// kills it and fails): (exit success, stdout + stderr).
fn ctl(runtime: &std::path::Path, args: &[&str], deadline: Duration) -> (bool, String) {
    let mut child = Command::new(BIN)
        .arg("ctl")
        .args(args)
        .env("XDG_RUNTIME_DIR", runtime)
        .env_remove("PENSTOCK_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut text = String::new();
            child
                .stdout
                .take()
                .unwrap()
                .read_to_string(&mut text)
                .unwrap();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut text)
                .unwrap();
            return (status.success(), text);
        }
        if t0.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("penstock ctl {args:?} still running after {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A listener that records every byte each connection sends, answering nothing; each
/// connection is closed after `hold`.
fn recorder(hold: Duration) -> (String, Arc<Mutex<Vec<u8>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let g = g.clone();
            std::thread::spawn(move || {
                let t0 = Instant::now();
                s.set_read_timeout(Some(Duration::from_millis(100)))
                    .unwrap();
                let mut b = [0u8; 4096];
                while t0.elapsed() < hold {
                    match s.read(&mut b) {
                        Ok(0) => break,
                        Ok(n) => g.lock().unwrap().extend_from_slice(&b[..n]),
                        Err(_) => {}
                    }
                }
            });
        }
    });
    (addr, got)
}

#[test]
fn the_default_token_goes_only_to_its_server() {
    let runtime = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let s = serve(runtime.path(), root.path());
    let token_file = runtime.path().join("penstock.sock.token");
    let text = std::fs::read_to_string(&token_file).unwrap();
    let token = text.lines().next().unwrap().to_string();
    assert!(
        text.lines().any(|l| l == format!("server {}", s.control)),
        "the token file names its server's address:\n{text}"
    );

    // To its own server: sent, and the command is answered.
    let (ok, out) = ctl(
        runtime.path(),
        &[&s.control, "STATE", "*"],
        Duration::from_secs(60),
    );
    assert!(ok, "{out}");

    // To a listener that is not the server: the command, never AUTH nor the token.
    let (addr, got) = recorder(Duration::from_secs(1));
    let (ok, out) = ctl(
        runtime.path(),
        &[&addr, "--reply-timeout", "5s", "STATE", "*"],
        Duration::from_secs(60),
    );
    assert!(!ok, "{out}");
    assert!(out.contains("not sending the token"), "{out}");
    let seen = String::from_utf8_lossy(&got.lock().unwrap()).to_string();
    assert!(seen.contains("STATE *"), "{seen:?}");
    assert!(!seen.contains("AUTH") && !seen.contains(&token), "{seen:?}");

    // Named explicitly, it is sent where the user says.
    let (addr2, got2) = recorder(Duration::from_secs(1));
    let tf = token_file.to_str().unwrap();
    let _ = ctl(
        runtime.path(),
        &[
            &addr2,
            "--token-file",
            tf,
            "--reply-timeout",
            "5s",
            "STATE",
            "*",
        ],
        Duration::from_secs(60),
    );
    let seen = String::from_utf8_lossy(&got2.lock().unwrap()).to_string();
    assert!(seen.starts_with(&format!("AUTH {token}\n")), "{seen:?}");
}

#[test]
fn a_silent_listener_is_given_up_after_the_reply_timeout() {
    let runtime = tempfile::tempdir().unwrap();
    // Accepts (the kernel does, on listen) and never answers.
    let (addr, got) = recorder(Duration::from_secs(120));
    let (ok, out) = ctl(
        runtime.path(),
        &[
            &addr,
            "--token",
            "t0ken",
            "--reply-timeout",
            "1s",
            "STATE",
            "*",
        ],
        Duration::from_secs(60),
    );
    assert!(!ok);
    assert!(out.contains("no reply within --reply-timeout"), "{out}");
    // The explicit token was sent (the user named it), and nothing else answered.
    assert!(String::from_utf8_lossy(&got.lock().unwrap()).starts_with("AUTH t0ken\n"));
}
