//! The Ascend backend: libascendcl loaded at run time (no CANN needed to build chd). Typed
//! function pointers filled once by `AclRuntime::load`, `aclInit` on load and, only when that
//! `aclInit` was ours, `aclFinalizeReference` (or `aclFinalize`) on drop; the `DeviceApi`
//! calls the shared measurement routine uses, and the utilization query the device idle gate
//! reads. PCI bus ids come from `aclrtDeviceGetPCIBusId` where the runtime has it (CANN 9.2),
//! else NPUs are matched to the Huawei processing accelerators in sysfs by bus order.
//! Pageable host memory is refused: `aclrtMemcpyAsync` needs `aclrtMallocHost` memory.
//!
//! Header versions the declarations below were checked against: "(acl.h)", "(acl_rt.h)" and
//! "(acl_base.h)" name the Ascend PyTorch repo's copies in `third_party/acl/inc/acl/` (acl.h at
//! commit 24fccbe2, acl_rt.h at 00df2c1d, acl_base.h at 0c9d3005); "(acl_rt.h 1.17.0)" names
//! CANN's open runtime header `include/external/acl/acl_rt.h` (hicann/runtime at 0bbc1964,
//! `ACL_MINOR_VERSION` 17), which declares `aclrtUtilizationInfo` the same way.

// FFI: libascendcl's C API, called through function pointers resolved at run time.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void};
use std::path::Path;

use libloading::Library;

use super::device_copy::{self, ApiError, DeviceApi, Handle};
use super::device_index;
use super::library::{self, LoadError, SymbolError};
use super::stuck_work::{self, StuckWork};
use super::{Backend, CopyParams, DeviceInfo, Direction, HostMemory, ProbeError};
use crate::topology::pci;

/// Sonames tried in order when no path is given.
pub const CANDIDATES: &[&str] = &["libascendcl.so"];
/// Huawei's PCI vendor id and the "processing accelerator" class of Ascend NPUs.
const HUAWEI_VENDOR: &str = "0x19e5";
const ACCELERATOR_CLASS: &str = "0x1200";

/// `aclError` (`typedef int aclError`, acl_base.h).
type AclError = c_int;
const ACL_SUCCESS: AclError = 0;
/// `ACL_ERROR_REPEAT_INITIALIZE` (acl_base.h): aclInit already ran in this process, so
/// someone else owns the initialization.
const ACL_ERROR_REPEAT_INITIALIZE: AclError = 100002;
/// `ACL_ERROR_RT_LOST_HEARTBEAT` (rt_error_codes.h, "ts lost heartbeat"): the device's task
/// scheduler stopped answering; CANN's runtime returns it for every call on such a device.
pub const ACL_ERROR_RT_LOST_HEARTBEAT: AclError = 507010;
/// `aclrtMemcpyKind` (acl_rt.h): `ACL_MEMCPY_HOST_TO_DEVICE`, `_DEVICE_TO_HOST`,
/// `_DEVICE_TO_DEVICE`.
const ACL_MEMCPY_HOST_TO_DEVICE: c_int = 1;
const ACL_MEMCPY_DEVICE_TO_HOST: c_int = 2;
const ACL_MEMCPY_DEVICE_TO_DEVICE: c_int = 3;
/// `aclrtMemMallocPolicy` `ACL_MEM_MALLOC_HUGE_FIRST` (acl_rt.h).
const ACL_MEM_MALLOC_HUGE_FIRST: c_int = 0;
/// Buffer for `aclrtDeviceGetPCIBusId`: the header asks for at least 13 bytes
/// (`dddd:bb:dd.f` and the NUL); room to spare for a longer domain.
const PCI_BUS_ID_LEN: usize = 64;
/// Why pageable host memory is refused (see `DeviceApi::pageable_refusal`).
const PAGEABLE_REFUSAL: &str = "aclrtMemcpyAsync needs page-locked host memory from \
    aclrtMallocHost: with pageable memory it is undefined on CANN 7.0.0 - 8.0.0 (no error, an \
    unpredictable failure when the copy runs) and a blocking copy on CANN 8.5, so pageable \
    copies cannot be measured on the acl backend; use pinned";

/// `aclrtUtilizationInfo` (acl_rt.h; the same in acl_rt.h 1.17.0): four `int32_t`
/// percentages and a reserved `aclrtUtilizationExtendInfo *` that must be NULL.
#[repr(C)]
#[derive(Debug, Default)]
struct AclUtilizationInfo {
    cube_utilization: i32,
    vector_utilization: i32,
    aicpu_utilization: i32,
    memory_utilization: i32,
    utilization_extend: usize,
}

