//! The fleet series budget (issue 13, issue 28 part 4): at the seed's shape, 640 CPUs (8
//! NUMA nodes) x 16 devices x 3 sizes = 30,720 cells, the default exposition
//! (`exposition.cells = "auto"` resolved the way `chd serve` resolves it, `exposition.
//! cpu_series = "exceptions"`) of a real node WITH its scrape-time collectors (8 RoCE rails,
//! their 8 netdevs, 24 PCI functions, 8 NUMA nodes, NVML telemetry of 16 devices) is under
//! 3,000 series; with cells forced on the per-cell family is there, one series per cell, and
//! with `cpu_series = "all"` the 2 per-CPU series of every CPU. A typical 8-GPU node (224
//! CPUs x 8 devices x 3 sizes) keeps its cells under the default.
//!
//! The registry is the one `chd serve` builds: the prober's counters, the HTTP server's, the
//! scrape-time collectors (for the real node: the default set, built by `collect::build_set`
//! reading a fixture tree in the kernel's layout from `support/sysfs_builder.rs`) and the
//! store view, over a store where every cell has five fresh samples and every CPU a bindable
//! verdict. The shapes without a tree are counted without collectors.
//!
//! `cargo test --test serve series_budget:: -- --nocapture` prints the series per family of each
//! shape and mode, and series and samples per second per node and per 1,000 nodes: the
//! numbers of docs/SCALE.md.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use prometheus_client::registry::Registry;

use chd::collect::{self, BuildContext, CollectorSet, PciDeviceRef};
use chd::config::{Config, CpuSeries};
use chd::exposition::connections::ServerMetrics;
use chd::exposition::store_collector::StoreView;
use chd::exposition::verdict_collector::VerdictView;
use chd::exposition::{encode, Format};
use chd::runtime::telemetry::{DeviceSample, DeviceTelemetry};
use chd::runtime::{DeviceInfo, Direction};
use chd::schedule::metrics::ProbeMetrics;
use chd::store::{unix_now, CellKey, D2dKey, P2pKey, Sample, Store};
use chd::topology::pci_link::{Link, LinkState};
use chd::topology::pci_path::{class_of, PathClass};
use chd::topology::{Cpu, NumaNode, Roots, Topology};

use crate::sysfs_builder::{self, NodeDevices};

/// The series budget per node of issue 13, for the whole node with its collectors since
/// issue 28 part 4 (3,300 without them between issue 17 part 3 and that).
const BUDGET: usize = 3_000;
const CELL_FAMILY: &str = "chd_h2d_bandwidth_bytes_per_second";
const SIZES_BYTES: [u64; 3] = [4 << 20, 16 << 20, 64 << 20];

/// A node: CPUs spread evenly over NUMA nodes and two packages, devices spread evenly over
/// the NUMA nodes.
#[derive(Debug, Clone, Copy)]
struct Shape {
    name: &'static str,
    cpus: u32,
    numa_nodes: u32,
    devices: u32,
}

/// The seed's A3 machine.
const SEED: Shape = Shape {
    name: "640 CPUs x 16 devices x 3 sizes",
    cpus: 640,
    numa_nodes: 8,
    devices: 16,
};

/// A typical 8-GPU node: 2 sockets of 56 cores with SMT, one NUMA node per socket.
const TYPICAL: Shape = Shape {
    name: "224 CPUs x 8 devices x 3 sizes",
    cpus: 224,
    numa_nodes: 2,
    devices: 8,
};

/// The largest 8-GPU node whose cells `auto` exports: 512 CPUs x 8 devices x 3 sizes is
/// exactly `exposition.auto_cells_limit`.
const AUTO_LIMIT: Shape = Shape {
    name: "512 CPUs x 8 devices x 3 sizes",
    cpus: 512,
    numa_nodes: 2,
    devices: 8,
};

