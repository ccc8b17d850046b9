//! The exported CUDA runtime subset (`libcudart.so` role): devices, pinned and device
//! memory, streams, copies, events and error strings, with `cudaError_t` codes and the
//! per-thread "last error" that `cudaGetLastError` returns and resets.
//!
//! Safety contract shared by every function here: pointer arguments must be null or valid
//! for the access the real CUDA runtime documents (out-pointers writable, host ranges of a
//! copy readable/writable for `count` bytes). Null out-pointers are rejected with
//! `cudaErrorInvalidValue`; device pointers, streams and events are validated against the
//! registries. No panic crosses the boundary (it becomes `cudaErrorUnknown`).

#![allow(non_snake_case)]
#![allow(
    clippy::missing_safety_doc,
    reason = "the module documentation states the contract shared by all these C entry points"
)]

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::config;
use crate::copy::{self, CopyError, Direction};
use crate::device;
use crate::ffi::{self, StrWrite};
use crate::memory::{self, Api};
use crate::timing::{self, StreamRef, TimingError, WaitError};

/// `cudaError_t`.
pub type CudaError = c_int;

pub const CUDA_SUCCESS: CudaError = 0;
pub const CUDA_ERROR_INVALID_VALUE: CudaError = 1;
pub const CUDA_ERROR_MEMORY_ALLOCATION: CudaError = 2;
pub const CUDA_ERROR_INVALID_MEMCPY_DIRECTION: CudaError = 21;
/// `cudaErrorDevicesUnavailable` (`driver_types.h`: "all CUDA devices are busy or unavailable
/// at the current time"): what every call that works on a lost device returns.
pub const CUDA_ERROR_DEVICES_UNAVAILABLE: CudaError = 46;
pub const CUDA_ERROR_NO_DEVICE: CudaError = 100;
pub const CUDA_ERROR_INVALID_DEVICE: CudaError = 101;
/// `cudaErrorPeerAccessUnsupported`: what `cudaDeviceEnablePeerAccess` returns between two
/// devices that cannot map each other (a `CHD_FAKE_NO_PEER` pair).
pub const CUDA_ERROR_PEER_ACCESS_UNSUPPORTED: CudaError = 217;
pub const CUDA_ERROR_INVALID_RESOURCE_HANDLE: CudaError = 400;
pub const CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: CudaError = 704;
pub const CUDA_ERROR_PEER_ACCESS_NOT_ENABLED: CudaError = 705;
/// `cudaErrorNotReady`: an event or stream query whose work has not completed.
pub const CUDA_ERROR_NOT_READY: CudaError = 600;
/// `cudaErrorNotPermitted`: a CUDA call from inside a host function ("The host function must
/// not make any CUDA API calls. Attempting to use a CUDA API may result in
/// cudaErrorNotPermitted", `cudaLaunchHostFunc`).
pub const CUDA_ERROR_NOT_PERMITTED: CudaError = 800;
pub const CUDA_ERROR_UNKNOWN: CudaError = 999;

/// `CUresult` codes of the driver API entry points handed out by `cudaGetDriverEntryPoint`.
pub const CU_SUCCESS: c_int = 0;
pub const CU_ERROR_INVALID_VALUE: c_int = 1;
pub const CU_ERROR_INVALID_HANDLE: c_int = 400;
pub const CU_ERROR_NOT_PERMITTED: c_int = 800;
pub const CU_ERROR_NOT_SUPPORTED: c_int = 801;
/// `cudaDriverEntryPointQueryResult`: `cudaDriverEntryPointSuccess`,
/// `cudaDriverEntryPointSymbolNotFound`, `cudaDriverEntryPointVersionNotSufficent`.
pub const ENTRY_POINT_SUCCESS: c_int = 0;
pub const ENTRY_POINT_SYMBOL_NOT_FOUND: c_int = 1;
pub const ENTRY_POINT_VERSION_NOT_SUFFICIENT: c_int = 2;
/// `cuStreamWaitValue32` flags: `CU_STREAM_WAIT_VALUE_GEQ`, `_EQ`, `_AND` (`_NOR`, 3, is not
/// supported here).
const CU_STREAM_WAIT_VALUE_AND: c_uint = 2;

/// `cudaMemcpyKind` values.
pub const CUDA_MEMCPY_HOST_TO_HOST: c_int = 0;
pub const CUDA_MEMCPY_HOST_TO_DEVICE: c_int = 1;
pub const CUDA_MEMCPY_DEVICE_TO_HOST: c_int = 2;
pub const CUDA_MEMCPY_DEVICE_TO_DEVICE: c_int = 3;
pub const CUDA_MEMCPY_DEFAULT: c_int = 4;

/// `cudaEventDisableTiming`.
pub const CUDA_EVENT_DISABLE_TIMING: c_uint = 0x2;

