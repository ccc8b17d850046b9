//! The CUDA backend: libcudart loaded at run time (no toolkit needed to build chd). A struct
//! of typed function pointers filled once by `CudaRuntime::load`, the `DeviceApi` calls the
//! shared measurement routine uses, and device discovery (name, PCI bus id, NUMA node from
//! sysfs).

// FFI: libcudart's C API, called through function pointers resolved at run time.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::path::{Path, PathBuf};

use libloading::Library;

use super::device_copy::{self, ApiError, DeviceApi, Handle};
use super::library::{self, LoadError, SymbolError};
use super::stuck_work::{self, StuckWork};
use super::{Backend, CopyParams, DeviceInfo, Direction, ProbeError};
use crate::topology::pci;

/// Sonames tried in order when no path is given.
pub const CANDIDATES: &[&str] = &[
    "libcudart.so",
    "libcudart.so.13",
    "libcudart.so.12",
    "libcudart.so.11.0",
];

type CudaError = c_int;
const CUDA_SUCCESS: CudaError = 0;
const CUDA_MEMCPY_HOST_TO_DEVICE: c_int = 1;
const CUDA_MEMCPY_DEVICE_TO_HOST: c_int = 2;
const CUDA_MEMCPY_DEVICE_TO_DEVICE: c_int = 3;
const CUDA_STREAM_NON_BLOCKING: c_uint = 1;
/// `cudaErrorPeerAccessAlreadyEnabled`: enabling twice (another user in this process, such as
/// NCCL, may have enabled it first).
const CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: CudaError = 704;
/// `cudaDeviceProp` is over 1 KiB and grows between releases; it starts with `char name[256]`.
const DEVICE_PROP_BYTES: usize = 8192;

type FnInt = unsafe extern "C" fn(*mut c_int) -> CudaError;
type FnSetDevice = unsafe extern "C" fn(c_int) -> CudaError;
type FnProps = unsafe extern "C" fn(*mut c_void, c_int) -> CudaError;
type FnPciBusId = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> CudaError;
type FnHostAlloc = unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CudaError;
type FnMalloc = unsafe extern "C" fn(*mut *mut c_void, usize) -> CudaError;
type FnFree = unsafe extern "C" fn(*mut c_void) -> CudaError;
type FnStreamCreate = unsafe extern "C" fn(*mut *mut c_void, c_uint) -> CudaError;
type FnHandle = unsafe extern "C" fn(*mut c_void) -> CudaError;
type FnMemcpyAsync =
    unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int, *mut c_void) -> CudaError;
type FnEventCreate = unsafe extern "C" fn(*mut *mut c_void) -> CudaError;
type FnEventRecord = unsafe extern "C" fn(*mut c_void, *mut c_void) -> CudaError;
type FnElapsed = unsafe extern "C" fn(*mut f32, *mut c_void, *mut c_void) -> CudaError;
type FnErrorString = unsafe extern "C" fn(CudaError) -> *const c_char;
type FnCanAccessPeer = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> CudaError;
type FnEnablePeer = unsafe extern "C" fn(c_int, c_uint) -> CudaError;
/// `cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData)`
/// (cuda_runtime_api.h, CUDA 10.0 and later).
type FnLaunchHostFunc =
    unsafe extern "C" fn(*mut c_void, super::device_api::HostFunction, *mut c_void) -> CudaError;
/// `cudaError_t cudaHostGetDevicePointer(void **pDevice, void *pHost, unsigned int flags)`.
type FnHostGetDevicePointer =
    unsafe extern "C" fn(*mut *mut c_void, *mut c_void, c_uint) -> CudaError;
/// `cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr, unsigned
/// int cudaVersion, unsigned long long flags, cudaDriverEntryPointQueryResult *driverStatus)`
/// (CUDA 12.5 and later; 12.9 and 13.0 checked).
type FnEntryPointByVersion =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_uint, u64, *mut c_int) -> CudaError;
/// `cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr, unsigned long long
/// flags, cudaDriverEntryPointQueryResult *driverStatus)` (the CUDA 12 declaration; CUDA 11's
/// has no `driverStatus`, so chd calls it only on a 12.x runtime).
type FnEntryPoint =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, u64, *mut c_int) -> CudaError;
/// `CUresult cuStreamWaitValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned
/// int flags)` (cuda.h, CUDA 12 and 13: the `_v2` ABI `cuda.h` maps the name to).
type FnWaitValue32 = unsafe extern "C" fn(*mut c_void, u64, u32, c_uint) -> c_int;

