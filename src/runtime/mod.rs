//! Accelerator runtimes behind one trait. The `host` backend (no accelerator: copies between
//! a buffer local to the bound CPU and a buffer placed on a chosen NUMA node) runs anywhere;
//! CUDA and ACL implement the same trait.

pub mod acl;
pub mod collective;
pub mod cuda;
pub mod describe;
pub mod device_api;
pub mod device_copy;
mod device_wait;
pub mod gemm;
pub mod host;
pub mod library;
pub mod numa_memory;
pub mod own_process;
pub mod pair;
mod pair_cell;
mod pair_hold;
mod pattern;
pub mod peer_access;
pub mod peer_copy;
pub mod rank_comm;
mod same_device_copy;
pub mod select;
pub mod stream_latch;
pub mod stuck_work;
pub mod telemetry;

use serde::Serialize;

pub use peer_copy::PeerCopy;

/// The copy direction and host memory kind are the vocabulary's (`crate::vocab`); the
/// runtime takes them in its copy parameters.
pub use crate::vocab::{Direction, HostMemory};

/// One device a backend can copy to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceInfo {
    /// The `device` label: a runtime index (`"0"`) or `numa<N>` for the host backend.
    pub id: String,
    /// `host`, `cuda`, `acl`.
    pub kind: String,
    /// Human-readable name.
    pub name: String,
    /// PCI bus id, empty where there is none.
    pub pci_bus_id: String,
    /// NUMA node the device sits on, as sysfs declares it.
    pub numa_node: Option<u32>,
}

/// How one cell is measured: warm-up copies, then `iterations` timed copies of `size_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyParams {
    pub size_bytes: u64,
    pub direction: Direction,
    pub warmup: u32,
    pub iterations: u32,
    /// Host side of accelerator copies (the host backend always uses ordinary memory).
    pub host_memory: HostMemory,
}

/// How one same-device copy cell is measured: `warmup` untimed, then `iterations` timed
/// copies of `size_bytes` from one buffer of the device's memory to another of the same
/// device (HBM to HBM on an accelerator).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceCopyParams {
    pub size_bytes: u64,
    pub warmup: u32,
    pub iterations: u32,
}

/// Why a cell could not be measured. `reason()` is the `reason` label of
/// `chd_probe_errors_total`.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// `detail` names the CPU (an `affinity::AffinityError` does: "binding to cpu 2
    /// failed: ..."), so it is the whole message.
    #[error("{detail}")]
    Bind { cpu: u32, detail: String },
    #[error("allocating {bytes} bytes failed: {detail}")]
    Alloc { bytes: u64, detail: String },
    #[error("memory placement on numa node {node} failed: {detail}")]
    Placement { node: u32, detail: String },
    #[error("unknown device {0:?}")]
    UnknownDevice(String),
    #[error("copy failed: {0}")]
    Copy(String),
    #[error("timing failed: {0}")]
    Timing(String),
    #[error("device unusable: {0}")]
    Device(String),
    #[error("collective failed: {0}")]
    Collective(String),
    #[error("timed out: {0}")]
    Timeout(String),
    #[error("quarantined: {0}")]
    Quarantined(String),
    #[error("not supported: {0}")]
    Unsupported(String),
    #[error("compute failed: {0}")]
    Compute(String),
}

impl ProbeError {
    /// Bounded label value naming the failure class.
    pub fn reason(&self) -> &'static str {
        match self {
            ProbeError::Bind { .. } => "bind",
            ProbeError::Alloc { .. } => "alloc",
            ProbeError::Placement { .. } => "placement",
            ProbeError::UnknownDevice(_) => "unknown_device",
            ProbeError::Copy(_) => "copy",
            ProbeError::Timing(_) => "timing",
            ProbeError::Device(_) => "device",
            ProbeError::Collective(_) => "collective",
            ProbeError::Timeout(_) => "timeout",
            ProbeError::Quarantined(_) => "quarantined",
            ProbeError::Unsupported(_) => "unsupported",
            ProbeError::Compute(_) => "compute",
        }
    }
}

/// Parse a runtime device label back to its index, if this backend listed it.
pub(crate) fn device_index(devices: &[DeviceInfo], device: &str) -> Result<i32, ProbeError> {
    devices
        .iter()
        .find(|d| d.id == device)
        .and_then(|d| d.id.parse().ok())
        .ok_or_else(|| ProbeError::UnknownDevice(device.to_string()))
}

/// An accelerator runtime (or the host stand-in) that can time copies.
/// What a backend can do beyond copying between host memory and its devices: asked, instead
/// of its name, wherever a plan or a window depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Copies can stage through page-locked host memory from the runtime (`pinned`); the
    /// host backend copies between ordinary (`pageable`) memory only.
    pub pinned_host_memory: bool,
    /// Peer copies between two of its devices ([`Backend::measure_peer_copy`]) mean a link
    /// between two accelerators; the host backend's devices are NUMA nodes of one memory.
    pub peer_copies: bool,
}

impl Capabilities {
    /// An accelerator runtime's (CUDA, ACL).
    pub const ACCELERATOR: Capabilities = Capabilities {
        pinned_host_memory: true,
        peer_copies: true,
    };
    /// The host backend's: ordinary memory, no peer links.
    pub const HOST: Capabilities = Capabilities {
        pinned_host_memory: false,
        peer_copies: false,
    };
}

