//! Listening addresses as operators write them, on the command line (`--listen`, repeatable)
//! and in `[http] listen` (a string or a list):
//!
//! | written            | binds                                              |
//! |--------------------|----------------------------------------------------|
//! | `8080`, `:8080`    | every IPv4 address, port 8080 (nginx's `listen 8080`) |
//! | `[::]:8080`        | every IPv6 address (and IPv4-mapped, as the kernel's `bindv6only` says) |
//! | `127.0.0.1:8080`, `[::1]:8080` | that address                           |
//! | `localhost:8080`   | each address the name resolves to (127.0.0.1 and ::1), once |
//!
//! Port 0 lets the kernel choose (tests). A name is resolved once, at start or reload.
//!
//! Any form may start with a scheme: `http://` (the same as none) or `https://` — a TLS
//! listener using the `[tls]` certificates (docs/tls.md) — in `[http] listen`; `rtsp://`
//! (the same as none) or `rtsps://` (RTSP over TLS, docs/rtsp.md) in `[rtsp] listen`.

use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs};

use serde::{Deserialize, Serialize};

/// One or more listening addresses as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "OneOrMany", into = "Vec<String>")]
pub struct ListenAddrs(pub Vec<String>);

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl From<OneOrMany> for ListenAddrs {
    fn from(v: OneOrMany) -> ListenAddrs {
        match v {
            OneOrMany::One(s) => ListenAddrs(vec![s]),
            OneOrMany::Many(v) => ListenAddrs(v),
        }
    }
}

impl From<ListenAddrs> for Vec<String> {
    fn from(v: ListenAddrs) -> Vec<String> {
        v.0
    }
}

impl From<&str> for ListenAddrs {
    fn from(s: &str) -> ListenAddrs {
        ListenAddrs(vec![s.to_string()])
    }
}

impl From<String> for ListenAddrs {
    fn from(s: String) -> ListenAddrs {
        ListenAddrs(vec![s])
    }
}

impl std::fmt::Display for ListenAddrs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.join(", "))
    }
}

impl ListenAddrs {
    /// Every socket address, in order, without repeats. Resolves names. A TLS scheme is
    /// refused here (for listeners that have no TLS).
    pub fn resolve(&self) -> Result<Vec<SocketAddr>, String> {
        let all = self.resolve_family(Family::Http)?;
        if let Some(spec) = self
            .0
            .iter()
            .find(|s| matches!(scheme(s), Ok((_, true, _))))
        {
            return Err(format!("{spec:?}: this listener has no TLS"));
        }
        Ok(all.into_iter().map(|(a, _)| a).collect())
    }

    /// `[http] listen`: every socket address with whether it is a TLS (`https://`)
    /// listener, in order, without repeats; an address named both with and without TLS is
    /// an error, and so is an `rtsp://` or `rtsps://` address.
    pub fn resolve_schemed(&self) -> Result<Vec<(SocketAddr, bool)>, String> {
        self.resolve_family(Family::Http)
    }

    /// `[rtsp] listen`: as [`ListenAddrs::resolve_schemed`], TLS written `rtsps://`
    /// (`http://` and `https://` are refused).
    pub fn resolve_rtsp(&self) -> Result<Vec<(SocketAddr, bool)>, String> {
        self.resolve_family(Family::Rtsp)
    }

    /// Refuses a scheme of the other family (`rtsps://` in `[http] listen`, `https://` in
    /// `[rtsp] listen`), without resolving names.
    pub fn check_family(&self, rtsp: bool) -> Result<(), String> {
        let want = if rtsp { Family::Rtsp } else { Family::Http };
        for spec in &self.0 {
            family_is(spec, want)?;
        }
        Ok(())
    }

    fn resolve_family(&self, want: Family) -> Result<Vec<(SocketAddr, bool)>, String> {
        if self.0.is_empty() {
            return Err("no listening address".into());
        }
        let mut out: Vec<(SocketAddr, bool)> = Vec::new();
        for spec in &self.0 {
            let (tls, rest) = family_is(spec, want)?;
            for a in resolve_one(rest)? {
                // Port 0 twice is two listeners when the schemes differ (tests).
                match out
                    .iter()
                    .find(|(b, t)| *b == a && (a.port() != 0 || *t == tls))
                {
                    None => out.push((a, tls)),
                    Some((_, t)) if *t == tls => {}
                    Some(_) => {
                        return Err(format!(
                            "{a} is named both with and without TLS: one listener, one scheme"
                        ));
                    }
                }
            }
        }
        Ok(out)
    }

