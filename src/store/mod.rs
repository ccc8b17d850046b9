//! The measured matrices: per-cell recent samples (a cell's value is their median), the
//! affinity verdicts, and per-probe success times. Probes write it, scrapes read it, and
//! `persist` saves it to the state file after every window.
//!
//! Each kind of cell is a [`Family`]: its key type names its field of the store, and one
//! generic path records a sample or a failure of any family ([`Store::record_sample`],
//! [`Store::record_error`]) and reads a family back ([`Store::cells`]). The fields are
//! private: every write goes through a method, and every method gives the store a new
//! [`Store::generation`], which is how the exposition knows its cached encoding is stale.

pub mod persist;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::stats;
use crate::topology::pci_link::Link;
use crate::vocab::{DevicePair, Direction, OrderedPair};

/// One cell of the core x device copy matrix.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CellKey {
    pub cpu: u32,
    pub device: String,
    pub size_bytes: u64,
    pub direction: Direction,
}

/// One cell of a core-pair matrix: rank 0 on `cpu0` on the pair's first device, rank 1 on
/// `cpu1` on its second.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PairKey {
    pub pair: DevicePair,
    pub cpu0: u32,
    pub cpu1: u32,
}

/// One same-device copy cell (HBM to HBM): a device and a size, measured from a CPU of the
/// device's NUMA node.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct D2dKey {
    pub device: String,
    pub size_bytes: u64,
}

/// One ordered peer copy cell is keyed by its [`OrderedPair`]: a copy from a buffer on `src`
/// to a buffer on `dst`, issued on a stream of `src`. The size is the configured
/// `probe.p2p_size_mib`; it is not part of the key (one size per node).
pub type P2pKey = OrderedPair;

/// One measurement of a cell.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Bytes per second.
    pub bytes_per_second: f64,
    /// Unix time, seconds, when it was taken.
    pub at: f64,
}

/// A cell's history: its last K samples and when it was last tried.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Cell {
    pub samples: VecDeque<Sample>,
    /// Unix time of the last attempt, successful or not (the planner's "oldest first").
    pub last_attempt: f64,
    /// Consecutive failed attempts since the last success.
    pub consecutive_errors: u32,
}

impl Cell {
    /// Append a sample, keeping at most `keep`.
    pub fn push(&mut self, sample: Sample, keep: usize) {
        self.samples.push_back(sample);
        while self.samples.len() > keep.max(1) {
            self.samples.pop_front();
        }
        self.last_attempt = sample.at;
        self.consecutive_errors = 0;
    }

    /// Count a failed attempt.
    pub fn fail(&mut self, at: f64) {
        self.last_attempt = at;
        self.consecutive_errors = self.consecutive_errors.saturating_add(1);
    }

    /// The cell's value: median of its recent samples.
    pub fn median(&self) -> Option<f64> {
        let values: Vec<f64> = self.samples.iter().map(|s| s.bytes_per_second).collect();
        stats::median(&values)
    }

    /// Unix time of the newest sample.
    pub fn last_sample_at(&self) -> Option<f64> {
        self.samples.back().map(|s| s.at)
    }
}

/// The affinity probe's verdict for one CPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bindable {
    pub bindable: bool,
    pub at: f64,
}

/// A device's PCIe link as sysfs reported it right after chd's copies to the device: the
/// link the measurement ran over (read at scrape time instead, an idle GPU's link reads as
/// 2.5 GT/s: NVIDIA GPUs lower the link speed when idle and raise it again under load).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SeenLink {
    pub link: Link,
    /// Unix time of the reading.
    pub at: f64,
}

/// Everything probes have measured on this node.
///
/// Change it through its methods once it is shared: each of them gives the store a new
/// [`Store::generation`], which is how the exposition knows its cached encoding is stale.
#[derive(Debug, Clone)]
pub struct Store {
    /// Core x device copy matrix.
    h2d: BTreeMap<CellKey, Cell>,
    /// Core-pair matrices, all configured pairs.
    pair: BTreeMap<PairKey, Cell>,
    /// Same-device copy cells, one per device and size.
    d2d: BTreeMap<D2dKey, Cell>,
    /// Ordered peer copy cells, one per ordered device pair measured so far.
    p2p: BTreeMap<P2pKey, Cell>,
    /// CPU id -> affinity verdict.
    bindable: BTreeMap<u32, Bindable>,
    /// Probe name -> unix time of the end of its last window that measured something.
    last_success: BTreeMap<String, f64>,
    /// CPU -> NUMA node of the machine that measured the cells (saved with them, so a
    /// replay of the state file knows the segments).
    cpu_numa: BTreeMap<u32, u32>,
    /// Device -> its PCIe link as seen in the last window that copied to it. Not saved in the
    /// state file: after a restart it is unknown until a window copies to the device again.
    links: BTreeMap<String, SeenLink>,
    /// Changes with every write through a method; unique across all stores of the process.
    generation: u64,
}

