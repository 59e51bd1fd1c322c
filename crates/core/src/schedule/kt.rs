//! Cues' (k, t) schedules: `k` units, then a pause.
//!
//! In Cues the process transferred `k` blocks and then yielded for a delay `t`, so a cycle
//! lasted `t` *plus* however long the `k` transfers took, and the stream drifted by that
//! amount every cycle. penstock defines `t` as the **cycle length**: the `k` units of cycle
//! `i` (units `i·k .. i·k + k`) are all due at `start + i·t`, and the pause is whatever is left
//! of the cycle after they are sent. The deadlines then depend only on `(start, i)`, never on
//! how long a send took, so they cannot drift; when the sends are quick (the case Cues
//! measured), the gap is `t` minus a little, as in the paper.
//!
//! On the command line: `--schedule K,T`, e.g. `--schedule 4,40ms`.

use std::time::Duration;

use super::ScheduleError;
use crate::units::parse_duration;

/// Parses `K,T` (`4,40ms`): `k` units at the start of every cycle of length `t`.
///
/// Refuses a missing comma, a `k` that is not a positive integer, and a `t` that
/// [`parse_duration`] refuses (a negative duration among them). Zero values are refused
/// later, by [`super::Schedule::new`], with the other limits.
pub fn parse_kt(s: &str) -> Result<(u64, Duration), ScheduleError> {
    let bad = || ScheduleError::KtSyntax(s.to_string());
    let (k, t) = s.split_once(',').ok_or_else(bad)?;
    let k = k.trim();
    if k.is_empty() || !k.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let k: u64 = k.parse().map_err(|_| bad())?;
    let t = parse_duration(t).map_err(|_| bad())?;
    Ok((k, t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_k_and_t() {
        assert_eq!(parse_kt("4,40ms"), Ok((4, Duration::from_millis(40))));
        assert_eq!(parse_kt(" 2 , 1.5s "), Ok((2, Duration::from_millis(1500))));
        assert_eq!(parse_kt("0,1s"), Ok((0, Duration::from_secs(1))));
        for bad in [
            "4", "4;40ms", ",40ms", "-4,40ms", "4,-40ms", "4,soon", "x,1s", "4,",
        ] {
            assert!(
                matches!(parse_kt(bad), Err(ScheduleError::KtSyntax(_))),
                "{bad:?} was accepted"
            );
        }
    }
}
