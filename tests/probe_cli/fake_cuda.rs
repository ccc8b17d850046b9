//! `chd probe h2d` through the fake CUDA runtime: a planted slow device, load profiles and
//! the device load.

use std::collections::BTreeMap;

use crate::chd_process::allowed_cpus;
use crate::chd_process::run_chd as chd;
use crate::chd_process::text;
use crate::common::{assert_ok, cpu_count, records};
use crate::fake;

pub(crate) fn fake_args(lib: &str) -> Vec<&str> {
    vec!["--backend", "cuda", "--cuda-runtime", lib, "--nvml", lib]
}

pub(crate) const FAKE_ENV: [(&str, &str); 2] = [
    ("CHD_FAKE_DEVICE_COUNT", "4"),
    ("CHD_FAKE_H2D_GBPS", "58.9;0=12.3"),
];

#[test]
fn planted_slow_device_is_the_one_the_summary_names() {
    let lib = fake::fake_runtime_path();
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec![
        "probe",
        "h2d",
        "--cpus",
        "auto",
        "--sizes",
        "1MiB,4MiB",
        "--iters",
        "2",
        "--repeats",
        "2",
        "--out",
    ];
    let out_dir = dir.path().to_str().unwrap();
    args.push(out_dir);
    args.extend(fake_args(lib));
    let out = chd(&args, &FAKE_ENV);
    assert_ok(&out);
    let stdout = text(&out.stdout);
    let findings: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("finding: "))
        .collect();
    assert_eq!(findings.len(), 1, "{stdout}");
    assert!(
        findings[0]
            .starts_with("finding: device 0 is slow in 2 of 2 matrices: 0.21 x the typical device"),
        "{stdout}"
    );
    let summary = std::fs::read_to_string(dir.path().join("summary.md")).unwrap();
    assert!(
        summary.contains("- device 0 is slow in 2 of 2 matrices"),
        "{summary}"
    );
    for d in ["1", "2", "3"] {
        assert!(
            !summary.contains(&format!("device {d} is slow")),
            "{summary}"
        );
    }
    let slow_rows: Vec<&str> = summary
        .lines()
        .filter(|l| l.ends_with("| **slow** |"))
        .collect();
    assert_eq!(slow_rows.len(), 2, "{summary}");
    assert!(
        slow_rows.iter().all(|l| l.starts_with("| 0 | Fake H200 |")),
        "{slow_rows:?}"
    );
    // Pinned memory by default on an accelerator backend, recorded per sample.
    let recs = records(dir.path());
    assert!(!recs.is_empty());
    assert!(recs
        .iter()
        .all(|r| r["host_memory"] == "pinned" && r["bytes_per_second"].as_f64().is_some()));
}

