//! Who may watch: signed URLs and the per-viewer session tokens of HLS segments (issue 35).
//!
//! Pure: the caller hands in the keys (read from files by the server), the request's
//! canonical path and query, the peer's address and `now` in Unix seconds. Nothing here reads
//! a clock or a file.
//!
//! A **signed URL** carries `?expires=UNIX&kid=K&sig=TAG` and optionally `&ip=PREFIX`; `TAG`
//! is HMAC-SHA256 (ring's, whose `verify` compares in constant time), base64url without
//! padding, over [`signed_message`]: the canonical path (percent-decoded, dot-segment free:
//! [`crate::http::normalize_path`], the one the HTTP server resolves files by), the expiry,
//! the key id and the address prefix. Other query parameters are ignored (players add their
//! own); each of ours may appear once.
//!
//! A **session token** is what the server writes into the segment URIs of a playlist it
//! answered to a signed request: the same fields plus `sid` (the viewer session id, derived
//! from the credential, so one signed URL is one session), signed under another domain
//! string ([`session_message`]) with an expiry no later than the credential's. A segment
//! request is then checked by one HMAC against the same keys, never by a second
//! authentication round.

use std::fmt;
use std::net::IpAddr;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use ring::hmac;

pub mod digest;
pub mod jwt;
pub mod ledger;
#[cfg(test)]
mod tests;

/// The most keys a keyring holds (the configuration refuses more).
pub const KEYS_MAX: usize = 64;
/// The longest key id, in bytes.
pub const KEY_ID_BYTES_MAX: usize = 64;
/// The shortest secret accepted, in bytes (HMAC-SHA256's output size: a shorter secret
/// weakens the tag).
pub const SECRET_BYTES_MIN: usize = 32;
/// The longest secret accepted, in bytes.
pub const SECRET_BYTES_MAX: usize = 4096;
/// The length of an HMAC-SHA256 tag in bytes.
pub const TAG_BYTES: usize = 32;
/// The most query parameters looked at (the rest of a longer query is not walked).
pub const QUERY_PARAMS_MAX: usize = 64;

/// Why a credential was refused. The server answers 401 for [`AuthError::Missing`] and 403
/// for the rest, and logs [`AuthError::reason`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    #[error("no credential")]
    Missing,
    #[error("malformed credential: {0}")]
    Malformed(&'static str),
    #[error("expired")]
    Expired,
    #[error("unknown key id")]
    UnknownKey,
    #[error("bad signature")]
    BadSignature,
    #[error("address not allowed by the credential")]
    Address,
    #[error("not valid yet (nbf)")]
    NotYetValid,
    #[error("wrong audience")]
    Audience,
    #[error("wrong issuer")]
    Issuer,
    #[error("algorithm refused (none, or not the key's)")]
    Algorithm,
    #[error("the path is not among those the token grants")]
    NotGranted,
    /// The token's `jti` is on the deny list (`[auth] deny_file`).
    #[error("revoked")]
    Revoked,
}

impl AuthError {
    /// A short fixed word for logs and metrics labels.
    pub fn reason(&self) -> &'static str {
        match self {
            AuthError::Missing => "missing",
            AuthError::Malformed(_) => "malformed",
            AuthError::Expired => "expired",
            AuthError::UnknownKey => "unknown_kid",
            AuthError::BadSignature => "bad_signature",
            AuthError::Address => "address",
            AuthError::NotYetValid => "not_yet_valid",
            AuthError::Audience => "audience",
            AuthError::Issuer => "issuer",
            AuthError::Algorithm => "algorithm",
            AuthError::NotGranted => "path_not_granted",
            AuthError::Revoked => "revoked",
        }
    }
}

/// Why a key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    #[error("key id {0:?}: 1 ..= 64 bytes of letters, digits, '-', '_' or '.'")]
    BadId(String),
    #[error("key {0:?}: the secret must be {SECRET_BYTES_MIN} ..= {SECRET_BYTES_MAX} bytes")]
    BadSecret(String),
    #[error("key id {0:?} appears twice")]
    Duplicate(String),
    #[error("at most {KEYS_MAX} keys")]
    TooMany,
}

