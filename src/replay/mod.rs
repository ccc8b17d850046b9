//! Replay: serve a recorded matrix instead of probing (`chd serve --replay FILE`), for
//! post-mortems in Grafana and for tuning alerts on recorded runs. FILE is a
//! ClusterHealthDetect `results.json`, a `chd probe --out` run directory, or a chd state file
//! (`state.json`); the topology (CPUs and their NUMA nodes) comes from the file. Failed rows become failed cells and count in
//! `chd_probe_errors_total{reason="recorded"}`, never zero bandwidth.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::format::cluster_health::{self, RecordedCpu};
use crate::format::state_file;
use crate::runtime::{Backend, CopyParams, DeviceInfo, ProbeError};
use crate::store::{persist, unix_now, Store};
use crate::topology::pci_link::Link;
use crate::topology::{Cpu, NumaNode, Topology};
use crate::vocab::DevicePair;

/// Why a recording could not be replayed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {problem}")]
    Format { path: String, problem: String },
}

/// A failed recorded cell, for `chd_probe_errors_total`.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedError {
    pub probe: &'static str,
    pub device: String,
}

/// What a recording holds, ready to serve.
#[derive(Debug)]
pub struct Replay {
    pub topology: Topology,
    pub devices: Vec<DeviceInfo>,
    pub store: Store,
    pub pairs: Vec<DevicePair>,
    pub errors: Vec<RecordedError>,
    /// e.g. `ClusterHealthDetect results.json: 30720 h2d cells, 0 pair cells, 2 failed`.
    pub description: String,
    /// What the recording held that is not served, and why (one line each).
    pub warnings: Vec<String>,
    /// The host the recording names, if it does.
    pub host: Option<String>,
    /// The backend or device kind the recording names (`cuda`, `npu`), else `replay`.
    pub backend: String,
    /// The PCIe links a run recorded (run.json `devices[].link`).
    pub links: BTreeMap<String, Link>,
    /// Device -> load profile -> ratio to idle, for a run of several profiles (only the idle
    /// one is served).
    pub load_profile_delta: BTreeMap<String, BTreeMap<String, f64>>,
    /// The affinity verdicts a recording holds (cpu, bindable); not in `/metrics` (a replay
    /// probes nothing), in the ledger.
    pub affinity: Vec<(u32, bool)>,
    /// A peer copy run's path classes and methods (`run.json`), keyed `SRC>DST`.
    pub p2p_paths: BTreeMap<String, String>,
    pub p2p_methods: BTreeMap<String, String>,
    /// A sweep run's size curves: not in a store, so not served, in the ledger.
    pub curves: Vec<crate::analysis::sweep::Curve>,
    /// A basics run's table: likewise the ledger's only.
    pub basics: Option<crate::analysis::basics::BasicsTable>,
}

/// The devices of a replay: listed for `chd_device_info`, never measured.
#[derive(Debug)]
pub struct ReplayBackend {
    pub devices: Vec<DeviceInfo>,
}

impl Backend for ReplayBackend {
    fn name(&self) -> &'static str {
        "replay"
    }
    fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }
    fn measure_copy(&self, device: &str, _: &CopyParams) -> Result<f64, ProbeError> {
        Err(ProbeError::Device(format!("{device} is a recorded device")))
    }
}

fn topology_from(cpu_numa: &BTreeMap<u32, Option<u32>>, recorded: &[RecordedCpu]) -> Topology {
    let cpus = cpu_numa
        .iter()
        .map(|(&id, &numa_node)| {
            let r = recorded.iter().find(|c| c.cpu == id);
            Cpu {
                id,
                numa_node,
                package: r.and_then(|c| c.socket_id),
                core: r.and_then(|c| c.core_id),
                siblings: r
                    .map(|c| c.thread_siblings.clone())
                    .filter(|s| !s.is_empty())
                    .unwrap_or_else(|| vec![id]),
                allowed: true,
            }
        })
        .collect();
    let mut nodes: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (&cpu, node) in cpu_numa {
        if let Some(n) = node {
            nodes.entry(*n).or_default().push(cpu);
        }
    }
    Topology {
        cpus,
        offline_cpus: Vec::new(),
        numa_nodes: nodes
            .into_iter()
            .map(|(id, cpus)| NumaNode {
                id,
                cpus,
                has_memory: true,
                memory_total_bytes: None,
            })
            .collect(),
    }
}

/// Add the CPUs and devices the store's cells name; returns the pair labels.
fn add_cells_of(
    store: &Store,
    cpu_numa: &mut BTreeMap<u32, Option<u32>>,
    device_ids: &mut BTreeSet<String>,
) -> BTreeSet<DevicePair> {
    let mut pairs = BTreeSet::new();
    for k in store.h2d().keys() {
        cpu_numa.entry(k.cpu).or_insert(None);
        device_ids.insert(k.device.clone());
    }
    for k in store.pairs().keys() {
        cpu_numa.entry(k.cpu0).or_insert(None);
        cpu_numa.entry(k.cpu1).or_insert(None);
        pairs.insert(k.pair.clone());
        for d in k.pair.devices() {
            device_ids.insert(d.to_string());
        }
    }
    pairs
}

