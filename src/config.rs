//! Configuration: the TOML file layer, the command-line layer (same shape), and the validated
//! [`Config`] that the rest of chd sees. Layers merge as defaults < file < flags; validation
//! names the offending key (`schedule.interval: ...`), and unknown keys are errors.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::collect::CollectorSettings;
use crate::runtime::select::RuntimeConfig;
use crate::runtime::Direction;
use crate::topology::{cpulist, Roots};

/// Default port: registered for chd in the exporter port allocation style (9863).
pub const DEFAULT_LISTEN: &str = "0.0.0.0:9863";
/// Default state directory; `./chd-state` is used when it is not writable.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/chd";
/// Fallback state directory, relative to the working directory.
pub const FALLBACK_STATE_DIR: &str = "chd-state";

/// A configuration error that names the key and the problem.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("{key}: {problem}")]
    Invalid { key: &'static str, problem: String },
}

fn invalid(key: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        problem: problem.into(),
    }
}

/// One configuration layer as written in TOML (or built from flags). Every key optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Layer {
    #[serde(default, skip_serializing_if = "ServerLayer::is_empty")]
    pub server: ServerLayer,
    #[serde(default, skip_serializing_if = "PathsLayer::is_empty")]
    pub paths: PathsLayer,
    #[serde(default, skip_serializing_if = "RuntimeLayer::is_empty")]
    pub runtime: RuntimeLayer,
    #[serde(default, skip_serializing_if = "ScheduleLayer::is_empty")]
    pub schedule: ScheduleLayer,
    #[serde(default, skip_serializing_if = "ProbeLayer::is_empty")]
    pub probe: ProbeLayer,
    #[serde(default, skip_serializing_if = "ExpositionLayer::is_empty")]
    pub exposition: ExpositionLayer,
    #[serde(default, skip_serializing_if = "CollectorsLayer::is_empty")]
    pub collectors: CollectorsLayer,
}

/// `[collectors]`: scrape-time collectors and what they cover.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollectorsLayer {
    pub rdma: Option<bool>,
    pub numa: Option<bool>,
    pub netdev: Option<bool>,
    pub pcie: Option<bool>,
    /// Accelerator utilization and memory (NVML / ACL).
    pub device: Option<bool>,
    /// Every netdev of /proc/net/dev, not only those behind RDMA ports.
    pub netdev_all: Option<bool>,
    /// Regexes (unanchored search) over HCA names (`mlx5_0`).
    pub hca_include: Option<String>,
    pub hca_exclude: Option<String>,
    /// Regexes over netdev names.
    pub netdev_include: Option<String>,
    pub netdev_exclude: Option<String>,
}

/// `[server]`
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerLayer {
    /// Address to serve `/metrics` on.
    pub listen: Option<String>,
    /// Serve this recorded matrix instead of probing.
    pub replay: Option<PathBuf>,
}

/// `[paths]`
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathsLayer {
    pub sysfs: Option<PathBuf>,
    pub procfs: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
}

/// `[runtime]`
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeLayer {
    /// `auto`, `cuda`, `acl`, `host`.
    pub backend: Option<String>,
    /// libcudart to load instead of the standard sonames.
    pub cuda_runtime: Option<PathBuf>,
    /// libascendcl to load instead of the standard soname.
    pub acl_runtime: Option<PathBuf>,
    /// libnvidia-ml to load instead of libnvidia-ml.so.1.
    pub nvml: Option<PathBuf>,
    /// Host side of accelerator copies: `pinned` or `pageable`.
    pub host_memory: Option<String>,
    /// Pair probe transport: `auto`, `nccl`, `hccl`, `copy`.
    pub collective: Option<String>,
    /// libnccl to load instead of libnccl.so / libnccl.so.2.
    pub nccl: Option<PathBuf>,
    /// libhccl to load instead of libhccl.so.
    pub hccl: Option<PathBuf>,
}

