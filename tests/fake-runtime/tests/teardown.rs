//! Communicator teardown rules. NCCL: `ncclCommDestroy` "is an intra-node collective call,
//! which all ranks on the same node should call to avoid a hang", and `ncclCommAbort` needs
//! "all active ranks" (NCCL API reference, comms.rst): one thread holding several ranks must
//! group the calls, or each rank's thread makes its own. Ungrouped one-by-one teardown from a
//! single thread waits for ranks that never come: real NCCL hangs, the fake gives up after
//! `CHD_FAKE_PAIR_TIMEOUT_MS` with `ncclInvalidUsage` and keeps the communicators. HCCL:
//! `HcclCommDestroy` returns `HCCL_E_AGAIN` while a collective of the communicator is in
//! flight (CANN 8.0 HCCL API reference; `HCCL_E_AGAIN` = 20 in `hccl_types.h`).
//! `CHD_FAKE_ABORT_HANG_MS` makes every abort return late.

mod common;

use std::ffi::{c_int, CStr};
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use chd_fake_runtime::hccl::*;
use chd_fake_runtime::hooks::*;
use chd_fake_runtime::nccl::*;
use common::{AclRank, CudaRank};

const TIMEOUT: Duration = Duration::from_millis(400);
const HANG: Duration = Duration::from_millis(1500);
const ABORT_HANG: Duration = Duration::from_millis(300);

fn setup() -> std::sync::MutexGuard<'static, ()> {
    common::setup(&[
        ("CHD_FAKE_DEVICE_COUNT", "2"),
        ("CHD_FAKE_PAIR_TIMEOUT_MS", "400"),
        ("CHD_FAKE_PAIR_HANG_MS", "1500"),
        ("CHD_FAKE_ABORT_HANG_MS", "300"),
    ])
}

fn nccl_pair() -> [ncclComm_t; 2] {
    let mut comms = [null_mut(); 2];
    // SAFETY: room for two handles.
    let rc = unsafe { ncclCommInitAll(comms.as_mut_ptr(), 2, null_mut()) };
    assert_eq!(rc, NCCL_SUCCESS);
    comms
}

fn last_error() -> String {
    // SAFETY: returns a NUL-terminated thread-local string.
    unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn one_thread_destroying_ranks_one_by_one_is_refused() {
    let _g = setup();
    let live = chd_fake_live_communicators();
    let comms = nccl_pair();
    let t = Instant::now();
    // SAFETY: live communicator.
    assert_eq!(unsafe { ncclCommDestroy(comms[0]) }, NCCL_INVALID_USAGE);
    assert!(t.elapsed() >= TIMEOUT, "{:?}", t.elapsed());
    let why = last_error();
    assert!(
        why.contains("ncclGroupStart/End") && why.contains("hangs"),
        "{why}"
    );
    // Nothing was destroyed.
    assert_eq!(chd_fake_live_communicators(), live + 2);

    // Grouped, the same thread tears both down at once.
    let t = Instant::now();
    common::destroy_nccl(&comms);
    assert!(t.elapsed() < TIMEOUT, "{:?}", t.elapsed());
    assert_eq!(chd_fake_live_communicators(), live);
}

#[test]
fn each_rank_destroying_from_its_own_thread_works() {
    let _g = setup();
    let live = chd_fake_live_communicators();
    let comms = nccl_pair().map(|c| c as usize);
    let threads: Vec<_> = comms
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            std::thread::spawn(move || {
                // Rank 1 comes a little later; rank 0 waits for it.
                std::thread::sleep(Duration::from_millis(100 * i as u64));
                // SAFETY: live communicator, destroyed once.
                unsafe { ncclCommDestroy(c as ncclComm_t) }
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), NCCL_SUCCESS);
    }
    assert_eq!(chd_fake_live_communicators(), live);
}

