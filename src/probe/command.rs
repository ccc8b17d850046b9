//! `chd probe`: the requests the CLI fills (nothing here knows clap), and `chd probe h2d`
//! itself: take the plan (`super::plan`, or the plan of the run being resumed), open the
//! backend, measure with progress and Ctrl-C handling, stream samples to `--out DIR`, and
//! finish with the report.

use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};

use super::execute::{execute, Context};
use super::interrupt::InterruptGuard;
use super::plan::{differences, plan_from};
use super::progress::Progress;
use super::record::{self, CellLog, DeviceMeta, Machine, RunFile, SampleRecord};
use crate::config::{Config, Layer};
use crate::report::{self, dataset::Dataset};
use crate::runtime::{self, Direction, HostMemory};
use crate::store::{unix_now, CellKey};
use crate::topology::Topology;

/// A `chd probe` subcommand.
#[derive(Debug, Clone)]
pub enum ProbeRequest {
    H2d(H2dRequest),
    Affinity(AffinityRequest),
}

/// `chd probe h2d` as asked: `None` = not given (the default, or the resumed run's value).
#[derive(Debug, Clone, Default)]
pub struct H2dRequest {
    /// Global and runtime flags (paths, backend, libraries); `runtime.host_memory` is ignored.
    pub layer: Layer,
    pub cpus: Option<String>,
    pub devices: Option<String>,
    pub sizes: Option<Vec<String>>,
    pub directions: Option<Vec<String>>,
    /// Comma-separated host memory kinds.
    pub host_memory: Option<String>,
    pub warmup: Option<u32>,
    pub iterations: Option<u32>,
    pub repeats: Option<u32>,
    pub loads: Vec<String>,
    pub out: Option<PathBuf>,
    pub resume: bool,
    /// `table`, `csv` or `json` on stdout when there is no `--out`.
    pub format: Option<String>,
    pub no_report: bool,
    /// Plain progress lines even on a terminal.
    pub no_progress_bar: bool,
}

/// `chd probe affinity`.
#[derive(Debug, Clone, Default)]
pub struct AffinityRequest {
    pub layer: Layer,
    pub cpus: Option<String>,
    pub out: Option<PathBuf>,
    pub format: Option<String>,
}

/// Run a `chd probe` subcommand.
pub fn run(request: ProbeRequest) -> anyhow::Result<()> {
    match request {
        ProbeRequest::H2d(r) => run_h2d(&r),
        ProbeRequest::Affinity(r) => super::bindable::run_affinity(&r),
    }
}