// The C declarations, with the header each was checked against (handles such as
// `aclrtStream` and `aclrtEvent` are `void *`; enums are `int`).
/// `aclError aclInit(const char *configPath)` (acl.h).
type FnInit = unsafe extern "C" fn(*const c_char) -> AclError;
/// `aclError aclFinalize()` (acl.h).
type FnVoid = unsafe extern "C" fn() -> AclError;
/// `aclError aclFinalizeReference(uint64_t *refCount)` (acl.h; absent from older acl.h):
/// drops one `aclInit` reference where `aclInit` counts them.
type FnFinalizeReference = unsafe extern "C" fn(*mut u64) -> AclError;
/// `aclError aclrtGetDeviceCount(uint32_t *count)` (acl_rt.h).
type FnCount = unsafe extern "C" fn(*mut u32) -> AclError;
/// `aclError aclrtSetDevice(int32_t deviceId)` (acl_rt.h).
type FnDevice = unsafe extern "C" fn(i32) -> AclError;
/// `aclError aclrtMallocHost(void **hostPtr, size_t size)` (acl_rt.h).
type FnMallocHost = unsafe extern "C" fn(*mut *mut c_void, usize) -> AclError;
/// `aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy)` (acl_rt.h).
type FnMalloc = unsafe extern "C" fn(*mut *mut c_void, usize, c_int) -> AclError;
/// `aclrtFreeHost(void *hostPtr)`, `aclrtFree(void *devPtr)`, `aclrtDestroyStream(aclrtStream)`,
/// `aclrtSynchronizeStream(aclrtStream)`, `aclrtDestroyEvent(aclrtEvent)`,
/// `aclrtSynchronizeEvent(aclrtEvent)`, all returning `aclError` (acl_rt.h).
type FnHandle = unsafe extern "C" fn(*mut c_void) -> AclError;
/// `aclrtCreateStream(aclrtStream *stream)`, `aclrtCreateEvent(aclrtEvent *event)` (acl_rt.h).
type FnCreate = unsafe extern "C" fn(*mut *mut c_void) -> AclError;
/// `aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count,
/// aclrtMemcpyKind kind, aclrtStream stream)` (acl_rt.h).
type FnMemcpyAsync =
    unsafe extern "C" fn(*mut c_void, usize, *const c_void, usize, c_int, *mut c_void) -> AclError;
/// `aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream)` (acl_rt.h).
type FnRecord = unsafe extern "C" fn(*mut c_void, *mut c_void) -> AclError;
/// `aclError aclrtEventElapsedTime(float *ms, aclrtEvent startEvent, aclrtEvent endEvent)`
/// (acl_rt.h).
type FnElapsed = unsafe extern "C" fn(*mut f32, *mut c_void, *mut c_void) -> AclError;
/// `const char *aclGetRecentErrMsg()` (acl.h).
type FnErrMsg = unsafe extern "C" fn() -> *const c_char;
/// `aclError aclrtGetDeviceUtilizationRate(int32_t deviceId, aclrtUtilizationInfo
/// *utilizationInfo)` (acl_rt.h).
type FnUtilization = unsafe extern "C" fn(i32, *mut AclUtilizationInfo) -> AclError;
/// `aclError aclrtDeviceGetPCIBusId(int32_t deviceId, char *pciBusId, int32_t len)` (acl_rt.h
/// 1.17.0 only; CANN 9.2.0-beta.2 with Ascend HDK 25.5.5 and later, per CANN's
/// device_identity_mapping sample; `len` >= 13, `dddd:bb:dd.f`).
type FnPciBusId = unsafe extern "C" fn(i32, *mut c_char, i32) -> AclError;
type FnCanAccessPeer = unsafe extern "C" fn(*mut i32, i32, i32) -> AclError;
type FnEnablePeer = unsafe extern "C" fn(i32, u32) -> AclError;
/// `aclError aclrtLaunchHostFunc(aclrtStream stream, aclrtHostFunc fn, void *args)` (CANN 8.3
/// and later, `typedef void (*aclrtHostFunc)(void *args)`).
type FnLaunchHostFunc =
    unsafe extern "C" fn(*mut c_void, super::device_api::HostFunction, *mut c_void) -> AclError;
