//! The calibration ledger (`chd ledger`, `GET /api/v1/calibration`): one JSON document per
//! node, `"schema": "chd.calibration/v1"`, and the fleet file `chd ledger --merge` makes of
//! several (`"schema": "chd.calibration-fleet/v1"`). Plain records only; their JSON Schema
//! (draft 2020-12) is `docs/calibration.schema.json`, which `tests/fleet/ledger.rs` validates real
//! outputs against. Lists are in natural order (CPUs ascending, devices `0, 1, ... 10`), so two
//! ledgers of one node diff cleanly; bandwidths are decimal GB/s.

use serde::{Deserialize, Serialize};

/// The `schema` of a node's ledger.
pub const SCHEMA: &str = "chd.calibration/v1";
/// The `schema` of a fleet file.
pub const FLEET_SCHEMA: &str = "chd.calibration-fleet/v1";

/// One node's calibration ledger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ledger {
    /// [`SCHEMA`].
    pub schema: String,
    /// Unix time, seconds, the document was made; every `age_seconds` is counted from it.
    pub generated_at: f64,
    /// What it was made from: `chd serve`, a recording's path, a state directory.
    pub source: String,
    pub node: Node,
    /// Core x device copy matrices, one per (size, direction).
    pub h2d_gbps_by_core_device: Vec<H2dMatrix>,
    /// Core-pair matrices, one per device pair.
    pub d2d_alg_gbps_by_core_pair: Vec<PairMatrix>,
    pub affinity_bindable_cpus: Affinity,
    /// Device -> load profile -> (column median under that profile / under `idle`), on the
    /// matrix of the largest size, h2d before d2h. Empty where the source has one profile.
    pub load_profile_delta: LoadProfileDelta,
    /// The analysis (`src/analysis`) of the matrices: columns, segments, pair CPUs.
    pub analysis: Analysis,
    /// What is below the thresholds of the alert rules (`analysis::findings`).
    pub findings: Findings,
    /// The node's verdict (`analysis::verdict`); absent in ledgers of chd before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<Verdict>,
}

/// The node's verdict and the causes it names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Verdict {
    /// `ok`, `degraded`, `failed`.
    pub level: String,
    /// True for `chd serve`'s verdict, which names a finding after it showed in several
    /// windows in a row; false for a snapshot (a recording, a state directory), where every
    /// finding counts at once.
    pub held: bool,
    pub causes: Vec<VerdictCause>,
    /// How often a held verdict changed level since `chd serve` started (the pairs that did);
    /// absent for a snapshot and in ledgers of chd before issue 27.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<VerdictChange>,
    /// When the last change was (RFC 3339, UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_change: Option<String>,
}

/// One kind of change of a held verdict and how often it happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerdictChange {
    pub from: String,
    pub to: String,
    pub count: u64,
}

/// One cause of a verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerdictCause {
    /// Stable while the same thing is wrong: `slow_device:0`, `link_degraded:1`.
    pub id: String,
    pub level: String,
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
}

