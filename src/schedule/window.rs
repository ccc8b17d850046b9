//! One probe window, run on a dedicated thread: an affinity scan of the CPUs, then the
//! planned copy cells until the time budget is spent, the idle gate closes, or chd is
//! shutting down. Every result goes to the store as soon as it is measured.

use std::time::{Duration, Instant};

use crate::affinity;
use crate::exposition::metrics::ProbeMetrics;
use crate::probe::h2d;
use crate::runtime::Backend;
use crate::store::{unix_now, CellKey, Sample, SharedStore};

/// What a window should do.
#[derive(Debug, Clone)]
pub struct WindowSpec {
    /// Copy cells in the order to measure them.
    pub cells: Vec<CellKey>,
    /// CPUs to check for bindability first.
    pub affinity_cpus: Vec<u32>,
    /// Probing time after which no new cell starts.
    pub budget: Duration,
    pub warmup: u32,
    pub iterations: u32,
    /// Samples a cell keeps.
    pub keep: usize,
}

/// Why the window ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowEnd {
    /// Every planned cell was tried.
    Completed,
    /// The time budget was spent.
    BudgetSpent,
    /// The idle gate closed or chd is stopping.
    Aborted,
}

/// What a window did.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowReport {
    pub measured: usize,
    pub errors: usize,
    pub end: WindowEnd,
    pub elapsed: Duration,
}

impl WindowReport {
    /// The `result` label of `chd_probe_runs_total`.
    pub fn result(&self) -> &'static str {
        match (self.end, self.measured, self.errors) {
            (WindowEnd::Aborted, _, _) => "aborted",
            (_, 0, e) if e > 0 => "error",
            _ => "ok",
        }
    }
}

/// Run a window on the calling thread (which must be a dedicated, throw-away thread: each
/// cell binds it). `keep_going` is asked before every cell.
pub fn run(
    spec: &WindowSpec,
    backend: &dyn Backend,
    store: &SharedStore,
    metrics: &ProbeMetrics,
    keep_going: &mut dyn FnMut() -> bool,
) -> WindowReport {
    run_affinity_scan(&spec.affinity_cpus, store, metrics);

    let started = Instant::now();
    let mut report = WindowReport {
        measured: 0,
        errors: 0,
        end: WindowEnd::Completed,
        elapsed: Duration::ZERO,
    };
    for cell in &spec.cells {
        if started.elapsed() >= spec.budget {
            report.end = WindowEnd::BudgetSpent;
            break;
        }
        if !keep_going() {
            report.end = WindowEnd::Aborted;
            break;
        }
        let result = h2d::measure_cell(backend, cell, spec.warmup, spec.iterations);
        let at = unix_now();
        let mut store = store.write().unwrap_or_else(|p| p.into_inner());
        match result {
            Ok(bytes_per_second) => {
                store.record_sample(
                    cell.clone(),
                    Sample {
                        bytes_per_second,
                        at,
                    },
                    spec.keep,
                );
                report.measured += 1;
            }
            Err(e) => {
                tracing::warn!(cpu = cell.cpu, device = %cell.device, size_bytes = cell.size_bytes,
                    direction = cell.direction.as_str(), "cell failed: {e}");
                store.record_error(cell.clone(), at);
                metrics.error("h2d", &cell.device, e.reason());
                report.errors += 1;
            }
        }
    }
    report.elapsed = started.elapsed();
    if report.measured > 0 {
        store
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .record_success("h2d", unix_now());
    }
    metrics.run("h2d", report.result());
    metrics.observe_duration("h2d", report.elapsed.as_secs_f64());
    report
}

fn run_affinity_scan(cpus: &[u32], store: &SharedStore, metrics: &ProbeMetrics) {
    if cpus.is_empty() {
        return;
    }
    let started = Instant::now();
    let results = affinity::probe_bindable(cpus);
    let at = unix_now();
    {
        let mut s = store.write().unwrap_or_else(|p| p.into_inner());
        s.record_bindable(&results, at);
        s.record_success("affinity", at);
    }
    let unbindable: Vec<u32> = results.iter().filter(|r| !r.1).map(|r| r.0).collect();
    if !unbindable.is_empty() {
        tracing::warn!("CPUs that cannot be bound: {unbindable:?}");
    }
    metrics.run("affinity", "ok");
    metrics.observe_duration("affinity", started.elapsed().as_secs_f64());
}
