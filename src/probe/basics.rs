//! One slot of the basic validation table (`chd probe basics`) on the one-shot thread: bind
//! to the slot's CPU (a CPU of the device's NUMA node), then run its measurement: an SGEMM
//! loop (cuBLAS), host-to-device copies, same-device copies, or the allgather of the device's
//! pair (rank 0 on this CPU, rank 1 on the pair's other device's CPU). The binding is undone
//! before returning.
//!
//! As a probe kind ([`KIND`]): per device, from a CPU of its NUMA node, each measurement the
//! backend can make, and the allgather of each pair of consecutive devices; what it cannot
//! make at all is left out of the plan with the reason.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::h2d::bind;
use super::kind::{self, Layout, MatrixFacts, ProbeKind};
use super::plan::{
    counts_from, devices_from, flag, list, loads_from, pair_timeout, parse_size, Common, FlagNames,
    PlanContext, PlanError,
};
use super::setup::{Measure, Prepared, Setup, SetupError};
use crate::analysis::basics::Op;
use crate::format::run_dir::{MatrixKind, RunPlan};
use crate::format::slot::{BasicsSlot, PairOperation, Slot, SlotId};
use crate::runtime::gemm::{DeviceLoadError, DeviceLoader, GemmError, MatmulParams};
use crate::runtime::pair::{PairParams, PairProbe};
use crate::runtime::{Backend, DeviceCopyParams, ProbeError};
use crate::store::CellKey;
use crate::topology::Topology;
use crate::vocab::{DeviceId, DevicePair, Direction, HostMemory};

/// Defaults of `chd probe basics`: each copy and each rank's allgather buffer, and the
/// matmul's matrix side (three 4096 x 4096 f32 matrices, 192 MiB, per device).
pub const DEFAULT_BASICS_SIZE: &str = "256MiB";
pub const DEFAULT_MATRIX_SIDE: u64 = 4096;

/// What measures a basics run's slots.
pub struct BasicsProbe {
    pub backend: Arc<dyn Backend>,
    /// cuBLAS for the matmul, where it loaded.
    pub matmul: Option<DeviceLoader>,
    /// The allgather's pair probe, where one opened.
    pub pairs: Option<Arc<dyn PairProbe>>,
    pub warmup: u32,
    pub iterations: u32,
    /// Longest one allgather cell may take.
    pub pair_timeout: Duration,
}

fn gemm_error(e: GemmError) -> ProbeError {
    match e {
        GemmError::UnknownDevice(d) => ProbeError::UnknownDevice(d),
        GemmError::Device { .. } => ProbeError::Device(e.to_string()),
        e => ProbeError::Compute(e.to_string()),
    }
}

impl BasicsProbe {
    /// Measure `slot`: per second (floating-point operations for a matmul, bytes otherwise).
    pub fn measure(&self, slot: &SlotId) -> Result<f64, ProbeError> {
        let Slot::Basics(measurement) = &slot.cell else {
            return Err(ProbeError::Unsupported(format!(
                "a basics run measures no {} slot",
                slot.cell.kind().as_str()
            )));
        };
        match measurement {
            BasicsSlot::Matmul { cpu, device, side } => {
                let loader = self
                    .matmul
                    .as_ref()
                    .ok_or_else(|| ProbeError::Unsupported("cuBLAS is not loaded".into()))?;
                let n = usize::try_from(*side)
                    .map_err(|_| ProbeError::Compute(format!("matrix side {side} too big")))?;
                let _binding = bind(*cpu)?;
                loader
                    .measure_matmul(
                        device.as_str(),
                        &MatmulParams {
                            n,
                            warmup: self.warmup,
                            iterations: self.iterations,
                        },
                    )
                    .map_err(gemm_error)
            }
            BasicsSlot::H2d {
                cpu,
                device,
                size_bytes,
                host_memory,
            } => {
                let cell = CellKey {
                    cpu: *cpu,
                    device: device.to_string(),
                    size_bytes: *size_bytes,
                    direction: Direction::H2d,
                };
                // Binds to the cell's CPU itself.
                super::h2d::measure_cell(
                    &*self.backend,
                    &cell,
                    self.warmup,
                    self.iterations,
                    *host_memory,
                )
            }
            // Binds to the cell's CPU itself.
            BasicsSlot::D2d {
                cpu,
                device,
                size_bytes,
            } => super::d2d::measure_cell(
                &*self.backend,
                *cpu,
                device.as_str(),
                &DeviceCopyParams {
                    size_bytes: *size_bytes,
                    warmup: self.warmup,
                    iterations: self.iterations,
                },
            ),
            BasicsSlot::Allgather {
                cpus,
                pair,
                size_bytes,
            } => {
                let probe = self.pairs.as_deref().ok_or_else(|| {
                    ProbeError::Unsupported("no collective or peer copy opened".into())
                })?;
                let params = PairParams {
                    bytes_per_rank: *size_bytes,
                    warmup: self.warmup,
                    iterations: self.iterations,
                    timeout: self.pair_timeout,
                };
                // The pair probe binds each rank's thread itself.
                super::pairs::measure_pair(probe, pair, *cpus, &params)
            }
        }
    }
}

