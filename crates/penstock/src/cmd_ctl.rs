//! `penstock ctl ADDR [COMMAND…]`: a control protocol client. With a command, sends it (after
//! `AUTH` with the token: `--token`, else `PENSTOCK_TOKEN`, else `--token-file`, else, over
//! TCP, the default token file of a server started with the defaults, when readable), prints
//! the reply, and exits 0 on a 2xx reply, 1 otherwise. Without one, reads command lines from
//! stdin and prints each reply; exits 0 when every reply was 2xx, 1 when any was not. Over the Unix socket the server knows the user without a
//! token.
//!
//! The token never goes where it does not belong (issue 35): the default token file names
//! the addresses of the server that wrote it (`server ADDR` lines), and its token is sent to
//! those addresses only; `--token`, `PENSTOCK_TOKEN` or `--token-file` send it to ADDR
//! because the user said so.
//!
//! A command refused by a cluster node with a redirect (`503 …; redirect node=N
//! control=HOST:PORT`, docs/control-protocol.md) is sent again to that node, up to
//! `--redirects-max` hops; stderr names each hop. The token goes along only with
//! `--redirect-token` (the cluster's nodes share it) or when the default token file names the
//! node's address; otherwise the redirect is printed, not followed. Interactive mode does
//! not follow redirects: streams opened earlier on the connection belong to it.
//!
//! Every wait has a bound: `--connect-timeout` for the connection (and TLS handshake),
//! `--reply-timeout` for each reply.

use std::io::{BufRead, BufReader, Write};

use anyhow::{Context, Result, bail};
use clap::Args;
use penstock_core::control::{Limits, Reply, ReplyParser};

#[derive(Args, Debug)]
pub struct CtlArgs {
    /// `host:port`, `tls://host:port` (with `--cacert`), or `unix:/path/to/socket`.
    pub addr: String,
    /// The command line to send, e.g. `STATE '*'`. None: interactive (stdin).
    pub command: Vec<String>,
    /// Sent with AUTH first (needed over TCP, and for others' streams); default: the
    /// environment variable PENSTOCK_TOKEN.
    #[arg(long)]
    pub token: Option<String>,
    /// Read the token from this file (default over TCP: the token file of a server started
    /// with the default control socket, when it exists and is readable). An empty file
    /// (`/dev/null`): no token.
    #[arg(long)]
    pub token_file: Option<std::path::PathBuf>,
    /// With a command: follow at most this many redirects (`503 …; redirect node=N
    /// control=HOST:PORT` from a cluster node) to the node named; 0: print the 503.
    #[arg(long, default_value_t = 3)]
    pub redirects_max: u32,
    /// For `tls://` addresses: the CA certificate(s), PEM, that the server's certificate
    /// must chain to (the system's roots are not read).
    #[arg(long)]
    pub cacert: Option<std::path::PathBuf>,
    /// Send the token along redirects to other cluster nodes (they share it: the same
    /// `[control] token`). Without it, a redirect is followed only to an address the
    /// default token file names.
    #[arg(long)]
    pub redirect_token: bool,
    /// Give up connecting (and the TLS handshake) after this long.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub connect_timeout: std::time::Duration,
    /// Give up waiting for a reply after this long.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    pub reply_timeout: std::time::Duration,
}

/// The token to send and where it may go.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Token {
    value: String,
    /// `None`: the user named it (anywhere ADDR is); `Some`: the default token file's
    /// server addresses, the only places it may be sent.
    servers: Option<Vec<String>>,
}

impl Token {
    /// Whether the token may be sent to `addr`.
    fn may_go_to(&self, addr: &str) -> bool {
        match &self.servers {
            None => true,
            Some(list) => list.iter().any(|s| same_server(s, addr)),
        }
    }
}

/// Whether `given` (what the user typed, or a redirect's address) names the server address
/// `recorded` (from a token file): the same Unix path, or the same TCP address once resolved
/// (a server bound to `0.0.0.0`/`::` counts for a loopback address with its port). The
/// scheme (`tls://`) must match.
fn same_server(recorded: &str, given: &str) -> bool {
    if let (Some(a), Some(b)) = (recorded.strip_prefix("unix:"), given.strip_prefix("unix:")) {
        let canon = |p: &str| std::fs::canonicalize(p).unwrap_or_else(|_| p.into());
        return canon(a) == canon(b);
    }
    fn tls(s: &str) -> (bool, &str) {
        s.strip_prefix("tls://").map_or((false, s), |r| (true, r))
    }
    let ((rt, ra), (gt, ga)) = (tls(recorded), tls(given));
    if rt != gt || recorded.starts_with("unix:") || given.starts_with("unix:") {
        return false;
    }
    let Ok(r) = ra.parse::<std::net::SocketAddr>() else {
        return false;
    };
    use std::net::ToSocketAddrs;
    let Ok(resolved) = ga.to_socket_addrs() else {
        return false;
    };
    resolved.into_iter().any(|g| {
        g == r || (r.ip().is_unspecified() && g.ip().is_loopback() && g.port() == r.port())
    })
}

