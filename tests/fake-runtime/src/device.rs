//! Per-thread device selection (`cudaSetDevice` / `aclrtSetDevice` share it) and the
//! calling thread's current CPU, which selects `CHD_FAKE_SLOW_CPUS` rules.

use std::cell::Cell;
use std::collections::BTreeSet;
use std::sync::Mutex;

use crate::config;
use crate::memory::Api;

thread_local! {
    static CURRENT_DEVICE: Cell<usize> = const { Cell::new(0) };
}

/// The calling thread's current device (0 until set).
pub fn current() -> usize {
    CURRENT_DEVICE.with(Cell::get)
}

/// Sets the calling thread's current device. Returns false (and changes nothing) when
/// `device` is not a configured device.
pub fn set_current(device: i64) -> bool {
    match valid(device) {
        Some(d) => {
            CURRENT_DEVICE.with(|c| c.set(d));
            true
        }
        None => false,
    }
}

/// `Some(device)` when `device` is in `0..CHD_FAKE_DEVICE_COUNT`.
pub fn valid(device: i64) -> Option<usize> {
    usize::try_from(device)
        .ok()
        .filter(|&d| d < config::get().device_count)
}

/// The current device, or `None` when it is out of range (only possible with zero devices).
pub fn current_checked() -> Option<usize> {
    let d = current();
    (d < config::get().device_count).then_some(d)
}

/// The CPU the calling thread runs on right now, if the kernel says.
pub fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu has no preconditions; it returns -1 on failure.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).ok()
}

/// Enabled peer access, as (API, device, peer) (`cudaDeviceEnablePeerAccess`,
/// `aclrtDeviceEnablePeerAccess`): `device` may access `peer`'s memory. A cross-device copy
/// runs over the pair link only when the device issuing it has access to the other one (see
/// `copy`).
static PEER_ACCESS: Mutex<BTreeSet<(u8, usize, usize)>> = Mutex::new(BTreeSet::new());

fn api_key(api: Api) -> u8 {
    match api {
        Api::Cuda => 0,
        Api::Acl => 1,
    }
}

/// Records that `device` may access `peer`; false if it already could.
pub fn enable_peer(api: Api, device: usize, peer: usize) -> bool {
    PEER_ACCESS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert((api_key(api), device, peer))
}

/// Forgets that `device` may access `peer`; false if it could not.
pub fn disable_peer(api: Api, device: usize, peer: usize) -> bool {
    PEER_ACCESS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&(api_key(api), device, peer))
}

/// Whether `device` may access `peer`'s memory under `api`.
pub fn peer_enabled(api: Api, device: usize, peer: usize) -> bool {
    PEER_ACCESS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&(api_key(api), device, peer))
}

/// Enabled (API, device, peer) directions of both APIs.
pub fn peer_access_enabled() -> u64 {
    PEER_ACCESS.lock().unwrap_or_else(|e| e.into_inner()).len() as u64
}
