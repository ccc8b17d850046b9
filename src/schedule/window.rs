//! One probe window, run on a dedicated thread: an affinity scan of the CPUs, then the
//! planned copy cells until the time budget is spent, the idle gate closes, or chd is
//! shutting down, then each device's same-device copy cell ([`super::d2d_window`]) in what
//! is left of the budget (the copy cells leave it [`D2D_SHARE`]), then one ordered device
//! pair's peer copy cell ([`super::p2p_window`]) in what is left after those (the d2d cells
//! leave it [`P2P_SHARE`] of the budget). Every result goes to the store as soon as it is
//! measured.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use super::cell_loop::{self, Cells};
pub use super::cell_loop::{WindowEnd, WindowReport};
use super::d2d_window::D2dWindowSpec;
use super::metrics::ProbeMetrics;
use super::p2p_window::P2pWindowSpec;
use super::single_cell;
use crate::affinity;
use crate::analysis::suspect::Typical;
use crate::probe::h2d;
use crate::runtime::{Backend, ProbeError};
use crate::store::{unix_now, CellKey, Sample, SharedStore, Store};
use crate::topology::pci_link::DeviceLinks;
use crate::vocab::{Direction, HostMemory};

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
    pub host_memory: HostMemory,
    /// Samples a cell keeps.
    pub keep: usize,
    /// Where each device's PCIe link is read, once per window right after its first
    /// measured cell (the link the copies ran over; an idle GPU lowers its link speed).
    pub links: DeviceLinks,
    /// The same-device copy cells, run after the copy cells (none: the d2d probe is off).
    pub d2d: D2dWindowSpec,
    /// The window's one peer copy cell, run last (none: the p2p probe is off).
    pub p2p: P2pWindowSpec,
}

/// The share of a window's budget the copy cells leave to the same-device copy cells when
/// there are any: one cheap cell per device.
pub const D2D_SHARE: u32 = 8;

/// The share of a window's budget the same-device cells leave to the peer copy cell when
/// there is one (the copy cells leave both together [`D2D_SHARE`]).
pub const P2P_SHARE: u32 = 16;

/// The node's typical H2D cell per (size, direction) at window start: the median of all
/// measured cells' medians (the suspect rule is `analysis::suspect`'s).
pub fn typical_h2d(store: &Store) -> Typical<(u64, Direction)> {
    Typical::of(
        store
            .measured_cells()
            .filter_map(|(key, cell)| Some(((key.size_bytes, key.direction), cell.median()?))),
    )
}

/// The copy cells of one window. Consecutive cells of one CPU and size (the planner puts
/// them together) share one [`h2d::CellGroup`]: one binding and one host buffer for every
/// device of the group. The group is released before the next one is opened, when a cell
/// fails to open it, and when the window ends (the cells are dropped with the window), so
/// no host buffer outlives the window.
struct CopyCells<'a> {
    spec: &'a WindowSpec,
    backend: &'a dyn Backend,
    store: &'a SharedStore,
    metrics: &'a ProbeMetrics,
    typical: Typical<(u64, Direction)>,
    group: Option<h2d::CellGroup<'a>>,
    /// Devices whose link this window has read.
    links_read: BTreeSet<String>,
}

impl<'a> CopyCells<'a> {
    fn measure_in_group(&mut self, cell: &CellKey) -> Result<f64, ProbeError> {
        if !self.group.as_ref().is_some_and(|g| g.serves(cell)) {
            // Free the previous group's buffer before allocating the next one.
            self.release_group();
            self.group = Some(h2d::CellGroup::open(
                self.backend,
                cell,
                self.spec.host_memory,
            )?);
        }
        let group = self.group.as_mut().expect("opened above");
        let value = group.measure(
            cell,
            self.spec.warmup,
            self.spec.iterations,
            self.spec.host_memory,
        );
        let held = i64::try_from(group.pinned_bytes()).unwrap_or(i64::MAX);
        self.metrics.held_host_memory.set(held);
        value
    }

    /// Read `device`'s link once per window, right after a copy to it, outside any timed
    /// region.
    fn read_link(&mut self, device: &str) {
        if self.links_read.contains(device) {
            return;
        }
        self.links_read.insert(device.to_string());
        if let Some(link) = self.spec.links.read(device) {
            self.store
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .record_link(device, link, unix_now());
        }
    }

    /// Drop the group in flight (its binding and host buffer) and say so.
    fn release_group(&mut self) {
        self.group = None;
        self.metrics.held_host_memory.set(0);
    }
}

