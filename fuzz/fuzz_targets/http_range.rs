#![no_main]
//! A `Range` value against an arbitrary file length. Checks that satisfiable ranges are
//! non-empty, sorted, disjoint, within the file, bounded in number, and that the multipart
//! plan built from them adds up to its Content-Length.
use libfuzzer_sys::fuzz_target;
use penstock_core::http::{BodyPiece, RangeSet, multipart_plan, parse_range};

fuzz_target!(|input: (u64, u8, &str)| {
    let (file_len_bytes, ranges_max, value) = input;
    let ranges_max = usize::from(ranges_max % 32);
    match parse_range(value, file_len_bytes, ranges_max) {
        RangeSet::Satisfiable(rs) => {
            assert!(!rs.is_empty() && rs.len() <= ranges_max);
            for r in &rs {
                assert!(r.start <= r.end_inclusive && r.end_inclusive < file_len_bytes);
            }
            for w in rs.windows(2) {
                assert!(w[0].end_inclusive.saturating_add(1) < w[1].start);
            }
            let plan = multipart_plan(
                &rs,
                file_len_bytes,
                "video/mp2t",
                "penstock_0000000000000001",
            );
            let sum: u64 = plan.pieces.iter().map(BodyPiece::len_bytes).sum();
            assert_eq!(sum, plan.content_length_bytes);
        }
        RangeSet::Unsatisfiable | RangeSet::Ignore => {}
    }
});
