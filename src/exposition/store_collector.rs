//! The scrape-time view of the store: matrix cells, NUMA-segment and device-column
//! aggregates, device ratios, the measured NUMA node of each device (all computed by
//! [`crate::analysis`]; this module only encodes them), affinity verdicts (by default only
//! the CPUs that cannot be bound, and counts: `exposition.cpu_series`), coverage, topology
//! info and build info. It only reads the store (under a read lock that probes take for
//! writing only between cells), so a scrape never waits for a probe.

use crate::analysis::limits::PathLimits;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeGaugeValue, EncodeLabelValue, LabelValueEncoder,
};
use prometheus_client::metrics::MetricType;

use crate::analysis::best_cpus::{best_cpus, BestCpus};
use crate::analysis::cell::NodeOf;
use crate::analysis::link::link_efficiencies;
use crate::analysis::live;
use crate::analysis::{Cell, DeviceColumn, H2dMatrix, NumaMap, StoreAnalysis};
use crate::runtime::DeviceInfo;
use crate::stats::Summary;
use crate::store::{unix_now, CellKey, D2dKey, P2pKey, SharedStore, Store};
use crate::topology::cpulist;
use crate::topology::pci_link::Link;
use crate::topology::pci_path::PathClass;
use crate::topology::Topology;
use crate::vocab::{DevicePair, Direction};

/// A label value: a borrowed string or an integer, encoded without allocating.
#[derive(Debug, Clone, Copy)]
pub enum Value<'a> {
    Str(&'a str),
    Int(u64),
}

impl EncodeLabelValue for Value<'_> {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        match self {
            Value::Str(s) => EncodeLabelValue::encode(s, encoder),
            Value::Int(i) => EncodeLabelValue::encode(i, encoder),
        }
    }
}

fn node_value(node: Option<u32>) -> Value<'static> {
    match node {
        Some(n) => Value::Int(n.into()),
        None => Value::Str(""),
    }
}

/// Bandwidths are exported as whole bytes per second: sub-byte digits carry no information
/// and would make up a third of a large scrape.
fn bytes_per_second(v: f64) -> i64 {
    v.round() as i64
}

/// Encode one gauge family from `(labels, value)` rows.
fn gauges<'v, const N: usize, V: EncodeGaugeValue>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = ([(&'static str, Value<'v>); N], V)>,
) -> std::fmt::Result {
    let mut family = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in rows {
        family.encode_family(&labels)?.encode_gauge(&value)?;
    }
    Ok(())
}

/// Which per-CPU series are exported (`exposition.cpu_series`, issue 28 part 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuSeries {
    /// `chd_cpu_bindable` only for the CPUs that could not be bound (value 0; none on a
    /// healthy node), `chd_cpus` counts by state, no `chd_cpu_info`: the default, which
    /// keeps a 640-CPU node's per-CPU series from being 1,280.
    #[default]
    Exceptions,
    /// Also `chd_cpu_bindable` 1 for every bindable CPU and `chd_cpu_info` for every CPU.
    All,
}

impl CpuSeries {
    /// As written in TOML.
    pub fn as_str(self) -> &'static str {
        match self {
            CpuSeries::Exceptions => "exceptions",
            CpuSeries::All => "all",
        }
    }
}

/// What the collector needs besides the store; fixed for the life of the process.
#[derive(Debug)]
pub struct StoreView {
    pub store: SharedStore,
    pub topology: Arc<Topology>,
    pub devices: Vec<DeviceInfo>,
    pub backend: String,
    /// Cells the prober measures (for coverage).
    pub universe: Arc<Vec<CellKey>>,
    /// Same-device copy cells the prober measures (for coverage; empty when they are off).
    pub d2d_universe: Arc<Vec<D2dKey>>,
    /// Ordered peer copy cells the prober measures (for coverage; empty when they are off).
    pub p2p_universe: Arc<Vec<P2pKey>>,
    /// CPUs the affinity probe checks (for coverage).
    pub affinity_cpus: Arc<Vec<u32>>,
    pub stale_after: Duration,
    /// Export every cell.
    pub cells: bool,
    /// Configured `pair` labels of the core-pair probe (empty: none).
    pub pairs: Vec<DevicePair>,
    /// Export every core-pair cell.
    pub pair_cells: bool,
    /// Which per-CPU series to export (`exposition.cpu_series`).
    pub cpu_series: CpuSeries,
    /// The PCIe path class of each ordered device pair, read from sysfs once at start (a
    /// pair not in it is `unknown`).
    pub p2p_paths: Arc<BTreeMap<P2pKey, PathClass>>,
    /// Each device's same-device copy limit (`analysis::limits`: NVML's memory bus, the
    /// configured `[limits."MODEL"]`); empty where none is known.
    pub d2d_limits: Arc<PathLimits>,
}

/// One row per statistic of `summary` (in `stat` label order), labelled by `labels(stat)`.
fn stat_rows<'v, const N: usize>(
    summary: Summary,
    labels: impl Fn(&'static str) -> [(&'static str, Value<'v>); N],
) -> impl Iterator<Item = ([(&'static str, Value<'v>); N], i64)> {
    summary
        .labelled()
        .into_iter()
        .map(move |(stat, value)| (labels(stat), bytes_per_second(value)))
}

