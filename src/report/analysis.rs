//! What a report says about one matrix: five-number summaries, device columns and their
//! ratios (column median / median of all column medians, as `chd_h2d_device_ratio`), NUMA
//! segment x device medians, the slowest cores, failures; for a pair matrix the per-CPU
//! medians per rank (as `chd_pair_cpu_ratio`) and NUMA x NUMA blocks. Thresholds follow the
//! alert rules so a report and a page agree.

use std::collections::BTreeMap;

use super::dataset::CellResult;
use crate::stats::{self, Summary};

/// A device column below this ratio is slow (`ChdH2DSlowDeviceColumn`).
pub const SLOW_DEVICE_RATIO: f64 = 0.5;
/// A NUMA segment below this fraction of its device's best segment is slow (the report's
/// form of `ChdH2DSlowNumaSegment`).
pub const SLOW_SEGMENT_RATIO: f64 = 0.5;
/// A CPU below this ratio is slow (`ChdPairCpuSlow`; also used for h2d cores).
pub const SLOW_CPU_RATIO: f64 = 0.7;

/// Sort key that puts `2` before `10` and `numa2` before `numa10`.
pub fn natural_key(s: &str) -> (String, u64, String) {
    let digits_at = s.find(|c: char| c.is_ascii_digit()).unwrap_or(s.len());
    let (prefix, rest) = s.split_at(digits_at);
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let number = rest[..end].parse().unwrap_or(u64::MAX);
    (prefix.to_string(), number, rest[end..].to_string())
}

/// One failed (or partly failed) cell.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub cpu: u32,
    pub peer_cpu: Option<u32>,
    pub device: String,
    pub failed: usize,
    pub succeeded: usize,
    pub last_error: String,
}

fn failures(cells: &[&CellResult]) -> Vec<Failure> {
    let mut out: Vec<Failure> = cells
        .iter()
        .filter(|c| !c.errors.is_empty())
        .map(|c| Failure {
            cpu: c.cpu,
            peer_cpu: c.peer_cpu,
            device: c.device.clone(),
            failed: c.errors.len(),
            succeeded: c.samples.len(),
            last_error: c.errors.last().cloned().unwrap_or_default(),
        })
        .collect();
    out.sort_by(|a, b| {
        (natural_key(&a.device), a.cpu, a.peer_cpu).cmp(&(
            natural_key(&b.device),
            b.cpu,
            b.peer_cpu,
        ))
    });
    out
}

/// One device column of the core x device matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceColumn {
    pub device: String,
    pub summary: Summary,
    pub cells: usize,
    /// Column median / median of all column medians.
    pub ratio: Option<f64>,
}

/// Cells of one NUMA node's CPUs on one device.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    pub numa_node: Option<u32>,
    pub device: String,
    pub median: f64,
    pub cells: usize,
    /// Segment median / the median of the device's best segment (a device slow from half
    /// the CPUs would drag its overall median halfway down and hide the slow half).
    pub ratio: Option<f64>,
}

/// A CPU ranked by how it feeds the devices.
#[derive(Debug, Clone, PartialEq)]
pub struct CoreRank {
    pub cpu: u32,
    pub numa_node: Option<u32>,
    /// Median over devices of (cell / device column median).
    pub ratio: f64,
    /// Median of the CPU's cells, bytes per second.
    pub median: f64,
}

/// The core x device matrix, analysed.
#[derive(Debug, Clone, PartialEq)]
pub struct H2dAnalysis {
    pub cells: usize,
    pub measured: usize,
    pub overall: Option<Summary>,
    pub devices: Vec<DeviceColumn>,
    pub segments: Vec<Segment>,
    /// Ascending by ratio.
    pub cores: Vec<CoreRank>,
    /// (cpu, device, value, value / its NUMA segment's median), ascending by ratio; at most
    /// 100.
    pub slowest_cells: Vec<(u32, String, f64, f64)>,
    pub failures: Vec<Failure>,
}

/// A cell below this fraction of its NUMA segment's median on that device is extreme (the
/// seed's 0.2 GB/s cells among 58 GB/s neighbours; a slow segment is its own finding).
pub const EXTREME_CELL_RATIO: f64 = 0.2;

