//! The cost model (`CHD_FAKE_PIN_MS_PER_MIB`, copies at their GB/s) and the portability of
//! CUDA pinned memory: `chd_fake_simulated_ns` adds the pinning cost of every pinned host
//! allocation and the virtual duration of every timed copy; `chd_fake_unportable_pinned_copies`
//! counts copies whose host side is pinned for another device only.

mod common;

use std::ffi::c_void;
use std::ptr::null_mut;

use chd_fake_runtime::acl::*;
use chd_fake_runtime::cuda::*;
use chd_fake_runtime::hooks::*;

const MIB: usize = 1 << 20;

fn setup() -> std::sync::MutexGuard<'static, ()> {
    common::setup(&[
        ("CHD_FAKE_PIN_MS_PER_MIB", "0.5"),
        ("CHD_FAKE_H2D_GBPS", "50"),
    ])
}

/// Runs `f` and returns how much simulated time it cost, in nanoseconds.
fn cost_of(f: impl FnOnce()) -> u64 {
    let before = chd_fake_simulated_ns();
    f();
    chd_fake_simulated_ns() - before
}

#[test]
fn pinned_allocations_cost_per_mib_and_are_counted() {
    let _g = setup();
    let total = chd_fake_pinned_allocations_total();
    let mut p = null_mut::<c_void>();
    // SAFETY: valid out-pointers; each allocation is freed once.
    unsafe {
        let ns = cost_of(|| assert_eq!(cudaHostAlloc(&mut p, 4 * MIB, 1), CUDA_SUCCESS));
        assert_eq!(ns, 2_000_000, "4 MiB at 0.5 ms/MiB");
        assert_eq!(cudaFreeHost(p), CUDA_SUCCESS);
        let ns = cost_of(|| assert_eq!(aclrtMallocHost(&mut p, 2 * MIB), ACL_SUCCESS));
        assert_eq!(ns, 1_000_000, "2 MiB at 0.5 ms/MiB");
        assert_eq!(aclrtFreeHost(p), ACL_SUCCESS);
        // Device memory is not pinned host memory: free of pinning cost.
        let ns = cost_of(|| assert_eq!(cudaMalloc(&mut p, 8 * MIB), CUDA_SUCCESS));
        assert_eq!(ns, 0);
        assert_eq!(cudaFree(p), CUDA_SUCCESS);
    }
    assert_eq!(chd_fake_pinned_allocations_total(), total + 2);
}

/// Copies `len` bytes from `host` to a fresh buffer on `device` on a new stream.
///
/// # Safety
/// `host` must be valid for `len` bytes.
unsafe fn h2d(device: i32, host: *mut c_void, len: usize) {
    let (mut dev, mut stream) = (null_mut::<c_void>(), null_mut::<c_void>());
    // SAFETY: valid out-pointers; the caller's host range is valid; freed at the end.
    unsafe {
        assert_eq!(cudaSetDevice(device), CUDA_SUCCESS);
        assert_eq!(cudaMalloc(&mut dev, len), CUDA_SUCCESS);
        assert_eq!(cudaStreamCreate(&mut stream), CUDA_SUCCESS);
        assert_eq!(cudaMemcpyAsync(dev, host, len, 1, stream), CUDA_SUCCESS);
        assert_eq!(cudaStreamSynchronize(stream), CUDA_SUCCESS);
        assert_eq!(cudaStreamDestroy(stream), CUDA_SUCCESS);
        assert_eq!(cudaFree(dev), CUDA_SUCCESS);
    }
}

#[test]
fn copies_cost_their_duration() {
    let _g = setup();
    let mut host = null_mut::<c_void>();
    // SAFETY: valid out-pointer; `host` spans 8 MiB until freed.
    unsafe {
        assert_eq!(cudaHostAlloc(&mut host, 8 * MIB, 1), CUDA_SUCCESS);
        let ns = cost_of(|| h2d(0, host, 8 * MIB));
        // 8 MiB at 50 GB/s (rounded to whole nanoseconds).
        let want = (8 * MIB) as f64 / 50.0;
        assert!((ns as f64 - want).abs() <= 1.0, "{ns} ns, want {want}");
        assert_eq!(cudaFreeHost(host), CUDA_SUCCESS);
    }
}

#[test]
fn pinned_memory_of_another_device_is_counted_unless_portable() {
    let _g = setup();
    let (mut home_only, mut portable) = (null_mut::<c_void>(), null_mut::<c_void>());
    // SAFETY: valid out-pointers; both buffers span 1 MiB until freed.
    unsafe {
        assert_eq!(cudaSetDevice(0), CUDA_SUCCESS);
        assert_eq!(cudaMallocHost(&mut home_only, MIB), CUDA_SUCCESS);
        assert_eq!(cudaHostAlloc(&mut portable, MIB, 1), CUDA_SUCCESS);
        let before = chd_fake_unportable_pinned_copies();
        h2d(0, home_only, MIB);
        assert_eq!(
            chd_fake_unportable_pinned_copies(),
            before,
            "its own device"
        );
        h2d(1, portable, MIB);
        h2d(2, portable, MIB);
        assert_eq!(chd_fake_unportable_pinned_copies(), before, "portable");
        h2d(1, home_only, MIB);
        assert_eq!(chd_fake_unportable_pinned_copies(), before + 1);
        assert_eq!(cudaFreeHost(home_only), CUDA_SUCCESS);
        assert_eq!(cudaFreeHost(portable), CUDA_SUCCESS);
    }
}
