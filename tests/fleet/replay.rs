//! `chd serve --replay FILE`: a recorded matrix served as if measured, topology from the
//! file, failed rows as errors, nothing probed.

use crate::chd_process;

use std::path::Path;

use crate::chd_process::{promtool_check_metrics, Chd, Metrics};

#[test]
fn cluster_health_results_replay_with_their_findings() {
    let dir = tempfile::tempdir().unwrap();
    let file =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/replay/results-npu-node.json");
    let chd = Chd::serve(
        dir.path(),
        &[
            "--replay",
            file.to_str().unwrap(),
            "--interval",
            "1s",
            "--window-budget",
            "500ms",
        ],
    );
    let body = chd.scrape();
    let m = Metrics::parse(&body);
    let ratio = |d: &str| {
        m.value(
            "chd_h2d_device_ratio",
            &[
                ("device", d),
                ("size_bytes", "67108864"),
                ("direction", "h2d"),
            ],
        )
    };
    assert!(ratio("0") < 0.3, "{}", ratio("0"));
    assert!((0.95..1.05).contains(&ratio("1")));
    // Topology from the file: CPU 6 on NUMA node 1, in the ledger (by default no per-CPU
    // series: `exposition.cpu_series`, issue 28 part 4).
    assert!(m.find("chd_cpu_info", &[]).is_empty());
    let (status, _, ledger) = chd.get("/api/v1/calibration", None);
    assert_eq!(status, 200, "{ledger}");
    let ledger: serde_json::Value = serde_json::from_str(&ledger).unwrap();
    let node1 = ledger["node"]["numa_nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == 1)
        .expect("NUMA node 1");
    let cpus = chd::topology::cpulist::parse(node1["cpus"].as_str().unwrap()).unwrap();
    assert!(cpus.contains(&6), "{node1}");
    // The failed row is an error, not a zero.
    assert_eq!(
        m.value(
            "chd_probe_errors_total",
            &[("probe", "h2d"), ("device", "3"), ("reason", "recorded")]
        ),
        1.0
    );
    assert!(m
        .find(
            "chd_h2d_bandwidth_bytes_per_second",
            &[("cpu", "7"), ("device", "3"), ("size_bytes", "16777216")]
        )
        .is_empty());
    // The pair matrix: rank-0 CPU 6 is the slow one.
    for cpu in 0..8 {
        let r = m.value(
            "chd_pair_cpu_ratio",
            &[("pair", "0,3"), ("rank", "0"), ("cpu", &cpu.to_string())],
        );
        assert_eq!(r < 0.7, cpu == 6, "cpu {cpu}: {r}");
    }
    // Nothing is probed; ticks count as disabled.
    assert_eq!(
        m.value(
            "chd_probe_runs_total",
            &[("probe", "h2d"), ("result", "ok")]
        ),
        0.0
    );
    assert!(m.value("chd_idle_windows_total", &[("outcome", "disabled")]) >= 1.0);
    assert_eq!(m.value("chd_build_info", &[("backend", "replay")]), 1.0);
    promtool_check_metrics(&body);
    assert!(
        !dir.path().join("state.json").exists(),
        "a replay must not write state"
    );
}

/// `exposition.cells = "auto"` resolves on the recording's cells: above
/// `exposition.auto_cells_limit` the per-cell family goes, the aggregates stay, and the log
/// says why.
#[test]
fn auto_cells_turn_off_above_the_limit_in_a_replay() {
    let dir = tempfile::tempdir().unwrap();
    let file =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/replay/results-npu-node.json");
    let config = dir.path().join("chd.toml");
    std::fs::write(&config, "[exposition]\nauto_cells_limit = 10\n").unwrap();
    let chd = Chd::serve(
        dir.path(),
        &[
            "--replay",
            file.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
        ],
    );
    let m = Metrics::parse(&chd.scrape());
    assert!(m.find("chd_h2d_bandwidth_bytes_per_second", &[]).is_empty());
    assert!(!m
        .find(
            "chd_h2d_segment_bandwidth_bytes_per_second",
            &[("stat", "median")]
        )
        .is_empty());
    let log = chd.log();
    assert!(
        log.contains("per-cell series off: exposition.cells = auto and ")
            && log.contains(" cells > exposition.auto_cells_limit 10"),
        "{log}"
    );
    // The segments keep min, median and max only (the series budget).
    let stats: std::collections::BTreeSet<String> = m
        .find("chd_h2d_segment_bandwidth_bytes_per_second", &[])
        .iter()
        .map(|s| s.labels["stat"].clone())
        .collect();
    assert_eq!(
        stats.into_iter().collect::<Vec<_>>(),
        ["max", "median", "min"]
    );
}

#[test]
fn an_unreadable_recording_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("results.json");
    std::fs::write(&bad, "{\"metrics\": [{\"test\": \"core_h2d_matrix\"}]}").unwrap();
    let out = std::process::Command::new(chd_process::chd_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--replay"])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("replaying") && err.contains("no matrix cells") && err.contains("metrics[0]"),
        "{err}"
    );
}
