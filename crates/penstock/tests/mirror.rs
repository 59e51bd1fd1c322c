//! Mirrored volumes end to end (issue 21 item 4), through the `penstock` binary on real files:
//! `volume create --mirror 2` over 4 members on two devices (two on the temp directory's file
//! system, two on /dev/shm), a member truncated or deleted while an engine stream reads the
//! partition (the uring path), `volume ls` showing it degraded, `replace` + `check --repair`
//! rebuilding it, and each copy alone serving the partition byte-exact afterwards.
//!
//! Skips (loudly) when io_uring is refused or when no second device is at hand. No test
//! asserts a duration.

mod common;

use std::io::Read;
use std::net::TcpListener;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::mpsc;
use std::time::Duration;

const MIB: usize = 1 << 20;

fn penstock() -> Command {
    Command::new(env!("CARGO_BIN_EXE_penstock"))
}

fn run(args: &[&str]) -> Output {
    penstock().args(args).output().expect("run penstock")
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[track_caller]
fn ok(args: &[&str]) -> String {
    let o = run(args);
    assert!(o.status.success(), "penstock {args:?} failed: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[track_caller]
fn fails(args: &[&str], needle: &str) -> String {
    let o = run(args);
    let all = text(&o);
    assert!(!o.status.success(), "penstock {args:?} should fail: {all}");
    assert!(
        all.contains(needle),
        "penstock {args:?}: expected {needle:?}: {all}"
    );
    all
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 temp path")
}

/// Deterministic bytes (xorshift), so a failure replays.
fn data(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Two directories on different devices (the temp dir's file system and /dev/shm), or why not.
fn two_devices() -> Result<(tempfile::TempDir, tempfile::TempDir), String> {
    let a = tempfile::tempdir().map_err(|e| e.to_string())?;
    let b = tempfile::tempdir_in("/dev/shm").map_err(|e| format!("/dev/shm: {e}"))?;
    let dev = |p: &Path| std::fs::metadata(p).map(|m| m.dev()).unwrap_or(0);
    if dev(a.path()) == dev(b.path()) {
        return Err("the temp directory and /dev/shm are on one device".to_string());
    }
    Ok((a, b))
}

fn uring_works(dir: &Path) -> bool {
    let m = dir.join("probe-m0");
    ok(&[
        "volume",
        "create",
        "probe",
        "--member-size",
        "4MiB",
        "--member",
        s(&m),
    ]);
    let f = dir.join("probe-file");
    std::fs::write(&f, b"x").unwrap();
    let o = run(&["volume", "import", s(&m), "p", s(&f)]);
    if o.status.success() {
        return true;
    }
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("io_uring"),
        "probe import failed: {}",
        text(&o)
    );
    penstock_testreq::require_that("io_uring", Some(err.into_owned()))
}

/// Streams `vol:VOL/PART` to a slow TCP receiver through the engine; `during` runs once the
/// receiver has 2 MiB (the stream is under way, most of the partition not read yet).
fn stream_with(vol_env: &str, part: &str, during: impl FnOnce()) -> (Output, Vec<u8>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    let receiver = std::thread::spawn(move || {
        let (mut sock, _) = listener.accept().unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let mut got = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        let mut told = false;
        loop {
            let n = sock.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
            if !told && got.len() >= 2 * MIB {
                told = true;
                tx.send(()).unwrap();
            }
            // Slow: the stream is still reading its source when `during` runs.
            std::thread::sleep(Duration::from_millis(2));
        }
        got
    });
    let child = penstock()
        .args(["stream", &format!("vol:{part}"), &format!("tcp://{addr}")])
        .env("PENSTOCK_VOLUMES", vol_env)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the receiver got 2 MiB");
    during();
    let o = child.wait_with_output().unwrap();
    (o, receiver.join().unwrap())
}

#[track_caller]
fn export_equals(member: &Path, part: &str, want: &[u8], dir: &Path) {
    let out = dir.join(format!("{part}.out"));
    let _ = std::fs::remove_file(&out);
    ok(&["volume", "export", s(member), part, s(&out)]);
    let back = std::fs::read(&out).unwrap();
    assert_eq!(back.len(), want.len());
    assert!(back == want, "partition {part} differs");
}

fn member_line(ls: &str, i: usize) -> &str {
    ls.lines()
        .find(|l| l.starts_with(&format!("member {i} ")))
        .unwrap_or_else(|| panic!("no member {i} in {ls}"))
}

#[test]
fn a_mirrored_volume_survives_a_member_truncated_or_deleted_mid_stream_and_is_rebuilt() {
    let Some((a, b)) = penstock_testreq::require_ok("two devices for a mirror", two_devices())
    else {
        return;
    };
    if !uring_works(a.path()) {
        return;
    }
    // Members 0,1 on one device, 2,3 on the other: each block's copy is on the other device.
    let m: Vec<PathBuf> = vec![
        a.path().join("m0"),
        a.path().join("m1"),
        b.path().join("m2"),
        b.path().join("m3"),
    ];
    // Two members on one device cannot hold each other's copies: refused, nothing created.
    let lone = [a.path().join("x0"), a.path().join("x1")];
    let e = fails(
        &[
            "volume",
            "create",
            "lone",
            "--mirror",
            "2",
            "--member-size",
            "8MiB",
            "--member",
            s(&lone[0]),
            "--member",
            s(&lone[1]),
        ],
        "another device",
    );
    assert!(
        !lone[0].exists() && !lone[1].exists(),
        "a refused create made files: {e}"
    );

    let mut args = vec![
        "volume",
        "create",
        "mir",
        "--mirror",
        "2",
        "--member-size",
        "40MiB",
    ];
    for p in &m {
        args.extend(["--member", s(p)]);
    }
    assert!(ok(&args).contains("mirrored (2 copies)"));
    let clip = data(24 * MIB + 4321, 21);
    let src = a.path().join("clip.in");
    std::fs::write(&src, &clip).unwrap();
    ok(&["volume", "import", s(&m[0]), "clip", s(&src)]);
    let placed = data(5 * MIB + 17, 22);
    std::fs::write(&src, &placed).unwrap();
    ok(&[
        "volume",
        "import",
        s(&m[0]),
        "placed",
        s(&src),
        "--place",
        "1",
    ]);
    let ls = ok(&["volume", "ls", s(&m[0])]);
    assert!(ls.contains("copies on 2,3,0,1"), "{ls}");
    assert!(ls.contains("placed on members 1 (copies on 2)"), "{ls}");
    ok(&["volume", "check", s(&m[0])]);
    let env = format!("mir={}", s(&m[0]));

    // 1. Member 1 loses everything past its metadata while a stream reads: its reads come
    //    back short, the stream reads those pieces from member 3, byte-exact, no error.
    let (o, got) = stream_with(&env, "mir/clip", || {
        let f = std::fs::OpenOptions::new().write(true).open(&m[1]).unwrap();
        f.set_len(2 * MIB as u64).unwrap();
    });
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(got.len(), clip.len());
    assert!(
        got == clip,
        "the stream's bytes differ after member 1 was truncated"
    );
    let ls = ok(&["volume", "ls", s(&m[0])]);
    assert!(ls.contains("DEGRADED"), "{ls}");
    assert!(member_line(&ls, 1).contains("degraded"), "{ls}");
    fails(&["volume", "check", s(&m[0])], "degraded");
    // The placed partition lived on member 1 only (copies on 2): still whole.
    export_equals(&m[0], "placed", &placed, a.path());

    // 2. Replace member 1 (a new file on the first device) and rebuild it from the mirror.
    let m1new = a.path().join("m1new");
    ok(&["volume", "replace", s(&m[0]), "1", s(&m1new)]);
    let ls = ok(&["volume", "ls", s(&m[0])]);
    assert!(member_line(&ls, 1).contains("rebuilding"), "{ls}");
    let o = run(&["volume", "check", "--repair", s(&m[0])]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("rebuild: "),
        "{}",
        text(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("(100%)"),
        "{}",
        text(&o)
    );
    ok(&["volume", "check", s(&m[0])]);
    let ls = ok(&["volume", "ls", s(&m[0])]);
    assert!(!ls.contains("DEGRADED"), "{ls}");

    // 3. Member 3 (the other copy of member 1's blocks) is deleted while a stream reads: the
    //    stream completes byte-exact; the volume opens without it, degraded, and every byte
    //    of both partitions comes from the rebuilt member 1 alone: its copy is identical.
    let (o, got) = stream_with(&env, "mir/clip", || {
        std::fs::remove_file(&m[3]).unwrap();
    });
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        got == clip,
        "the stream's bytes differ after member 3 was deleted"
    );
    let ls = ok(&["volume", "ls", s(&m[0])]);
    assert!(member_line(&ls, 3).contains("degraded (missing"), "{ls}");
    export_equals(&m[0], "clip", &clip, a.path());
    export_equals(&m[0], "placed", &placed, a.path());
    let (o, got) = stream_with(&env, "mir/clip", || {});
    assert!(o.status.success(), "{}", text(&o));
    assert!(got == clip, "a stream opened without member 3 differs");

    // 4. Replace member 3 on the second device, rebuild, and read with member 1 gone: the
    //    rebuilt member 3 alone serves its blocks byte-exact too.
    let m3new = b.path().join("m3new");
    fails(
        &[
            "volume",
            "replace",
            s(&m[0]),
            "3",
            s(&a.path().join("same-dev")),
        ],
        "same device",
    );
    ok(&["volume", "replace", s(&m[0]), s(&m[3]), s(&m3new)]);
    ok(&["volume", "check", "--repair", s(&m[0])]);
    ok(&["volume", "check", s(&m[0])]);
    std::fs::remove_file(&m1new).unwrap();
    export_equals(&m[0], "clip", &clip, a.path());
    export_equals(&m[0], "placed", &placed, a.path());
    // Losing the second copy of the same blocks is refused with a clear message.
    std::fs::remove_file(&m3new).unwrap();
    fails(&["volume", "ls", s(&m[0])], "both copies");
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn size_of(ls: &str, name: &str) -> Option<u64> {
    let prefix = format!("partition {name} ");
    ls.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
}

/// The SIGKILL test of `tests/volume.rs` on a mirrored volume, at 16 seeded points: streams
/// into partitions created empty (growing both copies) and truncations, killed at random.
/// After each kill the volume checks clean (or repairably), and every committed byte reads
/// back exactly; at the end member 1 is deleted and every partition still reads back exactly
/// from the copies alone (both copies were written and synced before each size was committed).
#[test]
fn sigkill_during_mirrored_growth_keeps_every_committed_byte_on_both_copies() {
    let Some((a, b)) = penstock_testreq::require_ok("two devices for a mirror", two_devices())
    else {
        return;
    };
    if !uring_works(a.path()) {
        return;
    }
    let d = a.path();
    let m: Vec<PathBuf> = vec![
        d.join("g0"),
        d.join("g1"),
        b.path().join("g2"),
        b.path().join("g3"),
    ];
    let mut args = vec![
        "volume",
        "create",
        "grow",
        "--mirror",
        "2",
        "--member-size",
        "48MiB",
    ];
    for p in &m {
        args.extend(["--member", s(p)]);
    }
    ok(&args);
    let mut content: Vec<(String, Vec<u8>)> = Vec::new();
    let (mut streams_done, mut truncs_done) = (0, 0);
    for seed in 1..=16u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let truncate = seed % 3 == 0 && !content.is_empty();
        let mut cmd = penstock();
        let (name, len) = if truncate {
            let i = (rng.next() % content.len() as u64) as usize;
            let name = content[i].0.clone();
            let ls = ok(&["volume", "ls", s(&m[0])]);
            let size = size_of(&ls, &name).unwrap();
            let to = rng.next() % (size + 1);
            cmd.args(["volume", "truncate", s(&m[1]), &name, &to.to_string()]);
            (name, to)
        } else {
            let name = format!("g{seed}");
            let len = (rng.next() % (4 * MIB as u64)) as usize;
            ok(&["volume", "add-partition", s(&m[0]), &name]);
            let src = d.join(format!("{name}.in"));
            let bytes = data(len, seed);
            std::fs::write(&src, &bytes).unwrap();
            let canon = std::fs::canonicalize(&m[0]).unwrap();
            cmd.args(["stream", s(&src), &format!("vol:{}/{name}", s(&canon))]);
            content.push((name.clone(), bytes));
            (name, len as u64)
        };
        let mut child = cmd
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_micros(rng.next() % 400_000));
        let _ = child.kill(); // SIGKILL
        let out = child.wait_with_output().unwrap();
        let o = run(&["volume", "check", s(&m[1])]);
        if !o.status.success() {
            assert!(
                String::from_utf8_lossy(&o.stderr).contains("all repairable"),
                "seed {seed}: {}",
                text(&o)
            );
            ok(&["volume", "check", "--repair", s(&m[2])]);
        }
        ok(&["volume", "check", s(&m[3])]);
        let ls = ok(&["volume", "ls", s(&m[0])]);
        let size = size_of(&ls, &name).unwrap_or_else(|| panic!("seed {seed}: {name} gone: {ls}"));
        let bytes = &content.iter().find(|(n, _)| *n == name).unwrap().1;
        if truncate {
            assert!(
                size == len || size as usize == bytes.len(),
                "seed {seed}: {size}"
            );
            if out.status.success() {
                assert_eq!(size, len, "seed {seed}: truncate reported, size not cut");
                truncs_done += 1;
            }
        } else {
            assert!(
                size == 0 || size == len,
                "seed {seed}: size {size} of {len}"
            );
            if out.status.success() {
                assert_eq!(
                    size, len,
                    "seed {seed}: stream reported, size not committed"
                );
                streams_done += 1;
            }
        }
        export_equals(&m[2], &name, &bytes[..size as usize], d);
        if let Some(c) = content.iter_mut().find(|(n, _)| *n == name) {
            c.1.truncate(size as usize);
        }
    }
    eprintln!("{streams_done} streams and {truncs_done} truncations completed before their kill");
    assert!(
        streams_done > 0,
        "no stream completed: the delays are too short"
    );
    // Each copy alone: without member 1, its blocks come from member 3 (and member 1's
    // copies of member 3's from member 3 itself).
    std::fs::remove_file(&m[1]).unwrap();
    for (name, bytes) in &content {
        export_equals(&m[0], name, bytes, d);
    }
}

/// `check --repair`'s rebuild is a sequence of bulk-class engine streams with progress lines;
/// SIGINT stops it part way, leaving the replaced member `rebuilding` (the volume degraded,
/// `check` saying it is repairable); a second `check --repair` completes it, and the rebuilt
/// member alone then serves every byte. The rate limit keeps the first run slow enough to
/// be interrupted; no duration is asserted.
#[test]
fn an_interrupted_rebuild_leaves_the_volume_degraded_and_a_second_repair_completes() {
    use std::io::BufRead;
    let Some((a, b)) = penstock_testreq::require_ok("two devices for a mirror", two_devices())
    else {
        return;
    };
    if !uring_works(a.path()) {
        return;
    }
    let m: Vec<PathBuf> = vec![
        a.path().join("m0"),
        a.path().join("m1"),
        b.path().join("m2"),
        b.path().join("m3"),
    ];
    let mut args = vec![
        "volume",
        "create",
        "rb",
        "--mirror",
        "2",
        "--member-size",
        "40MiB",
    ];
    for p in &m {
        args.extend(["--member", s(p)]);
    }
    ok(&args);
    let clip = data(24 * MIB + 999, 31);
    let src = a.path().join("clip.in");
    std::fs::write(&src, &clip).unwrap();
    ok(&["volume", "import", s(&m[0]), "clip", s(&src)]);
    std::fs::remove_file(&m[1]).unwrap();
    let m1new = a.path().join("m1new");
    ok(&["volume", "replace", s(&m[0]), "1", s(&m1new)]);

    // Bad limits are refused before anything is copied.
    fails(
        &[
            "volume",
            "check",
            "--repair",
            s(&m[0]),
            "--rebuild-chunk",
            "1000",
        ],
        "multiple of 4096",
    );
    fails(
        &[
            "volume",
            "check",
            "--repair",
            s(&m[0]),
            "--rebuild-rate",
            "30/s",
        ],
        "a rate of bytes",
    );

    // 1. A slow rebuild (4 MB/s, 1 MiB per stream), interrupted after its first progress.
    let mut child = penstock()
        .args([
            "volume",
            "check",
            "--repair",
            s(&m[0]),
            "--rebuild-rate",
            "4MB/s",
            "--rebuild-chunk",
            "1MiB",
            "--progress-interval",
            "200ms",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        for line in std::io::BufReader::new(stderr).lines() {
            let line = line.unwrap();
            let _ = tx.send(line.clone());
            all.push(line);
        }
        all
    });
    let first = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("a progress line");
    assert!(
        first.starts_with("rebuild: ") && first.contains("MiB/s") && !first.contains("(100%)"),
        "{first}"
    );
    // The engine's worker copies at the lowest best-effort I/O priority (it yields to
    // other processes' I/O at the kernel's scheduler too).
    if penstock_testreq::require("ionice") {
        let mut workers = 0;
        for task in std::fs::read_dir(format!("/proc/{}/task", child.id())).unwrap() {
            let task = task.unwrap().path();
            let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
            if !comm.starts_with("penstock-w") {
                continue;
            }
            let tid = task.file_name().unwrap().to_str().unwrap().to_string();
            let o = Command::new("ionice").args(["-p", &tid]).output().unwrap();
            let prio = String::from_utf8_lossy(&o.stdout).trim().to_string();
            assert_eq!(prio, "best-effort: prio 7", "worker {tid}");
            workers += 1;
        }
        assert!(workers > 0, "no engine worker thread found");
    }
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
    let status = child.wait().unwrap();
    let lines = reader.join().unwrap().join("\n");
    assert!(!status.success(), "an interrupted rebuild exits 1: {lines}");
    assert!(
        lines.contains("rebuild stopped after") && lines.contains("cancelled"),
        "{lines}"
    );
    assert!(!lines.contains("(100%)"), "{lines}");
    // The volume: degraded, member 1 still rebuilding, check says repairable.
    let ls = ok(&["volume", "ls", s(&m[0])]);
    assert!(ls.contains("DEGRADED"), "{ls}");
    assert!(member_line(&ls, 1).contains("rebuilding"), "{ls}");
    let all = fails(&["volume", "check", s(&m[0])], "all repairable");
    assert!(all.contains("rebuilding"), "{all}");
    // Reads meanwhile come from the healthy copies.
    export_equals(&m[0], "clip", &clip, a.path());

    // 2. The second repair completes, with progress to 100%.
    let o = run(&["volume", "check", "--repair", s(&m[0])]);
    assert!(o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("(100%)") && err.contains("MiB/s"), "{err}");
    ok(&["volume", "check", s(&m[0])]);
    let ls = ok(&["volume", "ls", s(&m[0])]);
    assert!(!ls.contains("DEGRADED"), "{ls}");

    // 3. Without member 3 (the other copy of member 1's blocks), the rebuilt member 1
    //    serves them: byte-exact.
    std::fs::remove_file(&m[3]).unwrap();
    export_equals(&m[0], "clip", &clip, a.path());
}

/// Whether `name` runs (`name --version`).
/// `data from byte N` of `volume ls`: where the data area starts on every member.
fn data_start(ls: &str) -> u64 {
    ls.split("data from byte ")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no data start in {ls}"))
}

/// Writes `bytes` over `path` at `offset` and syncs (what a failing disk returns).
fn scribble(path: &Path, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, offset).unwrap();
    f.sync_all().unwrap();
}

/// `N bad` in a scrub's or check's summary line.
fn bad_count(out: &str, prefix: &str) -> u64 {
    let line = out
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} line in {out}"));
    line.split(", ")
        .find_map(|p| p.strip_suffix(" bad"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no bad count in {line:?}"))
}

/// Issue 30's reproducer: 8 MiB of random bytes over one member's data area of a `--mirror 2`
/// volume. `volume check` reports the bad blocks (naming the member), the export is
/// byte-exact (each bad unit read from the other copy, repaired, counted), `volume scrub`
/// finds and repairs what the export did not read, and then a second export meets no bad
/// block and `check` is clean.
#[test]
fn random_bytes_over_a_mirrored_member_are_found_read_from_the_mirror_and_scrubbed() {
    let Some((a, b)) = penstock_testreq::require_ok("two devices for a mirror", two_devices())
    else {
        return;
    };
    if !uring_works(a.path()) {
        return;
    }
    let m: Vec<PathBuf> = vec![
        a.path().join("c0"),
        a.path().join("c1"),
        b.path().join("c2"),
        b.path().join("c3"),
    ];
    let mut args = vec![
        "volume",
        "create",
        "sum",
        "--mirror",
        "2",
        "--member-size",
        "40MiB",
    ];
    for p in &m {
        args.extend(["--member", s(p)]);
    }
    assert!(ok(&args).contains("block checksums"));
    let clip = data(60 * MIB + 1234, 30);
    let src = a.path().join("clip.in");
    std::fs::write(&src, &clip).unwrap();
    ok(&["volume", "import", s(&m[0]), "clip", s(&src)]);
    ok(&["volume", "check", s(&m[0])]);
    let start = data_start(&ok(&["volume", "ls", s(&m[0])]));

    scribble(&m[1], start, &data(8 * MIB, 31));

    // check: reports them, all repairable, and changes nothing.
    let o = run(&["volume", "check", s(&m[0])]);
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(out.contains("run `penstock volume scrub`"), "{out}");
    let found = bad_count(&String::from_utf8_lossy(&o.stdout), "block checksums:");
    assert!(
        found >= 8 * MIB as u64 / 4096 / 2,
        "{found} bad units: {out}"
    );
    assert!(out.contains("member 1 ("), "{out}");
    assert_eq!(
        bad_count(
            &String::from_utf8_lossy(&run(&["volume", "check", s(&m[0])]).stdout),
            "block checksums:"
        ),
        found,
        "check repaired something"
    );

    // export: byte-exact, the bad units it met read from the other copy and repaired.
    let out_file = a.path().join("clip.out");
    let o = run(&["volume", "export", s(&m[0]), "clip", s(&out_file)]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        std::fs::read(&out_file).unwrap() == clip,
        "the export differs"
    );
    let said = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(said.contains("block checksum failures:"), "{said}");
    assert!(said.contains("repaired from the other copy"), "{said}");

    // scrub: finds what is left (the copies the export did not read), repairs it all, at
    // most at the rate asked (a lower bound on its time: it read every copy).
    let rate = 400e6;
    let t0 = std::time::Instant::now();
    let o = run(&["volume", "scrub", s(&m[0]), "--rate", "400MB/s"]);
    let took = t0.elapsed().as_secs_f64();
    assert!(o.status.success(), "{}", text(&o));
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    let bytes: f64 = stdout
        .split(" units (")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no byte count: {stdout}"));
    assert!(bytes >= 2.0 * clip.len() as f64, "{stdout}");
    assert!(
        took >= bytes / rate,
        "{bytes} bytes in {took} s at --rate 400MB/s"
    );
    let left = bad_count(&stdout, "scrubbed volume");
    assert!(
        left > 0 && left < found,
        "scrub found {left} of {found}: {stdout}"
    );
    assert!(stdout.contains(&format!("{left} repaired")), "{stdout}");

    // Nothing bad is left: a second export meets no bad block, check and scrub are clean.
    let o = run(&["volume", "export", s(&m[0]), "clip", s(&out_file)]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        std::fs::read(&out_file).unwrap() == clip,
        "the second export differs"
    );
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("block checksum failures"),
        "{}",
        text(&o)
    );
    let out = ok(&["volume", "check", s(&m[0])]);
    assert!(out.contains("consistent"), "{out}");
    assert_eq!(
        bad_count(&ok(&["volume", "scrub", s(&m[0])]), "scrubbed volume"),
        0
    );
    // Each copy alone is whole: member 3 holds copies of member 1's blocks.
    std::fs::remove_file(&m[3]).unwrap();
    export_equals(&m[0], "clip", &clip, a.path());
}

/// The same over an unmirrored volume: the export fails with an I/O error naming the block
/// (never wrong bytes); check and scrub report it as lost; a volume created with
/// `--checksums off` (the format of before) still reads, unverified.
#[test]
fn a_bad_block_without_a_mirror_fails_the_read_naming_the_block() {
    let d = tempfile::tempdir().unwrap();
    if !uring_works(d.path()) {
        return;
    }
    let m = [d.path().join("u0"), d.path().join("u1")];
    let mut args = vec!["volume", "create", "one", "--member-size", "24MiB"];
    for p in &m {
        args.extend(["--member", s(p)]);
    }
    ok(&args);
    let clip = data(10 * MIB + 99, 32);
    let src = d.path().join("clip.in");
    std::fs::write(&src, &clip).unwrap();
    ok(&["volume", "import", s(&m[0]), "clip", s(&src)]);
    let start = data_start(&ok(&["volume", "ls", s(&m[0])]));
    // Member 1's first block holds partition bytes from 64 KiB (stripe unit 2 of block 0's
    // group is back on member 0): 16 bytes at 5000 into it are partition byte 70536, in
    // partition block 0.
    scribble(&m[1], start + 5000, &[0xA5; 16]);
    let out_file = d.path().join("clip.out");
    let e = fails(
        &["volume", "export", s(&m[0]), "clip", s(&out_file)],
        "block checksum failure in partition block 0 (bytes 69632..73728, member 1",
    );
    assert!(e.contains("no other copy"), "{e}");
    // Never wrong bytes: the export stopped before the bad unit's bytes were written.
    let got = std::fs::read(&out_file).unwrap_or_default();
    assert!(got.len() <= 69632, "{} bytes exported", got.len());
    assert!(got[..] == clip[..got.len()], "the exported prefix differs");
    let e = fails(&["volume", "check", s(&m[0])], "without a good copy");
    assert!(e.contains("no good copy: these bytes are lost"), "{e}");
    let e = fails(&["volume", "scrub", s(&m[0])], "1 bad block unit(s) remain");
    assert!(
        e.contains("partition one/clip block 0 (bytes 69632..73728)"),
        "{e}"
    );

    // The format of before: no checksums, the damaged bytes read as they are (what this
    // penstock did before version 5), and check says the data is not verified.
    let old = [d.path().join("o0")];
    ok(&[
        "volume",
        "create",
        "old",
        "--member-size",
        "8MiB",
        "--checksums",
        "off",
        "--member",
        s(&old[0]),
    ]);
    let small = data(MIB, 33);
    std::fs::write(&src, &small).unwrap();
    ok(&["volume", "import", s(&old[0]), "p", s(&src)]);
    let ls = ok(&["volume", "ls", s(&old[0])]);
    let start = data_start(&ls);
    assert_eq!(start, 2 * MIB as u64, "{ls}");
    scribble(&old[0], start + 10, &[0x5A; 4]);
    let out = ok(&["volume", "check", s(&old[0])]);
    assert!(
        out.contains("no block checksums (format version 2)"),
        "{out}"
    );
    ok(&["volume", "export", s(&old[0]), "p", s(&out_file)]);
    let got = std::fs::read(&out_file).unwrap();
    assert_eq!(&got[10..14], &[0x5A; 4]);
    assert_eq!(&got[14..], &small[14..]);
}

/// A rebuild never copies a bad block onto the new member: with member 1 replaced and a
/// unit of member 3 (the copy of member 1's blocks) damaged, `check --repair` refuses naming
/// the block, copies nothing, and the new member stays `rebuilding` (never read).
#[test]
fn a_rebuild_refuses_a_source_block_that_fails_its_checksum() {
    let Some((a, b)) = penstock_testreq::require_ok("two devices for a mirror", two_devices())
    else {
        return;
    };
    if !uring_works(a.path()) {
        return;
    }
    let m: Vec<PathBuf> = vec![
        a.path().join("r0"),
        a.path().join("r1"),
        b.path().join("r2"),
        b.path().join("r3"),
    ];
    let mut args = vec![
        "volume",
        "create",
        "reb",
        "--mirror",
        "2",
        "--member-size",
        "24MiB",
    ];
    for p in &m {
        args.extend(["--member", s(p)]);
    }
    ok(&args);
    let clip = data(12 * MIB, 34);
    let src = a.path().join("clip.in");
    std::fs::write(&src, &clip).unwrap();
    ok(&["volume", "import", s(&m[0]), "clip", s(&src)]);
    let start = data_start(&ok(&["volume", "ls", s(&m[0])]));
    std::fs::remove_file(&m[1]).unwrap();
    let m1new = a.path().join("r1new");
    ok(&["volume", "replace", s(&m[0]), "1", s(&m1new)]);
    // Member 3's first block: the copy of member 1's first block (copies rotate by 2).
    scribble(&m[3], start + 4096 * 3 + 7, &[0xEE; 3]);
    let e = fails(
        &["volume", "check", "--repair", s(&m[0])],
        "fails its checksum",
    );
    assert!(e.contains("nothing good to rebuild it from"), "{e}");
    assert!(e.contains("member 3 ("), "{e}");
    let ls = ok(&["volume", "ls", s(&m[0])]);
    assert!(member_line(&ls, 1).contains("rebuilding"), "{ls}");
}

/// Issue 30's acceptance: bit flips at 1,000 random places over the members' data areas of a
/// mirrored volume while 4 streams read its partition: every byte a stream delivers is right,
/// or the stream fails (both copies of a unit flipped) — 0 wrong bytes delivered. Then a scrub
/// repairs what has a good copy, and reports the rest.
#[test]
fn bit_flips_while_four_streams_read_deliver_no_wrong_byte() {
    let Some((a, b)) = penstock_testreq::require_ok("two devices for a mirror", two_devices())
    else {
        return;
    };
    if !uring_works(a.path()) {
        return;
    }
    let m: Vec<PathBuf> = vec![a.path().join("f0"), b.path().join("f1")];
    ok(&[
        "volume",
        "create",
        "flip",
        "--mirror",
        "2",
        "--member-size",
        "40MiB",
        "--member",
        s(&m[0]),
        "--member",
        s(&m[1]),
    ]);
    let clip = data(30 * MIB + 77, 40);
    let src = a.path().join("clip.in");
    std::fs::write(&src, &clip).unwrap();
    ok(&["volume", "import", s(&m[0]), "clip", s(&src)]);
    let ls = ok(&["volume", "ls", s(&m[0])]);
    let start = data_start(&ls);
    let env = format!("flip={}", s(&m[0]));

    // Four readers, each a stream to a slow TCP receiver.
    let mut readers = Vec::new();
    let (tx, rx) = mpsc::channel();
    for _ in 0..4 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let tx = tx.clone();
        let receiver = std::thread::spawn(move || {
            let (mut sock, _) = listener.accept().unwrap();
            sock.set_read_timeout(Some(Duration::from_secs(60)))
                .unwrap();
            let mut got = Vec::new();
            let mut buf = vec![0u8; 64 << 10];
            let mut told = false;
            loop {
                let n = match sock.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                got.extend_from_slice(&buf[..n]);
                if !told && got.len() >= MIB {
                    told = true;
                    tx.send(()).unwrap();
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            got
        });
        let child = penstock()
            .args(["stream", "vol:flip/clip", &format!("tcp://{addr}")])
            .env("PENSTOCK_VOLUMES", &env)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        readers.push((child, receiver));
    }
    for _ in 0..4 {
        rx.recv_timeout(Duration::from_secs(60))
            .expect("every receiver got 1 MiB");
    }
    // 1,000 flips over both members' first 16 MiB of data (the clip's blocks), seeded.
    let mut rng = Rng(0x5eed_f11b);
    let files: Vec<std::fs::File> = m
        .iter()
        .map(|p| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(p)
                .unwrap()
        })
        .collect();
    for _ in 0..1000 {
        use std::os::unix::fs::FileExt;
        let f = &files[(rng.next() % 2) as usize];
        let at = start + rng.next() % (16 * MIB as u64);
        let mut byte = [0u8];
        f.read_exact_at(&mut byte, at).unwrap();
        byte[0] ^= 1 << (rng.next() % 8);
        f.write_all_at(&byte, at).unwrap();
    }
    for f in &files {
        f.sync_all().unwrap();
    }
    let mut completed = 0;
    for (child, receiver) in readers {
        let o = child.wait_with_output().unwrap();
        let got = receiver.join().unwrap();
        assert!(got.len() <= clip.len());
        assert!(
            got[..] == clip[..got.len()],
            "a stream delivered wrong bytes: {}",
            text(&o)
        );
        if o.status.success() {
            assert_eq!(got.len(), clip.len(), "{}", text(&o));
            completed += 1;
        } else {
            assert!(
                text(&o).contains("block checksum failure"),
                "a stream failed otherwise: {}",
                text(&o)
            );
        }
    }
    eprintln!("{completed} of 4 streams completed, byte-exact");
    // A scrub repairs every unit with a good copy; those with both copies flipped are lost
    // and reported so, and the repaired ones read back exactly afterwards.
    let o = run(&["volume", "scrub", s(&m[0])]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let lost = out
        .lines()
        .filter(|l| l.contains("these bytes are lost"))
        .count();
    assert_eq!(o.status.success(), lost == 0, "{}", text(&o));
    let o = run(&["volume", "scrub", "--no-repair", s(&m[0])]);
    let again = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(
        bad_count(&again, "scrubbed volume") as usize,
        lost,
        "{again}"
    );
    if lost == 0 {
        export_equals(&m[0], "clip", &clip, a.path());
    }
}

/// GET `path` on `addr` (HTTP/1.1, `Connection: close`) with `extra` header lines: the
/// status and the body.
fn http_get(addr: &str, path: &str, extra: &str) -> (u16, Vec<u8>) {
    use std::io::Write;
    let mut sock = std::net::TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    write!(
        sock,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    let _ = sock.read_to_end(&mut out);
    let Some(end) = out.windows(4).position(|w| w == b"\r\n\r\n") else {
        return (0, Vec::new());
    };
    let head = String::from_utf8_lossy(&out[..end]).into_owned();
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, out.split_off(end + 4))
}

/// The background scrub of `penstock serve` (`[volumes] scrub_rate_bytes_per_s`,
/// `scrub_interval_ms`): a block of one copy of a served mirrored volume is overwritten while
/// an HTTP reader streams the partition over and over; the server's scrub finds it and
/// rewrites it from the other copy (waited for on its metric), every response the reader got
/// is byte-exact, and afterwards `volume scrub --no-repair` finds nothing bad. (A reader
/// repairs what it reads too: this one reads from the partition's second MiB on, so the
/// bad block, in the first, is the scrub's to find.)
#[test]
fn the_background_scrub_of_serve_repairs_a_bad_block_while_a_reader_streams() {
    let (a, b) = match two_devices() {
        Ok(d) => d,
        Err(why) => {
            eprintln!("SKIPPED: a mirror needs two devices: {why}");
            return;
        }
    };
    if !uring_works(a.path()) {
        return;
    }
    let m: Vec<PathBuf> = vec![a.path().join("b0"), b.path().join("b1")];
    ok(&[
        "volume",
        "create",
        "bg",
        "--mirror",
        "2",
        "--member-size",
        "40MiB",
        "--member",
        s(&m[0]),
        "--member",
        s(&m[1]),
    ]);
    let clip = data(20 * MIB + 4321, 50);
    let src = a.path().join("clip.in");
    std::fs::write(&src, &clip).unwrap();
    ok(&["volume", "import", s(&m[0]), "clip", s(&src)]);
    let start = data_start(&ok(&["volume", "ls", s(&m[0])]));

    let root = a.path().join("www");
    std::fs::create_dir(&root).unwrap();
    let conf = a.path().join("penstock.toml");
    std::fs::write(
        &conf,
        format!(
            "[rtsp]\nlisten = \"\"\n[control]\nlisten = \"\"\n[http]\nlisten = \"127.0.0.1:0\"\nroot = \"{}\"\n\
             [volumes]\nbg = \"{}\"\nscrub_rate_bytes_per_s = \"400MB/s\"\nscrub_interval_ms = \"100ms\"\n",
            root.display(),
            m[0].display()
        ),
    )
    .unwrap();
    let log = a.path().join("serve.log");
    let mut child = penstock()
        .args(["serve", "--no-control-unix", "--config"])
        .arg(&conf)
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let line = common::start_line(&mut child);
    let (http, _) = common::serve_addresses(&line);
    let metric = |name: &str| {
        common::scrape(&http)
            .and_then(|p| common::sample(&p, name))
            .unwrap_or_else(|| panic!("no {name} on the metrics page"))
    };
    assert_eq!(metric("penstock_volume_scrub_bad_units_total"), 0.0);

    // The reader: the whole partition, again and again, until told to stop.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (http, stop, clip) = (http.clone(), stop.clone(), clip.clone());
        std::thread::spawn(move || {
            let mut rounds = 0u32;
            let want = &clip[MIB..];
            while !stop.load(std::sync::atomic::Ordering::Acquire) || rounds < 2 {
                let (code, body) =
                    http_get(&http, "/vol/bg/clip", &format!("Range: bytes={MIB}-\r\n"));
                assert_eq!(code, 206, "round {rounds}");
                assert_eq!(body.len(), want.len(), "round {rounds}: length");
                assert!(body == want, "round {rounds}: the body differs");
                rounds += 1;
            }
            rounds
        })
    };

    // 64 KiB (16 units) of random bytes over the second copy's first data block.
    scribble(&m[1], start, &data(64 << 10, 51));
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    loop {
        if metric("penstock_volume_scrub_repaired_units_total") >= 16.0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the background scrub repaired nothing in 300 s: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let repaired = metric("penstock_volume_scrub_repaired_units_total");
    assert_eq!(metric("penstock_volume_scrub_bad_units_total"), repaired);
    assert!(metric("penstock_volume_checksum_repairs_total") >= repaired);
    assert!(metric("penstock_volume_scrub_read_bytes_total") >= 2.0 * clip.len() as f64);
    assert_eq!(metric("penstock_volume_scrub_errors_total"), 0.0);
    stop.store(true, std::sync::atomic::Ordering::Release);
    let rounds = reader.join().expect("every round byte-exact");
    assert!(rounds >= 2);
    let (code, body) = http_get(&http, "/vol/bg/clip", "");
    assert_eq!(code, 200);
    assert!(body == clip, "the whole partition differs after the scrub");

    // Repaired on the member itself: a scrub that repairs nothing finds nothing bad.
    assert_eq!(
        bad_count(
            &ok(&["volume", "scrub", s(&m[0]), "--no-repair"]),
            "scrubbed volume"
        ),
        0
    );
    terminate(&mut child);
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        said.contains("volume scrub: partition bg/clip block 0"),
        "{said}"
    );
    assert!(said.contains("repaired from the other copy"), "{said}");
}

/// SIGTERM to `child`, then waits for it.
fn terminate(child: &mut std::process::Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

/// A member shorter than recorded (a plain file cut short: by hand, or a power cut that lost
/// its growth — found by tests/powercut.rs) is rebuilt in place by `check --repair`, which
/// must extend it first: it used to copy the blocks, say "consistent", and leave the member
/// short, so the next `check` found it degraded again.
#[test]
fn check_repair_extends_a_member_shorter_than_recorded() {
    let Some((a, b)) = penstock_testreq::require_ok("two devices for a mirror", two_devices())
    else {
        return;
    };
    if !uring_works(a.path()) {
        return;
    }
    let (m0, m1) = (a.path().join("m0"), b.path().join("m1"));
    ok(&[
        "volume",
        "create",
        "short",
        "--mirror",
        "2",
        "--member-size",
        "8MiB",
        "--member",
        s(&m0),
        "--member",
        s(&m1),
    ]);
    let bytes = data(3 * MIB + 12345, 31);
    let src = a.path().join("clip.in");
    std::fs::write(&src, &bytes).unwrap();
    ok(&["volume", "import", s(&m0), "clip", s(&src)]);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&m1)
        .unwrap()
        .set_len(3 * MIB as u64)
        .unwrap();
    let ls = ok(&["volume", "ls", s(&m0)]);
    assert!(
        member_line(&ls, 1).contains("shorter than recorded"),
        "{ls}"
    );
    let fixed = ok(&["volume", "check", "--repair", s(&m0)]);
    assert!(fixed.contains("is consistent"), "{fixed}");
    ok(&["volume", "check", s(&m0)]);
    assert_eq!(std::fs::metadata(&m1).unwrap().len(), 8 * MIB as u64);
    export_equals(&m1, "clip", &bytes, a.path());
}
