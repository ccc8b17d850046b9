//! One point of a size curve (`chd probe sweep`): a sample slot of a sweep plan measured by
//! its operation. `h2d` and `d2h` go through the copy cell of [`super::h2d`] (bound to the
//! slot's CPU, the backend's event-timed copies); `d2d` binds the thread the same way and asks
//! [`Backend::measure_device_copy`]; `allgather` runs the pair probe on the swept device and
//! its peer with rank 0 on the slot's CPU and rank 1 on the peer's CPU.
//!
//! As a probe kind ([`KIND`]): from one CPU to each device, every operation at sizes
//! doubling from `--from` to `--to`, allgather points only for devices with a peer.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use super::kind::{self, Layout, MatrixFacts, ProbeKind};
use super::plan::{
    counts_from, doubling_sizes, flag, list, pair_timeout, parse_size, product, timeout_ms, Common,
    FlagNames, PlanContext, PlanError,
};
use super::setup::{Measure, Prepared, Setup, SetupError};
use crate::affinity;
use crate::format::run_dir::{MatrixKind, RunPlan, SweepPeer, SWEEP_ALLGATHER};
use crate::format::slot::{PairOperation, Slot, SlotId, SweepOp, SweepSlot};
use crate::runtime::pair::{PairParams, PairProbe};
use crate::runtime::{Backend, DeviceCopyParams, ProbeError};
use crate::store::CellKey;
use crate::vocab::{size_label, HostMemory};

/// The same-device copy of a sweep.
pub const SWEEP_D2D: &str = "d2d";
/// Every operation a sweep measures, in the report's order.
pub const SWEEP_OPS: [&str; 4] = ["h2d", "d2h", SWEEP_D2D, SWEEP_ALLGATHER];
/// Defaults of `chd probe sweep`: the sizes 128 KiB, 256 KiB, ... 1 GiB.
pub const DEFAULT_SWEEP_FROM: &str = "128KiB";
pub const DEFAULT_SWEEP_TO: &str = "1GiB";

/// What measures the points of one sweep run.
pub struct SweepProbe<'a> {
    pub backend: &'a dyn Backend,
    /// The pair probe for `allgather` points (none: those points fail).
    pub pairs: Option<&'a dyn PairProbe>,
    pub plan: &'a RunPlan,
    /// Longest one allgather sample may take.
    pub pair_timeout: std::time::Duration,
}

impl SweepProbe<'_> {
    /// Measure one sample of `slot`. Returns bytes per second (bus bandwidth for allgather).
    pub fn measure(&self, slot: &SlotId) -> Result<f64, ProbeError> {
        let Slot::Sweep(point) = &slot.cell else {
            return Err(ProbeError::Unsupported(format!(
                "a sweep measures no {} slot",
                slot.cell.kind().as_str()
            )));
        };
        let (warmup, iterations) = (self.plan.warmup, self.plan.iterations);
        let device = point.device.as_str();
        match point.op {
            SweepOp::D2d => {
                let _binding = affinity::bind_exactly(point.cpu).map_err(|e| ProbeError::Bind {
                    cpu: point.cpu,
                    detail: e.to_string(),
                })?;
                self.backend.measure_device_copy(
                    device,
                    &DeviceCopyParams {
                        size_bytes: point.size_bytes,
                        warmup,
                        iterations,
                    },
                )
            }
            SweepOp::Allgather { peer_cpu } => {
                let probe = self.pairs.ok_or_else(|| {
                    ProbeError::Collective("no pair probe could be opened".into())
                })?;
                let peer = self.plan.peers.get(device).ok_or_else(|| {
                    ProbeError::Collective(format!("device {device} has no peer"))
                })?;
                probe.measure(
                    [device, peer.device.as_str()],
                    [point.cpu, peer_cpu],
                    &PairParams {
                        bytes_per_rank: point.size_bytes,
                        warmup,
                        iterations,
                        timeout: self.pair_timeout,
                    },
                )
            }
            SweepOp::Copy(direction) => {
                let cell = CellKey {
                    cpu: point.cpu,
                    device: device.to_string(),
                    size_bytes: point.size_bytes,
                    direction,
                };
                super::h2d::measure_cell(self.backend, &cell, warmup, iterations, point.host_memory)
            }
        }
    }
}