/// A kind of cell the store holds: its key type, and the store's field of it. Adding a cell
/// kind is a key type, a field, and this impl; recording and reading come with it.
pub trait Family: Ord + Clone {
    fn cells(store: &Store) -> &BTreeMap<Self, Cell>;
    fn cells_mut(store: &mut Store) -> &mut BTreeMap<Self, Cell>;
}

macro_rules! family {
    ($key:ty, $field:ident) => {
        impl Family for $key {
            fn cells(store: &Store) -> &BTreeMap<$key, Cell> {
                &store.$field
            }
            fn cells_mut(store: &mut Store) -> &mut BTreeMap<$key, Cell> {
                &mut store.$field
            }
        }
    };
}

family!(CellKey, h2d);
family!(PairKey, pair);
family!(D2dKey, d2d);
family!(OrderedPair, p2p);

/// A generation no store of this process has had.
fn next_generation() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Default for Store {
    fn default() -> Store {
        Store {
            h2d: BTreeMap::new(),
            pair: BTreeMap::new(),
            d2d: BTreeMap::new(),
            p2p: BTreeMap::new(),
            bindable: BTreeMap::new(),
            last_success: BTreeMap::new(),
            cpu_numa: BTreeMap::new(),
            links: BTreeMap::new(),
            generation: next_generation(),
        }
    }
}

/// Two stores are equal when they hold the same measurements, whatever their generations.
impl PartialEq for Store {
    fn eq(&self, other: &Store) -> bool {
        self.h2d == other.h2d
            && self.pair == other.pair
            && self.d2d == other.d2d
            && self.p2p == other.p2p
            && self.bindable == other.bindable
            && self.last_success == other.last_success
            && self.cpu_numa == other.cpu_numa
            && self.links == other.links
    }
}

/// The store shared between the prober (writer) and scrapes (readers).
pub type SharedStore = Arc<RwLock<Store>>;

