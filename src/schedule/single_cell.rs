//! The window part of the kinds that measure each planned cell once per window, with no
//! re-measurement (a slow cell is what such a probe is for: one same-device copy per device,
//! one ordered pair's peer copy): run the cells in order on the window's (dedicated, bound
//! per cell) thread until the part's budget is spent, the idle gate closes or chd stops; skip
//! the cells of a quarantined device; record each value or failure in the store and the
//! failures in `chd_probe_errors_total`; end with the probe's run outcome and duration. A
//! kind says only what its cell is and how one is measured ([`SingleCell`]).

use std::time::Duration;

use super::cell_loop::{self, Cells, WindowReport};
use super::metrics::ProbeMetrics;
use crate::runtime::{Backend, ProbeError};
use crate::store::{unix_now, Family, Sample, SharedStore};

/// One cell of a single-cell kind.
pub trait SingleCell {
    /// The `probe` label of its runs and errors.
    const PROBE: &'static str;
    /// Its store family.
    type Key: Family;
    fn key(&self) -> &Self::Key;
    /// The devices whose quarantine skips the cell.
    fn devices(&self) -> Vec<&str>;
    /// The `device` label of its errors (a device, or a pair).
    fn label(&self) -> String;
    /// Measure the cell on the calling thread (binding it as the cell requires).
    fn measure(
        &self,
        backend: &dyn Backend,
        warmup: u32,
        iterations: u32,
    ) -> Result<f64, ProbeError>;
}

/// What a single-cell part of a window should do.
#[derive(Debug, Clone)]
pub struct SingleCellSpec<C> {
    /// The cells, in the order to measure them (none: the probe is off).
    pub cells: Vec<C>,
    pub warmup: u32,
    pub iterations: u32,
    /// Samples a cell keeps.
    pub keep: usize,
}

impl<C> Default for SingleCellSpec<C> {
    fn default() -> Self {
        SingleCellSpec {
            cells: Vec::new(),
            warmup: 0,
            iterations: 0,
            keep: 0,
        }
    }
}

struct Runner<'a, C> {
    spec: &'a SingleCellSpec<C>,
    backend: &'a dyn Backend,
    store: &'a SharedStore,
    metrics: &'a ProbeMetrics,
}

impl<C: SingleCell> Cells for Runner<'_, C> {
    type Key = C;

    fn measure(&mut self, cell: &C) -> Option<f64> {
        if cell
            .devices()
            .iter()
            .any(|d| super::quarantine::skips(self.backend, d))
        {
            return None;
        }
        match cell.measure(self.backend, self.spec.warmup, self.spec.iterations) {
            Ok(v) => Some(v),
            Err(e) => {
                let label = cell.label();
                tracing::warn!(probe = C::PROBE, cell = %label, "cell failed: {e}");
                self.store
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .record_error(cell.key().clone(), unix_now());
                self.metrics.error(C::PROBE, &label, e.reason());
                None
            }
        }
    }

    fn is_suspect(&self, _: &C, _: f64) -> bool {
        false
    }

    fn is_slow(&self, _: &C, _: f64) -> bool {
        false
    }

    fn record(&mut self, cell: &C, values: &[f64]) {
        let at = unix_now();
        let mut store = self.store.write().unwrap_or_else(|p| p.into_inner());
        for &bytes_per_second in values {
            let sample = Sample {
                bytes_per_second,
                at,
            };
            store.record_sample(cell.key().clone(), sample, self.spec.keep);
        }
    }
}

/// Run the part's cells on the calling (dedicated) thread for at most `budget`; `keep_going`
/// is asked before every cell.
pub fn run<C: SingleCell>(
    spec: &SingleCellSpec<C>,
    budget: Duration,
    backend: &dyn Backend,
    store: &SharedStore,
    metrics: &ProbeMetrics,
    keep_going: &mut dyn FnMut() -> bool,
) -> WindowReport {
    let mut cells = Runner {
        spec,
        backend,
        store,
        metrics,
    };
    let report = cell_loop::run(
        C::PROBE,
        &spec.cells,
        budget,
        &mut cells,
        metrics,
        keep_going,
    );
    let elapsed = report.elapsed;
    cell_loop::finish(C::PROBE, report, elapsed, store, metrics)
}
