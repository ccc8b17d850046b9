//! The planner: which cells a window measures next, in groups. The cells of one CPU and one
//! size (every device and direction) form a group, measured back to back with one bound
//! thread and one host buffer (the seed's order), the devices in a fresh random order per
//! group (the seed's lesson: with a fixed order the first device after a fresh pinned buffer
//! looked slow). Groups with a never-measured cell come first, then the ones tried longest
//! ago; ties broken at random; consecutive groups spread round-robin across the NUMA nodes
//! of their CPUs so a short window still touches every segment.

use std::collections::BTreeMap;

use rand::seq::SliceRandom;
use rand::Rng;

use crate::store::{CellKey, Store};

/// The cells of one CPU and size, and the oldest attempt among them.
struct Group {
    oldest: f64,
    cells: Vec<CellKey>,
}

/// Order `universe` for measurement given what `store` already holds. `numa_of` maps a CPU
/// to its NUMA node (cells of unknown nodes share one group). The cells of one CPU and size
/// are consecutive in the result.
pub fn plan<R: Rng + ?Sized>(
    universe: &[CellKey],
    store: &Store,
    numa_of: impl Fn(u32) -> Option<u32>,
    rng: &mut R,
) -> Vec<CellKey> {
    let mut groups: BTreeMap<(u32, u64), Group> = BTreeMap::new();
    for key in universe {
        // Unmeasured (no cell, or a cell without samples that was never tried) sorts first.
        let last = store
            .h2d()
            .get(key)
            .map(|c| c.last_attempt)
            .unwrap_or(f64::NEG_INFINITY);
        let group = groups
            .entry((key.cpu, key.size_bytes))
            .or_insert_with(|| Group {
                oldest: f64::INFINITY,
                cells: Vec::new(),
            });
        group.oldest = group.oldest.min(last);
        group.cells.push(key.clone());
    }
    let mut by_node: BTreeMap<Option<u32>, Vec<Group>> = BTreeMap::new();
    for ((cpu, _), mut group) in groups {
        // A fresh device order for every group.
        group.cells.shuffle(rng);
        by_node.entry(numa_of(cpu)).or_default().push(group);
    }
    let mut queues: Vec<std::vec::IntoIter<Group>> = by_node
        .into_values()
        .map(|mut g| {
            g.shuffle(rng);
            // Stable: equal ages keep their random order.
            g.sort_by(|a, b| a.oldest.total_cmp(&b.oldest));
            g.into_iter()
        })
        .collect();
    queues.shuffle(rng);

    let mut order = Vec::with_capacity(universe.len());
    loop {
        let mut any = false;
        for q in queues.iter_mut() {
            if let Some(group) = q.next() {
                order.extend(group.cells);
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
    use crate::store::Sample;
    use crate::vocab::Direction;
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

    fn cell(cpu: u32, device: usize, size_bytes: u64) -> CellKey {
        CellKey {
            cpu,
            device: device.to_string(),
            size_bytes,
            direction: Direction::H2d,
        }
    }

    fn matrix(cpus: u32, devices: usize, sizes: &[u64]) -> Vec<CellKey> {
        let mut cells = Vec::new();
        for cpu in 0..cpus {
            for device in 0..devices {
                for &size in sizes {
                    cells.push(cell(cpu, device, size));
                }
            }
        }
        cells
    }

    #[test]
    fn cells_of_one_cpu_and_size_are_consecutive() {
        let universe = matrix(8, 16, &[4 << 20, 64 << 20]);
        let mut rng = rand::rngs::StdRng::seed_from_u64(4);
        let order = plan(&universe, &Store::default(), numa, &mut rng);
        assert_eq!(order.len(), universe.len());
        for chunk in order.chunks(16) {
            assert!(
                chunk
                    .iter()
                    .all(|k| (k.cpu, k.size_bytes) == (chunk[0].cpu, chunk[0].size_bytes)),
                "a group is split: {chunk:?}"
            );
            let devices: std::collections::BTreeSet<&str> =
                chunk.iter().map(|k| k.device.as_str()).collect();
            assert_eq!(devices.len(), 16);
        }
        // Groups still alternate between the NUMA nodes.
        for pair in order.chunks(32) {
            assert_ne!(numa(pair[0].cpu), numa(pair[16].cpu), "{order:?}");
        }
    }

    #[test]
    fn device_order_is_random_per_group() {
        let universe = matrix(8, 16, &[4 << 20, 64 << 20]);
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let order = plan(&universe, &Store::default(), numa, &mut rng);
        let orders: std::collections::BTreeSet<Vec<&str>> = order
            .chunks(16)
            .map(|c| c.iter().map(|k| k.device.as_str()).collect())
            .collect();
        assert_eq!(orders.len(), 16, "every group has its own device order");
        let firsts: std::collections::BTreeSet<&str> =
            order.chunks(16).map(|c| c[0].device.as_str()).collect();
        assert!(firsts.len() > 1, "device {firsts:?} always first");
    }

    #[test]
    fn a_group_with_an_unmeasured_cell_goes_first() {
        let universe = matrix(2, 4, &[1 << 20]);
        let mut store = Store::default();
        // CPU 0: all four measured (long ago); CPU 1: three measured recently, one never.
        for device in 0..4 {
            store.record_sample(
                cell(0, device, 1 << 20),
                Sample {
                    bytes_per_second: 1.0,
                    at: 10.0,
                },
                5,
            );
        }
        for device in 0..3 {
            store.record_sample(
                cell(1, device, 1 << 20),
                Sample {
                    bytes_per_second: 1.0,
                    at: 90.0,
                },
                5,
            );
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        let order = plan(&universe, &store, |_| Some(0), &mut rng);
        assert!(order[..4].iter().all(|k| k.cpu == 1), "{order:?}");
        assert!(order[4..].iter().all(|k| k.cpu == 0), "{order:?}");
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
    pair: &crate::vocab::DevicePair,
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
                    pair: pair.clone(),
                    cpu0: groups[a][rng.random_range(0..groups[a].len())],
                    cpu1: groups[b][rng.random_range(0..groups[b].len())],
                };
                if seen.contains(&(key.cpu0, key.cpu1)) {
                    continue;
                }
                let age = last_tried(store, &key);
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

/// One window's pair cells, from each configured pair's picks: interleaved pair by pair,
/// then the cells tried longest ago (never: first) first. A window's budget may fit only a
/// few pair cells, so taking the pairs in their configured order would measure the first
/// pairs every window and never the last ones.
pub fn order_pair_cells(
    per_pair: Vec<Vec<crate::store::PairKey>>,
    store: &Store,
) -> Vec<crate::store::PairKey> {
    let longest = per_pair.iter().map(Vec::len).max().unwrap_or(0);
    let mut queues: Vec<std::vec::IntoIter<crate::store::PairKey>> =
        per_pair.into_iter().map(Vec::into_iter).collect();
    let mut cells = Vec::new();
    for _ in 0..longest {
        cells.extend(queues.iter_mut().filter_map(Iterator::next));
    }
    cells.sort_by(|a, b| last_tried(store, a).total_cmp(&last_tried(store, b)));
    cells
}

/// When `key` was last tried; never: before everything.
fn last_tried(store: &Store, key: &crate::store::PairKey) -> f64 {
    store
        .pairs()
        .get(key)
        .map_or(f64::NEG_INFINITY, |c| c.last_attempt)
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
        let picks = plan_pairs(
            &"0,1".parse().unwrap(),
            &cpus,
            &Store::default(),
            numa,
            16,
            &mut rng,
        );
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
            store.record_sample(
                PairKey {
                    pair: "0,1".parse().unwrap(),
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
        let picks = plan_pairs(
            &"0,1".parse().unwrap(),
            &cpus,
            &store,
            |_| Some(0),
            1,
            &mut rng,
        );
        assert_eq!((picks[0].cpu0, picks[0].cpu1), (1, 1));
    }

    #[test]
    fn a_window_starts_with_the_pair_never_measured_then_the_one_measured_longest_ago() {
        let key = |pair: &str, cpu0, cpu1| PairKey {
            pair: pair.parse().unwrap(),
            cpu0,
            cpu1,
        };
        let mut store = Store::default();
        for (pair, at) in [("0,1", 1.0), ("0,2", 2.0)] {
            for cpus in [(0, 0), (0, 1)] {
                store.record_sample(
                    key(pair, cpus.0, cpus.1),
                    Sample {
                        bytes_per_second: 1.0,
                        at,
                    },
                    5,
                );
            }
        }
        let per_pair = ["0,1", "0,2", "1,2"]
            .iter()
            .map(|p| vec![key(p, 0, 0), key(p, 0, 1)])
            .collect();
        let order: Vec<String> = order_pair_cells(per_pair, &store)
            .iter()
            .map(|k| format!("{} {}x{}", k.pair, k.cpu0, k.cpu1))
            .collect();
        assert_eq!(
            order,
            ["1,2 0x0", "1,2 0x1", "0,1 0x0", "0,1 0x1", "0,2 0x0", "0,2 0x1"]
        );
        // Nothing measured: the pairs take turns.
        let fresh = Store::default();
        let per_pair = ["0,1", "0,2"]
            .iter()
            .map(|p| vec![key(p, 0, 0), key(p, 1, 1)])
            .collect();
        let pairs: Vec<String> = order_pair_cells(per_pair, &fresh)
            .iter()
            .map(|k| k.pair.to_string())
            .collect();
        assert_eq!(pairs, ["0,1", "0,2", "0,1", "0,2"]);
    }

    #[test]
    fn never_more_than_the_matrix() {
        let cpus = [0u32, 1];
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let picks = plan_pairs(
            &"0,1".parse().unwrap(),
            &cpus,
            &Store::default(),
            numa,
            100,
            &mut rng,
        );
        assert!(picks.len() <= 4);
    }
}
