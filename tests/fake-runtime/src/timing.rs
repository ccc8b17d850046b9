//! Streams, events and their virtual clocks.
//!
//! Every stream (and every device's default stream) has a clock in nanoseconds that only
//! copies move forward: a copy of `n` bytes at `g` GB/s adds `n / g` ns. Recording an event
//! captures the clock of the stream it is recorded on; the elapsed time between two events is
//! the difference of the captured clocks. Wall-clock time never enters, except through the
//! host clock of `CHD_FAKE_ENQUEUE_US` ([`crate::host_clock`]): an operation starts no earlier
//! than the host time its enqueue call ended, so an idle stream's event completes while the
//! host still enqueues.
//!
//! A stream can be *held* ([`Hold`]): by `cuStreamWaitValue32` until the word it waits on
//! satisfies the condition, by a host function (`cudaLaunchHostFunc`, `aclrtLaunchHostFunc`)
//! until it returns, or by a copy on a hung device (`CHD_FAKE_HANG_DEVICES`) until the device
//! stops hanging. Work enqueued behind a hold is deferred: its bytes are copied at once (as
//! every copy here is), but its clock advance, its events and later holds wait until the hold
//! clears, and then start at the host time of the thread that finds it cleared. An event
//! recorded behind a hold is pending: a query says not ready, a synchronize waits. A stream
//! held by a latch that nobody releases never drains: a synchronize that would wait for it
//! forever gives up after [`LATCH_DEADLOCK_MS`] with [`WaitError::WouldHang`] (the real runtime
//! hangs) and counts it ([`latch_deadlocks`]); one held by a hung device waits as long as the
//! device hangs, as a real one does.
//!
//! Handles are opaque non-null integers cast to pointers, looked up in a table, so a stale or
//! bogus handle yields an error instead of undefined behaviour.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::host_clock;
use crate::memory::Api;

/// How long a synchronize waits for a latch (a wait-value or a host function) that never
/// clears before it reports the hang the real runtime would go into.
pub const LATCH_DEADLOCK_MS: u64 = 1000;

/// A stream argument: the device's default stream, or a created stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StreamRef {
    /// The default stream of the given device.
    Default(usize),
    Handle(usize),
}

impl StreamRef {
    /// Interprets a raw stream argument. NULL (and CUDA's special `cudaStreamLegacy` = 1 and
    /// `cudaStreamPerThread` = 2 handles) mean the default stream of `current_device`.
    pub fn from_raw(raw: *mut c_void, current_device: usize) -> StreamRef {
        match raw as usize {
            0..=2 => StreamRef::Default(current_device),
            h => StreamRef::Handle(h),
        }
    }
}

/// Why a stream or event operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimingError {
    /// Unknown, destroyed, or other-API handle.
    InvalidHandle,
    /// Elapsed time asked of an event that was never recorded.
    NotRecorded,
    /// Elapsed time asked of an event created with timing disabled.
    TimingDisabled,
}

/// Why a blocking wait returned without the work done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitError {
    Timing(TimingError),
    /// A latch holds the stream and nothing released it: the real runtime would wait forever.
    WouldHang,
    /// The caller's timeout passed first (`aclrtSynchronizeEventWithTimeout`).
    TimedOut,
}

/// A host function to run on a stream: `fn(data)`.
#[derive(Clone, Copy, Debug)]
pub struct HostCall {
    pub func: unsafe extern "C" fn(*mut c_void),
    pub data: usize,
    pub api: Api,
}

/// What holds a stream.
#[derive(Clone, Debug)]
pub enum Hold {
    /// `cuStreamWaitValue32`: until the 32-bit word at `addr` satisfies `flags` against
    /// `value` (0 GEQ: `(int32_t)(*addr - value) >= 0`, 1 EQ, 2 AND).
    WaitValue { addr: usize, value: u32, flags: u32 },
    /// A host function that has not returned yet (true once it has).
    HostFunction(Arc<AtomicBool>),
    /// A copy on a hung device, touching the allocations at `buffers`.
    Hung { device: usize, buffers: Vec<usize> },
}

