//! The ordered peer copy probe as a probe kind ([`KIND`], `chd probe p2p`): every ordered pair
//! `SRC>DST` of the selected devices, one size, all issued from one bound CPU: a copy from a
//! buffer of the source into a buffer of the destination on a stream of the source
//! ([`Backend::measure_peer_copy`], which opens peer access around the copy and closes it
//! after). Each pair's PCIe path class (`PIX` ... `SYS`) is read from the sysfs PCI tree when
//! the run starts, and how its copies went (`copy`, or `copy-staged` where peer access was
//! refused) is recorded as they run.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use super::h2d::bind;
use super::kind::{self, Layout, MatrixFacts, ProbeKind};
use super::plan::{
    counts_from, flag, list, parse_size, product, Common, FlagNames, PlanContext, PlanError,
};
use super::setup::{Measure, Prepared, Setup, SetupError};
use crate::format::run_dir::{MatrixKind, RunPlan};
use crate::format::slot::{P2pSlot, PairOperation, Slot, SlotId, DEVICE_MEMORY};
use crate::runtime::{Backend, DeviceCopyParams, DeviceInfo, ProbeError};
use crate::topology::pci::sysfs_bdf;
use crate::topology::pci_path::{class_of, PathClass};
use crate::vocab::{size_label, DeviceId, OrderedPair};

/// Default of `chd probe p2p --size`: the calibration runs' 256 MiB peer copy.
pub const DEFAULT_P2P_SIZE: &str = "256MiB";

/// Measure one peer copy of `pair` from `cpu`: bytes per second, and how the copies went.
pub fn measure_cell(
    backend: &dyn Backend,
    cpu: u32,
    pair: &OrderedPair,
    params: &DeviceCopyParams,
) -> Result<crate::runtime::PeerCopy, ProbeError> {
    let _binding = bind(cpu)?;
    backend.measure_peer_copy(pair.src(), pair.dst(), params)
}

/// Every ordered pair of two different devices of `devices`, in the order they are given.
pub fn ordered_pairs(devices: &[DeviceId]) -> Vec<OrderedPair> {
    devices
        .iter()
        .flat_map(|s| {
            devices
                .iter()
                .filter_map(move |d| OrderedPair::new(s.clone(), d.clone()).ok())
        })
        .collect()
}

/// The PCIe path class of every ordered pair of `pairs`, from the sysfs PCI tree (a device
/// without a PCI function, or not in the tree, makes its pairs `unknown`).
pub fn path_classes(
    pairs: &[OrderedPair],
    devices: &[DeviceInfo],
    sysfs: &Path,
) -> BTreeMap<OrderedPair, PathClass> {
    let place = |id: &str| {
        devices
            .iter()
            .find(|d| d.id == id)
            .map(|d| (sysfs_bdf(&d.pci_bus_id), d.numa_node))
            .unwrap_or_default()
    };
    pairs
        .iter()
        .map(|pair| {
            let (a, b) = (place(pair.src()), place(pair.dst()));
            (pair.clone(), class_of(sysfs, (&a.0, a.1), (&b.0, b.1)))
        })
        .collect()
}

/// The plan's ordered pairs, or the error naming the bad one.
fn plan_pairs(plan: &RunPlan) -> Result<Vec<OrderedPair>, String> {
    plan.pairs
        .iter()
        .map(|p| p.parse().map_err(|e| format!("pairs: {e}")))
        .collect()
}

/// The ordered peer copy matrix as a probe kind.
pub struct P2pKind;

/// `chd probe p2p` in the kind table.
pub const KIND: P2pKind = P2pKind;

impl ProbeKind for P2pKind {
    fn kind(&self) -> MatrixKind {
        MatrixKind::P2p
    }

    fn layout(&self) -> Layout {
        Layout::SourceByDestination
    }

    fn matrix_title(&self, m: &MatrixFacts) -> String {
        format!(
            "P2P {} peer copies (source x destination device), load {}",
            size_label(m.size_bytes),
            m.load
        )
    }

    /// How many pairs each method measured (a pair list would be N x (N - 1) entries).
    fn methods_fact(&self, methods: &BTreeMap<String, String>) -> Option<(String, String)> {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for m in methods.values() {
            *counts.entry(m.as_str()).or_default() += 1;
        }
        if counts.is_empty() {
            return None;
        }
        let listed: Vec<String> = counts
            .iter()
            .map(|(m, n)| format!("{m}: {n} pairs"))
            .collect();
        Some(("peer copy methods".into(), listed.join("; ")))
    }

