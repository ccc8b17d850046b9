//! `CHD_FAKE_ENQUEUE_US` and the latches that hide it. Each enqueue call costs the calling
//! thread 10 us of host time and an idle stream starts what it gets at once, so events around
//! ten 128 KiB copies at 20 GB/s (6.55 us each) measure the host's enqueue rate; a stream held
//! by `cuStreamWaitValue32` (reached through `cudaGetDriverEntryPointByVersion`, as a driver
//! function) or by a host function until everything is enqueued measures the link. The
//! vendors' rules around latches are enforced: a latch nobody releases never drains (a
//! synchronize gives up and counts it), a host function may not call the API, and the word a
//! stream waits on may not be freed.

mod common;

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU32, Ordering};

use chd_fake_runtime::cuda::*;
use chd_fake_runtime::hooks;

const LEN: usize = 128 << 10;
const GBPS: f64 = 20.0;
const COPIES: usize = 10;
const ENQUEUE_MS: f64 = 0.010;

type WaitValue = unsafe extern "C" fn(*mut c_void, u64, u32, c_uint) -> c_int;

fn setup() -> std::sync::MutexGuard<'static, ()> {
    common::setup(&[("CHD_FAKE_H2D_GBPS", "20"), ("CHD_FAKE_ENQUEUE_US", "10")])
}

/// A stream on device 0 with a pinned buffer and a device buffer of `LEN` bytes, two events,
/// and a pinned 4-byte word to latch on.
struct Rig {
    host: *mut c_void,
    dev: *mut c_void,
    flag: *mut c_void,
    stream: *mut c_void,
    start: *mut c_void,
    stop: *mut c_void,
}

impl Rig {
    fn new() -> Rig {
        let mut r = Rig {
            host: null_mut(),
            dev: null_mut(),
            flag: null_mut(),
            stream: null_mut(),
            start: null_mut(),
            stop: null_mut(),
        };
        // SAFETY: valid out-pointers; the buffers live until `drop`.
        unsafe {
            assert_eq!(cudaSetDevice(0), CUDA_SUCCESS);
            assert_eq!(cudaHostAlloc(&mut r.host, LEN, 1), CUDA_SUCCESS);
            // cudaHostAllocPortable | cudaHostAllocMapped.
            assert_eq!(cudaHostAlloc(&mut r.flag, 4, 3), CUDA_SUCCESS);
            assert_eq!(cudaMalloc(&mut r.dev, LEN), CUDA_SUCCESS);
            assert_eq!(cudaStreamCreateWithFlags(&mut r.stream, 1), CUDA_SUCCESS);
            assert_eq!(cudaEventCreate(&mut r.start), CUDA_SUCCESS);
            assert_eq!(cudaEventCreate(&mut r.stop), CUDA_SUCCESS);
            // One warm-up copy, drained: the host clock is past it.
            assert_eq!(
                cudaMemcpyAsync(r.dev, r.host, LEN, 1, r.stream),
                CUDA_SUCCESS
            );
            assert_eq!(cudaStreamSynchronize(r.stream), CUDA_SUCCESS);
        }
        r
    }

    fn flag(&self) -> &AtomicU32 {
        // SAFETY: a live, page-aligned pinned allocation of at least 4 bytes.
        unsafe { &*self.flag.cast::<AtomicU32>() }
    }

    /// Records the start event, enqueues the copies and the stop event; returns nothing.
    fn enqueue_timed(&self) {
        // SAFETY: live handles and buffers of `LEN` bytes.
        unsafe {
            assert_eq!(cudaEventRecord(self.start, self.stream), CUDA_SUCCESS);
            for _ in 0..COPIES {
                assert_eq!(
                    cudaMemcpyAsync(self.dev, self.host, LEN, 1, self.stream),
                    CUDA_SUCCESS
                );
            }
            assert_eq!(cudaEventRecord(self.stop, self.stream), CUDA_SUCCESS);
        }
    }

    /// GB/s the events measured, once the stop event completed.
    fn gbps(&self) -> f64 {
        let mut ms = 0f32;
        // SAFETY: live events.
        unsafe {
            assert_eq!(cudaEventSynchronize(self.stop), CUDA_SUCCESS);
            assert_eq!(
                cudaEventElapsedTime(&mut ms, self.start, self.stop),
                CUDA_SUCCESS
            );
        }
        (COPIES * LEN) as f64 / (f64::from(ms) * 1e-3) / 1e9
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        // SAFETY: everything was created in `new` and is released once.
        unsafe {
            cudaStreamSynchronize(self.stream);
            cudaEventDestroy(self.start);
            cudaEventDestroy(self.stop);
            cudaStreamDestroy(self.stream);
            cudaFree(self.dev);
            cudaFreeHost(self.host);
            cudaFreeHost(self.flag);
        }
    }
}

