//! The ledger's `node`: identity and topology (CPUs, NUMA nodes, packages and cores), each
//! device with its declared and measured NUMA node, its PCIe link and its best CPUs.

use std::collections::BTreeMap;

use super::source::Source;
use crate::analysis::best_cpus::{BestCpus, BEST_CPU_TOLERANCE};
use crate::format::calibration as doc;
use crate::topology::cpulist;
use crate::topology::pci_link::{Link, LinkState};

fn gbps(bytes_per_second: f64) -> f64 {
    bytes_per_second / 1e9
}

fn state(s: &LinkState) -> doc::LinkState {
    doc::LinkState {
        width: s.width,
        gts: s.transfers_per_second as f64 / 1e9,
    }
}

fn link(l: &Link, age_seconds: Option<f64>) -> doc::Link {
    doc::Link {
        current: state(&l.current),
        max: state(&l.max),
        payload_gbps: l.current.payload_bytes_per_second().map(gbps),
        age_seconds,
    }
}

/// The node part of the ledger.
pub fn node(
    src: &Source,
    measured: &BTreeMap<String, u32>,
    best: &[BestCpus],
    numa: &BTreeMap<u32, u32>,
) -> doc::Node {
    let cpus: Vec<u32> = src.topology.cpus.iter().map(|c| c.id).collect();
    let devices = src
        .devices
        .iter()
        .map(|d| {
            let seen = src
                .store
                .links()
                .get(&d.id)
                .map(|s| link(&s.link, Some((src.now - s.at).max(0.0))));
            let recorded = || src.recorded_links.get(&d.id).map(|l| link(l, None));
            doc::Device {
                id: d.id.clone(),
                kind: d.kind.clone(),
                name: d.name.clone(),
                pci_bus_id: d.pci_bus_id.clone(),
                declared_numa_node: d.numa_node,
                measured_numa_node: measured.get(&d.id).copied(),
                link: seen.or_else(recorded),
                best_cpus: best.iter().find(|b| b.device == d.id).map(|b| {
                    let mut nodes: Vec<u32> =
                        b.cpus.iter().filter_map(|c| numa.get(c).copied()).collect();
                    nodes.sort_unstable();
                    nodes.dedup();
                    doc::BestCpus {
                        cpus: cpulist::format(&b.cpus),
                        numa_nodes: nodes,
                        best_gbps: gbps(b.best),
                        tolerance: BEST_CPU_TOLERANCE,
                        size_bytes: b.size_bytes,
                        direction: b.direction.as_str().to_string(),
                    }
                }),
            }
        })
        .collect();
    doc::Node {
        host: src.host.to_string(),
        backend: src.backend.to_string(),
        cpus: cpulist::format(&cpus),
        numa_nodes: src
            .topology
            .numa_nodes
            .iter()
            .map(|n| doc::NumaNode {
                id: n.id,
                cpus: cpulist::format(&n.cpus),
            })
            .collect(),
        packages: packages(src),
        cores: cores(src),
        devices,
    }
}

/// Each package sysfs names and its CPUs, by id.
fn packages(src: &Source) -> Vec<doc::Package> {
    let mut by_id: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for cpu in &src.topology.cpus {
        if let Some(p) = cpu.package {
            by_id.entry(p).or_default().push(cpu.id);
        }
    }
    by_id
        .into_iter()
        .map(|(id, cpus)| doc::Package {
            id,
            cpus: cpulist::format(&cpus),
        })
        .collect()
}

/// Each (package, core) sysfs names and its CPUs, in order of the core's first CPU.
fn cores(src: &Source) -> Vec<doc::Core> {
    let mut by_core: BTreeMap<(u32, u32), Vec<u32>> = BTreeMap::new();
    for cpu in &src.topology.cpus {
        if let (Some(p), Some(c)) = (cpu.package, cpu.core) {
            by_core.entry((p, c)).or_default().push(cpu.id);
        }
    }
    let mut cores: Vec<(u32, (u32, u32), Vec<u32>)> = by_core
        .into_iter()
        .map(|(key, cpus)| (cpus.iter().copied().min().unwrap_or(0), key, cpus))
        .collect();
    cores.sort_unstable_by_key(|(first, key, _)| (*first, *key));
    cores
        .into_iter()
        .map(|(_, (package, core), cpus)| doc::Core {
            package,
            core,
            cpus: cpulist::format(&cpus),
        })
        .collect()
}
