//! The fabric's rails judged, once: a rail is slow in a run when it carried less than
//! [`RAIL_SLOW_RATIO`] x the median of the node's other rails to the same peer in the same
//! direction (a rail that carried nothing counts as 0, and is left out of the others' median). Over the runs a node keeps, each rail's
//! value is the median of its runs, its ratio the median of its per-run ratios, and its slowest
//! peer the peer with the lowest median: a bounded summary per rail, whatever the fleet size.

use std::collections::BTreeMap;

use crate::format::fabric::{FabricRecord, Outcome, RailRecord, Way};
use crate::stats;

/// A rail below this share of the median of the node's other rails is slow (the threshold of
/// the `ChdFabricRailSlow` rule).
pub const RAIL_SLOW_RATIO: f64 = 0.7;

/// A rail's GB/s in a run, 0 when it carried nothing.
fn carried(r: &RailRecord) -> f64 {
    r.gbps.unwrap_or(0.0)
}

/// Each rail's value over the median of the other rails in its direction that carried
/// something (a dead rail is judged, but is no reference: it would hide a slow one beside
/// it); `None` with no such other rail.
fn ratios(rails: &[RailRecord]) -> Vec<Option<f64>> {
    rails
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let others: Vec<f64> = rails
                .iter()
                .enumerate()
                .filter(|(j, o)| *j != i && o.way == r.way)
                .map(|(_, o)| carried(o))
                .filter(|v| *v > 0.0)
                .collect();
            let median = stats::median(&others)?;
            Some(carried(r) / median)
        })
        .collect()
}

/// Set each rail's `slow` of one run against one peer.
pub fn judge(rails: &mut [RailRecord]) {
    let ratios = ratios(rails);
    for (r, ratio) in rails.iter_mut().zip(ratios) {
        r.slow = ratio.is_some_and(|x| x < RAIL_SLOW_RATIO);
    }
}

/// One rail in one direction over the runs a node keeps.
#[derive(Debug, Clone, PartialEq)]
pub struct RailSummary {
    pub rail: String,
    pub way: Way,
    /// Median GB/s over the runs (all peers).
    pub gbps: f64,
    /// Median of the per-run ratios to the node's other rails; `None` with a single rail.
    pub ratio: Option<f64>,
    /// The peer with the lowest median GB/s, and that median.
    pub slowest_peer: (String, f64),
    pub runs: usize,
}

/// What `chd serve` publishes of a node's fabric records.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FabricSummary {
    pub rails: Vec<RailSummary>,
    /// The newest `finished` per outcome.
    pub last_run: BTreeMap<&'static str, f64>,
    /// Runs kept per outcome (a run against several peers counts once).
    pub runs: BTreeMap<&'static str, usize>,
    /// (op, bytes) -> median bus bandwidth (GB/s) of the collective over the last runs.
    pub collectives: BTreeMap<(String, u64), f64>,
}

