//! The timed region of every event-timed copy cell (h2d, d2h, same-device, peer, sweeps):
//! the stream is held until every timed copy is enqueued, so the events bracket the copies and
//! not the host's enqueue calls.
//!
//! Without a hold, the stream is drained, the start event recorded and the timed copies
//! enqueued one by one: the start event completes at once and each copy starts when its
//! enqueue call returns, so when one copy is shorter than one enqueue call (a few
//! microseconds: 128 KiB over PCIe, small copies on HBM or NVLink) the events measure the
//! CPU's submission rate. nvbandwidth holds the stream until all work is enqueued precisely to
//! exclude that ("Measurement Details" in its README), as nvbench's `blocking_kernel` does.
//! Which rule each path follows, best first ([`TimingMethod`]):
//!
//! - **`latch-wait-value`** (CUDA): `cuStreamWaitValue32` on a 32-bit word of pinned host
//!   memory (CUDA Driver API: "Work ordered after the operation will block until the given
//!   condition on the memory is satisfied"), reached through the runtime's
//!   `cudaGetDriverEntryPoint[ByVersion]` (see `cuda.rs` for why not libcuda directly). The
//!   word only grows: hold `n` waits for `>= n` (the default cyclic greater-or-equal) and its
//!   release writes `n`, so a stream left behind on a word (a hung copy ahead of its wait)
//!   is already released, whatever later cells do. A driver that refuses it
//!   (`CUDA_ERROR_NOT_SUPPORTED`) falls back to the next.
//! - **`latch-host-function`** (CUDA `cudaLaunchHostFunc`, ACL `aclrtLaunchHostFunc`, CANN
//!   8.3 and later): a host function that returns once the host has enqueued everything ("The
//!   function will be called after currently enqueued work and will block work added after
//!   it"). It calls no runtime API (CUDA: "The host function must not make any CUDA API
//!   calls"; CANN: no resource, synchronization or task calls) and waits at most
//!   [`HOST_FUNCTION_TIMEOUT`], like nvbench's and nvbandwidth's spin kernels: a host stuck
//!   in an enqueue call (a full queue) cannot deadlock the stream, and a latch that let go by
//!   itself makes the cell a timing error.
//! - **`warmup-ahead`** (ACL before CANN 8.3, more than [`MAX_HELD_COPIES`] timed copies):
//!   no latch; the warm-ups are queued right ahead of the start event, undrained, as
//!   `gemm.rs` times its products, so the start event completes only when they have run. That
//!   hides the enqueue only while the warm-ups outlast it; the report says so.
//!
//! - **`host-synchronous`** (pageable host memory): no latch and the drained stream of
//!   before. CUDA documents async copies with pageable memory as possibly synchronous with the
//!   host ("If pageable memory must first be staged to pinned memory, the driver may
//!   synchronize with the stream"): inside an enqueue call, a held stream would never drain.
//!   Such copies are the host's staging as much as the link's, and read as such.
//!
//! Every hold is released on every path (the `Held` guard releases on drop), before the
//! stream is synchronized: a latch nobody releases never drains. At most
//! [`MAX_HELD_COPIES`] copies are queued behind a latch (nvbench: "Do not queue too much work
//! while blocking ... ~32 kernel launches max"), so the host never blocks in an enqueue call
//! while it holds the stream.
//!
//! The method of the last cell measured on a thread is kept for the caller
//! ([`take_last_method`]): the one-shot runs record it with each sample.

// Writes the latch word in pinned host memory the runtime allocated (a raw pointer), and hands
// a host function its data as a raw pointer.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::device_api::{ApiError, DeviceApi, Handle};
use super::device_wait;
use super::stuck_work::Deadline;
use super::ProbeError;

/// How a cell's timed region was held (the `timing` of a sample record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TimingMethod {
    /// The stream waited on a host word (`cuStreamWaitValue32`) until everything was enqueued.
    LatchWaitValue,
    /// A host function held the stream until everything was enqueued.
    LatchHostFunction,
    /// No latch: the warm-ups were queued ahead of the start event.
    WarmupAhead,
    /// Pageable host memory: no latch (the runtime may synchronize the stream inside the
    /// enqueue call to stage the copy, which a held stream would deadlock); the copies are
    /// synchronous with the host, so the host's staging is part of what they measure.
    HostSynchronous,
}

