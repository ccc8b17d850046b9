//! A report's cells as the input of [`crate::analysis`], where the matrix math lives (device
//! ratios, NUMA segments, slow cores and cells, pair CPUs, failures, thresholds); the report
//! only renders what it computes. The size curves and the basics table of a run are here too,
//! for the report and for a recording's ledger (`replay`).

use std::borrow::Cow;

use std::collections::BTreeMap;

use super::{CellResult, Dataset};
use crate::analysis::basics::{BasicsTable, Entry, Op};
use crate::analysis::live::MatrixKey;
use crate::analysis::sweep::{Curve, PointInput};
use crate::analysis::{Cell, H2dMatrix};
use crate::probe::kind::Layout;
use crate::probe::kinds::layout;
use crate::topology::natural::natural_key;

/// `cells` as analysis cells, in the same order.
pub fn cells<'a>(cells: &[&'a CellResult]) -> Vec<Cell<'a>> {
    cells
        .iter()
        .map(|c| Cell {
            cpu: c.cpu,
            peer_cpu: c.peer_cpu,
            device: &c.device,
            value: c.value(),
            samples: c.samples.len(),
            failed: c.errors.len(),
            last_error: c.errors.last().map(|e| Cow::Borrowed(e.as_str())),
            sampled_at: None,
        })
        .collect()
}

/// Every load profile's core x device matrices, by (size, direction) as a store keys them
/// (host memory kinds together, as [`Dataset::to_store`] holds them): the input of
/// [`crate::analysis::load_delta`].
pub fn h2d_by_load(ds: &Dataset) -> BTreeMap<String, BTreeMap<MatrixKey, H2dMatrix>> {
    let mut grouped: BTreeMap<(&str, MatrixKey), Vec<&CellResult>> = BTreeMap::new();
    for c in &ds.cells {
        if crate::probe::kinds::of(c.matrix.kind).layout() != Layout::CpuByDevice {
            continue;
        }
        let Ok(direction) = c.matrix.direction.parse() else {
            continue;
        };
        grouped
            .entry((c.matrix.load.as_str(), (c.matrix.size_bytes, direction)))
            .or_default()
            .push(c);
    }
    let numa = ds.numa_map();
    let mut out: BTreeMap<String, BTreeMap<MatrixKey, H2dMatrix>> = BTreeMap::new();
    for ((load, key), group) in grouped {
        out.entry(load.to_string())
            .or_default()
            .insert(key, H2dMatrix::of(&cells(&group), &numa));
    }
    out
}

/// Load profiles in the order their cells first appear (the run's order).
pub fn basics_loads(ds: &Dataset) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for c in ds
        .cells
        .iter()
        .filter(|c| layout(c.matrix.kind) == Layout::Table)
    {
        if !out.contains(&c.matrix.load) {
            out.push(c.matrix.load.clone());
        }
    }
    out
}

/// The dataset's basics cells with their measurement: by load profile (run order),
/// measurement (table order), device (natural order).
pub fn basics_cells(ds: &Dataset) -> Vec<(Op, &CellResult)> {
    let loads = basics_loads(ds);
    let mut out: Vec<(Op, &CellResult)> = ds
        .cells
        .iter()
        .filter(|c| layout(c.matrix.kind) == Layout::Table)
        .filter_map(|c| Some((c.matrix.direction.parse().ok()?, c)))
        .collect();
    out.sort_by(|(a_op, a), (b_op, b)| {
        let load = |c: &CellResult| loads.iter().position(|l| *l == c.matrix.load);
        (load(a), a_op, natural_key(&a.device)).cmp(&(load(b), b_op, natural_key(&b.device)))
    });
    out
}

/// The devices a cell is about: its device, or both devices of an allgather's pair.
pub fn basics_devices_of(c: &CellResult) -> Vec<&str> {
    c.device.split(',').collect()
}

/// The table of `ds`, or none when it holds no basics run.
pub fn basics_table(ds: &Dataset) -> Option<BasicsTable> {
    let cells = basics_cells(ds);
    if cells.is_empty() && ds.basics_unavailable.is_empty() {
        return None;
    }
    let entries: Vec<Entry<'_>> = cells
        .iter()
        .flat_map(|(op, c)| {
            let value = c.value();
            let error = c.errors.last().map(String::as_str);
            basics_devices_of(c).into_iter().map(move |device| Entry {
                load: &c.matrix.load,
                op: *op,
                device,
                value,
                error,
            })
        })
        .collect();
    let unavailable: Vec<(Op, String)> = ds
        .basics_unavailable
        .iter()
        .filter_map(|(op, why)| Some((op.parse().ok()?, why.clone())))
        .collect();
    Some(BasicsTable::of(&entries, &basics_loads(ds), &unavailable))
}

