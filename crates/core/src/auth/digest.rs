//! RTSP Digest authentication (RFC 7616, and RFC 2617's MD5 that cameras' clients send):
//! `[[location]] auth = "digest"`, users from a file of `user:realm:HA1` lines.
//!
//! Pure: the server hands in the users (read from their file), the nonce key (random at
//! start), the request's method and URI, and `now` in Unix seconds.
//!
//! **Nonces** are stateless: `base64url(issued_s as 8 bytes, big-endian ‖ the first 16 bytes
//! of HMAC-SHA256(nonce key, "penstock-digest-nonce-v1" ‖ those 8 bytes))`. Nothing is
//! stored per nonce (their number costs no memory); one older than the lifetime is answered
//! `401` with `stale=true`, one not made by this server is refused. A nonce may be used
//! again within its lifetime (nonce counts are not tracked): a captured `Authorization` can
//! be replayed for the same method and URI until the nonce expires.
//!
//! **Hashes**: MD5 by RustCrypto's `md-5`, SHA-256 by ring; the response is compared in
//! constant time (HMAC of both under the nonce key, compared by ring's `hmac::verify`).

use std::collections::HashMap;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use md5::Digest as _;
use ring::hmac;

/// The most users a users file may hold.
pub const USERS_MAX: usize = 10_000;
/// The longest `Authorization` value parsed, in bytes.
pub const AUTHORIZATION_BYTES_MAX: usize = 4096;

/// A Digest hash algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    Md5,
    Sha256,
}

impl Algorithm {
    /// The name in a challenge and a response (`MD5`, `SHA-256`).
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Md5 => "MD5",
            Algorithm::Sha256 => "SHA-256",
        }
    }

    fn from_name(s: &str) -> Option<Algorithm> {
        if s.eq_ignore_ascii_case("MD5") {
            Some(Algorithm::Md5)
        } else if s.eq_ignore_ascii_case("SHA-256") {
            Some(Algorithm::Sha256)
        } else {
            None
        }
    }

    /// Lower-case hex of the hash of `data`.
    pub fn hex(self, data: &[u8]) -> String {
        let bytes: Vec<u8> = match self {
            Algorithm::Md5 => md5::Md5::digest(data).to_vec(),
            Algorithm::Sha256 => ring::digest::digest(&ring::digest::SHA256, data)
                .as_ref()
                .to_vec(),
        };
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Why a Digest credential was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DigestError {
    #[error("malformed Digest credential: {0}")]
    Malformed(&'static str),
    /// Made by this server but older than the nonce lifetime: a fresh challenge, `stale=true`.
    #[error("stale nonce")]
    Stale,
    #[error("not a nonce of this server")]
    BadNonce,
    #[error("unknown user or algorithm")]
    UnknownUser,
    #[error("wrong response")]
    BadResponse,
}

/// The users of one realm: each user's HA1 (`H(user:realm:password)`, hex) per algorithm.
#[derive(Debug, Clone, Default)]
pub struct DigestUsers {
    realm: String,
    ha1: HashMap<(String, Algorithm), String>,
}

impl DigestUsers {
    /// Reads a users file: `user:realm:HA1` a line (htdigest's format; an HA1 of 32 hex
    /// digits is MD5's, of 64 SHA-256's), `#` comments and blank lines ignored. Lines of
    /// another realm are ignored; a malformed line is an error naming it.
    pub fn parse(text: &str, realm: &str) -> Result<DigestUsers, String> {
        let mut ha1 = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: &str| format!("line {}: {why} (user:realm:HA1)", i + 1);
            let mut parts = line.splitn(3, ':');
            let (Some(user), Some(r), Some(h)) = (parts.next(), parts.next(), parts.next()) else {
                return Err(bad("three fields"));
            };
            if user.is_empty() || user.contains('"') {
                return Err(bad("a user name"));
            }
            let alg = match h.len() {
                32 => Algorithm::Md5,
                64 => Algorithm::Sha256,
                _ => return Err(bad("HA1 is 32 (MD5) or 64 (SHA-256) hex digits")),
            };
            if !h.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad("HA1 is hex digits"));
            }
            if r != realm {
                continue;
            }
            if ha1.len() >= USERS_MAX {
                return Err(format!("more than {USERS_MAX} users"));
            }
            ha1.insert((user.to_string(), alg), h.to_ascii_lowercase());
        }
        Ok(DigestUsers {
            realm: realm.to_string(),
            ha1,
        })
    }

    pub fn realm(&self) -> &str {
        &self.realm
    }

    pub fn len(&self) -> usize {
        self.ha1.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ha1.is_empty()
    }
}