/// The basic validation table as a probe kind.
pub struct BasicsKind;

/// `chd probe basics` in the kind table.
pub const KIND: BasicsKind = BasicsKind;

impl ProbeKind for BasicsKind {
    fn kind(&self) -> MatrixKind {
        MatrixKind::Basics
    }

    fn layout(&self) -> Layout {
        Layout::Table
    }

    fn matrix_title(&self, m: &MatrixFacts) -> String {
        format!("Basics {}, load {}", m.direction, m.load)
    }

    /// Per device its measurements on its CPU, then the allgather of each pair (rank 0 on
    /// the first device's CPU, rank 1 on the second's). A device without a CPU has none.
    fn pass_slots(&self, plan: &RunPlan, load: &str, pass: u32) -> Result<Vec<SlotId>, String> {
        let ops: Vec<Op> = plan
            .directions
            .iter()
            .map(|d| d.parse().map_err(|e| format!("directions: {e}")))
            .collect::<Result<_, String>>()?;
        let devices = kind::device_ids(plan)?;
        let memories = kind::host_memories(plan)?;
        let cpu_of = |d: &str| plan.device_cpus.get(d).copied();
        let mut cells = Vec::new();
        for device in &devices {
            let Some(cpu) = cpu_of(device.as_str()) else {
                continue;
            };
            for op in &ops {
                match op {
                    Op::Allgather => {}
                    Op::Matmul => {
                        if let Some(side) = plan.matrix_side {
                            cells.push(BasicsSlot::Matmul {
                                cpu,
                                device: device.clone(),
                                side,
                            });
                        }
                    }
                    Op::H2d => {
                        for &size_bytes in &plan.sizes_bytes {
                            for &host_memory in &memories {
                                cells.push(BasicsSlot::H2d {
                                    cpu,
                                    device: device.clone(),
                                    size_bytes,
                                    host_memory,
                                });
                            }
                        }
                    }
                    Op::D2d => {
                        for &size_bytes in &plan.sizes_bytes {
                            cells.push(BasicsSlot::D2d {
                                cpu,
                                device: device.clone(),
                                size_bytes,
                            });
                        }
                    }
                }
            }
        }
        if ops.contains(&Op::Allgather) {
            for pair in super::pairs::plan_pairs(plan)? {
                let (Some(a), Some(b)) = (cpu_of(pair.first()), cpu_of(pair.second())) else {
                    continue;
                };
                for &size_bytes in &plan.sizes_bytes {
                    cells.push(BasicsSlot::Allgather {
                        cpus: [a, b],
                        pair: pair.clone(),
                        size_bytes,
                    });
                }
            }
        }
        Ok(cells
            .into_iter()
            .map(|cell| SlotId {
                load: load.to_string(),
                pass,
                cell: Slot::Basics(cell),
            })
            .collect())
    }

