//! The CLI's verbs other than `serve`: each takes the request `cli` filled (nothing here knows
//! clap), runs it through the library and prints. With `main.rs`, the only code that writes to
//! stdout; the library returns values and typed errors.
//!
//! - [`serve`]: `chd serve`, the exporter's wiring.
//! - [`probe`]: `chd probe h2d|pair|d2d|p2p|sweep|basics`, the one-shot driver.
//! - [`affinity`]: `chd probe affinity`.
//! - [`interrupt`]: Ctrl-C that lets the cell in flight finish (the binary's one `unsafe`).
//! - [`progress`]: the progress bar or lines of a one-shot run.
//! - [`request`]: what `chd probe` was asked.
//! - [`report`]: `chd report`.
//! - [`check`]: `chd check`, the node's verdict with health-check exit codes.
//! - [`ledger`]: `chd ledger` and the `/api/v1/calibration` page.
//! - [`advise`]: `chd advise` (launch advice, `--map` scoring).
//! - [`fetch`]: `--url` of `advise`, `check` and `ledger` (HTTP or TLS, client certificates,
//!   basic auth).
//! - [`fabric`]: `chd fabric rounds` (the round-robin schedule of node pairs).
//! - [`fabric_probe`]: `chd probe fabric`, one rank of a fabric run.

pub mod advise;
pub mod affinity;
pub mod check;
pub mod fabric;
pub mod fabric_probe;
pub mod fetch;
pub mod interrupt;
pub mod ledger;
pub mod probe;
pub mod progress;
pub mod report;
pub mod request;
pub mod serve;
