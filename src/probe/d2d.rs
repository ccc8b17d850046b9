//! The same-device copy probe (HBM to HBM): bind the calling thread to exactly the cell's
//! CPU (one of the device's NUMA node, chosen by the caller), let the backend copy between
//! two buffers of the device and time it. The binding is undone before returning. The cell
//! holds nothing afterwards: both device buffers, the stream and events are freed in the
//! backend.

use super::h2d::bind;
use crate::runtime::{Backend, DeviceCopyParams, ProbeError};

/// Measure one same-device copy cell of `device` from `cpu`. Returns bytes per second.
pub fn measure_cell(
    backend: &dyn Backend,
    cpu: u32,
    device: &str,
    params: &DeviceCopyParams,
) -> Result<f64, ProbeError> {
    let _binding = bind(cpu)?;
    backend.measure_device_copy(device, params)
}
