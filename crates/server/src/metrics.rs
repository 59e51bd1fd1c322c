//! The server's metrics, served as OpenMetrics text at `GET /metrics`.
//!
//! Live now: requests and bytes by class and data path, connections, refused connections,
//! active streams (HTTP bodies in the engine and control streams), admission refusals by
//! resource, errors by kind, the buffers admission has reserved out of the pool.
//!
//! Periodic streams (control streams with RATE or SCHEDULE): `penstock_stream_lateness_seconds`
//! and `penstock_deadline_misses_total` are fed from the engine's live per-stream counts
//! ([`penstock_driver::StreamHandle::lateness`]) by the control reaper every few milliseconds
//! and when a stream ends. The engine counts lateness in power-of-two nanosecond buckets; the
//! histogram's bounds are powers of two nanoseconds too (8.192 µs × 4ⁿ), so every unit lands
//! in its true bucket (a lateness of exactly a bound may land one bucket up) and the sum is
//! within a factor of two. `penstock_disk_queue_depth` and `penstock_engine_buffers` (the
//! engine's pool: total, reserved, in use by rt, borrowed by bulk) are read from the engine at each
//! scrape, as are `penstock_engine_buffer_repossessions` (buffers bulk streams gave back to rt),
//! `penstock_engine_open_files` and `penstock_engine_open_file_shares_total` (the engine's
//! open-file table: files open for streams, and opens that shared an open file's descriptor).

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use penstock_driver::{
    BufferUsage, DiskQueueDepth, LATENESS_BUCKETS, LatenessCounts, OpenFileStats,
};

/// The lowest bound of the lateness histogram: 2^13 ns, so that every bound (×4) is a power
/// of two nanoseconds like the engine's buckets.
const LATENESS_BUCKET_MIN_S: f64 = 8192e-9;