/// `aclError aclrtSynchronizeEventWithTimeout(aclrtEvent event, int32_t timeout)` (acl_rt.h,
/// CANN 7 and later: -1 waits forever, else milliseconds).
type FnSyncEventTimeout = unsafe extern "C" fn(*mut c_void, i32) -> AclError;
/// `aclError aclrtQueryEventStatus(aclrtEvent event, aclrtEventRecordedStatus *status)`
/// (acl_rt.h; `ACL_EVENT_RECORDED_STATUS_NOT_READY` 0, `_COMPLETE` 1).
type FnQueryEvent = unsafe extern "C" fn(*mut c_void, *mut c_int) -> AclError;
/// `ACL_ERROR_RT_EVENT_SYNC_TIMEOUT` (rt_error_codes.h, "event sync time out").
const ACL_ERROR_RT_EVENT_SYNC_TIMEOUT: AclError = 507047;
const ACL_EVENT_RECORDED_STATUS_COMPLETE: c_int = 1;
/// `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (rt_error_codes.h).
const ACL_ERROR_RT_FEATURE_NOT_SUPPORT: AclError = 207000;

/// The peer-access calls, checked against CANN 8.0's `acl_rt.h`:
/// `aclrtDeviceCanAccessPeer(int32_t *canAccessPeer, int32_t deviceId, int32_t peerDeviceId)`,
/// `aclrtDeviceEnablePeerAccess(int32_t peerDeviceId, uint32_t flags)`,
/// `aclrtDeviceDisablePeerAccess(int32_t peerDeviceId)`. Inference products lack them.
struct PeerFns {
    can_access: FnCanAccessPeer,
    enable: FnEnablePeer,
    disable: FnDevice,
}

/// Why the ACL backend is unavailable.
#[derive(Debug, thiserror::Error)]
pub enum AclLoadError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Symbol(#[from] SymbolError),
    #[error("{0}")]
    Call(ApiError),
    #[error("the ACL runtime at {0} reports no devices")]
    NoDevices(String),
}

/// libascendcl's entry points. The library stays loaded (and initialised) while this lives.
pub struct AclRuntime {
    finalize: FnVoid,
    finalize_reference: Option<FnFinalizeReference>,
    /// Whether our `aclInit` initialized ACL (false: it was already, someone else owns it).
    owns_init: bool,
    get_device_count: FnCount,
    set_device: FnDevice,
    malloc_host: FnMallocHost,
    free_host: FnHandle,
    malloc: FnMalloc,
    free: FnHandle,
    create_stream: FnCreate,
    destroy_stream: FnHandle,
    synchronize_stream: FnHandle,
    memcpy_async: FnMemcpyAsync,
    create_event: FnCreate,
    destroy_event: FnHandle,
    record_event: FnRecord,
    synchronize_event: FnHandle,
    event_elapsed_time: FnElapsed,
    recent_err_msg: Option<FnErrMsg>,
    utilization_rate: Option<FnUtilization>,
    pci_bus_id: Option<FnPciBusId>,
    peer: Option<PeerFns>,
    /// The host-function latch of `stream_latch` (CANN 8.3 and later).
    launch_host_func: Option<FnLaunchHostFunc>,
    /// The bounded event waits of `stuck_work`.
    sync_event_timeout: Option<FnSyncEventTimeout>,
    query_event: Option<FnQueryEvent>,
    /// Cells whose device work did not finish in time (`stuck_work`).
    stuck: StuckWork,
    /// Where it was loaded from.
    pub source: String,
    _library: Library,
}

