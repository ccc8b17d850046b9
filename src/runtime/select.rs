//! Choosing and opening the backend: `auto` takes the first runtime that loads and reports
//! devices (CUDA, then ACL), else the host backend; a named backend that cannot be opened is
//! an error. Also picks the device telemetry that goes with it.

use std::path::PathBuf;
use std::sync::Arc;

use super::acl::AclBackend;
use super::cuda::CudaBackend;
use super::host::HostBackend;
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

/// Runtime libraries and options (`[runtime]` in the config).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RuntimeConfig {
    pub backend: BackendChoice,
    pub cuda_runtime: Option<PathBuf>,
    pub acl_runtime: Option<PathBuf>,
    pub nvml: Option<PathBuf>,
    pub host_memory: HostMemory,
}

/// A named backend could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("backend {backend}: {detail}")]
pub struct BackendError {
    pub backend: &'static str,
    pub detail: String,
}

/// The opened backend, its telemetry, and what was tried on the way.
pub struct Opened {
    pub backend: Arc<dyn Backend>,
    pub telemetry: Arc<dyn DeviceTelemetry>,
    /// One line per runtime that was tried and skipped (for the log).
    pub skipped: Vec<String>,
    /// Human description of what runs.
    pub description: String,
}

fn cuda(cfg: &RuntimeConfig, roots: &Roots) -> Result<Opened, String> {
    let backend =
        CudaBackend::open(cfg.cuda_runtime.as_deref(), &roots.sysfs).map_err(|e| e.to_string())?;
    let description = backend.describe();
    let mut skipped = Vec::new();
    let telemetry: Arc<dyn DeviceTelemetry> =
        match NvmlTelemetry::open(cfg.nvml.as_deref(), backend.devices()) {
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
    })
}

fn acl(cfg: &RuntimeConfig, roots: &Roots) -> Result<Opened, String> {
    let backend = Arc::new(
        AclBackend::open(cfg.acl_runtime.as_deref(), &roots.sysfs).map_err(|e| e.to_string())?,
    );
    Ok(Opened {
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
    }
}

/// Open the configured backend.
pub fn open(
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