/// Summarize `records` (any order): the last `keep` runs of each peer count.
pub fn summarize(records: &[FabricRecord], keep: usize) -> FabricSummary {
    let mut out = FabricSummary::default();
    let mut runs_seen: BTreeMap<&'static str, std::collections::BTreeSet<&str>> = BTreeMap::new();
    for r in records {
        let o = r.outcome.as_str();
        let last = out.last_run.entry(o).or_insert(r.finished);
        *last = last.max(r.finished);
        runs_seen.entry(o).or_default().insert(&r.run);
    }
    out.runs = runs_seen.into_iter().map(|(o, s)| (o, s.len())).collect();

    // Each run's collectives once (every record of a run carries them), newest runs first.
    let mut by_run: BTreeMap<&str, &FabricRecord> = BTreeMap::new();
    for r in records.iter().filter(|r| r.outcome == Outcome::Ok) {
        by_run.entry(&r.run).or_insert(r);
    }
    let mut runs: Vec<&FabricRecord> = by_run.into_values().collect();
    runs.sort_by(|a, b| b.finished.total_cmp(&a.finished));
    let mut bus: BTreeMap<(String, u64), Vec<f64>> = BTreeMap::new();
    for run in runs.into_iter().take(keep) {
        for c in &run.collectives {
            if let Some(g) = c.bus_gbps {
                bus.entry((c.op.clone(), c.bytes)).or_default().push(g);
            }
        }
    }
    out.collectives = bus
        .into_iter()
        .filter_map(|(k, v)| Some((k, stats::median(&v)?)))
        .collect();

    let mut by_peer: BTreeMap<&str, Vec<&FabricRecord>> = BTreeMap::new();
    for r in records.iter().filter(|r| r.outcome == Outcome::Ok) {
        by_peer.entry(&r.peer).or_default().push(r);
    }
    // (rail, way) -> (values, ratios, peer -> values)
    type Acc<'a> = (Vec<f64>, Vec<f64>, BTreeMap<&'a str, Vec<f64>>);
    let mut acc: BTreeMap<(&str, Way), Acc> = BTreeMap::new();
    for (peer, mut runs) in by_peer {
        runs.sort_by(|a, b| b.finished.total_cmp(&a.finished));
        for run in runs.into_iter().take(keep) {
            for (rail, ratio) in run.rails.iter().zip(ratios(&run.rails)) {
                let e = acc.entry((&rail.rail, rail.way)).or_default();
                e.0.push(carried(rail));
                if let Some(x) = ratio {
                    e.1.push(x);
                }
                e.2.entry(peer).or_default().push(carried(rail));
            }
        }
    }
    for ((rail, way), (values, ratios, peers)) in acc {
        let slowest_peer = peers
            .into_iter()
            .filter_map(|(p, v)| Some((p.to_string(), stats::median(&v)?)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .expect("a rail with values has a peer");
        out.rails.push(RailSummary {
            rail: rail.to_string(),
            way,
            gbps: stats::median(&values).unwrap_or(0.0),
            ratio: stats::median(&ratios),
            slowest_peer,
            runs: values.len(),
        });
    }
    out
}

/// A pair whose value is below this share of the median pair is slow.
pub const PAIR_SLOW_RATIO: f64 = 0.7;

/// A node slow with more than this share of its measured peers is the common factor.
pub const COMMON_FACTOR_SHARE: f64 = 0.5;

/// The node x node matrix of many nodes' records: cell (a, b) is what a sent to b, all rails
/// together (each rail's GB/s summed; a rail that carried nothing adds 0), the median over
/// the runs kept. Read from the sender's records, else from the receiver's.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeMatrix {
    /// In natural order.
    pub nodes: Vec<String>,
    /// (sender, receiver) -> GB/s.
    pub cells: BTreeMap<(String, String), f64>,
    /// (sender, receiver) -> the rails that were slow in any run, `rail (send)`.
    pub slow_rails: BTreeMap<(String, String), Vec<String>>,
}

/// What the matrix says about its nodes and pairs.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MatrixFindings {
    /// The median cell, GB/s.
    pub median: Option<f64>,
    /// Cells below [`PAIR_SLOW_RATIO`] x the median, with their ratio.
    pub slow_pairs: Vec<((String, String), f64)>,
    /// Nodes slow with most of their peers: (node, slow pairs, measured pairs), the common
    /// factor of their slow pairs.
    pub slow_nodes: Vec<(String, usize, usize)>,
    /// Slow pairs neither of whose nodes is such a node: the path between them.
    pub slow_paths: Vec<(String, String)>,
}

