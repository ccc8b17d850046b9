//! The matrix math, once: what chd concludes from a core x device or core-pair matrix, for
//! the exposition (`/metrics`), the report (`summary.md`, pictures, workbook) and the
//! `/matrix` page alike. The input is neutral ([`Cell`]: a live `Store` and a report's
//! dataset both give it cheaply); the results are plain values ([`H2dMatrix`],
//! [`CellRanks`], [`PairMatrix`], [`StoreAnalysis`]) that can be computed once from a store
//! snapshot and kept.
//!
//! - [`cell`]: the input, one cell of a matrix, and the CPU -> NUMA node map.
//! - [`live`]: a `Store`'s cells as that input, and the whole store's analysis.
//! - [`h2d`]: device columns with their ratio to the typical device, NUMA segments.
//! - [`ranks`]: CPUs ranked by how they feed the devices, the slowest cells.
//! - [`limits`]: the most each path of a device can carry, and the samples above it.
//! - [`link`]: each device column over the payload of its PCIe link.
//! - [`measured_node`]: the NUMA node that feeds each device best.
//! - [`best_cpus`]: the CPUs within 5 % of each device's best cell.
//! - [`d2d`]: same-device copies per device, with their ratio to the typical device.
//! - [`fabric`]: the fabric's rails judged against the node's other rails, and summarized over runs.
//! - [`load_delta`]: each load profile's device columns over idle's.
//! - [`p2p`]: the ordered device x device peer copy matrix by PCIe path class.
//! - [`pair`]: a core-pair matrix's per-CPU medians and NUMA x NUMA blocks.
//! - [`failures`]: the cells that failed.
//! - [`findings`]: the thresholds (those of the alert rules) and what is below them.
//! - [`sweep`]: size curves: each point's median and spread, re-measure flags, dips, plateau.
//! - [`verdict`]: the node's verdict (`ok`, `degraded`, `failed`) and its causes.
//! - [`heatmap`]: one heatmap model for every renderer (PNG, SVG, workbook).
//! - [`basics`]: the basic validation table (slowest and fastest device per measurement).

pub mod basics;
pub mod best_cpus;
pub mod cell;
pub mod d2d;
pub mod fabric;
pub mod failures;
pub mod findings;
pub mod h2d;
pub mod heatmap;
pub mod limits;
pub mod link;
pub mod live;
pub mod load_delta;
pub mod measured_node;
pub mod p2p;
pub mod pair;
pub mod ranks;
pub mod suspect;
pub mod sweep;
pub mod verdict;

pub use cell::{Cell, NumaMap};
pub use d2d::{D2dDevice, D2dDevices};
pub use failures::Failure;
pub use findings::{
    EXTREME_CELL_RATIO, SLOW_CPU_RATIO, SLOW_D2D_DEVICE_RATIO, SLOW_DEVICE_RATIO,
    SLOW_SEGMENT_RATIO,
};
pub use h2d::{DeviceColumn, H2dMatrix, Segment};
pub use live::StoreAnalysis;
pub use pair::{PairCpu, PairMatrix};
pub use ranks::{CellRanks, CoreRank, SlowCell};
