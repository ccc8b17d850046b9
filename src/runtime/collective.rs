//! Collective libraries loaded at run time for the core-pair probe: NCCL (with the CUDA
//! runtime) and HCCL (with ACL). One small trait, `CollectiveApi`, over the calls the pair
//! probe makes: create one communicator per device in this process, allgather, and release
//! a set of communicators together — destroyed, or aborted (the way out of a hung
//! collective) — the way each library requires:
//!
//! - NCCL: `ncclCommDestroy` "is an intra-node collective call, which all ranks on the same
//!   node should call to avoid a hang", `ncclCommAbort` needs "all active ranks" (NCCL API
//!   reference, `api/comms.rst`, 2.18-2.30), and "when a single thread is managing multiple
//!   devices, group semantics must be used" (`usage/groups.rst`): chd holds both ranks'
//!   communicators in one thread, so it brackets the destroys or aborts with
//!   `ncclGroupStart`/`ncclGroupEnd`.
//! - HCCL: no abort; `HcclCommDestroy` returns `HCCL_E_AGAIN` (20 in `hccl_types.h`) while the
//!   communicator is in use, e.g. by an allgather still in flight ("\[HcclCommDestroy\] comm is
//!   in use, please try again later", CANN 8.0 HCCL API reference): such communicators come
//!   back as busy, for the caller to keep and retry.

// FFI: NCCL's and HCCL's C APIs, called through function pointers resolved at run time.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void};
use std::path::Path;

use libloading::Library;

use super::device_copy::{ApiError, Handle};
use super::library::{self, LoadError, SymbolError};

/// Sonames tried for NCCL and HCCL.
pub const NCCL_CANDIDATES: &[&str] = &["libnccl.so", "libnccl.so.2"];
pub const HCCL_CANDIDATES: &[&str] = &["libhccl.so"];

// HCCL declarations checked against the Ascend PyTorch repo's `third_party/hccl/inc/hccl/`
// (hccl.h at commit 00ac88a9, hccl_types.h at 00361082): `HcclResult` and `HcclDataType`
// are C enums (int-sized), `HcclComm` and `aclrtStream` are `void *`.
/// `ncclInt8` / `HCCL_DATA_TYPE_INT8`: counts are bytes.
const DATA_TYPE_INT8: c_int = 0;
/// `HCCL_E_AGAIN` (`hccl_types.h`): the communicator is in use; try again later.
const HCCL_E_AGAIN: c_int = 20;
/// HCCL's default `HCCL_BUFFSIZE`, MB (`HCCL_COMM_DEFAULT_BUFFSIZE` in `hccl_types.h`).
pub const HCCL_DEFAULT_BUFFSIZE_MB: u64 = 200;

/// Why a collective library is unavailable.
#[derive(Debug, thiserror::Error)]
pub enum CollectiveLoadError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Symbol(#[from] SymbolError),
}

/// How a set of communicators is released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Teardown {
    /// Nothing is in flight: free them.
    Destroy,
    /// Operations may hang: abort them (HCCL, which has no abort, destroys).
    Abort,
}

/// What releasing a set of communicators left behind.
#[derive(Debug, Default)]
pub(crate) struct Released {
    /// Still alive because the library said "in use, try again" (`HCCL_E_AGAIN`): keep them
    /// and retry.
    pub busy: Vec<(Handle, ApiError)>,
    /// The library refused in another way; retrying risks freeing twice, so they are given up.
    pub failed: Vec<(Handle, ApiError)>,
}

