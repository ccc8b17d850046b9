//! The scheduler: a tick loop that opens a probe window right at start and then every
//! interval when the idle gate allows, runs it on a dedicated thread, and persists the store
//! after it ([`state_saver`]: a failed save is counted and probing goes on). Ticks that do
//! not probe are counted with the reason.
//!
//! Duty cycle: with the defaults (a 2 s window budget every 60 s) probing uses at most
//! 2/60 = 3.3 % of one core, plus the cell in flight when the budget runs out.

pub mod background_write;
pub mod cell_loop;
pub mod d2d_window;
pub mod gate;
pub mod metrics;
pub mod p2p_window;
pub mod pair_window;
pub mod planner;
pub mod quarantine;
pub mod settings;
pub mod single_cell;
pub mod state_saver;
pub mod verdict;
pub mod window;

use crate::analysis::fabric::summarize;
use crate::format::fabric::KEEP_PER_PEER;
use crate::format::fabric_dir::FabricDir;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::runtime::pair::{PairParams, PairProbe};
use crate::runtime::telemetry::DeviceTelemetry;
use crate::runtime::Backend;
use crate::store::{CellKey, D2dKey, P2pKey, SharedStore, Store};
use crate::topology::pci_link::DeviceLinks;
use crate::topology::{Roots, Topology};
use crate::vocab::{DevicePair, HostMemory};
use d2d_window::{D2dCell, D2dWindowSpec};
use gate::{Closed, CpuGate, CpuTimes};
use metrics::ProbeMetrics;
use p2p_window::{P2pCell, P2pWindowSpec};
use pair_window::PairWindowSpec;
use settings::{ProbeConfig, ScheduleConfig};
use state_saver::StateSaver;
use verdict::{NfdFile, NfdPublisher, NodeVerdict, SharedVerdict, VerdictTracker};
use window::{WindowReport, WindowSpec};

use crate::analysis::verdict::{causes_of_store, Observed};
use crate::collect::NameFilter;

/// How often a window re-checks the idle gate between cells.
const GATE_RECHECK: Duration = Duration::from_millis(500);

/// Everything the probe loop needs.
pub struct Scheduler {
    /// Where sysfs and procfs are.
    pub roots: Roots,
    pub schedule: ScheduleConfig,
    pub probe: ProbeConfig,
    /// Host side of copy cells.
    pub host_memory: HostMemory,
    pub topology: Arc<Topology>,
    pub backend: Arc<dyn Backend>,
    pub store: SharedStore,
    pub metrics: ProbeMetrics,
    pub state_dir: PathBuf,
    /// The cells this node measures (allowed CPUs x devices x sizes x directions).
    pub universe: Arc<Vec<CellKey>>,
    /// CPUs the affinity probe checks.
    pub affinity_cpus: Arc<Vec<u32>>,
    /// Device utilization and processes, for the device half of the idle gate.
    pub telemetry: Arc<dyn DeviceTelemetry>,
    /// Core-pair probe and the pair labels it measures (empty: no pair probe).
    pub pair_probe: Option<Arc<dyn PairProbe>>,
    pub pairs: Vec<DevicePair>,
    /// The node's verdict, held steady across windows (shared with the exposition).
    pub verdict: SharedVerdict,
    /// The NFD feature file the verdict is written to at every tick, if any.
    pub nfd: Option<NfdFile>,
    /// The HCAs whose ports count in the verdict (the rdma collector's filter).
    pub hcas: NameFilter,
    /// Each ordered device pair's PCIe path class (`SRC>DST` -> `PIX` ...), read once at
    /// start: the verdict judges a peer copy against its class.
    pub p2p_paths: std::collections::BTreeMap<String, String>,
    /// Each device's same-device copy limit: a device above it is implausible, not judged.
    pub d2d_limits: crate::analysis::limits::PathLimits,
}

/// Pair cells planned per pair and window (the budget decides how many run).
const PAIR_CELLS_PER_WINDOW: usize = 64;

