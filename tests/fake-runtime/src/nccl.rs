//! The exported NCCL subset (`libnccl.so.2` role, NCCL 2.20.5 ABI): communicators (all at
//! once, or rank by rank on a unique id), allgather, all-reduce, point-to-point send/recv
//! (cross-process 2-rank communicators), groups, error strings and queries, on top of
//! [`crate::collective`].
//!
//! Safety contract shared by every function here: pointer arguments must be null or valid
//! for the access nccl.h documents (out-pointers writable, `devlist` readable for `ndev`
//! ints). Communicators and streams are validated against the registries; buffers must lie in
//! device allocations of the communicator's device. No panic crosses the boundary (it becomes
//! `ncclInternalError`).

#![allow(non_snake_case, non_camel_case_types)]
#![allow(
    clippy::missing_safety_doc,
    reason = "the module documentation states the contract shared by all these C entry points"
)]

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::collective::{self, CollError, Lib, Prepared, Teardown};
use crate::ffi;
use crate::net::{self, comm as net_comm};

/// `ncclResult_t`.
pub type NcclResult = c_int;

pub const NCCL_SUCCESS: NcclResult = 0;
pub const NCCL_UNHANDLED_CUDA_ERROR: NcclResult = 1;
pub const NCCL_SYSTEM_ERROR: NcclResult = 2;
pub const NCCL_INTERNAL_ERROR: NcclResult = 3;
pub const NCCL_INVALID_ARGUMENT: NcclResult = 4;
pub const NCCL_INVALID_USAGE: NcclResult = 5;
pub const NCCL_REMOTE_ERROR: NcclResult = 6;
pub const NCCL_IN_PROGRESS: NcclResult = 7;

/// `NCCL_VERSION_CODE` of NCCL 2.20.5.
pub const NCCL_VERSION: c_int = 22005;

/// `NCCL_UNIQUE_ID_BYTES`.
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// Leading bytes of every unique id this library hands out.
const ID_MAGIC: &[u8; 12] = b"CHDFAKE\0NCCL";

/// `ncclUniqueId`: passed by value to `ncclCommInitRank`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ncclUniqueId {
    pub internal: [c_char; NCCL_UNIQUE_ID_BYTES],
}

const _: () = assert!(std::mem::size_of::<ncclUniqueId>() == 128);

/// `ncclComm_t`: an opaque handle.
pub type ncclComm_t = *mut c_void;

/// `ncclDataType_t` -> element size (NCCL 2.20: `ncclInt8`/`ncclChar` 0 ... `ncclBfloat16` 9).
pub fn nccl_type_size(datatype: c_int) -> Option<usize> {
    match datatype {
        0 | 1 => Some(1), // ncclInt8 (= ncclChar), ncclUint8
        2 | 3 => Some(4), // ncclInt32 (= ncclInt), ncclUint32
        4 | 5 => Some(8), // ncclInt64, ncclUint64
        6 => Some(2),     // ncclFloat16 (= ncclHalf)
        7 => Some(4),     // ncclFloat32 (= ncclFloat)
        8 => Some(8),     // ncclFloat64 (= ncclDouble)
        9 => Some(2),     // ncclBfloat16
        _ => None,
    }
}

