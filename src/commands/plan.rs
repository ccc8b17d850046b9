//! The plan of a `chd probe h2d`, `pair`, `d2d`, `p2p`, `sweep` or `basics` run from its flags:
//! sizes in binary units, CPU and device (or device pair) selections, load profiles; anything
//! not given comes from the run being resumed or the defaults, and a resumed run's plan must
//! not change.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use super::request::{
    BasicsRequest, D2dRequest, H2dRequest, P2pRequest, PairRequest, RunOptions, SweepRequest,
};
use chd::analysis::basics::Op;
use chd::config::CpuSelection;
use chd::format::run_dir::{MatrixKind, RunPlan, SweepPeer, SWEEP_ALLGATHER};
use chd::load::{LoadError, LoadProfile};
use chd::probe::sweep::SWEEP_OPS;
use chd::runtime;
use chd::topology::Topology;
use chd::vocab::{Direction, HostMemory};

/// Defaults of `chd probe h2d`.
pub const DEFAULT_SIZES: &str = "64MiB";
pub const DEFAULT_WARMUP: u32 = 2;
pub const DEFAULT_ITERATIONS: u32 = 10;
pub const DEFAULT_REPEATS: u32 = 3;
/// Default of `chd probe pair --timeout`: the longest one pair cell may take.
pub const DEFAULT_PAIR_TIMEOUT: &str = "30s";
/// Defaults of `chd probe sweep`: the sizes 128 KiB, 256 KiB, ... 1 GiB, every operation.
pub const DEFAULT_SWEEP_FROM: &str = "128KiB";
pub const DEFAULT_SWEEP_TO: &str = "1GiB";
/// `host_memory` of pair slots: both ranks' buffers are device memory.
pub const PAIR_MEMORY: &str = "device";
/// Default of `chd probe p2p --size`: the calibration runs' 256 MiB peer copy.
pub const DEFAULT_P2P_SIZE: &str = "256MiB";
/// `direction` of p2p slots.
pub const P2P_OPERATION: &str = "peer-copy";
/// Default of `chd probe d2d --sizes`: the size the calibration runs copied HBM to HBM.
pub const DEFAULT_D2D_SIZES: &str = "256MiB";
/// `direction` of d2d slots.
pub const D2D_DIRECTION: &str = "d2d";

/// Why the flags give no plan. Each message names the flag.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A flag's value is not usable.
    #[error("{flag}: {problem}")]
    Flag { flag: &'static str, problem: String },
    #[error("--iterations and --repeats must be at least 1")]
    ZeroCount,
    #[error("--timeout must be longer than 0")]
    ZeroTimeout,
    #[error(
        "--host-memory {memory} (runtime.host_memory): the {backend} backend refuses it: {why}"
    )]
    HostMemoryRefused {
        memory: String,
        backend: &'static str,
        why: String,
    },
    #[error("--load {0} is given twice")]
    LoadTwice(String),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("nothing to measure: {0}")]
    Nothing(String),
}

fn flag<E: std::fmt::Display>(flag: &'static str) -> impl Fn(E) -> PlanError {
    move |problem| PlanError::Flag {
        flag,
        problem: problem.to_string(),
    }
}

/// A size: a bare number is MiB; `KiB`, `MiB`, `GiB` (or `K`, `M`, `G`) suffixes are binary.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size like 64, 16MiB or 1GiB"))?;
    let shift = match unit.trim() {
        "" | "MiB" | "M" | "m" => 20,
        "KiB" | "K" | "k" => 10,
        "GiB" | "G" | "g" => 30,
        "MB" | "GB" | "KB" | "kB" => {
            return Err(format!(
                "{text:?}: sizes are binary here; write {n}{}",
                unit.replace('B', "iB").to_uppercase().replace("IB", "iB")
            ))
        }
        _ => return Err(format!("{text:?} is not a size like 64, 16MiB or 1GiB")),
    };
    let bytes = n
        .checked_shl(shift)
        .filter(|b| b >> shift == n)
        .ok_or_else(|| format!("{text:?} is too large"))?;
    if bytes == 0 {
        return Err(format!("{text:?}: a size must be at least 1 byte"));
    }
    Ok(bytes)
}

fn list(values: &[String]) -> Vec<String> {
    values
        .iter()
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect()
}

/// `--sizes` as given, else the resumed run's, else [`DEFAULT_SIZES`].
fn sizes_from(given: Option<&[String]>, base: Option<&RunPlan>) -> Result<Vec<u64>, PlanError> {
    sizes_or(given, base, DEFAULT_SIZES)
}