/// The calls of a collective library the pair probe needs.
pub(crate) trait CollectiveApi: Send + Sync {
    /// `nccl` or `hccl`.
    fn name(&self) -> &'static str;
    /// Device memory one communicator holds, when the library documents it (HCCL:
    /// 2 x `HCCL_BUFFSIZE`); NCCL sizes its buffers by the channels and protocols it picks at
    /// init, which its API does not report.
    fn bytes_per_communicator(&self) -> Option<u64>;
    /// Whether a card runs one collective API at a time and a communicator cannot be
    /// aborted (HCCL: CANN's rule, no abort): a card whose communicator is still being
    /// released or quarantined takes no new communicator or collective, and the
    /// communicators held per card are bounded. NCCL aborts, so its cards are free once the
    /// abort returned.
    fn one_collective_per_card(&self) -> bool {
        false
    }
    /// One communicator per device, ranks in `devices` order, created in this process.
    fn init_all(&self, devices: &[i32]) -> Result<Vec<Handle>, ApiError>;
    /// Enqueue an allgather of `bytes` per rank from `send` into `recv` (ranks x bytes).
    fn all_gather(
        &self,
        send: Handle,
        recv: Handle,
        bytes: usize,
        comm: Handle,
        stream: Handle,
    ) -> Result<(), ApiError>;
    /// Release every rank's communicator of one set together (see the module docs).
    fn release(&self, comms: &[Handle], how: Teardown) -> Released;
    /// A fresh rendezvous for a communicator whose ranks live in several processes
    /// (`ncclGetUniqueId`, `HcclGetRootInfo`): the bytes every rank passes to
    /// [`CollectiveApi::init_rank`]. The calling process is the root: the library's socket
    /// interface variables (`NCCL_SOCKET_IFNAME`, `HCCL_SOCKET_IFNAME`/`HCCL_IF_IP`) in its
    /// environment decide where the others reach it.
    fn unique_id(&self) -> Result<Vec<u8>, ApiError>;
    /// Rank `rank` of `world` joins the communicator of `id` on the calling thread's current
    /// device (`ncclCommInitRank`, `HcclCommInitRootInfo`); returns once every rank joined.
    fn init_rank(&self, world: u32, id: &[u8], rank: u32) -> Result<Handle, ApiError>;
    /// Enqueue a sum all-reduce of `count` f32 values from `send` into `recv`.
    fn all_reduce_f32(
        &self,
        send: Handle,
        recv: Handle,
        count: usize,
        comm: Handle,
        stream: Handle,
    ) -> Result<(), ApiError>;
    /// Enqueue one end of a point-to-point transfer of `bytes` with rank `peer`: sending from
    /// `buf` (`ncclSend`, `HcclSend`) or receiving into it (`ncclRecv`, `HcclRecv`).
    fn point_to_point(
        &self,
        end: PeerEnd,
        buf: Handle,
        bytes: usize,
        peer: u32,
        comm: Handle,
        stream: Handle,
    ) -> Result<(), ApiError>;
}

/// Which end of a point-to-point transfer a rank is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PeerEnd {
    Send,
    Recv,
}

/// The call's function pointer, or the error saying the library lacks it.
fn present<T: Copy>(
    f: Option<T>,
    call: &'static str,
    source: &str,
    since: &str,
) -> Result<T, ApiError> {
    f.ok_or_else(|| ApiError {
        call,
        code: -1,
        text: format!("{source} has no {call} ({since})"),
    })
}

type FnInitAllNccl = unsafe extern "C" fn(*mut *mut c_void, c_int, *const c_int) -> c_int;
type FnAllGather = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    *mut c_void,
    *mut c_void,
) -> c_int;
type FnComm = unsafe extern "C" fn(*mut c_void) -> c_int;
type FnGroup = unsafe extern "C" fn() -> c_int;
type FnErrorString = unsafe extern "C" fn(c_int) -> *const c_char;
type FnLastError = unsafe extern "C" fn(*mut c_void) -> *const c_char;
// `HcclResult HcclCommInitAll(uint32_t ndev, int32_t *devices, HcclComm *comms)` (hccl.h);
// `HcclResult HcclCommDestroy(HcclComm comm)` (hccl.h) is `FnComm`;
// `const char *HcclGetErrorString(HcclResult code)` (hccl.h) is `FnErrorString`.
type FnInitAllHccl = unsafe extern "C" fn(u32, *mut i32, *mut *mut c_void) -> c_int;
// `HcclResult HcclAllGather(void *sendBuf, void *recvBuf, uint64_t sendCount, HcclDataType
// dataType, HcclComm comm, aclrtStream stream)` (hccl.h); `HCCL_DATA_TYPE_INT8 = 0`
// (hccl_types.h).
type FnHcclAllGather =
    unsafe extern "C" fn(*mut c_void, *mut c_void, u64, c_int, *mut c_void, *mut c_void) -> c_int;

