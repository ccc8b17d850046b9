//! The scrape-time view of the store: matrix cells, NUMA-segment and device-column
//! aggregates, device ratios, the measured NUMA node of each device, affinity verdicts,
//! coverage, topology info and build info. It only reads the store (a short read lock to
//! take a snapshot of the numbers), so a scrape never waits for a probe.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::MetricType;

use crate::runtime::{DeviceInfo, Direction};
use crate::stats::{self, Summary};
use crate::store::{unix_now, CellKey, SharedStore, Store};
use crate::topology::Topology;

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

/// What the collector needs besides the store; fixed for the life of the process.
#[derive(Debug)]
pub struct StoreView {
    pub store: SharedStore,
    pub topology: Arc<Topology>,
    pub devices: Vec<DeviceInfo>,
    pub backend: String,
    /// Cells the prober measures (for coverage).
    pub universe: Arc<Vec<CellKey>>,
    /// CPUs the affinity probe checks (for coverage).
    pub affinity_cpus: Arc<Vec<u32>>,
    pub stale_after: Duration,
    /// Export every cell.
    pub cells: bool,
}

/// Aggregates over one (device, size, direction) column.
struct Column {
    summary: Summary,
    by_node: BTreeMap<Option<u32>, Summary>,
}

type ColumnKey<'a> = (&'a str, u64, Direction);

