//! `chd ledger --merge`: several nodes' ledgers as one fleet file, by host in natural order.
//! Inputs of another schema version, and two ledgers of one host, are refused.

use crate::format::calibration::{self as doc, CalibrationError, Fleet, Ledger};
use crate::topology::natural::natural_cmp;

/// Why ledgers could not be merged.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error(transparent)]
    Input(#[from] CalibrationError),
    #[error(
        "{second}: host {host:?} is already in {first}; a fleet file holds one ledger per host"
    )]
    DuplicateHost {
        host: String,
        first: String,
        second: String,
    },
    #[error("nothing to merge")]
    Empty,
}

/// Merge `(name, text)` inputs, each a node's ledger.
pub fn merge(inputs: &[(String, String)]) -> Result<Fleet, MergeError> {
    if inputs.is_empty() {
        return Err(MergeError::Empty);
    }
    let mut nodes: Vec<(String, Ledger)> = Vec::with_capacity(inputs.len());
    for (name, text) in inputs {
        let ledger = doc::parse(name, text)?;
        if let Some((first, _)) = nodes.iter().find(|(_, l)| l.node.host == ledger.node.host) {
            return Err(MergeError::DuplicateHost {
                host: ledger.node.host,
                first: first.clone(),
                second: name.clone(),
            });
        }
        nodes.push((name.clone(), ledger));
    }
    let mut nodes: Vec<Ledger> = nodes.into_iter().map(|(_, l)| l).collect();
    nodes.sort_by(|a, b| natural_cmp(&a.node.host, &b.node.host));
    Ok(Fleet {
        schema: doc::FLEET_SCHEMA.to_string(),
        nodes,
    })
}