/// One HMAC key and its id. The secret is never printed.
#[derive(Clone)]
pub struct Key {
    id: String,
    key: hmac::Key,
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Key")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Key {
    pub fn new(id: &str, secret: &[u8]) -> Result<Key, KeyError> {
        if !valid_key_id(id) {
            return Err(KeyError::BadId(id.to_string()));
        }
        if !(SECRET_BYTES_MIN..=SECRET_BYTES_MAX).contains(&secret.len()) {
            return Err(KeyError::BadSecret(id.to_string()));
        }
        Ok(Key {
            id: id.to_string(),
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
        })
    }

    pub fn id(&self) -> &str {
        &self.id
    }
}

/// Whether `id` may name a key (it travels in URLs unescaped).
pub fn valid_key_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= KEY_ID_BYTES_MAX
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// The keys a server accepts; the first signs.
#[derive(Debug, Clone, Default)]
pub struct Keyring {
    keys: Vec<Key>,
}

impl Keyring {
    pub fn new(keys: Vec<Key>) -> Result<Keyring, KeyError> {
        if keys.len() > KEYS_MAX {
            return Err(KeyError::TooMany);
        }
        for (i, k) in keys.iter().enumerate() {
            if keys[..i].iter().any(|o| o.id == k.id) {
                return Err(KeyError::Duplicate(k.id.clone()));
            }
        }
        Ok(Keyring { keys })
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The key that signs: the first, or the one named.
    pub fn signing_key(&self, id: Option<&str>) -> Option<&Key> {
        match id {
            None => self.keys.first(),
            Some(id) => self.get(id),
        }
    }

    pub fn get(&self, id: &str) -> Option<&Key> {
        self.keys.iter().find(|k| k.id == id)
    }

    /// The key ids, in order.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|k| k.id.as_str())
    }
}

/// An address prefix: `192.0.2.0/24`, `2001:db8::/32`, or one address (its full length).
/// Kept with the host bits cleared, so that its text is canonical.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpPrefix {
    addr: IpAddr,
    len: u8,
}

impl IpPrefix {
    pub fn parse(s: &str) -> Option<IpPrefix> {
        let (a, len) = match s.split_once('/') {
            Some((a, l)) => {
                if l.is_empty() || l.len() > 3 || !l.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                (a, Some(l.parse::<u8>().ok()?))
            }
            None => (s, None),
        };
        let addr: IpAddr = a.parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = len.unwrap_or(max);
        if len > max {
            return None;
        }
        Some(IpPrefix {
            addr: mask(addr, len),
            len,
        })
    }

    /// Whether `ip` is inside the prefix (an IPv4-mapped IPv6 address counts as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        ip.is_ipv4() == self.addr.is_ipv4() && mask(ip, self.len) == self.addr
    }
}

impl fmt::Display for IpPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

fn mask(ip: IpAddr, len: u8) -> IpAddr {
    match ip {
        IpAddr::V4(a) => {
            let m = if len == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(len))
            };
            IpAddr::V4((u32::from(a) & m).into())
        }
        IpAddr::V6(a) => {
            let m = if len == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(len))
            };
            IpAddr::V6((u128::from(a) & m).into())
        }
    }
}

/// The credential fields of a query (parsed, not yet verified).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub expires_s: u64,
    pub kid: String,
    pub ip: Option<IpPrefix>,
    /// A session token's viewer session id; `None` for a signed URL.
    pub sid: Option<String>,
    /// A session token's revocation id: the JWT's `jti` its playlist was answered to
    /// ([`revocation_id`]); only with `sid`.
    pub jti: Option<String>,
    pub tag: [u8; TAG_BYTES],
}

impl Credential {
    pub fn kind(&self) -> Kind {
        if self.sid.is_some() {
            Kind::Session
        } else {
            Kind::Signed
        }
    }
}

