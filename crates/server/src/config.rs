//! Everything `penstock serve` can be told, with defaults: `penstock.toml` deserializes into
//! [`ServerConfig`]; every field is optional in the file. Sizes are bytes, times are
//! milliseconds, rates are bytes per second (units last in every name); each also takes a
//! string in the command line's units, `"64KiB"`, `"30s"`, `"8Mbps"` ([`units`]).
//!
//! What SIGHUP may change live is [`HttpLimits`], the `[[location]]` table (classes and
//! rates per path prefix) — see [`ServerConfig::live`] — and the disk scheduler's `[disk]`
//! quanta and in-flight bound ([`DiskSection::tuning`]). Addresses, the root, worker counts,
//! the token and the engine's sizes are fixed at start.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::listen::ListenAddrs;

pub mod cluster;
pub mod origin;
pub mod rtsp;
pub mod units;

pub use origin::OriginConfig;
pub use rtsp::RtspConfig;

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// The whole configuration file.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    pub http: HttpConfig,
    pub control: ControlConfig,
    pub engine: EngineSection,
    /// `[buffers]`: how far the engine's buffer pools may grow, and when they shrink back.
    pub buffers: BuffersSection,
    /// `[disk]`: the engine's disk request scheduler (reloadable).
    pub disk: DiskSection,
    pub admission: AdmissionSection,
    /// `[limits]`: per-connection HTTP limits (reloadable).
    pub limits: HttpLimits,
    /// `[[location]]`: class, rate and CORS per path prefix, longest prefix wins.
    pub location: Vec<Location>,
    /// `[auth]`: the keys of signed URLs (docs/security.md "Viewers"; reloaded on SIGHUP).
    pub auth: AuthConfig,
    /// `[tenants.NAME] rt_share = 0.3`: tenants' parts of the rt capacity (docs/security.md
    /// "Tenants"); fixed at start.
    pub tenants: std::collections::BTreeMap<String, TenantConfig>,
    /// `[log]`: the access log.
    pub log: LogConfig,
    /// `[rtsp]`: the RTSP server (on by default at 127.0.0.1:8554).
    pub rtsp: RtspConfig,
    /// `[live.NAME]`: live sources (docs/rtsp.md "Live relay"), played at
    /// `rtsp://HOST:PORT/live/NAME` (and `/NAME`) and `/live/NAME/index.m3u8`, recorded if
    /// `record` says so. The old form `[rtsp.live.NAME]` is read into the same struct, with a
    /// warning ([`ServerConfig::live_sources`] joins the two).
    pub live: std::collections::BTreeMap<String, rtsp::LiveConfig>,
    /// `[cluster]`: membership in etcd, redirects (off unless `etcd` is set; docs/cluster.md).
    pub cluster: cluster::ClusterConfig,
    /// `[origin]`: paths missing beneath the root read from an HTTP or S3 origin through a
    /// local block cache (docs/origin.md). Off by default.
    pub origin: OriginConfig,
    /// `[volumes]`: `NAME = "/path/of/a/member"`; partition PART of volume NAME is served at
    /// `/vol/NAME/PART` over HTTP (reloadable with the root) and RTSP (fixed at start); and
    /// the limits of volume updates.
    pub volumes: VolumesConfig,
    /// `[hls]`: HLS playlists of the TS files beneath the root (docs/hls.md).
    pub hls: HlsConfig,
    /// `[tls]`: certificates and keys for the `https://` listeners (docs/tls.md); the
    /// files are read again on SIGHUP.
    pub tls: crate::tls::TlsConfig,
    /// `[api]`: the operator's HTTP JSON API and dashboard (docs/api.md); off unless
    /// `listen` is set.
    pub api: ApiConfig,
    /// SIGTERM: streams still running after this long are cut.
    #[serde(default, deserialize_with = "units::opt_ms")]
    pub shutdown_deadline_ms: Option<u64>,
    /// The user `penstock serve` runs as (a name or a number). Started as root, it switches
    /// to this user after binding its listeners, opening the root and writing the token and
    /// control socket; started as this user already (systemd's `User=`), nothing changes;
    /// started as anyone else, it refuses to start. Unset: no switch (docs/service.md).
    pub user: Option<String>,
    /// The group to switch to with `user` (a name or a number; default: the user's primary
    /// group). Supplementary groups are cleared.
    pub group: Option<String>,
}

/// `[api]`: the operator's HTTP JSON API and dashboard on a listener of its own
/// (docs/api.md). Callers authenticate with the control token as a Bearer token.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct ApiConfig {
    /// `127.0.0.1:9997`, `http://127.0.0.1:9997` or `https://0.0.0.0:9997` (TLS with the
    /// `[tls]` certificates). Empty (the default): no API listener.
    pub listen: String,
    /// Connections served at once; more are answered 503 and closed.
    pub connections_max: usize,
    /// A request's head and body together, at most (larger: 413 / 431).
    #[serde(deserialize_with = "units::size")]
    pub request_bytes_max: usize,
    /// Server-sent event streams (`/api/v1/events`) open at once; more get 503.
    pub sse_max: usize,
    /// A connection silent this long between requests (or slower than this sending one)
    /// is closed; an event stream whose reader stops reading for this long too.
    #[serde(deserialize_with = "units::ms")]
    pub idle_timeout_ms: u64,
    /// How often the event stream's `overview` event is sent (and stream states compared).
    #[serde(deserialize_with = "units::ms")]
    pub overview_interval_ms: u64,
}

impl Default for ApiConfig {
    fn default() -> ApiConfig {
        ApiConfig {
            listen: String::new(),
            connections_max: 32,
            request_bytes_max: 64 * 1024,
            sse_max: 8,
            idle_timeout_ms: 30_000,
            overview_interval_ms: 1_000,
        }
    }
}

impl ApiConfig {
    /// Whether the listener is TLS, and its address (`None`: off).
    pub fn listen_addr(&self) -> Result<Option<(bool, SocketAddr)>, ConfigError> {
        if self.listen.is_empty() {
            return Ok(None);
        }
        let (tls, a) = if let Some(a) = self.listen.strip_prefix("https://") {
            (true, a)
        } else if let Some(a) = self.listen.strip_prefix("http://") {
            (false, a)
        } else {
            (false, self.listen.as_str())
        };
        let a = a.trim_end_matches('/');
        let addr = a.parse::<SocketAddr>().map_err(|e| {
            ConfigError::Invalid(format!(
                "api.listen {:?}: {e} (forms: 127.0.0.1:9997, https://0.0.0.0:9997)",
                self.listen
            ))
        })?;
        Ok(Some((tls, addr)))
    }

    fn check(&self) -> Result<(), ConfigError> {
        self.listen_addr()?;
        for (name, v) in [
            ("connections_max", self.connections_max as u64),
            ("request_bytes_max", self.request_bytes_max as u64),
            ("sse_max", self.sse_max as u64),
            ("idle_timeout_ms", self.idle_timeout_ms),
            ("overview_interval_ms", self.overview_interval_ms),
        ] {
            if v == 0 {
                return Err(ConfigError::Invalid(format!("api.{name} must be above 0")));
            }
        }
        if self.sse_max >= self.connections_max {
            return Err(ConfigError::Invalid(format!(
                "api.sse_max {} must be below api.connections_max {} (event streams hold connections)",
                self.sse_max, self.connections_max
            )));
        }
        if self.request_bytes_max < 1024 {
            return Err(ConfigError::Invalid(format!(
                "api.request_bytes_max {} is below 1024",
                self.request_bytes_max
            )));
        }
        Ok(())
    }
}

/// `[hls]`: `GET /PATH/index.m3u8` for each TS file PATH beneath the root (docs/hls.md).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct HlsConfig {
    /// Answer playlists (default true). Off: `index.m3u8` is an ordinary path.
    pub enabled: bool,
    /// A segment is cut at the first key frame at least this long after its start (default
    /// 6 s, what RFC 8216's authors and Apple's authoring rules suggest).
    #[serde(deserialize_with = "units::ms")]
    pub target_duration_ms: u64,
    /// Key-frame indexes and MP4 sample indexes kept in memory (one per file version;
    /// default 256 of each).
    pub index_cache_entries: usize,
    /// The bytes those indexes may hold, each cache (default 256 MiB; the oldest leave
    /// first; a long MP4's sample index is 24 B per sample). At least 1 MiB.
    #[serde(deserialize_with = "units::size")]
    pub index_cache_bytes_max: usize,
    /// Index builds running at once, each a thread reading one file through (default 2;
    /// requests for a file being indexed share its build). Beyond it, a new file's playlist
    /// is a `503` with `Retry-After: 1`.
    pub indexers_max: usize,
    /// `DIR/master.m3u8` lists at most this many TS files of DIR (default 16; the first by
    /// name, each indexed when the playlist is asked for; 0: none, every generated one is
    /// 404).
    pub renditions_max: usize,
    /// `Cache-Control: public, max-age=` of the playlists made here and of the TS and MP4
    /// files served (seconds; default 86400: VOD titles do not change, and their `ETag`
    /// changes when a file does; 0: `no-cache`, every use revalidates).
    pub cache_max_age_s: u64,
    /// Live playlists (`/live/NAME/index.m3u8`, docs/hls.md "Live and DVR"): the newest
    /// segments listed (default 0: the whole recording, `EXT-X-PLAYLIST-TYPE:EVENT`, a DVR
    /// window; N: a sliding window of N segments).
    pub live_window: usize,
    /// Segments a live recording's index keeps at most (default 100000, 4 MiB; beyond it the
    /// oldest leave the playlist and the EVENT type goes).
    pub live_segments_max: usize,
    /// How long a blocking playlist reload (`_HLS_msn`) waits for its segment before a 503
    /// (default 18 s: three 6-second target durations, RFC 8216bis §6.2.5.2). 1 ms..=60 s.
    #[serde(deserialize_with = "units::ms")]
    pub blocking_reload_timeout_ms: u64,
    /// Blocking reloads waiting at once, all live sources together (default 1024); one more
    /// is a 503 with `Retry-After: 1`.
    pub blocking_reload_waiters_max: usize,
    /// Viewer sessions (`[[location]] sessions = true`, docs/hls.md "Viewer sessions"): a
    /// session that fetched nothing for this long has ended and its admission reservation
    /// goes back. Default: four target durations (24 s at the default 6 s), longer than a
    /// player waits between segments while it plays.
    #[serde(
        deserialize_with = "units::opt_ms",
        skip_serializing_if = "Option::is_none"
    )]
    pub session_idle_ms: Option<u64>,
    /// Sessions open at once, in all (default 4096; beyond it a new viewer's playlist is a
    /// `503` with `Retry-After`).
    pub sessions_max: usize,
    /// Sessions open at once from one client address (default 64).
    pub sessions_per_address_max: usize,
}

impl HlsConfig {
    /// `session_idle_ms`, or four target durations.
    pub fn session_idle(&self) -> Duration {
        Duration::from_millis(
            self.session_idle_ms
                .unwrap_or(self.target_duration_ms.saturating_mul(4)),
        )
    }
}

impl Default for HlsConfig {
    fn default() -> Self {
        HlsConfig {
            enabled: true,
            target_duration_ms: 6000,
            index_cache_entries: 256,
            index_cache_bytes_max: 256 << 20,
            indexers_max: 2,
            renditions_max: 16,
            cache_max_age_s: 86_400,
            session_idle_ms: None,
            sessions_max: 4096,
            sessions_per_address_max: 64,
            live_window: 0,
            live_segments_max: 100_000,
            blocking_reload_timeout_ms: 18_000,
            blocking_reload_waiters_max: 1024,
        }
    }
}

/// `[volumes]`: the served volumes (every key but the reserved ones below names a volume by
/// the path of one of its members) and the limits of volume updates made by this server (a
/// recording into a partition over the control protocol). The reserved keys are not volume
/// names.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct VolumesConfig {
    /// How long a metadata update (growth, truncation) waits for another process's update
    /// to finish: `"30s"` (the default).
    #[serde(
        deserialize_with = "units::opt_ms",
        skip_serializing_if = "Option::is_none"
    )]
    pub lock_wait_ms: Option<u64>,
    /// The largest step a growing partition allocates ahead of its writes: `"256MiB"` (the
    /// default); rounded up to one block per member of the partition.
    #[serde(
        deserialize_with = "units::opt_size",
        skip_serializing_if = "Option::is_none"
    )]
    pub grow_step_bytes: Option<u64>,
    /// A directory of index tracks for RTSP: partition PART of volume NAME seeks by the
    /// tracks `DIR/NAME/PART.{time,packet,frame}` when they are there (what `penstock record
    /// … vol:NAME/PART --tracks DIR/NAME/PART` writes), else by PCR.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tracks: Option<PathBuf>,
    /// The background scrub's rate limit, every copy counted: `"50MB/s"` (the default); 0
    /// turns the background scrub off (see [`crate::scrub`]).
    #[serde(
        deserialize_with = "units::opt_rate",
        skip_serializing_if = "Option::is_none"
    )]
    pub scrub_rate_bytes_per_s: Option<u64>,
    /// The time between background scrub passes over the served volumes (from the server's
    /// start to the first, from the end of one to the start of the next): `"168h"` (a week,
    /// the default); 0 turns the background scrub off.
    #[serde(
        deserialize_with = "units::opt_ms",
        skip_serializing_if = "Option::is_none"
    )]
    pub scrub_interval_ms: Option<u64>,
    /// NAME → the path of one member of the volume.
    #[serde(flatten)]
    pub members: std::collections::BTreeMap<String, PathBuf>,
}

impl VolumesConfig {
    /// The update limits these settings ask (the driver's defaults where unset).
    pub fn limits(&self) -> Result<penstock_driver::volume::VolumeLimits, ConfigError> {
        let mut l = penstock_driver::volume::VolumeLimits::default();
        if let Some(ms) = self.lock_wait_ms {
            l.update_lock_wait = Duration::from_millis(ms);
        }
        if let Some(b) = self.grow_step_bytes {
            if b == 0 {
                return Err(ConfigError::Invalid(
                    "volumes.grow_step_bytes must be above 0".into(),
                ));
            }
            l.grow_step_bytes = b;
        }
        Ok(l)
    }