    /// Small by construction (devices x 4 measurements): counted.
    fn cells_per_pass(&self, plan: &RunPlan) -> usize {
        self.pass_slots(plan, "", 0).map_or(0, |s| s.len())
    }

    fn shape(&self, plan: &RunPlan) -> String {
        format!(
            "of {} on {} devices",
            plan.directions.join(", "),
            plan.devices.len()
        )
    }

    fn per_sample(&self) -> &'static str {
        "operations"
    }

    fn flag_names(&self) -> FlagNames {
        FlagNames {
            cpus: "--cpus",
            pairs: Some("--pair"),
            sizes: "--sizes",
            directions: "--ops",
            host_memories: "--host-memory",
        }
    }

    fn plan_facts(&self, plan: &RunPlan) -> Vec<(String, String)> {
        let mut facts = vec![("devices".to_string(), plan.devices.join(", "))];
        if !plan.pairs.is_empty() {
            facts.push(("allgather pairs".into(), plan.pairs.join("; ")));
        }
        if let Some(n) = plan.matrix_side {
            facts.push(("matmul".into(), format!("{n} x {n} f32 (SGEMM)")));
        }
        facts
    }

    fn skips_unsupported(&self) -> bool {
        true
    }

    fn failures_in(&self) -> &'static str {
        "\"Basic validation\" in summary.md"
    }
}

/// `chd probe basics` as asked: `None` (or empty) = not given.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub common: Common,
    /// Comma-separated device labels, or `all`.
    pub devices: Option<String>,
    /// Measurements (`matmul`, `h2d`, `d2d`, `allgather`) [default: all].
    pub ops: Option<Vec<String>>,
    /// Bytes of each copy and of each rank's allgather buffer.
    pub size: Option<String>,
    /// The matmul's matrix side N.
    pub matrix_side: Option<u64>,
    /// Load profiles, one run per profile.
    pub loads: Vec<String>,
}

/// The CPU that probes `device` in a basics run: the first CPU of its NUMA node this process
/// may use, else the first it may use at all.
fn device_cpu(topology: &Topology, node: Option<u32>) -> Option<u32> {
    let mut allowed = topology.allowed_cpus();
    let first = topology.allowed_cpus().next().map(|c| c.id);
    allowed
        .find(|c| node.is_some() && c.numa_node == node)
        .map(|c| c.id)
        .or(first)
}

/// The allgather pairs of a basics run: consecutive devices (`0,1`, `2,3`, ...), the last
/// device of an odd count with the one before it, so every device is in a pair.
pub fn basics_pairs(devices: &[DeviceId]) -> Vec<DevicePair> {
    let pair = |a: &DeviceId, b: &DeviceId| DevicePair::ascending(a.clone(), b.clone()).ok();
    let mut pairs: Vec<DevicePair> = devices
        .chunks_exact(2)
        .filter_map(|p| pair(&p[0], &p[1]))
        .collect();
    if devices.len() % 2 == 1 && devices.len() > 1 {
        let n = devices.len();
        pairs.extend(pair(&devices[n - 2], &devices[n - 1]));
    }
    pairs
}

