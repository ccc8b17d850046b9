//! The fabric probe's results as a node keeps them: `<state_dir>/fabric/<run>__<peer>.json`,
//! one file per run and peer node, written whole (`atomic_file`) by the node's local rank 0 of
//! `chd probe fabric` and read by `chd serve`'s fabric collector at each scrape. Plain records:
//! what each rail carried to and from the peer, and how the run ended.
//!
//! The directory keeps the last [`KEEP_PER_PEER`] runs of each peer (older files are removed
//! when a new one is written), so what `chd serve` reads stays bounded at fleet scale.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The `schema` of the records written now.
pub const SCHEMA: u32 = 1;

/// Runs kept per peer node.
pub const KEEP_PER_PEER: usize = 8;

/// The subdirectory of the state directory.
pub const DIR: &str = "fabric";

/// How a run ended for this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Every rank arrived and every rail was measured (a rail may still have failed: see
    /// its `error`).
    Ok,
    /// The run stopped before its results were gathered (a rank missing, refused or dead).
    Failed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Failed => "failed",
        }
    }
}

/// Which way a rail's bytes went, seen from the node of the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Way {
    /// From this node to the peer.
    Send,
    /// From the peer to this node.
    Receive,
}

impl Way {
    pub fn as_str(self) -> &'static str {
        match self {
            Way::Send => "send",
            Way::Receive => "receive",
        }
    }
}

/// One rail in one direction between this node and the peer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RailRecord {
    /// The local rail: a network interface (`eth1`) or an RDMA port (`mlx5_0:1`).
    pub rail: String,
    /// Its address (`10.0.1.2`).
    pub address: String,
    /// The peer's rail in the same subnet, when it has one.
    pub peer_rail: Option<String>,
    pub peer_address: Option<String>,
    #[serde(rename = "direction")]
    pub way: Way,
    /// Bytes over the transfer's time; absent when it failed.
    pub gbps: Option<f64>,
    /// Bytes moved and parallel streams.
    pub bytes: u64,
    pub streams: u32,
    pub seconds: Option<f64>,
    /// Why the rail carried nothing, when it did not.
    pub error: Option<String>,
    /// Judged slow in this run: below 0.7 x the median of the node's other rails to this peer,
    /// same direction.
    pub slow: bool,
    /// The CPUs this node's streams of the rail ran on (a cpulist, `chd probe fabric --bind`);
    /// absent: unbound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<String>,
    /// The RDMA port the local interface is (`mlx5_0:1`); absent for a plain NIC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_port: Option<String>,
    /// The device this node's side of the transfer ran on (`--backend cuda|acl`: the one
    /// nearest the rail's NIC); absent on the host backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
}

/// One run as one node saw it against one peer node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FabricRecord {
    pub schema: u32,
    /// The run's id, the same on every rank of one launch.
    pub run: String,
    pub node: String,
    pub peer: String,
    pub backend: String,
    pub world_size: u32,
    /// Unix seconds.
    pub started: f64,
    pub finished: f64,
    pub outcome: Outcome,
    pub error: Option<String>,
    pub rails: Vec<RailRecord>,
    /// The collectives over all ranks of the run (the same in every record of the run).
    #[serde(default)]
    pub collectives: Vec<CollectiveRecord>,
}

/// One collective over all ranks of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollectiveRecord {
    /// `allgather` or `allreduce`.
    pub op: String,
    pub bytes: u64,
    pub ranks: u32,
    pub seconds: Option<f64>,
    /// Bytes over time, and the bus bandwidth as nccl-tests defines it, GB/s.
    pub alg_gbps: Option<f64>,
    pub bus_gbps: Option<f64>,
    pub error: Option<String>,
}

/// Why the fabric directory or one of its files could not be used.
#[derive(Debug, thiserror::Error)]
pub enum FabricFileError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: not a fabric result: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: schema {found}; this chd reads schema {SCHEMA}")]
    Schema { path: PathBuf, found: u32 },
    #[error("{0:?} cannot be part of a file name (a node or run id with '/', '..' or a NUL)")]
    Name(String),
}

/// The fabric directory of a state directory.
pub fn dir_of(state_dir: &Path) -> PathBuf {
    state_dir.join(DIR)
}

