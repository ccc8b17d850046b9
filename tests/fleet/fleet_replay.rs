//! Issue 15 part 5: recordings replayed at once, one `chd serve --replay` per recording and
//! each its own scrape target, behave as a small fleet in a real Prometheus (Debian's
//! `prometheus`), so the fleet rules can be tried on recorded nodes (docs/FLEET.md shows
//! how). Three copies of the NPU-node recording (tests/fixtures/replay): two as recorded, one
//! with every H2D sample at 0.4 of its value. `ChdH2DNodeBelowFleet` fires for that one only.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::chd_process::Chd;
use crate::prometheus::{repo, rules_path, rules_with_for, Prometheus};

/// The fixture recording with every H2D sample's `gbps` times `factor`.
fn scaled_recording(dir: &Path, factor: f64) -> std::path::PathBuf {
    let text = std::fs::read_to_string(repo().join("tests/fixtures/replay/results-npu-node.json"))
        .unwrap();
    let mut doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    for row in doc["metrics"].as_array_mut().unwrap() {
        if row["test"] == "core_h2d_matrix" {
            if let Some(gbps) = row["gbps"].as_f64() {
                row["gbps"] = (gbps * factor).into();
            }
        }
    }
    let path = dir.join("results.json");
    std::fs::write(&path, serde_json::to_string(&doc).unwrap()).unwrap();
    path
}

#[test]
fn replayed_recordings_are_a_fleet_and_the_slow_one_is_below_it() {
    let recordings = tempfile::tempdir().unwrap();
    let nodes: Vec<(&str, f64)> = vec![("rec-a", 1.0), ("rec-b", 1.0), ("rec-slow", 0.4)];
    let mut chds = Vec::new();
    let mut scrape_configs = String::new();
    for (job, factor) in &nodes {
        let dir = recordings.path().join(job);
        std::fs::create_dir(&dir).unwrap();
        let recording = scaled_recording(&dir, *factor);
        let state = tempfile::tempdir().unwrap();
        let chd = Chd::serve(state.path(), &["--replay", recording.to_str().unwrap()]);
        scrape_configs.push_str(&format!(
            "  - job_name: {job}\n    static_configs:\n      - targets: ['{}']\n",
            chd.addr
        ));
        chds.push((state, chd));
    }
    let config = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - chd.rules.yml\nscrape_configs:\n{scrape_configs}"
    );
    let rules = std::fs::read_to_string(rules_path()).unwrap();
    let prom = Prometheus::start(&config, &[("chd.rules.yml", rules_with_for(&rules, "0s"))]);

    let below = |prom: &Prometheus| -> BTreeSet<String> {
        prom.firing()
            .iter()
            .filter(|a| a.name() == "ChdH2DNodeBelowFleet")
            .map(|a| a.labels["job"].clone())
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(40);
    let expected: BTreeSet<String> = ["rec-slow".to_string()].into();
    while below(&prom) != expected {
        assert!(
            Instant::now() < deadline,
            "ChdH2DNodeBelowFleet fires for {:?}, expected {expected:?}; fleet nodes: {:?}\n{}",
            below(&prom),
            prom.query("name:chd_h2d_device_median:fleet_nodes"),
            prom.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // The group is the recordings' model, and the slow node sits at 0.4 of the fleet.
    let ratios = prom
        .query("instance_name:chd_h2d_device_median:fleet_ratio")
        .unwrap();
    assert_eq!(ratios.len(), 3, "{ratios:?}");
    for r in &ratios {
        assert_eq!(r["metric"]["name"], "recorded device", "{r}");
        let v: f64 = r["value"][1].as_str().unwrap().parse().unwrap();
        let want = if r["metric"]["job"] == "rec-slow" {
            0.4
        } else {
            1.0
        };
        assert!((v - want).abs() < 1e-6, "{r}");
    }
    drop(prom);
}
