//! `roce-dual-rail`: ports, info, state, rate and counters of both rails, the NUMA map, the
//! degraded GPU link and its AER counts.

use regex::Regex;

use chd::collect::numa::MEMORY_KINDS;
use chd::collect::CollectorSettings;

use crate::scrape::{aer, pcie, port, port_counter, roce_gpus, scrape, scrape_with};

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
    assert_eq!(mem(0, "file_pages"), 16_120_268.0 * 1024.0);
    assert_eq!(s.family("chd_numa_events_total").len(), 8 * 6);

    // The kinds of one node: by default only MEMORY_KINDS (issue 28 part 4); with
    // `numa_memory_all` every kB row, snake case, no `Mem` prefix, no HugePages counts.
    let kind = Regex::new(r#"numa_node="5",kind="([a-z_]+)""#).unwrap();
    let kinds_of = |s: &crate::scrape::Scrape| -> Vec<String> {
        let mut kinds: Vec<String> = s
            .family("chd_numa_memory_bytes")
            .into_iter()
            .filter_map(|series| Some(kind.captures(series)?.get(1)?.as_str().to_string()))
            .collect();
        kinds.sort_unstable();
        kinds
    };
    let mut default_kinds = MEMORY_KINDS.map(String::from).to_vec();
    default_kinds.sort_unstable();
    assert_eq!(kinds_of(&s), default_kinds);
    assert_eq!(s.family("chd_numa_memory_bytes").len(), 8 * 12);
    let every = CollectorSettings {
        numa_memory_all: true,
        ..Default::default()
    };
    let s = scrape_with(&every, "roce-dual-rail", roce_gpus());
    let mem = |node: u32, kind: &str| {
        s.get(&format!(
            "chd_numa_memory_bytes{{numa_node=\"{node}\",kind=\"{kind}\"}}"
        ))
    };
    assert_eq!(mem(3, "active_file"), (4_063_116.0 + 3.0) * 1024.0);
    assert_eq!(mem(0, "k_reclaimable"), 923_364.0 * 1024.0);
    assert_eq!(mem(0, "nfs_unstable"), 0.0);
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
    expected.sort_unstable();
    assert_eq!(kinds_of(&s), expected);
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