/// How chd reaches the driver's `cuStreamWaitValue32`: through the runtime
/// (`cudaGetDriverEntryPoint[ByVersion]`), never by loading `libcuda.so.1` itself. The runtime
/// hands out the function of the very driver it loaded and initialised, in the ABI version
/// asked for; a second `dlopen` of libcuda could pick another copy than the runtime's (a
/// container's compat libraries ahead of the host driver on the library path) and would have to
/// choose between the `cuStreamWaitValue32` (v1, behind a driver opt-in before CUDA 12) and
/// `cuStreamWaitValue32_v2` exports by hand. PyPI ships libcudart but no libcuda (it comes
/// with the driver), so only the runtime's entry points are checked against a real library
/// (`tests/runtime/real_libs.rs`); the driver function is the fake's on CI and the real one on a GPU.
#[derive(Clone, Copy)]
enum EntryPoint {
    ByVersion(FnEntryPointByVersion),
    Plain(FnEntryPoint),
}

/// `cudaHostAllocMapped`: map the allocation into the device address space (implied with
/// unified addressing, explicit for the latch word a stream waits on).
const CUDA_HOST_ALLOC_MAPPED: c_uint = 0x02;
/// `cudaErrorNotReady`: an event query whose work has not completed.
const CUDA_ERROR_NOT_READY: CudaError = 600;
/// `cudaErrorNotSupported` / `CUDA_ERROR_NOT_SUPPORTED`.
const CUDA_ERROR_NOT_SUPPORTED: CudaError = 801;
/// `CU_STREAM_WAIT_VALUE_GEQ`: wait until `(int32_t)(*addr - value) >= 0`.
const CU_STREAM_WAIT_VALUE_GEQ: c_uint = 0;
/// The ABI chd asks the runtime for: CUDA 12.0's (`cuStreamWaitValue32_v2`).
const DRIVER_ABI_VERSION: c_uint = 12000;

/// The peer-access calls (cuda_runtime_api.h, CUDA 12.4: `cudaDeviceCanAccessPeer(int*, int,
/// int)`, `cudaDeviceEnablePeerAccess(int, unsigned int)`, `cudaDeviceDisablePeerAccess(int)`).
struct PeerFns {
    can_access: FnCanAccessPeer,
    enable: FnEnablePeer,
    disable: FnSetDevice,
}

/// Why the CUDA backend is unavailable.
#[derive(Debug, thiserror::Error)]
pub enum CudaLoadError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Symbol(#[from] SymbolError),
    #[error("{0}")]
    Call(ApiError),
    #[error("the CUDA runtime at {0} reports no devices")]
    NoDevices(String),
}

/// libcudart's entry points. The library stays loaded as long as this lives.
pub struct CudaRuntime {
    get_device_count: FnInt,
    runtime_get_version: FnInt,
    set_device: FnSetDevice,
    get_device_properties: FnProps,
    device_get_pci_bus_id: FnPciBusId,
    host_alloc: FnHostAlloc,
    free_host: FnFree,
    malloc: FnMalloc,
    free: FnFree,
    stream_create_with_flags: FnStreamCreate,
    stream_destroy: FnHandle,
    stream_synchronize: FnHandle,
    memcpy_async: FnMemcpyAsync,
    event_create: FnEventCreate,
    event_destroy: FnHandle,
    event_record: FnEventRecord,
    event_synchronize: FnHandle,
    event_query: FnHandle,
    event_elapsed_time: FnElapsed,
    get_error_string: FnErrorString,
    get_error_name: FnErrorString,
    peer: PeerFns,
    /// The stream latches (`stream_latch`): absent from runtimes that lack them.
    launch_host_func: Option<FnLaunchHostFunc>,
    host_get_device_pointer: Option<FnHostGetDevicePointer>,
    entry_point: Option<EntryPoint>,
    /// `cuStreamWaitValue32`, asked of the runtime at the first latch (asking initialises the
    /// runtime, which loading must not).
    wait_value: std::sync::OnceLock<Option<FnWaitValue32>>,
    /// Cells whose device work did not finish in time (`stuck_work`).
    stuck: StuckWork,
    /// Where it was loaded from.
    pub source: String,
    _library: Library,
}

