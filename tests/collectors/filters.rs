//! Which series the settings select: the netdev default (the RDMA netdevs), `netdev_all` and
//! the netdev filters, HCA filters, disabled collectors.

use chd::collect::CollectorSettings;
use regex::Regex;

use crate::scrape::{netdev, netdev_error, roce_gpus, scrape, scrape_with};

#[test]
fn netdev_defaults_to_the_rdma_netdevs() {
    let s = scrape("roce-dual-rail", roce_gpus());
    let bytes = "chd_netdev_bytes_total";
    assert_eq!(s.get(&netdev(bytes, "eth0", "receive")), 49_382_715_604.0);
    assert_eq!(s.get(&netdev(bytes, "eth0", "transmit")), 93_827_156_048.0);
    assert_eq!(s.get(&netdev(bytes, "eth3", "receive")), 24_691_357_800.0);
    let packets = "chd_netdev_packets_total";
    assert_eq!(s.get(&netdev(packets, "eth0", "receive")), 987_654_321.0);
    assert_eq!(s.get(&netdev(packets, "eth3", "transmit")), 438_271_605.0);
    assert_eq!(s.get(&netdev_error("eth0", "receive", "errs")), 1.0);
    assert_eq!(s.get(&netdev_error("eth0", "receive", "drop")), 2.0);
    assert_eq!(s.get(&netdev_error("eth0", "receive", "frame")), 0.0);
    assert_eq!(s.get(&netdev_error("eth0", "transmit", "drop")), 4.0);
    assert_eq!(s.get(&netdev_error("eth0", "transmit", "carrier")), 0.0);
    assert!(!s.has(&netdev_error("eth0", "receive", "carrier")));
    assert!(!s.any("chd_netdev_errors_total", "compressed"));
    assert!(!s.any("chd_netdev_errors_total", "multicast"));
    // 2 x (2 bytes + 2 packets + 4 receive + 5 transmit error kinds)
    let all: usize = [bytes, packets, "chd_netdev_errors_total"]
        .iter()
        .map(|f| s.family(f).len())
        .sum();
    assert_eq!(all, 26);
    for other in ["lo", "eth1", "docker0"] {
        assert!(!s.any(bytes, &format!("netdev=\"{other}\"")), "{other}");
    }
    assert_eq!(s.health("netdev"), (1.0, 0.0));
}

#[test]
fn netdev_all_switch_and_netdev_filters() {
    let all = CollectorSettings {
        netdev_all: true,
        ..Default::default()
    };
    let s = scrape_with(&all, "roce-dual-rail", roce_gpus());
    let bytes = "chd_netdev_bytes_total";
    assert_eq!(s.family(bytes).len(), 10);
    assert_eq!(s.get(&netdev(bytes, "eth1", "receive")), 1_073_741_824.0);
    assert_eq!(s.get(&netdev_error("eth1", "receive", "drop")), 7.0);
    assert_eq!(s.get(&netdev_error("docker0", "transmit", "drop")), 3.0);
    assert_eq!(s.get(&netdev(bytes, "lo", "transmit")), 8_675_309.0);

    let filtered = CollectorSettings {
        netdev_all: true,
        netdev_include: Some(Regex::new("^eth").unwrap()),
        netdev_exclude: Some(Regex::new("^eth3$").unwrap()),
        ..Default::default()
    };
    let s = scrape_with(&filtered, "roce-dual-rail", roce_gpus());
    let names: Vec<&str> = s.family(bytes);
    assert_eq!(
        names,
        [
            "chd_netdev_bytes_total{netdev=\"eth0\",direction=\"receive\"}",
            "chd_netdev_bytes_total{netdev=\"eth0\",direction=\"transmit\"}",
            "chd_netdev_bytes_total{netdev=\"eth1\",direction=\"receive\"}",
            "chd_netdev_bytes_total{netdev=\"eth1\",direction=\"transmit\"}",
        ]
    );
}

#[test]
fn hca_filters_apply_to_rdma_pcie_and_the_netdev_selection() {
    let only_rail0 = CollectorSettings {
        hca_exclude: Some(Regex::new("^mlx5_1$").unwrap()),
        ..Default::default()
    };
    let s = scrape_with(&only_rail0, "roce-dual-rail", roce_gpus());
    assert_eq!(s.family("chd_rdma_port_info").len(), 1);
    assert!(!s.any("chd_rdma_hw_counters_total", "mlx5_1"));
    assert!(!s.any("chd_device_pcie_link_width", "mlx5_1"));
    assert!(s.any("chd_device_pcie_link_width", "device=\"mlx5_0\""));
    // Accelerators are not HCAs: the HCA filter leaves them alone.
    assert!(s.any("chd_device_pcie_link_width", "device=\"1\""));
    assert!(!s.any("chd_netdev_bytes_total", "eth3"));
    assert!(s.any("chd_netdev_bytes_total", "eth0"));

    let include = CollectorSettings {
        hca_include: Some(Regex::new("mlx5_1").unwrap()),
        ..Default::default()
    };
    let s = scrape_with(&include, "roce-dual-rail", roce_gpus());
    let info: Vec<&str> = s.family("chd_rdma_port_info");
    assert_eq!(
        info,
        ["chd_rdma_port_info{hca=\"mlx5_1\",port=\"1\",netdev=\"eth3\",link_layer=\"Ethernet\",numa_node=\"1\"}"]
    );
}

#[test]
fn disabled_collectors_emit_nothing() {
    let mut settings = CollectorSettings::default();
    for name in ["rdma", "numa"] {
        assert!(settings.set_enabled(name, false), "{name}");
    }
    let s = scrape_with(&settings, "roce-dual-rail", roce_gpus());
    assert!(!s.text.contains("chd_rdma_"));
    assert!(!s.text.contains("chd_numa_"));
    assert!(!s.text.contains("collector=\"rdma\""));
    assert!(!s.text.contains("collector=\"numa\""));
    // netdev still finds the RDMA netdevs without the rdma collector.
    assert!(s.any("chd_netdev_bytes_total", "eth0"));
    assert_eq!(s.health("pcie"), (1.0, 0.0));
}
