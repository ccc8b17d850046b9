//! The configuration schema: one [`Layer`] as the TOML file (or the command line) writes
//! it, every key optional, unknown keys refused. Layers merge key by key, later wins;
//! [`super::validate`] turns the merged layer into the typed settings.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use super::collectors::{CollectorsLayer, RawOption};
use super::error::ConfigError;
use super::exposition::RawCells;

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
    /// `[limits."MODEL"]`, by the model name the runtime gives (`NVIDIA H100 80GB HBM3`,
    /// `Ascend910B3`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, ModelLimitsLayer>,
}

/// `[limits."MODEL"]`: the most a path of devices of one model can carry, GB/s, where no API
/// reports it (a same-device copy on a device without NVML, a host path that is not PCIe
/// alone). A sample above it is implausible (`analysis::limits`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelLimitsLayer {
    pub h2d_gbps: Option<f64>,
    pub d2h_gbps: Option<f64>,
    pub d2d_gbps: Option<f64>,
}

/// `[server]`
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerLayer {
    /// Address to serve `/metrics` on.
    pub listen: Option<String>,
    /// Serve this recorded matrix instead of probing.
    pub replay: Option<PathBuf>,
    /// Most HTTP connections open at once; at the cap the longest-idle one is closed for a
    /// new one, and when all are busy new ones wait in the listen backlog.
    pub max_connections: Option<usize>,
    /// Longest a connection may take to send a complete request head, counted from its
    /// accept or its previous response (so also the keep-alive idle timeout), e.g. `10s`.
    pub header_timeout: Option<String>,
    /// The web config file Prometheus exporters share (exporter-toolkit's
    /// `--web.config.file` YAML): TLS and basic auth. Unset: plain HTTP, no authentication.
    pub web_config_file: Option<PathBuf>,
}

/// `[paths]`
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathsLayer {
    pub sysfs: Option<PathBuf>,
    pub procfs: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
    /// A Node Feature Discovery feature file (`.../features.d/chd`) kept up to date with the
    /// node's verdict; unset: none.
    pub nfd_features_file: Option<PathBuf>,
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
    /// HCCL communicators the pair probe holds at once per card (each holds 2 x
    /// `HCCL_BUFFSIZE` of device memory).
    pub hccl_communicators_per_card: Option<u32>,
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
    /// Windows in a row a finding must show in before the node's verdict names it.
    pub verdict_confirm_windows: Option<u32>,
    /// Windows in a row a named finding must be absent from before the verdict drops it.
    pub verdict_clear_windows: Option<u32>,
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
    /// Longest the device work of one copy cell (h2d, d2h, d2d, p2p) may take before the
    /// cell is a timeout and its devices are quarantined, e.g. `10s`.
    pub cell_timeout: Option<String>,
    /// Size of the same-device copy (HBM to HBM) cell each window measures on every
    /// device, MiB; 0 turns the d2d probe off.
    pub d2d_size_mib: Option<u64>,
    /// Size of the ordered peer copy cell each window measures on one device pair, MiB; 0
    /// turns the p2p probe of `chd serve` off.
    pub p2p_size_mib: Option<u64>,
}

/// `[exposition]`
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpositionLayer {
    /// Export every H2D cell (`chd_h2d_bandwidth_bytes_per_second`): `true`, `false`, or
    /// `"auto"` (when the planned matrix has at most `auto_cells_limit` cells).
    pub cells: Option<RawCells>,
    /// The most planned cells for which `cells = "auto"` exports them.
    pub auto_cells_limit: Option<usize>,
    /// Export every pair cell (off by default: 409,600 series at 640 CPUs).
    pub pair_cells: Option<bool>,
    /// Per-CPU series: `"exceptions"` (CPUs that cannot be bound, and counts) or `"all"`.
    pub cpu_series: Option<String>,
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
layer_merge!(ServerLayer {
    listen,
    replay,
    max_connections,
    header_timeout,
    web_config_file
});
layer_merge!(PathsLayer {
    sysfs,
    procfs,
    state_dir,
    nfd_features_file
});
layer_merge!(RuntimeLayer {
    backend,
    cuda_runtime,
    acl_runtime,
    nvml,
    host_memory,
    collective,
    nccl,
    hccl,
    hccl_communicators_per_card
});
layer_merge!(ScheduleLayer {
    enabled,
    interval,
    window_budget,
    cpu_busy_threshold,
    device_busy_threshold,
    verdict_confirm_windows,
    verdict_clear_windows
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
    pair_timeout,
    cell_timeout,
    d2d_size_mib,
    p2p_size_mib
});
layer_merge!(ExpositionLayer {
    cells,
    auto_cells_limit,
    pair_cells,
    cpu_series
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
            limits: merge_limits(self.limits, over.limits),
        }
    }
}

/// Models of `over` override those of `base` key by key.
fn merge_limits(
    mut base: BTreeMap<String, ModelLimitsLayer>,
    over: BTreeMap<String, ModelLimitsLayer>,
) -> BTreeMap<String, ModelLimitsLayer> {
    for (model, o) in over {
        let b = base.remove(&model).unwrap_or_default();
        base.insert(
            model,
            ModelLimitsLayer {
                h2d_gbps: o.h2d_gbps.or(b.h2d_gbps),
                d2h_gbps: o.d2h_gbps.or(b.d2h_gbps),
                d2d_gbps: o.d2d_gbps.or(b.d2d_gbps),
            },
        );
    }
    base
}
