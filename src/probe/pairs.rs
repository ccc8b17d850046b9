//! The core-pair probe as a probe kind ([`KIND`], `chd probe pair`): every selected CPU for
//! rank 0 x every selected CPU for rank 1 of each device pair, per size. Resolving the
//! configured device pairs to [`DevicePair`]s in ascending order (`0,5`); `auto` is device 0
//! with its farthest peer by PCI topology (the fewest shared bridges in the sysfs device path,
//! then another NUMA node, then the highest index). And measuring one pair slot with a pair
//! probe.

use std::collections::BTreeMap;
use std::path::Path;

use super::kind::{Layout, MatrixFacts, ProbeKind};
use super::plan::{
    counts_from, cpus_from, pair_timeout, product, sizes_or, timeout_ms, Common, FlagNames,
    PlanContext, PlanError, DEFAULT_SIZES,
};
use super::setup::{Measure, Prepared, Setup, SetupError};
use crate::format::run_dir::{MatrixKind, RunPlan};
use crate::format::slot::{PairOperation, PairSlot, Slot, SlotId, DEVICE_MEMORY};
use crate::runtime::pair::{PairParams, PairProbe};
use crate::runtime::{DeviceInfo, ProbeError};
use crate::topology::PairSelection;
use crate::vocab::{size_label, DeviceId, DevicePair};

/// The `pair` label of two devices: ascending (numerically when both are numbers).
pub fn pair_label(a: &str, b: &str) -> Result<DevicePair, String> {
    let id = |d: &str| d.parse::<DeviceId>().map_err(|e| e.to_string());
    DevicePair::ascending(id(a)?, id(b)?).map_err(|e| e.to_string())
}