const RUNTIME_VERSION: c_int = 12040;
const DRIVER_VERSION: c_int = 12040;

thread_local! {
    static LAST_ERROR: Cell<CudaError> = const { Cell::new(CUDA_SUCCESS) };
}

/// Runs `body` behind the panic guard and records a failure as the thread's last error. A
/// call from inside a host function is refused and counted.
fn api(body: impl FnOnce() -> CudaError) -> CudaError {
    if timing::in_host_function() {
        timing::count_host_function_api_call();
        LAST_ERROR.with(|e| e.set(CUDA_ERROR_NOT_PERMITTED));
        return CUDA_ERROR_NOT_PERMITTED;
    }
    let rc = ffi::guard(CUDA_ERROR_UNKNOWN, body);
    if rc != CUDA_SUCCESS {
        LAST_ERROR.with(|e| e.set(rc));
    }
    rc
}

fn current_device() -> Result<usize, CudaError> {
    device::touch_context();
    device::current_checked().ok_or(if config::get().device_count == 0 {
        CUDA_ERROR_NO_DEVICE
    } else {
        CUDA_ERROR_INVALID_DEVICE
    })
}

/// `cudaErrorDevicesUnavailable` when `device` is lost (`CHD_FAKE_CONTROL_FILE`).
fn check_lost(device: usize) -> Result<(), CudaError> {
    if config::get().lost_now(device) {
        Err(CUDA_ERROR_DEVICES_UNAVAILABLE)
    } else {
        Ok(())
    }
}

fn code(r: Result<(), CudaError>) -> CudaError {
    r.err().unwrap_or(CUDA_SUCCESS)
}

fn timing_code(e: TimingError) -> CudaError {
    match e {
        TimingError::InvalidHandle | TimingError::NotRecorded | TimingError::TimingDisabled => {
            CUDA_ERROR_INVALID_RESOURCE_HANDLE
        }
    }
}

/// `cudaGetDeviceCount`: `CHD_FAKE_DEVICE_COUNT` (zero devices -> `cudaErrorNoDevice`).
#[no_mangle]
pub unsafe extern "C" fn cudaGetDeviceCount(count: *mut c_int) -> CudaError {
    api(|| {
        let n = config::get().device_count;
        // SAFETY: `count` is null or writable (module contract).
        if !unsafe { ffi::write(count, n as c_int) } {
            return CUDA_ERROR_INVALID_VALUE;
        }
        if n == 0 {
            CUDA_ERROR_NO_DEVICE
        } else {
            CUDA_SUCCESS
        }
    })
}

/// `cudaSetDevice`: sets the calling thread's current device.
#[no_mangle]
pub unsafe extern "C" fn cudaSetDevice(device: c_int) -> CudaError {
    api(|| {
        let Some(d) = device::valid(i64::from(device)) else {
            return CUDA_ERROR_INVALID_DEVICE;
        };
        // CUDA 12 initialises the device's primary context here, which a lost device fails.
        if let Err(e) = check_lost(d) {
            return e;
        }
        device::set_current(i64::from(device));
        device::open_context(d);
        CUDA_SUCCESS
    })
}

/// `cudaGetDevice`.
#[no_mangle]
pub unsafe extern "C" fn cudaGetDevice(device: *mut c_int) -> CudaError {
    api(|| {
        // SAFETY: module contract.
        if unsafe { ffi::write(device, device::current() as c_int) } {
            CUDA_SUCCESS
        } else {
            CUDA_ERROR_INVALID_VALUE
        }
    })
}

/// `cudaRuntimeGetVersion`: 12040.
#[no_mangle]
pub unsafe extern "C" fn cudaRuntimeGetVersion(version: *mut c_int) -> CudaError {
    // SAFETY: module contract.
    api(|| match unsafe { ffi::write(version, RUNTIME_VERSION) } {
        true => CUDA_SUCCESS,
        false => CUDA_ERROR_INVALID_VALUE,
    })
}

/// `cudaDriverGetVersion`: 12040.
#[no_mangle]
pub unsafe extern "C" fn cudaDriverGetVersion(version: *mut c_int) -> CudaError {
    // SAFETY: module contract.
    api(|| match unsafe { ffi::write(version, DRIVER_VERSION) } {
        true => CUDA_SUCCESS,
        false => CUDA_ERROR_INVALID_VALUE,
    })
}

