//! `CHD_FAKE_PAIR_HANG_MS`: every collective (and cross-device copy) blocks that long in wall
//! time before completing, with the virtual timing unchanged. The hang is longer than the
//! rendezvous timeout here: once every rank has joined, the timeout no longer applies.
//! `ncclCommAbort` cuts a hang short.

mod common;

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use chd_fake_runtime::cuda::*;
use chd_fake_runtime::hccl::*;
use chd_fake_runtime::hooks::*;
use chd_fake_runtime::nccl::*;
use common::{assert_close, assert_rate, busbw_gbps, expected_ms, gathered, AclRank, CudaRank};

const HANG: Duration = Duration::from_millis(1200);

fn setup() -> std::sync::MutexGuard<'static, ()> {
    common::setup(&[
        ("CHD_FAKE_DEVICE_COUNT", "2"),
        ("CHD_FAKE_PAIR_HANG_MS", "1200"),
        ("CHD_FAKE_PAIR_TIMEOUT_MS", "600"),
        ("CHD_FAKE_PAIR_GBPS", "10"),
    ])
}

#[test]
fn nccl_allgather_hangs_then_completes_with_exact_timing() {
    let _g = setup();
    let mut id = ncclUniqueId { internal: [0; 128] };
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, NCCL_SUCCESS);
    let threads: Vec<_> = (0..2)
        .map(|rank| {
            std::thread::spawn(move || {
                let r = CudaRank::new(rank as c_int, 1 << 20, 2, rank as u8);
                let mut comm = null_mut();
                // SAFETY: valid out-pointer; live buffers; communicator destroyed.
                unsafe {
                    assert_eq!(ncclCommInitRank(&mut comm, 2, id, rank as c_int), 0);
                    r.start();
                    let t = Instant::now();
                    let rc = ncclAllGather(r.send, r.recv, 1 << 20, 0, comm, r.stream);
                    let waited = t.elapsed();
                    assert_eq!(rc, NCCL_SUCCESS);
                    assert!(r.recv_bytes() == gathered(1 << 20, &[0, 1]));
                    assert_eq!(ncclCommDestroy(comm), 0);
                    (waited, r.stop_ms())
                }
            })
        })
        .collect();
    for t in threads {
        let (waited, ms) = t.join().unwrap();
        assert!(waited >= HANG, "returned after {waited:?}");
        assert_rate(busbw_gbps(1 << 20, 2, 1, ms), 10.0);
    }
}

#[test]
fn abort_cuts_a_hang_short() {
    let _g = setup();
    let mut comms = [null_mut(); 2];
    // SAFETY: `comms` has room for the two handles ncclCommInitAll writes; a NULL
    // devlist means the first two CUDA devices (nccl.h).
    let rc = unsafe { ncclCommInitAll(comms.as_mut_ptr(), 2, null_mut()) };
    assert_eq!(rc, 0);
    let done = chd_fake_collectives(0);
    let handles = comms.map(|c| c as usize);
    let t = Instant::now();
    let worker = std::thread::spawn(move || {
        let ranks = [CudaRank::new(0, 4096, 2, 1), CudaRank::new(1, 4096, 2, 2)];
        // SAFETY: live buffers/streams/communicators.
        unsafe {
            assert_eq!(ncclGroupStart(), 0);
            for (r, c) in ranks.iter().zip(handles) {
                assert_eq!(
                    ncclAllGather(r.send, r.recv, 4096, 0, c as ncclComm_t, r.stream),
                    0
                );
            }
            ncclGroupEnd()
        }
    });
    std::thread::sleep(Duration::from_millis(150));
    // Both ranks aborted from this thread, grouped (abort is an intra-node collective).
    // SAFETY: live communicators, each aborted once.
    unsafe {
        assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
        assert_eq!(ncclCommAbort(comms[0]), NCCL_SUCCESS);
        assert_eq!(ncclCommAbort(comms[1]), NCCL_SUCCESS);
        assert_eq!(ncclGroupEnd(), NCCL_SUCCESS);
    }
    assert_eq!(worker.join().unwrap(), NCCL_SYSTEM_ERROR);
    assert!(t.elapsed() < HANG, "abort took {:?}", t.elapsed());
    assert_eq!(chd_fake_collectives(0), done);
}

