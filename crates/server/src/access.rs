//! What a control-protocol stream may touch, and opening its endpoints within that.
//!
//! The control server runs with its own user's rights, so it must never let a client name
//! what that client could not reach itself (docs/security.md). [`Access`] is the one place
//! that decides, from `[control]` in the configuration:
//!
//! - **files read** only beneath `read_roots` (default: the served root), each opened with
//!   openat2 `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS` below the root's descriptor, as HTTP's
//!   requests are ([`crate::confine`]); regular files only;
//! - **files written** only beneath `write_roots` (default: none), created with
//!   `O_CREAT | O_EXCL` and `RESOLVE_NO_SYMLINKS`; an existing file is cut only when the
//!   `OPEN` says `TRUNCATE`, and never one with a second hard link;
//! - **devices**, **volumes** and **Unix socket paths** only when listed by exact name;
//! - **listening** sockets only on `listen_allow` addresses (default loopback), **connecting**
//!   and sending ones only to `connect_allow` (default any), names resolved once and the
//!   address checked is the one used;
//! - never the server's own stdin or stdout (`-`), and never a descriptor named by number
//!   (`fd:N`): the number would name one of the *server's* descriptors (its listeners, its
//!   token file, another client's socket). Descriptors reach the server only by being
//!   passed (SCM_RIGHTS hand-off, a later issue), never by a name.
//!
//! [`Access::check`] runs at `OPEN` (a refusal costs nothing: no admission, no slot);
//! [`Access::prepare`] at `START` opens what opens at once and binds listeners, whose peer
//! [`Listener::accept`] then waits for with a deadline, off every lock.

use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, ToSocketAddrs};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixListener;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use penstock_core::endpoint::{Endpoint, Host, Role};
use penstock_core::stream::IoKind;
use penstock_driver::open::{Opened, classify_file};

use crate::config::ControlConfig;
use crate::confine::{self, Create, Refused};

/// A directory streams may read from or write into.
struct Dir {
    /// As configured (what a client writes in `file:` names)...
    path: PathBuf,
    /// ...and resolved, so that either form matches.
    canonical: PathBuf,
    root: confine::Root,
}

impl Dir {
    fn open(path: &Path) -> io::Result<Dir> {
        let canonical = std::fs::canonicalize(path)?;
        let root = confine::Root::open(&canonical)?;
        Ok(Dir {
            path: path.to_path_buf(),
            canonical,
            root,
        })
    }

    /// `path` relative to this directory, when it names something beneath it (lexically:
    /// the kernel then refuses any `..` or link that would climb out).
    fn relative(&self, path: &Path) -> Option<String> {
        let rel = path
            .strip_prefix(&self.path)
            .or_else(|_| path.strip_prefix(&self.canonical))
            .ok()?;
        let rel = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        rel.to_str().map(str::to_string)
    }
}

/// The endpoint policy of the control protocol.
pub struct Access {
    read: Vec<Dir>,
    write: Vec<Dir>,
    devices: Vec<PathBuf>,
    /// `None`: every volume (`"*"`).
    volumes: Option<Vec<String>>,
    unix_paths: Vec<PathBuf>,
    cfg: ControlConfig,
    /// The served root (absolute) and `[origin]`: a source file missing beneath the served
    /// root is the origin's object at the same path, copied whole into the cache
    /// (docs/origin.md).
    served_root: PathBuf,
    origin: Option<std::sync::Arc<crate::origin::Origin>>,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field(
                "read",
                &self.read.iter().map(|d| &d.path).collect::<Vec<_>>(),
            )
            .field(
                "write",
                &self.write.iter().map(|d| &d.path).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// Why a control stream may not use an endpoint, or could not open it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// Not permitted by the configuration (403).
    #[error("not permitted: {0}")]
    Forbidden(String),
    /// Permitted, but opening failed (500).
    #[error("{0}")]
    Failed(String),
}

/// An endpoint opened as far as it opens without a peer.
pub enum Prepared {
    Ready(Opened),
    Listening(Listener),
}

/// A bound listening endpoint waiting for its one peer.
pub struct Listener {
    kind: ListenerKind,
    label: String,
    /// Where it listens (`HOST:PORT`, or `unix:PATH`).
    pub addr: String,
}

enum ListenerKind {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let ListenerKind::Unix(_, p) = &self.kind {
            let _ = std::fs::remove_file(p);
        }
    }
}

const ACCEPT_SLICE: Duration = Duration::from_millis(100);

