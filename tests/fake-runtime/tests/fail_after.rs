//! `CHD_FAKE_FAIL_AFTER`: a failing device lets the first N copies of each stream through, so
//! a caller can be made to fail in the middle of a sequence of enqueued copies.

mod common;

use std::ffi::c_void;
use std::ptr::null_mut;

use chd_fake_runtime::acl::*;
use chd_fake_runtime::cuda::{self, CUDA_ERROR_UNKNOWN, CUDA_SUCCESS};

const ENV: &[(&str, &str)] = &[
    ("CHD_FAKE_DEVICE_COUNT", "2"),
    ("CHD_FAKE_FAIL_DEVICES", "1"),
    ("CHD_FAKE_FAIL_AFTER", "2"),
];

/// Results of `n` host-to-device copies of 4 KiB on a fresh ACL stream of `device`.
fn acl_copies(device: i32, n: usize) -> Vec<AclError> {
    let (mut host, mut dev, mut stream): (*mut c_void, *mut c_void, *mut c_void) =
        (null_mut(), null_mut(), null_mut());
    // SAFETY: valid out-pointers; buffers of 4096 bytes, released at the end.
    unsafe {
        assert_eq!(aclrtSetDevice(device), ACL_SUCCESS);
        assert_eq!(aclrtMallocHost(&mut host, 4096), ACL_SUCCESS);
        assert_eq!(aclrtMalloc(&mut dev, 4096, 0), ACL_SUCCESS);
        assert_eq!(aclrtCreateStream(&mut stream), ACL_SUCCESS);
        let rcs = (0..n)
            .map(|_| aclrtMemcpyAsync(dev, 4096, host, 4096, 1, stream))
            .collect();
        assert_eq!(aclrtSynchronizeStream(stream), ACL_SUCCESS);
        assert_eq!(aclrtDestroyStream(stream), ACL_SUCCESS);
        assert_eq!((aclrtFree(dev), aclrtFreeHost(host)), (0, 0));
        rcs
    }
}

#[test]
fn the_first_copies_of_each_stream_pass_then_the_device_fails() {
    let _g = common::setup(ENV);
    let ok_then_fail = vec![
        ACL_SUCCESS,
        ACL_SUCCESS,
        ACL_ERROR_RT_SYS_DMA,
        ACL_ERROR_RT_SYS_DMA,
    ];
    assert_eq!(acl_copies(1, 4), ok_then_fail);
    // Counted per stream: a new stream starts over; other devices never fail.
    assert_eq!(acl_copies(1, 4), ok_then_fail);
    assert_eq!(acl_copies(0, 4), vec![ACL_SUCCESS; 4]);

    // CUDA alike.
    let (mut dev, mut stream): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
    let host = vec![0u8; 4096];
    // SAFETY: valid out-pointers; `host` and `dev` hold 4096 bytes.
    unsafe {
        assert_eq!(cuda::cudaSetDevice(1), CUDA_SUCCESS);
        assert_eq!(cuda::cudaMalloc(&mut dev, 4096), CUDA_SUCCESS);
        assert_eq!(cuda::cudaStreamCreate(&mut stream), CUDA_SUCCESS);
        let rcs: Vec<_> = (0..3)
            .map(|_| cuda::cudaMemcpyAsync(dev, host.as_ptr().cast(), 4096, 1, stream))
            .collect();
        assert_eq!(rcs, [CUDA_SUCCESS, CUDA_SUCCESS, CUDA_ERROR_UNKNOWN]);
        assert_eq!(cuda::cudaStreamSynchronize(stream), CUDA_SUCCESS);
        assert_eq!(cuda::cudaStreamDestroy(stream), CUDA_SUCCESS);
        assert_eq!(cuda::cudaFree(dev), CUDA_SUCCESS);
    }
}
