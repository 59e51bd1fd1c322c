//! Opening endpoints: from a parsed name to a file descriptor and what kind of thing it is.
//!
//! Opening may block (a `tcp-listen://` source waits for its one peer, a `tcp://` target
//! connects); it happens on the caller's thread, before the stream reaches a worker, so a
//! worker's event loop never blocks on it. Sockets are made non-blocking (the worker waits
//! for readiness); files, pipes and the caller's stdin/stdout stay as they are.

use std::fs::{File, OpenOptions};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::net::UnixStream;
use std::path::Path;

use penstock_core::endpoint::{Endpoint, Host, Role};
use penstock_core::stream::IoKind;

use crate::files::Descriptor;
use crate::volume::{Access, PartitionIo, Volume, VolumeError};

/// An opened endpoint.
#[derive(Debug)]
pub struct Opened {
    /// The caller's own descriptor (`OwnedFd::into`, `File::into`); the engine shares a
    /// read-only file source's with other streams of the same file (`files`).
    pub fd: Descriptor,
    pub kind: IoKind,
    /// Size in bytes, for files and block devices.
    pub size: Option<u64>,
    /// Whether `fd` is a socket (send/recv flags apply).
    pub socket: bool,
    /// A human name for messages.
    pub label: String,
    /// A volume partition (`vol:`): `fd` is then only a placeholder (a member's descriptor);
    /// the bytes move through the per-member descriptors here, on the uring path.
    pub volume: Option<Box<PartitionIo>>,
}

/// Why an endpoint could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    #[error("{label}: {source}")]
    Io { label: String, source: io::Error },
    #[error("{label}: is a directory; a stream needs a file, a device, a socket or -")]
    Directory { label: String },
    #[error("{label}: cannot resolve host: {source}")]
    Resolve { label: String, source: io::Error },
    /// (`error`, not `source`: the message already includes it, and a source would make
    /// anyhow print it twice.)
    #[error("{label}: {error}")]
    Volume { label: String, error: VolumeError },
    #[error("{label}: not supported as a {role} yet")]
    Unsupported { label: String, role: &'static str },
    /// An `fd:N` descriptor that is open but cannot play its part (a directory, a listening
    /// socket, a read-only descriptor as a target, ...): `reason` says what to pass instead.
    #[error("{label}: {reason}")]
    Descriptor { label: String, reason: String },
}

impl OpenError {
    /// The OS error behind this one, when there is one (`EBADF` for a closed `fd:N`).
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            OpenError::Io { source, .. } | OpenError::Resolve { source, .. } => {
                source.raw_os_error()
            }
            _ => None,
        }
    }
}

fn io_err(label: &str) -> impl FnOnce(io::Error) -> OpenError + '_ {
    move |source| OpenError::Io {
        label: label.to_string(),
        source,
    }
}

fn host_port(host: &Host, port: u16, label: &str) -> Result<Vec<SocketAddr>, OpenError> {
    let addrs: Vec<SocketAddr> = match host {
        Host::Ip(ip) => vec![SocketAddr::new(*ip, port)],
        Host::Name(name) => (name.as_str(), port)
            .to_socket_addrs()
            .map_err(|source| OpenError::Resolve {
                label: label.to_string(),
                source,
            })?
            .collect(),
    };
    if addrs.is_empty() {
        return Err(OpenError::Resolve {
            label: label.to_string(),
            source: io::Error::new(io::ErrorKind::NotFound, "no address"),
        });
    }
    Ok(addrs)
}

/// Classifies an opened file: a regular file or a block device (with its size), or a pipe.
pub fn classify_file(file: File, label: String) -> Result<Opened, OpenError> {
    let meta = file.metadata().map_err(io_err(&label))?;
    let ft = meta.file_type();
    if ft.is_dir() {
        return Err(OpenError::Directory { label });
    }
    let (kind, size) = if ft.is_file() {
        (IoKind::File, Some(meta.len()))
    } else if ft.is_block_device() {
        let size = rustix::fs::seek(&file, rustix::fs::SeekFrom::End(0))
            .map_err(|e| io_err(&label)(e.into()))?;
        rustix::fs::seek(&file, rustix::fs::SeekFrom::Start(0))
            .map_err(|e| io_err(&label)(e.into()))?;
        (IoKind::File, Some(size))
    } else {
        (IoKind::Pipe, None)
    };
    Ok(Opened {
        fd: file.into(),
        kind,
        size,
        socket: false,
        label,
        volume: None,
    })
}

fn datagram_socket(fd: OwnedFd, label: String) -> Opened {
    Opened {
        kind: IoKind::Datagram,
        ..stream_socket(fd, label)
    }
}

