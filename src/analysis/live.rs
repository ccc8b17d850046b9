//! A live [`Store`] as the analysis's input, and its whole analysis as one plain value
//! ([`StoreAnalysis`]) that the exposition computes per scrape today and that can be computed
//! once per window end and kept. A live cell's failures are its failed attempts since its
//! last success.

use super::limits::PathLimits;
use std::borrow::Cow;
use std::collections::BTreeMap;

use super::cell::{Cell, NumaMap};
use super::d2d::D2dDevices;
use super::h2d::H2dMatrix;
use super::measured_node::measured_nodes;
use super::p2p::P2pMatrix;
use super::pair::PairMatrix;
use crate::store::{self, CellKey, Store};
use crate::topology::Topology;
use crate::vocab::{DevicePair, Direction};

/// A core x device matrix of a store: (size in bytes, direction).
pub type MatrixKey = (u64, Direction);

/// CPU -> NUMA node of `topology`'s CPUs.
pub fn numa_map(topology: &Topology) -> NumaMap {
    topology
        .cpus
        .iter()
        .filter_map(|c| Some((c.id, c.numa_node?)))
        .collect()
}

fn live<'s>(cpu: u32, peer_cpu: Option<u32>, device: &'s str, cell: &'s store::Cell) -> Cell<'s> {
    let failed = cell.consecutive_errors as usize;
    Cell {
        cpu,
        peer_cpu,
        device,
        value: cell.median(),
        samples: cell.samples.len(),
        failed,
        last_error: (failed > 0).then(|| Cow::Owned(format!("{failed} failed attempts in a row"))),
        sampled_at: cell.last_sample_at(),
    }
}

/// Every core x device cell of `store`, in the store's order (CPU, device, size, direction).
pub fn h2d_cells(store: &Store) -> Vec<(&CellKey, Cell<'_>)> {
    store
        .h2d()
        .iter()
        .map(|(k, c)| (k, live(k.cpu, None, &k.device, c)))
        .collect()
}

/// `cells` grouped into their matrices, each in the order given.
pub fn by_matrix<'v, 's>(
    cells: &'v [(&'s CellKey, Cell<'s>)],
) -> BTreeMap<MatrixKey, Vec<&'v Cell<'s>>> {
    let mut out: BTreeMap<MatrixKey, Vec<&'v Cell<'s>>> = BTreeMap::new();
    for (k, c) in cells {
        out.entry((k.size_bytes, k.direction)).or_default().push(c);
    }
    out
}

/// Every core-pair cell of `store` by pair label, each pair's by (rank 0 CPU, rank 1 CPU).
pub fn pair_cells(store: &Store) -> BTreeMap<&str, Vec<Cell<'_>>> {
    let mut out: BTreeMap<&str, Vec<Cell<'_>>> = BTreeMap::new();
    for (k, c) in store.pairs() {
        out.entry(k.pair.as_str()).or_default().push(live(
            k.cpu0,
            Some(k.cpu1),
            k.pair.as_str(),
            c,
        ));
    }
    out
}

/// The same-device copy cells of `store` by size, each size's devices analysed (their ratio
/// to the typical device: `chd_d2d_device_ratio`). The CPU of a live cell is not kept (0).
pub fn d2d_devices(store: &Store, limits: &PathLimits) -> BTreeMap<u64, D2dDevices> {
    let mut by_size: BTreeMap<u64, Vec<Cell<'_>>> = BTreeMap::new();
    for (k, c) in store.d2d() {
        by_size
            .entry(k.size_bytes)
            .or_default()
            .push(live(0, None, &k.device, c));
    }
    by_size
        .into_iter()
        .map(|(size, cells)| (size, D2dDevices::within(&cells, limits)))
        .collect()
}

/// The peer copy cells of `store` as one ordered device x device matrix, each pair in its
/// PCIe path class of `classes` and with its method of `methods` (both keyed `SRC>DST`; a pair
/// missing from `classes` is `unknown`).
pub fn p2p_matrix(
    store: &Store,
    classes: &BTreeMap<String, String>,
    methods: &BTreeMap<String, String>,
) -> P2pMatrix {
    let cells: Vec<Cell<'_>> = store
        .p2p()
        .iter()
        .map(|(k, c)| live(0, None, k.as_str(), c))
        .collect();
    P2pMatrix::of(&cells, classes, methods)
}

/// Everything derived from a store's matrices.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreAnalysis {
    pub h2d: BTreeMap<MatrixKey, H2dMatrix>,
    /// The configured pairs (a pair without cells has an empty matrix).
    pub pairs: BTreeMap<String, PairMatrix>,
    /// Device -> measured NUMA node (see [`measured_nodes`]).
    pub measured_nodes: BTreeMap<String, u32>,
}

impl StoreAnalysis {
    /// Analyse the matrices of [`by_matrix`] and [`pair_cells`]; only the `pairs` named count.
    pub fn of(
        h2d: &BTreeMap<MatrixKey, Vec<&Cell>>,
        pair_cells: &BTreeMap<&str, Vec<Cell>>,
        pairs: &[DevicePair],
        numa: &NumaMap,
    ) -> StoreAnalysis {
        let h2d: BTreeMap<MatrixKey, H2dMatrix> = h2d
            .iter()
            .map(|(k, cells)| (*k, H2dMatrix::of(cells, numa)))
            .collect();
        let measured_nodes = measured_nodes(&h2d)
            .into_iter()
            .map(|(d, n)| (d.to_string(), n))
            .collect();
        let pairs = pairs
            .iter()
            .map(|p| {
                let cells = pair_cells.get(p.as_str()).map(Vec::as_slice).unwrap_or(&[]);
                (p.to_string(), PairMatrix::of(cells, numa))
            })
            .collect();
        StoreAnalysis {
            h2d,
            pairs,
            measured_nodes,
        }
    }
}
