//! Loading what a user points `chd report`, `chd serve --replay` and the ledger at into a
//! [`Dataset`]: a chd run directory (`run.json` + `cells.jsonl`, and `affinity.json` if
//! present), a ClusterHealthDetect run directory or one of its files, one of its xlsx
//! workbooks, size-sweep JSON or CSV files (several at once: [`load_all`]), or a
//! `run.json`. What cannot be used is refused with the reason, never read as an empty
//! dataset.

use std::path::{Path, PathBuf};

use super::Dataset;
use crate::format::affinity_file::{self, AffinityFileError, AFFINITY_FILE};
use crate::format::cluster_health;
use crate::format::cluster_health_workbook::{self, WorkbookError};
use crate::format::run_dir::{self, RunDirError};
use crate::format::size_sweep::{self, SweepError};

/// What `chd report` and the other readers take, for messages.
pub const ACCEPTED: &str = "a chd run directory or its run.json; a ClusterHealthDetect run \
     directory or its results.json, rank_NNNNN.json or partial checkpoint; a \
     ClusterHealthDetect xlsx workbook (H2D matrix, core-pair or NUMA affinity); size-sweep \
     JSON ({\"rows\": [...]}) or CSV (series,size_mb,gbps,iters,avg_seconds) files";

/// Why an input could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Run(#[from] RunDirError),
    #[error(transparent)]
    Affinity(#[from] AffinityFileError),
    #[error(transparent)]
    ClusterHealth(#[from] cluster_health::Error),
    /// A file that is none of the shapes chd reads: the reader's reason, then what chd takes.
    #[error("{reason}; chd reads {ACCEPTED}")]
    Unrecognised { reason: String },
    #[error(transparent)]
    Workbook(#[from] WorkbookError),
    #[error("{path}: {detail}")]
    Unusable { path: PathBuf, detail: String },
    #[error(transparent)]
    Sweep(#[from] SweepError),
    #[error(
        "{path}: several inputs are read together only when each is a size-sweep file (JSON \
         or CSV); this one is not (give it alone)"
    )]
    NotASweep { path: PathBuf },
    #[error(
        "{0}: nothing to report (no {run}, results.json or {AFFINITY_FILE}) and no other \
         ClusterHealthDetect file (rank_NNNNN.json, partial_results.json, \
         rank_NNNNN_partial.json)",
        run = run_dir::RUN_FILE
    )]
    Nothing(PathBuf),
    #[error("{path}: {detail}")]
    Read { path: PathBuf, detail: String },
}

fn read_affinity(path: &Path) -> Result<Vec<(u32, bool)>, LoadError> {
    let rows = affinity_file::read(path)?;
    Ok(rows.into_iter().map(|r| (r.cpu, r.bindable)).collect())
}

/// Load what `input` holds: a chd run directory (`run.json` + `cells.jsonl`, and
/// `affinity.json` if present), a ClusterHealthDetect run directory or one of its files
/// (see [`cluster_health::read`]), or a `run.json` file. Returns the dataset and the
/// directory reports go to by default.
pub fn load(input: &Path) -> Result<(Dataset, PathBuf), LoadError> {
    if input.is_file() {
        let dir = input.parent().unwrap_or(Path::new(".")).to_path_buf();
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        if input.file_name().is_some_and(|n| n == run_dir::RUN_FILE) {
            return load(&dir);
        }
        if cluster_health_workbook::looks_like_workbook(input) {
            let wb = cluster_health_workbook::read(input)?;
            let ds = super::workbook::dataset(wb).map_err(|detail| LoadError::Unusable {
                path: input.into(),
                detail,
            })?;
            return Ok((ds, dir));
        }
        if is_sweep_file(input) {
            let file = size_sweep::read(input)?;
            return Ok((super::sweep_files::dataset(&[(input, file)]), dir));
        }
        let rec = cluster_health::read(input).map_err(|e| match e {
            cluster_health::Error::Json { .. } | cluster_health::Error::Shape { .. } => {
                LoadError::Unrecognised {
                    reason: e.to_string(),
                }
            }
            e => e.into(),
        })?;
        return Ok((Dataset::from_recording(rec), dir));
    }
    if !input.is_dir() {
        return Err(LoadError::Read {
            path: input.into(),
            detail: "no such file or directory".into(),
        });
    }
    if !input.join(run_dir::RUN_FILE).is_file() {
        match cluster_health::read(input) {
            Ok(rec) => return Ok((Dataset::from_recording(rec), input.to_path_buf())),
            Err(cluster_health::Error::NoRecording(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let affinity_path = input.join(AFFINITY_FILE);
    let affinity = if affinity_path.is_file() {
        read_affinity(&affinity_path)?
    } else {
        Vec::new()
    };
    let mut ds = if input.join(run_dir::RUN_FILE).is_file() {
        let (run, records) = run_dir::read_run(input)?;
        Dataset::from_run(&run, &records)
    } else if !affinity.is_empty() {
        Dataset {
            source: format!("chd probe affinity ({})", affinity_path.display()),
            ..Dataset::default()
        }
    } else {
        return Err(LoadError::Nothing(input.into()));
    };
    ds.affinity = affinity;
    Ok((ds, input.to_path_buf()))
}

/// Whether `path`'s text is a size-sweep file (its first bytes decide).
fn is_sweep_file(path: &Path) -> bool {
    use std::io::Read;
    let mut head = Vec::new();
    let read = std::fs::File::open(path).and_then(|f| f.take(4096).read_to_end(&mut head));
    read.is_ok() && size_sweep::is_sweep(&String::from_utf8_lossy(&head))
}

/// Load several inputs as one dataset: one input is [`load`]; several must each be a
/// size-sweep file, and their curves share one report (the first file's directory).
pub fn load_all(inputs: &[PathBuf]) -> Result<(Dataset, PathBuf), LoadError> {
    match inputs {
        [] => Err(LoadError::Read {
            path: PathBuf::new(),
            detail: "no input".into(),
        }),
        [one] => load(one),
        several => {
            let mut files = Vec::new();
            for path in several {
                if !path.is_file() || !is_sweep_file(path) {
                    return Err(LoadError::NotASweep { path: path.clone() });
                }
                files.push((path.as_path(), size_sweep::read(path)?));
            }
            let dir = several[0]
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
                .to_path_buf();
            Ok((super::sweep_files::dataset(&files), dir))
        }
    }
}
