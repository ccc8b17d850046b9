//! The same-device copy part of a probe window: one cell per device (HBM to HBM, of the
//! configured size), each from one CPU of the device's NUMA node, run after the window's
//! H2D cells on the same thread (so never concurrently with them), until its share of the
//! budget is spent, the idle gate closes or chd stops ([`super::single_cell`]). Each cell
//! frees its two device buffers before the next starts; nothing is held between windows.

use super::single_cell::{SingleCell, SingleCellSpec};
use crate::probe::d2d;
use crate::runtime::{Backend, DeviceCopyParams, ProbeError};
use crate::store::D2dKey;

/// One device's same-device copy cell and the CPU it runs from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct D2dCell {
    pub key: D2dKey,
    pub cpu: u32,
}

/// What the d2d part of a window should do.
pub type D2dWindowSpec = SingleCellSpec<D2dCell>;

impl SingleCell for D2dCell {
    const PROBE: &'static str = "d2d";
    type Key = D2dKey;

    fn key(&self) -> &D2dKey {
        &self.key
    }

    fn devices(&self) -> Vec<&str> {
        vec![&self.key.device]
    }

    fn label(&self) -> String {
        self.key.device.clone()
    }

    fn measure(
        &self,
        backend: &dyn Backend,
        warmup: u32,
        iterations: u32,
    ) -> Result<f64, ProbeError> {
        let params = DeviceCopyParams {
            size_bytes: self.key.size_bytes,
            warmup,
            iterations,
        };
        d2d::measure_cell(backend, self.cpu, &self.key.device, &params)
    }
}
