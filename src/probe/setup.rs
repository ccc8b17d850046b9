//! What a probe kind sets up for a one-shot run once the backend is open: its plan (from its
//! request over the resumed run's plan), the function that measures one slot on the one-shot
//! thread, and what the run directory records of how it measured (the pair probe's method,
//! each peer copy's method, each ordered pair's PCIe path class). Lines worth telling the
//! user (a pair whose peer access was refused, an operation left out) come back as notes;
//! the library does not print.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use super::plan::{PlanContext, PlanError};
use crate::format::run_dir::RunPlan;
use crate::format::slot::SlotId;
use crate::runtime::pair::PairProbe;
use crate::runtime::select::{Opened, RuntimeConfig};
use crate::runtime::ProbeError;
use crate::topology::Topology;

/// Measures one sample slot (on the one-shot thread): bytes per second (floating-point
/// operations per second for a basics matmul).
pub type Measure = Box<dyn Fn(&SlotId) -> Result<f64, ProbeError> + Sync>;

/// Everything a kind may use to set up: the runtime choices, the machine, the opened backend
/// and the run being resumed.
pub struct Setup<'a> {
    pub runtime: &'a RuntimeConfig,
    pub sysfs: &'a Path,
    pub topology: &'a Topology,
    pub opened: &'a Opened,
    /// The plan of the run being resumed.
    pub base: Option<&'a RunPlan>,
}

impl Setup<'_> {
    /// The context the kind's planning takes.
    pub fn plan_context(&self) -> PlanContext<'_> {
        PlanContext {
            topology: self.topology,
            backend: &*self.opened.backend,
            base: self.base,
        }
    }
}

/// A kind set up for a run.
pub struct Prepared {
    /// The plan from the request, over the resumed run's plan when there is one.
    pub plan: RunPlan,
    pub measure: Measure,
    /// The pair probe's method (`nccl`, `hccl`, `copy`), recorded so a resumed run uses it.
    pub collective: Option<&'static str>,
    /// The pair probe, asked at the end how each pair was measured.
    pub pair_probe: Option<Arc<dyn PairProbe>>,
    /// P2p runs: how each ordered pair's copies went, as measured (`copy`, `copy-staged`).
    pub peer_methods: Option<Arc<Mutex<BTreeMap<String, String>>>>,
    /// P2p runs: each ordered pair's PCIe path class.
    pub p2p_paths: BTreeMap<String, String>,
    /// What the user should be told before the run starts.
    pub notes: Vec<String>,
}

impl Prepared {
    /// A kind with nothing to record beyond its plan and measurement.
    pub fn new(plan: RunPlan, measure: Measure) -> Prepared {
        Prepared {
            plan,
            measure,
            collective: None,
            pair_probe: None,
            peer_methods: None,
            p2p_paths: BTreeMap::new(),
            notes: Vec::new(),
        }
    }
}

/// Why a kind could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// A flag's value is not usable for a reason only the opened backend knows.
    #[error("{flag}: {problem}")]
    Flag { flag: &'static str, problem: String },
    /// The pair probe (collective library or peer copies) could not be opened.
    #[error("{0}")]
    PairProbe(String),
}
