//! Metrics, Prometheus conventions: served at `GET /metrics` by the HTTP workers, on an
//! optional separate listener (`[http] metrics_listen`, [`crate::metrics_http`]), and by
//! `penstock stream --metrics` / `penstock record --metrics` ([`CliMetrics`]).
//!
//! Two text formats, chosen by the request's `Accept` ([`Format::from_accept`]): OpenMetrics
//! 1.0 (what Prometheus asks for first; ends with `# EOF`) and the Prometheus text format
//! 0.0.4 (everything else: curl, `promtool check metrics`, which lints only 0.0.4 and reads
//! OpenMetrics' counter `HELP` lines as missing). prometheus-client writes OpenMetrics; the
//! 0.0.4 page is the same text with the few differences rewritten ([`to_text_004`]).
//!
//! The families (all `penstock_` but the standard `process_*`):
//! - HTTP: `http_requests_total{class,data_path,code}` (code: the status class, `2xx` …),
//!   `http_body_bytes_total{class,data_path}`, `http_request_duration_seconds{class}` (from
//!   the first byte of the request head to the last byte of the response handed to the
//!   kernel, or to the cut), `http_time_to_first_byte_seconds{class}` (from the first byte of
//!   the head to the first byte of the response head sent), connections, refused
//!   connections, accept failures and pauses, `errors_total{kind}`, the access log's lines
//!   and dropped lines. `data_path` is how the body moved: `sendfile` (the connection's
//!   loop), `engine-<path>`, `memory` (heads, errors, multipart part headers, metrics),
//!   `none` (HEAD, 304).
//! - HLS: `hls_playlist_requests_total{kind}` (playlists made and answered: `media`, `master`,
//!   `dash`)
//!   and `hls_segment_requests_total` (range GETs of a TS file, which is what a segment is).
//! - Streams: `streams_active`, `admission_refusals_total{resource}` (every resource present
//!   at 0 from the start), and for paced streams `stream_lateness_seconds{class}` and
//!   `deadline_misses_total{class}` (class: the engine's disk class, `rt` or `bulk`), fed
//!   from the engine's live per-stream counts ([`penstock_driver::StreamHandle::lateness`])
//!   by the control reaper every few milliseconds and when a stream ends. The engine counts
//!   lateness in power-of-two nanosecond buckets; the histogram's bounds are powers of two
//!   nanoseconds too (8.192 µs × 4ⁿ), so every unit lands in its true bucket (a lateness of
//!   exactly a bound may land one bucket up) and the sum is within a factor of two.
//! - The engine, read at each scrape ([`Metrics::watch_engine`]): `engine_buffers{state}`
//!   (the pool: total, reserved, in use by rt, borrowed by bulk), the counters
//!   `engine_buffer_repossessions_total` (buffers bulk streams gave back to rt) and
//!   `engine_buffer_rereads_total`, `volume_members_degraded_total` (members of mirrored
//!   volumes that streams found failing, read around since), `volume_checksum_failures_total`,
//!   `volume_checksum_repairs_total`, `volume_checksum_unrepaired_total` (4 KiB units of
//!   volume reads that failed their block checksum on a copy; rewritten from the other copy;
//!   read around only), `disk_queue_depth{class}`;
//!   the background scrub of the served volumes ([`crate::scrub`], present at 0 when it is
//!   off): `volume_scrub_passes_total`, `volume_scrub_read_bytes_total`,
//!   `volume_scrub_bad_units_total`, `volume_scrub_repaired_units_total`,
//!   `volume_scrub_errors_total`; the open-file table:
//!   `engine_open_files` (files open for streams, one descriptor each) and
//!   `engine_open_file_shares_total` (opens that shared an open file's descriptor).
//! - Logs: `peer_log_suppressed_lines_total{kind}`, warning lines a peer's behaviour caused
//!   that the one rate limiter ([`crate::peer_log`]) suppressed, every kind it knows present
//!   at 0 from the start.
//! - The cluster, when `[cluster] etcd` is set ([`Metrics::register_cluster`]):
//!   `penstock_node_info{node}` (1; the Prometheus info-metric convention: join on it to
//!   label any series by node), `cluster_membership` (1 while the lease is held and
//!   refreshed, 0 while etcd cannot be reached or the lease was lost),
//!   `cluster_last_refresh_timestamp_seconds` (when a refresh last reached etcd: how stale
//!   the membership in use is, `time() - …` in PromQL),
//!   `cluster_etcd_failures_total`, `cluster_nodes` (nodes in the last listing) and
//!   `cluster_redirects_total{protocol}` (opens refused here and sent to another node).
//! - `penstock_build_info{version}` and the process: `process_cpu_seconds_total`,
//!   `process_resident_memory_bytes`, `process_virtual_memory_bytes`, `process_open_fds`,
//!   `process_max_fds`, `process_start_time_seconds`, `process_threads` (from `/proc/self`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use penstock_driver::{Engine, LatenessCounts};

/// The lowest bound of the lateness histogram: 2^13 ns, so that every bound (×4) is a power
/// of two nanoseconds like the engine's buckets.
const LATENESS_BUCKET_MIN_S: f64 = 8192e-9;

/// Bounds of the HTTP duration and time-to-first-byte histograms, seconds: 100 µs (a
/// cached small file on loopback) to 5 min (a long download).
const HTTP_SECONDS_BUCKETS: [f64; 19] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Every resource an admission refusal may name (`admission_refusals_total`), each present
/// at 0 from the start.
pub const REFUSAL_RESOURCES: [&str; 7] = [
    "disk",
    "network",
    "buffers",
    "cpu",
    "streams",
    "permission",
    "other",
];

/// The engine's disk classes: the `class` label of lateness and misses.
pub const ENGINE_CLASSES: [&str; 2] = ["rt", "bulk"];

/// The value a unit counted in the engine's lateness bucket `i` is observed as: the
/// bucket's highest value (`penstock_core::lateness::lateness_bucket_high_ns`: 0 for on
/// time, `2^i - 1` ns otherwise, the open last bucket its lowest).
fn bucket_value_s(i: usize) -> f64 {
    penstock_core::lateness::lateness_bucket_high_ns(i) as f64 * 1e-9
}

fn lateness_histogram() -> Histogram {
    Histogram::new(exponential_buckets(LATENESS_BUCKET_MIN_S, 4.0, 10))
}

fn http_seconds_histogram() -> Histogram {
    Histogram::new(HTTP_SECONDS_BUCKETS)
}

/// A family of histograms by one label set.
pub type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassPath {
    pub class: String,
    /// How the body moved: `sendfile`, `engine-<path>`, `memory`, `none` (module doc).
    pub data_path: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub class: String,
    pub data_path: String,
    /// The status class: `1xx` … `5xx`.
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Kind {
    pub kind: String,
}

/// A viewer credential check (`crate::auth`): `kind` is `signed` (a signed URL) or `session`
/// (an HLS segment's session token); `result` is `ok` or the reason of the refusal.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AuthLabels {
    pub kind: String,
    pub result: String,
}

