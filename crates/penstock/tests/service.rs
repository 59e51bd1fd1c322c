//! Running as a service: `penstock serve` tells a (fake) service manager READY, RELOADING
//! and STOPPING over NOTIFY_SOCKET; started as root with `user = "nobody"` every thread runs
//! as nobody and serves what nobody may read; `systemd-analyze verify` accepts the units in
//! deploy/systemd; completions and man pages come from the CLI. Waits are bounded; nothing
//! asserts a duration.

mod common;

use common::serve_addresses;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_penstock");

/// The repository's top directory (crates/penstock/../..).
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn signal(pid: u32, sig: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(pid as i32).unwrap();
    rustix::process::kill_process(pid, sig).unwrap();
}

/// A served child that is killed if the test fails before it exits.
struct Served(Option<Child>);

impl Served {
    fn child(&mut self) -> &mut Child {
        self.0.as_mut().unwrap()
    }

    fn id(&self) -> u32 {
        self.0.as_ref().unwrap().id()
    }

    /// SIGTERM, then the exit status.
    fn stop(mut self) -> std::process::ExitStatus {
        signal(self.id(), rustix::process::Signal::TERM);
        self.0.take().unwrap().wait().unwrap()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts `cmd` (a `penstock serve …`) and reads its start line from stdout.
fn serve(cmd: &mut Command) -> (Served, String) {
    let mut s = Served(Some(cmd.stdout(Stdio::piped()).spawn().unwrap()));
    let mut out = BufReader::new(s.child().stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.starts_with("penstock serve: http://"), "{line:?}");
    // Keep reading (and dropping) stdout so that the server never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    (s, line)
}

/// GET `path`: the status code and the body.
fn get(addr: &str, path: &str) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let status = String::from_utf8_lossy(&out[..out.len().min(12)])
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(Vec::new(), |i| out[i + 4..].to_vec());
    (status, body)
}

/// One notification datagram, as its `KEY=VALUE` lines.
fn recv(rx: &UnixDatagram) -> Vec<String> {
    let mut buf = [0u8; 4096];
    let n = rx
        .recv(&mut buf)
        .expect("a notification within the socket's read timeout");
    String::from_utf8(buf[..n].to_vec())
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

fn value<'a>(msg: &'a [String], key: &str) -> Option<&'a str> {
    msg.iter()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

fn monotonic_usec() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000 + t.tv_nsec as u64 / 1_000
}

/// A served tree: `www/a.txt`; a config on loopback port 0 without TCP control.
fn tree() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    std::fs::write(www.join("a.txt"), b"hello").unwrap();
    let conf = dir.path().join("penstock.toml");
    std::fs::write(
        &conf,
        "[rtsp]\nlisten = \"\"\n[http]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n[control]\nlisten = \"\"\n",
    )
    .unwrap();
    (dir, www, conf)
}

fn serve_cmd(www: &Path, conf: &Path) -> Command {
    let mut c = Command::new(BIN);
    c.args(["serve", "--no-control-unix", "--config"])
        .arg(conf)
        .arg("--root")
        .arg(www)
        .stderr(Stdio::null())
        .env_remove("NOTIFY_SOCKET");
    c
}

