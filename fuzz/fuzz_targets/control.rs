#![no_main]
use libfuzzer_sys::fuzz_target;

// Placeholder until the parser lands.
fuzz_target!(|data: &[u8]| {
    let _ = data;
});
