//! The fabric report of many nodes' results (`chd report` on the `fabric/` directories of a
//! fleet's state directories, or of `chd probe fabric --out`): `fabric.md` (the node x node
//! matrix, its slow pairs, the nodes that are the common factor of their slow pairs and the
//! paths slow between two otherwise fine nodes, every rail of every pair), `fabric.csv` (one
//! row per run, pair, rail and direction) and `fabric.png` (the node x node heatmap).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::{png, save, ReportError, Written};
use crate::analysis::fabric::{matrix_findings, node_matrix, NodeMatrix, PAIR_SLOW_RATIO};
use crate::analysis::heatmap::{HeatCell, Heatmap};
use crate::format::fabric::{FabricRecord, KEEP_PER_PEER};

pub const SUMMARY_FILE: &str = "fabric.md";
pub const CSV_FILE: &str = "fabric.csv";
pub const PNG_FILE: &str = "fabric.png";

/// Write the fabric report of `records` into `out`.
pub fn write(records: &[FabricRecord], out: &Path) -> Result<Written, ReportError> {
    std::fs::create_dir_all(out).map_err(|source| ReportError::Write {
        path: out.into(),
        source,
    })?;
    let m = node_matrix(records, KEEP_PER_PEER);
    let f = matrix_findings(&m);
    let mut files: Vec<PathBuf> = Vec::new();
    let map = heatmap(&m);
    let png_path = out.join(PNG_FILE);
    png::write(&map, &png_path)?;
    files.push(png_path);
    files.push(save(out.join(CSV_FILE), &csv(records))?);

    let mut findings = Vec::new();
    for (node, slow, measured) in &f.slow_nodes {
        findings.push(format!(
            "node {node} is slow with {slow} of its {measured} measured directions to and from its peers: the common factor of its slow pairs"
        ));
    }
    for (a, b) in &f.slow_paths {
        let ratio = f
            .slow_pairs
            .iter()
            .find(|(k, _)| k.0 == *a && k.1 == *b)
            .map_or(0.0, |(_, r)| *r);
        findings.push(format!(
            "{a} -> {b} carries {:.2} x the median pair while both nodes are fine with their other peers: the path between them (cable, switch port, route)",
            ratio
        ));
    }
    for ((a, b), rails) in &m.slow_rails {
        findings.push(format!(
            "{a} -> {b}: rail{} {} below {PAIR_SLOW_RATIO} x the node's other rails",
            if rails.len() == 1 { "" } else { "s" },
            rails.join(", ")
        ));
    }

    let mut md = String::new();
    let _ = writeln!(md, "# Fabric between nodes\n");
    let runs: std::collections::BTreeSet<&str> = records.iter().map(|r| r.run.as_str()).collect();
    let failed = records
        .iter()
        .filter(|r| r.outcome == crate::format::fabric::Outcome::Failed)
        .count();
    let _ = writeln!(
        md,
        "{} nodes, {} runs ({} records, {} of them failed runs), {} measured directions of node pairs; a cell is what the row's node sent to the column's node, all rails together, GB/s (median of the last {KEEP_PER_PEER} runs).\n",
        m.nodes.len(),
        runs.len(),
        records.len(),
        failed,
        m.cells.len()
    );
    if let Some(median) = f.median {
        let _ = writeln!(
            md,
            "Median pair: {median:.3} GB/s; slow: below {PAIR_SLOW_RATIO} x.\n"
        );
    }
    let _ = writeln!(md, "## Findings\n");
    if findings.is_empty() {
        let _ = writeln!(
            md,
            "None: no pair below {PAIR_SLOW_RATIO} x the median pair, no slow rail.\n"
        );
    }
    for line in &findings {
        let _ = writeln!(md, "- {line}");
    }
    let _ = writeln!(md, "\n## Node x node (GB/s, sender x receiver)\n");
    let _ = write!(md, "| sender \\ receiver |");
    for n in &m.nodes {
        let _ = write!(md, " {n} |");
    }
    let _ = writeln!(md);
    let _ = writeln!(md, "|---|{}", "---|".repeat(m.nodes.len()));
    for a in &m.nodes {
        let _ = write!(md, "| {a} |");
        for b in &m.nodes {
            let cell = match m.cells.get(&(a.clone(), b.clone())) {
                Some(v) if f.slow_pairs.iter().any(|(k, _)| k.0 == *a && k.1 == *b) => {
                    format!("**{v:.3}**")
                }
                Some(v) => format!("{v:.3}"),
                None if a == b => "-".into(),
                None => " ".into(),
            };
            let _ = write!(md, " {cell} |");
        }
        let _ = writeln!(md);
    }
    let _ = writeln!(md, "\nBold: below {PAIR_SLOW_RATIO} x the median pair. Blank: not measured (not zero). Every rail of every run is in {CSV_FILE}; the picture is {PNG_FILE}.");
    files.push(save(out.join(SUMMARY_FILE), &md)?);
    Ok(Written { files, findings })
}

/// The matrix as a heatmap: rows senders, columns receivers.
fn heatmap(m: &NodeMatrix) -> Heatmap {
    let mut cells = Vec::with_capacity(m.nodes.len() * m.nodes.len());
    for a in &m.nodes {
        for b in &m.nodes {
            cells.push(match m.cells.get(&(a.clone(), b.clone())) {
                Some(v) => HeatCell::Value {
                    gbps: *v,
                    samples: 1,
                },
                None => HeatCell::Empty,
            });
        }
    }
    let max = m.cells.values().copied().fold(0.0, f64::max);
    Heatmap {
        title: format!("Fabric: {} nodes, all rails, GB/s", m.nodes.len()),
        row_word: "sending node".into(),
        col_word: "receiving node".into(),
        rows: m.nodes.clone(),
        cols: m.nodes.clone(),
        cells,
        row_groups: Vec::new(),
        col_groups: Vec::new(),
        max: if max > 0.0 { max } else { 1.0 },
        block: 1,
    }
}

/// One row per run, pair, rail and direction, with the rail's RDMA port, the CPUs its
/// streams ran on and the device its side ran on (device backends) where the record names
/// them.
fn csv(records: &[FabricRecord]) -> String {
    let mut out = String::from(
        "run,node,peer,rail,direction,peer_rail,gbps,bytes,streams,slow,outcome,error,rdma_port,cpus,device\n",
    );
    let quote = |s: &str| {
        if s.contains([',', '"', '\n']) {
            format!("\"{}\"", s.replace('"', "\"\""))
        } else {
            s.to_string()
        }
    };
    for r in records {
        if r.rails.is_empty() {
            let _ = writeln!(
                out,
                "{},{},{},,,,,,,,{},{},,,",
                quote(&r.run),
                quote(&r.node),
                quote(&r.peer),
                r.outcome.as_str(),
                quote(r.error.as_deref().unwrap_or(""))
            );
        }
        for rail in &r.rails {
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                quote(&r.run),
                quote(&r.node),
                quote(&r.peer),
                quote(&rail.rail),
                rail.way.as_str(),
                quote(rail.peer_rail.as_deref().unwrap_or("")),
                rail.gbps.map_or(String::new(), |g| format!("{g:.6}")),
                rail.bytes,
                rail.streams,
                rail.slow,
                r.outcome.as_str(),
                quote(rail.error.as_deref().unwrap_or("")),
                quote(rail.rdma_port.as_deref().unwrap_or("")),
                quote(rail.cpus.as_deref().unwrap_or("")),
                quote(rail.device.as_deref().unwrap_or(""))
            );
        }
    }
    out
}
