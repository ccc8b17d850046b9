//! chd: a per-node calibration prober and Prometheus exporter for accelerator nodes.
//!
//! Data flow: `topology` reads the machine; the `schedule` loop opens probe windows when the
//! idle gate allows; `probe` measures cells on CPU-bound threads through a `runtime::Backend`;
//! results land in the `store` (persisted to the state file); `exposition` serves the store
//! and the probe health counters at `/metrics`.

pub mod affinity;
pub mod analysis;
pub mod collect;
pub mod config;
pub mod exposition;
pub mod format;
pub mod load;
pub mod probe;
pub mod replay;
pub mod report;
pub mod runtime;
pub mod schedule;
pub mod serve;
pub mod stats;
pub mod store;
pub mod topology;
