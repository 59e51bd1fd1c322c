//! Live tuning over the control protocol of a real `penstock serve` (issue 16): `TUNE disk`
//! allowed (the token; the server's own uid) and refused (an allowed Unix peer that is not
//! the server's uid, as `nobody` via `setpriv`; an anonymous TCP peer), `[disk]` applied at
//! start and by SIGHUP, `STATE`'s plan, rate and lateness fields, and `START id AT time`
//! with a late-unit policy. Waits are bounded loops; no absolute time is asserted.

mod common;

use common::{serve_addresses, start_line};

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const TOKEN: &str = "tuning-test-token-0123456789";
const NOBODY: u32 = 65534;
const UNIT: u64 = 1316;

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

struct Tree {
    _d: tempfile::TempDir,
    dir: PathBuf,
    conf: PathBuf,
    sock: PathBuf,
    src: PathBuf,
}

/// The server's configuration: `disk` is the `[disk]` table's body.
fn config(t: &Tree, disk: &str) -> String {
    format!(
        "[rtsp]\nlisten = \"\"\n[http]\nlisten = \"127.0.0.1:0\"\nworkers = 1\n\
         [control]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n\
         unix_allow_uids = [0, {NOBODY}]\n\
         read_roots = [\"{dir}\"]\nwrite_roots = [\"{dir}\"]\n\
         [engine]\nworkers = 1\n[disk]\n{disk}\n",
        dir = t.dir.display()
    )
}

fn tree() -> Tree {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().to_path_buf();
    // nobody must reach the Unix socket through the directories.
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let src = dir.join("units.bin");
    let bytes: Vec<u8> = (0..400 * UNIT).map(|i| (i % 251) as u8).collect();
    std::fs::write(&src, bytes).unwrap();
    Tree {
        conf: dir.join("penstock.toml"),
        sock: dir.join("control.sock"),
        src,
        dir,
        _d: d,
    }
}

fn serve(t: &Tree) -> Served {
    let mut child = Command::new(env!("CARGO_BIN_EXE_penstock"))
        .args(["serve", "--config"])
        .arg(&t.conf)
        .arg("--root")
        .arg(&t.dir)
        .arg("--control-unix")
        .arg(&t.sock)
        .stdout(Stdio::piped())
        // Its log, for the tests that wait for a line of it.
        .stderr(std::fs::File::create(t.conf.with_file_name("serve.stderr")).unwrap())
        .spawn()
        .unwrap();
    let line = start_line(&mut child);
    let (_, control) = serve_addresses(&line);
    Served {
        child,
        control: control.expect("a control address"),
    }
}

/// A TCP control connection; `cmd` returns the whole reply's text, lines joined by `\n`.
struct Ctl {
    r: BufReader<TcpStream>,
}

impl Ctl {
    fn connect(addr: &str) -> Ctl {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        Ctl {
            r: BufReader::new(s),
        }
    }

    fn authed(addr: &str) -> Ctl {
        let mut c = Ctl::connect(addr);
        assert!(c.cmd(&format!("AUTH {TOKEN}")).starts_with("200"));
        c
    }

    fn cmd(&mut self, line: &str) -> String {
        self.r
            .get_mut()
            .write_all(format!("{line}\n").as_bytes())
            .unwrap();
        let mut all = Vec::new();
        loop {
            let mut l = String::new();
            assert!(self.r.read_line(&mut l).unwrap() > 0, "closed on {line}");
            let l = l.trim_end().to_string();
            let last = l.as_bytes().get(3) != Some(&b'-');
            all.push(l);
            if last {
                return all.join("\n");
            }
        }
    }

    /// `STATE id` until the stream is no longer pending, starting or running (bounded).
    fn wait_ended(&mut self, id: &str) -> String {
        for _ in 0..3000 {
            let st = self.cmd(&format!("STATE {id}"));
            if st.contains(" done ") || st.contains(" failed ") {
                return st;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("stream {id} did not end");
    }
}

fn field(text: &str, key: &str) -> Option<u64> {
    text.split([' ', '\n']).find_map(|w| {
        w.strip_prefix(&format!("{key}="))
            .and_then(|v| v.parse().ok())
    })
}

fn stat(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        l.get(4..)?
            .strip_prefix(key)?
            .strip_prefix(' ')?
            .parse()
            .ok()
    })
}

