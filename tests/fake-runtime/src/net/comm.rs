//! Cross-process communicators (one rank of a clique whose ranks live in several processes):
//! creation through the bootstrap, the collectives over the ring, point-to-point send/recv
//! ([`p2p`]: 2-rank communicators only), abort and the sticky error, and the timing rule: a collective sets its stream's clock to the latest of the
//! ranks' stream clocks at the call plus the wall time the bytes took on the sockets (the
//! longest of the ranks' times), the same end clock on every rank.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::bootstrap::{self, IdInfo};
use super::reduce::{Elem, RedOp};
use super::ring::{self, Ring};
use super::Knobs;
use crate::collective::{self, CollError, CommInfo, Lib};
use crate::config;
use crate::device;
use crate::timing::{self, StreamRef};

/// One rank of a cross-process clique.
#[derive(Debug)]
struct NetComm {
    lib: Lib,
    rank: usize,
    nranks: usize,
    device: usize,
    ring: Ring,
    /// Sticky error: a failed collective or an abort.
    broken: Mutex<Option<CollError>>,
    /// Serializes the collectives of this communicator (they are matched by order).
    ops: Mutex<()>,
}

impl NetComm {
    fn broken(&self) -> MutexGuard<'_, Option<CollError>> {
        self.broken.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the communicator broken with `e` (unless it already is) and returns the sticky
    /// error.
    fn fail(&self, e: CollError) -> CollError {
        self.broken().get_or_insert(e).clone()
    }
}

static COMMS: Mutex<Option<HashMap<usize, Arc<NetComm>>>> = Mutex::new(None);
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(0);

fn with_comms<R>(f: impl FnOnce(&mut HashMap<usize, Arc<NetComm>>) -> R) -> R {
    let mut g = COMMS.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(HashMap::new))
}

fn get(lib: Lib, handle: *mut c_void) -> Option<Arc<NetComm>> {
    with_comms(|m| m.get(&(handle as usize)).filter(|c| c.lib == lib).cloned())
}

/// Whether `handle` is a live cross-process communicator of `lib`.
pub fn is_comm(lib: Lib, handle: *mut c_void) -> bool {
    get(lib, handle).is_some()
}

/// Live cross-process communicators.
pub fn live() -> u64 {
    with_comms(|m| m.len() as u64)
}

/// What a cross-process communicator handle stands for, if it is one.
pub fn info(lib: Lib, handle: *mut c_void) -> Option<CommInfo> {
    get(lib, handle).map(|c| CommInfo {
        rank: c.rank,
        nranks: c.nranks,
        device: c.device,
        async_error: c.broken().clone(),
    })
}

fn timeout() -> Duration {
    Duration::from_millis(config::get().pair_timeout_ms)
}

/// Rank `rank` of `nranks` joins the clique of the id `info` over the sockets, on the
/// calling thread's current device and the interface the library's `knobs` select.
pub fn init(
    lib: Lib,
    info: &IdInfo,
    nranks: usize,
    rank: usize,
    knobs: Knobs,
) -> Result<*mut c_void, CollError> {
    let device = device::current_checked().ok_or(CollError::NoDevice)?;
    let iface = knobs.interface()?;
    let (listener, data) = ring::listen(&iface)?;
    let timeout = timeout();
    let peers = bootstrap::join(info, nranks, rank, data, timeout)?;
    let ring = Ring::connect(listener, &iface, &peers, rank, &info.nonce, timeout)?;
    if lib == Lib::Nccl {
        if let Err(e) = one_rank_per_gpu(&ring, rank, device) {
            ring.shutdown();
            return Err(e);
        }
    }
    let handle = 0x7fc0_0000_0000 + (NEXT_HANDLE.fetch_add(1, Ordering::Relaxed) + 1) * 64;
    let comm = NetComm {
        lib,
        rank,
        nranks,
        device,
        ring,
        broken: Mutex::new(None),
        ops: Mutex::new(()),
    };
    with_comms(|m| m.insert(handle, Arc::new(comm)));
    Ok(handle as *mut c_void)
}

