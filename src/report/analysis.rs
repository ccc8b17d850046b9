//! A report's cells as the input of [`crate::analysis`], where the matrix math lives (device
//! ratios, NUMA segments, slow cores and cells, pair CPUs, failures, thresholds); the report
//! only renders what it computes.

use std::borrow::Cow;

use super::dataset::CellResult;
use crate::analysis::Cell;

/// The natural order of device ids, where `probe::command` has found it.
pub use crate::topology::natural::natural_key;

/// `cells` as analysis cells, in the same order.
pub fn cells<'a>(cells: &[&'a CellResult]) -> Vec<Cell<'a>> {
    cells
        .iter()
        .map(|c| Cell {
            cpu: c.cpu,
            peer_cpu: c.peer_cpu,
            device: &c.device,
            value: c.value(),
            samples: c.samples.len(),
            failed: c.errors.len(),
            last_error: c.errors.last().map(|e| Cow::Borrowed(e.as_str())),
            sampled_at: None,
        })
        .collect()
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::{CellRanks, H2dMatrix, PairMatrix};
    use crate::probe::record::MatrixKind;
    use crate::report::dataset::MatrixId;
    use std::collections::BTreeMap;

    fn id(kind: MatrixKind) -> MatrixId {
        MatrixId {
            kind,
            size_bytes: 1,
            direction: "h2d".into(),
            host_memory: "pinned".into(),
            load: "idle".into(),
            pair: None,
        }
    }

    fn cell(cpu: u32, device: &str, gbps: Option<f64>) -> CellResult {
        CellResult {
            matrix: id(MatrixKind::H2d),
            cpu,
            peer_cpu: None,
            device: device.into(),
            samples: gbps.map(|g| vec![g * 1e9]).unwrap_or_default(),
            errors: if gbps.is_none() {
                vec!["copy failed".into()]
            } else {
                vec![]
            },
        }
    }

    #[test]
    fn seed_matrix_names_the_slow_column_segment_and_core() {
        // 12 CPUs on 3 nodes x 4 devices; device 0 slow everywhere; device 2 slow from node 2;
        // CPU 3 slow on every device; CPU 5 fails on device 1.
        let numa: BTreeMap<u32, u32> = (0..12).map(|c| (c, c / 4)).collect();
        let mut cells = Vec::new();
        for cpu in 0..12u32 {
            for d in 0..4 {
                let mut g = if d == 0 { 12.3 } else { 58.9 };
                if d == 2 && cpu >= 8 {
                    g = 6.1;
                }
                if cpu == 3 {
                    g *= 0.3;
                }
                let failed = cpu == 5 && d == 1;
                cells.push(cell(cpu, &d.to_string(), (!failed).then_some(g)));
            }
        }
        let refs: Vec<&CellResult> = cells.iter().collect();
        let cells = super::cells(&refs);
        let a = H2dMatrix::of(&cells, &numa);
        let ranks = CellRanks::of(&cells, &numa, &a);
        assert_eq!(a.cells, 48);
        assert_eq!(a.measured, 47);
        let slow: Vec<&str> = a.slow_devices().iter().map(|d| d.device.as_str()).collect();
        assert_eq!(slow, ["0"]);
        let segs: Vec<(Option<u32>, &str)> = a
            .slow_segments()
            .iter()
            .map(|s| (s.numa_node, s.device.as_str()))
            .collect();
        assert_eq!(segs, [(Some(2), "2")]);
        assert_eq!(ranks.cores[0].cpu, 3);
        assert_eq!(ranks.slow_cores().len(), 1);
        assert_eq!(a.failures.len(), 1);
        assert_eq!((a.failures[0].cpu, a.failures[0].device.as_str()), (5, "1"));
    }

    #[test]
    fn pair_matrix_ranks_cpus_per_side() {
        let numa: BTreeMap<u32, u32> = (0..4).map(|c| (c, c / 2)).collect();
        let mut cells = Vec::new();
        for a in 0..4u32 {
            for b in 0..4u32 {
                let g = if a == 1 { 4.0 } else { 13.7 };
                cells.push(CellResult {
                    matrix: id(MatrixKind::Pair),
                    cpu: a,
                    peer_cpu: Some(b),
                    device: "0,5".into(),
                    samples: vec![g * 1e9],
                    errors: vec![],
                });
            }
        }
        let refs: Vec<&CellResult> = cells.iter().collect();
        let p = PairMatrix::of(&super::cells(&refs), &numa);
        let slow: Vec<(u8, u32)> = p.slow_cpus().iter().map(|c| (c.rank, c.cpu)).collect();
        assert_eq!(slow, [(0, 1)]);
        assert_eq!(p.segments.len(), 4);
    }
}