impl Drop for CopyCells<'_> {
    fn drop(&mut self) {
        self.release_group();
    }
}

impl Cells for CopyCells<'_> {
    type Key = CellKey;

    fn measure(&mut self, cell: &CellKey) -> Option<f64> {
        if super::quarantine::skips(self.backend, &cell.device) {
            return None;
        }
        match self.measure_in_group(cell) {
            Ok(v) => {
                self.read_link(&cell.device);
                Some(v)
            }
            Err(e) => {
                tracing::warn!(cpu = cell.cpu, device = %cell.device, size_bytes = cell.size_bytes,
                    direction = cell.direction.as_str(), "cell failed: {e}");
                self.store
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .record_error(cell.clone(), unix_now());
                self.metrics.error("h2d", &cell.device, e.reason());
                None
            }
        }
    }

    fn is_suspect(&self, cell: &CellKey, value: f64) -> bool {
        let store = self.store.read().unwrap_or_else(|p| p.into_inner());
        let history = store.h2d().get(cell).and_then(|c| c.median());
        self.typical
            .is_suspect(&(cell.size_bytes, cell.direction), value, history)
    }

    fn is_slow(&self, cell: &CellKey, value: f64) -> bool {
        self.typical
            .is_slow(&(cell.size_bytes, cell.direction), value)
    }

    fn record(&mut self, cell: &CellKey, values: &[f64]) {
        let at = unix_now();
        let mut store = self.store.write().unwrap_or_else(|p| p.into_inner());
        for &bytes_per_second in values {
            store.record_sample(
                cell.clone(),
                Sample {
                    bytes_per_second,
                    at,
                },
                self.spec.keep,
            );
        }
    }

    fn rejected(&self, cell: &CellKey, first: f64, second: f64) {
        tracing::info!(cpu = cell.cpu, device = %cell.device,
            "slow sample {first:.3e} B/s not confirmed by re-measurement ({second:.3e} B/s)");
    }
}

/// Run a window on the calling thread (which must be a dedicated, throw-away thread: each
/// cell binds it). `keep_going` is asked before every cell. Suspect samples (see
/// [`crate::analysis::suspect::SUSPECT_RATIO`]) are held back and re-measured at the end of the window, in reverse
/// order of discovery; they are recorded only if the re-measurement is slow too.
pub fn run(
    spec: &WindowSpec,
    backend: &dyn Backend,
    store: &SharedStore,
    metrics: &ProbeMetrics,
    keep_going: &mut dyn FnMut() -> bool,
) -> WindowReport {
    super::quarantine::window_start(backend, metrics);
    run_affinity_scan(&spec.affinity_cpus, store, metrics);
    let mut cells = CopyCells {
        spec,
        backend,
        store,
        metrics,
        typical: typical_h2d(&store.read().unwrap_or_else(|p| p.into_inner())),
        group: None,
        links_read: BTreeSet::new(),
    };
    let has_p2p = !spec.p2p.cells.is_empty();
    let h2d_budget = if spec.d2d.cells.is_empty() && !has_p2p {
        spec.budget
    } else {
        spec.budget - spec.budget / D2D_SHARE
    };
    let report = cell_loop::run(
        "h2d",
        &spec.cells,
        h2d_budget,
        &mut cells,
        metrics,
        keep_going,
    );
    // Release the last group's buffer and binding before the window's bookkeeping (and
    // before any same-device cell allocates).
    drop(cells);
    let elapsed = report.elapsed;
    let mut report = cell_loop::finish("h2d", report, elapsed, store, metrics);
    if !spec.d2d.cells.is_empty() && report.end != WindowEnd::Aborted {
        let reserve = if has_p2p {
            spec.budget / P2P_SHARE
        } else {
            Duration::ZERO
        };
        let left = spec.budget.saturating_sub(report.elapsed + reserve);
        let d2d = single_cell::run(&spec.d2d, left, backend, store, metrics, keep_going);
        add(&mut report, &d2d);
    }
    if has_p2p && report.end != WindowEnd::Aborted {
        let left = spec.budget.saturating_sub(report.elapsed);
        let p2p = single_cell::run(&spec.p2p, left, backend, store, metrics, keep_going);
        add(&mut report, &p2p);
    }
    super::quarantine::export(backend, metrics);
    report
}