/// The host as NCCL tells hosts apart: `NCCL_HOSTID` when set, else the host name and the
/// kernel's boot id (NCCL's `getHostHash`), hashed.
fn host_hash() -> u64 {
    use std::hash::{Hash, Hasher};
    let id = std::env::var("NCCL_HOSTID").unwrap_or_else(|_| {
        let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        format!("{}{}", name.trim(), boot.trim())
    });
    // SipHash with fixed keys: the same value in every process.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    id.hash(&mut h);
    h.finish()
}

/// NCCL runs one rank per GPU: two ranks of a communicator on one host and one device fail
/// its init with `ncclInvalidUsage`, "Duplicate GPU detected : rank 0 and rank 1 both on
/// CUDA device 10000" (the bus id's hex digits, as NCCL prints them), on every rank that
/// shares the device.
fn one_rank_per_gpu(ring: &Ring, rank: usize, device: usize) -> Result<(), CollError> {
    let pci = config::get()
        .pci_addresses
        .get(device)
        .copied()
        .unwrap_or_else(|| config::PciAddress::default_for(device));
    let digits: String = pci
        .legacy_upper()
        .chars()
        .filter(char::is_ascii_hexdigit)
        .collect();
    let bus_id = u64::from_str_radix(&digits, 16).unwrap_or(device as u64);
    let mut mine = host_hash().to_be_bytes().to_vec();
    mine.extend_from_slice(&bus_id.to_be_bytes());
    let all = ring.allgather_small(&mine)?;
    match all
        .iter()
        .enumerate()
        .find(|(i, other)| *i != rank && **other == mine)
    {
        Some((other, _)) => Err(CollError::InvalidUsage(format!(
            "Duplicate GPU detected : rank {rank} and rank {other} both on CUDA device {bus_id:x}"
        ))),
        None => Ok(()),
    }
}

/// Destroys `handle` (local: the peers see its connections close). `abort` also wakes a
/// thread of this process blocked in one of its collectives (`CollError::Aborted`).
pub fn teardown(lib: Lib, handle: *mut c_void, abort: bool) -> Result<(), CollError> {
    let comm = with_comms(|m| {
        let found = m.get(&(handle as usize)).is_some_and(|c| c.lib == lib);
        found.then(|| m.remove(&(handle as usize))).flatten()
    })
    .ok_or_else(|| CollError::InvalidArgument(format!("{handle:p} is not a live communicator")))?;
    if abort {
        comm.fail(CollError::Aborted);
    }
    comm.ring.shutdown();
    Ok(())
}

/// A collective's arguments, checked.
struct Call {
    comm: Arc<NetComm>,
    stream: StreamRef,
}

fn check(
    lib: Lib,
    handle: *mut c_void,
    send: *const c_void,
    send_bytes: usize,
    recv: *mut c_void,
    recv_bytes: usize,
    raw_stream: *mut c_void,
) -> Result<Call, CollError> {
    let comm = get(lib, handle).ok_or_else(|| {
        CollError::InvalidArgument(format!("{handle:p} is not a live communicator"))
    })?;
    let stream = collective::check_operands(
        lib,
        comm.device,
        raw_stream,
        (send, send_bytes),
        (recv, recv_bytes),
    )?;
    Ok(Call { comm, stream })
}

/// What every rank must agree on, plus the rank's stream clock.
fn header(kind: u8, elem_size: usize, op: i32, bytes: usize, clock: f64) -> Vec<u8> {
    let mut h = vec![kind];
    h.extend_from_slice(&(elem_size as u32).to_be_bytes());
    h.extend_from_slice(&op.to_be_bytes());
    h.extend_from_slice(&(bytes as u64).to_be_bytes());
    h.extend_from_slice(&clock.to_be_bytes());
    h
}

const CLOCK_AT: usize = 1 + 4 + 4 + 8;

/// Runs one collective: agrees with the peers on what it is (and the latest start clock),
/// moves the bytes with `body`, and advances the stream by the wall time that took.
fn run(
    call: &Call,
    kind: u8,
    what: &str,
    elem_size: usize,
    op: i32,
    bytes: usize,
    body: impl FnOnce(&Ring) -> Result<(), CollError>,
) -> Result<(), CollError> {
    let rank = call.comm.rank;
    let agree = |other: usize, mine: &[u8], theirs: &[u8]| {
        if mine == theirs {
            return Ok(());
        }
        // Every rank sees the same disagreement; the ring stays usable.
        Err(CollError::InvalidArgument(format!(
            "ranks disagree on the {what}: rank {rank} vs rank {other} (kind, element size, op \
             or bytes per rank differ)"
        )))
    };
    run_agreed(call, header(kind, elem_size, op, bytes, 0.0), agree, body)
}

