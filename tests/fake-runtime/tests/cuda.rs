//! CUDA runtime role: copies, virtual timing, per-device bandwidth, failing devices,
//! validation, error strings and the pinned-allocation counter.

mod common;

use std::ffi::{c_void, CStr};
use std::ptr::{null, null_mut};

use chd_fake_runtime::cuda::*;
use chd_fake_runtime::hooks::*;
use common::{assert_close, expected_ms, pattern};

const ENV: &[(&str, &str)] = &[
    ("CHD_FAKE_DEVICE_COUNT", "8"),
    ("CHD_FAKE_H2D_GBPS", "58.9;1=12.3;3=35"),
    ("CHD_FAKE_D2D_GBPS", "1=250"),
    ("CHD_FAKE_FAIL_DEVICES", "5"),
    ("CHD_FAKE_PCI_BUS_IDS", "0000:1a:00.0"),
];

fn setup() -> std::sync::MutexGuard<'static, ()> {
    common::setup(ENV)
}

const MIB64: usize = 64 << 20;

struct Buffers {
    host: *mut c_void,
    dev: *mut c_void,
    len: usize,
}

impl Buffers {
    /// Pinned host buffer + device buffer on `device` (which becomes current).
    fn new(device: i32, len: usize) -> Self {
        let mut host = null_mut();
        let mut dev = null_mut();
        // SAFETY: valid out-pointers.
        unsafe {
            assert_eq!(cudaSetDevice(device), CUDA_SUCCESS);
            assert_eq!(cudaMallocHost(&mut host, len), CUDA_SUCCESS);
            assert_eq!(cudaMalloc(&mut dev, len), CUDA_SUCCESS);
        }
        assert!(!host.is_null() && !dev.is_null());
        assert_eq!(host as usize % 4096, 0, "pinned memory is page-aligned");
        Buffers { host, dev, len }
    }

    fn host_bytes(&mut self) -> &mut [u8] {
        // SAFETY: `host` is a live allocation of `len` bytes owned by this struct.
        unsafe { std::slice::from_raw_parts_mut(self.host.cast(), self.len) }
    }
}

impl Drop for Buffers {
    fn drop(&mut self) {
        // SAFETY: both were allocated in `new` and are freed once.
        let rcs = unsafe { (cudaFreeHost(self.host), cudaFree(self.dev)) };
        if !std::thread::panicking() {
            assert_eq!(rcs, (CUDA_SUCCESS, CUDA_SUCCESS));
        }
    }
}

/// Times one copy of `len` bytes with events on a fresh stream; returns ms.
fn timed_copy(dst: *mut c_void, src: *const c_void, len: usize, kind: i32) -> f32 {
    let (mut stream, mut start, mut end) = (null_mut(), null_mut(), null_mut());
    let mut ms = -1.0f32;
    // SAFETY: valid out-pointers; handles come from the runtime; dst/src are live buffers.
    unsafe {
        assert_eq!(cudaStreamCreateWithFlags(&mut stream, 1), CUDA_SUCCESS);
        assert_eq!(cudaEventCreate(&mut start), CUDA_SUCCESS);
        assert_eq!(cudaEventCreate(&mut end), CUDA_SUCCESS);
        assert_eq!(cudaEventRecord(start, stream), CUDA_SUCCESS);
        assert_eq!(cudaMemcpyAsync(dst, src, len, kind, stream), CUDA_SUCCESS);
        assert_eq!(cudaEventRecord(end, stream), CUDA_SUCCESS);
        assert_eq!(cudaStreamSynchronize(stream), CUDA_SUCCESS);
        assert_eq!(cudaEventSynchronize(end), CUDA_SUCCESS);
        assert_eq!(cudaEventElapsedTime(&mut ms, start, end), CUDA_SUCCESS);
        assert_eq!(cudaEventDestroy(start), CUDA_SUCCESS);
        assert_eq!(cudaEventDestroy(end), CUDA_SUCCESS);
        assert_eq!(cudaStreamDestroy(stream), CUDA_SUCCESS);
    }
    ms
}

