//! `chd probe sweep` (size curves) through the fake CUDA runtime: a curve with a knee (the
//! fake's per-copy latency), a plateau and a planted dip, all named in the report; sweep.csv,
//! sweep.png and `chd report` re-rendering them; a failing device costing only its points;
//! resume; one device; the errors a user can make.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

use crate::chd_process::run_chd as chd;
use crate::chd_process::text;
use crate::common::{assert_ok, records, slot};
use crate::fake;
use crate::pair::fake_pair_args;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// The fake's model for these runs: 10 GB/s, 20 us per copy, 8 MiB at a tenth of the rate.
const GBPS: f64 = 10.0;
const LATENCY_S: f64 = 20e-6;
const DIP: u64 = 8 * MIB;
const FAKE: [(&str, &str); 4] = [
    ("CHD_FAKE_DEVICE_COUNT", "2"),
    ("CHD_FAKE_H2D_GBPS", "10"),
    ("CHD_FAKE_COPY_LATENCY_US", "20"),
    ("CHD_FAKE_SIZE_DIP", "8MiB=0.1"),
];

/// 128 KiB .. 16 MiB.
fn sizes() -> Vec<u64> {
    (0..8).map(|i| (128 * KIB) << i).collect()
}

fn sweep_args<'a>(lib: &'a str, out: &'a str, ops: &'a str) -> Vec<&'a str> {
    let mut args = vec![
        "probe",
        "sweep",
        "--from",
        "128KiB",
        "--to",
        "16MiB",
        "--ops",
        ops,
        "--warmup",
        "0",
        "--iterations",
        "2",
        "--repeats",
        "2",
        "--no-progress-bar",
        "--out",
        out,
    ];
    args.extend(fake_pair_args(lib));
    args
}

/// Where the latency model puts the plateau: the smallest size from which every size but the
/// dip reads within 5 % of the best, with `bytes / (bytes / rate + latency)`.
fn model_plateau() -> u64 {
    let rate = |n: u64| n as f64 / (n as f64 / (GBPS * 1e9) + LATENCY_S);
    let steady: Vec<u64> = sizes().into_iter().filter(|s| *s != DIP).collect();
    let max = steady.iter().map(|s| rate(*s)).fold(0.0, f64::max);
    let mut plateau = *steady.last().unwrap();
    for s in steady.iter().rev() {
        if rate(*s) < 0.95 * max {
            break;
        }
        plateau = *s;
    }
    plateau
}

/// `sweep.csv`'s rows as (op, device, size_bytes) -> the whole row's fields.
fn csv_rows(dir: &Path) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(dir.join("sweep.csv")).unwrap();
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("op,device,size,size_bytes,gbps,bytes_per_second,spread,samples,failed,flags,limit_gbps,last_error")
    );
    lines
        .map(|l| l.splitn(12, ',').map(String::from).collect())
        .collect()
}

fn assert_png(path: &Path) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{}", path.display());
    assert_eq!(&bytes[12..16], b"IHDR");
    let width = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    assert!(width >= 800 && height >= 400, "{width}x{height}");
}

