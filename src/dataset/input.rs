//! Loading what a user points `chd report`, `chd serve --replay` and the ledger at into a
//! [`Dataset`]: a chd run directory (`run.json` + `cells.jsonl`, and `affinity.json` if
//! present), a ClusterHealthDetect run directory or one of its files, or a `run.json`. What
//! cannot be used is refused with the reason, never read as an empty dataset.

use std::path::{Path, PathBuf};

use super::Dataset;
use crate::format::affinity_file::{self, AffinityFileError, AFFINITY_FILE};
use crate::format::cluster_health;
use crate::format::run_dir::{self, RunDirError};

/// Why an input could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Run(#[from] RunDirError),
    #[error(transparent)]
    Affinity(#[from] AffinityFileError),
    #[error(transparent)]
    ClusterHealth(#[from] cluster_health::Error),
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
        let rec = cluster_health::read(input)?;
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