impl Listener {
    /// Binds a TCP listener on the first of `addrs` that binds (non-blocking, for
    /// [`Listener::accept`]); `label` names the endpoint in messages.
    pub fn bind_tcp(addrs: &[SocketAddr], label: String) -> Result<Listener, Denied> {
        let failed = |e: io::Error| Denied::Failed(format!("{label}: {e}"));
        let l = TcpListener::bind(addrs).map_err(failed)?;
        l.set_nonblocking(true).map_err(failed)?;
        let addr = l.local_addr().map_err(failed)?.to_string();
        Ok(Listener {
            kind: ListenerKind::Tcp(l),
            label,
            addr,
        })
    }

    /// Binds a Unix stream listener at `path` (removed again when the listener goes).
    pub fn bind_unix(path: &Path, label: String) -> Result<Listener, Denied> {
        let failed = |e: io::Error| Denied::Failed(format!("{label}: {e}"));
        let l = UnixListener::bind(path).map_err(failed)?;
        if let Err(e) = l.set_nonblocking(true) {
            let _ = std::fs::remove_file(path);
            return Err(failed(e));
        }
        Ok(Listener {
            kind: ListenerKind::Unix(l, path.to_path_buf()),
            addr: format!("unix:{}", path.display()),
            label,
        })
    }