impl std::fmt::Debug for AclRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AclRuntime")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl AclRuntime {
    /// Load libascendcl from `path` (or the standard soname) and call `aclInit`.
    pub fn load(path: Option<&Path>) -> Result<AclRuntime, AclLoadError> {
        let (lib, source) = library::open("Ascend ACL", path, CANDIDATES)?;
        // SAFETY: every type below is the C declaration of the named ACL function
        // (acl/acl_rt.h, acl/acl_base.h); the pointers live no longer than `_library`.
        let runtime = unsafe {
            let init: FnInit = library::symbol(&lib, &source, "aclInit")?;
            let mut runtime = AclRuntime {
                finalize: library::symbol(&lib, &source, "aclFinalize")?,
                finalize_reference: library::symbol(&lib, &source, "aclFinalizeReference").ok(),
                owns_init: false,
                get_device_count: library::symbol(&lib, &source, "aclrtGetDeviceCount")?,
                set_device: library::symbol(&lib, &source, "aclrtSetDevice")?,
                malloc_host: library::symbol(&lib, &source, "aclrtMallocHost")?,
                free_host: library::symbol(&lib, &source, "aclrtFreeHost")?,
                malloc: library::symbol(&lib, &source, "aclrtMalloc")?,
                free: library::symbol(&lib, &source, "aclrtFree")?,
                create_stream: library::symbol(&lib, &source, "aclrtCreateStream")?,
                destroy_stream: library::symbol(&lib, &source, "aclrtDestroyStream")?,
                synchronize_stream: library::symbol(&lib, &source, "aclrtSynchronizeStream")?,
                memcpy_async: library::symbol(&lib, &source, "aclrtMemcpyAsync")?,
                create_event: library::symbol(&lib, &source, "aclrtCreateEvent")?,
                destroy_event: library::symbol(&lib, &source, "aclrtDestroyEvent")?,
                record_event: library::symbol(&lib, &source, "aclrtRecordEvent")?,
                synchronize_event: library::symbol(&lib, &source, "aclrtSynchronizeEvent")?,
                event_elapsed_time: library::symbol(&lib, &source, "aclrtEventElapsedTime")?,
                recent_err_msg: library::symbol(&lib, &source, "aclGetRecentErrMsg").ok(),
                utilization_rate: library::symbol(&lib, &source, "aclrtGetDeviceUtilizationRate")
                    .ok(),
                pci_bus_id: library::symbol(&lib, &source, "aclrtDeviceGetPCIBusId").ok(),
                peer: (|| {
                    Some(PeerFns {
                        can_access: library::symbol(&lib, &source, "aclrtDeviceCanAccessPeer")
                            .ok()?,
                        enable: library::symbol(&lib, &source, "aclrtDeviceEnablePeerAccess")
                            .ok()?,
                        disable: library::symbol(&lib, &source, "aclrtDeviceDisablePeerAccess")
                            .ok()?,
                    })
                })(),
                launch_host_func: library::symbol(&lib, &source, "aclrtLaunchHostFunc").ok(),
                sync_event_timeout: library::symbol(
                    &lib,
                    &source,
                    "aclrtSynchronizeEventWithTimeout",
                )
                .ok(),
                query_event: library::symbol(&lib, &source, "aclrtQueryEventStatus").ok(),
                stuck: StuckWork::default(),
                source,
                _library: lib,
            };
            let code = init(std::ptr::null());
            match code {
                ACL_SUCCESS => runtime.owns_init = true,
                ACL_ERROR_REPEAT_INITIALIZE => tracing::info!(
                    "ACL was already initialized in this process; chd leaves its finalization \
                     to whoever initialized it"
                ),
                _ => return Err(AclLoadError::Call(runtime.error("aclInit", code))),
            }
            runtime
        };
        Ok(runtime)
    }

    fn error(&self, call: &'static str, code: AclError) -> ApiError {
        let text = self
            .recent_err_msg
            // SAFETY: returns NULL or a NUL-terminated thread-local message.
            .map(|f| unsafe { library::c_text(f()) })
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| "no message from the runtime".into());
        ApiError { call, code, text }
    }

    fn check(&self, call: &'static str, code: AclError) -> Result<(), ApiError> {
        if code == ACL_SUCCESS {
            Ok(())
        } else {
            Err(self.error(call, code))
        }
    }

    /// Number of NPUs visible to this process.
    pub fn device_count(&self) -> Result<u32, ApiError> {
        let mut n = 0u32;
        // SAFETY: `n` is a live local the runtime writes the count to.
        self.check("aclrtGetDeviceCount", unsafe {
            (self.get_device_count)(&mut n)
        })?;
        Ok(n)
    }

    /// PCI bus id of `device` (`0000:3d:00.0`, lower-cased to sysfs's spelling); `None` where
    /// the runtime lacks the query (before CANN 9.2).
    pub fn pci_bus_id(&self, device: i32) -> Option<Result<String, ApiError>> {
        let query = self.pci_bus_id?;
        let mut buf = [0 as c_char; PCI_BUS_ID_LEN];
        // SAFETY: `buf` holds PCI_BUS_ID_LEN bytes and we pass that length.
        let code = unsafe { query(device, buf.as_mut_ptr(), PCI_BUS_ID_LEN as i32) };
        Some(self.check("aclrtDeviceGetPCIBusId", code).map(|()| {
            // SAFETY: the runtime NUL-terminates within the given length (zeroed beyond).
            unsafe { library::c_text(buf.as_ptr()) }.to_ascii_lowercase()
        }))
    }

    /// Whether the runtime has the utilization query (CANN 7 and later).
    pub fn has_utilization(&self) -> bool {
        self.utilization_rate.is_some()
    }

    /// Busiest engine's utilization (0..1) of `device`; `None` where the runtime lacks the
    /// query (CANN before 7).
    pub fn utilization(&self, device: i32) -> Option<Result<f64, ApiError>> {
        let query = self.utilization_rate?;
        let mut info = AclUtilizationInfo::default();
        // SAFETY: `info` is a valid out-pointer of the declared layout.
        let code = unsafe { query(device, &mut info) };
        Some(
            self.check("aclrtGetDeviceUtilizationRate", code)
                .and_then(|()| {
                    busiest_engine(&info).ok_or_else(|| ApiError {
                        call: "aclrtGetDeviceUtilizationRate",
                        code,
                        text:
                            "no engine reports a utilization (all DEVICE_UTILIZATION_NOT_SUPPORT)"
                                .into(),
                    })
                }),
        )
    }
}