#[test]
fn sweep_finds_the_planted_dip_and_the_plateau_and_report_rerenders_it() {
    let lib = fake::fake_runtime_path();
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("sweep");
    let out = chd(
        &sweep_args(lib, out_dir.to_str().unwrap(), "h2d,d2h,d2d,allgather"),
        &FAKE,
    );
    assert_ok(&out);
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert!(stderr.contains("8 sizes 128KiB..16MiB"), "{stderr}");

    // The samples: one CPU, every allgather sample with rank 1's CPU.
    let all = records(&out_dir);
    assert_eq!(
        all.len(),
        4 * 2 * 8 * 2,
        "4 ops x 2 devices x 8 sizes x 2 repeats"
    );
    let distinct: BTreeSet<String> = all.iter().map(slot).collect();
    assert_eq!(distinct.len(), all.len(), "no slot measured twice");
    assert!(all.iter().all(|r| r["matrix"] == "sweep"));
    let cpus: BTreeSet<u64> = all.iter().map(|r| r["cpu"].as_u64().unwrap()).collect();
    assert_eq!(cpus.len(), 1, "one CPU: {cpus:?}");
    for r in &all {
        assert_eq!(
            r["direction"] == "allgather",
            r.get("peer_cpu").is_some_and(Value::is_u64),
            "{r}"
        );
    }

    // sweep.csv: one row per (op, device, size).
    let rows = csv_rows(&out_dir);
    assert_eq!(rows.len(), 4 * 2 * 8);
    let keys: BTreeSet<(String, String, u64)> = rows
        .iter()
        .map(|r| (r[0].clone(), r[1].clone(), r[3].parse().unwrap()))
        .collect();
    assert_eq!(keys.len(), rows.len());
    for op in ["h2d", "d2h", "d2d", "allgather"] {
        for device in ["0", "1"] {
            for size in sizes() {
                assert!(
                    keys.contains(&(op.into(), device.into(), size)),
                    "{op} {device} {size}"
                );
            }
        }
    }
    let summary = std::fs::read_to_string(out_dir.join("summary.md")).unwrap();
    let plateau = model_plateau();
    assert_eq!(plateau, 4 * MIB, "the model's plateau for these settings");
    for op in ["h2d", "d2h"] {
        for device in ["0", "1"] {
            let curve: Vec<&Vec<String>> = rows
                .iter()
                .filter(|r| r[0] == op && r[1] == device)
                .collect();
            for r in &curve {
                let size: u64 = r[3].parse().unwrap();
                let gbps: f64 = r[4].parse().unwrap();
                let dip = if size == DIP { 0.1 } else { 1.0 };
                let want = size as f64 / (size as f64 / (GBPS * dip * 1e9) + LATENCY_S) / 1e9;
                assert!(
                    (gbps - want).abs() < 0.01 * want,
                    "{op} {device} {size}: {gbps} vs {want}"
                );
                assert_eq!(r[6], "0.0000", "the fake's samples agree exactly");
                assert_eq!(r[9], if size == DIP { "dip" } else { "" }, "{r:?}");
            }
            // The dip is a finding and named in summary.md, the plateau in its table.
            let finding = format!("dip at 8MiB: {op} device {device} reads 1.00 GB/s");
            assert!(stdout.contains(&format!("finding: {finding}")), "{stdout}");
            assert!(summary.contains(&format!("- {finding}")), "{summary}");
            assert!(
                summary.contains(&format!("| {op} | {device} | 4MiB | 9.88 | 8MiB | - | - |")),
                "{summary}"
            );
        }
    }
    // allgather: the pair probe's bus bandwidth on each device with its peer.
    for r in rows.iter().filter(|r| r[0] == "allgather") {
        assert_eq!(r[4], "13.700", "{r:?}");
    }
    assert!(summary.contains("## Size curves"), "{summary}");
    // Same-device copies: until the backend has them, every point fails as unsupported and
    // the report says so instead of plotting zeros; once it has them, the dip shows there too.
    let d2d: Vec<&Vec<String>> = rows.iter().filter(|r| r[0] == "d2d").collect();
    if d2d.iter().all(|r| r[9] == "unsupported") {
        assert!(
            d2d.iter().all(|r| r[4].is_empty() && r[7] == "0"),
            "{d2d:?}"
        );
        assert!(
            summary.contains("**d2d is not supported here** (devices 0, 1)"),
            "{summary}"
        );
        assert!(
            stderr.contains("note: d2d: 16 points not measured"),
            "{stderr}"
        );
        let reasons: BTreeSet<&str> = all
            .iter()
            .filter(|r| r["direction"] == "d2d")
            .map(|r| r["reason"].as_str().unwrap())
            .collect();
        assert_eq!(reasons, BTreeSet::from(["unsupported"]));
    } else {
        assert!(
            stdout.contains("finding: dip at 8MiB: d2d device 0"),
            "{stdout}"
        );
    }
    assert_png(&out_dir.join("sweep.png"));

    // chd report re-renders the same files from the run directory.
    let csv_before = std::fs::read_to_string(out_dir.join("sweep.csv")).unwrap();
    for f in ["sweep.csv", "sweep.png", "summary.md"] {
        std::fs::remove_file(out_dir.join(f)).unwrap();
    }
    let again = chd(&["report", out_dir.to_str().unwrap()], &[]);
    assert_ok(&again);
    assert_eq!(
        std::fs::read_to_string(out_dir.join("sweep.csv")).unwrap(),
        csv_before
    );
    assert_eq!(
        std::fs::read_to_string(out_dir.join("summary.md")).unwrap(),
        summary
    );
    assert_png(&out_dir.join("sweep.png"));
}

