//! The loop every kind of probe window runs over its planned cells, and its end-of-window
//! bookkeeping, written once: cells in order until the time budget is spent or the idle gate
//! closes; a sample far below the typical cell is held back and re-measured at the end of
//! the window, in reverse order of discovery, and counts only if the re-measurement is slow
//! too (the seed's first-device-after-a-fresh-buffer artefact).

use std::time::{Duration, Instant};

use super::metrics::ProbeMetrics;
use crate::store::{unix_now, SharedStore};

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

/// Most suspects re-measured in one window.
pub const MAX_RECHECKS: usize = 16;

/// What one kind of cell does inside the loop.
pub trait Cells {
    type Key;
    /// Measure one cell; a failure is recorded (store, metrics, log) here and gives `None`.
    fn measure(&mut self, key: &Self::Key) -> Option<f64>;
    /// Whether a first sample must be confirmed before it counts.
    fn is_suspect(&self, key: &Self::Key, value: f64) -> bool;
    /// Whether a re-measurement confirms the suspect.
    fn is_slow(&self, key: &Self::Key, value: f64) -> bool;
    /// Store the values of one cell.
    fn record(&mut self, key: &Self::Key, values: &[f64]);
    /// A suspect the re-measurement did not confirm (for the log).
    fn rejected(&self, _key: &Self::Key, _first: f64, _second: f64) {}
}

/// Run `keys` through `cells` for at most `budget`, asking `keep_going` before every cell.
pub fn run<C: Cells>(
    probe: &'static str,
    keys: &[C::Key],
    budget: Duration,
    cells: &mut C,
    metrics: &ProbeMetrics,
    keep_going: &mut dyn FnMut() -> bool,
) -> WindowReport {
    let started = Instant::now();
    let mut report = WindowReport {
        measured: 0,
        errors: 0,
        end: WindowEnd::Completed,
        elapsed: Duration::ZERO,
    };
    let mut suspects: Vec<(&C::Key, f64)> = Vec::new();
    for key in keys {
        if started.elapsed() >= budget {
            report.end = WindowEnd::BudgetSpent;
            break;
        }
        if !keep_going() {
            report.end = WindowEnd::Aborted;
            break;
        }
        let Some(value) = cells.measure(key) else {
            report.errors += 1;
            continue;
        };
        if suspects.len() < MAX_RECHECKS && cells.is_suspect(key, value) {
            suspects.push((key, value));
        } else {
            cells.record(key, &[value]);
            report.measured += 1;
        }
    }
    for (key, first) in suspects.into_iter().rev() {
        if report.end == WindowEnd::Aborted || !keep_going() {
            report.end = WindowEnd::Aborted;
            break;
        }
        let Some(second) = cells.measure(key) else {
            report.errors += 1;
            continue;
        };
        if cells.is_slow(key, second) {
            metrics.recheck(probe, "confirmed");
            cells.record(key, &[first, second]);
        } else {
            cells.rejected(key, first, second);
            metrics.recheck(probe, "rejected");
            cells.record(key, &[second]);
        }
        report.measured += 1;
    }
    report.elapsed = started.elapsed();
    report
}

/// The end of a window of `probe`: its success time when it measured anything, its run
/// outcome and duration.
pub fn finish(
    probe: &'static str,
    mut report: WindowReport,
    elapsed: Duration,
    store: &SharedStore,
    metrics: &ProbeMetrics,
) -> WindowReport {
    report.elapsed = elapsed;
    if report.measured > 0 {
        store
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .record_success(probe, unix_now());
    }
    metrics.run(probe, report.result());
    metrics.observe_duration(probe, elapsed.as_secs_f64());
    report
}
