//! Endpoints in one namespace: every source and target of a stream — a file, a block device,
//! stdin/stdout, a TCP or UDP peer, a Unix socket, a volume partition — is named by one string
//! and parsed here into a typed [`Endpoint`].
//!
//! Roadrunner (Miller et al., 1996) put every I/O element in the file-system namespace so that
//! `stream()` could join any two of them; penstock keeps that idea and adds the URL spellings
//! people type today. Parsing is pure: no name is resolved and nothing is opened. The driver
//! resolves host names, opens the endpoint, and finds out whether a `File` is a regular file,
//! a block device or something it refuses.
//!
//! # Accepted forms
//!
//! The meaning of a name depends on its [`Role`]: whether the stream reads from it (`Source`)
//! or writes to it (`Target`). "—" means the name is refused in that role.
//!
//! | name                            | as a source                            | as a target                            |
//! |---------------------------------|----------------------------------------|----------------------------------------|
//! | `PATH`, `file:PATH`             | read the file or block device          | write the file or block device         |
//! | `-`                             | stdin                                  | stdout                                 |
//! | `tcp://HOST:PORT`               | connect, read                          | connect, write                         |
//! | `tcp-listen://HOST:PORT`        | listen, accept one peer, read          | listen, accept one peer, write         |
//! | `udp://HOST:PORT`               | —  (sending only)                      | send datagrams to HOST:PORT            |
//! | `udp-listen://HOST:PORT`        | receive datagrams on HOST:PORT         | —  (receiving only)                    |
//! | `unix:PATH`                     | connect to a stream socket, read       | connect to a stream socket, write      |
//! | `unix-listen:PATH`              | listen, accept one peer, read          | listen, accept one peer, write         |
//! | `vol:VOLUME/PARTITION`          | read the partition                     | write the partition                    |
//! | `fd:N`                          | read descriptor N of the caller        | write descriptor N of the caller       |
//! | `/net/udp/PORT`                 | receive on 127.0.0.1:PORT              | send to 127.0.0.1:PORT                 |
//! | `/net/udp/HOST/PORT`            | —                                      | send to HOST:PORT                      |
//! | `/net/udp/LOCALPORT/PORT`       | —                                      | send to 127.0.0.1:PORT from LOCALPORT  |
//! | `/net/udp/LOCALPORT/HOST/PORT`  | —                                      | send to HOST:PORT from LOCALPORT       |
//! | `/net/tcp/PORT`                 | listen on 127.0.0.1:PORT, accept one   | connect to 127.0.0.1:PORT              |
//! | `/net/tcp/HOST/PORT`            | connect to HOST:PORT                   | connect to HOST:PORT                   |
//! | `/net/tcp/LOCALPORT/PORT`       | connect to 127.0.0.1:PORT from LOCALPORT | connect to 127.0.0.1:PORT from LOCALPORT |
//! | `/net/tcp/LOCALPORT/HOST/PORT`  | connect to HOST:PORT from LOCALPORT    | connect to HOST:PORT from LOCALPORT    |
//!
//! HOST is an IPv4 address, an IPv6 address in brackets (`[::1]`; bare `::1` is also accepted
//! inside `/net/...`, where `/` separates the parts), or a DNS name. PORT is decimal, without
//! leading zeros. PORT 0 is accepted only where penstock listens (the kernel picks a free port,
//! the driver reports it); a peer's port and a LOCALPORT must be 1-65535 (to let the kernel
//! pick the local port, leave LOCALPORT out). In `/net/.../A/PORT`, an all-digit `A` is a
//! LOCALPORT and anything else a HOST; no valid host is all digits, so this is unambiguous.
//!
//! # Roadrunner's Table 1, mapped
//!
//! The paper's `udpfs` names (under `/net/udp`) depend on the open mode:
//!
//! | paper mode | paper name                  | penstock role | penstock value                                  |
//! |------------|-----------------------------|---------------|-------------------------------------------------|
//! | `O_RDONLY` | `/4000`                     | `Source`      | `UdpListen { 127.0.0.1, 4000 }`                 |
//! | `O_WRONLY` | `/2592`                     | `Target`      | `UdpSend { 127.0.0.1, 2592, local_port: None }` |
//! | `O_WRONLY` | `/128.8.130.115/2592`       | `Target`      | `UdpSend { 128.8.130.115, 2592, None }`         |
//! | `O_RDWR`   | `/2592`                     | `Target`      | `UdpSend { 127.0.0.1, 2592, None }`             |
//! | `O_RDWR`   | `/4000/2592`                | `Target`      | `UdpSend { 127.0.0.1, 2592, Some(4000) }`       |
//! | `O_RDWR`   | `/128.8.130.115/2592`       | `Target`      | `UdpSend { 128.8.130.115, 2592, None }`         |
//! | `O_RDWR`   | `/4000/128.8.130.115/2592`  | `Target`      | `UdpSend { 128.8.130.115, 2592, Some(4000) }`   |
//!
//! There is no third "read and write" role, because a penstock stream moves bytes one way.
//! Every `O_RDWR` name is an `O_WRONLY` name plus the local port the socket reads on (chosen
//! by the kernel when absent), so it parses as the `Target` it writes to, with that local
//! port in `local_port`; the socket the driver opens for it is bound there and can read
//! replies, which is all `O_RDWR` added. As a `Source`, `/net/udp/` takes only the `O_RDONLY`
//! form, `/PORT`.
//!
//! The paper has no TCP table; `/net/tcp/` follows the same rules where TCP allows: `/PORT`
//! listens as a source (the `O_RDONLY` reading) and connects to 127.0.0.1 as a target (the
//! `O_WRONLY` reading). A TCP connection reads as well as it writes, so the HOST and LOCALPORT
//! forms connect in either role.
//!
//! One deliberate departure: the paper's `O_RDONLY /4000` opened port 4000 on every interface.
//! penstock binds `/net/.../PORT` listeners to 127.0.0.1, so that a short name never exposes
//! a stream to the network by accident; to listen on every interface, say so:
//! `udp-listen://0.0.0.0:4000`.
//!
//! # What is a file
//!
//! A string is a network, socket, volume or descriptor name only if it begins with a known
//! prefix (`tcp://`, `tcp-listen://`, `udp://`, `udp-listen://`, `unix:`, `unix-listen:`,
//! `vol:`, `fd:`, `file:`, or exactly `/net/udp` or `/net/tcp` followed by `/` or nothing) or
//! is exactly `-`.
//! Everything else is a file path, spaces, non-ASCII and colons included (`./a:b`, `C:\x`,
//! `notes: draft.txt`). Two shapes are refused rather than taken as files, because they are
//! far more likely typos than file names, and writing a stream to a stray file would be a
//! silent failure: any `SCHEME://...` with an unknown scheme (`http://...`, `TCP://...`), and
//! a known network scheme missing its slashes (`tcp:host:80`). To name such a file, or a real
//! file under `/net/udp`, write `file:PATH` or `./PATH`. `file:PATH` is not a URL: the rest
//! of the string after `file:` is the path, verbatim.
//!
//! # Descriptors
//!
//! `fd:N` names a descriptor the *calling process* already has open (N decimal, 0 to
//! 2147483647, no leading zeros): a regular file, a block device, a pipe, a TCP, UDP or Unix
//! socket. It is for programs that call penstock in process (the C library's `penstock_cue`,
//! `penstock stream fd:3 ...` from a shell that opened 3); what the descriptor is, the driver
//! finds out with fstat(2) and getsockopt(2) when it takes its own duplicate. A server never
//! accepts it from a network peer: there the number would name one of the *server's*
//! descriptors.
//!
//! Paths are limited to what Linux accepts (4095 bytes; a Unix socket path to 107 bytes, the
//! size of `sun_path` less its NUL), so a name the kernel would refuse is refused here with a
//! reason. Abstract Unix sockets are not supported: `unix:@x` names the file `@x`.
//!
//! # Canonical form
//!
//! [`Display`](fmt::Display) writes the canonical name, and `Endpoint::parse(&e.to_string(),
//! role) == Ok(e)` for every `e` that `parse` returns in that role. URL forms are canonical;
//! the only spelling of a fixed local port is Roadrunner's, so an endpoint with `local_port`
//! displays as `/net/udp/LOCALPORT/HOST/PORT` (or `/net/tcp/...`). A file path displays bare
//! unless it would read as something else (`-`, `tcp://x:1`, `/net/udp/1`, `file:x`), in which
//! case it gets `file:`. The guarantee holds for values built by `parse`; a value built by
//! hand with a path that `parse` would refuse (empty, NUL, not UTF-8, too long) cannot
//! round-trip.

