//! How late each unit went out, per stream: the measurement Roadrunner plotted.
//!
//! The lateness of a unit is the time from its scheduled time (its deadline, see
//! [`crate::schedule`]) to the completion of its send, as Roadrunner measured from the start
//! of each period to the end of the UDP write. It is negative when a send completed before
//! its scheduled time, which a correct pacer never does: [`TraceRecord`] keeps the sign so a
//! trace shows it, and [`LatenessStats`] counts such units as `early_units` and records them
//! as 0 in the distribution.
//!
//! [`LatenessStats`] keeps p50/p99/p99.9/max, misses, units and bytes in memory bounded
//! independently of the number of units: a log-linear histogram with 2048 buckets per power
//! of two (every value within 1/2048 of the truth, better than 3 significant digits; exact
//! below 4096 ns), stored sparsely so that 10,000 streams whose lateness stays within a few
//! hundred microseconds cost a few kilobytes each. At most 110,592 buckets can ever exist.
//! (Written here rather than taken from `hdrhistogram` for that sparseness: a dense
//! 3-digit histogram covering an hour is hundreds of kilobytes per stream.)
//!
//! [`TraceRecord`] is one CSV line of `--trace FILE.csv`, written by the driver and read back
//! by `penstock plot`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use crate::schedule::Schedule;
use crate::time::Instant;

/// Sub-bucket bits: each power of two `[2^b, 2^(b+1))` is split into `2^SUB_BITS` buckets.
const SUB_BITS: u32 = 11;
const SUB_COUNT: u64 = 1 << SUB_BITS;

/// The bucket of `v`. Values below `2 · SUB_COUNT` have a bucket each; above, a bucket holds
/// the values sharing their top `SUB_BITS + 1` bits, so its width is below `v / 2^SUB_BITS`.
fn bucket_of(v: u64) -> u32 {
    if v < SUB_COUNT {
        return v as u32; // < 2048: fits.
    }
    let octave = 63 - v.leading_zeros() - SUB_BITS; // floor(log2 v) − SUB_BITS, in 0..=52
    let sub = (v >> octave) - SUB_COUNT; // in 0..SUB_COUNT
    // ≤ 53 · 2048 + 2047: fits.
    ((u64::from(octave) + 1) * SUB_COUNT + sub) as u32
}

/// The highest value that falls in `bucket` (so a percentile is never under-reported).
fn bucket_high(bucket: u32) -> u64 {
    let bucket = u64::from(bucket);
    if bucket < SUB_COUNT {
        return bucket;
    }
    let octave = bucket / SUB_COUNT - 1;
    let low = (bucket % SUB_COUNT + SUB_COUNT) << octave;
    low + ((1u64 << octave) - 1)
}

/// A sparse log-linear histogram of nanoseconds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Histogram {
    counts: BTreeMap<u32, u64>,
    total: u64,
}

impl Histogram {
    fn record(&mut self, v: u64) {
        *self.counts.entry(bucket_of(v)).or_insert(0) += 1;
        self.total += 1;
    }

    fn merge(&mut self, other: &Histogram) {
        for (&b, &n) in &other.counts {
            *self.counts.entry(b).or_insert(0) += n;
        }
        self.total += other.total;
    }

    /// The nearest-rank quantile: the value of rank `ceil(total · per_million / 10^6)`
    /// (at least 1) in sorted order, as its bucket's highest value. 0 when empty.
    fn quantile(&self, per_million: u32) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let per_million = u128::from(per_million.min(1_000_000));
        let rank = (u128::from(self.total) * per_million)
            .div_ceil(1_000_000)
            .max(1);
        let mut seen = 0u128;
        for (&b, &n) in &self.counts {
            seen += u128::from(n);
            if seen >= rank {
                return bucket_high(b);
            }
        }
        unreachable!("rank ≤ total, and the counts sum to total")
    }
}

/// Buckets of a stream's live lateness counts (the driver's `StreamHandle::lateness`, one
/// atomic counter per bucket, so few and fixed): bucket 0 counts units on time (or early),
/// bucket `i` ≥ 1 units later by `[2^(i-1), 2^i)` ns, and the last bucket everything later
/// than `2^(LATENESS_BUCKETS-2)` ns (about 1.07 s) too.
pub const LATENESS_BUCKETS: usize = 32;

