//! The matmul throughput of the basic validation table (`DeviceLoader::measure_matmul`)
//! against the fake runtime's cuBLAS: the TFLOPS follow the device events around the
//! products on their stream (each device at its own planted rate), an unknown device is a
//! clear error, and nothing is left allocated after a measurement, failed or not.

use crate::fake;

use std::path::Path;

use chd::runtime::gemm::{DeviceLoader, MatmulParams};
use chd::runtime::select::{self, BackendChoice, RuntimeConfig};
use chd::topology::{Roots, Topology};

/// The fake reads its settings once per process: set them before the first load.
fn setup() -> &'static Path {
    fake::fake_runtime_with(&[
        ("CHD_FAKE_DEVICE_COUNT", "3"),
        ("CHD_FAKE_GEMM_TFLOPS", "50;1=20"),
        ("CHD_FAKE_FAIL_DEVICES", "2"),
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

#[test]
fn matmul_tflops_follow_the_device_events_and_release_everything() {
    alone!(matmul_tflops_follow_the_device_events_and_release_everything);
    let lib = setup();
    let cfg = RuntimeConfig {
        backend: BackendChoice::Cuda,
        cuda_runtime: Some(lib.to_path_buf()),
        ..RuntimeConfig::default()
    };
    let roots = Roots::default();
    let topology = Topology::read(&roots).unwrap();
    let opened = select::open(&cfg, &roots, &topology).unwrap();
    let loader = DeviceLoader::open(&opened, None).unwrap();
    let params = MatmulParams {
        n: 256,
        warmup: 1,
        iterations: 3,
    };
    for (device, tflops) in [("0", 50.0), ("1", 20.0)] {
        let got = loader.measure_matmul(device, &params).unwrap();
        let want = tflops * 1e12;
        assert!((got - want).abs() < 1e-3 * want, "device {device}: {got}");
    }
    // Device 2 fails all its work (here the operands' fill, before any product): an error
    // naming the device and the failed call, and nothing left behind.
    let err = loader.measure_matmul("2", &params).unwrap_err().to_string();
    assert!(
        err.starts_with("device 2: ") && err.contains(" failed"),
        "{err}"
    );
    let err = loader.measure_matmul("7", &params).unwrap_err().to_string();
    assert!(err.contains("unknown device \"7\""), "{err}");
    assert_eq!(live("chd_fake_live_device_allocations"), 0);
    assert_eq!(live("chd_fake_live_cublas_handles"), 0);
    // Every product ran on operands filled first (the fake refuses the others).
    assert_eq!(live("chd_fake_unwritten_gemm_operands"), 0);
}
