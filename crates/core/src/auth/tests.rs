use super::*;
use proptest::prelude::*;
use std::net::Ipv4Addr;

const NOW: u64 = 1_699_999_000;
const LOOP: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn ring() -> Keyring {
    Keyring::new(vec![
        Key::new("k1", &[b'k'; 32]).unwrap(),
        Key::new("k2", &[b'z'; 40]).unwrap(),
    ])
    .unwrap()
}

fn check(q: &str, path: &str, peer: IpAddr, now: u64) -> Result<Grant, AuthError> {
    let c = parse_query(q)?.ok_or(AuthError::Missing)?;
    verify(&ring(), &c, path, peer, now)
}

/// The tag is HMAC-SHA256 over the documented message, base64url without padding: the same
/// figures as Python's `hmac` (computed outside this crate), so another signer can be written
/// from docs/security.md alone.
#[test]
fn the_tag_matches_an_independent_hmac() {
    let k = ring();
    let key = k.signing_key(None).unwrap();
    assert_eq!(
        sign_query(key, "/premium/clip.ts", 1_700_000_000, None),
        "expires=1700000000&kid=k1&sig=Em2cUwqPSKYy1O2otH7j1DFv3QhqmjdAWjJFeIIJpgE"
    );
    let p = IpPrefix::parse("10.1.2.3/8").unwrap();
    assert_eq!(p.to_string(), "10.0.0.0/8");
    assert_eq!(
        sign_query(key, "/premium/clip.ts", 1_700_000_000, Some(&p)),
        "expires=1700000000&kid=k1&ip=10.0.0.0/8&sig=GaFf3eWKFsZWndB3fq9YvjvhFwiBqPzJ-BfxTyOSfHU"
    );
}

#[test]
fn a_signed_url_verifies_until_it_expires() {
    let k = ring();
    let q = sign_query(k.signing_key(None).unwrap(), "/a/b.ts", NOW + 10, None);
    let g = check(&q, "/a/b.ts", LOOP, NOW).unwrap();
    assert_eq!(g.kind, Kind::Signed);
    assert_eq!(g.sid.len(), 16);
    assert_eq!(check(&q, "/a/b.ts", LOOP, NOW + 9).unwrap().sid, g.sid);
    assert_eq!(
        check(&q, "/a/b.ts", LOOP, NOW + 10),
        Err(AuthError::Expired)
    );
    // Other parameters around it change nothing.
    let q2 = format!("t=1&{q}&_=x");
    assert!(check(&q2, "/a/b.ts", LOOP, NOW).is_ok());
}

#[test]
fn a_tampered_credential_is_refused_with_its_reason() {
    let k = ring();
    let q = sign_query(k.signing_key(None).unwrap(), "/a/b.ts", NOW + 10, None);
    assert_eq!(
        check(&q, "/a/c.ts", LOOP, NOW),
        Err(AuthError::BadSignature)
    );
    assert_eq!(
        check(&q, "/a/b.ts/", LOOP, NOW),
        Err(AuthError::BadSignature)
    );
    let later = q.replace(&format!("{}", NOW + 10), &format!("{}", NOW + 11));
    assert_eq!(
        check(&later, "/a/b.ts", LOOP, NOW),
        Err(AuthError::BadSignature)
    );
    let other = q.replace("kid=k1", "kid=k2");
    assert_eq!(
        check(&other, "/a/b.ts", LOOP, NOW),
        Err(AuthError::BadSignature)
    );
    let unknown = q.replace("kid=k1", "kid=k9");
    assert_eq!(
        check(&unknown, "/a/b.ts", LOOP, NOW),
        Err(AuthError::UnknownKey)
    );
    // Each character of the tag changed: refused (a malformed tag, or a wrong one).
    let at = q.find("sig=").unwrap() + 4;
    for i in at..q.len() {
        let mut b = q.clone().into_bytes();
        b[i] = if b[i] == b'A' { b'B' } else { b'A' };
        let t = String::from_utf8(b).unwrap();
        assert!(check(&t, "/a/b.ts", LOOP, NOW).is_err(), "{t}");
    }
    // A prefix added to a URL signed without one is a different message.
    let with_ip = format!("{q}&ip=127.0.0.1");
    assert_eq!(
        check(&with_ip, "/a/b.ts", LOOP, NOW),
        Err(AuthError::BadSignature)
    );
}

