//! What the library's streams may name, and how their endpoints open: the calling process's
//! own rights, as `penstock stream` has them (there is no one else to protect it from), with
//! the control protocol's meanings kept (`TRUNCATE`, listeners that wait off the caller's
//! thread, a connect timeout).

use std::os::unix::fs::FileTypeExt;
use std::time::Duration;

use penstock_core::endpoint::{Endpoint, Role};
use penstock_driver::open::{classify_file, open_fd, open_source, open_target};
use penstock_server::access::{Denied, Listener, Prepared, connect_tcp, resolve};
use penstock_server::streams::EndpointPolicy;

/// The in-process policy: every name the process could open itself.
pub(crate) struct LocalPolicy {
    pub connect_timeout: Duration,
}

impl EndpointPolicy for LocalPolicy {
    /// Everything: the library runs with its caller's rights, on its caller's behalf.
    fn check(&self, _ep: &Endpoint, _role: Role) -> Result<(), Denied> {
        Ok(())
    }

    fn prepare(&self, ep: &Endpoint, role: Role, truncate: bool) -> Result<Prepared, Denied> {
        let label = ep.to_string();
        let failed = |e: &dyn std::fmt::Display| Denied::Failed(format!("{label}: {e}"));
        match ep {
            Endpoint::TcpListen { host, port } => {
                Listener::bind_tcp(&resolve(host, *port, &label)?, label.clone())
                    .map(Prepared::Listening)
            }
            Endpoint::UnixListen { path } => {
                Listener::bind_unix(path, label.clone()).map(Prepared::Listening)
            }
            Endpoint::TcpConnect {
                host,
                port,
                local_port,
            } => {
                let addrs = resolve(host, *port, &label)?;
                let fd = connect_tcp(&addrs, *local_port, self.connect_timeout)
                    .map_err(|e| failed(&e))?;
                Ok(Prepared::Ready(penstock_driver::open::Opened {
                    fd: fd.into(),
                    kind: penstock_core::stream::IoKind::StreamSocket,
                    size: None,
                    socket: true,
                    label: label.clone(),
                    volume: None,
                }))
            }
            // A file target is made new, or cut only with TRUNCATE (as over the control
            // protocol); a device or FIFO is written as it is.
            Endpoint::File { path } if role == Role::Target => {
                let special = std::fs::metadata(path).is_ok_and(|m| {
                    let t = m.file_type();
                    t.is_block_device() || t.is_char_device() || t.is_fifo()
                });
                let mut o = std::fs::OpenOptions::new();
                o.write(true);
                if !special {
                    if truncate {
                        o.create(true).truncate(true);
                    } else {
                        o.create_new(true);
                    }
                }
                let f = o.open(path).map_err(|e| {
                    if e.kind() == std::io::ErrorKind::AlreadyExists {
                        Denied::Failed(format!(
                            "{label}: exists; say TRUNCATE in the options to overwrite it"
                        ))
                    } else {
                        failed(&e)
                    }
                })?;
                classify_file(f, label.clone())
                    .map(Prepared::Ready)
                    .map_err(|e| Denied::Failed(e.to_string()))
            }
            Endpoint::Fd { fd } => open_fd(*fd, role)
                .map(Prepared::Ready)
                .map_err(|e| Denied::Failed(e.to_string())),
            _ => {
                let opened = match role {
                    Role::Source => open_source(ep, &mut |_| {}),
                    Role::Target => open_target(ep, &mut |_| {}),
                };
                opened
                    .map(Prepared::Ready)
                    .map_err(|e| Denied::Failed(e.to_string()))
            }
        }
    }
}