impl StoreView {
    fn columns<'s>(&self, store: &'s Store) -> BTreeMap<ColumnKey<'s>, Column> {
        let mut values: BTreeMap<ColumnKey<'s>, BTreeMap<Option<u32>, Vec<f64>>> = BTreeMap::new();
        for (key, cell) in store.measured_cells() {
            let Some(median) = cell.median() else {
                continue;
            };
            let node = self.topology.cpu(key.cpu).and_then(|c| c.numa_node);
            values
                .entry((key.device.as_str(), key.size_bytes, key.direction))
                .or_default()
                .entry(node)
                .or_default()
                .push(median);
        }
        values
            .into_iter()
            .filter_map(|(k, by_node)| {
                let all: Vec<f64> = by_node.values().flatten().copied().collect();
                let summary = Summary::of(&all)?;
                let by_node = by_node
                    .into_iter()
                    .filter_map(|(n, v)| Some((n, Summary::of(&v)?)))
                    .collect();
                Some((k, Column { summary, by_node }))
            })
            .collect()
    }

    fn encode_matrix(&self, store: &Store, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        if self.cells {
            let mut m = enc.encode_descriptor(
                "chd_h2d_bandwidth_bytes_per_second",
                "One cell of the core x device copy matrix: median of its recent samples",
                None,
                MetricType::Gauge,
            )?;
            for (key, cell) in store.measured_cells() {
                let Some(median) = cell.median() else {
                    continue;
                };
                let node = self.topology.cpu(key.cpu).and_then(|c| c.numa_node);
                let labels = [
                    ("cpu", Value::Int(key.cpu.into())),
                    ("numa_node", node_value(node)),
                    ("device", Value::Str(&key.device)),
                    ("size_bytes", Value::Int(key.size_bytes)),
                    ("direction", Value::Str(key.direction.as_str())),
                ];
                m.encode_family(&labels)?.encode_gauge(&median)?;
            }
        }

        let columns = self.columns(store);
        {
            let mut m = enc.encode_descriptor(
                "chd_h2d_segment_bandwidth_bytes_per_second",
                "Copy bandwidth of the cells whose CPU is on this NUMA node, per device",
                None,
                MetricType::Gauge,
            )?;
            for ((device, size, direction), col) in &columns {
                for (node, summary) in &col.by_node {
                    for (stat, value) in summary.labelled() {
                        let labels = [
                            ("numa_node", node_value(*node)),
                            ("device", Value::Str(device)),
                            ("size_bytes", Value::Int(*size)),
                            ("direction", Value::Str(direction.as_str())),
                            ("stat", Value::Str(stat)),
                        ];
                        m.encode_family(&labels)?.encode_gauge(&value)?;
                    }
                }
            }
        }
        {
            let mut m = enc.encode_descriptor(
                "chd_h2d_device_bandwidth_bytes_per_second",
                "Copy bandwidth of one device column over all CPUs",
                None,
                MetricType::Gauge,
            )?;
            for ((device, size, direction), col) in &columns {
                for (stat, value) in col.summary.labelled() {
                    let labels = [
                        ("device", Value::Str(device)),
                        ("size_bytes", Value::Int(*size)),
                        ("direction", Value::Str(direction.as_str())),
                        ("stat", Value::Str(stat)),
                    ];
                    m.encode_family(&labels)?.encode_gauge(&value)?;
                }
            }
        }
        {
            let mut m = enc.encode_descriptor(
                "chd_h2d_device_ratio",
                "Device column median / median of all column medians of this size and direction",
                None,
                MetricType::Gauge,
            )?;
            let mut medians: BTreeMap<(u64, Direction), Vec<f64>> = BTreeMap::new();
            for ((_, size, direction), col) in &columns {
                medians
                    .entry((*size, *direction))
                    .or_default()
                    .push(col.summary.median);
            }
            let reference: BTreeMap<(u64, Direction), f64> = medians
                .into_iter()
                .filter_map(|(k, v)| Some((k, stats::median(&v)?)))
                .collect();
            for ((device, size, direction), col) in &columns {
                let Some(r) = reference
                    .get(&(*size, *direction))
                    .and_then(|&reference| stats::ratio(col.summary.median, reference))
                else {
                    continue;
                };
                let labels = [
                    ("device", Value::Str(device)),
                    ("size_bytes", Value::Int(*size)),
                    ("direction", Value::Str(direction.as_str())),
                ];
                m.encode_family(&labels)?.encode_gauge(&r)?;
            }
        }
        {
            let mut m = enc.encode_descriptor(
                "chd_device_measured_numa_node",
                "NUMA node whose CPUs give this device the highest median copy bandwidth (largest size, h2d preferred)",
                None,
                MetricType::Gauge,
            )?;
            // Per device: the column of the largest size, h2d before d2h.
            let mut best: BTreeMap<&str, (u64, std::cmp::Reverse<Direction>, &Column)> =
                BTreeMap::new();
            for ((device, size, direction), col) in &columns {
                let rank = (*size, std::cmp::Reverse(*direction));
                let replace = best.get(device).is_none_or(|(s, d, _)| rank > (*s, *d));
                if replace {
                    best.insert(device, (rank.0, rank.1, col));
                }
            }
            for (device, (_, _, col)) in best {
                let fastest = col
                    .by_node
                    .iter()
                    .filter_map(|(n, s)| Some((n.as_ref()?, s.median)))
                    .max_by(|a, b| a.1.total_cmp(&b.1));
                if let Some((node, _)) = fastest {
                    m.encode_family(&[("device", Value::Str(device))])?
                        .encode_gauge(&(*node as i64))?;
                }
            }
        }
        Ok(())
    }

    fn encode_affinity(&self, store: &Store, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let mut m = enc.encode_descriptor(
            "chd_cpu_bindable",
            "1 if binding a thread to exactly this CPU succeeded and read back as exactly this CPU",
            None,
            MetricType::Gauge,
        )?;
        for (cpu, verdict) in &store.bindable {
            m.encode_family(&[("cpu", Value::Int((*cpu).into()))])?
                .encode_gauge(&i64::from(verdict.bindable))?;
        }
        Ok(())
    }

    fn encode_coverage(&self, store: &Store, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let now = unix_now();
        let stale_before = now - self.stale_after.as_secs_f64();
        let mut h2d = [0u64; 3];
        for key in self.universe.iter() {
            let state = match store.h2d.get(key).and_then(|c| c.last_sample_at()) {
                None => 2,
                Some(at) if at >= stale_before => 0,
                Some(_) => 1,
            };
            h2d[state] += 1;
        }
        let mut affinity = [0u64; 3];
        for cpu in self.affinity_cpus.iter() {
            let state = match store.bindable.get(cpu) {
                None => 2,
                Some(v) if v.at >= stale_before => 0,
                Some(_) => 1,
            };
            affinity[state] += 1;
        }
        {
            let mut m = enc.encode_descriptor(
            "chd_probe_cells",
            "Matrix coverage: cells measured recently (fresh), measured long ago (stale), never measured",
            None,
            MetricType::Gauge,
        )?;
            for (probe, counts) in [("h2d", h2d), ("affinity", affinity)] {
                for (state, count) in ["fresh", "stale", "unmeasured"].iter().zip(counts) {
                    m.encode_family(&[("probe", Value::Str(probe)), ("state", Value::Str(state))])?
                        .encode_gauge(&count)?;
                }
            }
        }
        let mut m = enc.encode_descriptor(
            "chd_probe_last_success_timestamp_seconds",
            "End of the last probe window that measured at least one cell",
            None,
            MetricType::Gauge,
        )?;
        for (probe, at) in &store.last_success {
            m.encode_family(&[("probe", Value::Str(probe))])?
                .encode_gauge(at)?;
        }
        Ok(())
    }

    fn encode_info(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        {
            let mut m = enc.encode_descriptor(
                "chd_cpu_info",
                "Online CPUs and where they sit",
                None,
                MetricType::Gauge,
            )?;
            for cpu in &self.topology.cpus {
                let labels = [
                    ("cpu", Value::Int(cpu.id.into())),
                    ("numa_node", node_value(cpu.numa_node)),
                    ("package", node_value(cpu.package)),
                    ("core", node_value(cpu.core)),
                ];
                m.encode_family(&labels)?.encode_gauge(&1i64)?;
            }
        }
        {
            let mut m = enc.encode_descriptor(
                "chd_device_info",
                "Devices of the loaded backend",
                None,
                MetricType::Gauge,
            )?;
            for d in &self.devices {
                let labels = [
                    ("device", Value::Str(&d.id)),
                    ("kind", Value::Str(&d.kind)),
                    ("name", Value::Str(&d.name)),
                    ("pci_bus_id", Value::Str(&d.pci_bus_id)),
                    ("numa_node", node_value(d.numa_node)),
                ];
                m.encode_family(&labels)?.encode_gauge(&1i64)?;
            }
        }
        {
            let mut m = enc.encode_descriptor(
                "chd_build_info",
                "Version of chd and the backend it runs",
                None,
                MetricType::Gauge,
            )?;
            let labels = [
                ("version", Value::Str(env!("CARGO_PKG_VERSION"))),
                ("backend", Value::Str(&self.backend)),
            ];
            m.encode_family(&labels)?.encode_gauge(&1i64)?;
        }
        {
            let mut m = enc.encode_descriptor(
                "chd_backend_up",
                "1 if that runtime loaded and answered",
                None,
                MetricType::Gauge,
            )?;
            m.encode_family(&[("backend", Value::Str(&self.backend))])?
                .encode_gauge(&1i64)?;
        }
        Ok(())
    }
}

impl Collector for StoreView {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // Encoding holds the read lock; probes take the write lock only to insert one sample.
        let store = self.store.read().unwrap_or_else(|p| p.into_inner());
        self.encode_matrix(&store, &mut encoder)?;
        self.encode_affinity(&store, &mut encoder)?;
        self.encode_coverage(&store, &mut encoder)?;
        drop(store);
        self.encode_info(&mut encoder)
    }
}
