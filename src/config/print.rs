//! The inverse of validation: the effective [`Config`] as a complete [`Layer`] and as TOML
//! text (`--print-config`), which validates back to the same `Config`.

use super::collectors::CollectorsLayer;
use super::schema::{
    ExpositionLayer, Layer, ModelLimitsLayer, PathsLayer, ProbeLayer, RuntimeLayer, ScheduleLayer,
    ServerLayer,
};
use super::Config;

impl Config {
    /// The effective configuration as a complete TOML layer (for `--print-config`).
    pub fn to_layer(&self) -> Layer {
        Layer {
            server: ServerLayer {
                listen: Some(self.listen.to_string()),
                replay: self.replay.clone(),
                max_connections: Some(self.server.max_connections),
                header_timeout: Some(
                    humantime::format_duration(self.server.header_timeout).to_string(),
                ),
                web_config_file: self.server.web_config_file.clone(),
            },
            paths: PathsLayer {
                sysfs: Some(self.roots.sysfs.clone()),
                procfs: Some(self.roots.procfs.clone()),
                state_dir: Some(self.state_dir.clone()),
                nfd_features_file: self.nfd_features_file.clone(),
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
                hccl_communicators_per_card: Some(self.runtime.hccl_communicators_per_card),
            },
            schedule: ScheduleLayer {
                enabled: Some(self.schedule.enabled),
                interval: Some(humantime::format_duration(self.schedule.interval).to_string()),
                window_budget: Some(
                    humantime::format_duration(self.schedule.window_budget).to_string(),
                ),
                cpu_busy_threshold: Some(self.schedule.cpu_busy_threshold),
                device_busy_threshold: Some(self.schedule.device_busy_threshold),
                verdict_confirm_windows: Some(self.schedule.verdict_confirm_windows),
                verdict_clear_windows: Some(self.schedule.verdict_clear_windows),
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
                cell_timeout: Some(humantime::format_duration(self.probe.cell_timeout).to_string()),
                d2d_size_mib: Some(self.probe.d2d_size_bytes >> 20),
                p2p_size_mib: Some(self.probe.p2p_size_bytes >> 20),
            },
            exposition: ExpositionLayer {
                cells: Some(self.exposition.cells.raw()),
                auto_cells_limit: Some(self.exposition.auto_cells_limit),
                pair_cells: Some(self.exposition.pair_cells),
                cpu_series: Some(self.exposition.cpu_series.as_str().to_string()),
            },
            collectors: CollectorsLayer::of(&self.collectors),
            limits: self
                .limits
                .iter()
                .map(|(model, ops)| {
                    let op = |name: &str| ops.get(name).copied();
                    (
                        model.clone(),
                        ModelLimitsLayer {
                            h2d_gbps: op("h2d"),
                            d2h_gbps: op("d2h"),
                            d2d_gbps: op("d2d"),
                        },
                    )
                })
                .collect(),
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