impl TimingMethod {
    /// The label: `latch-wait-value`, `latch-host-function`, `warmup-ahead`.
    pub fn as_str(self) -> &'static str {
        match self {
            TimingMethod::LatchWaitValue => "latch-wait-value",
            TimingMethod::LatchHostFunction => "latch-host-function",
            TimingMethod::WarmupAhead => "warmup-ahead",
            TimingMethod::HostSynchronous => "host-synchronous",
        }
    }

    /// What the label means, for a report.
    pub fn describe(self) -> &'static str {
        match self {
            TimingMethod::LatchWaitValue => {
                "the stream waited on a host flag (cuStreamWaitValue32) until every timed copy was enqueued"
            }
            TimingMethod::LatchHostFunction => {
                "a host function held the stream until every timed copy was enqueued"
            }
            TimingMethod::WarmupAhead => {
                "warm-ups queued ahead of the start event, no latch: where one copy is shorter than one enqueue call, the host's enqueue time may be part of the reading"
            }
            TimingMethod::HostSynchronous => {
                "pageable host memory, no latch: the copies are synchronous with the host, whose staging is part of the reading"
            }
        }
    }
}

impl std::str::FromStr for TimingMethod {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            TimingMethod::LatchWaitValue,
            TimingMethod::LatchHostFunction,
            TimingMethod::WarmupAhead,
            TimingMethod::HostSynchronous,
        ]
        .into_iter()
        .find(|m| m.as_str() == s)
        .ok_or_else(|| format!("unknown timing method {s:?}"))
    }
}

/// Most timed copies queued behind a latch; a cell with more is timed `warmup-ahead`.
pub const MAX_HELD_COPIES: u32 = 30;

/// Longest a host-function latch holds its stream waiting for the release.
pub const HOST_FUNCTION_TIMEOUT: Duration = Duration::from_secs(10);

/// Bytes of pinned host memory a latch word takes (a 32-bit word, on its own cache line).
pub const WORD_BYTES: usize = 64;

thread_local! {
    static LAST_METHOD: Cell<Option<TimingMethod>> = const { Cell::new(None) };
}

/// The timing method of the last cell measured on this thread since the last call (then
/// forgotten): `None` when no event-timed cell ran.
pub fn take_last_method() -> Option<TimingMethod> {
    LAST_METHOD.with(Cell::take)
}

/// What a host-function latch and the thread holding it share.
#[derive(Debug, Default)]
struct HostFlag {
    released: AtomicBool,
    /// The function gave up waiting ([`HOST_FUNCTION_TIMEOUT`]) and let the stream go.
    let_go: AtomicBool,
}

