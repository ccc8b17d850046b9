//! `chd serve`'s peer copy cells on the fake runtime and the 8-GPU fixture's PCI tree (GPUs
//! 0-3 and 4-7 each behind one switch, on two sockets): one ordered pair per window, the least
//! recently tried first, until every pair is measured; each with its path class from sysfs;
//! a planted slow pair and slower cross-socket (SYS) pairs show in
//! `chd_p2p_bandwidth_bytes_per_second`; every window stays within its budget; a closed idle
//! gate (a busy device, at start and again after pairs were measured) runs no pair; a pair
//! the runtime refuses (ACL without peer access) counts in
//! `chd_probe_errors_total{probe="p2p"}` and costs only its own cells.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::chd_process::{promtool_check_metrics, Chd, Metrics};
use crate::fake::fake_runtime_path as lib;

const BUDGET_MS: u64 = 800;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/accelerators/p2p-node")
}

/// Serve on the fixture with `backend`, one-MiB copy cells, 4 MiB peer copies.
fn serve(dir: &Path, backend: &str, env: &[(&str, &str)]) -> Chd {
    let root = fixture();
    let (sys, proc_) = (root.join("sys"), root.join("proc"));
    let mut args = vec![
        "--sysfs-root",
        sys.to_str().unwrap(),
        "--procfs-root",
        proc_.to_str().unwrap(),
        "--cpus",
        "0",
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
        "1",
        "--p2p-size",
        "4",
        "--backend",
        backend,
    ];
    match backend {
        "cuda" => args.extend(["--cuda-runtime", lib(), "--nvml", lib()]),
        "acl" => args.extend(["--acl-runtime", lib()]),
        _ => {}
    }
    let args: Vec<String> = args.into_iter().map(String::from).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Chd::serve_env(dir, &args, env)
}

/// Devices 0 and 1 behind the first switch, 2 and 3 behind the second, on the other socket.
const BUS_IDS: &str = "0000:03:00.0,0000:04:00.0,0000:83:00.0,0000:84:00.0";

const ENV: [(&str, &str); 4] = [
    ("CHD_FAKE_DEVICE_COUNT", "4"),
    ("CHD_FAKE_PCI_BUS_IDS", BUS_IDS),
    ("CHD_FAKE_PAIR_GBPS", "20"),
    // Cross-socket pairs at 6 GB/s, the ordered pair 1 -> 0 alone at 3.
    ("CHD_FAKE_P2P_GBPS", "0-1>2-3=6;2-3>0-1=6;1>0=3"),
];

/// (src, dst, path, GB/s) of every ordered pair the environment above plants.
fn expected() -> Vec<(String, String, &'static str, f64)> {
    let mut out = Vec::new();
    for src in 0..4u32 {
        for dst in (0..4u32).filter(|&d| d != src) {
            let same_switch = src / 2 == dst / 2;
            let (path, gbps) = match (src, dst) {
                (1, 0) => ("PIX", 3.0),
                _ if same_switch => ("PIX", 20.0),
                _ => ("SYS", 6.0),
            };
            out.push((src.to_string(), dst.to_string(), path, gbps));
        }
    }
    out
}

fn p2p_series(m: &Metrics) -> usize {
    m.find("chd_p2p_bandwidth_bytes_per_second", &[]).len()
}

fn runs(m: &Metrics, probe: &str) -> f64 {
    ["ok", "error", "aborted"]
        .iter()
        .map(|r| m.value("chd_probe_runs_total", &[("probe", probe), ("result", r)]))
        .sum()
}

