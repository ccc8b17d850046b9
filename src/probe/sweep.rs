//! One point of a size curve (`chd probe sweep`): a sample slot of a sweep plan measured by
//! its operation. `h2d` and `d2h` go through the copy cell of [`super::h2d`] (bound to the
//! slot's CPU, the backend's event-timed copies); `d2d` binds the thread the same way and asks
//! [`Backend::measure_device_copy`]; `allgather` runs the pair probe on the swept device and
//! its peer with rank 0 on the slot's CPU and rank 1 on the peer's CPU.

use crate::affinity;
use crate::format::run_dir::{RunPlan, SlotId, SWEEP_ALLGATHER};
use crate::runtime::pair::{PairParams, PairProbe};
use crate::runtime::{Backend, DeviceCopyParams, ProbeError};
use crate::store::CellKey;
use crate::vocab::{Direction, HostMemory};

/// The same-device copy of a sweep.
pub const SWEEP_D2D: &str = "d2d";
/// Every operation a sweep measures, in the report's order.
pub const SWEEP_OPS: [&str; 4] = ["h2d", "d2h", SWEEP_D2D, SWEEP_ALLGATHER];

/// What measures the points of one sweep run.
pub struct SweepProbe<'a> {
    pub backend: &'a dyn Backend,
    /// The pair probe for `allgather` points (none: those points fail).
    pub pairs: Option<&'a dyn PairProbe>,
    pub plan: &'a RunPlan,
    /// Longest one allgather sample may take.
    pub pair_timeout: std::time::Duration,
}

impl SweepProbe<'_> {
    /// Measure one sample of `slot`. Returns bytes per second (bus bandwidth for allgather).
    pub fn measure(&self, slot: &SlotId) -> Result<f64, ProbeError> {
        let (warmup, iterations) = (self.plan.warmup, self.plan.iterations);
        match slot.direction.as_str() {
            SWEEP_D2D => {
                let _binding = affinity::bind_exactly(slot.cpu).map_err(|e| ProbeError::Bind {
                    cpu: slot.cpu,
                    detail: e.to_string(),
                })?;
                self.backend.measure_device_copy(
                    &slot.device,
                    &DeviceCopyParams {
                        size_bytes: slot.size_bytes,
                        warmup,
                        iterations,
                    },
                )
            }
            SWEEP_ALLGATHER => {
                let probe = self.pairs.ok_or_else(|| {
                    ProbeError::Collective("no pair probe could be opened".into())
                })?;
                let peer = self.plan.peers.get(&slot.device).ok_or_else(|| {
                    ProbeError::Collective(format!("device {} has no peer", slot.device))
                })?;
                let peer_cpu = slot.peer_cpu.unwrap_or(peer.cpu);
                probe.measure(
                    [slot.device.as_str(), peer.device.as_str()],
                    [slot.cpu, peer_cpu],
                    &PairParams {
                        bytes_per_rank: slot.size_bytes,
                        warmup,
                        iterations,
                        timeout: self.pair_timeout,
                    },
                )
            }
            other => {
                let direction: Direction = other.parse().map_err(ProbeError::Copy)?;
                let memory: HostMemory = slot.host_memory.parse().map_err(ProbeError::Copy)?;
                let cell = CellKey {
                    cpu: slot.cpu,
                    device: slot.device.clone(),
                    size_bytes: slot.size_bytes,
                    direction,
                };
                super::h2d::measure_cell(self.backend, &cell, warmup, iterations, memory)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::run_dir::MatrixKind;
    use crate::runtime::{CopyParams, DeviceInfo};

    /// A backend whose copies read 1 GB/s and same-device copies 2 GB/s.
    struct Marked(Vec<DeviceInfo>);

    impl Backend for Marked {
        fn name(&self) -> &'static str {
            "marked"
        }
        fn devices(&self) -> &[DeviceInfo] {
            &self.0
        }
        fn measure_copy(&self, _: &str, p: &CopyParams) -> Result<f64, ProbeError> {
            assert_eq!(p.size_bytes, 1 << 16);
            Ok(1e9)
        }
        fn measure_device_copy(&self, _: &str, p: &DeviceCopyParams) -> Result<f64, ProbeError> {
            assert_eq!((p.size_bytes, p.warmup, p.iterations), (1 << 16, 0, 1));
            Ok(2e9)
        }
    }

    #[test]
    fn each_operation_is_measured_its_own_way_and_fails_alone() {
        let backend = Marked(vec![DeviceInfo {
            id: "0".into(),
            kind: "marked".into(),
            name: "m".into(),
            pci_bus_id: String::new(),
            numa_node: None,
        }]);
        let plan = RunPlan {
            probe: MatrixKind::Sweep,
            cpus: vec![affinity::current_cpus().unwrap()[0]],
            devices: vec!["0".into()],
            pairs: vec![],
            sizes_bytes: vec![1 << 16],
            directions: vec!["h2d".into(), SWEEP_D2D.into(), SWEEP_ALLGATHER.into()],
            host_memories: vec!["pinned".into()],
            warmup: 0,
            iterations: 1,
            repeats: 1,
            loads: vec!["idle".into()],
            ..RunPlan::empty(MatrixKind::Sweep)
        };
        let probe = SweepProbe {
            backend: &backend,
            pairs: None,
            plan: &plan,
            pair_timeout: std::time::Duration::from_secs(1),
        };
        let slots = plan.pass_slots("idle", 0);
        // No peer: no allgather slot.
        assert_eq!(slots.len(), 2);
        assert_eq!(probe.measure(&slots[0]).unwrap(), 1e9, "h2d: the copy path");
        assert_eq!(
            probe.measure(&slots[1]).unwrap(),
            2e9,
            "d2d: the device copy"
        );
        let mut gather = slots[0].clone();
        gather.direction = SWEEP_ALLGATHER.into();
        assert_eq!(probe.measure(&gather).unwrap_err().reason(), "collective");
        let mut bad = slots[0].clone();
        bad.direction = "sideways".into();
        assert_eq!(probe.measure(&bad).unwrap_err().reason(), "copy");
    }
}
