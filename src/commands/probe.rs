//! `chd probe`: the one driver behind `chd probe h2d`, `pair`, `d2d`, `p2p`, `sweep` and
//! `basics` (each kind's request, plan and measurement are the library's, `chd::probe::<kind>`):
//! open the run being resumed, resolve the configuration, open the backend, let the kind set
//! up, run it (`chd::probe::run`) with progress and Ctrl-C handling, and finish with the report
//! or the cells on stdout. The subcommands differ only in the kind's `prepare`.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context as _};

use super::interrupt::InterruptGuard;
use super::progress::Progress;
use super::request::{ProbeRequest, RunOptions};
use chd::config::{Config, Layer, RuntimeLayer};
use chd::dataset::{self, Dataset};
use chd::format::run_dir::{
    self as record, CellLog, DeviceMeta, Machine, MemoryRecord, RunFile,
    RuntimeOptions as StoredRuntime,
};
use chd::load::device;
use chd::probe::kind::ProbeKind;
use chd::probe::kinds;
use chd::probe::run::{self as oneshot, Measuring};
use chd::probe::setup::{Prepared, Setup, SetupError};
use chd::probe::{basics, d2d, h2d, p2p, pairs, sweep};
use chd::report::{self, stdout::Format};
use chd::runtime::gemm::DeviceLoader;
use chd::runtime::select::Opened;
use chd::store::unix_now;
use chd::topology::natural::natural_key;
use chd::topology::Topology;
use chd::vocab::OrderedPair;

