//! The cross-process bootstrap, like real NCCL's: a unique id (or HCCL root info) names a
//! listening *root* socket (address, port) and a random session nonce; every rank connects
//! to the root, registers its rank and its data-plane address, and gets back every rank's
//! data-plane address once all `nranks` registered.
//!
//! The in-process rule: an id made in this process stays *undecided* until either all its
//! ranks met in this process's in-process rendezvous (then it is *in-process*: the root
//! refuses later registrations) or a rank registered at the root over TCP (then it is
//! *socket*: this process's own ranks waiting in the in-process rendezvous leave it and
//! register at the root too). An id made in another process is always the socket path.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::collective::{self, CollError};

/// Bytes of an encoded socket address: family, port, 16 address bytes, IPv6 scope.
const ADDR_LEN: usize = 1 + 2 + 16 + 4;
/// Bytes of the session nonce.
pub const NONCE_LEN: usize = 16;
/// Bytes of an id this library writes: magic (12), pid (4), counter (8), root, nonce.
pub const ID_LEN: usize = 24 + ADDR_LEN + NONCE_LEN;
const HELLO_MAGIC: &[u8; 4] = b"CHDB";

/// What an id names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdInfo {
    pub root: SocketAddr,
    pub nonce: [u8; NONCE_LEN],
}

/// Encodes a socket address into `ADDR_LEN` bytes.
pub fn put_addr(out: &mut Vec<u8>, addr: SocketAddr) {
    let (family, ip, scope) = match addr {
        SocketAddr::V4(a) => (4u8, a.ip().to_ipv6_mapped().octets(), 0),
        SocketAddr::V6(a) => (6u8, a.ip().octets(), a.scope_id()),
    };
    out.push(family);
    out.extend_from_slice(&addr.port().to_be_bytes());
    out.extend_from_slice(&ip);
    out.extend_from_slice(&scope.to_be_bytes());
}

/// Decodes [`put_addr`]'s bytes.
pub fn get_addr(b: &[u8]) -> Option<SocketAddr> {
    let b = b.get(..ADDR_LEN)?;
    let port = u16::from_be_bytes([b[1], b[2]]);
    let ip: [u8; 16] = b[3..19].try_into().ok()?;
    let scope = u32::from_be_bytes(b[19..23].try_into().ok()?);
    match b[0] {
        4 => {
            let v4: Ipv4Addr = Ipv6Addr::from(ip).to_ipv4_mapped()?;
            Some(SocketAddr::new(IpAddr::V4(v4), port))
        }
        6 => Some(SocketAddr::V6(SocketAddrV6::new(
            Ipv6Addr::from(ip),
            port,
            0,
            scope,
        ))),
        _ => None,
    }
}

/// Reads the root address and nonce from an id whose first 24 bytes (magic, pid, counter)
/// the caller already checked.
pub fn parse_id(id: &[u8]) -> Option<IdInfo> {
    let root = get_addr(id.get(24..24 + ADDR_LEN)?)?;
    let nonce = id.get(24 + ADDR_LEN..ID_LEN)?.try_into().ok()?;
    Some(IdInfo { root, nonce })
}

/// How an id made in this process is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Undecided,
    InProcess,
    Socket,
}

static LOCAL: Mutex<Option<HashMap<[u8; NONCE_LEN], Mode>>> = Mutex::new(None);

fn with_local<R>(f: impl FnOnce(&mut HashMap<[u8; NONCE_LEN], Mode>) -> R) -> R {
    let mut g = LOCAL.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(HashMap::new))
}

/// Whether the id with `nonce` was made by this process.
pub fn is_local(nonce: &[u8; NONCE_LEN]) -> bool {
    with_local(|m| m.contains_key(nonce))
}

/// The in-process rendezvous completed: the id becomes in-process unless a rank already
/// registered at the root (then `false`: the local ranks must switch to the socket path).
pub fn claim_in_process(nonce: &[u8; NONCE_LEN]) -> bool {
    with_local(|m| match m.get_mut(nonce) {
        Some(mode @ Mode::Undecided) => {
            *mode = Mode::InProcess;
            true
        }
        Some(Mode::InProcess) | None => true,
        Some(Mode::Socket) => false,
    })
}

/// Whether a rank registered at the root of this local id (the socket path was chosen).
pub fn switched(nonce: &[u8; NONCE_LEN]) -> bool {
    with_local(|m| m.get(nonce) == Some(&Mode::Socket))
}

