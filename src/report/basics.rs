//! The basic validation table of a `chd probe basics` run in the report: the
//! [`BasicsTable`] of the dataset's basics cells (slowest and fastest device per measurement
//! and load profile) as a `summary.md` section with a per-device table, and `basics.csv`
//! (one line per device, measurement and load profile, in each measurement's own unit).
//! What the run could not measure at all is said, never shown as zeros.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::csv::field;
use crate::analysis::basics::{BasicsTable, Op};
use crate::dataset::Dataset;
use crate::topology::natural::natural_key;

/// The basics CSV file.
pub const CSV_FILE: &str = "basics.csv";

/// The CSV's header line.
pub const COLUMNS: &str =
    "load,measurement,unit,device,cpu,numa_node,value,samples,failed,last_error";

use crate::dataset::cells::{
    basics_cells as cells, basics_devices_of as devices_of, basics_loads as loads,
};

/// The table of `ds`, or none when it holds no basics run (`dataset::cells::basics_table`).
pub fn table(ds: &Dataset) -> Option<BasicsTable> {
    crate::dataset::cells::basics_table(ds)
}

fn value(op: Op, v: f64) -> String {
    format!("{:.1}", op.scaled(v))
}

/// The `## Basic validation` section of `summary.md`, if `ds` holds a basics run.
pub fn section(s: &mut String, ds: &Dataset) {
    let Some(table) = table(ds) else { return };
    let _ = writeln!(
        s,
        "## Basic validation\n\nPer measurement and load profile, the slowest and the fastest \
         device (each device's median of its samples). A slowest device below {} x the fastest \
         is a finding.\n\n| measurement | unit | load | slowest | fastest | slowest / fastest \
         | devices | failed |\n|---|---|---|---|---|---|---|---|",
        crate::analysis::basics::WEAK_DEVICE_RATIO
    );
    for row in &table.rows {
        let at = |d: &Option<crate::analysis::basics::DeviceValue>| {
            d.as_ref()
                .map(|d| format!("{} (device {})", value(row.op, d.value), d.device))
                .unwrap_or_else(|| "-".into())
        };
        let failed: Vec<String> = row
            .failed
            .iter()
            .map(|(d, why)| format!("device {d}: {}", why.replace('|', "/")))
            .collect();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            row.op.title(),
            row.op.unit(),
            row.load,
            at(&row.min),
            at(&row.max),
            row.spread()
                .map(|r| format!("{r:.2}"))
                .unwrap_or_else(|| "-".into()),
            row.measured,
            if failed.is_empty() {
                "-".to_string()
            } else {
                failed.join("; ")
            }
        );
    }
    for (op, why) in &table.unavailable {
        let _ = writeln!(s, "\n**Not measured: {}.** {why}", op.title());
    }
    per_device(s, ds);
    s.push('\n');
}

/// Every device's value per measurement and load profile.
fn per_device(s: &mut String, ds: &Dataset) {
    let cells = cells(ds);
    let loads = loads(ds);
    let mut columns: Vec<(Op, &str)> = Vec::new();
    let mut values: BTreeMap<(&str, Op, &str), String> = BTreeMap::new();
    for load in &loads {
        for op in Op::ALL {
            if cells
                .iter()
                .any(|(o, c)| *o == op && c.matrix.load == *load)
            {
                columns.push((op, load));
            }
        }
    }
    let mut devices: Vec<&str> = Vec::new();
    for (op, c) in &cells {
        for d in devices_of(c) {
            if !devices.contains(&d) {
                devices.push(d);
            }
            let text = c
                .value()
                .map(|v| value(*op, v))
                .unwrap_or_else(|| "failed".into());
            values.insert((d, *op, c.matrix.load.as_str()), text);
        }
    }
    if devices.is_empty() {
        return;
    }
    devices.sort_by_key(|d| natural_key(d));
    let heads: Vec<String> = columns
        .iter()
        .map(|(op, load)| format!("{} {} ({load})", op.as_str(), op.unit()))
        .collect();
    let _ = writeln!(
        s,
        "\nPer device:\n\n| device | {} |\n|---|{}",
        heads.join(" | "),
        "---|".repeat(columns.len())
    );
    for d in devices {
        let row: Vec<&str> = columns
            .iter()
            .map(|(op, load)| {
                values
                    .get(&(d, *op, *load))
                    .map(String::as_str)
                    .unwrap_or("-")
            })
            .collect();
        let _ = writeln!(s, "| {d} | {} |", row.join(" | "));
    }
}

