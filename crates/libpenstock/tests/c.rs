//! The C tests (`tests/c/*.c`), the example server's two builds (`examples/c/httpd.c`) and
//! the Python example (`examples/python/cue.py`), each built against libpenstock and run
//! here: under valgrind (memcheck, `--error-exitcode=1 --leak-check=full`) where it is
//! installed, else plainly (said on stderr).
//!
//! How they link: by default against the library `cargo test` just built (its `deps`
//! directory) and the checked-in header. With `PENSTOCK_C_PKG_CONFIG=1` (what `.ci/run` sets
//! after `cargo cinstall --prefix …`), through `pkg-config --cflags --libs penstock` only —
//! the acceptance test's "linked only through pkg-config".

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The flags that compile and link a C program against libpenstock, and the directory to
/// find `libpenstock.so` in at run time.
fn link_flags() -> (Vec<String>, PathBuf) {
    if std::env::var_os("PENSTOCK_C_PKG_CONFIG").is_some() {
        let out = Command::new("pkg-config")
            .args(["--cflags", "--libs", "penstock"])
            .output()
            .expect("pkg-config runs");
        assert!(
            out.status.success(),
            "pkg-config penstock: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let flags = String::from_utf8(out.stdout).unwrap();
        let libdir = Command::new("pkg-config")
            .args(["--variable=libdir", "penstock"])
            .output()
            .expect("pkg-config runs");
        let libdir = PathBuf::from(String::from_utf8(libdir.stdout).unwrap().trim());
        return (flags.split_whitespace().map(String::from).collect(), libdir);
    }
    // The test binary lives in target/<profile>/deps, where cargo put the cdylib it built.
    let deps = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    assert!(
        deps.join("libpenstock.so").exists(),
        "libpenstock.so not in {}",
        deps.display()
    );
    (
        vec![
            format!("-I{}", crate_dir().join("include").display()),
            format!("-L{}", deps.display()),
            "-lpenstock".into(),
        ],
        deps,
    )
}

/// Compiles `sources` into `out` with `extra` flags (warnings are errors).
fn compile(sources: &[&Path], out: &Path, extra: &[&str]) {
    let (flags, libdir) = link_flags();
    let status = Command::new("cc")
        .args([
            "-std=c11", "-Wall", "-Wextra", "-Werror", "-g", "-O1", "-pthread",
        ])
        .args(extra)
        .args(sources)
        .arg("-o")
        .arg(out)
        .args(&flags)
        .arg(format!("-Wl,-rpath,{}", libdir.display()))
        .status()
        .expect("cc runs");
    assert!(status.success(), "cc failed for {sources:?}");
}

/// Whether a C compiler is here (penstock_testreq: SKIPPED and counted without one, a
/// failure under PENSTOCK_TEST_REQUIRE=all).
fn cc_present() -> bool {
    penstock_testreq::require("cc")
}

/// valgrind's memcheck (the C programs run without it when it is missing, said and counted).
fn valgrind() -> bool {
    penstock_testreq::require("valgrind")
}

/// A command that runs `exe` (under memcheck where valgrind is installed) with the library
/// its run path names: cargo's `LD_LIBRARY_PATH` (which holds `target/<profile>`, where an
/// older `cargo build` may have left another libpenstock.so) is not passed on.
fn checked(exe: &Path) -> Command {
    let mut c = checked_command(exe);
    c.env_remove("LD_LIBRARY_PATH");
    c
}

fn checked_command(exe: &Path) -> Command {
    if valgrind() {
        let mut c = Command::new("valgrind");
        c.args([
            "--quiet",
            "--error-exitcode=1",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite,possible",
            "--trace-children=no",
        ])
        .arg(format!(
            "--suppressions={}",
            crate_dir().join("tests/c/valgrind.supp").display()
        ))
        .arg(exe)
        // valgrind 3.19 keeps its one big lock through a blocking io_uring_enter, so a worker
        // waiting in its ring stops every other thread for good: under memcheck the engine
        // runs without io_uring (its poll(2) fallback; the plain run covers the ring).
        .env("PENSTOCK_NO_URING", "1")
        // Memcheck's translation of code not yet run is charged to the thread that runs it
        // (an upcall's first call can use ms of CPU for one atomic add): the C tests that
        // check a CPU budget check it in the plain run only.
        .env("PENSTOCK_TEST_MEMCHECK", "1");
        c
    } else {
        Command::new(exe)
    }
}

/// Waits for `child` at most `limit` (a hung test is killed and fails, not waited on forever).
fn wait_for(mut child: Child, limit: Duration, what: &str) -> std::process::Output {
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what} still running after {limit:?}; killed.\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Builds and runs C test `name` twice: plainly (io_uring where the kernel allows), then
/// under memcheck (see [`checked`]).
fn run_c_test(name: &str) {
    if !cc_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join(name);
    let src = crate_dir().join("tests/c").join(format!("{name}.c"));
    compile(
        &[&src],
        &exe,
        &[&format!("-I{}", crate_dir().join("tests/c").display())],
    );
    let mut plain = Command::new(&exe);
    plain.env_remove("LD_LIBRARY_PATH");
    for (how, mut cmd) in [("plain", plain), ("memcheck", checked(&exe))] {
        let child = cmd
            .env("TMPDIR", dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = wait_for(child, Duration::from_secs(600), name);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stdout.contains(&format!("{name}: ok")),
            "{name} ({how}) failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
            out.status
        );
    }
}

#[test]
fn c_transfers_are_byte_exact() {
    run_c_test("transfer");
}

#[test]
fn c_control_descriptor_commands() {
    run_c_test("control");
}

#[test]
fn c_bad_input_gives_codes_and_messages_never_an_abort() {
    run_c_test("errors");
}

#[test]
fn c_real_time_upcalls_run_within_budget_and_overcommit_is_refused() {
    run_c_test("rtu");
}

// ---- the example server ------------------------------------------------------------------

fn repo_dir() -> PathBuf {
    crate_dir().join("../..")
}

/// Starts a build of the example server on a kernel-chosen port, serving `root` for
/// `requests` requests; returns it and its port (read from its first line).
/// `socket`: the hand-off build's `penstock serve` control socket (PENSTOCK_SOCKET).
fn start_httpd(
    exe: &Path,
    root: &Path,
    requests: usize,
    under_valgrind: bool,
    socket: Option<&Path>,
) -> (Child, u16) {
    let mut cmd = if under_valgrind {
        checked(exe)
    } else {
        let mut c = Command::new(exe);
        c.env_remove("LD_LIBRARY_PATH");
        c
    };
    match socket {
        Some(s) => cmd.env("PENSTOCK_SOCKET", s),
        None => cmd.env_remove("PENSTOCK_SOCKET"),
    };
    let mut child = cmd
        .args(["-p", "0", "-n", &requests.to_string()])
        .arg(root)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while out.read(&mut b).unwrap_or(0) == 1 && b[0] != b'\n' {
        line.push(b[0]);
    }
    let line = String::from_utf8(line).unwrap();
    let port = line
        .rsplit(':')
        .next()
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    (child, port)
}

fn curl(port: u16, path: &str) -> (String, Vec<u8>) {
    let out = Command::new("curl")
        .args(["-s", "-S", "-i", "--http1.0", "--max-time", "120"])
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .output()
        .expect("curl runs");
    let split = out
        .stdout
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head");
    let head = String::from_utf8_lossy(&out.stdout[..split]).to_string();
    (
        head.lines().next().unwrap_or("").to_string(),
        out.stdout[split + 4..].to_vec(),
    )
}

/// A request curl would not send: the raw reply's status line.
fn raw_status(port: u16, request: &[u8]) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(request).unwrap();
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    reply.lines().next().unwrap_or("").to_string()
}

