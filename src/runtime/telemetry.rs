//! Device telemetry: utilization, memory in use and foreign compute processes per device,
//! from NVML (through nvml-wrapper, for the CUDA backend) or the ACL runtime (Ascend). The
//! idle gate reads it before and during windows; `/metrics` exports it. NVML is initialised
//! once; a failure is remembered and reported, never retried per scrape. chd's own compute
//! contexts are recognised by every pid it has in its PID namespaces (`own_process`), since
//! NVML in a container reports host pids.

use std::path::Path;
use std::sync::Arc;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

use super::acl::AclBackend;
use super::DeviceInfo;

/// One device's state.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DeviceSample {
    /// The runtime's device label.
    pub device: String,
    /// 0..1 when known.
    pub utilization: Option<f64>,
    pub memory_used_bytes: Option<u64>,
    /// Compute processes on the device other than chd itself, when known.
    pub foreign_processes: Option<u32>,
    /// The pids of those foreign processes that chd's procfs does not show: processes of a
    /// PID namespace chd cannot see into, chd's own contexts among them when chd runs in a
    /// container with its own `/proc` (see `own_process`). Empty where the source lists none.
    pub unseen_pids: Vec<u32>,
    /// The source says the device is gone (NVML's `NVML_ERROR_GPU_IS_LOST`, ACL's
    /// `ACL_ERROR_RT_LOST_HEARTBEAT`): nothing can run on it, so it is neither busy nor an
    /// unreadable input of the idle gate, and its cells fail until it is back.
    pub lost: bool,
}

impl DeviceSample {
    /// Whether this device is busy: above `threshold` utilization or running someone else's
    /// compute process.
    pub fn is_busy(&self, threshold: f64) -> bool {
        self.utilization.is_some_and(|u| u > threshold) || self.foreign_processes.unwrap_or(0) > 0
    }
}

/// A device's memory as NVML describes it: the bus width and the maximum memory clock, from
/// which its peak bandwidth follows (`analysis::limits::MemoryBus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryBusInfo {
    pub bus_width_bits: u32,
    /// `nvmlDeviceGetMaxClockInfo(NVML_CLOCK_MEM)`, MHz.
    pub max_clock_mhz: u32,
}

/// Where device state comes from.
pub trait DeviceTelemetry: Send + Sync {
    /// `nvml`, `acl`, or `none`.
    fn source(&self) -> &'static str;
    /// Current state of every device it can see. Errors are per device (a `None` field).
    fn sample(&self) -> Vec<DeviceSample>;
    /// Whether [`DeviceSample::foreign_processes`] is something this source reads (so a
    /// `None` there is a failed read, not a question it cannot ask).
    fn reports_processes(&self) -> bool {
        false
    }
    /// Whether [`DeviceSample::utilization`] is something this source reads.
    fn reports_utilization(&self) -> bool {
        true
    }
    /// Each device's memory bus, where the source reports it (NVML); a device whose query
    /// fails is left out.
    fn memory_buses(&self) -> Vec<(String, MemoryBusInfo)> {
        Vec::new()
    }
}

/// No device telemetry (host backend, or NVML unavailable).
#[derive(Debug, Default)]
pub struct NoTelemetry;

impl DeviceTelemetry for NoTelemetry {
    fn source(&self) -> &'static str {
        "none"
    }
    fn sample(&self) -> Vec<DeviceSample> {
        Vec::new()
    }
}

/// Why NVML could not be used.
#[derive(Debug, thiserror::Error)]
#[error("NVML unavailable: {0}")]
pub struct NvmlUnavailable(String);

/// NVML telemetry for the CUDA backend's devices, matched by PCI bus id.
pub struct NvmlTelemetry {
    nvml: Nvml,
    /// (NVML index, runtime device label)
    devices: Vec<(u32, String)>,
    /// chd's pids in each of its PID namespaces: NVML processes with these are chd's own.
    own_pids: Vec<u32>,
    /// The procfs chd sees processes in.
    procfs: std::path::PathBuf,
    /// Whether the warning about pids that procfs does not show was given.
    warned_unseen: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for NvmlTelemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlTelemetry")
            .field("devices", &self.devices)
            .field("own_pids", &self.own_pids)
            .finish_non_exhaustive()
    }
}