/// The `elapsed_ms` of every "probe window done" line of the log.
fn window_elapsed_ms(log: &str) -> Vec<u64> {
    log.lines()
        .filter(|l| l.contains("probe window done"))
        .filter_map(|l| {
            let rest = &l[l.find("elapsed_ms=")? + "elapsed_ms=".len()..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect()
}

#[test]
fn every_ordered_pair_is_measured_one_per_window_with_its_path_and_planted_rate() {
    let dir = tempfile::tempdir().unwrap();
    let chd = serve(dir.path(), "cuda", &ENV);
    let m = chd.wait_for(Duration::from_secs(90), "all 12 ordered pairs", |m| {
        p2p_series(m) == 12
    });
    for (src, dst, path, gbps) in expected() {
        let got = m.find(
            "chd_p2p_bandwidth_bytes_per_second",
            &[("src", &src), ("dst", &dst)],
        );
        assert_eq!(got.len(), 1, "{src}>{dst}: {got:?}");
        let s = got[0];
        assert_eq!(
            s.labels.get("path").map(String::as_str),
            Some(path),
            "{src}>{dst}"
        );
        let want = gbps * 1e9;
        assert!(
            (s.value - want).abs() < 0.02 * want,
            "{src}>{dst}: {} B/s, want {want}",
            s.value
        );
    }
    // The coverage family counts the node's 12 ordered pairs (issue 24: it had no p2p rows).
    let cells = |state| m.value("chd_probe_cells", &[("probe", "p2p"), ("state", state)]);
    assert_eq!(
        (cells("fresh"), cells("stale"), cells("unmeasured")),
        (12.0, 0.0, 0.0)
    );
    // One pair per window: twelve pairs took at least twelve p2p runs, every one a success,
    // and the d2d and h2d cells still ran in those windows.
    let ok = m.value(
        "chd_probe_runs_total",
        &[("probe", "p2p"), ("result", "ok")],
    );
    assert!(ok >= 12.0, "{ok}");
    assert_eq!(runs(&m, "p2p"), ok);
    assert!(
        m.value(
            "chd_probe_runs_total",
            &[("probe", "d2d"), ("result", "ok")]
        ) >= 12.0
    );
    assert!(
        m.value(
            "chd_probe_last_success_timestamp_seconds",
            &[("probe", "p2p")]
        ) > 0.0
    );
    assert!(m
        .find("chd_probe_errors_total", &[("probe", "p2p")])
        .iter()
        .all(|s| s.value == 0.0));
    promtool_check_metrics(&chd.scrape());
    let log = chd.log();
    let elapsed = window_elapsed_ms(&log);
    assert!(elapsed.len() >= 12, "{log}");
    // A window ends within its budget, plus the cell in flight when it ran out (a 4 MiB
    // copy cell takes a few milliseconds here).
    assert!(
        elapsed.iter().all(|&ms| ms <= BUDGET_MS + 100),
        "window over budget: {elapsed:?}"
    );
    let (status, log) = chd.terminate();
    assert!(status.success(), "{log}");

    // The pairs are saved with the other cells.
    let state = std::fs::read_to_string(dir.path().join("state.json")).unwrap();
    assert!(state.contains("\"p2p\""), "{state}");
}

#[test]
fn a_closed_idle_gate_runs_no_pair() {
    let dir = tempfile::tempdir().unwrap();
    let busy = dir.path().join("busy");
    std::fs::write(&busy, "3").unwrap();
    let mut env = ENV.to_vec();
    env.push(("CHD_FAKE_BUSY_FILE", busy.to_str().unwrap()));
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let chd = serve(&state, "cuda", &env);
    let busy_ticks = |m: &Metrics| m.value("chd_idle_windows_total", &[("outcome", "device_busy")]);
    let m = chd.wait_for(Duration::from_secs(30), "two device_busy ticks", |m| {
        busy_ticks(m) >= 2.0
    });
    assert_eq!(
        m.value("chd_idle_windows_total", &[("outcome", "probed")]),
        0.0
    );
    assert_eq!(runs(&m, "p2p"), 0.0);
    assert_eq!(p2p_series(&m), 0);
    // Planned, never measured.
    let cells = |state| m.value("chd_probe_cells", &[("probe", "p2p"), ("state", state)]);
    assert_eq!(
        (cells("fresh"), cells("stale"), cells("unmeasured")),
        (0.0, 0.0, 12.0)
    );

    // Idle: pairs are measured; busy again: no more pair runs.
    std::fs::write(&busy, "").unwrap();
    let idle = chd.wait_for(Duration::from_secs(30), "two measured pairs", |m| {
        p2p_series(m) >= 2
    });
    std::fs::write(&busy, "3").unwrap();
    let before = busy_ticks(&idle);
    let closed = chd.wait_for(Duration::from_secs(30), "a device_busy tick", |m| {
        busy_ticks(m) > before
    });
    let (ticks, pair_runs) = (busy_ticks(&closed), runs(&closed, "p2p"));
    let m = chd.wait_for(Duration::from_secs(30), "two more device_busy ticks", |m| {
        busy_ticks(m) >= ticks + 2.0
    });
    assert_eq!(
        runs(&m, "p2p"),
        pair_runs,
        "a pair ran while the gate was closed"
    );
    let (status, log) = chd.terminate();
    assert!(status.success(), "{log}");
}

#[test]
fn a_refused_pair_counts_as_a_p2p_error_and_costs_only_its_cells() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("CHD_FAKE_DEVICE_COUNT", "2"),
        ("CHD_FAKE_PCI_BUS_IDS", "0000:03:00.0,0000:83:00.0"),
        // ACL has no host-staged fallback: both directions are refused.
        ("CHD_FAKE_NO_PEER", "0,1"),
    ];
    let chd = serve(dir.path(), "acl", &env);
    let refused = |m: &Metrics, pair: &str| -> f64 {
        m.find(
            "chd_probe_errors_total",
            &[("probe", "p2p"), ("device", pair)],
        )
        .iter()
        .map(|s| s.value)
        .sum()
    };
    let m = chd.wait_for(Duration::from_secs(30), "both pairs refused", |m| {
        refused(m, "0>1") >= 1.0 && refused(m, "1>0") >= 1.0
    });
    assert_eq!(p2p_series(&m), 0);
    assert!(
        m.value(
            "chd_probe_runs_total",
            &[("probe", "p2p"), ("result", "error")]
        ) >= 2.0
    );
    // The copy and same-device cells of both devices are measured all the same.
    for d in ["0", "1"] {
        assert!(
            !m.find("chd_h2d_bandwidth_bytes_per_second", &[("device", d)])
                .is_empty(),
            "device {d}"
        );
        assert!(
            !m.find("chd_d2d_bandwidth_bytes_per_second", &[("device", d)])
                .is_empty(),
            "device {d}"
        );
    }
    let (status, log) = chd.terminate();
    assert!(status.success(), "{log}");
}

#[test]
fn the_host_backend_runs_no_pair() {
    // The fixture's two NUMA nodes are the host backend's two "devices": no peer copies.
    let dir = tempfile::tempdir().unwrap();
    let chd = serve(dir.path(), "host", &[]);
    let m = chd.wait_for(Duration::from_secs(30), "two probed windows", |m| {
        m.value("chd_idle_windows_total", &[("outcome", "probed")]) >= 2.0
    });
    assert!(
        m.value(
            "chd_probe_runs_total",
            &[("probe", "h2d"), ("result", "ok")]
        ) >= 2.0
    );
    assert_eq!(
        m.find("chd_device_info", &[]).len(),
        2,
        "both NUMA nodes are devices"
    );
    assert_eq!(runs(&m, "p2p"), 0.0);
    assert_eq!(p2p_series(&m), 0);
    // Nothing planned, nothing to cover.
    for state in ["fresh", "stale", "unmeasured"] {
        let cells = m.value("chd_probe_cells", &[("probe", "p2p"), ("state", state)]);
        assert_eq!(cells, 0.0, "{state}");
    }
    let (status, log) = chd.terminate();
    assert!(status.success(), "{log}");
}
