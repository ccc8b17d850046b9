//! What `chd probe` was asked, as the CLI fills it (nothing here knows clap): the requests
//! the one-shot driver (`probe`), the planner (`plan`) and `affinity` read.

use std::path::PathBuf;

use chd::config::Layer;

/// A `chd probe` subcommand.
#[derive(Debug, Clone)]
pub enum ProbeRequest {
    H2d(H2dRequest),
    Pair(PairRequest),
    Basics(BasicsRequest),
    Sweep(SweepRequest),
    P2p(P2pRequest),
    D2d(D2dRequest),
    Affinity(AffinityRequest),
}

/// The options `chd probe h2d` and `chd probe pair` share: `None` (or `false`) = not given
/// (the default, or the resumed run's value).
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Global and runtime flags (paths, backend, device and collective libraries);
    /// `runtime.host_memory` is ignored.
    pub layer: Layer,
    /// CPUs; for pairs those of both ranks (the matrix is these x these).
    pub cpus: Option<String>,
    /// Copy sizes (h2d) or bytes per rank (pair).
    pub sizes: Option<Vec<String>>,
    /// Untimed operations before each sample.
    pub warmup: Option<u32>,
    /// Timed operations per sample.
    pub iterations: Option<u32>,
    /// Samples per cell (and load profile).
    pub repeats: Option<u32>,
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

/// `chd probe h2d` as asked: `None` = not given (the default, or the resumed run's value).
#[derive(Debug, Clone, Default)]
pub struct H2dRequest {
    pub run: RunOptions,
    /// Comma-separated device labels, or `all`.
    pub devices: Option<String>,
    /// `h2d`, `d2h`.
    pub directions: Option<Vec<String>>,
    /// Comma-separated host memory kinds.
    pub host_memory: Option<String>,
    /// Load profiles, one run per profile [default: the resumed run's, else `idle`].
    pub loads: Vec<String>,
}

/// `chd probe pair` as asked: `None` (or empty) = not given.
#[derive(Debug, Clone, Default)]
pub struct PairRequest {
    pub run: RunOptions,
    /// Device pairs, each `A,B` or `auto` [default: the resumed run's pairs, else `auto`].
    pub pairs: Vec<String>,
    /// Longest one cell may take, e.g. `30s`.
    pub timeout: Option<String>,
}

/// `chd probe basics` as asked: `None` (or empty) = not given.
#[derive(Debug, Clone, Default)]
pub struct BasicsRequest {
    pub run: RunOptions,
    /// Comma-separated device labels, or `all`.
    pub devices: Option<String>,
    /// Measurements (`matmul`, `h2d`, `d2d`, `allgather`) [default: all].
    pub ops: Option<Vec<String>>,
    /// Bytes of each copy and of each rank's allgather buffer.
    pub size: Option<String>,
    /// The matmul's matrix side N.
    pub matrix_side: Option<u64>,
    /// Load profiles, one run per profile.
    pub loads: Vec<String>,
}

/// `chd probe sweep` as asked: `None` = not given (the default, or the resumed run's
/// value). `run.cpus` and `run.sizes` are unused: one CPU (`cpu`) and the doubling sizes
/// from `from` to `to`.
#[derive(Debug, Clone, Default)]
pub struct SweepRequest {
    pub run: RunOptions,
    /// Comma-separated device labels, or `all`.
    pub devices: Option<String>,
    /// The one CPU every point is measured from (allgather: rank 0's).
    pub cpu: Option<u32>,
    /// Smallest size.
    pub from: Option<String>,
    /// Largest size.
    pub to: Option<String>,
    /// Operations: `h2d`, `d2h`, `d2d`, `allgather`.
    pub ops: Option<Vec<String>>,
    /// Rank 1's device of every allgather point [default: each device's farthest peer].
    pub peer: Option<String>,
    /// Host memory of the h2d and d2h points: `pinned` or `pageable`.
    pub host_memory: Option<String>,
}

/// `chd probe p2p` as asked: `None` = not given. `run.cpus` is the one issuing CPU and
/// `run.sizes` the one copy size.
#[derive(Debug, Clone, Default)]
pub struct P2pRequest {
    pub run: RunOptions,
    /// Comma-separated device labels, or `all`.
    pub devices: Option<String>,
}

/// `chd probe d2d` as asked: `None` (or empty) = not given. `run.cpus` is unused: each
/// device runs from a CPU of its own NUMA node.
#[derive(Debug, Clone, Default)]
pub struct D2dRequest {
    pub run: RunOptions,
    /// Comma-separated device labels, or `all`.
    pub devices: Option<String>,
    /// Load profiles, one run per profile [default: the resumed run's, else `idle`].
    pub loads: Vec<String>,
}

/// `chd probe affinity`.
#[derive(Debug, Clone, Default)]
pub struct AffinityRequest {
    pub layer: Layer,
    pub cpus: Option<String>,
    pub out: Option<PathBuf>,
    pub format: Option<String>,
}
