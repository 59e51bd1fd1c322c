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
pub mod api;
pub mod auth;
pub mod cluster;
pub mod config;
pub mod confine;
pub mod control;
mod delivery;
mod hls;
mod hls_live;
mod hls_sessions;
mod http;
pub mod listen;
pub mod metrics;
pub mod metrics_http;
mod origin;
pub mod peer_log;
pub mod private;
pub mod rtsp;
pub mod scrub;
pub mod streams;
mod tenants;
pub mod tls;

use std::io::{self, Read};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
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
    #[error("{what} {addr}{}", bind_hint(what, source))]
    Bind {
        what: &'static str,
        addr: String,
        source: io::Error,
    },
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// The way out when an address is taken (most often another `penstock serve`): which
/// setting or flag moves this listener elsewhere or turns it off.
fn bind_hint(what: &str, source: &io::Error) -> String {
    if source.kind() != io::ErrorKind::AddrInUse {
        return String::new();
    }
    let way = match what {
        "http" => "--listen ADDR or `[http] listen`",
        "control" => "--control ADDR (\"\" for none) or `[control] listen`",
        "control unix" => "--control-unix PATH, or --no-control-unix",
        "rtsp" => "--rtsp ADDR (\"\" for none) or `[rtsp] listen`",
        "metrics" => "`[http] metrics_listen`",
        "rtsp live source" => "the source's `source` in `[rtsp.live.NAME]`",
        _ => return String::new(),
    };
    format!(" (in use, perhaps by another penstock serve; to run beside it: {way})")
}

/// An HTTP address being listened on: as configured (port 0 stays 0) and as bound, with a
/// descriptor of each worker's socket, kept so that a reload that keeps the address keeps
/// the sockets (and the connections waiting in their backlogs).
struct Listening {
    wanted: SocketAddr,
    bound: SocketAddr,
    /// An `https://` listener.
    tls: bool,
    socks: Vec<TcpListener>,
}

/// What a reload did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReloadReport {
    /// What changed and took effect, one phrase each (`http.listen: now 127.0.0.1:8081`).
    pub applied: Vec<String>,
    /// Keys that changed in the file but take effect only at a restart.
    pub not_applied: Vec<String>,
}

/// A running server.
pub struct Server {
    listening: Mutex<Vec<Listening>>,
    /// The HTTP sockets came from the service manager (LISTEN_FDS): `http.listen` is not ours.
    activated: bool,
    workers: usize,
    /// The configuration running now (the last one a reload accepted).
    running: Mutex<ServerConfig>,
    /// The served directory, as given.
    root: Mutex<PathBuf>,
    control_addr: Option<SocketAddr>,
    /// The control TCP listener is `tls://`.
    control_tls: bool,
    unix_path: Option<PathBuf>,
    token_file: Option<PathBuf>,
    http: Arc<http::HttpShared>,
    control: Arc<control::ControlShared>,
    http_threads: Vec<JoinHandle<()>>,
    control_threads: Vec<JoinHandle<()>>,
    paths: Vec<String>,
    metrics: Arc<Metrics>,
    engine: Arc<Engine>,
    metrics_listener: Option<metrics_http::MetricsListener>,
    /// The operator's API and dashboard (`None`: `[api] listen` is empty).
    api: Option<api::ApiServer>,
    /// The RTSP server (`None`: `[rtsp] listen` is empty).
    rtsp: Option<Mutex<rtsp::RtspServer>>,
    /// Membership in etcd (`None`: `[cluster] etcd` is empty).
    membership: Option<Mutex<cluster::Membership>>,
    /// The background scrub of the served volumes (`None`: off, or no `[volumes]`).
    scrub: Option<scrub::Scrubber>,
    /// Who may watch: keys and locations' rules, shared by HTTP and RTSP (reloaded).
    viewers: Arc<auth::Viewers>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("http_addrs", &self.http_addrs())
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
    /// Before a switch to an unprivileged user: the timed workers' CPU reservations are
    /// fixed at their widest, since the user may not change them (docs/service.md).
    pub fn before_privilege_drop(&self) {
        for why in self.engine.fix_timed_reservations() {
            tracing::warn!("{why}");
        }
    }

    pub fn start(cfg: &ServerConfig, root: &Path) -> Result<Server, ServerError> {
        Server::start_with_listeners(cfg, root, Vec::new())
    }

