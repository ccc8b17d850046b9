//! A ClusterHealthDetect workbook ([`crate::format::cluster_health_workbook`]) as a
//! [`Dataset`], through the recording a results file gives (so a workbook and its
//! `results.json` report alike):
//!
//! - `H2D_<size>MB`: one H2D cell per CPU row and device column (`npu:3` is device `3`), its
//!   one sample the tool's median; host memory `unspecified` (the sheet does not say).
//! - `D2D_<size>MB`: one pair cell per rank 0 CPU row and rank 1 CPU column; the sheet does
//!   not name the device pair, so the cells' pair is [`UNNAMED_PAIR`] (reported, not served).
//! - the NUMA affinity workbook's `Summary`: per bind policy and metric label
//!   (`h2d|copy|host_to_device|1MB|gbps`), one size-curve point whose setting is the policy,
//!   its samples the tool's min and max (and median, with three samples or more), so the
//!   policies are compared with the points' spread like sweep settings.
//! - `Affinity`: the CPU records (NUMA layout, bindable or not, the failed CPUs' reasons).
//!
//! Empty cells (no ok sample recorded) are counted in a note; a cell whose value is `nan`,
//! `inf` or text, and a row or column with no CPU or device, is a rejected row with its
//! reference. Sheets chd does not read are named in a note.

use std::collections::BTreeMap;

use super::Dataset;
use crate::format::cluster_health::{MatrixKind, RecordedSample, Recording, Rejected};
use crate::format::cluster_health_workbook::{cell_ref, Cell, MatrixSheet, Sheet, Workbook};

/// The device pair of a core-pair sheet, which the workbook does not record.
pub const UNNAMED_PAIR: &str = "pair-not-recorded";
/// The CPU of points whose file records none (a NUMA policy's point).
pub const UNRECORDED_CPU: u32 = u32::MAX;

/// Rejections by reason, with the first reference of each.
#[derive(Default)]
struct Rejections(BTreeMap<String, (usize, String)>);

impl Rejections {
    fn add(&mut self, reason: impl Into<String>, at: impl FnOnce() -> String) {
        let e = self.0.entry(reason.into()).or_insert_with(|| (0, at()));
        e.0 += 1;
    }

    fn into_vec(self) -> Vec<Rejected> {
        let mut v: Vec<Rejected> = self
            .0
            .into_iter()
            .map(|(reason, (count, first))| Rejected {
                reason,
                count,
                first,
            })
            .collect();
        v.sort_by_key(|r| std::cmp::Reverse(r.count));
        v
    }
}

/// `npu:3` -> `3`; a bare number stays.
fn device_of(label: &Cell) -> Option<String> {
    match label {
        Cell::Number(_) => label.whole().map(|d| d.to_string()),
        Cell::Text(t) => {
            let id = t.rsplit_once(':').map_or(t.as_str(), |(_, id)| id);
            id.parse::<u32>().ok().map(|d| d.to_string())
        }
        _ => None,
    }
}

fn mib(size_mb: f64) -> u64 {
    (size_mb * f64::from(1u32 << 20)).round() as u64
}

/// A value cell: bytes per second, or why not (`None` for an empty cell).
fn bandwidth(cell: &Cell) -> Option<Result<f64, String>> {
    match cell {
        Cell::Empty => None,
        Cell::Number(g) if *g > 0.0 && g.is_finite() => Some(Ok(g * 1e9)),
        Cell::Number(g) => Some(Err(format!("value {g} is not a positive bandwidth"))),
        Cell::Text(t) if ["nan", "inf", "-inf"].contains(&t.to_ascii_lowercase().as_str()) => {
            Some(Err(format!("value {t} (not a number)")))
        }
        other => Some(Err(format!("value {:?} is not a number", other.text()))),
    }
}

struct Builder<'a> {
    file: &'a str,
    rec: Recording,
    rejected: Rejections,
    empty: BTreeMap<String, usize>,
}

