//! sysfs and procfs changing under a running set of collectors (issue 14): a copy of
//! `roce-dual-rail` is changed between two scrapes of the same registry, as the kernel
//! changes the real trees (an HCA's driver unbinds, udev renames a netdev, a NUMA node goes
//! offline, a PCI function is removed, a value file reads as garbage). The series of what
//! went go, exactly those (or, for a rename, come back under the new name with the same
//! values); every other series is still there with its value; every collector still
//! succeeds; read errors count only what the kernel would call an error.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::symlink;

use chd::collect::CollectorSettings;
use chd::topology::Roots;
use prometheus_client::registry::Registry;

use crate::fixture_copy::copy_tree;
use crate::scrape::{roce_gpus, tree, Scrape};

/// Series whose values change from scrape to scrape whatever the tree says.
fn volatile(series: &str) -> bool {
    series.starts_with("chd_collector_duration_seconds")
        || series.starts_with("chd_collector_read_errors_total")
}

/// A mutable copy of `roce-dual-rail` and collectors built on it once, as `chd serve` does.
struct Live {
    dir: tempfile::TempDir,
    registry: Registry,
}

impl Live {
    fn new() -> Live {
        Live::with(&CollectorSettings::default())
    }

    fn with(settings: &CollectorSettings) -> Live {
        let dir = tempfile::tempdir().unwrap();
        copy_tree(&tree("roce-dual-rail"), dir.path());
        let roots = Roots {
            sysfs: dir.path().join("sys"),
            procfs: dir.path().join("proc"),
        };
        let mut registry = Registry::default();
        registry.register_collector(Box::new(chd::collect::build(settings, &roots, roce_gpus())));
        Live { dir, registry }
    }

    fn path(&self, relative: &str) -> std::path::PathBuf {
        self.dir.path().join(relative)
    }

    fn scrape(&self) -> Scrape {
        Scrape::of(&self.registry)
    }

    /// Replace `old` by `new` in a text file of the tree (which must contain it).
    fn edit(&self, relative: &str, old: &str, new: &str) {
        let path = self.path(relative);
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.contains(old), "{relative} has no {old:?}");
        fs::write(&path, text.replacen(old, new, 1)).unwrap();
    }
}

const HCA1_FUNCTION: &str = "sys/devices/pci0000:97/0000:97:02.0/0000:99:00.0";
const HCA0_FUNCTION: &str = "sys/devices/pci0000:16/0000:16:02.0/0000:18:00.0";
const GPU0_FUNCTION: &str = "sys/devices/pci0000:16/0000:16:03.0/0000:1a:00.0";
const GPU1_FUNCTION: &str = "sys/devices/pci0000:97/0000:97:03.0/0000:9b:00.0";
const COLLECTORS: [&str; 4] = ["rdma", "numa", "netdev", "pcie"];

