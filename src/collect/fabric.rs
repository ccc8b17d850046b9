//! `fabric`: what the fabric probe (`chd probe fabric`) measured between this node and its
//! peers, from the results it left in the state directory (`<state_dir>/fabric/`, see
//! `format::fabric`), read at each scrape (a file is parsed again only when it changed), so
//! a new run shows at the next scrape without a restart. Series stay bounded per node
//! whatever the fleet size: per rail and direction, not per peer.
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `chd_fabric_rail_gbps` | gauge | rail, direction | median GB/s of the rail over the last runs kept per peer (a transfer that carried nothing counts 0) |
//! | `chd_fabric_rail_ratio` | gauge | rail, direction | median over those runs of the rail over the median of the node's other rails to the same peer; absent with one rail |
//! | `chd_fabric_rail_slowest_peer_gbps` | gauge | rail, direction, peer | the peer with the rail's lowest median, and that median |
//! | `chd_fabric_last_run_timestamp_seconds` | gauge | outcome | when the newest run of each outcome (`ok`, `failed`) finished |
//! | `chd_fabric_runs` | gauge | outcome | runs kept in the directory, by outcome |
//! | `chd_fabric_collective_bus_gbps` | gauge | op, size_bytes | median bus bandwidth (nccl-tests' definition) of the collective over all ranks of the last runs |
//!
//! `direction` is `send` (this node to the peer) or `receive`. No directory is no series (the
//! node never ran the fabric probe); a file that cannot be read or parsed costs only itself
//! and one read error.

use std::io;

use super::{CollectError, CollectorSpec, ReadError, Sink, SysCollector};
use crate::analysis::fabric::summarize;
use crate::format::fabric::{FabricFileError, KEEP_PER_PEER};
use crate::format::fabric_dir::FabricDir;

const GBPS: &str = "chd_fabric_rail_gbps";
const RATIO: &str = "chd_fabric_rail_ratio";
const SLOWEST: &str = "chd_fabric_rail_slowest_peer_gbps";
const LAST_RUN: &str = "chd_fabric_last_run_timestamp_seconds";
const RUNS: &str = "chd_fabric_runs";
const COLLECTIVE: &str = "chd_fabric_collective_bus_gbps";

/// The fabric collector.
#[derive(Debug)]
pub struct FabricCollector {
    dir: FabricDir,
}

impl FabricCollector {
    pub fn new(state_dir: &std::path::Path) -> Self {
        FabricCollector {
            dir: FabricDir::of_state_dir(state_dir),
        }
    }
}

impl SysCollector for FabricCollector {
    fn name(&self) -> &'static str {
        "fabric"
    }

    fn collect(&self, out: &mut Sink) -> Result<(), CollectError> {
        let listing = self.dir.list().map_err(|e| match e {
            FabricFileError::Io { path, source } => CollectError::List { path, source },
            other => CollectError::List {
                path: self.dir.path().to_path_buf(),
                source: io::Error::new(io::ErrorKind::InvalidData, other.to_string()),
            },
        })?;
        for (path, why) in listing.unreadable {
            out.read_error(&ReadError::Io {
                path,
                source: io::Error::new(io::ErrorKind::InvalidData, why),
            });
        }
        let summary = summarize(&listing.records, KEEP_PER_PEER);
        for r in &summary.rails {
            let labels = [("rail", r.rail.as_str()), ("direction", r.way.as_str())];
            out.gauge(
                GBPS,
                "Median GB/s of the rail over the last fabric runs",
                labels,
                r.gbps,
            );
            if let Some(ratio) = r.ratio {
                out.gauge(
                    RATIO,
                    "The rail over the median of the node's other rails to the same peer (median over runs)",
                    labels,
                    ratio,
                );
            }
            out.gauge(
                SLOWEST,
                "The peer with the rail's lowest median GB/s, and that median",
                [
                    ("rail", r.rail.as_str()),
                    ("direction", r.way.as_str()),
                    ("peer", r.slowest_peer.0.as_str()),
                ],
                r.slowest_peer.1,
            );
        }
        for ((op, bytes), gbps) in &summary.collectives {
            out.gauge(
                COLLECTIVE,
                "Median bus bandwidth (nccl-tests' definition) of the collective over all ranks of the last fabric runs",
                [("op", op.as_str()), ("size_bytes", bytes.to_string().as_str())],
                *gbps,
            );
        }
        for (outcome, t) in &summary.last_run {
            out.gauge(
                LAST_RUN,
                "When the newest fabric run of each outcome finished",
                [("outcome", *outcome)],
                *t,
            );
        }
        for (outcome, n) in &summary.runs {
            out.gauge(
                RUNS,
                "Fabric runs kept in the state directory, by outcome",
                [("outcome", *outcome)],
                *n as u64,
            );
        }
        Ok(())
    }
}