/// [`run`] with the agreement spelled out: `mine` is this rank's header (its clock field is
/// filled in here), `agree(rank, mine, theirs)` checks another rank's header (both without
/// the clock) against it.
fn run_agreed(
    call: &Call,
    mut mine: Vec<u8>,
    agree: impl Fn(usize, &[u8], &[u8]) -> Result<(), CollError>,
    body: impl FnOnce(&Ring) -> Result<(), CollError>,
) -> Result<(), CollError> {
    let cfg = config::get();
    if cfg.pair_fail {
        return Err(CollError::Planted);
    }
    let comm = &call.comm;
    let _order = comm.ops.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(e) = comm.broken().clone() {
        return Err(e);
    }
    // `CHD_FAKE_PAIR_HANG_MS`: the operation hangs before it starts, as a stuck device
    // would (the peers wait for it, or give up after `CHD_FAKE_PAIR_TIMEOUT_MS`).
    let hang = cfg.faults_now().pair_hang_ms;
    if hang > 0 {
        std::thread::sleep(Duration::from_millis(hang));
    }
    let api = comm.lib.api();
    let local = timing::clock_ns(call.stream, api).map_err(|_| CollError::Internal)?;
    mine[CLOCK_AT..CLOCK_AT + 8].copy_from_slice(&local.to_be_bytes());
    let all = comm.ring.allgather_small(&mine).map_err(|e| comm.fail(e))?;
    let mut start = local;
    for (rank, h) in all.iter().enumerate() {
        if rank != comm.rank {
            agree(rank, &mine[..CLOCK_AT], &h[..CLOCK_AT])?;
        }
        let clock = f64::from_be_bytes(h[CLOCK_AT..CLOCK_AT + 8].try_into().unwrap_or_default());
        start = start.max(clock);
    }
    let t0 = Instant::now();
    body(&comm.ring).map_err(|e| comm.fail(e))?;
    let wall_ns = t0.elapsed().as_nanos() as f64;
    // The ranks agree on the duration too (the longest rank's wall time), so that the
    // operation ends at the same clock on every rank, as in-process.
    let walls = comm
        .ring
        .allgather_small(&wall_ns.to_be_bytes())
        .map_err(|e| comm.fail(e))?;
    let duration = walls
        .iter()
        .map(|w| f64::from_be_bytes(w[..8].try_into().unwrap_or_default()))
        .fold(wall_ns, f64::max);
    timing::advance(call.stream, api, start - local + duration).map_err(|_| CollError::Internal)?;
    collective::count_completed(comm.lib, 1);
    Ok(())
}

/// Allgather across processes: `bytes` from `send` to `recv + rank * bytes` on every rank.
pub fn allgather(
    lib: Lib,
    handle: *mut c_void,
    send: *const c_void,
    recv: *mut c_void,
    bytes: usize,
    raw_stream: *mut c_void,
) -> Result<(), CollError> {
    let nranks = get(lib, handle).map_or(1, |c| c.nranks);
    let total = bytes
        .checked_mul(nranks)
        .ok_or_else(|| CollError::InvalidArgument(format!("{bytes} bytes is too large")))?;
    let call = check(lib, handle, send, bytes, recv, total, raw_stream)?;
    let rank = call.comm.rank;
    run(&call, 1, "allgather", 1, 0, bytes, |ring| {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: `recv` is a live device allocation of at least `total` bytes (checked),
        // which the caller must keep alive for the call, as with real NCCL; `send` may lie
        // inside it (in place), hence `ptr::copy`.
        let buf = unsafe {
            std::ptr::copy(
                send as *const u8,
                (recv as *mut u8).add(rank * bytes),
                bytes,
            );
            std::slice::from_raw_parts_mut(recv as *mut u8, total)
        };
        ring.allgather(buf, bytes)
    })
}

