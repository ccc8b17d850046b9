//! One node-level verdict from what chd measured: `ok`, `degraded` or `failed`, with its
//! causes. The thresholds are the findings' (those of the alert rules); this module only says
//! which findings make a node unusable (`failed`: a device slow from every CPU, or one whose
//! every cell fails) and which make it usable with care (`degraded`: a slow NUMA segment, a
//! slow core of a pair, a PCIe link trained below its maximum, CPUs that cannot be bound, an
//! RDMA port that is not ACTIVE, a device slow at copying within its own memory
//! (`analysis::d2d`), an ordered device pair whose peer copies fall below
//! [`SLOW_PAIR_RATIO`] x the median of its PCIe path class (`analysis::p2p`), a fabric rail
//! below [`RAIL_SLOW_RATIO`] x the node's other rails to the same peers (`analysis::fabric`,
//! from `chd probe fabric`'s results)). A device the telemetry reports lost (fallen off the
//! bus) is `failed` too, whatever its old cells say.
//! Each cause has a stable id, so a scheduler-facing layer can hold a verdict steady across
//! windows (`schedule::verdict`'s hysteresis).

use crate::vocab::DevicePair;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::cell::NumaMap;
use super::d2d::D2dDevices;
use super::fabric::{RailSummary, RAIL_SLOW_RATIO};
use super::findings::SLOW_D2D_DEVICE_RATIO;
use super::h2d::H2dMatrix;
use super::limits::PathLimits;
use super::live::{self, MatrixKey, StoreAnalysis};
use super::p2p::{P2pMatrix, SLOW_PAIR_RATIO};
use crate::store::Store;
use crate::topology::cpulist;
use crate::topology::natural::natural_key;
use crate::topology::pci_link::Link;

/// Copies smaller than this are dominated by launch latency and never judged (as the rules'
/// "large copies").
pub const JUDGED_SIZE_BYTES: u64 = 64 << 20;

/// How bad a node (or one cause) is. Ordered: `Ok` < `Degraded` < `Failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    Ok,
    Degraded,
    Failed,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Degraded => "degraded",
            Level::Failed => "failed",
        }
    }

    pub const ALL: [Level; 3] = [Level::Ok, Level::Degraded, Level::Failed];
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One reason for a verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct Cause {
    /// Stable across windows while the same thing is wrong (`slow_device:0`).
    pub id: String,
    pub level: Level,
    /// For people: `device 0 slow column (0.21 x the typical device)`.
    pub text: String,
    /// The device it is about, if one.
    pub device: Option<String>,
}

/// What the verdict reads besides the matrices.
#[derive(Debug, Default)]
pub struct Inputs<'a> {
    /// Device -> its link as read after chd's copies.
    pub links: BTreeMap<String, Link>,
    /// CPUs the affinity probe could not bind.
    pub unbindable: &'a [u32],
    /// RDMA ports (`hca/port`) that are not ACTIVE.
    pub rdma_down: &'a [String],
    /// Devices the telemetry reports lost now.
    pub lost_devices: &'a [String],
    /// Devices quarantined now: a copy cell's work on them did not finish in time.
    pub hung_devices: &'a [String],
    /// The same-device copy cells by size (`analysis::live::d2d_devices`).
    pub d2d: BTreeMap<u64, D2dDevices>,
    /// The peer copy matrix with its path classes (`analysis::live::p2p_matrix`).
    pub p2p: Option<P2pMatrix>,
    /// The fabric's rails over the runs the node keeps (`analysis::fabric::summarize`).
    pub fabric_rails: &'a [RailSummary],
}

