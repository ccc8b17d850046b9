//! `chd probe` end to end through the real binary: a run directory with its report on this
//! machine (host backend), resume after SIGKILL and after Ctrl-C with no sample measured
//! twice or lost, load profiles, a planted slow device through the fake CUDA runtime, the
//! affinity probe, and the errors a user can make.

#[path = "support/chd_process.rs"]
mod chd_process;
#[path = "support/fake_runtime.rs"]
mod fake;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use chd_process::{chd_bin, run_chd as chd, text};
use serde_json::Value;

fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "chd failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// The sample records of a run directory, each line parsed.
fn records(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("cells.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}")))
        .collect()
}

/// A record's slot identity (everything but the measurement).
fn slot(r: &Value) -> String {
    let mut o = r.as_object().unwrap().clone();
    for k in ["bytes_per_second", "error", "reason", "at"] {
        o.remove(k);
    }
    serde_json::to_string(&o).unwrap()
}

fn lines_in(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|t| t.matches('\n').count())
        .unwrap_or(0)
}

/// Start a long host-backend run (2 x 150 x `repeats` samples of 8 MiB) in `dir`.
fn start_long_run(dir: &Path, repeats: &str) -> Child {
    Command::new(chd_bin())
        .args(["probe", "h2d", "--backend", "host", "--cpus", "auto"])
        .args([
            "--sizes",
            "8MiB",
            "--iters",
            "4",
            "--warmup",
            "1",
            "--repeats",
            repeats,
        ])
        .arg("--out")
        .arg(dir)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn chd probe")
}

