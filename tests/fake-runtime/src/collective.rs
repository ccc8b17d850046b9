//! The collective engine shared by the NCCL and HCCL roles: communicators, the rank-by-rank
//! init rendezvous, and 2-or-more-rank allgathers and all-reduces that really gather (reduce)
//! the bytes and are timed on the ranks' virtual stream clocks.
//!
//! Model:
//! - A *clique* is the set of communicators created together (one `ncclCommInitAll` /
//!   `HcclCommInitAll` call, or the `nranks` `ncclCommInitRank` / `HcclCommInitRootInfo`
//!   calls that met on one unique id). Rank `r` lives on device `devices[r]`.
//! - Every collective call of a rank gets the next sequence number of its communicator; the
//!   calls with the same number on all ranks form one operation. The operation runs when the
//!   last rank's call arrives: on the thread of that call, it waits `CHD_FAKE_PAIR_HANG_MS`
//!   (wall clock), copies every rank's send buffer into every rank's receive buffer in rank
//!   order, and sets every participating stream's clock to
//!   `max(clocks) + bytes_per_rank * (nranks - 1) / pair_gbps` (see [`duration_ns`]).
//!   Calls block until their operation has run (ungrouped) or the group's operations have run
//!   (at `ncclGroupEnd`), so the stream clocks are final when the call returns.
//! - A rank waiting longer than `CHD_FAKE_PAIR_TIMEOUT_MS` for its peers gives up with
//!   [`CollError::Timeout`] and marks the clique broken: later collectives on any of its
//!   communicators fail with the same error, and the async-error query reports it.
//!   `ncclCommAbort` marks the clique broken too ([`CollError::Aborted`]) and wakes every
//!   waiting rank.
//! - NCCL teardown ([`teardown`]) is an intra-node collective, as the NCCL API reference says
//!   of `ncclCommDestroy` ("all ranks on the same node should call \[it\] to avoid a hang") and
//!   `ncclCommAbort` ("all active ranks are required to call this function"): a destroy or
//!   abort returns once every rank of its clique entered one; the communicators go away
//!   together. A call waiting longer than `CHD_FAKE_PAIR_TIMEOUT_MS` fails with
//!   [`CollError::InvalidUsage`] and leaves its communicators alive, where real NCCL would
//!   hang: one thread tearing down several ranks one by one, outside a group, does that.
//! - HCCL destroy is local, but a communicator with a collective in flight (a rank blocked in
//!   `HcclAllGather`) cannot be destroyed: [`CollError::Busy`] (`HCCL_E_AGAIN`).

use std::collections::HashMap;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::config;
use crate::device;
use crate::memory::{self, Api, Location};
use crate::net::reduce::{reduce_into, Elem, RedOp};
use crate::timing::{self, StreamRef};

/// Which collective library a communicator belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lib {
    Nccl,
    Hccl,
}

impl Lib {
    /// The runtime API whose streams this library takes.
    pub fn api(self) -> Api {
        match self {
            Lib::Nccl => Api::Cuda,
            Lib::Hccl => Api::Acl,
        }
    }

    fn index(self) -> usize {
        match self {
            Lib::Nccl => 0,
            Lib::Hccl => 1,
        }
    }
}

/// Why a communicator or collective call failed. Each library maps these to its own codes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CollError {
    /// A required pointer argument is NULL.
    NullPointer(&'static str),
    /// Bad value: unknown communicator, rank out of range, bad data type, buffers that are
    /// not device memory of the communicator's device, ranks disagreeing on the size, ...
    InvalidArgument(String),
    /// Misuse: duplicate device in a clique, a rank joining twice, `ncclGroupEnd` without
    /// `ncclGroupStart`.
    InvalidUsage(String),
    /// The stream is unknown, of the other API, or on another device than the communicator.
    BadStream(String),
    /// The calling thread has no valid current device.
    NoDevice,
    /// `CHD_FAKE_PAIR_FAIL` is set.
    Planted,
    /// The peers did not arrive within `CHD_FAKE_PAIR_TIMEOUT_MS`.
    Timeout,
    /// A communicator of the clique was aborted.
    Aborted,
    /// The communicator is in use (a collective in flight): try again later.
    Busy(String),
    /// An internal panic while running the operation.
    Internal,
    /// A peer process failed or went away (cross-process communicators: connection closed
    /// or reset); the text names the peer.
    Remote(String),
    /// A local system failure (cross-process communicators: no interface, no answer within
    /// the timeout, a socket that cannot be opened); the text says which.
    System(String),
    /// A call the real library supports but the fake does not (point-to-point on an
    /// in-process communicator or one of more than 2 ranks); the text says what is missing.
    Unsupported(String),
}