/// What a running node observes besides its store, at the verdict's time: nothing for a
/// recording or a state file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    /// RDMA ports (`hca/port`) that are not ACTIVE.
    pub rdma_down: Vec<String>,
    /// Devices the telemetry reports lost (NVML's `NVML_ERROR_GPU_IS_LOST`, ACL's
    /// `ACL_ERROR_RT_LOST_HEARTBEAT`).
    pub lost_devices: Vec<String>,
    /// Devices quarantined because a copy cell's work on them did not finish within
    /// `probe.cell_timeout` (`runtime::stuck_work`).
    pub hung_devices: Vec<String>,
    /// Each ordered device pair's PCIe path class (`SRC>DST` -> `PIX` ... `SYS`), read from
    /// sysfs at start; a pair not named is `unknown` (a recording's pairs, judged in one class).
    pub p2p_paths: BTreeMap<String, String>,
    /// The fabric's rails as the node's fabric results give them (`chd probe fabric`'s files
    /// in the state directory, summarized by `analysis::fabric::summarize`).
    pub fabric_rails: Vec<RailSummary>,
    /// Each device's same-device copy limit (`analysis::limits`): a device above it is
    /// implausible and neither slow nor anyone's reference.
    pub d2d_limits: PathLimits,
}

/// The same-device copy sizes judged: those of at least [`JUDGED_SIZE_BYTES`], else the
/// largest (as the core x device matrices).
fn judged_d2d(d2d: &BTreeMap<u64, D2dDevices>) -> Vec<&D2dDevices> {
    let large: Vec<&D2dDevices> = d2d.range(JUDGED_SIZE_BYTES..).map(|(_, d)| d).collect();
    if large.is_empty() {
        d2d.values().next_back().into_iter().collect()
    } else {
        large
    }
}

/// The matrices judged: sizes of at least [`JUDGED_SIZE_BYTES`]; a source with none of those
/// (a recording of small copies only) is judged at its largest size.
fn judged(analysis: &StoreAnalysis) -> Vec<(&MatrixKey, &H2dMatrix)> {
    let large: Vec<_> = analysis
        .h2d
        .iter()
        .filter(|((size, _), _)| *size >= JUDGED_SIZE_BYTES)
        .collect();
    if !large.is_empty() {
        return large;
    }
    let Some(largest) = analysis.h2d.keys().map(|(size, _)| *size).max() else {
        return Vec::new();
    };
    analysis
        .h2d
        .iter()
        .filter(|((size, _), _)| *size == largest)
        .collect()
}

