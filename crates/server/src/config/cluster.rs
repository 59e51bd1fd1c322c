//! `[cluster]`: membership in etcd (docs/cluster.md). Off while `etcd` is empty.

use serde::{Deserialize, Serialize};

use super::{ConfigError, units};
use penstock_core::cluster::record::check_address;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// etcd's client URL (`http://HOST:PORT` or `https://HOST:PORT`, its v3 JSON gateway);
    /// empty: no cluster.
    pub etcd: String,
    /// With an `https://` etcd: the PEM certificates its certificate must chain to (unset:
    /// Mozilla's roots, built in).
    pub ca_file: Option<std::path::PathBuf>,
    /// With an `https://` etcd started with `--client-cert-auth`: this node's client
    /// certificate (PEM, the chain leaf first) and its key (PEM, mode 0600).
    pub cert_file: Option<std::path::PathBuf>,
    pub key_file: Option<std::path::PathBuf>,
    /// This node's name in the cluster (default: the host name).
    pub node: String,
    /// The HTTP address other nodes and HAProxy reach this node at (`http://HOST:PORT` or
    /// `HOST:PORT`; default: the first HTTP address bound, which must then not be a
    /// wildcard).
    pub advertise: String,
    /// The RTSP address redirected players are sent to (`HOST:PORT`; default: the
    /// advertised host with the bound RTSP port).
    pub rtsp_advertise: String,
    /// The control address redirected control clients are told (`HOST:PORT`; default: the
    /// advertised host with the bound control port).
    pub control_advertise: String,
    /// The lease's time to live: a node that stops refreshing it (crashed, cut off) leaves
    /// the membership this long after its last refresh. Whole seconds, 2 s ..= 1 h.
    #[serde(alias = "lease_ttl", deserialize_with = "units::ms")]
    pub lease_ttl_ms: u64,
    /// Keys live under `PREFIX/nodes/NAME`.
    pub prefix: String,
    /// Deadline of each call to etcd.
    #[serde(alias = "etcd_timeout", deserialize_with = "units::ms")]
    pub etcd_timeout_ms: u64,
    /// Longest wait between retries while etcd cannot be reached (the wait doubles from
    /// 250 ms up to this).
    #[serde(alias = "retry_max", deserialize_with = "units::ms")]
    pub retry_max_ms: u64,
    /// Answer stream opens this node cannot admit with a redirect to a node with capacity
    /// (RTSP 302, control `503 … redirect`); off: the refusal as without a cluster.
    pub redirect: bool,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            etcd: String::new(),
            ca_file: None,
            cert_file: None,
            key_file: None,
            node: String::new(),
            advertise: String::new(),
            rtsp_advertise: String::new(),
            control_advertise: String::new(),
            lease_ttl_ms: 5_000,
            prefix: "/penstock".into(),
            etcd_timeout_ms: 1_500,
            retry_max_ms: 5_000,
            redirect: true,
        }
    }
}

impl ClusterConfig {
    pub fn is_off(&self) -> bool {
        self.etcd.is_empty()
    }

