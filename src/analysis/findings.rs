//! What is slow: the thresholds, those of the alert rules in `alerts/chd.rules.yml` (and
//! docs/METRICS.md) so a report, a page and an alert agree, and the parts of a matrix below
//! them.

use super::h2d::{DeviceColumn, H2dMatrix, Segment};
use super::pair::{PairCpu, PairMatrix};
use super::ranks::{CellRanks, CoreRank, SlowCell};

/// A device column below this ratio is slow (`ChdH2DSlowDeviceColumn`).
pub const SLOW_DEVICE_RATIO: f64 = 0.5;
/// A NUMA segment below this fraction of its device's best segment is slow (the report's
/// form of `ChdH2DSlowNumaSegment`, which divides by the device's median over all CPUs).
pub const SLOW_SEGMENT_RATIO: f64 = 0.5;
/// A CPU below this ratio is slow (`ChdPairCpuSlow`; also used for h2d cores).
pub const SLOW_CPU_RATIO: f64 = 0.7;
/// A device whose same-device copy rate is below this ratio to the node's typical device is
/// slow (`ChdD2DDeviceSlow`). Idle devices of one node spread over 240-420 GB/s in the
/// calibration runs (0.73 of their median at worst): a weak device is well below that.
pub const SLOW_D2D_DEVICE_RATIO: f64 = 0.6;
/// A cell below this fraction of its NUMA segment's median on that device is extreme (the
/// seed's 0.2 GB/s cells among 58 GB/s neighbours; a slow segment is its own finding).
pub const EXTREME_CELL_RATIO: f64 = 0.2;

impl H2dMatrix {
    /// Device columns below [`SLOW_DEVICE_RATIO`].
    pub fn slow_devices(&self) -> Vec<&DeviceColumn> {
        self.devices
            .iter()
            .filter(|d| d.ratio.is_some_and(|r| r < SLOW_DEVICE_RATIO))
            .collect()
    }

    /// Segments below [`SLOW_SEGMENT_RATIO`] of their device's best segment.
    pub fn slow_segments(&self) -> Vec<&Segment> {
        self.segments
            .iter()
            .filter(|s| s.ratio.is_some_and(|r| r < SLOW_SEGMENT_RATIO))
            .collect()
    }
}

impl CellRanks {
    /// CPUs below [`SLOW_CPU_RATIO`].
    pub fn slow_cores(&self) -> Vec<&CoreRank> {
        self.cores
            .iter()
            .filter(|c| c.ratio < SLOW_CPU_RATIO)
            .collect()
    }

    /// Cells below [`EXTREME_CELL_RATIO`] of their segment's median (of the slowest
    /// [`super::ranks::SLOWEST_CELLS`]).
    pub fn extreme_cells(&self) -> Vec<&SlowCell> {
        self.slowest_cells
            .iter()
            .filter(|c| c.ratio < EXTREME_CELL_RATIO)
            .collect()
    }
}

impl PairMatrix {
    /// CPUs below [`SLOW_CPU_RATIO`] on either rank, ascending by ratio.
    pub fn slow_cpus(&self) -> Vec<&PairCpu> {
        self.cpus_by_ratio()
            .into_iter()
            .filter(|c| c.ratio.is_some_and(|r| r < SLOW_CPU_RATIO))
            .collect()
    }
}