/// `--sizes` as given, else the resumed run's, else `default`.
fn sizes_or(
    given: Option<&[String]>,
    base: Option<&RunPlan>,
    default: &str,
) -> Result<Vec<u64>, PlanError> {
    let sizes = match (given, base) {
        (Some(s), _) => list(s)
            .iter()
            .map(|s| parse_size(s))
            .collect::<Result<Vec<u64>, _>>()
            .map_err(flag("--sizes"))?,
        (None, Some(b)) => b.sizes_bytes.clone(),
        (None, None) => vec![parse_size(default).map_err(flag("--sizes"))?],
    };
    if sizes.is_empty() {
        return Err(flag("--sizes")("no size given"));
    }
    Ok(sizes)
}

/// `--cpus` as given, else the resumed run's, else every CPU this process may use.
fn cpus_from(
    given: Option<&str>,
    base: Option<&RunPlan>,
    topology: &Topology,
) -> Result<Vec<u32>, PlanError> {
    Ok(match (given, base) {
        (Some(text), _) => CpuSelection::parse(text)
            .map_err(flag("--cpus"))?
            .resolve(topology),
        (None, Some(b)) => b.cpus.clone(),
        (None, None) => CpuSelection::All.resolve(topology),
    })
}

/// `--warmup`, `--iterations` and `--repeats` as given, else the resumed run's, else the
/// defaults; iterations and repeats must be at least 1.
fn counts_from(run: &RunOptions, base: Option<&RunPlan>) -> Result<(u32, u32, u32), PlanError> {
    let pick =
        |given: Option<u32>, stored: Option<u32>, default: u32| given.or(stored).unwrap_or(default);
    let warmup = pick(run.warmup, base.map(|b| b.warmup), DEFAULT_WARMUP);
    let iterations = pick(
        run.iterations,
        base.map(|b| b.iterations),
        DEFAULT_ITERATIONS,
    );
    let repeats = pick(run.repeats, base.map(|b| b.repeats), DEFAULT_REPEATS);
    if iterations == 0 || repeats == 0 {
        return Err(PlanError::ZeroCount);
    }
    Ok((warmup, iterations, repeats))
}