/// A tenant's series (`[tenants.NAME]`): never a token's.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct TenantLabel {
    pub tenant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabel {
    /// Whose listener: `http`.
    pub listener: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TlsPathLabel {
    /// `ktls` or `tls-user`.
    pub path: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AcceptErrorLabel {
    pub listener: String,
    /// The errno, lower case: `emfile`, `enfile`, `enobufs`, `enomem`, `econnaborted`, ...
    pub error: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabel {
    pub resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabel {
    pub class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RtspRequestLabels {
    pub method: String,
    /// The status code (`200`, `454`, ...).
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LiveLabels {
    pub source: String,
    /// `in`, `garbage`, `dropped` (from slow sessions' queues), `record_dropped`.
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    pub source: String,
}

/// The cluster's series ([`Metrics::register_cluster`]).
#[derive(Clone, Debug, Default)]
pub struct ClusterMetrics {
    pub membership: Gauge,
    /// Unix time of the last refresh that reached etcd (0: none yet): while etcd is out of
    /// reach, the membership a node uses is that old.
    pub last_refresh: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub etcd_failures: Counter,
    pub nodes: Gauge,
    pub redirects: Family<ProtocolLabel, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProtocolLabel {
    pub protocol: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

/// Buckets of RTCP interarrival jitter in seconds: 10 µs to about 1.3 s.
fn jitter_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-5, 2.0, 18))
}

/// The status class of an HTTP status code, as the `code` label says it.
pub fn status_class(code: u16) -> &'static str {
    match code / 100 {
        1 => "1xx",
        2 => "2xx",
        3 => "3xx",
        4 => "4xx",
        _ => "5xx",
    }
}

/// Which text a scrape gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0.0 text (ends with `# EOF`).
    OpenMetrics,
    /// The Prometheus text format 0.0.4.
    Text004,
}

impl Format {
    /// OpenMetrics when the `Accept` value names it (as Prometheus' scrapes do), else 0.0.4.
    pub fn from_accept(accept: Option<&[u8]>) -> Format {
        let wants = accept.is_some_and(|a| {
            a.windows(b"application/openmetrics-text".len())
                .any(|w| w.eq_ignore_ascii_case(b"application/openmetrics-text"))
        });
        if wants {
            Format::OpenMetrics
        } else {
            Format::Text004
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Text004 => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// Something a metrics listener can serve.
pub trait MetricsPage: Send + Sync {
    /// The whole page in `format`.
    fn render(&self, format: Format) -> String;
}

/// A registry encoded in `format`.
fn render_registry(registry: &Mutex<Registry>, format: Format) -> String {
    let mut s = String::with_capacity(8192);
    let r = registry.lock().unwrap_or_else(|p| p.into_inner());
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut s, &r);
    drop(r);
    match format {
        Format::OpenMetrics => s,
        Format::Text004 => to_text_004(&s),
    }
}

/// The Prometheus 0.0.4 text of an OpenMetrics text from prometheus-client: no `# EOF` and
/// no `# UNIT`; a counter's `HELP`/`TYPE` name its samples' `_total` name; an info family is
/// a gauge named `<name>_info`; `unknown` is `untyped`. Samples are written the same in
/// both (histogram bounds, label escaping).
pub fn to_text_004(om: &str) -> String {
    let mut out = String::with_capacity(om.len());
    // A HELP line waits for its TYPE line, which says what the family's name becomes.
    let mut help: Option<(&str, &str)> = None;
    for line in om.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help = Some((name, text));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.rsplit_once(' ').unwrap_or((rest, "untyped"));
            let (name, kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "info" => (format!("{name}_info"), "gauge"),
                "gauge" | "histogram" | "summary" => (name.to_string(), kind),
                _ => (name.to_string(), "untyped"),
            };
            if let Some((h, text)) = help.take() {
                debug_assert_eq!(h, rest.rsplit_once(' ').map_or(rest, |x| x.0));
                out.push_str("# HELP ");
                out.push_str(&name);
                out.push(' ');
                out.push_str(text);
                out.push('\n');
            }
            out.push_str("# TYPE ");
            out.push_str(&name);
            out.push(' ');
            out.push_str(kind);
            out.push('\n');
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The registry every page starts from: the standard `process_*` families (no prefix) and
/// `penstock_build_info`. Returns the root; metrics of penstock go into
/// `root.sub_registry_with_prefix("penstock")`.
fn base_registry() -> Registry {
    let mut root = Registry::default();
    root.register_collector(Box::new(ProcessCollector));
    root.sub_registry_with_prefix("penstock").register(
        "build",
        "The running build: its version (value 1)",
        Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
    );
    root
}

/// Every metric of the server, cheap to clone handles inside (prometheus-client metrics are
/// `Arc`s).
pub struct Metrics {
    registry: Mutex<Registry>,
    pub requests: Family<RequestLabels, Counter>,
    pub bytes: Family<ClassPath, Counter>,
    pub request_duration: HistogramFamily<ClassLabel>,
    pub time_to_first_byte: HistogramFamily<ClassLabel>,
    pub connections: Gauge,
    pub connections_refused: Counter,
    pub accept_failures: Family<AcceptErrorLabel, Counter>,
    pub accept_pauses: Family<ListenerLabel, Counter>,
    /// TLS handshakes completed, by data path (`ktls`, `tls-user`).
    pub tls_handshakes: Family<TlsPathLabel, Counter>,
    pub streams_active: Gauge,
    pub admission_refusals: Family<ResourceLabel, Counter>,
    pub errors: Family<Kind, Counter>,
    pub lateness: HistogramFamily<ClassLabel>,
    pub deadline_misses: Family<ClassLabel, Counter>,
    /// Access log lines handed to the writer.
    pub access_log_lines: Counter,
    /// Access log lines dropped because the writer's queue was full (module doc of
    /// `access_log`).
    pub access_log_dropped: Counter,
    /// Failed writes of the access log (the lines of such a write are lost).
    pub access_log_write_errors: Counter,
    /// RTSP sessions now (set up, playing or paused).
    pub rtsp_sessions: Gauge,
    pub rtsp_sessions_ended: Family<ReasonLabel, Counter>,
    pub rtsp_requests: Family<RtspRequestLabels, Counter>,
    /// RTCP receiver reports about the server's RTP streams, per class.
    pub rtcp_reports: Family<ClassLabel, Counter>,
    /// RTP packets the receivers reported lost (increases of their cumulative counts).
    pub rtcp_packets_lost: Family<ClassLabel, Counter>,
    /// The interarrival jitter of each receiver report.
    pub rtcp_jitter: HistogramFamily<ClassLabel>,
    /// Datagrams of each RTSP live source, by outcome.
    pub live_datagrams: Family<LiveLabels, Counter>,
    /// Sessions subscribed to each live source now.
    pub live_sessions: Family<SourceLabel, Gauge>,
    /// A live source's segmented recording (`record = { dir, … }`): bytes on disk (media and
    /// tracks, the open segment included), segments kept, segments deleted by retention, and
    /// the oldest kept segment's start (seconds since the Unix epoch).
    pub recording_bytes: Family<SourceLabel, Gauge>,
    pub recording_segments: Family<SourceLabel, Gauge>,
    pub recording_deletions: Family<SourceLabel, Counter>,
    pub recording_oldest: Family<SourceLabel, Gauge>,
    /// HLS playlists answered (made here), by kind: `media` (`PATH/index.m3u8`) or `master`.
    pub hls_playlists: Family<Kind, Counter>,
    /// HLS segment requests: range GETs of a TS file (what a playlist's `EXT-X-BYTERANGE`
    /// segments are).
    pub hls_segments: Counter,
    /// HLS viewer sessions open now (`sessions = true` locations; docs/hls.md).
    pub hls_sessions: Gauge,
    /// HLS sessions admitted (new, or a known id re-admitted after it idled out).
    pub hls_sessions_admitted: Counter,
    /// HLS sessions refused (`sessions_max`, per address, or the engine's admission).
    pub hls_sessions_refused: Counter,
    /// HLS sessions ended by idling (`[hls] session_idle_ms`): their reservation given back.
    pub hls_sessions_expired: Counter,
    pub hls_sessions_revoked: Counter,
    /// Viewer credential checks, by kind and result (docs/security.md "Viewers").
    pub auth_checks: Family<AuthLabels, Counter>,
    /// Per tenant: viewer streams in its share, refusals, bytes (HTTP, HLS, RTSP).
    pub tenant_sessions: Family<TenantLabel, Gauge>,
    pub tenant_refusals: Family<TenantLabel, Counter>,
    pub tenant_bytes: Family<TenantLabel, Counter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut root = base_registry();
        let r = root.sub_registry_with_prefix("penstock");
        r.register_collector(Box::new(PeerLogCollector));
        let requests = Family::<RequestLabels, Counter>::default();
        r.register(
            "http_requests",
            "HTTP requests answered (or cut), by class, data path and status class",
            requests.clone(),
        );
        let bytes = Family::<ClassPath, Counter>::default();
        r.register(
            "http_body_bytes",
            "HTTP body bytes sent, by class and data path",
            bytes.clone(),
        );
        let request_duration: HistogramFamily<ClassLabel> =
            Family::new_with_constructor(http_seconds_histogram);
        r.register(
            "http_request_duration_seconds",
            "From the first byte of a request head to the last byte of its response handed to the kernel (or the cut)",
            request_duration.clone(),
        );
        let time_to_first_byte: HistogramFamily<ClassLabel> =
            Family::new_with_constructor(http_seconds_histogram);
        r.register(
            "http_time_to_first_byte_seconds",
            "From the first byte of a request head to the first byte of its response sent",
            time_to_first_byte.clone(),
        );
        let connections = Gauge::default();
        r.register(
            "http_connections",
            "Open HTTP connections",
            connections.clone(),
        );
        let connections_refused = Counter::default();
        r.register(
            "http_connections_refused",
            "Connections refused at connections_max",
            connections_refused.clone(),
        );
        let accept_failures = Family::<AcceptErrorLabel, Counter>::default();
        r.register(
            "accept_failures",
            "Failed accept calls, by listener and errno",
            accept_failures.clone(),
        );
        let tls_handshakes = Family::<TlsPathLabel, Counter>::default();
        r.register(
            "tls_handshakes",
            "TLS handshakes completed, by the data path planned for the connection: ktls (keys in the kernel, sendfile kept) or tls-user (rustls encrypts)",
            tls_handshakes.clone(),
        );
        let accept_pauses = Family::<ListenerLabel, Counter>::default();
        r.register(
            "accept_pauses",
            "Times a listener stopped accepting for accept_backoff_ms (EMFILE, ENFILE, ENOBUFS, ENOMEM)",
            accept_pauses.clone(),
        );
        let streams_active = Gauge::default();
        r.register(
            "streams_active",
            "Streams running in the engine (HTTP bodies and control streams)",
            streams_active.clone(),
        );
        let admission_refusals = Family::<ResourceLabel, Counter>::default();
        for resource in REFUSAL_RESOURCES {
            let _ = admission_refusals.get_or_create(&ResourceLabel {
                resource: resource.into(),
            });
        }
        r.register(
            "admission_refusals",
            "OPENs refused by admission control or the access rules, by the resource that was short",
            admission_refusals.clone(),
        );
        let errors = Family::<Kind, Counter>::default();
        r.register("errors", "Errors by kind", errors.clone());
        let lateness: HistogramFamily<ClassLabel> =
            Family::new_with_constructor(lateness_histogram);
        let deadline_misses = Family::<ClassLabel, Counter>::default();
        for class in ENGINE_CLASSES {
            let l = ClassLabel {
                class: class.into(),
            };
            let _ = lateness.get_or_create(&l);
            let _ = deadline_misses.get_or_create(&l);
        }
        r.register(
            "stream_lateness_seconds",
            "Lateness of the units of paced streams, by disk class (bounds: 2^13 ns x 4^n)",
            lateness.clone(),
        );
        r.register(
            "deadline_misses",
            "Units of paced streams later than their miss threshold (default one period), by disk class",
            deadline_misses.clone(),
        );
        let access_log_lines = Counter::default();
        r.register(
            "access_log_lines",
            "Access log lines handed to the log writer",
            access_log_lines.clone(),
        );
        let access_log_dropped = Counter::default();
        r.register(
            "access_log_dropped_lines",
            "Access log lines dropped because the log writer fell behind (its queue was full)",
            access_log_dropped.clone(),
        );
        let access_log_write_errors = Counter::default();
        r.register(
            "access_log_write_errors",
            "Failed writes of the access log",
            access_log_write_errors.clone(),
        );
        let rtsp_sessions = Gauge::default();
        r.register(
            "rtsp_sessions",
            "RTSP sessions now (set up, playing or paused)",
            rtsp_sessions.clone(),
        );
        let rtsp_sessions_ended = Family::<ReasonLabel, Counter>::default();
        r.register(
            "rtsp_sessions_ended",
            "RTSP sessions ended, by reason: teardown, timeout, connection_closed, shutdown, kicked (the API), revoked (the viewer's token, [auth] deny_file)",
            rtsp_sessions_ended.clone(),
        );
        let rtsp_requests = Family::<RtspRequestLabels, Counter>::default();
        r.register(
            "rtsp_requests",
            "RTSP requests answered, by method and status code",
            rtsp_requests.clone(),
        );
        let rtcp_reports = Family::<ClassLabel, Counter>::default();
        r.register(
            "rtcp_receiver_reports",
            "RTCP reception report blocks received about the server's RTP streams, by class",
            rtcp_reports.clone(),
        );
        let rtcp_packets_lost = Family::<ClassLabel, Counter>::default();
        r.register(
            "rtcp_packets_lost",
            "RTP packets the receivers reported lost, by class",
            rtcp_packets_lost.clone(),
        );
        let rtcp_jitter: HistogramFamily<ClassLabel> =
            Family::new_with_constructor(jitter_histogram);
        r.register(
            "rtcp_jitter_seconds",
            "Interarrival jitter of the RTP packets in each receiver report, by class",
            rtcp_jitter.clone(),
        );
        let live_datagrams = Family::<LiveLabels, Counter>::default();
        r.register(
            "rtsp_live_datagrams",
            "Datagrams of each RTSP live source, by outcome: in (received), garbage (not TS, dropped), dropped (from slow sessions' queues), record_dropped (the recorder's queue was full)",
            live_datagrams.clone(),
        );
        let live_sessions = Family::<SourceLabel, Gauge>::default();
        r.register(
            "rtsp_live_sessions",
            "Sessions receiving each RTSP live source now",
            live_sessions.clone(),
        );
        let recording_bytes = Family::<SourceLabel, Gauge>::default();
        r.register(
            "recording_bytes",
            "Bytes a live source's segmented recording takes on disk (media and tracks, the segment being written included)",
            recording_bytes.clone(),
        );
        let recording_segments = Family::<SourceLabel, Gauge>::default();
        r.register(
            "recording_segments",
            "Segments a live source's segmented recording keeps (the one being written included)",
            recording_segments.clone(),
        );
        let recording_deletions = Family::<SourceLabel, Counter>::default();
        r.register(
            "recording_deletions",
            "Segments of a live source's recording deleted by retention (keep, max_bytes)",
            recording_deletions.clone(),
        );
        let recording_oldest = Family::<SourceLabel, Gauge>::default();
        r.register(
            "recording_oldest_start_seconds",
            "Start of the oldest segment a live source's recording keeps, seconds since the Unix epoch",
            recording_oldest.clone(),
        );
        let hls_playlists = Family::<Kind, Counter>::default();
        for kind in ["media", "master", "dash"] {
            let _ = hls_playlists.get_or_create(&Kind { kind: kind.into() });
        }
        r.register(
            "hls_playlist_requests",
            "HLS playlists answered (made by the server), by kind: media (PATH/index.m3u8) or master (DIR/master.m3u8)",
            hls_playlists.clone(),
        );
        let hls_segments = Counter::default();
        r.register(
            "hls_segment_requests",
            "HLS segment requests: range GETs of a TS file",
            hls_segments.clone(),
        );
        let hls_sessions = Gauge::default();
        r.register(
            "hls_sessions",
            "HLS viewer sessions open now (locations with sessions = true)",
            hls_sessions.clone(),
        );
        let hls_sessions_admitted = Counter::default();
        r.register(
            "hls_sessions_admitted",
            "HLS viewer sessions admitted by the engine's admission control",
            hls_sessions_admitted.clone(),
        );
        let hls_sessions_refused = Counter::default();
        r.register(
            "hls_sessions_refused",
            "HLS viewer sessions refused (503): hls.sessions_max, hls.sessions_per_address_max or admission",
            hls_sessions_refused.clone(),
        );
        let hls_sessions_expired = Counter::default();
        r.register(
            "hls_sessions_expired",
            "HLS viewer sessions ended by idling (hls.session_idle_ms), their reservation given back",
            hls_sessions_expired.clone(),
        );
        let hls_sessions_revoked = Counter::default();
        r.register(
            "hls_sessions_revoked",
            "HLS viewer sessions ended because their JWT's jti was put on [auth] deny_file",
            hls_sessions_revoked.clone(),
        );
        let auth_checks = Family::<AuthLabels, Counter>::default();
        r.register(
            "auth_checks",
            "Viewer credential checks, by kind (signed: a signed URL; session: an HLS segment's session token) and result (ok, missing, malformed, expired, unknown_kid, bad_signature, address)",
            auth_checks.clone(),
        );
        let tenant_sessions = Family::<TenantLabel, Gauge>::default();
        r.register(
            "tenant_sessions",
            "Viewer streams holding a part of each tenant's rt share ([tenants.NAME], a JWT's tenant claim): HLS sessions, RTSP sessions, paced downloads",
            tenant_sessions.clone(),
        );
        let tenant_refusals = Family::<TenantLabel, Counter>::default();
        r.register(
            "tenant_refusals",
            "Viewer streams refused per tenant (HLS, RTSP, paced downloads: its rt_share full, or the server's capacity)",
            tenant_refusals.clone(),
        );
        let tenant_bytes = Family::<TenantLabel, Counter>::default();
        r.register(
            "tenant_bytes",
            "Media bytes sent to a tenant's viewers (HTTP bodies and HLS segments as answered, RTSP sessions when they end)",
            tenant_bytes.clone(),
        );
        Metrics {
            registry: Mutex::new(root),
            auth_checks,
            tenant_sessions,
            tenant_refusals,
            tenant_bytes,
            hls_playlists,
            hls_segments,
            hls_sessions,
            hls_sessions_admitted,
            hls_sessions_refused,
            hls_sessions_expired,
            hls_sessions_revoked,
            live_datagrams,
            live_sessions,
            recording_bytes,
            recording_segments,
            recording_deletions,
            recording_oldest,
            rtsp_sessions,
            rtsp_sessions_ended,
            rtsp_requests,
            rtcp_reports,
            rtcp_packets_lost,
            rtcp_jitter,
            requests,
            bytes,
            request_duration,
            time_to_first_byte,
            connections,
            connections_refused,
            accept_failures,
            accept_pauses,
            tls_handshakes,
            streams_active,
            admission_refusals,
            errors,
            lateness,
            deadline_misses,
            access_log_lines,
            access_log_dropped,
            access_log_write_errors,
        }
    }

    /// Adds the cluster's families (module doc) for node `node`.
    pub fn register_cluster(&self, node: &str) -> ClusterMetrics {
        let m = ClusterMetrics::default();
        let mut root = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        let r = root.sub_registry_with_prefix("penstock");
        r.register(
            "node",
            "This node's name in the cluster",
            Info::new(vec![("node", node.to_string())]),
        );
        r.register(
            "cluster_membership",
            "1 while this node's etcd lease is held and refreshed, 0 while membership is lost",
            m.membership.clone(),
        );
        r.register(
            "cluster_last_refresh_timestamp_seconds",
            "Unix time of the last membership refresh that reached etcd (0: none yet); the membership used since is that old",
            m.last_refresh.clone(),
        );
        r.register(
            "cluster_etcd_failures",
            "Calls to etcd that failed (unreachable, timed out, refused)",
            m.etcd_failures.clone(),
        );
        r.register(
            "cluster_nodes",
            "Nodes in the last membership listing read from etcd",
            m.nodes.clone(),
        );
        r.register(
            "cluster_redirects",
            "Stream opens refused here by admission and redirected to another node",
            m.redirects.clone(),
        );
        m
    }

    /// Registers more metrics under the `penstock_` prefix (the origin's, when it is on).
    pub(crate) fn register_with(&self, f: impl FnOnce(&mut Registry)) {
        f(self
            .registry
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .sub_registry_with_prefix("penstock"));
    }

    /// Reads `engine`'s pool, repossessions and disk queues at each scrape from now on.
    pub fn watch_engine(&self, engine: Arc<Engine>) {
        self.registry
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .sub_registry_with_prefix("penstock")
            .register_collector(Box::new(EngineCollector { engine }));
    }

    /// Adds the units counted since `seen` by a stream's live lateness counts to `class`
    /// (`rt` or `bulk`), and makes `seen` the new counts.
    pub fn add_lateness(&self, class: &str, now: &LatenessCounts, seen: &mut LatenessCounts) {
        let l = ClassLabel {
            class: class.into(),
        };
        add_lateness(
            &self.lateness.get_or_create(&l),
            &self.deadline_misses.get_or_create(&l),
            now,
            seen,
        );
    }

    /// Brings a live source's counters up to `now` (`seen`: what was added before, in the
    /// order in, garbage, dropped, record_dropped) and sets its sessions gauge.
    pub fn live_source(&self, source: &str, now: [u64; 4], seen: &mut [u64; 4], sessions: usize) {
        for (i, outcome) in ["in", "garbage", "dropped", "record_dropped"]
            .into_iter()
            .enumerate()
        {
            let c = self.live_datagrams.get_or_create(&LiveLabels {
                source: source.into(),
                outcome: outcome.into(),
            });
            if now[i] > seen[i] {
                c.inc_by(now[i] - seen[i]);
                seen[i] = now[i];
            }
        }
        self.live_sessions
            .get_or_create(&SourceLabel {
                source: source.into(),
            })
            .set(i64::try_from(sessions).unwrap_or(i64::MAX));
    }

    /// A live source's segmented recording's figures, as its recorder last set them.
    pub fn recording(&self, source: &str, stats: &penstock_driver::record::RecordStats) {
        use std::sync::atomic::Ordering;
        let label = SourceLabel {
            source: source.into(),
        };
        let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.recording_bytes
            .get_or_create(&label)
            .set(gauge(stats.bytes()));
        self.recording_segments
            .get_or_create(&label)
            .set(gauge(stats.segments.load(Ordering::Acquire)));
        self.recording_oldest
            .get_or_create(&label)
            .set(gauge(stats.oldest_unix_s.load(Ordering::Acquire)));
        let c = self.recording_deletions.get_or_create(&label);
        let now = stats.deletions.load(Ordering::Acquire);
        c.inc_by(now.saturating_sub(c.get()));
    }

    /// Counts an RTSP session's end.
    pub fn rtsp_session_ended(&self, reason: &str) {
        self.rtsp_sessions_ended
            .get_or_create(&ReasonLabel {
                reason: reason.into(),
            })
            .inc();
    }

    /// Counts an RTSP request's reply.
    pub fn rtsp_request(&self, method: &str, code: u16) {
        self.rtsp_requests
            .get_or_create(&RtspRequestLabels {
                method: method.into(),
                code: code.to_string(),
            })
            .inc();
    }

    /// A new receiver report of a stream of `class`: its jitter observed, the loss it adds
    /// to `lost_seen` (the stream's last cumulative count) counted.
    pub fn rtcp_report(
        &self,
        class: &str,
        stats: &penstock_core::rtp::ReceiverStats,
        lost_seen: &mut i64,
    ) {
        let l = ClassLabel {
            class: class.into(),
        };
        self.rtcp_reports.get_or_create(&l).inc();
        self.rtcp_jitter
            .get_or_create(&l)
            .observe(stats.jitter_ns() as f64 / 1e9);
        let lost = i64::from(stats.cumulative_lost);
        if lost > *lost_seen {
            self.rtcp_packets_lost
                .get_or_create(&l)
                .inc_by(u64::try_from(lost - *lost_seen).unwrap_or(0));
            *lost_seen = lost;
        }
    }

    /// Counts one error of `kind` (a short stable name: `bad_request`, `idle_timeout`, ...).
    /// Counts one HLS playlist request of `kind` (`media` or `master`).
    pub fn hls_playlist(&self, kind: &str) {
        self.hls_playlists
            .get_or_create(&Kind {
                kind: kind.to_string(),
            })
            .inc();
    }

    pub fn error(&self, kind: &str) {
        self.errors
            .get_or_create(&Kind {
                kind: kind.to_string(),
            })
            .inc();
    }

    /// Counts one failed accept on `listener` with `error` (an errno name, lower case).
    pub fn accept_failed(&self, listener: &str, error: &str) {
        self.accept_failures
            .get_or_create(&AcceptErrorLabel {
                listener: listener.to_string(),
                error: error.to_string(),
            })
            .inc();
    }

    /// Counts one pause of `listener`'s accepting.
    pub fn accept_paused(&self, listener: &str) {
        self.accept_pauses
            .get_or_create(&ListenerLabel {
                listener: listener.to_string(),
            })
            .inc();
    }

    /// Counts one answered (or cut) request: its status, body bytes and duration.
    pub fn request(
        &self,
        class: &str,
        data_path: &str,
        status_code: u16,
        body_bytes: u64,
        duration: Duration,
    ) {
        self.requests
            .get_or_create(&RequestLabels {
                class: class.to_string(),
                data_path: data_path.to_string(),
                code: status_class(status_code).to_string(),
            })
            .inc();
        self.bytes
            .get_or_create(&ClassPath {
                class: class.to_string(),
                data_path: data_path.to_string(),
            })
            .inc_by(body_bytes);
        self.request_duration
            .get_or_create(&ClassLabel {
                class: class.to_string(),
            })
            .observe(duration.as_secs_f64());
    }

    /// The first byte of a response of `class` went out `ttfb` after its request began.
    pub fn first_byte(&self, class: &str, ttfb: Duration) {
        self.time_to_first_byte
            .get_or_create(&ClassLabel {
                class: class.to_string(),
            })
            .observe(ttfb.as_secs_f64());
    }

    /// The OpenMetrics text (ends with `# EOF`).
    pub fn encode(&self) -> String {
        render_registry(&self.registry, Format::OpenMetrics)
    }
}

impl MetricsPage for Metrics {
    fn render(&self, format: Format) -> String {
        render_registry(&self.registry, format)
    }
}

/// Adds what `now` counts beyond `seen` to `hist` and `misses`; `seen` becomes `now`.
fn add_lateness(
    hist: &Histogram,
    misses: &Counter,
    now: &LatenessCounts,
    seen: &mut LatenessCounts,
) {
    for (i, (&n, s)) in now.buckets.iter().zip(seen.buckets.iter_mut()).enumerate() {
        let v = bucket_value_s(i);
        for _ in 0..n.saturating_sub(*s) {
            hist.observe(v);
        }
        *s = n;
    }
    misses.inc_by(now.misses.saturating_sub(seen.misses));
    seen.misses = now.misses;
}

/// The peer-log limiter's suppressed lines ([`crate::peer_log`]), read at each scrape.
#[derive(Debug)]
struct PeerLogCollector;

impl Collector for PeerLogCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut m = encoder.encode_descriptor(
            "peer_log_suppressed_lines",
            "Warning lines a peer's behaviour caused that the log rate limiter suppressed, by kind",
            None,
            MetricType::Counter,
        )?;
        for (kind, n) in crate::peer_log::global().suppressed_totals() {
            let labels = [("kind", kind)];
            ConstCounter::new(n).encode(m.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// The engine's figures, read at each scrape.
#[derive(Debug)]
struct EngineCollector {
    engine: Arc<Engine>,
}

/// Encodes one family of one sample, its type from the metric.
fn one(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric: impl EncodeMetric,
) -> Result<(), std::fmt::Error> {
    let kind = metric.metric_type();
    metric.encode(encoder.encode_descriptor(name, help, None, kind)?)
}

impl Collector for EngineCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let u = self.engine.buffer_usage();
        let gauge = |n: u64| ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX));
        let mut m = encoder.encode_descriptor(
            "engine_buffers",
            "The engine's buffer pool: total, reserved (admitted rt), rt_in_use, bulk_borrowed",
            None,
            MetricType::Gauge,
        )?;
        for (state, n) in [
            ("total", u.buffers_total),
            ("reserved", u.reserved),
            ("rt_in_use", u.rt_in_use),
            ("bulk_borrowed", u.bulk_borrowed),
        ] {
            let labels = [("state", state)];
            gauge(n).encode(m.encode_family(&labels)?)?;
        }
        let mut m = encoder.encode_descriptor(
            "engine_buffer_pool_bytes",
            "The engine's buffer pools, all workers: current (grown on demand, shrunk back when idle) and max (what [buffers] pool_max_bytes lets them grow to)",
            None,
            MetricType::Gauge,
        )?;
        for (state, n) in [
            ("current", u.buffers_total * u.buffer_bytes),
            ("max", u.buffers_max * u.buffer_bytes),
        ] {
            let labels = [("state", state)];
            gauge(n).encode(m.encode_family(&labels)?)?;
        }
        one(
            &mut encoder,
            "engine_buffer_pool_grown",
            "Buffers added to the pools when a stream found none free",
            ConstCounter::new(u.grown),
        )?;
        one(
            &mut encoder,
            "engine_buffer_pool_shrunk",
            "Buffers taken out of the pools after they were idle",
            ConstCounter::new(u.shrunk),
        )?;
        one(
            &mut encoder,
            "engine_buffer_repossessions",
            "Buffers bulk streams were made to give back to rt streams",
            ConstCounter::new(u.repossessions),
        )?;
        one(
            &mut encoder,
            "engine_buffer_rereads",
            "Full chunks given back before they were sent, read again",
            ConstCounter::new(u.reread_chunks),
        )?;
        one(
            &mut encoder,
            "volume_members_degraded",
            "Members of mirrored volumes that streams of this process found failing (read from the mirror since)",
            ConstCounter::new(
                penstock_driver::volume::DEGRADED_MEMBERS
                    .load(std::sync::atomic::Ordering::Relaxed),
            ),
        )?;
        let (failed, repaired, unrepaired) = penstock_driver::sums::counters();
        one(
            &mut encoder,
            "volume_checksum_failures",
            "4 KiB units of volume reads that failed their block checksum on a copy",
            ConstCounter::new(failed),
        )?;
        one(
            &mut encoder,
            "volume_checksum_repairs",
            "Of those, units rewritten in place from a copy that verified",
            ConstCounter::new(repaired),
        )?;
        one(
            &mut encoder,
            "volume_checksum_unrepaired",
            "Of those, units read from the other copy but not rewritten (member not writable here)",
            ConstCounter::new(unrepaired),
        )?;
        // Each worker's CPU policy, and its SCHED_DEADLINE runtime as the kernel has it now.
        let scheds = &self.engine.info().workers;
        let mut m = encoder.encode_descriptor(
            "worker_sched",
            "The engine's workers by role (timed: paced and rt streams, upcalls; general) and the CPU policy each got (1)",
            None,
            MetricType::Gauge,
        )?;
        for w in scheds {
            let index = w.index.to_string();
            let labels = [
                ("worker", index.as_str()),
                ("role", if w.timed { "timed" } else { "general" }),
                ("policy", w.policy.name()),
            ];
            gauge(1).encode(m.encode_family(&labels)?)?;
        }
        let mut m = encoder.encode_descriptor(
            "worker_sched_runtime_seconds",
            "A timed worker's SCHED_DEADLINE runtime per period now (sched_getattr)",
            None,
            MetricType::Gauge,
        )?;
        for w in scheds.iter().filter(|w| w.policy.name() == "deadline") {
            if let Ok(a) = penstock_driver::sched::thread_sched(w.tid) {
                let index = w.index.to_string();
                ConstGauge::new(a.runtime_ns as f64 / 1e9)
                    .encode(m.encode_family(&[("worker", index.as_str())])?)?;
            }
        }
        let mut m = encoder.encode_descriptor(
            "disk_queue_depth",
            "Disk reads queued in the engine's scheduler or in flight, per class",
            None,
            MetricType::Gauge,
        )?;
        for (class, n) in self.engine.disk_queue_depth_per_class() {
            let labels = [("class", class.as_str())];
            gauge(n).encode(m.encode_family(&labels)?)?;
        }
        let mut m = encoder.encode_descriptor(
            "disk_class_read_bytes",
            "Bytes read through the engine's disk scheduler, per class (rt, bulk, [disk.classes.NAME])",
            None,
            MetricType::Counter,
        )?;
        for (class, n) in self.engine.disk_served_bytes_per_class() {
            let labels = [("class", class.as_str())];
            ConstCounter::new(n).encode(m.encode_family(&labels)?)?;
        }
        one(
            &mut encoder,
            "admission_reservations",
            "Admission reservations held now (admitted rt streams and RTSP sessions set up)",
            gauge(self.engine.reservations().len() as u64),
        )?;
        // Admission: the share of each resource's rt capacity reserved (disk: the busiest
        // device), and each device's with the source of its figures.
        let (used, cap) = self.engine.admission_usage();
        let ratio =
            |u: u64, c: u64| ConstGauge::new(if c == 0 { 0.0 } else { u as f64 / c as f64 });
        let mut m = encoder.encode_descriptor(
            "admission_reserved_ratio",
            "Share of each resource's rt capacity reserved by admitted streams (disk: the busiest device)",
            None,
            MetricType::Gauge,
        )?;
        for (resource, u, c) in [
            ("disk", used.disk_ns_per_s, cap.disk_ns_per_s),
            ("network", used.net_bytes_per_s, cap.net_bytes_per_s),
            ("buffers", u64::from(used.buffers), u64::from(cap.buffers)),
            ("cpu", used.cpu_ns_per_s, cap.cpu_ns_per_s),
            ("network_burst", used.burst_net_bytes, cap.burst_net_bytes),
            ("cpu_burst", used.burst_cpu_ns, cap.burst_cpu_ns),
        ] {
            let labels = [("resource", resource)];
            ratio(u, c).encode(m.encode_family(&labels)?)?;
        }
        let mut m = encoder.encode_descriptor(
            "admission_device_reserved_ratio",
            "Share of a device's rt time reserved, by device and where its figures came from",
            None,
            MetricType::Gauge,
        )?;
        for d in self.engine.disk_usage() {
            let name = d.device.name();
            let labels = [
                ("device", name.as_str()),
                ("figures", d.figures.source.label()),
            ];
            ratio(d.used_ns_per_s, cap.disk_ns_per_s).encode(m.encode_family(&labels)?)?;
        }
        let mut m = encoder.encode_descriptor(
            "engine_moved_bytes",
            "Bytes the engine's streams that ended moved, by the mechanism whose call moved them \
             (copy_*, ring_read_buffered and ring_written_copied went through process memory)",
            None,
            MetricType::Counter,
        )?;
        for (how, n) in penstock_driver::MovedBytes::process_total().by_name() {
            let labels = [("how", how)];
            ConstCounter::new(n).encode(m.encode_family(&labels)?)?;
        }
        let f = self.engine.open_files();
        one(
            &mut encoder,
            "engine_open_files",
            "Files the engine holds open for streams: one descriptor each, shared by every stream of the file",
            gauge(f.files),
        )?;
        one(
            &mut encoder,
            "engine_open_file_shares",
            "Stream opens that shared the descriptor of a file already open for another stream, since start",
            ConstCounter::new(f.shares),
        )?;
        Ok(())
    }
}

/// The process's figures as the Prometheus client libraries name them, from `/proc/self`.
#[derive(Debug)]
struct ProcessCollector;

/// What `/proc/self/stat` and `/proc/stat` say about this process.
#[derive(Debug, Clone, Copy, PartialEq)]
struct ProcStat {
    cpu_s: f64,
    start_time_s: f64,
    virtual_bytes: u64,
    resident_bytes: u64,
    threads: u64,
}

/// Parses `/proc/self/stat` (after the command's closing parenthesis, fields from `state`
/// on) with the clock's ticks per second, the page size and the boot time (`btime`).
fn parse_proc_stat(stat: &str, ticks_per_s: u64, page_bytes: u64, boot_s: u64) -> Option<ProcStat> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // proc(5) numbers fields from 1 (pid); `state` is field 3, so field N is f[N - 3].
    let num = |n: usize| f.get(n - 3).and_then(|v| v.parse::<u64>().ok());
    let ticks = ticks_per_s.max(1) as f64;
    Some(ProcStat {
        cpu_s: (num(14)? + num(15)?) as f64 / ticks,
        threads: num(20)?,
        start_time_s: boot_s as f64 + num(22)? as f64 / ticks,
        virtual_bytes: num(23)?,
        resident_bytes: num(24)?.saturating_mul(page_bytes),
    })
}

fn boot_time_s() -> Option<u64> {
    std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stat = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| {
                parse_proc_stat(
                    &s,
                    rustix::param::clock_ticks_per_second(),
                    rustix::param::page_size() as u64,
                    boot_time_s()?,
                )
            });
        let gauge = |n: u64| ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX));
        if let Some(st) = stat {
            one(
                &mut encoder,
                "process_cpu_seconds",
                "User and system CPU time spent, seconds",
                ConstCounter::new(st.cpu_s),
            )?;
            one(
                &mut encoder,
                "process_resident_memory_bytes",
                "Resident memory size, bytes",
                gauge(st.resident_bytes),
            )?;
            one(
                &mut encoder,
                "process_virtual_memory_bytes",
                "Virtual memory size, bytes",
                gauge(st.virtual_bytes),
            )?;
            one(
                &mut encoder,
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch, seconds",
                ConstGauge::new(st.start_time_s),
            )?;
            one(
                &mut encoder,
                "process_threads",
                "Threads of the process",
                gauge(st.threads),
            )?;
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            // Less the one this listing holds.
            one(
                &mut encoder,
                "process_open_fds",
                "Open file descriptors",
                gauge((dir.count() as u64).saturating_sub(1)),
            )?;
        }
        if let Some(max) = rustix::process::getrlimit(rustix::process::Resource::Nofile).current {
            one(
                &mut encoder,
                "process_max_fds",
                "Maximum number of open file descriptors (the soft RLIMIT_NOFILE)",
                gauge(max),
            )?;
        }
        Ok(())
    }
}