fn code(e: &CollError) -> NcclResult {
    match e {
        CollError::NullPointer(_) | CollError::InvalidArgument(_) => NCCL_INVALID_ARGUMENT,
        CollError::InvalidUsage(_) | CollError::Busy(_) | CollError::Unsupported(_) => {
            NCCL_INVALID_USAGE
        }
        CollError::BadStream(_) | CollError::NoDevice => NCCL_UNHANDLED_CUDA_ERROR,
        CollError::Planted | CollError::Timeout | CollError::Aborted | CollError::System(_) => {
            NCCL_SYSTEM_ERROR
        }
        CollError::Remote(_) => NCCL_REMOTE_ERROR,
        CollError::Internal => NCCL_INTERNAL_ERROR,
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
}

/// The calling thread's open group.
#[derive(Default)]
struct Group {
    depth: usize,
    calls: Vec<Prepared>,
    /// Collectives of cross-process communicators, run in order at `ncclGroupEnd`.
    net_calls: Vec<NetCall>,
    /// `ncclCommDestroy`/`ncclCommAbort` calls queued for `ncclGroupEnd`.
    teardowns: Vec<(usize, Teardown)>,
    /// First error of a call made inside the group; `ncclGroupEnd` returns it.
    error: Option<CollError>,
}

/// A queued collective of a cross-process communicator.
type NetCall = Box<dyn FnOnce() -> Result<(), CollError>>;

fn api(name: &str, body: impl FnOnce() -> Result<(), CollError>) -> NcclResult {
    let mut failure = None;
    let rc = ffi::guard(NCCL_INTERNAL_ERROR, || match body() {
        Ok(()) => NCCL_SUCCESS,
        Err(e) => {
            let rc = code(&e);
            failure = Some(e);
            rc
        }
    });
    if rc != NCCL_SUCCESS {
        let why = failure.map_or_else(|| "internal error".to_owned(), |e| e.to_string());
        let text = CString::new(format!("{name}: {why}").replace('\0', " ")).unwrap_or_default();
        LAST_ERROR.with(|e| *e.borrow_mut() = text);
    }
    rc
}

/// # Safety
/// `out` must be null or writable.
unsafe fn put<T>(out: *mut T, value: T, what: &'static str) -> Result<(), CollError> {
    // SAFETY: forwarded contract.
    if unsafe { ffi::write(out, value) } {
        Ok(())
    } else {
        Err(CollError::NullPointer(what))
    }
}

/// `ncclGetVersion`: 22005 (NCCL 2.20.5).
#[no_mangle]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> NcclResult {
    // SAFETY: module contract.
    api("ncclGetVersion", || unsafe {
        put(version, NCCL_VERSION, "version")
    })
}

/// `ncclGetUniqueId`: a fresh id naming one `ncclCommInitRank` rendezvous: the address of a
/// root listener (on `NCCL_COMM_ID`, else the `NCCL_SOCKET_IFNAME` interface) and a nonce.
#[no_mangle]
pub unsafe extern "C" fn ncclGetUniqueId(unique_id: *mut ncclUniqueId) -> NcclResult {
    api("ncclGetUniqueId", || {
        if unique_id.is_null() {
            return Err(CollError::NullPointer("uniqueId"));
        }
        let id = net::new_id(fresh_id(ID_MAGIC), net::NCCL)?;
        let mut internal = [0 as c_char; NCCL_UNIQUE_ID_BYTES];
        for (slot, byte) in internal.iter_mut().zip(id) {
            *slot = byte as c_char;
        }
        // SAFETY: module contract.
        unsafe { put(unique_id, ncclUniqueId { internal }, "uniqueId") }
    })
}

