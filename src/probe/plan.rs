//! What every probe kind's planning shares: the flags they all take ([`Common`]: CPUs, sizes,
//! warm-up, iterations, repeats), sizes in binary units, device and load profile selections,
//! and the one rule for a resumed run: anything not given comes from the run being resumed
//! (its `run.json` plan), else the defaults, and a resumed run's plan must not change
//! ([`differences`] names the flags that would change it). Each kind's own planning is in its
//! module (`super::h2d::plan`, ...).

use std::time::Duration;

use crate::format::run_dir::RunPlan;
use crate::load::{LoadError, LoadProfile};
use crate::runtime::Backend;
use crate::topology::{CpuSelection, Topology};
use crate::vocab::size_label;

/// Defaults of every kind's `--warmup`, `--iterations` and `--repeats`, and of `--sizes`
/// where a kind has no size of its own.
pub const DEFAULT_SIZES: &str = "64MiB";
pub const DEFAULT_WARMUP: u32 = 2;
pub const DEFAULT_ITERATIONS: u32 = 10;
pub const DEFAULT_REPEATS: u32 = 3;
/// Default of `--timeout`: the longest one 2-rank cell may take.
pub const DEFAULT_PAIR_TIMEOUT: &str = "30s";

/// The planning flags every `chd probe` kind takes: `None` = not given (the default, or the
/// resumed run's value).
#[derive(Debug, Clone, Default)]
pub struct Common {
    /// CPUs; for pairs those of both ranks (the matrix is these x these); the one issuing
    /// CPU of a p2p run.
    pub cpus: Option<String>,
    /// Copy sizes (h2d, d2d), bytes per rank (pair), the one copy size (p2p).
    pub sizes: Option<Vec<String>>,
    /// Untimed operations before each sample.
    pub warmup: Option<u32>,
    /// Timed operations per sample.
    pub iterations: Option<u32>,
    /// Samples per cell (and load profile).
    pub repeats: Option<u32>,
}

/// What a kind plans against: the machine, the opened backend, and the run being resumed.
pub struct PlanContext<'a> {
    pub topology: &'a Topology,
    pub backend: &'a dyn Backend,
    /// The plan of the run being resumed, whose values stand for flags not given.
    pub base: Option<&'a RunPlan>,
}

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
    /// A run.json plan that names no valid slot (written by hand, or damaged).
    #[error("the run's plan: {0}")]
    Stored(String),
}

/// A [`PlanError::Flag`] of `flag`.
pub fn flag<E: std::fmt::Display>(flag: &'static str) -> impl Fn(E) -> PlanError {
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

/// Comma-separated values of one or more flags, trimmed, empty ones dropped.
pub fn list(values: &[String]) -> Vec<String> {
    values
        .iter()
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect()
}

/// `--sizes` as given, else the resumed run's, else `default`.
pub fn sizes_or(
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
pub fn cpus_from(
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
pub fn counts_from(common: &Common, base: Option<&RunPlan>) -> Result<(u32, u32, u32), PlanError> {
    let pick =
        |given: Option<u32>, stored: Option<u32>, default: u32| given.or(stored).unwrap_or(default);
    let warmup = pick(common.warmup, base.map(|b| b.warmup), DEFAULT_WARMUP);
    let iterations = pick(
        common.iterations,
        base.map(|b| b.iterations),
        DEFAULT_ITERATIONS,
    );
    let repeats = pick(common.repeats, base.map(|b| b.repeats), DEFAULT_REPEATS);
    if iterations == 0 || repeats == 0 {
        return Err(PlanError::ZeroCount);
    }
    Ok((warmup, iterations, repeats))
}

/// `--devices` as given (`all`, or labels), else the resumed run's, else every device; each
/// must be a device of the backend.
pub fn devices_from(
    given: Option<&str>,
    base: Option<&RunPlan>,
    backend: &dyn Backend,
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
pub fn loads_from(
    given: &[String],
    base: Option<&RunPlan>,
    backend: &dyn Backend,
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

/// A timeout as run.json's `timeout_ms` holds it.
pub fn timeout_ms(timeout: Duration) -> u64 {
    u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)
}

/// The sizes of a sweep: `from`, `2 x from`, ... up to `to` (inclusive when `to` is `from`
/// times a power of two).
pub fn doubling_sizes(from: u64, to: u64) -> Result<Vec<u64>, PlanError> {
    if from > to {
        return Err(PlanError::Flag {
            flag: "--from",
            problem: format!(
                "{} is larger than --to {}",
                size_label(from),
                size_label(to)
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

/// The flag names of each plan field for one kind, as [`differences`] reports them.
#[derive(Debug, Clone, Copy)]
pub struct FlagNames {
    pub cpus: &'static str,
    /// `None`: the pairs follow from the devices (p2p).
    pub pairs: Option<&'static str>,
    pub sizes: &'static str,
    pub directions: &'static str,
    pub host_memories: &'static str,
}

/// The plan fields where `a` and `b` differ, as the flags (`names`) that set them. The
/// timeout is not part of what is measured: a resumed run may change it.
pub fn differences(a: &RunPlan, b: &RunPlan, names: &FlagNames) -> Vec<&'static str> {
    let mut d = Vec::new();
    let mut check = |same: bool, name| {
        if !same {
            d.push(name);
        }
    };
    check(a.cpus == b.cpus, names.cpus);
    check(a.devices == b.devices, "--devices");
    if let Some(pairs) = names.pairs {
        check(a.pairs == b.pairs && a.peers == b.peers, pairs);
    }
    check(a.sizes_bytes == b.sizes_bytes, names.sizes);
    check(a.directions == b.directions, names.directions);
    check(a.host_memories == b.host_memories, names.host_memories);
    check(a.warmup == b.warmup, "--warmup");
    check(a.iterations == b.iterations, "--iterations");
    check(a.repeats == b.repeats, "--repeats");
    check(a.loads == b.loads, "--load");
    check(a.matrix_side == b.matrix_side, "--matrix-side");
    check(a.probe == b.probe, "probe kind");
    d
}

/// Slots per pass of a matrix plan: `rows` x every factor (saturating: a run.json no run
/// could finish counts `usize::MAX`).
pub fn product(rows: usize, factors: &[usize]) -> usize {
    factors.iter().fold(rows, |n, &m| n.saturating_mul(m))
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

    #[test]
    fn pair_timeout_comes_from_the_flag_the_run_or_the_default() {
        let base = RunPlan {
            timeout_ms: Some(1500),
            ..RunPlan::empty(crate::format::MatrixKind::Pair)
        };
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
}