/// The live bucket of a lateness of `ns` nanoseconds (see [`LATENESS_BUCKETS`]).
pub fn lateness_bucket(ns: u64) -> usize {
    ((u64::BITS - ns.leading_zeros()) as usize).min(LATENESS_BUCKETS - 1)
}

/// The most lateness, in ns, that live bucket `i` holds: 0 for bucket 0, `2^i - 1` for the
/// others; the last bucket has no upper end and gives its lower one, `2^(LATENESS_BUCKETS-2)`
/// (a figure read as "at least").
pub fn lateness_bucket_high_ns(i: usize) -> u64 {
    match i {
        0 => 0,
        i if i >= LATENESS_BUCKETS - 1 => 1 << (LATENESS_BUCKETS - 2),
        i => (1 << i) - 1,
    }
}

/// From live bucket counts: the lateness at or below which `per_million` parts of a million
/// of the units fall (`500_000`: the median, `990_000`: p99, `1_000_000`: the maximum), as the
/// high end of its bucket ([`lateness_bucket_high_ns`]), so never below the true figure and
/// less than twice it. `None` when nothing was counted.
pub fn lateness_bucket_quantile_ns(
    buckets: &[u64; LATENESS_BUCKETS],
    per_million: u32,
) -> Option<u64> {
    let total: u128 = buckets.iter().map(|&n| u128::from(n)).sum();
    if total == 0 {
        return None;
    }
    // The rank of the unit asked for, 1-based: ceil(q * total), at least 1.
    let q = u128::from(per_million.min(1_000_000));
    let rank = (q * total).div_ceil(1_000_000).max(1);
    let mut seen = 0u128;
    for (i, &n) in buckets.iter().enumerate() {
        seen += u128::from(n);
        if seen >= rank {
            return Some(lateness_bucket_high_ns(i));
        }
    }
    unreachable!("rank ≤ total, and the counts sum to total")
}

/// Lateness statistics of one stream (or, after [`LatenessStats::merge`], of several).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatenessStats {
    miss_after_ns: u64,
    units: u64,
    bytes: u64,
    misses: u64,
    early_units: u64,
    max_ns: u64,
    /// Units a `late=skip` stream dropped for being too late (not in `units`), and their
    /// bytes.
    skipped_units: u64,
    skipped_bytes: u64,
    histogram: Histogram,
}

/// The numbers a summary line or `--json` carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LatenessSummary {
    pub units: u64,
    pub bytes: u64,
    /// Units later than `miss_after_ns`.
    pub misses: u64,
    pub miss_after_ns: u64,
    /// Units whose send completed before their scheduled time (a pacing bug if non-zero).
    pub early_units: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
    /// Units dropped unsent by the late-unit policy `skip` (not counted in `units`).
    pub skipped_units: u64,
    pub skipped_bytes: u64,
}

impl LatenessStats {
    /// Empty statistics that count a unit as a miss when it is later than `miss_after_ns`.
    pub fn new(miss_after_ns: u64) -> LatenessStats {
        LatenessStats {
            miss_after_ns,
            units: 0,
            bytes: 0,
            misses: 0,
            early_units: 0,
            max_ns: 0,
            skipped_units: 0,
            skipped_bytes: 0,
            histogram: Histogram::default(),
        }
    }

    /// Empty statistics for a stream on `schedule`: the miss threshold is `miss_after`
    /// (`--miss-after`) or, by default, one period (rounded up); a burst stream has no
    /// deadlines and so no misses.
    pub fn for_schedule(schedule: &Schedule, miss_after: Option<Duration>) -> LatenessStats {
        let miss_after_ns = match miss_after {
            Some(d) => u64::try_from(d.as_nanos()).unwrap_or(u64::MAX),
            None => schedule.period().map_or(u64::MAX, |p| p.ceil_ns()),
        };
        LatenessStats::new(miss_after_ns)
    }

    /// Records one unit of `bytes`, scheduled at `scheduled`, whose send completed at
    /// `completed`.
    pub fn record(&mut self, scheduled: Instant, completed: Instant, bytes: u64) {
        let lateness_ns = match completed.checked_duration_since(scheduled) {
            Some(d) => d.as_nanos() as u64, // a difference of two u64 nanosecond counts
            None => {
                self.early_units += 1;
                0
            }
        };
        self.units += 1;
        self.bytes = self.bytes.saturating_add(bytes);
        if lateness_ns > self.miss_after_ns {
            self.misses += 1;
        }
        self.max_ns = self.max_ns.max(lateness_ns);
        self.histogram.record(lateness_ns);
    }

