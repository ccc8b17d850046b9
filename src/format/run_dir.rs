//! A one-shot run directory (`chd probe ... --out DIR`): `run.json` says what was asked (the
//! plan) and where it ran; `cells.jsonl` gets one JSON object per measured sample, appended
//! and flushed as it is measured. A run killed at any point can be resumed exactly
//! where it stopped (every sample slot is identified, so none is measured twice or lost) and
//! re-rendered by `chd report` at any time.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The plan and machine description.
pub const RUN_FILE: &str = "run.json";
/// One line per measured sample.
pub const CELLS_FILE: &str = "cells.jsonl";
/// Version of the run directory layout.
pub const FORMAT_VERSION: u32 = 1;

pub use super::MatrixKind;

pub use super::slot::{SlotId, SlotRecord};

/// One measured sample as stored in `cells.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleRecord {
    #[serde(flatten)]
    pub slot: SlotId,
    /// Bytes per second (floating-point operations per second for a basics `matmul` slot);
    /// absent when the sample failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_second: Option<f64>,
    /// Why the sample failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Failure class (`bind`, `copy`, ...), as in `chd_probe_errors_total`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// How an event-timed sample's timed region was held (`latch-wait-value`,
    /// `latch-host-function`, `warmup-ahead`: `runtime::stream_latch::TimingMethod`); absent
    /// for samples timed otherwise (the host backend, collectives, matmul) and failed ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<String>,
    /// Unix time, seconds.
    pub at: f64,
}

/// What a run measures. Resuming must reproduce it exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunPlan {
    pub probe: MatrixKind,
    /// Probing CPUs; for d2d the CPU each device's cells run on, `cpus[i]` for `devices[i]`.
    pub cpus: Vec<u32>,
    /// Devices (h2d, d2d).
    #[serde(default)]
    pub devices: Vec<String>,
    /// Device pairs (pair), e.g. `["0,5"]`; ordered pairs (p2p), e.g. `["0>1", "1>0"]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pairs: Vec<String>,
    pub sizes_bytes: Vec<u64>,
    pub directions: Vec<String>,
    pub host_memories: Vec<String>,
    pub warmup: u32,
    pub iterations: u32,
    /// Samples per cell per load profile.
    pub repeats: u32,
    /// Load profiles, in the order they run.
    pub loads: Vec<String>,
    /// Longest one pair cell may take before it is aborted, milliseconds (pair). Not part
    /// of what is measured: a resumed run may change it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Basics: each device's probing CPU (one of its NUMA node's).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub device_cpus: BTreeMap<String, u32>,
    /// Basics: the side N of the matmul's N x N matrices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matrix_side: Option<u64>,
    /// Basics: measurements this run cannot make at all (`matmul` on a backend without
    /// cuBLAS, `allgather` with one device), and why; not in `directions`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unavailable: BTreeMap<String, String>,
    /// Sweep runs with the `allgather` operation: each swept device's peer (rank 1's device)
    /// and rank 1's CPU. A device without an entry has no allgather points.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub peers: BTreeMap<String, SweepPeer>,
}

/// The peer of a swept device in its allgather points.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SweepPeer {
    /// Rank 1's device.
    pub device: String,
    /// Rank 1's CPU (on the peer's NUMA node where it has one).
    pub cpu: u32,
}

/// The operation of a sweep point whose slots have two ranks.
pub const SWEEP_ALLGATHER: &str = "allgather";

impl RunPlan {
    /// A plan of `probe` with nothing in it yet (fill in what the probe measures).
    pub fn empty(probe: MatrixKind) -> RunPlan {
        RunPlan {
            probe,
            cpus: Vec::new(),
            devices: Vec::new(),
            pairs: Vec::new(),
            sizes_bytes: Vec::new(),
            directions: Vec::new(),
            host_memories: Vec::new(),
            warmup: 0,
            iterations: 0,
            repeats: 0,
            loads: Vec::new(),
            timeout_ms: None,
            device_cpus: BTreeMap::new(),
            matrix_side: None,
            unavailable: BTreeMap::new(),
            peers: BTreeMap::new(),
        }
    }
}

