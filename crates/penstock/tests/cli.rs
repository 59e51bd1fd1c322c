//! `penstock stream` as a user runs it: the built binary, a `penstock sink` receiver, real
//! loopback sockets (issue 3's acceptance: byte-exact transfers and clear errors).
//!
//! Every error case checks the documented contract of `main.rs`: exit code 1, a line starting
//! `penstock: error:` on stderr that names the problem, and no panic. The io_uring fallback is
//! tested here (PENSTOCK_NO_URING is process-wide, so it is set on a child process only).

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::thread;

const BIN: &str = env!("CARGO_BIN_EXE_penstock");

/// 1 MiB + 7: more than one default unit, not a whole number of blocks.
const SIZE: usize = (1 << 20) + 7;

/// Position-dependent bytes: a block sent to the wrong place changes the checksum.
fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let x = (i as u32).wrapping_mul(2_654_435_761);
            (x >> 24) as u8 ^ (i >> 12) as u8
        })
        .collect()
}

fn penstock(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args)
        .env_remove("PENSTOCK_NO_URING")
        .env_remove("PENSTOCK_NO_REGISTER");
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// A `penstock sink` for one connection, and the address it listens on.
struct Sink {
    child: Child,
    lines: BufReader<std::process::ChildStdout>,
    addr: String,
}

impl Sink {
    fn start() -> Sink {
        let mut child = penstock(&["sink", "127.0.0.1:0", "--count", "1", "--checksum"], &[])
            .stdout(Stdio::piped())
            .spawn()
            .expect("start penstock sink");
        let mut lines = BufReader::new(child.stdout.take().expect("sink stdout"));
        let mut first = String::new();
        lines.read_line(&mut first).expect("sink's first line");
        let addr = first
            .trim()
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("sink said {first:?}, expected `listening HOST:PORT`"))
            .to_string();
        Sink { child, lines, addr }
    }

    fn target(&self) -> String {
        format!("tcp://{}", self.addr)
    }

    /// The connection's `(bytes, crc32c)`, once the sender closed it.
    fn result(mut self) -> (u64, u32) {
        let mut line = String::new();
        self.lines.read_line(&mut line).expect("sink's result line");
        let status = self.child.wait().expect("sink exits");
        assert!(status.success(), "sink failed: {status}");
        let parts: Vec<&str> = line.split_whitespace().collect();
        match parts[..] {
            ["bytes", n, "crc32c", crc] => (
                n.parse().expect("byte count"),
                u32::from_str_radix(crc, 16).expect("crc"),
            ),
            _ => panic!("sink said {line:?}, expected `bytes N crc32c X`"),
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        // Only when a test failed before the sink was done: do not leave it running.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn stderr_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Streams `src` (with `extra` options) to a sink; checks the JSON report and the received
/// bytes against `want`. Returns stderr for further checks.
fn stream_to_sink(
    name: &str,
    src: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
    want: &[u8],
    want_path: &str,
) -> String {
    let sink = Sink::start();
    let target = sink.target();
    let mut args = vec![
        "stream",
        src.to_str().expect("utf-8 path"),
        &target,
        "--json",
    ];
    args.extend_from_slice(extra);
    let o = penstock(&args, env).output().expect("run penstock stream");
    let err = stderr_of(&o);
    assert!(
        o.status.success(),
        "{name}: exit {}, stderr:\n{err}",
        o.status
    );
    assert!(!err.contains("panicked"), "{name}: {err}");
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "{name}: stdout is not one JSON object ({e}): {:?}",
            o.stdout
        )
    });
    assert_eq!(
        json["bytes"].as_u64(),
        Some(want.len() as u64),
        "{name}: {json}"
    );
    assert_eq!(json["path"].as_str(), Some(want_path), "{name}: {json}");
    for field in ["seconds", "cpu_user_s", "cpu_sys_s"] {
        let v = json[field].as_f64();
        assert!(v.is_some_and(|v| v >= 0.0), "{name}: {field} in {json}");
    }
    let (bytes, crc) = sink.result();
    assert_eq!(
        (bytes, crc),
        (want.len() as u64, penstock_core::crc::crc32c(want)),
        "{name}: what the sink received (bytes, crc32c)"
    );
    err
}

