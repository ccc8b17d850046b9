//! The exported Ascend ACL subset (`libascendcl.so` role): init/finalize, devices, host and
//! device memory, streams, copies, events, memory info, utilization (busy-device model) and
//! the per-thread recent error message. Error codes are the real CANN values (see README).
//! Asynchronous copies need `aclrtMallocHost` memory on the host side and stay pending on
//! their stream until synchronized ([`crate::pending`]): destroying the stream or freeing
//! their buffers before that is refused.
//!
//! Safety contract shared by every function here: pointer arguments must be null or valid
//! for the access the real ACL documents (out-pointers writable, host ranges of a copy
//! readable/writable for `count` bytes). Null out-pointers are rejected with
//! `ACL_ERROR_INVALID_PARAM`; device pointers, streams and events are validated against the
//! registries. No panic crosses the boundary (it becomes `ACL_ERROR_RT_INTERNAL_ERROR`).

#![allow(non_snake_case, non_camel_case_types)]
#![allow(
    clippy::missing_safety_doc,
    reason = "the module documentation states the contract shared by all these C entry points"
)]

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::config;
use crate::copy::{self, CopyError, Direction};
use crate::device;
use crate::ffi;
use crate::memory::Location;
use crate::memory::{self, Api};
use crate::nvml::BUSY_BYTES;
use crate::pending;
use crate::timing::{self, StreamRef, TimingError};

/// `aclError`.
pub type AclError = c_int;

pub const ACL_SUCCESS: AclError = 0;
pub const ACL_ERROR_INVALID_PARAM: AclError = 100_000;
pub const ACL_ERROR_REPEAT_INITIALIZE: AclError = 100_002;
pub const ACL_ERROR_REPEAT_FINALIZE: AclError = 100_037;
pub const ACL_ERROR_RT_INVALID_DEVICEID: AclError = 107_001;
pub const ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID: AclError = 107_006;
pub const ACL_ERROR_RT_INVALID_HANDLE: AclError = 107_017;
/// `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (`rt_error_codes.h`): the fake's answer to a peer copy
/// or peer-access request the devices cannot do (CANN documents the precondition, not the
/// code).
pub const ACL_ERROR_RT_FEATURE_NOT_SUPPORT: AclError = 207_000;
pub const ACL_ERROR_RT_MEMORY_ALLOCATION: AclError = 207_001;
pub const ACL_ERROR_RT_INTERNAL_ERROR: AclError = 507_000;
pub const ACL_ERROR_RT_STREAM_NOT_COMPLETE: AclError = 507_004;
/// `ACL_ERROR_RT_LOST_HEARTBEAT` ("ts lost heartbeat", `rt_error_codes.h`): what every call
/// that works on a lost device returns (CANN's runtime answers it for a device whose task
/// scheduler stopped responding).
pub const ACL_ERROR_RT_LOST_HEARTBEAT: AclError = 507_010;
pub const ACL_ERROR_RT_SYS_DMA: AclError = 507_013;
/// `ACL_ERROR_RT_EVENT_SYNC_TIMEOUT` (`rt_error_codes.h`, "event sync time out"): what
/// `aclrtSynchronizeEventWithTimeout` returns when the event is not done in time.
pub const ACL_ERROR_RT_EVENT_SYNC_TIMEOUT: AclError = 507_047;
/// `aclrtEventRecordedStatus`: `ACL_EVENT_RECORDED_STATUS_NOT_READY`, `_COMPLETE`.
pub const ACL_EVENT_RECORDED_STATUS_NOT_READY: c_int = 0;
pub const ACL_EVENT_RECORDED_STATUS_COMPLETE: c_int = 1;

/// Alignment `aclrtMemcpyAsync` wants of its addresses (and `aclrtMallocHost` guarantees).
pub const ACL_COPY_ALIGN: usize = 64;
/// Shortest buffer `aclrtDeviceGetPCIBusId` accepts (`dddd:bb:dd.f` and the NUL).
pub const ACL_PCI_BUS_ID_MIN_LEN: i32 = 13;

/// `aclrtMemcpyKind` values.
pub const ACL_MEMCPY_HOST_TO_HOST: c_int = 0;
pub const ACL_MEMCPY_HOST_TO_DEVICE: c_int = 1;
pub const ACL_MEMCPY_DEVICE_TO_HOST: c_int = 2;
pub const ACL_MEMCPY_DEVICE_TO_DEVICE: c_int = 3;
pub const ACL_MEMCPY_DEFAULT: c_int = 4;