fn wait_value() -> WaitValue {
    let mut f: *mut c_void = null_mut();
    let mut status: c_int = -1;
    // SAFETY: a NUL-terminated name and valid out-pointers.
    let rc = unsafe {
        cudaGetDriverEntryPointByVersion(
            c"cuStreamWaitValue32".as_ptr(),
            &mut f,
            12000,
            0,
            &mut status,
        )
    };
    assert_eq!((rc, status), (CUDA_SUCCESS, ENTRY_POINT_SUCCESS));
    assert!(!f.is_null());
    // SAFETY: the fake hands out its cuStreamWaitValue32, of this C type.
    unsafe { std::mem::transmute::<*mut c_void, WaitValue>(f) }
}

fn device_pointer(host: *mut c_void) -> u64 {
    let mut d: *mut c_void = null_mut();
    // SAFETY: valid out-pointer; `host` is CUDA pinned memory.
    let rc = unsafe { cudaHostGetDevicePointer(&mut d, host, 0) };
    assert_eq!(rc, CUDA_SUCCESS);
    d as u64
}

/// The host function latch: spins until the word it is given turns non-zero.
unsafe extern "C" fn wait_for_flag(data: *mut c_void) {
    // SAFETY: the tests pass a pointer to an AtomicU32 that outlives the stream's work.
    let flag = unsafe { &*data.cast::<AtomicU32>() };
    while flag.load(Ordering::Acquire) == 0 {
        std::hint::spin_loop();
    }
}

/// A host function that breaks the rule: it calls the CUDA API.
unsafe extern "C" fn calls_cuda(data: *mut c_void) {
    // SAFETY: `data` points to an AtomicU32 the test reads after the stream drained.
    let rc = unsafe { cudaSetDevice(0) };
    // SAFETY: as above.
    unsafe { &*data.cast::<AtomicU32>() }.store(rc as u32, Ordering::Release);
}

#[test]
fn events_on_an_idle_stream_measure_the_enqueue_rate() {
    let _g = setup();
    let rig = Rig::new();
    rig.enqueue_timed();
    let gbps = rig.gbps();
    // Eleven enqueue calls after the start event (the copies and the stop event): the copies
    // follow the host, 10 us apart.
    let calls = (COPIES + 1) as f64;
    let enqueue_rate = (COPIES * LEN) as f64 / (calls * ENQUEUE_MS * 1e-3) / 1e9;
    assert!(
        (gbps - enqueue_rate).abs() / enqueue_rate < 0.05,
        "{gbps} GB/s: not the enqueue rate {enqueue_rate}"
    );
    assert!(gbps < 0.7 * GBPS, "{gbps} GB/s");
}

#[test]
fn a_stream_held_by_cu_stream_wait_value32_measures_the_link() {
    let _g = setup();
    let rig = Rig::new();
    rig.flag().store(0, Ordering::Release);
    // SAFETY: a live stream and the device address of a pinned word.
    let rc = unsafe { wait_value()(rig.stream, device_pointer(rig.flag), 1, 0) };
    assert_eq!(rc, CU_SUCCESS);
    rig.enqueue_timed();
    let mut ms = 0f32;
    // Not done while held: the start event has not even completed.
    // SAFETY: live events.
    unsafe {
        assert_eq!(cudaEventQuery(rig.start), CUDA_ERROR_NOT_READY);
        assert_eq!(
            cudaEventElapsedTime(&mut ms, rig.start, rig.stop),
            CUDA_ERROR_INVALID_RESOURCE_HANDLE
        );
    }
    rig.flag().store(1, Ordering::Release);
    let gbps = rig.gbps();
    assert!((gbps - GBPS).abs() / GBPS < 0.01, "{gbps} GB/s");
}

#[test]
fn a_stream_held_by_a_host_function_measures_the_link() {
    let _g = setup();
    let rig = Rig::new();
    let flag = Box::new(AtomicU32::new(0));
    let data = (&*flag as *const AtomicU32).cast_mut().cast::<c_void>();
    // SAFETY: a live stream; `flag` outlives the stream's work (drained in `gbps`).
    let rc = unsafe { cudaLaunchHostFunc(rig.stream, Some(wait_for_flag), data) };
    assert_eq!(rc, CUDA_SUCCESS);
    rig.enqueue_timed();
    flag.store(1, Ordering::Release);
    let gbps = rig.gbps();
    assert!((gbps - GBPS).abs() / GBPS < 0.01, "{gbps} GB/s");
}

