//! The exported NVML subset (`libnvidia-ml.so.1` role): init/shutdown (reference counted,
//! queries before init fail with `NVML_ERROR_UNINITIALIZED`), device handles, names, PCI
//! info, utilization, memory and running compute processes, including the busy-device model
//! (`CHD_FAKE_BUSY_DEVICES` / `CHD_FAKE_BUSY_FILE`).
//!
//! Safety contract shared by every function here: pointer arguments must be null or valid
//! for the access real NVML documents (out-structs writable, string buffers writable for
//! `length` bytes, `infos` writable for `*info_count` entries). Null out-pointers are
//! rejected with `NVML_ERROR_INVALID_ARGUMENT`; device handles are validated. No panic
//! crosses the boundary (it becomes `NVML_ERROR_UNKNOWN`).

#![allow(non_snake_case, non_camel_case_types)]
#![allow(
    clippy::missing_safety_doc,
    reason = "the module documentation states the contract shared by all these C entry points"
)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::Mutex;

use crate::config::{self, PciAddress};
use crate::device;
use crate::ffi::{self, StrWrite};
use crate::memory;

/// `nvmlReturn_t`.
pub type NvmlReturn = c_int;
/// `nvmlDevice_t`: `(index + 1) as *mut c_void`.
pub type nvmlDevice_t = *mut c_void;

pub const NVML_SUCCESS: NvmlReturn = 0;
pub const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
pub const NVML_ERROR_NOT_SUPPORTED: NvmlReturn = 3;
pub const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
/// `NVML_ERROR_GPU_IS_LOST` (`nvml.h`): "The GPU has fallen off the bus or has otherwise
/// become inaccessible".
pub const NVML_ERROR_GPU_IS_LOST: NvmlReturn = 15;
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: NvmlReturn = 25;
pub const NVML_ERROR_UNKNOWN: NvmlReturn = 999;

/// `nvmlMemory_v2` = `NVML_STRUCT_VERSION(Memory, 2)` = `sizeof(nvmlMemory_v2_t) | 2 << 24`.
pub const NVML_MEMORY_V2: c_uint = std::mem::size_of::<nvmlMemory_v2_t>() as c_uint | (2 << 24);

/// PID reported for the foreign process on a busy device.
pub const BUSY_PID: c_uint = 4242;
/// Memory that foreign process uses.
pub const BUSY_BYTES: u64 = 1 << 30;
/// `pciDeviceId` reported for every device (H200 SXM, NVIDIA vendor id in the low half).
pub const PCI_DEVICE_ID: c_uint = 0x2335_10DE;
/// `pciSubSystemId` reported for every device.
pub const PCI_SUBSYSTEM_ID: c_uint = 0x18BE_10DE;

const DRIVER_VERSION: &str = "550.54.15";

/// `nvmlUtilization_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct nvmlUtilization_t {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct nvmlMemory_t {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlProcessInfo_t` (the v2 layout, used by `nvmlDeviceGetComputeRunningProcesses_v3`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct nvmlProcessInfo_t {
    pub pid: c_uint,
    pub usedGpuMemory: u64,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
}

/// `nvmlPciInfo_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct nvmlPciInfo_t {
    pub busIdLegacy: [c_char; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pciDeviceId: c_uint,
    pub pciSubSystemId: c_uint,
    pub busId: [c_char; 32],
}

const _: () = {
    assert!(std::mem::size_of::<nvmlUtilization_t>() == 8);
    assert!(std::mem::size_of::<nvmlMemory_t>() == 24);
    assert!(std::mem::size_of::<nvmlMemory_v2_t>() == 40);
    assert!(std::mem::size_of::<nvmlProcessInfo_t>() == 24);
    assert!(std::mem::size_of::<nvmlPciInfo_t>() == 68);
};

/// "Not applicable" instance ids (`0xFFFFFFFF`), as NVML reports without MIG.
const NO_INSTANCE: c_uint = c_uint::MAX;

static INIT_COUNT: Mutex<u32> = Mutex::new(0);

fn initialized() -> bool {
    *INIT_COUNT.lock().unwrap_or_else(|e| e.into_inner()) > 0
}

fn api(body: impl FnOnce() -> NvmlReturn) -> NvmlReturn {
    ffi::guard(NVML_ERROR_UNKNOWN, body)
}