#[test]
fn a_failing_device_costs_only_its_points_and_a_sweep_resumes() {
    let lib = fake::fake_runtime_path();
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("sweep");
    let mut env = FAKE.to_vec();
    env.push(("CHD_FAKE_FAIL_DEVICES", "1"));
    let out = chd(&sweep_args(lib, out_dir.to_str().unwrap(), "h2d"), &env);
    assert!(!out.status.success(), "failed points make the run fail");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("8 of 16 cells could not be measured") && stderr.contains("device 1"),
        "{stderr}"
    );
    let rows = csv_rows(&out_dir);
    assert_eq!(rows.len(), 16);
    for r in &rows {
        if r[1] == "0" {
            assert!(!r[4].is_empty(), "device 0 measured: {r:?}");
        } else {
            assert_eq!((r[4].as_str(), r[9].as_str()), ("", "failed"), "{r:?}");
        }
    }
    let summary = std::fs::read_to_string(out_dir.join("summary.md")).unwrap();
    assert!(
        summary.contains("- h2d device 1: 8 of 8 points failed (copy failed"),
        "{summary}"
    );
    assert!(summary.contains("dip at 8MiB: h2d device 0"), "{summary}");

    // Resume: drop the second half of the samples, continue, and get every slot once.
    let cells = out_dir.join("cells.jsonl");
    let lines: Vec<String> = std::fs::read_to_string(&cells)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(lines.len(), 32);
    std::fs::write(&cells, lines[..10].join("\n") + "\n").unwrap();
    let mut args = sweep_args(lib, out_dir.to_str().unwrap(), "h2d");
    args.push("--resume");
    let resumed = chd(&args, &FAKE);
    assert_ok(&resumed);
    assert!(text(&resumed.stderr).contains("10 already measured, resuming"));
    let all = records(&out_dir);
    assert_eq!(all.len(), 32);
    let distinct: BTreeSet<String> = all.iter().map(slot).collect();
    assert_eq!(distinct.len(), 32);
    // A changed plan is refused, naming the flag.
    let mut args = sweep_args(lib, out_dir.to_str().unwrap(), "h2d,d2h");
    args.push("--resume");
    let refused = chd(&args, &FAKE);
    assert!(!refused.status.success());
    assert!(text(&refused.stderr).contains("--ops differ from the run being resumed"));
}

#[test]
fn one_device_skips_allgather_with_a_note_and_prints_a_table() {
    let lib = fake::fake_runtime_path();
    let mut args = vec![
        "probe",
        "sweep",
        "--from",
        "1MiB",
        "--to",
        "4MiB",
        "--ops",
        "h2d,allgather",
        "--iterations",
        "1",
        "--repeats",
        "1",
        "--no-progress-bar",
    ];
    args.extend(fake_pair_args(lib));
    let out = chd(&args, &[("CHD_FAKE_DEVICE_COUNT", "1")]);
    assert_ok(&out);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("note: allgather skipped: it needs two devices and the cuda backend has 1"),
        "{stderr}"
    );
    let stdout = text(&out.stdout);
    let rows: Vec<&str> = stdout.lines().skip(1).collect();
    assert_eq!(rows.len(), 3, "{stdout}");
    assert!(
        rows.iter().all(|l| l.trim_start().starts_with("h2d")),
        "{stdout}"
    );
}

#[test]
fn bad_sweep_flags_are_named() {
    let lib = fake::fake_runtime_path();
    let run = |extra: &[&str]| {
        let mut args = vec!["probe", "sweep"];
        args.extend_from_slice(extra);
        args.extend(fake_pair_args(lib));
        let out = chd(&args, &[("CHD_FAKE_DEVICE_COUNT", "2")]);
        assert!(!out.status.success(), "{extra:?} succeeded");
        text(&out.stderr)
    };
    let e = run(&["--from", "1GiB", "--to", "128KiB"]);
    assert!(e.contains("--from: 1GiB is larger than --to 128KiB"), "{e}");
    let e = run(&["--ops", "h2d,sideways"]);
    assert!(
        e.contains("--ops: unknown operation \"sideways\": expected h2d, d2h, d2d, allgather"),
        "{e}"
    );
    let e = run(&["--to", "16MB"]);
    assert!(
        e.contains("--to: \"16MB\": sizes are binary here; write 16MiB"),
        "{e}"
    );
    let e = run(&["--cpu", "100000"]);
    assert!(e.contains("--cpu: CPU 100000 is not an online CPU"), "{e}");
    let e = run(&["--devices", "7"]);
    assert!(e.contains("--devices: \"7\" is not a device"), "{e}");
    let e = run(&["--peer", "9"]);
    assert!(e.contains("--peer: \"9\" is not a device"), "{e}");
}
