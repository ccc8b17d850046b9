//! Timing host <-> device copies through any stream-and-event runtime (CUDA, ACL): the one
//! measurement routine both accelerator backends share. The calling thread is already bound
//! to the cell's CPU; the host buffer is allocated and first-touched here, once per
//! `Staging` (a run of cells of one CPU and size on every device in turn), the copies are
//! timed with device events around `iterations` async copies after `warmup` untimed ones, and
//! every allocation, stream and event is released on every path (RAII guards). The stream is
//! synchronized before it is destroyed and before anything its copies use is freed, on error
//! paths too (a copy enqueued before a failure may still be running), and the only host
//! memory a copy touches is the staging's buffer, runtime-allocated pinned memory for pinned
//! cells (ACL's `aclrtMemcpyAsync` is undefined on pageable memory).

// Views pinned host memory the runtime allocated (a raw pointer) as a byte slice.
#![allow(unsafe_code)]

use super::device_wait;
use super::pattern::{check_copy, fill_pattern};
use super::stream_latch::{self, Latch, WORD_BYTES};
use super::stuck_work::{self, Deadline, LeakedHost, Stuck};
use super::{CopyParams, DeviceInfo, Direction, HostMemory, HostStaging, ProbeError};

pub(crate) use super::device_api::DeviceApi;
pub use super::device_api::{ApiError, Handle};

fn warn_release(result: Result<(), ApiError>) {
    if let Err(e) = result {
        tracing::warn!("releasing a runtime resource: {e}");
    }
}

/// Host memory owned for one measurement.
pub(crate) enum HostBuffer<'a, A: DeviceApi + ?Sized> {
    /// `len` bytes for copies at `ptr`, in an allocation of `alloc_len` bytes: with a latch
    /// word, the word follows the copy bytes on its own cache line.
    Pinned {
        api: &'a A,
        ptr: Handle,
        len: usize,
        alloc_len: usize,
    },
    Pageable(Vec<u8>),
}

/// Where a latch word starts after `len` copy bytes: the next cache line.
fn word_offset(len: usize) -> usize {
    len.div_ceil(WORD_BYTES) * WORD_BYTES
}

impl<'a, A: DeviceApi + ?Sized> HostBuffer<'a, A> {
    /// Allocate on the calling thread and first-touch every page here.
    pub(crate) fn new(api: &'a A, len: usize, kind: HostMemory) -> Result<Self, ApiError> {
        Self::alloc(api, len, kind, false)
    }

    /// [`HostBuffer::new`], pinned memory followed by a zeroed latch word
    /// ([`HostBuffer::latch_word`]) where the runtime's streams can wait on one.
    pub(crate) fn with_latch_word(
        api: &'a A,
        len: usize,
        kind: HostMemory,
    ) -> Result<Self, ApiError> {
        Self::alloc(api, len, kind, api.has_stream_wait())
    }

    fn alloc(api: &'a A, len: usize, kind: HostMemory, word: bool) -> Result<Self, ApiError> {
        let buf = match kind {
            HostMemory::Pinned => {
                let alloc_len = if word {
                    word_offset(len) + WORD_BYTES
                } else {
                    len
                };
                let ptr = api.host_alloc_pinned(alloc_len)?;
                // Writing every byte first-touches the pages on this (bound) thread's node,
                // and zeroes the latch word.
                // SAFETY: `ptr` is a fresh allocation of `alloc_len` bytes.
                unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 0, alloc_len) };
                HostBuffer::Pinned {
                    api,
                    ptr,
                    len,
                    alloc_len,
                }
            }
            HostMemory::Pageable => HostBuffer::Pageable(vec![0u8; len]),
        };
        Ok(buf)
    }

    /// The copy bytes (never the latch word).
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        match self {
            // SAFETY: `ptr` is a live allocation of at least `len` bytes owned by this guard.
            HostBuffer::Pinned { ptr, len, .. } => unsafe {
                std::slice::from_raw_parts_mut(ptr.cast::<u8>(), *len)
            },
            HostBuffer::Pageable(v) => v.as_mut_slice(),
        }
    }

    pub(crate) fn as_handle(&mut self) -> Handle {
        self.as_mut_slice().as_mut_ptr().cast()
    }

    /// The latch word of a buffer made by [`HostBuffer::with_latch_word`], if it has one: a
    /// zeroed, 64-byte aligned word of the pinned allocation, alive as long as the buffer.
    pub(crate) fn latch_word(&self) -> Option<Handle> {
        match self {
            HostBuffer::Pinned {
                ptr,
                len,
                alloc_len,
                ..
            } if *alloc_len > *len => {
                // SAFETY: the word lies inside the allocation (`alloc` sized it so).
                Some(unsafe { ptr.cast::<u8>().add(word_offset(*len)) }.cast())
            }
            _ => None,
        }
    }

    /// Give the memory up without freeing it (work in flight may still use it): what a stuck
    /// cell keeps.
    pub(crate) fn leak(self) -> LeakedHost {
        let this = std::mem::ManuallyDrop::new(self);
        match &*this {
            HostBuffer::Pinned { ptr, alloc_len, .. } => {
                LeakedHost::Pinned(stuck_work::addr(*ptr), *alloc_len)
            }
            HostBuffer::Pageable(v) => {
                // SAFETY: `this` is never dropped, so the Vec is moved out exactly once.
                LeakedHost::Pageable(unsafe { std::ptr::read(v) })
            }
        }
    }

    /// Bytes of pinned memory held (0 for pageable memory).
    pub(crate) fn pinned_len(&self) -> usize {
        match self {
            HostBuffer::Pinned { alloc_len, .. } => *alloc_len,
            HostBuffer::Pageable(_) => 0,
        }
    }
}