/// What `penstock stream --metrics` or `penstock record --metrics` serves: the process,
/// the build and the command's own families.
pub struct CliMetrics {
    registry: Mutex<Registry>,
    lateness: HistogramFamily<ClassLabel>,
    deadline_misses: Family<ClassLabel, Counter>,
    stream_bytes: Counter,
    stream_units: Counter,
    record_packets: Counter,
    record_bytes: Counter,
    record_syncs: Counter,
    rtcp_reports: Counter,
    rtcp_fraction_lost: Gauge<f64, std::sync::atomic::AtomicU64>,
    rtcp_packets_lost: Gauge,
    rtcp_jitter_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    rtcp_rtt_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for CliMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CliMetrics")
    }
}

/// A stream's live figures as last fed to [`CliMetrics`].
#[derive(Debug, Clone, Default)]
pub struct StreamSeen {
    lateness: LatenessCounts,
    bytes: u64,
    units: u64,
}

impl CliMetrics {
    /// For `penstock stream`: lateness and misses by class (a burst stream counts none),
    /// bytes and units sent, and the engine's pool.
    pub fn stream(engine: Arc<Engine>) -> CliMetrics {
        let m = CliMetrics::empty();
        {
            let mut root = m.registry.lock().unwrap_or_else(|p| p.into_inner());
            let r = root.sub_registry_with_prefix("penstock");
            r.register(
                "stream_lateness_seconds",
                "Lateness of the units of the paced stream, by disk class (bounds: 2^13 ns x 4^n)",
                m.lateness.clone(),
            );
            r.register(
                "deadline_misses",
                "Units of the paced stream later than their miss threshold, by disk class",
                m.deadline_misses.clone(),
            );
            r.register(
                "stream_bytes",
                "Bytes the stream has sent",
                m.stream_bytes.clone(),
            );
            r.register(
                "stream_units",
                "Units the stream has sent",
                m.stream_units.clone(),
            );
            r.register_collector(Box::new(EngineCollector { engine }));
        }
        m
    }

