//! The size curves of a `chd probe sweep` run in the report: the dataset's sweep cells as
//! [`crate::analysis::sweep`] curves, rendered as `sweep.csv` (one row per operation, device
//! and size), the "Size curves" section of `summary.md` and its findings. The picture is
//! [`super::sweep_png`]. Points are judged against the limits the run recorded for their
//! paths ([`Dataset::path_limits`]): implausible points and cache-resident regions are
//! flagged, counted and explained, and each curve says which sizes a matrix should use.

use std::fmt::Write;

use super::csv::field;
use crate::analysis::sweep::{
    self, Curve, Point, SettingComparison, CACHE_RESIDENT_RATIO, DIP_RATIO, PLATEAU_BAND,
    REMEASURE_SPREAD,
};
use crate::dataset::{size_label, Dataset};
use crate::probe::kind::Layout;
use crate::probe::kinds::layout;

/// The report's files for a sweep.
pub const SWEEP_CSV: &str = "sweep.csv";
pub const SWEEP_PNG: &str = "sweep.png";

/// The header line of `sweep.csv`.
pub const COLUMNS: &str = "op,device,size,size_bytes,gbps,bytes_per_second,spread,samples,failed,flags,limit_gbps,last_error";

/// The curves of the dataset's sweep cells (empty for other runs; `dataset::cells::sweep_curves`).
pub fn curves(ds: &Dataset) -> Vec<Curve> {
    crate::dataset::cells::sweep_curves(ds)
}

fn gbps(v: f64) -> String {
    crate::vocab::Bandwidth::from_bytes_per_second(v).to_string()
}

fn percent(v: f64) -> String {
    format!("{:.1}%", v * 100.0)
}

/// A point's flags, space-separated: `implausible`, `cache-resident`, `dip`, `re-measure`,
/// `unsupported`, `failed`.
pub fn flags(p: &Point) -> String {
    let mut f = Vec::new();
    if p.implausible.is_some() {
        f.push("implausible");
    }
    if p.cache_resident {
        f.push("cache-resident");
    }
    if p.dip {
        f.push("dip");
    }
    if p.remeasure {
        f.push("re-measure");
    }
    if p.unsupported {
        f.push("unsupported");
    } else if p.median.is_none() {
        f.push("failed");
    }
    f.join(" ")
}

/// `sweep.csv`.
pub fn render_csv(curves: &[Curve]) -> String {
    let mut out = String::from(COLUMNS);
    out.push('\n');
    for c in curves {
        for p in &c.points {
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{},{},{},{},{},{}",
                field(&c.op),
                field(&c.label()),
                size_label(p.size_bytes),
                p.size_bytes,
                p.median
                    .map(|v| format!("{:.3}", crate::vocab::Bandwidth::from_bytes_per_second(v)))
                    .unwrap_or_default(),
                p.median.map(|v| format!("{v:.0}")).unwrap_or_default(),
                p.spread.map(|s| format!("{s:.4}")).unwrap_or_default(),
                p.samples,
                p.failed,
                flags(p),
                p.implausible
                    .as_ref()
                    .map(|l| format!(
                        "{:.3}",
                        crate::vocab::Bandwidth::from_bytes_per_second(l.bytes_per_second)
                    ))
                    .unwrap_or_default(),
                p.last_error.as_deref().map(field).unwrap_or_default(),
            );
        }
    }
    out
}

/// `h2d device 0`.
fn name(c: &Curve) -> String {
    format!("{} device {}", c.op, c.label())
}

/// `16MiB, 32MiB` of `points`.
fn size_list<'a>(points: impl Iterator<Item = &'a Point>) -> String {
    let v: Vec<String> = points.map(|p| size_label(p.size_bytes)).collect();
    v.join(", ")
}

/// The range of the points' medians in GB/s: `1.30-2.20 TB/s` reads `1300.00-2200.00`.
fn value_range<'a>(points: impl Iterator<Item = &'a Point>) -> String {
    let v: Vec<f64> = points.filter_map(|p| p.median).collect();
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if v.len() == 1 || lo == hi {
        gbps(lo)
    } else {
        format!("{}-{}", gbps(lo), gbps(hi))
    }
}