/// `NCCL_UNIQUE_ID_BYTES` (nccl.h): `typedef struct { char internal[128]; } ncclUniqueId;`.
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;
/// `HCCL_ROOT_INFO_BYTES` (hccl_types.h): `typedef struct { char internal[4108]; } HcclRootInfo;`.
pub const HCCL_ROOT_INFO_BYTES: usize = 4108;
/// `ncclFloat32` (nccl.h) and `HCCL_DATA_TYPE_FP32` (hccl_types.h).
const NCCL_FLOAT32: c_int = 7;
const HCCL_DATA_TYPE_FP32: c_int = 4;
/// `ncclSum` and `HCCL_REDUCE_SUM`.
const REDUCE_SUM: c_int = 0;

/// `ncclUniqueId`, passed by value to `ncclCommInitRank`.
#[repr(C)]
#[derive(Clone, Copy)]
struct NcclUniqueId {
    internal: [c_char; NCCL_UNIQUE_ID_BYTES],
}

/// `HcclRootInfo`.
#[repr(C)]
struct HcclRootInfo {
    internal: [c_char; HCCL_ROOT_INFO_BYTES],
}

// `ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId)`;
// `ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank)`;
// `ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
//   ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)`;
// `ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
//   ncclComm_t comm, cudaStream_t stream)` and `ncclRecv` likewise (nccl.h of
//   nvidia-nccl-cu12 2.32.3; send/recv since 2.7).
type FnNcclUniqueId = unsafe extern "C" fn(*mut NcclUniqueId) -> c_int;
type FnNcclInitRank = unsafe extern "C" fn(*mut *mut c_void, c_int, NcclUniqueId, c_int) -> c_int;
type FnNcclAllReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    *mut c_void,
    *mut c_void,
) -> c_int;
type FnNcclPeer =
    unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, *mut c_void, *mut c_void) -> c_int;
// `HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo)`;
// `HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo,
//   uint32_t rank, HcclComm *comm)`;
// `HcclResult HcclAllReduce(void *sendBuf, void *recvBuf, uint64_t count,
//   HcclDataType dataType, HcclReduceOp op, HcclComm comm, aclrtStream stream)`;
// `HcclResult HcclSend(void* sendBuf, uint64_t count, HcclDataType dataType,
//   uint32_t destRank, HcclComm comm, aclrtStream stream)` and `HcclRecv(void* recvBuf, ...,
//   uint32_t srcRank, ...)` (hccl.h, CANN 8.0 HCCL API reference).
type FnHcclRootInfo = unsafe extern "C" fn(*mut HcclRootInfo) -> c_int;
type FnHcclInitRootInfo =
    unsafe extern "C" fn(u32, *const HcclRootInfo, u32, *mut *mut c_void) -> c_int;
type FnHcclAllReduce = unsafe extern "C" fn(
    *mut c_void,
    *mut c_void,
    u64,
    c_int,
    c_int,
    *mut c_void,
    *mut c_void,
) -> c_int;
type FnHcclPeer =
    unsafe extern "C" fn(*mut c_void, u64, c_int, u32, *mut c_void, *mut c_void) -> c_int;

/// The calls of a communicator across processes (the fabric probe's), optional so that
/// the pair probe still opens a library that lacks one; a missing one is an error when used.
struct NcclRankCalls {
    unique_id: Option<FnNcclUniqueId>,
    init_rank: Option<FnNcclInitRank>,
    all_reduce: Option<FnNcclAllReduce>,
    send: Option<FnNcclPeer>,
    recv: Option<FnNcclPeer>,
}

struct HcclRankCalls {
    root_info: Option<FnHcclRootInfo>,
    init_root_info: Option<FnHcclInitRootInfo>,
    all_reduce: Option<FnHcclAllReduce>,
    send: Option<FnHcclPeer>,
    recv: Option<FnHcclPeer>,
}

