//! The calibration ledger: one document per node (`format::calibration::Ledger`) with its
//! identity and topology, the seed's four fields (`h2d_gbps_by_core_device`,
//! `d2d_alg_gbps_by_core_pair`, `affinity_bindable_cpus`, `load_profile_delta`), and the
//! analysis and findings exactly as `src/analysis` computes them; and the fleet file of
//! several. `chd ledger`, `chd serve`'s `/api/v1/calibration` and `chd advise` use it.
//!
//! - [`source`]: what a ledger is made from.
//! - [`node`]: identity, topology, devices.
//! - [`matrices`]: the measured cells and affinity verdicts.
//! - [`analysis_doc`]: the analysis and findings as records.
//! - [`kinds`]: same-device and peer copies, size curves, the basics table.
//! - [`fabric_doc`]: the fabric between this node and its peers.
//! - [`fleet`]: merging ledgers into one fleet file.
//! - [`advice`]: `chd advise`'s best CPUs and bindings per device.
//! - [`score`]: `chd advise --map`: a launch map scored against the ledger.

pub mod advice;
pub mod analysis_doc;
pub mod fabric_doc;
pub mod fleet;
pub mod kinds;
pub mod matrices;
pub mod node;
pub mod score;
pub mod source;

pub use source::Source;

use crate::analysis::best_cpus::best_cpus;
use crate::analysis::fabric::{summarize, RailSummary};
use crate::analysis::live;
use crate::analysis::verdict::{causes_of_store, NodeVerdict, Observed};
use crate::analysis::StoreAnalysis;
use crate::format::calibration::{self as doc, Ledger, NaturalMap};
use crate::format::fabric::KEEP_PER_PEER;
use crate::format::fabric_dir::Listing;
use crate::topology::natural::natural_cmp;

/// The ledger of `src`.
pub fn build(src: &Source) -> Ledger {
    let numa = live::numa_map(src.topology);
    let h2d = live::h2d_cells(src.store);
    let by_matrix = live::by_matrix(&h2d);
    let pair_cells = live::pair_cells(src.store);
    let analysis = StoreAnalysis::of(&by_matrix, &pair_cells, src.pairs, &numa);
    let best = best_cpus(&by_matrix);
    let mut node = node::node(src, &analysis.measured_nodes, &best, &numa);
    node.devices.sort_by(|a, b| natural_cmp(&a.id, &b.id));
    let mut delta: Vec<(String, NaturalMap<f64>)> = src
        .load_profile_delta
        .iter()
        .map(|(device, loads)| {
            let mut loads: Vec<(String, f64)> =
                loads.iter().map(|(l, r)| (l.clone(), *r)).collect();
            loads.sort_by(|a, b| natural_cmp(&a.0, &b.0));
            (device.clone(), NaturalMap(loads))
        })
        .collect();
    delta.sort_by(|a, b| natural_cmp(&a.0, &b.0));
    let fabric = summarize(&src.fabric.records, KEEP_PER_PEER);
    let d2d = live::d2d_devices(src.store, src.d2d_limits);
    let p2p = live::p2p_matrix(src.store, src.p2p_paths, src.p2p_methods);
    let mut findings = analysis_doc::findings(&analysis, &by_matrix, &numa);
    findings.slow_d2d_devices = kinds::slow_d2d(&d2d);
    findings.slow_p2p_pairs = kinds::slow_p2p(&p2p);
    Ledger {
        schema: doc::SCHEMA.to_string(),
        generated_at: src.now,
        source: src.description.to_string(),
        node,
        h2d_gbps_by_core_device: matrices::h2d(src.store.h2d(), src.now),
        d2d_alg_gbps_by_core_pair: matrices::pairs(src.store.pairs(), src.pairs, src.now),
        affinity_bindable_cpus: matrices::affinity(
            src.store.bindable(),
            src.recorded_bindable,
            src.now,
        ),
        load_profile_delta: NaturalMap(delta),
        analysis: analysis_doc::analysis(&analysis),
        findings,
        verdict: Some(verdict_doc(src, &numa, &fabric.rails)),
        d2d: kinds::d2d(&d2d),
        p2p: kinds::p2p(&p2p),
        sweeps: kinds::sweeps(src.curves),
        basics: src.basics.map(kinds::basics).unwrap_or_default(),
        fabric: fabric_doc::fabric(&src.fabric.records, &fabric, &unreadable(src.fabric)),
    }
}

