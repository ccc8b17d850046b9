//! The peer copy part of a probe window: ONE ordered device pair's copy cell (a buffer on
//! `src` to a buffer on `dst`, on a stream of `src`, of the configured size), from one CPU of
//! `src`'s NUMA node, run last in the window on the same thread (so never concurrently with
//! the H2D or same-device cells), only in what is left of the budget and only while the idle
//! gate is open. [`Backend::measure_peer_copy`] opens peer access for the cell and closes it
//! after, and frees both buffers: nothing is held between windows.

use std::time::Duration;

use super::cell_loop::{self, Cells, WindowReport};
use super::metrics::ProbeMetrics;
use crate::probe::h2d::bind;
use crate::runtime::{Backend, DeviceCopyParams, ProbeError};
use crate::store::{unix_now, P2pKey, Sample, SharedStore};

/// The ordered pair a window measures and the CPU it runs from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct P2pCell {
    pub key: P2pKey,
    pub cpu: u32,
}

/// What the p2p part of a window should do.
#[derive(Debug, Clone, Default)]
pub struct P2pWindowSpec {
    /// The pair of this window (none: the p2p probe is off or the node has no pairs).
    pub cell: Option<P2pCell>,
    pub size_bytes: u64,
    pub warmup: u32,
    pub iterations: u32,
    /// Samples a cell keeps.
    pub keep: usize,
}

struct PeerCopyCells<'a> {
    spec: &'a P2pWindowSpec,
    backend: &'a dyn Backend,
    store: &'a SharedStore,
    metrics: &'a ProbeMetrics,
}

/// Measure `cell` from its CPU (bound for exactly the cell, released after).
fn measure_cell(
    backend: &dyn Backend,
    cell: &P2pCell,
    params: &DeviceCopyParams,
) -> Result<f64, ProbeError> {
    let _binding = bind(cell.cpu)?;
    let got = backend.measure_peer_copy(cell.key.src(), cell.key.dst(), params)?;
    tracing::debug!(pair = %cell.key.to_string(), method = got.method, "p2p cell measured");
    Ok(got.bytes_per_second)
}

impl Cells for PeerCopyCells<'_> {
    type Key = P2pCell;

    fn measure(&mut self, cell: &P2pCell) -> Option<f64> {
        let quarantined = |d: &str| super::quarantine::skips(self.backend, d);
        if quarantined(cell.key.src()) || quarantined(cell.key.dst()) {
            return None;
        }
        let params = DeviceCopyParams {
            size_bytes: self.spec.size_bytes,
            warmup: self.spec.warmup,
            iterations: self.spec.iterations,
        };
        match measure_cell(self.backend, cell, &params) {
            Ok(v) => Some(v),
            Err(e) => {
                let pair = cell.key.to_string();
                tracing::warn!(cpu = cell.cpu, pair = %pair,
                    size_bytes = self.spec.size_bytes, "p2p cell failed: {e}");
                self.store
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .record_error(cell.key.clone(), unix_now());
                self.metrics.error("p2p", &pair, e.reason());
                None
            }
        }
    }

    /// One cell per window: a slow pair is what this probe is for, so no sample is held back
    /// for a re-measurement.
    fn is_suspect(&self, _: &P2pCell, _: f64) -> bool {
        false
    }

    fn is_slow(&self, _: &P2pCell, _: f64) -> bool {
        false
    }

    fn record(&mut self, cell: &P2pCell, values: &[f64]) {
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

/// Run the window's pair cell, if any, on the calling (dedicated) thread if `budget` is not
/// spent yet; `keep_going` is asked before it starts.
pub fn run(
    spec: &P2pWindowSpec,
    budget: Duration,
    backend: &dyn Backend,
    store: &SharedStore,
    metrics: &ProbeMetrics,
    keep_going: &mut dyn FnMut() -> bool,
) -> WindowReport {
    let mut cells = PeerCopyCells {
        spec,
        backend,
        store,
        metrics,
    };
    let keys: Vec<P2pCell> = spec.cell.iter().cloned().collect();
    let report = cell_loop::run("p2p", &keys, budget, &mut cells, metrics, keep_going);
    let elapsed = report.elapsed;
    cell_loop::finish("p2p", report, elapsed, store, metrics)
}
