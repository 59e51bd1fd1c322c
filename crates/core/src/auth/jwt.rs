//! JWTs (RFC 7519) from a viewer's login service: `Authorization: Bearer`, `?jwt=`, or RTSP
//! `Authorization`, verified against the keys of a JWKS (RFC 7517) with `jsonwebtoken`
//! (ring underneath; HMAC compared in constant time). Pure: the JWKS text and `now` are
//! handed in; `exp` and `nbf` are checked here against that `now`, never against a clock.
//!
//! What is refused: an unknown `kid` (or, without one, no key of the header's algorithm),
//! `alg: none` (not an algorithm `jsonwebtoken` parses), an algorithm other than the key's
//! (HS256 "signed" with an RSA or EC public key: the key's family must be the algorithm's),
//! a JWK whose `alg` differs from the header's, no `exp`, `exp` passed, `nbf` ahead, an
//! `aud` or `iss` not among the configured ones, a path outside the `paths` claim.
//!
//! Claims applied: `paths` (path prefixes the token grants; absent: the whole location),
//! `sessions`, `rate`, `tenant` and `jti` are parsed and handed on ([`JwtGrant`]); the
//! server enforces the path grant, the `sessions` cap ([`super::ledger`]) and the `rate`
//! (the engine's pacing).

use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

use super::AuthError;

/// The longest JWT accepted, in bytes.
pub const JWT_BYTES_MAX: usize = 8192;
/// The most keys a JWKS may hold.
pub const JWKS_KEYS_MAX: usize = 64;
/// The most `paths` a token may grant.
pub const PATHS_MAX: usize = 64;

/// The keys of a JWKS, each with the algorithms it may verify.
pub struct Jwks {
    keys: Vec<JwksKey>,
}

struct JwksKey {
    /// An `oct` key: a shared secret (its file must be private).
    secret: bool,
    kid: Option<String>,
    key: DecodingKey,
    algorithms: Vec<Algorithm>,
}

impl std::fmt::Debug for Jwks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jwks")
            .field(
                "kids",
                &self.keys.iter().map(|k| k.kid.clone()).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Why a JWKS was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("JWKS: {0}")]
pub struct JwksError(pub String);

impl Jwks {
    /// Reads a JWKS (`{"keys":[…]}`). Keys of a type or curve this build cannot verify are
    /// refused, not skipped: a JWKS is the operator's, and a key silently ignored would be a
    /// surprise at the first login.
    pub fn parse(text: &str) -> Result<Jwks, JwksError> {
        let set: JwkSet =
            serde_json::from_str(text).map_err(|e| JwksError(format!("not a JWKS: {e}")))?;
        if set.keys.len() > JWKS_KEYS_MAX {
            return Err(JwksError(format!("more than {JWKS_KEYS_MAX} keys")));
        }
        let mut keys = Vec::with_capacity(set.keys.len());
        for (i, jwk) in set.keys.iter().enumerate() {
            let name = jwk.common.key_id.clone().unwrap_or_else(|| format!("#{i}"));
            let family: Vec<Algorithm> = match &jwk.algorithm {
                AlgorithmParameters::OctetKey(_) => {
                    vec![Algorithm::HS256, Algorithm::HS384, Algorithm::HS512]
                }
                AlgorithmParameters::RSA(_) => vec![
                    Algorithm::RS256,
                    Algorithm::RS384,
                    Algorithm::RS512,
                    Algorithm::PS256,
                    Algorithm::PS384,
                    Algorithm::PS512,
                ],
                AlgorithmParameters::EllipticCurve(p) => match p.curve {
                    jsonwebtoken::jwk::EllipticCurve::P256 => vec![Algorithm::ES256],
                    jsonwebtoken::jwk::EllipticCurve::P384 => vec![Algorithm::ES384],
                    _ => return Err(JwksError(format!("key {name}: an unsupported curve"))),
                },
                AlgorithmParameters::OctetKeyPair(p) => match p.curve {
                    jsonwebtoken::jwk::EllipticCurve::Ed25519 => vec![Algorithm::EdDSA],
                    _ => return Err(JwksError(format!("key {name}: an unsupported curve"))),
                },
            };
            // A key that names its algorithm verifies that one only.
            let algorithms = match &jwk.common.key_algorithm {
                None => family,
                Some(a) => {
                    let named: Algorithm = a.to_string().parse().map_err(|_| {
                        JwksError(format!("key {name}: alg {a} is not a signature"))
                    })?;
                    if !family.contains(&named) {
                        return Err(JwksError(format!(
                            "key {name}: alg {a} does not fit its key type"
                        )));
                    }
                    vec![named]
                }
            };
            let key =
                DecodingKey::from_jwk(jwk).map_err(|e| JwksError(format!("key {name}: {e}")))?;
            keys.push(JwksKey {
                secret: matches!(jwk.algorithm, AlgorithmParameters::OctetKey(_)),
                kid: jwk.common.key_id.clone(),
                key,
                algorithms,
            });
        }
        Ok(Jwks { keys })
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Whether any key is a shared secret (`kty: oct`).
    pub fn has_secrets(&self) -> bool {
        self.keys.iter().any(|k| k.secret)
    }
}

/// What the server asks of a token besides its signature.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JwtPolicy {
    /// Accepted audiences (`aud` must name one); empty: `aud` is not checked.
    pub audiences: Vec<String>,
    /// Accepted issuers; empty: `iss` is not checked.
    pub issuers: Vec<String>,
    /// Seconds of clock skew allowed on `exp` and `nbf`.
    pub leeway_s: u64,
}

