//! A core-pair matrix (rank 0's CPU x rank 1's CPU of one device pair): each CPU's median
//! over the cells in which it held a rank and its ratio to the whole matrix's median (as
//! `chd_pair_cpu_ratio`), and the cells grouped by both ranks' NUMA nodes. Only cells with a
//! value and a rank-1 CPU count.

use std::borrow::Borrow;
use std::collections::BTreeMap;

use super::cell::{node, Cell, NumaMap};
use super::failures::{failures, Failure};
use crate::stats::{self, Summary};

/// One CPU's median over the pair cells where it held one rank.
#[derive(Debug, Clone, PartialEq)]
pub struct PairCpu {
    /// 0 or 1.
    pub rank: u8,
    pub cpu: u32,
    pub numa_node: Option<u32>,
    pub median: f64,
    /// CPU median / median of the whole matrix.
    pub ratio: Option<f64>,
}

/// One device pair's matrix, analysed.
#[derive(Debug, Clone, PartialEq)]
pub struct PairMatrix {
    /// Cells, measured or not.
    pub cells: usize,
    /// Cells with a value.
    pub measured: usize,
    pub overall: Option<Summary>,
    /// By rank, then CPU.
    pub cpus: Vec<PairCpu>,
    /// (rank 0 NUMA node, rank 1 NUMA node) -> the cells' summary.
    pub segments: BTreeMap<(Option<u32>, Option<u32>), Summary>,
    pub failures: Vec<Failure>,
}

impl PairMatrix {
    /// Analyse the cells of one pair's matrix (`&[Cell]` or `&[&Cell]`).
    pub fn of<'a, C: Borrow<Cell<'a>>>(cells: &[C], numa: &NumaMap) -> PairMatrix {
        let mut all = Vec::with_capacity(cells.len());
        let mut per: BTreeMap<(u8, u32), Vec<f64>> = BTreeMap::new();
        let mut blocks: BTreeMap<(Option<u32>, Option<u32>), Vec<f64>> = BTreeMap::new();
        for c in cells {
            let c = c.borrow();
            let (Some(peer), Some(v)) = (c.peer_cpu, c.value) else {
                continue;
            };
            all.push(v);
            per.entry((0, c.cpu)).or_default().push(v);
            per.entry((1, peer)).or_default().push(v);
            blocks
                .entry((node(numa, c.cpu), node(numa, peer)))
                .or_default()
                .push(v);
        }
        let overall = Summary::of(&all);
        let cpus = per
            .into_iter()
            .filter_map(|((rank, cpu), v)| {
                let median = stats::median(&v)?;
                Some(PairCpu {
                    rank,
                    cpu,
                    numa_node: node(numa, cpu),
                    median,
                    ratio: overall.and_then(|o| stats::ratio(median, o.median)),
                })
            })
            .collect();
        PairMatrix {
            cells: cells.len(),
            measured: all.len(),
            overall,
            cpus,
            segments: blocks
                .into_iter()
                .filter_map(|(k, v)| Some((k, Summary::of(&v)?)))
                .collect(),
            failures: failures(cells),
        }
    }

    /// The CPUs ascending by ratio (no ratio last), then rank and CPU.
    pub fn cpus_by_ratio(&self) -> Vec<&PairCpu> {
        let mut cpus: Vec<&PairCpu> = self.cpus.iter().collect();
        cpus.sort_by(|a, b| {
            a.ratio
                .unwrap_or(f64::INFINITY)
                .total_cmp(&b.ratio.unwrap_or(f64::INFINITY))
                .then((a.rank, a.cpu).cmp(&(b.rank, b.cpu)))
        });
        cpus
    }
}
