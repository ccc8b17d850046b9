//! Probe throughput on the seed's shape (16 devices x 3 sizes, 4/16/64 MiB, h2d) against the
//! fake runtime's cost model, before and after grouping, side by side in one run:
//! - `per-cell`: every cell allocates and pins its own host buffer (`Backend::measure_copy`,
//!   what windows did before, and what `chd probe h2d` still does);
//! - `grouped`: the window's cells of one CPU and size share one bound thread and one pinned
//!   buffer for all 16 devices (`Backend::staging`, what windows do now).
//!
//! Both run real `schedule::window::run` windows over the CUDA backend loaded from
//! `libchd_fake_runtime.so`; the cost of a mode is the fake's simulated time
//! (`chd_fake_simulated_ns`: `CHD_FAKE_PIN_MS_PER_MIB` per pinned MiB plus every timed copy
//! at `CHD_FAKE_H2D_GBPS`), not this machine's wall clock, which is dominated by the fake's
//! real `memmove`s. The CPUs this process may use stand for the seed's 640 (the cost of a
//! cell does not depend on how many CPUs there are). From the simulated time per cell it
//! prints cells per second of probe budget and the time to cover 30,720 cells
//! (640 x 16 x 3) at the default duty cycle (a 2 s window every 60 s: 3.3 %).
//!
//! Settings (environment): `CHD_BENCH_PIN_MS_PER_MIB` (default 0.1: pinning hundreds of MiB
//! costs tens of ms on real GPUs), `CHD_BENCH_COPY_GBPS` (default 58.9), `CHD_BENCH_ROUNDS`
//! (default 2; the modes alternate). Every window has a 120 s budget, so a run is bounded.
//!
//! Run: `cargo bench --bench probe_throughput`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use chd::runtime::cuda::CudaBackend;
use chd::runtime::{Backend, CopyParams, DeviceInfo, ProbeError};
use chd::schedule::metrics::ProbeMetrics;
use chd::schedule::planner;
use chd::schedule::window::{self, WindowSpec};
use chd::store::Store;

const DEVICES: usize = 16;
const SIZES_BYTES: [u64; 3] = [4 << 20, 16 << 20, 64 << 20];
const SEED_CELLS: f64 = 640.0 * 16.0 * 3.0;
/// The default schedule: a 2 s window budget every 60 s.
const DUTY: f64 = 2.0 / 60.0;
const WARMUP: u32 = 1;
const ITERATIONS: u32 = 4;
const WINDOW_BUDGET: Duration = Duration::from_secs(120);

/// The backend without a staging of its own: every cell pins its own buffer (the default
/// `Backend::staging` calls `measure_copy` per cell).
struct PerCell<'a>(&'a dyn Backend);

impl Backend for PerCell<'_> {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn devices(&self) -> &[DeviceInfo] {
        self.0.devices()
    }
    fn measure_copy(&self, device: &str, params: &CopyParams) -> Result<f64, ProbeError> {
        self.0.measure_copy(device, params)
    }
}

fn env_f64(name: &str, default: f64) -> f64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|e| panic!("{name}={v:?} is not a number: {e}")),
        Err(_) => default,
    }
}

/// Build the fake runtime (debug profile, as the tests do) and return its path.
fn fake_runtime() -> PathBuf {
    let exe = std::env::current_exe().expect("bench executable path");
    // target/<profile>/deps/<bench> -> target/
    let target = exe
        .ancestors()
        .nth(3)
        .expect("the bench runs from target/<profile>/deps");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--quiet", "-p", "chd-fake-runtime"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("CARGO_TARGET_DIR", target)
        .status()
        .expect("run cargo build -p chd-fake-runtime");
    assert!(status.success(), "cargo build -p chd-fake-runtime failed");
    let lib = target.join("debug/libchd_fake_runtime.so");
    assert!(lib.exists(), "{} missing", lib.display());
    lib
}

fn hook(lib: &libloading::Library, symbol: &str) -> u64 {
    // SAFETY: the fake exports its hooks as `extern "C" fn() -> u64`.
    unsafe {
        let f: libloading::Symbol<unsafe extern "C" fn() -> u64> = lib
            .get(symbol.as_bytes())
            .unwrap_or_else(|e| panic!("{symbol}: {e}"));
        f()
    }
}

#[derive(Default, Clone, Copy)]
struct Tally {
    cells: usize,
    errors: usize,
    pins: u64,
    simulated_ns: u64,
    wall: Duration,
}