impl Store {
    /// Identifies the store's content: it changes whenever a method writes to the store, so
    /// an encoding of a store tagged with its generation is current while they match.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    fn changed(&mut self) {
        self.generation = next_generation();
    }

    /// The cells of one family (`store.cells::<PairKey>()`).
    pub fn cells<K: Family>(&self) -> &BTreeMap<K, Cell> {
        K::cells(self)
    }

    /// Core x device copy cells.
    pub fn h2d(&self) -> &BTreeMap<CellKey, Cell> {
        &self.h2d
    }

    /// Core-pair cells of every configured pair.
    pub fn pairs(&self) -> &BTreeMap<PairKey, Cell> {
        &self.pair
    }

    /// Same-device copy cells.
    pub fn d2d(&self) -> &BTreeMap<D2dKey, Cell> {
        &self.d2d
    }

    /// Ordered peer copy cells.
    pub fn p2p(&self) -> &BTreeMap<P2pKey, Cell> {
        &self.p2p
    }

    /// CPU id -> affinity verdict.
    pub fn bindable(&self) -> &BTreeMap<u32, Bindable> {
        &self.bindable
    }

    /// Probe name -> unix time of the end of its last window that measured something.
    pub fn last_success(&self) -> &BTreeMap<String, f64> {
        &self.last_success
    }

    /// CPU -> NUMA node of the machine that measured the cells.
    pub fn cpu_numa(&self) -> &BTreeMap<u32, u32> {
        &self.cpu_numa
    }

    /// Device -> the link its last window saw, and when.
    pub fn links(&self) -> &BTreeMap<String, SeenLink> {
        &self.links
    }

    /// Record a successful sample, keeping at most `keep` samples.
    pub fn record_sample<K: Family>(&mut self, key: K, sample: Sample, keep: usize) {
        self.changed();
        K::cells_mut(self)
            .entry(key)
            .or_default()
            .push(sample, keep);
    }

    /// Record a failed attempt: the cell keeps its samples but counts as tried.
    pub fn record_error<K: Family>(&mut self, key: K, at: f64) {
        self.changed();
        K::cells_mut(self).entry(key).or_default().fail(at);
    }

    /// Change the cells of one family in place (a new generation, as for every write).
    pub fn update_cells<K: Family, R>(&mut self, f: impl FnOnce(&mut BTreeMap<K, Cell>) -> R) -> R {
        self.changed();
        f(K::cells_mut(self))
    }

    /// Put a whole cell in (a store being built from a state file or a recording).
    pub fn insert_cell<K: Family>(&mut self, key: K, cell: Cell) {
        self.changed();
        K::cells_mut(self).insert(key, cell);
    }

    /// Record the affinity verdicts of one scan.
    pub fn record_bindable(&mut self, results: &[(u32, bool)], at: f64) {
        self.changed();
        for &(cpu, bindable) in results {
            self.bindable.insert(cpu, Bindable { bindable, at });
        }
    }

    /// Put one CPU's verdict in as it was recorded (a store being built).
    pub fn insert_bindable(&mut self, cpu: u32, verdict: Bindable) {
        self.changed();
        self.bindable.insert(cpu, verdict);
    }

    /// Forget every affinity verdict (a replay serves none of the recorded ones).
    pub fn clear_bindable(&mut self) {
        self.changed();
        self.bindable.clear();
    }

    /// Mark `probe` as having measured something at `at`.
    pub fn record_success(&mut self, probe: &str, at: f64) {
        self.changed();
        self.last_success.insert(probe.to_string(), at);
    }

    /// Set which NUMA node each CPU of the measuring machine is on.
    pub fn set_cpu_numa(&mut self, cpu_numa: BTreeMap<u32, u32>) {
        self.changed();
        self.cpu_numa = cpu_numa;
    }

    /// Record the PCIe link `device` was seen with after a copy.
    pub fn record_link(&mut self, device: &str, link: Link, at: f64) {
        self.changed();
        self.links.insert(device.to_string(), SeenLink { link, at });
    }

    /// Device -> the link its last window saw (without when), as the link analysis takes it.
    pub fn link_by_device(&self) -> BTreeMap<String, Link> {
        self.links
            .iter()
            .map(|(device, seen)| (device.clone(), seen.link))
            .collect()
    }

    /// Keep only cells whose CPU and device satisfy the predicates (after a topology change).
    /// Returns how many cells were dropped.
    pub fn retain_known(
        &mut self,
        cpu_exists: impl Fn(u32) -> bool,
        device_exists: impl Fn(&str) -> bool,
    ) -> usize {
        self.changed();
        let before = self.h2d.len() + self.bindable.len();
        let before = before + self.pair.len() + self.d2d.len() + self.p2p.len();
        self.h2d
            .retain(|k, _| cpu_exists(k.cpu) && device_exists(&k.device));
        self.pair.retain(|k, _| {
            cpu_exists(k.cpu0)
                && cpu_exists(k.cpu1)
                && k.pair.devices().iter().all(|d| device_exists(d))
        });
        self.d2d.retain(|k, _| device_exists(&k.device));
        self.p2p
            .retain(|k, _| device_exists(k.src()) && device_exists(k.dst()));
        self.bindable.retain(|cpu, _| cpu_exists(*cpu));
        self.links.retain(|device, _| device_exists(device));
        before
            - self.h2d.len()
            - self.bindable.len()
            - self.pair.len()
            - self.d2d.len()
            - self.p2p.len()
    }

    /// Cells with at least one sample (cells that only ever failed are left out).
    pub fn measured_cells(&self) -> impl Iterator<Item = (&CellKey, &Cell)> {
        self.h2d.iter().filter(|(_, c)| !c.samples.is_empty())
    }
}