    /// As [`Server::start`], with HTTP listening sockets made by someone else (systemd's
    /// socket activation): when there are any, they are served instead of `http.listen`.
    pub fn start_with_listeners(
        cfg: &ServerConfig,
        root: &Path,
        inherited: Vec<TcpListener>,
    ) -> Result<Server, ServerError> {
        cfg.check()?;
        // `[volumes]` limits: every volume update this process makes (control recordings).
        penstock_driver::volume::set_limits(cfg.volumes.limits()?)
            .map_err(|e| ConfigError::Invalid(format!("volumes: {e}")))?;
        let nofile = raise_nofile(cfg);
        let root_fd = confine::Root::open(root).map_err(|source| ServerError::Root {
            path: root.to_path_buf(),
            source,
        })?;
        // The engine owns the one admission control, with the configured capacity: control
        // streams (and later RTSP sessions) ask it, as `penstock stream` does.
        let mut engine_cfg = cfg.engine_config();
        engine_cfg.admission = cfg.admission.admission_config();
        if cfg.admission.cpu_ns_per_s.is_none() {
            // The streams' sends run on the workers: each gives a second per second.
            engine_cfg.admission.capacity.cpu_ns_per_s =
                1_000_000_000u64.saturating_mul(engine_cfg.workers as u64);
        }
        engine_cfg.self_calibration = cfg.admission.self_calibration();
        let a = &cfg.admission;
        if (a.cpu_send_ns.is_none()
            || a.cpu_send_byte_ps.is_none()
            || a.cpu_burst_byte_ps.is_none())
            && engine_cfg.self_calibration.enabled
        {
            // Admission's CPU charge per send and per byte: this machine's engine's, measured
            // once (about 2 s) and cached with the device figures (not the conservative 17 µs
            // + 2 ns a byte, which refused the 100th 8 Mbit/s RTSP session on two CPUs that
            // carried more). A figure set in `[admission]` is kept.
            let cache = engine_cfg.self_calibration.cache_dir.as_deref();
            match penstock_driver::send_cost::send_cost(
                cache,
                penstock_driver::send_cost::SEND_COST_TIME,
            ) {
                Ok(r) => {
                    // A configured figure a byte stands for the burst's too (set above).
                    engine_cfg.admission.capacity =
                        penstock_driver::send_cost::capacity_with_send_cost(
                            engine_cfg.admission.capacity,
                            &r.charged(),
                            penstock_driver::send_cost::SendCostKept {
                                send_ns: a.cpu_send_ns.is_some(),
                                send_byte_ps: a.cpu_send_byte_ps.is_some(),
                                burst_byte_ps: a.cpu_burst_byte_ps.is_some(),
                            },
                        );
                }
                Err(e) => tracing::warn!(
                    "the CPU cost of a send could not be measured ({e}): admission charges the default {} ns",
                    engine_cfg.admission.capacity.cpu_send_ns
                ),
            }
        }
        let engine =
            Arc::new(Engine::new(engine_cfg).map_err(|e| ServerError::Engine(e.to_string()))?);
        // `[tenants.NAME]`: their parts of the rt capacity, carved out of admission.
        engine
            .set_tenants(&cfg.tenant_shares())
            .map_err(|e| ServerError::Engine(e.to_string()))?;
        // The root's device, measured now (under 5 s; from the cache when it is the same
        // device): what an `OPEN … class=rt` is charged before its file is opened. Through
        // the oldest large file under the root when the device node cannot be read (cold
        // data: see `calibration::device_figures`).
        let probe = penstock_driver::calibration::cold_file_under(
            root,
            penstock_driver::calibration::COLD_FILE_ENTRIES_MAX,
        )
        .map_or_else(|| std::fs::File::open(root), Ok);
        if let Ok(f) = probe {
            match engine.self_calibrate(std::os::fd::AsFd::as_fd(&f)) {
                Some(Ok(fig)) => tracing::info!(
                    "the root's device: {} B/s sequential, {} reads/s of {} B ({})",
                    fig.disk.seq_bytes_per_s,
                    fig.disk.random_iops,
                    fig.disk.random_request_bytes,
                    fig.source
                ),
                Some(Err(e)) => tracing::info!(
                    "the root's device is not self-calibrated ({e}): rt admissions ahead of the open are charged the default figures"
                ),
                None => {}
            }
        }
        let metrics = Arc::new(Metrics::new());
        // `[auth]`: the key files are read (and refused if bad) before anything is bound.
        let viewers = Arc::new(auth::Viewers::new(cfg, metrics.clone())?);
        metrics.watch_engine(engine.clone());
        // The background scrub's families are there (at 0) whether it runs or not.
        let scrub_counters = scrub::ScrubCounters::default();
        metrics.register_with(|r| scrub_counters.register(r));
        let scrub = cfg
            .volumes
            .scrub()
            .map(|(rate, interval)| {
                scrub::Scrubber::start(cfg.volumes.members.clone(), rate, interval, scrub_counters)
            })
            .transpose()?;
        let access_log = access_log::AccessLog::start(
            &cfg.log.access_target(),
            cfg.log.access_limits(),
            metrics.clone(),
        )?;

        let body_path = cfg.body_path()?;
        let origin = if cfg.origin.enabled() {
            let o = origin::Origin::start(&cfg.origin).map_err(ConfigError::Invalid)?;
            metrics.register_with(|r| o.metrics.register(r));
            Some(Arc::new(o))
        } else {
            None
        };
        let origin_for_rtsp = origin.clone();
        // The key-frame indexes of TS files: HLS playlists and RTSP seeks share them.
        let hls_indexes = Arc::new(hls::Hls::new(cfg.hls.clone()));
        // HLS viewer sessions, admitted by the engine's admission; listed in `STATE`.
        let hls_sessions = Arc::new(hls_sessions::HlsSessions::new(
            &cfg.hls,
            engine.clone(),
            metrics.clone(),
        ));
        // `[tls]`: its files are read (and refused if bad) before anything is bound.
        let tls = if cfg.tls.certificates.is_empty() {
            None
        } else {
            let t = tls::Tls::start(&cfg.tls).map_err(ConfigError::Invalid)?;
            tracing::info!(names = %tls::describe(&t), "tls: certificates loaded");
            Some(Arc::new(t))
        };
        let shared = Arc::new(
            http::HttpShared::new(
                cfg.live(),
                http::Site::new(
                    root_fd,
                    cfg.http.index.clone(),
                    &cfg.http.types,
                    &cfg.volumes.members,
                ),
                cfg.http.server_name.clone(),
                cfg.http.metrics_path.clone(),
                cfg.http.health_path.clone(),
                cfg.http.engine_body_bytes_min,
                body_path,
                engine.clone(),
                metrics.clone(),
                access_log,
            )
            .with_origin(origin)
            .with_hls(hls_indexes.clone())
            .with_hls_sessions(hls_sessions.clone())
            .with_tls(tls)
            .with_viewers(viewers.clone()),
        );
        let workers = if cfg.http.workers == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            cfg.http.workers
        };
        let activated = !inherited.is_empty();
        let mut groups = Vec::new();
        if activated {
            for l in inherited {
                let addr = l.local_addr()?;
                groups.push((addr, false, http::shared_group(l, workers)?));
            }
        } else {
            for (addr, tls) in cfg
                .http
                .listen
                .resolve_schemed()
                .map_err(|e| ConfigError::Invalid(format!("http.listen: {e}")))?
            {
                let g = http::bind_group(addr, workers).map_err(|source| ServerError::Bind {
                    what: "http",
                    addr: addr.to_string(),
                    source,
                })?;
                groups.push((addr, tls, g));
            }
        }
        let mut listening = Vec::new();
        let mut handed = Vec::new();
        for (wanted, tls, g) in groups {
            listening.push(Listening {
                wanted,
                bound: g[0].local_addr()?,
                tls,
                socks: clone_all(&g)?,
            });
            handed.push(g);
        }
        shared.set_tls_addrs(
            listening
                .iter()
                .filter(|l| l.tls)
                .map(|l| l.bound)
                .collect(),
        );
        let http_threads = http::start(shared.clone(), handed, workers)?;

