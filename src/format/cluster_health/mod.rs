//! ClusterHealthDetect recordings, read as the public tool writes them
//! (`cluster_health_detect/core_h2d_matrix.py`, `core_pair_d2d_matrix.py`, `affinity.py`,
//! `benchmark.py:write_json`: `json.dumps(payload, indent=2, sort_keys=True)`).
//!
//! A run directory `results/<run>/` holds:
//! - `results.json` = `{"meta": {...}, "metrics": [...]}`, written when the run ends;
//! - while it runs, `partial_results.json` (H2D runs: `meta.partial = true`,
//!   `meta.last_completed_cpu`) or `rank_NNNNN_partial.json` per rank (pair runs:
//!   `meta.completed_pairs_per_rank`, `meta.last_rank0_cpu`, `meta.last_rank1_cpu`);
//! - pair runs also write `rank_NNNNN.json` per rank at the end (rank 0's `results.json` is
//!   their merge);
//! - `affinity.json` = `{"created_at", "summary", "cpus": [{cpu, online, allowed, bindable,
//!   numa_node, socket_id, core_id, thread_siblings, reason}]}`.
//!
//! [`read`] takes a directory (preferring `results.json`, then the per-rank files, then the
//! partial checkpoints, and saying when only a partial one exists) or one file, and returns a
//! [`Recording`]: every sample chd can use, in chd's vocabulary, and every row it cannot use,
//! counted by reason. A recording without a single usable sample is an error, never an
//! empty result. The row vocabulary is mapped in `rows`.

mod affinity;
mod document;
pub(crate) mod python_floats;
mod row;
mod rows;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

pub use super::MatrixKind;
pub use affinity::RecordedCpu;

/// ClusterHealthDetect's final results file.
pub const RESULTS_FILE: &str = "results.json";
/// The H2D matrix's checkpoint while it runs.
pub const PARTIAL_FILE: &str = "partial_results.json";
/// The CPU records written beside the results.
pub const AFFINITY_FILE: &str = "affinity.json";

/// Why a recording could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The parser's message is in the text once, not also as a source (printed twice).
    #[error("{path}: not JSON: {error}")]
    Json {
        path: PathBuf,
        error: serde_json::Error,
    },
    #[error("{path}: not a ClusterHealthDetect results file: {problem}")]
    Shape { path: PathBuf, problem: String },
    #[error(
        "{0}: no ClusterHealthDetect recording (looked for {RESULTS_FILE}, rank_NNNNN.json, \
         {PARTIAL_FILE} and rank_NNNNN_partial.json)"
    )]
    NoRecording(PathBuf),
    #[error("{path}: no matrix cells: {detail}")]
    NoCells { path: PathBuf, detail: String },
}

/// Where a sample's failure happened, in `chd_probe_errors_total`'s words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FailureKind {
    /// The tool could not bind to the cell's CPU (`operation: bind_cpu`).
    Bind,
    /// The copy raised (`operation: copy`).
    Copy,
    /// The collective raised (`operation: all_gather`).
    Collective,
}

impl FailureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Bind => "bind",
            FailureKind::Copy => "copy",
            FailureKind::Collective => "collective",
        }
    }
}

/// A failed sample: what failed and the tool's own words.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub kind: FailureKind,
    pub message: String,
}

/// One sample of one cell, in chd's vocabulary.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedSample {
    pub matrix: MatrixKind,
    /// Load profile (`idle` unless the row says otherwise).
    pub load: String,
    /// The H2D probing CPU, or rank 0's CPU.
    pub cpu: u32,
    /// Rank 1's CPU (pair samples).
    pub peer_cpu: Option<u32>,
    /// Device id (`"3"`) or device pair, ascending (`"0,5"`).
    pub device: String,
    pub size_bytes: u64,
    /// `h2d` or `d2h` (H2D matrix); `allgather` (pair matrix).
    pub direction: String,
    /// `pinned`, `pageable` or `unspecified`.
    pub host_memory: String,
    /// Bytes per second, or why the sample failed.
    pub outcome: Result<f64, Failure>,
}

/// Rows that could not be used, for one reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    pub reason: String,
    pub count: usize,
    /// Where the first such row is, e.g. `results.json metrics[12]`.
    pub first: String,
}

/// Everything a recording holds that chd can use.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recording {
    /// The files read, in the order read.
    pub files: Vec<PathBuf>,
    /// Set when only a partial checkpoint exists: how far the run got.
    pub partial: Option<String>,
    /// Descriptive facts from `meta` (host, device kind, times, CPUs, sizes, command line).
    pub meta: Vec<(String, String)>,
    /// NUMA node -> CPUs, from `meta.affinity_summary` and `affinity.json`.
    pub numa_nodes: BTreeMap<u32, Vec<u32>>,
    /// The CPU records of `affinity.json`, when it exists.
    pub cpus: Vec<RecordedCpu>,
    /// Devices the recording names (`meta.device_ids`, else those its rows name).
    pub devices: Vec<String>,
    /// `npu` or `cuda` (`meta.device_kind`), when known.
    pub device_kind: Option<String>,
    pub samples: Vec<RecordedSample>,
    /// Matrix rows that could not be used, by reason, most frequent first.
    pub rejected: Vec<Rejected>,
    /// Rows of other tests (not matrices), by test name.
    pub other_tests: BTreeMap<String, usize>,
    /// Things the reader did that a reader of the report should know.
    pub notes: Vec<String>,
}