    fn pass_slots(&self, plan: &RunPlan, load: &str, pass: u32) -> Result<Vec<SlotId>, String> {
        let pairs = plan_pairs(plan)?;
        let operation = PairOperation::PeerCopy.as_str();
        if plan.directions != [operation] || plan.host_memories != [DEVICE_MEMORY] {
            return Err(format!(
                "a p2p plan has the direction {operation:?} and host memory {DEVICE_MEMORY:?}, \
                 not {:?} and {:?}",
                plan.directions, plan.host_memories
            ));
        }
        let mut slots = Vec::new();
        for &cpu in &plan.cpus {
            for &size_bytes in &plan.sizes_bytes {
                for pair in &pairs {
                    slots.push(SlotId {
                        load: load.to_string(),
                        pass,
                        cell: Slot::P2p(P2pSlot {
                            cpu,
                            pair: pair.clone(),
                            size_bytes,
                        }),
                    });
                }
            }
        }
        Ok(slots)
    }

    fn cells_per_pass(&self, plan: &RunPlan) -> usize {
        product(plan.cpus.len(), &[plan.pairs.len(), plan.sizes_bytes.len()])
    }

    fn shape(&self, plan: &RunPlan) -> String {
        format!(
            "of {} ordered pairs of devices {}, issued from CPU {}",
            plan.pairs.len(),
            plan.devices.join(","),
            crate::topology::cpulist::format(&plan.cpus)
        )
    }

    fn per_sample(&self) -> &'static str {
        "copies"
    }

    fn flag_names(&self) -> FlagNames {
        FlagNames {
            cpus: "--cpu",
            pairs: None,
            sizes: "--size",
            directions: "--directions",
            host_memories: "--host-memory",
        }
    }

    fn plan_facts(&self, plan: &RunPlan) -> Vec<(String, String)> {
        vec![
            ("devices".into(), plan.devices.join(", ")),
            ("ordered pairs".into(), plan.pairs.len().to_string()),
        ]
    }

    fn failures_in(&self) -> &'static str {
        "\"Failed pairs\" in summary.md"
    }
}

/// `chd probe p2p` as asked: `None` = not given. `common.cpus` is the one issuing CPU and
/// `common.sizes` the one copy size.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub common: Common,
    /// Comma-separated device labels, or `all`.
    pub devices: Option<String>,
}

/// The plan of a `chd probe p2p` run: every ordered pair of two of the selected devices (in
/// the order the devices are given), one size, issued from one CPU.
pub fn plan(req: &Request, ctx: &PlanContext) -> Result<RunPlan, PlanError> {
    let (base, backend) = (ctx.base, ctx.backend);
    let allowed: Vec<u32> = ctx.topology.allowed_cpus().map(|c| c.id).collect();
    let cpus = match (req.common.cpus.as_deref(), base) {
        (Some(text), _) => {
            let cpu: u32 = text
                .trim()
                .parse()
                .map_err(|_| flag("--cpu")(format!("{text:?} is not a CPU number")))?;
            if !allowed.contains(&cpu) {
                return Err(flag("--cpu")(format!(
                    "CPU {cpu} is not an online CPU this process may use ({})",
                    crate::topology::cpulist::format(&allowed)
                )));
            }
            vec![cpu]
        }
        (None, Some(b)) => b.cpus.clone(),
        (None, None) => allowed.first().copied().into_iter().collect(),
    };
    let known: Vec<String> = backend.devices().iter().map(|d| d.id.clone()).collect();
    let devices = match (&req.devices, base) {
        (Some(text), _) if text.trim() == "all" => known.clone(),
        (Some(text), _) => list(std::slice::from_ref(text)),
        (None, Some(b)) => b.devices.clone(),
        (None, None) => known.clone(),
    };
    if let Some(bad) = devices.iter().find(|d| !known.contains(d)) {
        return Err(flag("--devices")(format!(
            "{bad:?} is not a device of the {} backend ({})",
            backend.name(),
            known.join(", ")
        )));
    }
    let mut unique: Vec<String> = Vec::new();
    for d in devices {
        if unique.contains(&d) {
            return Err(flag("--devices")(format!("device {d} is given twice")));
        }
        unique.push(d);
    }
    let devices = unique;
    if devices.len() < 2 {
        return Err(PlanError::Nothing(format!(
            "a peer copy matrix needs two devices; --devices selects {}",
            devices.len()
        )));
    }
    let ids = kind::device_ids(&RunPlan {
        devices: devices.clone(),
        ..RunPlan::empty(MatrixKind::P2p)
    })
    .map_err(flag("--devices"))?;
    let sizes_bytes = match (req.common.sizes.as_deref(), base) {
        (Some(given), _) => {
            let given = list(given);
            if given.len() != 1 {
                return Err(flag("--size")("give one size"));
            }
            vec![parse_size(&given[0]).map_err(flag("--size"))?]
        }
        (None, Some(b)) => b.sizes_bytes.clone(),
        (None, None) => vec![parse_size(DEFAULT_P2P_SIZE).map_err(flag("--size"))?],
    };
    let (warmup, iterations, repeats) = counts_from(&req.common, base)?;
    if cpus.is_empty() {
        return Err(PlanError::Nothing(
            "this process may use no online CPU".into(),
        ));
    }
    Ok(RunPlan {
        cpus,
        devices,
        pairs: ordered_pairs(&ids)
            .iter()
            .map(OrderedPair::to_string)
            .collect(),
        sizes_bytes,
        directions: vec![PairOperation::PeerCopy.as_str().to_string()],
        host_memories: vec![DEVICE_MEMORY.to_string()],
        warmup,
        iterations,
        repeats,
        loads: vec!["idle".into()],
        ..RunPlan::empty(MatrixKind::P2p)
    })
}

