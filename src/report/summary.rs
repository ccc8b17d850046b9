//! `summary.md`: the findings first (slow device columns, slow NUMA segments, slow cores, pair
//! CPUs, failures), then per matrix the five-number summary, device medians and ratios, the
//! NUMA segment x device medians, the slowest cores and the failed cells with their errors,
//! the same-device copy table (`super::summary_d2d`), and each load profile's change against
//! idle; for a peer copy matrix, the medians per PCIe path class and the pairs slower than
//! their class.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::analysis::p2p::{P2pMatrix, SLOW_PAIR_RATIO};
use crate::analysis::ranks::SLOWEST_CELLS;
use crate::analysis::{limits, link};
use crate::analysis::{
    CellRanks, D2dDevices, Failure, H2dMatrix, NumaMap, PairMatrix, EXTREME_CELL_RATIO,
    SLOW_CPU_RATIO, SLOW_DEVICE_RATIO, SLOW_SEGMENT_RATIO,
};
use crate::dataset::{device_link, Dataset, MatrixId};
use crate::probe::kind::Layout;
use crate::probe::kinds;
use crate::stats::{self, Summary};
use crate::topology::natural::natural_key;

/// Rows shown in "slowest" lists.
const TOP: usize = 10;
/// Failed cells listed per matrix.
const MAX_FAILURES: usize = 50;

fn gbps(v: f64) -> String {
    crate::vocab::Bandwidth::from_bytes_per_second(v).to_string()
}

fn node(n: Option<u32>) -> String {
    n.map(|n| n.to_string()).unwrap_or_else(|| "?".into())
}

fn summary_table(s: &mut String, summary: Option<Summary>) {
    match summary {
        Some(x) => {
            let _ = writeln!(
                s,
                "| GB/s | min | p10 | median | p90 | max |\n|---|---|---|---|---|---|\n| cells | {} | {} | {} | {} | {} |\n",
                gbps(x.min),
                gbps(x.p10),
                gbps(x.median),
                gbps(x.p90),
                gbps(x.max)
            );
        }
        None => s.push_str("No cell was measured.\n\n"),
    }
}

/// One slow thing seen in one or more matrices: (ratio, median bytes/s, matrix title).
type Seen = Vec<(f64, f64, String)>;

fn merged(what: &str, of_what: &str, seen: &Seen, matrices: usize) -> String {
    let worst = seen
        .iter()
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .expect("seen at least once");
    let mut titles: Vec<&str> = seen.iter().map(|s| s.2.as_str()).collect();
    titles.dedup();
    format!(
        "{what} in {} of {matrices} matrices: {:.2} x {of_what} at worst, median {} GB/s ({})",
        titles.len(),
        worst.0,
        gbps(worst.1),
        worst.2
    )
}

/// `104 (0.60), 105 (0.61), ...` for the first [`TOP`].
fn ranked(items: &[(u32, f64)]) -> String {
    let mut list: Vec<String> = items
        .iter()
        .take(TOP)
        .map(|(cpu, r)| format!("{cpu} ({r:.2})"))
        .collect();
    if items.len() > TOP {
        list.push("...".into());
    }
    list.join(", ")
}

/// The findings: one line each, most important first. A device slow in several matrices
/// (sizes, directions, loads) is one line naming its worst matrix; so are a device's slow
/// NUMA segments.
/// One line per device column of `a` above its PCIe link's payload: on CUDA a measurement
/// fault, elsewhere (Ascend: H2D and D2H may go over HCCS) a path that is not PCIe-bound,
/// which chd does not judge against its link.
fn above_link_findings(ds: &Dataset, a: &H2dMatrix, title: &str) -> Vec<String> {
    a.devices
        .iter()
        .filter_map(|d| {
            let link = device_link(ds.devices.iter().find(|m| m.id == d.device)?)?;
            let payload = link.current.payload_bytes_per_second()?;
            let e = link::efficiency(d.summary.median, &link).filter(|e| *e > 1.0)?;
            let what = if limits::pcie_host_path(&ds.backend) {
                "implausible: a measurement fault, no copy over that link can be faster"
            } else {
                "the path is not PCIe-bound (on Ascend H2D and D2H may go over the HCCS \
                 plane), so the device is not judged against its PCIe link"
            };
            Some(format!(
                "device {} reads {} GB/s, {e:.2} x the payload of its PCIe link ({} GB/s, {}): \
                 {what} ({title})",
                d.device,
                gbps(d.summary.median),
                gbps(payload),
                link.current.describe(),
            ))
        })
        .collect()
}

