//! Scrape-time view of the node's verdict (`chd_node_verdict{verdict}`: 1 for the current
//! one of `ok`, `degraded`, `failed`, 0 for the others, so a rule can select any of them), as
//! the prober holds it steady across windows ([`crate::schedule::verdict`]), and how often it
//! changed (`chd_node_verdict_changes_total{from,to}`, every pair from 0 so `increase()` sees
//! the first change too).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

use crate::analysis::verdict::Level;
use crate::schedule::verdict::SharedVerdict;

/// The verdict the prober (or a replay) publishes.
#[derive(Debug)]
pub struct VerdictView(pub SharedVerdict);

impl Collector for VerdictView {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (level, causes, changes) = {
            let v = self.0.read().unwrap_or_else(|p| p.into_inner());
            (v.level, v.causes.len(), v.changes.clone())
        };
        let mut family = enc.encode_descriptor(
            "chd_node_verdict",
            "The node's verdict: 1 for the current one (ok, degraded, failed), 0 for the others; a finding counts after it showed in schedule.verdict_confirm_windows windows and stops after it was absent from schedule.verdict_clear_windows",
            None,
            MetricType::Gauge,
        )?;
        for l in Level::ALL {
            family
                .encode_family(&[("verdict", l.as_str())])?
                .encode_gauge(&i64::from(l == level))?;
        }
        let mut family = enc.encode_descriptor(
            "chd_node_verdict_causes",
            "Findings the node's verdict names now",
            None,
            MetricType::Gauge,
        )?;
        family.encode_gauge(&(causes as i64))?;
        let mut family = enc.encode_descriptor(
            "chd_node_verdict_changes",
            "Changes of the node's verdict since chd serve started, by the verdict it left and the one it took (the verdict settling in the first schedule.verdict_confirm_windows windows after a start does not count)",
            None,
            MetricType::Counter,
        )?;
        for from in Level::ALL {
            for to in Level::ALL.into_iter().filter(|&to| to != from) {
                family
                    .encode_family(&[("from", from.as_str()), ("to", to.as_str())])?
                    .encode_counter::<NoLabelSet, _, u64>(&changes.count(from, to), None)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::verdict::Cause;
    use crate::exposition::{encode, Format};
    use crate::schedule::verdict::NodeVerdict;
    use prometheus_client::registry::Registry;
    use std::collections::BTreeMap;
    use std::sync::{Arc, RwLock};

    #[test]
    fn one_series_per_level_and_the_current_one_is_1() {
        let shared: SharedVerdict = Arc::new(RwLock::new(NodeVerdict::default()));
        let mut registry = Registry::default();
        registry.register_collector(Box::new(VerdictView(shared.clone())));
        let text = encode(&registry, Format::Prometheus).unwrap();
        assert!(
            text.contains("chd_node_verdict{verdict=\"ok\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("chd_node_verdict{verdict=\"failed\"} 0\n"),
            "{text}"
        );
        assert!(text.contains("chd_node_verdict_causes 0\n"), "{text}");
        *shared.write().unwrap() = NodeVerdict::immediate(
            vec![Cause {
                id: "slow_device:0".into(),
                level: Level::Failed,
                text: "device 0 slow column".into(),
                device: Some("0".into()),
            }],
            BTreeMap::new(),
        );
        let text = encode(&registry, Format::Prometheus).unwrap();
        assert!(
            text.contains("chd_node_verdict{verdict=\"ok\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("chd_node_verdict{verdict=\"failed\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("chd_node_verdict_causes 1\n"), "{text}");
        assert!(
            text.contains("chd_node_verdict_changes_total{from=\"ok\",to=\"failed\"} 0\n"),
            "{text}"
        );
        assert_eq!(
            text.matches("chd_node_verdict_changes_total{").count(),
            6,
            "{text}"
        );
        shared.write().unwrap().changes.record(
            Level::Ok,
            Level::Failed,
            std::time::SystemTime::now(),
        );
        let text = encode(&registry, Format::Prometheus).unwrap();
        assert!(
            text.contains("chd_node_verdict_changes_total{from=\"ok\",to=\"failed\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE chd_node_verdict_changes_total counter\n"),
            "{text}"
        );
    }
}
