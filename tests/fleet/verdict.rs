//! Issue 16 parts 3 and 4: the node's verdict. `chd check` returns 2 / 1 / 0 (and 3) on
//! failed / degraded / healthy recordings and state directories; `chd serve` holds its verdict
//! steady (a finding named after two windows) and writes it to a Node Feature Discovery
//! feature file in the format nfd-worker reads (`source/local/local.go`: `name=value` lines,
//! `# +expiry-time=` directive, hidden files skipped).

use crate::chd_process;
use crate::fake;

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::chd_process::{run_chd, text, Chd};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The NPU-node recording (4 NPUs, CPUs 0-3 on NUMA node 0, 4-7 on node 1) rewritten: every
/// H2D row at 58.4 GB/s except those `slow` names (device, first CPU) at 20, no failed rows
/// and no pair rows.
fn recording(dir: &Path, slow: Option<(u64, u64)>) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("tests/fixtures/replay/results-npu-node.json"))
        .unwrap();
    let mut doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let rows = doc["metrics"].as_array_mut().unwrap();
    rows.retain(|r| r["test"] == "core_h2d_matrix" && r["status"] == "ok");
    for r in rows.iter_mut() {
        let device = r["device_id"].as_u64().unwrap();
        let cpu = r["host_cpu"].as_u64().unwrap();
        let is_slow = slow.is_some_and(|(d, from)| device == d && cpu >= from);
        r["gbps"] = if is_slow { 20.0 } else { 58.4 }.into();
    }
    let path = dir.join("results.json");
    std::fs::write(&path, serde_json::to_string(&doc).unwrap()).unwrap();
    path
}

fn check(args: &[&str]) -> (i32, String) {
    let mut all = vec!["check"];
    all.extend_from_slice(args);
    let out = run_chd(&all, &[]);
    (out.status.code().unwrap_or(-1), text(&out.stdout))
}

#[test]
fn check_exit_codes_follow_failed_degraded_and_healthy_recordings() {
    // Failed: the seed's slow NPU 0 (and a slow pair core).
    let failed = repo().join("tests/fixtures/replay/results-npu-node.json");
    let (code, line) = check(&["--replay", failed.to_str().unwrap()]);
    assert_eq!(code, 2, "{line}");
    assert!(
        line.starts_with("CHD FAILED - device 0 slow column (0.2"),
        "{line}"
    );
    assert!(line.contains("pair 0,3: CPU 6 as rank 0 slow"), "{line}");
    assert_eq!(line.lines().count(), 1, "one line: {line}");

    let dir = tempfile::tempdir().unwrap();
    // Degraded: NPU 1 slow from NUMA node 1's CPUs only (its column median stays typical).
    let degraded = recording(dir.path(), Some((1, 4)));
    let (code, line) = check(&["--replay", degraded.to_str().unwrap()]);
    assert_eq!(code, 1, "{line}");
    assert_eq!(
        line.trim(),
        "CHD DEGRADED - device 1 slow from NUMA node 1 (0.34 x its best node)"
    );

    let healthy_dir = tempfile::tempdir().unwrap();
    let healthy = recording(healthy_dir.path(), None);
    let (code, line) = check(&["--replay", healthy.to_str().unwrap()]);
    assert_eq!((code, line.trim()), (0, "CHD OK - no findings"));
}

#[test]
fn check_is_unknown_when_there_is_nothing_to_judge() {
    let empty = tempfile::tempdir().unwrap();
    let (code, line) = check(&["--state-dir", empty.path().to_str().unwrap()]);
    assert_eq!(code, 3, "{line}");
    assert!(line.starts_with("CHD UNKNOWN - no state file "), "{line}");

    std::fs::write(
        empty.path().join("state.json"),
        "{\"version\": 1, \"h2d\": [",
    )
    .unwrap();
    let (code, line) = check(&["--state-dir", empty.path().to_str().unwrap()]);
    assert_eq!(code, 3, "{line}");
    assert!(line.starts_with("CHD UNKNOWN - cannot read "), "{line}");
    // chd check never moves or rewrites what it reads.
    assert_eq!(
        std::fs::read_to_string(empty.path().join("state.json")).unwrap(),
        "{\"version\": 1, \"h2d\": ["
    );

    // Nobody listening: unknown, saying why.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let (code, line) = check(&["--url", &url]);
    assert_eq!(code, 3, "{line}");
    assert!(line.starts_with("CHD UNKNOWN - "), "{line}");

    // Neither source: clap refuses (exit 2 is clap's usage error, with a message on stderr).
    let out = run_chd(&["check"], &[]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--state-dir"),
        "{}",
        text(&out.stderr)
    );
}