#[test]
fn the_address_prefix_binds_the_client() {
    let k = ring();
    let p = IpPrefix::parse("127.0.0.1").unwrap();
    let q = sign_query(k.signing_key(None).unwrap(), "/x", NOW + 10, Some(&p));
    assert!(check(&q, "/x", LOOP, NOW).is_ok());
    let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
    assert!(check(&q, "/x", mapped, NOW).is_ok());
    assert_eq!(
        check(&q, "/x", "127.0.0.2".parse().unwrap(), NOW),
        Err(AuthError::Address)
    );
    assert_eq!(
        check(&q, "/x", "::1".parse().unwrap(), NOW),
        Err(AuthError::Address)
    );
    let v6 = IpPrefix::parse("2001:db8::1/32").unwrap();
    assert_eq!(v6.to_string(), "2001:db8::/32");
    assert!(v6.contains("2001:db8:ffff::9".parse().unwrap()));
    assert!(!v6.contains("2001:db9::".parse().unwrap()));
    for bad in [
        "",
        "1.2.3.4/33",
        "1.2.3/8",
        "::/129",
        "1.2.3.4/",
        "1.2.3.4/+8",
        "x",
    ] {
        assert_eq!(IpPrefix::parse(bad), None, "{bad:?}");
    }
    assert!(IpPrefix::parse("0.0.0.0/0").unwrap().contains(LOOP));
}

#[test]
fn queries_without_a_whole_credential() {
    assert_eq!(parse_query(""), Ok(None));
    assert_eq!(parse_query("a=1&b"), Ok(None));
    let k = ring();
    let q = sign_query(k.signing_key(None).unwrap(), "/x", NOW + 10, None);
    for (bad, why) in [
        ("expires=1&kid=k1", "no sig"),
        ("kid=k1&sig=x", "no expires"),
        ("expires=1&sig=x", "no kid"),
        ("expires=-1&kid=k1&sig=x", "expires is not a Unix time"),
        (
            "expires=99999999999999999999&kid=k1&sig=x",
            "expires is not a Unix time",
        ),
        ("expires=1&kid=k%&sig=x", "bad percent-escape"),
        ("expires=1&kid=k/1&sig=x", "kid"),
        (
            "expires=1&kid=k1&sig=x",
            "sig is not a base64url HMAC-SHA256 tag",
        ),
        ("expires=1&kid=k1&ip=1.2.3.4/40&sig=x", "ip is not a prefix"),
        ("expires=1&kid=k1&sid=a.b&sig=x", "sid"),
    ] {
        assert_eq!(parse_query(bad), Err(AuthError::Malformed(why)), "{bad}");
    }
    assert_eq!(
        parse_query(&format!("{q}&kid=k1")),
        Err(AuthError::Malformed("a parameter appears twice"))
    );
    // The tag's two spare bits set: a second spelling of the same tag, refused.
    let at = q.len() - 1;
    let last = q.as_bytes()[at];
    let idx = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
        .iter()
        .position(|&c| c == last)
        .unwrap();
    let twin = format!(
        "{}{}",
        &q[..at],
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"[idx | 1] as char
    );
    if twin != q {
        assert!(parse_query(&twin).is_err());
    }
}