use std::fmt;
use std::path::PathBuf;

mod host;
#[cfg(test)]
mod tests;

pub use host::{DNS_LABEL_BYTES_MAX, DNS_NAME_BYTES_MAX, DnsName, Host};

/// Longest file path accepted, in bytes: Linux's `PATH_MAX` (4096) less the terminating NUL.
pub const PATH_BYTES_MAX: usize = 4095;
/// Longest Unix socket path accepted, in bytes: `sizeof(sun_path)` (108) less the NUL.
pub const UNIX_PATH_BYTES_MAX: usize = 107;
/// Longest volume or partition name, in bytes. Volumes are a later issue; the bound keeps the
/// names usable as file names in any metadata layout that stores them.
pub const VOLUME_NAME_BYTES_MAX: usize = 64;

/// Every accepted form, printed in each [`EndpointError`] so that a refused name is answered
/// with what would have been accepted.
pub const ACCEPTED_FORMS: &str = "\
accepted endpoints:
  PATH, file:PATH                 a regular file or block device
  -                               stdin as a source, stdout as a target
  tcp://HOST:PORT                 connect to HOST:PORT
  tcp-listen://HOST:PORT          listen on HOST:PORT and accept one peer (PORT 0: any free port)
  udp://HOST:PORT                 target only: send datagrams to HOST:PORT
  udp-listen://HOST:PORT          source only: receive datagrams on HOST:PORT (PORT 0: any free port)
  unix:PATH                       connect to a Unix stream socket
  unix-listen:PATH                listen on a Unix stream socket and accept one peer
  vol:VOLUME/PARTITION            a partition of a striped volume
  fd:N                            descriptor N of the calling process (file, device, pipe or socket)
  /net/udp/PORT                   source: receive on 127.0.0.1:PORT; target: send to 127.0.0.1:PORT
  /net/udp/[LOCALPORT/]HOST/PORT  target only: send to HOST:PORT [from LOCALPORT]
  /net/udp/LOCALPORT/PORT         target only: send to 127.0.0.1:PORT from LOCALPORT
  /net/tcp/PORT                   source: listen on 127.0.0.1:PORT; target: connect to 127.0.0.1:PORT
  /net/tcp/[LOCALPORT/]HOST/PORT  connect to HOST:PORT [from LOCALPORT]
  /net/tcp/LOCALPORT/PORT         connect to 127.0.0.1:PORT from LOCALPORT
