//! The host backend: no accelerator. Each NUMA node with memory is a "device" (`numa<N>`);
//! a copy cell copies between a buffer local to the probing CPU (allocated and first-touched
//! on the calling, already bound, thread) and a buffer bound to the device's node. `h2d`
//! copies local -> node, `d2h` node -> local. This is what runs on a plain machine and in CI,
//! and it measures the real cross-NUMA memory paths a host staging buffer takes. Its
//! same-device copy (`d2d`) copies between two buffers placed on the device's node.

use std::hint::black_box;
use std::time::Instant;

use super::numa_memory::NodeBuffer;
use super::pattern::{check_copy, fill_pattern};
use super::{
    check_staging_fits, Backend, CopyParams, DeviceCopyParams, DeviceInfo, Direction, HostMemory,
    HostStaging, ProbeError,
};
use crate::topology::Topology;

/// Copies between CPU-local memory and memory on each NUMA node.
#[derive(Debug, Clone)]
pub struct HostBackend {
    devices: Vec<DeviceInfo>,
}

impl HostBackend {
    /// One device per NUMA node that has memory, in node order.
    pub fn new(topology: &Topology) -> HostBackend {
        let devices = topology
            .memory_nodes()
            .map(|n| DeviceInfo {
                id: device_id(n.id),
                kind: "host".into(),
                name: format!("NUMA node {} memory", n.id),
                pci_bus_id: String::new(),
                numa_node: Some(n.id),
            })
            .collect();
        HostBackend { devices }
    }

    /// The node behind a device id this backend listed.
    fn node_of(&self, device: &str) -> Result<u32, ProbeError> {
        self.devices
            .iter()
            .find(|d| d.id == device)
            .and_then(|d| d.numa_node)
            .ok_or_else(|| ProbeError::UnknownDevice(device.to_string()))
    }
}

/// The `device` label of NUMA node `node`.
pub fn device_id(node: u32) -> String {
    format!("numa{node}")
}

impl Backend for HostBackend {
    fn name(&self) -> &'static str {
        "host"
    }

    fn capabilities(&self) -> super::Capabilities {
        super::Capabilities::HOST
    }

    fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }

    fn measure_copy(&self, device: &str, params: &CopyParams) -> Result<f64, ProbeError> {
        self.staging_here(params)?.measure(device, params)
    }

    fn staging(&self, params: &CopyParams) -> Result<Box<dyn HostStaging + '_>, ProbeError> {
        Ok(Box::new(self.staging_here(params)?))
    }

    /// The host analogue of a same-device copy: memory to memory of one NUMA node, both
    /// buffers placed (and verified) there, timed with the wall clock: the node's memory
    /// bandwidth as the bound thread sees it.
    fn measure_device_copy(
        &self,
        device: &str,
        params: &DeviceCopyParams,
    ) -> Result<f64, ProbeError> {
        let node = self.node_of(device)?;
        if params.size_bytes == 0 {
            return Err(ProbeError::Timing("copy size is zero bytes".into()));
        }
        let len = usize::try_from(params.size_bytes).map_err(|_| ProbeError::Alloc {
            bytes: params.size_bytes,
            detail: "size does not fit in this address space".into(),
        })?;
        let mut src = placed_buffer(len, node)?;
        let mut dst = placed_buffer(len, node)?;
        time_copies(&mut src, &mut dst, params.warmup, params.iterations)
    }
}

impl HostBackend {
    /// The CPU-local buffer for cells of `params`' size, first-touched on the calling thread.
    fn staging_here(&self, params: &CopyParams) -> Result<LocalStaging<'_>, ProbeError> {
        if params.size_bytes == 0 {
            return Err(ProbeError::Timing("copy size is zero bytes".into()));
        }
        let len = usize::try_from(params.size_bytes).map_err(|_| ProbeError::Alloc {
            bytes: params.size_bytes,
            detail: "size does not fit in this address space".into(),
        })?;
        Ok(LocalStaging {
            backend: self,
            host_memory: params.host_memory,
            // First-touched here, on the caller's (bound) thread.
            local: NodeBuffer::local(len)?,
        })
    }
}

/// A buffer local to the bound CPU, reused for every NUMA node of a run of cells; each cell
/// maps and places its own buffer on the node under test.
struct LocalStaging<'a> {
    backend: &'a HostBackend,
    /// Recorded for [`check_staging_fits`] only: the host backend always uses ordinary memory.
    host_memory: HostMemory,
    local: NodeBuffer,
}