/// A device column of one matrix: (device, size in bytes, direction).
type ColumnKey<'a> = (&'a str, u64, Direction);

/// The `device`, `size_bytes` and `direction` labels of a device column.
fn column_labels<'v>(&(device, size, direction): &ColumnKey<'v>) -> [(&'static str, Value<'v>); 3] {
    [
        ("device", Value::Str(device)),
        ("size_bytes", Value::Int(size)),
        ("direction", Value::Str(direction.as_str())),
    ]
}

/// One probe's coverage: when each measured item was last measured, sorted, and how many
/// items it has.
#[derive(Debug, Clone)]
struct ProbeCoverage {
    probe: &'static str,
    measured_at: Vec<f64>,
    total: u64,
}

impl ProbeCoverage {
    fn new(probe: &'static str, mut measured_at: Vec<f64>, total: u64) -> ProbeCoverage {
        measured_at.sort_by(f64::total_cmp);
        ProbeCoverage {
            probe,
            measured_at,
            total,
        }
    }

    /// (fresh, stale, unmeasured) when measurements before `stale_before` are stale.
    fn counts(&self, stale_before: f64) -> [u64; 3] {
        let stale = self.measured_at.partition_point(|&at| at < stale_before) as u64;
        let fresh = self.measured_at.len() as u64 - stale;
        [fresh, stale, self.total.saturating_sub(fresh + stale)]
    }
}

/// Matrix coverage (`chd_probe_cells`) of one store generation. Which cells are fresh
/// depends on the clock, so the counts are taken at every scrape, each in O(log cells).
#[derive(Debug, Clone)]
pub struct Coverage {
    probes: [ProbeCoverage; 5],
    stale_after: Duration,
}

impl Coverage {
    /// Encode `chd_probe_cells` as of `now` (unix seconds).
    pub fn encode(&self, now: f64, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let stale_before = now - self.stale_after.as_secs_f64();
        gauges(
            enc,
            "chd_probe_cells",
            "Matrix coverage: cells measured recently (fresh), measured long ago (stale), never measured",
            self.probes.iter().flat_map(|p| {
                ["fresh", "stale", "unmeasured"]
                    .into_iter()
                    .zip(p.counts(stale_before))
                    .map(move |(state, n)| {
                        ([("probe", Value::Str(p.probe)), ("state", Value::Str(state))], n)
                    })
            }),
        )
    }
}

impl StoreView {
    fn encode_matrix(
        &self,
        cells: &[(&CellKey, Cell)],
        analysis: &StoreAnalysis,
        numa: &NumaMap,
        enc: &mut DescriptorEncoder,
    ) -> std::fmt::Result {
        if self.cells {
            let mut node_of = NodeOf::new(numa);
            gauges(
                enc,
                "chd_h2d_bandwidth_bytes_per_second",
                "One cell of the core x device copy matrix: median of its recent samples",
                cells.iter().filter_map(|(key, c)| {
                    let labels = [
                        ("cpu", Value::Int(key.cpu.into())),
                        ("numa_node", node_value(node_of.get(key.cpu))),
                        ("device", Value::Str(&key.device)),
                        ("size_bytes", Value::Int(key.size_bytes)),
                        ("direction", Value::Str(key.direction.as_str())),
                    ];
                    Some((labels, bytes_per_second(c.value?)))
                }),
            )?;
        }
        // Every device column of every matrix, by (device, size, direction).
        let mut columns: Vec<(ColumnKey, &H2dMatrix, &DeviceColumn)> = analysis
            .h2d
            .iter()
            .flat_map(|(&(size, direction), matrix)| {
                matrix
                    .devices
                    .iter()
                    .map(move |col| ((col.device.as_str(), size, direction), matrix, col))
            })
            .collect();
        columns.sort_by(|a, b| a.0.cmp(&b.0));
        gauges(
            enc,
            "chd_h2d_segment_bandwidth_bytes_per_second",
            "Copy bandwidth of the cells whose CPU is on this NUMA node, per device",
            columns.iter().flat_map(|(key, matrix, _)| {
                let [device, size, direction] = column_labels(key);
                matrix.segments_of(key.0).flat_map(move |segment| {
                    let node = ("numa_node", node_value(segment.numa_node));
                    // min, median, max only: the series budget (issue 13, docs/METRICS.md).
                    let stats = segment.summary.three_number().into_iter();
                    stats.map(move |(stat, v)| {
                        let labels = [node, device, size, direction, ("stat", Value::Str(stat))];
                        (labels, bytes_per_second(v))
                    })
                })
            }),
        )?;
        gauges(
            enc,
            "chd_h2d_device_bandwidth_bytes_per_second",
            "Copy bandwidth of one device column over all CPUs",
            columns.iter().flat_map(|(key, _, col)| {
                let [device, size, direction] = column_labels(key);
                stat_rows(col.summary, move |stat| {
                    [device, size, direction, ("stat", Value::Str(stat))]
                })
            }),
        )?;
        gauges(
            enc,
            "chd_h2d_device_ratio",
            "Device column median / median of all column medians of this size and direction",
            columns
                .iter()
                .filter_map(|(key, _, col)| Some((column_labels(key), col.ratio?))),
        )?;
        gauges(
            enc,
            "chd_device_measured_numa_node",
            "NUMA node whose CPUs give this device the highest median copy bandwidth (largest size, h2d preferred)",
            analysis
                .measured_nodes
                .iter()
                .map(|(device, node)| ([("device", Value::Str(device))], i64::from(*node))),
        )
    }