/// A session token: minted from a grant for the file path, bounded by the grant's expiry and
/// the ttl, carrying the grant's session id and prefix; never valid as a signed URL, nor
/// for another path.
#[test]
fn a_session_token_is_bound_to_its_grant() {
    let k = ring();
    let ip = IpPrefix::parse("127.0.0.0/8").unwrap();
    let q = sign_query(
        k.signing_key(Some("k2")).unwrap(),
        "/m/a.ts/index.m3u8",
        NOW + 100,
        Some(&ip),
    );
    let g = check(&q, "/m/a.ts/index.m3u8", LOOP, NOW).unwrap();
    let st = session_query(&k, &g, "/m/a.ts", NOW, 30).unwrap();
    assert!(st.contains(&format!("expires={}", NOW + 30)), "{st}");
    let s = check(&st, "/m/a.ts", LOOP, NOW).unwrap();
    assert_eq!(s.kind, Kind::Session);
    assert_eq!(s.sid, g.sid);
    assert_eq!(s.kid, "k2");
    assert_eq!(
        check(&st, "/m/b.ts", LOOP, NOW),
        Err(AuthError::BadSignature)
    );
    assert_eq!(
        check(&st, "/m/a.ts", "10.0.0.1".parse().unwrap(), NOW),
        Err(AuthError::Address)
    );
    assert_eq!(
        check(&st, "/m/a.ts", LOOP, NOW + 30),
        Err(AuthError::Expired)
    );
    // Without its sid, the same tag is no signed URL.
    let no_sid: String = st
        .split('&')
        .filter(|p| !p.starts_with("sid="))
        .collect::<Vec<_>>()
        .join("&");
    assert_eq!(
        check(&no_sid, "/m/a.ts", LOOP, NOW),
        Err(AuthError::BadSignature)
    );
    // The grant's expiry bounds a long ttl.
    let long = session_query(&k, &g, "/m/a.ts", NOW, 1 << 40).unwrap();
    assert!(long.contains(&format!("expires={}", NOW + 100)), "{long}");
    // A key removed since: no token.
    let other = Keyring::new(vec![Key::new("k1", &[b'k'; 32]).unwrap()]).unwrap();
    assert_eq!(session_query(&other, &g, "/m/a.ts", NOW, 30), None);
}

#[test]
fn keys_are_checked() {
    assert!(matches!(
        Key::new("k1", &[0; 31]),
        Err(KeyError::BadSecret(_))
    ));
    assert!(matches!(Key::new("", &[0; 32]), Err(KeyError::BadId(_))));
    assert!(matches!(Key::new("a b", &[0; 32]), Err(KeyError::BadId(_))));
    let dup = vec![
        Key::new("a", &[0; 32]).unwrap(),
        Key::new("a", &[1; 32]).unwrap(),
    ];
    assert!(matches!(Keyring::new(dup), Err(KeyError::Duplicate(_))));
    let k = Key::new("a", &[7; 32]).unwrap();
    assert!(
        !format!("{k:?}").contains('7'),
        "the secret is never printed"
    );
}

proptest! {
    /// Any query parses or is refused; none panics.
    #[test]
    fn any_query_parses_or_is_refused(q in ".{0,300}") {
        let _ = parse_query(&q);
    }

    /// Signed, then verified, for any path and expiry in the future; the same query for any
    /// other path is refused.
    #[test]
    fn what_is_signed_verifies_for_its_path_only(
        path in "/[a-zA-Z0-9 ._~%-]{0,40}",
        other in "/[a-z]{1,8}",
        ahead in 1u64..1_000_000,
    ) {
        let k = ring();
        let q = sign_query(k.signing_key(None).unwrap(), &path, NOW + ahead, None);
        let c = parse_query(&q).unwrap().unwrap();
        prop_assert!(verify(&k, &c, &path, LOOP, NOW).is_ok());
        if other != path {
            prop_assert_eq!(verify(&k, &c, &other, LOOP, NOW), Err(AuthError::BadSignature));
        }
    }

    /// Any one byte of a signed query changed: refused, or an equal credential (a change in
    /// nothing that is signed cannot occur: every byte belongs to a field).
    #[test]
    fn no_one_byte_change_verifies(i in 0usize..200, b in any::<u8>()) {
        let k = ring();
        let q = sign_query(k.signing_key(None).unwrap(), "/v/x.ts", NOW + 50, None);
        let i = i % q.len();
        let mut bytes = q.clone().into_bytes();
        prop_assume!(bytes[i] != b);
        bytes[i] = b;
        if let Ok(t) = String::from_utf8(bytes) {
            let ok = parse_query(&t)
                .ok()
                .flatten()
                .map(|c| verify(&k, &c, "/v/x.ts", LOOP, NOW).is_ok())
                .unwrap_or(false);
            prop_assert!(!ok, "{} verified", t);
        }
    }
}

