//! What `chd check --slurm` does to its node, as a pure function of the verdict and what
//! `scontrol show nodes` says: drain on a bad enough verdict, resume on `ok` a node chd
//! drained, and otherwise leave the node as it is. A node drained by anyone else, down, not
//! responding, failing or reserved is never touched; a verdict between (`degraded` when only
//! `failed` drains) neither drains nor resumes, so a node does not flap at the threshold.
//! Draining a node that is not drained yet passes the circuit breaker first
//! ([`super::breaker`]).

use super::breaker::{self, MaxDrained, PartitionCount};
use super::nodes::Node;
use super::reason;
use crate::analysis::verdict::{Cause, Level};

/// The verdict at which chd drains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DrainOn {
    #[default]
    Failed,
    Degraded,
}

impl DrainOn {
    pub fn level(self) -> Level {
        match self {
            DrainOn::Failed => Level::Failed,
            DrainOn::Degraded => Level::Degraded,
        }
    }
}

/// How chd acts on Slurm.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Policy {
    pub drain_on: DrainOn,
    pub max_drained: MaxDrained,
}

/// What to do to the node, and why (for the one log line each decision gets).
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// `scontrol update NodeName=<node> State=DRAIN Reason=<reason>`; `renew`: the node is
    /// drained by chd already and only its reason changes (new causes).
    Drain { reason: String, renew: bool },
    /// `scontrol update NodeName=<node> State=RESUME`: chd's own drain, and the verdict is ok.
    Resume { reason: String },
    /// Nothing to do.
    Leave { why: String },
    /// The verdict asks for a drain the circuit breaker refuses.
    Refuse { count: PartitionCount },
}

impl Decision {
    /// The decision's log line, naming the node, its state and the verdict.
    pub fn line(&self, me: &Node, level: Level) -> String {
        let node = format!("node {} ({})", me.name, me.state);
        match self {
            Decision::Drain {
                reason,
                renew: false,
            } => format!("draining {node}, verdict {level}: Reason=\"{reason}\""),
            Decision::Drain {
                reason,
                renew: true,
            } => format!(
                "renewing chd's drain reason of {node}, verdict {level}: Reason=\"{reason}\" (was \"{}\")",
                me.reason.as_deref().unwrap_or_default()
            ),
            Decision::Resume { reason } => {
                format!("resuming {node}, verdict {level}: its drain was chd's (\"{reason}\")")
            }
            Decision::Leave { why } => format!("leaving {node} as it is, verdict {level}: {why}"),
            Decision::Refuse { count } => format!(
                "circuit breaker: not draining {node}, verdict {level}: {count}"
            ),
        }
    }
}

/// The decision for `me` (as listed in `all`, the output of `scontrol show nodes`) on a
/// verdict of `level` with `causes`.
pub fn decide(level: Level, causes: &[Cause], me: &Node, all: &[Node], policy: Policy) -> Decision {
    let leave = |why: String| Decision::Leave { why };
    let ours = breaker::drained_by_chd(me);
    if me.state.down() {
        return leave("it is down, failing or not responding: Slurm's to handle".into());
    }
    if me.state.reserved() {
        return leave("it is reserved or in maintenance: chd leaves it to its owner".into());
    }
    if me.state.drain() && !ours {
        return leave(format!(
            "drained by someone else (reason \"{}\"): chd undoes only its own drains",
            me.reason.as_deref().unwrap_or_default()
        ));
    }
    if level >= policy.drain_on.level() {
        let reason = reason::reason(causes);
        if ours {
            if me.reason.as_deref() == Some(reason.as_str()) {
                return leave("drained by chd already, for the same causes".into());
            }
            return Decision::Drain {
                reason,
                renew: true,
            };
        }
        if let Some(count) = breaker::trips(me, all, policy.max_drained) {
            return Decision::Refuse { count };
        }
        return Decision::Drain {
            reason,
            renew: false,
        };
    }
    if level == Level::Ok {
        return match (ours, &me.reason) {
            (true, Some(reason)) => Decision::Resume {
                reason: reason.clone(),
            },
            _ => leave("not drained by chd: nothing to undo".into()),
        };
    }
    leave(format!(
        "below --drain-on {}: chd neither drains nor resumes",
        policy.drain_on.level()
    ))
}

#[cfg(test)]
mod tests {
    use super::super::nodes::NodeState;
    use super::*;

    fn node(name: &str, state: &str, reason: Option<&str>) -> Node {
        Node {
            name: name.into(),
            state: NodeState::parse(state),
            partitions: vec!["debug".into()],
            reason: reason.map(str::to_string),
            reason_by: None,
            addr: None,
        }
    }

    fn slow() -> Vec<Cause> {
        vec![Cause {
            id: "slow_device:0".into(),
            level: Level::Failed,
            text: "device 0 slow column (0.22 x the typical device)".into(),
            device: Some("0".into()),
        }]
    }

    const REASON: &str = "chd: device 0 slow column (0.22 x the typical device)";

    /// The decision for `me` alone in its partition with nine idle peers.
    fn alone(level: Level, me: &Node, policy: Policy) -> Decision {
        let mut all: Vec<Node> = (0..9)
            .map(|i| node(&format!("n{i}"), "IDLE", None))
            .collect();
        all.push(me.clone());
        decide(level, &slow(), me, &all, policy)
    }