/// What a verified token grants.
#[derive(Debug, Clone, PartialEq)]
pub struct JwtGrant {
    pub expires_s: u64,
    pub kid: Option<String>,
    /// Path prefixes granted (`None`: the claim is absent, every path of the location).
    pub paths: Option<Vec<String>>,
    pub sessions: Option<u32>,
    /// `rate` in bytes per second.
    pub rate_bytes_per_s: Option<u64>,
    pub tenant: Option<String>,
    pub jti: Option<String>,
    pub sub: Option<String>,
    /// `"admin": true`: the token may also drive the operator's API (docs/api.md), as the
    /// control token does.
    pub admin: bool,
}

impl JwtGrant {
    /// Whether the token grants `path` (canonical).
    pub fn allows(&self, path: &str) -> bool {
        match &self.paths {
            None => true,
            Some(p) => p.iter().any(|prefix| path.starts_with(prefix.as_str())),
        }
    }
}

#[derive(serde::Deserialize)]
struct Claims {
    exp: Option<f64>,
    nbf: Option<f64>,
    paths: Option<Vec<String>>,
    sessions: Option<u32>,
    rate: Option<serde_json::Value>,
    tenant: Option<String>,
    jti: Option<String>,
    sub: Option<String>,
    admin: Option<bool>,
}