/// Identity and topology.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub host: String,
    /// `cuda`, `acl`, `host`, or `replay` for a recording that does not say.
    pub backend: String,
    /// The CPUs the node has (cpulist, e.g. `0-63`).
    pub cpus: String,
    pub numa_nodes: Vec<NumaNode>,
    pub devices: Vec<Device>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NumaNode {
    pub id: u32,
    /// cpulist.
    pub cpus: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Device {
    pub id: String,
    pub kind: String,
    pub name: String,
    /// Empty where unknown.
    pub pci_bus_id: String,
    /// The NUMA node sysfs declares for the device.
    pub declared_numa_node: Option<u32>,
    /// The NUMA node whose CPUs feed it best (`chd_device_measured_numa_node`).
    pub measured_numa_node: Option<u32>,
    /// The PCIe link the copies ran over, where known.
    pub link: Option<Link>,
    /// The CPUs within [`BestCpus::tolerance`] of the device's best cell.
    pub best_cpus: Option<BestCpus>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Link {
    pub current: LinkState,
    pub max: LinkState,
    /// Payload bandwidth of the current state, GB/s, where its generation is known.
    pub payload_gbps: Option<f64>,
    /// Seconds since it was read, where known.
    pub age_seconds: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkState {
    pub width: u32,
    pub gts: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BestCpus {
    /// cpulist.
    pub cpus: String,
    /// Their NUMA nodes, ascending.
    pub numa_nodes: Vec<u32>,
    /// The device's best cell, GB/s.
    pub best_gbps: f64,
    /// 0.05: a CPU is listed when its cell is at least (1 - tolerance) x the best.
    pub tolerance: f64,
    /// The matrix judged.
    pub size_bytes: u64,
    pub direction: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct H2dMatrix {
    pub size_bytes: u64,
    pub direction: String,
    /// By CPU, then device in natural order.
    pub cells: Vec<H2dCell>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct H2dCell {
    pub cpu: u32,
    pub device: String,
    /// Median of the cell's recent samples; `null` for a cell that only failed.
    pub gbps: Option<f64>,
    pub samples: u64,
    /// Seconds since the newest sample, where known.
    pub age_seconds: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairMatrix {
    /// The two devices, `0,5`.
    pub pair: String,
    /// By rank 0's CPU, then rank 1's.
    pub cells: Vec<PairCell>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairCell {
    pub rank0_cpu: u32,
    pub rank1_cpu: u32,
    /// Bus bandwidth, GB/s.
    pub gbps: Option<f64>,
    pub samples: u64,
    pub age_seconds: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Affinity {
    /// Whether the affinity probe has run (else both lists are empty).
    pub probed: bool,
    /// cpulist.
    pub bindable: String,
    /// cpulist.
    pub not_bindable: String,
    /// Seconds since the oldest verdict, where known.
    pub age_seconds: Option<f64>,
}

/// Device -> load profile -> ratio to idle, both in natural order.
pub type LoadProfileDelta = NaturalMap<NaturalMap<f64>>;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Analysis {
    pub h2d: Vec<H2dAnalysis>,
    pub pairs: Vec<PairAnalysis>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct H2dAnalysis {
    pub size_bytes: u64,
    pub direction: String,
    pub cells: u64,
    pub measured: u64,
    pub median_gbps: Option<f64>,
    pub devices: Vec<Column>,
    pub segments: Vec<Segment>,
}

/// A device column: its median and its ratio to the median of all column medians.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Column {
    pub device: String,
    pub median_gbps: f64,
    pub cells: u64,
    pub ratio: Option<f64>,
}

/// One NUMA node's CPUs on one device, with its ratio to the device's best segment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    pub numa_node: Option<u32>,
    pub device: String,
    pub median_gbps: f64,
    pub cells: u64,
    pub ratio: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairAnalysis {
    pub pair: String,
    pub cells: u64,
    pub measured: u64,
    pub median_gbps: Option<f64>,
    /// By rank, then CPU.
    pub cpus: Vec<PairCpu>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairCpu {
    pub rank: u8,
    pub cpu: u32,
    pub numa_node: Option<u32>,
    pub median_gbps: f64,
    pub ratio: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Findings {
    pub thresholds: Thresholds,
    pub slow_devices: Vec<SlowDevice>,
    pub slow_segments: Vec<SlowSegment>,
    pub slow_cores: Vec<SlowCore>,
    pub extreme_cells: Vec<ExtremeCell>,
    pub slow_pair_cpus: Vec<SlowPairCpu>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Thresholds {
    pub slow_device_ratio: f64,
    pub slow_segment_ratio: f64,
    pub slow_cpu_ratio: f64,
    pub extreme_cell_ratio: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlowDevice {
    pub size_bytes: u64,
    pub direction: String,
    pub device: String,
    pub ratio: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlowSegment {
    pub size_bytes: u64,
    pub direction: String,
    pub numa_node: Option<u32>,
    pub device: String,
    pub ratio: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlowCore {
    pub size_bytes: u64,
    pub direction: String,
    pub cpu: u32,
    pub numa_node: Option<u32>,
    pub ratio: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExtremeCell {
    pub size_bytes: u64,
    pub direction: String,
    pub cpu: u32,
    pub device: String,
    pub gbps: f64,
    pub ratio: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlowPairCpu {
    pub pair: String,
    pub rank: u8,
    pub cpu: u32,
    pub numa_node: Option<u32>,
    pub ratio: f64,
}

/// Several nodes' ledgers in one file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fleet {
    /// [`FLEET_SCHEMA`].
    pub schema: String,
    /// By host, in natural order.
    pub nodes: Vec<Ledger>,
}

/// A JSON object whose keys keep the order they were given in (natural order here), where
/// serde_json's own map would sort them as strings (`10` before `2`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NaturalMap<V>(pub Vec<(String, V)>);

impl<V: Serialize> Serialize for NaturalMap<V> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for NaturalMap<V> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = std::collections::BTreeMap::<String, V>::deserialize(d)?;
        let mut entries: Vec<(String, V)> = map.into_iter().collect();
        entries.sort_by(|a, b| crate::topology::natural::natural_cmp(&a.0, &b.0));
        Ok(NaturalMap(entries))
    }
}

/// Why a ledger could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CalibrationError {
    #[error("{source_name}: not JSON: {error}")]
    Json {
        source_name: String,
        error: serde_json::Error,
    },
    #[error(
        "{source_name}: schema {found:?} is not {SCHEMA:?} (a ledger of another chd version; \
         make it again with this chd)"
    )]
    Version { source_name: String, found: String },
    #[error("{source_name}: not a chd calibration ledger: {error}")]
    Shape {
        source_name: String,
        error: serde_json::Error,
    },
}

/// Parse one node's ledger, refusing another schema version by name before its shape.
pub fn parse(source_name: &str, text: &str) -> Result<Ledger, CalibrationError> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|error| CalibrationError::Json {
            source_name: source_name.to_string(),
            error,
        })?;
    let found = value
        .get("schema")
        .and_then(|s| s.as_str())
        .unwrap_or("(none)");
    if found != SCHEMA {
        return Err(CalibrationError::Version {
            source_name: source_name.to_string(),
            found: found.to_string(),
        });
    }
    serde_json::from_value(value).map_err(|error| CalibrationError::Shape {
        source_name: source_name.to_string(),
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_map_keeps_natural_order_both_ways() {
        let m: NaturalMap<f64> =
            serde_json::from_str(r#"{"10": 1.0, "2": 2.0, "1": 3.0}"#).unwrap();
        let keys: Vec<&str> = m.0.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["1", "2", "10"]);
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"{"1":3.0,"2":2.0,"10":1.0}"#
        );
    }

    #[test]
    fn another_version_is_refused_by_name() {
        let e = parse("a.json", r#"{"schema": "chd.calibration/v0"}"#).unwrap_err();
        assert!(e.to_string().contains("chd.calibration/v0"), "{e}");
        let e = parse("a.json", r#"{"schema": "chd.calibration/v1"}"#).unwrap_err();
        assert!(matches!(e, CalibrationError::Shape { .. }), "{e}");
        assert!(parse("a.json", "nope").is_err());
    }
}