/// Magic, pid and a process-wide counter: unique within the process and across processes.
pub(crate) fn fresh_id(magic: &[u8]) -> Vec<u8> {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let mut id = magic.to_vec();
    id.extend_from_slice(&std::process::id().to_le_bytes());
    id.extend_from_slice(&NEXT.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    id
}

/// `ncclCommInitRank`: rank `rank` of `nranks`, on the calling thread's current device.
/// Blocks until all `nranks` ranks called it with the same id (or `CHD_FAKE_PAIR_TIMEOUT_MS`
/// passed: `ncclSystemError`). The id must come from [`ncclGetUniqueId`] (of any process):
/// in-process when made here and every rank joins here, else over sockets (`crate::net`).
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRank(
    comm: *mut ncclComm_t,
    nranks: c_int,
    comm_id: ncclUniqueId,
    rank: c_int,
) -> NcclResult {
    api("ncclCommInitRank", || {
        if comm.is_null() {
            return Err(CollError::NullPointer("comm"));
        }
        let id: Vec<u8> = comm_id.internal.iter().map(|&c| c as u8).collect();
        if !id.starts_with(ID_MAGIC) {
            return Err(CollError::InvalidArgument(
                "the unique id was not made by ncclGetUniqueId".to_owned(),
            ));
        }
        let (Ok(nranks), Ok(rank)) = (usize::try_from(nranks), usize::try_from(rank)) else {
            return Err(CollError::InvalidArgument(format!(
                "rank {rank} / nranks {nranks} out of range"
            )));
        };
        let handle = net::init_rank(Lib::Nccl, &id, nranks, rank, net::NCCL)?;
        // SAFETY: module contract.
        unsafe { put(comm, handle, "comm") }
    })
}

/// `ncclCommInitAll`: `ndev` communicators in one clique, rank `i` on `devlist[i]` (NULL
/// `devlist`: devices `0..ndev`). Devices must be valid and distinct.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitAll(
    comms: *mut ncclComm_t,
    ndev: c_int,
    devlist: *const c_int,
) -> NcclResult {
    api("ncclCommInitAll", || {
        if comms.is_null() {
            return Err(CollError::NullPointer("comms"));
        }
        let n = usize::try_from(ndev)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| CollError::InvalidArgument(format!("ndev {ndev} must be positive")))?;
        let devices: Vec<i64> = if devlist.is_null() {
            (0..n as i64).collect()
        } else {
            // SAFETY: `devlist` is readable for `ndev` ints (module contract).
            unsafe { std::slice::from_raw_parts(devlist, n) }
                .iter()
                .map(|&d| i64::from(d))
                .collect()
        };
        let handles = collective::init_all(Lib::Nccl, &devices)?;
        // SAFETY: `comms` is writable for `ndev` handles (module contract).
        unsafe { std::ptr::copy_nonoverlapping(handles.as_ptr(), comms, n) };
        Ok(())
    })
}

/// `ncclCommFinalize`: nothing is ever in flight, so this only validates `comm`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommFinalize(comm: ncclComm_t) -> NcclResult {
    api("ncclCommFinalize", || {
        collective::comm_info(Lib::Nccl, comm).map(|_| ())
    })
}

/// Tears `comm` down now (outside a group) or at `ncclGroupEnd` (inside one; the handle is
/// checked now).
fn tear_down(comm: ncclComm_t, how: Teardown) -> Result<(), CollError> {
    if comm.is_null() {
        return Ok(());
    }
    collective::check_nccl(comm)?;
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            drop(g);
            return teardown(&[(comm as usize, how)]);
        }
        g.teardowns.push((comm as usize, how));
        Ok(())
    })
}

/// Tears down cross-process communicators (local: their peers see the connections close)
/// and, together, the in-process ones.
fn teardown(calls: &[(usize, Teardown)]) -> Result<(), CollError> {
    let (remote, local): (Vec<_>, Vec<_>) = calls
        .iter()
        .partition(|&&(h, _)| net_comm::is_comm(Lib::Nccl, h as ncclComm_t));
    let mut result = collective::teardown(&local);
    for (h, how) in remote {
        let r = net_comm::teardown(Lib::Nccl, h as ncclComm_t, how == Teardown::Abort);
        result = result.and(r);
    }
    result
}

/// `ncclCommDestroy`: an intra-node collective call (see `collective::teardown`): returns
/// once every rank of the communicator's clique called `ncclCommDestroy` or `ncclCommAbort`
/// (from other threads, or queued in the same group), else `ncclInvalidUsage` after
/// `CHD_FAKE_PAIR_TIMEOUT_MS` with the communicator still alive. NULL is a no-op.
#[no_mangle]
pub unsafe extern "C" fn ncclCommDestroy(comm: ncclComm_t) -> NcclResult {
    api("ncclCommDestroy", || tear_down(comm, Teardown::Destroy))
}

/// `ncclCommAbort`: breaks the clique at once (ranks blocked in one of its collectives return
/// `ncclSystemError`, later collectives fail), then tears down like [`ncclCommDestroy`] and
/// blocks `CHD_FAKE_ABORT_HANG_MS` more. NULL is a no-op.
#[no_mangle]
pub unsafe extern "C" fn ncclCommAbort(comm: ncclComm_t) -> NcclResult {
    api("ncclCommAbort", || tear_down(comm, Teardown::Abort))
}