/// Size curves as a probe kind.
pub struct SweepKind;

/// `chd probe sweep` in the kind table.
pub const KIND: SweepKind = SweepKind;

/// A sweep plan's operation, or the error naming it.
fn sweep_op(op: &str, peer_cpu: Option<u32>) -> Result<Option<SweepOp>, String> {
    Ok(Some(match op {
        SWEEP_D2D => SweepOp::D2d,
        SWEEP_ALLGATHER => match peer_cpu {
            Some(peer_cpu) => SweepOp::Allgather { peer_cpu },
            // A device without a peer has no allgather points.
            None => return Ok(None),
        },
        other => SweepOp::Copy(other.parse().map_err(|_| {
            format!(
                "directions: unknown operation {other:?}: expected {}",
                SWEEP_OPS.join(", ")
            )
        })?),
    }))
}

impl ProbeKind for SweepKind {
    fn kind(&self) -> MatrixKind {
        MatrixKind::Sweep
    }

    fn layout(&self) -> Layout {
        Layout::Curves
    }

    fn matrix_title(&self, m: &MatrixFacts) -> String {
        format!(
            "Sweep {} {}, load {}",
            m.direction,
            size_label(m.size_bytes),
            m.load
        )
    }

    fn pass_slots(&self, plan: &RunPlan, load: &str, pass: u32) -> Result<Vec<SlotId>, String> {
        let devices = kind::device_ids(plan)?;
        let memories = kind::host_memories(plan)?;
        let mut slots = Vec::new();
        for &cpu in &plan.cpus {
            for &size_bytes in &plan.sizes_bytes {
                for op in &plan.directions {
                    for &host_memory in &memories {
                        for device in &devices {
                            let peer_cpu = plan.peers.get(device.as_str()).map(|p| p.cpu);
                            let Some(op) = sweep_op(op, peer_cpu)? else {
                                continue;
                            };
                            slots.push(SlotId {
                                load: load.to_string(),
                                pass,
                                cell: Slot::Sweep(SweepSlot {
                                    cpu,
                                    device: device.clone(),
                                    size_bytes,
                                    host_memory,
                                    op,
                                }),
                            });
                        }
                    }
                }
            }
        }
        Ok(slots)
    }

    /// Every copy operation on every device, allgather on the devices with a peer, per CPU,
    /// size and host memory (saturating).
    fn cells_per_pass(&self, plan: &RunPlan) -> usize {
        let with_peer = plan
            .devices
            .iter()
            .filter(|d| plan.peers.contains_key(*d))
            .count();
        let columns = plan
            .directions
            .iter()
            .map(|d| {
                if d == SWEEP_ALLGATHER {
                    with_peer
                } else {
                    plan.devices.len()
                }
            })
            .fold(0usize, |n, m| n.saturating_add(m));
        product(
            plan.cpus.len(),
            &[columns, plan.sizes_bytes.len(), plan.host_memories.len()],
        )
    }

    fn shape(&self, plan: &RunPlan) -> String {
        format!(
            "from CPU {} to {} device{} ({}), {} sizes {}..{}",
            plan.cpus.first().copied().unwrap_or_default(),
            plan.devices.len(),
            if plan.devices.len() == 1 { "" } else { "s" },
            plan.directions.join(", "),
            plan.sizes_bytes.len(),
            plan.sizes_bytes
                .first()
                .map(|s| size_label(*s))
                .unwrap_or_default(),
            plan.sizes_bytes
                .last()
                .map(|s| size_label(*s))
                .unwrap_or_default(),
        )
    }