impl Shape {
    fn cells(&self) -> usize {
        (self.cpus * self.devices) as usize * SIZES_BYTES.len()
    }

    fn topology(&self) -> Topology {
        let per_node = self.cpus / self.numa_nodes;
        let per_package = self.cpus / 2;
        Topology {
            cpus: (0..self.cpus)
                .map(|id| Cpu {
                    id,
                    numa_node: Some(id / per_node),
                    package: Some(id / per_package),
                    core: Some(id % per_package),
                    siblings: vec![id],
                    allowed: true,
                })
                .collect(),
            offline_cpus: Vec::new(),
            numa_nodes: (0..self.numa_nodes)
                .map(|id| NumaNode {
                    id,
                    cpus: (id * per_node..(id + 1) * per_node).collect(),
                    has_memory: true,
                    memory_total_bytes: Some(256 << 30),
                })
                .collect(),
        }
    }

    fn devices(&self) -> Vec<DeviceInfo> {
        (0..self.devices)
            .map(|d| DeviceInfo {
                id: d.to_string(),
                kind: "cuda".into(),
                name: "NVIDIA H200".into(),
                pci_bus_id: format!("0000:{:02x}:00.0", 0x10 + d * 8),
                numa_node: Some(d * self.numa_nodes / self.devices),
            })
            .collect()
    }
}

/// The devices of `universe`, once each.
fn shape_devices(universe: &[CellKey]) -> std::collections::BTreeSet<String> {
    universe.iter().map(|k| k.device.clone()).collect()
}

/// A node of `shape` fully measured, as `chd serve` would expose it with `cells` resolved
/// and the default `exposition.cpu_series`, without the scrape-time collectors: the
/// Prometheus text of one scrape.
fn scrape(shape: Shape, cells: bool) -> String {
    let same_node = |a: &DeviceInfo, b: &DeviceInfo| {
        if a.numa_node == b.numa_node {
            PathClass::Pix
        } else {
            PathClass::Sys
        }
    };
    let cpu_series = Config::resolve([]).unwrap().exposition.cpu_series;
    encode_node(
        Arc::new(shape.topology()),
        shape.devices(),
        same_node,
        cells,
        cpu_series,
        None,
    )
}