fn devices_from(ids: BTreeSet<String>) -> Vec<DeviceInfo> {
    let mut ids: Vec<String> = ids.into_iter().collect();
    crate::topology::natural::sort_natural(&mut ids);
    ids.into_iter()
        .map(|id| DeviceInfo {
            id,
            kind: "replay".into(),
            name: "recorded device".into(),
            pci_bus_id: String::new(),
            numa_node: None,
        })
        .collect()
}

/// A dataset read by the report module (a ClusterHealthDetect `results.json` or a chd probe
/// run directory), ready to serve.
fn from_dataset(ds: crate::dataset::Dataset, keep: usize) -> Replay {
    let now = unix_now();
    let store = ds.to_store(keep, now);
    let mut cpu_numa: BTreeMap<u32, Option<u32>> = BTreeMap::new();
    for (node, cpus) in &ds.numa_nodes {
        for &cpu in cpus {
            cpu_numa.insert(cpu, Some(*node));
        }
    }
    let mut device_ids: BTreeSet<String> = ds.devices.iter().map(|d| d.id.clone()).collect();
    let pairs = add_cells_of(&store, &mut cpu_numa, &mut device_ids);
    // One error per failed sample of the served cells, as a live window counts them.
    let errors: Vec<RecordedError> = ds
        .served_cells()
        .flat_map(|c| {
            let probe = c.matrix.kind.as_str();
            c.errors.iter().map(move |_| RecordedError {
                probe,
                device: c.device.clone(),
            })
        })
        .collect();
    let mut description = format!(
        "{}: {} h2d cells, {} pair cells, {} failed samples",
        ds.source,
        store.h2d().len(),
        store.pairs().len(),
        errors.len()
    );
    for (n, what) in [
        (store.d2d().len(), "same-device cells"),
        (store.p2p().len(), "peer copy cells"),
    ] {
        if n > 0 {
            description.push_str(&format!(", {n} {what}"));
        }
    }
    if ds.partial.is_some() {
        description.push_str(", partial recording (the run did not finish)");
    }
    if let Some(summary) = cluster_health::rejected_summary(&ds.rejected) {
        description.push_str(&format!(", {summary}"));
    }
    let mut warnings: Vec<String> = ds.partial.iter().chain(&ds.notes).cloned().collect();
    warnings.extend(ds.unservable());
    let host = ds
        .meta
        .iter()
        .find(|(k, v)| k == "host" && !v.is_empty())
        .map(|(_, v)| v.clone());
    let backend = ds
        .devices
        .iter()
        .map(|d| d.kind.clone())
        .find(|k| !k.is_empty())
        .unwrap_or_else(|| "replay".into());
    let links = ds
        .devices
        .iter()
        .filter_map(|d| Some((d.id.clone(), crate::dataset::device_link(d)?)))
        .collect();
    let load_profile_delta =
        crate::analysis::load_delta::load_profile_delta(&crate::dataset::cells::h2d_by_load(&ds));
    let mut devices = devices_from(device_ids);
    for d in &mut devices {
        if let Some(meta) = ds.devices.iter().find(|m| m.id == d.id) {
            if !meta.name.is_empty() {
                d.name = meta.name.clone();
            }
            d.pci_bus_id = meta.pci_bus_id.clone();
            d.numa_node = meta.numa_node;
        }
    }
    Replay {
        topology: topology_from(&cpu_numa, &ds.cpu_records),
        devices,
        store,
        pairs: pairs.into_iter().collect(),
        errors,
        description,
        warnings,
        host,
        backend,
        links,
        load_profile_delta,
        affinity: ds.affinity.clone(),
        p2p_paths: ds.p2p_paths.clone(),
        p2p_methods: ds.p2p_methods.clone(),
        curves: crate::dataset::cells::sweep_curves(&ds),
        basics: crate::dataset::cells::basics_table(&ds),
    }
}

/// A chd state file's store as a replay; with `keep_affinity` its affinity verdicts stay
/// (the ledger reports them; a served replay leaves them out).
pub fn from_state_store(store: Store, keep_affinity: bool) -> Replay {
    let bindable = store.bindable().clone();
    let mut r = from_state(store);
    if keep_affinity {
        for (cpu, verdict) in bindable {
            r.store.insert_bindable(cpu, verdict);
        }
    }
    r
}

