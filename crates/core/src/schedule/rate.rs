//! From a rate as the user typed it (`30/s`, `8Mbit/s`) to the exact period of one unit.
//!
//! Two kinds of rate, one formula each, both exact rationals:
//! - a frame rate of `num / den` units per second: one unit every `10^9 · den / num` ns;
//! - a bit rate of `b` bits per second with units of `u` bytes (constant bit rate): one unit
//!   every `8 · u · 10^9 / b` ns.
//!
//! For a constant bit rate the deadline of unit `n` is the instant the rate allows the byte
//! at offset `n · u`, i.e. deadlines follow bytes sent. Every unit but the last is full, so a
//! short last unit changes nothing: it starts at the same offset and is due at the same time.

use super::ScheduleError;
use super::periodic::Period;
use crate::units::Rate;

const NANOS_PER_S: u128 = 1_000_000_000;

/// The period of one unit of `unit_bytes` at `rate`.
///
/// Refuses a zero rate (`0/s` or `0bit/s`) and an infinite one (`n/0`), which
/// [`crate::units::parse_rate`] never produces but a hand-built [`Rate`] can.
pub(crate) fn unit_period(rate: Rate, unit_bytes: u64) -> Result<Period, ScheduleError> {
    let (num_ns, den) = match rate {
        Rate::UnitsPerSecond { num, den } => {
            if num == 0 || den == 0 {
                return Err(ScheduleError::InvalidRate(rate));
            }
            (NANOS_PER_S * u128::from(den), u128::from(num))
        }
        Rate::BitsPerSecond(bits_per_s) => {
            if bits_per_s == 0 {
                return Err(ScheduleError::InvalidRate(rate));
            }
            if unit_bytes == 0 {
                return Err(ScheduleError::ZeroUnit);
            }
            // unit_bytes < 2^64, so 8 · 10^9 · unit_bytes < 2^97: no overflow.
            (
                8 * NANOS_PER_S * u128::from(unit_bytes),
                u128::from(bits_per_s),
            )
        }
    };
    // Both parts are non-zero and den came from a u64, so from_ratio cannot refuse them.
    Period::from_ratio(num_ns, den).ok_or(ScheduleError::InvalidRate(rate))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_rates() {
        let p = unit_period(Rate::UnitsPerSecond { num: 30, den: 1 }, 1024).unwrap();
        assert_eq!((p.num_ns(), p.den()), (100_000_000, 3));
        let p = unit_period(
            Rate::UnitsPerSecond {
                num: 2997,
                den: 100,
            },
            1024,
        )
        .unwrap();
        assert_eq!((p.num_ns(), p.den()), (100_000_000_000, 2997));
    }

    #[test]
    fn bit_rates() {
        // 8 Mbit/s with 1316-byte units (7 MPEG-TS packets): one unit every 1.316 ms.
        let p = unit_period(Rate::BitsPerSecond(8_000_000), 1316).unwrap();
        assert_eq!((p.num_ns(), p.den()), (1_316_000, 1));
    }

    #[test]
    fn refuses_zero_and_infinite_rates() {
        assert!(unit_period(Rate::UnitsPerSecond { num: 0, den: 1 }, 1).is_err());
        assert!(unit_period(Rate::UnitsPerSecond { num: 1, den: 0 }, 1).is_err());
        assert!(unit_period(Rate::BitsPerSecond(0), 1).is_err());
        assert_eq!(
            unit_period(Rate::BitsPerSecond(8), 0),
            Err(ScheduleError::ZeroUnit)
        );
    }
}