/// The node a refusal redirects to: `(name, control address)` from the end of a 503's text
/// (`…; redirect node=NAME control=HOST:PORT`), or `None`.
fn redirect_of(reply: &Reply) -> Option<(&str, &str)> {
    if reply.code.code() != 503 {
        return None;
    }
    let (_, tail) = reply.text.rsplit_once("; redirect node=")?;
    let (node, addr) = tail.split_once(" control=")?;
    (!node.is_empty() && !addr.is_empty() && !addr.contains(char::is_whitespace))
        .then_some((node, addr))
}

/// The token to send, if any, and where it may go.
fn token(a: &CtlArgs) -> Result<Option<Token>> {
    if let Some(t) = a
        .token
        .clone()
        .or_else(|| std::env::var("PENSTOCK_TOKEN").ok())
    {
        return Ok(Some(Token {
            value: t,
            servers: None,
        }));
    }
    if let Some(f) = &a.token_file {
        return penstock_server::private::read_token(f)
            .map(|value| {
                Some(Token {
                    value,
                    servers: None,
                })
            })
            .with_context(|| format!("--token-file {}", f.display()));
    }
    if a.addr.starts_with("unix:") {
        return Ok(None);
    }
    let default = penstock_server::private::default_token_file(
        &penstock_server::private::default_control_socket(),
    );
    let Ok((value, servers)) = penstock_server::private::read_token_file(&default) else {
        return Ok(None);
    };
    let t = Token {
        value,
        servers: Some(servers),
    };
    if !t.may_go_to(&a.addr) {
        eprintln!(
            "penstock: not sending the token of {} to {}: that file belongs to another server ({}); name the token with --token, PENSTOCK_TOKEN or --token-file to send it there",
            default.display(),
            a.addr,
            t.servers.as_deref().unwrap_or_default().join(", ")
        );
    }
    Ok(Some(t))
}

trait Conn: std::io::Read + Write {}
impl<T: std::io::Read + Write> Conn for T {}

fn read_reply(r: &mut impl BufRead) -> Result<Reply> {
    let mut p = ReplyParser::new(Limits::default());
    let mut line = String::new();
    loop {
        line.clear();
        let n = r.read_line(&mut line).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                anyhow::anyhow!("no reply within --reply-timeout")
            }
            _ => e.into(),
        })?;
        if n == 0 {
            bail!("the server closed the connection");
        }
        if let Some(reply) = p.push_line(line.trim_end_matches(['\r', '\n']))? {
            return Ok(reply);
        }
    }
}

fn send(r: &mut BufReader<Box<dyn Conn>>, line: &str) -> Result<Reply> {
    r.get_mut().write_all(format!("{line}\n").as_bytes())?;
    read_reply(r)
}

/// A connection to `addr`, authenticated with `token` when there is one: the connection, or
/// the refused AUTH's reply.
fn connect(
    addr: &str,
    token: Option<&str>,
    a: &CtlArgs,
) -> Result<std::result::Result<BufReader<Box<dyn Conn>>, Reply>> {
    let stream: Box<dyn Conn> = if let Some(t) = addr.strip_prefix("tls://") {
        Box::new(tls_connect(t, a)?)
    } else if let Some(p) = addr.strip_prefix("unix:") {
        let s = std::os::unix::net::UnixStream::connect(p).with_context(|| addr.to_string())?;
        s.set_read_timeout(Some(a.reply_timeout))?;
        s.set_write_timeout(Some(a.reply_timeout))?;
        Box::new(s)
    } else {
        Box::new(tcp_connect(addr, a)?)
    };
    let mut r = BufReader::new(stream);
    if let Some(t) = token {
        let reply = send(&mut r, &format!("AUTH {t}")).with_context(|| addr.to_string())?;
        if !reply.code.is_success() {
            return Ok(Err(reply));
        }
    }
    Ok(Ok(r))
}

/// A TCP connection to `addr` within `--connect-timeout` (each resolved address in turn),
/// reads and writes bounded by `--reply-timeout`.
fn tcp_connect(addr: &str, a: &CtlArgs) -> Result<std::net::TcpStream> {
    use std::net::ToSocketAddrs;
    let mut last = None;
    for sa in addr.to_socket_addrs().with_context(|| addr.to_string())? {
        match std::net::TcpStream::connect_timeout(&sa, a.connect_timeout) {
            Ok(s) => {
                s.set_read_timeout(Some(a.reply_timeout))?;
                s.set_write_timeout(Some(a.reply_timeout))?;
                return Ok(s);
            }
            Err(e) => last = Some(e),
        }
    }
    match last {
        Some(e) if e.kind() == std::io::ErrorKind::TimedOut => {
            bail!("{addr}: no connection within --connect-timeout")
        }
        Some(e) => Err(e).with_context(|| addr.to_string()),
        None => bail!("{addr}: the name resolves to no address"),
    }
}