/// Like [`api`] but fails with `NVML_ERROR_UNINITIALIZED` before `nvmlInit`.
fn api_init(body: impl FnOnce() -> NvmlReturn) -> NvmlReturn {
    api(|| {
        if initialized() {
            body()
        } else {
            NVML_ERROR_UNINITIALIZED
        }
    })
}

fn handle_for(index: usize) -> nvmlDevice_t {
    (index + 1) as nvmlDevice_t
}

fn index_of(device: nvmlDevice_t) -> Result<usize, NvmlReturn> {
    (device as usize)
        .checked_sub(1)
        .and_then(|i| device::valid(i as i64))
        .ok_or(NVML_ERROR_INVALID_ARGUMENT)
}

/// Runs a query on a valid device handle; a lost device (`CHD_FAKE_CONTROL_FILE`) answers
/// `NVML_ERROR_GPU_IS_LOST` to every query, as NVML documents for a GPU that "has fallen off
/// the bus or is otherwise inaccessible".
fn with_device(device: nvmlDevice_t, body: impl FnOnce(usize) -> NvmlReturn) -> NvmlReturn {
    api_init(|| match index_of(device) {
        Ok(i) if config::get().lost_now(i) => NVML_ERROR_GPU_IS_LOST,
        Ok(i) => body(i),
        Err(e) => e,
    })
}

/// Writes `value` through `out`: success, or `NVML_ERROR_INVALID_ARGUMENT` for null.
///
/// # Safety
/// `out` must be null or writable.
unsafe fn put<T>(out: *mut T, value: T) -> NvmlReturn {
    // SAFETY: forwarded contract.
    if unsafe { ffi::write(out, value) } {
        NVML_SUCCESS
    } else {
        NVML_ERROR_INVALID_ARGUMENT
    }
}

/// # Safety
/// `buf` must be null or writable for `len` bytes.
unsafe fn put_str(buf: *mut c_char, len: c_uint, text: &str) -> NvmlReturn {
    // SAFETY: forwarded contract.
    match unsafe { ffi::write_str(buf, len as usize, text, false) } {
        StrWrite::Written => NVML_SUCCESS,
        StrWrite::TooSmall if !buf.is_null() => NVML_ERROR_INSUFFICIENT_SIZE,
        StrWrite::TooSmall | StrWrite::Invalid => NVML_ERROR_INVALID_ARGUMENT,
    }
}

fn busy(index: usize) -> bool {
    config::get().busy_devices_now().contains(&index)
}

fn used_bytes(index: usize, busy: bool) -> u64 {
    memory::device_bytes(index) + if busy { BUSY_BYTES } else { 0 }
}

/// The compute processes on device `index` right now.
pub fn processes(index: usize) -> Vec<nvmlProcessInfo_t> {
    let mut procs = Vec::new();
    if busy(index) {
        procs.push(nvmlProcessInfo_t {
            pid: BUSY_PID,
            usedGpuMemory: BUSY_BYTES,
            gpuInstanceId: NO_INSTANCE,
            computeInstanceId: NO_INSTANCE,
        });
    }
    if memory::live_device_on(index) > 0 {
        procs.push(nvmlProcessInfo_t {
            // A host PID namespace sees this process under another pid (CHD_FAKE_NVML_OWN_PID).
            // SAFETY: getpid has no preconditions.
            pid: config::get()
                .nvml_own_pid
                .unwrap_or_else(|| unsafe { libc::getpid() } as u32),
            usedGpuMemory: memory::device_bytes(index),
            gpuInstanceId: NO_INSTANCE,
            computeInstanceId: NO_INSTANCE,
        });
    }
    procs
}

/// `nvmlInit_v2`: increments the init reference count.
#[no_mangle]
pub unsafe extern "C" fn nvmlInit_v2() -> NvmlReturn {
    api(|| {
        *INIT_COUNT.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        NVML_SUCCESS
    })
}

/// `nvmlInitWithFlags`: like [`nvmlInit_v2`]; flags are ignored.
#[no_mangle]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> NvmlReturn {
    // SAFETY: no pointer arguments.
    unsafe { nvmlInit_v2() }
}