impl<A: DeviceApi + ?Sized> Drop for HostBuffer<'_, A> {
    fn drop(&mut self) {
        if let HostBuffer::Pinned { api, ptr, .. } = self {
            warn_release(api.host_free_pinned(*ptr));
        }
    }
}

/// A runtime resource released by `release` on drop.
pub(crate) struct Guard<'a, A: DeviceApi + ?Sized> {
    api: &'a A,
    pub(crate) handle: Handle,
    release: fn(&A, Handle) -> Result<(), ApiError>,
}

impl<A: DeviceApi + ?Sized> Drop for Guard<'_, A> {
    fn drop(&mut self) {
        warn_release((self.release)(self.api, self.handle));
    }
}

impl<A: DeviceApi + ?Sized> Guard<'_, A> {
    /// Give the resource up without releasing it (work in flight may still use it): its
    /// address, for a stuck cell to keep.
    pub(crate) fn leak(self) -> usize {
        let handle = self.handle;
        std::mem::forget(self);
        stuck_work::addr(handle)
    }
}

pub(crate) fn guard<'a, A: DeviceApi + ?Sized>(
    api: &'a A,
    handle: Result<Handle, ApiError>,
    release: fn(&A, Handle) -> Result<(), ApiError>,
) -> Result<Guard<'a, A>, ApiError> {
    Ok(Guard {
        api,
        handle: handle?,
        release,
    })
}

/// Wait for everything enqueued on `stream`, then destroy it. CANN wants
/// `aclrtSynchronizeStream` before `aclrtDestroyStream`; after a failed enqueue the copies
/// enqueued before it may still run, and the buffers they use are freed right after.
fn synchronize_and_destroy<A: DeviceApi + ?Sized>(api: &A, stream: Handle) -> Result<(), ApiError> {
    warn_release(api.stream_synchronize(stream));
    api.stream_destroy(stream)
}

/// A new stream, synchronized and destroyed on drop. Declare it after everything its work
/// uses (buffers, events), so that it is released first.
pub(crate) fn stream_guard<A: DeviceApi + ?Sized>(api: &A) -> Result<Guard<'_, A>, ApiError> {
    guard(api, api.stream_create(), synchronize_and_destroy::<A>)
}

pub(crate) fn alloc_error(bytes: usize) -> impl Fn(ApiError) -> ProbeError {
    move |e| ProbeError::Alloc {
        bytes: bytes as u64,
        detail: e.to_string(),
    }
}

/// `wrap`, except that the runtime's device-lost code is a [`ProbeError::Device`].
pub(crate) fn unless_lost<'a, A: DeviceApi + ?Sized>(
    api: &'a A,
    wrap: impl Fn(ApiError) -> ProbeError + 'a,
) -> impl Fn(ApiError) -> ProbeError + 'a {
    move |e| {
        if api.device_lost(e.code) {
            ProbeError::Device(e.to_string())
        } else {
            wrap(e)
        }
    }
}

