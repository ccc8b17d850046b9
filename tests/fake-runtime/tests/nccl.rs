//! NCCL role: allgather bytes and bus bandwidth in both calling patterns (one thread grouping
//! all ranks after `ncclCommInitAll`; one thread per rank after `ncclCommInitRank` on a
//! shared unique id), clock joining, in-place calls, communicator queries, argument errors,
//! abort and the counters.

mod common;

use std::ffi::{c_int, c_void, CStr};
use std::ptr::{null, null_mut};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chd_fake_runtime::cuda::*;
use chd_fake_runtime::hooks::*;
use chd_fake_runtime::nccl::*;
use common::{assert_rate, busbw_gbps, gathered, pattern, CudaRank};

const ENV: &[(&str, &str)] = &[
    ("CHD_FAKE_DEVICE_COUNT", "4"),
    ("CHD_FAKE_PAIR_GBPS", "13.7"),
];

const NCCL_UINT8: c_int = 1;
const NCCL_FLOAT32: c_int = 7;
const MIB16: usize = 16 << 20;

fn setup() -> std::sync::MutexGuard<'static, ()> {
    common::setup(ENV)
}

fn init_all(devs: &[c_int]) -> Vec<ncclComm_t> {
    let mut comms = vec![null_mut(); devs.len()];
    // SAFETY: `comms` has room for `devs.len()` handles.
    let rc = unsafe { ncclCommInitAll(comms.as_mut_ptr(), devs.len() as c_int, devs.as_ptr()) };
    assert_eq!(rc, NCCL_SUCCESS);
    comms
}

/// Destroys a clique's communicators from this thread: grouped, as NCCL requires.
fn destroy(comms: &[ncclComm_t]) {
    common::destroy_nccl(comms);
}

fn unique_id() -> ncclUniqueId {
    let mut id = ncclUniqueId { internal: [0; 128] };
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, NCCL_SUCCESS);
    id
}

fn last_error() -> String {
    // SAFETY: returns a NUL-terminated thread-local string.
    unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
        .to_string_lossy()
        .into_owned()
}

/// Allgathers of `count` f32 per rank, every rank's call from this thread inside one group.
fn grouped_allgather(ranks: &[CudaRank], comms: &[ncclComm_t], count: usize) -> c_int {
    // SAFETY: live buffers/streams/communicators.
    unsafe {
        assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
        for (r, c) in ranks.iter().zip(comms) {
            assert_eq!(
                ncclAllGather(r.send, r.recv, count, NCCL_FLOAT32, *c, r.stream),
                NCCL_SUCCESS
            );
        }
        ncclGroupEnd()
    }
}

#[test]
fn version_and_error_strings() {
    let _g = setup();
    let mut v = 0;
    // SAFETY: valid out-pointer / NULL checked; static strings.
    unsafe {
        assert_eq!(ncclGetVersion(&mut v), NCCL_SUCCESS);
        assert_eq!(v, 22005);
        assert_eq!(ncclGetVersion(null_mut()), NCCL_INVALID_ARGUMENT);
        let s = |rc| CStr::from_ptr(ncclGetErrorString(rc)).to_str().unwrap();
        assert_eq!(s(NCCL_SUCCESS), "no error");
        assert!(s(NCCL_SYSTEM_ERROR).starts_with("unhandled system error"));
        assert!(s(NCCL_INVALID_ARGUMENT).starts_with("invalid argument"));
        assert!(s(NCCL_INVALID_USAGE).starts_with("invalid usage"));
        assert_eq!(s(99), "unknown result code");
    }
}

