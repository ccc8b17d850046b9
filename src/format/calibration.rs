//! The calibration ledger (`chd ledger`, `GET /api/v1/calibration`): one JSON document per
//! node, `"schema": "chd.calibration/v2"`, and the fleet file `chd ledger --merge` makes of
//! several (`"schema": "chd.calibration-fleet/v1"`). Plain records only; their JSON Schema
//! (draft 2020-12) is `docs/calibration.schema.json`, which `tests/fleet/ledger.rs` validates real
//! outputs against. Lists are in natural order (CPUs ascending, devices `0, 1, ... 10`), so two
//! ledgers of one node diff cleanly; bandwidths are decimal GB/s.
//!
//! Versions: v2 (issue 28) added `d2d`, `p2p`, `sweeps`, `basics` and the findings and
//! thresholds of the first two; a v1 document still reads (those fields empty). Issue 28
//! part 4 added `node.packages` and `node.cores` to v2 (an addition older readers ignore, so
//! no new version; an earlier document reads with them empty). Forward: a
//! newer document's fields this chd does not know are ignored, the verdict's included (its
//! records once refused them), so an older chd reads a newer ledger as far as it knows it;
//! only a schema of another major name (`chd.calibration/v3`) is refused.

use serde::{Deserialize, Serialize};

/// The `schema` of a node's ledger.
pub const SCHEMA: &str = "chd.calibration/v2";
/// The `schema` of the ledgers this chd still reads (their missing fields are empty).
pub const READABLE_SCHEMAS: [&str; 2] = [SCHEMA, "chd.calibration/v1"];
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
    /// Same-device copies (device memory to device memory of one device), one entry per
    /// size (v2).
    #[serde(default)]
    pub d2d: Vec<D2dSize>,
    /// The ordered device x device peer copy matrix with its PCIe path classes (v2).
    #[serde(default)]
    pub p2p: P2p,
    /// Size curves (`chd probe sweep`) with their plateau and dips (v2; a store holds none:
    /// only a recorded run's ledger has them).
    #[serde(default)]
    pub sweeps: Vec<SweepCurve>,
    /// The basic validation table (`chd probe basics`; v2, a recorded run's only).
    #[serde(default)]
    pub basics: Basics,
    /// What `chd probe fabric` measured between this node and its peers, from the state
    /// directory's fabric results (issue 26; absent where there are none, and in ledgers of
    /// chd before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<Fabric>,
}

/// The fabric between this node and its peers, over the runs the node keeps per peer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fabric {
    /// Each rail and direction over all peers: what `chd serve` publishes
    /// (`chd_fabric_rail_*`).
    pub rails: Vec<FabricRail>,
    /// The collectives over all ranks (`chd_fabric_collective_bus_gbps`).
    pub collectives: Vec<FabricCollective>,
    /// Runs kept, by outcome.
    pub runs: Vec<FabricRuns>,
    /// This node's row of the node x node matrix: each peer, what each rail carried to and
    /// from it. A fleet file (`chd ledger --merge`) holds every node's row.
    pub peers: Vec<FabricPeer>,
    /// Result files that could not be read, with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<String>,
}

/// One rail in one direction over all peers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FabricRail {
    /// A network interface (`eth1`) or an RDMA port (`mlx5_0:1`).
    pub rail: String,
    /// `send` (to the peers) or `receive`.
    pub direction: String,
    /// Median GB/s over the runs (a transfer that carried nothing counts 0).
    pub gbps: f64,
    /// Median of the per-run ratios to the node's other rails; absent with one rail.
    pub ratio: Option<f64>,
    /// `ratio` below the `ChdFabricRailSlow` threshold (0.7).
    pub slow: bool,
    pub slowest_peer: String,
    pub slowest_peer_gbps: f64,
    pub runs: u64,
}

/// One collective over all ranks of the runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FabricCollective {
    /// `allgather`, `allreduce`.
    pub op: String,
    pub size_bytes: u64,
    /// Median bus bandwidth (nccl-tests' definition), GB/s.
    pub bus_gbps: f64,
}

/// Runs of one outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FabricRuns {
    /// `ok`, `failed`.
    pub outcome: String,
    pub runs: u64,
    /// Unix seconds the newest of them finished.
    pub last_finished: f64,
}

/// One peer node and what each rail carried to and from it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FabricPeer {
    pub peer: String,
    /// Runs kept with this peer (all outcomes), and how the newest ended.
    pub runs: u64,
    pub last_outcome: String,
    pub last_finished: f64,
    /// The newest run's error, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    pub rails: Vec<FabricPeerRail>,
}

/// One rail in one direction with one peer, over the successful runs with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FabricPeerRail {
    pub rail: String,
    pub peer_rail: Option<String>,
    pub direction: String,
    /// Median GB/s over the runs (0 for a run where it carried nothing).
    pub gbps: f64,
    /// Runs in which the rail was judged slow, of `runs`.
    pub slow_runs: u64,
    pub runs: u64,
}