/// Unix time now, seconds.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(cpu: u32, device: &str) -> CellKey {
        CellKey {
            cpu,
            device: device.into(),
            size_bytes: 64 << 20,
            direction: Direction::H2d,
        }
    }

    #[test]
    fn cell_keeps_last_k_samples_and_reports_median() {
        let mut s = Store::default();
        for (i, v) in [1.0, 100.0, 5.0, 6.0, 7.0].into_iter().enumerate() {
            s.record_sample(
                key(0, "numa0"),
                Sample {
                    bytes_per_second: v,
                    at: i as f64,
                },
                3,
            );
        }
        let cell = &s.h2d()[&key(0, "numa0")];
        assert_eq!(cell.samples.len(), 3);
        assert_eq!(cell.median(), Some(6.0));
        assert_eq!(cell.last_attempt, 4.0);
    }

    /// Every write through a method gives a new generation, never one another store of the
    /// process had; reading and cloning keep it; equality ignores it.
    #[test]
    fn every_write_changes_the_generation() {
        let mut s = Store::default();
        let fresh = Store::default();
        assert_ne!(s.generation(), fresh.generation());
        assert_eq!(s, fresh);
        let mut seen = vec![s.generation(), fresh.generation()];
        let sample = Sample {
            bytes_per_second: 1.0,
            at: 1.0,
        };
        let pair = PairKey {
            pair: "0,1".parse().unwrap(),
            cpu0: 0,
            cpu1: 1,
        };
        let d2d = D2dKey {
            device: "0".into(),
            size_bytes: 1,
        };
        let p2p: P2pKey = "0>1".parse().unwrap();
        let writes: [&dyn Fn(&mut Store); 17] = [
            &|s| s.record_sample(key(0, "0"), sample, 3),
            &|s| s.record_error(key(0, "0"), 2.0),
            &|s| s.record_sample(pair.clone(), sample, 3),
            &|s| s.record_error(pair.clone(), 2.0),
            &|s| s.record_sample(d2d.clone(), sample, 3),
            &|s| s.record_error(d2d.clone(), 2.0),
            &|s| s.record_sample(p2p.clone(), sample, 3),
            &|s| s.record_error(p2p.clone(), 2.0),
            &|s| s.insert_cell(p2p.clone(), Cell::default()),
            &|s| s.record_bindable(&[(0, true)], 2.0),
            &|s| {
                let verdict = Bindable {
                    bindable: false,
                    at: 3.0,
                };
                s.insert_bindable(1, verdict)
            },
            &|s| s.record_success("h2d", 2.0),
            &|s| s.set_cpu_numa(BTreeMap::from([(0, 0)])),
            &|s| s.clear_bindable(),
            &|s| s.update_cells(|_: &mut BTreeMap<D2dKey, Cell>| ()),
            &|s| {
                let state = crate::topology::pci_link::LinkState {
                    width: 16,
                    transfers_per_second: 32_000_000_000,
                };
                let link = Link {
                    current: state,
                    max: state,
                };
                s.record_link("0", link, 2.0)
            },
            &|s| {
                s.retain_known(|_| true, |_| true);
            },
        ];
        for write in writes {
            write(&mut s);
            assert!(!seen.contains(&s.generation()));
            seen.push(s.generation());
            let _ = s.measured_cells().count();
            assert_eq!(s.clone().generation(), s.generation());
        }
    }

    #[test]
    fn errors_count_as_attempts_without_samples() {
        let mut s = Store::default();
        s.record_error(key(1, "numa0"), 10.0);
        s.record_error(key(1, "numa0"), 11.0);
        let cell = &s.h2d()[&key(1, "numa0")];
        assert_eq!(cell.consecutive_errors, 2);
        assert_eq!(cell.median(), None);
        assert_eq!(s.measured_cells().count(), 0);
    }

    #[test]
    fn retain_known_drops_vanished_cpus_and_devices() {
        let mut s = Store::default();
        let sample = Sample {
            bytes_per_second: 1.0,
            at: 0.0,
        };
        s.record_sample(key(0, "numa0"), sample, 5);
        s.record_sample(key(7, "numa0"), sample, 5);
        s.record_sample(key(0, "numa3"), sample, 5);
        s.record_bindable(&[(0, true), (7, false)], 0.0);
        for device in ["numa0", "numa3"] {
            let key = D2dKey {
                device: device.into(),
                size_bytes: 1,
            };
            s.record_sample(key, sample, 5);
        }
        for pair in ["numa0>numa3", "numa3>numa0"] {
            let key: P2pKey = pair.parse().unwrap();
            s.record_sample(key, sample, 5);
        }
        let dropped = s.retain_known(|c| c < 4, |d| d == "numa0");
        assert_eq!(dropped, 6);
        assert!(s.p2p().is_empty());
        assert_eq!(s.d2d().len(), 1);
        assert_eq!(s.h2d().len(), 1);
        assert_eq!(s.bindable().len(), 1);
    }
}
