//! The rendezvous protocol between rank 0 and the other ranks: length-prefixed JSON messages
//! over one TCP connection per rank. Rank 0 challenges, the rank answers with its proof of the
//! token and a challenge of its own, rank 0 answers that (or refuses), then sends the plan, says
//! which transfer runs next, gathers each sender's measurement and hands everyone the results.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::rails::Rail;

/// The largest message accepted (the results of a large world stay far below it).
pub const MAX_MESSAGE: u32 = 16 << 20;

/// A rail of a rank with the port its data listener took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    pub rail: Rail,
    pub port: u16,
}

/// Who a rank is, as it told rank 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankInfo {
    pub rank: u32,
    pub world_size: u32,
    pub local_rank: u32,
    pub node: String,
    pub endpoints: Vec<Endpoint>,
    /// Where its ring listener for the collectives is (none when the run has none).
    #[serde(default)]
    pub ring: Option<SocketAddr>,
    /// What it measures with (`host`, `cuda`, `acl`): every rank of a run the same.
    #[serde(default = "host_backend")]
    pub backend: String,
}

fn host_backend() -> String {
    "host".into()
}

/// One collective of the plan: every rank in rank order, a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectiveStep {
    pub op: super::ring::Op,
    pub bytes: u64,
}

/// A collective's outcome over all ranks: the slowest rank's time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CollectiveResult {
    pub step: CollectiveStep,
    pub ranks: u32,
    pub seconds: Option<f64>,
    pub error: Option<String>,
}

impl CollectiveResult {
    /// Bytes over the time, GB/s.
    pub fn alg_gbps(&self) -> Option<f64> {
        self.seconds
            .filter(|s| *s > 0.0)
            .map(|s| self.step.bytes as f64 / s / 1e9)
    }

    /// Bus bandwidth as nccl-tests defines it.
    pub fn bus_gbps(&self) -> Option<f64> {
        self.alg_gbps()
            .map(|a| a * self.step.op.bus_factor(self.ranks as usize))
    }
}

/// One transfer of the plan: `sender` streams `bytes` over `streams` connections from its
/// rail to the receiver's rail in the same subnet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    pub sender: u32,
    pub receiver: u32,
    pub rail: String,
    pub from: IpAddr,
    pub peer_rail: String,
    pub to: SocketAddr,
    pub bytes: u64,
    pub streams: u32,
}

/// What a transfer measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    /// Bytes the receiver confirmed.
    pub bytes: u64,
    /// From the moment every stream was connected to the last confirmation.
    pub seconds: Option<f64>,
    /// Why it carried less than planned or nothing.
    pub error: Option<String>,
}

impl Measured {
    /// Bytes over time, in GB/s; `None` when nothing was carried.
    pub fn gbps(&self) -> Option<f64> {
        match self.seconds {
            Some(s) if s > 0.0 && self.bytes > 0 => Some(self.bytes as f64 / s / 1e9),
            _ => None,
        }
    }
}

/// A step with its measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transfer {
    pub step: Step,
    pub measured: Measured,
    /// Where each side ran (device backends).
    #[serde(default, skip_serializing_if = "SidePlaces::is_empty")]
    pub places: SidePlaces,
}

/// Where one side of a rail transfer ran: its device, and its CPUs (a cpulist; none:
/// unbound).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SidePlace {
    pub device: String,
    pub cpus: Option<String>,
}

/// Where each side of a rail transfer ran, where a rank process said.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SidePlaces {
    pub sender: Option<SidePlace>,
    pub receiver: Option<SidePlace>,
}

impl SidePlaces {
    pub fn is_empty(&self) -> bool {
        self.sender.is_none() && self.receiver.is_none()
    }
}

/// Messages from rank 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FromRoot {
    Challenge {
        challenge: String,
    },
    Welcome {
        proof: String,
    },
    Refused {
        why: String,
    },
    Plan {
        run: String,
        steps: Vec<Step>,
        #[serde(default)]
        collectives: Vec<CollectiveStep>,
        /// Every rank's ring listener, in rank order (empty without collectives).
        #[serde(default)]
        ring: Vec<SocketAddr>,
    },
    /// Collective `index` begins; every rank takes part. On a device backend the first
    /// carries the rendezvous rank 0's rank process made (hex), or none when it failed.
    Collective {
        index: usize,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
    },
    /// Step `step` begins; its sender runs it (on a device backend, its receiver too).
    Go {
        step: usize,
    },
    /// Device backends: the rendezvous of step `step`'s receiving side, for its sender, or
    /// why the receiving side could not start.
    Rendezvous {
        step: usize,
        id: Result<String, String>,
        /// The receiving side's device when the sending side is on the same node: the sender
        /// takes another (NCCL runs one rank per GPU).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        avoid: Option<String>,
    },
    Done {
        ranks: Vec<RankInfo>,
        transfers: Vec<Transfer>,
        #[serde(default)]
        collectives: Vec<CollectiveResult>,
    },
    Abort {
        why: String,
    },
}