/// Every cause found in `analysis` and `inputs`, failed ones first, then by id.
pub fn causes(analysis: &StoreAnalysis, inputs: &Inputs<'_>) -> Vec<Cause> {
    let mut out: BTreeMap<String, Cause> = BTreeMap::new();
    let mut add = |id: String, level: Level, text: String, device: Option<&str>| {
        out.entry(id.clone()).or_insert(Cause {
            id,
            level,
            text,
            device: device.map(str::to_string),
        });
    };
    let matrices = judged(analysis);
    for (_, matrix) in &matrices {
        for col in matrix.slow_devices() {
            let ratio = col.ratio.unwrap_or_default();
            add(
                format!("slow_device:{}", col.device),
                Level::Failed,
                format!(
                    "device {} slow column ({ratio:.2} x the typical device)",
                    col.device
                ),
                Some(&col.device),
            );
        }
        for seg in matrix.slow_segments() {
            let node = seg
                .numa_node
                .map(|n| n.to_string())
                .unwrap_or_else(|| "?".into());
            add(
                format!("slow_segment:{node}:{}", seg.device),
                Level::Degraded,
                format!(
                    "device {} slow from NUMA node {node} ({:.2} x its best node)",
                    seg.device,
                    seg.ratio.unwrap_or_default()
                ),
                Some(&seg.device),
            );
        }
    }
    // A device with failed cells and no measured one in any judged matrix.
    let measured: BTreeSet<&str> = matrices
        .iter()
        .flat_map(|(_, m)| m.devices.iter().map(|c| c.device.as_str()))
        .collect();
    let failing: BTreeSet<&str> = matrices
        .iter()
        .flat_map(|(_, m)| m.failures.iter().map(|f| f.device.as_str()))
        .filter(|d| !measured.contains(d))
        .collect();
    for device in failing {
        add(
            format!("failing_device:{device}"),
            Level::Failed,
            format!("device {device}: every cell failed"),
            Some(device),
        );
    }
    for (pair, matrix) in &analysis.pairs {
        for cpu in matrix.slow_cpus() {
            add(
                format!("slow_pair_cpu:{pair}:{}:{}", cpu.rank, cpu.cpu),
                Level::Degraded,
                format!(
                    "pair {pair}: CPU {} as rank {} slow ({:.2} x the pair median)",
                    cpu.cpu,
                    cpu.rank,
                    cpu.ratio.unwrap_or_default()
                ),
                None,
            );
        }
    }
    for devices in judged_d2d(&inputs.d2d) {
        for d in devices.slow() {
            add(
                format!("slow_d2d_device:{}", d.device),
                Level::Degraded,
                format!(
                    "device {} slow copying within its own memory ({:.2} x the typical \
                     device, below {SLOW_D2D_DEVICE_RATIO})",
                    d.device,
                    d.ratio.unwrap_or_default()
                ),
                Some(&d.device),
            );
        }
    }
    for pair in inputs.p2p.iter().flat_map(P2pMatrix::slow_pairs) {
        add(
            format!("slow_p2p_pair:{}", pair.label()),
            Level::Degraded,
            format!(
                "peer copy {} slow ({:.2} x the median of its path class {}, below \
                 {SLOW_PAIR_RATIO})",
                pair.label(),
                pair.ratio.unwrap_or_default(),
                pair.class
            ),
            None,
        );
    }
    for (device, link) in &inputs.links {
        if link.degraded() {
            add(
                format!("link_degraded:{device}"),
                Level::Degraded,
                format!(
                    "device {device} PCIe link {} of {}",
                    link.current.describe(),
                    link.max.describe()
                ),
                Some(device),
            );
        }
    }
    for device in inputs.lost_devices {
        add(
            format!("device_lost:{device}"),
            Level::Failed,
            format!("device {device} lost (its telemetry says it fell off the bus)"),
            Some(device),
        );
    }
    for device in inputs.hung_devices {
        add(
            format!("device_hung:{device}"),
            Level::Failed,
            format!(
                "device {device} hung: a copy on it did not finish within probe.cell_timeout; \
                 quarantined (no cells, its memory kept) until it does"
            ),
            Some(device),
        );
    }
    for rail in inputs.fabric_rails {
        let Some(ratio) = rail.ratio.filter(|r| *r < RAIL_SLOW_RATIO) else {
            continue;
        };
        add(
            format!("slow_fabric_rail:{}:{}", rail.rail, rail.way.as_str()),
            Level::Degraded,
            format!(
                "fabric rail {} ({}) slow: {ratio:.2} x the node's other rails to the same \
                 peers, below {RAIL_SLOW_RATIO} (slowest peer {} at {:.3} GB/s)",
                rail.rail,
                rail.way.as_str(),
                rail.slowest_peer.0,
                rail.slowest_peer.1
            ),
            None,
        );
    }
    for port in inputs.rdma_down {
        add(
            format!("rdma_port_down:{port}"),
            Level::Degraded,
            format!("RDMA port {port} not active"),
            None,
        );
    }
    if !inputs.unbindable.is_empty() {
        add(
            "unbindable_cpus".into(),
            Level::Degraded,
            format!("CPUs {} not bindable", cpulist::format(inputs.unbindable)),
            None,
        );
    }
    let mut causes: Vec<Cause> = out.into_values().collect();
    causes.sort_by(|a, b| {
        b.level
            .cmp(&a.level)
            .then_with(|| natural_key(&a.id).cmp(&natural_key(&b.id)))
    });
    causes
}

