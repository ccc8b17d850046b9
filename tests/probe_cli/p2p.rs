//! `chd probe p2p` through the fake runtime on the 8-GPU fixture (GPUs 0-3 and 4-7 each
//! behind one PCIe switch, on two sockets): the path classes from the sysfs tree, cross-socket
//! (SYS) pairs planted slower than same-switch (PIX) pairs and one slow ordered pair, a pair
//! without peer access measured host-staged (CUDA), ACL's refusal of such a pair costing only
//! its cells, `chd report` re-rendering the run, and the errors a user can make.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::chd_process::run_chd as chd;
use crate::chd_process::text;
use crate::common::{assert_ok, records};
use crate::fake;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/accelerators/p2p-node")
}

/// The fixture's GPUs, devices 0-7 in order.
const BUS_IDS: &str = "0000:03:00.0,0000:04:00.0,0000:05:00.0,0000:06:00.0,\
                       0000:83:00.0,0000:84:00.0,0000:85:00.0,0000:86:00.0";

const ENV: [(&str, &str); 6] = [
    ("CHD_FAKE_DEVICE_COUNT", "8"),
    ("CHD_FAKE_PCI_BUS_IDS", BUS_IDS),
    ("CHD_FAKE_PAIR_GBPS", "20"),
    // SYS pairs at 6 GB/s, the ordered pair 2 -> 1 alone at 3.
    ("CHD_FAKE_P2P_GBPS", "0-3>4-7=6;4-7>0-3=6;2>1=3"),
    // 4 and 7 cannot map each other: CUDA stages their copies at 4 GB/s.
    ("CHD_FAKE_NO_PEER", "4,7"),
    ("CHD_FAKE_STAGED_GBPS", "4"),
];

/// `chd --sysfs-root ... probe p2p ARGS --backend BACKEND` on the fixture.
fn p2p(args: &[&str], backend: &str, env: &[(&str, &str)]) -> std::process::Output {
    let lib = fake::fake_runtime_path();
    let root = fixture();
    let (sys, proc_) = (root.join("sys"), root.join("proc"));
    let mut all = vec![
        "--sysfs-root",
        sys.to_str().unwrap(),
        "--procfs-root",
        proc_.to_str().unwrap(),
        "probe",
        "p2p",
    ];
    all.extend(args);
    all.extend(["--backend", backend]);
    match backend {
        "cuda" => all.extend(["--cuda-runtime", lib, "--nvml", lib]),
        _ => all.extend(["--acl-runtime", lib]),
    }
    chd(&all, env)
}

fn quick(out: &str) -> Vec<&str> {
    vec![
        "--size",
        "4MiB",
        "--iters",
        "2",
        "--repeats",
        "2",
        "--out",
        out,
    ]
}

/// The `| path | pairs | measured | median GB/s | ...` rows of summary.md: (class, median).
fn class_medians(summary: &str) -> Vec<(String, f64)> {
    summary
        .lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split('|').map(str::trim).collect();
            let class = *cols.get(1)?;
            if !["PIX", "PXB", "PHB", "NODE", "SYS", "unknown"].contains(&class) {
                return None;
            }
            Some((class.to_string(), cols.get(4)?.parse().ok()?))
        })
        .collect()
}

