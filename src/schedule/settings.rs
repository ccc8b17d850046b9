//! What the prober is told to do, as validated configuration hands it over: when windows
//! open ([`ScheduleConfig`]) and what they measure ([`ProbeConfig`]).

use std::time::Duration;

use crate::topology::{CpuSelection, PairSelection};
use crate::vocab::Direction;

/// When probe windows open and how long they may take.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleConfig {
    pub enabled: bool,
    pub interval: Duration,
    pub window_budget: Duration,
    pub cpu_busy_threshold: f64,
    pub device_busy_threshold: f64,
    /// Windows a finding must show in before the verdict names it.
    pub verdict_confirm_windows: u32,
    /// Windows a named finding must be absent from before the verdict drops it.
    pub verdict_clear_windows: u32,
}

/// What the windows measure.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeConfig {
    pub sizes_bytes: Vec<u64>,
    pub directions: Vec<Direction>,
    pub warmup: u32,
    pub iterations: u32,
    pub cpus: CpuSelection,
    pub samples_per_cell: usize,
    pub stale_after: Duration,
    pub pairs: Vec<PairSelection>,
    pub pair_size_bytes: u64,
    pub pair_timeout: Duration,
    /// Longest the device work of one copy cell may take (`runtime::stuck_work`).
    pub cell_timeout: Duration,
    /// Size of each device's same-device copy cell per window; 0: none.
    pub d2d_size_bytes: u64,
    /// Size of the one ordered peer copy cell per window; 0: none.
    pub p2p_size_bytes: u64,
}
