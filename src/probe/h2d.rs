//! The core x device copy probe: bind the calling thread to exactly the cell's CPU (verified
//! by read-back: a bind that did not land is an error cell, never a cell measured on the
//! wrong core), then let the backend allocate on this thread and time the copies. The
//! binding is undone before returning.

use crate::affinity;
use crate::runtime::{Backend, CopyParams, HostMemory, ProbeError};
use crate::store::CellKey;

/// Measure one cell on the calling thread. Returns bytes per second.
pub fn measure_cell(
    backend: &dyn Backend,
    cell: &CellKey,
    warmup: u32,
    iterations: u32,
    host_memory: HostMemory,
) -> Result<f64, ProbeError> {
    let _binding = affinity::bind_exactly(cell.cpu).map_err(|e| ProbeError::Bind {
        cpu: cell.cpu,
        detail: e.to_string(),
    })?;
    backend.measure_copy(
        &cell.device,
        &CopyParams {
            size_bytes: cell.size_bytes,
            direction: cell.direction,
            warmup,
            iterations,
            host_memory,
        },
    )
}