/// `--devices` as given (`all`, or labels), else the resumed run's, else every device.
fn devices_from(
    given: Option<&str>,
    base: Option<&RunPlan>,
    backend: &dyn runtime::Backend,
) -> Result<Vec<String>, PlanError> {
    let known: Vec<String> = backend.devices().iter().map(|d| d.id.clone()).collect();
    let devices = match (given, base) {
        (Some(text), _) if text.trim() == "all" => known.clone(),
        (Some(text), _) => list(&[text.to_string()]),
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
    Ok(devices)
}

/// `--load` as given, else the resumed run's, else `idle`: each profile normalised, checked
/// against the backend, and given once.
fn loads_from(
    given: &[String],
    base: Option<&RunPlan>,
    backend: &dyn runtime::Backend,
) -> Result<Vec<String>, PlanError> {
    let loads = match (given.is_empty(), base) {
        // Not split on commas: `cpu:4@0-3,8` keeps its list.
        (false, _) => given.iter().map(|l| l.trim().to_string()).collect(),
        (true, Some(b)) => b.loads.clone(),
        (true, None) => vec!["idle".into()],
    };
    let mut normalised = Vec::new();
    for l in &loads {
        let p: LoadProfile = l.parse()?;
        p.check_supported(backend.name())?;
        let name = p.to_string();
        if normalised.contains(&name) {
            return Err(PlanError::LoadTwice(name));
        }
        normalised.push(name);
    }
    Ok(normalised)
}

/// Build the plan from the request, taking anything not given from `base` (the resumed run)
/// or the defaults.
pub fn plan_from(
    req: &H2dRequest,
    base: Option<&RunPlan>,
    topology: &Topology,
    backend: &dyn runtime::Backend,
) -> Result<RunPlan, PlanError> {
    let cpus = cpus_from(req.run.cpus.as_deref(), base, topology)?;
    let devices = devices_from(req.devices.as_deref(), base, backend)?;
    let sizes_bytes = sizes_from(req.run.sizes.as_deref(), base)?;
    let directions = match (&req.directions, base) {
        (Some(d), _) => {
            let d = list(d);
            for x in &d {
                x.parse::<Direction>().map_err(flag("--directions"))?;
            }
            d
        }
        (None, Some(b)) => b.directions.clone(),
        (None, None) => vec!["h2d".into()],
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
        let memory = x.parse::<HostMemory>().map_err(flag("--host-memory"))?;
        backend
            .check_host_memory(memory)
            .map_err(|why| PlanError::HostMemoryRefused {
                memory: x.clone(),
                backend: backend.name(),
                why,
            })?;
    }
    let normalised = loads_from(&req.loads, base, backend)?;
    let (warmup, iterations, repeats) = counts_from(&req.run, base)?;
    let plan = RunPlan {
        probe: MatrixKind::H2d,
        cpus,
        devices,
        pairs: Vec::new(),
        sizes_bytes,
        directions,
        host_memories,
        warmup,
        iterations,
        repeats,
        loads: normalised,
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

/// The plan of a `chd probe d2d` run: each selected device's same-device copies, per size,
/// from one CPU of the device's NUMA node (`cpus[i]` for `devices[i]`; a resumed run keeps
/// its CPUs).
pub fn d2d_plan_from(
    req: &D2dRequest,
    base: Option<&RunPlan>,
    topology: &Topology,
    backend: &dyn runtime::Backend,
) -> Result<RunPlan, PlanError> {
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
    let sizes_bytes = sizes_or(req.run.sizes.as_deref(), base, DEFAULT_D2D_SIZES)?;
    let loads = loads_from(&req.loads, base, backend)?;
    let (warmup, iterations, repeats) = counts_from(&req.run, base)?;
    if devices.is_empty() {
        return Err(PlanError::Nothing("no device".into()));
    }
    Ok(RunPlan {
        probe: MatrixKind::D2d,
        cpus,
        devices,
        pairs: Vec::new(),
        sizes_bytes,
        directions: vec![D2D_DIRECTION.to_string()],
        host_memories: vec![PAIR_MEMORY.to_string()],
        warmup,
        iterations,
        repeats,
        loads,
        ..RunPlan::empty(MatrixKind::D2d)
    })
}

/// `--timeout` as given, else the resumed run's, else [`DEFAULT_PAIR_TIMEOUT`].
pub fn pair_timeout(given: Option<&str>, base: Option<&RunPlan>) -> Result<Duration, PlanError> {
    let timeout = match (given, base.and_then(|b| b.timeout_ms)) {
        (Some(text), _) => humantime::parse_duration(text.trim()).map_err(|e| {
            flag("--timeout")(format!("{text:?} is not a duration like 30s or 500ms: {e}"))
        })?,
        (None, Some(ms)) => Duration::from_millis(ms),
        (None, None) => humantime::parse_duration(DEFAULT_PAIR_TIMEOUT)
            .map_err(|e| flag("--timeout")(e.to_string()))?,
    };
    if timeout.is_zero() {
        return Err(PlanError::ZeroTimeout);
    }
    Ok(timeout)
}

/// The plan of a `chd probe pair` run: every selected CPU (rank 0) x every selected CPU
/// (rank 1) of each of `pairs` (resolved labels like `0,5`), per size, measured with
/// `operation` (`allgather`, or `peer-copy` without a collective library).
pub fn pair_plan_from(
    req: &PairRequest,
    base: Option<&RunPlan>,
    topology: &Topology,
    pairs: Vec<String>,
    operation: &str,
) -> Result<RunPlan, PlanError> {
    let cpus = cpus_from(req.run.cpus.as_deref(), base, topology)?;
    let timeout = pair_timeout(req.timeout.as_deref(), base)?;
    let sizes_bytes = sizes_from(req.run.sizes.as_deref(), base)?;
    let (warmup, iterations, repeats) = counts_from(&req.run, base)?;
    let plan = RunPlan {
        probe: MatrixKind::Pair,
        cpus,
        devices: Vec::new(),
        pairs,
        sizes_bytes,
        directions: vec![operation.to_string()],
        host_memories: vec![PAIR_MEMORY.to_string()],
        warmup,
        iterations,
        repeats,
        loads: vec!["idle".into()],
        timeout_ms: Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
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

/// Defaults of `chd probe basics`: each copy and each rank's allgather buffer, and the
/// matmul's matrix side (three 4096 x 4096 f32 matrices, 192 MiB, per device).
pub const DEFAULT_BASICS_SIZE: &str = "256MiB";
pub const DEFAULT_MATRIX_SIDE: u64 = 4096;

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
pub fn basics_pairs(devices: &[String]) -> Vec<String> {
    let mut pairs: Vec<String> = devices
        .chunks_exact(2)
        .map(|p| chd::probe::pairs::pair_label(&p[0], &p[1]))
        .collect();
    if devices.len() % 2 == 1 && devices.len() > 1 {
        let n = devices.len();
        pairs.push(chd::probe::pairs::pair_label(
            &devices[n - 2],
            &devices[n - 1],
        ));
    }
    pairs
}

/// The plan of a `chd probe basics` run: every selected device's measurements from a CPU of
/// its NUMA node, and each pair's allgather. `unavailable`: measurements this backend cannot
/// make at all, and why; they are left out of the plan and said in the report.
pub fn basics_plan_from(
    req: &BasicsRequest,
    base: Option<&RunPlan>,
    topology: &Topology,
    backend: &dyn runtime::Backend,
    unavailable: &BTreeMap<Op, String>,
) -> Result<RunPlan, PlanError> {
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
    let (warmup, iterations, repeats) = counts_from(&req.run, base)?;
    let plan = RunPlan {
        cpus,
        pairs: if ops.contains(&Op::Allgather) {
            basics_pairs(&devices)
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
    if plan.cells_per_pass() == 0 {
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

/// The sizes of a sweep: `from`, `2 x from`, ... up to `to` (inclusive when `to` is `from`
/// times a power of two).
pub fn doubling_sizes(from: u64, to: u64) -> Result<Vec<u64>, PlanError> {
    if from > to {
        return Err(PlanError::Flag {
            flag: "--from",
            problem: format!(
                "{} is larger than --to {}",
                chd::report::dataset::size_label(from),
                chd::report::dataset::size_label(to)
            ),
        });
    }
    let mut sizes = vec![from];
    while let Some(next) = sizes
        .last()
        .and_then(|s| s.checked_mul(2))
        .filter(|n| *n <= to)
    {
        sizes.push(next);
    }
    Ok(sizes)
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
pub fn sweep_plan_from(
    req: &SweepRequest,
    base: Option<&RunPlan>,
    topology: &Topology,
    backend: &dyn runtime::Backend,
    ctx: &SweepContext,
) -> Result<(RunPlan, Vec<String>), PlanError> {
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
                    chd::topology::cpulist::format(&allowed)
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
        match (&ctx.allgather, base) {
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
                        _ => chd::probe::pairs::farthest_peer(known, d, ctx.sysfs),
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
    let (warmup, iterations, repeats) = counts_from(&req.run, base)?;
    let gathers = ops.iter().any(|o| o == SWEEP_ALLGATHER);
    let timeout = pair_timeout(None, base)?;
    let plan = RunPlan {
        probe: MatrixKind::Sweep,
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
        timeout_ms: gathers.then(|| u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
        peers,
        ..RunPlan::empty(MatrixKind::Sweep)
    };
    Ok((plan, notes))
}

/// The plan of a `chd probe p2p` run: every ordered pair of two of the selected devices
/// (labelled `SRC>DST`, in the order the devices are given), one size, issued from one CPU.
pub fn p2p_plan_from(
    req: &P2pRequest,
    base: Option<&RunPlan>,
    topology: &Topology,
    backend: &dyn runtime::Backend,
) -> Result<RunPlan, PlanError> {
    let allowed: Vec<u32> = topology.allowed_cpus().map(|c| c.id).collect();
    let cpus = match (req.run.cpus.as_deref(), base) {
        (Some(text), _) => {
            let cpu: u32 = text
                .trim()
                .parse()
                .map_err(|_| flag("--cpu")(format!("{text:?} is not a CPU number")))?;
            if !allowed.contains(&cpu) {
                return Err(flag("--cpu")(format!(
                    "CPU {cpu} is not an online CPU this process may use ({})",
                    chd::topology::cpulist::format(&allowed)
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
    let pairs: Vec<String> = devices
        .iter()
        .flat_map(|s| {
            devices
                .iter()
                .filter(move |d| *d != s)
                .map(move |d| chd::analysis::p2p::pair_label(s, d))
        })
        .collect();
    let sizes_bytes = match (req.run.sizes.as_deref(), base) {
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
    let (warmup, iterations, repeats) = counts_from(&req.run, base)?;
    if cpus.is_empty() {
        return Err(PlanError::Nothing(
            "this process may use no online CPU".into(),
        ));
    }
    Ok(RunPlan {
        probe: MatrixKind::P2p,
        cpus,
        devices,
        pairs,
        sizes_bytes,
        directions: vec![P2P_OPERATION.to_string()],
        host_memories: vec![PAIR_MEMORY.to_string()],
        warmup,
        iterations,
        repeats,
        loads: vec!["idle".into()],
        ..RunPlan::empty(MatrixKind::P2p)
    })
}

/// The plan fields where `a` and `b` differ, as flag names.
pub fn differences(a: &RunPlan, b: &RunPlan) -> Vec<&'static str> {
    let mut d = Vec::new();
    let mut check = |same: bool, name| {
        if !same {
            d.push(name);
        }
    };
    let sweep = a.probe == MatrixKind::Sweep;
    let p2p = a.probe == MatrixKind::P2p;
    let name = |sweep_flag, other| if sweep { sweep_flag } else { other };
    check(
        a.cpus == b.cpus,
        if p2p {
            "--cpu"
        } else if a.probe == MatrixKind::D2d {
            "the devices' CPUs"
        } else {
            name("--cpu", "--cpus")
        },
    );
    check(a.devices == b.devices, "--devices");
    if !p2p {
        check(
            a.pairs == b.pairs && a.peers == b.peers,
            name("--peer", "--pair"),
        );
    }
    check(
        a.sizes_bytes == b.sizes_bytes,
        if p2p {
            "--size"
        } else {
            name("--from/--to", "--sizes")
        },
    );
    check(
        a.directions == b.directions,
        match a.probe {
            MatrixKind::Pair => "--collective",
            MatrixKind::Basics | MatrixKind::Sweep => "--ops",
            _ => "--directions",
        },
    );
    check(
        a.host_memories == b.host_memories,
        name("--memory", "--host-memory"),
    );
    check(a.warmup == b.warmup, "--warmup");
    check(a.iterations == b.iterations, "--iterations");
    check(a.repeats == b.repeats, "--repeats");
    check(a.loads == b.loads, "--load");
    check(a.matrix_side == b.matrix_side, "--matrix-side");
    check(a.probe == b.probe, "probe kind");
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_accept_bare_mib_and_binary_suffixes() {
        assert_eq!(parse_size("64"), Ok(64 << 20));
        assert_eq!(parse_size("16MiB"), Ok(16 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("512KiB"), Ok(512 << 10));
        assert_eq!(parse_size(" 4M "), Ok(4 << 20));
        assert!(parse_size("0").is_err());
        assert!(parse_size("lots").is_err());
        let e = parse_size("64MB").unwrap_err();
        assert!(e.contains("64MiB"), "{e}");
    }

    fn pair_plan() -> RunPlan {
        RunPlan {
            probe: MatrixKind::Pair,
            cpus: vec![0, 1],
            devices: vec![],
            pairs: vec!["0,1".into()],
            sizes_bytes: vec![1 << 20],
            directions: vec!["allgather".into()],
            host_memories: vec![PAIR_MEMORY.into()],
            warmup: 2,
            iterations: 10,
            repeats: 1,
            loads: vec!["idle".into()],
            timeout_ms: Some(30_000),
            ..RunPlan::empty(MatrixKind::Pair)
        }
    }

    #[test]
    fn sweep_sizes_double_from_to() {
        assert_eq!(
            doubling_sizes(128 << 10, 1 << 20).unwrap(),
            [128 << 10, 256 << 10, 512 << 10, 1 << 20]
        );
        // --to not a doubling of --from: up to the last doubling below it.
        assert_eq!(
            doubling_sizes(1 << 20, 3 << 20).unwrap(),
            [1 << 20, 2 << 20]
        );
        assert_eq!(doubling_sizes(1 << 20, 1 << 20).unwrap(), [1 << 20]);
        let e = doubling_sizes(1 << 30, 128 << 10).unwrap_err().to_string();
        assert_eq!(e, "--from: 1GiB is larger than --to 128KiB");
    }

    mod sweep {
        use super::super::*;
        use chd::runtime::{CopyParams, DeviceInfo, ProbeError};
        use chd::topology::{Cpu, NumaNode};

        /// Devices 0 and 1 on NUMA node 0, device 2 on node 1.
        struct ThreeDevices(Vec<DeviceInfo>);

        impl runtime::Backend for ThreeDevices {
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

        fn plan(
            req: &SweepRequest,
            allgather: Result<(), String>,
        ) -> Result<(RunPlan, Vec<String>), PlanError> {
            let ctx = SweepContext {
                sysfs: Path::new("/nonexistent"),
                allgather,
            };
            sweep_plan_from(req, None, &topology(), &backend(), &ctx)
        }

        fn peers(plan: &RunPlan) -> Vec<(&str, &str, u32)> {
            plan.peers
                .iter()
                .map(|(d, p)| (d.as_str(), p.device.as_str(), p.cpu))
                .collect()
        }

        #[test]
        fn defaults_one_cpu_of_the_first_device_and_peers_on_their_nodes() {
            let (p, notes) = plan(&SweepRequest::default(), Ok(())).unwrap();
            assert!(notes.is_empty(), "{notes:?}");
            assert_eq!(p.cpus, [0], "the first CPU of device 0's node");
            assert_eq!(p.sizes_bytes.len(), 14, "128 KiB .. 1 GiB");
            assert_eq!(p.directions, SWEEP_OPS);
            // Rank 1 on the first CPU of the peer's node, never on rank 0's CPU.
            assert_eq!(peers(&p), [("0", "2", 2), ("1", "2", 2), ("2", "1", 1)]);
            assert_eq!(p.pairs, ["0,2", "1,2", "2,1"]);
            let req = SweepRequest {
                peer: Some("1".into()),
                cpu: Some(3),
                ..SweepRequest::default()
            };
            let (p, _) = plan(&req, Ok(())).unwrap();
            assert_eq!(p.cpus, [3]);
            assert_eq!(peers(&p), [("0", "1", 0), ("1", "2", 2), ("2", "1", 0)]);
        }

        #[test]
        fn allgather_is_skipped_with_its_reason_and_bad_flags_are_named() {
            let req = SweepRequest {
                ops: Some(vec!["h2d,allgather".into(), "h2d".into()]),
                from: Some("1MiB".into()),
                to: Some("4MiB".into()),
                ..SweepRequest::default()
            };
            let (p, notes) = plan(&req, Err("no collective library".into())).unwrap();
            assert_eq!(notes, ["allgather skipped: no collective library"]);
            assert_eq!(p.directions, ["h2d"]);
            assert!(p.peers.is_empty() && p.timeout_ms.is_none());
            assert_eq!(p.sizes_bytes, [1 << 20, 2 << 20, 4 << 20]);
            let only = SweepRequest {
                ops: Some(vec!["allgather".into()]),
                ..SweepRequest::default()
            };
            let e = plan(&only, Err("one device".into()))
                .unwrap_err()
                .to_string();
            assert_eq!(e, "nothing to measure: no operation left to measure");
            let bad = |req: SweepRequest| plan(&req, Ok(())).unwrap_err().to_string();
            let e = bad(SweepRequest {
                cpu: Some(9),
                ..SweepRequest::default()
            });
            assert!(e.starts_with("--cpu: CPU 9 is not an online CPU"), "{e}");
            let e = bad(SweepRequest {
                ops: Some(vec!["d2x".into()]),
                ..SweepRequest::default()
            });
            assert!(e.starts_with("--ops: unknown operation \"d2x\""), "{e}");
            let e = bad(SweepRequest {
                peer: Some("7".into()),
                ..SweepRequest::default()
            });
            assert!(e.starts_with("--peer: \"7\" is not a device"), "{e}");
        }
    }

    #[test]
    fn a_device_runs_from_the_first_allowed_cpu_of_its_node() {
        use chd::topology::{Cpu, NumaNode};
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

    #[test]
    fn pair_timeout_comes_from_the_flag_the_run_or_the_default() {
        let mut base = pair_plan();
        base.timeout_ms = Some(1500);
        assert_eq!(
            pair_timeout(Some("250ms"), Some(&base)).unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(
            pair_timeout(None, Some(&base)).unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(pair_timeout(None, None).unwrap(), Duration::from_secs(30));
        assert!(pair_timeout(Some("0s"), None).is_err());
        let e = pair_timeout(Some("soon"), None).unwrap_err().to_string();
        assert!(e.starts_with("--timeout: \"soon\""), "{e}");
    }

    #[test]
    fn pair_differences_name_the_pair_flags_and_ignore_the_timeout() {
        let a = pair_plan();
        let mut b = pair_plan();
        b.pairs = vec!["0,5".into()];
        b.directions = vec!["peer-copy".into()];
        b.timeout_ms = Some(1);
        assert_eq!(differences(&a, &b), ["--pair", "--collective"]);
    }
}