impl std::fmt::Display for CollError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CollError::NullPointer(what) => write!(f, "{what} is NULL"),
            CollError::InvalidArgument(why)
            | CollError::InvalidUsage(why)
            | CollError::BadStream(why)
            | CollError::Busy(why)
            | CollError::Remote(why)
            | CollError::System(why)
            | CollError::Unsupported(why) => f.write_str(why),
            CollError::NoDevice => f.write_str("the calling thread has no valid current device"),
            CollError::Planted => f.write_str("collective failed (CHD_FAKE_PAIR_FAIL)"),
            CollError::Timeout => f.write_str(
                "peers did not join within CHD_FAKE_PAIR_TIMEOUT_MS; communicator is broken",
            ),
            CollError::Aborted => f.write_str("a communicator of this clique was aborted"),
            CollError::Internal => f.write_str("internal error in the fake collective"),
        }
    }
}

/// What an operation does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    AllGather,
    AllReduce(Elem, RedOp),
}

/// One rank's contribution to an allgather or all-reduce.
#[derive(Clone, Copy, Debug)]
struct Part {
    kind: Kind,
    send: usize,
    recv: usize,
    /// Bytes per rank (allgather), bytes of the buffer (all-reduce).
    bytes: usize,
    stream: StreamRef,
    /// CPU of the thread that enqueued the call.
    cpu: Option<usize>,
}

#[derive(Debug)]
struct Op {
    parts: Vec<Option<Part>>,
    joined: usize,
    result: Option<Result<(), CollError>>,
    collected: usize,
}

#[derive(Debug)]
struct CliqueState {
    broken: Option<CollError>,
    ops: HashMap<u64, Op>,
    /// Ranks inside an NCCL destroy or abort, waiting for the others.
    leaving: Vec<bool>,
}

/// Communicators created together; shared by all of them.
#[derive(Debug)]
pub struct Clique {
    lib: Lib,
    devices: Vec<usize>,
    state: Mutex<CliqueState>,
    cv: Condvar,
}

impl Clique {
    fn new(lib: Lib, devices: Vec<usize>) -> Arc<Clique> {
        let leaving = vec![false; devices.len()];
        Arc::new(Clique {
            lib,
            devices,
            state: Mutex::new(CliqueState {
                broken: None,
                ops: HashMap::new(),
                leaving,
            }),
            cv: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, CliqueState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait_timeout<'a>(
        &self,
        guard: MutexGuard<'a, CliqueState>,
        dur: Duration,
    ) -> MutexGuard<'a, CliqueState> {
        match self.cv.wait_timeout(guard, dur) {
            Ok((g, _)) => g,
            Err(e) => e.into_inner().0,
        }
    }

    fn nranks(&self) -> usize {
        self.devices.len()
    }
}

/// A communicator: one rank of a clique.
#[derive(Debug)]
struct Comm {
    lib: Lib,
    clique: Arc<Clique>,
    rank: usize,
    next_seq: u64,
    /// Collective calls of this communicator entered and not yet returned.
    in_flight: usize,
}

static COMMS: Mutex<Option<HashMap<usize, Comm>>> = Mutex::new(None);
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(0);
static COMPLETED: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

fn with_comms<R>(f: impl FnOnce(&mut HashMap<usize, Comm>) -> R) -> R {
    let mut guard = COMMS.lock().unwrap_or_else(|e| e.into_inner());
    f(guard.get_or_insert_with(HashMap::new))
}

fn register(lib: Lib, clique: &Arc<Clique>, rank: usize) -> usize {
    // Pointer-looking, 64-byte spaced, distinct from stream/event handles.
    let handle = 0x7fb0_0000_0000 + (NEXT_HANDLE.fetch_add(1, Ordering::Relaxed) + 1) * 64;
    with_comms(|m| {
        m.insert(
            handle,
            Comm {
                lib,
                clique: Arc::clone(clique),
                rank,
                next_seq: 0,
                in_flight: 0,
            },
        );
        if lib == Lib::Hccl {
            let device = clique.devices[rank];
            let on_card = m
                .values()
                .filter(|c| c.lib == Lib::Hccl && c.clique.devices[c.rank] == device)
                .count() as u64;
            MAX_HCCL_PER_CARD.fetch_max(on_card, Ordering::Relaxed);
        }
    });
    handle
}

/// The most live HCCL communicators one card had at once.
static MAX_HCCL_PER_CARD: AtomicU64 = AtomicU64::new(0);

/// The most live HCCL communicators one card had at once in this process (each holds 2 x
/// `HCCL_BUFFSIZE` of the card's memory).
pub fn max_hccl_communicators_per_card() -> u64 {
    MAX_HCCL_PER_CARD.load(Ordering::Relaxed)
}

/// HCCL calls refused because another communicator's collective was in flight on the card.
static CONCURRENT_HCCL: AtomicU64 = AtomicU64::new(0);

/// HCCL calls (communicator init, collective) refused because a collective of another
/// communicator was still in flight on one of their cards.
pub fn concurrent_hccl_calls() -> u64 {
    CONCURRENT_HCCL.load(Ordering::Relaxed)
}

/// CANN: one card runs one collective API at a time. Refuse an HCCL call on `devices` (made
/// for communicator `except`, if any) while another communicator's collective is in flight
/// on one of them.
fn refuse_concurrent_hccl(
    m: &HashMap<usize, Comm>,
    devices: &[usize],
    except: Option<usize>,
) -> Result<(), CollError> {
    let busy = m.iter().find(|(&h, c)| {
        c.lib == Lib::Hccl
            && c.in_flight > 0
            && Some(h) != except
            && devices.contains(&c.clique.devices[c.rank])
    });
    match busy {
        Some((_, c)) => {
            CONCURRENT_HCCL.fetch_add(1, Ordering::Relaxed);
            Err(CollError::Busy(format!(
                "device {} still runs a collective of another communicator; CANN allows one \
                 collective API at a time on a card",
                c.clique.devices[c.rank]
            )))
        }
        None => Ok(()),
    }
}

/// Live communicators of both libraries, in-process and cross-process.
pub fn live_communicators() -> u64 {
    with_comms(|m| m.len() as u64) + crate::net::comm::live()
}

/// Completed collective calls of `lib` (a 2-rank allgather counts 2: one per rank's call).
pub fn completed(lib: Lib) -> u64 {
    COMPLETED[lib.index()].load(Ordering::Relaxed)
}

/// Counts `calls` completed collective calls of `lib` (cross-process communicators).
pub fn count_completed(lib: Lib, calls: u64) {
    COMPLETED[lib.index()].fetch_add(calls, Ordering::Relaxed);
}

/// What a communicator handle stands for.
#[derive(Clone, Debug)]
pub struct CommInfo {
    pub rank: usize,
    pub nranks: usize,
    pub device: usize,
    /// The clique's sticky error (rendezvous timeout or abort), if any.
    pub async_error: Option<CollError>,
}

/// Looks up a live communicator of `lib` (in-process or cross-process).
pub fn comm_info(lib: Lib, handle: *mut c_void) -> Result<CommInfo, CollError> {
    if handle.is_null() {
        return Err(CollError::NullPointer("comm"));
    }
    if let Some(info) = crate::net::comm::info(lib, handle) {
        return Ok(info);
    }
    let (clique, rank) = with_comms(|m| match m.get(&(handle as usize)) {
        Some(c) if c.lib == lib => Ok((Arc::clone(&c.clique), c.rank)),
        _ => Err(CollError::InvalidArgument(format!(
            "{handle:p} is not a live communicator"
        ))),
    })?;
    let async_error = clique.lock().broken.clone();
    Ok(CommInfo {
        rank,
        nranks: clique.nranks(),
        device: clique.devices[rank],
        async_error,
    })
}

/// How an NCCL communicator is torn down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Teardown {
    Destroy,
    /// Also breaks the clique, waking every rank blocked in one of its collectives.
    Abort,
}