/// A node of `topology` and `devices` fully measured (every H2D cell of 3 sizes, every
/// same-device and peer copy cell, every CPU bindable, every device's link), encoded by the
/// registry `chd serve` builds with `collectors` registered as it registers them: the
/// Prometheus text of one scrape.
fn encode_node(
    topology: Arc<Topology>,
    devices: Vec<DeviceInfo>,
    path: impl Fn(&DeviceInfo, &DeviceInfo) -> PathClass,
    cells: bool,
    cpu_series: CpuSeries,
    collectors: Option<CollectorSet>,
) -> String {
    let universe: Vec<CellKey> = topology
        .cpus
        .iter()
        .flat_map(|cpu| {
            devices.iter().flat_map(move |d| {
                SIZES_BYTES.map(|size_bytes| CellKey {
                    cpu: cpu.id,
                    device: d.id.clone(),
                    size_bytes,
                    direction: Direction::H2d,
                })
            })
        })
        .collect();
    let now = unix_now();
    let mut store = Store::default();
    for (i, key) in universe.iter().enumerate() {
        for s in 0..5 {
            let sample = Sample {
                // Distinct values, so no aggregate collapses.
                bytes_per_second: 5.0e10 + (i * 5 + s) as f64,
                at: now - 60.0 * (5 - s) as f64,
            };
            store.record_sample(key.clone(), sample, 5);
        }
    }
    // Every device's same-device copy cell (`probe.d2d_size_mib`, 64 by default).
    let mut d2d_universe = Vec::new();
    for (i, d) in devices.iter().enumerate() {
        let key = D2dKey {
            device: d.id.clone(),
            size_bytes: 64 << 20,
        };
        d2d_universe.push(key.clone());
        let sample = Sample {
            bytes_per_second: 4.0e11 + i as f64,
            at: now,
        };
        store.record_sample(key, sample, 5);
    }
    store.record_success("d2d", now);
    // Every ordered device pair's peer copy cell (one pair per window; after N x (N - 1)
    // windows all of them), each with its path class.
    let mut p2p_paths = BTreeMap::new();
    for a in &devices {
        for b in devices.iter().filter(|b| b.id != a.id) {
            let key: P2pKey = format!("{}>{}", a.id, b.id).parse().unwrap();
            let sample = Sample {
                bytes_per_second: 2.0e10 + p2p_paths.len() as f64,
                at: now,
            };
            store.record_sample(key.clone(), sample, 5);
            p2p_paths.insert(key, path(a, b));
        }
    }
    store.record_success("p2p", now);
    let verdicts: Vec<(u32, bool)> = topology.cpus.iter().map(|c| (c.id, true)).collect();
    store.record_bindable(&verdicts, now);
    store.record_success("h2d", now);
    store.record_success("affinity", now);
    // Every device's link, as a window reads it after its copies (Gen5 x16).
    let gen5_x16 = LinkState {
        width: 16,
        transfers_per_second: 32_000_000_000,
    };
    for device in shape_devices(&universe) {
        let link = Link {
            current: gen5_x16,
            max: gen5_x16,
        };
        store.record_link(&device, link, now);
    }
    store.set_cpu_numa(
        topology
            .cpus
            .iter()
            .filter_map(|c| Some((c.id, c.numa_node?)))
            .collect(),
    );

    let mut registry = Registry::default();
    let metrics = ProbeMetrics::register(&mut registry);
    metrics.run("h2d", "ok");
    metrics.idle_window("probed");
    metrics.observe_duration("h2d", 1.9);
    metrics.run("d2d", "ok");
    metrics.observe_duration("d2d", 0.1);
    metrics.run("p2p", "ok");
    metrics.observe_duration("p2p", 0.01);
    ServerMetrics::register(&mut registry, 64);
    if let Some(set) = collectors {
        registry.register_collector(Box::new(set));
    }
    registry.register_collector(Box::new(VerdictView(Default::default())));
    registry.register_collector(Box::new(StoreView {
        store: Arc::new(RwLock::new(store)),
        topology: topology.clone(),
        devices: devices.clone(),
        backend: "cuda".into(),
        universe: Arc::new(universe),
        d2d_universe: Arc::new(d2d_universe),
        p2p_universe: Arc::new(p2p_paths.keys().cloned().collect()),
        affinity_cpus: Arc::new(topology.cpus.iter().map(|c| c.id).collect()),
        stale_after: Duration::from_secs(24 * 3600),
        cells,
        pairs: Vec::new(),
        pair_cells: false,
        cpu_series,
        p2p_paths: Arc::new(p2p_paths),
        d2d_limits: Default::default(),
    }));
    encode(&registry, Format::Prometheus).expect("encode")
}

/// Series per family (histogram and summary lines counted under their family's name), from
/// the `# TYPE` lines and the samples under them.
fn families(text: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    let mut family = String::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            family = rest.split(' ').next().unwrap_or_default().to_string();
            out.entry(family.clone()).or_insert(0);
        } else if !line.is_empty() && !line.starts_with('#') {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            assert!(
                name.starts_with(&family),
                "sample {name} outside its family {family}"
            );
            *out.entry(family.clone()).or_insert(0) += 1;
        }
    }
    out
}

fn total(families: &BTreeMap<String, usize>) -> usize {
    families.values().sum()
}

/// The default configuration's answer for `shape`, as `chd serve` asks it.
fn default_cells(shape: Shape) -> bool {
    Config::resolve([])
        .expect("defaults validate")
        .exposition
        .cells_for(shape.cells())
        .on
}