impl std::fmt::Debug for CudaRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaRuntime")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl CudaRuntime {
    /// Load libcudart from `path`, or the first standard soname that loads.
    pub fn load(path: Option<&Path>) -> Result<CudaRuntime, CudaLoadError> {
        let (lib, source) = library::open("CUDA runtime", path, CANDIDATES)?;
        // SAFETY: every type below is the C declaration of the named CUDA runtime function
        // (cuda_runtime_api.h); the pointers live no longer than `_library`.
        unsafe {
            let props = library::symbol::<FnProps>(&lib, &source, "cudaGetDeviceProperties_v2")
                .or_else(|_| library::symbol(&lib, &source, "cudaGetDeviceProperties"))?;
            Ok(CudaRuntime {
                get_device_count: library::symbol(&lib, &source, "cudaGetDeviceCount")?,
                runtime_get_version: library::symbol(&lib, &source, "cudaRuntimeGetVersion")?,
                set_device: library::symbol(&lib, &source, "cudaSetDevice")?,
                get_device_properties: props,
                device_get_pci_bus_id: library::symbol(&lib, &source, "cudaDeviceGetPCIBusId")?,
                host_alloc: library::symbol(&lib, &source, "cudaHostAlloc")?,
                free_host: library::symbol(&lib, &source, "cudaFreeHost")?,
                malloc: library::symbol(&lib, &source, "cudaMalloc")?,
                free: library::symbol(&lib, &source, "cudaFree")?,
                stream_create_with_flags: library::symbol(
                    &lib,
                    &source,
                    "cudaStreamCreateWithFlags",
                )?,
                stream_destroy: library::symbol(&lib, &source, "cudaStreamDestroy")?,
                stream_synchronize: library::symbol(&lib, &source, "cudaStreamSynchronize")?,
                memcpy_async: library::symbol(&lib, &source, "cudaMemcpyAsync")?,
                event_create: library::symbol(&lib, &source, "cudaEventCreate")?,
                event_destroy: library::symbol(&lib, &source, "cudaEventDestroy")?,
                event_record: library::symbol(&lib, &source, "cudaEventRecord")?,
                event_synchronize: library::symbol(&lib, &source, "cudaEventSynchronize")?,
                event_query: library::symbol(&lib, &source, "cudaEventQuery")?,
                event_elapsed_time: library::symbol(&lib, &source, "cudaEventElapsedTime")?,
                get_error_string: library::symbol(&lib, &source, "cudaGetErrorString")?,
                get_error_name: library::symbol(&lib, &source, "cudaGetErrorName")?,
                peer: PeerFns {
                    can_access: library::symbol(&lib, &source, "cudaDeviceCanAccessPeer")?,
                    enable: library::symbol(&lib, &source, "cudaDeviceEnablePeerAccess")?,
                    disable: library::symbol(&lib, &source, "cudaDeviceDisablePeerAccess")?,
                },
                launch_host_func: library::symbol(&lib, &source, "cudaLaunchHostFunc").ok(),
                host_get_device_pointer: library::symbol(&lib, &source, "cudaHostGetDevicePointer")
                    .ok(),
                entry_point: library::symbol(&lib, &source, "cudaGetDriverEntryPointByVersion")
                    .map(EntryPoint::ByVersion)
                    .or_else(|_| {
                        library::symbol(&lib, &source, "cudaGetDriverEntryPoint")
                            .map(EntryPoint::Plain)
                    })
                    .ok(),
                wait_value: std::sync::OnceLock::new(),
                stuck: StuckWork::default(),
                source,
                _library: lib,
            })
        }
    }

    fn check(&self, call: &'static str, code: CudaError) -> Result<(), ApiError> {
        if code == CUDA_SUCCESS {
            return Ok(());
        }
        // SAFETY: both return static NUL-terminated strings for any code.
        let (name, text) = unsafe {
            (
                library::c_text((self.get_error_name)(code)),
                library::c_text((self.get_error_string)(code)),
            )
        };
        Err(ApiError {
            call,
            code,
            text: format!("{name}: {text}"),
        })
    }

    /// Number of visible devices (after CUDA_VISIBLE_DEVICES).
    pub fn device_count(&self) -> Result<u32, ApiError> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a live local the runtime writes the count to.
        self.check("cudaGetDeviceCount", unsafe {
            (self.get_device_count)(&mut n)
        })?;
        Ok(n.max(0) as u32)
    }

    /// The runtime version, e.g. 12040.
    pub fn runtime_version(&self) -> Result<i32, ApiError> {
        let mut v: c_int = 0;
        // SAFETY: `v` is a live local the runtime writes the version to.
        self.check("cudaRuntimeGetVersion", unsafe {
            (self.runtime_get_version)(&mut v)
        })?;
        Ok(v)
    }

    /// Device name from `cudaDeviceProp.name`.
    pub fn device_name(&self, device: i32) -> Result<String, ApiError> {
        let mut props = vec![0u8; DEVICE_PROP_BYTES];
        // SAFETY: the buffer is larger than any cudaDeviceProp and zeroed.
        self.check("cudaGetDeviceProperties", unsafe {
            (self.get_device_properties)(props.as_mut_ptr().cast(), device)
        })?;
        let name = &props[..256];
        let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        Ok(String::from_utf8_lossy(&name[..end]).into_owned())
    }

    /// PCI bus id, lower-cased to sysfs's spelling (`0000:1a:00.0`).
    pub fn pci_bus_id(&self, device: i32) -> Result<String, ApiError> {
        let mut buf = [0 as c_char; 64];
        // SAFETY: `buf` holds 64 bytes and we pass its length.
        self.check("cudaDeviceGetPCIBusId", unsafe {
            (self.device_get_pci_bus_id)(buf.as_mut_ptr(), buf.len() as c_int, device)
        })?;
        // SAFETY: the runtime NUL-terminates within the given length.
        Ok(unsafe { library::c_text(buf.as_ptr()) }.to_ascii_lowercase())
    }
}