/// Issue 14's "two lines": the example server built plainly (sendfile), with
/// `-DUSE_READWRITE` (a read/write loop, the baseline of `penstock bench cues`), with
/// `-DUSE_SENDFILE_NONBLOCKING` (the bench's non-blocking sendfile baseline), with
/// `-DUSE_PENSTOCK` (penstock_cue + START) and with `-DUSE_PENSTOCK_CONNECT` too (hand-off to
/// a running `penstock serve`: penstock_connect + penstock_conn_cue) serves the same bytes to
/// curl, and the same statuses for a missing file and a method it does not do; the penstock
/// builds run under valgrind and shut down clean (drain, free).
#[test]
fn the_example_servers_builds_serve_identical_bytes() {
    if !penstock_testreq::require("curl") {
        return;
    }
    if !cc_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = repo_dir().join("examples/c/httpd.c");
    let plain = dir.path().join("httpd");
    let cued = dir.path().join("httpd-penstock");
    let copied = dir.path().join("httpd-rw");
    let nonblocking = dir.path().join("httpd-nb");
    let handed = dir.path().join("httpd-handoff");
    compile(&[&src], &plain, &[]);
    compile(&[&src], &copied, &["-DUSE_READWRITE"]);
    compile(&[&src], &nonblocking, &["-DUSE_SENDFILE_NONBLOCKING"]);
    compile(&[&src], &cued, &["-DUSE_PENSTOCK"]);
    compile(
        &[&src],
        &handed,
        &["-DUSE_PENSTOCK", "-DUSE_PENSTOCK_CONNECT"],
    );
    let serve_dir = dir.path().join("serve");
    std::fs::create_dir(&serve_dir).unwrap();
    let (server, socket) = handoff_server(&serve_dir);
    let root = dir.path().join("www");
    std::fs::create_dir(&root).unwrap();
    let files: Vec<(&str, Vec<u8>)> = [0usize, 1, 4097, (3 << 20) + 7]
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let name = ["empty", "one", "page", "big.bin"][i];
            let bytes: Vec<u8> = (0..n).map(|j| (j * 13 + j / 7919) as u8).collect();
            std::fs::write(root.join(name), &bytes).unwrap();
            (name, bytes)
        })
        .collect();
    let mut served: Vec<Vec<(String, Vec<u8>)>> = Vec::new();
    for (exe, under_valgrind, socket) in [
        (&plain, false, None),
        (&copied, false, None),
        (&nonblocking, false, None),
        (&cued, true, None),
        (&handed, true, Some(socket.as_path())),
    ] {
        let requests = files.len() + 2;
        let (child, port) = start_httpd(exe, &root, requests, under_valgrind, socket);
        let mut got: Vec<(String, Vec<u8>)> = files
            .iter()
            .map(|(name, _)| curl(port, &format!("/{name}")))
            .collect();
        got.push(curl(port, "/missing"));
        got.push((raw_status(port, b"POST /page HTTP/1.0\r\n\r\n"), Vec::new()));
        let out = wait_for(child, Duration::from_secs(300), &exe.display().to_string());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{} exited {}: {stderr}",
            exe.display(),
            out.status,
        );
        // The penstock build says on stderr when it had to send a body itself: it never did.
        assert!(
            !stderr.contains("penstock cue") && !stderr.contains("START"),
            "{}: fell back to sendfile: {stderr}",
            exe.display()
        );
        for ((name, bytes), (status, body)) in files.iter().zip(&got) {
            assert_eq!(status, "HTTP/1.0 200 OK", "{}: /{name}", exe.display());
            assert!(
                body == bytes,
                "{}: /{name}: {} bytes differ",
                exe.display(),
                body.len()
            );
        }
        assert_eq!(got[files.len()].0, "HTTP/1.0 404 Not Found");
        assert_eq!(got[files.len() + 1].0, "HTTP/1.0 501 Not Implemented");
        served.push(got);
    }
    assert!(
        served.iter().all(|g| *g == served[0]),
        "the builds served different bytes"
    );
    let _ = server.shutdown(Duration::from_secs(10));
}

