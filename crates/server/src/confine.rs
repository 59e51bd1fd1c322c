//! Opening a request's path without ever leaving the served root.
//!
//! Every open is `openat2(root_fd, relative_path, O_RDONLY | O_NONBLOCK, RESOLVE_BENEATH |
//! RESOLVE_NO_MAGICLINKS)`: the kernel refuses (EXDEV) any resolution that would leave the
//! directory `root_fd` names — through `..`, an absolute symlink, or a relative one that
//! climbs out — and refuses `/proc/self/fd/N`-style magic links. The core's parser already
//! refuses `..` above the root (403) and decodes the path; this is the second wall, the one
//! that also covers symlinks. `O_NONBLOCK` keeps a FIFO in the tree from blocking the
//! event loop at open; anything but a regular file or a directory is refused (403).

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::SystemTime;

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// The opened root: an `O_PATH` directory descriptor every request is resolved beneath.
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
}

/// What a request path turned out to be.
#[derive(Debug)]
pub enum Opened {
    File {
        file: File,
        len_bytes: u64,
        mtime: SystemTime,
    },
    Directory(OwnedFd),
}

/// Why a path could not be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// ENOENT, ENOTDIR: 404.
    NotFound,
    /// Escape attempt (EXDEV, ELOOP), or not a regular file: 403.
    Forbidden,
    /// The file exists beneath the root but the server may not read it (EACCES, EPERM): 403
    /// on HTTP and RTSP alike, with a log line naming why (issue 35).
    Denied,
    /// Out of descriptors or memory (EMFILE, ENFILE, ENOMEM): 503, the connection closed.
    Exhausted,
    /// Anything else (EIO): 500.
    Failed,
    /// Creating a file that must be new, and it exists.
    Exists,
}