impl Builder<'_> {
    fn at(&self, sheet: &str, row: u32, col: u32) -> String {
        format!("{} {sheet}!{}", self.file, cell_ref(row, col))
    }

    fn matrix(&mut self, m: &MatrixSheet, pair: bool) {
        let columns: Vec<Option<String>> = m
            .columns
            .iter()
            .map(|c| {
                if pair {
                    c.whole().map(|c| c.to_string())
                } else {
                    device_of(c)
                }
            })
            .collect();
        if !pair {
            for c in m.columns.iter().filter_map(|c| match c {
                Cell::Text(t) => t.split_once(':').map(|(kind, _)| kind.to_string()),
                _ => None,
            }) {
                self.rec.device_kind.get_or_insert(c);
            }
            for d in columns.iter().flatten() {
                if !self.rec.devices.contains(d) {
                    self.rec.devices.push(d.clone());
                }
            }
        }
        let size_bytes = mib(m.size_mb);
        for row in &m.rows {
            let Some(cpu) = row.label.whole() else {
                if row.values.iter().any(|v| *v != Cell::Empty) || row.label != Cell::Empty {
                    let at = self.at(&m.name, row.row, 0);
                    self.rejected
                        .add(format!("{}: row label is not a CPU number", m.name), || at);
                }
                continue;
            };
            for (i, value) in row.values.iter().enumerate() {
                let col = i as u32 + 1;
                let Some(outcome) = bandwidth(value) else {
                    *self.empty.entry(m.name.clone()).or_default() += 1;
                    continue;
                };
                let Some(Some(column)) = columns.get(i) else {
                    let at = self.at(&m.name, row.row, col);
                    self.rejected.add(
                        format!(
                            "{}: column header names no {}",
                            m.name,
                            if pair { "rank 1 CPU" } else { "device" }
                        ),
                        || at,
                    );
                    continue;
                };
                let v = match outcome {
                    Ok(v) => v,
                    Err(why) => {
                        let at = self.at(&m.name, row.row, col);
                        self.rejected.add(format!("{}: {why}", m.name), || at);
                        continue;
                    }
                };
                let (device, peer_cpu) = if pair {
                    (UNNAMED_PAIR.to_string(), column.parse().ok())
                } else {
                    (column.clone(), None)
                };
                self.rec.samples.push(RecordedSample {
                    matrix: if pair {
                        MatrixKind::Pair
                    } else {
                        MatrixKind::H2d
                    },
                    load: "idle".into(),
                    cpu,
                    peer_cpu,
                    device,
                    size_bytes,
                    direction: if pair { "allgather" } else { "h2d" }.into(),
                    host_memory: "unspecified".into(),
                    outcome: Ok(v),
                });
            }
        }
    }

    fn policies(&mut self, rows: &[crate::format::cluster_health_workbook::PolicyRow]) {
        for r in rows {
            let at = || format!("{} Summary!A{}", self.file, r.row + 1);
            // test|operation|scope|<size>MB|field
            let parts: Vec<&str> = r.metric.split('|').collect();
            let size = parts
                .iter()
                .find_map(|p| p.strip_suffix("MB").and_then(|n| n.parse::<f64>().ok()));
            let (Some(test), Some(size)) = (parts.first(), size) else {
                let at = at();
                self.rejected.add(
                    "Summary: metric label has no test and <size>MB (test|operation|scope|<size>MB|field)",
                    || at,
                );
                continue;
            };
            let op = match *test {
                "collective" => "allgather",
                other => other,
            };
            let scope = parts.get(2).copied().unwrap_or("");
            let values: Vec<Option<f64>> = [&r.min, &r.median, &r.max]
                .iter()
                .map(|c| bandwidth(c).and_then(Result::ok))
                .collect();
            let count = r.count.whole().unwrap_or(0);
            let samples: Vec<f64> = match (values[0], values[1], values[2], count) {
                (_, Some(m), _, 1) => vec![m],
                (Some(lo), _, Some(hi), 2) => vec![lo, hi],
                (Some(lo), Some(m), Some(hi), _) => vec![lo, m, hi],
                _ => {
                    let at = at();
                    self.rejected.add(
                        "Summary: min, median or max is not a positive number",
                        || at,
                    );
                    continue;
                }
            };
            for v in samples {
                self.rec.samples.push(RecordedSample {
                    matrix: MatrixKind::Sweep,
                    load: format!("bind {}", r.policy),
                    cpu: UNRECORDED_CPU,
                    peer_cpu: None,
                    device: scope.to_string(),
                    size_bytes: mib(size),
                    direction: op.to_string(),
                    host_memory: "unspecified".into(),
                    outcome: Ok(v),
                });
            }
        }
    }
}