fn not_live(handle: usize) -> CollError {
    CollError::InvalidArgument(format!("{handle:#x} is not a live communicator"))
}

/// Destroys an HCCL communicator (`HcclCommDestroy`): refused with [`CollError::Busy`] while
/// one of its collectives is in flight.
pub fn destroy_hccl(handle: *mut c_void) -> Result<(), CollError> {
    if handle.is_null() {
        return Err(CollError::NullPointer("comm"));
    }
    with_comms(|m| match m.get(&(handle as usize)) {
        Some(c) if c.lib == Lib::Hccl && c.in_flight > 0 => Err(CollError::Busy(
            "[HcclCommDestroy] comm is in use, please try again later".to_owned(),
        )),
        Some(c) if c.lib == Lib::Hccl => {
            m.remove(&(handle as usize));
            Ok(())
        }
        _ => Err(not_live(handle as usize)),
    })
}

/// Validates an NCCL communicator handle for a later [`teardown`].
pub fn check_nccl(handle: *mut c_void) -> Result<(), CollError> {
    comm_info(Lib::Nccl, handle).map(|_| ())
}

/// Tears down NCCL communicators together (one ungrouped `ncclCommDestroy`/`ncclCommAbort`,
/// or the ones queued in a group): every rank marks itself leaving (an abort also breaks its
/// clique at once), then waits until every rank of its clique is leaving, then all go. After
/// `CHD_FAKE_PAIR_TIMEOUT_MS` without the others: [`CollError::InvalidUsage`], the
/// communicators stay alive. An abort then blocks `CHD_FAKE_ABORT_HANG_MS` before returning.
pub fn teardown(calls: &[(usize, Teardown)]) -> Result<(), CollError> {
    if calls.is_empty() {
        return Ok(());
    }
    let entries = with_comms(|m| {
        calls
            .iter()
            .enumerate()
            .map(|(i, &(handle, how))| {
                if calls[..i].iter().any(|&(h, _)| h == handle) {
                    return Err(CollError::InvalidUsage(format!(
                        "communicator {handle:#x} is torn down twice"
                    )));
                }
                match m.get(&handle) {
                    Some(c) if c.lib == Lib::Nccl => Ok((Arc::clone(&c.clique), c.rank, how)),
                    _ => Err(not_live(handle)),
                }
            })
            .collect::<Result<Vec<_>, _>>()
    })?;
    let mut aborted = false;
    for (clique, rank, how) in &entries {
        let mut st = clique.lock();
        st.leaving[*rank] = true;
        if *how == Teardown::Abort {
            st.broken.get_or_insert(CollError::Aborted);
            aborted = true;
        }
        drop(st);
        clique.cv.notify_all();
    }
    let cfg = config::get();
    let deadline = Instant::now() + Duration::from_millis(cfg.pair_timeout_ms);
    let mut cliques: Vec<&Arc<Clique>> = Vec::new();
    for (clique, _, _) in &entries {
        if !cliques.iter().any(|c| Arc::ptr_eq(c, clique)) {
            cliques.push(clique);
        }
    }
    let mut missing = None;
    for clique in &cliques {
        let mut st = clique.lock();
        while missing.is_none() {
            if let Some(rank) = st.leaving.iter().position(|l| !l) {
                let now = Instant::now();
                if now >= deadline {
                    missing = Some(rank);
                    break;
                }
                st = clique.wait_timeout(st, deadline - now);
            } else {
                break;
            }
        }
    }
    if let Some(absent) = missing {
        for (clique, rank, _) in &entries {
            clique.lock().leaving[*rank] = false;
        }
        return Err(CollError::InvalidUsage(format!(
            "rank {} waited {} ms for rank {absent} of its communicator to call \
             ncclCommDestroy/ncclCommAbort too: teardown is an intra-node collective, and one \
             thread tearing down several ranks must group the calls (ncclGroupStart/End); real \
             NCCL hangs here",
            entries[0].1, cfg.pair_timeout_ms
        )));
    }
    with_comms(|m| {
        for (handle, _) in calls {
            m.remove(handle);
        }
    });
    if aborted && cfg.abort_hang_ms > 0 {
        std::thread::sleep(Duration::from_millis(cfg.abort_hang_ms));
    }
    Ok(())
}