/// What changed from `before` to `after`, the volatile series aside: (gone, new, changed).
fn diff(before: &Scrape, after: &Scrape) -> (Vec<String>, Vec<String>, Vec<String>) {
    let stable = |s: &Scrape| -> BTreeMap<String, String> {
        s.samples
            .iter()
            .filter(|(k, _)| !volatile(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let (b, a) = (stable(before), stable(after));
    let gone = b.keys().filter(|k| !a.contains_key(*k)).cloned().collect();
    let new = a.keys().filter(|k| !b.contains_key(*k)).cloned().collect();
    let changed = b
        .iter()
        .filter(|(k, v)| a.get(*k).is_some_and(|w| w != *v))
        .map(|(k, _)| k.clone())
        .collect();
    (gone, new, changed)
}

/// Every collector succeeded; the read errors each counted in `after` beyond `before`.
fn errors_added(before: &Scrape, after: &Scrape) -> BTreeMap<&'static str, f64> {
    COLLECTORS
        .iter()
        .map(|&c| {
            let (ok_before, errors_before) = before.health(c);
            let (ok, errors) = after.health(c);
            assert_eq!((ok_before, ok), (1.0, 1.0), "chd_collector_success of {c}");
            (c, errors - errors_before)
        })
        .collect()
}

fn no_errors() -> BTreeMap<&'static str, f64> {
    COLLECTORS.iter().map(|&c| (c, 0.0)).collect()
}

/// The series of `before` for which `of` holds, sorted.
fn series_of(before: &Scrape, of: impl Fn(&str) -> bool) -> Vec<String> {
    before
        .samples
        .keys()
        .filter(|k| !volatile(k) && of(k))
        .cloned()
        .collect()
}

#[test]
fn an_hca_removed_takes_its_ports_link_and_netdev_series_only() {
    let live = Live::new();
    let before = live.scrape();
    // The driver unbinds mlx5_1: its class link and infiniband/ directory go; the PCI
    // function and its netdev stay (eth3 is no longer behind an RDMA port).
    fs::remove_file(live.path("sys/class/infiniband/mlx5_1")).unwrap();
    fs::remove_dir_all(live.path(&format!("{HCA1_FUNCTION}/infiniband"))).unwrap();
    let after = live.scrape();

    let (gone, new, changed) = diff(&before, &after);
    let expected = series_of(&before, |k| {
        k.contains("hca=\"mlx5_1\"") || k.contains("device=\"mlx5_1\"") || k.contains("\"eth3\"")
    });
    assert!(expected.len() > 50, "{expected:?}");
    assert_eq!(gone, expected);
    assert_eq!((new, changed), (vec![], vec![]));
    assert_eq!(errors_added(&before, &after), no_errors());
    // The other rail is whole.
    assert_eq!(after.family("chd_rdma_port_info").len(), 1);
    assert!(after.any("chd_netdev_bytes_total", "netdev=\"eth0\""));
}

#[test]
fn a_renamed_netdev_is_exported_under_its_new_name_with_the_same_values() {
    let live = Live::new();
    let before = live.scrape();
    // udev renames eth0 (mlx5_0's port 1) to rdma0: sysfs directory, class link, /proc/net/dev.
    let net = format!("{HCA0_FUNCTION}/net");
    fs::rename(
        live.path(&format!("{net}/eth0")),
        live.path(&format!("{net}/rdma0")),
    )
    .unwrap();
    fs::remove_file(live.path("sys/class/net/eth0")).unwrap();
    symlink(
        "../../devices/pci0000:16/0000:16:02.0/0000:18:00.0/net/rdma0",
        live.path("sys/class/net/rdma0"),
    )
    .unwrap();
    live.edit("proc/net/dev", "  eth0:", " rdma0:");
    let after = live.scrape();

    let (gone, new, changed) = diff(&before, &after);
    let expected_gone = series_of(&before, |k| k.contains("netdev=\"eth0\""));
    assert!(expected_gone.len() > 10, "{expected_gone:?}");
    assert_eq!(gone, expected_gone);
    let mut renamed: Vec<String> = gone
        .iter()
        .map(|k| k.replace("netdev=\"eth0\"", "netdev=\"rdma0\""))
        .collect();
    renamed.sort();
    assert_eq!(new, renamed);
    assert!(changed.is_empty(), "{changed:?}");
    for (old, now) in gone.iter().zip(&new) {
        assert_eq!(before.raw(old), after.raw(now), "{now}");
    }
    assert_eq!(errors_added(&before, &after), no_errors());
}

#[test]
fn a_numa_node_or_pci_function_that_vanishes_takes_only_its_series() {
    let live = Live::new();
    let before = live.scrape();
    // Node 7 goes offline (memory hot-remove): its directory goes.
    fs::remove_dir_all(live.path("sys/devices/system/node/node7")).unwrap();
    // GPU 1's function is removed (echo 1 > remove): its bus link and directory go.
    fs::remove_file(live.path("sys/bus/pci/devices/0000:9b:00.0")).unwrap();
    fs::remove_dir_all(live.path(GPU1_FUNCTION)).unwrap();
    let after = live.scrape();

    let (gone, new, changed) = diff(&before, &after);
    let expected = series_of(&before, |k| {
        k.contains("numa_node=\"7\"") && k.starts_with("chd_numa_")
            || k.starts_with("chd_device_pcie_") && k.contains("device=\"1\"")
    });
    assert!(expected.iter().any(|k| k.contains("numa_node=\"7\"")));
    assert!(expected.iter().any(|k| k.contains("device=\"1\"")));
    assert_eq!(gone, expected);
    assert_eq!((new, changed), (vec![], vec![]));
    // A node gone is quiet; an accelerator the runtime still reports but sysfs no longer
    // has is one read error per scrape (the pcie collector's rule).
    let mut errors = no_errors();
    errors.insert("pcie", 1.0);
    assert_eq!(errors_added(&before, &after), errors);
}

#[test]
fn a_value_turned_to_garbage_costs_its_one_series_and_one_read_error() {
    let live = Live::new();
    let before = live.scrape();
    let port0 = format!("{HCA0_FUNCTION}/infiniband/mlx5_0/ports/1");
    let port1 = format!("{HCA1_FUNCTION}/infiniband/mlx5_1/ports/1");
    fs::write(
        live.path(&format!("{port0}/counters/port_xmit_data")),
        "garbage\n",
    )
    .unwrap();
    fs::write(live.path(&format!("{port1}/state")), "").unwrap();
    // Not even text.
    fs::write(
        live.path(&format!("{port0}/hw_counters/np_cnp_sent")),
        b"\xff\xfe1\n",
    )
    .unwrap();
    live.edit(
        "sys/devices/system/node/node3/numastat",
        "numa_hit 4000012",
        "numa_hit 40000x2",
    );
    live.edit("proc/net/dev", "  eth3: 24691357800", "  eth3: 2469135780Z");
    fs::write(
        live.path(&format!("{GPU0_FUNCTION}/current_link_width")),
        "x8\n",
    )
    .unwrap();
    let after = live.scrape();

    let (gone, new, changed) = diff(&before, &after);
    let mut expected = vec![
        "chd_rdma_port_data_transmitted_bytes_total{hca=\"mlx5_0\",port=\"1\"}".to_string(),
        "chd_rdma_port_state{hca=\"mlx5_1\",port=\"1\"}".to_string(),
        "chd_rdma_hw_counters_total{hca=\"mlx5_0\",port=\"1\",counter=\"np_cnp_sent\"}".to_string(),
        "chd_numa_events_total{numa_node=\"3\",event=\"numa_hit\"}".to_string(),
        "chd_netdev_bytes_total{netdev=\"eth3\",direction=\"receive\"}".to_string(),
        "chd_device_pcie_link_width{device=\"0\",state=\"current\"}".to_string(),
    ];
    expected.sort();
    assert_eq!(gone, expected);
    assert_eq!((new, changed), (vec![], vec![]));
    let expected_errors = COLLECTORS
        .iter()
        .map(|&c| (c, if c == "rdma" { 3.0 } else { 1.0 }))
        .collect();
    assert_eq!(errors_added(&before, &after), expected_errors);
    // Counted again at every scrape while the file stays bad.
    let again = live.scrape();
    assert_eq!(errors_added(&after, &again), expected_errors);
}

/// Linux allows any bytes but `/`, `:` and whitespace in a netdev name; one that is not
/// UTF-8 (a container runtime's random name) appears in /proc/net/dev. It cannot be a label
/// value: with every netdev selected it costs its own row and one read error, otherwise
/// nothing, and never the other interfaces' series.
#[test]
fn a_netdev_named_in_bytes_that_are_not_utf8_costs_only_its_row() {
    for (all, errors) in [(false, 0.0), (true, 1.0)] {
        let live = Live::with(&CollectorSettings {
            netdev_all: all,
            ..Default::default()
        });
        let before = live.scrape();
        let path = live.path("proc/net/dev");
        let mut text = fs::read(&path).unwrap();
        text.extend_from_slice(b" veth\xff\xfe: 1 2 0 0 0 0 0 0 3 4 0 0 0 0 0 0\n");
        fs::write(&path, text).unwrap();
        let after = live.scrape();
        let (gone, new, changed) = diff(&before, &after);
        assert_eq!(
            (gone, new, changed),
            (vec![], vec![], vec![]),
            "netdev_all {all}"
        );
        let mut expected = no_errors();
        expected.insert("netdev", errors);
        assert_eq!(errors_added(&before, &after), expected, "netdev_all {all}");
    }
}
