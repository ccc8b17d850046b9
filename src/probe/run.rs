//! One one-shot run of a prepared probe kind against its run directory: refuse a resumed run
//! whose plan the flags would change, write `run.json` and open `cells.jsonl` for a new run,
//! measure every slot not yet measured (under each load profile, the `device` load following
//! the slots' profiles), read each device's PCIe link right after its first copies over it,
//! and record in `run.json` what was learned while measuring (how each pair and each peer
//! copy was measured, the links). The caller (the CLI) opens the backend, prints, and renders
//! the report from what comes back.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

use super::execute::{execute, Context, ExecuteError, Watcher};
use super::kinds;
use super::pairs::{pair_methods, plan_pairs};
use super::setup::Prepared;
use crate::format::run_dir::{
    self as record, CellLog, LinkRecord, RunDirError, RunFile, SampleRecord, SlotId,
};
use crate::load::device::{self, DeviceProfile};
use crate::runtime::gemm::DeviceLoader;
use crate::runtime::ProbeError;
use crate::topology::pci_link::{DeviceLinks, Link};
use crate::topology::Topology;

/// Why a run could not go on.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    RunDir(#[from] RunDirError),
    #[error(transparent)]
    Execute(#[from] ExecuteError),
    #[error(
        "{flags} differ from the run being resumed in {dir}; drop them to resume it, or start a new run in another --out"
    )]
    PlanChanged { flags: String, dir: String },
    #[error("CPU {0} of the run being resumed is not online here")]
    CpuGone(u32),
    #[error("the run's plan: {0}")]
    Plan(String),
}

/// A run directory being resumed: its `run.json`, its samples, and the log to append to.
pub type Resumed = (RunFile, Vec<SampleRecord>, CellLog);

/// A run ready to measure.
pub struct Session {
    pub run: RunFile,
    /// Samples of the run being resumed.
    pub previous: Vec<SampleRecord>,
    log: Option<CellLog>,
    prepared: Prepared,
}

/// A finished (or stopped) run.
pub struct Finished {
    /// `run.json` as it is now (rewritten in the run directory when it changed).
    pub run: RunFile,
    /// Every sample of the run: the resumed run's, then this process's.
    pub records: Vec<SampleRecord>,
    /// Ctrl-C or a failed write stopped it before the plan was done.
    pub stopped: bool,
    /// The cell log could not be written: why.
    pub write_error: Option<String>,
}

/// Start the run of `prepared`: continue `resumed` (its plan must be the one the flags give
/// now), or write a new run directory in `out` (none: the samples are only returned) with
/// `new_run` as its `run.json`.
pub fn start(
    prepared: Prepared,
    resumed: Option<Resumed>,
    new_run: RunFile,
    out: Option<&Path>,
    topology: &Topology,
) -> Result<Session, RunError> {
    let (run, previous, log) = match resumed {
        Some((run, previous, log)) => {
            let names = kinds::of(run.plan.probe).flag_names();
            let differ = super::plan::differences(&prepared.plan, &run.plan, &names);
            if !differ.is_empty() {
                return Err(RunError::PlanChanged {
                    flags: differ.join(", "),
                    dir: out.map(|d| d.display().to_string()).unwrap_or_default(),
                });
            }
            if let Some(cpu) = run.plan.cpus.iter().find(|c| topology.cpu(**c).is_none()) {
                return Err(RunError::CpuGone(*cpu));
            }
            (run, previous, Some(log))
        }
        None => {
            let log = match out {
                Some(dir) => Some(CellLog::create(dir, &new_run)?),
                None => None,
            };
            (new_run, Vec::new(), log)
        }
    };
    Ok(Session {
        run,
        previous,
        log,
        prepared,
    })
}

/// The pair methods a new run's `run.json` starts with: the pair probe's method per pair.
pub fn initial_pair_methods(prepared: &Prepared) -> BTreeMap<String, String> {
    let Some(probe) = prepared.pair_probe.as_deref() else {
        return BTreeMap::new();
    };
    plan_pairs(&prepared.plan)
        .map(|pairs| pair_methods(probe, &pairs))
        .unwrap_or_default()
}

/// What measuring needs besides the session.
pub struct Measuring<'a> {
    /// cuBLAS for the `device` load profile, when the plan has one.
    pub device_loader: Option<DeviceLoader>,
    /// CPUs the load profiles may use (the process's allowed CPUs).
    pub allowed_cpus: &'a [u32],
    pub sysfs: &'a Path,
    /// Each device's id and PCI bus id (to read its link).
    pub devices: Vec<(String, String)>,
    pub watcher: &'a mut (dyn Watcher + Send),
    pub stop: &'a AtomicBool,
}