    /// Counts `units` units of `bytes` in all that the late-unit policy `skip` dropped unsent
    /// (they are not recorded in the distribution: they had no send).
    pub fn skipped(&mut self, units: u64, bytes: u64) {
        self.skipped_units = self.skipped_units.saturating_add(units);
        self.skipped_bytes = self.skipped_bytes.saturating_add(bytes);
    }

    /// Units dropped unsent by the late-unit policy `skip`.
    pub fn skipped_units(&self) -> u64 {
        self.skipped_units
    }

    /// Bytes of the units dropped unsent.
    pub fn skipped_bytes(&self) -> u64 {
        self.skipped_bytes
    }

    /// Records a unit read back from a trace.
    pub fn record_trace(&mut self, record: &TraceRecord) {
        self.record(record.scheduled, record.completed, record.bytes);
    }

    /// Adds `other`'s units to these. Misses add up as counted, each under the threshold of
    /// the statistics that recorded it; `miss_after_ns` stays this one's.
    pub fn merge(&mut self, other: &LatenessStats) {
        self.units += other.units;
        self.bytes = self.bytes.saturating_add(other.bytes);
        self.misses += other.misses;
        self.early_units += other.early_units;
        self.max_ns = self.max_ns.max(other.max_ns);
        self.skipped_units = self.skipped_units.saturating_add(other.skipped_units);
        self.skipped_bytes = self.skipped_bytes.saturating_add(other.skipped_bytes);
        self.histogram.merge(&other.histogram);
    }

    /// Units recorded.
    pub fn units(&self) -> u64 {
        self.units
    }

    /// Bytes recorded, saturating.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Units later than [`LatenessStats::miss_after_ns`].
    pub fn misses(&self) -> u64 {
        self.misses
    }

    /// The miss threshold.
    pub fn miss_after_ns(&self) -> u64 {
        self.miss_after_ns
    }

    /// Units completed before their scheduled time (recorded as lateness 0).
    pub fn early_units(&self) -> u64 {
        self.early_units
    }

    /// The largest lateness, exactly; 0 when empty.
    pub fn max_ns(&self) -> u64 {
        self.max_ns
    }

    /// The nearest-rank quantile `per_million / 10^6` of lateness (500,000 is the median),
    /// within 1/2048 of the exact value and never below it, never above the max; 0 when
    /// empty.
    pub fn quantile_ns(&self, per_million: u32) -> u64 {
        self.histogram.quantile(per_million).min(self.max_ns)
    }

    /// Median lateness.
    pub fn p50_ns(&self) -> u64 {
        self.quantile_ns(500_000)
    }

    /// 99th percentile lateness.
    pub fn p99_ns(&self) -> u64 {
        self.quantile_ns(990_000)
    }

    /// 99.9th percentile lateness.
    pub fn p999_ns(&self) -> u64 {
        self.quantile_ns(999_000)
    }

    /// All the numbers at once.
    pub fn summary(&self) -> LatenessSummary {
        LatenessSummary {
            units: self.units,
            bytes: self.bytes,
            misses: self.misses,
            miss_after_ns: self.miss_after_ns,
            early_units: self.early_units,
            p50_ns: self.p50_ns(),
            p99_ns: self.p99_ns(),
            p999_ns: self.p999_ns(),
            max_ns: self.max_ns,
            skipped_units: self.skipped_units,
            skipped_bytes: self.skipped_bytes,
        }
    }
}

/// One unit of a trace: a line of `--trace FILE.csv`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRecord {
    /// The stream's id in this run.
    pub stream: u64,
    /// The unit's index in its stream, from 0.
    pub seq: u64,
    /// When the unit was due.
    pub scheduled: Instant,
    /// When its send completed.
    pub completed: Instant,
    pub bytes: u64,
}

/// Why a trace line was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TraceParseError {
    #[error(
        "a trace line has {found} fields; expected 6: {}",
        TraceRecord::CSV_HEADER
    )]
    FieldCount { found: usize },
    #[error("trace column {column}: {value:?} is not a {expected}")]
    Field {
        column: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("trace column lateness_ns is {found}, but completed_ns − scheduled_ns is {computed}")]
    LatenessMismatch { found: i64, computed: i64 },
}

