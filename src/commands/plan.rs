//! The plan of a `chd probe h2d` or `chd probe pair` run from its flags: sizes in binary
//! units, CPU and device (or device pair) selections, load profiles; anything not given comes
//! from the run being resumed or the defaults, and a resumed run's plan must not change.

use std::time::Duration;

use super::request::{H2dRequest, P2pRequest, PairRequest, RunOptions};
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
/// Default of `chd probe p2p --size`: the calibration runs' 256 MiB peer copy.
pub const DEFAULT_P2P_SIZE: &str = "256MiB";
/// `direction` of p2p slots.
pub const P2P_OPERATION: &str = "peer-copy";

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

/// `--sizes` as given, else the resumed run's, else the default.
fn sizes_from(given: Option<&[String]>, base: Option<&RunPlan>) -> Result<Vec<u64>, PlanError> {
    let sizes = match (given, base) {
        (Some(s), _) => list(s)
            .iter()
            .map(|s| parse_size(s))
            .collect::<Result<Vec<u64>, _>>()
            .map_err(flag("--sizes"))?,
        (None, Some(b)) => b.sizes_bytes.clone(),
        (None, None) => vec![parse_size(DEFAULT_SIZES).map_err(flag("--sizes"))?],
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
    let loads = match (req.loads.is_empty(), base) {
        // Not split on commas: `cpu:4@0-3,8` keeps its list.
        (false, _) => req.loads.iter().map(|l| l.trim().to_string()).collect(),
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
        timeout_ms: None,
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
    let pair = a.probe == MatrixKind::Pair;
    let p2p = a.probe == MatrixKind::P2p;
    check(a.cpus == b.cpus, if p2p { "--cpu" } else { "--cpus" });
    check(a.devices == b.devices, "--devices");
    if !p2p {
        check(a.pairs == b.pairs, "--pair");
    }
    check(
        a.sizes_bytes == b.sizes_bytes,
        if p2p { "--size" } else { "--sizes" },
    );
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