impl H2dAnalysis {
    pub fn of(cells: &[&CellResult], numa: &BTreeMap<u32, u32>) -> H2dAnalysis {
        let values: Vec<(u32, &str, f64)> = cells
            .iter()
            .filter_map(|c| c.value().map(|v| (c.cpu, c.device.as_str(), v)))
            .collect();
        let all: Vec<f64> = values.iter().map(|v| v.2).collect();
        let mut by_device: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let mut by_segment: BTreeMap<(Option<u32>, &str), Vec<f64>> = BTreeMap::new();
        for &(cpu, device, v) in &values {
            by_device.entry(device).or_default().push(v);
            by_segment
                .entry((numa.get(&cpu).copied(), device))
                .or_default()
                .push(v);
        }
        let medians: BTreeMap<&str, f64> = by_device
            .iter()
            .filter_map(|(d, v)| stats::median(v).map(|m| (*d, m)))
            .collect();
        let typical = stats::median(&medians.values().copied().collect::<Vec<_>>());
        let mut devices: Vec<DeviceColumn> = by_device
            .iter()
            .filter_map(|(d, v)| {
                Some(DeviceColumn {
                    device: d.to_string(),
                    summary: Summary::of(v)?,
                    cells: v.len(),
                    ratio: typical.and_then(|t| stats::ratio(medians[d], t)),
                })
            })
            .collect();
        devices.sort_by_key(|d| natural_key(&d.device));
        let segment_medians: BTreeMap<(Option<u32>, &str), (f64, usize)> = by_segment
            .iter()
            .filter_map(|(k, v)| stats::median(v).map(|m| (*k, (m, v.len()))))
            .collect();
        let mut best: BTreeMap<&str, f64> = BTreeMap::new();
        for ((_, d), (m, _)) in &segment_medians {
            let b = best.entry(d).or_insert(*m);
            *b = b.max(*m);
        }
        let mut segments: Vec<Segment> = segment_medians
            .iter()
            .map(|((n, d), (median, cells))| Segment {
                numa_node: *n,
                device: d.to_string(),
                median: *median,
                cells: *cells,
                ratio: stats::ratio(*median, best[d]),
            })
            .collect();
        segments.sort_by_key(|s| (s.numa_node, natural_key(&s.device)));
        let mut per_cpu: BTreeMap<u32, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
        for &(cpu, device, v) in &values {
            let e = per_cpu.entry(cpu).or_default();
            e.0.push(v);
            if let Some(r) = stats::ratio(v, medians[device]) {
                e.1.push(r);
            }
        }
        let mut cores: Vec<CoreRank> = per_cpu
            .into_iter()
            .filter_map(|(cpu, (vals, ratios))| {
                Some(CoreRank {
                    cpu,
                    numa_node: numa.get(&cpu).copied(),
                    ratio: stats::median(&ratios)?,
                    median: stats::median(&vals)?,
                })
            })
            .collect();
        cores.sort_by(|a, b| a.ratio.total_cmp(&b.ratio).then(a.cpu.cmp(&b.cpu)));
        let mut slowest_cells: Vec<(u32, String, f64, f64)> = values
            .iter()
            .filter_map(|&(cpu, d, v)| {
                let (segment, _) = segment_medians[&(numa.get(&cpu).copied(), d)];
                Some((cpu, d.to_string(), v, stats::ratio(v, segment)?))
            })
            .collect();
        slowest_cells.sort_by(|a, b| a.3.total_cmp(&b.3).then(a.0.cmp(&b.0)));
        slowest_cells.truncate(100);
        H2dAnalysis {
            cells: cells.len(),
            measured: values.len(),
            overall: Summary::of(&all),
            devices,
            segments,
            cores,
            slowest_cells,
            failures: failures(cells),
        }
    }

    /// Cells below [`EXTREME_CELL_RATIO`] of their segment's median (at most 100 listed).
    pub fn extreme_cells(&self) -> Vec<&(u32, String, f64, f64)> {
        self.slowest_cells
            .iter()
            .filter(|c| c.3 < EXTREME_CELL_RATIO)
            .collect()
    }

    /// Device columns below [`SLOW_DEVICE_RATIO`].
    pub fn slow_devices(&self) -> Vec<&DeviceColumn> {
        self.devices
            .iter()
            .filter(|d| d.ratio.is_some_and(|r| r < SLOW_DEVICE_RATIO))
            .collect()
    }

