//! chd: a per-node calibration prober and Prometheus exporter for accelerator nodes.
//!
//! Data flow: `topology` reads the machine; the `schedule` loop opens probe windows when the
//! idle gate allows; `probe` measures cells on CPU-bound threads through a `runtime::Backend`;
//! results land in the `store` (persisted through `format::state_file`); `exposition` serves
//! the store and the probe health counters at `/metrics`. The module map, and the rule that
//! no module names one above it, are in docs/ARCHITECTURE.md (checked by
//! tests/architecture.rs). The library never prints; the binary does.
//!
//! `unsafe` is denied crate-wide. Only the modules that call C or the kernel directly allow
//! it, each with an inner `#![allow(unsafe_code)]` saying why: `runtime::{cuda, acl,
//! collective, gemm, library}` (vendor C APIs loaded at run time), `runtime::device_copy`
//! (pinned host memory from the runtime as a slice), `runtime::numa_memory` (mmap, mbind,
//! move_pages), and `schedule::state_saver`'s one `malloc_trim` after a save. In the binary, only `commands::interrupt` (sigaction). Every `unsafe` block
//! carries a `// SAFETY:` comment (`clippy::undocumented_unsafe_blocks`, set in Cargo.toml).

#![deny(unsafe_code)]

pub mod affinity;
pub mod analysis;
pub mod collect;
pub mod config;
pub mod dataset;
pub mod exposition;
pub mod fabric;
pub mod format;
pub mod ledger;
pub mod load;
pub mod probe;
pub mod replay;
pub mod report;
pub mod runtime;
pub mod schedule;
pub mod slurm;
pub mod stats;
pub mod store;
pub mod topology;
pub mod vocab;
