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
    /// Malformed, another unit, or more than `ranges_max` ranges: ignore the header and
    /// serve the whole file with 200 (RFC 9110 §14.2: a server MAY ignore Range).
    Ignore,
}

/// Evaluates a `Range` header value against a file of `file_len_bytes` bytes.
///
/// Numbers too large for a u64 saturate rather than fail: `bytes=99999999999999999999999-`
/// starts past any file's end (416), and a huge last-byte-pos or suffix means "to the end".
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
            if suffix == 0 || file_len_bytes == 0 {
                None
            } else {
                Some(ByteRange {
                    start: file_len_bytes.saturating_sub(suffix),
                    end_inclusive: file_len_bytes - 1,
                })
            }
        } else {
            let Some(first) = parse_digits_saturating(first) else {
                return RangeSet::Ignore;
            };
            let last = if last.is_empty() {
                u64::MAX
            } else {
                match parse_digits_saturating(last) {
                    Some(l) if l >= first => l,
                    // `last < first` is invalid syntax: the whole header is ignored.
                    _ => return RangeSet::Ignore,
                }
            };
            if first >= file_len_bytes {
                None
            } else {
                Some(ByteRange {
                    start: first,
                    end_inclusive: last.min(file_len_bytes - 1),
                })
            }
        };
        ranges.extend(range);
    }
    if specs == 0 {
        return RangeSet::Ignore;
    }
    if ranges.is_empty() {
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
        // A zero-length file has no satisfiable range at all.
        assert_eq!(parse_range("bytes=0-", 0, 16), RangeSet::Unsatisfiable);
        assert_eq!(parse_range("bytes=-1", 0, 16), RangeSet::Unsatisfiable);
        assert_eq!(parse_range("bytes=0-0", 0, 16), RangeSet::Unsatisfiable);
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

            #[test]
            fn arbitrary_strings_never_panic(v in ".{0,64}", len in any::<u64>()) {
                let _ = parse_range(&v, len, 16);
            }
        }
    }
}
