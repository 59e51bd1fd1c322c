//! The HAProxy configuration `penstock cluster haproxy-config` writes: one frontend, one
//! backend of every node in etcd, `balance uri` with `hash-type consistent` (so each path
//! lands on one node and is cached there) and `hash-balance-factor` (bounded loads: a node
//! above FACTOR% of the mean of active connections is skipped for the next on the ring), a
//! health check on each node's `/healthz`. Checked by HAProxy 2.6's `haproxy -c` in
//! `crates/penstock/tests/cluster.rs`.

use std::fmt::Write as _;

use super::record::{NodeRecord, RecordError, check_address};

/// What the rendered file says beyond the nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaproxyOptions {
    /// The frontend's `bind` (`HOST:PORT`).
    pub bind: String,
    /// `hash-balance-factor` (percent, ≥ 100; HAProxy's own bound is 100..=65535).
    pub balance_factor_percent: u32,
    /// The health check's path (a node answers 200 while it serves).
    pub health_path: String,
    /// `inter` of the checks; `fall` checks failed mark a node down, `rise` passed up.
    pub check_interval_ms: u64,
    pub check_fall: u32,
    pub check_rise: u32,
    pub timeout_connect_ms: u64,
    pub timeout_client_ms: u64,
    pub timeout_server_ms: u64,
    pub timeout_http_request_ms: u64,
    /// `maxconn` of the process (HAProxy needs about two descriptors a connection and
    /// refuses to start when it cannot raise RLIMIT_NOFILE that far).
    pub connections_max: u32,
}

impl Default for HaproxyOptions {
    fn default() -> Self {
        HaproxyOptions {
            bind: "127.0.0.1:8000".into(),
            balance_factor_percent: 150,
            health_path: "/healthz".into(),
            check_interval_ms: 1000,
            check_fall: 2,
            check_rise: 1,
            timeout_connect_ms: 5_000,
            timeout_client_ms: 60_000,
            timeout_server_ms: 60_000,
            timeout_http_request_ms: 10_000,
            connections_max: 4_096,
        }
    }
}

/// The configuration for `nodes` (sorted by name in the file, so that an unchanged
/// membership renders the same bytes). `source` is a comment line saying where it came from.
pub fn render(
    nodes: &[NodeRecord],
    o: &HaproxyOptions,
    source: &str,
) -> Result<String, RecordError> {
    check_address("bind", &o.bind)?;
    if !(100..=65535).contains(&o.balance_factor_percent) {
        return Err(RecordError(format!(
            "hash-balance-factor {}: 100 ..= 65535",
            o.balance_factor_percent
        )));
    }
    if !o.health_path.starts_with('/')
        || !o
            .health_path
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'#' && b != b'\\')
    {
        return Err(RecordError(format!(
            "health path {:?}: an absolute path without spaces",
            o.health_path
        )));
    }
    let mut sorted: Vec<&NodeRecord> = nodes.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let mut s = String::with_capacity(1024 + 64 * nodes.len());
    let source: String = source.chars().filter(|c| !c.is_control()).collect();
    // Writing to a String cannot fail.
    let _ = write!(
        s,
        "# Rendered by penstock cluster haproxy-config ({source}); rewritten when membership changes.\n\
         global\n\
         \x20   maxconn {maxconn}\n\
         \n\
         defaults\n\
         \x20   mode http\n\
         \x20   timeout connect {tc}ms\n\
         \x20   timeout client {tcl}ms\n\
         \x20   timeout server {ts}ms\n\
         \x20   timeout http-request {thr}ms\n\
         \n\
         frontend penstock\n\
         \x20   bind {bind}\n\
         \x20   default_backend penstock_nodes\n\
         \n\
         backend penstock_nodes\n\
         \x20   balance uri\n\
         \x20   hash-type consistent\n\
         \x20   hash-balance-factor {factor}\n\
         \x20   option httpchk GET {health}\n\
         \x20   http-check expect status 200\n\
         \x20   default-server inter {inter}ms fall {fall} rise {rise}\n",
        maxconn = o.connections_max.max(1),
        tc = o.timeout_connect_ms.max(1),
        tcl = o.timeout_client_ms.max(1),
        ts = o.timeout_server_ms.max(1),
        thr = o.timeout_http_request_ms.max(1),
        bind = o.bind,
        factor = o.balance_factor_percent,
        health = o.health_path,
        inter = o.check_interval_ms.max(1),
        fall = o.check_fall.max(1),
        rise = o.check_rise.max(1),
    );
    for n in sorted {
        // Name and address were checked when the record was read.
        let _ = writeln!(s, "    server {} {} check", n.name, n.http);
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::NodeName;
    use proptest::prelude::*;

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
    fn the_backend_hashes_the_uri_with_bounded_loads_and_checks_healthz() {
        let t = render(
            &[node("b", "127.0.0.3:80"), node("a", "127.0.0.2:80")],
            &HaproxyOptions::default(),
            "etcd revision 7",
        )
        .unwrap();
        for line in [
            "    balance uri\n",
            "    hash-type consistent\n",
            "    hash-balance-factor 150\n",
            "    option httpchk GET /healthz\n",
            "    server a 127.0.0.2:80 check\n    server b 127.0.0.3:80 check\n",
            "    bind 127.0.0.1:8000\n",
        ] {
            assert!(t.contains(line), "{line:?} in\n{t}");
        }
    }

    #[test]
    fn bad_options_are_refused() {
        let mut o = HaproxyOptions {
            balance_factor_percent: 99,
            ..HaproxyOptions::default()
        };
        assert!(render(&[], &o, "").is_err());
        o.balance_factor_percent = 150;
        o.health_path = "/a b".into();
        assert!(render(&[], &o, "").is_err());
        o.health_path = "/healthz".into();
        o.bind = "nowhere".into();
        assert!(render(&[], &o, "").is_err());
    }

    proptest! {
        /// The same membership in any order renders the same bytes (no reload for nothing),
        /// and a comment cannot inject a line.
        #[test]
        fn rendering_does_not_depend_on_order(n in 1usize..10, rot in 0usize..10, src in "(?s).{0,40}") {
            let mut nodes: Vec<NodeRecord> = (0..n).map(|i| node(&format!("n{i}"), &format!("10.0.0.{i}:8080"))).collect();
            let a = render(&nodes, &HaproxyOptions::default(), &src).unwrap();
            nodes.rotate_left(rot % n);
            let b = render(&nodes, &HaproxyOptions::default(), &src).unwrap();
            prop_assert_eq!(&a, &b);
            prop_assert_eq!(a.lines().filter(|l| l.trim_start().starts_with("server ")).count(), n);
            prop_assert!(a.lines().next().unwrap().starts_with('#'));
            prop_assert_eq!(a.lines().filter(|l| l.starts_with('#')).count(), 1);
        }
    }
}
