//! NUMA nodes from `<sysfs>/devices/system/node/`: which nodes exist, their CPUs, whether
//! they have memory and how much. A kernel without NUMA support (no `devices/system/node`)
//! gets one synthetic node 0 holding every online CPU.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::{cpulist, NumaNode, TopologyError};

/// `<sysfs>/devices/system/node`.
pub(super) fn node_dir(sysfs: &Path) -> PathBuf {
    sysfs.join("devices/system/node")
}

/// Whether the kernel exposes NUMA nodes at all.
pub(super) fn has_numa(sysfs: &Path) -> bool {
    node_dir(sysfs).is_dir()
}

/// Read every NUMA node, ascending by id.
pub(crate) fn read_nodes(sysfs: &Path) -> Result<Vec<NumaNode>, TopologyError> {
    let dir = node_dir(sysfs);
    if !dir.is_dir() {
        return synthetic_node(sysfs);
    }

    // An empty `online` is no kernel's (node 0 is always online): the node directories
    // say which nodes there are, as when the file is missing; with none either, the one
    // synthetic node, so a topology always has a node.
    let ids = match read_list_opt(&dir.join("online"))? {
        Some(ids) if !ids.is_empty() => ids,
        _ => node_dirs(&dir)?,
    };
    if ids.is_empty() {
        return synthetic_node(sysfs);
    }
    let with_memory = read_list_opt(&dir.join("has_memory"))?;

    let mut nodes = Vec::with_capacity(ids.len());
    for id in ids {
        let node = dir.join(format!("node{id}"));
        let cpus = read_list(&node.join("cpulist"))?;
        let memory_total_bytes = fs::read_to_string(node.join("meminfo"))
            .ok()
            .and_then(|text| parse_meminfo_total(&text));
        let has_memory = match &with_memory {
            Some(list) => list.binary_search(&id).is_ok(),
            None => memory_total_bytes.is_some_and(|b| b > 0),
        };
        nodes.push(NumaNode {
            id,
            cpus,
            has_memory,
            memory_total_bytes,
        });
    }
    Ok(nodes)
}

/// The one node of a kernel without NUMA: node 0 with every online CPU.
fn synthetic_node(sysfs: &Path) -> Result<Vec<NumaNode>, TopologyError> {
    let online = read_list(&sysfs.join("devices/system/cpu/online"))?;
    Ok(vec![NumaNode {
        id: 0,
        cpus: online,
        has_memory: true,
        memory_total_bytes: None,
    }])
}

/// `MemTotal` of a `nodeN/meminfo` text (`"Node 0 MemTotal:       263783792 kB"`), in bytes.
pub(super) fn parse_meminfo_total(text: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        // "Node" "<id>" "MemTotal:" "<value>" "kB"
        if fields.next()? != "Node" {
            return None;
        }
        fields.next()?;
        if fields.next()? != "MemTotal:" {
            return None;
        }
        let value: u64 = fields.next()?.parse().ok()?;
        let scale = match fields.next() {
            Some("kB") => 1024,
            None => 1,
            Some(_) => return None,
        };
        value.checked_mul(scale)
    })
}

/// Node ids from the `nodeN` directory names, ascending.
fn node_dirs(dir: &Path) -> Result<Vec<u32>, TopologyError> {
    let entries = fs::read_dir(dir).map_err(|source| TopologyError::Read {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut ids: Vec<u32> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name();
            let digits = name.to_str()?.strip_prefix("node")?;
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            digits.parse().ok()
        })
        .collect();
    ids.sort_unstable();
    Ok(ids)
}

