//! The server's own files in shared places: the control socket and the token file.
//!
//! Both grant control of the server, so both live in a directory only the server's user can
//! write ([`check_dir`]); the token is written to a file created anew with `O_CREAT | O_EXCL |
//! O_NOFOLLOW`, mode 0600 ([`write_token`]), never through whatever is already at the path.
//! Anything at either path that is not a stale file of the server's own makes the server
//! refuse to start, and says why: a planted link or file is never written through, chmod'ed
//! or removed.

use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

fn refuse(path: &Path, why: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("{}: {why}; refusing to start", path.display()),
    )
}

fn own_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// The default place of the control socket: `$XDG_RUNTIME_DIR/penstock.sock` when that
/// directory exists (it is the user's own, mode 0700), else `control.sock` in a private
/// directory `/tmp/penstock-UID/` (created by [`ensure_private_dir`]).
pub fn default_control_socket() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if Path::new(&d).is_dir() => Path::new(&d).join("penstock.sock"),
        _ => PathBuf::from(format!("/tmp/penstock-{}", own_uid())).join("control.sock"),
    }
}

/// Where the token of a server whose socket is `socket` is written by default.
pub fn default_token_file(socket: &Path) -> PathBuf {
    PathBuf::from(format!("{}.token", socket.display()))
}

/// Creates `dir` (mode 0700) if it is missing, then checks it as [`check_dir`] does.
pub fn ensure_private_dir(dir: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", dir.display()))),
    }
    check_dir(dir)
}

/// Checks that `dir` is a real directory (not a link), owned by the server's user (or by
/// root), and writable by no one else.
pub fn check_dir(dir: &Path) -> io::Result<()> {
    let m = std::fs::symlink_metadata(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
    if !m.file_type().is_dir() {
        return Err(refuse(dir, "not a directory (a symbolic link?)"));
    }
    if m.uid() != own_uid() && m.uid() != 0 {
        return Err(refuse(
            dir,
            format!(
                "owned by uid {}, not by the server's uid {}",
                m.uid(),
                own_uid()
            ),
        ));
    }
    if m.mode() & 0o022 != 0 {
        return Err(refuse(
            dir,
            format!(
                "writable by others (mode {:o}): the control socket and token need a directory only the server's user can write",
                m.mode() & 0o7777
            ),
        ));
    }
    Ok(())
}

fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Writes `token` to `path`: the directory is checked, a stale token file of ours (a regular
/// file, one link, owned by the server's user, mode 0600 or tighter) is replaced, anything
/// else refuses; the new file is created with `O_EXCL | O_NOFOLLOW`, mode 0600. After the
/// token, one `server ADDR` line for each address of the server it belongs to
/// (`HOST:PORT`, `tls://HOST:PORT`, `unix:/path`): `penstock ctl` sends the token read from
/// the default file to those addresses only (issue 35).
pub fn write_token(path: &Path, token: &str, servers: &[String]) -> io::Result<()> {
    check_dir(parent(path))?;
    match std::fs::symlink_metadata(path) {
        Ok(m) => {
            let ours = m.file_type().is_file()
                && m.uid() == own_uid()
                && m.nlink() == 1
                && m.mode() & 0o077 == 0;
            if !ours {
                return Err(refuse(
                    path,
                    "exists and is not a token file this server wrote (a link, another user's file, or readable by others)",
                ));
            }
            std::fs::remove_file(path)?;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .map_err(|e| refuse(path, format!("cannot create the token file: {e}")))?;
    let mut text = format!("{token}\n");
    for a in servers {
        text.push_str(&format!("server {a}\n"));
    }
    f.write_all(text.as_bytes())?;
    Ok(())
}

/// Makes `path` free for the control socket: the directory is checked; a stale socket of
/// ours is removed, a live one (another server answers) is "address in use", anything else
/// refuses.
pub fn prepare_socket_path(path: &Path) -> io::Result<()> {
    check_dir(parent(path))?;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() && m.uid() == own_uid() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{}: another server listens there", path.display()),
                ));
            }
            std::fs::remove_file(path)
        }
        Ok(_) => Err(refuse(
            path,
            "exists and is not a stale control socket of this server's user",
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
    }
}

/// Reads a token file (for `penstock ctl`): the first line, trimmed.
pub fn read_token(path: &Path) -> io::Result<String> {
    read_token_file(path).map(|(t, _)| t)
}

/// Reads a token file: the token (the first line, trimmed) and the addresses of the server
/// it belongs to (its `server ADDR` lines; none in a file written before issue 35).
pub fn read_token_file(path: &Path) -> io::Result<(String, Vec<String>)> {
    use std::io::Read;
    let mut s = String::new();
    // A token file is a few lines: read at most 64 KiB of whatever is there.
    std::fs::File::open(path)?
        .take(64 << 10)
        .read_to_string(&mut s)?;
    let mut lines = s.lines();
    let token = lines.next().unwrap_or("").trim().to_string();
    let servers = lines
        .filter_map(|l| l.trim().strip_prefix("server "))
        .map(|a| a.trim().to_string())
        .filter(|a| !a.is_empty())
        .collect();
    Ok((token, servers))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_token_is_written_0600_and_replaces_only_its_own_stale_file() {
        let d = tempfile::tempdir().unwrap();
        let t = d.path().join("t.token");
        write_token(&t, "abc", &[]).unwrap();
        let m = std::fs::metadata(&t).unwrap();
        assert_eq!(m.mode() & 0o777, 0o600);
        let servers = vec!["127.0.0.1:7070".to_string(), "unix:/run/p.sock".to_string()];
        write_token(&t, "def", &servers).unwrap();
        assert_eq!(read_token(&t).unwrap(), "def");
        assert_eq!(read_token_file(&t).unwrap(), ("def".to_string(), servers));
    }

    #[test]
    fn a_planted_link_or_open_file_refuses_and_is_left_alone() {
        let d = tempfile::tempdir().unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"secret").unwrap();
        let t = d.path().join("t.token");
        std::os::unix::fs::symlink(&victim, &t).unwrap();
        assert!(write_token(&t, "abc", &[]).is_err());
        assert_eq!(std::fs::read(&victim).unwrap(), b"secret");
        std::fs::remove_file(&t).unwrap();
        std::fs::write(&t, b"planted").unwrap();
        std::fs::set_permissions(&t, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(write_token(&t, "abc", &[]).is_err());
        assert_eq!(std::fs::read(&t).unwrap(), b"planted");
    }

    #[test]
    fn a_directory_others_can_write_is_refused() {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = write_token(&d.path().join("t"), "x", &[]).unwrap_err();
        assert!(e.to_string().contains("writable by others"), "{e}");
        assert!(check_dir(Path::new("/tmp")).is_err());
        let link = tempfile::tempdir().unwrap();
        let l = link.path().join("l");
        std::os::unix::fs::symlink(link.path(), &l).unwrap();
        assert!(ensure_private_dir(&l).is_err());
    }
}
