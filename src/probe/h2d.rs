//! The core x device copy probe: bind the calling thread to exactly the cell's CPU (verified
//! by read-back: a bind that did not land is an error cell, never a cell measured on the
//! wrong core), then let the backend allocate on this thread and time the copies. The
//! binding is undone before returning.
//!
//! A [`CellGroup`] does the same for a run of cells that share a CPU and a size: one binding
//! and one first-touched (pinned) host buffer serve every device of the run in turn, so the
//! buffer is pinned once per group instead of once per cell (the seed's batch order).
//!
//! As a probe kind ([`KIND`], `chd probe h2d`): the plan of a one-shot run from its
//! [`Request`], its slots (every CPU x device x size x direction x host memory kind), and
//! the measurement of one slot.

use super::kind::{self, Layout, MatrixFacts, ProbeKind};
use super::plan::{
    counts_from, cpus_from, devices_from, flag, list, loads_from, product, sizes_or, Common,
    FlagNames, PlanContext, PlanError, DEFAULT_SIZES,
};
use super::setup::{Measure, Prepared, Setup, SetupError};
use crate::affinity::{self, Binding};
use crate::format::run_dir::{MatrixKind, RunPlan};
use crate::format::slot::{CopySlot, Slot, SlotId};
use crate::runtime::{Backend, CopyParams, HostStaging, ProbeError};
use crate::store::CellKey;
use crate::vocab::{size_label, Direction, HostMemory};

/// Bind the calling thread to exactly `cpu` (verified), as a [`ProbeError::Bind`] if not.
pub(crate) fn bind(cpu: u32) -> Result<Binding, ProbeError> {
    affinity::bind_exactly(cpu).map_err(|e| ProbeError::Bind {
        cpu,
        detail: e.to_string(),
    })
}

fn params(cell: &CellKey, warmup: u32, iterations: u32, host_memory: HostMemory) -> CopyParams {
    CopyParams {
        size_bytes: cell.size_bytes,
        direction: cell.direction,
        warmup,
        iterations,
        host_memory,
    }
}

/// Measure one cell on the calling thread. Returns bytes per second.
pub fn measure_cell(
    backend: &dyn Backend,
    cell: &CellKey,
    warmup: u32,
    iterations: u32,
    host_memory: HostMemory,
) -> Result<f64, ProbeError> {
    let _binding = bind(cell.cpu)?;
    backend.measure_copy(&cell.device, &params(cell, warmup, iterations, host_memory))
}

/// The calling thread bound to one CPU with one host buffer of one size, for the cells of
/// that CPU and size on every device. Dropping it frees the buffer, then restores the
/// thread's affinity.
pub struct CellGroup<'a> {
    // Declared first, so it is freed while the thread is still bound.
    staging: Box<dyn HostStaging + 'a>,
    _binding: Binding,
    cpu: u32,
    size_bytes: u64,
}

impl<'a> CellGroup<'a> {
    /// Bind to `cell`'s CPU and allocate (and first-touch) the host buffer for its size there.
    pub fn open(
        backend: &'a dyn Backend,
        cell: &CellKey,
        host_memory: HostMemory,
    ) -> Result<CellGroup<'a>, ProbeError> {
        let binding = bind(cell.cpu)?;
        let staging = backend.staging(&params(cell, 0, 1, host_memory))?;
        Ok(CellGroup {
            staging,
            _binding: binding,
            cpu: cell.cpu,
            size_bytes: cell.size_bytes,
        })
    }

    /// Whether `cell` belongs to this group (same CPU and size).
    pub fn serves(&self, cell: &CellKey) -> bool {
        cell.cpu == self.cpu && cell.size_bytes == self.size_bytes
    }

    /// Measure one cell of the group. Returns bytes per second.
    pub fn measure(
        &mut self,
        cell: &CellKey,
        warmup: u32,
        iterations: u32,
        host_memory: HostMemory,
    ) -> Result<f64, ProbeError> {
        if !self.serves(cell) {
            return Err(ProbeError::Bind {
                cpu: cell.cpu,
                detail: format!(
                    "a cell of cpu {} on the probe thread bound to cpu {} with a {}-byte buffer",
                    cell.cpu, self.cpu, self.size_bytes
                ),
            });
        }
        self.staging
            .measure(&cell.device, &params(cell, warmup, iterations, host_memory))
    }

    /// Pinned host bytes the group holds.
    pub fn pinned_bytes(&self) -> u64 {
        self.staging.pinned_bytes()
    }
}

/// The core x device copy matrix as a probe kind (`chd probe h2d`): every planned CPU x
/// device x size x direction x host memory kind.
pub struct H2dKind;

/// `chd probe h2d` in the kind table.
pub const KIND: H2dKind = H2dKind;

impl ProbeKind for H2dKind {
    fn kind(&self) -> MatrixKind {
        MatrixKind::H2d
    }

    fn layout(&self) -> Layout {
        Layout::CpuByDevice
    }

    fn matrix_title(&self, m: &MatrixFacts) -> String {
        format!(
            "H2D {} {}, {} memory, load {}",
            size_label(m.size_bytes),
            m.direction,
            m.host_memory,
            m.load
        )
    }