/// Read and parse a cpulist/nodelist file that must exist.
pub(super) fn read_list(path: &Path) -> Result<Vec<u32>, TopologyError> {
    let text = fs::read_to_string(path).map_err(|source| TopologyError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_list(path, &text)
}

/// Read and parse a cpulist/nodelist file; `None` when it does not exist.
pub(super) fn read_list_opt(path: &Path) -> Result<Option<Vec<u32>>, TopologyError> {
    match fs::read_to_string(path) {
        Ok(text) => parse_list(path, &text).map(Some),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TopologyError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn parse_list(path: &Path, text: &str) -> Result<Vec<u32>, TopologyError> {
    cpulist::parse(text).map_err(|e| TopologyError::Parse {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Head of `node0/meminfo` on a 2-socket Xeon with 512 GiB.
    const XEON_NODE0_MEMINFO: &str = "\
Node 0 MemTotal:       263783792 kB
Node 0 MemFree:        250110244 kB
Node 0 MemUsed:         13673548 kB
Node 0 SwapCached:             0 kB
";

    #[test]
    fn meminfo_total_from_xeon_node0() {
        assert_eq!(
            parse_meminfo_total(XEON_NODE0_MEMINFO),
            Some(263_783_792 * 1024)
        );
    }

    #[test]
    fn meminfo_total_missing_or_garbage() {
        assert_eq!(parse_meminfo_total(""), None);
        assert_eq!(parse_meminfo_total("Node 0 MemFree: 5 kB\n"), None);
        assert_eq!(parse_meminfo_total("Node 0 MemTotal: lots kB\n"), None);
        assert_eq!(parse_meminfo_total("Node 0 MemTotal: 5 MB\n"), None);
        assert_eq!(parse_meminfo_total("MemTotal: 5 kB\n"), None);
    }

    #[test]
    fn missing_node_dir_gives_synthetic_node() {
        let tmp = tempfile::tempdir().unwrap();
        let cpu = tmp.path().join("devices/system/cpu");
        fs::create_dir_all(&cpu).unwrap();
        fs::write(cpu.join("online"), "0-3\n").unwrap();
        let nodes = read_nodes(tmp.path()).unwrap();
        assert_eq!(
            nodes,
            vec![NumaNode {
                id: 0,
                cpus: vec![0, 1, 2, 3],
                has_memory: true,
                memory_total_bytes: None
            }]
        );
        assert!(!has_numa(tmp.path()));
    }

    #[test]
    fn nodes_from_dirs_when_online_missing_and_memory_from_meminfo() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = node_dir(tmp.path());
        for (id, cpus, total) in [(0, "0-1\n", "1024"), (1, "2-3\n", "0"), (10, "\n", "2048")] {
            let node = dir.join(format!("node{id}"));
            fs::create_dir_all(&node).unwrap();
            fs::write(node.join("cpulist"), cpus).unwrap();
            fs::write(
                node.join("meminfo"),
                format!("Node {id} MemTotal:       {total} kB\n"),
            )
            .unwrap();
        }
        fs::create_dir_all(dir.join("nodefoo")).unwrap();
        let nodes = read_nodes(tmp.path()).unwrap();
        let ids: Vec<u32> = nodes.iter().map(|n| n.id).collect();
        assert_eq!(ids, vec![0, 1, 10]);
        let mem: Vec<bool> = nodes.iter().map(|n| n.has_memory).collect();
        assert_eq!(mem, vec![true, false, true]);
        assert_eq!(nodes[2].cpus, Vec::<u32>::new());
        assert_eq!(nodes[0].memory_total_bytes, Some(1024 * 1024));
    }

    /// An empty `node/online` (found by `fuzz/fuzz_targets/topology.rs`): the node
    /// directories count, and with none the synthetic node; never a topology of no node.
    #[test]
    fn empty_online_reads_the_node_dirs_then_the_synthetic_node() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = node_dir(tmp.path());
        fs::create_dir_all(dir.join("node1")).unwrap();
        fs::write(dir.join("online"), "\n").unwrap();
        fs::write(dir.join("node1/cpulist"), "0-1\n").unwrap();
        let cpu = tmp.path().join("devices/system/cpu");
        fs::create_dir_all(&cpu).unwrap();
        fs::write(cpu.join("online"), "0-1\n").unwrap();
        let ids: Vec<u32> = read_nodes(tmp.path())
            .unwrap()
            .iter()
            .map(|n| n.id)
            .collect();
        assert_eq!(ids, vec![1]);
        fs::remove_dir_all(dir.join("node1")).unwrap();
        let nodes = read_nodes(tmp.path()).unwrap();
        assert_eq!(nodes.len(), 1);
        assert_eq!((nodes[0].id, nodes[0].cpus.clone()), (0, vec![0, 1]));
    }

    #[test]
    fn garbage_node_cpulist_is_a_parse_error_naming_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let node = node_dir(tmp.path()).join("node0");
        fs::create_dir_all(&node).unwrap();
        fs::write(node_dir(tmp.path()).join("online"), "0\n").unwrap();
        fs::write(node.join("cpulist"), "zero\n").unwrap();
        let err = read_nodes(tmp.path()).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("node0/cpulist") && msg.contains("zero"),
            "{msg}"
        );
    }
}
