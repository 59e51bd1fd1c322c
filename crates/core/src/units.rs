//! Sizes, durations and rates as people type them: `64KiB`, `1 MiB`, `33.333ms`, `30/s`,
//! `8Mbit/s`, `100MB/s`. Parsed into exact integers (rates as rationals) so that schedules
//! computed from them never drift.

use std::time::Duration;

/// Why a size, duration or rate was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UnitsError {
    #[error("invalid size {0:?}: expected a byte count like 4096, 64KiB, 1MiB, 1.5GB")]
    Size(String),
    #[error("invalid duration {0:?}: expected e.g. 33.333ms, 1s, 500us, 2min")]
    Duration(String),
    #[error(
        "invalid rate {0:?}: expected units per second (30/s, 29.97/s), bits per second \
         (8Mbps, 8Mbit/s, 500kbps: a lower-case b is bits) or bytes per second (100MB/s, \
         1GiB/s: an upper-case B is bytes)"
    )]
    Rate(String),
}

const SIZE_SUFFIXES: &[(&str, u64)] = &[
    ("kib", 1 << 10),
    ("mib", 1 << 20),
    ("gib", 1 << 30),
    ("tib", 1 << 40),
    ("kb", 1_000),
    ("mb", 1_000_000),
    ("gb", 1_000_000_000),
    ("tb", 1_000_000_000_000),
    ("k", 1 << 10),
    ("m", 1 << 20),
    ("g", 1 << 30),
    ("t", 1 << 40),
    ("b", 1),
    ("", 1),
];

/// Splits `"1.5"` into an exact rational `(15, 10)`; at most 9 fractional digits.
fn parse_decimal(s: &str) -> Option<(u128, u128)> {
    let (int, frac) = match s.split_once('.') {
        Some((i, f)) => (i, f),
        None => (s, ""),
    };
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if frac.len() > 9 || int.len() > 20 {
        return None;
    }
    let den = 10u128.pow(frac.len() as u32);
    let int_v: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let frac_v: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().ok()?
    };
    Some((int_v * den + frac_v, den))
}

/// Splits a number from its suffix: `"64KiB"` → `("64", "KiB")`, `"1 MiB"` → `("1", "MiB")`.
fn split_number(s: &str) -> (&str, &str) {
    let s = s.trim();
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    (&s[..end], s[end..].trim())
}

/// Parses a byte count: a plain integer, or a number with a binary (`KiB`, `MiB`, `GiB`, also
/// `k`/`m`/`g`) or decimal (`KB`, `MB`, `GB`) suffix. Fractions must come out whole.
pub fn parse_size(s: &str) -> Result<u64, UnitsError> {
    let err = || UnitsError::Size(s.to_string());
    let (num, suffix) = split_number(s);
    let suffix = suffix.to_ascii_lowercase();
    let mult = SIZE_SUFFIXES
        .iter()
        .find(|(name, _)| *name == suffix)
        .map(|(_, m)| *m)
        .ok_or_else(err)?;
    let (n, den) = parse_decimal(num).ok_or_else(err)?;
    let total = n.checked_mul(u128::from(mult)).ok_or_else(err)?;
    if total % den != 0 {
        return Err(err());
    }
    u64::try_from(total / den).map_err(|_| err())
}

/// Parses a duration: `33.333ms`, `1s`, `250us`, `2min`, `1h 30m` (humantime's grammar), or a
/// bare `0`.
pub fn parse_duration(s: &str) -> Result<Duration, UnitsError> {
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    // humantime has no fractions: accept `33.333ms` by scaling down one unit at a time.
    if let Some((num, unit)) = split_decimal_unit(t) {
        let (n, den) = parse_decimal(num).ok_or_else(|| UnitsError::Duration(s.to_string()))?;
        let unit_ns: u128 = match unit {
            "ns" => 1,
            "us" | "µs" => 1_000,
            "ms" => 1_000_000,
            "s" | "sec" => 1_000_000_000,
            "m" | "min" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return Err(UnitsError::Duration(s.to_string())),
        };
        let err = || UnitsError::Duration(s.to_string());
        let scaled = n.checked_mul(unit_ns).ok_or_else(err)?;
        if scaled % den != 0 {
            // Finer than a nanosecond.
            return Err(err());
        }
        let ns = u64::try_from(scaled / den).map_err(|_| err())?;
        return Ok(Duration::from_nanos(ns));
    }
    humantime::parse_duration(t).map_err(|_| UnitsError::Duration(s.to_string()))
}