/// `ncclCommCount`: number of ranks.
#[no_mangle]
pub unsafe extern "C" fn ncclCommCount(comm: ncclComm_t, count: *mut c_int) -> NcclResult {
    api("ncclCommCount", || {
        let info = collective::comm_info(Lib::Nccl, comm)?;
        // SAFETY: module contract.
        unsafe { put(count, info.nranks as c_int, "count") }
    })
}

/// `ncclCommCuDevice`: the communicator's CUDA device.
#[no_mangle]
pub unsafe extern "C" fn ncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> NcclResult {
    api("ncclCommCuDevice", || {
        let info = collective::comm_info(Lib::Nccl, comm)?;
        // SAFETY: module contract.
        unsafe { put(device, info.device as c_int, "device") }
    })
}

/// `ncclCommUserRank`: the communicator's rank.
#[no_mangle]
pub unsafe extern "C" fn ncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> NcclResult {
    api("ncclCommUserRank", || {
        let info = collective::comm_info(Lib::Nccl, comm)?;
        // SAFETY: module contract.
        unsafe { put(rank, info.rank as c_int, "rank") }
    })
}

/// `ncclCommGetAsyncError`: `ncclSystemError` once the clique is broken (a rank's rendezvous
/// timed out, or a communicator of it was aborted), else `ncclSuccess`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommGetAsyncError(
    comm: ncclComm_t,
    async_error: *mut NcclResult,
) -> NcclResult {
    api("ncclCommGetAsyncError", || {
        let info = collective::comm_info(Lib::Nccl, comm)?;
        let rc = info.async_error.as_ref().map_or(NCCL_SUCCESS, code);
        // SAFETY: module contract.
        unsafe { put(async_error, rc, "asyncError") }
    })
}

/// `ncclAllGather`: rank `r`'s `sendcount` elements land at `recvbuff + r * sendcount` on
/// every rank. Outside a group the call blocks until every rank of the communicator made its
/// matching call and the operation ran; inside a group it is queued for `ncclGroupEnd`.
#[no_mangle]
pub unsafe extern "C" fn ncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: c_int,
    comm: ncclComm_t,
    stream: *mut c_void,
) -> NcclResult {
    api("ncclAllGather", || {
        if net_comm::is_comm(Lib::Nccl, comm) {
            let size = nccl_type_size(datatype).ok_or_else(|| {
                CollError::InvalidArgument(format!("invalid datatype {datatype}"))
            })?;
            let bytes = sendcount.checked_mul(size).ok_or_else(|| {
                CollError::InvalidArgument(format!("count {sendcount} is too large"))
            })?;
            let (send, recv, stream) = (sendbuff as usize, recvbuff as usize, stream as usize);
            return net_call(Box::new(move || {
                net_comm::allgather(
                    Lib::Nccl,
                    comm,
                    send as *const c_void,
                    recv as *mut c_void,
                    bytes,
                    stream as *mut c_void,
                )
            }));
        }
        let prepared = nccl_type_size(datatype)
            .ok_or_else(|| CollError::InvalidArgument(format!("invalid datatype {datatype}")))
            .and_then(|size| {
                collective::prepare_allgather(
                    Lib::Nccl,
                    comm,
                    sendbuff,
                    recvbuff,
                    sendcount as u64,
                    size,
                    stream,
                )
            });
        in_process_call(prepared)
    })
}

/// Runs a validated in-process collective now (outside a group) or queues it for
/// `ncclGroupEnd`; a call that failed validation inside a group fails the group.
fn in_process_call(prepared: Result<Prepared, CollError>) -> Result<(), CollError> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            drop(g);
            return collective::run(vec![prepared?]);
        }
        match prepared {
            Ok(p) => {
                g.calls.push(p);
                Ok(())
            }
            Err(e) => {
                g.error.get_or_insert(e.clone());
                Err(e)
            }
        }
    })
}

/// Runs a cross-process collective now (outside a group) or queues it for `ncclGroupEnd`.
fn net_call(call: NetCall) -> Result<(), CollError> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            drop(g);
            return call();
        }
        g.net_calls.push(call);
        Ok(())
    })
}

