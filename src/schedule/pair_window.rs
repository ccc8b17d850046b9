//! The core-pair part of a probe window: planned (rank0 CPU, rank1 CPU) cells of each
//! configured device pair, measured by the pair probe until the pair budget is spent, the
//! idle gate closes or chd stops. The same rule as for copy cells holds: a sample far below
//! the pair's typical cell counts only once a re-measurement later in the window agrees. At
//! the end of the window the probe releases what it held for the pairs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::metrics::ProbeMetrics;
use super::window::{WindowEnd, WindowReport, SUSPECT_RATIO};
use crate::runtime::pair::{PairParams, PairProbe};
use crate::stats;
use crate::store::{unix_now, PairKey, Sample, SharedStore, Store};

/// What the pair part of a window should do.
#[derive(Clone)]
pub struct PairWindowSpec {
    pub cells: Vec<PairKey>,
    pub probe: Arc<dyn PairProbe>,
    pub params: PairParams,
    pub budget: Duration,
    pub keep: usize,
}

/// Typical cell value per pair at window start (median of its cells' medians, 3 or more).
fn typical(store: &Store) -> BTreeMap<String, f64> {
    let mut values: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for (key, cell) in &store.pair {
        if let Some(m) = cell.median() {
            values.entry(key.pair.as_str()).or_default().push(m);
        }
    }
    values
        .into_iter()
        .filter(|(_, v)| v.len() >= 3)
        .filter_map(|(k, v)| Some((k.to_string(), stats::median(&v)?)))
        .collect()
}

fn devices(pair: &str) -> [&str; 2] {
    let mut it = pair.splitn(2, ',');
    [it.next().unwrap_or(""), it.next().unwrap_or("")]
}

/// Run the pair cells on the calling (dedicated) thread.
pub fn run(
    spec: &PairWindowSpec,
    store: &SharedStore,
    metrics: &ProbeMetrics,
    keep_going: &mut dyn FnMut() -> bool,
) -> WindowReport {
    let started = Instant::now();
    let typical = typical(&store.read().unwrap_or_else(|p| p.into_inner()));
    let slow = |key: &PairKey, v: f64| {
        typical
            .get(&key.pair)
            .is_some_and(|t| v < SUSPECT_RATIO * t)
    };
    let mut report = WindowReport {
        measured: 0,
        errors: 0,
        end: WindowEnd::Completed,
        elapsed: Duration::ZERO,
    };
    let measure = |key: &PairKey, report: &mut WindowReport| -> Option<f64> {
        match spec
            .probe
            .measure(devices(&key.pair), [key.cpu0, key.cpu1], &spec.params)
        {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!(pair = %key.pair, cpu0 = key.cpu0, cpu1 = key.cpu1, "pair cell failed: {e}");
                store
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .record_pair_error(key.clone(), unix_now());
                metrics.error("pair", &key.pair, e.reason());
                report.errors += 1;
                None
            }
        }
    };
    let record = |key: &PairKey, values: &[f64], report: &mut WindowReport| {
        let at = unix_now();
        let mut s = store.write().unwrap_or_else(|p| p.into_inner());
        for &bytes_per_second in values {
            s.record_pair_sample(
                key.clone(),
                Sample {
                    bytes_per_second,
                    at,
                },
                spec.keep,
            );
        }
        report.measured += 1;
    };

    let mut suspects: Vec<(&PairKey, f64)> = Vec::new();
    for key in &spec.cells {
        if started.elapsed() >= spec.budget {
            report.end = WindowEnd::BudgetSpent;
            break;
        }
        if !keep_going() {
            report.end = WindowEnd::Aborted;
            break;
        }
        let Some(v) = measure(key, &mut report) else {
            continue;
        };
        let history = store
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .pair
            .get(key)
            .and_then(|c| c.median());
        let suspect =
            suspects.len() < 16 && slow(key, v) && history.is_none_or(|h| v < SUSPECT_RATIO * h);
        if suspect {
            suspects.push((key, v));
        } else {
            record(key, &[v], &mut report);
        }
    }
    for (key, first) in suspects.into_iter().rev() {
        if report.end == WindowEnd::Aborted || !keep_going() {
            report.end = WindowEnd::Aborted;
            break;
        }
        let Some(second) = measure(key, &mut report) else {
            continue;
        };
        if slow(key, second) {
            metrics.recheck("pair", "confirmed");
            record(key, &[first, second], &mut report);
        } else {
            metrics.recheck("pair", "rejected");
            record(key, &[second], &mut report);
        }
    }
    // Nothing the pair probe holds (communicators, peer access) outlives the window.
    spec.probe.release_idle();
    report.elapsed = started.elapsed();
    if report.measured > 0 {
        store
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .record_success("pair", unix_now());
    }
    metrics.run("pair", report.result());
    metrics.observe_duration("pair", report.elapsed.as_secs_f64());
    report
}
