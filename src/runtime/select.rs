//! Choosing and opening the backend: `auto` takes the first runtime that loads and reports
//! devices (CUDA, then ACL), else the host backend; a named backend that cannot be opened is
//! an error, and so is host memory the opened backend cannot copy with. Also picks the device
//! telemetry that goes with it.

use std::path::PathBuf;
use std::sync::Arc;

use super::acl::{AclBackend, AclRuntime};
use super::collective::{CollectiveApi, Hccl, Nccl};
use super::cuda::{CudaBackend, CudaRuntime};
use super::device_copy::DeviceApi;
use super::host::HostBackend;
use super::pair::{DevicePairProbe, PairProbe};
use super::pair_cell::Method;
use super::telemetry::{AclTelemetry, DeviceTelemetry, NoTelemetry, NvmlTelemetry};
use super::Backend;
use super::HostMemory;
use crate::topology::{Roots, Topology};

/// Which backend to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    #[default]
    Auto,
    Cuda,
    Acl,
    Host,
}

impl BackendChoice {
    pub fn as_str(self) -> &'static str {
        match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Cuda => "cuda",
            BackendChoice::Acl => "acl",
            BackendChoice::Host => "host",
        }
    }
}

impl std::str::FromStr for BackendChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(BackendChoice::Auto),
            "cuda" => Ok(BackendChoice::Cuda),
            "acl" => Ok(BackendChoice::Acl),
            "host" => Ok(BackendChoice::Host),
            other => Err(format!(
                "unknown backend {other:?}: expected auto, cuda, acl or host"
            )),
        }
    }
}

/// What the pair probe moves bytes with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CollectiveChoice {
    /// NCCL with cuda, HCCL with acl, else peer copies.
    #[default]
    Auto,
    Nccl,
    Hccl,
    /// Peer device-to-device copies, no collective library.
    Copy,
}

impl CollectiveChoice {
    pub fn as_str(self) -> &'static str {
        match self {
            CollectiveChoice::Auto => "auto",
            CollectiveChoice::Nccl => "nccl",
            CollectiveChoice::Hccl => "hccl",
            CollectiveChoice::Copy => "copy",
        }
    }
}

impl std::str::FromStr for CollectiveChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(CollectiveChoice::Auto),
            "nccl" => Ok(CollectiveChoice::Nccl),
            "hccl" => Ok(CollectiveChoice::Hccl),
            "copy" => Ok(CollectiveChoice::Copy),
            other => Err(format!(
                "unknown collective {other:?}: expected auto, nccl, hccl or copy"
            )),
        }
    }
}

/// Runtime libraries and options (`[runtime]` in the config).
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeConfig {
    pub backend: BackendChoice,
    pub cuda_runtime: Option<PathBuf>,
    pub acl_runtime: Option<PathBuf>,
    pub nvml: Option<PathBuf>,
    pub host_memory: HostMemory,
    pub collective: CollectiveChoice,
    pub nccl: Option<PathBuf>,
    pub hccl: Option<PathBuf>,
    /// HCCL communicators the pair probe holds at once per card (`runtime.hccl_communicators_per_card`).
    pub hccl_communicators_per_card: u32,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            backend: BackendChoice::default(),
            cuda_runtime: None,
            acl_runtime: None,
            nvml: None,
            host_memory: HostMemory::default(),
            collective: CollectiveChoice::default(),
            nccl: None,
            hccl: None,
            hccl_communicators_per_card: 1,
        }
    }
}

/// A named backend could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("backend {backend}: {detail}")]
pub struct BackendError {
    pub backend: &'static str,
    pub detail: String,
}

/// The device runtime behind an accelerator backend, for the pair probe.
#[derive(Clone)]
pub(crate) enum DeviceRuntime {
    Cuda(Arc<CudaRuntime>),
    Acl(Arc<AclRuntime>),
}

/// The opened backend, its telemetry, and what was tried on the way.
pub struct Opened {
    pub backend: Arc<dyn Backend>,
    pub telemetry: Arc<dyn DeviceTelemetry>,
    /// One line per runtime that was tried and skipped (for the log).
    pub skipped: Vec<String>,
    /// Human description of what runs.
    pub description: String,
    pub(crate) runtime: Option<DeviceRuntime>,
}

