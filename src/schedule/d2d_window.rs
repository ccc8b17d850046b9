//! The same-device copy part of a probe window: one cell per device (HBM to HBM, of the
//! configured size), each from one CPU of the device's NUMA node, run after the window's
//! H2D cells on the same thread (so never concurrently with them), until its share of the
//! budget is spent, the idle gate closes or chd stops. Each cell frees its two device
//! buffers before the next starts; nothing is held between windows.

use std::time::Duration;

use super::cell_loop::{self, Cells, WindowReport};
use super::metrics::ProbeMetrics;
use crate::probe::d2d;
use crate::runtime::{Backend, DeviceCopyParams};
use crate::store::{unix_now, D2dKey, Sample, SharedStore};

/// One device's same-device copy cell and the CPU it runs from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct D2dCell {
    pub key: D2dKey,
    pub cpu: u32,
}

/// What the d2d part of a window should do.
#[derive(Debug, Clone, Default)]
pub struct D2dWindowSpec {
    pub cells: Vec<D2dCell>,
    pub warmup: u32,
    pub iterations: u32,
    /// Samples a cell keeps.
    pub keep: usize,
}

struct DeviceCopyCells<'a> {
    spec: &'a D2dWindowSpec,
    backend: &'a dyn Backend,
    store: &'a SharedStore,
    metrics: &'a ProbeMetrics,
}

impl Cells for DeviceCopyCells<'_> {
    type Key = D2dCell;

    fn measure(&mut self, cell: &D2dCell) -> Option<f64> {
        if super::quarantine::skips(self.backend, &cell.key.device) {
            return None;
        }
        let params = DeviceCopyParams {
            size_bytes: cell.key.size_bytes,
            warmup: self.spec.warmup,
            iterations: self.spec.iterations,
        };
        match d2d::measure_cell(self.backend, cell.cpu, &cell.key.device, &params) {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!(cpu = cell.cpu, device = %cell.key.device,
                    size_bytes = cell.key.size_bytes, "d2d cell failed: {e}");
                self.store
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .record_error(cell.key.clone(), unix_now());
                self.metrics.error("d2d", &cell.key.device, e.reason());
                None
            }
        }
    }

    /// One cell per device: a slow device is what this probe is for, so no sample is held
    /// back for a re-measurement.
    fn is_suspect(&self, _: &D2dCell, _: f64) -> bool {
        false
    }

    fn is_slow(&self, _: &D2dCell, _: f64) -> bool {
        false
    }

    fn record(&mut self, cell: &D2dCell, values: &[f64]) {
        let at = unix_now();
        let mut store = self.store.write().unwrap_or_else(|p| p.into_inner());
        for &bytes_per_second in values {
            store.record_sample(
                cell.key.clone(),
                Sample {
                    bytes_per_second,
                    at,
                },
                self.spec.keep,
            );
        }
    }
}

/// Run the d2d cells of a window on the calling (dedicated) thread for at most `budget`;
/// `keep_going` is asked before every cell.
pub fn run(
    spec: &D2dWindowSpec,
    budget: Duration,
    backend: &dyn Backend,
    store: &SharedStore,
    metrics: &ProbeMetrics,
    keep_going: &mut dyn FnMut() -> bool,
) -> WindowReport {
    let mut cells = DeviceCopyCells {
        spec,
        backend,
        store,
        metrics,
    };
    let report = cell_loop::run("d2d", &spec.cells, budget, &mut cells, metrics, keep_going);
    let elapsed = report.elapsed;
    cell_loop::finish("d2d", report, elapsed, store, metrics)
}
