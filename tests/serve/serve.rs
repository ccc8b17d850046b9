//! End-to-end tests of `chd serve` on this machine's real host backend: the binary probes,
//! serves /metrics that promtool accepts, survives SIGTERM mid-window without losing a
//! measured cell, sets aside every state file it cannot use (damaged, another format
//! version, JSON of another shape) and reads version 1 files of every age.

use crate::chd_process;

use std::collections::BTreeSet;
use std::time::Duration;

use crate::chd_process::{promtool_check_metrics, Chd, Metrics};

fn allowed_cpus() -> Vec<String> {
    chd_process::allowed_cpus()
        .iter()
        .map(u32::to_string)
        .collect()
}

/// Fast settings: probe every second, never skip for CPU load (tests run in parallel).
const FAST: &[&str] = &[
    "--interval",
    "1s",
    "--window-budget",
    "500ms",
    "--cpu-busy-threshold",
    "1",
    "--sizes",
    "4",
    "--iterations",
    "2",
];

fn cell_keys(m: &Metrics) -> BTreeSet<(String, String, String, String)> {
    m.find("chd_h2d_bandwidth_bytes_per_second", &[])
        .into_iter()
        .map(|s| {
            (
                s.labels["cpu"].clone(),
                s.labels["device"].clone(),
                s.labels["size_bytes"].clone(),
                s.labels["direction"].clone(),
            )
        })
        .collect()
}

#[test]
fn serves_cells_and_bindable_for_every_allowed_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let chd = Chd::serve(dir.path(), FAST);
    let cpus = allowed_cpus();
    // Cells show while their window runs (its rechecks of slow samples can take a while on a
    // loaded machine); the window is counted when it ends: wait for both.
    let m = chd.wait_for(
        Duration::from_secs(30),
        "a cell for every CPU and a finished window",
        |m| {
            cpus.iter().all(|cpu| {
                !m.find("chd_h2d_bandwidth_bytes_per_second", &[("cpu", cpu)])
                    .is_empty()
            }) && m
                .find(
                    "chd_probe_runs_total",
                    &[("probe", "h2d"), ("result", "ok")],
                )
                .iter()
                .any(|s| s.value >= 1.0)
                // The window ends after its d2d cells, which follow the h2d ones.
                && m.value("chd_idle_windows_total", &[("outcome", "probed")]) >= 1.0
        },
    );
    // Every allowed CPU bound: the counts say so, and no CPU has a chd_cpu_bindable series
    // (by default only those that cannot be bound do: issue 28 part 4).
    assert_eq!(
        m.value("chd_cpus", &[("state", "bindable")]),
        cpus.len() as f64
    );
    assert_eq!(m.value("chd_cpus", &[("state", "not_bindable")]), 0.0);
    assert!(m.find("chd_cpu_bindable", &[]).is_empty());
    for cpu in &cpus {
        for s in m.find("chd_h2d_bandwidth_bytes_per_second", &[("cpu", cpu)]) {
            assert!(
                s.value > 1e8 && s.value < 1e13,
                "implausible bandwidth {s:?}"
            );
            assert_eq!(s.labels["size_bytes"], (4u64 << 20).to_string());
            assert!(s.labels["device"].starts_with("numa"));
        }
    }
    assert_eq!(m.value("chd_backend_up", &[("backend", "host")]), 1.0);
    // The default `exposition.cells = "auto"`, resolved for this small matrix, and said so.
    assert!(
        chd.log()
            .contains("per-cell series on: exposition.cells = auto and "),
        "{}",
        chd.log()
    );
    assert!(
        m.value(
            "chd_probe_runs_total",
            &[("probe", "h2d"), ("result", "ok")]
        ) >= 1.0
    );
    assert!(m.value("chd_idle_windows_total", &[("outcome", "probed")]) >= 1.0);
    assert_eq!(
        m.value(
            "chd_probe_cells",
            &[("probe", "h2d"), ("state", "unmeasured")]
        ),
        0.0
    );
    assert!(
        m.value(
            "chd_probe_last_success_timestamp_seconds",
            &[("probe", "h2d")]
        ) > 1.7e9
    );
    for device in m.find("chd_device_info", &[("kind", "host")]) {
        let ratio = m.value(
            "chd_h2d_device_ratio",
            &[("device", &device.labels["device"]), ("direction", "h2d")],
        );
        assert!(ratio > 0.0 && ratio.is_finite());
    }
    promtool_check_metrics(&chd.scrape());
}

#[test]
fn openmetrics_on_request_and_other_endpoints() {
    let dir = tempfile::tempdir().unwrap();
    let chd = Chd::serve(dir.path(), &["--no-probe"]);
    let (status, headers, body) = chd.get(
        "/metrics",
        Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"),
    );
    assert_eq!(status, 200);
    assert!(headers["content-type"].starts_with("application/openmetrics-text"));
    assert!(body.ends_with("# EOF\n"), "{body}");
    let (status, headers, body) = chd.get("/metrics", None);
    assert_eq!(status, 200);
    assert!(headers["content-type"].starts_with("text/plain; version=0.0.4"));
    assert!(!body.contains("# EOF"));
    // Probing disabled: ticks are counted as such, nothing is measured.
    let m = Metrics::parse(&body);
    assert!(m.find("chd_h2d_bandwidth_bytes_per_second", &[]).is_empty());
    assert_eq!(chd.get("/healthz", None).2, "ok\n");
    let (status, _, index) = chd.get("/", None);
    assert_eq!(status, 200);
    assert!(index.contains("/metrics"));
    assert_eq!(chd.get("/nope", None).0, 404);
}