/// All-reduce across processes: `count` elements of `elem` from `send`, reduced with `op`,
/// into `recv` on every rank (in place is fine).
#[allow(clippy::too_many_arguments, reason = "the C signature's arguments")]
pub fn allreduce(
    lib: Lib,
    handle: *mut c_void,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    elem: Elem,
    op: RedOp,
    raw_stream: *mut c_void,
) -> Result<(), CollError> {
    let bytes = count
        .checked_mul(elem.size())
        .ok_or_else(|| CollError::InvalidArgument(format!("count {count} is too large")))?;
    let call = check(lib, handle, send, bytes, recv, bytes, raw_stream)?;
    run(
        &call,
        2,
        "all-reduce",
        elem.size(),
        op as i32,
        bytes,
        |ring| {
            if bytes == 0 {
                return Ok(());
            }
            // SAFETY: as in `allgather`: `recv` holds `bytes` bytes of a live device allocation.
            let buf = unsafe {
                std::ptr::copy(send as *const u8, recv as *mut u8, bytes);
                std::slice::from_raw_parts_mut(recv as *mut u8, bytes)
            };
            ring.allreduce(buf, elem, op)
        },
    )
}

/// Which end of a point-to-point transfer a rank is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// `ncclSend` / `HcclSend`: this rank's buffer goes to the peer.
    Send,
    /// `ncclRecv` / `HcclRecv`: the peer's bytes land in this rank's buffer.
    Recv,
}

const KIND_SEND: u8 = 3;
const KIND_RECV: u8 = 4;

/// What a header (without its clock) asks for, in words, for a mismatch message.
fn describe(h: &[u8]) -> String {
    let elem = u32::from_be_bytes(h[1..5].try_into().unwrap_or_default());
    let op = u32::from_be_bytes(h[5..9].try_into().unwrap_or_default());
    let bytes = u64::from_be_bytes(h[9..17].try_into().unwrap_or_default());
    let (from, to) = (op >> 16, op & 0xffff);
    match h[0] {
        KIND_SEND => {
            format!("a send of {bytes} bytes (element size {elem}) from rank {from} to rank {to}")
        }
        KIND_RECV => format!(
            "a receive of {bytes} bytes (element size {elem}) from rank {from} to rank {to}"
        ),
        1 => "an allgather".to_owned(),
        2 => "an all-reduce".to_owned(),
        k => format!("an operation of kind {k}"),
    }
}

/// The point-to-point rule of the fake, checked on this rank alone: a communicator of
/// exactly 2 ranks, the peer the other rank.
fn check_peer(comm: &NetComm, peer: usize) -> Result<(), CollError> {
    if comm.nranks != 2 {
        return Err(CollError::Unsupported(format!(
            "the fake's point-to-point send/recv supports 2-rank communicators only; this one \
             has {} ranks",
            comm.nranks
        )));
    }
    if peer >= comm.nranks {
        return Err(CollError::InvalidArgument(format!(
            "peer {peer} is out of range for {} ranks",
            comm.nranks
        )));
    }
    if peer == comm.rank {
        return Err(CollError::Unsupported(format!(
            "the fake's point-to-point send/recv supports 2-rank communicators, between the two \
             ranks: rank {peer} to itself is not supported"
        )));
    }
    Ok(())
}

