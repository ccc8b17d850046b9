//! The planner: which cells a window measures next. Never-measured cells first, then the
//! ones tried longest ago; ties broken at random; consecutive picks spread round-robin across
//! the NUMA nodes of the cells' CPUs so a short window still touches every segment.

use std::collections::BTreeMap;

use rand::seq::SliceRandom;
use rand::Rng;

use crate::store::{CellKey, Store};

/// Order `universe` for measurement given what `store` already holds. `numa_of` maps a CPU
/// to its NUMA node (cells of unknown nodes share one group).
pub fn plan<R: Rng + ?Sized>(
    universe: &[CellKey],
    store: &Store,
    numa_of: impl Fn(u32) -> Option<u32>,
    rng: &mut R,
) -> Vec<CellKey> {
    let mut groups: BTreeMap<Option<u32>, Vec<(f64, CellKey)>> = BTreeMap::new();
    for key in universe {
        // Unmeasured (no cell, or a cell without samples that was never tried) sorts first.
        let last = store
            .h2d
            .get(key)
            .map(|c| c.last_attempt)
            .unwrap_or(f64::NEG_INFINITY);
        groups
            .entry(numa_of(key.cpu))
            .or_default()
            .push((last, key.clone()));
    }
    let mut queues: Vec<std::vec::IntoIter<(f64, CellKey)>> = groups
        .into_values()
        .map(|mut g| {
            g.shuffle(rng);
            // Stable: equal ages keep their random order.
            g.sort_by(|a, b| a.0.total_cmp(&b.0));
            g.into_iter()
        })
        .collect();
    queues.shuffle(rng);

    let mut order = Vec::with_capacity(universe.len());
    loop {
        let mut any = false;
        for q in queues.iter_mut() {
            if let Some((_, key)) = q.next() {
                order.push(key);
                any = true;
            }
        }
        if !any {
            break;
        }
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Direction;
    use crate::store::Sample;
    use rand::SeedableRng;

    fn key(cpu: u32) -> CellKey {
        CellKey {
            cpu,
            device: "numa0".into(),
            size_bytes: 1 << 20,
            direction: Direction::H2d,
        }
    }

    fn numa(cpu: u32) -> Option<u32> {
        Some(cpu / 4)
    }

    #[test]
    fn unmeasured_first_then_oldest() {
        let universe: Vec<CellKey> = (0..8).map(key).collect();
        let mut store = Store::default();
        for (cpu, at) in [(0, 50.0), (1, 10.0), (4, 30.0), (5, 20.0)] {
            store.record_sample(
                key(cpu),
                Sample {
                    bytes_per_second: 1.0,
                    at,
                },
                5,
            );
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let order = plan(&universe, &store, numa, &mut rng);
        assert_eq!(order.len(), 8);
        let first4: Vec<u32> = order[..4].iter().map(|k| k.cpu).collect();
        for cpu in [2, 3, 6, 7] {
            assert!(
                first4.contains(&cpu),
                "unmeasured {cpu} not first: {order:?}"
            );
        }
        // Then, per node, oldest first: cpu 1 (t=10) before cpu 0 (t=50), 5 before 4.
        let pos = |c: u32| order.iter().position(|k| k.cpu == c).unwrap();
        assert!(pos(1) < pos(0));
        assert!(pos(5) < pos(4));
    }

    #[test]
    fn picks_alternate_between_numa_nodes() {
        let universe: Vec<CellKey> = (0..8).map(key).collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let order = plan(&universe, &Store::default(), numa, &mut rng);
        for pair in order.chunks(2) {
            assert_ne!(numa(pair[0].cpu), numa(pair[1].cpu), "{order:?}");
        }
    }

    #[test]
    fn order_is_randomized_between_windows() {
        let universe: Vec<CellKey> = (0..64).map(key).collect();
        let a = plan(
            &universe,
            &Store::default(),
            numa,
            &mut rand::rngs::StdRng::seed_from_u64(1),
        );
        let b = plan(
            &universe,
            &Store::default(),
            numa,
            &mut rand::rngs::StdRng::seed_from_u64(2),
        );
        assert_ne!(a, b);
    }
}
