//! The basic validation table (`chd probe basics`): for each measurement (matmul TFLOPS, H2D,
//! same-device D2D, 2-rank allgather) and load profile, the slowest and the fastest device
//! from each device's median, and the devices that failed. The table an engineer reads first
//! to see whether a node is sane at all; a row whose slowest device is below
//! [`WEAK_DEVICE_RATIO`] of its fastest names that device as a finding.

use std::collections::BTreeMap;
use std::fmt;

use crate::topology::natural::natural_key;

/// A row's slowest device below this fraction of its fastest is a finding: the devices of
/// one node are one model on one board, so a fifth apart is a weak device, not noise.
pub const WEAK_DEVICE_RATIO: f64 = 0.8;

/// One measurement of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// SGEMM throughput, floating-point operations per second.
    Matmul,
    /// Host-to-device copies from a CPU of the device's NUMA node, bytes per second.
    H2d,
    /// Same-device copies (device memory to device memory), bytes per second.
    D2d,
    /// 2-rank allgather bus bandwidth of the device's pair, bytes per second.
    Allgather,
}

impl Op {
    /// Every measurement, in the table's order.
    pub const ALL: [Op; 4] = [Op::Matmul, Op::H2d, Op::D2d, Op::Allgather];

    /// The name in run.json slots, CSV and flags.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Matmul => "matmul",
            Op::H2d => "h2d",
            Op::D2d => "d2d",
            Op::Allgather => "allgather",
        }
    }

    /// The unit values are shown in.
    pub fn unit(self) -> &'static str {
        match self {
            Op::Matmul => "TFLOPS",
            _ => "GB/s",
        }
    }

    /// A value (per second) in [`Op::unit`]s.
    pub fn scaled(self, value: f64) -> f64 {
        match self {
            Op::Matmul => value / 1e12,
            _ => value / 1e9,
        }
    }

    /// What the row measures, for people.
    pub fn title(self) -> &'static str {
        match self {
            Op::Matmul => "matmul (SGEMM)",
            Op::H2d => "H2D copy",
            Op::D2d => "D2D copy (same device)",
            Op::Allgather => "allgather (2 ranks)",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Op {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Op::ALL
            .into_iter()
            .find(|op| op.as_str() == s)
            .ok_or_else(|| {
                format!("unknown measurement {s:?}: expected matmul, h2d, d2d or allgather")
            })
    }
}

/// One device's result for one measurement under one load profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry<'a> {
    pub load: &'a str,
    pub op: Op,
    /// The device (for allgather: the device whose pair it is, one entry per device).
    pub device: &'a str,
    /// Median of its successful samples, per second.
    pub value: Option<f64>,
    /// The last failure, when no sample succeeded.
    pub error: Option<&'a str>,
}

/// A device and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceValue {
    pub device: String,
    pub value: f64,
}

/// One row of the table: a measurement under a load profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub op: Op,
    pub load: String,
    /// The slowest and the fastest device (none when no device was measured).
    pub min: Option<DeviceValue>,
    pub max: Option<DeviceValue>,
    /// Devices measured.
    pub measured: usize,
    /// Devices without a value, with the last failure.
    pub failed: Vec<(String, String)>,
}

impl Row {
    /// Slowest over fastest, when both are known and the fastest is positive.
    pub fn spread(&self) -> Option<f64> {
        match (&self.min, &self.max) {
            (Some(lo), Some(hi)) if hi.value > 0.0 => Some(lo.value / hi.value),
            _ => None,
        }
    }

    /// The weak device of this row, if its slowest is below [`WEAK_DEVICE_RATIO`] of its
    /// fastest.
    pub fn weak(&self) -> Option<&DeviceValue> {
        self.spread()
            .filter(|r| *r < WEAK_DEVICE_RATIO)
            .and(self.min.as_ref())
    }
}

/// The whole table.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BasicsTable {
    /// Rows by measurement (table order), then load profile (run order).
    pub rows: Vec<Row>,
    /// Measurements this run could not make at all, and why (e.g. matmul on the acl
    /// backend): said, never shown as zeros.
    pub unavailable: Vec<(Op, String)>,
}

