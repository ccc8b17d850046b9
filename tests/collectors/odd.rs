//! `odd`: every bad file costs only its own series and counts one read error.

use chd::collect::CollectorSettings;

use crate::scrape::{
    aer, netdev, odd_accelerators, pcie, port, port_counter, registry, scrape_with, Scrape,
};

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
