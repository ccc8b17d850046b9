//! Reader of ClusterHealthDetect's `results.json` (the Python tool chd's mission comes from):
//! `meta.affinity_summary.numa_nodes` gives the CPU -> NUMA map; `metrics` rows of test
//! `core_h2d_matrix` (`host_cpu`, `device_id`, `size_mb` in MiB, `gbps` in decimal GB/s) and
//! `core_pair_d2d_matrix` (`rank0_cpu`, `rank1_cpu`, `alg_gbps`, `device_pair`) are cells.
//! Rows whose `status` is not `ok` are failed cells, never zero bandwidth.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::runtime::Direction;

/// Why a results file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ClusterHealthError {
    #[error("not JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("row {index}: {problem}")]
    Row { index: usize, problem: String },
}

/// One H2D cell of the file.
#[derive(Debug, Clone, PartialEq)]
pub struct H2dRow {
    pub cpu: u32,
    pub device: String,
    pub size_bytes: u64,
    pub direction: Direction,
    /// Bytes per second; `None` for a failed row.
    pub bytes_per_second: Option<f64>,
    /// The row's status when not `ok`.
    pub error: Option<String>,
}

/// One core-pair cell of the file.
#[derive(Debug, Clone, PartialEq)]
pub struct PairRow {
    /// `pair` label: the two devices ascending, comma-joined.
    pub pair: String,
    pub cpu0: u32,
    pub cpu1: u32,
    pub bytes_per_second: Option<f64>,
    pub error: Option<String>,
}

/// Everything chd takes from a results file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recording {
    /// NUMA node -> its CPUs, from `meta.affinity_summary.numa_nodes`.
    pub numa_nodes: BTreeMap<u32, Vec<u32>>,
    pub h2d: Vec<H2dRow>,
    pub pairs: Vec<PairRow>,
    /// Rows of other tests, skipped.
    pub skipped_rows: usize,
}

#[derive(Deserialize)]
struct File {
    #[serde(default)]
    meta: Value,
    metrics: Vec<Value>,
}