/// Rows not used, in all: `3 rows not used: no host_cpu x2 (first: results.json metrics[4]);
/// ...`, or `None` when every matrix row was used.
pub fn rejected_summary(rejected: &[Rejected]) -> Option<String> {
    if rejected.is_empty() {
        return None;
    }
    let reasons: Vec<String> = rejected
        .iter()
        .map(|r| format!("{} x{} (first: {})", r.reason, r.count, r.first))
        .collect();
    let n: usize = rejected.iter().map(|r| r.count).sum();
    Some(format!(
        "{n} row{} not used: {}",
        if n == 1 { "" } else { "s" },
        reasons.join("; ")
    ))
}

/// Read a recording: a run directory or one of its files. A file's directory also lends its
/// `affinity.json`. The files stream row by row: neither their text nor a tree of their rows
/// is ever held whole.
pub fn read(path: &Path) -> Result<Recording, Error> {
    let mut rows = rows::Interpreter::default();
    let (docs, partial, dir) = if path.is_dir() {
        let chosen = document::choose(path)?;
        let docs = chosen
            .files
            .iter()
            .map(|f| document::read(f, &mut rows))
            .collect::<Result<Vec<_>, _>>()?;
        (docs, chosen.partial, path.to_path_buf())
    } else {
        let doc = document::read(path, &mut rows)?;
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        (vec![doc], false, dir)
    };
    let affinity_path = dir.join(AFFINITY_FILE);
    let affinity = if affinity_path.is_file() && affinity_path != path {
        Some(affinity::read(&affinity_path)?)
    } else {
        None
    };
    let mut rec = from_documents(&docs, partial, rows)?;
    if let Some(cpus) = affinity {
        rec.files.push(affinity_path);
        affinity::merge_numa(&mut rec.numa_nodes, &cpus);
        rec.cpus = cpus;
    }
    Ok(rec)
}

/// Give `rec` CPU records read elsewhere (a workbook's `Affinity` sheet): their NUMA nodes
/// fill the layout where the recording has none.
pub fn add_cpus(rec: &mut Recording, cpus: Vec<RecordedCpu>) {
    affinity::merge_numa(&mut rec.numa_nodes, &cpus);
    rec.cpus = cpus;
}

/// Parse one results document from text (`label` names it in messages).
pub fn parse(text: &str, label: &str) -> Result<Recording, Error> {
    let mut rows = rows::Interpreter::default();
    let doc = document::parse(text, Path::new(label), &mut rows)?;
    from_documents(&[doc], false, rows)
}

fn from_documents(
    docs: &[document::Document],
    partial_by_name: bool,
    rows: rows::Interpreter,
) -> Result<Recording, Error> {
    let first = &docs[0];
    let meta = &first.meta;
    let mut rec = Recording {
        files: docs.iter().map(|d| d.path.clone()).collect(),
        meta: document::facts(meta),
        numa_nodes: document::numa_nodes(meta),
        device_kind: meta
            .get("device_kind")
            .and_then(Value::as_str)
            .map(str::to_string),
        ..Recording::default()
    };
    let partial_meta = meta.get("partial").and_then(Value::as_bool) == Some(true);
    if partial_by_name || partial_meta {
        rec.partial = Some(document::progress(&first.path, meta));
    }
    let interpreted = rows.finish();
    rec.samples = interpreted.samples;
    rec.rejected = interpreted.rejected;
    rec.other_tests = interpreted.other_tests;
    rec.devices = interpreted.devices;
    rec.notes = interpreted.notes;
    if rec.samples.is_empty() {
        let path = first.path.clone();
        let detail = match rejected_summary(&rec.rejected) {
            Some(summary) => summary,
            None if rec.other_tests.is_empty() => "0 matrix rows".to_string(),
            None => format!(
                "no core_h2d_matrix or core_pair_d2d_matrix rows, only {}",
                other_tests_text(&rec.other_tests)
            ),
        };
        return Err(Error::NoCells { path, detail });
    }
    Ok(rec)
}

/// `h2d x3, d2d x3`.
pub fn other_tests_text(tests: &BTreeMap<String, usize>) -> String {
    tests
        .iter()
        .map(|(t, n)| format!("{t} x{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod stream_tests;
#[cfg(test)]
mod tests;