unsafe fn device_properties(prop: *mut c_void, device: c_int) -> CudaError {
    api(|| {
        if prop.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        if device::valid(i64::from(device)).is_none() {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        // Only `char name[256]` at offset 0 is written; the rest of the caller's (larger)
        // buffer is left alone.
        // SAFETY: the real struct starts with char name[256], so the caller's buffer is at
        // least 256 bytes.
        unsafe { ffi::write_str(prop.cast(), 256, &config::get().device_name, true) };
        CUDA_SUCCESS
    })
}

/// `cudaGetDeviceProperties`: writes only `name` (offset 0, 256 bytes).
#[no_mangle]
pub unsafe extern "C" fn cudaGetDeviceProperties(prop: *mut c_void, device: c_int) -> CudaError {
    // SAFETY: same contract.
    unsafe { device_properties(prop, device) }
}

/// `cudaGetDeviceProperties_v2`: same as [`cudaGetDeviceProperties`].
#[no_mangle]
pub unsafe extern "C" fn cudaGetDeviceProperties_v2(prop: *mut c_void, device: c_int) -> CudaError {
    // SAFETY: same contract.
    unsafe { device_properties(prop, device) }
}

/// `cudaDeviceGetPCIBusId`: `0000:1A:00.0` (uppercase hex), truncated to `len`.
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceGetPCIBusId(
    pci_bus_id: *mut c_char,
    len: c_int,
    device: c_int,
) -> CudaError {
    api(|| {
        let Some(dev) = device::valid(i64::from(device)) else {
            return CUDA_ERROR_INVALID_DEVICE;
        };
        let Ok(len) = usize::try_from(len) else {
            return CUDA_ERROR_INVALID_VALUE;
        };
        let text = config::get().pci_addresses[dev].legacy_upper();
        // SAFETY: `pci_bus_id` is null or valid for `len` bytes (module contract).
        match unsafe { ffi::write_str(pci_bus_id, len, &text, true) } {
            StrWrite::Written => CUDA_SUCCESS,
            StrWrite::Invalid | StrWrite::TooSmall => CUDA_ERROR_INVALID_VALUE,
        }
    })
}

/// `cudaHostAllocPortable` (`cuda_runtime_api.h`).
const CUDA_HOST_ALLOC_PORTABLE: c_uint = 0x01;

/// `portable`: pinned for every device (`cudaHostAllocPortable`); else for the calling
/// thread's current device only, as the CUDA Runtime API documents for `cudaHostAlloc`
/// without the flag and for `cudaMallocHost`.
unsafe fn alloc_pinned(ptr: *mut *mut c_void, size: usize, portable: bool) -> CudaError {
    if ptr.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    device::touch_context();
    let home = (!portable).then(device::current);
    match memory::alloc_pinned(size, Api::Cuda, home) {
        Ok(p) => {
            // SAFETY: checked non-null; writable per the module contract.
            unsafe { ffi::write(ptr, p) };
            CUDA_SUCCESS
        }
        Err(_) => CUDA_ERROR_MEMORY_ALLOCATION,
    }
}

/// `cudaHostAlloc`: page-aligned pinned host memory (flags other than the four defined bits
/// are rejected; of the bits, only `cudaHostAllocPortable` changes anything: without it the
/// memory is pinned for the current device only).
#[no_mangle]
pub unsafe extern "C" fn cudaHostAlloc(
    p_host: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> CudaError {
    api(|| {
        if flags & !0xf != 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: module contract.
        unsafe { alloc_pinned(p_host, size, flags & CUDA_HOST_ALLOC_PORTABLE != 0) }
    })
}

/// `cudaMallocHost`: page-aligned pinned host memory.
#[no_mangle]
pub unsafe extern "C" fn cudaMallocHost(ptr: *mut *mut c_void, size: usize) -> CudaError {
    // SAFETY: module contract.
    api(|| unsafe { alloc_pinned(ptr, size, false) })
}

/// `cudaFreeHost`: NULL is a no-op; anything but a live CUDA pinned allocation is an error.
#[no_mangle]
pub unsafe extern "C" fn cudaFreeHost(ptr: *mut c_void) -> CudaError {
    api(|| {
        if ptr.is_null() {
            return CUDA_SUCCESS;
        }
        if let Err(e) = refuse_in_flight(ptr as usize) {
            return e;
        }
        match memory::free_pinned(ptr as usize, Api::Cuda) {
            Ok(()) => CUDA_SUCCESS,
            Err(_) => CUDA_ERROR_INVALID_VALUE,
        }
    })
}

/// Refuses (and counts) freeing an allocation that work still in flight uses: a copy queued
/// behind a hold, a hung copy, or the word a `cuStreamWaitValue32` waits on. The real
/// `cudaFree`/`cudaFreeHost` synchronize first, which never ends while the work hangs.
fn refuse_in_flight(base: usize) -> Result<(), CudaError> {
    if timing::in_flight_uses(base) {
        memory::count_free_in_flight();
        Err(CUDA_ERROR_UNKNOWN)
    } else {
        Ok(())
    }
}

/// `cudaMalloc`: host memory tagged with the current device; size 0 yields NULL.
#[no_mangle]
pub unsafe extern "C" fn cudaMalloc(dev_ptr: *mut *mut c_void, size: usize) -> CudaError {
    api(|| {
        if dev_ptr.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let dev = match current_device().and_then(|d| check_lost(d).map(|()| d)) {
            Ok(d) => d,
            Err(e) => return e,
        };
        let result = if size == 0 {
            Ok(std::ptr::null_mut())
        } else {
            memory::alloc_device(dev, size, Api::Cuda)
        };
        match result {
            Ok(p) => {
                // SAFETY: checked non-null; writable per the module contract.
                unsafe { ffi::write(dev_ptr, p) };
                CUDA_SUCCESS
            }
            Err(_) => CUDA_ERROR_MEMORY_ALLOCATION,
        }
    })
}

/// `cudaFree`: NULL is a no-op; anything but a live `cudaMalloc` base address is an error.
#[no_mangle]
pub unsafe extern "C" fn cudaFree(dev_ptr: *mut c_void) -> CudaError {
    api(|| {
        if dev_ptr.is_null() {
            return CUDA_SUCCESS;
        }
        if let Err(e) = refuse_in_flight(dev_ptr as usize) {
            return e;
        }
        match memory::free_device(dev_ptr as usize, Api::Cuda) {
            Ok(()) => CUDA_SUCCESS,
            Err(_) => CUDA_ERROR_INVALID_VALUE,
        }
    })
}

unsafe fn stream_create(stream: *mut *mut c_void) -> CudaError {
    if stream.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let dev = match current_device().and_then(|d| check_lost(d).map(|()| d)) {
        Ok(d) => d,
        Err(e) => return e,
    };
    let handle = timing::create_stream(dev, Api::Cuda);
    // SAFETY: checked non-null; writable per the module contract.
    unsafe { ffi::write(stream, handle) };
    CUDA_SUCCESS
}

/// `cudaStreamCreate`: a stream on the current device with its own virtual clock.
#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreate(stream: *mut *mut c_void) -> CudaError {
    // SAFETY: module contract.
    api(|| unsafe { stream_create(stream) })
}

/// `cudaStreamCreateWithFlags`: flags 0 (`cudaStreamDefault`) or 1 (`cudaStreamNonBlocking`).
#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreateWithFlags(
    stream: *mut *mut c_void,
    flags: c_uint,
) -> CudaError {
    api(|| {
        if flags > 1 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: module contract.
        unsafe { stream_create(stream) }
    })
}

