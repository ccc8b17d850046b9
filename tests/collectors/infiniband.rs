//! `infiniband`: the 64-bit extended counters win over saturated 32-bit ones.

use crate::scrape::{netdev, port, port_counter, scrape};

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