/// A node name or run id usable in a file name.
fn checked(name: &str) -> Result<&str, FabricFileError> {
    let ok = !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\0'])
        && !name.contains("__");
    ok.then_some(name)
        .ok_or_else(|| FabricFileError::Name(name.to_string()))
}

/// The file of one record in `dir`.
pub fn path_of(dir: &Path, run: &str, peer: &str) -> Result<PathBuf, FabricFileError> {
    Ok(dir.join(format!("{}__{}.json", checked(run)?, checked(peer)?)))
}

/// Write `record` whole into `dir` (created if missing), then remove the oldest runs of its
/// peer beyond [`KEEP_PER_PEER`]. Returns the file written.
pub fn write(dir: &Path, record: &FabricRecord) -> Result<PathBuf, FabricFileError> {
    let path = path_of(dir, &record.run, &record.peer)?;
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| FabricFileError::Io { path, source }
    };
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let body = serde_json::to_vec_pretty(record).expect("plain records serialize");
    crate::format::atomic_file::write(&path, |f| {
        f.write_all(&body)?;
        f.write_all(b"\n")
    })
    .map_err(io_err(&path))?;
    prune(dir, &record.peer, KEEP_PER_PEER);
    Ok(path)
}

/// Remove the oldest records of `peer` beyond `keep` (by their `finished` time). Files that
/// cannot be read are left for the reader to report.
fn prune(dir: &Path, peer: &str, keep: usize) {
    let Ok(listed) = read_dir(dir) else { return };
    let mut of_peer: Vec<(f64, PathBuf)> = listed
        .into_iter()
        .filter_map(|(path, read)| read.ok().map(|r| (path, r)))
        .filter(|(_, r)| r.peer == peer)
        .map(|(path, r)| (r.finished, path))
        .collect();
    if of_peer.len() <= keep {
        return;
    }
    of_peer.sort_by(|a, b| b.0.total_cmp(&a.0));
    for (_, path) in &of_peer[keep..] {
        if let Err(e) = fs::remove_file(path) {
            tracing::warn!(
                "cannot remove the old fabric result {}: {e}",
                path.display()
            );
        }
    }
}