fn print_table(shape: Shape, mode: &str, families: &BTreeMap<String, usize>) {
    let series = total(families);
    println!(
        "== {} ({} cells), {mode}: {series} series",
        shape.name,
        shape.cells()
    );
    let mut by_size: Vec<(&String, &usize)> = families.iter().collect();
    by_size.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    for (name, n) in by_size.iter().take(8) {
        println!("   {n:>7} {name}");
    }
    let rest: usize = by_size.iter().skip(8).map(|(_, n)| **n).sum();
    println!(
        "   {rest:>7} the other {} families",
        by_size.len().saturating_sub(8)
    );
    for interval in [15.0, 60.0] {
        let per_s = series as f64 / interval;
        println!(
            "   scrape every {interval} s: {per_s:.0} samples/s per node, {:.0} per 1,000 nodes; \
             {} million series per 1,000 nodes",
            per_s * 1000.0,
            series as f64 / 1000.0
        );
    }
}

#[test]
fn the_seed_node_stays_within_the_budget_by_default() {
    assert!(!default_cells(SEED), "auto must leave the seed's cells off");
    let off = families(&scrape(SEED, default_cells(SEED)));
    print_table(SEED, "default (cells off)", &off);
    assert!(
        total(&off) <= BUDGET,
        "{} series > {BUDGET}: {off:?}",
        total(&off)
    );
    assert_eq!(off.get(CELL_FAMILY), None, "no per-cell family");
    // What the alerts and the fleet dashboard read is all there.
    let segments = 16 * 3 * 8;
    assert_eq!(
        off["chd_h2d_segment_bandwidth_bytes_per_second"],
        segments * 3,
        "min, median, max per (device, size, NUMA node)"
    );
    assert_eq!(off["chd_h2d_device_bandwidth_bytes_per_second"], 16 * 3 * 5);
    assert_eq!(off["chd_h2d_device_ratio"], 16 * 3);
    assert_eq!(off["chd_device_measured_numa_node"], 16);
    assert_eq!(
        off["chd_device_best_cpus_info"], 16,
        "one series per device"
    );
    assert_eq!(
        off["chd_device_pcie_link_bandwidth_bytes_per_second"],
        16 * 2
    );
    assert_eq!(off["chd_h2d_link_efficiency_ratio"], 16 * 3);
    assert_eq!(
        off["chd_p2p_bandwidth_bytes_per_second"],
        16 * 15,
        "one series per ordered device pair"
    );
}

#[test]
fn cells_forced_on_export_every_cell() {
    let on = families(&scrape(SEED, true));
    print_table(SEED, "exposition.cells = true", &on);
    assert_eq!(on.get(CELL_FAMILY), Some(&SEED.cells()));
    let off = families(&scrape(SEED, false));
    assert_eq!(
        total(&on),
        total(&off) + SEED.cells(),
        "cells add only cells"
    );
}

#[test]
fn a_typical_eight_gpu_node_exports_its_cells_by_default() {
    assert!(default_cells(TYPICAL));
    let on = families(&scrape(TYPICAL, default_cells(TYPICAL)));
    print_table(TYPICAL, "default (cells on)", &on);
    assert_eq!(on.get(CELL_FAMILY), Some(&TYPICAL.cells()));
    let off = families(&scrape(TYPICAL, false));
    print_table(TYPICAL, "exposition.cells = false", &off);
    assert!(total(&off) <= BUDGET, "{off:?}");
    // Up to the limit, and not one cell more.
    assert!(default_cells(AUTO_LIMIT));
    let at_limit = families(&scrape(AUTO_LIMIT, true));
    print_table(
        AUTO_LIMIT,
        "default (cells on, at the auto limit)",
        &at_limit,
    );
    assert_eq!(at_limit.get(CELL_FAMILY), Some(&12_288));
    let at_limit_off = families(&scrape(AUTO_LIMIT, false));
    print_table(AUTO_LIMIT, "exposition.cells = false", &at_limit_off);
    assert_eq!(total(&at_limit), total(&at_limit_off) + 12_288);
    let one_more = Config::resolve([]).unwrap().exposition.cells_for(12_289);
    assert!(!one_more.on, "{one_more}");
}

