//! `penstock ctl ADDR [COMMAND…]`: a control protocol client. With a command, sends it (after
//! `AUTH` with the token: `--token`, else `PENSTOCK_TOKEN`, else `--token-file`, else, over
//! TCP, the default token file of a server started with the defaults, when readable), prints
//! the reply, and exits 0 on a 2xx reply, 1 otherwise. Without one, reads command lines from
//! stdin and prints each reply; exits 0 when every reply was 2xx, 1 when any was not. Over the Unix socket the server knows the user without a
//! token.

use std::io::{BufRead, BufReader, Write};

use anyhow::{Context, Result, bail};
use clap::Args;
use penstock_core::control::{Limits, Reply, ReplyParser};

#[derive(Args, Debug)]
pub struct CtlArgs {
    /// `host:port`, or `unix:/path/to/socket`.
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
}

/// The token to send, if any.
fn token(a: &CtlArgs) -> Result<Option<String>> {
    if let Some(t) = a
        .token
        .clone()
        .or_else(|| std::env::var("PENSTOCK_TOKEN").ok())
    {
        return Ok(Some(t));
    }
    if let Some(f) = &a.token_file {
        return penstock_server::private::read_token(f)
            .map(Some)
            .with_context(|| format!("--token-file {}", f.display()));
    }
    if a.addr.starts_with("unix:") {
        return Ok(None);
    }
    let default = penstock_server::private::default_token_file(
        &penstock_server::private::default_control_socket(),
    );
    Ok(penstock_server::private::read_token(&default).ok())
}

trait Conn: std::io::Read + Write {}
impl<T: std::io::Read + Write> Conn for T {}

fn read_reply(r: &mut impl BufRead) -> Result<Reply> {
    let mut p = ReplyParser::new(Limits::default());
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            bail!("the server closed the connection");
        }
        if let Some(reply) = p.push_line(line.trim_end_matches(['\r', '\n']))? {
            return Ok(reply);
        }
    }
}

pub fn run(a: CtlArgs) -> Result<i32> {
    let stream: Box<dyn Conn> = if let Some(p) = a.addr.strip_prefix("unix:") {
        Box::new(std::os::unix::net::UnixStream::connect(p).with_context(|| a.addr.clone())?)
    } else {
        Box::new(std::net::TcpStream::connect(&a.addr).with_context(|| a.addr.clone())?)
    };
    let mut r = BufReader::new(stream);
    let send = |r: &mut BufReader<Box<dyn Conn>>, line: &str| -> Result<Reply> {
        r.get_mut().write_all(format!("{line}\n").as_bytes())?;
        read_reply(r)
    };
    if let Some(t) = token(&a)?.filter(|t| !t.is_empty()) {
        let reply = send(&mut r, &format!("AUTH {t}"))?;
        if !reply.code.is_success() {
            print!("{reply}");
            return Ok(1);
        }
    }
    if !a.command.is_empty() {
        let reply = send(&mut r, &a.command.join(" "))?;
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
