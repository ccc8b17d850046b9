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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::fabric::SCHEMA;

    fn rail(name: &str, way: Way, gbps: Option<f64>) -> RailRecord {
        RailRecord {
            rail: name.into(),
            address: "10.0.0.1".into(),
            peer_rail: Some(name.into()),
            peer_address: Some("10.0.0.2".into()),
            way,
            gbps,
            bytes: 1,
            streams: 1,
            seconds: gbps.map(|_| 1.0),
            error: gbps.is_none().then(|| "refused".into()),
            slow: false,
        }
    }

    fn run(id: &str, peer: &str, finished: f64, rails: Vec<RailRecord>) -> FabricRecord {
        FabricRecord {
            schema: SCHEMA,
            run: id.into(),
            node: "a".into(),
            peer: peer.into(),
            backend: "host".into(),
            world_size: 2,
            started: finished - 1.0,
            finished,
            outcome: Outcome::Ok,
            error: None,
            rails,
        }
    }

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
}
