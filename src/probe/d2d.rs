//! The same-device copy probe (HBM to HBM): bind the calling thread to exactly the cell's
//! CPU (one of the device's NUMA node, chosen by the caller), let the backend copy between
//! two buffers of the device and time it. The binding is undone before returning. The cell
//! holds nothing afterwards: both device buffers, the stream and events are freed in the
//! backend.
//!
//! As a probe kind ([`KIND`], `chd probe d2d`): per selected device and size, each device's
//! cells from one CPU of its NUMA node.

use super::h2d::bind;
use super::kind::{self, Layout, MatrixFacts, ProbeKind};
use super::plan::{
    counts_from, devices_from, loads_from, product, sizes_or, Common, FlagNames, PlanContext,
    PlanError,
};
use super::setup::{Measure, Prepared, Setup, SetupError};
use crate::format::run_dir::{MatrixKind, RunPlan};
use crate::format::slot::{D2dSlot, Slot, SlotId, DEVICE_MEMORY};
use crate::runtime::{Backend, DeviceCopyParams, ProbeError};
use crate::vocab::size_label;

/// Default of `chd probe d2d --sizes`: the size the calibration runs copied HBM to HBM.
pub const DEFAULT_D2D_SIZES: &str = "256MiB";
/// `direction` of d2d slots and plans.
pub const D2D_DIRECTION: &str = "d2d";

/// Measure one same-device copy cell of `device` from `cpu`. Returns bytes per second.
pub fn measure_cell(
    backend: &dyn Backend,
    cpu: u32,
    device: &str,
    params: &DeviceCopyParams,
) -> Result<f64, ProbeError> {
    let _binding = bind(cpu)?;
    backend.measure_device_copy(device, params)
}

/// Same-device copies as a probe kind.
pub struct D2dKind;

/// `chd probe d2d` in the kind table.
pub const KIND: D2dKind = D2dKind;

impl ProbeKind for D2dKind {
    fn kind(&self) -> MatrixKind {
        MatrixKind::D2d
    }

    fn layout(&self) -> Layout {
        Layout::Devices
    }

    fn matrix_title(&self, m: &MatrixFacts) -> String {
        format!(
            "D2D {} same-device copies, load {}",
            size_label(m.size_bytes),
            m.load
        )
    }

    /// `cpus[i]` runs `devices[i]`'s cells (a run.json with fewer CPUs than devices: only the
    /// devices with a CPU).
    fn pass_slots(&self, plan: &RunPlan, load: &str, pass: u32) -> Result<Vec<SlotId>, String> {
        let devices = kind::device_ids(plan)?;
        if plan.directions != [D2D_DIRECTION] || plan.host_memories != [DEVICE_MEMORY] {
            return Err(format!(
                "a d2d plan has the direction {D2D_DIRECTION:?} and host memory \
                 {DEVICE_MEMORY:?}, not {:?} and {:?}",
                plan.directions, plan.host_memories
            ));
        }
        let mut slots = Vec::new();
        for (device, &cpu) in devices.iter().zip(&plan.cpus) {
            for &size_bytes in &plan.sizes_bytes {
                slots.push(SlotId {
                    load: load.to_string(),
                    pass,
                    cell: Slot::D2d(D2dSlot {
                        cpu,
                        device: device.clone(),
                        size_bytes,
                    }),
                });
            }
        }
        Ok(slots)
    }

    fn cells_per_pass(&self, plan: &RunPlan) -> usize {
        product(
            plan.devices.len().min(plan.cpus.len()),
            &[plan.sizes_bytes.len()],
        )
    }

