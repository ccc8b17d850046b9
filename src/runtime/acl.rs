//! The Ascend backend: libascendcl loaded at run time (no CANN needed to build chd). Typed
//! function pointers filled once by `AclRuntime::load`, `aclInit` on load and `aclFinalize`
//! on drop, the `DeviceApi` calls the shared measurement routine uses, and the utilization
//! query the device idle gate reads. ACL has no PCI bus id query: NPUs are matched to the
//! Huawei processing accelerators in sysfs by bus order.

use std::ffi::{c_char, c_int, c_void};
use std::path::Path;

use libloading::Library;

use super::device_copy::{self, ApiError, DeviceApi, Handle};
use super::device_index;
use super::library::{self, LoadError, SymbolError};
use super::{Backend, CopyParams, DeviceInfo, Direction, ProbeError};
use crate::topology::pci;

/// Sonames tried in order when no path is given.
pub const CANDIDATES: &[&str] = &["libascendcl.so"];
/// Huawei's PCI vendor id and the "processing accelerator" class of Ascend NPUs.
const HUAWEI_VENDOR: &str = "0x19e5";
const ACCELERATOR_CLASS: &str = "0x1200";

type AclError = c_int;
const ACL_SUCCESS: AclError = 0;
/// `ACL_ERROR_REPEAT_INITIALIZE`: aclInit already ran in this process.
const ACL_ERROR_REPEAT_INITIALIZE: AclError = 100002;
const ACL_MEMCPY_HOST_TO_DEVICE: c_int = 1;
const ACL_MEMCPY_DEVICE_TO_HOST: c_int = 2;
const ACL_MEMCPY_DEVICE_TO_DEVICE: c_int = 3;
/// `ACL_MEM_MALLOC_HUGE_FIRST`.
const ACL_MEM_MALLOC_HUGE_FIRST: c_int = 0;

/// `aclrtUtilizationInfo` (CANN 7+).
#[repr(C)]
#[derive(Debug, Default)]
struct AclUtilizationInfo {
    cube_utilization: i32,
    vector_utilization: i32,
    aicpu_utilization: i32,
    memory_utilization: i32,
    utilization_extend: usize,
}

type FnInit = unsafe extern "C" fn(*const c_char) -> AclError;
type FnVoid = unsafe extern "C" fn() -> AclError;
type FnCount = unsafe extern "C" fn(*mut u32) -> AclError;
type FnDevice = unsafe extern "C" fn(i32) -> AclError;
type FnMallocHost = unsafe extern "C" fn(*mut *mut c_void, usize) -> AclError;
type FnMalloc = unsafe extern "C" fn(*mut *mut c_void, usize, c_int) -> AclError;
type FnHandle = unsafe extern "C" fn(*mut c_void) -> AclError;
type FnCreate = unsafe extern "C" fn(*mut *mut c_void) -> AclError;
type FnMemcpyAsync =
    unsafe extern "C" fn(*mut c_void, usize, *const c_void, usize, c_int, *mut c_void) -> AclError;
type FnRecord = unsafe extern "C" fn(*mut c_void, *mut c_void) -> AclError;
type FnElapsed = unsafe extern "C" fn(*mut f32, *mut c_void, *mut c_void) -> AclError;
type FnErrMsg = unsafe extern "C" fn() -> *const c_char;
type FnUtilization = unsafe extern "C" fn(i32, *mut AclUtilizationInfo) -> AclError;
type FnCanAccessPeer = unsafe extern "C" fn(*mut i32, i32, i32) -> AclError;
type FnEnablePeer = unsafe extern "C" fn(i32, u32) -> AclError;

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
    peer: Option<PeerFns>,
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
            let runtime = AclRuntime {
                finalize: library::symbol(&lib, &source, "aclFinalize")?,
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
                source,
                _library: lib,
            };
            let code = init(std::ptr::null());
            if code != ACL_SUCCESS && code != ACL_ERROR_REPEAT_INITIALIZE {
                return Err(AclLoadError::Call(runtime.error("aclInit", code)));
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
        // SAFETY: `n` is a valid out-pointer.
        self.check("aclrtGetDeviceCount", unsafe {
            (self.get_device_count)(&mut n)
        })?;
        Ok(n)
    }

    /// Busiest engine's utilization (0..1) of `device`; `None` where the runtime lacks the
    /// query (CANN before 7).
    pub fn utilization(&self, device: i32) -> Option<Result<f64, ApiError>> {
        let query = self.utilization_rate?;
        let mut info = AclUtilizationInfo::default();
        // SAFETY: `info` is a valid out-pointer of the declared layout.
        let code = unsafe { query(device, &mut info) };
        Some(self.check("aclrtGetDeviceUtilizationRate", code).map(|()| {
            let busiest = info
                .cube_utilization
                .max(info.vector_utilization)
                .max(info.aicpu_utilization);
            f64::from(busiest.clamp(0, 100)) / 100.0
        }))
    }
}

impl Drop for AclRuntime {
    fn drop(&mut self) {
        // SAFETY: aclInit succeeded in `load`; nothing of ours is live after the backend.
        let code = unsafe { (self.finalize)() };
        if code != ACL_SUCCESS {
            tracing::warn!("aclFinalize returned {code}");
        }
    }
}

impl DeviceApi for AclRuntime {
    fn set_device(&self, device: i32) -> Result<(), ApiError> {
        // SAFETY: plain value argument.
        self.check("aclrtSetDevice", unsafe { (self.set_device)(device) })
    }

