//! Host topology: which CPUs exist, which this process may use, and how they group into
//! packages, cores and NUMA nodes. Every reader is rooted (`Roots`) so tests point it at a
//! fixture tree shaped like a real kernel's sysfs/procfs.

pub mod cpulist;
mod cpus;
pub mod natural;
mod numa;
pub mod pci;
pub mod pci_link;
pub mod pci_path;
pub mod render;
mod selection;

use std::path::PathBuf;

use serde::Serialize;

pub use selection::{CpuSelection, PairSelection};

/// Where the kernel's pseudo filesystems are mounted (`/sys`, `/proc`, or a fixture tree).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Roots {
    pub sysfs: PathBuf,
    pub procfs: PathBuf,
}

impl Default for Roots {
    fn default() -> Self {
        Roots {
            sysfs: PathBuf::from("/sys"),
            procfs: PathBuf::from("/proc"),
        }
    }
}

/// One online logical CPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cpu {
    /// Logical CPU id as the kernel numbers it.
    pub id: u32,
    /// NUMA node the CPU belongs to (`None` on a kernel without NUMA support).
    pub numa_node: Option<u32>,
    /// `topology/physical_package_id`.
    pub package: Option<u32>,
    /// `topology/core_id` (unique only within a package).
    pub core: Option<u32>,
    /// SMT siblings including this CPU (`topology/thread_siblings_list`).
    pub siblings: Vec<u32>,
    /// Whether this process's affinity mask (cpuset) allows it.
    pub allowed: bool,
}

/// One NUMA node as sysfs lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NumaNode {
    pub id: u32,
    /// CPUs of the node (`nodeN/cpulist`), online or not.
    pub cpus: Vec<u32>,
    /// Whether the node has memory (listed in `node/has_memory`).
    pub has_memory: bool,
    /// `MemTotal` of `nodeN/meminfo`, bytes, when readable.
    pub memory_total_bytes: Option<u64>,
}

/// Everything chd needs to know about the host's CPUs and NUMA layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Topology {
    /// Online CPUs, ascending by id.
    pub cpus: Vec<Cpu>,
    /// CPUs the kernel lists as possible/present but not online, ascending.
    pub offline_cpus: Vec<u32>,
    /// NUMA nodes, ascending by id. A kernel without NUMA gets one synthetic node 0.
    pub numa_nodes: Vec<NumaNode>,
}

/// The host's name (`<procfs>/sys/kernel/hostname`), empty when unreadable.
pub fn hostname(roots: &Roots) -> String {
    std::fs::read_to_string(roots.procfs.join("sys/kernel/hostname"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Why a topology could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot parse {path}: {reason}")]
    Parse { path: PathBuf, reason: String },
}

impl Topology {
    /// Read the topology under `roots`.
    pub fn read(roots: &Roots) -> Result<Topology, TopologyError> {
        let numa_nodes = numa::read_nodes(&roots.sysfs)?;
        let (cpus, offline_cpus) = cpus::read_cpus(roots, &numa_nodes)?;
        Ok(Topology {
            cpus,
            offline_cpus,
            numa_nodes,
        })
    }

    /// The CPU with this id, if online.
    pub fn cpu(&self, id: u32) -> Option<&Cpu> {
        self.cpus
            .binary_search_by_key(&id, |c| c.id)
            .ok()
            .map(|i| &self.cpus[i])
    }

    /// Online CPUs this process may run on, ascending.
    pub fn allowed_cpus(&self) -> impl Iterator<Item = &Cpu> {
        self.cpus.iter().filter(|c| c.allowed)
    }

    /// The CPU of `candidates` (in their order) a device on `numa_node` is probed from where
    /// one CPU must do (its same-device copies): the first one on that node, else (no node,
    /// or no candidate on it) the first candidate.
    pub fn cpu_near(&self, numa_node: Option<u32>, candidates: &[u32]) -> Option<u32> {
        let on_node = numa_node.and_then(|n| {
            candidates
                .iter()
                .copied()
                .find(|&c| self.cpu(c).and_then(|cpu| cpu.numa_node) == Some(n))
        });
        on_node.or_else(|| candidates.first().copied())
    }

    /// NUMA nodes that have memory (the host backend's "devices").
    pub fn memory_nodes(&self) -> impl Iterator<Item = &NumaNode> {
        self.numa_nodes.iter().filter(|n| n.has_memory)
    }
}