/// Point-to-point across processes, one direction: `Send` writes `bytes` from `buf` to rank
/// `peer`, `Recv` reads `bytes` from rank `peer` into `buf`. The peer must make the matching
/// call (the other direction, same bytes and element size), else both get
/// `InvalidArgument`. Only for a communicator of 2 ranks (the peer is the ring's next and
/// previous rank at once: each direction has its own connection). Timed as the collectives
/// are: both streams end at the later start clock plus the longer wall time (the receiver's,
/// as a rule: until the last byte arrived).
#[allow(clippy::too_many_arguments, reason = "the C signature's arguments")]
pub fn p2p(
    lib: Lib,
    dir: Direction,
    handle: *mut c_void,
    buf: *mut c_void,
    bytes: usize,
    elem_size: usize,
    peer: usize,
    raw_stream: *mut c_void,
) -> Result<(), CollError> {
    let comm = get(lib, handle).ok_or_else(|| {
        CollError::InvalidArgument(format!("{handle:p} is not a live communicator"))
    })?;
    check_peer(&comm, peer)?;
    let call = match dir {
        Direction::Send => check(lib, handle, buf, bytes, std::ptr::null_mut(), 0, raw_stream)?,
        Direction::Recv => check(lib, handle, std::ptr::null(), 0, buf, bytes, raw_stream)?,
    };
    let rank = comm.rank;
    let (kind, from, to) = match dir {
        Direction::Send => (KIND_SEND, rank, peer),
        Direction::Recv => (KIND_RECV, peer, rank),
    };
    let route = ((from as i32) << 16) | to as i32;
    let mine = header(kind, elem_size, route, bytes, 0.0);
    let agree = |other: usize, mine: &[u8], theirs: &[u8]| {
        let want = if mine[0] == KIND_SEND {
            KIND_RECV
        } else {
            KIND_SEND
        };
        if theirs[0] == want && theirs[1..] == mine[1..] {
            return Ok(());
        }
        // Both ranks see the same two headers, so both fail; the ring stays usable.
        Err(CollError::InvalidArgument(format!(
            "point-to-point mismatch: rank {rank} posted {} but rank {other} posted {} (a send \
             needs the peer's receive of the same bytes and element size)",
            describe(mine),
            describe(theirs)
        )))
    };
    run_agreed(&call, mine, agree, |ring| {
        if bytes == 0 {
            return Ok(());
        }
        // `buf` holds `bytes` bytes of a live device allocation (checked), which the caller
        // must keep alive for the call, as with real NCCL.
        match dir {
            Direction::Send => {
                // SAFETY: see above; only read.
                let data = unsafe { std::slice::from_raw_parts(buf as *const u8, bytes) };
                ring.send_next(data)
            }
            Direction::Recv => {
                // SAFETY: see above; the receive buffer is the caller's to overwrite.
                let data = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, bytes) };
                ring.recv_prev(data)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::ifname::{choose, interfaces, IfSpec};

    /// A communicator record of `nranks` ranks (its ring unconnected: only the rank rules
    /// are looked at).
    fn comm(rank: usize, nranks: usize) -> NetComm {
        let iface = choose(Some(&IfSpec::parse("=lo")), &interfaces()).expect("lo");
        let (listener, addr) = ring::listen(&iface).unwrap();
        let nonce = [1u8; bootstrap::NONCE_LEN];
        let ring = Ring::connect(listener, &iface, &[addr], 0, &nonce, timeout()).unwrap();
        NetComm {
            lib: Lib::Nccl,
            rank,
            nranks,
            device: 0,
            ring,
            broken: Mutex::new(None),
            ops: Mutex::new(()),
        }
    }

    #[test]
    fn point_to_point_is_for_two_ranks_between_them() {
        assert!(check_peer(&comm(0, 2), 1).is_ok());
        assert!(check_peer(&comm(1, 2), 0).is_ok());
        let e = check_peer(&comm(0, 3), 1).unwrap_err();
        assert!(
            matches!(&e, CollError::Unsupported(w) if w.contains("2-rank communicators only")),
            "{e:?}"
        );
        let e = check_peer(&comm(1, 2), 1).unwrap_err();
        assert!(
            matches!(&e, CollError::Unsupported(w) if w.contains("to itself")),
            "{e:?}"
        );
        let e = check_peer(&comm(0, 2), 2).unwrap_err();
        assert!(matches!(e, CollError::InvalidArgument(_)), "{e:?}");
    }

    #[test]
    fn a_mismatch_names_both_calls() {
        let send = header(KIND_SEND, 4, 1, 4096, 0.0);
        assert_eq!(
            describe(&send[..CLOCK_AT]),
            "a send of 4096 bytes (element size 4) from rank 0 to rank 1"
        );
        let recv = header(KIND_RECV, 4, 1 << 16, 8, 0.0);
        assert_eq!(
            describe(&recv[..CLOCK_AT]),
            "a receive of 8 bytes (element size 4) from rank 1 to rank 0"
        );
    }
}
