//! Every file chd reads or writes, kept apart from what chd does with them: each module turns
//! a file into plain values and typed errors and back, and depends on nothing above it
//! (`probe`, `report`, `replay` and `store` use it, never the other way round).
//!
//! - [`run_dir`]: a one-shot run directory (`run.json`, `cells.jsonl`); [`slot`]: its sample
//!   slots, typed per probe kind.
//! - [`state_file`]: `chd serve`'s `state.json`.
//! - [`calibration`]: the calibration ledger of `chd ledger` and `/api/v1/calibration`, and the
//!   fleet file of `chd ledger --merge`.
//! - [`affinity_file`]: the `affinity.json` of `chd probe affinity --out DIR`.
//! - [`cluster_health`]: ClusterHealthDetect's result directories (`results.json`, the partial
//!   checkpoints, the per-rank files of pair runs, `affinity.json`).
//! - [`cluster_health_workbook`]: ClusterHealthDetect's xlsx workbooks (H2D matrix, core-pair
//!   and NUMA affinity workbooks: every sheet kind its writers make).
//! - [`size_sweep`]: the size-sweep JSON and CSV files of ClusterHealthDetect's users.
//! - [`fabric`]: the fabric probe's results a node keeps (`<state_dir>/fabric/`);
//!   [`fabric_dir`]: that directory read again and again, with a parse cache.
//! - [`launch_map`]: a proposed launch map for `chd advise --map`.
//! - [`web_config`]: the web config file of Prometheus exporters (`--web.config.file`).
//! - [`atomic_file`]: how every file chd writes whole is written (temporary file, rename) in
//!   directories others may write to.

pub mod affinity_file;
pub mod atomic_file;
pub mod calibration;
pub mod cluster_health;
pub mod cluster_health_workbook;
pub mod fabric;
pub mod fabric_dir;
pub mod hex;
pub mod launch_map;
pub mod nfd_features;
pub mod run_dir;
pub mod size_sweep;
pub mod slot;
pub mod state_file;
pub mod web_config;

use serde::{Deserialize, Serialize};

/// Which matrix a cell belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MatrixKind {
    /// Core x device copy matrix: `cpu` x `device`.
    H2d,
    /// Core-pair matrix of one device pair: `cpu` (rank 0) x `peer_cpu` (rank 1); `device`
    /// holds the pair, e.g. `0,5`.
    Pair,
    /// The basic validation table: per device, a matmul, an H2D and a same-device copy from a
    /// CPU of its NUMA node, and the 2-rank allgather of its pair (`direction` names the
    /// measurement; `device` holds the pair for an allgather).
    Basics,
    /// Size curve of one CPU to each device (`chd probe sweep`): `direction` holds the
    /// operation (`h2d`, `d2h`, `d2d`, `allgather`), `device` the device swept; an allgather
    /// point's `peer_cpu` is rank 1's CPU (its device is in the plan's `peers`).
    Sweep,
    /// Ordered device x device peer copy matrix (`chd probe p2p`): `device` holds the ordered
    /// pair `SRC>DST` (e.g. `0>5`: device 0's memory copied into device 5's), `cpu` the CPU
    /// of the one thread issuing every copy.
    P2p,
    /// Same-device copies (device memory to device memory of one device): `device` x size,
    /// each device's cells measured from one CPU on its NUMA node (`cpu`).
    D2d,
}

impl MatrixKind {
    pub fn as_str(self) -> &'static str {
        match self {
            MatrixKind::H2d => "h2d",
            MatrixKind::Pair => "pair",
            MatrixKind::Basics => "basics",
            MatrixKind::Sweep => "sweep",
            MatrixKind::P2p => "p2p",
            MatrixKind::D2d => "d2d",
        }
    }
}