pub fn findings(ds: &Dataset) -> Vec<String> {
    let numa = ds.numa_map();
    let mut devices: BTreeMap<String, Seen> = BTreeMap::new();
    let mut segments: BTreeMap<String, (Seen, std::collections::BTreeSet<Option<u32>>)> =
        BTreeMap::new();
    let mut rest = Vec::new();
    let mut h2d_matrices = 0;
    for (id, cells) in ds.matrices() {
        let title = Dataset::matrix_title(id);
        match kinds::of(id.kind).layout() {
            Layout::CpuByDevice => {
                h2d_matrices += 1;
                let cells = crate::dataset::cells::cells(&cells);
                let a = H2dMatrix::of(&cells, &numa);
                let ranks = CellRanks::of(&cells, &numa, &a);
                rest.extend(above_link_findings(ds, &a, &title));
                for d in a.slow_devices() {
                    devices.entry(d.device.clone()).or_default().push((
                        d.ratio.unwrap_or(f64::NAN),
                        d.summary.median,
                        title.clone(),
                    ));
                }
                for seg in a.slow_segments() {
                    let e = segments.entry(seg.device.clone()).or_default();
                    e.0.push((
                        seg.ratio.unwrap_or(f64::NAN),
                        seg.summary.median,
                        title.clone(),
                    ));
                    e.1.insert(seg.numa_node);
                }
                let slow: Vec<(u32, f64)> = ranks
                    .slow_cores()
                    .iter()
                    .map(|c| (c.cpu, c.ratio))
                    .collect();
                if !slow.is_empty() {
                    rest.push(format!(
                        "{} slow CPU{} (cells below {SLOW_CPU_RATIO} x their device medians): {} ({title})",
                        slow.len(),
                        if slow.len() == 1 { "" } else { "s" },
                        ranked(&slow)
                    ));
                }
                let extreme = ranks.extreme_cells();
                if !extreme.is_empty() {
                    let list: Vec<String> = extreme
                        .iter()
                        .take(TOP)
                        .map(|c| {
                            format!(
                                "CPU {} -> device {} {} GB/s",
                                c.cpu,
                                c.device,
                                gbps(c.value)
                            )
                        })
                        .collect();
                    rest.push(format!(
                        "{}{} extreme cell{} below {EXTREME_CELL_RATIO} x {} NUMA segment's median: {}{} ({title})",
                        extreme.len(),
                        if extreme.len() >= SLOWEST_CELLS { "+" } else { "" },
                        if extreme.len() == 1 { "" } else { "s" },
                        if extreme.len() == 1 { "its" } else { "their" },
                        list.join(", "),
                        if extreme.len() > TOP { ", ..." } else { "" }
                    ));
                }
                if !a.failures.is_empty() {
                    rest.push(failure_line(a.failures.len(), a.cells, &title));
                }
            }
            Layout::Devices => {
                let a =
                    D2dDevices::within(&crate::dataset::cells::cells(&cells), &ds.path_limits());
                rest.extend(super::summary_d2d::findings(&title, &a));
            }
            Layout::CpuPairs => {
                let a = PairMatrix::of(&crate::dataset::cells::cells(&cells), &numa);
                for rank in [0u8, 1] {
                    let slow: Vec<(u32, f64)> = a
                        .slow_cpus()
                        .iter()
                        .filter(|c| c.rank == rank)
                        .map(|c| (c.cpu, c.ratio.unwrap_or(f64::NAN)))
                        .collect();
                    if !slow.is_empty() {
                        rest.push(format!(
                            "{} slow rank {rank} CPU{} (below {SLOW_CPU_RATIO} x the matrix median {} GB/s): {} ({title})",
                            slow.len(),
                            if slow.len() == 1 { "" } else { "s" },
                            a.overall.map(|o| gbps(o.median)).unwrap_or_default(),
                            ranked(&slow)
                        ));
                    }
                }
                if !a.failures.is_empty() {
                    rest.push(failure_line(a.failures.len(), a.cells, &title));
                }
            }
            Layout::SourceByDestination => {
                let m = P2pMatrix::of(
                    &crate::dataset::cells::cells(&cells),
                    &ds.p2p_paths,
                    &ds.p2p_methods,
                );
                rest.extend(p2p_findings(&m, &title));
            }
            // Not matrices (`matrices` leaves them out): their findings are their sections'.
            Layout::Curves | Layout::Table => {}
        }
    }
    let mut out: Vec<String> = in_natural_order(&devices)
        .into_iter()
        .map(|(d, seen)| {
            merged(
                &format!("device {d} is slow"),
                "the typical device",
                seen,
                h2d_matrices,
            )
        })
        .collect();
    out.extend(
        in_natural_order(&segments)
            .into_iter()
            .map(|(d, (seen, nodes))| {
                let nodes: Vec<String> = nodes.iter().map(|n| node(*n)).collect();
                merged(
                    &format!("device {d} is slow from NUMA {}", nodes.join(", ")),
                    "its best NUMA segment",
                    seen,
                    h2d_matrices,
                )
            }),
    );
    out.extend(rest);
    if let Some(table) = super::basics::table(ds) {
        out.extend(table.findings());
    }
    out.extend(super::sweep::findings(&super::sweep::curves(ds)));
    let unbindable: Vec<u32> = ds.affinity.iter().filter(|a| !a.1).map(|a| a.0).collect();
    if !unbindable.is_empty() {
        out.push(format!(
            "{} of {} CPUs cannot be bound: {}",
            unbindable.len(),
            ds.affinity.len(),
            crate::topology::cpulist::format(&unbindable)
        ));
    }
    out
}

