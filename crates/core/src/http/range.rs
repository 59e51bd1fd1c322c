//! `Range: bytes=...` (RFC 9110 §14.1.2, §14.2), evaluated against a file length.

/// A satisfiable byte range of the file, both ends inclusive as in `Content-Range`.
/// Invariant: `start <= end_inclusive < file length`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ByteRange {
    pub start: u64,
    pub end_inclusive: u64,
}

impl ByteRange {
    /// Bytes in the range (never zero).
    pub fn len_bytes(self) -> u64 {
        self.end_inclusive - self.start + 1
    }
}

/// What a `Range` header asks for, once evaluated against the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeSet {
    /// At least one range overlaps the file: 206. Sorted, non-overlapping, non-adjacent
    /// (overlapping and adjacent ranges are coalesced), never empty.
    Satisfiable(Vec<ByteRange>),
    /// Well-formed, but no range overlaps the file: 416 with `Content-Range: bytes */LEN`.
    Unsatisfiable,
    /// Malformed or invalid (RFC 9110 §14.1.1), another unit, more than `ranges_max` ranges,
    /// or satisfiable only by a suffix of an empty file: ignore the header and serve the
    /// whole file with 200 (RFC 9110 §14.2: a server MAY ignore Range).
    Ignore,
}

/// Evaluates a `Range` header value against a file of `file_len_bytes` bytes, following
/// RFC 9110 §14.1 to the letter (docs/http.md says where nginx differs):
///
/// - A numeral of any length is a number, never a parse error (§14.1.2: "recipients MUST
///   anticipate potentially large decimal numerals and prevent parsing errors due to integer
///   conversion overflows"). One too large for a u64 is larger than any file, so it saturates:
///   `bytes=99999999999999999999999-` starts past the end (unsatisfiable: 416), a huge
///   last-pos means "the remainder" and a huge suffix "the entire representation" (206).
/// - `last-pos < first-pos` makes the range-spec, and so the whole header, invalid (§14.1.1);
///   it is decided on the digits, so that two numerals that both saturate still compare.
///   An invalid header is ignored (200), as §14.2 allows ("MAY ignore or reject").
/// - A zero-length file has no byte to send and no `Content-Range` to describe one, yet a
///   suffix-range with a non-zero length is satisfiable against it (§14.1.2): such a header
///   is ignored (200 with the empty body, §14.2: a server "MAY ignore a Range header field
///   when the selected representation has no content"), not refused with 416.
///
/// Never panics.
pub fn parse_range(value: &str, file_len_bytes: u64, ranges_max: usize) -> RangeSet {
    let Some((unit, set)) = value.trim().split_once('=') else {
        return RangeSet::Ignore;
    };
    if !unit.trim().eq_ignore_ascii_case("bytes") {
        return RangeSet::Ignore;
    }
    let mut ranges: Vec<ByteRange> = Vec::new();
    let mut specs = 0usize;
    // A suffix-range satisfiable against an empty file (see above).
    let mut empty_but_satisfiable = false;
    // `1#range-spec`: empty list elements are allowed and skipped (RFC 9110 §5.6.1.2).
    for spec in set.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        specs += 1;
        if specs > ranges_max {
            return RangeSet::Ignore;
        }
        let Some((first, last)) = spec.split_once('-') else {
            return RangeSet::Ignore;
        };
        let range = if first.is_empty() {
            let Some(suffix) = parse_digits_saturating(last) else {
                return RangeSet::Ignore;
            };
            // The last `suffix` bytes; a zero suffix selects nothing.
            if suffix == 0 {
                None
            } else if file_len_bytes == 0 {
                empty_but_satisfiable = true;
                None
            } else {
                Some(ByteRange {
                    start: file_len_bytes.saturating_sub(suffix),
                    end_inclusive: file_len_bytes - 1,
                })
            }
        } else {
            let first_digits = first;
            let Some(first) = parse_digits_saturating(first) else {
                return RangeSet::Ignore;
            };
            let last_pos = if last.is_empty() {
                u64::MAX
            } else {
                match parse_digits_saturating(last) {
                    // `last < first` is invalid (§14.1.1): the whole header is ignored.
                    // Compared as numerals: `2…0-1…0` with 23 digits each saturates both
                    // to u64::MAX, which would pass for valid.
                    Some(l) if !numeral_less(last, first_digits) => l,
                    _ => return RangeSet::Ignore,
                }
            };
            if first >= file_len_bytes {
                None
            } else {
                Some(ByteRange {
                    start: first,
                    end_inclusive: last_pos.min(file_len_bytes - 1),
                })
            }
        };
        ranges.extend(range);
    }
    if specs == 0 {
        return RangeSet::Ignore;
    }
    if ranges.is_empty() {
        if empty_but_satisfiable {
            return RangeSet::Ignore;
        }
        return RangeSet::Unsatisfiable;
    }
    RangeSet::Satisfiable(coalesce(ranges))
}