    /// The background scrub's rate and interval, `None` when it is off (a 0, or no volume).
    pub fn scrub(&self) -> Option<(u64, Duration)> {
        let rate = self
            .scrub_rate_bytes_per_s
            .unwrap_or(crate::scrub::RATE_BYTES_PER_S_DEFAULT);
        let interval = self
            .scrub_interval_ms
            .map_or(crate::scrub::INTERVAL_DEFAULT, Duration::from_millis);
        (rate > 0 && !interval.is_zero() && !self.members.is_empty()).then_some((rate, interval))
    }
}

/// `[http]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// One address or a list: `"127.0.0.1:8080"`, `"8080"` (every IPv4 address),
    /// `["localhost:8080", "[::1]:8443"]` (see [`crate::listen`]); port 0 lets the kernel
    /// choose (tests). SIGHUP re-binds a changed list (unless the sockets came from systemd).
    pub listen: ListenAddrs,
    /// The served directory (the command line's `--root` wins).
    pub root: Option<PathBuf>,
    /// Event-loop threads, each with its own SO_REUSEPORT listener. 0: one per CPU.
    pub workers: usize,
    /// Served for a directory request when present in it; otherwise 403 (no listings). A
    /// directory named without its final `/` is first redirected (301) to that form, as
    /// nginx does, so that the index's relative links resolve. `""`: no index.
    pub index: Option<String>,
    /// `Content-Type` by file extension (case-insensitive), ahead of the built-in table:
    /// `[http.types]` then `m3u8 = "application/x-mpegURL"`.
    pub types: std::collections::BTreeMap<String, String>,
    /// The `Server` header (empty: none).
    pub server_name: String,
    /// Where metrics are served on the HTTP port (`GET` only); empty to disable.
    pub metrics_path: String,
    /// The health check (`GET` or `HEAD`: `200 ok` while the server serves, also while etcd
    /// is unreachable; HAProxy's `option httpchk` asks it); empty to disable.
    pub health_path: String,
    /// A separate `host:port` serving only `GET /metrics` (a scraper's own port, e.g. one a
    /// firewall keeps private); empty: none.
    pub metrics_listen: String,
    /// A body of at least this many bytes without a rate limit goes to the engine (one
    /// extent, zero-copy path `body_path`); smaller ones, multipart bodies and rate-limited
    /// ones are sent with sendfile from the connection's own loop. 0: never the engine.
    #[serde(deserialize_with = "units::size")]
    pub engine_body_bytes_min: u64,
    /// The engine's data path for HTTP bodies: `sendfile`, `splice`, `uring`, `copy` or `auto`.
    pub body_path: String,
}

impl Default for HttpConfig {
    fn default() -> HttpConfig {
        HttpConfig {
            listen: "127.0.0.1:8080".into(),
            root: None,
            workers: 0,
            index: Some("index.html".into()),
            types: Default::default(),
            server_name: "penstock".into(),
            metrics_path: "/metrics".into(),
            health_path: "/healthz".into(),
            metrics_listen: String::new(),
            engine_body_bytes_min: 4 << 20,
            body_path: "sendfile".into(),
        }
    }
}

/// The per-connection limits; all reloadable with SIGHUP.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpLimits {
    /// The request head (request line + headers). Beyond: 431.
    #[serde(deserialize_with = "units::size")]
    pub header_bytes_max: usize,
    /// The request line. Beyond: 414.
    #[serde(deserialize_with = "units::size")]
    pub request_line_bytes_max: usize,
    pub headers_max: usize,
    /// Ranges in one `Range` header before the whole file is sent (200).
    pub ranges_max: usize,
    /// A connection waiting for (the rest of) a request head is cut after this long, however
    /// slowly it dribbles bytes (slowloris): the clock starts when the server starts waiting.
    #[serde(deserialize_with = "units::ms")]
    pub idle_timeout_ms: u64,
    /// A response that makes no progress for this long is cut.
    #[serde(deserialize_with = "units::ms")]
    pub send_timeout_ms: u64,
    /// Requests on one connection before the server answers `Connection: close`.
    pub requests_per_connection_max: u32,
    /// A connection the server closes after a response (`Connection: close`: the last of
    /// `requests_per_connection_max`, an error) is closed lingering, as nginx's
    /// `lingering_close`: its write side is shut down (the client reads every response,
    /// then EOF) and what the client still sends is read and dropped for at most this long
    /// — a close with unread input would send a reset that destroys responses in flight.
    #[serde(deserialize_with = "units::ms")]
    pub lingering_time_ms: u64,
    /// Bytes read and dropped at most while lingering; beyond, the connection is closed.
    #[serde(deserialize_with = "units::size")]
    pub lingering_bytes_max: u64,
    /// Open connections, all workers together; beyond, new ones get 503 and are closed.
    pub connections_max: usize,
    /// Default rate per connection (nginx `limit_rate`); 0: unlimited.
    #[serde(deserialize_with = "units::rate")]
    pub limit_rate_bytes_per_s: u64,
    /// Bytes of each response sent at full speed before the rate applies (nginx
    /// `limit_rate_after`).
    #[serde(deserialize_with = "units::size")]
    pub limit_rate_after_bytes: u64,
    /// When accept fails for want of a resource (EMFILE, ENFILE, ENOBUFS, ENOMEM), a worker
    /// stops accepting for this long instead of retrying at once (which spins: the
    /// listener stays readable). nginx waits 500 ms (`ngx_event_accept.c`).
    #[serde(deserialize_with = "units::ms")]
    pub accept_backoff_ms: u64,
    /// Pipes each HTTP worker keeps at most for bodies of several adjacent file ranges (a
    /// packaged MP4 segment: its samples' ranges, interleaved with the other track's in the
    /// file): the ranges are spliced into a pipe and the pipe into the socket, one socket
    /// call for many ranges instead of a sendfile each (docs/http.md "Bodies of many
    /// ranges"). A pipe is held by a response while the socket has not taken its bytes; with
    /// none free the body goes by sendfile. 0: always sendfile.
    pub splice_pipes_max: usize,
}

impl Default for HttpLimits {
    fn default() -> HttpLimits {
        HttpLimits {
            header_bytes_max: 8 * 1024,
            request_line_bytes_max: 8 * 1024,
            headers_max: 100,
            ranges_max: 16,
            idle_timeout_ms: 60_000,
            send_timeout_ms: 60_000,
            requests_per_connection_max: 10_000,
            lingering_time_ms: 5_000,
            lingering_bytes_max: 1 << 20,
            connections_max: 16_384,
            limit_rate_bytes_per_s: 0,
            limit_rate_after_bytes: 0,
            accept_backoff_ms: 500,
            splice_pipes_max: 64,
        }
    }
}

impl HttpLimits {
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms)
    }

    pub fn send_timeout(&self) -> Duration {
        Duration::from_millis(self.send_timeout_ms)
    }

    pub fn accept_backoff(&self) -> Duration {
        Duration::from_millis(self.accept_backoff_ms)
    }

    pub fn lingering_time(&self) -> Duration {
        Duration::from_millis(self.lingering_time_ms)
    }

    /// The core parser's limits.
    pub fn parse_limits(&self) -> penstock_core::http::Limits {
        penstock_core::http::Limits {
            request_line_bytes_max: self.request_line_bytes_max,
            header_bytes_max: self.header_bytes_max,
            headers_max: self.headers_max,
            ranges_max: self.ranges_max,
        }
    }

    fn check(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError::Invalid(m.to_string()));
        if self.header_bytes_max < 64 || self.header_bytes_max > (1 << 20) {
            return bad("http.header_bytes_max must be 64 ..= 1 MiB");
        }
        if self.headers_max == 0 || self.headers_max > 1024 {
            return bad("http.headers_max must be 1 ..= 1024");
        }
        if self.idle_timeout_ms == 0 || self.send_timeout_ms == 0 {
            return bad("http.idle_timeout_ms and http.send_timeout_ms must be above 0");
        }
        if self.requests_per_connection_max == 0 || self.connections_max == 0 {
            return bad(
                "http.requests_per_connection_max and http.connections_max must be above 0",
            );
        }
        if self.lingering_time_ms > 600_000 {
            return bad("limits.lingering_time_ms must be 0 ..= 600000 (0: close at once)");
        }
        // 0 would be the spin this exists to stop; beyond a minute a recovered server
        // would leave its backlog waiting for nothing.
        if self.accept_backoff_ms == 0 || self.accept_backoff_ms > 60_000 {
            return bad("limits.accept_backoff_ms must be 1 ..= 60000");
        }
        if self.splice_pipes_max > 65_536 {
            return bad("limits.splice_pipes_max must be 0 ..= 65536");
        }
        Ok(())
    }
}

/// `[log]`: the access log (`crate::access_log` has the format and the design). Fixed at
/// start; SIGUSR1 reopens the file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// `stdout`, `off`, or the path of a file (created if missing, appended to).
    pub access: String,
    /// A worker hands its lines to the writer thread in batches of about this size ...
    #[serde(deserialize_with = "units::size")]
    pub access_buffer_bytes: usize,
    /// ... or this long after the batch's first line, whichever comes first.
    #[serde(deserialize_with = "units::ms")]
    pub access_flush_ms: u64,
    /// Batches waiting for the writer at most; beyond, a worker drops its batch rather
    /// than wait (counted in `penstock_access_log_dropped_lines_total`). Memory bound:
    /// `access_queue_batches × access_buffer_bytes`.
    pub access_queue_batches: usize,
}

impl Default for LogConfig {
    fn default() -> LogConfig {
        LogConfig {
            access: "stdout".into(),
            access_buffer_bytes: 64 * 1024,
            access_flush_ms: 1000,
            access_queue_batches: 64,
        }
    }
}

impl LogConfig {
    pub fn access_target(&self) -> crate::access_log::AccessTarget {
        crate::access_log::AccessTarget::parse(&self.access)
    }

    pub fn access_limits(&self) -> crate::access_log::AccessLimits {
        crate::access_log::AccessLimits {
            buffer_bytes: self.access_buffer_bytes,
            flush: Duration::from_millis(self.access_flush_ms),
            queue_batches: self.access_queue_batches,
        }
    }

    fn check(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError::Invalid(m.to_string()));
        if self.access.is_empty() {
            return bad("log.access must be stdout, off or a file path");
        }
        if self.access_buffer_bytes < 512 || self.access_buffer_bytes > (16 << 20) {
            return bad("log.access_buffer_bytes must be 512 ..= 16 MiB");
        }
        if self.access_flush_ms == 0 || self.access_flush_ms > 60_000 {
            return bad("log.access_flush_ms must be 1 ..= 60000");
        }
        if self.access_queue_batches == 0 || self.access_queue_batches > 4096 {
            return bad("log.access_queue_batches must be 1 ..= 4096");
        }
        Ok(())
    }
}

/// `[[location]]`: what applies to request paths starting with `prefix`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Location {
    /// A path prefix such as `/video/`; the longest matching prefix wins.
    pub prefix: String,
    /// The QoS class of these requests (`rt`, `bulk` or another name): the label of their
    /// metrics, and the disk queue an engine-sent body's reads wait in (`rt` is the engine's
    /// rt queue, without admission: an HTTP body has no rate to guarantee; any other name is
    /// the bulk queue).
    #[serde(default)]
    pub class: Option<String>,
    /// Overrides `http.limit_rate_bytes_per_s` (0: unlimited).
    #[serde(default, deserialize_with = "units::opt_rate")]
    pub limit_rate_bytes_per_s: Option<u64>,
    #[serde(default, deserialize_with = "units::opt_size")]
    pub limit_rate_after_bytes: Option<u64>,
    /// CORS (docs/hls.md "Delivery"): the origins whose pages may read these responses from
    /// their scripts (`["https://player.example"]`), or `["*"]` for any; every response of
    /// the location says so, and `OPTIONS` is answered as a preflight. Empty (the default):
    /// no CORS headers, and `OPTIONS` is a 405.
    #[serde(default)]
    pub cors_allow_origins: Vec<String>,
    /// What a viewer must show (docs/security.md "Viewers"): `"none"` (the default) or
    /// `"signed"`; on HTTP, HLS and RTSP alike.
    #[serde(default)]
    pub auth: AuthMode,
    /// Serve hidden and backup files here: a path segment starting with `.` (`/.env`,
    /// `/.git/config`), or a name ending in `~`, `.swp` or `.swo`. Off by default: 404.
    #[serde(default)]
    pub serve_hidden: bool,
    /// Viewer sessions (docs/hls.md "Viewer sessions"): the playlists made here give each
    /// viewer a session id in the URIs they name (`?sid=ID`), admit it at its rendition's
    /// bandwidth through the engine's admission (a `503` with `Retry-After` when the machine
    /// cannot carry it), and its TS files are served only to open sessions. Off by default:
    /// a session id in segment URIs defeats shared caches.
    #[serde(default)]
    pub sessions: bool,
}

