//! The server's metrics, served as OpenMetrics text at `GET /metrics`.
//!
//! Live now: requests and bytes by class and data path, connections, refused connections,
//! active streams (HTTP bodies in the engine and control streams), admission refusals by
//! resource, errors by kind, the buffers admission has reserved out of the pool.
//!
//! Registered but not fed yet (their producers land with the periodic dispatcher and the
//! disk scheduler in the engine): `penstock_stream_lateness_seconds`,
//! `penstock_deadline_misses_total`, `penstock_disk_queue_depth`. They read zero.

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassPath {
    pub class: String,
    /// How the body moved: `sendfile` (the connection's loop), `engine-<path>`, `memory`
    /// (heads, errors, multipart part headers, metrics), `none` (HEAD, 304).
    pub path: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Kind {
    pub kind: String,
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
pub struct PoolLabel {
    /// `total` (rt capacity of the pool) or `reserved`.
    pub state: String,
}

/// Every metric, cheap to clone handles inside (prometheus-client metrics are `Arc`s).
pub struct Metrics {
    registry: Mutex<Registry>,
    pub requests: Family<ClassPath, Counter>,
    pub bytes: Family<ClassPath, Counter>,
    pub connections: Gauge,
    pub connections_refused: Counter,
    pub streams_active: Gauge,
    pub admission_refusals: Family<ResourceLabel, Counter>,
    pub errors: Family<Kind, Counter>,
    pub buffer_pool: Family<PoolLabel, Gauge>,
    pub lateness: Histogram,
    pub deadline_misses: Counter,
    pub disk_queue_depth: Family<ClassLabel, Gauge>,
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
        let mut r = Registry::with_prefix("penstock");
        let requests = Family::<ClassPath, Counter>::default();
        r.register(
            "http_requests",
            "HTTP requests answered, by class and data path",
            requests.clone(),
        );
        let bytes = Family::<ClassPath, Counter>::default();
        r.register(
            "http_body_bytes",
            "HTTP body bytes sent, by class and data path",
            bytes.clone(),
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
        let streams_active = Gauge::default();
        r.register(
            "streams_active",
            "Streams running in the engine (HTTP bodies and control streams)",
            streams_active.clone(),
        );
        let admission_refusals = Family::<ResourceLabel, Counter>::default();
        r.register(
            "admission_refusals",
            "OPENs refused by admission control, by the resource that was short",
            admission_refusals.clone(),
        );
        let errors = Family::<Kind, Counter>::default();
        r.register("errors", "Errors by kind", errors.clone());
        let buffer_pool = Family::<PoolLabel, Gauge>::default();
        r.register(
            "buffer_pool_buffers",
            "Pool buffers: rt capacity and reserved by admitted streams",
            buffer_pool.clone(),
        );
        let lateness = Histogram::new(exponential_buckets(1e-5, 4.0, 10));
        r.register(
            "stream_lateness_seconds",
            "Lateness of periodic units (not fed until periodic streams run in the engine)",
            lateness.clone(),
        );
        let deadline_misses = Counter::default();
        r.register(
            "deadline_misses",
            "Units sent after their deadline (not fed yet)",
            deadline_misses.clone(),
        );
        let disk_queue_depth = Family::<ClassLabel, Gauge>::default();
        r.register(
            "disk_queue_depth",
            "Disk requests queued per class (not fed until the disk scheduler runs in the engine)",
            disk_queue_depth.clone(),
        );
        Metrics {
            registry: Mutex::new(r),
            requests,
            bytes,
            connections,
            connections_refused,
            streams_active,
            admission_refusals,
            errors,
            buffer_pool,
            lateness,
            deadline_misses,
            disk_queue_depth,
        }
    }

    /// Counts one error of `kind` (a short stable name: `bad_request`, `idle_timeout`, ...).
    pub fn error(&self, kind: &str) {
        self.errors
            .get_or_create(&Kind {
                kind: kind.to_string(),
            })
            .inc();
    }

    /// Counts one answered request and its body bytes.
    pub fn request(&self, class: &str, path: &str, body_bytes: u64) {
        let l = ClassPath {
            class: class.to_string(),
            path: path.to_string(),
        };
        self.requests.get_or_create(&l).inc();
        self.bytes.get_or_create(&l).inc_by(body_bytes);
    }

    /// The OpenMetrics text (ends with `# EOF`).
    pub fn encode(&self) -> String {
        let mut s = String::with_capacity(4096);
        let r = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut s, &r);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_openmetrics() {
        let m = Metrics::new();
        m.request("bulk", "sendfile", 10);
        m.error("bad_request");
        let s = m.encode();
        assert!(
            s.contains("penstock_http_requests_total{class=\"bulk\",path=\"sendfile\"} 1"),
            "{s}"
        );
        assert!(
            s.contains("penstock_errors_total{kind=\"bad_request\"} 1"),
            "{s}"
        );
        assert!(s.ends_with("# EOF\n"), "{s}");
    }
}
