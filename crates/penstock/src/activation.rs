//! Socket activation: listening sockets handed over by systemd (`LISTEN_FDS`, see
//! sd_listen_fds(3)) become `penstock serve`'s HTTP listeners instead of `[http] listen`.
//!
//! Every passed descriptor must be a listening TCP socket; a `FileDescriptorName=` other
//! than `http` (or systemd's default names) is refused, so that a socket meant for
//! something else is never served as HTTP by mistake. The variables are unset once read, so
//! children do not inherit them.

use std::net::TcpListener;
use std::os::fd::{AsFd, AsRawFd};

use anyhow::{Result, bail};

/// Names systemd gives a descriptor without `FileDescriptorName=`.
fn is_http_name(name: &str) -> bool {
    matches!(name, "http" | "unknown" | "stored" | "connection") || name.ends_with(".socket")
}

/// The HTTP listeners passed by the service manager; empty when none were.
///
/// Must run before the process starts threads (it unsets environment variables).
pub fn take_http_listeners() -> Result<Vec<TcpListener>> {
    // Refused if threads were started already: the variables are unset.
    let fds = penstock_uring::sys::take_listen_fds()?;
    let mut out = Vec::new();
    for (fd, name) in fds {
        let raw = fd.as_raw_fd();
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