/// The value a unit counted in the engine's lateness bucket `i` is observed as: 0 for on
/// time, the bucket's highest value `2^i - 1` ns otherwise (the open last bucket: its lowest).
fn bucket_value_s(i: usize) -> f64 {
    let ns = match i {
        0 => 0,
        i if i == LATENESS_BUCKETS - 1 => 1u64 << (i - 1),
        i => (1u64 << i) - 1,
    };
    ns as f64 * 1e-9
}

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
pub struct ListenerLabel {
    /// Whose listener: `http`.
    pub listener: String,
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
pub struct PoolLabel {
    /// `total`, `reserved`, `rt_in_use` or `bulk_borrowed` (the engine's pool).
    pub state: String,
}

/// Every metric, cheap to clone handles inside (prometheus-client metrics are `Arc`s).
pub struct Metrics {
    registry: Mutex<Registry>,
    pub requests: Family<ClassPath, Counter>,
    pub bytes: Family<ClassPath, Counter>,
    pub connections: Gauge,
    pub connections_refused: Counter,
    pub accept_failures: Family<AcceptErrorLabel, Counter>,
    pub accept_pauses: Family<ListenerLabel, Counter>,
    pub streams_active: Gauge,
    pub admission_refusals: Family<ResourceLabel, Counter>,
    pub errors: Family<Kind, Counter>,
    pub lateness: Histogram,
    pub deadline_misses: Counter,
    pub disk_queue_depth: Family<ClassLabel, Gauge>,
    pub engine_buffers: Family<PoolLabel, Gauge>,
    pub engine_repossessions: Gauge,
    /// The engine's open-file table: files open for streams (one descriptor each, shared).
    pub engine_open_files: Gauge,
    /// Opens the table saved: a stream's file was already open for another stream.
    pub engine_open_file_shares: Counter,
    /// The table's share count at the last scrape (the counter is moved by the difference).
    open_file_shares_seen: std::sync::atomic::AtomicU64,
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
        let accept_failures = Family::<AcceptErrorLabel, Counter>::default();
        r.register(
            "accept_failures",
            "Failed accept calls, by listener and errno",
            accept_failures.clone(),
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
        r.register(
            "admission_refusals",
            "OPENs refused by admission control, by the resource that was short",
            admission_refusals.clone(),
        );
        let errors = Family::<Kind, Counter>::default();
        r.register("errors", "Errors by kind", errors.clone());
        let lateness = Histogram::new(exponential_buckets(LATENESS_BUCKET_MIN_S, 4.0, 10));
        r.register(
            "stream_lateness_seconds",
            "Lateness of the units of periodic control streams (bounds: 2^13 ns x 4^n)",
            lateness.clone(),
        );
        let deadline_misses = Counter::default();
        r.register(
            "deadline_misses",
            "Units of periodic control streams later than their miss threshold (default one period)",
            deadline_misses.clone(),
        );
        let engine_buffers = Family::<PoolLabel, Gauge>::default();
        r.register(
            "engine_buffers",
            "The engine's buffer pool: total, reserved (admitted rt), rt_in_use, bulk_borrowed",
            engine_buffers.clone(),
        );
        let engine_repossessions = Gauge::default();
        r.register(
            "engine_buffer_repossessions",
            "Buffers bulk streams were made to give back to rt streams, since start",
            engine_repossessions.clone(),
        );
        let engine_open_files = Gauge::default();
        r.register(
            "engine_open_files",
            "Files the engine holds open for streams: one descriptor each, shared by every stream of the file",
            engine_open_files.clone(),
        );
        let engine_open_file_shares = Counter::default();
        r.register(
            "engine_open_file_shares",
            "Stream opens that shared the descriptor of a file already open for another stream, since start",
            engine_open_file_shares.clone(),
        );
        let disk_queue_depth = Family::<ClassLabel, Gauge>::default();
        r.register(
            "disk_queue_depth",
            "Disk reads queued in the engine's scheduler or in flight, per class",
            disk_queue_depth.clone(),
        );
        Metrics {
            registry: Mutex::new(r),
            requests,
            bytes,
            connections,
            connections_refused,
            accept_failures,
            accept_pauses,
            streams_active,
            admission_refusals,
            errors,
            lateness,
            deadline_misses,
            disk_queue_depth,
            engine_buffers,
            engine_repossessions,
            engine_open_files,
            engine_open_file_shares,
            open_file_shares_seen: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Adds the units counted since `seen` by a stream's live lateness counts, and makes
    /// `seen` the new counts.
    pub fn add_lateness(&self, now: &LatenessCounts, seen: &mut LatenessCounts) {
        for (i, (&n, s)) in now.buckets.iter().zip(seen.buckets.iter_mut()).enumerate() {
            let v = bucket_value_s(i);
            for _ in 0..n.saturating_sub(*s) {
                self.lateness.observe(v);
            }
            *s = n;
        }
        self.deadline_misses
            .inc_by(now.misses.saturating_sub(seen.misses));
        seen.misses = now.misses;
    }

    /// Sets the disk queue gauges.
    pub fn set_disk_queue_depth(&self, d: DiskQueueDepth) {
        for (class, n) in [("rt", d.rt), ("bulk", d.bulk)] {
            self.disk_queue_depth
                .get_or_create(&ClassLabel {
                    class: class.into(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Sets the engine's buffer pool gauges.
    pub fn set_engine_buffers(&self, u: BufferUsage) {
        for (state, n) in [
            ("total", u.buffers_total),
            ("reserved", u.reserved),
            ("rt_in_use", u.rt_in_use),
            ("bulk_borrowed", u.bulk_borrowed),
        ] {
            self.engine_buffers
                .get_or_create(&PoolLabel {
                    state: state.into(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.engine_repossessions
            .set(i64::try_from(u.repossessions).unwrap_or(i64::MAX));
    }

    /// Sets the open-file table's gauge and moves its counter up to the table's count.
    pub fn set_open_files(&self, f: OpenFileStats) {
        self.engine_open_files
            .set(i64::try_from(f.files).unwrap_or(i64::MAX));
        // fetch_max: two scrapes at once each add only what the other has not.
        let seen = self
            .open_file_shares_seen
            .fetch_max(f.shares, std::sync::atomic::Ordering::Relaxed);
        if f.shares > seen {
            self.engine_open_file_shares.inc_by(f.shares - seen);
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
        m.add_lateness(&now, &mut seen);
        // Again with nothing new: nothing added.
        m.add_lateness(&now, &mut seen);
        let s = m.encode();
        assert!(
            s.contains("penstock_stream_lateness_seconds_count 7"),
            "{s}"
        );
        assert!(
            s.contains("penstock_stream_lateness_seconds_bucket{le=\"0.000008192\"} 6"),
            "{s}"
        );
        assert!(
            s.contains("penstock_stream_lateness_seconds_bucket{le=\"0.000032768\"} 7"),
            "{s}"
        );
        assert!(s.contains("penstock_deadline_misses_total 1"), "{s}");
    }
}