/// The wildcard address of `remote`'s family, at `port` (0: any), to bind a local end to.
fn any_local(remote: SocketAddr, port: u16) -> SocketAddr {
    if remote.is_ipv4() {
        ([0, 0, 0, 0], port).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, port).into()
    }
}

fn stream_socket(fd: OwnedFd, label: String) -> Opened {
    Opened {
        fd: fd.into(),
        kind: IoKind::StreamSocket,
        size: None,
        socket: true,
        label,
        volume: None,
    }
}

fn set_nonblocking(fd: impl AsFd, label: &str) -> Result<(), OpenError> {
    rustix::io::ioctl_fionbio(fd, true).map_err(|e| io_err(label)(e.into()))
}

/// Called with the address a listening endpoint is bound to, before it waits for its peer
/// (so that a caller can print it when the port was 0).
pub type OnListen<'a> = &'a mut dyn FnMut(SocketAddr);

/// Opens `ep` to be read from.
pub fn open_source(ep: &Endpoint, on_listen: OnListen<'_>) -> Result<Opened, OpenError> {
    let label = ep.to_string();
    match ep {
        Endpoint::File { path } => {
            let f = File::open(path).map_err(io_err(&label))?;
            classify_file(f, label)
        }
        Endpoint::Stdio => {
            let fd =
                rustix::io::dup(rustix::stdio::stdin()).map_err(|e| io_err(&label)(e.into()))?;
            classify_file(File::from(fd), "stdin".to_string())
        }
        Endpoint::TcpConnect { .. } | Endpoint::TcpListen { .. } => {
            open_stream_socket(ep, label, on_listen)
        }
        Endpoint::UdpListen { host, port } => {
            let addrs = host_port(host, *port, &label)?;
            let s = UdpSocket::bind(&addrs[..]).map_err(io_err(&label))?;
            on_listen(s.local_addr().map_err(io_err(&label))?);
            set_nonblocking(&s, &label)?;
            Ok(datagram_socket(s.into(), label))
        }
        Endpoint::Unix { .. } | Endpoint::UnixListen { .. } => {
            open_stream_socket(ep, label, on_listen)
        }
        Endpoint::Volume { volume, partition } => {
            open_volume(volume.as_str(), partition.as_str(), Access::Shared)
        }
        Endpoint::Fd { fd } => open_fd(*fd, Role::Source),
        other => Err(OpenError::Unsupported {
            label: other.to_string(),
            role: "source",
        }),
    }
}

/// Opens `ep` to be written to. Files are created or truncated (block devices are not
/// truncated).
pub fn open_target(ep: &Endpoint, on_listen: OnListen<'_>) -> Result<Opened, OpenError> {
    let label = ep.to_string();
    match ep {
        Endpoint::File { path } => open_target_file(path, label),
        Endpoint::Stdio => {
            let fd =
                rustix::io::dup(rustix::stdio::stdout()).map_err(|e| io_err(&label)(e.into()))?;
            classify_file(File::from(fd), "stdout".to_string())
        }
        Endpoint::TcpConnect { .. } | Endpoint::TcpListen { .. } => {
            open_stream_socket(ep, label, on_listen)
        }
        Endpoint::UdpSend {
            host,
            port,
            local_port,
        } => {
            let addrs = host_port(host, *port, &label)?;
            let remote = addrs[0];
            let s = UdpSocket::bind(any_local(remote, local_port.unwrap_or(0)))
                .map_err(io_err(&label))?;
            s.connect(remote).map_err(io_err(&label))?;
            set_nonblocking(&s, &label)?;
            Ok(datagram_socket(s.into(), label))
        }
        Endpoint::Unix { .. } | Endpoint::UnixListen { .. } => {
            open_stream_socket(ep, label, on_listen)
        }
        Endpoint::Volume { volume, partition } => {
            open_volume(volume.as_str(), partition.as_str(), Access::SharedWrite)
        }
        Endpoint::Fd { fd } => open_fd(*fd, Role::Target),
        other => Err(OpenError::Unsupported {
            label: other.to_string(),
            role: "target",
        }),
    }
}

