//! One origin request: a block's range GET (conditional when revalidating), its reply
//! checked by the core (`check_reply`) and its body written to a temporary file whose length
//! must be the reply's; anything else deletes the file and is an [`OriginError`]. The URL is
//! the HTTP origin's prefix and the path, or an S3 GetObject URL presigned with SigV4
//! (`rusty-s3`); the request goes through the one blocking client (`ureq`, no TLS).

use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use penstock_core::origin::block::{Geometry, range_header};
use penstock_core::origin::reply::{Asked, check_reply};
use rusty_s3::S3Action;

use super::{Object, Origin, OriginError};
use crate::config::OriginConfig;
use crate::config::origin::OriginUrl;

/// The query of a block request from a peer (`GET /path?penstock-fill`): the receiving node
/// reads a path it does not have from the origin itself, never from another peer.
pub(crate) const PEER_FILL_QUERY: &str = "penstock-fill";

/// Where objects come from.
pub(super) enum Source {
    /// `base` (scheme, authority, prefix without a final `/`) followed by the path.
    Http {
        base: String,
    },
    S3(Box<S3Source>),
}

/// An S3 bucket, the key pair that signs and the key prefix.
pub(super) struct S3Source {
    bucket: rusty_s3::Bucket,
    credentials: rusty_s3::Credentials,
    prefix: String,
    presign_ttl: Duration,
}

impl Source {
    pub(super) fn new(cfg: &OriginConfig) -> Result<Source, String> {
        match cfg.origin_url().map_err(|e| e.to_string())? {
            OriginUrl::Http { base } => Ok(Source::Http { base }),
            OriginUrl::S3 { bucket, prefix } => {
                let endpoint = url::Url::parse(&cfg.s3.endpoint)
                    .map_err(|e| format!("origin.s3.endpoint {:?}: {e}", cfg.s3.endpoint))?;
                let style = if cfg.s3.path_style {
                    rusty_s3::UrlStyle::Path
                } else {
                    rusty_s3::UrlStyle::VirtualHost
                };
                let bucket = rusty_s3::Bucket::new(endpoint, style, bucket, cfg.s3.region.clone())
                    .map_err(|e| format!("origin.s3: {e}"))?;
                let keys = match &cfg.s3.credentials_file {
                    Some(p) => {
                        let text = std::fs::read_to_string(p).map_err(|e| {
                            format!("origin.s3.credentials_file {}: {e}", p.display())
                        })?;
                        penstock_core::origin::credentials::parse_credentials(
                            &text,
                            &cfg.s3.profile,
                        )
                        .map_err(|e| format!("origin.s3.credentials_file {}: {e}", p.display()))?
                    }
                    None => {
                        let var = |n: &str| {
                            std::env::var(n).map_err(|_| {
                                format!("origin.s3: {n} is not set (and no credentials_file)")
                            })
                        };
                        penstock_core::origin::credentials::KeyPair {
                            access_key_id: var("AWS_ACCESS_KEY_ID")?,
                            secret_access_key: var("AWS_SECRET_ACCESS_KEY")?,
                        }
                    }
                };
                Ok(Source::S3(Box::new(S3Source {
                    bucket,
                    credentials: rusty_s3::Credentials::new(
                        keys.access_key_id,
                        keys.secret_access_key,
                    ),
                    prefix,
                    presign_ttl: Duration::from_millis(cfg.s3.presign_ttl_ms),
                })))
            }
        }
    }

    /// The URL of `path` (decoded, starting with `/`).
    pub(super) fn url(&self, path: &str) -> String {
        match self {
            Source::Http { base } => format!("{base}{}", encode_path(path)),
            Source::S3(s3) => {
                let key = s3_key(&s3.prefix, path);
                s3.bucket
                    .get_object(Some(&s3.credentials), &key)
                    .sign(s3.presign_ttl)
                    .to_string()
            }
        }
    }
}

/// The object key of `path` under `prefix`.
fn s3_key(prefix: &str, path: &str) -> String {
    let rel = path.trim_start_matches('/');
    if prefix.is_empty() {
        rel.to_string()
    } else {
        format!("{prefix}/{rel}")
    }
}

/// Percent-encodes a decoded path for a request line: unreserved characters and `/` stay.
fn encode_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/!$&'()*+,;=:@".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// What a fetch got.
pub(super) enum Fetched {
    /// 304 to a conditional request.
    NotModified,
    /// The block, complete in the temporary file (`body_bytes`, possibly 0 for an empty
    /// object), with the object's size and validators.
    Block {
        size_bytes: u64,
        body_bytes: u64,
        etag: Option<String>,
        last_modified: Option<String>,
        /// The body, when the disk refused it (served through, not cached).
        memory: Option<Vec<u8>>,
    },
}

