//! The copy engine shared by `cudaMemcpy*` and `aclrtMemcpy*`: validates the pointers
//! against the allocation registry, applies `CHD_FAKE_FAIL_DEVICES`, really copies the bytes,
//! advances the stream's virtual clock by `bytes / bandwidth`, and counts successful copies
//! per device (for the `chd_fake_copies` hook) and per stream (for `CHD_FAKE_FAIL_AFTER`).
//!
//! A device-to-device copy between two *different* devices is a peer copy. It crosses the pair
//! link at the `CHD_FAKE_PAIR_GBPS` rate (see [`peer_rank`] for which rank's CPU override
//! applies) only when the device issuing it has peer access to the other device (see
//! [`peer_route`]); without it CUDA stages the copy through host memory at
//! `CHD_FAKE_STAGED_GBPS`, and ACL refuses it. Peer copies obey `CHD_FAKE_PAIR_FAIL` and
//! `CHD_FAKE_PAIR_HANG_MS`. A same-device device-to-device copy runs at the device's
//! `CHD_FAKE_D2D_GBPS` rate; host <-> device copies at the `CHD_FAKE_SLOW_CPUS` /
//! `CHD_FAKE_H2D_GBPS` rate of the device they are timed on; both times
//! `CHD_FAKE_LOAD_COPY_FACTOR` while a cuBLAS gemm is in flight on that device.
//! Every timed copy also takes `CHD_FAKE_COPY_LATENCY_US` and runs at its size's
//! `CHD_FAKE_SIZE_DIP` factor (see `Config::copy_ns`), and starts no earlier than its enqueue
//! call ended (`CHD_FAKE_ENQUEUE_US`, see `host_clock`). A copy touching a device of
//! `CHD_FAKE_HANG_DEVICES` is enqueued and never runs while the device hangs: nothing is
//! copied, and the stream is held behind it (see `timing`).

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
    /// The device is lost (the control file's `lost_devices`).
    DeviceLost(usize),
    /// A cross-device copy while `CHD_FAKE_PAIR_FAIL` is set: (source, destination) device.
    LinkFailed(usize, usize),
    /// An ACL cross-device copy while the issuing device has no peer access to the other
    /// one: (issuing device, other device).
    PeerAccessNotEnabled(usize, usize),
    /// A CUDA copy with a pageable host side on a stream a latch holds: the runtime stages
    /// pageable memory and "may synchronize with the stream" to do so, inside the enqueue
    /// call, which the held stream never lets return.
    WouldDeadlock,
}

/// The collective rank whose `CHD_FAKE_PAIR_GBPS` CPU override applies to a peer copy from
/// `src` to `dst` issued on a stream of `stream_device`: the pair is taken in ascending device
/// order (the lower device is rank 0, as with `ncclCommInitAll` on a sorted list) and the copy
/// belongs to the rank whose device owns the stream (the source device when the stream is on
/// neither device).
pub fn peer_rank(stream_device: usize, src: usize, dst: usize) -> usize {
    let local = if stream_device == src || stream_device == dst {
        stream_device
    } else {
        src
    };
    usize::from(local != src.min(dst))
}

