//! The exact period every paced schedule is built on.
//!
//! A period is a rational number of nanoseconds, `num_ns / den`, because the periods people
//! ask for are rarely whole nanoseconds: `30/s` is 33,333,333⅓ ns and `29.97/s` is
//! 33,366,700.03… ns. Rounding the period once and adding it up drifts by the rounding error
//! times the number of units: 33,333,333 ns at 30/s runs 10 ns/s fast, and a loop that sleeps
//! a whole 33 ms runs 1% fast, a second every 100 s. Instead the offset of cycle `i` is
//! computed from scratch each time as `ceil(i · num_ns / den)` in `u128`: the error of any
//! deadline is below one nanosecond, whatever `i` is.

use std::fmt;

/// A period of `num_ns / den` nanoseconds, kept as a reduced fraction.
///
/// Invariants (checked by the only constructors): `num_ns > 0`, `den > 0`, the fraction is
/// reduced. `den` fits in a `u64`, which is what keeps `elapsed_ns · den` (in
/// [`Period::cycles_due_at`]) inside `u128`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Period {
    num_ns: u128,
    den: u64,
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Period {
    /// A whole number of nanoseconds; `None` for zero.
    pub fn from_nanos(period_ns: u64) -> Option<Period> {
        Period::from_ratio(u128::from(period_ns), 1)
    }

    /// `num_ns / den` nanoseconds, reduced; `None` when either part is zero or when the
    /// reduced denominator does not fit in a `u64`.
    pub fn from_ratio(num_ns: u128, den: u128) -> Option<Period> {
        if num_ns == 0 || den == 0 {
            return None;
        }
        let g = gcd(num_ns, den);
        let den = u64::try_from(den / g).ok()?;
        Some(Period {
            num_ns: num_ns / g,
            den,
        })
    }

    /// Numerator of the period in nanoseconds (the period is `num_ns() / den()` ns).
    pub fn num_ns(self) -> u128 {
        self.num_ns
    }

    /// Denominator of the period (the period is `num_ns() / den()` ns).
    pub fn den(self) -> u64 {
        self.den
    }

    /// The period rounded down to whole nanoseconds, saturating at `u64::MAX`.
    pub fn floor_ns(self) -> u64 {
        u64::try_from(self.num_ns / u128::from(self.den)).unwrap_or(u64::MAX)
    }

    /// The period rounded up to whole nanoseconds, saturating at `u64::MAX`. This is the
    /// value to use as a rate-monotonic priority or as the default miss threshold.
    pub fn ceil_ns(self) -> u64 {
        u64::try_from(self.num_ns.div_ceil(u128::from(self.den))).unwrap_or(u64::MAX)
    }

    /// `true` when the period is shorter than `ns` nanoseconds (exactly, not rounded).
    pub fn is_shorter_than_ns(self, ns: u64) -> bool {
        self.num_ns < u128::from(ns) * u128::from(self.den)
    }

    /// `true` when the period is longer than `ns` nanoseconds (exactly, not rounded).
    pub fn is_longer_than_ns(self, ns: u64) -> bool {
        self.num_ns > u128::from(ns) * u128::from(self.den)
    }

    /// Offset of the start of cycle `cycle` from the stream's start: `ceil(cycle · period)`
    /// nanoseconds, saturating at `u64::MAX` ("never").
    ///
    /// Rounded *up* so that no unit is ever due before its exact rational time: a stream is
    /// then never ahead of its rate, not even by a fraction of a nanosecond, and the bound
    /// "bytes due by `now` ≤ rate · elapsed + one unit" holds exactly in integers.
    pub fn offset_ns(self, cycle: u64) -> u64 {
        match u128::from(cycle).checked_mul(self.num_ns) {
            Some(p) => u64::try_from(p.div_ceil(u128::from(self.den))).unwrap_or(u64::MAX),
            // cycle · num_ns ≥ 2^128 and den < 2^64, so the quotient exceeds u64::MAX.
            None => u64::MAX,
        }
    }

    /// How many cycles have started within `elapsed_ns` of the stream's start, counting
    /// cycle 0 (which starts at offset 0): the number of `i` with `offset_ns(i) ≤ elapsed_ns`,
    /// saturating at `u64::MAX`.
    ///
    /// `ceil(i · n / d) ≤ e` ⟺ `i · n / d ≤ e` (e is whole) ⟺ `i ≤ floor(e · d / n)`.
    pub fn cycles_due_at(self, elapsed_ns: u64) -> u64 {
        // elapsed_ns < 2^64 and den < 2^64: the product fits in u128.
        let last = u128::from(elapsed_ns) * u128::from(self.den) / self.num_ns;
        u64::try_from(last.saturating_add(1)).unwrap_or(u64::MAX)
    }
}

impl fmt::Debug for Period {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.den == 1 {
            write!(f, "Period({} ns)", self.num_ns)
        } else {
            write!(f, "Period({}/{} ns)", self.num_ns, self.den)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduces_and_rounds() {
        // 30/s: 10^9 / 30 = 100,000,000 / 3 ns.
        let p = Period::from_ratio(1_000_000_000, 30).unwrap();
        assert_eq!((p.num_ns(), p.den()), (100_000_000, 3));
        assert_eq!(p.floor_ns(), 33_333_333);
        assert_eq!(p.ceil_ns(), 33_333_334);
        assert_eq!(p.offset_ns(0), 0);
        assert_eq!(p.offset_ns(1), 33_333_334);
        assert_eq!(p.offset_ns(3), 100_000_000);
        assert_eq!(p.cycles_due_at(0), 1);
        assert_eq!(p.cycles_due_at(33_333_333), 1);
        assert_eq!(p.cycles_due_at(33_333_334), 2);
        assert!(Period::from_ratio(0, 1).is_none());
        assert!(Period::from_ratio(1, 0).is_none());
        assert!(Period::from_nanos(0).is_none());
        assert_eq!(Period::from_nanos(7).unwrap().offset_ns(3), 21);
    }

    #[test]
    fn saturates_instead_of_overflowing() {
        let p = Period::from_nanos(u64::MAX).unwrap();
        assert_eq!(p.offset_ns(2), u64::MAX);
        assert_eq!(p.offset_ns(u64::MAX), u64::MAX);
        let tiny = Period::from_ratio(1, u128::from(u64::MAX)).unwrap();
        assert_eq!(tiny.cycles_due_at(u64::MAX), u64::MAX);
        let huge = Period::from_ratio(u128::MAX, 1).unwrap();
        assert_eq!(huge.offset_ns(1), u64::MAX);
        assert_eq!(huge.cycles_due_at(u64::MAX), 1);
    }
}
