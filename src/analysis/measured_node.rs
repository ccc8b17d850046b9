//! The measured NUMA node of each device (`chd_device_measured_numa_node`): the node whose
//! CPUs give it the highest segment median, judged on the matrix of the largest size in
//! which the device has cells, h2d before d2h at the same size (the seed's rule: measure,
//! then explain with NUMA). CPUs of no known node never make a device's node.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use super::h2d::H2dMatrix;
use crate::runtime::Direction;

/// Device -> measured NUMA node, for every device with a segment of a known node in its
/// deciding matrix; `matrices` are keyed by (size in bytes, direction).
pub fn measured_nodes<'m>(
    matrices: impl IntoIterator<Item = (&'m (u64, Direction), &'m H2dMatrix)>,
) -> BTreeMap<&'m str, u32> {
    let mut deciding: BTreeMap<&'m str, ((u64, Reverse<Direction>), &'m H2dMatrix)> =
        BTreeMap::new();
    for (&(size, direction), matrix) in matrices {
        let rank = (size, Reverse(direction));
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
