//! HTTP-dates (RFC 9110 §5.6.7) through httpdate, made total: httpdate panics on times
//! before 1970 or after 9999, and file mtimes can be either.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The last second httpdate can format (9999-12-31T23:59:59Z).
const LATEST_SECS: u64 = 253_402_300_799;

/// Formats `t` as an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), clamped to
/// 1970..=9999 and truncated to the second.
pub fn format_http_date(t: SystemTime) -> String {
    httpdate::fmt_http_date(clamp_to_http_range(t))
}

/// Parses any of the three HTTP-date formats; `None` if invalid (callers then ignore the
/// header, as RFC 9110 §13.1.3 requires).
pub fn parse_http_date(s: &str) -> Option<SystemTime> {
    httpdate::parse_http_date(s.trim()).ok()
}

/// `t` clamped to what an HTTP-date can say, truncated to whole seconds.
pub(crate) fn clamp_to_http_range(t: SystemTime) -> SystemTime {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        .min(LATEST_SECS);
    UNIX_EPOCH + Duration::from_secs(secs)
}

/// Whole seconds since the epoch, zero before it (for comparing dates at HTTP's resolution).
pub(crate) fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_parses_the_rfc_example() {
        let t = UNIX_EPOCH + Duration::from_secs(784_111_777);
        assert_eq!(format_http_date(t), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"), Some(t));
        assert_eq!(parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT"), Some(t));
        assert_eq!(parse_http_date("Sun Nov  6 08:49:37 1994"), Some(t));
        assert_eq!(parse_http_date("tomorrow"), None);
    }

    #[test]
    fn out_of_range_times_do_not_panic() {
        assert_eq!(
            format_http_date(UNIX_EPOCH - Duration::from_secs(5)),
            "Thu, 01 Jan 1970 00:00:00 GMT"
        );
        let far = UNIX_EPOCH + Duration::from_secs(LATEST_SECS * 2);
        assert_eq!(format_http_date(far), "Fri, 31 Dec 9999 23:59:59 GMT");
    }
}
