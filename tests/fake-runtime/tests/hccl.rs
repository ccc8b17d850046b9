//! HCCL role: allgather bytes and bus bandwidth with one thread per rank, after
//! `HcclCommInitAll` and after `HcclCommInitRootInfo` on a shared root info; rank queries,
//! the NULL stream, argument errors, error strings and the counters.

mod common;

use std::ffi::{c_int, c_void, CStr};
use std::ptr::null_mut;
use std::sync::Arc;

use chd_fake_runtime::acl::*;
use chd_fake_runtime::hccl::*;
use chd_fake_runtime::hooks::*;
use common::{assert_rate, busbw_gbps, gathered, AclRank, CudaRank};

const MIB8: usize = 8 << 20;
const HCCL_DATA_TYPE_INT8: c_int = 0;
const HCCL_DATA_TYPE_FP16: c_int = 3;

fn setup() -> std::sync::MutexGuard<'static, ()> {
    common::setup(&[("CHD_FAKE_DEVICE_COUNT", "4"), ("CHD_FAKE_PAIR_GBPS", "20")])
}

fn init_all(devs: &[i32]) -> Vec<HcclComm> {
    let mut comms = vec![null_mut(); devs.len()];
    let mut devs = devs.to_vec();
    // SAFETY: room for every handle.
    let rc = unsafe { HcclCommInitAll(devs.len() as u32, devs.as_mut_ptr(), comms.as_mut_ptr()) };
    assert_eq!(rc, HCCL_SUCCESS);
    comms
}

#[test]
fn one_thread_per_rank_after_init_all() {
    let _g = setup();
    let (live, done) = (chd_fake_live_communicators(), chd_fake_collectives(1));
    let devices = [2, 1];
    let comms = init_all(&devices);
    assert_eq!(chd_fake_live_communicators(), live + 2);
    let handles: Vec<usize> = comms.iter().map(|&c| c as usize).collect();
    let iters = 3;
    let threads: Vec<_> = (0..2)
        .map(|rank| {
            let comm = handles[rank] as HcclComm as usize;
            std::thread::spawn(move || {
                let comm = comm as HcclComm;
                let (mut size, mut me) = (0, 9);
                // SAFETY: live communicator, valid out-pointers.
                unsafe {
                    assert_eq!(HcclGetRankSize(comm, &mut size), HCCL_SUCCESS);
                    assert_eq!(HcclGetRankId(comm, &mut me), HCCL_SUCCESS);
                }
                assert_eq!((size, me), (2, rank as u32));
                let r = AclRank::new(devices[rank], MIB8, 2, 40 + rank as u8);
                r.start();
                for _ in 0..iters {
                    // SAFETY: live buffers/stream/communicator.
                    let rc = unsafe {
                        HcclAllGather(
                            r.send,
                            r.recv,
                            (MIB8 / 2) as u64,
                            HCCL_DATA_TYPE_FP16,
                            comm,
                            r.stream,
                        )
                    };
                    assert_eq!(rc, HCCL_SUCCESS);
                }
                (r.stop_ms(), r.recv_bytes())
            })
        })
        .collect();
    for t in threads {
        let (ms, bytes) = t.join().unwrap();
        assert_rate(busbw_gbps(MIB8, 2, iters, ms), 20.0);
        assert!(bytes == gathered(MIB8, &[40, 41]));
    }
    assert_eq!(chd_fake_collectives(1), done + 2 * iters as u64);
    for c in comms {
        // SAFETY: live communicator.
        assert_eq!(unsafe { HcclCommDestroy(c) }, HCCL_SUCCESS);
    }
    assert_eq!(chd_fake_live_communicators(), live);
}

