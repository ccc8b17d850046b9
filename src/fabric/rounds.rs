//! The round-robin schedule of node pairs (the circle method): n nodes meet in n - 1 rounds
//! (n rounds for odd n, each giving one node a bye), every pair exactly once, and the pairs of
//! one round are disjoint, so they run at the same time without sharing a node. A slow node
//! is then the common factor of its slow pairs.
//!
//! Positions 0..m (m = n, or n + 1 with a phantom "bye" position for odd n): the last position
//! stays fixed, the others turn. In round r (0-based) the fixed position meets position r,
//! and position (r + i) mod (m - 1) meets (r - i) mod (m - 1) for i = 1..m/2. Two turning
//! positions x and y meet where x + y = 2r mod (m - 1), which has exactly one solution since
//! m - 1 is odd. A round is computed on its own, so `--round K` of a large fleet costs O(n).

use thiserror::Error;

use super::nodes::{NodeList, NodeName};

/// Why there is no such schedule or round.
#[derive(Debug, Error, PartialEq)]
pub enum RoundsError {
    #[error("a schedule of node pairs needs at least 2 nodes, got 1 ({node})")]
    TooFewNodes { node: String },
    #[error("round {round}: the schedule of {nodes} nodes has rounds 1 to {rounds}")]
    NoSuchRound {
        round: usize,
        nodes: usize,
        rounds: usize,
    },
}

/// One round: disjoint pairs (the earlier-listed node first, pairs in the order of their
/// first node), and for an odd number of nodes the one node that sits out.
#[derive(Debug, Clone, PartialEq)]
pub struct Round {
    /// 1-based.
    pub number: usize,
    pub pairs: Vec<(NodeName, NodeName)>,
    pub bye: Option<NodeName>,
}

/// The schedule of a node list of two or more nodes.
#[derive(Debug, Clone)]
pub struct Schedule {
    nodes: NodeList,
}

impl Schedule {
    pub fn new(nodes: NodeList) -> Result<Schedule, RoundsError> {
        if nodes.len() < 2 {
            return Err(RoundsError::TooFewNodes {
                node: nodes.nodes()[0].to_string(),
            });
        }
        Ok(Schedule { nodes })
    }

    pub fn nodes(&self) -> &[NodeName] {
        self.nodes.nodes()
    }

    /// Positions in the circle: the nodes, plus the bye for an odd count.
    fn positions(&self) -> usize {
        self.nodes.len() + self.nodes.len() % 2
    }

    /// n - 1 for even n, n for odd n.
    pub fn round_count(&self) -> usize {
        self.positions() - 1
    }

    /// Round `number` (1-based).
    pub fn round(&self, number: usize) -> Result<Round, RoundsError> {
        let turning = self.round_count();
        if number == 0 || number > turning {
            return Err(RoundsError::NoSuchRound {
                round: number,
                nodes: self.nodes.len(),
                rounds: turning,
            });
        }
        let r = number - 1;
        let fixed = self.positions() - 1;
        let mut meetings = vec![(r, fixed)];
        for i in 1..self.positions() / 2 {
            meetings.push(((r + i) % turning, (r + turning - i) % turning));
        }
        let nodes = self.nodes.nodes();
        let mut bye = None;
        let mut pairs: Vec<(usize, usize)> = Vec::with_capacity(meetings.len());
        for (a, b) in meetings {
            match (nodes.get(a), nodes.get(b)) {
                (Some(_), Some(_)) => pairs.push((a.min(b), a.max(b))),
                (Some(_), None) => bye = Some(nodes[a].clone()),
                (None, Some(_)) => bye = Some(nodes[b].clone()),
                (None, None) => unreachable!("only one position is the bye"),
            }
        }
        pairs.sort_unstable();
        Ok(Round {
            number,
            pairs: pairs
                .into_iter()
                .map(|(a, b)| (nodes[a].clone(), nodes[b].clone()))
                .collect(),
            bye,
        })
    }