/// Fold a later part of the window into the window's report.
fn add(report: &mut WindowReport, part: &WindowReport) {
    report.measured += part.measured;
    report.errors += part.errors;
    report.elapsed += part.elapsed;
    if part.end == WindowEnd::Aborted {
        report.end = WindowEnd::Aborted;
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{CopyParams, DeviceInfo, HostStaging};
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
    use std::sync::{Arc, Mutex, RwLock};

    /// Returns scripted values per device, in order (the window logic under test; the real
    /// runtimes are tested through the fake runtime library).
    struct Scripted {
        devices: Vec<DeviceInfo>,
        values: Mutex<HashMap<String, Vec<f64>>>,
    }

    impl Backend for Scripted {
        fn name(&self) -> &'static str {
            "scripted"
        }
        fn devices(&self) -> &[DeviceInfo] {
            &self.devices
        }
        fn measure_copy(&self, device: &str, _: &CopyParams) -> Result<f64, ProbeError> {
            let mut v = self.values.lock().unwrap();
            let queue = v.get_mut(device).expect("scripted device");
            Ok(queue.remove(0))
        }
    }

    /// Counts the host buffers (stagings) it hands out and the cells each served; each cell
    /// takes `cell_time`; devices named `bad*` fail.
    #[derive(Default)]
    struct Counting {
        opened: AtomicUsize,
        live: AtomicUsize,
        /// (staging number, device) per measured cell, in order.
        cells: Mutex<Vec<(usize, String)>>,
        cell_time: Duration,
    }

    struct CountingStaging<'a> {
        backend: &'a Counting,
        number: usize,
    }

    impl Drop for CountingStaging<'_> {
        fn drop(&mut self) {
            self.backend.live.fetch_sub(1, AtomicOrdering::SeqCst);
        }
    }

    impl HostStaging for CountingStaging<'_> {
        fn measure(&mut self, device: &str, _: &CopyParams) -> Result<f64, ProbeError> {
            std::thread::sleep(self.backend.cell_time);
            self.backend
                .cells
                .lock()
                .unwrap()
                .push((self.number, device.to_string()));
            if device.starts_with("bad") {
                return Err(ProbeError::Copy("planted".into()));
            }
            Ok(58e9)
        }
        fn pinned_bytes(&self) -> u64 {
            1
        }
    }

    impl Backend for Counting {
        fn name(&self) -> &'static str {
            "counting"
        }
        fn devices(&self) -> &[DeviceInfo] {
            &[]
        }
        fn measure_copy(&self, _: &str, _: &CopyParams) -> Result<f64, ProbeError> {
            panic!("a window measures through a staging")
        }
        fn staging(&self, _: &CopyParams) -> Result<Box<dyn HostStaging + '_>, ProbeError> {
            assert_eq!(
                self.live.fetch_add(1, AtomicOrdering::SeqCst),
                0,
                "a second host buffer while one is held"
            );
            Ok(Box::new(CountingStaging {
                backend: self,
                number: self.opened.fetch_add(1, AtomicOrdering::SeqCst),
            }))
        }
    }

    fn spec_of(cells: Vec<CellKey>, budget: Duration) -> WindowSpec {
        WindowSpec {
            cells,
            affinity_cpus: vec![],
            budget,
            warmup: 0,
            iterations: 1,
            host_memory: HostMemory::Pinned,
            keep: 5,
            links: Default::default(),
            d2d: Default::default(),
            p2p: Default::default(),
        }
    }

    fn group_cells(devices: &[&str], sizes: &[u64]) -> Vec<CellKey> {
        let cpu = crate::affinity::current_cpus().unwrap()[0];
        let universe: Vec<CellKey> = sizes
            .iter()
            .flat_map(|&size_bytes| {
                devices.iter().map(move |d| CellKey {
                    cpu,
                    device: d.to_string(),
                    size_bytes,
                    direction: Direction::H2d,
                })
            })
            .collect();
        let mut rng = rand::rng();
        crate::schedule::planner::plan(&universe, &Store::default(), |_| Some(0), &mut rng)
    }

    fn run_counting(
        backend: &Counting,
        spec: &WindowSpec,
        keep_going: &mut dyn FnMut() -> bool,
    ) -> (WindowReport, Store, ProbeMetrics) {
        let shared = Arc::new(RwLock::new(Store::default()));
        let metrics = ProbeMetrics::default();
        let report = run(spec, backend, &shared, &metrics, keep_going);
        let store = shared.read().unwrap().clone();
        (report, store, metrics)
    }

    #[test]
    fn one_host_buffer_serves_every_device_of_a_group() {
        let backend = Counting::default();
        let spec = spec_of(
            group_cells(&["0", "1", "2", "3"], &[1 << 20]),
            Duration::from_secs(60),
        );
        let (report, store, _) = run_counting(&backend, &spec, &mut || true);
        assert_eq!(report.end, WindowEnd::Completed);
        assert_eq!(report.measured, 4);
        assert_eq!(backend.opened.load(AtomicOrdering::SeqCst), 1);
        assert_eq!(backend.live.load(AtomicOrdering::SeqCst), 0, "released");
        assert_eq!(store.measured_cells().count(), 4);
    }

    #[test]
    fn each_size_gets_its_own_buffer_and_none_outlives_the_window() {
        let backend = Counting::default();
        let spec = spec_of(
            group_cells(&["0", "1", "2"], &[1 << 20, 4 << 20, 16 << 20]),
            Duration::from_secs(60),
        );
        let (report, _, _) = run_counting(&backend, &spec, &mut || true);
        assert_eq!(report.measured, 9);
        assert_eq!(backend.opened.load(AtomicOrdering::SeqCst), 3);
        assert_eq!(backend.live.load(AtomicOrdering::SeqCst), 0);
        let cells = backend.cells.lock().unwrap();
        for staging in 0..3 {
            assert_eq!(cells.iter().filter(|(n, _)| *n == staging).count(), 3);
        }
    }

    #[test]
    fn a_failing_device_costs_only_its_cell() {
        let backend = Counting::default();
        let spec = spec_of(
            group_cells(&["0", "bad1", "2", "3"], &[1 << 20]),
            Duration::from_secs(60),
        );
        let (report, store, m) = run_counting(&backend, &spec, &mut || true);
        assert_eq!((report.measured, report.errors), (3, 1));
        assert_eq!(backend.opened.load(AtomicOrdering::SeqCst), 1);
        assert_eq!(store.measured_cells().count(), 3);
        let errors = m
            .errors
            .get_or_create(&crate::schedule::metrics::ErrorLabels {
                probe: "h2d".into(),
                device: "bad1".into(),
                reason: "copy".into(),
            })
            .get();
        assert_eq!(errors, 1);
    }

    #[test]
    fn the_gate_is_asked_between_the_cells_of_a_group() {
        let backend = Counting::default();
        let spec = spec_of(
            group_cells(&["0", "1", "2", "3", "4", "5"], &[1 << 20]),
            Duration::from_secs(60),
        );
        let mut asked = 0;
        let (report, _, _) = run_counting(&backend, &spec, &mut || {
            asked += 1;
            asked <= 2
        });
        assert_eq!(report.end, WindowEnd::Aborted);
        assert_eq!(report.measured, 2);
        assert_eq!(backend.cells.lock().unwrap().len(), 2);
        assert_eq!(backend.live.load(AtomicOrdering::SeqCst), 0);
    }

    #[test]
    fn the_budget_ends_a_group_within_one_cell() {
        let cell_time = Duration::from_millis(20);
        let backend = Counting {
            cell_time,
            ..Counting::default()
        };
        let budget = Duration::from_millis(50);
        let spec = spec_of(
            group_cells(&["0", "1", "2", "3", "4", "5", "6", "7"], &[1 << 20]),
            budget,
        );
        let (report, _, _) = run_counting(&backend, &spec, &mut || true);
        assert_eq!(report.end, WindowEnd::BudgetSpent);
        // Cells start only while the budget lasts: at most one cell past it.
        let ran = backend.cells.lock().unwrap().len() as u32;
        assert!(ran >= 1 && cell_time * (ran - 1) < budget, "{ran} cells");
        assert!(report.measured < 8);
        assert_eq!(backend.live.load(AtomicOrdering::SeqCst), 0);
    }

    fn key(device: &str) -> CellKey {
        CellKey {
            cpu: crate::affinity::current_cpus().unwrap()[0],
            device: device.into(),
            size_bytes: 1 << 20,
            direction: Direction::H2d,
        }
    }

    fn typical_store() -> Store {
        let mut s = Store::default();
        for d in ["a", "b", "c", "d"] {
            s.record_sample(
                key(d),
                Sample {
                    bytes_per_second: 58e9,
                    at: 1.0,
                },
                5,
            );
        }
        s
    }

    fn run_script(store: Store, script: &[(&str, &[f64])]) -> (Store, ProbeMetrics) {
        let backend = Scripted {
            devices: vec![],
            values: Mutex::new(
                script
                    .iter()
                    .map(|(d, v)| (d.to_string(), v.to_vec()))
                    .collect(),
            ),
        };
        let spec = WindowSpec {
            cells: script.iter().map(|(d, _)| key(d)).collect(),
            affinity_cpus: vec![],
            budget: Duration::from_secs(60),
            warmup: 0,
            iterations: 1,
            host_memory: HostMemory::Pinned,
            keep: 5,
            links: Default::default(),
            d2d: Default::default(),
            p2p: Default::default(),
        };
        let shared = Arc::new(RwLock::new(store));
        let metrics = ProbeMetrics::default();
        let report = run(&spec, &backend, &shared, &metrics, &mut || true);
        assert_eq!(report.end, WindowEnd::Completed);
        let store = shared.read().unwrap().clone();
        (store, metrics)
    }

    fn samples(store: &Store, device: &str) -> Vec<f64> {
        store.h2d()[&key(device)]
            .samples
            .iter()
            .map(|s| s.bytes_per_second)
            .collect()
    }

    fn rechecks(m: &ProbeMetrics, outcome: &str) -> u64 {
        m.rechecks
            .get_or_create(&crate::schedule::metrics::RecheckLabels {
                probe: "h2d".into(),
                outcome: outcome.into(),
            })
            .get()
    }

    #[test]
    fn a_slow_sample_not_confirmed_is_dropped() {
        let (store, m) = run_script(typical_store(), &[("x", &[10e9, 57e9]), ("a", &[58e9])]);
        assert_eq!(samples(&store, "x"), vec![57e9]);
        assert_eq!(rechecks(&m, "rejected"), 1);
        assert_eq!(rechecks(&m, "confirmed"), 0);
    }

    #[test]
    fn a_slow_sample_confirmed_counts_twice() {
        let (store, m) = run_script(typical_store(), &[("x", &[10e9, 11e9])]);
        assert_eq!(samples(&store, "x"), vec![10e9, 11e9]);
        assert_eq!(rechecks(&m, "confirmed"), 1);
    }

    #[test]
    fn a_cell_already_known_slow_needs_no_recheck() {
        let mut store = typical_store();
        store.record_sample(
            key("x"),
            Sample {
                bytes_per_second: 12e9,
                at: 1.0,
            },
            5,
        );
        let (store, m) = run_script(store, &[("x", &[11e9])]);
        assert_eq!(samples(&store, "x"), vec![12e9, 11e9]);
        assert_eq!(rechecks(&m, "confirmed") + rechecks(&m, "rejected"), 0);
    }

    #[test]
    fn without_a_typical_value_nothing_is_suspect() {
        let (store, m) = run_script(Store::default(), &[("x", &[1e9]), ("y", &[58e9])]);
        assert_eq!(samples(&store, "x"), vec![1e9]);
        assert_eq!(rechecks(&m, "rejected"), 0);
    }

    /// Logs every measurement in order; each copy cell takes `copy_time`.
    struct Ordered {
        copy_time: Duration,
        log: Mutex<Vec<String>>,
    }

    impl Backend for Ordered {
        fn name(&self) -> &'static str {
            "ordered"
        }
        fn devices(&self) -> &[DeviceInfo] {
            &[]
        }
        fn measure_copy(&self, device: &str, _: &CopyParams) -> Result<f64, ProbeError> {
            std::thread::sleep(self.copy_time);
            self.log.lock().unwrap().push(format!("h2d {device}"));
            Ok(50e9)
        }
        fn measure_device_copy(
            &self,
            device: &str,
            _: &crate::runtime::DeviceCopyParams,
        ) -> Result<f64, ProbeError> {
            self.log.lock().unwrap().push(format!("d2d {device}"));
            Ok(400e9)
        }
        fn measure_peer_copy(
            &self,
            src: &str,
            dst: &str,
            params: &crate::runtime::DeviceCopyParams,
        ) -> Result<crate::runtime::PeerCopy, ProbeError> {
            assert_eq!(params.size_bytes, 4 << 20);
            self.log.lock().unwrap().push(format!("p2p {src}>{dst}"));
            Ok(crate::runtime::PeerCopy {
                bytes_per_second: 20e9,
                method: "copy",
            })
        }
    }

    fn with_p2p(cells: Vec<CellKey>, budget: Duration) -> WindowSpec {
        let cpu = crate::affinity::current_cpus().unwrap()[0];
        let mut spec = spec_of(cells, budget);
        spec.d2d = D2dWindowSpec {
            cells: vec![crate::schedule::d2d_window::D2dCell {
                key: crate::store::D2dKey {
                    device: "a".into(),
                    size_bytes: 1 << 20,
                },
                cpu,
            }],
            warmup: 0,
            iterations: 1,
            keep: 5,
        };
        spec.p2p = P2pWindowSpec {
            cells: vec![crate::schedule::p2p_window::P2pCell {
                key: "a>b".parse().unwrap(),
                cpu,
                size_bytes: 4 << 20,
            }],
            warmup: 0,
            iterations: 1,
            keep: 5,
        };
        spec
    }

    fn run_ordered(
        copy_time: Duration,
        spec: &WindowSpec,
        keep_going: &mut dyn FnMut() -> bool,
    ) -> (WindowReport, Vec<String>, Store) {
        let backend = Ordered {
            copy_time,
            log: Mutex::new(vec![]),
        };
        let shared = Arc::new(RwLock::new(Store::default()));
        let metrics = ProbeMetrics::default();
        let report = run(spec, &backend, &shared, &metrics, keep_going);
        let store = shared.read().unwrap().clone();
        (report, backend.log.into_inner().unwrap(), store)
    }

    #[test]
    fn the_peer_copy_cell_runs_last_after_the_copy_and_same_device_cells() {
        let spec = with_p2p(group_cells(&["a", "b"], &[1 << 20]), Duration::from_secs(5));
        let (report, log, store) = run_ordered(Duration::ZERO, &spec, &mut || true);
        assert_eq!(report.measured, 4, "{log:?}");
        assert_eq!(log.len(), 4);
        assert!(log[..2].iter().all(|l| l.starts_with("h2d")), "{log:?}");
        assert_eq!(log[2..], ["d2d a".to_string(), "p2p a>b".to_string()]);
        let pair: crate::store::P2pKey = "a>b".parse().unwrap();
        assert_eq!(store.p2p()[&pair].median(), Some(20e9));
        assert!(store.last_success().contains_key("p2p"));
    }

    #[test]
    fn no_peer_copy_once_the_budget_is_spent() {
        // The copy cells take the whole budget: neither the same-device nor the peer copy
        // cell starts.
        let spec = with_p2p(
            group_cells(&["a", "b"], &[1 << 20]),
            Duration::from_millis(80),
        );
        let (report, log, store) = run_ordered(Duration::from_millis(100), &spec, &mut || true);
        assert!(log.iter().all(|l| l.starts_with("h2d")), "{log:?}");
        assert!(store.p2p().is_empty());
        assert!(
            report.elapsed < Duration::from_millis(80 + 100 + 50),
            "{report:?}"
        );
    }

    #[test]
    fn the_copy_cells_leave_the_peer_copy_its_share_of_the_budget() {
        // Copy cells of 30 ms under a 400 ms budget stop at 350 ms (the last eighth is the
        // same-device and peer copy cells'); the same-device cell leaves the last sixteenth
        // to the peer copy, which runs.
        let cells = group_cells(&["a", "b", "c", "d"], &[1 << 20, 2 << 20, 4 << 20, 8 << 20]);
        let spec = with_p2p(cells, Duration::from_millis(400));
        let (report, log, _) = run_ordered(Duration::from_millis(30), &spec, &mut || true);
        assert!(
            log.iter().filter(|l| l.starts_with("h2d")).count() < 16,
            "{log:?}"
        );
        assert_eq!(log.last().map(String::as_str), Some("p2p a>b"), "{log:?}");
        assert_eq!(report.end, WindowEnd::BudgetSpent);
    }

    #[test]
    fn a_closed_gate_runs_no_peer_copy() {
        let spec = with_p2p(group_cells(&["a", "b"], &[1 << 20]), Duration::from_secs(5));
        let mut asked = 0;
        // Open for the two copy cells, closed from then on.
        let mut keep_going = || {
            asked += 1;
            asked <= 2
        };
        let (report, log, store) = run_ordered(Duration::ZERO, &spec, &mut keep_going);
        assert_eq!(report.end, WindowEnd::Aborted);
        assert!(log.iter().all(|l| l.starts_with("h2d")), "{log:?}");
        assert!(store.p2p().is_empty());
    }
}
