//! Same-device copies (HBM to HBM), one value per device: each device's median with its
//! ratio to the node's typical device (the median over the devices' values, as
//! `chd_d2d_device_ratio`), and the devices below [`SLOW_D2D_DEVICE_RATIO`]. A weak device
//! shows here before it shows in H2D, where the host link caps every device alike. A
//! device whose value is above its path's limit ([`super::limits`]) is flagged implausible
//! and has no ratio, and the typical device leaves it out.

use std::borrow::Borrow;

use super::cell::Cell;
use super::findings::SLOW_D2D_DEVICE_RATIO;
use super::limits::{PathLimit, PathLimits};
use crate::stats;
use crate::topology::natural::natural_key;

/// One device's same-device copy cell.
#[derive(Debug, Clone, PartialEq)]
pub struct D2dDevice {
    pub device: String,
    /// The CPU the cell was measured from (one on the device's NUMA node).
    pub cpu: u32,
    /// Median of the device's samples, bytes per second.
    pub value: Option<f64>,
    pub samples: usize,
    pub failed: usize,
    /// `value` / the median over the devices' values; none when implausible.
    pub ratio: Option<f64>,
    /// The limit of the device's same-device copy, when `value` is above it.
    pub implausible: Option<PathLimit>,
}

/// The devices of one size, analysed.
#[derive(Debug, Clone, PartialEq)]
pub struct D2dDevices {
    /// In natural order of the device.
    pub devices: Vec<D2dDevice>,
    /// The node's typical device: median over the devices' values.
    pub typical: Option<f64>,
}

impl D2dDevices {
    /// Analyse one cell per device (`&[Cell]` or `&[&Cell]`).
    pub fn of<'a, C: Borrow<Cell<'a>>>(cells: &[C]) -> D2dDevices {
        D2dDevices::within(cells, &PathLimits::default())
    }

    /// [`D2dDevices::of`], each device's value judged against its `d2d` limit in `limits`.
    pub fn within<'a, C: Borrow<Cell<'a>>>(cells: &[C], limits: &PathLimits) -> D2dDevices {
        let above = |c: &Cell| {
            c.value
                .and_then(|v| limits.exceeded(c.device, "d2d", v))
                .cloned()
        };
        let values: Vec<f64> = cells
            .iter()
            .filter(|c| above((*c).borrow()).is_none())
            .filter_map(|c| c.borrow().value)
            .filter(|v| !v.is_nan())
            .collect();
        let typical = stats::median(&values);
        let mut devices: Vec<D2dDevice> = cells
            .iter()
            .map(|c| {
                let c = c.borrow();
                let implausible = above(c);
                D2dDevice {
                    device: c.device.to_string(),
                    cpu: c.cpu,
                    value: c.value,
                    samples: c.samples,
                    failed: c.failed,
                    ratio: match (c.value, typical, &implausible) {
                        (Some(v), Some(t), None) => stats::ratio(v, t),
                        _ => None,
                    },
                    implausible,
                }
            })
            .collect();
        devices.sort_by(|a, b| natural_key(&a.device).cmp(&natural_key(&b.device)));
        D2dDevices { devices, typical }
    }

    /// Devices below [`SLOW_D2D_DEVICE_RATIO`] of the typical device.
    pub fn slow(&self) -> Vec<&D2dDevice> {
        self.devices
            .iter()
            .filter(|d| d.ratio.is_some_and(|r| r < SLOW_D2D_DEVICE_RATIO))
            .collect()
    }

    /// Devices whose value is above their path's limit.
    pub fn implausible(&self) -> Vec<&D2dDevice> {
        self.devices
            .iter()
            .filter(|d| d.implausible.is_some())
            .collect()
    }

    /// Devices none of whose samples succeeded.
    pub fn failed(&self) -> Vec<&D2dDevice> {
        self.devices.iter().filter(|d| d.value.is_none()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slow_device_is_below_the_median_of_the_devices() {
        let cells: Vec<Cell> = [
            ("0", Some(400.0)),
            ("10", Some(410.0)),
            ("2", Some(120.0)),
            ("3", Some(390.0)),
            ("4", None),
        ]
        .iter()
        .map(|&(d, g)| Cell::test(7, d, g))
        .collect();
        let a = D2dDevices::of(&cells);
        assert_eq!(a.typical, Some(395e9));
        let order: Vec<&str> = a.devices.iter().map(|d| d.device.as_str()).collect();
        assert_eq!(order, ["0", "2", "3", "4", "10"]);
        let slow: Vec<&str> = a.slow().iter().map(|d| d.device.as_str()).collect();
        assert_eq!(slow, ["2"]);
        assert!((a.devices[1].ratio.unwrap() - 120.0 / 395.0).abs() < 1e-12);
        assert_eq!(a.devices[1].cpu, 7);
        let failed: Vec<&str> = a.failed().iter().map(|d| d.device.as_str()).collect();
        assert_eq!(failed, ["4"]);
        assert_eq!(a.devices[3].ratio, None);
        assert!(D2dDevices::of(&[] as &[Cell]).slow().is_empty());
    }

    #[test]
    fn a_device_above_its_memory_is_flagged_and_left_out_of_the_typical_device() {
        use crate::analysis::limits::{DeviceFacts, MemoryBus};
        // Every device's memory gives 1.6 TB/s, so a copy at most 0.8 TB/s; device 1 reads
        // 2.2 TB/s (its copy stayed in a cache).
        let facts: Vec<DeviceFacts> = ["0", "1", "2", "3"]
            .iter()
            .map(|d| DeviceFacts {
                device: d.to_string(),
                memory: Some(MemoryBus {
                    bus_width_bits: 4096,
                    max_clock_mhz: 1600,
                }),
                ..DeviceFacts::default()
            })
            .collect();
        let limits = PathLimits::build(&facts, &Default::default());
        let cells: Vec<Cell> = [("0", 600.0), ("1", 2200.0), ("2", 610.0), ("3", 300.0)]
            .iter()
            .map(|&(d, g)| Cell::test(0, d, Some(g)))
            .collect();
        let a = D2dDevices::within(&cells, &limits);
        assert_eq!(a.typical, Some(600e9));
        let flagged: Vec<&str> = a.implausible().iter().map(|d| d.device.as_str()).collect();
        assert_eq!(flagged, ["1"]);
        assert_eq!(a.devices[1].ratio, None);
        assert!(
            (a.devices[1].implausible.as_ref().unwrap().bytes_per_second - 819.2e9).abs() < 1.0
        );
        // Device 3 is slow against the plausible ones (0.5), not against a median the
        // impossible value pulled up.
        let slow: Vec<&str> = a.slow().iter().map(|d| d.device.as_str()).collect();
        assert_eq!(slow, ["3"]);
        assert!((a.devices[3].ratio.unwrap() - 0.5).abs() < 1e-12);
    }
}
