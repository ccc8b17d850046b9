//! `chd serve`'s same-device copy cells on the fake CUDA runtime: one cell per device per
//! window, after the copy cells; a planted slow device (`CHD_FAKE_D2D_GBPS`) shows in
//! `chd_d2d_bandwidth_bytes_per_second` and in `chd_d2d_device_ratio` against the node's
//! median device; the cells survive a restart through the state file; `--d2d-size 0` turns
//! the probe off; nothing is held between windows.

use std::time::Duration;

use crate::chd_process::{promtool_check_metrics, Chd, Metrics};
use crate::fake::fake_runtime_path as lib;

const SIZE: &str = "4194304";

fn args(d2d_size: &str) -> Vec<&str> {
    vec![
        "--backend",
        "cuda",
        "--cuda-runtime",
        lib(),
        "--nvml",
        lib(),
        "--interval",
        "1s",
        "--window-budget",
        "800ms",
        "--cpu-busy-threshold",
        "1",
        "--sizes",
        "1",
        "--iterations",
        "2",
        "--d2d-size",
        d2d_size,
    ]
}

const ENV: [(&str, &str); 2] = [
    ("CHD_FAKE_DEVICE_COUNT", "4"),
    ("CHD_FAKE_D2D_GBPS", "400;1=100"),
];

fn d2d(m: &Metrics, name: &str, device: &str) -> Option<f64> {
    m.find(name, &[("device", device), ("size_bytes", SIZE)])
        .first()
        .map(|s| s.value)
}

fn all_devices(m: &Metrics) -> bool {
    ["0", "1", "2", "3"]
        .iter()
        .all(|d| d2d(m, "chd_d2d_device_ratio", d).is_some())
}

#[test]
fn a_slow_device_shows_in_the_d2d_bandwidth_and_ratio_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("fake-exit-report");
    let mut env = ENV.to_vec();
    env.push(("CHD_FAKE_EXIT_REPORT", report.to_str().unwrap()));
    let chd = Chd::serve_env(dir.path(), &args("4"), &env);
    let m = chd.wait_for(
        Duration::from_secs(60),
        "every device's d2d cell",
        all_devices,
    );
    for d in ["0", "2", "3"] {
        let bw = d2d(&m, "chd_d2d_bandwidth_bytes_per_second", d).unwrap();
        assert!((bw - 400e9).abs() < 0.01 * 400e9, "device {d}: {bw}");
        assert!((d2d(&m, "chd_d2d_device_ratio", d).unwrap() - 1.0).abs() < 0.01);
    }
    let slow = d2d(&m, "chd_d2d_bandwidth_bytes_per_second", "1").unwrap();
    assert!((slow - 100e9).abs() < 0.01 * 100e9, "{slow}");
    let ratio = d2d(&m, "chd_d2d_device_ratio", "1").unwrap();
    assert!((ratio - 0.25).abs() < 0.01, "{ratio}");
    // The coverage family counts every device's same-device cell (issue 24: it had no d2d
    // rows).
    let cells = |state| m.value("chd_probe_cells", &[("probe", "d2d"), ("state", state)]);
    assert_eq!(
        (cells("fresh"), cells("stale"), cells("unmeasured")),
        (4.0, 0.0, 0.0)
    );
    // A d2d window is a probe run of its own, and nothing stays held after the windows.
    assert!(
        m.value(
            "chd_probe_runs_total",
            &[("probe", "d2d"), ("result", "ok")]
        ) >= 1.0
    );
    assert!(
        m.value(
            "chd_probe_last_success_timestamp_seconds",
            &[("probe", "d2d")]
        ) > 0.0
    );
    promtool_check_metrics(&chd.scrape());
    let (status, log) = chd.terminate();
    assert!(status.success(), "{log}");
    // What chd still held in the fake when it exited: nothing.
    let held = std::fs::read_to_string(&report).expect("the fake's exit report");
    for line in ["live_device_allocations=0", "live_pinned_allocations=0"] {
        assert!(held.lines().any(|l| l == line), "{held}");
    }

    // Restarted with the probe off, the saved cells are still served.
    let chd = Chd::serve_env(dir.path(), &args("0"), &ENV);
    let m = Metrics::parse(&chd.scrape());
    assert!(all_devices(&m), "the d2d cells did not survive the restart");
    let ratio = d2d(&m, "chd_d2d_device_ratio", "1").unwrap();
    assert!((ratio - 0.25).abs() < 0.01, "{ratio}");
    std::thread::sleep(Duration::from_millis(1500));
    let m = Metrics::parse(&chd.scrape());
    assert_eq!(
        m.value(
            "chd_probe_runs_total",
            &[("probe", "d2d"), ("result", "ok")]
        ),
        0.0,
        "--d2d-size 0 still ran d2d cells"
    );
    let (status, log) = chd.terminate();
    assert!(status.success(), "{log}");
}

/// A device reading above what its memory can carry (the fake's NVML describes an H200's:
/// 6144 bits at 3201 MHz, 2.46 TB/s for a copy) is implausible: its value is still served,
/// with the limit beside it, but it has no ratio and is nobody's reference, so the others
/// stay typical and the verdict names no slow device.
#[test]
fn a_device_above_its_memory_limit_is_implausible_not_fast() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("CHD_FAKE_DEVICE_COUNT", "4"),
        ("CHD_FAKE_D2D_GBPS", "400;1=3000;2=150;3=150"),
    ];
    let chd = Chd::serve_env(dir.path(), &args("4"), &env);
    let m = chd.wait_for(
        Duration::from_secs(60),
        "the plausible devices' ratios and device 1's limit",
        |m| {
            ["0", "2", "3"]
                .iter()
                .all(|d| d2d(m, "chd_d2d_device_ratio", d).is_some())
                && d2d(m, "chd_d2d_implausible_limit_bytes_per_second", "1").is_some()
        },
    );
    let limit = d2d(&m, "chd_d2d_implausible_limit_bytes_per_second", "1").unwrap();
    assert!((limit - 2.458368e12).abs() < 1e6, "{limit}");
    let value = d2d(&m, "chd_d2d_bandwidth_bytes_per_second", "1").unwrap();
    assert!((value - 3000e9).abs() < 0.01 * 3000e9, "{value}");
    assert_eq!(d2d(&m, "chd_d2d_device_ratio", "1"), None, "no ratio");
    for d in ["0", "2", "3"] {
        assert_eq!(
            d2d(&m, "chd_d2d_implausible_limit_bytes_per_second", d),
            None,
            "device {d} is plausible"
        );
    }
    // The typical device is the median of 400, 150 and 150 (150), not pulled up by 3000 (a
    // median of 275 with it).
    let ratio = d2d(&m, "chd_d2d_device_ratio", "2").unwrap();
    assert!((ratio - 1.0).abs() < 0.01, "{ratio}");
    let ratio = d2d(&m, "chd_d2d_device_ratio", "0").unwrap();
    assert!((ratio - 400.0 / 150.0).abs() < 0.01, "{ratio}");
    promtool_check_metrics(&chd.scrape());
    let (status, log) = chd.terminate();
    assert!(status.success(), "{log}");
}