    /// Waits for the peer until `deadline`, giving up as soon as `give_up()` says so
    /// (a `CLOSE`, the server stopping).
    pub fn accept(self, deadline: Instant, give_up: &dyn Fn() -> bool) -> Result<Opened, Denied> {
        loop {
            if give_up() {
                return Err(Denied::Failed(format!(
                    "{}: stopped waiting for a peer",
                    self.label
                )));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Denied::Failed(format!(
                    "{}: no peer connected to {} in time (control.accept_timeout_ms)",
                    self.label, self.addr
                )));
            }
            let slice = (deadline - now).min(ACCEPT_SLICE);
            let ready = {
                let fd = match &self.kind {
                    ListenerKind::Tcp(l) => rustix::fd::AsFd::as_fd(l),
                    ListenerKind::Unix(l, _) => rustix::fd::AsFd::as_fd(l),
                };
                let mut fds = [rustix::event::PollFd::new(
                    &fd,
                    rustix::event::PollFlags::IN,
                )];
                let ts = rustix::time::Timespec {
                    tv_sec: 0,
                    tv_nsec: i64::from(slice.subsec_nanos()),
                };
                matches!(rustix::event::poll(&mut fds, Some(&ts)), Ok(n) if n > 0)
            };
            if !ready {
                continue;
            }
            let accepted: io::Result<std::os::fd::OwnedFd> = match &self.kind {
                ListenerKind::Tcp(l) => l.accept().map(|(s, _)| {
                    let _ = s.set_nodelay(true);
                    s.into()
                }),
                ListenerKind::Unix(l, _) => l.accept().map(|(s, _)| s.into()),
            };
            match accepted {
                Ok(fd) => {
                    rustix::io::ioctl_fionbio(&fd, true)
                        .map_err(|e| Denied::Failed(format!("{}: {e}", self.label)))?;
                    return Ok(stream_socket(fd, self.label.clone()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {}
                Err(e) => return Err(Denied::Failed(format!("{}: accept: {e}", self.label))),
            }
        }
    }
}

fn stream_socket(fd: std::os::fd::OwnedFd, label: String) -> Opened {
    Opened {
        fd: fd.into(),
        kind: IoKind::StreamSocket,
        size: None,
        socket: true,
        label,
        volume: None,
    }
}

/// Whether `path` has no `..` (so that lexical comparisons with configured paths mean what
/// they say).
fn plain(path: &Path) -> bool {
    path.is_absolute() && !path.components().any(|c| matches!(c, Component::ParentDir))
}

impl Access {
    /// Opens the configured roots (`served_root` when `read_roots` is empty).
    pub fn new(cfg: &ControlConfig, served_root: &Path) -> io::Result<Access> {
        let with =
            |p: &Path, e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", p.display()));
        let served = std::path::absolute(served_root)?;
        let read_paths: Vec<PathBuf> = if cfg.read_roots.is_empty() {
            vec![served.clone()]
        } else {
            cfg.read_roots.clone()
        };
        let read = read_paths
            .iter()
            .map(|p| Dir::open(p).map_err(|e| with(p, e)))
            .collect::<io::Result<Vec<_>>>()?;
        let write = cfg
            .write_roots
            .iter()
            .map(|p| Dir::open(p).map_err(|e| with(p, e)))
            .collect::<io::Result<Vec<_>>>()?;
        let volumes = if cfg.volumes.iter().any(|v| v == "*") {
            None
        } else {
            Some(cfg.volumes.clone())
        };
        Ok(Access {
            // Resolved, as `Dir::canonical`, so that a read root written another way matches.
            served_root: std::fs::canonicalize(&served).unwrap_or(served),
            origin: None,
            read,
            write,
            devices: cfg.devices.clone(),
            volumes,
            unix_paths: cfg.unix_paths.clone(),
            cfg: cfg.clone(),
        })
    }

    fn dirs(&self, role: Role) -> &[Dir] {
        match role {
            Role::Source => &self.read,
            Role::Target => &self.write,
        }
    }

    /// The directory and relative path a `file:` name falls in: an absolute path beneath
    /// a root, or a relative one in the first root.
    fn locate(&self, path: &Path, role: Role) -> Result<(&Dir, String), Denied> {
        if path.components().any(|c| matches!(c, Component::ParentDir)) {
            return Err(Denied::Forbidden(format!(
                "{}: a control stream's file name may not contain ..",
                path.display()
            )));
        }
        let dirs = self.dirs(role);
        let found = if path.is_relative() {
            dirs.first()
                .and_then(|d| path.to_str().map(|r| (d, r.to_string())))
        } else {
            dirs.iter().find_map(|d| d.relative(path).map(|r| (d, r)))
        };
        found.ok_or_else(|| {
            Denied::Forbidden(match role {
                Role::Source => format!(
                    "{} is outside the roots control streams may read (control.read_roots: {})",
                    path.display(),
                    list(&self.read)
                ),
                Role::Target if self.write.is_empty() => format!(
                    "{}: control streams may write no file (control.write_roots is empty)",
                    path.display()
                ),
                Role::Target => format!(
                    "{} is outside the roots control streams may write (control.write_roots: {})",
                    path.display(),
                    list(&self.write)
                ),
            })
        })
    }

    fn is_device(&self, path: &Path) -> bool {
        plain(path) && self.devices.iter().any(|d| d == path)
    }

    /// Whether a client may name `ep` in this role (at `OPEN`; addresses given as names are
    /// checked again, resolved, at `START`).
    /// Reads source files missing beneath the served root from `origin`.
    pub(crate) fn with_origin(
        mut self,
        origin: Option<std::sync::Arc<crate::origin::Origin>>,
    ) -> Access {
        self.origin = origin;
        self
    }

    pub fn check(&self, ep: &Endpoint, role: Role) -> Result<(), Denied> {
        match ep {
            Endpoint::File { path } => {
                if self.is_device(path) {
                    return Ok(());
                }
                self.locate(path, role).map(drop)
            }
            Endpoint::Stdio => Err(Denied::Forbidden(
                "- is the server's own stdin/stdout, not an endpoint for control streams".into(),
            )),
            Endpoint::Fd { fd } => Err(Denied::Forbidden(format!(
                "fd:{fd} names a descriptor of the server's own process; a control stream \
                 may not name descriptors (use penstock's C library in your own process)"
            ))),
            Endpoint::TcpConnect { host, .. } | Endpoint::UdpSend { host, .. } => match host {
                Host::Ip(ip) => self.connect_ok(*ip),
                Host::Name(_) => Ok(()),
            },
            Endpoint::TcpListen { host, .. } | Endpoint::UdpListen { host, .. } => match host {
                Host::Ip(ip) => self.listen_ok(*ip),
                Host::Name(_) => Ok(()),
            },
            Endpoint::Unix { path } | Endpoint::UnixListen { path } => {
                if plain(path) && self.unix_paths.iter().any(|p| p == path) {
                    Ok(())
                } else {
                    Err(Denied::Forbidden(format!(
                        "unix socket {} is not in control.unix_paths",
                        path.display()
                    )))
                }
            }
            Endpoint::Volume { volume, .. } => match &self.volumes {
                None => Ok(()),
                Some(list) if list.iter().any(|v| v == volume.as_str()) => Ok(()),
                Some(_) => Err(Denied::Forbidden(format!(
                    "volume {} is not in control.volumes",
                    volume.as_str()
                ))),
            },
        }
    }

    fn connect_ok(&self, ip: IpAddr) -> Result<(), Denied> {
        if self.cfg.may_connect_to(ip) {
            Ok(())
        } else {
            Err(Denied::Forbidden(format!(
                "{ip} is not in control.connect_allow"
            )))
        }
    }

    fn listen_ok(&self, ip: IpAddr) -> Result<(), Denied> {
        if self.cfg.may_listen_on(ip) {
            Ok(())
        } else {
            Err(Denied::Forbidden(format!(
                "listening on {ip} is not allowed (control.listen_allow; default loopback only)"
            )))
        }
    }

    /// Resolves `host:port` once; every address must be allowed by `ok`.
    fn resolve(
        &self,
        host: &Host,
        port: u16,
        label: &str,
        ok: impl Fn(&Self, IpAddr) -> Result<(), Denied>,
    ) -> Result<Vec<SocketAddr>, Denied> {
        let addrs = resolve(host, port, label)?;
        for a in &addrs {
            ok(self, a.ip())?;
        }
        Ok(addrs)
    }

    /// Opens `ep` as far as it opens without waiting for a peer (at `START`): files,
    /// devices, volumes, connected sockets (within `connect_timeout_ms`), bound datagram
    /// sockets; a listening stream socket is bound and returned to wait on.
    pub fn prepare(&self, ep: &Endpoint, role: Role, truncate: bool) -> Result<Prepared, Denied> {
        self.check(ep, role)?;
        let label = ep.to_string();
        let failed = |e: &dyn std::fmt::Display| Denied::Failed(format!("{label}: {e}"));
        match ep {
            Endpoint::File { path } if self.is_device(path) => {
                let f = std::fs::OpenOptions::new()
                    .read(role == Role::Source)
                    .write(role == Role::Target)
                    .open(path)
                    .map_err(|e| failed(&e))?;
                let ft = f.metadata().map_err(|e| failed(&e))?.file_type();
                if !(ft.is_block_device() || ft.is_char_device()) {
                    return Err(Denied::Forbidden(format!(
                        "{}: listed in control.devices but not a device",
                        path.display()
                    )));
                }
                Ok(Prepared::Ready(
                    classify_file(f, label.clone()).map_err(|e| failed(&e))?,
                ))
            }
            Endpoint::File { path } => {
                let (dir, rel) = self.locate(path, role)?;
                let refused = |r: Refused| match r {
                    Refused::NotFound => Denied::Failed(format!("{label}: no such file")),
                    Refused::Exists => Denied::Failed(format!(
                        "{label}: exists; say TRUNCATE in the OPEN to overwrite it"
                    )),
                    Refused::Forbidden => Denied::Forbidden(format!(
                        "{label}: a link, a file with several links, or not a regular file"
                    )),
                    Refused::Denied => {
                        Denied::Forbidden(format!("{label}: permission denied to the server"))
                    }
                    Refused::Failed => Denied::Failed(format!("{label}: could not be opened")),
                    Refused::Exhausted => Denied::Failed(format!(
                        "{label}: could not be opened: the server is out of descriptors"
                    )),
                };
                let file = match role {
                    Role::Source => match dir.root.open_path(&rel) {
                        Ok(confine::Opened::File { file, .. }) => file,
                        Ok(confine::Opened::Directory(_)) => {
                            return Err(Denied::Failed(format!("{label}: is a directory")));
                        }
                        // Missing beneath the served root: the origin's object at that path.
                        Err(Refused::NotFound)
                            if self.origin.is_some() && dir.canonical == self.served_root =>
                        {
                            let origin = self.origin.as_ref().expect("checked in the guard");
                            origin
                                .whole_file(&format!("/{}", rel.trim_start_matches('/')))
                                .map_err(|e| Denied::Failed(format!("{label}: origin: {e}")))?
                        }
                        Err(r) => return Err(refused(r)),
                    },
                    Role::Target => {
                        let how = if truncate {
                            Create::Truncate
                        } else {
                            Create::New
                        };
                        dir.root.create_file(&rel, how).map_err(refused)?
                    }
                };
                // Opened non-blocking (a FIFO must not block the open); reads are blocking.
                let fl = rustix::fs::fcntl_getfl(&file).map_err(|e| failed(&e))?;
                rustix::fs::fcntl_setfl(&file, fl - rustix::fs::OFlags::NONBLOCK)
                    .map_err(|e| failed(&e))?;
                Ok(Prepared::Ready(
                    classify_file(file, label.clone()).map_err(|e| failed(&e))?,
                ))
            }
            Endpoint::TcpConnect {
                host,
                port,
                local_port,
            } => {
                let addrs = self.resolve(host, *port, &label, Self::connect_ok)?;
                let s = self.connect(&addrs, *local_port).map_err(|e| failed(&e))?;
                Ok(Prepared::Ready(stream_socket(s, label.clone())))
            }
            Endpoint::TcpListen { host, port } => {
                let addrs = self.resolve(host, *port, &label, Self::listen_ok)?;
                Listener::bind_tcp(&addrs, label.clone()).map(Prepared::Listening)
            }
            Endpoint::UnixListen { path } => {
                Listener::bind_unix(path, label.clone()).map(Prepared::Listening)
            }
            // The rest open at once through the driver, with names already resolved and
            // checked (so the address used is the address checked).
            Endpoint::UdpSend {
                host,
                port,
                local_port,
            } => {
                let a = self.resolve(host, *port, &label, Self::connect_ok)?[0];
                let ep = Endpoint::UdpSend {
                    host: Host::Ip(a.ip()),
                    port: *port,
                    local_port: *local_port,
                };
                penstock_driver::open::open_target(&ep, &mut |_| {})
                    .map(Prepared::Ready)
                    .map_err(|e| Denied::Failed(e.to_string()))
            }
            Endpoint::UdpListen { host, port } => {
                let a = self.resolve(host, *port, &label, Self::listen_ok)?[0];
                let ep = Endpoint::UdpListen {
                    host: Host::Ip(a.ip()),
                    port: *port,
                };
                penstock_driver::open::open_source(&ep, &mut |_| {})
                    .map(Prepared::Ready)
                    .map_err(|e| Denied::Failed(e.to_string()))
            }
            Endpoint::Unix { .. } | Endpoint::Volume { .. } => {
                let r = match role {
                    Role::Source => penstock_driver::open::open_source(ep, &mut |_| {}),
                    Role::Target => penstock_driver::open::open_target(ep, &mut |_| {}),
                };
                r.map(Prepared::Ready)
                    .map_err(|e| Denied::Failed(e.to_string()))
            }
            Endpoint::Stdio | Endpoint::Fd { .. } => unreachable!("refused by check"),
        }
    }

    /// Connects to the first address that answers within `connect_timeout_ms` (each).
    fn connect(
        &self,
        addrs: &[SocketAddr],
        local_port: Option<u16>,
    ) -> io::Result<std::os::fd::OwnedFd> {
        connect_tcp(addrs, local_port, self.cfg.connect_timeout())
    }
}

/// Resolves `host:port` (a name through the system's resolver, once): at least one address.
pub fn resolve(host: &Host, port: u16, label: &str) -> Result<Vec<SocketAddr>, Denied> {
    let addrs: Vec<SocketAddr> = match host {
        Host::Ip(ip) => vec![SocketAddr::new(*ip, port)],
        Host::Name(n) => (n.as_str(), port)
            .to_socket_addrs()
            .map_err(|e| Denied::Failed(format!("{label}: cannot resolve host: {e}")))?
            .collect(),
    };
    if addrs.is_empty() {
        return Err(Denied::Failed(format!("{label}: no address")));
    }
    Ok(addrs)
}

/// Connects a TCP socket to the first of `addrs` that answers within `timeout` (each), from
/// `local_port` when given; non-blocking once connected, with `TCP_NODELAY`.
pub fn connect_tcp(
    addrs: &[SocketAddr],
    local_port: Option<u16>,
    timeout: Duration,
) -> io::Result<std::os::fd::OwnedFd> {
    use socket2::{Domain, Protocol, Socket, Type};
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
    for a in addrs {
        let s = Socket::new(
            Domain::for_address(*a),
            Type::STREAM.cloexec(),
            Some(Protocol::TCP),
        )?;
        if let Some(lp) = local_port {
            let any: SocketAddr = if a.is_ipv4() {
                ([0, 0, 0, 0], lp).into()
            } else {
                (std::net::Ipv6Addr::UNSPECIFIED, lp).into()
            };
            s.set_reuse_address(true)?;
            s.bind(&any.into())?;
        }
        match s.connect_timeout(&(*a).into(), timeout) {
            Ok(()) => {
                let _ = s.set_tcp_nodelay(true);
                s.set_nonblocking(true)?;
                return Ok(s.into());
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn list(dirs: &[Dir]) -> String {
    if dirs.is_empty() {
        return "none".into();
    }
    dirs.iter()
        .map(|d| d.path.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(read: &Path, write: Option<&Path>) -> Access {
        let cfg = ControlConfig {
            read_roots: vec![read.to_path_buf()],
            write_roots: write.map(|w| vec![w.to_path_buf()]).unwrap_or_default(),
            ..ControlConfig::default()
        };
        Access::new(&cfg, read).unwrap()
    }

    fn file(p: impl Into<PathBuf>) -> Endpoint {
        Endpoint::File { path: p.into() }
    }

    #[test]
    fn files_outside_the_roots_are_refused_at_check() {
        let r = tempfile::tempdir().unwrap();
        let a = access(r.path(), None);
        assert!(a.check(&file(r.path().join("x")), Role::Source).is_ok());
        assert!(a.check(&file("rel/x"), Role::Source).is_ok());
        for bad in ["/etc/shadow", "/"] {
            assert!(matches!(
                a.check(&file(bad), Role::Source),
                Err(Denied::Forbidden(_))
            ));
        }
        // No write root: every file target is refused.
        let e = a
            .check(&file(r.path().join("x")), Role::Target)
            .unwrap_err();
        assert!(e.to_string().contains("write_roots is empty"), "{e}");
        assert!(a.check(&Endpoint::Stdio, Role::Source).is_err());
        assert!(a.check(&Endpoint::Stdio, Role::Target).is_err());
    }

    /// `fd:N` is refused at OPEN (and so never reaches `prepare`), whatever N and role: a
    /// number in a control line would name one of the server's own descriptors.
    #[test]
    fn descriptors_by_number_are_refused() {
        let r = tempfile::tempdir().unwrap();
        let a = access(r.path(), Some(r.path()));
        for fd in [0, 1, 2, 3, 1000] {
            for role in [Role::Source, Role::Target] {
                let ep = Endpoint::parse(&format!("fd:{fd}"), role).unwrap();
                let e = a.check(&ep, role).unwrap_err();
                assert!(
                    matches!(&e, Denied::Forbidden(m) if m.contains("descriptor of the server's own process")),
                    "{e}"
                );
                assert!(matches!(
                    a.prepare(&ep, role, true),
                    Err(Denied::Forbidden(_))
                ));
            }
        }
    }

    #[test]
    fn dot_dot_and_links_out_of_a_root_do_not_open() {
        let r = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc/passwd", r.path().join("pw")).unwrap();
        let a = access(r.path(), None);
        let up = r.path().join("../../etc/passwd");
        assert!(matches!(
            a.check(&file(&up), Role::Source),
            Err(Denied::Forbidden(_))
        ));
        assert!(a.prepare(&file(up), Role::Source, false).is_err());
        assert!(
            a.prepare(&file(r.path().join("pw")), Role::Source, false)
                .is_err()
        );
    }

    #[test]
    fn listeners_default_to_loopback() {
        let r = tempfile::tempdir().unwrap();
        let a = access(r.path(), None);
        let any = Endpoint::TcpListen {
            host: Host::Ip("0.0.0.0".parse().unwrap()),
            port: 0,
        };
        assert!(matches!(
            a.check(&any, Role::Source),
            Err(Denied::Forbidden(_))
        ));
        let lo = Endpoint::TcpListen {
            host: Host::Ip("127.0.0.1".parse().unwrap()),
            port: 0,
        };
        assert!(a.check(&lo, Role::Target).is_ok());
    }

    #[test]
    fn a_listener_gives_up_at_its_deadline_and_when_told() {
        let r = tempfile::tempdir().unwrap();
        let a = access(r.path(), None);
        let lo = Endpoint::TcpListen {
            host: Host::Ip("127.0.0.1".parse().unwrap()),
            port: 0,
        };
        let Ok(Prepared::Listening(l)) = a.prepare(&lo, Role::Target, false) else {
            panic!("a listener")
        };
        let e = l
            .accept(Instant::now() + Duration::from_millis(150), &|| false)
            .err()
            .unwrap();
        assert!(e.to_string().contains("in time"), "{e}");
        let Ok(Prepared::Listening(l)) = a.prepare(&lo, Role::Target, false) else {
            panic!("a listener")
        };
        let e = l
            .accept(Instant::now() + Duration::from_secs(60), &|| true)
            .err()
            .unwrap();
        assert!(e.to_string().contains("stopped waiting"), "{e}");
    }
}
