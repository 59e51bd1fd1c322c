//! `penstock serve`: HTTP/1.1 downloads of a directory and the stream control protocol.
//!
//! Thin glue over `penstock_server::Server`: configuration, the sample tree of `--demo`,
//! the start line, socket activation, and signals (SIGTERM/SIGINT: stop accepting, finish
//! or cut within `shutdown_deadline_ms`, exit 0; SIGHUP: reload `--config` — limits,
//! locations, addresses and root — and say at warn level what else changed and was not
//! applied; SIGUSR1: reopen the access log file, for logrotate).
//! As a service (`crate::service`): the switch to the configured `user` after binding, and
//! the service manager's notifications (READY, RELOADING, STOPPING).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use penstock_server::{Server, ServerConfig, listen::ListenAddrs};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1};
use signal_hook::iterator::Signals;

use crate::service;

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  penstock serve                      the current directory on 127.0.0.1:8080\n  penstock serve /srv/media --listen 8080 --listen '[::]:8080'\n  penstock serve --config /etc/penstock/penstock.toml --check-config\n\n\
    RTSP: players open rtsp://127.0.0.1:8554/FILE for a TS file beneath the root (ffplay, ffmpeg, \
    GStreamer, VLC; [rtsp] listen, --rtsp; docs/rtsp.md). \
    Origin: with [origin] url = http://HOST:PORT/PREFIX or s3://BUCKET/PREFIX, HTTP GET/HEAD, \
    RTSP and control streams for paths missing beneath the root are read from there through a block cache \
    ([origin] cache_dir; docs/origin.md). \
    Access log: one line per request in nginx's combined format plus rt= and path=, \
    on stdout by default ([log] access = stdout | off | FILE). Metrics: GET /metrics \
    (Prometheus text, or OpenMetrics when asked), also on [http] metrics_listen. Signals: \
    SIGTERM/SIGINT stop gracefully, SIGHUP reloads --config (limits, locations, [disk], \
    listen, root), SIGUSR1 reopens the access log file (logrotate). Health: GET /healthz. \
    Cluster: [cluster] etcd = \"http://HOST:2379\" registers this node in etcd with a lease \
    (revoked on SIGTERM) and redirects opens it cannot admit (docs/cluster.md)."
)]
pub struct ServeArgs {
    /// Directory to serve (default: `[http] root` of the configuration, else the current
    /// directory).
    #[arg(value_name = "DIR", conflicts_with_all = ["root", "demo"])]
    pub dir: Option<PathBuf>,
    /// The directory to serve, as an option (the same as DIR).
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Serve a small generated sample tree (index.html, a 16 KiB file, an 8 MiB clip) from a
    /// temporary directory instead.
    #[arg(long, conflicts_with = "root")]
    pub demo: bool,
    /// A TOML file: limits, locations (class and rate per path prefix), addresses, token, the
    /// user to switch to when started as root (docs/penstock.example.toml, docs/service.md).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Check the configuration (and that the root can be served), print what would be
    /// served, and exit: 0 when it is good, 1 when not (as `nginx -t`). Binds nothing.
    #[arg(long)]
    pub check_config: bool,
    /// HTTP address; repeat for several (overrides `[http] listen`; default 127.0.0.1:8080).
    /// `8080` or `:8080`: every IPv4 address; `[::]:8080`: IPv6; `localhost:8080`: each
    /// address of the name.
    #[arg(long, value_name = "ADDR")]
    pub listen: Vec<String>,
    /// Not an option of penstock serve: says to use --listen.
    #[arg(long, hide = true, value_name = "PORT")]
    pub port: Option<String>,
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
    /// The operator's HTTP JSON API and dashboard (overrides `[api] listen`; off by default):
    /// `127.0.0.1:9997`, or `https://ADDR` with `[tls]` (docs/api.md). Callers send the
    /// control token as a Bearer token.
    #[arg(long, value_name = "ADDR")]
    pub api: Option<String>,
    /// RTSP address (overrides `[rtsp] listen`; default 127.0.0.1:8554; empty: none).
    /// Players open `rtsp://ADDR/FILE` for a TS file beneath the root (docs/rtsp.md).
    #[arg(long)]
    pub rtsp: Option<String>,
}