    fn encode_pairs(
        &self,
        pair_cells: &BTreeMap<&str, Vec<Cell>>,
        analysis: &StoreAnalysis,
        enc: &mut DescriptorEncoder,
    ) -> std::fmt::Result {
        let rank_value = |rank: u8| Value::Str(if rank == 0 { "0" } else { "1" });
        gauges(
            enc,
            "chd_pair_bandwidth_bytes_per_second",
            "Median allgather bus bandwidth of all measured pair cells in which this CPU held this rank",
            analysis.pairs.iter().flat_map(|(pair, matrix)| {
                matrix.cpus.iter().map(move |c| {
                    let labels = [
                        ("pair", Value::Str(pair)),
                        ("rank", rank_value(c.rank)),
                        ("cpu", Value::Int(c.cpu.into())),
                        ("numa_node", node_value(c.numa_node)),
                    ];
                    (labels, bytes_per_second(c.median))
                })
            }),
        )?;
        gauges(
            enc,
            "chd_pair_cpu_ratio",
            "This CPU's median in this rank / median of the whole pair matrix",
            analysis.pairs.iter().flat_map(|(pair, matrix)| {
                matrix.cpus.iter().filter_map(move |c| {
                    let labels = [
                        ("pair", Value::Str(pair)),
                        ("rank", rank_value(c.rank)),
                        ("cpu", Value::Int(c.cpu.into())),
                    ];
                    Some((labels, c.ratio?))
                })
            }),
        )?;
        gauges(
            enc,
            "chd_pair_segment_bandwidth_bytes_per_second",
            "Pair cells grouped by both ranks' NUMA nodes",
            analysis.pairs.iter().flat_map(|(pair, matrix)| {
                matrix.segments.iter().flat_map(move |((n0, n1), summary)| {
                    stat_rows(*summary, move |stat| {
                        [
                            ("pair", Value::Str(pair)),
                            ("rank0_numa_node", node_value(*n0)),
                            ("rank1_numa_node", node_value(*n1)),
                            ("stat", Value::Str(stat)),
                        ]
                    })
                })
            }),
        )?;
        if self.pair_cells {
            gauges(
                enc,
                "chd_pair_cell_bandwidth_bytes_per_second",
                "One cell of the core-pair matrix: median of its recent samples",
                analysis.pairs.keys().flat_map(|pair| {
                    let cells = pair_cells.get(pair.as_str()).map(Vec::as_slice);
                    cells.unwrap_or_default().iter().filter_map(move |c| {
                        let labels = [
                            ("pair", Value::Str(pair)),
                            ("rank0_cpu", Value::Int(c.cpu.into())),
                            ("rank1_cpu", Value::Int(c.peer_cpu?.into())),
                        ];
                        Some((labels, bytes_per_second(c.value?)))
                    })
                }),
            )?;
        }
        Ok(())
    }

    /// Each measured ordered pair's peer copy bandwidth (median of its recent samples), with
    /// the pair's PCIe path class (`chd_p2p_bandwidth_bytes_per_second`).
    fn encode_p2p(&self, store: &Store, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        gauges(
            enc,
            "chd_p2p_bandwidth_bytes_per_second",
            "Peer copy bandwidth from device memory of src to device memory of dst: median of its recent samples",
            store.p2p().iter().filter_map(|(k, c)| {
                let path = self
                    .p2p_paths
                    .get(k)
                    .copied()
                    .unwrap_or(PathClass::Unknown);
                Some((
                    [
                        ("src", Value::Str(k.src())),
                        ("dst", Value::Str(k.dst())),
                        ("path", Value::Str(path.as_str())),
                    ],
                    bytes_per_second(c.median()?),
                ))
            }),
        )
    }

    fn encode_probe_state(&self, store: &Store, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let all = self.cpu_series == CpuSeries::All;
        gauges(
            enc,
            "chd_cpu_bindable",
            "1 if binding a thread to exactly this CPU succeeded and read back as exactly this CPU, else 0 (by default only the 0s: exposition.cpu_series)",
            store
                .bindable()
                .iter()
                .filter(|(_, verdict)| all || !verdict.bindable)
                .map(|(cpu, verdict)| {
                    (
                        [("cpu", Value::Int((*cpu).into()))],
                        i64::from(verdict.bindable),
                    )
                }),
        )?;
        let bindable = store.bindable().values().filter(|v| v.bindable).count();
        let not_bindable = store.bindable().len() - bindable;
        let unchecked = self
            .topology
            .cpus
            .iter()
            .filter(|c| !store.bindable().contains_key(&c.id))
            .count();
        gauges(
            enc,
            "chd_cpus",
            "CPUs by affinity verdict: bindable, not_bindable (those have a chd_cpu_bindable 0 series), unchecked (no verdict yet)",
            [
                ("bindable", bindable),
                ("not_bindable", not_bindable),
                ("unchecked", unchecked),
            ]
            .map(|(state, n)| ([("state", Value::Str(state))], n as i64)),
        )?;
        gauges(
            enc,
            "chd_probe_last_success_timestamp_seconds",
            "End of the last probe window that measured at least one cell",
            store
                .last_success()
                .iter()
                .map(|(probe, at)| ([("probe", Value::Str(probe))], *at)),
        )
    }

