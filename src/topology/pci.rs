//! PCI devices under `<sysfs>/bus/pci/devices/<bdf>/`: the NUMA node a device declares and
//! the devices of one vendor and class (how Ascend NPUs are found, since ACL has no PCI bus
//! id query). Bus ids are compared in sysfs's lower-case spelling.

use std::path::Path;

/// The sysfs spelling of a PCI bus id: lower case, 4-digit domain. CUDA/NVML write
/// `00000000:1A:00.0`; sysfs names that device `0000:1a:00.0`.
pub fn sysfs_bdf(bus_id: &str) -> String {
    let id = bus_id.trim().to_ascii_lowercase();
    match id.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 && domain.starts_with("0000") => {
            format!("{}:{rest}", &domain[domain.len() - 4..])
        }
        _ => id,
    }
}

/// The NUMA node sysfs declares for `bdf`; `None` when unknown (-1, missing, garbage).
pub fn numa_node(sysfs: &Path, bdf: &str) -> Option<u32> {
    let path = sysfs
        .join("bus/pci/devices")
        .join(bdf.to_ascii_lowercase())
        .join("numa_node");
    let text = std::fs::read_to_string(path).ok()?;
    parse_numa_node(&text)
}

/// `numa_node` file contents: a node id, or -1 for "no node".
pub fn parse_numa_node(text: &str) -> Option<u32> {
    text.trim()
        .parse::<i64>()
        .ok()
        .and_then(|n| u32::try_from(n).ok())
}

/// Bus ids of the PCI devices whose `vendor` is `vendor` (e.g. `0x19e5`) and whose `class`
/// starts with `class_prefix` (e.g. `0x1200`, processing accelerators), ascending.
pub fn devices_of(sysfs: &Path, vendor: &str, class_prefix: &str) -> Vec<String> {
    let dir = sysfs.join("bus/pci/devices");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let read = |bdf: &str, file: &str| {
        std::fs::read_to_string(dir.join(bdf).join(file))
            .map(|s| s.trim().to_ascii_lowercase())
            .unwrap_or_default()
    };
    let mut found: Vec<String> = entries
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|bdf| read(bdf, "vendor") == vendor && read(bdf, "class").starts_with(class_prefix))
        .collect();
    found.sort();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numa_node_values() {
        assert_eq!(parse_numa_node("1\n"), Some(1));
        assert_eq!(parse_numa_node("-1\n"), None);
        assert_eq!(parse_numa_node(""), None);
        assert_eq!(parse_numa_node("x"), None);
    }

    #[test]
    fn finds_devices_by_vendor_and_class() {
        let tmp = tempfile::tempdir().unwrap();
        let dev = |bdf: &str, vendor: &str, class: &str, node: &str| {
            let d = tmp.path().join("bus/pci/devices").join(bdf);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("vendor"), format!("{vendor}\n")).unwrap();
            std::fs::write(d.join("class"), format!("{class}\n")).unwrap();
            std::fs::write(d.join("numa_node"), format!("{node}\n")).unwrap();
        };
        dev("0000:c1:00.0", "0x19e5", "0x120000", "3");
        dev("0000:01:00.0", "0x19e5", "0x120000", "0");
        dev("0000:02:00.0", "0x19e5", "0x020000", "0");
        dev("0000:03:00.0", "0x10de", "0x030200", "-1");
        assert_eq!(
            devices_of(tmp.path(), "0x19e5", "0x1200"),
            vec!["0000:01:00.0", "0000:c1:00.0"]
        );
        assert_eq!(numa_node(tmp.path(), "0000:C1:00.0"), Some(3));
        assert_eq!(numa_node(tmp.path(), "0000:03:00.0"), None);
        assert_eq!(numa_node(tmp.path(), "0000:ff:00.0"), None);
    }
}
