//! Who may watch (issue 35, docs/security.md "Viewers"): the keys of signed URLs read from
//! their files, the locations' `auth` and `serve_hidden`, and the one check HTTP, HLS and
//! RTSP call. The verification itself is `penstock_core::auth` (pure); this module loads
//! keys, reads the clock, counts and logs.
//!
//! The state is replaced whole on SIGHUP ([`Viewers::stage`] reads every key file first: a
//! bad one refuses the reload and the keys in force stay).

use std::collections::HashSet;
use std::net::IpAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use penstock_core::auth::jwt::{Jwks, JwtPolicy};
use penstock_core::auth::ledger::{LedgerRefusal, SessionLedger, ViewerLimits};
use penstock_core::auth::{AuthError, Grant, Key, Keyring};

use crate::config::{AuthConfig, AuthMode, ConfigError, ServerConfig};
use crate::metrics::{AuthLabels, Metrics};

/// The longest secret file read (bytes).
const SECRET_FILE_BYTES_MAX: u64 = penstock_core::auth::SECRET_BYTES_MAX as u64 + 2;

/// Reads the keys of `[auth] keys`: each file must be a regular file closed to group and
/// others, holding 32 ..= 4096 bytes (one trailing `\n` or `\r\n` is not part of the secret).
pub fn load_keys(cfg: &AuthConfig) -> Result<Keyring, ConfigError> {
    let mut keys = Vec::with_capacity(cfg.keys.len());
    for k in &cfg.keys {
        let secret = read_secret(&k.secret_file)
            .map_err(|why| ConfigError::Invalid(format!("auth.keys {:?}: {why}", k.id)))?;
        keys.push(
            Key::new(&k.id, &secret)
                .map_err(|e| ConfigError::Invalid(format!("auth.keys: {e}")))?,
        );
    }
    Keyring::new(keys).map_err(|e| ConfigError::Invalid(format!("auth.keys: {e}")))
}

/// The longest JWKS file read (bytes).
const JWKS_FILE_BYTES_MAX: u64 = 1 << 20;

/// Reads `[auth] jwks_file`: a JWKS holding a shared secret (`oct`) must be closed to group
/// and others; none may be writable by them.
pub fn load_jwks(cfg: &AuthConfig) -> Result<Option<Jwks>, ConfigError> {
    let Some(path) = &cfg.jwks_file else {
        return Ok(None);
    };
    let bad =
        |why: String| ConfigError::Invalid(format!("auth.jwks_file {}: {why}", path.display()));
    let (text, mode) = read_config_file(
        path,
        JWKS_FILE_BYTES_MAX,
        0o022,
        "writable by group or others",
    )
    .map_err(bad)?;
    let jwks = Jwks::parse(&text).map_err(|e| bad(e.to_string()))?;
    if jwks.has_secrets() && mode & 0o077 != 0 {
        return Err(bad(format!(
            "holds a shared secret (kty oct) and is open to group or others (mode {mode:04o}): `chmod 600` it"
        )));
    }
    Ok(Some(jwks))
}

/// The longest deny file read (bytes), and the most ids it may list.
const DENY_FILE_BYTES_MAX: u64 = 4 << 20;
const DENY_IDS_MAX: usize = 100_000;

/// Reads `[auth] deny_file`: the revocation ids ([`penstock_core::auth::revocation_id`]) of
/// the `jti`s it lists, one a line.
pub fn load_deny(cfg: &AuthConfig) -> Result<HashSet<String>, ConfigError> {
    let Some(path) = &cfg.deny_file else {
        return Ok(HashSet::new());
    };
    let bad =
        |why: String| ConfigError::Invalid(format!("auth.deny_file {}: {why}", path.display()));
    let (text, _) = read_config_file(path, DENY_FILE_BYTES_MAX, 0, "").map_err(bad)?;
    let ids: HashSet<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(penstock_core::auth::revocation_id)
        .collect();
    if ids.len() > DENY_IDS_MAX {
        return Err(bad(format!("more than {DENY_IDS_MAX} ids")));
    }
    Ok(ids)
}

/// The longest Digest users file read (bytes).
const DIGEST_USERS_FILE_BYTES_MAX: u64 = 4 << 20;

