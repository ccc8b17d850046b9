//! The core-pair part of a probe window: planned (rank0 CPU, rank1 CPU) cells of each
//! configured device pair, measured by the pair probe until the pair budget is spent, the
//! idle gate closes or chd stops. The same rule as for copy cells holds: a sample far below
//! the pair's typical cell counts only once a re-measurement later in the window agrees. At
//! the end of the window the probe releases what it held for the pairs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::cell_loop::{self, Cells};
use super::metrics::ProbeMetrics;
use super::window::{WindowReport, SUSPECT_RATIO};
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
    for (key, cell) in store.pairs() {
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

/// The pair cells of one window.
struct PairCells<'a> {
    spec: &'a PairWindowSpec,
    store: &'a SharedStore,
    metrics: &'a ProbeMetrics,
    typical: BTreeMap<String, f64>,
}

impl Cells for PairCells<'_> {
    type Key = PairKey;

    fn measure(&mut self, key: &PairKey) -> Option<f64> {
        match self
            .spec
            .probe
            .measure(key.pair.devices(), [key.cpu0, key.cpu1], &self.spec.params)
        {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!(pair = %key.pair, cpu0 = key.cpu0, cpu1 = key.cpu1, "pair cell failed: {e}");
                self.store
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .record_error(key.clone(), unix_now());
                self.metrics.error("pair", key.pair.as_str(), e.reason());
                None
            }
        }
    }

    fn is_suspect(&self, key: &PairKey, value: f64) -> bool {
        let history = self
            .store
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .pairs()
            .get(key)
            .and_then(|c| c.median());
        self.is_slow(key, value) && history.is_none_or(|h| value < SUSPECT_RATIO * h)
    }

    fn is_slow(&self, key: &PairKey, value: f64) -> bool {
        self.typical
            .get(key.pair.as_str())
            .is_some_and(|t| value < SUSPECT_RATIO * t)
    }

    fn record(&mut self, key: &PairKey, values: &[f64]) {
        let at = unix_now();
        let mut s = self.store.write().unwrap_or_else(|p| p.into_inner());
        for &bytes_per_second in values {
            s.record_sample(
                key.clone(),
                Sample {
                    bytes_per_second,
                    at,
                },
                self.spec.keep,
            );
        }
    }
}

/// Run the pair cells on the calling (dedicated) thread.
pub fn run(
    spec: &PairWindowSpec,
    store: &SharedStore,
    metrics: &ProbeMetrics,
    keep_going: &mut dyn FnMut() -> bool,
) -> WindowReport {
    let started = Instant::now();
    let mut cells = PairCells {
        spec,
        store,
        metrics,
        typical: typical(&store.read().unwrap_or_else(|p| p.into_inner())),
    };
    let report = cell_loop::run(
        "pair",
        &spec.cells,
        spec.budget,
        &mut cells,
        metrics,
        keep_going,
    );
    // Nothing the pair probe holds (communicators, peer access) outlives the window.
    spec.probe.release_idle();
    cell_loop::finish("pair", report, started.elapsed(), store, metrics)
}