/// Wait until `dir/cells.jsonl` has at least `n` lines.
fn wait_for_lines(child: &mut Child, dir: &Path, n: usize) {
    let start = Instant::now();
    while lines_in(&dir.join("cells.jsonl")) < n {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the run ended ({status}) before {n} samples were written");
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "fewer than {n} samples after 60 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn wait_with_timeout(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("chd did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn cpu_count() -> usize {
    let out = chd(&["topology", "--json", "--backend", "host"], &[]);
    assert_ok(&out);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["cpus"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["allowed"].as_bool().unwrap_or(true))
        .count()
}

#[test]
fn probe_on_this_machine_writes_summary_csv_png_and_xlsx() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("x");
    let out = chd(
        &[
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
            out_dir.to_str().unwrap(),
        ],
        &[],
    );
    assert_ok(&out);
    let stderr = text(&out.stderr);
    let cpus = cpu_count();
    let devices = records(&out_dir)
        .iter()
        .map(|r| r["device"].as_str().unwrap().to_string())
        .collect::<BTreeSet<_>>()
        .len();
    let total = cpus * devices * 2 * 2;
    // Not a terminal: plain progress lines, the last one complete.
    assert!(
        stderr.contains(&format!("progress: {total}/{total} samples (100.0%)")),
        "{stderr}"
    );
    for f in [
        "summary.md",
        "cells.csv",
        "h2d_1MiB.png",
        "h2d_4MiB.png",
        "report.xlsx",
        "run.json",
    ] {
        let len = std::fs::metadata(out_dir.join(f))
            .unwrap_or_else(|_| panic!("{f} missing"))
            .len();
        assert!(len > 100, "{f} is only {len} bytes");
    }
    assert_eq!(records(&out_dir).len(), total);
    let png = std::fs::read(out_dir.join("h2d_1MiB.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let xlsx = std::fs::read(out_dir.join("report.xlsx")).unwrap();
    assert_eq!(&xlsx[..2], b"PK", "an xlsx is a zip file");
    let summary = std::fs::read_to_string(out_dir.join("summary.md")).unwrap();
    for want in [
        "## Findings",
        "## H2D 1MiB h2d, pageable memory, load idle",
        "## H2D 4MiB h2d",
        "| GB/s | min | p10 | median | p90 | max |",
        "### Devices",
        "### NUMA segment x device",
        "### Slowest cores",
        "### Failed cells\n\nNone.",
    ] {
        assert!(
            summary.contains(want),
            "summary.md lacks {want:?}:\n{summary}"
        );
    }
    let csv = std::fs::read_to_string(out_dir.join("cells.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + cpus * devices * 2, "{csv}");
    assert!(
        text(&out.stdout).contains("wrote "),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn sigkill_mid_run_then_resume_measures_every_slot_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let repeats = "150";
    let mut child = start_long_run(&run, repeats);
    wait_for_lines(&mut child, &run, 10);
    child.kill().unwrap(); // SIGKILL: no handler runs.
    child.wait().unwrap();
    let before = std::fs::read_to_string(run.join("cells.jsonl")).unwrap();
    let total = cpu_count() * 150;
    let complete = before.matches('\n').count();
    assert!(
        complete >= 10 && complete < total,
        "{complete} of {total} before the kill"
    );
    // A write torn by a crash: resuming drops it and measures that slot again.
    let mut torn = before.clone();
    torn.push_str("{\"matrix\":\"h2d\",\"load\":\"id");
    std::fs::write(run.join("cells.jsonl"), &torn).unwrap();

    // The plan comes from run.json; a conflicting flag is refused.
    let bad = chd(
        &[
            "probe",
            "h2d",
            "--out",
            run.to_str().unwrap(),
            "--resume",
            "--sizes",
            "4MiB",
        ],
        &[],
    );
    assert!(!bad.status.success());
    assert!(
        text(&bad.stderr).contains("--sizes differ"),
        "{}",
        text(&bad.stderr)
    );

    let out = chd(
        &["probe", "h2d", "--out", run.to_str().unwrap(), "--resume"],
        &[],
    );
    assert_ok(&out);
    assert!(
        text(&out.stderr).contains(&format!(
            "{} already measured, resuming",
            before.matches('\n').count()
        )),
        "{}",
        text(&out.stderr)
    );
    let after = std::fs::read_to_string(run.join("cells.jsonl")).unwrap();
    assert!(
        after.starts_with(&before),
        "samples measured before the kill were rewritten"
    );
    let all = records(&run);
    assert_eq!(
        all.len(),
        total,
        "every slot once: {} lines for {total} slots",
        all.len()
    );
    let distinct: BTreeSet<String> = all.iter().map(slot).collect();
    assert_eq!(distinct.len(), total, "a slot was measured twice");
    let passes: BTreeSet<u64> = all.iter().map(|r| r["pass"].as_u64().unwrap()).collect();
    assert_eq!(passes.len(), 150);
    assert!(run.join("summary.md").is_file());
}

#[test]
fn ctrl_c_stops_cleanly_keeps_samples_and_resume_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut child = start_long_run(&run, "150");
    wait_for_lines(&mut child, &run, 5);
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let out = wait_with_timeout(child, Duration::from_secs(30));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let kept = std::fs::read_to_string(run.join("cells.jsonl")).unwrap();
    assert!(kept.ends_with('\n'), "the cell in flight was not completed");
    let n = kept.lines().count();
    let total = cpu_count() * 150;
    assert!(
        stderr.contains(&format!("interrupted after {n} of {total} samples; continue with: chd probe h2d --out {} --resume", run.display())),
        "{stderr}"
    );
    // The partial run is already reported.
    let summary = std::fs::read_to_string(run.join("summary.md")).unwrap();
    assert!(
        summary.contains(&format!("{n} of {total} measured")),
        "{summary}"
    );

    let out = chd(
        &["probe", "h2d", "--out", run.to_str().unwrap(), "--resume"],
        &[],
    );
    assert_ok(&out);
    let all = records(&run);
    let distinct: BTreeSet<String> = all.iter().map(slot).collect();
    assert_eq!((all.len(), distinct.len()), (total, total));
}

fn fake_args(lib: &str) -> Vec<&str> {
    vec!["--backend", "cuda", "--cuda-runtime", lib, "--nvml", lib]
}

const FAKE_ENV: [(&str, &str); 2] = [
    ("CHD_FAKE_DEVICE_COUNT", "4"),
    ("CHD_FAKE_H2D_GBPS", "58.9;0=12.3"),
];

#[test]
fn planted_slow_device_is_the_one_the_summary_names() {
    let lib = fake::fake_runtime().to_str().unwrap();
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
    assert!(records(dir.path())
        .iter()
        .all(|r| r["host_memory"] == "pinned" && r["bytes_per_second"].as_f64().is_some()));
}

#[test]
fn load_profiles_run_once_each_and_the_report_compares_them_with_idle() {
    let lib = fake::fake_runtime().to_str().unwrap();
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
    // Idle first, then the loaded profile.
    let first_loaded = all.iter().position(|r| r["load"] == "cpu:1").unwrap();
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
    let lib = fake::fake_runtime().to_str().unwrap();
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
    let lib = fake::fake_runtime().to_str().unwrap();
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

#[test]
fn without_out_the_cells_go_to_stdout() {
    let out = chd(
        &[
            "probe",
            "h2d",
            "--backend",
            "host",
            "--cpus",
            "0",
            "--sizes",
            "1",
            "--iters",
            "1",
            "--repeats",
            "1",
            "--format",
            "csv",
        ],
        &[],
    );
    assert_ok(&out);
    let stdout = text(&out.stdout);
    let mut lines = stdout.lines();
    assert!(lines
        .next()
        .unwrap()
        .starts_with("matrix,load,cpu,numa_node"));
    let row = lines.next().unwrap();
    assert!(row.starts_with("h2d,idle,0,"), "{stdout}");
}

#[test]
fn mistakes_are_explained() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    for (args, want) in [
        (
            vec!["probe", "h2d", "--backend", "host", "--sizes", "64MB"],
            "sizes are binary here; write 64MiB",
        ),
        (
            vec!["probe", "h2d", "--backend", "host", "--load", "busy"],
            "not a load profile",
        ),
        (
            vec!["probe", "h2d", "--backend", "host", "--devices", "7"],
            "is not a device of the host backend",
        ),
        (vec!["probe", "h2d", "--resume"], "--out"),
        (
            vec!["probe", "h2d", "--backend", "host", "--out", d, "--resume"],
            "holds no run to resume",
        ),
    ] {
        let out = chd(&args, &[]);
        assert!(!out.status.success(), "{args:?} succeeded");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
}

#[test]
fn affinity_probe_checks_every_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let out = chd(
        &[
            "probe",
            "affinity",
            "--format",
            "json",
            "--out",
            dir.path().to_str().unwrap(),
        ],
        &[],
    );
    assert_ok(&out);
    let stdout = text(&out.stdout);
    let json_end = stdout.rfind(']').unwrap();
    let rows: Vec<Value> = serde_json::from_str(&stdout[..=json_end]).unwrap();
    assert_eq!(rows.len(), cpu_count());
    assert!(rows.iter().all(|r| r["bindable"] == true), "{stdout}");
    assert!(dir.path().join("affinity.json").is_file());
    let report = chd(&["report", dir.path().to_str().unwrap()], &[]);
    assert_ok(&report);
    let summary = std::fs::read_to_string(dir.path().join("summary.md")).unwrap();
    assert!(
        summary.contains(&format!("{n} of {n} CPUs can be bound", n = rows.len())),
        "{summary}"
    );
}

// ---- chd probe pair (the core-pair matrix) through the fake CUDA runtime + NCCL ----

/// The fake runtime as cuda backend with its NCCL.
fn fake_pair_args(lib: &str) -> Vec<&str> {
    vec![
        "--backend",
        "cuda",
        "--cuda-runtime",
        lib,
        "--nvml",
        lib,
        "--nccl",
        lib,
        "--collective",
        "nccl",
    ]
}

/// The CPUs this process may use, ascending.
fn allowed_cpus() -> Vec<u32> {
    chd::topology::Topology::read(&chd::topology::Roots::default())
        .unwrap()
        .allowed_cpus()
        .map(|c| c.id)
        .collect()
}

/// File names in a zip's central directory (an xlsx is a zip).
fn zip_names(path: &Path) -> Vec<String> {
    let b = std::fs::read(path).unwrap();
    let mut names = Vec::new();
    let mut i = 0;
    while i + 46 <= b.len() {
        if b[i..i + 4] == [0x50, 0x4b, 0x01, 0x02] {
            let n = u16::from_le_bytes([b[i + 28], b[i + 29]]) as usize;
            names.push(String::from_utf8_lossy(&b[i + 46..i + 46 + n]).into_owned());
            i += 46 + n;
        } else {
            i += 1;
        }
    }
    names
}

/// Every record's (rank 0 CPU, rank 1 CPU).
fn cpu_pairs(records: &[Value]) -> Vec<(u64, u64)> {
    records
        .iter()
        .map(|r| {
            (
                r["cpu"].as_u64().unwrap(),
                r["peer_cpu"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("no peer_cpu in {r}")),
            )
        })
        .collect()
}

#[test]
fn pair_matrix_names_the_planted_slow_rank0_cpu_and_only_it() {
    let lib = fake::fake_runtime().to_str().unwrap();
    let cpus = allowed_cpus();
    assert!(cpus.len() >= 2, "this test needs two CPUs");
    let slow = *cpus.last().unwrap();
    let spec = format!("13.7;rank0:{slow}=4.0");
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("pair");
    let mut args = vec![
        "probe",
        "pair",
        "--pair",
        "0,1",
        "--cpus",
        "all",
        "--sizes",
        "16MiB",
        "--repeats",
        "1",
        "--out",
        out_dir.to_str().unwrap(),
    ];
    args.extend(fake_pair_args(lib));
    let out = chd(
        &args,
        &[
            ("CHD_FAKE_DEVICE_COUNT", "2"),
            ("CHD_FAKE_PAIR_GBPS", &spec),
        ],
    );
    assert_ok(&out);
    let n = cpus.len();
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("progress: {t}/{t} samples (100.0%)", t = n * n)),
        "{stderr}"
    );

    // One record per (rank 0 CPU, rank 1 CPU), every one measured.
    let all = records(&out_dir);
    assert_eq!(all.len(), n * n);
    let distinct: BTreeSet<(u64, u64)> = cpu_pairs(&all).into_iter().collect();
    let want: BTreeSet<(u64, u64)> = cpus
        .iter()
        .flat_map(|&a| cpus.iter().map(move |&b| (u64::from(a), u64::from(b))))
        .collect();
    assert_eq!(distinct, want);
    assert!(all.iter().all(|r| r["matrix"] == "pair"
        && r["device"] == "0,1"
        && r["direction"] == "allgather"
        && r["size_bytes"] == 16u64 << 20
        && r["bytes_per_second"].as_f64().is_some()));

    // The findings name rank 0's planted CPU and nothing else.
    let stdout = text(&out.stdout);
    let findings: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("finding: "))
        .collect();
    assert_eq!(findings.len(), 1, "{stdout}");
    assert!(
        findings[0].starts_with("finding: 1 slow rank 0 CPU (below 0.7 x the matrix median"),
        "{stdout}"
    );
    assert!(findings[0].contains(&format!("): {slow} (0.")), "{stdout}");
    assert!(
        findings[0].ends_with("(Pair 0,1 allgather 16MiB, load idle)"),
        "{stdout}"
    );
    let summary = std::fs::read_to_string(out_dir.join("summary.md")).unwrap();
    assert!(
        summary.contains("## Pair 0,1 allgather 16MiB, load idle"),
        "{summary}"
    );
    assert!(!summary.contains("slow rank 1"), "{summary}");
    let slow_rows: Vec<&str> = summary
        .lines()
        .filter(|l| l.ends_with("| **slow** |"))
        .collect();
    assert!(
        slow_rows.len() == 1 && slow_rows[0].starts_with(&format!("| 0 | {slow} | ")),
        "{summary}"
    );
    assert!(summary.contains("### Failed cells\n\nNone."), "{summary}");

    // The picture and the workbook.
    let png = std::fs::read(out_dir.join("pair_0-1_16MiB.png")).expect("pair_0-1_16MiB.png");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let xlsx = std::fs::read(out_dir.join("report.xlsx")).unwrap();
    assert_eq!(&xlsx[..2], b"PK");
    let sheets = zip_names(&out_dir.join("report.xlsx"))
        .into_iter()
        .filter(|n| n.starts_with("xl/worksheets/sheet"))
        .count();
    assert_eq!(sheets, 3, "summary, pair_0-1_16MiB and cells sheets");
    let csv = std::fs::read_to_string(out_dir.join("cells.csv")).unwrap();
    assert_eq!(
        csv.lines().filter(|l| l.starts_with("pair,")).count(),
        n * n
    );
}

/// Start a long pair run (2 x 2 CPUs x `repeats` samples, each collective delayed 5 ms).
fn start_long_pair_run(dir: &Path, cpus: &str, repeats: &str) -> Child {
    let lib = fake::fake_runtime().to_str().unwrap();
    Command::new(chd_bin())
        .args(["probe", "pair", "--pair", "0,1", "--cpus", cpus])
        .args([
            "--sizes",
            "1MiB",
            "--iters",
            "1",
            "--warmup",
            "0",
            "--repeats",
            repeats,
        ])
        .arg("--out")
        .arg(dir)
        .args(fake_pair_args(lib))
        .envs(PAIR_RUN_ENV)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn chd probe pair")
}

const PAIR_RUN_ENV: [(&str, &str); 2] = [
    ("CHD_FAKE_DEVICE_COUNT", "2"),
    ("CHD_FAKE_PAIR_HANG_MS", "5"),
];

/// Two CPUs for the pair runs, as a `--cpus` list.
fn two_cpus() -> String {
    let cpus = allowed_cpus();
    assert!(cpus.len() >= 2, "this test needs two CPUs");
    format!("{},{}", cpus[0], cpus[cpus.len() - 1])
}

#[test]
fn pair_sigkill_mid_run_then_resume_measures_every_slot_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let cpus = two_cpus();
    let repeats = 150;
    let total = 4 * repeats;
    let mut child = start_long_pair_run(&run, &cpus, &repeats.to_string());
    wait_for_lines(&mut child, &run, 10);
    child.kill().unwrap(); // SIGKILL: no handler runs.
    child.wait().unwrap();
    let before = std::fs::read_to_string(run.join("cells.jsonl")).unwrap();
    let complete = before.matches('\n').count();
    assert!(
        complete >= 10 && complete < total,
        "{complete} of {total} before the kill"
    );
    // A write torn by the kill: resuming drops it and measures that slot again.
    let mut torn = before.clone();
    torn.push_str("{\"matrix\":\"pair\",\"load\":\"id");
    std::fs::write(run.join("cells.jsonl"), &torn).unwrap();

    // The other subcommand, or a different plan, is refused.
    let wrong = chd(
        &["probe", "h2d", "--out", run.to_str().unwrap(), "--resume"],
        &[],
    );
    assert!(!wrong.status.success());
    assert!(
        text(&wrong.stderr).contains(&format!(
            "holds a chd probe pair run; continue it with: chd probe pair --out {} --resume",
            run.display()
        )),
        "{}",
        text(&wrong.stderr)
    );
    let bad = chd(
        &[
            "probe",
            "pair",
            "--out",
            run.to_str().unwrap(),
            "--resume",
            "--sizes",
            "4MiB",
        ],
        &PAIR_RUN_ENV,
    );
    assert!(!bad.status.success());
    assert!(
        text(&bad.stderr).contains("--sizes differ"),
        "{}",
        text(&bad.stderr)
    );

    // The runtime flags (fake libraries, nccl) come from run.json too.
    let out = chd(
        &["probe", "pair", "--out", run.to_str().unwrap(), "--resume"],
        &PAIR_RUN_ENV,
    );
    assert_ok(&out);
    assert!(
        text(&out.stderr).contains(&format!("{complete} already measured, resuming")),
        "{}",
        text(&out.stderr)
    );
    let after = std::fs::read_to_string(run.join("cells.jsonl")).unwrap();
    assert!(
        after.starts_with(&before),
        "samples measured before the kill were rewritten"
    );
    let all = records(&run);
    assert_eq!(all.len(), total, "every slot once: {} lines", all.len());
    let distinct: BTreeSet<String> = all.iter().map(slot).collect();
    assert_eq!(distinct.len(), total, "a slot was measured twice");
    // Every (rank 0, rank 1) cell once per pass.
    let mut per_cell: BTreeMap<(u64, u64), usize> = BTreeMap::new();
    for p in cpu_pairs(&all) {
        *per_cell.entry(p).or_default() += 1;
    }
    assert_eq!(per_cell.len(), 4, "{per_cell:?}");
    assert!(per_cell.values().all(|&k| k == repeats), "{per_cell:?}");
    assert!(run.join("summary.md").is_file());
    assert!(run.join("pair_0-1_1MiB.png").is_file());
}

#[test]
fn pair_ctrl_c_stops_cleanly_and_says_how_to_resume() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut child = start_long_pair_run(&run, &two_cpus(), "150");
    wait_for_lines(&mut child, &run, 5);
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let out = wait_with_timeout(child, Duration::from_secs(30));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let kept = std::fs::read_to_string(run.join("cells.jsonl")).unwrap();
    assert!(kept.ends_with('\n'), "the cell in flight was not completed");
    let n = kept.lines().count();
    assert!(
        stderr.contains(&format!(
            "interrupted after {n} of 600 samples; continue with: chd probe pair --out {} --resume",
            run.display()
        )),
        "{stderr}"
    );
    let summary = std::fs::read_to_string(run.join("summary.md")).unwrap();
    assert!(
        summary.contains(&format!("{n} of 600 measured")),
        "{summary}"
    );
}