/// `[auth]`: who may watch (docs/security.md "Viewers").
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// `keys = [{ id = "k1", secret_file = "/etc/penstock/k1.key" }]`: the HMAC keys of signed
    /// URLs; every one is accepted, the first signs (`penstock sign`). A secret file holds at
    /// least 32 bytes (a trailing newline is not part of it) and must not be open to group or
    /// others. Read at start and on SIGHUP; a bad file refuses either.
    pub keys: Vec<AuthKeyFile>,
    /// How long the session tokens a playlist writes into its segment URIs stay valid at
    /// most (never past the credential's own expiry). Default 4 h.
    #[serde(default, deserialize_with = "units::opt_ms")]
    pub session_ttl_ms: Option<u64>,
    /// The JWKS (RFC 7517) whose keys verify viewers' JWTs (`auth = "jwt"`): RSA, P-256,
    /// P-384, Ed25519 public keys, or `oct` secrets (then the file must be closed to group
    /// and others). Read at start and on SIGHUP.
    pub jwks_file: Option<PathBuf>,
    /// Accepted `aud` values of JWTs (one must be named); empty: `aud` is not checked.
    pub jwt_audiences: Vec<String>,
    /// Accepted `iss` values; empty: `iss` is not checked.
    pub jwt_issuers: Vec<String>,
    /// The most credentials (JWTs with a `sessions` claim, counted by `jti`, else `sub`, else
    /// the token) holding sessions at once; a new one beyond is refused (429 / RTSP 453).
    /// Default 10000.
    pub credentials_max: Option<usize>,
    /// The deny list: one revoked JWT `jti` a line (`#` comments, blank lines ignored), read
    /// at start and on SIGHUP. A listed token is refused everywhere, its HTTP connections
    /// closed, its RTSP sessions ended, its HLS segments refused (docs/security.md).
    pub deny_file: Option<PathBuf>,
    /// RTSP Digest users (`auth = "digest"`): `user:realm:HA1` a line (htdigest's format; a
    /// 32-hex-digit HA1 is MD5's, 64 SHA-256's), closed to group and others, read again on
    /// SIGHUP.
    pub digest_users_file: Option<PathBuf>,
    /// The realm of the challenges (lines of other realms are ignored). Default "penstock".
    pub digest_realm: Option<String>,
    /// The algorithm the challenge offers: "MD5" (default: what ffmpeg and GStreamer
    /// answer) or "SHA-256"; responses of either are accepted.
    pub digest_algorithm: Option<String>,
    /// How long a nonce is good for; an older one is answered `stale=true`. Default 5 min.
    #[serde(default, deserialize_with = "units::opt_ms")]
    pub digest_nonce_ttl_ms: Option<u64>,
}

/// `[tenants.NAME]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// The part of every rt resource (disk time, network, buffers, CPU) held for the
    /// tenant's sessions: above 0, at most 1; all tenants' together at most 1 (the rest is
    /// for sessions of no tenant).
    pub rt_share: f64,
}

impl ServerConfig {
    /// The tenants' shares in parts per million, by name (the admission partitions).
    pub fn tenant_shares(&self) -> Vec<(String, u32)> {
        self.tenants
            .iter()
            .map(|(n, t)| (n.clone(), (t.rt_share * 1e6).round() as u32))
            .collect()
    }

    fn check_tenants(&self) -> Result<(), ConfigError> {
        if self.tenants.len() > penstock_core::admission::TENANTS_MAX {
            return Err(ConfigError::Invalid(format!(
                "at most {} [tenants.NAME]",
                penstock_core::admission::TENANTS_MAX
            )));
        }
        let mut total = 0.0;
        for (name, t) in &self.tenants {
            if !penstock_core::auth::valid_key_id(name) {
                return Err(ConfigError::Invalid(format!(
                    "tenants.{name}: a name of 1 ..= 64 letters, digits, '-', '_' or '.'"
                )));
            }
            if !(t.rt_share > 0.0 && t.rt_share <= 1.0) {
                return Err(ConfigError::Invalid(format!(
                    "tenants.{name}.rt_share {}: above 0, at most 1",
                    t.rt_share
                )));
            }
            total += t.rt_share;
        }
        if total > 1.0 + 1e-9 {
            return Err(ConfigError::Invalid(format!(
                "the tenants' rt_share add up to {total}, above 1"
            )));
        }
        for k in &self.auth.keys {
            if let Some(t) = &k.tenant
                && !self.tenants.contains_key(t)
            {
                return Err(ConfigError::Invalid(format!(
                    "auth.keys {:?}: tenant {t:?} is not set ([tenants.{t}] rt_share = …)",
                    k.id
                )));
            }
        }
        Ok(())
    }
}

/// One key of `[auth] keys`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AuthKeyFile {
    /// The key id URLs name it by (`kid=`): letters, digits, `-`, `_`, `.`; at most 64 bytes.
    pub id: String,
    pub secret_file: PathBuf,
    /// The tenant (`[tenants.NAME]`) the streams of the URLs it signs are admitted for, in
    /// its share of the rt capacity; none: the part of no tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

impl AuthConfig {
    pub fn session_ttl(&self) -> Duration {
        Duration::from_millis(self.session_ttl_ms.unwrap_or(4 * 3600 * 1000))
    }

    pub fn digest_realm(&self) -> String {
        self.digest_realm
            .clone()
            .unwrap_or_else(|| "penstock".to_string())
    }

    pub fn digest_nonce_ttl(&self) -> Duration {
        Duration::from_millis(self.digest_nonce_ttl_ms.unwrap_or(300_000))
    }

    pub fn credentials_max(&self) -> usize {
        self.credentials_max.unwrap_or(10_000)
    }

    fn check(&self) -> Result<(), ConfigError> {
        if self.keys.len() > penstock_core::auth::KEYS_MAX {
            return Err(ConfigError::Invalid(format!(
                "auth.keys: at most {} keys",
                penstock_core::auth::KEYS_MAX
            )));
        }
        for (i, k) in self.keys.iter().enumerate() {
            if !penstock_core::auth::valid_key_id(&k.id) {
                return Err(ConfigError::Invalid(format!(
                    "auth.keys: id {:?}: 1 ..= 64 letters, digits, '-', '_' or '.'",
                    k.id
                )));
            }
            if self.keys[..i].iter().any(|o| o.id == k.id) {
                return Err(ConfigError::Invalid(format!(
                    "auth.keys: id {:?} appears twice",
                    k.id
                )));
            }
        }
        if self.session_ttl_ms == Some(0) {
            return Err(ConfigError::Invalid(
                "auth.session_ttl_ms must be above 0".into(),
            ));
        }
        if let Some(a) = &self.digest_algorithm
            && a != "MD5"
            && a != "SHA-256"
        {
            return Err(ConfigError::Invalid(format!(
                "auth.digest_algorithm {a:?}: \"MD5\" or \"SHA-256\""
            )));
        }
        if self.digest_nonce_ttl_ms == Some(0) {
            return Err(ConfigError::Invalid(
                "auth.digest_nonce_ttl_ms must be above 0".into(),
            ));
        }
        if self.credentials_max == Some(0) {
            return Err(ConfigError::Invalid(
                "auth.credentials_max must be above 0".into(),
            ));
        }
        Ok(())
    }
}

/// What a location requires of a viewer (`[[location]] auth`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthMode {
    /// Anyone who can reach the server (the default).
    #[default]
    None,
    /// A signed URL (`?expires=&kid=&sig=`), or on HLS segments the session token a signed
    /// playlist wrote.
    Signed,
    /// A JWT (`Authorization: Bearer`, `?jwt=`, RTSP `Authorization`) verified against
    /// `[auth] jwks_file`; on HLS segments the session token a JWT's playlist wrote.
    Jwt,
    /// Either.
    SignedOrJwt,
    /// RTSP Digest (RFC 7616 / 2617) against `[auth] digest_users_file`; RTSP only (an
    /// HTTP request here is 403).
    Digest,
}

/// `[control]`: who may use the control protocol and what its streams may touch
/// (docs/security.md).
///
/// Identity comes from the Unix socket's `SO_PEERCRED` (a peer whose uid or primary gid is
/// allowed) or from `AUTH <token>`; a TCP address says nothing about who the peer is. A peer
/// with neither may send only `HELP`, `QUIT` and `AUTH`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ControlConfig {
    /// TCP `host:port`; empty: no TCP control.
    pub listen: String,
    /// A Unix socket path; `None`: no Unix control. Its directory must be writable by the
    /// server's user only.
    pub unix: Option<PathBuf>,
    /// The token `AUTH` checks. `None`: the server makes a random one at start and writes
    /// it to `token_file` (mode 0600, created anew, never through an existing file).
    pub token: Option<String>,
    /// Where a generated token is written (default: the Unix socket's path plus `.token`).
    /// Its directory must be writable by the server's user only.
    pub token_file: Option<PathBuf>,
    /// Removed: a loopback TCP address says nothing about who the peer is. Refused when set.
    pub local_peers: Vec<IpAddr>,
    /// Unix-socket peers (by `SO_PEERCRED` uid) that may act without the token. Empty: the
    /// server's own uid.
    pub unix_allow_uids: Vec<u32>,
    /// Unix-socket peers (by `SO_PEERCRED` primary gid) that may act without the token.
    pub unix_allow_gids: Vec<u32>,
    /// TCP control connections at once; beyond, a new one gets `503` and is closed.
    #[serde(alias = "connections_max")]
    pub tcp_connections_max: usize,
    /// TCP control connections at once from one client address; beyond, `503` and closed
    /// (in effect at most `tcp_connections_max`).
    pub tcp_connections_per_address_max: usize,
    /// Unix-socket control connections at once, counted apart from TCP so that TCP peers
    /// never lock the socket's users out.
    pub unix_connections_max: usize,
    /// Of `unix_connections_max`, the places only the server's own uid may take: other
    /// users (allowed or not) hold at most `unix_connections_max - unix_owner_reserved` (at
    /// least 1), so they never lock the server's owner out of its own socket.
    pub unix_owner_reserved: usize,
    /// Unix-socket connections at once of one uid other than the server's own (allowed or
    /// not); beyond, `503` and closed: one other user does not take every place the owner
    /// leaves to others (in effect at most `unix_connections_max - unix_owner_reserved`).
    pub unix_connections_per_uid_max: usize,
    /// Descriptors (SCM_RIGHTS, `OPEN fd fd`) one Unix-socket connection may hold at once,
    /// waiting for the command line they came with; more are closed and the line refused.
    /// 2 to 64.
    pub unix_fds_held_max: usize,
    /// One command line; beyond: 414 and the connection closes.
    #[serde(deserialize_with = "units::size")]
    pub line_bytes_max: usize,
    /// A command line must be complete this long after its first byte, however slowly it
    /// trickles; else `421` and the connection is closed.
    #[serde(deserialize_with = "units::ms")]
    pub request_timeout_ms: u64,
    /// A connection that has not authenticated is closed after this long.
    #[serde(deserialize_with = "units::ms")]
    pub auth_timeout_ms: u64,
    /// A connection with no stream of its own that sends nothing for this long is closed.
    #[serde(deserialize_with = "units::ms")]
    pub idle_timeout_ms: u64,
    /// Wrong tokens on one connection before it is closed (each one answered more slowly).
    pub auth_failures_max: u32,
    /// A stream opened but not started within this long is closed and its reservation
    /// returned; a finished stream is forgotten this long after it ended.
    #[serde(deserialize_with = "units::ms")]
    pub pending_timeout_ms: u64,
    /// Streams one connection may hold at once.
    pub streams_per_connection_max: usize,
    /// Streams one identity (the token, or one Unix uid) may hold at once.
    pub streams_per_identity_max: usize,
    /// A stream that moves no byte for this long (a receiver that stopped reading, a source
    /// that stopped sending) fails. 0: never.
    #[serde(deserialize_with = "units::ms")]
    pub send_timeout_ms: u64,
    /// A `tcp://` endpoint's connect gives up after this long.
    #[serde(deserialize_with = "units::ms")]
    pub connect_timeout_ms: u64,
    /// A `tcp-listen://` endpoint waits this long for its peer.
    #[serde(deserialize_with = "units::ms")]
    pub accept_timeout_ms: u64,
    /// `START id AT time`: a time at most this long past is taken (unit 0 is then already
    /// late); earlier ones are refused. Leaves room for clocks a little apart.
    #[serde(deserialize_with = "units::ms")]
    pub start_at_late_max_ms: u64,
    /// `START id AT time`: a time at most this far ahead is taken; later ones are refused.
    #[serde(deserialize_with = "units::ms")]
    pub start_at_ahead_max_ms: u64,
    /// Out of descriptors (EMFILE, ENFILE), the listeners pause this long.
    #[serde(deserialize_with = "units::ms")]
    pub accept_backoff_ms: u64,
    /// Directories control streams may read files from (openat2 `RESOLVE_BENEATH`). Empty:
    /// the served root.
    pub read_roots: Vec<PathBuf>,
    /// Directories control streams may write files into (recordings). Empty: none.
    pub write_roots: Vec<PathBuf>,
    /// Block or character devices control streams may name, by exact path. Empty: none.
    pub devices: Vec<PathBuf>,
    /// Volumes (`vol:NAME/PART`) control streams may name, by name or member path. Empty:
    /// none; `"*"`: every volume.
    pub volumes: Vec<String>,
    /// Unix socket paths (`unix:`, `unix-listen:`) control streams may name, exactly. Empty:
    /// none.
    pub unix_paths: Vec<PathBuf>,
    /// Addresses `tcp-listen://` and `udp-listen://` endpoints may bind, as `ADDR/BITS`
    /// prefixes. Empty: loopback only.
    pub listen_allow: Vec<IpPrefix>,
    /// Addresses `tcp://` and `udp://` endpoints may reach. Empty: any.
    pub connect_allow: Vec<IpPrefix>,
    /// `[control.limits]`: the operator's ceiling per control identity — `"token"` (a caller
    /// that sent `AUTH`), `"uid:N"`, `"gid:N"` (a Unix peer's `SO_PEERCRED` uid, else its
    /// primary gid) — the most aggressive pacing its `OPEN` (and `RATE`/`SCHEDULE`) may ask;
    /// above it the request is refused naming the ceiling. An identity with no entry has no
    /// ceiling.
    pub limits: std::collections::BTreeMap<String, ControlLimit>,
}

/// One `[control.limits]` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ControlLimit {
    /// The most aggressive (k, t), `"K,T"` (`"4,40ms"`): at most K units at once and at most
    /// K per T, whatever the pacing (rate, period, `schedule=`, `pause=`).
    pub schedule_max: Option<String>,
    /// The highest rate in bytes or bits per second (`"10MB/s"`, `"80Mbit/s"`).
    pub rate_max: Option<String>,
}

impl ControlLimit {
    /// The ceiling this entry sets, or why it cannot be read.
    pub fn ceiling(&self) -> Result<penstock_core::schedule::Ceiling, String> {
        let kt_max = self
            .schedule_max
            .as_deref()
            .map(|s| {
                penstock_core::schedule::parse_kt(s)
                    .map_err(|e| format!("schedule_max {s:?}: {e}"))
                    .and_then(|(k, t)| {
                        if k == 0 || t.is_zero() {
                            Err(format!("schedule_max {s:?}: K and T must be above 0"))
                        } else {
                            Ok((k, t))
                        }
                    })
            })
            .transpose()?;
        let bytes_per_s_max = self
            .rate_max
            .as_deref()
            .map(|s| match penstock_core::units::parse_rate(s) {
                Ok(penstock_core::units::Rate::BitsPerSecond(bits)) => Ok(bits / 8),
                Ok(_) => Err(format!(
                    "rate_max {s:?}: give bytes or bits per second (10MB/s, 80Mbit/s), not units"
                )),
                Err(e) => Err(format!("rate_max {s:?}: {e}")),
            })
            .transpose()?;
        Ok(penstock_core::schedule::Ceiling {
            kt_max,
            bytes_per_s_max,
        })
    }
}