/// The backend's own collective library, loaded or why not.
type NativeCollective = Result<Arc<dyn CollectiveApi>, String>;

/// Open the pair probe for the opened backend: NCCL or HCCL as configured (or found), else
/// peer copies. Returns the probe and notes on what was skipped.
pub fn open_pair_probe(
    cfg: &RuntimeConfig,
    opened: &Opened,
) -> Result<(Arc<dyn PairProbe>, Vec<String>), BackendError> {
    let err = |detail: String| BackendError {
        backend: "pair",
        detail,
    };
    let devices = opened.backend.devices().to_vec();
    if devices.len() < 2 {
        return Err(err(format!(
            "the pair probe needs two devices; the {} backend has {}",
            opened.backend.name(),
            devices.len()
        )));
    }
    let Some(runtime) = opened.runtime.clone() else {
        return Err(err(format!(
            "the pair probe needs an accelerator backend, not {}",
            opened.backend.name()
        )));
    };
    let mut notes = Vec::new();
    let native: Option<NativeCollective> = match (&runtime, cfg.collective) {
        (_, CollectiveChoice::Copy) => None,
        (DeviceRuntime::Cuda(_), CollectiveChoice::Hccl) => {
            return Err(err("hccl goes with the acl backend, not cuda".into()))
        }
        (DeviceRuntime::Acl(_), CollectiveChoice::Nccl) => {
            return Err(err("nccl goes with the cuda backend, not acl".into()))
        }
        _ => Some(native_collective(&runtime, cfg)),
    };
    let api = runtime.api();
    let method = match native {
        Some(Ok(coll)) => Method::Collective(coll),
        Some(Err(e)) if cfg.collective == CollectiveChoice::Auto => {
            notes.push(format!("{e}; the pair probe falls back to peer copies"));
            Method::PeerCopy
        }
        Some(Err(e)) => return Err(err(e)),
        None => Method::PeerCopy,
    };
    let probe = DevicePairProbe::new(api, method, devices, cfg.hccl_communicators_per_card);
    Ok((Arc::new(probe), notes))
}

impl DeviceRuntime {
    /// The runtime's calls.
    pub(crate) fn api(&self) -> Arc<dyn DeviceApi> {
        match self {
            DeviceRuntime::Cuda(rt) => rt.clone(),
            DeviceRuntime::Acl(rt) => rt.clone(),
        }
    }
}

/// The runtime's own collective library, loaded: NCCL with CUDA, HCCL with ACL (the paths
/// of `cfg`).
pub(crate) fn native_collective(
    runtime: &DeviceRuntime,
    cfg: &RuntimeConfig,
) -> Result<Arc<dyn CollectiveApi>, String> {
    match runtime {
        DeviceRuntime::Cuda(_) => Nccl::load(cfg.nccl.as_deref())
            .map(|n| Arc::new(n) as Arc<dyn CollectiveApi>)
            .map_err(|e| e.to_string()),
        DeviceRuntime::Acl(_) => Hccl::load(cfg.hccl.as_deref())
            .map(|h| Arc::new(h) as Arc<dyn CollectiveApi>)
            .map_err(|e| e.to_string()),
    }
}

/// Only the device runtime of `cfg.backend` (cuda or acl) and its devices, without the
/// telemetry or the topology a probing backend needs: what one fabric rank process uses.
pub(crate) fn open_device_runtime(
    cfg: &RuntimeConfig,
    roots: &Roots,
) -> Result<(DeviceRuntime, Vec<super::DeviceInfo>), BackendError> {
    match cfg.backend {
        BackendChoice::Cuda => {
            let b = CudaBackend::open(cfg.cuda_runtime.as_deref(), &roots.sysfs).map_err(|e| {
                BackendError {
                    backend: "cuda",
                    detail: e.to_string(),
                }
            })?;
            Ok((DeviceRuntime::Cuda(b.runtime()), b.devices().to_vec()))
        }
        BackendChoice::Acl => {
            let b = AclBackend::open(cfg.acl_runtime.as_deref(), &roots.sysfs).map_err(|e| {
                BackendError {
                    backend: "acl",
                    detail: e.to_string(),
                }
            })?;
            Ok((DeviceRuntime::Acl(b.shared_runtime()), b.devices().to_vec()))
        }
        other => Err(BackendError {
            backend: "fabric rank",
            detail: format!("{}: a rank process runs cuda or acl", other.as_str()),
        }),
    }
}