/// `aclrtMemAttr` values that describe HBM (`ACL_HBM_MEM`, `_HUGE`, `_NORMAL`, `_P2P_HUGE`,
/// `_P2P_NORMAL`); the DDR ones (0, 2, 3, 6, 7) report 0 bytes.
pub const ACL_HBM_ATTRS: [c_int; 5] = [1, 4, 5, 8, 9];
/// Largest `aclrtMemAttr` value accepted.
pub const ACL_MEM_ATTR_MAX: c_int = 9;

/// `aclrtUtilizationInfo`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct aclrtUtilizationInfo {
    pub cubeUtilization: i32,
    pub vectorUtilization: i32,
    pub aicpuUtilization: i32,
    pub memoryUtilization: i32,
    /// Reserved; must be NULL.
    pub utilizationExtend: *mut c_void,
}

const _: () = assert!(std::mem::size_of::<aclrtUtilizationInfo>() == 24);

static INITIALIZED: AtomicBool = AtomicBool::new(false);

thread_local! {
    static RECENT_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Result of an ACL body: `Err((code, message))` sets the thread's recent error message.
type AclResult = Result<(), (AclError, String)>;

fn api(name: &str, body: impl FnOnce() -> AclResult) -> AclError {
    let mut failure: Option<(AclError, String)> = None;
    // CANN's aclrtLaunchHostFunc: the callback must not call resource, synchronization or task
    // interfaces ("may cause errors or deadlock"); the fake refuses every ACL call there.
    let body = || {
        if timing::in_host_function() {
            timing::count_host_function_api_call();
            return Err((
                ACL_ERROR_RT_INTERNAL_ERROR,
                "called from inside an aclrtLaunchHostFunc callback".to_owned(),
            ));
        }
        body()
    };
    let rc = ffi::guard(ACL_ERROR_RT_INTERNAL_ERROR, || match body() {
        Ok(()) => ACL_SUCCESS,
        Err((rc, msg)) => {
            failure = Some((rc, msg));
            rc
        }
    });
    if rc != ACL_SUCCESS {
        let msg = failure.map_or_else(|| "internal error".to_owned(), |(_, m)| m);
        let text = format!("EE9999: [fake] {name} failed with {rc}: {msg}").replace('\0', " ");
        let text = CString::new(text).unwrap_or_default();
        RECENT_ERROR.with(|e| *e.borrow_mut() = text);
    }
    rc
}

fn invalid(msg: impl Into<String>) -> (AclError, String) {
    (ACL_ERROR_INVALID_PARAM, msg.into())
}

fn device_id(device_id: i32) -> Result<usize, (AclError, String)> {
    device::valid(i64::from(device_id)).ok_or_else(|| {
        (
            ACL_ERROR_RT_INVALID_DEVICEID,
            format!(
                "device id {device_id} is out of range (device count {})",
                config::get().device_count
            ),
        )
    })
}

/// `ACL_ERROR_RT_LOST_HEARTBEAT` when `device` is lost (`CHD_FAKE_CONTROL_FILE`).
fn check_lost(device: usize) -> Result<usize, (AclError, String)> {
    if config::get().lost_now(device) {
        Err((
            ACL_ERROR_RT_LOST_HEARTBEAT,
            format!("device {device} is lost (CHD_FAKE_CONTROL_FILE)"),
        ))
    } else {
        Ok(device)
    }
}

fn current_device() -> Result<usize, (AclError, String)> {
    device::current_checked().ok_or_else(|| {
        (
            ACL_ERROR_RT_INVALID_DEVICEID,
            "no device is available".to_owned(),
        )
    })
}

fn timing_err(e: TimingError) -> (AclError, String) {
    match e {
        TimingError::InvalidHandle => (
            ACL_ERROR_RT_INVALID_HANDLE,
            "unknown or destroyed stream/event handle".to_owned(),
        ),
        TimingError::NotRecorded | TimingError::TimingDisabled => (
            ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID,
            "event has not been recorded".to_owned(),
        ),
    }
}

/// # Safety
/// `out` must be null or writable.
unsafe fn put<T>(out: *mut T, value: T, what: &str) -> AclResult {
    // SAFETY: forwarded contract.
    if unsafe { ffi::write(out, value) } {
        Ok(())
    } else {
        Err(invalid(format!("{what} is NULL")))
    }
}

/// `aclInit`: `config_path` may be NULL and is not read. A second call without
/// `aclFinalize` returns `ACL_ERROR_REPEAT_INITIALIZE`.
#[no_mangle]
pub unsafe extern "C" fn aclInit(_config_path: *const c_char) -> AclError {
    api("aclInit", || {
        if INITIALIZED.swap(true, Ordering::SeqCst) {
            Err((
                ACL_ERROR_REPEAT_INITIALIZE,
                "aclInit was already called".to_owned(),
            ))
        } else {
            Ok(())
        }
    })
}

/// `aclFinalize`: `ACL_ERROR_REPEAT_FINALIZE` without a preceding `aclInit`.
#[no_mangle]
pub unsafe extern "C" fn aclFinalize() -> AclError {
    api("aclFinalize", || {
        if INITIALIZED.swap(false, Ordering::SeqCst) {
            Ok(())
        } else {
            Err((
                ACL_ERROR_REPEAT_FINALIZE,
                "aclFinalize without aclInit".to_owned(),
            ))
        }
    })
}

/// `aclFinalizeReference`: drops one `aclInit` reference. The fake's `aclInit` does not count
/// (a second one is `ACL_ERROR_REPEAT_INITIALIZE`), so this finalizes like `aclFinalize` and
/// writes the references left (0) to `refCount` when it is not NULL.
#[no_mangle]
pub unsafe extern "C" fn aclFinalizeReference(ref_count: *mut u64) -> AclError {
    api("aclFinalizeReference", || {
        if !INITIALIZED.swap(false, Ordering::SeqCst) {
            return Err((
                ACL_ERROR_REPEAT_FINALIZE,
                "aclFinalizeReference without aclInit".to_owned(),
            ));
        }
        if !ref_count.is_null() {
            // SAFETY: module contract (non-null out-pointer).
            unsafe { put(ref_count, 0, "refCount")? };
        }
        Ok(())
    })
}

/// `aclrtGetDeviceCount`.
#[no_mangle]
pub unsafe extern "C" fn aclrtGetDeviceCount(count: *mut u32) -> AclError {
    api("aclrtGetDeviceCount", || {
        // SAFETY: module contract.
        unsafe { put(count, config::get().device_count as u32, "count") }
    })
}

/// `aclrtSetDevice`: sets the calling thread's current device (shared with `cudaSetDevice`).
#[no_mangle]
pub unsafe extern "C" fn aclrtSetDevice(device: i32) -> AclError {
    api("aclrtSetDevice", || {
        check_lost(device_id(device)?)?;
        device::set_current(i64::from(device));
        Ok(())
    })
}

/// `aclrtResetDevice`: validates the id; allocations and streams are left alone.
#[no_mangle]
pub unsafe extern "C" fn aclrtResetDevice(device: i32) -> AclError {
    api("aclrtResetDevice", || device_id(device).map(|_| ()))
}

/// `aclrtGetDevice`: the calling thread's current device (0 until set).
#[no_mangle]
pub unsafe extern "C" fn aclrtGetDevice(device: *mut i32) -> AclError {
    api("aclrtGetDevice", || {
        // SAFETY: module contract.
        unsafe { put(device, device::current() as i32, "deviceId") }
    })
}

/// `aclrtMallocHost`: page-aligned pinned host memory; size 0 is invalid.
#[no_mangle]
pub unsafe extern "C" fn aclrtMallocHost(host_ptr: *mut *mut c_void, size: usize) -> AclError {
    api("aclrtMallocHost", || {
        if host_ptr.is_null() {
            return Err(invalid("hostPtr is NULL"));
        }
        if size == 0 {
            return Err(invalid("size is 0"));
        }
        let p = memory::alloc_pinned(size, Api::Acl, None).map_err(|_| {
            (
                ACL_ERROR_RT_MEMORY_ALLOCATION,
                format!("cannot allocate {size} bytes of host memory"),
            )
        })?;
        // SAFETY: module contract.
        unsafe { put(host_ptr, p, "hostPtr") }
    })
}

/// Refuses to free the allocation at `base` while an unsynchronized copy uses it: CANN's
/// `aclrtFree`/`aclrtFreeHost` free at once, with no implicit synchronization.
fn refuse_in_use(base: usize, call: &str) -> AclResult {
    if timing::in_flight_uses(base) {
        memory::count_free_in_flight();
        return Err((
            ACL_ERROR_RT_STREAM_NOT_COMPLETE,
            format!("{base:#x} is used by work in flight (a hung copy): {call} would free it under the device"),
        ));
    }
    if pending::in_use(base) {
        pending::refuse();
        return Err((
            ACL_ERROR_RT_STREAM_NOT_COMPLETE,
            format!(
                "{base:#x} is used by an aclrtMemcpyAsync that was not synchronized: \
                 synchronize its stream before {call}"
            ),
        ));
    }
    Ok(())
}

/// `aclrtFreeHost`: only live `aclrtMallocHost` pointers, not used by unsynchronized copies.
#[no_mangle]
pub unsafe extern "C" fn aclrtFreeHost(host_ptr: *mut c_void) -> AclError {
    api("aclrtFreeHost", || {
        if host_ptr.is_null() {
            return Err(invalid("hostPtr is NULL"));
        }
        refuse_in_use(host_ptr as usize, "aclrtFreeHost")?;
        memory::free_pinned(host_ptr as usize, Api::Acl).map_err(|_| {
            (
                ACL_ERROR_RT_INVALID_HANDLE,
                format!("{host_ptr:p} is not a live aclrtMallocHost allocation"),
            )
        })
    })
}

/// `aclrtMalloc`: host memory tagged with the current device; `policy` is accepted as is;
/// size 0 is invalid.
#[no_mangle]
pub unsafe extern "C" fn aclrtMalloc(
    dev_ptr: *mut *mut c_void,
    size: usize,
    _policy: c_int,
) -> AclError {
    api("aclrtMalloc", || {
        if dev_ptr.is_null() {
            return Err(invalid("devPtr is NULL"));
        }
        if size == 0 {
            return Err(invalid("size is 0"));
        }
        let dev = check_lost(current_device()?)?;
        let p = memory::alloc_device(dev, size, Api::Acl).map_err(|_| {
            (
                ACL_ERROR_RT_MEMORY_ALLOCATION,
                format!("cannot allocate {size} bytes on device {dev}"),
            )
        })?;
        // SAFETY: module contract.
        unsafe { put(dev_ptr, p, "devPtr") }
    })
}

/// `aclrtFree`: only live `aclrtMalloc` base addresses, not used by unsynchronized copies.
#[no_mangle]
pub unsafe extern "C" fn aclrtFree(dev_ptr: *mut c_void) -> AclError {
    api("aclrtFree", || {
        if dev_ptr.is_null() {
            return Err(invalid("devPtr is NULL"));
        }
        refuse_in_use(dev_ptr as usize, "aclrtFree")?;
        memory::free_device(dev_ptr as usize, Api::Acl).map_err(|_| {
            (
                ACL_ERROR_RT_INVALID_HANDLE,
                format!("{dev_ptr:p} is not a live aclrtMalloc allocation"),
            )
        })
    })
}

/// `aclrtCreateStream`: a stream on the current device with its own virtual clock.
#[no_mangle]
pub unsafe extern "C" fn aclrtCreateStream(stream: *mut *mut c_void) -> AclError {
    api("aclrtCreateStream", || {
        if stream.is_null() {
            return Err(invalid("stream is NULL"));
        }
        let dev = check_lost(current_device()?)?;
        let handle = timing::create_stream(dev, Api::Acl);
        // SAFETY: module contract.
        unsafe { put(stream, handle, "stream") }
    })
}

/// `aclrtDestroyStream`: refused (and counted) while copies enqueued on the stream are not
/// synchronized, as CANN requires `aclrtSynchronizeStream` first; the stream stays usable.
#[no_mangle]
pub unsafe extern "C" fn aclrtDestroyStream(stream: *mut c_void) -> AclError {
    api("aclrtDestroyStream", || {
        if stream.is_null() {
            return Err(invalid("stream is NULL"));
        }
        let handle = StreamRef::Handle(stream as usize);
        timing::stream_device(handle, Api::Acl).map_err(timing_err)?;
        let pending = pending::pending_on(handle);
        if pending > 0 {
            pending::refuse();
            return Err((
                ACL_ERROR_RT_STREAM_NOT_COMPLETE,
                format!(
                    "stream {stream:p} has {pending} unsynchronized task(s): \
                     call aclrtSynchronizeStream before aclrtDestroyStream"
                ),
            ));
        }
        timing::destroy_stream(stream, Api::Acl).map_err(timing_err)
    })
}

fn stream_ref(stream: *mut c_void) -> StreamRef {
    // Only NULL means the default stream in ACL; 1 and 2 are CUDA conventions.
    if stream.is_null() {
        StreamRef::Default(device::current())
    } else {
        StreamRef::Handle(stream as usize)
    }
}

/// `aclrtSynchronizeStream`: copies are synchronous, so this validates the handle and marks
/// the stream's pending work done.
#[no_mangle]
pub unsafe extern "C" fn aclrtSynchronizeStream(stream: *mut c_void) -> AclError {
    api("aclrtSynchronizeStream", || {
        let stream = stream_ref(stream);
        timing::stream_device(stream, Api::Acl).map_err(timing_err)?;
        timing::synchronize_stream(stream, Api::Acl).map_err(wait_err)?;
        pending::synchronize_stream(stream);
        Ok(())
    })
}

unsafe fn memcpy(
    dst: *mut c_void,
    dest_max: usize,
    src: *const c_void,
    count: usize,
    kind: c_int,
    stream: StreamRef,
) -> AclResult {
    if count > dest_max {
        return Err(invalid(format!("count {count} exceeds destMax {dest_max}")));
    }
    let direction = match kind {
        ACL_MEMCPY_HOST_TO_HOST => Direction::HostToHost,
        ACL_MEMCPY_HOST_TO_DEVICE => Direction::HostToDevice,
        ACL_MEMCPY_DEVICE_TO_HOST => Direction::DeviceToHost,
        ACL_MEMCPY_DEVICE_TO_DEVICE => Direction::DeviceToDevice,
        ACL_MEMCPY_DEFAULT => Direction::Infer,
        _ => return Err(invalid(format!("unknown memcpy kind {kind}"))),
    };
    // SAFETY: host ranges are valid per the module contract; device ranges are validated.
    match unsafe { copy::copy(dst, src, count, direction, stream, Api::Acl) } {
        Ok(()) => Ok(()),
        Err(CopyError::InvalidValue(why)) => Err(invalid(why)),
        Err(CopyError::InvalidStream) => Err(timing_err(TimingError::InvalidHandle)),
        Err(CopyError::DeviceLost(dev)) => Err(check_lost(dev)
            .err()
            .unwrap_or((ACL_ERROR_RT_LOST_HEARTBEAT, format!("device {dev} is lost")))),
        Err(CopyError::DeviceFailed(dev)) => Err((
            ACL_ERROR_RT_SYS_DMA,
            format!("DMA copy on device {dev} failed (CHD_FAKE_FAIL_DEVICES)"),
        )),
        Err(CopyError::LinkFailed(src, dst)) => Err((
            ACL_ERROR_RT_SYS_DMA,
            format!("peer copy from device {src} to device {dst} failed (CHD_FAKE_PAIR_FAIL)"),
        )),
        Err(CopyError::WouldDeadlock) => Err((
            ACL_ERROR_RT_INTERNAL_ERROR,
            "a copy that would never return".to_owned(),
        )),
        Err(CopyError::PeerAccessNotEnabled(local, remote)) => Err((
            ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
            format!(
                "copy between device {local} and device {remote}: peer access from device \
                 {local} to device {remote} is not enabled (aclrtDeviceEnablePeerAccess)"
            ),
        )),
    }
}

/// The host side of an asynchronous copy must be page-locked memory from `aclrtMallocHost`,
/// 64-byte aligned: with pageable memory the copy "does not report an error, but an
/// unpredictable error may occur when the task is executed" (`aclrtMemcpyAsync` in the CANN
/// 7.0.0, 8.0.RC3 and 8.0.0 guides). Host-to-host kinds are left alone.
fn check_async_host_side(dst: usize, src: usize, count: usize, kind: c_int) -> AclResult {
    if count == 0 || kind == ACL_MEMCPY_HOST_TO_HOST {
        return Ok(());
    }
    for (addr, what) in [(dst, "destination"), (src, "source")] {
        if addr == 0 || memory::locate(addr, count) != Location::Host {
            continue;
        }
        if !memory::in_pinned(addr, count, Api::Acl) {
            return Err(invalid(format!(
                "the {what} {addr:#x} (+{count} bytes) is host memory outside every live \
                 aclrtMallocHost allocation: aclrtMemcpyAsync needs page-locked host memory"
            )));
        }
        if addr % ACL_COPY_ALIGN != 0 {
            return Err(invalid(format!(
                "the {what} {addr:#x} is not {ACL_COPY_ALIGN}-byte aligned"
            )));
        }
    }
    Ok(())
}

/// `aclrtMemcpyAsync`: executes synchronously and advances `stream`'s virtual clock. The host
/// side must lie in a live `aclrtMallocHost` allocation, 64-byte aligned; the copy stays
/// pending on `stream` (with the allocations it uses) until the stream, or an event recorded
/// after it, is synchronized.
#[no_mangle]
pub unsafe extern "C" fn aclrtMemcpyAsync(
    dst: *mut c_void,
    dest_max: usize,
    src: *const c_void,
    count: usize,
    kind: c_int,
    stream: *mut c_void,
) -> AclError {
    api("aclrtMemcpyAsync", || {
        let stream = stream_ref(stream);
        check_async_host_side(dst as usize, src as usize, count, kind)?;
        // SAFETY: module contract.
        unsafe { memcpy(dst, dest_max, src, count, kind, stream) }?;
        if count > 0 {
            let buffers = [dst as usize, src as usize]
                .into_iter()
                .filter_map(memory::base_of)
                .collect();
            pending::enqueue(stream, buffers);
        }
        Ok(())
    })
}

/// `aclrtMemcpy`: like [`aclrtMemcpyAsync`] on the current device's default stream.
#[no_mangle]
pub unsafe extern "C" fn aclrtMemcpy(
    dst: *mut c_void,
    dest_max: usize,
    src: *const c_void,
    count: usize,
    kind: c_int,
) -> AclError {
    api("aclrtMemcpy", || {
        let stream = StreamRef::Default(device::current());
        // SAFETY: module contract.
        unsafe { memcpy(dst, dest_max, src, count, kind, stream) }
    })
}

/// `aclrtDeviceCanAccessPeer`: 1 for two different valid devices, 0 for a device and itself
/// and for a `CHD_FAKE_NO_PEER` pair.
#[no_mangle]
pub unsafe extern "C" fn aclrtDeviceCanAccessPeer(
    can_access_peer: *mut i32,
    device_id_arg: i32,
    peer_device_id: i32,
) -> AclError {
    api("aclrtDeviceCanAccessPeer", || {
        let d = device_id(device_id_arg)?;
        let p = device_id(peer_device_id)?;
        let can = config::get().peer_supported(d, p);
        // SAFETY: module contract.
        unsafe { put(can_access_peer, i32::from(can), "canAccessPeer") }
    })
}

/// `aclrtDeviceEnablePeerAccess`: from the current device to `peerDeviceId`; `flags` must be
/// 0; enabling twice is accepted; a `CHD_FAKE_NO_PEER` pair is
/// `ACL_ERROR_RT_FEATURE_NOT_SUPPORT`.
#[no_mangle]
pub unsafe extern "C" fn aclrtDeviceEnablePeerAccess(peer_device_id: i32, flags: u32) -> AclError {
    api("aclrtDeviceEnablePeerAccess", || {
        let dev = current_device()?;
        let peer = device_id(peer_device_id)?;
        if peer == dev {
            return Err(invalid(format!(
                "device {dev} cannot enable peer access to itself"
            )));
        }
        if flags != 0 {
            return Err(invalid(format!("flags must be 0, got {flags}")));
        }
        if !config::get().peer_supported(dev, peer) {
            return Err((
                ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                format!("device {dev} cannot access device {peer} (CHD_FAKE_NO_PEER)"),
            ));
        }
        device::enable_peer(Api::Acl, dev, peer);
        Ok(())
    })
}

/// `aclrtDeviceDisablePeerAccess`: from the current device to `peerDeviceId`; disabling
/// access that was never enabled is an invalid parameter.
#[no_mangle]
pub unsafe extern "C" fn aclrtDeviceDisablePeerAccess(peer_device_id: i32) -> AclError {
    api("aclrtDeviceDisablePeerAccess", || {
        let dev = current_device()?;
        let peer = device_id(peer_device_id)?;
        if device::disable_peer(Api::Acl, dev, peer) {
            Ok(())
        } else {
            Err(invalid(format!(
                "peer access from device {dev} to device {peer} is not enabled"
            )))
        }
    })
}

/// `aclrtCreateEvent`.
#[no_mangle]
pub unsafe extern "C" fn aclrtCreateEvent(event: *mut *mut c_void) -> AclError {
    api("aclrtCreateEvent", || {
        if event.is_null() {
            return Err(invalid("event is NULL"));
        }
        let handle = timing::create_event(Api::Acl, true);
        // SAFETY: module contract.
        unsafe { put(event, handle, "event") }
    })
}

/// `aclrtRecordEvent`: captures `stream`'s virtual clock and the work pending on it.
#[no_mangle]
pub unsafe extern "C" fn aclrtRecordEvent(event: *mut c_void, stream: *mut c_void) -> AclError {
    api("aclrtRecordEvent", || {
        let stream = stream_ref(stream);
        timing::record(event, stream, Api::Acl).map_err(timing_err)?;
        pending::record(event as usize, stream);
        Ok(())
    })
}

/// `aclrtSynchronizeEvent`: validates the handle; the work enqueued before the event was
/// recorded is done.
#[no_mangle]
pub unsafe extern "C" fn aclrtSynchronizeEvent(event: *mut c_void) -> AclError {
    api("aclrtSynchronizeEvent", || {
        timing::check_event(event, Api::Acl).map_err(timing_err)?;
        timing::synchronize_event(event, Api::Acl, None).map_err(wait_err)?;
        pending::synchronize_event(event as usize);
        Ok(())
    })
}

/// `aclrtSynchronizeEventWithTimeout(aclrtEvent event, int32_t timeout)`: as
/// [`aclrtSynchronizeEvent`], giving up after `timeout` milliseconds (-1: never) with
/// `ACL_ERROR_RT_EVENT_SYNC_TIMEOUT`.
#[no_mangle]
pub unsafe extern "C" fn aclrtSynchronizeEventWithTimeout(
    event: *mut c_void,
    timeout: i32,
) -> AclError {
    api("aclrtSynchronizeEventWithTimeout", || {
        timing::check_event(event, Api::Acl).map_err(timing_err)?;
        let limit = match timeout {
            -1 => None,
            t if t > 0 => Some(std::time::Duration::from_millis(t as u64)),
            t => return Err(invalid(format!("timeout {t} is neither -1 nor positive"))),
        };
        timing::synchronize_event(event, Api::Acl, limit).map_err(wait_err)?;
        pending::synchronize_event(event as usize);
        Ok(())
    })
}

/// `aclrtQueryEventStatus(aclrtEvent event, aclrtEventRecordedStatus *status)`:
/// `ACL_EVENT_RECORDED_STATUS_COMPLETE` once the work before the event ran, else `_NOT_READY`.
#[no_mangle]
pub unsafe extern "C" fn aclrtQueryEventStatus(event: *mut c_void, status: *mut c_int) -> AclError {
    api("aclrtQueryEventStatus", || {
        let done = timing::event_done(event, Api::Acl).map_err(timing_err)?;
        let value = if done {
            ACL_EVENT_RECORDED_STATUS_COMPLETE
        } else {
            ACL_EVENT_RECORDED_STATUS_NOT_READY
        };
        // SAFETY: module contract.
        unsafe { put(status, value, "status") }
    })
}

/// `aclrtLaunchHostFunc(aclrtStream stream, aclrtHostFunc fn, void *args)` (CANN 8.3 and
/// later): `fn(args)` runs on its own thread once the work ahead of it on `stream` ran, and
/// holds the stream until it returns ("the callback task blocks later tasks of this stream by
/// default"). ACL calls from inside it are refused and counted
/// (`chd_fake_host_function_api_calls`); `CHD_FAKE_ACL_HOST_FUNC=0` answers
/// `ACL_ERROR_RT_FEATURE_NOT_SUPPORT`.
#[no_mangle]
pub unsafe extern "C" fn aclrtLaunchHostFunc(
    stream: *mut c_void,
    func: Option<unsafe extern "C" fn(*mut c_void)>,
    args: *mut c_void,
) -> AclError {
    api("aclrtLaunchHostFunc", || {
        if !config::get().acl_host_func {
            return Err((
                ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                "aclrtLaunchHostFunc is not supported (CHD_FAKE_ACL_HOST_FUNC=0)".to_owned(),
            ));
        }
        let func = func.ok_or_else(|| invalid("fn is NULL"))?;
        let call = timing::HostCall {
            func,
            data: args as usize,
            api: Api::Acl,
        };
        timing::launch_host_function(stream_ref(stream), Api::Acl, call).map_err(timing_err)
    })
}

fn wait_err(e: timing::WaitError) -> (AclError, String) {
    match e {
        timing::WaitError::Timing(e) => timing_err(e),
        timing::WaitError::TimedOut => (
            ACL_ERROR_RT_EVENT_SYNC_TIMEOUT,
            "the event did not complete within the timeout".to_owned(),
        ),
        timing::WaitError::WouldHang => (
            ACL_ERROR_RT_INTERNAL_ERROR,
            format!(
                "a host function holds the stream and never returns: the real runtime would \
                 wait forever (the fake gave up after {} ms)",
                timing::LATCH_DEADLOCK_MS
            ),
        ),
    }
}

/// `aclrtEventElapsedTime`: milliseconds between the clocks `start` and `end` captured.
#[no_mangle]
pub unsafe extern "C" fn aclrtEventElapsedTime(
    ms: *mut f32,
    start: *mut c_void,
    end: *mut c_void,
) -> AclError {
    api("aclrtEventElapsedTime", || {
        if ms.is_null() {
            return Err(invalid("ms is NULL"));
        }
        let v = timing::elapsed_ms(start, end, Api::Acl).map_err(timing_err)?;
        // SAFETY: module contract.
        unsafe { put(ms, v, "ms") }
    })
}

/// `aclrtDestroyEvent`.
#[no_mangle]
pub unsafe extern "C" fn aclrtDestroyEvent(event: *mut c_void) -> AclError {
    api("aclrtDestroyEvent", || {
        timing::destroy_event(event, Api::Acl).map_err(timing_err)?;
        pending::forget_event(event as usize);
        Ok(())
    })
}

/// `aclrtDeviceGetPCIBusId(int32_t deviceId, char *pciBusId, int32_t len)` (CANN 9.2): the
/// device's `CHD_FAKE_PCI_BUS_IDS` address as `dddd:bb:dd.f`, lower case like the header's
/// example; `len` must be at least 13. `CHD_FAKE_ACL_PCI_BUS_ID=0` makes it answer
/// `ACL_ERROR_RT_FEATURE_NOT_SUPPORT`, as CANN does where the interconnect is not PCIe.
#[no_mangle]
pub unsafe extern "C" fn aclrtDeviceGetPCIBusId(
    device: i32,
    pci_bus_id: *mut c_char,
    len: i32,
) -> AclError {
    api("aclrtDeviceGetPCIBusId", || {
        let dev = device_id(device)?;
        if !config::get().acl_pci_bus_id {
            return Err((
                ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                "PCI bus ids are not supported here (CHD_FAKE_ACL_PCI_BUS_ID=0)".to_owned(),
            ));
        }
        if pci_bus_id.is_null() {
            return Err(invalid("pciBusId is NULL"));
        }
        if len < ACL_PCI_BUS_ID_MIN_LEN {
            return Err(invalid(format!(
                "len {len} is below {ACL_PCI_BUS_ID_MIN_LEN}"
            )));
        }
        let text = config::get().pci_addresses[dev]
            .legacy_upper()
            .to_ascii_lowercase();
        // SAFETY: module contract: `pci_bus_id` is writable for `len` bytes.
        match unsafe { ffi::write_str(pci_bus_id, len as usize, &text, false) } {
            ffi::StrWrite::Written => Ok(()),
            _ => Err(invalid(format!("len {len} cannot hold {text:?}"))),
        }
    })
}

/// `aclrtGetMemInfo`: for the current device; HBM attributes report `CHD_FAKE_MEMORY_BYTES`
/// total and total minus (allocated + 1 GiB if busy) free, DDR attributes report 0/0.
#[no_mangle]
pub unsafe extern "C" fn aclrtGetMemInfo(
    attr: c_int,
    free: *mut usize,
    total: *mut usize,
) -> AclError {
    api("aclrtGetMemInfo", || {
        if free.is_null() || total.is_null() {
            return Err(invalid("free or total is NULL"));
        }
        if !(0..=ACL_MEM_ATTR_MAX).contains(&attr) {
            return Err(invalid(format!("unknown memory attribute {attr}")));
        }
        let dev = current_device()?;
        let (f, t) = if ACL_HBM_ATTRS.contains(&attr) {
            let t = config::get().memory_bytes;
            let busy = config::get().busy_devices_now().contains(&dev);
            let used = (memory::device_bytes(dev) + if busy { BUSY_BYTES } else { 0 }).min(t);
            (t - used, t)
        } else {
            (0, 0)
        };
        // SAFETY: module contract (both checked non-null above).
        unsafe {
            put(free, f as usize, "free")?;
            put(total, t as usize, "total")
        }
    })
}

/// `aclrtGetDeviceUtilizationRate`: 100 in every field on busy devices, else 0;
/// `ACL_ERROR_RT_INTERNAL_ERROR` on a `CHD_FAKE_TELEMETRY_FAIL_DEVICES` device.
/// `utilizationExtend` must be NULL.
#[no_mangle]
pub unsafe extern "C" fn aclrtGetDeviceUtilizationRate(
    device: i32,
    info: *mut aclrtUtilizationInfo,
) -> AclError {
    api("aclrtGetDeviceUtilizationRate", || {
        let dev = device_id(device)?;
        if info.is_null() {
            return Err(invalid("utilizationInfo is NULL"));
        }
        // SAFETY: non-null and readable per the module contract.
        let extend = unsafe { std::ptr::addr_of!((*info).utilizationExtend).read_unaligned() };
        if !extend.is_null() {
            return Err(invalid("utilizationExtend must be NULL"));
        }
        check_lost(dev)?;
        if config::get().telemetry_fails(dev) {
            return Err((
                ACL_ERROR_RT_INTERNAL_ERROR,
                format!(
                    "utilization of device {dev} unavailable (CHD_FAKE_TELEMETRY_FAIL_DEVICES)"
                ),
            ));
        }
        let pct = if config::get().busy_devices_now().contains(&dev) {
            100
        } else {
            0
        };
        let value = aclrtUtilizationInfo {
            cubeUtilization: pct,
            vectorUtilization: pct,
            aicpuUtilization: pct,
            memoryUtilization: pct,
            utilizationExtend: std::ptr::null_mut(),
        };
        // SAFETY: module contract.
        unsafe { put(info, value, "utilizationInfo") }
    })
}

/// `aclGetRecentErrMsg`: the calling thread's last failure message ("" if none). The pointer
/// stays valid until the next failing ACL call on the same thread.
#[no_mangle]
pub unsafe extern "C" fn aclGetRecentErrMsg() -> *const c_char {
    RECENT_ERROR.with(|e| e.borrow().as_ptr())
}