/// Every cause in what `store` holds: its matrices analysed as the exposition analyses them
/// (`pairs`: the configured pair labels), its same-device and peer copy cells (the latter in
/// `observed`'s path classes), the links its windows read, its unbindable CPUs,
/// and what the node `observed` now; with the NUMA node measured best for each device.
pub fn causes_of_store(
    store: &Store,
    numa: &NumaMap,
    pairs: &[DevicePair],
    observed: &Observed,
) -> (Vec<Cause>, BTreeMap<String, u32>) {
    let h2d = live::h2d_cells(store);
    let pair_cells = live::pair_cells(store);
    let analysis = StoreAnalysis::of(&live::by_matrix(&h2d), &pair_cells, pairs, numa);
    let unbindable: Vec<u32> = store
        .bindable()
        .iter()
        .filter(|(_, b)| !b.bindable)
        .map(|(&cpu, _)| cpu)
        .collect();
    let inputs = Inputs {
        links: store.link_by_device(),
        unbindable: &unbindable,
        rdma_down: &observed.rdma_down,
        lost_devices: &observed.lost_devices,
        hung_devices: &observed.hung_devices,
        d2d: live::d2d_devices(store, &observed.d2d_limits),
        p2p: (!store.p2p().is_empty())
            .then(|| live::p2p_matrix(store, &observed.p2p_paths, &BTreeMap::new())),
        fabric_rails: &observed.fabric_rails,
    };
    (causes(&analysis, &inputs), analysis.measured_nodes)
}

/// The verdict of `causes`: the worst level among them, `ok` without any.
pub fn level(causes: &[Cause]) -> Level {
    causes.iter().map(|c| c.level).max().unwrap_or(Level::Ok)
}

/// The verdict as published: its level and the causes it names.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeVerdict {
    pub level: Level,
    /// Confirmed causes, worst first.
    pub causes: Vec<Cause>,
    /// Device -> the NUMA node measured best for it (NFD's `best-numa-<device>`).
    pub best_numa: BTreeMap<String, u32>,
    /// How often a held verdict changed level (`chd serve`'s, counted by
    /// `schedule::verdict`); none for a snapshot.
    pub changes: VerdictChanges,
}

impl Default for NodeVerdict {
    fn default() -> Self {
        NodeVerdict {
            level: Level::Ok,
            causes: Vec::new(),
            best_numa: BTreeMap::new(),
            changes: VerdictChanges::default(),
        }
    }
}

/// The changes of a held verdict's level since `chd serve` started: a node that fails,
/// recovers and fails again shows two changes into `failed` (`chd_node_verdict_changes_total`,
/// the ledger's `verdict.changes`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VerdictChanges {
    /// (from, to) -> how many times; `from != to`.
    pub counts: BTreeMap<(Level, Level), u64>,
    /// When the last one was.
    pub last: Option<std::time::SystemTime>,
}

impl VerdictChanges {
    /// One change `from` -> `to` at `at` (nothing when the level stays).
    pub fn record(&mut self, from: Level, to: Level, at: std::time::SystemTime) {
        if from != to {
            *self.counts.entry((from, to)).or_default() += 1;
            self.last = Some(at);
        }
    }

    /// How many times the level changed `from` -> `to`.
    pub fn count(&self, from: Level, to: Level) -> u64 {
        self.counts.get(&(from, to)).copied().unwrap_or(0)
    }
}

impl NodeVerdict {
    /// A verdict with every cause confirmed at once (a recording or a state file, which
    /// do not change: nothing to wait for).
    pub fn immediate(causes: Vec<Cause>, best_numa: BTreeMap<String, u32>) -> NodeVerdict {
        NodeVerdict {
            level: level(&causes),
            causes,
            best_numa,
            changes: VerdictChanges::default(),
        }
    }

    /// One line for people: `degraded: device 0 PCIe link x8 Gen5 of x16 Gen5; ...`.
    pub fn line(&self) -> String {
        if self.causes.is_empty() {
            return self.level.to_string();
        }
        let texts: Vec<&str> = self.causes.iter().map(|c| c.text.as_str()).collect();
        format!("{}: {}", self.level, texts.join("; "))
    }