fn split_decimal_unit(t: &str) -> Option<(&str, &str)> {
    let (num, unit) = split_number(t);
    if num.contains('.') {
        Some((num, unit))
    } else {
        None
    }
}

/// A rate as the user gave it. Frequencies are exact rationals so that `29.97/s` is exactly
/// 2997/100 units per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rate {
    /// `num / den` transfer units per second (`30/s`).
    UnitsPerSecond { num: u64, den: u64 },
    /// Bits per second (`8Mbit/s`).
    BitsPerSecond(u64),
}

impl Rate {
    /// The rate in bytes per second for a given unit size, as an exact rational `(num, den)`.
    pub fn bytes_per_second(self, unit_bytes: u64) -> (u128, u128) {
        match self {
            Rate::UnitsPerSecond { num, den } => {
                (u128::from(num) * u128::from(unit_bytes), u128::from(den))
            }
            Rate::BitsPerSecond(bits) => (u128::from(bits), 8),
        }
    }
}

/// The multiplier of a bit rate's prefix: `k`, `M`, `G`, `T` (1000s) or `Ki`, `Mi`, `Gi`, `Ti`
/// (1024s), in any case (`kbps` and `Kbps` are the same).
fn bit_prefix(p: &str) -> Option<u64> {
    Some(match p.to_ascii_lowercase().as_str() {
        "" => 1,
        "k" => 1_000,
        "m" => 1_000_000,
        "g" => 1_000_000_000,
        "t" => 1_000_000_000_000,
        "ki" => 1 << 10,
        "mi" => 1 << 20,
        "gi" => 1 << 30,
        "ti" => 1 << 40,
        _ => return None,
    })
}