/// The host function of a `latch-host-function` hold: returns once released, or after
/// [`HOST_FUNCTION_TIMEOUT`]. Calls no runtime API and cannot panic.
unsafe extern "C" fn wait_for_release(data: *mut c_void) {
    // SAFETY: `data` is `Arc::into_raw` of a `HostFlag` made in `Latch::hold` for this call
    // alone: this function owns that reference and drops it on return, so the flag lives as
    // long as either side needs it, whenever (or whether) the runtime calls this.
    let flag = unsafe { Arc::from_raw(data.cast_const().cast::<HostFlag>()) };
    let started = Instant::now();
    let mut spins = 0u32;
    while !flag.released.load(Ordering::Acquire) {
        if started.elapsed() >= HOST_FUNCTION_TIMEOUT {
            flag.let_go.store(true, Ordering::Release);
            return;
        }
        spins = spins.saturating_add(1);
        if spins < 4096 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// The latches one run of cells uses: a pinned latch word (where the runtime can wait on
/// one), the next value to wait for, and what this run found the runtime refuses.
pub(crate) struct Latch {
    /// Whether this run may hold its streams at all (not for pageable host memory).
    holds: bool,
    /// A 32-bit word in runtime-allocated pinned memory that lives as long as this latch.
    word: Option<Handle>,
    last: u32,
    wait_refused: bool,
    host_function_refused: bool,
}

impl Latch {
    /// A latch on `word` (`None`: no wait-value latch; see [`DeviceApi::latch_word_bytes`]).
    /// `word` points to [`WORD_BYTES`] of zeroed pinned memory that outlives the latch and
    /// every stream that waits on it.
    pub(crate) fn new(word: Option<Handle>) -> Latch {
        Latch {
            holds: true,
            word,
            last: 0,
            wait_refused: false,
            host_function_refused: false,
        }
    }

    /// A latch that never holds: the copies of the run involve pageable host memory
    /// ([`TimingMethod::HostSynchronous`]).
    pub(crate) fn host_synchronous() -> Latch {
        Latch {
            holds: false,
            ..Latch::new(None)
        }
    }

    fn may_hold(&self, iterations: u32) -> bool {
        self.holds && iterations <= MAX_HELD_COPIES
    }

    /// Hold `stream` (drained: nothing of it runs) for `iterations` timed copies.
    fn hold<A: DeviceApi + ?Sized>(&mut self, api: &A, stream: Handle, iterations: u32) -> Held {
        if !self.holds {
            return Held::new(HeldBy::HostSynchronous);
        }
        if iterations > MAX_HELD_COPIES {
            return Held::new(HeldBy::Nothing);
        }
        if let Some(word) = self.word.filter(|_| !self.wait_refused) {
            let value = self.last.wrapping_add(1);
            match api.stream_wait_word(stream, word, value) {
                Ok(true) => {
                    self.last = value;
                    return Held::new(HeldBy::Word { word, value });
                }
                Ok(false) => self.wait_refused = true,
                Err(e) => {
                    tracing::debug!("no wait-value latch, falling back: {e}");
                    self.wait_refused = true;
                }
            }
        }
        if !self.host_function_refused {
            let flag = Arc::new(HostFlag::default());
            let data = Arc::into_raw(flag.clone()).cast_mut().cast::<c_void>();
            match api.launch_host_function(stream, wait_for_release, data) {
                Ok(true) => return Held::new(HeldBy::HostFunction(flag)),
                Ok(false) => self.host_function_refused = true,
                Err(e) => {
                    tracing::debug!("no host-function latch, falling back: {e}");
                    self.host_function_refused = true;
                }
            }
            // Not enqueued: the function will never run, so its reference is ours to drop.
            // SAFETY: `data` came from `Arc::into_raw` above and was handed to no one.
            drop(unsafe { Arc::from_raw(data.cast_const().cast::<HostFlag>()) });
        }
        Held::new(HeldBy::Nothing)
    }
}

enum HeldBy {
    Word { word: Handle, value: u32 },
    HostFunction(Arc<HostFlag>),
    Nothing,
    HostSynchronous,
}

/// A held stream; released on drop (every path), or earlier by [`Held::release`].
struct Held {
    by: HeldBy,
    released: bool,
}

impl Held {
    fn new(by: HeldBy) -> Held {
        Held {
            by,
            released: false,
        }
    }

    fn method(&self) -> TimingMethod {
        match self.by {
            HeldBy::Word { .. } => TimingMethod::LatchWaitValue,
            HeldBy::HostFunction(_) => TimingMethod::LatchHostFunction,
            HeldBy::Nothing => TimingMethod::WarmupAhead,
            HeldBy::HostSynchronous => TimingMethod::HostSynchronous,
        }
    }

    fn release(&mut self) {
        if std::mem::replace(&mut self.released, true) {
            return;
        }
        match &self.by {
            HeldBy::Word { word, value } => {
                // SAFETY: `word` points to a live, 4-byte aligned word of pinned memory the
                // latch's owner keeps (the `Latch::new` contract); the device only reads it.
                unsafe { std::ptr::write_volatile((*word).cast::<u32>(), *value) };
                fence(Ordering::SeqCst);
            }
            HeldBy::HostFunction(flag) => flag.released.store(true, Ordering::Release),
            HeldBy::Nothing | HeldBy::HostSynchronous => {}
        }
    }

    /// Whether the host function gave up before the release (the copies then ran while the
    /// host was still enqueueing them).
    fn let_go_early(&self) -> bool {
        matches!(&self.by, HeldBy::HostFunction(f) if f.let_go.load(Ordering::Acquire))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.release();
    }
}

/// Milliseconds of `iterations` timed operations on `stream` between `start` and `end`
/// recorded on it, after `warmup` untimed ones, with the stream held while they are enqueued
/// (see the module documentation), every wait by `deadline` (`stuck_work`). `enqueue` enqueues one operation; `on_copy` and
/// `on_timing` map a failed operation or event call; events that measure no time are a timing
/// error. The method used is kept for [`take_last_method`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn time_held<A: DeviceApi + ?Sized>(
    api: &A,
    latch: &mut Latch,
    stream: Handle,
    (start, end): (Handle, Handle),
    (warmup, iterations): (u32, u32),
    deadline: &Deadline,
    enqueue: &dyn Fn() -> Result<(), ApiError>,
    on_copy: &dyn Fn(ApiError) -> ProbeError,
    on_timing: &dyn Fn(ApiError) -> ProbeError,
) -> Result<f32, ProbeError> {
    for _ in 0..warmup {
        enqueue().map_err(on_copy)?;
    }
    let latched = latch.may_hold(iterations);
    if latched || !latch.holds {
        // A latch holds a drained stream: the warm-ups stay out of the timed region (and a
        // host-synchronous run drains as it always did).
        device_wait::wait_stream(api, stream, end, deadline, on_copy)?;
    }
    let mut held = latch.hold(api, stream, iterations);
    if latched && held.method() == TimingMethod::WarmupAhead {
        // No latch after all: re-queue the warm-ups right ahead of the start event.
        for _ in 0..warmup {
            enqueue().map_err(on_copy)?;
        }
    }
    api.event_record(start, stream).map_err(on_timing)?;
    for _ in 0..iterations {
        enqueue().map_err(on_copy)?;
    }
    api.event_record(end, stream).map_err(on_timing)?;
    held.release();
    device_wait::wait_event(api, end, deadline, on_timing)?;
    let method = held.method();
    if held.let_go_early() {
        return Err(ProbeError::Timing(format!(
            "the host-function latch let the stream go after {} s, before every timed copy \
             was enqueued",
            HOST_FUNCTION_TIMEOUT.as_secs()
        )));
    }
    let ms = api.event_elapsed_ms(start, end).map_err(on_timing)?;
    if !(ms.is_finite() && ms > 0.0) {
        return Err(ProbeError::Timing(format!(
            "device events measured {ms} ms for {iterations} copies"
        )));
    }
    LAST_METHOD.with(|m| m.set(Some(method)));
    Ok(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_print_and_parse_back() {
        for m in [
            TimingMethod::LatchWaitValue,
            TimingMethod::LatchHostFunction,
            TimingMethod::WarmupAhead,
            TimingMethod::HostSynchronous,
        ] {
            assert_eq!(m.as_str().parse::<TimingMethod>(), Ok(m));
            assert!(!m.describe().is_empty());
        }
        assert!("latch".parse::<TimingMethod>().is_err());
    }

    #[test]
    fn an_unlaunched_host_function_leaves_one_reference() {
        let flag = Arc::new(HostFlag::default());
        flag.released.store(true, Ordering::Release);
        let data = Arc::into_raw(flag.clone()).cast_mut().cast::<c_void>();
        // SAFETY: as the runtime would call it, with the reference made for it.
        unsafe { wait_for_release(data) };
        assert_eq!(
            Arc::strong_count(&flag),
            1,
            "the function dropped its reference"
        );
        assert!(!flag.let_go.load(Ordering::Acquire));
    }
}