impl Scheduler {
    /// Run until `shutdown` turns true; the window in flight stops at its next cell and the
    /// store is saved before returning.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let stopping = Arc::new(AtomicBool::new(false));
        let gate = CpuGate::new(&self.roots.procfs, self.schedule.cpu_busy_threshold);
        if !self.schedule.enabled {
            tracing::info!(
                "probing disabled: every tick counts as disabled, the idle gate is not read"
            );
        }
        let mut saver = StateSaver::new(
            self.state_dir.clone(),
            self.store.clone(),
            self.metrics.clone(),
        );
        let mut previous = self.schedule.enabled.then(|| gate.sample().ok()).flatten();
        let mut first = true;
        let mut tracker = VerdictTracker::new(
            self.schedule.verdict_confirm_windows,
            self.schedule.verdict_clear_windows,
        );
        let mut nfd = self.nfd.clone().map(NfdPublisher::new);
        let fabric = FabricDir::of_state_dir(&self.state_dir);
        loop {
            if !first {
                tokio::select! {
                    _ = tokio::time::sleep(self.schedule.interval) => {}
                    // wait_for looks at the current value first: a stop seen mid-window counts.
                    _ = shutdown.wait_for(|stop| *stop) => {}
                }
            }
            if *shutdown.borrow() {
                break;
            }
            if !self.schedule.enabled {
                // No windows: what the store holds stands for every tick.
                self.judge(&mut tracker, &fabric);
                self.publish(nfd.as_mut());
                self.metrics.idle_window("disabled");
                first = false;
                continue;
            }
            let now = gate.sample();
            let verdict = gate.check(first, previous.as_ref(), &now).and_then(|()| {
                gate::check_devices(&*self.telemetry, self.schedule.device_busy_threshold)
            });
            first = false;
            previous = now.ok();
            if let Err(closed) = verdict {
                match &closed {
                    Closed::Unreadable(_) => tracing::warn!("skipping probe window: {closed}"),
                    _ => tracing::info!("skipping probe window: {closed}"),
                }
                self.metrics.idle_window(closed.outcome());
                // A skipped window is no evidence: the verdict stands, its labels are renewed.
                self.publish(nfd.as_mut());
                continue;
            }

            let report = self.run_window(&gate, &stopping, &mut shutdown).await;
            self.metrics.idle_window("probed");
            tracing::info!(
                measured = report.measured,
                errors = report.errors,
                end = ?report.end,
                elapsed_ms = report.elapsed.as_millis() as u64,
                "probe window done"
            );
            saver.save(false).await;
            self.judge(&mut tracker, &fabric);
            self.publish(nfd.as_mut());
            previous = gate.sample().ok();
        }
        saver.save(true).await;
    }

    /// One window's findings into the verdict, with the fabric's rails as the state
    /// directory's fabric results give them now.
    fn judge(&self, tracker: &mut VerdictTracker, fabric: &FabricDir) {
        let numa = crate::analysis::live::numa_map(&self.topology);
        let fabric_rails = match fabric.list() {
            Ok(listing) => summarize(&listing.records, KEEP_PER_PEER).rails,
            Err(e) => {
                tracing::warn!("the verdict goes without the fabric results: {e}");
                Vec::new()
            }
        };
        let observed = Observed {
            fabric_rails,
            d2d_limits: self.d2d_limits.clone(),
            p2p_paths: self.p2p_paths.clone(),
            hung_devices: self.backend.stuck().devices.into_iter().collect(),
            rdma_down: crate::collect::rdma::ports_not_active(&self.roots.sysfs, &self.hcas),
            lost_devices: self
                .telemetry
                .sample()
                .into_iter()
                .filter(|s| s.lost)
                .map(|s| s.device)
                .collect(),
        };
        let (found, best_numa) = {
            let store = self.store.read().unwrap_or_else(|p| p.into_inner());
            causes_of_store(&store, &numa, &self.pairs, &observed)
        };
        let named = tracker.observe(found);
        let next = NodeVerdict::immediate(named, best_numa);
        let mut shared = self.verdict.write().unwrap_or_else(|p| p.into_inner());
        if shared.level != next.level {
            tracing::info!("node verdict {} -> {}", shared.level, next.line());
        }
        *shared = verdict::hold(
            &shared,
            next,
            tracker.settled(),
            std::time::SystemTime::now(),
        );
    }

    /// Write the verdict's NFD labels, if configured, without waiting for the write.
    fn publish(&self, nfd: Option<&mut NfdPublisher>) {
        let Some(nfd) = nfd else { return };
        let verdict = self
            .verdict
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        nfd.publish(verdict);
    }

    /// One same-device copy cell per device (`probe.d2d_size_mib`; none when it is 0), each
    /// from a CPU of `probe.cpus` on the device's NUMA node (else the first of them), in a
    /// fresh random order every window (so a budget that runs out does not always leave out
    /// the same device).
    fn d2d_cells<R: rand::Rng + ?Sized>(&self, rng: &mut R) -> Vec<D2dCell> {
        use rand::seq::SliceRandom;
        if self.probe.d2d_size_bytes == 0 {
            return Vec::new();
        }
        let mut cells: Vec<D2dCell> = self
            .backend
            .devices()
            .iter()
            .filter_map(|d| {
                Some(D2dCell {
                    key: D2dKey {
                        device: d.id.clone(),
                        size_bytes: self.probe.d2d_size_bytes,
                    },
                    cpu: self.topology.cpu_near(d.numa_node, &self.affinity_cpus)?,
                })
            })
            .collect();
        cells.shuffle(rng);
        cells
    }

    /// The window's one ordered peer copy cell (`probe.p2p_size_mib`; none when it is 0, on
    /// the host backend, or with fewer than two devices): see [`next_p2p_pair`].
    fn p2p_cell<R: rand::Rng + ?Sized>(&self, store: &Store, rng: &mut R) -> Option<P2pCell> {
        if self.probe.p2p_size_bytes == 0 || !self.backend.capabilities().peer_copies {
            return None;
        }
        let devices = self.backend.devices();
        // A quarantined device's pairs wait for it (they would be skipped, and so tried first
        // again and again).
        let quarantined = self.backend.stuck().devices;
        let usable = devices
            .iter()
            .map(|d| d.id.as_str())
            .filter(|d| !quarantined.contains(*d));
        let key = next_p2p_pair(usable, store, rng)?;
        let numa_node = devices
            .iter()
            .find(|d| d.id == key.src())
            .and_then(|d| d.numa_node);
        Some(P2pCell {
            cpu: self.topology.cpu_near(numa_node, &self.affinity_cpus)?,
            key,
            size_bytes: self.probe.p2p_size_bytes,
        })
    }

    async fn run_window(
        &self,
        gate: &CpuGate,
        stopping: &Arc<AtomicBool>,
        shutdown: &mut watch::Receiver<bool>,
    ) -> WindowReport {
        let budget = self.schedule.window_budget;
        // With a pair probe, copy cells and pair cells share the budget half and half.
        let (h2d_budget, pair_budget) = match self.pair_probe {
            Some(_) if !self.pairs.is_empty() => (budget / 2, budget / 2),
            _ => (budget, Duration::ZERO),
        };
        let (spec, pair_spec) = {
            let store = self.store.read().unwrap_or_else(|p| p.into_inner());
            let topology = &self.topology;
            let numa_of = |cpu| topology.cpu(cpu).and_then(|c| c.numa_node);
            let mut rng = rand::rng();
            let cells = planner::plan(&self.universe, &store, numa_of, &mut rng);
            let pair_spec = self
                .pair_probe
                .as_ref()
                .filter(|_| !pair_budget.is_zero())
                .map(|probe| {
                    let per_pair = self
                        .pairs
                        .iter()
                        .map(|pair| {
                            planner::plan_pairs(
                                pair,
                                &self.affinity_cpus,
                                &store,
                                numa_of,
                                PAIR_CELLS_PER_WINDOW,
                                &mut rng,
                            )
                        })
                        .collect();
                    let cells = planner::order_pair_cells(per_pair, &store);
                    PairWindowSpec {
                        cells,
                        probe: probe.clone(),
                        params: PairParams {
                            bytes_per_rank: self.probe.pair_size_bytes,
                            warmup: self.probe.warmup,
                            iterations: self.probe.iterations,
                            timeout: self.probe.pair_timeout,
                        },
                        budget: pair_budget,
                        keep: self.probe.samples_per_cell,
                    }
                });
            let spec = WindowSpec {
                cells,
                affinity_cpus: self.affinity_cpus.to_vec(),
                budget: h2d_budget,
                warmup: self.probe.warmup,
                iterations: self.probe.iterations,
                host_memory: self.host_memory,
                keep: self.probe.samples_per_cell,
                links: DeviceLinks::new(
                    &self.roots.sysfs,
                    self.backend
                        .devices()
                        .iter()
                        .map(|d| (d.id.as_str(), d.pci_bus_id.as_str())),
                ),
                d2d: D2dWindowSpec {
                    cells: self.d2d_cells(&mut rng),
                    warmup: self.probe.warmup,
                    iterations: self.probe.iterations,
                    keep: self.probe.samples_per_cell,
                },
                p2p: P2pWindowSpec {
                    cells: self.p2p_cell(&store, &mut rng).into_iter().collect(),
                    warmup: self.probe.warmup,
                    iterations: self.probe.iterations,
                    keep: self.probe.samples_per_cell,
                },
            };
            (spec, pair_spec)
        };
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let backend = self.backend.clone();
        let store = self.store.clone();
        let metrics = self.metrics.clone();
        let gate = gate.clone();
        let telemetry = self.telemetry.clone();
        let device_threshold = self.schedule.device_busy_threshold;
        let thread_stopping = stopping.clone();
        // A dedicated thread per window: affinity set here can never leak into tokio's pool.
        let spawned = std::thread::Builder::new()
            .name("chd-probe".into())
            .spawn(move || {
                let mut checker = GateChecker::new(gate, telemetry, device_threshold);
                let mut keep_going =
                    || !thread_stopping.load(Ordering::SeqCst) && checker.still_open();
                let mut report = window::run(&spec, &*backend, &store, &metrics, &mut keep_going);
                if let Some(pair_spec) =
                    pair_spec.filter(|_| report.end != window::WindowEnd::Aborted)
                {
                    let pairs = pair_window::run(&pair_spec, &store, &metrics, &mut keep_going);
                    report.measured += pairs.measured;
                    report.errors += pairs.errors;
                    report.elapsed += pairs.elapsed;
                    if pairs.end == window::WindowEnd::Aborted {
                        report.end = window::WindowEnd::Aborted;
                    }
                }
                let _ = done_tx.send(report);
            });
        if let Err(e) = spawned {
            tracing::error!("cannot start probe thread: {e}");
            self.metrics.run("h2d", "error");
            return WindowReport {
                measured: 0,
                errors: 0,
                end: window::WindowEnd::Aborted,
                elapsed: Duration::ZERO,
            };
        }
        tokio::pin!(done_rx);
        loop {
            tokio::select! {
                report = &mut done_rx => {
                    return report.unwrap_or(WindowReport {
                        measured: 0,
                        errors: 0,
                        end: window::WindowEnd::Aborted,
                        elapsed: Duration::ZERO,
                    });
                }
                _ = shutdown.wait_for(|stop| *stop), if !stopping.load(Ordering::SeqCst) => {
                    stopping.store(true, Ordering::SeqCst);
                    // A copy cell waiting on a hung device gives up at once (its memory is
                    // kept): the exit does not wait for its deadline.
                    crate::runtime::stuck_work::interrupt_waits();
                    // A pair cell in flight may wait on a hung collective for its whole
                    // timeout (30 s by default): give it up now.
                    if let Some(probe) = &self.pair_probe {
                        probe.stop();
                    }
                }
            }
        }
    }
}

