//! `chd probe`: the one driver behind `chd probe h2d`, `pair`, `d2d`, `p2p`, `sweep` and
//! `basics` (their requests are in `super::request`): take the plan (`super::plan`, or the plan of the
//! run being resumed), open the backend (and for pairs the collective), measure with progress
//! and Ctrl-C handling, stream samples to `--out DIR`, and finish with the report. The
//! subcommands differ only in how they plan and what measures one slot.

use std::collections::{BTreeMap, BTreeSet};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, bail, Context as _};

use super::interrupt::InterruptGuard;
use super::plan::{
    basics_plan_from, d2d_plan_from, differences, p2p_plan_from, pair_plan_from, plan_from,
    sweep_plan_from, SweepContext,
};
use super::progress::Progress;
use super::request::{
    BasicsRequest, D2dRequest, H2dRequest, P2pRequest, PairRequest, ProbeRequest, RunOptions,
    SweepRequest,
};
use chd::analysis::basics::Op;
use chd::config::{Config, Layer, PairSelection, RuntimeLayer};
use chd::format::run_dir::{
    self as record, CellLog, DeviceMeta, LinkRecord, Machine, MatrixKind, RunFile, RunPlan,
    RuntimeOptions as StoredRuntime, SampleRecord, SlotId, SWEEP_ALLGATHER,
};
use chd::load::device::{self, DeviceProfile};
use chd::probe::basics::BasicsProbe;
use chd::probe::execute::{execute, Context};
use chd::probe::pairs::{measure_pair, pair_methods, pair_operation};
use chd::probe::sweep::SweepProbe;
use chd::report::{self, dataset::Dataset};
use chd::runtime::gemm::DeviceLoadError;
use chd::runtime::gemm::DeviceLoader;
use chd::runtime::pair::{PairParams, PairProbe};
use chd::runtime::select::Opened;
use chd::runtime::{self, DeviceCopyParams, ProbeError};
use chd::store::{unix_now, CellKey};
use chd::topology::natural::natural_key;
use chd::topology::pci_link::{DeviceLinks, Link};
use chd::topology::Topology;
use chd::vocab::{Direction, HostMemory};

/// Run a `chd probe` subcommand.
pub fn run(request: ProbeRequest) -> anyhow::Result<()> {
    match request {
        ProbeRequest::H2d(r) => run_h2d(&r),
        ProbeRequest::Pair(r) => run_pair(&r),
        ProbeRequest::Basics(r) => run_basics(&r),
        ProbeRequest::Sweep(r) => run_sweep(&r),
        ProbeRequest::P2p(r) => run_p2p(&r),
        ProbeRequest::D2d(r) => run_d2d(&r),
        ProbeRequest::Affinity(r) => super::affinity::run(&r),
    }
}

fn hostname(layer: &Layer) -> String {
    let procfs = layer
        .paths
        .procfs
        .clone()
        .unwrap_or_else(|| PathBuf::from("/proc"));
    chd::topology::hostname(&chd::topology::Roots {
        procfs,
        ..Default::default()
    })
}

/// A link as run.json records it.
fn link_record(link: &Link) -> LinkRecord {
    LinkRecord {
        current_width: link.current.width,
        current_transfers_per_second: link.current.transfers_per_second,
        max_width: link.max.width,
        max_transfers_per_second: link.max.transfers_per_second,
    }
}

fn machine(layer: &Layer, topology: &Topology, opened: &Opened) -> Machine {
    Machine {
        hostname: hostname(layer),
        chd_version: env!("CARGO_PKG_VERSION").to_string(),
        backend: opened.backend.name().to_string(),
        backend_description: opened.description.clone(),
        devices: opened
            .backend
            .devices()
            .iter()
            .map(|d| DeviceMeta {
                id: d.id.clone(),
                name: d.name.clone(),
                kind: d.kind.clone(),
                pci_bus_id: d.pci_bus_id.clone(),
                numa_node: d.numa_node,
                link: None,
            })
            .collect(),
        numa_nodes: topology
            .numa_nodes
            .iter()
            .map(|n| {
                let online: Vec<u32> = n
                    .cpus
                    .iter()
                    .copied()
                    .filter(|c| topology.cpu(*c).is_some())
                    .collect();
                (n.id, online)
            })
            .collect(),
        started_at: unix_now(),
    }
}

/// Measures one sample slot (on the one-shot thread).
type Measure = Box<dyn Fn(&SlotId) -> Result<f64, ProbeError> + Sync>;

/// What a matrix kind sets up once the backend is open.
struct Prepared {
    /// The plan from the flags, over the resumed run's plan when there is one.
    plan: RunPlan,
    measure: Measure,
    /// The pair probe's method (`nccl`, `hccl`, `copy`), recorded so a resumed run uses it.
    collective: Option<&'static str>,
    /// The pair probe, asked at the end how each pair was measured.
    pair_probe: Option<Arc<dyn PairProbe>>,
    /// P2p runs: how each ordered pair's copies went, as measured (`copy`, `copy-staged`).
    peer_methods: Option<Arc<Mutex<BTreeMap<String, String>>>>,
    /// P2p runs: each ordered pair's PCIe path class.
    p2p_paths: BTreeMap<String, String>,
}