/// `00000000:1A:00.0` or `0000:1a:00.0` -> `0000:1a:00.0`.
pub fn normalize_bus_id(id: &str) -> String {
    let id = id.trim().to_ascii_lowercase();
    match id.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 => {
            format!("{}:{rest}", &domain[domain.len() - 4..])
        }
        _ => id,
    }
}

impl NvmlTelemetry {
    /// Initialise NVML (from `path`, else libnvidia-ml.so.1) and match its devices to
    /// `devices` by PCI bus id; chd's own pids come from `<procfs>/self/status`.
    pub fn open(
        path: Option<&Path>,
        devices: &[DeviceInfo],
        procfs: &Path,
    ) -> Result<NvmlTelemetry, NvmlUnavailable> {
        let mut builder = Nvml::builder();
        if let Some(p) = path {
            builder.lib_path(p.as_os_str());
        }
        let nvml = builder
            .init()
            .map_err(|e| NvmlUnavailable(super::library::chain(&e)))?;
        let count = nvml
            .device_count()
            .map_err(|e| NvmlUnavailable(super::library::chain(&e)))?;
        let mut matched = Vec::new();
        for index in 0..count {
            let Ok(device) = nvml.device_by_index(index) else {
                continue;
            };
            let Ok(pci) = device.pci_info() else {
                continue;
            };
            let bus = normalize_bus_id(&pci.bus_id);
            if let Some(d) = devices
                .iter()
                .find(|d| normalize_bus_id(&d.pci_bus_id) == bus)
            {
                matched.push((index, d.id.clone()));
            }
        }
        if matched.is_empty() {
            return Err(NvmlUnavailable(format!(
                "none of its {count} devices matches a runtime device by PCI bus id"
            )));
        }
        Ok(NvmlTelemetry {
            nvml,
            devices: matched,
            own_pids: super::own_process::own_pids(procfs),
            procfs: procfs.to_path_buf(),
            warned_unseen: std::sync::atomic::AtomicBool::new(false),
        })
    }
}

impl NvmlTelemetry {
    /// Say once, loudly, that NVML lists processes this procfs does not show: chd then
    /// cannot tell its own contexts from other jobs' and the device gate stays shut while
    /// chd itself holds a device. Only the host's procfs connects them (`own_process`).
    fn warn_unseen(&self, device: &str, pids: &[u32]) {
        use std::sync::atomic::Ordering;
        if pids.is_empty() || self.warned_unseen.swap(true, Ordering::Relaxed) {
            return;
        }
        tracing::warn!(
            device,
            ?pids,
            "NVML lists compute processes on device {device} that {} does not show (pids \
             {pids:?}): chd sees a PID namespace of its own, as in a container with its own \
             /proc, so it cannot tell its own device contexts from other jobs' and treats \
             them all as foreign (the device gate stays shut while chd holds the device). \
             Mount the host's /proc into the container and pass it as --procfs-root (the \
             shipped DaemonSet mounts it at /host/proc), or run chd in the host's PID \
             namespace (hostPID)",
            self.procfs.display()
        );
    }
}

