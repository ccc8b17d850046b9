//! The ledger's seed fields of measurements: `h2d_gbps_by_core_device` and
//! `d2d_alg_gbps_by_core_pair` (per cell its value, samples and age) and
//! `affinity_bindable_cpus`.

use std::collections::BTreeMap;

use crate::format::calibration as doc;
use crate::store::{Bindable, Cell, CellKey, PairKey};
use crate::topology::cpulist;
use crate::topology::natural::natural_cmp;
use crate::vocab::DevicePair;

fn age(cell: &Cell, now: f64) -> Option<f64> {
    cell.last_sample_at().map(|at| (now - at).max(0.0))
}

/// One matrix per (size, direction), its cells by CPU then device in natural order.
pub fn h2d(cells: &BTreeMap<CellKey, Cell>, now: f64) -> Vec<doc::H2dMatrix> {
    let mut by: BTreeMap<(u64, crate::vocab::Direction), Vec<doc::H2dCell>> = BTreeMap::new();
    for (k, c) in cells {
        by.entry((k.size_bytes, k.direction))
            .or_default()
            .push(doc::H2dCell {
                cpu: k.cpu,
                device: k.device.clone(),
                gbps: c.median().map(|v| v / 1e9),
                samples: c.samples.len() as u64,
                age_seconds: age(c, now),
            });
    }
    by.into_iter()
        .map(|((size_bytes, direction), mut cells)| {
            cells.sort_by(|a, b| a.cpu.cmp(&b.cpu).then(natural_cmp(&a.device, &b.device)));
            doc::H2dMatrix {
                size_bytes,
                direction: direction.as_str().to_string(),
                cells,
            }
        })
        .collect()
}

/// One matrix per configured pair (and per pair the store has cells of), in natural order.
pub fn pairs(
    cells: &BTreeMap<PairKey, Cell>,
    pairs: &[DevicePair],
    now: f64,
) -> Vec<doc::PairMatrix> {
    let mut by: BTreeMap<&str, Vec<doc::PairCell>> =
        pairs.iter().map(|p| (p.as_str(), Vec::new())).collect();
    for (k, c) in cells {
        by.entry(k.pair.as_str()).or_default().push(doc::PairCell {
            rank0_cpu: k.cpu0,
            rank1_cpu: k.cpu1,
            gbps: c.median().map(|v| v / 1e9),
            samples: c.samples.len() as u64,
            age_seconds: age(c, now),
        });
    }
    let mut out: Vec<doc::PairMatrix> = by
        .into_iter()
        .map(|(pair, cells)| doc::PairMatrix {
            pair: pair.to_string(),
            cells,
        })
        .collect();
    out.sort_by(|a, b| natural_cmp(&a.pair, &b.pair));
    out
}

/// The affinity probe's verdicts: the store's, else a recording's (`recorded`, of unknown
/// age).
pub fn affinity(
    bindable: &BTreeMap<u32, Bindable>,
    recorded: &[(u32, bool)],
    now: f64,
) -> doc::Affinity {
    if bindable.is_empty() && !recorded.is_empty() {
        let list = |want: bool| {
            let mut ids: Vec<u32> = recorded
                .iter()
                .filter(|(_, b)| *b == want)
                .map(|(c, _)| *c)
                .collect();
            ids.sort_unstable();
            ids.dedup();
            cpulist::format(&ids)
        };
        return doc::Affinity {
            probed: true,
            bindable: list(true),
            not_bindable: list(false),
            age_seconds: None,
        };
    }
    let (yes, no): (Vec<(&u32, &Bindable)>, Vec<_>) =
        bindable.iter().partition(|(_, b)| b.bindable);
    let ids =
        |v: &[(&u32, &Bindable)]| cpulist::format(&v.iter().map(|(c, _)| **c).collect::<Vec<_>>());
    doc::Affinity {
        probed: !bindable.is_empty(),
        bindable: ids(&yes),
        not_bindable: ids(&no),
        age_seconds: bindable
            .values()
            .map(|b| b.at)
            .min_by(f64::total_cmp)
            .map(|at| (now - at).max(0.0)),
    }
}
