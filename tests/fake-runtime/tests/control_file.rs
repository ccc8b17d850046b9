//! `CHD_FAKE_CONTROL_FILE`: faults re-read on every call, so a test can make a device fail,
//! vanish (lost) and come back, or a collective hang, in the middle of a run; and
//! `CHD_FAKE_EXIT_REPORT`'s text.

mod common;

use std::ffi::c_void;
use std::path::PathBuf;
use std::ptr::null_mut;

use chd_fake_runtime::acl::*;
use chd_fake_runtime::cuda::*;
use chd_fake_runtime::nvml::*;

fn control_path() -> PathBuf {
    std::env::temp_dir().join(format!("chd-fake-control-{}", std::process::id()))
}

fn setup() -> std::sync::MutexGuard<'static, ()> {
    let path = control_path();
    let g = common::setup(&[
        ("CHD_FAKE_DEVICE_COUNT", "3"),
        ("CHD_FAKE_CONTROL_FILE", path.to_str().unwrap()),
        ("CHD_FAKE_FAIL_DEVICES", "2"),
    ]);
    std::fs::write(&path, "").unwrap();
    g
}

fn control(text: &str) {
    std::fs::write(control_path(), text).unwrap();
}

/// One CUDA host-to-device copy of 4 KiB on `device`: the first failing call's code.
fn cuda_copy(device: i32) -> CudaError {
    let host = vec![7u8; 4096];
    let (mut dev, mut stream): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
    // SAFETY: valid out-pointers; `host` and `dev` hold 4096 bytes; released before return.
    unsafe {
        let rc = cudaSetDevice(device);
        if rc != CUDA_SUCCESS {
            return rc;
        }
        let rc = cudaMalloc(&mut dev, 4096);
        if rc != CUDA_SUCCESS {
            return rc;
        }
        assert_eq!(cudaStreamCreate(&mut stream), CUDA_SUCCESS);
        let rc = cudaMemcpyAsync(
            dev,
            host.as_ptr().cast(),
            4096,
            CUDA_MEMCPY_HOST_TO_DEVICE,
            stream,
        );
        assert_eq!(cudaStreamDestroy(stream), CUDA_SUCCESS);
        assert_eq!(cudaFree(dev), CUDA_SUCCESS);
        rc
    }
}

fn nvml_utilization(index: u32) -> NvmlReturn {
    let mut h = null_mut();
    let mut util = nvmlUtilization_t::default();
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(nvmlDeviceGetHandleByIndex_v2(index, &mut h), NVML_SUCCESS);
        nvmlDeviceGetUtilizationRates(h, &mut util)
    }
}

#[test]
fn fail_devices_follow_the_file_and_fall_back_to_the_environment() {
    let _g = setup();
    // Empty file: the environment's list (device 2) holds.
    assert_eq!(cuda_copy(0), CUDA_SUCCESS);
    assert_eq!(cuda_copy(2), CUDA_ERROR_UNKNOWN);
    // The file replaces it, and is re-read on the next call.
    control("fail_devices=0,1\n");
    assert_eq!(cuda_copy(0), CUDA_ERROR_UNKNOWN);
    assert_eq!(cuda_copy(1), CUDA_ERROR_UNKNOWN);
    assert_eq!(cuda_copy(2), CUDA_SUCCESS);
    control("# nothing fails\nfail_devices=\n");
    for d in 0..3 {
        assert_eq!(cuda_copy(d), CUDA_SUCCESS, "device {d}");
    }
    // A malformed file: the environment's faults again.
    control("fail_devices=0\nbogus=1\n");
    assert_eq!(cuda_copy(0), CUDA_SUCCESS);
    assert_eq!(cuda_copy(2), CUDA_ERROR_UNKNOWN);
    control("");
}