/// Reads `[auth] digest_users_file` (an HA1 is as good as the password for this realm: the
/// file must be closed to group and others).
pub fn load_digest_users(
    cfg: &AuthConfig,
) -> Result<Option<penstock_core::auth::digest::DigestUsers>, ConfigError> {
    let Some(path) = &cfg.digest_users_file else {
        return Ok(None);
    };
    let bad = |why: String| {
        ConfigError::Invalid(format!("auth.digest_users_file {}: {why}", path.display()))
    };
    let (text, _) = read_config_file(
        path,
        DIGEST_USERS_FILE_BYTES_MAX,
        0o077,
        "open to group or others",
    )
    .map_err(bad)?;
    penstock_core::auth::digest::DigestUsers::parse(&text, &cfg.digest_realm())
        .map(Some)
        .map_err(bad)
}

/// Reads a text file the server trusts (JWKS, deny list, Digest users): at most `max` bytes
/// (a longer file is refused), refused when its mode has any of `forbidden` bits (`what`
/// says why: the mode and `chmod 600` follow). Returns the text and the mode's low bits.
fn read_config_file(
    path: &Path,
    max: u64,
    forbidden: u32,
    what: &str,
) -> Result<(String, u32), String> {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    let f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mode = f
        .metadata()
        .map_err(|e| e.to_string())?
        .permissions()
        .mode()
        & 0o777;
    if mode & forbidden != 0 {
        return Err(format!("{what} (mode {mode:04o}): `chmod 600` it"));
    }
    let mut text = String::new();
    f.take(max + 1)
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    if text.len() as u64 > max {
        return Err(format!("longer than {max} bytes"));
    }
    Ok((text, mode))
}

fn read_secret(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let meta = f
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{}: not a regular file", path.display()));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "secret file {} is open to group or others (mode {mode:04o}): `chmod 600` it",
            path.display()
        ));
    }
    let mut secret = Vec::new();
    f.take(SECRET_FILE_BYTES_MAX + 1)
        .read_to_end(&mut secret)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if secret.ends_with(b"\n") {
        secret.pop();
        if secret.ends_with(b"\r") {
            secret.pop();
        }
    }
    if !(penstock_core::auth::SECRET_BYTES_MIN..=penstock_core::auth::SECRET_BYTES_MAX)
        .contains(&secret.len())
    {
        return Err(format!(
            "secret file {}: {} bytes; a secret is {} ..= {} bytes (e.g. `openssl rand -base64 48`)",
            path.display(),
            secret.len(),
            penstock_core::auth::SECRET_BYTES_MIN,
            penstock_core::auth::SECRET_BYTES_MAX
        ));
    }
    Ok(secret)
}

/// What is in force: the keys, the locations' rules (longest prefix first), the session
/// tokens' lifetime.
#[derive(Debug, Default)]
pub(crate) struct State {
    keys: Keyring,
    /// The keys that name a tenant (`[auth] keys = [{ …, tenant = "acme" }]`): (id, tenant).
    key_tenants: Vec<(String, String)>,
    jwks: Option<Jwks>,
    jwt_policy: JwtPolicy,
    locations: Vec<(String, AuthMode, bool)>,
    session_ttl_s: u64,
    /// Revoked tokens' revocation ids (`[auth] deny_file`).
    denied: HashSet<String>,
    /// RTSP Digest: the users, the challenge's algorithm, the nonces' lifetime.
    digest_users: Option<penstock_core::auth::digest::DigestUsers>,
    digest_algorithm: Option<penstock_core::auth::digest::Algorithm>,
    digest_nonce_ttl_s: u64,
}

/// What a request may do, once checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// The location asks for nothing.
    Open,
    /// A credential was verified: `grant` is what HLS session tokens are made from (`None`:
    /// a JWT and no HMAC key to sign session tokens with); `limits` what a JWT's claims
    /// ask of its sessions (`sessions`, `rate`, `tenant`).
    Granted {
        grant: Option<Grant>,
        limits: Option<ViewerLimits>,
    },
    /// Refused: 401 for [`AuthError::Missing`], else 403.
    Refused(AuthError),
}

/// What an RTSP request of a Digest location gets when it is not let through: `401` with
/// this `WWW-Authenticate` value (a fresh challenge; `stale=true` for an expired nonce).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DigestChallenge(pub(crate) String);

