//! One core-pair cell on its two rank threads: each binds to its CPU, allocates, warms up,
//! meets the other outside the timed region, times N operations with device events, meets
//! again and checks the peer's data arrived. The two ranks meet at a [`Rendezvous`] that a
//! failing rank (or the timeout) breaks, and every collective or peer-copy call passes an
//! [`OpGate`]: once the cell is cancelled no rank starts another call, so its communicators
//! can be aborted or destroyed without a rank using them afterwards.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::collective::CollectiveApi;
use super::device_copy::{guard, stream_guard, ApiError, DeviceApi, Guard, Handle, HostBuffer};
use super::stuck_work::Stuck;
use super::{Direction, HostMemory, ProbeError};
use crate::affinity;

/// How one pair cell is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PairParams {
    pub bytes_per_rank: u64,
    pub warmup: u32,
    pub iterations: u32,
    /// Longest a cell may take before it is aborted.
    pub timeout: Duration,
}

/// What moves the bytes.
#[derive(Clone)]
pub(crate) enum Method {
    Collective(Arc<dyn CollectiveApi>),
    PeerCopy,
}

/// A two-party barrier that can be broken (a rank that fails releases the other) and waits
/// at most until a deadline.
pub(crate) struct Rendezvous {
    state: Mutex<(usize, u64, bool)>,
    cv: Condvar,
    deadline: Instant,
}

impl Rendezvous {
    pub(crate) fn new(deadline: Instant) -> Rendezvous {
        Rendezvous {
            state: Mutex::new((0, 0, false)),
            cv: Condvar::new(),
            deadline,
        }
    }

    fn wait(&self) -> Result<(), ProbeError> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.2 {
            return Err(ProbeError::Collective("the other rank failed".into()));
        }
        let generation = s.1;
        s.0 += 1;
        if s.0 == 2 {
            s.0 = 0;
            s.1 += 1;
            self.cv.notify_all();
            return Ok(());
        }
        while s.1 == generation && !s.2 {
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                s.2 = true;
                self.cv.notify_all();
                return Err(ProbeError::Timeout("waiting for the other rank".into()));
            }
            s = self
                .cv
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        if s.1 == generation {
            return Err(ProbeError::Collective("the other rank failed".into()));
        }
        Ok(())
    }

    pub(crate) fn break_it(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.2 = true;
        self.cv.notify_all();
    }
}

/// Admits collective and peer-copy calls until the cell is cancelled, and counts the ones
/// inside the library right now.
#[derive(Debug, Default)]
pub(crate) struct OpGate {
    /// (cancelled, calls inside)
    state: Mutex<(bool, usize)>,
}

/// One admitted call; leaving the scope lets the gate count it out.
pub(crate) struct Admitted<'a>(&'a OpGate);

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.1 = s.1.saturating_sub(1);
    }
}

impl OpGate {
    fn lock(&self) -> MutexGuard<'_, (bool, usize)> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn enter(&self) -> Result<Admitted<'_>, ProbeError> {
        let mut s = self.lock();
        if s.0 {
            return Err(ProbeError::Collective(
                "the cell was cancelled (timeout or the other rank failed)".into(),
            ));
        }
        s.1 += 1;
        Ok(Admitted(self))
    }

    /// No call starts after this; returns how many are still inside the library.
    pub(crate) fn cancel(&self) -> usize {
        let mut s = self.lock();
        s.0 = true;
        s.1
    }
}

/// Shared between the two rank threads of one cell.
pub(crate) struct Cell {
    pub(crate) api: Arc<dyn DeviceApi>,
    pub(crate) method: Method,
    pub(crate) devices: [i32; 2],
    pub(crate) cpus: [u32; 2],
    pub(crate) comms: [usize; 2],
    pub(crate) params: PairParams,
    /// Each rank's receive buffer (ranks x bytes), published for peer copies.
    pub(crate) recv: Mutex<[usize; 2]>,
    pub(crate) meet: Rendezvous,
    pub(crate) gate: Arc<OpGate>,
    /// Which ranks' streams are synchronized for good (or were never used).
    pub(crate) quiet: Quiet,
}

