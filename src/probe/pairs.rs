//! Resolving the configured device pairs of the core-pair probe to `pair` labels: two device
//! labels in ascending order, comma-joined (`0,5`); `auto` is device 0 with its farthest peer
//! by PCI topology (the fewest shared bridges in the sysfs device path, then another NUMA
//! node, then the highest index). And measuring one pair slot with a pair probe.

use std::collections::BTreeMap;
use std::path::Path;

use crate::format::run_dir::SlotId;
use crate::runtime::pair::{PairParams, PairProbe};
use crate::runtime::{DeviceInfo, ProbeError};
use crate::topology::PairSelection;

/// The `pair` label of two devices: ascending (numerically when both are numbers).
pub fn pair_label(a: &str, b: &str) -> String {
    let (x, y) = match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(x), Ok(y)) if x > y => (b, a),
        (Ok(_), Ok(_)) => (a, b),
        _ if a > b => (b, a),
        _ => (a, b),
    };
    format!("{x},{y}")
}

/// The PCI path of a device: the components of its canonical sysfs directory.
fn pci_path(sysfs: &Path, bdf: &str) -> Vec<String> {
    if bdf.is_empty() {
        return Vec::new();
    }
    std::fs::canonicalize(sysfs.join("bus/pci/devices").join(bdf))
        .map(|p| {
            p.components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Device 0's farthest peer.
pub fn farthest_from_first(devices: &[DeviceInfo], sysfs: &Path) -> Option<String> {
    farthest_peer(devices, &devices.first()?.id, sysfs)
}

/// The farthest peer of `device` among `devices`: the fewest shared bridges in the sysfs
/// device path, then another NUMA node, then the highest index.
pub fn farthest_peer(devices: &[DeviceInfo], device: &str, sysfs: &Path) -> Option<String> {
    let me = devices.iter().find(|d| d.id == device)?;
    let home = pci_path(sysfs, &me.pci_bus_id);
    devices
        .iter()
        .enumerate()
        .filter(|(_, d)| d.id != device)
        .max_by_key(|(i, d)| {
            let path = pci_path(sysfs, &d.pci_bus_id);
            let shared = home.iter().zip(&path).take_while(|(a, b)| a == b).count();
            let other_node = d.numa_node.is_some() && d.numa_node != me.numa_node;
            (std::cmp::Reverse(shared), other_node, *i)
        })
        .map(|(_, d)| d.id.clone())
}

/// Resolve the selections to distinct `pair` labels of existing devices.
pub fn resolve(
    selections: &[PairSelection],
    devices: &[DeviceInfo],
    sysfs: &Path,
) -> Result<Vec<String>, String> {
    let known = |d: &str| devices.iter().any(|x| x.id == d);
    let mut labels = Vec::new();
    for s in selections {
        let label = match s {
            PairSelection::Auto => {
                let peer = farthest_from_first(devices, sysfs)
                    .ok_or_else(|| "pair auto needs at least two devices".to_string())?;
                pair_label(&devices[0].id, &peer)
            }
            PairSelection::Devices(a, b) => {
                for d in [a, b] {
                    if !known(d) {
                        return Err(format!(
                            "pair {s}: there is no device {d} (devices: {})",
                            devices
                                .iter()
                                .map(|x| x.id.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ));
                    }
                }
                pair_label(a, b)
            }
        };
        if !labels.contains(&label) {
            labels.push(label);
        }
    }
    Ok(labels)
}

/// What the pair matrix's cells measure with each pair probe method.
pub fn pair_operation(method: &str) -> &'static str {
    match method {
        "copy" => "peer-copy",
        _ => "allgather",
    }
}

/// How each of `pairs` is measured: the probe's method per pair (asking the runtime, for peer
/// copies, whether the devices can map each other).
pub fn pair_methods(probe: &dyn PairProbe, pairs: &[String]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .filter_map(|p| {
            let (a, b) = p.split_once(',')?;
            let method = probe.pair_method([a, b]).ok()?;
            Some((p.clone(), method.to_string()))
        })
        .collect()
}

/// One pair slot: its device pair with rank 0 on `slot.cpu` and rank 1 on `slot.peer_cpu`.
pub fn measure_pair(
    probe: &dyn PairProbe,
    slot: &SlotId,
    params: &PairParams,
) -> Result<f64, ProbeError> {
    let (a, b) = slot
        .device
        .split_once(',')
        .ok_or_else(|| ProbeError::UnknownDevice(slot.device.clone()))?;
    let peer = slot
        .peer_cpu
        .ok_or_else(|| ProbeError::Collective("a pair cell without a rank 1 CPU".into()))?;
    probe.measure([a, b], [slot.cpu, peer], params)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(id: &str, bdf: &str, node: u32) -> DeviceInfo {
        DeviceInfo {
            id: id.into(),
            kind: "cuda".into(),
            name: "x".into(),
            pci_bus_id: bdf.into(),
            numa_node: Some(node),
        }
    }

    #[test]
    fn labels_are_ascending() {
        assert_eq!(pair_label("5", "0"), "0,5");
        assert_eq!(pair_label("10", "9"), "9,10");
        assert_eq!(pair_label("numa1", "numa0"), "numa0,numa1");
    }

    #[test]
    fn auto_picks_the_peer_behind_other_bridges() {
        let tmp = tempfile::tempdir().unwrap();
        let devices = tmp.path().join("devices");
        let links = tmp.path().join("bus/pci/devices");
        std::fs::create_dir_all(&links).unwrap();
        for (bdf, path) in [
            ("0000:1a:00.0", "pci0000:00/0000:00:01.0/0000:1a:00.0"),
            ("0000:1b:00.0", "pci0000:00/0000:00:01.0/0000:1b:00.0"),
            ("0000:9c:00.0", "pci0000:80/0000:80:01.0/0000:9c:00.0"),
            ("0000:1c:00.0", "pci0000:00/0000:00:02.0/0000:1c:00.0"),
        ] {
            std::fs::create_dir_all(devices.join(path)).unwrap();
            std::os::unix::fs::symlink(devices.join(path), links.join(bdf)).unwrap();
        }
        let list = vec![
            dev("0", "0000:1a:00.0", 0),
            dev("1", "0000:1b:00.0", 0),
            dev("2", "0000:9c:00.0", 1),
            dev("3", "0000:1c:00.0", 0),
        ];
        assert_eq!(farthest_from_first(&list, tmp.path()).as_deref(), Some("2"));
        // Device 2's farthest: every other device is behind the other host bridge and on
        // the other node; the highest index wins.
        assert_eq!(farthest_peer(&list, "2", tmp.path()).as_deref(), Some("3"));
        assert_eq!(farthest_peer(&list, "1", tmp.path()).as_deref(), Some("2"));
        assert_eq!(farthest_peer(&list, "9", tmp.path()), None);
        assert_eq!(
            resolve(
                &[
                    PairSelection::Auto,
                    PairSelection::Devices("2".into(), "0".into())
                ],
                &list,
                tmp.path()
            ),
            Ok(vec!["0,2".to_string()])
        );
    }

    #[test]
    fn unknown_devices_are_named() {
        let list = vec![dev("0", "", 0), dev("1", "", 0)];
        let err = resolve(
            &[PairSelection::Devices("0".into(), "7".into())],
            &list,
            Path::new("/nonexistent"),
        )
        .unwrap_err();
        assert!(err.contains("no device 7"), "{err}");
        // Without PCI paths auto still pairs device 0 with another device.
        assert_eq!(
            resolve(&[PairSelection::Auto], &list, Path::new("/nonexistent")),
            Ok(vec!["0,1".into()])
        );
    }
}
