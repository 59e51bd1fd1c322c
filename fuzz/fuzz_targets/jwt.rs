#![no_main]
//! Arbitrary bytes as a JWT, and as a JWKS (`core::auth::jwt`): refused or verified, never
//! a panic. A token only verifies against the fixed HS256 key when it was signed with it,
//! which the fuzzer cannot do: any `Ok` is a forged token and fails the run.
use libfuzzer_sys::fuzz_target;
use penstock_core::auth::jwt::{Jwks, JwtPolicy, verify_jwt};

const JWKS: &str = r#"{"keys":[{"kty":"oct","kid":"s1","k":"c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3JldA"},{"kty":"OKP","crv":"Ed25519","kid":"e1","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}"#;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let jwks = Jwks::parse(JWKS).expect("the fixed JWKS");
    let r = verify_jwt(&jwks, text, &JwtPolicy::default(), "/a", 0);
    assert!(r.is_err(), "a forged token verified: {text:?}");
    let _ = Jwks::parse(text);
});