    /// The NFD labels (names without the prefix): `verdict`, `slow-devices` (devices with a
    /// failing cause, `_`-joined, when any), `degraded-devices` (likewise for degrading ones),
    /// `best-numa-<device>`.
    pub fn nfd_labels(&self) -> Vec<(String, String)> {
        let mut labels = vec![("verdict".to_string(), self.level.as_str().to_string())];
        for (name, at) in [
            ("slow-devices", Level::Failed),
            ("degraded-devices", Level::Degraded),
        ] {
            let mut devices: Vec<&str> = self
                .causes
                .iter()
                .filter(|c| c.level == at)
                .filter_map(|c| c.device.as_deref())
                .collect();
            devices.sort_by_key(|d| natural_key(d));
            devices.dedup();
            if !devices.is_empty() {
                labels.push((name.to_string(), devices.join("_")));
            }
        }
        for (device, node) in &self.best_numa {
            labels.push((format!("best-numa-{device}"), node.to_string()));
        }
        labels
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::{Cell, PairMatrix};
    use crate::topology::pci_link::LinkState;
    use crate::vocab::Direction;

    fn cell(cpu: u32, device: &str, gbps: Option<f64>) -> Cell<'_> {
        Cell::test(cpu, device, gbps)
    }

    fn analysis(cells: &[Cell<'_>], size: u64, numa: &NumaMap) -> StoreAnalysis {
        StoreAnalysis {
            h2d: BTreeMap::from([((size, Direction::H2d), H2dMatrix::of(cells, numa))]),
            pairs: BTreeMap::new(),
            measured_nodes: BTreeMap::new(),
        }
    }

    #[test]
    fn a_healthy_node_is_ok() {
        let cells: Vec<Cell> = (0..4)
            .flat_map(|cpu| ["0", "1", "2"].map(|d| cell(cpu, d, Some(58.0))))
            .collect();
        let a = analysis(&cells, 64 << 20, &NumaMap::new());
        let found = causes(&a, &Inputs::default());
        assert_eq!(found, vec![]);
        assert_eq!(level(&found), Level::Ok);
    }

    #[test]
    fn a_slow_column_fails_the_node_and_a_slow_segment_degrades_it() {
        let numa = NumaMap::from([(0, 0), (1, 0), (2, 1), (3, 1)]);
        let mut cells = Vec::new();
        for cpu in 0..4 {
            cells.push(cell(cpu, "0", Some(12.7)));
            cells.push(cell(cpu, "1", Some(58.4)));
            cells.push(cell(cpu, "2", Some(if cpu >= 2 { 20.0 } else { 58.0 })));
            cells.push(cell(cpu, "3", Some(58.8)));
        }
        let a = analysis(&cells, 64 << 20, &numa);
        let found = causes(&a, &Inputs::default());
        let ids: Vec<&str> = found.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["slow_device:0", "slow_segment:1:2"], "{found:#?}");
        assert_eq!(level(&found), Level::Failed);
        assert_eq!(found[0].device.as_deref(), Some("0"));
        assert!(
            found[0].text.starts_with("device 0 slow column (0.2"),
            "{}",
            found[0].text
        );
        // The same cells as 16 MiB copies next to a 64 MiB matrix are not judged.
        let mut two = a;
        let healthy: Vec<Cell> = (0..4)
            .flat_map(|cpu| ["0", "1", "2", "3"].map(|d| cell(cpu, d, Some(58.0))))
            .collect();
        let small = two.h2d.remove(&(64 << 20, Direction::H2d)).unwrap();
        two.h2d.insert((16 << 20, Direction::H2d), small);
        two.h2d
            .insert((64 << 20, Direction::H2d), H2dMatrix::of(&healthy, &numa));
        assert_eq!(causes(&two, &Inputs::default()), vec![]);
    }