    /// Whether any address is `https://` or `rtsps://`.
    pub fn has_tls(&self) -> bool {
        self.0.iter().any(|s| matches!(scheme(s), Ok((_, true, _))))
    }

    /// Checks the form of every address without resolving names.
    pub fn check(&self) -> Result<(), String> {
        if self.0.is_empty() {
            return Err("no listening address".into());
        }
        for spec in &self.0 {
            let (_, _, spec) = scheme(spec)?;
            if let Literal::Name(host, _) = literal(spec)?
                && host.is_empty()
            {
                return Err(format!("{spec:?}: no host before the port"));
            }
        }
        Ok(())
    }
}

/// Which server a scheme belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Http,
    Rtsp,
}

/// `https://REST` → (Http, true, REST); `http://REST` → (Http, false, REST); `rtsps://`
/// and `rtsp://` likewise for Rtsp; no scheme → (None, false, spec).
fn scheme(spec: &str) -> Result<(Option<Family>, bool, &str), String> {
    let s = spec.trim();
    for (prefix, family, tls) in [
        ("https://", Family::Http, true),
        ("http://", Family::Http, false),
        ("rtsps://", Family::Rtsp, true),
        ("rtsp://", Family::Rtsp, false),
    ] {
        if let Some(rest) = s.strip_prefix(prefix) {
            return Ok((Some(family), tls, rest.trim_end_matches('/')));
        }
    }
    if let Some((sch, _)) = s.split_once("://") {
        return Err(format!(
            "{spec:?}: unknown scheme {sch:?} (http://, https://, rtsp:// or rtsps://, or none)"
        ));
    }
    Ok((None, false, s))
}

/// [`scheme`], refusing the other server's schemes.
fn family_is(spec: &str, want: Family) -> Result<(bool, &str), String> {
    let (family, tls, rest) = scheme(spec)?;
    match family {
        Some(f) if f != want => Err(match want {
            Family::Http => format!(
                "{spec:?}: rtsp:// and rtsps:// are for [rtsp] listen (here: http:// or https://)"
            ),
            Family::Rtsp => format!(
                "{spec:?}: http:// and https:// are for [http] listen (here: rtsp:// or rtsps://)"
            ),
        }),
        _ => Ok((tls, rest)),
    }
}

enum Literal<'a> {
    Addr(SocketAddr),
    Name(&'a str, u16),
}

fn parse_port(spec: &str, p: &str) -> Result<u16, String> {
    p.parse::<u16>().map_err(|_| {
        format!("{spec:?}: the port must be a number 0..=65535 (forms: 8080, :8080, HOST:8080, [::1]:8080)")
    })
}

fn literal(spec: &str) -> Result<Literal<'_>, String> {
    let s = spec.trim();
    if s.is_empty() {
        return Err("an empty listening address".into());
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(Literal::Addr(SocketAddr::from((
            Ipv4Addr::UNSPECIFIED,
            parse_port(spec, s)?,
        ))));
    }
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(Literal::Addr(a));
    }
    if s.matches(':').count() > 1 {
        return Err(format!(
            "{spec:?}: an IPv6 address goes in brackets, [::1]:8080"
        ));
    }
    if let Some(p) = s.strip_prefix(':') {
        return Ok(Literal::Addr(SocketAddr::from((
            Ipv4Addr::UNSPECIFIED,
            parse_port(spec, p)?,
        ))));
    }
    let Some((host, port)) = s.rsplit_once(':') else {
        return Err(format!(
            "{spec:?}: no port (forms: 8080, :8080, HOST:8080, [::1]:8080)"
        ));
    };
    if host.contains(':') || host.starts_with('[') {
        return Err(format!(
            "{spec:?}: an IPv6 address goes in brackets, [::1]:8080"
        ));
    }
    Ok(Literal::Name(host, parse_port(spec, port)?))
}

fn resolve_one(spec: &str) -> Result<Vec<SocketAddr>, String> {
    match literal(spec)? {
        Literal::Addr(a) => Ok(vec![a]),
        Literal::Name(host, port) => {
            let addrs: Vec<SocketAddr> = (host, port)
                .to_socket_addrs()
                .map_err(|e| format!("{spec:?}: {host} does not resolve: {e}"))?
                .collect();
            if addrs.is_empty() {
                return Err(format!("{spec:?}: {host} has no address"));
            }
            Ok(addrs)
        }
    }
}

/// A descriptor held in reserve (`/dev/null`) by an accept loop: out of descriptors
/// (EMFILE, ENFILE) the loop closes it, accepts one waiting connection, refuses it (a 503
/// and a close) and takes the reserve again, so that a client waiting in the backlog gets
/// a refusal rather than silence. `None` if even this cannot be opened.
pub(crate) fn spare_descriptor() -> Option<std::os::fd::OwnedFd> {
    rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .ok()
}

