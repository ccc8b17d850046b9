//! File formats chd reads from other tools, kept apart from what chd does with them: each
//! reader turns a file into plain values and typed errors and depends on nothing above it
//! (`probe`, `report`, `replay` and `store` use it, never the other way round).
//!
//! - [`cluster_health`]: ClusterHealthDetect's result directories (`results.json`, the partial
//!   checkpoints, the per-rank files of pair runs, `affinity.json`).

pub mod cluster_health;

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
}

impl MatrixKind {
    pub fn as_str(self) -> &'static str {
        match self {
            MatrixKind::H2d => "h2d",
            MatrixKind::Pair => "pair",
        }
    }
}
