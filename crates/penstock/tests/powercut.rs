//! Power cuts (issue 31 item 3): the real `penstock` binary runs on a crashfs mount
//! (`crates/crashfs`: a FUSE pass-through that keeps every write not yet fsynced in memory
//! and loses it at a cut, names included unless their directory was fsynced); the power is
//! cut just before the k-th mutating request (write, truncation, fsync, name change) — k
//! chosen by a seeded RNG, stratified over the whole range a run without a cut counts — and
//! the process is killed with SIGKILL. Then the file system is mounted again ("reboot") and:
//!
//! - `volume check` is clean, or reports only repairable problems and `check --repair`
//!   leaves it clean (check reads every block checksum of every copy);
//! - everything a command acknowledged is there and exact: a command that exited 0
//!   (`created partition …`, a stream into a partition, a truncation, a removal, a member
//!   replaced, a rebuild), and a recording's last `synced packets=N …` line (every packet up
//!   to N readable and byte-exact, `tracks --check` clean).
//!
//! Workloads: volume metadata and growth (create, add-partition, import, a stream growing a
//! partition, truncate, rm), mirroring (create --mirror 2 over two mounts = two devices,
//! import, replace, check --repair's rebuild), and the recorder with its three tracks, into
//! a file and into a growing volume partition, and writes through `penstock volume mount`
//! (the volume's members on crashfs; a file written through the mount in chunks, each
//! fsynced: every byte before a successful fsync is acknowledged).
//!
//! `PENSTOCK_POWERCUT_POINTS` (default 200) is the total number of cut points over the five
//! workloads; `PENSTOCK_POWERCUT_SEED` replays a run (every failure names its seed and k).
//! Needs FUSE, root and io_uring. No test asserts a duration.

use std::io::{BufRead, BufReader, Read};
use std::net::UdpSocket;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use penstock_crashfs::{CrashFs, Power};

const BIN: &str = env!("CARGO_BIN_EXE_penstock");
/// How long one command may take before the test gives up on it (a test bound, not a
/// timing assertion).
const STEP_WAIT: Duration = Duration::from_secs(120);

/// xorshift64*, so that a run replays from its seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn data(len: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&r.next().to_le_bytes());
    }
    out.truncate(len);
    out
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

fn requirements() -> bool {
    penstock_testreq::require_root()
        && penstock_testreq::require_fuse()
        && penstock_testreq::require_io_uring()
}