/// What kind of check a credential needs: a signed URL's, or a session token's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Signed,
    Session,
}

impl Kind {
    /// The metrics label.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Signed => "signed",
            Kind::Session => "session",
        }
    }
}

/// The query parameter names of a credential.
const NAMES: [&str; 6] = ["expires", "kid", "sig", "ip", "sid", "jti"];

/// The credential in `query` (still percent-encoded, without `?`): `Ok(None)` when it names
/// none of `expires`, `kid`, `sig`, `ip`, `sid`; an error when it names some but not a whole,
/// well-formed credential, or one of them twice.
pub fn parse_query(query: &str) -> Result<Option<Credential>, AuthError> {
    let mut found: [Option<String>; 6] = Default::default();
    let mut any = false;
    // Parameters past the first QUERY_PARAMS_MAX are not looked at.
    for pair in query.split('&').take(QUERY_PARAMS_MAX) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let Some(i) = NAMES.iter().position(|&k| k == name) else {
            continue;
        };
        any = true;
        if found[i].is_some() {
            return Err(AuthError::Malformed("a parameter appears twice"));
        }
        found[i] = Some(percent_decode(value).ok_or(AuthError::Malformed("bad percent-escape"))?);
    }
    if !any {
        return Ok(None);
    }
    let [expires, kid, sig, ip, sid, jti] = found;
    let expires = expires.ok_or(AuthError::Malformed("no expires"))?;
    let kid = kid.ok_or(AuthError::Malformed("no kid"))?;
    let sig = sig.ok_or(AuthError::Malformed("no sig"))?;
    if expires.is_empty() || expires.len() > 20 || !expires.bytes().all(|b| b.is_ascii_digit()) {
        return Err(AuthError::Malformed("expires is not a Unix time"));
    }
    let expires_s: u64 = expires
        .parse()
        .map_err(|_| AuthError::Malformed("expires is not a Unix time"))?;
    if !valid_key_id(&kid) {
        return Err(AuthError::Malformed("kid"));
    }
    let ip = match ip {
        None => None,
        Some(s) => Some(IpPrefix::parse(&s).ok_or(AuthError::Malformed("ip is not a prefix"))?),
    };
    if let Some(s) = &sid
        && !valid_sid(s)
    {
        return Err(AuthError::Malformed("sid"));
    }
    match (&jti, &sid) {
        (Some(_), None) => return Err(AuthError::Malformed("jti without sid")),
        (Some(j), Some(_)) if !valid_revocation_id(j) => {
            return Err(AuthError::Malformed("jti"));
        }
        _ => {}
    }
    let mut tag = [0u8; TAG_BYTES];
    if sig.len() != 43 {
        return Err(AuthError::Malformed(
            "sig is not a base64url HMAC-SHA256 tag",
        ));
    }
    match B64.decode_slice(sig.as_bytes(), &mut tag) {
        Ok(TAG_BYTES) => {}
        _ => {
            return Err(AuthError::Malformed(
                "sig is not a base64url HMAC-SHA256 tag",
            ));
        }
    }
    // base64url of 32 bytes leaves 2 spare bits: a sig whose spare bits are set would be a
    // second spelling of the same tag. One spelling only.
    if B64.encode(tag) != sig {
        return Err(AuthError::Malformed(
            "sig is not a base64url HMAC-SHA256 tag",
        ));
    }
    Ok(Some(Credential {
        expires_s,
        kid,
        ip,
        sid,
        jti,
        tag,
    }))
}

/// A revocation id as a session token carries it: 1 ..= 64 letters, digits, `-`, `_`, `.`.
fn valid_revocation_id(s: &str) -> bool {
    valid_key_id(s)
}

