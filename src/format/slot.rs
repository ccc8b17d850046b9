//! One sample slot of a one-shot run: which cell of which probe kind, under which load
//! profile, in which pass. Each kind's slot has its own typed fields (a device, a device pair
//! or an ordered pair; a CPU or a CPU per rank; a copy direction; a host memory kind). In
//! `cells.jsonl` a slot is the flat object chd has always written ([`SlotRecord`]: `matrix`,
//! `load`, `pass`, `cpu`, `peer_cpu`, `device`, `size_bytes`, `direction`, `host_memory`);
//! it is converted, and checked, at this boundary, so run directories of every chd load,
//! resume and report, and a line that names no valid slot is refused with the reason.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::MatrixKind;
use crate::vocab::{DeviceId, DevicePair, Direction, HostMemory, OrderedPair};

/// `host_memory` of the slots whose buffers are all device memory (pair, d2d, p2p; a basics
/// matmul, same-device copy or allgather).
pub const DEVICE_MEMORY: &str = "device";

/// One sample slot: a cell of a probe kind ([`Slot`]), under one load profile, in one pass.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "SlotRecord", into = "SlotRecord")]
pub struct SlotId {
    /// Load profile (`idle`, `cpu:8`, ...).
    pub load: String,
    /// Pass number, 0-based: every pass visits every cell once, in a fresh random order.
    pub pass: u32,
    pub cell: Slot,
}

/// The cell a slot measures, per probe kind.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Slot {
    /// A cell of the core x device copy matrix.
    H2d(CopySlot),
    /// A cell of a core-pair matrix.
    Pair(PairSlot),
    /// One measurement of the basic validation table.
    Basics(BasicsSlot),
    /// One point of a size curve.
    Sweep(SweepSlot),
    /// One ordered peer copy.
    P2p(P2pSlot),
    /// One same-device copy.
    D2d(D2dSlot),
}

/// A copy between host memory local to `cpu` and `device`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CopySlot {
    pub cpu: u32,
    pub device: DeviceId,
    pub size_bytes: u64,
    pub direction: Direction,
    pub host_memory: HostMemory,
}

/// A 2-rank operation of a device pair: rank 0 bound to `cpus[0]` on the pair's first device,
/// rank 1 bound to `cpus[1]` on its second.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PairSlot {
    pub cpus: [u32; 2],
    pub pair: DevicePair,
    /// Bytes per rank.
    pub size_bytes: u64,
    pub operation: PairOperation,
}

/// What a pair cell measures: the allgather of a collective library, or, where none opened,
/// peer copies between the two devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PairOperation {
    Allgather,
    PeerCopy,
}

impl PairOperation {
    pub fn as_str(self) -> &'static str {
        match self {
            PairOperation::Allgather => "allgather",
            PairOperation::PeerCopy => "peer-copy",
        }
    }

    /// The operation of a pair probe's method (`nccl`, `hccl`: allgather; `copy`: peer copies).
    pub fn of_method(method: &str) -> PairOperation {
        match method {
            "copy" => PairOperation::PeerCopy,
            _ => PairOperation::Allgather,
        }
    }
}

impl std::str::FromStr for PairOperation {
    type Err = String;
    fn from_str(s: &str) -> Result<PairOperation, String> {
        match s {
            "allgather" => Ok(PairOperation::Allgather),
            "peer-copy" => Ok(PairOperation::PeerCopy),
            other => Err(format!(
                "unknown pair operation {other:?}: expected allgather or peer-copy"
            )),
        }
    }
}

/// A same-device copy on `device` (device memory to device memory), issued from `cpu`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct D2dSlot {
    pub cpu: u32,
    pub device: DeviceId,
    pub size_bytes: u64,
}

/// A peer copy of `pair` (from its source's memory into its destination's), issued from `cpu`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct P2pSlot {
    pub cpu: u32,
    pub pair: OrderedPair,
    pub size_bytes: u64,
}