/// `nvmlShutdown`: decrements the init reference count (`NVML_ERROR_UNINITIALIZED` at zero).
#[no_mangle]
pub unsafe extern "C" fn nvmlShutdown() -> NvmlReturn {
    api(|| {
        let mut n = INIT_COUNT.lock().unwrap_or_else(|e| e.into_inner());
        if *n == 0 {
            return NVML_ERROR_UNINITIALIZED;
        }
        *n -= 1;
        NVML_SUCCESS
    })
}

/// `nvmlErrorString`: static description, as real NVML words it.
#[no_mangle]
pub unsafe extern "C" fn nvmlErrorString(result: NvmlReturn) -> *const c_char {
    match result {
        NVML_SUCCESS => c"Success",
        NVML_ERROR_UNINITIALIZED => c"Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED => c"Not Supported",
        NVML_ERROR_NOT_FOUND => c"Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        NVML_ERROR_GPU_IS_LOST => c"GPU is lost",
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH => c"Argument Version Mismatch",
        NVML_ERROR_UNKNOWN => c"Unknown Error",
        _ => c"Unknown Error",
    }
    .as_ptr()
}

/// `nvmlSystemGetDriverVersion`: "550.54.15".
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    // SAFETY: module contract.
    api_init(|| unsafe { put_str(version, length, DRIVER_VERSION) })
}

/// `nvmlDeviceGetCount_v2`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(device_count: *mut c_uint) -> NvmlReturn {
    // SAFETY: module contract.
    api_init(|| unsafe { put(device_count, config::get().device_count as c_uint) })
}

/// `nvmlDeviceGetHandleByIndex_v2`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> NvmlReturn {
    api_init(|| match device::valid(i64::from(index)) {
        // SAFETY: module contract.
        Some(i) => unsafe { put(device, handle_for(i)) },
        None => NVML_ERROR_INVALID_ARGUMENT,
    })
}

/// `nvmlDeviceGetHandleByPciBusId_v2`: accepts `[domain:]bus:device.function` in any case
/// and with any domain width; `NVML_ERROR_NOT_FOUND` when no device has that address.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    pci_bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> NvmlReturn {
    api_init(|| {
        if pci_bus_id.is_null() || device.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-null, and NUL-terminated per the module contract.
        let text = unsafe { CStr::from_ptr(pci_bus_id) };
        let Ok(addr) = text
            .to_str()
            .map_err(|e| e.to_string())
            .and_then(PciAddress::parse)
        else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        match config::get().pci_addresses.iter().position(|a| *a == addr) {
            // SAFETY: module contract.
            Some(i) => unsafe { put(device, handle_for(i)) },
            None => NVML_ERROR_NOT_FOUND,
        }
    })
}

/// `nvmlDeviceGetName`: `CHD_FAKE_DEVICE_NAME`; `NVML_ERROR_INSUFFICIENT_SIZE` if it does not
/// fit in `length` bytes with its NUL.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    // SAFETY: module contract.
    with_device(device, |_| unsafe {
        put_str(name, length, &config::get().device_name)
    })
}

/// `nvmlDeviceGetUtilizationRates`: 100/100 on busy devices, 0/0 otherwise;
/// `NVML_ERROR_UNKNOWN` on a `CHD_FAKE_TELEMETRY_FAIL_DEVICES` device.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> NvmlReturn {
    with_device(device, |i| {
        if config::get().telemetry_fails(i) {
            return NVML_ERROR_UNKNOWN;
        }
        let pct = if busy(i) { 100 } else { 0 };
        let value = nvmlUtilization_t {
            gpu: pct,
            memory: pct,
        };
        // SAFETY: module contract.
        unsafe { put(utilization, value) }
    })
}

/// `nvmlDeviceGetMemoryBusWidth`: `CHD_FAKE_MEMORY_BUS_BITS` (6144 by default);
/// `NVML_ERROR_NOT_SUPPORTED` when it is 0.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryBusWidth(
    device: nvmlDevice_t,
    bus_width: *mut c_uint,
) -> NvmlReturn {
    with_device(device, |_| match config::get().memory_bus_bits {
        0 => NVML_ERROR_NOT_SUPPORTED,
        // SAFETY: module contract.
        bits => unsafe { put(bus_width, bits) },
    })
}

/// `nvmlClockType_t`'s `NVML_CLOCK_MEM`.
pub const NVML_CLOCK_MEM: c_uint = 2;

