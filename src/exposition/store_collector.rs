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

#[cfg(test)]
mod tests {
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

    fn key(cpu: u32, device: &str) -> CellKey {
        CellKey {
            cpu,
            device: device.into(),
            size_bytes: SIZE,
            direction: Direction::H2d,
        }
    }

    /// Device "0" and "3" typical (58.4 GB/s), "1" slow everywhere (12.7, the seed's NPU0),
    /// "2" slow only from node 1's CPUs; cpu 3 never measured on device "3".
    fn view(cells: bool) -> StoreView {
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
            affinity_cpus: Arc::new(vec![0, 1, 2, 3]),
            stale_after: Duration::from_secs(3600),
            cells,
        }
    }

    fn scrape(view: StoreView) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(view));
        encode(&registry, Format::Prometheus).unwrap()
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
        assert_eq!(value(&text, "chd_cpu_bindable{cpu=\"2\"}"), 0.0);
        assert_eq!(value(&text, "chd_cpu_bindable{cpu=\"3\"}"), 1.0);
        assert_eq!(
            value(
                &text,
                "chd_cpu_info{cpu=\"3\",numa_node=\"1\",package=\"1\",core=\"3\"}"
            ),
            1.0
        );
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
    fn stale_cells_are_counted_as_stale() {
        let v = view(true);
        {
            let mut s = v.store.write().unwrap();
            for cell in s.h2d.values_mut() {
                for sample in cell.samples.iter_mut() {
                    sample.at -= 7200.0;
                }
            }
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
}