/// Whether the uring path runs here (io_uring can be refused by a sysctl or seccomp): a probe
/// stream of an empty file. Cases that need it are skipped, loudly, when it does not.
fn uring_available(dir: &Path) -> bool {
    let empty = dir.join("empty-probe");
    fs::write(&empty, b"").expect("write probe file");
    let o = penstock(
        &[
            "stream",
            empty.to_str().expect("utf-8"),
            "/dev/null",
            "--path",
            "uring",
        ],
        &[],
    )
    .output()
    .expect("run probe");
    penstock_testreq::require_that("io_uring", (!o.status.success()).then(|| stderr_of(&o)))
}

fn source_file(dir: &Path) -> (std::path::PathBuf, Vec<u8>) {
    let data = pattern(SIZE);
    let p = dir.join("src");
    fs::write(&p, &data).expect("write source");
    (p, data)
}

/// Each path (and auto), whole file and a range at block boundaries, to `penstock sink`.
#[test]
fn stream_to_sink_is_byte_exact_on_every_path() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (src, data) = source_file(dir.path());
    // auto: a file in the page cache to a socket goes with sendfile — where the kernel can
    // tell (cachestat, Linux 6.5); else on the uring path.
    let open = fs::File::open(&src).expect("open source");
    let auto = match penstock_uring::sys::cached_pages(std::os::fd::AsFd::as_fd(&open), 0, 1) {
        Some(_) => "sendfile",
        None => "uring",
    };
    let cases: [(&[&str], &str); 8] = [
        (&["--path", "copy"], "copy"),
        (&["--path", "sendfile"], "sendfile"),
        (&["--path", "splice"], "splice"),
        (&["--path", "uring"], "uring"),
        (&["--path", "uring", "--cache", "bypass"], "uring"),
        (&["--path", "uring", "--cache", "drop"], "uring"),
        (&["--path", "uring", "--zero-copy", "on"], "uring"),
        (&[], auto),
    ];
    let uring = uring_available(dir.path());
    for (opts, want_path) in cases.iter().filter(|c| uring || c.1 != "uring") {
        for (range, lo, hi) in [
            (&[][..], 0, SIZE),
            (
                &["--offset", "4095", "--length", "8194"][..],
                4095,
                4095 + 8194,
            ),
            (&["--offset", "4097"][..], 4097, SIZE),
        ] {
            let mut args = opts.to_vec();
            args.extend_from_slice(range);
            let name = format!("penstock stream {args:?}");
            stream_to_sink(&name, &src, &args, &[], &data[lo..hi], want_path);
        }
    }
}

/// `auto` sends a file that is not in the page cache on the uring path (its reads go through
/// the disk scheduler), and once it is cached, with sendfile.
#[test]
fn auto_reads_an_uncached_file_on_the_uring_path() {
    use std::os::fd::AsFd;
    // In the target directory, not /tmp: pages of a tmpfs file cannot leave the cache.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let (src, data) = source_file(dir.path());
    if !uring_available(dir.path()) {
        return;
    }
    let f = fs::File::open(&src).expect("open source");
    f.sync_all().expect("sync source");
    rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).expect("fadvise");
    let cached = penstock_uring::sys::cached_pages(f.as_fd(), 0, data.len() as u64);
    if !penstock_testreq::require_that(
        "a source evicted from the page cache (fadvise DONTNEED)",
        (!matches!(cached, Some((c, pages)) if c < pages)).then(|| format!("{cached:?}")),
    ) {
        return;
    }
    stream_to_sink("auto, not cached", &src, &[], &[], &data, "uring");
    // That stream read it through the cache (`--cache keep`): now it is all there.
    stream_to_sink("auto, cached", &src, &[], &[], &data, "sendfile");
}

/// With io_uring unavailable (PENSTOCK_NO_URING), auto picks sendfile and says why once; the
/// readiness paths still work; `--path uring` is refused.
#[test]
fn without_io_uring_streams_fall_back() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (src, data) = source_file(dir.path());
    let env = [("PENSTOCK_NO_URING", "1")];
    let err = stream_to_sink("no io_uring, auto", &src, &[], &env, &data, "sendfile");
    assert_eq!(
        err.matches("io_uring unavailable").count(),
        1,
        "the fallback is said once: {err}"
    );
    for p in ["copy", "sendfile", "splice"] {
        let name = format!("no io_uring, --path {p}");
        stream_to_sink(&name, &src, &["--path", p], &env, &data, p);
    }
    let o = penstock(
        &[
            "stream",
            src.to_str().expect("utf-8"),
            "/dev/null",
            "--path",
            "uring",
        ],
        &env,
    )
    .output()
    .expect("run");
    expect_error("no io_uring, --path uring", &o, "needs io_uring");
}

