//! Issue 27 part 3: repeat offenders. A `chd serve` on the fake runtime whose device 1 is lost
//! (the fake's control file), back, and lost again: the held verdict goes ok -> failed -> ok
//! -> failed, `chd_node_verdict_changes_total` counts each change by `from` and `to` (two
//! into failed, which `ChdNodeFailedAgain` alerts on), and the ledger's `verdict.changes`
//! says the same, with the time of the last one.

use crate::fake;

use std::time::Duration;

use crate::chd_process::{promtool_check_metrics, Chd, Metrics};

fn verdict(m: &Metrics, level: &str) -> bool {
    m.value("chd_node_verdict", &[("verdict", level)]) == 1.0
}

fn changes(m: &Metrics, from: &str, to: &str) -> f64 {
    m.value(
        "chd_node_verdict_changes_total",
        &[("from", from), ("to", to)],
    )
}

#[test]
fn a_node_that_fails_recovers_and_fails_again_counts_two_changes_into_failed() {
    let lib = fake::fake_runtime_path();
    let dir = tempfile::tempdir().unwrap();
    let control = dir.path().join("fake-control");
    std::fs::write(&control, "").unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let chd = Chd::serve_env(
        &state,
        &[
            "--backend",
            "cuda",
            "--cuda-runtime",
            lib,
            "--nvml",
            lib,
            "--interval",
            "1s",
            "--window-budget",
            "800ms",
            "--cpu-busy-threshold",
            "1",
            "--sizes",
            "16",
            "--iterations",
            "2",
        ],
        &[
            ("CHD_FAKE_DEVICE_COUNT", "2"),
            ("CHD_FAKE_CONTROL_FILE", control.to_str().unwrap()),
        ],
    );
    let wait = |what: &str, ready: &dyn Fn(&Metrics) -> bool| {
        chd.wait_for(Duration::from_secs(90), what, ready)
    };
    // Every pair is there from the start, at 0, so increase() sees the first change.
    let m = wait("the first windows", &|m| {
        m.value(
            "chd_probe_runs_total",
            &[("probe", "h2d"), ("result", "ok")],
        ) >= 4.0
    });
    assert!(verdict(&m, "ok"));
    assert_eq!(
        m.find("chd_node_verdict_changes_total", &[]).len(),
        6,
        "one series per (from, to)"
    );
    assert_eq!(changes(&m, "ok", "failed"), 0.0);

    for round in 1..=2 {
        std::fs::write(&control, "lost_devices=1\n").unwrap();
        let m = wait("the verdict failed", &|m| verdict(m, "failed"));
        assert_eq!(changes(&m, "ok", "failed"), f64::from(round));
        if round == 2 {
            break;
        }
        std::fs::write(&control, "").unwrap();
        let m = wait("the verdict ok again", &|m| verdict(m, "ok"));
        assert_eq!(changes(&m, "failed", "ok"), 1.0);
    }
    let body = chd.scrape();
    promtool_check_metrics(&body);
    let m = Metrics::parse(&body);
    assert_eq!(
        (changes(&m, "ok", "failed"), changes(&m, "failed", "ok")),
        (2.0, 1.0)
    );
    for (from, to) in [
        ("ok", "degraded"),
        ("degraded", "failed"),
        ("failed", "degraded"),
    ] {
        assert_eq!(changes(&m, from, to), 0.0, "{from} -> {to}");
    }

    // The ledger says the same.
    let (status, _, text) = chd.get("/api/v1/calibration", None);
    assert_eq!(status, 200, "{text}");
    let ledger: serde_json::Value = serde_json::from_str(&text).unwrap();
    let v = &ledger["verdict"];
    assert_eq!(v["level"], "failed");
    assert_eq!(v["held"], true);
    assert_eq!(
        v["changes"],
        serde_json::json!([
            {"from": "ok", "to": "failed", "count": 2},
            {"from": "failed", "to": "ok", "count": 1},
        ])
    );
    let last = v["last_change"].as_str().expect("last_change");
    humantime::parse_rfc3339(last).unwrap();
}
