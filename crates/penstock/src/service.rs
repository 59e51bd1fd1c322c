//! Running `penstock serve` as a service: the service manager's notification protocol
//! ([`Notifier`], systemd's `sd_notify(3)`) and switching from root to a configured user
//! after binding ([`RunAs`]). docs/service.md tells the operator's side.
//!
//! # Why not the `sd-notify` crate
//! Its `notify` connects to `$NOTIFY_SOCKET` anew for every message and takes the value as
//! a path, so it cannot reach an abstract socket (`@name`, which `sd_notify(3)` allows and
//! some managers and containers use), and after a switch to an unprivileged user it may no
//! longer reach a socket only root could. The protocol is one datagram of `KEY=VALUE` lines
//! on a Unix datagram socket: [`Notifier`] connects once, at start (before the switch), and
//! reconnects only if a send fails.
//!
//! # Why `nix` for the switch, not `rustix`
//! The kernel's `setuid`/`setgid`/`setgroups` change the credentials of the calling *thread*
//! only; rustix calls them raw (its `set_thread_*` functions say so). By the time the
//! listeners are bound the server has started its HTTP, engine and control threads, and every
//! one of them must change: glibc's wrappers (which `nix` calls) signal all threads of the
//! process to make the same call. [`RunAs::apply`] then reads every thread's
//! `/proc/self/task/TID/status` and refuses to go on if one still has another id.
//! `nix` also resolves names through NSS (`getpwnam_r`), so a user from LDAP or
//! systemd-sysusers resolves as `id` would resolve it.

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use nix::unistd::{Gid, Group, Uid, User};

/// Where service-manager notifications go: the datagram socket named by `$NOTIFY_SOCKET`
/// (a path, or `@name` for an abstract socket). Without the variable every call does
/// nothing. A failed send is logged once (at warn) and never stops the server: the manager
/// then reports the service as it sees fit (a `Type=notify` unit that never gets `READY=1`
/// times out).
#[derive(Debug)]
pub struct Notifier {
    addr: Option<SocketAddr>,
    sock: Option<UnixDatagram>,
    warned: bool,
}

impl Notifier {
    /// Reads `$NOTIFY_SOCKET` and connects to it now, so that the connection outlives a
    /// switch to a user who could not connect.
    pub fn from_env() -> Notifier {
        let mut n = Notifier {
            addr: None,
            sock: None,
            warned: false,
        };
        let Some(v) = std::env::var_os("NOTIFY_SOCKET").filter(|v| !v.is_empty()) else {
            return n;
        };
        match notify_addr(v.as_bytes()) {
            Ok(a) => {
                n.addr = Some(a);
                n.sock = n.connect().map_err(|e| n.warn(&e)).ok();
            }
            Err(e) => n.warn(&e),
        }
        n
    }

    /// `READY=1`: every listener is bound and the server answers. `status` is what
    /// `systemctl status` shows.
    pub fn ready(&mut self, status: &str) {
        let msg = format!(
            "READY=1\nSTATUS={}\nMAINPID={}\n",
            one_line(status),
            std::process::id()
        );
        self.send(&msg);
    }

    /// `RELOADING=1` with the monotonic time, at the start of a reload; `ready` follows
    /// when it is done (whether the new configuration was taken or refused: the server
    /// serves either way, and `status` says which). systemd 253 and later require
    /// `MONOTONIC_USEC` beside `RELOADING=1`.
    pub fn reloading(&mut self) {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
        let usec = t.tv_sec as u64 * 1_000_000 + t.tv_nsec as u64 / 1_000;
        self.send(&format!("RELOADING=1\nMONOTONIC_USEC={usec}\n"));
    }

    /// `STOPPING=1`: the server stops accepting and drains.
    pub fn stopping(&mut self, status: &str) {
        self.send(&format!("STOPPING=1\nSTATUS={}\n", one_line(status)));
    }

    fn connect(&self) -> io::Result<UnixDatagram> {
        let addr = self
            .addr
            .as_ref()
            .expect("connect is called with an address");
        let s = UnixDatagram::unbound()?;
        s.connect_addr(addr)?;
        Ok(s)
    }

