//! Test-only exports for chd's own tests: counters of live allocations, of successful
//! copies per device, of completed collective calls and of live communicators, so a test can
//! assert that chd frees what it allocates and that it really drove a given device or pair.

use std::ffi::c_int;

use crate::collective::{self, Lib};
use crate::copy;
use crate::cublas;
use crate::device;
use crate::memory;
use crate::pending;

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

/// Completed collective calls of `kind` (0 NCCL, 1 HCCL; anything else 0). Counted per rank:
/// one 2-rank allgather adds 2. Failed or timed-out calls are not counted.
#[no_mangle]
pub extern "C" fn chd_fake_collectives(kind: c_int) -> u64 {
    std::panic::catch_unwind(|| match kind {
        0 => collective::completed(Lib::Nccl),
        1 => collective::completed(Lib::Hccl),
        _ => 0,
    })
    .unwrap_or(0)
}

/// NCCL and HCCL communicators created and not yet destroyed or aborted.
#[no_mangle]
pub extern "C" fn chd_fake_live_communicators() -> u64 {
    std::panic::catch_unwind(collective::live_communicators).unwrap_or(u64::MAX)
}

/// Successful `cublasSgemm_v2` calls on `device`; 0 for an unknown device.
#[no_mangle]
pub extern "C" fn chd_fake_gemms(device: c_int) -> u64 {
    std::panic::catch_unwind(|| usize::try_from(device).map_or(0, cublas::gemms)).unwrap_or(0)
}

/// `cublasSgemm_v2` calls refused because A or B was never written whole.
#[no_mangle]
pub extern "C" fn chd_fake_unwritten_gemm_operands() -> u64 {
    std::panic::catch_unwind(cublas::unwritten_operands).unwrap_or(u64::MAX)
}

/// The devices this process has a CUDA context on, as a bit mask (bit `d`: device `d`).
#[no_mangle]
pub extern "C" fn chd_fake_context_devices() -> u64 {
    std::panic::catch_unwind(crate::device::contexts).unwrap_or(u64::MAX)
}

/// HCCL calls refused because another communicator's collective was in flight on the card.
#[no_mangle]
pub extern "C" fn chd_fake_hccl_concurrent_calls() -> u64 {
    std::panic::catch_unwind(collective::concurrent_hccl_calls).unwrap_or(u64::MAX)
}

/// cuBLAS handles created and not yet destroyed.
#[no_mangle]
pub extern "C" fn chd_fake_live_cublas_handles() -> u64 {
    std::panic::catch_unwind(cublas::live_handles).unwrap_or(u64::MAX)
}

/// ACL stream destroys and frees refused because an `aclrtMemcpyAsync` using the stream or
/// the memory was not synchronized yet.
#[no_mangle]
pub extern "C" fn chd_fake_unsynchronized_releases() -> u64 {
    std::panic::catch_unwind(pending::refused).unwrap_or(u64::MAX)
}

/// Peer-access directions enabled and not yet disabled, CUDA and ACL together (each
/// `cudaDeviceEnablePeerAccess` / `aclrtDeviceEnablePeerAccess` from one device to another
/// counts one).
#[no_mangle]
pub extern "C" fn chd_fake_peer_access_enabled() -> u64 {
    std::panic::catch_unwind(device::peer_access_enabled).unwrap_or(u64::MAX)
}

/// Simulated nanoseconds spent so far: the `CHD_FAKE_PIN_MS_PER_MIB` cost of every pinned
/// host allocation plus the virtual duration of every timed copy.
#[no_mangle]
pub extern "C" fn chd_fake_simulated_ns() -> u64 {
    std::panic::catch_unwind(crate::cost::simulated_ns).unwrap_or(u64::MAX)
}

/// Pinned host allocations made so far (freed or not).
#[no_mangle]
pub extern "C" fn chd_fake_pinned_allocations_total() -> u64 {
    std::panic::catch_unwind(crate::cost::pinned_total).unwrap_or(u64::MAX)
}

/// Timed copies whose host side was CUDA pinned memory pinned for another device only
/// (`cudaMallocHost`, or `cudaHostAlloc` without `cudaHostAllocPortable`, under another
/// current device): the runtime does not treat it as pinned for the copying device.
#[no_mangle]
pub extern "C" fn chd_fake_unportable_pinned_copies() -> u64 {
    std::panic::catch_unwind(crate::cost::unportable_copies).unwrap_or(u64::MAX)
}

/// Synchronizes that would have waited forever on a latch nobody released (a
/// `cuStreamWaitValue32` whose word never changed, a host function that never returned): the
/// real runtime hangs there.
#[no_mangle]
pub extern "C" fn chd_fake_latch_deadlocks() -> u64 {
    std::panic::catch_unwind(crate::timing::latch_deadlocks).unwrap_or(u64::MAX)
}

/// API calls made from inside a host function (`cudaLaunchHostFunc`, `aclrtLaunchHostFunc`),
/// each refused.
#[no_mangle]
pub extern "C" fn chd_fake_host_function_api_calls() -> u64 {
    std::panic::catch_unwind(crate::timing::host_function_api_calls).unwrap_or(u64::MAX)
}

/// Streams (live or destroyed) whose work waits behind a hold now: an unreleased latch, a
/// running host function or a hung copy.
#[no_mangle]
pub extern "C" fn chd_fake_held_streams() -> u64 {
    std::panic::catch_unwind(crate::timing::held_streams).unwrap_or(u64::MAX)
}

/// Frees refused because work in flight (a hung copy, a copy queued behind a hold, a stream
/// waiting on the memory) still used the memory.
#[no_mangle]
pub extern "C" fn chd_fake_frees_in_flight() -> u64 {
    std::panic::catch_unwind(memory::frees_in_flight).unwrap_or(u64::MAX)
}