/// The busiest of the cube, vector and AI CPU engines, 0..1. An engine the product lacks
/// reports `DEVICE_UTILIZATION_NOT_SUPPORT` (-1, acl_rt.h) and is skipped; `None` if all do.
fn busiest_engine(info: &AclUtilizationInfo) -> Option<f64> {
    [
        info.cube_utilization,
        info.vector_utilization,
        info.aicpu_utilization,
    ]
    .into_iter()
    .filter(|&u| u >= 0)
    .max()
    .map(|u| f64::from(u.min(100)) / 100.0)
}

impl Drop for AclRuntime {
    fn drop(&mut self) {
        if !self.owns_init {
            // Another user of ACL in this process initialized it; finalizing would pull it
            // from under them.
            return;
        }
        // Where aclInit counts references, drop only ours; aclFinalize releases everything
        // regardless of the count (acl.h).
        let (call, code) = match self.finalize_reference {
            // SAFETY: our aclInit succeeded in `load`; NULL: the count is not wanted.
            Some(f) => ("aclFinalizeReference", unsafe { f(std::ptr::null_mut()) }),
            // SAFETY: as above; nothing of ours is live after the backend.
            None => ("aclFinalize", unsafe { (self.finalize)() }),
        };
        if let Err(e) = self.check(call, code) {
            tracing::warn!("{e}");
        }
    }
}

impl DeviceApi for AclRuntime {
    fn set_device(&self, device: i32) -> Result<(), ApiError> {
        // SAFETY: takes the device id by value; an invalid one is an error code
        // (ACL_ERROR_RT_INVALID_DEVICEID), not undefined behaviour.
        self.check("aclrtSetDevice", unsafe { (self.set_device)(device) })
    }

    fn host_alloc_pinned(&self, bytes: usize) -> Result<Handle, ApiError> {
        let mut p = std::ptr::null_mut();
        // SAFETY: `p` is a live local the runtime writes the host pointer to.
        self.check("aclrtMallocHost", unsafe {
            (self.malloc_host)(&mut p, bytes)
        })?;
        Ok(p)
    }

    fn host_free_pinned(&self, ptr: Handle) -> Result<(), ApiError> {
        // SAFETY: `ptr` came from aclrtMallocHost and is freed once (the `DeviceApi` handle contract).
        self.check("aclrtFreeHost", unsafe { (self.free_host)(ptr) })
    }

    fn device_alloc(&self, bytes: usize) -> Result<Handle, ApiError> {
        let mut p = std::ptr::null_mut();
        // SAFETY: `p` is a live local the runtime writes the device pointer to.
        self.check("aclrtMalloc", unsafe {
            (self.malloc)(&mut p, bytes, ACL_MEM_MALLOC_HUGE_FIRST)
        })?;
        Ok(p)
    }

    fn device_free(&self, ptr: Handle) -> Result<(), ApiError> {
        // SAFETY: `ptr` came from aclrtMalloc and is freed once (the `DeviceApi` handle contract).
        self.check("aclrtFree", unsafe { (self.free)(ptr) })
    }

    fn stream_create(&self) -> Result<Handle, ApiError> {
        let mut s = std::ptr::null_mut();
        // SAFETY: `s` is a live local the runtime writes the stream handle to.
        self.check("aclrtCreateStream", unsafe { (self.create_stream)(&mut s) })?;
        Ok(s)
    }

    fn stream_destroy(&self, stream: Handle) -> Result<(), ApiError> {
        // SAFETY: `stream` came from aclrtCreateStream, its work is synchronized (CANN: never
        // release what a stream may still use), and it is destroyed once (the `DeviceApi` handle contract).
        self.check("aclrtDestroyStream", unsafe {
            (self.destroy_stream)(stream)
        })
    }