/// The curves of the dataset's sweep cells (empty for other runs).
pub fn sweep_curves(ds: &Dataset) -> Vec<Curve> {
    let points: Vec<PointInput> = ds
        .cells
        .iter()
        .filter(|c| layout(c.matrix.kind) == Layout::Curves)
        .map(|c| PointInput {
            op: &c.matrix.direction,
            device: &c.device,
            setting: &c.matrix.load,
            size_bytes: c.matrix.size_bytes,
            samples: &c.samples,
            errors: &c.errors,
        })
        .collect();
    crate::analysis::sweep::curves_within(&points, &ds.path_limits())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::{CellRanks, H2dMatrix, PairMatrix};
    use crate::dataset::MatrixId;
    use crate::format::run_dir::MatrixKind;
    use std::collections::BTreeMap;

    fn id(kind: MatrixKind) -> MatrixId {
        MatrixId {
            kind,
            size_bytes: 1,
            direction: "h2d".into(),
            host_memory: "pinned".into(),
            load: "idle".into(),
            pair: None,
        }
    }

    fn cell(cpu: u32, device: &str, gbps: Option<f64>) -> CellResult {
        CellResult {
            matrix: id(MatrixKind::H2d),
            cpu,
            peer_cpu: None,
            device: device.into(),
            samples: gbps.map(|g| vec![g * 1e9]).unwrap_or_default(),
            errors: if gbps.is_none() {
                vec!["copy failed".into()]
            } else {
                vec![]
            },
        }
    }

    #[test]
    fn seed_matrix_names_the_slow_column_segment_and_core() {
        // 12 CPUs on 3 nodes x 4 devices; device 0 slow everywhere; device 2 slow from node 2;
        // CPU 3 slow on every device; CPU 5 fails on device 1.
        let numa: BTreeMap<u32, u32> = (0..12).map(|c| (c, c / 4)).collect();
        let mut cells = Vec::new();
        for cpu in 0..12u32 {
            for d in 0..4 {
                let mut g = if d == 0 { 12.3 } else { 58.9 };
                if d == 2 && cpu >= 8 {
                    g = 6.1;
                }
                if cpu == 3 {
                    g *= 0.3;
                }
                let failed = cpu == 5 && d == 1;
                cells.push(cell(cpu, &d.to_string(), (!failed).then_some(g)));
            }
        }
        let refs: Vec<&CellResult> = cells.iter().collect();
        let cells = super::cells(&refs);
        let a = H2dMatrix::of(&cells, &numa);
        let ranks = CellRanks::of(&cells, &numa, &a);
        assert_eq!(a.cells, 48);
        assert_eq!(a.measured, 47);
        let slow: Vec<&str> = a.slow_devices().iter().map(|d| d.device.as_str()).collect();
        assert_eq!(slow, ["0"]);
        let segs: Vec<(Option<u32>, &str)> = a
            .slow_segments()
            .iter()
            .map(|s| (s.numa_node, s.device.as_str()))
            .collect();
        assert_eq!(segs, [(Some(2), "2")]);
        assert_eq!(ranks.cores[0].cpu, 3);
        assert_eq!(ranks.slow_cores().len(), 1);
        assert_eq!(a.failures.len(), 1);
        assert_eq!((a.failures[0].cpu, a.failures[0].device.as_str()), (5, "1"));
    }

    #[test]
    fn pair_matrix_ranks_cpus_per_side() {
        let numa: BTreeMap<u32, u32> = (0..4).map(|c| (c, c / 2)).collect();
        let mut cells = Vec::new();
        for a in 0..4u32 {
            for b in 0..4u32 {
                let g = if a == 1 { 4.0 } else { 13.7 };
                cells.push(CellResult {
                    matrix: id(MatrixKind::Pair),
                    cpu: a,
                    peer_cpu: Some(b),
                    device: "0,5".into(),
                    samples: vec![g * 1e9],
                    errors: vec![],
                });
            }
        }
        let refs: Vec<&CellResult> = cells.iter().collect();
        let p = PairMatrix::of(&super::cells(&refs), &numa);
        let slow: Vec<(u8, u32)> = p.slow_cpus().iter().map(|c| (c.rank, c.cpu)).collect();
        assert_eq!(slow, [(0, 1)]);
        assert_eq!(p.segments.len(), 4);
    }

    #[test]
    fn a_dataset_and_the_store_made_from_it_analyse_alike() {
        use crate::analysis::live;
        // 6 CPUs on 2 nodes (CPU 5 on none) x devices 0, 2, 10; device 10 slow from node 1;
        // CPU 4 fails on device 2 every time, CPU 1 once. Plus a pair matrix, CPU 3 slow.
        let numa: BTreeMap<u32, u32> = (0..5).map(|c| (c, c / 3)).collect();
        let mut ds = crate::dataset::Dataset {
            numa_nodes: BTreeMap::from([(0, vec![0, 1, 2]), (1, vec![3, 4])]),
            ..Default::default()
        };
        for cpu in 0..6u32 {
            for d in ["0", "2", "10"] {
                let g = if d == "10" && numa.get(&cpu) == Some(&1) {
                    7.0
                } else {
                    50.0 + f64::from(cpu)
                };
                let mut c = cell(cpu, d, (cpu != 4 || d != "2").then_some(g));
                if cpu == 1 && d == "0" {
                    c.samples.push(g * 1.1e9);
                    c.errors.push("once".into());
                }
                ds.cells.push(c);
            }
            for peer in 0..6u32 {
                ds.cells.push(CellResult {
                    matrix: MatrixId {
                        pair: Some("0,2".into()),
                        direction: "allgather".into(),
                        ..id(MatrixKind::Pair)
                    },
                    cpu,
                    peer_cpu: Some(peer),
                    device: "0,2".into(),
                    samples: vec![if cpu == 3 { 4e9 } else { 13.7e9 }],
                    errors: vec![],
                });
            }
        }
        let matrices = ds.matrices();
        let store = ds.to_store(100, 1.0);
        let live_cells = live::h2d_cells(&store);
        let live_h2d = live::by_matrix(&live_cells);
        let live_pairs = live::pair_cells(&store);
        for (id, cells) in &matrices {
            let cells = super::cells(cells);
            match id.kind {
                MatrixKind::H2d => {
                    let from_ds = H2dMatrix::of(&cells, &numa);
                    let key = (id.size_bytes, crate::vocab::Direction::H2d);
                    let from_store = H2dMatrix::of(&live_h2d[&key], &numa);
                    assert_eq!(from_ds.devices, from_store.devices);
                    assert_eq!(from_ds.segments, from_store.segments);
                    assert_eq!(from_ds.overall, from_store.overall);
                    assert_eq!((from_ds.cells, from_ds.measured), (18, 17));
                    assert_eq!((from_store.cells, from_store.measured), (18, 17));
                    assert_eq!(
                        CellRanks::of(&cells, &numa, &from_ds),
                        CellRanks::of(&live_h2d[&key], &numa, &from_store)
                    );
                    let slow: Vec<(Option<u32>, &str)> = from_ds
                        .slow_segments()
                        .iter()
                        .map(|s| (s.numa_node, s.device.as_str()))
                        .collect();
                    assert_eq!(slow, [(Some(1), "10")]);
                    let devices: Vec<&str> =
                        from_ds.devices.iter().map(|d| d.device.as_str()).collect();
                    assert_eq!(devices, ["0", "2", "10"]);
                }
                MatrixKind::Pair => {
                    let from_ds = PairMatrix::of(&cells, &numa);
                    let from_store = PairMatrix::of(&live_pairs["0,2"], &numa);
                    assert_eq!(from_ds.cpus, from_store.cpus);
                    assert_eq!(from_ds.segments, from_store.segments);
                    let slow: Vec<(u8, u32)> = from_ds
                        .slow_cpus()
                        .iter()
                        .map(|c| (c.rank, c.cpu))
                        .collect();
                    assert_eq!(slow, [(0, 3)]);
                }
                other => panic!("a recording holds no {other:?} cells"),
            }
        }
        // What differs is what a store keeps of failures: attempts since the last success.
        let key = (1, crate::vocab::Direction::H2d);
        let live_matrix = H2dMatrix::of(&live_h2d[&key], &numa);
        let failed: Vec<(u32, &str, usize)> = live_matrix
            .failures
            .iter()
            .map(|f| (f.cpu, f.device.as_str(), f.failed))
            .collect();
        assert_eq!(failed, [(4, "2", 1)]);
    }
}
