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