#[test]
fn planted_sys_and_slow_pairs_are_found_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap();
    let out = p2p(&quick(out_dir), "cuda", &ENV);
    assert_ok(&out);
    let stdout = text(&out.stdout);

    // Path classes as nvidia-smi would name them, and each pair's method, in run.json.
    let run: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("run.json")).unwrap())
            .unwrap();
    assert_eq!(run["plan"]["probe"], "p2p");
    assert_eq!(run["plan"]["pairs"].as_array().unwrap().len(), 56);
    let paths = &run["p2p_paths"];
    for (pair, class) in [
        ("0>1", "PIX"),
        ("3>2", "PIX"),
        ("7>4", "PIX"),
        ("0>5", "SYS"),
        ("6>1", "SYS"),
    ] {
        assert_eq!(paths[pair], class, "{pair}: {paths}");
    }
    let methods = &run["pair_methods"];
    assert_eq!(methods["0>5"], "copy");
    assert_eq!(methods["4>7"], "copy-staged");
    assert_eq!(methods["7>4"], "copy-staged");
    assert_eq!(records(dir.path()).len(), 56 * 2);

    // SYS slower than PIX, in the summary's class table, nearest class first.
    let summary = std::fs::read_to_string(dir.path().join("summary.md")).unwrap();
    let medians = class_medians(&summary);
    assert_eq!(
        medians.iter().map(|m| m.0.as_str()).collect::<Vec<_>>(),
        ["PIX", "SYS"],
        "{summary}"
    );
    assert!(medians[0].1 > medians[1].1, "{medians:?}");
    assert_eq!(medians[0].1, 20.0, "{summary}");
    assert_eq!(medians[1].1, 6.0, "{summary}");

    // The slow pair is named, with its class; the staged pairs are slow too and said to be
    // staged; the cross-socket pairs, slower but as slow as their class, are not slow.
    let finding = stdout
        .lines()
        .find(|l| l.starts_with("finding: 3 slow peer copy pairs"))
        .unwrap_or_else(|| panic!("no slow pair finding in\n{stdout}"));
    assert!(
        finding.contains("2>1 3.00 GB/s (0.15 x PIX median 20.00 GB/s)"),
        "{finding}"
    );
    assert!(
        finding.contains("4>7 4.00 GB/s") && finding.contains("7>4 4.00 GB/s"),
        "{finding}"
    );
    assert!(!finding.contains("0>5"), "{finding}");
    assert!(
        stdout.contains("finding: 2 pairs refused peer access and were measured staged through host memory (copy-staged): 4>7, 7>4"),
        "{stdout}"
    );
    assert!(
        summary.contains("| 2>1 | PIX | copy | 3.00 | 0.15 |"),
        "{summary}"
    );
    assert!(
        summary.contains("| 4>7 | PIX | copy-staged | 4.00 | 0.20 |"),
        "{summary}"
    );

    let csv = std::fs::read_to_string(dir.path().join("p2p.csv")).unwrap();
    assert!(
        csv.lines()
            .any(|l| l.starts_with("idle,4194304,2,1,PIX,copy,3.000,20.000,0.150,true,2,0,")),
        "{csv}"
    );
    assert!(
        csv.lines()
            .any(|l| l.starts_with("idle,4194304,0,5,SYS,copy,6.000,6.000,1.000,false,")),
        "{csv}"
    );
    assert_eq!(csv.lines().count(), 1 + 56);
    assert!(dir.path().join("p2p_4MiB.png").is_file());

    // chd report re-renders the same summary from the run directory.
    std::fs::remove_file(dir.path().join("summary.md")).unwrap();
    std::fs::remove_file(dir.path().join("p2p.csv")).unwrap();
    let again = chd(&["report", out_dir], &[]);
    assert_ok(&again);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("summary.md")).unwrap(),
        summary
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("p2p.csv")).unwrap(),
        csv
    );
}

#[test]
fn acl_refusal_costs_only_that_pairs_cells_and_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap();
    let env = [
        ("CHD_FAKE_DEVICE_COUNT", "4"),
        ("CHD_FAKE_PAIR_GBPS", "20"),
        ("CHD_FAKE_NO_PEER", "0,3"),
    ];
    let out = p2p(&quick(out_dir), "acl", &env);
    assert!(!out.status.success(), "a refused pair must fail the run");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(
            "2 of 12 cells could not be measured (see \"Failed pairs\" in summary.md); first: \
             pair 0>3 (device 0 -> device 3): not supported: device 0 -> device 3: peer access \
             refused (the runtime says device 0 cannot access device 3's memory)"
        ),
        "{stderr}"
    );
    let recs = records(dir.path());
    assert_eq!(
        recs.len(),
        12 * 2,
        "every pair is measured, the refused ones too"
    );
    for r in &recs {
        let pair = r["device"].as_str().unwrap();
        if pair == "0>3" || pair == "3>0" {
            assert_eq!(r["reason"], "unsupported", "{r}");
            let error = r["error"].as_str().unwrap();
            let (s, d) = pair.split_once('>').unwrap();
            assert!(
                error.contains(&format!("device {s} -> device {d}: peer access refused")),
                "{error}"
            );
        } else {
            let v = r["bytes_per_second"]
                .as_f64()
                .unwrap_or_else(|| panic!("{r}"));
            assert!((v - 20e9).abs() < 0.01 * 20e9, "{r}");
        }
    }
    let summary = std::fs::read_to_string(dir.path().join("summary.md")).unwrap();
    let failed = summary.split("### Failed pairs").nth(1).unwrap();
    for pair in ["0>3", "3>0"] {
        assert!(
            failed.contains(&format!(
                "| {pair} | unknown | 2 | 0 | not supported: device"
            )),
            "{summary}"
        );
    }
    assert!(
        summary.contains("2 of 12 peer copy pairs had failed samples"),
        "{summary}"
    );
}

