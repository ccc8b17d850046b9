//! Scrape-time collectors on fixture trees (`tests/fixtures/collectors/<tree>/{sys,proc}`,
//! described in that directory's README): exact exported values and labels, the error
//! accounting of the `odd` tree over two scrapes, filters and switches, and
//! `promtool check metrics` on every tree's output.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use prometheus_client::registry::Registry;
use regex::Regex;

use chd::collect::{build, CollectorSettings, PciDeviceRef};
use chd::exposition::{encode, Format};
use chd::topology::Roots;

fn tree(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/collectors")
        .join(name)
}

fn roots(name: &str) -> Roots {
    let dir = tree(name);
    Roots {
        sysfs: dir.join("sys"),
        procfs: dir.join("proc"),
    }
}

/// The accelerators of `roce-dual-rail`: GPU 0 with a degraded link, GPU 1 healthy.
fn roce_gpus() -> Vec<PciDeviceRef> {
    vec![
        PciDeviceRef {
            device: "0".into(),
            bdf: "0000:1a:00.0".into(),
        },
        // As CUDA and NVML spell it.
        PciDeviceRef {
            device: "1".into(),
            bdf: "00000000:9B:00.0".into(),
        },
    ]
}

/// Accelerator 0 of `odd` has its link down; accelerator 1 is not in sysfs at all.
fn odd_accelerators() -> Vec<PciDeviceRef> {
    vec![
        PciDeviceRef {
            device: "0".into(),
            bdf: "0000:3b:00.0".into(),
        },
        PciDeviceRef {
            device: "1".into(),
            bdf: "0000:ff:00.0".into(),
        },
    ]
}

fn registry(settings: &CollectorSettings, tree_name: &str, pci: Vec<PciDeviceRef>) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(build(settings, &roots(tree_name), pci)));
    registry
}

fn scrape_with(settings: &CollectorSettings, tree_name: &str, pci: Vec<PciDeviceRef>) -> Scrape {
    Scrape::of(&registry(settings, tree_name, pci))
}

fn scrape(tree_name: &str, pci: Vec<PciDeviceRef>) -> Scrape {
    scrape_with(&CollectorSettings::default(), tree_name, pci)
}

/// One scrape's text and its samples keyed by the series as written.
struct Scrape {
    text: String,
    samples: BTreeMap<String, String>,
}

impl Scrape {
    fn of(registry: &Registry) -> Scrape {
        let text = encode(registry, Format::Prometheus).expect("encode");
        let mut samples = BTreeMap::new();
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let (series, value) = line.rsplit_once(' ').expect("series value");
            let old = samples.insert(series.to_owned(), value.to_owned());
            assert!(old.is_none(), "duplicate series {series}");
        }
        Scrape { text, samples }
    }

    /// The value of exactly this series (labels in the order they are emitted).
    fn get(&self, series: &str) -> f64 {
        let raw = self.raw(series);
        raw.parse()
            .unwrap_or_else(|_| panic!("{series} has value {raw:?}"))
    }

    fn raw(&self, series: &str) -> &str {
        self.samples
            .get(series)
            .unwrap_or_else(|| panic!("no series {series} in\n{}", self.text))
    }

    fn has(&self, series: &str) -> bool {
        self.samples.contains_key(series)
    }

    /// Series of one family (`name{...}`).
    fn family(&self, name: &str) -> Vec<&str> {
        let prefix = format!("{name}{{");
        self.samples
            .keys()
            .filter(|k| k.starts_with(&prefix))
            .map(String::as_str)
            .collect()
    }

    /// Whether any series of `name` has a label matching `label`.
    fn any(&self, name: &str, label: &str) -> bool {
        self.family(name).iter().any(|s| s.contains(label))
    }

    fn health(&self, collector: &str) -> (f64, f64) {
        (
            self.get(&format!(
                "chd_collector_success{{collector=\"{collector}\"}}"
            )),
            self.get(&format!(
                "chd_collector_read_errors_total{{collector=\"{collector}\"}}"
            )),
        )
    }
}