/// The uring path with buffer registration disabled (plain READ instead of READ_FIXED).
#[test]
fn uring_without_registered_buffers_is_byte_exact() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (src, data) = source_file(dir.path());
    if !uring_available(dir.path()) {
        return;
    }
    let env = [("PENSTOCK_NO_REGISTER", "1")];
    for cache in ["keep", "bypass"] {
        let name = format!("no registration, cache {cache}");
        let args = ["--path", "uring", "--cache", cache, "--offset", "1"];
        stream_to_sink(&name, &src, &args, &env, &data[1..], "uring");
    }
}

/// `-` as source (a pipe on stdin) and as target (a pipe on stdout).
#[test]
fn stdin_and_stdout_pipes_are_byte_exact() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (src, data) = source_file(dir.path());
    for p in ["auto", "copy", "splice"] {
        let out = dir.path().join(format!("from-stdin-{p}"));
        let mut child = penstock(
            &["stream", "-", out.to_str().expect("utf-8"), "--path", p],
            &[],
        )
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run");
        let mut stdin = child.stdin.take().expect("stdin");
        let d = data.clone();
        let writer = thread::spawn(move || stdin.write_all(&d));
        let o = child.wait_with_output().expect("wait");
        writer.join().expect("writer").expect("write stdin");
        assert!(
            o.status.success(),
            "stdin -> file by {p}: {}",
            stderr_of(&o)
        );
        assert!(
            fs::read(&out).expect("read") == data,
            "stdin -> file by {p}: bytes differ"
        );
    }
    for p in ["auto", "copy", "sendfile", "splice"] {
        let o = penstock(
            &[
                "stream",
                src.to_str().expect("utf-8"),
                "-",
                "--path",
                p,
                "--offset",
                "4096",
            ],
            &[],
        )
        .output()
        .expect("run");
        assert!(
            o.status.success(),
            "file -> stdout by {p}: {}",
            stderr_of(&o)
        );
        assert!(
            o.stdout == data[4096..],
            "file -> stdout by {p}: {} bytes, differ",
            o.stdout.len()
        );
    }
}

/// Exit code 1, `penstock: error: ...` naming the problem, no panic.
fn expect_error(name: &str, o: &Output, fragment: &str) {
    expect_exit(name, o, fragment, 1)
}

/// Bad usage (a malformed endpoint name, as clap's own errors): exit 2.
fn expect_usage_error(name: &str, o: &Output, fragment: &str) {
    expect_exit(name, o, fragment, 2)
}

fn expect_exit(name: &str, o: &Output, fragment: &str, code: i32) {
    let err = stderr_of(o);
    assert_eq!(
        o.status.code(),
        Some(code),
        "{name}: exit {}, stderr:\n{err}",
        o.status
    );
    assert!(!err.contains("panicked"), "{name}: panicked:\n{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("penstock: error:"))
        .unwrap_or_else(|| panic!("{name}: no `penstock: error:` line in:\n{err}"));
    assert!(
        line.contains(fragment),
        "{name}: error line {line:?} does not say {fragment:?}"
    );
}

fn stream_output(args: &[&str]) -> Output {
    let mut a = vec!["stream"];
    a.extend_from_slice(args);
    penstock(&a, &[]).output().expect("run penstock stream")
}

#[test]
fn bad_input_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (src, _) = source_file(dir.path());
    let d = dir.path().to_str().expect("utf-8");
    let src = src.to_str().expect("utf-8");
    let out = format!("{d}/out");
    let missing = format!("{d}/missing");
    let in_missing_dir = format!("{d}/no/such/dir/out");
    let cases: [(&str, Vec<&str>, &str); 9] = [
        ("missing source file", vec![&missing, &out], "No such file"),
        ("source is a directory", vec![d, &out], "is a directory"),
        ("target is a directory", vec![src, d], "is a directory"),
        (
            "target in a directory that does not exist",
            vec![src, &in_missing_dir],
            "No such file",
        ),
        (
            "nobody listening",
            vec![src, "tcp://127.0.0.1:1"],
            "Connection refused",
        ),
        (
            "offset past the end",
            vec![src, &out, "--offset", "1048584"],
            "past the end",
        ),
        (
            "length past the end",
            vec![src, &out, "--offset", "4096", "--length", "1044488"],
            "past the end",
        ),
        (
            "unit larger than the pool's buffers (uring)",
            vec![src, "/dev/null", "--path", "uring", "--unit", "2MiB"],
            "larger than the pool",
        ),
        (
            "path that cannot carry the pair (splice to UDP)",
            vec![src, "udp://127.0.0.1:9", "--path", "splice"],
            "cannot keep datagram boundaries",
        ),
    ];
    for (name, args, fragment) in cases {
        expect_error(name, &stream_output(&args), fragment);
    }
    for (name, args, fragment) in [
        (
            "malformed endpoint (no port)",
            [src, "tcp://nohostport"],
            "no port",
        ),
        (
            "malformed endpoint (port not a number)",
            [src, "udp://127.0.0.1:http"],
            "invalid port",
        ),
    ] {
        expect_usage_error(name, &stream_output(&args), fragment);
    }
    // An offset exactly at the end is an empty stream, not an error.
    let o = stream_output(&[src, &out, "--offset", "1048583"]);
    assert!(o.status.success(), "offset == size: {}", stderr_of(&o));
}