/// One point of a size curve from `cpu` to `device`. `host_memory` is the curve's (the
/// plan's) host memory kind; it is the host side of the copy operations' copies.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SweepSlot {
    pub cpu: u32,
    pub device: DeviceId,
    pub size_bytes: u64,
    pub host_memory: HostMemory,
    pub op: SweepOp,
}

/// The operation of a size curve's point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SweepOp {
    /// A copy between host and device.
    Copy(Direction),
    /// A same-device copy.
    D2d,
    /// The 2-rank allgather of the device with its peer (the plan's `peers`), rank 1 bound to
    /// `peer_cpu`.
    Allgather { peer_cpu: u32 },
}

impl SweepOp {
    /// The operation as run.json, the CSV and `--ops` name it.
    pub fn as_str(self) -> &'static str {
        match self {
            SweepOp::Copy(d) => d.as_str(),
            SweepOp::D2d => "d2d",
            SweepOp::Allgather { .. } => "allgather",
        }
    }
}

/// One measurement of the basic validation table, each on a CPU of its device's NUMA node.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BasicsSlot {
    /// SGEMM of two `side` x `side` matrices.
    Matmul {
        cpu: u32,
        device: DeviceId,
        side: u64,
    },
    /// Host-to-device copies.
    H2d {
        cpu: u32,
        device: DeviceId,
        size_bytes: u64,
        host_memory: HostMemory,
    },
    /// Same-device copies.
    D2d {
        cpu: u32,
        device: DeviceId,
        size_bytes: u64,
    },
    /// The 2-rank allgather of a device pair, rank 0 on `cpus[0]`, rank 1 on `cpus[1]`.
    Allgather {
        cpus: [u32; 2],
        pair: DevicePair,
        size_bytes: u64,
    },
}

impl BasicsSlot {
    /// The measurement as run.json's `directions` and the table name it.
    pub fn measurement(&self) -> &'static str {
        match self {
            BasicsSlot::Matmul { .. } => "matmul",
            BasicsSlot::H2d { .. } => "h2d",
            BasicsSlot::D2d { .. } => "d2d",
            BasicsSlot::Allgather { .. } => "allgather",
        }
    }
}

impl Slot {
    /// The kind of probe that measures it.
    pub fn kind(&self) -> MatrixKind {
        match self {
            Slot::H2d(_) => MatrixKind::H2d,
            Slot::Pair(_) => MatrixKind::Pair,
            Slot::Basics(_) => MatrixKind::Basics,
            Slot::Sweep(_) => MatrixKind::Sweep,
            Slot::P2p(_) => MatrixKind::P2p,
            Slot::D2d(_) => MatrixKind::D2d,
        }
    }

    /// The CPU the measuring thread is bound to (rank 0's for a 2-rank cell).
    pub fn cpu(&self) -> u32 {
        match self {
            Slot::H2d(s) => s.cpu,
            Slot::Pair(s) => s.cpus[0],
            Slot::Basics(
                BasicsSlot::Matmul { cpu, .. }
                | BasicsSlot::H2d { cpu, .. }
                | BasicsSlot::D2d { cpu, .. },
            ) => *cpu,
            Slot::Basics(BasicsSlot::Allgather { cpus, .. }) => cpus[0],
            Slot::Sweep(s) => s.cpu,
            Slot::P2p(s) => s.cpu,
            Slot::D2d(s) => s.cpu,
        }
    }

    /// The CPUs the slot keeps busy: its thread's, and rank 1's for a 2-rank cell.
    pub fn cpus(&self) -> Vec<u32> {
        let rank1 = match self {
            Slot::Pair(s) => Some(s.cpus[1]),
            Slot::Basics(BasicsSlot::Allgather { cpus, .. }) => Some(cpus[1]),
            Slot::Sweep(SweepSlot {
                op: SweepOp::Allgather { peer_cpu },
                ..
            }) => Some(*peer_cpu),
            _ => None,
        };
        std::iter::once(self.cpu()).chain(rank1).collect()
    }

