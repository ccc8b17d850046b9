//! Renderings of the opened backend's devices for `chd topology`: a table under the CPU
//! table, and the same data merged into the topology JSON (`backend`, `devices` keys).

use std::fmt::Write as _;

use super::DeviceInfo;
use crate::topology::Topology;

/// A table of `devices` headed by the backend that found them.
pub fn devices_table(backend: &str, description: &str, devices: &[DeviceInfo]) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "backend {backend}: {description}, {} devices",
        devices.len()
    );
    if devices.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "  {:>6}  {:<6} {:<14} {:>4}  name",
        "device", "kind", "pci_bus_id", "numa"
    );
    for d in devices {
        let node = d
            .numa_node
            .map(|n| n.to_string())
            .unwrap_or_else(|| "-".into());
        let pci = if d.pci_bus_id.is_empty() {
            "-"
        } else {
            &d.pci_bus_id
        };
        let _ = writeln!(
            out,
            "  {:>6}  {:<6} {:<14} {:>4}  {}",
            d.id, d.kind, pci, node, d.name
        );
    }
    out
}

/// The topology JSON with `backend` and `devices` added at the top level.
pub fn topology_json(t: &Topology, backend: &str, devices: &[DeviceInfo]) -> String {
    let mut value = serde_json::to_value(t).unwrap_or_default();
    if let Some(map) = value.as_object_mut() {
        map.insert("backend".into(), backend.into());
        map.insert(
            "devices".into(),
            serde_json::to_value(devices).unwrap_or_default(),
        );
    }
    serde_json::to_string_pretty(&value).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(id: &str, node: Option<u32>) -> DeviceInfo {
        DeviceInfo {
            id: id.into(),
            kind: "cuda".into(),
            name: "Fake H200".into(),
            pci_bus_id: format!("0000:1{id}:00.0"),
            numa_node: node,
        }
    }

    #[test]
    fn table_lists_each_device() {
        let t = devices_table(
            "cuda",
            "CUDA runtime 12.4",
            &[device("0", Some(0)), device("1", None)],
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "backend cuda: CUDA runtime 12.4, 2 devices");
        assert!(lines[2].contains("0000:10:00.0") && lines[2].trim_end().ends_with("Fake H200"));
        assert!(lines[3].contains("   -  "), "{}", lines[3]);
    }
}