/// `cudaStreamDestroy`.
#[no_mangle]
pub unsafe extern "C" fn cudaStreamDestroy(stream: *mut c_void) -> CudaError {
    api(|| match timing::destroy_stream(stream, Api::Cuda) {
        Ok(()) => CUDA_SUCCESS,
        Err(e) => timing_code(e),
    })
}

fn stream_ref(stream: *mut c_void) -> StreamRef {
    StreamRef::from_raw(stream, device::current())
}

fn wait_code(e: WaitError) -> CudaError {
    match e {
        WaitError::Timing(e) => timing_code(e),
        // A latch nobody releases (the real runtime hangs), or a timeout the CUDA calls
        // here never ask for.
        WaitError::WouldHang | WaitError::TimedOut => CUDA_ERROR_UNKNOWN,
    }
}

/// `cudaStreamSynchronize`: waits until the stream's work has run (at once unless something
/// holds it: see `timing`).
#[no_mangle]
pub unsafe extern "C" fn cudaStreamSynchronize(stream: *mut c_void) -> CudaError {
    api(|| {
        let stream = stream_ref(stream);
        match timing::stream_device(stream, Api::Cuda) {
            Ok(d) => {
                if let Err(e) = check_lost(d) {
                    return e;
                }
                code(timing::synchronize_stream(stream, Api::Cuda).map_err(wait_code))
            }
            Err(e) => timing_code(e),
        }
    })
}

/// `cudaStreamQuery`: `cudaSuccess` once the stream's work has run, else `cudaErrorNotReady`.
#[no_mangle]
pub unsafe extern "C" fn cudaStreamQuery(stream: *mut c_void) -> CudaError {
    api(
        || match timing::stream_done(stream_ref(stream), Api::Cuda) {
            Ok(true) => CUDA_SUCCESS,
            Ok(false) => CUDA_ERROR_NOT_READY,
            Err(e) => timing_code(e),
        },
    )
}