fn port(metric: &str, hca: &str) -> String {
    format!("{metric}{{hca=\"{hca}\",port=\"1\"}}")
}

fn port_counter(metric: &str, hca: &str, counter: &str) -> String {
    format!("{metric}{{hca=\"{hca}\",port=\"1\",counter=\"{counter}\"}}")
}

fn pcie(metric: &str, device: &str, state: &str) -> String {
    format!("{metric}{{device=\"{device}\",state=\"{state}\"}}")
}

fn aer(device: &str, severity: &str) -> String {
    format!("chd_device_pcie_aer_errors_total{{device=\"{device}\",severity=\"{severity}\"}}")
}

fn netdev(metric: &str, dev: &str, direction: &str) -> String {
    format!("{metric}{{netdev=\"{dev}\",direction=\"{direction}\"}}")
}

fn netdev_error(dev: &str, direction: &str, kind: &str) -> String {
    format!("chd_netdev_errors_total{{netdev=\"{dev}\",direction=\"{direction}\",kind=\"{kind}\"}}")
}

#[test]
fn roce_dual_rail_ports_info_state_rate_and_counters() {
    let s = scrape("roce-dual-rail", roce_gpus());
    for (hca, netdev, node) in [("mlx5_0", "eth0", 0), ("mlx5_1", "eth3", 1)] {
        let info = format!(
            "chd_rdma_port_info{{hca=\"{hca}\",port=\"1\",netdev=\"{netdev}\",link_layer=\"Ethernet\",numa_node=\"{node}\"}}"
        );
        assert_eq!(s.get(&info), 1.0);
        assert_eq!(s.get(&port("chd_rdma_port_state", hca)), 4.0);
        assert_eq!(s.get(&port("chd_rdma_port_physical_state", hca)), 5.0);
        // "200 Gb/sec (4X HDR)": 200e9 bits / 8, written as an integer.
        assert_eq!(
            s.raw(&port("chd_rdma_port_rate_bytes_per_second", hca)),
            "25000000000"
        );
    }
    assert_eq!(s.family("chd_rdma_port_info").len(), 2);

    // port_xmit_data / port_rcv_data count 4-octet words: x 4, exact.
    let tx = "chd_rdma_port_data_transmitted_bytes_total";
    let rx = "chd_rdma_port_data_received_bytes_total";
    assert_eq!(s.raw(&port(tx, "mlx5_0")), "49382715604"); // 12345678901 x 4
    assert_eq!(s.raw(&port(rx, "mlx5_0")), "93827156048"); // 23456789012 x 4
    assert_eq!(s.raw(&port(tx, "mlx5_1")), "24691357800"); // 6172839450 x 4
    assert_eq!(s.raw(&port(rx, "mlx5_1")), "46913578024"); // 11728394506 x 4
    let txp = "chd_rdma_port_packets_transmitted_total";
    let rxp = "chd_rdma_port_packets_received_total";
    assert_eq!(s.get(&port(txp, "mlx5_0")), 987_654_321.0);
    assert_eq!(s.get(&port(rxp, "mlx5_0")), 876_543_210.0);
    assert_eq!(
        s.get(&port("chd_rdma_port_transmit_wait_total", "mlx5_0")),
        1500.0
    );

    let errors = "chd_rdma_port_errors_total";
    assert_eq!(
        s.get(&port_counter(errors, "mlx5_0", "port_rcv_errors")),
        2.0
    );
    assert_eq!(
        s.get(&port_counter(errors, "mlx5_0", "port_xmit_discards")),
        3.0
    );
    assert_eq!(s.get(&port_counter(errors, "mlx5_0", "link_downed")), 1.0);
    assert_eq!(s.get(&port_counter(errors, "mlx5_0", "symbol_error")), 0.0);
    assert_eq!(s.get(&port_counter(errors, "mlx5_1", "VL15_dropped")), 0.0);
    // 12 IB PortCounters error counters per port; traffic and uni/multicast are not errors.
    assert_eq!(s.family(errors).len(), 24);
    assert!(!s.any(errors, "port_xmit_data"));
    assert!(!s.any(errors, "unicast"));
    assert!(!s.any(errors, "port_xmit_wait"));

    let hw = "chd_rdma_hw_counters_total";
    for (counter, value) in [
        ("req_transport_retries_exceeded", 1.0),
        ("req_rnr_retries_exceeded", 0.0),
        ("rnr_nak_retry_err", 4.0),
        ("np_cnp_sent", 1520.0),
        ("rp_cnp_handled", 1432.0),
        ("np_ecn_marked_roce_packets", 1611.0),
        ("out_of_sequence", 7.0),
        ("packet_seq_err", 3.0),
        ("local_ack_timeout_err", 2.0),
        ("roce_adp_retrans", 9.0),
        ("rx_write_requests", 5_551_212.0),
    ] {
        assert_eq!(
            s.get(&port_counter(hw, "mlx5_0", counter)),
            value,
            "{counter}"
        );
    }
    assert_eq!(s.get(&port_counter(hw, "mlx5_1", "np_cnp_sent")), 760.0);
    // 31 files per port, `lifespan` (a setting) is not a counter.
    assert_eq!(s.family(hw).len(), 60);
    assert!(!s.any(hw, "lifespan"));

    assert_eq!(s.health("rdma"), (1.0, 0.0));
}