/// Build the matrix from every node's records (failed runs are skipped).
pub fn node_matrix(records: &[FabricRecord], keep: usize) -> NodeMatrix {
    // (sender, receiver) -> run -> summed GB/s, from the sender's side first.
    let mut sent: BTreeMap<(String, String), BTreeMap<String, f64>> = BTreeMap::new();
    let mut received: BTreeMap<(String, String), BTreeMap<String, f64>> = BTreeMap::new();
    let mut slow: BTreeMap<(String, String), std::collections::BTreeSet<String>> = BTreeMap::new();
    let mut nodes = std::collections::BTreeSet::new();
    for r in records.iter().filter(|r| r.outcome == Outcome::Ok) {
        nodes.insert(r.node.clone());
        nodes.insert(r.peer.clone());
        for rail in &r.rails {
            let (key, into) = match rail.way {
                Way::Send => ((r.node.clone(), r.peer.clone()), &mut sent),
                Way::Receive => ((r.peer.clone(), r.node.clone()), &mut received),
            };
            *into
                .entry(key.clone())
                .or_default()
                .entry(format!("{:020.6} {}", r.finished, r.run))
                .or_default() += carried(rail);
            if rail.slow && rail.way == Way::Send {
                slow.entry(key).or_default().insert(rail.rail.clone());
            }
        }
    }
    let mut cells = BTreeMap::new();
    for (key, runs) in sent.iter().chain(received.iter()) {
        if cells.contains_key(key) {
            continue;
        }
        // Runs are keyed by finish time: the newest `keep`.
        let values: Vec<f64> = runs.values().rev().take(keep).copied().collect();
        if let Some(m) = stats::median(&values) {
            cells.insert(key.clone(), m);
        }
    }
    let mut nodes: Vec<String> = nodes.into_iter().collect();
    crate::topology::natural::sort_natural(&mut nodes);
    NodeMatrix {
        nodes,
        cells,
        slow_rails: slow
            .into_iter()
            .map(|(k, v)| (k, v.into_iter().collect()))
            .collect(),
    }
}

