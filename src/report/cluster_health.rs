//! Reader for ClusterHealthDetect's `results.json` (the Python tool chd's matrices come from),
//! so old runs can be re-rendered, compared and replayed:
//!
//! ```json
//! {"meta": {"hostname": "...", "affinity_summary": {"numa_nodes": {"0": {"cpus": [0, 1]}}}},
//!  "metrics": [
//!    {"test": "core_h2d_matrix", "host_cpu": 12, "device_id": 0, "size_mb": 64,
//!     "gbps": 58.3, "status": "ok"},
//!    {"test": "core_pair_d2d_matrix", "rank0_cpu": 3, "rank1_cpu": 9, "device_pair": "0,5",
//!     "size_mb": 64, "alg_gbps": 13.7, "status": "ok"}]}
//! ```
//!
//! `size_mb` is MiB (the tool allocated size_mb x 2^20 bytes) and `gbps` / `alg_gbps` decimal
//! GB/s (1e9 bytes/s). A row whose `status` is not `ok` is a failed sample (its `error`,
//! `message` or `reason` text, else the status), never zero bandwidth. Optional fields:
//! `direction` (default `h2d`), `load_profile` (default `idle`), `host_memory` / `memory`
//! (default `unspecified`). Rows of other tests are counted and skipped; rows missing their
//! CPU or device are skipped with a count in the report's header.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::dataset::Dataset;
use crate::probe::record::{MatrixKind, SampleRecord, SlotId};

/// Why a `results.json` could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ClusterHealthError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("not JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("not a ClusterHealthDetect results file: {0}")]
    Shape(String),
}