/// Sorts and merges overlapping or adjacent ranges, so that `bytes=0-0,0-0,...` cannot make
/// us send the same bytes many times (RFC 9110 §14.2 warns of this).
fn coalesce(mut ranges: Vec<ByteRange>) -> Vec<ByteRange> {
    ranges.sort_unstable();
    let mut out: Vec<ByteRange> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            Some(prev) if r.start <= prev.end_inclusive.saturating_add(1) => {
                prev.end_inclusive = prev.end_inclusive.max(r.end_inclusive);
            }
            _ => out.push(r),
        }
    }
    out
}

/// Whether the numeral `a` is below the numeral `b` (both `1*DIGIT`), exactly, whatever
/// their lengths: leading zeros dropped, a shorter numeral is smaller, equal lengths compare
/// digit by digit (ASCII order is numeric order).
fn numeral_less(a: &str, b: &str) -> bool {
    let a = a.trim_start_matches('0');
    let b = b.trim_start_matches('0');
    (a.len(), a) < (b.len(), b)
}

/// `1*DIGIT`, saturating at u64::MAX; `None` for anything else (signs, spaces, empty).
fn parse_digits_saturating(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(s.bytes().fold(0u64, |n, d| {
        n.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(start: u64, end_inclusive: u64) -> ByteRange {
        ByteRange {
            start,
            end_inclusive,
        }
    }

    fn sat(v: &str, len: u64) -> Vec<ByteRange> {
        match parse_range(v, len, 16) {
            RangeSet::Satisfiable(rs) => rs,
            other => panic!("{v:?} against {len}: {other:?}"),
        }
    }

    #[test]
    fn rfc_9110_examples() {
        // §14.1.2, a 10000-byte representation.
        assert_eq!(sat("bytes=0-499", 10000), vec![r(0, 499)]);
        assert_eq!(sat("bytes=500-999", 10000), vec![r(500, 999)]);
        assert_eq!(sat("bytes=-500", 10000), vec![r(9500, 9999)]);
        assert_eq!(sat("bytes=9500-", 10000), vec![r(9500, 9999)]);
        assert_eq!(sat("bytes=0-0,-1", 10000), vec![r(0, 0), r(9999, 9999)]);
        assert_eq!(
            sat("bytes= 0-999, 4500-5499, -1000", 10000),
            vec![r(0, 999), r(4500, 5499), r(9000, 9999)]
        );
        assert_eq!(sat("bytes=500-600,601-999", 10000), vec![r(500, 999)]);
        assert_eq!(sat("bytes=500-700,601-999", 10000), vec![r(500, 999)]);
    }

    #[test]
    fn edges() {
        assert_eq!(sat("bytes=0-0", 1), vec![r(0, 0)]);
        assert_eq!(sat("BYTES=0-", 5), vec![r(0, 4)]);
        // Suffix longer than the file: the whole file.
        assert_eq!(sat("bytes=-500", 100), vec![r(0, 99)]);
        // Last byte past the end is clamped.
        assert_eq!(sat("bytes=10-999999", 100), vec![r(10, 99)]);
        // Unsatisfiable parts are dropped when another part is satisfiable.
        assert_eq!(sat("bytes=200-300,0-1", 100), vec![r(0, 1)]);
        assert_eq!(sat("bytes=0-1,,", 100), vec![r(0, 1)]);
        assert_eq!(sat("bytes=-99999999999999999999999", 100), vec![r(0, 99)]);
        assert_eq!(sat("bytes=0-99999999999999999999999", 100), vec![r(0, 99)]);
    }

    #[test]
    fn unsatisfiable_is_416() {
        assert_eq!(parse_range("bytes=100-", 100, 16), RangeSet::Unsatisfiable);
        assert_eq!(
            parse_range("bytes=100-200", 100, 16),
            RangeSet::Unsatisfiable
        );
        assert_eq!(parse_range("bytes=-0", 100, 16), RangeSet::Unsatisfiable);
        assert_eq!(
            parse_range("bytes=99999999999999999999999-", 100, 16),
            RangeSet::Unsatisfiable
        );
        assert_eq!(
            parse_range("bytes=99999999999999999999999-", u64::MAX, 16),
            RangeSet::Unsatisfiable
        );
        // A zero-length file: no int-range is satisfiable, nor a zero suffix.
        assert_eq!(parse_range("bytes=0-", 0, 16), RangeSet::Unsatisfiable);
        assert_eq!(parse_range("bytes=0-0", 0, 16), RangeSet::Unsatisfiable);
        assert_eq!(parse_range("bytes=-0", 0, 16), RangeSet::Unsatisfiable);
    }

    /// Issue 20: RFC 9110 §14.1.2, "recipients MUST anticipate potentially large decimal
    /// numerals": past u64 a numeral is still a number (nginx answers 416 to all three).
    #[test]
    fn huge_numerals_are_numbers_not_parse_errors() {
        for huge in [
            "99999999999999999999999",
            "18446744073709551616",
            "18446744073709551615",
            "000000000000000000000000000000099999999999999999999999",
        ] {
            // A last-pos at or past the end: the remainder (206).
            assert_eq!(
                sat(&format!("bytes=0-{huge}"), 100),
                vec![r(0, 99)],
                "{huge}"
            );
            assert_eq!(sat(&format!("bytes=42-{huge}"), 100), vec![r(42, 99)]);
            // A suffix longer than the file: the entire file (206).
            assert_eq!(
                sat(&format!("bytes=-{huge}"), 100),
                vec![r(0, 99)],
                "{huge}"
            );
            // A first-pos past the end: unsatisfiable (416), even against the largest file.
            for len in [0, 100, u64::MAX] {
                assert_eq!(
                    parse_range(&format!("bytes={huge}-"), len, 16),
                    RangeSet::Unsatisfiable,
                    "{huge} against {len}"
                );
            }
            // ...and dropped beside a satisfiable one.
            assert_eq!(sat(&format!("bytes=0-0,{huge}-"), 100), vec![r(0, 0)]);
        }
        // Leading zeros do not make a numeral large.
        assert_eq!(
            sat(
                "bytes=000000000000000000000000005-0000000000000000000000000009",
                100
            ),
            vec![r(5, 9)]
        );
    }

    /// Issue 20: `last-pos < first-pos` is invalid (RFC 9110 §14.1.1) even when both are too
    /// large for a u64; saturating both to u64::MAX used to call it valid and answer 416.
    #[test]
    fn inverted_huge_range_is_invalid_and_ignored() {
        for v in [
            "bytes=20000000000000000000000-10000000000000000000000",
            "bytes=18446744073709551616-18446744073709551615",
            "bytes=99999999999999999999999-99999999999999999999998",
            "bytes=0-1,20000000000000000000000-10000000000000000000000",
        ] {
            assert_eq!(parse_range(v, 100, 16), RangeSet::Ignore, "{v}");
        }
        // Equal huge positions are valid, and unsatisfiable.
        assert_eq!(
            parse_range(
                "bytes=99999999999999999999999-99999999999999999999999",
                100,
                16
            ),
            RangeSet::Unsatisfiable
        );
        assert_eq!(
            parse_range(
                "bytes=18446744073709551615-99999999999999999999999",
                u64::MAX,
                16
            ),
            RangeSet::Unsatisfiable
        );
    }

    /// Issue 20: against a zero-length file a non-zero suffix-range is satisfiable (RFC 9110
    /// §14.1.2), so 416 would be wrong; there is no byte to send, so the header is ignored
    /// (§14.2) and the empty file goes with 200, as nginx does.
    #[test]
    fn empty_file_with_a_suffix_range_is_ignored_not_416() {
        for v in [
            "bytes=-1",
            "bytes=-99999999999999999999999",
            "bytes=0-0,-1",
            "bytes=-1,5-",
        ] {
            assert_eq!(parse_range(v, 0, 16), RangeSet::Ignore, "{v}");
        }
    }

    #[test]
    fn malformed_is_ignored() {
        for v in [
            "",
            "bytes",
            "bytes=",
            "bytes=,",
            "bytes=a-b",
            "bytes=1-0",
            "bytes=-",
            "bytes=--1",
            "bytes=1",
            "bytes=+1-2",
            "bytes=1-+2",
            "bytes=1 -2",
            "items=0-1",
            "bytes=0-1;x",
            "bytes=0x10-",
            "bytes=-1-2",
        ] {
            assert_eq!(parse_range(v, 100, 16), RangeSet::Ignore, "{v:?}");
        }
    }

    #[test]
    fn too_many_ranges_are_ignored() {
        let many = (0..17)
            .map(|i| format!("{}-{}", i * 10, i * 10 + 1))
            .collect::<Vec<_>>()
            .join(",");
        assert_eq!(
            parse_range(&format!("bytes={many}"), 1000, 16),
            RangeSet::Ignore
        );
        let sixteen = (0..16)
            .map(|i| format!("{}-{}", i * 10, i * 10 + 1))
            .collect::<Vec<_>>()
            .join(",");
        assert!(
            matches!(parse_range(&format!("bytes={sixteen}"), 1000, 16), RangeSet::Satisfiable(v) if v.len() == 16)
        );
    }

    #[test]
    fn repeated_ranges_are_coalesced() {
        assert_eq!(sat("bytes=0-0,0-0,0-0,0-0", 10), vec![r(0, 0)]);
        assert_eq!(sat("bytes=5-9,0-4", 10), vec![r(0, 9)]);
        assert_eq!(sat("bytes=6-9,0-4", 10), vec![r(0, 4), r(6, 9)]);
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        /// Small numbers (around test file lengths), u64's edge, and numerals of up to 40
        /// digits, some with leading zeros.
        fn numeral() -> impl Strategy<Value = String> {
            prop_oneof![
                (0u64..400).prop_map(|n| n.to_string()),
                prop_oneof![
                    Just("18446744073709551614".to_string()),
                    Just("18446744073709551615".to_string()),
                    Just("18446744073709551616".to_string()),
                ],
                "0{0,3}[1-9][0-9]{0,39}",
            ]
        }

        /// `n` (a numeral) compared with `x`, on digits.
        fn cmp(n: &str, x: u64) -> std::cmp::Ordering {
            let n = n.trim_start_matches('0');
            let x = x.to_string();
            let x = x.trim_start_matches('0');
            (n.len(), n).cmp(&(x.len(), x))
        }

        /// RFC 9110 §14.1.1-2 for one range-spec, and §14.2's permission to ignore.
        fn model(suffix: bool, first: &str, last: Option<&str>, len: u64) -> RangeSet {
            use std::cmp::Ordering::*;
            if suffix {
                // "-N": the last N bytes, the entire representation if it is shorter.
                return if cmp(first, 0) == Equal {
                    RangeSet::Unsatisfiable
                } else if len == 0 {
                    RangeSet::Ignore
                } else {
                    let n = if cmp(first, len) == Less {
                        first.parse::<u64>().unwrap()
                    } else {
                        len
                    };
                    RangeSet::Satisfiable(vec![ByteRange {
                        start: len - n,
                        end_inclusive: len - 1,
                    }])
                };
            }
            if let Some(l) = last {
                let (f, l) = (first.trim_start_matches('0'), l.trim_start_matches('0'));
                if (l.len(), l) < (f.len(), f) {
                    return RangeSet::Ignore;
                }
            }
            if cmp(first, len) != Less {
                return RangeSet::Unsatisfiable;
            }
            let start: u64 = first.parse().unwrap();
            let end_inclusive = match last {
                Some(l) if cmp(l, len) == Less => l.parse().unwrap(),
                _ => len - 1,
            };
            RangeSet::Satisfiable(vec![ByteRange {
                start,
                end_inclusive,
            }])
        }

        proptest! {
            #[test]
            fn ranges_stay_within_the_file(v in "(bytes|BYTES|x)=[0-9, -]{0,40}", len in 0u64..2000) {
                if let RangeSet::Satisfiable(rs) = parse_range(&v, len, 16) {
                    prop_assert!(!rs.is_empty());
                    for w in rs.windows(2) {
                        prop_assert!(w[0].end_inclusive + 1 < w[1].start);
                    }
                    for r in rs {
                        prop_assert!(r.start <= r.end_inclusive && r.end_inclusive < len);
                    }
                }
            }

            /// One range-spec, with numerals small or far past u64, against RFC 9110 §14.1's
            /// rules written out on decimal strings (no integer conversion at all).
            #[test]
            fn one_spec_follows_rfc_9110(
                first in numeral(),
                last in proptest::option::of(numeral()),
                suffix in any::<bool>(),
                len in prop_oneof![0u64..300, Just(u64::MAX)],
            ) {
                let spec = match (suffix, &last) {
                    (true, _) => format!("-{first}"),
                    (false, Some(l)) => format!("{first}-{l}"),
                    (false, None) => format!("{first}-"),
                };
                let want = model(suffix, &first, last.as_deref(), len);
                prop_assert_eq!(parse_range(&format!("bytes={spec}"), len, 16), want, "{}", spec);
            }

            #[test]
            fn arbitrary_strings_never_panic(v in ".{0,64}", len in any::<u64>()) {
                // And a satisfiable answer keeps its promise: at most 16 ranges, each inside
                // the file, sorted, neither overlapping nor adjacent.
                if let RangeSet::Satisfiable(r) = parse_range(&v, len, 16) {
                    prop_assert!(!r.is_empty() && r.len() <= 16, "{:?}", r);
                    for b in &r {
                        prop_assert!(b.start <= b.end_inclusive && b.end_inclusive < len, "{:?} of {}", b, len);
                    }
                    for w in r.windows(2) {
                        prop_assert!(w[0].end_inclusive + 1 < w[1].start, "{:?}", r);
                    }
                }
            }
        }
    }
}
