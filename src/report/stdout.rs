//! A run's cells as `chd probe` prints them without `--out`: a table for people, or CSV or
//! JSON for programs, in the shape of the kind's layout (`probe::kind::Layout`). Every JSON
//! row is a typed record; its fields are declared in the (alphabetical) order chd has always
//! printed them, so the output of a kind does not change with this module.

use std::fmt::Write;

use serde::Serialize;

use crate::analysis::basics::Op;
use crate::dataset::{size_label, CellResult, Dataset};
use crate::format::run_dir::MatrixKind;
use crate::probe::kind::Layout;
use crate::probe::kinds;
use crate::topology::natural::natural_key;
use crate::vocab::{Bandwidth, OrderedPair};

/// What `--format` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Table,
    Csv,
    Json,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Format, String> {
        match s {
            "table" => Ok(Format::Table),
            "csv" => Ok(Format::Csv),
            "json" => Ok(Format::Json),
            other => Err(format!("{other:?} is not one of table, csv, json")),
        }
    }
}

/// A copy cell (core x device matrix, same-device copies).
#[derive(Serialize)]
struct CopyRow<'a> {
    bytes_per_second: Option<f64>,
    cpu: u32,
    device: &'a str,
    direction: &'a str,
    error: Option<&'a str>,
    host_memory: &'a str,
    load: &'a str,
    numa_node: Option<u32>,
    samples: usize,
    size_bytes: u64,
}

/// A core-pair cell.
#[derive(Serialize)]
struct PairRow<'a> {
    bytes_per_second: Option<f64>,
    error: Option<&'a str>,
    load: &'a str,
    operation: &'a str,
    pair: &'a str,
    rank0_cpu: u32,
    rank0_numa_node: Option<u32>,
    rank1_cpu: Option<u32>,
    rank1_numa_node: Option<u32>,
    samples: usize,
    size_bytes: u64,
}

/// An ordered peer copy.
#[derive(Serialize)]
struct PeerRow<'a> {
    bytes_per_second: Option<f64>,
    cpu: u32,
    dst: Option<String>,
    error: Option<&'a str>,
    method: Option<&'a str>,
    pair: &'a str,
    path: Option<&'a str>,
    samples: usize,
    size_bytes: u64,
    src: Option<String>,
}

/// One measurement of the basic validation table.
#[derive(Serialize)]
struct BasicsRow<'a> {
    cpu: u32,
    device: &'a str,
    error: Option<&'a str>,
    load: &'a str,
    measurement: &'a str,
    numa_node: Option<u32>,
    samples: usize,
    size_bytes: u64,
    unit: Option<&'static str>,
    value: Option<f64>,
}

/// One point of a size curve.
#[derive(Serialize)]
struct SweepRow<'a> {
    bytes_per_second: Option<f64>,
    device: &'a str,
    error: Option<&'a str>,
    failed: usize,
    flags: String,
    op: &'a str,
    plateau: bool,
    samples: usize,
    size_bytes: u64,
    spread: Option<f64>,
}

/// GB/s with two decimals, `-` for no value.
fn gbps(v: Option<f64>) -> String {
    v.map(|v| Bandwidth::from_bytes_per_second(v).to_string())
        .unwrap_or_else(|| "-".into())
}

/// Rows of any record type as pretty JSON, one line feed after.
fn json<T: Serialize>(rows: &[T]) -> Result<String, serde_json::Error> {
    serde_json::to_string_pretty(rows).map(|t| t + "\n")
}

fn last_error(c: &CellResult) -> Option<&str> {
    c.errors.last().map(String::as_str)
}