/// Creates one communicator per device of `devices`, rank `i` on `devices[i]`
/// (`ncclCommInitAll`, `HcclCommInitAll`). Devices must be valid and distinct.
pub fn init_all(lib: Lib, devices: &[i64]) -> Result<Vec<*mut c_void>, CollError> {
    if devices.is_empty() {
        return Err(CollError::InvalidArgument(
            "at least one device is needed".to_owned(),
        ));
    }
    let mut devs = Vec::with_capacity(devices.len());
    for &d in devices {
        let dev = device::valid(d).ok_or_else(|| {
            CollError::InvalidArgument(format!(
                "invalid device {d} (device count {})",
                config::get().device_count
            ))
        })?;
        if devs.contains(&dev) {
            return Err(CollError::InvalidUsage(format!(
                "duplicate device {dev} in the device list"
            )));
        }
        devs.push(dev);
    }
    if lib == Lib::Hccl {
        with_comms(|m| refuse_concurrent_hccl(m, &devs, None))?;
    }
    let clique = Clique::new(lib, devs);
    Ok((0..devices.len())
        .map(|rank| register(lib, &clique, rank) as *mut c_void)
        .collect())
}

#[derive(Debug)]
struct PendingInit {
    devices: Vec<Option<usize>>,
    result: Option<Result<Arc<Clique>, CollError>>,
    picked: usize,
}

type InitKey = (Lib, Vec<u8>);

static INITS: Mutex<Option<HashMap<InitKey, PendingInit>>> = Mutex::new(None);
static INITS_CV: Condvar = Condvar::new();

/// Wakes the ranks waiting in [`init_rank`], so that they look at their [`Handover`] again.
pub fn wake_inits() {
    let _guard = INITS.lock().unwrap_or_else(|e| e.into_inner());
    INITS_CV.notify_all();
}

/// How an in-process rendezvous may hand its ranks over to the cross-process path (see
/// `net::bootstrap`): `switched` says a rank of another process registered for the id (the
/// waiting ranks leave); `claim` is asked when all ranks met here and says whether the id
/// may stay in-process (`false`: it just switched, the ranks leave).
pub struct Handover<'a> {
    pub switched: &'a dyn Fn() -> bool,
    pub claim: &'a dyn Fn() -> bool,
}