#[test]
fn pair_failing_collective_lists_the_failed_cells_and_fails() {
    let lib = fake::fake_runtime().to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cpus = two_cpus();
    let mut args = vec![
        "probe",
        "pair",
        "--pair",
        "0,1",
        "--cpus",
        &cpus,
        "--sizes",
        "1MiB",
        "--repeats",
        "1",
        "--out",
        dir.path().to_str().unwrap(),
    ];
    args.extend(fake_pair_args(lib));
    let out = chd(
        &args,
        &[("CHD_FAKE_DEVICE_COUNT", "2"), ("CHD_FAKE_PAIR_FAIL", "1")],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("chd: 4 of 4 cells could not be measured (see \"Failed cells\" in summary.md); first: rank 0 on CPU"),
        "{stderr}"
    );
    assert!(stderr.contains("collective failed: "), "{stderr}");
    // Every attempt is recorded with its error.
    let all = records(dir.path());
    assert_eq!(all.len(), 4);
    assert!(all.iter().all(|r| r["reason"] == "collective"
        && r["bytes_per_second"].is_null()
        && r["error"]
            .as_str()
            .unwrap()
            .starts_with("collective failed: ")));
    let summary = std::fs::read_to_string(dir.path().join("summary.md")).unwrap();
    let failures = summary
        .split("### Failed cells")
        .nth(1)
        .unwrap_or_else(|| panic!("no failed cells section:\n{summary}"));
    assert!(
        failures.contains("| rank 0 CPU | rank 1 CPU | failed | ok | last error |"),
        "{summary}"
    );
    let rows: Vec<&str> = failures
        .lines()
        .filter(|l| l.contains("| 1 | 0 | collective failed: "))
        .collect();
    assert_eq!(rows.len(), 4, "{summary}");
    assert!(
        text(&out.stdout).contains(
            "finding: 4 of 4 cells had failed samples (Pair 0,1 allgather 1MiB, load idle)"
        ),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn pair_table_without_out_and_pair_mistakes() {
    let lib = fake::fake_runtime().to_str().unwrap();
    let env = [("CHD_FAKE_DEVICE_COUNT", "2")];
    // What scripts/gpu-check.sh runs.
    let mut args = vec![
        "probe",
        "pair",
        "--pair",
        "auto",
        "--cpus",
        "per-node:2",
        "--sizes",
        "1",
        "--repeats",
        "1",
        "--format",
        "table",
    ];
    args.extend(fake_pair_args(lib));
    let out = chd(&args, &env);
    assert_ok(&out);
    let stdout = text(&out.stdout);
    let mut lines = stdout.lines();
    let header = lines.next().unwrap();
    assert!(
        header.split_whitespace().collect::<Vec<_>>()
            == [
                "pair",
                "cpu0",
                "numa0",
                "cpu1",
                "numa1",
                "size",
                "operation",
                "GB/s",
                "samples",
                "note"
            ],
        "{stdout}"
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split_whitespace().collect()).collect();
    assert!(!rows.is_empty(), "{stdout}");
    for r in &rows {
        assert_eq!(r[0], "0,1", "{stdout}");
        assert_eq!(&r[5..9], ["1MiB", "allgather", "13.70", "1"], "{stdout}");
    }
    let cpus: BTreeSet<&str> = rows.iter().map(|r| r[1]).collect();
    assert_eq!(rows.len(), cpus.len() * cpus.len(), "{stdout}");

    for (extra, want) in [
        (
            vec!["--pair", "0,7"],
            "--pair: pair 0,7: there is no device 7 (devices: 0, 1)",
        ),
        (vec!["--pair", "0,0"], "--pair: "),
        (
            vec!["--timeout", "soon"],
            "--timeout: \"soon\" is not a duration",
        ),
        (
            vec!["--sizes", "16MB"],
            "sizes are binary here; write 16MiB",
        ),
    ] {
        let mut args = vec!["probe", "pair"];
        args.extend(extra.iter().copied());
        args.extend(fake_pair_args(lib));
        let out = chd(&args, &env);
        assert!(!out.status.success(), "{extra:?} succeeded");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(want), "{extra:?}: {stderr}");
        assert!(
            !stderr.contains("progress:"),
            "{extra:?} measured: {stderr}"
        );
    }
    // No accelerator: said plainly.
    let out = chd(&["probe", "pair", "--backend", "host"], &[]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("the pair probe needs "), "{stderr}");
}

#[test]
fn pair_peer_copies_without_peer_access_are_recorded_as_copy_staged() {
    let lib = fake::fake_runtime().to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("staged");
    let out = chd(
        &[
            "probe",
            "pair",
            "--pair",
            "0,1",
            "--cpus",
            &two_cpus(),
            "--sizes",
            "4MiB",
            "--repeats",
            "1",
            "--out",
            out_dir.to_str().unwrap(),
            "--backend",
            "cuda",
            "--cuda-runtime",
            lib,
            "--nvml",
            lib,
            "--collective",
            "copy",
        ],
        &[
            ("CHD_FAKE_DEVICE_COUNT", "2"),
            ("CHD_FAKE_NO_PEER", "0,1"),
            ("CHD_FAKE_STAGED_GBPS", "3"),
        ],
    );
    assert_ok(&out);
    let stderr = text(&out.stderr);
    assert!(stderr.contains("pair probe: copy (peer-copy)"), "{stderr}");
    assert!(
        stderr.contains("note: pair 0,1: peer access refused") && stderr.contains("copy-staged"),
        "{stderr}"
    );
    // Measured anyway, at the host-staged rate.
    let all = records(&out_dir);
    assert!(!all.is_empty());
    for r in &all {
        let v = r["bytes_per_second"].as_f64().unwrap();
        assert!((v - 3e9).abs() < 0.01 * 3e9, "{r}");
    }
    // The run says so: run.json for a resume or a later report, and the summary.
    let run: Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("run.json")).unwrap()).unwrap();
    assert_eq!(run["pair_methods"]["0,1"], "copy-staged", "{run}");
    assert_eq!(
        run["runtime"]["collective"], "copy",
        "the choice, for --resume"
    );
    let summary = std::fs::read_to_string(out_dir.join("summary.md")).unwrap();
    assert!(summary.contains("0,1: copy-staged"), "{summary}");
}