/// The viewers' access rules of one server, shared by HTTP and RTSP.
#[derive(Debug)]
pub(crate) struct Viewers {
    state: Mutex<Arc<State>>,
    /// The open sessions of each credential with a `sessions` cap (`penstock_core::auth::ledger`).
    ledger: Arc<Mutex<SessionLedger>>,
    /// Bumped when the deny list changes: HTTP workers and the RTSP reaper then end the
    /// sessions of newly revoked tokens.
    deny_generation: AtomicU64,
    /// The key of RTSP Digest nonces (random at start, kept across reloads).
    nonce_key: penstock_core::auth::digest::NonceKey,
    /// `penstock_auth_checks_total{kind,result}`, every series made at start (present at 0)
    /// and found here without allocating: a flood of bad credentials costs no label strings.
    checks: Vec<(
        &'static str,
        &'static str,
        prometheus_client::metrics::counter::Counter,
    )>,
}

/// The kinds of check counted.
const CHECK_KINDS: [&str; 4] = ["signed", "session", "jwt", "digest"];
/// The results counted: `ok` and each refusal's reason.
const CHECK_RESULTS: [&str; 16] = [
    "ok",
    "missing",
    "malformed",
    "expired",
    "unknown_kid",
    "bad_signature",
    "address",
    "not_yet_valid",
    "audience",
    "issuer",
    "algorithm",
    "path_not_granted",
    "revoked",
    "bad_nonce",
    "unknown_user",
    "bad_response",
];

/// A random key for RTSP Digest nonces.
fn nonce_key() -> penstock_core::auth::digest::NonceKey {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 32];
    // The system's random source does not fail once the kernel's is seeded; if it did,
    // no nonce key is better than a guessable one.
    ring::rand::SystemRandom::new()
        .fill(&mut b)
        .expect("the system's random source gives 32 bytes");
    penstock_core::auth::digest::NonceKey::new(&b)
}

fn check_counters(
    metrics: &Metrics,
) -> Vec<(
    &'static str,
    &'static str,
    prometheus_client::metrics::counter::Counter,
)> {
    let mut v = Vec::with_capacity(CHECK_KINDS.len() * CHECK_RESULTS.len());
    for kind in CHECK_KINDS {
        for result in CHECK_RESULTS {
            let c = metrics
                .auth_checks
                .get_or_create(&AuthLabels {
                    kind: kind.into(),
                    result: result.into(),
                })
                .clone();
            v.push((kind, result, c));
        }
    }
    v
}

impl Viewers {
    /// Whether `token` is a JWT of the configured JWKS (`[auth] jwks_file`, the same checks
    /// as a viewer's: signature and algorithm, `exp`/`nbf`, `aud`/`iss`, not revoked) that
    /// carries `"admin": true` and no `paths` restriction: the operator's API takes it as it
    /// takes the control token (docs/api.md).
    pub(crate) fn admin_jwt(&self, token: &str, now_s: u64) -> bool {
        let s = self.state();
        let Some(jwks) = &s.jwks else {
            return false;
        };
        penstock_core::auth::jwt::verify_jwt(jwks, token, &s.jwt_policy, "/", now_s).is_ok_and(
            |g| {
                g.admin
                    && g.paths.is_none()
                    && !g
                        .jti
                        .as_deref()
                        .map(penstock_core::auth::revocation_id)
                        .is_some_and(|j| s.denied.contains(&j))
            },
        )
    }

    pub(crate) fn new(cfg: &ServerConfig, metrics: Arc<Metrics>) -> Result<Viewers, ConfigError> {
        let state = Viewers::stage(cfg)?;
        Ok(Viewers {
            state: Mutex::new(Arc::new(state)),
            ledger: Arc::new(Mutex::new(SessionLedger::new(cfg.auth.credentials_max()))),
            deny_generation: AtomicU64::new(0),
            nonce_key: nonce_key(),
            checks: check_counters(&metrics),
        })
    }

    /// No key, no location rule: every request is [`Decision::Open`].
    pub(crate) fn open(metrics: Arc<Metrics>) -> Viewers {
        Viewers {
            state: Mutex::new(Arc::new(State::default())),
            ledger: Arc::new(Mutex::new(SessionLedger::new(1))),
            deny_generation: AtomicU64::new(0),
            nonce_key: nonce_key(),
            checks: check_counters(&metrics),
        }
    }

