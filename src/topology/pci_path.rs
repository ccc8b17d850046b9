//! The PCIe path class of a device pair from the sysfs PCI tree, named as
//! `nvidia-smi topo -m` names them. `<sysfs>/bus/pci/devices/<bdf>` links to the device's
//! directory under `<sysfs>/devices/pciDDDD:BB/` (the host bridge), one directory per bridge on
//! the way down (`.../0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:03:00.0`). Two devices'
//! paths part at their nearest common ancestor; what lies there names the class.
//!
//! The classes follow NVML's `nvmlGpuTopologyLevel_t` (`nvml.h`: `NVML_TOPOLOGY_SINGLE` "all
//! devices that only need traverse a single PCIe switch", `_MULTIPLE` "all devices that need
//! not traverse a host bridge", `_HOSTBRIDGE` "all devices that are connected to the same host
//! bridge", `_NODE` "connected to the same NUMA node but possibly multiple host bridges",
//! `_SYSTEM` "all devices in the system") and the legend of `nvidia-smi topo -m` (PIX
//! "traversing at most a single PCIe bridge", PXB "multiple PCIe bridges (without traversing
//! the PCIe Host Bridge)", PHB "traversing PCIe as well as a PCIe Host Bridge", NODE "PCIe as
//! well as the interconnect between PCIe Host Bridges within a NUMA node", SYS "PCIe as well
//! as the SMP interconnect between NUMA nodes").

use std::path::Path;

/// How a device pair's traffic travels through the PCI tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PathClass {
    /// Under one PCIe switch (or one bridge): the paths part below a switch's upstream port,
    /// each device at most a downstream port below it.
    Pix,
    /// Under one host bridge, through several switches (bridges) but not the host bridge.
    Pxb,
    /// Through the host bridge (root complex) both sit under.
    Phb,
    /// Different host bridges of one NUMA node.
    Node,
    /// Different NUMA nodes: across the CPU interconnect.
    Sys,
    /// A device without a PCI path in sysfs.
    Unknown,
}

impl PathClass {
    /// Every class, nearest first.
    pub const ALL: [PathClass; 6] = [
        PathClass::Pix,
        PathClass::Pxb,
        PathClass::Phb,
        PathClass::Node,
        PathClass::Sys,
        PathClass::Unknown,
    ];

    /// The `nvidia-smi topo -m` name (`unknown` for [`PathClass::Unknown`]).
    pub fn as_str(self) -> &'static str {
        match self {
            PathClass::Pix => "PIX",
            PathClass::Pxb => "PXB",
            PathClass::Phb => "PHB",
            PathClass::Node => "NODE",
            PathClass::Sys => "SYS",
            PathClass::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for PathClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for PathClass {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PathClass::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| format!("unknown PCIe path class {s:?}"))
    }
}

/// One device's place in the tree: its host bridge (`pci0000:00`) and the bridges and
/// device below it, top first (the device last).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciPath {
    pub host_bridge: String,
    pub below: Vec<String>,
}

/// Whether `name` is a host bridge directory, `pciDDDD:BB`.
fn is_host_bridge(name: &str) -> bool {
    name.strip_prefix("pci").is_some_and(|rest| {
        rest.split_once(':').is_some_and(|(d, b)| {
            !d.is_empty()
                && !b.is_empty()
                && d.chars().chain(b.chars()).all(|c| c.is_ascii_hexdigit())
        })
    })
}

/// The path of `bdf` (sysfs spelling) under `sysfs`, if it has one.
pub fn pci_path(sysfs: &Path, bdf: &str) -> Option<PciPath> {
    if bdf.is_empty() {
        return None;
    }
    let real = std::fs::canonicalize(sysfs.join("bus/pci/devices").join(bdf)).ok()?;
    let parts: Vec<String> = real
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let root = parts.iter().rposition(|p| is_host_bridge(p))?;
    let below = parts[root + 1..].to_vec();
    if below.is_empty() {
        return None;
    }
    Some(PciPath {
        host_bridge: parts[root].clone(),
        below,
    })
}

/// The class of two devices' paths, given the NUMA nodes they declare (`None`: unknown; two
/// unknown nodes count as one node, as on a machine without NUMA).
pub fn classify(
    a: Option<&PciPath>,
    b: Option<&PciPath>,
    node_a: Option<u32>,
    node_b: Option<u32>,
) -> PathClass {
    let (Some(a), Some(b)) = (a, b) else {
        return PathClass::Unknown;
    };
    if a.host_bridge != b.host_bridge {
        return if node_a == node_b {
            PathClass::Node
        } else {
            PathClass::Sys
        };
    }
    let shared = a
        .below
        .iter()
        .zip(&b.below)
        .take_while(|(x, y)| x == y)
        .count();
    if shared == 0 {
        // They part right at the host bridge (different root ports).
        return PathClass::Phb;
    }
    // Levels below the common ancestor (a bridge): 1 = on its secondary bus, 2 = below one of
    // its downstream ports (the ancestor is a switch's upstream port).
    let depth_a = a.below.len() - shared;
    let depth_b = b.below.len() - shared;
    if depth_a <= 2 && depth_b <= 2 {
        PathClass::Pix
    } else {
        PathClass::Pxb
    }
}

