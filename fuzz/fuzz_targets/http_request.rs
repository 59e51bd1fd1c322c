#![no_main]
//! Arbitrary bytes into the HTTP request parser, as a pipelining driver would feed them:
//! parse, advance by `consumed_bytes`, repeat. Checks that nothing panics, that a complete
//! request never consumes more than it was given (nor nothing, which would loop forever),
//! and that every path it returns is normalized.
use libfuzzer_sys::fuzz_target;
use penstock_core::http::{Limits, Parsed, parse_request};

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        header_bytes_max: 1024,
        request_line_bytes_max: 512,
        headers_max: 16,
        ranges_max: 16,
    };
    let mut rest = data;
    // Bounded: each turn consumes at least one byte.
    while let Ok(Parsed::Complete {
        request,
        consumed_bytes,
    }) = parse_request(rest, &limits)
    {
        assert!(consumed_bytes > 0 && consumed_bytes <= rest.len());
        assert!(request.path.starts_with('/'));
        assert!(!request.path.split('/').any(|s| s == "." || s == ".."));
        assert!(!request.path.contains('\0'));
        rest = &rest[consumed_bytes..];
    }
});