/// The key nonces are made and checked with (random at the server's start).
pub struct NonceKey(hmac::Key);

impl std::fmt::Debug for NonceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NonceKey")
    }
}

impl NonceKey {
    pub fn new(secret: &[u8; 32]) -> NonceKey {
        NonceKey(hmac::Key::new(hmac::HMAC_SHA256, secret))
    }

    fn tag(&self, issued: [u8; 8]) -> hmac::Tag {
        let mut m = Vec::with_capacity(32);
        m.extend_from_slice(b"penstock-digest-nonce-v1");
        m.extend_from_slice(&issued);
        hmac::sign(&self.0, &m)
    }

    /// A nonce issued at `now_s`.
    pub fn nonce(&self, now_s: u64) -> String {
        let issued = now_s.to_be_bytes();
        let mut b = Vec::with_capacity(24);
        b.extend_from_slice(&issued);
        b.extend_from_slice(&self.tag(issued).as_ref()[..16]);
        B64.encode(b)
    }

    /// Whether `nonce` is one of ours, issued within `ttl_s` before `now_s`.
    pub fn check(&self, nonce: &str, now_s: u64, ttl_s: u64) -> Result<(), DigestError> {
        let mut b = [0u8; 24];
        match B64.decode_slice(nonce.as_bytes(), &mut b) {
            Ok(24) => {}
            _ => return Err(DigestError::BadNonce),
        }
        let issued: [u8; 8] = b[..8].try_into().expect("8 bytes");
        if !self.equal(&self.tag(issued).as_ref()[..16], &b[8..]) {
            return Err(DigestError::BadNonce);
        }
        let issued_s = u64::from_be_bytes(issued);
        if issued_s > now_s.saturating_add(1) || now_s - issued_s.min(now_s) >= ttl_s {
            return Err(DigestError::Stale);
        }
        Ok(())
    }

    /// Whether `a == b`, in time independent of where they differ: ring's `hmac::verify`
    /// of both under this key.
    fn equal(&self, a: &[u8], b: &[u8]) -> bool {
        hmac::verify(&self.0, a, hmac::sign(&self.0, b).as_ref()).is_ok()
    }
}

/// The `WWW-Authenticate` value of a challenge.
pub fn challenge(realm: &str, nonce: &str, algorithm: Algorithm, stale: bool) -> String {
    format!(
        "Digest realm=\"{realm}\", nonce=\"{nonce}\", algorithm={}, qop=\"auth\"{}",
        algorithm.name(),
        if stale { ", stale=true" } else { "" }
    )
}

/// The fields of an `Authorization: Digest …` value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DigestResponse {
    pub username: String,
    pub realm: String,
    pub nonce: String,
    pub uri: String,
    pub response: String,
    pub algorithm: Option<String>,
    pub qop: Option<String>,
    pub nc: Option<String>,
    pub cnonce: Option<String>,
}

/// Parses an `Authorization` value; `Ok(None)` when it is not `Digest`.
pub fn parse_authorization(value: &str) -> Result<Option<DigestResponse>, DigestError> {
    let v = value.trim();
    let Some((scheme, rest)) = v.split_once(' ') else {
        if v.eq_ignore_ascii_case("digest") {
            return Err(DigestError::Malformed("no parameters"));
        }
        return Ok(None);
    };
    if !scheme.eq_ignore_ascii_case("digest") {
        return Ok(None);
    }
    if v.len() > AUTHORIZATION_BYTES_MAX {
        return Err(DigestError::Malformed("too long"));
    }
    let mut r = DigestResponse::default();
    let mut rest = rest.trim_start();
    let mut params = 0;
    while !rest.is_empty() {
        params += 1;
        if params > 32 {
            return Err(DigestError::Malformed("too many parameters"));
        }
        let (name, after) = rest
            .split_once('=')
            .ok_or(DigestError::Malformed("name=value"))?;
        let name = name.trim();
        let after = after.trim_start();
        let (value, tail) = if let Some(q) = after.strip_prefix('"') {
            // A quoted string: no escapes are needed by any field we read.
            let end = q
                .find('"')
                .ok_or(DigestError::Malformed("an unclosed quote"))?;
            (&q[..end], &q[end + 1..])
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (after[..end].trim(), &after[end..])
        };
        let value = value.to_string();
        match name.to_ascii_lowercase().as_str() {
            "username" => r.username = value,
            "realm" => r.realm = value,
            "nonce" => r.nonce = value,
            "uri" => r.uri = value,
            "response" => r.response = value,
            "algorithm" => r.algorithm = Some(value),
            "qop" => r.qop = Some(value),
            "nc" => r.nc = Some(value),
            "cnonce" => r.cnonce = Some(value),
            _ => {}
        }
        rest = tail.trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    }
    if r.username.is_empty() || r.nonce.is_empty() || r.uri.is_empty() || r.response.is_empty() {
        return Err(DigestError::Malformed(
            "username, nonce, uri and response are required",
        ));
    }
    Ok(Some(r))
}

