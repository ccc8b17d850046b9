//! Human and machine renderings of a [`Topology`] for `chd topology`: a text table (summary,
//! one line per NUMA node, per-CPU rows on small machines) and pretty JSON.

use std::fmt::Write as _;

use super::{cpulist, Topology};

/// Above this many online CPUs the table leaves out per-CPU rows (`--json` has them).
pub const MAX_CPU_ROWS: usize = 64;

const GIB: f64 = (1u64 << 30) as f64;

/// A human-readable table of `t`.
pub fn table(t: &Topology) -> String {
    let mut out = String::new();
    let allowed: Vec<u32> = t.allowed_cpus().map(|c| c.id).collect();
    let offline = if t.offline_cpus.is_empty() {
        "none".to_string()
    } else {
        cpulist::format(&t.offline_cpus)
    };
    let memory_nodes = t.memory_nodes().count();
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "{} online CPUs, {} allowed ({}), offline: {}, {} NUMA {} ({} with memory)",
        t.cpus.len(),
        allowed.len(),
        or_none(cpulist::format(&allowed)),
        offline,
        t.numa_nodes.len(),
        if t.numa_nodes.len() == 1 {
            "node"
        } else {
            "nodes"
        },
        memory_nodes,
    );

    // Without NUMA support the reader synthesizes node 0 and CPUs carry no node id.
    let synthetic = !t.cpus.is_empty() && t.cpus.iter().all(|c| c.numa_node.is_none());
    for node in &t.numa_nodes {
        let node_allowed: Vec<u32> = node
            .cpus
            .iter()
            .copied()
            .filter(|&id| t.cpu(id).is_some_and(|c| c.allowed))
            .collect();
        let memory = match (node.has_memory, node.memory_total_bytes) {
            (_, Some(bytes)) => format!("{:.1} GiB", bytes as f64 / GIB),
            (true, None) => "yes (size unknown)".to_string(),
            (false, None) => "none".to_string(),
        };
        let _ = writeln!(
            out,
            "node {:<3} cpus {:<24} allowed {:<24} memory {}{}",
            node.id,
            or_none(cpulist::format(&node.cpus)),
            or_none(cpulist::format(&node_allowed)),
            memory,
            if synthetic {
                " (synthetic: kernel without NUMA)"
            } else {
                ""
            },
        );
    }

    if t.cpus.len() > MAX_CPU_ROWS {
        let _ = writeln!(
            out,
            "per-CPU rows omitted ({} CPUs > {MAX_CPU_ROWS}); `--json` shows them",
            t.cpus.len()
        );
        return out;
    }
    let _ = writeln!(
        out,
        "{:>5} {:>5} {:>8} {:>6} {:<12} allowed",
        "cpu", "node", "package", "core", "siblings"
    );
    for c in &t.cpus {
        let _ = writeln!(
            out,
            "{:>5} {:>5} {:>8} {:>6} {:<12} {}",
            c.id,
            opt(c.numa_node),
            opt(c.package),
            opt(c.core),
            cpulist::format(&c.siblings),
            if c.allowed { "yes" } else { "no" },
        );
    }
    out
}

/// `t` as pretty-printed JSON (the `Topology` field names).
pub fn json(t: &Topology) -> String {
    // Plain structs of integers, bools and vectors: serialization cannot fail.
    serde_json::to_string_pretty(t).expect("Topology serializes to JSON")
}

fn opt(v: Option<u32>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

fn or_none(s: String) -> String {
    if s.is_empty() {
        "none".to_string()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Cpu, NumaNode};
    use super::*;

    fn small() -> Topology {
        let cpu = |id, allowed| Cpu {
            id,
            numa_node: Some(0),
            package: Some(0),
            core: Some(id),
            siblings: vec![id],
            allowed,
        };
        Topology {
            cpus: vec![cpu(0, false), cpu(1, true)],
            offline_cpus: vec![2, 3],
            numa_nodes: vec![NumaNode {
                id: 0,
                cpus: vec![0, 1, 2, 3],
                has_memory: true,
                memory_total_bytes: Some(3 << 30),
            }],
        }
    }

    #[test]
    fn table_summary_node_and_cpu_rows() {
        let text = table(&small());
        let mut lines = text.lines();
        assert_eq!(
            lines.next().unwrap(),
            "2 online CPUs, 1 allowed (1), offline: 2-3, 1 NUMA node (1 with memory)"
        );
        let node = lines.next().unwrap();
        assert!(node.starts_with("node 0   cpus 0-3"), "{node}");
        assert!(
            node.contains("allowed 1 ") && node.ends_with("memory 3.0 GiB"),
            "{node}"
        );
        assert!(
            text.contains("    1     0        0      1 1            yes"),
            "{text}"
        );
    }

    #[test]
    fn json_is_pretty_and_has_field_names() {
        let text = json(&small());
        assert!(text.contains("\n  \"cpus\": ["), "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["offline_cpus"], serde_json::json!([2, 3]));
    }
}
