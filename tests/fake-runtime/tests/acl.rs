//! Ascend ACL role: init/finalize, devices, memory, copies, virtual timing, per-device
//! bandwidth, failing devices with the recent error message, memory info, utilization and
//! the pinned-allocation counter.

mod common;

use std::ffi::{c_void, CStr};
use std::ptr::null_mut;

use chd_fake_runtime::acl::*;
use chd_fake_runtime::hooks::*;
use common::{assert_close, expected_ms, pattern};

const ENV: &[(&str, &str)] = &[
    ("CHD_FAKE_DEVICE_COUNT", "8"),
    ("CHD_FAKE_H2D_GBPS", "58.9;2=20"),
    ("CHD_FAKE_FAIL_DEVICES", "6"),
    ("CHD_FAKE_BUSY_DEVICES", "2"),
    ("CHD_FAKE_MEMORY_BYTES", "68719476736"),
];

const MIB64: usize = 64 << 20;

fn setup() -> std::sync::MutexGuard<'static, ()> {
    common::setup(ENV)
}

fn recent_error() -> String {
    // SAFETY: returns a NUL-terminated thread-local string.
    unsafe { CStr::from_ptr(aclGetRecentErrMsg()) }
        .to_str()
        .unwrap()
        .to_owned()
}

struct Buffers {
    host: *mut c_void,
    dev: *mut c_void,
    len: usize,
}

impl Buffers {
    fn new(device: i32, len: usize) -> Self {
        let (mut host, mut dev) = (null_mut(), null_mut());
        // SAFETY: valid out-pointers.
        unsafe {
            assert_eq!(aclrtSetDevice(device), ACL_SUCCESS);
            assert_eq!(aclrtMallocHost(&mut host, len), ACL_SUCCESS);
            assert_eq!(aclrtMalloc(&mut dev, len, 0), ACL_SUCCESS);
        }
        Buffers { host, dev, len }
    }

    fn host_bytes(&mut self) -> &mut [u8] {
        // SAFETY: `host` is a live allocation of `len` bytes owned by this struct.
        unsafe { std::slice::from_raw_parts_mut(self.host.cast(), self.len) }
    }
}

impl Drop for Buffers {
    fn drop(&mut self) {
        // SAFETY: both allocated in `new`, freed once.
        let rcs = unsafe { (aclrtFreeHost(self.host), aclrtFree(self.dev)) };
        if !std::thread::panicking() {
            assert_eq!(rcs, (ACL_SUCCESS, ACL_SUCCESS));
        }
    }
}

fn timed_copy(dst: *mut c_void, src: *const c_void, len: usize, kind: i32) -> f32 {
    let (mut stream, mut e0, mut e1) = (null_mut(), null_mut(), null_mut());
    let mut ms = -1.0;
    // SAFETY: valid out-pointers and live buffers.
    unsafe {
        assert_eq!(aclrtCreateStream(&mut stream), ACL_SUCCESS);
        assert_eq!(aclrtCreateEvent(&mut e0), ACL_SUCCESS);
        assert_eq!(aclrtCreateEvent(&mut e1), ACL_SUCCESS);
        assert_eq!(aclrtRecordEvent(e0, stream), ACL_SUCCESS);
        assert_eq!(
            aclrtMemcpyAsync(dst, len, src, len, kind, stream),
            ACL_SUCCESS
        );
        assert_eq!(aclrtRecordEvent(e1, stream), ACL_SUCCESS);
        assert_eq!(aclrtSynchronizeStream(stream), ACL_SUCCESS);
        assert_eq!(aclrtSynchronizeEvent(e1), ACL_SUCCESS);
        assert_eq!(aclrtEventElapsedTime(&mut ms, e0, e1), ACL_SUCCESS);
        assert_eq!(aclrtDestroyEvent(e0), ACL_SUCCESS);
        assert_eq!(aclrtDestroyEvent(e1), ACL_SUCCESS);
        assert_eq!(aclrtDestroyStream(stream), ACL_SUCCESS);
    }
    ms
}

