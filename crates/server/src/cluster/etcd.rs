//! A small client of etcd's v3 HTTP/JSON gateway (etcd 3.4: `POST /v3/…`, keys and values
//! base64, 64-bit integers as JSON strings in replies), blocking, through `ureq`.
//!
//! Why the gateway and not the `etcd-client` crate (docs/cluster.md): the whole need is
//! grant, put with a lease, keepalive, revoke and a prefix range — five one-shot POSTs — and
//! `etcd-client` would bring tonic, hyper and a tokio runtime into a server that has none.
//! Every call has a deadline ([`Etcd::new`]'s `timeout`, the whole call: connect, send,
//! reply); an answer larger than [`REPLY_BYTES_MAX`] is refused. `http://` or `https://`
//! (rustls through ureq: the server's certificate checked against `[cluster] ca_file`, else
//! Mozilla's roots; a client certificate where etcd asks for one, [`EtcdTls`]).

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};

/// Longest reply read from etcd (a range of many nodes' records stays far below).
pub const REPLY_BYTES_MAX: u64 = 8 << 20;

/// Why a call to etcd failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EtcdError {
    #[error("etcd endpoint {0:?}: not http://HOST:PORT or https://HOST:PORT")]
    BadEndpoint(String),
    #[error("etcd TLS: {0}")]
    Tls(String),
    #[error("etcd {path}: {source}")]
    Transport { path: String, source: ureq::Error },
    #[error("etcd {path}: HTTP {status}: {body}")]
    Status {
        path: String,
        status: u16,
        body: String,
    },
    #[error("etcd {path}: unexpected reply: {why}")]
    Reply { path: String, why: String },
    #[error("starting the membership thread: {0}")]
    Spawn(std::io::Error),
}

/// A lease: its id and the TTL etcd granted (seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub id: i64,
    pub ttl_s: i64,
}

/// One key read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    /// The lease the key is attached to (0: none).
    pub lease: i64,
    pub mod_revision: i64,
}

/// The client: an endpoint and a per-call deadline.
#[derive(Debug, Clone)]
pub struct Etcd {
    base: String,
    agent: ureq::Agent,
}