fn cuda(cfg: &RuntimeConfig, roots: &Roots) -> Result<Opened, String> {
    let backend =
        CudaBackend::open(cfg.cuda_runtime.as_deref(), &roots.sysfs).map_err(|e| e.to_string())?;
    let description = backend.describe();
    let runtime = Some(DeviceRuntime::Cuda(backend.runtime()));
    let mut skipped = Vec::new();
    let telemetry: Arc<dyn DeviceTelemetry> =
        match NvmlTelemetry::open(cfg.nvml.as_deref(), backend.devices(), &roots.procfs) {
            Ok(t) => Arc::new(t),
            Err(e) => {
                skipped.push(format!("{e}; the device idle gate only sees CPU load"));
                Arc::new(NoTelemetry)
            }
        };
    Ok(Opened {
        backend: Arc::new(backend),
        telemetry,
        skipped,
        description,
        runtime,
    })
}

fn acl(cfg: &RuntimeConfig, roots: &Roots) -> Result<Opened, String> {
    let backend = Arc::new(
        AclBackend::open(cfg.acl_runtime.as_deref(), &roots.sysfs).map_err(|e| e.to_string())?,
    );
    Ok(Opened {
        runtime: Some(DeviceRuntime::Acl(backend.shared_runtime())),
        description: backend.describe(),
        telemetry: Arc::new(AclTelemetry {
            backend: backend.clone(),
        }),
        backend,
        skipped: Vec::new(),
    })
}

fn host(topology: &Topology) -> Opened {
    Opened {
        backend: Arc::new(HostBackend::new(topology)),
        telemetry: Arc::new(NoTelemetry),
        skipped: Vec::new(),
        description: "host backend (CPU core x NUMA node memory copies)".into(),
        runtime: None,
    }
}

/// Open the configured backend. A backend that cannot copy with the configured host memory
/// (`runtime.host_memory`) is a configuration error.
pub fn open(
    cfg: &RuntimeConfig,
    roots: &Roots,
    topology: &Topology,
) -> Result<Opened, BackendError> {
    let opened = open_backend(cfg, roots, topology)?;
    if let Err(why) = opened.backend.check_host_memory(cfg.host_memory) {
        return Err(BackendError {
            backend: opened.backend.name(),
            detail: format!(
                "runtime.host_memory (--host-memory) = {}: {why}",
                cfg.host_memory.as_str()
            ),
        });
    }
    Ok(opened)
}

fn open_backend(
    cfg: &RuntimeConfig,
    roots: &Roots,
    topology: &Topology,
) -> Result<Opened, BackendError> {
    let named = |backend: &'static str, r: Result<Opened, String>| {
        r.map_err(|detail| BackendError { backend, detail })
    };
    match cfg.backend {
        BackendChoice::Cuda => named("cuda", cuda(cfg, roots)),
        BackendChoice::Acl => named("acl", acl(cfg, roots)),
        BackendChoice::Host => Ok(host(topology)),
        BackendChoice::Auto => {
            let mut skipped = Vec::new();
            for (name, attempt) in [
                ("cuda", cuda as fn(&RuntimeConfig, &Roots) -> _),
                ("acl", acl),
            ] {
                match attempt(cfg, roots) {
                    Ok(mut opened) => {
                        skipped.append(&mut opened.skipped);
                        opened.skipped = skipped;
                        return Ok(opened);
                    }
                    Err(e) => skipped.push(format!("{name} skipped: {e}")),
                }
            }
            let mut opened = host(topology);
            opened.skipped = skipped;
            Ok(opened)
        }
    }
}