        let access = access::Access::new(&cfg.control, root)
            .map_err(|source| ServerError::Root {
                path: root.to_path_buf(),
                source,
            })?
            .with_origin(origin_for_rtsp.clone());
        let (token, token_file) = match &cfg.control.token {
            Some(t) => (t.clone(), None),
            None => {
                let t = random_token()?;
                let file = cfg
                    .control
                    .token_file
                    .clone()
                    .or_else(|| cfg.control.unix.as_deref().map(private::default_token_file));
                // A TCP port whose token is made here and written nowhere answers only
                // `HELP`, `QUIT` and a failing `AUTH`: refused, naming the ways out.
                if file.is_none() && !cfg.control.listen.is_empty() {
                    return Err(ConfigError::Invalid(format!(
                        "control.listen {}: a TCP control port needs a token its clients can \
                         read, and there is none here (no control.token, no control.token_file, \
                         and no Unix socket to write one beside): set control.token or \
                         control.token_file, keep the Unix socket (no --no-control-unix), or \
                         turn TCP control off (control.listen = \"\" or --control '')",
                        cfg.control.listen
                    ))
                    .into());
                }
                (t, file)
            }
        };
        let mut control_tls = None;
        let tcp = if cfg.control.listen.is_empty() {
            None
        } else {
            let (tls, addr) = cfg.control.listen_addr()?;
            if tls {
                control_tls = Some(shared.tls.clone().ok_or_else(|| {
                    ConfigError::Invalid("control.listen: tls:// needs [tls] certificates".into())
                })?);
            }
            Some(TcpListener::bind(addr).map_err(|source| ServerError::Bind {
                what: "control",
                addr: cfg.control.listen.clone(),
                source,
            })?)
        };
        let control_is_tls = control_tls.is_some();
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
        // The token file, once the addresses are bound: it names them, and `penstock ctl`
        // sends the token read from it to those addresses only.
        if cfg.control.token.is_none()
            && let Some(f) = &token_file
        {
            let mut servers = Vec::new();
            if let Some(a) = control_addr {
                servers.push(if control_is_tls {
                    format!("tls://{a}")
                } else {
                    a.to_string()
                });
            }
            if let Some((_, p)) = &unix {
                servers.push(format!("unix:{}", p.display()));
            }
            private::write_token(f, &token, &servers)?;
        }
        let streams = Arc::new(streams::Streams::new(
            Box::new(streams::EngineBackend::new(engine.clone(), access)),
            metrics.clone(),
            cfg.control.clone(),
        ));
        let http_for_stats = shared.clone();
        let streams_for_rtsp = streams.clone();
        {
            let s = hls_sessions.clone();
            streams.add_state_source(Box::new(move || s.state_lines()));
        }
        let control = Arc::new(control::ControlShared::new(
            streams,
            cfg.control.clone(),
            token,
            Box::new(move || http_for_stats.connections()),
        ));
        let control_threads = control::start(control.clone(), tcp, unix, control_tls)?;
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