HOST: an IPv4 address, an IPv6 address in brackets ([::1]) or a DNS name; \
PORT: 1-65535, no leading zeros.
Any other string is a file path; write file:PATH for a file whose name looks like one of these.";

/// Which end of a stream an endpoint is: the meaning of some names depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// The stream reads from the endpoint (Roadrunner's `O_RDONLY`).
    Source,
    /// The stream writes to the endpoint (Roadrunner's `O_WRONLY`, and `O_RDWR`: see the
    /// module doc).
    Target,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Source => "source",
            Role::Target => "target",
        })
    }
}

/// A parsed endpoint name. See the module doc for the forms and their meaning per [`Role`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// A path: a regular file or a block device (the driver finds out which when it opens it,
    /// and refuses anything else).
    File { path: PathBuf },
    /// `-`: stdin as a source, stdout as a target.
    Stdio,
    /// Connect to `host:port` (never port 0), from `local_port` if given.
    TcpConnect {
        host: Host,
        port: u16,
        local_port: Option<u16>,
    },
    /// Listen on `host:port` and accept one peer; port 0 lets the kernel choose.
    TcpListen { host: Host, port: u16 },
    /// Send datagrams to `host:port` (never port 0), from `local_port` if given. Target only.
    UdpSend {
        host: Host,
        port: u16,
        local_port: Option<u16>,
    },
    /// Receive datagrams on `host:port`; port 0 lets the kernel choose. Source only.
    UdpListen { host: Host, port: u16 },
    /// Connect to a listening Unix stream socket at `path`.
    Unix { path: PathBuf },
    /// Create a Unix stream socket at `path`, listen, and accept one peer.
    UnixListen { path: PathBuf },
    /// A partition of a striped volume.
    Volume {
        volume: VolumeName,
        partition: PartitionName,
    },
    /// Descriptor `fd` (0 to `i32::MAX`) of the calling process: the driver duplicates it, so
    /// the caller keeps its own (see the module doc).
    Fd { fd: i32 },
}

/// The variant of an [`Endpoint`] without its data, for matching, counters and messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EndpointKind {
    File,
    Stdio,
    TcpConnect,
    TcpListen,
    UdpSend,
    UdpListen,
    Unix,
    UnixListen,
    Volume,
    Fd,
}

impl EndpointKind {
    /// A short lower-case name, stable enough for JSON output and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            EndpointKind::File => "file",
            EndpointKind::Stdio => "stdio",
            EndpointKind::TcpConnect => "tcp-connect",
            EndpointKind::TcpListen => "tcp-listen",
            EndpointKind::UdpSend => "udp-send",
            EndpointKind::UdpListen => "udp-listen",
            EndpointKind::Unix => "unix",
            EndpointKind::UnixListen => "unix-listen",
            EndpointKind::Volume => "volume",
            EndpointKind::Fd => "fd",
        }
    }
}

