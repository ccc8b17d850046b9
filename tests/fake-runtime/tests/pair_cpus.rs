//! `CHD_FAKE_PAIR_GBPS` per-rank CPU overrides: a collective runs at the minimum over its
//! ranks of (the override for that rank and the CPU its call was made on, else the default);
//! a grouped call from one thread uses that thread's CPU for every rank; peer copies belong to
//! the rank whose device owns the stream. Threads are bound with `sched_setaffinity` to the
//! first two allowed CPUs (A and B; the B cases are skipped on a one-CPU machine).
//!
//! Planted: rank 0 on A = 4.0 GB/s, rank 1 on B = 6.5 GB/s, default 13.7 GB/s.

mod common;

use std::ffi::c_int;
use std::ptr::null_mut;

use chd_fake_runtime::acl::*;
use chd_fake_runtime::cuda::*;
use chd_fake_runtime::hccl::*;
use chd_fake_runtime::nccl::*;
use common::{allowed_cpus, assert_close, assert_rate, bind_to, busbw_gbps, expected_ms, gathered};
use common::{AclRank, CudaRank};

const MIB8: usize = 8 << 20;

/// (guard, CPU A, CPU B if there is a second one).
fn setup() -> (std::sync::MutexGuard<'static, ()>, usize, Option<usize>) {
    let cpus = allowed_cpus();
    let (a, b) = (cpus[0], cpus.get(1).copied());
    // CPU B's rule names a CPU that cannot exist when there is no second CPU.
    let rule = format!("13.7;rank0:{a}={};rank1:{}=6.5", 4.0, b.unwrap_or(100_000));
    // The rule text is computed before the first call; leaked so `setup` can take &str.
    let rule: &'static str = Box::leak(rule.into_boxed_str());
    let g = common::setup(&[
        ("CHD_FAKE_DEVICE_COUNT", "2"),
        ("CHD_FAKE_PAIR_GBPS", rule),
        // Distinct from every planted rate: a copy that missed the link would show.
        ("CHD_FAKE_STAGED_GBPS", "1.5"),
    ]);
    (g, a, b)
}

/// Bus bandwidth of one NCCL allgather with rank `r` called from a thread bound to `cpus[r]`.
fn nccl_threads(cpus: [usize; 2]) -> f64 {
    let mut id = ncclUniqueId { internal: [0; 128] };
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, NCCL_SUCCESS);
    let threads: Vec<_> = (0..2)
        .map(|rank| {
            std::thread::spawn(move || {
                bind_to(cpus[rank]);
                let r = CudaRank::new(rank as c_int, MIB8, 2, rank as u8);
                let mut comm = null_mut();
                // SAFETY: valid out-pointer, live buffers; the communicator is destroyed.
                unsafe {
                    assert_eq!(
                        ncclCommInitRank(&mut comm, 2, id, rank as c_int),
                        NCCL_SUCCESS
                    );
                    r.start();
                    assert_eq!(
                        ncclAllGather(r.send, r.recv, MIB8, 0, comm, r.stream),
                        NCCL_SUCCESS
                    );
                    let ms = r.stop_ms();
                    assert!(r.recv_bytes() == gathered(MIB8, &[0, 1]));
                    assert_eq!(ncclCommDestroy(comm), NCCL_SUCCESS);
                    busbw_gbps(MIB8, 2, 1, ms)
                }
            })
        })
        .collect();
    let rates: Vec<f64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(rates[0], rates[1], "both ranks see the same collective");
    rates[0]
}

/// Bus bandwidth of one NCCL allgather grouped on this thread, bound to `cpu`.
fn nccl_grouped(cpu: usize) -> f64 {
    bind_to(cpu);
    let mut comms = [null_mut(); 2];
    let ranks = [CudaRank::new(0, MIB8, 2, 0), CudaRank::new(1, MIB8, 2, 1)];
    // SAFETY: room for two handles; live buffers; communicators destroyed at the end.
    unsafe {
        assert_eq!(
            ncclCommInitAll(comms.as_mut_ptr(), 2, null_mut()),
            NCCL_SUCCESS
        );
        ranks.iter().for_each(CudaRank::start);
        assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
        for (r, c) in ranks.iter().zip(comms) {
            assert_eq!(
                ncclAllGather(r.send, r.recv, MIB8, 0, c, r.stream),
                NCCL_SUCCESS
            );
        }
        assert_eq!(ncclGroupEnd(), NCCL_SUCCESS);
        common::destroy_nccl(&comms);
    }
    busbw_gbps(MIB8, 2, 1, ranks[0].stop_ms())
}

/// Bus bandwidth of one HCCL allgather, one bound thread per rank, after HcclCommInitAll.
fn hccl_threads(cpus: [usize; 2]) -> f64 {
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
                bind_to(cpus[rank]);
                let r = AclRank::new(rank as c_int, MIB8, 2, rank as u8);
                r.start();
                // SAFETY: live buffers/stream/communicator.
                let rc = unsafe {
                    HcclAllGather(
                        r.send,
                        r.recv,
                        MIB8 as u64,
                        0,
                        handles[rank] as HcclComm,
                        r.stream,
                    )
                };
                assert_eq!(rc, HCCL_SUCCESS);
                busbw_gbps(MIB8, 2, 1, r.stop_ms())
            })
        })
        .collect();
    let rates: Vec<f64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    // SAFETY: live communicators.
    comms
        .iter()
        .for_each(|&c| assert_eq!(unsafe { HcclCommDestroy(c) }, HCCL_SUCCESS));
    rates[0]
}