    fn pass_slots(&self, plan: &RunPlan, load: &str, pass: u32) -> Result<Vec<SlotId>, String> {
        let devices = kind::device_ids(plan)?;
        let memories = kind::host_memories(plan)?;
        let directions: Vec<Direction> = plan
            .directions
            .iter()
            .map(|d| d.parse().map_err(|e| format!("directions: {e}")))
            .collect::<Result<_, String>>()?;
        let mut slots = Vec::new();
        for &cpu in &plan.cpus {
            for &size_bytes in &plan.sizes_bytes {
                for &direction in &directions {
                    for &host_memory in &memories {
                        for device in &devices {
                            slots.push(SlotId {
                                load: load.to_string(),
                                pass,
                                cell: Slot::H2d(CopySlot {
                                    cpu,
                                    device: device.clone(),
                                    size_bytes,
                                    direction,
                                    host_memory,
                                }),
                            });
                        }
                    }
                }
            }
        }
        Ok(slots)
    }

    fn cells_per_pass(&self, plan: &RunPlan) -> usize {
        product(
            plan.cpus.len(),
            &[
                plan.devices.len(),
                plan.sizes_bytes.len(),
                plan.directions.len(),
                plan.host_memories.len(),
            ],
        )
    }

    fn shape(&self, plan: &RunPlan) -> String {
        format!(
            "on {} CPUs and {} devices",
            plan.cpus.len(),
            plan.devices.len()
        )
    }

    fn per_sample(&self) -> &'static str {
        "copies"
    }

    fn flag_names(&self) -> FlagNames {
        FlagNames {
            cpus: "--cpus",
            pairs: Some("--pair"),
            sizes: "--sizes",
            directions: "--directions",
            host_memories: "--host-memory",
        }
    }

    fn plan_facts(&self, plan: &RunPlan) -> Vec<(String, String)> {
        vec![("devices".into(), plan.devices.join(", "))]
    }

    fn copies_over_link(&self) -> bool {
        true
    }
}

/// `chd probe h2d` as asked: `None` (or empty) = not given (the default, or the resumed
/// run's value).
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub common: Common,
    /// Comma-separated device labels, or `all`.
    pub devices: Option<String>,
    /// `h2d`, `d2h`.
    pub directions: Option<Vec<String>>,
    /// Comma-separated host memory kinds.
    pub host_memory: Option<String>,
    /// Load profiles, one run per profile [default: the resumed run's, else `idle`].
    pub loads: Vec<String>,
}

/// The plan of a `chd probe h2d` run, taking anything not given from the resumed run or the
/// defaults.
pub fn plan(req: &Request, ctx: &PlanContext) -> Result<RunPlan, PlanError> {
    let (base, backend) = (ctx.base, ctx.backend);
    let cpus = cpus_from(req.common.cpus.as_deref(), base, ctx.topology)?;
    let devices = devices_from(req.devices.as_deref(), base, backend)?;
    let sizes_bytes = sizes_or(req.common.sizes.as_deref(), base, DEFAULT_SIZES)?;
    let directions = match (&req.directions, base) {
        (Some(d), _) => {
            let d = list(d);
            for x in &d {
                x.parse::<Direction>().map_err(flag("--directions"))?;
            }
            d
        }
        (None, Some(b)) => b.directions.clone(),
        (None, None) => vec![Direction::H2d.as_str().into()],
    };
    let host_memories = if !backend.capabilities().pinned_host_memory {
        // The host backend copies between ordinary memory only.
        vec![HostMemory::Pageable.as_str().to_string()]
    } else {
        match (&req.host_memory, base) {
            (Some(m), _) => {
                let m = list(std::slice::from_ref(m));
                for x in &m {
                    x.parse::<HostMemory>().map_err(flag("--host-memory"))?;
                }
                m
            }
            (None, Some(b)) => b.host_memories.clone(),
            (None, None) => vec![HostMemory::Pinned.as_str().to_string()],
        }
    };
    for x in &host_memories {
        check_host_memory(backend, x)?;
    }
    let loads = loads_from(&req.loads, base, backend)?;
    let (warmup, iterations, repeats) = counts_from(&req.common, base)?;
    let plan = RunPlan {
        cpus,
        devices,
        sizes_bytes,
        directions,
        host_memories,
        warmup,
        iterations,
        repeats,
        loads,
        ..RunPlan::empty(MatrixKind::H2d)
    };
    if plan.cpus.is_empty() || plan.devices.is_empty() {
        return Err(PlanError::Nothing(format!(
            "{} CPUs x {} devices",
            plan.cpus.len(),
            plan.devices.len()
        )));
    }
    Ok(plan)
}

/// `memory` parsed and accepted by the backend, as a [`PlanError`] naming `--host-memory` if
/// not.
pub(crate) fn check_host_memory(
    backend: &dyn Backend,
    memory: &str,
) -> Result<HostMemory, PlanError> {
    let parsed = memory
        .parse::<HostMemory>()
        .map_err(flag("--host-memory"))?;
    backend
        .check_host_memory(parsed)
        .map_err(|why| PlanError::HostMemoryRefused {
            memory: memory.to_string(),
            backend: backend.name(),
            why,
        })?;
    Ok(parsed)
}

