//! The core-pair probe over a device runtime: a fixed pair of devices runs an allgather (NCCL
//! or HCCL), or a peer device-to-device copy where no collective library is found, with rank
//! r's thread bound to its cell's CPU before it enqueues. Warm-up, a barrier outside the
//! timed region, device events around N operations per rank; bus bandwidth as nccl-tests
//! defines it: per-rank bytes x (n - 1) / time. A collective that does not finish within the
//! timeout is aborted and reported as an error; it never stalls the exporter.

use std::collections::HashMap;
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::collective::CollectiveApi;
use super::device_copy::{guard, stream_guard, ApiError, DeviceApi, Handle, HostBuffer};
use super::{DeviceInfo, Direction, HostMemory, ProbeError};
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

/// A pair probe: `measure` runs one (rank0 CPU, rank1 CPU) cell of a device pair.
pub trait PairProbe: Send + Sync {
    /// `nccl`, `hccl` or `copy` (peer device-to-device copies).
    fn method(&self) -> &'static str;
    /// Bus bandwidth, bytes per second, of `devices` with rank r bound to `cpus[r]`.
    fn measure(
        &self,
        devices: [&str; 2],
        cpus: [u32; 2],
        params: &PairParams,
    ) -> Result<f64, ProbeError>;
}

/// What moves the bytes.
#[derive(Clone)]
pub(crate) enum Method {
    Collective(Arc<dyn CollectiveApi>),
    PeerCopy,
}

/// A pair probe over a device runtime (CUDA or ACL).
pub struct DevicePairProbe {
    api: Arc<dyn DeviceApi>,
    method: Method,
    devices: Vec<DeviceInfo>,
    /// Communicators per device pair, created once (creation is slow on real hardware).
    comms: Mutex<HashMap<[i32; 2], [usize; 2]>>,
}

impl DevicePairProbe {
    pub(crate) fn new(api: Arc<dyn DeviceApi>, method: Method, devices: Vec<DeviceInfo>) -> Self {
        DevicePairProbe {
            api,
            method,
            devices,
            comms: Mutex::new(HashMap::new()),
        }
    }

    fn index(&self, device: &str) -> Result<i32, ProbeError> {
        super::device_index(&self.devices, device)
    }

    fn comms_for(
        &self,
        coll: &dyn CollectiveApi,
        pair: [i32; 2],
    ) -> Result<[usize; 2], ProbeError> {
        let mut cache = self.comms.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = cache.get(&pair) {
            return Ok(*c);
        }
        let comms = coll
            .init_all(&pair)
            .map_err(|e| ProbeError::Collective(e.to_string()))?;
        let c = [comms[0] as usize, comms[1] as usize];
        cache.insert(pair, c);
        Ok(c)
    }

    /// Abort and forget the communicators of `pair` (after a timeout or failure).
    fn drop_comms(&self, coll: &dyn CollectiveApi, pair: [i32; 2]) {
        let removed = self
            .comms
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&pair);
        if let Some(c) = removed {
            for comm in c {
                coll.abort(comm as Handle);
            }
        }
    }
}

impl Drop for DevicePairProbe {
    fn drop(&mut self) {
        if let Method::Collective(coll) = &self.method {
            let cache = self.comms.get_mut().unwrap_or_else(|p| p.into_inner());
            for (_, comms) in cache.drain() {
                for comm in comms {
                    coll.destroy(comm as Handle);
                }
            }
        }
    }
}

/// A two-party barrier that can be broken (a rank that fails releases the other) and waits
/// at most until a deadline.
struct Rendezvous {
    state: Mutex<(usize, u64, bool)>,
    cv: Condvar,
    deadline: Instant,
}