unsafe fn memcpy(
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: c_int,
    stream: StreamRef,
) -> CudaError {
    let direction = match kind {
        CUDA_MEMCPY_HOST_TO_HOST => Direction::HostToHost,
        CUDA_MEMCPY_HOST_TO_DEVICE => Direction::HostToDevice,
        CUDA_MEMCPY_DEVICE_TO_HOST => Direction::DeviceToHost,
        CUDA_MEMCPY_DEVICE_TO_DEVICE => Direction::DeviceToDevice,
        CUDA_MEMCPY_DEFAULT => Direction::Infer,
        _ => return CUDA_ERROR_INVALID_MEMCPY_DIRECTION,
    };
    // SAFETY: host ranges are valid per the module contract; device ranges are validated.
    match unsafe { copy::copy(dst, src, count, direction, stream, Api::Cuda) } {
        Ok(()) => CUDA_SUCCESS,
        Err(CopyError::InvalidValue(_)) => CUDA_ERROR_INVALID_VALUE,
        Err(CopyError::InvalidStream) => CUDA_ERROR_INVALID_RESOURCE_HANDLE,
        Err(CopyError::DeviceFailed(_) | CopyError::LinkFailed(..)) => CUDA_ERROR_UNKNOWN,
        Err(CopyError::DeviceLost(_)) => CUDA_ERROR_DEVICES_UNAVAILABLE,
        // CUDA stages such copies through host memory instead; kept for completeness.
        Err(CopyError::PeerAccessNotEnabled(..)) => CUDA_ERROR_PEER_ACCESS_NOT_ENABLED,
        // The real call would never return (counted in `chd_fake_latch_deadlocks`).
        Err(CopyError::WouldDeadlock) => CUDA_ERROR_UNKNOWN,
    }
}

/// `cudaMemcpyAsync`: executes synchronously and advances `stream`'s virtual clock.
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyAsync(
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: c_int,
    stream: *mut c_void,
) -> CudaError {
    // SAFETY: module contract.
    api(|| unsafe { memcpy(dst, src, count, kind, stream_ref(stream)) })
}

/// `cudaMemcpy`: like [`cudaMemcpyAsync`] on the current device's default stream.
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpy(
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: c_int,
) -> CudaError {
    api(|| {
        let stream = StreamRef::Default(device::current());
        // SAFETY: module contract.
        unsafe { memcpy(dst, src, count, kind, stream) }
    })
}