/// One device as the run saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceMeta {
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub pci_bus_id: String,
    #[serde(default)]
    pub numa_node: Option<u32>,
    /// The device's PCIe link as sysfs reported it right after the run's first copies to the
    /// device (absent for devices without one, and in runs of chd before issue 15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<LinkRecord>,
    /// Device memory as NVML reports it (CUDA; absent elsewhere and in runs before issue 28).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryRecord>,
    /// The configured limits of the device's model (`[limits."MODEL"]`), GB/s by operation
    /// (`h2d`, `d2h`, `d2d`), as the run was started with.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits_gbps: BTreeMap<String, f64>,
}

/// Device memory: NVML's memory bus width and maximum memory clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryRecord {
    pub bus_width_bits: u32,
    pub max_clock_mhz: u32,
}

/// A PCIe link's width (lanes) and speed (transfers per second per lane), now and at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkRecord {
    pub current_width: u32,
    pub current_transfers_per_second: u64,
    pub max_width: u32,
    pub max_transfers_per_second: u64,
}

/// Where a run ran: what the report needs to label and group its cells.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    pub hostname: String,
    pub chd_version: String,
    /// Backend name: `cuda`, `acl`, `host`.
    pub backend: String,
    pub backend_description: String,
    pub devices: Vec<DeviceMeta>,
    /// NUMA node id -> its online CPUs.
    pub numa_nodes: BTreeMap<u32, Vec<u32>>,
    /// Unix time the run was started.
    pub started_at: f64,
}

/// The runtime choices of a run (`[runtime]` of the config, as run.json stores them): the
/// backend and the libraries it loaded, so `--resume` opens the same ones. Its own type, so
/// the file format does not change when the config schema does.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeOptions {
    /// `auto`, `cuda`, `acl`, `host`.
    pub backend: Option<String>,
    /// libcudart loaded instead of the standard sonames.
    pub cuda_runtime: Option<PathBuf>,
    /// libascendcl loaded instead of the standard soname.
    pub acl_runtime: Option<PathBuf>,
    /// libnvidia-ml loaded instead of libnvidia-ml.so.1.
    pub nvml: Option<PathBuf>,
    /// Host side of accelerator copies: `pinned` or `pageable` (unused by one-shot runs,
    /// whose plan holds the host memory kinds).
    pub host_memory: Option<String>,
    /// Pair probe transport: `auto`, `nccl`, `hccl`, `copy`.
    pub collective: Option<String>,
    /// libnccl loaded instead of libnccl.so / libnccl.so.2.
    pub nccl: Option<PathBuf>,
    /// libhccl loaded instead of libhccl.so.
    pub hccl: Option<PathBuf>,
}

/// `run.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunFile {
    pub format: u32,
    pub plan: RunPlan,
    pub machine: Machine,
    /// Runtime options the run was started with, reused on `--resume`.
    #[serde(default)]
    pub runtime: RuntimeOptions,
    /// Pair runs: how each pair was measured (`nccl`, `hccl`, `copy`, or `copy-staged` where
    /// peer access was refused and the copies were staged through host memory), as known at
    /// the end of the last run over this directory.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pair_methods: BTreeMap<String, String>,
    /// P2p runs: the PCIe path class of each ordered pair (`PIX`, `PXB`, `PHB`, `NODE`,
    /// `SYS`, `unknown`, as `nvidia-smi topo -m` names them), from the sysfs PCI tree when the
    /// run started. A p2p run's `pair_methods` are keyed by the ordered pair too.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub p2p_paths: BTreeMap<String, String>,
}

/// Why a run directory could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum RunDirError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Format { path: PathBuf, reason: String },
    #[error(
        "{0} already holds a run ({CELLS_FILE}); continue it with --resume or choose another --out"
    )]
    Exists(PathBuf),
    #[error("{0} holds no run to resume ({RUN_FILE} missing)")]
    NoRun(PathBuf),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RunDirError + '_ {
    move |source| RunDirError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Append-only writer of `cells.jsonl`.
#[derive(Debug)]
pub struct CellLog {
    file: File,
    path: PathBuf,
}

