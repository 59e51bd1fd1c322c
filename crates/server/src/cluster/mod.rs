//! Membership in etcd (docs/cluster.md): a thread keeps this node's lease and record,
//! lists the other nodes for redirects, and revokes the lease at a graceful stop.
//!
//! The thread's loop, every `lease_ttl / 3`: keep the lease alive (`grant` when there is
//! none, `keepalive` else; a keepalive that finds the lease expired — etcd was unreachable
//! for longer than the TTL — grants a new one), put the record when it changed or is not in
//! the listing, list `PREFIX/nodes/` into the [`View`]. A failed call marks membership lost
//! (`penstock_cluster_membership 0`, a warning with the age of the membership in use;
//! `penstock_cluster_last_refresh_timestamp_seconds` says when it was read) and is retried after 250 ms, doubling to
//! `retry_max`; the node keeps serving, its `/healthz` unaffected, redirects use the last
//! listing. Every call has `etcd_timeout` as its deadline, and the loop's sleeps wake at
//! once on [`Membership::stop`], which then revokes the lease (one call, same deadline).

pub mod etcd;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use penstock_core::cluster::{NodeRecord, choose_redirect};

use crate::config::cluster::ClusterConfig;
use crate::metrics::{ClusterMetrics, ProtocolLabel};
use etcd::{Etcd, EtcdError};

/// What this node can still take, read when its record is refreshed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeLoad {
    pub rt_bytes_per_s: u64,
    pub rt_bytes_per_s_left: u64,
    pub streams: u32,
    pub streams_max: u32,
    /// The origin cache's bytes (`[origin]`, docs/origin.md); `None` without an origin.
    pub cache_bytes: Option<u64>,
}

/// The membership as last read, shared with the RTSP and control servers for redirects.
#[derive(Debug)]
pub struct View {
    pub node: String,
    redirect: bool,
    nodes: Mutex<Vec<NodeRecord>>,
    /// This node's fill key (published in its record): sent with its peer fills.
    fill_key: String,
    metrics: ClusterMetrics,
}

impl View {
    fn new(node: String, redirect: bool, fill_key: String, metrics: ClusterMetrics) -> View {
        View {
            node,
            redirect,
            nodes: Mutex::new(Vec::new()),
            fill_key,
            metrics,
        }
    }

