//! The `device` collector: accelerator telemetry at scrape time (utilization and memory in
//! use per device, from NVML or the ACL runtime), the same readings the device idle gate
//! uses. Absent telemetry (host backend, no NVML) is a quiet success with no samples.

use std::sync::Arc;

use super::{CollectError, CollectorSpec, Sink, SysCollector};
use crate::runtime::telemetry::DeviceTelemetry;

/// The `device` row of the collector table: built from the runtime backend's telemetry, so
/// only where the context carries one (`chd serve`).
pub const SPEC: CollectorSpec = CollectorSpec {
    name: "device",
    default_enabled: true,
    help: "Accelerator utilization and memory from NVML / ACL",
    options: &[],
    build: |ctx| {
        let telemetry = ctx.telemetry.clone()?;
        Some(Box::new(DeviceCollector::new(telemetry)))
    },
};

/// Exports [`DeviceTelemetry`] samples.
pub struct DeviceCollector {
    telemetry: Arc<dyn DeviceTelemetry>,
}

impl std::fmt::Debug for DeviceCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceCollector")
            .field("source", &self.telemetry.source())
            .finish()
    }
}

impl DeviceCollector {
    pub fn new(telemetry: Arc<dyn DeviceTelemetry>) -> DeviceCollector {
        DeviceCollector { telemetry }
    }
}

impl SysCollector for DeviceCollector {
    fn name(&self) -> &'static str {
        "device"
    }

    fn collect(&self, out: &mut Sink) -> Result<(), CollectError> {
        for s in self.telemetry.sample() {
            if let Some(u) = s.utilization {
                out.gauge(
                    "chd_device_utilization_ratio",
                    "Share of time the device was busy running work (0..1)",
                    [("device", s.device.as_str())],
                    u,
                );
            }
            if let Some(bytes) = s.memory_used_bytes {
                out.gauge(
                    "chd_device_memory_used_bytes",
                    "Device memory in use",
                    [("device", s.device.as_str())],
                    bytes,
                );
            }
        }
        Ok(())
    }
}