/// Whether an accept failed for want of a descriptor (then [`spare_descriptor`] helps).
pub(crate) fn out_of_descriptors(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(x) if x == rustix::io::Errno::MFILE.raw_os_error()
            || x == rustix::io::Errno::NFILE.raw_os_error()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(v: &[&str]) -> Result<Vec<String>, String> {
        ListenAddrs(v.iter().map(|s| s.to_string()).collect())
            .resolve()
            .map(|a| a.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn the_forms_operators_write() {
        assert_eq!(r(&["8080"]).unwrap(), ["0.0.0.0:8080"]);
        assert_eq!(r(&[":8080"]).unwrap(), ["0.0.0.0:8080"]);
        assert_eq!(r(&["127.0.0.1:0"]).unwrap(), ["127.0.0.1:0"]);
        assert_eq!(
            r(&["[::1]:8080", "[::]:80"]).unwrap(),
            ["[::1]:8080", "[::]:80"]
        );
        let local = r(&["localhost:8080"]).unwrap();
        assert!(local.contains(&"127.0.0.1:8080".to_string()), "{local:?}");
        // Repeats are bound once.
        assert_eq!(r(&["127.0.0.1:9", "127.0.0.1:9"]).unwrap().len(), 1);
    }

    #[test]
    fn bad_forms_say_what_to_write() {
        for (bad, says) in [
            ("", "empty"),
            ("localhost", "no port"),
            ("::1:8080", "brackets"),
            ("127.0.0.1:99999", "0..=65535"),
            (":http", "0..=65535"),
        ] {
            let e = r(&[bad]).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
        assert!(ListenAddrs(vec![]).resolve().is_err());
        assert!(ListenAddrs(vec![":x".into()]).check().is_err());
        assert!(
            ListenAddrs(vec!["nowhere.invalid:1".into()])
                .check()
                .is_ok()
        );
    }

    #[test]
    fn https_names_a_tls_listener() {
        let l = ListenAddrs(vec![
            "https://127.0.0.1:8443".into(),
            "http://127.0.0.1:8080/".into(),
            "127.0.0.1:8081".into(),
        ]);
        let r = l.resolve_schemed().unwrap();
        let r: Vec<(String, bool)> = r.iter().map(|(a, t)| (a.to_string(), *t)).collect();
        assert_eq!(
            r,
            [
                ("127.0.0.1:8443".to_string(), true),
                ("127.0.0.1:8080".to_string(), false),
                ("127.0.0.1:8081".to_string(), false)
            ]
        );
        assert!(l.has_tls());
        assert!(l.check().is_ok());
        // A listener without TLS: said, not ignored.
        assert!(l.resolve().unwrap_err().contains("no TLS"));
        // rtsps:// in [rtsp] listen; each family refuses the other's schemes.
        let rtsp = ListenAddrs(vec![
            "rtsps://127.0.0.1:8322".into(),
            "rtsp://127.0.0.1:8554".into(),
        ]);
        let r = rtsp.resolve_rtsp().unwrap();
        assert_eq!(r.iter().map(|(_, t)| *t).collect::<Vec<_>>(), [true, false]);
        assert!(rtsp.has_tls());
        assert!(
            rtsp.resolve_schemed()
                .unwrap_err()
                .contains("[rtsp] listen")
        );
        assert!(rtsp.check_family(false).is_err() && rtsp.check_family(true).is_ok());
        assert!(l.resolve_rtsp().unwrap_err().contains("[http] listen"));
        let both = ListenAddrs(vec!["https://127.0.0.1:1".into(), "127.0.0.1:1".into()]);
        assert!(both.resolve_schemed().unwrap_err().contains("both"));
        let any = ListenAddrs(vec!["https://127.0.0.1:0".into(), "127.0.0.1:0".into()]);
        assert_eq!(any.resolve_schemed().unwrap().len(), 2);
        let bad = ListenAddrs(vec!["ftp://127.0.0.1:1".into()]);
        assert!(bad.check().unwrap_err().contains("unknown scheme"));
    }

    #[test]
    fn a_string_or_a_list_in_toml() {
        #[derive(Deserialize)]
        struct T {
            listen: ListenAddrs,
        }
        let t: T = toml::from_str("listen = \"8080\"").unwrap();
        assert_eq!(t.listen.0, ["8080"]);
        let t: T = toml::from_str("listen = [\"127.0.0.1:1\", \"[::1]:1\"]").unwrap();
        assert_eq!(t.listen.0.len(), 2);
    }
}
