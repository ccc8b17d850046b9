//! Device work that did not finish in time, and the deadline copy cells wait under.
//!
//! Every wait of an event-timed copy cell (h2d, d2h, same-device, peer) is bounded: its stream
//! is waited on through an event ([`DeviceApi::event_wait`]: CUDA polls `cudaEventQuery`,
//! ACL calls `aclrtSynchronizeEventWithTimeout`) until the cell's deadline
//! ([`cell_timeout`], `probe.cell_timeout`). A cell whose work is not done by then is a
//! [`ProbeError::Timeout`], and what that work may still touch is never released under it:
//! the stream is neither synchronized nor destroyed (CANN wants a synchronize first, which
//! would never return), its events stay, and its device and host buffers are *leaked* rather
//! than freed under the DMA (`aclrtFree` frees at once without waiting for tasks; `cudaFree`
//! synchronizes, which would never return either). The leak is kept here, one [`Stuck`] entry
//! per cell, with the bytes it holds ([`StuckReport`], exported by the prober), and its
//! devices are *quarantined*: [`StuckWork::holds`] says so and the copy cells refuse them
//! ([`ProbeError::Quarantined`]) so no more work queues up behind the hung copy.
//! [`StuckWork::recheck`] (at every window start) asks each entry's last event whether the
//! work finished after all; once it has, nothing touches the memory any more: the entry is
//! released (stream synchronized and destroyed, events destroyed, buffers freed, the peer
//! access the cell opened closed) and its devices answer again.
//!
//! [`interrupt_waits`] makes every bounded wait give up at once (chd is stopping: a hung cell
//! must not hold the exit for its whole deadline); the cell is then a timeout like any other
//! and keeps its memory until the process ends.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::device_copy::{ApiError, DeviceApi, Handle};
use super::ProbeError;

/// The default of `probe.cell_timeout`: longest the device work of one copy cell may take.
pub const DEFAULT_CELL_TIMEOUT: Duration = Duration::from_secs(10);

static CELL_TIMEOUT_MS: AtomicU64 = AtomicU64::new(DEFAULT_CELL_TIMEOUT.as_millis() as u64);
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Set the deadline of every copy cell of this process (`probe.cell_timeout`).
pub fn set_cell_timeout(timeout: Duration) {
    let ms = u64::try_from(timeout.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    CELL_TIMEOUT_MS.store(ms, Ordering::Relaxed);
}

/// The deadline of a copy cell's device work.
pub fn cell_timeout() -> Duration {
    Duration::from_millis(CELL_TIMEOUT_MS.load(Ordering::Relaxed))
}

/// Make every bounded wait of this process give up now, and every later one at once (chd is
/// stopping).
pub fn interrupt_waits() {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Whether [`interrupt_waits`] was called.
pub(crate) fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// When a cell's device work must be done.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    at: Instant,
    timeout: Duration,
}

impl Deadline {
    /// [`cell_timeout`] from now.
    pub(crate) fn for_cell() -> Deadline {
        let timeout = cell_timeout();
        Deadline {
            at: Instant::now() + timeout,
            timeout,
        }
    }

    /// Time left (zero once passed, or once waits are interrupted).
    pub(crate) fn left(&self) -> Duration {
        if interrupted() {
            return Duration::ZERO;
        }
        self.at.saturating_duration_since(Instant::now())
    }

    fn timed_out(&self) -> ProbeError {
        if interrupted() {
            ProbeError::Timeout("chd is stopping: the device work in flight was left".into())
        } else {
            ProbeError::Timeout(format!(
                "the device's work did not finish within {} (probe.cell_timeout)",
                humantime::format_duration(self.timeout)
            ))
        }
    }
}

/// Wait until `event` completed, by `deadline`: a [`ProbeError::Timeout`] past it, `on_error`
/// for a failed call.
pub(crate) fn wait_event<A: DeviceApi + ?Sized>(
    api: &A,
    event: Handle,
    deadline: &Deadline,
    on_error: &dyn Fn(ApiError) -> ProbeError,
) -> Result<(), ProbeError> {
    if api.event_wait(event, deadline.left()).map_err(on_error)? {
        Ok(())
    } else {
        Err(deadline.timed_out())
    }
}

/// Wait for everything enqueued on `stream` so far, by `deadline`: `event` is recorded on it
/// and waited for ([`wait_event`]).
pub(crate) fn wait_stream<A: DeviceApi + ?Sized>(
    api: &A,
    stream: Handle,
    event: Handle,
    deadline: &Deadline,
    on_error: &dyn Fn(ApiError) -> ProbeError,
) -> Result<(), ProbeError> {
    api.event_record(event, stream).map_err(on_error)?;
    wait_event(api, event, deadline, on_error)
}

/// Poll `query` (whether the event completed) until it says done or `timeout` passes; the
/// default [`DeviceApi::event_wait`] of runtimes with an event query. Spins briefly, then
/// sleeps up to 1 ms between queries.
pub(crate) fn poll_event(
    timeout: Duration,
    query: &dyn Fn() -> Result<bool, ApiError>,
) -> Result<bool, ApiError> {
    let started = Instant::now();
    let mut pause = Duration::from_micros(20);
    for round in 0u32.. {
        if query()? {
            return Ok(true);
        }
        if started.elapsed() >= timeout || interrupted() {
            return Ok(false);
        }
        if round < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }
    Ok(false)
}

/// Host memory a stuck cell's work may still read or write.
#[derive(Debug)]
pub(crate) enum LeakedHost {
    /// Runtime-allocated pinned memory (address, bytes).
    Pinned(usize, usize),
    /// Pageable memory, kept alive (never dropped while the entry lives).
    Pageable(Vec<u8>),
}

/// What one timed-out cell left on the device: kept, never released, until its last event
/// says the work is done.
#[derive(Debug, Default)]
pub(crate) struct Stuck {
    /// Devices its work involves (quarantined while it is stuck).
    pub devices: Vec<i32>,
    /// Its stream (address).
    pub stream: usize,
    /// Its events (addresses); the first is the one recorded last on the stream.
    pub events: Vec<usize>,
    /// Device allocations (address, bytes).
    pub device_memory: Vec<(usize, usize)>,
    pub host_memory: Vec<LeakedHost>,
    /// Peer access the cell enabled (device, peer), to disable once the work is done.
    pub peer_access: Vec<(i32, i32)>,
}

impl Stuck {
    fn device_bytes(&self) -> u64 {
        self.device_memory.iter().map(|(_, b)| *b as u64).sum()
    }

    fn host_bytes(&self) -> u64 {
        self.host_memory
            .iter()
            .map(|h| match h {
                LeakedHost::Pinned(_, b) => *b as u64,
                LeakedHost::Pageable(v) => v.len() as u64,
            })
            .sum()
    }

    /// Release everything, the work being done.
    fn release<A: DeviceApi + ?Sized>(self, api: &A) {
        let h = |a: usize| a as Handle;
        let warn = |what: &str, r: Result<(), ApiError>| {
            if let Err(e) = r {
                tracing::warn!("releasing a stuck cell's {what}: {e}");
            }
        };
        warn("stream", api.stream_synchronize(h(self.stream)));
        warn("stream", api.stream_destroy(h(self.stream)));
        for e in &self.events {
            warn("event", api.event_destroy(h(*e)));
        }
        for (p, _) in &self.device_memory {
            warn("device memory", api.device_free(h(*p)));
        }
        for m in &self.host_memory {
            if let LeakedHost::Pinned(p, _) = m {
                warn("pinned memory", api.host_free_pinned(h(*p)));
            }
        }
        for (dev, peer) in &self.peer_access {
            warn(
                "peer access",
                api.set_device(*dev)
                    .and_then(|()| api.disable_peer_access(*peer)),
            );
        }
    }
}

/// What the stuck work holds now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StuckReport {
    /// Device labels whose work did not finish (quarantined).
    pub devices: BTreeSet<String>,
    /// Device memory left allocated under that work.
    pub device_bytes: u64,
    /// Host memory (pinned or not) left allocated under it.
    pub host_bytes: u64,
}