impl Session {
    /// The slots already measured and the run's total.
    pub fn progress(&self) -> (usize, usize) {
        let total = kinds::total_slots(&self.run.plan);
        let done = record::done_slots(&self.previous).len().min(total);
        (done, total)
    }

    /// The line that says what the run measures: `measuring N cells x K repeats x L load
    /// profiles = T samples {shape}[; D already measured, resuming]`.
    pub fn headline(&self) -> String {
        let plan = &self.run.plan;
        let (already, total) = self.progress();
        format!(
            "measuring {} cells x {} repeats x {} load profile{} = {total} samples {}{}",
            kinds::cells_per_pass(plan),
            plan.repeats,
            plan.loads.len(),
            if plan.loads.len() == 1 { "" } else { "s" },
            kinds::of(plan.probe).shape(plan),
            if already > 0 {
                format!("; {already} already measured, resuming")
            } else {
                String::new()
            }
        )
    }

    /// Measure every slot not yet measured, then record in `run.json` what was learned.
    pub fn measure(mut self, m: Measuring<'_>) -> Result<Finished, RunError> {
        let plan = self.run.plan.clone();
        let done: BTreeSet<SlotId> = record::done_slots(&self.previous);
        // The device load runs while the `device` profile's slots are measured.
        let device_load = m.device_loader.map(|loader| {
            let mut devices = plan.devices.clone();
            for pair in plan_pairs(&plan).unwrap_or_default() {
                for d in pair.devices() {
                    if !devices.iter().any(|x| x == d) {
                        devices.push(d.to_string());
                    }
                }
            }
            DeviceProfile::new(loader, devices, m.allowed_cpus, &plan.cpus)
        });
        // Each device's PCIe link, read once right after its first measured copy cell (an
        // idle GPU lowers its link speed; the copies just ran over the link this reads).
        let links = DeviceLinks::new(
            m.sysfs,
            m.devices
                .iter()
                .map(|(id, bus)| (id.as_str(), bus.as_str())),
        );
        let over_link = kinds::of(plan.probe).copies_over_link();
        let seen_links: Mutex<BTreeMap<String, Option<Link>>> = Mutex::new(BTreeMap::new());
        let prepared_measure = &self.prepared.measure;
        let measure = |slot: &SlotId| -> Result<f64, ProbeError> {
            if let Some(load) = &device_load {
                load.follow(&slot.load)?;
            }
            let value = prepared_measure(slot)?;
            if let Some(device) = slot.cell.link_device().filter(|_| over_link) {
                let mut seen = seen_links.lock().unwrap_or_else(|p| p.into_inner());
                if !seen.contains_key(device.as_str()) {
                    seen.insert(device.to_string(), links.read(device.as_str()));
                }
            }
            Ok(value)
        };
        let exec = execute(
            &plan,
            Context {
                allowed_cpus: m.allowed_cpus,
                done: &done,
                log: self.log.as_mut(),
                watcher: m.watcher,
                stop: m.stop,
            },
            &measure,
        )?;
        if let Some(load) = &device_load {
            tracing::debug!("load {}: {} gemms", device::NAME, load.finish());
        }
        if let Some(log) = self.log.as_mut() {
            log.sync()?;
        }
        // What each pair was measured with, as the probe knows it now (a pair whose peer
        // access failed mid-run turned copy-staged), and the links the copies ran over.
        let mut run = self.run;
        let mut changed = false;
        let now = initial_pair_methods(&self.prepared);
        if self.prepared.pair_probe.is_some() && now != run.pair_methods {
            run.pair_methods = now;
            changed = true;
        }
        if let Some(methods) = &self.prepared.peer_methods {
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
                let seen = Some(link_record(&link));
                changed |= meta.link != seen;
                meta.link = seen;
            }
        }
        if changed {
            if let Some(log) = &self.log {
                record::write_run_file(log.dir(), &run)?;
            }
        }
        let mut records = self.previous;
        records.extend(exec.records);
        Ok(Finished {
            run,
            records,
            stopped: exec.stopped,
            write_error: exec.write_error,
        })
    }
}

/// A link as run.json records it.
pub fn link_record(link: &Link) -> LinkRecord {
    LinkRecord {
        current_width: link.current.width,
        current_transfers_per_second: link.current.transfers_per_second,
        max_width: link.max.width,
        max_transfers_per_second: link.max.transfers_per_second,
    }
}