    /// Reads what `cfg` names (the key files); nothing changes until [`Viewers::commit`].
    pub(crate) fn stage(cfg: &ServerConfig) -> Result<State, ConfigError> {
        let keys = load_keys(&cfg.auth)?;
        let jwks = load_jwks(&cfg.auth)?;
        let denied = load_deny(&cfg.auth)?;
        let digest_users = load_digest_users(&cfg.auth)?;
        let mut locations: Vec<(String, AuthMode, bool)> = cfg
            .location
            .iter()
            .map(|l| (l.prefix.clone(), l.auth, l.serve_hidden))
            .collect();
        locations.sort_by_key(|l| std::cmp::Reverse(l.0.len()));
        Ok(State {
            keys,
            key_tenants: cfg
                .auth
                .keys
                .iter()
                .filter_map(|k| Some((k.id.clone(), k.tenant.clone()?)))
                .collect(),
            jwks,
            jwt_policy: JwtPolicy {
                audiences: cfg.auth.jwt_audiences.clone(),
                issuers: cfg.auth.jwt_issuers.clone(),
                leeway_s: 0,
            },
            locations,
            session_ttl_s: cfg.auth.session_ttl().as_secs().max(1),
            denied,
            digest_users,
            digest_algorithm: Some(if cfg.auth.digest_algorithm.as_deref() == Some("SHA-256") {
                penstock_core::auth::digest::Algorithm::Sha256
            } else {
                penstock_core::auth::digest::Algorithm::Md5
            }),
            digest_nonce_ttl_s: cfg.auth.digest_nonce_ttl().as_secs().max(1),
        })
    }

