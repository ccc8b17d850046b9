//! The CUDA and ACL loaders in-process against the fake runtime library: every measured
//! cell releases its pinned host memory, device memory, streams and events, on success and
//! on failure (a device that fails in the middle of the timed copies, with copies still
//! queued, included: nothing is released before its stream is synchronized); bytes really
//! travel; timing follows the device events; same-device copy cells (two device buffers, a
//! pinned staging of the check pattern) release everything too; ACL refuses pageable
//! memory, finalizes only an ACL it initialized and takes PCI bus ids from the runtime; NVML
//! sees chd's own context as chd's.

use crate::fake;

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

/// The fake's allocation counters are per process: tests that read them run one at a time.
fn exclusive() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

use std::ffi::{c_char, c_int, c_void};
use std::time::Duration;

use chd::runtime::acl::AclBackend;
use chd::runtime::cuda::CudaBackend;
use chd::runtime::pair::PairParams;
use chd::runtime::select::{self, BackendChoice, CollectiveChoice, RuntimeConfig};
use chd::runtime::telemetry::{DeviceTelemetry, NvmlTelemetry};
use chd::runtime::{Backend, CopyParams, DeviceCopyParams, Direction, HostMemory};
use chd::topology::{Roots, Topology};

/// The fake reads its settings once per process: set them before the first load.
fn setup() -> &'static Path {
    fake::fake_runtime_with(&[
        ("CHD_FAKE_DEVICE_COUNT", "3"),
        ("CHD_FAKE_H2D_GBPS", "50;1=25"),
        ("CHD_FAKE_D2D_GBPS", "300;1=150"),
        ("CHD_FAKE_FAIL_DEVICES", "2"),
        // Device 2 fails from the 4th copy of each stream on: in the middle of the timed
        // copies, with earlier ones still queued.
        ("CHD_FAKE_FAIL_AFTER", "3"),
    ])
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