/// The plan of a `chd probe basics` run: every selected device's measurements from a CPU of
/// its NUMA node, and each pair's allgather. `unavailable`: measurements this backend cannot
/// make at all, and why; they are left out of the plan and said in the report.
pub fn plan(
    req: &Request,
    ctx: &PlanContext,
    unavailable: &BTreeMap<Op, String>,
) -> Result<RunPlan, PlanError> {
    let (base, backend, topology) = (ctx.base, ctx.backend, ctx.topology);
    let devices = devices_from(req.devices.as_deref(), base, backend)?;
    let ops: Vec<Op> = match (&req.ops, base) {
        (Some(given), _) => list(given)
            .iter()
            .map(|o| o.parse::<Op>())
            .collect::<Result<_, _>>()
            .map_err(flag("--ops"))?,
        (None, Some(b)) => b
            .directions
            .iter()
            .chain(b.unavailable.keys())
            .filter_map(|o| o.parse().ok())
            .collect(),
        (None, None) => Op::ALL.to_vec(),
    };
    let mut ops: Vec<Op> = Op::ALL.into_iter().filter(|o| ops.contains(o)).collect();
    let mut gone: BTreeMap<String, String> = BTreeMap::new();
    for op in ops.clone() {
        let why = unavailable.get(&op).cloned().or_else(|| {
            (op == Op::Allgather && devices.len() < 2)
                .then(|| "a 2-rank allgather needs two devices".to_string())
        });
        if let Some(why) = why {
            ops.retain(|o| *o != op);
            gone.insert(op.as_str().to_string(), why);
        }
    }
    let sizes_bytes = match (&req.size, base) {
        (Some(s), _) => vec![parse_size(s).map_err(flag("--size"))?],
        (None, Some(b)) => b.sizes_bytes.clone(),
        (None, None) => vec![parse_size(DEFAULT_BASICS_SIZE).map_err(flag("--size"))?],
    };
    let matrix_side = req
        .matrix_side
        .or(base.and_then(|b| b.matrix_side))
        .unwrap_or(DEFAULT_MATRIX_SIDE);
    if matrix_side == 0 {
        return Err(flag("--matrix-side")("must be at least 1"));
    }
    let device_cpus: BTreeMap<String, u32> = match base {
        Some(b) if req.devices.is_none() => b.device_cpus.clone(),
        _ => devices
            .iter()
            .filter_map(|d| {
                let node = backend.devices().iter().find(|x| x.id == *d)?.numa_node;
                Some((d.clone(), device_cpu(topology, node)?))
            })
            .collect(),
    };
    let mut cpus: Vec<u32> = device_cpus.values().copied().collect();
    cpus.sort_unstable();
    cpus.dedup();
    let host_memories = vec![if !backend.capabilities().pinned_host_memory {
        HostMemory::Pageable.as_str().to_string()
    } else {
        HostMemory::Pinned.as_str().to_string()
    }];
    let (warmup, iterations, repeats) = counts_from(&req.common, base)?;
    let ids = kind::device_ids(&RunPlan {
        devices: devices.clone(),
        ..RunPlan::empty(MatrixKind::Basics)
    })
    .map_err(flag("--devices"))?;
    let plan = RunPlan {
        cpus,
        pairs: if ops.contains(&Op::Allgather) {
            basics_pairs(&ids)
                .iter()
                .map(DevicePair::to_string)
                .collect()
        } else {
            Vec::new()
        },
        devices,
        sizes_bytes,
        directions: ops.iter().map(|o| o.as_str().to_string()).collect(),
        host_memories,
        warmup,
        iterations,
        repeats,
        loads: loads_from(&req.loads, base, backend)?,
        device_cpus,
        matrix_side: Some(matrix_side),
        unavailable: gone,
        ..RunPlan::empty(MatrixKind::Basics)
    };
    if KIND.cells_per_pass(&plan) == 0 {
        return Err(PlanError::Nothing(format!(
            "{} devices and no measurement this backend can make ({})",
            plan.devices.len(),
            plan.unavailable
                .iter()
                .map(|(op, why)| format!("{op}: {why}"))
                .collect::<Vec<_>>()
                .join("; ")
        )));
    }
    Ok(plan)
}