#[test]
fn a_bearer_token_comes_from_the_header_else_the_query() {
    assert_eq!(
        bearer_token(Some("Bearer a.b.c"), Some("jwt=x.y.z")),
        Some("a.b.c")
    );
    assert_eq!(bearer_token(Some("bearer  a.b.c "), None), Some("a.b.c"));
    assert_eq!(
        bearer_token(Some("Basic dXNlcg=="), Some("jwt=x.y.z")),
        None
    );
    assert_eq!(bearer_token(None, Some("t=1&jwt=x.y.z")), Some("x.y.z"));
    assert_eq!(bearer_token(None, Some("t=1")), None);
    assert_eq!(bearer_token(None, None), None);
}

/// A JWT's session grant: signed by the first key, one session id per token, and its
/// session tokens verify for their file.
#[test]
fn a_jwt_grant_mints_session_tokens() {
    let k = ring();
    let g = grant_for_jwt(&k, "a.b.c", NOW + 100, None).unwrap();
    assert_eq!(g.kid, "k1");
    assert_eq!(
        grant_for_jwt(&k, "a.b.c", NOW + 100, None).unwrap().sid,
        g.sid
    );
    assert_ne!(
        grant_for_jwt(&k, "a.b.d", NOW + 100, None).unwrap().sid,
        g.sid
    );
    let st = session_query(&k, &g, "/m/a.ts", NOW, 30).unwrap();
    assert_eq!(check(&st, "/m/a.ts", LOOP, NOW).unwrap().sid, g.sid);
    assert!(grant_for_jwt(&Keyring::default(), "a.b.c", NOW, None).is_none());
}

/// A JWT's session tokens carry its revocation id, bound by the tag: it cannot be dropped
/// or changed, and a `jti` of any bytes becomes a short URL-safe id.
#[test]
fn a_jwt_session_token_binds_its_revocation_id() {
    let k = ring();
    let g = grant_for_jwt(&k, "a.b.c", NOW + 100, Some("rev-1")).unwrap();
    assert_eq!(g.jti.as_deref(), Some("rev-1"));
    let st = session_query(&k, &g, "/m/a.ts", NOW, 30).unwrap();
    assert!(st.contains("&jti=rev-1&"), "{st}");
    assert_eq!(
        check(&st, "/m/a.ts", LOOP, NOW).unwrap().jti.as_deref(),
        Some("rev-1")
    );
    // Dropped or changed: the tag no longer matches.
    let dropped = st.replace("&jti=rev-1", "");
    assert_eq!(
        check(&dropped, "/m/a.ts", LOOP, NOW),
        Err(AuthError::BadSignature)
    );
    let changed = st.replace("&jti=rev-1", "&jti=rev-2");
    assert_eq!(
        check(&changed, "/m/a.ts", LOOP, NOW),
        Err(AuthError::BadSignature)
    );
    // A jti without a session id is not a credential.
    assert!(
        parse_query(&format!(
            "{}&jti=x",
            sign_query(k.signing_key(None).unwrap(), "/m/a.ts", NOW + 9, None)
        ))
        .is_err()
    );
    assert_eq!(revocation_id("rev-1"), "rev-1");
    let odd = revocation_id("user 7/ü");
    assert!(odd.starts_with("h.") && odd.len() == 2 + 22, "{odd}");
    assert_eq!(revocation_id(&odd), revocation_id(&odd), "stable");
    assert_ne!(
        revocation_id(&odd),
        odd,
        "an id that looks hashed is hashed"
    );
}