/// The seed of this run (printed; `PENSTOCK_POWERCUT_SEED` replays one).
fn seed() -> u64 {
    let seed = std::env::var("PENSTOCK_POWERCUT_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    eprintln!("PENSTOCK_POWERCUT_SEED={seed}");
    seed
}

/// This workload's share (in percent) of `PENSTOCK_POWERCUT_POINTS` (default 200).
fn points(percent: u64) -> u64 {
    let total: u64 = std::env::var("PENSTOCK_POWERCUT_POINTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    (total * percent).div_ceil(100).max(1)
}

/// The cut points: `n` values of k in 1..=ops+1, one drawn in each of `n` equal strata (so
/// the whole sequence is covered, its end and "after the last request" included).
fn cut_points(rng: &mut Rng, ops: u64, n: u64) -> Vec<u64> {
    let span = ops + 1;
    (0..n)
        .map(|i| {
            let lo = i * span / n;
            let hi = ((i + 1) * span / n).max(lo + 1);
            1 + lo + rng.below(hi - lo)
        })
        .collect()
}

/// Directories on crashfs mounts ("devices": each mount has its own st_dev), one power
/// supply for all of them.
struct Machine {
    backings: Vec<tempfile::TempDir>,
    mnts: Vec<tempfile::TempDir>,
    mounts: Vec<CrashFs>,
    power: Power,
    /// Files outside the crashing mounts (sources, exports).
    scratch: tempfile::TempDir,
}

impl Machine {
    fn new(devices: usize) -> Machine {
        let backings: Vec<_> = (0..devices)
            .map(|_| tempfile::tempdir().expect("backing"))
            .collect();
        let mnts: Vec<_> = (0..devices)
            .map(|_| tempfile::tempdir().expect("mount point"))
            .collect();
        let mut m = Machine {
            backings,
            mnts,
            mounts: Vec::new(),
            power: Power::new(),
            scratch: tempfile::tempdir().expect("scratch"),
        };
        m.boot();
        m
    }

    fn boot(&mut self) {
        self.power = Power::new();
        for (b, d) in self.backings.iter().zip(&self.mnts) {
            self.mounts
                .push(CrashFs::mount(b.path(), d.path(), &self.power).expect("mount crashfs"));
        }
    }

    fn dev(&self, i: usize) -> &Path {
        self.mnts[i].path()
    }

    /// The cut: every mount loses what was not durable; then the "reboot".
    fn crash_and_reboot(&mut self) {
        self.power.cut();
        for m in self.mounts.drain(..) {
            m.crash().expect("crash");
        }
        self.boot();
    }

    fn shutdown(mut self) {
        for m in self.mounts.drain(..) {
            m.unmount().expect("unmount");
        }
    }
}

/// A command's end: whether it exited 0 (its acknowledgement), and what it printed.
struct Ran {
    acked: bool,
    stdout: String,
    stderr: String,
}

fn spawn(args: &[&str]) -> Child {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start penstock")
}

fn drain(mut r: impl Read + Send + 'static) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

/// Waits for `child`; once the power is off, kills it (SIGKILL). `acked`: it exited 0.
fn finish(mut child: Child, power: &Power) -> (ExitStatus, bool) {
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            return (st, st.success());
        }
        if power.is_cut() {
            let _ = child.kill();
            let st = child.wait().expect("wait");
            return (st, false);
        }
        assert!(t0.elapsed() < STEP_WAIT, "a command did not end");
        thread::sleep(Duration::from_millis(2));
    }
}

/// Runs one command on the machine; `None` when the power was already off (not started).
fn step(m: &Machine, args: &[&str]) -> Option<Ran> {
    if m.power.is_cut() {
        return None;
    }
    let mut child = spawn(args);
    let out = drain(child.stdout.take().expect("stdout"));
    let err = drain(child.stderr.take().expect("stderr"));
    let (_, acked) = finish(child, &m.power);
    Some(Ran {
        acked,
        stdout: out.join().expect("stdout"),
        stderr: err.join().expect("stderr"),
    })
}

/// A command that must succeed (after the reboot).
#[track_caller]
fn ok(args: &[&str], ctx: &str) -> String {
    let o = Command::new(BIN).args(args).output().expect("run penstock");
    assert!(
        o.status.success(),
        "{ctx}: penstock {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `volume check`, and `check --repair` when it reports only repairable problems: clean
/// afterwards. Returns whether a repair was needed.
#[track_caller]
fn check_or_repair(member: &Path, ctx: &str) -> bool {
    let o = Command::new(BIN)
        .args(["volume", "check", s(member)])
        .output()
        .expect("run penstock");
    if o.status.success() {
        return false;
    }
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("all repairable"),
        "{ctx}: volume check found problems that are not repairable:\n{}\n{err}",
        String::from_utf8_lossy(&o.stdout)
    );
    let fixed = ok(&["volume", "check", "--repair", s(member)], ctx);
    ok(
        &["volume", "check", s(member)],
        &format!("{ctx}\nafter check --repair, which said:\n{fixed}"),
    );
    true
}

fn size_of(ls: &str, name: &str) -> Option<u64> {
    let prefix = format!("partition {name} ");
    ls.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
}

fn export(m: &Machine, member: &Path, name: &str, ctx: &str) -> Vec<u8> {
    let out = m.scratch.path().join(format!("{name}.out"));
    ok(&["volume", "export", s(member), name, s(&out)], ctx);
    std::fs::read(&out).expect("read export")
}

thread_local! {
    /// Cut points of this test (its own thread) with acknowledged synced data (a recording's
    /// sync point, an fsync through the FUSE mount).
    static SYNCED_POINTS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Runs `workload` once without a cut to count its requests, then once per cut point.
fn campaign(
    label: &str,
    percent: u64,
    devices: usize,
    workload: &dyn Fn(&mut Machine, &mut Rng, &str) -> Vec<bool>,
    verify: &dyn Fn(&Machine, &[bool], &str),
) {
    if !requirements() {
        return;
    }
    let seed = seed();
    let mut rng = Rng::new(seed);
    // The run without a cut: every step acknowledged, all of it kept.
    let mut m = Machine::new(devices);
    let ctx = format!("{label} seed {seed}, no cut");
    let acks = workload(&mut m, &mut Rng::new(seed), &ctx);
    let counts = m.power.counts();
    assert!(
        acks.iter().all(|&a| a),
        "{ctx}: a step failed without a cut: {acks:?}"
    );
    m.crash_and_reboot();
    verify(&m, &acks, &ctx);
    m.shutdown();
    let n = points(percent);
    eprintln!("{label}: {counts:?} without a cut; {n} cut points");
    let mut acked_steps = 0;
    for (i, k) in cut_points(&mut rng, counts.ops, n).into_iter().enumerate() {
        let mut m = Machine::new(devices);
        m.power.cut_before(k);
        let ctx = format!("{label} seed {seed} point {i}: cut before request {k}");
        let acks = workload(&mut m, &mut Rng::new(seed ^ k), &ctx);
        acked_steps += acks.iter().filter(|&&a| a).count();
        m.crash_and_reboot();
        verify(&m, &acks, &ctx);
        m.shutdown();
    }
    eprintln!(
        "{label}: {n} cut points passed ({acked_steps} commands that exited 0 checked; \
         {} runs with acknowledged synced data checked: a sync point or an fsync)",
        SYNCED_POINTS.get()
    );
}

// ---- volume metadata and growth ---------------------------------------------------------

const CLIP_BYTES: usize = 200 * 1024 + 123;
const GROWN_BYTES: usize = 300 * 1024 + 77;
const CUT_TO: usize = 100_000;

fn volume_workload(m: &mut Machine, _rng: &mut Rng, _ctx: &str) -> Vec<bool> {
    let a = m.dev(0).join("a");
    let b = m.dev(0).join("b");
    let clip = m.scratch.path().join("clip.in");
    let grown = m.scratch.path().join("grown.in");
    std::fs::write(&clip, data(CLIP_BYTES, 1)).expect("source");
    std::fs::write(&grown, data(GROWN_BYTES, 2)).expect("source");
    let target = format!("vol:{}/p1", s(&a));
    let cut_to = CUT_TO.to_string();
    let steps: Vec<Vec<&str>> = vec![
        vec![
            "volume",
            "create",
            "v",
            "--member",
            s(&a),
            "--member",
            s(&b),
            "--member-size",
            "4MiB",
            "--block",
            "64KiB",
        ],
        vec!["volume", "add-partition", s(&a), "p1"],
        vec!["volume", "import", s(&b), "clip", s(&clip)],
        vec!["stream", s(&grown), &target],
        vec!["volume", "truncate", s(&a), "p1", &cut_to],
        vec!["volume", "rm", s(&b), "clip"],
    ];
    let mut acks = Vec::new();
    for args in &steps {
        match step(m, args) {
            Some(r) => {
                if !r.acked && !m.power.is_cut() {
                    panic!(
                        "penstock {args:?} failed with the power on:\n{}\n{}",
                        r.stdout, r.stderr
                    );
                }
                acks.push(r.acked);
            }
            None => break,
        }
    }
    acks
}

fn volume_verify(m: &Machine, acks: &[bool], ctx: &str) {
    let acked = |i: usize| acks.get(i).copied().unwrap_or(false);
    let a = m.dev(0).join("a");
    if !acked(0) {
        // create was never reported: the members may hold no whole volume (refused when
        // opened) or a whole one; nothing else ran.
        return;
    }
    let repaired = check_or_repair(&a, ctx);
    let ls = ok(&["volume", "ls", s(&a)], ctx);
    let ctx = format!("{ctx} (repaired: {repaired})\n{ls}");
    let grown = data(GROWN_BYTES, 2);
    match size_of(&ls, "p1") {
        None => assert!(
            !acked(1),
            "{ctx}: add-partition p1 was reported, p1 is gone"
        ),
        Some(size) => {
            let back = export(m, &a, "p1", &ctx);
            assert_eq!(back.len() as u64, size, "{ctx}");
            assert!(
                back[..] == grown[..back.len().min(grown.len())] && back.len() <= grown.len(),
                "{ctx}: p1's {size} committed bytes are not the stream's"
            );
            // A step cut short leaves the size before or after it (the size is one commit).
            let started = |i: usize| acks.len() > i;
            let allowed: &[usize] = if acked(4) {
                &[CUT_TO]
            } else if acked(3) && started(4) {
                &[GROWN_BYTES, CUT_TO]
            } else if acked(3) {
                &[GROWN_BYTES]
            } else if started(3) {
                &[0, GROWN_BYTES]
            } else {
                &[0]
            };
            assert!(
                allowed.contains(&back.len()),
                "{ctx}: p1 has {} bytes, not one of {allowed:?}",
                back.len()
            );
        }
    }
    match size_of(&ls, "clip") {
        None => assert!(
            !acked(2) || acks.len() > 5,
            "{ctx}: import of clip was reported (`created partition`), clip is gone"
        ),
        Some(_) => {
            assert!(
                !acked(5),
                "{ctx}: rm clip was reported, clip is still there"
            );
            let back = export(m, &a, "clip", &ctx);
            assert!(back == data(CLIP_BYTES, 1), "{ctx}: clip differs");
        }
    }
}

#[test]
fn power_cuts_during_volume_updates_and_growth_keep_every_acknowledged_byte() {
    campaign("volume", 25, 1, &volume_workload, &volume_verify);
}

// ---- mirroring --------------------------------------------------------------------------

fn mirror_workload(m: &mut Machine, _rng: &mut Rng, _ctx: &str) -> Vec<bool> {
    let a = m.dev(0).join("a");
    let b = m.dev(1).join("b");
    let c = m.dev(1).join("c");
    let clip = m.scratch.path().join("clip.in");
    std::fs::write(&clip, data(CLIP_BYTES, 3)).expect("source");
    let steps: Vec<Vec<&str>> = vec![
        vec![
            "volume",
            "create",
            "mv",
            "--mirror",
            "2",
            "--member",
            s(&a),
            "--member",
            s(&b),
            "--member-size",
            "4MiB",
            "--block",
            "64KiB",
        ],
        vec!["volume", "import", s(&a), "clip", s(&clip)],
        vec!["volume", "replace", s(&a), "1", s(&c)],
        vec!["volume", "check", "--repair", s(&a)],
    ];
    let mut acks = Vec::new();
    for args in &steps {
        match step(m, args) {
            Some(r) => {
                if !r.acked && !m.power.is_cut() {
                    panic!(
                        "penstock {args:?} failed with the power on:\n{}\n{}",
                        r.stdout, r.stderr
                    );
                }
                acks.push(r.acked);
            }
            None => break,
        }
    }
    acks
}

fn mirror_verify(m: &Machine, acks: &[bool], ctx: &str) {
    let acked = |i: usize| acks.get(i).copied().unwrap_or(false);
    let a = m.dev(0).join("a");
    if !acked(0) {
        return;
    }
    if acked(3) {
        // The rebuild was reported done: the mirror is whole without any repair.
        let o = Command::new(BIN)
            .args(["volume", "check", s(&a)])
            .output()
            .expect("run penstock");
        assert!(
            o.status.success(),
            "{ctx}: check --repair had reported the mirror rebuilt; after the cut:\n{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let repaired = check_or_repair(&a, ctx);
    let ls = ok(&["volume", "ls", s(&a)], ctx);
    let ctx = format!("{ctx} (repaired: {repaired})\n{ls}");
    if acked(2) {
        let c = m.dev(1).join("c");
        assert!(
            ls.contains(&format!("member 1 {}:", c.display())),
            "{ctx}: replace was reported, member 1 is not {}",
            c.display()
        );
    }
    match size_of(&ls, "clip") {
        None => assert!(
            !acked(1),
            "{ctx}: import of clip was reported, clip is gone"
        ),
        Some(_) => {
            let back = export(m, &a, "clip", &ctx);
            assert!(back == data(CLIP_BYTES, 3), "{ctx}: clip differs");
        }
    }
}

#[test]
fn power_cuts_during_mirror_import_replace_and_rebuild_keep_every_acknowledged_byte() {
    campaign("mirror", 15, 2, &mirror_workload, &mirror_verify);
}

// ---- the recorder ---------------------------------------------------------------------

const DATAGRAMS: u64 = 400;

/// Datagram `i`: 8..=1400 bytes, `i` (little-endian) then bytes seeded by `i`, so that a
/// recorded packet names which datagram it is (a datagram the socket dropped under load
/// shifts the sequence; it is not the recorder's loss to find here).
fn datagram(i: u64) -> Vec<u8> {
    let mut r = Rng::new(i + 1000);
    let len = 8 + r.below(1393) as usize;
    let mut d = i.to_le_bytes().to_vec();
    d.extend(data(len - 8, i + 5000));
    d
}

/// `recorded N packets` of the recorder's summary (stderr), when it printed one.
fn recorded_packets(stderr: &str) -> Option<u64> {
    stderr
        .split("recorded ")
        .nth(1)?
        .split(' ')
        .next()?
        .parse()
        .ok()
}

/// The packets (and media bytes) of the last `synced …` line the recorder printed.
fn last_synced(lines: &[String]) -> (u64, u64) {
    let mut last = (0, 0);
    for l in lines.iter().filter(|l| l.starts_with("synced ")) {
        let field = |name: &str| -> u64 {
            l.split_whitespace()
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in {l:?}"))
        };
        last = (field("packets"), field("media_bytes"));
    }
    last
}

/// Whether the recorder has read every datagram sent to `port` (its receive queue in
/// /proc/net/udp is empty).
fn drained(port: u16) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/net/udp") else {
        return true;
    };
    !table.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let ours = f
            .get(1)
            .and_then(|a| a.rsplit_once(':'))
            .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
            == Some(port);
        let queued = f
            .get(4)
            .and_then(|q| q.split_once(':'))
            .and_then(|(_, rx)| u64::from_str_radix(rx, 16).ok())
            .unwrap_or(0);
        ours && queued > 0
    })
}

/// Runs `penstock record … --progress` with `args`, sends the datagrams until they are all
/// sent or the power goes, then SIGTERM (power on) or SIGKILL (power off). Returns whether it
/// exited 0 and its `synced` lines.
fn record_run(m: &Machine, rng: &mut Rng, args: &[&str]) -> (bool, Vec<String>) {
    let mut child = spawn(args);
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let err = drain(child.stderr.take().expect("stderr"));
    let mut first = String::new();
    out.read_line(&mut first).expect("first line");
    let Some(port) = first
        .trim()
        .strip_prefix("listening ")
        .and_then(|a| a.rsplit(':').next())
        .and_then(|p| p.parse::<u16>().ok())
    else {
        let _ = child.kill();
        let _ = child.wait();
        // Refused before listening: only a cut explains it (it touched the mount).
        assert!(
            m.power.is_cut(),
            "record did not start: {first:?}\n{}",
            err.join().unwrap_or_default()
        );
        return (false, Vec::new());
    };
    let lines = Arc::new(Mutex::new(Vec::new()));
    let l2 = lines.clone();
    let reader = thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            l2.lock().expect("lines").push(line);
        }
    });
    let sock = UdpSocket::bind("127.0.0.1:0").expect("sender");
    for i in 0..DATAGRAMS {
        if m.power.is_cut() {
            break;
        }
        sock.send_to(&datagram(i), ("127.0.0.1", port))
            .expect("send");
        // Gaps of 0..300 µs: the sender's pace, so that syncs fall between batches.
        thread::sleep(Duration::from_micros(rng.below(300)));
    }
    let t0 = Instant::now();
    while !m.power.is_cut() && !drained(port) {
        assert!(
            t0.elapsed() < STEP_WAIT,
            "the recorder never read its socket empty"
        );
        thread::sleep(Duration::from_millis(2));
    }
    if !m.power.is_cut() {
        let pid = rustix::process::Pid::from_raw(child.id() as i32).expect("pid");
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    let (_, acked) = finish(child, &m.power);
    reader.join().expect("reader");
    let stderr = err.join().unwrap_or_default();
    std::fs::write(m.scratch.path().join("record.stderr"), &stderr).expect("note");
    let lines = std::mem::take(&mut *lines.lock().expect("lines"));
    (acked, lines)
}