/// The lines of one curve's physics and shape: its implausible points (each with its limit)
/// and its cache-resident region with the sizes a matrix should use.
fn shape_findings(c: &Curve) -> Vec<String> {
    let mut out = Vec::new();
    let implausible: Vec<&Point> = c.implausible().collect();
    if let Some(limit) = implausible.iter().find_map(|p| p.implausible.as_ref()) {
        out.push(format!(
            "{}: {} implausible point{} at {} ({} GB/s), above the path's limit of {} GB/s \
             ({}): a measurement fault, not a fast device; left out of the maximum, the \
             plateau and the comparisons",
            name(c),
            implausible.len(),
            if implausible.len() == 1 { "" } else { "s" },
            size_list(implausible.iter().copied()),
            value_range(implausible.iter().copied()),
            gbps(limit.bytes_per_second),
            limit.source,
        ));
    }
    let cached: Vec<&Point> = c.cache_resident().collect();
    if !cached.is_empty() {
        out.push(format!(
            "{}: cache-resident at {} ({} GB/s, above {CACHE_RESIDENT_RATIO} x the large-size \
             plateau of {} GB/s from {}): the copies stayed in a cache and measure it, not \
             the path; a matrix should use {}",
            name(c),
            size_list(cached.iter().copied()),
            value_range(cached.iter().copied()),
            c.plateau_level().map(gbps).unwrap_or_default(),
            c.plateau.map(size_label).unwrap_or_default(),
            matrix_sizes(c),
        ));
    }
    out
}

/// The sizes a matrix should use, for people: `128MiB, 256MiB` or `no size (no plateau)`.
fn matrix_sizes(c: &Curve) -> String {
    let sizes = c.matrix_sizes();
    if sizes.is_empty() {
        "no size yet (no plateau: extend --to or re-measure)".to_string()
    } else {
        let v: Vec<String> = sizes.into_iter().map(size_label).collect();
        v.join(", ")
    }
}

/// One line per implausible set of points, cache-resident region, dip, per curve with points
/// to re-measure, per operation the backend cannot do, and per curve with failed points.
pub fn findings(curves: &[Curve]) -> Vec<String> {
    let mut out = Vec::new();
    for c in curves {
        out.extend(shape_findings(c));
        for p in c.dips() {
            let (before, after) = c.around(p.size_bytes);
            out.push(format!(
                "dip at {}: {} reads {} GB/s, below {DIP_RATIO} x the curve on both sides ({} GB/s at smaller sizes, {} GB/s at larger): re-measure it",
                size_label(p.size_bytes),
                name(c),
                p.median.map(gbps).unwrap_or_default(),
                before.map(gbps).unwrap_or_default(),
                after.map(gbps).unwrap_or_default(),
            ));
        }
        let wide: Vec<String> = c
            .to_remeasure()
            .map(|p| {
                format!(
                    "{} ({})",
                    size_label(p.size_bytes),
                    p.spread.map(percent).unwrap_or_default()
                )
            })
            .collect();
        if !wide.is_empty() {
            out.push(format!(
                "{}: {} point{} to re-measure (spread above {} of the median): {}",
                name(c),
                wide.len(),
                if wide.len() == 1 { "" } else { "s" },
                percent(REMEASURE_SPREAD),
                wide.join(", ")
            ));
        }
        let failed: Vec<&Point> = c.failed().collect();
        if let Some(last) = failed.last() {
            out.push(format!(
                "{}: {} of {} points failed ({})",
                name(c),
                failed.len(),
                c.points.len(),
                last.last_error.as_deref().unwrap_or("no value")
            ));
        }
    }
    out.extend(setting_findings(&sweep::setting_differences(curves)));
    for (op, devices, why) in unsupported(curves) {
        out.push(format!(
            "{op} is not supported here (device{} {}): {why}; no {op} curve",
            if devices.len() == 1 { "" } else { "s" },
            devices.join(", ")
        ));
    }
    out
}

fn signed_percent(v: f64) -> String {
    format!("{:+.1}%", v * 100.0)
}