/// Read one record.
pub fn read(path: &Path) -> Result<FabricRecord, FabricFileError> {
    let bytes = fs::read(path).map_err(|source| FabricFileError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    // The schema first, so a newer file says so instead of failing on a field.
    #[derive(Deserialize)]
    struct Head {
        schema: u32,
    }
    let parse = |source| FabricFileError::Parse {
        path: path.to_path_buf(),
        source,
    };
    let head: Head = serde_json::from_slice(&bytes).map_err(parse)?;
    if head.schema != SCHEMA {
        return Err(FabricFileError::Schema {
            path: path.to_path_buf(),
            found: head.schema,
        });
    }
    serde_json::from_slice(&bytes).map_err(parse)
}

/// Every `*.json` file of `dir` (hidden temporary files skipped), each read on its own: a
/// missing directory is no results; a file that cannot be read costs only itself.
#[allow(clippy::type_complexity)]
pub fn read_dir(
    dir: &Path,
) -> Result<Vec<(PathBuf, Result<FabricRecord, FabricFileError>)>, FabricFileError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(FabricFileError::Io {
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|x| x == "json")
                && !p
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .collect();
    paths.sort();
    Ok(paths
        .into_iter()
        .map(|p| {
            let r = read(&p);
            (p, r)
        })
        .collect())
}

/// Whether `path` holds fabric results: a fabric record file, a directory of them (a state
/// directory's `fabric/`, an `--out` directory), a state directory, or a directory of those
/// (one per node, as collected from a fleet), looked for up to three levels down.
pub fn holds_records(path: &Path) -> bool {
    !find_files(path, 3).is_empty()
}

/// The fabric record files at or under `path` (up to `depth` levels of directories), sorted.
/// A file counts when its name is `<run>__<peer>.json` and its first bytes say `"schema"`.
pub fn find_files(path: &Path, depth: usize) -> Vec<PathBuf> {
    let mut out = Vec::new();
    collect(path, depth, &mut out);
    out.sort();
    out
}

fn collect(path: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    if path.is_file() {
        let named = path
            .file_name()
            .map(|n| n.to_string_lossy())
            .is_some_and(|n| n.ends_with(".json") && n.contains("__") && !n.starts_with('.'));
        let head = fs::read(path)
            .ok()
            .map(|b| String::from_utf8_lossy(&b[..b.len().min(64)]).into_owned());
        if named && head.is_some_and(|h| h.contains("\"schema\"")) {
            out.push(path.to_path_buf());
        }
        return;
    }
    if depth == 0 {
        return;
    }
    let Ok(entries) = fs::read_dir(path) else {
        return;
    };
    for e in entries.flatten() {
        collect(&e.path(), depth - 1, out);
    }
}

/// The records of `dir` grouped by peer, newest first within each.
pub fn by_peer(records: Vec<FabricRecord>) -> BTreeMap<String, Vec<FabricRecord>> {
    let mut out: BTreeMap<String, Vec<FabricRecord>> = BTreeMap::new();
    for r in records {
        out.entry(r.peer.clone()).or_default().push(r);
    }
    for runs in out.values_mut() {
        runs.sort_by(|a, b| b.finished.total_cmp(&a.finished));
    }
    out
}

/// Records for the tests of the modules that read them.
#[cfg(test)]
pub(crate) mod samples {
    use super::*;

    /// `name` in direction `way` to a peer rail of the same name; `None` carried nothing.
    pub fn rail(name: &str, way: Way, gbps: Option<f64>) -> RailRecord {
        RailRecord {
            rail: name.into(),
            address: "10.0.0.1".into(),
            peer_rail: Some(name.into()),
            peer_address: Some("10.0.0.2".into()),
            way,
            gbps,
            bytes: 1 << 30,
            streams: 4,
            seconds: gbps.map(|g| 1.0 / g),
            error: gbps.is_none().then(|| "refused".into()),
            slow: false,
            cpus: None,
            rdma_port: None,
            device: None,
        }
    }

    /// Node `a`'s successful run `run` against `peer`, finished at `finished`.
    pub fn record(run: &str, peer: &str, finished: f64, rails: Vec<RailRecord>) -> FabricRecord {
        FabricRecord {
            schema: SCHEMA,
            run: run.into(),
            node: "a".into(),
            peer: peer.into(),
            backend: "host".into(),
            world_size: 2,
            started: finished - 1.0,
            finished,
            outcome: Outcome::Ok,
            error: None,
            rails,
            collectives: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn record(run: &str, peer: &str, finished: f64) -> FabricRecord {
        let mut rail = samples::rail("eth1", Way::Send, Some(9.5));
        rail.address = "10.0.1.1".into();
        rail.peer_address = Some("10.0.1.2".into());
        samples::record(run, peer, finished, vec![rail])
    }

    #[test]
    fn writes_reads_and_keeps_the_newest_runs_per_peer() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = dir_of(tmp.path());
        for i in 0..(KEEP_PER_PEER + 3) {
            write(&dir, &record(&format!("r{i}"), "b", i as f64)).unwrap();
        }
        write(&dir, &record("r0", "c", 0.0)).unwrap();
        let read: Vec<FabricRecord> = read_dir(&dir)
            .unwrap()
            .into_iter()
            .map(|(_, r)| r.unwrap())
            .collect();
        let grouped = by_peer(read);
        assert_eq!(grouped["b"].len(), KEEP_PER_PEER);
        assert_eq!(grouped["b"][0].run, format!("r{}", KEEP_PER_PEER + 2));
        assert_eq!(grouped["c"].len(), 1);
    }

    #[test]
    fn a_bad_file_costs_only_itself_and_names_refuse_path_tricks() {
        let tmp = tempfile::tempdir().unwrap();
        write(tmp.path(), &record("r1", "b", 1.0)).unwrap();
        fs::write(tmp.path().join("junk.json"), "{").unwrap();
        fs::write(tmp.path().join("new.json"), r#"{"schema": 9}"#).unwrap();
        let listed = read_dir(tmp.path()).unwrap();
        assert_eq!(listed.len(), 3);
        let errors: Vec<String> = listed
            .iter()
            .filter_map(|(_, r)| r.as_ref().err().map(|e| e.to_string()))
            .collect();
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors.iter().any(|e| e.contains("schema 9")), "{errors:?}");
        assert!(matches!(
            path_of(tmp.path(), "r", "../x"),
            Err(FabricFileError::Name(_))
        ));
        assert!(read_dir(&tmp.path().join("none")).unwrap().is_empty());
    }
}