#[test]
fn one_thread_per_rank_after_init_root_info() {
    let _g = setup();
    let mut info = HcclRootInfo {
        internal: [0; 4108],
    };
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { HcclGetRootInfo(&mut info) }, HCCL_SUCCESS);
    let info = Arc::new(info);
    let threads: Vec<_> = (0..2u32)
        .map(|rank| {
            let info = Arc::clone(&info);
            std::thread::spawn(move || {
                let r = AclRank::new(3 - rank as i32, 4096, 2, rank as u8);
                let mut comm = null_mut();
                // SAFETY: valid pointers; live buffers; NULL stream = the default stream.
                unsafe {
                    assert_eq!(
                        HcclCommInitRootInfo(2, &*info, rank, &mut comm),
                        HCCL_SUCCESS
                    );
                    assert_eq!(
                        HcclAllGather(r.send, r.recv, 4096, HCCL_DATA_TYPE_INT8, comm, null_mut()),
                        HCCL_SUCCESS
                    );
                    let mut err = -1;
                    assert_eq!(HcclGetCommAsyncError(comm, &mut err), HCCL_SUCCESS);
                    assert_eq!(err, HCCL_SUCCESS);
                    assert_eq!(HcclCommDestroy(comm), HCCL_SUCCESS);
                }
                r.recv_bytes()
            })
        })
        .collect();
    for t in threads {
        assert!(t.join().unwrap() == gathered(4096, &[0, 1]));
    }
}

#[test]
fn argument_errors_and_strings() {
    let _g = setup();
    let done = chd_fake_collectives(1);
    let comms = init_all(&[0, 1]);
    let r = AclRank::new(0, 4096, 2, 1);
    let other = AclRank::new(1, 4096, 2, 2);
    let cuda = CudaRank::new(0, 4096, 2, 3);
    let host = [0u8; 4096];
    let c0 = comms[0];
    // SAFETY: every pointer is live or deliberately bogus (validated before any use).
    unsafe {
        assert_eq!(
            HcclAllGather(r.send, r.recv, 16, 13, c0, r.stream),
            HCCL_E_PARA
        );
        assert_eq!(
            HcclAllGather(r.send, r.recv, 16, 0, null_mut(), r.stream),
            HCCL_E_PTR
        );
        assert_eq!(
            HcclAllGather(r.send, r.recv, 16, 0, 0x4321 as HcclComm, r.stream),
            HCCL_E_PARA
        );
        assert_eq!(
            HcclAllGather(null_mut(), r.recv, 16, 0, c0, r.stream),
            HCCL_E_PTR
        );
        assert_eq!(
            HcclAllGather(host.as_ptr() as *mut c_void, r.recv, 16, 0, c0, r.stream),
            HCCL_E_PARA
        );
        assert_eq!(
            HcclAllGather(other.send, r.recv, 16, 0, c0, r.stream),
            HCCL_E_PARA
        );
        assert_eq!(
            HcclAllGather(r.send, r.recv, 16, 0, c0, other.stream),
            HCCL_E_RUNTIME
        );
        // A CUDA stream is not an ACL stream.
        assert_eq!(
            HcclAllGather(r.send, r.recv, 16, 0, c0, cuda.stream),
            HCCL_E_RUNTIME
        );

        let mut more = [null_mut(); 2];
        assert_eq!(
            HcclCommInitAll(2, [1, 1].as_mut_ptr(), more.as_mut_ptr()),
            HCCL_E_PARA
        );
        assert_eq!(
            HcclCommInitAll(2, [0, 7].as_mut_ptr(), more.as_mut_ptr()),
            HCCL_E_PARA
        );
        assert_eq!(
            HcclCommInitAll(0, [0].as_mut_ptr(), more.as_mut_ptr()),
            HCCL_E_PARA
        );
        assert_eq!(
            HcclCommInitAll(2, null_mut(), more.as_mut_ptr()),
            HCCL_E_PTR
        );
        let mut comm = null_mut();
        let zero = HcclRootInfo {
            internal: [0; 4108],
        };
        assert_eq!(HcclCommInitRootInfo(2, &zero, 0, &mut comm), HCCL_E_PARA);
        let mut info = zero;
        assert_eq!(HcclGetRootInfo(&mut info), HCCL_SUCCESS);
        assert_eq!(HcclCommInitRootInfo(2, &info, 2, &mut comm), HCCL_E_PARA);
        assert_eq!(
            HcclCommInitRootInfo(2, null_mut(), 0, &mut comm),
            HCCL_E_PTR
        );
        assert_eq!(HcclGetRootInfo(null_mut()), HCCL_E_PTR);
        assert_eq!(HcclGetRankSize(c0, null_mut()), HCCL_E_PTR);
        assert_eq!(HcclCommDestroy(null_mut()), HCCL_E_PTR);

        let s = |rc| CStr::from_ptr(HcclGetErrorString(rc)).to_str().unwrap();
        assert_eq!(s(HCCL_SUCCESS), "success");
        assert_eq!(s(HCCL_E_PARA), "parameter error");
        assert_eq!(s(HCCL_E_TIMEOUT), "timeout");
        assert_eq!(s(HCCL_E_INTERNAL), "internal error");
        assert_eq!(s(1000), "unknown error");

        // An NCCL call on an HCCL communicator is rejected.
        assert_eq!(
            chd_fake_runtime::nccl::ncclCommDestroy(c0),
            chd_fake_runtime::nccl::NCCL_INVALID_ARGUMENT
        );
    }
    assert_eq!(chd_fake_collectives(1), done);
    for c in comms {
        // SAFETY: live communicator.
        assert_eq!(unsafe { HcclCommDestroy(c) }, HCCL_SUCCESS);
    }
    // SAFETY: unknown handle, detected.
    assert_eq!(unsafe { HcclCommDestroy(c0) }, HCCL_E_PARA);
    // ACL error paths are untouched by the collective code.
    // SAFETY: valid pointer.
    assert_eq!(unsafe { aclrtSetDevice(0) }, ACL_SUCCESS);
}

