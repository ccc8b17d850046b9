//! The built-in defaults, written once: [`Layer::defaults`] is the bottom layer every
//! configuration merges over, and what `--print-config` shows for keys nobody set.
//! Validation never falls back to a value of its own. The collectors' defaults come from
//! their table rows.
//!
//! Measurement counts differ from `chd probe`'s on purpose (there: 2 untimed + 10 timed
//! copies, 3 repeats back to back, on a node given to the run). `serve` measures on a node
//! that runs jobs, one cell at a time inside an idle window of `window_budget` (2 s); the
//! idle gate is checked between cells and a cell in flight is never cut short, so a cell's
//! length is how late chd yields and how far a window overruns. 1 + 4 copies of 64 MiB keep
//! even one of the 0.2 GB/s extreme cells seen in the field (5 x 64 MiB: 1.7 s) inside one
//! window, where 2 + 10 (4 s) would double it. The averaging a one-shot run gets from more
//! copies, `serve` gets from time: a cell's value is the median of its last
//! `samples_per_cell` (5) samples, each from another window and another visiting order.

use super::collectors::CollectorsLayer;
use super::exposition::{RawCells, DEFAULT_AUTO_CELLS_LIMIT};
use super::schema::{
    ExpositionLayer, Layer, PathsLayer, ProbeLayer, RuntimeLayer, ScheduleLayer, ServerLayer,
};
use crate::collect::CollectorSettings;

/// Default port: registered for chd in the exporter port allocation style (9863).
pub const DEFAULT_LISTEN: &str = "0.0.0.0:9863";
/// Default `server.max_connections`. A node is scraped by one Prometheus or an HA pair
/// (one keep-alive connection each), probed by a kubelet or load balancer on `/healthz`, and
/// opened now and then by a person on `/matrix`: under ten at once. 64 leaves six-fold room
/// for federation, debugging and reconnect storms, while 64 connections' buffers (hyper
/// reads into 8 KiB and writes up to a whole gzipped scrape) stay within a few MiB.
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;
/// Default state directory; `./chd-state` is used when it is not writable.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/chd";
/// Fallback state directory, relative to the working directory.
pub const FALLBACK_STATE_DIR: &str = "chd-state";

impl Layer {
    /// The built-in defaults as a layer (what `--print-config` shows for unset keys).
    pub fn defaults() -> Layer {
        Layer {
            server: ServerLayer {
                listen: Some(DEFAULT_LISTEN.into()),
                replay: None,
                max_connections: Some(DEFAULT_MAX_CONNECTIONS),
                // A scraper sends its whole request head in one packet; 10 s is slack for
                // any real client and short enough that silent connections do not pile up.
                header_timeout: Some("10s".into()),
                // Plain HTTP without authentication unless a web config file is given.
                web_config_file: None,
            },
            paths: PathsLayer {
                sysfs: Some("/sys".into()),
                procfs: Some("/proc".into()),
                state_dir: Some(DEFAULT_STATE_DIR.into()),
                nfd_features_file: None,
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
                hccl_communicators_per_card: Some(1),
            },
            schedule: ScheduleLayer {
                enabled: Some(true),
                interval: Some("60s".into()),
                window_budget: Some("2s".into()),
                cpu_busy_threshold: Some(0.5),
                device_busy_threshold: Some(0.1),
                verdict_confirm_windows: Some(2),
                verdict_clear_windows: Some(3),
            },
            probe: ProbeLayer {
                sizes_mib: Some(vec![64]),
                directions: Some(vec!["h2d".into()]),
                // Fewer than `chd probe`'s 2 / 10: see the module comment.
                warmup: Some(1),
                iterations: Some(4),
                cpus: Some("all".into()),
                samples_per_cell: Some(5),
                stale_after: Some("24h".into()),
                pairs: Some(vec![]),
                pair_size_mib: Some(64),
                pair_timeout: Some("30s".into()),
                // A 64 MiB cell takes milliseconds; 10 s is a device that stopped answering.
                cell_timeout: Some("10s".into()),
                // Two buffers of 64 MiB per device for one cell per window: a few
                // milliseconds of copies at HBM rates.
                d2d_size_mib: Some(64),
                // One ordered pair per window: 64 MiB on each of its two devices, a few
                // milliseconds of copies at PCIe peer rates.
                p2p_size_mib: Some(64),
            },
            exposition: ExpositionLayer {
                // Cells on for a typical 8-GPU node, off for the 30,720 of the seed's (see
                // DEFAULT_AUTO_CELLS_LIMIT): the fleet series budget.
                cells: Some(RawCells::Text("auto".into())),
                auto_cells_limit: Some(DEFAULT_AUTO_CELLS_LIMIT),
                pair_cells: Some(false),
                // Per-CPU series only for CPUs that cannot be bound (issue 28 part 4: 1,280
                // series at 640 CPUs otherwise); the per-CPU facts are in the ledger.
                cpu_series: Some("exceptions".into()),
            },
            collectors: CollectorsLayer::of(&CollectorSettings::default()),
            // No model has configured limits unless a file names it.
            limits: Default::default(),
        }
    }
}