impl HostStaging for LocalStaging<'_> {
    fn pinned_bytes(&self) -> u64 {
        0
    }

    fn measure(&mut self, device: &str, params: &CopyParams) -> Result<f64, ProbeError> {
        let node = self.backend.node_of(device)?;
        check_staging_fits(self.local.len() as u64, self.host_memory, params)?;
        let len = self.local.len();
        let local = &mut self.local;
        let mut remote = placed_buffer(len, node)?;

        let (src, dst) = match params.direction {
            Direction::H2d => (local, &mut remote),
            Direction::D2h => (&mut remote, local),
        };
        time_copies(src, dst, params.warmup, params.iterations)
    }
}

/// Fill `src` with the pattern, copy it to `dst` `warmup` times untimed and `iterations`
/// times timed, check the copy and return bytes per second.
fn time_copies(
    src: &mut NodeBuffer,
    dst: &mut NodeBuffer,
    warmup: u32,
    iterations: u32,
) -> Result<f64, ProbeError> {
    if iterations == 0 {
        return Err(ProbeError::Timing(
            "zero timed iterations: nothing to measure".into(),
        ));
    }
    let len = src.len();
    fill_pattern(src.as_mut_slice());
    let src = src.as_slice();
    let dst = dst.as_mut_slice();

    for _ in 0..warmup {
        dst.copy_from_slice(black_box(src));
        black_box(&mut *dst);
    }
    // Host copies are synchronous: when copy_from_slice returns, the bytes are written,
    // so wall clock around the loop is the copy time. (Device backends time asynchronous
    // copies with device events instead; wall clock there measures launch overhead.)
    // black_box keeps the optimizer from merging or dropping the repeated copies.
    let start = Instant::now();
    for _ in 0..iterations {
        dst.copy_from_slice(black_box(src));
        black_box(&mut *dst);
    }
    let elapsed = start.elapsed().as_secs_f64();

    check_copy(src, dst)?;
    if elapsed <= 0.0 {
        return Err(ProbeError::Timing(format!(
            "{iterations} copies of {len} bytes took no measurable time"
        )));
    }
    let bytes = len as f64 * f64::from(iterations);
    let bw = bytes / elapsed;
    if !bw.is_finite() {
        return Err(ProbeError::Timing(format!(
            "bandwidth is not finite ({bytes} bytes in {elapsed} s)"
        )));
    }
    Ok(bw)
}

