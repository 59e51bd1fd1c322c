//! Origin reads (issue 18, item 1; docs/origin.md): a GET or HEAD for a path missing beneath
//! the root is answered from the origin through a local cache of blocks.
//!
//! The decisions are the core's (`penstock_core::origin`): block geometry, the check of each
//! origin reply, the [`BlockTable`] (one fetch per block, LRU byte limit). This module does
//! the I/O around them:
//! - [`Origin::object`]: an object's size and validators, from the reply to its first
//!   block's request (which is kept as the block), revalidated with If-None-Match /
//!   If-Modified-Since after `revalidate_after`; one opener per object, the others wait.
//! - [`Origin::block`]: a block's file, fetched once whoever asks (a second reader waits for
//!   the first one's fetch: coalescing), written to a temporary file, its length checked,
//!   then renamed into place: a block file is complete or absent.
//! - [`Origin::read_ahead`]: the next blocks of a reader fetched in the background while a
//!   fetch place is free.
//! - `serve` (a thread per client request, started by the HTTP loop): the response head
//!   once the object is known, then each block sent as soon as it is cached.

mod fetch;
mod serve;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use penstock_core::http::Status;
use penstock_core::origin::block::Geometry;
use penstock_core::origin::table::{BlockTable, Want};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

pub(crate) use serve::{OriginEnd, OriginJob, TlsSession, run};

use crate::config::OriginConfig;

/// Why an object or a block could not be had from the origin; the status it maps to.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum OriginError {
    #[error("not found at the origin")]
    NotFound,
    #[error("the origin timed out: {0}")]
    Timeout(String),
    #[error("the origin failed: {0}")]
    Failed(String),
    #[error("the object changed at the origin while it was read")]
    Changed,
    #[error("the cache: {0}")]
    Cache(String),
}

impl OriginError {
    /// 404 for a missing object, 504 for a timeout, 502 for the rest.
    pub(crate) fn status(&self) -> Status {
        match self {
            OriginError::NotFound => Status::NOT_FOUND,
            OriginError::Timeout(_) => Status::GATEWAY_TIMEOUT,
            _ => Status::BAD_GATEWAY,
        }
    }
}

/// The origin's counters (registered in the server's registry by [`OriginMetrics::register`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct OriginMetrics {
    pub(crate) fetched_bytes: Counter,
    pub(crate) peer_fetched_bytes: Counter,
    pub(crate) fetches: Counter,
    pub(crate) fetch_failures: Counter,
    pub(crate) hits: Counter,
    pub(crate) misses: Counter,
    pub(crate) evictions: Counter,
    pub(crate) coalesced_waits: Counter,
    pub(crate) revalidations: Counter,
    pub(crate) changed: Counter,
    pub(crate) read_ahead: Counter,
    pub(crate) cache_write_failures: Counter,
    pub(crate) served_through: Counter,
    pub(crate) cache_bytes: Gauge,
}

impl OriginMetrics {
    pub(crate) fn register(&self, r: &mut Registry) {
        let c = |r: &mut Registry, name: &str, help: &str, m: &Counter| {
            r.register(name, help, m.clone())
        };
        c(
            r,
            "origin_fetched_bytes",
            "Body bytes received from the origin (blocks and their revalidations)",
            &self.fetched_bytes,
        );
        c(
            r,
            "origin_peer_fetched_bytes",
            "Body bytes of blocks received from the node that fills the path (fill_from_peers), not from the origin",
            &self.peer_fetched_bytes,
        );
        c(
            r,
            "origin_fetches",
            "Requests made to the origin",
            &self.fetches,
        );
        c(
            r,
            "origin_fetch_failures",
            "Origin requests that failed (error, timeout, short or garbled reply)",
            &self.fetch_failures,
        );
        c(
            r,
            "origin_cache_hits",
            "Blocks read from the cache",
            &self.hits,
        );
        c(
            r,
            "origin_cache_misses",
            "Blocks a client waited for that had to be fetched",
            &self.misses,
        );
        c(
            r,
            "origin_cache_evictions",
            "Blocks deleted to stay under cache_bytes_max",
            &self.evictions,
        );
        c(
            r,
            "origin_coalesced_waits",
            "Readers that waited for another reader's fetch of the same block or object instead of fetching it",
            &self.coalesced_waits,
        );
        c(
            r,
            "origin_revalidations",
            "Conditional requests made to the origin after revalidate_after",
            &self.revalidations,
        );
        c(
            r,
            "origin_objects_changed",
            "Objects whose validator changed at the origin (their blocks dropped)",
            &self.changed,
        );
        c(
            r,
            "origin_read_ahead",
            "Blocks fetched ahead of a reader",
            &self.read_ahead,
        );
        c(
            r,
            "origin_cache_write_failures",
            "Writes to the cache directory that failed (disk full): the block is served from memory, not cached",
            &self.cache_write_failures,
        );
        c(
            r,
            "origin_served_through",
            "Blocks served from memory without being cached (the cache's disk refused them)",
            &self.served_through,
        );
        r.register(
            "origin_cache_bytes",
            "Bytes of blocks in the cache",
            self.cache_bytes.clone(),
        );
    }
}