/// No permission: a source the user may not read, a target directory it may not write. Root
/// ignores file modes, so when the tests run as root the child runs as `nobody` (uid 65534).
#[test]
fn no_permission_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod dir");
    let (src, _) = source_file(dir.path());
    let secret = dir.path().join("secret");
    fs::write(&secret, b"secret").expect("write");
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).expect("chmod file");
    let locked = dir.path().join("locked");
    fs::create_dir(&locked).expect("mkdir");
    fs::set_permissions(&locked, fs::Permissions::from_mode(0o555)).expect("chmod dir");
    let as_root = rustix::process::geteuid().is_root();
    if !as_root {
        eprintln!("not root: checking permissions as the current user");
    }
    let run = |src: &Path, dst: &Path| {
        let mut c = penstock(
            &[
                "stream",
                src.to_str().expect("utf-8"),
                dst.to_str().expect("utf-8"),
            ],
            &[],
        );
        if as_root {
            c.uid(65534).gid(65534);
        }
        c.output().expect("run penstock stream")
    };
    let o = run(&secret, &dir.path().join("copy"));
    expect_error("source without read permission", &o, "Permission denied");
    let o = run(&src, &locked.join("out"));
    expect_error(
        "target in a directory without write permission",
        &o,
        "Permission denied",
    );
}

/// A receiver that reads ~1 MB of a 200 MB stream and closes: the sender fails, saying how
/// many bytes it had sent (at least what the receiver read, less than the file).
#[test]
fn receiver_that_disconnects_is_reported_with_bytes_sent() {
    const BIG: u64 = 200 << 20;
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path().join("big");
    let block = pattern(1 << 20);
    let mut f = std::io::BufWriter::new(fs::File::create(&src).expect("create"));
    for _ in 0..(BIG >> 20) {
        f.write_all(&block).expect("write");
    }
    drop(f);
    let paths: &[&str] = if uring_available(dir.path()) {
        &["copy", "sendfile", "splice", "uring"]
    } else {
        &["copy", "sendfile", "splice"]
    };
    for &p in paths {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        let target = format!("tcp://{}", l.local_addr().expect("addr"));
        let receiver = thread::spawn(move || -> std::io::Result<u64> {
            let (mut s, _) = l.accept()?;
            let mut buf = vec![0u8; 64 << 10];
            let mut total = 0u64;
            while total < 1 << 20 {
                match s.read(&mut buf)? {
                    0 => break,
                    n => total += n as u64,
                }
            }
            Ok(total) // closes with unread data: the sender sees a reset
        });
        let o = stream_output(&[src.to_str().expect("utf-8"), &target, "--path", p]);
        let received = receiver.join().expect("receiver").expect("receive");
        let name = format!("--path {p}, receiver left after {received} bytes");
        expect_error(&name, &o, "disconnected after");
        let err = stderr_of(&o);
        let sent: u64 = err
            .split("disconnected after ")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{name}: no byte count in {err}"));
        assert!(
            (received..BIG).contains(&sent),
            "{name}: says {sent} bytes sent, expected {received}..{BIG}"
        );
    }
}