/// `cudaHostAllocPortable` (`cuda_runtime_api.h`, `#define cudaHostAllocPortable 0x01`): "the
/// memory returned by this call will be considered as pinned memory by all CUDA contexts, not
/// just the one that performed the allocation" (CUDA Runtime API, `cudaHostAlloc`). Without
/// it, the programming guide's "Portable Memory" says the benefits of page-locking hold only
/// for the device current at allocation; one staging buffer serves every device in turn.
const CUDA_HOST_ALLOC_PORTABLE: c_uint = 0x01;

/// `cudaErrorDevicesUnavailable` (driver_types.h).
const CUDA_ERROR_DEVICES_UNAVAILABLE: CudaError = 46;

impl DeviceApi for CudaRuntime {
    fn set_device(&self, device: i32) -> Result<(), ApiError> {
        // SAFETY: takes the device ordinal by value; an invalid one is cudaErrorInvalidDevice,
        // an error code.
        self.check("cudaSetDevice", unsafe { (self.set_device)(device) })
    }

    fn host_alloc_pinned(&self, bytes: usize) -> Result<Handle, ApiError> {
        let mut p = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer; the flags are defined cudaHostAlloc flags.
        self.check("cudaHostAlloc", unsafe {
            (self.host_alloc)(
                &mut p,
                bytes,
                CUDA_HOST_ALLOC_PORTABLE | CUDA_HOST_ALLOC_MAPPED,
            )
        })?;
        Ok(p)
    }

    fn host_free_pinned(&self, ptr: Handle) -> Result<(), ApiError> {
        // SAFETY: `ptr` came from cudaHostAlloc and is freed once (the `DeviceApi` handle contract).
        self.check("cudaFreeHost", unsafe { (self.free_host)(ptr) })
    }

    fn device_alloc(&self, bytes: usize) -> Result<Handle, ApiError> {
        let mut p = std::ptr::null_mut();
        // SAFETY: `p` is a live local the runtime writes the device pointer to.
        self.check("cudaMalloc", unsafe { (self.malloc)(&mut p, bytes) })?;
        Ok(p)
    }