impl TraceRecord {
    /// The header line of a trace file (without a line end).
    pub const CSV_HEADER: &'static str = "stream,seq,scheduled_ns,completed_ns,lateness_ns,bytes";

    /// `completed − scheduled` in nanoseconds: negative when the send completed early.
    /// Saturates at the ends of `i64` (±292 years).
    pub fn lateness_ns(&self) -> i64 {
        let d = self.completed.signed_nanos_since(self.scheduled);
        i64::try_from(d).unwrap_or(if d < 0 { i64::MIN } else { i64::MAX })
    }

    /// `true` for the header line (so a reader can skip it).
    pub fn is_csv_header(line: &str) -> bool {
        line.trim_end_matches(['\r', '\n']) == TraceRecord::CSV_HEADER
    }

    /// The CSV line for this record, without a line end. The lateness column is derived from
    /// the two times, so it is redundant: it is there for people and spreadsheets.
    pub fn to_csv_line(&self) -> String {
        let mut line = String::with_capacity(64);
        // Writing to a String cannot fail.
        let _ = write!(
            line,
            "{},{},{},{},{},{}",
            self.stream,
            self.seq,
            self.scheduled.as_nanos(),
            self.completed.as_nanos(),
            self.lateness_ns(),
            self.bytes
        );
        line
    }

    /// Parses a line written by [`TraceRecord::to_csv_line`] (a trailing `\n` or `\r\n` is
    /// accepted). Refuses a wrong field count, a field that is not a number, and a lateness
    /// column that disagrees with the two times.
    pub fn from_csv_line(line: &str) -> Result<TraceRecord, TraceParseError> {
        let line = line.trim_end_matches(['\r', '\n']);
        let fields: Vec<&str> = line.split(',').collect();
        let [stream, seq, scheduled, completed, lateness, bytes] = fields[..] else {
            return Err(TraceParseError::FieldCount {
                found: fields.len(),
            });
        };
        let record = TraceRecord {
            stream: parse_u64("stream", stream)?,
            seq: parse_u64("seq", seq)?,
            scheduled: Instant::from_nanos(parse_u64("scheduled_ns", scheduled)?),
            completed: Instant::from_nanos(parse_u64("completed_ns", completed)?),
            bytes: parse_u64("bytes", bytes)?,
        };
        let found: i64 = lateness
            .trim()
            .parse()
            .map_err(|_| TraceParseError::Field {
                column: "lateness_ns",
                value: lateness.to_string(),
                expected: "signed integer",
            })?;
        let computed = record.lateness_ns();
        if found != computed {
            return Err(TraceParseError::LatenessMismatch { found, computed });
        }
        Ok(record)
    }
}