/// A buffer of `len` bytes placed on `node`, every page verified there.
fn placed_buffer(len: usize, node: u32) -> Result<NodeBuffer, ProbeError> {
    let buffer = NodeBuffer::new(len, node)?;
    let placed = buffer.verify_placement()?;
    if !placed.all_on_node() {
        return Err(ProbeError::Placement {
            node,
            detail: placed.to_string(),
        });
    }
    Ok(buffer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{Cpu, NumaNode};

    fn node(id: u32, has_memory: bool, cpus: Vec<u32>) -> NumaNode {
        NumaNode {
            id,
            cpus,
            has_memory,
            memory_total_bytes: None,
        }
    }

    fn topo(nodes: Vec<NumaNode>) -> Topology {
        Topology {
            cpus: vec![Cpu {
                id: 0,
                numa_node: Some(0),
                package: Some(0),
                core: Some(0),
                siblings: vec![0],
                allowed: true,
            }],
            offline_cpus: vec![],
            numa_nodes: nodes,
        }
    }

    fn params(direction: Direction) -> CopyParams {
        CopyParams {
            size_bytes: 1 << 20,
            direction,
            warmup: 1,
            iterations: 3,
            host_memory: HostMemory::Pageable,
        }
    }

    #[test]
    fn one_device_per_memory_node() {
        let b = HostBackend::new(&topo(vec![
            node(0, true, vec![0]),
            node(1, false, vec![1]),
            node(2, true, vec![]),
        ]));
        assert_eq!(b.name(), "host");
        let ids: Vec<_> = b.devices().iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["numa0", "numa2"]);
        let d = &b.devices()[1];
        assert_eq!(d.kind, "host");
        assert_eq!(d.name, "NUMA node 2 memory");
        assert_eq!(d.pci_bus_id, "");
        assert_eq!(d.numa_node, Some(2));
    }

    #[test]
    fn measures_both_directions_on_node0() {
        let b = HostBackend::new(&topo(vec![node(0, true, vec![0])]));
        for dir in [Direction::H2d, Direction::D2h] {
            let bw = b.measure_copy("numa0", &params(dir)).unwrap();
            assert!(bw.is_finite() && bw > 0.0, "{dir:?}: {bw}");
        }
    }

    #[test]
    fn one_local_buffer_serves_every_cell_of_its_size_only() {
        let b = HostBackend::new(&topo(vec![node(0, true, vec![0])]));
        let mut staging = b.staging(&params(Direction::H2d)).unwrap();
        for dir in [Direction::H2d, Direction::D2h, Direction::H2d] {
            let bw = staging.measure("numa0", &params(dir)).unwrap();
            assert!(bw.is_finite() && bw > 0.0, "{dir:?}: {bw}");
        }
        let other_size = CopyParams {
            size_bytes: 4096,
            ..params(Direction::H2d)
        };
        let err = staging.measure("numa0", &other_size).unwrap_err();
        assert_eq!(err.reason(), "alloc", "{err}");
        let err = staging
            .measure("numa9", &params(Direction::H2d))
            .unwrap_err();
        assert_eq!(err.reason(), "unknown_device");
        // A failed cell leaves the staging usable.
        assert!(staging.measure("numa0", &params(Direction::D2h)).is_ok());
        assert_eq!(staging.pinned_bytes(), 0);
    }

    #[test]
    fn odd_sizes_copy_correctly() {
        let b = HostBackend::new(&topo(vec![node(0, true, vec![0])]));
        for size in [1u64, 4097, 255 * 16 + 1] {
            let p = CopyParams {
                size_bytes: size,
                ..params(Direction::H2d)
            };
            assert!(b.measure_copy("numa0", &p).is_ok(), "size {size}");
        }
    }

    #[test]
    fn rejects_unknown_devices_and_empty_cells() {
        let b = HostBackend::new(&topo(vec![node(0, true, vec![0]), node(1, false, vec![])]));
        for dev in ["numa1", "numa7", "0", "", "numa"] {
            let err = b.measure_copy(dev, &params(Direction::H2d)).unwrap_err();
            assert_eq!(err.reason(), "unknown_device", "{dev:?}");
        }
        let zero_iter = CopyParams {
            iterations: 0,
            ..params(Direction::H2d)
        };
        let err = b.measure_copy("numa0", &zero_iter).unwrap_err();
        assert_eq!(err.reason(), "timing");
        let zero_size = CopyParams {
            size_bytes: 0,
            ..params(Direction::D2h)
        };
        assert_eq!(
            b.measure_copy("numa0", &zero_size).unwrap_err().reason(),
            "timing"
        );
    }

    #[test]
    fn same_device_copies_stay_on_the_node() {
        let b = HostBackend::new(&topo(vec![node(0, true, vec![0]), node(1, false, vec![])]));
        let p = DeviceCopyParams {
            size_bytes: 1 << 20,
            warmup: 1,
            iterations: 3,
        };
        let bw = b.measure_device_copy("numa0", &p).unwrap();
        assert!(bw.is_finite() && bw > 0.0, "{bw}");
        assert_eq!(
            b.measure_device_copy("numa1", &p).unwrap_err().reason(),
            "unknown_device"
        );
        for bad in [
            DeviceCopyParams { size_bytes: 0, ..p },
            DeviceCopyParams { iterations: 0, ..p },
        ] {
            assert_eq!(
                b.measure_device_copy("numa0", &bad).unwrap_err().reason(),
                "timing"
            );
        }
    }

    #[test]
    fn pattern_has_no_zero_and_check_catches_mismatch() {
        let mut src = vec![0u8; 10_000];
        fill_pattern(&mut src);
        assert!(src.iter().all(|&b| b != 0));
        assert!(src.windows(2).all(|w| w[1] == w[0] % 255 + 1));
        let mut dst = src.clone();
        assert!(check_copy(&src, &dst).is_ok());
        *dst.last_mut().unwrap() = 0;
        assert_eq!(check_copy(&src, &dst).unwrap_err().reason(), "copy");
    }
}