impl Hold {
    fn cleared(&self) -> bool {
        match self {
            Hold::WaitValue { addr, value, flags } => {
                // SAFETY: `cuStreamWaitValue32` checked that `addr` lies in live pinned memory,
                // and the frees of that memory are refused while a hold waits on it
                // (`in_flight_uses`).
                let word = unsafe { std::ptr::read_volatile(*addr as *const u32) };
                match flags {
                    0 => (word.wrapping_sub(*value) as i32) >= 0,
                    1 => word == *value,
                    _ => word & value != 0,
                }
            }
            Hold::HostFunction(done) => done.load(Ordering::Acquire),
            Hold::Hung { device, .. } => !crate::config::get().faults_now().hangs(*device),
        }
    }

    fn is_latch(&self) -> bool {
        !matches!(self, Hold::Hung { .. })
    }

    fn uses(&self, base: usize) -> bool {
        match self {
            Hold::WaitValue { addr, .. } => crate::memory::base_of(*addr) == Some(base),
            Hold::HostFunction(_) => false,
            Hold::Hung { buffers, .. } => buffers.contains(&base),
        }
    }
}

/// Work enqueued behind a hold.
#[derive(Clone, Debug)]
enum Deferred {
    /// A copy of this many nanoseconds, touching the allocations at `buffers`.
    Copy {
        ns: f64,
        buffers: Vec<usize>,
    },
    Record(usize),
    Hold(Hold),
    HostFunction(HostCall),
}

#[derive(Debug)]
struct Stream {
    api: Api,
    device: usize,
    clock_ns: f64,
    /// Successful copies issued on it (`CHD_FAKE_FAIL_AFTER` counts these).
    copies: u64,
    held: Option<Hold>,
    deferred: Vec<Deferred>,
}

impl Stream {
    fn new(api: Api, device: usize) -> Stream {
        Stream {
            api,
            device,
            clock_ns: 0.0,
            copies: 0,
            held: None,
            deferred: Vec::new(),
        }
    }

    fn busy(&self) -> bool {
        self.held.is_some()
    }
}

#[derive(Debug)]
struct Event {
    api: Api,
    timing: bool,
    recorded_ns: Option<f64>,
    /// Recorded behind a hold that has not cleared yet.
    pending: Option<StreamRef>,
}

#[derive(Default)]
struct Timeline {
    next_handle: usize,
    streams: HashMap<usize, Stream>,
    events: HashMap<usize, Event>,
    defaults: HashMap<usize, Stream>,
    /// Streams destroyed while held: their work still waits (and still uses its buffers).
    destroyed_held: Vec<Stream>,
}

impl Timeline {
    fn new_handle(&mut self) -> usize {
        // Pointer-looking, 64-byte spaced, never 0, 1 or 2.
        self.next_handle += 1;
        0x7fa0_0000_0000 + self.next_handle * 64
    }

    fn stream_mut(&mut self, stream: StreamRef, api: Api) -> Result<&mut Stream, TimingError> {
        match stream {
            StreamRef::Default(device) => Ok(self
                .defaults
                .entry(device)
                .or_insert_with(|| Stream::new(api, device))),
            StreamRef::Handle(h) => match self.streams.get_mut(&h) {
                Some(s) if s.api == api => Ok(s),
                _ => Err(TimingError::InvalidHandle),
            },
        }
    }

    /// Clears `stream`'s hold if it has cleared and runs what waited behind it, up to the
    /// next hold.
    fn poll(&mut self, stream: StreamRef, api: Api) {
        let Ok(s) = self.stream_mut(stream, api) else {
            return;
        };
        let mut stamps = Vec::new();
        let mut calls = Vec::new();
        release(s, &mut stamps, &mut calls);
        self.apply(stamps);
        for call in calls {
            spawn_host_function(call, self, stream, api);
        }
    }

    fn apply(&mut self, stamps: Vec<(usize, f64)>) {
        for (event, at) in stamps {
            if let Some(e) = self.events.get_mut(&event) {
                e.recorded_ns = Some(at);
                e.pending = None;
            }
        }
    }
}

