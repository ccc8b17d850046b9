//! `chd probe` end to end through the real binary: a run directory with its report on this
//! machine (host backend), resume after SIGKILL and after Ctrl-C with no sample measured
//! twice or lost, load profiles, a planted slow device through the fake CUDA runtime, the
//! affinity probe, same-device copies (`probe d2d`), size curves (`chd probe sweep`), and the
//! errors a user can make. Beside it the rest of the command line: `cli` (config files,
//! `--print-config`, `chd topology`, `--help`), `report` (`chd report` on recordings and run
//! directories), `fabric_rounds` (`chd fabric rounds`, the schedule of node pairs), `fabric`
//! (`chd probe fabric` ranks on loopback and their faults), `workbooks` (`chd report` on
//! ClusterHealthDetect's workbooks and sweep files) and `timed_region` (the timed region
//! without the host's enqueue time, issue 25 part 1).
//!
//! Every test spawns `chd` with its own environment; none changes the test process's
//! environment, current directory or other process-wide state.

#[path = "../support/chd_process.rs"]
mod chd_process;
#[path = "../support/fake_runtime.rs"]
mod fake;
#[path = "../support/golden.rs"]
mod golden;
#[path = "../support/workbook_files.rs"]
mod workbook_files;
#[path = "../support/xlsx.rs"]
mod xlsx;

mod basics;
mod cli;
mod common;
mod d2d;
mod fabric;
mod fabric_device;
mod fabric_rounds;
mod fake_cuda;
mod host;
mod old_runs;
mod p2p;
mod pair;
mod pair_resume;
mod report;
mod resume;
mod sweep;
mod timed_region;
mod workbooks;
