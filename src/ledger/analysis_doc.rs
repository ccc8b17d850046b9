//! The ledger's `analysis` and `findings`: the values `src/analysis` computes for the store's
//! matrices (column ratios, segment medians, pair CPUs, what is below the thresholds of the
//! alert rules), converted to the document's records. Nothing is computed here.

use std::collections::BTreeMap;

use crate::analysis::findings::SLOW_D2D_DEVICE_RATIO;
use crate::analysis::live::MatrixKey;
use crate::analysis::p2p::SLOW_PAIR_RATIO;
use crate::analysis::{
    Cell, CellRanks, NumaMap, StoreAnalysis, EXTREME_CELL_RATIO, SLOW_CPU_RATIO, SLOW_DEVICE_RATIO,
    SLOW_SEGMENT_RATIO,
};
use crate::format::calibration as doc;
use crate::topology::natural::natural_cmp;

fn gbps(v: f64) -> f64 {
    v / 1e9
}

/// `analysis` of the document, pairs in natural order.
pub fn analysis(a: &StoreAnalysis) -> doc::Analysis {
    let mut out = doc::Analysis {
        h2d: a
            .h2d
            .iter()
            .map(|(&(size_bytes, direction), m)| doc::H2dAnalysis {
                size_bytes,
                direction: direction.as_str().to_string(),
                cells: m.cells as u64,
                measured: m.measured as u64,
                median_gbps: m.overall.map(|s| gbps(s.median)),
                devices: m
                    .devices
                    .iter()
                    .map(|d| doc::Column {
                        device: d.device.clone(),
                        median_gbps: gbps(d.summary.median),
                        cells: d.cells as u64,
                        ratio: d.ratio,
                    })
                    .collect(),
                segments: m
                    .segments
                    .iter()
                    .map(|s| doc::Segment {
                        numa_node: s.numa_node,
                        device: s.device.clone(),
                        median_gbps: gbps(s.summary.median),
                        cells: s.cells as u64,
                        ratio: s.ratio,
                    })
                    .collect(),
            })
            .collect(),
        pairs: a
            .pairs
            .iter()
            .map(|(pair, m)| doc::PairAnalysis {
                pair: pair.clone(),
                cells: m.cells as u64,
                measured: m.measured as u64,
                median_gbps: m.overall.map(|s| gbps(s.median)),
                cpus: m
                    .cpus
                    .iter()
                    .map(|c| doc::PairCpu {
                        rank: c.rank,
                        cpu: c.cpu,
                        numa_node: c.numa_node,
                        median_gbps: gbps(c.median),
                        ratio: c.ratio,
                    })
                    .collect(),
            })
            .collect(),
    };
    out.pairs.sort_by(|a, b| natural_cmp(&a.pair, &b.pair));
    out
}

/// `findings` of the document: `analysis::findings` of every matrix (the d2d and p2p lists
/// empty: `super::kinds` fills them).
pub fn findings(
    a: &StoreAnalysis,
    h2d_cells: &BTreeMap<MatrixKey, Vec<&Cell>>,
    numa: &NumaMap,
) -> doc::Findings {
    let mut f = doc::Findings {
        thresholds: doc::Thresholds {
            slow_device_ratio: SLOW_DEVICE_RATIO,
            slow_segment_ratio: SLOW_SEGMENT_RATIO,
            slow_cpu_ratio: SLOW_CPU_RATIO,
            extreme_cell_ratio: EXTREME_CELL_RATIO,
            slow_d2d_device_ratio: SLOW_D2D_DEVICE_RATIO,
            slow_p2p_pair_ratio: SLOW_PAIR_RATIO,
        },
        slow_devices: Vec::new(),
        slow_segments: Vec::new(),
        slow_cores: Vec::new(),
        extreme_cells: Vec::new(),
        slow_pair_cpus: Vec::new(),
        slow_d2d_devices: Vec::new(),
        slow_p2p_pairs: Vec::new(),
    };
    for (key, m) in &a.h2d {
        let (size_bytes, direction) = (key.0, key.1.as_str().to_string());
        for d in m.slow_devices() {
            f.slow_devices.push(doc::SlowDevice {
                size_bytes,
                direction: direction.clone(),
                device: d.device.clone(),
                ratio: d.ratio.unwrap_or_default(),
            });
        }
        for s in m.slow_segments() {
            f.slow_segments.push(doc::SlowSegment {
                size_bytes,
                direction: direction.clone(),
                numa_node: s.numa_node,
                device: s.device.clone(),
                ratio: s.ratio.unwrap_or_default(),
            });
        }
        let cells = h2d_cells.get(key).map(Vec::as_slice).unwrap_or(&[]);
        let ranks = CellRanks::of(cells, numa, m);
        for c in ranks.slow_cores() {
            f.slow_cores.push(doc::SlowCore {
                size_bytes,
                direction: direction.clone(),
                cpu: c.cpu,
                numa_node: c.numa_node,
                ratio: c.ratio,
            });
        }
        for c in ranks.extreme_cells() {
            f.extreme_cells.push(doc::ExtremeCell {
                size_bytes,
                direction: direction.clone(),
                cpu: c.cpu,
                device: c.device.clone(),
                gbps: gbps(c.value),
                ratio: c.ratio,
            });
        }
    }
    for (pair, m) in &a.pairs {
        for c in m.slow_cpus() {
            f.slow_pair_cpus.push(doc::SlowPairCpu {
                pair: pair.clone(),
                rank: c.rank,
                cpu: c.cpu,
                numa_node: c.numa_node,
                ratio: c.ratio.unwrap_or_default(),
            });
        }
    }
    f
}
