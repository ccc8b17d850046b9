//! Test-only exports for chd's own tests: counters of live allocations and of successful
//! copies per device, so a test can assert that chd frees what it allocates and that it
//! really drove a given device.

use std::ffi::c_int;

use crate::copy;
use crate::memory;

/// Pinned host allocations (`cudaHostAlloc`, `cudaMallocHost`, `aclrtMallocHost`) not yet
/// freed.
#[no_mangle]
pub extern "C" fn chd_fake_live_pinned_allocations() -> u64 {
    std::panic::catch_unwind(memory::live_pinned).unwrap_or(u64::MAX)
}

/// Device allocations (`cudaMalloc`, `aclrtMalloc`) not yet freed (size-0 `cudaMalloc`
/// returns NULL and is not counted).
#[no_mangle]
pub extern "C" fn chd_fake_live_device_allocations() -> u64 {
    std::panic::catch_unwind(memory::live_device).unwrap_or(u64::MAX)
}

/// Successful timed copies that involved `device` (a device-to-device copy counts for both
/// devices); 0 for an unknown device.
#[no_mangle]
pub extern "C" fn chd_fake_copies(device: c_int) -> u64 {
    std::panic::catch_unwind(|| usize::try_from(device).map_or(0, copy::copies)).unwrap_or(0)
}