    /// When each cell of each probe was last measured, for [`Coverage::encode`].
    pub fn coverage(&self, store: &Store) -> Coverage {
        let h2d = self
            .universe
            .iter()
            .filter_map(|k| store.h2d().get(k).and_then(|c| c.last_sample_at()))
            .collect();
        let affinity = self
            .affinity_cpus
            .iter()
            .filter_map(|cpu| store.bindable().get(cpu).map(|v| v.at))
            .collect();
        let pair = store
            .pairs()
            .iter()
            .filter(|(k, _)| self.pairs.contains(&k.pair))
            .filter_map(|(_, c)| c.last_sample_at())
            .collect();
        let pair_total =
            (self.affinity_cpus.len() * self.affinity_cpus.len() * self.pairs.len()) as u64;
        let d2d = self
            .d2d_universe
            .iter()
            .filter_map(|k| store.d2d().get(k).and_then(|c| c.last_sample_at()))
            .collect();
        let p2p = self
            .p2p_universe
            .iter()
            .filter_map(|k| store.p2p().get(k).and_then(|c| c.last_sample_at()))
            .collect();
        Coverage {
            probes: [
                ProbeCoverage::new("h2d", h2d, self.universe.len() as u64),
                ProbeCoverage::new("pair", pair, pair_total),
                ProbeCoverage::new("d2d", d2d, self.d2d_universe.len() as u64),
                ProbeCoverage::new("p2p", p2p, self.p2p_universe.len() as u64),
                ProbeCoverage::new("affinity", affinity, self.affinity_cpus.len() as u64),
            ],
            stale_after: self.stale_after,
        }
    }

    /// Every family that depends only on the store and the node (all of them but the
    /// coverage, which also depends on the clock): what [`super::matrix_cache`] encodes
    /// once per store generation.
    pub fn encode_store(&self, store: &Store, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let numa = live::numa_map(&self.topology);
        let h2d = live::h2d_cells(store);
        let pairs = live::pair_cells(store);
        let by_matrix = live::by_matrix(&h2d);
        let analysis = StoreAnalysis::of(&by_matrix, &pairs, &self.pairs, &numa);
        self.encode_matrix(&h2d, &analysis, &numa, enc)?;
        encode_best_cpus(&best_cpus(&by_matrix), enc)?;
        encode_links(&store.link_by_device(), &analysis, enc)?;
        self.encode_pairs(&pairs, &analysis, enc)?;
        encode_d2d(&live::d2d_devices(store, &self.d2d_limits), enc)?;
        self.encode_p2p(store, enc)?;
        self.encode_probe_state(store, enc)?;
        self.encode_info(enc)
    }

    fn encode_info(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        // Per-CPU facts only with `exposition.cpu_series = "all"`; the ledger
        // (`/api/v1/calibration`) always has them.
        let cpus = match self.cpu_series {
            CpuSeries::All => self.topology.cpus.as_slice(),
            CpuSeries::Exceptions => &[],
        };
        gauges(
            enc,
            "chd_cpu_info",
            "Online CPUs and where they sit (only with exposition.cpu_series = \"all\")",
            cpus.iter().map(|cpu| {
                let labels = [
                    ("cpu", Value::Int(cpu.id.into())),
                    ("numa_node", node_value(cpu.numa_node)),
                    ("package", node_value(cpu.package)),
                    ("core", node_value(cpu.core)),
                ];
                (labels, 1i64)
            }),
        )?;
        gauges(
            enc,
            "chd_device_info",
            "Devices of the loaded backend",
            self.devices.iter().map(|d| {
                let labels = [
                    ("device", Value::Str(&d.id)),
                    ("kind", Value::Str(&d.kind)),
                    ("name", Value::Str(&d.name)),
                    ("pci_bus_id", Value::Str(&d.pci_bus_id)),
                    ("numa_node", node_value(d.numa_node)),
                ];
                (labels, 1i64)
            }),
        )?;
        gauges(
            enc,
            "chd_build_info",
            "Version of chd and the backend it runs",
            [(
                [
                    ("version", Value::Str(env!("CARGO_PKG_VERSION"))),
                    ("backend", Value::Str(&self.backend)),
                ],
                1i64,
            )],
        )?;
        gauges(
            enc,
            "chd_backend_up",
            "1 if that runtime loaded and answered",
            [([("backend", Value::Str(&self.backend))], 1i64)],
        )
    }
}

/// Each device's same-device copy bandwidth and its ratio to the node's typical device, per
/// size (`chd_d2d_*`).
fn encode_d2d(
    sizes: &BTreeMap<u64, crate::analysis::D2dDevices>,
    enc: &mut DescriptorEncoder,
) -> std::fmt::Result {
    let rows = || {
        sizes.iter().flat_map(|(&size, a)| {
            a.devices.iter().map(move |d| {
                (
                    [
                        ("device", Value::Str(d.device.as_str())),
                        ("size_bytes", Value::Int(size)),
                    ],
                    d,
                )
            })
        })
    };
    gauges(
        enc,
        "chd_d2d_bandwidth_bytes_per_second",
        "Same-device copy (device memory to device memory) bandwidth of this device: median of its recent samples",
        rows().filter_map(|(labels, d)| Some((labels, bytes_per_second(d.value?)))),
    )?;
    gauges(
        enc,
        "chd_d2d_device_ratio",
        "This device's same-device copy bandwidth / the median over the node's devices of this size",
        rows().filter_map(|(labels, d)| Some((labels, d.ratio?))),
    )?;
    gauges(
        enc,
        "chd_d2d_implausible_limit_bytes_per_second",
        "The limit a device's same-device copy bandwidth is above (a measurement fault: left out of the ratios); no series for a plausible one",
        rows().filter_map(|(labels, d)| {
            Some((labels, bytes_per_second(d.implausible.as_ref()?.bytes_per_second)))
        }),
    )
}