    fn send(&mut self, msg: &str) {
        if self.addr.is_none() {
            return;
        }
        // The held socket first; if that fails (the manager re-created its socket), one
        // fresh connection.
        let mut last = None;
        for _ in 0..2 {
            if self.sock.is_none() {
                match self.connect() {
                    Ok(s) => self.sock = Some(s),
                    Err(e) => {
                        last = Some(e);
                        continue;
                    }
                }
            }
            let s = self.sock.as_ref().expect("set just above");
            match s.send(msg.as_bytes()) {
                Ok(n) if n == msg.len() => return,
                Ok(n) => last = Some(io::Error::other(format!("sent {n} of {} bytes", msg.len()))),
                Err(e) => last = Some(e),
            }
            self.sock = None;
        }
        if let Some(e) = last {
            self.warn(&e);
        }
    }

    fn warn(&mut self, e: &io::Error) {
        if !self.warned {
            self.warned = true;
            tracing::warn!(
                notify_socket = ?std::env::var_os("NOTIFY_SOCKET"),
                error = %e,
                "cannot notify the service manager (NOTIFY_SOCKET); a Type=notify unit will not see the server ready"
            );
        }
    }
}

/// `$NOTIFY_SOCKET` as an address: an absolute path, or `@name` for Linux's abstract
/// namespace (the `@` stands for the leading NUL byte).
fn notify_addr(v: &[u8]) -> io::Result<SocketAddr> {
    match v.first() {
        Some(b'/') => SocketAddr::from_pathname(Path::new(std::ffi::OsStr::from_bytes(v))),
        Some(b'@') => SocketAddr::from_abstract_name(&v[1..]),
        _ => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "NOTIFY_SOCKET is neither an absolute path nor @abstract (vsock: is not supported)",
        )),
    }
}

/// A notification value is one line: a newline would start another `KEY=VALUE`.
fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

/// The user and group `penstock serve` runs as once its listeners are bound: `user` and
/// `group` of the configuration, resolved when the configuration is read (an unknown name
/// refuses the start before anything is bound).
#[derive(Debug, Clone)]
pub struct RunAs {
    user: String,
    uid: Uid,
    group: String,
    gid: Gid,
}

/// What [`RunAs::apply`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Switched {
    /// Started as root (or with CAP_SETUID and CAP_SETGID): now the configured user and
    /// group, no supplementary groups, no capabilities.
    Dropped,
    /// Started as the configured user and group already (systemd's `User=`): nothing to do.
    Already,
}

impl RunAs {
    /// Resolves `user` (a name, else a number) and `group` (the same; default: the user's
    /// primary group). `None` when no user is configured.
    pub fn resolve(user: Option<&str>, group: Option<&str>) -> Result<Option<RunAs>> {
        let Some(user) = user else {
            if group.is_some() {
                bail!("`group` is set without `user`: name the user to switch to");
            }
            return Ok(None);
        };
        let (uid, primary) =
            match User::from_name(user).with_context(|| format!("looking up user {user:?}"))? {
                Some(u) => (u.uid, Some(u.gid)),
                None => match user.parse::<u32>() {
                    // A number without a passwd entry: allowed (containers), but then the
                    // group must be named.
                    Ok(n) => {
                        let u = User::from_uid(Uid::from_raw(n))
                            .with_context(|| format!("looking up uid {n}"))?;
                        (Uid::from_raw(n), u.map(|u| u.gid))
                    }
                    Err(_) => bail!("user {user:?}: no such user (configuration key `user`)"),
                },
            };
        let (group, gid) = match group {
            Some(g) => {
                let gid = match Group::from_name(g)
                    .with_context(|| format!("looking up group {g:?}"))?
                {
                    Some(gr) => gr.gid,
                    None => match g.parse::<u32>() {
                        Ok(n) => Gid::from_raw(n),
                        Err(_) => bail!("group {g:?}: no such group (configuration key `group`)"),
                    },
                };
                (g.to_string(), gid)
            }
            None => match primary {
                Some(gid) => {
                    let name = Group::from_gid(gid).ok().flatten().map(|g| g.name);
                    (name.unwrap_or_else(|| gid.to_string()), gid)
                }
                None => bail!(
                    "user {user:?} has no passwd entry to take a primary group from: set `group`"
                ),
            },
        };
        Ok(Some(RunAs {
            user: user.to_string(),
            uid,
            group,
            gid,
        }))
    }