/// Run a `chd probe` subcommand.
pub fn run(request: ProbeRequest) -> anyhow::Result<()> {
    match request {
        ProbeRequest::H2d(opts, r) => run_kind(&h2d::KIND, &opts, |s| h2d::prepare(&r, s)),
        ProbeRequest::Pair(opts, r) => run_kind(&pairs::KIND, &opts, |s| pairs::prepare(&r, s)),
        ProbeRequest::Basics(opts, r) => run_kind(&basics::KIND, &opts, |s| basics::prepare(&r, s)),
        ProbeRequest::Sweep(opts, r) => run_kind(&sweep::KIND, &opts, |s| sweep::prepare(&r, s)),
        ProbeRequest::P2p(opts, r) => run_kind(&p2p::KIND, &opts, |s| p2p::prepare(&r, s)),
        ProbeRequest::D2d(opts, r) => run_kind(&d2d::KIND, &opts, |s| d2d::prepare(&r, s)),
        ProbeRequest::Affinity(r) => super::affinity::run(&r),
        ProbeRequest::Fabric(r) => super::fabric_probe::run(&r),
        ProbeRequest::FabricRank => super::fabric_probe::rank_process(),
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

fn machine(layer: &Layer, config: &Config, topology: &Topology, opened: &Opened) -> Machine {
    let buses: std::collections::BTreeMap<String, MemoryRecord> = opened
        .telemetry
        .memory_buses()
        .into_iter()
        .map(|(device, bus)| {
            let record = MemoryRecord {
                bus_width_bits: bus.bus_width_bits,
                max_clock_mhz: bus.max_clock_mhz,
            };
            (device, record)
        })
        .collect();
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
                memory: buses.get(&d.id).copied(),
                limits_gbps: config.limits.get(&d.name).cloned().unwrap_or_default(),
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

/// The one-shot driver: resume or start the run directory, open the backend, let the kind
/// (`prepare`) plan and set up its measurement, run, report.
fn run_kind(
    kind: &dyn ProbeKind,
    opts: &RunOptions,
    prepare: impl FnOnce(&Setup) -> Result<Prepared, SetupError>,
) -> anyhow::Result<()> {
    let probe = kind.kind();
    let name = probe.as_str();
    let out = opts.out.as_deref();
    let format: Format = opts
        .format
        .as_deref()
        .unwrap_or("table")
        .parse()
        .map_err(|e| anyhow!("--format: {e}"))?;
    if opts.resume && out.is_none() {
        bail!("--resume needs --out DIR: the run directory to continue");
    }
    // A resumed run: its plan, samples and runtime choice.
    let resumed = match (out, opts.resume) {
        (Some(dir), true) => Some(CellLog::resume(dir)?),
        _ => None,
    };
    let mut layer = match &opts.config {
        Some(file) => Layer::from_file(file)?.merge(opts.layer.clone()),
        None => opts.layer.clone(),
    };
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
    let opened = chd::runtime::select::open(&config.runtime, &config.roots, &topology)?;
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
    let prepared = prepare(&Setup {
        runtime: &config.runtime,
        sysfs: &config.roots.sysfs,
        topology: &topology,
        opened: &opened,
        base: resumed.as_ref().map(|(run, _, _)| &run.plan),
    })?;
    for note in &prepared.notes {
        eprintln!("note: {note}");
    }
    // The `device` load profile needs cuBLAS: refuse now, before anything is written.
    let device_loader = if prepared.plan.loads.iter().any(|l| l == device::NAME) {
        let loader =
            DeviceLoader::open(&opened, None).map_err(|e| anyhow!("--load device: {e}"))?;
        eprintln!("device load: cuBLAS from {}", loader.source());
        Some(loader)
    } else {
        None
    };
    let new_run = {
        let mut runtime_layer = layer.runtime.clone();
        runtime_layer.backend = Some(opened.backend.name().to_string());
        if let Some(method) = prepared.collective {
            runtime_layer.collective = Some(method.to_string());
        }
        RunFile {
            format: record::FORMAT_VERSION,
            plan: prepared.plan.clone(),
            machine: machine(&layer, &config, &topology, &opened),
            runtime: stored_runtime(&runtime_layer),
            pair_methods: oneshot::initial_pair_methods(&prepared),
            p2p_paths: prepared.p2p_paths.clone(),
        }
    };
    let session = oneshot::start(prepared, resumed, new_run, out, &topology)?;
    let (already, total) = session.progress();
    eprintln!("{}", session.headline());

    let guard = InterruptGuard::install().context("installing the Ctrl-C handler")?;
    let interactive = std::io::stderr().is_terminal() && !opts.no_progress_bar;
    let mut progress = Progress::new(total as u64, already as u64, interactive);
    let allowed: Vec<u32> = topology.allowed_cpus().map(|c| c.id).collect();
    let finished = session.measure(Measuring {
        device_loader,
        allowed_cpus: &allowed,
        sysfs: &config.roots.sysfs,
        devices: opened
            .backend
            .devices()
            .iter()
            .map(|d| (d.id.clone(), d.pci_bus_id.clone()))
            .collect(),
        watcher: &mut progress,
        stop: guard.flag(),
    })?;
    progress.finish();
    let interrupted = guard.interrupted();
    drop(guard);
    if let Some(e) = &finished.write_error {
        bail!("stopped: {e}");
    }
    let run = &finished.run;
    let measured = record::done_slots(&finished.records).len();
    let ds = Dataset::from_run(run, &finished.records);
    match out {
        Some(dir) if !opts.no_report => {
            let written = report::write(&ds, dir)?;
            for f in &written.files {
                println!("wrote {}", f.display());
            }
            print_findings(&written.findings);
        }
        Some(_) => {}
        None => print!("{}", report::stdout::render(&ds, run.plan.probe, format)?),
    }
    if interrupted || finished.stopped {
        let resume = out
            .map(|d| {
                format!(
                    "; continue with: chd probe {name} --out {} --resume",
                    d.display()
                )
            })
            .unwrap_or_default();
        bail!("interrupted after {measured} of {total} samples{resume}");
    }
    let kind = kinds::of(run.plan.probe);
    // An operation the backend cannot do, in a sweep or the basics table, is told, not
    // counted as a failure of the run (a matrix's refused cell, e.g. an ACL p2p pair without
    // peer access, still fails it).
    let unsupported = |c: &&dataset::CellResult| {
        kind.skips_unsupported()
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
        let at = match (first.peer_cpu, first.device.parse::<OrderedPair>()) {
            (Some(peer), _) => format!(
                "rank 0 on CPU {} x rank 1 on CPU {peer}, pair {}",
                first.cpu, first.device
            ),
            (None, Ok(pair)) => format!(
                "pair {pair} (device {} -> device {})",
                pair.src(),
                pair.dst()
            ),
            (None, Err(_)) => format!("CPU {} -> device {}", first.cpu, first.device),
        };
        bail!(
            "{} of {} cells could not be measured{}; first: {at}: {}",
            failed.len(),
            ds.cells.len(),
            if out.is_some() {
                format!(" (see {})", kind.failures_in())
            } else {
                String::new()
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
