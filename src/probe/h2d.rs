//! The core x device copy probe: bind the calling thread to exactly the cell's CPU (verified
//! by read-back: a bind that did not land is an error cell, never a cell measured on the
//! wrong core), then let the backend allocate on this thread and time the copies. The
//! binding is undone before returning.
//!
//! A [`CellGroup`] does the same for a run of cells that share a CPU and a size: one binding
//! and one first-touched (pinned) host buffer serve every device of the run in turn, so the
//! buffer is pinned once per group instead of once per cell (the seed's batch order).

use crate::affinity::{self, Binding};
use crate::runtime::{Backend, CopyParams, HostStaging, ProbeError};
use crate::store::CellKey;
use crate::vocab::HostMemory;

/// Bind the calling thread to exactly `cpu` (verified), as a [`ProbeError::Bind`] if not.
pub(crate) fn bind(cpu: u32) -> Result<Binding, ProbeError> {
    affinity::bind_exactly(cpu).map_err(|e| ProbeError::Bind {
        cpu,
        detail: e.to_string(),
    })
}

fn params(cell: &CellKey, warmup: u32, iterations: u32, host_memory: HostMemory) -> CopyParams {
    CopyParams {
        size_bytes: cell.size_bytes,
        direction: cell.direction,
        warmup,
        iterations,
        host_memory,
    }
}

/// Measure one cell on the calling thread. Returns bytes per second.
pub fn measure_cell(
    backend: &dyn Backend,
    cell: &CellKey,
    warmup: u32,
    iterations: u32,
    host_memory: HostMemory,
) -> Result<f64, ProbeError> {
    let _binding = bind(cell.cpu)?;
    backend.measure_copy(&cell.device, &params(cell, warmup, iterations, host_memory))
}

/// The calling thread bound to one CPU with one host buffer of one size, for the cells of
/// that CPU and size on every device. Dropping it frees the buffer, then restores the
/// thread's affinity.
pub struct CellGroup<'a> {
    // Declared first, so it is freed while the thread is still bound.
    staging: Box<dyn HostStaging + 'a>,
    _binding: Binding,
    cpu: u32,
    size_bytes: u64,
}

impl<'a> CellGroup<'a> {
    /// Bind to `cell`'s CPU and allocate (and first-touch) the host buffer for its size there.
    pub fn open(
        backend: &'a dyn Backend,
        cell: &CellKey,
        host_memory: HostMemory,
    ) -> Result<CellGroup<'a>, ProbeError> {
        let binding = bind(cell.cpu)?;
        let staging = backend.staging(&params(cell, 0, 1, host_memory))?;
        Ok(CellGroup {
            staging,
            _binding: binding,
            cpu: cell.cpu,
            size_bytes: cell.size_bytes,
        })
    }

    /// Whether `cell` belongs to this group (same CPU and size).
    pub fn serves(&self, cell: &CellKey) -> bool {
        cell.cpu == self.cpu && cell.size_bytes == self.size_bytes
    }

    /// Measure one cell of the group. Returns bytes per second.
    pub fn measure(
        &mut self,
        cell: &CellKey,
        warmup: u32,
        iterations: u32,
        host_memory: HostMemory,
    ) -> Result<f64, ProbeError> {
        if !self.serves(cell) {
            return Err(ProbeError::Bind {
                cpu: cell.cpu,
                detail: format!(
                    "the probe thread is bound to cpu {} with a {}-byte buffer",
                    self.cpu, self.size_bytes
                ),
            });
        }
        self.staging
            .measure(&cell.device, &params(cell, warmup, iterations, host_memory))
    }

    /// Pinned host bytes the group holds.
    pub fn pinned_bytes(&self) -> u64 {
        self.staging.pinned_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::host::HostBackend;
    use crate::topology::{Cpu, NumaNode, Topology};
    use crate::vocab::Direction;

    fn backend() -> HostBackend {
        HostBackend::new(&Topology {
            cpus: vec![Cpu {
                id: 0,
                numa_node: Some(0),
                package: Some(0),
                core: Some(0),
                siblings: vec![0],
                allowed: true,
            }],
            offline_cpus: vec![],
            numa_nodes: vec![NumaNode {
                id: 0,
                cpus: vec![0],
                has_memory: true,
                memory_total_bytes: None,
            }],
        })
    }

    fn cell(cpu: u32, size_bytes: u64) -> CellKey {
        CellKey {
            cpu,
            device: "numa0".into(),
            size_bytes,
            direction: Direction::H2d,
        }
    }

    #[test]
    fn a_group_binds_once_and_serves_only_its_cpu_and_size() {
        let backend = backend();
        let before = affinity::current_cpus().unwrap();
        let cpu = before[0];
        let mut group = CellGroup::open(&backend, &cell(cpu, 1 << 16), HostMemory::Pageable)
            .expect("bind and allocate");
        assert_eq!(affinity::current_cpus().unwrap(), vec![cpu]);
        for _ in 0..3 {
            assert!(group
                .measure(&cell(cpu, 1 << 16), 0, 1, HostMemory::Pageable)
                .is_ok());
        }
        let err = group
            .measure(&cell(cpu, 1 << 17), 0, 1, HostMemory::Pageable)
            .unwrap_err();
        assert_eq!(err.reason(), "bind", "{err}");
        let err = group
            .measure(&cell(cpu + 1, 1 << 16), 0, 1, HostMemory::Pageable)
            .unwrap_err();
        assert_eq!(err.reason(), "bind", "{err}");
        assert_eq!(group.pinned_bytes(), 0);
        drop(group);
        assert_eq!(
            affinity::current_cpus().unwrap(),
            before,
            "binding restored"
        );
    }
}