    /// The device whose host-to-device link the slot's copies cross (the one to read the
    /// PCIe link of right after them), if they cross one.
    pub fn link_device(&self) -> Option<&DeviceId> {
        match self {
            Slot::H2d(s) => Some(&s.device),
            Slot::Sweep(SweepSlot {
                device,
                op: SweepOp::Copy(_),
                ..
            }) => Some(device),
            Slot::Basics(BasicsSlot::H2d { device, .. }) => Some(device),
            _ => None,
        }
    }

    /// The flat form of `cells.jsonl` (and of a report's cells).
    pub fn record(&self, load: &str, pass: u32) -> SlotRecord {
        let matrix = self.kind();
        let flat =
            |cpu, peer_cpu, device: String, size_bytes, direction: &str, memory: &str| SlotRecord {
                matrix,
                load: load.to_string(),
                pass,
                cpu,
                peer_cpu,
                device,
                size_bytes,
                direction: direction.to_string(),
                host_memory: memory.to_string(),
            };
        match self {
            Slot::H2d(s) => flat(
                s.cpu,
                None,
                s.device.to_string(),
                s.size_bytes,
                s.direction.as_str(),
                s.host_memory.as_str(),
            ),
            Slot::Pair(s) => flat(
                s.cpus[0],
                Some(s.cpus[1]),
                s.pair.to_string(),
                s.size_bytes,
                s.operation.as_str(),
                DEVICE_MEMORY,
            ),
            Slot::D2d(s) => flat(
                s.cpu,
                None,
                s.device.to_string(),
                s.size_bytes,
                "d2d",
                DEVICE_MEMORY,
            ),
            Slot::P2p(s) => flat(
                s.cpu,
                None,
                s.pair.to_string(),
                s.size_bytes,
                PairOperation::PeerCopy.as_str(),
                DEVICE_MEMORY,
            ),
            Slot::Sweep(s) => flat(
                s.cpu,
                match s.op {
                    SweepOp::Allgather { peer_cpu } => Some(peer_cpu),
                    _ => None,
                },
                s.device.to_string(),
                s.size_bytes,
                s.op.as_str(),
                s.host_memory.as_str(),
            ),
            Slot::Basics(b) => {
                let op = b.measurement();
                match b {
                    BasicsSlot::Matmul { cpu, device, side } => {
                        flat(*cpu, None, device.to_string(), *side, op, DEVICE_MEMORY)
                    }
                    BasicsSlot::H2d {
                        cpu,
                        device,
                        size_bytes,
                        host_memory,
                    } => flat(
                        *cpu,
                        None,
                        device.to_string(),
                        *size_bytes,
                        op,
                        host_memory.as_str(),
                    ),
                    BasicsSlot::D2d {
                        cpu,
                        device,
                        size_bytes,
                    } => flat(
                        *cpu,
                        None,
                        device.to_string(),
                        *size_bytes,
                        op,
                        DEVICE_MEMORY,
                    ),
                    BasicsSlot::Allgather {
                        cpus,
                        pair,
                        size_bytes,
                    } => flat(
                        cpus[0],
                        Some(cpus[1]),
                        pair.to_string(),
                        *size_bytes,
                        op,
                        DEVICE_MEMORY,
                    ),
                }
            }
        }
    }
}

impl SlotId {
    /// The flat form of `cells.jsonl` (and of a report's cells).
    pub fn record(&self) -> SlotRecord {
        self.cell.record(&self.load, self.pass)
    }
}

/// A slot as `cells.jsonl` spells it: the one flat shape of every kind (the meaning of
/// `device`, `direction` and `host_memory` depends on `matrix`; [`Slot`] names it).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SlotRecord {
    pub matrix: MatrixKind,
    pub load: String,
    pub pass: u32,
    /// The probing CPU (rank 0's CPU for a 2-rank cell).
    pub cpu: u32,
    /// Rank 1's CPU for a 2-rank cell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_cpu: Option<u32>,
    /// The device, the device pair (`0,5`) or the ordered pair (`0>5`).
    pub device: String,
    /// Bytes of one copy (per rank for a collective); the matrix side N for a basics matmul.
    pub size_bytes: u64,
    /// The direction or operation (`h2d`, `d2h`, `d2d`, `allgather`, `peer-copy`, `matmul`).
    pub direction: String,
    /// `pinned`, `pageable`, or `device` where every buffer is device memory.
    pub host_memory: String,
}

