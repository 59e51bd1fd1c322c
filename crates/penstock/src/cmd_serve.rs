//! `penstock serve`: HTTP/1.1 downloads of a directory and the stream control protocol.
//!
//! Thin glue over `penstock_server::Server`: configuration, the sample tree of `--demo`,
//! the start line, and signals (SIGTERM/SIGINT: stop accepting, finish or cut within
//! `shutdown_deadline_ms`, exit 0; SIGHUP: reload the live part of `--config`; SIGUSR1:
//! reopen the access log file, for logrotate).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use penstock_server::{Server, ServerConfig};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1};
use signal_hook::iterator::Signals;

#[derive(Args, Debug)]
#[command(
    after_help = "Access log: one line per request in nginx's combined format plus rt= and path=, \
    on stdout by default ([log] access = stdout | off | FILE). Metrics: GET /metrics \
    (Prometheus text, or OpenMetrics when asked), also on [http] metrics_listen. Signals: \
    SIGTERM/SIGINT stop gracefully, SIGHUP reloads limits and locations from --config, \
    SIGUSR1 reopens the access log file (logrotate)."
)]
pub struct ServeArgs {
    /// Directory to serve (default: `[http] root` of the configuration, else the current
    /// directory).
    #[arg(long)]
    pub root: Option<PathBuf>,
    /// Serve a small generated sample tree (index.html, a 16 KiB file, an 8 MiB clip) from a
    /// temporary directory instead.
    #[arg(long, conflicts_with = "root")]
    pub demo: bool,
    /// A TOML file: limits, locations (class and rate per path prefix), addresses, token.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// HTTP address (overrides `[http] listen`; default 127.0.0.1:8080).
    #[arg(long)]
    pub listen: Option<String>,
    /// Control protocol TCP address (overrides `[control] listen`; default 127.0.0.1:7070;
    /// empty: none).
    #[arg(long)]
    pub control: Option<String>,
    /// Control protocol Unix socket (default $XDG_RUNTIME_DIR/penstock.sock, else
    /// /tmp/penstock-UID/control.sock in a private directory made for it).
    #[arg(long)]
    pub control_unix: Option<PathBuf>,
    /// No Unix control socket.
    #[arg(long)]
    pub no_control_unix: bool,
}

/// The default control socket; its private directory is made when it is the one in /tmp.
fn default_unix_socket() -> Result<PathBuf> {
    let p = penstock_server::private::default_control_socket();
    if std::env::var_os("XDG_RUNTIME_DIR").is_none_or(|d| !Path::new(&d).is_dir())
        && let Some(dir) = p.parent()
    {
        penstock_server::private::ensure_private_dir(dir)?;
    }
    Ok(p)
}

/// A sample tree: what a first-time user can click through.
fn demo_tree(dir: &Path) -> Result<()> {
    std::fs::write(
        dir.join("index.html"),
        "<!doctype html><title>penstock</title><h1>penstock serve --demo</h1>\n\
         <ul><li><a href=\"small.bin\">small.bin</a> (16 KiB)</li>\
         <li><a href=\"media/clip.ts\">media/clip.ts</a> (8 MiB)</li>\
         <li><a href=\"/metrics\">/metrics</a></li></ul>\n",
    )?;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut rng = |n: usize| {
        let mut v = vec![0u8; n];
        for c in v.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
        }
        v
    };
    std::fs::write(dir.join("small.bin"), rng(16 * 1024))?;
    std::fs::create_dir(dir.join("media"))?;
    std::fs::write(dir.join("media/clip.ts"), rng(8 << 20))?;
    Ok(())
}

pub fn run(a: ServeArgs) -> Result<()> {
    let mut cfg = match &a.config {
        Some(p) => ServerConfig::load(p)?,
        None => ServerConfig::default(),
    };
    if let Some(l) = &a.listen {
        cfg.http.listen = l.clone();
    }
    if let Some(c) = &a.control {
        cfg.control.listen = c.clone();
    }
    if a.no_control_unix {
        cfg.control.unix = None;
    } else if let Some(u) = &a.control_unix {
        cfg.control.unix = Some(u.clone());
    } else if cfg.control.unix.is_none() {
        cfg.control.unix = Some(default_unix_socket()?);
    }
    let _demo_dir;
    let root = if a.demo {
        let d = tempfile::Builder::new()
            .prefix("penstock-serve-demo-")
            .tempdir()?;
        demo_tree(d.path())?;
        if cfg.http.index.is_none() {
            cfg.http.index = Some("index.html".into());
        }
        let p = d.path().to_path_buf();
        _demo_dir = d;
        p
    } else if let Some(r) = a.root.clone().or_else(|| cfg.http.root.clone()) {
        r
    } else {
        std::env::current_dir()?
    };
    // Register before starting so that a signal during start-up is not lost.
    let mut signals =
        Signals::new([SIGTERM, SIGINT, SIGHUP, SIGUSR1]).context("installing signal handlers")?;
    let server = Server::start(&cfg, &root)?;
    println!("{} (root {})", server.summary(), root.display());
    if let Some(f) = server.token_file() {
        println!("control token (for AUTH from other peers): {}", f.display());
    }
    if a.demo {
        let base = format!("http://{}", server.http_addr());
        println!("try: curl -O {base}/small.bin   curl {base}/media/clip.ts -r 0-99 | xxd | head");
        println!("     {base}/   {base}/metrics");
        if let Some(c) = server.control_addr() {
            println!("     penstock ctl {c} HELP");
        }
    }
    tracing::info!(http = %server.http_addr(), root = %root.display(), "serving");
    for sig in signals.forever() {
        match sig {
            SIGHUP => match &a.config {
                Some(p) => match ServerConfig::load(p).and_then(|c| server.reload(&c)) {
                    Ok(()) => {
                        tracing::info!(config = %p.display(), "reloaded limits and locations")
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "reload refused; keeping the running configuration")
                    }
                },
                None => tracing::info!("SIGHUP without --config: nothing to reload"),
            },
            SIGUSR1 => server.reopen_access_log(),
            _ => break,
        }
    }
    let deadline = cfg.shutdown_deadline();
    tracing::info!(deadline_ms = deadline.as_millis() as u64, "stopping");
    let report = server.shutdown(deadline);
    if report.http_connections_cut > 0 {
        tracing::warn!(
            cut = report.http_connections_cut,
            "connections cut at the shutdown deadline"
        );
    }
    Ok(())
}