/// The entries of `map` in natural order of their device.
fn in_natural_order<V>(map: &BTreeMap<String, V>) -> Vec<(&String, &V)> {
    let mut entries: Vec<(&String, &V)> = map.iter().collect();
    entries.sort_by(|a, b| natural_key(a.0).cmp(&natural_key(b.0)));
    entries
}

fn failure_line(failed: usize, cells: usize, title: &str) -> String {
    format!("{failed} of {cells} cells had failed samples ({title}); see \"Failed cells\"")
}

fn h2d_section(
    s: &mut String,
    ds: &Dataset,
    id: &MatrixId,
    (a, ranks): (&H2dMatrix, &CellRanks),
    picture: &str,
) {
    let _ = writeln!(
        s,
        "## {}\n\n{} of {} cells measured. Picture: `{picture}`.\n",
        Dataset::matrix_title(id),
        a.measured,
        a.cells
    );
    summary_table(s, a.overall);
    // The link columns only where the run recorded a link (recordings have none).
    let with_links = ds.devices.iter().any(|m| m.link.is_some());
    s.push_str("### Devices\n\nRatio = the device's median / the median of all device medians (as `chd_h2d_device_ratio`).");
    if with_links {
        s.push_str(" Of link = the median / the payload of the device's PCIe link as read after the run's copies (as `chd_h2d_link_efficiency_ratio`; a healthy copy reaches 0.8-0.9).");
    }
    s.push_str(
        "\n\n| device | name | NUMA | cells | median GB/s | ratio | min | p10 | p90 | max |",
    );
    if with_links {
        s.push_str(" PCIe link | of link |");
    }
    s.push_str(" |\n|---|---|---|---|---|---|---|---|---|---|");
    if with_links {
        s.push_str("---|---|");
    }
    s.push_str("---|\n");
    for d in &a.devices {
        let meta = ds.devices.iter().find(|m| m.id == d.device);
        let slow = d.ratio.is_some_and(|r| r < SLOW_DEVICE_RATIO);
        let _ = write!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            d.device,
            meta.map(|m| m.name.as_str()).unwrap_or(""),
            node(meta.and_then(|m| m.numa_node)),
            d.cells,
            gbps(d.summary.median),
            d.ratio
                .map(|r| format!("{r:.2}"))
                .unwrap_or_else(|| "-".into()),
            gbps(d.summary.min),
            gbps(d.summary.p10),
            gbps(d.summary.p90),
            gbps(d.summary.max),
        );
        if with_links {
            let link = meta.and_then(device_link);
            let efficiency = link
                .and_then(|l| link::efficiency(d.summary.median, &l))
                .map(|e| match e > 1.0 {
                    true if limits::pcie_host_path(&ds.backend) => format!("{e:.2} implausible"),
                    true => format!("{e:.2} not PCIe-bound"),
                    false => format!("{e:.2}"),
                });
            let _ = write!(
                s,
                " {} | {} |",
                link.map(|l| l.describe()).unwrap_or_else(|| "-".into()),
                efficiency.unwrap_or_else(|| "-".into())
            );
        }
        let _ = writeln!(s, " {} |", if slow { "**slow**" } else { "" });
    }
    s.push_str("\n### NUMA segment x device\n\nMedian GB/s of the cells of each NUMA node's CPUs; `*` marks a segment below ");
    let _ = writeln!(s, "{SLOW_SEGMENT_RATIO} x the device's best segment.\n");
    let devices: Vec<&str> = a.devices.iter().map(|d| d.device.as_str()).collect();
    let mut nodes: Vec<Option<u32>> = a.segments.iter().map(|x| x.numa_node).collect();
    nodes.dedup();
    let _ = writeln!(
        s,
        "| CPUs \\ device | {} |\n|---|{}",
        devices.join(" | "),
        "---|".repeat(devices.len())
    );
    for n in nodes {
        let cells: Vec<String> = devices
            .iter()
            .map(|d| {
                a.segments
                    .iter()
                    .find(|x| x.numa_node == n && x.device == *d)
                    .map(|x| {
                        let mark = if x.ratio.is_some_and(|r| r < SLOW_SEGMENT_RATIO) {
                            "*"
                        } else {
                            ""
                        };
                        format!("{}{mark}", gbps(x.summary.median))
                    })
                    .unwrap_or_else(|| "-".into())
            })
            .collect();
        let _ = writeln!(s, "| NUMA {} | {} |", node(n), cells.join(" | "));
    }
    let _ = writeln!(
        s,
        "\n### Slowest cores\n\nRatio = median over devices of (cell / device median); below {SLOW_CPU_RATIO} is slow.\n\n| CPU | NUMA | ratio | median GB/s |\n|---|---|---|---|"
    );
    for c in ranks.cores.iter().take(TOP) {
        let _ = writeln!(
            s,
            "| {} | {} | {:.2} | {} |",
            c.cpu,
            node(c.numa_node),
            c.ratio,
            gbps(c.median)
        );
    }
    s.push_str("\n### Slowest cells\n\nRatio = the cell / the median of its NUMA segment on that device.\n\n| CPU | NUMA | device | GB/s | ratio |\n|---|---|---|---|---|\n");
    for c in ranks.slowest_cells.iter().take(TOP) {
        let n = ds.numa_of(c.cpu);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.2} |",
            c.cpu,
            node(n),
            c.device,
            gbps(c.value),
            c.ratio
        );
    }
    failures_section(s, &a.failures, false);
}

