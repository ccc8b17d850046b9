//! Size curves (`chd probe sweep`): for each operation and device, every size's median and
//! spread, the points to re-measure, the dips and the plateau. The definitions are here once;
//! `sweep.csv`, `sweep.png`, `summary.md` and the findings all read them from a [`Curve`].
//!
//! - **Spread** of a point: `(max - min) / median` of its samples ([`spread`]); a point whose
//!   spread is above [`REMEASURE_SPREAD`] is flagged "re-measure" (its samples disagree too
//!   much for its median to be trusted).
//! - **Dip**: a measured point below [`DIP_RATIO`] x the lower of the best point at smaller
//!   sizes and the best point at larger sizes: the curve is well above it on both sides. Two
//!   adjacent low points (32 and 64 MiB both reading 3 GB/s on a 27 GB/s curve) are both
//!   dips; the first and the last size never are.
//! - **Plateau**: the smallest size from which every measured point that is not a dip stays
//!   within [`PLATEAU_BAND`] of the curve's maximum (the maximum over those points); none
//!   when the largest size is already below that band (the curve falls at its end).
//! - **Setting**: what a curve was measured under (a load profile, `HCCL_BUFFSIZE=32`); one
//!   operation's curves on one device under several settings are compared size by size
//!   ([`setting_differences`]): each setting's difference from the baseline (the
//!   [`BASELINES`] setting, else the first), and whether it exceeds the points' spread (the
//!   larger of the two points' own spreads; for points of one sample, the larger of the two
//!   curves' plateau scatter, (max - min) / median over the plateau's points).
//! - **Implausible**: a point whose median is above its path's limit
//!   ([`super::limits::PathLimits`]): a measurement fault, flagged with the limit beside it
//!   and left out of the maximum, the plateau, the dips' neighbours and the setting
//!   comparisons.
//! - **Large-size plateau**: the smallest size from which every steady point (not a dip, not
//!   implausible) stays within [`PLATEAU_BAND`] of the maximum of those points; it needs two
//!   points at least.
//! - **Cache-resident**: a run of two or more adjacent steady points before the large-size
//!   plateau, each above [`CACHE_RESIDENT_RATIO`] x the large-size plateau's median: the
//!   copies stayed in a cache (CPU caches on the host backend, an on-chip cache on a device)
//!   and measure it, not the path. A curve with a cache-resident region has the large-size
//!   plateau as its plateau, and its maximum leaves the region out.
//! - **Matrix sizes**: the sizes a matrix should use, from the plateau on, outside
//!   cache-resident sizes, dips and implausible points ([`Curve::matrix_sizes`]).

use std::collections::BTreeMap;

use super::limits::{PathLimit, PathLimits};
use crate::stats;
use crate::topology::natural::natural_key;

/// A point whose spread is above this is flagged to be re-measured.
pub const REMEASURE_SPREAD: f64 = 0.10;
/// The plateau: within this fraction of the curve's maximum.
pub const PLATEAU_BAND: f64 = 0.05;
/// A dip: below this fraction of the curve on both sides.
pub const DIP_RATIO: f64 = 0.8;
/// Cache-resident: above this multiple of the large-size plateau.
pub const CACHE_RESIDENT_RATIO: f64 = 1.5;
/// The start of the message of a failure whose reason is `unsupported`
/// (`runtime::ProbeError::Unsupported`'s text).
const UNSUPPORTED_PREFIX: &str = "not supported:";

/// `(max - min) / median` of `samples`; none with fewer than two samples or a median that is
/// not positive.
pub fn spread(samples: &[f64]) -> Option<f64> {
    if samples.len() < 2 {
        return None;
    }
    let median = stats::median(samples).filter(|m| *m > 0.0)?;
    let max = samples.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let min = samples.iter().copied().fold(f64::INFINITY, f64::min);
    Some((max - min) / median)
}

/// Whether a failure's message says the backend cannot do the operation at all.
pub fn is_unsupported(error: &str) -> bool {
    error.starts_with(UNSUPPORTED_PREFIX)
}

/// The settings a comparison is made against, when a curve has one of them.
pub const BASELINES: [&str; 3] = ["idle", "HCCL_BUFFSIZE unset", ""];