pub(crate) fn copy_error(e: ApiError) -> ProbeError {
    ProbeError::Copy(e.to_string())
}

pub(crate) fn timing_error(e: ApiError) -> ProbeError {
    ProbeError::Timing(e.to_string())
}

/// Copy `bytes` from `src` to `dst` in `direction` on `stream` and wait for it, by
/// `deadline` (through `event`, recorded after the copy): how the copy cells stage their
/// check pattern in and read it back, outside the timed copies.
pub(crate) fn copy_and_wait<A: DeviceApi + ?Sized>(
    api: &A,
    (dst, src, bytes): (Handle, Handle, usize),
    direction: Direction,
    (stream, event): (Handle, Handle),
    deadline: &Deadline,
    on_copy: &dyn Fn(ApiError) -> ProbeError,
) -> Result<(), ProbeError> {
    api.copy_async(dst, src, bytes, direction, stream)
        .map_err(on_copy)?;
    device_wait::wait_stream(api, stream, event, deadline, on_copy)
}

/// Milliseconds of `iterations` device-to-device copies of `bytes` from `src` to `dst` on
/// `stream` (the devices may differ: a peer copy), between `start` and `end` recorded on that
/// stream, after `warmup` untimed ones, the stream held by `latch` while they are enqueued
/// ([`stream_latch::time_held`]). `on_copy` and `on_timing` map a failed copy or event call.
/// The copy routine the same-device and the peer copy cells share.
#[allow(clippy::too_many_arguments)]
pub(crate) fn time_device_copies<A: DeviceApi + ?Sized>(
    api: &A,
    latch: &mut Latch,
    (dst, src, bytes): (Handle, Handle, usize),
    stream: Handle,
    events: (Handle, Handle),
    counts: (u32, u32),
    deadline: &Deadline,
    on_copy: &dyn Fn(ApiError) -> ProbeError,
    on_timing: &dyn Fn(ApiError) -> ProbeError,
) -> Result<f32, ProbeError> {
    let enqueue = || api.copy_device_async(dst, src, bytes, stream);
    stream_latch::time_held(
        api, latch, stream, events, counts, deadline, &enqueue, on_copy, on_timing,
    )
}

/// The guards of one cell's device work: released on drop, or, after a timeout, kept as a
/// [`Stuck`] entry ([`CellWork::keep_stuck`]).
pub(crate) struct CellWork<'a, A: DeviceApi + ?Sized> {
    pub(crate) devices: Vec<i32>,
    /// Declared first: synchronized and destroyed before the rest goes.
    pub(crate) stream: Guard<'a, A>,
    /// `end` first: the event recorded last on the stream.
    pub(crate) events: Vec<Guard<'a, A>>,
    pub(crate) device_memory: Vec<(Guard<'a, A>, usize)>,
    pub(crate) host_memory: Vec<HostBuffer<'a, A>>,
}

impl<'a, A: DeviceApi + ?Sized> CellWork<'a, A> {
    /// `result` is the cell's; after a timeout everything is given to the runtime's stuck
    /// work instead of being released (see `stuck_work`), with `peer_access` to undo once
    /// the work is done.
    pub(crate) fn finish<T>(
        self,
        api: &A,
        result: Result<T, ProbeError>,
        peer_access: Vec<(i32, i32)>,
    ) -> Result<T, ProbeError> {
        if matches!(result, Err(ProbeError::Timeout(_))) {
            self.keep_stuck(api, peer_access);
        }
        result
    }

    fn keep_stuck(self, api: &A, peer_access: Vec<(i32, i32)>) {
        let CellWork {
            devices,
            stream,
            events,
            device_memory,
            host_memory,
        } = self;
        api.stuck_work().keep(Stuck {
            devices,
            stream: stream.leak(),
            events: events.into_iter().map(Guard::leak).collect(),
            device_memory: device_memory
                .into_iter()
                .map(|(g, bytes)| (g.leak(), bytes))
                .collect(),
            host_memory: host_memory.into_iter().map(HostBuffer::leak).collect(),
            peer_access,
        });
    }
}

