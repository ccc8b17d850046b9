//! The analysis's input: one cell of a matrix as a live `Store` and a report's dataset both
//! give it (CPU, device or rank-1 CPU, median, how many samples succeeded and failed, the
//! last failure, the newest sample's time), and the CPU -> NUMA node map that groups cells
//! into segments.

use std::borrow::Cow;
use std::collections::BTreeMap;

/// CPU -> NUMA node; a CPU that is not in it has no known node (its own segment).
pub type NumaMap = BTreeMap<u32, u32>;

/// One cell of a core x device or core-pair matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell<'a> {
    /// The probing CPU (rank 0's for a pair cell).
    pub cpu: u32,
    /// Rank 1's CPU of a pair cell.
    pub peer_cpu: Option<u32>,
    /// Device id; the pair label (`0,5`) for a pair cell.
    pub device: &'a str,
    /// The cell's value: median of its successful samples, bytes per second.
    pub value: Option<f64>,
    /// Successful samples.
    pub samples: usize,
    /// Failed samples (a recording's) or failed attempts since the last success (a live
    /// cell's).
    pub failed: usize,
    /// What the last failure said.
    pub last_error: Option<Cow<'a, str>>,
    /// Unix time of the newest sample, when known.
    pub sampled_at: Option<f64>,
}

#[cfg(test)]
impl<'a> Cell<'a> {
    /// A test cell: one sample at `gbps` GB/s, or one failed sample (`None`).
    pub(crate) fn test(cpu: u32, device: &'a str, gbps: Option<f64>) -> Cell<'a> {
        Cell {
            cpu,
            peer_cpu: None,
            device,
            value: gbps.map(|g| g * 1e9),
            samples: usize::from(gbps.is_some()),
            failed: usize::from(gbps.is_none()),
            last_error: gbps.is_none().then(|| "copy failed".into()),
            sampled_at: None,
        }
    }
}

/// The NUMA node of `cpu`.
pub fn node(numa: &NumaMap, cpu: u32) -> Option<u32> {
    numa.get(&cpu).copied()
}

/// [`node`] that keeps its last answer: cells mostly come CPU by CPU, and a map lookup per
/// cell is a good part of a scrape of a large matrix.
pub struct NodeOf<'m> {
    numa: &'m NumaMap,
    last: Option<(u32, Option<u32>)>,
}

impl<'m> NodeOf<'m> {
    pub fn new(numa: &'m NumaMap) -> NodeOf<'m> {
        NodeOf { numa, last: None }
    }

    /// The NUMA node of `cpu`.
    pub fn get(&mut self, cpu: u32) -> Option<u32> {
        match self.last {
            Some((c, n)) if c == cpu => n,
            _ => {
                let n = node(self.numa, cpu);
                self.last = Some((cpu, n));
                n
            }
        }
    }
}