/// Rank `rank` of `nranks` joins the rendezvous named by `id` (`ncclCommInitRank`,
/// `HcclCommInitRootInfo`) with the calling thread's current device, blocking until all
/// ranks joined or `CHD_FAKE_PAIR_TIMEOUT_MS` passed. `Ok(None)`: the id was handed over
/// to the cross-process path (see [`Handover`]); the caller joins it there.
pub fn init_rank(
    lib: Lib,
    id: &[u8],
    nranks: usize,
    rank: usize,
    handover: &Handover<'_>,
) -> Result<Option<*mut c_void>, CollError> {
    if nranks == 0 || rank >= nranks {
        return Err(CollError::InvalidArgument(format!(
            "rank {rank} is out of range for {nranks} ranks"
        )));
    }
    let dev = device::current_checked().ok_or(CollError::NoDevice)?;
    let timeout = Duration::from_millis(config::get().pair_timeout_ms);
    let deadline = Instant::now() + timeout;
    let key: InitKey = (lib, id.to_vec());

    let mut guard = INITS.lock().unwrap_or_else(|e| e.into_inner());
    {
        let map = guard.get_or_insert_with(HashMap::new);
        let entry = map.entry(key.clone()).or_insert_with(|| PendingInit {
            devices: vec![None; nranks],
            result: None,
            picked: 0,
        });
        if entry.devices.len() != nranks {
            return Err(CollError::InvalidArgument(format!(
                "rank {rank} says {nranks} ranks, an earlier rank said {}",
                entry.devices.len()
            )));
        }
        if entry.devices[rank].is_some() || entry.result.is_some() {
            return Err(CollError::InvalidUsage(format!(
                "rank {rank} already joined this unique id"
            )));
        }
        entry.devices[rank] = Some(dev);
        if entry.devices.iter().all(Option::is_some) && !(handover.claim)() {
            entry.devices.iter_mut().for_each(|d| *d = None);
            map.remove(&key);
            INITS_CV.notify_all();
            return Ok(None);
        }
        if entry.devices.iter().all(Option::is_some) {
            let devs: Vec<usize> = entry.devices.iter().flatten().copied().collect();
            let duplicate = devs
                .iter()
                .enumerate()
                .find(|(i, d)| devs[..*i].contains(d));
            entry.result = Some(match duplicate {
                Some((_, d)) => Err(CollError::InvalidUsage(format!("two ranks on device {d}"))),
                None => Ok(Clique::new(lib, devs)),
            });
            INITS_CV.notify_all();
        }
    }
    loop {
        let map = guard.get_or_insert_with(HashMap::new);
        let Some(entry) = map.get_mut(&key) else {
            // Removed by a rank that found the id handed over.
            return Ok(None);
        };
        if let Some(result) = entry.result.clone() {
            entry.picked += 1;
            if entry.picked == nranks {
                map.remove(&key);
            }
            return result.map(|clique| Some(register(lib, &clique, rank) as *mut c_void));
        }
        if (handover.switched)() {
            entry.devices[rank] = None;
            if entry.devices.iter().all(Option::is_none) {
                map.remove(&key);
            }
            return Ok(None);
        }
        let now = Instant::now();
        if now >= deadline {
            entry.devices[rank] = None;
            if entry.devices.iter().all(Option::is_none) {
                map.remove(&key);
            }
            return Err(CollError::Timeout);
        }
        guard = match INITS_CV.wait_timeout(guard, deadline - now) {
            Ok((g, _)) => g,
            Err(e) => e.into_inner().0,
        };
    }
}

/// A validated allgather call of one rank, ready to run.
#[derive(Debug)]
pub struct Prepared {
    handle: usize,
    clique: Arc<Clique>,
    rank: usize,
    part: Part,
}

/// Validates an allgather call: `count` elements of `elem_size` bytes from `send` (device
/// memory of the communicator's device) to `recv` (room for `nranks` times that, same
/// device), on `raw_stream` (NULL: the device's default stream; for NCCL also the special
/// handles 1 and 2). Records the calling thread's CPU.
pub fn prepare_allgather(
    lib: Lib,
    handle: *mut c_void,
    send: *const c_void,
    recv: *mut c_void,
    count: u64,
    elem_size: usize,
    raw_stream: *mut c_void,
) -> Result<Prepared, CollError> {
    let call = (send, recv, count, elem_size);
    prepare(lib, handle, call, raw_stream, Kind::AllGather)
}

/// Validates an all-reduce call like [`prepare_allgather`], with a receive buffer of the send
/// buffer's size (in place is fine).
#[allow(clippy::too_many_arguments, reason = "the C signature's arguments")]
pub fn prepare_allreduce(
    lib: Lib,
    handle: *mut c_void,
    send: *const c_void,
    recv: *mut c_void,
    count: u64,
    elem: Elem,
    op: RedOp,
    raw_stream: *mut c_void,
) -> Result<Prepared, CollError> {
    let call = (send, recv, count, elem.size());
    prepare(lib, handle, call, raw_stream, Kind::AllReduce(elem, op))
}