    fn stream_synchronize(&self, stream: Handle) -> Result<(), ApiError> {
        // SAFETY: `stream` came from aclrtCreateStream and is not destroyed yet (the `DeviceApi` handle contract).
        self.check("aclrtSynchronizeStream", unsafe {
            (self.synchronize_stream)(stream)
        })
    }

    fn copy_async(
        &self,
        dst: Handle,
        src: Handle,
        bytes: usize,
        direction: Direction,
        stream: Handle,
    ) -> Result<(), ApiError> {
        let kind = match direction {
            Direction::H2d => ACL_MEMCPY_HOST_TO_DEVICE,
            Direction::D2h => ACL_MEMCPY_DEVICE_TO_HOST,
        };
        // SAFETY: `dst` and `src` are live allocations of at least `bytes` bytes of the kinds
        // `direction` names, owned by the caller until the stream is synchronized (the `DeviceApi` handle contract);
        // host memory is aclrtMallocHost memory, as aclrtMemcpyAsync requires.
        self.check("aclrtMemcpyAsync", unsafe {
            (self.memcpy_async)(dst, bytes, src, bytes, kind, stream)
        })
    }

    fn copy_device_async(
        &self,
        dst: Handle,
        src: Handle,
        bytes: usize,
        stream: Handle,
    ) -> Result<(), ApiError> {
        // SAFETY: both are live device allocations of at least `bytes` bytes (the `DeviceApi` handle contract).
        self.check("aclrtMemcpyAsync", unsafe {
            (self.memcpy_async)(dst, bytes, src, bytes, ACL_MEMCPY_DEVICE_TO_DEVICE, stream)
        })
    }

    fn event_create(&self) -> Result<Handle, ApiError> {
        let mut e = std::ptr::null_mut();
        // SAFETY: `e` is a live local the runtime writes the event handle to.
        self.check("aclrtCreateEvent", unsafe { (self.create_event)(&mut e) })?;
        Ok(e)
    }

    fn event_destroy(&self, event: Handle) -> Result<(), ApiError> {
        // SAFETY: `event` came from aclrtCreateEvent and is destroyed once (the `DeviceApi` handle contract).
        self.check("aclrtDestroyEvent", unsafe { (self.destroy_event)(event) })
    }

    fn event_record(&self, event: Handle, stream: Handle) -> Result<(), ApiError> {
        // SAFETY: `event` and `stream` came from aclrtCreateEvent / aclrtCreateStream and are not
        // released yet (the `DeviceApi` handle contract).
        self.check("aclrtRecordEvent", unsafe {
            (self.record_event)(event, stream)
        })
    }

    fn event_synchronize(&self, event: Handle) -> Result<(), ApiError> {
        // SAFETY: `event` came from aclrtCreateEvent and is not destroyed yet (the `DeviceApi` handle contract).
        self.check("aclrtSynchronizeEvent", unsafe {
            (self.synchronize_event)(event)
        })
    }

    /// `aclrtSynchronizeEventWithTimeout` in slices of at most 100 ms (so an interrupt is
    /// seen), else polling `aclrtQueryEventStatus`, else (CANN before 7) an unbounded
    /// `aclrtSynchronizeEvent`.
    fn event_wait(&self, event: Handle, timeout: std::time::Duration) -> Result<bool, ApiError> {
        if let Some(sync) = self.sync_event_timeout {
            let until = std::time::Instant::now() + timeout;
            loop {
                let left = until.saturating_duration_since(std::time::Instant::now());
                let slice = left
                    .min(std::time::Duration::from_millis(100))
                    .as_millis()
                    .max(1);
                // SAFETY: `event` came from aclrtCreateEvent and is live (the `DeviceApi`
                // handle contract); the timeout is positive milliseconds.
                match unsafe { sync(event, slice as i32) } {
                    ACL_ERROR_RT_EVENT_SYNC_TIMEOUT => {
                        if left.is_zero() || stuck_work::interrupted() {
                            return Ok(false);
                        }
                    }
                    code => {
                        return self
                            .check("aclrtSynchronizeEventWithTimeout", code)
                            .map(|()| true)
                    }
                }
            }
        }
        if let Some(query) = self.query_event {
            return super::device_wait::poll_event(timeout, &|| {
                let mut status: c_int = 0;
                // SAFETY: `event` is live; `status` is a valid out-pointer.
                self.check("aclrtQueryEventStatus", unsafe {
                    query(event, &mut status)
                })?;
                Ok(status == ACL_EVENT_RECORDED_STATUS_COMPLETE)
            });
        }
        self.event_synchronize(event).map(|()| true)
    }

