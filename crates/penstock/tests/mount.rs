//! `penstock volume mount` (issue 21 item 2) through real FUSE, real files and real tools
//! (cp, rsync, ffprobe, sha256sum, fusermount3). Each test says `SKIPPED: …` (counted by
//! penstock_testreq; a failure under PENSTOCK_TEST_REQUIRE=all) and returns when /dev/fuse or
//! the permission to mount is missing. No test asserts a duration.

mod common;

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn penstock() -> Command {
    Command::new(env!("CARGO_BIN_EXE_penstock"))
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
    let o = penstock().args(args).output().expect("run penstock");
    assert!(o.status.success(), "penstock {args:?} failed: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[track_caller]
fn sh(cmd: &mut Command) -> String {
    let o = cmd.output().expect("run tool");
    assert!(o.status.success(), "{cmd:?} failed: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
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

/// Creates volume `name` of `members` members of `size` each in `dir`; returns member 0.
fn create(dir: &Path, name: &str, members: usize, size: &str, extra: &[&str]) -> PathBuf {
    let paths: Vec<PathBuf> = (0..members)
        .map(|i| dir.join(format!("{name}-m{i}")))
        .collect();
    let mut args = vec!["volume", "create", name, "--member-size", size];
    args.extend_from_slice(extra);
    for p in &paths {
        args.push("--member");
        args.push(s(p));
    }
    ok(&args);
    paths[0].clone()
}

fn mounted(dir: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = dir.to_string_lossy();
    info.lines().any(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let tail: Vec<&str> = l.split(" - ").nth(1).unwrap_or("").split(' ').collect();
        f.len() > 4
            && f[4] == want
            && tail.len() > 1
            && tail[0].starts_with("fuse")
            && tail[1].starts_with("penstock:")
    })
}

/// A foreground `penstock volume mount` child; unmounted (and reaped) when dropped.
struct Mount {
    child: Option<Child>,
    dir: PathBuf,
    stderr_path: PathBuf,
}

impl Mount {
    fn start(member: &Path, dir: &Path, extra: &[&str]) -> Result<Mount, String> {
        std::fs::create_dir_all(dir).unwrap();
        let dir = std::fs::canonicalize(dir).unwrap();
        let stderr_path = dir.with_extension("stderr");
        let child = penstock()
            .args(["volume", "mount", "--foreground", s(member), s(&dir)])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(File::create(&stderr_path).unwrap())
            .spawn()
            .expect("spawn penstock volume mount");
        let mut m = Mount {
            child: Some(child),
            dir,
            stderr_path,
        };
        let started = Instant::now();
        while !mounted(&m.dir) {
            if let Some(st) = m.child.as_mut().unwrap().try_wait().unwrap() {
                m.child = None;
                return Err(format!("exited {st}: {}", m.stderr()));
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "not mounted after 30 s: {}",
                m.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(m)
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Waits for the server to exit (after an unmount or a signal); its status.
    fn wait(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        let started = Instant::now();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return st;
            }
            if started.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                panic!("mount server did not exit within 60 s: {}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        // Anything mounted there (also a mount whose server died): detach it.
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let want = self.dir.to_string_lossy();
        if info
            .lines()
            .any(|l| l.split(' ').nth(4) == Some(want.as_ref()))
        {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Mounts, or says SKIPPED and returns `None` when FUSE is unavailable here.
fn mount_or_skip(member: &Path, dir: &Path, extra: &[&str]) -> Option<Mount> {
    if !penstock_testreq::require_fuse() {
        return None;
    }
    match Mount::start(member, dir, extra) {
        Ok(m) => Some(m),
        Err(e) if e.contains("Operation not permitted") || e.contains("Permission denied") => {
            penstock_testreq::require_that("permission to mount FUSE", Some(e));
            None
        }
        Err(e) => panic!("mount failed: {e}"),
    }
}

fn sha256(path: &Path) -> String {
    let out = sh(Command::new("sha256sum").arg(path));
    out.split_whitespace().next().unwrap().to_string()
}

fn errno<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    r.expect_err("should fail")
        .raw_os_error()
        .expect("an errno")
}

#[test]
fn cp_of_200_mb_onto_the_mount_and_back_is_byte_exact_and_tools_work() {
    let tmp = tempfile::tempdir().unwrap();
    let member = create(tmp.path(), "big", 2, "160MiB", &[]);
    let Some(mut m) = mount_or_skip(&member, &tmp.path().join("mnt"), &[]) else {
        return;
    };
    let src = tmp.path().join("src.bin");
    std::fs::write(&src, data(200_000_000, 1)).unwrap();
    sh(Command::new("cp").arg(&src).arg(m.path("big.bin")));
    let back = tmp.path().join("back.bin");
    sh(Command::new("cp").arg(m.path("big.bin")).arg(&back));
    assert_eq!(sha256(&src), sha256(&back));
    assert_eq!(sha256(&src), sha256(&m.path("big.bin")));
    assert_eq!(
        std::fs::metadata(m.path("big.bin")).unwrap().len(),
        200_000_000
    );
    let ls = sh(Command::new("ls").arg("-l").arg(&m.dir));
    assert!(ls.contains("big.bin") && ls.contains("200000000"), "{ls}");
    // df: the volume's blocks (2 × 158 MiB of data blocks) with the partition's in use.
    let df = sh(Command::new("df")
        .args(["-B1", "--output=size,used"])
        .arg(&m.dir));
    let nums: Vec<u64> = df
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(nums.len(), 2, "{df}");
    assert!(
        nums[0] >= 300 * MIB && nums[0] <= 320 * MIB,
        "df size: {df}"
    );
    assert!(
        nums[1] >= 200_000_000 && nums[1] <= nums[0],
        "df used: {df}"
    );

    // ffprobe reads a TS from the mount.
    if let Some(clip) = common::mpeg2_ts_clip("mount", 3) {
        sh(Command::new("cp").arg(&clip).arg(m.path("clip.ts")));
        if penstock_testreq::require("ffprobe") {
            let out = sh(Command::new("ffprobe")
                .args([
                    "-v",
                    "error",
                    "-show_entries",
                    "format=format_name,duration",
                ])
                .args(["-of", "default=nw=1"])
                .arg(m.path("clip.ts")));
            assert!(out.contains("format_name=mpegts"), "{out}");
            let d: f64 = out
                .lines()
                .find_map(|l| l.strip_prefix("duration="))
                .unwrap()
                .parse()
                .unwrap();
            assert!((d - 3.0).abs() < 0.5, "{out}");
        }
        assert_eq!(sha256(&clip), sha256(&m.path("clip.ts")));
        let _ = std::fs::remove_dir_all(clip.parent().unwrap());
    }

    // fusermount3 -u unmounts; the server exits 0 and the volume checks clean.
    // (mount_or_skip required fusermount3.)
    sh(Command::new("fusermount3").arg("-u").arg(&m.dir));
    let st = m.wait();
    assert!(st.success(), "{st}: {}", m.stderr());
    ok(&["volume", "check", s(&member)]);
    let exported = tmp.path().join("exported.bin");
    ok(&["volume", "export", s(&member), "big.bin", s(&exported)]);
    assert_eq!(sha256(&src), sha256(&exported));
}

#[test]
fn rsync_of_a_tree_of_small_files_round_trips() {
    if !penstock_testreq::require("rsync") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // The mount is one flat directory (a partition is a file; directories are refused with
    // EOPNOTSUPP), so the tree is 500 files side by side, each of one 64 KiB block at most:
    // more than the 256 partitions of format version 3, so the table is version 4's (written
    // as version 5, which adds the block checksums).
    let member = create(
        tmp.path(),
        "many",
        1,
        "64MiB",
        &["--block", "64KiB", "--stripe-unit", "64KiB"],
    );
    let Some(mut m) = mount_or_skip(&member, &tmp.path().join("mnt"), &[]) else {
        return;
    };
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    for i in 0..500u64 {
        let len = (i * 331) % 60_000;
        std::fs::write(src.join(format!("f{i:03}.idx")), data(len as usize, i)).unwrap();
    }
    sh(Command::new("rsync")
        .arg("-a")
        .arg(format!("{}/", s(&src)))
        .arg(&m.dir));
    let back = tmp.path().join("back");
    sh(Command::new("rsync")
        .arg("-a")
        .arg(format!("{}/", s(&m.dir)))
        .arg(&back));
    sh(Command::new("diff").arg("-r").arg(&src).arg(&back));
    // A second run finds everything the same size and copies nothing that differs.
    sh(Command::new("rsync")
        .arg("-a")
        .arg("--checksum")
        .arg(format!("{}/", s(&src)))
        .arg(&m.dir));
    sh(Command::new("diff").arg("-r").arg(&src).arg(&m.dir));
    // df -i: the partition table's bound is the file count, 500 of it used.
    let st = rustix::fs::statvfs(&m.dir).unwrap();
    assert_eq!((st.f_files, st.f_ffree), (2048, 2048 - 500));
    sh(Command::new("umount").arg(&m.dir));
    assert!(m.wait().success(), "{}", m.stderr());
    ok(&["volume", "check", s(&member)]);
}

/// The partition table bounds the files of a mount (PARTITIONS_MAX = 2048): the file past it
/// is ENOSPC (as a file system out of inodes), `df -i` shows the table full, the files already
/// there are untouched, and the CLI says why `add-partition` is refused.
#[test]
fn a_full_partition_table_is_enospc_on_the_mount_and_explained_by_the_cli() {
    let tmp = tempfile::tempdir().unwrap();
    let member = create(
        tmp.path(),
        "full",
        1,
        "16MiB",
        &["--block", "64KiB", "--stripe-unit", "64KiB"],
    );
    let Some(mut m) = mount_or_skip(&member, &tmp.path().join("mnt"), &[]) else {
        return;
    };
    std::fs::write(m.path("first.idx"), b"first").unwrap();
    for i in 1..2048 {
        // Empty files own no block: only the table fills.
        File::create(m.path(&format!("e{i:04}"))).unwrap();
    }
    assert_eq!(errno(File::create(m.path("one-more"))), libc::ENOSPC);
    assert!(!m.path("one-more").exists());
    let st = rustix::fs::statvfs(&m.dir).unwrap();
    assert_eq!((st.f_files, st.f_ffree), (2048, 0));
    assert_eq!(std::fs::read(m.path("first.idx")).unwrap(), b"first");
    // Removing one makes room for one.
    std::fs::remove_file(m.path("e0001")).unwrap();
    std::fs::write(m.path("last.idx"), b"last").unwrap();
    assert_eq!(std::fs::read_dir(&m.dir).unwrap().count(), 2048);
    sh(Command::new("umount").arg(&m.dir));
    assert!(m.wait().success(), "{}", m.stderr());
    ok(&["volume", "check", s(&member)]);
    let o = penstock()
        .args([
            "volume",
            "add-partition",
            s(&member),
            "more",
            "--size",
            "64KiB",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("already has 2048 partitions") && err.contains("volume rm"),
        "{err}"
    );
}

#[test]
fn posix_operations_and_bad_input() {
    let tmp = tempfile::tempdir().unwrap();
    let member = create(tmp.path(), "ops", 2, "24MiB", &[]);
    let Some(mut m) = mount_or_skip(&member, &tmp.path().join("mnt"), &[]) else {
        return;
    };
    let a = m.path("a.idx");
    // create, write, append, read back.
    std::fs::write(&a, b"hello ").unwrap();
    OpenOptions::new()
        .append(true)
        .open(&a)
        .unwrap()
        .write_all(b"world")
        .unwrap();
    assert_eq!(std::fs::read(&a).unwrap(), b"hello world");
    // truncate: shorter, then longer (the new bytes read as zeros).
    let f = OpenOptions::new().write(true).open(&a).unwrap();
    f.set_len(5).unwrap();
    assert_eq!(std::fs::read(&a).unwrap(), b"hello");
    f.set_len(3 * MIB).unwrap();
    drop(f);
    let got = std::fs::read(&a).unwrap();
    assert_eq!(got.len() as u64, 3 * MIB);
    assert!(&got[..5] == b"hello" && got[5..].iter().all(|b| *b == 0));
    // A write past the end: the gap reads as zeros.
    let b = m.path("b.idx");
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&b)
        .unwrap();
    f.write_all_at(b"tail", 100_000).unwrap();
    drop(f);
    let got = std::fs::read(&b).unwrap();
    assert_eq!(got.len(), 100_004);
    assert!(got[..100_000].iter().all(|x| *x == 0) && &got[100_000..] == b"tail");
    // rename, rename over an existing file, unlink.
    std::fs::rename(&b, m.path("c.idx")).unwrap();
    assert!(!b.exists());
    assert_eq!(std::fs::read(m.path("c.idx")).unwrap().len(), 100_004);
    std::fs::rename(m.path("c.idx"), &a).unwrap();
    assert_eq!(std::fs::read(&a).unwrap().len(), 100_004);
    std::fs::remove_file(&a).unwrap();
    assert!(!a.exists());
    assert_eq!(errno(std::fs::read(&a)), libc::ENOENT);
    // O_EXCL on an existing one.
    std::fs::write(m.path("d"), b"d").unwrap();
    let r = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(m.path("d"));
    assert_eq!(errno(r), libc::EEXIST);
    // O_TRUNC empties it.
    std::fs::write(m.path("d"), b"").unwrap();
    assert_eq!(std::fs::metadata(m.path("d")).unwrap().len(), 0);

    // Names the volume refuses.
    assert_eq!(errno(File::create(m.path("a b"))), libc::EINVAL);
    assert_eq!(errno(File::create(m.path("é"))), libc::EINVAL);
    assert_eq!(
        errno(File::create(m.path(&"n".repeat(65)))),
        libc::ENAMETOOLONG
    );
    assert_eq!(
        errno(File::create(m.path(&"n".repeat(300)))),
        libc::ENAMETOOLONG
    );
    // Unsupported operations.
    let d = m.path("d");
    assert_eq!(errno(std::fs::create_dir(m.path("sub"))), libc::EOPNOTSUPP);
    assert_eq!(
        errno(std::fs::hard_link(&d, m.path("hl"))),
        libc::EOPNOTSUPP
    );
    assert_eq!(
        errno(std::os::unix::fs::symlink("d", m.path("sl"))),
        libc::EOPNOTSUPP
    );
    let st = Command::new("mkfifo").arg(m.path("fifo")).output().unwrap();
    assert!(!st.status.success());
    let st = Command::new("setfattr")
        .args(["-n", "user.x", "-v", "1"])
        .arg(&d)
        .output();
    if let Ok(st) = st {
        assert!(!st.status.success(), "setfattr should fail");
    }
    // Past the partition's limits: beyond every free block is EFBIG, partly beyond ENOSPC.
    let f = OpenOptions::new().write(true).open(&d).unwrap();
    assert_eq!(errno(f.write_at(b"x", 1 << 40)), libc::EFBIG);
    assert_eq!(errno(f.set_len(1 << 40)), libc::EFBIG);
    let big = vec![7u8; 8 * MIB as usize];
    let mut at = 0u64;
    let full = loop {
        match f.write_at(&big, at) {
            Ok(n) => at += n as u64,
            Err(e) => break e,
        }
        assert!(at < 100 * MIB, "never full");
    };
    assert!(
        matches!(full.raw_os_error(), Some(libc::ENOSPC | libc::EFBIG)),
        "{full}"
    );
    assert!(at >= 40 * MIB, "only {at} bytes fit");
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(std::fs::metadata(&d).unwrap().len(), at);
    // Whatever was refused, the file system still works and the volume is consistent.
    std::fs::remove_file(&d).unwrap();
    std::fs::write(m.path("e"), b"after").unwrap();
    assert_eq!(std::fs::read(m.path("e")).unwrap(), b"after");
    // The name the mount keeps unlinked open files under cannot be made.
    assert_eq!(errno(File::create(m.path(".unlinked.1.2"))), libc::EINVAL);
    sh(Command::new("umount").arg(&m.dir));
    assert!(m.wait().success(), "{}", m.stderr());
    ok(&["volume", "check", s(&member)]);
}

#[test]
fn readers_see_a_concurrent_writers_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let member = create(tmp.path(), "rw", 2, "40MiB", &[]);
    let Some(mut m) = mount_or_skip(&member, &tmp.path().join("mnt"), &[]) else {
        return;
    };
    let path = m.path("live.ts");
    let chunk = 64 * 1024;
    let chunks = 256;
    let all = data(chunk * chunks, 9);
    let mut w = File::create(&path).unwrap();
    // A read after a write returns the written bytes (on another descriptor too).
    w.write_all(&all[..chunk]).unwrap();
    let mut r = File::open(&path).unwrap();
    let mut got = vec![0; chunk];
    r.read_exact(&mut got).unwrap();
    assert!(got == all[..chunk]);
    // Two readers follow the writer: every byte any of them reads is the byte written there,
    // and they never read past what the writer has written.
    std::thread::scope(|sc| {
        let readers: Vec<_> = (0..2)
            .map(|k| {
                let path = path.clone();
                let all = &all;
                sc.spawn(move || {
                    let mut f = File::open(&path).unwrap();
                    let mut pos = 0usize;
                    let mut buf = vec![0; 100_000 + k * 7];
                    let started = Instant::now();
                    while pos < all.len() {
                        assert!(started.elapsed() < Duration::from_secs(120), "reader stuck");
                        f.seek(SeekFrom::Start(pos as u64)).unwrap();
                        let n = f.read(&mut buf).unwrap();
                        assert!(buf[..n] == all[pos..pos + n], "reader {k} at {pos}");
                        pos += n;
                        if n == 0 {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                    }
                })
            })
            .collect();
        for i in 1..chunks {
            w.write_all(&all[i * chunk..(i + 1) * chunk]).unwrap();
        }
        for r in readers {
            r.join().unwrap();
        }
    });
    // A rewrite inside the file is seen by a reader opened before it.
    w.seek(SeekFrom::Start(10)).unwrap();
    w.write_all(b"REWRITTEN").unwrap();
    let mut head = [0u8; 19];
    r.read_exact_at(&mut head, 10).unwrap();
    assert_eq!(&head[..9], b"REWRITTEN");
    assert_eq!(&head[9..], &all[19..29]);
    drop((w, r));
    sh(Command::new("umount").arg(&m.dir));
    assert!(m.wait().success(), "{}", m.stderr());
    ok(&["volume", "check", s(&member)]);
}

#[test]
fn sigterm_unmounts_and_every_fsynced_byte_survives() {
    let tmp = tempfile::tempdir().unwrap();
    let member = create(tmp.path(), "term", 2, "24MiB", &[]);
    let Some(mut m) = mount_or_skip(&member, &tmp.path().join("mnt"), &[]) else {
        return;
    };
    let synced = data(5 * MIB as usize + 123, 3);
    let mut f = File::create(m.path("synced.ts")).unwrap();
    f.write_all(&synced).unwrap();
    f.sync_all().unwrap();
    // Written after the fsync, closed without one: committed at close or at unmount.
    f.write_all(b"more").unwrap();
    drop(f);
    let pid = m.child.as_ref().unwrap().id() as i32;
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let st = m.wait();
    assert!(st.success(), "{st}: {}", m.stderr());
    assert!(!mounted(&m.dir));
    ok(&["volume", "check", s(&member)]);
    let out = tmp.path().join("out");
    ok(&["volume", "export", s(&member), "synced.ts", s(&out)]);
    let back = std::fs::read(&out).unwrap();
    assert!(back.len() >= synced.len());
    assert!(back[..synced.len()] == synced[..], "fsynced bytes differ");
}

#[test]
fn a_damaged_volume_mounts_read_only_or_is_refused_with_a_message() {
    let tmp = tempfile::tempdir().unwrap();
    let member = create(tmp.path(), "dmg", 1, "8MiB", &[]);
    let f = tmp.path().join("p");
    std::fs::write(&f, b"payload").unwrap();
    let imported = penstock()
        .args(["volume", "import", s(&member), "p", s(&f)])
        .output()
        .unwrap();
    // The import needs io_uring (its only reason to fail here).
    if !penstock_testreq::require_that(
        "io_uring",
        (!imported.status.success()).then(|| text(&imported)),
    ) {
        return;
    }
    // Damage the older metadata copy: the volume still opens from the newer one, and
    // `check` reports the damaged slot.
    let mem = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&member)
        .unwrap();
    let seq = |off: u64| {
        let mut h = [0u8; 64];
        mem.read_exact_at(&mut h, off).unwrap();
        penstock_core::volume::format::header_seq(&h).unwrap_or(0)
    };
    let older = if seq(0) < seq(1 << 20) { 0 } else { 1 << 20 };
    mem.write_all_at(&[0xAB; 4096], older + 100).unwrap();
    drop(mem);
    let check = penstock()
        .args(["volume", "check", s(&member)])
        .output()
        .unwrap();
    match mount_or_skip(&member, &tmp.path().join("mnt"), &[]) {
        None => {}
        Some(mut m) => {
            assert!(!check.status.success(), "check: {}", text(&check));
            {
                assert!(m.stderr().contains("mounted read-only"), "{}", m.stderr());
                assert_eq!(errno(File::create(m.path("new"))), libc::EROFS);
            }
            assert_eq!(std::fs::read(m.path("p")).unwrap(), b"payload");
            sh(Command::new("umount").arg(&m.dir));
            assert!(m.wait().success());
        }
    }
    // Both copies gone: refused, with a message.
    let mem = OpenOptions::new().write(true).open(&member).unwrap();
    mem.write_all_at(&vec![0u8; 2 << 20], 0).unwrap();
    drop(mem);
    let dir = tmp.path().join("mnt2");
    std::fs::create_dir(&dir).unwrap();
    let o = penstock()
        .args(["volume", "mount", s(&member), s(&dir)])
        .output()
        .unwrap();
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("cannot be mounted"),
        "{}",
        text(&o)
    );
    assert!(!mounted(&std::fs::canonicalize(&dir).unwrap()));
}

/// The partitions `volume ls` lists (first word of each partition line).
fn listed(member: &Path) -> String {
    ok(&["volume", "ls", s(member)])
}

/// Waits (at most 30 s) until no hidden partition is left: the kernel sends FUSE's release
/// after close(2) has returned.
#[track_caller]
fn no_hidden_left(member: &Path) {
    let started = Instant::now();
    while listed(member).contains(".unlinked.") {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "still there after the last close: {}",
            listed(member)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn unlink_or_rename_over_an_open_file_keeps_it_until_the_last_close() {
    let tmp = tempfile::tempdir().unwrap();
    let member = create(tmp.path(), "ul", 2, "24MiB", &[]);
    let Some(mut m) = mount_or_skip(&member, &tmp.path().join("mnt"), &[]) else {
        return;
    };
    let a = m.path("a.ts");
    let old = data(3 * MIB as usize, 1);
    std::fs::write(&a, &old).unwrap();
    let mut w = OpenOptions::new().read(true).write(true).open(&a).unwrap();
    let r = File::open(&a).unwrap();
    // unlink: the name goes at once ...
    std::fs::remove_file(&a).unwrap();
    assert_eq!(errno(std::fs::metadata(&a)), libc::ENOENT);
    let names: Vec<String> = std::fs::read_dir(&m.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.is_empty(), "listed after unlink: {names:?}");
    // ... the open file stays readable and writable, and has no link.
    assert_eq!(r.metadata().unwrap().len(), old.len() as u64);
    assert_eq!(
        std::os::unix::fs::MetadataExt::nlink(&r.metadata().unwrap()),
        0
    );
    let mut got = vec![0u8; old.len()];
    r.read_exact_at(&mut got, 0).unwrap();
    assert!(got == old);
    w.seek(SeekFrom::End(0)).unwrap();
    w.write_all(b"more").unwrap();
    w.write_all_at(b"HEAD", 0).unwrap();
    let mut head = [0u8; 4];
    r.read_exact_at(&mut head, 0).unwrap();
    assert_eq!(&head, b"HEAD");
    let mut tail = [0u8; 4];
    r.read_exact_at(&mut tail, old.len() as u64).unwrap();
    assert_eq!(&tail, b"more");
    // A new file of the same name is another partition.
    let new = data(MIB as usize, 2);
    std::fs::write(&a, &new).unwrap();
    assert!(std::fs::read(&a).unwrap() == new);
    r.read_exact_at(&mut head, 0).unwrap();
    assert_eq!(&head, b"HEAD", "the unlinked file changed with the new one");
    // Both exist in the volume while the old one is open; the last close removes it.
    assert!(
        listed(&member).contains(".unlinked."),
        "{}",
        listed(&member)
    );
    drop(w);
    assert!(
        listed(&member).contains(".unlinked."),
        "a reader is still open"
    );
    drop(r);
    no_hidden_left(&member);
    assert!(std::fs::read(&a).unwrap() == new);

    // rename over an open file: its readers keep the old bytes, the name has the new ones.
    let b = m.path("b.idx");
    std::fs::write(&b, b"old b").unwrap();
    let rb = File::open(&b).unwrap();
    std::fs::write(m.path("c.idx"), b"new c").unwrap();
    let wc = OpenOptions::new()
        .write(true)
        .open(m.path("c.idx"))
        .unwrap();
    std::fs::rename(m.path("c.idx"), &b).unwrap();
    assert_eq!(std::fs::read(&b).unwrap(), b"new c");
    let mut got = [0u8; 5];
    rb.read_exact_at(&mut got, 0).unwrap();
    assert_eq!(&got, b"old b");
    // The renamed file's open writer writes under its new name.
    wc.write_all_at(b"N", 0).unwrap();
    drop(wc);
    assert_eq!(std::fs::read(&b).unwrap(), b"New c");
    drop(rb);
    no_hidden_left(&member);

    // An unlinked file still open at the unmount is removed by it.
    let kept = File::open(&b).unwrap();
    std::fs::remove_file(&b).unwrap();
    let mut got = [0u8; 5];
    kept.read_exact_at(&mut got, 0).unwrap();
    assert_eq!(&got, b"New c");
    drop(kept);
    sh(Command::new("umount").arg(&m.dir));
    assert!(m.wait().success(), "{}", m.stderr());
    assert!(!listed(&member).contains(".unlinked."));
    ok(&["volume", "check", s(&member)]);
}

/// The I/O priority class `ionice -p TID` reports for every thread of `pid`.
fn ionice_of_threads(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|t| {
            let tid = t.unwrap().file_name().to_string_lossy().into_owned();
            sh(Command::new("ionice").args(["-p", &tid]))
                .trim()
                .to_string()
        })
        .collect()
}

/// Pages of `path` in the page cache (cachestat).
fn cached_bytes(path: &Path) -> u64 {
    let f = File::open(path).unwrap();
    use std::os::fd::AsFd;
    let (cached, _) =
        penstock_uring::sys::cached_pages(f.as_fd(), 0, std::fs::metadata(path).unwrap().len())
            .expect("cachestat");
    cached * 4096
}

#[test]
fn class_sets_the_io_priority_and_write_behind_bounds_the_cache_it_leaves() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src.bin");
    let body = data(48 * MIB as usize, 5);
    std::fs::write(&src, &body).unwrap();
    for (class, want, write_behind) in [("bulk", "idle", "4MiB"), ("rt", "realtime: prio 0", "0")] {
        let member = create(tmp.path(), class, 1, "80MiB", &[]);
        let Some(mut m) = mount_or_skip(
            &member,
            &tmp.path().join(format!("mnt-{class}")),
            &["--class", class, "--write-behind", write_behind],
        ) else {
            return;
        };
        let pid = m.child.as_ref().unwrap().id();
        for got in ionice_of_threads(pid) {
            assert_eq!(got, want, "--class {class}");
        }
        // Evict the member's pages, copy onto the mount, close (commit): with write-behind
        // at most about its bound stays cached, without it the whole copy does.
        let f = File::open(&member).unwrap();
        rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
        sh(Command::new("cp").arg(&src).arg(m.path("copy.ts")));
        let cached = cached_bytes(&member);
        if write_behind == "0" {
            assert!(
                cached >= 40 * MIB,
                "--write-behind 0: {cached} bytes cached"
            );
        } else {
            // The bound, plus the metadata slots and what the last close wrote.
            assert!(
                cached <= 12 * MIB,
                "--write-behind 4MiB: {cached} bytes cached"
            );
        }
        assert_eq!(sha256(&m.path("copy.ts")), sha256(&src));
        sh(Command::new("umount").arg(&m.dir));
        assert!(m.wait().success(), "{}", m.stderr());
        ok(&["volume", "check", s(&member)]);
    }
}

#[test]
fn an_unlinked_file_left_by_a_killed_mount_is_removed_by_the_next_mount() {
    let tmp = tempfile::tempdir().unwrap();
    let member = create(tmp.path(), "orphan", 1, "16MiB", &[]);
    let Some(mut m) = mount_or_skip(&member, &tmp.path().join("mnt1"), &[]) else {
        return;
    };
    std::fs::write(m.path("gone.idx"), b"bytes").unwrap();
    std::fs::write(m.path("kept.idx"), b"kept").unwrap();
    let open = File::open(m.path("gone.idx")).unwrap();
    std::fs::remove_file(m.path("gone.idx")).unwrap();
    assert!(listed(&member).contains(".unlinked."));
    // SIGKILL: no unmount, no cleanup.
    let mut child = m.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    drop(open);
    drop(m);
    assert!(
        listed(&member).contains(".unlinked."),
        "{}",
        listed(&member)
    );
    let Some(mut m) = mount_or_skip(&member, &tmp.path().join("mnt2"), &[]) else {
        return;
    };
    let ls = listed(&member);
    assert!(!ls.contains(".unlinked."), "{ls}");
    assert_eq!(std::fs::read(m.path("kept.idx")).unwrap(), b"kept");
    assert_eq!(errno(std::fs::metadata(m.path("gone.idx"))), libc::ENOENT);
    sh(Command::new("umount").arg(&m.dir));
    assert!(m.wait().success(), "{}", m.stderr());
    ok(&["volume", "check", s(&member)]);
}

#[test]
fn class_rt_without_the_privilege_is_refused_with_a_message() {
    if !penstock_testreq::require("setpriv") {
        return;
    }
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_penstock"))
        .args([
            "volume",
            "mount",
            "--foreground",
            "--class",
            "rt",
            "/nonexistent-volume",
            "/nonexistent-dir",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--class rt") && err.contains("IOPRIO_CLASS_RT needs CAP_SYS_ADMIN"),
        "{}",
        text(&o)
    );
    // bulk (idle) needs no privilege: the same command gets as far as the directory.
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_penstock"))
        .args([
            "volume",
            "mount",
            "--foreground",
            "/nonexistent-volume",
            "/nonexistent-dir",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("/nonexistent-dir") && !err.contains("--class"),
        "{}",
        text(&o)
    );
}

/// `B blocks` of each `member …` line of `volume ls`, summed.
fn member_blocks(member: &Path) -> u64 {
    listed_all(member)
        .lines()
        .filter(|l| l.starts_with("member "))
        .map(|l| {
            l.split(", ")
                .find_map(|p| p.strip_suffix(" blocks"))
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("no block count in {l:?}"))
        })
        .sum()
}

fn listed_all(member: &Path) -> String {
    ok(&["volume", "ls", s(member)])
}

/// Issue 30, item 7: `df` on a mirrored mount counts what files can use, half the blocks
/// (it showed the raw space, twice that, and a copy ran out at half of what df promised);
/// and a mount's reads verify block checksums: a damaged block of one copy reads exactly
/// (from the other copy) through the mount.
#[test]
fn statfs_of_a_mirrored_mount_counts_usable_space_and_reads_verify_checksums() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(shm) = penstock_testreq::require_ok(
        "two devices (the temp directory and /dev/shm)",
        tempfile::tempdir_in("/dev/shm").map_err(|e| format!("/dev/shm: {e}")),
    ) else {
        return;
    };
    let dev = |p: &Path| std::os::unix::fs::MetadataExt::dev(&std::fs::metadata(p).unwrap());
    if !penstock_testreq::require_that(
        "two devices (the temp directory and /dev/shm)",
        (dev(tmp.path()) == dev(shm.path()))
            .then(|| "the temp directory and /dev/shm are on one device".to_string()),
    ) {
        return;
    }
    let m: Vec<PathBuf> = vec![tmp.path().join("s0"), shm.path().join("s1")];
    ok(&[
        "volume",
        "create",
        "dfm",
        "--mirror",
        "2",
        "--member-size",
        "24MiB",
        "--member",
        s(&m[0]),
        "--member",
        s(&m[1]),
    ]);
    let blocks = member_blocks(&m[0]);
    let Some(mut mnt) = mount_or_skip(&m[0], &tmp.path().join("mnt"), &[]) else {
        return;
    };
    let statfs = |what: &str| -> u64 {
        // %b total blocks, %a available, %S the block size they count in.
        let out = sh(Command::new("stat").args(["-f", "-c", what]).arg(&mnt.dir));
        out.trim().parse().unwrap()
    };
    let frsize = statfs("%S");
    let total_bytes = statfs("%b") * frsize;
    let avail_bytes = statfs("%a") * frsize;
    assert_eq!(
        total_bytes,
        blocks / 2 * MIB,
        "{blocks} blocks over both members"
    );
    assert_eq!(avail_bytes, total_bytes, "nothing written yet");
    // What df promises can be written: a file of all of it (less one block per member, the
    // rounding of a striped partition) is written; twice that is ENOSPC.
    let fits = data((avail_bytes - 2 * MIB) as usize, 70);
    std::fs::write(mnt.path("fits"), &fits).unwrap();
    assert!(
        statfs("%a") * frsize <= 2 * MIB,
        "{} left",
        statfs("%a") * frsize
    );
    let e = std::fs::write(mnt.path("more"), vec![7u8; 4 * MIB as usize]);
    assert!(
        matches!(errno(e), libc::ENOSPC | libc::EFBIG),
        "a write past what df showed"
    );
    let _ = std::fs::remove_file(mnt.path("more"));
    sh(Command::new("umount").arg(&mnt.dir));
    assert!(mnt.wait().success(), "{}", mnt.stderr());

    // Damage the first 64 KiB of member 1's data (the copy of member 0's first block, or its
    // own): the mount's reads come from the good copy, byte-exact.
    let ls = listed_all(&m[0]);
    let start: u64 = ls
        .split("data from byte ")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    let f = OpenOptions::new().write(true).open(&m[1]).unwrap();
    f.write_all_at(&data(64 << 10, 71), start).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let Some(mut mnt) = mount_or_skip(&m[0], &tmp.path().join("mnt"), &[]) else {
        return;
    };
    let back = std::fs::read(mnt.path("fits")).unwrap();
    assert!(back == fits, "the mount read the damaged copy");
    sh(Command::new("umount").arg(&mnt.dir));
    assert!(mnt.wait().success(), "{}", mnt.stderr());
    let out = ok(&["volume", "check", s(&m[0])]);
    assert!(
        out.contains("consistent"),
        "the mount's reads repaired what they met: {out}"
    );
}

/// A file rewritten in place through the mount (bytes below its committed size: sealed
/// ahead of the data) and grown, read back through the mount before and after its commit:
/// every byte right, and `volume check` (which reads and verifies every unit) clean after.
#[test]
fn rewrites_in_place_keep_every_block_checksum_true() {
    let tmp = tempfile::tempdir().unwrap();
    let member = create(tmp.path(), "rw", 2, "16MiB", &[]);
    let Some(mut m) = mount_or_skip(&member, &tmp.path().join("mnt"), &[]) else {
        return;
    };
    let mut want = data(3 * MIB as usize + 333, 80);
    std::fs::write(m.path("f"), &want).unwrap();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.path("f"))
        .unwrap();
    for (at, len, seed) in [
        (MIB + 100, 5000, 81u64),
        (17, 3, 82),
        (3 * MIB - 10, 900, 83),
    ] {
        let bytes = data(len, seed);
        f.write_all_at(&bytes, at).unwrap();
        let end = at as usize + len;
        if end > want.len() {
            want.resize(end, 0);
        }
        want[at as usize..end].copy_from_slice(&bytes);
        // Read back before the commit (unsealed: this mount's own bytes).
        let mut back = vec![0u8; len];
        f.read_exact_at(&mut back, at).unwrap();
        assert_eq!(back, bytes);
    }
    f.sync_all().unwrap();
    drop(f);
    assert!(
        std::fs::read(m.path("f")).unwrap() == want,
        "the file differs"
    );
    sh(Command::new("umount").arg(&m.dir));
    assert!(m.wait().success(), "{}", m.stderr());
    let out = ok(&["volume", "check", s(&member)]);
    assert!(out.contains("0 bad") && out.contains("consistent"), "{out}");
    let exported = tmp.path().join("f.out");
    ok(&["volume", "export", s(&member), "f", s(&exported)]);
    assert!(
        std::fs::read(&exported).unwrap() == want,
        "the export differs"
    );
}
