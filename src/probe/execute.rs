//! Running a [`RunPlan`] to the end (or to Ctrl-C): load profile by load profile, starting
//! and stopping the profile's burners around it, streaming every sample to the cell log and
//! the caller's [`Watcher`] (the progress display) as it is measured. Independent of what a cell is: the caller passes
//! the measure function (the h2d probe today; the pair probe plugs in the same way).

use std::collections::BTreeSet;
use std::sync::atomic::AtomicBool;

use super::oneshot;
use crate::format::run_dir::{CellLog, RunPlan, SampleRecord, SlotId};
use crate::load::burner::{placements, Burners};
use crate::load::LoadProfile;
use crate::runtime::ProbeError;

/// What ran.
#[derive(Debug)]
pub struct Execution {
    /// Samples measured by this process.
    pub records: Vec<SampleRecord>,
    /// A signal (or a write failure) stopped the run before the plan was done.
    pub stopped: bool,
    /// The cell log could not be written (the run stopped): why.
    pub write_error: Option<String>,
}

/// Told as the run goes (the CLI's progress display).
pub trait Watcher {
    /// Measuring under `load` starts.
    fn load_started(&mut self, load: &str);
    /// One more sample is measured and logged.
    fn sample_done(&mut self);
}

/// Everything [`execute`] needs besides the plan.
pub struct Context<'a> {
    /// CPUs burners may use (the process's allowed CPUs).
    pub allowed_cpus: &'a [u32],
    /// Slots measured before (a resumed run).
    pub done: &'a BTreeSet<SlotId>,
    pub log: Option<&'a mut CellLog>,
    pub watcher: &'a mut (dyn Watcher + Send),
    pub stop: &'a AtomicBool,
}

/// Why a plan could not be executed.
#[derive(Debug, thiserror::Error)]
pub enum ExecuteError {
    /// A load profile could not be started.
    #[error(transparent)]
    Load(#[from] crate::load::LoadError),
    /// The plan names no valid slot (a damaged run.json).
    #[error("the run's plan: {0}")]
    Plan(String),
}

/// Measure every slot of `plan` not in `ctx.done`.
pub fn execute(
    plan: &RunPlan,
    ctx: Context<'_>,
    measure: &(dyn Fn(&SlotId) -> Result<f64, ProbeError> + Sync),
) -> Result<Execution, ExecuteError> {
    let Context {
        allowed_cpus,
        done,
        mut log,
        watcher,
        stop,
    } = ctx;
    let mut exec = Execution {
        records: Vec::new(),
        stopped: false,
        write_error: None,
    };
    for load in &plan.loads {
        let order = oneshot::schedule(plan, load, done).map_err(ExecuteError::Plan)?;
        if order.is_empty() {
            continue;
        }
        let profile: LoadProfile = load.parse()?;
        let burners = match &profile {
            LoadProfile::Cpu { threads, cpus } => {
                let b = Burners::start(placements(
                    *threads,
                    cpus.as_deref(),
                    allowed_cpus,
                    &plan.cpus,
                ))?;
                tracing::info!("load {load}: {}", b.describe());
                Some(b)
            }
            _ => None,
        };
        watcher.load_started(load);
        let measure_here = |slot: &SlotId| {
            if let Some(b) = &burners {
                b.avoid(slot.cell.cpu());
            }
            measure(slot)
        };
        let mut sink = |record: SampleRecord| {
            if let Some(log) = log.as_deref_mut() {
                if let Err(e) = log.append(&record) {
                    exec.write_error = Some(e.to_string());
                    return false;
                }
            }
            exec.records.push(record);
            watcher.sample_done();
            true
        };
        let outcome = oneshot::run(&order, stop, &measure_here, &mut sink);
        if let Some(b) = burners {
            let chunks = b.stop();
            tracing::debug!("load {load}: burners did {chunks} chunks of work");
        }
        if outcome.stopped {
            exec.stopped = true;
            break;
        }
    }
    Ok(exec)
}