    /// `advertise` as `HOST:PORT` (a `http://` and a trailing `/` dropped); `None` if empty.
    pub fn advertise_addr(&self) -> Option<String> {
        let a = self.advertise.trim();
        let a = a.strip_prefix("http://").unwrap_or(a).trim_end_matches('/');
        (!a.is_empty()).then(|| a.to_string())
    }

    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if self.is_off() {
            return Ok(());
        }
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let e = self.etcd.trim_end_matches('/');
        let https = e.starts_with("https://");
        if e.strip_prefix("http://")
            .or_else(|| e.strip_prefix("https://"))
            .is_none_or(|hp| check_address("etcd", hp).is_err())
        {
            return bad(format!(
                "cluster.etcd {:?}: http://HOST:PORT or https://HOST:PORT (etcd's client URL)",
                self.etcd
            ));
        }
        if !https && (self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some())
        {
            return bad(format!(
                "cluster.ca_file, cert_file and key_file are for an https:// etcd, not {:?}",
                self.etcd
            ));
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            return bad("cluster.cert_file and cluster.key_file go together".into());
        }
        if !self.node.is_empty() {
            penstock_core::cluster::NodeName::new(&self.node)
                .map_err(|e| ConfigError::Invalid(format!("cluster.node: {e}")))?;
        }
        if let Some(a) = self.advertise_addr() {
            check_address("cluster.advertise", &a).map_err(|e| ConfigError::Invalid(e.0))?;
        }
        for (k, v) in [
            ("cluster.rtsp_advertise", &self.rtsp_advertise),
            ("cluster.control_advertise", &self.control_advertise),
        ] {
            if !v.is_empty() {
                check_address(k, v).map_err(|e| ConfigError::Invalid(e.0))?;
            }
        }
        if !(2_000..=3_600_000).contains(&self.lease_ttl_ms)
            || !self.lease_ttl_ms.is_multiple_of(1000)
        {
            return bad(format!(
                "cluster.lease_ttl {} ms: whole seconds, 2s ..= 1h (etcd's TTLs are seconds)",
                self.lease_ttl_ms
            ));
        }
        if !self.prefix.starts_with('/')
            || self.prefix.len() > 200
            || self.prefix.chars().any(|c| c.is_control() || c == ' ')
        {
            return bad(format!(
                "cluster.prefix {:?}: a key path starting with /",
                self.prefix
            ));
        }
        if !(100..=60_000).contains(&self.etcd_timeout_ms) {
            return bad("cluster.etcd_timeout: 100ms ..= 60s".into());
        }
        if self.etcd_timeout_ms * 3 > self.lease_ttl_ms {
            return bad(format!(
                "cluster.etcd_timeout {} ms: at most a third of lease_ttl ({} ms), or one slow \
                 call would let the lease expire",
                self.etcd_timeout_ms, self.lease_ttl_ms
            ));
        }
        if !(250..=600_000).contains(&self.retry_max_ms) {
            return bad("cluster.retry_max: 250ms ..= 10min".into());
        }
        Ok(())
    }

    /// The key of node `name`'s record.
    pub fn node_key(&self, name: &str) -> String {
        format!("{}/nodes/{name}", self.prefix.trim_end_matches('/'))
    }

    /// The prefix of every node's key.
    pub fn nodes_prefix(&self) -> String {
        format!("{}/nodes/", self.prefix.trim_end_matches('/'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_cluster_settings_are_refused_with_the_key() {
        let good = ClusterConfig {
            etcd: "http://127.0.0.1:2379".into(),
            node: "edge-1".into(),
            ..ClusterConfig::default()
        };
        assert!(good.check().is_ok());
        let cases: Vec<(ClusterConfig, &str)> = vec![
            (
                ClusterConfig {
                    etcd: "ftp://x:1".into(),
                    ..good.clone()
                },
                "cluster.etcd",
            ),
            (
                ClusterConfig {
                    ca_file: Some("/ca.pem".into()),
                    ..good.clone()
                },
                "https:// etcd",
            ),
            (
                ClusterConfig {
                    etcd: "https://x:1".into(),
                    key_file: Some("/k.pem".into()),
                    ..good.clone()
                },
                "go together",
            ),
            (
                ClusterConfig {
                    node: "a b".into(),
                    ..good.clone()
                },
                "cluster.node",
            ),
            (
                ClusterConfig {
                    lease_ttl_ms: 1500,
                    ..good.clone()
                },
                "lease_ttl",
            ),
            (
                ClusterConfig {
                    lease_ttl_ms: 3000,
                    etcd_timeout_ms: 2000,
                    ..good.clone()
                },
                "a third",
            ),
            (
                ClusterConfig {
                    prefix: "x".into(),
                    ..good.clone()
                },
                "cluster.prefix",
            ),
            (
                ClusterConfig {
                    advertise: "http://nope".into(),
                    ..good.clone()
                },
                "cluster.advertise",
            ),
        ];
        for (c, says) in cases {
            let e = c.check().unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
        assert_eq!(
            ClusterConfig {
                advertise: "http://10.0.0.1:8080/".into(),
                ..good
            }
            .advertise_addr(),
            Some("10.0.0.1:8080".into())
        );
    }

    /// The commented `[cluster]` of docs/penstock.example.toml, uncommented, is a valid
    /// section with the defaults' TTL, timeouts and prefix.
    #[test]
    fn the_example_cluster_section_is_valid() {
        let ex = include_str!("../../../../docs/penstock.example.toml");
        let start = ex.find("# [cluster]").expect("a [cluster] example");
        let text: String = ex[start..]
            .lines()
            .map(|l| l.strip_prefix("# ").unwrap_or(l))
            .map(|l| format!("{l}\n"))
            .collect();
        let c: crate::ServerConfig = toml::from_str(&text).unwrap();
        c.cluster.check().unwrap();
        let d = ClusterConfig::default();
        assert_eq!(
            (
                c.cluster.lease_ttl_ms,
                c.cluster.etcd_timeout_ms,
                c.cluster.retry_max_ms
            ),
            (d.lease_ttl_ms, d.etcd_timeout_ms, d.retry_max_ms)
        );
        assert_eq!(c.cluster.prefix, d.prefix);
    }

    #[test]
    fn lease_ttl_takes_a_duration() {
        let c: ClusterConfig =
            toml::from_str("etcd = \"http://127.0.0.1:2379\"\nlease_ttl = \"5s\"\n").unwrap();
        assert_eq!(c.lease_ttl_ms, 5000);
    }
}