/// libnccl's entry points.
pub struct Nccl {
    comm_init_all: FnInitAllNccl,
    all_gather: FnAllGather,
    comm_destroy: FnComm,
    comm_abort: FnComm,
    group_start: FnGroup,
    group_end: FnGroup,
    error_string: FnErrorString,
    /// `ncclGetLastError` (NCCL 2.13 and later): what failed, beyond the code's text.
    last_error: Option<FnLastError>,
    rank_calls: NcclRankCalls,
    pub source: String,
    _library: Library,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nccl")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl Nccl {
    pub fn load(path: Option<&Path>) -> Result<Nccl, CollectiveLoadError> {
        let (lib, source) = library::open("NCCL", path, NCCL_CANDIDATES)?;
        // SAFETY: the types are nccl.h's declarations (NCCL 2.20: `ncclResult_t
        // ncclGroupStart(void)`, `ncclGroupEnd(void)`, `ncclCommDestroy(ncclComm_t)`, ...);
        // pointers live no longer than `_library`.
        unsafe {
            Ok(Nccl {
                comm_init_all: library::symbol(&lib, &source, "ncclCommInitAll")?,
                all_gather: library::symbol(&lib, &source, "ncclAllGather")?,
                comm_destroy: library::symbol(&lib, &source, "ncclCommDestroy")?,
                comm_abort: library::symbol(&lib, &source, "ncclCommAbort")?,
                group_start: library::symbol(&lib, &source, "ncclGroupStart")?,
                group_end: library::symbol(&lib, &source, "ncclGroupEnd")?,
                error_string: library::symbol(&lib, &source, "ncclGetErrorString")?,
                // Checked against nccl.h of nvidia-nccl-cu12 2.32.3.
                last_error: library::symbol(&lib, &source, "ncclGetLastError").ok(),
                rank_calls: NcclRankCalls {
                    unique_id: library::symbol(&lib, &source, "ncclGetUniqueId").ok(),
                    init_rank: library::symbol(&lib, &source, "ncclCommInitRank").ok(),
                    all_reduce: library::symbol(&lib, &source, "ncclAllReduce").ok(),
                    send: library::symbol(&lib, &source, "ncclSend").ok(),
                    recv: library::symbol(&lib, &source, "ncclRecv").ok(),
                },
                source,
                _library: lib,
            })
        }
    }

    fn check(&self, call: &'static str, code: c_int) -> Result<(), ApiError> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: returns a static string for any code.
        let mut text = unsafe { library::c_text((self.error_string)(code)) };
        // SAFETY: NULL asks for the calling thread's last error; a NUL-terminated string or NULL.
        let last = self
            .last_error
            .map(|f| unsafe { library::c_text(f(std::ptr::null_mut())) });
        if let Some(last) = last.filter(|l| !l.is_empty() && !text.contains(l.as_str())) {
            text = format!("{text}: {last}");
        }
        Err(ApiError { call, code, text })
    }
}

