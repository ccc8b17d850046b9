//! chd in a fleet: the node's verdict and the tools that act on it, recordings of other nodes,
//! and the calibration ledger, through the real binary, one module per concern:
//! - `verdict`: `chd check`'s exit codes and `chd serve`'s held verdict in the NFD feature
//!   file (issue 16); `verdict_changes`: repeat offenders counted (issue 27 part 3);
//! - `slurm`: `chd check --slurm` as a real Slurm's `HealthCheckProgram` (issue 27);
//! - `npd`: the node-problem-detector plugin monitor (issue 27 part 2); `nhc`: the LBNL NHC
//!   check (issue 27 part 4);
//! - `ledger`: `chd ledger` and `/api/v1/calibration` against docs/calibration.schema.json;
//!   `advise`: `chd advise` on a recorded node;
//! - `replay`: `chd serve --replay`; `fleet_replay`: recordings as a small fleet in a real
//!   Prometheus (issue 15 part 5); `cluster_health`: ClusterHealthDetect recordings read by
//!   `chd report` and `chd serve --replay` alike;
//! - `fabric_netns`: `chd probe fabric` between two network namespaces over three veth rails
//!   (one throttled, one dead), published by each node's `chd serve` and judged by a real
//!   Prometheus (issue 26); `fabric_srun`: two ranks launched by a real Slurm's `srun -n2`.
//!
//! Every test spawns `chd` (and Slurm, NPD's checks, python, Prometheus) with its own
//! environment; none changes the test process's environment, current directory or other
//! process-wide state.

#[path = "../support/chd_process.rs"]
mod chd_process;
#[path = "../support/fake_runtime.rs"]
mod fake;
#[path = "../support/json_schema.rs"]
mod json_schema;
#[path = "../support/prometheus.rs"]
mod prometheus;
#[path = "../support/slurm_cluster.rs"]
mod slurm_cluster;
#[path = "../support/workbook_files.rs"]
mod workbook_files;

mod advise;
mod cluster_health;
mod fabric_netns;
mod fabric_sbatch;
mod fabric_srun;
mod fleet_replay;
mod ledger;
mod nhc;
mod npd;
mod replay;
mod slurm;
mod verdict;
mod verdict_changes;