#[test]
fn serve_notifies_ready_then_reloading_and_ready_on_sighup_then_stopping_on_sigterm() {
    let (dir, www, conf) = tree();
    let sock = dir.path().join("notify.sock");
    let rx = UnixDatagram::bind(&sock).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let (served, line) = serve(serve_cmd(&www, &conf).env("NOTIFY_SOCKET", &sock));
    let (http, _) = serve_addresses(&line);

    let ready = recv(&rx);
    assert!(ready.contains(&"READY=1".to_string()), "{ready:?}");
    assert_eq!(
        value(&ready, "MAINPID"),
        Some(served.id().to_string().as_str())
    );
    let status = value(&ready, "STATUS").unwrap_or_default();
    assert!(
        status.starts_with(&format!("serving http://{http}")),
        "{status}"
    );
    // Ready means serving.
    assert_eq!(get(&http, "/a.txt"), (200, b"hello".to_vec()));

    // A good reload: RELOADING=1 with the monotonic time of its start, then READY=1.
    std::fs::write(
        &conf,
        "[rtsp]\nlisten = \"\"\n[http]\nlisten = \"127.0.0.1:0\"\n[control]\nlisten = \"\"\n[limits]\nheaders_max = 50\n",
    )
    .unwrap();
    let before = monotonic_usec();
    signal(served.id(), rustix::process::Signal::HUP);
    let reloading = recv(&rx);
    let after = monotonic_usec();
    assert!(
        reloading.contains(&"RELOADING=1".to_string()),
        "{reloading:?}"
    );
    let t: u64 = value(&reloading, "MONOTONIC_USEC")
        .unwrap()
        .parse()
        .unwrap();
    assert!(before <= t && t <= after, "{before} <= {t} <= {after}");
    let ready = recv(&rx);
    assert!(ready.contains(&"READY=1".to_string()), "{ready:?}");
    assert!(
        value(&ready, "STATUS").unwrap().contains("reloaded"),
        "{ready:?}"
    );

    // A refused reload: the same pair, the status says so, the server serves on.
    std::fs::write(&conf, "[limits]\nnot_a_key = 1\n").unwrap();
    signal(served.id(), rustix::process::Signal::HUP);
    assert!(recv(&rx).contains(&"RELOADING=1".to_string()));
    let ready = recv(&rx);
    assert!(ready.contains(&"READY=1".to_string()), "{ready:?}");
    assert!(
        value(&ready, "STATUS").unwrap().contains("reload refused"),
        "{ready:?}"
    );
    assert_eq!(get(&http, "/a.txt").0, 200);

    let pid = served.id();
    let exit = {
        signal(pid, rustix::process::Signal::TERM);
        let stopping = recv(&rx);
        assert!(stopping.contains(&"STOPPING=1".to_string()), "{stopping:?}");
        let mut served = served;
        let c = served.0.take().unwrap();
        c.wait_with_output().unwrap().status
    };
    assert!(exit.success(), "{exit}");
    rx.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 64];
    assert!(rx.recv(&mut buf).is_err(), "a notification after STOPPING");
}

#[test]
fn an_abstract_notify_socket_is_reached_too() {
    let (_dir, www, conf) = tree();
    let name = format!("penstock-test-notify-{}", std::process::id());
    let rx =
        UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let (served, _) = serve(serve_cmd(&www, &conf).env("NOTIFY_SOCKET", format!("@{name}")));
    assert!(recv(&rx).contains(&"READY=1".to_string()));
    let pid = served.id();
    signal(pid, rustix::process::Signal::TERM);
    assert!(recv(&rx).contains(&"STOPPING=1".to_string()));
    let mut served = served;
    assert!(served.0.take().unwrap().wait().unwrap().success());
}

/// The four ids (real, effective, saved, fs) of a status line such as `Uid:`.
fn ids(status: &str, key: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in {status}"))
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// A directory every user may enter (tempdirs are 0700), with a config readable by all.
fn open_tree(conf_text: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    std::fs::set_permissions(&www, std::fs::Permissions::from_mode(0o755)).unwrap();
    let public = www.join("public.txt");
    std::fs::write(&public, b"for everyone").unwrap();
    std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o644)).unwrap();
    let conf = dir.path().join("penstock.toml");
    std::fs::write(&conf, conf_text).unwrap();
    std::fs::set_permissions(&conf, std::fs::Permissions::from_mode(0o644)).unwrap();
    (dir, www, conf)
}

