//! Validation: the merged [`Layer`] (raw text and numbers as TOML and flags give them) into
//! the typed [`Config`], one section at a time. Every error names its key. No value is made
//! up here: the defaults are the bottom layer (`defaults.rs`), so a key without a value is
//! one that has no default.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use super::error::{ConfigError, Problem};
use super::exposition::{cpu_series, CellExport};
use super::schema::{
    ExpositionLayer, Layer, ModelLimitsLayer, ProbeLayer, RuntimeLayer, ScheduleLayer,
};
use super::{Config, ExpositionConfig, ProbeConfig, ScheduleConfig};
use crate::exposition::server::ServerSettings;
use crate::runtime::select::RuntimeConfig;
use crate::topology::{CpuSelection, PairSelection, Roots};
use crate::vocab::Direction;

/// The most MiB one copy (`probe.sizes_mib`) may move.
const MAX_SIZE_MIB: u64 = 64 * 1024;
/// The most MiB per rank one pair allgather (`probe.pair_size_mib`) may move.
const MAX_PAIR_SIZE_MIB: u64 = 16 * 1024;
/// The most `server.max_connections`: beyond this the cap no longer bounds memory.
const MAX_CONNECTIONS: u64 = 10_000;
/// The most samples a cell may keep (`probe.samples_per_cell`).
const MAX_SAMPLES_PER_CELL: u64 = 1000;
/// The most `exposition.auto_cells_limit`: ten million cell series is past what any
/// Prometheus should take from one node, so a larger limit is a typo.
const MAX_AUTO_CELLS_LIMIT: u64 = 10_000_000;

/// The value of `key`, present in every layer merged over the defaults.
fn given<T>(key: &'static str, value: Option<T>) -> Result<T, ConfigError> {
    value.ok_or_else(|| ConfigError::invalid(key, Problem::Missing))
}

/// Parse `text` with a domain type's `FromStr`, its reason as the problem.
fn parsed<T: FromStr<Err = String>>(key: &'static str, text: &str) -> Result<T, ConfigError> {
    text.parse()
        .map_err(|why| ConfigError::invalid(key, Problem::Refused(why)))
}

/// A positive duration like `60s` or `5m`.
fn duration(key: &'static str, value: Option<String>) -> Result<Duration, ConfigError> {
    let text = given(key, value)?;
    let d = humantime::parse_duration(text.trim()).map_err(|e| {
        ConfigError::invalid(
            key,
            Problem::NotADuration {
                text: text.clone(),
                why: e.to_string(),
            },
        )
    })?;
    if d.is_zero() {
        return Err(ConfigError::invalid(key, Problem::Zero));
    }
    Ok(d)
}

/// The most windows a verdict setting may name (a day of one-minute windows and then some: a
/// larger number is a typo).
const MAX_VERDICT_WINDOWS: u64 = 10_000;

/// A count of windows in `1..=MAX_VERDICT_WINDOWS`.
fn windows(key: &'static str, value: Option<u32>) -> Result<u32, ConfigError> {
    Ok(in_range(key, given(key, value)?.into(), "", MAX_VERDICT_WINDOWS)? as u32)
}

/// The most HCCL communicators per card a config may ask for: one per other card of the
/// largest nodes, with room (a larger number is a typo).
const MAX_COMMUNICATORS_PER_CARD: u64 = 64;

/// A ratio in 0..1; `hint` says what 1 means.
fn ratio(key: &'static str, value: Option<f64>, hint: &'static str) -> Result<f64, ConfigError> {
    let v = given(key, value)?;
    if !(0.0..=1.0).contains(&v) {
        return Err(ConfigError::invalid(
            key,
            Problem::NotARatio { value: v, hint },
        ));
    }
    Ok(v)
}

/// `value` in `1..=max`, `unit` written after it in the error.
fn in_range(
    key: &'static str,
    value: u64,
    unit: &'static str,
    max: u64,
) -> Result<u64, ConfigError> {
    if value == 0 || value > max {
        return Err(ConfigError::invalid(
            key,
            Problem::OutOfRange {
                value,
                unit,
                min: 1,
                max,
            },
        ));
    }
    Ok(value)
}