    fn device_free(&self, ptr: Handle) -> Result<(), ApiError> {
        // SAFETY: `ptr` came from cudaMalloc and is freed once (the `DeviceApi` handle contract).
        self.check("cudaFree", unsafe { (self.free)(ptr) })
    }

    fn stream_create(&self) -> Result<Handle, ApiError> {
        let mut s = std::ptr::null_mut();
        // SAFETY: `s` is a live local the runtime writes the stream handle to.
        self.check("cudaStreamCreateWithFlags", unsafe {
            (self.stream_create_with_flags)(&mut s, CUDA_STREAM_NON_BLOCKING)
        })?;
        Ok(s)
    }

    fn stream_destroy(&self, stream: Handle) -> Result<(), ApiError> {
        // SAFETY: `stream` came from cudaStreamCreateWithFlags, its work is synchronized, and it
        // is destroyed once (the `DeviceApi` handle contract).
        self.check("cudaStreamDestroy", unsafe {
            (self.stream_destroy)(stream)
        })
    }

    fn stream_synchronize(&self, stream: Handle) -> Result<(), ApiError> {
        // SAFETY: `stream` came from cudaStreamCreateWithFlags and is not destroyed yet (the `DeviceApi` handle contract).
        self.check("cudaStreamSynchronize", unsafe {
            (self.stream_synchronize)(stream)
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
            Direction::H2d => CUDA_MEMCPY_HOST_TO_DEVICE,
            Direction::D2h => CUDA_MEMCPY_DEVICE_TO_HOST,
        };
        // SAFETY: `dst` and `src` are live allocations of at least `bytes` bytes of the kinds
        // `direction` names, owned by the caller until the stream is synchronized (the `DeviceApi` handle contract).
        self.check("cudaMemcpyAsync", unsafe {
            (self.memcpy_async)(dst, src, bytes, kind, stream)
        })
    }

    fn copy_device_async(
        &self,
        dst: Handle,
        src: Handle,
        bytes: usize,
        stream: Handle,
    ) -> Result<(), ApiError> {
        // SAFETY: both are live device allocations of at least `bytes` bytes (unified
        // addressing lets the runtime find their devices).
        self.check("cudaMemcpyAsync", unsafe {
            (self.memcpy_async)(dst, src, bytes, CUDA_MEMCPY_DEVICE_TO_DEVICE, stream)
        })
    }

    fn event_create(&self) -> Result<Handle, ApiError> {
        let mut e = std::ptr::null_mut();
        // SAFETY: `e` is a live local the runtime writes the event handle to.
        self.check("cudaEventCreate", unsafe { (self.event_create)(&mut e) })?;
        Ok(e)
    }

    fn event_destroy(&self, event: Handle) -> Result<(), ApiError> {
        // SAFETY: `event` came from cudaEventCreate and is destroyed once (the `DeviceApi` handle contract).
        self.check("cudaEventDestroy", unsafe { (self.event_destroy)(event) })
    }

    fn event_record(&self, event: Handle, stream: Handle) -> Result<(), ApiError> {
        // SAFETY: `event` and `stream` came from cudaEventCreate / cudaStreamCreateWithFlags and
        // are not released yet (the `DeviceApi` handle contract).
        self.check("cudaEventRecord", unsafe {
            (self.event_record)(event, stream)
        })
    }

    fn event_synchronize(&self, event: Handle) -> Result<(), ApiError> {
        // SAFETY: `event` came from cudaEventCreate and is not destroyed yet (the `DeviceApi` handle contract).
        self.check("cudaEventSynchronize", unsafe {
            (self.event_synchronize)(event)
        })
    }

    /// Polls `cudaEventQuery` (`cudaSuccess` done, `cudaErrorNotReady` not yet).
    fn event_wait(&self, event: Handle, timeout: std::time::Duration) -> Result<bool, ApiError> {
        super::device_wait::poll_event(timeout, &|| {
            // SAFETY: `event` came from cudaEventCreate and is not destroyed yet (the
            // `DeviceApi` handle contract).
            match unsafe { (self.event_query)(event) } {
                CUDA_ERROR_NOT_READY => Ok(false),
                code => self.check("cudaEventQuery", code).map(|()| true),
            }
        })
    }

    fn stuck_work(&self) -> &StuckWork {
        &self.stuck
    }

    fn event_elapsed_ms(&self, start: Handle, end: Handle) -> Result<f32, ApiError> {
        let mut ms = 0f32;
        // SAFETY: `ms` is a valid out-pointer; both events are live and recorded.
        self.check("cudaEventElapsedTime", unsafe {
            (self.event_elapsed_time)(&mut ms, start, end)
        })?;
        Ok(ms)
    }

    fn can_access_peer(&self, device: i32, peer: i32) -> Result<bool, ApiError> {
        let mut can: c_int = 0;
        // SAFETY: `can` is a live local the runtime writes 0 or 1 to; the ordinals are values
        // (an invalid one is cudaErrorInvalidDevice, not undefined behaviour).
        self.check("cudaDeviceCanAccessPeer", unsafe {
            (self.peer.can_access)(&mut can, device, peer)
        })?;
        Ok(can != 0)
    }

    fn enable_peer_access(&self, peer: i32) -> Result<bool, ApiError> {
        // SAFETY: plain values; flags must be 0. A failed call only sets the runtime's
        // (non-sticky) last error, which chd never reads: every call's code is checked.
        match unsafe { (self.peer.enable)(peer, 0) } {
            CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(false),
            code => self
                .check("cudaDeviceEnablePeerAccess", code)
                .map(|()| true),
        }
    }

    fn disable_peer_access(&self, peer: i32) -> Result<(), ApiError> {
        // SAFETY: takes the peer ordinal by value; disabling access that is not enabled is
        // cudaErrorPeerAccessNotEnabled, an error code.
        self.check("cudaDeviceDisablePeerAccess", unsafe {
            (self.peer.disable)(peer)
        })
    }

    fn stages_peer_copies(&self) -> bool {
        true
    }

    /// `cudaErrorDevicesUnavailable` (46, driver_types.h, CUDA 12: "all CUDA devices are busy
    /// or unavailable at the current time").
    fn device_lost(&self, code: i32) -> bool {
        code == CUDA_ERROR_DEVICES_UNAVAILABLE
    }

    fn has_stream_wait(&self) -> bool {
        self.entry_point.is_some() && self.host_get_device_pointer.is_some()
    }

    fn stream_wait_word(&self, stream: Handle, word: Handle, value: u32) -> Result<bool, ApiError> {
        let (Some(wait), Some(device_pointer)) =
            (self.wait_value_fn(), self.host_get_device_pointer)
        else {
            return Ok(false);
        };
        let mut addr = std::ptr::null_mut();
        // SAFETY: `addr` is a valid out-pointer; `word` lies in memory from cudaHostAlloc
        // (mapped), as `DeviceApi::stream_wait_word` requires; flags must be 0.
        self.check("cudaHostGetDevicePointer", unsafe {
            device_pointer(&mut addr, word, 0)
        })?;
        // SAFETY: `stream` is a live stream (the `DeviceApi` handle contract), `addr` the device
        // address of a 4-byte aligned word that outlives every stream waiting on it.
        match unsafe { wait(stream, addr as u64, value, CU_STREAM_WAIT_VALUE_GEQ) } {
            CUDA_SUCCESS => Ok(true),
            CUDA_ERROR_NOT_SUPPORTED => Ok(false),
            code => Err(ApiError {
                call: "cuStreamWaitValue32",
                code,
                text: format!("CUresult {code}"),
            }),
        }
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
        // SAFETY: `stream` is live (the `DeviceApi` handle contract); `func` calls no CUDA API
        // and owns what `data` points to (`stream_latch`).
        match unsafe { launch(stream, func, data) } {
            CUDA_ERROR_NOT_SUPPORTED => Ok(false),
            code => self.check("cudaLaunchHostFunc", code).map(|()| true),
        }
    }
}

impl CudaRuntime {
    /// The driver's `cuStreamWaitValue32`, asked of the runtime once (see [`EntryPoint`]).
    fn wait_value_fn(&self) -> Option<FnWaitValue32> {
        *self.wait_value.get_or_init(|| {
            let mut f = std::ptr::null_mut();
            let mut status: c_int = -1;
            let name = c"cuStreamWaitValue32".as_ptr();
            let code = match self.entry_point? {
                // SAFETY: a NUL-terminated name and valid out-pointers; flags 0 is
                // cudaEnableDefault.
                EntryPoint::ByVersion(get) => unsafe {
                    get(name, &mut f, DRIVER_ABI_VERSION, 0, &mut status)
                },
                // The CUDA 12 declaration only: CUDA 11's runtime takes three arguments.
                EntryPoint::Plain(get) if self.runtime_version().ok()? >= 12000 => {
                    // SAFETY: as above.
                    unsafe { get(name, &mut f, 0, &mut status) }
                }
                EntryPoint::Plain(_) => return None,
            };
            if code != CUDA_SUCCESS || f.is_null() {
                tracing::debug!(
                    "the CUDA runtime has no cuStreamWaitValue32 (code {code}, status {status})"
                );
                return None;
            }
            // SAFETY: the runtime returned the driver's cuStreamWaitValue32 in the CUDA 12 ABI,
            // whose C type is `FnWaitValue32`; the driver stays loaded as long as the runtime.
            Some(unsafe { std::mem::transmute::<*mut c_void, FnWaitValue32>(f) })
        })
    }
}

/// The CUDA backend: one device per visible GPU, labelled by runtime index.
#[derive(Debug)]
pub struct CudaBackend {
    runtime: std::sync::Arc<CudaRuntime>,
    devices: Vec<DeviceInfo>,
}

impl CudaBackend {
    /// Load the runtime and list its devices. No devices is an error (so `auto` moves on).
    pub fn open(path: Option<&Path>, sysfs: &Path) -> Result<CudaBackend, CudaLoadError> {
        let runtime = CudaRuntime::load(path)?;
        let count = runtime.device_count().map_err(CudaLoadError::Call)?;
        if count == 0 {
            return Err(CudaLoadError::NoDevices(runtime.source.clone()));
        }
        let mut devices = Vec::with_capacity(count as usize);
        for index in 0..count as i32 {
            let name = runtime.device_name(index).map_err(CudaLoadError::Call)?;
            let pci_bus_id = runtime.pci_bus_id(index).map_err(CudaLoadError::Call)?;
            devices.push(DeviceInfo {
                id: index.to_string(),
                kind: "cuda".into(),
                name,
                numa_node: pci::numa_node(sysfs, &pci_bus_id),
                pci_bus_id,
            });
        }
        Ok(CudaBackend {
            runtime: std::sync::Arc::new(runtime),
            devices,
        })
    }