    fn shape(&self, plan: &RunPlan) -> String {
        format!(
            "on {} device{}, each from one CPU of its NUMA node ({})",
            plan.devices.len(),
            if plan.devices.len() == 1 { "" } else { "s" },
            plan.devices
                .iter()
                .zip(&plan.cpus)
                .map(|(d, c)| format!("{d}: CPU {c}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }

    fn per_sample(&self) -> &'static str {
        "copies"
    }

    fn flag_names(&self) -> FlagNames {
        FlagNames {
            cpus: "the devices' CPUs",
            pairs: Some("--pair"),
            sizes: "--sizes",
            directions: "--directions",
            host_memories: "--host-memory",
        }
    }

    fn plan_facts(&self, plan: &RunPlan) -> Vec<(String, String)> {
        let on: Vec<String> = plan
            .devices
            .iter()
            .zip(&plan.cpus)
            .map(|(d, c)| format!("{d} from CPU {c}"))
            .collect();
        vec![("devices".into(), on.join(", "))]
    }
}

/// `chd probe d2d` as asked: `None` (or empty) = not given. `common.cpus` is unused: each
/// device runs from a CPU of its own NUMA node.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub common: Common,
    /// Comma-separated device labels, or `all`.
    pub devices: Option<String>,
    /// Load profiles, one run per profile [default: the resumed run's, else `idle`].
    pub loads: Vec<String>,
}

/// The plan of a `chd probe d2d` run: each selected device's same-device copies, per size,
/// from one CPU of the device's NUMA node (`cpus[i]` for `devices[i]`; a resumed run keeps
/// its CPUs).
pub fn plan(req: &Request, ctx: &PlanContext) -> Result<RunPlan, PlanError> {
    let (base, backend, topology) = (ctx.base, ctx.backend, ctx.topology);
    let devices = devices_from(req.devices.as_deref(), base, backend)?;
    let allowed: Vec<u32> = topology.allowed_cpus().map(|c| c.id).collect();
    let cpus = match base {
        Some(b) if b.devices == devices => b.cpus.clone(),
        _ => devices
            .iter()
            .map(|d| {
                let node = backend
                    .devices()
                    .iter()
                    .find(|info| &info.id == d)
                    .and_then(|info| info.numa_node);
                topology.cpu_near(node, &allowed).ok_or_else(|| {
                    PlanError::Nothing(format!("no CPU this process may use for device {d}"))
                })
            })
            .collect::<Result<Vec<u32>, _>>()?,
    };
    let sizes_bytes = sizes_or(req.common.sizes.as_deref(), base, DEFAULT_D2D_SIZES)?;
    let loads = loads_from(&req.loads, base, backend)?;
    let (warmup, iterations, repeats) = counts_from(&req.common, base)?;
    if devices.is_empty() {
        return Err(PlanError::Nothing("no device".into()));
    }
    Ok(RunPlan {
        cpus,
        devices,
        sizes_bytes,
        directions: vec![D2D_DIRECTION.to_string()],
        host_memories: vec![DEVICE_MEMORY.to_string()],
        warmup,
        iterations,
        repeats,
        loads,
        ..RunPlan::empty(MatrixKind::D2d)
    })
}

/// Set up a `chd probe d2d` run: its plan, and each slot measured by [`measure_cell`].
pub fn prepare(req: &Request, setup: &Setup) -> Result<Prepared, SetupError> {
    let plan = plan(req, &setup.plan_context())?;
    let backend = setup.opened.backend.clone();
    let (warmup, iterations) = (plan.warmup, plan.iterations);
    let measure: Measure = Box::new(move |slot: &SlotId| {
        let Slot::D2d(s) = &slot.cell else {
            return Err(ProbeError::Unsupported(format!(
                "a d2d run measures no {} slot",
                slot.cell.kind().as_str()
            )));
        };
        let params = DeviceCopyParams {
            size_bytes: s.size_bytes,
            warmup,
            iterations,
        };
        measure_cell(&*backend, s.cpu, s.device.as_str(), &params)
    });
    Ok(Prepared::new(plan, measure))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn d2d_slots_are_one_cpu_per_device() {
        let mut p = RunPlan {
            cpus: vec![4, 4, 9],
            devices: vec!["0".into(), "1".into(), "2".into()],
            sizes_bytes: vec![1 << 20, 4 << 20],
            directions: vec![D2D_DIRECTION.into()],
            host_memories: vec![DEVICE_MEMORY.into()],
            repeats: 1,
            loads: vec!["idle".into()],
            ..RunPlan::empty(MatrixKind::D2d)
        };
        let slots = KIND.pass_slots(&p, "idle", 0).unwrap();
        assert_eq!(slots.len(), KIND.cells_per_pass(&p));
        assert_eq!(slots.len(), 3 * 2);
        let at: BTreeSet<(u32, String)> = slots
            .iter()
            .map(|s| match &s.cell {
                Slot::D2d(d) => (d.cpu, d.device.to_string()),
                other => panic!("{other:?}"),
            })
            .collect();
        let expected = [(4, "0"), (4, "1"), (9, "2")].map(|(c, d)| (c, d.to_string()));
        assert_eq!(at, BTreeSet::from(expected));
        // A run.json with fewer CPUs than devices: only the devices with a CPU.
        p.cpus = vec![4];
        assert_eq!(KIND.pass_slots(&p, "idle", 0).unwrap().len(), 2);
        assert_eq!(KIND.cells_per_pass(&p), 2);
        // The kind round-trips through run.json.
        let text = serde_json::to_string(&p).unwrap();
        assert!(text.contains("\"probe\":\"d2d\""), "{text}");
        assert_eq!(serde_json::from_str::<RunPlan>(&text).unwrap(), p);
    }

    #[test]
    fn a_device_runs_from_the_first_allowed_cpu_of_its_node() {
        use crate::topology::{Cpu, NumaNode, Topology};
        let cpu = |id, node, allowed| Cpu {
            id,
            numa_node: Some(node),
            package: Some(node),
            core: Some(id),
            siblings: vec![id],
            allowed,
        };
        let node = |id, cpus: Vec<u32>| NumaNode {
            id,
            cpus,
            has_memory: true,
            memory_total_bytes: None,
        };
        let topology = Topology {
            cpus: vec![
                cpu(0, 0, true),
                cpu(1, 0, true),
                cpu(2, 1, false),
                cpu(3, 1, true),
                cpu(4, 2, false),
            ],
            offline_cpus: vec![],
            numa_nodes: vec![node(0, vec![0, 1]), node(1, vec![2, 3]), node(2, vec![4])],
        };
        let allowed: Vec<u32> = topology.allowed_cpus().map(|c| c.id).collect();
        assert_eq!(topology.cpu_near(Some(1), &allowed), Some(3));
        assert_eq!(topology.cpu_near(Some(0), &allowed), Some(0));
        // No allowed CPU on the node, an unknown node, no node: the first allowed CPU.
        assert_eq!(topology.cpu_near(Some(2), &allowed), Some(0));
        assert_eq!(topology.cpu_near(Some(9), &allowed), Some(0));
        assert_eq!(topology.cpu_near(None, &allowed), Some(0));
        // chd serve's candidates are probe.cpus: node 1's device then runs from CPU 1.
        assert_eq!(topology.cpu_near(Some(1), &[1]), Some(1));
        assert_eq!(topology.cpu_near(None, &[]), None);
    }
}