#[test]
fn malformed_endpoint_lists_the_accepted_forms() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.bin");
    std::fs::write(&src, b"x").unwrap();
    let o = stream_output(&[src.to_str().unwrap(), "bad://where"]);
    expect_usage_error("unknown scheme", &o, "bad://");
    let err = stderr_of(&o);
    for form in [
        "tcp://HOST:PORT",
        "udp-listen://HOST:PORT",
        "/net/udp/PORT",
        "unix:PATH",
    ] {
        assert!(err.contains(form), "the error does not list {form}:\n{err}");
    }
}

/// A paced stream to a UDP receiver: exactly the file, one datagram per unit, a trace with
/// one line per unit in sequence, and lateness statistics in the JSON. Paced: the units are
/// due one period (5 ms at 200/s) apart and none completes before it is due, so the run
/// takes at least 20 periods (lower bounds only; no upper bound on any time).
#[test]
fn paced_stream_sends_exactly_the_file_unit_by_unit() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("movie.ts");
    let data: Vec<u8> = (0..20 * 1024 + 100).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&src, &data).unwrap();
    let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    rx.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let target = format!("udp://{}", rx.local_addr().unwrap());
    let trace = dir.path().join("t.csv");
    for timer in ["uring", "nanosleep"] {
        let t0 = std::time::Instant::now();
        let o = stream_output(&[
            src.to_str().unwrap(),
            &target,
            "--rate",
            "200/s",
            "--unit",
            "1KiB",
            "--timer",
            timer,
            "--trace",
            trace.to_str().unwrap(),
            "--json",
        ]);
        let took = t0.elapsed();
        assert!(o.status.success(), "{timer}: {}", stderr_of(&o));
        // 21 units at 200/s: the last is due 20 periods (100 ms) after the first.
        assert!(
            took >= std::time::Duration::from_millis(100),
            "{timer}: 21 units at 200/s sent in {took:?}: not paced"
        );
        let mut got = Vec::new();
        let mut buf = [0u8; 2048];
        let mut sizes = Vec::new();
        while got.len() < data.len() {
            let n = rx.recv(&mut buf).expect("a datagram");
            sizes.push(n);
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, data, "{timer}: received bytes differ");
        assert!(
            sizes[..sizes.len() - 1].iter().all(|&n| n == 1024),
            "{timer}: sizes {sizes:?}"
        );
        let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(json["lateness"]["units"], 21, "{timer}: {json}");
        let csv = std::fs::read_to_string(&trace).unwrap();
        let mut lines = csv.lines();
        assert!(penstock_core::lateness::TraceRecord::is_csv_header(
            lines.next().unwrap()
        ));
        let records: Vec<_> = lines
            .map(|l| penstock_core::lateness::TraceRecord::from_csv_line(l).unwrap())
            .collect();
        let seqs: Vec<u64> = records.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, (0..21).collect::<Vec<_>>(), "{timer}: trace sequence");
        // The schedule: one period (5 ms) between due times, exactly.
        for w in records.windows(2) {
            assert_eq!(
                w[1].scheduled.as_nanos() - w[0].scheduled.as_nanos(),
                5_000_000,
                "{timer}: {w:?}"
            );
        }
        // Paced: none sent before its due time (the engine's dispatch slack aside).
        let slack = penstock_driver::engine::DISPATCH_SLACK_DEFAULT.as_nanos() as u64;
        for r in &records {
            assert!(
                r.completed.as_nanos() + slack >= r.scheduled.as_nanos(),
                "{timer}: unit {} completed before it was due: {r:?}",
                r.seq
            );
        }
    }
}

#[test]
fn impossible_schedules_are_refused_before_anything_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.bin");
    std::fs::write(&src, vec![1u8; 4096]).unwrap();
    let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    rx.set_nonblocking(true).unwrap();
    let target = format!("udp://{}", rx.local_addr().unwrap());
    let s = src.to_str().unwrap();
    let cases: Vec<(&str, Vec<&str>, &str)> = vec![
        ("zero period", vec![s, &target, "--period", "0"], "period"),
        (
            "negative period",
            vec![s, &target, "--period=-5ms"],
            "duration",
        ),
        ("zero rate", vec![s, &target, "--rate", "0/s"], "rate"),
        (
            "unit larger than the pool's buffer",
            vec![s, &target, "--rate", "30/s", "--unit", "2MiB"],
            "unit",
        ),
        (
            "a rate no dispatcher can meet",
            vec![s, &target, "--period", "100ns", "--unit", "1KiB"],
            "period",
        ),
        // Two pacings (`--rate` with `--period`) are bad usage, exit 2: tests/conventions.rs.
    ];
    for (name, args, fragment) in cases {
        let o = stream_output(&args);
        expect_error(name, &o, fragment);
        let mut buf = [0u8; 64];
        assert!(rx.recv(&mut buf).is_err(), "{name}: a datagram was sent");
    }
}

