//! Timing same-device copies (device memory to device memory of one device: HBM to HBM)
//! through any stream-and-event runtime (CUDA, ACL), with the guards of [`device_copy`]. Two
//! device allocations of the cell's size on the device, a small pinned host buffer that
//! stages the check pattern into the source and reads the destination back, events around
//! `iterations` async device-to-device copies after `warmup` untimed ones. Everything is
//! released on every path, the stream synchronized first, except after a timeout: then it is
//! kept, never freed under the DMA (`stuck_work`).
//!
//! Checked against: the CUDA Runtime API reference, `cudaMemcpyAsync` ("the memory areas may
//! not overlap": two allocations; kind `cudaMemcpyDeviceToDevice`), and CANN's
//! `aclrtMemcpyAsync` (7.0.0 / 8.0.RC3 application development guides): kind
//! `ACL_MEMCPY_DEVICE_TO_DEVICE` covers a copy "within a device or between devices", peer
//! access is a precondition only between devices, addresses must be 64-byte aligned
//! (`aclrtMalloc` and `aclrtMallocHost` memory is), host memory of an async copy must come
//! from `aclrtMallocHost`, and the stream must be synchronized before the copy is known done.
//!
//! [`device_copy`]: super::device_copy

use super::device_copy::{
    alloc_error, copy_and_wait, copy_error, guard, refuse_quarantined, stream_guard,
    time_device_copies, timing_error, unless_lost, CellWork, DeviceApi, Handle, HostBuffer,
};
use super::pattern::{check_copy, fill_pattern};
use super::stream_latch::Latch;
use super::stuck_work::Deadline;
use super::{DeviceCopyParams, Direction, HostMemory, ProbeError};

/// Bytes of the source the pattern check covers (the head of the buffers).
const CHECK_BYTES: usize = 1 << 20;

/// Measure one same-device copy cell on `device`: bytes of one copy times `iterations` over
/// the time the events measured around them.
pub(crate) fn measure<A: DeviceApi + ?Sized>(
    api: &A,
    device: i32,
    params: &DeviceCopyParams,
) -> Result<f64, ProbeError> {
    let bytes = usize::try_from(params.size_bytes)
        .map_err(|_| ProbeError::Timing(format!("{} bytes do not fit", params.size_bytes)))?;
    if bytes == 0 || params.iterations == 0 {
        return Err(ProbeError::Timing(
            "a cell needs a size and at least one iteration".into(),
        ));
    }
    refuse_quarantined(api, device)?;
    let timing_error = unless_lost(api, timing_error);
    let alloc_error = |bytes| unless_lost(api, alloc_error(bytes));
    api.set_device(device)
        .map_err(|e| ProbeError::Device(e.to_string()))?;
    let head = bytes.min(CHECK_BYTES);
    let src = guard(api, api.device_alloc(bytes), A::device_free).map_err(alloc_error(bytes))?;
    let dst = guard(api, api.device_alloc(bytes), A::device_free).map_err(alloc_error(bytes))?;
    // Pinned, with the latch word the timed copies' stream waits on (where it can).
    let mut host =
        HostBuffer::with_latch_word(api, head, HostMemory::Pinned).map_err(alloc_error(head))?;
    let mut latch = Latch::new(host.latch_word());
    let start = guard(api, api.event_create(), A::event_destroy).map_err(&timing_error)?;
    let end = guard(api, api.event_create(), A::event_destroy).map_err(&timing_error)?;
    let stream = stream_guard(api).map_err(&timing_error)?;
    let result = timed(
        api,
        (&mut host, &mut latch),
        (src.handle, dst.handle, bytes),
        (stream.handle, start.handle, end.handle),
        params,
    );
    // After a timeout everything is kept (`stuck_work`); else released, the stream first.
    CellWork {
        devices: vec![device],
        stream,
        events: vec![end, start],
        device_memory: vec![(src, bytes), (dst, bytes)],
        host_memory: vec![host],
    }
    .finish(api, result, Vec::new())
}

/// The copies of one cell: the pattern staged, the timed copies, the check, every wait by the
/// cell's deadline.
fn timed<A: DeviceApi + ?Sized>(
    api: &A,
    (host, latch): (&mut HostBuffer<'_, A>, &mut Latch),
    (src, dst, bytes): (Handle, Handle, usize),
    (stream, start, end): (Handle, Handle, Handle),
    params: &DeviceCopyParams,
) -> Result<f64, ProbeError> {
    let copy_error = unless_lost(api, copy_error);
    let timing_error = unless_lost(api, timing_error);
    let deadline = Deadline::for_cell();
    let head = bytes.min(CHECK_BYTES);
    // Device memory is not zeroed: clear the destination's head (the host buffer is zeros
    // after `HostBuffer::new`), then stage the pattern into the source's head.
    let mut expected = vec![0u8; head];
    fill_pattern(&mut expected);
    copy_and_wait(
        api,
        (dst, host.as_handle(), head),
        Direction::H2d,
        (stream, end),
        &deadline,
        &copy_error,
    )?;
    host.as_mut_slice().copy_from_slice(&expected);
    copy_and_wait(
        api,
        (src, host.as_handle(), head),
        Direction::H2d,
        (stream, end),
        &deadline,
        &copy_error,
    )?;

    let ms = time_device_copies(
        api,
        latch,
        (dst, src, bytes),
        stream,
        (start, end),
        (params.warmup, params.iterations),
        &deadline,
        &copy_error,
        &timing_error,
    )?;

    // Read the destination's head back over the (cleared) host buffer and compare.
    host.as_mut_slice().fill(0);
    copy_and_wait(
        api,
        (host.as_handle(), dst, head),
        Direction::D2h,
        (stream, end),
        &deadline,
        &copy_error,
    )?;
    check_copy(&expected, host.as_mut_slice())?;
    Ok(bytes as f64 * f64::from(params.iterations) / (f64::from(ms) / 1e3))
}
