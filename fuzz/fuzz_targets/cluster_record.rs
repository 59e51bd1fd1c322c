#![no_main]
//! Arbitrary bytes as a node record read from etcd (`core::cluster::record`): read or
//! refused, never a panic; a record that reads writes back to text that reads the same, and
//! the HAProxy configuration rendered from it has exactly one `server` line.
use libfuzzer_sys::fuzz_target;
use penstock_core::cluster::NodeRecord;
use penstock_core::cluster::haproxy::{HaproxyOptions, render};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(r) = NodeRecord::decode(text) {
        assert_eq!(NodeRecord::decode(&r.encode()), Ok(r.clone()));
        let cfg = render(std::slice::from_ref(&r), &HaproxyOptions::default(), text).unwrap();
        assert_eq!(
            cfg.lines()
                .filter(|l| l.trim_start().starts_with("server "))
                .count(),
            1,
            "{cfg}"
        );
    }
});