    pub(crate) fn commit(&self, state: State) {
        let mut cur = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let newly_denied = state.denied.iter().any(|j| !cur.denied.contains(j));
        *cur = Arc::new(state);
        drop(cur);
        if newly_denied {
            self.deny_generation.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Changes each time tokens are newly revoked.
    pub(crate) fn deny_generation(&self) -> u64 {
        self.deny_generation.load(Ordering::Acquire)
    }

    /// Whether the token of revocation id `jti` is on the deny list.
    pub(crate) fn is_revoked(&self, jti: &str) -> bool {
        self.state().denied.contains(jti)
    }

    /// How many ids the deny list holds (for the reload report).
    pub(crate) fn denied_count(&self) -> usize {
        self.state().denied.len()
    }

    fn state(&self) -> Arc<State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The key ids in force (for the reload report).
    pub(crate) fn key_ids(&self) -> Vec<String> {
        self.state().keys.ids().map(str::to_string).collect()
    }

    /// Whether hidden and backup files may be served at `path` (canonical, with its `/`).
    pub(crate) fn serves_hidden(&self, path: &str) -> bool {
        let s = self.state();
        s.locations
            .iter()
            .find(|l| path.starts_with(&l.0))
            .is_some_and(|l| l.2)
    }

    /// The check of a request for `path` (canonical: `/a/b`) with `query` (as sent, without
    /// `?`) and `authorization` (the header) from `peer`. `protocol` names the way in for
    /// the log line of a refusal.
    ///
    /// A query credential (a signed URL, or an HLS session token) is checked as such; else
    /// a JWT (`Bearer`, `?jwt=`) where the location takes JWTs; else the request has none.
    pub(crate) fn check(
        &self,
        path: &str,
        query: Option<&str>,
        authorization: Option<&str>,
        peer: Option<IpAddr>,
        protocol: &'static str,
    ) -> Decision {
        let s = self.state();
        let mode = s
            .locations
            .iter()
            .find(|l| path.starts_with(&l.0))
            .map_or(AuthMode::None, |l| l.1);
        if mode == AuthMode::None {
            return Decision::Open;
        }
        if mode == AuthMode::Digest {
            // RTSP asks `check_digest`; anything else here is refused.
            return Decision::Refused(AuthError::Malformed("a Digest location is RTSP only"));
        }
        let now_s = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let takes_jwt = matches!(mode, AuthMode::Jwt | AuthMode::SignedOrJwt);
        let parsed = query.map_or(Ok(None), penstock_core::auth::parse_query);
        let bearer = penstock_core::auth::bearer_token(authorization, query);
        let (kind, result) = match parsed {
            // A signed URL where only JWTs are taken: the session tokens of a JWT's
            // playlist are, signed URLs are not.
            Ok(Some(c)) if mode == AuthMode::Jwt && c.sid.is_none() => (
                "signed",
                Err(AuthError::Malformed("a signed URL where a JWT is required")),
            ),
            Ok(Some(c)) => {
                let kind = c.kind().label();
                // No address: a Unix-socket peer, which no prefix contains.
                let peer_ip = peer.unwrap_or(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED));
                let r = penstock_core::auth::verify(&s.keys, &c, path, peer_ip, now_s);
                let r = match (r, peer) {
                    (Ok(_), None) if c.ip.is_some() => Err(AuthError::Address),
                    // A JWT's session token: refused once the JWT is revoked.
                    (Ok(g), _) if g.jti.as_ref().is_some_and(|j| s.denied.contains(j)) => {
                        Err(AuthError::Revoked)
                    }
                    (r, _) => r,
                };
                // A signed URL of a key that names a tenant: its streams are that tenant's.
                let limits = s
                    .key_tenants
                    .iter()
                    .find(|(id, _)| c.sid.is_none() && *id == c.kid)
                    .map(|(id, tenant)| ViewerLimits {
                        credential: format!("key:{id}"),
                        sessions_max: None,
                        rate_bytes_per_s: None,
                        tenant: Some(tenant.clone()),
                        jti: None,
                    });
                (kind, r.map(|g| (Some(g), limits)))
            }
            Err(e) => ("signed", Err(e)),
            Ok(None) => match (bearer, &s.jwks) {
                (Some(token), Some(jwks)) if takes_jwt => {
                    let r = penstock_core::auth::jwt::verify_jwt(
                        jwks,
                        token,
                        &s.jwt_policy,
                        path,
                        now_s,
                    )
                    .and_then(|g| {
                        let jti = g.jti.as_deref().map(penstock_core::auth::revocation_id);
                        if jti.as_ref().is_some_and(|j| s.denied.contains(j)) {
                            return Err(AuthError::Revoked);
                        }
                        Ok((
                            penstock_core::auth::grant_for_jwt(
                                &s.keys,
                                token,
                                g.expires_s,
                                jti.as_deref(),
                            ),
                            Some(ViewerLimits::of_jwt(&g, token)),
                        ))
                    });
                    ("jwt", r)
                }
                _ => (
                    if takes_jwt { "jwt" } else { "signed" },
                    Err(AuthError::Missing),
                ),
            },
        };
        let result_label = match &result {
            Ok(_) => "ok",
            Err(e) => e.reason(),
        };
        if let Some((_, _, c)) = self
            .checks
            .iter()
            .find(|(k, r, _)| *k == kind && *r == result_label)
        {
            c.inc();
        }
        match result {
            Ok((grant, limits)) => Decision::Granted { grant, limits },
            Err(e) => {
                if e != AuthError::Missing {
                    crate::peer_warn!(
                        "auth_refused",
                        protocol,
                        peer = ?peer,
                        path = %path,
                        kind,
                        reason = e.reason(),
                        "refused a viewer: {e}"
                    );
                }
                Decision::Refused(e)
            }
        }
    }

    /// Opens one session under `limits` (an HTTP connection, an RTSP session): `Ok(None)`
    /// when the credential has neither a `sessions` cap nor a `jti` (nothing to count or
    /// revoke); the place is given back when the [`SessionHold`] is dropped (the session
    /// ended).
    pub(crate) fn open_session(
        &self,
        limits: &ViewerLimits,
    ) -> Result<Option<SessionHold>, LedgerRefusal> {
        if limits.sessions_max.is_none() && limits.jti.is_none() {
            return Ok(None);
        }
        if let Some(max) = limits.sessions_max {
            self.ledger
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .open(&limits.credential, max)?;
        }
        Ok(Some(SessionHold {
            ledger: self.ledger.clone(),
            credential: limits.credential.clone(),
            counted: limits.sessions_max.is_some(),
            jti: limits
                .jti
                .as_deref()
                .map(penstock_core::auth::revocation_id),
        }))
    }

    /// Whether `path` lies in a location with `auth = "digest"`.
    pub(crate) fn is_digest(&self, path: &str) -> bool {
        self.state()
            .locations
            .iter()
            .find(|l| path.starts_with(&l.0))
            .is_some_and(|l| l.1 == AuthMode::Digest)
    }

    /// The RTSP Digest check of `method request_uri` with `authorization` from `peer`:
    /// `Err` is the challenge to answer with (401), counted and, for a wrong credential,
    /// logged (rate-limited).
    pub(crate) fn check_digest(
        &self,
        path: &str,
        method: &str,
        request_uri: &str,
        authorization: Option<&str>,
        peer: Option<IpAddr>,
    ) -> Result<(), DigestChallenge> {
        self.digest_user(path, method, request_uri, authorization, peer)
            .map(|_| ())
    }

    /// The RTSP Digest check of [`Viewers::check_digest`] whatever the location asks (an
    /// RTSP publisher's, `[rtsp.live.NAME] publishers`): the verified user's name.
    pub(crate) fn digest_user(
        &self,
        path: &str,
        method: &str,
        request_uri: &str,
        authorization: Option<&str>,
        peer: Option<IpAddr>,
    ) -> Result<String, DigestChallenge> {
        use penstock_core::auth::digest::{self, DigestError};
        let s = self.state();
        let now_s = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let users = s.digest_users.as_ref();
        let result = match (authorization.map(digest::parse_authorization), users) {
            (None | Some(Ok(None)), _) => Err(None),
            (Some(Err(e)), _) => Err(Some(e)),
            (Some(Ok(Some(_))), None) => Err(Some(DigestError::UnknownUser)),
            (Some(Ok(Some(r))), Some(u)) => digest::verify(
                u,
                &self.nonce_key,
                method,
                request_uri,
                &r,
                now_s,
                s.digest_nonce_ttl_s,
            )
            .map_err(Some),
        };
        let label = match &result {
            Ok(_) => "ok",
            Err(None) => "missing",
            Err(Some(DigestError::Malformed(_))) => "malformed",
            Err(Some(DigestError::Stale)) => "expired",
            Err(Some(DigestError::BadNonce)) => "bad_nonce",
            Err(Some(DigestError::UnknownUser)) => "unknown_user",
            Err(Some(_)) => "bad_response",
        };
        if let Some((_, _, c)) = self
            .checks
            .iter()
            .find(|(k, r, _)| *k == "digest" && *r == label)
        {
            c.inc();
        }
        match result {
            Ok(user) => Ok(user),
            Err(e) => {
                let stale = e == Some(DigestError::Stale);
                if let Some(e) = e.filter(|e| *e != DigestError::Stale) {
                    crate::peer_warn!(
                        "auth_refused",
                        protocol = "rtsp",
                        peer = ?peer,
                        path = %path,
                        kind = "digest",
                        reason = label,
                        "refused a viewer: {e}"
                    );
                }
                let realm = users.map_or("penstock", |u| u.realm());
                Err(DigestChallenge(digest::challenge(
                    realm,
                    &self.nonce_key.nonce(now_s),
                    s.digest_algorithm.unwrap_or(digest::Algorithm::Md5),
                    stale,
                )))
            }
        }
    }

    /// The query a playlist answered to `grant` writes after the URI of its segments, the
    /// file at `path` (canonical); `None` when the grant's key was removed since.
    pub(crate) fn session_query(&self, grant: &Grant, path: &str) -> Option<String> {
        let s = self.state();
        let now_s = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        penstock_core::auth::session_query(&s.keys, grant, path, now_s, s.session_ttl_s)
    }
}

/// One session of a credential: its place under the credential's `sessions` cap (given
/// back when dropped), and its revocation id (the session ends when the token is revoked).
#[derive(Debug)]
pub(crate) struct SessionHold {
    ledger: Arc<Mutex<SessionLedger>>,
    credential: String,
    /// Whether it holds a place in the ledger (the credential has a cap).
    counted: bool,
    jti: Option<String>,
}

impl SessionHold {
    /// The credential the place is counted under.
    pub(crate) fn credential(&self) -> &str {
        &self.credential
    }