    /// Segments below [`SLOW_SEGMENT_RATIO`] of their device's best segment.
    pub fn slow_segments(&self) -> Vec<&Segment> {
        self.segments
            .iter()
            .filter(|s| s.ratio.is_some_and(|r| r < SLOW_SEGMENT_RATIO))
            .collect()
    }

    /// CPUs below [`SLOW_CPU_RATIO`].
    pub fn slow_cores(&self) -> Vec<&CoreRank> {
        self.cores
            .iter()
            .filter(|c| c.ratio < SLOW_CPU_RATIO)
            .collect()
    }
}

/// One CPU's median over the pair cells where it held one rank.
#[derive(Debug, Clone, PartialEq)]
pub struct PairCpu {
    pub rank: u8,
    pub cpu: u32,
    pub numa_node: Option<u32>,
    pub median: f64,
    /// CPU median / median of the whole matrix.
    pub ratio: Option<f64>,
}

/// A rank0-core x rank1-core matrix of one device pair, analysed.
#[derive(Debug, Clone, PartialEq)]
pub struct PairAnalysis {
    pub cells: usize,
    pub measured: usize,
    pub overall: Option<Summary>,
    /// Ascending by ratio.
    pub cpus: Vec<PairCpu>,
    /// (rank 0 NUMA node, rank 1 NUMA node) -> median.
    pub segments: BTreeMap<(Option<u32>, Option<u32>), f64>,
    pub failures: Vec<Failure>,
}

impl PairAnalysis {
    pub fn of(cells: &[&CellResult], numa: &BTreeMap<u32, u32>) -> PairAnalysis {
        let values: Vec<(u32, u32, f64)> = cells
            .iter()
            .filter_map(|c| Some((c.cpu, c.peer_cpu?, c.value()?)))
            .collect();
        let all: Vec<f64> = values.iter().map(|v| v.2).collect();
        let overall = Summary::of(&all);
        let mut per: BTreeMap<(u8, u32), Vec<f64>> = BTreeMap::new();
        let mut blocks: BTreeMap<(Option<u32>, Option<u32>), Vec<f64>> = BTreeMap::new();
        for &(a, b, v) in &values {
            per.entry((0, a)).or_default().push(v);
            per.entry((1, b)).or_default().push(v);
            blocks
                .entry((numa.get(&a).copied(), numa.get(&b).copied()))
                .or_default()
                .push(v);
        }
        let mut cpus: Vec<PairCpu> = per
            .into_iter()
            .filter_map(|((rank, cpu), v)| {
                let median = stats::median(&v)?;
                Some(PairCpu {
                    rank,
                    cpu,
                    numa_node: numa.get(&cpu).copied(),
                    median,
                    ratio: overall.and_then(|o| stats::ratio(median, o.median)),
                })
            })
            .collect();
        cpus.sort_by(|a, b| {
            a.ratio
                .unwrap_or(f64::INFINITY)
                .total_cmp(&b.ratio.unwrap_or(f64::INFINITY))
                .then((a.rank, a.cpu).cmp(&(b.rank, b.cpu)))
        });
        PairAnalysis {
            cells: cells.len(),
            measured: values.len(),
            overall,
            cpus,
            segments: blocks
                .into_iter()
                .filter_map(|(k, v)| stats::median(&v).map(|m| (k, m)))
                .collect(),
            failures: failures(cells),
        }
    }

    /// CPUs below [`SLOW_CPU_RATIO`] on either rank.
    pub fn slow_cpus(&self) -> Vec<&PairCpu> {
        self.cpus
            .iter()
            .filter(|c| c.ratio.is_some_and(|r| r < SLOW_CPU_RATIO))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::run_dir::MatrixKind;
    use crate::report::dataset::MatrixId;

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
        let a = H2dAnalysis::of(&refs, &numa);
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
        assert_eq!(a.cores[0].cpu, 3);
        assert_eq!(a.slow_cores().len(), 1);
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
        let p = PairAnalysis::of(&refs, &numa);
        let slow: Vec<(u8, u32)> = p.slow_cpus().iter().map(|c| (c.rank, c.cpu)).collect();
        assert_eq!(slow, [(0, 1)]);
        assert_eq!(p.segments.len(), 4);
    }

    #[test]
    fn natural_order() {
        let mut v = vec!["10", "2", "numa10", "numa2"];
        v.sort_by_key(|s| natural_key(s));
        assert_eq!(v, ["2", "10", "numa2", "numa10"]);
    }
}
