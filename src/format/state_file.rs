//! `state.json`: what `chd serve` has measured, written atomically (temp file, fsync, rename,
//! fsync of the directory) after every window and read back at start. Plain records only:
//! the store turns them into its cells (`store::persist`), so this file's shape
//! changes only on purpose, with [`FORMAT_VERSION`].

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// File name of the state file inside the state directory.
pub const STATE_FILE: &str = "state.json";
/// The layout version this chd writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// Why the state file could not be written.
#[derive(Debug, thiserror::Error)]
pub enum StateWriteError {
    #[error("cannot write state file {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot encode state: {0}")]
    Encode(#[from] serde_json::Error),
}

/// Why a state file cannot be used (it is then set aside).
#[derive(Debug, thiserror::Error)]
pub enum StateReadError {
    /// The file exists but could not be read.
    #[error("unreadable: {0}")]
    Unreadable(#[source] std::io::Error),
    /// Not the JSON of a state file (truncated, garbage, a field of the wrong type).
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("format version {found} (this chd reads {FORMAT_VERSION})")]
    Version { found: u32 },
    /// A cell whose sample is not a finite number: which one.
    #[error("{0} holds a non-finite sample")]
    NonFinite(String),
    /// A record whose field the store cannot use: which, and why.
    #[error("{record}: {problem}")]
    Field { record: String, problem: String },
}

/// The whole file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateFile {
    pub version: u32,
    /// Unix time of the save.
    pub saved_at: f64,
    /// Core x device copy cells.
    pub h2d: Vec<CopyCellRecord>,
    /// Affinity verdicts.
    pub bindable: Vec<BindableRecord>,
    /// Probe name -> unix time of the end of its last window that measured something.
    pub last_success: BTreeMap<String, f64>,
    /// Core-pair cells (absent in files written before the pair probe).
    #[serde(default)]
    pub pair: Vec<PairCellRecord>,
    /// CPU -> NUMA node of the measuring machine.
    #[serde(default)]
    pub cpu_numa: BTreeMap<u32, u32>,
}

/// One sample of a cell.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SampleRecord {
    pub bytes_per_second: f64,
    pub at: f64,
}

/// A cell's history, as every cell kind stores it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct History {
    pub samples: Vec<SampleRecord>,
    /// Unix time of the last attempt, successful or not.
    pub last_attempt: f64,
    /// Consecutive failed attempts since the last success.
    #[serde(default)]
    pub consecutive_errors: u32,
}

/// One core x device copy cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CopyCellRecord {
    pub cpu: u32,
    pub device: String,
    pub size_bytes: u64,
    /// `h2d` or `d2h`.
    pub direction: String,
    #[serde(flatten)]
    pub history: History,
}

/// One core-pair cell: rank 0 on `cpu0`, rank 1 on `cpu1`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairCellRecord {
    /// The device pair as the `pair` label spells it (`0,5`).
    pub pair: String,
    pub cpu0: u32,
    pub cpu1: u32,
    #[serde(flatten)]
    pub history: History,
}

/// One CPU's affinity verdict.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BindableRecord {
    pub cpu: u32,
    pub bindable: bool,
    pub at: f64,
}

/// Path of the state file in `dir`.
pub fn state_path(dir: &Path) -> PathBuf {
    dir.join(STATE_FILE)
}

/// The file's JSON.
pub fn encode(file: &StateFile) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(file)
}

/// Parse a state file: the JSON, the version, and every sample finite. The error says what
/// is wrong, for the warning that sets the file aside.
pub fn decode(bytes: &[u8]) -> Result<StateFile, StateReadError> {
    let file: StateFile = serde_json::from_slice(bytes)?;
    if file.version != FORMAT_VERSION {
        return Err(StateReadError::Version {
            found: file.version,
        });
    }
    let finite = |h: &History| h.samples.iter().all(|s| s.bytes_per_second.is_finite());
    if let Some(c) = file.h2d.iter().find(|c| !finite(&c.history)) {
        return Err(StateReadError::NonFinite(format!(
            "cell cpu {} device {} size {} {}",
            c.cpu, c.device, c.size_bytes, c.direction
        )));
    }
    if let Some(c) = file.pair.iter().find(|c| !finite(&c.history)) {
        return Err(StateReadError::NonFinite(format!(
            "pair cell {} cpu0 {} cpu1 {}",
            c.pair, c.cpu0, c.cpu1
        )));
    }
    Ok(file)
}