/// One line per setting compared with its baseline: the range of the differences and the
/// sizes whose difference exceeds the points' spread.
pub fn setting_findings(comparisons: &[SettingComparison]) -> Vec<String> {
    comparisons
        .iter()
        .filter(|c| !c.sizes.is_empty())
        .map(|c| {
            let lo = c
                .sizes
                .iter()
                .map(|d| d.difference)
                .fold(f64::INFINITY, f64::min);
            let hi = c
                .sizes
                .iter()
                .map(|d| d.difference)
                .fold(f64::NEG_INFINITY, f64::max);
            let beyond: Vec<String> = c
                .sizes
                .iter()
                .filter(|d| d.exceeds_spread() == Some(true))
                .map(|d| {
                    format!(
                        "{} {} > {}",
                        size_label(d.size_bytes),
                        signed_percent(d.difference),
                        d.spread.map(percent).unwrap_or_default()
                    )
                })
                .collect();
            let unknown = c.sizes.iter().filter(|d| d.spread.is_none()).count();
            let verdict = if !beyond.is_empty() {
                format!(
                    "{} of {} sizes differ by more than the points' spread: {}",
                    beyond.len(),
                    c.sizes.len(),
                    beyond.join(", ")
                )
            } else if unknown == c.sizes.len() {
                "no spread to judge the differences by (one sample per point and no plateau): \
                 repeat the sweeps"
                    .to_string()
            } else {
                "every difference is within the points' spread: not a difference the data can \
                 show; repeat the sweeps before tuning on it"
                    .to_string()
            };
            format!(
                "{} device {}: {} against {}: {} to {} over {} sizes; {verdict}",
                c.op,
                c.device,
                c.setting,
                if c.baseline.is_empty() {
                    "the baseline"
                } else {
                    &c.baseline
                },
                signed_percent(lo),
                signed_percent(hi),
                c.sizes.len(),
            )
        })
        .collect()
}

/// Per operation and device measured under several settings: one table, a row per size,
/// the baseline's GB/s and each setting's GB/s and difference (bold beyond the spread).
pub fn settings_section(curves: &[Curve]) -> String {
    let comparisons = sweep::setting_differences(curves);
    let mut s = String::new();
    let mut done: Vec<(&str, &str)> = Vec::new();
    for c in &comparisons {
        if done.contains(&(c.op.as_str(), c.device.as_str())) {
            continue;
        }
        done.push((&c.op, &c.device));
        let group: Vec<&SettingComparison> = comparisons
            .iter()
            .filter(|o| o.op == c.op && o.device == c.device)
            .collect();
        let _ = writeln!(
            s,
            "### {} device {}: settings compared\n\nEach setting's GB/s and its difference \
             from {}; **bold** where the difference exceeds the points' spread (theirs, or the \
             curves' plateau scatter when a point has one sample).\n",
            c.op,
            c.device,
            if c.baseline.is_empty() {
                "the baseline"
            } else {
                &c.baseline
            }
        );
        let _ = write!(
            s,
            "| size | {} |",
            if c.baseline.is_empty() {
                "baseline"
            } else {
                &c.baseline
            }
        );
        for g in &group {
            let _ = write!(s, " {} |", g.setting);
        }
        let _ = writeln!(s, " spread |\n|---|---|{}---|", "---|".repeat(group.len()));
        let mut sizes: Vec<u64> = group
            .iter()
            .flat_map(|g| g.sizes.iter().map(|d| d.size_bytes))
            .collect();
        sizes.sort_unstable();
        sizes.dedup();
        for size in sizes {
            let row: Vec<Option<&sweep::SettingDifference>> = group
                .iter()
                .map(|g| g.sizes.iter().find(|d| d.size_bytes == size))
                .collect();
            let Some(first) = row.iter().flatten().next() else {
                continue;
            };
            let _ = write!(s, "| {} | {} |", size_label(size), gbps(first.baseline));
            let mut spread = None::<f64>;
            for d in &row {
                match d {
                    None => s.push_str(" - |"),
                    Some(d) => {
                        spread = match (spread, d.spread) {
                            (Some(a), Some(b)) => Some(a.max(b)),
                            (a, b) => a.or(b),
                        };
                        let text = format!("{} ({})", gbps(d.value), signed_percent(d.difference));
                        if d.exceeds_spread() == Some(true) {
                            let _ = write!(s, " **{text}** |");
                        } else {
                            let _ = write!(s, " {text} |");
                        }
                    }
                }
            }
            let _ = writeln!(
                s,
                " {} |",
                spread.map(percent).unwrap_or_else(|| "-".into())
            );
        }
        s.push('\n');
    }
    s
}

/// Per operation the backend cannot do: the devices and the reason.
fn unsupported(curves: &[Curve]) -> Vec<(String, Vec<String>, String)> {
    let mut out: Vec<(String, Vec<String>, String)> = Vec::new();
    for c in curves.iter().filter(|c| c.unsupported()) {
        let why = c
            .points
            .iter()
            .find_map(|p| p.last_error.as_deref())
            .map(|e| {
                e.strip_prefix("not supported:")
                    .unwrap_or(e)
                    .trim()
                    .to_string()
            })
            .unwrap_or_default();
        match out.iter_mut().find(|(op, _, _)| *op == c.op) {
            Some(e) => e.1.push(c.device.clone()),
            None => out.push((c.op.clone(), vec![c.device.clone()], why)),
        }
    }
    out
}