        let rtsp = if cfg.rtsp.is_off() {
            None
        } else {
            let r = rtsp::RtspServer::start(
                &cfg.rtsp_with_live(),
                &cfg.volumes,
                root,
                engine.clone(),
                metrics.clone(),
                &hls_indexes,
                shared.tls.clone(),
            )?;
            if let Some(o) = &origin_for_rtsp {
                r.set_origin(o.clone());
            }
            r.set_hls(hls_indexes.clone());
            r.set_viewers(viewers.clone());
            if let Some(l) = &shared.access_log {
                r.set_access_log(l.sink());
            }
            streams_for_rtsp.add_state_source(r.state_source());
            Some(Mutex::new(r))
        };
        let api = match cfg.api.listen_addr()? {
            None => None,
            Some((tls, addr)) => {
                let tls = if tls {
                    Some(shared.tls.clone().ok_or_else(|| {
                        ConfigError::Invalid("api.listen: https:// needs [tls] certificates".into())
                    })?)
                } else {
                    None
                };
                let l = TcpListener::bind(addr).map_err(|source| ServerError::Bind {
                    what: "api",
                    addr: cfg.api.listen.clone(),
                    source,
                })?;
                let hls_kick = {
                    let h = hls_sessions.clone();
                    Box::new(move |id: &str| h.kick(id))
                };
                let deps = api::ApiDeps {
                    control: control.clone(),
                    engine: engine.clone(),
                    rtsp_kick: rtsp
                        .as_ref()
                        .map(|r| r.lock().unwrap_or_else(|p| p.into_inner()).kicker()),
                    hls_kick,
                    volumes: cfg.volumes.clone(),
                    write_roots: cfg.control.write_roots.clone(),
                    workers: sched_line(engine.info()),
                    viewers: viewers.clone(),
                };
                Some(api::ApiServer::start(&cfg.api, l, tls, deps)?)
            }
        };
        let membership = if cfg.cluster.is_off() {
            None
        } else {
            // The plain listeners first (HAProxy and redirects speak plain HTTP and RTSP);
            // the first https:// one is published for peer fills.
            let http_bound = listening
                .iter()
                .find(|l| !l.tls)
                .or(listening.first())
                .map(|l| l.bound);
            let https_bound = listening.iter().find(|l| l.tls).map(|l| l.bound);
            let rtsp_bound = rtsp.as_ref().and_then(|r| {
                let r = r.lock().unwrap_or_else(|p| p.into_inner());
                let all = r.addrs();
                all.iter().find(|&&a| !r.is_tls(a)).or(all.first()).copied()
            });
            let m = start_membership(
                cfg,
                (http_bound, https_bound),
                rtsp_bound,
                control_addr,
                engine.clone(),
                origin_for_rtsp.clone(),
                &metrics,
            )?;
            let view = m.view();
            if let Some(r) = &rtsp {
                r.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .set_cluster(view.clone());
            }
            if let Some(o) = &origin_for_rtsp {
                o.set_cluster(view.clone());
            }
            let _ = control.cluster.set(view);
            Some(Mutex::new(m))
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
        let paths = vec![paths, format!("{nofile}; {}", sched_line(engine.info()))];
        Ok(Server {
            listening: Mutex::new(listening),
            activated,
            workers,
            running: Mutex::new(cfg.clone()),
            root: Mutex::new(root.to_path_buf()),
            control_addr,
            control_tls: control_is_tls,
            unix_path: cfg.control.unix.clone(),
            token_file,
            http: shared,
            control,
            http_threads,
            control_threads,
            paths,
            metrics,
            engine,
            metrics_listener,
            api,
            rtsp,
            membership,
            scrub,
            viewers,
        })
    }