    fn stuck_work(&self) -> &StuckWork {
        &self.stuck
    }

    fn event_elapsed_ms(&self, start: Handle, end: Handle) -> Result<f32, ApiError> {
        let mut ms = 0f32;
        // SAFETY: `ms` is a valid out-pointer; both events are live and recorded.
        self.check("aclrtEventElapsedTime", unsafe {
            (self.event_elapsed_time)(&mut ms, start, end)
        })?;
        Ok(ms)
    }

    fn pageable_refusal(&self) -> Option<&'static str> {
        Some(PAGEABLE_REFUSAL)
    }

    fn can_access_peer(&self, device: i32, peer: i32) -> Result<bool, ApiError> {
        let fns = self.peer_fns("aclrtDeviceCanAccessPeer")?;
        let mut can = 0i32;
        // SAFETY: `can` is a live local the runtime writes 0 or 1 to; the ids are values.
        self.check("aclrtDeviceCanAccessPeer", unsafe {
            (fns.can_access)(&mut can, device, peer)
        })?;
        Ok(can != 0)
    }

    fn enable_peer_access(&self, peer: i32) -> Result<bool, ApiError> {
        let fns = self.peer_fns("aclrtDeviceEnablePeerAccess")?;
        // SAFETY: takes the peer id and flags by value (acl_rt.h: flags must be 0); a refused
        // request is an error code.
        self.check("aclrtDeviceEnablePeerAccess", unsafe {
            (fns.enable)(peer, 0)
        })?;
        // Never "newly enabled": CANN enables peer access per device, not per process
        // ("使能内存复制是Device级的", aclrtDeviceEnablePeerAccess in the CANN 7.0 to 9.0
        // references), succeeds whether or not it already was, and has no query. So chd
        // cannot tell its own enable from a training job's, and disabling it afterwards could
        // cut another process's copies off: on ACL chd leaves peer access as it found it
        // enabled (`PeerLink::close` disables only what was newly enabled).
        Ok(false)
    }

    fn disable_peer_access(&self, peer: i32) -> Result<(), ApiError> {
        let fns = self.peer_fns("aclrtDeviceDisablePeerAccess")?;
        // SAFETY: takes the peer id by value; a refused request is an error code.
        self.check("aclrtDeviceDisablePeerAccess", unsafe {
            (fns.disable)(peer)
        })
    }

    fn stages_peer_copies(&self) -> bool {
        false
    }

    fn device_lost(&self, code: i32) -> bool {
        code == ACL_ERROR_RT_LOST_HEARTBEAT
    }

    fn launch_host_function(
        &self,
        stream: Handle,
        func: super::device_api::HostFunction,
        data: *mut c_void,
    ) -> Result<bool, ApiError> {
        let Some(launch) = self.launch_host_func else {
            return Ok(false);
        };
        // SAFETY: `stream` is live (the `DeviceApi` handle contract); `func` calls no ACL API
        // (CANN: no resource, synchronization or task calls in the callback) and owns what
        // `data` points to (`stream_latch`).
        match unsafe { launch(stream, func, data) } {
            ACL_ERROR_RT_FEATURE_NOT_SUPPORT => Ok(false),
            code => self.check("aclrtLaunchHostFunc", code).map(|()| true),
        }
    }
}

impl AclRuntime {
    /// The peer-access calls, or why there are none.
    fn peer_fns(&self, call: &'static str) -> Result<&PeerFns, ApiError> {
        self.peer.as_ref().ok_or_else(|| ApiError {
            call,
            code: -1,
            text: format!("{} lacks the peer-access calls", self.source),
        })
    }
}

/// The Ascend backend: one device per visible NPU, labelled by runtime index.
#[derive(Debug)]
pub struct AclBackend {
    runtime: std::sync::Arc<AclRuntime>,
    devices: Vec<DeviceInfo>,
}

impl AclBackend {
    /// Load and initialise ACL and list its devices. No devices is an error.
    pub fn open(path: Option<&Path>, sysfs: &Path) -> Result<AclBackend, AclLoadError> {
        let runtime = AclRuntime::load(path)?;
        let count = runtime.device_count().map_err(AclLoadError::Call)?;
        if count == 0 {
            return Err(AclLoadError::NoDevices(runtime.source.clone()));
        }
        let bus_ids = pci_bus_ids(&runtime, count, sysfs);
        let devices = (0..count as usize)
            .map(|index| {
                let pci_bus_id = bus_ids.get(index).cloned().unwrap_or_default();
                DeviceInfo {
                    id: index.to_string(),
                    kind: "acl".into(),
                    name: "Ascend NPU".into(),
                    numa_node: pci::numa_node(sysfs, &pci_bus_id),
                    pci_bus_id,
                }
            })
            .collect();
        Ok(AclBackend {
            runtime: std::sync::Arc::new(runtime),
            devices,
        })
    }

