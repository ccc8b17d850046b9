//! Per-thread device selection (`cudaSetDevice` / `aclrtSetDevice` share it) and the
//! calling thread's current CPU, which selects `CHD_FAKE_SLOW_CPUS` rules.

use std::cell::Cell;

use crate::config;

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