/// A line on standard output that a server may not die of: whoever started it may have
/// read the start line and closed the pipe (a supervisor, a test), and `println!` panics on
/// EPIPE. What could not be written is logged at debug level.
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout(), $($t)*) {
            tracing::debug!("standard output: {e}");
        }
    }};
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

/// The demo's clip: 12 s of H.264 (640×360, 25 fps, a key frame every 2 s) and AAC, made
/// once with ffmpeg from its test sources (`crates/penstock/assets/README.md` has the
/// command), so that every command the demo prints plays a picture.
const DEMO_CLIP_TS: &[u8] = include_bytes!("../assets/clip.ts");
/// The same clip in MP4 (`-c copy -movflags +faststart`).
const DEMO_CLIP_MP4: &[u8] = include_bytes!("../assets/clip.mp4");

/// A sample tree: what a first-time user can click through.
fn demo_tree(dir: &Path) -> Result<()> {
    let kib = |b: &[u8]| b.len().div_ceil(1024);
    std::fs::write(
        dir.join("index.html"),
        format!(
            "<!doctype html><title>penstock</title><h1>penstock serve --demo</h1>\n\
             <video id=\"clip\" src=\"media/clip.mp4\" controls muted autoplay playsinline \
             width=\"640\" height=\"360\"></video>\n\
             <ul><li><a href=\"small.bin\">small.bin</a> (16 KiB)</li>\
             <li><a href=\"media/clip.ts\">media/clip.ts</a> ({} KiB, H.264 + AAC, 12 s): \
             <a href=\"media/clip.ts/index.m3u8\">HLS</a></li>\
             <li><a href=\"media/clip.mp4\">media/clip.mp4</a> ({} KiB): \
             <a href=\"media/clip.mp4/index.m3u8\">HLS</a>, \
             <a href=\"media/clip.mp4/manifest.mpd\">DASH</a></li>\
             <li><a href=\"/metrics\">/metrics</a></li></ul>\n",
            kib(DEMO_CLIP_TS),
            kib(DEMO_CLIP_MP4)
        ),
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
    std::fs::write(dir.join("media/clip.ts"), DEMO_CLIP_TS)?;
    std::fs::write(dir.join("media/clip.mp4"), DEMO_CLIP_MP4)?;
    Ok(())
}

/// What the command line sets over the file: applied at start and again to each reloaded
/// file, so that SIGHUP never undoes a flag.
fn apply_flags(cfg: &mut ServerConfig, a: &ServeArgs) {
    if !a.listen.is_empty() {
        cfg.http.listen = ListenAddrs(a.listen.clone());
    }
    if let Some(c) = &a.control {
        cfg.control.listen = c.clone();
    }
    if let Some(x) = &a.api {
        cfg.api.listen = x.clone();
    }
    if let Some(r) = &a.rtsp {
        cfg.rtsp.listen = ListenAddrs(vec![r.clone()]);
    }
}

pub fn run(a: ServeArgs) -> Result<()> {
    if let Some(p) = &a.port {
        return Err(crate::Usage(format!(
            "penstock serve has no --port: use --listen {p} (every IPv4 address), --listen localhost:{p} or --listen 127.0.0.1:{p}"
        ))
        .into());
    }
    let mut cfg = match &a.config {
        Some(p) => ServerConfig::load(p)?,
        None => ServerConfig::default(),
    };
    apply_flags(&mut cfg, &a);
    if a.check_config {
        return check_config(&cfg, &a);
    }
    // Before any thread: reading LISTEN_FDS unsets the variables.
    let inherited = crate::activation::take_http_listeners()?;
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
    } else if let Some(r) = a.dir.clone().or_else(|| a.root.clone()) {
        r
    } else {
        config_root(&cfg)?
    };
    // A root from the command line (or --demo) is fixed; one from the file follows it.
    let root_fixed = a.demo || a.dir.is_some() || a.root.is_some();
    // --- service: the user is resolved before anything is bound (an unknown one changes
    // nothing); the notify socket is connected before the switch.
    let run_as = service::RunAs::prepare(cfg.user.as_deref(), cfg.group.as_deref())?;
    if run_as.as_ref().is_some_and(|r| r.switches()) && cfg.engine.rt_ioprio != Some(false) {
        // The engine would probe the I/O priority as root, and the ring refuse every rt
        // read once the switch has taken the capability.
        tracing::info!("rt I/O priority off: the switch to `user` drops CAP_SYS_NICE");
        cfg.engine.rt_ioprio = Some(false);
    }
    let mut notify = service::Notifier::from_env();
    // ---
    // Register before starting so that a signal during start-up is not lost.
    let mut signals =
        Signals::new([SIGTERM, SIGINT, SIGHUP, SIGUSR1]).context("installing signal handlers")?;
    if !inherited.is_empty() {
        tracing::info!(
            sockets = inherited.len(),
            "serving HTTP on the sockets passed by the service manager; [http] listen is not used"
        );
    }
    let server = Server::start_with_listeners(&cfg, &root, inherited)?;
    // --- service: the origin cache's directories, made at start, become the user's (it
    // writes blocks there after the switch).
    if let (Some(r), true) = (
        run_as.as_ref().filter(|r| r.switches()),
        cfg.origin.enabled(),
    ) && let Some(dirs) = cfg.origin.cache_dirs()
    {
        for d in dirs {
            std::os::unix::fs::chown(&d, Some(r.uid()), Some(r.gid()))
                .with_context(|| format!("giving {} to the configured user", d.display()))?;
        }
    }
    // --- service: every listener, the token and the control socket exist; drop root.
    if run_as.as_ref().is_some_and(|r| r.switches()) {
        server.before_privilege_drop();
    }
    service::switch_user(run_as.as_ref(), &root)?;
    // ---
    say!("{}", server.summary());
    for d in server.details() {
        say!("  {d}");
    }
    say!("  root {}", root.display());
    if let Some(f) = server.token_file() {
        say!("control token (for AUTH from other peers): {}", f.display());
    }
    if a.demo {
        let base = format!("http://{}", server.http_addr());
        say!("try: curl -O {base}/small.bin   curl {base}/media/clip.ts -r 0-99 | xxd | head");
        say!("     {base}/   {base}/metrics");
        if let Some(r) = server.rtsp_addrs().first() {
            say!("     ffprobe rtsp://{r}/media/clip.ts   (12 s of H.264 + AAC over RTSP)");
        }
        say!("     mpv {base}/media/clip.ts/index.m3u8   (HLS; a browser plays {base}/)");
        say!("     ffplay {base}/media/clip.mp4/manifest.mpd   (DASH, packaged from the MP4)");
        if let Some(c) = server.control_addr() {
            say!("     penstock ctl {c} HELP");
        }
    }
    let http: Vec<String> = server
        .http_addrs()
        .iter()
        .map(ToString::to_string)
        .collect();
    tracing::info!(http = %http.join(" "), root = %root.display(), "serving");
    let serving = format!(
        "serving http://{} (root {})",
        http.join(" http://"),
        root.display()
    );
    notify.ready(&serving);
    for sig in signals.forever() {
        match sig {
            SIGHUP => {
                notify.reloading();
                let status = match &a.config {
                    Some(p) => format!(
                        "{serving}; {}",
                        reload(&server, p, &a, root_fixed, cfg.engine.rt_ioprio)
                    ),
                    None => {
                        tracing::info!("SIGHUP without --config: nothing to reload");
                        serving.clone()
                    }
                };
                notify.ready(&status);
            }
            SIGUSR1 => server.reopen_access_log(),
            _ => break,
        }
    }
    let deadline = cfg.shutdown_deadline();
    tracing::info!(deadline_ms = deadline.as_millis() as u64, "stopping");
    notify.stopping("stopping: draining connections and streams");
    let report = server.shutdown(deadline);
    if report.http_connections_cut > 0 {
        tracing::warn!(
            cut = report.http_connections_cut,
            "connections cut at the shutdown deadline"
        );
    }
    Ok(())
}

