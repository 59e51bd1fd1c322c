//! penstock's servers: HTTP/1.1 downloads and the stream control protocol, over one engine.
//!
//! [`Server::start`] opens the root, starts the engine, the HTTP workers and the control
//! listeners, and returns at once; [`Server::reload`] swaps the live limits (SIGHUP);
//! [`Server::shutdown`] stops accepting, lets responses and streams finish until a deadline,
//! then cuts the rest.
//!
//! # Design
//! - **HTTP** ([`http`]): one epoll loop per worker thread, each with its own SO_REUSEPORT
//!   listener on the same address, so workers share nothing on the request path. Readiness
//!   (epoll) rather than an io_uring ring: the loop's work is accept, small reads and
//!   `sendfile`, which io_uring would run on io-wq threads anyway (no async sendfile opcode),
//!   and epoll's level-triggered interest costs nothing for 10,000 idle sockets. The protocol
//!   (parsing, ranges, preconditions, heads, multipart plans) is `penstock_core::http`,
//!   sans-IO; this crate only moves bytes. Small bodies go out with `sendfile` from the loop;
//!   large ones go to the engine's zero-copy path on a `dup` of the socket.
//! - **Confinement** ([`confine`]): every path is opened with `openat2(RESOLVE_BENEATH |
//!   RESOLVE_NO_MAGICLINKS)` below the root's descriptor; no byte outside the root.
//! - **Control** ([`control`], [`streams`]): a thread per control connection (few, and their
//!   commands may block on opening endpoints), one shared stream table, admission by the
//!   engine's (the one admission control).
//! - **Metrics** ([`metrics`]): prometheus-client, served by the HTTP workers at
//!   `/metrics` and, when configured, on a separate listener ([`metrics_http`]).
//! - **Access log** ([`access_log`]): nginx's combined format, formatted by each worker into
//!   its own buffer and written by one writer thread; reopened on SIGUSR1.
//!
//! What is absent: TLS, request bodies (GET and HEAD only), HTTP/2, directory listings.
#![forbid(unsafe_code)]

pub mod access;
pub mod access_log;
pub mod config;
pub mod confine;
pub mod control;
mod http;
pub mod metrics;
pub mod metrics_http;
pub mod private;
pub mod streams;

use std::io::{self, Read};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use penstock_driver::Engine;

pub use config::{ConfigError, ServerConfig};
pub use metrics::Metrics;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("root {path}")]
    Root { path: PathBuf, source: io::Error },
    #[error("engine: {0}")]
    Engine(String),
    #[error("admission: {0}")]
    Admission(String),
    #[error("{what} {addr}")]
    Bind {
        what: &'static str,
        addr: String,
        source: io::Error,
    },
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// A running server.
pub struct Server {
    http_addr: SocketAddr,
    control_addr: Option<SocketAddr>,
    unix_path: Option<PathBuf>,
    token_file: Option<PathBuf>,
    http: Arc<http::HttpShared>,
    control: Arc<control::ControlShared>,
    http_threads: Vec<JoinHandle<()>>,
    control_threads: Vec<JoinHandle<()>>,
    paths: String,
    metrics: Arc<Metrics>,
    metrics_listener: Option<metrics_http::MetricsListener>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("http_addr", &self.http_addr)
            .field("control_addr", &self.control_addr)
            .field("unix_path", &self.unix_path)
            .finish()
    }
}

/// How a shutdown went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Connections still open at the deadline, cut.
    pub http_connections_cut: usize,
}

fn random_token() -> io::Result<String> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

impl Server {
    /// Starts everything described by `cfg`, serving `root`.
    pub fn start(cfg: &ServerConfig, root: &Path) -> Result<Server, ServerError> {
        cfg.check()?;
        let nofile = raise_nofile(descriptors_wanted(cfg));
        let root_fd = confine::Root::open(root).map_err(|source| ServerError::Root {
            path: root.to_path_buf(),
            source,
        })?;
        // The engine owns the one admission control, with the configured capacity: control
        // streams (and later RTSP sessions) ask it, as `penstock stream` does.
        let mut engine_cfg = cfg.engine.engine_config();
        engine_cfg.admission = cfg.admission.admission_config();
        let engine =
            Arc::new(Engine::new(engine_cfg).map_err(|e| ServerError::Engine(e.to_string()))?);
        let metrics = Arc::new(Metrics::new());
        metrics.watch_engine(engine.clone());
        let access_log = access_log::AccessLog::start(
            &cfg.log.access_target(),
            cfg.log.access_limits(),
            metrics.clone(),
        )?;

        let body_path = cfg.body_path()?;
        let shared = Arc::new(http::HttpShared::new(
            cfg.live(),
            root_fd,
            cfg.http.index.clone(),
            cfg.http.server_name.clone(),
            cfg.http.metrics_path.clone(),
            cfg.http.engine_body_bytes_min,
            body_path,
            engine.clone(),
            metrics.clone(),
            access_log,
        ));
        let addr: SocketAddr =
            cfg.http.listen.parse().map_err(|e| {
                ConfigError::Invalid(format!("http.listen {:?}: {e}", cfg.http.listen))
            })?;
        let workers = if cfg.http.workers == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            cfg.http.workers
        };
        let (http_addr, http_threads) =
            http::start(shared.clone(), addr, workers).map_err(|source| ServerError::Bind {
                what: "http",
                addr: cfg.http.listen.clone(),
                source,
            })?;

