//! A copy that never returns (issue 25, part 2). The fake runtime's devices 1 and 3 hang
//! (`hang_devices=1,3` in its control file: their copies are enqueued and never complete).
//! Every copy cell waits under `probe.cell_timeout` (300 ms here): the first cell of each hung
//! device is a `timeout` error, its memory is kept (never freed under the DMA: the fake
//! refuses and counts such a free, and counts none) and exported as leaked, the device is
//! quarantined (exported; no more cells, so no more timeouts), and the window goes on: windows
//! keep ending on time, devices 0 and 2 keep being measured (copy, same-device and peer copy
//! cells), the exporter answers, the verdict fails naming both devices, the state is saved.
//! Device 3 coming back is measured again and its memory freed; SIGTERM with device 1 still
//! hung exits within 2 s.

use crate::fake;

use std::path::Path;
use std::time::{Duration, Instant};

use crate::chd_process::{Chd, Metrics};

fn args(backend: &str, lib: &str) -> Vec<String> {
    let mut args: Vec<String> = [
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
        "--cell-timeout",
        "300ms",
        "--d2d-size",
        "1",
        "--p2p-size",
        "1",
        "--verdict-confirm-windows",
        "1",
        "--backend",
        backend,
    ]
    .map(String::from)
    .to_vec();
    match backend {
        "cuda" => args.extend(["--cuda-runtime", lib, "--nvml", lib].map(String::from)),
        _ => args.extend(["--acl-runtime", lib].map(String::from)),
    }
    args
}

fn quarantined(m: &Metrics, device: &str) -> bool {
    !m.find("chd_device_quarantined", &[("device", device)])
        .is_empty()
}

fn leaked(m: &Metrics, memory: &str) -> f64 {
    m.value("chd_leaked_memory_bytes", &[("memory", memory)])
}

/// Timeouts counted, every probe and device together.
fn timeouts(m: &Metrics) -> f64 {
    m.find("chd_probe_errors_total", &[("reason", "timeout")])
        .iter()
        .map(|s| s.value)
        .sum()
}

fn windows(m: &Metrics) -> f64 {
    m.value("chd_idle_windows_total", &[("outcome", "probed")])
}

fn measured(m: &Metrics, family: &str, labels: &[(&str, &str)]) -> bool {
    !m.find(family, labels).is_empty()
}

#[test]
fn cuda_a_hung_device_is_quarantined_its_memory_kept_and_the_others_measured_on_time() {
    a_hung_device_is_quarantined("cuda");
}

/// The same on ACL, whose bounded wait is `aclrtSynchronizeEventWithTimeout`.
#[test]
fn acl_a_hung_device_is_quarantined_its_memory_kept_and_the_others_measured_on_time() {
    a_hung_device_is_quarantined("acl");
}

fn a_hung_device_is_quarantined(backend: &str) {
    let lib = fake::fake_runtime_path();
    let dir = tempfile::tempdir().unwrap();
    let control = dir.path().join("faults");
    std::fs::write(&control, "hang_devices=1,3\n").unwrap();
    let report = dir.path().join("exit-report");
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let env = [
        ("CHD_FAKE_DEVICE_COUNT", "4"),
        ("CHD_FAKE_CONTROL_FILE", control.to_str().unwrap()),
        ("CHD_FAKE_EXIT_REPORT", report.to_str().unwrap()),
    ];
    let args = args(backend, lib);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let chd = Chd::serve_env(&state, &args, &env);

    let both = chd.wait_for(
        Duration::from_secs(60),
        "devices 1 and 3 quarantined",
        |m| quarantined(m, "1") && quarantined(m, "3"),
    );
    assert!(!quarantined(&both, "0") && !quarantined(&both, "2"));
    assert!(
        leaked(&both, "device") >= 2.0 * f64::from(1 << 20),
        "{}",
        leaked(&both, "device")
    );
    assert!(leaked(&both, "host") > 0.0);
    let timed_out = timeouts(&both);
    assert!((1.0..=2.0).contains(&timed_out), "{timed_out} timeouts");

    // Windows go on: devices 0 and 2 get their copy, same-device and peer copy cells, and
    // the quarantined devices get no more cells (no more timeouts).
    let start = windows(&both);
    let later = chd.wait_for(
        Duration::from_secs(60),
        "four more windows with devices 0 and 2 measured",
        |m| {
            windows(m) >= start + 4.0
                && ["0", "2"].iter().all(|d| {
                    measured(m, "chd_h2d_bandwidth_bytes_per_second", &[("device", d)])
                        && measured(m, "chd_d2d_bandwidth_bytes_per_second", &[("device", d)])
                })
                && measured(
                    m,
                    "chd_p2p_bandwidth_bytes_per_second",
                    &[("src", "0"), ("dst", "2")],
                )
        },
    );
    assert_eq!(
        timeouts(&later),
        timed_out,
        "a quarantined device got cells"
    );
    for d in ["1", "3"] {
        assert!(
            !measured(
                &later,
                "chd_h2d_bandwidth_bytes_per_second",
                &[("device", d)]
            ),
            "device {d} has a value"
        );
    }
    // Every window ended within its budget plus one cell's deadline. The quarantine shows
    // mid-window, so the window that found it may or may not be in `start`: at least the
    // four windows after it were timed.
    let count = later.value("chd_probe_duration_seconds_count", &[("probe", "h2d")]);
    let on_time = later.value(
        "chd_probe_duration_seconds_bucket",
        &[("probe", "h2d"), ("le", "2")],
    );
    assert!(
        count >= start + 4.0 && on_time == count,
        "{on_time} of {count} windows on time ({start} windows before the four)"
    );
    // The verdict names both devices.
    let failed = |m: &Metrics| m.value("chd_node_verdict", &[("verdict", "failed")]) == 1.0;
    chd.wait_for(Duration::from_secs(30), "the verdict failed", failed);
    for d in ["1", "3"] {
        let named =
            format!("device {d} hung: a copy on it did not finish within probe.cell_timeout");
        assert!(chd.log().contains(&named), "{}", chd.log());
    }
    assert!(state.join("state.json").is_file(), "the state was saved");

    // Device 3 answers again: its stuck work is released, it is measured again.
    std::fs::write(&control, "hang_devices=1\n").unwrap();
    let back = chd.wait_for(Duration::from_secs(60), "device 3 back and measured", |m| {
        !quarantined(m, "3")
            && quarantined(m, "1")
            && measured(m, "chd_h2d_bandwidth_bytes_per_second", &[("device", "3")])
    });
    assert!(
        leaked(&back, "device") > 0.0,
        "device 1's memory is still kept"
    );
    assert!(
        leaked(&back, "device") < leaked(&both, "device"),
        "device 3's was freed"
    );

    // SIGTERM while device 1 still hangs: out within 2 s, nothing freed under its DMA.
    let started = Instant::now();
    let (status, log) = chd.terminate();
    let took = started.elapsed();
    assert!(status.success(), "{status}: {log}");
    assert!(
        took < Duration::from_secs(2),
        "SIGTERM took {took:?}: {log}"
    );
    let exit = std::fs::read_to_string(&report)
        .unwrap_or_else(|e| panic!("no exit report at {}: {e}", Path::new(&report).display()));
    for line in [
        "frees_in_flight=0",
        "latch_deadlocks=0",
        "host_function_api_calls=0",
    ] {
        assert!(exit.lines().any(|l| l == line), "{line}: {exit}");
    }
}
