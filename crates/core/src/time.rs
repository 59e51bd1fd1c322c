//! Time as a value: the core never reads a clock.
//!
//! An [`Instant`] is a count of nanoseconds on some monotonic clock chosen by the driver
//! (CLOCK_MONOTONIC there; a counter in tests). Only differences between instants of the
//! same clock mean anything.

use std::fmt;
use std::ops::{Add, AddAssign, Sub};
use std::time::Duration;

/// A point in time, in nanoseconds of a monotonic clock the caller owns.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant {
    ns: u64,
}

impl Instant {
    /// The clock's origin.
    pub const ZERO: Instant = Instant { ns: 0 };
    /// The latest representable instant ("never").
    pub const MAX: Instant = Instant { ns: u64::MAX };

    /// An instant `ns` nanoseconds after the clock's origin.
    pub const fn from_nanos(ns: u64) -> Instant {
        Instant { ns }
    }

    /// Nanoseconds since the clock's origin.
    pub const fn as_nanos(self) -> u64 {
        self.ns
    }

    /// `self - earlier`, or zero when `earlier` is later than `self`.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.ns.saturating_sub(earlier.ns))
    }

    /// `self - earlier`, or `None` when `earlier` is later than `self`.
    pub fn checked_duration_since(self, earlier: Instant) -> Option<Duration> {
        self.ns.checked_sub(earlier.ns).map(Duration::from_nanos)
    }

    /// `self + d`, or `None` on overflow.
    pub fn checked_add(self, d: Duration) -> Option<Instant> {
        let d_ns = u64::try_from(d.as_nanos()).ok()?;
        self.ns.checked_add(d_ns).map(Instant::from_nanos)
    }

    /// `self + d`, clamped to [`Instant::MAX`].
    pub fn saturating_add(self, d: Duration) -> Instant {
        self.checked_add(d).unwrap_or(Instant::MAX)
    }

    /// Signed difference `self - other` in nanoseconds (positive when `self` is later).
    pub fn signed_nanos_since(self, other: Instant) -> i128 {
        i128::from(self.ns) - i128::from(other.ns)
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    /// Panics on overflow, like `std::time::Instant`.
    fn add(self, d: Duration) -> Instant {
        self.checked_add(d).expect("Instant + Duration overflowed")
    }
}

impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, d: Duration) {
        *self = *self + d;
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    /// Saturates at zero, like `std::time::Instant` since Rust 1.60.
    fn sub(self, earlier: Instant) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Instant({}.{:09}s)",
            self.ns / 1_000_000_000,
            self.ns % 1_000_000_000
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_round_trips() {
        let t = Instant::from_nanos(5);
        assert_eq!((t + Duration::from_nanos(10)).as_nanos(), 15);
        assert_eq!(Instant::from_nanos(15) - t, Duration::from_nanos(10));
        assert_eq!(t - Instant::from_nanos(15), Duration::ZERO);
        assert_eq!(t.signed_nanos_since(Instant::from_nanos(15)), -10);
        assert_eq!(Instant::MAX.checked_add(Duration::from_nanos(1)), None);
        assert_eq!(
            Instant::MAX.saturating_add(Duration::from_secs(1)),
            Instant::MAX
        );
    }
}
