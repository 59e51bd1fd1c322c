//! `[origin]`: where a path missing beneath the root is read from, and the local cache of
//! its blocks (docs/origin.md).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, units};

/// `[origin]`. Off while `url` is empty.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct OriginConfig {
    /// `http://host:port/prefix` or `https://…` (any server that answers `Range`), or
    /// `s3://bucket/prefix` (with `[origin.s3]`, whose endpoint may be `https://` too).
    /// Empty: no origin; a missing path is a 404.
    pub url: String,
    /// PEM certificates an `https` origin's (or S3 endpoint's) certificate must chain to;
    /// unset: Mozilla's roots, built in (`webpki-roots`). Read at start.
    pub ca_file: Option<PathBuf>,
    /// Where blocks are kept. Its `penstock-origin` subdirectory is the server's: emptied at
    /// start (the cache does not outlive the process) and filled one file per block.
    pub cache_dir: Option<PathBuf>,
    /// Bytes per origin request; each block is fetched whole, aligned on its size.
    #[serde(deserialize_with = "units::size")]
    pub block_bytes: u64,
    /// The cache's byte limit; least recently used blocks are deleted to stay under it.
    #[serde(deserialize_with = "units::size")]
    pub cache_bytes_max: u64,
    /// Blocks fetched ahead of a reader (in the background, within `fetches_max`).
    pub read_ahead_blocks: u64,
    /// Connecting to the origin.
    #[serde(deserialize_with = "units::ms")]
    pub connect_timeout_ms: u64,
    /// An origin request that receives nothing for this long (head or body) fails: 504
    /// before the client's head is sent, a cut body after.
    #[serde(deserialize_with = "units::ms")]
    pub timeout_ms: u64,
    /// A cached object is served without asking the origin for this long after it was last
    /// validated; then the next request revalidates it (If-None-Match / If-Modified-Since).
    #[serde(deserialize_with = "units::ms")]
    pub revalidate_after_ms: u64,
    /// Tries of one origin request that failed (an error status, a refused connection, a
    /// short or garbled reply); a timeout, a 404 or a changed object is not tried again.
    pub attempts: u32,
    /// Origin requests at once (reads and read-ahead together; read-ahead never waits for a
    /// place, it is skipped).
    pub fetches_max: usize,
    /// Client requests served from the origin at once (a thread each); beyond: 503.
    pub requests_max: usize,
    /// In a cluster (`[cluster]`): fetch a path's blocks from the node that owns the path on
    /// the ring of caching nodes (its HTTP server, which fetches them from the origin once)
    /// rather than from the origin, so that the origin sends each block once cluster-wide.
    pub fill_from_peers: bool,
    /// `[origin.s3]`: for an `s3://` url.
    pub s3: S3Config,
}

/// `[origin.s3]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct S3Config {
    /// The S3 endpoint, `http://host:port` (e.g. Garage's `api_bind_addr`).
    pub endpoint: String,
    pub region: String,
    /// Bucket in the path (`endpoint/bucket/key`, as Garage and MinIO take it) rather than
    /// in the host name.
    pub path_style: bool,
    /// A credentials file (`aws_access_key_id`, `aws_secret_access_key` under `[profile]`);
    /// unset: the `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` environment variables.
    pub credentials_file: Option<PathBuf>,
    pub profile: String,
    /// How long each presigned request URL is valid.
    #[serde(deserialize_with = "units::ms")]
    pub presign_ttl_ms: u64,
}

impl Default for S3Config {
    fn default() -> S3Config {
        S3Config {
            endpoint: String::new(),
            region: "us-east-1".into(),
            path_style: true,
            credentials_file: None,
            profile: "default".into(),
            presign_ttl_ms: 300_000,
        }
    }
}

impl Default for OriginConfig {
    fn default() -> OriginConfig {
        OriginConfig {
            url: String::new(),
            ca_file: None,
            cache_dir: None,
            block_bytes: 4 << 20,
            cache_bytes_max: 1 << 30,
            read_ahead_blocks: 2,
            connect_timeout_ms: 3_000,
            timeout_ms: 10_000,
            revalidate_after_ms: 60_000,
            attempts: 2,
            fetches_max: 16,
            requests_max: 256,
            fill_from_peers: true,
            s3: S3Config::default(),
        }
    }
}

/// Where an origin is, parsed from `url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OriginUrl {
    /// `http://host:port` and a path prefix (without a trailing `/`).
    Http {
        base: String,
    },
    S3 {
        bucket: String,
        prefix: String,
    },
}

impl OriginConfig {
    pub fn enabled(&self) -> bool {
        !self.url.is_empty()
    }

    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    pub fn revalidate_after(&self) -> Duration {
        Duration::from_millis(self.revalidate_after_ms)
    }