/// One measured size of one curve, as a report's dataset or a test holds it.
#[derive(Debug, Clone, Copy)]
pub struct PointInput<'a> {
    /// `h2d`, `d2h`, `d2d`, `allgather`.
    pub op: &'a str,
    pub device: &'a str,
    /// What the point was measured under: a load profile (`idle`), `HCCL_BUFFSIZE=32`.
    pub setting: &'a str,
    pub size_bytes: u64,
    /// Bytes per second of each successful sample.
    pub samples: &'a [f64],
    /// Each failed sample's message.
    pub errors: &'a [String],
}

/// One size of a curve.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub size_bytes: u64,
    /// Median bytes per second; none when no sample succeeded.
    pub median: Option<f64>,
    /// See [`spread`].
    pub spread: Option<f64>,
    pub samples: usize,
    pub failed: usize,
    pub last_error: Option<String>,
    /// Every sample failed because the backend cannot do the operation.
    pub unsupported: bool,
    /// The spread is above [`REMEASURE_SPREAD`].
    pub remeasure: bool,
    /// See the module's definition.
    pub dip: bool,
    /// The limit of the point's path, when its median is above it (see the module's
    /// definition).
    pub implausible: Option<PathLimit>,
    /// In a cache-resident region (see the module's definition).
    pub cache_resident: bool,
}

impl Point {
    /// Measured, not a dip, not implausible: what a maximum and a plateau are made of.
    fn steady(&self) -> Option<f64> {
        self.median
            .filter(|_| !self.dip && self.implausible.is_none())
    }
}

/// One operation's curve on one device, sizes ascending.
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    pub op: String,
    pub device: String,
    /// See [`PointInput::setting`].
    pub setting: String,
    pub points: Vec<Point>,
    /// Highest median among the steady points (not dips, not implausible), cache-resident
    /// points aside.
    pub max: Option<f64>,
    /// See the module's definition; the large-size plateau when the curve has a
    /// cache-resident region.
    pub plateau: Option<u64>,
}

impl Curve {
    /// The device, with the setting when it is not a baseline: `8 (HCCL_BUFFSIZE=32)`.
    pub fn label(&self) -> String {
        if BASELINES.contains(&self.setting.as_str()) {
            self.device.clone()
        } else {
            format!("{} ({})", self.device, self.setting)
        }
    }

    /// (max - min) / median of the plateau's points (dips aside); none with fewer than two.
    pub fn plateau_scatter(&self) -> Option<f64> {
        let from = self.plateau?;
        let values: Vec<f64> = self
            .points
            .iter()
            .filter(|p| p.size_bytes >= from && !p.dip)
            .filter_map(|p| p.median)
            .collect();
        spread(&values)
    }

    /// Every point failed, and each as unsupported: the backend cannot do this operation.
    pub fn unsupported(&self) -> bool {
        !self.points.is_empty() && self.points.iter().all(|p| p.unsupported)
    }

    pub fn dips(&self) -> impl Iterator<Item = &Point> {
        self.points.iter().filter(|p| p.dip)
    }

    /// Points above their path's limit.
    pub fn implausible(&self) -> impl Iterator<Item = &Point> {
        self.points.iter().filter(|p| p.implausible.is_some())
    }

    /// Points in a cache-resident region.
    pub fn cache_resident(&self) -> impl Iterator<Item = &Point> {
        self.points.iter().filter(|p| p.cache_resident)
    }

    /// Median of the plateau's steady points.
    pub fn plateau_level(&self) -> Option<f64> {
        let from = self.plateau?;
        let values: Vec<f64> = self
            .points
            .iter()
            .filter(|p| p.size_bytes >= from)
            .filter_map(Point::steady)
            .collect();
        stats::median(&values)
    }

    /// The sizes a matrix should use: measured from the plateau on, none of them a dip,
    /// implausible or cache-resident. Empty without a plateau.
    pub fn matrix_sizes(&self) -> Vec<u64> {
        let Some(from) = self.plateau else {
            return Vec::new();
        };
        self.points
            .iter()
            .filter(|p| p.size_bytes >= from && !p.cache_resident)
            .filter(|p| p.steady().is_some())
            .map(|p| p.size_bytes)
            .collect()
    }

    pub fn to_remeasure(&self) -> impl Iterator<Item = &Point> {
        self.points.iter().filter(|p| p.remeasure)
    }