/// The two devices of a peer copy from `src` to `dst` issued on a stream of `stream_device`,
/// as (local, remote): the local device is the one issuing the copy (the stream's device, or
/// the source when the stream is on neither). The copy runs over the link when local may
/// access remote (`cudaDeviceEnablePeerAccess` / `aclrtDeviceEnablePeerAccess` on local
/// towards remote), as a kernel or copy engine of the local device reads or writes the
/// remote memory.
pub fn peer_route(stream_device: usize, src: usize, dst: usize) -> (usize, usize) {
    if stream_device == dst {
        (dst, src)
    } else {
        (src, dst)
    }
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
    let stream_device = timing::stream_device(stream, api).map_err(|_| CopyError::InvalidStream)?;
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
    // CANN documents host <-> device copies on a stream of the device that owns the memory
    // only (aclrtMemcpyAsync); a device's memory read back on another device's stream is
    // no documented case, so the fake refuses it (CUDA's unified addressing allows it). The
    // synchronous aclrtMemcpy names no stream and is not judged.
    if api == Api::Acl && other.is_none() && matches!(stream, StreamRef::Handle(_)) {
        if let Some(dev) = timed_on.filter(|&dev| dev != stream_device) {
            return Err(bad(&format!(
                "device {dev}'s memory copied to or from the host on a stream of device \
                 {stream_device}"
            )));
        }
    }
    // CUDA stages pageable host memory, possibly synchronizing with the stream first.
    if api == Api::Cuda {
        let pageable =
            |loc: Location, p: usize| loc == Location::Host && !memory::in_pinned(p, count, api);
        let host_side = match (d, s) {
            (Location::Host, Location::Device(_)) => pageable(d, dst as usize),
            (Location::Device(_), Location::Host) => pageable(s, src as usize),
            _ => false,
        };
        if host_side && timing::held_by_latch(stream, api) {
            timing::count_latch_deadlock();
            return Err(CopyError::WouldDeadlock);
        }
    }
    let cfg = config::get();
    let faults = cfg.faults_now();
    // A lost device takes no work at all, whatever the stream did before.
    if let Some(&dev) = timed_on
        .iter()
        .chain(other.iter())
        .chain(Some(&stream_device))
        .find(|&&d| faults.lost(d))
    {
        return Err(CopyError::DeviceLost(dev));
    }
    // CHD_FAKE_FAIL_AFTER: a failing device lets the first copies of each stream through.
    let failing = timing::copies_on(stream, api) >= cfg.fail_after;
    for dev in timed_on.iter().chain(other.iter()) {
        if failing && faults.fails(*dev) {
            return Err(CopyError::DeviceFailed(*dev));
        }
    }
    // (source, destination) of a copy over the pair link.
    let peer = match (timed_on, other) {
        (Some(src), Some(dst)) if src != dst => Some((src, dst)),
        _ => None,
    };
    // Whether a peer copy crosses the link (peer access enabled) or is host-staged (CUDA).
    let mut direct = false;
    if let Some((src_dev, dst_dev)) = peer {
        if cfg.pair_fail {
            return Err(CopyError::LinkFailed(src_dev, dst_dev));
        }
        let (local, remote) = peer_route(stream_device, src_dev, dst_dev);
        direct = device::peer_enabled(api, local, remote);
        if !direct && api == Api::Acl {
            return Err(CopyError::PeerAccessNotEnabled(local, remote));
        }
        if faults.pair_hang_ms > 0 && cfg.pair_hang_on.is_none_or(|dev| dev == stream_device) {
            std::thread::sleep(std::time::Duration::from_millis(faults.pair_hang_ms));
            // The caller may have given up and freed a buffer meanwhile: on silicon the copy
            // would have written into freed memory (counted: `freed_under_copy`).
            if memory::locate(dst as usize, count) != d || memory::locate(src as usize, count) != s
            {
                memory::count_freed_under_copy();
                return Err(bad("a buffer was freed while the copy hung"));
            }
        }
    }
    let buffers: Vec<usize> = [dst as usize, src as usize]
        .into_iter()
        .filter_map(memory::base_of)
        .collect();
    // CHD_FAKE_HANG_DEVICES: the copy is enqueued and never runs while the device hangs.
    if let Some(&dev) = timed_on
        .iter()
        .chain(other.iter())
        .find(|&&d| faults.hangs(d))
    {
        timing::enqueue_hung_copy(stream, api, dev, buffers)
            .map_err(|_| CopyError::InvalidStream)?;
        return Ok(());
    }
    // SAFETY: the caller guarantees both ranges are valid for `count` bytes; device ranges
    // were checked against live allocations above. `ptr::copy` tolerates overlap.
    unsafe { std::ptr::copy(src.cast::<u8>(), dst.cast::<u8>(), count) };
    if matches!(d, Location::Device(_)) {
        memory::note_written(dst as usize, count);
    }
    if let Some(dev) = timed_on {
        let cpu = device::current_cpu();
        let gbps = match peer {
            Some((src_dev, dst_dev)) if direct => cfg.peer_copy_gbps(
                src_dev,
                dst_dev,
                peer_rank(stream_device, src_dev, dst_dev),
                cpu,
            ),
            // Host-staged: device to pinned host memory, then host to the other device.
            Some(_) => cfg.staged_gbps,
            // Same-device device-to-device (HBM to HBM): the device's own rate, whatever
            // the CPU; host <-> device: the CPU rules, else the device's H2D rate.
            None if other == Some(dev) => cfg.d2d_gbps(dev) * load_factor(dev),
            None => cfg.gbps(dev, cpu) * load_factor(dev),
        };
        // bytes / (GB/s) = nanoseconds, plus the fixed cost of a copy, with the size's dip.
        let ns = cfg.copy_ns(count as u64, gbps);
        crate::cost::charge_copy(ns);
        if peer.is_none() {
            let host = if d == Location::Host {
                dst
            } else {
                src.cast_mut()
            };
            if memory::pinned_home(host as usize, count).is_some_and(|home| home != dev) {
                crate::cost::count_unportable_copy();
            }
        }
        // The stream was checked above; it can only vanish if another thread destroys it
        // while copying, which is the caller's race; the bytes are copied regardless.
        let _: Result<(), TimingError> = timing::enqueue_copy(stream, api, ns, buffers);
        timing::count_copy(stream, api);
        bump(dev);
        if let Some(o) = other.filter(|&o| o != dev) {
            bump(o);
        }
    }
    Ok(())
}

/// A gemm in flight on `device` (cuBLAS) slows its own copies by `CHD_FAKE_LOAD_COPY_FACTOR`.
fn load_factor(device: usize) -> f64 {
    if crate::cublas::loaded(device) {
        config::get().load_copy_factor
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::{peer_rank, peer_route};

    #[test]
    fn peer_copies_need_access_from_the_issuing_device() {
        // Issued on the source's stream: a write into the destination's memory.
        assert_eq!(peer_route(0, 0, 5), (0, 5));
        // Issued on the destination's stream: a read of the source's memory.
        assert_eq!(peer_route(5, 0, 5), (5, 0));
        // Stream on neither device: the source's access.
        assert_eq!(peer_route(3, 5, 0), (5, 0));
    }

    #[test]
    fn peer_copies_belong_to_the_rank_owning_the_stream() {
        // Pair (0, 5): device 0 is rank 0.
        assert_eq!(peer_rank(0, 0, 5), 0);
        assert_eq!(peer_rank(0, 5, 0), 0);
        assert_eq!(peer_rank(5, 0, 5), 1);
        assert_eq!(peer_rank(5, 5, 0), 1);
        // Stream on neither device: the source's rank.
        assert_eq!(peer_rank(3, 5, 0), 1);
        assert_eq!(peer_rank(3, 0, 5), 0);
    }
}
