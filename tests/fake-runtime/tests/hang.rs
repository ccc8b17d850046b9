//! `CHD_FAKE_HANG_DEVICES` (and the control file's `hang_devices`): a copy touching a hung
//! device is enqueued and never runs while the device hangs. Events behind it stay pending,
//! a bounded wait gives up, the memory it uses cannot be freed, other devices copy on; once
//! the hang is lifted the stream drains and the memory frees.

mod common;

use std::ffi::c_void;
use std::ptr::null_mut;

use chd_fake_runtime::acl::*;
use chd_fake_runtime::cuda::*;
use chd_fake_runtime::hooks;

const LEN: usize = 1 << 20;

fn control() -> &'static std::path::Path {
    static PATH: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let p = std::env::temp_dir().join(format!("chd-fake-hang-{}", std::process::id()));
        std::fs::write(&p, "hang_devices=1\n").unwrap();
        p
    })
}

fn setup() -> std::sync::MutexGuard<'static, ()> {
    let path = control().to_str().unwrap().to_owned();
    let path: &'static str = Box::leak(path.into_boxed_str());
    common::setup(&[("CHD_FAKE_CONTROL_FILE", path)])
}

fn hang(devices: &str) {
    std::fs::write(control(), format!("hang_devices={devices}\n")).unwrap();
}

/// An H2D copy on `device` on a fresh stream, then an event: (host, dev, stream, event).
///
/// # Safety
/// Calls into the fake with buffers it allocates.
unsafe fn cuda_copy(device: i32) -> [*mut c_void; 4] {
    let (mut host, mut dev, mut stream, mut event) =
        (null_mut(), null_mut(), null_mut(), null_mut());
    // SAFETY: valid out-pointers; the buffers span LEN bytes.
    unsafe {
        assert_eq!(cudaSetDevice(device), CUDA_SUCCESS);
        assert_eq!(cudaHostAlloc(&mut host, LEN, 1), CUDA_SUCCESS);
        assert_eq!(cudaMalloc(&mut dev, LEN), CUDA_SUCCESS);
        assert_eq!(cudaStreamCreate(&mut stream), CUDA_SUCCESS);
        assert_eq!(cudaEventCreate(&mut event), CUDA_SUCCESS);
        assert_eq!(cudaMemcpyAsync(dev, host, LEN, 1, stream), CUDA_SUCCESS);
        assert_eq!(cudaEventRecord(event, stream), CUDA_SUCCESS);
    }
    [host, dev, stream, event]
}

#[test]
fn a_hung_cuda_copy_never_completes_and_keeps_its_memory_until_the_hang_lifts() {
    let _g = setup();
    hang("1");
    let frees = hooks::chd_fake_frees_in_flight();
    // SAFETY: the helper's handles are live until released below.
    unsafe {
        let [host, dev, stream, event] = cuda_copy(1);
        assert_eq!(cudaEventQuery(event), CUDA_ERROR_NOT_READY);
        assert_eq!(cudaStreamQuery(stream), CUDA_ERROR_NOT_READY);
        // Its buffers are under the DMA: freeing them is refused.
        assert_eq!(cudaFree(dev), CUDA_ERROR_UNKNOWN);
        assert_eq!(cudaFreeHost(host), CUDA_ERROR_UNKNOWN);
        assert_eq!(hooks::chd_fake_frees_in_flight(), frees + 2);
        // Device 0 is fine meanwhile.
        let [h0, d0, s0, e0] = cuda_copy(0);
        assert_eq!(cudaEventSynchronize(e0), CUDA_SUCCESS);
        for rc in [
            cudaEventDestroy(e0),
            cudaStreamDestroy(s0),
            cudaFree(d0),
            cudaFreeHost(h0),
        ] {
            assert_eq!(rc, CUDA_SUCCESS);
        }
        // Destroying the hung stream is legal; its work still holds the memory.
        assert_eq!(cudaStreamDestroy(stream), CUDA_SUCCESS);
        assert_eq!(cudaFree(dev), CUDA_ERROR_UNKNOWN);
        assert_eq!(hooks::chd_fake_held_streams(), 1);
        hang("");
        assert_eq!(hooks::chd_fake_held_streams(), 0);
        assert_eq!(cudaEventDestroy(event), CUDA_SUCCESS);
        assert_eq!(cudaFree(dev), CUDA_SUCCESS);
        assert_eq!(cudaFreeHost(host), CUDA_SUCCESS);
    }
}

#[test]
fn a_hung_acl_copy_times_out_a_bounded_event_wait() {
    let _g = setup();
    hang("1");
    let (mut host, mut dev, mut stream, mut event) =
        (null_mut(), null_mut(), null_mut(), null_mut());
    let mut status = -1;
    // SAFETY: valid out-pointers; the buffers span LEN bytes until freed.
    unsafe {
        assert_eq!(aclrtSetDevice(1), ACL_SUCCESS);
        assert_eq!(aclrtMallocHost(&mut host, LEN), ACL_SUCCESS);
        assert_eq!(aclrtMalloc(&mut dev, LEN, 0), ACL_SUCCESS);
        assert_eq!(aclrtCreateStream(&mut stream), ACL_SUCCESS);
        assert_eq!(aclrtCreateEvent(&mut event), ACL_SUCCESS);
        assert_eq!(
            aclrtMemcpyAsync(dev, LEN, host, LEN, ACL_MEMCPY_HOST_TO_DEVICE, stream),
            ACL_SUCCESS
        );
        assert_eq!(aclrtRecordEvent(event, stream), ACL_SUCCESS);
        assert_eq!(aclrtQueryEventStatus(event, &mut status), ACL_SUCCESS);
        assert_eq!(status, ACL_EVENT_RECORDED_STATUS_NOT_READY);
        let started = std::time::Instant::now();
        assert_eq!(
            aclrtSynchronizeEventWithTimeout(event, 50),
            ACL_ERROR_RT_EVENT_SYNC_TIMEOUT
        );
        assert!(started.elapsed() >= std::time::Duration::from_millis(50));
        assert_eq!(aclrtFree(dev), ACL_ERROR_RT_STREAM_NOT_COMPLETE);
        hang("");
        assert_eq!(aclrtSynchronizeEventWithTimeout(event, 50), ACL_SUCCESS);
        assert_eq!(aclrtQueryEventStatus(event, &mut status), ACL_SUCCESS);
        assert_eq!(status, ACL_EVENT_RECORDED_STATUS_COMPLETE);
        assert_eq!(aclrtSynchronizeStream(stream), ACL_SUCCESS);
        assert_eq!(aclrtDestroyEvent(event), ACL_SUCCESS);
        assert_eq!(aclrtDestroyStream(stream), ACL_SUCCESS);
        assert_eq!(aclrtFree(dev), ACL_SUCCESS);
        assert_eq!(aclrtFreeHost(host), ACL_SUCCESS);
    }
}
