//! Configuration, in the raw -> validated split: `schema` is the TOML file layer and the
//! command-line layer (same shape, every key optional), `defaults` the bottom layer,
//! `validate` turns the merged layers into the typed [`Config`] the rest of chd sees, with
//! [`ConfigError`]s that name the key and the problem, and [`print`] is the inverse for
//! `--print-config`. Layers merge as defaults < file < flags; unknown keys are errors. The
//! `[collectors]` section (`collectors`) is derived from the collector table.

mod collectors;
mod defaults;
mod error;
mod exposition;
mod print;
mod schema;
mod validate;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use crate::collect::CollectorSettings;
use crate::exposition::server::ServerSettings;
use crate::runtime::select::RuntimeConfig;
use crate::topology::Roots;

/// The prober's settings are the scheduler's types; re-exported here with the rest.
pub use crate::schedule::settings::{ProbeConfig, ScheduleConfig};
/// The selectors are topology types; re-exported here for the modules that name them so.
pub use crate::topology::{CpuSelection, PairSelection};
pub use defaults::{
    DEFAULT_LISTEN, DEFAULT_MAX_CONNECTIONS, DEFAULT_STATE_DIR, FALLBACK_STATE_DIR,
};
pub use error::{ConfigError, Problem};
pub use exposition::{
    CellExport, CellsDecision, CpuSeries, ExpositionConfig, RawCells, DEFAULT_AUTO_CELLS_LIMIT,
};
pub use schema::{
    CollectorsLayer, ExpositionLayer, Layer, ModelLimitsLayer, PathsLayer, ProbeLayer, RawOption,
    RuntimeLayer, ScheduleLayer, ServerLayer,
};

/// The validated configuration. Nothing past this point sees an unvalidated value.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub listen: SocketAddr,
    /// A recording to serve instead of probing.
    pub replay: Option<PathBuf>,
    /// The HTTP server's bounds.
    pub server: ServerSettings,
    pub roots: Roots,
    pub state_dir: PathBuf,
    /// The NFD feature file `chd serve` keeps up to date, if any.
    pub nfd_features_file: Option<PathBuf>,
    pub runtime: RuntimeConfig,
    pub schedule: ScheduleConfig,
    pub probe: ProbeConfig,
    pub exposition: ExpositionConfig,
    /// Which scrape-time collectors run and what they cover.
    pub collectors: CollectorSettings,
    /// `[limits."MODEL"]`: model -> operation (`h2d`, `d2h`, `d2d`) -> GB/s.
    pub limits: BTreeMap<String, BTreeMap<String, f64>>,
}