fn timeout_or_failed(e: ureq::Error) -> OriginError {
    match e {
        ureq::Error::Timeout(t) => OriginError::Timeout(t.to_string()),
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => {
            OriginError::Timeout(io.to_string())
        }
        e => OriginError::Failed(e.to_string()),
    }
}

/// Fetches block `block` of `path` into `tmp`. `known`: the object (its size, and its ETag
/// which the reply must carry unchanged); `validators`: make the request conditional on
/// them (revalidation of block 0).
pub(super) fn fetch(
    origin: &Origin,
    path: &str,
    block: u64,
    known: Option<&Object>,
    validators: Option<&Object>,
    tmp: &Path,
    via: Option<&str>,
) -> Result<Fetched, OriginError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let r = fetch_inner(origin, path, block, known, validators, tmp, via);
        origin.metrics.fetches.inc();
        match r {
            Err(e) => {
                origin.metrics.fetch_failures.inc();
                let _ = std::fs::remove_file(tmp);
                // Only what may go right the next time is tried again.
                if !matches!(e, OriginError::Failed(_)) || attempt >= origin.attempts {
                    return Err(e);
                }
                tracing::debug!(path, block, error = %e, "origin request failed; trying again");
            }
            ok => return ok,
        }
    }
}

fn fetch_inner(
    origin: &Origin,
    path: &str,
    block: u64,
    known: Option<&Object>,
    validators: Option<&Object>,
    tmp: &Path,
    via: Option<&str>,
) -> Result<Fetched, OriginError> {
    let (start, len_bytes) = match known {
        Some(o) => o
            .geometry(origin.block_bytes)
            .extent(block)
            .ok_or_else(|| OriginError::Failed(format!("block {block} is past the end")))?,
        None => (0, origin.block_bytes),
    };
    // From a peer (`http://HOST:PORT`, or `https://` where it has a TLS listener, checked
    // against `[origin] ca_file` or Mozilla's roots): its HTTP server, which reads the path
    // from the origin itself (the query tells it so: a peer never forwards a fill, so fills
    // cannot loop).
    let url = match via {
        Some(peer) => format!("{peer}{}?{PEER_FILL_QUERY}", encode_path(path)),
        None => origin.source.url(path),
    };
    let mut req = origin
        .agent
        .get(&url)
        .header("range", range_header(start, len_bytes))
        // S3 servers (Garage) want it on every request; plain HTTP servers ignore it.
        .header("x-amz-content-sha256", "UNSIGNED-PAYLOAD");
    // Who is asking: the peer honours the query only from a listed node.
    if let (Some(_), Some(v)) = (via, origin.cluster.get()) {
        req = req.header("penstock-fill", v.fill_credential());
    }
    if let Some(v) = validators {
        if let Some(etag) = &v.etag {
            req = req.header("if-none-match", etag.as_str());
        } else if let Some(lm) = &v.last_modified {
            req = req.header("if-modified-since", lm.as_str());
        }
    }
    let mut resp = req.call().map_err(timeout_or_failed)?;
    let status = resp.status().as_u16();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    match status {
        304 if validators.is_some() => return Ok(Fetched::NotModified),
        404 => return Err(OriginError::NotFound),
        200 | 206 | 416 => {}
        s => return Err(OriginError::Failed(format!("the origin answered {s}"))),
    }
    let etag = header("etag");
    let last_modified = header("last-modified");
    if let Some(o) = known
        && o.etag.is_some()
        && etag.is_some()
        && o.etag != etag
    {
        return Err(OriginError::Changed);
    }
    let content_length = header("content-length").and_then(|v| v.parse::<u64>().ok());
    let shape = check_reply(
        Asked {
            start,
            len_bytes,
            size_bytes: known.map(|o| o.size_bytes),
        },
        status,
        header("content-range").as_deref(),
        content_length,
    )
    .map_err(|e| OriginError::Failed(e.to_string()))?;
    // A 206 whose Content-Length disagrees with its Content-Range is garbled: refused
    // before its body is read (the body would end early or run over the range anyway).
    if status == 206
        && let Some(l) = content_length
        && l != shape.body_bytes
    {
        return Err(OriginError::Failed(format!(
            "Content-Length {l} disagrees with the {} bytes of the Content-Range",
            shape.body_bytes
        )));
    }
    if known.is_some() {
        debug_assert_eq!(
            Geometry::new(shape.size_bytes, origin.block_bytes).extent(block),
            Some((start, shape.body_bytes))
        );
    }
    // To the temporary file while the disk takes it; when it does not (full), the bytes
    // written so far are read back and the rest kept in memory: the block is served through
    // and not cached.
    let mut sink = match std::fs::File::create(tmp) {
        Ok(f) => Sink::File(f, 0),
        Err(e) => {
            origin.cache_write_failed(&e);
            Sink::Memory(Vec::new())
        }
    };
    let mut body = resp
        .body_mut()
        .with_config()
        .limit(shape.body_bytes + 1)
        .reader();
    let mut buf = vec![0u8; 256 * 1024];
    let mut got: u64 = 0;
    loop {
        let n = match body.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => return Err(timeout_or_failed(ureq::Error::from(e))),
        };
        got += n as u64;
        if got > shape.body_bytes {
            return Err(OriginError::Failed(format!(
                "the origin sent more than the {} bytes of the range",
                shape.body_bytes
            )));
        }
        if via.is_some() {
            origin.metrics.peer_fetched_bytes.inc_by(n as u64);
        } else {
            origin.metrics.fetched_bytes.inc_by(n as u64);
        }
        sink.write(origin, tmp, &buf[..n])?;
    }
    if got != shape.body_bytes {
        return Err(OriginError::Failed(format!(
            "the origin's body ended after {got} of {} bytes",
            shape.body_bytes
        )));
    }
    Ok(Fetched::Block {
        size_bytes: shape.size_bytes,
        body_bytes: got,
        etag,
        last_modified,
        memory: match sink {
            Sink::File(..) => None,
            Sink::Memory(v) => Some(v),
        },
    })
}