/// Ranks whose streams have finished all their work. A rank's peer copies write into the
/// other rank's receive buffer, so neither rank frees its buffers before both streams are
/// quiet (within the cell's deadline), on error paths too.
#[derive(Default)]
pub(crate) struct Quiet {
    done: Mutex<[bool; 2]>,
    cv: Condvar,
}

impl Quiet {
    pub(crate) fn mark(&self, rank: usize) {
        self.done.lock().unwrap_or_else(|p| p.into_inner())[rank] = true;
        self.cv.notify_all();
    }

    /// Wait until `rank`'s stream is quiet, at most until `deadline`.
    fn wait_for(&self, rank: usize, deadline: Instant) -> bool {
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        while !done[rank] {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            done = self
                .cv
                .wait_timeout(done, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }
}

fn device_error(e: ApiError) -> ProbeError {
    ProbeError::Device(e.to_string())
}

fn collective_error(e: ApiError) -> ProbeError {
    ProbeError::Collective(e.to_string())
}

/// One rank's side: bind, allocate, warm up, meet, time, meet, verify. Returns milliseconds.
pub(crate) fn run_rank(cell: &Cell, rank: usize) -> Result<f64, ProbeError> {
    let api = &*cell.api;
    let bytes = cell.params.bytes_per_rank as usize;
    let _binding = affinity::bind_exactly(cell.cpus[rank]).map_err(|e| ProbeError::Bind {
        cpu: cell.cpus[rank],
        detail: e.to_string(),
    })?;
    api.set_device(cell.devices[rank]).map_err(device_error)?;
    let alloc = |n: usize| {
        guard(api, api.device_alloc(n), <dyn DeviceApi>::device_free).map_err(|e| {
            ProbeError::Alloc {
                bytes: n as u64,
                detail: e.to_string(),
            }
        })
    };
    let send = alloc(bytes)?;
    let recv = alloc(2 * bytes)?;
    let start =
        guard(api, api.event_create(), <dyn DeviceApi>::event_destroy).map_err(device_error)?;
    let end =
        guard(api, api.event_create(), <dyn DeviceApi>::event_destroy).map_err(device_error)?;
    // Host sides of the data check: runtime-allocated (ACL's async copies need it).
    let head_len = bytes.min(4096);
    let host = |n: usize| {
        HostBuffer::new(api, n, HostMemory::Pinned).map_err(|e| ProbeError::Alloc {
            bytes: n as u64,
            detail: e.to_string(),
        })
    };
    let mut mark = host(head_len)?;
    let mut head = host(head_len)?;
    let result = timed(
        cell,
        rank,
        (&send, &recv),
        (&start, &end),
        (&mut mark, &mut head),
    );
    // This rank's stream is synchronized and destroyed: nothing of its own is in flight.
    // Release a peer waiting at the rendezvous (after the last meeting that changes nothing),
    // say this rank is quiet, and wait for the peer's stream, at most until the deadline.
    let peer = 1 - rank;
    cell.meet.break_it();
    cell.quiet.mark(rank);
    if !cell.quiet.wait_for(peer, cell.meet.deadline) {
        // The peer's copy or allgather may still read `send` or write into `recv` (aclrtFree
        // frees at once; on a GPU it would be a fault in the peer's context): keep all of it.
        api.stuck_work().keep_leaked(
            Stuck {
                device_memory: vec![(send.leak(), bytes), (recv.leak(), 2 * bytes)],
                host_memory: vec![mark.leak(), head.leak()],
                ..Stuck::default()
            },
            &format!(
                "pair cell {},{}: rank {peer}'s stream did not finish by the cell's deadline; \
                 rank {rank} keeps its buffers (leaked, not freed under it)",
                cell.devices[0], cell.devices[1]
            ),
        );
    }
    result
}

/// The timed part of one rank's cell on a stream of its own, synchronized and destroyed
/// before it returns.
fn timed(
    cell: &Cell,
    rank: usize,
    (send, recv): (&Guard<'_, dyn DeviceApi>, &Guard<'_, dyn DeviceApi>),
    (start, end): (&Guard<'_, dyn DeviceApi>, &Guard<'_, dyn DeviceApi>),
    (mark, head): (
        &mut HostBuffer<'_, dyn DeviceApi>,
        &mut HostBuffer<'_, dyn DeviceApi>,
    ),
) -> Result<f64, ProbeError> {
    let api = &*cell.api;
    let bytes = cell.params.bytes_per_rank as usize;
    let head_len = bytes.min(4096);
    let stream = stream_guard(api).map_err(device_error)?;

    // A recognisable head per rank, for the data check after timing.
    mark.as_mut_slice().fill(0xA0u8 + rank as u8);
    api.copy_async(
        send.handle,
        mark.as_handle(),
        head_len,
        Direction::H2d,
        stream.handle,
    )
    .map_err(device_error)?;
    api.stream_synchronize(stream.handle)
        .map_err(device_error)?;
    cell.recv.lock().unwrap_or_else(|p| p.into_inner())[rank] = recv.handle as usize;
    cell.meet.wait()?;
    let peer_recv = cell.recv.lock().unwrap_or_else(|p| p.into_inner())[1 - rank];

    let op = || -> Result<(), ProbeError> {
        let _admitted = cell.gate.enter()?;
        match &cell.method {
            Method::Collective(coll) => coll
                .all_gather(
                    send.handle,
                    recv.handle,
                    bytes,
                    cell.comms[rank] as Handle,
                    stream.handle,
                )
                .map_err(collective_error),
            Method::PeerCopy => {
                // Rank r writes its block into the peer's buffer, as an allgather would.
                let dst = (peer_recv + rank * bytes) as Handle;
                api.copy_device_async(dst, send.handle, bytes, stream.handle)
                    .map_err(collective_error)
            }
        }
    };
    for _ in 0..cell.params.warmup {
        op()?;
    }
    api.stream_synchronize(stream.handle)
        .map_err(collective_error)?;
    cell.meet.wait()?;
    api.event_record(start.handle, stream.handle)
        .map_err(device_error)?;
    for _ in 0..cell.params.iterations {
        op()?;
    }
    api.event_record(end.handle, stream.handle)
        .map_err(device_error)?;
    api.event_synchronize(end.handle)
        .map_err(collective_error)?;
    let ms = api
        .event_elapsed_ms(start.handle, end.handle)
        .map_err(|e| ProbeError::Timing(e.to_string()))?;
    // Both ranks done before anyone frees a buffer the peer may still write into.
    cell.meet.wait()?;

    // The peer's block arrived in this rank's receive buffer.
    let peer = 1 - rank;
    let from = (recv.handle as usize + peer * bytes) as Handle;
    api.copy_async(
        head.as_handle(),
        from,
        head_len,
        Direction::D2h,
        stream.handle,
    )
    .map_err(device_error)?;
    api.stream_synchronize(stream.handle)
        .map_err(device_error)?;
    let want = 0xA0u8 + peer as u8;
    if head.as_mut_slice().iter().any(|&b| b != want) {
        return Err(ProbeError::Copy(format!(
            "rank {rank} did not receive rank {peer}'s data"
        )));
    }
    Ok(f64::from(ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancelled_gate_admits_nothing_and_counts_calls_inside() {
        let gate = OpGate::default();
        let a = gate.enter().unwrap();
        let b = gate.enter().unwrap();
        drop(a);
        assert_eq!(gate.cancel(), 1);
        assert!(gate.enter().is_err());
        drop(b);
        assert_eq!(gate.cancel(), 0);
    }

    #[test]
    fn a_rank_waits_for_its_peer_s_stream_but_never_past_the_deadline() {
        let quiet = Arc::new(Quiet::default());
        // Never marked: gives up at the deadline.
        let t0 = Instant::now();
        assert!(!quiet.wait_for(1, t0 + std::time::Duration::from_millis(50)));
        assert!(t0.elapsed() >= std::time::Duration::from_millis(50));
        // Marked by the peer's thread while waiting: released at once.
        let peer = {
            let quiet = quiet.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(20));
                quiet.mark(1);
            })
        };
        assert!(quiet.wait_for(1, Instant::now() + std::time::Duration::from_secs(10)));
        peer.join().unwrap();
        // Marks are per rank and stay.
        assert!(quiet.wait_for(1, Instant::now()));
        assert!(!quiet.wait_for(0, Instant::now()));
    }
}