impl CellLog {
    /// Start a new run in `dir` (created if missing): writes `run.json` and an empty
    /// `cells.jsonl`. Refuses a directory that already holds samples.
    pub fn create(dir: &Path, run: &RunFile) -> Result<CellLog, RunDirError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let cells = dir.join(CELLS_FILE);
        if std::fs::metadata(&cells)
            .map(|m| m.len() > 0)
            .unwrap_or(false)
        {
            return Err(RunDirError::Exists(dir.to_path_buf()));
        }
        write_run_file(dir, run)?;
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&cells)
            .map_err(io(&cells))?;
        Ok(CellLog { file, path: cells })
    }

    /// Reopen the run in `dir` to continue it: returns its plan, the samples already
    /// measured and a writer appending after them. A last line cut short by a kill is
    /// removed (that sample counts as not measured).
    pub fn resume(dir: &Path) -> Result<(RunFile, Vec<SampleRecord>, CellLog), RunDirError> {
        let run = read_run_file(dir)?;
        let path = dir.join(CELLS_FILE);
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&path)
            .map_err(io(&path))?;
        let (records, complete_len) = parse_cells(BufReader::new(&file), &path)?;
        let len = file.metadata().map_err(io(&path))?.len();
        if complete_len < len {
            tracing::warn!(
                "{}: dropping an incomplete last line ({} bytes) left by an interrupted run",
                path.display(),
                len - complete_len
            );
            file.set_len(complete_len).map_err(io(&path))?;
            file.seek(SeekFrom::End(0)).map_err(io(&path))?;
        }
        Ok((run, records, CellLog { file, path }))
    }

    /// Append one sample and hand it to the kernel at once (one `write` of a whole line).
    pub fn append(&mut self, record: &SampleRecord) -> Result<(), RunDirError> {
        let mut line = serde_json::to_string(record).map_err(|e| RunDirError::Format {
            path: self.path.clone(),
            reason: e.to_string(),
        })?;
        line.push('\n');
        self.file.write_all(line.as_bytes()).map_err(io(&self.path))
    }

    /// The run directory.
    pub fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }

    /// Flush to stable storage.
    pub fn sync(&mut self) -> Result<(), RunDirError> {
        self.file.sync_data().map_err(io(&self.path))
    }
}