#[test]
fn load_profiles_run_once_each_and_the_report_compares_them_with_idle() {
    let lib = fake::fake_runtime_path();
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec![
        "probe",
        "h2d",
        "--sizes",
        "1MiB",
        "--iters",
        "1",
        "--samples",
        "2",
        "--load",
        "idle",
        "--load",
        "cpu:1",
        "--memory",
        "pinned,pageable",
        "--out",
    ];
    args.push(dir.path().to_str().unwrap());
    args.extend(fake_args(lib));
    let out = chd(&args, &FAKE_ENV);
    assert_ok(&out);
    let all = records(dir.path());
    let mut per_load: BTreeMap<String, usize> = BTreeMap::new();
    for r in &all {
        *per_load
            .entry(r["load"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    let per_profile = cpu_count() * 4 * 2 * 2;
    assert_eq!(per_load.get("idle"), Some(&per_profile), "{per_load:?}");
    assert_eq!(per_load.get("cpu:1"), Some(&per_profile), "{per_load:?}");
    // Idle first, then the loaded profile: every idle record before the first loaded one (a
    // loaded record first would leave nothing before it to check).
    let first_loaded = all.iter().position(|r| r["load"] == "cpu:1").unwrap();
    assert_eq!(first_loaded, per_profile, "{per_load:?}");
    assert!(all[..first_loaded].iter().all(|r| r["load"] == "idle"));
    let summary = std::fs::read_to_string(dir.path().join("summary.md")).unwrap();
    assert!(
        summary.contains("## Load profiles against idle"),
        "{summary}"
    );
    // The fake times copies on a virtual clock, so load changes nothing: +0.0%.
    assert!(
        summary.contains("| H2D 1MiB h2d, pinned memory | cpu:1 | 0 | 12.30 | 12.30 | +0.0% |"),
        "{summary}"
    );
    assert!(dir.path().join("h2d_1MiB_pageable_cpu-1.png").is_file());
}

#[test]
fn device_load_runs_gemms_on_every_device_and_the_report_shows_the_copy_slowdown() {
    let lib = fake::fake_runtime_path();
    let dir = tempfile::tempdir().unwrap();
    let cpu = allowed_cpus()[0].to_string();
    let mut args = vec![
        "probe",
        "h2d",
        "--cpus",
        &cpu,
        "--sizes",
        "1MiB",
        "--iters",
        "2",
        "--repeats",
        "2",
        "--load",
        "idle",
        "--load",
        "device",
        "--out",
    ];
    args.push(dir.path().to_str().unwrap());
    args.extend(fake_args(lib));
    // The fake's cuBLAS halves a device's copy rate while a gemm is in flight on it.
    let mut env = FAKE_ENV.to_vec();
    env.push(("CHD_FAKE_LOAD_COPY_FACTOR", "0.5"));
    let out = chd(&args, &env);
    assert_ok(&out);
    let stderr = text(&out.stderr);
    assert!(stderr.contains("device load: cuBLAS from "), "{stderr}");
    let all = records(dir.path());
    let first_loaded = all.iter().position(|r| r["load"] == "device").unwrap();
    assert!(all[..first_loaded].iter().all(|r| r["load"] == "idle"));
    assert_eq!(all.len(), 2 * first_loaded);
    let summary = std::fs::read_to_string(dir.path().join("summary.md")).unwrap();
    for (device, idle, loaded) in [
        ("0", "12.30", "6.15"),
        ("1", "58.90", "29.45"),
        ("2", "58.90", "29.45"),
        ("3", "58.90", "29.45"),
    ] {
        let row = format!(
            "| H2D 1MiB h2d, pinned memory | device | {device} | {idle} | {loaded} | -50.0% |"
        );
        assert!(summary.contains(&row), "{row} missing from\n{summary}");
    }
}

#[test]
fn device_load_is_refused_with_the_reason() {
    // The host backend has no device to run a matrix multiply on.
    let out = chd(
        &[
            "probe",
            "h2d",
            "--backend",
            "host",
            "--sizes",
            "1MiB",
            "--load",
            "idle",
            "--load",
            "device",
        ],
        &[],
    );
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(
            "load profile \"device\" is not supported by the host backend: it has no \
             accelerator to run a matrix multiply on; use idle or cpu:N"
        ),
        "{stderr}"
    );
    // Nor does chd run one through the acl backend yet.
    let lib = fake::fake_runtime_path();
    let out = chd(
        &[
            "probe",
            "h2d",
            "--backend",
            "acl",
            "--acl-runtime",
            lib,
            "--sizes",
            "1MiB",
            "--load",
            "device",
        ],
        &FAKE_ENV,
    );
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("load profile \"device\" is not supported by the acl backend: "),
        "{stderr}"
    );
}

/// Issue 15: a run records each device's PCIe link as read after its copies (run.json), and
/// the report puts the link and the column's median over it beside each device. The gpu-node
/// fixture's GPUs: 0000:1a:00.0 at Gen5 x16, 0000:9c:00.0 trained at x8 of x16.
#[test]
fn run_records_each_devices_link_and_the_report_shows_its_efficiency() {
    let lib = fake::fake_runtime_path();
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/accelerators/gpu-node");
    let dir = tempfile::tempdir().unwrap();
    let sys = fixture.join("sys");
    let proc = fixture.join("proc");
    let cpu = allowed_cpus()[0].to_string();
    let mut args = vec![
        "--sysfs-root",
        sys.to_str().unwrap(),
        "--procfs-root",
        proc.to_str().unwrap(),
        "probe",
        "h2d",
        "--cpus",
        &cpu,
        "--sizes",
        "64MiB",
        "--iters",
        "2",
        "--repeats",
        "1",
        "--out",
        dir.path().to_str().unwrap(),
    ];
    args.extend(fake_args(lib));
    let out = chd(
        &args,
        &[
            ("CHD_FAKE_DEVICE_COUNT", "2"),
            ("CHD_FAKE_PCI_BUS_IDS", "0000:1A:00.0,0000:9C:00.0"),
            ("CHD_FAKE_H2D_GBPS", "49.8;1=9.45"),
        ],
    );
    assert_ok(&out);
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("run.json")).unwrap())
            .unwrap();
    let link = |i: usize| run["machine"]["devices"][i]["link"].clone();
    assert_eq!(
        link(1),
        serde_json::json!({"current_width": 8, "current_transfers_per_second": 32_000_000_000u64,
            "max_width": 16, "max_transfers_per_second": 32_000_000_000u64}),
        "{run}"
    );
    assert_eq!(link(0)["current_width"], 16, "{run}");
    let summary = std::fs::read_to_string(dir.path().join("summary.md")).unwrap();
    for (device, cells) in [
        ("0", "| x16 Gen5 of x16 Gen5, 63.0 GB/s | 0.79 |"),
        ("1", "| x8 Gen5 of x16 Gen5, 31.5 GB/s | 0.30 |"),
    ] {
        assert!(
            summary
                .lines()
                .any(|l| l.starts_with(&format!("| {device} | Fake H200 |")) && l.contains(cells)),
            "no row for device {device} with {cells} in\n{summary}"
        );
    }
}

/// CUDA creates device 0's context for any call that needs one on a thread that never set
/// its device (the fake records it like the runtime would): chd's probe threads set the
/// device first, so a run on devices 2 and 3 has contexts on 2 and 3 only (on silicon, no
/// memory and no `nvidia-smi` process entry on a GPU it does not probe).
#[test]
fn a_probe_opens_contexts_on_the_devices_it_probes_only() {
    let lib = fake::fake_runtime_path();
    let dir = tempfile::tempdir().unwrap();
    for kind in ["h2d", "d2d"] {
        let report = dir.path().join(format!("{kind}.exit"));
        let out_dir = dir.path().join(kind);
        let mut args = vec![
            "probe",
            kind,
            "--devices",
            "2,3",
            "--sizes",
            "1MiB",
            "--iters",
            "1",
            "--repeats",
            "1",
            "--out",
            out_dir.to_str().unwrap(),
        ];
        if kind == "h2d" {
            args.extend(["--cpus", "0"]);
        }
        args.extend(fake_args(lib));
        let mut env = FAKE_ENV.to_vec();
        env.push(("CHD_FAKE_EXIT_REPORT", report.to_str().unwrap()));
        let out = chd(&args, &env);
        assert_ok(&out);
        let text = std::fs::read_to_string(&report).unwrap();
        assert!(
            text.lines().any(|l| l == "context_devices=2,3"),
            "chd probe {kind} on devices 2,3:\n{text}"
        );
    }
}
