//! `CHD_FAKE_SLOW_CPUS`: a copy's bandwidth depends on the CPU the issuing thread runs on.
//! The test thread is bound with `sched_setaffinity` to CPU 0 (or, where CPU 0 is not in
//! this process's allowed set, the first allowed CPU) before the configuration is read.

mod common;

use std::ffi::c_void;
use std::ptr::null_mut;

use chd_fake_runtime::cuda::*;
use common::{allowed_cpus, assert_close, bind_to, expected_ms};

fn copy_ms(device: i32, len: usize) -> f32 {
    let (mut host, mut dev, mut stream, mut e0, mut e1) = (
        null_mut::<c_void>(),
        null_mut(),
        null_mut(),
        null_mut(),
        null_mut(),
    );
    let mut ms = 0.0;
    // SAFETY: valid out-pointers; buffers of `len` bytes; everything freed at the end.
    unsafe {
        assert_eq!(cudaSetDevice(device), CUDA_SUCCESS);
        assert_eq!(cudaMallocHost(&mut host, len), CUDA_SUCCESS);
        assert_eq!(cudaMalloc(&mut dev, len), CUDA_SUCCESS);
        assert_eq!(cudaStreamCreate(&mut stream), CUDA_SUCCESS);
        assert_eq!(cudaEventCreate(&mut e0), CUDA_SUCCESS);
        assert_eq!(cudaEventCreate(&mut e1), CUDA_SUCCESS);
        assert_eq!(cudaEventRecord(e0, stream), CUDA_SUCCESS);
        assert_eq!(cudaMemcpyAsync(dev, host, len, 1, stream), CUDA_SUCCESS);
        assert_eq!(cudaEventRecord(e1, stream), CUDA_SUCCESS);
        assert_eq!(cudaEventElapsedTime(&mut ms, e0, e1), CUDA_SUCCESS);
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        cudaStreamDestroy(stream);
        assert_eq!(cudaFree(dev), CUDA_SUCCESS);
        assert_eq!(cudaFreeHost(host), CUDA_SUCCESS);
    }
    ms
}

#[test]
fn slow_cpu_segment_overrides_device_bandwidth() {
    let cpus = allowed_cpus();
    let slow = if cpus.contains(&0) { 0 } else { cpus[0] };
    let rule = format!("0@{slow}-{slow}=5");
    let _g = common::setup(&[
        ("CHD_FAKE_SLOW_CPUS", rule.as_str()),
        ("CHD_FAKE_H2D_GBPS", "58.9;0=40"),
    ]);
    let len = 64 << 20;

    bind_to(slow);
    // Device 0 from the slow CPU: the rule wins over CHD_FAKE_H2D_GBPS.
    assert_close(copy_ms(0, len), expected_ms(len, 5.0));
    // Another device from the same CPU: unaffected.
    assert_close(copy_ms(1, len), expected_ms(len, 58.9));

    // Device 0 from any other CPU: the per-device rate.
    match cpus.iter().find(|&&c| c != slow) {
        Some(&other) => {
            bind_to(other);
            assert_close(copy_ms(0, len), expected_ms(len, 40.0));
        }
        None => eprintln!("only one CPU allowed; skipping the fast-CPU half"),
    }
}