/// Takes descriptor `fd` of this process for a stream (an `fd:N` endpoint): duplicates it (the
/// caller keeps and may close its own) and finds out what it is — fstat(2) for files, block
/// devices, pipes and character devices, getsockopt(2) `SO_TYPE`, `SO_ACCEPTCONN` for
/// sockets. Refused, saying why: a descriptor not open (`EBADF`), a directory, an `O_PATH`
/// descriptor, one not open for `role`'s direction (a read-only target, a write-only source),
/// a listening socket, a stream socket without a peer, a UDP target without a peer to send to
/// (`connect(2)` it first), a socket type other than stream or datagram.
///
/// A socket is made non-blocking, as every socket of a stream is; `O_NONBLOCK` belongs to
/// the open file description, which the duplicate shares, so the caller's own descriptor
/// becomes non-blocking too. A file source is read at the stream's offsets (pread), whatever
/// the descriptor's position; a file or pipe target is written at its position, as write(2)
/// would.
pub fn open_fd(fd: i32, role: Role) -> Result<Opened, OpenError> {
    use rustix::fs::{FileType, OFlags};
    let label = format!("fd:{fd}");
    let refuse = |reason: &str| OpenError::Descriptor {
        label: label.clone(),
        reason: reason.to_string(),
    };
    let own = penstock_uring::sys::dup_fd_number(fd).map_err(io_err(&label))?;
    let flags = rustix::fs::fcntl_getfl(&own).map_err(|e| io_err(&label)(e.into()))?;
    if flags.contains(OFlags::PATH) {
        return Err(refuse(
            "an O_PATH descriptor cannot be read or written; open the file for reading or writing",
        ));
    }
    let stat = rustix::fs::fstat(&own).map_err(|e| io_err(&label)(e.into()))?;
    let file_type = FileType::from_raw_mode(stat.st_mode);
    if file_type == FileType::Socket {
        return open_fd_socket(own, role, label);
    }
    let access = flags & OFlags::RWMODE;
    match role {
        Role::Source if access == OFlags::WRONLY => {
            return Err(refuse(
                "open for writing only; a source needs a descriptor open for reading",
            ));
        }
        Role::Target if access == OFlags::RDONLY => {
            return Err(refuse(
                "open for reading only; a target needs a descriptor open for writing",
            ));
        }
        _ => {}
    }
    match file_type {
        FileType::Directory => Err(OpenError::Directory { label }),
        FileType::RegularFile => Ok(Opened {
            fd: own.into(),
            kind: IoKind::File,
            size: Some(u64::try_from(stat.st_size).unwrap_or(0)),
            socket: false,
            label,
            volume: None,
        }),
        FileType::BlockDevice => {
            // The size by seeking to the end, then back: the position is shared with the
            // caller's descriptor, so it is put back where it was.
            let seek = |to| rustix::fs::seek(&own, to).map_err(|e| io_err(&label)(e.into()));
            let was = seek(rustix::fs::SeekFrom::Current(0))?;
            let size = seek(rustix::fs::SeekFrom::End(0))?;
            seek(rustix::fs::SeekFrom::Start(was))?;
            Ok(Opened {
                fd: own.into(),
                kind: IoKind::File,
                size: Some(size),
                socket: false,
                label,
                volume: None,
            })
        }
        // FIFOs and character devices: read or written in order, no size (as `classify_file`).
        _ => Ok(Opened {
            fd: own.into(),
            kind: IoKind::Pipe,
            size: None,
            socket: false,
            label,
            volume: None,
        }),
    }
}

fn open_fd_socket(own: OwnedFd, role: Role, label: String) -> Result<Opened, OpenError> {
    use rustix::net::SocketType;
    let refuse = |reason: &str| OpenError::Descriptor {
        label: label.clone(),
        reason: reason.to_string(),
    };
    let sys = |e: rustix::io::Errno| io_err(&label)(e.into());
    if rustix::net::sockopt::socket_acceptconn(&own).map_err(sys)? {
        return Err(refuse(
            "a listening socket; accept(2) a connection and pass the connected socket",
        ));
    }
    let ty = rustix::net::sockopt::socket_type(&own).map_err(sys)?;
    // ENOTCONN is the one answer that means no peer (an unnamed Unix peer, as a socketpair's,
    // still is one).
    let has_peer = !matches!(
        rustix::net::getpeername(&own),
        Err(rustix::io::Errno::NOTCONN)
    );
    let kind = if ty == SocketType::STREAM {
        if !has_peer {
            return Err(refuse(
                "a stream socket with no peer; pass a connected (or accepted) socket",
            ));
        }
        IoKind::StreamSocket
    } else if ty == SocketType::DGRAM {
        if role == Role::Target && !has_peer {
            return Err(refuse(
                "a datagram socket with no peer to send to; connect(2) it to the receiver first",
            ));
        }
        IoKind::Datagram
    } else {
        return Err(refuse(
            "a socket that is neither a stream (TCP, Unix) nor a datagram (UDP) socket",
        ));
    };
    set_nonblocking(&own, &label)?;
    Ok(Opened {
        fd: own.into(),
        kind,
        size: None,
        socket: true,
        label,
        volume: None,
    })
}

/// Opens partition `partition` of volume `vol` (a name in `PENSTOCK_VOLUMES` or a member's
/// file name) for a stream, sharing the volume with other streams (`Access`). The partition must
/// be ready; a target is overwritten from its start, up to its size.
fn open_volume(vol: &str, partition: &str, access: Access) -> Result<Opened, OpenError> {
    opened_partition(open_partition(vol, partition, access)?)
}

