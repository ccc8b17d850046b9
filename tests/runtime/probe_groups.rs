//! Grouped probe windows against the fake runtime: the cells of one CPU and size on every
//! device share one pinned host buffer (the fake counts pinned allocations: a window over 4
//! devices x 1 CPU pins once; one per size with several sizes), allocated portable so every
//! device sees it pinned, freed before the window returns; a failing device costs only its
//! cell. A window that pins per cell (the one-shot path's `measure_copy`) pins once a cell.

use crate::fake;

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use chd::runtime::acl::AclBackend;
use chd::runtime::cuda::CudaBackend;
use chd::runtime::{Backend, CopyParams, Direction, HostMemory};
use chd::schedule::metrics::ProbeMetrics;
use chd::schedule::planner;
use chd::schedule::window::{self, WindowEnd, WindowSpec};
use chd::store::{CellKey, Store};

fn setup() -> &'static Path {
    fake::fake_runtime_with(&[
        ("CHD_FAKE_DEVICE_COUNT", "5"),
        ("CHD_FAKE_FAIL_DEVICES", "4"),
        ("CHD_FAKE_PIN_MS_PER_MIB", "0.1"),
    ])
}

/// The fake's counters are per process: tests that read them run one at a time.
fn exclusive() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn hook(symbol: &str) -> u64 {
    let lib = setup();
    // SAFETY: the fake exports these hooks as `extern "C" fn() -> u64`.
    unsafe {
        let l = libloading::Library::new(lib).unwrap();
        let f: libloading::Symbol<unsafe extern "C" fn() -> u64> =
            l.get(symbol.as_bytes()).unwrap();
        f()
    }
}

fn cells(devices: &[&str], sizes: &[u64], directions: &[Direction]) -> Vec<CellKey> {
    let cpu = chd::affinity::current_cpus().unwrap()[0];
    let universe = chd::probe::copy_cells(&[cpu], devices, sizes, directions);
    planner::plan(&universe, &Store::default(), |_| Some(0), &mut rand::rng())
}

fn run_window(backend: &dyn Backend, cells: Vec<CellKey>) -> (window::WindowReport, Store) {
    let (report, store, _) = run_window_watching(backend, cells, &mut |_| {});
    (report, store)
}

/// Run one window over `cells`, showing `watch` the probe metrics before every cell; returns
/// the report, the store and the metrics after the window.
fn run_window_watching(
    backend: &dyn Backend,
    cells: Vec<CellKey>,
    watch: &mut (dyn FnMut(&ProbeMetrics) + Send),
) -> (window::WindowReport, Store, ProbeMetrics) {
    let spec = WindowSpec {
        cells,
        affinity_cpus: vec![],
        budget: Duration::from_secs(60),
        warmup: 1,
        iterations: 2,
        host_memory: HostMemory::Pinned,
        keep: 5,
        links: Default::default(),
        d2d: Default::default(),
        p2p: Default::default(),
    };
    let store = Arc::new(RwLock::new(Store::default()));
    let metrics = ProbeMetrics::default();
    // A dedicated thread, as the scheduler runs windows: each group binds it.
    let report = std::thread::scope(|s| {
        s.spawn(|| {
            window::run(&spec, backend, &store, &metrics, &mut || {
                watch(&metrics);
                true
            })
        })
        .join()
        .unwrap()
    });
    let store = store.read().unwrap().clone();
    (report, store, metrics)
}

fn assert_one_pin_per_group(backend: &dyn Backend) {
    let pins = hook("chd_fake_pinned_allocations_total");
    let unportable = hook("chd_fake_unportable_pinned_copies");
    let (report, store) = run_window(
        backend,
        cells(&["0", "1", "2", "3"], &[4 << 20], &[Direction::H2d]),
    );
    assert_eq!(report.end, WindowEnd::Completed);
    assert_eq!((report.measured, report.errors), (4, 0));
    assert_eq!(store.measured_cells().count(), 4);
    assert_eq!(
        hook("chd_fake_pinned_allocations_total") - pins,
        1,
        "4 devices x 1 CPU pin once"
    );
    assert_eq!(hook("chd_fake_live_pinned_allocations"), 0, "freed");
    assert_eq!(hook("chd_fake_live_device_allocations"), 0);
    assert_eq!(hook("chd_fake_unportable_pinned_copies"), unportable);

    // Two sizes, both directions, a failing device: one buffer per size, the failing
    // device's cells are errors and cost nothing else.
    let pins = hook("chd_fake_pinned_allocations_total");
    let (report, store) = run_window(
        backend,
        cells(
            &["0", "1", "2", "4"],
            &[1 << 20, 4 << 20],
            &[Direction::H2d, Direction::D2h],
        ),
    );
    assert_eq!((report.measured, report.errors), (12, 4));
    assert_eq!(store.measured_cells().count(), 12);
    assert_eq!(hook("chd_fake_pinned_allocations_total") - pins, 2);
    assert_eq!(hook("chd_fake_live_pinned_allocations"), 0);
    assert_eq!(hook("chd_fake_unportable_pinned_copies"), unportable);
}