impl CollectiveApi for Nccl {
    fn name(&self) -> &'static str {
        "nccl"
    }

    fn init_all(&self, devices: &[i32]) -> Result<Vec<Handle>, ApiError> {
        let mut comms = vec![std::ptr::null_mut(); devices.len()];
        // SAFETY: `comms` has room for one communicator per listed device.
        self.check("ncclCommInitAll", unsafe {
            (self.comm_init_all)(comms.as_mut_ptr(), devices.len() as c_int, devices.as_ptr())
        })?;
        Ok(comms)
    }

    fn all_gather(
        &self,
        send: Handle,
        recv: Handle,
        bytes: usize,
        comm: Handle,
        stream: Handle,
    ) -> Result<(), ApiError> {
        // SAFETY: `send` holds `bytes`, `recv` ranks x `bytes`, on the communicator's device.
        self.check("ncclAllGather", unsafe {
            (self.all_gather)(send, recv, bytes, DATA_TYPE_INT8, comm, stream)
        })
    }

    fn bytes_per_communicator(&self) -> Option<u64> {
        None
    }

    fn unique_id(&self) -> Result<Vec<u8>, ApiError> {
        let f = present(
            self.rank_calls.unique_id,
            "ncclGetUniqueId",
            &self.source,
            "any NCCL 2",
        )?;
        let mut id = NcclUniqueId {
            internal: [0; NCCL_UNIQUE_ID_BYTES],
        };
        // SAFETY: `id` is an ncclUniqueId NCCL fills.
        self.check("ncclGetUniqueId", unsafe { f(&mut id) })?;
        Ok(id.internal.iter().map(|&c| c as u8).collect())
    }

    fn init_rank(&self, world: u32, id: &[u8], rank: u32) -> Result<Handle, ApiError> {
        let f = present(
            self.rank_calls.init_rank,
            "ncclCommInitRank",
            &self.source,
            "any NCCL 2",
        )?;
        let mut unique = NcclUniqueId {
            internal: [0; NCCL_UNIQUE_ID_BYTES],
        };
        if id.len() != NCCL_UNIQUE_ID_BYTES {
            return Err(ApiError {
                call: "ncclCommInitRank",
                code: -1,
                text: format!(
                    "a unique id is {NCCL_UNIQUE_ID_BYTES} bytes, not {}",
                    id.len()
                ),
            });
        }
        for (slot, &b) in unique.internal.iter_mut().zip(id) {
            *slot = b as c_char;
        }
        let mut comm = std::ptr::null_mut();
        // SAFETY: `comm` receives the communicator; the id is passed by value as declared.
        self.check("ncclCommInitRank", unsafe {
            f(&mut comm, world as c_int, unique, rank as c_int)
        })?;
        Ok(comm)
    }

    fn all_reduce_f32(
        &self,
        send: Handle,
        recv: Handle,
        count: usize,
        comm: Handle,
        stream: Handle,
    ) -> Result<(), ApiError> {
        let f = present(
            self.rank_calls.all_reduce,
            "ncclAllReduce",
            &self.source,
            "any NCCL 2",
        )?;
        // SAFETY: `send` and `recv` hold `count` f32 values on the communicator's device.
        self.check("ncclAllReduce", unsafe {
            f(send, recv, count, NCCL_FLOAT32, REDUCE_SUM, comm, stream)
        })
    }

    fn point_to_point(
        &self,
        end: PeerEnd,
        buf: Handle,
        bytes: usize,
        peer: u32,
        comm: Handle,
        stream: Handle,
    ) -> Result<(), ApiError> {
        let (call, f) = match end {
            PeerEnd::Send => ("ncclSend", self.rank_calls.send),
            PeerEnd::Recv => ("ncclRecv", self.rank_calls.recv),
        };
        let f = present(f, call, &self.source, "NCCL 2.7 or later")?;
        // SAFETY: `buf` spans `bytes` on the communicator's device (sent from or received
        // into).
        self.check(call, unsafe {
            f(buf, bytes, DATA_TYPE_INT8, peer as c_int, comm, stream)
        })
    }

    fn release(&self, comms: &[Handle], how: Teardown) -> Released {
        let (call, f) = match how {
            Teardown::Destroy => ("ncclCommDestroy", self.comm_destroy),
            Teardown::Abort => ("ncclCommAbort", self.comm_abort),
        };
        // One group, so NCCL tears every rank down together instead of the first call waiting
        // for ranks this same thread has not reached yet.
        // SAFETY: no arguments; every ncclGroupStart below is matched by ncclGroupEnd.
        let mut first = self
            .check("ncclGroupStart", unsafe { (self.group_start)() })
            .err();
        if first.is_none() {
            for &comm in comms {
                // SAFETY: `comm` came from ncclCommInitAll and is released once.
                if let Err(e) = self.check(call, unsafe { f(comm) }) {
                    first.get_or_insert(e);
                }
            }
            // SAFETY: takes no arguments; it closes the group ncclGroupStart opened above, which
            // NCCL requires for the destroys or aborts issued inside it to run.
            if let Err(e) = self.check("ncclGroupEnd", unsafe { (self.group_end)() }) {
                first.get_or_insert(e);
            }
        }
        Released {
            busy: Vec::new(),
            failed: first
                .map(|e| comms.iter().map(|&c| (c, e.clone())).collect())
                .unwrap_or_default(),
        }
    }
}

/// libhccl's entry points.
pub struct Hccl {
    comm_init_all: FnInitAllHccl,
    all_gather: FnHcclAllGather,
    comm_destroy: FnComm,
    error_string: Option<FnErrorString>,
    rank_calls: HcclRankCalls,
    /// `HCCL_BUFFSIZE` in bytes, read from the environment at load (what HCCL reads).
    buffsize_bytes: u64,
    pub source: String,
    _library: Library,
}

