//! Configuration values with units: a field named `…_ms`, `…_us`, `…_bytes` or `…_bytes_per_s` takes a
//! number in the unit its name says, or a string in the command line's units — `"30s"`,
//! `"250ms"`, `"64KiB"`, `"1 MiB"`, `"8Mbps"` (megabits), `"100MB/s"` — parsed by
//! `penstock_core::units`, so the file and the command line read the same.

use penstock_core::units::{Rate, parse_duration, parse_rate, parse_size};
use serde::{Deserialize, Deserializer, de::Error};

/// A number, or a string with a unit.
#[derive(Deserialize)]
#[serde(untagged)]
enum Raw {
    Number(u64),
    Text(String),
}

fn convert<'de, D, T>(d: D, parse: impl Fn(&str) -> Result<u64, String>) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<u64>,
{
    let v = match Raw::deserialize(d)
        .map_err(|_| D::Error::custom("expected a non-negative number or a string with a unit"))?
    {
        Raw::Number(n) => n,
        Raw::Text(s) => parse(&s).map_err(D::Error::custom)?,
    };
    T::try_from(v).map_err(|_| D::Error::custom(format!("{v} is too large")))
}

fn millis(s: &str) -> Result<u64, String> {
    let d = parse_duration(s).map_err(|e| format!("{e} (a duration such as 30s, 250ms, 2min)"))?;
    u64::try_from(d.as_millis())
        .ok()
        .filter(|_| d.subsec_nanos() % 1_000_000 == 0)
        .ok_or_else(|| format!("{s:?}: not a whole number of milliseconds"))
}

fn micros(s: &str) -> Result<u64, String> {
    let d = parse_duration(s).map_err(|e| format!("{e} (a duration such as 250us, 1ms)"))?;
    u64::try_from(d.as_micros())
        .ok()
        .filter(|_| d.subsec_nanos() % 1_000 == 0)
        .ok_or_else(|| format!("{s:?}: not a whole number of microseconds"))
}

fn bytes(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| format!("{e} (a size such as 64KiB, 1MiB, 4096)"))
}

fn bytes_per_s(s: &str) -> Result<u64, String> {
    match parse_rate(s).map_err(|e| format!("{e} (a rate such as 8Mbps, 100MB/s)"))? {
        Rate::BitsPerSecond(b) => Ok(b / 8),
        Rate::UnitsPerSecond { .. } => Err(format!(
            "{s:?}: a rate in units per second has no size here; give bits (8Mbps) or bytes (1MB/s) per second"
        )),
    }
}

/// `…_ms`: milliseconds, or `"30s"`.
pub fn ms<'de, D: Deserializer<'de>, T: TryFrom<u64>>(d: D) -> Result<T, D::Error> {
    convert(d, millis)
}

/// `…_bytes`: bytes, or `"64KiB"`.
pub fn size<'de, D: Deserializer<'de>, T: TryFrom<u64>>(d: D) -> Result<T, D::Error> {
    convert(d, bytes)
}

/// `…_bytes_per_s`: bytes per second, or `"8Mbps"` / `"1MB/s"`.
pub fn rate<'de, D: Deserializer<'de>, T: TryFrom<u64>>(d: D) -> Result<T, D::Error> {
    convert(d, bytes_per_s)
}

/// The same for optional fields.
pub fn opt_ms<'de, D: Deserializer<'de>, T: TryFrom<u64>>(d: D) -> Result<Option<T>, D::Error> {
    convert(d, millis).map(Some)
}

/// `…_us`: microseconds, or `"250us"` / `"1ms"`.
pub fn opt_us<'de, D: Deserializer<'de>, T: TryFrom<u64>>(d: D) -> Result<Option<T>, D::Error> {
    convert(d, micros).map(Some)
}

pub fn opt_size<'de, D: Deserializer<'de>, T: TryFrom<u64>>(d: D) -> Result<Option<T>, D::Error> {
    convert(d, bytes).map(Some)
}

pub fn opt_rate<'de, D: Deserializer<'de>, T: TryFrom<u64>>(d: D) -> Result<Option<T>, D::Error> {
    convert(d, bytes_per_s).map(Some)
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    #[derive(Deserialize, Debug)]
    struct T {
        #[serde(deserialize_with = "super::ms")]
        a_ms: u64,
        #[serde(deserialize_with = "super::size")]
        b_bytes: usize,
        #[serde(deserialize_with = "super::rate")]
        c_bytes_per_s: u64,
        #[serde(default, deserialize_with = "super::opt_size")]
        d_bytes: Option<u64>,
    }

    fn parse(s: &str) -> Result<T, String> {
        toml::from_str(s).map_err(|e| e.to_string())
    }

    #[test]
    fn numbers_and_units_mean_the_same() {
        let a = parse("a_ms = 30000\nb_bytes = 65536\nc_bytes_per_s = 1000000\n").unwrap();
        let b = parse("a_ms = \"30s\"\nb_bytes = \"64KiB\"\nc_bytes_per_s = \"8Mbps\"\n").unwrap();
        assert_eq!(
            (a.a_ms, a.b_bytes, a.c_bytes_per_s),
            (30_000, 65_536, 1_000_000)
        );
        assert_eq!(
            (b.a_ms, b.b_bytes, b.c_bytes_per_s),
            (30_000, 65_536, 1_000_000)
        );
        assert_eq!(a.d_bytes, None);
        let c = parse("a_ms = \"250ms\"\nb_bytes = \"1 MiB\"\nc_bytes_per_s = \"1MB/s\"\nd_bytes = \"2KiB\"\n").unwrap();
        assert_eq!(
            (c.a_ms, c.b_bytes, c.c_bytes_per_s, c.d_bytes),
            (250, 1 << 20, 1_000_000, Some(2048))
        );
    }

    #[test]
    fn bad_values_say_what_was_expected() {
        for (bad, says) in [
            ("a_ms = \"30 parsecs\"", "duration"),
            ("a_ms = \"1.5us\"", "milliseconds"),
            ("a_ms = -1", "non-negative"),
            ("a_ms = 1.5", "non-negative"),
            ("b_bytes = \"12 apples\"", "size"),
            ("c_bytes_per_s = \"30/s\"", "no size here"),
        ] {
            let text = format!("a_ms = 1\nb_bytes = 1\nc_bytes_per_s = 1\n{bad}\n");
            // The later key repeats an earlier one for a_ms/b/c: build the file without it.
            let key = bad.split(' ').next().unwrap();
            let text: String = text
                .lines()
                .filter(|l| !l.starts_with(key) || *l == bad)
                .map(|l| format!("{l}\n"))
                .collect();
            let e = parse(&text).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