fn prepare(
    lib: Lib,
    handle: *mut c_void,
    (send, recv, count, elem_size): (*const c_void, *mut c_void, u64, usize),
    raw_stream: *mut c_void,
    kind: Kind,
) -> Result<Prepared, CollError> {
    if handle.is_null() {
        return Err(CollError::NullPointer("comm"));
    }
    let (clique, rank) = with_comms(|m| match m.get(&(handle as usize)) {
        Some(c) if c.lib == lib => Ok((Arc::clone(&c.clique), c.rank)),
        _ => Err(CollError::InvalidArgument(format!(
            "{handle:p} is not a live communicator"
        ))),
    })?;
    let dev = clique.devices[rank];
    let nranks = clique.nranks();
    let too_big = || CollError::InvalidArgument(format!("count {count} is too large"));
    let bytes = usize::try_from(count)
        .ok()
        .and_then(|c| c.checked_mul(elem_size))
        .ok_or_else(too_big)?;
    let total = match kind {
        Kind::AllGather => bytes.checked_mul(nranks).ok_or_else(too_big)?,
        Kind::AllReduce(..) => bytes,
    };
    let stream = check_operands(lib, dev, raw_stream, (send, bytes), (recv, total))?;
    Ok(Prepared {
        handle: handle as usize,
        clique,
        rank,
        part: Part {
            kind,
            send: send as usize,
            recv: recv as usize,
            bytes,
            stream,
            cpu: device::current_cpu(),
        },
    })
}

/// The stream a collective of `lib` on device `dev` runs on (NULL and NCCL's legacy and
/// per-thread handles 1 and 2: the device's default stream), checked to be a live stream of
/// that device; and, when the call moves bytes, its send and receive buffers (`(pointer,
/// bytes)`) checked to be device memory of `dev`. Shared by the in-process and the
/// cross-process collectives.
pub(crate) fn check_operands(
    lib: Lib,
    dev: usize,
    raw_stream: *mut c_void,
    (send, send_bytes): (*const c_void, usize),
    (recv, recv_bytes): (*mut c_void, usize),
) -> Result<StreamRef, CollError> {
    let stream = match (lib, raw_stream as usize) {
        (Lib::Nccl, 0..=2) | (Lib::Hccl, 0) => StreamRef::Default(dev),
        (_, h) => StreamRef::Handle(h),
    };
    match timing::stream_device(stream, lib.api()) {
        Ok(d) if d == dev => {}
        Ok(d) => {
            return Err(CollError::BadStream(format!(
                "stream {raw_stream:p} is on device {d}, the communicator on device {dev}"
            )))
        }
        Err(_) => {
            return Err(CollError::BadStream(format!(
                "{raw_stream:p} is not a live stream"
            )))
        }
    }
    // A buffer of 0 bytes is not looked at (a send has no receive buffer, a receive no send
    // buffer); the collectives always have both when they move bytes.
    let buffers = [
        ("sendbuff", send as usize, send_bytes),
        ("recvbuff", recv as usize, recv_bytes),
    ];
    for (what, addr, len) in buffers {
        if len > 0 && addr == 0 {
            return Err(CollError::NullPointer(what));
        }
    }
    for (what, addr, len) in buffers {
        if len > 0 && memory::locate(addr, len) != Location::Device(dev) {
            return Err(CollError::InvalidArgument(format!(
                "{what} {addr:#x} + {len} bytes is not device memory of device {dev}"
            )));
        }
    }
    Ok(stream)
}

/// Virtual duration of an allgather in nanoseconds: `bytes_per_rank * (nranks - 1) / gbps`
/// (bytes / (GB/s) = ns), so that nccl-tests' bus bandwidth, per-rank bytes x (n - 1) /
/// time, comes out as exactly `gbps`.
pub fn duration_ns(bytes_per_rank: usize, nranks: usize, gbps: f64) -> f64 {
    bytes_per_rank as f64 * nranks.saturating_sub(1) as f64 / gbps
}

struct Ticket {
    handle: usize,
    clique: Arc<Clique>,
    seq: u64,
}

/// The call on `handle` returned: it is no longer in flight.
fn leave(handle: usize) {
    with_comms(|m| {
        if let Some(c) = m.get_mut(&handle) {
            c.in_flight = c.in_flight.saturating_sub(1);
        }
    });
}

