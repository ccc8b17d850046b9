//! The circuit breaker: chd drains a node only while the nodes chd has drained stay few in
//! each of its partitions (`--max-drained`, a count or a percentage of the partition, 10 % by
//! default). One bad rule, or a bad recording copied everywhere, must not empty a partition:
//! NVIDIA's fault remediation stops cordoning past 50 % of the nodes for the same reason.
//! A node counts as drained by chd when it carries the `DRAIN` flag and a reason of chd's,
//! whatever else it is (down, not responding, gone): its reason says chd took it out.

use std::fmt;
use std::str::FromStr;

use super::nodes::Node;
use super::reason;

/// How many nodes of a partition chd may hold drained at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MaxDrained {
    /// At most this many nodes.
    Count(u32),
    /// At most this share of the partition's nodes, rounded down, but at least one node when
    /// the share is above 0 (so a small partition still gets its check).
    Percent(f64),
}

impl Default for MaxDrained {
    fn default() -> MaxDrained {
        MaxDrained::Percent(10.0)
    }
}

impl MaxDrained {
    /// The most nodes of a partition of `total` nodes chd may hold drained.
    pub fn limit(self, total: usize) -> usize {
        match self {
            MaxDrained::Count(n) => n as usize,
            MaxDrained::Percent(p) if p <= 0.0 => 0,
            MaxDrained::Percent(p) => {
                // The small epsilon keeps 10 % of 10 nodes at 1, not 0.999... -> 0.
                let share = (p / 100.0 * total as f64 + 1e-9).floor() as usize;
                share.max(1)
            }
        }
    }
}

impl fmt::Display for MaxDrained {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MaxDrained::Count(n) => write!(f, "{n}"),
            MaxDrained::Percent(p) => write!(f, "{p}%"),
        }
    }
}

impl FromStr for MaxDrained {
    type Err = String;

    /// `3` (nodes) or `10%` (of the partition).
    fn from_str(text: &str) -> Result<MaxDrained, String> {
        let text = text.trim();
        if let Some(p) = text.strip_suffix('%') {
            let p: f64 = p
                .trim()
                .parse()
                .map_err(|_| format!("{text:?}: not a percentage (like 10%)"))?;
            if !(0.0..=100.0).contains(&p) {
                return Err(format!("{text:?}: a percentage from 0% to 100%"));
            }
            return Ok(MaxDrained::Percent(p));
        }
        text.parse()
            .map(MaxDrained::Count)
            .map_err(|_| format!("{text:?}: a node count (like 3) or a percentage (like 10%)"))
    }
}

/// One partition as the breaker sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionCount {
    /// The partition's name; empty for a node in no partition (then: every node).
    pub partition: String,
    pub nodes: usize,
    /// Nodes of it drained by chd, `me` left out.
    pub drained_by_chd: usize,
    /// The limit for its size.
    pub limit: usize,
}

impl fmt::Display for PartitionCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = if self.partition.is_empty() {
            "the cluster".to_string()
        } else {
            format!("partition {}", self.partition)
        };
        write!(
            f,
            "{} of the {} nodes of {name} already drained by chd, --max-drained allows {}",
            self.drained_by_chd, self.nodes, self.limit
        )
    }
}

/// Whether `node` counts as drained by chd.
pub fn drained_by_chd(node: &Node) -> bool {
    node.state.drain() && node.reason.as_deref().is_some_and(reason::is_chd)
}

/// The first of `me`'s partitions where draining `me` too would pass the limit, if any.
pub fn trips(me: &Node, all: &[Node], max: MaxDrained) -> Option<PartitionCount> {
    counts(me, all, max)
        .into_iter()
        .find(|c| c.drained_by_chd + 1 > c.limit)
}

