//! The cells with failed samples, for the report's "Failed cells" table and findings.

use std::borrow::Borrow;

use super::cell::Cell;
use crate::topology::natural::natural_key;

/// One failed (or partly failed) cell.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub cpu: u32,
    pub peer_cpu: Option<u32>,
    pub device: String,
    pub failed: usize,
    pub succeeded: usize,
    pub last_error: String,
}

/// Every cell with at least one failure, by device (natural order), CPU, rank-1 CPU.
pub fn failures<'a, C: Borrow<Cell<'a>>>(cells: &[C]) -> Vec<Failure> {
    let mut out: Vec<Failure> = cells
        .iter()
        .map(Borrow::borrow)
        .filter(|c| c.failed > 0)
        .map(|c| Failure {
            cpu: c.cpu,
            peer_cpu: c.peer_cpu,
            device: c.device.to_string(),
            failed: c.failed,
            succeeded: c.samples,
            last_error: c.last_error.as_deref().unwrap_or_default().to_string(),
        })
        .collect();
    out.sort_by(|a, b| {
        (natural_key(&a.device), a.cpu, a.peer_cpu).cmp(&(
            natural_key(&b.device),
            b.cpu,
            b.peer_cpu,
        ))
    });
    out
}