/// Issue 20: a receiver that accepts and never reads. With `--send-timeout 1s` the command
/// ends (exit 1) within the timeout plus a generous bound, and the error names the stall.
#[test]
fn receiver_that_never_reads_ends_the_stream_at_the_send_timeout() {
    const BOUND: std::time::Duration = std::time::Duration::from_secs(30);
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path().join("big");
    // Sparse: far more than the loopback socket buffers hold, and no disk.
    fs::File::create(&src)
        .and_then(|f| f.set_len(256 << 20))
        .expect("sparse source");
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let target = format!("tcp://{}", l.local_addr().expect("addr"));
    let (done, sender_done) = std::sync::mpsc::channel::<()>();
    let holder = thread::spawn(move || {
        // Accepted and held, never read, until the sender has exited.
        let (s, _) = l.accept().expect("accept");
        let _ = sender_done.recv();
        drop(s);
    });
    let mut child = penstock(
        &[
            "stream",
            src.to_str().expect("utf-8"),
            &target,
            "--send-timeout",
            "1s",
        ],
        &[],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .expect("run penstock stream");
    let t0 = std::time::Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if t0.elapsed() > BOUND {
            let _ = child.kill();
            panic!("penstock stream still running {BOUND:?} after a stall of 1s");
        }
        thread::sleep(std::time::Duration::from_millis(20));
    }
    let o = child.wait_with_output().expect("output");
    drop(done);
    holder.join().expect("holder");
    expect_error("stalled receiver", &o, "no progress for 1s");
}

/// `fd:N` names a descriptor the shell opened for penstock: `penstock stream fd:3 OUT 3<IN`
/// copies it byte for byte; a number no descriptor has is an error naming it (exit 1), and
/// the target is not created.
#[test]
fn stream_reads_a_descriptor_the_shell_opened() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("in");
    let out = dir.path().join("out");
    fs::write(&src, pattern(SIZE)).unwrap();
    let run = |script: &str| {
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg("sh")
            .arg(BIN)
            .arg(&src)
            .arg(&out)
            .env_remove("PENSTOCK_NO_URING")
            .output()
            .unwrap()
    };
    let ok = run(r#"exec "$1" stream fd:3 "$3" 3<"$2""#);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(
        fs::read(&out).unwrap() == pattern(SIZE),
        "fd:3 → file differs"
    );
    fs::remove_file(&out).unwrap();
    let bad = run(r#"exec "$1" stream fd:9 "$3""#);
    assert_eq!(bad.status.code(), Some(1));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("penstock: error: fd:9: Bad file descriptor"),
        "{err}"
    );
    assert!(!out.exists());
}

/// A fast bit rate to a TCP target without `--unit` moves in units a millisecond apart (whole
/// multiples of seven TS packets), not in 1316-byte ones whose per-send cost capped what
/// such a stream moved (47 MB/s asked 230 MB/s); every byte arrives.
#[test]
fn a_fast_rate_to_tcp_without_a_unit_sends_millisecond_units() {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path().join("rate.bin");
    let data: Vec<u8> = (0..8_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    std::fs::write(&src, &data).expect("write");
    let sink = Sink::start();
    let target = sink.target();
    let o = stream_output(&[src.to_str().unwrap(), &target, "--rate", "1GB/s", "--json"]);
    assert!(o.status.success(), "{}", stderr_of(&o));
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // 1 GB/s is 1,000,000 bytes a millisecond: 760 × 1316 = 1,000,160-byte units, 8 of them.
    assert_eq!(json["lateness"]["units"], 8, "{json}");
    assert_eq!(
        sink.result(),
        (data.len() as u64, penstock_core::crc::crc32c(&data))
    );
}
