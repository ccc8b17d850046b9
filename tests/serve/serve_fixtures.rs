//! `chd serve` on fixture trees (`--sysfs-root`/`--procfs-root`): the real binary's scrape
//! carries the scrape-time collectors' values, exactly, and promtool accepts it; and the
//! whole first scrape of each collector tree matches its golden file in tests/golden/
//! (`CHD_UPDATE_GOLDEN=1 cargo test --test serve serve_fixtures::golden` rewrites them); a tree
//! that changes under a running chd keeps every scrape whole.

use crate::chd_process;
use crate::fake;
use crate::fixture_copy;
use crate::golden;

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::chd_process::{promtool_check_metrics, Chd, Metrics};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/collectors")
        .join(name)
}

fn serve_on(tree: &str, extra: &[&str]) -> (tempfile::TempDir, Chd) {
    chd_process::serve_collector_tree(tree, extra)
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

/// The tree changes under a running `chd serve` (issue 14): an HCA's driver unbinds, a GPU's
/// PCI function is removed, a NUMA node goes offline, a counter reads as garbage. Every
/// scrape stays whole: 200, promtool accepts it, every family of the first scrape is still
/// there, every collector succeeds; only the series of what went are gone and the garbage
/// is counted.
#[test]
fn a_tree_changing_under_chd_serve_keeps_every_scrape_whole() {
    let root = tempfile::tempdir().unwrap();
    fixture_copy::copy_tree(&fixture("roce-dual-rail"), root.path());
    let (sys, proc) = (root.path().join("sys"), root.path().join("proc"));
    let state = tempfile::tempdir().unwrap();
    let lib = fake::fake_runtime_path();
    let chd = Chd::serve_env(
        state.path(),
        &[
            "--sysfs-root",
            sys.to_str().unwrap(),
            "--procfs-root",
            proc.to_str().unwrap(),
            "--no-probe",
            "--backend",
            "cuda",
            "--cuda-runtime",
            lib,
            "--nvml",
            lib,
        ],
        &[
            ("CHD_FAKE_DEVICE_COUNT", "2"),
            ("CHD_FAKE_PCI_BUS_IDS", "0000:1a:00.0,0000:9b:00.0"),
        ],
    );
    let families = |body: &str| -> std::collections::BTreeSet<String> {
        body.lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap().to_string())
            .collect()
    };
    let first_body = chd.scrape();
    let first = Metrics::parse(&first_body);
    let errors =
        |m: &Metrics, c: &str| m.value("chd_collector_read_errors_total", &[("collector", c)]);

    std::fs::remove_file(sys.join("class/infiniband/mlx5_1")).unwrap();
    std::fs::remove_dir_all(sys.join("devices/pci0000:97/0000:97:02.0/0000:99:00.0/infiniband"))
        .unwrap();
    std::fs::remove_file(sys.join("bus/pci/devices/0000:9b:00.0")).unwrap();
    std::fs::remove_dir_all(sys.join("devices/pci0000:97/0000:97:03.0/0000:9b:00.0")).unwrap();
    std::fs::remove_dir_all(sys.join("devices/system/node/node7")).unwrap();
    std::fs::write(
        sys.join("devices/pci0000:16/0000:16:02.0/0000:18:00.0/infiniband/mlx5_0/ports/1/hw_counters/np_cnp_sent"),
        "garbage\n",
    )
    .unwrap();

    for _ in 0..2 {
        let (status, _, body) = chd.get("/metrics", None);
        assert_eq!(status, 200, "{body}");
        promtool_check_metrics(&body);
        assert_eq!(families(&body), families(&first_body));
        let m = Metrics::parse(&body);
        for c in ["rdma", "numa", "netdev", "pcie", "device"] {
            assert_eq!(
                m.value("chd_collector_success", &[("collector", c)]),
                1.0,
                "{c}"
            );
        }
        assert!(m
            .find("chd_rdma_port_info", &[("hca", "mlx5_1")])
            .is_empty());
        assert_eq!(m.find("chd_rdma_port_info", &[("hca", "mlx5_0")]).len(), 1);
        assert!(m
            .find("chd_netdev_bytes_total", &[("netdev", "eth3")])
            .is_empty());
        assert!(m
            .find("chd_numa_memory_bytes", &[("numa_node", "7")])
            .is_empty());
        assert!(!m
            .find("chd_numa_memory_bytes", &[("numa_node", "6")])
            .is_empty());
        assert!(m
            .find("chd_device_pcie_link_width", &[("device", "1")])
            .is_empty());
        assert!(!m
            .find("chd_device_pcie_link_width", &[("device", "0")])
            .is_empty());
        let hw = m.find("chd_rdma_hw_counters_total", &[("hca", "mlx5_0")]);
        assert!(!hw.is_empty() && hw.iter().all(|s| s.labels["counter"] != "np_cnp_sent"));
        // The device collector and the store's families do not read sysfs at scrape time.
        assert_eq!(
            m.find("chd_device_info", &[]).len(),
            first.find("chd_device_info", &[]).len()
        );
        assert_eq!(
            m.find("chd_device_utilization_ratio", &[]).len(),
            first.find("chd_device_utilization_ratio", &[]).len()
        );
    }
    let m = Metrics::parse(&chd.scrape());
    // Three scrapes after the change: the garbage counter each time (rdma), and the GPU
    // the runtime still reports but sysfs no longer has each time (pcie).
    assert_eq!(errors(&m, "rdma") - errors(&first, "rdma"), 3.0);
    assert_eq!(errors(&m, "pcie") - errors(&first, "pcie"), 3.0);
    assert_eq!(errors(&m, "numa"), errors(&first, "numa"));
    assert_eq!(errors(&m, "netdev"), errors(&first, "netdev"));
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

// ---- Golden scrapes (node_exporter's e2e-output.txt): the whole first scrape, reviewed in diffs.

/// The accelerators a golden run ties the fake CUDA runtime's devices to (`None`: the tree
/// has none, serve with the host backend).
fn golden_accelerators(tree: &str) -> Option<&'static str> {
    match tree {
        // GPU 0 with a degraded link and AER errors, GPU 1 healthy.
        "roce-dual-rail" => Some("0000:1a:00.0,0000:9b:00.0"),
        // Accelerator 0 with its link down; accelerator 1 not in sysfs.
        "odd" => Some("0000:3b:00.0,0000:ff:00.0"),
        _ => None,
    }
}