    /// Points without a value that failed for another reason than `unsupported`.
    pub fn failed(&self) -> impl Iterator<Item = &Point> {
        self.points
            .iter()
            .filter(|p| p.median.is_none() && !p.unsupported)
    }

    /// The measured neighbours of the point at `size_bytes`: the best medians at smaller and
    /// at larger sizes (what a dip is compared with).
    pub fn around(&self, size_bytes: u64) -> (Option<f64>, Option<f64>) {
        let best = |it: &mut dyn Iterator<Item = &Point>| {
            it.filter(|p| p.implausible.is_none())
                .filter_map(|p| p.median)
                .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
        };
        (
            best(&mut self.points.iter().filter(|p| p.size_bytes < size_bytes)),
            best(&mut self.points.iter().filter(|p| p.size_bytes > size_bytes)),
        )
    }
}

/// Rank of an operation in the report's order.
fn op_rank(op: &str) -> usize {
    ["h2d", "d2h", "d2d", "allgather"]
        .iter()
        .position(|o| *o == op)
        .unwrap_or(usize::MAX)
}

/// The curves of `points`, by operation (h2d, d2h, d2d, allgather, then others by name) and
/// device (natural order). Points of one (operation, device, size) are merged.
pub fn curves(points: &[PointInput]) -> Vec<Curve> {
    curves_within(points, &PathLimits::default())
}

/// [`curves`], each point judged against its path's limit in `limits`.
pub fn curves_within(points: &[PointInput], limits: &PathLimits) -> Vec<Curve> {
    /// (operation rank, operation, device, setting).
    type Key<'a> = (usize, &'a str, &'a str, &'a str);
    /// Size -> (samples, failure messages).
    type Sizes<'a> = BTreeMap<u64, (Vec<f64>, Vec<&'a String>)>;
    let mut grouped: BTreeMap<Key, Sizes> = BTreeMap::new();
    for p in points {
        let e = grouped
            .entry((op_rank(p.op), p.op, p.device, p.setting))
            .or_default()
            .entry(p.size_bytes)
            .or_default();
        e.0.extend_from_slice(p.samples);
        e.1.extend(p.errors.iter());
    }
    let mut out: Vec<Curve> = grouped
        .into_iter()
        .map(|((_, op, device, setting), sizes)| {
            let points = sizes
                .into_iter()
                .map(|(size_bytes, (samples, errors))| {
                    let spread = spread(&samples);
                    let median = stats::median(&samples);
                    Point {
                        size_bytes,
                        median,
                        spread,
                        samples: samples.len(),
                        failed: errors.len(),
                        last_error: errors.last().map(|e| e.to_string()),
                        unsupported: samples.is_empty()
                            && !errors.is_empty()
                            && errors.iter().all(|e| is_unsupported(e)),
                        remeasure: spread.is_some_and(|s| s > REMEASURE_SPREAD),
                        dip: false,
                        implausible: median.and_then(|m| limits.exceeded(device, op, m)).cloned(),
                        cache_resident: false,
                    }
                })
                .collect();
            let mut c = shape(op, device, points);
            c.setting = setting.to_string();
            c
        })
        .collect();
    fn baseline_first(c: &Curve) -> (bool, crate::topology::natural::NaturalKey<'_>) {
        (
            !BASELINES.contains(&c.setting.as_str()),
            natural_key(&c.setting),
        )
    }
    out.sort_by(|a, b| {
        (
            op_rank(&a.op),
            &a.op,
            natural_key(&a.device),
            baseline_first(a),
        )
            .cmp(&(
                op_rank(&b.op),
                &b.op,
                natural_key(&b.device),
                baseline_first(b),
            ))
    });
    out
}

/// One size of one curve against the same size of the baseline curve.
#[derive(Debug, Clone, PartialEq)]
pub struct SettingDifference {
    pub size_bytes: u64,
    /// Bytes per second: the baseline's and the setting's.
    pub baseline: f64,
    pub value: f64,
    /// `(value - baseline) / baseline`.
    pub difference: f64,
    /// The spread the difference is judged against; none when neither the points nor the
    /// curves give one.
    pub spread: Option<f64>,
}

impl SettingDifference {
    /// Whether the difference is larger than the spread (none when there is no spread).
    pub fn exceeds_spread(&self) -> Option<bool> {
        self.spread.map(|s| self.difference.abs() > s)
    }
}