    fn host_alloc_pinned(&self, bytes: usize) -> Result<Handle, ApiError> {
        let mut p = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer.
        self.check("aclrtMallocHost", unsafe {
            (self.malloc_host)(&mut p, bytes)
        })?;
        Ok(p)
    }

    fn host_free_pinned(&self, ptr: Handle) -> Result<(), ApiError> {
        // SAFETY: `ptr` came from aclrtMallocHost and is freed once.
        self.check("aclrtFreeHost", unsafe { (self.free_host)(ptr) })
    }

    fn device_alloc(&self, bytes: usize) -> Result<Handle, ApiError> {
        let mut p = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer.
        self.check("aclrtMalloc", unsafe {
            (self.malloc)(&mut p, bytes, ACL_MEM_MALLOC_HUGE_FIRST)
        })?;
        Ok(p)
    }

    fn device_free(&self, ptr: Handle) -> Result<(), ApiError> {
        // SAFETY: `ptr` came from aclrtMalloc and is freed once.
        self.check("aclrtFree", unsafe { (self.free)(ptr) })
    }

    fn stream_create(&self) -> Result<Handle, ApiError> {
        let mut s = std::ptr::null_mut();
        // SAFETY: `s` is a valid out-pointer.
        self.check("aclrtCreateStream", unsafe { (self.create_stream)(&mut s) })?;
        Ok(s)
    }

    fn stream_destroy(&self, stream: Handle) -> Result<(), ApiError> {
        // SAFETY: `stream` came from aclrtCreateStream and is destroyed once.
        self.check("aclrtDestroyStream", unsafe {
            (self.destroy_stream)(stream)
        })
    }

    fn stream_synchronize(&self, stream: Handle) -> Result<(), ApiError> {
        // SAFETY: `stream` is live.
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
        // `direction` names, owned by the caller until the stream is synchronized.
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
        // SAFETY: both are live device allocations of at least `bytes` bytes.
        self.check("aclrtMemcpyAsync", unsafe {
            (self.memcpy_async)(dst, bytes, src, bytes, ACL_MEMCPY_DEVICE_TO_DEVICE, stream)
        })
    }

    fn event_create(&self) -> Result<Handle, ApiError> {
        let mut e = std::ptr::null_mut();
        // SAFETY: `e` is a valid out-pointer.
        self.check("aclrtCreateEvent", unsafe { (self.create_event)(&mut e) })?;
        Ok(e)
    }

    fn event_destroy(&self, event: Handle) -> Result<(), ApiError> {
        // SAFETY: `event` came from aclrtCreateEvent and is destroyed once.
        self.check("aclrtDestroyEvent", unsafe { (self.destroy_event)(event) })
    }

    fn event_record(&self, event: Handle, stream: Handle) -> Result<(), ApiError> {
        // SAFETY: both handles are live.
        self.check("aclrtRecordEvent", unsafe {
            (self.record_event)(event, stream)
        })
    }

    fn event_synchronize(&self, event: Handle) -> Result<(), ApiError> {
        // SAFETY: `event` is live.
        self.check("aclrtSynchronizeEvent", unsafe {
            (self.synchronize_event)(event)
        })
    }

    fn event_elapsed_ms(&self, start: Handle, end: Handle) -> Result<f32, ApiError> {
        let mut ms = 0f32;
        // SAFETY: `ms` is a valid out-pointer; both events are live and recorded.
        self.check("aclrtEventElapsedTime", unsafe {
            (self.event_elapsed_time)(&mut ms, start, end)
        })?;
        Ok(ms)
    }

    fn can_access_peer(&self, device: i32, peer: i32) -> Result<bool, ApiError> {
        let fns = self.peer_fns("aclrtDeviceCanAccessPeer")?;
        let mut can = 0i32;
        // SAFETY: `can` is a valid out-pointer.
        self.check("aclrtDeviceCanAccessPeer", unsafe {
            (fns.can_access)(&mut can, device, peer)
        })?;
        Ok(can != 0)
    }

    fn enable_peer_access(&self, peer: i32) -> Result<bool, ApiError> {
        let fns = self.peer_fns("aclrtDeviceEnablePeerAccess")?;
        // SAFETY: plain values; flags must be 0.
        self.check("aclrtDeviceEnablePeerAccess", unsafe {
            (fns.enable)(peer, 0)
        })?;
        Ok(true)
    }

    fn disable_peer_access(&self, peer: i32) -> Result<(), ApiError> {
        let fns = self.peer_fns("aclrtDeviceDisablePeerAccess")?;
        // SAFETY: plain value.
        self.check("aclrtDeviceDisablePeerAccess", unsafe {
            (fns.disable)(peer)
        })
    }

    fn stages_peer_copies(&self) -> bool {
        false
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
        // Without ASCEND_RT_VISIBLE_DEVICES the runtime numbers NPUs in PCI bus order.
        let npus = if std::env::var_os("ASCEND_RT_VISIBLE_DEVICES").is_some() {
            Vec::new()
        } else {
            pci::devices_of(sysfs, HUAWEI_VENDOR, ACCELERATOR_CLASS)
        };
        let matched = npus.len() == count as usize;
        let devices = (0..count as usize)
            .map(|index| {
                let pci_bus_id = if matched {
                    npus[index].clone()
                } else {
                    String::new()
                };
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

impl Backend for AclBackend {
    fn name(&self) -> &'static str {
        "acl"
    }

    fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }

    fn measure_copy(&self, device: &str, params: &CopyParams) -> Result<f64, ProbeError> {
        let index = device_index(&self.devices, device)?;
        device_copy::measure(&*self.runtime, index, params)
    }
}
