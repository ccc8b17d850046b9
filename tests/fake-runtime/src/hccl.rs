//! The exported HCCL subset (`libhccl.so` role, CANN `hccl.h` / `hccl_types.h`):
//! communicators (all at once, or rank by rank on a root info), allgather, all-reduce,
//! point-to-point send/recv (cross-process 2-rank communicators), rank queries, async error
//! and error strings, on top of [`crate::collective`] (same model and
//! `CHD_FAKE_PAIR_*` variables as NCCL). HCCL has no group calls: `HcclAllGather` always
//! blocks until every rank of the communicator made its matching call, so each rank needs its
//! own thread.
//!
//! Safety contract shared by every function here: pointer arguments must be null or valid
//! for the access hccl.h documents (out-pointers writable, `devices` readable and `comms`
//! writable for `ndev` entries, `rootInfo` readable for 4108 bytes). Communicators and
//! streams are validated against the registries; buffers must lie in device allocations of
//! the communicator's device. No panic crosses the boundary (it becomes `HCCL_E_INTERNAL`).

#![allow(non_snake_case, non_camel_case_types)]
#![allow(
    clippy::missing_safety_doc,
    reason = "the module documentation states the contract shared by all these C entry points"
)]

use std::ffi::{c_char, c_int, c_void};

use crate::collective::{self, CollError, Lib};
use crate::ffi;
use crate::nccl::fresh_id;
use crate::net::{self, comm as net_comm};

/// `HcclResult` (values from `hccl_types.h`).
pub type HcclResult = c_int;

pub const HCCL_SUCCESS: HcclResult = 0;
pub const HCCL_E_PARA: HcclResult = 1;
pub const HCCL_E_PTR: HcclResult = 2;
pub const HCCL_E_MEMORY: HcclResult = 3;
pub const HCCL_E_INTERNAL: HcclResult = 4;
pub const HCCL_E_NOT_SUPPORT: HcclResult = 5;
pub const HCCL_E_NOT_FOUND: HcclResult = 6;
pub const HCCL_E_UNAVAIL: HcclResult = 7;
pub const HCCL_E_SYSCALL: HcclResult = 8;
pub const HCCL_E_TIMEOUT: HcclResult = 9;
pub const HCCL_E_TCP_CONNECT: HcclResult = 11;
pub const HCCL_E_TCP_TRANSFER: HcclResult = 13;
pub const HCCL_E_RUNTIME: HcclResult = 15;
/// `HCCL_E_AGAIN` ("try again"): `HcclCommDestroy` of a communicator in use.
pub const HCCL_E_AGAIN: HcclResult = 20;
pub const HCCL_E_REMOTE: HcclResult = 21;

/// `HCCL_ROOT_INFO_BYTES`.
pub const HCCL_ROOT_INFO_BYTES: usize = 4108;

/// Leading bytes of every root info this library hands out.
const ROOT_MAGIC: &[u8; 12] = b"CHDFAKE\0HCCL";

/// `HcclRootInfo`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HcclRootInfo {
    pub internal: [c_char; HCCL_ROOT_INFO_BYTES],
}

const _: () = assert!(std::mem::size_of::<HcclRootInfo>() == 4108);

/// `HcclComm`: an opaque handle.
pub type HcclComm = *mut c_void;

/// `HcclDataType` -> element size (`HCCL_DATA_TYPE_INT8` 0 ... `HCCL_DATA_TYPE_INT128` 12).
pub fn hccl_type_size(datatype: c_int) -> Option<usize> {
    match datatype {
        0 | 7 => Some(1),          // INT8, UINT8
        1 | 3 | 8 | 11 => Some(2), // INT16, FP16, UINT16, BFP16
        2 | 4 | 9 => Some(4),      // INT32, FP32, UINT32
        5 | 6 | 10 => Some(8),     // INT64, UINT64, FP64
        12 => Some(16),            // INT128
        _ => None,
    }
}

fn code(e: &CollError) -> HcclResult {
    match e {
        CollError::NullPointer(_) => HCCL_E_PTR,
        CollError::InvalidArgument(_) | CollError::InvalidUsage(_) => HCCL_E_PARA,
        CollError::BadStream(_) | CollError::NoDevice => HCCL_E_RUNTIME,
        CollError::Timeout => HCCL_E_TIMEOUT,
        CollError::Busy(_) => HCCL_E_AGAIN,
        CollError::Planted | CollError::Aborted | CollError::Internal => HCCL_E_INTERNAL,
        CollError::Remote(_) => HCCL_E_TCP_TRANSFER,
        CollError::System(_) => HCCL_E_TCP_CONNECT,
        CollError::Unsupported(_) => HCCL_E_NOT_SUPPORT,
    }
}

