//! Endpoint names (temporary minimal parser; the full one with Roadrunner's names replaces it).
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Source,
    Target,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    Ip(IpAddr),
    Name(String),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            Host::Ip(ip) => write!(f, "{ip}"),
            Host::Name(n) => f.write_str(n),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    File {
        path: PathBuf,
    },
    Stdio,
    TcpConnect {
        host: Host,
        port: u16,
    },
    TcpListen {
        host: Host,
        port: u16,
    },
    UdpSend {
        host: Host,
        port: u16,
        local_port: Option<u16>,
    },
    UdpListen {
        host: Host,
        port: u16,
    },
    Unix {
        path: PathBuf,
    },
    Volume {
        volume: String,
        partition: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed endpoint {0:?}")]
pub struct EndpointError(pub String);

fn host_port(s: &str) -> Option<(Host, u16)> {
    let (h, p) = s.rsplit_once(':')?;
    let port = p.parse().ok()?;
    let h = h.trim_start_matches('[').trim_end_matches(']');
    let host = h
        .parse()
        .map(Host::Ip)
        .unwrap_or_else(|_| Host::Name(h.to_string()));
    Some((host, port))
}

impl Endpoint {
    pub fn parse(s: &str, _role: Role) -> Result<Endpoint, EndpointError> {
        let err = || EndpointError(s.to_string());
        if s == "-" {
            return Ok(Endpoint::Stdio);
        }
        if let Some(r) = s.strip_prefix("tcp://") {
            let (host, port) = host_port(r).ok_or_else(err)?;
            return Ok(Endpoint::TcpConnect { host, port });
        }
        if let Some(r) = s.strip_prefix("tcp-listen://") {
            let (host, port) = host_port(r).ok_or_else(err)?;
            return Ok(Endpoint::TcpListen { host, port });
        }
        if let Some(r) = s.strip_prefix("udp://") {
            let (host, port) = host_port(r).ok_or_else(err)?;
            return Ok(Endpoint::UdpSend {
                host,
                port,
                local_port: None,
            });
        }
        if let Some(r) = s.strip_prefix("udp-listen://") {
            let (host, port) = host_port(r).ok_or_else(err)?;
            return Ok(Endpoint::UdpListen { host, port });
        }
        if let Some(r) = s.strip_prefix("unix:") {
            return Ok(Endpoint::Unix { path: r.into() });
        }
        let p = s.strip_prefix("file:").unwrap_or(s);
        if p.is_empty() {
            return Err(err());
        }
        Ok(Endpoint::File { path: p.into() })
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::File { path } => write!(f, "{}", path.display()),
            Endpoint::Stdio => f.write_str("-"),
            Endpoint::TcpConnect { host, port } => write!(f, "tcp://{host}:{port}"),
            Endpoint::TcpListen { host, port } => write!(f, "tcp-listen://{host}:{port}"),
            Endpoint::UdpSend { host, port, .. } => write!(f, "udp://{host}:{port}"),
            Endpoint::UdpListen { host, port } => write!(f, "udp-listen://{host}:{port}"),
            Endpoint::Unix { path } => write!(f, "unix:{}", path.display()),
            Endpoint::Volume { volume, partition } => write!(f, "vol:{volume}/{partition}"),
        }
    }
}