/// A 64-bit integer of a reply: grpc-gateway writes them as strings; a number is taken too.
fn int(v: &Value) -> Option<i64> {
    match v {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

/// TLS to an `https://` etcd: the CA its certificate chains to (`None`: Mozilla's roots,
/// built in) and a client certificate and key (PEM; the key mode 0600) for an etcd started
/// with `--client-cert-auth`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EtcdTls {
    pub ca_file: Option<std::path::PathBuf>,
    pub cert_file: Option<std::path::PathBuf>,
    pub key_file: Option<std::path::PathBuf>,
}

impl EtcdTls {
    pub fn is_empty(&self) -> bool {
        self == &EtcdTls::default()
    }

    /// `[cluster]`'s `ca_file`, `cert_file` and `key_file`.
    pub fn of(cfg: &crate::config::cluster::ClusterConfig) -> EtcdTls {
        EtcdTls {
            ca_file: cfg.ca_file.clone(),
            cert_file: cfg.cert_file.clone(),
            key_file: cfg.key_file.clone(),
        }
    }
}

impl Etcd {
    /// `endpoint`: `http://HOST:PORT` or `https://HOST:PORT` (a trailing `/` is dropped);
    /// an `https://` one's certificate is checked against Mozilla's roots.
    pub fn new(endpoint: &str, timeout: Duration) -> Result<Etcd, EtcdError> {
        Etcd::with_tls(endpoint, timeout, &EtcdTls::default())
    }

    /// [`Etcd::new`] with the TLS settings of `tls` (which an `http://` endpoint refuses:
    /// they would be ignored).
    pub fn with_tls(endpoint: &str, timeout: Duration, tls: &EtcdTls) -> Result<Etcd, EtcdError> {
        let base = endpoint.trim_end_matches('/');
        let (https, hp) = match (base.strip_prefix("https://"), base.strip_prefix("http://")) {
            (Some(hp), _) => (true, hp),
            (None, Some(hp)) => (false, hp),
            (None, None) => return Err(EtcdError::BadEndpoint(endpoint.to_string())),
        };
        if penstock_core::cluster::record::check_address("etcd", hp).is_err() {
            return Err(EtcdError::BadEndpoint(endpoint.to_string()));
        }
        if !https && !tls.is_empty() {
            return Err(EtcdError::Tls(format!(
                "{endpoint}: a CA or client certificate is set for a plain http:// etcd (write https://)"
            )));
        }
        let tls_config = crate::tls::client_config(
            "cluster",
            tls.ca_file.as_deref(),
            tls.cert_file.as_deref(),
            tls.key_file.as_deref(),
        )
        .map_err(EtcdError::Tls)?;
        let agent = ureq::Agent::config_builder()
            .tls_config(tls_config)
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            .build()
            .into();
        Ok(Etcd {
            base: base.to_string(),
            agent,
        })
    }

    pub fn endpoint(&self) -> &str {
        &self.base
    }

    fn call(&self, path: &str, body: &Value) -> Result<Value, EtcdError> {
        let mut resp = self
            .agent
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .send(body.to_string())
            .map_err(|source| EtcdError::Transport {
                path: path.into(),
                source,
            })?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .with_config()
            .limit(REPLY_BYTES_MAX)
            .read_to_string()
            .map_err(|source| EtcdError::Transport {
                path: path.into(),
                source,
            })?;
        if status != 200 {
            let mut body = text;
            body.truncate(300);
            return Err(EtcdError::Status {
                path: path.into(),
                status,
                body,
            });
        }
        serde_json::from_str(&text).map_err(|e| EtcdError::Reply {
            path: path.into(),
            why: e.to_string(),
        })
    }

    fn bad(path: &str, why: &str) -> EtcdError {
        EtcdError::Reply {
            path: path.into(),
            why: why.into(),
        }
    }

    /// `POST /v3/lease/grant`.
    pub fn grant(&self, ttl_s: i64) -> Result<Lease, EtcdError> {
        let p = "/v3/lease/grant";
        let v = self.call(p, &json!({ "TTL": ttl_s }))?;
        let id = v
            .get("ID")
            .and_then(int)
            .ok_or_else(|| Self::bad(p, "no ID"))?;
        let ttl_s = v
            .get("TTL")
            .and_then(int)
            .ok_or_else(|| Self::bad(p, "no TTL"))?;
        Ok(Lease { id, ttl_s })
    }

    /// `POST /v3/lease/keepalive` (one request, one reply): the TTL now, or `None` when the
    /// lease has expired or was revoked (etcd's reply then has no TTL).
    pub fn keepalive(&self, id: i64) -> Result<Option<i64>, EtcdError> {
        let p = "/v3/lease/keepalive";
        let v = self.call(p, &json!({ "ID": id }))?;
        let r = v.get("result").ok_or_else(|| Self::bad(p, "no result"))?;
        Ok(r.get("TTL").and_then(int).filter(|&t| t > 0))
    }

    /// `POST /v3/lease/revoke`: the lease and every key attached to it are gone at once.
    pub fn revoke(&self, id: i64) -> Result<(), EtcdError> {
        self.call("/v3/lease/revoke", &json!({ "ID": id }))?;
        Ok(())
    }

    /// `POST /v3/lease/timetolive`: seconds left (`None`: expired or unknown).
    pub fn time_to_live(&self, id: i64) -> Result<Option<i64>, EtcdError> {
        let v = self.call("/v3/lease/timetolive", &json!({ "ID": id }))?;
        Ok(v.get("TTL").and_then(int).filter(|&t| t >= 0))
    }

    /// `POST /v3/kv/put`, attached to `lease` (0: none).
    pub fn put(&self, key: &str, value: &[u8], lease: i64) -> Result<(), EtcdError> {
        self.call(
            "/v3/kv/put",
            &json!({ "key": B64.encode(key), "value": B64.encode(value), "lease": lease }),
        )?;
        Ok(())
    }

    /// `POST /v3/kv/range` of every key beginning with `prefix`, and the store's revision.
    pub fn range_prefix(&self, prefix: &str) -> Result<(Vec<KeyValue>, i64), EtcdError> {
        let p = "/v3/kv/range";
        let v = self.call(
            p,
            &json!({ "key": B64.encode(prefix), "range_end": B64.encode(prefix_end(prefix.as_bytes())) }),
        )?;
        let revision = v
            .get("header")
            .and_then(|h| h.get("revision"))
            .and_then(int)
            .unwrap_or(0);
        let mut out = Vec::new();
        for kv in v.get("kvs").and_then(Value::as_array).into_iter().flatten() {
            let dec = |f: &str| -> Result<Vec<u8>, EtcdError> {
                let s = kv.get(f).and_then(Value::as_str).unwrap_or("");
                B64.decode(s)
                    .map_err(|e| Self::bad(p, &format!("{f}: not base64: {e}")))
            };
            let key =
                String::from_utf8(dec("key")?).map_err(|_| Self::bad(p, "a key not UTF-8"))?;
            out.push(KeyValue {
                key,
                value: dec("value")?,
                lease: kv.get("lease").and_then(int).unwrap_or(0),
                mod_revision: kv.get("mod_revision").and_then(int).unwrap_or(0),
            });
        }
        Ok((out, revision))
    }
}

/// etcd's range end for "every key with this prefix": the prefix with its last byte below
/// 0xff increased, and what follows it dropped.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff (or empty): every key from the prefix on ("\0" means "to the end").
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_end_of_a_prefix() {
        assert_eq!(prefix_end(b"/p/nodes/"), b"/p/nodes0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b""), vec![0]);
    }

    #[test]
    fn http_and_https_endpoints() {
        let t = Duration::from_secs(1);
        assert!(Etcd::new("http://127.0.0.1:2379", t).is_ok());
        assert!(Etcd::new("http://127.0.0.1:2379/", t).is_ok());
        assert!(Etcd::new("https://127.0.0.1:2379", t).is_ok());
        // TLS settings for a plain endpoint would be ignored: refused.
        let tls = EtcdTls {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..EtcdTls::default()
        };
        let e = Etcd::with_tls("http://127.0.0.1:2379", t, &tls).unwrap_err();
        assert!(e.to_string().contains("https://"), "{e}");
        // A CA file that is not there is said at start.
        let e = Etcd::with_tls("https://127.0.0.1:2379", t, &tls).unwrap_err();
        assert!(e.to_string().contains("cluster.ca_file"), "{e}");
        let half = EtcdTls {
            cert_file: Some("/x.pem".into()),
            ..EtcdTls::default()
        };
        let e = Etcd::with_tls("https://127.0.0.1:2379", t, &half).unwrap_err();
        assert!(e.to_string().contains("go together"), "{e}");
        for bad in [
            "ftp://127.0.0.1:2379",
            "127.0.0.1:2379",
            "http://a b:1",
            "http://h",
        ] {
            assert!(Etcd::new(bad, t).is_err(), "{bad}");
        }
    }
}