#[test]
fn grouped_single_thread_after_init_all() {
    let _g = setup();
    let (live, done) = (chd_fake_live_communicators(), chd_fake_collectives(0));
    let comms = init_all(&[0, 1]);
    assert_eq!(chd_fake_live_communicators(), live + 2);
    for (rank, &c) in comms.iter().enumerate() {
        let (mut n, mut dev, mut r) = (0, -1, -1);
        // SAFETY: live communicator, valid out-pointers.
        unsafe {
            assert_eq!(ncclCommCount(c, &mut n), NCCL_SUCCESS);
            assert_eq!(ncclCommCuDevice(c, &mut dev), NCCL_SUCCESS);
            assert_eq!(ncclCommUserRank(c, &mut r), NCCL_SUCCESS);
            let mut err = -1;
            assert_eq!(ncclCommGetAsyncError(c, &mut err), NCCL_SUCCESS);
            assert_eq!(err, NCCL_SUCCESS);
        }
        assert_eq!((n, dev, r), (2, rank as c_int, rank as c_int));
    }

    let ranks = [
        CudaRank::new(0, MIB16, 2, 11),
        CudaRank::new(1, MIB16, 2, 22),
    ];
    let iters = 5;
    ranks.iter().for_each(CudaRank::start);
    for _ in 0..iters {
        assert_eq!(grouped_allgather(&ranks, &comms, MIB16 / 4), NCCL_SUCCESS);
    }
    let want = gathered(MIB16, &[11, 22]);
    for r in &ranks {
        let ms = r.stop_ms();
        assert_rate(busbw_gbps(MIB16, 2, iters, ms), 13.7);
        assert!(r.recv_bytes() == want, "rank on device {}", r.device);
    }
    assert_eq!(chd_fake_collectives(0), done + 2 * iters as u64);
    destroy(&comms);
    assert_eq!(chd_fake_live_communicators(), live);
}

#[test]
fn one_thread_per_rank_after_init_rank() {
    let _g = setup();
    let done = chd_fake_collectives(0);
    let id = unique_id();
    // Rank 0 on device 3, rank 1 on device 0: the gather is in rank order, not device order.
    let devices = [3, 0];
    let seeds = [7u8, 99];
    let iters = 4;
    let barrier = Arc::new(std::sync::Barrier::new(2));
    let threads: Vec<_> = (0..2)
        .map(|rank| {
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                let r = CudaRank::new(devices[rank], MIB16, 2, seeds[rank]);
                let mut comm = null_mut();
                // SAFETY: valid out-pointer; the id is passed by value.
                let rc = unsafe { ncclCommInitRank(&mut comm, 2, id, rank as c_int) };
                assert_eq!(rc, NCCL_SUCCESS);
                let (mut dev, mut me) = (-1, -1);
                // SAFETY: live communicator.
                unsafe {
                    assert_eq!(ncclCommCuDevice(comm, &mut dev), NCCL_SUCCESS);
                    assert_eq!(ncclCommUserRank(comm, &mut me), NCCL_SUCCESS);
                }
                assert_eq!((dev, me), (devices[rank], rank as c_int));
                r.start();
                for _ in 0..iters {
                    // SAFETY: live buffers/stream/communicator.
                    let rc =
                        unsafe { ncclAllGather(r.send, r.recv, MIB16, NCCL_UINT8, comm, r.stream) };
                    assert_eq!(rc, NCCL_SUCCESS);
                }
                let ms = r.stop_ms();
                let bytes = r.recv_bytes();
                barrier.wait();
                // SAFETY: live communicator, destroyed once.
                assert_eq!(unsafe { ncclCommDestroy(comm) }, NCCL_SUCCESS);
                (ms, bytes)
            })
        })
        .collect();
    let want = gathered(MIB16, &seeds);
    for t in threads {
        let (ms, bytes) = t.join().unwrap();
        assert_rate(busbw_gbps(MIB16, 2, iters, ms), 13.7);
        assert!(bytes == want);
    }
    assert_eq!(chd_fake_collectives(0), done + 2 * iters as u64);
}