impl Config {
    /// Validate a layer merged over [`Layer::defaults`].
    pub(super) fn validate(l: Layer) -> Result<Config, ConfigError> {
        let listen_text = given("server.listen", l.server.listen)?;
        let listen: SocketAddr = listen_text.parse().map_err(|_| {
            ConfigError::invalid("server.listen", Problem::NotAnAddress(listen_text))
        })?;
        let server = ServerSettings {
            max_connections: in_range(
                "server.max_connections",
                given("server.max_connections", l.server.max_connections)? as u64,
                "",
                MAX_CONNECTIONS,
            )? as usize,
            header_timeout: duration("server.header_timeout", l.server.header_timeout)?,
            // Read and checked by `chd serve` before it listens (exposition::web_settings).
            web_config_file: l.server.web_config_file,
        };
        Ok(Config {
            listen,
            replay: l.server.replay,
            server,
            roots: Roots {
                sysfs: given("paths.sysfs", l.paths.sysfs)?,
                procfs: given("paths.procfs", l.paths.procfs)?,
            },
            state_dir: given("paths.state_dir", l.paths.state_dir)?,
            nfd_features_file: l.paths.nfd_features_file,
            schedule: schedule(l.schedule)?,
            runtime: runtime(l.runtime)?,
            probe: probe(l.probe)?,
            exposition: exposition(l.exposition)?,
            collectors: l.collectors.validate()?,
            limits: limits(l.limits)?,
        })
    }
}

/// `[limits."MODEL"]`: every value a positive, finite GB/s.
fn limits(
    l: BTreeMap<String, ModelLimitsLayer>,
) -> Result<BTreeMap<String, BTreeMap<String, f64>>, ConfigError> {
    let mut out = BTreeMap::new();
    for (model, m) in l {
        let mut ops = BTreeMap::new();
        for (op, v) in [
            ("h2d", m.h2d_gbps),
            ("d2h", m.d2h_gbps),
            ("d2d", m.d2d_gbps),
        ] {
            let Some(v) = v else { continue };
            if !(v.is_finite() && v > 0.0) {
                return Err(ConfigError::invalid(
                    format!("limits.{model:?}.{op}_gbps"),
                    Problem::NotABandwidth(v),
                ));
            }
            ops.insert(op.to_string(), v);
        }
        out.insert(model, ops);
    }
    Ok(out)
}

fn schedule(l: ScheduleLayer) -> Result<ScheduleConfig, ConfigError> {
    let interval = duration("schedule.interval", l.interval)?;
    let window_budget = duration("schedule.window_budget", l.window_budget)?;
    if window_budget >= interval {
        return Err(ConfigError::invalid(
            "schedule.window_budget",
            Problem::BudgetNotShorter {
                budget: humantime::format_duration(window_budget).to_string(),
                interval: humantime::format_duration(interval).to_string(),
            },
        ));
    }
    Ok(ScheduleConfig {
        enabled: given("schedule.enabled", l.enabled)?,
        interval,
        window_budget,
        cpu_busy_threshold: ratio(
            "schedule.cpu_busy_threshold",
            l.cpu_busy_threshold,
            "1 disables the CPU gate",
        )?,
        device_busy_threshold: ratio(
            "schedule.device_busy_threshold",
            l.device_busy_threshold,
            "1 ignores utilization",
        )?,
        verdict_confirm_windows: windows(
            "schedule.verdict_confirm_windows",
            l.verdict_confirm_windows,
        )?,
        verdict_clear_windows: windows("schedule.verdict_clear_windows", l.verdict_clear_windows)?,
    })
}

fn runtime(l: RuntimeLayer) -> Result<RuntimeConfig, ConfigError> {
    Ok(RuntimeConfig {
        backend: parsed("runtime.backend", &given("runtime.backend", l.backend)?)?,
        host_memory: parsed(
            "runtime.host_memory",
            &given("runtime.host_memory", l.host_memory)?,
        )?,
        collective: parsed(
            "runtime.collective",
            &given("runtime.collective", l.collective)?,
        )?,
        cuda_runtime: l.cuda_runtime,
        acl_runtime: l.acl_runtime,
        nvml: l.nvml,
        nccl: l.nccl,
        hccl: l.hccl,
        hccl_communicators_per_card: in_range(
            "runtime.hccl_communicators_per_card",
            given(
                "runtime.hccl_communicators_per_card",
                l.hccl_communicators_per_card,
            )?
            .into(),
            "",
            MAX_COMMUNICATORS_PER_CARD,
        )? as u32,
    })
}