impl Config {
    /// Merge `layers` (later wins) over the defaults and validate.
    pub fn resolve(layers: impl IntoIterator<Item = Layer>) -> Result<Config, ConfigError> {
        let merged = layers
            .into_iter()
            .fold(Layer::defaults(), |acc, l| acc.merge(l));
        Config::validate(merged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::time::Duration;

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
        assert_eq!(c.server.max_connections, DEFAULT_MAX_CONNECTIONS);
        assert_eq!(c.server.header_timeout, Duration::from_secs(10));
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
            ("[server]\nmax_connections = 0", "server.max_connections"),
            (
                "[server]\nmax_connections = 100000",
                "server.max_connections",
            ),
            ("[server]\nheader_timeout = \"0s\"", "server.header_timeout"),
            (
                "[server]\nheader_timeout = \"a while\"",
                "server.header_timeout",
            ),
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
    fn exposition_cells_defaults_to_auto_and_keeps_true_and_false() {
        let c = Config::resolve([]).unwrap();
        assert_eq!(
            c.exposition.cells,
            CellExport::Auto {
                limit: DEFAULT_AUTO_CELLS_LIMIT
            }
        );
        assert_eq!(c.exposition.auto_cells_limit, 12_288);
        for (text, want) in [
            ("true", CellExport::On),
            ("false", CellExport::Off),
            ("\"auto\"", CellExport::Auto { limit: 100 }),
        ] {
            let l = layer(&format!(
                "[exposition]\ncells = {text}\nauto_cells_limit = 100\n"
            ))
            .unwrap();
            let c = Config::resolve([l]).unwrap();
            assert_eq!(c.exposition.cells, want, "{text}");
            let again = Config::resolve([layer(&c.to_toml()).unwrap()]).unwrap();
            assert_eq!(c, again, "{text}: --print-config round trip");
        }
        // The default resolves on for a typical 8-GPU node and off for the seed's.
        assert!(c_default().cells_for(512 * 8 * 3).on);
        assert!(!c_default().cells_for(640 * 16 * 3).on);
    }

    fn c_default() -> ExpositionConfig {
        Config::resolve([]).unwrap().exposition
    }

    #[test]
    fn exposition_cells_refuses_other_values_by_key() {
        for (text, got) in [
            ("\"yes\"", "\"yes\""),
            ("\"Auto\"", "\"Auto\""),
            ("3", "3"),
            ("[true]", "[true]"),
        ] {
            let l = layer(&format!("[exposition]\ncells = {text}\n")).unwrap();
            let err = Config::resolve([l]).unwrap_err().to_string();
            assert_eq!(
                err,
                format!("exposition.cells: expected true, false or \"auto\", got {got}")
            );
        }
        let l = layer("[exposition]\nauto_cells_limit = 0\n").unwrap();
        let err = Config::resolve([l]).unwrap_err().to_string();
        assert!(err.starts_with("exposition.auto_cells_limit: "), "{err}");
    }

    #[test]
    fn exposition_cpu_series_defaults_to_exceptions_and_refuses_other_values_by_key() {
        assert_eq!(c_default().cpu_series, CpuSeries::Exceptions);
        let l = layer("[exposition]\ncpu_series = \"all\"\n").unwrap();
        assert_eq!(
            Config::resolve([l]).unwrap().exposition.cpu_series,
            CpuSeries::All
        );
        let l = layer("[exposition]\ncpu_series = \"every\"\n").unwrap();
        let err = Config::resolve([l]).unwrap_err().to_string();
        assert_eq!(
            err,
            "exposition.cpu_series: expected \"exceptions\" or \"all\", got \"every\""
        );
        let err = layer("[exposition]\ncpu_series = true\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("cpu_series"), "{err}");
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
            Config::resolve([layer("[probe]\ncpus = \"0-3,8\"\nsizes_mib = [16, 64]\n[server]\nmax_connections = 8\nheader_timeout = \"1500ms\"").unwrap()])
                .unwrap();
        let again = Config::resolve([layer(&c.to_toml()).unwrap()]).unwrap();
        assert_eq!(c, again);
    }

    #[test]
    fn model_limits_merge_by_model_and_key_and_name_a_bad_value() {
        let file = layer(
            "[limits.\"Ascend910B3\"]\nh2d_gbps = 120\nd2d_gbps = 800\n[limits.\"NVIDIA H200\"]\nd2d_gbps = 2400\n",
        )
        .unwrap();
        let flags = layer("[limits.\"Ascend910B3\"]\nd2d_gbps = 900.5\n").unwrap();
        let c = Config::resolve([file, flags]).unwrap();
        assert_eq!(
            c.limits["Ascend910B3"],
            BTreeMap::from([("d2d".to_string(), 900.5), ("h2d".to_string(), 120.0)])
        );
        assert_eq!(c.limits["NVIDIA H200"]["d2d"], 2400.0);
        let again = Config::resolve([layer(&c.to_toml()).unwrap()]).unwrap();
        assert_eq!(c, again, "--print-config keeps the table");
        let err = Config::resolve([layer("[limits.\"X\"]\nd2d_gbps = -1\n").unwrap()])
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "limits.\"X\".d2d_gbps: -1 is not a bandwidth: a positive number of GB/s"
        );
        let err = layer("[limits.\"X\"]\nd2d = 5\n").unwrap_err().to_string();
        assert!(err.contains("d2d"), "{err}");
    }

    #[test]
    fn validation_invents_no_value_of_its_own() {
        // Only the defaults layer supplies defaults: an unmerged empty layer is refused at
        // its first key, and dropping any one default is noticed by name.
        let err = Config::validate(Layer::default()).unwrap_err().to_string();
        assert_eq!(err, "server.listen: no value and no default");
        let mut l = Layer::defaults();
        l.probe.iterations = None;
        let err = Config::validate(l).unwrap_err().to_string();
        assert_eq!(err, "probe.iterations: no value and no default");
    }

    #[test]
    fn collector_keys_merge_like_the_others() {
        let file = layer("[collectors]\nrdma = false\nnetdev_all = true\n").unwrap();
        let flags = layer("[collectors]\nrdma = true\nhca_exclude = \"^bond\"\n").unwrap();
        let c = Config::resolve([file, flags]).unwrap();
        assert_eq!(c.collectors.enabled("rdma"), Some(true));
        assert!(c.collectors.netdev_all);
        assert_eq!(c.collectors.hca_exclude.as_ref().unwrap().as_str(), "^bond");
        let again = Config::resolve([layer(&c.to_toml()).unwrap()]).unwrap();
        assert_eq!(c, again);
    }
}