    /// For `penstock record`: packets, bytes and sync points made durable.
    pub fn record() -> CliMetrics {
        let m = CliMetrics::empty();
        {
            let mut root = m.registry.lock().unwrap_or_else(|p| p.into_inner());
            let r = root.sub_registry_with_prefix("penstock");
            r.register(
                "record_packets",
                "Packets recorded and durable, as of the last sync point",
                m.record_packets.clone(),
            );
            r.register(
                "record_bytes",
                "Media bytes recorded and durable, as of the last sync point",
                m.record_bytes.clone(),
            );
            r.register(
                "record_syncs",
                "Sync points made durable (media, then tracks)",
                m.record_syncs.clone(),
            );
        }
        m
    }

    fn empty() -> CliMetrics {
        let lateness: HistogramFamily<ClassLabel> =
            Family::new_with_constructor(lateness_histogram);
        let deadline_misses = Family::<ClassLabel, Counter>::default();
        for class in ENGINE_CLASSES {
            let l = ClassLabel {
                class: class.into(),
            };
            let _ = lateness.get_or_create(&l);
            let _ = deadline_misses.get_or_create(&l);
        }
        CliMetrics {
            registry: Mutex::new(base_registry()),
            lateness,
            deadline_misses,
            stream_bytes: Counter::default(),
            stream_units: Counter::default(),
            record_packets: Counter::default(),
            record_bytes: Counter::default(),
            record_syncs: Counter::default(),
            rtcp_reports: Counter::default(),
            rtcp_fraction_lost: Gauge::default(),
            rtcp_packets_lost: Gauge::default(),
            rtcp_jitter_seconds: Gauge::default(),
            rtcp_rtt_seconds: Gauge::default(),
        }
    }