/// `chd serve` probing the fake runtime with device 0 slow: the verdict turns `failed` only
/// after two windows have found it, the NFD feature file follows it (with an expiry, written
/// through a hidden temporary file), and `chd check` on the state directory agrees.
#[test]
fn serve_names_a_finding_after_two_windows_and_labels_the_node() {
    let lib = fake::fake_runtime_path();
    let state = tempfile::tempdir().unwrap();
    let features = tempfile::tempdir().unwrap();
    let nfd = features.path().join("chd");
    let chd = Chd::serve_env(
        state.path(),
        &[
            "--interval",
            "1s",
            "--window-budget",
            "800ms",
            "--cpu-busy-threshold",
            "1",
            "--sizes",
            "64",
            "--iterations",
            "2",
            "--backend",
            "cuda",
            "--cuda-runtime",
            lib,
            "--nvml",
            lib,
            "--nfd-features-file",
            nfd.to_str().unwrap(),
        ],
        &[
            ("CHD_FAKE_DEVICE_COUNT", "4"),
            ("CHD_FAKE_H2D_GBPS", "58.9;0=12.3"),
        ],
    );
    let verdict = |m: &chd_process::Metrics| -> String {
        ["ok", "degraded", "failed"]
            .into_iter()
            .find(|v| m.value("chd_node_verdict", &[("verdict", v)]) == 1.0)
            .unwrap()
            .to_string()
    };
    let windows = |m: &chd_process::Metrics| {
        m.value(
            "chd_probe_runs_total",
            &[("probe", "h2d"), ("result", "ok")],
        )
    };
    // Until the second window has ended, the verdict cannot have named device 0.
    let failed = chd.wait_for(Duration::from_secs(60), "a failed verdict", |m| {
        let v = verdict(m);
        assert!(
            v == "ok" || windows(m) >= 2.0,
            "verdict {v} after {} windows",
            windows(m)
        );
        v == "failed"
    });
    assert_eq!(failed.value("chd_node_verdict_causes", &[]), 1.0);
    // The feature file follows within a tick.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let labels = loop {
        let text = std::fs::read_to_string(&nfd).unwrap_or_default();
        if text.contains("verdict=failed") || std::time::Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let lines: Vec<&str> = labels.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(
        &lines[..2],
        [
            "chd.feature.node.kubernetes.io/verdict=failed",
            "chd.feature.node.kubernetes.io/slow-devices=0",
        ],
        "{labels}"
    );
    assert!(
        lines
            .iter()
            .all(|l| l.starts_with("chd.feature.node.kubernetes.io/")),
        "{labels}"
    );
    let expiry = labels
        .lines()
        .find_map(|l| l.strip_prefix("# +expiry-time="))
        .expect("an expiry directive");
    let expires = humantime::parse_rfc3339(expiry).expect("RFC 3339, as NFD parses it");
    assert!(expires > std::time::SystemTime::now() + Duration::from_secs(500));
    let names: Vec<String> = std::fs::read_dir(features.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["chd"], "no temporary file left where NFD reads");

    // The served ledger carries the same, held verdict.
    let (status, _, body) = chd.get("/api/v1/calibration", None);
    assert_eq!(status, 200, "{body}");
    let ledger: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        ledger["verdict"]["level"], "failed",
        "{}",
        ledger["verdict"]
    );
    assert_eq!(ledger["verdict"]["held"], true);
    assert_eq!(ledger["verdict"]["causes"][0]["id"], "slow_device:0");
    // `chd check --url` asks the running chd for the same verdict.
    let url = format!("http://{}", chd.addr);
    let (code, line) = check(&["--url", &url]);
    assert_eq!(code, 2, "{line}");
    assert!(
        line.starts_with("CHD FAILED - device 0 slow column"),
        "{line}"
    );

    let (status, log) = chd.terminate();
    assert!(status.success(), "{log}");
    let (code, line) = check(&["--state-dir", state.path().to_str().unwrap()]);
    assert_eq!(code, 2, "{line}");
    assert!(
        line.starts_with("CHD FAILED - device 0 slow column"),
        "{line}"
    );
}