/// Runs `s`'s deferred work while its hold is cleared: clock advances, event stamps (into
/// `stamps`) and host functions to start (into `calls`; each holds the stream again).
fn release(s: &mut Stream, stamps: &mut Vec<(usize, f64)>, calls: &mut Vec<HostCall>) {
    while s.held.as_ref().is_some_and(Hold::cleared) {
        s.held = None;
        s.clock_ns = s.clock_ns.max(host_clock::now());
        let mut rest = std::mem::take(&mut s.deferred).into_iter();
        for op in rest.by_ref() {
            match op {
                Deferred::Copy { ns, .. } => s.clock_ns += ns,
                Deferred::Record(event) => stamps.push((event, s.clock_ns)),
                Deferred::Hold(h) => {
                    s.held = Some(h);
                    break;
                }
                Deferred::HostFunction(call) => {
                    calls.push(call);
                    break;
                }
            }
        }
        s.deferred.extend(rest);
        if !calls.is_empty() {
            break;
        }
    }
}

static TIMELINE: Mutex<Option<Timeline>> = Mutex::new(None);
static LATCH_DEADLOCKS: AtomicU64 = AtomicU64::new(0);
static HOST_FUNCTION_API_CALLS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static IN_HOST_FUNCTION: Cell<bool> = const { Cell::new(false) };
}

fn with<R>(f: impl FnOnce(&mut Timeline) -> R) -> R {
    let mut guard = TIMELINE.lock().unwrap_or_else(|e| e.into_inner());
    f(guard.get_or_insert_with(Timeline::default))
}

/// Starts `call` on its own thread (the runtime's callback thread) and holds `stream` until it
/// returns.
fn spawn_host_function(call: HostCall, t: &mut Timeline, stream: StreamRef, api: Api) {
    let done = Arc::new(AtomicBool::new(false));
    if let Ok(s) = t.stream_mut(stream, api) {
        s.held = Some(Hold::HostFunction(done.clone()));
    }
    let spawned = std::thread::Builder::new()
        .name("fake-host-fn".into())
        .spawn(move || {
            IN_HOST_FUNCTION.with(|f| f.set(true));
            // SAFETY: the caller of cudaLaunchHostFunc / aclrtLaunchHostFunc passed a function
            // of this C type and the data it expects (the vendors' contract).
            unsafe { (call.func)(call.data as *mut c_void) };
            done.store(true, Ordering::Release);
        });
    if spawned.is_err() {
        // No thread: the function never runs, as after a context error; the stream stays held.
        eprintln!("chd-fake-runtime: cannot start a host function thread");
    }
}

/// Whether the calling thread runs a host function (where the vendors forbid API calls).
pub fn in_host_function() -> bool {
    IN_HOST_FUNCTION.with(Cell::get)
}

/// Counts one API call made from a host function.
pub fn count_host_function_api_call() {
    HOST_FUNCTION_API_CALLS.fetch_add(1, Ordering::Relaxed);
}

/// API calls made from inside host functions so far (each refused).
pub fn host_function_api_calls() -> u64 {
    HOST_FUNCTION_API_CALLS.load(Ordering::Relaxed)
}

/// Synchronizes that would have waited forever on an unreleased latch.
pub fn latch_deadlocks() -> u64 {
    LATCH_DEADLOCKS.load(Ordering::Relaxed)
}

/// Creates a stream on `device`; returns its handle.
pub fn create_stream(device: usize, api: Api) -> *mut c_void {
    with(|t| {
        let h = t.new_handle();
        t.streams.insert(h, Stream::new(api, device));
        h as *mut c_void
    })
}

/// Destroys a stream created by `api`. A held stream's work keeps waiting (CUDA releases a
/// destroyed stream's resources once its work is done): it still uses its buffers.
pub fn destroy_stream(raw: *mut c_void, api: Api) -> Result<(), TimingError> {
    with(|t| match t.streams.get(&(raw as usize)) {
        Some(s) if s.api == api => {
            let s = t.streams.remove(&(raw as usize)).expect("present");
            if s.busy() {
                t.destroyed_held.push(s);
            }
            Ok(())
        }
        _ => Err(TimingError::InvalidHandle),
    })
}