/// `chd probe h2d`.
fn run_h2d(req: &H2dRequest) -> anyhow::Result<()> {
    run_matrix(
        MatrixKind::H2d,
        &req.run,
        |_config, topology, opened, base| {
            let backend = opened.backend.clone();
            let plan = plan_from(req, base, topology, &*backend)?;
            let (warmup, iterations) = (plan.warmup, plan.iterations);
            let measure: Measure = Box::new(move |slot: &SlotId| {
                let direction: Direction = slot.direction.parse().map_err(ProbeError::Copy)?;
                let memory: HostMemory = slot.host_memory.parse().map_err(ProbeError::Copy)?;
                let cell = CellKey {
                    cpu: slot.cpu,
                    device: slot.device.clone(),
                    size_bytes: slot.size_bytes,
                    direction,
                };
                chd::probe::h2d::measure_cell(&*backend, &cell, warmup, iterations, memory)
            });
            Ok(Prepared {
                plan,
                measure,
                collective: None,
                pair_probe: None,
                peer_methods: None,
                p2p_paths: BTreeMap::new(),
            })
        },
    )
}

/// `chd probe d2d`.
fn run_d2d(req: &D2dRequest) -> anyhow::Result<()> {
    run_matrix(
        MatrixKind::D2d,
        &req.run,
        |_config, topology, opened, base| {
            let backend = opened.backend.clone();
            let plan = d2d_plan_from(req, base, topology, &*backend)?;
            let (warmup, iterations) = (plan.warmup, plan.iterations);
            let measure: Measure = Box::new(move |slot: &SlotId| {
                let params = DeviceCopyParams {
                    size_bytes: slot.size_bytes,
                    warmup,
                    iterations,
                };
                chd::probe::d2d::measure_cell(&*backend, slot.cpu, &slot.device, &params)
            });
            Ok(Prepared {
                plan,
                measure,
                collective: None,
                pair_probe: None,
                peer_methods: None,
                p2p_paths: BTreeMap::new(),
            })
        },
    )
}

/// `chd probe pair`.
fn run_pair(req: &PairRequest) -> anyhow::Result<()> {
    run_matrix(
        MatrixKind::Pair,
        &req.run,
        |config, topology, opened, base| {
            let (probe, notes) = runtime::select::open_pair_probe(&config.runtime, opened)
                .map_err(|e| anyhow!("{}", e.detail))?;
            for note in &notes {
                eprintln!("note: {note}");
            }
            let method = probe.method();
            let operation = pair_operation(method);
            eprintln!("pair probe: {method} ({operation})");
            let pairs = match (req.pairs.is_empty(), base) {
                (true, Some(b)) => b.pairs.clone(),
                (none_given, _) => {
                    let texts = if none_given {
                        vec!["auto".to_string()]
                    } else {
                        req.pairs.clone()
                    };
                    let selections = texts
                        .iter()
                        .map(|t| PairSelection::parse(t))
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| anyhow!("--pair: {e}"))?;
                    chd::probe::pairs::resolve(
                        &selections,
                        opened.backend.devices(),
                        &config.roots.sysfs,
                    )
                    .map_err(|e| anyhow!("--pair: {e}"))?
                }
            };
            for (pair, m) in pair_methods(&*probe, &pairs) {
                if m != method {
                    eprintln!(
                        "note: pair {pair}: peer access refused; its copies are staged through \
                         host memory and measured as method {m}"
                    );
                }
            }
            let plan = pair_plan_from(req, base, topology, pairs, operation)?;
            let template = PairParams {
                bytes_per_rank: 0,
                warmup: plan.warmup,
                iterations: plan.iterations,
                timeout: super::plan::pair_timeout(None, Some(&plan))?,
            };
            let measuring = probe.clone();
            let measure: Measure = Box::new(move |slot: &SlotId| {
                measure_pair(
                    &*measuring,
                    slot,
                    &PairParams {
                        bytes_per_rank: slot.size_bytes,
                        ..template
                    },
                )
            });
            Ok(Prepared {
                plan,
                measure,
                collective: Some(method),
                pair_probe: Some(probe),
                peer_methods: None,
                p2p_paths: BTreeMap::new(),
            })
        },
    )
}

/// The PCIe path class of every ordered pair of `plan`, from the sysfs PCI tree.
fn p2p_paths(
    plan: &RunPlan,
    devices: &[runtime::DeviceInfo],
    sysfs: &Path,
) -> BTreeMap<String, String> {
    use chd::topology::pci::sysfs_bdf;
    use chd::topology::pci_path::class_of;
    let place = |id: &str| {
        devices
            .iter()
            .find(|d| d.id == id)
            .map(|d| (sysfs_bdf(&d.pci_bus_id), d.numa_node))
            .unwrap_or_default()
    };
    plan.pairs
        .iter()
        .filter_map(|label| {
            let (s, d) = chd::analysis::p2p::split_label(label)?;
            let (a, b) = (place(s), place(d));
            let class = class_of(sysfs, (&a.0, a.1), (&b.0, b.1));
            Some((label.clone(), class.as_str().to_string()))
        })
        .collect()
}