/// Runs prepared calls (one ungrouped call, or the calls of a group): fails at once under
/// `CHD_FAKE_PAIR_FAIL`; otherwise contributes every call, then waits until each call's
/// operation ran. Returns the first error.
pub fn run(calls: Vec<Prepared>) -> Result<(), CollError> {
    if calls.is_empty() {
        return Ok(());
    }
    let cfg = config::get();
    if cfg.pair_fail {
        return Err(CollError::Planted);
    }
    let deadline = Instant::now() + Duration::from_millis(cfg.pair_timeout_ms);
    let mut first_err = None;
    let mut tickets = Vec::with_capacity(calls.len());
    for call in calls {
        match submit(call) {
            Ok(t) => tickets.push(t),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    for t in tickets {
        let result = wait(&t, deadline);
        leave(t.handle);
        if let Err(e) = result {
            first_err.get_or_insert(e);
        }
    }
    first_err.map_or(Ok(()), Err)
}

fn submit(call: Prepared) -> Result<Ticket, CollError> {
    let seq = with_comms(|m| {
        if let Some(c) = m.get(&call.handle).filter(|c| c.lib == Lib::Hccl) {
            let device = c.clique.devices[c.rank];
            refuse_concurrent_hccl(m, &[device], Some(call.handle))?;
        }
        match m.get_mut(&call.handle) {
            Some(c) => {
                let seq = c.next_seq;
                c.next_seq += 1;
                c.in_flight += 1;
                Ok(seq)
            }
            None => Err(CollError::InvalidArgument(format!(
                "{:#x} is not a live communicator",
                call.handle
            ))),
        }
    })?;
    let clique = call.clique;
    let mut st = clique.lock();
    if let Some(e) = &st.broken {
        let e = e.clone();
        drop(st);
        leave(call.handle);
        return Err(e);
    }
    let nranks = clique.nranks();
    let op = st.ops.entry(seq).or_insert_with(|| Op {
        parts: vec![None; nranks],
        joined: 0,
        result: None,
        collected: 0,
    });
    op.parts[call.rank] = Some(call.part);
    op.joined += 1;
    if op.joined == nranks {
        complete(&clique, st, seq);
    } else {
        drop(st);
    }
    Ok(Ticket {
        handle: call.handle,
        clique,
        seq,
    })
}

/// Runs operation `seq`, whose last rank just joined, on the calling thread.
fn complete(clique: &Clique, mut st: MutexGuard<'_, CliqueState>, seq: u64) {
    let hang = config::get().faults_now().pair_hang_ms;
    if hang > 0 {
        let until = Instant::now() + Duration::from_millis(hang);
        loop {
            let now = Instant::now();
            if st.broken.is_some() || now >= until {
                break;
            }
            st = clique.wait_timeout(st, until - now);
        }
    }
    let result = match &st.broken {
        Some(e) => Err(e.clone()),
        None => {
            let parts: Vec<Part> = st
                .ops
                .get(&seq)
                .map(|op| op.parts.iter().flatten().copied().collect())
                .unwrap_or_default();
            catch_unwind(AssertUnwindSafe(|| execute(clique, &parts)))
                .unwrap_or(Err(CollError::Internal))
        }
    };
    if result.is_ok() {
        COMPLETED[clique.lib.index()].fetch_add(clique.nranks() as u64, Ordering::Relaxed);
    }
    if let Some(op) = st.ops.get_mut(&seq) {
        op.result = Some(result);
    }
    drop(st);
    clique.cv.notify_all();
}

/// Virtual duration of an all-reduce of `bytes` in nanoseconds: `bytes * 2 (nranks - 1) /
/// nranks / gbps`, so that nccl-tests' all-reduce bus bandwidth comes out as exactly `gbps`.
pub fn allreduce_duration_ns(bytes: usize, nranks: usize, gbps: f64) -> f64 {
    let n = nranks as f64;
    bytes as f64 * 2.0 * (n - 1.0).max(0.0) / n / gbps
}

/// Gathers (or reduces) the bytes and advances the clocks.
fn execute(clique: &Clique, parts: &[Part]) -> Result<(), CollError> {
    let n = clique.nranks();
    if parts.len() != n {
        return Err(CollError::Internal);
    }
    let kind = parts[0].kind;
    if parts.iter().any(|p| p.kind != kind) {
        return Err(CollError::InvalidArgument(
            "ranks disagree on the collective (allgather vs all-reduce, data type or op)"
                .to_owned(),
        ));
    }
    if let Kind::AllReduce(elem, op) = kind {
        return execute_allreduce(clique, parts, elem, op);
    }
    let bytes = parts[0].bytes;
    if let Some(p) = parts.iter().find(|p| p.bytes != bytes) {
        return Err(CollError::InvalidArgument(format!(
            "ranks disagree on the allgather size ({bytes} vs {} bytes per rank)",
            p.bytes
        )));
    }
    // Re-checked under the allocation lock: a caller that gave up waiting (a hang) may have
    // freed its buffers meanwhile.
    let ranges: Vec<(usize, usize, usize)> = parts
        .iter()
        .zip(&clique.devices)
        .flat_map(|(p, &dev)| [(p.send, bytes, dev), (p.recv, bytes * n, dev)])
        .collect();
    let copied = memory::with_live_ranges(&ranges, || {
        if bytes == 0 {
            return;
        }
        for dst in parts {
            for (i, src) in parts.iter().enumerate() {
                // SAFETY: every range lies inside a live device allocation (checked just now,
                // and no allocation can be freed while the registry lock is held). `ptr::copy`
                // tolerates the in-place case (a rank's send buffer inside its own receive
                // buffer).
                unsafe {
                    std::ptr::copy(
                        src.send as *const u8,
                        (dst.recv as *mut u8).add(i * bytes),
                        bytes,
                    );
                }
            }
        }
    });
    if copied.is_none() {
        return Err(CollError::InvalidArgument(
            "a buffer was freed before the collective ran".to_owned(),
        ));
    }
    let gbps = clique_gbps(parts);
    let mut streams: Vec<StreamRef> = parts.iter().map(|p| p.stream).collect();
    streams.dedup();
    timing::join_advance(&streams, clique.lib.api(), duration_ns(bytes, n, gbps));
    Ok(())
}

/// The rate of an operation: the slowest rank's `CHD_FAKE_PAIR_GBPS` rate.
fn clique_gbps(parts: &[Part]) -> f64 {
    let cfg = config::get();
    parts
        .iter()
        .enumerate()
        .map(|(rank, p)| cfg.pair_gbps_for(rank, p.cpu))
        .fold(f64::INFINITY, f64::min)
}

/// Reduces every rank's send buffer into every rank's receive buffer and advances the clocks.
fn execute_allreduce(
    clique: &Clique,
    parts: &[Part],
    elem: Elem,
    op: RedOp,
) -> Result<(), CollError> {
    let n = clique.nranks();
    let bytes = parts[0].bytes;
    if let Some(p) = parts.iter().find(|p| p.bytes != bytes) {
        return Err(CollError::InvalidArgument(format!(
            "ranks disagree on the all-reduce size ({bytes} vs {} bytes)",
            p.bytes
        )));
    }
    let ranges: Vec<(usize, usize, usize)> = parts
        .iter()
        .zip(&clique.devices)
        .flat_map(|(p, &dev)| [(p.send, bytes, dev), (p.recv, bytes, dev)])
        .collect();
    let reduced = memory::with_live_ranges(&ranges, || {
        if bytes == 0 {
            return;
        }
        // SAFETY: every range lies inside a live device allocation (checked just now, and no
        // allocation can be freed while the registry lock is held); all sends are read into
        // `acc` before any receive buffer is written, so in-place calls are fine.
        unsafe {
            let mut acc = std::slice::from_raw_parts(parts[0].send as *const u8, bytes).to_vec();
            for p in &parts[1..] {
                let src = std::slice::from_raw_parts(p.send as *const u8, bytes);
                reduce_into(&mut acc, src, elem, op);
            }
            for p in parts {
                std::ptr::copy_nonoverlapping(acc.as_ptr(), p.recv as *mut u8, bytes);
            }
        }
    });
    if reduced.is_none() {
        return Err(CollError::InvalidArgument(
            "a buffer was freed before the collective ran".to_owned(),
        ));
    }
    let mut streams: Vec<StreamRef> = parts.iter().map(|p| p.stream).collect();
    streams.dedup();
    let ns = allreduce_duration_ns(bytes, n, clique_gbps(parts));
    timing::join_advance(&streams, clique.lib.api(), ns);
    Ok(())
}

fn wait(t: &Ticket, deadline: Instant) -> Result<(), CollError> {
    let clique = &t.clique;
    let mut st = clique.lock();
    loop {
        let mut joined_all = false;
        if let Some(op) = st.ops.get_mut(&t.seq) {
            if let Some(result) = op.result.clone() {
                op.collected += 1;
                if op.collected == op.parts.len() {
                    st.ops.remove(&t.seq);
                }
                return result;
            }
            joined_all = op.joined == op.parts.len();
        }
        if let Some(e) = &st.broken {
            return Err(e.clone());
        }
        let now = Instant::now();
        if !joined_all && now >= deadline {
            st.broken = Some(CollError::Timeout);
            drop(st);
            clique.cv.notify_all();
            return Err(CollError::Timeout);
        }
        // Once every rank joined, the operation is running (perhaps hanging on purpose) on
        // another thread: no deadline, it always finishes.
        let wait_for = if joined_all {
            Duration::from_millis(100)
        } else {
            deadline - now
        };
        st = clique.wait_timeout(st, wait_for);
    }
}

#[cfg(test)]
mod tests {
    use super::{allreduce_duration_ns, duration_ns};

    #[test]
    fn allreduce_bus_bandwidth_of_the_duration_is_the_configured_rate() {
        let bytes = 64 << 20;
        for (n, gbps) in [(2, 13.7), (4, 4.0), (8, 0.2)] {
            let ns = allreduce_duration_ns(bytes, n, gbps);
            let busbw = bytes as f64 * 2.0 * (n - 1) as f64 / n as f64 / ns;
            assert!((busbw - gbps).abs() < 1e-12, "{n} ranks: {busbw} vs {gbps}");
        }
        assert_eq!(allreduce_duration_ns(bytes, 1, 13.7), 0.0);
    }

    #[test]
    fn bus_bandwidth_of_the_duration_is_the_configured_rate() {
        let bytes = 64 << 20;
        for (n, gbps) in [(2, 13.7), (4, 4.0), (8, 0.2)] {
            let ns = duration_ns(bytes, n, gbps);
            let busbw = bytes as f64 * (n - 1) as f64 / ns;
            assert!((busbw - gbps).abs() < 1e-12, "{n} ranks: {busbw} vs {gbps}");
        }
        assert_eq!(duration_ns(bytes, 1, 13.7), 0.0);
    }
}