#[test]
fn init_finalize_and_devices() {
    let _g = setup();
    let mut n = 0u32;
    let mut d = -1i32;
    // SAFETY: valid out-pointers; NULL config path is allowed.
    unsafe {
        assert_eq!(aclInit(std::ptr::null()), ACL_SUCCESS);
        assert_eq!(aclInit(std::ptr::null()), ACL_ERROR_REPEAT_INITIALIZE);
        assert!(recent_error().contains("aclInit"), "{}", recent_error());
        assert_eq!(aclrtGetDeviceCount(&mut n), ACL_SUCCESS);
        assert_eq!(n, 8);
        assert_eq!(aclrtGetDevice(&mut d), ACL_SUCCESS);
        assert_eq!(d, 0);
        assert_eq!(aclrtSetDevice(4), ACL_SUCCESS);
        assert_eq!(aclrtGetDevice(&mut d), ACL_SUCCESS);
        assert_eq!(d, 4);
        assert_eq!(aclrtSetDevice(8), ACL_ERROR_RT_INVALID_DEVICEID);
        assert_eq!(aclrtResetDevice(8), ACL_ERROR_RT_INVALID_DEVICEID);
        assert_eq!(aclrtResetDevice(4), ACL_SUCCESS);
        assert_eq!(aclrtGetDeviceCount(null_mut()), ACL_ERROR_INVALID_PARAM);
        assert_eq!(aclFinalize(), ACL_SUCCESS);
        assert_eq!(aclFinalize(), ACL_ERROR_REPEAT_FINALIZE);
    }
}

#[test]
fn copies_really_copy_and_are_timed() {
    let _g = setup();
    let mut b = Buffers::new(0, MIB64);
    let data = pattern(MIB64, 3);
    b.host_bytes().copy_from_slice(&data);
    let before = chd_fake_copies(0);
    assert_close(
        timed_copy(b.dev, b.host, MIB64, ACL_MEMCPY_HOST_TO_DEVICE),
        expected_ms(MIB64, 58.9),
    );
    b.host_bytes().fill(0);
    assert_close(
        timed_copy(b.host, b.dev, MIB64, ACL_MEMCPY_DEVICE_TO_HOST),
        expected_ms(MIB64, 58.9),
    );
    assert_eq!(b.host_bytes(), &data[..]);
    assert_eq!(chd_fake_copies(0), before + 2);

    // Synchronous copies on the default stream, and host-to-host (untimed, uncounted).
    let mut plain = vec![0u8; 4096];
    // SAFETY: live buffers.
    unsafe {
        assert_eq!(
            aclrtMemcpy(b.dev, MIB64, plain.as_ptr().cast(), 4096, 1),
            ACL_SUCCESS
        );
        assert_eq!(
            aclrtMemcpy(
                plain.as_mut_ptr().cast(),
                4096,
                b.host,
                4096,
                ACL_MEMCPY_HOST_TO_HOST
            ),
            ACL_SUCCESS
        );
    }
    assert_eq!(&plain[..], &data[..4096]);
    assert_eq!(chd_fake_copies(0), before + 3);

    let b2 = Buffers::new(2, MIB64);
    assert_close(
        timed_copy(b2.dev, b2.host, MIB64, ACL_MEMCPY_HOST_TO_DEVICE),
        expected_ms(MIB64, 20.0),
    );
    // Across devices (with peer access, which CANN requires): the pair rate
    // (CHD_FAKE_PAIR_GBPS, default 13.7); on one device: the same-device rate
    // (CHD_FAKE_D2D_GBPS, default 400), not the device's H2D rate.
    common::acl_peer_access(0, 2, true);
    assert_close(
        timed_copy(b2.dev, b.dev, MIB64, ACL_MEMCPY_DEVICE_TO_DEVICE),
        expected_ms(MIB64, 13.7),
    );
    common::acl_peer_access(0, 2, false);
    // SAFETY: plain value; the timed copies below create their streams on device 2.
    assert_eq!(unsafe { aclrtSetDevice(2) }, ACL_SUCCESS);
    let b2b = Buffers::new(2, MIB64);
    assert_close(
        timed_copy(b2b.dev, b2.dev, MIB64, ACL_MEMCPY_DEVICE_TO_DEVICE),
        expected_ms(MIB64, 400.0),
    );
}