/// Why a `cells.jsonl` object names no slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotError(String);

impl fmt::Display for SlotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SlotError {}

impl TryFrom<SlotRecord> for SlotId {
    type Error = SlotError;
    fn try_from(r: SlotRecord) -> Result<SlotId, SlotError> {
        let kind = r.matrix.as_str();
        let bad =
            |field: &str, e: &dyn fmt::Display| SlotError(format!("{kind} slot: {field}: {e}"));
        let device = || r.device.parse::<DeviceId>().map_err(|e| bad("device", &e));
        let pair = || {
            r.device
                .parse::<DevicePair>()
                .map_err(|e| bad("device", &e))
        };
        let memory = || {
            r.host_memory
                .parse::<HostMemory>()
                .map_err(|e| bad("host_memory", &e))
        };
        let peer = || {
            r.peer_cpu
                .ok_or_else(|| bad("peer_cpu", &"missing: a 2-rank cell has a CPU per rank"))
        };
        let cell = match r.matrix {
            MatrixKind::H2d => Slot::H2d(CopySlot {
                cpu: r.cpu,
                device: device()?,
                size_bytes: r.size_bytes,
                direction: r.direction.parse().map_err(|e| bad("direction", &e))?,
                host_memory: memory()?,
            }),
            MatrixKind::Pair => Slot::Pair(PairSlot {
                cpus: [r.cpu, peer()?],
                pair: pair()?,
                size_bytes: r.size_bytes,
                operation: r.direction.parse().map_err(|e| bad("direction", &e))?,
            }),
            MatrixKind::D2d => Slot::D2d(D2dSlot {
                cpu: r.cpu,
                device: device()?,
                size_bytes: r.size_bytes,
            }),
            MatrixKind::P2p => Slot::P2p(P2pSlot {
                cpu: r.cpu,
                pair: r
                    .device
                    .parse::<OrderedPair>()
                    .map_err(|e| bad("device", &e))?,
                size_bytes: r.size_bytes,
            }),
            MatrixKind::Sweep => Slot::Sweep(SweepSlot {
                cpu: r.cpu,
                device: device()?,
                size_bytes: r.size_bytes,
                host_memory: memory()?,
                op: match r.direction.as_str() {
                    "d2d" => SweepOp::D2d,
                    "allgather" => SweepOp::Allgather { peer_cpu: peer()? },
                    other => SweepOp::Copy(other.parse().map_err(|_| {
                        bad(
                            "direction",
                            &format!(
                                "unknown operation {other:?}: expected h2d, d2h, d2d or allgather"
                            ),
                        )
                    })?),
                },
            }),
            MatrixKind::Basics => Slot::Basics(match r.direction.as_str() {
                "matmul" => BasicsSlot::Matmul {
                    cpu: r.cpu,
                    device: device()?,
                    side: r.size_bytes,
                },
                "h2d" => BasicsSlot::H2d {
                    cpu: r.cpu,
                    device: device()?,
                    size_bytes: r.size_bytes,
                    host_memory: memory()?,
                },
                "d2d" => BasicsSlot::D2d {
                    cpu: r.cpu,
                    device: device()?,
                    size_bytes: r.size_bytes,
                },
                "allgather" => BasicsSlot::Allgather {
                    cpus: [r.cpu, peer()?],
                    pair: pair()?,
                    size_bytes: r.size_bytes,
                },
                other => {
                    return Err(bad(
                        "direction",
                        &format!(
                            "unknown measurement {other:?}: expected matmul, h2d, d2d or allgather"
                        ),
                    ))
                }
            }),
        };
        Ok(SlotId {
            load: r.load,
            pass: r.pass,
            cell,
        })
    }
}

