//! One ordered peer copy cell (`chd probe p2p`): `iterations` timed device-to-device copies
//! from a buffer on `src` to a buffer on `dst`, issued by one thread on a stream of `src`,
//! after `warmup` untimed ones, timed with events on that stream. Peer access is opened
//! before (`PeerLink::open`: queried and enabled both ways) and closed after (what chd
//! enabled is disabled again), whatever happened between; every buffer, event and the
//! stream are released on every path (RAII guards; the stream is synchronized first).
//!
//! The copy is `cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream)` /
//! `aclrtMemcpyAsync(dst, n, src, n, ACL_MEMCPY_DEVICE_TO_DEVICE, stream)` through
//! `DeviceApi::copy_device_async`. Checked against the CUDA Runtime API reference:
//! `cudaMemcpyPeerAsync` "Copies memory from one device to memory on another device", and the
//! Unified Addressing module says that with unified addressing (every 64-bit process on
//! compute capability 2.0+) "it is not necessary to specify information about the pointers
//! specified to cudaMemcpy() and other copy functions", so `cudaMemcpyAsync` device-to-device
//! finds both devices from the pointers (the pair probe's copy method relies on the same).
//! Without peer access the runtime still copies, staged through host memory, so such a cell
//! is measured and named `copy-staged`. CANN's `aclrtMemcpyAsync` (application development
//! guide, CANN 6.0.1 and 8.0.0): kind `ACL_MEMCPY_DEVICE_TO_DEVICE` is "memory copy within a
//! device or between devices", and "to perform memory copy between two devices, call
//! aclrtDeviceCanAccessPeer ..., call aclrtDeviceEnablePeerAccess ..., and then call this
//! API"; there is no staged fallback (the fake refuses such a copy), so a refused pair is an
//! error cell naming the refusal.

use super::device_copy::{
    alloc_error, copy_and_wait, copy_error, guard, stream_guard, time_device_copies, timing_error,
    unless_lost, ApiError, DeviceApi, HostBuffer,
};
use super::pattern::{check_copy, fill_pattern};
use super::peer_access::{PeerLink, PeerRoute};
use super::stream_latch::Latch;
use super::{DeviceCopyParams, Direction, HostMemory, ProbeError};

/// What one peer copy cell measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PeerCopy {
    /// Bytes of one copy over its time.
    pub bytes_per_second: f64,
    /// `copy` (over the link, peer access enabled) or `copy-staged` (peer access refused; the
    /// runtime staged the copies through host memory).
    pub method: &'static str,
}

/// Measure the ordered pair `src` -> `dst` on the calling thread.
pub(crate) fn measure(
    api: &dyn DeviceApi,
    src: i32,
    dst: i32,
    params: &DeviceCopyParams,
) -> Result<PeerCopy, ProbeError> {
    if src == dst {
        return Err(ProbeError::UnknownDevice(format!(
            "{src}>{dst}: a peer copy needs two devices"
        )));
    }
    let bytes = usize::try_from(params.size_bytes)
        .map_err(|_| ProbeError::Timing(format!("{} bytes do not fit", params.size_bytes)))?;
    if bytes == 0 || params.iterations == 0 {
        return Err(ProbeError::Timing(
            "a cell needs a size and at least one iteration".into(),
        ));
    }
    let link = PeerLink::open(api, [src, dst]);
    let route = link.route.clone();
    let result = match &route {
        PeerRoute::Refused(why) => Err(ProbeError::Unsupported(format!(
            "device {src} -> device {dst}: peer access refused ({why}); this runtime cannot \
             copy between devices without it"
        ))),
        PeerRoute::Direct | PeerRoute::Staged(_) => timed(api, src, dst, bytes, params),
    };
    link.close(api);
    Ok(PeerCopy {
        bytes_per_second: result?,
        method: route.method(),
    })
}

/// The copies themselves: buffers on both devices, stream and events on `src`.
fn timed(
    api: &dyn DeviceApi,
    src: i32,
    dst: i32,
    bytes: usize,
    params: &DeviceCopyParams,
) -> Result<f64, ProbeError> {
    let copy_error = unless_lost(api, copy_error);
    let timing_error = unless_lost(api, timing_error);
    let alloc_error = |bytes| unless_lost(api, alloc_error(bytes));
    let device = |d: i32| {
        api.set_device(d)
            .map_err(|e: ApiError| ProbeError::Device(e.to_string()))
    };
    device(dst)?;
    let to = guard(api, api.device_alloc(bytes), <dyn DeviceApi>::device_free)
        .map_err(alloc_error(bytes))?;
    device(src)?;
    let from = guard(api, api.device_alloc(bytes), <dyn DeviceApi>::device_free)
        .map_err(alloc_error(bytes))?;
    let start =
        guard(api, api.event_create(), <dyn DeviceApi>::event_destroy).map_err(&timing_error)?;
    let end =
        guard(api, api.event_create(), <dyn DeviceApi>::event_destroy).map_err(&timing_error)?;
    // The data check's host side: runtime-allocated (ACL's async copies need it).
    let head = bytes.min(1 << 20);
    // Pinned, with the latch word the timed copies' stream waits on (where it can).
    let mut host =
        HostBuffer::with_latch_word(api, head, HostMemory::Pinned).map_err(alloc_error(head))?;
    let mut latch = Latch::new(host.latch_word());
    // Last, so it is synchronized and destroyed before the events and buffers go.
    let stream = stream_guard(api).map_err(&timing_error)?;

    let mut expected = vec![0u8; head];
    fill_pattern(&mut expected);
    host.as_mut_slice().copy_from_slice(&expected);
    copy_and_wait(
        api,
        (from.handle, host.as_handle(), head),
        Direction::H2d,
        stream.handle,
        &copy_error,
    )?;

    let ms = time_device_copies(
        api,
        &mut latch,
        (to.handle, from.handle, bytes),
        stream.handle,
        (start.handle, end.handle),
        (params.warmup, params.iterations),
        &copy_error,
        &timing_error,
    )?;

    // The head of the destination holds what the source held.
    host.as_mut_slice().fill(0);
    copy_and_wait(
        api,
        (host.as_handle(), to.handle, head),
        Direction::D2h,
        stream.handle,
        &copy_error,
    )?;
    check_copy(&expected, host.as_mut_slice())?;
    Ok(bytes as f64 * f64::from(params.iterations) / (f64::from(ms) / 1e3))
}