    /// [`resolve`](Self::resolve), then checks that the switch can happen, before anything
    /// is bound: the process runs as the user already, or has CAP_SETUID and CAP_SETGID
    /// (root has both, unless a bounding set took them away).
    pub fn prepare(user: Option<&str>, group: Option<&str>) -> Result<Option<RunAs>> {
        let Some(r) = RunAs::resolve(user, group)? else {
            return Ok(None);
        };
        if !r.switches() {
            r.check_group()?;
            return Ok(Some(r));
        }
        let euid = rustix::process::geteuid().as_raw();
        let status =
            std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
        let ids = ThreadIds::parse(&status).context("parsing /proc/self/status")?;
        const CAP_SETGID: u64 = 1 << 6;
        const CAP_SETUID: u64 = 1 << 7;
        if ids.cap_eff & (CAP_SETGID | CAP_SETUID) != CAP_SETGID | CAP_SETUID {
            bail!(
                "configured to run as user {} (uid {}), but started as uid {euid} without \
                 CAP_SETUID and CAP_SETGID: start `penstock serve` as root or as {} itself, \
                 or remove `user` from the configuration",
                r.user,
                r.uid,
                r.user
            );
        }
        Ok(Some(r))
    }

    /// Whether [`apply`](Self::apply) will change users (rather than find the process
    /// running as the user already).
    pub fn switches(&self) -> bool {
        rustix::process::getuid().as_raw() != self.uid()
            || rustix::process::geteuid().as_raw() != self.uid()
    }

    /// Running as the user already: the group must be the configured one too (without
    /// CAP_SETGID it cannot be changed).
    fn check_group(&self) -> Result<()> {
        let gid = rustix::process::getgid().as_raw();
        let egid = rustix::process::getegid().as_raw();
        if gid != self.gid() || egid != self.gid() {
            bail!(
                "running as user {} but group {gid} (effective {egid}), not the configured group \
                 {} ({}); start it with that group or change `group`",
                self.user,
                self.group,
                self.gid()
            );
        }
        Ok(())
    }

    pub fn uid(&self) -> u32 {
        self.uid.as_raw()
    }

    pub fn gid(&self) -> u32 {
        self.gid.as_raw()
    }

    /// Switches the whole process (every thread) to the user and group, then checks that
    /// it did: real, effective and saved ids of every thread, no supplementary group, no
    /// capability left, and no way back to root. Call it after every listener is bound,
    /// the root opened and the token and control socket written: nothing after needs root.
    /// Any failure is an error — the server must not go on as root when a user is
    /// configured. `root` (the served directory) must be readable by the user afterwards.
    pub fn apply(&self, root: &Path) -> Result<Switched> {
        let done = if !self.switches() {
            self.check_group()?;
            Switched::Already
        } else {
            let how = "start `penstock serve` as root (or with CAP_SETUID and CAP_SETGID) to \
                       switch, or as that user itself, or remove `user` from the configuration";
            // Groups first: once the uid is not 0 they can no longer be changed.
            nix::unistd::setgroups(&[]).map_err(|e| {
                anyhow!(
                    "cannot switch to user {} (uid {}): setgroups: {e}; {how}",
                    self.user,
                    self.uid
                )
            })?;
            nix::unistd::setgid(self.gid).map_err(|e| {
                anyhow!(
                    "cannot switch to group {} (gid {}): setgid: {e}; {how}",
                    self.group,
                    self.gid
                )
            })?;
            nix::unistd::setuid(self.uid).map_err(|e| {
                anyhow!(
                    "cannot switch to user {} (uid {}): setuid: {e}; {how}",
                    self.user,
                    self.uid
                )
            })?;
            Switched::Dropped
        };
        self.verify(done)?;
        rustix::fs::access(root, rustix::fs::Access::READ_OK | rustix::fs::Access::EXEC_OK)
            .map_err(|e| {
                anyhow!(
                    "the served root {} is not readable by user {} (uid {}): {e}; every request would fail",
                    root.display(),
                    self.user,
                    self.uid
                )
            })?;
        Ok(done)
    }

    fn verify(&self, done: Switched) -> Result<()> {
        let (u, g) = (self.uid(), self.gid());
        let mut threads = 0;
        for entry in std::fs::read_dir("/proc/self/task").context("reading /proc/self/task")? {
            let entry = entry?;
            let status = match std::fs::read_to_string(entry.path().join("status")) {
                Ok(s) => s,
                // A thread that ended meanwhile.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e).context("reading a thread's status"),
            };
            let ids = ThreadIds::parse(&status)
                .with_context(|| format!("parsing {}/status", entry.path().display()))?;
            let ok = ids.uids.iter().all(|&x| x == u)
                && ids.gids.iter().all(|&x| x == g)
                && (done == Switched::Already || (ids.groups.is_empty() && ids.cap_eff == 0));
            if !ok {
                bail!(
                    "thread {} did not switch to user {} (uid {u}, gid {g}): {ids:?}; refusing to go on",
                    entry.file_name().to_string_lossy(),
                    self.user
                );
            }
            threads += 1;
        }
        if threads == 0 {
            bail!(
                "no thread found in /proc/self/task; cannot check the switch to user {}",
                self.user
            );
        }
        if u != 0 && nix::unistd::setuid(Uid::from_raw(0)).is_ok() {
            bail!(
                "switched to user {} but could become root again; refusing to go on",
                self.user
            );
        }
        Ok(())
    }
}

