//! The store saved to and restored from the state file ([`crate::format::state_file`]) after
//! every window and at start. A file that cannot be used is renamed aside with a warning
//! (`state.json.v<N>-<unix time>` for a file of another format version,
//! `state.json.corrupt-<unix time>` for anything else); it never stops chd. Version 1 files
//! written before the pair probe (no `pair`, no `cpu_numa`) or the d2d probe (no `d2d`) or
//! the serve-time p2p cells (no `p2p`) are read as they are: those fields default to empty.

use std::path::{Path, PathBuf};

use super::{Bindable, Cell, CellKey, D2dKey, P2pKey, PairKey, Sample, Store};
use crate::format::state_file::{
    self, BindableRecord, CopyCellRecord, D2dCellRecord, History, P2pCellRecord, PairCellRecord,
    SampleRecord, StateFile, StateReadError, FORMAT_VERSION,
};
pub use crate::format::state_file::{state_path, StateWriteError as PersistError, STATE_FILE};

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

fn history(cell: &Cell) -> History {
    History {
        samples: cell
            .samples
            .iter()
            .map(|s| SampleRecord {
                bytes_per_second: s.bytes_per_second,
                at: s.at,
            })
            .collect(),
        last_attempt: cell.last_attempt,
        consecutive_errors: cell.consecutive_errors,
    }
}

fn cell(history: History) -> Cell {
    Cell {
        samples: history
            .samples
            .into_iter()
            .map(|s| Sample {
                bytes_per_second: s.bytes_per_second,
                at: s.at,
            })
            .collect(),
        last_attempt: history.last_attempt,
        consecutive_errors: history.consecutive_errors,
    }
}

/// The store as the state file's records.
pub fn to_file(store: &Store, saved_at: f64) -> StateFile {
    StateFile {
        version: FORMAT_VERSION,
        saved_at,
        h2d: store
            .h2d
            .iter()
            .map(|(key, c)| CopyCellRecord {
                cpu: key.cpu,
                device: key.device.clone(),
                size_bytes: key.size_bytes,
                direction: key.direction.as_str().to_string(),
                history: history(c),
            })
            .collect(),
        bindable: store
            .bindable
            .iter()
            .map(|(&cpu, v)| BindableRecord {
                cpu,
                bindable: v.bindable,
                at: v.at,
            })
            .collect(),
        last_success: store.last_success.clone(),
        pair: store
            .pair
            .iter()
            .map(|(key, c)| PairCellRecord {
                pair: key.pair.to_string(),
                cpu0: key.cpu0,
                cpu1: key.cpu1,
                history: history(c),
            })
            .collect(),
        cpu_numa: store.cpu_numa.clone(),
        d2d: store
            .d2d
            .iter()
            .map(|(key, c)| D2dCellRecord {
                device: key.device.clone(),
                size_bytes: key.size_bytes,
                history: history(c),
            })
            .collect(),
        p2p: store
            .p2p
            .iter()
            .map(|(key, c)| P2pCellRecord {
                src: key.src().to_string(),
                dst: key.dst().to_string(),
                history: history(c),
            })
            .collect(),
    }
}

/// The store the state file's records describe.
pub fn from_file(file: StateFile) -> Result<Store, StateReadError> {
    let mut store = Store::default();
    for c in file.h2d {
        let direction = c
            .direction
            .parse()
            .map_err(|problem| StateReadError::Field {
                record: format!("cell cpu {} device {}", c.cpu, c.device),
                problem,
            })?;
        let key = CellKey {
            cpu: c.cpu,
            device: c.device,
            size_bytes: c.size_bytes,
            direction,
        };
        store.h2d.insert(key, cell(c.history));
    }
    for b in file.bindable {
        store.bindable.insert(
            b.cpu,
            Bindable {
                bindable: b.bindable,
                at: b.at,
            },
        );
    }
    for c in file.pair {
        let key = PairKey {
            pair: c
                .pair
                .parse()
                .map_err(|e: crate::vocab::ParseError| StateReadError::Field {
                    record: format!("pair cell {} cpus {},{}", c.pair, c.cpu0, c.cpu1),
                    problem: e.to_string(),
                })?,
            cpu0: c.cpu0,
            cpu1: c.cpu1,
        };
        store.pair.insert(key, cell(c.history));
    }
    for c in file.d2d {
        let key = D2dKey {
            device: c.device,
            size_bytes: c.size_bytes,
        };
        store.d2d.insert(key, cell(c.history));
    }
    for c in file.p2p {
        let label = format!("{}>{}", c.src, c.dst);
        let key: P2pKey =
            label
                .parse()
                .map_err(|e: crate::vocab::ParseError| StateReadError::Field {
                    record: format!("p2p cell {label}"),
                    problem: e.to_string(),
                })?;
        store.p2p.insert(key, cell(c.history));
    }
    store.last_success = file.last_success;
    store.cpu_numa = file.cpu_numa;
    Ok(store)
}

