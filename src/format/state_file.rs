//! `state.json`: what `chd serve` has measured, written atomically (temp file, fsync, rename,
//! fsync of the directory) after every window and read back at start. Plain records only:
//! the store turns them into its cells (`store::persist`), so this file's shape
//! changes only on purpose, with [`FORMAT_VERSION`].
//!
//! A save that fails (read-only directory, full disk) removes its temp file and leaves the
//! previous `state.json` as it was. A file that cannot be used is never overwritten unread:
//! [`set_aside`] renames it, by what is wrong with it, to `state.json.v<N>-<unix time>` (a
//! whole file of another format version: a newer chd's, after a downgrade) or
//! `state.json.corrupt-<unix time>` (anything else), never over an earlier one.

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

/// `reason` of a failed save, bounded, for `chd_state_save_errors_total`: the directory is
/// mounted read-only, the disk (or the quota) is full, the directory or file may not be
/// written, anything else.
pub const SAVE_ERROR_REASONS: [&str; 4] = ["read_only", "no_space", "permission", "other"];

impl StateWriteError {
    /// One of [`SAVE_ERROR_REASONS`], from the OS error's kind.
    pub fn reason(&self) -> &'static str {
        use std::io::ErrorKind;
        match self {
            StateWriteError::Write { source, .. } => match source.kind() {
                ErrorKind::ReadOnlyFilesystem => "read_only",
                ErrorKind::StorageFull | ErrorKind::QuotaExceeded => "no_space",
                ErrorKind::PermissionDenied => "permission",
                _ => "other",
            },
            StateWriteError::Encode(_) => "other",
        }
    }
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
    /// A state file of another format version (older, or a newer chd's).
    #[error("format version {found} (this chd reads version {FORMAT_VERSION})")]
    Version { found: String },
    /// JSON without a `version`: not a chd state file.
    #[error("no format version: not a chd state file ({shape})")]
    NoVersion { shape: &'static str },
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
    /// Same-device copy cells (absent in files written before the d2d probe).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub d2d: Vec<D2dCellRecord>,
    /// Ordered peer copy cells (absent in files written before `chd serve` sampled them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub p2p: Vec<P2pCellRecord>,
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

/// One same-device copy cell: a device and a size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct D2dCellRecord {
    pub device: String,
    pub size_bytes: u64,
    #[serde(flatten)]
    pub history: History,
}

