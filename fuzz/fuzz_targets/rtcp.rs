#![no_main]
//! Arbitrary bytes arriving on the RTCP port: the compound-packet parser and the sender
//! session that takes them in. Never a panic; a refused datagram adds nothing and is counted;
//! what parses is made only of the items a valid compound holds.
use libfuzzer_sys::fuzz_target;
use penstock_core::rtp::SenderSession;
use penstock_core::rtp::rtcp::{RtcpItem, parse};

fuzz_target!(|data: &[u8]| {
    let mut items = Vec::new();
    let parsed = parse(data, &mut items);
    match parsed {
        Ok(()) => {
            // At most one item per 4 bytes (the smallest RTCP packet is a 4-byte header).
            assert!(items.len() <= data.len() / 4 + 1);
        }
        Err(_) => assert!(items.is_empty(), "a refused datagram adds nothing"),
    }
    // The session: reports about its SSRC (taken from the first report block, if any).
    let ssrc = items
        .iter()
        .find_map(|i| match i {
            RtcpItem::Report { block, .. } => Some(block.ssrc),
            _ => None,
        })
        .unwrap_or(1);
    let mut s = SenderSession::new(ssrc, "fuzz", 5_000_000_000, 7);
    let r = s.handle_datagram(0x1234_5678_9abc_def0, data);
    assert_eq!(r.is_err(), parsed.is_err());
    let st = s.stats();
    assert_eq!(st.malformed, u64::from(parsed.is_err()));
    if parsed.is_err() {
        assert_eq!(st.reports + st.byes + st.other_sources, 0);
    }
    assert!(st.fraction_lost_max >= st.fraction_lost && st.jitter_max >= st.jitter);
});
