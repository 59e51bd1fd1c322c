#![no_main]
//! Arbitrary bytes as a signed URL's query and path (`core::auth`): parsed or refused, never
//! a panic; a credential that parses is verified against a fixed keyring without a panic,
//! and never verifies unless its tag is the one the key makes (a forged query does not
//! pass: the fuzzer does not know the secret).
use libfuzzer_sys::fuzz_target;
use penstock_core::auth::{Key, Keyring, parse_query, sign_query, verify};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (path, query) = text.split_once('?').unwrap_or(("/a.ts", text));
    let keys = Keyring::new(vec![Key::new("k1", &[7u8; 32]).expect("a valid key")])
        .expect("one key");
    if let Ok(Some(c)) = parse_query(query) {
        let peer = std::net::IpAddr::from([127, 0, 0, 1]);
        if verify(&keys, &c, path, peer, 0).is_ok() {
            // Only what the key signed verifies: the same fields signed again give this tag.
            let k = keys.get("k1").expect("k1");
            let again = sign_query(k, path, c.expires_s, c.ip.as_ref());
            assert!(c.sid.is_some() || query.contains(again.rsplit_once("sig=").unwrap().1));
        }
    }
    // Signing any canonical path gives a query that parses back and verifies.
    if let Ok(p) = penstock_core::http::normalize_path(path) {
        let k = keys.get("k1").expect("k1");
        let q = sign_query(k, &p, 10, None);
        let c = parse_query(&q).expect("ours parses").expect("a credential");
        assert!(verify(&keys, &c, &p, std::net::IpAddr::from([127, 0, 0, 1]), 0).is_ok());
    }
});