/// The dataset of a workbook; an error (the sheets and what each held) when nothing in it
/// can be reported.
pub fn dataset(wb: Workbook) -> Result<Dataset, String> {
    let file = wb
        .path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut b = Builder {
        file: &file,
        rec: Recording {
            files: vec![wb.path.clone()],
            ..Recording::default()
        },
        rejected: Rejections::default(),
        empty: BTreeMap::new(),
    };
    let mut notes = Vec::new();
    let mut cpus = Vec::new();
    let mut policy_points = false;
    for (name, sheet) in &wb.sheets {
        match sheet {
            Sheet::H2d(m) => b.matrix(m, false),
            Sheet::Pair(m) => {
                b.matrix(m, true);
                notes.push(format!(
                    "{name}: the workbook does not name the core-pair matrix's device pair; its \
                     cells are reported as pair {UNNAMED_PAIR} and not served"
                ));
            }
            Sheet::PolicySummary(rows) => {
                b.policies(rows);
                policy_points = true;
            }
            Sheet::MatrixSummary { rows } => notes.push(format!(
                "{name}: {rows} rows of per-cell count, min, median and max not read (the matrix \
                 sheets hold each cell's median, its one sample here)"
            )),
            Sheet::PolicyHeatmap { .. } => notes.push(format!(
                "{name}: the policies' medians, read with their spread from the Summary sheet"
            )),
            Sheet::NoMetrics => notes.push(format!(
                "{name}: the tool wrote \"No core matrix metrics found\" (no matrix in this workbook)"
            )),
            Sheet::Affinity {
                cpus: records,
                bad_rows,
            } => {
                cpus.extend(records.iter().cloned());
                for r in bad_rows {
                    b.rejected.add(format!("{name}: row without a CPU number"), || {
                        format!("{file} {name}!A{r}")
                    });
                }
                let failed: Vec<String> = records
                    .iter()
                    .filter(|c| c.bindable == Some(false))
                    .map(|c| match &c.reason {
                        Some(r) => format!("{} ({r})", c.cpu),
                        None => c.cpu.to_string(),
                    })
                    .collect();
                if !failed.is_empty() {
                    notes.push(format!(
                        "{name}: {} CPU{} not bindable: {}",
                        failed.len(),
                        if failed.len() == 1 { "" } else { "s" },
                        failed.join(", ")
                    ));
                }
            }
            Sheet::Other { name, why } => notes.push(format!("sheet {name} not read: {why}")),
        }
    }
    for (sheet, n) in &b.empty {
        notes.push(format!(
            "{sheet}: {n} empty cell{} (the tool recorded no ok sample there: failed or not \
             measured, the workbook does not say which)",
            if *n == 1 { "" } else { "s" }
        ));
    }
    if policy_points {
        notes.push(
            "NUMA policy points: each holds the Summary's min and max (and median from three \
             samples on) as its samples, which give its spread, not the tool's sample count"
                .to_string(),
        );
    }
    let mut rec = b.rec;
    rec.rejected = b.rejected.into_vec();
    rec.notes = notes;
    rec.meta = vec![(
        "sheets".to_string(),
        wb.sheets
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(", "),
    )];
    if rec.samples.is_empty() && cpus.is_empty() {
        let mut why: Vec<String> = rec
            .rejected
            .iter()
            .map(|r| format!("{} x{} (first: {})", r.reason, r.count, r.first))
            .collect();
        why.extend(rec.notes.iter().cloned());
        return Err(format!(
            "a ClusterHealthDetect workbook with nothing chd can report (sheets {}){}",
            rec.meta[0].1,
            if why.is_empty() {
                String::new()
            } else {
                format!(": {}", why.join("; "))
            }
        ));
    }
    crate::format::cluster_health::add_cpus(&mut rec, cpus);
    let mut ds = Dataset::from_recording(rec);
    ds.source = format!("ClusterHealthDetect workbook {}", wb.path.display());
    Ok(ds)
}