/// After `Server::start`: switches to the configured user ([`RunAs::apply`]) and says so at
/// info; with no user configured, a server running as root says so at info, once.
pub fn switch_user(run_as: Option<&RunAs>, root: &Path) -> Result<()> {
    match run_as {
        Some(r) => {
            let how = r.apply(root)?;
            tracing::info!(
                user = %r.user,
                uid = r.uid(),
                group = %r.group,
                gid = r.gid(),
                switched = how == Switched::Dropped,
                "running as the configured user"
            );
        }
        None if rustix::process::geteuid().is_root() => tracing::info!(
            "running as root (set `user` to drop it once the listeners are bound: docs/service.md)"
        ),
        None => {}
    }
    Ok(())
}

/// The id lines of `/proc/PID/task/TID/status`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ThreadIds {
    /// Real, effective, saved, filesystem.
    uids: Vec<u32>,
    gids: Vec<u32>,
    groups: Vec<u32>,
    cap_eff: u64,
}

impl ThreadIds {
    fn parse(status: &str) -> Option<ThreadIds> {
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k).and_then(|r| r.strip_prefix(':')))
        };
        let nums = |k: &str| -> Option<Vec<u32>> {
            field(k)?
                .split_whitespace()
                .map(|x| x.parse().ok())
                .collect()
        };
        let ids = ThreadIds {
            uids: nums("Uid")?,
            gids: nums("Gid")?,
            groups: nums("Groups")?,
            cap_eff: u64::from_str_radix(field("CapEff")?.trim(), 16).ok()?,
        };
        (ids.uids.len() == 4 && ids.gids.len() == 4).then_some(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notify_socket_values_are_paths_or_abstract_names() {
        let p = notify_addr(b"/run/systemd/notify").unwrap();
        assert_eq!(p.as_pathname(), Some(Path::new("/run/systemd/notify")));
        let a = notify_addr(b"@/org/freedesktop/systemd1/notify").unwrap();
        assert_eq!(
            a.as_abstract_name(),
            Some(&b"/org/freedesktop/systemd1/notify"[..])
        );
        assert!(notify_addr(b"vsock:2:1234").is_err());
        assert!(notify_addr(b"relative/path").is_err());
    }

    #[test]
    fn a_status_is_one_line() {
        assert_eq!(one_line("a\nSTOPPING=1\r\n"), "a STOPPING=1  ");
    }

    #[test]
    fn thread_ids_come_from_the_status_lines() {
        let s = "Name:\tx\nUid:\t65534\t65534\t65534\t65534\nGid:\t65534\t65534\t65534\t65534\n\
                 Groups:\t\nCapEff:\t0000000000000000\n";
        let ids = ThreadIds::parse(s).unwrap();
        assert_eq!(ids.uids, [65534; 4]);
        assert!(ids.groups.is_empty());
        assert_eq!(ids.cap_eff, 0);
        let root = "Uid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nGroups:\t0 4\nCapEff:\t000001ffffffffff\n";
        let ids = ThreadIds::parse(root).unwrap();
        assert_eq!(ids.groups, [0, 4]);
        assert_ne!(ids.cap_eff, 0);
        assert!(ThreadIds::parse("Uid:\t1\t2\n").is_none());
    }

    #[test]
    fn users_and_groups_resolve_by_name_or_number_and_unknown_ones_refuse() {
        let r = RunAs::resolve(Some("root"), None).unwrap().unwrap();
        assert_eq!((r.uid(), r.gid()), (0, 0));
        let r = RunAs::resolve(Some("0"), Some("0")).unwrap().unwrap();
        assert_eq!((r.uid(), r.gid()), (0, 0));
        let e = RunAs::resolve(Some("no-such-user-penstock"), None).unwrap_err();
        assert!(e.to_string().contains("no such user"), "{e}");
        let e = RunAs::resolve(Some("root"), Some("no-such-group-penstock")).unwrap_err();
        assert!(e.to_string().contains("no such group"), "{e}");
        assert!(RunAs::resolve(None, Some("root")).is_err());
        assert!(RunAs::resolve(None, None).unwrap().is_none());
    }
}