/// The id a JWT's `jti` is revoked by, in a session token and on the deny list: the `jti`
/// itself when it is 1 ..= 64 letters, digits, `-`, `_` or `.`; else `h.` and 128 bits of
/// SHA-256 over it, base64url (a `jti` of any other bytes needs no escaping in a URL).
pub fn revocation_id(jti: &str) -> String {
    if valid_revocation_id(jti) && !jti.starts_with("h.") {
        return jti.to_string();
    }
    let d = ring::digest::digest(&ring::digest::SHA256, jti.as_bytes());
    format!("h.{}", B64.encode(&d.as_ref()[..16]))
}

/// A session id: 1 ..= 32 base64url characters.
fn valid_sid(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 32
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// `%XX` decoded; `None` for a bad escape or bytes that are not UTF-8. `+` stays `+`.
fn percent_decode(s: &str) -> Option<String> {
    if !s.contains('%') {
        return Some(s.to_string());
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            if !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
                return None;
            }
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// What a signed URL's tag is computed over.
pub fn signed_message(path: &str, expires_s: u64, kid: &str, ip: Option<&IpPrefix>) -> String {
    message("penstock-signed-v1", path, expires_s, kid, ip, "")
}

/// What a session token's tag is computed over (another domain string: a session token is
/// never a signed URL, nor the reverse).
pub fn session_message(
    path: &str,
    expires_s: u64,
    kid: &str,
    ip: Option<&IpPrefix>,
    sid: &str,
    jti: Option<&str>,
) -> String {
    let mut m = message("penstock-session-v1", path, expires_s, kid, ip, sid);
    // A session token of a JWT's playlist binds the token's revocation id: one more line
    // (no field holds a newline, so the two forms never collide).
    if let Some(j) = jti {
        m.push('\n');
        m.push_str(j);
    }
    m
}

fn message(
    domain: &str,
    path: &str,
    expires_s: u64,
    kid: &str,
    ip: Option<&IpPrefix>,
    sid: &str,
) -> String {
    // Newline-separated: no field can hold a newline (a canonical path has no control
    // character, kid and sid are restricted, the prefix is printed by us).
    let ip = ip.map(ToString::to_string).unwrap_or_default();
    format!("{domain}\n{path}\n{expires_s}\n{kid}\n{ip}\n{sid}")
}

/// The query that signs `path` (canonical, as [`crate::http::normalize_path`] makes it)
/// until `expires_s`, with `key`, for clients within `ip` if given.
pub fn sign_query(key: &Key, path: &str, expires_s: u64, ip: Option<&IpPrefix>) -> String {
    let tag = hmac::sign(
        &key.key,
        signed_message(path, expires_s, &key.id, ip).as_bytes(),
    );
    let mut q = format!("expires={expires_s}&kid={}", key.id);
    if let Some(ip) = ip {
        q.push_str(&format!("&ip={ip}"));
    }
    q.push_str("&sig=");
    q.push_str(&B64.encode(tag.as_ref()));
    q
}

/// What a verified credential grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub kind: Kind,
    pub expires_s: u64,
    pub kid: String,
    pub ip: Option<IpPrefix>,
    /// The viewer session: the token's `sid`, or for a signed URL the id derived from its tag
    /// (one signed URL, one session).
    pub sid: String,
    /// The revocation id of the JWT behind it ([`revocation_id`] of its `jti`), written into
    /// its session tokens so that a revoked token's segments are refused.
    pub jti: Option<String>,
}

/// Checks `cred` for `path` (canonical) from `peer` at `now_s`: the key, the tag (constant
/// time), then the expiry and the address.
pub fn verify(
    keys: &Keyring,
    cred: &Credential,
    path: &str,
    peer: IpAddr,
    now_s: u64,
) -> Result<Grant, AuthError> {
    let key = keys.get(&cred.kid).ok_or(AuthError::UnknownKey)?;
    let msg = match &cred.sid {
        None => signed_message(path, cred.expires_s, &cred.kid, cred.ip.as_ref()),
        Some(sid) => session_message(
            path,
            cred.expires_s,
            &cred.kid,
            cred.ip.as_ref(),
            sid,
            cred.jti.as_deref(),
        ),
    };
    hmac::verify(&key.key, msg.as_bytes(), &cred.tag).map_err(|_| AuthError::BadSignature)?;
    if now_s >= cred.expires_s {
        return Err(AuthError::Expired);
    }
    if let Some(ip) = &cred.ip
        && !ip.contains(peer)
    {
        return Err(AuthError::Address);
    }
    let sid = match &cred.sid {
        Some(s) => s.clone(),
        None => session_id(key, &cred.tag),
    };
    Ok(Grant {
        kind: cred.kind(),
        expires_s: cred.expires_s,
        kid: cred.kid.clone(),
        ip: cred.ip,
        sid,
        jti: cred.jti.clone(),
    })
}

/// The viewer session id of a signed URL: 16 base64url characters of an HMAC of its tag,
/// so it cannot be chosen without the key and is the same at each request of the URL.
fn session_id(key: &Key, tag: &[u8; TAG_BYTES]) -> String {
    let mut m = Vec::with_capacity(20 + TAG_BYTES);
    m.extend_from_slice(b"penstock-sid-v1\n");
    m.extend_from_slice(tag);
    let t = hmac::sign(&key.key, &m);
    B64.encode(&t.as_ref()[..12])
}

/// A grant for HLS session tokens made from a verified JWT: signed with the first key of
/// `keys` (`None` without one), valid until the JWT's expiry, its session id derived from
/// the token by the key (one JWT, one session).
pub fn grant_for_jwt(
    keys: &Keyring,
    token: &str,
    expires_s: u64,
    jti: Option<&str>,
) -> Option<Grant> {
    let key = keys.signing_key(None)?;
    let mut m = Vec::with_capacity(24 + token.len());
    m.extend_from_slice(b"penstock-jwt-sid-v1\n");
    m.extend_from_slice(token.as_bytes());
    let t = hmac::sign(&key.key, &m);
    Some(Grant {
        kind: Kind::Signed,
        expires_s,
        kid: key.id.clone(),
        ip: None,
        sid: B64.encode(&t.as_ref()[..12]),
        jti: jti.map(revocation_id),
    })
}

/// The JWT a request carries: `Authorization: Bearer TOKEN`, else `?jwt=TOKEN` (players that
/// cannot set headers); `None` when neither.
pub fn bearer_token<'a>(authorization: Option<&'a str>, query: Option<&'a str>) -> Option<&'a str> {
    if let Some(a) = authorization {
        let (scheme, rest) = a.trim().split_once(' ')?;
        if scheme.eq_ignore_ascii_case("bearer") {
            return Some(rest.trim());
        }
        return None;
    }
    query?
        .split('&')
        .take(QUERY_PARAMS_MAX)
        .find_map(|p| p.strip_prefix("jwt="))
}

/// The query a playlist answered to `grant` writes after the URIs of its segments (the file
/// at `path`, canonical): a session token for that path, signed with the grant's key, valid
/// until the grant's expiry or `now_s + ttl_s`, whichever comes first. `None` when the
/// grant's key is no longer in `keys`.
pub fn session_query(
    keys: &Keyring,
    grant: &Grant,
    path: &str,
    now_s: u64,
    ttl_s: u64,
) -> Option<String> {
    let key = keys.get(&grant.kid)?;
    let expires_s = grant.expires_s.min(now_s.saturating_add(ttl_s));
    let msg = session_message(
        path,
        expires_s,
        &key.id,
        grant.ip.as_ref(),
        &grant.sid,
        grant.jti.as_deref(),
    );
    let tag = hmac::sign(&key.key, msg.as_bytes());
    let mut q = format!("expires={expires_s}&kid={}", key.id);
    if let Some(ip) = &grant.ip {
        q.push_str(&format!("&ip={ip}"));
    }
    q.push_str(&format!("&sid={}", grant.sid));
    if let Some(j) = &grant.jti {
        q.push_str(&format!("&jti={j}"));
    }
    q.push_str(&format!("&sig={}", B64.encode(tag.as_ref())));
    Some(q)
}