#[test]
fn sigterm_mid_window_keeps_every_measured_cell() {
    let dir = tempfile::tempdir().unwrap();
    // Big, many cells and a long budget: the first window is still running when we stop it.
    let chd = Chd::serve(
        dir.path(),
        &[
            "--interval",
            "1h",
            "--window-budget",
            "30m",
            "--cpu-busy-threshold",
            "1",
            "--sizes",
            "32,64,96,128",
            "--directions",
            "h2d,d2h",
            "--iterations",
            "30",
        ],
    );
    let total = allowed_cpus().len() * 8;
    let before = chd.wait_for(Duration::from_secs(60), "the first measured cell", |m| {
        !m.find("chd_h2d_bandwidth_bytes_per_second", &[]).is_empty()
    });
    let measured_before = cell_keys(&before);
    assert!(
        measured_before.len() < total,
        "window finished before SIGTERM ({total} cells); make it longer"
    );
    let (status, log) = chd.terminate();
    assert!(status.success(), "exit {status:?}; log:\n{log}");
    assert!(
        dir.path().join("state.json").exists(),
        "no state file; log:\n{log}"
    );

    let again = Chd::serve(dir.path(), &["--no-probe"]);
    let after = Metrics::parse(&again.scrape());
    let measured_after = cell_keys(&after);
    assert!(
        measured_after.is_superset(&measured_before),
        "lost cells: before {measured_before:?}, after {measured_after:?}"
    );
    // Values survive as they were served.
    for s in before.find("chd_h2d_bandwidth_bytes_per_second", &[]) {
        let want: Vec<(&str, &str)> = s
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(after.value(&s.name, &want), s.value);
    }
    assert!(again.log().contains("restored state"), "{}", again.log());
}

/// Files `state.json` may hold that this chd cannot use, what the warning must say, and the
/// name each is set aside under: never dropped, never overwritten.
const UNUSABLE_STATE_FILES: &[(&str, &str, &str)] = &[
    (
        "{\"version\":1,\"saved_at\":17",
        "EOF while parsing",
        "state.json.corrupt-",
    ),
    // An older version than any chd wrote, in version 1's layout.
    (
        r#"{"version":0,"saved_at":1,"h2d":[],"bindable":[],"last_success":{}}"#,
        "format version 0 (this chd reads version 1)",
        "state.json.v0-",
    ),
    // A newer chd's file (after a downgrade), in a layout this one does not know.
    (
        r#"{"version":2,"saved_at":1,"cells":{"h2d":[{"cpu":0}]}}"#,
        "format version 2 (this chd reads version 1)",
        "state.json.v2-",
    ),
    (
        r#"{"saved_at":1,"h2d":[],"bindable":[],"last_success":{}}"#,
        "no format version: not a chd state file (an object without one)",
        "state.json.corrupt-",
    ),
    // Valid JSON of other shapes.
    (
        r#"[{"cpu":0,"device":"0"}]"#,
        "no format version: not a chd state file (an array)",
        "state.json.corrupt-",
    ),
    (
        r#"{"version":"1","h2d":[]}"#,
        "format version \"1\" (this chd reads version 1)",
        "state.json.corrupt-",
    ),
];

#[test]
fn unusable_state_files_are_set_aside_and_chd_starts() {
    for &(text, problem, aside_prefix) in UNUSABLE_STATE_FILES {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("state.json"), text).unwrap();
        let chd = Chd::serve(dir.path(), &["--no-probe"]);
        let _ = chd.scrape();
        let aside: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("state.json."))
            .collect();
        assert_eq!(aside.len(), 1, "{text}: {aside:?}");
        assert!(aside[0].starts_with(aside_prefix), "{text}: {aside:?}");
        assert_eq!(
            std::fs::read_to_string(dir.path().join(&aside[0])).unwrap(),
            text,
            "the file set aside is the file as it was"
        );
        let problem = format!("state file was unusable ({problem}");
        let moved = format!("); moved it to {}", dir.path().join(&aside[0]).display());
        let log = chd.log();
        assert!(
            log.lines()
                .any(|l| l.contains(" WARN ") && l.contains(&problem) && l.contains(&moved)),
            "{text}: no warning {problem:?} ... {moved:?}; log:\n{log}"
        );
    }
}

/// A version 1 file from before the pair probe (no `pair`, no `cpu_numa`) is read as it
/// is: its cells are served, nothing is set aside.
#[test]
fn a_state_file_from_before_the_pair_probe_is_restored() {
    let cpu = allowed_cpus()[0].clone();
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        r#"{{"version":1,"saved_at":100,"h2d":[{{"cpu":{cpu},"device":"numa0","size_bytes":4194304,"direction":"h2d","samples":[{{"bytes_per_second":12000000000.0,"at":99.0}}],"last_attempt":99.0}}],"bindable":[],"last_success":{{"h2d":99.5}}}}"#
    );
    std::fs::write(dir.path().join("state.json"), &text).unwrap();
    let chd = Chd::serve(dir.path(), &["--no-probe", "--sizes", "4"]);
    let m = Metrics::parse(&chd.scrape());
    assert_eq!(
        m.value(
            "chd_h2d_bandwidth_bytes_per_second",
            &[("cpu", &cpu), ("device", "numa0"), ("direction", "h2d")]
        ),
        12e9
    );
    assert!(chd.log().contains("restored state"), "{}", chd.log());
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["state.json"]);
}