fn failures_section(s: &mut String, failures: &[Failure], pair: bool) {
    if failures.is_empty() {
        s.push_str("\n### Failed cells\n\nNone.\n\n");
        return;
    }
    let _ = writeln!(
        s,
        "\n### Failed cells\n\n| {} | failed | ok | last error |\n|---|---|---|---|---|",
        if pair {
            "rank 0 CPU | rank 1 CPU"
        } else {
            "CPU | device"
        }
    );
    for f in failures.iter().take(MAX_FAILURES) {
        let second = if pair {
            f.peer_cpu.map(|p| p.to_string()).unwrap_or_default()
        } else {
            f.device.clone()
        };
        let _ = writeln!(
            s,
            "| {} | {second} | {} | {} | {} |",
            f.cpu,
            f.failed,
            f.succeeded,
            f.last_error.replace('|', "/").replace('\n', " ")
        );
    }
    if failures.len() > MAX_FAILURES {
        let _ = writeln!(
            s,
            "\n... and {} more (see `cells.csv`).",
            failures.len() - MAX_FAILURES
        );
    }
    s.push('\n');
}

fn pair_section(s: &mut String, id: &MatrixId, a: &PairMatrix, picture: &str) {
    let _ = writeln!(
        s,
        "## {}\n\n{} of {} cells measured. Picture: `{picture}`.\n",
        Dataset::matrix_title(id),
        a.measured,
        a.cells
    );
    summary_table(s, a.overall);
    let _ = writeln!(
        s,
        "### Slowest CPUs\n\nRatio = the CPU's median over the cells where it held that rank / the matrix median (as `chd_pair_cpu_ratio`); below {SLOW_CPU_RATIO} is slow.\n\n| rank | CPU | NUMA | median GB/s | ratio | |\n|---|---|---|---|---|---|"
    );
    for c in a.cpus_by_ratio().into_iter().take(TOP) {
        let slow = c.ratio.is_some_and(|r| r < SLOW_CPU_RATIO);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} |",
            c.rank,
            c.cpu,
            node(c.numa_node),
            gbps(c.median),
            c.ratio
                .map(|r| format!("{r:.2}"))
                .unwrap_or_else(|| "-".into()),
            if slow { "**slow**" } else { "" }
        );
    }
    s.push_str("\n### NUMA x NUMA (median GB/s)\n\n| rank 0 NUMA | rank 1 NUMA | median GB/s |\n|---|---|---|\n");
    for ((n0, n1), m) in &a.segments {
        let _ = writeln!(s, "| {} | {} | {} |", node(*n0), node(*n1), gbps(m.median));
    }
    failures_section(s, &a.failures, true);
}