/// Set up a `chd probe h2d` run: its plan, and each slot measured by [`measure_cell`].
pub fn prepare(req: &Request, setup: &Setup) -> Result<Prepared, SetupError> {
    let plan = plan(req, &setup.plan_context())?;
    let backend = setup.opened.backend.clone();
    let (warmup, iterations) = (plan.warmup, plan.iterations);
    let measure: Measure = Box::new(move |slot: &SlotId| {
        let Slot::H2d(s) = &slot.cell else {
            return Err(ProbeError::Unsupported(format!(
                "an h2d run measures no {} slot",
                slot.cell.kind().as_str()
            )));
        };
        let cell = CellKey {
            cpu: s.cpu,
            device: s.device.to_string(),
            size_bytes: s.size_bytes,
            direction: s.direction,
        };
        measure_cell(&*backend, &cell, warmup, iterations, s.host_memory)
    });
    Ok(Prepared::new(plan, measure))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn plan() -> RunPlan {
        RunPlan {
            cpus: vec![0, 1],
            devices: vec!["0".into(), "1".into(), "2".into()],
            sizes_bytes: vec![1 << 20, 4 << 20],
            directions: vec!["h2d".into()],
            host_memories: vec!["pinned".into()],
            warmup: 1,
            iterations: 2,
            repeats: 3,
            loads: vec!["idle".into(), "cpu:2".into()],
            ..RunPlan::empty(MatrixKind::H2d)
        }
    }

    #[test]
    fn slots_cover_the_plan_once() {
        let p = plan();
        let mut all = BTreeSet::new();
        for l in &p.loads {
            for pass in 0..p.repeats {
                all.extend(KIND.pass_slots(&p, l, pass).unwrap());
            }
        }
        assert_eq!(KIND.cells_per_pass(&p), 12);
        assert_eq!(all.len(), crate::probe::kinds::total_slots(&p));
        assert_eq!(all.len(), 72);
        // A plan that names no valid slot is an error naming the field.
        let mut bad = plan();
        bad.directions = vec!["sideways".into()];
        let e = KIND.pass_slots(&bad, "idle", 0).unwrap_err();
        assert!(
            e.starts_with("directions: unknown direction \"sideways\""),
            "{e}"
        );
    }

    /// A run.json whose plan counts more slots than a usize holds (an input of the run_dir
    /// fuzz target's properties; `chd report` counts them): the count saturates.
    #[test]
    fn slot_counts_saturate() {
        let mut p = plan();
        p.cpus = (0..50).collect();
        p.devices = (0..50).map(|d| d.to_string()).collect();
        p.sizes_bytes = (1..=50).collect();
        p.directions = vec!["h2d".into(); 50];
        p.host_memories = vec!["pinned".into(); 50];
        p.repeats = u32::MAX;
        p.loads = vec!["idle".into(); 20];
        assert_eq!(KIND.cells_per_pass(&p), 50usize.pow(5));
        assert_eq!(crate::probe::kinds::total_slots(&p), usize::MAX);
    }
    use crate::runtime::host::HostBackend;
    use crate::topology::{Cpu, NumaNode, Topology};

    fn backend() -> HostBackend {
        HostBackend::new(&Topology {
            cpus: vec![Cpu {
                id: 0,
                numa_node: Some(0),
                package: Some(0),
                core: Some(0),
                siblings: vec![0],
                allowed: true,
            }],
            offline_cpus: vec![],
            numa_nodes: vec![NumaNode {
                id: 0,
                cpus: vec![0],
                has_memory: true,
                memory_total_bytes: None,
            }],
        })
    }

    fn cell(cpu: u32, size_bytes: u64) -> CellKey {
        CellKey {
            cpu,
            device: "numa0".into(),
            size_bytes,
            direction: Direction::H2d,
        }
    }

    #[test]
    fn a_group_binds_once_and_serves_only_its_cpu_and_size() {
        let backend = backend();
        let before = affinity::current_cpus().unwrap();
        let cpu = before[0];
        let mut group = CellGroup::open(&backend, &cell(cpu, 1 << 16), HostMemory::Pageable)
            .expect("bind and allocate");
        assert_eq!(affinity::current_cpus().unwrap(), vec![cpu]);
        for _ in 0..3 {
            assert!(group
                .measure(&cell(cpu, 1 << 16), 0, 1, HostMemory::Pageable)
                .is_ok());
        }
        let err = group
            .measure(&cell(cpu, 1 << 17), 0, 1, HostMemory::Pageable)
            .unwrap_err();
        assert_eq!(err.reason(), "bind", "{err}");
        let err = group
            .measure(&cell(cpu + 1, 1 << 16), 0, 1, HostMemory::Pageable)
            .unwrap_err();
        assert_eq!(err.reason(), "bind", "{err}");
        assert_eq!(group.pinned_bytes(), 0);
        drop(group);
        assert_eq!(
            affinity::current_cpus().unwrap(),
            before,
            "binding restored"
        );
    }
}