/// `[schedule]`
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleLayer {
    /// Whether probe windows run at all.
    pub enabled: Option<bool>,
    /// Time between scheduler ticks, e.g. `60s`.
    pub interval: Option<String>,
    /// Probing time a window may spend, e.g. `2s`.
    pub window_budget: Option<String>,
    /// Other processes' CPU utilization (0..1) above which a window is skipped or stopped.
    pub cpu_busy_threshold: Option<f64>,
    /// Device utilization (0..1) above which a window is skipped or stopped.
    pub device_busy_threshold: Option<f64>,
}

/// `[probe]`
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeLayer {
    /// Copy sizes in MiB.
    pub sizes_mib: Option<Vec<u64>>,
    /// `h2d`, `d2h`.
    pub directions: Option<Vec<String>>,
    /// Untimed copies before timing a cell.
    pub warmup: Option<u32>,
    /// Timed copies per sample.
    pub iterations: Option<u32>,
    /// `all` (every CPU this process may use) or a cpulist such as `0-79,160`.
    pub cpus: Option<String>,
    /// Samples a cell keeps; its value is their median.
    pub samples_per_cell: Option<usize>,
    /// Age after which a cell counts as stale, e.g. `24h`.
    pub stale_after: Option<String>,
    /// Device pairs for the core-pair probe: `"0,5"`, or `"auto"` (device 0 and its
    /// farthest peer by PCI topology).
    pub pairs: Option<Vec<String>>,
    /// Bytes per rank of one pair allgather, MiB.
    pub pair_size_mib: Option<u64>,
    /// Longest one pair cell may take before it is aborted, e.g. `30s`.
    pub pair_timeout: Option<String>,
}

/// `[exposition]`
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpositionLayer {
    /// Export every H2D cell (`chd_h2d_bandwidth_bytes_per_second`).
    pub cells: Option<bool>,
    /// Export every pair cell (off by default: 409,600 series at 640 CPUs).
    pub pair_cells: Option<bool>,
}

macro_rules! layer_merge {
    ($ty:ident { $($field:ident),* }) => {
        impl $ty {
            fn is_empty(&self) -> bool {
                true $(&& self.$field.is_none())*
            }
            fn merge(self, over: $ty) -> $ty {
                $ty { $($field: over.$field.or(self.$field)),* }
            }
        }
    };
}
layer_merge!(ServerLayer { listen, replay });
layer_merge!(PathsLayer {
    sysfs,
    procfs,
    state_dir
});
layer_merge!(RuntimeLayer {
    backend,
    cuda_runtime,
    acl_runtime,
    nvml,
    host_memory,
    collective,
    nccl,
    hccl
});
layer_merge!(ScheduleLayer {
    enabled,
    interval,
    window_budget,
    cpu_busy_threshold,
    device_busy_threshold
});
layer_merge!(ProbeLayer {
    sizes_mib,
    directions,
    warmup,
    iterations,
    cpus,
    samples_per_cell,
    stale_after,
    pairs,
    pair_size_mib,
    pair_timeout
});
layer_merge!(ExpositionLayer { cells, pair_cells });
layer_merge!(CollectorsLayer {
    rdma,
    numa,
    netdev,
    pcie,
    device,
    netdev_all,
    hca_include,
    hca_exclude,
    netdev_include,
    netdev_exclude
});