impl Default for ControlConfig {
    fn default() -> ControlConfig {
        ControlConfig {
            listen: "127.0.0.1:7070".into(),
            unix: None,
            token: None,
            token_file: None,
            local_peers: Vec::new(),
            unix_allow_uids: Vec::new(),
            unix_allow_gids: Vec::new(),
            tcp_connections_max: 64,
            tcp_connections_per_address_max: 8,
            unix_connections_max: 64,
            unix_owner_reserved: 8,
            unix_connections_per_uid_max: 16,
            unix_fds_held_max: 4,
            line_bytes_max: 4096,
            request_timeout_ms: 10_000,
            auth_timeout_ms: 10_000,
            idle_timeout_ms: 300_000,
            auth_failures_max: 3,
            pending_timeout_ms: 60_000,
            streams_per_connection_max: 64,
            streams_per_identity_max: 512,
            send_timeout_ms: 60_000,
            connect_timeout_ms: 10_000,
            accept_timeout_ms: 60_000,
            start_at_late_max_ms: 1_000,
            start_at_ahead_max_ms: 3_600_000,
            accept_backoff_ms: 500,
            read_roots: Vec::new(),
            write_roots: Vec::new(),
            devices: Vec::new(),
            volumes: Vec::new(),
            unix_paths: Vec::new(),
            listen_allow: Vec::new(),
            connect_allow: Vec::new(),
            limits: std::collections::BTreeMap::new(),
        }
    }
}

impl ControlConfig {
    /// The ceiling of a caller known as the token (`token`) or a Unix peer (`uid`, `gid`):
    /// its `[control.limits]` entry's name and ceiling; a uid's entry before a gid's.
    pub fn ceiling_of(
        &self,
        token: bool,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> Option<(String, penstock_core::schedule::Ceiling)> {
        let keys = [
            token.then(|| "token".to_string()),
            uid.map(|u| format!("uid:{u}")),
            gid.map(|g| format!("gid:{g}")),
        ];
        keys.into_iter().flatten().find_map(|k| {
            let c = self.limits.get(&k)?.ceiling().ok()?;
            Some((k, c))
        })
    }

    /// Whether a Unix-socket peer with these credentials may act without the token.
    pub fn unix_peer_allowed(&self, uid: u32, gid: u32, own_uid: u32) -> bool {
        let uid_ok = if self.unix_allow_uids.is_empty() {
            uid == own_uid
        } else {
            self.unix_allow_uids.contains(&uid)
        };
        uid_ok || self.unix_allow_gids.contains(&gid)
    }

    /// `listen` as (TLS, address): `tls://ADDR` or `ADDR`.
    pub fn listen_addr(&self) -> Result<(bool, SocketAddr), ConfigError> {
        let (tls, a) = match self.listen.strip_prefix("tls://") {
            Some(a) => (true, a),
            None => (false, self.listen.as_str()),
        };
        let addr = a.parse::<SocketAddr>().map_err(|e| {
            ConfigError::Invalid(format!(
                "control.listen {:?}: {e} (forms: 127.0.0.1:7070, tls://0.0.0.0:7070)",
                self.listen
            ))
        })?;
        Ok((tls, addr))
    }

    /// Whether a listening endpoint may bind `ip`.
    pub fn may_listen_on(&self, ip: IpAddr) -> bool {
        if self.listen_allow.is_empty() {
            is_loopback(ip)
        } else {
            self.listen_allow.iter().any(|p| p.contains(ip))
        }
    }

    /// Whether a connecting or sending endpoint may reach `ip`.
    pub fn may_connect_to(&self, ip: IpAddr) -> bool {
        self.connect_allow.is_empty() || self.connect_allow.iter().any(|p| p.contains(ip))
    }

    fn check(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError::Invalid(m.to_string()));
        if !self.local_peers.is_empty() {
            return bad(
                "control.local_peers was removed: a loopback TCP address says nothing about who \
                 the peer is; use AUTH with the token, or the Unix socket (control.unix_allow_uids)",
            );
        }
        if self.line_bytes_max < 64 {
            return bad("control.line_bytes_max must be at least 64");
        }
        if self.tcp_connections_max == 0 || self.unix_connections_max == 0 {
            return bad(
                "control.tcp_connections_max and control.unix_connections_max must be above 0",
            );
        }
        if self.unix_connections_per_uid_max == 0 {
            return bad("control.unix_connections_per_uid_max must be above 0");
        }
        if self.tcp_connections_per_address_max == 0 {
            return bad("control.tcp_connections_per_address_max must be above 0");
        }
        for (key, l) in &self.limits {
            let ok = key == "token"
                || key
                    .strip_prefix("uid:")
                    .or_else(|| key.strip_prefix("gid:"))
                    .is_some_and(|n| n.parse::<u32>().is_ok());
            if !ok {
                return bad(&format!(
                    "control.limits.{key:?}: name an identity as \"token\", \"uid:N\" or \"gid:N\""
                ));
            }
            if let Err(e) = l.ceiling() {
                return bad(&format!("control.limits.{key:?}: {e}"));
            }
        }
        if !(2..=64).contains(&self.unix_fds_held_max) {
            return bad("control.unix_fds_held_max must be 2 to 64 (OPEN fd fd passes two)");
        }
        if self.streams_per_connection_max == 0 || self.streams_per_identity_max == 0 {
            return bad(
                "control.streams_per_connection_max and control.streams_per_identity_max must be above 0",
            );
        }
        if self.auth_timeout_ms == 0
            || self.request_timeout_ms == 0
            || self.idle_timeout_ms == 0
            || self.pending_timeout_ms == 0
            || self.connect_timeout_ms == 0
            || self.accept_timeout_ms == 0
            || self.accept_backoff_ms == 0
        {
            return bad(
                "control timeouts (request, auth, idle, pending, connect, accept, accept_backoff) must be above 0",
            );
        }
        if self.auth_failures_max == 0 {
            return bad("control.auth_failures_max must be at least 1");
        }
        if self.start_at_ahead_max_ms == 0 {
            return bad("control.start_at_ahead_max_ms must be above 0");
        }
        if matches!(&self.token, Some(t) if t.len() < 16 || t.chars().any(|c| c.is_whitespace() || c.is_control()))
        {
            return bad("control.token must be at least 16 characters without spaces");
        }
        for (what, dirs) in [
            ("read_roots", &self.read_roots),
            ("write_roots", &self.write_roots),
        ] {
            if let Some(d) = dirs.iter().find(|d| !d.is_absolute()) {
                return Err(ConfigError::Invalid(format!(
                    "control.{what}: {} is not an absolute path",
                    d.display()
                )));
            }
        }
        Ok(())
    }

    pub fn auth_timeout(&self) -> Duration {
        Duration::from_millis(self.auth_timeout_ms)
    }

    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms)
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }

    /// Unix-socket connections other uids than the server's own may hold at once.
    pub fn unix_others_max(&self) -> usize {
        self.unix_connections_max
            .saturating_sub(self.unix_owner_reserved)
            .max(1)
    }

    pub fn pending_timeout(&self) -> Duration {
        Duration::from_millis(self.pending_timeout_ms)
    }

    /// `None`: streams never time out.
    pub fn send_timeout(&self) -> Option<Duration> {
        (self.send_timeout_ms > 0).then(|| Duration::from_millis(self.send_timeout_ms))
    }

    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    pub fn accept_timeout(&self) -> Duration {
        Duration::from_millis(self.accept_timeout_ms)
    }

    pub fn start_at_late_max(&self) -> Duration {
        Duration::from_millis(self.start_at_late_max_ms)
    }

    pub fn start_at_ahead_max(&self) -> Duration {
        Duration::from_millis(self.start_at_ahead_max_ms)
    }

    pub fn accept_backoff(&self) -> Duration {
        Duration::from_millis(self.accept_backoff_ms)
    }
}

fn is_loopback(ip: IpAddr) -> bool {
    ip.is_loopback()
        || matches!(ip, IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()))
}

/// An address prefix, `ADDR/BITS` (or a bare address: all its bits), for the control
/// endpoints' allow lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(try_from = "String", into = "String")]
pub struct IpPrefix {
    addr: IpAddr,
    bits: u8,
}

impl IpPrefix {
    /// Whether `ip` is inside the prefix (an IPv4-mapped IPv6 address counts as its IPv4
    /// address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(p), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.bits)).unwrap_or(0);
                u32::from(p) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(p), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.bits))
                    .unwrap_or(0);
                u128::from(p) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl std::str::FromStr for IpPrefix {
    type Err = String;

    fn from_str(s: &str) -> Result<IpPrefix, String> {
        let (a, bits) = match s.split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (s, None),
        };
        let addr: IpAddr = a
            .parse()
            .map_err(|e| format!("{s:?}: not an address prefix (ADDR/BITS): {e}"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            None => max,
            Some(b) => b
                .parse::<u8>()
                .ok()
                .filter(|&b| b <= max)
                .ok_or_else(|| format!("{s:?}: prefix length must be 0..={max}"))?,
        };
        Ok(IpPrefix { addr, bits })
    }
}

impl From<IpPrefix> for String {
    fn from(p: IpPrefix) -> String {
        format!("{}/{}", p.addr, p.bits)
    }
}

impl TryFrom<String> for IpPrefix {
    type Error = String;

    fn try_from(s: String) -> Result<IpPrefix, String> {
        s.parse()
    }
}

/// `[engine] pool_buffers` unless set: each worker's pool starts empty and grows to its share
/// of `[buffers] pool_max_bytes` (docs/io-scheduler.md §5).
pub const SERVE_POOL_BUFFERS_DEFAULT: usize = 0;

/// `[buffers] pool_max_bytes` unless set, in buffers of `[engine] buffer_bytes`.
pub const POOL_MAX_BUFFERS_DEFAULT: u64 = 32;

/// `[engine]`: the stream engine's sizes (see `penstock_driver::EngineConfig`).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineSection {
    /// 0: one per CPU.
    pub workers: usize,
    pub pool_buffers: Option<usize>,
    #[serde(default, deserialize_with = "units::opt_size")]
    pub buffer_bytes: Option<usize>,
    pub streams_max: Option<usize>,
    /// Whether the `rt` class's disk reads ask the kernel for IOPRIO_CLASS_RT (when the
    /// process may: CAP_SYS_NICE or CAP_SYS_ADMIN). Default true. `penstock serve` turns it
    /// off when it switches to an unprivileged `user`: the capability goes with root, and
    /// the ring would refuse every such read.
    pub rt_ioprio: Option<bool>,
    /// The dispatch slack (`penstock_driver::EngineConfig::dispatch_slack`): a worker that
    /// wakes for a deadline sends every paced unit due within this much more, in one
    /// submission. Microseconds, or `"250us"`; at most 1 ms; 0 turns batching off. Default
    /// 500 µs (docs/pacing.md).
    #[serde(default, deserialize_with = "units::opt_us")]
    pub dispatch_slack_us: Option<u64>,
    /// The workers at SCHED_FIFO (priority 50) with the process's memory locked
    /// (`penstock_driver::EngineConfig::realtime`); where refused (no CAP_SYS_NICE nor
    /// RLIMIT_RTPRIO), said once and run at normal priority. Default false. On a machine
    /// shared with other work, what keeps admitted rt streams on time: admission's CPU test
    /// assumes the workers get the CPU (docs/io-scheduler.md §4b).
    pub realtime: Option<bool>,
    /// The CPU policy of the timed workers, which carry the paced and rt streams and the
    /// upcalls (never bulk): `"auto"` (default: SCHED_DEADLINE where the process may,
    /// else SCHED_FIFO, else none), `"deadline"`, `"fifo"`, `"other"` (no timed workers;
    /// every worker carries every class). What each worker got is logged at start and in
    /// `penstock_worker_sched` (docs/io-scheduler.md §4c).
    pub sched: Option<String>,
    /// Timed workers beside the general ones (0..=64; 0, the default: as many as the
    /// general workers).
    pub timed_workers: Option<usize>,
    /// SCHED_FIFO's priority for the timed workers (1..=99; default 50).
    pub rt_priority: Option<u8>,
    /// SCHED_DEADLINE's period for the timed workers, µs (100..=1,000,000; default 1,000).
    pub deadline_period_us: Option<u64>,
}

impl EngineSection {
    pub fn engine_config(&self) -> penstock_driver::EngineConfig {
        let mut c = penstock_driver::EngineConfig::default();
        if self.workers > 0 {
            c.workers = self.workers;
        }
        // The server's pools start empty and grow on demand ([buffers]): an idle server holds
        // no buffer memory.
        c.pool_buffers = self.pool_buffers.unwrap_or(SERVE_POOL_BUFFERS_DEFAULT);
        if let Some(n) = self.buffer_bytes {
            c.buffer_bytes = n;
        }
        if let Some(n) = self.streams_max {
            c.streams_max = n;
        }
        if let Some(on) = self.rt_ioprio {
            c.disk.rt_ioprio = on;
        }
        if let Some(us) = self.dispatch_slack_us {
            c.dispatch_slack = std::time::Duration::from_micros(us);
        }
        if let Some(on) = self.realtime {
            c.realtime = on;
        }
        // Checked at load (`ServerConfig::check`): an unknown name never gets here.
        c.sched = self
            .sched
            .as_deref()
            .map_or(penstock_core::sched::policy::SchedAsk::Auto, |s| {
                s.parse().unwrap_or_default()
            });
        if let Some(n) = self.timed_workers {
            c.timed_workers = n;
        }
        if let Some(p) = self.rt_priority {
            c.fifo_priority = p;
        }
        if let Some(us) = self.deadline_period_us {
            c.deadline.period_ns = us.saturating_mul(1000);
        }
        c
    }
}