impl std::fmt::Debug for Hccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hccl")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl Hccl {
    pub fn load(path: Option<&Path>) -> Result<Hccl, CollectiveLoadError> {
        let (lib, source) = library::open("HCCL", path, HCCL_CANDIDATES)?;
        // SAFETY: the types are hccl.h's declarations; pointers live no longer than `_library`.
        unsafe {
            Ok(Hccl {
                comm_init_all: library::symbol(&lib, &source, "HcclCommInitAll")?,
                all_gather: library::symbol(&lib, &source, "HcclAllGather")?,
                comm_destroy: library::symbol(&lib, &source, "HcclCommDestroy")?,
                error_string: library::symbol(&lib, &source, "HcclGetErrorString").ok(),
                rank_calls: HcclRankCalls {
                    root_info: library::symbol(&lib, &source, "HcclGetRootInfo").ok(),
                    init_root_info: library::symbol(&lib, &source, "HcclCommInitRootInfo").ok(),
                    all_reduce: library::symbol(&lib, &source, "HcclAllReduce").ok(),
                    send: library::symbol(&lib, &source, "HcclSend").ok(),
                    recv: library::symbol(&lib, &source, "HcclRecv").ok(),
                },
                buffsize_bytes: buffsize_mb(std::env::var("HCCL_BUFFSIZE").ok().as_deref()) << 20,
                source,
                _library: lib,
            })
        }
    }

    fn check(&self, call: &'static str, code: c_int) -> Result<(), ApiError> {
        if code == 0 {
            return Ok(());
        }
        let text = match self.error_string {
            // SAFETY: returns a static string for any code.
            Some(f) => unsafe { library::c_text(f(code)) },
            None => "no message from the library".into(),
        };
        Err(ApiError { call, code, text })
    }
}

