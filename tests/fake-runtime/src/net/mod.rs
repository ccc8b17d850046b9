//! Collectives across processes, over real sockets: unique ids / root infos that name a
//! listening root ([`bootstrap`]), the interface rules of `NCCL_SOCKET_IFNAME` /
//! `HCCL_SOCKET_IFNAME` ([`ifname`]), a TCP ring data plane bound to that interface
//! ([`ring`]), reductions ([`reduce`]) and the communicators built on them ([`comm`]):
//! allgather, all-reduce and, for 2 ranks, point-to-point send/recv ([`comm::p2p`]:
//! `ncclSend`/`ncclRecv`, `HcclSend`/`HcclRecv`; in-process communicators do not have it).
//!
//! Entry points for the NCCL and HCCL roles: [`new_id`] (`ncclGetUniqueId`,
//! `HcclGetRootInfo`) and [`init_rank`] (`ncclCommInitRank`, `HcclCommInitRootInfo`), which
//! keeps an id whose ranks all join in the process that made it in-process
//! ([`crate::collective`], unchanged) and takes the socket path otherwise.

pub mod bootstrap;
pub mod comm;
pub mod ifname;
pub mod reduce;
pub mod ring;

use std::ffi::c_void;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use crate::collective::{self, CollError, Handover, Lib};
use crate::config;

/// The environment variables of one library.
#[derive(Clone, Copy, Debug)]
pub struct Knobs {
    /// `NCCL_SOCKET_IFNAME` / `HCCL_SOCKET_IFNAME`.
    pub ifname: &'static str,
    /// `HCCL_IF_IP` (the address to use, before the interface name): HCCL only.
    pub if_ip: Option<&'static str>,
    /// `NCCL_COMM_ID` (`host:port` of the root): NCCL only.
    pub comm_id: Option<&'static str>,
}

impl Knobs {
    /// The interface this process's sockets use.
    pub fn interface(self) -> Result<ifname::IfAddr, CollError> {
        ifname::from_env(self.ifname, self.if_ip).map_err(CollError::System)
    }
}

pub const NCCL: Knobs = Knobs {
    ifname: "NCCL_SOCKET_IFNAME",
    if_ip: None,
    comm_id: Some("NCCL_COMM_ID"),
};

pub const HCCL: Knobs = Knobs {
    ifname: "HCCL_SOCKET_IFNAME",
    if_ip: Some("HCCL_IF_IP"),
    comm_id: None,
};

/// Where a new id's root listens: `NCCL_COMM_ID`'s `host:port` when set, else port 0 on the
/// interface the library's `*_SOCKET_IFNAME` selects.
fn root_bind(knobs: Knobs) -> Result<SocketAddr, CollError> {
    if let Some(value) = knobs.comm_id.and_then(|v| std::env::var(v).ok()) {
        let value = value.trim();
        return value
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| {
                CollError::InvalidArgument(format!("NCCL_COMM_ID={value} is not host:port"))
            });
    }
    Ok(knobs.interface()?.socket_addr(0))
}

/// A fresh id: `prefix` (the library's magic, pid and counter: 24 bytes) followed by the
/// address of a new root listener and its nonce.
pub fn new_id(prefix: Vec<u8>, knobs: Knobs) -> Result<Vec<u8>, CollError> {
    let bind = root_bind(knobs)?;
    let timeout = Duration::from_millis(config::get().pair_timeout_ms);
    let info = bootstrap::start_root(bind, timeout)
        .map_err(|e| CollError::System(format!("cannot listen on {bind} for the root: {e}")))?;
    let mut id = prefix;
    id.truncate(24);
    bootstrap::put_addr(&mut id, info.root);
    id.extend_from_slice(&info.nonce);
    Ok(id)
}

/// Rank `rank` of `nranks` joins the clique named by `id` (already checked for the
/// library's magic): in-process when the id was made here and all its ranks join here,
/// else over the sockets.
pub fn init_rank(
    lib: Lib,
    id: &[u8],
    nranks: usize,
    rank: usize,
    knobs: Knobs,
) -> Result<*mut c_void, CollError> {
    if nranks == 0 || rank >= nranks {
        return Err(CollError::InvalidArgument(format!(
            "rank {rank} is out of range for {nranks} ranks"
        )));
    }
    let info = bootstrap::parse_id(&id[..id.len().min(bootstrap::ID_LEN)]).ok_or_else(|| {
        CollError::InvalidArgument("the id names no root address (altered or truncated)".into())
    })?;
    if bootstrap::is_local(&info.nonce) {
        let switched = || bootstrap::switched(&info.nonce);
        let claim = || bootstrap::claim_in_process(&info.nonce);
        let handover = Handover {
            switched: &switched,
            claim: &claim,
        };
        let key = &id[..bootstrap::ID_LEN];
        if let Some(handle) = collective::init_rank(lib, key, nranks, rank, &handover)? {
            return Ok(handle);
        }
    }
    comm::init(lib, &info, nranks, rank, knobs)
}