    /// The runtime, shared with the pair probe.
    pub(crate) fn runtime(&self) -> std::sync::Arc<CudaRuntime> {
        self.runtime.clone()
    }

    /// Where the runtime was loaded from.
    pub fn source(&self) -> &str {
        &self.runtime.source
    }

    /// Path-like description for logs.
    pub fn describe(&self) -> String {
        let version = self
            .runtime
            .runtime_version()
            .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10))
            .unwrap_or_else(|_| "unknown".into());
        format!(
            "CUDA runtime {version} from {}",
            PathBuf::from(&self.runtime.source).display()
        )
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }

    fn measure_copy(&self, device: &str, params: &CopyParams) -> Result<f64, ProbeError> {
        let index = super::device_index(&self.devices, device)?;
        device_copy::measure(&*self.runtime, index, params)
    }

    fn measure_peer_copy(
        &self,
        src: &str,
        dst: &str,
        params: &super::DeviceCopyParams,
    ) -> Result<super::PeerCopy, ProbeError> {
        let (s, d) = (
            super::device_index(&self.devices, src)?,
            super::device_index(&self.devices, dst)?,
        );
        super::peer_copy::measure(&*self.runtime, s, d, params)
    }

    fn measure_device_copy(
        &self,
        device: &str,
        params: &super::DeviceCopyParams,
    ) -> Result<f64, ProbeError> {
        let index = super::device_index(&self.devices, device)?;
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
