//! Cells and CPUs ranked within a core x device matrix: each CPU by the median over devices
//! of (its cell / the device column's median), each cell by (its value / its NUMA segment's
//! median on that device).

use std::borrow::Borrow;
use std::collections::BTreeMap;

use super::cell::{node, Cell, NumaMap};
use super::h2d::H2dMatrix;
use crate::stats;
use crate::topology::natural::natural_cmp;

/// Cells listed in [`CellRanks::slowest_cells`].
pub const SLOWEST_CELLS: usize = 100;

/// A CPU ranked by how it feeds the devices.
#[derive(Debug, Clone, PartialEq)]
pub struct CoreRank {
    pub cpu: u32,
    pub numa_node: Option<u32>,
    /// Median over devices of (cell / device column median).
    pub ratio: f64,
    /// Median of the CPU's cells, bytes per second.
    pub median: f64,
}

/// A cell against its NUMA segment.
#[derive(Debug, Clone, PartialEq)]
pub struct SlowCell {
    pub cpu: u32,
    pub device: String,
    /// Bytes per second.
    pub value: f64,
    /// The value / the median of its NUMA segment on that device.
    pub ratio: f64,
}

/// The ranks of one core x device matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct CellRanks {
    /// Ascending by ratio, then CPU.
    pub cores: Vec<CoreRank>,
    /// Ascending by ratio, then CPU, then device (natural order); at most [`SLOWEST_CELLS`].
    pub slowest_cells: Vec<SlowCell>,
}

impl CellRanks {
    /// Rank `cells`, the cells `matrix` was made of.
    pub fn of<'a, C: Borrow<Cell<'a>>>(
        cells: &[C],
        numa: &NumaMap,
        matrix: &H2dMatrix,
    ) -> CellRanks {
        let column: BTreeMap<&str, f64> = matrix
            .devices
            .iter()
            .map(|d| (d.device.as_str(), d.summary.median))
            .collect();
        let segment: BTreeMap<(Option<u32>, &str), f64> = matrix
            .segments
            .iter()
            .map(|s| ((s.numa_node, s.device.as_str()), s.summary.median))
            .collect();
        let values: Vec<(u32, &str, f64)> = cells
            .iter()
            .map(Borrow::borrow)
            .filter_map(|c| Some((c.cpu, c.device, c.value?)))
            .collect();
        let mut per_cpu: BTreeMap<u32, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
        for &(cpu, device, v) in &values {
            let e = per_cpu.entry(cpu).or_default();
            e.0.push(v);
            if let Some(r) = column.get(device).and_then(|m| stats::ratio(v, *m)) {
                e.1.push(r);
            }
        }
        let mut cores: Vec<CoreRank> = per_cpu
            .into_iter()
            .filter_map(|(cpu, (vals, ratios))| {
                Some(CoreRank {
                    cpu,
                    numa_node: node(numa, cpu),
                    ratio: stats::median(&ratios)?,
                    median: stats::median(&vals)?,
                })
            })
            .collect();
        cores.sort_by(|a, b| a.ratio.total_cmp(&b.ratio).then(a.cpu.cmp(&b.cpu)));
        let mut slowest: Vec<(u32, &str, f64, f64)> = values
            .iter()
            .filter_map(|&(cpu, d, v)| {
                let r = stats::ratio(v, *segment.get(&(node(numa, cpu), d))?)?;
                Some((cpu, d, v, r))
            })
            .collect();
        slowest.sort_by(|a, b| {
            a.3.total_cmp(&b.3)
                .then(a.0.cmp(&b.0))
                .then_with(|| natural_cmp(a.1, b.1))
        });
        slowest.truncate(SLOWEST_CELLS);
        CellRanks {
            cores,
            slowest_cells: slowest
                .into_iter()
                .map(|(cpu, device, value, ratio)| SlowCell {
                    cpu,
                    device: device.to_string(),
                    value,
                    ratio,
                })
                .collect(),
        }
    }
}
