//! Device work that did not finish in time, and the deadline copy cells wait under.
//!
//! Every wait of an event-timed copy cell (h2d, d2h, same-device, peer) is bounded: its stream
//! is waited on through an event (`device_wait`; CUDA polls `cudaEventQuery`, ACL calls
//! `aclrtSynchronizeEventWithTimeout`) until the cell's deadline
//! ([`cell_timeout`], `probe.cell_timeout`). A cell whose work is not done by then is a
//! [`ProbeError::Timeout`], and what that work may still touch is never released under it:
//! the stream is neither synchronized nor destroyed (CANN wants a synchronize first, which
//! would never return), its events stay, and its device and host buffers are *leaked* rather
//! than freed under the DMA (`aclrtFree` frees at once without waiting for tasks; `cudaFree`
//! synchronizes, which would never return either). The leak is kept here, one `Stuck` entry
//! per cell, with the bytes it holds ([`StuckReport`], exported by the prober), and its
//! devices are *quarantined*: `StuckWork::holds` says so and the copy cells refuse them
//! ([`ProbeError::Quarantined`]) so no more work queues up behind the hung copy.
//! `device_wait::recheck` (at every window start) asks each entry's last event whether the
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

    pub(crate) fn timed_out(&self) -> ProbeError {
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

    /// Keep memory that another party's unfinished work may still touch (a pair cell's
    /// buffers after its peer rank missed the deadline), saying `why`. With no devices and
    /// no event it quarantines nothing and is never released: counted until chd exits.
    pub(crate) fn keep_leaked(&self, stuck: Stuck, why: &str) {
        tracing::warn!(
            device_bytes = stuck.device_bytes(),
            host_bytes = stuck.host_bytes(),
            "{why}"
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

    /// Take out the entries `finished` says are done (their work no longer touches
    /// anything): the caller releases them.
    pub(crate) fn take_finished(&self, finished: impl Fn(&Stuck) -> bool) -> Vec<Stuck> {
        let mut entries = self.lock();
        let (done, still): (Vec<Stuck>, Vec<Stuck>) = std::mem::take(&mut *entries)
            .into_iter()
            .partition(finished);
        *entries = still;
        done
    }
}

/// A stuck cell's address of a handle (`*mut c_void`).
pub(crate) fn addr<T>(h: *mut T) -> usize {
    h as usize
}