/// Checks that `stream` is usable by `api`; returns the device it belongs to.
pub fn stream_device(stream: StreamRef, api: Api) -> Result<usize, TimingError> {
    match stream {
        StreamRef::Default(device) => Ok(device),
        StreamRef::Handle(h) => with(|t| match t.streams.get(&h) {
            Some(s) if s.api == api => Ok(s.device),
            _ => Err(TimingError::InvalidHandle),
        }),
    }
}

/// One enqueued operation of `ns` touching the allocations at `buffers`: it starts when the
/// stream is free and the host has finished enqueueing it.
pub fn enqueue_copy(
    stream: StreamRef,
    api: Api,
    ns: f64,
    buffers: Vec<usize>,
) -> Result<(), TimingError> {
    let host = host_clock::enqueue();
    with(|t| {
        t.poll(stream, api);
        let s = t.stream_mut(stream, api)?;
        if s.busy() {
            s.deferred.push(Deferred::Copy { ns, buffers });
        } else {
            s.clock_ns = s.clock_ns.max(host) + ns;
        }
        Ok(())
    })
}

/// A copy on hung `device`: the stream is held behind it until the device stops hanging.
pub fn enqueue_hung_copy(
    stream: StreamRef,
    api: Api,
    device: usize,
    buffers: Vec<usize>,
) -> Result<(), TimingError> {
    host_clock::enqueue();
    with(|t| {
        t.poll(stream, api);
        let s = t.stream_mut(stream, api)?;
        let hold = Hold::Hung { device, buffers };
        if s.busy() {
            s.deferred.push(Deferred::Hold(hold));
        } else {
            s.held = Some(hold);
        }
        Ok(())
    })
}

/// Advances `stream`'s clock by `ns` (an operation that touches no tracked buffer).
pub fn advance(stream: StreamRef, api: Api, ns: f64) -> Result<(), TimingError> {
    enqueue_copy(stream, api, ns, Vec::new())
}

/// Holds `stream` with `hold` (behind what is already held).
pub fn hold(stream: StreamRef, api: Api, hold: Hold) -> Result<(), TimingError> {
    let host = host_clock::enqueue();
    with(|t| {
        t.poll(stream, api);
        let s = t.stream_mut(stream, api)?;
        if s.busy() {
            s.deferred.push(Deferred::Hold(hold));
        } else {
            s.clock_ns = s.clock_ns.max(host);
            s.held = Some(hold);
        }
        Ok(())
    })?;
    // A hold that is already satisfied releases at once.
    with(|t| t.poll(stream, api));
    Ok(())
}

/// Enqueues a host function on `stream`: it runs (on its own thread) once what is ahead of it
/// has run, and holds the stream until it returns.
pub fn launch_host_function(
    stream: StreamRef,
    api: Api,
    call: HostCall,
) -> Result<(), TimingError> {
    let host = host_clock::enqueue();
    with(|t| {
        t.poll(stream, api);
        let s = t.stream_mut(stream, api)?;
        if s.busy() {
            s.deferred.push(Deferred::HostFunction(call));
        } else {
            s.clock_ns = s.clock_ns.max(host);
            spawn_host_function(call, t, stream, api);
        }
        Ok(())
    })
}

/// Whether pending work (held, or deferred behind a hold, on a live or destroyed stream) uses
/// the allocation at `base`: freeing it would free memory under an operation in flight.
pub fn in_flight_uses(base: usize) -> bool {
    with(|t| {
        let uses = |s: &Stream| {
            s.held.as_ref().is_some_and(|h| h.uses(base))
                || s.deferred.iter().any(|d| match d {
                    Deferred::Copy { buffers, .. } => buffers.contains(&base),
                    Deferred::Hold(h) => h.uses(base),
                    _ => false,
                })
        };
        t.streams.values().any(uses)
            || t.defaults.values().any(uses)
            || t.destroyed_held.iter().any(uses)
    })
}

/// Streams (live or destroyed) whose work waits behind a hold now.
pub fn held_streams() -> u64 {
    with(|t| {
        let all: Vec<StreamRef> = t
            .streams
            .keys()
            .map(|&h| StreamRef::Handle(h))
            .chain(t.defaults.keys().map(|&d| StreamRef::Default(d)))
            .collect();
        for s in all {
            let api = match s {
                StreamRef::Handle(h) => t.streams[&h].api,
                StreamRef::Default(d) => t.defaults[&d].api,
            };
            t.poll(s, api);
        }
        for s in &mut t.destroyed_held {
            let (mut stamps, mut calls) = (Vec::new(), Vec::new());
            release(s, &mut stamps, &mut calls);
        }
        t.destroyed_held.retain(Stream::busy);
        let live = t.streams.values().chain(t.defaults.values());
        (live.filter(|s| s.busy()).count() + t.destroyed_held.len()) as u64
    })
}