/// A TLS connection to `host:port`, the server's certificate checked against `--cacert` for
/// the name `host` (a DNS name or an IP address).
fn tls_connect(
    addr: &str,
    a: &CtlArgs,
) -> Result<rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>> {
    let cacert = a.cacert.as_deref();
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let Some(ca) = cacert else {
        anyhow::bail!(
            "tls://{addr}: --cacert FILE names the CA the server's certificate chains to"
        );
    };
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).with_context(|| ca.display().to_string())? {
        roots
            .add(c.with_context(|| ca.display().to_string())?)
            .with_context(|| ca.display().to_string())?;
    }
    let host = addr
        .rsplit_once(':')
        .map_or(addr, |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']');
    let name = rustls_pki_types::ServerName::try_from(host.to_string())
        .with_context(|| format!("tls://{addr}: {host:?} is not a server name"))?;
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name)?;
    let tcp = tcp_connect(addr, a).with_context(|| format!("tls://{addr}"))?;
    // The handshake within the connect timeout too.
    tcp.set_read_timeout(Some(a.connect_timeout))?;
    let mut s = rustls::StreamOwned::new(conn, tcp);
    // The handshake now, so that a refused certificate is said as such.
    while s.conn.is_handshaking() {
        s.conn
            .complete_io(&mut s.sock)
            .with_context(|| format!("tls://{addr}: TLS handshake"))?;
    }
    s.sock.set_read_timeout(Some(a.reply_timeout))?;
    Ok(s)
}

pub fn run(a: CtlArgs) -> Result<i32> {
    let token = token(&a)?.filter(|t| !t.value.is_empty());
    let first = token
        .as_ref()
        .filter(|t| t.may_go_to(&a.addr))
        .map(|t| t.value.as_str());
    let mut r = match connect(&a.addr, first, &a)? {
        Ok(r) => r,
        Err(refused) => {
            print!("{refused}");
            return Ok(1);
        }
    };
    if !a.command.is_empty() {
        let line = a.command.join(" ");
        let mut reply = send(&mut r, &line)?;
        let mut hops = 0;
        while let Some((node, addr)) = redirect_of(&reply) {
            if hops == a.redirects_max {
                if hops > 0 {
                    eprintln!("penstock: not following more than {hops} redirect(s)");
                }
                break;
            }
            // The token goes to the node only when it is known to share it.
            let hop_token = match &token {
                Some(t) if t.servers.is_some() && t.may_go_to(addr) => Some(t.value.as_str()),
                Some(t) if t.servers.is_none() && a.redirect_token => Some(t.value.as_str()),
                Some(_) => {
                    eprintln!(
                        "penstock: not following the redirect to node={node} control={addr}: the token would go to another server (pass --redirect-token if the cluster's nodes share it)"
                    );
                    break;
                }
                None => None,
            };
            hops += 1;
            eprintln!("penstock: redirected to node={node} control={addr}");
            let addr = addr.to_string();
            r = match connect(&addr, hop_token, &a)? {
                Ok(r) => r,
                Err(refused) => {
                    print!("{refused}");
                    return Ok(1);
                }
            };
            reply = send(&mut r, &line).with_context(|| addr.clone())?;
        }
        print!("{reply}");
        return Ok(if reply.code.is_success() { 0 } else { 1 });
    }
    let stdin = std::io::stdin();
    let mut all_ok = true;
    for line in stdin.lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let reply = send(&mut r, &line)?;
        print!("{reply}");
        std::io::stdout().flush()?;
        all_ok &= reply.code.is_success();
        if reply.code.code() == 221 {
            break;
        }
    }
    Ok(if all_ok { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use penstock_core::control::ReplyCode;

    fn reply(code: ReplyCode, text: &str) -> Reply {
        Reply::new(code, text.to_string())
    }

    #[test]
    fn a_refusal_naming_a_node_is_a_redirect_and_nothing_else_is() {
        let r = reply(
            ReplyCode::REFUSED,
            "refused net: need 262500 B/s, 100000 B/s free; redirect node=b control=10.0.0.2:7070",
        );
        assert_eq!(redirect_of(&r), Some(("b", "10.0.0.2:7070")));
        assert_eq!(
            redirect_of(&reply(
                ReplyCode::REFUSED,
                "refused net: need 1 B/s, 0 B/s free"
            )),
            None
        );
        assert_eq!(
            redirect_of(&reply(
                ReplyCode::REFUSED,
                "refused; redirect node= control=x:1"
            )),
            None
        );
        assert_eq!(
            redirect_of(&reply(
                ReplyCode::REFUSED,
                "refused; redirect node=b control=a b"
            )),
            None
        );
        // Only a 503 redirects, whatever its text says.
        let mut ok = r.clone();
        ok.code = ReplyCode::OK;
        assert_eq!(redirect_of(&ok), None);
    }
}
