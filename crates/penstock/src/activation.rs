//! Socket activation: listening sockets handed over by systemd (`LISTEN_FDS`, see
//! sd_listen_fds(3)) become `penstock serve`'s HTTP listeners instead of `[http] listen`.
//!
//! Every passed descriptor must be a listening TCP socket; a `FileDescriptorName=` other
//! than `http` (or systemd's default names) is refused, so that a socket meant for
//! something else is never served as HTTP by mistake. The variables are unset once read, so
//! children do not inherit them.

use std::net::TcpListener;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};

use anyhow::{Result, bail};

/// Names systemd gives a descriptor without `FileDescriptorName=`.
fn is_http_name(name: &str) -> bool {
    matches!(name, "http" | "unknown" | "stored" | "connection") || name.ends_with(".socket")
}

/// The HTTP listeners passed by the service manager; empty when none were.
///
/// Must run before the process starts threads (it unsets environment variables).
pub fn take_http_listeners() -> Result<Vec<TcpListener>> {
    if std::env::var_os("LISTEN_FDS").is_none() {
        return Ok(Vec::new());
    }
    // SAFETY: called from `penstock serve` before any thread is started (the engine, the
    // workers and the signal iterator come after), which is the precondition of
    // `std::env::remove_var` that this function inherits.
    let fds = unsafe { sd_notify::listen_fds_with_names_and_unset_env() }?;
    let mut out = Vec::new();
    for (raw, name) in fds {
        // SAFETY: the service manager passed `raw` to this process for it to own
        // (sd_listen_fds(3)); `listen_fds` checked LISTEN_PID is ours and that the number is
        // within LISTEN_FDS, and nothing else in the process has taken it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        if !is_http_name(&name) {
            bail!(
                "socket activation passed a descriptor named {name:?}: penstock serve takes HTTP sockets only (FileDescriptorName=http)"
            );
        }
        let listening = rustix::net::sockopt::socket_acceptconn(fd.as_fd()).unwrap_or(false);
        let stream = rustix::net::sockopt::socket_type(fd.as_fd())
            .is_ok_and(|t| t == rustix::net::SocketType::STREAM);
        let l = TcpListener::from(fd);
        // std reads back only IPv4 and IPv6 addresses: a Unix socket fails here.
        let inet = l.local_addr().is_ok();
        if !(listening && stream && inet) {
            bail!(
                "socket activation passed descriptor {raw} ({name}) that is not a listening TCP socket (ListenStream=ADDRESS:PORT in the .socket unit)"
            );
        }
        out.push(l);
    }
    Ok(out)
}
