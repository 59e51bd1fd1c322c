//! `penstock sign URL --expires 2h`: prints URL signed with the first key of the
//! configuration's `[auth] keys` (or `--key-id`), the keys read as the server reads them
//! (docs/security.md "Viewers"). Thin glue over `penstock_core::auth::sign_query`.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::Args;
use penstock_core::auth::IpPrefix;
use penstock_server::config::ServerConfig;

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
    penstock sign http://cdn.example:8080/premium/film.ts/index.m3u8 --expires 2h\n  \
    penstock sign rtsp://cdn.example:8554/premium/film.ts --expires 30m --ip 198.51.100.0/24\n  \
    penstock sign /premium/film.ts --expires 1d --key-id k2 --config ./penstock.toml")]
pub struct SignArgs {
    /// The URL to sign (http://, https:// or rtsp://), or a path starting with `/`. Its
    /// path is signed in canonical form (percent-decoded, dot segments resolved); a query it
    /// has is kept.
    pub url: String,
    /// How long the URL stays valid from now (`90s`, `30m`, `2h`, `7d`).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub expires: Duration,
    /// The key to sign with (default: the first of `[auth] keys`).
    #[arg(long)]
    pub key_id: Option<String>,
    /// Only clients within this address prefix may use the URL (`203.0.113.7`,
    /// `198.51.100.0/24`, `2001:db8::/32`).
    #[arg(long)]
    pub ip: Option<String>,
    /// The configuration whose `[auth] keys` sign.
    #[arg(long, default_value = "/etc/penstock/penstock.toml")]
    pub config: PathBuf,
}

pub fn run(a: SignArgs) -> Result<()> {
    let cfg = ServerConfig::load(&a.config)?;
    let keys = penstock_server::auth::load_keys(&cfg.auth)?;
    if keys.is_empty() {
        bail!(
            "{}: [auth] keys is empty: add keys = [{{ id = \"k1\", secret_file = \"/etc/penstock/k1.key\" }}]",
            a.config.display()
        );
    }
    let key = keys.signing_key(a.key_id.as_deref()).with_context(|| {
        format!(
            "no key {:?} in [auth] keys (there are: {})",
            a.key_id.as_deref().unwrap_or(""),
            keys.ids().collect::<Vec<_>>().join(", ")
        )
    })?;
    let ip = match &a.ip {
        None => None,
        Some(s) => Some(IpPrefix::parse(s).with_context(|| {
            format!("--ip {s:?}: not an address or prefix (203.0.113.7, 198.51.100.0/24)")
        })?),
    };
    let now_s = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let expires_s = now_s.saturating_add(a.expires.as_secs().max(1));
    println!("{}", sign_url(&a.url, key, expires_s, ip.as_ref())?);
    Ok(())
}

/// `url` with the credential appended to its query.
fn sign_url(
    url: &str,
    key: &penstock_core::auth::Key,
    expires_s: u64,
    ip: Option<&IpPrefix>,
) -> Result<String> {
    // The URL without its query (what the credential is appended to), its path as sent,
    // and its query.
    let (base, raw_path, query) = if url.starts_with('/') {
        let (p, q) = match url.split_once('?') {
            Some((p, q)) => (p.to_string(), Some(q.to_string())),
            None => (url.to_string(), None),
        };
        (p.clone(), p, q)
    } else {
        let u = url::Url::parse(url).with_context(|| format!("{url:?} is not a URL"))?;
        if !matches!(u.scheme(), "http" | "https" | "rtsp") {
            bail!("{url:?}: http://, https:// or rtsp:// (or a path starting with /)");
        }
        let mut base = u.clone();
        base.set_query(None);
        base.set_fragment(None);
        (
            base.to_string(),
            u.path().to_string(),
            u.query().map(str::to_string),
        )
    };
    let path = penstock_core::http::normalize_path(&raw_path)
        .map_err(|e| anyhow::anyhow!("{url:?}: its path does not resolve: {e}"))?;
    if let Some(q) = &query
        && penstock_core::auth::parse_query(q) != Ok(None)
    {
        bail!("{url:?} carries a credential already (expires, kid, sig, ip or sid)");
    }
    let cred = penstock_core::auth::sign_query(key, &path, expires_s, ip);
    Ok(match query {
        Some(q) if !q.is_empty() => format!("{base}?{q}&{cred}"),
        _ => format!("{base}?{cred}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_canonical_path_is_signed_and_the_url_kept() {
        let k = penstock_core::auth::Key::new("k1", &[b'k'; 32]).unwrap();
        let a = sign_url("http://h:8080/premium/./clip.ts", &k, 1_700_000_000, None).unwrap();
        let b = sign_url("/premium/clip.ts", &k, 1_700_000_000, None).unwrap();
        assert_eq!(
            b,
            "/premium/clip.ts?expires=1700000000&kid=k1&sig=Em2cUwqPSKYy1O2otH7j1DFv3QhqmjdAWjJFeIIJpgE"
        );
        assert_eq!(a, format!("http://h:8080{b}"));
        let c = sign_url("rtsp://h/premium/clip.ts?x=1", &k, 1_700_000_000, None).unwrap();
        assert!(c.starts_with("rtsp://h/premium/clip.ts?x=1&expires=1700000000&kid=k1&sig="));
        assert!(sign_url(&b, &k, 1, None).is_err(), "signed twice");
        assert!(sign_url("ftp://h/x", &k, 1, None).is_err());
        assert!(sign_url("/../x", &k, 1, None).is_err());
    }
}