fn exercise(backend: &dyn Backend, memories: &[HostMemory]) {
    for direction in [Direction::H2d, Direction::D2h] {
        for &memory in memories {
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

/// Same-device copy cells: the device's own rate (not its H2D rate), device 2 failing in the
/// middle of its timed copies costs that cell only, unknown devices and empty cells refused.
fn exercise_device_copies(backend: &dyn Backend) {
    let p = DeviceCopyParams {
        size_bytes: 8 << 20,
        warmup: 1,
        iterations: 4,
    };
    let fast = backend.measure_device_copy("0", &p).unwrap();
    let slow = backend.measure_device_copy("1", &p).unwrap();
    assert!((fast - 300e9).abs() < 0.005 * 300e9, "{fast}");
    assert!((slow - 150e9).abs() < 0.005 * 150e9, "{slow}");
    let err = backend.measure_device_copy("2", &p).unwrap_err();
    assert_eq!(err.reason(), "copy", "{err}");
    assert_eq!(
        backend.measure_device_copy("7", &p).unwrap_err().reason(),
        "unknown_device"
    );
    for bad in [
        DeviceCopyParams { size_bytes: 0, ..p },
        DeviceCopyParams { iterations: 0, ..p },
    ] {
        assert_eq!(
            backend.measure_device_copy("0", &bad).unwrap_err().reason(),
            "timing"
        );
    }
    // Still usable after the failures.
    assert!(backend.measure_device_copy("0", &p).is_ok());
}

#[test]
fn cuda_cells_measure_and_release_everything() {
    alone!(cuda_cells_measure_and_release_everything);
    let _one_at_a_time = exclusive();
    let lib = setup();
    let backend = CudaBackend::open(Some(lib), Path::new("/sys")).unwrap();
    assert_eq!(backend.devices().len(), 3);
    // CUDA takes pageable memory (the copy is then synchronous).
    assert!(backend.check_host_memory(HostMemory::Pageable).is_ok());
    exercise(&backend, &[HostMemory::Pinned, HostMemory::Pageable]);
    exercise_device_copies(&backend);
    assert_eq!(live("chd_fake_live_pinned_allocations"), 0);
    assert_eq!(live("chd_fake_live_device_allocations"), 0);
}

#[test]
fn acl_cells_measure_and_release_everything() {
    alone!(acl_cells_measure_and_release_everything);
    let _one_at_a_time = exclusive();
    let lib = setup();
    let backend = AclBackend::open(Some(lib), Path::new("/sys")).unwrap();
    assert_eq!(backend.devices().len(), 3);
    let refused = live("chd_fake_unsynchronized_releases");
    exercise(&backend, &[HostMemory::Pinned]);
    exercise_device_copies(&backend);
    assert_eq!(live("chd_fake_live_pinned_allocations"), 0);
    assert_eq!(live("chd_fake_live_device_allocations"), 0);
    assert_eq!(
        live("chd_fake_unsynchronized_releases"),
        refused,
        "a stream destroyed or a buffer freed with copies still queued"
    );
    // aclrtMemcpyAsync on pageable memory is undefined: a configuration error up front, and
    // a cell asked for it anyway fails before touching the device.
    let why = backend.check_host_memory(HostMemory::Pageable).unwrap_err();
    assert!(why.contains("aclrtMallocHost"), "{why}");
    let err = backend
        .measure_copy("0", &params(Direction::H2d, HostMemory::Pageable))
        .unwrap_err();
    assert_eq!(err.reason(), "alloc", "{err}");
    assert!(err.to_string().contains("pageable"), "{err}");
    assert_eq!(live("chd_fake_live_pinned_allocations"), 0);
}

/// `unsafe extern "C" fn` symbols of the fake, loaded by name.
fn fake_fn<T: Copy>(name: &str) -> T {
    // SAFETY: the fake exports `name` with the C signature `T`; the library stays loaded
    // (chd's loaders hold it) for the life of the test process.
    unsafe {
        let l = libloading::Library::new(setup()).unwrap();
        let f = *l.get::<T>(name.as_bytes()).unwrap();
        std::mem::forget(l);
        f
    }
}

#[test]
fn acl_that_chd_did_not_initialize_is_not_finalized() {
    alone!(acl_that_chd_did_not_initialize_is_not_finalized);
    let _one_at_a_time = exclusive();
    let lib = setup();
    let init: unsafe extern "C" fn(*const c_char) -> c_int = fake_fn("aclInit");
    let finalize: unsafe extern "C" fn() -> c_int = fake_fn("aclFinalize");
    // SAFETY: NULL config path is allowed.
    assert_eq!(unsafe { init(std::ptr::null()) }, 0, "the test owns ACL");
    {
        let backend = AclBackend::open(Some(lib), Path::new("/sys")).unwrap();
        backend
            .measure_copy("0", &params(Direction::H2d, HostMemory::Pinned))
            .unwrap();
    }
    // chd saw ACL_ERROR_REPEAT_INITIALIZE and left ACL alone: the owner's ACL still stands
    // (a second finalization would be ACL_ERROR_REPEAT_FINALIZE, 100037).
    // SAFETY: no arguments.
    assert_eq!(unsafe { finalize() }, 0);
    // An ACL chd initialized itself is released when the backend goes.
    drop(AclBackend::open(Some(lib), Path::new("/sys")).unwrap());
    // SAFETY: as above.
    unsafe {
        assert_eq!(init(std::ptr::null()), 0, "chd's ACL was not finalized");
        assert_eq!(finalize(), 0);
    }
}

#[test]
fn acl_devices_take_their_pci_bus_id_from_the_runtime() {
    alone!(acl_devices_take_their_pci_bus_id_from_the_runtime);
    let _one_at_a_time = exclusive();
    let lib = setup();
    let backend = AclBackend::open(Some(lib), Path::new("/sys")).unwrap();
    let ids: Vec<&str> = backend
        .devices()
        .iter()
        .map(|d| d.pci_bus_id.as_str())
        .collect();
    assert_eq!(ids, ["0000:10:00.0", "0000:11:00.0", "0000:12:00.0"]);
}

#[test]
fn a_pair_failing_mid_sequence_synchronizes_before_it_frees() {
    alone!(a_pair_failing_mid_sequence_synchronizes_before_it_frees);
    let _one_at_a_time = exclusive();
    let lib = setup();
    let cfg = RuntimeConfig {
        backend: BackendChoice::Acl,
        acl_runtime: Some(lib.to_path_buf()),
        collective: CollectiveChoice::Copy,
        ..RuntimeConfig::default()
    };
    let roots = Roots::default();
    let topology = Topology::read(&roots).unwrap();
    let opened = select::open(&cfg, &roots, &topology).unwrap();
    let (probe, _) = select::open_pair_probe(&cfg, &opened).unwrap();
    let cpu = topology.cpus.iter().find(|c| c.allowed).unwrap().id;
    let params = PairParams {
        bytes_per_rank: 1 << 20,
        warmup: 1,
        iterations: 4,
        timeout: Duration::from_secs(20),
    };
    let refused = live("chd_fake_unsynchronized_releases");
    // Devices 0 and 1 work; every peer copy touching device 2 fails from the 4th copy of a
    // stream on, with the rank's earlier peer copies into the other rank's buffer queued.
    let ok = probe.measure(["0", "1"], [cpu, cpu], &params).unwrap();
    assert!((ok - 13.7e9).abs() < 0.01 * 13.7e9, "{ok}");
    let started = std::time::Instant::now();
    let err = probe.measure(["1", "2"], [cpu, cpu], &params).unwrap_err();
    assert_eq!(err.reason(), "collective", "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "waited for the timeout"
    );
    assert_eq!(live("chd_fake_live_device_allocations"), 0);
    assert_eq!(live("chd_fake_live_pinned_allocations"), 0);
    assert_eq!(live("chd_fake_unsynchronized_releases"), refused);
}

#[test]
fn nvml_knows_chd_s_own_context_in_its_own_pid_namespace() {
    alone!(nvml_knows_chd_s_own_context_in_its_own_pid_namespace);
    let _one_at_a_time = exclusive();
    let lib = setup();
    let cuda = CudaBackend::open(Some(lib), Path::new("/sys")).unwrap();
    let nvml = NvmlTelemetry::open(Some(lib), cuda.devices(), Path::new("/proc")).unwrap();
    let set_device: unsafe extern "C" fn(c_int) -> c_int = fake_fn("cudaSetDevice");
    let malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int = fake_fn("cudaMalloc");
    let free: unsafe extern "C" fn(*mut c_void) -> c_int = fake_fn("cudaFree");
    let mut p = std::ptr::null_mut();
    // SAFETY: valid out-pointer; freed below.
    unsafe {
        assert_eq!(set_device(1), 0);
        assert_eq!(malloc(&mut p, 4096), 0);
    }
    // NVML lists this process on device 1 under getpid() ...
    let raw = nvml_wrapper::Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .unwrap();
    let listed = raw
        .device_by_index(1)
        .unwrap()
        .running_compute_processes()
        .unwrap();
    assert_eq!(
        listed.iter().map(|p| p.pid).collect::<Vec<_>>(),
        [std::process::id()]
    );
    // ... and chd knows it is itself: the device stays idle.
    let on1 = nvml.sample().into_iter().find(|s| s.device == "1").unwrap();
    assert_eq!(on1.foreign_processes, Some(0));
    assert!(!on1.is_busy(0.1));
    // SAFETY: allocated above.
    assert_eq!(unsafe { free(p) }, 0);
}

#[test]
fn a_zero_iteration_cell_is_a_timing_error_not_a_division_by_zero() {
    alone!(a_zero_iteration_cell_is_a_timing_error_not_a_division_by_zero);
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