    /// The nodes of the last listing (this one included when it is registered).
    pub fn nodes(&self) -> Vec<NodeRecord> {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_nodes(&self, nodes: Vec<NodeRecord>) {
        *self.nodes.lock().unwrap_or_else(|p| p.into_inner()) = nodes;
    }

    /// The value of the `Penstock-Fill` header this node sends with a peer fill:
    /// `NODE KEY`, its name and the fill key of its record.
    pub fn fill_credential(&self) -> String {
        format!("{} {}", self.node, self.fill_key)
    }

    /// Whether `credential` (a `Penstock-Fill` header) is a listed node's name and the fill
    /// key of its record: only then is a `?penstock-fill` honoured (docs/origin.md).
    pub fn is_member_fill(&self, credential: &str) -> bool {
        let Some((name, key)) = credential.split_once(' ') else {
            return false;
        };
        let nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        nodes.iter().any(|n| {
            n.name.as_str() == name
                && n.fill_key
                    .as_deref()
                    .is_some_and(|k| constant_time_eq(k.as_bytes(), key.as_bytes()))
        })
    }

    /// Where to send an RTSP open of `path` refused here: `HOST:PORT` of another node's
    /// RTSP server with `need_bytes_per_s` left, by the ring (counted in the metrics).
    pub fn redirect_rtsp(&self, path: &str, need_bytes_per_s: u64) -> Option<String> {
        self.redirect_to(path, need_bytes_per_s, "rtsp", |n| n.rtsp.clone())
    }

    /// As [`View::redirect_rtsp`] for a control `OPEN`: (node name, control `HOST:PORT`).
    pub fn redirect_control(&self, key: &str, need_bytes_per_s: u64) -> Option<(String, String)> {
        let mut name = String::new();
        let addr = self.redirect_to(key, need_bytes_per_s, "control", |n| {
            name = n.name.to_string();
            n.control.clone()
        })?;
        Some((name, addr))
    }

    /// The base URL of the node that fills `path` from the origin for the cluster, when that
    /// is another node ([`penstock_core::cluster::fill_owner`]): `https://HOST:PORT` where
    /// its record names an `https://` listener, else `http://HOST:PORT`.
    pub fn fill_peer(&self, path: &str) -> Option<String> {
        let nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        penstock_core::cluster::fill_owner(path, &self.node, &nodes).map(|n| match &n.https {
            Some(a) => format!("https://{a}"),
            None => format!("http://{}", n.http),
        })
    }

    fn redirect_to(
        &self,
        key: &str,
        need: u64,
        protocol: &str,
        mut addr: impl FnMut(&NodeRecord) -> Option<String>,
    ) -> Option<String> {
        if !self.redirect {
            return None;
        }
        let nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        let wants_rtsp = protocol == "rtsp";
        let to = choose_redirect(key, &self.node, &nodes, need, |n| {
            if wants_rtsp {
                n.rtsp.is_some()
            } else {
                n.control.is_some()
            }
        })?;
        let a = addr(to)?;
        self.metrics
            .redirects
            .get_or_create(&ProtocolLabel {
                protocol: protocol.into(),
            })
            .inc();
        Some(a)
    }
}

/// The running membership thread.
pub struct Membership {
    view: Arc<View>,
    stop: Arc<(Mutex<bool>, Condvar)>,
    lease: Arc<Mutex<Option<i64>>>,
    etcd: Etcd,
    thread: Option<JoinHandle<()>>,
    stopped: AtomicBool,
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership")
            .field("node", &self.view.node)
            .finish()
    }
}

/// Where this node is reached, as published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addresses {
    pub http: String,
    /// The first `https://` listener (peer fills come there over TLS).
    pub https: Option<String>,
    pub rtsp: Option<String>,
    pub control: Option<String>,
}

impl Membership {
    /// Starts the thread; returns at once (etcd may be down: the node serves anyway).
    pub fn start(
        cfg: &ClusterConfig,
        node: String,
        addrs: Addresses,
        load: Box<dyn Fn() -> NodeLoad + Send>,
        metrics: ClusterMetrics,
    ) -> Result<Membership, EtcdError> {
        let etcd = Etcd::with_tls(
            &cfg.etcd,
            Duration::from_millis(cfg.etcd_timeout_ms),
            &etcd::EtcdTls::of(cfg),
        )?;
        let view = Arc::new(View::new(
            node.clone(),
            cfg.redirect,
            new_fill_key().map_err(EtcdError::Spawn)?,
            metrics,
        ));
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let lease = Arc::new(Mutex::new(None));
        let mut keeper = Keeper {
            etcd: etcd.clone(),
            cfg: cfg.clone(),
            node,
            addrs,
            load,
            view: view.clone(),
            lease: lease.clone(),
            last_put: None,
        };
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("cluster".into())
            .spawn(move || keeper.run(&s))
            .map_err(EtcdError::Spawn)?;
        Ok(Membership {
            view,
            stop,
            lease,
            etcd,
            thread: Some(thread),
            stopped: AtomicBool::new(false),
        })
    }

    pub fn view(&self) -> Arc<View> {
        self.view.clone()
    }