/// Successful copies issued on `stream` so far (0 for an unknown handle).
pub fn copies_on(stream: StreamRef, api: Api) -> u64 {
    with(|t| t.stream_mut(stream, api).map_or(0, |s| s.copies))
}

/// Counts one more successful copy on `stream`.
pub fn count_copy(stream: StreamRef, api: Api) {
    with(|t| {
        if let Ok(s) = t.stream_mut(stream, api) {
            s.copies += 1;
        }
    })
}

/// The current clock of `stream` in nanoseconds.
pub fn clock_ns(stream: StreamRef, api: Api) -> Result<f64, TimingError> {
    with(|t| t.stream_mut(stream, api).map(|s| s.clock_ns))
}

/// Creates an event; `timing == false` models `cudaEventDisableTiming`.
pub fn create_event(api: Api, timing: bool) -> *mut c_void {
    with(|t| {
        let h = t.new_handle();
        t.events.insert(
            h,
            Event {
                api,
                timing,
                recorded_ns: None,
                pending: None,
            },
        );
        h as *mut c_void
    })
}

/// Destroys an event created by `api`.
pub fn destroy_event(raw: *mut c_void, api: Api) -> Result<(), TimingError> {
    with(|t| match t.events.get(&(raw as usize)) {
        Some(e) if e.api == api => {
            t.events.remove(&(raw as usize));
            Ok(())
        }
        _ => Err(TimingError::InvalidHandle),
    })
}

/// Checks that `raw` is a live event of `api`.
pub fn check_event(raw: *mut c_void, api: Api) -> Result<(), TimingError> {
    with(|t| match t.events.get(&(raw as usize)) {
        Some(e) if e.api == api => Ok(()),
        _ => Err(TimingError::InvalidHandle),
    })
}

/// Records `event` on `stream`: the event captures the stream's clock once the stream gets
/// there (at once on a stream nothing holds).
pub fn record(event: *mut c_void, stream: StreamRef, api: Api) -> Result<(), TimingError> {
    let host = host_clock::enqueue();
    with(|t| {
        match t.events.get(&(event as usize)) {
            Some(e) if e.api == api => {}
            _ => return Err(TimingError::InvalidHandle),
        }
        t.poll(stream, api);
        let s = t.stream_mut(stream, api)?;
        let stamp = if s.busy() {
            s.deferred.push(Deferred::Record(event as usize));
            None
        } else {
            s.clock_ns = s.clock_ns.max(host);
            Some(s.clock_ns)
        };
        let e = t.events.get_mut(&(event as usize)).expect("checked above");
        e.recorded_ns = stamp;
        e.pending = stamp.is_none().then_some(stream);
        Ok(())
    })
}

/// Whether `event` has completed (an event never recorded has). Looks at its stream first.
pub fn event_done(event: *mut c_void, api: Api) -> Result<bool, TimingError> {
    with(|t| {
        let pending = match t.events.get(&(event as usize)) {
            Some(e) if e.api == api => e.pending,
            _ => return Err(TimingError::InvalidHandle),
        };
        if let Some(stream) = pending {
            t.poll(stream, api);
        }
        Ok(t.events[&(event as usize)].pending.is_none())
    })
}

/// Whether everything enqueued on `stream` has run.
pub fn stream_done(stream: StreamRef, api: Api) -> Result<bool, TimingError> {
    with(|t| {
        t.poll(stream, api);
        t.stream_mut(stream, api).map(|s| !s.busy())
    })
}

/// What a blocking wait is stuck behind, if it is: whether it is a latch.
fn blocked_by_latch(stream: StreamRef, api: Api) -> bool {
    with(|t| {
        t.stream_mut(stream, api)
            .ok()
            .and_then(|s| s.held.as_ref().map(Hold::is_latch))
            .unwrap_or(false)
    })
}