fn hostname(layer: &Layer) -> String {
    let procfs = layer
        .paths
        .procfs
        .clone()
        .unwrap_or_else(|| PathBuf::from("/proc"));
    std::fs::read_to_string(procfs.join("sys/kernel/hostname"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn machine(layer: &Layer, topology: &Topology, opened: &runtime::select::Opened) -> Machine {
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

fn run_h2d(req: &H2dRequest) -> anyhow::Result<()> {
    let format = req.format.clone().unwrap_or_else(|| "table".into());
    if !["table", "csv", "json"].contains(&format.as_str()) {
        bail!("--format: {format:?} is not one of table, csv, json");
    }
    if req.resume && req.out.is_none() {
        bail!("--resume needs --out DIR: the run directory to continue");
    }
    // A resumed run: its plan, samples and runtime choice.
    let resumed = match (&req.out, req.resume) {
        (Some(dir), true) => Some(CellLog::resume(dir)?),
        _ => None,
    };
    let mut layer = req.layer.clone();
    layer.runtime.host_memory = None;
    if let Some((run, _, _)) = &resumed {
        let r = &mut layer.runtime;
        let s = &run.runtime;
        r.backend = r.backend.take().or_else(|| s.backend.clone());
        r.cuda_runtime = r.cuda_runtime.take().or_else(|| s.cuda_runtime.clone());
        r.acl_runtime = r.acl_runtime.take().or_else(|| s.acl_runtime.clone());
        r.nvml = r.nvml.take().or_else(|| s.nvml.clone());
    }
    let config = Config::resolve([layer.clone()])?;
    let topology = Topology::read(&config.roots).context("reading the host topology")?;
    let opened = runtime::select::open(&config.runtime, &config.roots, &topology)?;
    for line in &opened.skipped {
        eprintln!("note: {line}");
    }
    eprintln!("backend: {}", opened.description);
    let backend = opened.backend.clone();

    let (run, previous, mut log) = match resumed {
        Some((run, previous, log)) => {
            if run.machine.backend != backend.name() {
                bail!(
                    "the run being resumed used the {} backend, this one opened {}",
                    run.machine.backend,
                    backend.name()
                );
            }
            let plan = plan_from(req, Some(&run.plan), &topology, &*backend)?;
            let differ = differences(&plan, &run.plan);
            if !differ.is_empty() {
                bail!(
                    "{} differ from the run being resumed in {}; drop them to resume it, or start a new run in another --out",
                    differ.join(", "),
                    req.out.as_deref().unwrap_or(Path::new("?")).display()
                );
            }
            if let Some(cpu) = run.plan.cpus.iter().find(|c| topology.cpu(**c).is_none()) {
                bail!("CPU {cpu} of the run being resumed is not online here");
            }
            (run, previous, Some(log))
        }
        None => {
            let plan = plan_from(req, None, &topology, &*backend)?;
            let mut runtime_layer = layer.runtime.clone();
            runtime_layer.backend = Some(backend.name().to_string());
            let run = RunFile {
                format: record::FORMAT_VERSION,
                plan,
                machine: machine(&layer, &topology, &opened),
                runtime: runtime_layer,
            };
            let log = match &req.out {
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
    eprintln!(
        "measuring {} cells x {} repeats x {} load profile{} = {total} samples on {} CPUs and {} devices{}",
        plan.cells_per_pass(),
        plan.repeats,
        plan.loads.len(),
        if plan.loads.len() == 1 { "" } else { "s" },
        plan.cpus.len(),
        plan.devices.len(),
        if already > 0 {
            format!("; {already} already measured, resuming")
        } else {
            String::new()
        }
    );

    let guard = InterruptGuard::install().context("installing the Ctrl-C handler")?;
    let interactive = std::io::stderr().is_terminal() && !req.no_progress_bar;
    let mut progress = Progress::new(total as u64, already as u64, interactive);
    let allowed: Vec<u32> = topology.allowed_cpus().map(|c| c.id).collect();
    let measure = |slot: &record::SlotId| {
        let direction: Direction = slot.direction.parse().map_err(runtime::ProbeError::Copy)?;
        let memory: HostMemory = slot
            .host_memory
            .parse()
            .map_err(runtime::ProbeError::Copy)?;
        let cell = CellKey {
            cpu: slot.cpu,
            device: slot.device.clone(),
            size_bytes: slot.size_bytes,
            direction,
        };
        super::h2d::measure_cell(&*backend, &cell, plan.warmup, plan.iterations, memory)
    };
    let exec = execute(
        plan,
        Context {
            allowed_cpus: &allowed,
            done: &done,
            log: log.as_mut(),
            progress: &mut progress,
            stop: guard.flag(),
        },
        &measure,
    )?;
    progress.finish();
    let interrupted = guard.interrupted();
    drop(guard);
    if let Some(log) = log.as_mut() {
        log.sync()?;
    }
    if let Some(e) = &exec.write_error {
        bail!("stopped: {e}");
    }

    let mut all: Vec<SampleRecord> = previous;
    all.extend(exec.records.iter().cloned());
    let measured = record::done_slots(&all).len();
    let ds = Dataset::from_run(&run, &all);
    match &req.out {
        Some(dir) if !req.no_report => {
            let written = report::write(&ds, dir)?;
            for f in &written.files {
                println!("wrote {}", f.display());
            }
            print_findings(&written.findings);
        }
        Some(_) => {}
        None => print_cells(&ds, &format)?,
    }
    if interrupted || exec.stopped {
        let resume = req
            .out
            .as_ref()
            .map(|d| {
                format!(
                    "; continue with: chd probe h2d --out {} --resume",
                    d.display()
                )
            })
            .unwrap_or_default();
        bail!("interrupted after {measured} of {total} samples{resume}");
    }
    let failed = ds.cells.iter().filter(|c| c.value().is_none()).count();
    if failed > 0 {
        bail!(
            "{failed} of {} cells could not be measured{}",
            ds.cells.len(),
            if req.out.is_some() {
                " (see summary.md)"
            } else {
                ""
            }
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

fn print_cells(ds: &Dataset, format: &str) -> anyhow::Result<()> {
    let numa = ds.numa_map();
    match format {
        "csv" => print!("{}", report::csv::render(ds)),
        "json" => {
            let rows: Vec<serde_json::Value> = ds
                .cells
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
        _ => {
            println!(
                "{:>5} {:>4} {:>7} {:>8} {:>4} {:>8} {:>8} {:>9} {:>7}  note",
                "cpu", "numa", "device", "size", "dir", "memory", "load", "GB/s", "samples"
            );
            let mut cells: Vec<_> = ds.cells.iter().collect();
            cells.sort_by(|a, b| {
                (&a.matrix, a.cpu, report::analysis::natural_key(&a.device)).cmp(&(
                    &b.matrix,
                    b.cpu,
                    report::analysis::natural_key(&b.device),
                ))
            });
            for c in cells {
                println!(
                    "{:>5} {:>4} {:>7} {:>8} {:>4} {:>8} {:>8} {:>9} {:>7}  {}",
                    c.cpu,
                    numa.get(&c.cpu)
                        .map(|n| n.to_string())
                        .unwrap_or_else(|| "-".into()),
                    c.device,
                    report::dataset::size_label(c.matrix.size_bytes),
                    c.matrix.direction,
                    c.matrix.host_memory,
                    c.matrix.load,
                    c.value()
                        .map(|v| format!("{:.2}", v / 1e9))
                        .unwrap_or_else(|| "-".into()),
                    c.samples.len(),
                    c.errors.last().map(String::as_str).unwrap_or("")
                );
            }
        }
    }
    Ok(())
}