/// The class of devices `a` and `b` (sysfs bus ids, NUMA nodes) under `sysfs`.
pub fn class_of(sysfs: &Path, a: (&str, Option<u32>), b: (&str, Option<u32>)) -> PathClass {
    classify(
        pci_path(sysfs, a.0).as_ref(),
        pci_path(sysfs, b.0).as_ref(),
        a.1,
        b.1,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sysfs tree of `devices` (bdf, directory under `devices/`) with the relative
    /// `bus/pci/devices` links a kernel makes.
    fn tree(devices: &[(&str, &str)]) -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        let links = tmp.path().join("bus/pci/devices");
        std::fs::create_dir_all(&links).unwrap();
        for (bdf, dir) in devices {
            std::fs::create_dir_all(tmp.path().join("devices").join(dir)).unwrap();
            std::os::unix::fs::symlink(format!("../../../devices/{dir}"), links.join(bdf)).unwrap();
        }
        tmp
    }

    #[test]
    fn classes_follow_the_tree() {
        let t = tree(&[
            // Switch A (upstream 01:00.0) under root port 00:01.0: two GPUs.
            ("0000:03:00.0", "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:03:00.0"),
            ("0000:04:00.0", "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:10.0/0000:04:00.0"),
            // A second switch below switch A's third downstream port.
            (
                "0000:07:00.0",
                "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:18.0/0000:05:00.0/0000:06:00.0/0000:07:00.0",
            ),
            // Another root port of the same host bridge.
            ("0000:08:00.0", "pci0000:00/0000:00:02.0/0000:08:00.0"),
            // Another host bridge, same node / other node.
            ("0000:41:00.0", "pci0000:40/0000:40:01.0/0000:41:00.0"),
            ("0000:81:00.0", "pci0000:80/0000:80:01.0/0000:81:00.0"),
        ]);
        let s = t.path();
        let c = |a: &str, b: &str, na: u32, nb: u32| class_of(s, (a, Some(na)), (b, Some(nb)));
        assert_eq!(c("0000:03:00.0", "0000:04:00.0", 0, 0), PathClass::Pix);
        assert_eq!(c("0000:03:00.0", "0000:07:00.0", 0, 0), PathClass::Pxb);
        assert_eq!(c("0000:03:00.0", "0000:08:00.0", 0, 0), PathClass::Phb);
        assert_eq!(c("0000:03:00.0", "0000:41:00.0", 0, 0), PathClass::Node);
        assert_eq!(c("0000:03:00.0", "0000:81:00.0", 0, 1), PathClass::Sys);
        assert_eq!(c("0000:03:00.0", "0000:ff:00.0", 0, 0), PathClass::Unknown);
        assert_eq!(
            class_of(s, ("", None), ("0000:03:00.0", None)),
            PathClass::Unknown
        );
        // No NUMA on either side: one node.
        assert_eq!(
            class_of(s, ("0000:03:00.0", None), ("0000:41:00.0", None)),
            PathClass::Node
        );
        let p = pci_path(s, "0000:04:00.0").unwrap();
        assert_eq!(p.host_bridge, "pci0000:00");
        assert_eq!(p.below.last().map(String::as_str), Some("0000:04:00.0"));
    }

    /// The 8-GPU fixture: GPUs 0-3 behind one switch on socket 0, 4-7 behind one on socket 1.
    #[test]
    fn the_p2p_node_fixture_has_two_switches_on_two_sockets() {
        let sysfs =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/accelerators/p2p-node/sys");
        let gpus = ["03", "04", "05", "06", "83", "84", "85", "86"]
            .map(|bus| (format!("0000:{bus}:00.0"), u32::from(bus.starts_with('8'))));
        for (i, a) in gpus.iter().enumerate() {
            for (j, b) in gpus.iter().enumerate() {
                if i == j {
                    continue;
                }
                let want = if (i < 4) == (j < 4) {
                    PathClass::Pix
                } else {
                    PathClass::Sys
                };
                let got = class_of(&sysfs, (&a.0, Some(a.1)), (&b.0, Some(b.1)));
                assert_eq!(got, want, "GPU {i} -> GPU {j}");
            }
        }
    }

    #[test]
    fn names_round_trip() {
        for c in PathClass::ALL {
            assert_eq!(c.as_str().parse::<PathClass>(), Ok(c));
        }
        assert!("PCI".parse::<PathClass>().is_err());
        assert!(is_host_bridge("pci0000:00") && is_host_bridge("pci10000:0a"));
        assert!(!is_host_bridge("pci_bus") && !is_host_bridge("0000:00:01.0"));
    }
}