/// Whether a latch (a wait-value or a host function) holds `stream` now.
pub fn held_by_latch(stream: StreamRef, api: Api) -> bool {
    with(|t| t.poll(stream, api));
    blocked_by_latch(stream, api)
}

/// Counts one call that would have waited forever on a latch.
pub fn count_latch_deadlock() {
    LATCH_DEADLOCKS.fetch_add(1, Ordering::Relaxed);
}

/// Waits until `done` says the work is done: as long as a hung device holds it, up to
/// [`LATCH_DEADLOCK_MS`] on a latch nobody releases, up to `timeout` if given.
fn wait(
    stream: impl Fn() -> Option<StreamRef>,
    api: Api,
    timeout: Option<Duration>,
    done: impl Fn() -> Result<bool, TimingError>,
) -> Result<(), WaitError> {
    let started = Instant::now();
    let mut latched_since: Option<Instant> = None;
    loop {
        if done().map_err(WaitError::Timing)? {
            return Ok(());
        }
        if timeout.is_some_and(|t| started.elapsed() >= t) {
            return Err(WaitError::TimedOut);
        }
        if stream().is_some_and(|s| blocked_by_latch(s, api)) {
            let since = *latched_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= Duration::from_millis(LATCH_DEADLOCK_MS) {
                LATCH_DEADLOCKS.fetch_add(1, Ordering::Relaxed);
                return Err(WaitError::WouldHang);
            }
        } else {
            latched_since = None;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Blocks until everything enqueued on `stream` has run (`cudaStreamSynchronize`,
/// `aclrtSynchronizeStream`); the host clock moves up to the stream's.
pub fn synchronize_stream(stream: StreamRef, api: Api) -> Result<(), WaitError> {
    wait(|| Some(stream), api, None, || stream_done(stream, api))?;
    host_clock::waited_until(clock_ns(stream, api).map_err(WaitError::Timing)?);
    Ok(())
}

/// Blocks until `event` has completed (`cudaEventSynchronize`, `aclrtSynchronizeEvent[WithTimeout]`);
/// the host clock moves up to its stamp.
pub fn synchronize_event(
    event: *mut c_void,
    api: Api,
    timeout: Option<Duration>,
) -> Result<(), WaitError> {
    let stream = || with(|t| t.events.get(&(event as usize)).and_then(|e| e.pending));
    wait(stream, api, timeout, || event_done(event, api))?;
    let stamp = with(|t| t.events.get(&(event as usize)).and_then(|e| e.recorded_ns));
    if let Some(at) = stamp {
        host_clock::waited_until(at);
    }
    Ok(())
}

/// Milliseconds from `start` to `end`.
pub fn elapsed_ms(start: *mut c_void, end: *mut c_void, api: Api) -> Result<f32, TimingError> {
    with(|t| {
        let stamp = |raw: *mut c_void| -> Result<Option<f64>, TimingError> {
            match t.events.get(&(raw as usize)) {
                Some(e) if e.api == api && !e.timing => Err(TimingError::TimingDisabled),
                Some(e) if e.api == api => Ok(e.recorded_ns),
                _ => Err(TimingError::InvalidHandle),
            }
        };
        let (a, b) = (stamp(start)?, stamp(end)?);
        match (a, b) {
            (Some(a), Some(b)) => Ok(((b - a) / 1e6) as f32),
            _ => Err(TimingError::NotRecorded),
        }
    })
}

/// Joins the clocks of `streams` and runs an operation of `ns` on all of them: every clock is
/// set to `max(clocks) + ns` (a collective starts when its last rank's stream gets there and
/// ends at the same time on every rank). Unknown handles are skipped; returns the new clock.
pub fn join_advance(streams: &[StreamRef], api: Api, ns: f64) -> f64 {
    with(|t| {
        let start = streams
            .iter()
            .filter_map(|&s| t.stream_mut(s, api).ok().map(|s| s.clock_ns))
            .fold(0.0, f64::max);
        let end = start + ns;
        for &s in streams {
            if let Ok(s) = t.stream_mut(s, api) {
                s.clock_ns = end;
            }
        }
        end
    })
}