/// A registration arrived at the root: choose the socket path, unless the id already went
/// in-process.
fn claim_socket(nonce: &[u8; NONCE_LEN]) -> bool {
    let changed = with_local(|m| match m.get_mut(nonce) {
        Some(mode @ Mode::Undecided) => {
            *mode = Mode::Socket;
            Some(true)
        }
        Some(Mode::Socket) => Some(false),
        Some(Mode::InProcess) | None => None,
    });
    match changed {
        Some(true) => {
            collective::wake_inits();
            true
        }
        Some(false) => true,
        None => false,
    }
}

/// A fresh random nonce.
fn nonce() -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    // SAFETY: getrandom writes at most `n.len()` bytes into `n`.
    let got = unsafe { libc::getrandom(n.as_mut_ptr().cast(), n.len(), 0) };
    if got != n.len() as isize {
        // Unique enough for a test fake: time and pid.
        let t = Instant::now().elapsed().as_nanos() as u64
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
        n[..8].copy_from_slice(&t.to_le_bytes());
        n[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    }
    n
}

/// Starts the root of a new id: a listener on `bind` (port 0 picks one) served by a thread.
/// Returns the id's root address and nonce; the caller writes them into the id.
pub fn start_root(bind: SocketAddr, timeout: Duration) -> std::io::Result<IdInfo> {
    let listener = TcpListener::bind(bind)?;
    let root = listener.local_addr()?;
    let nonce = nonce();
    with_local(|m| m.insert(nonce, Mode::Undecided));
    std::thread::Builder::new()
        .name("chd-fake-root".to_owned())
        .spawn(move || serve_root(listener, nonce, timeout))?;
    Ok(IdInfo { root, nonce })
}

/// Reply status codes of the root.
const OK: u8 = 0;
const BAD_ARGUMENT: u8 = 1;
const BAD_USAGE: u8 = 2;
const TIMED_OUT: u8 = 3;

fn reply(stream: &mut TcpStream, status: u8, body: &[u8]) {
    let mut msg = vec![status];
    msg.extend_from_slice(&(body.len() as u32).to_be_bytes());
    msg.extend_from_slice(body);
    let _ = stream.write_all(&msg);
}

fn refuse(stream: &mut TcpStream, status: u8, why: &str) {
    reply(stream, status, why.as_bytes());
}

/// Waits up to `ms` for `fd` to become readable.
fn readable(fd: i32, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, ms) > 0 }
}

struct Registration {
    stream: TcpStream,
    data: SocketAddr,
}

