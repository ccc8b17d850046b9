//! `CHD_FAKE_PAIR_TIMEOUT_MS`: a rank whose peers never arrive gives up (NCCL
//! `ncclSystemError`, HCCL `HCCL_E_TIMEOUT`) instead of hanging the test; the clique is then
//! broken for every rank, and the rank-by-rank init rendezvous is not poisoned.

mod common;

use std::ffi::c_int;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use chd_fake_runtime::hccl::*;
use chd_fake_runtime::hooks::*;
use chd_fake_runtime::nccl::*;
use common::{AclRank, CudaRank};

const TIMEOUT: Duration = Duration::from_millis(300);

fn setup() -> std::sync::MutexGuard<'static, ()> {
    common::setup(&[
        ("CHD_FAKE_DEVICE_COUNT", "2"),
        ("CHD_FAKE_PAIR_TIMEOUT_MS", "300"),
    ])
}

fn unique_id() -> ncclUniqueId {
    let mut id = ncclUniqueId { internal: [0; 128] };
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, NCCL_SUCCESS);
    id
}

#[test]
fn a_lone_nccl_rank_times_out_and_breaks_the_clique() {
    let _g = setup();
    let mut comms = [null_mut(); 2];
    // SAFETY: `comms` has room for the two handles ncclCommInitAll writes; a NULL
    // devlist means the first two CUDA devices (nccl.h).
    let rc = unsafe { ncclCommInitAll(comms.as_mut_ptr(), 2, null_mut()) };
    assert_eq!(rc, 0);
    let ranks = [CudaRank::new(0, 4096, 2, 1), CudaRank::new(1, 4096, 2, 2)];
    // Calling rank 0 and then rank 1 from one thread without a group is a deadlock in real
    // NCCL; here rank 0's call gives up.
    let t = Instant::now();
    // SAFETY: live buffers/streams/communicators.
    unsafe {
        let rc = ncclAllGather(
            ranks[0].send,
            ranks[0].recv,
            4096,
            0,
            comms[0],
            ranks[0].stream,
        );
        assert_eq!(rc, NCCL_SYSTEM_ERROR);
        assert!(t.elapsed() >= TIMEOUT);
        let t = Instant::now();
        let rc = ncclAllGather(
            ranks[1].send,
            ranks[1].recv,
            4096,
            0,
            comms[1],
            ranks[1].stream,
        );
        assert_eq!(rc, NCCL_SYSTEM_ERROR);
        assert!(t.elapsed() < TIMEOUT, "a broken clique fails at once");
        for &c in &comms {
            let mut err = 0;
            assert_eq!(ncclCommGetAsyncError(c, &mut err), NCCL_SUCCESS);
            assert_eq!(err, NCCL_SYSTEM_ERROR);
        }
    }
    common::destroy_nccl(&comms);
    assert_eq!(chd_fake_collectives(0), 0);
}

#[test]
fn a_group_missing_a_rank_times_out() {
    let _g = setup();
    let mut comms = [null_mut(); 2];
    // SAFETY: `comms` has room for the two handles ncclCommInitAll writes; a NULL
    // devlist means the first two CUDA devices (nccl.h).
    let rc = unsafe { ncclCommInitAll(comms.as_mut_ptr(), 2, null_mut()) };
    assert_eq!(rc, 0);
    let r = CudaRank::new(1, 4096, 2, 1);
    let t = Instant::now();
    // SAFETY: live buffers/stream/communicators.
    unsafe {
        assert_eq!(ncclGroupStart(), 0);
        assert_eq!(
            ncclAllGather(r.send, r.recv, 4096, 0, comms[1], r.stream),
            0
        );
        assert_eq!(ncclGroupEnd(), NCCL_SYSTEM_ERROR);
    }
    common::destroy_nccl(&comms);
    assert!(t.elapsed() >= TIMEOUT);
}

#[test]
fn init_rank_times_out_alone_and_works_afterwards() {
    let _g = setup();
    let live = chd_fake_live_communicators();
    let mut comm = null_mut();
    let t = Instant::now();
    // SAFETY: `comm` is a live local the call writes one handle to.
    let rc = unsafe { ncclCommInitRank(&mut comm, 2, unique_id(), 0) };
    assert_eq!(rc, NCCL_SYSTEM_ERROR);
    assert!(t.elapsed() >= TIMEOUT);
    assert_eq!(chd_fake_live_communicators(), live);

    // The same id, both ranks this time.
    let id = unique_id();
    // SAFETY: `comm` is a live local the call writes one handle to.
    let rc = unsafe { ncclCommInitRank(&mut comm, 2, id, 1) };
    assert_eq!(rc, NCCL_SYSTEM_ERROR);
    let threads: Vec<_> = (0..2)
        .map(|rank| {
            std::thread::spawn(move || {
                // SAFETY: valid device and out-pointer; destroyed below.
                unsafe {
                    assert_eq!(chd_fake_runtime::cuda::cudaSetDevice(rank), 0);
                    let mut comm = null_mut();
                    let rc = ncclCommInitRank(&mut comm, 2, id, rank as c_int);
                    (rc, comm as usize)
                }
            })
        })
        .collect();
    let mut comms = Vec::new();
    for t in threads {
        let (rc, comm) = t.join().unwrap();
        assert_eq!(rc, NCCL_SUCCESS);
        comms.push(comm as ncclComm_t);
    }
    common::destroy_nccl(&comms);
}

#[test]
fn a_lone_hccl_rank_times_out() {
    let _g = setup();
    let mut comms = [null_mut(); 2];
    let mut devices = [0, 1];
    // SAFETY: `devices` lists the two devices and `comms` has room for the two
    // handles HcclCommInitAll writes (hccl.h).
    let rc = unsafe { HcclCommInitAll(2, devices.as_mut_ptr(), comms.as_mut_ptr()) };
    assert_eq!(rc, HCCL_SUCCESS);
    let r = AclRank::new(0, 4096, 2, 1);
    let t = Instant::now();
    // SAFETY: live buffers/stream/communicators; valid out-pointers.
    unsafe {
        assert_eq!(
            HcclAllGather(r.send, r.recv, 4096, 0, comms[0], r.stream),
            HCCL_E_TIMEOUT
        );
        assert!(t.elapsed() >= TIMEOUT);
        let mut err = 0;
        assert_eq!(HcclGetCommAsyncError(comms[1], &mut err), HCCL_SUCCESS);
        assert_eq!(err, HCCL_E_TIMEOUT);
        comms
            .iter()
            .for_each(|&c| assert_eq!(HcclCommDestroy(c), HCCL_SUCCESS));

        let mut info = HcclRootInfo {
            internal: [0; 4108],
        };
        assert_eq!(HcclGetRootInfo(&mut info), HCCL_SUCCESS);
        let mut comm = null_mut();
        assert_eq!(HcclCommInitRootInfo(2, &info, 0, &mut comm), HCCL_E_TIMEOUT);
    }
}
