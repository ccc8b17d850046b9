//! Where a rail's streams run: on the CPUs of the NUMA node its network device sits on
//! ([`super::nic`]), as a production rank that drives the NIC is
//! placed, among the CPUs this rank may use and without those the node's affinity probe
//! found unbindable (the state directory's ledger, when there is one). `--bind none` leaves
//! the streams where the kernel puts them; `--bind CPULIST` pins every rail's streams there.
//! A rail whose device has no NUMA node (a virtual interface, loopback, a one-node machine's
//! `-1`) or none of whose node's CPUs may be used runs unbound, and its record says so (no
//! `cpus`).

use std::path::Path;
use std::str::FromStr;

use crate::topology::{cpulist, Topology};

/// How the streams are placed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Bind {
    /// On the CPUs of the rail device's NUMA node.
    #[default]
    Auto,
    /// Where the kernel puts them.
    Off,
    /// On these CPUs, every rail.
    Cpus(Vec<u32>),
}

impl FromStr for Bind {
    type Err = String;

    fn from_str(s: &str) -> Result<Bind, String> {
        match s.trim() {
            "auto" => Ok(Bind::Auto),
            "none" => Ok(Bind::Off),
            list => {
                let cpus = cpulist::parse(list).map_err(|e| {
                    format!("{list:?} is not auto, none or a cpulist like 0-7,16: {e}")
                })?;
                if cpus.is_empty() {
                    return Err(format!("{list:?} names no CPU"));
                }
                Ok(Bind::Cpus(cpus))
            }
        }
    }
}

/// The CPUs `interface`'s streams run on under `bind`: of `allowed` (this rank's affinity),
/// without `unbindable`; empty for unbound.
pub fn rail_cpus(
    bind: &Bind,
    sysfs: &Path,
    topology: &Topology,
    interface: &str,
    allowed: &[u32],
    unbindable: &[u32],
) -> Vec<u32> {
    let wanted: Vec<u32> = match bind {
        Bind::Off => return Vec::new(),
        Bind::Cpus(cpus) => cpus.clone(),
        Bind::Auto => {
            let Some(node) = super::nic::numa_node(sysfs, interface) else {
                return Vec::new();
            };
            match topology.numa_nodes.iter().find(|n| n.id == node) {
                Some(n) => n.cpus.clone(),
                None => return Vec::new(),
            }
        }
    };
    wanted
        .into_iter()
        .filter(|c| allowed.contains(c) && !unbindable.contains(c))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::NumaNode;

    fn topology() -> Topology {
        let node = |id, cpus: Vec<u32>| NumaNode {
            id,
            cpus,
            has_memory: true,
            memory_total_bytes: None,
        };
        Topology {
            cpus: Vec::new(),
            offline_cpus: Vec::new(),
            numa_nodes: vec![node(0, vec![0, 1, 2, 3]), node(1, vec![4, 5, 6, 7])],
        }
    }

    #[test]
    fn a_rail_runs_on_its_devices_node_among_the_cpus_it_may_use() {
        let sys = tempfile::tempdir().unwrap();
        let dev = sys.path().join("class/net/eth1/device");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("numa_node"), "1\n").unwrap();
        let virt = sys.path().join("class/net/veth0/device");
        std::fs::create_dir_all(&virt).unwrap();
        std::fs::write(virt.join("numa_node"), "-1\n").unwrap();
        let t = topology();
        let allowed: Vec<u32> = (0..7).collect();
        let cpus = |bind: &Bind, rail: &str, unbindable: &[u32]| {
            rail_cpus(bind, sys.path(), &t, rail, &allowed, unbindable)
        };
        assert_eq!(
            cpus(&Bind::Auto, "eth1", &[]),
            [4, 5, 6],
            "7 is not allowed"
        );
        assert_eq!(cpus(&Bind::Auto, "eth1", &[5]), [4, 6], "5 cannot be bound");
        assert!(cpus(&Bind::Auto, "veth0", &[]).is_empty(), "-1: no node");
        assert!(cpus(&Bind::Auto, "lo", &[]).is_empty(), "no device");
        assert!(cpus(&Bind::Off, "eth1", &[]).is_empty());
        assert_eq!(cpus(&Bind::Cpus(vec![1, 9]), "lo", &[]), [1]);
    }

    #[test]
    fn bind_parses_its_three_forms_and_names_a_bad_one() {
        assert_eq!("auto".parse::<Bind>(), Ok(Bind::Auto));
        assert_eq!("none".parse::<Bind>(), Ok(Bind::Off));
        assert_eq!("0-2,8".parse::<Bind>(), Ok(Bind::Cpus(vec![0, 1, 2, 8])));
        let err = "fast".parse::<Bind>().unwrap_err();
        assert!(err.contains("not auto, none or a cpulist"), "{err}");
    }
}