/// The findings of a peer copy matrix: its slow pairs (below [`SLOW_PAIR_RATIO`] x their path
/// class median), pairs measured host-staged, and failed pairs with their last error.
fn p2p_findings(m: &P2pMatrix, title: &str) -> Vec<String> {
    let mut out = Vec::new();
    let slow = m.slow_pairs();
    if !slow.is_empty() {
        let list: Vec<String> = slow
            .iter()
            .take(TOP)
            .map(|p| {
                format!(
                    "{} {} GB/s ({:.2} x {} median {} GB/s)",
                    p.label(),
                    p.value.map(gbps).unwrap_or_default(),
                    p.ratio.unwrap_or(f64::NAN),
                    p.class,
                    m.class(&p.class)
                        .and_then(|c| c.median)
                        .map(gbps)
                        .unwrap_or_default()
                )
            })
            .collect();
        out.push(format!(
            "{} slow peer copy pair{} (below {SLOW_PAIR_RATIO} x the median of their PCIe path class): {}{} ({title})",
            slow.len(),
            if slow.len() == 1 { "" } else { "s" },
            list.join(", "),
            if slow.len() > TOP { ", ..." } else { "" }
        ));
    }
    let staged: Vec<String> = m
        .pairs
        .iter()
        .filter(|p| p.method.as_deref() == Some(crate::runtime::peer_access::COPY_STAGED))
        .map(|p| p.label())
        .collect();
    if !staged.is_empty() {
        out.push(format!(
            "{} pair{} refused peer access and {} measured staged through host memory (copy-staged): {} ({title})",
            staged.len(),
            if staged.len() == 1 { "" } else { "s" },
            if staged.len() == 1 { "was" } else { "were" },
            staged.join(", ")
        ));
    }
    let failed = m.failed_pairs();
    if !failed.is_empty() {
        let list: Vec<String> = failed
            .iter()
            .take(TOP)
            .map(|p| {
                format!(
                    "{}: {}",
                    p.label(),
                    p.last_error.as_deref().unwrap_or("no value")
                )
            })
            .collect();
        out.push(format!(
            "{} of {} peer copy pairs had failed samples ({title}): {}{}",
            failed.len(),
            m.pairs.len(),
            list.join("; "),
            if failed.len() > TOP { "; ..." } else { "" }
        ));
    }
    out
}