#[test]
fn copies_really_copy_both_ways() {
    let _g = setup();
    let mut b = Buffers::new(0, 1 << 20);
    let data = pattern(b.len, 7);
    b.host_bytes().copy_from_slice(&data);
    let before = chd_fake_copies(0);
    // SAFETY: live buffers of `len` bytes.
    unsafe {
        assert_eq!(
            cudaMemcpy(b.dev, b.host, b.len, CUDA_MEMCPY_HOST_TO_DEVICE),
            CUDA_SUCCESS
        );
        b.host_bytes().fill(0);
        assert_eq!(
            cudaMemcpy(b.host, b.dev, b.len, CUDA_MEMCPY_DEVICE_TO_HOST),
            CUDA_SUCCESS
        );
    }
    assert_eq!(b.host_bytes(), &data[..]);
    // cudaMemcpyDefault infers the direction; a sub-range inside the allocation is fine.
    let other = pattern(4096, 99);
    // SAFETY: `other` is 4096 readable bytes; the device range lies inside `dev`.
    unsafe {
        let dst = b.dev.cast::<u8>().add(8192).cast();
        assert_eq!(
            cudaMemcpy(dst, other.as_ptr().cast(), 4096, CUDA_MEMCPY_DEFAULT),
            CUDA_SUCCESS
        );
        assert_eq!(
            cudaMemcpy(b.host, b.dev, b.len, CUDA_MEMCPY_DEFAULT),
            CUDA_SUCCESS
        );
    }
    assert_eq!(&b.host_bytes()[8192..8192 + 4096], &other[..]);
    assert_eq!(chd_fake_copies(0), before + 4);
}

#[test]
fn elapsed_time_matches_configured_bandwidth() {
    let _g = setup();
    let b = Buffers::new(0, MIB64);
    let want = expected_ms(MIB64, 58.9);
    assert!((want - 1.1394).abs() < 1e-3, "{want}");
    assert_close(
        timed_copy(b.dev, b.host, MIB64, CUDA_MEMCPY_HOST_TO_DEVICE),
        want,
    );
    assert_close(
        timed_copy(b.host, b.dev, MIB64, CUDA_MEMCPY_DEVICE_TO_HOST),
        want,
    );

    // Two copies between the events: twice the time. Default (NULL) stream too.
    let (mut start, mut end) = (null_mut(), null_mut());
    let mut ms = 0.0f32;
    // SAFETY: live buffers, valid out-pointers.
    unsafe {
        assert_eq!(cudaEventCreate(&mut start), CUDA_SUCCESS);
        assert_eq!(cudaEventCreateWithFlags(&mut end, 0), CUDA_SUCCESS);
        assert_eq!(cudaEventRecord(start, null_mut()), CUDA_SUCCESS);
        assert_eq!(
            cudaMemcpyAsync(b.dev, b.host, MIB64, 1, null_mut()),
            CUDA_SUCCESS
        );
        assert_eq!(cudaMemcpy(b.host, b.dev, MIB64, 2), CUDA_SUCCESS);
        assert_eq!(cudaEventRecord(end, null_mut()), CUDA_SUCCESS);
        assert_eq!(cudaDeviceSynchronize(), CUDA_SUCCESS);
        assert_eq!(cudaEventElapsedTime(&mut ms, start, end), CUDA_SUCCESS);
        assert_close(ms, 2.0 * want);
        // Reversed order gives a negative time, as on real hardware.
        assert_eq!(cudaEventElapsedTime(&mut ms, end, start), CUDA_SUCCESS);
        assert_close(-ms, 2.0 * want);
        cudaEventDestroy(start);
        cudaEventDestroy(end);
    }
}