/// The ordered device pair (`src != dst`) a window measures: the least recently attempted
/// (one never tried first), ties broken at random, so every pair of an N-device node is
/// measured once in N x (N - 1) windows and a failing pair does not starve the others.
/// `None` with fewer than two devices.
pub fn next_p2p_pair<'a, R: rand::Rng + ?Sized>(
    devices: impl Iterator<Item = &'a str> + Clone,
    store: &Store,
    rng: &mut R,
) -> Option<P2pKey> {
    use rand::seq::SliceRandom;
    let mut pairs: Vec<P2pKey> = devices
        .clone()
        .flat_map(|src| {
            devices.clone().filter_map(move |dst| {
                let id = |d: &str| d.parse().ok();
                P2pKey::new(id(src)?, id(dst)?).ok()
            })
        })
        .collect();
    pairs.shuffle(rng);
    let last_attempt = |k: &P2pKey| {
        store
            .p2p()
            .get(k)
            .map_or(f64::NEG_INFINITY, |c| c.last_attempt)
    };
    // `min_by` keeps the first of equal minima: after the shuffle, a random one.
    pairs
        .into_iter()
        .min_by(|a, b| last_attempt(a).total_cmp(&last_attempt(b)))
}

/// Re-checks the gate (CPU and devices) at most every [`GATE_RECHECK`] during a window.
struct GateChecker {
    gate: CpuGate,
    telemetry: Arc<dyn DeviceTelemetry>,
    device_threshold: f64,
    checked_at: Instant,
    last_cpu: Option<CpuTimes>,
}