#[test]
fn roce_dual_rail_numa_map() {
    let s = scrape("roce-dual-rail", roce_gpus());
    let mem = |node: u32, kind: &str| {
        s.get(&format!(
            "chd_numa_memory_bytes{{numa_node=\"{node}\",kind=\"{kind}\"}}"
        ))
    };
    let event = |node: u32, event: &str| {
        s.get(&format!(
            "chd_numa_events_total{{numa_node=\"{node}\",event=\"{event}\"}}"
        ))
    };
    for node in 0..8u32 {
        let free_kib = 240_152_700.0 - f64::from(node) * 1e6;
        assert_eq!(mem(node, "total"), 263_783_792.0 * 1024.0);
        assert_eq!(mem(node, "free"), free_kib * 1024.0);
        assert_eq!(mem(node, "used"), (263_783_792.0 - free_kib) * 1024.0);
        assert_eq!(event(node, "numa_hit"), f64::from(node + 1) * 1_000_003.0);
        assert_eq!(event(node, "numa_miss"), f64::from(node) * 17.0);
        assert_eq!(event(node, "other_node"), f64::from(node) * 23.0);
        assert_eq!(event(node, "interleave_hit"), 3046.0 + f64::from(node));
    }
    assert_eq!(mem(3, "active_file"), (4_063_116.0 + 3.0) * 1024.0);
    assert_eq!(mem(0, "file_pages"), 16_120_268.0 * 1024.0);
    assert_eq!(mem(0, "k_reclaimable"), 923_364.0 * 1024.0);
    assert_eq!(mem(0, "nfs_unstable"), 0.0);
    assert_eq!(s.family("chd_numa_events_total").len(), 8 * 6);

    // The kinds of one node: every kB row, snake case, no `Mem` prefix, no HugePages counts.
    let kind = Regex::new(r#"numa_node="5",kind="([a-z_]+)""#).unwrap();
    let kinds: Vec<&str> = s
        .family("chd_numa_memory_bytes")
        .into_iter()
        .filter_map(|series| Some(kind.captures(series)?.get(1)?.as_str()))
        .collect();
    let mut expected = vec![
        "total",
        "free",
        "used",
        "swap_cached",
        "active",
        "inactive",
        "active_anon",
        "inactive_anon",
        "active_file",
        "inactive_file",
        "unevictable",
        "mlocked",
        "dirty",
        "writeback",
        "file_pages",
        "mapped",
        "anon_pages",
        "shmem",
        "kernel_stack",
        "page_tables",
        "sec_page_tables",
        "nfs_unstable",
        "bounce",
        "writeback_tmp",
        "k_reclaimable",
        "slab",
        "s_reclaimable",
        "s_unreclaim",
        "anon_huge_pages",
        "shmem_huge_pages",
        "shmem_pmd_mapped",
        "file_huge_pages",
        "file_pmd_mapped",
        "unaccepted",
    ];
    let mut got = kinds.clone();
    expected.sort_unstable();
    got.sort_unstable();
    assert_eq!(got, expected);
    assert!(!s.any("chd_numa_memory_bytes", "huge_pages_total"));
    assert_eq!(s.health("numa"), (1.0, 0.0));
}

#[test]
fn roce_dual_rail_degraded_gpu_link_and_aer() {
    let s = scrape("roce-dual-rail", roce_gpus());
    let width = "chd_device_pcie_link_width";
    let speed = "chd_device_pcie_link_speed_transfers_per_second";
    // GPU 0: a Gen5 x16 device trained at x8.
    assert_eq!(s.get(&pcie(width, "0", "current")), 8.0);
    assert_eq!(s.get(&pcie(width, "0", "max")), 16.0);
    assert_eq!(s.get(&pcie(speed, "0", "current")), 3.2e10);
    assert_eq!(s.get(&pcie(speed, "0", "max")), 3.2e10);
    assert_eq!(s.raw(&pcie(speed, "0", "current")), "32000000000");
    assert_eq!(s.get(&aer("0", "correctable")), 5.0);
    assert_eq!(s.get(&aer("0", "nonfatal")), 1.0);
    assert_eq!(s.get(&aer("0", "fatal")), 0.0);
    assert_eq!(s.get(&pcie(width, "1", "current")), 16.0);
    // HCAs are covered too, labelled by HCA name.
    for hca in ["mlx5_0", "mlx5_1"] {
        assert_eq!(s.get(&pcie(width, hca, "current")), 16.0);
        assert_eq!(s.get(&pcie(speed, hca, "max")), 3.2e10);
        assert_eq!(s.get(&aer(hca, "correctable")), 0.0);
    }
    assert_eq!(s.family(width).len(), 8);
    assert_eq!(s.family("chd_device_pcie_aer_errors_total").len(), 12);
    assert_eq!(s.health("pcie"), (1.0, 0.0));
}

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

#[test]
fn infiniband_prefers_64_bit_extended_counters() {
    let s = scrape("infiniband", vec![]);
    assert_eq!(
        s.get("chd_rdma_port_info{hca=\"mlx5_0\",port=\"1\",netdev=\"ib0\",link_layer=\"InfiniBand\",numa_node=\"1\"}"),
        1.0
    );
    // "400 Gb/sec (4X NDR)"
    assert_eq!(
        s.get(&port("chd_rdma_port_rate_bytes_per_second", "mlx5_0")),
        5e10
    );
    // counters/ holds saturated 32-bit values (4294967295); counters_ext/ wins.
    let tx = "chd_rdma_port_data_transmitted_bytes_total";
    let rx = "chd_rdma_port_data_received_bytes_total";
    assert_eq!(s.raw(&port(tx, "mlx5_0")), "395061728436"); // 98765432109 x 4
    assert_eq!(s.raw(&port(rx, "mlx5_0")), "350617284392"); // 87654321098 x 4
    assert_eq!(
        s.get(&port("chd_rdma_port_packets_transmitted_total", "mlx5_0")),
        1_234_567_890.0
    );
    assert_eq!(
        s.get(&port("chd_rdma_port_packets_received_total", "mlx5_0")),
        1_134_567_890.0
    );
    // No ext file for xmit_wait: the counters/ one.
    assert_eq!(
        s.get(&port("chd_rdma_port_transmit_wait_total", "mlx5_0")),
        77.0
    );
    assert_eq!(s.family(tx).len(), 1);
    assert_eq!(
        s.get(&port_counter(
            "chd_rdma_hw_counters_total",
            "mlx5_0",
            "rx_write_requests"
        )),
        31_415_926.0
    );
    // The IPoIB parent, not its child partition, and not the Ethernet management port.
    let bytes = "chd_netdev_bytes_total";
    assert_eq!(s.family(bytes).len(), 2);
    assert_eq!(s.get(&netdev(bytes, "ib0", "receive")), 395_061_728_436.0);
    assert_eq!(s.family("chd_numa_events_total").len(), 2 * 6);
    for c in ["rdma", "numa", "netdev", "pcie"] {
        assert_eq!(s.health(c), (1.0, 0.0), "{c}");
    }
}

#[test]
fn odd_tree_costs_only_the_bad_series_and_counts_every_one() {
    let registry = registry(&CollectorSettings::default(), "odd", odd_accelerators());
    let s = Scrape::of(&registry);

    // rdma: phys_state empty, rate unreadable (dangling link, as EINVAL would be),
    // port_xmit_data "N/A (no PMA)", port_rcv_data "0x1f3a", port_rcv_errors a directory,
    // symbol_error dangling, port_xmit_discards empty, hw np_cnp_sent "-1" = 8.
    // numa: node0 numastat "numa_miss N/A", node1 without meminfo = 2.
    // netdev: ens1f0np0 transmit bytes "12a4000", eth1 truncated row = 2.
    // pcie: accelerator 1 missing, accelerator 0 aer_dev_correctable "N/A" and
    // aer_dev_nonfatal without its TOTAL row = 3.
    let expected = [("rdma", 8.0), ("numa", 2.0), ("netdev", 2.0), ("pcie", 3.0)];
    for (collector, errors) in expected {
        assert_eq!(s.health(collector), (1.0, errors), "{collector}");
    }
    let again = Scrape::of(&registry);
    for (collector, errors) in expected {
        assert_eq!(again.health(collector), (1.0, 2.0 * errors), "{collector}");
    }

    // mlx5_0 keeps every series that could be read.
    let hca = "mlx5_0";
    assert_eq!(s.get(&port("chd_rdma_port_state", hca)), 4.0);
    assert!(!s.has(&port("chd_rdma_port_physical_state", hca)));
    assert!(!s.has(&port("chd_rdma_port_rate_bytes_per_second", hca)));
    assert!(!s.has(&port("chd_rdma_port_data_transmitted_bytes_total", hca)));
    assert!(!s.has(&port("chd_rdma_port_data_received_bytes_total", hca)));
    assert_eq!(
        s.get(&port("chd_rdma_port_packets_transmitted_total", hca)),
        1000.0
    );
    assert_eq!(s.get(&port("chd_rdma_port_transmit_wait_total", hca)), 42.0);
    let errors = "chd_rdma_port_errors_total";
    assert_eq!(
        s.raw(&port_counter(errors, hca, "link_downed")),
        "18446744073709551615"
    );
    assert_eq!(s.family(errors).len(), 1);
    let hw = "chd_rdma_hw_counters_total";
    assert_eq!(s.get(&port_counter(hw, hca, "out_of_sequence")), 3.0);
    assert_eq!(s.get(&port_counter(hw, hca, "rp_cnp_handled")), 5.0);
    assert!(!s.has(&port_counter(hw, hca, "np_cnp_sent")));
    // The uplink, not the VF representor.
    assert_eq!(
        s.get("chd_rdma_port_info{hca=\"mlx5_0\",port=\"1\",netdev=\"ens1f0np0\",link_layer=\"Ethernet\",numa_node=\"0\"}"),
        1.0
    );

    // irdma: no counters/ (quiet), hw_counters exported, numa_node -1 -> "".
    assert_eq!(
        s.get("chd_rdma_port_info{hca=\"irdma0\",port=\"1\",netdev=\"ens801f0\",link_layer=\"Ethernet\",numa_node=\"\"}"),
        1.0
    );
    assert_eq!(s.get(&port_counter(hw, "irdma0", "cnpSent")), 8.0);
    assert_eq!(
        s.get(&port("chd_rdma_port_rate_bytes_per_second", "irdma0")),
        12.5e9
    );
    assert!(!s.any(errors, "irdma0"));
    assert!(!s.has(&port("chd_rdma_port_packets_transmitted_total", "irdma0")));

    // rxe: netdev from `parent`, no PCI device.
    assert_eq!(
        s.get("chd_rdma_port_info{hca=\"rxe0\",port=\"1\",netdev=\"eth1\",link_layer=\"Ethernet\",numa_node=\"\"}"),
        1.0
    );
    assert_eq!(
        s.get(&port("chd_rdma_port_rate_bytes_per_second", "rxe0")),
        312_500_000.0
    );
    assert_eq!(s.get(&port_counter(hw, "rxe0", "retry_exceeded_err")), 1.0);
    assert!(!s.any("chd_device_pcie_link_width", "rxe0"));

    // numa: the good rows of node 0 and the numastat of node 1 survive.
    assert_eq!(
        s.get("chd_numa_events_total{numa_node=\"0\",event=\"numa_hit\"}"),
        1_000_003.0
    );
    assert!(!s.has("chd_numa_events_total{numa_node=\"0\",event=\"numa_miss\"}"));
    assert_eq!(
        s.get("chd_numa_events_total{numa_node=\"1\",event=\"numa_miss\"}"),
        17.0
    );
    assert!(s.has("chd_numa_memory_bytes{numa_node=\"0\",kind=\"total\"}"));
    assert!(!s.any("chd_numa_memory_bytes", "numa_node=\"1\""));

    // netdev: behind RDMA ports = ens801f0, ens1f0np0, eth1 (rxe); only the good values.
    let bytes = "chd_netdev_bytes_total";
    assert_eq!(s.get(&netdev(bytes, "ens1f0np0", "receive")), 3_000_000.0);
    assert!(!s.has(&netdev(bytes, "ens1f0np0", "transmit")));
    assert_eq!(
        s.get(&netdev("chd_netdev_packets_total", "ens1f0np0", "transmit")),
        4000.0
    );
    assert_eq!(s.get(&netdev(bytes, "ens801f0", "transmit")), 2_000_000.0);
    assert!(!s.any(bytes, "eth1"));
    assert!(!s.any(bytes, "ens1f0npf0vf0"));

    // pcie: accelerator 0's link is down: width 0, no current speed, no error for it.
    let width = "chd_device_pcie_link_width";
    let speed = "chd_device_pcie_link_speed_transfers_per_second";
    assert_eq!(s.get(&pcie(width, "0", "current")), 0.0);
    assert!(!s.has(&pcie(speed, "0", "current")));
    assert_eq!(s.get(&pcie(speed, "0", "max")), 1.6e10);
    assert_eq!(s.get(&aer("0", "fatal")), 0.0);
    assert!(!s.has(&aer("0", "correctable")));
    assert!(!s.has(&aer("0", "nonfatal")));
    assert!(!s.any(width, "device=\"1\""));
    // irdma0's function has no AER capability: link metrics, no AER series, no error.
    assert_eq!(s.get(&pcie(width, "irdma0", "current")), 16.0);
    assert!(!s.any("chd_device_pcie_aer_errors_total", "irdma0"));
    assert_eq!(s.get(&aer("mlx5_0", "correctable")), 0.0);
}

#[test]
fn odd_tree_with_every_netdev() {
    let all = CollectorSettings {
        netdev_all: true,
        ..Default::default()
    };
    let s = scrape_with(&all, "odd", odd_accelerators());
    // The representor is exported now; the same two bad values are counted.
    assert!(s.any("chd_netdev_bytes_total", "ens1f0npf0vf0"));
    assert_eq!(s.health("netdev"), (1.0, 2.0));
}

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

#[test]
fn counters_are_named_once_with_total_in_both_formats() {
    let s = scrape("roce-dual-rail", roce_gpus());
    assert!(s
        .text
        .contains("# TYPE chd_rdma_port_errors_total counter\n"));
    assert!(s
        .text
        .contains("# TYPE chd_collector_read_errors_total counter\n"));
    assert!(s.text.contains("# TYPE chd_numa_memory_bytes gauge\n"));
    assert!(!s.text.contains("_total_total"));
    let om = encode(
        &registry(&CollectorSettings::default(), "roce-dual-rail", roce_gpus()),
        Format::OpenMetrics,
    )
    .unwrap();
    assert!(om.contains("# TYPE chd_rdma_port_errors counter\n"), "{om}");
    assert!(om.contains(
        "chd_rdma_port_errors_total{hca=\"mlx5_0\",port=\"1\",counter=\"link_downed\"} 1\n"
    ));
    assert!(om.ends_with("# EOF\n"));
}

/// `promtool check metrics` on a scrape; panics (never skips) without promtool.
fn promtool_check(name: &str, text: &str) {
    let promtool = std::env::var_os("PROMTOOL").unwrap_or_else(|| "promtool".into());
    let mut child = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {promtool:?} ({e}): install Debian's `prometheus` package \
                 (it brings /usr/bin/promtool) or set PROMTOOL to its path"
            )
        });
    child
        .stdin
        .take()
        .expect("stdin piped")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("promtool output");
    assert!(
        out.status.success(),
        "promtool check metrics rejected the {name} scrape:\n{}{}\n--- scrape ---\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn promtool_accepts_every_tree() {
    promtool_check(
        "roce-dual-rail",
        &scrape("roce-dual-rail", roce_gpus()).text,
    );
    let all = CollectorSettings {
        netdev_all: true,
        ..Default::default()
    };
    promtool_check(
        "roce-dual-rail (netdev_all)",
        &scrape_with(&all, "roce-dual-rail", roce_gpus()).text,
    );
    promtool_check("infiniband", &scrape("infiniband", vec![]).text);
    promtool_check("odd", &scrape("odd", odd_accelerators()).text);
}

