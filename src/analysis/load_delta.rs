//! How a load profile moves each device column (`load_profile_delta` of the ledger, from
//! `chd probe --load ...` runs): per device and profile, the column median under that profile
//! over the column median under `idle`, on the matrix that decides the device
//! ([`super::measured_node::deciding_rank`]) among those measured under both.

use std::collections::BTreeMap;

use super::h2d::H2dMatrix;
use super::live::MatrixKey;
use super::measured_node::deciding_rank;
use crate::stats;

/// The profile the others are divided by.
pub const BASELINE_LOAD: &str = "idle";

/// Device -> profile -> ratio to [`BASELINE_LOAD`]; `by_load` is profile -> its matrices.
/// Empty without an idle profile or another one.
pub fn load_profile_delta(
    by_load: &BTreeMap<String, BTreeMap<MatrixKey, H2dMatrix>>,
) -> BTreeMap<String, BTreeMap<String, f64>> {
    let mut out: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    let Some(idle) = by_load.get(BASELINE_LOAD) else {
        return out;
    };
    for (load, matrices) in by_load.iter().filter(|(l, _)| *l != BASELINE_LOAD) {
        // Device -> (rank, ratio) of the deciding matrix measured under both.
        let mut best: BTreeMap<&str, ((u64, std::cmp::Reverse<crate::vocab::Direction>), f64)> =
            BTreeMap::new();
        for (key, matrix) in matrices {
            let Some(base) = idle.get(key) else { continue };
            let rank = deciding_rank(key.0, key.1);
            for col in &matrix.devices {
                let Some(ratio) = base
                    .column(&col.device)
                    .and_then(|b| stats::ratio(col.summary.median, b.summary.median))
                else {
                    continue;
                };
                if best.get(col.device.as_str()).is_none_or(|(r, _)| rank > *r) {
                    best.insert(col.device.as_str(), (rank, ratio));
                }
            }
        }
        for (device, (_, ratio)) in best {
            out.entry(device.to_string())
                .or_default()
                .insert(load.clone(), ratio);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::{Cell, NumaMap};
    use crate::vocab::Direction;

    fn matrix(gbps: &[(&'static str, f64)]) -> H2dMatrix {
        let cells: Vec<Cell> = gbps
            .iter()
            .map(|&(device, g)| Cell {
                cpu: 0,
                peer_cpu: None,
                device,
                value: Some(g * 1e9),
                samples: 1,
                failed: 0,
                last_error: None,
                sampled_at: None,
            })
            .collect();
        H2dMatrix::of(&cells, &NumaMap::new())
    }

    #[test]
    fn each_profile_over_idle_on_the_largest_matrix_of_both() {
        let key = (64 << 20, Direction::H2d);
        let small = (1 << 20, Direction::H2d);
        let by_load = BTreeMap::from([
            (
                "idle".to_string(),
                BTreeMap::from([
                    (key, matrix(&[("0", 50.0), ("1", 40.0)])),
                    (small, matrix(&[("0", 10.0)])),
                ]),
            ),
            (
                "cpu:8".to_string(),
                BTreeMap::from([
                    (key, matrix(&[("0", 25.0), ("1", 40.0)])),
                    (small, matrix(&[("0", 10.0)])),
                ]),
            ),
        ]);
        let delta = load_profile_delta(&by_load);
        assert_eq!(delta["0"]["cpu:8"], 0.5);
        assert_eq!(delta["1"]["cpu:8"], 1.0);
        let only_idle = BTreeMap::from([("idle".to_string(), by_load["idle"].clone())]);
        assert!(load_profile_delta(&only_idle).is_empty());
    }
}
