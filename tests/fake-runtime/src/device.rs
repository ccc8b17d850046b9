//! Per-thread device selection (`cudaSetDevice` / `aclrtSetDevice` share it) and the
//! calling thread's current CPU, which selects `CHD_FAKE_SLOW_CPUS` rules.
//!
//! The devices the process has a CUDA context on ([`contexts`]): CUDA 12's `cudaSetDevice`
//! creates the device's primary context, and a call that needs a context (an allocation,
//! pinned host memory included, a stream, an event) on a thread that never set a device
//! creates device 0's: the runtime's implicit default. On silicon that is a context, memory
//! and an `nvidia-smi` process entry on a GPU the program never meant to touch.

use std::cell::Cell;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::config;
use crate::memory::Api;

thread_local! {
    static CURRENT_DEVICE: Cell<usize> = const { Cell::new(0) };
    /// Whether this thread ever set its device.
    static DEVICE_SET: Cell<bool> = const { Cell::new(false) };
}

/// Bit `d`: device `d` has a context in this process (devices past 63 share bit 63).
static CONTEXTS: AtomicU64 = AtomicU64::new(0);

/// Device `device` has a context in this process from now on.
pub fn open_context(device: usize) {
    CONTEXTS.fetch_or(1 << device.min(63), Ordering::Relaxed);
}

/// A call that needs a context runs on this thread: on a thread that never set its device,
/// that is device 0's context, created implicitly.
pub fn touch_context() {
    if !DEVICE_SET.with(Cell::get) {
        open_context(current());
    }
}

/// The devices with a context in this process, as a bit mask.
pub fn contexts() -> u64 {
    CONTEXTS.load(Ordering::Relaxed)
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
            DEVICE_SET.with(|c| c.set(true));
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

/// ACL directions another process enabled (`CHD_FAKE_ACL_PEER_ENABLED`), and how many of
/// them this process disabled: CANN's peer access is per device, so that cuts the other
/// process off.
static FOREIGN_ACL_PEERS: Mutex<BTreeSet<(usize, usize)>> = Mutex::new(BTreeSet::new());
static FOREIGN_ACL_DISABLED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static SEED: std::sync::Once = std::sync::Once::new();

/// The peer access other processes enabled, once, before anything reads or changes it.
fn seed() {
    SEED.call_once(|| {
        let pairs = config::get().acl_peer_enabled.clone();
        let mut access = PEER_ACCESS.lock().unwrap_or_else(|e| e.into_inner());
        let mut foreign = FOREIGN_ACL_PEERS.lock().unwrap_or_else(|e| e.into_inner());
        for (a, b) in pairs {
            for (d, p) in [(a, b), (b, a)] {
                access.insert((api_key(Api::Acl), d, p));
                foreign.insert((d, p));
            }
        }
    });
}

/// How many ACL directions another process had enabled this process disabled.
pub fn foreign_acl_peer_access_disabled() -> u64 {
    FOREIGN_ACL_DISABLED.load(std::sync::atomic::Ordering::Relaxed)
}

fn api_key(api: Api) -> u8 {
    match api {
        Api::Cuda => 0,
        Api::Acl => 1,
    }
}

/// Records that `device` may access `peer`; false if it already could.
pub fn enable_peer(api: Api, device: usize, peer: usize) -> bool {
    seed();
    PEER_ACCESS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert((api_key(api), device, peer))
}

/// Forgets that `device` may access `peer`; false if it could not.
pub fn disable_peer(api: Api, device: usize, peer: usize) -> bool {
    seed();
    let removed = PEER_ACCESS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&(api_key(api), device, peer));
    if removed
        && api == Api::Acl
        && FOREIGN_ACL_PEERS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&(device, peer))
    {
        FOREIGN_ACL_DISABLED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    removed
}

/// Whether `device` may access `peer`'s memory under `api`.
pub fn peer_enabled(api: Api, device: usize, peer: usize) -> bool {
    seed();
    PEER_ACCESS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&(api_key(api), device, peer))
}

/// Enabled (API, device, peer) directions of both APIs.
pub fn peer_access_enabled() -> u64 {
    seed();
    PEER_ACCESS.lock().unwrap_or_else(|e| e.into_inner()).len() as u64
}