        let access =
            access::Access::new(&cfg.control, root).map_err(|source| ServerError::Root {
                path: root.to_path_buf(),
                source,
            })?;
        let (token, token_file) = match &cfg.control.token {
            Some(t) => (t.clone(), None),
            None => {
                let t = random_token()?;
                let file = cfg
                    .control
                    .token_file
                    .clone()
                    .or_else(|| cfg.control.unix.as_deref().map(private::default_token_file));
                if let Some(f) = &file {
                    private::write_token(f, &t)?;
                }
                (t, file)
            }
        };
        let tcp = if cfg.control.listen.is_empty() {
            None
        } else {
            Some(
                TcpListener::bind(&cfg.control.listen).map_err(|source| ServerError::Bind {
                    what: "control",
                    addr: cfg.control.listen.clone(),
                    source,
                })?,
            )
        };
        let control_addr = tcp.as_ref().map(|l| l.local_addr()).transpose()?;
        let unix = match &cfg.control.unix {
            Some(p) => {
                private::prepare_socket_path(p).map_err(|source| ServerError::Bind {
                    what: "control unix",
                    addr: p.display().to_string(),
                    source,
                })?;
                let l = UnixListener::bind(p).map_err(|source| ServerError::Bind {
                    what: "control unix",
                    addr: p.display().to_string(),
                    source,
                })?;
                // Who may act is decided by SO_PEERCRED; the mode only keeps everyone else
                // from even connecting when no one else is allowed.
                let others = cfg
                    .control
                    .unix_allow_uids
                    .iter()
                    .any(|&u| u != rustix::process::geteuid().as_raw())
                    || !cfg.control.unix_allow_gids.is_empty();
                let mode = if others { 0o666 } else { 0o600 };
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))?;
                Some((l, p.clone()))
            }
            None => None,
        };
        let streams = Arc::new(streams::Streams::new(
            Box::new(streams::EngineBackend {
                engine: engine.clone(),
                access,
            }),
            metrics.clone(),
            cfg.control.clone(),
        ));
        let http_for_stats = shared.clone();
        let control = Arc::new(control::ControlShared::new(
            streams,
            cfg.control.clone(),
            token,
            Box::new(move || http_for_stats.connections()),
        ));
        let control_threads = control::start(control.clone(), tcp, unix)?;
        let metrics_listener = if cfg.http.metrics_listen.is_empty() {
            None
        } else {
            let a: SocketAddr = cfg.http.metrics_listen.parse().map_err(|e| {
                ConfigError::Invalid(format!(
                    "http.metrics_listen {:?}: {e}",
                    cfg.http.metrics_listen
                ))
            })?;
            Some(
                metrics_http::MetricsListener::start(a, metrics.clone()).map_err(|source| {
                    ServerError::Bind {
                        what: "metrics",
                        addr: cfg.http.metrics_listen.clone(),
                        source,
                    }
                })?,
            )
        };

        let uring = match &engine.info().uring {
            Ok(()) => "io_uring available".to_string(),
            Err(e) => format!("io_uring refused ({e})"),
        };
        let paths = if cfg.http.engine_body_bytes_min == 0 {
            format!("http bodies: sendfile from the connection loops; {uring}")
        } else {
            format!(
                "http bodies: sendfile from the connection loops below {} bytes, engine path {} at or above; {uring}",
                cfg.http.engine_body_bytes_min, cfg.http.body_path
            )
        };
        let paths = format!("{paths}; {nofile}");
        Ok(Server {
            http_addr,
            control_addr,
            unix_path: cfg.control.unix.clone(),
            token_file,
            http: shared,
            control,
            http_threads,
            control_threads,
            paths,
            metrics,
            metrics_listener,
        })
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    pub fn control_addr(&self) -> Option<SocketAddr> {
        self.control_addr
    }

    pub fn unix_path(&self) -> Option<&Path> {
        self.unix_path.as_deref()
    }

    /// The control token (configured or generated).
    pub fn token(&self) -> &str {
        &self.control.token
    }

    /// Where a generated token was written, if it was.
    pub fn token_file(&self) -> Option<&Path> {
        self.token_file.as_deref()
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The separate metrics listener's address, when `[http] metrics_listen` is set.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_listener.as_ref().map(|l| l.local_addr())
    }

    /// SIGUSR1: the access log's file is opened again by its path (after logrotate renamed
    /// it). Nothing for stdout or without an access log.
    pub fn reopen_access_log(&self) {
        if let Some(l) = &self.http.access_log {
            l.reopen();
        }
    }

    /// The one line printed at start: addresses and data paths.
    pub fn summary(&self) -> String {
        let mut s = format!("penstock serve: http://{}", self.http_addr);
        if let Some(a) = self.control_addr {
            s.push_str(&format!(", control {a}"));
        }
        if let Some(p) = &self.unix_path {
            s.push_str(&format!(", control unix:{}", p.display()));
        }
        if let Some(a) = self.metrics_addr() {
            s.push_str(&format!(", metrics http://{a}/metrics"));
        }
        s.push_str(&format!("; {}", self.paths));
        s
    }

    /// SIGHUP: takes the live part of `cfg` (limits, locations: classes and rates).
    pub fn reload(&self, cfg: &ServerConfig) -> Result<(), ConfigError> {
        cfg.check()?;
        self.http.set_live(cfg.live());
        Ok(())
    }

    /// Stops accepting; lets responses and streams finish until `deadline`, then cuts them.
    pub fn shutdown(self, deadline: Duration) -> ShutdownReport {
        let start = Instant::now();
        self.http.stop();
        self.control.stop.store(true, Ordering::Release);
        while start.elapsed() < deadline && self.http_threads.iter().any(|t| !t.is_finished()) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let http_connections_cut = self.http.connections();
        self.http.cut();
        for t in self.http_threads {
            let _ = t.join();
        }
        // The workers handed over their last lines; the writer writes them and stops.
        if let Some(l) = &self.http.access_log {
            l.stop(
                Instant::now()
                    + deadline
                        .saturating_sub(start.elapsed())
                        .max(Duration::from_secs(1)),
            );
        }
        drop(self.metrics_listener);
        self.control
            .streams
            .shutdown(deadline.saturating_sub(start.elapsed()));
        for t in self.control_threads {
            let _ = t.join();
        }
        ShutdownReport {
            http_connections_cut,
        }
    }
}

