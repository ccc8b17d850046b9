//! Path limits: the most each measured path of a device can carry, where chd knows it, and
//! the samples above it. A value above its path's limit is a measurement fault (a copy that
//! stayed in a cache, a timer that missed the work), not a fast device: such a sample is
//! flagged `implausible` with its limit beside it and left out of best values, plateaus and
//! ratios.
//!
//! Where a limit comes from, in this order (the first that applies wins):
//! 1. a configured per-model table (`[limits."MODEL"]`: what no API reports, e.g. a path
//!    that does not go over PCIe);
//! 2. for `d2d` (a same-device copy): the device memory's bandwidth from NVML's memory bus
//!    width and maximum memory clock (bus bits / 8 x clock x 2 transfers per clock), halved,
//!    since a copy reads and writes each byte and chd counts the bytes of one copy over its
//!    time (nvbandwidth's rule);
//! 3. for `h2d` and `d2h`: the payload of the device's PCIe link in its current state
//!    ([`crate::topology::pci_link`]), only where the host path is PCIe alone (CUDA). On
//!    Ascend, H2D may go over the HCCS plane, so a copy above the PCIe payload there is not
//!    implausible: the path is not PCIe-bound ([`super::link`] says so and does not judge
//!    the device against its link).

use std::collections::BTreeMap;

use crate::topology::pci_link::Link;

/// The operations a limit can apply to: the copy directions and the same-device copy.
pub const LIMITED_OPS: [&str; 3] = ["h2d", "d2h", "d2d"];

/// The most one path can carry, and where that number comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct PathLimit {
    pub bytes_per_second: f64,
    /// For people: `PCIe x16 Gen5 payload`, `device memory (NVML: 5120-bit bus at 2619 MHz)
    /// halved for a copy`, `[limits."Ascend910B3"] d2d_gbps`.
    pub source: String,
}

/// Device memory as NVML describes it: the bus width and the maximum memory clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryBus {
    pub bus_width_bits: u32,
    /// `nvmlDeviceGetMaxClockInfo(NVML_CLOCK_MEM)`, MHz.
    pub max_clock_mhz: u32,
}

impl MemoryBus {
    /// Peak bytes per second: bus bytes x clock x 2 (double data rate). H100 SXM: 5120 bits
    /// at 2619 MHz = 3.35e12; A100 40GB: 5120 bits at 1215 MHz = 1.555e12.
    pub fn bandwidth_bytes_per_second(&self) -> Option<f64> {
        (self.bus_width_bits > 0 && self.max_clock_mhz > 0).then(|| {
            f64::from(self.bus_width_bits) / 8.0 * f64::from(self.max_clock_mhz) * 1e6 * 2.0
        })
    }
}

/// A configured model's limits, bytes per second per operation (`h2d`, `d2h`, `d2d`).
pub type ModelLimits = BTreeMap<String, f64>;

/// A `[limits."MODEL"]` table as the config and run.json write it (operation -> GB/s).
pub fn model_limits(gbps: &BTreeMap<String, f64>) -> ModelLimits {
    gbps.iter().map(|(op, g)| (op.clone(), g * 1e9)).collect()
}

/// What chd knows of one device's paths.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceFacts {
    pub device: String,
    /// The model name the runtime gives (`NVIDIA H100 80GB HBM3`, `Ascend910B3`).
    pub model: String,
    /// The PCIe link as read after chd's copies.
    pub link: Option<Link>,
    pub memory: Option<MemoryBus>,
    /// Whether host copies go over the PCIe link alone (CUDA), so its payload bounds them.
    pub pcie_host_path: bool,
}

/// Whether the backend's host copies go over the PCIe link alone: not on Ascend (`acl`),
/// where H2D and D2H may use the HCCS plane, nor on the host backend (no link).
pub fn pcie_host_path(backend: &str) -> bool {
    backend == "cuda"
}

/// Every device's limits, by device and operation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PathLimits {
    by_device: BTreeMap<String, BTreeMap<&'static str, PathLimit>>,
}

impl PathLimits {
    /// The limits of `devices`, the configured table `models` (model name -> limits) first.
    pub fn build(devices: &[DeviceFacts], models: &BTreeMap<String, ModelLimits>) -> PathLimits {
        let mut by_device = BTreeMap::new();
        for d in devices {
            let mut limits: BTreeMap<&'static str, PathLimit> = BTreeMap::new();
            for op in LIMITED_OPS {
                if let Some(limit) = configured(models, &d.model, op).or_else(|| measured(d, op)) {
                    limits.insert(op, limit);
                }
            }
            if !limits.is_empty() {
                by_device.insert(d.device.clone(), limits);
            }
        }
        PathLimits { by_device }
    }