/// Every stuck cell of one runtime.
#[derive(Debug, Default)]
pub struct StuckWork {
    entries: Mutex<Vec<Stuck>>,
}

impl StuckWork {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Stuck>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keep a timed-out cell's work.
    pub(crate) fn keep(&self, stuck: Stuck) {
        tracing::warn!(
            devices = ?stuck.devices,
            device_bytes = stuck.device_bytes(),
            host_bytes = stuck.host_bytes(),
            "a copy cell timed out: its device work may still run, so its memory is kept \
             (leaked) and its devices are quarantined until it finishes"
        );
        self.lock().push(stuck);
    }

    /// Whether `device` has stuck work (is quarantined).
    pub(crate) fn holds(&self, device: i32) -> bool {
        self.lock().iter().any(|s| s.devices.contains(&device))
    }

    /// The quarantined devices (labelled by `label`) and the memory held.
    pub(crate) fn report(&self, label: impl Fn(i32) -> String) -> StuckReport {
        let entries = self.lock();
        StuckReport {
            devices: entries
                .iter()
                .flat_map(|s| s.devices.iter().map(|&d| label(d)))
                .collect(),
            device_bytes: entries.iter().map(Stuck::device_bytes).sum(),
            host_bytes: entries.iter().map(Stuck::host_bytes).sum(),
        }
    }

    /// Release the entries whose work has finished (their last event completed).
    pub(crate) fn recheck<A: DeviceApi + ?Sized>(&self, api: &A) {
        let done: Vec<Stuck> = {
            let mut entries = self.lock();
            let (done, still): (Vec<Stuck>, Vec<Stuck>) =
                std::mem::take(&mut *entries).into_iter().partition(|s| {
                    s.events.first().is_some_and(|&e| {
                        matches!(api.event_wait(e as Handle, Duration::ZERO), Ok(true))
                    })
                });
            *entries = still;
            done
        };
        for stuck in done {
            tracing::info!(devices = ?stuck.devices, "a stuck copy cell finished: its memory is freed");
            stuck.release(api);
        }
    }
}

/// A stuck cell's address of a handle.
pub(crate) fn addr(h: Handle) -> usize {
    h as usize
}