    fn per_sample(&self) -> &'static str {
        "copies (operations per rank for allgather)"
    }

    fn flag_names(&self) -> FlagNames {
        FlagNames {
            cpus: "--cpu",
            pairs: Some("--peer"),
            sizes: "--from/--to",
            directions: "--ops",
            host_memories: "--memory",
        }
    }

    fn plan_facts(&self, plan: &RunPlan) -> Vec<(String, String)> {
        let mut facts = vec![("devices".to_string(), plan.devices.join(", "))];
        if !plan.peers.is_empty() {
            let peers: Vec<String> = plan
                .peers
                .iter()
                .map(|(d, p)| format!("{d} with {} (rank 1 on CPU {})", p.device, p.cpu))
                .collect();
            facts.push(("allgather peers".into(), peers.join("; ")));
        }
        facts
    }

    fn directions_fact(&self) -> &'static str {
        "operations"
    }

    fn copies_over_link(&self) -> bool {
        true
    }

    fn skips_unsupported(&self) -> bool {
        true
    }
}

/// `chd probe sweep` as asked: `None` = not given (the default, or the resumed run's
/// value). `common.cpus` and `common.sizes` are unused: one CPU (`cpu`) and the doubling
/// sizes from `from` to `to`.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub common: Common,
    /// Comma-separated device labels, or `all`.
    pub devices: Option<String>,
    /// The one CPU every point is measured from (allgather: rank 0's).
    pub cpu: Option<u32>,
    /// Smallest size.
    pub from: Option<String>,
    /// Largest size.
    pub to: Option<String>,
    /// Operations: `h2d`, `d2h`, `d2d`, `allgather`.
    pub ops: Option<Vec<String>>,
    /// Rank 1's device of every allgather point [default: each device's farthest peer].
    pub peer: Option<String>,
    /// Host memory of the h2d and d2h points: `pinned` or `pageable`.
    pub host_memory: Option<String>,
}

/// What the caller found out before planning a sweep: whether allgather points can be
/// measured here, and why not.
pub struct SweepContext<'a> {
    pub sysfs: &'a Path,
    /// `Err(why)` when there is no pair probe (no collective library, one device).
    pub allgather: Result<(), String>,
}

