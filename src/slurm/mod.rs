//! The node's verdict acted on through Slurm, as a `HealthCheckProgram` must do it itself
//! (slurmd only logs the program's exit status; LBNL NHC drains the same way): drain the
//! node with a reason of chd's on a bad verdict, resume it when the verdict is ok again and the
//! drain was chd's, never touch a node drained, down or reserved for anything else, and stop
//! draining when too many nodes of a partition are drained by chd already.
//!
//! - [`nodes`]: the parser of `scontrol show nodes` output.
//! - [`reason`]: the reason chd writes (`chd: <causes>`, within Slurm's limits).
//! - [`breaker`]: `--max-drained` and the count it is held against.
//! - [`decide`]: the decision, a pure function of the verdict and the nodes.
//! - [`scontrol`]: finding and running `scontrol`; the node name slurmd uses.

pub mod breaker;
pub mod decide;
pub mod nodes;
pub mod reason;
pub mod scontrol;

use crate::analysis::verdict::{Cause, Level};
use decide::{Decision, Policy};
use scontrol::{Scontrol, SlurmError};

/// What `act` decided and did.
#[derive(Debug, Clone, PartialEq)]
pub struct Acted {
    pub decision: Decision,
    /// The decision's one log line.
    pub line: String,
}

/// Read the nodes, decide for `node` on the verdict `level` with `causes`, and carry the
/// decision out. Nothing is changed when the nodes cannot be read or `node` is not among them.
pub fn act(
    scontrol: &Scontrol,
    node: &str,
    level: Level,
    causes: &[Cause],
    policy: Policy,
) -> Result<Acted, SlurmError> {
    let (me, all) = scontrol.node_and_all(node)?;
    let decision = decide::decide(level, causes, &me, &all, policy);
    let line = decision.line(&me, level);
    match &decision {
        Decision::Drain { reason, .. } => scontrol.drain(node, reason)?,
        Decision::Resume { .. } => scontrol.resume(node)?,
        Decision::Leave { .. } | Decision::Refuse { .. } => {}
    }
    Ok(Acted { decision, line })
}