#[test]
fn collective_starts_when_the_last_rank_gets_there() {
    let _g = setup();
    let comms = init_all(&[2, 3]);
    let ranks = [CudaRank::new(2, MIB16, 2, 1), CudaRank::new(3, MIB16, 2, 2)];
    ranks.iter().for_each(CudaRank::start);
    // Rank 1's stream is busy for 64 MiB at 58.9 GB/s first.
    let host = pattern(64 << 20, 3);
    let mut scratch = null_mut();
    // SAFETY: device 3 is current (set by CudaRank::new); valid buffers.
    unsafe {
        assert_eq!(cudaSetDevice(3), CUDA_SUCCESS);
        assert_eq!(cudaMalloc(&mut scratch, host.len()), CUDA_SUCCESS);
        assert_eq!(
            cudaMemcpyAsync(
                scratch,
                host.as_ptr().cast(),
                host.len(),
                1,
                ranks[1].stream
            ),
            CUDA_SUCCESS
        );
    }
    assert_eq!(grouped_allgather(&ranks, &comms, MIB16 / 4), NCCL_SUCCESS);
    let busy_ms = common::expected_ms(64 << 20, 58.9);
    let coll_ms = common::expected_ms(MIB16, 13.7);
    common::assert_close(ranks[0].stop_ms(), busy_ms + coll_ms);
    common::assert_close(ranks[1].stop_ms(), busy_ms + coll_ms);
    // SAFETY: allocated above.
    assert_eq!(unsafe { cudaFree(scratch) }, CUDA_SUCCESS);
    destroy(&comms);
}

#[test]
fn in_place_and_null_stream_and_single_rank() {
    let _g = setup();
    let comms = init_all(&[0, 1]);
    let ranks = [CudaRank::new(0, 4096, 2, 5), CudaRank::new(1, 4096, 2, 6)];
    // In place: rank r's input already sits at recvbuff + r * bytes. NULL stream: the
    // device's default stream.
    // SAFETY: in-bounds offsets inside live receive buffers.
    unsafe {
        for (rank, r) in ranks.iter().enumerate() {
            let slot = r.recv.cast::<u8>().add(rank * 4096);
            assert_eq!(
                cudaMemcpy(slot.cast(), r.send, 4096, CUDA_MEMCPY_DEVICE_TO_DEVICE),
                CUDA_SUCCESS
            );
        }
        assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
        assert_eq!(ncclGroupStart(), NCCL_SUCCESS); // nested
        for (rank, r) in ranks.iter().enumerate() {
            let slot = r.recv.cast::<u8>().add(rank * 4096);
            assert_eq!(
                ncclAllGather(
                    slot.cast(),
                    r.recv,
                    4096,
                    NCCL_UINT8,
                    comms[rank],
                    null_mut()
                ),
                NCCL_SUCCESS
            );
        }
        assert_eq!(ncclGroupEnd(), NCCL_SUCCESS); // inner: nothing runs yet
        assert_eq!(ncclGroupEnd(), NCCL_SUCCESS);
    }
    let want = gathered(4096, &[5, 6]);
    assert!(ranks.iter().all(|r| r.recv_bytes() == want));
    destroy(&comms);

    // One rank: completes on its own, copies send to recv, takes no time.
    let r = CudaRank::new(2, 4096, 1, 9);
    let mut comm = null_mut();
    // SAFETY: valid out-pointer; live buffers.
    unsafe {
        assert_eq!(ncclCommInitRank(&mut comm, 1, unique_id(), 0), NCCL_SUCCESS);
        r.start();
        assert_eq!(
            ncclAllGather(r.send, r.recv, 4096, NCCL_UINT8, comm, r.stream),
            NCCL_SUCCESS
        );
        assert_eq!(r.stop_ms(), 0.0);
        assert_eq!(r.recv_bytes(), pattern(4096, 9));
        assert_eq!(ncclCommDestroy(comm), NCCL_SUCCESS);
    }
}