unsafe fn memcpy_peer(
    dst: *mut c_void,
    dst_device: c_int,
    src: *const c_void,
    src_device: c_int,
    count: usize,
    stream: StreamRef,
) -> CudaError {
    let (Some(dd), Some(sd)) = (
        device::valid(i64::from(dst_device)),
        device::valid(i64::from(src_device)),
    ) else {
        return CUDA_ERROR_INVALID_DEVICE;
    };
    if count > 0
        && (memory::locate(dst as usize, count) != memory::Location::Device(dd)
            || memory::locate(src as usize, count) != memory::Location::Device(sd))
    {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: both ranges were just found inside live device allocations.
    unsafe { memcpy(dst, src, count, CUDA_MEMCPY_DEVICE_TO_DEVICE, stream) }
}

/// `cudaMemcpyPeerAsync`: `dst` must lie in a `dstDevice` allocation and `src` in a
/// `srcDevice` one. Across devices it runs at the `CHD_FAKE_PAIR_GBPS` rate when the device
/// issuing it has peer access to the other one, else host-staged at `CHD_FAKE_STAGED_GBPS`.
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyPeerAsync(
    dst: *mut c_void,
    dst_device: c_int,
    src: *const c_void,
    src_device: c_int,
    count: usize,
    stream: *mut c_void,
) -> CudaError {
    api(|| {
        // SAFETY: module contract.
        unsafe { memcpy_peer(dst, dst_device, src, src_device, count, stream_ref(stream)) }
    })
}

/// `cudaMemcpyPeer`: like [`cudaMemcpyPeerAsync`] on the current device's default stream.
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyPeer(
    dst: *mut c_void,
    dst_device: c_int,
    src: *const c_void,
    src_device: c_int,
    count: usize,
) -> CudaError {
    api(|| {
        let stream = StreamRef::Default(device::current());
        // SAFETY: module contract.
        unsafe { memcpy_peer(dst, dst_device, src, src_device, count, stream) }
    })
}

/// `cudaDeviceCanAccessPeer`: 1 for two different valid devices, 0 for a device and itself
/// and for a `CHD_FAKE_NO_PEER` pair.
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceCanAccessPeer(
    can_access_peer: *mut c_int,
    device: c_int,
    peer_device: c_int,
) -> CudaError {
    api(|| {
        let (Some(d), Some(p)) = (
            device::valid(i64::from(device)),
            device::valid(i64::from(peer_device)),
        ) else {
            return CUDA_ERROR_INVALID_DEVICE;
        };
        let can = config::get().peer_supported(d, p);
        // SAFETY: module contract.
        match unsafe { ffi::write(can_access_peer, c_int::from(can)) } {
            true => CUDA_SUCCESS,
            false => CUDA_ERROR_INVALID_VALUE,
        }
    })
}

/// `cudaDeviceEnablePeerAccess`: from the current device to `peerDevice`; flags must be 0;
/// enabling twice is `cudaErrorPeerAccessAlreadyEnabled`; a `CHD_FAKE_NO_PEER` pair is
/// `cudaErrorPeerAccessUnsupported` (217), as real runtimes answer between GPUs without P2P
/// (the API reference names `cudaErrorInvalidDevice` for that case).
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceEnablePeerAccess(
    peer_device: c_int,
    flags: c_uint,
) -> CudaError {
    api(|| {
        let dev = match current_device() {
            Ok(d) => d,
            Err(e) => return e,
        };
        let Some(peer) = device::valid(i64::from(peer_device)).filter(|&p| p != dev) else {
            return CUDA_ERROR_INVALID_DEVICE;
        };
        if flags != 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        if !config::get().peer_supported(dev, peer) {
            return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
        }
        if device::enable_peer(Api::Cuda, dev, peer) {
            CUDA_SUCCESS
        } else {
            CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
        }
    })
}

/// `cudaDeviceDisablePeerAccess`: `cudaErrorPeerAccessNotEnabled` unless enabled.
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceDisablePeerAccess(peer_device: c_int) -> CudaError {
    api(|| {
        let dev = match current_device() {
            Ok(d) => d,
            Err(e) => return e,
        };
        let Some(peer) = device::valid(i64::from(peer_device)).filter(|&p| p != dev) else {
            return CUDA_ERROR_INVALID_DEVICE;
        };
        if device::disable_peer(Api::Cuda, dev, peer) {
            CUDA_SUCCESS
        } else {
            CUDA_ERROR_PEER_ACCESS_NOT_ENABLED
        }
    })
}

unsafe fn event_create(event: *mut *mut c_void, flags: c_uint) -> CudaError {
    if event.is_null() || flags & !0x7 != 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    device::touch_context();
    let handle = timing::create_event(Api::Cuda, flags & CUDA_EVENT_DISABLE_TIMING == 0);
    // SAFETY: checked non-null; writable per the module contract.
    unsafe { ffi::write(event, handle) };
    CUDA_SUCCESS
}

/// `cudaEventCreate`.
#[no_mangle]
pub unsafe extern "C" fn cudaEventCreate(event: *mut *mut c_void) -> CudaError {
    // SAFETY: module contract.
    api(|| unsafe { event_create(event, 0) })
}

/// `cudaEventCreateWithFlags`: `cudaEventDisableTiming` (2) makes elapsed-time queries fail.
#[no_mangle]
pub unsafe extern "C" fn cudaEventCreateWithFlags(
    event: *mut *mut c_void,
    flags: c_uint,
) -> CudaError {
    // SAFETY: module contract.
    api(|| unsafe { event_create(event, flags) })
}

/// `cudaEventRecord`: captures `stream`'s virtual clock.
#[no_mangle]
pub unsafe extern "C" fn cudaEventRecord(event: *mut c_void, stream: *mut c_void) -> CudaError {
    api(|| {
        let stream = stream_ref(stream);
        if let Ok(d) = timing::stream_device(stream, Api::Cuda) {
            if let Err(e) = check_lost(d) {
                return e;
            }
        }
        code(timing::record(event, stream, Api::Cuda).map_err(timing_code))
    })
}

/// `cudaEventSynchronize`: waits until the event completed (at once unless its stream is
/// held: see `timing`).
#[no_mangle]
pub unsafe extern "C" fn cudaEventSynchronize(event: *mut c_void) -> CudaError {
    api(|| {
        if let Err(e) = timing::check_event(event, Api::Cuda) {
            return timing_code(e);
        }
        code(timing::synchronize_event(event, Api::Cuda, None).map_err(wait_code))
    })
}

/// `cudaEventQuery`: `cudaSuccess` once the event completed, else `cudaErrorNotReady`.
#[no_mangle]
pub unsafe extern "C" fn cudaEventQuery(event: *mut c_void) -> CudaError {
    api(|| match timing::event_done(event, Api::Cuda) {
        Ok(true) => CUDA_SUCCESS,
        Ok(false) => CUDA_ERROR_NOT_READY,
        Err(e) => timing_code(e),
    })
}

/// `cudaHostGetDevicePointer`: the device address of CUDA pinned memory, which with unified
/// addressing is its host address; `flags` must be 0.
#[no_mangle]
pub unsafe extern "C" fn cudaHostGetDevicePointer(
    p_device: *mut *mut c_void,
    p_host: *mut c_void,
    flags: c_uint,
) -> CudaError {
    api(|| {
        if flags != 0 || !memory::in_pinned(p_host as usize, 1, Api::Cuda) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: module contract.
        match unsafe { ffi::write(p_device, p_host) } {
            true => CUDA_SUCCESS,
            false => CUDA_ERROR_INVALID_VALUE,
        }
    })
}

/// `cudaLaunchHostFunc`: `fn(userData)` runs on its own thread once the work ahead of it on
/// `stream` has run, and holds the stream until it returns. CUDA calls from inside it are
/// refused with `cudaErrorNotPermitted` and counted (`chd_fake_host_function_api_calls`).
#[no_mangle]
pub unsafe extern "C" fn cudaLaunchHostFunc(
    stream: *mut c_void,
    func: Option<unsafe extern "C" fn(*mut c_void)>,
    user_data: *mut c_void,
) -> CudaError {
    api(|| {
        let Some(func) = func else {
            return CUDA_ERROR_INVALID_VALUE;
        };
        let call = timing::HostCall {
            func,
            data: user_data as usize,
            api: Api::Cuda,
        };
        code(timing::launch_host_function(stream_ref(stream), Api::Cuda, call).map_err(timing_code))
    })
}

/// The driver entry points `cudaGetDriverEntryPoint[ByVersion]` hands out: only
/// `cuStreamWaitValue32` (introduced in CUDA 8.0).
unsafe fn entry_point(
    symbol: *const c_char,
    func_ptr: *mut *mut c_void,
    version: c_uint,
    status: *mut c_int,
) -> CudaError {
    if symbol.is_null() || func_ptr.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: module contract (a NUL-terminated symbol name).
    let name = unsafe { std::ffi::CStr::from_ptr(symbol) };
    let (found, result) = match name.to_bytes() {
        b"cuStreamWaitValue32" if version >= 8000 => (
            cuStreamWaitValue32 as unsafe extern "C" fn(_, _, _, _) -> _ as *mut c_void,
            ENTRY_POINT_SUCCESS,
        ),
        b"cuStreamWaitValue32" => (std::ptr::null_mut(), ENTRY_POINT_VERSION_NOT_SUFFICIENT),
        _ => (std::ptr::null_mut(), ENTRY_POINT_SYMBOL_NOT_FOUND),
    };
    // SAFETY: module contract.
    unsafe {
        ffi::write(func_ptr, found);
        if !status.is_null() {
            ffi::write(status, result);
        }
    }
    CUDA_SUCCESS
}

/// `cudaGetDriverEntryPoint(symbol, funcPtr, flags, driverStatus)` (CUDA 12): as the runtime's
/// own version (12040) asks for it.
#[no_mangle]
pub unsafe extern "C" fn cudaGetDriverEntryPoint(
    symbol: *const c_char,
    func_ptr: *mut *mut c_void,
    _flags: u64,
    status: *mut c_int,
) -> CudaError {
    // SAFETY: module contract.
    api(|| unsafe { entry_point(symbol, func_ptr, RUNTIME_VERSION as c_uint, status) })
}

/// `cudaGetDriverEntryPointByVersion(symbol, funcPtr, cudaVersion, flags, driverStatus)` (CUDA
/// 12.5 and later).
#[no_mangle]
pub unsafe extern "C" fn cudaGetDriverEntryPointByVersion(
    symbol: *const c_char,
    func_ptr: *mut *mut c_void,
    version: c_uint,
    _flags: u64,
    status: *mut c_int,
) -> CudaError {
    // SAFETY: module contract.
    api(|| unsafe { entry_point(symbol, func_ptr, version, status) })
}

/// `CUresult cuStreamWaitValue32(CUstream, CUdeviceptr addr, cuuint32_t value, unsigned int
/// flags)` (`cuda.h`, the `_v2` ABI): work enqueued after it on the stream waits until the
/// word at `addr` satisfies the condition. `addr` must be 4-byte aligned device-accessible
/// memory: CUDA pinned memory (with unified addressing its device address is its host
/// address) or device memory; `CHD_FAKE_STREAM_WAIT_VALUE=0` answers
/// `CUDA_ERROR_NOT_SUPPORTED`. Not exported: chd reaches it only through the runtime, as a
/// real driver function.
pub unsafe extern "C" fn cuStreamWaitValue32(
    stream: *mut c_void,
    addr: u64,
    value: u32,
    flags: c_uint,
) -> c_int {
    if timing::in_host_function() {
        timing::count_host_function_api_call();
        return CU_ERROR_NOT_PERMITTED;
    }
    ffi::guard(CUDA_ERROR_UNKNOWN, || {
        if !config::get().stream_wait_value {
            return CU_ERROR_NOT_SUPPORTED;
        }
        let addr = addr as usize;
        let accessible = memory::in_pinned(addr, 4, Api::Cuda)
            || matches!(memory::locate(addr, 4), memory::Location::Device(_));
        if flags > CU_STREAM_WAIT_VALUE_AND || addr % 4 != 0 || !accessible {
            return CU_ERROR_INVALID_VALUE;
        }
        let hold = timing::Hold::WaitValue { addr, value, flags };
        match timing::hold(stream_ref(stream), Api::Cuda, hold) {
            Ok(()) => CU_SUCCESS,
            Err(_) => CU_ERROR_INVALID_HANDLE,
        }
    })
}

/// `cudaEventElapsedTime`: milliseconds between the clocks `start` and `end` captured.
#[no_mangle]
pub unsafe extern "C" fn cudaEventElapsedTime(
    ms: *mut f32,
    start: *mut c_void,
    end: *mut c_void,
) -> CudaError {
    api(|| {
        if ms.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        match timing::elapsed_ms(start, end, Api::Cuda) {
            Ok(v) => {
                // SAFETY: checked non-null; writable per the module contract.
                unsafe { ffi::write(ms, v) };
                CUDA_SUCCESS
            }
            Err(e) => timing_code(e),
        }
    })
}

/// `cudaEventDestroy`.
#[no_mangle]
pub unsafe extern "C" fn cudaEventDestroy(event: *mut c_void) -> CudaError {
    api(|| code(timing::destroy_event(event, Api::Cuda).map_err(timing_code)))
}

/// `cudaDeviceSynchronize`: nothing is ever pending.
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceSynchronize() -> CudaError {
    api(|| code(current_device().map(|_| ())))
}

/// `cudaGetLastError`: the calling thread's last error, which is then reset to success.
#[no_mangle]
pub unsafe extern "C" fn cudaGetLastError() -> CudaError {
    LAST_ERROR.with(|e| e.replace(CUDA_SUCCESS))
}

/// `cudaPeekAtLastError`: the calling thread's last error, not reset.
#[no_mangle]
pub unsafe extern "C" fn cudaPeekAtLastError() -> CudaError {
    LAST_ERROR.with(Cell::get)
}

/// `cudaGetErrorString`: static description, as the real runtime words it.
#[no_mangle]
pub unsafe extern "C" fn cudaGetErrorString(err: CudaError) -> *const c_char {
    match err {
        CUDA_SUCCESS => c"no error",
        CUDA_ERROR_INVALID_VALUE => c"invalid argument",
        CUDA_ERROR_MEMORY_ALLOCATION => c"out of memory",
        CUDA_ERROR_INVALID_MEMCPY_DIRECTION => c"invalid copy direction for memcpy",
        CUDA_ERROR_DEVICES_UNAVAILABLE => c"CUDA-capable device(s) is/are busy or unavailable",
        CUDA_ERROR_NO_DEVICE => c"no CUDA-capable device is detected",
        CUDA_ERROR_INVALID_DEVICE => c"invalid device ordinal",
        CUDA_ERROR_PEER_ACCESS_UNSUPPORTED => {
            c"peer access is not supported between these two devices"
        }
        CUDA_ERROR_INVALID_RESOURCE_HANDLE => c"invalid resource handle",
        CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => c"peer access is already enabled",
        CUDA_ERROR_PEER_ACCESS_NOT_ENABLED => c"peer access has not been enabled",
        CUDA_ERROR_NOT_READY => c"device not ready",
        CUDA_ERROR_NOT_PERMITTED => c"operation not permitted",
        CUDA_ERROR_UNKNOWN => c"unknown error",
        _ => c"unrecognized error code",
    }
    .as_ptr()
}

/// `cudaGetErrorName`: static enum name.
#[no_mangle]
pub unsafe extern "C" fn cudaGetErrorName(err: CudaError) -> *const c_char {
    match err {
        CUDA_SUCCESS => c"cudaSuccess",
        CUDA_ERROR_INVALID_VALUE => c"cudaErrorInvalidValue",
        CUDA_ERROR_MEMORY_ALLOCATION => c"cudaErrorMemoryAllocation",
        CUDA_ERROR_INVALID_MEMCPY_DIRECTION => c"cudaErrorInvalidMemcpyDirection",
        CUDA_ERROR_DEVICES_UNAVAILABLE => c"cudaErrorDevicesUnavailable",
        CUDA_ERROR_NO_DEVICE => c"cudaErrorNoDevice",
        CUDA_ERROR_INVALID_DEVICE => c"cudaErrorInvalidDevice",
        CUDA_ERROR_PEER_ACCESS_UNSUPPORTED => c"cudaErrorPeerAccessUnsupported",
        CUDA_ERROR_INVALID_RESOURCE_HANDLE => c"cudaErrorInvalidResourceHandle",
        CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => c"cudaErrorPeerAccessAlreadyEnabled",
        CUDA_ERROR_PEER_ACCESS_NOT_ENABLED => c"cudaErrorPeerAccessNotEnabled",
        CUDA_ERROR_NOT_READY => c"cudaErrorNotReady",
        CUDA_ERROR_NOT_PERMITTED => c"cudaErrorNotPermitted",
        CUDA_ERROR_UNKNOWN => c"cudaErrorUnknown",
        _ => c"unrecognized error code",
    }
    .as_ptr()
}