#[test]
fn the_slowest_rank_sets_the_collective_rate() {
    let (_g, a, b) = setup();
    // Rank 0 on A is slow (4.0) wherever rank 1 is.
    assert_rate(nccl_threads([a, a]), 4.0);
    let Some(b) = b else {
        eprintln!("only one CPU allowed; skipping the CPU-B cases");
        return;
    };
    assert_rate(nccl_threads([a, b]), 4.0);
    // Rank 0 elsewhere: rank 1 on B is the limit (6.5), otherwise the default.
    assert_rate(nccl_threads([b, b]), 6.5);
    assert_rate(nccl_threads([b, a]), 13.7);
    assert_rate(hccl_threads([b, b]), 6.5);
    assert_rate(hccl_threads([b, a]), 13.7);
    assert_rate(hccl_threads([a, b]), 4.0);
}

#[test]
fn a_grouped_call_uses_the_one_threads_cpu_for_every_rank() {
    let (_g, a, b) = setup();
    // On A: rank 0 -> 4.0, rank 1 -> default.
    assert_rate(nccl_grouped(a), 4.0);
    if let Some(b) = b {
        // On B: rank 0 -> default, rank 1 -> 6.5.
        assert_rate(nccl_grouped(b), 6.5);
    }
}

/// Milliseconds of one `len`-byte peer copy from device `src` to `dst` on a stream of
/// `stream_dev`, via CUDA (`cudaMemcpyPeerAsync`) or ACL (`aclrtMemcpyAsync` kind 3).
fn peer_copy_ms(acl: bool, stream_dev: c_int, src: c_int, dst: c_int, len: usize) -> f32 {
    let (mut s, mut d) = (null_mut(), null_mut());
    let (mut stream, mut e0, mut e1) = (null_mut(), null_mut(), null_mut());
    let mut ms = -1.0;
    // SAFETY: valid out-pointers; buffers of `len` bytes; everything released at the end.
    unsafe {
        if acl {
            assert_eq!(aclrtSetDevice(src), 0);
            assert_eq!(aclrtMalloc(&mut s, len, 0), 0);
            assert_eq!(aclrtSetDevice(dst), 0);
            assert_eq!(aclrtMalloc(&mut d, len, 0), 0);
            assert_eq!(aclrtSetDevice(stream_dev), 0);
            assert_eq!(aclrtCreateStream(&mut stream), 0);
            assert_eq!(aclrtCreateEvent(&mut e0), 0);
            assert_eq!(aclrtCreateEvent(&mut e1), 0);
            assert_eq!(aclrtRecordEvent(e0, stream), 0);
            assert_eq!(aclrtMemcpyAsync(d, len, s, len, 3, stream), 0);
            assert_eq!(aclrtRecordEvent(e1, stream), 0);
            assert_eq!(aclrtSynchronizeStream(stream), 0);
            assert_eq!(aclrtEventElapsedTime(&mut ms, e0, e1), 0);
            aclrtDestroyEvent(e0);
            aclrtDestroyEvent(e1);
            aclrtDestroyStream(stream);
            assert_eq!((aclrtFree(s), aclrtFree(d)), (0, 0));
        } else {
            assert_eq!(cudaSetDevice(src), 0);
            assert_eq!(cudaMalloc(&mut s, len), 0);
            assert_eq!(cudaSetDevice(dst), 0);
            assert_eq!(cudaMalloc(&mut d, len), 0);
            assert_eq!(cudaSetDevice(stream_dev), 0);
            assert_eq!(cudaStreamCreate(&mut stream), 0);
            assert_eq!(cudaEventCreate(&mut e0), 0);
            assert_eq!(cudaEventCreate(&mut e1), 0);
            assert_eq!(cudaEventRecord(e0, stream), 0);
            assert_eq!(cudaMemcpyPeerAsync(d, dst, s, src, len, stream), 0);
            assert_eq!(cudaEventRecord(e1, stream), 0);
            assert_eq!(cudaEventElapsedTime(&mut ms, e0, e1), 0);
            cudaEventDestroy(e0);
            cudaEventDestroy(e1);
            cudaStreamDestroy(stream);
            assert_eq!((cudaFree(s), cudaFree(d)), (0, 0));
        }
    }
    ms
}

#[test]
fn peer_copies_take_the_override_of_the_rank_owning_the_stream() {
    let (_g, a, b) = setup();
    bind_to(a);
    // Over the pair link only with peer access (staged copies run at CHD_FAKE_STAGED_GBPS).
    common::cuda_peer_access(0, 1, true);
    common::acl_peer_access(0, 1, true);
    for acl in [false, true] {
        // Stream on device 0 (rank 0), from A: 4.0 whichever way the copy goes.
        assert_close(peer_copy_ms(acl, 0, 0, 1, MIB8), expected_ms(MIB8, 4.0));
        assert_close(peer_copy_ms(acl, 0, 1, 0, MIB8), expected_ms(MIB8, 4.0));
        // Stream on device 1 (rank 1), from A: the default.
        assert_close(peer_copy_ms(acl, 1, 0, 1, MIB8), expected_ms(MIB8, 13.7));
    }
    if let Some(b) = b {
        bind_to(b);
        for acl in [false, true] {
            assert_close(peer_copy_ms(acl, 1, 1, 0, MIB8), expected_ms(MIB8, 6.5));
            assert_close(peer_copy_ms(acl, 0, 0, 1, MIB8), expected_ms(MIB8, 13.7));
        }
    }
    common::cuda_peer_access(0, 1, false);
    common::acl_peer_access(0, 1, false);
}