/// `chd probe p2p`.
fn run_p2p(req: &P2pRequest) -> anyhow::Result<()> {
    run_matrix(
        MatrixKind::P2p,
        &req.run,
        |config, topology, opened, base| {
            let backend = opened.backend.clone();
            let plan = p2p_plan_from(req, base, topology, &*backend)?;
            let paths = p2p_paths(&plan, backend.devices(), &config.roots.sysfs);
            let params = runtime::DeviceCopyParams {
                size_bytes: 0,
                warmup: plan.warmup,
                iterations: plan.iterations,
            };
            let methods: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
            let recorded = methods.clone();
            let measure: Measure = Box::new(move |slot: &SlotId| {
                let (src, dst) = chd::analysis::p2p::split_label(&slot.device)
                    .ok_or_else(|| ProbeError::UnknownDevice(slot.device.clone()))?;
                let _binding =
                    chd::affinity::bind_exactly(slot.cpu).map_err(|e| ProbeError::Bind {
                        cpu: slot.cpu,
                        detail: e.to_string(),
                    })?;
                let got = backend.measure_peer_copy(
                    src,
                    dst,
                    &runtime::DeviceCopyParams {
                        size_bytes: slot.size_bytes,
                        ..params
                    },
                )?;
                recorded
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(slot.device.clone(), got.method.to_string());
                Ok(got.bytes_per_second)
            });
            Ok(Prepared {
                plan,
                measure,
                collective: None,
                pair_probe: None,
                peer_methods: Some(methods),
                p2p_paths: paths,
            })
        },
    )
}

/// `chd probe basics`.
fn run_basics(req: &BasicsRequest) -> anyhow::Result<()> {
    run_matrix(
        MatrixKind::Basics,
        &req.run,
        |config, topology, opened, base| {
            let backend = opened.backend.clone();
            let mut unavailable = BTreeMap::new();
            let matmul = match DeviceLoader::open(opened, None) {
                Ok(loader) => {
                    eprintln!("matmul: cuBLAS from {}", loader.source());
                    Some(loader)
                }
                Err(e) => {
                    let why = match e {
                        DeviceLoadError::AclBackend => "the acl backend has no matmul in chd yet \
                             (cuBLAS is CUDA's; an aclnn/ACL BLAS matmul is not implemented)"
                            .to_string(),
                        DeviceLoadError::NoAccelerator(b) => {
                            format!("the {b} backend has no device to multiply on")
                        }
                        DeviceLoadError::Cublas(e) => e.to_string(),
                    };
                    unavailable.insert(Op::Matmul, why);
                    None
                }
            };
            let pairs = if backend.devices().len() < 2 {
                None
            } else {
                match runtime::select::open_pair_probe(&config.runtime, opened) {
                    Ok((probe, notes)) => {
                        for note in &notes {
                            eprintln!("note: {note}");
                        }
                        eprintln!("allgather: {}", probe.method());
                        if probe.method() != "nccl" && probe.method() != "hccl" {
                            unavailable.insert(
                                Op::Allgather,
                                format!(
                                    "no collective library opened (the pair probe would measure {} instead)",
                                    pair_operation(probe.method())
                                ),
                            );
                            None
                        } else {
                            Some(probe)
                        }
                    }
                    Err(e) => {
                        unavailable.insert(Op::Allgather, e.detail);
                        None
                    }
                }
            };
            let plan = basics_plan_from(req, base, topology, &*backend, &unavailable)?;
            for (op, why) in &plan.unavailable {
                eprintln!("note: {op} not measured: {why}");
            }
            let probe = BasicsProbe {
                backend,
                matmul,
                pairs: pairs.clone(),
                warmup: plan.warmup,
                iterations: plan.iterations,
                pair_timeout: super::plan::pair_timeout(None, None)?,
            };
            let measure: Measure = Box::new(move |slot: &SlotId| probe.measure(slot));
            Ok(Prepared {
                plan,
                measure,
                collective: pairs.as_ref().map(|p| p.method()),
                pair_probe: pairs,
                peer_methods: None,
                p2p_paths: BTreeMap::new(),
            })
        },
    )
}

