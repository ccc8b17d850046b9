//! The state file: the store written atomically (temp file, fsync, rename, fsync of the
//! directory) after every window and read back at start. A file that does not parse is
//! renamed aside (`state.json.corrupt-<unix time>`) with a warning; it never stops chd.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Bindable, Cell, CellKey, PairKey, Store};

/// File name of the state file inside the state directory.
pub const STATE_FILE: &str = "state.json";
const FORMAT_VERSION: u32 = 1;

/// Why the state could not be saved (loading never fails: see [`load`]).
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    #[error("cannot write state file {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot encode state: {0}")]
    Encode(#[from] serde_json::Error),
}

#[derive(Serialize, Deserialize)]
struct StateFile {
    version: u32,
    saved_at: f64,
    h2d: Vec<PersistedCell>,
    bindable: Vec<PersistedBindable>,
    last_success: std::collections::BTreeMap<String, f64>,
    /// Core-pair cells (absent in files written before the pair probe).
    #[serde(default)]
    pair: Vec<PersistedPairCell>,
    /// CPU -> NUMA node of the measuring machine.
    #[serde(default)]
    cpu_numa: std::collections::BTreeMap<u32, u32>,
}

#[derive(Serialize, Deserialize)]
struct PersistedPairCell {
    #[serde(flatten)]
    key: PairKey,
    #[serde(flatten)]
    cell: Cell,
}

#[derive(Serialize, Deserialize)]
struct PersistedCell {
    #[serde(flatten)]
    key: CellKey,
    #[serde(flatten)]
    cell: Cell,
}

#[derive(Serialize, Deserialize)]
struct PersistedBindable {
    cpu: u32,
    #[serde(flatten)]
    verdict: Bindable,
}

/// What [`load`] found.
#[derive(Debug, PartialEq)]
pub enum Loaded {
    /// No state file yet.
    Missing,
    /// A valid state file.
    Restored(Store),
    /// The file did not parse and was moved to the given path.
    SetAside { moved_to: PathBuf, problem: String },
}

/// Path of the state file in `dir`.
pub fn state_path(dir: &Path) -> PathBuf {
    dir.join(STATE_FILE)
}

/// Encode the store as the state file's JSON.
pub fn encode(store: &Store, saved_at: f64) -> Result<Vec<u8>, PersistError> {
    let file = StateFile {
        version: FORMAT_VERSION,
        saved_at,
        h2d: store
            .h2d
            .iter()
            .map(|(key, cell)| PersistedCell {
                key: key.clone(),
                cell: cell.clone(),
            })
            .collect(),
        bindable: store
            .bindable
            .iter()
            .map(|(&cpu, &verdict)| PersistedBindable { cpu, verdict })
            .collect(),
        last_success: store.last_success.clone(),
        pair: store
            .pair
            .iter()
            .map(|(key, cell)| PersistedPairCell {
                key: key.clone(),
                cell: cell.clone(),
            })
            .collect(),
        cpu_numa: store.cpu_numa.clone(),
    };
    Ok(serde_json::to_vec(&file)?)
}

/// Decode a state file's JSON.
pub fn decode(bytes: &[u8]) -> Result<Store, String> {
    let file: StateFile = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    if file.version != FORMAT_VERSION {
        return Err(format!(
            "format version {} (this chd reads {FORMAT_VERSION})",
            file.version
        ));
    }
    let mut store = Store::default();
    for PersistedCell { key, cell } in file.h2d {
        if cell.samples.iter().any(|s| !s.bytes_per_second.is_finite()) {
            return Err(format!("cell {key:?} holds a non-finite sample"));
        }
        store.h2d.insert(key, cell);
    }
    for PersistedBindable { cpu, verdict } in file.bindable {
        store.bindable.insert(cpu, verdict);
    }
    for PersistedPairCell { key, cell } in file.pair {
        if cell.samples.iter().any(|s| !s.bytes_per_second.is_finite()) {
            return Err(format!("pair cell {key:?} holds a non-finite sample"));
        }
        store.pair.insert(key, cell);
    }
    store.last_success = file.last_success;
    store.cpu_numa = file.cpu_numa;
    Ok(store)
}

