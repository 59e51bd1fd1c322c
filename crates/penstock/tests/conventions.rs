//! Command-line conventions (issue 16): exit codes and machine-readable output.

use std::io::{BufRead, BufReader, Write};
use std::net::UdpSocket;
use std::process::{Command, Stdio};
use std::time::Duration;

fn penstock() -> Command {
    Command::new(env!("CARGO_BIN_EXE_penstock"))
}

#[test]
fn ctl_exits_non_zero_when_any_reply_on_stdin_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("ctl.sock");
    let conf = dir.path().join("p.toml");
    std::fs::write(
        &conf,
        "[rtsp]\nlisten = \"\"\n[http]\nlisten = \"127.0.0.1:0\"\n[control]\nlisten = \"\"\n",
    )
    .unwrap();
    let mut server = penstock()
        .args(["serve", "--config"])
        .arg(&conf)
        .arg("--root")
        .arg(dir.path())
        .arg("--control-unix")
        .arg(&sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let run = |input: &str| {
        let mut c = penstock()
            .args(["ctl", &format!("unix:{}", sock.display())])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        c.wait_with_output().unwrap()
    };
    let o = run("HELP\nSTATS\n");
    assert!(o.status.success(), "{o:?}");
    // An error reply in the middle, then successes: still a failure.
    let o = run("HELP\nNOT-A-COMMAND\nSTATS\n");
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("400 "));
    let _ = server.kill();
    let _ = server.wait();
}

#[test]
fn record_json_prints_only_json_on_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("rec.ts");
    let mut rec = penstock()
        .args(["record", "udp-listen://127.0.0.1:0"])
        .arg(&out)
        .args([
            "--json",
            "--duration",
            "2s",
            "--progress",
            "--sync-every",
            "100ms",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(rec.stderr.take().unwrap());
    let mut first = String::new();
    err.read_line(&mut first).unwrap();
    let addr = first
        .trim()
        .strip_prefix("listening ")
        .unwrap_or_else(|| panic!("expected `listening ADDR` on stderr, got {first:?}"))
        .to_string();
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    for i in 0..50u8 {
        let mut pkt = [0u8; 188];
        pkt[0] = 0x47;
        pkt[3] = i;
        tx.send_to(&pkt, &addr).unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    let o = rec.wait_with_output().unwrap();
    assert!(o.status.success(), "{o:?}");
    let stdout = String::from_utf8(o.stdout).unwrap();
    let v: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON value ({e}): {stdout:?}"));
    assert_eq!(v["packets"], 50, "{v}");
    assert_eq!(v["listen"], addr.as_str(), "{v}");
}

/// `--json` alone: the object on stdout and nothing else there; `--json=FILE`: the object
/// in FILE, and the command's usual lines where they always go.
#[test]
fn json_goes_to_stdout_alone_or_to_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.bin");
    std::fs::write(&src, vec![7u8; 100_000]).unwrap();
    let o = penstock()
        .arg("stream")
        .arg(&src)
        .arg(dir.path().join("a.bin"))
        .arg("--json")
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["bytes"], 100_000);
    let file = dir.path().join("out.json");
    let o = penstock()
        .arg("stream")
        .arg(&src)
        .arg(dir.path().join("b.bin"))
        .arg(format!("--json={}", file.display()))
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    assert!(o.stdout.is_empty(), "{o:?}");
    assert!(!o.stderr.is_empty(), "the summary line stays on stderr");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(v["bytes"], 100_000);
}

/// Every command that writes JSON takes it the same way (issue 16: `bench http` had
/// `--out`, `stream` and `record` a bare flag, the other benches a required file).
#[test]
fn every_json_flag_is_json_with_an_optional_file() {
    for cmd in [
        &["stream"][..],
        &["record"],
        &["bench", "paths"],
        &["bench", "periodic"],
        &["bench", "record"],
        &["bench", "isolation"],
        &["bench", "rtu"],
        &["bench", "stripe"],
        &["bench", "http"],
        &["bench", "cues"],
        &["bench", "rtsp"],
    ] {
        let o = penstock().args(cmd).arg("--help").output().unwrap();
        let help = String::from_utf8_lossy(&o.stdout);
        assert!(
            help.contains("--json [<FILE>]") || help.contains("--json[=<FILE>]"),
            "{cmd:?}: {help}"
        );
    }
}

