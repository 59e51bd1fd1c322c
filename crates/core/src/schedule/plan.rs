//! A unit plan: an explicit list of units, each with its own size and deadline offset.
//!
//! The schedules above compute deadlines from a formula and cut a stream into equal units.
//! Playback of a recording (`--timing tracks`) needs neither: every recorded packet has its own
//! size and its own receive time. A plan lists them. Unit `n` is due `offset_ns` after the
//! stream's start and carries `size_bytes` bytes; the units are consecutive in the source.

/// One unit of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitPlan {
    /// When the unit is due, in ns after the stream's start. Never decreases along a plan.
    pub offset_ns: u64,
    /// Bytes of the unit (one datagram on a UDP target); at least 1.
    pub size_bytes: u32,
}

/// Why a plan was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    #[error("an empty unit plan: nothing to send")]
    Empty,
    #[error("unit {unit} of the plan has 0 bytes")]
    ZeroUnit { unit: usize },
    #[error(
        "unit {unit} of the plan has {size_bytes} bytes, more than the {unit_bytes_max} allowed"
    )]
    UnitTooLarge {
        unit: usize,
        size_bytes: u32,
        unit_bytes_max: u64,
    },
    #[error("unit {unit} of the plan is due before the unit before it")]
    OffsetDecreased { unit: usize },
}

/// Checks a plan against the largest unit the data path can carry; returns its total bytes and
/// its largest unit.
pub fn check_plan(units: &[UnitPlan], unit_bytes_max: u64) -> Result<(u64, u32), PlanError> {
    if units.is_empty() {
        return Err(PlanError::Empty);
    }
    let mut total = 0u64;
    let mut largest = 0u32;
    let mut previous = 0u64;
    for (unit, u) in units.iter().enumerate() {
        if u.size_bytes == 0 {
            return Err(PlanError::ZeroUnit { unit });
        }
        if u64::from(u.size_bytes) > unit_bytes_max {
            return Err(PlanError::UnitTooLarge {
                unit,
                size_bytes: u.size_bytes,
                unit_bytes_max,
            });
        }
        if u.offset_ns < previous {
            return Err(PlanError::OffsetDecreased { unit });
        }
        previous = u.offset_ns;
        largest = largest.max(u.size_bytes);
        // At most 2^32 · len bytes: a u64 holds it for any plan that fits in memory.
        total += u64::from(u.size_bytes);
    }
    Ok((total, largest))
}

/// How many whole units, starting at `first`, fit in `bytes_max` bytes with `header_bytes`
/// in front of each (an RTP header; 0 for none) — at least one, when a unit is left — and
/// their bytes without the headers. The driver reads a buffer of whole units so that no unit
/// straddles two buffers.
pub fn units_fitting(
    units: &[UnitPlan],
    first: usize,
    bytes_max: u64,
    header_bytes: u64,
) -> (usize, u64) {
    let mut n = 0usize;
    let mut bytes = 0u64;
    for u in units.iter().skip(first) {
        let next = bytes + u64::from(u.size_bytes);
        if n > 0 && next + (n as u64 + 1) * header_bytes > bytes_max {
            break;
        }
        n += 1;
        bytes = next;
    }
    (n, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(offset_ns: u64, size_bytes: u32) -> UnitPlan {
        UnitPlan {
            offset_ns,
            size_bytes,
        }
    }

    #[test]
    fn a_valid_plan_reports_total_and_largest() {
        assert_eq!(
            check_plan(&[u(0, 10), u(5, 30), u(5, 20)], 30),
            Ok((60, 30))
        );
    }

    #[test]
    fn refusals_name_the_unit() {
        assert_eq!(check_plan(&[], 10), Err(PlanError::Empty));
        assert_eq!(
            check_plan(&[u(0, 1), u(1, 0)], 10),
            Err(PlanError::ZeroUnit { unit: 1 })
        );
        assert_eq!(
            check_plan(&[u(0, 11)], 10),
            Err(PlanError::UnitTooLarge {
                unit: 0,
                size_bytes: 11,
                unit_bytes_max: 10
            })
        );
        assert_eq!(
            check_plan(&[u(5, 1), u(4, 1)], 10),
            Err(PlanError::OffsetDecreased { unit: 1 })
        );
    }

    #[test]
    fn units_fitting_takes_whole_units_and_at_least_one() {
        let p = [u(0, 400), u(0, 400), u(0, 400), u(0, 5000)];
        assert_eq!(units_fitting(&p, 0, 1000, 0), (2, 800));
        assert_eq!(units_fitting(&p, 2, 1000, 0), (1, 400));
        // A unit larger than the limit still goes alone (the caller bounds units separately).
        assert_eq!(units_fitting(&p, 3, 1000, 0), (1, 5000));
        assert_eq!(units_fitting(&p, 4, 1000, 0), (0, 0));
        // With a header in front of each unit: 2 × (400 + 100) fills 1000 exactly; 101 not.
        assert_eq!(units_fitting(&p, 0, 1000, 100), (2, 800));
        assert_eq!(units_fitting(&p, 0, 1000, 101), (1, 400));
    }
}
