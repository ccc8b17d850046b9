//! The allocation registry: pinned host allocations (`cudaHostAlloc`, `cudaMallocHost`,
//! `aclrtMallocHost`) and "device" allocations (`cudaMalloc`, `aclrtMalloc`), both plain
//! page-aligned host memory. Device allocations are tagged with their device so a copy can
//! tell which device it touches by looking up the device-side pointer.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::config;

/// Alignment of every allocation (a page).
pub const ALIGN: usize = 4096;

/// Which API family made an allocation; each family may only free its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Cuda,
    Acl,
}

#[derive(Clone, Copy, Debug)]
struct Allocation {
    len: usize,
    api: Api,
    /// `None` for pinned host memory.
    device: Option<usize>,
    /// Pinned host memory only: the device it is pinned for when it is not portable (CUDA's
    /// `cudaMallocHost` and `cudaHostAlloc` without `cudaHostAllocPortable`: the device current
    /// at allocation); `None` when every device sees it pinned.
    home: Option<usize>,
    /// Device memory only: bytes copied into it so far (summed, capped at `len`); cuBLAS
    /// refuses operands never written whole ([`fully_written`]).
    written: usize,
}

#[derive(Default)]
struct Registry {
    pinned: BTreeMap<usize, Allocation>,
    device: BTreeMap<usize, Allocation>,
    /// Bytes currently allocated per device.
    device_bytes: BTreeMap<usize, u64>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    pinned: BTreeMap::new(),
    device: BTreeMap::new(),
    device_bytes: BTreeMap::new(),
});

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why an allocation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocError {
    /// Not enough (fake) device memory, or the host allocator failed.
    OutOfMemory,
}

/// Why a free failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FreeError {
    /// Not the base address of a live allocation of this kind from this API.
    UnknownPointer,
}

/// Where a pointer range lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Location {
    /// Not inside any live device allocation: host memory as far as we know.
    Host,
    /// Entirely inside a live allocation on this device.
    Device(usize),
    /// Starts inside a live device allocation but runs past its end.
    Overrun,
}

fn host_alloc(size: usize) -> Option<*mut c_void> {
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: `p` is a valid out-pointer; ALIGN is a power of two multiple of the pointer size.
    let rc = unsafe { libc::posix_memalign(&mut p, ALIGN, size) };
    (rc == 0 && !p.is_null()).then_some(p)
}

/// Allocates `size` bytes of pinned host memory, pinned for device `home` only (`None`:
/// portable, for every device). `size == 0` yields a null pointer. Each allocation costs its
/// simulated pinning time (see [`crate::cost`]).
pub fn alloc_pinned(size: usize, api: Api, home: Option<usize>) -> Result<*mut c_void, AllocError> {
    if size == 0 {
        return Ok(std::ptr::null_mut());
    }
    let p = host_alloc(size).ok_or(AllocError::OutOfMemory)?;
    registry().pinned.insert(
        p as usize,
        Allocation {
            len: size,
            api,
            device: None,
            home,
            written: 0,
        },
    );
    crate::cost::charge_pin(size);
    Ok(p)
}

/// For a range inside a live pinned allocation that is pinned for one device only: that
/// device. `None` for portable pinned memory and for memory that is not pinned.
pub fn pinned_home(addr: usize, len: usize) -> Option<usize> {
    let reg = registry();
    let (&base, alloc) = reg.pinned.range(..=addr).next_back()?;
    let inside = addr < base + alloc.len && addr.saturating_add(len) <= base + alloc.len;
    inside.then_some(alloc.home).flatten()
}

/// Frees the pinned host allocation at `addr` made by `api`.
pub fn free_pinned(addr: usize, api: Api) -> Result<(), FreeError> {
    let mut reg = registry();
    match reg.pinned.get(&addr) {
        Some(a) if a.api == api => {
            reg.pinned.remove(&addr);
        }
        _ => return Err(FreeError::UnknownPointer),
    }
    drop(reg);
    // SAFETY: `addr` came from posix_memalign in `alloc_pinned` and was just unregistered, so
    // it is freed exactly once.
    unsafe { libc::free(addr as *mut c_void) };
    Ok(())
}

/// Allocates `size` bytes of "device" memory on `device`, within `CHD_FAKE_MEMORY_BYTES`.
pub fn alloc_device(device: usize, size: usize, api: Api) -> Result<*mut c_void, AllocError> {
    let total = config::get().memory_bytes;
    let mut reg = registry();
    let used = reg.device_bytes.get(&device).copied().unwrap_or(0);
    if used.saturating_add(size as u64) > total {
        return Err(AllocError::OutOfMemory);
    }
    let p = host_alloc(size.max(1)).ok_or(AllocError::OutOfMemory)?;
    reg.device.insert(
        p as usize,
        Allocation {
            len: size,
            api,
            device: Some(device),
            home: None,
            written: 0,
        },
    );
    *reg.device_bytes.entry(device).or_insert(0) += size as u64;
    Ok(p)
}