impl Layer {
    /// Parse a TOML layer; errors carry the file name and toml's key/line context.
    pub fn from_toml(path: &Path, text: &str) -> Result<Layer, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Syntax {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().to_string(),
        })
    }

    /// Read and parse a TOML config file.
    pub fn from_file(path: &Path) -> Result<Layer, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Layer::from_toml(path, &text)
    }

    /// `over` wins wherever it sets a key.
    pub fn merge(self, over: Layer) -> Layer {
        Layer {
            server: self.server.merge(over.server),
            paths: self.paths.merge(over.paths),
            runtime: self.runtime.merge(over.runtime),
            schedule: self.schedule.merge(over.schedule),
            probe: self.probe.merge(over.probe),
            exposition: self.exposition.merge(over.exposition),
            collectors: self.collectors.merge(over.collectors),
        }
    }

    /// The built-in defaults as a layer (what `--print-config` shows for unset keys).
    pub fn defaults() -> Layer {
        Layer {
            server: ServerLayer {
                listen: Some(DEFAULT_LISTEN.into()),
                replay: None,
            },
            paths: PathsLayer {
                sysfs: Some("/sys".into()),
                procfs: Some("/proc".into()),
                state_dir: Some(DEFAULT_STATE_DIR.into()),
            },
            runtime: RuntimeLayer {
                backend: Some("auto".into()),
                cuda_runtime: None,
                acl_runtime: None,
                nvml: None,
                host_memory: Some("pinned".into()),
                collective: Some("auto".into()),
                nccl: None,
                hccl: None,
            },
            schedule: ScheduleLayer {
                enabled: Some(true),
                interval: Some("60s".into()),
                window_budget: Some("2s".into()),
                cpu_busy_threshold: Some(0.5),
                device_busy_threshold: Some(0.1),
            },
            probe: ProbeLayer {
                sizes_mib: Some(vec![64]),
                directions: Some(vec!["h2d".into()]),
                warmup: Some(1),
                iterations: Some(4),
                cpus: Some("all".into()),
                samples_per_cell: Some(5),
                stale_after: Some("24h".into()),
                pairs: Some(vec![]),
                pair_size_mib: Some(64),
                pair_timeout: Some("30s".into()),
            },
            exposition: ExpositionLayer {
                cells: Some(true),
                pair_cells: Some(false),
            },
            collectors: CollectorsLayer {
                rdma: Some(true),
                numa: Some(true),
                netdev: Some(true),
                pcie: Some(true),
                device: Some(true),
                netdev_all: Some(false),
                hca_include: None,
                hca_exclude: None,
                netdev_include: None,
                netdev_exclude: None,
            },
        }
    }
}

/// Which CPUs to probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CpuSelection {
    /// Every online CPU this process may use.
    All,
    /// Exactly these (intersected with the online CPUs at run time).
    List(Vec<u32>),
    /// Up to N allowed CPUs of every NUMA node, evenly spread over the node (`per-node:N`).
    PerNode(usize),
}

impl CpuSelection {
    /// Parse `all`, `per-node:N` or a cpulist such as `0-79,160`.
    pub fn parse(text: &str) -> Result<CpuSelection, String> {
        let text = text.trim();
        if text == "all" || text == "auto" {
            return Ok(CpuSelection::All);
        }
        if let Some(n) = text.strip_prefix("per-node:") {
            return match n.parse::<usize>() {
                Ok(n) if n > 0 => Ok(CpuSelection::PerNode(n)),
                _ => Err(format!(
                    "{text:?}: per-node:N needs a count N of at least 1"
                )),
            };
        }
        let ids = cpulist::parse(text).map_err(|e| e.to_string())?;
        if ids.is_empty() {
            return Err("selects no CPU".into());
        }
        Ok(CpuSelection::List(ids))
    }

    /// The CPUs this selects on `topology`, ascending.
    pub fn resolve(&self, topology: &crate::topology::Topology) -> Vec<u32> {
        match self {
            CpuSelection::All => topology.allowed_cpus().map(|c| c.id).collect(),
            CpuSelection::List(ids) => ids
                .iter()
                .copied()
                .filter(|id| topology.cpu(*id).is_some())
                .collect(),
            CpuSelection::PerNode(n) => {
                let mut picked = Vec::new();
                let mut by_node: std::collections::BTreeMap<Option<u32>, Vec<u32>> =
                    std::collections::BTreeMap::new();
                for cpu in topology.allowed_cpus() {
                    by_node.entry(cpu.numa_node).or_default().push(cpu.id);
                }
                for cpus in by_node.values() {
                    let take = (*n).min(cpus.len());
                    picked.extend((0..take).map(|i| cpus[i * cpus.len() / take]));
                }
                picked.sort_unstable();
                picked
            }
        }
    }
}

impl std::fmt::Display for CpuSelection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CpuSelection::All => f.write_str("all"),
            CpuSelection::List(ids) => f.write_str(&cpulist::format(ids)),
            CpuSelection::PerNode(n) => write!(f, "per-node:{n}"),
        }
    }
}