/// One operation on one device under two settings, size by size.
#[derive(Debug, Clone, PartialEq)]
pub struct SettingComparison {
    pub op: String,
    pub device: String,
    pub baseline: String,
    pub setting: String,
    /// The sizes both curves measured.
    pub sizes: Vec<SettingDifference>,
}

/// Every (operation, device) with curves under several settings: each other setting against
/// the baseline (the first curve, which [`curves`] orders to be a [`BASELINES`] setting when
/// there is one).
pub fn setting_differences(curves: &[Curve]) -> Vec<SettingComparison> {
    let mut out = Vec::new();
    for (i, base) in curves.iter().enumerate() {
        let first = curves[..i].iter().all(|c| {
            (c.op.as_str(), c.device.as_str()) != (base.op.as_str(), base.device.as_str())
        });
        if !first {
            continue;
        }
        for other in curves[i + 1..]
            .iter()
            .filter(|c| c.op == base.op && c.device == base.device)
        {
            let scatter = match (base.plateau_scatter(), other.plateau_scatter()) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
            let sizes = base
                .points
                .iter()
                .filter_map(|p| {
                    let q = other.points.iter().find(|q| q.size_bytes == p.size_bytes)?;
                    if p.implausible.is_some() || q.implausible.is_some() {
                        return None;
                    }
                    let (b, v) = (p.median.filter(|b| *b > 0.0)?, q.median?);
                    let spread = match (p.spread, q.spread) {
                        (Some(a), Some(b)) => Some(a.max(b)),
                        _ => scatter,
                    };
                    Some(SettingDifference {
                        size_bytes: p.size_bytes,
                        baseline: b,
                        value: v,
                        difference: (v - b) / b,
                        spread,
                    })
                })
                .collect();
            out.push(SettingComparison {
                op: base.op.clone(),
                device: base.device.clone(),
                baseline: base.setting.clone(),
                setting: other.setting.clone(),
                sizes,
            });
        }
    }
    out
}

/// Mark the dips and the cache-resident region, find the maximum and the plateau of points
/// sorted by size.
fn shape(op: &str, device: &str, mut points: Vec<Point>) -> Curve {
    let medians: Vec<Option<f64>> = points
        .iter()
        .map(|p| p.median.filter(|_| p.implausible.is_none()))
        .collect();
    let best = |range: &[Option<f64>]| {
        range
            .iter()
            .flatten()
            .copied()
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
    };
    for (i, p) in points.iter_mut().enumerate() {
        let Some(v) = medians[i] else { continue };
        if let (Some(before), Some(after)) = (best(&medians[..i]), best(&medians[i + 1..])) {
            p.dip = v < DIP_RATIO * before.min(after);
        }
    }
    mark_cache_resident(&mut points);
    let steady: Vec<(u64, f64)> = points
        .iter()
        .filter(|p| !p.cache_resident)
        .filter_map(|p| p.steady().map(|m| (p.size_bytes, m)))
        .collect();
    let max = steady
        .iter()
        .map(|s| s.1)
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
    let plateau = if points.iter().any(|p| p.cache_resident) {
        large_plateau(&points).map(|(size, _)| size)
    } else {
        max.and_then(|max| {
            let floor = (1.0 - PLATEAU_BAND) * max;
            steady
                .iter()
                .rev()
                .take_while(|(_, v)| *v >= floor)
                .last()
                .map(|(size, _)| *size)
        })
    };
    Curve {
        op: op.to_string(),
        device: device.to_string(),
        setting: String::new(),
        points,
        max,
        plateau,
    }
}

/// The large-size plateau of `points` (see the module's definition): its first size and the
/// median of its points; none with fewer than two steady points in it.
fn large_plateau(points: &[Point]) -> Option<(u64, f64)> {
    let steady: Vec<(u64, f64)> = points
        .iter()
        .filter_map(|p| p.steady().map(|m| (p.size_bytes, m)))
        .collect();
    let (mut hi, mut lo) = (f64::NEG_INFINITY, f64::INFINITY);
    let mut taken = 0;
    for (_, v) in steady.iter().rev() {
        let (h, l) = (hi.max(*v), lo.min(*v));
        if l < (1.0 - PLATEAU_BAND) * h {
            break;
        }
        (hi, lo, taken) = (h, l, taken + 1);
    }
    if taken < 2 {
        return None;
    }
    let tail = &steady[steady.len() - taken..];
    let values: Vec<f64> = tail.iter().map(|t| t.1).collect();
    Some((tail[0].0, stats::median(&values)?))
}

