//! `CHD_FAKE_PAIR_FAIL=1`: every collective fails (NCCL `ncclSystemError`, HCCL
//! `HCCL_E_INTERNAL`) without touching buffers or clocks, and so do cross-device copies;
//! communicators and same-device copies still work.

mod common;

use std::ffi::{c_int, CStr};
use std::ptr::null_mut;

use chd_fake_runtime::acl::*;
use chd_fake_runtime::cuda::*;
use chd_fake_runtime::hccl::*;
use chd_fake_runtime::hooks::*;
use chd_fake_runtime::nccl::*;
use common::{AclRank, CudaRank};

fn setup() -> std::sync::MutexGuard<'static, ()> {
    common::setup(&[("CHD_FAKE_DEVICE_COUNT", "2"), ("CHD_FAKE_PAIR_FAIL", "1")])
}

#[test]
fn nccl_collectives_fail_grouped_and_per_thread() {
    let _g = setup();
    let mut comms = [null_mut(); 2];
    // SAFETY: `comms` has room for the two handles ncclCommInitAll writes; a NULL
    // devlist means the first two CUDA devices (nccl.h).
    let rc = unsafe { ncclCommInitAll(comms.as_mut_ptr(), 2, null_mut()) };
    assert_eq!(rc, NCCL_SUCCESS);
    let ranks = [CudaRank::new(0, 4096, 2, 1), CudaRank::new(1, 4096, 2, 2)];
    ranks.iter().for_each(CudaRank::start);
    // SAFETY: live buffers/streams/communicators.
    unsafe {
        assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
        for (r, c) in ranks.iter().zip(comms) {
            assert_eq!(
                ncclAllGather(r.send, r.recv, 4096, 0, c, r.stream),
                NCCL_SUCCESS
            );
        }
        assert_eq!(ncclGroupEnd(), NCCL_SYSTEM_ERROR);
        let msg = CStr::from_ptr(ncclGetLastError(comms[0])).to_str().unwrap();
        assert!(msg.contains("CHD_FAKE_PAIR_FAIL"), "{msg}");
    }
    // Ungrouped, one thread per rank: each call fails on its own, without waiting.
    let handles = comms.map(|c| c as usize);
    let rcs: Vec<c_int> = (0..2)
        .map(|rank| {
            std::thread::spawn(move || {
                let r = CudaRank::new(rank as c_int, 4096, 2, 1);
                // SAFETY: live buffers/stream/communicator.
                unsafe {
                    ncclAllGather(
                        r.send,
                        r.recv,
                        4096,
                        0,
                        handles[rank] as ncclComm_t,
                        r.stream,
                    )
                }
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    assert_eq!(rcs, [NCCL_SYSTEM_ERROR; 2]);
    for r in &ranks {
        assert_eq!(r.stop_ms(), 0.0, "clocks untouched");
        assert!(r.recv_bytes().iter().all(|&b| b == 0), "buffers untouched");
    }
    assert_eq!(chd_fake_collectives(0), 0);
    let mut err = -1;
    // SAFETY: live communicators.
    unsafe {
        assert_eq!(ncclCommGetAsyncError(comms[0], &mut err), NCCL_SUCCESS);
        assert_eq!(err, NCCL_SUCCESS, "the failure was reported synchronously");
        common::destroy_nccl(&comms);
    }
}

#[test]
fn hccl_collectives_fail() {
    let _g = setup();
    let mut comms = [null_mut(); 2];
    let mut devices = [0, 1];
    // SAFETY: `devices` lists the two devices and `comms` has room for the two
    // handles HcclCommInitAll writes (hccl.h).
    let rc = unsafe { HcclCommInitAll(2, devices.as_mut_ptr(), comms.as_mut_ptr()) };
    assert_eq!(rc, HCCL_SUCCESS);
    let r = AclRank::new(0, 4096, 2, 1);
    r.start();
    // SAFETY: live buffers/stream/communicator.
    let rc = unsafe { HcclAllGather(r.send, r.recv, 4096, 0, comms[0], r.stream) };
    assert_eq!(rc, HCCL_E_INTERNAL);
    assert_eq!(r.stop_ms(), 0.0);
    assert_eq!(chd_fake_collectives(1), 0);
    // SAFETY: live communicators.
    comms
        .iter()
        .for_each(|&c| assert_eq!(unsafe { HcclCommDestroy(c) }, HCCL_SUCCESS));
}

#[test]
fn cross_device_copies_fail_same_device_copies_work() {
    let _g = setup();
    let a = CudaRank::new(0, 4096, 1, 1);
    let b = CudaRank::new(1, 4096, 1, 2);
    // SAFETY: live device buffers of 4096 bytes.
    unsafe {
        assert_eq!(
            cudaMemcpyPeerAsync(b.recv, 1, a.send, 0, 4096, b.stream),
            CUDA_ERROR_UNKNOWN
        );
        assert_eq!(cudaMemcpy(b.recv, a.send, 4096, 3), CUDA_ERROR_UNKNOWN);
        assert_eq!(cudaMemcpy(b.recv, b.send, 4096, 3), CUDA_SUCCESS);
    }
    assert_eq!(b.recv_bytes(), common::pattern(4096, 2));
    let (x, y) = (AclRank::new(0, 4096, 1, 1), AclRank::new(1, 4096, 1, 2));
    // SAFETY: live device buffers of 4096 bytes; NUL-terminated message.
    unsafe {
        assert_eq!(
            aclrtMemcpyAsync(y.recv, 4096, x.send, 4096, 3, y.stream),
            ACL_ERROR_RT_SYS_DMA
        );
        let msg = CStr::from_ptr(aclGetRecentErrMsg()).to_str().unwrap();
        assert!(msg.contains("CHD_FAKE_PAIR_FAIL"), "{msg}");
    }
}