    /// The directories the server makes (and empties) at start beneath `cache_dir`: its own
    /// `penstock-origin`, then `blocks` and `tmp` in it. `penstock serve` gives them to the
    /// configured `user` before switching to it.
    pub fn cache_dirs(&self) -> Option<[PathBuf; 3]> {
        let base = self.cache_dir.as_ref()?.join("penstock-origin");
        Some([base.clone(), base.join("blocks"), base.join("tmp")])
    }

    /// The origin's location.
    pub fn origin_url(&self) -> Result<OriginUrl, ConfigError> {
        let bad = |why: &str| ConfigError::Invalid(format!("origin.url {:?}: {why}", self.url));
        if let Some(rest) = self
            .url
            .strip_prefix("http://")
            .or_else(|| self.url.strip_prefix("https://"))
        {
            let host_end = rest.find('/').unwrap_or(rest.len());
            if host_end == 0 {
                return Err(bad("no host"));
            }
            if rest.contains(['?', '#']) {
                return Err(bad("a query or fragment has no place in a prefix"));
            }
            Ok(OriginUrl::Http {
                base: self.url.trim_end_matches('/').to_string(),
            })
        } else if let Some(rest) = self.url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(bad("no bucket"));
            }
            Ok(OriginUrl::S3 {
                bucket: bucket.to_string(),
                prefix: prefix.trim_matches('/').to_string(),
            })
        } else {
            Err(bad(
                "expected http[s]://host[:port][/prefix] or s3://bucket[/prefix]",
            ))
        }
    }

    /// Checks what can be checked without opening anything.
    pub fn check(&self) -> Result<(), ConfigError> {
        if !self.enabled() {
            return Ok(());
        }
        let url = self.origin_url()?;
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.cache_dir.is_none() {
            return bad("origin.cache_dir is required with origin.url".into());
        }
        if self.block_bytes == 0 {
            return bad("origin.block_bytes must be at least 1".into());
        }
        if self.cache_bytes_max < self.block_bytes {
            return bad(format!(
                "origin.cache_bytes_max ({}) is smaller than one block ({})",
                self.cache_bytes_max, self.block_bytes
            ));
        }
        for (key, v) in [
            ("fetches_max", self.fetches_max),
            ("requests_max", self.requests_max),
            ("attempts", self.attempts as usize),
        ] {
            if v == 0 {
                return bad(format!("origin.{key} must be at least 1"));
            }
        }
        for (key, v) in [
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("timeout_ms", self.timeout_ms),
        ] {
            if v == 0 {
                return bad(format!("origin.{key} must be more than 0"));
            }
        }
        if matches!(url, OriginUrl::S3 { .. }) {
            if !self.s3.endpoint.starts_with("http://") {
                return bad(format!(
                    "origin.s3.endpoint {:?}: expected http://host:port (no TLS built in)",
                    self.s3.endpoint
                ));
            }
            if self.s3.region.is_empty() {
                return bad("origin.s3.region is empty".into());
            }
            if self.s3.presign_ttl_ms < 1000 {
                return bad("origin.s3.presign_ttl_ms must be at least 1s".into());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_and_bad_ones_are_named() {
        let mut c = OriginConfig {
            url: "http://127.0.0.1:8080/media/".into(),
            cache_dir: Some("/tmp/c".into()),
            ..OriginConfig::default()
        };
        assert_eq!(
            c.origin_url().unwrap(),
            OriginUrl::Http {
                base: "http://127.0.0.1:8080/media".into()
            }
        );
        c.check().unwrap();
        c.url = "https://origin.example:8443/m".into();
        assert_eq!(
            c.origin_url().unwrap(),
            OriginUrl::Http {
                base: "https://origin.example:8443/m".into()
            }
        );
        c.url = "s3://b/p/q/".into();
        assert_eq!(
            c.origin_url().unwrap(),
            OriginUrl::S3 {
                bucket: "b".into(),
                prefix: "p/q".into()
            }
        );
        assert!(c.check().is_err(), "s3 without an endpoint");
        c.s3.endpoint = "http://127.0.0.1:3900".into();
        c.check().unwrap();
        for bad in ["ftp://x", "https:///y", "http:///x", "s3:///x", "x"] {
            c.url = bad.into();
            assert!(c.check().is_err(), "{bad}");
        }
        c.url = "http://h".into();
        c.cache_bytes_max = c.block_bytes - 1;
        assert!(c.check().is_err());
    }

    #[test]
    fn sizes_and_durations_take_units() {
        let c: OriginConfig = toml::from_str(
            "url = \"http://h\"\ncache_dir = \"/c\"\nblock_bytes = \"1MiB\"\ncache_bytes_max = \"64MiB\"\ntimeout_ms = \"2s\"\nrevalidate_after_ms = \"1min\"\n",
        )
        .unwrap();
        assert_eq!(
            (
                c.block_bytes,
                c.cache_bytes_max,
                c.timeout_ms,
                c.revalidate_after_ms
            ),
            (1 << 20, 64 << 20, 2000, 60_000)
        );
    }
}
