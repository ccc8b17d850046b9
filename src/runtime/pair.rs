//! The core-pair probe over a device runtime: a fixed pair of devices runs an allgather (NCCL
//! or HCCL), or a peer device-to-device copy where no collective library is found, with rank
//! r's thread bound to its cell's CPU before it enqueues (see `pair_cell`). Bus bandwidth as
//! nccl-tests defines it: per-rank bytes x (n - 1) / time.
//!
//! Peer copies first enable peer access both ways (`peer_access`); where the runtime refuses,
//! CUDA still measures, host-staged, and the pair's method is `copy-staged`. Communicators
//! and peer access are held per pair until [`PairProbe::release_idle`] (the end of a probe
//! window; the end of a one-shot run), and exported through [`PairProbe::holdings`]. A cell
//! that does not finish within its timeout is reported as an error within the timeout plus
//! a bounded grace for its cleanup (`pair_hold`); it never stalls the exporter.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use super::device_copy::DeviceApi;
pub use super::pair_cell::PairParams;
use super::pair_cell::{run_rank, Cell, Method, OpGate, Quiet, Rendezvous};
pub use super::pair_hold::CommState;
use super::pair_hold::{label, PairHold};
use super::peer_access::{self, PeerRoute};
use super::{DeviceInfo, ProbeError};

/// Longest a timed-out or failed cell waits for its communicators' abort (at most the cell's
/// own timeout): a cell costs at most its timeout plus this.
const ABORT_GRACE: Duration = Duration::from_secs(1);

/// What a pair probe holds right now (for `/metrics`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Holdings {
    /// The collective library (`nccl`, `hccl`), none for peer copies.
    pub library: Option<&'static str>,
    /// Communicators by state (every state listed when there is a library).
    pub communicators: Vec<(CommState, usize)>,
    /// Device memory held per device label, where the library documents its buffers (HCCL):
    /// every device of the backend, 0 where nothing is held.
    pub device_memory: Option<Vec<(String, u64)>>,
    /// `pair` label -> method, for every pair whose method is known.
    pub methods: Vec<(String, &'static str)>,
}

/// A pair probe: `measure` runs one (rank0 CPU, rank1 CPU) cell of a device pair.
pub trait PairProbe: Send + Sync {
    /// The configured method: `nccl`, `hccl` or `copy` (peer device-to-device copies).
    fn method(&self) -> &'static str;
    /// What measures `devices`: `nccl`, `hccl`, `copy`, or `copy-staged` (peer access
    /// refused: the copies are host-staged). The first call for a peer-copy pair asks the
    /// runtime whether the devices can map each other (nothing is changed); after a cell,
    /// this is what the cell measured with.
    fn pair_method(&self, devices: [&str; 2]) -> Result<&'static str, ProbeError>;
    /// Bus bandwidth, bytes per second, of `devices` with rank r bound to `cpus[r]`.
    fn measure(
        &self,
        devices: [&str; 2],
        cpus: [u32; 2],
        params: &PairParams,
    ) -> Result<f64, ProbeError>;
    /// Release what is held between cells (communicators, peer access) and retry the
    /// quarantined communicators. The next cell of a pair acquires them again.
    fn release_idle(&self);
    /// What is held now; cheap, never calls into a runtime.
    fn holdings(&self) -> Holdings;
    /// chd is stopping: a cell in flight gives up now, as on its timeout (its communicators
    /// are aborted on the side), instead of waiting out a hung collective, and later cells
    /// fail at once. For good: called on the way out.
    fn stop(&self) {}
}

/// How often a cell waiting for its ranks looks at [`PairProbe::stop`].
const STOP_POLL: Duration = Duration::from_millis(50);

/// A pair probe over a device runtime (CUDA or ACL).
pub struct DevicePairProbe {
    api: Arc<dyn DeviceApi>,
    method: Method,
    devices: Vec<DeviceInfo>,
    hold: PairHold,
    /// Known method per pair (predicted, then what the last cell used).
    methods: Mutex<BTreeMap<[i32; 2], &'static str>>,
    /// Set by [`PairProbe::stop`].
    stopping: AtomicBool,
}

impl DevicePairProbe {
    /// `per_card`: the HCCL communicators held at once on one card (at least 1).
    pub(crate) fn new(
        api: Arc<dyn DeviceApi>,
        method: Method,
        devices: Vec<DeviceInfo>,
        per_card: u32,
    ) -> Self {
        let coll = match &method {
            Method::Collective(c) => Some(c.clone()),
            Method::PeerCopy => None,
        };
        DevicePairProbe {
            hold: PairHold::new(api.clone(), coll, per_card),
            api,
            method,
            devices,
            methods: Mutex::new(BTreeMap::new()),
            stopping: AtomicBool::new(false),
        }
    }

    fn index(&self, device: &str) -> Result<i32, ProbeError> {
        super::device_index(&self.devices, device)
    }

    fn pair(&self, devices: [&str; 2]) -> Result<[i32; 2], ProbeError> {
        Ok([self.index(devices[0])?, self.index(devices[1])?])
    }

