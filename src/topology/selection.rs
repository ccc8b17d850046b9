//! Selections over the node's CPUs and devices as the config file and the command line
//! write them: [`CpuSelection`] (which CPUs to probe, resolved against the [`Topology`]) and
//! [`PairSelection`] (which device pairs the core-pair probe measures, resolved to pair labels
//! by `probe::pairs` against the runtime's devices and their PCI paths).

use std::collections::BTreeMap;

use super::cpulist::{self, CpuListError};
use super::Topology;

/// Why a selection does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectionError {
    #[error("{0:?}: per-node:N needs a count N of at least 1")]
    PerNodeCount(String),
    #[error(transparent)]
    CpuList(#[from] CpuListError),
    #[error("selects no CPU")]
    NoCpu,
    #[error("{0:?} is not a pair like \"0,5\" (two different devices) or \"auto\"")]
    Pair(String),
}

/// Which CPUs to probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CpuSelection {
    /// Every online CPU this process may use.
    All,
    /// Exactly these (intersected with the online CPUs at run time).
    List(Vec<u32>),
    /// Up to N allowed CPUs of every NUMA node, evenly spread over the node (`per-node:N`).
    PerNode(usize),
}

impl CpuSelection {
    /// Parse `all`, `per-node:N` or a cpulist such as `0-79,160`.
    pub fn parse(text: &str) -> Result<CpuSelection, SelectionError> {
        let text = text.trim();
        if text == "all" || text == "auto" {
            return Ok(CpuSelection::All);
        }
        if let Some(n) = text.strip_prefix("per-node:") {
            return match n.parse::<usize>() {
                Ok(n) if n > 0 => Ok(CpuSelection::PerNode(n)),
                _ => Err(SelectionError::PerNodeCount(text.to_string())),
            };
        }
        let ids = cpulist::parse(text)?;
        if ids.is_empty() {
            return Err(SelectionError::NoCpu);
        }
        Ok(CpuSelection::List(ids))
    }

    /// The CPUs this selects on `topology`, ascending.
    pub fn resolve(&self, topology: &Topology) -> Vec<u32> {
        match self {
            CpuSelection::All => topology.allowed_cpus().map(|c| c.id).collect(),
            CpuSelection::List(ids) => ids
                .iter()
                .copied()
                .filter(|id| topology.cpu(*id).is_some())
                .collect(),
            CpuSelection::PerNode(n) => {
                let mut picked = Vec::new();
                let mut by_node: BTreeMap<Option<u32>, Vec<u32>> = BTreeMap::new();
                for cpu in topology.allowed_cpus() {
                    by_node.entry(cpu.numa_node).or_default().push(cpu.id);
                }
                for cpus in by_node.values() {
                    let take = (*n).min(cpus.len());
                    picked.extend((0..take).map(|i| cpus[i * cpus.len() / take]));
                }
                picked.sort_unstable();
                picked
            }
        }
    }
}

impl std::fmt::Display for CpuSelection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CpuSelection::All => f.write_str("all"),
            CpuSelection::List(ids) => f.write_str(&cpulist::format(ids)),
            CpuSelection::PerNode(n) => write!(f, "per-node:{n}"),
        }
    }
}

/// A device pair of the core-pair probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PairSelection {
    /// Device 0 and its farthest peer by PCI topology.
    Auto,
    /// Two device labels, as the runtime numbers them.
    Devices(String, String),
}

impl PairSelection {
    /// Parse `auto` or `A,B` (two different device labels).
    pub fn parse(text: &str) -> Result<PairSelection, SelectionError> {
        let text = text.trim();
        if text == "auto" {
            return Ok(PairSelection::Auto);
        }
        match text.split(',').map(str::trim).collect::<Vec<_>>()[..] {
            [a, b] if !a.is_empty() && !b.is_empty() && a != b => {
                Ok(PairSelection::Devices(a.to_string(), b.to_string()))
            }
            _ => Err(SelectionError::Pair(text.to_string())),
        }
    }
}

impl std::fmt::Display for PairSelection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PairSelection::Auto => f.write_str("auto"),
            PairSelection::Devices(a, b) => write!(f, "{a},{b}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_selections_parse_and_print_back() {
        for text in ["all", "per-node:2", "0-3,8"] {
            assert_eq!(CpuSelection::parse(text).unwrap().to_string(), text);
        }
        assert_eq!(CpuSelection::parse("auto").unwrap(), CpuSelection::All);
        assert!(CpuSelection::parse("per-node:0").is_err());
        assert!(CpuSelection::parse("0-x").is_err());
    }

    #[test]
    fn pair_selections_need_two_different_devices() {
        assert_eq!(PairSelection::parse(" auto ").unwrap(), PairSelection::Auto);
        assert_eq!(
            PairSelection::parse("0, 5").unwrap(),
            PairSelection::Devices("0".into(), "5".into())
        );
        for bad in ["0", "0,0", "0,", "0,1,2"] {
            assert!(PairSelection::parse(bad).is_err(), "{bad}");
        }
    }
}