/// Write `run.json` atomically ([`super::atomic_file`]: temp file, then rename).
pub fn write_run_file(dir: &Path, run: &RunFile) -> Result<(), RunDirError> {
    let path = dir.join(RUN_FILE);
    let text = serde_json::to_string_pretty(run).map_err(|e| RunDirError::Format {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    super::atomic_file::write(&path, |f| f.write_all((text + "\n").as_bytes())).map_err(io(&path))
}

/// Read `run.json` of `dir`.
pub fn read_run_file(dir: &Path) -> Result<RunFile, RunDirError> {
    let path = dir.join(RUN_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(RunDirError::NoRun(dir.to_path_buf()))
        }
        Err(e) => return Err(io(&path)(e)),
    };
    let run: RunFile = serde_json::from_str(&text).map_err(|e| RunDirError::Format {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    if run.format != FORMAT_VERSION {
        return Err(RunDirError::Format {
            path,
            reason: format!(
                "format {} is not the {FORMAT_VERSION} this chd reads",
                run.format
            ),
        });
    }
    Ok(run)
}

/// Read a run directory: its plan and every complete sample line.
pub fn read_run(dir: &Path) -> Result<(RunFile, Vec<SampleRecord>), RunDirError> {
    let run = read_run_file(dir)?;
    let path = dir.join(CELLS_FILE);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((run, Vec::new())),
        Err(e) => return Err(io(&path)(e)),
    };
    let (records, _) = parse_cells(BufReader::new(file), &path)?;
    Ok((run, records))
}

/// Parse `cells.jsonl` line by line (never holding the file whole): every newline-terminated
/// line must parse; an unterminated last line is ignored. Returns the records and the length
/// in bytes of the complete part.
fn parse_cells(
    mut reader: impl BufRead,
    path: &Path,
) -> Result<(Vec<SampleRecord>, u64), RunDirError> {
    let mut records = Vec::new();
    let mut complete_len = 0u64;
    let mut line = Vec::new();
    for n in 1.. {
        line.clear();
        let got = reader.read_until(b'\n', &mut line).map_err(io(path))?;
        let Some(text) = line.strip_suffix(b"\n") else {
            break; // the end, or a last line cut short
        };
        complete_len += got as u64;
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        let text = std::str::from_utf8(text).map_err(|e| RunDirError::Format {
            path: path.to_path_buf(),
            reason: format!("line {n}: {e}"),
        })?;
        if text.trim().is_empty() {
            continue;
        }
        let record: SampleRecord = serde_json::from_str(text).map_err(|e| RunDirError::Format {
            path: path.to_path_buf(),
            reason: format!("line {n}: {e}"),
        })?;
        records.push(record);
    }
    Ok((records, complete_len))
}

/// The slots already measured (each appears once even if a file holds it twice).
pub fn done_slots(records: &[SampleRecord]) -> BTreeSet<SlotId> {
    records.iter().map(|r| r.slot.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> RunPlan {
        RunPlan {
            probe: MatrixKind::H2d,
            cpus: vec![0, 1],
            devices: vec!["0".into(), "1".into(), "2".into()],
            pairs: vec![],
            sizes_bytes: vec![1 << 20, 4 << 20],
            directions: vec!["h2d".into()],
            host_memories: vec!["pinned".into()],
            warmup: 1,
            iterations: 2,
            repeats: 3,
            loads: vec!["idle".into(), "cpu:2".into()],
            ..RunPlan::empty(MatrixKind::H2d)
        }
    }

    fn run_file() -> RunFile {
        RunFile {
            format: FORMAT_VERSION,
            plan: plan(),
            machine: Machine {
                hostname: "h".into(),
                chd_version: "0".into(),
                backend: "host".into(),
                backend_description: "host".into(),
                devices: vec![],
                numa_nodes: BTreeMap::from([(0, vec![0, 1])]),
                started_at: 1.0,
            },
            runtime: RuntimeOptions::default(),
            pair_methods: BTreeMap::new(),
            p2p_paths: BTreeMap::new(),
        }
    }

    /// A run.json of an older chd (no peers) still loads.
    #[test]
    fn a_plan_without_peers_loads() {
        let mut old = serde_json::to_value(run_file()).unwrap();
        old["plan"].as_object_mut().unwrap().remove("peers");
        let back: RunFile = serde_json::from_value(old).unwrap();
        assert!(back.plan.peers.is_empty());
    }

    #[test]
    fn resume_drops_a_torn_last_line_and_appends_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = CellLog::create(dir.path(), &run_file()).unwrap();
        let slots: Vec<SlotId> = ["0", "1", "2"]
            .iter()
            .map(|d| {
                serde_json::from_str(&format!(
                    r#"{{"matrix":"h2d","load":"idle","pass":0,"cpu":0,"device":"{d}","size_bytes":1048576,"direction":"h2d","host_memory":"pinned"}}"#
                ))
                .unwrap()
            })
            .collect();
        for s in &slots[..2] {
            log.append(&SampleRecord {
                timing: None,
                slot: s.clone(),
                bytes_per_second: Some(1e9),
                error: None,
                reason: None,
                at: 2.0,
            })
            .unwrap();
        }
        drop(log);
        // A kill in the middle of a write.
        let path = dir.path().join(CELLS_FILE);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"matrix\":\"h2d\",\"lo").unwrap();
        drop(f);
        assert!(matches!(
            CellLog::create(dir.path(), &run_file()),
            Err(RunDirError::Exists(_))
        ));
        let (run, records, mut log) = CellLog::resume(dir.path()).unwrap();
        assert_eq!(run, run_file());
        assert_eq!(records.len(), 2);
        log.append(&SampleRecord {
            timing: None,
            slot: slots[2].clone(),
            bytes_per_second: None,
            error: Some("copy failed: x".into()),
            reason: Some("copy".into()),
            at: 3.0,
        })
        .unwrap();
        let (_, records) = read_run(dir.path()).unwrap();
        assert_eq!(records.len(), 3);
        assert_eq!(records[2].error.as_deref(), Some("copy failed: x"));
        assert_eq!(done_slots(&records).len(), 3);
    }

    #[test]
    fn a_garbled_middle_line_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        CellLog::create(dir.path(), &run_file()).unwrap();
        std::fs::write(dir.path().join(CELLS_FILE), "garbage\n").unwrap();
        let err = read_run(dir.path()).unwrap_err().to_string();
        assert!(err.contains("line 1"), "{err}");
    }
}
