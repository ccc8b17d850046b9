//! `CHD_FAKE_NVML_OWN_PID`: NVML lists this process's own allocations under another pid, as
//! NVML does for a process in a container without the host PID namespace (it reports host
//! pids).

mod common;

use std::ffi::{c_uint, c_void};
use std::ptr::null_mut;

use chd_fake_runtime::cuda::{cudaFree, cudaMalloc, cudaSetDevice, CUDA_SUCCESS};
use chd_fake_runtime::nvml::*;

const ENV: &[(&str, &str)] = &[
    ("CHD_FAKE_DEVICE_COUNT", "2"),
    ("CHD_FAKE_BUSY_DEVICES", "1"),
    ("CHD_FAKE_NVML_OWN_PID", "123456"),
];

fn processes(index: c_uint) -> Vec<(c_uint, u64)> {
    let mut h = null_mut();
    let mut infos = vec![nvmlProcessInfo_t::default(); 8];
    let mut count = infos.len() as c_uint;
    // SAFETY: valid out-pointers; `infos` has `count` entries.
    unsafe {
        assert_eq!(nvmlDeviceGetHandleByIndex_v2(index, &mut h), NVML_SUCCESS);
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses_v3(h, &mut count, infos.as_mut_ptr()),
            NVML_SUCCESS
        );
    }
    infos.truncate(count as usize);
    infos.iter().map(|p| (p.pid, p.usedGpuMemory)).collect()
}

#[test]
fn own_allocations_are_listed_under_the_configured_pid() {
    let _g = common::setup(ENV);
    let (mut p0, mut p1): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
    // SAFETY: no arguments / valid out-pointers; both freed below.
    unsafe {
        assert_eq!(nvmlInit_v2(), NVML_SUCCESS);
        assert_eq!(cudaSetDevice(0), CUDA_SUCCESS);
        assert_eq!(cudaMalloc(&mut p0, 4096), CUDA_SUCCESS);
        assert_eq!(cudaSetDevice(1), CUDA_SUCCESS);
        assert_eq!(cudaMalloc(&mut p1, 8192), CUDA_SUCCESS);
    }
    assert_ne!(std::process::id(), 123456);
    assert_eq!(processes(0), [(123456, 4096)]);
    assert_eq!(processes(1), [(4242, 1 << 30), (123456, 8192)]);
    // SAFETY: allocated above.
    unsafe { assert_eq!((cudaFree(p0), cudaFree(p1)), (CUDA_SUCCESS, CUDA_SUCCESS)) };
    assert!(processes(0).is_empty());
    // SAFETY: initialized above.
    assert_eq!(unsafe { nvmlShutdown() }, NVML_SUCCESS);
}