/// `[buffers]`: the engine's buffer pools grow and shrink (docs/io-scheduler.md §5). Each
/// worker's pool starts with `[engine] pool_buffers` buffers (default 0) and grows, when a
/// stream finds no free buffer, up to `pool_max_bytes`; it shrinks back to its start size once
/// no buffer beyond it has been in use for `shrink_after_ms`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct BuffersSection {
    /// The most bytes each worker's pool may hold, timed workers' included (default: 32
    /// buffers of `[engine] buffer_bytes`, the size every pool had before pools grew). At
    /// most 16 GiB.
    #[serde(default, deserialize_with = "units::opt_size")]
    pub pool_max_bytes: Option<u64>,
    /// Idle time before a grown pool shrinks back (default 30 s; 10 ms ..= 1 h).
    #[serde(default, deserialize_with = "units::opt_ms")]
    pub shrink_after_ms: Option<u64>,
}

impl BuffersSection {
    fn check(&self) -> Result<(), ConfigError> {
        if self.pool_max_bytes.is_some_and(|b| b > 16 << 30) {
            return Err(ConfigError::Invalid(
                "buffers.pool_max_bytes must be at most 16 GiB".into(),
            ));
        }
        if self
            .shrink_after_ms
            .is_some_and(|ms| !(10..=3_600_000).contains(&ms))
        {
            return Err(ConfigError::Invalid(
                "buffers.shrink_after_ms must be 10 ms ..= 1 h".into(),
            ));
        }
        Ok(())
    }

    fn apply(&self, c: &mut penstock_driver::EngineConfig) {
        c.pool_max_bytes = Some(
            self.pool_max_bytes
                .unwrap_or(POOL_MAX_BUFFERS_DEFAULT * c.buffer_bytes as u64),
        );
        if let Some(ms) = self.shrink_after_ms {
            c.pool_shrink_after = Duration::from_millis(ms);
        }
    }
}

/// `[disk]`: the engine's disk request scheduler (docs/io-scheduler.md): the DRR quantum of
/// each class and the reads in flight per device. Unset keys take
/// `penstock_driver::disk::DiskConfig::default()`. Reloaded by SIGHUP, and changed until the
/// next reload or restart by the control command `TUNE disk`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiskSection {
    /// Bytes of cost the `rt` class may read per round; at least `engine.buffer_bytes` (one
    /// read).
    #[serde(default, deserialize_with = "units::opt_size")]
    pub rt_quantum_bytes: Option<u64>,
    /// Bytes of cost the `bulk` class may read per round; at least `engine.buffer_bytes`.
    #[serde(default, deserialize_with = "units::opt_size")]
    pub bulk_quantum_bytes: Option<u64>,
    /// Reads in flight per device at most (MARS's adapter slots): 1 ..= 4096.
    pub inflight_max: Option<u32>,
    /// MARS's adaptive quanta: the `rt` class's quantum in each round follows its backlog on
    /// the device, from `rt_quantum_bytes` up to `adaptive_quantum_factor` times it; `bulk`
    /// keeps its quantum, so it is never starved. Read at start (a reload does not change it).
    pub adaptive_quanta: bool,
    /// With `adaptive_quanta`: the ceiling as a multiple of the rt quantum, 2 ..= 64
    /// (default 4).
    pub adaptive_quantum_factor: Option<u32>,
    /// `[disk.classes.NAME]`: disk classes besides `rt` and `bulk`, each a DRR queue of its
    /// own served in arrival order with its `quantum_bytes`, not admitted (docs/io-scheduler.md,
    /// "Classes"). `[disk.classes.rt]` and `[disk.classes.bulk]` set the two built-in
    /// classes' quanta (as `rt_quantum_bytes` / `bulk_quantum_bytes`, not both). Read at
    /// start: a reload changes quanta, not the set of classes.
    pub classes: std::collections::BTreeMap<String, DiskClassSection>,
}

/// `[disk.classes.NAME]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiskClassSection {
    /// Bytes of cost the class may read per DRR round (its weight); at least
    /// `engine.buffer_bytes`. Required for a named class.
    #[serde(default, deserialize_with = "units::opt_size")]
    pub quantum_bytes: Option<u64>,
}

/// `[disk] adaptive_quantum_factor` when unset.
pub const ADAPTIVE_QUANTUM_FACTOR_DEFAULT: u32 = 4;

impl DiskSection {
    /// The whole settings this section asks for: its keys over the engine's defaults.
    pub fn settings(&self) -> penstock_driver::DiskSettings {
        let d = penstock_driver::disk::DiskConfig::default();
        let class_quantum = |name: &str| self.classes.get(name).and_then(|c| c.quantum_bytes);
        penstock_driver::DiskSettings {
            rt_quantum_bytes: self
                .rt_quantum_bytes
                .or(class_quantum("rt"))
                .unwrap_or(d.rt_quantum_bytes),
            bulk_quantum_bytes: self
                .bulk_quantum_bytes
                .or(class_quantum("bulk"))
                .unwrap_or(d.bulk_quantum_bytes),
            disk_inflight_max: self.inflight_max.unwrap_or(d.disk_inflight_max),
            named_quanta: self.named_classes(),
        }
    }

    /// The named classes and their quanta, in name order (a missing quantum is refused by
    /// `check`; here it reads as the bulk default).
    fn named_classes(&self) -> Vec<(String, u64)> {
        let d = penstock_driver::disk::DiskConfig::default();
        self.classes
            .iter()
            .filter(|(n, _)| *n != "rt" && *n != "bulk")
            .map(|(n, c)| (n.clone(), c.quantum_bytes.unwrap_or(d.bulk_quantum_bytes)))
            .collect()
    }

    /// The change a reload makes: every value, so that a key removed from the file goes back
    /// to its default (and a `TUNE` since the last reload is undone).
    pub fn tuning(&self) -> penstock_driver::DiskTuning {
        let s = self.settings();
        penstock_driver::DiskTuning {
            rt_quantum_bytes: Some(s.rt_quantum_bytes),
            bulk_quantum_bytes: Some(s.bulk_quantum_bytes),
            disk_inflight_max: Some(s.disk_inflight_max),
            named_quanta: s.named_quanta,
        }
    }

    /// Checks the values as the scheduler will, for reads of `buffer_bytes`.
    fn check(&self, buffer_bytes: u64) -> Result<(), ConfigError> {
        for (name, c) in &self.classes {
            match name.as_str() {
                "rt" if self.rt_quantum_bytes.is_some() && c.quantum_bytes.is_some() => {
                    return Err(ConfigError::Invalid(
                        "[disk] rt_quantum_bytes and [disk.classes.rt] quantum_bytes are both set: keep one".into(),
                    ));
                }
                "bulk" if self.bulk_quantum_bytes.is_some() && c.quantum_bytes.is_some() => {
                    return Err(ConfigError::Invalid(
                        "[disk] bulk_quantum_bytes and [disk.classes.bulk] quantum_bytes are both set: keep one".into(),
                    ));
                }
                "rt" | "bulk" => {}
                _ => {
                    penstock_core::stream::plan::ClassName::new(name)
                        .map_err(|e| ConfigError::Invalid(format!("[disk.classes.{name}]: {e}")))?;
                    if c.quantum_bytes.is_none() {
                        return Err(ConfigError::Invalid(format!(
                            "[disk.classes.{name}] needs quantum_bytes (the class's bytes per DRR round)"
                        )));
                    }
                }
            }
        }
        if let Some(f) = self.adaptive_quantum_factor {
            let max = penstock_driver::disk::ADAPTIVE_QUANTUM_FACTOR_MAX;
            if !(2..=max).contains(&f) {
                return Err(ConfigError::Invalid(format!(
                    "[disk] adaptive_quantum_factor must be 2..={max}, got {f}"
                )));
            }
            if !self.adaptive_quanta {
                return Err(ConfigError::Invalid(
                    "[disk] adaptive_quantum_factor is set but adaptive_quanta is not true".into(),
                ));
            }
        }
        self.settings()
            .tuned(&penstock_driver::DiskTuning::default(), buffer_bytes)
            .map(|_| ())
            .map_err(|e| ConfigError::Invalid(format!("[disk]: {e}")))
    }

    /// Applies the section to an engine configuration.
    fn apply(&self, disk: &mut penstock_driver::disk::DiskConfig) {
        let s = self.settings();
        disk.rt_quantum_bytes = s.rt_quantum_bytes;
        disk.bulk_quantum_bytes = s.bulk_quantum_bytes;
        disk.disk_inflight_max = s.disk_inflight_max;
        disk.named_classes = s.named_quanta;
        disk.adaptive_quantum_factor = self.adaptive_quanta.then(|| {
            self.adaptive_quantum_factor
                .unwrap_or(ADAPTIVE_QUANTUM_FACTOR_DEFAULT)
        });
    }
}

/// `[admission]`: the capacity admission control tests `OPEN … class=rt` against. Unset
/// fields take `penstock_core::admission::Capacity::CONSERVATIVE`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdmissionSection {
    #[serde(default, deserialize_with = "units::opt_rate")]
    pub disk_seq_bytes_per_s: Option<u64>,
    pub disk_random_iops: Option<u64>,
    #[serde(default, deserialize_with = "units::opt_rate")]
    pub net_bytes_per_s: Option<u64>,
    pub buffer_count: Option<u32>,
    #[serde(default, deserialize_with = "units::opt_size")]
    pub buffer_bytes: Option<u64>,
    pub bulk_share_percent: Option<u8>,
    pub streams_max: Option<u32>,
    pub rt_latency_ns: Option<u64>,
    /// Bytes each datagram costs on the wire beyond its payload (default 66: Ethernet,
    /// IPv4, UDP).
    #[serde(default, deserialize_with = "units::opt_size")]
    pub net_packet_overhead_bytes: Option<u64>,
    /// CPU time one send costs beside its bytes, in ns (default 17,368: with 2 ns a byte,
    /// 20 µs for a 1316-byte datagram; conservative; `penstock calibrate` measures it).
    pub cpu_send_ns: Option<u64>,
    /// CPU time each byte sent adds to a send, in picoseconds (default 2,000: a 1 MiB unit
    /// costs 2.1 ms; `penstock bench admission` measures it).
    pub cpu_send_byte_ps: Option<u64>,
    /// The same when every stream's unit falls due at once (the CPU burst test; default:
    /// `cpu_send_byte_ps`; self-calibrated with it, or measured by `penstock calibrate`).
    pub cpu_burst_byte_ps: Option<u64>,
    /// How late a unit may go out when one unit of every rt stream falls due at the same
    /// instant: the burst test (docs/io-scheduler.md §4b) keeps the network's and the CPU's
    /// backlog at that instant within it (default 50 ms; above zero).
    #[serde(default, deserialize_with = "units::opt_ms")]
    pub lateness_tolerance_ms: Option<u64>,
    /// CPU time per second the streams' sends may take, all workers (default: the workers ×
    /// 1 s).
    pub cpu_ns_per_s: Option<u64>,
    /// Measure the device behind the root at start, and each device an rt stream reads
    /// from on its first admission (under 5 s each, cached per device), unless disk figures
    /// are configured here (default true); the measurement also gives the uring path's read
    /// depth on each device a stream reads from.
    pub self_calibrate: Option<bool>,
    /// Where self-calibrations are cached (default: $XDG_CACHE_HOME/penstock, else
    /// ~/.cache/penstock).
    pub calibration_cache_dir: Option<std::path::PathBuf>,
}

impl AdmissionSection {
    /// The engine's self-calibration as configured.
    pub fn self_calibration(&self) -> penstock_driver::calibration::SelfCalibration {
        penstock_driver::calibration::SelfCalibration {
            enabled: self.self_calibrate.unwrap_or(true),
            cache_dir: self
                .calibration_cache_dir
                .clone()
                .or_else(penstock_driver::calibration::default_cache_dir),
            ..Default::default()
        }
    }

    pub fn admission_config(&self) -> penstock_core::admission::AdmissionConfig {
        let mut cap = penstock_core::admission::Capacity::CONSERVATIVE;
        if let Some(v) = self.disk_seq_bytes_per_s {
            cap.disk_seq_bytes_per_s = v;
            cap.disk_source = penstock_core::admission::FigureSource::Configured;
        }
        if let Some(v) = self.disk_random_iops {
            cap.disk_random_iops = v;
            cap.disk_source = penstock_core::admission::FigureSource::Configured;
        }
        if let Some(v) = self.net_packet_overhead_bytes {
            cap.net_packet_overhead_bytes = v;
        }
        if let Some(v) = self.cpu_send_ns {
            cap.cpu_send_ns = v;
        }
        if let Some(v) = self.cpu_send_byte_ps {
            cap.cpu_send_byte_ps = v;
            cap.cpu_burst_byte_ps = v;
        }
        if let Some(v) = self.cpu_burst_byte_ps {
            cap.cpu_burst_byte_ps = v;
        }
        if let Some(v) = self.cpu_ns_per_s {
            cap.cpu_ns_per_s = v;
        }
        if let Some(v) = self.net_bytes_per_s {
            cap.net_bytes_per_s = v;
        }
        if let Some(v) = self.buffer_count {
            cap.buffer_count = v;
        }
        if let Some(v) = self.buffer_bytes {
            cap.buffer_bytes = v;
        }
        penstock_core::admission::AdmissionConfig {
            capacity: cap,
            bulk_share_percent: self.bulk_share_percent.unwrap_or(20),
            streams_max: self.streams_max.unwrap_or(1024),
            rt_latency_ns: self.rt_latency_ns.unwrap_or(0),
            lateness_tolerance_ns: self.lateness_tolerance_ms.map_or(
                penstock_core::admission::LATENESS_TOLERANCE_NS_DEFAULT,
                |ms| ms.saturating_mul(1_000_000),
            ),
        }
    }
}

/// The most origins one location's `cors_allow_origins` lists.
pub const CORS_ORIGINS_MAX: usize = 64;