    #[test]
    fn links_unbindable_cpus_failing_devices_and_pair_cores() {
        let mut cells: Vec<Cell> = (0..4)
            .flat_map(|cpu| ["0", "1"].map(|d| cell(cpu, d, Some(58.0))))
            .collect();
        cells.extend((0..4).map(|cpu| cell(cpu, "2", None)));
        let mut a = analysis(&cells, 256 << 20, &NumaMap::new());
        let pair_cells: Vec<Cell> = (0..4)
            .flat_map(|c0| {
                (0..4).map(move |c1| Cell {
                    peer_cpu: Some(c1),
                    ..cell(c0, "0,1", Some(if c0 == 3 { 5.0 } else { 13.7 }))
                })
            })
            .collect();
        a.pairs
            .insert("0,1".into(), PairMatrix::of(&pair_cells, &NumaMap::new()));
        let gen5 = |width| LinkState {
            width,
            transfers_per_second: 32_000_000_000,
        };
        let inputs = Inputs {
            links: BTreeMap::from([
                (
                    "0".to_string(),
                    Link {
                        current: gen5(8),
                        max: gen5(16),
                    },
                ),
                (
                    "1".to_string(),
                    Link {
                        current: gen5(16),
                        max: gen5(16),
                    },
                ),
            ]),
            unbindable: &[5, 6, 7],
            rdma_down: &["mlx5_1/1".to_string()],
            lost_devices: &["3".to_string()],
            hung_devices: &["1".to_string()],
            ..Inputs::default()
        };
        let found = causes(&a, &inputs);
        let got: Vec<(&str, Level, &str)> = found
            .iter()
            .map(|c| (c.id.as_str(), c.level, c.text.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "device_hung:1",
                    Level::Failed,
                    "device 1 hung: a copy on it did not finish within probe.cell_timeout; \
                     quarantined (no cells, its memory kept) until it does"
                ),
                (
                    "device_lost:3",
                    Level::Failed,
                    "device 3 lost (its telemetry says it fell off the bus)"
                ),
                (
                    "failing_device:2",
                    Level::Failed,
                    "device 2: every cell failed"
                ),
                (
                    "link_degraded:0",
                    Level::Degraded,
                    "device 0 PCIe link x8 Gen5 of x16 Gen5"
                ),
                (
                    "rdma_port_down:mlx5_1/1",
                    Level::Degraded,
                    "RDMA port mlx5_1/1 not active"
                ),
                (
                    "slow_pair_cpu:0,1:0:3",
                    Level::Degraded,
                    "pair 0,1: CPU 3 as rank 0 slow (0.36 x the pair median)"
                ),
                ("unbindable_cpus", Level::Degraded, "CPUs 5-7 not bindable"),
            ],
            "{found:#?}"
        );
    }

    #[test]
    fn a_slow_d2d_device_and_a_slow_peer_pair_degrade_the_node() {
        use crate::store::{D2dKey, Sample, Store};
        let mut store = Store::default();
        let sample = |gbps: f64| Sample {
            bytes_per_second: gbps * 1e9,
            at: 1.0,
        };
        // Same-device copies: device 2 at 0.3 x the typical device at 64 MiB; device 1 slow
        // only at 16 MiB, which is not judged next to a 64 MiB size.
        for (device, big, small) in [
            ("0", 400.0, 300.0),
            ("1", 410.0, 90.0),
            ("2", 120.0, 300.0),
            ("3", 390.0, 310.0),
        ] {
            for (size, g) in [(64u64 << 20, big), (16 << 20, small)] {
                let key = D2dKey {
                    device: device.into(),
                    size_bytes: size,
                };
                store.record_sample(key, sample(g), 3);
            }
        }
        // Peer copies: PIX pairs at ~20 GB/s but 1>0 at 12 (0.6 x); SYS pairs at ~6 GB/s,
        // which is slow next to PIX and not next to their own class.
        let mut paths = BTreeMap::new();
        for (label, class, g) in [
            ("0>1", "PIX", 20.0),
            ("1>0", "PIX", 12.0),
            ("2>3", "PIX", 21.0),
            ("3>2", "PIX", 20.5),
            ("0>2", "SYS", 6.0),
            ("2>0", "SYS", 6.2),
            ("1>3", "SYS", 5.8),
        ] {
            let key: crate::store::P2pKey = label.parse().unwrap();
            store.record_sample(key, sample(g), 3);
            paths.insert(label.to_string(), class.to_string());
        }
        let observed = Observed {
            p2p_paths: paths,
            ..Observed::default()
        };
        let (found, _) = causes_of_store(&store, &NumaMap::new(), &[], &observed);
        let got: Vec<(&str, Level, Option<&str>)> = found
            .iter()
            .map(|c| (c.id.as_str(), c.level, c.device.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                ("slow_d2d_device:2", Level::Degraded, Some("2")),
                ("slow_p2p_pair:1>0", Level::Degraded, None),
            ],
            "{found:#?}"
        );
        assert!(
            found[0].text.contains("0.30 x the typical device"),
            "{}",
            found[0].text
        );
        assert!(
            found[1].text.contains("of its path class PIX"),
            "{}",
            found[1].text
        );
        assert_eq!(level(&found), Level::Degraded);
        // Without path classes every pair is `unknown`: one class, and the SYS pairs are
        // then the slow ones.
        let (found, _) = causes_of_store(&store, &NumaMap::new(), &[], &Observed::default());
        let ids: Vec<&str> = found.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "slow_d2d_device:2",
                "slow_p2p_pair:0>2",
                "slow_p2p_pair:1>3",
                "slow_p2p_pair:2>0"
            ]
        );
    }

    #[test]
    fn a_slow_fabric_rail_degrades_the_node_and_a_dead_one_too() {
        use crate::analysis::fabric::summarize;
        use crate::format::fabric::samples::{rail, record};
        use crate::format::fabric::{FabricRecord, Way};
        // Rail eth2 sends at a tenth of the others to both peers; eth3 carries nothing out;
        // every rail receives alike.
        let records: Vec<FabricRecord> = ["b", "c"]
            .iter()
            .enumerate()
            .map(|(i, peer)| {
                let mut rails = vec![
                    rail("eth1", Way::Send, Some(12.0)),
                    rail("eth2", Way::Send, Some(1.2)),
                    rail("eth3", Way::Send, None),
                    rail("eth4", Way::Send, Some(11.5)),
                ];
                rails.extend(
                    ["eth1", "eth2", "eth3", "eth4"].map(|r| rail(r, Way::Receive, Some(12.0))),
                );
                record(&i.to_string(), peer, 2.0, rails)
            })
            .collect();
        let observed = Observed {
            fabric_rails: summarize(&records, 8).rails,
            ..Observed::default()
        };
        let (found, _) = causes_of_store(&Store::default(), &NumaMap::new(), &[], &observed);
        let ids: Vec<&str> = found.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(
            ids,
            ["slow_fabric_rail:eth2:send", "slow_fabric_rail:eth3:send"],
            "{found:#?}"
        );
        assert_eq!(level(&found), Level::Degraded);
        assert!(
            found[0].text.contains("0.10 x the node's other rails"),
            "{}",
            found[0].text
        );
        assert!(found[1].text.contains("0.00 x"), "{}", found[1].text);
        // With one rail there is nothing to judge it against.
        let single = Observed {
            fabric_rails: summarize(
                &[record(
                    "1",
                    "b",
                    2.0,
                    vec![rail("eth1", Way::Send, Some(1.0))],
                )],
                8,
            )
            .rails,
            ..Observed::default()
        };
        let (found, _) = causes_of_store(&Store::default(), &NumaMap::new(), &[], &single);
        assert!(found.is_empty(), "{found:#?}");
    }
}