/// `penstock ctl` over the Unix socket as `nobody`: an allowed peer (unix_allow_uids), not
/// the server's uid.
fn ctl_as_nobody(sock: &Path, lines: &[&str]) -> String {
    let o = Command::new("setpriv")
        .args([
            &format!("--reuid={NOBODY}"),
            &format!("--regid={NOBODY}"),
            "--clear-groups",
            env!("CARGO_BIN_EXE_penstock"),
            "ctl",
        ])
        .arg(format!("unix:{}", sock.display()))
        .env_remove("PENSTOCK_TOKEN")
        .env("HOME", "/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            let mut input = lines.join("\n");
            input.push('\n');
            c.stdin.take().unwrap().write_all(input.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr)
}

#[test]
fn tune_disk_is_the_operators_and_a_reload_sets_it_back() {
    let t = tree();
    std::fs::write(&t.conf, config(&t, "rt_quantum_bytes = 8388608")).unwrap();
    let s = serve(&t);
    let mut op = Ctl::authed(&s.control);

    // [disk] applied at start.
    let st = op.cmd("STATS");
    assert_eq!(stat(&st, "disk_rt_quantum_bytes"), Some(8 << 20), "{st}");
    assert_eq!(stat(&st, "disk_bulk_quantum_bytes"), Some(1 << 20), "{st}");
    assert_eq!(stat(&st, "disk_inflight_max"), Some(8), "{st}");

    // The token may change it; the reply says what is in force.
    let r = op.cmd("TUNE disk rt_quantum=2MiB bulk_quantum=6MiB inflight=3");
    assert_eq!(
        r,
        "200 disk rt_quantum=2097152 bulk_quantum=6291456 inflight=3"
    );
    assert_eq!(op.cmd("TUNE disk"), r, "a query reports the same");
    // Bad values: a clear error, nothing changed.
    let bad = op.cmd("TUNE disk rt_quantum=64KiB inflight=1");
    assert!(
        bad.starts_with("400 ") && bad.contains("below the largest request"),
        "{bad}"
    );
    assert!(op.cmd("TUNE disk inflight=0").starts_with("400 "));
    assert!(op.cmd("TUNE disk inflight=5000").starts_with("400 "));
    assert_eq!(op.cmd("TUNE disk"), r);

    // Anonymous TCP peers: nothing but AUTH.
    let mut anon = Ctl::connect(&s.control);
    assert!(anon.cmd("TUNE disk inflight=1").starts_with("401 "));

    // The refused-peer half runs a client as nobody: root and setpriv.
    if penstock_testreq::require_root() && penstock_testreq::require("setpriv") {
        // nobody is an allowed Unix peer (it may open streams) but not the operator: a
        // change is refused with the reason, a query answered.
        let out = ctl_as_nobody(&t.sock, &["TUNE disk inflight=1", "TUNE disk"]);
        assert!(
            out.contains("403 TUNE changes the disk scheduler of every stream"),
            "{out}"
        );
        assert!(out.contains(&r), "{out}");
    }
    assert_eq!(op.cmd("TUNE disk"), r, "the refused change changed nothing");

    // The server's own uid on the Unix socket is the operator too.
    let mut own = std::os::unix::net::UnixStream::connect(&t.sock).unwrap();
    own.write_all(b"TUNE disk inflight=4\nQUIT\n").unwrap();
    let mut reply = String::new();
    std::io::Read::read_to_string(&mut own, &mut reply).unwrap();
    assert!(
        reply.starts_with("200 disk rt_quantum=2097152 bulk_quantum=6291456 inflight=4"),
        "{reply}"
    );

    // SIGHUP applies the file again: the TUNE is undone, a removed key is the default.
    std::fs::write(&t.conf, config(&t, "bulk_quantum_bytes = 2097152")).unwrap();
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&s.child),
        rustix::process::Signal::HUP,
    )
    .unwrap();
    let want = "200 disk rt_quantum=4194304 bulk_quantum=2097152 inflight=8";
    let mut now = String::new();
    for _ in 0..500 {
        now = op.cmd("TUNE disk");
        if now == want {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(now, want);

    // A reload with a bad [disk] is refused whole: the running settings stay.
    std::fs::write(&t.conf, config(&t, "inflight_max = 0")).unwrap();
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&s.child),
        rustix::process::Signal::HUP,
    )
    .unwrap();
    // The event, not a fixed wait: the server logged the refusal.
    let log = t.conf.with_file_name("serve.stderr");
    let t0 = std::time::Instant::now();
    while !std::fs::read_to_string(&log).is_ok_and(|l| l.contains("reload refused")) {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no reload refusal logged"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(op.cmd("TUNE disk"), want);
}