/// Write the store to `dir/state.json` atomically.
pub fn save(dir: &Path, store: &Store, saved_at: f64) -> Result<(), PersistError> {
    let bytes = encode(store, saved_at)?;
    let path = state_path(dir);
    let tmp = dir.join(format!("{STATE_FILE}.tmp"));
    let write_err = |source| PersistError::Write {
        path: path.clone(),
        source,
    };
    let mut f = File::create(&tmp).map_err(write_err)?;
    f.write_all(&bytes).map_err(write_err)?;
    f.sync_all().map_err(write_err)?;
    drop(f);
    fs::rename(&tmp, &path).map_err(write_err)?;
    // Make the rename itself durable.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Read `dir/state.json`. A corrupt file is renamed aside and reported, never an error.
pub fn load(dir: &Path, now: f64) -> Loaded {
    let path = state_path(dir);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Loaded::Missing,
        Err(e) => return set_aside(&path, format!("unreadable: {e}"), now),
    };
    match decode(&bytes) {
        Ok(store) => Loaded::Restored(store),
        Err(problem) => set_aside(&path, problem, now),
    }
}

fn set_aside(path: &Path, problem: String, now: f64) -> Loaded {
    let moved_to = path.with_file_name(format!("{STATE_FILE}.corrupt-{}", now as u64));
    match fs::rename(path, &moved_to) {
        Ok(()) => Loaded::SetAside { moved_to, problem },
        Err(e) => Loaded::SetAside {
            moved_to: path.to_path_buf(),
            problem: format!("{problem}; could not rename it aside either: {e}"),
        },
    }
}

/// Pick the state directory: `preferred` when it can be created and written, else
/// `fallback`. Returns the directory and, when falling back, why.
pub fn choose_state_dir(
    preferred: &Path,
    fallback: &Path,
) -> std::io::Result<(PathBuf, Option<String>)> {
    match ensure_writable(preferred) {
        Ok(()) => Ok((preferred.to_path_buf(), None)),
        Err(why) => {
            ensure_writable(fallback)?;
            Ok((
                fallback.to_path_buf(),
                Some(format!("{} is not writable ({why})", preferred.display())),
            ))
        }
    }
}

fn ensure_writable(dir: &Path) -> std::io::Result<()> {
    fs::create_dir_all(dir)?;
    let probe = dir.join(".chd-write-test");
    File::create(&probe)?;
    fs::remove_file(&probe)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Direction;
    use crate::store::Sample;

    fn sample_store() -> Store {
        let mut s = Store::default();
        for cpu in 0..4 {
            s.record_sample(
                CellKey {
                    cpu,
                    device: "numa0".into(),
                    size_bytes: 64 << 20,
                    direction: Direction::H2d,
                },
                Sample {
                    bytes_per_second: 1e10 + cpu as f64,
                    at: 100.0,
                },
                5,
            );
        }
        s.record_bindable(&[(0, true), (1, false)], 100.0);
        s.record_success("h2d", 101.0);
        s.record_pair_sample(
            PairKey {
                pair: "0,1".into(),
                cpu0: 0,
                cpu1: 1,
            },
            Sample {
                bytes_per_second: 13.7e9,
                at: 100.0,
            },
            5,
        );
        s
    }

    #[test]
    fn save_then_load_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let store = sample_store();
        save(dir.path(), &store, 102.0).unwrap();
        assert_eq!(load(dir.path(), 103.0), Loaded::Restored(store));
        assert!(!dir.path().join("state.json.tmp").exists());
    }

    #[test]
    fn missing_file_is_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path(), 1.0), Loaded::Missing);
    }

    #[test]
    fn truncated_file_is_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = encode(&sample_store(), 1.0).unwrap();
        fs::write(state_path(dir.path()), &bytes[..bytes.len() / 2]).unwrap();
        match load(dir.path(), 1234.0) {
            Loaded::SetAside { moved_to, problem } => {
                assert_eq!(moved_to, dir.path().join("state.json.corrupt-1234"));
                assert!(moved_to.exists());
                assert!(!state_path(dir.path()).exists());
                assert!(problem.contains("EOF"), "{problem}");
            }
            other => panic!("expected SetAside, got {other:?}"),
        }
    }

    #[test]
    fn future_format_version_is_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            state_path(dir.path()),
            br#"{"version":99,"saved_at":0,"h2d":[],"bindable":[],"last_success":{}}"#,
        )
        .unwrap();
        assert!(matches!(load(dir.path(), 1.0), Loaded::SetAside { .. }));
    }

    #[test]
    fn unwritable_preferred_dir_falls_back() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        fs::write(&blocker, b"").unwrap();
        let (chosen, why) =
            choose_state_dir(&blocker.join("sub"), &dir.path().join("fallback")).unwrap();
        assert_eq!(chosen, dir.path().join("fallback"));
        assert!(why.is_some());
    }
}
