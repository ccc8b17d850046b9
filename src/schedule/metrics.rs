//! Live probe-health metrics that the prober increments as it works (runs, errors, window
//! outcomes, window durations, failed state saves), registered in the prometheus-client
//! registry.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::format::state_file::SAVE_ERROR_REASONS;

/// `probe` names.
pub const PROBES: [&str; 5] = ["h2d", "pair", "d2d", "p2p", "affinity"];
/// `result` of `chd_probe_runs_total`.
pub const RUN_RESULTS: [&str; 3] = ["ok", "error", "aborted"];
/// `outcome` of `chd_idle_windows_total`.
pub const IDLE_OUTCOMES: [&str; 5] = [
    "probed",
    "device_busy",
    "cpu_busy",
    "gate_error",
    "disabled",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RunLabels {
    pub probe: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub probe: String,
    pub device: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RecheckLabels {
    pub probe: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabels {
    pub probe: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeviceLabels {
    pub device: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemoryLabels {
    pub memory: String,
}

/// `memory` of `chd_leaked_memory_bytes`.
pub const LEAKED_MEMORY: [&str; 2] = ["device", "host"];

fn duration_histogram() -> Histogram {
    Histogram::new([
        0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0,
    ])
}

/// Counters and histograms the prober updates.
#[derive(Debug, Clone)]
pub struct ProbeMetrics {
    pub runs: Family<RunLabels, Counter>,
    pub errors: Family<ErrorLabels, Counter>,
    pub idle_windows: Family<OutcomeLabels, Counter>,
    pub duration: Family<ProbeLabels, Histogram, fn() -> Histogram>,
    pub rechecks: Family<RecheckLabels, Counter>,
    /// Host memory the copy probe holds for its cell group in flight (0 between windows).
    pub held_host_memory: Gauge,
    /// Saves of `state.json` that failed, by reason.
    pub state_save_errors: Family<ReasonLabels, Counter>,
    /// Devices quarantined now (their copy cells' work did not finish in time): 1, and no
    /// series for the others.
    pub quarantined: Family<DeviceLabels, Gauge>,
    /// The devices `quarantined` has a series for.
    quarantined_now: std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
    /// Memory kept (leaked) under work that did not finish, by memory.
    pub leaked_memory: Family<MemoryLabels, Gauge>,
}

impl Default for ProbeMetrics {
    fn default() -> Self {
        ProbeMetrics {
            runs: Family::default(),
            errors: Family::default(),
            idle_windows: Family::default(),
            duration: Family::new_with_constructor(duration_histogram),
            rechecks: Family::default(),
            held_host_memory: Gauge::default(),
            state_save_errors: Family::default(),
            quarantined: Family::default(),
            quarantined_now: Default::default(),
            leaked_memory: Family::default(),
        }
    }
}

impl ProbeMetrics {
    /// Create the metrics with every bounded label combination at zero (so `increase()`
    /// sees the first event) and register them.
    pub fn register(registry: &mut Registry) -> ProbeMetrics {
        let m = ProbeMetrics::default();
        for probe in PROBES {
            for result in RUN_RESULTS {
                let _ = m.runs.get_or_create(&RunLabels {
                    probe: probe.into(),
                    result: result.into(),
                });
            }
            let _ = m.duration.get_or_create(&ProbeLabels {
                probe: probe.into(),
            });
        }
        for outcome in IDLE_OUTCOMES {
            let _ = m.idle_windows.get_or_create(&OutcomeLabels {
                outcome: outcome.into(),
            });
        }
        registry.register(
            "chd_probe_runs",
            "Probe windows run, by result (aborted: the idle gate closed mid-window)",
            m.runs.clone(),
        );
        registry.register(
            "chd_probe_errors",
            "Cells that failed to measure, by device and reason",
            m.errors.clone(),
        );
        registry.register(
            "chd_idle_windows",
            "Scheduler ticks, by whether a window probed or why it did not",
            m.idle_windows.clone(),
        );
        for probe in ["h2d", "pair"] {
            for outcome in ["confirmed", "rejected"] {
                let _ = m.rechecks.get_or_create(&RecheckLabels {
                    probe: probe.into(),
                    outcome: outcome.into(),
                });
            }
        }
        registry.register(
            "chd_probe_rechecks",
            "Slow samples re-measured in another order: confirmed (recorded) or rejected (dropped)",
            m.rechecks.clone(),
        );
        registry.register(
            "chd_probe_duration_seconds",
            "Wall time of probe windows",
            m.duration.clone(),
        );
        registry.register(
            "chd_held_host_memory_bytes",
            "Host memory the copy probe holds for the cell group it is measuring (pinned on \
             accelerators); 0 between windows",
            m.held_host_memory.clone(),
        );
        for reason in SAVE_ERROR_REASONS {
            let _ = m.state_save_errors.get_or_create(&ReasonLabels {
                reason: reason.into(),
            });
        }
        registry.register(
            "chd_device_quarantined",
            "1 for each device quarantined: a copy cell's work on it did not finish within \
             probe.cell_timeout, so it gets no cells until that work finishes",
            m.quarantined.clone(),
        );
        for memory in LEAKED_MEMORY {
            let _ = m.leaked_memory.get_or_create(&MemoryLabels {
                memory: memory.into(),
            });
        }
        registry.register(
            "chd_leaked_memory_bytes",
            "Memory chd keeps allocated under device work that did not finish (never freed \
             under a DMA that may still run), by memory (device, host); freed when the work \
             finishes",
            m.leaked_memory.clone(),
        );
        registry.register(
            "chd_state_save_errors",
            "Saves of the state file that failed (read_only, no_space, permission, other); \
             the matrix stays in memory and the next save that succeeds writes all of it",
            m.state_save_errors.clone(),
        );
        m
    }

    pub fn state_save_error(&self, reason: &str) {
        self.state_save_errors
            .get_or_create(&ReasonLabels {
                reason: reason.into(),
            })
            .inc();
    }

    pub fn run(&self, probe: &str, result: &str) {
        self.runs
            .get_or_create(&RunLabels {
                probe: probe.into(),
                result: result.into(),
            })
            .inc();
    }

    pub fn error(&self, probe: &str, device: &str, reason: &str) {
        self.errors
            .get_or_create(&ErrorLabels {
                probe: probe.into(),
                device: device.into(),
                reason: reason.into(),
            })
            .inc();
    }

    pub fn idle_window(&self, outcome: &str) {
        self.idle_windows
            .get_or_create(&OutcomeLabels {
                outcome: outcome.into(),
            })
            .inc();
    }

    pub fn recheck(&self, probe: &str, outcome: &str) {
        self.rechecks
            .get_or_create(&RecheckLabels {
                probe: probe.into(),
                outcome: outcome.into(),
            })
            .inc();
    }

    /// Export `devices` as the quarantined ones (series of the others removed) and the
    /// memory leaked under their work.
    pub fn quarantine(
        &self,
        devices: &std::collections::BTreeSet<String>,
        (device_bytes, host_bytes): (u64, u64),
    ) {
        let mut now = self
            .quarantined_now
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for gone in now.difference(devices) {
            self.quarantined.remove(&DeviceLabels {
                device: gone.clone(),
            });
        }
        for d in devices {
            self.quarantined
                .get_or_create(&DeviceLabels { device: d.clone() })
                .set(1);
        }
        *now = devices.clone();
        for (memory, bytes) in [("device", device_bytes), ("host", host_bytes)] {
            self.leaked_memory
                .get_or_create(&MemoryLabels {
                    memory: memory.into(),
                })
                .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
    }

    pub fn observe_duration(&self, probe: &str, seconds: f64) {
        self.duration
            .get_or_create(&ProbeLabels {
                probe: probe.into(),
            })
            .observe(seconds);
    }
}