#[test]
fn a_latch_nobody_releases_never_drains_and_its_word_cannot_be_freed() {
    let _g = setup();
    let rig = Rig::new();
    rig.flag().store(0, Ordering::Release);
    let before = hooks::chd_fake_latch_deadlocks();
    // SAFETY: a live stream and the device address of a pinned word.
    let rc = unsafe { wait_value()(rig.stream, device_pointer(rig.flag), 1, 0) };
    assert_eq!(rc, CU_SUCCESS);
    rig.enqueue_timed();
    // SAFETY: live handles; the word is what the stream waits on.
    unsafe {
        assert_eq!(cudaStreamSynchronize(rig.stream), CUDA_ERROR_UNKNOWN);
        assert_eq!(cudaFreeHost(rig.flag), CUDA_ERROR_UNKNOWN);
    }
    assert_eq!(hooks::chd_fake_latch_deadlocks(), before + 1);
    assert!(hooks::chd_fake_frees_in_flight() >= 1);
    assert_eq!(hooks::chd_fake_held_streams(), 1);
    rig.flag().store(1, Ordering::Release);
    // SAFETY: a live stream.
    assert_eq!(unsafe { cudaStreamSynchronize(rig.stream) }, CUDA_SUCCESS);
    assert_eq!(hooks::chd_fake_held_streams(), 0);
}

#[test]
fn a_host_function_may_not_call_cuda() {
    let _g = setup();
    let rig = Rig::new();
    let got = Box::new(AtomicU32::new(u32::MAX));
    let data = (&*got as *const AtomicU32).cast_mut().cast::<c_void>();
    let before = hooks::chd_fake_host_function_api_calls();
    // SAFETY: a live stream; `got` outlives the drained stream.
    unsafe {
        assert_eq!(
            cudaLaunchHostFunc(rig.stream, Some(calls_cuda), data),
            CUDA_SUCCESS
        );
        assert_eq!(cudaStreamSynchronize(rig.stream), CUDA_SUCCESS);
    }
    assert_eq!(got.load(Ordering::Acquire), CUDA_ERROR_NOT_PERMITTED as u32);
    assert_eq!(hooks::chd_fake_host_function_api_calls(), before + 1);
}

#[test]
fn the_entry_point_is_a_driver_function_of_a_known_name_and_needs_device_accessible_memory() {
    let _g = setup();
    let mut f: *mut c_void = std::ptr::dangling_mut();
    let mut status: c_int = -1;
    let name: *const c_char = c"cuNoSuchThing".as_ptr();
    // SAFETY: NUL-terminated names and valid out-pointers.
    unsafe {
        assert_eq!(
            cudaGetDriverEntryPoint(name, &mut f, 0, &mut status),
            CUDA_SUCCESS
        );
    }
    assert!(f.is_null());
    assert_eq!(status, ENTRY_POINT_SYMBOL_NOT_FOUND);
    let rig = Rig::new();
    let mut word = 0u32;
    // SAFETY: a live stream; the address is an ordinary (pageable) local.
    let rc = unsafe { wait_value()(rig.stream, (&mut word as *mut u32) as u64, 1, 0) };
    assert_eq!(
        rc, CU_ERROR_INVALID_VALUE,
        "pageable memory is not device-accessible"
    );
}

#[test]
fn a_pageable_copy_on_a_latched_stream_would_never_return() {
    let _g = setup();
    let rig = Rig::new();
    rig.flag().store(0, Ordering::Release);
    let pageable = vec![0u8; LEN];
    let before = hooks::chd_fake_latch_deadlocks();
    // SAFETY: live handles; `pageable` spans `LEN` bytes.
    unsafe {
        assert_eq!(
            wait_value()(rig.stream, device_pointer(rig.flag), 1, 0),
            CU_SUCCESS
        );
        assert_eq!(
            cudaMemcpyAsync(rig.dev, pageable.as_ptr().cast(), LEN, 1, rig.stream),
            CUDA_ERROR_UNKNOWN,
            "the runtime stages pageable memory after synchronizing the held stream"
        );
    }
    assert_eq!(hooks::chd_fake_latch_deadlocks(), before + 1);
    rig.flag().store(1, Ordering::Release);
    // Released, the same copy goes through.
    // SAFETY: as above.
    unsafe {
        assert_eq!(
            cudaMemcpyAsync(rig.dev, pageable.as_ptr().cast(), LEN, 1, rig.stream),
            CUDA_SUCCESS
        );
    }
}
