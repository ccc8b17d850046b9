//! Collective libraries loaded at run time for the core-pair probe: NCCL (with the CUDA
//! runtime) and HCCL (with ACL). One small trait, `CollectiveApi`, over the calls the pair
//! probe makes: create one communicator per device in this process, allgather, destroy, and
//! abort (the way out of a hung collective).

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

/// Why a collective library is unavailable.
#[derive(Debug, thiserror::Error)]
pub enum CollectiveLoadError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Symbol(#[from] SymbolError),
}

/// The calls of a collective library the pair probe needs.
pub(crate) trait CollectiveApi: Send + Sync {
    /// `nccl` or `hccl`.
    fn name(&self) -> &'static str;
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
    fn destroy(&self, comm: Handle);
    /// Abort a communicator whose operations may hang.
    fn abort(&self, comm: Handle);
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

/// libnccl's entry points.
pub struct Nccl {
    comm_init_all: FnInitAllNccl,
    all_gather: FnAllGather,
    comm_destroy: FnComm,
    comm_abort: FnComm,
    error_string: FnErrorString,
    /// `ncclGetLastError` (NCCL 2.13 and later): what failed, beyond the code's text.
    last_error: Option<FnLastError>,
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
        // SAFETY: the types are nccl.h's declarations; pointers live no longer than `_library`.
        unsafe {
            Ok(Nccl {
                comm_init_all: library::symbol(&lib, &source, "ncclCommInitAll")?,
                all_gather: library::symbol(&lib, &source, "ncclAllGather")?,
                comm_destroy: library::symbol(&lib, &source, "ncclCommDestroy")?,
                comm_abort: library::symbol(&lib, &source, "ncclCommAbort")?,
                error_string: library::symbol(&lib, &source, "ncclGetErrorString")?,
                // Checked against nccl.h of nvidia-nccl-cu12 2.32.3.
                last_error: library::symbol(&lib, &source, "ncclGetLastError").ok(),
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

    fn destroy(&self, comm: Handle) {
        // SAFETY: `comm` came from ncclCommInitAll and is destroyed once.
        if let Err(e) = self.check("ncclCommDestroy", unsafe { (self.comm_destroy)(comm) }) {
            tracing::warn!("{e}");
        }
    }

    fn abort(&self, comm: Handle) {
        // SAFETY: `comm` came from ncclCommInitAll; abort frees it.
        if let Err(e) = self.check("ncclCommAbort", unsafe { (self.comm_abort)(comm) }) {
            tracing::warn!("{e}");
        }
    }
}

/// libhccl's entry points.
pub struct Hccl {
    comm_init_all: FnInitAllHccl,
    all_gather: FnHcclAllGather,
    comm_destroy: FnComm,
    error_string: Option<FnErrorString>,
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

    fn destroy(&self, comm: Handle) {
        // SAFETY: `comm` came from HcclCommInitAll and is destroyed once.
        if let Err(e) = self.check("HcclCommDestroy", unsafe { (self.comm_destroy)(comm) }) {
            tracing::warn!("{e}");
        }
    }

    fn abort(&self, comm: Handle) {
        // HCCL has no abort: destroying is the only way to release it.
        self.destroy(comm);
    }
}