    /// The runtime, for the utilization gate and the pair probe.
    pub fn runtime(&self) -> &AclRuntime {
        &self.runtime
    }

    pub(crate) fn shared_runtime(&self) -> std::sync::Arc<AclRuntime> {
        self.runtime.clone()
    }

    pub fn describe(&self) -> String {
        format!("Ascend ACL from {}", self.runtime.source)
    }
}

/// Each device's PCI bus id: the runtime's answer where it has `aclrtDeviceGetPCIBusId` and
/// answers for every device, else the Huawei accelerators in sysfs in bus order (the order the
/// runtime numbers NPUs in without ASCEND_RT_VISIBLE_DEVICES), else none.
fn pci_bus_ids(runtime: &AclRuntime, count: u32, sysfs: &Path) -> Vec<String> {
    let queried: Option<Result<Vec<String>, ApiError>> = (0..count as i32)
        .map(|d| runtime.pci_bus_id(d))
        .collect::<Option<Vec<_>>>()
        .map(|ids| ids.into_iter().collect());
    match queried {
        Some(Ok(ids)) => return ids,
        Some(Err(e)) => tracing::info!("{e}; matching NPUs to sysfs by bus order"),
        None => {}
    }
    if std::env::var_os("ASCEND_RT_VISIBLE_DEVICES").is_some() {
        return Vec::new();
    }
    let npus = pci::devices_of(sysfs, HUAWEI_VENDOR, ACCELERATOR_CLASS);
    if npus.len() == count as usize {
        npus
    } else {
        Vec::new()
    }
}

impl Backend for AclBackend {
    fn name(&self) -> &'static str {
        "acl"
    }

    fn check_host_memory(&self, memory: HostMemory) -> Result<(), String> {
        match memory {
            HostMemory::Pinned => Ok(()),
            HostMemory::Pageable => Err(PAGEABLE_REFUSAL.into()),
        }
    }

    fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }

    fn measure_copy(&self, device: &str, params: &CopyParams) -> Result<f64, ProbeError> {
        let index = device_index(&self.devices, device)?;
        device_copy::measure(&*self.runtime, index, params)
    }

    fn measure_peer_copy(
        &self,
        src: &str,
        dst: &str,
        params: &super::DeviceCopyParams,
    ) -> Result<super::PeerCopy, ProbeError> {
        let (s, d) = (
            device_index(&self.devices, src)?,
            device_index(&self.devices, dst)?,
        );
        super::peer_copy::measure(&*self.runtime, s, d, params)
    }

    fn measure_device_copy(
        &self,
        device: &str,
        params: &super::DeviceCopyParams,
    ) -> Result<f64, ProbeError> {
        let index = device_index(&self.devices, device)?;
        super::same_device_copy::measure(&*self.runtime, index, params)
    }

    fn staging(&self, params: &CopyParams) -> Result<Box<dyn super::HostStaging + '_>, ProbeError> {
        Ok(Box::new(device_copy::DeviceStaging {
            devices: &self.devices,
            staging: device_copy::Staging::new(&*self.runtime, params)?,
        }))
    }

    fn stuck(&self) -> stuck_work::StuckReport {
        self.runtime.stuck.report(|d| d.to_string())
    }

    fn recheck_stuck(&self) {
        super::device_wait::recheck(&*self.runtime, &self.runtime.stuck);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupported_engines_do_not_count_as_idle() {
        let info = |cube, vector, aicpu| AclUtilizationInfo {
            cube_utilization: cube,
            vector_utilization: vector,
            aicpu_utilization: aicpu,
            ..AclUtilizationInfo::default()
        };
        assert_eq!(busiest_engine(&info(30, 70, 5)), Some(0.7));
        assert_eq!(busiest_engine(&info(-1, 40, -1)), Some(0.4));
        assert_eq!(busiest_engine(&info(-1, -1, -1)), None);
        assert_eq!(busiest_engine(&info(0, 0, 0)), Some(0.0));
        assert_eq!(busiest_engine(&info(250, 0, 0)), Some(1.0));
    }
}
