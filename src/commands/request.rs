//! What `chd probe` was asked, as the CLI fills it (nothing here knows clap): each kind's
//! request (the library's, `chd::probe::<kind>::Request`) with the options of the one-shot
//! driver (`probe`), and `affinity`'s.

use std::path::PathBuf;

use chd::config::Layer;
use chd::probe::{basics, d2d, h2d, p2p, pairs, sweep};

/// A `chd probe` subcommand.
#[derive(Debug, Clone)]
pub enum ProbeRequest {
    H2d(RunOptions, h2d::Request),
    Pair(RunOptions, pairs::Request),
    Basics(RunOptions, basics::Request),
    Sweep(RunOptions, sweep::Request),
    P2p(RunOptions, p2p::Request),
    D2d(RunOptions, d2d::Request),
    Affinity(AffinityRequest),
    Fabric(Box<FabricRequest>),
    /// One rank process of a device-backend fabric run (its job on stdin).
    FabricRank,
}

/// The options every measuring `chd probe` subcommand shares: `None` (or `false`) = not
/// given.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Global and runtime flags (paths, backend, device and collective libraries);
    /// `runtime.host_memory` is ignored (host memory kinds are part of the plan).
    pub layer: Layer,
    /// `--config FILE`: a config file the flags' layer goes over.
    pub config: Option<PathBuf>,
    /// Run directory: samples stream to `cells.jsonl` there, and the report is written there.
    pub out: Option<PathBuf>,
    /// Continue the interrupted run in `out` with its plan.
    pub resume: bool,
    /// `table`, `csv` or `json` on stdout when there is no `--out`.
    pub format: Option<String>,
    /// Do not write the report at the end.
    pub no_report: bool,
    /// Plain progress lines even on a terminal.
    pub no_progress_bar: bool,
}

/// `chd probe affinity`.
#[derive(Debug, Clone, Default)]
pub struct AffinityRequest {
    pub layer: Layer,
    pub cpus: Option<String>,
    pub out: Option<PathBuf>,
    pub format: Option<String>,
}

/// `chd probe fabric`.
#[derive(Debug, Clone)]
pub struct FabricRequest {
    pub layer: Layer,
    pub backend: String,
    /// cuda/acl: the collectives' (and every rail's) device.
    pub device: Option<u32>,
    /// cuda/acl: NCCL_ALGO=Ring / HCCL_ALGO ring for the collectives.
    pub ring_algorithm: bool,
    pub warmup: u32,
    pub iterations: u32,
    pub overrides: chd::fabric::launch::Overrides,
    pub node: Option<String>,
    pub token_file: Option<PathBuf>,
    pub rails: Option<String>,
    pub bytes: String,
    pub streams: u32,
    /// Where each rail's streams run.
    pub bind: chd::fabric::placement::Bind,
    /// `allgather,allreduce`, or `none`.
    pub collectives: String,
    pub collective_sizes: String,
    pub timeout: std::time::Duration,
    pub transfer_timeout: std::time::Duration,
    pub state_dir: Option<PathBuf>,
    pub out: Option<PathBuf>,
    pub json: bool,
}