/// [`ProbeError::Quarantined`] when `device` has stuck work: nothing more is queued behind
/// a copy that never finished.
pub(crate) fn refuse_quarantined<A: DeviceApi + ?Sized>(
    api: &A,
    device: i32,
) -> Result<(), ProbeError> {
    if api.stuck_work().holds(device) {
        return Err(ProbeError::Quarantined(format!(
            "device {device}: a copy cell's work on it did not finish in time; no cells \
             until it does"
        )));
    }
    Ok(())
}

pub(crate) fn measure<A: DeviceApi + ?Sized>(
    api: &A,
    device: i32,
    params: &CopyParams,
) -> Result<f64, ProbeError> {
    Staging::new(api, params)?.measure(device, params)
}

fn check_params<A: DeviceApi + ?Sized>(api: &A, params: &CopyParams) -> Result<usize, ProbeError> {
    let bytes = usize::try_from(params.size_bytes)
        .map_err(|_| ProbeError::Timing(format!("{} bytes do not fit", params.size_bytes)))?;
    if bytes == 0 || params.iterations == 0 {
        return Err(ProbeError::Timing(
            "a cell needs a size and at least one iteration".into(),
        ));
    }
    if params.host_memory == HostMemory::Pageable {
        if let Some(why) = api.pageable_refusal() {
            return Err(ProbeError::Alloc {
                bytes: params.size_bytes,
                detail: format!("pageable host memory: {why}"),
            });
        }
    }
    Ok(bytes)
}

/// The host side of a run of cells that share a CPU, a size and a host memory kind: the
/// copy buffer, allocated and first-touched once on the calling (bound) thread (an h2d cell
/// also reads the device back into its head to check the copy). Each cell of the run then only allocates its device buffer, stream and events. Pinned
/// memory comes from `host_alloc_pinned`, which allocates it portable (pinned for every
/// device, not only the current one), so one buffer serves every device in turn. Everything
/// is freed on drop.
pub(crate) struct Staging<'a, A: DeviceApi + ?Sized> {
    api: &'a A,
    bytes: usize,
    memory: HostMemory,
    /// `None` after a cell timed out with it under its DMA (kept by the runtime's stuck
    /// work): the next cell allocates and first-touches a new one.
    host: Option<(HostBuffer<'a, A>, Latch)>,
}

impl<'a, A: DeviceApi + ?Sized> Staging<'a, A> {
    /// The staging for cells of `params`' size and memory. Its host buffer is allocated and
    /// first-touched by the first cell, after that cell set its device: pinned memory
    /// allocated on a thread that never set one would create device 0's context (CUDA's
    /// implicit default), and with it memory and a process entry on a GPU chd may not probe.
    pub(crate) fn new(api: &'a A, params: &CopyParams) -> Result<Self, ProbeError> {
        let bytes = check_params(api, params)?;
        Ok(Staging {
            api,
            bytes,
            memory: params.host_memory,
            host: None,
        })
    }

    /// The host buffer and its latch, allocated (and first-touched) here if there is none.
    fn host(&mut self) -> Result<&mut (HostBuffer<'a, A>, Latch), ProbeError> {
        if self.host.is_none() {
            let host = HostBuffer::with_latch_word(self.api, self.bytes, self.memory)
                .map_err(alloc_error(self.bytes))?;
            // Pageable copies are never held (`stream_latch`, `host-synchronous`).
            let latch = match self.memory {
                HostMemory::Pinned => Latch::new(host.latch_word()),
                HostMemory::Pageable => Latch::host_synchronous(),
            };
            self.host = Some((host, latch));
        }
        Ok(self.host.as_mut().expect("allocated above"))
    }

    /// Pinned host bytes held now (the copy buffer and its latch word).
    pub(crate) fn pinned_bytes(&self) -> u64 {
        self.host.as_ref().map_or(0, |(h, _)| h.pinned_len() as u64)
    }