#[test]
fn hccl_allgather_and_peer_copies_hang_too() {
    let _g = setup();
    let mut comms = [null_mut(); 2];
    let mut devices = [0, 1];
    // SAFETY: `devices` lists the two devices and `comms` has room for the two
    // handles HcclCommInitAll writes (hccl.h).
    let rc = unsafe { HcclCommInitAll(2, devices.as_mut_ptr(), comms.as_mut_ptr()) };
    assert_eq!(rc, HCCL_SUCCESS);
    let handles = comms.map(|c| c as usize);
    let threads: Vec<_> = (0..2)
        .map(|rank| {
            std::thread::spawn(move || {
                let r = AclRank::new(rank as c_int, 4096, 2, rank as u8);
                let t = Instant::now();
                // SAFETY: live buffers/stream/communicator.
                let rc = unsafe {
                    HcclAllGather(r.send, r.recv, 4096, 0, handles[rank] as HcclComm, r.stream)
                };
                assert_eq!(rc, HCCL_SUCCESS);
                t.elapsed()
            })
        })
        .collect();
    for t in threads {
        assert!(t.join().unwrap() >= HANG);
    }
    // SAFETY: live communicators.
    comms
        .iter()
        .for_each(|&c| assert_eq!(unsafe { HcclCommDestroy(c) }, HCCL_SUCCESS));

    let (a, b) = (
        CudaRank::new(0, 1 << 20, 1, 1),
        CudaRank::new(1, 1 << 20, 1, 2),
    );
    common::cuda_peer_access(0, 1, true);
    a.start();
    let t = Instant::now();
    // SAFETY: live device buffers of 1 MiB.
    let rc = unsafe { cudaMemcpyPeerAsync(b.recv, 1, a.send, 0, 1 << 20, a.stream) };
    assert_eq!(rc, CUDA_SUCCESS);
    assert!(t.elapsed() >= HANG);
    assert_close(a.stop_ms(), expected_ms(1 << 20, 10.0));
    common::cuda_peer_access(0, 1, false);
}

#[test]
fn a_buffer_freed_during_the_hang_fails_the_collective_instead_of_corrupting_memory() {
    let _g = setup();
    let mut comms = [null_mut(); 2];
    // SAFETY: `comms` has room for the two handles ncclCommInitAll writes; a NULL
    // devlist means the first two CUDA devices (nccl.h).
    let rc = unsafe { ncclCommInitAll(comms.as_mut_ptr(), 2, null_mut()) };
    assert_eq!(rc, 0);
    let mut ranks = [CudaRank::new(0, 4096, 2, 1), CudaRank::new(1, 4096, 2, 2)];
    let args: Vec<[usize; 4]> = ranks
        .iter()
        .zip(comms)
        .map(|(r, c)| {
            [
                r.send as usize,
                r.recv as usize,
                c as usize,
                r.stream as usize,
            ]
        })
        .collect();
    let worker = std::thread::spawn(move || {
        // SAFETY: live buffers/streams/communicators (one receive buffer is freed while the
        // group hangs, which the fake detects).
        unsafe {
            assert_eq!(ncclGroupStart(), 0);
            for [send, recv, comm, stream] in args {
                let rc = ncclAllGather(
                    send as *const c_void,
                    recv as *mut c_void,
                    4096,
                    0,
                    comm as ncclComm_t,
                    stream as *mut c_void,
                );
                assert_eq!(rc, 0);
            }
            ncclGroupEnd()
        }
    });
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: a live cudaMalloc allocation, freed once (Drop then frees NULL, a no-op).
    assert_eq!(unsafe { cudaFree(ranks[1].recv) }, CUDA_SUCCESS);
    ranks[1].recv = null_mut();
    assert_eq!(worker.join().unwrap(), NCCL_INVALID_ARGUMENT);
    assert!(ranks[0].recv_bytes().iter().all(|&b| b == 0));
    common::destroy_nccl(&comms);
}