/// The root thread: collects `nranks` registrations and answers each with every rank's
/// data-plane address; refuses a wrong nonce, a rank out of range or twice, disagreeing
/// `nranks`, and registrations for an id that went in-process. Gives up (telling the ranks
/// that came) `timeout` after the first registration.
fn serve_root(listener: TcpListener, nonce: [u8; NONCE_LEN], timeout: Duration) {
    let mut slots: Vec<Option<Registration>> = Vec::new();
    let mut deadline: Option<Instant> = None;
    loop {
        if with_local(|m| m.get(&nonce) == Some(&Mode::InProcess)) {
            return;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            let n = slots.len();
            for r in slots.iter_mut().flatten() {
                let why = format!(
                    "not all {n} ranks registered at the root within CHD_FAKE_PAIR_TIMEOUT_MS"
                );
                refuse(&mut r.stream, TIMED_OUT, &why);
            }
            return;
        }
        if !readable(listener.as_raw_fd(), 100) {
            continue;
        }
        let Ok((mut stream, _)) = listener.accept() else {
            continue;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        let mut hello = [0u8; 4 + NONCE_LEN + 8 + ADDR_LEN];
        if stream.read_exact(&mut hello).is_err() || &hello[..4] != HELLO_MAGIC {
            continue;
        }
        if hello[4..4 + NONCE_LEN] != nonce {
            refuse(
                &mut stream,
                BAD_ARGUMENT,
                "the unique id's session nonce does not match this root (a stale or altered id)",
            );
            continue;
        }
        let at = 4 + NONCE_LEN;
        let nranks = u32::from_be_bytes(hello[at..at + 4].try_into().unwrap_or_default()) as usize;
        let rank =
            u32::from_be_bytes(hello[at + 4..at + 8].try_into().unwrap_or_default()) as usize;
        let Some(data) = get_addr(&hello[at + 8..]) else {
            refuse(&mut stream, BAD_ARGUMENT, "malformed registration");
            continue;
        };
        if !claim_socket(&nonce) {
            refuse(
                &mut stream,
                BAD_USAGE,
                "every rank of this unique id already joined inside the process that made it",
            );
            continue;
        }
        if slots.is_empty() {
            slots.resize_with(nranks, || None);
            deadline = Some(Instant::now() + timeout);
        }
        if nranks != slots.len() {
            let why = format!(
                "rank {rank} says {nranks} ranks, an earlier rank said {}",
                slots.len()
            );
            refuse(&mut stream, BAD_ARGUMENT, &why);
            continue;
        }
        if rank >= nranks || slots[rank].is_some() {
            let why = format!("rank {rank} is out of range or already joined this unique id");
            refuse(&mut stream, BAD_USAGE, &why);
            continue;
        }
        slots[rank] = Some(Registration { stream, data });
        if slots.iter().all(Option::is_some) {
            let mut table = Vec::with_capacity(nranks * ADDR_LEN);
            for r in slots.iter().flatten() {
                put_addr(&mut table, r.data);
            }
            for r in slots.iter_mut().flatten() {
                reply(&mut r.stream, OK, &table);
            }
            return;
        }
    }
}

fn system(what: String) -> CollError {
    CollError::System(what)
}

/// Registers rank `rank` of `nranks`, reachable for its ring predecessor at `data`, at the
/// root `info` names; returns every rank's data-plane address (index = rank).
pub fn join(
    info: &IdInfo,
    nranks: usize,
    rank: usize,
    data: SocketAddr,
    timeout: Duration,
) -> Result<Vec<SocketAddr>, CollError> {
    let root = info.root;
    let mut stream = TcpStream::connect_timeout(&root, timeout)
        .map_err(|e| system(format!("cannot reach the unique id's root at {root}: {e}")))?;
    let mut hello = HELLO_MAGIC.to_vec();
    hello.extend_from_slice(&info.nonce);
    hello.extend_from_slice(&(nranks as u32).to_be_bytes());
    hello.extend_from_slice(&(rank as u32).to_be_bytes());
    put_addr(&mut hello, data);
    stream
        .write_all(&hello)
        .map_err(|e| system(format!("registering at the root {root}: {e}")))?;
    let _ = stream.set_read_timeout(Some(timeout + Duration::from_secs(1)));
    let mut head = [0u8; 5];
    stream.read_exact(&mut head).map_err(|e| {
        system(format!(
            "no answer from the root {root} (all {nranks} ranks must register): {e}"
        ))
    })?;
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > 1 << 20 {
        return Err(system(format!("root {root} sent a malformed answer")));
    }
    let mut body = vec![0u8; len];
    stream
        .read_exact(&mut body)
        .map_err(|e| system(format!("reading the root {root}'s answer: {e}")))?;
    let text = || format!("root {root}: {}", String::from_utf8_lossy(&body));
    match head[0] {
        OK => {
            let addrs: Option<Vec<SocketAddr>> = body.chunks(ADDR_LEN).map(get_addr).collect();
            match addrs {
                Some(a) if a.len() == nranks => Ok(a),
                _ => Err(system(format!(
                    "root {root} sent a malformed address table"
                ))),
            }
        }
        BAD_ARGUMENT => Err(CollError::InvalidArgument(text())),
        BAD_USAGE => Err(CollError::InvalidUsage(text())),
        TIMED_OUT => Err(CollError::Timeout),
        _ => Err(system(text())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip() {
        for a in ["10.1.2.3:4567", "[fe80::1%3]:99", "[::1]:1"] {
            let addr: SocketAddr = a.parse().unwrap();
            let mut b = Vec::new();
            put_addr(&mut b, addr);
            assert_eq!(b.len(), ADDR_LEN);
            assert_eq!(get_addr(&b), Some(addr), "{a}");
        }
        assert_eq!(get_addr(&[9; ADDR_LEN]), None);
        assert_eq!(get_addr(&[4; 3]), None);
    }

    #[test]
    fn a_root_pairs_two_ranks_and_refuses_a_wrong_nonce() {
        let info = start_root("127.0.0.1:0".parse().unwrap(), Duration::from_secs(5)).unwrap();
        let mut wrong = info;
        wrong.nonce[0] ^= 1;
        let t = Duration::from_secs(5);
        let err = join(&wrong, 2, 0, "127.0.0.1:1".parse().unwrap(), t).unwrap_err();
        assert!(
            matches!(err, CollError::InvalidArgument(ref w) if w.contains("nonce")),
            "{err:?}"
        );
        let other =
            std::thread::spawn(move || join(&info, 2, 1, "127.0.0.1:2".parse().unwrap(), t));
        let mine = join(&info, 2, 0, "127.0.0.1:1".parse().unwrap(), t).unwrap();
        assert_eq!(other.join().unwrap().unwrap(), mine);
        assert_eq!(mine[1], "127.0.0.1:2".parse().unwrap());
        assert!(switched(&info.nonce));
    }
}