/// A block for a reader: its cached file, or its bytes when the disk refused them.
pub(crate) enum BlockData {
    File(File),
    Memory(Arc<Vec<u8>>),
}

/// What a fetch brought: a complete temporary file to keep, or bytes the disk refused.
enum Got {
    File(File, PathBuf, u64),
    Memory(Vec<u8>),
}

/// A block of one version of one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct BlockKey {
    object: u64,
    version: u64,
    block: u64,
}

/// What the origin said about an object.
#[derive(Debug)]
pub(crate) struct Object {
    /// The request's decoded path (`/a/b.ts`).
    path: String,
    id: u64,
    version: u64,
    pub(crate) size_bytes: u64,
    etag: Option<String>,
    last_modified: Option<String>,
    /// `Last-Modified`, or when it was first fetched (the client's validators are made from
    /// it and the size).
    pub(crate) mtime: SystemTime,
    /// The peer node (`HOST:PORT` of its HTTP server) this object's blocks come from, or
    /// `None`: the origin. Chosen when the object is opened; all its blocks come from there
    /// (validators are the source's).
    via: Option<String>,
    validated: Instant,
    /// Set when a block's reply showed the object changed: the next request revalidates.
    stale: AtomicBool,
}

impl Object {
    pub(crate) fn geometry(&self, block_bytes: u64) -> Geometry {
        Geometry::new(self.size_bytes, block_bytes)
    }
}

enum ObjectState {
    /// One reader is asking the origin; the others wait.
    Opening,
    Ready(Arc<Object>),
}

struct State {
    table: BlockTable<BlockKey>,
    objects: HashMap<String, ObjectState>,
    /// Why the last open of a path or fetch of a block failed, for the readers that waited
    /// for it (they answer that rather than try again at once). Bounded: cleared when full.
    object_failures: HashMap<String, OriginError>,
    block_failures: HashMap<BlockKey, OriginError>,
    next_id: u64,
}

/// The block number of an object's whole-file copy (`Origin::whole_file`), in the same
/// table and under the same byte limit as its blocks.
const WHOLE: u64 = u64::MAX;

/// Times a reader finds a cached block's file gone (evicted after the table answered) before
/// it gives up.
const OPENS_FAILED_MAX: u32 = 8;

/// Failures remembered for waiters, each map (see [`State`]).
const FAILURES_MAX: usize = 4096;

/// The origin, its cache and its limits; shared by the HTTP workers and the request threads.
pub(crate) struct Origin {
    source: fetch::Source,
    agent: ureq::Agent,
    pub(crate) block_bytes: u64,
    read_ahead_blocks: u64,
    attempts: u32,
    revalidate_after: Duration,
    /// How long a reader waits for another's fetch (the fetch's own timeouts bound it).
    wait_max: Duration,
    fetches_max: usize,
    pub(crate) requests_max: usize,
    blocks_dir: PathBuf,
    tmp_dir: PathBuf,
    state: Mutex<State>,
    changed: Condvar,
    fetches_running: Mutex<usize>,
    fetch_freed: Condvar,
    /// Client requests being served from the origin now.
    pub(crate) requests: AtomicUsize,
    tmp_seq: AtomicU64,
    pub(crate) metrics: OriginMetrics,
    fill_from_peers: bool,
    /// The cluster's membership (set once it started): who fills which path.
    cluster: std::sync::OnceLock<Arc<crate::cluster::View>>,
}

impl std::fmt::Debug for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Origin")
            .field("blocks_dir", &self.blocks_dir)
            .finish_non_exhaustive()
    }
}

/// A place among `fetches_max`, given back when dropped.
struct FetchPlace<'a>(&'a Origin);

