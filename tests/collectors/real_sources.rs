//! Sources that are not fixture trees: absent hardware (empty trees), a missing source, and
//! this host.

use chd::collect::{build, CollectorSettings};
use chd::topology::Roots;
use prometheus_client::registry::Registry;

use crate::exposition::promtool_check;
use crate::scrape::Scrape;

#[test]
fn absent_hardware_is_quiet_and_a_missing_source_fails_only_its_collector() {
    let empty = tempfile::tempdir().expect("tempdir");
    let roots = Roots {
        sysfs: empty.path().join("sys"),
        procfs: empty.path().join("proc"),
    };
    let mut registry = Registry::default();
    registry.register_collector(Box::new(build(
        &CollectorSettings::default(),
        &roots,
        vec![],
    )));
    let s = Scrape::of(&registry);
    for c in ["rdma", "numa", "pcie"] {
        assert_eq!(s.health(c), (1.0, 0.0), "{c}");
    }
    // /proc/net/dev is the netdev collector's one source: without it the collector fails,
    // the scrape does not.
    assert_eq!(s.health("netdev"), (0.0, 0.0));
    let samples: Vec<&String> = s
        .samples
        .keys()
        .filter(|k| !k.starts_with("chd_collector_"))
        .collect();
    assert!(samples.is_empty(), "{samples:?}");
}

/// Whatever this machine has (usually no RDMA, maybe no NUMA): every collector succeeds and
/// promtool accepts the scrape.
#[test]
fn this_host_scrapes_cleanly() {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(build(
        &CollectorSettings {
            netdev_all: true,
            ..Default::default()
        },
        &Roots::default(),
        vec![],
    )));
    let s = Scrape::of(&registry);
    for c in ["rdma", "numa", "netdev", "pcie"] {
        assert_eq!(s.health(c).0, 1.0, "{c}\n{}", s.text);
    }
    assert!(
        s.any("chd_netdev_bytes_total", "netdev=\"lo\""),
        "{}",
        s.text
    );
    promtool_check("this host", &s.text);
}
