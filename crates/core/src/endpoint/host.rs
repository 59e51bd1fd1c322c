//! Hosts as endpoint names spell them: an IPv4 address, an IPv6 address, or a DNS name.
//!
//! Nothing here resolves a name: that is I/O, and the driver does it when it opens the
//! endpoint. What this module guarantees is that a [`DnsName`] is *syntactically* a host name
//! (RFC 1123 letters, digits and hyphens, bounded lengths), so a typo such as `1.2.3.256` or
//! `exa mple.com` is refused at parse time with a reason instead of failing later as an opaque
//! resolver error.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::EndpointError;

/// Longest DNS name accepted, in bytes (RFC 1035: 255 on the wire, 253 as text).
pub const DNS_NAME_BYTES_MAX: usize = 253;
/// Longest label (the text between dots) of a DNS name, in bytes (RFC 1035).
pub const DNS_LABEL_BYTES_MAX: usize = 63;

/// The host part of a network endpoint.
///
/// Displayed as endpoint names write it: IPv4 dotted, IPv6 in brackets (`[::1]`), names as
/// stored (lower case).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A literal address; used as is, no resolution.
    Ip(IpAddr),
    /// A name the driver resolves when it opens the endpoint.
    Name(DnsName),
}

impl Host {
    /// `127.0.0.1`: Roadrunner's "local host", and the address penstock binds when a
    /// `/net/...` name gives only a port (see the module doc of [`super`] for why loopback).
    pub const LOCALHOST: Host = Host::Ip(IpAddr::V4(Ipv4Addr::LOCALHOST));

    /// Parses a host as written in a `/net/...` name: IPv4, IPv6 with or without brackets, or
    /// a DNS name.
    pub fn parse(s: &str) -> Result<Host, EndpointError> {
        parse_host(s, true).map_err(|reason| EndpointError::InvalidHost {
            input: s.to_string(),
            host: s.to_string(),
            reason,
        })
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Ip(IpAddr::V4(a)) => write!(f, "{a}"),
            Host::Ip(IpAddr::V6(a)) => write!(f, "[{a}]"),
            Host::Name(n) => f.write_str(n.as_str()),
        }
    }
}

/// Parses a host; on failure returns the reason, which the caller wraps with its input.
///
/// `bare_ipv6` allows `::1` without brackets. In a URL authority (`tcp://HOST:PORT`) it is
/// refused, because `::1:80` cannot be split into address and port unambiguously; in a
/// `/net/...` name the parts are separated by `/`, so a bare IPv6 address is unambiguous.
pub(super) fn parse_host(s: &str, bare_ipv6: bool) -> Result<Host, &'static str> {
    if s.is_empty() {
        return Err("the host is empty");
    }
    if let Some(inner) = s.strip_prefix('[') {
        let inner = inner
            .strip_suffix(']')
            .ok_or("an opening '[' needs a closing ']' right before the port")?;
        return parse_ipv6(inner);
    }
    if s.contains(':') {
        if bare_ipv6 {
            return parse_ipv6(s);
        }
        return Err("an IPv6 address goes in brackets, e.g. tcp://[::1]:8000");
    }
    if let Ok(a) = s.parse::<Ipv4Addr>() {
        return Ok(Host::Ip(IpAddr::V4(a)));
    }
    DnsName::parse_reason(s).map(Host::Name)
}

fn parse_ipv6(s: &str) -> Result<Host, &'static str> {
    if s.contains('%') {
        return Err("IPv6 zone ids (%eth0) are not supported; use a global address");
    }
    s.parse::<Ipv6Addr>()
        .map(|a| Host::Ip(IpAddr::V6(a)))
        .map_err(|_| "not a valid IPv6 address (brackets hold only IPv6 addresses)")
}

/// A syntactically valid DNS host name, stored in lower case.
///
/// Lower case because DNS compares names case-insensitively: storing one spelling makes
/// equal endpoints compare equal, and makes [`Display`](fmt::Display) canonical.
/// Internationalized names must be given in their ASCII (punycode) form.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DnsName(String);

impl DnsName {
    /// Checks the RFC 1123 host name rules: 1 to [`DNS_NAME_BYTES_MAX`] bytes; labels of 1 to
    /// [`DNS_LABEL_BYTES_MAX`] letters, digits or hyphens, not beginning or ending with a
    /// hyphen; no empty label (so no trailing dot); and a last label that is not all digits,
    /// since such a string is a mistyped IPv4 address (`1.2.3.256`) or a bare port, not a name.
    pub fn parse(s: &str) -> Result<DnsName, EndpointError> {
        DnsName::parse_reason(s).map_err(|reason| EndpointError::InvalidHost {
            input: s.to_string(),
            host: s.to_string(),
            reason,
        })
    }

    fn parse_reason(s: &str) -> Result<DnsName, &'static str> {
        if s.len() > DNS_NAME_BYTES_MAX {
            return Err("a DNS name is at most 253 bytes");
        }
        let mut last = "";
        for label in s.split('.') {
            if label.is_empty() {
                return Err(
                    "a DNS name has no empty labels (no leading, trailing or doubled dots)",
                );
            }
            if label.len() > DNS_LABEL_BYTES_MAX {
                return Err("a DNS label (text between dots) is at most 63 bytes");
            }
            if !label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            {
                return Err(
                    "a host is an IPv4 address, an IPv6 address in brackets, or a DNS \
                            name of letters, digits, '-' and '.'",
                );
            }
            if label.starts_with('-') || label.ends_with('-') {
                return Err("a DNS label does not begin or end with '-'");
            }
            last = label;
        }
        if last.bytes().all(|b| b.is_ascii_digit()) {
            return Err("not a valid IPv4 address (four numbers 0-255 separated by dots)");
        }
        Ok(DnsName(s.to_ascii_lowercase()))
    }

    /// The name, lower case.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DnsName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