/// One ordered peer copy cell: `src` to `dst`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct P2pCellRecord {
    pub src: String,
    pub dst: String,
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
/// is wrong, for the warning that sets the file aside: a file of another version is named
/// by its version even where its layout differs from this one.
pub fn decode(bytes: &[u8]) -> Result<StateFile, StateReadError> {
    let file: StateFile = match serde_json::from_slice(bytes) {
        Ok(file) => file,
        Err(e) => return Err(why_not_a_state_file(bytes).unwrap_or(StateReadError::Json(e))),
    };
    if file.version != FORMAT_VERSION {
        return Err(StateReadError::Version {
            found: file.version.to_string(),
        });
    }
    let finite = |h: &History| h.samples.iter().all(|s| s.bytes_per_second.is_finite());
    if let Some(c) = file.h2d.iter().find(|c| !finite(&c.history)) {
        return Err(StateReadError::NonFinite(format!(
            "cell cpu {} device {} size {} {}",
            c.cpu, c.device, c.size_bytes, c.direction
        )));
    }
    if let Some(c) = file.d2d.iter().find(|c| !finite(&c.history)) {
        return Err(StateReadError::NonFinite(format!(
            "d2d cell device {} size {}",
            c.device, c.size_bytes
        )));
    }
    if let Some(c) = file.p2p.iter().find(|c| !finite(&c.history)) {
        return Err(StateReadError::NonFinite(format!(
            "p2p cell {}>{}",
            c.src, c.dst
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

/// Why JSON that is not this version's state file is not one (only when that is the reason:
/// `None` for a version-1 file with a damaged field, or text that is not JSON at all). Runs
/// only on a file that failed to parse, so the whole tree it builds is built once, at start.
fn why_not_a_state_file(bytes: &[u8]) -> Option<StateReadError> {
    let value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    let shape = match &value {
        serde_json::Value::Object(map) => match map.get("version") {
            Some(v) if v.as_u64() == Some(FORMAT_VERSION.into()) => return None,
            Some(v) => {
                return Some(StateReadError::Version {
                    found: v.to_string(),
                })
            }
            None => "an object without one",
        },
        serde_json::Value::Array(_) => "an array",
        _ => "a single value",
    };
    Some(StateReadError::NoVersion { shape })
}

/// Write `dir/state.json` atomically ([`super::atomic_file`]): the old file stays whole until
/// the new one is on disk, and a write that fails (`EROFS`, `ENOSPC` half-way) removes its
/// temp file, so a full disk is not kept full by chd's own leftovers.
pub fn save(dir: &Path, file: &StateFile) -> Result<(), StateWriteError> {
    let path = state_path(dir);
    // Streamed through a buffer, not encoded whole first: at the seed's shape the JSON is
    // 14 MB, and one buffer that size per save made glibc keep 16 MiB blocks in the arena of
    // every pool thread a save ran on (tests/load.rs).
    super::atomic_file::write(&path, |f| {
        let mut out = std::io::BufWriter::with_capacity(1 << 16, f);
        serde_json::to_writer(&mut out, file).map_err(std::io::Error::from)?;
        out.flush()
    })
    .map_err(|source| StateWriteError::Write { path, source })
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

/// Rename a state file that cannot be used, for `problem`, to `state.json.v<N>-<now>` (a
/// file of format version N) or `state.json.corrupt-<now>`, so it is kept (for a newer chd,
/// or a post-mortem) and never read again. An earlier file set aside in the same second is
/// not replaced: the name gets `.1`, `.2`, ... Returns where it went, or why it could not
/// be moved (it then stays where it is).
pub fn set_aside(
    path: &Path,
    problem: &StateReadError,
    now: f64,
) -> Result<PathBuf, std::io::Error> {
    let kind = match problem {
        StateReadError::Version { found } if found.bytes().all(|b| b.is_ascii_digit()) => {
            format!("v{found}")
        }
        _ => "corrupt".to_string(),
    };
    let base = format!("{STATE_FILE}.{kind}-{}", now as u64);
    let moved_to = (0..)
        .map(|n| match n {
            0 => path.with_file_name(&base),
            n => path.with_file_name(format!("{base}.{n}")),
        })
        .find(|candidate| fs::symlink_metadata(candidate).is_err())
        .expect("an unused name");
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
            d2d: vec![],
            p2p: vec![],
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

    /// Issue 30: the temp file's name was fixed (`state.json.tmp`) and opened with a plain
    /// create, so a symlink there made chd write its state through it (and a FIFO hung the
    /// save). Now what is planted at the old name is left alone.
    #[test]
    fn a_symlink_or_fifo_at_the_old_temp_name_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, "precious").unwrap();
        let tmp = dir.path().join("state.json.tmp");
        std::os::unix::fs::symlink(&victim, &tmp).unwrap();
        save(dir.path(), &file()).unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
        assert!(fs::symlink_metadata(&tmp).unwrap().file_type().is_symlink());
        fs::remove_file(&tmp).unwrap();
        nix::unistd::mkfifo(&tmp, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
        let mut newer = file();
        newer.saved_at = 3.0;
        save(dir.path(), &newer).unwrap();
        assert_eq!(
            decode(&fs::read(state_path(dir.path())).unwrap()).unwrap(),
            newer
        );
        let mut names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["state.json", "state.json.tmp", "victim"]);
    }

    #[test]
    fn save_error_reasons_come_from_the_os_error() {
        use std::io::{Error, ErrorKind};
        let reason = |kind: ErrorKind| {
            StateWriteError::Write {
                path: "s".into(),
                source: Error::from(kind),
            }
            .reason()
        };
        assert_eq!(reason(ErrorKind::ReadOnlyFilesystem), "read_only");
        assert_eq!(reason(ErrorKind::StorageFull), "no_space");
        assert_eq!(reason(ErrorKind::QuotaExceeded), "no_space");
        assert_eq!(reason(ErrorKind::PermissionDenied), "permission");
        assert_eq!(reason(ErrorKind::Other), "other");
        let raw = |errno| {
            StateWriteError::Write {
                path: "s".into(),
                source: Error::from_raw_os_error(errno),
            }
            .reason()
        };
        assert_eq!(raw(libc::EROFS), "read_only");
        assert_eq!(raw(libc::ENOSPC), "no_space");
        assert_eq!(raw(libc::EDQUOT), "no_space");
        assert_eq!(raw(libc::EACCES), "permission");
        assert_eq!(raw(libc::EIO), "other");
        for r in [reason(ErrorKind::Other), raw(libc::EROFS)] {
            assert!(SAVE_ERROR_REASONS.contains(&r));
        }
    }

    #[test]
    fn files_of_other_versions_and_shapes_say_so() {
        let err = |text: &str| decode(text.as_bytes()).unwrap_err().to_string();
        // Another version is named even when its layout differs from version 1's.
        assert_eq!(
            err(r#"{"version":2,"cells":{"h2d":[]}}"#),
            "format version 2 (this chd reads version 1)"
        );
        assert_eq!(
            err(r#"{"version":0,"saved_at":1,"h2d":[],"bindable":[],"last_success":{}}"#),
            "format version 0 (this chd reads version 1)"
        );
        assert!(err(r#"{"version":"1","h2d":[]}"#).starts_with("format version \"1\""));
        assert_eq!(
            err(r#"{"saved_at":1,"h2d":[],"bindable":[],"last_success":{}}"#),
            "no format version: not a chd state file (an object without one)"
        );
        assert_eq!(
            err("[1, 2]"),
            "no format version: not a chd state file (an array)"
        );
        assert_eq!(
            err("17"),
            "no format version: not a chd state file (a single value)"
        );
        // Version 1 with a damaged field: serde's message, naming the field.
        let e = err(r#"{"version":1,"saved_at":1,"h2d":"x","bindable":[],"last_success":{}}"#);
        assert!(e.contains("invalid type"), "{e}");
        // A version 1 file from before the pair probe: no `pair`, no `cpu_numa`.
        let old = decode(br#"{"version":1,"saved_at":1,"h2d":[],"bindable":[],"last_success":{}}"#)
            .unwrap();
        assert!(old.pair.is_empty() && old.cpu_numa.is_empty());
    }

    #[test]
    fn set_aside_names_the_version_and_never_replaces_an_earlier_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = state_path(dir.path());
        let v2 = StateReadError::Version { found: "2".into() };
        let quoted = StateReadError::Version {
            found: "\"2\"".into(),
        };
        let bad = StateReadError::NoVersion { shape: "an array" };
        let mut moved = Vec::new();
        for (n, problem) in [&v2, &v2, &quoted, &bad, &bad].into_iter().enumerate() {
            fs::write(&path, format!("{n}")).unwrap();
            moved.push(set_aside(&path, problem, 1234.9).unwrap());
            assert!(!path.exists());
        }
        let names: Vec<_> = moved
            .iter()
            .map(|p| p.file_name().unwrap().to_str().unwrap().to_string())
            .collect();
        assert_eq!(
            names,
            [
                "state.json.v2-1234",
                "state.json.v2-1234.1",
                "state.json.corrupt-1234",
                "state.json.corrupt-1234.1",
                "state.json.corrupt-1234.2"
            ]
        );
        for (n, p) in moved.iter().enumerate() {
            assert_eq!(fs::read_to_string(p).unwrap(), n.to_string());
        }
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