/// A peer copy matrix: per-class medians, then every pair slower than its class.
fn p2p_section(s: &mut String, id: &MatrixId, m: &P2pMatrix, picture: &str) {
    let measured = m.pairs.iter().filter(|p| p.value.is_some()).count();
    let _ = writeln!(
        s,
        "## {}\n\n{measured} of {} ordered pairs measured (row: source device, column: destination device). Picture: `{picture}`; every pair in `p2p.csv`.\n",
        Dataset::matrix_title(id),
        m.pairs.len()
    );
    s.push_str("### By PCIe path class\n\nClasses as `nvidia-smi topo -m` names them: PIX (one PCIe switch), PXB (several switches, no host bridge), PHB (through a host bridge), NODE (host bridges of one NUMA node), SYS (across the CPU interconnect).\n\n| path | pairs | measured | median GB/s | min GB/s | max GB/s |\n|---|---|---|---|---|---|\n");
    let dash = |v: Option<f64>| v.map(gbps).unwrap_or_else(|| "-".into());
    for c in &m.classes {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} |",
            c.class,
            c.pairs,
            c.measured,
            dash(c.median),
            dash(c.min),
            dash(c.max)
        );
    }
    let _ = writeln!(
        s,
        "\n### Slow pairs\n\nRatio = the pair's value / the median of its path class; below {SLOW_PAIR_RATIO} is slow.\n"
    );
    let slow = m.slow_pairs();
    if slow.is_empty() {
        s.push_str("None.\n");
    } else {
        s.push_str("| pair | path | method | GB/s | ratio |\n|---|---|---|---|---|\n");
        for p in slow {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {:.2} |",
                p.label(),
                p.class,
                p.method.as_deref().unwrap_or("-"),
                dash(p.value),
                p.ratio.unwrap_or(f64::NAN)
            );
        }
    }
    s.push_str("\n### Failed pairs\n\n");
    let failed = m.failed_pairs();
    if failed.is_empty() {
        s.push_str("None.\n\n");
    } else {
        s.push_str("| pair | path | failed | succeeded | last error |\n|---|---|---|---|---|\n");
        for p in failed.iter().take(MAX_FAILURES) {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} |",
                p.label(),
                p.class,
                p.failed,
                p.samples,
                p.last_error.as_deref().unwrap_or("").replace('|', "/")
            );
        }
        s.push('\n');
    }
}

/// The load-profile comparison: for every matrix measured under a load and idle, each
/// device's (or the whole pair matrix's) median under load against idle.
fn load_section(s: &mut String, ds: &Dataset) {
    let matrices = ds.matrices();
    let loaded: Vec<&MatrixId> = matrices
        .keys()
        .filter(|m| m.load != "idle")
        .copied()
        .collect();
    if loaded.is_empty() {
        return;
    }
    s.push_str("## Load profiles against idle\n\nMedian GB/s per device under each load profile and its change against the idle run of the same matrix.\n\n");
    let mut rows = 0;
    for id in loaded {
        let idle_id = MatrixId {
            load: "idle".into(),
            ..id.clone()
        };
        let Some(idle) = matrices.get(&idle_id) else {
            let _ = writeln!(
                s,
                "- {}: no idle run to compare with.",
                Dataset::matrix_title(id)
            );
            continue;
        };
        // Each device's median and the whole matrix's ("all").
        let column = |cells: &[&crate::dataset::CellResult]| {
            let m = H2dMatrix::of(&crate::dataset::cells::cells(cells), &NumaMap::new());
            m.devices
                .iter()
                .map(|d| (d.device.clone(), d.summary.median))
                .chain(m.overall.map(|o| ("all".to_string(), o.median)))
                .collect::<BTreeMap<_, _>>()
        };
        let base = column(idle);
        let load = column(&matrices[id]);
        if rows == 0 {
            s.push_str("| matrix | load | device | idle GB/s | loaded GB/s | change |\n|---|---|---|---|---|---|\n");
        }
        let mut devices: Vec<&String> = load.keys().filter(|d| base.contains_key(*d)).collect();
        devices.sort_by_key(|d| (d.as_str() == "all", natural_key(d)));
        for d in devices {
            let (b, l) = (base[d], load[d]);
            let change = stats::ratio(l, b)
                .map(|r| format!("{:+.1}%", (r - 1.0) * 100.0))
                .unwrap_or_else(|| "-".into());
            let _ = writeln!(
                s,
                "| {} | {} | {d} | {} | {} | {change} |",
                Dataset::matrix_title(&idle_id).replace(", load idle", ""),
                id.load,
                gbps(b),
                gbps(l)
            );
            rows += 1;
        }
    }
    s.push('\n');
}