/// Set up a `chd probe basics` run: load cuBLAS for the matmul and open the pair probe for
/// the allgather where they can be, saying why not where they cannot; plan; measure each slot
/// with a [`BasicsProbe`].
pub fn prepare(req: &Request, setup: &Setup) -> Result<Prepared, SetupError> {
    let backend = setup.opened.backend.clone();
    let mut notes = Vec::new();
    let mut unavailable = BTreeMap::new();
    let matmul = match DeviceLoader::open(setup.opened, None) {
        Ok(loader) => {
            notes.push(format!("matmul: cuBLAS from {}", loader.source()));
            Some(loader)
        }
        Err(e) => {
            let why = match e {
                DeviceLoadError::AclBackend => "the acl backend has no matmul in chd yet \
                     (cuBLAS is CUDA's; an aclnn/ACL BLAS matmul is not implemented)"
                    .to_string(),
                DeviceLoadError::NoAccelerator(b) => {
                    format!("the {b} backend has no device to multiply on")
                }
                DeviceLoadError::Cublas(e) => e.to_string(),
            };
            unavailable.insert(Op::Matmul, why);
            None
        }
    };
    let pairs = if backend.devices().len() < 2 {
        None
    } else {
        match crate::runtime::select::open_pair_probe(setup.runtime, setup.opened) {
            Ok((probe, opened_notes)) => {
                notes.extend(opened_notes);
                notes.push(format!("allgather: {}", probe.method()));
                if probe.method() != "nccl" && probe.method() != "hccl" {
                    unavailable.insert(
                        Op::Allgather,
                        format!(
                            "no collective library opened (the pair probe would measure {} \
                             instead)",
                            PairOperation::of_method(probe.method()).as_str()
                        ),
                    );
                    None
                } else {
                    Some(probe)
                }
            }
            Err(e) => {
                unavailable.insert(Op::Allgather, e.detail);
                None
            }
        }
    };
    let plan = plan(req, &setup.plan_context(), &unavailable)?;
    for (op, why) in &plan.unavailable {
        notes.push(format!("{op} not measured: {why}"));
    }
    let probe = BasicsProbe {
        backend,
        matmul,
        pairs: pairs.clone(),
        warmup: plan.warmup,
        iterations: plan.iterations,
        pair_timeout: pair_timeout(None, None)?,
    };
    let measure: Measure = Box::new(move |slot: &SlotId| probe.measure(slot));
    Ok(Prepared {
        collective: pairs.as_ref().map(|p| p.method()),
        pair_probe: pairs,
        notes,
        ..Prepared::new(plan, measure)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basics_slots_are_each_devices_measurements_on_its_cpu_and_each_pairs_allgather() {
        let mut p = RunPlan {
            devices: vec!["0".into(), "1".into(), "2".into()],
            device_cpus: BTreeMap::from([("0".into(), 0), ("1".into(), 0), ("2".into(), 1)]),
            pairs: vec!["0,1".into(), "1,2".into()],
            sizes_bytes: vec![256 << 20],
            host_memories: vec!["pinned".into()],
            matrix_side: Some(4096),
            directions: ["matmul", "h2d", "d2d", "allgather"]
                .map(String::from)
                .to_vec(),
            ..RunPlan::empty(MatrixKind::Basics)
        };
        let slots = KIND.pass_slots(&p, "idle", 0).unwrap();
        assert_eq!(slots.len(), 3 * 3 + 2);
        assert_eq!(KIND.cells_per_pass(&p), slots.len());
        let of = |device: &str, op: &str| {
            slots
                .iter()
                .map(|s| s.record())
                .find(|s| s.device == device && s.direction == op)
                .map(|s| (s.cpu, s.peer_cpu, s.size_bytes))
        };
        assert_eq!(of("2", "matmul"), Some((1, None, 4096)));
        assert_eq!(of("2", "d2d"), Some((1, None, 256 << 20)));
        assert_eq!(of("1,2", "allgather"), Some((0, Some(1), 256 << 20)));
        // Without the allgather, no pair slots; a device without a CPU has none.
        p.directions.pop();
        p.device_cpus.remove("2");
        assert_eq!(KIND.pass_slots(&p, "idle", 0).unwrap().len(), 2 * 3);
    }

    #[test]
    fn basics_pairs_are_consecutive_and_cover_an_odd_last_device() {
        let ids =
            |n: u32| -> Vec<DeviceId> { (0..n).map(|d| d.to_string().parse().unwrap()).collect() };
        let labels = |n| -> Vec<String> {
            basics_pairs(&ids(n))
                .iter()
                .map(|p| p.to_string())
                .collect()
        };
        assert_eq!(labels(4), ["0,1", "2,3"]);
        assert_eq!(labels(3), ["0,1", "1,2"]);
        assert!(labels(1).is_empty());
    }
}