/// A location's `cors_allow_origins`: `["*"]`, or origins as browsers send them in `Origin`
/// (RFC 6454: `http://host` or `https://host:port`, no path, visible ASCII), at most
/// [`CORS_ORIGINS_MAX`].
fn check_cors_origins(prefix: &str, origins: &[String]) -> Result<(), ConfigError> {
    let bad = |why: String| {
        Err(ConfigError::Invalid(format!(
            "location {prefix:?}: cors_allow_origins: {why}"
        )))
    };
    if origins.len() > CORS_ORIGINS_MAX {
        return bad(format!("more than {CORS_ORIGINS_MAX} origins"));
    }
    if origins.iter().any(|o| o == "*") {
        if origins.len() > 1 {
            return bad("\"*\" allows every origin: list it alone".into());
        }
        return Ok(());
    }
    for o in origins {
        let host = o
            .strip_prefix("https://")
            .or_else(|| o.strip_prefix("http://"));
        let ok = host.is_some_and(|h| {
            !h.is_empty()
                && h.bytes()
                    .all(|b| b.is_ascii_graphic() && b != b'/' && b != b',')
        });
        if !ok {
            return bad(format!(
                "{o:?} is not an origin (scheme://host[:port], http or https, no path), nor \"*\""
            ));
        }
    }
    Ok(())
}

/// What SIGHUP reloads: the limits and the locations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveConfig {
    pub limits: HttpLimits,
    /// Sorted longest prefix first.
    pub locations: Vec<Location>,
}

/// The policy for one request path, resolved from [`LiveConfig`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathPolicy<'a> {
    pub class: &'a str,
    pub limit_rate_bytes_per_s: u64,
    pub limit_rate_after_bytes: u64,
    /// The location's `cors_allow_origins` (empty: no CORS).
    pub cors_allow_origins: &'a [String],
    /// What a viewer must show.
    pub auth: AuthMode,
    /// Whether hidden and backup files are served.
    pub serve_hidden: bool,
    /// Whether HLS viewers are sessions here.
    pub sessions: bool,
}

impl LiveConfig {
    /// The class and rate for `path`: the longest matching `[[location]]`, then the defaults.
    pub fn policy(&self, path: &str) -> PathPolicy<'_> {
        let loc = self.locations.iter().find(|l| path.starts_with(&l.prefix));
        PathPolicy {
            class: loc.and_then(|l| l.class.as_deref()).unwrap_or("bulk"),
            limit_rate_bytes_per_s: loc
                .and_then(|l| l.limit_rate_bytes_per_s)
                .unwrap_or(self.limits.limit_rate_bytes_per_s),
            limit_rate_after_bytes: loc
                .and_then(|l| l.limit_rate_after_bytes)
                .unwrap_or(self.limits.limit_rate_after_bytes),
            cors_allow_origins: loc.map_or(&[], |l| l.cors_allow_origins.as_slice()),
            auth: loc.map_or(AuthMode::None, |l| l.auth),
            serve_hidden: loc.is_some_and(|l| l.serve_hidden),
            sessions: loc.is_some_and(|l| l.sessions),
        }
    }
}

impl ServerConfig {
    /// Reads and checks a TOML file.
    pub fn load(path: &Path) -> Result<ServerConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let cfg: ServerConfig = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        cfg.check()?;
        if let Some(w) = cfg.old_live_form_warning() {
            tracing::warn!("{}: {w}", path.display());
        }
        Ok(cfg)
    }

    /// The warning the old form `[rtsp.live.NAME]` gets, naming the new one.
    pub fn old_live_form_warning(&self) -> Option<String> {
        let names: Vec<&str> = self.rtsp.live.keys().map(String::as_str).collect();
        (!names.is_empty()).then(|| {
            format!(
                "[rtsp.live.{0}] is the old form of a live source: write [live.{0}] (the same keys; record = {{ dir = \"…\", segment = \"10m\", keep = \"7d\", max_bytes = \"500GiB\" }} for segments); {1} source(s) in the old form",
                names[0],
                names.len()
            )
        })
    }

    /// Every live source, of both forms (a name in both is refused by [`ServerConfig::check`]).
    pub fn live_sources(&self) -> std::collections::BTreeMap<String, rtsp::LiveConfig> {
        let mut all = self.rtsp.live.clone();
        all.extend(self.live.iter().map(|(k, v)| (k.clone(), v.clone())));
        all
    }

    /// `[rtsp]` with every live source: what the RTSP server runs.
    pub fn rtsp_with_live(&self) -> RtspConfig {
        RtspConfig {
            live: self.live_sources(),
            ..self.rtsp.clone()
        }
    }

    /// Checks what can be checked without opening anything.
    pub fn check(&self) -> Result<(), ConfigError> {
        self.limits.check()?;
        self.buffers.check()?;
        self.http
            .listen
            .check()
            .map_err(|e| ConfigError::Invalid(format!("http.listen: {e}")))?;
        self.http
            .listen
            .check_family(false)
            .map_err(|e| ConfigError::Invalid(format!("http.listen: {e}")))?;
        self.tls.check().map_err(ConfigError::Invalid)?;
        if self.http.listen.has_tls() && self.tls.certificates.is_empty() {
            return Err(ConfigError::Invalid(
                "http.listen has https:// addresses but [tls] names no certificate ([[tls.certificates]] cert = \"chain.pem\", key = \"key.pem\")".into(),
            ));
        }
        if !self.rtsp.is_off() && self.rtsp.listen.has_tls() && self.tls.certificates.is_empty() {
            return Err(ConfigError::Invalid(
                "rtsp.listen has rtsps:// addresses but [tls] names no certificate ([[tls.certificates]] cert = \"chain.pem\", key = \"key.pem\")".into(),
            ));
        }
        if !self.http.metrics_listen.is_empty() {
            self.http
                .metrics_listen
                .parse::<SocketAddr>()
                .map_err(|e| {
                    ConfigError::Invalid(format!(
                        "http.metrics_listen {:?}: {e}",
                        self.http.metrics_listen
                    ))
                })?;
        }
        self.log.check()?;
        self.api.check()?;
        if self.api.listen.starts_with("https://") && self.tls.certificates.is_empty() {
            return Err(ConfigError::Invalid(
                "api.listen is https:// but [tls] names no certificate ([[tls.certificates]] cert = \"chain.pem\", key = \"key.pem\")".into(),
            ));
        }
        if let Some(n) = self.live.keys().find(|n| self.rtsp.live.contains_key(*n)) {
            return Err(ConfigError::Invalid(format!(
                "live source {n:?} is configured twice, as [live.{n}] and [rtsp.live.{n}]: keep [live.{n}]"
            )));
        }
        self.rtsp_with_live().check()?;
        let admitted_max = self.admission.admission_config().streams_max;
        if !self.rtsp.is_off() && self.rtsp.sessions_max as u64 > u64::from(admitted_max) {
            return Err(ConfigError::Invalid(format!(
                "rtsp.sessions_max {} is above admission.streams_max {admitted_max}: the two \
                 caps must agree (lower rtsp.sessions_max or raise admission.streams_max)",
                self.rtsp.sessions_max
            )));
        }
        self.cluster.check()?;
        self.volumes.limits()?;
        if !self.http.health_path.is_empty()
            && (!self.http.health_path.starts_with('/')
                || self.http.health_path == self.http.metrics_path)
        {
            return Err(ConfigError::Invalid(format!(
                "http.health_path {:?}: a path starting with / other than metrics_path",
                self.http.health_path
            )));
        }
        if self.hls.sessions_max == 0 || self.hls.sessions_per_address_max == 0 {
            return Err(ConfigError::Invalid(
                "hls.sessions_max and hls.sessions_per_address_max must be at least 1".into(),
            ));
        }
        if self.hls.session_idle().is_zero() {
            return Err(ConfigError::Invalid(
                "hls.session_idle_ms must be above 0".into(),
            ));
        }
        if self.hls.index_cache_bytes_max < 1 << 20 {
            return Err(ConfigError::Invalid(format!(
                "hls.index_cache_bytes_max must be at least 1 MiB, got {}",
                self.hls.index_cache_bytes_max
            )));
        }
        if !(1..=60_000).contains(&self.hls.blocking_reload_timeout_ms) {
            return Err(ConfigError::Invalid(format!(
                "hls.blocking_reload_timeout_ms must be 1ms..=60s, got {} ms",
                self.hls.blocking_reload_timeout_ms
            )));
        }
        if self.hls.live_segments_max == 0 {
            return Err(ConfigError::Invalid(
                "hls.live_segments_max must be at least 1".into(),
            ));
        }
        if let Some(s) = &self.engine.sched {
            s.parse::<penstock_core::sched::policy::SchedAsk>()
                .map_err(|e| ConfigError::Invalid(format!("engine.{e}")))?;
        }
        if let Some(n) = self.engine.timed_workers
            && n > 64
        {
            return Err(ConfigError::Invalid(format!(
                "engine.timed_workers must be 0..=64 (0: as many as the general workers), got {n}"
            )));
        }
        if let Some(p) = self.engine.rt_priority
            && !(1..=99).contains(&p)
        {
            return Err(ConfigError::Invalid(format!(
                "engine.rt_priority must be 1..=99, got {p}"
            )));
        }
        if let Some(us) = self.engine.deadline_period_us
            && !(100..=1_000_000).contains(&us)
        {
            return Err(ConfigError::Invalid(format!(
                "engine.deadline_period_us must be 100..=1,000,000, got {us}"
            )));
        }
        if let Some(us) = self.engine.dispatch_slack_us
            && std::time::Duration::from_micros(us) > penstock_driver::engine::DISPATCH_SLACK_MAX
        {
            return Err(ConfigError::Invalid(format!(
                "engine.dispatch_slack_us must be at most {} µs, got {us}",
                penstock_driver::engine::DISPATCH_SLACK_MAX.as_micros()
            )));
        }
        self.origin.check()?;
        if !self.control.listen.is_empty() {
            let (tls, addr) = self.control.listen_addr()?;
            if tls && self.tls.certificates.is_empty() {
                return Err(ConfigError::Invalid(format!(
                    "control.listen {:?}: tls:// needs a certificate in [tls]",
                    self.control.listen
                )));
            }
            if !tls && !addr.ip().is_loopback() {
                return Err(ConfigError::Invalid(format!(
                    "control.listen {:?}: off loopback the control port must use TLS, \"tls://{addr}\" with a [tls] certificate (the AUTH token would cross the network in clear)",
                    self.control.listen
                )));
            }
        }
        self.body_path()?;
        if let Some(i) = &self.http.index
            && (i.contains('/') || i == "." || i == "..")
        {
            return Err(ConfigError::Invalid(format!(
                "http.index {i:?} must be a file name in the directory (no '/')"
            )));
        }
        for (ext, t) in &self.http.types {
            if ext.is_empty() || ext.contains(['.', '/']) || ext.chars().any(char::is_whitespace) {
                return Err(ConfigError::Invalid(format!(
                    "http.types: {ext:?} is not a file extension (give it without the dot)"
                )));
            }
            if !penstock_core::http::is_valid_media_type(t) {
                return Err(ConfigError::Invalid(format!(
                    "http.types.{ext}: {t:?} is not a media type (type/subtype[; name=value])"
                )));
            }
        }
        for l in &self.location {
            if !l.prefix.starts_with('/') {
                return Err(ConfigError::Invalid(format!(
                    "location prefix {:?} must start with /",
                    l.prefix
                )));
            }
            check_cors_origins(&l.prefix, &l.cors_allow_origins)?;
            match l.auth {
                AuthMode::None => {}
                AuthMode::Signed if self.auth.keys.is_empty() => {
                    return Err(ConfigError::Invalid(format!(
                        "location {:?}: auth = \"signed\" needs a key in [auth] keys",
                        l.prefix
                    )));
                }
                AuthMode::Signed => {}
                AuthMode::Jwt | AuthMode::SignedOrJwt if self.auth.jwks_file.is_none() => {
                    return Err(ConfigError::Invalid(format!(
                        "location {:?}: auth = \"jwt\" / \"signed_or_jwt\" needs [auth] jwks_file",
                        l.prefix
                    )));
                }
                AuthMode::SignedOrJwt if self.auth.keys.is_empty() => {
                    return Err(ConfigError::Invalid(format!(
                        "location {:?}: auth = \"signed_or_jwt\" needs a key in [auth] keys",
                        l.prefix
                    )));
                }
                AuthMode::Digest if self.auth.digest_users_file.is_none() => {
                    return Err(ConfigError::Invalid(format!(
                        "location {:?}: auth = \"digest\" needs [auth] digest_users_file",
                        l.prefix
                    )));
                }
                AuthMode::Jwt | AuthMode::SignedOrJwt | AuthMode::Digest => {}
            }
        }
        if let Some((name, _)) = self.rtsp.live.iter().find(|(_, l)| l.is_publish())
            && self.auth.digest_users_file.is_none()
        {
            return Err(ConfigError::Invalid(format!(
                "rtsp.live.{name}: source = \"publish\" needs [auth] digest_users_file (its publishers are Digest users)"
            )));
        }
        self.auth.check()?;
        self.check_tenants()?;
        self.control.check()?;
        for (key, v) in [("user", &self.user), ("group", &self.group)] {
            if v.as_deref().is_some_and(|v| v.trim().is_empty()) {
                return Err(ConfigError::Invalid(format!(
                    "{key} is empty: name a {key} or remove the key"
                )));
            }
        }
        if self.group.is_some() && self.user.is_none() {
            return Err(ConfigError::Invalid(
                "group is set without user: name the user to switch to".into(),
            ));
        }
        self.disk
            .check(self.engine.engine_config().buffer_bytes as u64)?;
        Ok(())
    }

    /// The engine path for HTTP bodies.
    pub fn body_path(&self) -> Result<penstock_core::stream::PathChoice, ConfigError> {
        use penstock_core::stream::{DataPath, PathChoice};
        Ok(match self.http.body_path.as_str() {
            "auto" => PathChoice::Auto,
            "sendfile" => PathChoice::Fixed(DataPath::Sendfile),
            "splice" => PathChoice::Fixed(DataPath::Splice),
            "uring" => PathChoice::Fixed(DataPath::Uring),
            "copy" => PathChoice::Fixed(DataPath::Copy),
            other => {
                return Err(ConfigError::Invalid(format!(
                    "http.body_path {other:?}: expected sendfile, splice, uring, copy or auto"
                )));
            }
        })
    }

    /// The engine's configuration: `[engine]` sizes and `[disk]` scheduler settings.
    pub fn engine_config(&self) -> penstock_driver::EngineConfig {
        let mut c = self.engine.engine_config();
        self.disk.apply(&mut c.disk);
        self.buffers.apply(&mut c);
        c
    }

    /// The reloadable part.
    pub fn live(&self) -> LiveConfig {
        let mut locations = self.location.clone();
        locations.sort_by_key(|l| std::cmp::Reverse(l.prefix.len()));
        LiveConfig {
            limits: self.limits.clone(),
            locations,
        }
    }

    pub fn shutdown_deadline(&self) -> Duration {
        Duration::from_millis(self.shutdown_deadline_ms.unwrap_or(10_000))
    }
}