/// NVML as `chd serve` reads it on an idle node: utilization and memory of every device.
struct IdleNvml(Vec<String>);

impl DeviceTelemetry for IdleNvml {
    fn source(&self) -> &'static str {
        "nvml"
    }
    fn sample(&self) -> Vec<DeviceSample> {
        self.0
            .iter()
            .map(|d| DeviceSample {
                device: d.clone(),
                utilization: Some(0.0),
                memory_used_bytes: Some(512 << 20),
                foreign_processes: Some(0),
                ..DeviceSample::default()
            })
            .collect()
    }
}

/// The seed's node as sysfs and procfs show it: the A3 host's 640 CPUs in 8 NUMA nodes
/// (`sysfs_builder::a3`) with 16 accelerators and 8 single-port RoCE rails with their
/// netdevs (`sysfs_builder::a3_devices`: 24 PCI functions), written under `dir`.
fn seed_node_tree(dir: &std::path::Path) -> (Roots, NodeDevices) {
    let _ = std::fs::remove_dir_all(dir);
    let machine = sysfs_builder::a3();
    let (sysfs, procfs) = machine.write(dir).expect("write the A3 host");
    let node = sysfs_builder::a3_devices();
    node.write(dir, &machine).expect("write its devices");
    (Roots { sysfs, procfs }, node)
}

/// One scrape of the seed's node with its collectors: topology read from the tree, the
/// accelerators as the CUDA backend lists them (bus ids from the tree), the peer copy path
/// classes from the tree, and the collectors `chd serve` builds by default reading it.
/// `numa_memory_all` is `collectors.numa_memory_all` (off by default).
fn scrape_seed_node(
    roots: &Roots,
    node: &NodeDevices,
    cpu_series: CpuSeries,
    numa_memory_all: bool,
) -> String {
    let topology = Topology::read(roots).expect("read the A3 tree");
    assert_eq!(topology.cpus.len(), 640);
    assert_eq!(topology.numa_nodes.len(), 8);
    let devices: Vec<DeviceInfo> = node
        .accelerators
        .iter()
        .enumerate()
        .map(|(d, f)| DeviceInfo {
            id: d.to_string(),
            kind: "cuda".into(),
            name: "NVIDIA H200".into(),
            pci_bus_id: f.bdf.clone(),
            numa_node: Some(f.numa_node),
        })
        .collect();
    let mut config = Config::resolve([]).expect("defaults validate");
    config.collectors.numa_memory_all = numa_memory_all;
    let pci_devices: Vec<PciDeviceRef> = devices
        .iter()
        .map(|d| PciDeviceRef {
            device: d.id.clone(),
            bdf: d.pci_bus_id.clone(),
        })
        .collect();
    let state_dir = roots.sysfs.with_file_name("state");
    std::fs::create_dir_all(&state_dir).unwrap();
    let collectors = collect::build_set(&BuildContext {
        settings: &config.collectors,
        roots,
        pci_devices: &pci_devices,
        telemetry: Some(Arc::new(IdleNvml(
            devices.iter().map(|d| d.id.clone()).collect(),
        ))),
        state_dir: Some(&state_dir),
    });
    assert_eq!(
        collectors.names(),
        ["rdma", "numa", "netdev", "pcie", "device", "fabric"],
        "every collector chd serve registers by default"
    );
    let sysfs = roots.sysfs.clone();
    let path = move |a: &DeviceInfo, b: &DeviceInfo| {
        class_of(
            &sysfs,
            (&a.pci_bus_id, a.numa_node),
            (&b.pci_bus_id, b.numa_node),
        )
    };
    let cells = config.exposition.cells_for(SEED.cells()).on;
    encode_node(
        Arc::new(topology),
        devices,
        path,
        cells,
        cpu_series,
        Some(collectors),
    )
}