    /// The limit of `op` on `device`, where chd knows one.
    pub fn get(&self, device: &str, op: &str) -> Option<&PathLimit> {
        self.by_device.get(device)?.get(op)
    }

    /// The limit `value` is above, when it is above the limit of `op` on `device`.
    pub fn exceeded(&self, device: &str, op: &str, value: f64) -> Option<&PathLimit> {
        self.get(device, op).filter(|l| value > l.bytes_per_second)
    }

    pub fn is_empty(&self) -> bool {
        self.by_device.is_empty()
    }
}

fn configured(models: &BTreeMap<String, ModelLimits>, model: &str, op: &str) -> Option<PathLimit> {
    let v = *models.get(model)?.get(op)?;
    Some(PathLimit {
        bytes_per_second: v,
        source: format!("[limits.\"{model}\"] {op}_gbps"),
    })
}

fn measured(d: &DeviceFacts, op: &str) -> Option<PathLimit> {
    match op {
        "d2d" => {
            let bus = d.memory?;
            Some(PathLimit {
                bytes_per_second: bus.bandwidth_bytes_per_second()? / 2.0,
                source: format!(
                    "device memory (NVML: {}-bit bus at {} MHz) halved: a copy reads and writes each byte",
                    bus.bus_width_bits, bus.max_clock_mhz
                ),
            })
        }
        "h2d" | "d2h" if d.pcie_host_path => {
            let link = d.link?;
            Some(PathLimit {
                bytes_per_second: link.current.payload_bytes_per_second()?,
                source: format!("PCIe {} payload", link.current.describe()),
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::pci_link::LinkState;

    fn gen5x16() -> Link {
        let s = LinkState {
            width: 16,
            transfers_per_second: 32_000_000_000,
        };
        Link { current: s, max: s }
    }

    fn h100() -> MemoryBus {
        MemoryBus {
            bus_width_bits: 5120,
            max_clock_mhz: 2619,
        }
    }

    #[test]
    fn memory_bandwidth_is_bus_bytes_times_clock_times_two() {
        let b = h100().bandwidth_bytes_per_second().unwrap();
        assert!((b - 3.352_32e12).abs() < 1e6, "{b}");
        let zero = MemoryBus {
            bus_width_bits: 0,
            max_clock_mhz: 2619,
        };
        assert_eq!(zero.bandwidth_bytes_per_second(), None);
    }

    #[test]
    fn cuda_limits_come_from_the_link_and_nvml_and_the_table_wins() {
        let cuda = DeviceFacts {
            device: "0".into(),
            model: "NVIDIA H100 80GB HBM3".into(),
            link: Some(gen5x16()),
            memory: Some(h100()),
            pcie_host_path: pcie_host_path("cuda"),
        };
        let limits = PathLimits::build(std::slice::from_ref(&cuda), &BTreeMap::new());
        let h2d = limits.get("0", "h2d").unwrap();
        assert!((h2d.bytes_per_second - 63.015_384_615e9).abs() < 1e3);
        assert_eq!(h2d.source, "PCIe x16 Gen5 payload");
        let d2d = limits.get("0", "d2d").unwrap();
        assert!((d2d.bytes_per_second - 1.676_16e12).abs() < 1e6);
        assert!(limits.exceeded("0", "d2d", 2.2e12).is_some());
        assert!(limits.exceeded("0", "d2d", 1.5e12).is_none());
        assert!(limits.get("0", "allgather").is_none());
        let table = BTreeMap::from([(
            "NVIDIA H100 80GB HBM3".to_string(),
            ModelLimits::from([("d2d".to_string(), 1.2e12)]),
        )]);
        let limits = PathLimits::build(&[cuda], &table);
        assert_eq!(limits.get("0", "d2d").unwrap().bytes_per_second, 1.2e12);
        assert_eq!(
            limits.get("0", "d2d").unwrap().source,
            "[limits.\"NVIDIA H100 80GB HBM3\"] d2d_gbps"
        );
        assert!(limits.get("0", "h2d").is_some());
    }

    #[test]
    fn on_ascend_the_pcie_link_does_not_bound_host_copies() {
        let npu = DeviceFacts {
            device: "0".into(),
            model: "Ascend910B3".into(),
            link: Some(gen5x16()),
            memory: None,
            pcie_host_path: pcie_host_path("acl"),
        };
        let limits = PathLimits::build(&[npu], &BTreeMap::new());
        assert!(limits.is_empty());
        assert!(limits.exceeded("0", "h2d", 100e9).is_none());
    }
}