impl GateChecker {
    fn new(
        gate: CpuGate,
        telemetry: Arc<dyn DeviceTelemetry>,
        device_threshold: f64,
    ) -> GateChecker {
        let last_cpu = gate.sample().ok();
        GateChecker {
            gate,
            telemetry,
            device_threshold,
            checked_at: Instant::now(),
            last_cpu,
        }
    }

    fn still_open(&mut self) -> bool {
        if self.checked_at.elapsed() < GATE_RECHECK {
            return true;
        }
        self.checked_at = Instant::now();
        let now = self.gate.sample();
        let verdict = self
            .gate
            .check(false, self.last_cpu.as_ref(), &now)
            .and_then(|()| gate::check_devices(&*self.telemetry, self.device_threshold));
        self.last_cpu = now.ok();
        match verdict {
            Ok(()) => true,
            Err(closed) => {
                tracing::info!("idle gate closed mid-window ({closed}); stopping it");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Sample;
    use rand::SeedableRng;

    #[test]
    fn p2p_pairs_go_least_recently_attempted_first_and_cover_every_ordered_pair() {
        let devices = ["0", "1", "2"];
        let mut store = Store::default();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut seen = std::collections::BTreeSet::new();
        for window in 0..6 {
            let next = next_p2p_pair(devices.iter().copied(), &store, &mut rng).unwrap();
            assert_ne!(next.src(), next.dst());
            assert!(
                seen.insert(next.clone()),
                "{next:?} again in window {window}"
            );
            // Attempts alternate between a sample and an error: both count as attempts.
            if window % 2 == 0 {
                let sample = Sample {
                    bytes_per_second: 1e9,
                    at: f64::from(window),
                };
                store.record_sample(next, sample, 5);
            } else {
                store.record_error(next, f64::from(window));
            }
        }
        assert_eq!(seen.len(), 6);
        // Every pair tried once: the oldest attempt goes next.
        let next = next_p2p_pair(devices.iter().copied(), &store, &mut rng).unwrap();
        let oldest = store
            .p2p()
            .iter()
            .min_by(|a, b| a.1.last_attempt.total_cmp(&b.1.last_attempt))
            .unwrap()
            .0;
        assert_eq!(&next, oldest);
    }

    #[test]
    fn p2p_ties_are_broken_at_random() {
        let devices = ["0", "1", "2", "3"];
        let store = Store::default();
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let firsts: std::collections::BTreeSet<P2pKey> = (0..64)
            .map(|_| next_p2p_pair(devices.iter().copied(), &store, &mut rng).unwrap())
            .collect();
        assert!(firsts.len() > 4, "{firsts:?}");
        assert!(firsts.iter().all(|p| p.src() != p.dst()));
    }

    #[test]
    fn no_p2p_pair_without_two_devices() {
        let store = Store::default();
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        assert_eq!(next_p2p_pair(["0"].into_iter(), &store, &mut rng), None);
        assert_eq!(next_p2p_pair([].into_iter(), &store, &mut rng), None);
    }
}