/// The CPUs the points were measured from: (rank 0 / copy CPU, allgather rank 1 CPUs).
fn cpus(ds: &Dataset) -> (Vec<u32>, Vec<u32>) {
    let mut from: Vec<u32> = Vec::new();
    let mut peers: Vec<u32> = Vec::new();
    for c in ds
        .cells
        .iter()
        .filter(|c| layout(c.matrix.kind) == Layout::Curves)
    {
        if !from.contains(&c.cpu) && c.cpu != crate::dataset::workbook::UNRECORDED_CPU {
            from.push(c.cpu);
        }
        if let Some(p) = c.peer_cpu.filter(|p| !peers.contains(p)) {
            peers.push(p);
        }
    }
    from.sort_unstable();
    peers.sort_unstable();
    (from, peers)
}

fn cpu_list(ds: &Dataset, cpus: &[u32]) -> String {
    let list: Vec<String> = cpus
        .iter()
        .map(|c| match ds.numa_of(*c) {
            Some(n) => format!("{c} (NUMA {n})"),
            None => c.to_string(),
        })
        .collect();
    list.join(", ")
}

/// The "Size curves" section of `summary.md`: the definitions, one row per curve (plateau,
/// maximum, dips, points to re-measure, failures), then per operation the points by size
/// and device.
pub fn section(ds: &Dataset, curves: &[Curve], picture: &str) -> String {
    let mut s = String::from("## Size curves\n\n");
    let (from, peers) = cpus(ds);
    if from.is_empty() {
        s.push_str("From a CPU the input does not record, to each device");
    } else {
        let _ = write!(s, "From CPU {} to each device", cpu_list(ds, &from));
    }
    if !peers.is_empty() {
        let _ = write!(
            s,
            "; allgather (each device with its peer) with rank 0 there and rank 1 on CPU {}",
            cpu_list(ds, &peers)
        );
    }
    let _ = writeln!(
        s,
        ". Picture: `{picture}` (GB/s over a log2 size axis).\n\n\
         A point's value is the median of its samples; its spread is (max - min) / median of \
         them, and a spread above {} flags it **re-measure**. A **dip** is a point below \
         {DIP_RATIO} x the best point on each side of it. The **plateau** is the smallest size \
         from which the curve (dips aside) stays within {} of its maximum. A point above its \
         path's limit (the PCIe link's payload on CUDA, half the device memory's bandwidth \
         from NVML for a same-device copy, or the run's configured `[limits]`) is \
         **implausible**: a measurement fault, left out of the maximum, the plateau and the \
         comparisons. Two or more adjacent points above {CACHE_RESIDENT_RATIO} x the \
         large-size plateau (the largest sizes within {} of each other) are \
         **cache-resident**: the copies stayed in a cache; the plateau is then the large-size \
         one and the maximum leaves them out. **Matrix sizes**: from the plateau on, outside \
         cache-resident sizes, dips and implausible points.\n",
        percent(REMEASURE_SPREAD),
        percent(PLATEAU_BAND),
        percent(PLATEAU_BAND)
    );
    s.push_str(
        "| op | device | plateau from | max GB/s | dips | re-measure | failed | cache-resident | implausible | matrix sizes |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let sizes = |it: &mut dyn Iterator<Item = &Point>| {
        let v: Vec<String> = it.map(|p| size_label(p.size_bytes)).collect();
        if v.is_empty() {
            "-".to_string()
        } else {
            v.join(", ")
        }
    };
    for c in curves {
        if c.unsupported() {
            let _ = writeln!(
                s,
                "| {} | {} | not supported | - | - | - | - | - | - | - |",
                c.op,
                c.label()
            );
            continue;
        }
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            c.op,
            c.label(),
            c.plateau.map(size_label).unwrap_or_else(|| "none".into()),
            c.max.map(gbps).unwrap_or_else(|| "-".into()),
            sizes(&mut c.dips()),
            sizes(&mut c.to_remeasure()),
            sizes(&mut c.failed()),
            sizes(&mut c.cache_resident()),
            sizes(&mut c.implausible()),
            {
                let m: Vec<String> = c.matrix_sizes().into_iter().map(size_label).collect();
                if m.is_empty() {
                    "-".to_string()
                } else {
                    m.join(", ")
                }
            },
        );
    }
    s.push('\n');
    for (op, devices, why) in unsupported(curves) {
        let _ = writeln!(
            s,
            "**{op} is not supported here** (device{} {}): {why}. Its points are recorded as failed with reason `unsupported` and not plotted.\n",
            if devices.len() == 1 { "" } else { "s" },
            devices.join(", ")
        );
    }
    let mut ops: Vec<&str> = Vec::new();
    for c in curves {
        if !ops.contains(&c.op.as_str()) {
            ops.push(&c.op);
        }
    }
    for op in ops {
        let shown: Vec<&Curve> = curves
            .iter()
            .filter(|c| c.op == op && !c.unsupported())
            .collect();
        if shown.is_empty() {
            continue;
        }
        let _ = writeln!(s, "### {op}: GB/s by size (spread)\n");
        s.push_str("| size |");
        for c in &shown {
            let _ = write!(s, " {} |", c.label());
        }
        s.push_str("\n|---|");
        s.push_str(&"---|".repeat(shown.len()));
        s.push('\n');
        let mut all_sizes: Vec<u64> = shown
            .iter()
            .flat_map(|c| c.points.iter().map(|p| p.size_bytes))
            .collect();
        all_sizes.sort_unstable();
        all_sizes.dedup();
        for size in all_sizes {
            let _ = write!(s, "| {} |", size_label(size));
            for c in &shown {
                let cell = match c.points.iter().find(|p| p.size_bytes == size) {
                    None => "-".to_string(),
                    Some(p) => {
                        let mut t = match p.median {
                            Some(v) => gbps(v),
                            None => "failed".into(),
                        };
                        if let Some(sp) = p.spread {
                            let _ = write!(t, " ({})", percent(sp));
                        }
                        let f = flags(p).replace("failed", "");
                        let f = f.trim();
                        if !f.is_empty() {
                            let _ = write!(t, " **{f}**");
                        }
                        if c.plateau == Some(size) {
                            t.push_str(" plateau");
                        }
                        t
                    }
                };
                let _ = write!(s, " {cell} |");
            }
            s.push('\n');
        }
        s.push('\n');
    }
    s.push_str(&settings_section(curves));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::{CellResult, MatrixId};
    use crate::format::run_dir::MatrixKind;

    fn cell(op: &str, device: &str, size: u64, samples: Vec<f64>, errors: Vec<&str>) -> CellResult {
        CellResult {
            matrix: MatrixId {
                kind: MatrixKind::Sweep,
                size_bytes: size,
                direction: op.into(),
                host_memory: "pinned".into(),
                load: "idle".into(),
                pair: None,
            },
            cpu: 3,
            peer_cpu: None,
            device: device.into(),
            samples,
            errors: errors.into_iter().map(String::from).collect(),
        }
    }

    #[test]
    fn csv_rows_section_and_findings_name_the_dip_and_the_unsupported_op() {
        let mib = 1u64 << 20;
        let mut ds = Dataset {
            numa_nodes: [(0, vec![3])].into(),
            ..Dataset::default()
        };
        for (i, v) in [5.0, 9.0, 1.0, 10.0].iter().enumerate() {
            ds.cells
                .push(cell("h2d", "0", mib << i, vec![v * 1e9, v * 1e9], vec![]));
            ds.cells.push(cell(
                "d2d",
                "0",
                mib << i,
                vec![],
                vec!["not supported: the cuda backend has no same-device copy (device 0)"],
            ));
        }
        let curves = curves(&ds);
        let csv = render_csv(&curves);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 1 + 8);
        assert_eq!(lines[0], COLUMNS);
        assert_eq!(
            lines[3],
            "h2d,0,4MiB,4194304,1.000,1000000000,0.0000,2,0,dip,,"
        );
        assert!(
            lines[5].starts_with("d2d,0,1MiB,1048576,,,,0,1,unsupported,,"),
            "{csv}"
        );
        let found = findings(&curves);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].starts_with("dip at 4MiB: h2d device 0 reads 1.00 GB/s"),
            "{found:?}"
        );
        assert!(
            found[1]
                == "d2d is not supported here (device 0): the cuda backend has no same-device \
                    copy (device 0); no d2d curve",
            "{found:?}"
        );
        let md = section(&ds, &curves, SWEEP_PNG);
        assert!(md.contains("From CPU 3 (NUMA 0) to each device"), "{md}");
        assert!(
            md.contains("| h2d | 0 | 8MiB | 10.00 | 4MiB | - | - |"),
            "{md}"
        );
        assert!(md.contains("| d2d | 0 | not supported |"), "{md}");
        assert!(md.contains("**d2d is not supported here**"), "{md}");
        assert!(md.contains("| 4MiB | 1.00 (0.0%) **dip** |"), "{md}");
    }
}