/// Mark every run of two or more adjacent steady points before the large-size plateau that
/// are each above [`CACHE_RESIDENT_RATIO`] x its median.
fn mark_cache_resident(points: &mut [Point]) {
    let Some((from, level)) = large_plateau(points) else {
        return;
    };
    let above: Vec<bool> = points
        .iter()
        .map(|p| {
            p.size_bytes < from && p.steady().is_some_and(|v| v > CACHE_RESIDENT_RATIO * level)
        })
        .collect();
    let mut i = 0;
    while i < points.len() {
        let run = above[i..].iter().take_while(|a| **a).count();
        if run >= 2 {
            for p in &mut points[i..i + run] {
                p.cache_resident = true;
            }
        }
        i += run.max(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn input<'a>(
        op: &'a str,
        device: &'a str,
        size_bytes: u64,
        samples: &'a [f64],
        errors: &'a [String],
    ) -> PointInput<'a> {
        PointInput {
            op,
            device,
            setting: "idle",
            size_bytes,
            samples,
            errors,
        }
    }

    #[test]
    fn spread_is_the_range_over_the_median() {
        assert_eq!(spread(&[9.0, 10.0, 11.0]), Some(0.2));
        assert_eq!(spread(&[10.0, 10.0]), Some(0.0));
        assert_eq!(spread(&[10.0]), None);
        assert_eq!(spread(&[]), None);
        assert_eq!(spread(&[0.0, 0.0]), None);
    }

    #[test]
    fn a_knee_a_plateau_and_two_adjacent_dips() {
        // 1..256 MiB: rising to a plateau from 64 MiB (26, 27, 27 GB/s), with 16 and 32 MiB
        // reading 2.8 and 3.2 (the A3 node, smaller).
        let values = [4.0, 8.0, 14.0, 20.0, 2.8, 3.2, 26.0, 27.0, 27.0];
        let samples: Vec<Vec<f64>> = values.iter().map(|v| vec![v * 1e9; 3]).collect();
        let points: Vec<PointInput> = samples
            .iter()
            .enumerate()
            .map(|(i, s)| input("h2d", "0", MIB << i, s, &[]))
            .collect();
        let c = &curves(&points)[0];
        let dips: Vec<u64> = c.dips().map(|p| p.size_bytes).collect();
        assert_eq!(dips, [16 * MIB, 32 * MIB]);
        assert_eq!(c.max, Some(27e9));
        // 26 >= 0.95 x 27 = 25.65; 20 is not.
        assert_eq!(c.plateau, Some(64 * MIB));
        assert_eq!(c.around(16 * MIB), (Some(20e9), Some(27e9)));
        assert_eq!(c.to_remeasure().count(), 0);
    }

    #[test]
    fn a_monotone_curve_has_no_dip_and_a_falling_end_no_plateau() {
        let rising: Vec<Vec<f64>> = [1.0, 2.0, 4.0, 8.0].iter().map(|v| vec![*v]).collect();
        let points: Vec<PointInput> = rising
            .iter()
            .enumerate()
            .map(|(i, s)| input("d2d", "1", MIB << i, s, &[]))
            .collect();
        let c = &curves(&points)[0];
        assert_eq!(c.dips().count(), 0);
        assert_eq!(c.plateau, Some(8 * MIB));
        // The last point is far below the maximum: the curve has no plateau, and the last
        // size is not a dip (nothing after it).
        let falling: Vec<Vec<f64>> = [4.0, 8.0, 2.0].iter().map(|v| vec![*v]).collect();
        let points: Vec<PointInput> = falling
            .iter()
            .enumerate()
            .map(|(i, s)| input("d2d", "1", MIB << i, s, &[]))
            .collect();
        let c = &curves(&points)[0];
        assert_eq!(c.dips().count(), 0);
        assert_eq!(c.plateau, None);
    }

    fn gbps_curve(values: &[f64]) -> Vec<Vec<f64>> {
        values.iter().map(|v| vec![v * 1e9; 3]).collect()
    }

    #[test]
    fn cpu_caches_are_a_cache_resident_region_and_memory_the_plateau() {
        // The 2-core VM: ~57 GB/s at 128-256 KiB, a dip at 512 KiB, ~11 GB/s from
        // 32 MiB. Before, the plateau was none (the maximum was the cache).
        const KIB: u64 = 1 << 10;
        let values = [
            56.0, 57.0, 9.0, 30.0, 15.0, 14.0, 12.5, 12.0, 11.6, 11.0, 11.2, 11.1, 10.9, 11.0,
        ];
        let samples = gbps_curve(&values);
        let points: Vec<PointInput> = samples
            .iter()
            .enumerate()
            .map(|(i, s)| input("h2d", "numa0", (128 * KIB) << i, s, &[]))
            .collect();
        let c = &curves(&points)[0];
        let cached: Vec<u64> = c.cache_resident().map(|p| p.size_bytes).collect();
        assert_eq!(cached, [128 * KIB, 256 * KIB]);
        assert_eq!(
            c.dips().map(|p| p.size_bytes).collect::<Vec<_>>(),
            [512 * KIB]
        );
        // From 64 MiB every point is within 5 % of the largest of them (11.2); 11.6 at 32 MiB
        // is not (10.9 < 0.95 x 11.6).
        assert_eq!(c.plateau, Some(64 * MIB));
        assert!((c.plateau_level().unwrap() - 11.0e9).abs() < 1e-3);
        // The maximum leaves the cache out: 30 GB/s at 1 MiB (above 1.5 x 11, but alone
        // between a dip and 15 GB/s, so not a region of two).
        assert_eq!(c.max, Some(30e9));
        assert_eq!(
            c.matrix_sizes(),
            [64 * MIB, 128 * MIB, 256 * MIB, 512 * MIB, 1024 * MIB]
        );
        // A curve without a region keeps the old plateau rule.
        assert!(curves(&points[5..])[0].cache_resident().next().is_none());
    }

    #[test]
    fn implausible_points_are_flagged_and_left_out_of_max_and_plateau() {
        use crate::analysis::limits::{DeviceFacts, MemoryBus};
        // The engineers' A3 sweep: same-device D2D 1.3-2.2 TB/s at 16-64 MiB, ~600 GB/s from
        // 128 MiB, on a device whose memory gives 1.6 TB/s (a copy: 0.8 TB/s).
        let values = [300.0, 500.0, 1300.0, 2200.0, 1800.0, 600.0, 610.0, 605.0];
        let samples = gbps_curve(&values);
        let points: Vec<PointInput> = samples
            .iter()
            .enumerate()
            .map(|(i, s)| input("d2d", "0", (4 * MIB) << i, s, &[]))
            .collect();
        let limits = PathLimits::build(
            &[DeviceFacts {
                device: "0".into(),
                memory: Some(MemoryBus {
                    bus_width_bits: 4096,
                    max_clock_mhz: 1600,
                }),
                ..DeviceFacts::default()
            }],
            &BTreeMap::new(),
        );
        let c = &curves_within(&points, &limits)[0];
        let flagged: Vec<u64> = c.implausible().map(|p| p.size_bytes).collect();
        assert_eq!(flagged, [16 * MIB, 32 * MIB, 64 * MIB]);
        let limit = c.points[3].implausible.as_ref().unwrap();
        assert!((limit.bytes_per_second - 819.2e9).abs() < 1.0);
        assert_eq!(c.max, Some(610e9));
        assert_eq!(c.plateau, Some(128 * MIB));
        assert_eq!(c.dips().count(), 0);
        assert_eq!(c.matrix_sizes(), [128 * MIB, 256 * MIB, 512 * MIB]);
        // Without a limit the shape rule alone names the region cache-resident.
        let c = &curves(&points)[0];
        assert_eq!(c.implausible().count(), 0);
        let cached: Vec<u64> = c.cache_resident().map(|p| p.size_bytes).collect();
        assert_eq!(cached, [16 * MIB, 32 * MIB, 64 * MIB]);
        assert_eq!(c.plateau, Some(128 * MIB));
        assert_eq!(c.max, Some(610e9));
    }

    #[test]
    fn wide_points_are_flagged_and_failures_told_apart() {
        let wide = [8e9, 10e9, 12e9];
        let tight = [10e9, 10.2e9];
        let unsupported =
            vec![crate::runtime::ProbeError::Unsupported("no d2d".into()).to_string()];
        let copy = vec!["copy failed: boom".to_string()];
        let c = curves(&[
            input("h2d", "0", MIB, &wide, &[]),
            input("h2d", "0", 2 * MIB, &tight, &[]),
            input("h2d", "0", 4 * MIB, &[], &copy),
            input("d2d", "0", MIB, &[], &unsupported),
            input("d2d", "0", 2 * MIB, &[], &unsupported),
        ]);
        assert_eq!(c.len(), 2);
        let (h2d, d2d) = (&c[0], &c[1]);
        assert_eq!((h2d.op.as_str(), d2d.op.as_str()), ("h2d", "d2d"));
        let flagged: Vec<u64> = h2d.to_remeasure().map(|p| p.size_bytes).collect();
        assert_eq!(flagged, [MIB]);
        assert!((h2d.points[0].spread.unwrap() - 0.4).abs() < 1e-12);
        assert_eq!(h2d.failed().count(), 1);
        assert!(!h2d.unsupported());
        assert!(d2d.unsupported());
        assert_eq!(d2d.failed().count(), 0);
        assert_eq!((d2d.max, d2d.plateau), (None, None));
    }

    #[test]
    fn curves_come_in_operation_then_natural_device_order() {
        let s = [1e9];
        let c = curves(&[
            input("allgather", "0", MIB, &s, &[]),
            input("h2d", "10", MIB, &s, &[]),
            input("h2d", "2", MIB, &s, &[]),
            input("d2h", "0", MIB, &s, &[]),
        ]);
        let order: Vec<(&str, &str)> = c
            .iter()
            .map(|c| (c.op.as_str(), c.device.as_str()))
            .collect();
        assert_eq!(
            order,
            [
                ("h2d", "2"),
                ("h2d", "10"),
                ("d2h", "0"),
                ("allgather", "0")
            ]
        );
    }

    #[test]
    fn settings_are_compared_size_by_size_against_the_points_spread() {
        // One sample per point (the tool's sweep files): the spread is the plateau's scatter.
        let base = [10.0, 20.0, 40.0, 39.0, 40.0];
        let big = [10.0, 20.0, 41.0, 39.5, 44.0];
        let samples = |v: &[f64]| -> Vec<Vec<f64>> { v.iter().map(|g| vec![g * 1e9]).collect() };
        let (b, g) = (samples(&base), samples(&big));
        let mut points: Vec<PointInput> = Vec::new();
        for (i, (b, g)) in b.iter().zip(&g).enumerate() {
            let mut p = input("allgather", "8", MIB << i, b, &[]);
            p.setting = "HCCL_BUFFSIZE unset";
            points.push(p);
            p.samples = g;
            p.setting = "HCCL_BUFFSIZE=1024";
            points.push(p);
        }
        let c = curves(&points);
        assert_eq!(c[0].setting, "HCCL_BUFFSIZE unset");
        assert_eq!(c[1].label(), "8 (HCCL_BUFFSIZE=1024)");
        let d = setting_differences(&c);
        assert_eq!(d.len(), 1);
        assert_eq!(
            (d[0].baseline.as_str(), d[0].setting.as_str()),
            ("HCCL_BUFFSIZE unset", "HCCL_BUFFSIZE=1024")
        );
        assert_eq!(d[0].sizes.len(), 5);
        // The baseline's plateau (40, 39, 40 from 4 MiB) scatters (40 - 39) / 40; the other
        // curve's plateau is its last point alone, which gives none.
        let last = &d[0].sizes[4];
        assert!((last.difference - 0.1).abs() < 1e-12);
        assert!((last.spread.unwrap() - 0.025).abs() < 1e-12);
        assert_eq!(last.exceeds_spread(), Some(true));
        assert_eq!(d[0].sizes[3].exceeds_spread(), Some(false));
        // Points with samples of their own are judged by their own spread.
        let wide = [9e9, 10e9, 11e9];
        let narrow = [10.9e9, 11e9, 11.1e9];
        let mut a = input("h2d", "0", MIB, &wide, &[]);
        let mut n = input("h2d", "0", MIB, &narrow, &[]);
        a.setting = "idle";
        n.setting = "cpu:4";
        let d = setting_differences(&curves(&[n, a]));
        assert_eq!(d[0].baseline, "idle");
        assert_eq!(d[0].sizes[0].exceeds_spread(), Some(false));
    }
}