/// Judge the matrix's pairs and nodes.
pub fn matrix_findings(m: &NodeMatrix) -> MatrixFindings {
    let values: Vec<f64> = m.cells.values().copied().collect();
    let Some(median) = stats::median(&values).filter(|v| *v > 0.0) else {
        return MatrixFindings::default();
    };
    let slow_pairs: Vec<((String, String), f64)> = m
        .cells
        .iter()
        .map(|(k, v)| (k.clone(), v / median))
        .filter(|(_, ratio)| *ratio < PAIR_SLOW_RATIO)
        .collect();
    let mut slow_nodes = Vec::new();
    for node in &m.nodes {
        let touching = |k: &(String, String)| &k.0 == node || &k.1 == node;
        let measured = m.cells.keys().filter(|k| touching(k)).count();
        let slow = slow_pairs.iter().filter(|(k, _)| touching(k)).count();
        if measured >= 2 && slow as f64 > COMMON_FACTOR_SHARE * measured as f64 {
            slow_nodes.push((node.clone(), slow, measured));
        }
    }
    let is_slow_node = |n: &String| slow_nodes.iter().any(|(s, _, _)| s == n);
    let slow_paths = slow_pairs
        .iter()
        .filter(|((a, b), _)| !is_slow_node(a) && !is_slow_node(b))
        .map(|(k, _)| k.clone())
        .collect();
    MatrixFindings {
        median: Some(median),
        slow_pairs,
        slow_nodes,
        slow_paths,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::format::fabric::samples::{rail, record as run};
    #[test]
    fn a_rail_below_seven_tenths_of_the_others_is_slow_per_direction() {
        let mut rails = vec![
            rail("r1", Way::Send, Some(10.0)),
            rail("r2", Way::Send, Some(6.0)),
            rail("r3", Way::Send, Some(9.0)),
            rail("r1", Way::Receive, Some(10.0)),
            rail("r2", Way::Receive, Some(9.5)),
            rail("r3", Way::Receive, None),
        ];
        judge(&mut rails);
        let slow: Vec<(String, Way)> = rails
            .iter()
            .filter(|r| r.slow)
            .map(|r| (r.rail.clone(), r.way))
            .collect();
        assert_eq!(
            slow,
            [
                ("r2".to_string(), Way::Send),
                ("r3".to_string(), Way::Receive)
            ]
        );
        // A dead rail beside a slow one does not make the slow one look typical.
        let mut three = vec![
            rail("r1", Way::Send, Some(10.0)),
            rail("r2", Way::Send, Some(5.0)),
            rail("r3", Way::Send, None),
        ];
        judge(&mut three);
        assert_eq!(
            three.iter().map(|r| r.slow).collect::<Vec<_>>(),
            [false, true, true]
        );
        let mut one = vec![rail("r1", Way::Send, Some(1.0))];
        judge(&mut one);
        assert!(
            !one[0].slow,
            "a single rail has nothing to be judged against"
        );
    }

    #[test]
    fn the_summary_takes_medians_over_runs_and_names_the_slowest_peer() {
        let records = vec![
            run(
                "1",
                "b",
                1.0,
                vec![
                    rail("r1", Way::Send, Some(10.0)),
                    rail("r2", Way::Send, Some(2.0)),
                ],
            ),
            run(
                "2",
                "b",
                2.0,
                vec![
                    rail("r1", Way::Send, Some(12.0)),
                    rail("r2", Way::Send, Some(3.0)),
                ],
            ),
            run(
                "3",
                "c",
                3.0,
                vec![
                    rail("r1", Way::Send, Some(4.0)),
                    rail("r2", Way::Send, Some(4.0)),
                ],
            ),
            FabricRecord {
                outcome: Outcome::Failed,
                rails: vec![],
                ..run("4", "unknown", 4.0, vec![])
            },
        ];
        let s = summarize(&records, 8);
        assert_eq!(s.runs, BTreeMap::from([("failed", 1), ("ok", 3)]));
        assert_eq!(s.last_run["ok"], 3.0);
        let r1 = &s.rails[0];
        assert_eq!((r1.rail.as_str(), r1.gbps, r1.runs), ("r1", 10.0, 3));
        assert_eq!(r1.slowest_peer, ("c".to_string(), 4.0));
        let r2 = &s.rails[1];
        // Ratios 2/10, 3/12, 4/4: median 0.25.
        assert_eq!(r2.ratio, Some(0.25));
        assert_eq!(r2.slowest_peer, ("b".to_string(), 2.5));
        // Only the newest run of each peer.
        let s = summarize(&records, 1);
        assert_eq!(s.rails[0].runs, 2);
    }

    fn pair(node: &str, peer: &str, send: f64, receive: f64) -> FabricRecord {
        FabricRecord {
            node: node.into(),
            ..run(
                "r",
                peer,
                1.0,
                vec![
                    rail("v1", Way::Send, Some(send)),
                    rail("v1", Way::Receive, Some(receive)),
                ],
            )
        }
    }

    #[test]
    fn the_slow_node_is_the_common_factor_of_its_slow_pairs_and_a_lone_slow_pair_is_the_path() {
        // Five nodes, every pair both ways at 10 GB/s, but node c at 2 with everyone, and the
        // path a -> b at 3 (a and b fine with everyone else).
        let nodes = ["a", "b", "c", "d", "e"];
        let speed = |s: &str, r: &str| {
            if s == "c" || r == "c" {
                2.0
            } else if (s, r) == ("a", "b") {
                3.0
            } else {
                10.0
            }
        };
        let mut records = Vec::new();
        for s in nodes {
            for r in nodes.iter().filter(|r| **r != s) {
                records.push(pair(s, r, speed(s, r), speed(r, s)));
            }
        }
        let m = node_matrix(&records, 8);
        assert_eq!(m.nodes, nodes);
        assert_eq!(m.cells.len(), 20);
        assert_eq!(m.cells[&("a".to_string(), "b".to_string())], 3.0);
        let f = matrix_findings(&m);
        assert_eq!(f.median, Some(10.0));
        assert_eq!(f.slow_nodes, [("c".to_string(), 8, 8)]);
        assert_eq!(f.slow_paths, [("a".to_string(), "b".to_string())]);
        assert_eq!(f.slow_pairs.len(), 9);
    }
}