/// Set up a `chd probe p2p` run: its plan, each pair's path class, and each slot measured by
/// [`measure_cell`], recording how each pair's copies went.
pub fn prepare(req: &Request, setup: &Setup) -> Result<Prepared, SetupError> {
    let plan = plan(req, &setup.plan_context())?;
    let backend = setup.opened.backend.clone();
    let pairs = plan_pairs(&plan).map_err(PlanError::Stored)?;
    let paths = path_classes(&pairs, backend.devices(), setup.sysfs)
        .into_iter()
        .map(|(pair, class)| (pair.to_string(), class.as_str().to_string()))
        .collect();
    let (warmup, iterations) = (plan.warmup, plan.iterations);
    let methods: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
    let recorded = methods.clone();
    let measure: Measure = Box::new(move |slot: &SlotId| {
        let Slot::P2p(s) = &slot.cell else {
            return Err(ProbeError::Unsupported(format!(
                "a p2p run measures no {} slot",
                slot.cell.kind().as_str()
            )));
        };
        let params = DeviceCopyParams {
            size_bytes: s.size_bytes,
            warmup,
            iterations,
        };
        let got = measure_cell(&*backend, s.cpu, &s.pair, &params)?;
        recorded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(s.pair.to_string(), got.method.to_string());
        Ok(got.bytes_per_second)
    });
    Ok(Prepared {
        peer_methods: Some(methods),
        p2p_paths: paths,
        ..Prepared::new(plan, measure)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p2p_slots_are_one_per_ordered_pair() {
        let ids: Vec<DeviceId> = ["0", "1"].iter().map(|d| d.parse().unwrap()).collect();
        let p = RunPlan {
            cpus: vec![0],
            devices: vec!["0".into(), "1".into()],
            pairs: ordered_pairs(&ids).iter().map(|p| p.to_string()).collect(),
            sizes_bytes: vec![1 << 20, 4 << 20],
            directions: vec!["peer-copy".into()],
            host_memories: vec![DEVICE_MEMORY.into()],
            ..RunPlan::empty(MatrixKind::P2p)
        };
        assert_eq!(p.pairs, ["0>1", "1>0"]);
        let slots = KIND.pass_slots(&p, "idle", 0).unwrap();
        assert_eq!(slots.len(), KIND.cells_per_pass(&p));
        assert_eq!(slots.len(), 2 * 2);
        assert!(slots.iter().all(|s| s.cell.cpus() == [0]));
        let line = serde_json::to_string(&slots[0]).unwrap();
        assert!(line.contains("\"matrix\":\"p2p\""), "{line}");
        assert!(line.contains("\"device\":\"0>1\""), "{line}");
    }
}