pub trait Backend: Send + Sync {
    /// `host`, `cuda`, `acl`: the `backend` label.
    fn name(&self) -> &'static str;
    /// What it can do beyond copying to its devices (an accelerator runtime's unless it says).
    fn capabilities(&self) -> Capabilities {
        Capabilities::ACCELERATOR
    }
    /// Devices in runtime order.
    fn devices(&self) -> &[DeviceInfo];
    /// Measure one copy cell on the calling thread, which the caller has already bound to the
    /// cell's CPU. Allocates (and first-touches) its host buffer on this thread, warms up,
    /// times `iterations` copies and returns bytes per second. Frees everything it allocated.
    fn measure_copy(&self, device: &str, params: &CopyParams) -> Result<f64, ProbeError>;
    /// Measure one same-device copy cell (device memory to device memory of `device`) on the
    /// calling thread, which the caller has already bound; returns bytes per second (the bytes
    /// of one copy over its time, as nvbandwidth's device-local copy counts them). Frees
    /// everything it allocated. The default: this backend cannot.
    fn measure_device_copy(
        &self,
        device: &str,
        _params: &DeviceCopyParams,
    ) -> Result<f64, ProbeError> {
        Err(ProbeError::Unsupported(format!(
            "the {} backend has no same-device copy (device {device})",
            self.name()
        )))
    }
    /// Measure one ordered peer copy cell (device memory of `src` to device memory of `dst`,
    /// issued on a stream of `src`) on the calling thread: peer access is opened for the cell
    /// and closed after it, and everything allocated is freed. Returns bytes per second and
    /// how the copies went (`copy`, or `copy-staged` where the runtime staged them through
    /// host memory). The default: this backend cannot.
    fn measure_peer_copy(
        &self,
        src: &str,
        dst: &str,
        _params: &DeviceCopyParams,
    ) -> Result<PeerCopy, ProbeError> {
        Err(ProbeError::Unsupported(format!(
            "the {} backend has no peer copies (device {src} -> device {dst})",
            self.name()
        )))
    }
    /// The devices whose copy-cell work did not finish in time (quarantined: their cells are
    /// refused) and the memory that work holds (`runtime::stuck_work`). Default: none.
    fn stuck(&self) -> stuck_work::StuckReport {
        stuck_work::StuckReport::default()
    }
    /// Ask the stuck work again whether it finished; release what has (its devices answer
    /// again). Default: nothing to ask.
    fn recheck_stuck(&self) {}
    /// Why this backend cannot measure copies with `memory` on the host side, if it cannot: a
    /// configuration error, reported before any cell runs.
    fn check_host_memory(&self, _memory: HostMemory) -> Result<(), String> {
        Ok(())
    }
    /// The host side for a run of cells on the calling thread (already bound to their CPU)
    /// that share `params`' size and host memory: the host buffer is allocated (pinned, for
    /// pinned cells) and first-touched here, once, and serves every device of the run in turn
    /// through [`HostStaging::measure`]. Dropping the staging frees it. The default allocates
    /// per cell, as [`Backend::measure_copy`] does.
    fn staging(&self, params: &CopyParams) -> Result<Box<dyn HostStaging + '_>, ProbeError> {
        Ok(Box::new(PerCell {
            backend: self,
            size_bytes: params.size_bytes,
            host_memory: params.host_memory,
        }))
    }
}

/// Host memory kept for a run of cells of one size and host memory kind (see
/// [`Backend::staging`]).
pub trait HostStaging {
    /// Measure one cell, of the staging's size and host memory, on `device`. A failure costs
    /// this cell only: the staging stays usable for the next device.
    fn measure(&mut self, device: &str, params: &CopyParams) -> Result<f64, ProbeError>;
    /// Pinned host bytes the staging holds now (0 for pageable memory and the host backend).
    fn pinned_bytes(&self) -> u64;
}

/// The staging of a backend without reuse: every cell allocates its own buffer.
struct PerCell<'a, B: Backend + ?Sized> {
    backend: &'a B,
    size_bytes: u64,
    host_memory: HostMemory,
}

impl<B: Backend + ?Sized> HostStaging for PerCell<'_, B> {
    fn measure(&mut self, device: &str, params: &CopyParams) -> Result<f64, ProbeError> {
        check_staging_fits(self.size_bytes, self.host_memory, params)?;
        self.backend.measure_copy(device, params)
    }
    fn pinned_bytes(&self) -> u64 {
        0
    }
}

/// A staging serves only cells of the size and host memory it was made for.
pub(crate) fn check_staging_fits(
    size_bytes: u64,
    host_memory: HostMemory,
    params: &CopyParams,
) -> Result<(), ProbeError> {
    if params.size_bytes == size_bytes && params.host_memory == host_memory {
        Ok(())
    } else {
        Err(ProbeError::Alloc {
            bytes: params.size_bytes,
            detail: format!(
                "the host buffer holds {size_bytes} bytes of {} memory",
                host_memory.as_str()
            ),
        })
    }
}
