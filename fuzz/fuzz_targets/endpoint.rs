//! Fuzzes the endpoint parser: it must never panic, and every name it accepts must display as
//! a canonical name that parses back to the same endpoint, in the same role.
#![no_main]
use libfuzzer_sys::fuzz_target;
use penstock_core::endpoint::{ACCEPTED_FORMS, Endpoint, Role};

fuzz_target!(|data: &[u8]| {
    // Names arrive as UTF-8 (`&str`); invalid bytes become U+FFFD so that every input still
    // reaches the parser.
    let s = String::from_utf8_lossy(data);
    for role in [Role::Source, Role::Target] {
        match Endpoint::parse(&s, role) {
            Ok(e) => {
                assert!(
                    e.supports(role),
                    "{s:?} parsed as {e:?}, which cannot be a {role}"
                );
                let shown = e.to_string();
                assert_eq!(
                    Endpoint::parse(&shown, role).as_ref(),
                    Ok(&e),
                    "{s:?} -> {shown:?} does not round-trip as a {role}"
                );
            }
            Err(err) => assert!(err.to_string().ends_with(ACCEPTED_FORMS)),
        }
    }
});