/// The validated configuration. Nothing past this point sees an unvalidated value.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub listen: SocketAddr,
    /// A recording to serve instead of probing.
    pub replay: Option<PathBuf>,
    pub roots: Roots,
    pub state_dir: PathBuf,
    pub runtime: RuntimeConfig,
    pub schedule: ScheduleConfig,
    pub probe: ProbeConfig,
    pub exposition: ExpositionConfig,
    pub collectors: CollectorSettings,
    /// The device telemetry collector.
    pub device_collector: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleConfig {
    pub enabled: bool,
    pub interval: Duration,
    pub window_budget: Duration,
    pub cpu_busy_threshold: f64,
    pub device_busy_threshold: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ProbeConfig {
    pub sizes_bytes: Vec<u64>,
    pub directions: Vec<Direction>,
    pub warmup: u32,
    pub iterations: u32,
    pub cpus: CpuSelection,
    pub samples_per_cell: usize,
    pub stale_after: Duration,
    pub pairs: Vec<PairSelection>,
    pub pair_size_bytes: u64,
    pub pair_timeout: Duration,
}

/// A device pair of the core-pair probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PairSelection {
    /// Device 0 and its farthest peer by PCI topology.
    Auto,
    /// Two device labels, as the runtime numbers them.
    Devices(String, String),
}

impl PairSelection {
    /// Parse `auto` or `A,B` (two different device labels).
    pub fn parse(text: &str) -> Result<PairSelection, String> {
        let text = text.trim();
        if text == "auto" {
            return Ok(PairSelection::Auto);
        }
        match text.split(',').map(str::trim).collect::<Vec<_>>()[..] {
            [a, b] if !a.is_empty() && !b.is_empty() && a != b => {
                Ok(PairSelection::Devices(a.to_string(), b.to_string()))
            }
            _ => Err(format!(
                "{text:?} is not a pair like \"0,5\" (two different devices) or \"auto\""
            )),
        }
    }
}

impl std::fmt::Display for PairSelection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PairSelection::Auto => f.write_str("auto"),
            PairSelection::Devices(a, b) => write!(f, "{a},{b}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ExpositionConfig {
    pub cells: bool,
    pub pair_cells: bool,
}

fn duration(key: &'static str, text: &str) -> Result<Duration, ConfigError> {
    let d = humantime::parse_duration(text.trim()).map_err(|e| {
        invalid(
            key,
            format!("{text:?} is not a duration like 60s or 5m ({e})"),
        )
    })?;
    if d.is_zero() {
        return Err(invalid(key, "must be greater than zero"));
    }
    Ok(d)
}

impl Config {
    /// Merge `layers` (later wins) over the defaults and validate.
    pub fn resolve(layers: impl IntoIterator<Item = Layer>) -> Result<Config, ConfigError> {
        let merged = layers
            .into_iter()
            .fold(Layer::defaults(), |acc, l| acc.merge(l));
        Config::validate(merged)
    }