impl Rendezvous {
    fn new(deadline: Instant) -> Rendezvous {
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

    fn break_it(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.2 = true;
        self.cv.notify_all();
    }
}

/// Shared between the two rank threads of one cell.
struct Cell {
    api: Arc<dyn DeviceApi>,
    method: Method,
    devices: [i32; 2],
    cpus: [u32; 2],
    comms: [usize; 2],
    params: PairParams,
    /// Each rank's receive buffer (ranks x bytes), published for peer copies.
    recv: Mutex<[usize; 2]>,
    meet: Rendezvous,
    /// Which ranks' streams are synchronized for good (or were never used).
    quiet: Quiet,
}

/// Ranks whose streams have finished all their work. A rank's peer copies write into the
/// other rank's receive buffer, so neither rank frees its buffers before both streams are
/// quiet (within the cell's deadline), on error paths too.
#[derive(Default)]
struct Quiet {
    done: Mutex<[bool; 2]>,
    cv: Condvar,
}

impl Quiet {
    fn mark(&self, rank: usize) {
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

/// Declared just before a rank's stream, so it drops right after the stream was synchronized
/// and destroyed: releases a peer waiting at the rendezvous (this rank meets no more; after
/// the last meeting that changes nothing), marks the rank quiet, then waits for the peer
/// before the buffers go.
struct QuietOnDrop<'a> {
    cell: &'a Cell,
    rank: usize,
}

impl Drop for QuietOnDrop<'_> {
    fn drop(&mut self) {
        let (quiet, peer) = (&self.cell.quiet, 1 - self.rank);
        self.cell.meet.break_it();
        quiet.mark(self.rank);
        if !quiet.wait_for(peer, self.cell.meet.deadline) {
            tracing::warn!(
                "rank {} frees its buffers while rank {peer}'s stream may still use them \
                 (the cell's deadline passed)",
                self.rank
            );
        }
    }
}

fn device_error(e: ApiError) -> ProbeError {
    ProbeError::Device(e.to_string())
}

fn collective_error(e: ApiError) -> ProbeError {
    ProbeError::Collective(e.to_string())
}

/// One rank's side: bind, allocate, warm up, meet, time, meet, verify. Returns milliseconds.
fn run_rank(cell: &Cell, rank: usize) -> Result<f64, ProbeError> {
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
    let _quiet = QuietOnDrop { cell, rank };
    // Last: synchronized and destroyed before anything above is released.
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

impl PairProbe for DevicePairProbe {
    fn method(&self) -> &'static str {
        match &self.method {
            Method::Collective(c) => c.name(),
            Method::PeerCopy => "copy",
        }
    }

    fn measure(
        &self,
        devices: [&str; 2],
        cpus: [u32; 2],
        params: &PairParams,
    ) -> Result<f64, ProbeError> {
        if params.bytes_per_rank == 0 || params.iterations == 0 {
            return Err(ProbeError::Timing(
                "a pair cell needs a size and at least one iteration".into(),
            ));
        }
        let pair = [self.index(devices[0])?, self.index(devices[1])?];
        let comms = match &self.method {
            Method::Collective(coll) => self.comms_for(&**coll, pair)?,
            Method::PeerCopy => [0, 0],
        };
        let cell = Arc::new(Cell {
            api: self.api.clone(),
            method: self.method.clone(),
            devices: pair,
            cpus,
            comms,
            params: *params,
            recv: Mutex::new([0, 0]),
            meet: Rendezvous::new(Instant::now() + params.timeout),
            quiet: Quiet::default(),
        });
        let (tx, rx) = mpsc::channel();
        for rank in 0..2 {
            let rank_cell = cell.clone();
            let tx = tx.clone();
            // Dedicated threads: their bindings die with them. A thread stuck in a hung
            // collective is left behind once its communicator is aborted.
            let spawned = std::thread::Builder::new()
                .name(format!("chd-rank{rank}"))
                .spawn(move || {
                    let result = run_rank(&rank_cell, rank);
                    // Whatever it got to, this rank's stream has nothing left in flight.
                    rank_cell.quiet.mark(rank);
                    if result.is_err() {
                        rank_cell.meet.break_it();
                    }
                    let _ = tx.send((rank, result));
                });
            if let Err(e) = spawned {
                cell.meet.break_it();
                return Err(ProbeError::Device(format!("cannot start rank thread: {e}")));
            }
        }
        drop(tx);
        let deadline = Instant::now() + params.timeout;
        let mut times = [0.0f64; 2];
        let mut first_error = None;
        for _ in 0..2 {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((rank, Ok(ms))) => times[rank] = ms,
                Ok((_, Err(e))) => {
                    first_error.get_or_insert(e);
                }
                Err(_) => {
                    cell.meet.break_it();
                    if let Method::Collective(coll) = &self.method {
                        self.drop_comms(&**coll, pair);
                    }
                    return Err(ProbeError::Timeout(format!(
                        "pair {},{} on cpus {},{} did not finish within {:?}",
                        devices[0], devices[1], cpus[0], cpus[1], params.timeout
                    )));
                }
            }
        }
        if let Some(e) = first_error {
            if let (Method::Collective(coll), ProbeError::Collective(_)) = (&self.method, &e) {
                self.drop_comms(&**coll, pair);
            }
            return Err(e);
        }
        let ms = times[0].max(times[1]);
        if !(ms.is_finite() && ms > 0.0) {
            return Err(ProbeError::Timing(format!(
                "device events measured {ms} ms"
            )));
        }
        // nccl-tests' bus bandwidth for allgather: per-rank bytes x (n - 1) / time.
        let n = 2.0;
        Ok(params.bytes_per_rank as f64 * (n - 1.0) * f64::from(params.iterations) / (ms / 1e3))
    }
}

#[cfg(test)]
mod quiet_tests {
    use super::*;

    #[test]
    fn a_rank_waits_for_its_peer_s_stream_but_never_past_the_deadline() {
        let quiet = Arc::new(Quiet::default());
        // Never marked: gives up at the deadline.
        let t0 = Instant::now();
        assert!(!quiet.wait_for(1, t0 + Duration::from_millis(50)));
        assert!(t0.elapsed() >= Duration::from_millis(50));
        // Marked by the peer's thread while waiting: released at once.
        let peer = {
            let quiet = quiet.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                quiet.mark(1);
            })
        };
        assert!(quiet.wait_for(1, Instant::now() + Duration::from_secs(10)));
        peer.join().unwrap();
        // Marks are per rank and stay.
        assert!(quiet.wait_for(1, Instant::now()));
        assert!(!quiet.wait_for(0, Instant::now()));
    }
}