    /// Remember `method` for `pair`. A cell that found peer access refused where the
    /// prediction (or an earlier cell) said otherwise is logged with the reason; a predicted
    /// method is for the caller to report.
    fn note_method(&self, pair: [i32; 2], method: &'static str, why: Option<&str>) {
        let previous = self
            .methods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(pair, method);
        if previous.is_some_and(|p| p != method) && method == peer_access::COPY_STAGED {
            tracing::warn!(
                pair = %label(pair),
                method,
                "peer access refused ({}): the pair's copies are staged through host memory \
                 and measure that, not the link",
                why.unwrap_or("unknown reason")
            );
        }
    }
}

impl Drop for DevicePairProbe {
    fn drop(&mut self) {
        self.hold.release_idle();
    }
}

impl PairProbe for DevicePairProbe {
    fn method(&self) -> &'static str {
        match &self.method {
            Method::Collective(c) => c.name(),
            Method::PeerCopy => peer_access::COPY,
        }
    }

    fn pair_method(&self, devices: [&str; 2]) -> Result<&'static str, ProbeError> {
        let pair = self.pair(devices)?;
        if let Method::Collective(c) = &self.method {
            return Ok(c.name());
        }
        if let Some(m) = self
            .methods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&pair)
        {
            return Ok(m);
        }
        let why = peer_access::refusal(&*self.api, pair)
            .map_err(|e| ProbeError::Device(e.to_string()))?;
        let method = match &why {
            Some(_) if self.api.stages_peer_copies() => peer_access::COPY_STAGED,
            _ => peer_access::COPY,
        };
        self.methods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(pair, method);
        Ok(method)
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
        if self.stopping.load(Ordering::SeqCst) {
            return Err(ProbeError::Timeout("chd is stopping".into()));
        }
        let pair = self.pair(devices)?;
        let comms = match &self.method {
            Method::Collective(_) => self.hold.comms(pair)?,
            Method::PeerCopy => {
                let route = self.hold.peer(pair);
                let why = match &route {
                    PeerRoute::Direct => None,
                    PeerRoute::Staged(why) | PeerRoute::Refused(why) => Some(why.as_str()),
                };
                self.note_method(pair, route.method(), why);
                if let PeerRoute::Refused(why) = route {
                    return Err(ProbeError::Device(format!(
                        "pair {}: peer access refused ({why}); this runtime cannot copy \
                         between the devices without it",
                        label(pair)
                    )));
                }
                [0, 0]
            }
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
            gate: Arc::new(OpGate::default()),
            quiet: Quiet::default(),
        });
        let grace = ABORT_GRACE.min(params.timeout);
        let give_up = |cell: &Arc<Cell>| {
            cell.meet.break_it();
            let any: Arc<dyn std::any::Any + Send + Sync> = cell.clone();
            self.hold
                .give_up(pair, &cell.gate, Arc::downgrade(&any), grace);
        };
        let (tx, rx) = mpsc::channel();
        for rank in 0..2 {
            let rank_cell = cell.clone();
            let tx = tx.clone();
            // Dedicated threads: their bindings die with them. A thread stuck in a hung call
            // is left behind; the cell's gate keeps it from starting another.
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
                give_up(&cell);
                return Err(ProbeError::Device(format!("cannot start rank thread: {e}")));
            }
        }
        drop(tx);
        let deadline = Instant::now() + params.timeout;
        let mut times = [0.0f64; 2];
        let mut first_error = None;
        let mut answered = 0;
        while answered < 2 {
            let left = deadline.saturating_duration_since(Instant::now());
            if self.stopping.load(Ordering::SeqCst) {
                give_up(&cell);
                return Err(ProbeError::Timeout(format!(
                    "pair {},{} on cpus {},{}: given up, chd is stopping",
                    devices[0], devices[1], cpus[0], cpus[1]
                )));
            }
            match rx.recv_timeout(left.min(STOP_POLL)) {
                Ok((rank, Ok(ms))) => times[rank] = ms,
                Ok((_, Err(e))) => {
                    first_error.get_or_insert(e);
                }
                Err(mpsc::RecvTimeoutError::Timeout) if !left.is_zero() => continue,
                Err(_) => {
                    give_up(&cell);
                    return Err(ProbeError::Timeout(format!(
                        "pair {},{} on cpus {},{} did not finish within {:?}",
                        devices[0], devices[1], cpus[0], cpus[1], params.timeout
                    )));
                }
            }
            answered += 1;
        }
        if let Some(e) = first_error {
            if let (Method::Collective(_), ProbeError::Collective(_) | ProbeError::Timeout(_)) =
                (&self.method, &e)
            {
                give_up(&cell);
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

    fn release_idle(&self) {
        self.hold.release_idle();
    }

    fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    fn holdings(&self) -> Holdings {
        let (states, memory) = self.hold.counts();
        let library = match &self.method {
            Method::Collective(c) => Some(c.name()),
            Method::PeerCopy => None,
        };
        let communicators = match library {
            Some(_) => CommState::ALL
                .iter()
                .map(|s| (*s, states.get(s).copied().unwrap_or(0)))
                .collect(),
            None => Vec::new(),
        };
        let device_memory = memory.map(|by_device| {
            self.devices
                .iter()
                .map(|d| {
                    let held =
                        d.id.parse::<i32>()
                            .ok()
                            .and_then(|i| by_device.get(&i).copied())
                            .unwrap_or(0);
                    (d.id.clone(), held)
                })
                .collect()
        });
        let methods = self
            .methods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(p, m)| (label(*p), *m))
            .collect();
        Holdings {
            library,
            communicators,
            device_memory,
            methods,
        }
    }
}