/// Each device's best CPUs (`analysis::best_cpus`: within 5 % of its best cell) as a
/// cpulist label: one series per device, for dashboards and `chd advise`.
fn encode_best_cpus(best: &[BestCpus], enc: &mut DescriptorEncoder) -> std::fmt::Result {
    let lists: Vec<(&str, String)> = best
        .iter()
        .map(|b| (b.device.as_str(), cpulist::format(&b.cpus)))
        .collect();
    gauges(
        enc,
        "chd_device_best_cpus_info",
        "CPUs whose copy bandwidth to this device is within 5 % of its best cell (largest size, h2d preferred), as a cpulist",
        lists.iter().map(|(device, cpus)| {
            (
                [("device", Value::Str(device)), ("cpus", Value::Str(cpus))],
                1i64,
            )
        }),
    )
}

/// Each device's PCIe link as the last window saw it, its payload limit in both states, and
/// each device column's median over the current state's limit (the physics check of issue
/// 15: a node whose every device is equally slow has ratios near 1 but a low efficiency).
fn encode_links(
    links: &BTreeMap<String, Link>,
    analysis: &StoreAnalysis,
    enc: &mut DescriptorEncoder,
) -> std::fmt::Result {
    gauges(
        enc,
        "chd_device_pcie_link_bandwidth_bytes_per_second",
        "Payload bandwidth the device's PCIe link carries in one direction (lanes x rate x encoding), as read right after chd's last copies to it",
        links.iter().flat_map(|(device, seen)| {
            [("current", seen.current), ("max", seen.max)]
                .into_iter()
                .filter_map(move |(state, link)| {
                    let labels = [("device", Value::Str(device.as_str())), ("state", Value::Str(state))];
                    Some((labels, bytes_per_second(link.payload_bytes_per_second()?)))
                })
        }),
    )?;
    let efficiencies = link_efficiencies(&analysis.h2d, links);
    gauges(
        enc,
        "chd_h2d_link_efficiency_ratio",
        "Device column median / payload bandwidth of the device's current PCIe link",
        efficiencies.iter().map(|e| {
            let key = (e.device.as_str(), e.size_bytes, e.direction);
            (column_labels(&key), e.ratio)
        }),
    )
}

/// The whole view, encoded afresh at every scrape: the coverage, then the store's families.
/// `chd serve` encodes the same families through [`super::matrix_cache`] instead, which
/// encodes the store's part once per generation.
impl Collector for StoreView {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let store = self.store.read().unwrap_or_else(|p| p.into_inner());
        self.coverage(&store).encode(unix_now(), &mut encoder)?;
        self.encode_store(&store, &mut encoder)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::exposition::{encode, Format};
    use crate::store::Sample;
    use crate::topology::{Cpu, NumaNode};
    use prometheus_client::registry::Registry;
    use std::sync::RwLock;

    const SIZE: u64 = 64 << 20;

    fn topology() -> Topology {
        let cpu = |id: u32, node: u32| Cpu {
            id,
            numa_node: Some(node),
            package: Some(node),
            core: Some(id),
            siblings: vec![id],
            allowed: true,
        };
        Topology {
            cpus: vec![cpu(0, 0), cpu(1, 0), cpu(2, 1), cpu(3, 1)],
            offline_cpus: vec![],
            numa_nodes: (0..2)
                .map(|id| NumaNode {
                    id,
                    cpus: vec![id * 2, id * 2 + 1],
                    has_memory: true,
                    memory_total_bytes: None,
                })
                .collect(),
        }
    }

    pub(crate) fn key(cpu: u32, device: &str) -> CellKey {
        CellKey {
            cpu,
            device: device.into(),
            size_bytes: SIZE,
            direction: Direction::H2d,
        }
    }