/// The root when the command line names none: `[http] root`, else the current directory.
fn config_root(cfg: &ServerConfig) -> Result<PathBuf> {
    match &cfg.http.root {
        Some(r) => Ok(r.clone()),
        None => Ok(std::env::current_dir()?),
    }
}

/// SIGHUP: reads the file again and applies it; says what changed and what did not.
/// Returns the service status line.
fn reload(
    server: &Server,
    path: &Path,
    a: &ServeArgs,
    root_fixed: bool,
    rt_ioprio: Option<bool>,
) -> String {
    let result = ServerConfig::load(path)
        .map_err(anyhow::Error::from)
        .and_then(|mut c| {
            apply_flags(&mut c, a);
            // What start decided (off after a user switch) is not a change in the file.
            if rt_ioprio == Some(false) && c.engine.rt_ioprio.is_none() {
                c.engine.rt_ioprio = rt_ioprio;
            }
            let root = if root_fixed {
                None
            } else {
                Some(config_root(&c)?)
            };
            Ok(server.reload(&c, root.as_deref())?)
        });
    match result {
        Ok(report) => {
            tracing::info!(
                config = %path.display(),
                applied = %if report.applied.is_empty() { "nothing changed".to_string() } else { report.applied.join("; ") },
                "reloaded"
            );
            for key in &report.not_applied {
                tracing::warn!(key = %key, "changed in the file but not applied until a restart");
            }
            format!("reloaded {}", path.display())
        }
        Err(e) => {
            let e = crate::error_text(&e);
            tracing::error!(
                config = %path.display(),
                error = %e,
                "reload refused; the running configuration is unchanged"
            );
            format!("reload refused: {e}")
        }
    }
}