/// `basics.csv`, if `ds` holds a basics run: one line per cell (an allgather's line names its
/// pair), the value in the measurement's unit (TFLOPS, GB/s).
pub fn csv(ds: &Dataset) -> Option<String> {
    let cells = cells(ds);
    if cells.is_empty() {
        return None;
    }
    let numa = ds.numa_map();
    let mut out = format!("{COLUMNS}\n");
    for (op, c) in cells {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{}",
            field(&c.matrix.load),
            op.as_str(),
            op.unit(),
            field(&c.device),
            c.cpu,
            numa.get(&c.cpu).map(|n| n.to_string()).unwrap_or_default(),
            c.value()
                .map(|v| format!("{:.3}", op.scaled(v)))
                .unwrap_or_default(),
            c.samples.len(),
            c.errors.len(),
            c.errors.last().map(|e| field(e)).unwrap_or_default(),
        );
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::{CellResult, MatrixId};

    fn cell(op: &str, load: &str, device: &str, v: Option<f64>) -> CellResult {
        CellResult {
            matrix: MatrixId {
                kind: crate::format::run_dir::MatrixKind::Basics,
                size_bytes: 1 << 20,
                direction: op.into(),
                host_memory: "device".into(),
                load: load.into(),
                pair: None,
            },
            cpu: 0,
            peer_cpu: None,
            device: device.into(),
            samples: v.into_iter().collect(),
            errors: if v.is_none() {
                vec!["not supported: no same-device copy".into()]
            } else {
                vec![]
            },
        }
    }

    #[test]
    fn the_section_names_extremes_pairs_count_for_both_devices_and_what_was_not_measured() {
        let ds = Dataset {
            cells: vec![
                cell("matmul", "idle", "0", Some(50e12)),
                cell("matmul", "idle", "1", Some(20e12)),
                cell("d2d", "idle", "0", None),
                cell("allgather", "idle", "0,1", Some(13.7e9)),
                cell("matmul", "device", "0", Some(45e12)),
            ],
            basics_unavailable: vec![("h2d".into(), "because".into())],
            ..Dataset::default()
        };
        let mut s = String::new();
        section(&mut s, &ds);
        assert!(
            s.contains("| matmul (SGEMM) | TFLOPS | idle | 20.0 (device 1) | 50.0 (device 0) | 0.40 | 2 | - |"),
            "{s}"
        );
        assert!(
            s.contains("| allgather (2 ranks) | GB/s | idle | 13.7 (device 0) | 13.7 (device 0) | 1.00 | 2 | - |"),
            "{s}"
        );
        assert!(
            s.contains("| D2D copy (same device) | GB/s | idle | - | - | - | 0 | device 0: not supported: no same-device copy |"),
            "{s}"
        );
        assert!(s.contains("**Not measured: H2D copy.** because"), "{s}");
        assert!(s.contains("| device | matmul TFLOPS (idle) | d2d GB/s (idle) | allgather GB/s (idle) | matmul TFLOPS (device) |"), "{s}");
        assert!(s.contains("| 1 | 20.0 | - | 13.7 | - |"), "{s}");
        let csv = csv(&ds).unwrap();
        assert!(csv.starts_with(COLUMNS), "{csv}");
        assert!(
            csv.contains("idle,matmul,TFLOPS,1,0,,20.000,1,0,\n"),
            "{csv}"
        );
        assert!(
            csv.contains("idle,allgather,GB/s,\"0,1\",0,,13.700,1,0,\n"),
            "{csv}"
        );
        assert!(table(&Dataset::default()).is_none());
    }
}