/// Write `dir/state.json` atomically.
pub fn save(dir: &Path, file: &StateFile) -> Result<(), StateWriteError> {
    let bytes = encode(file)?;
    let path = state_path(dir);
    let tmp = dir.join(format!("{STATE_FILE}.tmp"));
    let write_err = |source| StateWriteError::Write {
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

/// Read `dir/state.json`'s bytes: `None` when there is no state file yet.
pub fn read(dir: &Path) -> Result<Option<Vec<u8>>, StateReadError> {
    match fs::read(state_path(dir)) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StateReadError::Unreadable(e)),
    }
}

/// Whether the file at `path` is shaped like a state file (an object with `version` and
/// `h2d`), read only as far as it takes to see both keys, their values skipped and never
/// built: a large file of another kind (a ClusterHealthDetect recording) costs no copy.
pub fn looks_like(path: &Path) -> std::io::Result<bool> {
    /// Visits the top level and notes the two keys.
    struct Keys<'a>(&'a mut (bool, bool));

    impl<'de> serde::de::Visitor<'de> for Keys<'_> {
        type Value = ();

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object")
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<String>()? {
                match key.as_str() {
                    "version" => self.0 .0 = true,
                    "h2d" => self.0 .1 = true,
                    _ => {}
                }
                if *self.0 == (true, true) {
                    return Ok(());
                }
                map.next_value::<serde::de::IgnoredAny>()?;
            }
            Ok(())
        }
    }

    let file = File::open(path)?;
    let mut seen = (false, false);
    let mut de = serde_json::Deserializer::from_reader(std::io::BufReader::new(file));
    // Stopping early (or at text that is not JSON) is an error here; only the keys count.
    let _ = serde::Deserializer::deserialize_map(&mut de, Keys(&mut seen));
    Ok(seen == (true, true))
}

/// Rename a state file that cannot be used to `state.json.corrupt-<now>`, so it is kept for
/// a post-mortem and never read again. Returns where it went, or why it could not be moved
/// (it then stays where it is).
pub fn set_aside(path: &Path, now: f64) -> Result<PathBuf, std::io::Error> {
    let moved_to = path.with_file_name(format!("{STATE_FILE}.corrupt-{}", now as u64));
    fs::rename(path, &moved_to).map(|()| moved_to)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> StateFile {
        StateFile {
            version: FORMAT_VERSION,
            saved_at: 2.0,
            h2d: vec![CopyCellRecord {
                cpu: 1,
                device: "0".into(),
                size_bytes: 64 << 20,
                direction: "h2d".into(),
                history: History {
                    samples: vec![SampleRecord {
                        bytes_per_second: 2.5e10,
                        at: 1.0,
                    }],
                    last_attempt: 1.0,
                    consecutive_errors: 0,
                },
            }],
            bindable: vec![BindableRecord {
                cpu: 1,
                bindable: true,
                at: 1.0,
            }],
            last_success: BTreeMap::from([("h2d".into(), 1.5)]),
            pair: vec![],
            cpu_numa: BTreeMap::from([(1, 0)]),
        }
    }

    #[test]
    fn a_state_file_is_told_from_other_json_by_its_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.json");
        std::fs::write(&path, encode(&file()).unwrap()).unwrap();
        assert!(looks_like(&path).unwrap());
        for other in [
            r#"{"meta": {}, "metrics": [{"gbps": NaN}]}"#,
            r#"{"version": 1, "metrics": []}"#,
            "[1, 2]",
            "not json",
        ] {
            std::fs::write(&path, other).unwrap();
            assert!(!looks_like(&path).unwrap(), "{other}");
        }
        std::fs::write(&path, r#"{"h2d": [], "version": 1, "saved_at": "#).unwrap();
        assert!(
            looks_like(&path).unwrap(),
            "the keys decide; decode names the damage"
        );
        assert!(looks_like(&dir.path().join("missing.json")).is_err());
    }

    #[test]
    fn the_layout_is_the_one_version_1_files_have() {
        let text = String::from_utf8(encode(&file()).unwrap()).unwrap();
        assert_eq!(
            text,
            r#"{"version":1,"saved_at":2.0,"h2d":[{"cpu":1,"device":"0","size_bytes":67108864,"direction":"h2d","samples":[{"bytes_per_second":25000000000.0,"at":1.0}],"last_attempt":1.0,"consecutive_errors":0}],"bindable":[{"cpu":1,"bindable":true,"at":1.0}],"last_success":{"h2d":1.5},"pair":[],"cpu_numa":{"1":0}}"#
        );
        assert_eq!(decode(text.as_bytes()).unwrap(), file());
    }

    #[test]
    fn an_out_of_range_sample_is_refused() {
        let text = String::from_utf8(encode(&file()).unwrap())
            .unwrap()
            .replace("25000000000.0", "1e999");
        let err = decode(text.as_bytes()).unwrap_err().to_string();
        assert!(err.contains("out of range"), "{err}");
    }
}