/// The fabric result files that could not be read, for people.
fn unreadable(listing: &Listing) -> Vec<String> {
    listing
        .unreadable
        .iter()
        .map(|(path, why)| {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if why.contains(name.as_ref()) {
                why.clone()
            } else {
                format!("{}: {why}", path.display())
            }
        })
        .collect()
}

/// `src`'s verdict as the ledger records it: the held one given, else the store judged as a
/// snapshot (RDMA ports are read live by `chd serve` only).
fn verdict_doc(
    src: &Source,
    numa: &crate::analysis::NumaMap,
    fabric_rails: &[RailSummary],
) -> doc::Verdict {
    let snapshot;
    let (verdict, held) = match src.verdict {
        Some(v) => (v, true),
        None => {
            let observed = Observed {
                p2p_paths: src.p2p_paths.clone(),
                fabric_rails: fabric_rails.to_vec(),
                d2d_limits: src.d2d_limits.clone(),
                ..Observed::default()
            };
            let (causes, best) = causes_of_store(src.store, numa, src.pairs, &observed);
            snapshot = NodeVerdict::immediate(causes, best);
            (&snapshot, false)
        }
    };
    doc::Verdict {
        level: verdict.level.as_str().to_string(),
        held,
        causes: verdict
            .causes
            .iter()
            .map(|c| doc::VerdictCause {
                id: c.id.clone(),
                level: c.level.as_str().to_string(),
                text: c.text.clone(),
                device: c.device.clone(),
            })
            .collect(),
        changes: verdict
            .changes
            .counts
            .iter()
            .map(|(&(from, to), &count)| doc::VerdictChange {
                from: from.as_str().to_string(),
                to: to.as_str().to_string(),
                count,
            })
            .collect(),
        last_change: verdict
            .changes
            .last
            .map(|t| humantime::format_rfc3339_seconds(t).to_string()),
    }
}