/// The same-device copy cells of one size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct D2dSize {
    pub size_bytes: u64,
    /// Median over the devices' values: the node's typical device.
    pub typical_gbps: Option<f64>,
    /// In natural order.
    pub devices: Vec<D2dDevice>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct D2dDevice {
    pub device: String,
    /// Median of its recent samples; `null` when every attempt failed.
    pub gbps: Option<f64>,
    pub samples: u64,
    pub failed: u64,
    /// `gbps` / `typical_gbps` (`chd_d2d_device_ratio`).
    pub ratio: Option<f64>,
}

/// The peer copy matrix.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct P2p {
    /// In natural order of source, then destination.
    pub pairs: Vec<P2pPair>,
    /// Nearest class first (`PIX`, `PXB`, `PHB`, `NODE`, `SYS`, then `unknown`).
    pub classes: Vec<P2pClass>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct P2pPair {
    pub src: String,
    pub dst: String,
    /// The pair's PCIe path class, `unknown` where not read.
    pub path: String,
    /// `copy`, `copy-staged`, where known.
    pub method: Option<String>,
    pub gbps: Option<f64>,
    pub samples: u64,
    pub failed: u64,
    /// `gbps` / the median of its path class (`ChdP2PPairSlow`'s ratio).
    pub ratio: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct P2pClass {
    pub path: String,
    pub pairs: u64,
    pub measured: u64,
    pub median_gbps: Option<f64>,
    pub min_gbps: Option<f64>,
    pub max_gbps: Option<f64>,
}

/// One operation's size curve on one device under one setting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepCurve {
    /// `h2d`, `d2h`, `d2d`, `allgather`.
    pub op: String,
    pub device: String,
    /// What it was measured under (a load profile, `HCCL_BUFFSIZE=32`).
    pub setting: String,
    /// Highest median among the points that are not dips.
    pub max_gbps: Option<f64>,
    /// The smallest size from which every point that is not a dip stays within
    /// `plateau_band` of `max_gbps`; `null` when the curve falls at its end.
    pub plateau_bytes: Option<u64>,
    /// (max - min) / median of the plateau's points.
    pub plateau_scatter: Option<f64>,
    /// `analysis::sweep::PLATEAU_BAND`.
    pub plateau_band: f64,
    /// `analysis::sweep::DIP_RATIO`: a dip is below it on both sides.
    pub dip_ratio: f64,
    /// Sizes ascending.
    pub points: Vec<SweepPoint>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepPoint {
    pub size_bytes: u64,
    pub gbps: Option<f64>,
    /// (max - min) / median of its samples.
    pub spread: Option<f64>,
    pub samples: u64,
    pub failed: u64,
    pub dip: bool,
    /// The spread is above `analysis::sweep::REMEASURE_SPREAD`.
    pub remeasure: bool,
    /// Every sample failed as unsupported by the backend.
    pub unsupported: bool,
    pub last_error: Option<String>,
}

/// The basic validation table: per measurement and load profile, the slowest and the fastest
/// device.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Basics {
    pub rows: Vec<BasicsRow>,
    /// Measurements the run could not make at all, and why.
    pub unavailable: Vec<BasicsUnavailable>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BasicsRow {
    /// `h2d`, `d2h`, `d2d`, `matmul`, `allgather`, ...
    pub measurement: String,
    /// The unit of the values (`GB/s`, `TFLOP/s`).
    pub unit: String,
    pub load: String,
    pub slowest: Option<BasicsValue>,
    pub fastest: Option<BasicsValue>,
    /// Slowest over fastest.
    pub slowest_over_fastest: Option<f64>,
    /// The slowest is below `analysis::basics::WEAK_DEVICE_RATIO` x the fastest.
    pub weak: bool,
    pub measured: u64,
    pub failed: Vec<BasicsFailure>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BasicsValue {
    pub device: String,
    /// In `unit`.
    pub value: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BasicsFailure {
    pub device: String,
    pub error: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BasicsUnavailable {
    pub measurement: String,
    pub why: String,
}

/// The node's verdict and the causes it names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
pub struct VerdictChange {
    pub from: String,
    pub to: String,
    pub count: u64,
}

/// One cause of a verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// The CPU packages (sockets) and their CPUs, where sysfs says: with `cores`, the
    /// per-CPU facts of `chd_cpu_info`, which `/metrics` exports only with
    /// `exposition.cpu_series = "all"` (issue 28 part 4). Empty in earlier documents.
    #[serde(default)]
    pub packages: Vec<Package>,
    /// Each physical core (package, core id) and its CPUs (SMT siblings), in order of its
    /// first CPU. Empty in earlier documents.
    #[serde(default)]
    pub cores: Vec<Core>,
    pub devices: Vec<Device>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NumaNode {
    pub id: u32,
    /// cpulist.
    pub cpus: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Package {
    /// `physical_package_id`.
    pub id: u32,
    /// cpulist.
    pub cpus: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Core {
    pub package: u32,
    /// `core_id` (unique within its package only).
    pub core: u32,
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
    /// Same-device copies below `thresholds.slow_d2d_device_ratio` of the typical device (v2).
    #[serde(default)]
    pub slow_d2d_devices: Vec<SlowD2dDevice>,
    /// Peer copies below `thresholds.slow_p2p_pair_ratio` of their path class median (v2).
    #[serde(default)]
    pub slow_p2p_pairs: Vec<SlowP2pPair>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlowD2dDevice {
    pub size_bytes: u64,
    pub device: String,
    pub ratio: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlowP2pPair {
    pub src: String,
    pub dst: String,
    pub path: String,
    pub ratio: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Thresholds {
    pub slow_device_ratio: f64,
    pub slow_segment_ratio: f64,
    pub slow_cpu_ratio: f64,
    pub extreme_cell_ratio: f64,
    /// v2; a v1 document was judged by the same constant.
    #[serde(default = "slow_d2d_device_ratio")]
    pub slow_d2d_device_ratio: f64,
    #[serde(default = "slow_p2p_pair_ratio")]
    pub slow_p2p_pair_ratio: f64,
}

/// The thresholds a v1 document's (absent) d2d and p2p findings would have been judged by:
/// `analysis`'s constants then (`ledger`'s tests hold them equal to today's).
pub const V1_SLOW_D2D_DEVICE_RATIO: f64 = 0.6;
pub const V1_SLOW_P2P_PAIR_RATIO: f64 = 0.7;

fn slow_d2d_device_ratio() -> f64 {
    V1_SLOW_D2D_DEVICE_RATIO
}

fn slow_p2p_pair_ratio() -> f64 {
    V1_SLOW_P2P_PAIR_RATIO
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
        "{source_name}: schema {found:?} is not {SCHEMA:?} or an older one this chd reads \
         (a ledger of another chd version; make it again with this chd)"
    )]
    Version { source_name: String, found: String },
    #[error("{source_name}: not a chd calibration ledger: {error}")]
    Shape {
        source_name: String,
        error: serde_json::Error,
    },
}

/// Parse one node's ledger of [`READABLE_SCHEMAS`] (as [`SCHEMA`]), refusing another schema
/// version by name before its shape.
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
    if !READABLE_SCHEMAS.contains(&found) {
        return Err(CalibrationError::Version {
            source_name: source_name.to_string(),
            found: found.to_string(),
        });
    }
    let mut ledger: Ledger =
        serde_json::from_value(value).map_err(|error| CalibrationError::Shape {
            source_name: source_name.to_string(),
            error,
        })?;
    // An older document is read as this version: its missing fields are empty, and it is
    // written back (a fleet file of it) in this version's shape.
    ledger.schema = SCHEMA.to_string();
    Ok(ledger)
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
    fn a_v1_ledger_reads_with_empty_v2_fields_and_a_newer_verdict_field_is_ignored() {
        let text = include_str!("../../tests/fixtures/ledger/v1-advise.json");
        let ledger = parse("v1-advise.json", text).unwrap();
        assert_eq!(ledger.schema, SCHEMA);
        assert!(ledger.d2d.is_empty() && ledger.sweeps.is_empty());
        assert_eq!(
            (ledger.p2p.clone(), ledger.basics.clone()),
            Default::default()
        );
        assert_eq!(ledger.findings.thresholds.slow_d2d_device_ratio, 0.6);
        assert!(!ledger.h2d_gbps_by_core_device.is_empty());
        let verdict = ledger.verdict.as_ref().unwrap();
        assert!(
            !verdict.causes.is_empty(),
            "the fixture's verdict names causes"
        );
        // A later chd's verdict, causes and top-level fields this one does not know.
        let mut newer: serde_json::Value = serde_json::from_str(text).unwrap();
        newer["verdict"]["confidence"] = 0.9.into();
        newer["verdict"]["causes"][0]["since"] = "2026-01-01T00:00:00Z".into();
        newer["thermals"] = serde_json::json!({"0": 71});
        let read = parse("newer.json", &newer.to_string()).unwrap();
        assert_eq!(read.verdict, ledger.verdict);
    }

    #[test]
    fn another_version_is_refused_by_name() {
        let e = parse("a.json", r#"{"schema": "chd.calibration/v0"}"#).unwrap_err();
        assert!(e.to_string().contains("chd.calibration/v0"), "{e}");
        let e = parse("a.json", r#"{"schema": "chd.calibration/v3"}"#).unwrap_err();
        assert!(e.to_string().contains("chd.calibration/v3"), "{e}");
        for readable in READABLE_SCHEMAS {
            let e = parse("a.json", &format!(r#"{{"schema": "{readable}"}}"#)).unwrap_err();
            assert!(matches!(e, CalibrationError::Shape { .. }), "{e}");
        }
        assert!(parse("a.json", "nope").is_err());
    }
}