#[test]
fn per_device_bandwidth_override() {
    let _g = setup();
    let b1 = Buffers::new(1, MIB64);
    assert_close(
        timed_copy(b1.dev, b1.host, MIB64, CUDA_MEMCPY_HOST_TO_DEVICE),
        expected_ms(MIB64, 12.3),
    );
    let b3 = Buffers::new(3, MIB64);
    assert_close(
        timed_copy(b3.host, b3.dev, MIB64, CUDA_MEMCPY_DEVICE_TO_HOST),
        expected_ms(MIB64, 35.0),
    );
    // Device-to-device on one device is timed at that device's CHD_FAKE_D2D_GBPS rate (not
    // its H2D rate); across devices at the
    // pair rate (CHD_FAKE_PAIR_GBPS, default 13.7) with peer access, host-staged
    // (CHD_FAKE_STAGED_GBPS, default 4) without. Each counts for both devices.
    let (c1, c3) = (chd_fake_copies(1), chd_fake_copies(3));
    let b1b = Buffers::new(1, MIB64);
    assert_close(
        timed_copy(b1b.dev, b1.dev, MIB64, CUDA_MEMCPY_DEVICE_TO_DEVICE),
        expected_ms(MIB64, 250.0),
    );
    assert_close(
        timed_copy(b3.dev, b1.dev, MIB64, CUDA_MEMCPY_DEVICE_TO_DEVICE),
        expected_ms(MIB64, 4.0),
    );
    common::cuda_peer_access(1, 3, true);
    assert_close(
        timed_copy(b3.dev, b1.dev, MIB64, CUDA_MEMCPY_DEVICE_TO_DEVICE),
        expected_ms(MIB64, 13.7),
    );
    common::cuda_peer_access(1, 3, false);
    assert_eq!((chd_fake_copies(1), chd_fake_copies(3)), (c1 + 3, c3 + 2));
}

#[test]
fn failing_device_returns_error_and_copies_nothing() {
    let _g = setup();
    let mut b = Buffers::new(5, 4096);
    b.host_bytes().fill(0xAB);
    // SAFETY: querying/clearing the thread's last error has no preconditions.
    unsafe { cudaGetLastError() };
    let before = chd_fake_copies(5);
    // SAFETY: live buffers.
    unsafe {
        assert_eq!(cudaMemcpy(b.dev, b.host, 4096, 1), CUDA_ERROR_UNKNOWN);
        assert_eq!(cudaPeekAtLastError(), CUDA_ERROR_UNKNOWN);
        assert_eq!(cudaGetLastError(), CUDA_ERROR_UNKNOWN);
        assert_eq!(cudaGetLastError(), CUDA_SUCCESS);
        b.host_bytes().fill(0);
        assert_eq!(cudaMemcpy(b.host, b.dev, 4096, 2), CUDA_ERROR_UNKNOWN);
    }
    assert!(b.host_bytes().iter().all(|&x| x == 0), "nothing was copied");
    assert_eq!(chd_fake_copies(5), before);
}

