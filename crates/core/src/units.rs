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
         (8Mbit/s, 500kbit/s) or bytes per second (100MB/s, 1GiB/s)"
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
        let ns = n * unit_ns / den;
        let ns = u64::try_from(ns).map_err(|_| UnitsError::Duration(s.to_string()))?;
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

/// Parses `30/s`, `29.97/s`, `8Mbit/s`, `500kbit/s`, `1Gbit/s`, `100MB/s`, `1GiB/s`.
pub fn parse_rate(s: &str) -> Result<Rate, UnitsError> {
    let err = || UnitsError::Rate(s.to_string());
    let t = s.trim();
    let body = t
        .strip_suffix("/s")
        .or_else(|| t.strip_suffix("ps"))
        .ok_or_else(err)?;
    let (num, suffix) = split_number(body);
    let lower = suffix.to_ascii_lowercase();
    if lower.is_empty() || lower == "hz" {
        let (n, den) = parse_decimal(num).ok_or_else(err)?;
        let num = u64::try_from(n).map_err(|_| err())?;
        let den = u64::try_from(den).map_err(|_| err())?;
        if num == 0 {
            return Err(err());
        }
        return Ok(Rate::UnitsPerSecond { num, den });
    }
    let bit_mult: Option<u64> = match lower.as_str() {
        "bit" | "b" if suffix != "B" => Some(1),
        "kbit" => Some(1_000),
        "mbit" => Some(1_000_000),
        "gbit" => Some(1_000_000_000),
        _ => None,
    };
    let bits = if let Some(mult) = bit_mult {
        let (n, den) = parse_decimal(num).ok_or_else(err)?;
        let total = n.checked_mul(u128::from(mult)).ok_or_else(err)?;
        if total % den != 0 {
            return Err(err());
        }
        u64::try_from(total / den).map_err(|_| err())?
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
}
