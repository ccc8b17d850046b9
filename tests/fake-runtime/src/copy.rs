//! The copy engine shared by `cudaMemcpy*` and `aclrtMemcpy*`: validates the pointers
//! against the allocation registry, applies `CHD_FAKE_FAIL_DEVICES`, really copies the bytes,
//! advances the stream's virtual clock by `bytes / bandwidth`, and counts successful copies
//! per device (for the `chd_fake_copies` hook).

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::config;
use crate::device;
use crate::memory::{self, Api, Location};
use crate::timing::{self, StreamRef, TimingError};

/// The direction a caller asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    HostToHost,
    HostToDevice,
    DeviceToHost,
    DeviceToDevice,
    /// Infer from the pointers (`cudaMemcpyDefault`, `ACL_MEMCPY_DEFAULT`).
    Infer,
}

/// Why a copy failed; nothing was copied.
#[derive(Clone, Debug, PartialEq)]
pub enum CopyError {
    /// Null pointer, range outside a device allocation, or pointers contradicting the direction.
    InvalidValue(String),
    /// The stream handle is not a live stream of this API.
    InvalidStream,
    /// The device is listed in `CHD_FAKE_FAIL_DEVICES`.
    DeviceFailed(usize),
}

/// Per-device count of successful copies.
fn counters() -> &'static [AtomicU64] {
    static COUNTERS: OnceLock<Vec<AtomicU64>> = OnceLock::new();
    COUNTERS.get_or_init(|| {
        (0..config::get().device_count)
            .map(|_| AtomicU64::new(0))
            .collect()
    })
}

/// Successful copies that involved `device` (0 for unknown devices).
pub fn copies(device: usize) -> u64 {
    counters()
        .get(device)
        .map_or(0, |c| c.load(Ordering::Relaxed))
}

fn bump(device: usize) {
    if let Some(c) = counters().get(device) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

fn describe(loc: Location) -> &'static str {
    match loc {
        Location::Host => "host memory",
        Location::Device(_) => "device memory",
        Location::Overrun => "a range running past the end of its device allocation",
    }
}

/// Copies `count` bytes from `src` to `dst` on `stream`.
///
/// # Safety
/// `dst` and `src` must be valid for `count` bytes of writing/reading respectively (device
/// pointers are validated here; host pointers cannot be and are trusted).
pub unsafe fn copy(
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    direction: Direction,
    stream: StreamRef,
    api: Api,
) -> Result<(), CopyError> {
    timing::stream_device(stream, api).map_err(|_| CopyError::InvalidStream)?;
    if count == 0 {
        return Ok(());
    }
    if dst.is_null() || src.is_null() {
        return Err(CopyError::InvalidValue("null pointer".to_owned()));
    }
    let d = memory::locate(dst as usize, count);
    let s = memory::locate(src as usize, count);
    let bad = |what: &str| {
        CopyError::InvalidValue(format!(
            "{what}: destination is {}, source is {}",
            describe(d),
            describe(s)
        ))
    };
    // (device the copy is timed and failed on, other device involved)
    let (timed_on, other) = match (direction, d, s) {
        (_, Location::Overrun, _) | (_, _, Location::Overrun) => {
            return Err(bad("copy range exceeds its allocation"))
        }
        (Direction::HostToHost | Direction::Infer, Location::Host, Location::Host) => {
            if api == Api::Cuda {
                return Err(bad(
                    "host-to-host copies are not supported by the fake CUDA runtime",
                ));
            }
            (None, None)
        }
        (Direction::HostToDevice | Direction::Infer, Location::Device(dev), Location::Host) => {
            (Some(dev), None)
        }
        (Direction::DeviceToHost | Direction::Infer, Location::Host, Location::Device(dev)) => {
            (Some(dev), None)
        }
        (
            Direction::DeviceToDevice | Direction::Infer,
            Location::Device(dd),
            Location::Device(sd),
        ) => (Some(sd), Some(dd)),
        (dir, _, _) => return Err(bad(&format!("pointers do not fit {dir:?}"))),
    };
    let cfg = config::get();
    for dev in timed_on.iter().chain(other.iter()) {
        if cfg.fails(*dev) {
            return Err(CopyError::DeviceFailed(*dev));
        }
    }
    // SAFETY: the caller guarantees both ranges are valid for `count` bytes; device ranges
    // were checked against live allocations above. `ptr::copy` tolerates overlap.
    unsafe { std::ptr::copy(src.cast::<u8>(), dst.cast::<u8>(), count) };
    if let Some(dev) = timed_on {
        let gbps = cfg.gbps(dev, device::current_cpu());
        // bytes / (GB/s) = nanoseconds.
        let ns = count as f64 / gbps;
        // The stream was checked above; it can only vanish if another thread destroys it
        // while copying, which is the caller's race; the bytes are copied regardless.
        let _: Result<(), TimingError> = timing::advance(stream, api, ns);
        bump(dev);
        if let Some(o) = other.filter(|&o| o != dev) {
            bump(o);
        }
    }
    Ok(())
}