/// `ncclAllReduce`: `count` elements of `datatype` reduced with `op` (0 sum, 1 prod, 2 max,
/// 3 min) into `recvbuff` on every rank (in place is fine): in-process like
/// [`ncclAllGather`] (timed at `CHD_FAKE_PAIR_GBPS` bus bandwidth), across processes a ring
/// over the sockets.
#[no_mangle]
pub unsafe extern "C" fn ncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    op: c_int,
    comm: ncclComm_t,
    stream: *mut c_void,
) -> NcclResult {
    api("ncclAllReduce", || {
        let elem = net::reduce::Elem::from_nccl(datatype)
            .ok_or_else(|| CollError::InvalidArgument(format!("invalid datatype {datatype}")))?;
        let op = net::reduce::RedOp::from_nccl(op)
            .ok_or_else(|| CollError::InvalidArgument(format!("invalid reduction op {op}")))?;
        if !net_comm::is_comm(Lib::Nccl, comm) {
            let prepared = collective::prepare_allreduce(
                Lib::Nccl,
                comm,
                sendbuff,
                recvbuff,
                count as u64,
                elem,
                op,
                stream,
            );
            return in_process_call(prepared);
        }
        let (send, recv, stream) = (sendbuff as usize, recvbuff as usize, stream as usize);
        net_call(Box::new(move || {
            net_comm::allreduce(
                Lib::Nccl,
                comm,
                send as *const c_void,
                recv as *mut c_void,
                count,
                elem,
                op,
                stream as *mut c_void,
            )
        }))
    })
}

/// Point-to-point for `ncclSend` / `ncclRecv`: the arguments checked here, the transfer
/// queued or run like a collective ([`net_call`]).
fn p2p(
    dir: net_comm::Direction,
    buf: *mut c_void,
    count: usize,
    datatype: c_int,
    peer: c_int,
    comm: ncclComm_t,
    stream: *mut c_void,
) -> Result<(), CollError> {
    let size = nccl_type_size(datatype)
        .ok_or_else(|| CollError::InvalidArgument(format!("invalid datatype {datatype}")))?;
    let bytes = count
        .checked_mul(size)
        .ok_or_else(|| CollError::InvalidArgument(format!("count {count} is too large")))?;
    let info = collective::comm_info(Lib::Nccl, comm)?;
    let peer = usize::try_from(peer)
        .ok()
        .filter(|&p| p < info.nranks)
        .ok_or_else(|| {
            CollError::InvalidArgument(format!(
                "peer {peer} is out of range for {} ranks",
                info.nranks
            ))
        })?;
    if bytes > 0 && buf.is_null() {
        return Err(CollError::NullPointer(match dir {
            net_comm::Direction::Send => "sendbuff",
            net_comm::Direction::Recv => "recvbuff",
        }));
    }
    if bytes == 0 {
        // NCCL accepts a 0-count send/recv; nothing moves.
        return Ok(());
    }
    if !net_comm::is_comm(Lib::Nccl, comm) {
        return Err(CollError::Unsupported(
            "point-to-point send/recv is not supported by the fake in-process (communicators \
             of ncclCommInitAll, or whose ranks all joined in one process); it supports \
             2-rank communicators across processes"
                .to_owned(),
        ));
    }
    let (buf, stream) = (buf as usize, stream as usize);
    net_call(Box::new(move || {
        net_comm::p2p(
            Lib::Nccl,
            dir,
            comm,
            buf as *mut c_void,
            bytes,
            size,
            peer,
            stream as *mut c_void,
        )
    }))
}

// Signatures as nccl.h (NCCL 2.7+, `src/nccl.h.in`) declares them:
//   ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype,
//                         int peer, ncclComm_t comm, cudaStream_t stream);
//   ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
//                         ncclComm_t comm, cudaStream_t stream);