/// The cells of a `kind` run in `format`.
pub fn render(ds: &Dataset, kind: MatrixKind, format: Format) -> Result<String, serde_json::Error> {
    let numa = ds.numa_map();
    let node = |cpu: u32| {
        numa.get(&cpu)
            .map(|n| n.to_string())
            .unwrap_or_else(|| "-".into())
    };
    let mut cells: Vec<&CellResult> = ds.cells.iter().collect();
    cells.sort_by(|a, b| {
        (&a.matrix, a.cpu, natural_key(&a.device), a.peer_cpu).cmp(&(
            &b.matrix,
            b.cpu,
            natural_key(&b.device),
            b.peer_cpu,
        ))
    });
    let layout = kinds::of(kind).layout();
    let mut out = String::new();
    match (format, layout) {
        (Format::Csv, Layout::Curves) => {
            out.push_str(&super::sweep::render_csv(&super::sweep::curves(ds)))
        }
        (Format::Csv, Layout::Table) => out.push_str(&super::basics::csv(ds).unwrap_or_default()),
        (Format::Csv, _) => out.push_str(&super::csv::render(ds)),
        (Format::Json, Layout::Table) => {
            let rows: Vec<BasicsRow> = cells
                .iter()
                .map(|c| {
                    let op: Option<Op> = c.matrix.direction.parse().ok();
                    BasicsRow {
                        measurement: &c.matrix.direction,
                        unit: op.map(|o| if o == Op::Matmul { "flop/s" } else { "bytes/s" }),
                        device: &c.device,
                        cpu: c.cpu,
                        numa_node: numa.get(&c.cpu).copied(),
                        size_bytes: c.matrix.size_bytes,
                        load: &c.matrix.load,
                        value: c.value(),
                        samples: c.samples.len(),
                        error: last_error(c),
                    }
                })
                .collect();
            out = json(&rows)?;
        }
        (Format::Json, Layout::Curves) => {
            let curves = super::sweep::curves(ds);
            let rows: Vec<SweepRow> = curves
                .iter()
                .flat_map(|c| {
                    c.points.iter().map(move |p| SweepRow {
                        op: &c.op,
                        device: &c.device,
                        size_bytes: p.size_bytes,
                        bytes_per_second: p.median,
                        spread: p.spread,
                        samples: p.samples,
                        failed: p.failed,
                        flags: super::sweep::flags(p),
                        plateau: c.plateau == Some(p.size_bytes),
                        error: p.last_error.as_deref(),
                    })
                })
                .collect();
            out = json(&rows)?;
        }
        (Format::Table, Layout::Table) => {
            let table = super::basics::table(ds).unwrap_or_default();
            let _ = writeln!(
                out,
                "{:<24} {:>6} {:>10} {:>20} {:>20} {:>6}",
                "measurement", "unit", "load", "slowest", "fastest", "ratio"
            );
            for row in &table.rows {
                let at = |d: &Option<crate::analysis::basics::DeviceValue>| {
                    d.as_ref()
                        .map(|d| format!("{:.1} (dev {})", row.op.scaled(d.value), d.device))
                        .unwrap_or_else(|| "-".into())
                };
                let _ = writeln!(
                    out,
                    "{:<24} {:>6} {:>10} {:>20} {:>20} {:>6}",
                    row.op.title(),
                    row.op.unit(),
                    row.load,
                    at(&row.min),
                    at(&row.max),
                    row.spread()
                        .map(|r| format!("{r:.2}"))
                        .unwrap_or_else(|| "-".into())
                );
            }
            for (op, why) in &table.unavailable {
                let _ = writeln!(out, "not measured: {}: {why}", op.title());
            }
        }
        (Format::Table, Layout::Curves) => {
            let _ = writeln!(
                out,
                "{:>9} {:>7} {:>8} {:>9} {:>7} {:>7}  note",
                "op", "device", "size", "GB/s", "spread", "samples"
            );
            for c in super::sweep::curves(ds) {
                for p in &c.points {
                    let mut note = super::sweep::flags(p);
                    if c.plateau == Some(p.size_bytes) {
                        note.push_str(" plateau");
                    }
                    if let Some(e) = p.last_error.as_deref().filter(|_| p.median.is_none()) {
                        note.push(' ');
                        note.push_str(e);
                    }
                    let _ = writeln!(
                        out,
                        "{:>9} {:>7} {:>8} {:>9} {:>7} {:>7}  {}",
                        c.op,
                        c.device,
                        size_label(p.size_bytes),
                        gbps(p.median),
                        p.spread
                            .map(|s| format!("{:.1}%", s * 100.0))
                            .unwrap_or_else(|| "-".into()),
                        p.samples,
                        note.trim()
                    );
                }
            }
        }
        (Format::Json, Layout::CpuByDevice | Layout::Devices) => {
            let rows: Vec<CopyRow> = cells
                .iter()
                .map(|c| CopyRow {
                    cpu: c.cpu,
                    numa_node: numa.get(&c.cpu).copied(),
                    device: &c.device,
                    size_bytes: c.matrix.size_bytes,
                    direction: &c.matrix.direction,
                    host_memory: &c.matrix.host_memory,
                    load: &c.matrix.load,
                    bytes_per_second: c.value(),
                    samples: c.samples.len(),
                    error: last_error(c),
                })
                .collect();
            out = json(&rows)?;
        }
        (Format::Json, Layout::CpuPairs) => {
            let rows: Vec<PairRow> = cells
                .iter()
                .map(|c| PairRow {
                    pair: &c.device,
                    rank0_cpu: c.cpu,
                    rank0_numa_node: numa.get(&c.cpu).copied(),
                    rank1_cpu: c.peer_cpu,
                    rank1_numa_node: c.peer_cpu.and_then(|p| numa.get(&p).copied()),
                    size_bytes: c.matrix.size_bytes,
                    operation: &c.matrix.direction,
                    load: &c.matrix.load,
                    bytes_per_second: c.value(),
                    samples: c.samples.len(),
                    error: last_error(c),
                })
                .collect();
            out = json(&rows)?;
        }
        (Format::Table, Layout::CpuByDevice | Layout::Devices) => {
            let _ = writeln!(
                out,
                "{:>5} {:>4} {:>7} {:>8} {:>4} {:>8} {:>8} {:>9} {:>7}  note",
                "cpu", "numa", "device", "size", "dir", "memory", "load", "GB/s", "samples"
            );
            for c in cells {
                let _ = writeln!(
                    out,
                    "{:>5} {:>4} {:>7} {:>8} {:>4} {:>8} {:>8} {:>9} {:>7}  {}",
                    c.cpu,
                    node(c.cpu),
                    c.device,
                    size_label(c.matrix.size_bytes),
                    c.matrix.direction,
                    c.matrix.host_memory,
                    c.matrix.load,
                    gbps(c.value()),
                    c.samples.len(),
                    last_error(c).unwrap_or("")
                );
            }
        }
        (Format::Json, Layout::SourceByDestination) => {
            let rows: Vec<PeerRow> = cells
                .iter()
                .map(|c| {
                    let pair = c.device.parse::<OrderedPair>().ok();
                    PeerRow {
                        pair: &c.device,
                        src: pair.as_ref().map(|p| p.src().to_string()),
                        dst: pair.as_ref().map(|p| p.dst().to_string()),
                        path: ds.p2p_paths.get(&c.device).map(String::as_str),
                        method: ds.p2p_methods.get(&c.device).map(String::as_str),
                        cpu: c.cpu,
                        size_bytes: c.matrix.size_bytes,
                        bytes_per_second: c.value(),
                        samples: c.samples.len(),
                        error: last_error(c),
                    }
                })
                .collect();
            out = json(&rows)?;
        }
        (Format::Table, Layout::SourceByDestination) => {
            let _ = writeln!(
                out,
                "{:>5} {:>5} {:>7} {:>11} {:>8} {:>9} {:>7}  note",
                "src", "dst", "path", "method", "size", "GB/s", "samples"
            );
            for c in cells {
                let pair = c.device.parse::<OrderedPair>().ok();
                let (src, dst) = pair.as_ref().map_or(("?", "?"), |p| (p.src(), p.dst()));
                let _ = writeln!(
                    out,
                    "{:>5} {:>5} {:>7} {:>11} {:>8} {:>9} {:>7}  {}",
                    src,
                    dst,
                    ds.p2p_paths
                        .get(&c.device)
                        .map(String::as_str)
                        .unwrap_or("-"),
                    ds.p2p_methods
                        .get(&c.device)
                        .map(String::as_str)
                        .unwrap_or("-"),
                    size_label(c.matrix.size_bytes),
                    gbps(c.value()),
                    c.samples.len(),
                    last_error(c).unwrap_or("")
                );
            }
        }
        (Format::Table, Layout::CpuPairs) => {
            let _ = writeln!(
                out,
                "{:>7} {:>5} {:>5} {:>5} {:>5} {:>8} {:>9} {:>9} {:>7}  note",
                "pair", "cpu0", "numa0", "cpu1", "numa1", "size", "operation", "GB/s", "samples"
            );
            for c in cells {
                let peer = c.peer_cpu;
                let _ = writeln!(
                    out,
                    "{:>7} {:>5} {:>5} {:>5} {:>5} {:>8} {:>9} {:>9} {:>7}  {}",
                    c.device,
                    c.cpu,
                    node(c.cpu),
                    peer.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
                    peer.map(node).unwrap_or_else(|| "-".into()),
                    size_label(c.matrix.size_bytes),
                    c.matrix.direction,
                    gbps(c.value()),
                    c.samples.len(),
                    last_error(c).unwrap_or("")
                );
            }
        }
    }
    Ok(out)
}
