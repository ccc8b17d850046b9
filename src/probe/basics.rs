//! One slot of the basic validation table (`chd probe basics`) on the one-shot thread: bind
//! to the slot's CPU (a CPU of the device's NUMA node), then run its measurement: an SGEMM
//! loop (cuBLAS), host-to-device copies, same-device copies, or the allgather of the device's
//! pair (rank 0 on this CPU, rank 1 on the pair's other device's CPU). The binding is undone
//! before returning.

use std::sync::Arc;
use std::time::Duration;

use super::h2d::bind;
use crate::analysis::basics::Op;
use crate::format::run_dir::SlotId;
use crate::runtime::gemm::{DeviceLoader, GemmError, MatmulParams};
use crate::runtime::pair::{PairParams, PairProbe};
use crate::runtime::{Backend, DeviceCopyParams, ProbeError};
use crate::store::CellKey;
use crate::vocab::{Direction, HostMemory};

/// What measures a basics run's slots.
pub struct BasicsProbe {
    pub backend: Arc<dyn Backend>,
    /// cuBLAS for the matmul, where it loaded.
    pub matmul: Option<DeviceLoader>,
    /// The allgather's pair probe, where one opened.
    pub pairs: Option<Arc<dyn PairProbe>>,
    pub warmup: u32,
    pub iterations: u32,
    /// Longest one allgather cell may take.
    pub pair_timeout: Duration,
}

fn gemm_error(e: GemmError) -> ProbeError {
    match e {
        GemmError::UnknownDevice(d) => ProbeError::UnknownDevice(d),
        GemmError::Device { .. } => ProbeError::Device(e.to_string()),
        e => ProbeError::Compute(e.to_string()),
    }
}

impl BasicsProbe {
    /// Measure `slot`: per second (floating-point operations for a matmul, bytes otherwise).
    pub fn measure(&self, slot: &SlotId) -> Result<f64, ProbeError> {
        let op: Op = slot.direction.parse().map_err(ProbeError::Unsupported)?;
        match op {
            Op::Matmul => {
                let loader = self
                    .matmul
                    .as_ref()
                    .ok_or_else(|| ProbeError::Unsupported("cuBLAS is not loaded".into()))?;
                let n = usize::try_from(slot.size_bytes).map_err(|_| {
                    ProbeError::Compute(format!("matrix side {} too big", slot.size_bytes))
                })?;
                let _binding = bind(slot.cpu)?;
                loader
                    .measure_matmul(
                        &slot.device,
                        &MatmulParams {
                            n,
                            warmup: self.warmup,
                            iterations: self.iterations,
                        },
                    )
                    .map_err(gemm_error)
            }
            Op::H2d => {
                let memory: HostMemory = slot.host_memory.parse().map_err(ProbeError::Copy)?;
                let cell = CellKey {
                    cpu: slot.cpu,
                    device: slot.device.clone(),
                    size_bytes: slot.size_bytes,
                    direction: Direction::H2d,
                };
                // Binds to the cell's CPU itself.
                super::h2d::measure_cell(
                    &*self.backend,
                    &cell,
                    self.warmup,
                    self.iterations,
                    memory,
                )
            }
            // Binds to the cell's CPU itself.
            Op::D2d => super::d2d::measure_cell(
                &*self.backend,
                slot.cpu,
                &slot.device,
                &DeviceCopyParams {
                    size_bytes: slot.size_bytes,
                    warmup: self.warmup,
                    iterations: self.iterations,
                },
            ),
            Op::Allgather => {
                let probe = self.pairs.as_deref().ok_or_else(|| {
                    ProbeError::Unsupported("no collective or peer copy opened".into())
                })?;
                let params = PairParams {
                    bytes_per_rank: slot.size_bytes,
                    warmup: self.warmup,
                    iterations: self.iterations,
                    timeout: self.pair_timeout,
                };
                // The pair probe binds each rank's thread itself.
                super::pairs::measure_pair(probe, slot, &params)
            }
        }
    }
}