#[test]
fn started_as_root_with_user_nobody_every_thread_runs_as_nobody_and_serves_what_nobody_may_read() {
    // Switching users needs a test run as root.
    if !penstock_testreq::require_root() {
        return;
    }
    // Bodies of 4 MiB and more go through the engine; under /rt/ in the rt class, whose
    // reads would ask for IOPRIO_CLASS_RT, which root may and nobody may not.
    // An origin (docs/origin.md) for paths missing beneath the root: its cache directories
    // are made by root at start and must be nobody's after the switch.
    let origin_object: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let origin_port = range_origin(origin_object.clone());
    let (dir, www, conf) = open_tree(&format!(
        "user = \"nobody\"\n[rtsp]\nlisten = \"\"\n[http]\nlisten = \"127.0.0.1:0\"\nworkers = 2\nbody_path = \"uring\"\n\
         [control]\nlisten = \"\"\n[[location]]\nprefix = \"/rt/\"\nclass = \"rt\"\n\
         [origin]\nurl = \"http://127.0.0.1:{origin_port}\"\ncache_dir = \"CACHE\"\nblock_bytes = \"1MiB\"\n",
    ));
    std::fs::write(
        &conf,
        std::fs::read_to_string(&conf)
            .unwrap()
            .replace("CACHE", &dir.path().join("cache").display().to_string()),
    )
    .unwrap();
    std::fs::create_dir(www.join("rt")).unwrap();
    std::fs::set_permissions(www.join("rt"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let big: Vec<u8> = (0..8u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    std::fs::write(www.join("rt/big.bin"), &big).unwrap();
    std::fs::set_permissions(
        www.join("rt/big.bin"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let secret = www.join("secret.txt");
    std::fs::write(&secret, b"root only").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    // The control socket in a directory of root's, 0700, as the server requires.
    let ctl_dir = dir.path().join("ctl");
    std::fs::create_dir(&ctl_dir).unwrap();
    std::fs::set_permissions(&ctl_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let sock = ctl_dir.join("control.sock");
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--config"])
        .arg(&conf)
        .arg("--root")
        .arg(&www)
        .arg("--control-unix")
        .arg(&sock)
        .stderr(Stdio::null())
        .env_remove("NOTIFY_SOCKET");
    let (served, line) = serve(&mut cmd);
    let (http, _) = serve_addresses(&line);

    // Every thread (HTTP workers, engine workers, control threads, main) switched: real,
    // effective, saved and fs ids; no supplementary group; no capability.
    let mut threads = 0;
    for t in std::fs::read_dir(format!("/proc/{}/task", served.id())).unwrap() {
        let status = std::fs::read_to_string(t.unwrap().path().join("status")).unwrap();
        assert_eq!(ids(&status, "Uid:"), "65534 65534 65534 65534", "{status}");
        assert_eq!(ids(&status, "Gid:"), "65534 65534 65534 65534", "{status}");
        assert_eq!(ids(&status, "Groups:"), "", "{status}");
        assert_eq!(ids(&status, "CapEff:"), "0000000000000000", "{status}");
        threads += 1;
    }
    assert!(
        threads > 2,
        "only {threads} threads: the check would not cover the workers"
    );

    // It reads files as nobody: a public file is served, a root-only one is refused.
    assert_eq!(get(&http, "/public.txt"), (200, b"for everyone".to_vec()));
    assert_eq!(get(&http, "/secret.txt").0, 403);
    // A regression guard: the engine probed the rt I/O priority as root; after the switch
    // the ring refused every rt read with EPERM (a 200 head and no body).
    let (code, body) = get(&http, "/rt/big.bin");
    assert_eq!(code, 200);
    assert!(
        body == big,
        "{} of {} bytes, or other bytes",
        body.len(),
        big.len()
    );

    // Read through the origin as nobody: the blocks are written by nobody into the cache.
    let (code, body) = get(&http, "/from-origin.bin");
    assert_eq!(code, 200);
    assert!(
        body == origin_object,
        "{} bytes from the origin",
        body.len()
    );
    let blocks = dir.path().join("cache/penstock-origin/blocks");
    let owners: Vec<u32> = std::fs::read_dir(&blocks)
        .unwrap()
        .map(|e| std::os::unix::fs::MetadataExt::uid(&e.unwrap().metadata().unwrap()))
        .collect();
    assert_eq!(owners, vec![65534; 3], "three blocks, written by nobody");

    // The control socket, made by root before the switch, still answers root (the user
    // that started the server is its owner and its SO_PEERCRED identity).
    let ctl = Command::new(BIN)
        .args(["ctl", &format!("unix:{}", sock.display()), "STATS"])
        .output()
        .unwrap();
    assert!(
        ctl.status.success(),
        "{}{}",
        String::from_utf8_lossy(&ctl.stdout),
        String::from_utf8_lossy(&ctl.stderr)
    );

    let status = served.stop();
    assert!(status.success(), "{status}");
}

/// An HTTP origin of one object on loopback: every request a range GET answered 206 (what
/// penstock's origin reads ask). Its port; it runs until the test process ends.
fn range_origin(data: Vec<u8>) -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { return };
            let data = data.clone();
            std::thread::spawn(move || {
                let mut w = s.try_clone().unwrap();
                let mut r = BufReader::new(s);
                loop {
                    let mut range = None;
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).unwrap_or(0) == 0 {
                            return;
                        }
                        if h == "\r\n" {
                            break;
                        }
                        if let Some(v) = h.to_ascii_lowercase().strip_prefix("range: bytes=") {
                            let (a, b) = v.trim().split_once('-').unwrap();
                            range =
                                Some((a.parse::<usize>().unwrap(), b.parse::<usize>().unwrap()));
                        }
                    }
                    let (a, b) = range.expect("a range GET");
                    let b = b.min(data.len() - 1);
                    let head = format!(
                        "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {a}-{b}/{}\r\nContent-Length: {}\r\n\r\n",
                        data.len(),
                        b + 1 - a
                    );
                    if w.write_all(head.as_bytes()).is_err() || w.write_all(&data[a..=b]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// `penstock serve` as nobody (setpriv), with `conf`: its output.
fn serve_as_nobody(www: &Path, conf: &Path) -> Option<std::process::Output> {
    // Starting as another user needs a test run as root.
    if !penstock_testreq::require_root() {
        return None;
    }
    let mut c = Command::new("setpriv");
    c.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        BIN,
        "serve",
        "--no-control-unix",
        "--config",
    ])
    .arg(conf)
    .arg("--root")
    .arg(www)
    .env_remove("NOTIFY_SOCKET")
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = Served(Some(c.spawn().unwrap()));
    // A server that starts prints its line and runs until stopped; one that refuses exits.
    let mut out = BufReader::new(child.child().stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    if line.starts_with("penstock serve: http://") {
        let (http, _) = serve_addresses(&line);
        assert_eq!(get(&http, "/public.txt").0, 200);
        let status = child.stop();
        return Some(std::process::Output {
            status,
            stdout: line.into_bytes(),
            stderr: Vec::new(),
        });
    }
    let mut c = child.0.take().unwrap();
    let status = c.wait().unwrap();
    let mut stderr = Vec::new();
    c.stderr.take().unwrap().read_to_end(&mut stderr).unwrap();
    Some(std::process::Output {
        status,
        stdout: line.into_bytes(),
        stderr,
    })
}

#[test]
fn started_as_another_user_than_the_configured_one_it_refuses_before_binding() {
    let text = "user = \"daemon\"\n[rtsp]\nlisten = \"\"\n[http]\nlisten = \"127.0.0.1:0\"\n[control]\nlisten = \"\"\n";
    let (_dir, www, conf) = open_tree(text);
    let Some(o) = serve_as_nobody(&www, &conf) else {
        return;
    };
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        o.stdout.is_empty(),
        "it bound and printed {:?}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(
        err.contains("user daemon") && err.contains("start"),
        "{err}"
    );
}

#[test]
fn started_as_the_configured_user_it_runs_unchanged() {
    let text = "user = \"nobody\"\n[rtsp]\nlisten = \"\"\n[http]\nlisten = \"127.0.0.1:0\"\n[control]\nlisten = \"\"\n";
    let (_dir, www, conf) = open_tree(text);
    let Some(o) = serve_as_nobody(&www, &conf) else {
        return;
    };
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn started_as_the_configured_user_in_another_group_it_refuses_before_binding() {
    let text = "user = \"nobody\"\ngroup = \"daemon\"\n[rtsp]\nlisten = \"\"\n[http]\nlisten = \"127.0.0.1:0\"\n\
                [control]\nlisten = \"\"\n";
    let (_dir, www, conf) = open_tree(text);
    let Some(o) = serve_as_nobody(&www, &conf) else {
        return;
    };
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        o.stdout.is_empty(),
        "it bound and printed {:?}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(err.contains("not the configured group daemon"), "{err}");
}

#[test]
fn an_unknown_user_refuses_the_start() {
    let text = "user = \"no-such-user-penstock\"\n[rtsp]\nlisten = \"\"\n[http]\nlisten = \"127.0.0.1:0\"\n[control]\nlisten = \"\"\n";
    let (_dir, www, conf) = open_tree(text);
    let o = serve_cmd(&www, &conf)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(o.stdout.is_empty());
    assert!(err.contains("no such user"), "{err}");
}

#[test]
fn systemd_analyze_verify_accepts_the_service_and_socket_units() {
    if !penstock_testreq::require("systemd-analyze") {
        return;
    }
    let analyze = "systemd-analyze";
    let d = tempfile::Builder::new()
        .prefix("penstock-units")
        .tempdir()
        .unwrap();
    let units = repo().join("deploy/systemd");
    // verify checks that ExecStart's program exists: point it at the one just built.
    let service = std::fs::read_to_string(units.join("penstock.service")).unwrap();
    assert!(service.contains("ExecStart=/usr/local/bin/penstock serve"));
    assert!(service.contains("Type=notify"));
    std::fs::write(
        d.path().join("penstock.service"),
        service.replace("/usr/local/bin/penstock", BIN),
    )
    .unwrap();
    std::fs::copy(
        units.join("penstock.socket"),
        d.path().join("penstock.socket"),
    )
    .unwrap();
    // verify also checks Documentation=man:penstock-serve(1): the pages `penstock man` makes.
    let man1 = d.path().join("man/man1");
    std::fs::create_dir_all(&man1).unwrap();
    assert!(
        Command::new(BIN)
            .args(["man", "--dir"])
            .arg(&man1)
            .status()
            .unwrap()
            .success()
    );
    let o = Command::new(analyze)
        .arg("verify")
        .arg(d.path().join("penstock.service"))
        .arg(d.path().join("penstock.socket"))
        .env("MANPATH", d.path().join("man"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    // verify exits 0 on unknown keys and bad values too, and says so on stderr.
    let about_ours: Vec<&str> = err.lines().filter(|l| l.contains("penstock")).collect();
    assert!(o.status.success() && about_ours.is_empty(), "{err}");
}

#[test]
fn the_deploy_configuration_is_a_valid_configuration() {
    let c = penstock_server::ServerConfig::load(&repo().join("deploy/penstock.toml")).unwrap();
    c.check().unwrap();
    assert_eq!(c.user.as_deref(), Some("penstock"));
    assert_eq!(
        c.control.unix.as_deref(),
        Some(Path::new("/run/penstock/control.sock"))
    );
}

/// The Debian package's conffile (deploy/debian/penstock.toml; the package itself is built,
/// installed and purged by the CI step .ci/deb, docs/packaging.md).
#[test]
fn the_debian_package_configuration_is_a_valid_configuration() {
    let c =
        penstock_server::ServerConfig::load(&repo().join("deploy/debian/penstock.toml")).unwrap();
    c.check().unwrap();
    assert_eq!(c.user.as_deref(), Some("penstock"));
    assert_eq!(
        c.control.unix.as_deref(),
        Some(Path::new("/run/penstock/control.sock"))
    );
    // No TCP control port: it would need a token the package cannot choose.
    assert!(c.control.listen.is_empty());
    // The unit's CacheDirectory= (deploy/systemd/penstock.service).
    let unit = std::fs::read_to_string(repo().join("deploy/systemd/penstock.service")).unwrap();
    assert!(unit.contains("\nCacheDirectory=penstock\n"));
    assert_eq!(
        c.admission.calibration_cache_dir.as_deref(),
        Some(Path::new("/var/cache/penstock"))
    );
}

#[test]
fn completions_for_bash_zsh_and_fish_name_the_subcommands() {
    for shell in ["bash", "zsh", "fish"] {
        let o = Command::new(BIN)
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(o.status.success(), "{shell}");
        let script = String::from_utf8(o.stdout).unwrap();
        for sub in ["serve", "stream", "ctl", "volume", "completions", "man"] {
            assert!(script.contains(sub), "{shell} completions lack {sub}");
        }
        // The script parses in its shell (bash, zsh and fish: `.ci/run` installs them).
        let check: &[&str] = match shell {
            "bash" => &["bash", "-n"],
            "zsh" => &["zsh", "-n"],
            _ => &["fish", "--no-execute"],
        };
        if !penstock_testreq::require(check[0]) {
            continue;
        }
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), &script).unwrap();
        match Command::new(check[0])
            .args(&check[1..])
            .arg(f.path())
            .output()
        {
            Ok(o) => assert!(
                o.status.success(),
                "{shell} -n: {}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => panic!("{shell}: {e}"),
        }
    }
    let o = Command::new(BIN)
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn the_man_page_renders_and_names_the_subcommands() {
    let o = Command::new(BIN).arg("man").output().unwrap();
    assert!(o.status.success());
    let page = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(page.path(), &o.stdout).unwrap();
    // groff with every warning on: none.
    let g = Command::new("groff")
        .args(["-man", "-Tutf8", "-ww", "-P-cbou"])
        .arg(page.path())
        .output();
    let text = match g {
        Ok(g) => {
            assert!(
                g.status.success() && g.stderr.is_empty(),
                "{}",
                String::from_utf8_lossy(&g.stderr)
            );
            String::from_utf8_lossy(&g.stdout).to_string()
        }
        Err(e) => {
            // The roff source alone is checked without groff.
            penstock_testreq::require_that("groff", Some(e.to_string()));
            String::from_utf8_lossy(&o.stdout).to_string()
        }
    };
    for s in [
        "NAME",
        "SYNOPSIS",
        "penstock-serve",
        "penstock-completions",
        "penstock-man",
    ] {
        assert!(text.contains(s), "the man page lacks {s}:\n{text}");
    }
    // man -l formats the same file (when man is installed).
    if let Ok(m) = Command::new("man")
        .arg("-l")
        .arg(page.path())
        .env("MANPAGER", "cat")
        .env("MANWIDTH", "80")
        .output()
    {
        assert!(m.status.success());
        assert!(String::from_utf8_lossy(&m.stdout).contains("penstock-serve(1)"));
    }
    // --dir: one page per command, the hidden `hog` left out.
    let d = tempfile::tempdir().unwrap();
    assert!(
        Command::new(BIN)
            .args(["man", "--dir"])
            .arg(d.path())
            .status()
            .unwrap()
            .success()
    );
    for p in [
        "penstock.1",
        "penstock-serve.1",
        "penstock-bench-http.1",
        "penstock-volume-create.1",
    ] {
        assert!(d.path().join(p).is_file(), "{p}");
    }
    assert!(!d.path().join("penstock-hog.1").exists());
}