impl Root {
    /// Opens `dir` as the root, and checks that openat2 with RESOLVE_BENEATH works here
    /// (Linux ≥ 5.6); without it the server refuses to start rather than serve unconfined.
    pub fn open(dir: &Path) -> io::Result<Root> {
        let fd = rustix::fs::open(
            dir,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let root = Root { fd };
        root.open_beneath(".", OFlags::DIRECTORY).map_err(|e| {
            io::Error::new(
                io::ErrorKind::Unsupported,
                format!("openat2 with RESOLVE_BENEATH failed (Linux >= 5.6 needed): {e}"),
            )
        })?;
        Ok(root)
    }

    fn open_beneath(&self, rel: &str, extra: OFlags) -> Result<OwnedFd, Errno> {
        rustix::fs::openat2(
            &self.fd,
            rel,
            OFlags::RDONLY | OFlags::CLOEXEC | extra,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
        )
    }

    /// Opens `rel` (relative, as `Request::relative_path` gives it) beneath the root.
    pub fn open_path(&self, rel: &str) -> Result<Opened, Refused> {
        let fd = self
            .open_beneath(rel, OFlags::NONBLOCK | OFlags::NOCTTY)
            .map_err(refusal)?;
        classify(fd)
    }

    /// Opens `name` inside an already opened directory (the index file), still confined:
    /// `dir` is beneath the root and `name` comes from the configuration, but resolution
    /// stays BENEATH `dir` all the same.
    pub fn open_in(&self, dir: &OwnedFd, name: &str) -> Result<Opened, Refused> {
        let fd = rustix::fs::openat2(
            dir,
            name,
            OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(refusal)?;
        match classify(fd)? {
            f @ Opened::File { .. } => Ok(f),
            Opened::Directory(_) => Err(Refused::Forbidden),
        }
    }
}

/// How a file is created beneath a writable root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Create {
    /// The file must not exist yet (`O_CREAT | O_EXCL`).
    New,
    /// Create it, or cut an existing regular file with one link to length 0.
    Truncate,
}

impl Root {
    /// Opens `rel` beneath the root for writing, creating it: no symlink anywhere on the
    /// way (`RESOLVE_NO_SYMLINKS`, so a planted link can neither redirect the file nor a
    /// directory above it), never a file that exists unless `how` is [`Create::Truncate`],
    /// and then only a regular file with a single link (a hard link to a file elsewhere is
    /// refused rather than cut). Mode 0644 before the umask.
    pub fn create_file(&self, rel: &str, how: Create) -> Result<File, Refused> {
        let mut flags = OFlags::WRONLY | OFlags::CREATE | OFlags::CLOEXEC | OFlags::NOCTTY;
        if how == Create::New {
            flags |= OFlags::EXCL;
        }
        let fd = rustix::fs::openat2(
            &self.fd,
            rel,
            flags | OFlags::NONBLOCK,
            Mode::from_raw_mode(0o644),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(|e| match e {
            Errno::EXIST => self.existing(rel),
            e => refusal(e),
        })?;
        let st = rustix::fs::fstat(&fd).map_err(|_| Refused::Failed)?;
        if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile
            || st.st_nlink != 1
        {
            return Err(Refused::Forbidden);
        }
        if how == Create::Truncate && st.st_size != 0 {
            rustix::fs::ftruncate(&fd, 0).map_err(|_| Refused::Failed)?;
        }
        // Writes on the data path are blocking file writes.
        let fl = rustix::fs::fcntl_getfl(&fd).map_err(|_| Refused::Failed)?;
        rustix::fs::fcntl_setfl(&fd, fl - OFlags::NONBLOCK).map_err(|_| Refused::Failed)?;
        Ok(File::from(fd))
    }

    /// Why a file that had to be new could not be created: it exists as a regular file
    /// (`Exists`: `TRUNCATE` may cut it), or as something never written through (a link,
    /// a directory, a device: `Forbidden`).
    fn existing(&self, rel: &str) -> Refused {
        let at = rustix::fs::openat2(
            &self.fd,
            rel,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        );
        match at.and_then(|fd| rustix::fs::fstat(&fd)) {
            Ok(st)
                if rustix::fs::FileType::from_raw_mode(st.st_mode)
                    == rustix::fs::FileType::RegularFile
                    && st.st_nlink == 1 =>
            {
                Refused::Exists
            }
            _ => Refused::Forbidden,
        }
    }
}

fn refusal(e: Errno) -> Refused {
    match e {
        Errno::NOENT | Errno::NOTDIR | Errno::NAMETOOLONG => Refused::NotFound,
        // ENXIO: a Unix socket (open(2) cannot open one): not a regular file, 403.
        Errno::ACCESS | Errno::PERM => Refused::Denied,
        Errno::XDEV | Errno::LOOP | Errno::NXIO => Refused::Forbidden,
        Errno::MFILE | Errno::NFILE | Errno::NOMEM => Refused::Exhausted,
        _ => Refused::Failed,
    }
}

fn classify(fd: OwnedFd) -> Result<Opened, Refused> {
    let st = rustix::fs::fstat(&fd).map_err(|_| Refused::Failed)?;
    let ft = rustix::fs::FileType::from_raw_mode(st.st_mode);
    match ft {
        rustix::fs::FileType::RegularFile => {
            let mtime = SystemTime::UNIX_EPOCH
                + std::time::Duration::new(
                    u64::try_from(st.st_mtime).unwrap_or(0),
                    u32::try_from(st.st_mtime_nsec).unwrap_or(0),
                );
            Ok(Opened::File {
                file: File::from(fd),
                len_bytes: u64::try_from(st.st_size).unwrap_or(0),
                mtime,
            })
        }
        rustix::fs::FileType::Directory => Ok(Opened::Directory(fd)),
        _ => Err(Refused::Forbidden),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlink_out_of_the_root_is_forbidden() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a.txt"), b"hi").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.path().join("pw")).unwrap();
        std::os::unix::fs::symlink("../..", d.path().join("up")).unwrap();
        std::os::unix::fs::symlink("a.txt", d.path().join("inside")).unwrap();
        let root = Root::open(d.path()).unwrap();
        assert!(matches!(
            root.open_path("a.txt"),
            Ok(Opened::File { len_bytes: 2, .. })
        ));
        assert!(matches!(root.open_path("inside"), Ok(Opened::File { .. })));
        assert_eq!(root.open_path("pw").unwrap_err(), Refused::Forbidden);
        assert_eq!(
            root.open_path("up/etc/passwd").unwrap_err(),
            Refused::Forbidden
        );
        assert_eq!(
            root.open_path("../etc/passwd").unwrap_err(),
            Refused::Forbidden
        );
        assert_eq!(root.open_path("nope").unwrap_err(), Refused::NotFound);
        assert!(matches!(root.open_path("."), Ok(Opened::Directory(_))));
    }

    #[test]
    fn files_are_created_beneath_without_links_and_cut_only_when_asked() {
        let d = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim");
        std::fs::write(&victim, b"keep me").unwrap();
        std::os::unix::fs::symlink(&victim, d.path().join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path(), d.path().join("dirlink")).unwrap();
        std::fs::hard_link(&victim, d.path().join("hard")).unwrap();
        std::fs::write(d.path().join("old"), b"old bytes").unwrap();
        let root = Root::open(d.path()).unwrap();
        for how in [Create::New, Create::Truncate] {
            assert!(root.create_file("link", how).is_err(), "{how:?}");
            assert!(root.create_file("dirlink/new", how).is_err(), "{how:?}");
            assert!(root.create_file("hard", how).is_err(), "{how:?}");
            assert!(root.create_file("../escape", how).is_err(), "{how:?}");
        }
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
        assert!(!outside.path().join("new").exists());
        assert_eq!(
            root.create_file("old", Create::New).unwrap_err(),
            Refused::Exists
        );
        assert_eq!(std::fs::read(d.path().join("old")).unwrap(), b"old bytes");
        root.create_file("old", Create::Truncate).unwrap();
        assert_eq!(std::fs::read(d.path().join("old")).unwrap(), b"");
        root.create_file("fresh", Create::New).unwrap();
        assert!(d.path().join("fresh").is_file());
    }
}