impl DeviceTelemetry for NvmlTelemetry {
    fn source(&self) -> &'static str {
        "nvml"
    }

    /// `nvmlDeviceGetComputeRunningProcesses` answers on every GPU NVML manages.
    fn reports_processes(&self) -> bool {
        true
    }

    /// `nvmlDeviceGetMemoryBusWidth` and `nvmlDeviceGetMaxClockInfo(NVML_CLOCK_MEM)`.
    fn memory_buses(&self) -> Vec<(String, MemoryBusInfo)> {
        use nvml_wrapper::enum_wrappers::device::Clock;
        self.devices
            .iter()
            .filter_map(|(index, label)| {
                let device = self.nvml.device_by_index(*index).ok()?;
                let read = || -> Result<MemoryBusInfo, NvmlError> {
                    Ok(MemoryBusInfo {
                        bus_width_bits: device.memory_bus_width()?,
                        max_clock_mhz: device.max_clock_info(Clock::Memory)?,
                    })
                };
                match read() {
                    Ok(bus) => Some((label.clone(), bus)),
                    Err(e) => {
                        tracing::debug!("device {label}: NVML gives no memory bus: {e}");
                        None
                    }
                }
            })
            .collect()
    }

    fn sample(&self) -> Vec<DeviceSample> {
        self.devices
            .iter()
            .map(|(index, label)| {
                let (device, rates) = match self.nvml.device_by_index(*index) {
                    Ok(d) => {
                        let rates = d.utilization_rates();
                        (Some(d), rates)
                    }
                    Err(e) => (None, Err(e)),
                };
                let lost = matches!(rates, Err(NvmlError::GpuLost));
                let utilization = rates.ok().map(|u| f64::from(u.gpu) / 100.0);
                let memory_used_bytes = device
                    .as_ref()
                    .and_then(|d| d.memory_info().ok())
                    .map(|m| m.used);
                let foreign: Option<Vec<u32>> = device
                    .as_ref()
                    .and_then(|d| d.running_compute_processes().ok())
                    .map(|ps| {
                        ps.iter()
                            .map(|p| p.pid)
                            .filter(|pid| !self.own_pids.contains(pid))
                            .collect()
                    });
                let unseen_pids: Vec<u32> = foreign
                    .iter()
                    .flatten()
                    .copied()
                    .filter(|pid| !self.procfs.join(pid.to_string()).exists())
                    .collect();
                self.warn_unseen(label, &unseen_pids);
                DeviceSample {
                    device: label.clone(),
                    utilization,
                    memory_used_bytes,
                    foreign_processes: foreign.map(|f| f.len() as u32),
                    unseen_pids,
                    lost,
                }
            })
            .collect()
    }
}

/// Utilization from the ACL runtime (`aclrtGetDeviceUtilizationRate`, see `acl.rs` for the
/// `aclrtUtilizationInfo` layout and the header it was checked against; memory and processes
/// are not exposed by ACL).
#[derive(Debug)]
pub struct AclTelemetry {
    pub backend: Arc<AclBackend>,
}

impl DeviceTelemetry for AclTelemetry {
    fn source(&self) -> &'static str {
        "acl"
    }

    /// Not before CANN 7, which lacks the query.
    fn reports_utilization(&self) -> bool {
        self.backend.runtime().has_utilization()
    }

    fn sample(&self) -> Vec<DeviceSample> {
        use super::Backend;
        self.backend
            .devices()
            .iter()
            .map(|d| {
                let index: i32 = d.id.parse().unwrap_or(-1);
                let mut lost = false;
                let utilization = match self.backend.runtime().utilization(index) {
                    Some(Ok(u)) => Some(u),
                    Some(Err(e)) => {
                        tracing::debug!("ACL utilization of device {index}: {e}");
                        lost = e.code == super::acl::ACL_ERROR_RT_LOST_HEARTBEAT;
                        None
                    }
                    None => None,
                };
                DeviceSample {
                    device: d.id.clone(),
                    utilization,
                    memory_used_bytes: None,
                    foreign_processes: None,
                    unseen_pids: Vec::new(),
                    lost,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_normalize_to_sysfs_spelling() {
        assert_eq!(normalize_bus_id("00000000:1A:00.0"), "0000:1a:00.0");
        assert_eq!(normalize_bus_id("0000:1a:00.0"), "0000:1a:00.0");
        assert_eq!(normalize_bus_id("0001:C1:00.0\n"), "0001:c1:00.0");
    }

    #[test]
    fn busy_means_utilization_or_foreign_process() {
        let s = |u: Option<f64>, p: Option<u32>| DeviceSample {
            device: "0".into(),
            utilization: u,
            memory_used_bytes: None,
            foreign_processes: p,
            lost: false,
            unseen_pids: Vec::new(),
        };
        assert!(!s(Some(0.05), Some(0)).is_busy(0.1));
        assert!(s(Some(0.5), Some(0)).is_busy(0.1));
        assert!(s(Some(0.0), Some(1)).is_busy(0.1));
        assert!(!s(None, None).is_busy(0.1));
    }
}