/// Descriptors the server may hold at once at its limits: an HTTP connection holds its
/// socket, the file of its body and, while the engine sends it, a dup of the socket; a
/// control connection its socket; plus a margin for listeners, the engine's rings and files.
fn descriptors_wanted(cfg: &ServerConfig) -> u64 {
    let http = cfg.limits.connections_max as u64;
    let control = (cfg.control.tcp_connections_max + cfg.control.unix_connections_max) as u64;
    http.saturating_mul(3)
        .saturating_add(control.saturating_mul(3))
        .saturating_add(256)
}

/// Raises the soft RLIMIT_NOFILE towards `wanted` (at most the hard limit: raising that
/// needs privilege) and says what it is now, for the start line. The default soft limit
/// (often 1024) would make `accept` fail with EMFILE long before `connections_max`.
fn raise_nofile(wanted: u64) -> String {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let cur = getrlimit(Resource::Nofile);
    let soft = cur.current.unwrap_or(u64::MAX);
    let hard = cur.maximum.unwrap_or(u64::MAX);
    let target = wanted.min(hard);
    let now = if soft < target {
        match setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(target),
                maximum: cur.maximum,
            },
        ) {
            Ok(()) => target,
            Err(e) => {
                tracing::warn!(error = %e, soft, target, "could not raise RLIMIT_NOFILE");
                soft
            }
        }
    } else {
        soft
    };
    if now < wanted {
        tracing::warn!(
            descriptors = now,
            wanted,
            "RLIMIT_NOFILE is below what connections_max may need: accept fails with EMFILE beyond it"
        );
        format!("descriptors {now} (below the {wanted} the connection limits may need)")
    } else {
        format!("descriptors {now}")
    }
}
