//! Same-device device-to-device copies (HBM to HBM) run at `CHD_FAKE_D2D_GBPS` (a default and
//! per-device overrides), not at the device's H2D rate, and no `CHD_FAKE_SLOW_CPUS` rule
//! applies to them; CUDA and ACL alike. Device load is in `cublas.rs`.

mod common;

use std::ffi::c_void;
use std::ptr::null_mut;

use chd_fake_runtime::acl::*;
use chd_fake_runtime::cuda::*;
use chd_fake_runtime::hooks::*;
use common::{assert_close, expected_ms};

const ENV: &[(&str, &str)] = &[
    ("CHD_FAKE_DEVICE_COUNT", "4"),
    ("CHD_FAKE_H2D_GBPS", "50;2=20"),
    ("CHD_FAKE_D2D_GBPS", "300;2=90"),
    // Every CPU: would slow device 1's copies if it applied to same-device ones.
    ("CHD_FAKE_SLOW_CPUS", "1@0-100000=3"),
];

const LEN: usize = 16 << 20;

/// Milliseconds of one CUDA copy `src` -> `dst` of kind `kind` on a new stream of `device`.
fn cuda_ms(device: i32, dst: *mut c_void, src: *const c_void, kind: i32) -> f32 {
    let (mut stream, mut start, mut end) = (null_mut(), null_mut(), null_mut());
    let mut ms = 0f32;
    // SAFETY: valid out-pointers; the buffers are live allocations of LEN bytes.
    unsafe {
        assert_eq!(cudaSetDevice(device), CUDA_SUCCESS);
        assert_eq!(cudaStreamCreate(&mut stream), CUDA_SUCCESS);
        assert_eq!(cudaEventCreate(&mut start), CUDA_SUCCESS);
        assert_eq!(cudaEventCreate(&mut end), CUDA_SUCCESS);
        assert_eq!(cudaEventRecord(start, stream), CUDA_SUCCESS);
        assert_eq!(cudaMemcpyAsync(dst, src, LEN, kind, stream), CUDA_SUCCESS);
        assert_eq!(cudaEventRecord(end, stream), CUDA_SUCCESS);
        assert_eq!(cudaEventElapsedTime(&mut ms, start, end), CUDA_SUCCESS);
        cudaEventDestroy(start);
        cudaEventDestroy(end);
        cudaStreamDestroy(stream);
    }
    ms
}

fn cuda_alloc(device: i32) -> *mut c_void {
    let mut p = null_mut();
    // SAFETY: valid out-pointer.
    unsafe {
        assert_eq!(cudaSetDevice(device), CUDA_SUCCESS);
        assert_eq!(cudaMalloc(&mut p, LEN), CUDA_SUCCESS);
    }
    p
}

#[test]
fn cuda_same_device_copies_run_at_the_device_copy_rate() {
    let _g = common::setup(ENV);
    let mut host = vec![7u8; LEN];
    for (device, d2d, h2d) in [(0, 300.0, 50.0), (1, 300.0, 3.0), (2, 90.0, 20.0)] {
        let (a, b) = (cuda_alloc(device), cuda_alloc(device));
        let before = chd_fake_copies(device);
        assert_close(
            cuda_ms(device, b, a, CUDA_MEMCPY_DEVICE_TO_DEVICE),
            expected_ms(LEN, d2d),
        );
        // Inferred (cudaMemcpyDefault) from two pointers of one device: the same.
        assert_close(cuda_ms(device, b, a, 4), expected_ms(LEN, d2d));
        // Host to device keeps its own rate (device 1: the CPU rule).
        assert_close(
            cuda_ms(
                device,
                a,
                host.as_mut_ptr().cast(),
                CUDA_MEMCPY_HOST_TO_DEVICE,
            ),
            expected_ms(LEN, h2d),
        );
        assert_eq!(chd_fake_copies(device), before + 3);
        // SAFETY: allocated above, freed once.
        unsafe {
            assert_eq!(cudaFree(a), CUDA_SUCCESS);
            assert_eq!(cudaFree(b), CUDA_SUCCESS);
        }
    }
}

#[test]
fn acl_same_device_copies_run_at_the_device_copy_rate() {
    let _g = common::setup(ENV);
    let (mut a, mut b, mut stream, mut start, mut end) =
        (null_mut(), null_mut(), null_mut(), null_mut(), null_mut());
    let mut ms = 0f32;
    // SAFETY: valid out-pointers; both buffers are live aclrtMalloc allocations of LEN bytes.
    unsafe {
        assert_eq!(aclrtSetDevice(2), ACL_SUCCESS);
        assert_eq!(aclrtMalloc(&mut a, LEN, 0), ACL_SUCCESS);
        assert_eq!(aclrtMalloc(&mut b, LEN, 0), ACL_SUCCESS);
        assert_eq!(aclrtCreateStream(&mut stream), ACL_SUCCESS);
        assert_eq!(aclrtCreateEvent(&mut start), ACL_SUCCESS);
        assert_eq!(aclrtCreateEvent(&mut end), ACL_SUCCESS);
        assert_eq!(aclrtRecordEvent(start, stream), ACL_SUCCESS);
        assert_eq!(aclrtMemcpyAsync(b, LEN, a, LEN, 3, stream), ACL_SUCCESS);
        assert_eq!(aclrtRecordEvent(end, stream), ACL_SUCCESS);
        assert_eq!(aclrtSynchronizeStream(stream), ACL_SUCCESS);
        assert_eq!(aclrtEventElapsedTime(&mut ms, start, end), ACL_SUCCESS);
        assert_eq!(aclrtDestroyEvent(start), ACL_SUCCESS);
        assert_eq!(aclrtDestroyEvent(end), ACL_SUCCESS);
        assert_eq!(aclrtDestroyStream(stream), ACL_SUCCESS);
        assert_eq!(aclrtFree(a), ACL_SUCCESS);
        assert_eq!(aclrtFree(b), ACL_SUCCESS);
    }
    assert_close(ms, expected_ms(LEN, 90.0));
}