/// `nvmlDeviceGetMaxClockInfo`: for `NVML_CLOCK_MEM`, `CHD_FAKE_MAX_MEMORY_CLOCK_MHZ` (3201
/// by default; 0: `NVML_ERROR_NOT_SUPPORTED`); the graphics, SM and video clocks (0, 1, 3)
/// are 1980 MHz; another type is `NVML_ERROR_INVALID_ARGUMENT`, as nvml.h's enum ends at 3.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    device: nvmlDevice_t,
    clock_type: c_uint,
    clock: *mut c_uint,
) -> NvmlReturn {
    with_device(device, |_| {
        let mhz = match clock_type {
            NVML_CLOCK_MEM => config::get().max_memory_clock_mhz,
            0 | 1 | 3 => 1980,
            _ => return NVML_ERROR_INVALID_ARGUMENT,
        };
        if mhz == 0 {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        // SAFETY: module contract.
        unsafe { put(clock, mhz) }
    })
}

/// `nvmlDeviceGetMemoryInfo`: total = `CHD_FAKE_MEMORY_BYTES`; used = bytes this process
/// allocated on the device, plus 1 GiB when the device is busy.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> NvmlReturn {
    with_device(device, |i| {
        let total = config::get().memory_bytes;
        let used = used_bytes(i, busy(i)).min(total);
        let value = nvmlMemory_t {
            total,
            free: total - used,
            used,
        };
        // SAFETY: module contract.
        unsafe { put(memory, value) }
    })
}

/// `nvmlDeviceGetMemoryInfo_v2`: as [`nvmlDeviceGetMemoryInfo`] with `reserved = 0`; the
/// caller must set `version = nvmlMemory_v2` (`0x02000028`), else
/// `NVML_ERROR_ARGUMENT_VERSION_MISMATCH`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> NvmlReturn {
    with_device(device, |i| {
        if memory.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-null and readable per the module contract.
        let version = unsafe { std::ptr::addr_of!((*memory).version).read_unaligned() };
        if version != NVML_MEMORY_V2 {
            return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        }
        let total = config::get().memory_bytes;
        let used = used_bytes(i, busy(i)).min(total);
        let value = nvmlMemory_v2_t {
            version,
            total,
            reserved: 0,
            free: total - used,
            used,
        };
        // SAFETY: module contract.
        unsafe { put(memory, value) }
    })
}

/// `nvmlDeviceGetComputeRunningProcesses_v3`: a busy device runs pid 4242 (1 GiB); a device
/// with live allocations from this process also lists `getpid()` (or `CHD_FAKE_NVML_OWN_PID`). If `*info_count` is too
/// small it is set to the number of processes and `NVML_ERROR_INSUFFICIENT_SIZE` returned.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    info_count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> NvmlReturn {
    with_device(device, |i| {
        if info_count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        if config::get().telemetry_fails(i) {
            return NVML_ERROR_UNKNOWN;
        }
        let procs = processes(i);
        // SAFETY: non-null and readable/writable per the module contract.
        let capacity = unsafe { info_count.read_unaligned() } as usize;
        // SAFETY: as above.
        unsafe { info_count.write_unaligned(procs.len() as c_uint) };
        if capacity < procs.len() {
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        if procs.is_empty() {
            return NVML_SUCCESS;
        }
        if infos.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: `infos` is writable for `capacity >= procs.len()` entries (module contract).
        unsafe { std::ptr::copy_nonoverlapping(procs.as_ptr(), infos, procs.len()) };
        NVML_SUCCESS
    })
}

fn c_chars<const N: usize>(text: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (slot, b) in out.iter_mut().zip(text.bytes().take(N - 1)) {
        *slot = b as c_char;
    }
    out
}

/// `nvmlDeviceGetPciInfo_v3`: `busId` `00000000:1A:00.0`, `busIdLegacy` `0000:1A:00.0`,
/// domain/bus/device from the configured address.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> NvmlReturn {
    with_device(device, |i| {
        let addr = config::get().pci_addresses[i];
        let value = nvmlPciInfo_t {
            busIdLegacy: c_chars(&addr.legacy_upper()),
            domain: addr.domain,
            bus: c_uint::from(addr.bus),
            device: c_uint::from(addr.device),
            pciDeviceId: PCI_DEVICE_ID,
            pciSubSystemId: PCI_SUBSYSTEM_ID,
            busId: c_chars(&addr.nvml_upper()),
        };
        // SAFETY: module contract.
        unsafe { put(pci, value) }
    })
}
