//! Configuration: the TOML file layer, the command-line layer (same shape), and the validated
//! [`Config`] that the rest of chd sees. Layers merge as defaults < file < flags; validation
//! names the offending key (`schedule.interval: ...`), and unknown keys are errors.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

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
    #[serde(default, skip_serializing_if = "ScheduleLayer::is_empty")]
    pub schedule: ScheduleLayer,
    #[serde(default, skip_serializing_if = "ProbeLayer::is_empty")]
    pub probe: ProbeLayer,
    #[serde(default, skip_serializing_if = "ExpositionLayer::is_empty")]
    pub exposition: ExpositionLayer,
}

/// `[server]`
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerLayer {
    /// Address to serve `/metrics` on.
    pub listen: Option<String>,
}

/// `[paths]`
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathsLayer {
    pub sysfs: Option<PathBuf>,
    pub procfs: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
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
}

/// `[probe]`
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeLayer {
    /// `host` (the only backend so far).
    pub backend: Option<String>,
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
layer_merge!(ServerLayer { listen });
layer_merge!(PathsLayer {
    sysfs,
    procfs,
    state_dir
});
layer_merge!(ScheduleLayer {
    enabled,
    interval,
    window_budget,
    cpu_busy_threshold
});
layer_merge!(ProbeLayer {
    backend,
    sizes_mib,
    directions,
    warmup,
    iterations,
    cpus,
    samples_per_cell,
    stale_after
});
layer_merge!(ExpositionLayer { cells, pair_cells });

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
            schedule: self.schedule.merge(over.schedule),
            probe: self.probe.merge(over.probe),
            exposition: self.exposition.merge(over.exposition),
        }
    }

    /// The built-in defaults as a layer (what `--print-config` shows for unset keys).
    pub fn defaults() -> Layer {
        Layer {
            server: ServerLayer {
                listen: Some(DEFAULT_LISTEN.into()),
            },
            paths: PathsLayer {
                sysfs: Some("/sys".into()),
                procfs: Some("/proc".into()),
                state_dir: Some(DEFAULT_STATE_DIR.into()),
            },
            schedule: ScheduleLayer {
                enabled: Some(true),
                interval: Some("60s".into()),
                window_budget: Some("2s".into()),
                cpu_busy_threshold: Some(0.5),
            },
            probe: ProbeLayer {
                backend: Some("host".into()),
                sizes_mib: Some(vec![64]),
                directions: Some(vec!["h2d".into()]),
                warmup: Some(1),
                iterations: Some(4),
                cpus: Some("all".into()),
                samples_per_cell: Some(5),
                stale_after: Some("24h".into()),
            },
            exposition: ExpositionLayer {
                cells: Some(true),
                pair_cells: Some(false),
            },
        }
    }
}

/// Which CPUs to probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CpuSelection {
    /// Every online CPU this process may use.
    All,
    /// Exactly these (intersected with the allowed CPUs at run time).
    List(Vec<u32>),
}

/// The validated configuration. Nothing past this point sees an unvalidated value.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub listen: SocketAddr,
    pub roots: Roots,
    pub state_dir: PathBuf,
    pub schedule: ScheduleConfig,
    pub probe: ProbeConfig,
    pub exposition: ExpositionConfig,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleConfig {
    pub enabled: bool,
    pub interval: Duration,
    pub window_budget: Duration,
    pub cpu_busy_threshold: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ProbeConfig {
    pub backend: String,
    pub sizes_bytes: Vec<u64>,
    pub directions: Vec<Direction>,
    pub warmup: u32,
    pub iterations: u32,
    pub cpus: CpuSelection,
    pub samples_per_cell: usize,
    pub stale_after: Duration,
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

        let backend = l.probe.backend.unwrap_or_default();
        if backend != "host" {
            return Err(invalid(
                "probe.backend",
                format!("{backend:?} is not supported by this build (supported: host)"),
            ));
        }
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
        let cpus = match cpus_text.trim() {
            "all" | "auto" => CpuSelection::All,
            list => {
                let ids = cpulist::parse(list).map_err(|e| invalid("probe.cpus", e.to_string()))?;
                if ids.is_empty() {
                    return Err(invalid("probe.cpus", "selects no CPU"));
                }
                CpuSelection::List(ids)
            }
        };
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

        Ok(Config {
            listen,
            roots: Roots {
                sysfs: l.paths.sysfs.unwrap_or_default(),
                procfs: l.paths.procfs.unwrap_or_default(),
            },
            state_dir: l.paths.state_dir.unwrap_or_default(),
            schedule: ScheduleConfig {
                enabled: l.schedule.enabled.unwrap_or(true),
                interval,
                window_budget,
                cpu_busy_threshold,
            },
            probe: ProbeConfig {
                backend,
                sizes_bytes,
                directions,
                warmup,
                iterations,
                cpus,
                samples_per_cell,
                stale_after,
            },
            exposition: ExpositionConfig {
                cells: l.exposition.cells.unwrap_or(true),
                pair_cells: l.exposition.pair_cells.unwrap_or(false),
            },
        })
    }

    /// The effective configuration as a complete TOML layer (for `--print-config`).
    pub fn to_layer(&self) -> Layer {
        Layer {
            server: ServerLayer {
                listen: Some(self.listen.to_string()),
            },
            paths: PathsLayer {
                sysfs: Some(self.roots.sysfs.clone()),
                procfs: Some(self.roots.procfs.clone()),
                state_dir: Some(self.state_dir.clone()),
            },
            schedule: ScheduleLayer {
                enabled: Some(self.schedule.enabled),
                interval: Some(humantime::format_duration(self.schedule.interval).to_string()),
                window_budget: Some(
                    humantime::format_duration(self.schedule.window_budget).to_string(),
                ),
                cpu_busy_threshold: Some(self.schedule.cpu_busy_threshold),
            },
            probe: ProbeLayer {
                backend: Some(self.probe.backend.clone()),
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
                cpus: Some(match &self.probe.cpus {
                    CpuSelection::All => "all".into(),
                    CpuSelection::List(ids) => cpulist::format(ids),
                }),
                samples_per_cell: Some(self.probe.samples_per_cell),
                stale_after: Some(humantime::format_duration(self.probe.stale_after).to_string()),
            },
            exposition: ExpositionLayer {
                cells: Some(self.exposition.cells),
                pair_cells: Some(self.exposition.pair_cells),
            },
        }
    }

    /// The effective configuration as TOML text.
    pub fn to_toml(&self) -> String {
        toml::to_string(&self.to_layer()).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
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