#[test]
fn argument_errors() {
    let _g = setup();
    let done = chd_fake_collectives(0);
    let comms = init_all(&[0, 1]);
    let ranks = [CudaRank::new(0, 4096, 2, 1), CudaRank::new(1, 4096, 2, 2)];
    let host = vec![0u8; 8192];
    let (r0, c0) = (&ranks[0], comms[0]);
    // SAFETY: every pointer is either live or deliberately bogus (never dereferenced by the
    // fake without validation).
    unsafe {
        // Bad datatype, NULL/unknown communicator.
        assert_eq!(
            ncclAllGather(r0.send, r0.recv, 16, 10, c0, r0.stream),
            NCCL_INVALID_ARGUMENT
        );
        assert!(last_error().contains("datatype"), "{}", last_error());
        assert_eq!(
            ncclAllGather(r0.send, r0.recv, 16, 0, null_mut(), r0.stream),
            NCCL_INVALID_ARGUMENT
        );
        assert_eq!(
            ncclAllGather(r0.send, r0.recv, 16, 0, 0x1234 as ncclComm_t, r0.stream),
            NCCL_INVALID_ARGUMENT
        );
        // Host memory, the other device's memory, a receive buffer too small.
        assert_eq!(
            ncclAllGather(host.as_ptr().cast(), r0.recv, 16, 0, c0, r0.stream),
            NCCL_INVALID_ARGUMENT
        );
        assert_eq!(
            ncclAllGather(ranks[1].send, r0.recv, 16, 0, c0, r0.stream),
            NCCL_INVALID_ARGUMENT
        );
        assert_eq!(
            ncclAllGather(r0.send, r0.recv, 4096, NCCL_FLOAT32, c0, r0.stream),
            NCCL_INVALID_ARGUMENT
        );
        assert_eq!(
            ncclAllGather(null(), r0.recv, 16, 0, c0, r0.stream),
            NCCL_INVALID_ARGUMENT
        );
        // A stream of another device, or a bogus one.
        assert_eq!(
            ncclAllGather(r0.send, r0.recv, 16, 0, c0, ranks[1].stream),
            NCCL_UNHANDLED_CUDA_ERROR
        );
        assert_eq!(
            ncclAllGather(r0.send, r0.recv, 16, 0, c0, 0x99999 as *mut c_void),
            NCCL_UNHANDLED_CUDA_ERROR
        );
        // A bad call inside a group fails the group; nothing runs.
        assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
        assert_eq!(
            ncclAllGather(r0.send, r0.recv, 16, 0, c0, r0.stream),
            NCCL_SUCCESS
        );
        assert_eq!(
            ncclAllGather(r0.send, r0.recv, 16, 42, comms[1], ranks[1].stream),
            NCCL_INVALID_ARGUMENT
        );
        assert_eq!(ncclGroupEnd(), NCCL_INVALID_ARGUMENT);
        assert_eq!(ncclGroupEnd(), NCCL_INVALID_USAGE);
        assert!(last_error().contains("ncclGroupStart"), "{}", last_error());

        // Init errors.
        let mut more = [null_mut(); 2];
        assert_eq!(
            ncclCommInitAll(more.as_mut_ptr(), 2, [1, 1].as_ptr()),
            NCCL_INVALID_USAGE
        );
        assert_eq!(
            ncclCommInitAll(more.as_mut_ptr(), 2, [0, 4].as_ptr()),
            NCCL_INVALID_ARGUMENT
        );
        assert_eq!(
            ncclCommInitAll(more.as_mut_ptr(), 0, null()),
            NCCL_INVALID_ARGUMENT
        );
        assert_eq!(
            ncclCommInitAll(null_mut(), 2, null()),
            NCCL_INVALID_ARGUMENT
        );
        let mut comm = null_mut();
        let zero = ncclUniqueId { internal: [0; 128] };
        assert_eq!(
            ncclCommInitRank(&mut comm, 2, zero, 0),
            NCCL_INVALID_ARGUMENT
        );
        assert_eq!(
            ncclCommInitRank(&mut comm, 2, unique_id(), 2),
            NCCL_INVALID_ARGUMENT
        );
        assert_eq!(
            ncclCommInitRank(&mut comm, 0, unique_id(), 0),
            NCCL_INVALID_ARGUMENT
        );
        assert_eq!(
            ncclCommInitRank(null_mut(), 1, unique_id(), 0),
            NCCL_INVALID_ARGUMENT
        );
        assert_eq!(ncclGetUniqueId(null_mut()), NCCL_INVALID_ARGUMENT);

        // Queries and destroy.
        let mut n = 0;
        assert_eq!(ncclCommCount(c0, null_mut()), NCCL_INVALID_ARGUMENT);
        assert_eq!(ncclCommCount(null_mut(), &mut n), NCCL_INVALID_ARGUMENT);
        assert_eq!(ncclCommDestroy(null_mut()), NCCL_SUCCESS);
        assert_eq!(ncclCommAbort(null_mut()), NCCL_SUCCESS);
    }
    // Nothing ran; the buffers are untouched.
    assert_eq!(chd_fake_collectives(0), done);
    assert!(ranks[0].recv_bytes().iter().all(|&b| b == 0));
    destroy(&comms);
    // SAFETY: destroyed above.
    assert_eq!(unsafe { ncclCommDestroy(comms[0]) }, NCCL_INVALID_ARGUMENT);
}

