//! The neutral form every report is made from: cells with their samples and errors, grouped
//! into matrices, plus the NUMA layout and devices to label them. Built from a chd run
//! directory ([`Dataset::from_run`]), a ClusterHealthDetect recording
//! ([`Dataset::from_recording`]), workbook ([`workbook`]) or size-sweep files
//! ([`sweep_files`]) by [`load`] / [`load_all`], and convertible into a [`Store`] for serving;
//! [`cells`] hands its cells to [`crate::analysis`]. `report` renders it and `replay` serves
//! it; neither names the other.

pub mod cells;
pub mod input;
pub mod sweep_files;
pub mod timing;
pub mod workbook;

pub use input::{load, load_all, LoadError};

use std::collections::{BTreeMap, HashMap};

use crate::analysis::limits::{self, DeviceFacts, MemoryBus, PathLimits};
use crate::format::cluster_health::{self, RecordedCpu, Recording, Rejected};
use crate::format::run_dir::{DeviceMeta, MatrixKind, RunFile, SampleRecord};
use crate::probe::kind::{Layout, MatrixFacts};
use crate::probe::kinds;
use crate::stats;
use crate::store::{CellKey, D2dKey, PairKey, Sample, Store};
use crate::topology::pci_link::{Link, LinkState};
use crate::vocab::{DevicePair, Direction};

/// Which matrix a cell belongs to. For a pair matrix `pair` names the device pair.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MatrixId {
    pub kind: MatrixKind,
    pub size_bytes: u64,
    pub direction: String,
    pub host_memory: String,
    pub load: String,
    pub pair: Option<String>,
}

/// One cell: every sample measured for it and every failure.
#[derive(Debug, Clone, PartialEq)]
pub struct CellResult {
    pub matrix: MatrixId,
    /// The probing CPU (rank 0's for a pair cell).
    pub cpu: u32,
    /// Rank 1's CPU for a pair cell.
    pub peer_cpu: Option<u32>,
    /// Device label; the pair for a pair cell.
    pub device: String,
    /// Successful samples, bytes per second.
    pub samples: Vec<f64>,
    /// Failed samples' messages.
    pub errors: Vec<String>,
}

impl CellResult {
    /// The cell's value: median of its samples.
    pub fn value(&self) -> Option<f64> {
        stats::median(&self.samples)
    }
}

/// What [`Dataset::to_store`] does with a cell.
#[derive(Debug, Clone)]
enum Fate {
    H2d(Direction),
    /// A pair cell: its pair, and rank 1's CPU.
    Pair(DevicePair, u32),
    /// A pair cell whose device is no device pair (`A,B`).
    NoPair,
    OtherLoad,
    OtherDirection,
    /// A cell of a kind a store does not hold: a basics cell, a point of a size curve.
    OtherKind(MatrixKind),
    OtherPairSize,
    /// A same-device copy cell.
    D2d,
    /// A peer copy cell (`SRC>DST`).
    P2p(crate::vocab::OrderedPair),
}

/// Everything a report shows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Dataset {
    /// Where the data came from, for the report header.
    pub source: String,
    /// Ordered descriptive facts (host, backend, parameters).
    pub meta: Vec<(String, String)>,
    /// NUMA node -> CPUs.
    pub numa_nodes: BTreeMap<u32, Vec<u32>>,
    pub devices: Vec<DeviceMeta>,
    /// The backend's name (`cuda`, `acl`, `host`) where the input records it, else empty.
    pub backend: String,
    pub cells: Vec<CellResult>,
    /// Affinity verdicts (cpu, bindable), when an affinity probe ran.
    pub affinity: Vec<(u32, bool)>,
    /// What a recording said of each CPU (package, core), when it said it.
    pub cpu_records: Vec<RecordedCpu>,
    /// Rows of the input that could not be used, by reason.
    pub rejected: Vec<Rejected>,
    /// Set when the input is a partial checkpoint of a run that did not finish: how far it got.
    pub partial: Option<String>,
    /// What the reader did or found that the reader of a report should know.
    pub notes: Vec<String>,
    /// A basics run's measurements it could not make at all, and why.
    pub basics_unavailable: Vec<(String, String)>,
    /// P2p runs: each ordered pair's PCIe path class (`run.json`'s `p2p_paths`).
    pub p2p_paths: BTreeMap<String, String>,
    /// P2p runs: how each ordered pair was measured (`copy`, `copy-staged`).
    pub p2p_methods: BTreeMap<String, String>,
}