#[test]
fn failing_device_and_invalid_params() {
    let _g = setup();
    let mut b = Buffers::new(6, 4096);
    b.host_bytes().fill(0x5A);
    let before = chd_fake_copies(6);
    let mut ms = 0.0;
    // SAFETY: live buffers; bogus handles are detected without dereferencing.
    unsafe {
        assert_eq!(
            aclrtMemcpy(b.dev, 4096, b.host, 4096, 1),
            ACL_ERROR_RT_SYS_DMA
        );
        let msg = recent_error();
        assert!(
            msg.contains("aclrtMemcpy") && msg.contains("device 6"),
            "{msg}"
        );
        b.host_bytes().fill(0);
        assert_eq!(
            aclrtMemcpy(b.host, 4096, b.dev, 4096, 2),
            ACL_ERROR_RT_SYS_DMA
        );
        assert!(b.host_bytes().iter().all(|&x| x == 0));
        assert_eq!(chd_fake_copies(6), before);

        assert_eq!(aclrtSetDevice(0), ACL_SUCCESS);
        let ok = Buffers::new(0, 4096);
        assert_eq!(
            aclrtMemcpy(ok.dev, 100, ok.host, 4096, 1),
            ACL_ERROR_INVALID_PARAM
        );
        assert!(recent_error().contains("destMax"));
        assert_eq!(
            aclrtMemcpy(ok.dev, 8192, ok.host, 8192, 1),
            ACL_ERROR_INVALID_PARAM
        );
        assert_eq!(
            aclrtMemcpy(ok.dev, 4096, ok.host, 16, 9),
            ACL_ERROR_INVALID_PARAM
        );
        assert_eq!(
            aclrtMemcpy(ok.host, 4096, ok.dev, 16, 1),
            ACL_ERROR_INVALID_PARAM
        );
        let bogus = 0xdead_0000usize as *mut c_void;
        assert_eq!(
            aclrtMemcpyAsync(ok.dev, 16, ok.host, 16, 1, bogus),
            ACL_ERROR_RT_INVALID_HANDLE
        );
        assert_eq!(aclrtDestroyStream(bogus), ACL_ERROR_RT_INVALID_HANDLE);
        assert_eq!(aclrtFree(ok.host), ACL_ERROR_RT_INVALID_HANDLE);
        assert_eq!(aclrtFreeHost(ok.dev), ACL_ERROR_RT_INVALID_HANDLE);
        let mut p = null_mut();
        assert_eq!(aclrtMalloc(&mut p, 0, 0), ACL_ERROR_INVALID_PARAM);
        assert_eq!(
            aclrtMalloc(&mut p, 65 << 30, 0),
            ACL_ERROR_RT_MEMORY_ALLOCATION
        );
        assert_eq!(aclrtMallocHost(null_mut(), 16), ACL_ERROR_INVALID_PARAM);
        let (mut e0, mut e1) = (null_mut(), null_mut());
        assert_eq!(aclrtCreateEvent(&mut e0), ACL_SUCCESS);
        assert_eq!(aclrtCreateEvent(&mut e1), ACL_SUCCESS);
        assert_eq!(
            aclrtEventElapsedTime(&mut ms, e0, e1),
            ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID
        );
        assert_eq!(aclrtDestroyEvent(e0), ACL_SUCCESS);
        assert_eq!(aclrtDestroyEvent(e1), ACL_SUCCESS);
        assert_eq!(aclrtDestroyEvent(e1), ACL_ERROR_RT_INVALID_HANDLE);
    }
    // The recent error message is per thread.
    std::thread::spawn(|| assert_eq!(recent_error(), ""))
        .join()
        .unwrap();
}

#[test]
fn memory_info_and_utilization() {
    let _g = setup();
    let (mut free, mut total) = (0usize, 0usize);
    let mut info = aclrtUtilizationInfo {
        cubeUtilization: -1,
        vectorUtilization: -1,
        aicpuUtilization: -1,
        memoryUtilization: -1,
        utilizationExtend: null_mut(),
    };
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(aclrtSetDevice(1), ACL_SUCCESS);
        assert_eq!(aclrtGetMemInfo(1, &mut free, &mut total), ACL_SUCCESS);
        assert_eq!((free, total), (64 << 30, 64 << 30));
        let mut p = null_mut();
        assert_eq!(aclrtMalloc(&mut p, 1 << 20, 0), ACL_SUCCESS);
        assert_eq!(aclrtGetMemInfo(5, &mut free, &mut total), ACL_SUCCESS);
        assert_eq!((free, total), ((64 << 30) - (1 << 20), 64 << 30));
        assert_eq!(aclrtFree(p), ACL_SUCCESS);
        assert_eq!(aclrtGetMemInfo(0, &mut free, &mut total), ACL_SUCCESS);
        assert_eq!((free, total), (0, 0), "DDR");
        assert_eq!(
            aclrtGetMemInfo(10, &mut free, &mut total),
            ACL_ERROR_INVALID_PARAM
        );
        assert_eq!(aclrtSetDevice(2), ACL_SUCCESS);
        assert_eq!(aclrtGetMemInfo(1, &mut free, &mut total), ACL_SUCCESS);
        assert_eq!(free, (63 << 30), "busy device: 1 GiB used by pid 4242");

        assert_eq!(aclrtGetDeviceUtilizationRate(2, &mut info), ACL_SUCCESS);
        assert_eq!(
            (
                info.cubeUtilization,
                info.vectorUtilization,
                info.aicpuUtilization,
                info.memoryUtilization
            ),
            (100, 100, 100, 100)
        );
        assert_eq!(aclrtGetDeviceUtilizationRate(3, &mut info), ACL_SUCCESS);
        assert_eq!(info.cubeUtilization, 0);
        assert_eq!(
            aclrtGetDeviceUtilizationRate(8, &mut info),
            ACL_ERROR_RT_INVALID_DEVICEID
        );
        info.utilizationExtend = 8usize as *mut c_void;
        assert_eq!(
            aclrtGetDeviceUtilizationRate(3, &mut info),
            ACL_ERROR_INVALID_PARAM
        );
    }
}