/// `ncclSend`: `count` elements of `datatype` from `sendbuff` to rank `peer`, which must
/// call [`ncclRecv`] with the same count and datatype from this rank (else both fail with
/// `ncclInvalidArgument`). Cross-process communicators of exactly 2 ranks only (others:
/// `ncclInvalidUsage`); blocking outside a group, queued for `ncclGroupEnd` inside one (run
/// in order there, not concurrently: a group holding a send and a receive both ways is not
/// supported). The stream advances by the wall time the bytes took. Count 0: success,
/// nothing moves.
#[no_mangle]
pub unsafe extern "C" fn ncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: c_int,
    peer: c_int,
    comm: ncclComm_t,
    stream: *mut c_void,
) -> NcclResult {
    api("ncclSend", || {
        let dir = net_comm::Direction::Send;
        p2p(
            dir,
            sendbuff as *mut c_void,
            count,
            datatype,
            peer,
            comm,
            stream,
        )
    })
}

/// `ncclRecv`: `count` elements of `datatype` from rank `peer` (its matching [`ncclSend`])
/// into `recvbuff`; otherwise as [`ncclSend`].
#[no_mangle]
pub unsafe extern "C" fn ncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    peer: c_int,
    comm: ncclComm_t,
    stream: *mut c_void,
) -> NcclResult {
    api("ncclRecv", || {
        let dir = net_comm::Direction::Recv;
        p2p(dir, recvbuff, count, datatype, peer, comm, stream)
    })
}

/// `ncclGroupStart`: opens (or nests) the calling thread's group.
#[no_mangle]
pub unsafe extern "C" fn ncclGroupStart() -> NcclResult {
    api("ncclGroupStart", || {
        GROUP.with(|g| g.borrow_mut().depth += 1);
        Ok(())
    })
}

/// `ncclGroupEnd`: closing the outermost group runs the queued collectives (all ranks' calls
/// may come from this one thread) and blocks until they ran, then the queued destroys and
/// aborts (together, so one thread may tear down every rank of a clique). Returns the first
/// error of the group, including one returned by a call inside it (then nothing runs).
/// Without an open group: `ncclInvalidUsage`.
#[no_mangle]
pub unsafe extern "C" fn ncclGroupEnd() -> NcclResult {
    api("ncclGroupEnd", || {
        let queued = GROUP.with(|g| {
            let mut g = g.borrow_mut();
            if g.depth == 0 {
                return Err(CollError::InvalidUsage(
                    "ncclGroupEnd without ncclGroupStart".to_owned(),
                ));
            }
            g.depth -= 1;
            if g.depth > 0 {
                return Ok(None);
            }
            let calls = std::mem::take(&mut g.calls);
            let net_calls = std::mem::take(&mut g.net_calls);
            let teardowns = std::mem::take(&mut g.teardowns);
            match g.error.take() {
                Some(e) => Err(e),
                None => Ok(Some((calls, net_calls, teardowns))),
            }
        })?;
        let Some((calls, net_calls, teardowns)) = queued else {
            return Ok(());
        };
        let mut ran = collective::run(calls);
        for call in net_calls {
            ran = ran.and(call());
        }
        let torn = teardown(&teardowns);
        ran.and(torn)
    })
}

/// `ncclGetErrorString`: NCCL 2.20's wording.
#[no_mangle]
pub unsafe extern "C" fn ncclGetErrorString(result: NcclResult) -> *const c_char {
    match result {
        NCCL_SUCCESS => c"no error",
        NCCL_UNHANDLED_CUDA_ERROR => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        NCCL_SYSTEM_ERROR => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        NCCL_INTERNAL_ERROR => c"internal error - please report this issue to the NCCL developers",
        NCCL_INVALID_ARGUMENT => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        NCCL_INVALID_USAGE => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        NCCL_REMOTE_ERROR => c"remote process exited or there was a network error",
        NCCL_IN_PROGRESS => c"NCCL operation in progress",
        _ => c"unknown result code",
    }
    .as_ptr()
}

/// `ncclGetLastError`: the calling thread's last failure message (`comm` is ignored), e.g.
/// `ncclAllGather: collective failed (CHD_FAKE_PAIR_FAIL)`; `""` if none. Valid until the
/// thread's next failing NCCL call.
#[no_mangle]
pub unsafe extern "C" fn ncclGetLastError(_comm: ncclComm_t) -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}