/// `chd serve --no-probe` on `tree`, scraped once over HTTP, in its golden form.
fn golden_scrape(tree: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let root = fixture(tree);
    let (sys, proc) = (root.join("sys"), root.join("proc"));
    let mut args = vec![
        "--sysfs-root",
        sys.to_str().unwrap(),
        "--procfs-root",
        proc.to_str().unwrap(),
        "--no-probe",
        // Explicit, so a changed default cannot add a second idle-window tick mid-test.
        "--interval",
        "1h",
    ];
    let mut env = Vec::new();
    let backend = match golden_accelerators(tree) {
        Some(ids) => {
            let lib = fake::fake_runtime_path();
            args.extend(["--backend", "cuda", "--cuda-runtime", lib, "--nvml", lib]);
            env.push(("CHD_FAKE_DEVICE_COUNT", "2"));
            env.push(("CHD_FAKE_PCI_BUS_IDS", ids));
            format!("cuda (the fake runtime: 2 devices at {ids})")
        }
        None => {
            args.extend(["--backend", "host"]);
            "host".to_string()
        }
    };
    let chd = Chd::serve_env(dir.path(), &args, &env);
    // The scheduler logs that probing is disabled just before it counts its first
    // (disabled) idle window; one scrape only, since the `odd` tree's read errors are
    // counted again on every scrape.
    chd.wait_for_log("probing disabled", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(200));
    let body = chd.scrape();
    promtool_check_metrics(&body);
    let header = [
        format!("Golden scrape: chd serve --no-probe on tests/fixtures/collectors/{tree}, backend {backend}."),
        "Generated by tests/serve/serve_fixtures.rs; see tests/golden/README.md. Normalised: the values".into(),
        format!(
            "of {} are NaN, the {} label is VERSION, samples of a family are sorted by their labels.",
            golden::MASKED_VALUES.join(", "),
            golden::MASKED_LABELS
                .iter()
                .map(|(f, l)| format!("{f} {l}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    ];
    golden::normalise_scrape(&header, &body)
}

#[test]
fn golden_roce_dual_rail_scrape() {
    golden::assert_golden("roce-dual-rail.prom", &golden_scrape("roce-dual-rail"));
}

#[test]
fn golden_infiniband_scrape() {
    golden::assert_golden("infiniband.prom", &golden_scrape("infiniband"));
}

#[test]
fn golden_odd_scrape() {
    golden::assert_golden("odd.prom", &golden_scrape("odd"));
}

/// Every collector tree has a golden test above (a new tree without one fails here).
#[test]
fn golden_covers_every_collector_tree() {
    let mut trees: Vec<String> = std::fs::read_dir(fixture(""))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    trees.sort();
    assert_eq!(trees, ["infiniband", "odd", "roce-dual-rail"]);
    for t in &trees {
        assert!(
            golden::golden_path(&format!("{t}.prom")).exists(),
            "tests/golden/{t}.prom is missing: run CHD_UPDATE_GOLDEN=1 cargo test --test serve serve_fixtures::golden"
        );
    }
}

/// The normalisation masks only the listed values and labels and reorders only within a
/// family: every other byte of the scrape survives.
#[test]
fn golden_normalisation_masks_only_variable_values() {
    let body = "\
# HELP chd_x_total X.
# TYPE chd_x_total counter
chd_x_total{device=\"1\"} 7
chd_x_total{device=\"0\"} 5
# HELP chd_collector_duration_seconds D.
# TYPE chd_collector_duration_seconds gauge
chd_collector_duration_seconds{collector=\"rdma\"} 0.0019
# HELP chd_h histogram
# TYPE chd_h histogram
chd_h_bucket{probe=\"pair\",le=\"0.5\"} 1
chd_h_bucket{probe=\"pair\",le=\"+Inf\"} 2
chd_h_sum{probe=\"pair\"} 0.75
chd_h_count{probe=\"pair\"} 2
chd_h_bucket{probe=\"h2d\",le=\"0.5\"} 0
chd_h_bucket{probe=\"h2d\",le=\"+Inf\"} 0
chd_h_sum{probe=\"h2d\"} 0.0
chd_h_count{probe=\"h2d\"} 0
# HELP chd_build_info B.
# TYPE chd_build_info gauge
chd_build_info{version=\"0.1.0\",backend=\"host\"} 1
";
    let want = "\
# head
# HELP chd_x_total X.
# TYPE chd_x_total counter
chd_x_total{device=\"0\"} 5
chd_x_total{device=\"1\"} 7
# HELP chd_collector_duration_seconds D.
# TYPE chd_collector_duration_seconds gauge
chd_collector_duration_seconds{collector=\"rdma\"} NaN
# HELP chd_h histogram
# TYPE chd_h histogram
chd_h_bucket{probe=\"h2d\",le=\"0.5\"} 0
chd_h_bucket{probe=\"h2d\",le=\"+Inf\"} 0
chd_h_sum{probe=\"h2d\"} 0.0
chd_h_count{probe=\"h2d\"} 0
chd_h_bucket{probe=\"pair\",le=\"0.5\"} 1
chd_h_bucket{probe=\"pair\",le=\"+Inf\"} 2
chd_h_sum{probe=\"pair\"} 0.75
chd_h_count{probe=\"pair\"} 2
# HELP chd_build_info B.
# TYPE chd_build_info gauge
chd_build_info{version=\"VERSION\",backend=\"host\"} 1
";
    assert_eq!(golden::normalise_scrape(&["head".into()], body), want);
}