    /// Device "0" and "3" typical (58.4 GB/s), "1" slow everywhere (12.7, the seed's NPU0),
    /// "2" slow only from node 1's CPUs; cpu 3 never measured on device "3".
    pub(crate) fn view(cells: bool) -> StoreView {
        let mut store = Store::default();
        let now = unix_now();
        for cpu in 0..4 {
            for (device, gbps) in [
                ("0", 58.4),
                ("1", 12.7),
                ("2", if cpu >= 2 { 20.0 } else { 58.0 }),
                ("3", 58.8),
            ] {
                if device == "3" && cpu == 3 {
                    continue;
                }
                for jitter in [-0.1, 0.0, 0.1] {
                    store.record_sample(
                        key(cpu, device),
                        Sample {
                            bytes_per_second: (gbps + jitter) * 1e9,
                            at: now,
                        },
                        5,
                    );
                }
            }
        }
        store.record_bindable(&[(0, true), (1, true), (2, false), (3, true)], now);
        let devices: Vec<DeviceInfo> = (0..4)
            .map(|i| DeviceInfo {
                id: i.to_string(),
                kind: "cuda".into(),
                name: "test".into(),
                pci_bus_id: format!("0000:{i:02x}:00.0"),
                numa_node: Some(i / 2),
            })
            .collect();
        let universe: Vec<CellKey> = (0..4)
            .flat_map(|cpu| (0..4).map(move |d| key(cpu, &d.to_string())))
            .collect();
        StoreView {
            store: Arc::new(RwLock::new(store)),
            topology: Arc::new(topology()),
            devices,
            backend: "cuda".into(),
            universe: Arc::new(universe),
            d2d_universe: Default::default(),
            p2p_universe: Default::default(),
            affinity_cpus: Arc::new(vec![0, 1, 2, 3]),
            stale_after: Duration::from_secs(3600),
            cells,
            pairs: vec![],
            pair_cells: false,
            cpu_series: CpuSeries::Exceptions,
            p2p_paths: Default::default(),
            d2d_limits: Default::default(),
        }
    }