/// The `fabric` row of the collector table: built only where a state directory is known
/// (`chd serve`).
pub const SPEC: CollectorSpec = CollectorSpec {
    name: "fabric",
    default_enabled: true,
    help: "What chd probe fabric measured between this node and its peers (the state directory's fabric/)",
    options: &[],
    build: |ctx| {
        ctx.state_dir
            .map(|d| Box::new(FabricCollector::new(d)) as Box<dyn SysCollector>)
    },
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::fabric::{self as results, samples, FabricRecord, Way};

    fn record(
        run: &str,
        peer: &str,
        finished: f64,
        rails: &[(&str, Way, Option<f64>)],
    ) -> FabricRecord {
        let rails = rails
            .iter()
            .map(|(rail, way, gbps)| samples::rail(rail, *way, *gbps))
            .collect();
        samples::record(run, peer, finished, rails)
    }

    fn scrape(c: &FabricCollector) -> (Vec<String>, u64) {
        let mut sink = Sink::default();
        c.collect(&mut sink).unwrap();
        let mut rows = Vec::new();
        for f in sink.families() {
            for (labels, v) in f.samples() {
                let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                rows.push(format!("{}{{{}}} {}", f.name, l.join(","), v.as_f64()));
            }
        }
        (rows, sink.read_errors())
    }

    #[test]
    fn publishes_bounded_rail_series_and_picks_up_new_runs_at_the_next_scrape() {
        let tmp = tempfile::tempdir().unwrap();
        let c = FabricCollector::new(tmp.path());
        assert_eq!(scrape(&c), (vec![], 0), "no directory is no series");
        let dir = results::dir_of(tmp.path());
        results::write(
            &dir,
            &record(
                "1",
                "b",
                10.0,
                &[("v1", Way::Send, Some(10.0)), ("v2", Way::Send, Some(2.0))],
            ),
        )
        .unwrap();
        let (rows, errors) = scrape(&c);
        assert_eq!(errors, 0);
        assert!(
            rows.contains(&"chd_fabric_rail_gbps{rail=v2,direction=send} 2".to_string()),
            "{rows:?}"
        );
        assert!(
            rows.contains(&"chd_fabric_rail_ratio{rail=v2,direction=send} 0.2".to_string()),
            "{rows:?}"
        );
        assert!(
            rows.contains(
                &"chd_fabric_rail_slowest_peer_gbps{rail=v1,direction=send,peer=b} 10".to_string()
            ),
            "{rows:?}"
        );
        assert!(
            rows.contains(&"chd_fabric_last_run_timestamp_seconds{outcome=ok} 10".to_string()),
            "{rows:?}"
        );
        results::write(
            &dir,
            &record(
                "2",
                "c",
                20.0,
                &[("v1", Way::Send, Some(4.0)), ("v2", Way::Send, Some(4.0))],
            ),
        )
        .unwrap();
        std::fs::write(dir.join("broken.json"), "{").unwrap();
        let (rows, errors) = scrape(&c);
        assert_eq!(errors, 1);
        assert!(
            rows.contains(
                &"chd_fabric_rail_slowest_peer_gbps{rail=v1,direction=send,peer=c} 4".to_string()
            ),
            "{rows:?}"
        );
        assert!(
            rows.contains(&"chd_fabric_runs{outcome=ok} 2".to_string()),
            "{rows:?}"
        );
        // Bounded: 2 rails x 1 direction x 3 families + last run + runs, whatever the peers.
        assert_eq!(rows.len(), 8, "{rows:?}");
    }
}