/// The breaker's count for each of `me`'s partitions (every node when it is in none).
pub fn counts(me: &Node, all: &[Node], max: MaxDrained) -> Vec<PartitionCount> {
    let count = |partition: &str, members: Vec<&Node>| PartitionCount {
        partition: partition.to_string(),
        nodes: members.len(),
        drained_by_chd: members
            .iter()
            .filter(|n| n.name != me.name && drained_by_chd(n))
            .count(),
        limit: max.limit(members.len()),
    };
    if me.partitions.is_empty() {
        return vec![count("", all.iter().collect())];
    }
    me.partitions
        .iter()
        .map(|p| {
            let members = all.iter().filter(|n| n.partitions.contains(p)).collect();
            count(p, members)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::nodes::NodeState;
    use super::*;

    fn node(name: &str, state: &str, partitions: &[&str], reason: Option<&str>) -> Node {
        Node {
            name: name.into(),
            state: NodeState::parse(state),
            partitions: partitions.iter().map(|p| p.to_string()).collect(),
            reason: reason.map(str::to_string),
            reason_by: None,
            addr: None,
        }
    }

    #[test]
    fn counts_and_percentages_parse_and_round_down_to_at_least_one() {
        assert_eq!("3".parse::<MaxDrained>(), Ok(MaxDrained::Count(3)));
        assert_eq!("10%".parse::<MaxDrained>(), Ok(MaxDrained::Percent(10.0)));
        assert_eq!(
            " 2.5 % ".parse::<MaxDrained>(),
            Ok(MaxDrained::Percent(2.5))
        );
        assert!("150%".parse::<MaxDrained>().is_err());
        assert!("-1".parse::<MaxDrained>().is_err());
        assert!("many"
            .parse::<MaxDrained>()
            .unwrap_err()
            .contains("node count"));
        let ten = MaxDrained::default();
        assert_eq!(ten.to_string(), "10%");
        assert_eq!(
            [1, 5, 10, 19, 20, 1000].map(|n| ten.limit(n)),
            [1, 1, 1, 1, 2, 100]
        );
        assert_eq!(MaxDrained::Percent(0.0).limit(100), 0);
        assert_eq!(MaxDrained::Percent(50.0).limit(3), 1);
        assert_eq!(MaxDrained::Count(0).limit(100), 0);
    }

    #[test]
    fn only_chd_drains_count_and_each_partition_is_judged() {
        let all = vec![
            node("a1", "IDLE", &["a", "all"], None),
            node(
                "a2",
                "IDLE+DRAIN",
                &["a", "all"],
                Some("chd: device 0 slow"),
            ),
            node(
                "a3",
                "DOWN+DRAIN+NOT_RESPONDING",
                &["a", "all"],
                Some("chd: x"),
            ),
            node("a4", "IDLE+DRAIN", &["a", "all"], Some("admin: bios")),
            node(
                "a5",
                "IDLE",
                &["a", "all"],
                Some("chd: stale reason, not drained"),
            ),
            node("b1", "IDLE", &["b", "all"], None),
        ];
        let me = &all[0];
        let c = counts(me, &all, MaxDrained::Count(2));
        assert_eq!(
            c,
            [
                PartitionCount {
                    partition: "a".into(),
                    nodes: 5,
                    drained_by_chd: 2,
                    limit: 2
                },
                PartitionCount {
                    partition: "all".into(),
                    nodes: 6,
                    drained_by_chd: 2,
                    limit: 2
                },
            ]
        );
        let tripped = trips(me, &all, MaxDrained::Count(2)).unwrap();
        assert_eq!(tripped.partition, "a");
        assert_eq!(
            tripped.to_string(),
            "2 of the 5 nodes of partition a already drained by chd, --max-drained allows 2"
        );
        assert_eq!(trips(me, &all, MaxDrained::Count(3)), None);
        // b1's partition b has no chd drain; its other partition trips the breaker.
        assert_eq!(
            trips(&all[5], &all, MaxDrained::Count(2))
                .unwrap()
                .partition,
            "all"
        );
        // A node already drained by chd does not count against itself.
        assert_eq!(
            counts(&all[1], &all, MaxDrained::Count(2))[0].drained_by_chd,
            1
        );
    }

    #[test]
    fn a_node_in_no_partition_is_judged_against_the_cluster() {
        let all = vec![
            node("x", "IDLE", &[], None),
            node("y", "IDLE+DRAIN", &[], Some("chd: y")),
        ];
        let c = trips(&all[0], &all, MaxDrained::Count(1)).unwrap();
        assert_eq!(
            c.to_string(),
            "1 of the 2 nodes of the cluster already drained by chd, --max-drained allows 1"
        );
    }
}