    /// Adds the RTCP receiver-report families (`penstock stream --rtp`): what the receivers
    /// said of the stream, as of their last report.
    pub fn register_rtcp(&self) {
        let mut root = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        let r = root.sub_registry_with_prefix("penstock");
        r.register(
            "rtcp_receiver_reports",
            "RTCP reception report blocks received about the stream",
            self.rtcp_reports.clone(),
        );
        r.register(
            "rtcp_fraction_lost_ratio",
            "Fraction of RTP packets lost since the previous receiver report, as of the last one",
            self.rtcp_fraction_lost.clone(),
        );
        r.register(
            "rtcp_packets_lost",
            "Cumulative RTP packets lost, as of the last receiver report",
            self.rtcp_packets_lost.clone(),
        );
        r.register(
            "rtcp_jitter_seconds",
            "Interarrival jitter of the RTP packets, as of the last receiver report",
            self.rtcp_jitter_seconds.clone(),
        );
        r.register(
            "rtcp_round_trip_seconds",
            "Round-trip time from the last receiver report naming a sender report",
            self.rtcp_rtt_seconds.clone(),
        );
    }

    /// The receivers' figures as the RTCP session has them now.
    pub fn feed_rtcp(&self, stats: &penstock_core::rtp::ReceiverStats) {
        self.rtcp_reports
            .inc_by(stats.reports.saturating_sub(self.rtcp_reports.get()));
        self.rtcp_fraction_lost.set(stats.fraction_lost_ratio());
        self.rtcp_packets_lost.set(i64::from(stats.cumulative_lost));
        self.rtcp_jitter_seconds.set(stats.jitter_ns() as f64 / 1e9);
        if let Some(rtt) = stats.rtt_ns {
            self.rtcp_rtt_seconds.set(rtt as f64 / 1e9);
        }
    }