impl From<SlotId> for SlotRecord {
    fn from(id: SlotId) -> SlotRecord {
        id.record()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(matrix: &str, device: &str, direction: &str, memory: &str, peer: bool) -> String {
        format!(
            r#"{{"matrix":"{matrix}","load":"idle","pass":1,"cpu":3,{}"device":"{device}","size_bytes":1048576,"direction":"{direction}","host_memory":"{memory}"}}"#,
            if peer { r#""peer_cpu":9,"# } else { "" }
        )
    }

    /// Every kind's line as chd 73ea187 wrote it parses into its typed slot and prints back
    /// the same line (basics' same-device copies now say `device`, the memory they use).
    #[test]
    fn every_kind_round_trips_through_the_line_it_always_had() {
        for (text, matrix, kind_cpus) in [
            (
                line("h2d", "0", "d2h", "pageable", false),
                MatrixKind::H2d,
                vec![3],
            ),
            (
                line("pair", "0,5", "allgather", "device", true),
                MatrixKind::Pair,
                vec![3, 9],
            ),
            (
                line("d2d", "2", "d2d", "device", false),
                MatrixKind::D2d,
                vec![3],
            ),
            (
                line("p2p", "2>1", "peer-copy", "device", false),
                MatrixKind::P2p,
                vec![3],
            ),
            (
                line("sweep", "0", "allgather", "pinned", true),
                MatrixKind::Sweep,
                vec![3, 9],
            ),
            (
                line("sweep", "0", "d2d", "pinned", false),
                MatrixKind::Sweep,
                vec![3],
            ),
            (
                line("basics", "1,2", "allgather", "device", true),
                MatrixKind::Basics,
                vec![3, 9],
            ),
            (
                line("basics", "1", "matmul", "device", false),
                MatrixKind::Basics,
                vec![3],
            ),
            (
                line("basics", "1", "h2d", "pinned", false),
                MatrixKind::Basics,
                vec![3],
            ),
        ] {
            let id: SlotId = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(id.cell.kind(), matrix);
            assert_eq!(id.cell.cpus(), kind_cpus, "{text}");
            assert_eq!(serde_json::to_string(&id).unwrap(), text);
        }
        let old = line("basics", "1", "d2d", "pinned", false);
        let id: SlotId = serde_json::from_str(&old).unwrap();
        assert_eq!(
            id.cell,
            Slot::Basics(BasicsSlot::D2d {
                cpu: 3,
                device: "1".parse().unwrap(),
                size_bytes: 1 << 20
            })
        );
        assert_eq!(id.record().host_memory, DEVICE_MEMORY);
    }

    #[test]
    fn a_line_that_names_no_slot_is_refused_with_the_field() {
        for (text, expected) in [
            (
                line("pair", "0;5", "allgather", "device", true),
                "pair slot: device: \"0;5\" is not a device pair",
            ),
            (
                line("pair", "0,5", "allgather", "device", false),
                "pair slot: peer_cpu: missing",
            ),
            (
                line("p2p", "0,5", "peer-copy", "device", false),
                "p2p slot: device: \"0,5\" is not an ordered device pair",
            ),
            (
                line("h2d", "0", "sideways", "pinned", false),
                "h2d slot: direction: unknown direction \"sideways\"",
            ),
            (
                line("h2d", "0", "h2d", "paged", false),
                "h2d slot: host_memory: unknown host memory \"paged\"",
            ),
            (
                line("sweep", "0", "d2x", "pinned", false),
                "unknown operation \"d2x\"",
            ),
            (
                line("basics", "0", "tflops", "device", false),
                "unknown measurement \"tflops\"",
            ),
            (
                line("d2d", "", "d2d", "device", false),
                "d2d slot: device: a device id cannot be empty",
            ),
        ] {
            let err = serde_json::from_str::<SlotId>(&text)
                .unwrap_err()
                .to_string();
            assert!(err.contains(expected), "{text}: {err}");
        }
    }
}
