//! Streams, events and their virtual clocks.
//!
//! Every stream (and every device's default stream) has a clock in nanoseconds that only
//! copies move forward: a copy of `n` bytes at `g` GB/s adds `n / g` ns. Recording an event
//! captures the clock of the stream it is recorded on; the elapsed time between two events is
//! the difference of the captured clocks. Wall-clock time never enters.
//!
//! Handles are opaque non-null integers cast to pointers, looked up in a table, so a stale or
//! bogus handle yields an error instead of undefined behaviour.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use crate::memory::Api;

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

#[derive(Debug)]
struct Stream {
    api: Api,
    device: usize,
    clock_ns: f64,
    /// Successful copies issued on it (`CHD_FAKE_FAIL_AFTER` counts these).
    copies: u64,
}

#[derive(Debug)]
struct Event {
    api: Api,
    timing: bool,
    recorded_ns: Option<f64>,
}

#[derive(Default)]
struct Timeline {
    next_handle: usize,
    streams: HashMap<usize, Stream>,
    events: HashMap<usize, Event>,
    default_clocks: HashMap<usize, f64>,
    default_copies: HashMap<usize, u64>,
}

impl Timeline {
    fn new_handle(&mut self) -> usize {
        // Pointer-looking, 64-byte spaced, never 0, 1 or 2.
        self.next_handle += 1;
        0x7fa0_0000_0000 + self.next_handle * 64
    }

    fn clock_mut(&mut self, stream: StreamRef, api: Api) -> Result<&mut f64, TimingError> {
        match stream {
            StreamRef::Default(device) => Ok(self.default_clocks.entry(device).or_insert(0.0)),
            StreamRef::Handle(h) => match self.streams.get_mut(&h) {
                Some(s) if s.api == api => Ok(&mut s.clock_ns),
                _ => Err(TimingError::InvalidHandle),
            },
        }
    }
}

static TIMELINE: Mutex<Option<Timeline>> = Mutex::new(None);

fn with<R>(f: impl FnOnce(&mut Timeline) -> R) -> R {
    let mut guard = TIMELINE.lock().unwrap_or_else(|e| e.into_inner());
    f(guard.get_or_insert_with(Timeline::default))
}

/// Creates a stream on `device`; returns its handle.
pub fn create_stream(device: usize, api: Api) -> *mut c_void {
    with(|t| {
        let h = t.new_handle();
        t.streams.insert(
            h,
            Stream {
                api,
                device,
                clock_ns: 0.0,
                copies: 0,
            },
        );
        h as *mut c_void
    })
}

/// Destroys a stream created by `api`.
pub fn destroy_stream(raw: *mut c_void, api: Api) -> Result<(), TimingError> {
    with(|t| match t.streams.get(&(raw as usize)) {
        Some(s) if s.api == api => {
            t.streams.remove(&(raw as usize));
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

/// Advances `stream`'s clock by `ns`.
pub fn advance(stream: StreamRef, api: Api, ns: f64) -> Result<(), TimingError> {
    with(|t| {
        *t.clock_mut(stream, api)? += ns;
        Ok(())
    })
}

/// Successful copies issued on `stream` so far (0 for an unknown handle).
pub fn copies_on(stream: StreamRef, api: Api) -> u64 {
    with(|t| match stream {
        StreamRef::Default(device) => t.default_copies.get(&device).copied().unwrap_or(0),
        StreamRef::Handle(h) => t
            .streams
            .get(&h)
            .filter(|s| s.api == api)
            .map_or(0, |s| s.copies),
    })
}

/// Counts one more successful copy on `stream`.
pub fn count_copy(stream: StreamRef, api: Api) {
    with(|t| match stream {
        StreamRef::Default(device) => *t.default_copies.entry(device).or_insert(0) += 1,
        StreamRef::Handle(h) => {
            if let Some(s) = t.streams.get_mut(&h).filter(|s| s.api == api) {
                s.copies += 1;
            }
        }
    })
}

/// The current clock of `stream` in nanoseconds.
pub fn clock_ns(stream: StreamRef, api: Api) -> Result<f64, TimingError> {
    with(|t| t.clock_mut(stream, api).map(|c| *c))
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

/// Records `event` on `stream`: the event captures the stream's clock.
pub fn record(event: *mut c_void, stream: StreamRef, api: Api) -> Result<(), TimingError> {
    with(|t| {
        let now = *t.clock_mut(stream, api)?;
        match t.events.get_mut(&(event as usize)) {
            Some(e) if e.api == api => {
                e.recorded_ns = Some(now);
                Ok(())
            }
            _ => Err(TimingError::InvalidHandle),
        }
    })
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
            .filter_map(|&s| t.clock_mut(s, api).ok().map(|c| *c))
            .fold(0.0, f64::max);
        let end = start + ns;
        for &s in streams {
            if let Ok(c) = t.clock_mut(s, api) {
                *c = end;
            }
        }
        end
    })
}