/// Read and parse `path`.
pub fn read(path: &Path) -> Result<Dataset, ClusterHealthError> {
    let text = std::fs::read_to_string(path).map_err(|source| ClusterHealthError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let mut ds = parse(&text)?;
    ds.source = format!("ClusterHealthDetect {}", path.display());
    Ok(ds)
}

fn uint(v: Option<&Value>) -> Option<u64> {
    match v? {
        Value::Number(n) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| *f >= 0.0 && f.fract() == 0.0)
                .map(|f| f as u64)
        }),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn float(v: Option<&Value>) -> Option<f64> {
    match v? {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
    .filter(|f: &f64| f.is_finite())
}

fn text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// `"0,5"`, `"0-5"`, `"(0, 5)"` or `[0, 5]` -> `"0,5"` (ascending).
fn device_pair(v: Option<&Value>) -> Option<String> {
    let ids: Vec<u64> = match v? {
        Value::Array(items) => items.iter().filter_map(|i| uint(Some(i))).collect(),
        Value::String(s) => s
            .split(|c: char| !c.is_ascii_digit())
            .filter(|p| !p.is_empty())
            .filter_map(|p| p.parse().ok())
            .collect(),
        _ => return None,
    };
    let mut ids = ids;
    ids.sort_unstable();
    (ids.len() == 2).then(|| format!("{},{}", ids[0], ids[1]))
}

/// Parse the text of a `results.json`.
pub fn parse(text: &str) -> Result<Dataset, ClusterHealthError> {
    let root: Value = serde_json::from_str(text)?;
    let metrics = root
        .get("metrics")
        .and_then(Value::as_array)
        .ok_or_else(|| ClusterHealthError::Shape("no \"metrics\" array".into()))?;
    let meta = root.get("meta").cloned().unwrap_or(Value::Null);
    let mut ds = Dataset {
        source: "ClusterHealthDetect results.json".into(),
        ..Dataset::default()
    };
    if let Some(obj) = meta.as_object() {
        for (k, v) in obj {
            if let Some(t) = match v {
                Value::String(s) => Some(s.clone()),
                Value::Number(n) => Some(n.to_string()),
                Value::Bool(b) => Some(b.to_string()),
                _ => None,
            } {
                ds.meta.push((k.clone(), t));
            }
        }
    }
    if let Some(nodes) = meta
        .pointer("/affinity_summary/numa_nodes")
        .and_then(Value::as_object)
    {
        for (id, node) in nodes {
            let Ok(id) = id.trim().parse::<u32>() else {
                continue;
            };
            let cpus: Vec<u32> = node
                .get("cpus")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|c| uint(Some(c)).and_then(|c| u32::try_from(c).ok()))
                        .collect()
                })
                .unwrap_or_default();
            ds.numa_nodes.insert(id, cpus);
        }
    }
    let mut records = Vec::new();
    let mut other_tests: BTreeMap<String, usize> = BTreeMap::new();
    let mut skipped = 0usize;
    let mut first_skip = None;
    for (i, row) in metrics.iter().enumerate() {
        let test = row.get("test").and_then(Value::as_str).unwrap_or("");
        let kind = match test {
            "core_h2d_matrix" => MatrixKind::H2d,
            "core_pair_d2d_matrix" => MatrixKind::Pair,
            other => {
                *other_tests.entry(other.to_string()).or_default() += 1;
                continue;
            }
        };
        match record(kind, row) {
            Ok(r) => records.push(r),
            Err(why) => {
                skipped += 1;
                first_skip.get_or_insert(format!("metrics[{i}]: {why}"));
            }
        }
    }
    if records.is_empty() && skipped == 0 && !metrics.is_empty() && other_tests.is_empty() {
        return Err(ClusterHealthError::Shape("no matrix rows".into()));
    }
    let devices: std::collections::BTreeSet<String> = records
        .iter()
        .filter(|r| r.slot.matrix == MatrixKind::H2d)
        .map(|r| r.slot.device.clone())
        .collect();
    let mut devices: Vec<String> = devices.into_iter().collect();
    devices.sort_by_key(|d| (d.parse::<u64>().unwrap_or(u64::MAX), d.clone()));
    ds.devices = devices
        .into_iter()
        .map(|id| crate::probe::record::DeviceMeta {
            id,
            name: String::new(),
            kind: String::new(),
            pci_bus_id: String::new(),
            numa_node: None,
        })
        .collect();
    ds.meta
        .push(("matrix rows".into(), records.len().to_string()));
    if skipped > 0 {
        ds.meta.push((
            "skipped rows".into(),
            format!("{skipped} (first: {})", first_skip.unwrap_or_default()),
        ));
    }
    if !other_tests.is_empty() {
        let list: Vec<String> = other_tests
            .iter()
            .map(|(t, n)| format!("{t} x{n}"))
            .collect();
        ds.meta
            .push(("other tests (not shown)".into(), list.join(", ")));
    }
    ds.add_records(&records);
    Ok(ds)
}