    /// Measure one cell of this staging's size and memory on `device`. Its device work must
    /// finish within `probe.cell_timeout`; past it the cell is a timeout and its buffers,
    /// this staging's host buffer included, are kept by the runtime's stuck work, never freed
    /// under the DMA (the next cell gets a new host buffer).
    pub(crate) fn measure(&mut self, device: i32, params: &CopyParams) -> Result<f64, ProbeError> {
        let bytes = check_params(self.api, params)?;
        super::check_staging_fits(self.bytes as u64, self.memory, params)?;
        let api = self.api;
        refuse_quarantined(api, device)?;
        let timing_error = unless_lost(api, timing_error);
        let alloc_error = |bytes| unless_lost(api, alloc_error(bytes));
        api.set_device(device)
            .map_err(|e| ProbeError::Device(e.to_string()))?;
        self.host()?;
        let dev =
            guard(api, api.device_alloc(bytes), A::device_free).map_err(alloc_error(bytes))?;
        let start = guard(api, api.event_create(), A::event_destroy).map_err(&timing_error)?;
        let end = guard(api, api.event_create(), A::event_destroy).map_err(&timing_error)?;
        let stream = stream_guard(api).map_err(&timing_error)?;
        let (mut host, mut latch) = self.host.take().expect("allocated above");
        let result = timed_host_copies(
            api,
            (&mut host, &mut latch),
            (dev.handle, stream.handle, (start.handle, end.handle)),
            bytes,
            params,
        );
        if matches!(result, Err(ProbeError::Timeout(_))) {
            let work = CellWork {
                devices: vec![device],
                stream,
                events: vec![end, start],
                device_memory: vec![(dev, bytes)],
                host_memory: vec![host],
            };
            return work.finish(api, result, Vec::new());
        }
        // Released here (the stream, declared last, first), after the work is done.
        drop((stream, end, start, dev));
        self.host = Some((host, latch));
        result
    }
}

/// The copies of one host <-> device cell on `stream`: the check pattern staged, the timed
/// copies, the check, every wait bounded by the cell's deadline.
fn timed_host_copies<A: DeviceApi + ?Sized>(
    api: &A,
    (host, latch): (&mut HostBuffer<'_, A>, &mut Latch),
    (dev, stream, (start, end)): (Handle, Handle, (Handle, Handle)),
    bytes: usize,
    params: &CopyParams,
) -> Result<f64, ProbeError> {
    let copy_error = unless_lost(api, copy_error);
    let timing_error = unless_lost(api, timing_error);
    let deadline = Deadline::for_cell();
    let head = bytes.min(1 << 20);
    // The source holds the pattern: the host buffer for h2d; for d2h the device buffer,
    // filled from a pattern staged through the (then cleared) host buffer.
    let mut expected = vec![0u8; head];
    fill_pattern(&mut expected);
    fill_pattern(host.as_mut_slice());
    let (dst, src) = match params.direction {
        Direction::H2d => (dev, host.as_handle()),
        Direction::D2h => {
            copy_and_wait(
                api,
                (dev, host.as_handle(), bytes),
                Direction::H2d,
                (stream, end),
                &deadline,
                &copy_error,
            )?;
            host.as_mut_slice().fill(0);
            (host.as_handle(), dev)
        }
    };

    let enqueue = || api.copy_async(dst, src, bytes, params.direction, stream);
    let ms = stream_latch::time_held(
        api,
        latch,
        stream,
        (start, end),
        (params.warmup, params.iterations),
        &deadline,
        &enqueue,
        &copy_error,
        &timing_error,
    )?;

    if params.direction == Direction::H2d {
        // Read the head of the device buffer back over the (cleared) head of the host
        // buffer: runtime-allocated memory, as ACL's async copies require, and no second
        // pinned buffer. The next cell fills the pattern in again.
        host.as_mut_slice()[..head].fill(0);
        copy_and_wait(
            api,
            (host.as_handle(), dev, head),
            Direction::D2h,
            (stream, end),
            &deadline,
            &copy_error,
        )?;
    }
    // d2h: the host buffer already holds what the device sent.
    let got = &host.as_mut_slice()[..head];
    check_copy(&expected, got)?;
    Ok(bytes as f64 * f64::from(params.iterations) / (f64::from(ms) / 1e3))
}

/// The [`HostStaging`] of a stream-and-event runtime (CUDA, ACL).
pub(crate) struct DeviceStaging<'a, A: DeviceApi + ?Sized> {
    pub(crate) devices: &'a [DeviceInfo],
    pub(crate) staging: Staging<'a, A>,
}

impl<A: DeviceApi + ?Sized> HostStaging for DeviceStaging<'_, A> {
    fn measure(&mut self, device: &str, params: &CopyParams) -> Result<f64, ProbeError> {
        let index = super::device_index(self.devices, device)?;
        self.staging.measure(index, params)
    }
    fn pinned_bytes(&self) -> u64 {
        self.staging.pinned_bytes()
    }
}