#[test]
fn a_lost_device_fails_every_call_that_works_on_it_until_it_comes_back() {
    let _g = setup();
    // SAFETY: no arguments.
    assert_eq!(unsafe { nvmlInit_v2() }, NVML_SUCCESS);
    // Allocated before the loss: freed fine afterwards (a caller can always clean up).
    let mut before: *mut c_void = null_mut();
    // SAFETY: valid out-pointer.
    unsafe {
        assert_eq!(cudaSetDevice(1), CUDA_SUCCESS);
        assert_eq!(cudaMalloc(&mut before, 4096), CUDA_SUCCESS);
    }
    control("lost_devices=1\n");
    let host = vec![0u8; 4096];
    let (mut dev, mut stream): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
    // SAFETY: valid out-pointers; the thread's current device is still 1 (set before).
    unsafe {
        assert_eq!(
            cudaMalloc(&mut dev, 4096),
            CUDA_ERROR_DEVICES_UNAVAILABLE,
            "current device lost"
        );
        assert_eq!(
            cudaStreamCreate(&mut stream),
            CUDA_ERROR_DEVICES_UNAVAILABLE
        );
        assert_eq!(
            cudaMemcpy(
                before,
                host.as_ptr().cast(),
                4096,
                CUDA_MEMCPY_HOST_TO_DEVICE
            ),
            CUDA_ERROR_DEVICES_UNAVAILABLE
        );
        assert_eq!(cudaFree(before), CUDA_SUCCESS);
        let name = std::ffi::CStr::from_ptr(cudaGetErrorName(CUDA_ERROR_DEVICES_UNAVAILABLE));
        assert_eq!(name.to_str().unwrap(), "cudaErrorDevicesUnavailable");
    }
    assert_eq!(cuda_copy(1), CUDA_ERROR_DEVICES_UNAVAILABLE);
    assert_eq!(cuda_copy(0), CUDA_SUCCESS);
    assert_eq!(nvml_utilization(1), NVML_ERROR_GPU_IS_LOST);
    assert_eq!(nvml_utilization(0), NVML_SUCCESS);
    // ACL alike.
    let mut acl_stream: *mut c_void = null_mut();
    // SAFETY: valid out-pointer.
    unsafe {
        assert_eq!(aclrtSetDevice(1), ACL_ERROR_RT_LOST_HEARTBEAT);
        assert_eq!(aclrtSetDevice(0), ACL_SUCCESS);
        assert_eq!(aclrtCreateStream(&mut acl_stream), ACL_SUCCESS);
        assert_eq!(aclrtDestroyStream(acl_stream), ACL_SUCCESS);
        let mut info = aclrtUtilizationInfo {
            cubeUtilization: -1,
            vectorUtilization: -1,
            aicpuUtilization: -1,
            memoryUtilization: -1,
            utilizationExtend: null_mut(),
        };
        assert_eq!(
            aclrtGetDeviceUtilizationRate(1, &mut info),
            ACL_ERROR_RT_LOST_HEARTBEAT
        );
    }
    // Back: measured again.
    control("");
    assert_eq!(cuda_copy(1), CUDA_SUCCESS);
    assert_eq!(nvml_utilization(1), NVML_SUCCESS);
    // SAFETY: no arguments.
    unsafe {
        assert_eq!(aclrtSetDevice(1), ACL_SUCCESS);
        assert_eq!(nvmlShutdown(), NVML_SUCCESS);
    }
}

#[test]
fn the_exit_report_lists_what_is_held_and_every_thread_mask() {
    let _g = setup();
    let mut pinned: *mut c_void = null_mut();
    // SAFETY: valid out-pointer; freed below.
    unsafe { assert_eq!(cudaHostAlloc(&mut pinned, 8192, 1), CUDA_SUCCESS) };
    let report = chd_fake_runtime::exit_report::report();
    let value = |key: &str| -> u64 {
        report
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no {key} in {report}"))
            .parse()
            .unwrap()
    };
    assert!(value("live_pinned_allocations") >= 1, "{report}");
    assert!(value("live_pinned_bytes") >= 8192, "{report}");
    let threads: Vec<&str> = report
        .lines()
        .filter_map(|l| l.strip_prefix("thread="))
        .collect();
    // The main thread first, then at least this test's own thread.
    assert!(
        threads[0].starts_with(&format!("{} ", std::process::id())),
        "{report}"
    );
    assert!(threads.len() >= 2, "{report}");
    // SAFETY: allocated above.
    unsafe { assert_eq!(cudaFreeHost(pinned), CUDA_SUCCESS) };
    let after = chd_fake_runtime::exit_report::report();
    assert!(after.contains("live_pinned_bytes="), "{after}");
}

#[test]
fn the_pair_hang_follows_the_file() {
    let _g = setup();
    let (mut a, mut b): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
    // SAFETY: valid out-pointers; 4096-byte allocations on devices 0 and 1, freed below.
    unsafe {
        assert_eq!(cudaSetDevice(0), CUDA_SUCCESS);
        assert_eq!(cudaMalloc(&mut a, 4096), CUDA_SUCCESS);
        assert_eq!(cudaSetDevice(1), CUDA_SUCCESS);
        assert_eq!(cudaMalloc(&mut b, 4096), CUDA_SUCCESS);
    }
    // SAFETY: `a` and `b` are live 4096-byte allocations on devices 0 and 1.
    let peer_copy_ms = || unsafe {
        let t = std::time::Instant::now();
        assert_eq!(cudaMemcpyPeer(b, 1, a, 0, 4096), CUDA_SUCCESS);
        t.elapsed().as_millis()
    };
    control("pair_hang_ms=200\n");
    assert!(peer_copy_ms() >= 200);
    control("");
    assert!(peer_copy_ms() < 200);
    // SAFETY: allocated above.
    unsafe { assert_eq!((cudaFree(a), cudaFree(b)), (CUDA_SUCCESS, CUDA_SUCCESS)) };
}
