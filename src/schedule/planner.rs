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

/// Pick up to `count` core-pair cells of `pair` for a window. With 640 CPUs a pair matrix
/// has 409,600 cells, so cells are sampled, not enumerated: NUMA x NUMA blocks are visited
/// round-robin in random order, and in each block a few random (rank0, rank1) CPU draws
/// compete: a never-measured draw wins, else the one tried longest ago. Coverage spreads over
/// every block first, then fills in.
pub fn plan_pairs<R: Rng + ?Sized>(
    pair: &str,
    cpus: &[u32],
    store: &Store,
    numa_of: impl Fn(u32) -> Option<u32>,
    count: usize,
    rng: &mut R,
) -> Vec<crate::store::PairKey> {
    use crate::store::PairKey;
    const DRAWS: usize = 8;
    let mut by_node: BTreeMap<Option<u32>, Vec<u32>> = BTreeMap::new();
    for &cpu in cpus {
        by_node.entry(numa_of(cpu)).or_default().push(cpu);
    }
    let groups: Vec<&Vec<u32>> = by_node.values().collect();
    if groups.is_empty() || count == 0 {
        return Vec::new();
    }
    let mut blocks: Vec<(usize, usize)> = (0..groups.len())
        .flat_map(|a| (0..groups.len()).map(move |b| (a, b)))
        .collect();
    blocks.shuffle(rng);
    let total_cells = cpus.len() * cpus.len();
    let mut picked: Vec<PairKey> = Vec::with_capacity(count.min(total_cells));
    let mut seen = std::collections::HashSet::new();
    let mut stalled = 0;
    while picked.len() < count.min(total_cells) && stalled < blocks.len() * 4 {
        let before = picked.len();
        for &(a, b) in &blocks {
            if picked.len() >= count.min(total_cells) {
                break;
            }
            let mut best: Option<(f64, PairKey)> = None;
            for _ in 0..DRAWS {
                let key = PairKey {
                    pair: pair.to_string(),
                    cpu0: groups[a][rng.random_range(0..groups[a].len())],
                    cpu1: groups[b][rng.random_range(0..groups[b].len())],
                };
                if seen.contains(&(key.cpu0, key.cpu1)) {
                    continue;
                }
                let age = store
                    .pair
                    .get(&key)
                    .map(|c| c.last_attempt)
                    .unwrap_or(f64::NEG_INFINITY);
                if best.as_ref().is_none_or(|(t, _)| age < *t) {
                    best = Some((age, key));
                }
            }
            if let Some((_, key)) = best {
                seen.insert((key.cpu0, key.cpu1));
                picked.push(key);
            }
        }
        stalled = if picked.len() == before {
            stalled + 1
        } else {
            0
        };
    }
    picked
}

#[cfg(test)]
mod pair_tests {
    use super::*;
    use crate::store::{PairKey, Sample};
    use rand::SeedableRng;

    fn numa(cpu: u32) -> Option<u32> {
        Some(cpu / 4)
    }

    #[test]
    fn first_picks_cover_every_numa_block() {
        let cpus: Vec<u32> = (0..16).collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let picks = plan_pairs("0,1", &cpus, &Store::default(), numa, 16, &mut rng);
        let blocks: std::collections::BTreeSet<_> =
            picks.iter().map(|k| (numa(k.cpu0), numa(k.cpu1))).collect();
        assert_eq!(blocks.len(), 16, "{picks:?}");
        let distinct: std::collections::BTreeSet<_> =
            picks.iter().map(|k| (k.cpu0, k.cpu1)).collect();
        assert_eq!(distinct.len(), picks.len());
    }

    #[test]
    fn unmeasured_cells_win_over_measured_ones() {
        let cpus: Vec<u32> = (0..2).collect();
        let mut store = Store::default();
        for (c0, c1) in [(0, 0), (0, 1), (1, 0)] {
            store.record_pair_sample(
                PairKey {
                    pair: "0,1".into(),
                    cpu0: c0,
                    cpu1: c1,
                },
                Sample {
                    bytes_per_second: 1.0,
                    at: 1.0,
                },
                5,
            );
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let picks = plan_pairs("0,1", &cpus, &store, |_| Some(0), 1, &mut rng);
        assert_eq!((picks[0].cpu0, picks[0].cpu1), (1, 1));
    }

    #[test]
    fn never_more_than_the_matrix() {
        let cpus = [0u32, 1];
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let picks = plan_pairs("0,1", &cpus, &Store::default(), numa, 100, &mut rng);
        assert!(picks.len() <= 4);
    }
}