/// The PCI path of a device: the components of its canonical sysfs directory.
fn pci_path(sysfs: &Path, bdf: &str) -> Vec<String> {
    if bdf.is_empty() {
        return Vec::new();
    }
    std::fs::canonicalize(sysfs.join("bus/pci/devices").join(bdf))
        .map(|p| {
            p.components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Device 0's farthest peer.
pub fn farthest_from_first(devices: &[DeviceInfo], sysfs: &Path) -> Option<String> {
    farthest_peer(devices, &devices.first()?.id, sysfs)
}

/// The farthest peer of `device` among `devices`: the fewest shared bridges in the sysfs
/// device path, then another NUMA node, then the highest index.
pub fn farthest_peer(devices: &[DeviceInfo], device: &str, sysfs: &Path) -> Option<String> {
    let me = devices.iter().find(|d| d.id == device)?;
    let home = pci_path(sysfs, &me.pci_bus_id);
    devices
        .iter()
        .enumerate()
        .filter(|(_, d)| d.id != device)
        .max_by_key(|(i, d)| {
            let path = pci_path(sysfs, &d.pci_bus_id);
            let shared = home.iter().zip(&path).take_while(|(a, b)| a == b).count();
            let other_node = d.numa_node.is_some() && d.numa_node != me.numa_node;
            (std::cmp::Reverse(shared), other_node, *i)
        })
        .map(|(_, d)| d.id.clone())
}

/// Resolve the selections to distinct pairs of existing devices.
pub fn resolve(
    selections: &[PairSelection],
    devices: &[DeviceInfo],
    sysfs: &Path,
) -> Result<Vec<DevicePair>, String> {
    let known = |d: &str| devices.iter().any(|x| x.id == d);
    let mut labels = Vec::new();
    for s in selections {
        let label = match s {
            PairSelection::Auto => {
                let peer = farthest_from_first(devices, sysfs)
                    .ok_or_else(|| "pair auto needs at least two devices".to_string())?;
                pair_label(&devices[0].id, &peer)?
            }
            PairSelection::Devices(a, b) => {
                for d in [a, b] {
                    if !known(d) {
                        return Err(format!(
                            "pair {s}: there is no device {d} (devices: {})",
                            devices
                                .iter()
                                .map(|x| x.id.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ));
                    }
                }
                pair_label(a, b).map_err(|e| format!("pair {s}: {e}"))?
            }
        };
        if !labels.contains(&label) {
            labels.push(label);
        }
    }
    Ok(labels)
}

/// How each of `pairs` is measured: the probe's method per pair (asking the runtime, for peer
/// copies, whether the devices can map each other), keyed by the pair's label.
pub fn pair_methods(probe: &dyn PairProbe, pairs: &[DevicePair]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .filter_map(|p| {
            let method = probe.pair_method([p.first(), p.second()]).ok()?;
            Some((p.to_string(), method.to_string()))
        })
        .collect()
}

/// Measure one 2-rank operation of `pair`, rank 0 bound to `cpus[0]`, rank 1 to `cpus[1]`.
pub fn measure_pair(
    probe: &dyn PairProbe,
    pair: &DevicePair,
    cpus: [u32; 2],
    params: &PairParams,
) -> Result<f64, ProbeError> {
    probe.measure([pair.first(), pair.second()], cpus, params)
}

/// The plan's pairs as typed device pairs, or the error naming the bad one.
pub(crate) fn plan_pairs(plan: &RunPlan) -> Result<Vec<DevicePair>, String> {
    plan.pairs
        .iter()
        .map(|p| p.parse().map_err(|e| format!("pairs: {e}")))
        .collect()
}

/// The core-pair matrix as a probe kind.
pub struct PairKind;

/// `chd probe pair` in the kind table.
pub const KIND: PairKind = PairKind;

impl ProbeKind for PairKind {
    fn kind(&self) -> MatrixKind {
        MatrixKind::Pair
    }

    fn layout(&self) -> Layout {
        Layout::CpuPairs
    }

    fn matrix_title(&self, m: &MatrixFacts) -> String {
        format!(
            "Pair {} {} {}, load {}",
            m.pair.unwrap_or("?"),
            m.direction,
            size_label(m.size_bytes),
            m.load
        )
    }

    fn pass_slots(&self, plan: &RunPlan, load: &str, pass: u32) -> Result<Vec<SlotId>, String> {
        let pairs = plan_pairs(plan)?;
        let operations: Vec<PairOperation> = plan
            .directions
            .iter()
            .map(|d| d.parse().map_err(|e| format!("directions: {e}")))
            .collect::<Result<_, String>>()?;
        if plan.host_memories != [DEVICE_MEMORY] {
            return Err(format!(
                "host_memories: a pair plan's buffers are {DEVICE_MEMORY:?} memory, not {:?}",
                plan.host_memories
            ));
        }
        let mut slots = Vec::new();
        for &rank0 in &plan.cpus {
            for &size_bytes in &plan.sizes_bytes {
                for &operation in &operations {
                    for &rank1 in &plan.cpus {
                        for pair in &pairs {
                            slots.push(SlotId {
                                load: load.to_string(),
                                pass,
                                cell: Slot::Pair(PairSlot {
                                    cpus: [rank0, rank1],
                                    pair: pair.clone(),
                                    size_bytes,
                                    operation,
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
                plan.pairs.len().saturating_mul(plan.cpus.len()),
                plan.sizes_bytes.len(),
                plan.directions.len(),
            ],
        )
    }

    fn shape(&self, plan: &RunPlan) -> String {
        format!(
            "on {n} x {n} CPUs (rank 0 x rank 1) of device pair{} {}",
            if plan.pairs.len() == 1 { "" } else { "s" },
            plan.pairs.join(" "),
            n = plan.cpus.len(),
        )
    }

    fn per_sample(&self) -> &'static str {
        "operations per rank"
    }

    fn flag_names(&self) -> FlagNames {
        FlagNames {
            cpus: "--cpus",
            pairs: Some("--pair"),
            sizes: "--sizes",
            directions: "--collective",
            host_memories: "--host-memory",
        }
    }

    fn plan_facts(&self, plan: &RunPlan) -> Vec<(String, String)> {
        vec![("pairs".into(), plan.pairs.join("; "))]
    }
}

/// `chd probe pair` as asked: `None` (or empty) = not given.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub common: Common,
    /// Device pairs, each `A,B` or `auto` [default: the resumed run's pairs, else `auto`].
    pub pairs: Vec<String>,
    /// Longest one cell may take, e.g. `30s`.
    pub timeout: Option<String>,
}

/// The plan of a `chd probe pair` run: every selected CPU (rank 0) x every selected CPU
/// (rank 1) of each of `pairs`, per size, measured with `operation` (the allgather, or peer
/// copies without a collective library).
pub fn plan(
    req: &Request,
    ctx: &PlanContext,
    pairs: &[DevicePair],
    operation: PairOperation,
) -> Result<RunPlan, PlanError> {
    let base = ctx.base;
    let cpus = cpus_from(req.common.cpus.as_deref(), base, ctx.topology)?;
    let timeout = pair_timeout(req.timeout.as_deref(), base)?;
    let sizes_bytes = sizes_or(req.common.sizes.as_deref(), base, DEFAULT_SIZES)?;
    let (warmup, iterations, repeats) = counts_from(&req.common, base)?;
    let plan = RunPlan {
        cpus,
        pairs: pairs.iter().map(DevicePair::to_string).collect(),
        sizes_bytes,
        directions: vec![operation.as_str().to_string()],
        host_memories: vec![DEVICE_MEMORY.to_string()],
        warmup,
        iterations,
        repeats,
        loads: vec!["idle".into()],
        timeout_ms: Some(timeout_ms(timeout)),
        ..RunPlan::empty(MatrixKind::Pair)
    };
    if plan.cpus.is_empty() {
        return Err(PlanError::Nothing(
            "--cpus selects no online CPU this process may use".into(),
        ));
    }
    if plan.pairs.is_empty() {
        return Err(PlanError::Nothing("no device pair".into()));
    }
    Ok(plan)
}

/// Set up a `chd probe pair` run: open the pair probe, resolve the pairs (the resumed run's
/// when none is given, else `auto`), plan, and measure each slot with the probe.
pub fn prepare(req: &Request, setup: &Setup) -> Result<Prepared, SetupError> {
    let (probe, mut notes) = crate::runtime::select::open_pair_probe(setup.runtime, setup.opened)
        .map_err(|e| SetupError::PairProbe(e.detail))?;
    let method = probe.method();
    let operation = PairOperation::of_method(method);
    notes.push(format!("pair probe: {method} ({})", operation.as_str()));
    let pairs = match (req.pairs.is_empty(), setup.base) {
        (true, Some(b)) => plan_pairs(b).map_err(PlanError::Stored)?,
        (none_given, _) => {
            let texts = if none_given {
                vec!["auto".to_string()]
            } else {
                req.pairs.clone()
            };
            let pair_flag = |problem: String| SetupError::Flag {
                flag: "--pair",
                problem,
            };
            let selections = texts
                .iter()
                .map(|t| PairSelection::parse(t))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| pair_flag(e.to_string()))?;
            resolve(&selections, setup.opened.backend.devices(), setup.sysfs).map_err(pair_flag)?
        }
    };
    for (pair, m) in pair_methods(&*probe, &pairs) {
        if m != method {
            notes.push(format!(
                "pair {pair}: peer access refused; its copies are staged through host memory \
                 and measured as method {m}"
            ));
        }
    }
    let plan = plan(req, &setup.plan_context(), &pairs, operation)?;
    let template = PairParams {
        bytes_per_rank: 0,
        warmup: plan.warmup,
        iterations: plan.iterations,
        timeout: pair_timeout(None, Some(&plan))?,
    };
    let measuring = probe.clone();
    let measure: Measure = Box::new(move |slot: &SlotId| {
        let Slot::Pair(s) = &slot.cell else {
            return Err(ProbeError::Unsupported(format!(
                "a pair run measures no {} slot",
                slot.cell.kind().as_str()
            )));
        };
        let params = PairParams {
            bytes_per_rank: s.size_bytes,
            ..template
        };
        measure_pair(&*measuring, &s.pair, s.cpus, &params)
    });
    Ok(Prepared {
        collective: Some(method),
        pair_probe: Some(probe),
        notes,
        ..Prepared::new(plan, measure)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(id: &str, bdf: &str, node: u32) -> DeviceInfo {
        DeviceInfo {
            id: id.into(),
            kind: "cuda".into(),
            name: "x".into(),
            pci_bus_id: bdf.into(),
            numa_node: Some(node),
        }
    }

    fn labels(pairs: Result<Vec<DevicePair>, String>) -> Result<Vec<String>, String> {
        pairs.map(|p| p.iter().map(DevicePair::to_string).collect())
    }

    #[test]
    fn labels_are_ascending() {
        assert_eq!(pair_label("5", "0").unwrap().to_string(), "0,5");
        assert_eq!(pair_label("10", "9").unwrap().to_string(), "9,10");
        assert!(pair_label("3", "3").unwrap_err().contains("twice"));
    }

    #[test]
    fn pair_slots_are_rank0_by_rank1() {
        let p = RunPlan {
            cpus: vec![0, 1],
            pairs: vec!["0,5".into()],
            sizes_bytes: vec![1 << 20, 4 << 20],
            directions: vec!["allgather".into()],
            host_memories: vec![DEVICE_MEMORY.into()],
            ..RunPlan::empty(MatrixKind::Pair)
        };
        let slots = KIND.pass_slots(&p, "idle", 0).unwrap();
        assert_eq!(slots.len(), KIND.cells_per_pass(&p));
        assert_eq!(slots.len(), 2 * 2 * 2);
        assert!(slots.iter().all(|s| matches!(
            &s.cell,
            Slot::Pair(PairSlot { pair, .. }) if pair.to_string() == "0,5"
        )));
        let mut bad = p.clone();
        bad.pairs = vec!["0;5".into()];
        let e = KIND.pass_slots(&bad, "idle", 0).unwrap_err();
        assert!(e.starts_with("pairs: \"0;5\" is not a device pair"), "{e}");
    }

    #[test]
    fn auto_picks_the_peer_behind_other_bridges() {
        let tmp = tempfile::tempdir().unwrap();
        let devices = tmp.path().join("devices");
        let links = tmp.path().join("bus/pci/devices");
        std::fs::create_dir_all(&links).unwrap();
        for (bdf, path) in [
            ("0000:1a:00.0", "pci0000:00/0000:00:01.0/0000:1a:00.0"),
            ("0000:1b:00.0", "pci0000:00/0000:00:01.0/0000:1b:00.0"),
            ("0000:9c:00.0", "pci0000:80/0000:80:01.0/0000:9c:00.0"),
            ("0000:1c:00.0", "pci0000:00/0000:00:02.0/0000:1c:00.0"),
        ] {
            std::fs::create_dir_all(devices.join(path)).unwrap();
            std::os::unix::fs::symlink(devices.join(path), links.join(bdf)).unwrap();
        }
        let list = vec![
            dev("0", "0000:1a:00.0", 0),
            dev("1", "0000:1b:00.0", 0),
            dev("2", "0000:9c:00.0", 1),
            dev("3", "0000:1c:00.0", 0),
        ];
        assert_eq!(farthest_from_first(&list, tmp.path()).as_deref(), Some("2"));
        // Device 2's farthest: every other device is behind the other host bridge and on
        // the other node; the highest index wins.
        assert_eq!(farthest_peer(&list, "2", tmp.path()).as_deref(), Some("3"));
        assert_eq!(farthest_peer(&list, "1", tmp.path()).as_deref(), Some("2"));
        assert_eq!(farthest_peer(&list, "9", tmp.path()), None);
        assert_eq!(
            labels(resolve(
                &[
                    PairSelection::Auto,
                    PairSelection::Devices("2".into(), "0".into())
                ],
                &list,
                tmp.path()
            )),
            Ok(vec!["0,2".to_string()])
        );
    }

    #[test]
    fn unknown_devices_are_named() {
        let list = vec![dev("0", "", 0), dev("1", "", 0)];
        let err = resolve(
            &[PairSelection::Devices("0".into(), "7".into())],
            &list,
            Path::new("/nonexistent"),
        )
        .unwrap_err();
        assert!(err.contains("no device 7"), "{err}");
        // Without PCI paths auto still pairs device 0 with another device.
        assert_eq!(
            labels(resolve(
                &[PairSelection::Auto],
                &list,
                Path::new("/nonexistent")
            )),
            Ok(vec!["0,1".into()])
        );
    }

    fn pair_plan() -> RunPlan {
        RunPlan {
            probe: MatrixKind::Pair,
            cpus: vec![0, 1],
            devices: vec![],
            pairs: vec!["0,1".into()],
            sizes_bytes: vec![1 << 20],
            directions: vec!["allgather".into()],
            host_memories: vec![DEVICE_MEMORY.into()],
            warmup: 2,
            iterations: 10,
            repeats: 1,
            loads: vec!["idle".into()],
            timeout_ms: Some(30_000),
            ..RunPlan::empty(MatrixKind::Pair)
        }
    }

    #[test]
    fn pair_differences_name_the_pair_flags_and_ignore_the_timeout() {
        let a = pair_plan();
        let mut b = pair_plan();
        b.pairs = vec!["0,5".into()];
        b.directions = vec!["peer-copy".into()];
        b.timeout_ms = Some(1);
        assert_eq!(
            crate::probe::plan::differences(&a, &b, &KIND.flag_names()),
            ["--pair", "--collective"]
        );
    }
}