/// Verifies `token` against `jwks` and `policy` at `now_s`, for `path`.
pub fn verify_jwt(
    jwks: &Jwks,
    token: &str,
    policy: &JwtPolicy,
    path: &str,
    now_s: u64,
) -> Result<JwtGrant, AuthError> {
    use jsonwebtoken::errors::ErrorKind;
    if token.len() > JWT_BYTES_MAX {
        return Err(AuthError::Malformed("JWT too long"));
    }
    // `alg: none` and unknown algorithms fail here: `Algorithm` has no such variant.
    let header = jsonwebtoken::decode_header(token).map_err(|e| match e.kind() {
        ErrorKind::Json(_) => AuthError::Algorithm,
        _ => AuthError::Malformed("JWT header"),
    })?;
    let candidates: Vec<&JwksKey> = match &header.kid {
        Some(kid) => jwks
            .keys
            .iter()
            .filter(|k| k.kid.as_deref() == Some(kid.as_str()))
            .collect(),
        None => jwks
            .keys
            .iter()
            .filter(|k| k.algorithms.contains(&header.alg))
            .collect(),
    };
    if candidates.is_empty() {
        return Err(AuthError::UnknownKey);
    }
    let mut last = AuthError::Algorithm;
    for k in candidates {
        if !k.algorithms.contains(&header.alg) {
            // HS256 over an RSA/EC public key, or any algorithm the key does not name.
            last = AuthError::Algorithm;
            continue;
        }
        let mut v = Validation::new(header.alg);
        // Times are ours (`now_s`): the crate would read the clock.
        v.validate_exp = false;
        v.validate_nbf = false;
        v.required_spec_claims = ["exp".to_string()].into_iter().collect();
        v.leeway = 0;
        if policy.audiences.is_empty() {
            v.validate_aud = false;
        } else {
            v.set_audience(&policy.audiences);
        }
        if !policy.issuers.is_empty() {
            v.set_issuer(&policy.issuers);
            v.required_spec_claims.insert("iss".into());
        }
        match jsonwebtoken::decode::<Claims>(token, &k.key, &v) {
            Ok(data) => return grant(data.claims, header.kid.clone(), policy, path, now_s),
            Err(e) => {
                last = match e.kind() {
                    ErrorKind::InvalidSignature => AuthError::BadSignature,
                    ErrorKind::InvalidAlgorithm => AuthError::Algorithm,
                    ErrorKind::InvalidAudience => AuthError::Audience,
                    ErrorKind::InvalidIssuer => AuthError::Issuer,
                    ErrorKind::MissingRequiredClaim(c) if c == "iss" => AuthError::Issuer,
                    ErrorKind::MissingRequiredClaim(_) => AuthError::Malformed("JWT without exp"),
                    _ => AuthError::Malformed("JWT"),
                };
            }
        }
    }
    Err(last)
}