/// In-process `HcclAllReduce`, one thread per rank: int8 sums (wrapping) on every rank at
/// exactly `CHD_FAKE_PAIR_GBPS` of all-reduce bus bandwidth.
#[test]
fn allreduce_one_thread_per_rank() {
    let _g = setup();
    let done = chd_fake_collectives(1);
    let devices = [0, 3];
    let comms = init_all(&devices);
    let threads: Vec<_> = (0..2)
        .map(|rank| {
            let comm = comms[rank] as usize;
            std::thread::spawn(move || {
                let r = AclRank::new(devices[rank], MIB8, 2, 60 + rank as u8);
                r.start();
                // SAFETY: live buffers/stream/communicator.
                let rc = unsafe {
                    HcclAllReduce(
                        r.send,
                        r.recv,
                        MIB8 as u64,
                        HCCL_DATA_TYPE_INT8,
                        0,
                        comm as HcclComm,
                        r.stream,
                    )
                };
                assert_eq!(rc, HCCL_SUCCESS);
                (r.stop_ms(), r.recv_bytes())
            })
        })
        .collect();
    let (a, b) = (common::pattern(MIB8, 60), common::pattern(MIB8, 61));
    let sum: Vec<u8> = a.iter().zip(&b).map(|(x, y)| x.wrapping_add(*y)).collect();
    for t in threads {
        let (ms, bytes) = t.join().unwrap();
        let busbw = MIB8 as f64 * 2.0 * (2.0 - 1.0) / 2.0 / (f64::from(ms) * 1e-3) / 1e9;
        assert_rate(busbw, 20.0);
        assert!(bytes[..MIB8] == sum[..]);
    }
    assert_eq!(chd_fake_collectives(1), done + 2);
    for c in comms {
        // SAFETY: live communicator.
        assert_eq!(unsafe { HcclCommDestroy(c) }, HCCL_SUCCESS);
    }
}
