//! The CUDA and ACL loaders in-process against the fake runtime library: every measured
//! cell releases its pinned host memory, device memory, streams and events, on success and
//! on failure; bytes really travel; timing follows the device events.

#[path = "support/fake_runtime.rs"]
mod fake;

use std::path::Path;
use std::sync::{Mutex, MutexGuard, Once};

/// The fake's allocation counters are per process: tests that read them run one at a time.
fn exclusive() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

use chd::runtime::acl::AclBackend;
use chd::runtime::cuda::CudaBackend;
use chd::runtime::{Backend, CopyParams, Direction, HostMemory};

/// The fake reads its settings once per process: set them before the first load.
fn setup() -> &'static Path {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: called once, before any thread of this test binary reads the environment
        // through the fake runtime.
        unsafe {
            std::env::set_var("CHD_FAKE_DEVICE_COUNT", "3");
            std::env::set_var("CHD_FAKE_H2D_GBPS", "50;1=25");
            std::env::set_var("CHD_FAKE_FAIL_DEVICES", "2");
        }
    });
    fake::fake_runtime()
}

fn live(symbol: &str) -> u64 {
    let lib = setup();
    // SAFETY: the fake exports these hooks as `extern "C" fn() -> u64`.
    unsafe {
        let l = libloading::Library::new(lib).unwrap();
        let f: libloading::Symbol<unsafe extern "C" fn() -> u64> =
            l.get(symbol.as_bytes()).unwrap();
        f()
    }
}

fn params(direction: Direction, host_memory: HostMemory) -> CopyParams {
    CopyParams {
        size_bytes: 8 << 20,
        direction,
        warmup: 1,
        iterations: 4,
        host_memory,
    }
}

fn exercise(backend: &dyn Backend) {
    for direction in [Direction::H2d, Direction::D2h] {
        for memory in [HostMemory::Pinned, HostMemory::Pageable] {
            let p = params(direction, memory);
            let fast = backend.measure_copy("0", &p).unwrap();
            let slow = backend.measure_copy("1", &p).unwrap();
            assert!((fast - 50e9).abs() < 0.005 * 50e9, "{fast}");
            assert!((slow - 25e9).abs() < 0.005 * 25e9, "{slow}");
            let err = backend.measure_copy("2", &p).unwrap_err();
            assert_eq!(err.reason(), "copy", "{err}");
            assert_eq!(
                backend.measure_copy("7", &p).unwrap_err().reason(),
                "unknown_device"
            );
        }
    }
}

#[test]
fn cuda_cells_measure_and_release_everything() {
    let _one_at_a_time = exclusive();
    let lib = setup();
    let backend = CudaBackend::open(Some(lib), Path::new("/sys")).unwrap();
    assert_eq!(backend.devices().len(), 3);
    exercise(&backend);
    assert_eq!(live("chd_fake_live_pinned_allocations"), 0);
    assert_eq!(live("chd_fake_live_device_allocations"), 0);
}

#[test]
fn acl_cells_measure_and_release_everything() {
    let _one_at_a_time = exclusive();
    let lib = setup();
    let backend = AclBackend::open(Some(lib), Path::new("/sys")).unwrap();
    assert_eq!(backend.devices().len(), 3);
    exercise(&backend);
    assert_eq!(live("chd_fake_live_pinned_allocations"), 0);
    assert_eq!(live("chd_fake_live_device_allocations"), 0);
}

#[test]
fn a_zero_iteration_cell_is_a_timing_error_not_a_division_by_zero() {
    let _one_at_a_time = exclusive();
    let lib = setup();
    let backend = CudaBackend::open(Some(lib), Path::new("/sys")).unwrap();
    let p = CopyParams {
        iterations: 0,
        ..params(Direction::H2d, HostMemory::Pinned)
    };
    assert_eq!(
        backend.measure_copy("0", &p).unwrap_err().reason(),
        "timing"
    );
}