fn number(row: &Value, key: &str) -> Option<f64> {
    match &row[key] {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn id(row: &Value, key: &str) -> Result<u32, String> {
    number(row, key)
        .filter(|v| *v >= 0.0 && v.fract() == 0.0 && *v <= f64::from(u32::MAX))
        .map(|v| v as u32)
        .ok_or_else(|| format!("{key} is missing or not a non-negative integer"))
}

fn status(row: &Value) -> Option<String> {
    match row.get("status").and_then(Value::as_str) {
        None | Some("ok") => None,
        Some(other) => Some(other.to_string()),
    }
}

fn pair_label(row: &Value) -> Result<String, String> {
    let devices: Vec<String> = match &row["device_pair"] {
        Value::Array(a) => a
            .iter()
            .map(|v| v.to_string().trim_matches('"').to_string())
            .collect(),
        Value::String(s) => s
            .split(|c: char| !c.is_ascii_alphanumeric())
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect(),
        _ => return Err("device_pair is missing".into()),
    };
    match &devices[..] {
        [a, b] => Ok(crate::probe::pairs::pair_label(a, b)),
        _ => Err(format!(
            "device_pair {:?} is not two devices",
            row["device_pair"]
        )),
    }
}

/// Parse a results file.
pub fn parse(text: &str) -> Result<Recording, ClusterHealthError> {
    let file: File = serde_json::from_str(text)?;
    let mut rec = Recording::default();
    if let Some(nodes) = file.meta["affinity_summary"]["numa_nodes"].as_object() {
        for (node, body) in nodes {
            let Ok(node) = node.parse::<u32>() else {
                continue;
            };
            let cpus = body["cpus"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|c| c.as_u64())
                        .map(|c| c as u32)
                        .collect()
                })
                .unwrap_or_default();
            rec.numa_nodes.insert(node, cpus);
        }
    }
    for (index, row) in file.metrics.iter().enumerate() {
        let err = |problem: String| ClusterHealthError::Row { index, problem };
        let error = status(row);
        match row["test"].as_str() {
            Some("core_h2d_matrix") => {
                let direction = match row.get("direction").and_then(Value::as_str) {
                    None => Direction::H2d,
                    Some(d) => d.parse().map_err(err)?,
                };
                let size_mb =
                    number(row, "size_mb").ok_or_else(|| err("size_mb is missing".into()))?;
                let bytes_per_second = match error {
                    Some(_) => None,
                    None => Some(
                        number(row, "gbps")
                            .ok_or_else(|| err("gbps is missing on an ok row".into()))?
                            * 1e9,
                    ),
                };
                rec.h2d.push(H2dRow {
                    cpu: id(row, "host_cpu").map_err(err)?,
                    device: id(row, "device_id").map_err(err)?.to_string(),
                    size_bytes: (size_mb * 1024.0 * 1024.0).round() as u64,
                    direction,
                    bytes_per_second,
                    error,
                });
            }
            Some("core_pair_d2d_matrix") => {
                let bytes_per_second = match error {
                    Some(_) => None,
                    None => Some(
                        number(row, "alg_gbps")
                            .ok_or_else(|| err("alg_gbps is missing on an ok row".into()))?
                            * 1e9,
                    ),
                };
                rec.pairs.push(PairRow {
                    pair: pair_label(row).map_err(err)?,
                    cpu0: id(row, "rank0_cpu").map_err(err)?,
                    cpu1: id(row, "rank1_cpu").map_err(err)?,
                    bytes_per_second,
                    error,
                });
            }
            _ => rec.skipped_rows += 1,
        }
    }
    Ok(rec)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: &str = r#"{
      "meta": {"host": "a3-node-17", "affinity_summary": {"numa_nodes": {
        "0": {"cpus": [0, 1]}, "1": {"cpus": [2, 3]}}}},
      "metrics": [
        {"test": "core_h2d_matrix", "host_cpu": 0, "device_id": 0, "size_mb": 64, "gbps": 12.7, "status": "ok"},
        {"test": "core_h2d_matrix", "host_cpu": 2, "device_id": 1, "size_mb": 64, "gbps": 58.4, "status": "ok"},
        {"test": "core_h2d_matrix", "host_cpu": 3, "device_id": 1, "size_mb": 16, "gbps": 0, "status": "timeout"},
        {"test": "core_pair_d2d_matrix", "rank0_cpu": 104, "rank1_cpu": 7, "alg_gbps": 13.7, "device_pair": "5-0", "status": "ok"},
        {"test": "core_pair_d2d_matrix", "rank0_cpu": 1, "rank1_cpu": 2, "device_pair": [0, 5], "status": "error: hccl"},
        {"test": "bare_allgather", "gbps": 20}
      ]}"#;

    #[test]
    fn seed_layout_reads_exactly() {
        let r = parse(SEED).unwrap();
        assert_eq!(r.numa_nodes[&1], vec![2, 3]);
        assert_eq!(r.h2d.len(), 3);
        assert_eq!(r.h2d[0].size_bytes, 64 << 20);
        assert_eq!(r.h2d[0].bytes_per_second, Some(12.7e9));
        assert_eq!(r.h2d[0].device, "0");
        // A failed row is an error, not zero bandwidth.
        assert_eq!(r.h2d[2].bytes_per_second, None);
        assert_eq!(r.h2d[2].error.as_deref(), Some("timeout"));
        assert_eq!(r.pairs[0].pair, "0,5");
        assert_eq!((r.pairs[0].cpu0, r.pairs[0].cpu1), (104, 7));
        assert_eq!(r.pairs[0].bytes_per_second, Some(13.7e9));
        assert_eq!(r.pairs[1].pair, "0,5");
        assert!(r.pairs[1].error.is_some());
        assert_eq!(r.skipped_rows, 1);
    }

    #[test]
    fn bad_rows_name_their_index_and_key() {
        let text = r#"{"metrics": [{"test": "core_h2d_matrix", "host_cpu": -1, "device_id": 0, "size_mb": 64, "gbps": 1, "status": "ok"}]}"#;
        let e = parse(text).unwrap_err().to_string();
        assert!(e.starts_with("row 0: host_cpu"), "{e}");
        assert!(parse("{").is_err());
    }
}
