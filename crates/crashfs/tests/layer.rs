//! The layer itself, on a real FUSE mount: what a cut keeps and what it loses.
//! Needs /dev/fuse and the right to mount (`penstock_testreq::require_fuse`, plus root).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use penstock_crashfs::{CrashFs, Power};

struct Rig {
    backing: tempfile::TempDir,
    mnt: tempfile::TempDir,
}

impl Rig {
    fn new() -> Option<Rig> {
        if !(penstock_testreq::require_fuse() && penstock_testreq::require_root()) {
            return None;
        }
        Some(Rig {
            backing: tempfile::tempdir().expect("backing dir"),
            mnt: tempfile::tempdir().expect("mount point"),
        })
    }

    fn mount(&self, power: &Power) -> CrashFs {
        CrashFs::mount(self.backing.path(), self.mnt.path(), power).expect("mount crashfs")
    }

    fn at(&self, name: &str) -> std::path::PathBuf {
        self.mnt.path().join(name)
    }

    fn durable(&self, name: &str) -> Option<Vec<u8>> {
        std::fs::read(self.backing.path().join(name)).ok()
    }
}

fn fsync_dir(p: &Path) {
    File::open(p)
        .expect("open dir")
        .sync_all()
        .expect("fsync dir");
}

#[test]
fn a_write_without_fsync_is_gone_after_a_cut_and_one_with_fsync_stays() {
    let Some(rig) = Rig::new() else { return };
    std::fs::write(rig.backing.path().join("f"), b"old old old").expect("seed");
    let power = Power::new();
    let fs = rig.mount(&power);
    let f = OpenOptions::new()
        .write(true)
        .open(rig.at("f"))
        .expect("open");
    f.write_all_at(b"NEW", 0).expect("write");
    f.write_all_at(b"tail", 11).expect("extend");
    assert_eq!(
        std::fs::read(rig.at("f")).expect("read back"),
        b"NEW old oldtail"
    );
    assert_eq!(
        rig.durable("f").as_deref(),
        Some(&b"old old old"[..]),
        "nothing durable yet"
    );
    drop(f);
    fs.crash().expect("crash");
    assert_eq!(rig.durable("f").as_deref(), Some(&b"old old old"[..]));

    let power = Power::new();
    let fs = rig.mount(&power);
    let f = OpenOptions::new()
        .write(true)
        .open(rig.at("f"))
        .expect("open");
    f.write_all_at(b"NEW", 0).expect("write");
    f.sync_data().expect("fdatasync");
    f.write_all_at(b"LOST", 4).expect("write after the sync");
    f.set_len(3).expect("truncate after the sync");
    drop(f);
    assert!(fs.has_volatile());
    fs.crash().expect("crash");
    assert_eq!(rig.durable("f").as_deref(), Some(&b"NEW old old"[..]));
}

#[test]
fn a_new_file_needs_its_directory_synced_and_a_rename_is_undone_without_it() {
    let Some(rig) = Rig::new() else { return };
    std::fs::write(rig.backing.path().join("keep"), b"kept").expect("seed");
    let power = Power::new();
    let fs = rig.mount(&power);
    // Created, fsynced, directory fsynced: kept.
    let mut b = File::create(rig.at("b")).expect("create b");
    b.write_all(b"bbbb").expect("write b");
    b.sync_all().expect("fsync b");
    fsync_dir(rig.mnt.path());
    // Created and fsynced after the directory's last fsync: the name is lost (strict POSIX).
    let mut a = File::create(rig.at("a")).expect("create a");
    a.write_all(b"aaaa").expect("write a");
    a.sync_all().expect("fsync a");
    // Renamed over an existing name and unlinked without a directory sync: undone.
    std::fs::rename(rig.at("b"), rig.at("keep")).expect("rename");
    assert_eq!(std::fs::read(rig.at("keep")).expect("read"), b"bbbb");
    std::fs::create_dir(rig.at("d")).expect("mkdir");
    assert!(rig.at("d").is_dir());
    drop((a, b));
    fs.crash().expect("crash");
    assert_eq!(rig.durable("a"), None, "a's name was never made durable");
    assert_eq!(rig.durable("b").as_deref(), Some(&b"bbbb"[..]));
    assert_eq!(rig.durable("keep").as_deref(), Some(&b"kept"[..]));
    assert!(!rig.backing.path().join("d").exists());

    // The same rename, then the directory synced: durable; an unlink without it: undone.
    let power = Power::new();
    let fs = rig.mount(&power);
    std::fs::rename(rig.at("b"), rig.at("keep")).expect("rename");
    std::fs::rename(rig.at("keep"), rig.at("keep")).expect("rename onto itself");
    fsync_dir(rig.mnt.path());
    std::fs::remove_file(rig.at("keep")).expect("unlink");
    assert!(!rig.at("keep").exists());
    fs.crash().expect("crash");
    assert_eq!(rig.durable("b"), None);
    assert_eq!(rig.durable("keep").as_deref(), Some(&b"bbbb"[..]));
    let names: Vec<_> = std::fs::read_dir(rig.backing.path())
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(
        names,
        vec![std::ffi::OsString::from("keep")],
        "no trash left behind"
    );
}

#[test]
fn a_planned_cut_refuses_the_kth_request_and_everything_after() {
    let Some(rig) = Rig::new() else { return };
    std::fs::write(rig.backing.path().join("f"), b"").expect("seed");
    let power = Power::new();
    // Requests: write(1) fsync(2) write(3) fsync(4): cut before the 4th.
    power.cut_before(4);
    let fs = rig.mount(&power);
    let f = OpenOptions::new()
        .write(true)
        .open(rig.at("f"))
        .expect("open");
    f.write_all_at(b"one", 0).expect("write 1");
    f.sync_data().expect("fsync 2");
    f.write_all_at(b"two", 3).expect("write 3");
    let e = f
        .sync_data()
        .expect_err("the power is off at the 4th request");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert!(power.is_cut());
    let e = f.write_all_at(b"x", 0).expect_err("still off");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert_eq!(power.counts().ops, 3);
    assert_eq!(power.counts().syncs, 1);
    drop(f);
    fs.crash().expect("crash");
    assert_eq!(rig.durable("f").as_deref(), Some(&b"one"[..]));
}

#[test]
fn writes_through_o_dsync_and_o_direct_descriptors() {
    let Some(rig) = Rig::new() else { return };
    let power = Power::new();
    let fs = rig.mount(&power);
    std::fs::write(rig.at("s"), b"").expect("create s");
    std::fs::write(rig.at("d"), b"").expect("create d");
    fsync_dir(rig.mnt.path());
    let s = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DSYNC)
        .open(rig.at("s"))
        .expect("open O_DSYNC");
    s.write_all_at(b"synced by O_DSYNC", 0).expect("write");
    drop(s);
    // O_DIRECT is accepted on the mount and is not durable without fsync (a volatile
    // write cache), as the module says.
    match OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(rig.at("d"))
    {
        Ok(d) => {
            let page = vec![7u8; 4096];
            // The Vec is not aligned: FUSE does not ask for alignment; a refusal would be
            // EINVAL, which this test reports.
            d.write_all_at(&page, 0).expect("O_DIRECT write");
        }
        Err(e) => panic!("O_DIRECT open refused on crashfs: {e}"),
    }
    fs.crash().expect("crash");
    assert_eq!(rig.durable("s").as_deref(), Some(&b"synced by O_DSYNC"[..]));
    assert_eq!(rig.durable("d").as_deref(), Some(&b""[..]));
}
