#![no_main]
//! Arbitrary bytes as an RTSP `Authorization: Digest …` value and as a Digest users file
//! (`core::auth::digest`): refused or verified, never a panic. A response only verifies when
//! it was computed from a user's password over a nonce of the fixed key, which the fuzzer
//! cannot make: any `Ok` is a forged credential and fails the run.
use libfuzzer_sys::fuzz_target;
use penstock_core::auth::digest::{DigestUsers, NonceKey, parse_authorization, verify};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let users = DigestUsers::parse(
        "alice:penstock:5ebe2294ecd0e0f08eab7690d2a6ee69\n",
        "penstock",
    )
    .expect("the fixed users");
    let key = NonceKey::new(&[9; 32]);
    if let Ok(Some(r)) = parse_authorization(text) {
        let v = verify(&users, &key, "DESCRIBE", &r.uri, &r, 1_000, 300);
        assert!(v.is_err(), "a forged credential verified: {text:?}");
    }
    let _ = DigestUsers::parse(text, "penstock");
});
