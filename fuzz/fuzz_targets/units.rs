//! Fuzzes the unit parsers (sizes, durations, rates): never a panic (no overflow either), and
//! what they accept is what they say: a size printed as plain bytes, a rate printed in bits
//! per second, a duration in nanoseconds parse back to the same value.
#![no_main]
use libfuzzer_sys::fuzz_target;
use penstock_core::units::{Rate, parse_duration, parse_rate, parse_size};

fuzz_target!(|data: &[u8]| {
    let s = String::from_utf8_lossy(data);
    if let Ok(n) = parse_size(&s) {
        assert_eq!(parse_size(&n.to_string()), Ok(n), "{s:?}");
    }
    if let Ok(d) = parse_duration(&s) {
        let ns = d.as_nanos();
        // (The decimal form reads whole nanoseconds up to u64::MAX; humantime's own grammar
        // reaches further.)
        if ns > 0 && ns <= u128::from(u64::MAX) {
            assert_eq!(parse_duration(&format!("{ns}.0ns")), Ok(d), "{s:?}");
        }
    }
    match parse_rate(&s) {
        Ok(Rate::BitsPerSecond(b)) => {
            assert!(b > 0, "{s:?}");
            assert_eq!(
                parse_rate(&format!("{b}bps")),
                Ok(Rate::BitsPerSecond(b)),
                "{s:?}"
            );
            assert_eq!(
                parse_rate(&format!("{b}bit/s")),
                Ok(Rate::BitsPerSecond(b)),
                "{s:?}"
            );
        }
        Ok(Rate::UnitsPerSecond { num, den }) => assert!(num > 0 && den > 0, "{s:?}"),
        Err(_) => {}
    }
});