/// `chd probe sweep`.
fn run_sweep(req: &SweepRequest) -> anyhow::Result<()> {
    run_matrix(
        MatrixKind::Sweep,
        &req.run,
        |config, topology, opened, base| {
            let backend = opened.backend.clone();
            let wants_gather = match (&req.ops, base) {
                (Some(ops), _) => ops.iter().any(|o| o.trim() == SWEEP_ALLGATHER),
                (None, Some(b)) => b.directions.iter().any(|o| o == SWEEP_ALLGATHER),
                (None, None) => true,
            };
            let mut probe: Option<Arc<dyn PairProbe>> = None;
            let allgather = if !wants_gather {
                Ok(())
            } else if backend.devices().len() < 2 {
                Err(format!(
                    "it needs two devices and the {} backend has {}",
                    backend.name(),
                    backend.devices().len()
                ))
            } else {
                match runtime::select::open_pair_probe(&config.runtime, opened) {
                    Ok((p, notes)) => {
                        for note in &notes {
                            eprintln!("note: {note}");
                        }
                        let method = p.method();
                        if pair_operation(method) != SWEEP_ALLGATHER {
                            eprintln!(
                                "note: no collective library: the allgather points are peer \
                                 copies (method {method})"
                            );
                        }
                        probe = Some(p);
                        Ok(())
                    }
                    Err(e) => Err(format!("no pair probe: {}", e.detail)),
                }
            };
            let (plan, notes) = sweep_plan_from(
                req,
                base,
                topology,
                &*backend,
                &SweepContext {
                    sysfs: &config.roots.sysfs,
                    allgather,
                },
            )?;
            for note in &notes {
                eprintln!("note: {note}");
            }
            let timeout = super::plan::pair_timeout(None, Some(&plan))?;
            let owned = plan.clone();
            let pairs = probe.clone();
            let measure: Measure = Box::new(move |slot: &SlotId| {
                SweepProbe {
                    backend: &*backend,
                    pairs: pairs.as_deref(),
                    plan: &owned,
                    pair_timeout: timeout,
                }
                .measure(slot)
            });
            Ok(Prepared {
                plan,
                measure,
                collective: probe.as_ref().map(|p| p.method()),
                pair_probe: probe,
                peer_methods: None,
                p2p_paths: BTreeMap::new(),
            })
        },
    )
}

/// The resumed run's runtime choices under the flags given now (a flag given wins); the
/// host memory kinds are part of the plan, not taken from there.
fn resume_runtime(now: &mut RuntimeLayer, stored: &StoredRuntime) {
    fn pick<T: Clone>(given: &mut Option<T>, kept: &Option<T>) {
        if given.is_none() {
            given.clone_from(kept);
        }
    }
    pick(&mut now.backend, &stored.backend);
    pick(&mut now.cuda_runtime, &stored.cuda_runtime);
    pick(&mut now.acl_runtime, &stored.acl_runtime);
    pick(&mut now.nvml, &stored.nvml);
    pick(&mut now.collective, &stored.collective);
    pick(&mut now.nccl, &stored.nccl);
    pick(&mut now.hccl, &stored.hccl);
}

/// The runtime choices as run.json stores them.
fn stored_runtime(layer: &RuntimeLayer) -> StoredRuntime {
    StoredRuntime {
        backend: layer.backend.clone(),
        cuda_runtime: layer.cuda_runtime.clone(),
        acl_runtime: layer.acl_runtime.clone(),
        nvml: layer.nvml.clone(),
        host_memory: layer.host_memory.clone(),
        collective: layer.collective.clone(),
        nccl: layer.nccl.clone(),
        hccl: layer.hccl.clone(),
    }
}