#[test]
fn invalid_arguments_are_rejected() {
    let _g = setup();
    let b = Buffers::new(0, 4096);
    let mut plain = vec![0u8; 8192];
    let mut p: *mut c_void = null_mut();
    let mut ms = 0.0f32;
    // SAFETY: every pointer is either valid or deliberately null/bogus (which the fake
    // detects without dereferencing).
    unsafe {
        assert_eq!(cudaSetDevice(8), CUDA_ERROR_INVALID_DEVICE);
        assert_eq!(cudaSetDevice(-1), CUDA_ERROR_INVALID_DEVICE);
        assert_eq!(cudaGetDeviceCount(null_mut()), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cudaMalloc(null_mut(), 16), CUDA_ERROR_INVALID_VALUE);
        // Device range overrunning its allocation.
        assert_eq!(
            cudaMemcpy(b.dev, plain.as_ptr().cast(), 8192, 1),
            CUDA_ERROR_INVALID_VALUE
        );
        // Host-to-host and direction contradicting the pointers.
        let hp = plain.as_mut_ptr().cast::<c_void>();
        assert_eq!(
            cudaMemcpy(hp, b.host, 16, CUDA_MEMCPY_DEFAULT),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cudaMemcpy(hp, b.host, 16, CUDA_MEMCPY_HOST_TO_HOST),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cudaMemcpy(b.host, b.dev, 16, CUDA_MEMCPY_HOST_TO_DEVICE),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(cudaMemcpy(b.dev, null(), 16, 1), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(
            cudaMemcpy(b.dev, b.host, 16, 7),
            CUDA_ERROR_INVALID_MEMCPY_DIRECTION
        );
        // Unknown handles and pointers.
        let bogus = 0x1234_5678usize as *mut c_void;
        assert_eq!(
            cudaMemcpyAsync(b.dev, b.host, 16, 1, bogus),
            CUDA_ERROR_INVALID_RESOURCE_HANDLE
        );
        assert_eq!(cudaStreamDestroy(bogus), CUDA_ERROR_INVALID_RESOURCE_HANDLE);
        assert_eq!(
            cudaEventRecord(bogus, null_mut()),
            CUDA_ERROR_INVALID_RESOURCE_HANDLE
        );
        assert_eq!(cudaFree(hp), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cudaFreeHost(b.dev), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cudaFree(null_mut()), CUDA_SUCCESS);
        // Events never recorded, or without timing.
        let (mut e0, mut e1, mut nt) = (null_mut(), null_mut(), null_mut());
        assert_eq!(cudaEventCreate(&mut e0), CUDA_SUCCESS);
        assert_eq!(cudaEventCreate(&mut e1), CUDA_SUCCESS);
        assert_eq!(
            cudaEventCreateWithFlags(&mut nt, CUDA_EVENT_DISABLE_TIMING),
            CUDA_SUCCESS
        );
        assert_eq!(
            cudaEventElapsedTime(&mut ms, e0, e1),
            CUDA_ERROR_INVALID_RESOURCE_HANDLE
        );
        assert_eq!(cudaEventRecord(e0, null_mut()), CUDA_SUCCESS);
        assert_eq!(cudaEventRecord(nt, null_mut()), CUDA_SUCCESS);
        assert_eq!(
            cudaEventElapsedTime(&mut ms, e0, nt),
            CUDA_ERROR_INVALID_RESOURCE_HANDLE
        );
        assert_eq!(
            cudaEventElapsedTime(null_mut(), e0, e0),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(cudaEventElapsedTime(&mut ms, e0, e0), CUDA_SUCCESS);
        assert_eq!(ms, 0.0);
        for e in [e0, e1, nt] {
            assert_eq!(cudaEventDestroy(e), CUDA_SUCCESS);
        }
        assert_eq!(cudaEventDestroy(e0), CUDA_ERROR_INVALID_RESOURCE_HANDLE);
        // Zero-size cudaMalloc yields NULL and is not tracked.
        let live = chd_fake_live_device_allocations();
        assert_eq!(cudaMalloc(&mut p, 0), CUDA_SUCCESS);
        assert!(p.is_null());
        assert_eq!(chd_fake_live_device_allocations(), live);
        // More than the device has.
        assert_eq!(cudaMalloc(&mut p, 142 << 30), CUDA_ERROR_MEMORY_ALLOCATION);
        cudaGetLastError();
    }
}

#[test]
fn device_queries_and_error_strings() {
    let _g = setup();
    let mut n = 0;
    let mut v = 0;
    let mut props = vec![0u8; 1024];
    let mut bus = [0 as std::ffi::c_char; 64];
    // SAFETY: valid buffers of the stated sizes.
    unsafe {
        assert_eq!(cudaGetDeviceCount(&mut n), CUDA_SUCCESS);
        assert_eq!(n, 8);
        assert_eq!(cudaSetDevice(6), CUDA_SUCCESS);
        assert_eq!(cudaGetDevice(&mut v), CUDA_SUCCESS);
        assert_eq!(v, 6);
        // The current device is per thread.
        std::thread::spawn(|| {
            let mut v = -1;
            assert_eq!(cudaGetDevice(&mut v), CUDA_SUCCESS);
            assert_eq!(v, 0);
        })
        .join()
        .unwrap();
        assert_eq!(cudaRuntimeGetVersion(&mut v), CUDA_SUCCESS);
        assert_eq!(v, 12040);
        assert_eq!(cudaDriverGetVersion(&mut v), CUDA_SUCCESS);
        assert_eq!(v, 12040);
        assert_eq!(
            cudaGetDeviceProperties(props.as_mut_ptr().cast(), 2),
            CUDA_SUCCESS
        );
        assert_eq!(
            CStr::from_bytes_until_nul(&props)
                .unwrap()
                .to_str()
                .unwrap(),
            "Fake H200"
        );
        assert!(
            props[256..].iter().all(|&b| b == 0),
            "only name[256] is written"
        );
        assert_eq!(
            cudaGetDeviceProperties_v2(props.as_mut_ptr().cast(), 9),
            CUDA_ERROR_INVALID_DEVICE
        );
        assert_eq!(cudaDeviceGetPCIBusId(bus.as_mut_ptr(), 64, 0), CUDA_SUCCESS);
        assert_eq!(
            CStr::from_ptr(bus.as_ptr()).to_str().unwrap(),
            "0000:1A:00.0"
        );
        assert_eq!(cudaDeviceGetPCIBusId(bus.as_mut_ptr(), 64, 7), CUDA_SUCCESS);
        assert_eq!(
            CStr::from_ptr(bus.as_ptr()).to_str().unwrap(),
            "0000:17:00.0"
        );
        assert_eq!(cudaDeviceGetPCIBusId(bus.as_mut_ptr(), 5, 7), CUDA_SUCCESS);
        assert_eq!(CStr::from_ptr(bus.as_ptr()).to_str().unwrap(), "0000");
        let s = |p: *const std::ffi::c_char| CStr::from_ptr(p).to_str().unwrap().to_owned();
        assert_eq!(s(cudaGetErrorString(0)), "no error");
        assert_eq!(s(cudaGetErrorName(0)), "cudaSuccess");
        assert_eq!(s(cudaGetErrorString(1)), "invalid argument");
        assert_eq!(s(cudaGetErrorName(1)), "cudaErrorInvalidValue");
        assert_eq!(s(cudaGetErrorString(2)), "out of memory");
        assert_eq!(s(cudaGetErrorString(101)), "invalid device ordinal");
        assert_eq!(s(cudaGetErrorString(400)), "invalid resource handle");
        assert_eq!(s(cudaGetErrorString(999)), "unknown error");
        assert_eq!(s(cudaGetErrorName(999)), "cudaErrorUnknown");
        assert_eq!(cudaSetDevice(0), CUDA_SUCCESS);
    }
}

#[test]
fn pinned_allocation_counter_returns_to_zero() {
    let _g = setup();
    assert_eq!(chd_fake_live_pinned_allocations(), 0);
    assert_eq!(chd_fake_live_device_allocations(), 0);
    let mut ptrs = [null_mut(); 3];
    // SAFETY: valid out-pointers; each pointer is freed once.
    unsafe {
        assert_eq!(cudaHostAlloc(&mut ptrs[0], 100, 0), CUDA_SUCCESS);
        assert_eq!(cudaHostAlloc(&mut ptrs[1], 1 << 20, 1 | 2), CUDA_SUCCESS);
        assert_eq!(cudaMallocHost(&mut ptrs[2], 4096), CUDA_SUCCESS);
        assert_eq!(chd_fake_live_pinned_allocations(), 3);
        for p in ptrs {
            assert_eq!(cudaFreeHost(p), CUDA_SUCCESS);
        }
        assert_eq!(
            cudaFreeHost(ptrs[0]),
            CUDA_ERROR_INVALID_VALUE,
            "double free"
        );
        cudaGetLastError();
    }
    assert_eq!(chd_fake_live_pinned_allocations(), 0);
}