    /// Every round, in order.
    pub fn rounds(&self) -> impl Iterator<Item = Round> + '_ {
        (1..=self.round_count()).map(|k| self.round(k).expect("k is within the schedule"))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashSet};

    use super::*;

    fn schedule(n: usize) -> Schedule {
        let names: Vec<String> = (0..n).map(|i| format!("n{i:02}")).collect();
        Schedule::new(NodeList::from_list(&names.join(",")).unwrap()).unwrap()
    }

    #[test]
    fn every_pair_meets_exactly_once_in_disjoint_rounds_for_2_to_33_nodes() {
        for n in 2..=33 {
            let s = schedule(n);
            let expected_rounds = if n % 2 == 0 { n - 1 } else { n };
            assert_eq!(s.round_count(), expected_rounds, "n = {n}");
            let mut met = HashSet::new();
            let mut byes = Vec::new();
            let mut rounds = 0;
            for round in s.rounds() {
                rounds += 1;
                assert_eq!(round.number, rounds);
                assert_eq!(round.pairs.len(), n / 2, "n = {n}, round {rounds}");
                let mut in_round = BTreeSet::new();
                for (a, b) in &round.pairs {
                    assert_ne!(a, b, "n = {n}: a node paired with itself");
                    assert!(
                        in_round.insert(a.clone()),
                        "n = {n}: {a} twice in one round"
                    );
                    assert!(
                        in_round.insert(b.clone()),
                        "n = {n}: {b} twice in one round"
                    );
                    let key = (a.clone().min(b.clone()), a.clone().max(b.clone()));
                    assert!(met.insert(key), "n = {n}: {a}-{b} meet twice");
                }
                if let Some(bye) = &round.bye {
                    assert!(
                        !in_round.contains(bye),
                        "n = {n}: {bye} has a bye and a pair"
                    );
                    byes.push(bye.clone());
                }
                let sitting_out = usize::from(round.bye.is_some());
                assert_eq!(in_round.len() + sitting_out, n, "n = {n}: a node left out");
            }
            assert_eq!(rounds, expected_rounds);
            assert_eq!(met.len(), n * (n - 1) / 2, "n = {n}: pairs missing");
            if n % 2 == 1 {
                let distinct: BTreeSet<_> = byes.iter().collect();
                assert_eq!(byes.len(), n, "n = {n}: one bye per round");
                assert_eq!(distinct.len(), n, "n = {n}: every node sits out once");
            } else {
                assert!(byes.is_empty(), "n = {n}: a bye with an even count");
            }
        }
    }

    #[test]
    fn four_nodes_in_three_rounds() {
        let s = schedule(4);
        let text: Vec<String> = s
            .rounds()
            .map(|r| {
                r.pairs
                    .iter()
                    .map(|(a, b)| format!("{a}-{b}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        // Round r (0-based): the fixed n03 meets position r; (r + 1) mod 3 meets (r - 1) mod 3.
        assert_eq!(
            text,
            ["n00-n03 n01-n02", "n00-n02 n01-n03", "n00-n01 n02-n03"]
        );
    }

    #[test]
    fn one_node_and_rounds_out_of_range_are_errors() {
        let one = Schedule::new(NodeList::from_list("solo").unwrap()).unwrap_err();
        assert_eq!(
            one.to_string(),
            "a schedule of node pairs needs at least 2 nodes, got 1 (solo)"
        );
        let s = schedule(5);
        assert!(s.round(5).is_ok());
        for bad in [0, 6] {
            assert_eq!(
                s.round(bad).unwrap_err().to_string(),
                format!("round {bad}: the schedule of 5 nodes has rounds 1 to 5")
            );
        }
    }

    #[test]
    fn a_round_of_a_large_fleet_is_computed_alone() {
        let s = schedule(4001);
        let round = s.round(4001).unwrap();
        assert_eq!(round.pairs.len(), 2000);
        assert!(round.bye.is_some());
    }
}