impl fmt::Display for EndpointKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an endpoint name was refused. Every message ends with [`ACCEPTED_FORMS`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EndpointError {
    #[error("empty endpoint name\n{ACCEPTED_FORMS}")]
    Empty,
    #[error("endpoint {input:?} contains a NUL byte, which no name may hold\n{ACCEPTED_FORMS}")]
    Nul { input: String },
    #[error("endpoint {input:?}: unknown scheme {scheme:?}\n{ACCEPTED_FORMS}")]
    UnknownScheme { input: String, scheme: String },
    #[error(
        "endpoint {input:?}: write {scheme}://HOST:PORT (for a file with this name, write \
         file:{input})\n{ACCEPTED_FORMS}"
    )]
    MissingSlashes { input: String, scheme: &'static str },
    #[error("endpoint {input:?}: no port; a network endpoint needs one\n{ACCEPTED_FORMS}")]
    MissingPort { input: String },
    #[error(
        "endpoint {input:?}: invalid port {port:?}; a port is a decimal number 0-65535 with no \
         leading zeros\n{ACCEPTED_FORMS}"
    )]
    InvalidPort { input: String, port: String },
    #[error(
        "endpoint {input:?}: port 0 names no peer; 0 (any free port) is accepted only where \
         penstock listens\n{ACCEPTED_FORMS}"
    )]
    ZeroPort { input: String },
    #[error(
        "endpoint {input:?}: LOCALPORT 0 is not accepted; leave LOCALPORT out to let the kernel \
         choose\n{ACCEPTED_FORMS}"
    )]
    ZeroLocalPort { input: String },
    #[error("endpoint {input:?}: invalid host {host:?}: {reason}\n{ACCEPTED_FORMS}")]
    InvalidHost {
        input: String,
        host: String,
        reason: &'static str,
    },
    #[error(
        "endpoint {input:?}: too many parts; /net names have at most three: \
         LOCALPORT/HOST/PORT\n{ACCEPTED_FORMS}"
    )]
    TooManyParts { input: String },
    #[error("endpoint {input:?}: the path is empty\n{ACCEPTED_FORMS}")]
    EmptyPath { input: String },
    #[error("endpoint path is {len} bytes; at most {max} are accepted\n{ACCEPTED_FORMS}")]
    PathTooLong { len: usize, max: usize },
    #[error("endpoint {input:?}: {reason}\n{ACCEPTED_FORMS}")]
    InvalidVolume { input: String, reason: &'static str },
    #[error(
        "endpoint {input:?}: fd:N takes a descriptor number, decimal, 0 to 2147483647, no \
         leading zeros (for a file with this name, write file:{input})\n{ACCEPTED_FORMS}"
    )]
    InvalidFd { input: String },
    #[error("endpoint {input:?} cannot be a {role}: {hint}\n{ACCEPTED_FORMS}")]
    WrongRole {
        input: String,
        role: Role,
        hint: &'static str,
    },
}

/// The network schemes written as `SCHEME://HOST:PORT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    Tcp,
    TcpListen,
    Udp,
    UdpListen,
}

impl Scheme {
    const ALL: [Scheme; 4] = [
        Scheme::Tcp,
        Scheme::TcpListen,
        Scheme::Udp,
        Scheme::UdpListen,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Scheme::Tcp => "tcp",
            Scheme::TcpListen => "tcp-listen",
            Scheme::Udp => "udp",
            Scheme::UdpListen => "udp-listen",
        }
    }
}

/// The two protocol directories of Roadrunner's namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proto {
    Tcp,
    Udp,
}