/// Series of the families whose name starts with `prefix`.
fn with_prefix(families: &BTreeMap<String, usize>, prefix: &str) -> usize {
    families
        .iter()
        .filter(|(name, _)| name.starts_with(prefix))
        .map(|(_, n)| n)
        .sum()
}

/// Issue 28 part 4: a real seed-shaped node with its collectors (8 RoCE rails, 8 netdevs,
/// 24 PCI functions) is under 3,000 series by default; `exposition.cpu_series = "all"`
/// gives back the 1,280 per-CPU series (2 per CPU) the default leaves out, and
/// `collectors.numa_memory_all` the meminfo rows beyond the 12 default kinds.
#[test]
fn the_seed_node_with_its_collectors_stays_within_the_budget_by_default() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("series-budget-a3");
    let (roots, node) = seed_node_tree(&dir);
    let default = Config::resolve([]).unwrap().exposition.cpu_series;
    assert_eq!(default, CpuSeries::Exceptions);
    let text = scrape_seed_node(&roots, &node, default, false);
    let by_family = families(&text);
    print_table(SEED, "with its collectors, default", &by_family);
    println!("   all families:");
    for (name, n) in &by_family {
        println!("   {n:>7} {name}");
    }
    assert!(
        total(&by_family) < BUDGET,
        "{} series >= {BUDGET}: {by_family:?}",
        total(&by_family)
    );
    // The collectors read the whole tree: every rail, netdev, PCI function and NUMA node.
    assert_eq!(by_family["chd_rdma_port_state"], 8, "one per rail");
    assert_eq!(
        by_family["chd_netdev_bytes_total"],
        8 * 2,
        "receive, transmit per rail's netdev (lo is no rail's)"
    );
    assert_eq!(
        by_family["chd_device_pcie_link_width"],
        24 * 2,
        "current, max per PCI function"
    );
    assert_eq!(by_family["chd_numa_events_total"], 8 * 6);
    assert_eq!(
        by_family["chd_numa_memory_bytes"],
        8 * 12,
        "the default kinds"
    );
    assert_eq!(by_family["chd_device_utilization_ratio"], 16);
    assert_eq!(with_prefix(&by_family, "chd_collector_"), 6 * 3);
    // No per-CPU family on a healthy node: no CPU is unbindable, and the counts say so.
    assert_eq!(by_family["chd_cpu_bindable"], 0, "no unbindable CPU");
    assert_eq!(by_family["chd_cpu_info"], 0);
    assert_eq!(by_family["chd_cpus"], 3);
    assert!(
        text.contains("chd_cpus{state=\"bindable\"} 640\n"),
        "{text}"
    );
    assert!(text.contains("chd_cpus{state=\"not_bindable\"} 0\n"));

    let all = families(&scrape_seed_node(&roots, &node, CpuSeries::All, false));
    print_table(
        SEED,
        "with its collectors, exposition.cpu_series = \"all\"",
        &all,
    );
    assert_eq!(all["chd_cpu_bindable"], 640);
    assert_eq!(all["chd_cpu_info"], 640);
    assert_eq!(
        total(&all),
        total(&by_family) + 2 * 640,
        "\"all\" adds back exactly the per-CPU series"
    );
    assert!(total(&all) > BUDGET, "the old shape was over the budget");
    // Before issue 28 part 4: every CPU's series and every meminfo row.
    let before = families(&scrape_seed_node(&roots, &node, CpuSeries::All, true));
    print_table(
        SEED,
        "with its collectors, cpu_series = \"all\", numa_memory_all (before issue 28 part 4)",
        &before,
    );
    assert_eq!(before["chd_numa_memory_bytes"], 8 * 33, "every kB row");
    assert_eq!(total(&before), total(&all) + 8 * (33 - 12));
}