/// The I/O of a ready partition `partition` of volume `vol` (see [`open_volume`]): its member
/// descriptors hold the volume's lock (`access`) for as long as they live.
pub fn open_partition(
    vol: &str,
    partition: &str,
    access: Access,
) -> Result<PartitionIo, OpenError> {
    let label = format!("vol:{vol}/{partition}");
    let err = |error| OpenError::Volume {
        label: label.clone(),
        error,
    };
    let path = crate::volume::resolve(vol).map_err(err)?;
    let v = Volume::open(&path, access).map_err(err)?;
    v.partition_io(partition, false).map_err(err)
}

/// An [`Opened`] for a partition the caller already holds (an import writing the partition it
/// is creating, under its own exclusive lock).
pub fn opened_partition(pio: PartitionIo) -> Result<Opened, OpenError> {
    let label = format!("vol:{}", pio.label);
    // A volume has at least one member (checked when its layout was built).
    let fd = pio.members[0].try_clone().map_err(io_err(&label))?;
    Ok(Opened {
        fd: fd.into(),
        kind: IoKind::File,
        size: Some(pio.size_bytes),
        socket: false,
        label,
        volume: Some(Box::new(pio)),
    })
}

/// Stream sockets mean the same as a source and as a target: connect, or listen and accept
/// one peer.
fn open_stream_socket(
    ep: &Endpoint,
    label: String,
    on_listen: OnListen<'_>,
) -> Result<Opened, OpenError> {
    match ep {
        Endpoint::TcpConnect {
            host,
            port,
            local_port,
        } => {
            let s = tcp_connect(host, *port, *local_port, &label)?;
            Ok(stream_socket(s.into(), label))
        }
        Endpoint::TcpListen { host, port } => {
            let addrs = host_port(host, *port, &label)?;
            let l = TcpListener::bind(&addrs[..]).map_err(io_err(&label))?;
            on_listen(l.local_addr().map_err(io_err(&label))?);
            let (s, _) = l.accept().map_err(io_err(&label))?;
            set_nonblocking(&s, &label)?;
            Ok(stream_socket(s.into(), label))
        }
        Endpoint::Unix { path } => {
            let s = UnixStream::connect(path).map_err(io_err(&label))?;
            set_nonblocking(&s, &label)?;
            Ok(stream_socket(s.into(), label))
        }
        Endpoint::UnixListen { path } => unix_listen(path, label),
        other => unreachable!("{other} is not a stream socket endpoint"),
    }
}

fn tcp_connect(
    host: &Host,
    port: u16,
    local_port: Option<u16>,
    label: &str,
) -> Result<TcpStream, OpenError> {
    let addrs = host_port(host, port, label)?;
    let s = match local_port {
        None => TcpStream::connect(&addrs[..]).map_err(io_err(label))?,
        Some(lp) => {
            let remote = addrs[0];
            let domain = socket2::Domain::for_address(remote);
            let sock =
                socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))
                    .map_err(io_err(label))?;
            let local = any_local(remote, lp);
            sock.set_reuse_address(true).map_err(io_err(label))?;
            sock.bind(&local.into()).map_err(io_err(label))?;
            sock.connect(&remote.into()).map_err(io_err(label))?;
            sock.into()
        }
    };
    let _ = s.set_nodelay(true);
    set_nonblocking(&s, label)?;
    Ok(s)
}

fn unix_listen(path: &Path, label: String) -> Result<Opened, OpenError> {
    let l = std::os::unix::net::UnixListener::bind(path).map_err(io_err(&label))?;
    let (s, _) = l.accept().map_err(io_err(&label))?;
    drop(l);
    let _ = std::fs::remove_file(path);
    set_nonblocking(&s, &label)?;
    Ok(stream_socket(s.into(), label))
}

fn open_target_file(path: &Path, label: String) -> Result<Opened, OpenError> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => return Err(OpenError::Directory { label }),
        Ok(m)
            if m.file_type().is_block_device()
                || m.file_type().is_char_device()
                || m.file_type().is_fifo() =>
        {
            let f = OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(io_err(&label))?;
            return classify_file(f, label);
        }
        _ => {}
    }
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(path)
        .map_err(io_err(&label))?;
    classify_file(f, label)
}

/// Opens a file the caller names and owns (a benchmark's or calibration's scratch file) with
/// O_DIRECT. `None` when the file system refuses O_DIRECT. Streams never use it: their
/// O_DIRECT descriptor is the opened source's own inode, reopened by the engine through
/// `/proc/self/fd`, never by a path that may have changed since.
pub fn reopen_direct(path: &Path) -> Option<OwnedFd> {
    OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
        .open(path)
        .ok()
        .map(OwnedFd::from)
}