/// Render `summary.md`; `pictures` maps each matrix to its picture's file name.
pub fn render(ds: &Dataset, pictures: &BTreeMap<MatrixId, String>) -> String {
    let mut s = String::from("# chd calibration report\n\n");
    let _ = writeln!(s, "Source: {}\n\n| | |\n|---|---|", ds.source);
    for (k, v) in &ds.meta {
        let _ = writeln!(s, "| {k} | {} |", v.replace('|', "/"));
    }
    if ds.partial.is_some() || !ds.notes.is_empty() {
        s.push('\n');
        for n in ds.partial.iter().chain(&ds.notes) {
            let _ = writeln!(s, "> **Note:** {n}");
        }
    }
    if !ds.rejected.is_empty() {
        let n: usize = ds.rejected.iter().map(|r| r.count).sum();
        let _ = writeln!(
            s,
            "\n## Rows not used\n\n{n} rows of the input could not be placed in a matrix:\n\n| reason | rows | first |\n|---|---|---|"
        );
        for r in &ds.rejected {
            let _ = writeln!(
                s,
                "| {} | {} | {} |",
                r.reason.replace('|', "/"),
                r.count,
                r.first
            );
        }
    }
    s.push_str("\nBandwidths are decimal GB/s (1e9 bytes/s); sizes are binary (MiB = 2^20 bytes). A cell's value is the median of its samples.\n\n## Findings\n\n");
    let found = findings(ds);
    if found.is_empty() {
        // Cells measured by nothing but errors: the tables below name them.
        let failed = ds
            .cells
            .iter()
            .filter(|c| c.value().is_none() && !c.errors.is_empty())
            .count();
        let failures = match failed {
            0 => " and no failed cells".to_string(),
            1 => "; 1 cell failed (see below)".to_string(),
            n => format!("; {n} cells failed (see below)"),
        };
        let _ = writeln!(
            s,
            "- Nothing below the thresholds (device ratio < {SLOW_DEVICE_RATIO}, NUMA segment < {SLOW_SEGMENT_RATIO} x the device's best, CPU ratio < {SLOW_CPU_RATIO}){failures}."
        );
    }
    for f in &found {
        let _ = writeln!(s, "- {f}");
    }
    s.push('\n');
    let numa = ds.numa_map();
    for (id, cells) in ds.matrices() {
        let picture = pictures.get(id).map(String::as_str).unwrap_or("-");
        match kinds::of(id.kind).layout() {
            Layout::CpuByDevice => {
                let cells = crate::dataset::cells::cells(&cells);
                let a = H2dMatrix::of(&cells, &numa);
                let ranks = CellRanks::of(&cells, &numa, &a);
                h2d_section(&mut s, ds, id, (&a, &ranks), picture)
            }
            Layout::CpuPairs => {
                let a = PairMatrix::of(&crate::dataset::cells::cells(&cells), &numa);
                pair_section(&mut s, id, &a, picture)
            }
            Layout::Devices => {
                let a =
                    D2dDevices::within(&crate::dataset::cells::cells(&cells), &ds.path_limits());
                super::summary_d2d::section(&mut s, ds, id, &numa, &a)
            }
            Layout::SourceByDestination => {
                let m = P2pMatrix::of(
                    &crate::dataset::cells::cells(&cells),
                    &ds.p2p_paths,
                    &ds.p2p_methods,
                );
                p2p_section(&mut s, id, &m, picture)
            }
            // Not matrices: their sections below.
            Layout::Curves | Layout::Table => {}
        }
    }
    super::basics::section(&mut s, ds);
    let curves = super::sweep::curves(ds);
    if !curves.is_empty() {
        s.push_str(&super::sweep::section(ds, &curves, super::sweep::SWEEP_PNG));
    }
    load_section(&mut s, ds);
    if !ds.affinity.is_empty() {
        let ok = ds.affinity.iter().filter(|a| a.1).count();
        let _ = writeln!(
            s,
            "## Affinity\n\n{ok} of {} CPUs can be bound to exactly themselves.\n",
            ds.affinity.len()
        );
    }
    s
}