/// One sample on its way into a cell, borrowed from a run's record or a recording's sample.
struct SampleView<'a> {
    kind: MatrixKind,
    load: &'a str,
    cpu: u32,
    peer_cpu: Option<u32>,
    device: &'a str,
    size_bytes: u64,
    direction: &'a str,
    host_memory: &'a str,
    /// Bytes per second, or the failure's message.
    outcome: Result<f64, &'a str>,
}

/// Whether `kind`'s matrices are one per device pair (the pair is part of their identity).
fn per_pair(kind: MatrixKind) -> bool {
    kinds::of(kind).layout() == Layout::CpuPairs
}

impl MatrixId {
    /// Whether `s` belongs to this matrix.
    fn holds(&self, s: &SampleView) -> bool {
        self.kind == s.kind
            && self.size_bytes == s.size_bytes
            && self.direction == s.direction
            && self.host_memory == s.host_memory
            && self.load == s.load
            && match (&self.pair, per_pair(s.kind)) {
                (Some(pair), true) => pair == s.device,
                (None, per_pair) => !per_pair,
                _ => false,
            }
    }
}

/// Where each cell of a dataset is, by matrix, CPUs and device, the matrices and devices
/// numbered once each (a cell's key holds no strings).
#[derive(Default)]
struct CellIndex {
    matrices: Vec<MatrixId>,
    /// The matrix the last sample belonged to (samples come in runs of one matrix).
    last: usize,
    devices: HashMap<String, u32>,
    cells: HashMap<(u32, u32, Option<u32>, u32), usize>,
}

impl CellIndex {
    fn of(cells: &[CellResult]) -> CellIndex {
        let mut index = CellIndex::default();
        for (i, c) in cells.iter().enumerate() {
            let matrix = match index.matrices.iter().position(|m| *m == c.matrix) {
                Some(m) => m,
                None => {
                    index.matrices.push(c.matrix.clone());
                    index.matrices.len() - 1
                }
            };
            let device = index.device(&c.device);
            index
                .cells
                .insert((matrix as u32, c.cpu, c.peer_cpu, device), i);
        }
        index
    }

    fn matrix(&mut self, s: &SampleView) -> u32 {
        if !self.matrices.get(self.last).is_some_and(|m| m.holds(s)) {
            self.last = match self.matrices.iter().position(|m| m.holds(s)) {
                Some(m) => m,
                None => {
                    self.matrices.push(MatrixId {
                        kind: s.kind,
                        size_bytes: s.size_bytes,
                        direction: s.direction.to_string(),
                        host_memory: s.host_memory.to_string(),
                        load: s.load.to_string(),
                        pair: per_pair(s.kind).then(|| s.device.to_string()),
                    });
                    self.matrices.len() - 1
                }
            };
        }
        self.last as u32
    }

    fn device(&mut self, device: &str) -> u32 {
        if let Some(&d) = self.devices.get(device) {
            return d;
        }
        let d = self.devices.len() as u32;
        self.devices.insert(device.to_string(), d);
        d
    }
}

pub use crate::vocab::size_label;

/// The PCIe link a run recorded for a device.
pub fn device_link(meta: &DeviceMeta) -> Option<Link> {
    let r = meta.link?;
    Some(Link {
        current: LinkState {
            width: r.current_width,
            transfers_per_second: r.current_transfers_per_second,
        },
        max: LinkState {
            width: r.max_width,
            transfers_per_second: r.max_transfers_per_second,
        },
    })
}