    #[test]
    fn a_failed_node_is_drained_with_chds_reason_and_resumed_when_ok() {
        let me = node("vm", "IDLE", None);
        let d = alone(Level::Failed, &me, Policy::default());
        assert_eq!(
            d,
            Decision::Drain {
                reason: REASON.into(),
                renew: false
            }
        );
        assert_eq!(
            d.line(&me, Level::Failed),
            format!("draining node vm (IDLE), verdict failed: Reason=\"{REASON}\"")
        );
        let drained = node("vm", "IDLE+DRAIN", Some(REASON));
        let d = alone(Level::Ok, &drained, Policy::default());
        assert_eq!(
            d,
            Decision::Resume {
                reason: REASON.into()
            }
        );
        assert!(d
            .line(&drained, Level::Ok)
            .starts_with("resuming node vm (IDLE+DRAIN)"));
        // Drained already for the same causes: nothing; for others: the reason is renewed.
        assert!(matches!(
            alone(Level::Failed, &drained, Policy::default()),
            Decision::Leave { .. }
        ));
        let older = node("vm", "MIXED+DRAIN", Some("chd: device 3 slow column"));
        assert_eq!(
            alone(Level::Failed, &older, Policy::default()),
            Decision::Drain {
                reason: REASON.into(),
                renew: true
            }
        );
        // Ok and not drained: nothing.
        assert!(matches!(
            alone(Level::Ok, &me, Policy::default()),
            Decision::Leave { .. }
        ));
    }

    #[test]
    fn degraded_drains_only_with_drain_on_degraded_and_never_resumes_otherwise() {
        let me = node("vm", "IDLE", None);
        let d = alone(Level::Degraded, &me, Policy::default());
        let Decision::Leave { why } = &d else {
            panic!("{d:?}")
        };
        assert_eq!(
            why,
            "below --drain-on failed: chd neither drains nor resumes"
        );
        let drained = node("vm", "IDLE+DRAIN", Some(REASON));
        assert!(matches!(
            alone(Level::Degraded, &drained, Policy::default()),
            Decision::Leave { .. }
        ));
        let on_degraded = Policy {
            drain_on: DrainOn::Degraded,
            ..Policy::default()
        };
        assert!(matches!(
            alone(Level::Degraded, &me, on_degraded),
            Decision::Drain { renew: false, .. }
        ));
    }

    #[test]
    fn other_drains_down_and_reserved_nodes_are_never_touched() {
        for (state, reason, says) in [
            (
                "IDLE+DRAIN",
                Some("admin: new PSU"),
                "drained by someone else (reason \"admin: new PSU\")",
            ),
            (
                "MIXED+DRAIN",
                Some("NHC: disk full"),
                "drained by someone else",
            ),
            ("DOWN", Some("Not responding"), "down"),
            ("DOWN+DRAIN", Some(REASON), "down"),
            ("IDLE+NOT_RESPONDING", None, "not responding"),
            ("IDLE+RESERVED", None, "reserved"),
            ("IDLE+DRAIN+MAINTENANCE", Some(REASON), "maintenance"),
        ] {
            let me = node("vm", state, reason);
            for level in [Level::Ok, Level::Degraded, Level::Failed] {
                let d = alone(
                    level,
                    &me,
                    Policy {
                        drain_on: DrainOn::Degraded,
                        ..Policy::default()
                    },
                );
                let Decision::Leave { why } = &d else {
                    panic!("{state} {level}: {d:?}")
                };
                assert!(why.contains(says), "{state} {level}: {why}");
            }
        }
    }

    #[test]
    fn the_breaker_refuses_a_drain_past_max_drained_but_not_a_resume() {
        let me = node("vm", "IDLE", None);
        let mut all = vec![
            node(
                "g1",
                "UNKNOWN+DRAIN+NOT_RESPONDING",
                Some("chd: device 1 slow column"),
            ),
            node(
                "g2",
                "UNKNOWN+DRAIN+NOT_RESPONDING",
                Some("chd: device 2 slow column"),
            ),
            node("g3", "UNKNOWN+NOT_RESPONDING", None),
            node("g4", "IDLE+DRAIN", Some("admin: bios")),
        ];
        all.push(me.clone());
        let policy = |max: &str| Policy {
            max_drained: max.parse().unwrap(),
            ..Policy::default()
        };
        let d = decide(Level::Failed, &slow(), &me, &all, policy("2"));
        let Decision::Refuse { count } = &d else {
            panic!("{d:?}")
        };
        assert_eq!((count.drained_by_chd, count.nodes, count.limit), (2, 5, 2));
        assert_eq!(
            d.line(&me, Level::Failed),
            "circuit breaker: not draining node vm (IDLE), verdict failed: 2 of the 5 nodes of partition debug already drained by chd, --max-drained allows 2"
        );
        assert!(matches!(
            decide(Level::Failed, &slow(), &me, &all, policy("3")),
            Decision::Drain { .. }
        ));
        // 10 % of 5 nodes is one node: already taken.
        assert!(matches!(
            decide(Level::Failed, &slow(), &me, &all, Policy::default()),
            Decision::Refuse { .. }
        ));
        assert!(matches!(
            decide(Level::Failed, &slow(), &me, &all, policy("60%")),
            Decision::Drain { .. }
        ));
        // A node chd drained already may still be resumed, and renewed, with the breaker tripped.
        let drained = node("vm", "IDLE+DRAIN", Some("chd: device 3 slow column"));
        all.pop();
        all.push(drained.clone());
        assert!(matches!(
            decide(Level::Ok, &[], &drained, &all, policy("0")),
            Decision::Resume { .. }
        ));
        assert!(matches!(
            decide(Level::Failed, &slow(), &drained, &all, policy("0")),
            Decision::Drain { renew: true, .. }
        ));
    }
}