fn grant(
    c: Claims,
    kid: Option<String>,
    policy: &JwtPolicy,
    path: &str,
    now_s: u64,
) -> Result<JwtGrant, AuthError> {
    let exp = c.exp.ok_or(AuthError::Malformed("JWT without exp"))?;
    if !exp.is_finite() || exp < 0.0 {
        return Err(AuthError::Malformed("JWT exp"));
    }
    // Floor: a token valid until 10.5 is valid before 10 here.
    let expires_s = exp as u64;
    if now_s >= expires_s.saturating_add(policy.leeway_s) {
        return Err(AuthError::Expired);
    }
    if let Some(nbf) = c.nbf
        && (!nbf.is_finite() || nbf.ceil() as u64 > now_s.saturating_add(policy.leeway_s))
    {
        return Err(AuthError::NotYetValid);
    }
    if let Some(p) = &c.paths
        && (p.len() > PATHS_MAX || p.iter().any(|x| !x.starts_with('/')))
    {
        return Err(AuthError::Malformed("JWT paths: prefixes starting with /"));
    }
    let rate_bytes_per_s = match &c.rate {
        None => None,
        Some(serde_json::Value::Number(n)) => Some(
            n.as_u64()
                .ok_or(AuthError::Malformed("JWT rate: bytes per second"))?,
        ),
        Some(serde_json::Value::String(s)) => match crate::units::parse_rate(s) {
            Ok(crate::units::Rate::BitsPerSecond(b)) => Some(b / 8),
            _ => return Err(AuthError::Malformed("JWT rate: e.g. \"8Mbit/s\"")),
        },
        Some(_) => return Err(AuthError::Malformed("JWT rate")),
    };
    let g = JwtGrant {
        expires_s,
        kid,
        paths: c.paths,
        sessions: c.sessions,
        rate_bytes_per_s,
        tenant: c.tenant,
        jti: c.jti,
        sub: c.sub,
        admin: c.admin == Some(true),
    };
    if !g.allows(path) {
        return Err(AuthError::NotGranted);
    }
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header, encode};

    /// RFC 7515 appendix A.1: HS256 with the JWK octet key; its `exp` is 1300819380.
    const A1_JWKS: &str = r#"{"keys":[{"kty":"oct","kid":"a1","k":"AyM1SysPpbyDfgZld3umj1qzKObwVMkoqQ-EstJQLr_T-1qS0gZH75aKtMN3Yj0iPS4hcgUuTwjAzZr1Z9CAow"}]}"#;
    const A1: &str = "eyJ0eXAiOiJKV1QiLA0KICJhbGciOiJIUzI1NiJ9.eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0dHA6Ly9leGFtcGxlLmNvbS9pc19yb290Ijp0cnVlfQ.dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
    /// RFC 7515 appendix A.3: ES256 with the P-256 public key.
    const A3_JWKS: &str = r#"{"keys":[{"kty":"EC","crv":"P-256","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}]}"#;
    const A3: &str = "eyJhbGciOiJFUzI1NiJ9.eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0dHA6Ly9leGFtcGxlLmNvbS9pc19yb290Ijp0cnVlfQ.DtEhU3ljbEg8L38VWAfUAqOyKAM6-Xx-F4GawxaepmXFCgfTjDxw5djxLa8ISlSApmWQxfKTUJqPP3-Kg6NU1Q";
    const RFC_EXP: u64 = 1_300_819_380;

    fn open() -> JwtPolicy {
        JwtPolicy::default()
    }

    #[test]
    fn rfc7515_a1_and_a3_verify_before_their_exp_only() {
        for (jwks, token) in [(A1_JWKS, A1), (A3_JWKS, A3)] {
            let k = Jwks::parse(jwks).unwrap();
            let g = verify_jwt(&k, token, &open(), "/x", RFC_EXP - 1).unwrap();
            assert_eq!(g.expires_s, RFC_EXP);
            assert_eq!(
                verify_jwt(&k, token, &open(), "/x", RFC_EXP),
                Err(AuthError::Expired)
            );
            // One character of the signature changed.
            let mut t = token.to_string();
            let last = t.pop().unwrap();
            t.push(if last == 'A' { 'B' } else { 'A' });
            assert!(verify_jwt(&k, &t, &open(), "/x", RFC_EXP - 1).is_err());
            // The issuer checked when configured: "joe" is.
            let iss = JwtPolicy {
                issuers: vec!["joe".into()],
                ..open()
            };
            assert!(verify_jwt(&k, token, &iss, "/x", RFC_EXP - 1).is_ok());
            let other = JwtPolicy {
                issuers: vec!["ann".into()],
                ..open()
            };
            assert_eq!(
                verify_jwt(&k, token, &other, "/x", RFC_EXP - 1),
                Err(AuthError::Issuer)
            );
        }
    }

    /// RFC 8037 appendix A.4: the Ed25519 signature over its signing input verifies with the
    /// public key (its payload is not JSON claims: checked through the crate's verify).
    #[test]
    fn rfc8037_a4_ed25519_verifies() {
        let k = Jwks::parse(
            r#"{"keys":[{"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}"#,
        )
        .unwrap();
        let input = "eyJhbGciOiJFZERTQSJ9.RXhhbXBsZSBvZiBFZDI1NTE5IHNpZ25pbmc";
        let sig = "hgyY0il_MGCjP0JzlnLWG1PPOt7-09PGcvMg3AIbQR6dWbhijcNR4ki4iylGjg5BhVsPt9g7sVvpAr_MuM0KAg";
        let key = &k.keys[0];
        assert_eq!(key.algorithms, [Algorithm::EdDSA]);
        assert!(
            jsonwebtoken::crypto::verify(sig, input.as_bytes(), &key.key, Algorithm::EdDSA)
                .unwrap()
        );
        let bad = sig.replace('h', "i");
        assert!(
            !jsonwebtoken::crypto::verify(&bad, input.as_bytes(), &key.key, Algorithm::EdDSA)
                .unwrap_or(false)
        );
        // As a whole token its payload is no claims set: refused, never a panic.
        assert!(verify_jwt(&k, &format!("{input}.{sig}"), &open(), "/", 0).is_err());
    }

    /// One character of a compact JWS's signing input (header or payload) changed: the
    /// signature no longer covers it.
    fn tamper_input(token: &str) -> String {
        let (input, sig) = token.rsplit_once('.').unwrap();
        let (header, payload) = input.split_once('.').unwrap();
        // The payload's 10th character, swapped for another base64url character.
        let mut p: Vec<char> = payload.chars().collect();
        p[10] = if p[10] == 'A' { 'B' } else { 'A' };
        format!("{header}.{}.{sig}", p.into_iter().collect::<String>())
    }

    /// RFC 7515 appendix A.2: RS256 with the RSA public key of A.2.1 (its `n` and `e`); the
    /// JWS's payload is the claims set of A.1 (`exp` 1300819380).
    const A2_JWKS: &str = r#"{"keys":[{"kty":"RSA","e":"AQAB","n":"ofgWCuLjybRlzo0tZWJjNiuSfb4p4fAkd_wWJcyQoTbji9k0l8W26mPddxHmfHQp-Vaw-4qPCJrcS2mJPMEzP1Pt0Bm4d4QlL-yRT-SFd2lZS-pCgNMsD1W_YpRPEwOWvG6b32690r2jZ47soMZo9wGzjb_7OMg0LOL-bSf63kpaSHSXndS5z5rexMdbBYUsLA9e-KXBdQOS-UTo7WTBEMa2R2CapHg665xsmtdVMTBQY4uDZlxvb3qCo5ZwKh9kG4LT6_I5IhlJH7aGhyxXFvUK-DWNmoudF8NAco9_h9iaGNj8q2ethFkMLs91kzk2PAcDTW9gb54h4FRWyuXpoQ"}]}"#;
    const A2: &str = "eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0dHA6Ly9leGFtcGxlLmNvbS9pc19yb290Ijp0cnVlfQ.cC4hiUPoj9Eetdgtv3hF80EGrhuB__dzERat0XF9g2VtQgr9PJbu3XOiZj5RZmh7AAuHIm4Bh-0Qc_lF5YKt_O8W2Fp5jujGbds9uJdbF9CUAr7t1dnZcAcQjbKBYNX4BAynRFdiuB--f_nZLgrnbyTyWzO75vRK5h6xBArLIARNPvkSjtQBMHlb1L07Qe7K0GarZRmB_eSN9383LcOLn6_dO--xi12jzDwusC-eOkHWEsqtFZESc6BfI7noOPqvhJ1phCnvWh6IeYI2w9QOYEUipUTI8np6LbgGY9Fs98rqVt5AXLIhWkWywlVmtVrBp0igcN_IoypGlUPQGe77Rw";

    #[test]
    fn rfc7515_a2_rs256_verifies_before_its_exp_only() {
        let k = Jwks::parse(A2_JWKS).unwrap();
        assert_eq!(k.keys[0].algorithms[0], Algorithm::RS256);
        let g = verify_jwt(&k, A2, &open(), "/x", RFC_EXP - 1).unwrap();
        assert_eq!(g.expires_s, RFC_EXP);
        assert_eq!(
            verify_jwt(&k, A2, &open(), "/x", RFC_EXP),
            Err(AuthError::Expired)
        );
        assert_eq!(
            verify_jwt(&k, &tamper_input(A2), &open(), "/x", RFC_EXP - 1),
            Err(AuthError::BadSignature)
        );
        // A.1's and A.3's signing inputs modified are refused too (their signatures checked).
        for (jwks, token) in [(A1_JWKS, A1), (A3_JWKS, A3)] {
            let k = Jwks::parse(jwks).unwrap();
            assert_eq!(
                verify_jwt(&k, &tamper_input(token), &open(), "/x", RFC_EXP - 1),
                Err(AuthError::BadSignature)
            );
        }
    }

    /// RFC 7520 section 4's payload (figure 8, base64url): a quotation, not a claims set.
    const RFC7520_PAYLOAD: &str = "SXTigJlzIGEgZGFuZ2Vyb3VzIGJ1c2luZXNzLCBGcm9kbywgZ29pbmcgb3V0IHlvdXIgZG9vci4gWW91IHN0ZXAgb250byB0aGUgcm9hZCwgYW5kIGlmIHlvdSBkb24ndCBrZWVwIHlvdXIgZmVldCwgdGhlcmXigJlzIG5vIGtub3dpbmcgd2hlcmUgeW91IG1pZ2h0IGJlIHN3ZXB0IG9mZiB0by4";
    /// RFC 7520 section 3.3 (figure 3): Bilbo's RSA key, its public part.
    const RFC7520_RSA_JWKS: &str = r#"{"keys":[{"kty":"RSA","kid":"bilbo.baggins@hobbiton.example","use":"sig","e":"AQAB","n":"n4EPtAOCc9AlkeQHPzHStgAbgs7bTZLwUBZdR8_KuKPEHLd4rHVTeT-O-XV2jRojdNhxJWTDvNd7nqQ0VEiZQHz_AJmSCpMaJMRBSFKrKb2wqVwGU_NsYOYL-QtiWN2lbzcEe6XC0dApr5ydQLrHqkHHig3RBordaZ6Aj-oBHqFEHYpPe7Tpe-OfVfHd1E6cS6M1FZcD1NNLYD5lFHpPI9bTwJlsde3uhGqC0ZCuEHg8lhzwOHrtIQbS0FVbb9k3-tVTU4fg_3L_vniUFAKwuCLqKnS2BYwdq_mzSnbLY7h_qixoR7jig3__kRhuaxwUkRz5iaiQkqgc5gHdrNP5zw"}]}"#;
    /// RFC 7520 section 3.5 (figure 5): the HMAC key.
    const RFC7520_OCT_JWKS: &str = r#"{"keys":[{"kty":"oct","kid":"018c0ae5-4d9b-471b-bfd6-eef314bc7037","use":"sig","alg":"HS256","k":"hJtXIZ2uSN5kbQfbtTNWbpdmhkV8FJG-Onbc6mxCcYg"}]}"#;
    /// RFC 7520 section 3.2 (figure 2): the P-521 key of the ES512 example, its public part.
    const RFC7520_P521_JWKS: &str = r#"{"keys":[{"kty":"EC","kid":"bilbo.baggins@hobbiton.example","use":"sig","crv":"P-521","x":"AHKZLLOsCOzz5cY97ewNUajB957y-C-U88c3v13nmGZx6sYl_oJXu9A5RkTKqjqvjyekWF-7ytDyRXYgCF5cj0Kt","y":"AdymlHvOiLxXkEhayXQnNCvDX4h9htZaCJN34kfmC6pV5OhQHiraVySsUdaQkAgDPrwQrJmbnX9cwlGfP-HqHZR1"}]}"#;

    /// The compact examples of RFC 7520 section 4 whose algorithm penstock accepts: 4.1
    /// RS256 (figure 13), 4.2 PS384 (an RSA key verifies the PS family too; figure 20), 4.4
    /// HS256 (figure 34), and 4.6 (HS256, `kid` outside the protected header: as a compact
    /// token the key is found by its algorithm; figure 49's protected header and
    /// signature). Each signature verifies over its signing input with the key the JWKS
    /// parser made; through `verify_jwt` the signature passes and the payload is refused
    /// as no claims set (`Malformed`, not `BadSignature`); a modified signing input is
    /// `BadSignature`. Not applicable: 4.3 (ES512, P-521: a curve this build refuses,
    /// asserted below), 4.5 (detached content), 4.7 (no protected header, so no compact
    /// form) and 4.8 (multiple signatures: JSON serialization only).
    #[test]
    fn rfc7520_section4_examples_verify() {
        let p = RFC7520_PAYLOAD;
        let cases = [
            (
                "4.1",
                RFC7520_RSA_JWKS,
                Algorithm::RS256,
                "eyJhbGciOiJSUzI1NiIsImtpZCI6ImJpbGJvLmJhZ2dpbnNAaG9iYml0b24uZXhhbXBsZSJ9",
                "MRjdkly7_-oTPTS3AXP41iQIGKa80A0ZmTuV5MEaHoxnW2e5CZ5NlKtainoFmKZopdHM1O2U4mwzJdQx996ivp83xuglII7PNDi84wnB-BDkoBwA78185hX-Es4JIwmDLJK3lfWRa-XtL0RnltuYv746iYTh_qHRD68BNt1uSNCrUCTJDt5aAE6x8wW1Kt9eRo4QPocSadnHXFxnt8Is9UzpERV0ePPQdLuW3IS_de3xyIrDaLGdjluPxUAhb6L2aXic1U12podGU0KLUQSE_oI-ZnmKJ3F4uOZDnd6QZWJushZ41Axf_fcIe8u9ipH84ogoree7vjbU5y18kDquDg",
            ),
            (
                "4.2",
                RFC7520_RSA_JWKS,
                Algorithm::PS384,
                "eyJhbGciOiJQUzM4NCIsImtpZCI6ImJpbGJvLmJhZ2dpbnNAaG9iYml0b24uZXhhbXBsZSJ9",
                "cu22eBqkYDKgIlTpzDXGvaFfz6WGoz7fUDcfT0kkOy42miAh2qyBzk1xEsnk2IpN6-tPid6VrklHkqsGqDqHCdP6O8TTB5dDDItllVo6_1OLPpcbUrhiUSMxbbXUvdvWXzg-UD8biiReQFlfz28zGWVsdiNAUf8ZnyPEgVFn442ZdNqiVJRmBqrYRXe8P_ijQ7p8Vdz0TTrxUeT3lm8d9shnr2lfJT8ImUjvAA2Xez2Mlp8cBE5awDzT0qI0n6uiP1aCN_2_jLAeQTlqRHtfa64QQSUmFAAjVKPbByi7xho0uTOcbH510a6GYmJUAfmWjwZ6oD4ifKo8DYM-X72Eaw",
            ),
            (
                "4.4",
                RFC7520_OCT_JWKS,
                Algorithm::HS256,
                "eyJhbGciOiJIUzI1NiIsImtpZCI6IjAxOGMwYWU1LTRkOWItNDcxYi1iZmQ2LWVlZjMxNGJjNzAzNyJ9",
                "s0h6KThzkfBBBkLspW1h84VsJZFTsPPqMDA7g1Md7p0",
            ),
            (
                "4.6",
                RFC7520_OCT_JWKS,
                Algorithm::HS256,
                "eyJhbGciOiJIUzI1NiJ9",
                "bWUSVaxorn7bEF1djytBd0kHv70Ly5pvbomzMWSOr20",
            ),
        ];
        for (section, jwks, alg, header, sig) in cases {
            let k = Jwks::parse(jwks).unwrap();
            let key = &k.keys[0];
            assert!(key.algorithms.contains(&alg), "{section}");
            let input = format!("{header}.{p}");
            assert!(
                jsonwebtoken::crypto::verify(sig, input.as_bytes(), &key.key, alg).unwrap(),
                "RFC 7520 {section}: the signature verifies"
            );
            let token = format!("{input}.{sig}");
            assert_eq!(
                verify_jwt(&k, &token, &open(), "/", 0),
                Err(AuthError::Malformed("JWT")),
                "RFC 7520 {section}: signature accepted, the payload is no claims set"
            );
            let bad = tamper_input(&token);
            let (bad_input, _) = bad.rsplit_once('.').unwrap();
            assert!(
                !jsonwebtoken::crypto::verify(sig, bad_input.as_bytes(), &key.key, alg)
                    .unwrap_or(false),
                "RFC 7520 {section}: a modified signing input fails"
            );
            assert_eq!(
                verify_jwt(&k, &bad, &open(), "/", 0),
                Err(AuthError::BadSignature),
                "RFC 7520 {section}"
            );
        }
        // 4.3's key (ES512 over P-521) is refused when the JWKS is read, with a reason.
        assert_eq!(
            Jwks::parse(RFC7520_P521_JWKS).unwrap_err(),
            JwksError("key bilbo.baggins@hobbiton.example: an unsupported curve".into())
        );
    }

    fn hs(claims: serde_json::Value, kid: &str, secret: &[u8]) -> String {
        let mut h = Header::new(Algorithm::HS256);
        h.kid = Some(kid.into());
        encode(&h, &claims, &EncodingKey::from_secret(secret)).unwrap()
    }

    const SECRET_JWKS: &str = r#"{"keys":[{"kty":"oct","kid":"s1","alg":"HS256","k":"c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3JldA"}]}"#;
    const SECRET: &[u8] = b"secret-secret-secret-secret-secret";

    #[test]
    fn claims_are_checked_and_applied() {
        let k = Jwks::parse(SECRET_JWKS).unwrap();
        let now = 1_000_000;
        let t = hs(
            serde_json::json!({"exp": now + 60, "nbf": now - 1, "aud": "penstock", "paths": ["/movies/"], "sessions": 2, "rate": "8Mbit/s", "tenant": "acme", "jti": "j1"}),
            "s1",
            SECRET,
        );
        let aud = JwtPolicy {
            audiences: vec!["penstock".into()],
            ..open()
        };
        let g = verify_jwt(&k, &t, &aud, "/movies/a.ts", now).unwrap();
        assert_eq!(g.sessions, Some(2));
        assert_eq!(g.rate_bytes_per_s, Some(1_000_000));
        assert_eq!(g.tenant.as_deref(), Some("acme"));
        assert_eq!(g.jti.as_deref(), Some("j1"));
        assert_eq!(
            verify_jwt(&k, &t, &aud, "/music/a.ts", now),
            Err(AuthError::NotGranted)
        );
        let wrong_aud = JwtPolicy {
            audiences: vec!["other".into()],
            ..open()
        };
        assert_eq!(
            verify_jwt(&k, &t, &wrong_aud, "/movies/a.ts", now),
            Err(AuthError::Audience)
        );
        assert_eq!(
            verify_jwt(&k, &t, &aud, "/movies/a.ts", now + 60),
            Err(AuthError::Expired)
        );
        let early = hs(
            serde_json::json!({"exp": now + 60, "nbf": now + 30}),
            "s1",
            SECRET,
        );
        assert_eq!(
            verify_jwt(&k, &early, &open(), "/", now),
            Err(AuthError::NotYetValid)
        );
        let no_exp = hs(serde_json::json!({"sub": "x"}), "s1", SECRET);
        assert!(matches!(
            verify_jwt(&k, &no_exp, &open(), "/", now),
            Err(AuthError::Malformed(_))
        ));
        let unknown = hs(serde_json::json!({"exp": now + 60}), "s9", SECRET);
        assert_eq!(
            verify_jwt(&k, &unknown, &open(), "/", now),
            Err(AuthError::UnknownKey)
        );
        let wrong_secret = hs(
            serde_json::json!({"exp": now + 60}),
            "s1",
            b"another-secret-another-secret-xx",
        );
        assert_eq!(
            verify_jwt(&k, &wrong_secret, &open(), "/", now),
            Err(AuthError::BadSignature)
        );
    }

    /// `alg: none`, and HS256 "signed" with the bytes of an EC public key, are refused.
    #[test]
    fn alg_none_and_key_confusion_are_refused() {
        let k = Jwks::parse(A3_JWKS).unwrap();
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let none = format!(
            "{}.{}.",
            b64(r#"{"alg":"none"}"#),
            b64(r#"{"exp":9999999999}"#)
        );
        assert_eq!(
            verify_jwt(&k, &none, &open(), "/", 0),
            Err(AuthError::Algorithm)
        );
        // The public key's x coordinate as an HMAC secret (what a confused verifier would
        // use): the EC key verifies ES256 only.
        let x = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode("f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU")
            .unwrap();
        let forged = encode(
            &Header::new(Algorithm::HS256),
            &serde_json::json!({"exp": 9_999_999_999u64}),
            &EncodingKey::from_secret(&x),
        )
        .unwrap();
        assert!(matches!(
            verify_jwt(&k, &forged, &open(), "/", 0),
            Err(AuthError::UnknownKey | AuthError::Algorithm)
        ));
        // A JWK that names its alg verifies that one only.
        let named = Jwks::parse(SECRET_JWKS).unwrap();
        let mut h = Header::new(Algorithm::HS384);
        h.kid = Some("s1".into());
        let t = encode(
            &h,
            &serde_json::json!({"exp": 10}),
            &EncodingKey::from_secret(SECRET),
        )
        .unwrap();
        assert_eq!(
            verify_jwt(&named, &t, &open(), "/", 0),
            Err(AuthError::Algorithm)
        );
    }

    #[test]
    fn bad_jwks_are_refused() {
        for bad in [
            "",
            "{}",
            r#"{"keys":[{"kty":"oct"}]}"#,
            r#"{"keys":[{"kty":"oct","alg":"ES256","k":"AAAA"}]}"#,
        ] {
            assert!(Jwks::parse(bad).is_err(), "{bad}");
        }
    }
}