#[test]
fn stdout_json_names_each_pair_and_bad_flags_are_clear() {
    let out = p2p(
        &[
            "--devices",
            "0,5",
            "--size",
            "1MiB",
            "--iters",
            "1",
            "--repeats",
            "1",
            "--format",
            "json",
        ],
        "cuda",
        &ENV,
    );
    assert_ok(&out);
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for r in rows {
        assert_eq!(r["path"], "SYS", "{r}");
        assert_eq!(r["method"], "copy", "{r}");
        let v = r["bytes_per_second"].as_f64().unwrap();
        assert!((v - 6e9).abs() < 0.01 * 6e9, "{r}");
    }
    for (args, says) in [
        (
            vec!["--devices", "3"],
            "a peer copy matrix needs two devices",
        ),
        (
            vec!["--devices", "0,9"],
            "--devices: \"9\" is not a device of the cuda backend",
        ),
        (
            vec!["--devices", "1,1"],
            "--devices: device 1 is given twice",
        ),
        (
            vec!["--size", "0"],
            "--size: \"0\": a size must be at least 1 byte",
        ),
        (
            vec!["--cpu", "4000"],
            "--cpu: CPU 4000 is not an online CPU this process may use",
        ),
        (
            vec!["--iterations", "0"],
            "--iterations and --repeats must be at least 1",
        ),
    ] {
        let out = p2p(&args, "cuda", &ENV);
        assert!(!out.status.success(), "{args:?}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

#[test]
fn a_cut_short_run_resumes_without_measuring_a_pair_twice() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap();
    let mut args = quick(out_dir);
    args.extend(["--devices", "0,1,4"]);
    assert_ok(&p2p(&args, "cuda", &ENV));
    let cells = dir.path().join("cells.jsonl");
    let all = std::fs::read_to_string(&cells).unwrap();
    let kept: Vec<&str> = all.lines().take(5).collect();
    // As a kill leaves it: 5 whole lines and a torn sixth.
    std::fs::write(
        &cells,
        format!("{}\n{{\"matrix\":\"p2p\",\"lo", kept.join("\n")),
    )
    .unwrap();

    let out = p2p(
        &["--size", "8MiB", "--out", out_dir, "--resume"],
        "cuda",
        &ENV,
    );
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("--size differ from the run being resumed"),
        "{stderr}"
    );

    assert_ok(&p2p(&["--out", out_dir, "--resume"], "cuda", &ENV));
    let recs = records(dir.path());
    assert_eq!(recs.len(), 6 * 2);
    let slots: std::collections::BTreeSet<String> = recs.iter().map(crate::common::slot).collect();
    assert_eq!(slots.len(), 6 * 2, "a slot measured twice");
    let summary = std::fs::read_to_string(dir.path().join("summary.md")).unwrap();
    assert_eq!(
        class_medians(&summary),
        [("PIX".to_string(), 20.0), ("SYS".to_string(), 6.0)],
        "{summary}"
    );
}

/// CANN enables peer access per device, not per process, and says nothing of what was
/// enabled before: chd cannot tell its own enable from another process's, so on ACL it never
/// disables peer access (the fake plants access another process enabled and counts the
/// directions of it this process disabled, `foreign_acl_peer_access_disabled`).
#[test]
fn acl_peer_copies_leave_peer_access_another_process_enabled() {
    let lib = fake::fake_runtime_path();
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("exit");
    let out = chd(
        &[
            "probe",
            "p2p",
            "--devices",
            "0,1",
            "--size",
            "1MiB",
            "--iterations",
            "2",
            "--repeats",
            "1",
            "--backend",
            "acl",
            "--acl-runtime",
            lib,
            "--no-progress-bar",
        ],
        &[
            ("CHD_FAKE_DEVICE_COUNT", "2"),
            ("CHD_FAKE_ACL_PEER_ENABLED", "0,1"),
            ("CHD_FAKE_EXIT_REPORT", report.to_str().unwrap()),
        ],
    );
    assert_ok(&out);
    let exit = std::fs::read_to_string(&report).unwrap();
    assert!(
        exit.lines()
            .any(|l| l == "foreign_acl_peer_access_disabled=0"),
        "chd disabled peer access another process had enabled:\n{exit}"
    );
}