/// `ledger` as pretty JSON with a final newline.
pub fn to_json(ledger: &impl serde::Serialize) -> String {
    let mut s = serde_json::to_string_pretty(ledger).unwrap_or_else(|e| {
        // A record of strings and numbers always serialises; say so rather than panic.
        format!("{{\"error\": \"serialising the ledger failed: {e}\"}}")
    });
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::DeviceInfo;
    use crate::store::{CellKey, Sample, Store};
    use crate::topology::{Cpu, NumaNode, Topology};
    use crate::vocab::Direction;
    use std::collections::BTreeMap;

    pub(crate) fn topology(cpus: u32, per_node: u32) -> Topology {
        Topology {
            cpus: (0..cpus)
                .map(|id| Cpu {
                    id,
                    numa_node: Some(id / per_node),
                    package: None,
                    core: None,
                    siblings: vec![id],
                    allowed: true,
                })
                .collect(),
            offline_cpus: Vec::new(),
            numa_nodes: (0..cpus.div_ceil(per_node))
                .map(|id| NumaNode {
                    id,
                    cpus: (id * per_node..(id + 1) * per_node).collect(),
                    has_memory: true,
                    memory_total_bytes: None,
                })
                .collect(),
        }
    }

    fn device(id: &str, numa: u32) -> DeviceInfo {
        DeviceInfo {
            id: id.into(),
            kind: "cuda".into(),
            name: "GPU".into(),
            pci_bus_id: format!("0000:{id}:00.0"),
            numa_node: Some(numa),
        }
    }

    #[test]
    fn a_slow_column_and_a_misplaced_device_show_in_order() {
        let topo = topology(4, 2);
        let devices = [device("10", 0), device("2", 1), device("0", 0)];
        let mut store = Store::default();
        for cpu in 0..4 {
            for (d, g) in [
                ("0", 50.0),
                ("2", if cpu < 2 { 50.0 } else { 40.0 }),
                ("10", 10.0),
            ] {
                let key = CellKey {
                    cpu,
                    device: d.into(),
                    size_bytes: 64 << 20,
                    direction: Direction::H2d,
                };
                let sample = Sample {
                    bytes_per_second: g * 1e9,
                    at: 90.0,
                };
                store.record_sample(key, sample, 3);
            }
        }
        store.record_bindable(&[(0, true), (1, true), (3, false)], 80.0);
        let delta = BTreeMap::from([(
            "2".to_string(),
            BTreeMap::from([
                ("gemm".to_string(), 0.5),
                ("cpu:10".into(), 0.9),
                ("cpu:2".into(), 1.0),
            ]),
        )]);
        let ledger = build(&Source {
            host: "n1",
            backend: "cuda",
            description: "test",
            topology: &topo,
            devices: &devices,
            store: &store,
            pairs: &[],
            recorded_links: &BTreeMap::new(),
            recorded_bindable: &[],
            load_profile_delta: &delta,
            now: 100.0,
            verdict: None,
            p2p_paths: &BTreeMap::new(),
            p2p_methods: &BTreeMap::new(),
            curves: &[],
            basics: None,
            fabric: &Default::default(),
            d2d_limits: &Default::default(),
        });
        let ids: Vec<&str> = ledger.node.devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["0", "2", "10"]);
        let d2 = &ledger.node.devices[1];
        assert_eq!(
            (d2.declared_numa_node, d2.measured_numa_node),
            (Some(1), Some(0))
        );
        assert_eq!(d2.best_cpus.as_ref().unwrap().cpus, "0-1");
        assert_eq!(ledger.findings.slow_devices.len(), 1);
        assert_eq!(ledger.findings.slow_devices[0].device, "10");
        let m = &ledger.h2d_gbps_by_core_device[0];
        assert_eq!(m.cells.len(), 12);
        assert_eq!(
            (m.cells[1].device.as_str(), m.cells[2].device.as_str()),
            ("2", "10")
        );
        assert_eq!(m.cells[0].age_seconds, Some(10.0));
        assert_eq!(m.cells[0].gbps, Some(50.0));
        assert_eq!(ledger.affinity_bindable_cpus.bindable, "0-1");
        // Judged as a snapshot: the slow column fails the node, the unbindable CPU degrades it
        // (device 2 from node 1 is at 0.8 of its best node: not slow).
        let verdict = ledger.verdict.as_ref().unwrap();
        assert_eq!((verdict.level.as_str(), verdict.held), ("failed", false));
        let ids: Vec<&str> = verdict.causes.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["slow_device:10", "unbindable_cpus"]);
        assert_eq!(ledger.affinity_bindable_cpus.not_bindable, "3");
        let json = to_json(&ledger);
        let loads = json.find("\"cpu:2\"").unwrap() < json.find("\"cpu:10\"").unwrap();
        assert!(loads, "natural order of profiles");
        assert!(json.contains("\"verdict\": {"), "{json}");
        let back = doc::parse("x", &json).unwrap();
        assert_eq!(back, ledger);

        // Advice: device 2's best CPUs sit on node 0, not the declared node 1; CPU 3 is
        // among device 0's best but not bindable.
        let a = advice::advise(&ledger);
        let d = |id: &str| a.devices.iter().find(|d| d.device == id).unwrap();
        assert_eq!(
            (d("2").cpus.as_str(), &d("2").numa_nodes[..]),
            ("0-1", &[0][..])
        );
        assert_eq!(d("2").on_declared_node, Some(false));
        assert_eq!(d("0").cpus, "0-2");
        assert!(a
            .notes
            .iter()
            .any(|n| n.contains("CPUs 3 are among the best but not bindable")));
        assert!(advice::render(&a).contains("(NUMA 0; NOT the declared node 1)"));
        let mut declared_right = ledger.clone();
        declared_right.node.devices[1].declared_numa_node = Some(0);
        let a = advice::advise(&declared_right);
        assert_eq!(a.devices[1].on_declared_node, Some(true));
        assert!(advice::render(&a).contains("(NUMA 0; the declared node 0)"));
    }
}