#[test]
fn state_reports_plan_rate_and_lateness_and_start_at_anchors_the_schedule() {
    let t = tree();
    std::fs::write(&t.conf, config(&t, "")).unwrap();
    let s = serve(&t);
    let mut c = Ctl::authed(&s.control);
    let open = |c: &mut Ctl, name: &str, units: u64, extra: &str| -> String {
        let r = c.cmd(&format!(
            "OPEN file:{} file:{} unit={UNIT} length={} {extra}",
            t.src.display(),
            t.dir.join(name).display(),
            units * UNIT
        ));
        assert!(r.starts_with("201 "), "{r}");
        r[4..].split(' ').next().unwrap().to_string()
    };

    // A paced stream, started now: the plan, then the measured rate and lateness.
    let id = open(&mut c, "a.out", 100, "rate=200/s");
    let st = c.cmd(&format!("STATE {id}"));
    assert!(st.contains(" pending "), "{st}");
    assert_eq!(field(&st, "unit"), Some(UNIT), "{st}");
    assert_eq!(field(&st, "plan_bytes_per_s"), Some(200 * UNIT), "{st}");
    assert_eq!(field(&st, "period_ns"), Some(5_000_000), "{st}");
    assert_eq!(field(&st, "rate_bytes_per_s"), None, "not started: {st}");
    assert!(c.cmd(&format!("START {id}")).starts_with("200 started"));
    let st = c.wait_ended(&id);
    assert!(st.contains(" done "), "{st}");
    assert_eq!(field(&st, "sent"), Some(100 * UNIT), "{st}");
    // 100 units at 200/s take about half a second: paced, the measured rate is not above
    // twice the plan (late units sent together after a stall can raise it above the plan).
    // No lower bound: a slow machine lowers it, and that is no failure of pacing.
    let rate = field(&st, "rate_bytes_per_s").unwrap();
    assert!(
        rate > 0 && rate < 200 * UNIT * 2,
        "measured {rate} B/s for a plan of {} B/s",
        200 * UNIT
    );
    for key in [
        "late_p50_ns",
        "late_p99_ns",
        "late_max_ns",
        "misses",
        "skipped",
    ] {
        assert!(field(&st, key).is_some(), "{key} missing: {st}");
    }
    assert!(
        field(&st, "late_p50_ns") <= field(&st, "late_max_ns"),
        "{st}"
    );
    assert_eq!(field(&st, "skipped"), Some(0), "{st}");

    // START AT a wall-clock time half a second ago with late=skip: the units due more than
    // one period before the start are skipped, as after a stall — so the time reached the
    // engine's schedule — and the rest are sent on it.
    let id = open(&mut c, "b.out", 200, "rate=200/s late=skip");
    let past = std::time::SystemTime::now() - Duration::from_millis(500);
    let at = humantime::format_rfc3339_nanos(past).to_string();
    let r = c.cmd(&format!("START {id} AT {at}"));
    assert!(r.starts_with("200 started") && r.contains("ms ago"), "{r}");
    let st = c.wait_ended(&id);
    assert!(st.contains(" done ") && st.contains(" late=skip"), "{st}");
    let skipped = field(&st, "skipped").unwrap();
    // 500 ms at 5 ms per unit: at least 98 units were over one period late when the line
    // was read (more, up to all 200, if a loaded server was slow to start the stream).
    assert!((98..=200).contains(&skipped), "{skipped} skipped: {st}");
    assert_eq!(
        field(&st, "sent").unwrap() + skipped * UNIT,
        200 * UNIT,
        "{st}"
    );
    assert_eq!(field(&st, "offset"), Some(200 * UNIT), "{st}");
    assert_eq!(
        std::fs::metadata(t.dir.join("b.out")).unwrap().len(),
        field(&st, "sent").unwrap()
    );

    // START AT +DURATION ahead: taken, with the time left in the reply.
    let id = open(&mut c, "c.out", 20, "rate=200/s");
    let r = c.cmd(&format!("START {id} AT +300ms"));
    assert!(
        r.starts_with("200 started") && r.contains("due in 3"),
        "{r}"
    );
    assert!(c.wait_ended(&id).contains(" done "));

    // Refusals: clear, and the stream stays pending.
    let id = open(&mut c, "d.out", 20, "rate=200/s");
    let far = humantime::format_rfc3339(std::time::SystemTime::now() + Duration::from_secs(7200));
    let long_ago =
        humantime::format_rfc3339(std::time::SystemTime::now() - Duration::from_secs(10));
    for (at, why) in [
        (far.to_string(), "start_at_ahead_max_ms"),
        (long_ago.to_string(), "start_at_late_max_ms"),
        ("+2h".to_string(), "start_at_ahead_max_ms"),
        ("noon".to_string(), "RFC 3339"),
    ] {
        let r = c.cmd(&format!("START {id} AT {at}"));
        assert!(r.starts_with("400 ") && r.contains(why), "{at}: {r}");
    }
    assert!(c.cmd(&format!("STATE {id}")).contains(" pending "));
    let burst = open(&mut c, "e.out", 20, "");
    let r = c.cmd(&format!("START {burst} AT +1s"));
    assert!(r.starts_with("400 ") && r.contains("paced stream"), "{r}");
    let r = c.cmd(&format!(
        "OPEN file:{} file:{} late=skip",
        t.src.display(),
        t.dir.join("f.out").display()
    ));
    assert!(
        r.starts_with("400 ") && r.contains("late=skip needs"),
        "{r}"
    );
}
