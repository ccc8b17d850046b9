//! `chd probe` on this machine with the host backend: the run directory and its report,
//! cells to stdout without `--out`, the errors a user can make, the affinity probe.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::chd_process::run_chd as chd;
use crate::chd_process::text;
use crate::common::{assert_ok, cpu_count, records};

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