/// `tracks REC [--tracks PREFIX] --check`: clean, and readable up to at least `synced`
/// packets; returns the packet rows (offset, size) of the readable part.
fn check_tracks(rec: &str, prefix: Option<&Path>, synced: u64, ctx: &str) -> Vec<(u64, u64)> {
    let mut args = vec!["tracks", rec];
    if let Some(p) = prefix {
        args.extend(["--tracks", s(p)]);
    }
    let mut check = args.clone();
    check.push("--check");
    let o = Command::new(BIN)
        .args(&check)
        .output()
        .expect("run penstock");
    let out = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success(),
        "{ctx}: tracks --check is not clean:\n{out}"
    );
    let readable: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("readable up to packet "))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        readable >= synced,
        "{ctx}: readable up to packet {readable} < {synced} reported synced\n{out}"
    );
    args.extend(["--track", "packet"]);
    let rows = ok(&args, ctx);
    rows.lines()
        .skip(1)
        .map(|l| {
            let f: Vec<u64> = l.split(',').map(|x| x.parse().expect("number")).collect();
            (f[1], f[2])
        })
        .collect()
}

/// The first `synced` packets of the media are datagrams sent, exact and in order.
fn check_packets(media: &[u8], rows: &[(u64, u64)], synced: u64, ctx: &str) {
    let mut last = None;
    for (i, &(off, len)) in rows.iter().take(synced as usize).enumerate() {
        let end = (off + len) as usize;
        assert!(
            end <= media.len() && len >= 8,
            "{ctx}: synced packet {i} ({len} bytes at {off}) past the media's end or short"
        );
        let p = &media[off as usize..end];
        let n = u64::from_le_bytes(p[..8].try_into().expect("8 bytes"));
        assert!(
            n < DATAGRAMS && last.is_none_or(|l| n > l),
            "{ctx}: synced packet {i} names datagram {n} after {last:?}"
        );
        assert!(
            p == &datagram(n)[..],
            "{ctx}: synced packet {i} (datagram {n}) differs"
        );
        last = Some(n);
    }
}