    /// Adds what a stream of `class` (`rt` or `bulk`) did since `seen`.
    pub fn feed_stream(
        &self,
        class: &str,
        lateness: &LatenessCounts,
        bytes_sent: u64,
        units_sent: u64,
        seen: &mut StreamSeen,
    ) {
        let l = ClassLabel {
            class: class.into(),
        };
        add_lateness(
            &self.lateness.get_or_create(&l),
            &self.deadline_misses.get_or_create(&l),
            lateness,
            &mut seen.lateness,
        );
        self.stream_bytes
            .inc_by(bytes_sent.saturating_sub(seen.bytes));
        seen.bytes = seen.bytes.max(bytes_sent);
        self.stream_units
            .inc_by(units_sent.saturating_sub(seen.units));
        seen.units = seen.units.max(units_sent);
    }

    /// A recording's durable totals at a sync point (monotonic: the counters follow them).
    pub fn feed_record(&self, packets: u64, media_bytes: u64) {
        self.record_packets
            .inc_by(packets.saturating_sub(self.record_packets.get()));
        self.record_bytes
            .inc_by(media_bytes.saturating_sub(self.record_bytes.get()));
        self.record_syncs.inc();
    }
}

impl MetricsPage for CliMetrics {
    fn render(&self, format: Format) -> String {
        render_registry(&self.registry, format)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_openmetrics_and_prometheus_text() {
        let m = Metrics::new();
        m.request("bulk", "sendfile", 200, 10, Duration::from_millis(2));
        m.first_byte("bulk", Duration::from_micros(300));
        m.error("bad_request");
        let s = m.encode();
        assert!(
            s.contains(
                "penstock_http_requests_total{class=\"bulk\",data_path=\"sendfile\",code=\"2xx\"} 1"
            ),
            "{s}"
        );
        assert!(
            s.contains("penstock_errors_total{kind=\"bad_request\"} 1"),
            "{s}"
        );
        assert!(s.ends_with("# EOF\n"), "{s}");
        let t = m.render(Format::Text004);
        assert!(!t.contains("# EOF") && !t.contains("# UNIT"), "{t}");
        assert!(
            t.contains("# TYPE penstock_http_requests_total counter\n"),
            "{t}"
        );
        assert!(
            t.contains("# HELP penstock_http_requests_total HTTP requests"),
            "{t}"
        );
        assert!(t.contains("# TYPE penstock_build_info gauge\n"), "{t}");
        assert!(
            t.contains(&format!(
                "penstock_build_info{{version=\"{}\"}} 1\n",
                env!("CARGO_PKG_VERSION")
            )),
            "{t}"
        );
        assert!(
            t.contains("# TYPE penstock_http_request_duration_seconds histogram\n"),
            "{t}"
        );
        assert!(
            t.contains(
                "penstock_http_time_to_first_byte_seconds_bucket{le=\"0.0005\",class=\"bulk\"} 1"
            ),
            "{t}"
        );
        // Every HELP line is followed by the TYPE line of the same name.
        let lines: Vec<&str> = t.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if let Some(rest) = l.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap();
                assert!(
                    lines[i + 1].starts_with(&format!("# TYPE {name} ")),
                    "{l} / {}",
                    lines[i + 1]
                );
            }
        }
    }

    #[test]
    fn refusals_and_lateness_classes_are_present_at_zero_from_the_start() {
        let t = Metrics::new().render(Format::Text004);
        for r in REFUSAL_RESOURCES {
            assert!(
                t.contains(&format!(
                    "penstock_admission_refusals_total{{resource=\"{r}\"}} 0\n"
                )),
                "{r}: {t}"
            );
        }
        for c in ENGINE_CLASSES {
            assert!(
                t.contains(&format!(
                    "penstock_stream_lateness_seconds_count{{class=\"{c}\"}} 0\n"
                )),
                "{t}"
            );
            assert!(
                t.contains(&format!(
                    "penstock_deadline_misses_total{{class=\"{c}\"}} 0\n"
                )),
                "{t}"
            );
        }
        assert!(
            t.contains("penstock_access_log_dropped_lines_total 0\n"),
            "{t}"
        );
    }

    #[test]
    fn format_follows_accept() {
        assert_eq!(Format::from_accept(None), Format::Text004);
        assert_eq!(Format::from_accept(Some(b"*/*")), Format::Text004);
        assert_eq!(
            Format::from_accept(Some(
                b"application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
            )),
            Format::OpenMetrics
        );
        assert_eq!(
            Format::from_accept(Some(b"Application/OpenMetrics-Text")),
            Format::OpenMetrics
        );
    }

    #[test]
    fn process_stat_fields_are_read_from_the_right_places() {
        // A comm with spaces and a parenthesis, as proc(5) allows.
        let stat = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 7 0 1000 123456789 300 18446744073709551615";
        let s = parse_proc_stat(stat, 100, 4096, 1_700_000_000).unwrap();
        assert_eq!(s.cpu_s, 3.0);
        assert_eq!(s.threads, 7);
        assert_eq!(s.start_time_s, 1_700_000_010.0);
        assert_eq!(s.virtual_bytes, 123_456_789);
        assert_eq!(s.resident_bytes, 300 * 4096);
        assert_eq!(parse_proc_stat("garbage", 100, 4096, 0), None);
    }

    #[test]
    fn process_metrics_are_read_from_proc() {
        let t = Metrics::new().render(Format::Text004);
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_virtual_memory_bytes ",
            "process_start_time_seconds ",
            "process_open_fds ",
            "process_max_fds ",
            "process_threads ",
        ] {
            assert!(
                t.lines().any(|l| l.starts_with(name)),
                "{name} missing:\n{t}"
            );
        }
        let rss: f64 = t
            .lines()
            .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
            .unwrap()
            .parse()
            .unwrap();
        assert!(rss > 0.0, "{t}");
    }

    #[test]
    fn engine_lateness_buckets_land_in_their_histogram_bucket() {
        let m = Metrics::new();
        let mut seen = LatenessCounts::default();
        let mut now = LatenessCounts::default();
        // 5 µs late: engine bucket 13 ([4096, 8192) ns) → le=8.192e-6.
        now.buckets[penstock_driver::engine::lateness_bucket(5_000)] = 2;
        // 10 µs late: engine bucket 14 ([8192, 16384) ns) → le=3.2768e-5.
        now.buckets[penstock_driver::engine::lateness_bucket(10_000)] = 1;
        now.buckets[0] = 4;
        now.misses = 1;
        m.add_lateness("rt", &now, &mut seen);
        // Again with nothing new: nothing added.
        m.add_lateness("rt", &now, &mut seen);
        let s = m.encode();
        assert!(
            s.contains("penstock_stream_lateness_seconds_count{class=\"rt\"} 7"),
            "{s}"
        );
        assert!(
            s.contains(
                "penstock_stream_lateness_seconds_bucket{le=\"0.000008192\",class=\"rt\"} 6"
            ),
            "{s}"
        );
        assert!(
            s.contains(
                "penstock_stream_lateness_seconds_bucket{le=\"0.000032768\",class=\"rt\"} 7"
            ),
            "{s}"
        );
        assert!(
            s.contains("penstock_deadline_misses_total{class=\"rt\"} 1"),
            "{s}"
        );
        assert!(
            s.contains("penstock_stream_lateness_seconds_count{class=\"bulk\"} 0"),
            "{s}"
        );
    }

    #[test]
    fn cli_record_counters_follow_the_sync_points() {
        let m = CliMetrics::record();
        m.feed_record(10, 1000);
        m.feed_record(25, 2500);
        let t = m.render(Format::Text004);
        assert!(t.contains("penstock_record_packets_total 25\n"), "{t}");
        assert!(t.contains("penstock_record_bytes_total 2500\n"), "{t}");
        assert!(t.contains("penstock_record_syncs_total 2\n"), "{t}");
        assert!(t.contains("process_cpu_seconds_total "), "{t}");
        assert!(!t.contains("stream_lateness"), "{t}");
    }
}
