//! `chd serve` on fixture trees (`--sysfs-root`/`--procfs-root`): the real binary's scrape
//! carries the scrape-time collectors' values, exactly, and promtool accepts it.

#[path = "support/chd_process.rs"]
mod chd_process;

use std::path::{Path, PathBuf};

use chd_process::{promtool_check_metrics, Chd, Metrics};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/collectors")
        .join(name)
}

fn serve_on(tree: &str, extra: &[&str]) -> (tempfile::TempDir, Chd) {
    let dir = tempfile::tempdir().unwrap();
    let root = fixture(tree);
    let sys = root.join("sys");
    let proc = root.join("proc");
    let mut args = vec![
        "--sysfs-root",
        sys.to_str().unwrap(),
        "--procfs-root",
        proc.to_str().unwrap(),
        "--no-probe",
        "--backend",
        "host",
    ];
    args.extend_from_slice(extra);
    let chd = Chd::serve(dir.path(), &args);
    (dir, chd)
}

#[test]
fn dual_rail_roce_node_is_exported_exactly() {
    let (_dir, chd) = serve_on("roce-dual-rail", &[]);
    let body = chd.scrape();
    let m = Metrics::parse(&body);
    let port = |hca: &'static str| [("hca", hca), ("port", "1")];
    // port_xmit_data counts 4-octet words: 12345678901 x 4.
    assert_eq!(
        m.value(
            "chd_rdma_port_data_transmitted_bytes_total",
            &port("mlx5_0")
        ),
        49_382_715_604.0
    );
    assert_eq!(
        m.value("chd_rdma_port_rate_bytes_per_second", &port("mlx5_0")),
        25e9
    );
    assert_eq!(m.value("chd_rdma_port_state", &port("mlx5_1")), 4.0);
    let info = m.find("chd_rdma_port_info", &[("hca", "mlx5_1")]);
    assert_eq!(info.len(), 1);
    assert_eq!(info[0].labels["netdev"], "eth3");
    assert_eq!(info[0].labels["numa_node"], "1");
    assert_eq!(
        m.value(
            "chd_rdma_hw_counters_total",
            &[
                ("hca", "mlx5_0"),
                ("port", "1"),
                ("counter", "req_transport_retries_exceeded")
            ]
        ),
        1.0
    );
    assert_eq!(
        m.find("chd_numa_memory_bytes", &[("kind", "total")]).len(),
        8
    );
    for c in ["rdma", "numa", "netdev", "pcie", "device"] {
        assert_eq!(
            m.value("chd_collector_success", &[("collector", c)]),
            1.0,
            "{c}"
        );
    }
    assert_eq!(
        m.value("chd_collector_read_errors_total", &[("collector", "rdma")]),
        0.0
    );
    promtool_check_metrics(&body);
}

#[test]
fn odd_files_cost_series_not_the_scrape() {
    let (_dir, chd) = serve_on("odd", &[]);
    let first = Metrics::parse(&chd.scrape());
    let errors = first.value("chd_collector_read_errors_total", &[("collector", "rdma")]);
    assert!(errors > 0.0);
    assert_eq!(
        first.value("chd_collector_success", &[("collector", "rdma")]),
        1.0
    );
    // Cumulative: a second scrape counts the same bad files again.
    let body = chd.scrape();
    let second = Metrics::parse(&body);
    assert_eq!(
        second.value("chd_collector_read_errors_total", &[("collector", "rdma")]),
        2.0 * errors
    );
    promtool_check_metrics(&body);
}

#[test]
fn collectors_switch_off_by_flag() {
    let (_dir, chd) = serve_on(
        "roce-dual-rail",
        &["--no-collector.rdma", "--no-collector.netdev"],
    );
    let m = Metrics::parse(&chd.scrape());
    assert!(m.find("chd_rdma_port_state", &[]).is_empty());
    assert!(m
        .find("chd_collector_success", &[("collector", "rdma")])
        .is_empty());
    assert!(m
        .find("chd_collector_success", &[("collector", "netdev")])
        .is_empty());
    assert_eq!(
        m.value("chd_collector_success", &[("collector", "numa")]),
        1.0
    );
}