impl Dataset {
    /// The limits of each device's paths the input records ([`crate::analysis::limits`]):
    /// its configured table, its memory as NVML gave it, its PCIe link where the backend's
    /// host copies go over PCIe alone.
    pub fn path_limits(&self) -> PathLimits {
        let facts: Vec<DeviceFacts> = self
            .devices
            .iter()
            .map(|d| DeviceFacts {
                device: d.id.clone(),
                model: d.name.clone(),
                link: device_link(d),
                memory: d.memory.map(|m| MemoryBus {
                    bus_width_bits: m.bus_width_bits,
                    max_clock_mhz: m.max_clock_mhz,
                }),
                pcie_host_path: limits::pcie_host_path(&self.backend),
            })
            .collect();
        let models: BTreeMap<String, limits::ModelLimits> = self
            .devices
            .iter()
            .filter(|d| !d.limits_gbps.is_empty())
            .map(|d| (d.name.clone(), limits::model_limits(&d.limits_gbps)))
            .collect();
        PathLimits::build(&facts, &models)
    }

    /// A chd run: its plan and machine from `run.json`, its samples from `cells.jsonl`.
    pub fn from_run(run: &RunFile, records: &[SampleRecord]) -> Dataset {
        let plan = &run.plan;
        let m = &run.machine;
        let mut meta = vec![
            ("host".to_string(), m.hostname.clone()),
            ("backend".to_string(), m.backend_description.clone()),
            ("chd".to_string(), m.chd_version.clone()),
            ("probe".to_string(), plan.probe.as_str().to_string()),
            (
                "cpus".to_string(),
                format!(
                    "{} ({})",
                    plan.cpus.len(),
                    crate::topology::cpulist::format(&plan.cpus)
                ),
            ),
        ];
        let kind = kinds::of(plan.probe);
        meta.extend(kind.plan_facts(plan));
        meta.extend(kind.methods_fact(&run.pair_methods));
        let sizes: Vec<String> = plan.sizes_bytes.iter().map(|s| size_label(*s)).collect();
        meta.extend([
            ("sizes".to_string(), sizes.join(", ")),
            (
                kind.directions_fact().to_string(),
                plan.directions.join(", "),
            ),
            ("host memory".to_string(), plan.host_memories.join(", ")),
            (
                "per sample".to_string(),
                format!(
                    "{} warm-up + {} timed {}",
                    plan.warmup,
                    plan.iterations,
                    kind.per_sample()
                ),
            ),
            ("repeats".to_string(), plan.repeats.to_string()),
            ("load profiles".to_string(), plan.loads.join(", ")),
            (
                "samples".to_string(),
                format!("{} of {} measured", records.len(), kinds::total_slots(plan)),
            ),
        ]);
        meta.extend(timing::meta_row(records));
        if let Some(ms) = plan.timeout_ms {
            meta.push((
                "timeout per cell".to_string(),
                humantime::format_duration(std::time::Duration::from_millis(ms)).to_string(),
            ));
        }
        let mut ds = Dataset {
            source: "chd probe run".into(),
            meta,
            numa_nodes: m.numa_nodes.clone(),
            devices: m.devices.clone(),
            backend: m.backend.clone(),
            basics_unavailable: plan
                .unavailable
                .iter()
                .map(|(op, why)| (op.clone(), why.clone()))
                .collect(),
            ..Dataset::default()
        };
        if kind.layout() == Layout::SourceByDestination {
            ds.p2p_paths = run.p2p_paths.clone();
            ds.p2p_methods = run.pair_methods.clone();
        }
        ds.add_records(records);
        ds
    }

