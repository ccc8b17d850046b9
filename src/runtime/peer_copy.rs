//! One ordered peer copy cell (`chd probe p2p`): `iterations` timed device-to-device copies
//! from a buffer on `src` to a buffer on `dst`, issued by one thread on a stream of `src`,
//! after `warmup` untimed ones, timed with events on that stream. Peer access is opened
//! before (`PeerLink::open`: queried and enabled both ways) and closed after (what chd
//! enabled is disabled again), whatever happened between; every buffer, event and the
//! stream are released on every path (RAII guards; the stream is synchronized first), except
//! after a timeout: then they and the peer access are kept until the copy in flight is done
//! (`stuck_work`).
//!
//! The data check reads the destination back on a stream of `dst`, which owns that memory.
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
    alloc_error, copy_and_wait, copy_error, guard, refuse_quarantined, stream_guard,
    time_device_copies, timing_error, unless_lost, ApiError, CellWork, DeviceApi, Handle,
    HostBuffer,
};
use super::pattern::{check_copy, fill_pattern};
use super::peer_access::{PeerLink, PeerRoute};
use super::stream_latch::Latch;
use super::stuck_work::Deadline;
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
    for d in [src, dst] {
        refuse_quarantined(api, d)?;
    }
    let link = PeerLink::open(api, [src, dst]);
    let route = link.route.clone();
    let result = match &route {
        PeerRoute::Refused(why) => {
            link.close(api);
            Err(ProbeError::Unsupported(format!(
                "device {src} -> device {dst}: peer access refused ({why}); this runtime \
                 cannot copy between devices without it"
            )))
        }
        PeerRoute::Direct | PeerRoute::Staged(_) => timed(api, (src, dst), bytes, params, link),
    };
    Ok(PeerCopy {
        bytes_per_second: result?,
        method: route.method(),
    })
}

/// The copies themselves: buffers on both devices, stream and events on `src`. After a
/// timeout everything is kept (`stuck_work`), with the peer access `link` opened, to close
/// once the work is done.
fn timed(
    api: &dyn DeviceApi,
    (src, dst): (i32, i32),
    bytes: usize,
    params: &DeviceCopyParams,
    link: PeerLink,
) -> Result<f64, ProbeError> {
    let timing_error = unless_lost(api, timing_error);
    let alloc_error = |bytes| unless_lost(api, alloc_error(bytes));
    let device = |d: i32| {
        api.set_device(d)
            .map_err(|e: ApiError| ProbeError::Device(e.to_string()))
    };
    let staged = (|| {
        device(dst)?;
        let to = guard(api, api.device_alloc(bytes), <dyn DeviceApi>::device_free)
            .map_err(alloc_error(bytes))?;
        device(src)?;
        let from = guard(api, api.device_alloc(bytes), <dyn DeviceApi>::device_free)
            .map_err(alloc_error(bytes))?;
        let start = guard(api, api.event_create(), <dyn DeviceApi>::event_destroy)
            .map_err(&timing_error)?;
        let end = guard(api, api.event_create(), <dyn DeviceApi>::event_destroy)
            .map_err(&timing_error)?;
        // The data check's host side: runtime-allocated (ACL's async copies need it), with
        // the latch word the timed copies' stream waits on (where it can).
        let head = bytes.min(1 << 20);
        let host = HostBuffer::with_latch_word(api, head, HostMemory::Pinned)
            .map_err(alloc_error(head))?;
        let stream = stream_guard(api).map_err(&timing_error)?;
        Ok(CellWork {
            devices: vec![src, dst],
            stream,
            events: vec![end, start],
            device_memory: vec![(to, bytes), (from, bytes)],
            host_memory: vec![host],
        })
    })();
    let mut work = match staged {
        Ok(work) => work,
        Err(e) => {
            link.close(api);
            return Err(e);
        }
    };
    let mut latch = Latch::new(work.host_memory[0].latch_word());
    let handles = (
        work.device_memory[1].0.handle,
        work.device_memory[0].0.handle,
        work.stream.handle,
        (work.events[1].handle, work.events[0].handle),
    );
    let result = copies(
        api,
        (src, dst),
        (&mut work.host_memory[0], &mut latch),
        handles,
        bytes,
        params,
    );
    if matches!(result, Err(ProbeError::Timeout(_))) {
        // Peer access stays open under the copy in flight; closed with the rest once done.
        return work.finish(api, result, link.enabled_directions());
    }
    drop(work);
    link.close(api);
    result
}

/// Copy `bytes` of `device`'s memory at `from` into the host buffer `into` on a stream and
/// event of `device`'s own, made and released here (kept by the stuck work after a timeout;
/// the memory itself belongs to the cell, which keeps it then too).
fn read_back(
    api: &dyn DeviceApi,
    device: i32,
    (into, from, bytes): (Handle, Handle, usize),
    deadline: &Deadline,
    on_copy: &dyn Fn(ApiError) -> ProbeError,
) -> Result<(), ProbeError> {
    let timing_error = unless_lost(api, timing_error);
    api.set_device(device)
        .map_err(|e| ProbeError::Device(e.to_string()))?;
    let event =
        guard(api, api.event_create(), <dyn DeviceApi>::event_destroy).map_err(&timing_error)?;
    let stream = stream_guard(api).map_err(&timing_error)?;
    let result = copy_and_wait(
        api,
        (into, from, bytes),
        Direction::D2h,
        (stream.handle, event.handle),
        deadline,
        on_copy,
    );
    CellWork {
        devices: vec![device],
        stream,
        events: vec![event],
        device_memory: Vec::new(),
        host_memory: Vec::new(),
    }
    .finish(api, result, Vec::new())
}

/// One cell's copies from `from` (on `src`) to `to` (on `dst`), every wait by the cell's
/// deadline.
fn copies(
    api: &dyn DeviceApi,
    (src, dst): (i32, i32),
    (host, latch): (&mut HostBuffer<'_, dyn DeviceApi + '_>, &mut Latch),
    (from, to, stream, (start, end)): (Handle, Handle, Handle, (Handle, Handle)),
    bytes: usize,
    params: &DeviceCopyParams,
) -> Result<f64, ProbeError> {
    let copy_error = unless_lost(api, copy_error);
    let timing_error = unless_lost(api, timing_error);
    let deadline = Deadline::for_cell();
    let head = bytes.min(1 << 20);
    let mut expected = vec![0u8; head];
    fill_pattern(&mut expected);
    host.as_mut_slice().copy_from_slice(&expected);
    copy_and_wait(
        api,
        (from, host.as_handle(), head),
        Direction::H2d,
        (stream, end),
        &deadline,
        &copy_error,
    )?;

    let ms = time_device_copies(
        api,
        latch,
        (to, from, bytes),
        stream,
        (start, end),
        (params.warmup, params.iterations),
        &deadline,
        &copy_error,
        &timing_error,
    )?;

    // The head of the destination holds what the source held: read back on a stream of
    // `dst`, the device that owns that memory (CANN documents a host copy on the owner's
    // stream only; CUDA's unified addressing would take `src`'s stream too).
    host.as_mut_slice().fill(0);
    read_back(
        api,
        dst,
        (host.as_handle(), to, head),
        &deadline,
        &copy_error,
    )?;
    // The cell's stream and events are `src`'s: released with it current.
    api.set_device(src)
        .map_err(|e| ProbeError::Device(e.to_string()))?;
    check_copy(&expected, host.as_mut_slice())?;
    Ok(bytes as f64 * f64::from(params.iterations) / (f64::from(ms) / 1e3))
}