/// Bad usage exits 2 (issue 16: conflicting pacing flags exited 1), before anything opens.
#[test]
fn conflicting_flags_are_bad_usage_and_exit_2() {
    for args in [
        &["stream", "a", "b", "--rate", "30/s", "--period", "33ms"][..],
        &["stream", "a", "b", "--rate", "30/s", "--schedule", "4,40ms"],
        &["stream", "a", "b", "--from", "2s"],
        &["stream", "a", "b", "--timing", "tracks", "--rate", "30/s"],
        &["stream", "a", "b", "--timing", "sometimes"],
    ] {
        let o = penstock().args(args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {o:?}");
    }
}

/// Logs (issue 16): no colour escapes into a file, lifecycle lines at info by default for
/// serve, and `--log-format json` one JSON object per line.
#[test]
fn serve_logs_its_lifecycle_plainly_or_as_json() {
    for json in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("p.toml");
        std::fs::write(
            &conf,
            "[rtsp]\nlisten = \"\"\n[http]\nlisten = \"127.0.0.1:0\"\n[control]\nlisten = \"\"\n",
        )
        .unwrap();
        let log = dir.path().join("stderr.log");
        let mut cmd = penstock();
        cmd.args(["serve", "--no-control-unix", "--config"])
            .arg(&conf)
            .arg("--root")
            .arg(dir.path());
        if json {
            cmd.args(["--log-format", "json"]);
        }
        let mut server = cmd
            .env_remove("PENSTOCK_LOG")
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(server.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(server.id() as i32).unwrap(),
            rustix::process::Signal::TERM,
        )
        .unwrap();
        assert!(server.wait().unwrap().success());
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(
            !text.contains('\u{1b}'),
            "colour escapes in a file: {text:?}"
        );
        assert!(text.contains("serving"), "no lifecycle line: {text:?}");
        assert!(text.contains("stopping"), "no lifecycle line: {text:?}");
        if json {
            for line in text.lines() {
                let v: serde_json::Value = serde_json::from_str(line)
                    .unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
                assert!(v["level"].is_string(), "{line}");
            }
        }
    }
}

/// A benchmark installs no system package (issue 16): without nginx and wrk on PATH,
/// `bench http` names them and exits 2.
#[test]
fn bench_http_without_its_peers_says_so_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/bin/sh", dir.path().join("sh")).unwrap();
    let o = penstock()
        .args(["bench", "http", "--quick"])
        .env("PATH", dir.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("apt-get install nginx wrk"), "{err}");
}

/// `bench cues` without a C compiler, or without libpenstock.so, says which and exits 2
/// before it makes any file.
#[test]
fn bench_cues_without_cc_or_the_library_says_so_and_exits_2() {
    let empty = tempfile::tempdir().unwrap();
    let o = penstock()
        .args(["bench", "cues"])
        .env("PATH", empty.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no C compiler"), "{err}");

    let o = penstock()
        .args(["bench", "cues", "--lib-dir"])
        .arg(empty.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("libpenstock.so not found"), "{err}");
}

/// A second `penstock serve` whose addresses are taken fails naming the way out (issue 40
/// item 4): the flag or setting that moves that listener or turns it off, for the control
/// port and for the control socket; and the first server is untouched.
#[test]
fn a_second_instance_names_the_way_out() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("p.toml");
    std::fs::write(
        &conf,
        "[rtsp]\nlisten = \"\"\n[http]\nlisten = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    let sock = dir.path().join("ctl.sock");
    let serve = |control: &str| {
        let mut c = penstock();
        c.args(["serve", "--config"])
            .arg(&conf)
            .arg("--root")
            .arg(dir.path())
            .args(["--control", control, "--control-unix"])
            .arg(&sock)
            .env("PENSTOCK_LOG", "error");
        c
    };
    let first_log = dir.path().join("first.log");
    let mut first = serve("127.0.0.1:0")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&first_log).unwrap())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(first.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    // "penstock serve: http://…, control 127.0.0.1:PORT, control unix:…"
    let control = line
        .split(", ")
        .find_map(|p| p.strip_prefix("control "))
        .filter(|a| !a.starts_with("unix:"))
        .unwrap_or_else(|| panic!("no control address in {line:?}"))
        .to_string();
    for (taken, way) in [
        (control.as_str(), "--control ADDR"),
        ("", "--control-unix PATH, or --no-control-unix"),
    ] {
        let o = serve(taken).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains("another penstock serve"), "{err}");
        assert!(err.contains(way), "{way:?} not named in:\n{err}");
    }
    assert!(
        first.try_wait().unwrap().is_none(),
        "the first server ran on"
    );
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(first.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let status = first.wait().unwrap();
    assert!(
        status.success(),
        "the first server: {status}\n{}",
        std::fs::read_to_string(&first_log).unwrap_or_default()
    );
}
