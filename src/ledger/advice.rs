//! `chd advise`: from a node's ledger, for each device the CPUs within 5 % of its best H2D
//! cell (the ledger's `best_cpus`, less CPUs the affinity probe found unbindable), their NUMA
//! nodes against the one sysfs declares, and ready bindings: a `numactl` and a `taskset` line
//! per local rank (local rank i drives the i-th device in natural order) and Slurm's
//! `--cpu-bind=map_cpu:...` / `mask_cpu:...` lists (srun(1): one CPU id, or one hex mask, per
//! task, comma-separated).

use serde::Serialize;

use crate::format::calibration::Ledger;
use crate::topology::cpulist;

/// One device's advice.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceAdvice {
    pub local_rank: usize,
    pub device: String,
    /// cpulist of the bindable CPUs within the tolerance of the best cell.
    pub cpus: String,
    /// The device's best cell, GB/s.
    pub best_gbps: f64,
    /// NUMA nodes of `cpus`.
    pub numa_nodes: Vec<u32>,
    pub declared_numa_node: Option<u32>,
    /// Whether the best CPUs all sit on the declared node (`None` where none is declared).
    pub on_declared_node: Option<bool>,
    pub numactl: String,
    pub taskset: String,
}

/// The launchers' lists, rank by rank.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CpuBind {
    /// `map_cpu:4,12,...`: one of each rank's best CPUs, distinct where they can be.
    pub map_cpu: String,
    /// `mask_cpu:0xf0,...`: each rank's best CPUs as a hex mask.
    pub mask_cpu: String,
}

/// A node's advice.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Advice {
    pub host: String,
    pub source: String,
    pub tolerance: f64,
    pub devices: Vec<DeviceAdvice>,
    pub cpu_bind: CpuBind,
    /// What could not be advised, and why.
    pub notes: Vec<String>,
}

/// `cpus` as a hex mask, lowest CPU in the lowest bit (taskset(1), srun's `mask_cpu`).
pub fn hex_mask(cpus: &[u32]) -> String {
    let Some(&top) = cpus.iter().max() else {
        return "0x0".into();
    };
    let mut nibbles = vec![0u8; top as usize / 4 + 1];
    for &c in cpus {
        nibbles[c as usize / 4] |= 1 << (c % 4);
    }
    let digits: String = nibbles
        .iter()
        .rev()
        .map(|n| char::from_digit(u32::from(*n), 16).unwrap_or('0'))
        .collect();
    format!("0x{digits}")
}

fn ids(list: &str) -> Vec<u32> {
    cpulist::parse(list).unwrap_or_default()
}

/// The advice of `ledger`.
pub fn advise(ledger: &Ledger) -> Advice {
    let not_bindable = ids(&ledger.affinity_bindable_cpus.not_bindable);
    let numa_of = |cpu: u32| {
        ledger
            .node
            .numa_nodes
            .iter()
            .find(|n| ids(&n.cpus).contains(&cpu))
            .map(|n| n.id)
    };
    let mut notes = Vec::new();
    let mut devices = Vec::new();
    let mut tolerance = crate::analysis::best_cpus::BEST_CPU_TOLERANCE;
    for d in &ledger.node.devices {
        let Some(best) = &d.best_cpus else {
            notes.push(format!("device {}: no measured H2D cell", d.id));
            continue;
        };
        tolerance = best.tolerance;
        if let Some(slow) = ledger.findings.slow_devices.iter().find(|s| {
            s.device == d.id && s.size_bytes == best.size_bytes && s.direction == best.direction
        }) {
            notes.push(format!(
                "device {}: its column is {:.2} x the typical device's (a slow device: no \
                 binding makes up for it)",
                d.id, slow.ratio
            ));
        }
        let all = ids(&best.cpus);
        let cpus: Vec<u32> = all
            .iter()
            .copied()
            .filter(|c| !not_bindable.contains(c))
            .collect();
        if cpus.len() < all.len() {
            let dropped: Vec<u32> = all.iter().copied().filter(|c| !cpus.contains(c)).collect();
            notes.push(format!(
                "device {}: CPUs {} are among the best but not bindable (affinity probe); left out",
                d.id,
                cpulist::format(&dropped)
            ));
        }
        if cpus.is_empty() {
            notes.push(format!(
                "device {}: none of its best CPUs is bindable",
                d.id
            ));
            continue;
        }
        let mut numa_nodes: Vec<u32> = cpus.iter().filter_map(|&c| numa_of(c)).collect();
        numa_nodes.sort_unstable();
        numa_nodes.dedup();
        let list = cpulist::format(&cpus);
        let membind = numa_nodes
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        devices.push(DeviceAdvice {
            local_rank: devices.len(),
            device: d.id.clone(),
            numactl: if membind.is_empty() {
                format!("numactl --physcpubind={list}")
            } else {
                format!("numactl --physcpubind={list} --membind={membind}")
            },
            taskset: format!("taskset -c {list}"),
            cpus: list,
            best_gbps: best.best_gbps,
            on_declared_node: d
                .declared_numa_node
                .map(|n| !numa_nodes.is_empty() && numa_nodes.iter().all(|&m| m == n)),
            numa_nodes,
            declared_numa_node: d.declared_numa_node,
        });
    }
    // One CPU per rank for map_cpu: the lowest best CPU no earlier rank took, else the lowest.
    let mut taken: Vec<u32> = Vec::new();
    let mut map = Vec::new();
    let mut masks = Vec::new();
    for d in &devices {
        let cpus = ids(&d.cpus);
        let pick = cpus
            .iter()
            .copied()
            .find(|c| !taken.contains(c))
            .unwrap_or(cpus[0]);
        taken.push(pick);
        map.push(pick.to_string());
        masks.push(hex_mask(&cpus));
    }
    Advice {
        host: ledger.node.host.clone(),
        source: ledger.source.clone(),
        tolerance,
        devices,
        cpu_bind: CpuBind {
            map_cpu: format!("map_cpu:{}", map.join(",")),
            mask_cpu: format!("mask_cpu:{}", masks.join(",")),
        },
        notes,
    }
}

/// `advice` for a terminal.
pub fn render(advice: &Advice) -> String {
    let mut out = format!(
        "{}: CPUs within {:.0} % of each device's best H2D cell ({})\n",
        advice.host,
        advice.tolerance * 100.0,
        advice.source
    );
    for d in &advice.devices {
        let nodes = d
            .numa_nodes
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let declared = match (d.declared_numa_node, d.on_declared_node) {
            (Some(n), Some(true)) => format!("the declared node {n}"),
            (Some(n), _) => format!("NOT the declared node {n}"),
            (None, _) => "no node declared".to_string(),
        };
        out.push_str(&format!(
            "local rank {} -> device {}: CPUs {} (NUMA {nodes}; {declared}), best {:.1} GB/s\n  {}\n  {}\n",
            d.local_rank, d.device, d.cpus, d.best_gbps, d.numactl, d.taskset
        ));
    }
    out.push_str(&format!(
        "--cpu-bind={}\n--cpu-bind={}\n",
        advice.cpu_bind.map_cpu, advice.cpu_bind.mask_cpu
    ));
    for n in &advice.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_put_cpu_zero_in_the_lowest_bit() {
        assert_eq!(hex_mask(&[0, 1]), "0x3");
        assert_eq!(hex_mask(&[2, 3]), "0xc");
        assert_eq!(hex_mask(&[4]), "0x10");
        assert_eq!(hex_mask(&[0, 127]), format!("0x8{}1", "0".repeat(30)));
    }
}