/// The plan of a `chd probe sweep` run: one CPU to each device, the doubling sizes, the
/// operations, and for allgather each device's peer. Notes (an operation skipped, and why)
/// come back with it.
pub fn plan(
    req: &Request,
    ctx: &PlanContext,
    sweep: &SweepContext,
) -> Result<(RunPlan, Vec<String>), PlanError> {
    let (base, backend, topology) = (ctx.base, ctx.backend, ctx.topology);
    let mut notes = Vec::new();
    let known = backend.devices();
    let ids: Vec<String> = known.iter().map(|d| d.id.clone()).collect();
    let devices = match (&req.devices, base) {
        (Some(text), _) if text.trim() == "all" => ids.clone(),
        (Some(text), _) => list(std::slice::from_ref(text)),
        (None, Some(b)) => b.devices.clone(),
        (None, None) => ids.clone(),
    };
    if let Some(bad) = devices.iter().find(|d| !ids.contains(d)) {
        return Err(flag("--devices")(format!(
            "{bad:?} is not a device of the {} backend ({})",
            backend.name(),
            ids.join(", ")
        )));
    }
    if devices.is_empty() {
        return Err(PlanError::Nothing("no device".into()));
    }
    let allowed: Vec<u32> = topology.allowed_cpus().map(|c| c.id).collect();
    // The first CPU of `node` this process may use, other than `not`.
    let first_of_node = |node: Option<u32>, not: Option<u32>| {
        let node = node?;
        let cpus = &topology.numa_nodes.iter().find(|n| n.id == node)?.cpus;
        cpus.iter()
            .copied()
            .find(|c| allowed.contains(c) && Some(*c) != not)
    };
    let cpu = match (req.cpu, base) {
        (Some(cpu), _) => {
            if !allowed.contains(&cpu) {
                return Err(flag("--cpu")(format!(
                    "CPU {cpu} is not an online CPU this process may use ({})",
                    crate::topology::cpulist::format(&allowed)
                )));
            }
            cpu
        }
        (None, Some(b)) => *b
            .cpus
            .first()
            .ok_or_else(|| PlanError::Nothing("the run being resumed names no CPU".into()))?,
        (None, None) => {
            let home = known
                .iter()
                .find(|d| d.id == devices[0])
                .and_then(|d| d.numa_node);
            first_of_node(home, None)
                .or_else(|| allowed.first().copied())
                .ok_or_else(|| PlanError::Nothing("no CPU this process may use".into()))?
        }
    };
    let sizes_bytes = match (&req.from, &req.to, base) {
        (None, None, Some(b)) => b.sizes_bytes.clone(),
        (from, to, _) => {
            let from = parse_size(from.as_deref().unwrap_or(DEFAULT_SWEEP_FROM))
                .map_err(flag("--from"))?;
            let to = parse_size(to.as_deref().unwrap_or(DEFAULT_SWEEP_TO)).map_err(flag("--to"))?;
            doubling_sizes(from, to)?
        }
    };
    let mut ops = match (&req.ops, base) {
        (Some(o), _) => {
            let mut ops: Vec<String> = Vec::new();
            for op in list(o) {
                if !SWEEP_OPS.contains(&op.as_str()) {
                    return Err(flag("--ops")(format!(
                        "unknown operation {op:?}: expected {}",
                        SWEEP_OPS.join(", ")
                    )));
                }
                if !ops.contains(&op) {
                    ops.push(op);
                }
            }
            ops
        }
        (None, Some(b)) => b.directions.clone(),
        (None, None) => SWEEP_OPS.iter().map(|o| o.to_string()).collect(),
    };
    let mut peers = BTreeMap::new();
    if ops.iter().any(|o| o == SWEEP_ALLGATHER) {
        match (&sweep.allgather, base) {
            (_, Some(b)) if req.peer.is_none() && !b.peers.is_empty() => peers = b.peers.clone(),
            (Err(why), _) => {
                notes.push(format!("allgather skipped: {why}"));
                ops.retain(|o| o != SWEEP_ALLGATHER);
            }
            (Ok(()), _) => {
                if let Some(p) = &req.peer {
                    if !ids.contains(p) {
                        return Err(flag("--peer")(format!(
                            "{p:?} is not a device of the {} backend ({})",
                            backend.name(),
                            ids.join(", ")
                        )));
                    }
                }
                for d in &devices {
                    let peer = match &req.peer {
                        Some(p) if p != d => Some(p.clone()),
                        _ => super::pairs::farthest_peer(known, d, sweep.sysfs),
                    };
                    let Some(peer) = peer else { continue };
                    let node = known
                        .iter()
                        .find(|x| x.id == peer)
                        .and_then(|x| x.numa_node);
                    // Never rank 0's CPU while there is another: the ranks would share it.
                    let peer_cpu = first_of_node(node, Some(cpu))
                        .or_else(|| allowed.iter().copied().find(|c| *c != cpu))
                        .unwrap_or(cpu);
                    peers.insert(
                        d.clone(),
                        SweepPeer {
                            device: peer,
                            cpu: peer_cpu,
                        },
                    );
                }
            }
        }
    }
    if ops.is_empty() {
        return Err(PlanError::Nothing("no operation left to measure".into()));
    }
    let host_memory = if !backend.capabilities().pinned_host_memory {
        HostMemory::Pageable.as_str().to_string()
    } else {
        match (&req.host_memory, base) {
            (Some(m), _) => m.trim().to_string(),
            (None, Some(b)) => b.host_memories.first().cloned().unwrap_or_default(),
            (None, None) => HostMemory::Pinned.as_str().to_string(),
        }
    };
    let memory = host_memory
        .parse::<HostMemory>()
        .map_err(flag("--memory"))?;
    backend
        .check_host_memory(memory)
        .map_err(|why| PlanError::HostMemoryRefused {
            memory: host_memory.clone(),
            backend: backend.name(),
            why,
        })?;
    let (warmup, iterations, repeats) = counts_from(&req.common, base)?;
    let gathers = ops.iter().any(|o| o == SWEEP_ALLGATHER);
    let timeout = pair_timeout(None, base)?;
    let plan = RunPlan {
        cpus: vec![cpu],
        pairs: peers
            .iter()
            .map(|(d, p)| format!("{d},{}", p.device))
            .collect(),
        devices,
        sizes_bytes,
        directions: ops,
        host_memories: vec![host_memory],
        warmup,
        iterations,
        repeats,
        loads: vec!["idle".into()],
        timeout_ms: gathers.then(|| timeout_ms(timeout)),
        peers,
        ..RunPlan::empty(MatrixKind::Sweep)
    };
    Ok((plan, notes))
}