/// Where a block's body goes: the temporary file (and the bytes written to it), or memory
/// once the disk refused a write.
enum Sink {
    File(std::fs::File, u64),
    Memory(Vec<u8>),
}

impl Sink {
    fn write(&mut self, origin: &Origin, tmp: &Path, mut b: &[u8]) -> Result<(), OriginError> {
        if let Sink::File(f, written) = self {
            while !b.is_empty() {
                match f.write(b) {
                    Ok(0) => {
                        return self.spill_to_memory(
                            origin,
                            tmp,
                            b,
                            &std::io::ErrorKind::WriteZero.into(),
                        );
                    }
                    Ok(n) => {
                        *written += n as u64;
                        b = &b[n..];
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return self.spill_to_memory(origin, tmp, b, &e),
                }
            }
            return Ok(());
        }
        if let Sink::Memory(v) = self {
            v.extend_from_slice(b);
        }
        Ok(())
    }

    /// The disk refused `rest`: what reached the file is read back, the file deleted.
    fn spill_to_memory(
        &mut self,
        origin: &Origin,
        tmp: &Path,
        rest: &[u8],
        e: &std::io::Error,
    ) -> Result<(), OriginError> {
        origin.cache_write_failed(e);
        let Sink::File(_, written) = self else {
            return Ok(());
        };
        let mut v = Vec::with_capacity(*written as usize + rest.len());
        std::fs::File::open(tmp)
            .and_then(|mut f| f.read_to_end(&mut v))
            .map_err(|e| {
                OriginError::Cache(format!("reading back a block the disk refused: {e}"))
            })?;
        v.truncate(*written as usize);
        if v.len() as u64 != *written {
            return Err(OriginError::Cache(
                "a block the disk refused could not be read back".into(),
            ));
        }
        let _ = std::fs::remove_file(tmp);
        v.extend_from_slice(rest);
        *self = Sink::Memory(v);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AWS's published example of a presigned GET (Signature Version 4, "Authenticating
    /// Requests: Using Query Parameters"): the same URL, signature included.
    #[test]
    fn presigned_get_matches_the_aws_sigv4_example() {
        let endpoint = url::Url::parse("https://s3.amazonaws.com").unwrap();
        let bucket = rusty_s3::Bucket::new(
            endpoint,
            rusty_s3::UrlStyle::VirtualHost,
            "examplebucket",
            "us-east-1",
        )
        .unwrap();
        let creds = rusty_s3::Credentials::new(
            "AKIAIOSFODNN7EXAMPLE",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        );
        let at: jiff::Timestamp = "2013-05-24T00:00:00Z".parse().unwrap();
        let url = bucket
            .get_object(Some(&creds), "test.txt")
            .sign_with_time(Duration::from_secs(86400), &at);
        let sig = url
            .query_pairs()
            .find(|(k, _)| k == "X-Amz-Signature")
            .map(|(_, v)| v.to_string());
        assert_eq!(
            sig.as_deref(),
            Some("aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404"),
            "{url}"
        );
    }

    #[test]
    fn paths_are_encoded_and_keys_prefixed() {
        assert_eq!(encode_path("/a b/ü%.ts"), "/a%20b/%C3%BC%25.ts");
        assert_eq!(s3_key("media", "/x/y.ts"), "media/x/y.ts");
        assert_eq!(s3_key("", "/y.ts"), "y.ts");
    }
}