/// Messages to rank 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FromRank {
    Hello {
        info: RankInfo,
        proof: String,
        challenge: String,
    },
    Measured {
        step: usize,
        measured: Measured,
        /// Device backends: where this rank's side ran.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        place: Option<SidePlace>,
    },
    /// Device backends: the rendezvous this rank's receiving side of step `step` made, or why
    /// it could not start.
    Rendezvous {
        step: usize,
        id: Result<String, String>,
        /// The device the receiving side runs on.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        device: Option<String>,
    },
    /// This rank's time of collective `index`, or why it failed.
    Collective {
        index: usize,
        seconds: Option<f64>,
        error: Option<String>,
    },
}

/// Why a message could not be read.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("the connection closed")]
    Closed,
    #[error("no message within the deadline")]
    TimedOut,
    #[error("{0}")]
    Io(#[source] io::Error),
    #[error("a message of {0} bytes (at most {MAX_MESSAGE}): not a chd fabric peer")]
    TooLarge(u32),
    #[error("not a chd fabric message: {0}")]
    Garbled(#[source] serde_json::Error),
}

fn classify(e: io::Error) -> WireError {
    match e.kind() {
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe => WireError::Closed,
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => WireError::TimedOut,
        _ => WireError::Io(e),
    }
}

/// Write one message.
pub fn send<T: Serialize>(w: &mut impl Write, msg: &T) -> Result<(), WireError> {
    let body = serde_json::to_vec(msg).expect("protocol messages serialize");
    let len = u32::try_from(body.len()).map_err(|_| WireError::TooLarge(u32::MAX))?;
    let mut frame = Vec::with_capacity(body.len() + 4);
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&body);
    w.write_all(&frame).map_err(classify)?;
    w.flush().map_err(classify)
}

/// Read one message (the socket's read timeout bounds the wait).
pub fn receive<T: DeserializeOwned>(r: &mut impl Read) -> Result<T, WireError> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).map_err(classify)?;
    let len = u32::from_be_bytes(len);
    if len > MAX_MESSAGE {
        return Err(WireError::TooLarge(len));
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body).map_err(classify)?;
    serde_json::from_slice(&body).map_err(WireError::Garbled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_garbage_is_named() {
        let mut buf = Vec::new();
        send(&mut buf, &FromRoot::Go { step: 3 }).unwrap();
        send(&mut buf, &FromRoot::Abort { why: "x".into() }).unwrap();
        let mut r = buf.as_slice();
        assert_eq!(
            receive::<FromRoot>(&mut r).unwrap(),
            FromRoot::Go { step: 3 }
        );
        assert_eq!(
            receive::<FromRoot>(&mut r).unwrap(),
            FromRoot::Abort { why: "x".into() }
        );
        assert!(matches!(
            receive::<FromRoot>(&mut r),
            Err(WireError::Closed)
        ));
        let http = b"GET / HTTP/1.1\r\n\r\n";
        assert!(matches!(
            receive::<FromRoot>(&mut http.as_slice()),
            Err(WireError::TooLarge(_))
        ));
        let mut junk = 3u32.to_be_bytes().to_vec();
        junk.extend_from_slice(b"{x}");
        assert!(matches!(
            receive::<FromRoot>(&mut junk.as_slice()),
            Err(WireError::Garbled(_))
        ));
    }

    #[test]
    fn gbps_is_bytes_over_seconds() {
        let m = Measured {
            bytes: 2_000_000_000,
            seconds: Some(0.5),
            error: None,
        };
        assert_eq!(m.gbps(), Some(4.0));
        let none = Measured {
            bytes: 0,
            seconds: Some(1.0),
            error: Some("refused".into()),
        };
        assert_eq!(none.gbps(), None);
    }
}