    /// A ClusterHealthDetect recording, consumed: each sample is folded into its cell and
    /// dropped, so the samples and the cells are not held twice.
    pub fn from_recording(rec: Recording) -> Dataset {
        let files: Vec<String> = rec.files.iter().map(|f| f.display().to_string()).collect();
        let mut meta = rec.meta;
        meta.push(("samples".into(), rec.samples.len().to_string()));
        if let Some(summary) = cluster_health::rejected_summary(&rec.rejected) {
            meta.push(("rows not used".into(), summary));
        }
        if !rec.other_tests.is_empty() {
            meta.push((
                "other tests (not shown)".into(),
                cluster_health::other_tests_text(&rec.other_tests),
            ));
        }
        let kind = rec.device_kind.unwrap_or_default();
        let mut ds = Dataset {
            source: format!("ClusterHealthDetect {}", files.join(" + ")),
            meta,
            numa_nodes: rec.numa_nodes,
            devices: rec
                .devices
                .into_iter()
                .map(|id| DeviceMeta {
                    id,
                    name: String::new(),
                    kind: kind.clone(),
                    pci_bus_id: String::new(),
                    numa_node: None,
                    link: None,
                    memory: None,
                    limits_gbps: Default::default(),
                })
                .collect(),
            affinity: rec
                .cpus
                .iter()
                .filter_map(|c| c.bindable.map(|b| (c.cpu, b)))
                .collect(),
            cpu_records: rec.cpus,
            rejected: rec.rejected,
            partial: rec.partial,
            notes: rec.notes,
            backend: String::new(),
            cells: Vec::new(),
            basics_unavailable: Vec::new(),
            p2p_paths: BTreeMap::new(),
            p2p_methods: BTreeMap::new(),
        };
        let mut index = CellIndex::of(&ds.cells);
        for s in rec.samples {
            ds.add_sample(
                &mut index,
                &SampleView {
                    kind: s.matrix,
                    load: &s.load,
                    cpu: s.cpu,
                    peer_cpu: s.peer_cpu,
                    device: &s.device,
                    size_bytes: s.size_bytes,
                    direction: &s.direction,
                    host_memory: &s.host_memory,
                    outcome: s.outcome.as_ref().copied().map_err(|f| f.message.as_str()),
                },
            );
        }
        ds
    }

    /// Fold sample records into cells.
    pub fn add_records(&mut self, records: &[SampleRecord]) {
        let mut index = CellIndex::of(&self.cells);
        for r in records {
            let s = r.slot.record();
            let outcome = match (r.bytes_per_second, &r.error) {
                (Some(v), _) => Ok(v),
                (None, e) => Err(e.as_deref().unwrap_or("no value")),
            };
            self.add_sample(
                &mut index,
                &SampleView {
                    kind: s.matrix,
                    load: &s.load,
                    cpu: s.cpu,
                    peer_cpu: s.peer_cpu,
                    device: &s.device,
                    size_bytes: s.size_bytes,
                    direction: &s.direction,
                    host_memory: &s.host_memory,
                    outcome,
                },
            );
        }
    }

    /// Add one sample to its cell, the cell to `cells` when it is new.
    fn add_sample(&mut self, index: &mut CellIndex, s: &SampleView) {
        let matrix = index.matrix(s);
        let device = index.device(s.device);
        let key = (matrix, s.cpu, s.peer_cpu, device);
        let i = *index.cells.entry(key).or_insert_with(|| {
            self.cells.push(CellResult {
                matrix: index.matrices[matrix as usize].clone(),
                cpu: s.cpu,
                peer_cpu: s.peer_cpu,
                device: s.device.to_string(),
                samples: Vec::new(),
                errors: Vec::new(),
            });
            self.cells.len() - 1
        });
        match s.outcome {
            Ok(v) => self.cells[i].samples.push(v),
            Err(e) => self.cells[i].errors.push(e.to_string()),
        }
    }

    /// The NUMA node of `cpu`, if known.
    pub fn numa_of(&self, cpu: u32) -> Option<u32> {
        self.numa_nodes
            .iter()
            .find(|(_, cpus)| cpus.contains(&cpu))
            .map(|(n, _)| *n)
    }

    /// CPU -> NUMA node for every CPU the layout names.
    pub fn numa_map(&self) -> BTreeMap<u32, u32> {
        self.numa_nodes
            .iter()
            .flat_map(|(n, cpus)| cpus.iter().map(move |c| (*c, *n)))
            .collect()
    }

    /// The cells of CPU-indexed matrices (core x device, core-pair) grouped by matrix; the
    /// other kinds' cells (basics) have tables of their own.
    pub fn matrices(&self) -> BTreeMap<&MatrixId, Vec<&CellResult>> {
        let mut out: BTreeMap<&MatrixId, Vec<&CellResult>> = BTreeMap::new();
        for c in self
            .cells
            .iter()
            .filter(|c| kinds::layout(c.matrix.kind).is_matrix())
        {
            out.entry(&c.matrix).or_default().push(c);
        }
        out
    }

