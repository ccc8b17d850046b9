//! `affinity.json` as `chd probe affinity --out DIR` writes it: one verdict per CPU (its NUMA
//! node, whether a thread could really be bound there). Not ClusterHealthDetect's file of the
//! same name, which [`super::cluster_health`] reads.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// File name inside a run directory.
pub const AFFINITY_FILE: &str = "affinity.json";

/// One CPU's affinity verdict as stored in `affinity.json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AffinityRow {
    pub cpu: u32,
    pub numa_node: Option<u32>,
    pub bindable: bool,
}

/// Why `affinity.json` could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum AffinityFileError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// The rows as the file holds them (pretty JSON, one object per CPU).
pub fn encode(rows: &[AffinityRow]) -> String {
    // A Vec of plain structs always serialises.
    serde_json::to_string_pretty(rows).unwrap_or_default()
}

/// Read `path`.
pub fn read(path: &Path) -> Result<Vec<AffinityRow>, AffinityFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| AffinityFileError::Io {
        path: path.into(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| AffinityFileError::Json {
        path: path.into(),
        source,
    })
}

/// Write `DIR/affinity.json` (creating `dir`), returning its path.
pub fn write(dir: &Path, rows: &[AffinityRow]) -> Result<PathBuf, AffinityFileError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| AffinityFileError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let path = dir.join(AFFINITY_FILE);
    std::fs::write(&path, encode(rows) + "\n").map_err(io(&path))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_and_garbage_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let rows = [
            AffinityRow {
                cpu: 0,
                numa_node: Some(0),
                bindable: true,
            },
            AffinityRow {
                cpu: 3,
                numa_node: None,
                bindable: false,
            },
        ];
        let path = write(&dir.path().join("run"), &rows).unwrap();
        assert_eq!(read(&path).unwrap(), rows);
        std::fs::write(&path, "[{\"cpu\": 1}]").unwrap();
        let err = read(&path).unwrap_err().to_string();
        assert!(
            err.contains("affinity.json") && err.contains("bindable"),
            "{err}"
        );
    }
}
