//! Command-line interface: the raw clap arguments and their translation into a
//! configuration layer. Validation happens in `chd::config`, never here.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use chd::config::Layer;

/// chd keeps accelerator nodes honest: it measures, in idle windows, how fast each CPU core
/// feeds each device, which cores can really be bound, and serves it all to Prometheus.
#[derive(Debug, Parser)]
#[command(name = "chd", version, propagate_version = true)]
pub struct Cli {
    /// Root of the sysfs tree to read (a fixture tree in tests).
    #[arg(long, global = true, value_name = "DIR")]
    pub sysfs_root: Option<PathBuf>,
    /// Root of the procfs tree to read (a fixture tree in tests).
    #[arg(long, global = true, value_name = "DIR")]
    pub procfs_root: Option<PathBuf>,
    /// Log filter (tracing env-filter syntax); RUST_LOG works too.
    #[arg(long, global = true, default_value = "info", value_name = "FILTER")]
    pub log: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the exporter: probe in idle windows and serve /metrics.
    ///
    /// Every option also has a config-file key (shown in brackets); flags override the file,
    /// the file overrides the built-in defaults. `--print-config` shows the result.
    Serve(Box<ServeArgs>),
    /// Print the CPUs, NUMA nodes and cpuset chd sees.
    Topology(TopologyArgs),
}

#[derive(Debug, Args)]
pub struct TopologyArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML config file.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Address to serve on [server.listen] (default 0.0.0.0:9863).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Where the matrix is saved [paths.state_dir] (default /var/lib/chd, else ./chd-state).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Time between scheduler ticks, e.g. 60s, 5m [schedule.interval] (default 60s).
    #[arg(long, value_name = "DURATION")]
    pub interval: Option<String>,
    /// Probing time one window may spend [schedule.window_budget] (default 2s).
    #[arg(long, value_name = "DURATION")]
    pub window_budget: Option<String>,
    /// Skip or stop a window when other processes use more than this share of all CPUs,
    /// 0..1; 1 disables the CPU gate [schedule.cpu_busy_threshold] (default 0.5).
    #[arg(long, value_name = "RATIO")]
    pub cpu_busy_threshold: Option<f64>,
    /// Serve metrics but never probe [schedule.enabled = false].
    #[arg(long)]
    pub no_probe: bool,
    /// Runtime to probe with [probe.backend] (default host; accelerators come later).
    #[arg(long, value_name = "NAME")]
    pub backend: Option<String>,
    /// Copy sizes in MiB, comma-separated [probe.sizes_mib] (default 64).
    #[arg(long, value_name = "MIB,...", value_delimiter = ',')]
    pub sizes: Option<Vec<u64>>,
    /// Copy directions, comma-separated: h2d, d2h [probe.directions] (default h2d).
    #[arg(long, value_name = "DIR,...", value_delimiter = ',')]
    pub directions: Option<Vec<String>>,
    /// Untimed copies before timing a cell [probe.warmup] (default 1).
    #[arg(long, value_name = "N")]
    pub warmup: Option<u32>,
    /// Timed copies per sample [probe.iterations] (default 4).
    #[arg(long, value_name = "N")]
    pub iterations: Option<u32>,
    /// CPUs to probe: `all` (every CPU this process may use) or a list like 0-79,160
    /// [probe.cpus] (default all).
    #[arg(long, value_name = "LIST")]
    pub cpus: Option<String>,
    /// Samples a cell keeps; its value is their median [probe.samples_per_cell] (default 5).
    #[arg(long, value_name = "K")]
    pub samples: Option<usize>,
    /// Age after which a cell counts as stale [probe.stale_after] (default 24h).
    #[arg(long, value_name = "DURATION")]
    pub stale_after: Option<String>,
    /// Export every matrix cell, not only aggregates [exposition.cells] (default true).
    #[arg(long, value_name = "BOOL")]
    pub cells: Option<bool>,
    /// Export every core-pair cell; 409,600 series at 640 CPUs [exposition.pair_cells]
    /// (default false).
    #[arg(long, value_name = "BOOL")]
    pub pair_cells: Option<bool>,
}

impl Cli {
    /// The flags as a configuration layer (only what was given).
    pub fn flag_layer(&self, serve: Option<&ServeArgs>) -> Layer {
        let mut l = Layer::default();
        l.paths.sysfs = self.sysfs_root.clone();
        l.paths.procfs = self.procfs_root.clone();
        if let Some(a) = serve {
            l.server.listen = a.listen.clone();
            l.paths.state_dir = a.state_dir.clone();
            l.schedule.interval = a.interval.clone();
            l.schedule.window_budget = a.window_budget.clone();
            l.schedule.cpu_busy_threshold = a.cpu_busy_threshold;
            l.schedule.enabled = a.no_probe.then_some(false);
            l.probe.backend = a.backend.clone();
            l.probe.sizes_mib = a.sizes.clone();
            l.probe.directions = a.directions.clone();
            l.probe.warmup = a.warmup;
            l.probe.iterations = a.iterations;
            l.probe.cpus = a.cpus.clone();
            l.probe.samples_per_cell = a.samples;
            l.probe.stale_after = a.stale_after.clone();
            l.exposition.cells = a.cells;
            l.exposition.pair_cells = a.pair_cells;
        }
        l
    }
}