/// `examples/python/cue.py`: cue() from Python's ctypes, byte-exact.
#[test]
fn the_python_example_cues_a_file_to_a_socket() {
    if !penstock_testreq::require("python3") {
        return;
    }
    let (_, libdir) = link_flags();
    let out = Command::new("python3")
        .arg(repo_dir().join("examples/python/cue.py"))
        .arg("--check")
        .env("PENSTOCK_LIB", libdir.join("libpenstock.so"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("byte-exact"),
        "cue.py: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---- descriptor hand-off to a running server ------------------------------------------------

const HANDOFF_TOKEN: &str = "handoff-test-token";
const NOBODY: u32 = 65534;

/// The server `penstock serve` runs (`Server::start`), with its Unix control socket in
/// `dir/run/ctl.sock` (a 0755 directory: other users can reach the socket; SO_PEERCRED
/// decides what they may do), allowing this test's uid and 4242 (not `nobody`).
fn handoff_server(dir: &Path) -> (penstock_server::Server, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let run = dir.join("run");
    let www = dir.join("www");
    for p in [&run, &www] {
        std::fs::create_dir(p).unwrap();
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let sock = run.join("ctl.sock");
    let mut cfg = penstock_server::ServerConfig::default();
    cfg.http.listen = "127.0.0.1:0".into();
    cfg.http.workers = 1;
    cfg.control.listen = String::new();
    cfg.rtsp.listen = "".into();
    cfg.control.unix = Some(sock.clone());
    cfg.control.token = Some(HANDOFF_TOKEN.into());
    // Another uid allowed besides this one makes the socket 0666 (the server's rule), so
    // nobody can connect — and be refused by SO_PEERCRED rather than by the file's mode.
    cfg.control.unix_allow_uids = vec![rustix::process::geteuid().as_raw(), 4242];
    cfg.engine.workers = 1;
    cfg.log.access = "off".into();
    (penstock_server::Server::start(&cfg, &www).unwrap(), sock)
}

/// Runs the hand-off program with `args`, plainly then under memcheck, as `uid` (None: this
/// process's user).
fn run_handoff(exe: &Path, tmp: &Path, uid: Option<u32>, args: &[&str]) {
    let mut plain = Command::new(exe);
    plain.env_remove("LD_LIBRARY_PATH");
    for (how, cmd) in [("plain", plain), ("memcheck", checked(exe))] {
        let mut cmd = match uid {
            Some(u) => {
                let mut c = Command::new("setpriv");
                c.args([
                    &format!("--reuid={u}"),
                    &format!("--regid={u}"),
                    "--clear-groups",
                ])
                .arg(cmd.get_program())
                .args(cmd.get_args());
                for (k, v) in cmd.get_envs() {
                    match v {
                        Some(v) => c.env(k, v),
                        None => c.env_remove(k),
                    };
                }
                c
            }
            None => cmd,
        };
        let child = cmd
            .args(args)
            .env("TMPDIR", tmp)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = wait_for(child, Duration::from_secs(300), "handoff");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stdout.contains("handoff: ok"),
            "handoff {args:?} as {uid:?} ({how}) failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
            out.status
        );
    }
}

#[test]
fn c_hands_a_file_and_a_socket_to_a_running_server_and_strangers_are_refused() {
    if !cc_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (server, sock) = handoff_server(dir.path());
    let exe = dir.path().join("handoff");
    let src = crate_dir().join("tests/c/handoff.c");
    compile(
        &[&src],
        &exe,
        &[&format!("-I{}", crate_dir().join("tests/c").display())],
    );
    // Every user's temporary files (valgrind's, as nobody, too), like /tmp.
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).unwrap();
    }
    let sock = sock.to_str().unwrap();
    run_handoff(&exe, &tmp, None, &[sock, "allowed"]);
    // A peer that knows the token but whose uid the socket does not allow: still refused.
    // The refusals run the client as uid NOBODY: root and setpriv.
    if penstock_testreq::require_root() && penstock_testreq::require("setpriv") {
        run_handoff(&exe, &tmp, Some(NOBODY), &[sock, "stranger"]);
        run_handoff(&exe, &tmp, Some(NOBODY), &[sock, "token", HANDOFF_TOKEN]);
    }
    let _ = server.shutdown(Duration::from_secs(10));
}