    fn validate(l: Layer) -> Result<Config, ConfigError> {
        // Every key is Some after merging over the defaults.
        let listen_text = l.server.listen.unwrap_or_default();
        let listen: SocketAddr = listen_text.parse().map_err(|_| {
            invalid(
                "server.listen",
                format!("{listen_text:?} is not an address like 0.0.0.0:9863 or [::1]:9863"),
            )
        })?;

        let interval = duration(
            "schedule.interval",
            &l.schedule.interval.unwrap_or_default(),
        )?;
        let window_budget = duration(
            "schedule.window_budget",
            &l.schedule.window_budget.unwrap_or_default(),
        )?;
        if window_budget >= interval {
            return Err(invalid(
                "schedule.window_budget",
                format!(
                    "{} must be shorter than schedule.interval ({})",
                    humantime::format_duration(window_budget),
                    humantime::format_duration(interval)
                ),
            ));
        }
        let cpu_busy_threshold = l.schedule.cpu_busy_threshold.unwrap_or(0.5);
        if !(0.0..=1.0).contains(&cpu_busy_threshold) {
            return Err(invalid(
                "schedule.cpu_busy_threshold",
                format!("{cpu_busy_threshold} is not a ratio in 0..1 (1 disables the CPU gate)"),
            ));
        }

        let device_busy_threshold = l.schedule.device_busy_threshold.unwrap_or(0.1);
        if !(0.0..=1.0).contains(&device_busy_threshold) {
            return Err(invalid(
                "schedule.device_busy_threshold",
                format!("{device_busy_threshold} is not a ratio in 0..1 (1 ignores utilization)"),
            ));
        }
        let runtime = RuntimeConfig {
            backend: l
                .runtime
                .backend
                .unwrap_or_default()
                .parse()
                .map_err(|e| invalid("runtime.backend", e))?,
            host_memory: l
                .runtime
                .host_memory
                .unwrap_or_default()
                .parse()
                .map_err(|e| invalid("runtime.host_memory", e))?,
            collective: l
                .runtime
                .collective
                .unwrap_or_default()
                .parse()
                .map_err(|e| invalid("runtime.collective", e))?,
            cuda_runtime: l.runtime.cuda_runtime,
            acl_runtime: l.runtime.acl_runtime,
            nvml: l.runtime.nvml,
            nccl: l.runtime.nccl,
            hccl: l.runtime.hccl,
        };
        let pairs = l
            .probe
            .pairs
            .unwrap_or_default()
            .iter()
            .map(|p| PairSelection::parse(p).map_err(|e| invalid("probe.pairs", e)))
            .collect::<Result<Vec<_>, _>>()?;
        let pair_size_mib = l.probe.pair_size_mib.unwrap_or(64);
        if pair_size_mib == 0 || pair_size_mib > 16 * 1024 {
            return Err(invalid(
                "probe.pair_size_mib",
                format!("{pair_size_mib} MiB is outside 1..=16384"),
            ));
        }
        let pair_timeout = duration(
            "probe.pair_timeout",
            &l.probe.pair_timeout.unwrap_or_default(),
        )?;
        let sizes_mib = l.probe.sizes_mib.unwrap_or_default();
        if sizes_mib.is_empty() {
            return Err(invalid("probe.sizes_mib", "needs at least one size"));
        }
        let mut sizes_bytes = Vec::with_capacity(sizes_mib.len());
        for mib in sizes_mib {
            if mib == 0 || mib > 64 * 1024 {
                return Err(invalid(
                    "probe.sizes_mib",
                    format!("{mib} MiB is outside 1..=65536"),
                ));
            }
            sizes_bytes.push(mib << 20);
        }
        sizes_bytes.sort_unstable();
        sizes_bytes.dedup();

        let mut directions = Vec::new();
        for d in l.probe.directions.unwrap_or_default() {
            directions.push(
                d.parse::<Direction>()
                    .map_err(|e| invalid("probe.directions", e))?,
            );
        }
        directions.sort();
        directions.dedup();
        if directions.is_empty() {
            return Err(invalid(
                "probe.directions",
                "needs at least one of h2d, d2h",
            ));
        }

        let warmup = l.probe.warmup.unwrap_or(1);
        let iterations = l.probe.iterations.unwrap_or(4);
        if iterations == 0 {
            return Err(invalid("probe.iterations", "must be at least 1"));
        }
        let cpus_text = l.probe.cpus.unwrap_or_default();
        let cpus = CpuSelection::parse(&cpus_text).map_err(|e| invalid("probe.cpus", e))?;
        let samples_per_cell = l.probe.samples_per_cell.unwrap_or(5);
        if !(1..=1000).contains(&samples_per_cell) {
            return Err(invalid(
                "probe.samples_per_cell",
                format!("{samples_per_cell} is outside 1..=1000"),
            ));
        }
        let stale_after = duration(
            "probe.stale_after",
            &l.probe.stale_after.unwrap_or_default(),
        )?;

        let regex = |key: &'static str, text: Option<String>| {
            text.map(|t| {
                regex::Regex::new(&t).map_err(|e| {
                    let why = e.to_string();
                    let why = why
                        .lines()
                        .last()
                        .unwrap_or_default()
                        .trim_start_matches("error: ");
                    invalid(key, format!("{t:?} is not a regex ({why})"))
                })
            })
            .transpose()
        };
        let c = l.collectors;
        let collectors = CollectorSettings {
            rdma: c.rdma.unwrap_or(true),
            numa: c.numa.unwrap_or(true),
            netdev: c.netdev.unwrap_or(true),
            pcie: c.pcie.unwrap_or(true),
            netdev_all: c.netdev_all.unwrap_or(false),
            hca_include: regex("collectors.hca_include", c.hca_include)?,
            hca_exclude: regex("collectors.hca_exclude", c.hca_exclude)?,
            netdev_include: regex("collectors.netdev_include", c.netdev_include)?,
            netdev_exclude: regex("collectors.netdev_exclude", c.netdev_exclude)?,
        };
        Ok(Config {
            listen,
            replay: l.server.replay,
            roots: Roots {
                sysfs: l.paths.sysfs.unwrap_or_default(),
                procfs: l.paths.procfs.unwrap_or_default(),
            },
            state_dir: l.paths.state_dir.unwrap_or_default(),
            runtime,
            schedule: ScheduleConfig {
                enabled: l.schedule.enabled.unwrap_or(true),
                interval,
                window_budget,
                cpu_busy_threshold,
                device_busy_threshold,
            },
            probe: ProbeConfig {
                sizes_bytes,
                directions,
                warmup,
                iterations,
                cpus,
                samples_per_cell,
                stale_after,
                pairs,
                pair_size_bytes: pair_size_mib << 20,
                pair_timeout,
            },
            exposition: ExpositionConfig {
                cells: l.exposition.cells.unwrap_or(true),
                pair_cells: l.exposition.pair_cells.unwrap_or(false),
            },
            collectors,
            device_collector: c.device.unwrap_or(true),
        })
    }

    /// The effective configuration as a complete TOML layer (for `--print-config`).
    pub fn to_layer(&self) -> Layer {
        Layer {
            server: ServerLayer {
                listen: Some(self.listen.to_string()),
                replay: self.replay.clone(),
            },
            paths: PathsLayer {
                sysfs: Some(self.roots.sysfs.clone()),
                procfs: Some(self.roots.procfs.clone()),
                state_dir: Some(self.state_dir.clone()),
            },
            runtime: RuntimeLayer {
                backend: Some(self.runtime.backend.as_str().into()),
                cuda_runtime: self.runtime.cuda_runtime.clone(),
                acl_runtime: self.runtime.acl_runtime.clone(),
                nvml: self.runtime.nvml.clone(),
                host_memory: Some(self.runtime.host_memory.as_str().into()),
                collective: Some(self.runtime.collective.as_str().into()),
                nccl: self.runtime.nccl.clone(),
                hccl: self.runtime.hccl.clone(),
            },
            schedule: ScheduleLayer {
                enabled: Some(self.schedule.enabled),
                interval: Some(humantime::format_duration(self.schedule.interval).to_string()),
                window_budget: Some(
                    humantime::format_duration(self.schedule.window_budget).to_string(),
                ),
                cpu_busy_threshold: Some(self.schedule.cpu_busy_threshold),
                device_busy_threshold: Some(self.schedule.device_busy_threshold),
            },
            probe: ProbeLayer {
                sizes_mib: Some(self.probe.sizes_bytes.iter().map(|b| b >> 20).collect()),
                directions: Some(
                    self.probe
                        .directions
                        .iter()
                        .map(|d| d.as_str().to_string())
                        .collect(),
                ),
                warmup: Some(self.probe.warmup),
                iterations: Some(self.probe.iterations),
                cpus: Some(self.probe.cpus.to_string()),
                samples_per_cell: Some(self.probe.samples_per_cell),
                stale_after: Some(humantime::format_duration(self.probe.stale_after).to_string()),
                pairs: Some(self.probe.pairs.iter().map(|p| p.to_string()).collect()),
                pair_size_mib: Some(self.probe.pair_size_bytes >> 20),
                pair_timeout: Some(humantime::format_duration(self.probe.pair_timeout).to_string()),
            },
            exposition: ExpositionLayer {
                cells: Some(self.exposition.cells),
                pair_cells: Some(self.exposition.pair_cells),
            },
            collectors: CollectorsLayer {
                rdma: Some(self.collectors.rdma),
                numa: Some(self.collectors.numa),
                netdev: Some(self.collectors.netdev),
                pcie: Some(self.collectors.pcie),
                device: Some(self.device_collector),
                netdev_all: Some(self.collectors.netdev_all),
                hca_include: self.collectors.hca_include.as_ref().map(|r| r.to_string()),
                hca_exclude: self.collectors.hca_exclude.as_ref().map(|r| r.to_string()),
                netdev_include: self
                    .collectors
                    .netdev_include
                    .as_ref()
                    .map(|r| r.to_string()),
                netdev_exclude: self
                    .collectors
                    .netdev_exclude
                    .as_ref()
                    .map(|r| r.to_string()),
            },
        }
    }

    /// The effective configuration as TOML text.
    pub fn to_toml(&self) -> String {
        let mut text =
            toml::to_string(&self.to_layer()).unwrap_or_else(|e| format!("# cannot render: {e}\n"));
        if !text.ends_with('\n') {
            text.push('\n');
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(text: &str) -> Result<Layer, ConfigError> {
        Layer::from_toml(Path::new("test.toml"), text)
    }

    #[test]
    fn defaults_validate() {
        let c = Config::resolve([]).unwrap();
        assert_eq!(c.listen.port(), 9863);
        assert_eq!(c.schedule.interval, Duration::from_secs(60));
        assert_eq!(c.probe.sizes_bytes, vec![64 << 20]);
        assert_eq!(c.probe.cpus, CpuSelection::All);
    }

    #[test]
    fn flags_override_file() {
        let file = layer("[schedule]\ninterval = \"10s\"\nwindow_budget = \"1s\"\n").unwrap();
        let mut flags = Layer::default();
        flags.schedule.interval = Some("5s".into());
        let c = Config::resolve([file, flags]).unwrap();
        assert_eq!(c.schedule.interval, Duration::from_secs(5));
        assert_eq!(c.schedule.window_budget, Duration::from_secs(1));
    }

    #[test]
    fn unknown_key_is_named() {
        let err = layer("[probe]\nsizes = [64]\n").unwrap_err().to_string();
        assert!(err.contains("sizes"), "{err}");
        assert!(err.contains("test.toml"), "{err}");
    }

    #[test]
    fn bad_values_name_their_key() {
        for (text, key) in [
            ("[schedule]\ninterval = \"soon\"", "schedule.interval"),
            (
                "[schedule]\ncpu_busy_threshold = 2.0",
                "schedule.cpu_busy_threshold",
            ),
            ("[probe]\ndirections = [\"up\"]", "probe.directions"),
            ("[probe]\ncpus = \"0-x\"", "probe.cpus"),
            ("[probe]\nsizes_mib = [0]", "probe.sizes_mib"),
            ("[server]\nlisten = \"nowhere\"", "server.listen"),
            (
                "[schedule]\nwindow_budget = \"2m\"",
                "schedule.window_budget",
            ),
        ] {
            let err = Config::resolve([layer(text).unwrap()])
                .unwrap_err()
                .to_string();
            assert!(err.starts_with(key), "{text}: {err}");
        }
    }

    #[test]
    fn wrong_type_is_reported_with_key() {
        let err = layer("[probe]\niterations = \"many\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("iterations"), "{err}");
    }

    #[test]
    fn print_config_round_trips() {
        let c =
            Config::resolve([layer("[probe]\ncpus = \"0-3,8\"\nsizes_mib = [16, 64]").unwrap()])
                .unwrap();
        let again = Config::resolve([layer(&c.to_toml()).unwrap()]).unwrap();
        assert_eq!(c, again);
    }
}