/// The response a client computes (RFC 7616 §3.4.1; without `qop`, RFC 2069's form):
/// `H(HA1:nonce:nc:cnonce:qop:H(method:uri))`.
pub fn expected_response(
    algorithm: Algorithm,
    ha1: &str,
    method: &str,
    r: &DigestResponse,
) -> Result<String, DigestError> {
    let ha2 = algorithm.hex(format!("{method}:{}", r.uri).as_bytes());
    let data = match r.qop.as_deref() {
        None => format!("{ha1}:{}:{ha2}", r.nonce),
        Some(q) if q.eq_ignore_ascii_case("auth") => {
            let nc =
                r.nc.as_deref()
                    .ok_or(DigestError::Malformed("qop without nc"))?;
            let cnonce = r
                .cnonce
                .as_deref()
                .ok_or(DigestError::Malformed("qop without cnonce"))?;
            format!("{ha1}:{}:{nc}:{cnonce}:auth:{ha2}", r.nonce)
        }
        Some(_) => return Err(DigestError::Malformed("qop: auth only")),
    };
    Ok(algorithm.hex(data.as_bytes()))
}

/// Checks response `r` to a request `method request_uri` at `now_s`: the realm, our nonce
/// (within `ttl_s`), the URI it covers (the request's), the user's HA1 for its algorithm,
/// and the response (constant time). The user name when it holds.
pub fn verify(
    users: &DigestUsers,
    key: &NonceKey,
    method: &str,
    request_uri: &str,
    r: &DigestResponse,
    now_s: u64,
    ttl_s: u64,
) -> Result<String, DigestError> {
    let algorithm = match r.algorithm.as_deref() {
        None => Algorithm::Md5,
        Some(a) => Algorithm::from_name(a).ok_or(DigestError::UnknownUser)?,
    };
    if r.realm != users.realm {
        return Err(DigestError::UnknownUser);
    }
    key.check(&r.nonce, now_s, ttl_s)?;
    if r.uri != request_uri {
        return Err(DigestError::Malformed("uri is not the request's"));
    }
    let ha1 = users
        .ha1
        .get(&(r.username.clone(), algorithm))
        .ok_or(DigestError::UnknownUser)?;
    let want = expected_response(algorithm, ha1, method, r)?;
    if !key.equal(want.as_bytes(), r.response.to_ascii_lowercase().as_bytes()) {
        return Err(DigestError::BadResponse);
    }
    Ok(r.username.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 2617 §3.5 (MD5, qop=auth): Mufasa / "Circle Of Life".
    #[test]
    fn rfc_2617_example() {
        let r = parse_authorization(
            r#"Digest username="Mufasa", realm="testrealm@host.com", nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093", uri="/dir/index.html", qop=auth, nc=00000001, cnonce="0a4f113b", response="6629fae49393a05397450978507c4ef1", opaque="5ccc069c403ebaf9f0171e9517f40e41""#,
        )
        .unwrap()
        .unwrap();
        let ha1 = Algorithm::Md5.hex(b"Mufasa:testrealm@host.com:Circle Of Life");
        assert_eq!(
            expected_response(Algorithm::Md5, &ha1, "GET", &r).unwrap(),
            "6629fae49393a05397450978507c4ef1"
        );
    }

    /// RFC 7616 §3.9.1: the same request with MD5 and with SHA-256.
    #[test]
    fn rfc_7616_examples() {
        let base = DigestResponse {
            username: "Mufasa".into(),
            realm: "http-auth@example.org".into(),
            nonce: "7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v".into(),
            uri: "/dir/index.html".into(),
            response: String::new(),
            algorithm: None,
            qop: Some("auth".into()),
            nc: Some("00000001".into()),
            cnonce: Some("f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ".into()),
        };
        for (alg, want) in [
            (Algorithm::Md5, "8ca523f5e9506fed4657c9700eebdbec"),
            (
                Algorithm::Sha256,
                "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1",
            ),
        ] {
            let ha1 = alg.hex(b"Mufasa:http-auth@example.org:Circle of Life");
            assert_eq!(expected_response(alg, &ha1, "GET", &base).unwrap(), want);
        }
    }

    fn users() -> DigestUsers {
        let md5 = Algorithm::Md5.hex(b"alice:penstock:secret");
        let sha = Algorithm::Sha256.hex(b"alice:penstock:secret");
        DigestUsers::parse(
            &format!("# users\nalice:penstock:{md5}\nalice:penstock:{sha}\nbob:other:{md5}\n"),
            "penstock",
        )
        .unwrap()
    }

    fn respond(key: &NonceKey, alg: Algorithm, password: &str, now_s: u64) -> DigestResponse {
        let mut r = DigestResponse {
            username: "alice".into(),
            realm: "penstock".into(),
            nonce: key.nonce(now_s),
            uri: "rtsp://h/a.ts".into(),
            response: String::new(),
            algorithm: Some(alg.name().into()),
            qop: Some("auth".into()),
            nc: Some("00000001".into()),
            cnonce: Some("c1".into()),
        };
        let ha1 = alg.hex(format!("alice:penstock:{password}").as_bytes());
        r.response = expected_response(alg, &ha1, "DESCRIBE", &r).unwrap();
        r
    }

    #[test]
    fn responses_verify_with_either_algorithm_and_fail_otherwise() {
        let key = NonceKey::new(&[7; 32]);
        let u = users();
        assert_eq!(u.len(), 2, "bob is of another realm");
        for alg in [Algorithm::Md5, Algorithm::Sha256] {
            let r = respond(&key, alg, "secret", 1000);
            assert_eq!(
                verify(&u, &key, "DESCRIBE", "rtsp://h/a.ts", &r, 1000, 60).unwrap(),
                "alice"
            );
            // Another method or URI, a wrong password, an old or foreign nonce.
            assert!(verify(&u, &key, "SETUP", "rtsp://h/a.ts", &r, 1000, 60).is_err());
            assert!(verify(&u, &key, "DESCRIBE", "rtsp://h/b.ts", &r, 1000, 60).is_err());
            let wrong = respond(&key, alg, "guess", 1000);
            assert_eq!(
                verify(&u, &key, "DESCRIBE", "rtsp://h/a.ts", &wrong, 1000, 60),
                Err(DigestError::BadResponse)
            );
            assert_eq!(
                verify(&u, &key, "DESCRIBE", "rtsp://h/a.ts", &r, 1060, 60),
                Err(DigestError::Stale)
            );
            let other = respond(&NonceKey::new(&[8; 32]), alg, "secret", 1000);
            assert_eq!(
                verify(&u, &key, "DESCRIBE", "rtsp://h/a.ts", &other, 1000, 60),
                Err(DigestError::BadNonce)
            );
        }
        // Without qop (RFC 2069's form, which some clients send).
        let mut r = respond(&key, Algorithm::Md5, "secret", 5);
        r.qop = None;
        let ha1 = Algorithm::Md5.hex(b"alice:penstock:secret");
        r.response = expected_response(Algorithm::Md5, &ha1, "DESCRIBE", &r).unwrap();
        assert!(verify(&u, &key, "DESCRIBE", "rtsp://h/a.ts", &r, 5, 60).is_ok());
    }

    #[test]
    fn malformed_input_is_refused_not_panicked_on() {
        assert_eq!(parse_authorization("Bearer x").unwrap(), None);
        for v in [
            "Digest ",
            "Digest username",
            "Digest username=\"a",
            "Digest username=\"a\", nonce=\"n\"",
        ] {
            assert!(parse_authorization(v).is_err(), "{v}");
        }
        let key = NonceKey::new(&[1; 32]);
        for n in ["", "x", "!!!!", &"A".repeat(40)] {
            assert!(key.check(n, 0, 60).is_err(), "{n}");
        }
        assert!(DigestUsers::parse("a:b", "b").is_err());
        assert!(DigestUsers::parse("a:b:xyz", "b").is_err());
        assert!(DigestUsers::parse(&format!("a:b:{}", "g".repeat(32)), "b").is_err());
    }

    #[test]
    fn challenges_name_the_algorithm_and_staleness() {
        assert_eq!(
            challenge("penstock", "N", Algorithm::Md5, true),
            "Digest realm=\"penstock\", nonce=\"N\", algorithm=MD5, qop=\"auth\", stale=true"
        );
    }
}