    /// The cluster membership as last read from etcd (`None` without `[cluster]`).
    pub fn cluster_view(&self) -> Option<Arc<cluster::View>> {
        self.membership
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|p| p.into_inner()).view())
    }

    /// The RTSP addresses listened on (none when `[rtsp] listen` is empty).
    pub fn rtsp_addrs(&self) -> Vec<SocketAddr> {
        self.rtsp.as_ref().map_or_else(Vec::new, |r| {
            r.lock().unwrap_or_else(|p| p.into_inner()).addrs().to_vec()
        })
    }

    /// RTSP sessions now.
    pub fn rtsp_sessions(&self) -> usize {
        self.rtsp.as_ref().map_or(0, |r| {
            r.lock().unwrap_or_else(|p| p.into_inner()).sessions()
        })
    }

    /// The first HTTP address listened on.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addrs()[0]
    }

    /// Every HTTP address listened on, in the configured order.
    pub fn http_addrs(&self) -> Vec<SocketAddr> {
        self.listening
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|l| l.bound)
            .collect()
    }

    /// The HTTP addresses listened on with TLS (`https://`), in the configured order.
    pub fn https_addrs(&self) -> Vec<SocketAddr> {
        self.listening
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|l| l.tls)
            .map(|l| l.bound)
            .collect()
    }

    /// Whether the HTTP sockets came from the service manager.
    pub fn socket_activated(&self) -> bool {
        self.activated
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

    /// The API listener's address, when `[api] listen` is set.
    pub fn api_addr(&self) -> Option<SocketAddr> {
        self.api.as_ref().map(|a| a.local_addr())
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

    /// The first line printed at start: every address (`penstock serve: http://HOST:PORT,
    /// control HOST:PORT, control unix:PATH, rtsp://HOST:PORT/`; scripts read it). The
    /// rest is in [`Server::details`].
    pub fn summary(&self) -> String {
        let http: Vec<String> = self
            .listening
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|l| {
                let scheme = if l.tls { "https" } else { "http" };
                format!("{scheme}://{}", l.bound)
            })
            .collect();
        let mut s = format!("penstock serve: {}", http.join(" "));
        if let Some(a) = self.control_addr {
            let scheme = if self.control_tls { "tls://" } else { "" };
            s.push_str(&format!(", control {scheme}{a}"));
        }
        if let Some(p) = &self.unix_path {
            s.push_str(&format!(", control unix:{}", p.display()));
        }
        if let Some(a) = self.metrics_addr() {
            s.push_str(&format!(", metrics http://{a}/metrics"));
        }
        if let Some(a) = &self.api {
            s.push_str(&format!(", api {}", a.url()));
        }
        if let Some(r) = &self.rtsp {
            let r = r.lock().unwrap_or_else(|p| p.into_inner());
            for &a in r.addrs() {
                let scheme = if r.is_tls(a) { "rtsps" } else { "rtsp" };
                s.push_str(&format!(", {scheme}://{a}/"));
            }
        }
        s
    }

    /// What the start line leaves out, one phrase a line: how HTTP bodies move and whether
    /// io_uring is there; the descriptors and the workers' CPU policies.
    pub fn details(&self) -> Vec<String> {
        self.paths.clone()
    }

    /// SIGHUP: takes what can change while serving — the limits, the locations (classes
    /// and rates), the disk scheduler's quanta and in-flight bound (which also undoes a
    /// `TUNE disk`), the HTTP addresses (re-bound: new ones bound first, kept ones keep their
    /// sockets, dropped ones closed; connections already accepted continue), and the served
    /// directory (`root`, when the command line did not fix it; index and types with it).
    /// Everything else in `cfg` that differs from the running configuration is listed in
    /// the report as not applied. All or nothing: an address that cannot be bound or a root
    /// that cannot be opened refuses the reload and changes nothing.
    pub fn reload(
        &self,
        cfg: &ServerConfig,
        root: Option<&Path>,
    ) -> Result<ReloadReport, ServerError> {
        cfg.check()?;
        let mut report = ReloadReport::default();
        let old = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        // The root first: opening it may fail, and nothing may have changed then. It is
        // opened again even when unchanged: a directory replaced under the same name is
        // served from now on.
        let old_root = self.root.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let new_root = root.map_or_else(|| old_root.clone(), Path::to_path_buf);
        let site = confine::Root::open(&new_root)
            .map(|fd| {
                http::Site::new(
                    fd,
                    cfg.http.index.clone(),
                    &cfg.http.types,
                    &cfg.volumes.members,
                )
            })
            .map_err(|source| ServerError::Root {
                path: new_root.clone(),
                source,
            })?;
        // The certificates: read and checked now, applied with the rest (a broken file
        // refuses the reload, and the certificates in force stay).
        let tls_staged = match (&self.http.tls, cfg.tls.certificates.is_empty()) {
            (Some(t), false) => Some(t.stage(&cfg.tls).map_err(ConfigError::Invalid)?),
            (Some(_), true) => {
                return Err(ConfigError::Invalid(
                    "tls: the certificates cannot all be removed while serving (restart without [tls])".into(),
                )
                .into());
            }
            (None, false) => {
                report
                    .not_applied
                    .push("tls (added while serving: TLS starts at a restart)".into());
                None
            }
            (None, true) => None,
        };
        if self.http.tls.is_none() && cfg.http.listen.has_tls() && !self.activated {
            return Err(ConfigError::Invalid(
                "http.listen: https:// needs [tls] at start (restart to add TLS)".into(),
            )
            .into());
        }
        // `[auth]`: the key files read again (a bad one refuses the reload, the keys in force
        // stay), applied with the rest.
        let viewers_staged = auth::Viewers::stage(cfg)?;
        // Then the addresses: bind every new one before giving up any old one (they are
        // handed over only when nothing else can refuse).
        let mut new_listening = None;
        if cfg.http.listen != old.http.listen {
            if self.activated {
                report.not_applied.push(
                    "http.listen (the HTTP sockets came from the service manager: change the .socket unit)"
                        .into(),
                );
            } else {
                let wanted = cfg
                    .http
                    .listen
                    .resolve_schemed()
                    .map_err(|e| ConfigError::Invalid(format!("http.listen: {e}")))?;
                let current = self.listening.lock().unwrap_or_else(|p| p.into_inner());
                let mut next = Vec::new();
                for (addr, tls) in wanted {
                    let socks = match current
                        .iter()
                        .find(|l| l.wanted == addr && (addr.port() != 0 || l.tls == tls))
                    {
                        Some(l) => clone_all(&l.socks)?,
                        None => http::bind_group(addr, self.workers).map_err(|source| {
                            ServerError::Bind {
                                what: "http",
                                addr: addr.to_string(),
                                source,
                            }
                        })?,
                    };
                    next.push(Listening {
                        wanted: addr,
                        bound: socks[0].local_addr()?,
                        tls,
                        socks,
                    });
                }
                drop(current);
                new_listening = Some(next);
            }
        }
        // The disk scheduler: checked again by the engine against the read size it runs
        // with (`[engine]` is not reloaded); the last step that can refuse. It also undoes
        // a `TUNE disk`.
        self.engine
            .tune_disk(&cfg.disk.tuning())
            .map_err(|e| ConfigError::Invalid(format!("[disk]: {e}")))?;
        if cfg.disk != old.disk {
            let d = self.engine.disk_settings();
            report.applied.push(format!(
                "disk: rt_quantum_bytes {} bulk_quantum_bytes {} inflight_max {}",
                d.rt_quantum_bytes, d.bulk_quantum_bytes, d.disk_inflight_max
            ));
        }
        if let Some(next) = new_listening {
            let groups = next
                .iter()
                .map(|l| clone_all(&l.socks))
                .collect::<io::Result<Vec<_>>>()?;
            let bound: Vec<String> = next.iter().map(|l| l.bound.to_string()).collect();
            self.http
                .set_tls_addrs(next.iter().filter(|l| l.tls).map(|l| l.bound).collect());
            self.http.hand_over(groups, self.workers);
            *self.listening.lock().unwrap_or_else(|p| p.into_inner()) = next;
            report
                .applied
                .push(format!("http.listen: now {}", bound.join(", ")));
        }
        if let (Some(t), Some(set)) = (&self.http.tls, tls_staged) {
            let warnings = set.warnings.len();
            t.commit(&cfg.tls, set);
            report.applied.push(format!(
                "tls: certificates read again ({}){}",
                tls::describe(t),
                if warnings > 0 {
                    format!(", {warnings} warning(s) logged")
                } else {
                    String::new()
                }
            ));
        }
        self.http.set_site(site);
        if new_root != old_root {
            report
                .applied
                .push(format!("root: now {}", new_root.display()));
            if cfg.control.read_roots.is_empty() {
                report.not_applied.push(
                    "control.read_roots (empty: the served root at start; control streams keep reading beneath the old root until a restart)"
                        .into(),
                );
            }
            *self.root.lock().unwrap_or_else(|p| p.into_inner()) = new_root;
        } else if root.is_none() && cfg.http.root != old.http.root {
            report
                .not_applied
                .push("http.root (the command line's root wins)".into());
        }
        let changed = config::changed_keys(&old, cfg);
        for key in ["http.index", "http.types"] {
            if changed.iter().any(|k| k.starts_with(key)) {
                report.applied.push(key.into());
            }
        }
        let live = cfg.live();
        if live != old.live() {
            report.applied.push("limits and locations".into());
        }
        self.http.set_live(live);
        self.viewers.commit(viewers_staged);
        if cfg.auth.credentials_max != old.auth.credentials_max {
            // The ledger of capped tokens' sessions is sized at start.
            report
                .not_applied
                .push("auth.credentials_max (at a restart)".into());
        }
        if cfg.auth.deny_file.is_some() {
            report.applied.push(format!(
                "auth: deny list read again ({} ids)",
                self.viewers.denied_count()
            ));
        }
        if !cfg.auth.keys.is_empty() || !old.auth.keys.is_empty() {
            report.applied.push(format!(
                "auth: keys read again ({})",
                self.viewers.key_ids().join(", ")
            ));
        }
        for key in changed {
            if !config::reloadable(&key) {
                report.not_applied.push(key);
            }
        }
        *self.running.lock().unwrap_or_else(|p| p.into_inner()) = cfg.clone();
        Ok(report)
    }

    /// The engine's disk scheduler settings in force (after the configuration, reloads and
    /// `TUNE disk`).
    pub fn disk_settings(&self) -> penstock_driver::DiskSettings {
        self.engine.disk_settings()
    }

    /// Stops accepting; lets responses and streams finish until `deadline`, then cuts them.
    pub fn shutdown(self, deadline: Duration) -> ShutdownReport {
        let start = Instant::now();
        // Leave the cluster first: HAProxy and the other nodes stop sending work here now,
        // not a lease TTL later, while what is under way drains.
        if let Some(m) = &self.membership {
            m.lock().unwrap_or_else(|p| p.into_inner()).stop();
        }
        // The scrub stops at its next chunk (its repairs are whole units, synced).
        let mut scrub = self.scrub;
        if let Some(s) = &mut scrub {
            s.stop();
        }
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
        drop(self.api);
        if let Some(r) = &self.rtsp {
            r.lock().unwrap_or_else(|p| p.into_inner()).stop();
        }
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

/// Starts the membership thread of `[cluster]`: the node's name (default: the host name) and
/// the addresses it publishes (default: the bound ones, on the advertised host).
fn start_membership(
    cfg: &ServerConfig,
    // The first plain and the first `https://` HTTP listeners.
    (http_bound, https_bound): (Option<SocketAddr>, Option<SocketAddr>),
    rtsp_bound: Option<SocketAddr>,
    control_bound: Option<SocketAddr>,
    engine: Arc<Engine>,
    origin: Option<Arc<origin::Origin>>,
    metrics: &Metrics,
) -> Result<cluster::Membership, ServerError> {
    let c = &cfg.cluster;
    let invalid = |m: String| ServerError::Config(ConfigError::Invalid(m));
    let node = if c.node.is_empty() {
        rustix::system::uname()
            .nodename()
            .to_string_lossy()
            .into_owned()
    } else {
        c.node.clone()
    };
    penstock_core::cluster::NodeName::new(&node)
        .map_err(|e| invalid(format!("cluster.node (default: the host name): {e}")))?;
    let http = match (c.advertise_addr(), http_bound) {
        (Some(a), _) => a,
        (None, Some(b)) if !b.ip().is_unspecified() => b.to_string(),
        _ => {
            return Err(invalid(
                "cluster.advertise: needed when the HTTP address is a wildcard (or socket-activated): the address other nodes and HAProxy reach this node at".into(),
            ));
        }
    };
    // The advertised host, for the other protocols' default addresses.
    let host = http
        .rsplit_once(':')
        .map_or_else(|| http.clone(), |(h, _)| h.to_string());
    let with_port = |explicit: &str, bound: Option<SocketAddr>| {
        if !explicit.is_empty() {
            Some(explicit.to_string())
        } else {
            bound.map(|b| format!("{host}:{}", b.port()))
        }
    };
    let addrs = cluster::Addresses {
        https: https_bound.map(|b| format!("{host}:{}", b.port())),
        http,
        rtsp: with_port(&c.rtsp_advertise, rtsp_bound),
        control: with_port(&c.control_advertise, control_bound),
    };
    let cm = metrics.register_cluster(&node);
    let load = Box::new(move || {
        let (used, cap) = engine.admission_usage();
        cluster::NodeLoad {
            rt_bytes_per_s: cap.net_bytes_per_s,
            rt_bytes_per_s_left: cap.net_bytes_per_s.saturating_sub(used.net_bytes_per_s),
            streams: used.streams,
            streams_max: cap.streams,
            // The origin cache's bytes on disk (its own gauge), when there is an origin.
            cache_bytes: origin
                .as_ref()
                .map(|o| o.metrics.cache_bytes.get().max(0) as u64),
        }
    });
    cluster::Membership::start(c, node, addrs, load, cm)
        .map_err(|e| invalid(format!("cluster.etcd: {e}")))
}

fn clone_all(v: &[TcpListener]) -> io::Result<Vec<TcpListener>> {
    v.iter().map(TcpListener::try_clone).collect()
}

/// Descriptors the server may hold at once at its limits: an HTTP connection holds its
/// socket, the file of its body and, while the engine sends it, a dup of the socket; a
/// control connection its socket, a Unix one also up to `unix_fds_held_max` passed
/// descriptors waiting for their `OPEN fd fd`; plus a margin for listeners, the engine's
/// rings and files.
fn descriptors_wanted(cfg: &ServerConfig) -> u64 {
    let http = cfg.limits.connections_max as u64;
    let control = (cfg.control.tcp_connections_max + cfg.control.unix_connections_max) as u64;
    let passed = (cfg.control.unix_connections_max as u64)
        .saturating_mul(cfg.control.unix_fds_held_max as u64);
    http.saturating_mul(3)
        .saturating_add(control.saturating_mul(3))
        .saturating_add(passed)
        .saturating_add(256)
}

/// Raises the soft RLIMIT_NOFILE to the hard limit (`penstock_driver::rlimit`, which logs
/// it at info) and says what it is now, for the start line. The default soft limit (often
/// 1024) would make `accept` fail with EMFILE long before `connections_max`. Below what the
/// connection limits may need, a warning names the keys to lower ([`nofile_advice`]).
fn raise_nofile(cfg: &ServerConfig) -> String {
    let now = penstock_driver::rlimit::raise_nofile().soft;
    match nofile_advice(cfg, now) {
        None => format!("descriptors {now}"),
        // Really wrong: not even one descriptor per allowed HTTP connection; a warning.
        // Else (a limit that fits thousands of connections but not the defaults' worst
        // case, the usual first start) one line at info.
        Some(advice) if now < cfg.limits.connections_max as u64 => {
            tracing::warn!(descriptors = now, "{advice}");
            format!("descriptors {now}, too few: see the warning")
        }
        Some(advice) => {
            tracing::info!(descriptors = now, "{advice}");
            format!("descriptors {now} (see the log)")
        }
    }
}

/// What to change when `nofile` descriptors are fewer than the connection limits of `cfg`
/// may need ([`descriptors_wanted`]); `None` when they suffice.
fn nofile_advice(cfg: &ServerConfig, nofile: u64) -> Option<String> {
    let wanted = descriptors_wanted(cfg);
    if nofile >= wanted {
        return None;
    }
    let http = cfg.limits.connections_max as u64;
    // What `[limits] connections_max` may be for everything to fit.
    let fits = nofile.saturating_sub(wanted.saturating_sub(http.saturating_mul(3))) / 3;
    let lower = if fits > 0 {
        format!("lower `[limits] connections_max` to {fits}")
    } else {
        "lower `[limits] connections_max` and `[control] tcp_connections_max` / \
         `unix_connections_max`"
            .to_string()
    };
    // One short line (issue 40: the first start's warnings were 300 characters); the
    // arithmetic is in docs/http.md.
    Some(format!(
        "RLIMIT_NOFILE {nofile} < the {wanted} descriptors the limits may need: {lower} or \
         raise LimitNOFILE="
    ))
}

/// The workers' CPU policies in one phrase for the start line: "workers: 2 general (other),
/// 1 timed (deadline)", with why a timed worker got less than the strongest policy.
fn sched_line(info: &penstock_driver::EngineInfo) -> String {
    let general = info.workers.iter().filter(|w| !w.timed).count();
    let timed: Vec<_> = info.workers.iter().filter(|w| w.timed).collect();
    let mut line = format!("workers: {general} general (other)");
    if timed.is_empty() {
        line.push_str(", no timed workers");
        if !info.sched_notes.is_empty() {
            line.push_str(&format!(" ({})", info.sched_notes.join("; ")));
        }
        return line;
    }
    let policies: Vec<&str> = timed.iter().map(|w| w.policy.name()).collect();
    line.push_str(&format!(
        ", {} timed ({})",
        timed.len(),
        policies.join(", ")
    ));
    let notes: Vec<String> = info
        .sched_notes
        .iter()
        .cloned()
        .chain(timed.iter().flat_map(|w| w.notes.iter().cloned()))
        .collect();
    if !notes.is_empty() {
        line.push_str(&format!(" [{}]", notes.join("; ")));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_few_descriptors_name_the_key_to_lower_and_how_far() {
        let mut cfg = ServerConfig::default();
        cfg.limits.connections_max = 1000;
        cfg.control.tcp_connections_max = 10;
        cfg.control.unix_connections_max = 10;
        cfg.control.unix_fds_held_max = 4;
        // 3 × 1000 + 3 × 20 + 4 × 10 (passed descriptors) + 256 = 3356 wanted.
        assert_eq!(descriptors_wanted(&cfg), 3356);
        assert_eq!(nofile_advice(&cfg, 3356), None);
        let advice = nofile_advice(&cfg, 1024).expect("1024 < 3356");
        // (1024 - 356) / 3 = 222 connections fit.
        assert!(
            advice.contains("lower `[limits] connections_max` to 222"),
            "{advice}"
        );
        assert!(advice.contains("RLIMIT_NOFILE 1024"), "{advice}");
        // Not even the control connections fit: both keys are named.
        let advice = nofile_advice(&cfg, 200).expect("200 < 3356");
        assert!(
            advice.contains("`[limits] connections_max` and `[control] tcp_connections_max`"),
            "{advice}"
        );
    }
}
