//! Robust statistics over probe samples: median, quantiles and the five-number summaries
//! (`min`, `p10`, `median`, `p90`, `max`) that the aggregate metrics publish, and their
//! three-number form (`min`, `median`, `max`) for the families with many groups.

/// Quantile `q` in `[0, 1]` of `values` by linear interpolation between closest ranks (the
/// numpy default). `None` for an empty slice; NaNs are ignored.
pub fn quantile(values: &[f64], q: f64) -> Option<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    sorted.sort_by(f64::total_cmp);
    quantile_sorted(&sorted, q)
}

/// [`quantile`] over values already sorted ascending without NaNs.
pub fn quantile_sorted(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let q = q.clamp(0.0, 1.0);
    let pos = q * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    let frac = pos - lo as f64;
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * frac)
}

/// Median of `values` (mean of the two middle values for an even count).
pub fn median(values: &[f64]) -> Option<f64> {
    quantile(values, 0.5)
}

/// The `stat` label values of aggregate metrics, in exposition order.
pub const SUMMARY_STATS: [&str; 5] = ["min", "p10", "median", "p90", "max"];

/// The `stat` label values of the three-number summary ([`Summary::three_number`]).
pub const THREE_NUMBER_STATS: [&str; 3] = ["min", "median", "max"];

/// Five-number summary of a group of cells.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub min: f64,
    pub p10: f64,
    pub median: f64,
    pub p90: f64,
    pub max: f64,
}

impl Summary {
    /// Summary of `values`; `None` when empty.
    pub fn of(values: &[f64]) -> Option<Summary> {
        let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
        sorted.sort_by(f64::total_cmp);
        Summary::of_sorted(&sorted)
    }

    /// [`Summary::of`] values already sorted ascending without NaNs.
    pub fn of_sorted(sorted: &[f64]) -> Option<Summary> {
        Some(Summary {
            min: *sorted.first()?,
            p10: quantile_sorted(sorted, 0.1)?,
            median: quantile_sorted(sorted, 0.5)?,
            p90: quantile_sorted(sorted, 0.9)?,
            max: *sorted.last()?,
        })
    }

    /// `(stat label, value)` pairs in [`SUMMARY_STATS`] order.
    pub fn labelled(&self) -> [(&'static str, f64); 5] {
        [
            ("min", self.min),
            ("p10", self.p10),
            ("median", self.median),
            ("p90", self.p90),
            ("max", self.max),
        ]
    }

    /// `(stat label, value)` pairs of [`THREE_NUMBER_STATS`]: the spread and the middle
    /// without the tails' quantiles, for families with many groups (the NUMA segments).
    pub fn three_number(&self) -> [(&'static str, f64); 3] {
        [
            ("min", self.min),
            ("median", self.median),
            ("max", self.max),
        ]
    }
}

/// `value / reference`, or `None` when the reference is zero or not finite.
pub fn ratio(value: f64, reference: f64) -> Option<f64> {
    if reference.is_finite() && reference > 0.0 && value.is_finite() {
        Some(value / reference)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn quantiles_interpolate_like_numpy() {
        let v: Vec<f64> = (1..=11).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.1), Some(2.0));
        assert_eq!(quantile(&v, 0.9), Some(10.0));
        let w = [10.0, 20.0];
        assert_eq!(quantile(&w, 0.1), Some(11.0));
    }

    #[test]
    fn nans_are_ignored() {
        assert_eq!(median(&[f64::NAN, 5.0, 7.0]), Some(6.0));
        assert_eq!(Summary::of(&[f64::NAN]), None);
    }

    #[test]
    fn summary_of_seed_like_column() {
        let mut v = vec![58.4; 10];
        v.push(0.2);
        let s = Summary::of(&v).unwrap();
        assert_eq!(s.min, 0.2);
        assert_eq!(s.median, 58.4);
        assert_eq!(s.max, 58.4);
        assert!(
            (s.p10 - 58.4).abs() < 1e-9,
            "p10 {} must resist one outlier",
            s.p10
        );
    }

    #[test]
    fn three_number_summary_is_the_five_without_the_tail_quantiles() {
        let s = Summary::of(&[5.0, 1.0, 3.0, 2.0, 4.0]).unwrap();
        let five = s.labelled();
        let three = s.three_number();
        assert_eq!(three.map(|(stat, _)| stat), THREE_NUMBER_STATS);
        for (stat, value) in three {
            assert!(five.contains(&(stat, value)), "{stat}");
        }
        assert_eq!(three, [("min", 1.0), ("median", 3.0), ("max", 5.0)]);
    }

    #[test]
    fn ratio_guards_zero_reference() {
        assert_eq!(ratio(12.7, 58.4).map(|r| (r * 100.0).round()), Some(22.0));
        assert_eq!(ratio(1.0, 0.0), None);
        assert_eq!(ratio(f64::NAN, 1.0), None);
    }
}