fn api(body: impl FnOnce() -> Result<(), CollError>) -> HcclResult {
    ffi::guard(HCCL_E_INTERNAL, || match body() {
        Ok(()) => HCCL_SUCCESS,
        Err(e) => code(&e),
    })
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

/// `HcclGetRootInfo`: a fresh root info naming one `HcclCommInitRootInfo` rendezvous: the
/// address of a root listener on the `HCCL_SOCKET_IFNAME` interface and a nonce.
#[no_mangle]
pub unsafe extern "C" fn HcclGetRootInfo(root_info: *mut HcclRootInfo) -> HcclResult {
    api(|| {
        if root_info.is_null() {
            return Err(CollError::NullPointer("rootInfo"));
        }
        let id = net::new_id(fresh_id(ROOT_MAGIC), net::HCCL)?;
        let mut internal = [0 as c_char; HCCL_ROOT_INFO_BYTES];
        for (slot, byte) in internal.iter_mut().zip(id) {
            *slot = byte as c_char;
        }
        // SAFETY: module contract.
        unsafe { put(root_info, HcclRootInfo { internal }, "rootInfo") }
    })
}

/// `HcclCommInitRootInfo`: rank `rank` of `nRanks`, on the calling thread's current device
/// (`aclrtSetDevice`). Blocks until all ranks called it with the same root info
/// (`HCCL_E_TIMEOUT` after `CHD_FAKE_PAIR_TIMEOUT_MS`): in-process when the root info was made
/// here and every rank joins here, else over sockets (`crate::net`).
#[no_mangle]
pub unsafe extern "C" fn HcclCommInitRootInfo(
    n_ranks: u32,
    root_info: *const HcclRootInfo,
    rank: u32,
    comm: *mut HcclComm,
) -> HcclResult {
    api(|| {
        if root_info.is_null() {
            return Err(CollError::NullPointer("rootInfo"));
        }
        if comm.is_null() {
            return Err(CollError::NullPointer("comm"));
        }
        // SAFETY: non-null and readable per the module contract.
        let info = unsafe { root_info.read_unaligned() };
        let id: Vec<u8> = info.internal.iter().map(|&c| c as u8).collect();
        if !id.starts_with(ROOT_MAGIC) {
            return Err(CollError::InvalidArgument(
                "the root info was not made by HcclGetRootInfo".to_owned(),
            ));
        }
        let handle = net::init_rank(Lib::Hccl, &id, n_ranks as usize, rank as usize, net::HCCL)?;
        // SAFETY: module contract.
        unsafe { put(comm, handle, "comm") }
    })
}

/// `HcclCommInitAll`: `ndev` communicators in one clique, rank `i` on `devices[i]`. Devices
/// must be valid and distinct.
#[no_mangle]
pub unsafe extern "C" fn HcclCommInitAll(
    ndev: u32,
    devices: *mut i32,
    comms: *mut HcclComm,
) -> HcclResult {
    api(|| {
        if devices.is_null() {
            return Err(CollError::NullPointer("devices"));
        }
        if comms.is_null() {
            return Err(CollError::NullPointer("comms"));
        }
        let n = ndev as usize;
        // SAFETY: `devices` is readable for `ndev` entries (module contract).
        let list: Vec<i64> = unsafe { std::slice::from_raw_parts(devices, n) }
            .iter()
            .map(|&d| i64::from(d))
            .collect();
        let handles = collective::init_all(Lib::Hccl, &list)?;
        // SAFETY: `comms` is writable for `ndev` handles (module contract).
        unsafe { std::ptr::copy_nonoverlapping(handles.as_ptr(), comms, n) };
        Ok(())
    })
}

/// `HcclCommDestroy`: `HCCL_E_AGAIN` (and nothing destroyed) while a collective of `comm` is
/// in flight, as CANN 8.0 documents ("comm is in use, please try again later"); HCCL has no
/// abort, so a hung allgather keeps its communicator until it returns.
#[no_mangle]
pub unsafe extern "C" fn HcclCommDestroy(comm: HcclComm) -> HcclResult {
    api(|| {
        if net_comm::is_comm(Lib::Hccl, comm) {
            return net_comm::teardown(Lib::Hccl, comm, false);
        }
        collective::destroy_hccl(comm)
    })
}

/// `HcclGetRankSize`.
#[no_mangle]
pub unsafe extern "C" fn HcclGetRankSize(comm: HcclComm, rank_size: *mut u32) -> HcclResult {
    api(|| {
        let info = collective::comm_info(Lib::Hccl, comm)?;
        // SAFETY: module contract.
        unsafe { put(rank_size, info.nranks as u32, "rankSize") }
    })
}

/// `HcclGetRankId`.
#[no_mangle]
pub unsafe extern "C" fn HcclGetRankId(comm: HcclComm, rank: *mut u32) -> HcclResult {
    api(|| {
        let info = collective::comm_info(Lib::Hccl, comm)?;
        // SAFETY: module contract.
        unsafe { put(rank, info.rank as u32, "rank") }
    })
}

/// `HcclGetCommAsyncError`: `HCCL_E_TIMEOUT` once a rank's rendezvous timed out, else
/// `HCCL_SUCCESS`.
#[no_mangle]
pub unsafe extern "C" fn HcclGetCommAsyncError(
    comm: HcclComm,
    async_error: *mut HcclResult,
) -> HcclResult {
    api(|| {
        let info = collective::comm_info(Lib::Hccl, comm)?;
        let rc = info.async_error.as_ref().map_or(HCCL_SUCCESS, code);
        // SAFETY: module contract.
        unsafe { put(async_error, rc, "asyncError") }
    })
}

/// `HcclAllGather`: rank `r`'s `sendCount` elements land at `recvBuf + r * sendCount` on
/// every rank; blocks until every rank of the communicator made its matching call and the
/// operation ran. NULL `stream` is the device's default stream.
#[no_mangle]
pub unsafe extern "C" fn HcclAllGather(
    send_buf: *mut c_void,
    recv_buf: *mut c_void,
    send_count: u64,
    data_type: c_int,
    comm: HcclComm,
    stream: *mut c_void,
) -> HcclResult {
    api(|| {
        let size = hccl_type_size(data_type)
            .ok_or_else(|| CollError::InvalidArgument(format!("invalid dataType {data_type}")))?;
        if net_comm::is_comm(Lib::Hccl, comm) {
            let bytes = usize::try_from(send_count)
                .ok()
                .and_then(|c| c.checked_mul(size))
                .ok_or_else(|| {
                    CollError::InvalidArgument(format!("count {send_count} is too large"))
                })?;
            return net_comm::allgather(Lib::Hccl, comm, send_buf, recv_buf, bytes, stream);
        }
        let prepared = collective::prepare_allgather(
            Lib::Hccl,
            comm,
            send_buf,
            recv_buf,
            send_count,
            size,
            stream,
        )?;
        collective::run(vec![prepared])
    })
}

/// `HcclAllReduce`: `count` elements of `dataType` reduced with `op` (0 sum, 1 prod, 2 max,
/// 3 min) into `recvBuf` on every rank: in-process like [`HcclAllGather`] (blocking, timed
/// at `CHD_FAKE_PAIR_GBPS` bus bandwidth), across processes a ring over the sockets.
#[no_mangle]
pub unsafe extern "C" fn HcclAllReduce(
    send_buf: *mut c_void,
    recv_buf: *mut c_void,
    count: u64,
    data_type: c_int,
    op: c_int,
    comm: HcclComm,
    stream: *mut c_void,
) -> HcclResult {
    api(|| {
        let elem = net::reduce::Elem::from_hccl(data_type)
            .ok_or_else(|| CollError::InvalidArgument(format!("invalid dataType {data_type}")))?;
        let op = net::reduce::RedOp::from_hccl(op)
            .ok_or_else(|| CollError::InvalidArgument(format!("invalid op {op}")))?;
        if net_comm::is_comm(Lib::Hccl, comm) {
            let count = usize::try_from(count)
                .map_err(|_| CollError::InvalidArgument(format!("count {count} is too large")))?;
            return net_comm::allreduce(
                Lib::Hccl,
                comm,
                send_buf,
                recv_buf,
                count,
                elem,
                op,
                stream,
            );
        }
        let prepared = collective::prepare_allreduce(
            Lib::Hccl,
            comm,
            send_buf,
            recv_buf,
            count,
            elem,
            op,
            stream,
        )?;
        collective::run(vec![prepared])
    })
}

/// Point-to-point for `HcclSend` / `HcclRecv`: the arguments checked, then the transfer
/// (blocking).
fn p2p(
    dir: net_comm::Direction,
    buf: *mut c_void,
    count: u64,
    data_type: c_int,
    peer: u32,
    comm: HcclComm,
    stream: *mut c_void,
) -> Result<(), CollError> {
    let size = hccl_type_size(data_type)
        .ok_or_else(|| CollError::InvalidArgument(format!("invalid dataType {data_type}")))?;
    let bytes = usize::try_from(count)
        .ok()
        .and_then(|c| c.checked_mul(size))
        .ok_or_else(|| CollError::InvalidArgument(format!("count {count} is too large")))?;
    let info = collective::comm_info(Lib::Hccl, comm)?;
    let peer = peer as usize;
    if peer >= info.nranks {
        return Err(CollError::InvalidArgument(format!(
            "rank {peer} is out of range for {} ranks",
            info.nranks
        )));
    }
    if bytes > 0 && buf.is_null() {
        return Err(CollError::NullPointer(match dir {
            net_comm::Direction::Send => "sendBuf",
            net_comm::Direction::Recv => "recvBuf",
        }));
    }
    if bytes == 0 {
        return Ok(());
    }
    if !net_comm::is_comm(Lib::Hccl, comm) {
        return Err(CollError::Unsupported(
            "point-to-point send/recv is not supported by the fake in-process (communicators \
             of HcclCommInitAll, or whose ranks all joined in one process); it supports \
             2-rank communicators across processes"
                .to_owned(),
        ));
    }
    net_comm::p2p(Lib::Hccl, dir, comm, buf, bytes, size, peer, stream)
}

// Signatures as CANN's hccl.h declares them:
//   HcclResult HcclSend(void* sendBuf, uint64_t count, HcclDataType dataType,
//                       uint32_t destRank, HcclComm comm, aclrtStream stream);
//   HcclResult HcclRecv(void* recvBuf, uint64_t count, HcclDataType dataType,
//                       uint32_t srcRank, HcclComm comm, aclrtStream stream);

/// `HcclSend`: `count` elements of `dataType` from `sendBuf` to rank `destRank`, which must
/// call [`HcclRecv`] with the same count and data type from this rank (else both fail with
/// `HCCL_E_PARA`); blocks until the bytes went. Cross-process communicators of exactly 2
/// ranks only (others, and in-process communicators: `HCCL_E_NOT_SUPPORT`). The stream
/// advances by the wall time the bytes took. NULL `stream` is the device's default stream;
/// count 0 is a success that moves nothing.
#[no_mangle]
pub unsafe extern "C" fn HcclSend(
    send_buf: *mut c_void,
    count: u64,
    data_type: c_int,
    dest_rank: u32,
    comm: HcclComm,
    stream: *mut c_void,
) -> HcclResult {
    api(|| {
        let dir = net_comm::Direction::Send;
        p2p(dir, send_buf, count, data_type, dest_rank, comm, stream)
    })
}

/// `HcclRecv`: `count` elements of `dataType` from rank `srcRank` (its matching
/// [`HcclSend`]) into `recvBuf`; otherwise as [`HcclSend`].
#[no_mangle]
pub unsafe extern "C" fn HcclRecv(
    recv_buf: *mut c_void,
    count: u64,
    data_type: c_int,
    src_rank: u32,
    comm: HcclComm,
    stream: *mut c_void,
) -> HcclResult {
    api(|| {
        let dir = net_comm::Direction::Recv;
        p2p(dir, recv_buf, count, data_type, src_rank, comm, stream)
    })
}

/// `HcclGetErrorString`: the `hccl_types.h` description of `code`.
#[no_mangle]
pub unsafe extern "C" fn HcclGetErrorString(code: HcclResult) -> *const c_char {
    match code {
        HCCL_SUCCESS => c"success",
        HCCL_E_PARA => c"parameter error",
        HCCL_E_PTR => c"empty pointer",
        HCCL_E_MEMORY => c"memory error",
        HCCL_E_INTERNAL => c"internal error",
        HCCL_E_NOT_SUPPORT => c"not support feature",
        HCCL_E_NOT_FOUND => c"not found specific resource",
        HCCL_E_UNAVAIL => c"resource unavailable",
        HCCL_E_SYSCALL => c"call system interface error",
        HCCL_E_TIMEOUT => c"timeout",
        10 => c"open file fail",
        11 => c"tcp connect fail",
        12 => c"roce connect fail",
        13 => c"tcp transfer fail",
        14 => c"roce transfer fail",
        HCCL_E_RUNTIME => c"call runtime api fail",
        16 => c"call driver api fail",
        17 => c"call profiling api fail",
        18 => c"call cce api fail",
        19 => c"call network api fail",
        HCCL_E_AGAIN => c"try again",
        HCCL_E_REMOTE => c"error cqe",
        22 => c"error communicator suspending",
        _ => c"unknown error",
    }
    .as_ptr()
}