    /// The matrices' distinguishing parts that vary within this dataset, for names: a run of
    /// one direction, memory kind and load gets `h2d_64MiB`, others get suffixes.
    pub fn matrix_name(&self, id: &MatrixId) -> String {
        let vary = |f: &dyn Fn(&MatrixId) -> &str| {
            let mut values: Vec<&str> = self
                .cells
                .iter()
                .filter(|c| c.matrix.kind == id.kind)
                .map(|c| f(&c.matrix))
                .collect();
            values.sort_unstable();
            values.dedup();
            values.len() > 1
        };
        let mut name = id.kind.as_str().to_string();
        if let Some(pair) = &id.pair {
            name.push('_');
            name.push_str(&pair.replace(',', "-"));
        }
        name.push('_');
        name.push_str(&size_label(id.size_bytes));
        if vary(&|m| m.direction.as_str()) {
            name.push('_');
            name.push_str(&id.direction);
        }
        if vary(&|m| m.host_memory.as_str()) {
            name.push('_');
            name.push_str(&id.host_memory);
        }
        if vary(&|m| m.load.as_str()) {
            name.push('_');
            name.push_str(&id.load);
        }
        name.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.' {
                    c
                } else {
                    '-'
                }
            })
            .collect()
    }

    /// A human title: `H2D 64MiB h2d, pinned memory, load idle` (the kind's own words).
    pub fn matrix_title(id: &MatrixId) -> String {
        kinds::of(id.kind).matrix_title(&MatrixFacts {
            size_bytes: id.size_bytes,
            direction: &id.direction,
            host_memory: &id.host_memory,
            load: &id.load,
            pair: id.pair.as_deref(),
        })
    }

    /// The load profile [`Dataset::to_store`] serves: `idle`, else the first.
    pub fn served_load(&self) -> Option<&str> {
        let mut loads = self.cells.iter().map(|c| c.matrix.load.as_str());
        if self.cells.iter().any(|c| c.matrix.load == "idle") {
            Some("idle")
        } else {
            loads.next()
        }
    }

    /// The size [`Dataset::to_store`] serves of each device pair: a store holds one pair
    /// matrix per pair (`chd serve` measures one size), so the largest recorded.
    fn served_pair_sizes(&self) -> BTreeMap<&str, u64> {
        let served = self.served_load();
        let mut sizes: BTreeMap<&str, u64> = BTreeMap::new();
        for c in &self.cells {
            if per_pair(c.matrix.kind) && Some(c.matrix.load.as_str()) == served {
                let s = sizes.entry(c.device.as_str()).or_default();
                *s = (*s).max(c.matrix.size_bytes);
            }
        }
        sizes
    }

    /// Every cell with what [`Dataset::to_store`] does with it.
    fn fates(&self) -> Vec<(&CellResult, Fate)> {
        let served = self.served_load();
        let pair_sizes = self.served_pair_sizes();
        self.cells
            .iter()
            .map(|c| {
                let fate = if Some(c.matrix.load.as_str()) != served {
                    Fate::OtherLoad
                } else {
                    match (kinds::of(c.matrix.kind).layout(), c.peer_cpu) {
                        (Layout::CpuByDevice, _) => match c.matrix.direction.parse::<Direction>() {
                            Ok(d) => Fate::H2d(d),
                            Err(_) => Fate::OtherDirection,
                        },
                        (Layout::CpuPairs, Some(peer))
                            if pair_sizes.get(c.device.as_str()) == Some(&c.matrix.size_bytes) =>
                        {
                            match c.device.parse() {
                                Ok(pair) => Fate::Pair(pair, peer),
                                Err(_) => Fate::NoPair,
                            }
                        }
                        (Layout::CpuPairs, Some(_)) => Fate::OtherPairSize,
                        (Layout::CpuPairs, None) => Fate::OtherDirection,
                        (Layout::Devices, _) => Fate::D2d,
                        (Layout::SourceByDestination, _) => match c.device.parse() {
                            Ok(pair) => Fate::P2p(pair),
                            Err(_) => Fate::OtherKind(c.matrix.kind),
                        },
                        _ => Fate::OtherKind(c.matrix.kind),
                    }
                };
                (c, fate)
            })
            .collect()
    }

    /// The cells [`Dataset::to_store`] serves.
    pub fn served_cells(&self) -> impl Iterator<Item = &CellResult> {
        self.fates()
            .into_iter()
            .filter(|(_, f)| matches!(f, Fate::H2d(_) | Fate::Pair(..) | Fate::D2d | Fate::P2p(_)))
            .map(|(c, _)| c)
    }

    /// What [`Dataset::to_store`] leaves out, one line each: the cells of other load
    /// profiles, H2D cells whose direction is neither `h2d` nor `d2h`, and pair cells of
    /// other sizes than the served one.
    pub fn unservable(&self) -> Vec<String> {
        let served = self.served_load();
        let pair_sizes = self.served_pair_sizes();
        let mut other_loads: BTreeMap<&str, usize> = BTreeMap::new();
        let mut directions: BTreeMap<&str, usize> = BTreeMap::new();
        let mut other_pair_sizes: BTreeMap<(&str, u64), usize> = BTreeMap::new();
        let mut other_kinds: BTreeMap<MatrixKind, usize> = BTreeMap::new();
        let mut no_pair = 0;
        for (c, fate) in self.fates() {
            match fate {
                Fate::OtherKind(kind) => *other_kinds.entry(kind).or_default() += 1,
                Fate::OtherLoad => *other_loads.entry(c.matrix.load.as_str()).or_default() += 1,
                Fate::OtherDirection => {
                    *directions.entry(c.matrix.direction.as_str()).or_default() += 1
                }
                Fate::OtherPairSize => {
                    *other_pair_sizes
                        .entry((c.device.as_str(), c.matrix.size_bytes))
                        .or_default() += 1
                }
                Fate::NoPair => no_pair += 1,
                Fate::H2d(_) | Fate::Pair(..) | Fate::D2d | Fate::P2p(_) => {}
            }
        }
        let mut out = Vec::new();
        for (kind, n) in other_kinds {
            out.push(match kinds::of(kind).layout() {
                Layout::Curves => format!(
                    "{n} size-curve points (chd probe sweep) are not served (a store holds no \
                     size curves)"
                ),
                _ => format!(
                    "{n} {} cells are not served (a store holds core x device and core-pair \
                     matrices)",
                    kind.as_str()
                ),
            });
        }
        for (load, n) in other_loads {
            out.push(format!(
                "{n} cells under load profile {load:?} are not served (a store holds one \
                 profile: {})",
                served.unwrap_or("none")
            ));
        }
        if no_pair > 0 {
            out.push(format!(
                "{no_pair} pair cells are not served: their device names no device pair (A,B)"
            ));
        }
        for (direction, n) in directions {
            out.push(format!(
                "{n} cells with direction {direction:?} are not served (not h2d or d2h)"
            ));
        }
        for ((pair, size), n) in other_pair_sizes {
            out.push(format!(
                "{n} pair {pair} cells of {} are not served (a store holds one pair matrix \
                 per pair: {})",
                size_label(size),
                pair_sizes
                    .get(pair)
                    .map(|s| size_label(*s))
                    .unwrap_or_default()
            ));
        }
        out
    }

    /// The `idle` (else first) load's cells as a [`Store`] (core x device and core-pair
    /// matrices, one size per pair), each cell keeping at most `keep` samples stamped `at`:
    /// what `chd serve --replay` can serve.
    pub fn to_store(&self, keep: usize, at: f64) -> Store {
        let mut store = Store::default();
        for (c, fate) in self.fates() {
            let sample = |v: f64| Sample {
                bytes_per_second: v,
                at,
            };
            match fate {
                Fate::H2d(direction) => {
                    let key = CellKey {
                        cpu: c.cpu,
                        device: c.device.clone(),
                        size_bytes: c.matrix.size_bytes,
                        direction,
                    };
                    if c.samples.is_empty() {
                        store.record_error(key.clone(), at);
                    }
                    for &v in &c.samples {
                        store.record_sample(key.clone(), sample(v), keep);
                    }
                }
                Fate::Pair(pair, peer) => {
                    let key = PairKey {
                        pair,
                        cpu0: c.cpu,
                        cpu1: peer,
                    };
                    if c.samples.is_empty() {
                        store.record_error(key.clone(), at);
                    }
                    for &v in &c.samples {
                        store.record_sample(key.clone(), sample(v), keep);
                    }
                }
                Fate::D2d => {
                    let key = D2dKey {
                        device: c.device.clone(),
                        size_bytes: c.matrix.size_bytes,
                    };
                    if c.samples.is_empty() {
                        store.record_error(key.clone(), at);
                    }
                    for &v in &c.samples {
                        store.record_sample(key.clone(), sample(v), keep);
                    }
                }
                Fate::P2p(key) => {
                    if c.samples.is_empty() {
                        store.record_error(key.clone(), at);
                    }
                    for &v in &c.samples {
                        store.record_sample(key.clone(), sample(v), keep);
                    }
                }
                Fate::OtherLoad
                | Fate::OtherDirection
                | Fate::OtherPairSize
                | Fate::NoPair
                | Fate::OtherKind(_) => {}
            }
        }
        if store.measured_cells().next().is_some() {
            store.record_success("h2d", at);
        }
        if store.pairs().values().any(|c| !c.samples.is_empty()) {
            store.record_success("pair", at);
        }
        if store.d2d().values().any(|c| !c.samples.is_empty()) {
            store.record_success("d2d", at);
        }
        if store.p2p().values().any(|c| !c.samples.is_empty()) {
            store.record_success("p2p", at);
        }
        store
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::run_dir::SlotRecord;

    fn record(cpu: u32, device: &str, v: Option<f64>, load: &str) -> SampleRecord {
        SampleRecord {
            timing: None,
            slot: SlotRecord {
                matrix: MatrixKind::H2d,
                load: load.into(),
                pass: 0,
                cpu,
                peer_cpu: None,
                device: device.into(),
                size_bytes: 64 << 20,
                direction: "h2d".into(),
                host_memory: "pinned".into(),
            }
            .try_into()
            .unwrap(),
            bytes_per_second: v,
            error: v.is_none().then(|| "copy failed".to_string()),
            reason: None,
            at: 0.0,
        }
    }

    #[test]
    fn records_fold_into_cells_and_names_show_what_varies() {
        let mut ds = Dataset::default();
        ds.add_records(&[
            record(0, "0", Some(1.0), "idle"),
            record(0, "0", Some(3.0), "idle"),
            record(0, "0", None, "idle"),
            record(0, "0", Some(2.0), "cpu:4"),
        ]);
        assert_eq!(ds.cells.len(), 2);
        assert_eq!(ds.cells[0].value(), Some(2.0));
        assert_eq!(ds.cells[0].errors, vec!["copy failed"]);
        assert_eq!(ds.matrix_name(&ds.cells[0].matrix), "h2d_64MiB_idle");
        assert_eq!(ds.matrix_name(&ds.cells[1].matrix), "h2d_64MiB_cpu-4");
    }

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(size_label(64 << 20), "64MiB");
        assert_eq!(size_label(1 << 30), "1GiB");
        assert_eq!(size_label(512 << 10), "512KiB");
        assert_eq!(size_label(1000), "1000B");
    }

    #[test]
    fn to_store_keeps_the_idle_h2d_cells() {
        let mut ds = Dataset::default();
        ds.add_records(&[
            record(0, "0", Some(1.0), "idle"),
            record(1, "0", None, "idle"),
            record(0, "0", Some(9.0), "cpu:4"),
        ]);
        let store = ds.to_store(5, 10.0);
        assert_eq!(store.h2d().len(), 2);
        assert_eq!(store.measured_cells().count(), 1);
        assert_eq!(store.last_success().get("h2d"), Some(&10.0));
    }
}