fn from_state(mut store: Store) -> Replay {
    let mut cpu_numa: BTreeMap<u32, Option<u32>> = store
        .cpu_numa()
        .iter()
        .map(|(&c, &n)| (c, Some(n)))
        .collect();
    let mut device_ids = BTreeSet::new();
    let pairs = add_cells_of(&store, &mut cpu_numa, &mut device_ids);
    // Served as recorded: the samples keep their times, so staleness reads as it was.
    store.clear_bindable();
    let description = format!(
        "chd state file: {} h2d cells, {} pair cells",
        store.h2d().len(),
        store.pairs().len()
    );
    Replay {
        topology: topology_from(&cpu_numa, &[]),
        devices: devices_from(device_ids),
        store,
        pairs: pairs.into_iter().collect(),
        errors: Vec::new(),
        description,
        warnings: Vec::new(),
        host: None,
        backend: "replay".into(),
        links: BTreeMap::new(),
        load_profile_delta: BTreeMap::new(),
        affinity: Vec::new(),
        p2p_paths: BTreeMap::new(),
        p2p_methods: BTreeMap::new(),
        curves: Vec::new(),
        basics: None,
    }
}

/// Read a recording; `keep` is how many samples a cell keeps. A chd state file is served as
/// saved; anything else goes through the report module's reader (a ClusterHealthDetect
/// `results.json`, or a `chd probe --out` run directory or its `run.json`).
pub fn load(path: &Path, keep: usize) -> Result<Replay, ReplayError> {
    let shown = path.display().to_string();
    let format = |problem: String| ReplayError::Format {
        path: shown.clone(),
        problem,
    };
    let read_error = |source| ReplayError::Read {
        path: shown.clone(),
        source,
    };
    // Only a state file is read whole (its typed records); a recording streams.
    if path.is_file() && state_file::looks_like(path).map_err(read_error)? {
        let bytes = std::fs::read(path).map_err(read_error)?;
        let store = persist::decode(&bytes).map_err(|e| format(e.to_string()))?;
        return Ok(from_state(store));
    }
    let (ds, _) = crate::dataset::load(path).map_err(|e| format(e.to_string()))?;
    if ds.cells.is_empty() {
        return Err(format("no matrix cells to replay".into()));
    }
    let replay = from_dataset(ds, keep.max(1));
    let store = &replay.store;
    let no_cells = store.h2d().is_empty()
        && store.pairs().is_empty()
        && store.d2d().is_empty()
        && store.p2p().is_empty();
    if no_cells && replay.curves.is_empty() && replay.basics.is_none() {
        return Err(format(format!(
            "no matrix cells to replay: {}",
            replay.warnings.join("; ")
        )));
    }
    Ok(replay)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{CellKey, Sample};

    #[test]
    fn cluster_health_file_becomes_topology_devices_and_cells() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("results.json");
        std::fs::write(
            &path,
            r#"{"meta": {"affinity_summary": {"numa_nodes": {"0": {"cpus": [0, 1]}, "1": {"cpus": [2, 3]}}}},
                "metrics": [
                  {"test": "core_h2d_matrix", "host_cpu": 0, "device_id": 0, "size_mb": 64, "gbps": 12.7, "status": "ok"},
                  {"test": "core_h2d_matrix", "host_cpu": 2, "device_id": 1, "size_mb": 64, "gbps": 58.4, "status": "ok"},
                  {"test": "core_h2d_matrix", "host_cpu": 3, "device_id": 1, "size_mb": 64, "status": "failed"},
                  {"test": "core_pair_d2d_matrix", "rank0_cpu": 1, "rank1_cpu": 2, "alg_gbps": 13.7, "device_pair": "0,1", "status": "ok"}
                ]}"#,
        )
        .unwrap();
        let r = load(&path, 5).unwrap();
        assert_eq!(r.topology.cpus.len(), 4);
        assert_eq!(r.topology.cpu(2).unwrap().numa_node, Some(1));
        assert_eq!(
            r.devices.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(),
            ["0", "1"]
        );
        assert_eq!(r.store.measured_cells().count(), 2);
        assert_eq!(r.store.h2d().len(), 3, "the failed row is a tried cell");
        assert_eq!(
            r.errors,
            vec![RecordedError {
                probe: "h2d",
                device: "1".into()
            }]
        );
        assert_eq!(r.pairs, vec!["0,1".parse::<DevicePair>().unwrap()]);
        assert!(r.description.contains("1 failed"), "{}", r.description);
        assert_eq!(r.store.pairs().len(), 1);
    }

    #[test]
    fn state_file_round_trips_with_its_numa_map() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::default();
        s.set_cpu_numa(BTreeMap::from([(5, 1)]));
        s.record_sample(
            CellKey {
                cpu: 5,
                device: "numa0".into(),
                size_bytes: 1 << 20,
                direction: crate::vocab::Direction::H2d,
            },
            Sample {
                bytes_per_second: 1e10,
                at: 1.0,
            },
            5,
        );
        persist::save(dir.path(), &s, 2.0).unwrap();
        let r = load(&persist::state_path(dir.path()), 5).unwrap();
        assert_eq!(r.topology.cpu(5).unwrap().numa_node, Some(1));
        assert_eq!(r.devices[0].id, "numa0");
    }

    #[test]
    fn unknown_json_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.json");
        std::fs::write(&path, "{\"hello\": 1}").unwrap();
        let e = load(&path, 5).unwrap_err().to_string();
        assert!(e.contains("x.json"), "{e}");
        assert!(load(&dir.path().join("missing.json"), 5).is_err());
    }
}