fn record(kind: MatrixKind, row: &Value) -> Result<SampleRecord, String> {
    let field = |name: &str| row.get(name);
    let cpu_field = if kind == MatrixKind::H2d {
        "host_cpu"
    } else {
        "rank0_cpu"
    };
    let cpu = uint(field(cpu_field))
        .and_then(|c| u32::try_from(c).ok())
        .ok_or_else(|| format!("no {cpu_field}"))?;
    let (peer_cpu, device) = match kind {
        MatrixKind::H2d => (
            None,
            text(field("device_id"))
                .or_else(|| text(field("device")))
                .ok_or("no device_id")?,
        ),
        MatrixKind::Pair => (
            Some(
                uint(field("rank1_cpu"))
                    .and_then(|c| u32::try_from(c).ok())
                    .ok_or("no rank1_cpu")?,
            ),
            device_pair(field("device_pair")).ok_or("no device_pair of two devices")?,
        ),
    };
    // Pair rows of older ClusterHealthDetect versions carry no size: one pair matrix then.
    let size_mb = match (float(field("size_mb")), kind) {
        (Some(mb), _) => mb,
        (None, MatrixKind::Pair) => 0.0,
        (None, MatrixKind::H2d) => return Err("no size_mb".into()),
    };
    let status = text(field("status")).unwrap_or_else(|| "ok".into());
    let gbps_field = if kind == MatrixKind::H2d {
        "gbps"
    } else {
        "alg_gbps"
    };
    let gbps = float(field(gbps_field)).or_else(|| float(field("gbps")));
    let ok = status.eq_ignore_ascii_case("ok");
    let (bytes_per_second, error) = match (ok, gbps) {
        (true, Some(g)) => (Some(g * 1e9), None),
        (true, None) => (None, Some(format!("status ok but no {gbps_field}"))),
        (false, _) => (
            None,
            Some(
                text(field("error"))
                    .or_else(|| text(field("message")))
                    .or_else(|| text(field("reason")))
                    .map(|e| format!("{status}: {e}"))
                    .unwrap_or(status),
            ),
        ),
    };
    let default_direction = if kind == MatrixKind::H2d {
        "h2d"
    } else {
        "allgather"
    };
    Ok(SampleRecord {
        slot: SlotId {
            matrix: kind,
            load: text(field("load_profile"))
                .or_else(|| text(field("load")))
                .unwrap_or_else(|| "idle".into()),
            pass: 0,
            cpu,
            peer_cpu,
            device,
            size_bytes: (size_mb * (1u64 << 20) as f64).round() as u64,
            direction: text(field("direction")).unwrap_or_else(|| default_direction.into()),
            host_memory: text(field("host_memory"))
                .or_else(|| text(field("memory")))
                .unwrap_or_else(|| "unspecified".into()),
        },
        bytes_per_second,
        error,
        reason: None,
        at: 0.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"{
      "meta": {"hostname": "node-a3", "affinity_summary": {"numa_nodes": {
        "0": {"cpus": [0, 1]}, "1": {"cpus": [2, 3]}}}},
      "metrics": [
        {"test": "core_h2d_matrix", "host_cpu": 0, "device_id": 0, "size_mb": 64, "gbps": 12.7, "status": "ok"},
        {"test": "core_h2d_matrix", "host_cpu": 2, "device_id": 1, "size_mb": 64, "gbps": 58.4, "status": "ok"},
        {"test": "core_h2d_matrix", "host_cpu": 3, "device_id": 1, "size_mb": 64, "status": "error", "error": "cudaErrorUnknown"},
        {"test": "core_pair_d2d_matrix", "rank0_cpu": 1, "rank1_cpu": 3, "device_pair": [5, 0], "size_mb": 16, "alg_gbps": 13.7, "status": "ok"},
        {"test": "nccl_allgather", "gbps": 100},
        {"test": "core_h2d_matrix", "device_id": 1, "size_mb": 64, "gbps": 1, "status": "ok"}
      ]}"#;

    #[test]
    fn seed_like_results_parse_into_cells() {
        let ds = parse(SAMPLE).unwrap();
        assert_eq!(ds.numa_nodes[&1], vec![2, 3]);
        assert_eq!(ds.cells.len(), 4);
        let slow = &ds.cells[0];
        assert_eq!(slow.matrix.size_bytes, 64 << 20);
        assert_eq!(slow.value(), Some(12.7e9));
        let failed = ds.cells.iter().find(|c| c.cpu == 3).unwrap();
        assert!(
            failed.samples.is_empty(),
            "an error row is not zero bandwidth"
        );
        assert_eq!(failed.errors, vec!["error: cudaErrorUnknown"]);
        let pair = ds
            .cells
            .iter()
            .find(|c| c.matrix.kind == MatrixKind::Pair)
            .unwrap();
        assert_eq!(pair.matrix.pair.as_deref(), Some("0,5"));
        assert_eq!((pair.cpu, pair.peer_cpu), (1, Some(3)));
        assert_eq!(pair.value(), Some(13.7e9));
        let meta: BTreeMap<_, _> = ds.meta.iter().cloned().collect();
        assert_eq!(meta["hostname"], "node-a3");
        assert!(meta["skipped rows"].starts_with("1 (first: metrics[5]: no host_cpu"));
        assert_eq!(meta["other tests (not shown)"], "nccl_allgather x1");
        assert_eq!(ds.devices.len(), 2);
    }

    #[test]
    fn not_results_json_is_an_error() {
        assert!(matches!(parse("{}"), Err(ClusterHealthError::Shape(_))));
        assert!(matches!(parse("[1"), Err(ClusterHealthError::Json(_))));
    }
}