#[test]
fn ranks_disagreeing_on_the_size_both_fail() {
    let _g = setup();
    let comms = init_all(&[0, 1]);
    let ranks = [CudaRank::new(0, 4096, 2, 1), CudaRank::new(1, 4096, 2, 2)];
    // SAFETY: live buffers (rank 1 gathers fewer bytes than it could).
    unsafe {
        assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
        assert_eq!(
            ncclAllGather(
                ranks[0].send,
                ranks[0].recv,
                4096,
                0,
                comms[0],
                ranks[0].stream
            ),
            NCCL_SUCCESS
        );
        assert_eq!(
            ncclAllGather(
                ranks[1].send,
                ranks[1].recv,
                2048,
                0,
                comms[1],
                ranks[1].stream
            ),
            NCCL_SUCCESS
        );
        assert_eq!(ncclGroupEnd(), NCCL_INVALID_ARGUMENT);
    }
    destroy(&comms);
}

#[test]
fn abort_wakes_a_rank_waiting_for_its_peer() {
    let _g = setup();
    let live = chd_fake_live_communicators();
    let comms = init_all(&[0, 1]);
    let c0 = comms[0] as usize;
    let waiter = std::thread::spawn(move || {
        let r = CudaRank::new(0, 4096, 2, 1);
        let t = Instant::now();
        // SAFETY: live buffers/communicator.
        let rc = unsafe { ncclAllGather(r.send, r.recv, 4096, 0, c0 as ncclComm_t, r.stream) };
        (rc, t.elapsed())
    });
    std::thread::sleep(Duration::from_millis(100));
    // The way out of a hang: abort every rank, grouped, from another thread.
    // SAFETY: live communicators, each aborted once.
    unsafe {
        assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
        assert_eq!(ncclCommAbort(comms[0]), NCCL_SUCCESS);
        assert_eq!(ncclCommAbort(comms[1]), NCCL_SUCCESS);
        assert_eq!(ncclGroupEnd(), NCCL_SUCCESS);
    }
    let (rc, waited) = waiter.join().unwrap();
    assert_eq!(rc, NCCL_SYSTEM_ERROR);
    assert!(waited < Duration::from_secs(10), "{waited:?}");
    assert_eq!(chd_fake_live_communicators(), live);
    let mut err = 0;
    // SAFETY: aborted communicators are gone.
    unsafe {
        assert_eq!(
            ncclCommGetAsyncError(comms[0], &mut err),
            NCCL_INVALID_ARGUMENT
        );
    }
}