/// What a string is, decided by its prefix alone, before any part of it is validated. One
/// function decides this for both parsing and display, so that a file path is displayed with
/// `file:` exactly when its bare spelling would be taken for something else.
#[derive(Debug)]
enum Syntax<'a> {
    Stdio,
    Path(&'a str),
    /// After `file:`.
    FileScheme(&'a str),
    Unix(&'a str),
    UnixListen(&'a str),
    Volume(&'a str),
    /// After `fd:`.
    Fd(&'a str),
    Url(Scheme, &'a str),
    MissingSlashes(Scheme),
    /// After `/net/udp` or `/net/tcp`: empty, or starting with `/`.
    Net(Proto, &'a str),
    UnknownScheme(&'a str),
}

fn classify(s: &str) -> Syntax<'_> {
    if s == "-" {
        return Syntax::Stdio;
    }
    if let Some(rest) = s.strip_prefix("file:") {
        return Syntax::FileScheme(rest);
    }
    if let Some(rest) = s.strip_prefix("unix:") {
        return Syntax::Unix(rest);
    }
    if let Some(rest) = s.strip_prefix("unix-listen:") {
        return Syntax::UnixListen(rest);
    }
    if let Some(rest) = s.strip_prefix("vol:") {
        return Syntax::Volume(rest);
    }
    if let Some(rest) = s.strip_prefix("fd:") {
        return Syntax::Fd(rest);
    }
    for scheme in Scheme::ALL {
        // "tcp-listen:" does not start with "tcp:", so no scheme shadows another.
        if let Some(after) = s
            .strip_prefix(scheme.as_str())
            .and_then(|r| r.strip_prefix(':'))
        {
            return match after.strip_prefix("//") {
                Some(rest) => Syntax::Url(scheme, rest),
                None => Syntax::MissingSlashes(scheme),
            };
        }
    }
    for (prefix, proto) in [("/net/udp", Proto::Udp), ("/net/tcp", Proto::Tcp)] {
        if let Some(rest) = s.strip_prefix(prefix)
            && (rest.is_empty() || rest.starts_with('/'))
        {
            return Syntax::Net(proto, rest);
        }
    }
    if let Some((scheme, _)) = s.split_once("://")
        && is_scheme_like(scheme)
    {
        return Syntax::UnknownScheme(scheme);
    }
    Syntax::Path(s)
}

/// RFC 3986 scheme syntax: a letter, then letters, digits, `+`, `-` or `.`.
fn is_scheme_like(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphabetic())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
}

impl Endpoint {
    /// Parses an endpoint name for the given role. Never panics; refuses with an error whose
    /// message lists [`ACCEPTED_FORMS`].
    pub fn parse(s: &str, role: Role) -> Result<Endpoint, EndpointError> {
        if s.is_empty() {
            return Err(EndpointError::Empty);
        }
        if s.contains('\0') {
            return Err(EndpointError::Nul {
                input: s.to_string(),
            });
        }
        match classify(s) {
            Syntax::Stdio => Ok(Endpoint::Stdio),
            Syntax::Path(p) | Syntax::FileScheme(p) => Ok(Endpoint::File {
                path: parse_path(s, p, PATH_BYTES_MAX)?,
            }),
            Syntax::Unix(p) => Ok(Endpoint::Unix {
                path: parse_path(s, p, UNIX_PATH_BYTES_MAX)?,
            }),
            Syntax::UnixListen(p) => Ok(Endpoint::UnixListen {
                path: parse_path(s, p, UNIX_PATH_BYTES_MAX)?,
            }),
            Syntax::Volume(rest) => parse_volume(s, rest),
            Syntax::Fd(rest) => parse_fd(s, rest),
            Syntax::Url(scheme, rest) => parse_url(s, scheme, rest, role),
            Syntax::MissingSlashes(scheme) => Err(EndpointError::MissingSlashes {
                input: s.to_string(),
                scheme: scheme.as_str(),
            }),
            Syntax::Net(proto, rest) => parse_net(s, proto, rest, role),
            Syntax::UnknownScheme(scheme) => Err(EndpointError::UnknownScheme {
                input: s.to_string(),
                scheme: scheme.to_string(),
            }),
        }
    }

    /// The variant, without its data.
    pub fn kind(&self) -> EndpointKind {
        match self {
            Endpoint::File { .. } => EndpointKind::File,
            Endpoint::Stdio => EndpointKind::Stdio,
            Endpoint::TcpConnect { .. } => EndpointKind::TcpConnect,
            Endpoint::TcpListen { .. } => EndpointKind::TcpListen,
            Endpoint::UdpSend { .. } => EndpointKind::UdpSend,
            Endpoint::UdpListen { .. } => EndpointKind::UdpListen,
            Endpoint::Unix { .. } => EndpointKind::Unix,
            Endpoint::UnixListen { .. } => EndpointKind::UnixListen,
            Endpoint::Volume { .. } => EndpointKind::Volume,
            Endpoint::Fd { .. } => EndpointKind::Fd,
        }
    }

    /// Whether this endpoint can play `role`: a UDP sender cannot be read from, a UDP
    /// receiver cannot be written to; everything else works both ways. `parse` never returns
    /// an endpoint that fails this; it is for endpoints built in code.
    pub fn supports(&self, role: Role) -> bool {
        !matches!(
            (self, role),
            (Endpoint::UdpSend { .. }, Role::Source) | (Endpoint::UdpListen { .. }, Role::Target)
        )
    }

    /// Named storage (a file or a volume partition): it has a size, and `--offset` and
    /// `--length` apply to it. By name only — a `File` may still turn out to be a FIFO or a
    /// character device when the driver opens it, and an `Fd` is none of these by name
    /// (whatever its descriptor turns out to be).
    pub fn is_storage(&self) -> bool {
        matches!(self, Endpoint::File { .. } | Endpoint::Volume { .. })
    }

    /// A socket of any kind: TCP, UDP or Unix.
    pub fn is_socket(&self) -> bool {
        matches!(
            self,
            Endpoint::TcpConnect { .. }
                | Endpoint::TcpListen { .. }
                | Endpoint::UdpSend { .. }
                | Endpoint::UdpListen { .. }
                | Endpoint::Unix { .. }
                | Endpoint::UnixListen { .. }
        )
    }

    /// A datagram socket (UDP): message boundaries matter, so the transfer unit is the
    /// datagram size and `sendfile`/`splice` into it make no sense.
    pub fn is_datagram(&self) -> bool {
        matches!(self, Endpoint::UdpSend { .. } | Endpoint::UdpListen { .. })
    }

    /// A byte-stream socket (TCP or Unix).
    pub fn is_stream_socket(&self) -> bool {
        self.is_socket() && !self.is_datagram()
    }

    /// Penstock waits for a peer to arrive (TCP or Unix accept, UDP receive): this end must be
    /// started before the other.
    pub fn is_listener(&self) -> bool {
        matches!(
            self,
            Endpoint::TcpListen { .. } | Endpoint::UdpListen { .. } | Endpoint::UnixListen { .. }
        )
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::File { path } => {
                let p = path.to_string_lossy();
                if matches!(classify(&p), Syntax::Path(_)) {
                    f.write_str(&p)
                } else {
                    write!(f, "file:{p}")
                }
            }
            Endpoint::Stdio => f.write_str("-"),
            Endpoint::TcpConnect {
                host,
                port,
                local_port: None,
            } => write!(f, "tcp://{host}:{port}"),
            Endpoint::TcpConnect {
                host,
                port,
                local_port: Some(local),
            } => write!(f, "/net/tcp/{local}/{host}/{port}"),
            Endpoint::TcpListen { host, port } => write!(f, "tcp-listen://{host}:{port}"),
            Endpoint::UdpSend {
                host,
                port,
                local_port: None,
            } => write!(f, "udp://{host}:{port}"),
            Endpoint::UdpSend {
                host,
                port,
                local_port: Some(local),
            } => write!(f, "/net/udp/{local}/{host}/{port}"),
            Endpoint::UdpListen { host, port } => write!(f, "udp-listen://{host}:{port}"),
            Endpoint::Unix { path } => write!(f, "unix:{}", path.to_string_lossy()),
            Endpoint::UnixListen { path } => write!(f, "unix-listen:{}", path.to_string_lossy()),
            Endpoint::Volume { volume, partition } => write!(f, "vol:{volume}/{partition}"),
            Endpoint::Fd { fd } => write!(f, "fd:{fd}"),
        }
    }
}

/// Checks a path's length; NUL was refused for the whole input already.
fn parse_path(input: &str, p: &str, max: usize) -> Result<PathBuf, EndpointError> {
    if p.is_empty() {
        return Err(EndpointError::EmptyPath {
            input: input.to_string(),
        });
    }
    if p.len() > max {
        return Err(EndpointError::PathTooLong { len: p.len(), max });
    }
    Ok(PathBuf::from(p))
}

/// Parses a decimal port: 1 to 5 digits, no sign, no leading zero, at most 65535. Leading
/// zeros are refused so that each port has one spelling and `010` is not mistaken for octal.
fn parse_port(input: &str, text: &str) -> Result<u16, EndpointError> {
    if text.is_empty() {
        return Err(EndpointError::MissingPort {
            input: input.to_string(),
        });
    }
    let invalid = || EndpointError::InvalidPort {
        input: input.to_string(),
        port: text.to_string(),
    };
    if text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    if text.len() > 1 && text.starts_with('0') {
        return Err(invalid());
    }
    text.parse::<u16>().map_err(|_| invalid())
}

fn parse_local_port(input: &str, text: &str) -> Result<u16, EndpointError> {
    match parse_port(input, text)? {
        0 => Err(EndpointError::ZeroLocalPort {
            input: input.to_string(),
        }),
        p => Ok(p),
    }
}

fn peer_port(input: &str, port: u16) -> Result<u16, EndpointError> {
    if port == 0 {
        return Err(EndpointError::ZeroPort {
            input: input.to_string(),
        });
    }
    Ok(port)
}

fn parse_host_in(input: &str, text: &str, bare_ipv6: bool) -> Result<Host, EndpointError> {
    host::parse_host(text, bare_ipv6).map_err(|reason| EndpointError::InvalidHost {
        input: input.to_string(),
        host: text.to_string(),
        reason,
    })
}

/// `SCHEME://HOST:PORT`, nothing before or after.
fn parse_url(
    input: &str,
    scheme: Scheme,
    authority: &str,
    role: Role,
) -> Result<Endpoint, EndpointError> {
    let wrong_role = |hint| EndpointError::WrongRole {
        input: input.to_string(),
        role,
        hint,
    };
    match (scheme, role) {
        (Scheme::Udp, Role::Source) => {
            return Err(wrong_role(
                "udp:// sends datagrams; to receive, use udp-listen://HOST:PORT or /net/udp/PORT",
            ));
        }
        (Scheme::UdpListen, Role::Target) => {
            return Err(wrong_role(
                "udp-listen:// receives datagrams; to send, use udp://HOST:PORT",
            ));
        }
        _ => {}
    }
    let (host_text, port_text) = split_authority(input, authority)?;
    let host = parse_host_in(input, host_text, false)?;
    let port = parse_port(input, port_text)?;
    Ok(match scheme {
        Scheme::Tcp => Endpoint::TcpConnect {
            host,
            port: peer_port(input, port)?,
            local_port: None,
        },
        Scheme::TcpListen => Endpoint::TcpListen { host, port },
        Scheme::Udp => Endpoint::UdpSend {
            host,
            port: peer_port(input, port)?,
            local_port: None,
        },
        Scheme::UdpListen => Endpoint::UdpListen { host, port },
    })
}

/// Splits `HOST:PORT` or `[IPV6]:PORT` at the port's colon.
fn split_authority<'a>(
    input: &str,
    authority: &'a str,
) -> Result<(&'a str, &'a str), EndpointError> {
    let missing_port = || EndpointError::MissingPort {
        input: input.to_string(),
    };
    if authority.starts_with('[') {
        let Some(close) = authority.find(']') else {
            return Err(EndpointError::InvalidHost {
                input: input.to_string(),
                host: authority.to_string(),
                reason: "an opening '[' needs a closing ']' right before the port",
            });
        };
        // `close` indexes an ASCII ']', so both slices fall on char boundaries.
        let (host, after) = authority.split_at(close + 1);
        if after.is_empty() {
            return Err(missing_port());
        }
        let Some(port) = after.strip_prefix(':') else {
            return Err(EndpointError::InvalidPort {
                input: input.to_string(),
                port: after.to_string(),
            });
        };
        return Ok((host, port));
    }
    authority.rsplit_once(':').ok_or_else(missing_port)
}

/// Roadrunner's names, after `/net/udp` or `/net/tcp`: `/PORT`, `/HOST/PORT`,
/// `/LOCALPORT/PORT`, `/LOCALPORT/HOST/PORT`, read per role as the module doc's tables say.
fn parse_net(input: &str, proto: Proto, rest: &str, role: Role) -> Result<Endpoint, EndpointError> {
    let Some(rest) = rest.strip_prefix('/') else {
        // Exactly "/net/udp" or "/net/tcp" (classify guarantees `rest` is empty or starts
        // with '/').
        return Err(EndpointError::MissingPort {
            input: input.to_string(),
        });
    };
    let mut parts = rest.split('/');
    // `split` always yields at least one item.
    let first = parts.next().unwrap_or("");
    let second = parts.next();
    let third = parts.next();
    if parts.next().is_some() {
        return Err(EndpointError::TooManyParts {
            input: input.to_string(),
        });
    }
    let (local_text, host_text, port_text) = match (second, third) {
        (None, _) => (None, None, first),
        (Some(port), None) if !first.is_empty() && first.bytes().all(|b| b.is_ascii_digit()) => {
            (Some(first), None, port)
        }
        (Some(port), None) => (None, Some(first), port),
        (Some(host), Some(port)) => (Some(first), Some(host), port),
    };
    let local_port = local_text.map(|t| parse_local_port(input, t)).transpose()?;
    let host = host_text
        .map(|t| parse_host_in(input, t, true))
        .transpose()?;
    let port = parse_port(input, port_text)?;
    let port_only = local_port.is_none() && host.is_none();
    match (proto, role) {
        (Proto::Udp, Role::Source) if port_only => Ok(Endpoint::UdpListen {
            host: Host::LOCALHOST,
            port,
        }),
        (Proto::Udp, Role::Source) => Err(EndpointError::WrongRole {
            input: input.to_string(),
            role,
            hint: "as a source, /net/udp/ takes only a local PORT (Roadrunner's O_RDONLY form); \
                   the HOST and LOCALPORT forms name a peer to send to",
        }),
        (Proto::Udp, Role::Target) => Ok(Endpoint::UdpSend {
            host: host.unwrap_or(Host::LOCALHOST),
            port: peer_port(input, port)?,
            local_port,
        }),
        (Proto::Tcp, Role::Source) if port_only => Ok(Endpoint::TcpListen {
            host: Host::LOCALHOST,
            port,
        }),
        (Proto::Tcp, _) => Ok(Endpoint::TcpConnect {
            host: host.unwrap_or(Host::LOCALHOST),
            port: peer_port(input, port)?,
            local_port,
        }),
    }
}

/// `fd:N`: N decimal, 0 to `i32::MAX` (a descriptor number is a non-negative C `int`), one
/// spelling each (no sign, no leading zero).
fn parse_fd(input: &str, rest: &str) -> Result<Endpoint, EndpointError> {
    let invalid = || EndpointError::InvalidFd {
        input: input.to_string(),
    };
    if rest.is_empty()
        || rest.len() > 10
        || !rest.bytes().all(|b| b.is_ascii_digit())
        || (rest.len() > 1 && rest.starts_with('0'))
    {
        return Err(invalid());
    }
    let fd: i32 = rest.parse().map_err(|_| invalid())?;
    Ok(Endpoint::Fd { fd })
}

/// The longest volume path in `vol:/PATH/PARTITION` (Linux's PATH_MAX less its NUL).
pub const VOLUME_PATH_BYTES_MAX: usize = 4095;

/// `vol:VOLUME/PARTITION`, or `vol:/PATH/TO/MEMBER/PARTITION`: a volume named by the absolute
/// path of one of its members (split at the last `/`; the partition is a name as always).
fn parse_volume(input: &str, rest: &str) -> Result<Endpoint, EndpointError> {
    let invalid = |reason| EndpointError::InvalidVolume {
        input: input.to_string(),
        reason,
    };
    if rest.starts_with('/') {
        let Some((path, partition)) = rest.rsplit_once('/') else {
            unreachable!("starts with '/'")
        };
        if path.is_empty() {
            return Err(invalid(
                "vol:/PATH/PARTITION names a volume by a member's absolute path; the path is missing",
            ));
        }
        if path.len() > VOLUME_PATH_BYTES_MAX {
            return Err(invalid("a volume path is at most 4095 bytes"));
        }
        if path.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(invalid(
                "a volume path holds no spaces or control characters",
            ));
        }
        return Ok(Endpoint::Volume {
            volume: VolumeName(path.to_string()),
            partition: PartitionName(check_volume_name(partition).map_err(invalid)?),
        });
    }
    let Some((volume, partition)) = rest.split_once('/') else {
        return Err(invalid(
            "a volume endpoint is vol:VOLUME/PARTITION; the partition is missing",
        ));
    };
    if partition.contains('/') {
        return Err(invalid(
            "a volume endpoint is vol:VOLUME/PARTITION, with exactly one '/' (or \
             vol:/ABSOLUTE/PATH/OF/A/MEMBER/PARTITION)",
        ));
    }
    Ok(Endpoint::Volume {
        volume: VolumeName(check_volume_name(volume).map_err(invalid)?),
        partition: PartitionName(check_volume_name(partition).map_err(invalid)?),
    })
}

/// The rule for volume and partition names: 1 to [`VOLUME_NAME_BYTES_MAX`] bytes of ASCII
/// letters, digits, `.`, `_` and `-`, and not `.` or `..`. Narrow on purpose: these names will
/// be stored in volume metadata and may become file names, and widening a rule later is easy
/// while narrowing it breaks names people already use.
fn check_volume_name(s: &str) -> Result<String, &'static str> {
    if s.is_empty() {
        return Err("volume and partition names are not empty: vol:VOLUME/PARTITION");
    }
    if s.len() > VOLUME_NAME_BYTES_MAX {
        return Err("volume and partition names are at most 64 bytes");
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err("volume and partition names hold only ASCII letters, digits, '.', '_' and '-'");
    }
    if s == "." || s == ".." {
        return Err("volume and partition names are not '.' or '..'");
    }
    Ok(s.to_string())
}

/// The name of a striped volume, as in `vol:VOLUME/PARTITION`; see `check_volume_name` for
/// the rule (letters, digits, `.`, `_`, `-`; 1 to 64 bytes).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VolumeName(String);

impl VolumeName {
    /// Validates a volume name.
    pub fn parse(s: &str) -> Result<VolumeName, EndpointError> {
        check_volume_name(s)
            .map(VolumeName)
            .map_err(|reason| EndpointError::InvalidVolume {
                input: s.to_string(),
                reason,
            })
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for VolumeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The name of a partition within a volume (Clockwise's dynamic partitions), as in
/// `vol:VOLUME/PARTITION`; same rule as [`VolumeName`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionName(String);

impl PartitionName {
    /// Validates a partition name.
    pub fn parse(s: &str) -> Result<PartitionName, EndpointError> {
        check_volume_name(s)
            .map(PartitionName)
            .map_err(|reason| EndpointError::InvalidVolume {
                input: s.to_string(),
                reason,
            })
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PartitionName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