fn probe(l: ProbeLayer) -> Result<ProbeConfig, ConfigError> {
    let pairs = given("probe.pairs", l.pairs)?
        .iter()
        .map(|p| {
            PairSelection::parse(p).map_err(|why| {
                ConfigError::invalid("probe.pairs", Problem::Refused(why.to_string()))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let pair_size_mib = in_range(
        "probe.pair_size_mib",
        given("probe.pair_size_mib", l.pair_size_mib)?,
        " MiB",
        MAX_PAIR_SIZE_MIB,
    )?;
    let pair_timeout = duration("probe.pair_timeout", l.pair_timeout)?;
    let cell_timeout = duration("probe.cell_timeout", l.cell_timeout)?;
    // 0: no d2d cells.
    let d2d_size_mib = match given("probe.d2d_size_mib", l.d2d_size_mib)? {
        0 => 0,
        mib => in_range("probe.d2d_size_mib", mib, " MiB", MAX_SIZE_MIB)?,
    };
    // 0: no p2p cells.
    let p2p_size_mib = match given("probe.p2p_size_mib", l.p2p_size_mib)? {
        0 => 0,
        mib => in_range("probe.p2p_size_mib", mib, " MiB", MAX_SIZE_MIB)?,
    };

    let sizes_mib = given("probe.sizes_mib", l.sizes_mib)?;
    if sizes_mib.is_empty() {
        return Err(ConfigError::invalid(
            "probe.sizes_mib",
            Problem::Empty("one size"),
        ));
    }
    let mut sizes_bytes = sizes_mib
        .into_iter()
        .map(|mib| in_range("probe.sizes_mib", mib, " MiB", MAX_SIZE_MIB).map(|m| m << 20))
        .collect::<Result<Vec<_>, _>>()?;
    sizes_bytes.sort_unstable();
    sizes_bytes.dedup();

    let mut directions = given("probe.directions", l.directions)?
        .iter()
        .map(|d| parsed::<Direction>("probe.directions", d))
        .collect::<Result<Vec<_>, _>>()?;
    directions.sort();
    directions.dedup();
    if directions.is_empty() {
        return Err(ConfigError::invalid(
            "probe.directions",
            Problem::Empty("one of h2d, d2h"),
        ));
    }

    let warmup = given("probe.warmup", l.warmup)?;
    let iterations = given("probe.iterations", l.iterations)?;
    if iterations == 0 {
        return Err(ConfigError::invalid(
            "probe.iterations",
            Problem::NotAtLeastOne,
        ));
    }
    let cpus = CpuSelection::parse(&given("probe.cpus", l.cpus)?)
        .map_err(|why| ConfigError::invalid("probe.cpus", Problem::Refused(why.to_string())))?;
    let samples_per_cell = given("probe.samples_per_cell", l.samples_per_cell)?;
    in_range(
        "probe.samples_per_cell",
        samples_per_cell as u64,
        "",
        MAX_SAMPLES_PER_CELL,
    )?;
    Ok(ProbeConfig {
        sizes_bytes,
        directions,
        warmup,
        iterations,
        cpus,
        samples_per_cell,
        stale_after: duration("probe.stale_after", l.stale_after)?,
        pairs,
        pair_size_bytes: pair_size_mib << 20,
        pair_timeout,
        cell_timeout,
        d2d_size_bytes: d2d_size_mib << 20,
        p2p_size_bytes: p2p_size_mib << 20,
    })
}

fn exposition(l: ExpositionLayer) -> Result<ExpositionConfig, ConfigError> {
    let auto_cells_limit = given("exposition.auto_cells_limit", l.auto_cells_limit)?;
    in_range(
        "exposition.auto_cells_limit",
        auto_cells_limit as u64,
        " cells",
        MAX_AUTO_CELLS_LIMIT,
    )?;
    Ok(ExpositionConfig {
        cells: CellExport::validate(given("exposition.cells", l.cells)?, auto_cells_limit)?,
        auto_cells_limit,
        pair_cells: given("exposition.pair_cells", l.pair_cells)?,
        cpu_series: cpu_series(given("exposition.cpu_series", l.cpu_series)?)?,
    })
}
