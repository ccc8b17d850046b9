//! Logical CPUs from `<sysfs>/devices/system/cpu/`: which are online or offline, each one's
//! package, core and SMT siblings, its NUMA node (from the node cpulists), and whether this
//! process may run on it (`Cpus_allowed_list:` of `<procfs>/self/status`, which already
//! reflects `sched_setaffinity` and cgroup cpusets).
//!
//! Only the machine-wide lists (`online`) are required; a missing or garbled per-CPU file
//! (`core_id` reading `N/A`, no `topology/` directory) degrades that CPU's field instead of
//! failing the read.

use std::collections::HashMap;
use std::fs;
use std::path::Path;

use super::numa::{has_numa, read_list, read_list_opt};
use super::{cpulist, Cpu, NumaNode, Roots, TopologyError};

/// Read online CPUs (ascending) and the offline ones (present, else possible, minus online).
pub(crate) fn read_cpus(
    roots: &Roots,
    nodes: &[NumaNode],
) -> Result<(Vec<Cpu>, Vec<u32>), TopologyError> {
    let cpu_dir = roots.sysfs.join("devices/system/cpu");
    let online = read_list(&cpu_dir.join("online"))?;
    let present = match read_list_opt(&cpu_dir.join("present"))? {
        Some(list) => list,
        None => read_list_opt(&cpu_dir.join("possible"))?.unwrap_or_default(),
    };
    let offline: Vec<u32> = present
        .into_iter()
        .filter(|id| online.binary_search(id).is_err())
        .collect();

    // Without NUMA support the single node is synthetic: CPUs get no node id.
    let node_of: HashMap<u32, u32> = if has_numa(&roots.sysfs) {
        nodes
            .iter()
            .flat_map(|n| n.cpus.iter().map(move |&c| (c, n.id)))
            .collect()
    } else {
        HashMap::new()
    };

    let allowed = read_allowed(&roots.procfs.join("self/status"));

    let cpus = online
        .iter()
        .map(|&id| {
            let topo = cpu_dir.join(format!("cpu{id}/topology"));
            let mut siblings = fs::read_to_string(topo.join("thread_siblings_list"))
                .ok()
                .and_then(|text| cpulist::parse(&text).ok())
                .unwrap_or_default();
            if let Err(pos) = siblings.binary_search(&id) {
                siblings.insert(pos, id);
            }
            Cpu {
                id,
                numa_node: node_of.get(&id).copied(),
                package: read_u32(&topo.join("physical_package_id")),
                core: read_u32(&topo.join("core_id")),
                siblings,
                allowed: match &allowed {
                    Some(list) => list.binary_search(&id).is_ok(),
                    None => true,
                },
            }
        })
        .collect();
    Ok((cpus, offline))
}

/// The affinity list of `status`; `None` (everything allowed) when the file is unreadable.
fn read_allowed(status: &Path) -> Option<Vec<u32>> {
    let text = fs::read_to_string(status).ok()?;
    match parse_cpus_allowed_list(&text) {
        Some(Ok(list)) => Some(list),
        Some(Err(e)) => {
            tracing::warn!(path = %status.display(), error = %e, "ignoring unparsable Cpus_allowed_list");
            None
        }
        None => None,
    }
}

/// The `Cpus_allowed_list:` line of a `/proc/<pid>/status` text; `None` if absent.
pub(super) fn parse_cpus_allowed_list(
    status: &str,
) -> Option<Result<Vec<u32>, cpulist::CpuListError>> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
        .map(cpulist::parse)
}

/// A single decimal id (`core_id`, `physical_package_id`); `None` if missing or not a
/// non-negative integer (`-1` on some virtual machines, `N/A` on broken firmware).
fn read_u32(path: &Path) -> Option<u32> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tail of `/proc/self/status` inside a container limited to cpuset 1-3.
    const CONTAINER_STATUS: &str = "\
Speculation_Store_Bypass:\tthread vulnerable
Cpus_allowed:\t0e
Cpus_allowed_list:\t1-3
Mems_allowed:\t00000000,00000001
Mems_allowed_list:\t0
voluntary_ctxt_switches:\t3
";

    #[test]
    fn allowed_list_from_container_status() {
        assert_eq!(
            parse_cpus_allowed_list(CONTAINER_STATUS),
            Some(Ok(vec![1, 2, 3]))
        );
    }

    #[test]
    fn allowed_list_absent_or_garbage() {
        assert_eq!(parse_cpus_allowed_list("Name:\tchd\n"), None);
        assert!(matches!(
            parse_cpus_allowed_list("Cpus_allowed_list:\tsome\n"),
            Some(Err(_))
        ));
    }

    #[test]
    fn read_u32_rejects_minus_one_and_na() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("id");
        fs::write(&p, "-1\n").unwrap();
        assert_eq!(read_u32(&p), None);
        fs::write(&p, "N/A\n").unwrap();
        assert_eq!(read_u32(&p), None);
        fs::write(&p, "7\n").unwrap();
        assert_eq!(read_u32(&p), Some(7));
        assert_eq!(read_u32(&tmp.path().join("missing")), None);
    }
}
