//! The core-pair part of a probe window: planned (rank0 CPU, rank1 CPU) cells of each
//! configured device pair, measured by the pair probe until the pair budget is spent, the
//! idle gate closes or chd stops. The same rule as for copy cells holds: a sample far below
//! the pair's typical cell counts only once a re-measurement later in the window agrees. At
//! the end of the window the probe releases what it held for the pairs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::cell_loop::{self, Cells};
use super::metrics::ProbeMetrics;
use super::window::WindowReport;
use crate::analysis::suspect::Typical;
use crate::runtime::pair::{PairParams, PairProbe};
use crate::store::{unix_now, PairKey, Sample, SharedStore, Store};
use crate::vocab::DevicePair;

/// What the pair part of a window should do.
#[derive(Clone)]
pub struct PairWindowSpec {
    pub cells: Vec<PairKey>,
    pub probe: Arc<dyn PairProbe>,
    pub params: PairParams,
    pub budget: Duration,
    pub keep: usize,
}

/// The typical cell of each pair at window start: the median of its cells' medians (the
/// suspect rule is `analysis::suspect`'s).
fn typical(store: &Store) -> Typical<DevicePair> {
    Typical::of(
        store
            .pairs()
            .iter()
            .filter_map(|(key, cell)| Some((key.pair.clone(), cell.median()?))),
    )
}

/// The pair cells of one window.
struct PairCells<'a> {
    spec: &'a PairWindowSpec,
    store: &'a SharedStore,
    metrics: &'a ProbeMetrics,
    typical: Typical<DevicePair>,
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
        self.typical.is_suspect(&key.pair, value, history)
    }

    fn is_slow(&self, key: &PairKey, value: f64) -> bool {
        self.typical.is_slow(&key.pair, value)
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
