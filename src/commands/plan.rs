//! The plan of a `chd probe h2d`, `chd probe pair` or `chd probe d2d` run from its flags:
//! sizes in binary units, CPU and device (or device pair) selections, load profiles; anything
//! not given comes from the run being resumed or the defaults, and a resumed run's plan must
//! not change.

use std::time::Duration;

use super::request::{D2dRequest, H2dRequest, PairRequest, RunOptions};
use chd::config::CpuSelection;
use chd::format::run_dir::{MatrixKind, RunPlan};
use chd::load::{LoadError, LoadProfile};
use chd::runtime::{self, Direction, HostMemory};
use chd::topology::Topology;

/// Defaults of `chd probe h2d`.
pub const DEFAULT_SIZES: &str = "64MiB";
pub const DEFAULT_WARMUP: u32 = 2;
pub const DEFAULT_ITERATIONS: u32 = 10;
pub const DEFAULT_REPEATS: u32 = 3;
/// Default of `chd probe pair --timeout`: the longest one pair cell may take.
pub const DEFAULT_PAIR_TIMEOUT: &str = "30s";
/// `host_memory` of pair slots: both ranks' buffers are device memory.
pub const PAIR_MEMORY: &str = "device";
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
    let host_memories = if backend.name() == "host" {
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
        timeout_ms: None,
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

/// `--devices` as given (`all` or a list), else the resumed run's, else every device of
/// `backend`; each must be one of its devices.
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

/// `--load` profiles as given, else the resumed run's, else `idle`; normalised, each
/// supported by `backend` and given once.
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
        timeout_ms: None,
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

/// The plan fields where `a` and `b` differ, as flag names.
pub fn differences(a: &RunPlan, b: &RunPlan) -> Vec<&'static str> {
    let mut d = Vec::new();
    let mut check = |same: bool, name| {
        if !same {
            d.push(name);
        }
    };
    let pair = a.probe == MatrixKind::Pair;
    check(
        a.cpus == b.cpus,
        if a.probe == MatrixKind::D2d {
            "the devices' CPUs"
        } else {
            "--cpus"
        },
    );
    check(a.devices == b.devices, "--devices");
    check(a.pairs == b.pairs, "--pair");
    check(a.sizes_bytes == b.sizes_bytes, "--sizes");
    check(
        a.directions == b.directions,
        if pair { "--collective" } else { "--directions" },
    );
    check(a.host_memories == b.host_memories, "--host-memory");
    check(a.warmup == b.warmup, "--warmup");
    check(a.iterations == b.iterations, "--iterations");
    check(a.repeats == b.repeats, "--repeats");
    check(a.loads == b.loads, "--load");
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
