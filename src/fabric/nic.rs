//! What sysfs says of a rail's network device: the PCI function it belongs to (found through
//! `class/net/<interface>/device`, or where the class link points: `<function>/net/<if>`),
//! that function's NUMA node, and the RDMA port the interface is (`mlx5_0:1`: the function's
//! `infiniband/<hca>/ports/<dev_port + 1>`, as RoCE and IPoIB interfaces sit on their HCA). A
//! virtual interface (veth, bridge, loopback) has no function, so none of these.

use std::path::{Path, PathBuf};

/// The PCI function directory of `interface`, when it has one.
fn function_dir(sysfs: &Path, interface: &str) -> Option<PathBuf> {
    let class = sysfs.join("class/net").join(interface);
    let linked = class.join("device");
    if linked.exists() {
        return linked.canonicalize().ok();
    }
    // `class/net/<if>` -> `devices/.../<function>/net/<if>`: its grandparent, unless that is
    // `devices/virtual`.
    let real = class.canonicalize().ok()?;
    let function = real.parent()?.parent()?;
    (function.join("numa_node").exists() || function.join("infiniband").exists())
        .then(|| function.to_path_buf())
}

/// The NUMA node of `interface`'s device (none for `-1`, a missing file, or no device).
pub fn numa_node(sysfs: &Path, interface: &str) -> Option<u32> {
    let f = function_dir(sysfs, interface)?;
    std::fs::read_to_string(f.join("numa_node"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The RDMA port `interface` is, as `HCA:PORT` (none for an interface without an HCA).
pub fn rdma_port(sysfs: &Path, interface: &str) -> Option<String> {
    let f = function_dir(sysfs, interface)?;
    let mut hcas: Vec<String> = std::fs::read_dir(f.join("infiniband"))
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    hcas.sort();
    let hca = hcas.first()?;
    let ports = f.join("infiniband").join(hca).join("ports");
    // The interface's port of the function (`dev_port`, 0-based) is the HCA's port + 1.
    let dev_port: Option<u32> =
        std::fs::read_to_string(sysfs.join("class/net").join(interface).join("dev_port"))
            .ok()
            .and_then(|t| t.trim().parse().ok());
    if let Some(p) = dev_port.map(|p| p + 1) {
        if ports.join(p.to_string()).is_dir() {
            return Some(format!("{hca}:{p}"));
        }
    }
    let mut listed: Vec<u32> = std::fs::read_dir(&ports)
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
        .collect();
    listed.sort();
    match listed.as_slice() {
        [only] => Some(format!("{hca}:{only}")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(tree: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/collectors")
            .join(tree)
            .join("sys")
    }

    #[test]
    fn roce_interfaces_are_their_hcas_ports_on_their_functions_numa_node() {
        let sys = fixture("roce-dual-rail");
        assert_eq!(rdma_port(&sys, "eth0").as_deref(), Some("mlx5_0:1"));
        assert_eq!(rdma_port(&sys, "eth3").as_deref(), Some("mlx5_1:1"));
        assert_eq!(numa_node(&sys, "eth0"), Some(0));
        assert_eq!(numa_node(&sys, "eth3"), Some(1));
        assert_eq!(rdma_port(&sys, "lo"), None);
        assert_eq!(numa_node(&sys, "eth9"), None);
    }

    #[test]
    fn a_virtual_interface_has_no_device() {
        let sys = tempfile::tempdir().unwrap();
        let virt = sys.path().join("devices/virtual/net/veth0");
        std::fs::create_dir_all(&virt).unwrap();
        std::fs::create_dir_all(sys.path().join("class/net")).unwrap();
        std::os::unix::fs::symlink(
            "../../devices/virtual/net/veth0",
            sys.path().join("class/net/veth0"),
        )
        .unwrap();
        assert_eq!(numa_node(sys.path(), "veth0"), None);
        assert_eq!(rdma_port(sys.path(), "veth0"), None);
    }
}