    /// Graceful stop: ends the thread and revokes the lease, so that the node leaves the
    /// membership now rather than a TTL later. Idempotent.
    pub fn stop(&mut self) {
        if self.stopped.swap(true, Ordering::AcqRel) {
            return;
        }
        {
            let (m, c) = &*self.stop;
            *m.lock().unwrap_or_else(|p| p.into_inner()) = true;
            c.notify_all();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let lease = self.lease.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(id) = lease {
            match self.etcd.revoke(id) {
                Ok(()) => {
                    tracing::info!(node = %self.view.node, "left the cluster (lease revoked)")
                }
                Err(e) => tracing::warn!(
                    node = %self.view.node,
                    error = %e,
                    "could not revoke the lease: the node leaves the membership when it expires"
                ),
            }
        }
        self.view.metrics.membership.set(0);
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Keeper {
    etcd: Etcd,
    cfg: ClusterConfig,
    node: String,
    addrs: Addresses,
    load: Box<dyn Fn() -> NodeLoad + Send>,
    view: Arc<View>,
    lease: Arc<Mutex<Option<i64>>>,
    /// The record as last put under the current lease.
    last_put: Option<String>,
}

const RETRY_FIRST: Duration = Duration::from_millis(250);

impl Keeper {
    fn run(&mut self, stop: &(Mutex<bool>, Condvar)) {
        let period = Duration::from_millis(self.cfg.lease_ttl_ms / 3);
        let retry_max = Duration::from_millis(self.cfg.retry_max_ms);
        let mut retry = RETRY_FIRST;
        let mut lost_since_logged = false;
        let mut last_ok: Option<std::time::Instant> = None;
        loop {
            let wait = match self.turn() {
                Ok(()) => {
                    last_ok = Some(std::time::Instant::now());
                    let unix_s = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0.0, |d| d.as_secs_f64());
                    self.view.metrics.last_refresh.set(unix_s);
                    if lost_since_logged {
                        tracing::info!(node = %self.node, "cluster membership restored");
                        lost_since_logged = false;
                    }
                    self.view.metrics.membership.set(1);
                    retry = RETRY_FIRST;
                    period
                }
                Err(e) => {
                    self.view.metrics.membership.set(0);
                    self.view.metrics.etcd_failures.inc();
                    // How old the membership in use is (none read yet: `never`).
                    let stale = last_ok.map_or_else(
                        || "never read".to_string(),
                        |t| format!("{:.1}s", t.elapsed().as_secs_f64()),
                    );
                    tracing::warn!(
                        node = %self.node,
                        error = %e,
                        retry_ms = retry.as_millis() as u64,
                        membership_age = %stale,
                        "cluster membership lost: still serving, with the last membership read; retrying"
                    );
                    lost_since_logged = true;
                    let w = retry;
                    retry = (retry * 2).min(retry_max);
                    w
                }
            };
            let (m, c) = stop;
            let guard = m.lock().unwrap_or_else(|p| p.into_inner());
            let (guard, _) = c
                .wait_timeout_while(guard, wait, |stopped| !*stopped)
                .unwrap_or_else(|p| p.into_inner());
            if *guard {
                return;
            }
        }
    }

    fn record(&self) -> NodeRecord {
        let l = (self.load)();
        NodeRecord {
            name: penstock_core::cluster::NodeName::new(&self.node)
                .expect("the node name was checked at start"),
            http: self.addrs.http.clone(),
            rtsp: self.addrs.rtsp.clone(),
            control: self.addrs.control.clone(),
            rt_bytes_per_s: l.rt_bytes_per_s,
            rt_bytes_per_s_left: l.rt_bytes_per_s_left.min(l.rt_bytes_per_s),
            streams: l.streams,
            streams_max: l.streams_max,
            cache_bytes: l.cache_bytes,
            fill_key: Some(self.view.fill_key.clone()),
            https: self.addrs.https.clone(),
        }
    }

    /// One refresh: the lease, the record, the listing.
    fn turn(&mut self) -> Result<(), EtcdError> {
        let ttl_s = (self.cfg.lease_ttl_ms / 1000) as i64;
        let current = *self.lease.lock().unwrap_or_else(|p| p.into_inner());
        let id = match current {
            Some(id) => match self.etcd.keepalive(id)? {
                Some(_) => id,
                None => {
                    tracing::warn!(node = %self.node, "the lease expired (etcd out of reach longer than lease_ttl): granting a new one");
                    self.grant(ttl_s)?
                }
            },
            None => self.grant(ttl_s)?,
        };
        let key = self.cfg.node_key(&self.node);
        let text = self.record().encode();
        if self.last_put.as_deref() != Some(text.as_str()) {
            self.etcd.put(&key, text.as_bytes(), id)?;
            self.last_put = Some(text);
        }
        let (kvs, _) = self.etcd.range_prefix(&self.cfg.nodes_prefix())?;
        let mut nodes = Vec::with_capacity(kvs.len());
        for kv in kvs {
            match std::str::from_utf8(&kv.value)
                .map_err(|e| e.to_string())
                .and_then(|t| NodeRecord::decode(t).map_err(|e| e.0))
            {
                Ok(r) => nodes.push(r),
                Err(e) => {
                    tracing::warn!(key = %kv.key, error = %e, "a node record in etcd that cannot be read: skipped")
                }
            }
        }
        let listed = nodes.iter().any(|n| n.name.as_str() == self.node);
        self.view.metrics.nodes.set(nodes.len() as i64);
        self.view.set_nodes(nodes);
        if !listed {
            // Deleted from outside (etcdctl del): put again at the next turn.
            self.last_put = None;
        }
        Ok(())
    }

    fn grant(&mut self, ttl_s: i64) -> Result<i64, EtcdError> {
        let lease = self.etcd.grant(ttl_s)?;
        *self.lease.lock().unwrap_or_else(|p| p.into_inner()) = Some(lease.id);
        self.last_put = None;
        tracing::info!(node = %self.node, lease = lease.id, ttl_s = lease.ttl_s, "joined the cluster (lease granted)");
        Ok(lease.id)
    }
}

/// A new fill key: 128 random bits from the kernel, in hex.
fn new_fill_key() -> std::io::Result<String> {
    use std::io::Read;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Compares without stopping at the first difference (the time does not tell a prober how
/// much of a key it guessed).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use penstock_core::cluster::NodeName;

    fn node(name: &str, http: &str) -> NodeRecord {
        NodeRecord {
            name: NodeName::new(name).unwrap(),
            http: http.into(),
            rtsp: None,
            control: None,
            rt_bytes_per_s: 0,
            rt_bytes_per_s_left: 0,
            streams: 0,
            streams_max: 0,
            cache_bytes: None,
            fill_key: None,
            https: None,
        }
    }

    #[test]
    fn a_fill_is_honoured_only_with_a_listed_nodes_name_and_key() {
        let key = new_fill_key().unwrap();
        penstock_core::cluster::check_fill_key(&key).unwrap();
        assert_ne!(key, new_fill_key().unwrap(), "a new key per start");
        let v = View::new("a".into(), false, key.clone(), ClusterMetrics::default());
        let b_key = "0123456789abcdef0123456789abcdef";
        let mut b = node("b", "192.0.2.2:80");
        b.fill_key = Some(b_key.into());
        // Before any listing, nobody.
        assert!(!v.is_member_fill(&format!("b {b_key}")));
        let mut a = node("a", "192.0.2.1:80");
        a.fill_key = Some(key.clone());
        // c is listed but publishes no key (an older node): never honoured.
        v.set_nodes(vec![a, b.clone(), node("c", "192.0.2.3:80")]);
        assert!(v.is_member_fill(&format!("b {b_key}")));
        assert!(v.is_member_fill(&v.fill_credential()), "its own");
        for bad in [
            "".to_string(),
            "b".to_string(),
            format!("b {}", &b_key[..31]),
            format!("b {b_key}0"),
            format!("b {}", b_key.replace('0', "1")),
            format!("a {b_key}"),
            format!("c {b_key}"),
            "c -".to_string(),
            format!("d {b_key}"),
            format!("b  {b_key}"),
        ] {
            assert!(!v.is_member_fill(&bad), "{bad:?}");
        }
        // A node that leaves is no longer honoured.
        v.set_nodes(vec![node("a", "192.0.2.1:80")]);
        assert!(!v.is_member_fill(&format!("b {b_key}")));
    }
}