#[test]
fn pinned_allocation_counter_returns_to_zero() {
    let _g = setup();
    assert_eq!(chd_fake_live_pinned_allocations(), 0);
    let mut ptrs = [null_mut(); 4];
    // SAFETY: valid out-pointers; each freed once.
    unsafe {
        for p in &mut ptrs {
            assert_eq!(aclrtMallocHost(p, 12345), ACL_SUCCESS);
            assert_eq!(*p as usize % 4096, 0);
        }
        assert_eq!(chd_fake_live_pinned_allocations(), 4);
        for p in ptrs {
            assert_eq!(aclrtFreeHost(p), ACL_SUCCESS);
        }
    }
    assert_eq!(chd_fake_live_pinned_allocations(), 0);
    assert_eq!(chd_fake_live_device_allocations(), 0);
}

#[test]
fn async_copies_need_aligned_host_memory_from_malloc_host() {
    let _g = setup();
    let mut b = Buffers::new(0, 4096);
    b.host_bytes().fill(0x11);
    let mut stream = null_mut();
    let mut pageable = vec![0x22u8; 4096];
    let page = pageable.as_mut_ptr().cast::<c_void>();
    let before = chd_fake_copies(0);
    // SAFETY: live buffers of 4096 bytes; the rejected calls touch nothing.
    unsafe {
        assert_eq!(aclrtCreateStream(&mut stream), ACL_SUCCESS);
        // Pageable host memory, either direction, explicit or inferred kind.
        for (dst, src, kind) in [
            (b.dev, page.cast_const(), ACL_MEMCPY_HOST_TO_DEVICE),
            (page, b.dev.cast_const(), ACL_MEMCPY_DEVICE_TO_HOST),
            (b.dev, page.cast_const(), ACL_MEMCPY_DEFAULT),
        ] {
            assert_eq!(
                aclrtMemcpyAsync(dst, 4096, src, 4096, kind, stream),
                ACL_ERROR_INVALID_PARAM,
                "kind {kind}"
            );
            let msg = recent_error();
            assert!(
                msg.contains("aclrtMemcpyAsync") && msg.contains("aclrtMallocHost"),
                "{msg}"
            );
        }
        // Inside an aclrtMallocHost allocation but not 64-byte aligned, or running past it.
        assert_eq!(
            aclrtMemcpyAsync(b.dev, 4096, b.host.add(1), 64, 1, stream),
            ACL_ERROR_INVALID_PARAM
        );
        assert!(
            recent_error().contains("64-byte aligned"),
            "{}",
            recent_error()
        );
        assert_eq!(
            aclrtMemcpyAsync(b.dev, 4096, b.host.add(4096 - 64), 128, 1, stream),
            ACL_ERROR_INVALID_PARAM
        );
        assert_eq!(chd_fake_copies(0), before, "nothing was copied");
        // The synchronous copy takes pageable memory (only the async one is undefined).
        assert_eq!(
            aclrtMemcpy(b.dev, 4096, page.cast_const(), 4096, 1),
            ACL_SUCCESS
        );
        // aclrtMallocHost memory, aligned, inside its allocation: fine.
        assert_eq!(
            aclrtMemcpyAsync(b.host.add(64), 128, b.dev, 128, 2, stream),
            ACL_SUCCESS
        );
        assert_eq!(aclrtSynchronizeStream(stream), ACL_SUCCESS);
        assert_eq!(aclrtDestroyStream(stream), ACL_SUCCESS);
    }
    assert_eq!(&b.host_bytes()[64..192], &[0x22u8; 128][..]);
    assert_eq!(chd_fake_copies(0), before + 2);
}