impl Drop for FetchPlace<'_> {
    fn drop(&mut self) {
        *lock(&self.0.fetches_running) -= 1;
        self.0.fetch_freed.notify_one();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Origin {
    /// Checks the configuration's origin, empties and prepares the cache directory.
    pub(crate) fn start(cfg: &OriginConfig) -> Result<Origin, String> {
        let source = fetch::Source::new(cfg)?;
        let [dir, blocks_dir, tmp_dir] = cfg.cache_dirs().ok_or("origin.cache_dir is not set")?;
        // The cache does not outlive the process: what a previous run left (complete or
        // not) is not trusted.
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("emptying {}: {e}", dir.display())),
        }
        for d in [&blocks_dir, &tmp_dir] {
            std::fs::create_dir_all(d).map_err(|e| format!("creating {}: {e}", d.display()))?;
        }
        let mut tls = ureq::tls::TlsConfig::builder();
        if let Some(p) = &cfg.ca_file {
            tls = tls.root_certs(ureq::tls::RootCerts::Specific(Arc::new(ca_certificates(
                p,
            )?)));
        }
        let agent = ureq::Agent::config_builder()
            .tls_config(tls.build())
            .http_status_as_error(false)
            .timeout_connect(Some(cfg.connect_timeout()))
            .timeout_per_read(Some(cfg.timeout()))
            .timeout_send_request(Some(cfg.timeout()))
            .max_idle_connections_per_host(cfg.fetches_max)
            .max_idle_connections(cfg.fetches_max * 2)
            .user_agent(concat!("penstock/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Ok(Origin {
            source,
            agent,
            block_bytes: cfg.block_bytes,
            read_ahead_blocks: cfg.read_ahead_blocks,
            attempts: cfg.attempts,
            revalidate_after: cfg.revalidate_after(),
            // A wait outlives the fetch it waits for (connect, then reads that each have
            // the timeout, a block's worth): waking on its end is what ends it normally.
            wait_max: cfg.connect_timeout() + cfg.timeout() * 4,
            fetches_max: cfg.fetches_max,
            requests_max: cfg.requests_max,
            blocks_dir,
            tmp_dir,
            state: Mutex::new(State {
                table: BlockTable::new(cfg.cache_bytes_max),
                objects: HashMap::new(),
                object_failures: HashMap::new(),
                block_failures: HashMap::new(),
                next_id: 0,
            }),
            changed: Condvar::new(),
            fetches_running: Mutex::new(0),
            fetch_freed: Condvar::new(),
            requests: AtomicUsize::new(0),
            tmp_seq: AtomicU64::new(0),
            metrics: OriginMetrics::default(),
            fill_from_peers: cfg.fill_from_peers,
            cluster: std::sync::OnceLock::new(),
        })
    }

    /// A write to the cache directory failed: counted, said once.
    pub(super) fn cache_write_failed(&self, e: &std::io::Error) {
        self.metrics.cache_write_failures.inc();
        static SAID: AtomicBool = AtomicBool::new(false);
        if !SAID.swap(true, Ordering::Relaxed) {
            tracing::warn!(error = %e, dir = %self.tmp_dir.display(),
                "origin cache: a write failed (disk full?): blocks are served through without being cached (counted in penstock_origin_cache_write_failures_total)");
        }
    }

    fn block_path(&self, k: BlockKey) -> PathBuf {
        if k.block == WHOLE {
            return self
                .blocks_dir
                .join(format!("{}-{}-whole", k.object, k.version));
        }
        self.blocks_dir
            .join(format!("{}-{}-{}", k.object, k.version, k.block))
    }

    fn tmp_path(&self) -> PathBuf {
        self.tmp_dir
            .join(self.tmp_seq.fetch_add(1, Ordering::Relaxed).to_string())
    }

    /// A fetch place, waiting until `deadline` for one.
    fn fetch_place(&self, deadline: Instant) -> Result<FetchPlace<'_>, OriginError> {
        let mut n = lock(&self.fetches_running);
        while *n >= self.fetches_max {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(OriginError::Timeout(
                    "no free fetch place (fetches_max)".into(),
                ));
            }
            n = self
                .fetch_freed
                .wait_timeout(n, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        *n += 1;
        Ok(FetchPlace(self))
    }

    /// A fetch place if one is free now (read-ahead never waits).
    fn try_fetch_place(&self) -> Option<FetchPlace<'_>> {
        let mut n = lock(&self.fetches_running);
        (*n < self.fetches_max).then(|| {
            *n += 1;
            FetchPlace(self)
        })
    }

    fn wait<'a>(
        &self,
        st: MutexGuard<'a, State>,
        deadline: Instant,
    ) -> Result<MutexGuard<'a, State>, OriginError> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(OriginError::Timeout(
                "waited too long for another reader's fetch".into(),
            ));
        }
        Ok(self
            .changed
            .wait_timeout(st, left)
            .unwrap_or_else(|p| p.into_inner())
            .0)
    }

    /// Deletes evicted or dropped blocks' files (a reader that opened one keeps reading it).
    fn delete(&self, keys: &[BlockKey], evicted: bool) {
        for k in keys {
            let _ = std::fs::remove_file(self.block_path(*k));
        }
        if evicted {
            self.metrics.evictions.inc_by(keys.len() as u64);
        }
    }

    /// Moves a fetched block into the cache: renamed into place, then recorded (a block in
    /// the table always has its complete file). Returns the evicted and dropped blocks to
    /// delete once the lock is released.
    fn keep(&self, st: &mut State, key: BlockKey, tmp: &Path, bytes: u64) -> Vec<BlockKey> {
        if let Err(e) = std::fs::rename(tmp, self.block_path(key)) {
            tracing::warn!(error = %e, "origin cache: a fetched block could not be kept");
            let _ = std::fs::remove_file(tmp);
            st.table.failed(&key);
            return Vec::new();
        }
        let s = st.table.stored(&key, bytes);
        self.metrics.cache_bytes.set(st.table.bytes_cached() as i64);
        self.metrics.evictions.inc_by(s.evicted.len() as u64);
        let mut gone = s.evicted;
        if !s.kept {
            gone.push(key);
        }
        gone
    }

    /// In a cluster: the membership that says which node fills which path.
    pub(crate) fn set_cluster(&self, view: Arc<crate::cluster::View>) {
        let _ = self.cluster.set(view);
    }

    /// Whether `credential` (a `Penstock-Fill` header) names a node of the cluster and its
    /// fill key (never without a cluster).
    pub(crate) fn is_member_fill(&self, credential: &str) -> bool {
        self.cluster
            .get()
            .is_some_and(|v| v.is_member_fill(credential))
    }

    /// Where a new object at `path` is read from: the peer that fills it, or `None` (the
    /// origin: no cluster, `fill_from_peers` off, this node fills it, or `direct`).
    fn source_of(&self, path: &str, direct: bool) -> Option<String> {
        if direct || !self.fill_from_peers {
            return None;
        }
        self.cluster.get()?.fill_peer(path)
    }

    /// The object at `path` (the request's decoded path), known and fresh: from memory, or
    /// from the origin (its first block's request, which also caches that block).
    pub(crate) fn object(&self, path: &str) -> Result<Arc<Object>, OriginError> {
        self.object_from(path, false)
    }

    /// As [`Origin::object`]; `direct`: a new object is read from the origin itself, never
    /// from a peer (the request came from a peer filling from this node: no loops).
    pub(crate) fn object_from(&self, path: &str, direct: bool) -> Result<Arc<Object>, OriginError> {
        // The HTTP parser normalizes paths; RTSP's are only decoded: nothing that could
        // climb out of the origin's prefix goes there.
        if !path.starts_with('/')
            || path
                .split('/')
                .skip(1)
                .any(|s| s.is_empty() || s == "." || s == "..")
        {
            return Err(OriginError::NotFound);
        }
        let deadline = Instant::now() + self.wait_max;
        let mut st = lock(&self.state);
        let mut waited = false;
        loop {
            match st.objects.get(path) {
                Some(ObjectState::Ready(o))
                    if !o.stale.load(Ordering::Relaxed)
                        && o.validated.elapsed() < self.revalidate_after =>
                {
                    return Ok(o.clone());
                }
                Some(ObjectState::Opening) => {
                    if !waited {
                        self.metrics.coalesced_waits.inc();
                        waited = true;
                    }
                    st = self.wait(st, deadline)?;
                    continue;
                }
                None if waited => {
                    // The open waited for failed: its answer is this reader's too.
                    return Err(st.object_failures.get(path).cloned().unwrap_or_else(|| {
                        OriginError::Failed("the origin request this one waited for failed".into())
                    }));
                }
                _ => {}
            }
            let previous = match st.objects.remove(path) {
                Some(ObjectState::Ready(o)) => Some(o),
                _ => None,
            };
            let id = previous.as_ref().map_or_else(
                || {
                    st.next_id += 1;
                    st.next_id
                },
                |p| p.id,
            );
            st.objects.insert(path.to_string(), ObjectState::Opening);
            drop(st);
            let via = self.source_of(path, direct);
            let r = self.open(path, id, previous.as_deref(), deadline, via);
            st = lock(&self.state);
            let mut gone = Vec::new();
            let out = match r {
                Ok((object, first)) => {
                    let object = Arc::new(object);
                    if let Some(p) = &previous
                        && p.version != object.version
                    {
                        // A new version: the old one's blocks go.
                        let (id, version) = (p.id, object.version);
                        gone.extend(
                            st.table
                                .remove_where(|k| k.object == id && k.version != version),
                        );
                        self.metrics.cache_bytes.set(st.table.bytes_cached() as i64);
                    }
                    if let Some((tmp, bytes)) = first {
                        let key = BlockKey {
                            object: object.id,
                            version: object.version,
                            block: 0,
                        };
                        if st.table.claim(&key) {
                            gone.extend(self.keep(&mut st, key, &tmp, bytes));
                        } else {
                            let _ = std::fs::remove_file(&tmp);
                        }
                    }
                    st.object_failures.remove(path);
                    st.objects
                        .insert(path.to_string(), ObjectState::Ready(object.clone()));
                    Ok(object)
                }
                Err(e) => {
                    st.objects.remove(path);
                    if st.object_failures.len() >= FAILURES_MAX {
                        st.object_failures.clear();
                    }
                    st.object_failures.insert(path.to_string(), e.clone());
                    Err(e)
                }
            };
            drop(st);
            self.changed.notify_all();
            self.delete(&gone, false);
            return out;
        }
    }

    /// Asks the origin for the first block of `path` (conditionally when `previous` is
    /// known). The object, and the block's temporary file unless the origin said 304.
    fn open(
        &self,
        path: &str,
        id: u64,
        previous: Option<&Object>,
        deadline: Instant,
        via: Option<String>,
    ) -> Result<(Object, Option<(PathBuf, u64)>), OriginError> {
        let _place = self.fetch_place(deadline)?;
        if previous.is_some() {
            self.metrics.revalidations.inc();
        }
        let tmp = self.tmp_path();
        // Validators from another source (a peer's ETag, the origin's) say nothing here:
        // from a new source, the object is a new version.
        let comparable = previous.filter(|p| p.via == via);
        let r = fetch::fetch(self, path, 0, None, comparable, &tmp, via.as_deref());
        let now = Instant::now();
        match r {
            Ok(fetch::Fetched::NotModified) => {
                let p = comparable.expect("a conditional request has a previous object");
                Ok((
                    Object {
                        path: path.to_string(),
                        id,
                        version: p.version,
                        size_bytes: p.size_bytes,
                        etag: p.etag.clone(),
                        last_modified: p.last_modified.clone(),
                        mtime: p.mtime,
                        validated: now,
                        stale: AtomicBool::new(false),
                        via,
                    },
                    None,
                ))
            }
            Ok(fetch::Fetched::Block {
                size_bytes,
                body_bytes,
                etag,
                last_modified,
                memory,
            }) => {
                let same = comparable.filter(|p| {
                    p.size_bytes == size_bytes
                        && (p.etag.is_some() || p.last_modified.is_some())
                        && p.etag == etag
                        && p.last_modified == last_modified
                });
                if previous.is_some() && same.is_none() {
                    self.metrics.changed.inc();
                }
                let mtime = last_modified
                    .as_deref()
                    .and_then(|v| httpdate::parse_http_date(v).ok())
                    .or(same.map(|p| p.mtime))
                    .unwrap_or_else(SystemTime::now);
                let object = Object {
                    path: path.to_string(),
                    id,
                    version: match (previous, same) {
                        (_, Some(p)) => p.version,
                        (Some(p), None) => p.version + 1,
                        (None, _) => 0,
                    },
                    size_bytes,
                    etag,
                    last_modified,
                    mtime,
                    validated: now,
                    stale: AtomicBool::new(false),
                    via,
                };
                // Bytes the disk refused are not kept: block 0 is asked again when read.
                let first = (body_bytes > 0 && memory.is_none()).then_some((tmp, body_bytes));
                Ok((object, first))
            }
            Err(e) => Err(e),
        }
    }

    /// The file of block `block` of `object`, fetched if it is not cached (once, whoever
    /// else wants it: they wait for this fetch).
    pub(crate) fn block(&self, object: &Object, block: u64) -> Result<BlockData, OriginError> {
        let key = BlockKey {
            object: object.id,
            version: object.version,
            block,
        };
        let deadline = Instant::now() + self.wait_max;
        let mut waited = false;
        let mut st = lock(&self.state);
        // A block can be evicted between the table's answer and the open: ask again, a few
        // times (each time it was cached a moment ago). Waits are bounded by `deadline`.
        let mut opens_failed = 0;
        while opens_failed < OPENS_FAILED_MAX {
            if waited
                && !st.table.is_cached(&key)
                && let Some(e) = st.block_failures.get(&key)
            {
                return Err(e.clone());
            }
            match st.table.want(&key) {
                Want::Hit => {
                    drop(st);
                    match File::open(self.block_path(key)) {
                        Ok(f) => {
                            self.metrics.hits.inc();
                            return Ok(BlockData::File(f));
                        }
                        Err(_) => {
                            opens_failed += 1;
                            st = lock(&self.state);
                            st.table.remove(&key);
                        }
                    }
                }
                Want::Wait => {
                    if !waited {
                        self.metrics.coalesced_waits.inc();
                        waited = true;
                    }
                    st = self.wait(st, deadline)?;
                }
                Want::Fetch => {
                    drop(st);
                    self.metrics.misses.inc();
                    let r = self
                        .fetch_place(deadline)
                        .and_then(|_place| self.fetch_block(object, key));
                    return self.fetched(key, r);
                }
            }
        }
        Err(OriginError::Cache(
            "a block kept being evicted before it could be opened".into(),
        ))
    }

    /// Fetches one block (a fetch place held) into a temporary file.
    fn fetch_block(&self, object: &Object, key: BlockKey) -> Result<Got, OriginError> {
        let tmp = self.tmp_path();
        let via = object.via.as_deref();
        let fetched = fetch::fetch(self, &object.path, key.block, Some(object), None, &tmp, via);
        if fetched.is_err() && via.is_some() {
            // The filling node failed (stopped, gone): the next request opens the object
            // again, from whichever node fills it by then (or the origin), rather than
            // asking the same peer until the revalidation.
            object.stale.store(true, Ordering::Relaxed);
        }
        match fetched? {
            fetch::Fetched::Block {
                memory: Some(v), ..
            } => Ok(Got::Memory(v)),
            fetch::Fetched::Block { body_bytes, .. } => {
                let f = File::open(&tmp).map_err(|e| {
                    let _ = std::fs::remove_file(&tmp);
                    OriginError::Cache(e.to_string())
                })?;
                Ok(Got::File(f, tmp, body_bytes))
            }
            fetch::Fetched::NotModified => {
                let _ = std::fs::remove_file(&tmp);
                Err(OriginError::Failed(
                    "304 to an unconditional request".into(),
                ))
            }
        }
    }

    /// Records a fetch's end in the table and wakes the readers waiting for it.
    fn fetched(
        &self,
        key: BlockKey,
        r: Result<Got, OriginError>,
    ) -> Result<BlockData, OriginError> {
        let mut st = lock(&self.state);
        let (out, gone) = match r {
            Ok(Got::File(file, tmp, bytes)) => {
                st.block_failures.remove(&key);
                let gone = self.keep(&mut st, key, &tmp, bytes);
                (Ok(BlockData::File(file)), gone)
            }
            Ok(Got::Memory(v)) => {
                // Served through: absent again, the next reader fetches (while the disk is
                // full, every reader does).
                st.table.failed(&key);
                self.metrics.served_through.inc();
                (Ok(BlockData::Memory(Arc::new(v))), Vec::new())
            }
            Err(e) => {
                st.table.failed(&key);
                if st.block_failures.len() >= FAILURES_MAX {
                    st.block_failures.clear();
                }
                st.block_failures.insert(key, e.clone());
                if matches!(e, OriginError::Changed) {
                    // Seen by `fetch`: the next request for the object revalidates it.
                    for o in st.objects.values() {
                        if let ObjectState::Ready(o) = o
                            && o.id == key.object
                        {
                            o.stale.store(true, Ordering::Relaxed);
                        }
                    }
                }
                (Err(e), Vec::new())
            }
        };
        drop(st);
        self.changed.notify_all();
        self.delete(&gone, false);
        out
    }

    /// The whole object at `path` as one local file, for the users of a descriptor (RTSP
    /// plays a file): its blocks fetched (or found) as for HTTP, copied in order into a
    /// temporary file whose length is checked, renamed into place. Kept in the cache under
    /// the same LRU byte limit as blocks (one copy per object version; readers of the same
    /// object at once wait for one copy); a file larger than the limit is served and deleted.
    pub(crate) fn whole_file(self: &Arc<Self>, path: &str) -> Result<File, OriginError> {
        let object = self.object(path)?;
        let key = BlockKey {
            object: object.id,
            version: object.version,
            block: WHOLE,
        };
        let deadline = Instant::now() + self.wait_max;
        let mut st = lock(&self.state);
        let mut opens_failed = 0;
        while opens_failed < OPENS_FAILED_MAX {
            match st.table.want(&key) {
                Want::Hit => {
                    drop(st);
                    if let Ok(f) = File::open(self.block_path(key)) {
                        return Ok(f);
                    }
                    opens_failed += 1;
                    st = lock(&self.state);
                    st.table.remove(&key);
                }
                Want::Wait => st = self.wait(st, deadline)?,
                Want::Fetch => {
                    drop(st);
                    let r = self.assemble(&object);
                    return match self.fetched(key, r)? {
                        BlockData::File(f) => Ok(f),
                        BlockData::Memory(_) => unreachable!("assemble makes files only"),
                    };
                }
            }
        }
        Err(OriginError::Cache(
            "an object's copy kept being evicted before it could be opened".into(),
        ))
    }

    fn assemble(self: &Arc<Self>, object: &Arc<Object>) -> Result<Got, OriginError> {
        let tmp = self.tmp_path();
        let cache = |e: std::io::Error| OriginError::Cache(e.to_string());
        let r = (|| {
            let mut out = File::create(&tmp).map_err(cache)?;
            for b in 0..object.geometry(self.block_bytes).blocks() {
                match self.block(object, b)? {
                    BlockData::File(mut f) => std::io::copy(&mut f, &mut out).map(|_| ()),
                    BlockData::Memory(v) => std::io::Write::write_all(&mut out, &v),
                }
                .map_err(|e| {
                    self.cache_write_failed(&e);
                    cache(e)
                })?;
                self.read_ahead(object, b);
            }
            let len = out.metadata().map_err(cache)?.len();
            if len != object.size_bytes {
                return Err(OriginError::Cache(format!(
                    "the copy has {len} bytes, the object {}",
                    object.size_bytes
                )));
            }
            let f = File::open(&tmp).map_err(cache)?;
            Ok(Got::File(f, tmp.clone(), len))
        })();
        if r.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        r
    }

    /// Starts background fetches of the blocks after `block` (up to `read_ahead_blocks`)
    /// that are neither cached nor being fetched, while fetch places are free.
    pub(crate) fn read_ahead(self: &Arc<Self>, object: &Arc<Object>, block: u64) {
        for b in object
            .geometry(self.block_bytes)
            .read_ahead(block, self.read_ahead_blocks)
        {
            let key = BlockKey {
                object: object.id,
                version: object.version,
                block: b,
            };
            if lock(&self.state).table.is_cached(&key) {
                continue;
            }
            if self.try_fetch_place().map(std::mem::forget).is_none() {
                return;
            }
            // The place taken above is given back by the thread (or below).
            if !lock(&self.state).table.claim(&key) {
                drop(FetchPlace(self));
                continue;
            }
            let (me, obj) = (self.clone(), object.clone());
            let spawned = std::thread::Builder::new()
                .name("penstock-origin-ra".into())
                .spawn(move || {
                    let place = FetchPlace(&me);
                    me.metrics.read_ahead.inc();
                    let r = me.fetch_block(&obj, key);
                    drop(place);
                    let _ = me.fetched(key, r);
                });
            if spawned.is_err() {
                drop(FetchPlace(self));
                lock(&self.state).table.failed(&key);
                self.changed.notify_all();
                return;
            }
        }
    }
}

/// The certificates of `origin.ca_file` (PEM; other items, such as a key, are ignored): at
/// least one, or why not.
fn ca_certificates(path: &Path) -> Result<Vec<ureq::tls::Certificate<'static>>, String> {
    crate::tls::pem_certificates("origin.ca_file", path)
}