#[test]
fn a_broken_clique_fails_later_collectives_at_once() {
    let _g = setup();
    let comms = init_all(&[0, 1]);
    let ranks = [CudaRank::new(0, 4096, 2, 1), CudaRank::new(1, 4096, 2, 2)];
    // Rank 1 waits alone on its own thread until rank 0's abort (queued in a group with a
    // destroy of nothing else) breaks the clique.
    let c1 = comms[1] as usize;
    let (s1, r1, st1) = (
        ranks[1].send as usize,
        ranks[1].recv as usize,
        ranks[1].stream as usize,
    );
    let waiter = std::thread::spawn(move || {
        // SAFETY: live buffers/stream/communicator.
        unsafe {
            ncclAllGather(
                s1 as *const c_void,
                r1 as *mut c_void,
                4096,
                0,
                c1 as ncclComm_t,
                st1 as *mut c_void,
            )
        }
    });
    std::thread::sleep(Duration::from_millis(100));
    let aborter = {
        let c0 = comms[0] as usize;
        // Rank 0's abort breaks the clique at once, then waits for rank 1 to tear down too.
        // SAFETY: live communicator.
        std::thread::spawn(move || unsafe { ncclCommAbort(c0 as ncclComm_t) })
    };
    assert_eq!(waiter.join().unwrap(), NCCL_SYSTEM_ERROR);
    let mut err = 0;
    // SAFETY: rank 1 is still alive; its clique is broken.
    unsafe {
        assert_eq!(ncclCommGetAsyncError(comms[1], &mut err), NCCL_SUCCESS);
        assert_eq!(err, NCCL_SYSTEM_ERROR);
        assert_eq!(
            ncclAllGather(
                ranks[1].send,
                ranks[1].recv,
                4096,
                0,
                comms[1],
                ranks[1].stream
            ),
            NCCL_SYSTEM_ERROR
        );
        assert_eq!(ncclCommDestroy(comms[1]), NCCL_SUCCESS);
    }
    assert_eq!(aborter.join().unwrap(), NCCL_SUCCESS);
}

/// In-process `ncclAllReduce`: every rank's buffer holds the element-wise sum (u8 wraps), the
/// bus bandwidth (bytes x 2 (n - 1) / n / time) is exactly `CHD_FAKE_PAIR_GBPS`, max in
/// place works, and `ncclAvg` (unsupported) is refused.
#[test]
fn allreduce_grouped_after_init_all() {
    let _g = setup();
    let done = chd_fake_collectives(0);
    let comms = init_all(&[0, 1]);
    let ranks = [
        CudaRank::new(0, MIB16, 2, 11),
        CudaRank::new(1, MIB16, 2, 22),
    ];
    ranks.iter().for_each(CudaRank::start);
    let grouped = |op: c_int, in_place: bool| {
        // SAFETY: live buffers/streams/communicators; recv holds 2 x MIB16 bytes.
        unsafe {
            assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
            for (r, c) in ranks.iter().zip(&comms) {
                let send = if in_place {
                    r.recv.cast_const()
                } else {
                    r.send
                };
                let rc = ncclAllReduce(send, r.recv, MIB16, NCCL_UINT8, op, *c, r.stream);
                assert_eq!(rc, NCCL_SUCCESS);
            }
            ncclGroupEnd()
        }
    };
    assert_eq!(grouped(0, false), NCCL_SUCCESS);
    let (a, b) = (pattern(MIB16, 11), pattern(MIB16, 22));
    let sum: Vec<u8> = a.iter().zip(&b).map(|(x, y)| x.wrapping_add(*y)).collect();
    for r in &ranks {
        let ms = r.stop_ms();
        let busbw = MIB16 as f64 * 2.0 * (2.0 - 1.0) / 2.0 / (f64::from(ms) * 1e-3) / 1e9;
        assert_rate(busbw, 13.7);
        assert!(r.recv_bytes()[..MIB16] == sum[..], "device {}", r.device);
    }
    assert_eq!(chd_fake_collectives(0), done + 2);

    // Max, in place over the sums: the sums are equal on both ranks, so they stay.
    assert_eq!(grouped(2, true), NCCL_SUCCESS);
    for r in &ranks {
        assert!(r.recv_bytes()[..MIB16] == sum[..], "device {}", r.device);
    }
    // SAFETY: live buffers; op 4 (ncclAvg) is refused before anything runs.
    let rc = unsafe {
        ncclAllReduce(
            ranks[0].send,
            ranks[0].recv,
            16,
            NCCL_UINT8,
            4,
            comms[0],
            null_mut(),
        )
    };
    assert_eq!(rc, NCCL_INVALID_ARGUMENT);
    assert!(last_error().contains("reduction op 4"), "{}", last_error());
    destroy(&comms);
}