fn run_mode(backend: &dyn Backend, lib: &libloading::Library, cpus: &[u32]) -> Tally {
    let devices: Vec<String> = (0..DEVICES).map(|d| d.to_string()).collect();
    let device_refs: Vec<&str> = devices.iter().map(String::as_str).collect();
    let universe = chd::probe::copy_cells(
        cpus,
        &device_refs,
        &SIZES_BYTES,
        &[chd::runtime::Direction::H2d],
    );
    let cells = planner::plan(&universe, &Store::default(), |_| Some(0), &mut rand::rng());
    let spec = WindowSpec {
        cells,
        affinity_cpus: vec![],
        budget: WINDOW_BUDGET,
        warmup: WARMUP,
        iterations: ITERATIONS,
        host_memory: chd::runtime::HostMemory::Pinned,
        keep: 5,
        links: Default::default(),
        d2d: Default::default(),
        p2p: Default::default(),
    };
    let store = Arc::new(RwLock::new(Store::default()));
    let metrics = ProbeMetrics::default();
    let (pins, ns) = (
        hook(lib, "chd_fake_pinned_allocations_total"),
        hook(lib, "chd_fake_simulated_ns"),
    );
    let started = Instant::now();
    let report = std::thread::scope(|s| {
        s.spawn(|| window::run(&spec, backend, &store, &metrics, &mut || true))
            .join()
            .expect("probe thread")
    });
    Tally {
        cells: report.measured,
        errors: report.errors,
        pins: hook(lib, "chd_fake_pinned_allocations_total") - pins,
        simulated_ns: hook(lib, "chd_fake_simulated_ns") - ns,
        wall: started.elapsed(),
    }
}

fn add(a: Tally, b: Tally) -> Tally {
    Tally {
        cells: a.cells + b.cells,
        errors: a.errors + b.errors,
        pins: a.pins + b.pins,
        simulated_ns: a.simulated_ns + b.simulated_ns,
        wall: a.wall + b.wall,
    }
}

fn main() {
    // `cargo bench` passes `--bench`; there is nothing to filter.
    let pin_ms_per_mib = env_f64("CHD_BENCH_PIN_MS_PER_MIB", 0.1);
    let gbps = env_f64("CHD_BENCH_COPY_GBPS", 58.9);
    let rounds = env_f64("CHD_BENCH_ROUNDS", 2.0) as usize;
    // SAFETY: set before anything loads the fake or starts a thread.
    unsafe {
        std::env::set_var("CHD_FAKE_DEVICE_COUNT", DEVICES.to_string());
        std::env::set_var("CHD_FAKE_PIN_MS_PER_MIB", pin_ms_per_mib.to_string());
        std::env::set_var("CHD_FAKE_H2D_GBPS", gbps.to_string());
    }
    let path = fake_runtime();
    // SAFETY: the fake runtime's initialisers only read the environment.
    let lib = unsafe { libloading::Library::new(&path) }.expect("load the fake runtime");
    let cuda = CudaBackend::open(Some(&path), Path::new("/sys")).expect("open the fake CUDA");
    let cpus = chd::affinity::current_cpus().expect("allowed CPUs");

    let (mut before, mut after) = (Tally::default(), Tally::default());
    for _ in 0..rounds.max(1) {
        before = add(before, run_mode(&PerCell(&cuda), &lib, &cpus));
        after = add(after, run_mode(&cuda, &lib, &cpus));
    }

    println!(
        "probe throughput: CUDA backend on the fake runtime, {DEVICES} devices x {} sizes (4, 16, 64 MiB) x {} CPUs (standing for 640), h2d, warmup {WARMUP} + {ITERATIONS} timed copies at {gbps} GB/s, pinning {pin_ms_per_mib} ms/MiB, {} round(s)",
        SIZES_BYTES.len(),
        cpus.len(),
        rounds.max(1),
    );
    println!(
        "{:<10} {:>6} {:>6} {:>6} {:>12} {:>9} {:>12} {:>14} {:>10}",
        "mode",
        "cells",
        "errors",
        "pins",
        "simulated s",
        "ms/cell",
        "cells/s",
        "30720 @ 3.3%",
        "wall s"
    );
    let mut per_cell_ms = [0.0; 2];
    for (i, (name, t)) in [("per-cell", before), ("grouped", after)]
        .into_iter()
        .enumerate()
    {
        let seconds = t.simulated_ns as f64 / 1e9;
        let ms_per_cell = seconds * 1e3 / t.cells.max(1) as f64;
        per_cell_ms[i] = ms_per_cell;
        let coverage_h = SEED_CELLS * ms_per_cell / 1e3 / DUTY / 3600.0;
        println!(
            "{:<10} {:>6} {:>6} {:>6} {:>12.3} {:>9.3} {:>12.1} {:>12.2} h {:>10.2}",
            name,
            t.cells,
            t.errors,
            t.pins,
            seconds,
            ms_per_cell,
            1e3 / ms_per_cell,
            coverage_h,
            t.wall.as_secs_f64(),
        );
    }
    println!(
        "grouped / per-cell cells per second of probe budget: {:.2}x (target: 30,720 cells in under 12 h at 3.3 % duty; the seed's batch tool: ~47 ms a cell)",
        per_cell_ms[0] / per_cell_ms[1]
    );
}