#[test]
fn releases_before_synchronizing_are_refused() {
    let _g = setup();
    let b = Buffers::new(1, 4096);
    let (mut stream, mut ev) = (null_mut(), null_mut());
    let refused = chd_fake_unsynchronized_releases();
    // SAFETY: live buffers of 4096 bytes and live handles throughout.
    unsafe {
        assert_eq!(aclrtCreateStream(&mut stream), ACL_SUCCESS);
        assert_eq!(aclrtCreateEvent(&mut ev), ACL_SUCCESS);
        assert_eq!(
            aclrtMemcpyAsync(b.dev, 4096, b.host, 4096, 1, stream),
            ACL_SUCCESS
        );
        // The copy "still runs": the stream, the device and the host buffer are in use.
        assert_eq!(aclrtDestroyStream(stream), ACL_ERROR_RT_STREAM_NOT_COMPLETE);
        assert!(
            recent_error().contains("aclrtSynchronizeStream"),
            "{}",
            recent_error()
        );
        assert_eq!(aclrtFree(b.dev), ACL_ERROR_RT_STREAM_NOT_COMPLETE);
        assert_eq!(aclrtFreeHost(b.host), ACL_ERROR_RT_STREAM_NOT_COMPLETE);
        assert_eq!(chd_fake_unsynchronized_releases(), refused + 3);
        // Synchronizing an event recorded after the copy completes it; a copy enqueued
        // after the record is still pending.
        assert_eq!(aclrtRecordEvent(ev, stream), ACL_SUCCESS);
        assert_eq!(
            aclrtMemcpyAsync(b.host, 4096, b.dev, 4096, 2, stream),
            ACL_SUCCESS
        );
        assert_eq!(aclrtSynchronizeEvent(ev), ACL_SUCCESS);
        assert_eq!(aclrtDestroyStream(stream), ACL_ERROR_RT_STREAM_NOT_COMPLETE);
        assert_eq!(aclrtSynchronizeStream(stream), ACL_SUCCESS);
        assert_eq!(aclrtDestroyEvent(ev), ACL_SUCCESS);
        assert_eq!(aclrtDestroyStream(stream), ACL_SUCCESS);
        // The NULL stream too: pending until aclrtSynchronizeStream(NULL).
        assert_eq!(aclrtSetDevice(1), ACL_SUCCESS);
        assert_eq!(
            aclrtMemcpyAsync(b.dev, 4096, b.host, 4096, 1, null_mut()),
            ACL_SUCCESS
        );
        assert_eq!(aclrtFree(b.dev), ACL_ERROR_RT_STREAM_NOT_COMPLETE);
        assert_eq!(aclrtSynchronizeStream(null_mut()), ACL_SUCCESS);
    }
    assert_eq!(chd_fake_unsynchronized_releases(), refused + 5);
    assert_eq!(chd_fake_live_pinned_allocations(), 1);
    drop(b);
    assert_eq!(chd_fake_live_pinned_allocations(), 0);
}

#[test]
fn finalize_reference_and_pci_bus_id() {
    let _g = setup();
    let mut left = 7u64;
    let mut id = [0 as std::ffi::c_char; 16];
    // SAFETY: valid out-pointers; `id` holds 16 bytes.
    unsafe {
        assert_eq!(aclFinalizeReference(&mut left), ACL_ERROR_REPEAT_FINALIZE);
        assert_eq!(aclInit(std::ptr::null()), ACL_SUCCESS);
        assert_eq!(aclFinalizeReference(&mut left), ACL_SUCCESS);
        assert_eq!(left, 0);
        assert_eq!(aclFinalize(), ACL_ERROR_REPEAT_FINALIZE);

        assert_eq!(aclrtDeviceGetPCIBusId(2, id.as_mut_ptr(), 13), ACL_SUCCESS);
        assert_eq!(
            CStr::from_ptr(id.as_ptr()).to_str().unwrap(),
            "0000:12:00.0"
        );
        assert_eq!(
            aclrtDeviceGetPCIBusId(2, id.as_mut_ptr(), 12),
            ACL_ERROR_INVALID_PARAM
        );
        assert_eq!(
            aclrtDeviceGetPCIBusId(8, id.as_mut_ptr(), 16),
            ACL_ERROR_RT_INVALID_DEVICEID
        );
        assert_eq!(
            aclrtDeviceGetPCIBusId(0, null_mut(), 16),
            ACL_ERROR_INVALID_PARAM
        );
    }
}