/// Parses a rate:
/// - transfer units per second: `30/s`, `29.97/s` (also `30Hz/s`);
/// - **bits** per second: a lower-case `b` or the word `bit` — `8Mbps`, `8Mb/s`, `8Mbit/s`,
///   `500kbps`, `500kbit/s`, `1Gbps`, `100bps`, `1Kibps` (k, M, G, T are 1000s as in
///   networking; Ki, Mi, Gi, Ti 1024s);
/// - **bytes** per second: an upper-case `B` or a size suffix — `100MB/s`, `1MBps`,
///   `1GiB/s`, `64KiB/s`, `10M/s` (sizes as [`parse_size`] reads them).
///
/// `Mbps` is megabits everywhere, as every network tool means it (`8Mbps` = 1 MB/s).
pub fn parse_rate(s: &str) -> Result<Rate, UnitsError> {
    let err = || UnitsError::Rate(s.to_string());
    let t = s.trim();
    let (body, per_s_word) = if let Some(b) = t.strip_suffix("/s") {
        (b, false)
    } else if let Some(b) = t.strip_suffix("ps").or_else(|| t.strip_suffix("PS")) {
        (b, true)
    } else {
        return Err(err());
    };
    let (num, suffix) = split_number(body);
    let lower = suffix.to_ascii_lowercase();
    if !per_s_word && (lower.is_empty() || lower == "hz") {
        let (n, den) = parse_decimal(num).ok_or_else(err)?;
        let num = u64::try_from(n).map_err(|_| err())?;
        let den = u64::try_from(den).map_err(|_| err())?;
        if num == 0 {
            return Err(err());
        }
        return Ok(Rate::UnitsPerSecond { num, den });
    }
    // Bits: a suffix ending in the word "bit" (any case) or in a lower-case "b".
    let bit_prefix_str = if lower.ends_with("bit") {
        Some(&suffix[..suffix.len() - 3])
    } else {
        suffix.strip_suffix('b')
    };
    let bits = if let Some(prefix) = bit_prefix_str {
        let mult = bit_prefix(prefix).ok_or_else(err)?;
        let (n, den) = parse_decimal(num).ok_or_else(err)?;
        let total = n.checked_mul(u128::from(mult)).ok_or_else(err)?;
        if total % den != 0 {
            return Err(err());
        }
        u64::try_from(total / den).map_err(|_| err())?
    } else if suffix.is_empty() {
        // `30ps`: neither units per second nor a size.
        return Err(err());
    } else {
        let bytes = parse_size(&format!("{num}{suffix}")).map_err(|_| err())?;
        bytes.checked_mul(8).ok_or_else(err)?
    };
    if bits == 0 {
        return Err(err());
    }
    Ok(Rate::BitsPerSecond(bits))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64KiB"), Ok(65536));
        assert_eq!(parse_size("1 MiB"), Ok(1 << 20));
        assert_eq!(parse_size("1.5KiB"), Ok(1536));
        assert_eq!(parse_size("40MB"), Ok(40_000_000));
        assert_eq!(parse_size("0"), Ok(0));
        assert!(parse_size("1.3B").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("99999999999999999999TiB").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("33.333ms"),
            Ok(Duration::from_micros(33_333))
        );
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn rates() {
        assert_eq!(
            parse_rate("30/s"),
            Ok(Rate::UnitsPerSecond { num: 30, den: 1 })
        );
        assert_eq!(
            parse_rate("29.97/s"),
            Ok(Rate::UnitsPerSecond {
                num: 2997,
                den: 100
            })
        );
        assert_eq!(parse_rate("8Mbit/s"), Ok(Rate::BitsPerSecond(8_000_000)));
        assert_eq!(parse_rate("100MB/s"), Ok(Rate::BitsPerSecond(800_000_000)));
        assert_eq!(parse_rate("1KiB/s"), Ok(Rate::BitsPerSecond(8192)));
        assert!(parse_rate("0/s").is_err());
        assert!(parse_rate("30").is_err());
        assert!(parse_rate("fast/s").is_err());
    }

    /// What each spelling means, by hand (issue 16: `8Mbps` used to mean 8 MB/s).
    const RATE_TABLE: &[(&str, u64)] = &[
        ("8Mbps", 8_000_000),
        ("8 Mbps", 8_000_000),
        ("8mbps", 8_000_000),
        ("8Mb/s", 8_000_000),
        ("8Mbit/s", 8_000_000),
        ("8MBit/s", 8_000_000),
        ("1.5Mbps", 1_500_000),
        ("500kbps", 500_000),
        ("500Kbps", 500_000),
        ("500kbit/s", 500_000),
        ("1Gbps", 1_000_000_000),
        ("2Tbps", 2_000_000_000_000),
        ("100bps", 100),
        ("100b/s", 100),
        ("100bit/s", 100),
        ("1Kibps", 1024),
        ("1Mib/s", 1 << 20),
        ("1MBps", 8_000_000),
        ("100MB/s", 800_000_000),
        ("1KiB/s", 8192),
        ("1MiB/s", 8 << 20),
        ("10M/s", 80 << 20),
        ("1B/s", 8),
        ("3kB/s", 24_000),
    ];

    #[test]
    fn rates_follow_the_reference_table() {
        for &(text, bits) in RATE_TABLE {
            assert_eq!(parse_rate(text), Ok(Rate::BitsPerSecond(bits)), "{text}");
        }
        // 8Mbps is 1 MB/s.
        assert_eq!(
            parse_rate("8Mbps").unwrap().bytes_per_second(1316),
            (8_000_000, 8)
        );
        for bad in [
            "30ps",
            "0bps",
            "-1bps",
            "8Mbpsx",
            "8Xbps",
            "1.0000000001Mbps",
            "1.5bps",
            "bps",
            "8Mbps/s",
            "",
        ] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_refuse_what_they_cannot_hold() {
        assert!(parse_duration("1.5ns").is_err());
        assert!(parse_duration("99999999999999999999.999999999h").is_err());
        assert_eq!(parse_duration("0.5s"), Ok(Duration::from_millis(500)));
    }

    use proptest::prelude::*;

    /// (suffix as typed, multiplier of the number, in bits or in bytes)
    fn rate_unit() -> impl Strategy<Value = (String, u128, bool)> {
        prop_oneof![
            Just(("bps".to_string(), 1u128, true)),
            Just(("kbps".to_string(), 1_000, true)),
            Just(("Kbps".to_string(), 1_000, true)),
            Just(("Mbps".to_string(), 1_000_000, true)),
            Just(("Gbps".to_string(), 1_000_000_000, true)),
            Just(("kbit/s".to_string(), 1_000, true)),
            Just(("Mbit/s".to_string(), 1_000_000, true)),
            Just(("Mb/s".to_string(), 1_000_000, true)),
            Just(("Kibps".to_string(), 1 << 10, true)),
            Just(("B/s".to_string(), 1, false)),
            Just(("KB/s".to_string(), 1_000, false)),
            Just(("MB/s".to_string(), 1_000_000, false)),
            Just(("MBps".to_string(), 1_000_000, false)),
            Just(("KiB/s".to_string(), 1 << 10, false)),
            Just(("MiB/s".to_string(), 1 << 20, false)),
            Just(("GiB/s".to_string(), 1 << 30, false)),
        ]
    }

    proptest! {
        /// Every rate a person types means what the reference table says: the number times
        /// the unit's multiplier, in bits (bytes × 8); a fraction that does not come out
        /// whole is refused.
        #[test]
        fn rates_match_the_reference(int in 0u64..1_000_000, frac in 0u32..1000, digits in 0usize..4, unit in rate_unit()) {
            let (suffix, mult, bits) = unit;
            let frac_text = if digits == 0 { String::new() } else { format!(".{:0width$}", frac % 10u32.pow(digits as u32), width = digits) };
            let text = format!("{int}{frac_text}{suffix}");
            let den = 10u128.pow(digits as u32);
            let n = u128::from(int) * den + if digits == 0 { 0 } else { u128::from(frac % 10u32.pow(digits as u32)) };
            let total = n * mult * if bits { 1 } else { 8 };
            let expect = (total.is_multiple_of(den) && total / den > 0 && (bits || (n * mult).is_multiple_of(den)))
                .then(|| u64::try_from(total / den).ok())
                .flatten();
            match expect {
                Some(b) => prop_assert_eq!(parse_rate(&text), Ok(Rate::BitsPerSecond(b)), "{}", text),
                None => prop_assert!(parse_rate(&text).is_err(), "{}", text),
            }
        }

        /// Sizes: the number times the suffix's multiplier (KiB 1024s, KB 1000s), exact.
        #[test]
        fn sizes_match_the_reference(int in 0u64..1_000_000, unit in proptest::sample::select(vec![("", 1u64), ("B", 1), ("KiB", 1 << 10), ("k", 1 << 10), ("KB", 1000), ("MiB", 1 << 20), ("MB", 1_000_000), ("GiB", 1 << 30), ("GB", 1_000_000_000)])) {
            let text = format!("{int}{}", unit.0);
            prop_assert_eq!(parse_size(&text), Ok(int * unit.1));
        }

        /// Durations: whole units scale exactly.
        #[test]
        fn durations_match_the_reference(n in 0u64..1_000_000, unit in proptest::sample::select(vec![("ns", 1u64), ("us", 1_000), ("ms", 1_000_000), ("s", 1_000_000_000), ("min", 60_000_000_000)])) {
            let text = format!("{n}.0{}", unit.0);
            prop_assert_eq!(parse_duration(&text), Ok(Duration::from_nanos(n * unit.1)));
        }

        /// No input panics, and what parses means one value: written back plainly (bytes,
        /// nanoseconds) it parses to the same.
        #[test]
        fn any_text_is_answered(s in ".{0,24}") {
            let _ = parse_rate(&s);
            if let Ok(n) = parse_size(&s) {
                prop_assert_eq!(parse_size(&n.to_string()), Ok(n), "{}", s);
            }
            if let Ok(d) = parse_duration(&s)
                && u64::try_from(d.as_nanos()).is_ok()
            {
                prop_assert_eq!(parse_duration(&format!("{}ns", d.as_nanos())), Ok(d), "{}", s);
            }
        }
    }
}