impl CollectiveApi for Hccl {
    fn name(&self) -> &'static str {
        "hccl"
    }

    fn init_all(&self, devices: &[i32]) -> Result<Vec<Handle>, ApiError> {
        let mut devs = devices.to_vec();
        let mut comms = vec![std::ptr::null_mut(); devices.len()];
        // SAFETY: `comms` has room for one communicator per listed device.
        self.check("HcclCommInitAll", unsafe {
            (self.comm_init_all)(devs.len() as u32, devs.as_mut_ptr(), comms.as_mut_ptr())
        })?;
        Ok(comms)
    }

    fn all_gather(
        &self,
        send: Handle,
        recv: Handle,
        bytes: usize,
        comm: Handle,
        stream: Handle,
    ) -> Result<(), ApiError> {
        // SAFETY: `send` holds `bytes`, `recv` ranks x `bytes`, on the communicator's device.
        self.check("HcclAllGather", unsafe {
            (self.all_gather)(send, recv, bytes as u64, DATA_TYPE_INT8, comm, stream)
        })
    }

    fn bytes_per_communicator(&self) -> Option<u64> {
        // "Each communicator occupies 2 x HCCL_BUFFSIZE memory, which is used for receiving
        // and sending" (CANN 8.0 environment variable reference, HCCL_BUFFSIZE).
        Some(2 * self.buffsize_bytes)
    }

    fn one_collective_per_card(&self) -> bool {
        true
    }

    fn unique_id(&self) -> Result<Vec<u8>, ApiError> {
        let f = present(
            self.rank_calls.root_info,
            "HcclGetRootInfo",
            &self.source,
            "CANN 5 or later",
        )?;
        let mut info = Box::new(HcclRootInfo {
            internal: [0; HCCL_ROOT_INFO_BYTES],
        });
        // SAFETY: `info` is an HcclRootInfo HCCL fills.
        self.check("HcclGetRootInfo", unsafe { f(&mut *info) })?;
        Ok(info.internal.iter().map(|&c| c as u8).collect())
    }

    fn init_rank(&self, world: u32, id: &[u8], rank: u32) -> Result<Handle, ApiError> {
        let f = present(
            self.rank_calls.init_root_info,
            "HcclCommInitRootInfo",
            &self.source,
            "CANN 5 or later",
        )?;
        if id.len() != HCCL_ROOT_INFO_BYTES {
            return Err(ApiError {
                call: "HcclCommInitRootInfo",
                code: -1,
                text: format!(
                    "a root info is {HCCL_ROOT_INFO_BYTES} bytes, not {}",
                    id.len()
                ),
            });
        }
        let mut info = Box::new(HcclRootInfo {
            internal: [0; HCCL_ROOT_INFO_BYTES],
        });
        for (slot, &b) in info.internal.iter_mut().zip(id) {
            *slot = b as c_char;
        }
        let mut comm = std::ptr::null_mut();
        // SAFETY: `info` is a whole root info; `comm` receives the communicator.
        self.check("HcclCommInitRootInfo", unsafe {
            f(world, &*info, rank, &mut comm)
        })?;
        Ok(comm)
    }

    fn all_reduce_f32(
        &self,
        send: Handle,
        recv: Handle,
        count: usize,
        comm: Handle,
        stream: Handle,
    ) -> Result<(), ApiError> {
        let f = present(
            self.rank_calls.all_reduce,
            "HcclAllReduce",
            &self.source,
            "CANN 5 or later",
        )?;
        // SAFETY: `send` and `recv` hold `count` f32 values on the communicator's device.
        self.check("HcclAllReduce", unsafe {
            f(
                send,
                recv,
                count as u64,
                HCCL_DATA_TYPE_FP32,
                REDUCE_SUM,
                comm,
                stream,
            )
        })
    }

    fn point_to_point(
        &self,
        end: PeerEnd,
        buf: Handle,
        bytes: usize,
        peer: u32,
        comm: Handle,
        stream: Handle,
    ) -> Result<(), ApiError> {
        let (call, f) = match end {
            PeerEnd::Send => ("HcclSend", self.rank_calls.send),
            PeerEnd::Recv => ("HcclRecv", self.rank_calls.recv),
        };
        let f = present(f, call, &self.source, "CANN 5 or later")?;
        // SAFETY: `buf` spans `bytes` on the communicator's device (sent from or received
        // into).
        self.check(call, unsafe {
            f(buf, bytes as u64, DATA_TYPE_INT8, peer, comm, stream)
        })
    }

    fn release(&self, comms: &[Handle], _how: Teardown) -> Released {
        // HCCL has no abort: destroying is the only way out, and it is local to each rank.
        let mut out = Released::default();
        for &comm in comms {
            // SAFETY: `comm` came from HcclCommInitAll; on success it is gone, on
            // HCCL_E_AGAIN it is untouched and may be destroyed again later.
            let code = unsafe { (self.comm_destroy)(comm) };
            match self.check("HcclCommDestroy", code) {
                Ok(()) => {}
                Err(e) if code == HCCL_E_AGAIN => out.busy.push((comm, e)),
                Err(e) => out.failed.push((comm, e)),
            }
        }
        out
    }
}

/// `HCCL_BUFFSIZE` (MB, an integer of at least 1; HCCL's default 200): what each HCCL
/// communicator's two buffers are sized by. A value HCCL would reject counts as the default,
/// with a warning.
pub(crate) fn buffsize_mb(value: Option<&str>) -> u64 {
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        None => HCCL_DEFAULT_BUFFSIZE_MB,
        Some(v) => match v.parse::<u64>() {
            Ok(mb) if mb >= 1 => mb,
            _ => {
                tracing::warn!(
                    "HCCL_BUFFSIZE={v:?} is not a whole number of MB >= 1; counting HCCL \
                     communicators at the default {HCCL_DEFAULT_BUFFSIZE_MB} MB"
                );
                HCCL_DEFAULT_BUFFSIZE_MB
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hccl_buffsize_comes_from_the_environment_value() {
        assert_eq!(buffsize_mb(None), 200);
        assert_eq!(buffsize_mb(Some("")), 200);
        assert_eq!(buffsize_mb(Some(" 64 ")), 64);
        assert_eq!(buffsize_mb(Some("0")), 200);
        assert_eq!(buffsize_mb(Some("1.5")), 200);
    }
}