impl BasicsTable {
    /// The table of `entries`; `loads` in run order (rows of loads not in it come last).
    pub fn of(entries: &[Entry<'_>], loads: &[String], unavailable: &[(Op, String)]) -> Self {
        let mut groups: BTreeMap<(Op, usize, &str), Vec<Entry<'_>>> = BTreeMap::new();
        let order = |load: &str| loads.iter().position(|l| l == load).unwrap_or(loads.len());
        for e in entries {
            groups
                .entry((e.op, order(e.load), e.load))
                .or_default()
                .push(e.clone());
        }
        let rows = groups
            .into_iter()
            .map(|((op, _, load), mut group)| {
                group.sort_by(|a, b| natural_key(a.device).cmp(&natural_key(b.device)));
                // A device in two allgather pairs (the last of an odd count) counts once, at
                // its weaker pair: a failure or the lower value.
                group.dedup_by(|later, kept| {
                    if later.device != kept.device {
                        return false;
                    }
                    if let (Some(v), Some(k)) = (later.value, kept.value) {
                        if v < k {
                            kept.value = later.value;
                        }
                    } else if later.value.is_none() {
                        kept.value = None;
                        kept.error = later.error;
                    }
                    true
                });
                let measured: Vec<DeviceValue> = group
                    .iter()
                    .filter_map(|e| {
                        Some(DeviceValue {
                            device: e.device.to_string(),
                            value: e.value?,
                        })
                    })
                    .collect();
                // Ties go to the first device in natural order.
                let min = measured
                    .iter()
                    .fold(None::<&DeviceValue>, |best, d| match best {
                        Some(b) if b.value <= d.value => Some(b),
                        _ => Some(d),
                    })
                    .cloned();
                let max = measured
                    .iter()
                    .fold(None::<&DeviceValue>, |best, d| match best {
                        Some(b) if b.value >= d.value => Some(b),
                        _ => Some(d),
                    })
                    .cloned();
                Row {
                    op,
                    load: load.to_string(),
                    min,
                    max,
                    measured: measured.len(),
                    failed: group
                        .iter()
                        .filter(|e| e.value.is_none())
                        .map(|e| {
                            (
                                e.device.to_string(),
                                e.error.unwrap_or("no sample").to_string(),
                            )
                        })
                        .collect(),
                }
            })
            .collect();
        BasicsTable {
            rows,
            unavailable: unavailable.to_vec(),
        }
    }

    /// One line per weak device: `matmul (SGEMM), idle: device 1 at 20.0 TFLOPS, 0.40 x
    /// device 0 (50.0)`.
    pub fn findings(&self) -> Vec<String> {
        self.rows
            .iter()
            .filter_map(|row| {
                let weak = row.weak()?;
                let best = row.max.as_ref()?;
                Some(format!(
                    "{}, {}: device {} at {:.1} {unit}, {:.2} x device {} ({:.1})",
                    row.op.title(),
                    row.load,
                    weak.device,
                    row.op.scaled(weak.value),
                    row.spread().unwrap_or_default(),
                    best.device,
                    row.op.scaled(best.value),
                    unit = row.op.unit(),
                ))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry<'a>(load: &'a str, op: Op, device: &'a str, value: Option<f64>) -> Entry<'a> {
        Entry {
            load,
            op,
            device,
            value,
            error: value.is_none().then_some("cublasSgemm_v2 failed"),
        }
    }

    #[test]
    fn rows_name_the_slowest_and_fastest_device_per_load_and_flag_a_weak_one() {
        let loads = ["idle".to_string(), "device".to_string()];
        let entries = [
            entry("device", Op::Matmul, "0", Some(24.8e12)),
            entry("device", Op::Matmul, "1", Some(24.0e12)),
            entry("idle", Op::Matmul, "10", Some(29.1e12)),
            entry("idle", Op::Matmul, "2", Some(12.0e12)),
            entry("idle", Op::Matmul, "0", Some(29.1e12)),
            entry("idle", Op::D2d, "0", Some(421e9)),
            entry("idle", Op::D2d, "2", None),
            // Device 1 in two pairs: once, at the weaker.
            entry("idle", Op::Allgather, "0", Some(13.7e9)),
            entry("idle", Op::Allgather, "1", Some(13.7e9)),
            entry("idle", Op::Allgather, "1", Some(6.0e9)),
            entry("idle", Op::Allgather, "2", Some(6.0e9)),
        ];
        let t = BasicsTable::of(&entries, &loads, &[(Op::Allgather, "one device".into())]);
        type Extremes<'a> = (Op, &'a str, Option<&'a str>, Option<&'a str>, usize);
        let got: Vec<Extremes> = t
            .rows
            .iter()
            .map(|r| {
                (
                    r.op,
                    r.load.as_str(),
                    r.min.as_ref().map(|d| d.device.as_str()),
                    r.max.as_ref().map(|d| d.device.as_str()),
                    r.failed.len(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (Op::Matmul, "idle", Some("2"), Some("0"), 0),
                (Op::Matmul, "device", Some("1"), Some("0"), 0),
                (Op::D2d, "idle", Some("0"), Some("0"), 1),
                (Op::Allgather, "idle", Some("1"), Some("0"), 0),
            ]
        );
        assert_eq!(t.rows[3].measured, 3);
        assert_eq!(
            t.findings(),
            [
                "matmul (SGEMM), idle: device 2 at 12.0 TFLOPS, 0.41 x device 0 (29.1)",
                "allgather (2 ranks), idle: device 1 at 6.0 GB/s, 0.44 x device 0 (13.7)"
            ]
        );
        assert_eq!(
            t.rows[2].failed,
            [("2".into(), "cublasSgemm_v2 failed".into())]
        );
        assert_eq!(t.unavailable, [(Op::Allgather, "one device".to_string())]);
        // 24.0 of 24.8 is within the ratio: no finding for the device-load row.
        assert!(t.rows[1].weak().is_none());
    }

    #[test]
    fn ops_parse_and_scale() {
        for op in Op::ALL {
            assert_eq!(op.as_str().parse::<Op>(), Ok(op));
        }
        assert!("tflops".parse::<Op>().unwrap_err().contains("matmul, h2d"));
        assert_eq!(Op::Matmul.scaled(29.1e12), 29.1);
        assert_eq!(Op::H2d.scaled(27e9), 27.0);
    }
}
