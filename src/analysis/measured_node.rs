//! The measured NUMA node of each device (`chd_device_measured_numa_node`): the node whose
//! CPUs give it the highest segment median, judged on the matrix of the largest size in
//! which the device has cells, h2d before d2h at the same size (the seed's rule: measure,
//! then explain with NUMA). CPUs of no known node never make a device's node.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use super::h2d::H2dMatrix;
use crate::vocab::Direction;

/// How a matrix ranks as the one that decides a device's measured node (and its best CPUs,
/// [`super::best_cpus`]): the larger size wins, h2d before d2h at the same size.
pub fn deciding_rank(size_bytes: u64, direction: Direction) -> (u64, Reverse<Direction>) {
    (size_bytes, Reverse(direction))
}

/// Device -> measured NUMA node, for every device with a segment of a known node in its
/// deciding matrix; `matrices` are keyed by (size in bytes, direction).
pub fn measured_nodes<'m>(
    matrices: impl IntoIterator<Item = (&'m (u64, Direction), &'m H2dMatrix)>,
) -> BTreeMap<&'m str, u32> {
    let mut deciding: BTreeMap<&'m str, ((u64, Reverse<Direction>), &'m H2dMatrix)> =
        BTreeMap::new();
    for (&(size, direction), matrix) in matrices {
        let rank = deciding_rank(size, direction);
        for column in &matrix.devices {
            let device = column.device.as_str();
            if deciding.get(device).is_none_or(|(r, _)| rank > *r) {
                deciding.insert(device, (rank, matrix));
            }
        }
    }
    deciding
        .into_iter()
        .filter_map(|(device, (_, matrix))| {
            let (node, _) = matrix
                .segments_of(device)
                .filter_map(|s| Some((s.numa_node?, s.summary.median)))
                .max_by(|a, b| a.1.total_cmp(&b.1))?;
            Some((device, node))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::{Cell, NumaMap};

    fn cell(cpu: u32, device: &str, gbps: f64) -> Cell<'_> {
        Cell::test(cpu, device, Some(gbps))
    }

    #[test]
    fn the_largest_size_decides_and_h2d_before_d2h() {
        // CPUs 0-1 on node 0, 2-3 on node 1, CPU 9 on no known node (fastest of all).
        let numa: NumaMap = [(0, 0), (1, 0), (2, 1), (3, 1)].into_iter().collect();
        let matrix = |fast_node: u32| {
            let cells: Vec<Cell> = [0, 1, 2, 3, 9]
                .into_iter()
                .map(|cpu| {
                    let g = match cpu {
                        9 => 90.0,
                        c if c / 2 == fast_node => 58.0,
                        _ => 20.0,
                    };
                    cell(cpu, "0", g)
                })
                .collect();
            H2dMatrix::of(&cells, &numa)
        };
        let (small, large_h2d, large_d2h) = (matrix(0), matrix(1), matrix(0));
        let matrices = BTreeMap::from([
            ((1 << 20, Direction::H2d), small),
            ((64 << 20, Direction::D2h), large_d2h),
            ((64 << 20, Direction::H2d), large_h2d),
        ]);
        assert_eq!(measured_nodes(&matrices), BTreeMap::from([("0", 1)]));
        let only_small = BTreeMap::from([((1 << 20, Direction::H2d), matrix(0))]);
        assert_eq!(measured_nodes(&only_small), BTreeMap::from([("0", 0)]));
    }
}