/// Frees the device allocation at `addr` made by `api`.
pub fn free_device(addr: usize, api: Api) -> Result<(), FreeError> {
    let mut reg = registry();
    let alloc = match reg.device.get(&addr) {
        Some(a) if a.api == api => *a,
        _ => return Err(FreeError::UnknownPointer),
    };
    reg.device.remove(&addr);
    if let Some(device) = alloc.device {
        if let Some(bytes) = reg.device_bytes.get_mut(&device) {
            *bytes = bytes.saturating_sub(alloc.len as u64);
        }
    }
    drop(reg);
    // SAFETY: `addr` came from posix_memalign in `alloc_device` and was just unregistered, so
    // it is freed exactly once.
    unsafe { libc::free(addr as *mut c_void) };
    Ok(())
}

/// Count `len` bytes copied into the device allocation holding `addr`.
pub fn note_written(addr: usize, len: usize) {
    let mut reg = registry();
    if let Some((&base, alloc)) = reg.device.range_mut(..=addr).next_back() {
        if addr < base + alloc.len.max(1) {
            alloc.written = alloc.written.saturating_add(len).min(alloc.len);
        }
    }
}

/// Whether at least `len` bytes were copied into the device allocation holding `addr`: a
/// matrix operand that was filled before it is read, rather than whatever the allocator left
/// (on silicon mostly zeros, which draw less power and read fast under a power cap).
pub fn fully_written(addr: usize, len: usize) -> bool {
    let reg = registry();
    reg.device
        .range(..=addr)
        .next_back()
        .is_some_and(|(&base, alloc)| addr < base + alloc.len.max(1) && alloc.written >= len)
}

/// Where `[addr, addr + len)` lies relative to the live device allocations.
pub fn locate(addr: usize, len: usize) -> Location {
    locate_in(&registry(), addr, len)
}

/// Runs `f` while every `(addr, len, device)` range lies inside a live allocation on
/// `device`, holding the registry lock so that no allocation can be freed meanwhile; returns
/// `None` (without running `f`) when a range does not.
pub fn with_live_ranges<R>(ranges: &[(usize, usize, usize)], f: impl FnOnce() -> R) -> Option<R> {
    let reg = registry();
    ranges
        .iter()
        .all(|&(addr, len, dev)| len == 0 || locate_in(&reg, addr, len) == Location::Device(dev))
        .then(f)
}

fn locate_in(reg: &Registry, addr: usize, len: usize) -> Location {
    let Some((&base, alloc)) = reg.device.range(..=addr).next_back() else {
        return Location::Host;
    };
    let end = base + alloc.len;
    // A zero-length allocation still owns its base address.
    if addr >= end && !(addr == base && alloc.len == 0) {
        return Location::Host;
    }
    match addr.checked_add(len) {
        Some(last) if last <= end => Location::Device(alloc.device.unwrap_or(0)),
        _ => Location::Overrun,
    }
}

/// Whether `[addr, addr + len)` lies entirely inside one live pinned host allocation made by
/// `api` (`aclrtMallocHost` for [`Api::Acl`]).
pub fn in_pinned(addr: usize, len: usize, api: Api) -> bool {
    let reg = registry();
    let Some((&base, alloc)) = reg.pinned.range(..=addr).next_back() else {
        return false;
    };
    alloc.api == api
        && addr
            .checked_add(len)
            .is_some_and(|last| last <= base + alloc.len)
        && addr < base + alloc.len
}

/// The base address of the live allocation (pinned host or device) that `addr` lies in.
pub fn base_of(addr: usize) -> Option<usize> {
    let reg = registry();
    let base = [&reg.pinned, &reg.device].into_iter().find_map(|map| {
        let (&base, alloc) = map.range(..=addr).next_back()?;
        (addr < base + alloc.len.max(1)).then_some(base)
    });
    base
}

/// Bytes currently allocated on `device` through `cudaMalloc` / `aclrtMalloc`.
pub fn device_bytes(device: usize) -> u64 {
    registry().device_bytes.get(&device).copied().unwrap_or(0)
}

/// Number of live pinned host allocations.
pub fn live_pinned() -> u64 {
    registry().pinned.len() as u64
}

/// Bytes of the live pinned host allocations.
pub fn live_pinned_bytes() -> u64 {
    registry().pinned.values().map(|a| a.len as u64).sum()
}

/// Number of live device allocations.
pub fn live_device() -> u64 {
    registry().device.len() as u64
}

/// Number of live device allocations on `device`.
pub fn live_device_on(device: usize) -> u64 {
    registry()
        .device
        .values()
        .filter(|a| a.device == Some(device))
        .count() as u64
}

static FREES_IN_FLIGHT: AtomicU64 = AtomicU64::new(0);

/// A buffer of a cross-device copy in flight was freed under it.
static FREED_UNDER_COPY: AtomicU64 = AtomicU64::new(0);

/// Count a buffer freed while a (hanging) cross-device copy still used it.
pub fn count_freed_under_copy() {
    FREED_UNDER_COPY.fetch_add(1, Ordering::Relaxed);
}

/// Buffers freed while a cross-device copy still used them.
pub fn freed_under_copy() -> u64 {
    FREED_UNDER_COPY.load(Ordering::Relaxed)
}

/// Counts one refused free of memory that work in flight still uses (see `timing`).
pub fn count_free_in_flight() {
    FREES_IN_FLIGHT.fetch_add(1, Ordering::Relaxed);
}

/// Frees refused so far because work in flight used the memory.
pub fn frees_in_flight() -> u64 {
    FREES_IN_FLIGHT.load(Ordering::Relaxed)
}
