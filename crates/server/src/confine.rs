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
    /// Escape attempt (EXDEV, ELOOP), permission, or not a regular file: 403.
    Forbidden,
    /// Anything else (EMFILE, EIO): 500.
    Failed,
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

fn refusal(e: Errno) -> Refused {
    match e {
        Errno::NOENT | Errno::NOTDIR | Errno::NAMETOOLONG => Refused::NotFound,
        Errno::XDEV | Errno::LOOP | Errno::ACCESS | Errno::PERM => Refused::Forbidden,
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
}