/// Set up a `chd probe sweep` run: open the pair probe for the allgather points (where they
/// are asked for and can run), plan, and measure each point with a [`SweepProbe`].
pub fn prepare(req: &Request, setup: &Setup) -> Result<Prepared, SetupError> {
    let backend = setup.opened.backend.clone();
    let wants_gather = match (&req.ops, setup.base) {
        (Some(ops), _) => ops
            .iter()
            .flat_map(|o| o.split(','))
            .any(|o| o.trim() == SWEEP_ALLGATHER),
        (None, Some(b)) => b.directions.iter().any(|o| o == SWEEP_ALLGATHER),
        (None, None) => true,
    };
    let mut notes = Vec::new();
    let mut probe: Option<Arc<dyn PairProbe>> = None;
    let allgather = if !wants_gather {
        Ok(())
    } else if backend.devices().len() < 2 {
        Err(format!(
            "it needs two devices and the {} backend has {}",
            backend.name(),
            backend.devices().len()
        ))
    } else {
        match crate::runtime::select::open_pair_probe(setup.runtime, setup.opened) {
            Ok((p, opened_notes)) => {
                notes.extend(opened_notes);
                let method = p.method();
                if PairOperation::of_method(method) != PairOperation::Allgather {
                    notes.push(format!(
                        "no collective library: the allgather points are peer copies (method \
                         {method})"
                    ));
                }
                probe = Some(p);
                Ok(())
            }
            Err(e) => Err(format!("no pair probe: {}", e.detail)),
        }
    };
    let (plan, plan_notes) = plan(
        req,
        &setup.plan_context(),
        &SweepContext {
            sysfs: setup.sysfs,
            allgather,
        },
    )?;
    notes.extend(plan_notes);
    let timeout = pair_timeout(None, Some(&plan))?;
    let owned = plan.clone();
    let pairs = probe.clone();
    let measure: Measure = Box::new(move |slot: &SlotId| {
        SweepProbe {
            backend: &*backend,
            pairs: pairs.as_deref(),
            plan: &owned,
            pair_timeout: timeout,
        }
        .measure(slot)
    });
    Ok(Prepared {
        collective: probe.as_ref().map(|p| p.method()),
        pair_probe: probe,
        notes,
        ..Prepared::new(plan, measure)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_slots_give_allgather_points_only_to_devices_with_a_peer() {
        let p = RunPlan {
            cpus: vec![3],
            devices: vec!["0".into(), "1".into(), "2".into()],
            sizes_bytes: vec![1 << 20, 4 << 20],
            directions: vec!["h2d".into(), "d2d".into(), SWEEP_ALLGATHER.into()],
            host_memories: vec!["pinned".into()],
            peers: BTreeMap::from([
                (
                    "0".to_string(),
                    SweepPeer {
                        device: "2".into(),
                        cpu: 9,
                    },
                ),
                (
                    "2".to_string(),
                    SweepPeer {
                        device: "0".into(),
                        cpu: 3,
                    },
                ),
            ]),
            ..RunPlan::empty(MatrixKind::Sweep)
        };
        let slots = KIND.pass_slots(&p, "idle", 0).unwrap();
        // 2 sizes x (3 devices x 2 copy operations + 2 allgather devices).
        assert_eq!(slots.len(), 2 * (3 * 2 + 2));
        assert_eq!(KIND.cells_per_pass(&p), slots.len());
        let records: Vec<_> = slots.iter().map(|s| s.record()).collect();
        let gathers: Vec<(&str, Option<u32>)> = records
            .iter()
            .filter(|s| s.direction == SWEEP_ALLGATHER)
            .map(|s| (s.device.as_str(), s.peer_cpu))
            .collect();
        assert_eq!(
            gathers,
            [
                ("0", Some(9)),
                ("2", Some(3)),
                ("0", Some(9)),
                ("2", Some(3))
            ]
        );
        assert!(records
            .iter()
            .all(|s| (s.direction == SWEEP_ALLGATHER) == s.peer_cpu.is_some()));
    }
    use crate::format::run_dir::MatrixKind;
    use crate::runtime::{CopyParams, DeviceInfo};

    /// A backend whose copies read 1 GB/s and same-device copies 2 GB/s.
    struct Marked(Vec<DeviceInfo>);

    impl Backend for Marked {
        fn name(&self) -> &'static str {
            "marked"
        }
        fn devices(&self) -> &[DeviceInfo] {
            &self.0
        }
        fn measure_copy(&self, _: &str, p: &CopyParams) -> Result<f64, ProbeError> {
            assert_eq!(p.size_bytes, 1 << 16);
            Ok(1e9)
        }
        fn measure_device_copy(&self, _: &str, p: &DeviceCopyParams) -> Result<f64, ProbeError> {
            assert_eq!((p.size_bytes, p.warmup, p.iterations), (1 << 16, 0, 1));
            Ok(2e9)
        }
    }

    #[test]
    fn each_operation_is_measured_its_own_way_and_fails_alone() {
        let backend = Marked(vec![DeviceInfo {
            id: "0".into(),
            kind: "marked".into(),
            name: "m".into(),
            pci_bus_id: String::new(),
            numa_node: None,
        }]);
        let plan = RunPlan {
            probe: MatrixKind::Sweep,
            cpus: vec![affinity::current_cpus().unwrap()[0]],
            devices: vec!["0".into()],
            pairs: vec![],
            sizes_bytes: vec![1 << 16],
            directions: vec!["h2d".into(), SWEEP_D2D.into(), SWEEP_ALLGATHER.into()],
            host_memories: vec!["pinned".into()],
            warmup: 0,
            iterations: 1,
            repeats: 1,
            loads: vec!["idle".into()],
            ..RunPlan::empty(MatrixKind::Sweep)
        };
        let probe = SweepProbe {
            backend: &backend,
            pairs: None,
            plan: &plan,
            pair_timeout: std::time::Duration::from_secs(1),
        };
        let slots = KIND.pass_slots(&plan, "idle", 0).unwrap();
        // No peer: no allgather slot.
        assert_eq!(slots.len(), 2);
        assert_eq!(probe.measure(&slots[0]).unwrap(), 1e9, "h2d: the copy path");
        assert_eq!(
            probe.measure(&slots[1]).unwrap(),
            2e9,
            "d2d: the device copy"
        );
        let mut gather = slots[0].clone();
        if let Slot::Sweep(point) = &mut gather.cell {
            point.op = SweepOp::Allgather { peer_cpu: 0 };
        }
        assert_eq!(probe.measure(&gather).unwrap_err().reason(), "collective");
    }

    mod planning {
        use super::*;
        use crate::runtime::{CopyParams, DeviceInfo, ProbeError};
        use crate::topology::{Cpu, NumaNode, Topology};

        /// Devices 0 and 1 on NUMA node 0, device 2 on node 1.
        struct ThreeDevices(Vec<DeviceInfo>);

        impl Backend for ThreeDevices {
            fn name(&self) -> &'static str {
                "three"
            }
            fn devices(&self) -> &[DeviceInfo] {
                &self.0
            }
            fn measure_copy(&self, _: &str, _: &CopyParams) -> Result<f64, ProbeError> {
                Ok(1.0)
            }
        }

        fn backend() -> ThreeDevices {
            ThreeDevices(
                [(0, 0), (1, 0), (2, 1)]
                    .iter()
                    .map(|&(id, node)| DeviceInfo {
                        id: id.to_string(),
                        kind: "three".into(),
                        name: "d".into(),
                        pci_bus_id: String::new(),
                        numa_node: Some(node),
                    })
                    .collect(),
            )
        }

        /// CPUs 0, 1 on node 0 and 2, 3 on node 1.
        fn topology() -> Topology {
            let cpu = |id: u32| Cpu {
                id,
                numa_node: Some(id / 2),
                package: Some(id / 2),
                core: Some(id),
                siblings: vec![id],
                allowed: true,
            };
            let node = |id: u32| NumaNode {
                id,
                cpus: vec![2 * id, 2 * id + 1],
                has_memory: true,
                memory_total_bytes: None,
            };
            Topology {
                cpus: (0..4).map(cpu).collect(),
                offline_cpus: vec![],
                numa_nodes: vec![node(0), node(1)],
            }
        }

        fn planned(
            req: &Request,
            allgather: Result<(), String>,
        ) -> Result<(RunPlan, Vec<String>), PlanError> {
            let ctx = SweepContext {
                sysfs: Path::new("/nonexistent"),
                allgather,
            };
            let (topology, backend) = (topology(), backend());
            let planning = PlanContext {
                topology: &topology,
                backend: &backend,
                base: None,
            };
            plan(req, &planning, &ctx)
        }

        fn peers(plan: &RunPlan) -> Vec<(&str, &str, u32)> {
            plan.peers
                .iter()
                .map(|(d, p)| (d.as_str(), p.device.as_str(), p.cpu))
                .collect()
        }

        #[test]
        fn defaults_one_cpu_of_the_first_device_and_peers_on_their_nodes() {
            let (p, notes) = planned(&Request::default(), Ok(())).unwrap();
            assert!(notes.is_empty(), "{notes:?}");
            assert_eq!(p.cpus, [0], "the first CPU of device 0's node");
            assert_eq!(p.sizes_bytes.len(), 14, "128 KiB .. 1 GiB");
            assert_eq!(p.directions, SWEEP_OPS);
            // Rank 1 on the first CPU of the peer's node, never on rank 0's CPU.
            assert_eq!(peers(&p), [("0", "2", 2), ("1", "2", 2), ("2", "1", 1)]);
            assert_eq!(p.pairs, ["0,2", "1,2", "2,1"]);
            let req = Request {
                peer: Some("1".into()),
                cpu: Some(3),
                ..Request::default()
            };
            let (p, _) = planned(&req, Ok(())).unwrap();
            assert_eq!(p.cpus, [3]);
            assert_eq!(peers(&p), [("0", "1", 0), ("1", "2", 2), ("2", "1", 0)]);
        }

        #[test]
        fn allgather_is_skipped_with_its_reason_and_bad_flags_are_named() {
            let req = Request {
                ops: Some(vec!["h2d,allgather".into(), "h2d".into()]),
                from: Some("1MiB".into()),
                to: Some("4MiB".into()),
                ..Request::default()
            };
            let (p, notes) = planned(&req, Err("no collective library".into())).unwrap();
            assert_eq!(notes, ["allgather skipped: no collective library"]);
            assert_eq!(p.directions, ["h2d"]);
            assert!(p.peers.is_empty() && p.timeout_ms.is_none());
            assert_eq!(p.sizes_bytes, [1 << 20, 2 << 20, 4 << 20]);
            let only = Request {
                ops: Some(vec!["allgather".into()]),
                ..Request::default()
            };
            let e = planned(&only, Err("one device".into()))
                .unwrap_err()
                .to_string();
            assert_eq!(e, "nothing to measure: no operation left to measure");
            let bad = |req: Request| planned(&req, Ok(())).unwrap_err().to_string();
            let e = bad(Request {
                cpu: Some(9),
                ..Request::default()
            });
            assert!(e.starts_with("--cpu: CPU 9 is not an online CPU"), "{e}");
            let e = bad(Request {
                ops: Some(vec!["d2x".into()]),
                ..Request::default()
            });
            assert!(e.starts_with("--ops: unknown operation \"d2x\""), "{e}");
            let e = bad(Request {
                peer: Some("7".into()),
                ..Request::default()
            });
            assert!(e.starts_with("--peer: \"7\" is not a device"), "{e}");
        }
    }
}