/// `--check-config`: everything `serve` would check before binding, then a summary.
fn check_config(cfg: &ServerConfig, a: &ServeArgs) -> Result<()> {
    cfg.check()?;
    let addrs = cfg
        .http
        .listen
        .resolve_schemed()
        .map_err(|e| anyhow::anyhow!("http.listen: {e}"))?;
    // The certificates are read and checked as at start (modes, key match, dates).
    if !cfg.tls.certificates.is_empty() {
        penstock_server::tls::Tls::start(&cfg.tls).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    // The keys of signed URLs, read as at start (modes, lengths).
    penstock_server::auth::load_keys(&cfg.auth)?;
    let root = match a.dir.clone().or_else(|| a.root.clone()) {
        Some(r) => r,
        None if a.demo => PathBuf::from("(a generated sample tree)"),
        None => config_root(cfg)?,
    };
    if !a.demo {
        penstock_server::confine::Root::open(&root)
            .with_context(|| format!("root {}", root.display()))?;
    }
    let addrs: Vec<String> = addrs
        .iter()
        .map(|(a, tls)| {
            if *tls {
                format!("https://{a}")
            } else {
                a.to_string()
            }
        })
        .collect();
    let rtsp = if cfg.rtsp.is_off() {
        String::new()
    } else {
        let r = cfg
            .rtsp
            .listen
            .resolve()
            .map_err(|e| anyhow::anyhow!("rtsp.listen: {e}"))?;
        let r: Vec<String> = r.iter().map(|a| format!("rtsp://{a}/")).collect();
        let live: Vec<String> = cfg
            .live_sources()
            .iter()
            .map(|(name, l)| format!(" live {name}={}", l.source))
            .collect();
        format!(" rtsp {}{}", r.join(" "), live.concat())
    };
    println!(
        "configuration {} is good: http {} root {}{}{rtsp}",
        a.config
            .as_deref()
            .map_or_else(|| "(defaults)".to_string(), |p| p.display().to_string()),
        addrs.join(" "),
        root.display(),
        if cfg.control.listen.is_empty() {
            String::new()
        } else {
            format!(" control {}", cfg.control.listen)
        }
    );
    Ok(())
}