#[test]
fn grouped_abort_ends_a_hang_and_returns_late() {
    let _g = setup();
    let live = chd_fake_live_communicators();
    let comms = nccl_pair();
    let handles = comms.map(|c| c as usize);
    let worker = std::thread::spawn(move || {
        let ranks = [CudaRank::new(0, 4096, 2, 1), CudaRank::new(1, 4096, 2, 2)];
        // SAFETY: live buffers/streams/communicators.
        unsafe {
            assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
            for (r, c) in ranks.iter().zip(handles) {
                let rc = ncclAllGather(r.send, r.recv, 4096, 0, c as ncclComm_t, r.stream);
                assert_eq!(rc, NCCL_SUCCESS);
            }
            ncclGroupEnd()
        }
    });
    std::thread::sleep(Duration::from_millis(150));
    let t = Instant::now();
    // SAFETY: live communicators, each aborted once.
    unsafe {
        assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
        assert_eq!(ncclCommAbort(comms[0]), NCCL_SUCCESS);
        assert_eq!(ncclCommAbort(comms[1]), NCCL_SUCCESS);
        assert_eq!(ncclGroupEnd(), NCCL_SUCCESS);
    }
    let took = t.elapsed();
    assert!(took >= ABORT_HANG && took < HANG, "{took:?}");
    assert_eq!(worker.join().unwrap(), NCCL_SYSTEM_ERROR);
    assert_eq!(chd_fake_live_communicators(), live);
}

#[test]
fn an_ungrouped_abort_breaks_the_clique_but_waits_for_the_other_rank() {
    let _g = setup();
    let live = chd_fake_live_communicators();
    let comms = nccl_pair();
    // SAFETY: live communicator.
    assert_eq!(unsafe { ncclCommAbort(comms[1]) }, NCCL_INVALID_USAGE);
    assert_eq!(chd_fake_live_communicators(), live + 2);
    let mut err = 0;
    // SAFETY: live communicator; its clique is broken.
    unsafe {
        assert_eq!(ncclCommGetAsyncError(comms[0], &mut err), NCCL_SUCCESS);
    }
    assert_eq!(err, NCCL_SYSTEM_ERROR);
    common::destroy_nccl(&comms);
    assert_eq!(chd_fake_live_communicators(), live);
    // Tearing down a communicator twice in one group is a usage error.
    let comms = nccl_pair();
    // SAFETY: live communicators.
    unsafe {
        assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
        assert_eq!(ncclCommDestroy(comms[0]), NCCL_SUCCESS);
        assert_eq!(ncclCommDestroy(comms[0]), NCCL_SUCCESS);
        assert_eq!(ncclGroupEnd(), NCCL_INVALID_USAGE);
    }
    common::destroy_nccl(&comms);
}

#[test]
fn hccl_destroy_says_try_again_while_an_allgather_is_in_flight() {
    let _g = setup();
    let live = chd_fake_live_communicators();
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
                // Rank 1 joins late: rank 0 is in flight waiting for it, then both hang.
                std::thread::sleep(Duration::from_millis(200 * rank as u64));
                // SAFETY: live buffers/stream/communicator.
                unsafe {
                    HcclAllGather(r.send, r.recv, 4096, 0, handles[rank] as HcclComm, r.stream)
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    // SAFETY: live communicators; static strings.
    unsafe {
        // Rank 0 waits for its peer: in flight already.
        assert_eq!(HcclCommDestroy(comms[0]), HCCL_E_AGAIN);
        std::thread::sleep(Duration::from_millis(400));
        // Now both are inside the hanging operation.
        assert_eq!(HcclCommDestroy(comms[0]), HCCL_E_AGAIN);
        assert_eq!(HcclCommDestroy(comms[1]), HCCL_E_AGAIN);
        assert_eq!(
            CStr::from_ptr(HcclGetErrorString(HCCL_E_AGAIN)).to_str(),
            Ok("try again")
        );
    }
    assert_eq!(chd_fake_live_communicators(), live + 2);
    for t in threads {
        assert_eq!(t.join().unwrap(), HCCL_SUCCESS);
    }
    // Done: destroy works, from this one thread, one by one (HCCL destroy is local).
    // SAFETY: live communicators, destroyed once.
    unsafe {
        assert_eq!(HcclCommDestroy(comms[0]), HCCL_SUCCESS);
        assert_eq!(HcclCommDestroy(comms[1]), HCCL_SUCCESS);
    }
    assert_eq!(chd_fake_live_communicators(), live);
}
