//! The fleet series budget (issue 13): at the seed's shape, 640 CPUs (8 NUMA nodes) x 16
//! devices x 3 sizes = 30,720 cells, the default exposition (`exposition.cells = "auto"`
//! resolved the way `chd serve` resolves it) is at most 3,300 series (3,000 before issue 17's 240 peer copy pairs); with cells forced on
//! the per-cell family is there, one series per cell. A typical 8-GPU node (224 CPUs x 8
//! devices x 3 sizes) keeps its cells under the default.
//!
//! The registry is the one `chd serve` builds before its collectors: the prober's counters,
//! the HTTP server's and the store view, over a store where every cell has five fresh
//! samples and every CPU a bindable verdict. The scrape-time collectors (RDMA, netdev,
//! NUMA, PCIe, device telemetry) add series that depend on the node's HCAs and netdevs and
//! are counted separately (docs/SCALE.md).
//!
//! `cargo test --test serve series_budget:: -- --nocapture` prints the series per family of each
//! shape and mode, and series and samples per second per node and per 1,000 nodes: the
//! numbers of docs/SCALE.md.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use prometheus_client::registry::Registry;

use chd::config::Config;
use chd::exposition::connections::ServerMetrics;
use chd::exposition::store_collector::StoreView;
use chd::exposition::verdict_collector::VerdictView;
use chd::exposition::{encode, Format};
use chd::runtime::{DeviceInfo, Direction};
use chd::schedule::metrics::ProbeMetrics;
use chd::store::{unix_now, CellKey, D2dKey, P2pKey, Sample, Store};
use chd::topology::pci_link::{Link, LinkState};
use chd::topology::pci_path::PathClass;
use chd::topology::{Cpu, NumaNode, Topology};

/// The series budget per node of issue 13 (3,000), raised by issue 17 part 3 for the 240
/// ordered device pairs of a 16-device node's peer copies.
const BUDGET: usize = 3_300;
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

/// A node of `shape` fully measured, as `chd serve` would expose it with `cells` resolved:
/// the Prometheus text of one scrape.
/// The devices of `universe`, once each.
fn shape_devices(universe: &[CellKey]) -> std::collections::BTreeSet<String> {
    universe.iter().map(|k| k.device.clone()).collect()
}

fn scrape(shape: Shape, cells: bool) -> String {
    let topology = Arc::new(shape.topology());
    let devices = shape.devices();
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
    assert_eq!(universe.len(), shape.cells());
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
            let path = if a.numa_node == b.numa_node {
                PathClass::Pix
            } else {
                PathClass::Sys
            };
            p2p_paths.insert(key, path);
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