    /// The token's revocation id, if it has a `jti`.
    pub(crate) fn jti(&self) -> Option<&str> {
        self.jti.as_deref()
    }
}

impl Drop for SessionHold {
    fn drop(&mut self) {
        if self.counted {
            self.ledger
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .close(&self.credential);
        }
    }
}

/// Whether `path` (any form: `/a/.b`, `a/b~`) names a hidden or backup file: a segment
/// starting with `.`, or a last segment ending in `~`, `.swp` or `.swo` (editors' leftovers,
/// the classic leak of a web root).
pub fn is_hidden(path: &str) -> bool {
    let mut segs = path.split('/').filter(|s| !s.is_empty()).peekable();
    while let Some(s) = segs.next() {
        if s.starts_with('.') {
            return true;
        }
        if segs.peek().is_none() {
            let lower = s.to_ascii_lowercase();
            return s.ends_with('~') || lower.ends_with(".swp") || lower.ends_with(".swo");
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every refusal's reason has its counter (a reason missing here would go uncounted).
    #[test]
    fn every_reason_is_counted() {
        for e in [
            AuthError::Missing,
            AuthError::Malformed("x"),
            AuthError::Expired,
            AuthError::UnknownKey,
            AuthError::BadSignature,
            AuthError::Address,
            AuthError::NotYetValid,
            AuthError::Audience,
            AuthError::Issuer,
            AuthError::Algorithm,
            AuthError::NotGranted,
            AuthError::Revoked,
        ] {
            assert!(CHECK_RESULTS.contains(&e.reason()), "{e:?}");
        }
    }

    #[test]
    fn hidden_and_backup_names() {
        for p in [
            "/.env",
            "/.git/config",
            "/a/.hidden/x.ts",
            "/x~",
            "/a/x.swp",
            "/a/X.SWO",
            ".env",
        ] {
            assert!(is_hidden(p), "{p}");
        }
        for p in [
            "/",
            "/a/b.ts",
            "/a~b/c",
            "/swp",
            "/a.swpx",
            "/x.ts/index.m3u8",
        ] {
            assert!(!is_hidden(p), "{p}");
        }
    }

    /// A key that names a tenant: the URLs it signs carry that tenant (their streams are
    /// admitted in its share); a key without one, none. A key naming a tenant that is not
    /// set is refused with the configuration.
    #[test]
    fn a_keys_tenant_is_its_signed_urls() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        for k in ["k1", "k2"] {
            let f = d.path().join(k);
            std::fs::write(&f, k.repeat(20)).unwrap();
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let conf = |tenant: &str| -> ServerConfig {
            toml::from_str(&format!(
                "[auth]\nkeys = [{{ id = \"k1\", secret_file = \"{d}/k1\", tenant = \"{tenant}\" }}, \
                 {{ id = \"k2\", secret_file = \"{d}/k2\" }}]\n\
                 [tenants.acme]\nrt_share = 0.3\n\
                 [[location]]\nprefix = \"/p/\"\nauth = \"signed\"\n",
                d = d.path().display()
            ))
            .unwrap()
        };
        let e = conf("zeta").check().unwrap_err().to_string();
        assert!(e.contains("tenant \"zeta\" is not set"), "{e}");
        let cfg = conf("acme");
        cfg.check().unwrap();
        let v = Viewers::new(&cfg, Arc::new(Metrics::new())).unwrap();
        let exp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 60;
        let tenant_of = |kid: &str| {
            let key = Key::new(kid, kid.repeat(20).as_bytes()).unwrap();
            let q = penstock_core::auth::sign_query(&key, "/p/a.ts", exp, None);
            match v.check("/p/a.ts", Some(&q), None, None, "http") {
                Decision::Granted { limits, .. } => limits.and_then(|l| l.tenant),
                d => panic!("{kid}: {d:?}"),
            }
        };
        assert_eq!(tenant_of("k1").as_deref(), Some("acme"));
        assert_eq!(tenant_of("k2"), None);
    }

    #[test]
    fn secret_files_must_be_private_and_long_enough() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("k");
        std::fs::write(&f, format!("{}\n", "s".repeat(40))).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_secret(&f).unwrap_err();
        assert!(e.contains("open to group or others"), "{e}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            read_secret(&f).unwrap().len(),
            40,
            "the newline is not the secret"
        );
        std::fs::write(&f, "short\n").unwrap();
        let e = read_secret(&f).unwrap_err();
        assert!(e.contains(": 5 bytes"), "{e}");
    }
}
