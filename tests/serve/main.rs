//! `chd serve` end to end through the real binary, one module per concern:
//! - the exporter: `serve` (the host backend, SIGTERM mid-window, state files of every age),
//!   `serve_http` (gzip, header timeouts, the connection cap), `serve_tls` and `serve_auth`
//!   (the web config file: TLS, client certificates, basic auth under load and reloads),
//!   `client_tls` (`chd advise`, `check` and `ledger --url https://` against such a node),
//!   `serve_fixtures` (the scrape-time collectors on fixture trees, golden scrapes),
//!   `series_budget` (the fleet series budget, encoded in-process), `matrix_page` (the
//!   `/matrix` page in headless Chromium);
//! - the probe windows: `idle_gate` (busy CPUs skip and stop windows), `accelerators` (the
//!   fake CUDA, NVML and ACL runtimes), `d2d_serve` (same-device copy cells), `p2p_serve`
//!   (peer copy cells), `pair_probe` (the core-pair probe over NCCL, HCCL and copies).
//!
//! Every test spawns `chd` (and curl, Chromium, node_exporter) with its own environment; none
//! changes the test process's environment, current directory or other process-wide state,
//! and none loads a runtime library into it.

#[path = "../support/chd_process.rs"]
mod chd_process;
#[path = "../support/fake_runtime.rs"]
mod fake;
#[path = "../support/fixture_copy.rs"]
mod fixture_copy;
#[path = "../support/golden.rs"]
mod golden;
#[path = "../support/login_flood.rs"]
mod login_flood;
#[path = "../support/sysfs_builder.rs"]
mod sysfs_builder;
#[path = "../support/tls.rs"]
mod tls;

mod accelerators;
mod client_tls;
mod d2d_serve;
mod idle_gate;
mod matrix_page;
mod p2p_serve;
mod pair_probe;
mod series_budget;
mod serve;
mod serve_auth;
mod serve_fixtures;
mod serve_http;
mod serve_tls;