/// The held-host-memory gauge during a window (its largest value, as seen between cells) and
/// after it.
fn held_host_memory(backend: &dyn Backend, cells: Vec<CellKey>) -> (i64, i64) {
    let mut most = 0;
    let (_, _, metrics) = run_window_watching(backend, cells, &mut |m| {
        most = most.max(m.held_host_memory.get());
    });
    (most, metrics.held_host_memory.get())
}

#[test]
fn the_held_host_memory_gauge_shows_the_group_buffer_then_zero() {
    alone!(the_held_host_memory_gauge_shows_the_group_buffer_then_zero);
    let _one = exclusive();
    let backend = CudaBackend::open(Some(setup()), Path::new("/sys")).unwrap();
    let (during, after) = held_host_memory(
        &backend,
        cells(&["0", "1", "2"], &[4 << 20], &[Direction::H2d]),
    );
    // The CUDA buffer carries the latch word its cells' streams wait on (issue 25).
    let word = chd::runtime::stream_latch::WORD_BYTES as i64;
    assert_eq!(
        during,
        (4 << 20) + word,
        "one 4 MiB buffer (and its latch word) held for the group"
    );
    assert_eq!(after, 0, "nothing held after the window");
}

#[test]
fn cuda_windows_pin_once_per_group() {
    alone!(cuda_windows_pin_once_per_group);
    let _one = exclusive();
    let backend = CudaBackend::open(Some(setup()), Path::new("/sys")).unwrap();
    assert_one_pin_per_group(&backend);
}

#[test]
fn acl_windows_pin_once_per_group() {
    alone!(acl_windows_pin_once_per_group);
    let _one = exclusive();
    let backend = AclBackend::open(Some(setup()), Path::new("/sys")).unwrap();
    assert_one_pin_per_group(&backend);
}

#[test]
fn per_cell_measurement_pins_every_cell_and_costs_more() {
    alone!(per_cell_measurement_pins_every_cell_and_costs_more);
    let _one = exclusive();
    let backend = CudaBackend::open(Some(setup()), Path::new("/sys")).unwrap();
    let params = CopyParams {
        size_bytes: 4 << 20,
        direction: Direction::H2d,
        warmup: 1,
        iterations: 2,
        host_memory: HostMemory::Pinned,
    };
    let (pins, ns) = (
        hook("chd_fake_pinned_allocations_total"),
        hook("chd_fake_simulated_ns"),
    );
    for device in ["0", "1", "2", "3"] {
        backend.measure_copy(device, &params).unwrap();
    }
    let per_cell = hook("chd_fake_simulated_ns") - ns;
    assert_eq!(hook("chd_fake_pinned_allocations_total") - pins, 4);
    let ns = hook("chd_fake_simulated_ns");
    run_window(
        &backend,
        cells(&["0", "1", "2", "3"], &[4 << 20], &[Direction::H2d]),
    );
    let grouped = hook("chd_fake_simulated_ns") - ns;
    // Pinning 4 MiB (and the 64-byte latch word after it) costs 0.4 ms; three of the four
    // pinnings are saved.
    let word = chd::runtime::stream_latch::WORD_BYTES as f64;
    let pin_ns = ((4 << 20) as f64 + word) / f64::from(1 << 20) * 0.1e6;
    assert_eq!(
        per_cell - grouped,
        3 * pin_ns.round() as u64,
        "{per_cell} vs {grouped}"
    );
}