fn record_file_workload(m: &mut Machine, rng: &mut Rng, _ctx: &str) -> Vec<bool> {
    let rec = m.dev(0).join("rec.ts");
    let (acked, lines) = record_run(
        m,
        rng,
        &[
            "record",
            "udp-listen://127.0.0.1:0",
            s(&rec),
            "--progress",
            "--sync-every",
            "10ms",
        ],
    );
    let (packets, _) = last_synced(&lines);
    std::fs::write(m.scratch.path().join("synced"), packets.to_string()).expect("note");
    vec![acked]
}

fn synced_note(m: &Machine) -> u64 {
    std::fs::read_to_string(m.scratch.path().join("synced"))
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// What the recorder said on stderr (its summary or its error).
fn record_stderr(m: &Machine) -> String {
    std::fs::read_to_string(m.scratch.path().join("record.stderr")).unwrap_or_default()
}

fn record_file_verify(m: &Machine, acks: &[bool], ctx: &str) {
    let synced = synced_note(m);
    let ctx = format!(
        "{ctx} (synced packets {synced}, exit 0: {acks:?}; the recorder said: {})",
        record_stderr(m).trim()
    );
    if acks.first() == Some(&true) {
        let recorded = recorded_packets(&record_stderr(m));
        assert_eq!(
            Some(synced),
            recorded,
            "{ctx}: a clean stop syncs every packet"
        );
    }
    if synced == 0 {
        return;
    }
    let rec = m.dev(0).join("rec.ts");
    let media = std::fs::read(&rec)
        .unwrap_or_else(|e| panic!("{ctx}: {} after the cut: {e}", rec.display()));
    SYNCED_POINTS.set(SYNCED_POINTS.get() + 1);
    let rows = check_tracks(s(&rec), None, synced, &ctx);
    check_packets(&media, &rows, synced, &ctx);
}

#[test]
fn power_cuts_during_a_recording_keep_every_synced_packet() {
    campaign("record", 20, 1, &record_file_workload, &record_file_verify);
}

fn record_vol_workload(m: &mut Machine, rng: &mut Rng, _ctx: &str) -> Vec<bool> {
    let a = m.dev(0).join("a");
    let b = m.dev(0).join("b");
    let mut acks = Vec::new();
    for args in [
        vec![
            "volume",
            "create",
            "rv",
            "--member",
            s(&a),
            "--member",
            s(&b),
            "--member-size",
            "4MiB",
            "--block",
            "64KiB",
        ],
        vec!["volume", "add-partition", s(&a), "rec"],
    ] {
        match step(m, &args) {
            Some(r) => {
                if !r.acked && !m.power.is_cut() {
                    panic!(
                        "penstock {args:?} failed with the power on:\n{}\n{}",
                        r.stdout, r.stderr
                    );
                }
                acks.push(r.acked);
            }
            None => return acks,
        }
    }
    if m.power.is_cut() {
        return acks;
    }
    let target = format!("vol:{}/rec", s(&a));
    let prefix = m.dev(0).join("rec");
    let (acked, lines) = record_run(
        m,
        rng,
        &[
            "record",
            "udp-listen://127.0.0.1:0",
            &target,
            "--grow-step",
            "64KiB",
            "--tracks",
            s(&prefix),
            "--progress",
            "--sync-every",
            "10ms",
        ],
    );
    let (packets, _) = last_synced(&lines);
    std::fs::write(m.scratch.path().join("synced"), packets.to_string()).expect("note");
    acks.push(acked);
    acks
}

fn record_vol_verify(m: &Machine, acks: &[bool], ctx: &str) {
    let acked = |i: usize| acks.get(i).copied().unwrap_or(false);
    let a = m.dev(0).join("a");
    if !acked(0) {
        return;
    }
    let repaired = check_or_repair(&a, ctx);
    let ls = ok(&["volume", "ls", s(&a)], ctx);
    let synced = synced_note(m);
    let ctx = format!(
        "{ctx} (repaired: {repaired}, synced packets {synced}; the recorder said: {})\n{ls}",
        record_stderr(m).trim()
    );
    let Some(size) = size_of(&ls, "rec") else {
        assert!(
            !acked(1),
            "{ctx}: add-partition rec was reported, rec is gone"
        );
        return;
    };
    if acked(2) {
        let recorded = recorded_packets(&record_stderr(m));
        assert_eq!(
            Some(synced),
            recorded,
            "{ctx}: a clean stop syncs every packet"
        );
    }
    if synced == 0 {
        return;
    }
    SYNCED_POINTS.set(SYNCED_POINTS.get() + 1);
    let media = export(m, &a, "rec", &ctx);
    assert_eq!(media.len() as u64, size, "{ctx}");
    let prefix = m.dev(0).join("rec");
    let rows = check_tracks(&format!("vol:{}/rec", s(&a)), Some(&prefix), synced, &ctx);
    check_packets(&media, &rows, synced, &ctx);
}

#[test]
fn power_cuts_during_a_recording_into_a_growing_partition_keep_every_synced_packet() {
    campaign(
        "record-vol",
        20,
        1,
        &record_vol_workload,
        &record_vol_verify,
    );
}

// ---- writes through `penstock volume mount` -------------------------------------------

const MOUNTED_BYTES: usize = 400 * 1024 + 99;
const CHUNK_BYTES: usize = 48 * 1024;

/// Whether a penstock FUSE mount is on `dir` (/proc/self/mountinfo).
fn penstock_mounted(dir: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = dir.to_string_lossy();
    info.lines().any(|l| {
        let tail: Vec<&str> = l.split(" - ").nth(1).unwrap_or("").split(' ').collect();
        l.split(' ').nth(4) == Some(want.as_ref())
            && tail.len() > 1
            && tail[1].starts_with("penstock:")
    })
}

/// Writes `bytes` to `path` in chunks, each fsynced; returns the bytes a successful fsync
/// covered (the acknowledged ones).
fn write_synced(path: &Path, bytes: &[u8]) -> usize {
    use std::io::Write;
    let Ok(mut f) = std::fs::File::create(path) else {
        return 0;
    };
    let mut acked = 0;
    for chunk in bytes.chunks(CHUNK_BYTES) {
        if f.write_all(chunk).is_err() || f.sync_all().is_err() {
            break;
        }
        acked += chunk.len();
    }
    acked
}

fn mount_workload(m: &mut Machine, _rng: &mut Rng, _ctx: &str) -> Vec<bool> {
    let a = m.dev(0).join("a");
    let b = m.dev(0).join("b");
    let create = [
        "volume",
        "create",
        "fv",
        "--member",
        s(&a),
        "--member",
        s(&b),
        "--member-size",
        "4MiB",
        "--block",
        "64KiB",
    ];
    match step(m, &create) {
        Some(r) if r.acked => {}
        Some(r) => {
            assert!(
                m.power.is_cut(),
                "create failed with the power on: {}",
                r.stderr
            );
            return vec![false];
        }
        None => return Vec::new(),
    }
    let dir = m.scratch.path().join("mnt");
    std::fs::create_dir_all(&dir).expect("mount point");
    let mut child = Command::new(BIN)
        .args(["volume", "mount", "--foreground", s(&a), s(&dir)])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start penstock volume mount");
    let err = drain(child.stderr.take().expect("stderr"));
    let t0 = Instant::now();
    let mut up = false;
    while !m.power.is_cut() && child.try_wait().expect("wait").is_none() {
        if penstock_mounted(&dir) {
            up = true;
            break;
        }
        assert!(
            t0.elapsed() < STEP_WAIT,
            "penstock volume mount never mounted"
        );
        thread::sleep(Duration::from_millis(5));
    }
    let acked_bytes = if up {
        write_synced(&dir.join("f.bin"), &data(MOUNTED_BYTES, 9))
    } else {
        0
    };
    std::fs::write(m.scratch.path().join("acked"), acked_bytes.to_string()).expect("note");
    let unmounted = if up && !m.power.is_cut() {
        // A clean unmount: the server commits and exits 0.
        Command::new("fusermount3")
            .arg("-u")
            .arg(&dir)
            .status()
            .expect("fusermount3")
            .success()
    } else {
        false
    };
    let (_, exited_0) = finish(child, &m.power);
    if penstock_mounted(&dir) {
        // The server was killed: detach its dead mount.
        let _ = rustix::mount::unmount(&dir, rustix::mount::UnmountFlags::DETACH);
    }
    let stderr = err.join().unwrap_or_default();
    std::fs::write(m.scratch.path().join("record.stderr"), &stderr).expect("note");
    assert!(
        exited_0 || m.power.is_cut(),
        "penstock volume mount failed with the power on: {stderr}"
    );
    vec![true, unmounted && exited_0]
}

fn mount_verify(m: &Machine, acks: &[bool], ctx: &str) {
    let acked = |i: usize| acks.get(i).copied().unwrap_or(false);
    let a = m.dev(0).join("a");
    if !acked(0) {
        return;
    }
    let acked_bytes: usize = std::fs::read_to_string(m.scratch.path().join("acked"))
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let repaired = check_or_repair(&a, ctx);
    let ls = ok(&["volume", "ls", s(&a)], ctx);
    let ctx = format!(
        "{ctx} (repaired: {repaired}, {acked_bytes} bytes fsynced through the mount; the \
         mount said: {})\n{ls}",
        record_stderr(m).trim()
    );
    let Some(_) = size_of(&ls, "f.bin") else {
        assert_eq!(acked_bytes, 0, "{ctx}: f.bin is gone");
        return;
    };
    if acked_bytes > 0 {
        SYNCED_POINTS.set(SYNCED_POINTS.get() + 1);
    }
    let back = export(m, &a, "f.bin", &ctx);
    let want = data(MOUNTED_BYTES, 9);
    assert!(
        back.len() >= acked_bytes && back.len() <= want.len(),
        "{ctx}: f.bin holds {} bytes, {acked_bytes} were fsynced",
        back.len()
    );
    assert!(
        back[..] == want[..back.len()],
        "{ctx}: f.bin's bytes differ"
    );
    if acked(1) {
        assert_eq!(
            back.len(),
            want.len(),
            "{ctx}: unmounted cleanly, f.bin is short"
        );
    }
}

#[test]
fn power_cuts_under_writes_through_the_fuse_mount_keep_every_fsynced_byte() {
    campaign("mount", 20, 1, &mount_workload, &mount_verify);
}