/// The one-shot driver: resume or start the run directory, open the backend, let `prepare`
/// plan and set up the measurement, execute, report.
fn run_matrix(
    probe: MatrixKind,
    opts: &RunOptions,
    prepare: impl FnOnce(&Config, &Topology, &Opened, Option<&RunPlan>) -> anyhow::Result<Prepared>,
) -> anyhow::Result<()> {
    let kind = probe.as_str();
    let out = opts.out.as_deref();
    let format = opts.format.as_deref().unwrap_or("table").to_string();
    if !["table", "csv", "json"].contains(&format.as_str()) {
        bail!("--format: {format:?} is not one of table, csv, json");
    }
    if opts.resume && out.is_none() {
        bail!("--resume needs --out DIR: the run directory to continue");
    }
    // A resumed run: its plan, samples and runtime choice.
    let resumed = match (out, opts.resume) {
        (Some(dir), true) => Some(CellLog::resume(dir)?),
        _ => None,
    };
    let mut layer = opts.layer.clone();
    // Host memory kinds are part of the plan (`--memory`), not a runtime setting here.
    layer.runtime.host_memory = None;
    if let Some((run, _, _)) = &resumed {
        if run.plan.probe != probe {
            bail!(
                "{} holds a chd probe {} run; continue it with: chd probe {} --out {} --resume",
                out.unwrap_or(Path::new("?")).display(),
                run.plan.probe.as_str(),
                run.plan.probe.as_str(),
                out.unwrap_or(Path::new("?")).display()
            );
        }
        resume_runtime(&mut layer.runtime, &run.runtime);
    }
    let config = Config::resolve([layer.clone()])?;
    let topology = Topology::read(&config.roots).context("reading the host topology")?;
    let opened = runtime::select::open(&config.runtime, &config.roots, &topology)?;
    for line in &opened.skipped {
        eprintln!("note: {line}");
    }
    eprintln!("backend: {}", opened.description);
    if let Some((run, _, _)) = &resumed {
        if run.machine.backend != opened.backend.name() {
            bail!(
                "the run being resumed used the {} backend, this one opened {}",
                run.machine.backend,
                opened.backend.name()
            );
        }
    }
    let prepared = prepare(
        &config,
        &topology,
        &opened,
        resumed.as_ref().map(|(run, _, _)| &run.plan),
    )?;
    // The `device` load profile needs cuBLAS: refuse now, before anything is written.
    let device_loader = if prepared.plan.loads.iter().any(|l| l == device::NAME) {
        let loader =
            DeviceLoader::open(&opened, None).map_err(|e| anyhow!("--load device: {e}"))?;
        eprintln!("device load: cuBLAS from {}", loader.source());
        Some(loader)
    } else {
        None
    };

    let (mut run, previous, mut log) = match resumed {
        Some((run, previous, log)) => {
            let differ = differences(&prepared.plan, &run.plan);
            if !differ.is_empty() {
                bail!(
                    "{} differ from the run being resumed in {}; drop them to resume it, or start a new run in another --out",
                    differ.join(", "),
                    out.unwrap_or(Path::new("?")).display()
                );
            }
            if let Some(cpu) = run.plan.cpus.iter().find(|c| topology.cpu(**c).is_none()) {
                bail!("CPU {cpu} of the run being resumed is not online here");
            }
            (run, previous, Some(log))
        }
        None => {
            let mut runtime_layer = layer.runtime.clone();
            runtime_layer.backend = Some(opened.backend.name().to_string());
            if let Some(method) = prepared.collective {
                runtime_layer.collective = Some(method.to_string());
            }
            let run = RunFile {
                format: record::FORMAT_VERSION,
                plan: prepared.plan.clone(),
                machine: machine(&layer, &topology, &opened),
                runtime: stored_runtime(&runtime_layer),
                pair_methods: prepared
                    .pair_probe
                    .as_deref()
                    .map(|p| pair_methods(p, &prepared.plan.pairs))
                    .unwrap_or_default(),
                p2p_paths: prepared.p2p_paths.clone(),
            };
            let log = match out {
                Some(dir) => Some(CellLog::create(dir, &run)?),
                None => None,
            };
            (run, Vec::new(), log)
        }
    };
    let plan = &run.plan;
    let done: BTreeSet<_> = record::done_slots(&previous);
    let total = plan.total_slots();
    let already = done.len().min(total);
    let shape = match plan.probe {
        MatrixKind::H2d => format!(
            "on {} CPUs and {} devices",
            plan.cpus.len(),
            plan.devices.len()
        ),
        MatrixKind::P2p => format!(
            "of {} ordered pairs of devices {}, issued from CPU {}",
            plan.pairs.len(),
            plan.devices.join(","),
            chd::topology::cpulist::format(&plan.cpus)
        ),
        MatrixKind::D2d => format!(
            "on {} device{}, each from one CPU of its NUMA node ({})",
            plan.devices.len(),
            if plan.devices.len() == 1 { "" } else { "s" },
            plan.devices
                .iter()
                .zip(&plan.cpus)
                .map(|(d, c)| format!("{d}: CPU {c}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        MatrixKind::Pair => format!(
            "on {n} x {n} CPUs (rank 0 x rank 1) of device pair{} {}",
            if plan.pairs.len() == 1 { "" } else { "s" },
            plan.pairs.join(" "),
            n = plan.cpus.len(),
        ),
        MatrixKind::Basics => format!(
            "of {} on {} devices",
            plan.directions.join(", "),
            plan.devices.len()
        ),
        MatrixKind::Sweep => format!(
            "from CPU {} to {} device{} ({}), {} sizes {}..{}",
            plan.cpus.first().copied().unwrap_or_default(),
            plan.devices.len(),
            if plan.devices.len() == 1 { "" } else { "s" },
            plan.directions.join(", "),
            plan.sizes_bytes.len(),
            plan.sizes_bytes
                .first()
                .map(|s| report::dataset::size_label(*s))
                .unwrap_or_default(),
            plan.sizes_bytes
                .last()
                .map(|s| report::dataset::size_label(*s))
                .unwrap_or_default(),
        ),
    };
    eprintln!(
        "measuring {} cells x {} repeats x {} load profile{} = {total} samples {shape}{}",
        plan.cells_per_pass(),
        plan.repeats,
        plan.loads.len(),
        if plan.loads.len() == 1 { "" } else { "s" },
        if already > 0 {
            format!("; {already} already measured, resuming")
        } else {
            String::new()
        }
    );

    let guard = InterruptGuard::install().context("installing the Ctrl-C handler")?;
    let interactive = std::io::stderr().is_terminal() && !opts.no_progress_bar;
    let mut progress = Progress::new(total as u64, already as u64, interactive);
    let allowed: Vec<u32> = topology.allowed_cpus().map(|c| c.id).collect();
    // The device load runs while the `device` profile's slots are measured.
    let device_load = device_loader.map(|loader| {
        let mut devices = plan.devices.clone();
        for d in plan.pairs.iter().flat_map(|p| p.split(',')) {
            if !devices.iter().any(|x| x == d) {
                devices.push(d.to_string());
            }
        }
        DeviceProfile::new(loader, devices, &allowed, &plan.cpus)
    });
    // Each device's PCIe link, read once right after its first measured copy cell (an idle
    // GPU lowers its link speed; the copies just ran over the link this reads).
    let links = DeviceLinks::new(
        &config.roots.sysfs,
        opened
            .backend
            .devices()
            .iter()
            .map(|d| (d.id.as_str(), d.pci_bus_id.as_str())),
    );
    let seen_links: Mutex<BTreeMap<String, Option<Link>>> = Mutex::new(BTreeMap::new());
    let measure = |slot: &SlotId| {
        if let Some(load) = &device_load {
            load.follow(&slot.load)?;
        }
        let value = (prepared.measure)(slot)?;
        let copies_over_link = match slot.matrix {
            MatrixKind::H2d => true,
            MatrixKind::Sweep => slot.direction.parse::<Direction>().is_ok(),
            MatrixKind::Basics => slot.direction == "h2d",
            MatrixKind::Pair | MatrixKind::P2p | MatrixKind::D2d => false,
        };
        if copies_over_link {
            let mut seen = seen_links.lock().unwrap_or_else(|p| p.into_inner());
            if !seen.contains_key(&slot.device) {
                seen.insert(slot.device.clone(), links.read(&slot.device));
            }
        }
        Ok(value)
    };
    let exec = execute(
        plan,
        Context {
            allowed_cpus: &allowed,
            done: &done,
            log: log.as_mut(),
            watcher: &mut progress,
            stop: guard.flag(),
        },
        &measure,
    )?;
    if let Some(load) = &device_load {
        tracing::debug!("load device: {} gemms", load.finish());
    }
    progress.finish();
    let interrupted = guard.interrupted();
    drop(guard);
    if let Some(log) = log.as_mut() {
        log.sync()?;
    }
    if let Some(e) = &exec.write_error {
        bail!("stopped: {e}");
    }

    // What each pair was measured with, as the probe knows it now (a pair whose peer access
    // failed mid-run turned copy-staged), and the links the copies ran over.
    let mut changed = false;
    if let Some(probe) = &prepared.pair_probe {
        let now = pair_methods(&**probe, &run.plan.pairs);
        if now != run.pair_methods {
            run.pair_methods = now;
            changed = true;
        }
    }
    if let Some(methods) = &prepared.peer_methods {
        let measured = methods.lock().unwrap_or_else(|p| p.into_inner());
        for (pair, method) in measured.iter() {
            if run.pair_methods.get(pair) != Some(method) {
                run.pair_methods.insert(pair.clone(), method.clone());
                changed = true;
            }
        }
    }
    for (device, link) in seen_links.into_inner().unwrap_or_else(|p| p.into_inner()) {
        let Some(link) = link else { continue };
        if let Some(meta) = run.machine.devices.iter_mut().find(|m| m.id == device) {
            let record = Some(link_record(&link));
            changed |= meta.link != record;
            meta.link = record;
        }
    }
    if changed {
        if let Some(dir) = out {
            record::write_run_file(dir, &run)?;
        }
    }
    let mut all: Vec<SampleRecord> = previous;
    all.extend(exec.records.iter().cloned());
    let measured = record::done_slots(&all).len();
    let ds = Dataset::from_run(&run, &all);
    match out {
        Some(dir) if !opts.no_report => {
            let written = report::write(&ds, dir)?;
            for f in &written.files {
                println!("wrote {}", f.display());
            }
            print_findings(&written.findings);
        }
        Some(_) => {}
        None => print_cells(&ds, plan.probe, &format)?,
    }
    if interrupted || exec.stopped {
        let resume = out
            .map(|d| {
                format!(
                    "; continue with: chd probe {kind} --out {} --resume",
                    d.display()
                )
            })
            .unwrap_or_default();
        bail!("interrupted after {measured} of {total} samples{resume}");
    }
    // An operation the backend cannot do, in a sweep or the basics table, is told, not
    // counted as a failure of the run (a matrix's refused cell, e.g. an ACL p2p pair without
    // peer access, still fails it).
    let unsupported = |c: &&report::dataset::CellResult| {
        matches!(c.matrix.kind, MatrixKind::Sweep | MatrixKind::Basics)
            && c.value().is_none()
            && !c.errors.is_empty()
            && c.errors
                .iter()
                .all(|e| chd::analysis::sweep::is_unsupported(e))
    };
    let mut skipped: BTreeMap<&str, usize> = BTreeMap::new();
    for c in ds.cells.iter().filter(unsupported) {
        *skipped.entry(c.matrix.direction.as_str()).or_default() += 1;
    }
    for (op, n) in &skipped {
        eprintln!(
            "note: {op}: {n} point{} not measured: the {} backend does not support it",
            if *n == 1 { "" } else { "s" },
            run.machine.backend
        );
    }
    let mut failed: Vec<_> = ds
        .cells
        .iter()
        .filter(|c| c.value().is_none() && !unsupported(c))
        .collect();
    failed.sort_by(|a, b| {
        (&a.matrix, a.cpu, a.peer_cpu, natural_key(&a.device)).cmp(&(
            &b.matrix,
            b.cpu,
            b.peer_cpu,
            natural_key(&b.device),
        ))
    });
    if let Some(first) = failed.first() {
        let at = match first.peer_cpu {
            None if first.matrix.kind == MatrixKind::P2p => format!(
                "pair {} (device {} -> device {})",
                first.device,
                first.device.split('>').next().unwrap_or("?"),
                first.device.split('>').nth(1).unwrap_or("?")
            ),
            Some(peer) => format!(
                "rank 0 on CPU {} x rank 1 on CPU {peer}, pair {}",
                first.cpu, first.device
            ),
            None => format!("CPU {} -> device {}", first.cpu, first.device),
        };
        bail!(
            "{} of {} cells could not be measured{}; first: {at}: {}",
            failed.len(),
            ds.cells.len(),
            match (out.is_some(), first.matrix.kind) {
                (false, _) => "",
                (true, MatrixKind::Basics) => " (see \"Basic validation\" in summary.md)",
                (true, MatrixKind::P2p) => " (see \"Failed pairs\" in summary.md)",
                (true, _) => " (see \"Failed cells\" in summary.md)",
            },
            first
                .errors
                .last()
                .map(String::as_str)
                .unwrap_or("no value")
        );
    }
    Ok(())
}

fn print_findings(findings: &[String]) {
    if findings.is_empty() {
        println!("findings: none");
    }
    for f in findings {
        println!("finding: {f}");
    }
}

fn print_cells(ds: &Dataset, kind: MatrixKind, format: &str) -> anyhow::Result<()> {
    let numa = ds.numa_map();
    let gbps = |v: Option<f64>| {
        v.map(|v| format!("{:.2}", v / 1e9))
            .unwrap_or_else(|| "-".into())
    };
    let node = |cpu: u32| {
        numa.get(&cpu)
            .map(|n| n.to_string())
            .unwrap_or_else(|| "-".into())
    };
    let mut cells: Vec<_> = ds.cells.iter().collect();
    cells.sort_by(|a, b| {
        (&a.matrix, a.cpu, natural_key(&a.device), a.peer_cpu).cmp(&(
            &b.matrix,
            b.cpu,
            natural_key(&b.device),
            b.peer_cpu,
        ))
    });
    match (format, kind) {
        ("csv", MatrixKind::Sweep) => {
            print!("{}", report::sweep::render_csv(&report::sweep::curves(ds)))
        }
        ("csv", MatrixKind::Basics) => {
            print!("{}", report::basics::csv(ds).unwrap_or_default())
        }
        ("csv", _) => print!("{}", report::csv::render(ds)),
        ("json", MatrixKind::Basics) => {
            let rows: Vec<serde_json::Value> = cells
                .iter()
                .map(|c| {
                    let op: Option<Op> = c.matrix.direction.parse().ok();
                    serde_json::json!({
                        "measurement": c.matrix.direction,
                        "unit": op.map(|o| if o == Op::Matmul { "flop/s" } else { "bytes/s" }),
                        "device": c.device,
                        "cpu": c.cpu,
                        "numa_node": numa.get(&c.cpu),
                        "size_bytes": c.matrix.size_bytes,
                        "load": c.matrix.load,
                        "value": c.value(),
                        "samples": c.samples.len(),
                        "error": c.errors.last(),
                    })
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&rows)?);
        }
        ("json", MatrixKind::Sweep) => {
            let rows: Vec<serde_json::Value> = report::sweep::curves(ds)
                .iter()
                .flat_map(|c| {
                    c.points.iter().map(move |p| {
                        serde_json::json!({
                            "op": c.op,
                            "device": c.device,
                            "size_bytes": p.size_bytes,
                            "bytes_per_second": p.median,
                            "spread": p.spread,
                            "samples": p.samples,
                            "failed": p.failed,
                            "flags": report::sweep::flags(p),
                            "plateau": c.plateau == Some(p.size_bytes),
                            "error": p.last_error,
                        })
                    })
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&rows)?);
        }
        (_, MatrixKind::Basics) => {
            let table = report::basics::table(ds).unwrap_or_default();
            println!(
                "{:<24} {:>6} {:>10} {:>20} {:>20} {:>6}",
                "measurement", "unit", "load", "slowest", "fastest", "ratio"
            );
            for row in &table.rows {
                let at = |d: &Option<chd::analysis::basics::DeviceValue>| {
                    d.as_ref()
                        .map(|d| format!("{:.1} (dev {})", row.op.scaled(d.value), d.device))
                        .unwrap_or_else(|| "-".into())
                };
                println!(
                    "{:<24} {:>6} {:>10} {:>20} {:>20} {:>6}",
                    row.op.title(),
                    row.op.unit(),
                    row.load,
                    at(&row.min),
                    at(&row.max),
                    row.spread()
                        .map(|r| format!("{r:.2}"))
                        .unwrap_or_else(|| "-".into())
                );
            }
            for (op, why) in &table.unavailable {
                println!("not measured: {}: {why}", op.title());
            }
        }
        (_, MatrixKind::Sweep) => {
            println!(
                "{:>9} {:>7} {:>8} {:>9} {:>7} {:>7}  note",
                "op", "device", "size", "GB/s", "spread", "samples"
            );
            for c in report::sweep::curves(ds) {
                for p in &c.points {
                    let mut note = report::sweep::flags(p);
                    if c.plateau == Some(p.size_bytes) {
                        note.push_str(" plateau");
                    }
                    if let Some(e) = p.last_error.as_deref().filter(|_| p.median.is_none()) {
                        note.push(' ');
                        note.push_str(e);
                    }
                    println!(
                        "{:>9} {:>7} {:>8} {:>9} {:>7} {:>7}  {}",
                        c.op,
                        c.device,
                        report::dataset::size_label(p.size_bytes),
                        gbps(p.median),
                        p.spread
                            .map(|s| format!("{:.1}%", s * 100.0))
                            .unwrap_or_else(|| "-".into()),
                        p.samples,
                        note.trim()
                    );
                }
            }
        }
        ("json", MatrixKind::H2d | MatrixKind::D2d) => {
            let rows: Vec<serde_json::Value> = cells
                .iter()
                .map(|c| {
                    serde_json::json!({
                        "cpu": c.cpu,
                        "numa_node": numa.get(&c.cpu),
                        "device": c.device,
                        "size_bytes": c.matrix.size_bytes,
                        "direction": c.matrix.direction,
                        "host_memory": c.matrix.host_memory,
                        "load": c.matrix.load,
                        "bytes_per_second": c.value(),
                        "samples": c.samples.len(),
                        "error": c.errors.last(),
                    })
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&rows)?);
        }
        ("json", MatrixKind::Pair) => {
            let rows: Vec<serde_json::Value> = cells
                .iter()
                .map(|c| {
                    serde_json::json!({
                        "pair": c.device,
                        "rank0_cpu": c.cpu,
                        "rank0_numa_node": numa.get(&c.cpu),
                        "rank1_cpu": c.peer_cpu,
                        "rank1_numa_node": c.peer_cpu.and_then(|p| numa.get(&p)),
                        "size_bytes": c.matrix.size_bytes,
                        "operation": c.matrix.direction,
                        "load": c.matrix.load,
                        "bytes_per_second": c.value(),
                        "samples": c.samples.len(),
                        "error": c.errors.last(),
                    })
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&rows)?);
        }
        (_, MatrixKind::H2d | MatrixKind::D2d) => {
            println!(
                "{:>5} {:>4} {:>7} {:>8} {:>4} {:>8} {:>8} {:>9} {:>7}  note",
                "cpu", "numa", "device", "size", "dir", "memory", "load", "GB/s", "samples"
            );
            for c in cells {
                println!(
                    "{:>5} {:>4} {:>7} {:>8} {:>4} {:>8} {:>8} {:>9} {:>7}  {}",
                    c.cpu,
                    node(c.cpu),
                    c.device,
                    report::dataset::size_label(c.matrix.size_bytes),
                    c.matrix.direction,
                    c.matrix.host_memory,
                    c.matrix.load,
                    gbps(c.value()),
                    c.samples.len(),
                    c.errors.last().map(String::as_str).unwrap_or("")
                );
            }
        }
        ("json", MatrixKind::P2p) => {
            let rows: Vec<serde_json::Value> = cells
                .iter()
                .map(|c| {
                    let (src, dst) = chd::analysis::p2p::split_label(&c.device).unzip();
                    serde_json::json!({
                        "pair": c.device,
                        "src": src,
                        "dst": dst,
                        "path": ds.p2p_paths.get(&c.device),
                        "method": ds.p2p_methods.get(&c.device),
                        "cpu": c.cpu,
                        "size_bytes": c.matrix.size_bytes,
                        "bytes_per_second": c.value(),
                        "samples": c.samples.len(),
                        "error": c.errors.last(),
                    })
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&rows)?);
        }
        (_, MatrixKind::P2p) => {
            println!(
                "{:>5} {:>5} {:>7} {:>11} {:>8} {:>9} {:>7}  note",
                "src", "dst", "path", "method", "size", "GB/s", "samples"
            );
            for c in cells {
                let (src, dst) = chd::analysis::p2p::split_label(&c.device).unwrap_or(("?", "?"));
                println!(
                    "{:>5} {:>5} {:>7} {:>11} {:>8} {:>9} {:>7}  {}",
                    src,
                    dst,
                    ds.p2p_paths
                        .get(&c.device)
                        .map(String::as_str)
                        .unwrap_or("-"),
                    ds.p2p_methods
                        .get(&c.device)
                        .map(String::as_str)
                        .unwrap_or("-"),
                    report::dataset::size_label(c.matrix.size_bytes),
                    gbps(c.value()),
                    c.samples.len(),
                    c.errors.last().map(String::as_str).unwrap_or("")
                );
            }
        }
        (_, MatrixKind::Pair) => {
            println!(
                "{:>7} {:>5} {:>5} {:>5} {:>5} {:>8} {:>9} {:>9} {:>7}  note",
                "pair", "cpu0", "numa0", "cpu1", "numa1", "size", "operation", "GB/s", "samples"
            );
            for c in cells {
                let peer = c.peer_cpu;
                println!(
                    "{:>7} {:>5} {:>5} {:>5} {:>5} {:>8} {:>9} {:>9} {:>7}  {}",
                    c.device,
                    c.cpu,
                    node(c.cpu),
                    peer.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
                    peer.map(node).unwrap_or_else(|| "-".into()),
                    report::dataset::size_label(c.matrix.size_bytes),
                    c.matrix.direction,
                    gbps(c.value()),
                    c.samples.len(),
                    c.errors.last().map(String::as_str).unwrap_or("")
                );
            }
        }
    }
    Ok(())
}