    fn scrape(view: StoreView) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(view));
        encode(&registry, Format::Prometheus).unwrap()
    }

    #[test]
    fn p2p_cells_carry_their_path_class_and_failed_pairs_have_no_series() {
        let mut view = view(false);
        let pair = |src: &str, dst: &str| -> P2pKey { format!("{src}>{dst}").parse().unwrap() };
        view.p2p_paths = Arc::new(BTreeMap::from([(pair("0", "1"), PathClass::Pix)]));
        {
            let mut store = view.store.write().unwrap();
            for (v, at) in [(20e9, 1.0), (22e9, 2.0), (30e9, 3.0)] {
                let sample = Sample {
                    bytes_per_second: v,
                    at,
                };
                store.record_sample(pair("0", "1"), sample, 5);
            }
            let sample = Sample {
                bytes_per_second: 9e9,
                at: 4.0,
            };
            store.record_sample(pair("1", "0"), sample, 5);
            store.record_error(pair("2", "3"), 5.0);
        }
        let text = scrape(view);
        assert!(text.contains(
            "chd_p2p_bandwidth_bytes_per_second{src=\"0\",dst=\"1\",path=\"PIX\"} 22000000000\n"
        ), "{text}");
        assert!(text.contains(
            "chd_p2p_bandwidth_bytes_per_second{src=\"1\",dst=\"0\",path=\"unknown\"} 9000000000\n"
        ), "{text}");
        assert!(!text.contains("src=\"2\""), "{text}");
    }

    fn value(text: &str, series: &str) -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .unwrap_or_else(|| panic!("no {series} in\n{text}"));
        line[series.len() + 1..].parse().unwrap()
    }

    #[test]
    fn slow_column_has_low_ratio_and_typical_ones_about_one() {
        let text = scrape(view(true));
        let ratio = |d: &str| {
            value(
                &text,
                &format!(
                    "chd_h2d_device_ratio{{device=\"{d}\",size_bytes=\"{SIZE}\",direction=\"h2d\"}}"
                ),
            )
        };
        // Column medians: 58.4, 12.7, 39 (half slow), 58.8 -> reference median 48.7.
        assert!((ratio("1") - 12.7 / 48.7).abs() < 1e-3, "{}", ratio("1"));
        assert!((ratio("0") - 58.4 / 48.7).abs() < 1e-3);
    }

    /// The link bandwidth comes from the link the window saw; efficiency is the column median
    /// over the current state's payload, only for devices with a known link.
    #[test]
    fn link_bandwidth_and_efficiency_of_the_devices_with_a_seen_link() {
        use crate::topology::pci_link::{Link, LinkState};
        let view = view(false);
        let gen5 = |width| LinkState {
            width,
            transfers_per_second: 32_000_000_000,
        };
        {
            let mut store = view.store.write().unwrap();
            let full = Link {
                current: gen5(16),
                max: gen5(16),
            };
            store.record_link("0", full, 1.0);
            store.record_link(
                "1",
                Link {
                    current: gen5(8),
                    ..full
                },
                1.0,
            );
        }
        let text = scrape(view);
        let link = |d: &str, state: &str| {
            value(
                &text,
                &format!("chd_device_pcie_link_bandwidth_bytes_per_second{{device=\"{d}\",state=\"{state}\"}}"),
            )
        };
        assert_eq!(link("0", "current"), 63_015_384_615.0);
        assert_eq!(link("1", "current"), 31_507_692_308.0);
        assert_eq!(link("1", "max"), 63_015_384_615.0);
        let efficiency = |d: &str| {
            value(
                &text,
                &format!("chd_h2d_link_efficiency_ratio{{device=\"{d}\",size_bytes=\"{SIZE}\",direction=\"h2d\"}}"),
            )
        };
        assert!((efficiency("0") - 58.4e9 / 63.015_384_615e9).abs() < 1e-6);
        assert!((efficiency("1") - 12.7e9 / 31.507_692_308e9).abs() < 1e-6);
        assert!(!text.contains("chd_h2d_link_efficiency_ratio{device=\"2\""));
        assert!(!text.contains("chd_device_pcie_link_bandwidth_bytes_per_second{device=\"3\""));
    }

    #[test]
    fn segment_stats_isolate_the_slow_numa_node() {
        let text = scrape(view(true));
        let seg = |node: u32, stat: &str| {
            value(&text, &format!("chd_h2d_segment_bandwidth_bytes_per_second{{numa_node=\"{node}\",device=\"2\",size_bytes=\"{SIZE}\",direction=\"h2d\",stat=\"{stat}\"}}"))
        };
        assert_eq!(seg(0, "median"), 58.0e9);
        assert_eq!(seg(1, "median"), 20.0e9);
        assert_eq!(seg(1, "max"), 20.0e9);
        let measured = value(&text, "chd_device_measured_numa_node{device=\"2\"}");
        assert_eq!(measured, 0.0);
        // Device 2's best CPUs are the fast node's; device 3 has no cell from CPU 3.
        assert_eq!(
            value(
                &text,
                "chd_device_best_cpus_info{device=\"2\",cpus=\"0-1\"}"
            ),
            1.0
        );
        assert_eq!(
            value(
                &text,
                "chd_device_best_cpus_info{device=\"3\",cpus=\"0-2\"}"
            ),
            1.0
        );
        assert_eq!(
            text.matches("chd_device_best_cpus_info{").count(),
            4,
            "one per device"
        );
        let column_min = value(&text, &format!("chd_h2d_device_bandwidth_bytes_per_second{{device=\"2\",size_bytes=\"{SIZE}\",direction=\"h2d\",stat=\"min\"}}"));
        assert_eq!(column_min, 20.0e9);
    }

    #[test]
    fn coverage_bindable_and_info() {
        let text = scrape(view(true));
        assert_eq!(
            value(&text, "chd_probe_cells{probe=\"h2d\",state=\"fresh\"}"),
            15.0
        );
        assert_eq!(
            value(&text, "chd_probe_cells{probe=\"h2d\",state=\"unmeasured\"}"),
            1.0
        );
        assert_eq!(
            value(&text, "chd_probe_cells{probe=\"affinity\",state=\"fresh\"}"),
            4.0
        );
        // By default only the CPU that cannot be bound has a series, and the counts say
        // the rest (issue 28 part 4).
        assert_eq!(value(&text, "chd_cpu_bindable{cpu=\"2\"}"), 0.0);
        assert_eq!(text.matches("chd_cpu_bindable{").count(), 1, "{text}");
        assert!(!text.contains("chd_cpu_info{"), "{text}");
        for (state, n) in [("bindable", 3.0), ("not_bindable", 1.0), ("unchecked", 0.0)] {
            let series = format!("chd_cpus{{state=\"{state}\"}}");
            assert_eq!(value(&text, &series), n, "{state}");
        }
        // `exposition.cpu_series = "all"`: every CPU's verdict and where it sits.
        let mut all = view(true);
        all.cpu_series = CpuSeries::All;
        let all = scrape(all);
        assert_eq!(value(&all, "chd_cpu_bindable{cpu=\"2\"}"), 0.0);
        assert_eq!(value(&all, "chd_cpu_bindable{cpu=\"3\"}"), 1.0);
        assert_eq!(all.matches("chd_cpu_bindable{").count(), 4);
        assert_eq!(
            value(
                &all,
                "chd_cpu_info{cpu=\"3\",numa_node=\"1\",package=\"1\",core=\"3\"}"
            ),
            1.0
        );
        assert_eq!(all.matches("chd_cpu_info{").count(), 4);
        assert_eq!(value(&all, "chd_cpus{state=\"bindable\"}"), 3.0);
        assert_eq!(
            value(&text, "chd_device_info{device=\"1\",kind=\"cuda\",name=\"test\",pci_bus_id=\"0000:01:00.0\",numa_node=\"0\"}"),
            1.0
        );
        let cell = "chd_h2d_bandwidth_bytes_per_second{cpu=\"0\",numa_node=\"0\",device=\"1\",size_bytes=\"67108864\",direction=\"h2d\"}";
        assert_eq!(value(&text, cell), 12.7e9);
    }

    #[test]
    fn cells_can_be_turned_off_without_losing_aggregates() {
        let text = scrape(view(false));
        assert!(!text.contains("chd_h2d_bandwidth_bytes_per_second{"));
        assert!(text.contains("chd_h2d_device_ratio{"));
    }

    #[test]
    fn pair_metrics_single_out_a_slow_rank0_cpu() {
        let mut v = view(false);
        v.pairs = vec!["0,1".parse().unwrap()];
        v.pair_cells = true;
        {
            let mut s = v.store.write().unwrap();
            for c0 in 0..4 {
                for c1 in 0..4 {
                    // rank-0 CPU 3 is slow (4 GB/s), everything else 13.7 GB/s.
                    let gbps = if c0 == 3 { 4.0 } else { 13.7 };
                    s.record_sample(
                        crate::store::PairKey {
                            pair: "0,1".parse().unwrap(),
                            cpu0: c0,
                            cpu1: c1,
                        },
                        Sample {
                            bytes_per_second: gbps * 1e9,
                            at: unix_now(),
                        },
                        5,
                    );
                }
            }
        }
        let text = scrape(v);
        let ratio = |rank: u8, cpu: u32| {
            value(
                &text,
                &format!("chd_pair_cpu_ratio{{pair=\"0,1\",rank=\"{rank}\",cpu=\"{cpu}\"}}"),
            )
        };
        assert!(ratio(0, 3) < 0.7, "{}", ratio(0, 3));
        for cpu in 0..3 {
            assert_eq!(ratio(0, cpu), 1.0);
        }
        for cpu in 0..4 {
            assert!(ratio(1, cpu) > 0.7, "rank 1 cpu {cpu}: {}", ratio(1, cpu));
        }
        assert_eq!(
            value(
                &text,
                "chd_pair_bandwidth_bytes_per_second{pair=\"0,1\",rank=\"0\",cpu=\"3\",numa_node=\"1\"}"
            ),
            4e9
        );
        assert_eq!(
            value(
                &text,
                "chd_pair_segment_bandwidth_bytes_per_second{pair=\"0,1\",rank0_numa_node=\"0\",rank1_numa_node=\"1\",stat=\"median\"}"
            ),
            13.7e9
        );
        assert_eq!(
            value(
                &text,
                "chd_pair_cell_bandwidth_bytes_per_second{pair=\"0,1\",rank0_cpu=\"3\",rank1_cpu=\"0\"}"
            ),
            4e9
        );
        assert_eq!(
            value(&text, "chd_probe_cells{probe=\"pair\",state=\"fresh\"}"),
            16.0
        );
        assert_eq!(
            value(
                &text,
                "chd_probe_cells{probe=\"pair\",state=\"unmeasured\"}"
            ),
            0.0
        );
    }

    #[test]
    fn stale_cells_are_counted_as_stale() {
        let v = view(true);
        {
            let mut s = v.store.write().unwrap();
            s.update_cells(|cells: &mut BTreeMap<CellKey, crate::store::Cell>| {
                for cell in cells.values_mut() {
                    for sample in cell.samples.iter_mut() {
                        sample.at -= 7200.0;
                    }
                }
            });
        }
        let text = scrape(v);
        assert_eq!(
            value(&text, "chd_probe_cells{probe=\"h2d\",state=\"stale\"}"),
            15.0
        );
        assert_eq!(
            value(&text, "chd_probe_cells{probe=\"h2d\",state=\"fresh\"}"),
            0.0
        );
    }

    /// A snapshot's coverage is counted as of each scrape: the same measurement times turn
    /// stale when the clock passes `stale_after`, without the store changing.
    #[test]
    fn coverage_is_counted_as_of_the_scrape() {
        let v = view(true);
        let coverage = v.coverage(&v.store.read().unwrap());
        let now = unix_now();
        let h2d = &coverage.probes[0];
        assert_eq!(h2d.probe, "h2d");
        assert_eq!(h2d.counts(now - 3600.0), [15, 0, 1]);
        assert_eq!(h2d.counts(now + 1.0), [0, 15, 1]);
        let probe = |name: &str| coverage.probes.iter().find(|p| p.probe == name).unwrap();
        assert_eq!(probe("affinity").counts(now - 3600.0), [4, 0, 0]);
        // No pair configured, no same-device or peer copy cell planned: nothing to cover.
        for name in ["pair", "d2d", "p2p"] {
            assert_eq!(probe(name).counts(now), [0, 0, 0], "{name}");
        }
    }

    /// The same-device and peer copy cells a node plans are covered like the matrix: each
    /// planned cell fresh, stale or unmeasured (issue 24: the family had no rows for them).
    #[test]
    fn d2d_and_p2p_cells_have_coverage_rows() {
        let mut v = view(false);
        let d2d = |device: &str| D2dKey {
            device: device.into(),
            size_bytes: 64 << 20,
        };
        let p2p = |label: &str| -> P2pKey { label.parse().unwrap() };
        v.d2d_universe = Arc::new(vec![d2d("0"), d2d("1"), d2d("2")]);
        v.p2p_universe = Arc::new(vec![p2p("0>1"), p2p("1>0")]);
        {
            let mut s = v.store.write().unwrap();
            let fresh = Sample {
                bytes_per_second: 1e11,
                at: unix_now(),
            };
            let old = Sample {
                bytes_per_second: 1e11,
                at: unix_now() - 7200.0,
            };
            s.record_sample(d2d("0"), fresh, 5);
            s.record_sample(d2d("1"), old, 5);
            s.record_error(d2d("2"), unix_now());
            s.record_sample(p2p("1>0"), fresh, 5);
            // A cell that is not planned (another size) is not counted.
            s.record_sample(
                D2dKey {
                    device: "0".into(),
                    size_bytes: 1,
                },
                fresh,
                5,
            );
        }
        let text = scrape(v);
        for (series, expected) in [
            ("chd_probe_cells{probe=\"d2d\",state=\"fresh\"}", 1.0),
            ("chd_probe_cells{probe=\"d2d\",state=\"stale\"}", 1.0),
            ("chd_probe_cells{probe=\"d2d\",state=\"unmeasured\"}", 1.0),
            ("chd_probe_cells{probe=\"p2p\",state=\"fresh\"}", 1.0),
            ("chd_probe_cells{probe=\"p2p\",state=\"unmeasured\"}", 1.0),
        ] {
            assert_eq!(value(&text, series), expected, "{series}");
        }
    }
}