/// Families the collectors emit that docs/METRICS.md does not list (none: every one is in
/// the contract).
const NOT_IN_CONTRACT: [&str; 0] = [];

/// Every `chd_...` name of METRICS.md, with the table's `A` / `..._tail` shorthand expanded
/// (`..._received_bytes_total` after `chd_rdma_port_data_transmitted_bytes_total`).
fn contract_names(markdown: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for line in markdown.lines() {
        let mut previous: Option<String> = None;
        for (i, token) in line.split('`').enumerate() {
            if i % 2 == 0 {
                continue;
            }
            if token.starts_with("chd_") {
                names.insert(token.to_owned());
                previous = Some(token.to_owned());
            } else if let (Some(tail), Some(prev)) = (token.strip_prefix("..._"), &previous) {
                let keep = prev.split('_').count() - tail.split('_').count();
                let head: Vec<&str> = prev.split('_').take(keep).collect();
                names.insert(format!("{}_{tail}", head.join("_")));
            }
        }
    }
    names
}

#[test]
fn every_family_is_in_the_metric_contract_or_a_listed_addition() {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/METRICS.md"))
            .expect("docs/METRICS.md");
    let contract = contract_names(&text);
    let mut scraped = scrape("roce-dual-rail", roce_gpus()).text;
    scraped.push_str(&scrape("odd", odd_accelerators()).text);
    let families: std::collections::BTreeSet<&str> = scraped
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(families.len() >= 20, "{families:?}");
    for family in families {
        assert!(
            contract.contains(family) || NOT_IN_CONTRACT.contains(&family),
            "{family} is neither in docs/METRICS.md nor in NOT_IN_CONTRACT"
        );
    }
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
