//! The size-curve model: `CHD_FAKE_COPY_LATENCY_US` adds a fixed virtual time to every timed
//! copy (so small copies read slower: a knee), and `CHD_FAKE_SIZE_DIP` slows copies of exactly
//! one size (a planted dip), for host-to-device, device-to-host and same-device copies alike,
//! as events on the copy's stream measure them.

mod common;

use std::ffi::c_void;
use std::ptr::null_mut;

use chd_fake_runtime::cuda::*;

const MIB: usize = 1 << 20;
const GBPS: f64 = 10.0;
const LATENCY_MS: f64 = 0.020;

fn setup() -> std::sync::MutexGuard<'static, ()> {
    common::setup(&[
        ("CHD_FAKE_H2D_GBPS", "10"),
        // Same-device copies have a rate of their own: the same here, so one curve fits all.
        ("CHD_FAKE_D2D_GBPS", "10"),
        ("CHD_FAKE_COPY_LATENCY_US", "20"),
        ("CHD_FAKE_SIZE_DIP", "2MiB=0.25"),
    ])
}

/// Milliseconds one copy of `len` bytes of `kind` (1 H2D, 2 D2H, 3 D2D) takes on device 0,
/// between two events on its stream.
///
/// # Safety
/// Calls into the fake with buffers it allocates and frees itself.
unsafe fn timed_copy(kind: i32, len: usize) -> f32 {
    let (mut host, mut a, mut b) = (null_mut::<c_void>(), null_mut::<c_void>(), null_mut());
    let (mut stream, mut start, mut stop) = (null_mut::<c_void>(), null_mut(), null_mut());
    let mut ms = 0f32;
    // SAFETY: valid out-pointers; every buffer spans `len` bytes until freed below.
    unsafe {
        assert_eq!(cudaSetDevice(0), CUDA_SUCCESS);
        assert_eq!(cudaHostAlloc(&mut host, len, 1), CUDA_SUCCESS);
        assert_eq!(cudaMalloc(&mut a, len), CUDA_SUCCESS);
        assert_eq!(cudaMalloc(&mut b, len), CUDA_SUCCESS);
        assert_eq!(cudaStreamCreate(&mut stream), CUDA_SUCCESS);
        assert_eq!(cudaEventCreate(&mut start), CUDA_SUCCESS);
        assert_eq!(cudaEventCreate(&mut stop), CUDA_SUCCESS);
        let (dst, src) = match kind {
            1 => (a, host.cast_const()),
            2 => (host, a.cast_const()),
            _ => (b, a.cast_const()),
        };
        assert_eq!(cudaEventRecord(start, stream), CUDA_SUCCESS);
        assert_eq!(cudaMemcpyAsync(dst, src, len, kind, stream), CUDA_SUCCESS);
        assert_eq!(cudaEventRecord(stop, stream), CUDA_SUCCESS);
        assert_eq!(cudaEventSynchronize(stop), CUDA_SUCCESS);
        assert_eq!(cudaEventElapsedTime(&mut ms, start, stop), CUDA_SUCCESS);
        assert_eq!(cudaEventDestroy(start), CUDA_SUCCESS);
        assert_eq!(cudaEventDestroy(stop), CUDA_SUCCESS);
        assert_eq!(cudaStreamDestroy(stream), CUDA_SUCCESS);
        assert_eq!(cudaFree(a), CUDA_SUCCESS);
        assert_eq!(cudaFree(b), CUDA_SUCCESS);
        assert_eq!(cudaFreeHost(host), CUDA_SUCCESS);
    }
    ms
}

#[test]
fn every_copy_kind_pays_the_latency_and_the_planted_size_dips() {
    let _g = setup();
    for kind in [1, 2, 3] {
        // SAFETY: the helper owns its buffers.
        let (small, large, dipped) = unsafe {
            (
                timed_copy(kind, MIB / 4),
                timed_copy(kind, 4 * MIB),
                timed_copy(kind, 2 * MIB),
            )
        };
        common::assert_close(small, common::expected_ms(MIB / 4, GBPS) + LATENCY_MS);
        common::assert_close(large, common::expected_ms(4 * MIB, GBPS) + LATENCY_MS);
        // 2 MiB at a quarter of the rate.
        common::assert_close(
            dipped,
            common::expected_ms(2 * MIB, GBPS / 4.0) + LATENCY_MS,
        );
        // The knee: a 256 KiB copy reads well below the rate, a 4 MiB copy close to it.
        let rate = |bytes: usize, ms: f32| bytes as f64 / (f64::from(ms) * 1e-3) / 1e9;
        assert!(rate(MIB / 4, small) < 0.9 * GBPS, "kind {kind}");
        assert!(rate(4 * MIB, large) > 0.95 * GBPS, "kind {kind}");
        assert!(rate(2 * MIB, dipped) < 0.3 * GBPS, "kind {kind}");
    }
}
