//! The ledger's `fabric` section: the node's fabric results (`chd probe fabric`'s files in
//! the state directory) as `chd serve` summarizes them (per rail and direction over all
//! peers, `analysis::fabric::summarize`), and the node's row of the node x node matrix: per
//! peer, what each rail carried, over the last runs kept with it.

use std::collections::BTreeMap;

use crate::analysis::fabric::{FabricSummary, RailSummary, RAIL_SLOW_RATIO};
use crate::format::calibration as doc;
use crate::format::fabric::{FabricRecord, Outcome, Way, KEEP_PER_PEER};
use crate::stats;
use crate::topology::natural::natural_cmp;

/// The section of `records` and their `summary` (`analysis::fabric::summarize` over the
/// last [`KEEP_PER_PEER`] runs of each peer); `None` without any; `unreadable` names the files
/// that could not be read.
pub fn fabric(
    records: &[FabricRecord],
    summary: &FabricSummary,
    unreadable: &[String],
) -> Option<doc::Fabric> {
    if records.is_empty() && unreadable.is_empty() {
        return None;
    }
    Some(doc::Fabric {
        rails: summary.rails.iter().map(rail).collect(),
        collectives: summary
            .collectives
            .iter()
            .map(|((op, bytes), gbps)| doc::FabricCollective {
                op: op.clone(),
                size_bytes: *bytes,
                bus_gbps: *gbps,
            })
            .collect(),
        runs: summary
            .runs
            .iter()
            .map(|(outcome, n)| doc::FabricRuns {
                outcome: outcome.to_string(),
                runs: *n as u64,
                last_finished: summary.last_run.get(outcome).copied().unwrap_or_default(),
            })
            .collect(),
        peers: peers(records),
        unreadable: unreadable.to_vec(),
    })
}

fn rail(r: &RailSummary) -> doc::FabricRail {
    doc::FabricRail {
        rail: r.rail.clone(),
        direction: r.way.as_str().to_string(),
        gbps: r.gbps,
        ratio: r.ratio,
        slow: r.ratio.is_some_and(|x| x < RAIL_SLOW_RATIO),
        slowest_peer: r.slowest_peer.0.clone(),
        slowest_peer_gbps: r.slowest_peer.1,
        runs: r.runs as u64,
    }
}

/// Each peer's row: its newest [`KEEP_PER_PEER`] runs, the rails of the successful ones.
fn peers(records: &[FabricRecord]) -> Vec<doc::FabricPeer> {
    let mut by_peer: BTreeMap<&str, Vec<&FabricRecord>> = BTreeMap::new();
    for r in records {
        by_peer.entry(&r.peer).or_default().push(r);
    }
    let mut out: Vec<doc::FabricPeer> = by_peer
        .into_iter()
        .map(|(peer, mut runs)| {
            runs.sort_by(|a, b| b.finished.total_cmp(&a.finished));
            runs.truncate(KEEP_PER_PEER);
            let newest = runs[0];
            type Acc = (Option<String>, Vec<f64>, u64);
            let mut rails: BTreeMap<(&str, Way), Acc> = BTreeMap::new();
            for run in runs.iter().filter(|r| r.outcome == Outcome::Ok) {
                for rr in &run.rails {
                    let e = rails.entry((&rr.rail, rr.way)).or_default();
                    e.0.clone_from(&rr.peer_rail);
                    e.1.push(rr.gbps.unwrap_or(0.0));
                    e.2 += u64::from(rr.slow);
                }
            }
            let mut rails: Vec<doc::FabricPeerRail> = rails
                .into_iter()
                .map(
                    |((rail, way), (peer_rail, values, slow_runs))| doc::FabricPeerRail {
                        rail: rail.to_string(),
                        peer_rail,
                        direction: way.as_str().to_string(),
                        gbps: stats::median(&values).unwrap_or(0.0),
                        slow_runs,
                        runs: values.len() as u64,
                    },
                )
                .collect();
            rails.sort_by(|a, b| {
                natural_cmp(&a.rail, &b.rail).then_with(|| a.direction.cmp(&b.direction).reverse())
            });
            doc::FabricPeer {
                peer: peer.to_string(),
                runs: runs.len() as u64,
                last_outcome: newest.outcome.as_str().to_string(),
                last_finished: newest.finished,
                last_error: newest.error.clone(),
                rails,
            }
        })
        .collect();
    out.sort_by(|a, b| natural_cmp(&a.peer, &b.peer));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::fabric::{samples, RailRecord};

    fn rail(name: &str, way: Way, gbps: Option<f64>, slow: bool) -> RailRecord {
        RailRecord {
            slow,
            ..samples::rail(name, way, gbps)
        }
    }

    fn record(run: &str, peer: &str, finished: f64, outcome: Outcome) -> FabricRecord {
        FabricRecord {
            outcome,
            error: (outcome == Outcome::Failed).then(|| "rank 1 never arrived".to_string()),
            ..samples::record(
                run,
                peer,
                finished,
                vec![
                    rail("eth1", Way::Send, Some(12.0), false),
                    rail("eth2", Way::Send, Some(3.0), true),
                    rail("eth1", Way::Receive, Some(11.0), false),
                    rail("eth2", Way::Receive, Some(11.0), false),
                ],
            )
        }
    }

    #[test]
    fn names_each_peer_with_its_rails_and_the_slow_rail_over_all_peers() {
        let fabric = |records: &[FabricRecord], unreadable: &[String]| {
            let summary = crate::analysis::fabric::summarize(records, KEEP_PER_PEER);
            super::fabric(records, &summary, unreadable)
        };
        assert_eq!(fabric(&[], &[]), None, "no results, no section");
        let mut failed = record("3", "node10", 30.0, Outcome::Failed);
        failed.rails.clear();
        let records = [
            record("1", "node10", 10.0, Outcome::Ok),
            record("2", "node2", 20.0, Outcome::Ok),
            failed,
        ];
        let f = fabric(&records, &["x.json: not a fabric result".into()]).unwrap();
        let slow: Vec<(&str, &str)> = f
            .rails
            .iter()
            .filter(|r| r.slow)
            .map(|r| (r.rail.as_str(), r.direction.as_str()))
            .collect();
        assert_eq!(slow, [("eth2", "send")]);
        let peers: Vec<(&str, u64, &str)> = f
            .peers
            .iter()
            .map(|p| (p.peer.as_str(), p.runs, p.last_outcome.as_str()))
            .collect();
        assert_eq!(
            peers,
            [("node2", 1, "ok"), ("node10", 2, "failed")],
            "natural order, the newest run's outcome"
        );
        assert_eq!(
            f.peers[1].last_error.as_deref(),
            Some("rank 1 never arrived")
        );
        let rails: Vec<(&str, &str, f64, u64)> = f.peers[1]
            .rails
            .iter()
            .map(|r| (r.rail.as_str(), r.direction.as_str(), r.gbps, r.slow_runs))
            .collect();
        assert_eq!(
            rails,
            [
                ("eth1", "send", 12.0, 0),
                ("eth1", "receive", 11.0, 0),
                ("eth2", "send", 3.0, 1),
                ("eth2", "receive", 11.0, 0)
            ],
            "the failed run adds no rail values"
        );
        let runs: Vec<(&str, u64)> = f
            .runs
            .iter()
            .map(|r| (r.outcome.as_str(), r.runs))
            .collect();
        assert_eq!(runs, [("failed", 1), ("ok", 2)]);
        assert_eq!(f.unreadable.len(), 1);
    }
}