fn parse_u64(column: &'static str, value: &str) -> Result<u64, TraceParseError> {
    let v = value.trim();
    // `u64::from_str` accepts a leading '+'; a trace never has one.
    if v.starts_with('+') {
        return Err(TraceParseError::Field {
            column,
            value: value.to_string(),
            expected: "non-negative integer",
        });
    }
    v.parse().map_err(|_| TraceParseError::Field {
        column,
        value: value.to_string(),
        expected: "non-negative integer",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{ScheduleLimits, ScheduleSpec};
    use proptest::prelude::*;

    fn at(ns: u64) -> Instant {
        Instant::from_nanos(ns)
    }

    #[test]
    fn quantiles_of_live_buckets_are_their_buckets_high_ends() {
        let mut b = [0u64; LATENESS_BUCKETS];
        assert_eq!(lateness_bucket_quantile_ns(&b, 500_000), None);
        // 98 units on time, one 1000 ns late, one 2 ms late.
        b[0] = 98;
        b[lateness_bucket(1000)] += 1;
        b[lateness_bucket(2_000_000)] += 1;
        assert_eq!(lateness_bucket_quantile_ns(&b, 500_000), Some(0));
        assert_eq!(lateness_bucket_quantile_ns(&b, 980_000), Some(0));
        assert_eq!(lateness_bucket_quantile_ns(&b, 990_000), Some(1023));
        let max = lateness_bucket_quantile_ns(&b, 1_000_000).unwrap();
        assert!((2_000_000..4_000_000).contains(&max), "{max}");
        // Each figure bounds the lateness it stands for from above, within a factor of two.
        for ns in [1u64, 2, 3, 1000, 123_456, (1 << 29) + 5] {
            let high = lateness_bucket_high_ns(lateness_bucket(ns));
            assert!(high >= ns && high < 2 * ns.max(1), "{ns}: {high}");
        }
        // The open-ended last bucket gives its lower end.
        let mut late = [0u64; LATENESS_BUCKETS];
        late[lateness_bucket(u64::MAX)] = 1;
        assert_eq!(lateness_bucket_quantile_ns(&late, 1_000_000), Some(1 << 30));
        assert_eq!(lateness_bucket_quantile_ns(&late, 0), Some(1 << 30));
    }

    #[test]
    fn lateness_bucket_is_the_power_of_two_above_and_the_last_takes_the_rest() {
        assert_eq!(lateness_bucket(0), 0);
        for i in 1..LATENESS_BUCKETS - 1 {
            let low = 1u64 << (i - 1);
            let high = (1u64 << i) - 1;
            assert_eq!(
                (lateness_bucket(low), lateness_bucket(high)),
                (i, i),
                "bucket {i}"
            );
        }
        let last = LATENESS_BUCKETS - 1;
        assert_eq!(lateness_bucket(1 << (LATENESS_BUCKETS - 2)), last);
        assert_eq!(lateness_bucket((1 << (LATENESS_BUCKETS - 2)) - 1), last - 1);
        assert_eq!(lateness_bucket(u64::MAX), last);
    }

    #[test]
    fn buckets_are_exact_then_within_1_in_2048() {
        for v in [0, 1, 2047, 2048, 4095] {
            assert_eq!(bucket_high(bucket_of(v)), v);
        }
        for v in [
            4096u64,
            4097,
            10_000,
            1 << 20,
            123_456_789,
            u64::MAX / 3,
            u64::MAX,
        ] {
            let high = bucket_high(bucket_of(v));
            assert!(high >= v && high - v <= v >> SUB_BITS, "{v} → {high}");
            assert_eq!(bucket_of(high), bucket_of(v));
        }
        assert_eq!(bucket_of(u64::MAX), 54 * 2048 - 1);
    }

    #[test]
    fn counts_misses_units_bytes_and_early_units() {
        let mut s = LatenessStats::new(1_000);
        s.record(at(100), at(100), 1024); // on time
        s.record(at(100), at(600), 1024); // 500 ns late
        s.record(at(100), at(1_100), 1024); // exactly at the threshold: not a miss
        s.record(at(100), at(1_101), 1024); // a miss
        s.record(at(100), at(50), 300); // early: lateness 0 for the statistics
        assert_eq!(s.units(), 5);
        assert_eq!(s.bytes(), 4 * 1024 + 300);
        assert_eq!(s.misses(), 1);
        assert_eq!(s.early_units(), 1);
        assert_eq!(s.max_ns(), 1_001);
        assert_eq!(s.p50_ns(), 500);
        assert_eq!(s.p99_ns(), 1_001);
        let sum = s.summary();
        assert_eq!(
            (sum.units, sum.misses, sum.p999_ns, sum.max_ns),
            (5, 1, 1_001, 1_001)
        );
        assert_eq!(LatenessStats::new(1).p99_ns(), 0);
    }

    #[test]
    fn default_miss_threshold_is_one_period() {
        let limits = ScheduleLimits::new(4096);
        let spec = ScheduleSpec::Rate {
            rate: crate::units::Rate::UnitsPerSecond { num: 30, den: 1 },
            unit_bytes: 1024,
        };
        let schedule = Schedule::new(&spec, &limits).unwrap();
        assert_eq!(
            LatenessStats::for_schedule(&schedule, None).miss_after_ns(),
            33_333_334
        );
        let ms = Some(Duration::from_millis(1));
        assert_eq!(
            LatenessStats::for_schedule(&schedule, ms).miss_after_ns(),
            1_000_000
        );
        let burst = Schedule::new(&ScheduleSpec::Burst { unit_bytes: 1 }, &limits).unwrap();
        assert_eq!(
            LatenessStats::for_schedule(&burst, None).miss_after_ns(),
            u64::MAX
        );
    }

    #[test]
    fn csv_lines() {
        let r = TraceRecord {
            stream: 3,
            seq: 7,
            scheduled: at(1_000),
            completed: at(900),
            bytes: 1024,
        };
        assert_eq!(r.lateness_ns(), -100);
        let line = r.to_csv_line();
        assert_eq!(line, "3,7,1000,900,-100,1024");
        assert_eq!(TraceRecord::from_csv_line(&line), Ok(r));
        assert_eq!(
            TraceRecord::from_csv_line("3,7,1000,900,-100,1024\r\n"),
            Ok(r)
        );
        assert!(TraceRecord::is_csv_header(
            "stream,seq,scheduled_ns,completed_ns,lateness_ns,bytes\n"
        ));
        assert_eq!(
            TraceRecord::from_csv_line("1,2,3"),
            Err(TraceParseError::FieldCount { found: 3 })
        );
        assert!(matches!(
            TraceRecord::from_csv_line("1,2,x,4,1,5"),
            Err(TraceParseError::Field {
                column: "scheduled_ns",
                ..
            })
        ));
        assert!(matches!(
            TraceRecord::from_csv_line("1,+2,3,4,1,5"),
            Err(TraceParseError::Field { column: "seq", .. })
        ));
        assert_eq!(
            TraceRecord::from_csv_line("1,2,3,4,5,6"),
            Err(TraceParseError::LatenessMismatch {
                found: 5,
                computed: 1
            })
        );
        assert!(TraceRecord::from_csv_line(TraceRecord::CSV_HEADER).is_err());
        let msg = TraceRecord::from_csv_line("1").unwrap_err().to_string();
        assert!(msg.contains(TraceRecord::CSV_HEADER), "{msg}");
    }

    /// The exact nearest-rank quantile of `sorted`.
    fn model_quantile(sorted: &[u64], per_million: u32) -> u64 {
        let rank = (sorted.len() as u128 * u128::from(per_million))
            .div_ceil(1_000_000)
            .max(1);
        sorted[rank as usize - 1]
    }

    fn lateness_values() -> impl Strategy<Value = Vec<u64>> {
        prop::collection::vec(
            prop_oneof![
                0u64..5_000,
                0u64..1_000_000,
                0u64..10_000_000_000,
                any::<u64>()
            ],
            1..2_000,
        )
    }

    proptest! {
        /// Percentiles match a sorted-vector model within the histogram's precision (never
        /// below the exact value, above it by at most 1/2048 of it), max and counts exactly.
        #[test]
        fn percentiles_match_a_sorted_model(values in lateness_values(), per_million in 0u32..=1_000_000) {
            let mut stats = LatenessStats::new(1_000_000);
            for &v in &values {
                stats.record(at(0), at(v), 1);
            }
            let mut sorted = values.clone();
            sorted.sort_unstable();
            for q in [per_million, 500_000, 990_000, 999_000, 1_000_000] {
                let exact = model_quantile(&sorted, q);
                let got = stats.quantile_ns(q);
                prop_assert!(got >= exact && got - exact <= exact >> SUB_BITS, "q {} exact {} got {}", q, exact, got);
            }
            prop_assert_eq!(stats.max_ns(), *sorted.last().unwrap());
            prop_assert_eq!(stats.units(), values.len() as u64);
            prop_assert_eq!(stats.misses(), values.iter().filter(|&&v| v > 1_000_000).count() as u64);
        }

        /// Merging per-stream statistics equals recording every unit into one.
        #[test]
        fn merge_equals_recording_together(a in lateness_values(), b in lateness_values()) {
            let mut sa = LatenessStats::new(500);
            let mut sb = LatenessStats::new(500);
            let mut all = LatenessStats::new(500);
            for &v in &a { sa.record(at(1), at(1 + v / 2), 7); all.record(at(1), at(1 + v / 2), 7); }
            for &v in &b { sb.record(at(1), at(1 + v / 2), 9); all.record(at(1), at(1 + v / 2), 9); }
            sa.merge(&sb);
            prop_assert_eq!(sa, all);
        }

        /// Every record survives a CSV round trip, negative lateness included.
        #[test]
        fn csv_round_trips(stream: u64, seq: u64, scheduled: u64, completed: u64, bytes: u64) {
            let r = TraceRecord { stream, seq, scheduled: at(scheduled), completed: at(completed), bytes };
            prop_assert_eq!(TraceRecord::from_csv_line(&r.to_csv_line()), Ok(r));
        }
    }
}
