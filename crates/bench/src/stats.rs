//! Order statistics of the benchmarks' samples.

/// The median: the middle sample, the upper of the two middle ones for an even count; NaN
/// for no samples.
pub(crate) fn median(v: &[f64]) -> f64 {
    sorted(v).get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The `per_cent` percentile by nearest rank (the smallest sample with at least that share of
/// the samples at or below it); NaN for no samples.
pub(crate) fn percentile(v: &[f64], per_cent: usize) -> f64 {
    let i = (v.len() * per_cent).div_ceil(100).saturating_sub(1);
    sorted(v).get(i).copied().unwrap_or(f64::NAN)
}

fn sorted(v: &[f64]) -> Vec<f64> {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_percentile_by_nearest_rank() {
        assert!(median(&[]).is_nan());
        assert!(percentile(&[], 99).is_nan());
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 3.0);
        let v: Vec<f64> = (1..=200).rev().map(f64::from).collect();
        assert_eq!(percentile(&v, 99), 198.0);
        assert_eq!(percentile(&v, 100), 200.0);
        assert_eq!(percentile(&[5.0], 99), 5.0);
    }
}