/// Decode a state file's JSON.
pub fn decode(bytes: &[u8]) -> Result<Store, StateReadError> {
    from_file(state_file::decode(bytes)?)
}

/// Write the store to `dir/state.json` atomically.
pub fn save(dir: &Path, store: &Store, saved_at: f64) -> Result<(), PersistError> {
    state_file::save(dir, &to_file(store, saved_at))
}

/// Read `dir/state.json`. A corrupt file is renamed aside and reported, never an error.
pub fn load(dir: &Path, now: f64) -> Loaded {
    let problem = match state_file::read(dir) {
        Ok(None) => return Loaded::Missing,
        Ok(Some(bytes)) => match decode(&bytes) {
            Ok(store) => return Loaded::Restored(store),
            Err(problem) => problem,
        },
        Err(problem) => problem,
    };
    let path = state_path(dir);
    match state_file::set_aside(&path, &problem, now) {
        Ok(moved_to) => Loaded::SetAside {
            moved_to,
            problem: problem.to_string(),
        },
        Err(e) => Loaded::SetAside {
            moved_to: path,
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

/// Create `dir` if needed and check that files can be created in it, as saves create them
/// (`format::atomic_file`: a random name, never through a planted symlink or FIFO).
fn ensure_writable(dir: &Path) -> std::io::Result<()> {
    crate::format::atomic_file::check_writable(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Sample;
    use crate::vocab::Direction;
    use std::fs;

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
        s.record_sample(
            PairKey {
                pair: "0,1".parse().unwrap(),
                cpu0: 0,
                cpu1: 1,
            },
            Sample {
                bytes_per_second: 13.7e9,
                at: 100.0,
            },
            5,
        );
        s.record_sample(
            D2dKey {
                device: "numa0".into(),
                size_bytes: 64 << 20,
            },
            Sample {
                bytes_per_second: 9e9,
                at: 100.0,
            },
            5,
        );
        s.record_sample(
            "numa0>numa1".parse::<P2pKey>().unwrap(),
            Sample {
                bytes_per_second: 5e9,
                at: 100.0,
            },
            5,
        );
        s
    }

    #[test]
    fn a_file_from_before_the_p2p_cells_loads_without_them() {
        let mut file = to_file(&sample_store(), 1.0);
        assert_eq!(file.p2p.len(), 1);
        file.p2p.clear();
        let text = String::from_utf8(state_file::encode(&file).unwrap()).unwrap();
        assert!(!text.contains("\"p2p\""), "{text}");
        let store = from_file(state_file::decode(text.as_bytes()).unwrap()).unwrap();
        assert!(store.p2p.is_empty());
        assert_eq!(store.d2d.len(), 1);
    }

    #[test]
    fn a_file_from_before_the_d2d_probe_loads_without_d2d_cells() {
        let mut file = to_file(&sample_store(), 1.0);
        assert_eq!(file.d2d.len(), 1);
        file.d2d.clear();
        let text = String::from_utf8(state_file::encode(&file).unwrap()).unwrap();
        assert!(!text.contains("\"d2d\""), "{text}");
        let store = from_file(state_file::decode(text.as_bytes()).unwrap()).unwrap();
        assert!(store.d2d.is_empty());
        assert_eq!(store.h2d.len(), 4);
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
        let bytes = state_file::encode(&to_file(&sample_store(), 1.0)).unwrap();
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
        match load(dir.path(), 7.0) {
            Loaded::SetAside { moved_to, problem } => {
                assert_eq!(moved_to, dir.path().join("state.json.v99-7"));
                assert!(moved_to.exists());
                assert_eq!(problem, "format version 99 (this chd reads version 1)");
            }
            other => panic!("expected SetAside, got {other:?}"),
        }
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