/// What [`crate::Server::reload`] applies (a key, or every key beneath a table).
pub const RELOADABLE: &[&str] = &[
    "limits",
    // [disk]'s quanta and bound; `adaptive_quanta` and its factor are read at start.
    "disk.rt_quantum_bytes",
    "disk.bulk_quantum_bytes",
    "disk.inflight_max",
    "disk.classes",
    "location",
    "auth",
    "http.listen",
    "http.root",
    "http.index",
    "http.types",
    "tls",
];

/// Whether a reload applies a change of `key` (a dotted key of [`changed_keys`]).
pub fn reloadable(key: &str) -> bool {
    RELOADABLE
        .iter()
        .any(|r| key == *r || key.starts_with(&format!("{r}.")))
}

/// The dotted keys whose values differ between two configurations (a table's keys one by
/// one; an array, such as `location`, as a whole).
pub fn changed_keys(old: &ServerConfig, new: &ServerConfig) -> Vec<String> {
    fn walk(prefix: &str, a: Option<&toml::Value>, b: Option<&toml::Value>, out: &mut Vec<String>) {
        match (a, b) {
            (Some(toml::Value::Table(x)), Some(toml::Value::Table(y))) => {
                let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
                for k in keys {
                    let p = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&p, x.get(k), y.get(k), out);
                }
            }
            (a, b) if a != b => out.push(prefix.to_string()),
            _ => {}
        }
    }
    let (Ok(a), Ok(b)) = (toml::Value::try_from(old), toml::Value::try_from(new)) else {
        return vec!["(the configurations could not be compared)".into()];
    };
    let mut out = Vec::new();
    walk("", Some(&a), Some(&b), &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `[volumes]`: the reserved keys are limits and the tracks directory, every other key a
    /// volume; units as elsewhere; a zero growth step is refused.
    #[test]
    fn volumes_take_limits_and_tracks_beside_the_volume_names() {
        let c: ServerConfig = toml::from_str(
            "[volumes]\nhv = \"/srv/m0\"\ntracks = \"/srv/tracks\"\nlock_wait_ms = \"5s\"\ngrow_step_bytes = \"64MiB\"\n",
        )
        .unwrap();
        assert_eq!(c.volumes.members.keys().collect::<Vec<_>>(), ["hv"]);
        assert_eq!(c.volumes.tracks.as_deref(), Some(Path::new("/srv/tracks")));
        let l = c.volumes.limits().unwrap();
        assert_eq!(l.update_lock_wait, Duration::from_secs(5));
        assert_eq!(l.grow_step_bytes, 64 << 20);
        c.check().unwrap();
        let d: ServerConfig = toml::from_str("").unwrap();
        assert_eq!(
            d.volumes.limits().unwrap(),
            penstock_driver::volume::VolumeLimits::default()
        );
        // The background scrub: on by default for the served volumes, off with a 0 or none.
        assert_eq!(
            c.volumes.scrub(),
            Some((
                crate::scrub::RATE_BYTES_PER_S_DEFAULT,
                crate::scrub::INTERVAL_DEFAULT
            ))
        );
        let sc: ServerConfig = toml::from_str(
            "[volumes]\nhv = \"/m\"\nscrub_rate_bytes_per_s = \"8MB/s\"\nscrub_interval_ms = \"1h\"\n",
        )
        .unwrap();
        assert_eq!(
            sc.volumes.scrub(),
            Some((8_000_000, Duration::from_secs(3600)))
        );
        assert_eq!(sc.volumes.members.len(), 1);
        for off in ["scrub_rate_bytes_per_s = 0", "scrub_interval_ms = 0"] {
            let c: ServerConfig =
                toml::from_str(&format!("[volumes]\nhv = \"/m\"\n{off}\n")).unwrap();
            assert_eq!(c.volumes.scrub(), None, "{off}");
        }
        assert_eq!(d.volumes.scrub(), None, "no volume, no scrub");
        let z: ServerConfig = toml::from_str("[volumes]\ngrow_step_bytes = 0\n").unwrap();
        assert!(
            z.check()
                .unwrap_err()
                .to_string()
                .contains("grow_step_bytes")
        );
        assert!(
            toml::from_str::<ServerConfig>("[volumes]\nlock_wait_ms = \"5 parsecs\"\n").is_err()
        );
    }

    /// Issue 35: `auth = "signed"` needs a key, `"jwt"` a JWKS, `"signed_or_jwt"` both;
    /// key ids are checked and unique.
    #[test]
    fn location_auth_needs_its_keys() {
        let parse = |t: &str| toml::from_str::<ServerConfig>(t).unwrap();
        let e = parse("[[location]]\nprefix = \"/p/\"\nauth = \"signed\"\n")
            .check()
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs a key"), "{e}");
        let keys = "[auth]\nkeys = [{ id = \"k1\", secret_file = \"/k\" }]\n";
        let ok = parse(&format!(
            "{keys}[[location]]\nprefix = \"/p/\"\nauth = \"signed\"\nserve_hidden = true\n"
        ));
        ok.check().unwrap();
        let live = ok.live();
        let p = live.policy("/p/x");
        assert_eq!((p.auth, p.serve_hidden), (AuthMode::Signed, true));
        let p = live.policy("/q/x");
        assert_eq!((p.auth, p.serve_hidden), (AuthMode::None, false));
        for mode in ["jwt", "signed_or_jwt"] {
            let e = parse(&format!(
                "{keys}[[location]]\nprefix = \"/p/\"\nauth = \"{mode}\"\n"
            ))
            .check()
            .unwrap_err()
            .to_string();
            assert!(e.contains("needs [auth] jwks_file"), "{e}");
            parse(&format!(
                "{keys}jwks_file = \"/j\"\n[[location]]\nprefix = \"/p/\"\nauth = \"{mode}\"\n"
            ))
            .check()
            .unwrap();
        }
        assert!(
            toml::from_str::<ServerConfig>("[[location]]\nprefix = \"/\"\nauth = \"basic\"\n")
                .is_err()
        );
        for bad in [
            "[auth]\nkeys = [{ id = \"a b\", secret_file = \"/k\" }]\n",
            "[auth]\nkeys = [{ id = \"a\", secret_file = \"/k\" }, { id = \"a\", secret_file = \"/j\" }]\n",
            "[auth]\nsession_ttl_ms = 0\n",
        ] {
            assert!(parse(bad).check().is_err(), "{bad}");
        }
        assert_eq!(parse("").auth.session_ttl(), Duration::from_secs(4 * 3600));
    }

    #[test]
    fn empty_file_gives_defaults() {
        let c: ServerConfig = toml::from_str("").unwrap();
        c.check().unwrap();
        assert_eq!(c.http.listen, ListenAddrs::from("127.0.0.1:8080"));
        assert_eq!(c.control.listen, "127.0.0.1:7070");
        assert_eq!(c.limits, HttpLimits::default());
    }

    #[test]
    fn longest_prefix_wins() {
        let c: ServerConfig = toml::from_str(
            r#"
            [limits]
            idle_timeout_ms = 500
            limit_rate_bytes_per_s = 100
            [[location]]
            prefix = "/v/"
            class = "rt"
            [[location]]
            prefix = "/v/slow/"
            limit_rate_bytes_per_s = 10
            limit_rate_after_bytes = 5
            "#,
        )
        .unwrap();
        c.check().unwrap();
        let live = c.live();
        assert_eq!(live.limits.idle_timeout_ms, 500);
        let p = live.policy("/v/slow/a");
        assert_eq!(
            (p.class, p.limit_rate_bytes_per_s, p.limit_rate_after_bytes),
            ("bulk", 10, 5)
        );
        let p = live.policy("/v/a");
        assert_eq!((p.class, p.limit_rate_bytes_per_s), ("rt", 100));
        assert_eq!(live.policy("/x").class, "bulk");
    }

    #[test]
    fn the_example_file_parses_and_matches_the_defaults() {
        let c: ServerConfig =
            toml::from_str(include_str!("../../../docs/penstock.example.toml")).unwrap();
        c.check().unwrap();
        assert_eq!(c.limits, HttpLimits::default());
        assert_eq!(
            c.http.engine_body_bytes_min,
            HttpConfig::default().engine_body_bytes_min
        );
        assert_eq!(c.disk.settings(), DiskSection::default().settings());
        let d = ControlConfig::default();
        assert_eq!(
            (
                c.control.start_at_late_max_ms,
                c.control.start_at_ahead_max_ms
            ),
            (d.start_at_late_max_ms, d.start_at_ahead_max_ms)
        );
    }

    #[test]
    fn disk_classes_and_control_limits_are_read_and_checked() {
        let c: ServerConfig = toml::from_str(
            "[disk.classes.gold]\nquantum_bytes = \"2MiB\"\n[disk.classes.rt]\nquantum_bytes = \"8MiB\"\n\
             [control.limits.\"uid:1000\"]\nschedule_max = \"4,40ms\"\nrate_max = \"80Mbit/s\"\n",
        )
        .unwrap();
        c.check().unwrap();
        let e = c.engine_config();
        assert_eq!(e.disk.named_classes, [("gold".to_string(), 2 << 20)]);
        assert_eq!(e.disk.rt_quantum_bytes, 8 << 20);
        let (who, ceiling) = c.control.ceiling_of(false, Some(1000), Some(5)).unwrap();
        assert_eq!(who, "uid:1000");
        assert_eq!(ceiling.bytes_per_s_max, Some(10_000_000));
        assert!(c.control.ceiling_of(true, None, None).is_none());
        for (bad, why) in [
            ("[disk.classes.gold]\n", "needs quantum_bytes"),
            (
                "[disk.classes.\"9x\"]\nquantum_bytes = 1048576\n",
                "class name",
            ),
            (
                "[disk]\nrt_quantum_bytes = 1048576\n[disk.classes.rt]\nquantum_bytes = 1048576\n",
                "both set",
            ),
            ("[control.limits.alice]\nrate_max = \"1MB/s\"\n", "uid:N"),
            ("[control.limits.token]\nrate_max = \"30/s\"\n", "not units"),
            (
                "[control.limits.token]\nschedule_max = \"0,1s\"\n",
                "above 0",
            ),
        ] {
            let c: ServerConfig = toml::from_str(bad).unwrap();
            let e = c.check().unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn dispatch_slack_takes_microseconds_and_is_bounded() {
        let default: ServerConfig = toml::from_str("").unwrap();
        assert_eq!(
            default.engine_config().dispatch_slack,
            penstock_driver::engine::DISPATCH_SLACK_DEFAULT
        );
        for (text, us) in [("\"250us\"", 250), ("0", 0), ("\"1ms\"", 1000)] {
            let c: ServerConfig =
                toml::from_str(&format!("[engine]\ndispatch_slack_us = {text}\n")).unwrap();
            c.check().unwrap();
            assert_eq!(
                c.engine_config().dispatch_slack,
                std::time::Duration::from_micros(us)
            );
        }
        let c: ServerConfig = toml::from_str("[engine]\nrealtime = true\n").unwrap();
        assert!(c.engine.engine_config().realtime);
        let c: ServerConfig = toml::from_str("[engine]\n").unwrap();
        assert!(!c.engine.engine_config().realtime, "off by default");
        let c: ServerConfig = toml::from_str("[engine]\ndispatch_slack_us = 1001\n").unwrap();
        let e = c.check().unwrap_err().to_string();
        assert!(e.contains("dispatch_slack_us"), "{e}");
        assert!(
            toml::from_str::<ServerConfig>("[engine]\ndispatch_slack_us = \"1.5us\"\n").is_err()
        );
    }

    #[test]
    fn a_reload_takes_the_quanta_but_not_adaptive_quanta() {
        for (key, applied) in [
            ("disk.rt_quantum_bytes", true),
            ("disk.inflight_max", true),
            ("disk.adaptive_quanta", false),
            ("disk.adaptive_quantum_factor", false),
            ("limits.connections_max", true),
            ("http.workers", false),
        ] {
            assert_eq!(reloadable(key), applied, "{key}");
        }
    }

    #[test]
    fn adaptive_quanta_are_off_by_default_and_checked() {
        let c: ServerConfig = toml::from_str("").unwrap();
        assert_eq!(c.engine_config().disk.adaptive_quantum_factor, None);
        let c: ServerConfig = toml::from_str("[disk]\nadaptive_quanta = true\n").unwrap();
        c.check().unwrap();
        assert_eq!(
            c.engine_config().disk.adaptive_quantum_factor,
            Some(ADAPTIVE_QUANTUM_FACTOR_DEFAULT)
        );
        let c: ServerConfig =
            toml::from_str("[disk]\nadaptive_quanta = true\nadaptive_quantum_factor = 16\n")
                .unwrap();
        c.check().unwrap();
        assert_eq!(c.engine_config().disk.adaptive_quantum_factor, Some(16));
        for bad in [
            "[disk]\nadaptive_quanta = true\nadaptive_quantum_factor = 1\n",
            "[disk]\nadaptive_quanta = true\nadaptive_quantum_factor = 65\n",
            "[disk]\nadaptive_quantum_factor = 8\n",
        ] {
            let c: ServerConfig = toml::from_str(bad).unwrap();
            let e = c.check().unwrap_err().to_string();
            assert!(e.contains("adaptive_quantum"), "{bad}: {e}");
        }
    }

    #[test]
    fn disk_section_sets_the_scheduler_and_is_checked() {
        let c: ServerConfig =
            toml::from_str("[disk]\nrt_quantum_bytes = 8388608\ninflight_max = 2\n").unwrap();
        c.check().unwrap();
        let e = c.engine_config();
        assert_eq!(
            (
                e.disk.rt_quantum_bytes,
                e.disk.bulk_quantum_bytes,
                e.disk.disk_inflight_max
            ),
            (8 << 20, 1 << 20, 2)
        );
        let t = c.disk.tuning();
        assert_eq!(
            t.bulk_quantum_bytes,
            Some(1 << 20),
            "a reload sets every value"
        );
        for bad in [
            "inflight_max = 0",
            "inflight_max = 5000",
            "rt_quantum_bytes = 4096",
            "bulk_quantum_bytes = 0",
        ] {
            let c: ServerConfig = toml::from_str(&format!("[disk]\n{bad}\n")).unwrap();
            let e = c.check().unwrap_err().to_string();
            assert!(e.contains("[disk]"), "{bad}: {e}");
        }
        // The quantum is checked against the configured read size.
        let c: ServerConfig = toml::from_str(
            "[engine]\nbuffer_bytes = 4194304\n[disk]\nbulk_quantum_bytes = 2097152\n",
        )
        .unwrap();
        assert!(c.check().is_err());
        assert!(toml::from_str::<ServerConfig>("[disk]\nquantum = 1\n").is_err());
    }

    #[test]
    fn buffers_section_sets_how_far_pools_grow_and_when_they_shrink() {
        let d = ServerConfig::default().engine_config();
        assert_eq!(d.pool_buffers, SERVE_POOL_BUFFERS_DEFAULT);
        assert_eq!(d.pool_max_bytes, Some(32 << 20), "32 buffers of 1 MiB");
        let c: ServerConfig = toml::from_str(
            "[engine]\npool_buffers = 2\n[buffers]\npool_max_bytes = \"8MiB\"\nshrink_after_ms = \"2s\"\n",
        )
        .unwrap();
        c.check().unwrap();
        let e = c.engine_config();
        assert_eq!((e.pool_buffers, e.pool_max_bytes), (2, Some(8 << 20)));
        assert_eq!(e.pool_buffers_max(), 8);
        assert_eq!(e.pool_shrink_after, Duration::from_secs(2));
        for bad in ["shrink_after_ms = 0", "pool_max_bytes = \"17GiB\""] {
            let c: ServerConfig = toml::from_str(&format!("[buffers]\n{bad}\n")).unwrap();
            assert!(
                c.check().unwrap_err().to_string().contains("buffers."),
                "{bad}"
            );
        }
    }

    #[test]
    fn values_take_units_as_the_command_line_does() {
        let c: ServerConfig = toml::from_str(
            r#"
            shutdown_deadline_ms = "2s"
            [limits]
            idle_timeout_ms = "30s"
            header_bytes_max = "16KiB"
            limit_rate_bytes_per_s = "8Mbps"
            [control]
            line_bytes_max = "8KiB"
            [engine]
            buffer_bytes = "1MiB"
            [[location]]
            prefix = "/v/"
            limit_rate_bytes_per_s = "2MB/s"
            "#,
        )
        .unwrap();
        c.check().unwrap();
        assert_eq!(c.shutdown_deadline(), Duration::from_secs(2));
        assert_eq!(c.limits.idle_timeout_ms, 30_000);
        assert_eq!(c.limits.header_bytes_max, 16 * 1024);
        assert_eq!(c.limits.limit_rate_bytes_per_s, 1_000_000);
        assert_eq!(c.control.line_bytes_max, 8 * 1024);
        assert_eq!(c.engine.buffer_bytes, Some(1 << 20));
        assert_eq!(c.location[0].limit_rate_bytes_per_s, Some(2_000_000));
        let e = toml::from_str::<ServerConfig>(
            "[limits]
idle_timeout_ms = \"soon\"
",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("idle_timeout_ms") && e.contains("duration"),
            "{e}"
        );
    }

    #[test]
    fn admission_takes_a_lateness_tolerance_and_a_cost_per_byte() {
        let d: ServerConfig = toml::from_str("").unwrap();
        let a = d.admission.admission_config();
        assert_eq!(
            a.lateness_tolerance_ns,
            penstock_core::admission::LATENESS_TOLERANCE_NS_DEFAULT
        );
        assert_eq!(
            a.capacity.cpu_send_byte_ps,
            penstock_core::admission::Capacity::CONSERVATIVE.cpu_send_byte_ps
        );
        let c: ServerConfig = toml::from_str(
            "[admission]\nlateness_tolerance_ms = \"20ms\"\ncpu_send_byte_ps = 500\n",
        )
        .unwrap();
        let a = c.admission.admission_config();
        assert_eq!(a.lateness_tolerance_ns, 20_000_000);
        assert_eq!(a.capacity.cpu_send_byte_ps, 500);
        // Zero would promise nothing: refused when admission is built, with the reason.
        let z: ServerConfig = toml::from_str("[admission]\nlateness_tolerance_ms = 0\n").unwrap();
        let e = penstock_core::admission::Admission::new(z.admission.admission_config())
            .unwrap_err()
            .to_string();
        assert!(e.contains("lateness tolerance is zero"), "{e}");
    }

    #[test]
    fn media_types_are_checked_before_they_can_reach_a_head() {
        let c: ServerConfig =
            toml::from_str("[http.types]\nm3u8 = \"application/x-mpegURL\"\n").unwrap();
        c.check().unwrap();
        for bad in [
            "[http.types]\n\".m3u8\" = \"a/b\"\n",
            "[http.types]\nx = \"text/plain\\r\\nSet-Cookie: a=b\"\n",
            "[http.types]\nx = \"nonsense\"\n",
            "[http]\nindex = \"../secret\"\n",
        ] {
            let c: ServerConfig = toml::from_str(bad).unwrap();
            assert!(c.check().is_err(), "{bad}");
        }
    }

    #[test]
    fn changed_keys_name_each_difference() {
        let a: ServerConfig = toml::from_str("").unwrap();
        let b: ServerConfig = toml::from_str(
            "[http]\nlisten = \"127.0.0.1:9\"\nworkers = 3\n[control]\ntcp_connections_max = 5\n[[location]]\nprefix = \"/v/\"\n",
        )
        .unwrap();
        let k = changed_keys(&a, &b);
        assert_eq!(
            k,
            [
                "control.tcp_connections_max",
                "http.listen",
                "http.workers",
                "location"
            ]
        );
        assert!(changed_keys(&b, &b.clone()).is_empty());
        // Units do not count as a change.
        let c: ServerConfig = toml::from_str("[limits]\nidle_timeout_ms = \"60s\"\n").unwrap();
        assert!(changed_keys(&a, &c).is_empty());
    }

    #[test]
    fn unix_fds_held_max_is_checked() {
        for (v, ok) in [(1, false), (2, true), (64, true), (65, false)] {
            let mut c = ServerConfig::default();
            c.control.unix_fds_held_max = v;
            match c.check() {
                Ok(_) => assert!(ok, "{v} accepted"),
                Err(e) => {
                    assert!(!ok, "{v} refused: {e}");
                    assert!(e.to_string().contains("unix_fds_held_max"), "{e}");
                }
            }
        }
    }

    #[test]
    fn the_example_file_has_the_log_and_metrics_defaults() {
        let c: ServerConfig =
            toml::from_str(include_str!("../../../docs/penstock.example.toml")).unwrap();
        assert_eq!(c.log, LogConfig::default());
        assert_eq!(c.http.metrics_listen, HttpConfig::default().metrics_listen);
        assert_eq!(c.origin, OriginConfig::default());
    }

    #[test]
    fn the_access_log_defaults_to_stdout_and_its_limits_are_checked() {
        let c: ServerConfig = toml::from_str("").unwrap();
        assert_eq!(
            c.log.access_target(),
            crate::access_log::AccessTarget::Stdout
        );
        let c: ServerConfig = toml::from_str("[log]\naccess = \"off\"\n").unwrap();
        assert_eq!(c.log.access_target(), crate::access_log::AccessTarget::Off);
        let c: ServerConfig = toml::from_str("[log]\naccess = \"/var/log/p.log\"\n").unwrap();
        assert_eq!(
            c.log.access_target(),
            crate::access_log::AccessTarget::File("/var/log/p.log".into())
        );
        for bad in [
            "access = \"\"",
            "access_buffer_bytes = 0",
            "access_flush_ms = 0",
            "access_queue_batches = 0",
        ] {
            let c: ServerConfig = toml::from_str(&format!("[log]\n{bad}\n")).unwrap();
            assert!(c.check().is_err(), "{bad}");
        }
        let c: ServerConfig = toml::from_str("[http]\nmetrics_listen = \"nope\"\n").unwrap();
        assert!(c.check().is_err());
    }

    #[test]
    fn api_settings_are_checked() {
        let check = |t: &str| {
            toml::from_str::<ServerConfig>(t)
                .unwrap()
                .check()
                .map_err(|e| e.to_string())
        };
        assert!(check("[api]\nlisten = \"127.0.0.1:9997\"\n").is_ok());
        assert!(check("[api]\nlisten = \"http://127.0.0.1:9997/\"\n").is_ok());
        assert!(
            check("[api]\nlisten = \"nope\"\n")
                .unwrap_err()
                .contains("api.listen")
        );
        assert!(
            check("[api]\nlisten = \"https://127.0.0.1:9997\"\n")
                .unwrap_err()
                .contains("[tls]")
        );
        assert!(
            check("[api]\nsse_max = 32\nconnections_max = 32\n")
                .unwrap_err()
                .contains("sse_max")
        );
        assert!(check("[api]\nrequest_bytes_max = 0\n").is_err());
        assert_eq!(
            toml::from_str::<ServerConfig>("[api]\nrequest_bytes_max = \"8KiB\"\n")
                .unwrap()
                .api
                .request_bytes_max,
            8192
        );
    }

    #[test]
    fn unknown_keys_are_refused() {
        assert!(toml::from_str::<ServerConfig>("[limits]\nidle_typo = 1\n").is_err());
    }

    #[test]
    fn accept_backoff_defaults_to_500_ms_and_is_never_0() {
        let c: ServerConfig = toml::from_str("").unwrap();
        assert_eq!(c.limits.accept_backoff(), Duration::from_millis(500));
        for bad in ["0", "60001"] {
            let c: ServerConfig =
                toml::from_str(&format!("[limits]\naccept_backoff_ms = {bad}\n")).unwrap();
            assert!(c.check().is_err(), "{bad}");
        }
    }

    #[test]
    fn local_peers_is_refused_with_a_reason() {
        let c: ServerConfig = toml::from_str("[control]\nlocal_peers = [\"127.0.0.1\"]\n").unwrap();
        let e = c.check().unwrap_err().to_string();
        assert!(e.contains("says nothing about who"), "{e}");
    }

    #[test]
    fn user_and_group_are_top_level_keys_and_a_group_needs_a_user() {
        let c: ServerConfig = toml::from_str("user = \"penstock\"\ngroup = \"media\"\n").unwrap();
        assert_eq!(c.user.as_deref(), Some("penstock"));
        assert_eq!(c.group.as_deref(), Some("media"));
        assert!(c.check().is_ok());
        let c: ServerConfig = toml::from_str("group = \"media\"\n").unwrap();
        assert!(c.check().unwrap_err().to_string().contains("without user"));
        let c: ServerConfig = toml::from_str("user = \" \"\n").unwrap();
        assert!(c.check().unwrap_err().to_string().contains("user is empty"));
    }

    #[test]
    fn connections_max_is_still_the_tcp_cap() {
        let c: ServerConfig = toml::from_str("[control]\nconnections_max = 7\n").unwrap();
        assert_eq!(c.control.tcp_connections_max, 7);
    }

    #[test]
    fn unix_peers_default_to_the_servers_own_uid() {
        let mut c = ControlConfig::default();
        assert!(c.unix_peer_allowed(1000, 1000, 1000));
        assert!(!c.unix_peer_allowed(65534, 65534, 1000));
        c.unix_allow_gids = vec![65534];
        assert!(c.unix_peer_allowed(65534, 65534, 1000));
        c.unix_allow_uids = vec![5];
        assert!(!c.unix_peer_allowed(1000, 1000, 1000));
    }

    #[test]
    fn listeners_default_to_loopback_and_connects_to_anywhere() {
        let mut c = ControlConfig::default();
        assert!(c.may_listen_on("127.0.0.1".parse().unwrap()));
        assert!(c.may_listen_on("::1".parse().unwrap()));
        assert!(!c.may_listen_on("0.0.0.0".parse().unwrap()));
        assert!(c.may_connect_to("192.0.2.1".parse().unwrap()));
        c.listen_allow = vec!["0.0.0.0/0".parse().unwrap()];
        assert!(c.may_listen_on("0.0.0.0".parse().unwrap()));
        c.connect_allow = vec!["127.0.0.0/8".parse().unwrap()];
        assert!(!c.may_connect_to("192.0.2.1".parse().unwrap()));
        assert!(c.may_connect_to("::ffff:127.0.0.9".parse().unwrap()));
    }

    #[test]
    fn prefixes_parse_and_match() {
        let p: IpPrefix = "10.1.0.0/16".parse().unwrap();
        assert!(p.contains("10.1.255.1".parse().unwrap()));
        assert!(!p.contains("10.2.0.1".parse().unwrap()));
        let p: IpPrefix = "fe80::/10".parse().unwrap();
        assert!(p.contains("fe80::1".parse().unwrap()));
        assert!(!p.contains("10.1.0.1".parse().unwrap()));
        let one: IpPrefix = "192.0.2.7".parse().unwrap();
        assert!(one.contains("192.0.2.7".parse().unwrap()));
        assert!(!one.contains("192.0.2.8".parse().unwrap()));
        assert!("10.0.0.0/33".parse::<IpPrefix>().is_err());
        assert!("nope/8".parse::<IpPrefix>().is_err());
        assert!(toml::from_str::<ServerConfig>("[control]\nlisten_allow = [\"x\"]\n").is_err());
    }
}
