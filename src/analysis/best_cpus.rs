//! The CPUs that feed each device best (`chd advise`, the ledger's `best_cpus`,
//! `chd_device_best_cpus_info`): those whose cell is within [`BEST_CPU_TOLERANCE`] of the
//! device's best cell, judged on the matrix that decides the device's measured NUMA node
//! (the largest size, h2d before d2h: [`super::measured_node::deciding_rank`]).

use std::collections::BTreeMap;

use super::cell::Cell;
use super::live::MatrixKey;
use super::measured_node::deciding_rank;
use crate::topology::natural::natural_cmp;
use crate::vocab::Direction;

/// A CPU is among a device's best when its cell is at least (1 - this) x the best cell.
pub const BEST_CPU_TOLERANCE: f64 = 0.05;

/// One device's best CPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct BestCpus {
    pub device: String,
    /// The matrix judged.
    pub size_bytes: u64,
    pub direction: Direction,
    /// The best cell, bytes per second.
    pub best: f64,
    /// Ascending.
    pub cpus: Vec<u32>,
}

/// Every device with a measured cell, in natural order of the device; `matrices` as
/// [`super::live::by_matrix`] groups them.
pub fn best_cpus<'a, C: std::borrow::Borrow<Cell<'a>>>(
    matrices: &BTreeMap<MatrixKey, Vec<C>>,
) -> Vec<BestCpus> {
    let mut deciding: BTreeMap<&str, MatrixKey> = BTreeMap::new();
    for (&(size, direction), cells) in matrices {
        for c in cells {
            let c = c.borrow();
            if c.value.is_none_or(f64::is_nan) {
                continue;
            }
            let known = deciding.get(c.device).copied();
            if known.is_none_or(|(s, d)| deciding_rank(size, direction) > deciding_rank(s, d)) {
                deciding.insert(c.device, (size, direction));
            }
        }
    }
    let mut out: Vec<BestCpus> = deciding
        .into_iter()
        .filter_map(|(device, key)| {
            let values: Vec<(u32, f64)> = matrices[&key]
                .iter()
                .map(|c| c.borrow())
                .filter(|c| c.device == device)
                .filter_map(|c| Some((c.cpu, c.value.filter(|v| !v.is_nan())?)))
                .collect();
            let best = values.iter().map(|v| v.1).fold(f64::NEG_INFINITY, f64::max);
            if !best.is_finite() || best <= 0.0 {
                return None;
            }
            let mut cpus: Vec<u32> = values
                .iter()
                .filter(|(_, v)| *v >= best * (1.0 - BEST_CPU_TOLERANCE))
                .map(|(cpu, _)| *cpu)
                .collect();
            cpus.sort_unstable();
            cpus.dedup();
            Some(BestCpus {
                device: device.to_string(),
                size_bytes: key.0,
                direction: key.1,
                best,
                cpus,
            })
        })
        .collect();
    out.sort_by(|a, b| natural_cmp(&a.device, &b.device));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(cpu: u32, device: &str, gbps: f64) -> Cell<'_> {
        Cell::test(cpu, device, Some(gbps))
    }

    #[test]
    fn within_five_percent_of_the_best_on_the_largest_h2d_matrix() {
        let large = vec![
            cell(0, "10", 58.0),
            cell(1, "10", 55.2), // 0.952 of the best: in
            cell(2, "10", 55.0), // 0.948: out
            cell(3, "10", 20.0),
            cell(0, "2", 12.0),
            cell(3, "2", 30.0),
        ];
        let small = vec![cell(2, "10", 99.0)];
        let d2h = vec![cell(2, "10", 99.0)];
        let matrices = BTreeMap::from([
            ((1 << 20, Direction::H2d), small),
            ((64 << 20, Direction::H2d), large),
            ((64 << 20, Direction::D2h), d2h),
        ]);
        let best = best_cpus(&matrices);
        assert_eq!(best.len(), 2);
        assert_eq!(
            (best[0].device.as_str(), &best[0].cpus[..]),
            ("2", &[3][..])
        );
        assert_eq!(
            (best[1].device.as_str(), &best[1].cpus[..]),
            ("10", &[0, 1][..])
        );
        assert_eq!(best[1].size_bytes, 64 << 20);
        assert_eq!(best[1].direction, Direction::H2d);
        assert_eq!(best[1].best, 58e9);
    }
}
