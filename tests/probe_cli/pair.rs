//! `chd probe pair` (the core-pair matrix) through the fake CUDA runtime and its NCCL: the
//! planted slow CPU, a failing collective, the table without `--out`, mistakes, staged
//! peer copies.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::chd_process::allowed_cpus;
use crate::chd_process::run_chd as chd;
use crate::chd_process::text;
use crate::common::{assert_ok, records};
use crate::fake;
use crate::xlsx::zip_names;

/// The fake runtime as cuda backend with its NCCL.
pub(crate) fn fake_pair_args(lib: &str) -> Vec<&str> {
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

/// Every record's (rank 0 CPU, rank 1 CPU).
pub(crate) fn cpu_pairs(records: &[Value]) -> Vec<(u64, u64)> {
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
    let lib = fake::fake_runtime_path();
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

/// Two CPUs for the pair runs, as a `--cpus` list.
pub(crate) fn two_cpus() -> String {
    let cpus = allowed_cpus();
    assert!(cpus.len() >= 2, "this test needs two CPUs");
    format!("{},{}", cpus[0], cpus[cpus.len() - 1])
}

#[test]
fn pair_failing_collective_lists_the_failed_cells_and_fails() {
    let lib = fake::fake_runtime_path();
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
    let lib = fake::fake_runtime_path();
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
    let lib = fake::fake_runtime_path();
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

/// A pair cell whose rank 1 copies hang past the cell's deadline (the fake's
/// `CHD_FAKE_PAIR_HANG_ON=1`; rank 0's complete): rank 0 must not free the buffers rank 1's
/// copies still write into (the fake counts a buffer freed under a copy in flight,
/// `freed_under_copy`); it keeps them, and says so.
#[test]
fn a_rank_keeps_its_buffers_while_the_peer_s_copies_still_run() {
    let lib = fake::fake_runtime_path();
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("exit");
    let mut args = vec![
        "probe",
        "pair",
        "--pair",
        "0,1",
        "--cpus",
        "0",
        "--sizes",
        "1MiB",
        "--iterations",
        "2",
        "--warmup",
        "1",
        "--repeats",
        "4",
        "--timeout",
        "300ms",
        "--collective",
        "copy",
        "--backend",
        "cuda",
        "--cuda-runtime",
        lib,
        "--nvml",
        lib,
    ];
    args.push("--no-progress-bar");
    let out = chd(
        &args,
        &[
            ("CHD_FAKE_DEVICE_COUNT", "2"),
            // Shorter than the run (4 cells of 300 ms and their cleanup), so rank 1's first
            // copies wake up, and find their buffers, before chd exits.
            ("CHD_FAKE_PAIR_HANG_MS", "500"),
            ("CHD_FAKE_PAIR_HANG_ON", "1"),
            ("CHD_FAKE_EXIT_REPORT", report.to_str().unwrap()),
            ("RUST_LOG", "warn"),
        ],
    );
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "every cell times out: {stderr}");
    assert!(
        stderr.contains("rank 0 keeps its buffers (leaked, not freed under it)"),
        "{stderr}"
    );
    let exit = std::fs::read_to_string(&report).unwrap();
    assert!(
        exit.lines().any(|l| l == "freed_under_copy=0"),
        "a buffer was freed under a copy in flight:\n{exit}\n{stderr}"
    );
}
