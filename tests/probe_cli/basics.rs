//! `chd probe basics` end to end through the fake runtimes: a device with a planted slow
//! matmul and another with a planted slow H2D are the ones the table and the findings name,
//! under the idle and the device load (whose gemms share the device's compute); the table
//! goes to summary.md, basics.csv and the workbook, and `chd report` renders it again; what a
//! backend cannot measure (matmul on acl; matmul and the allgather on the host backend) is
//! said, not shown as zeros; bad flags name themselves.

use crate::chd_process::run_chd as chd;
use crate::chd_process::text;
use crate::common::{assert_ok, records};
use crate::fake;
use crate::xlsx::zip_names;

const ENV: [(&str, &str); 4] = [
    ("CHD_FAKE_DEVICE_COUNT", "3"),
    ("CHD_FAKE_GEMM_TFLOPS", "50;1=20"),
    ("CHD_FAKE_H2D_GBPS", "50;2=25"),
    ("CHD_FAKE_D2D_GBPS", "400;0=240"),
];

fn basics(dir: &str, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "probe",
        "basics",
        "--matrix-side",
        "256",
        "--size",
        "4MiB",
        "--iterations",
        "2",
        "--repeats",
        "2",
        "--no-progress-bar",
        "--out",
        dir,
    ]
    .map(String::from)
    .to_vec();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn run(args: &[String], env: &[(&str, &str)]) -> std::process::Output {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    chd(&refs, env)
}

#[test]
fn the_table_names_the_planted_weak_devices_under_each_load() {
    let lib = fake::fake_runtime_path();
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap();
    let args = basics(
        out_dir,
        &[
            "--load",
            "idle",
            "--load",
            "device",
            "--backend",
            "cuda",
            "--cuda-runtime",
            lib,
            "--nccl",
            lib,
        ],
    );
    let out = run(&args, &ENV);
    assert_ok(&out);
    let stdout = text(&out.stdout);
    let findings: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("finding: "))
        .collect();
    assert_eq!(
        findings,
        [
            "matmul (SGEMM), idle: device 1 at 20.0 TFLOPS, 0.40 x device 0 (50.0)",
            "matmul (SGEMM), device: device 1 at 10.0 TFLOPS, 0.40 x device 0 (25.0)",
            "H2D copy, idle: device 2 at 25.0 GB/s, 0.50 x device 0 (50.0)",
            "H2D copy, device: device 2 at 12.5 GB/s, 0.50 x device 0 (25.0)",
            "D2D copy (same device), idle: device 0 at 240.0 GB/s, 0.60 x device 1 (400.0)",
            "D2D copy (same device), device: device 0 at 120.0 GB/s, 0.60 x device 1 (200.0)",
        ],
        "{stdout}"
    );
    let summary = std::fs::read_to_string(dir.path().join("summary.md")).unwrap();
    for row in [
        "| matmul (SGEMM) | TFLOPS | idle | 20.0 (device 1) | 50.0 (device 0) | 0.40 | 3 | - |",
        "| H2D copy | GB/s | device | 12.5 (device 2) | 25.0 (device 0) | 0.50 | 3 | - |",
        // Pairs 0,1 and 1,2: every device once, the allgather not slowed by the gemms.
        "| allgather (2 ranks) | GB/s | device | 13.7 (device 0) | 13.7 (device 0) | 1.00 | 3 | - |",
        "| D2D copy (same device) | GB/s | idle | 240.0 (device 0) | 400.0 (device 1) | 0.60 | 3 | - |",
        "| 1 | 20.0 | 50.0 | 400.0 | 13.7 | 10.0 | 25.0 | 200.0 | 13.7 |",
    ] {
        assert!(summary.contains(row), "{row}\n{summary}");
    }
    // No heatmap for a table, and its cells stay out of the matrices' sections.
    assert!(!summary.contains("## H2D"), "{summary}");
    let csv = std::fs::read_to_string(dir.path().join("basics.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    // Per load: 3 matmul + 3 h2d + 3 d2d + 2 allgather pairs.
    assert_eq!(lines.len(), 1 + 2 * 11, "{csv}");
    assert_eq!(lines[1], "idle,matmul,TFLOPS,0,0,0,50.000,2,0,", "{csv}");
    assert!(
        lines.contains(&"device,h2d,GB/s,2,0,0,12.500,2,0,"),
        "{csv}"
    );
    let cells = std::fs::read_to_string(dir.path().join("cells.csv")).unwrap();
    assert_eq!(
        cells.lines().count(),
        1,
        "basics cells are not bandwidth cells: {cells}"
    );
    let sheets: Vec<String> = zip_names(&dir.path().join("report.xlsx"))
        .into_iter()
        .filter(|n| n.starts_with("xl/worksheets/sheet"))
        .collect();
    assert_eq!(sheets.len(), 3, "summary, cells, basics: {sheets:?}");
    // Every sample was recorded once, each device on a CPU of its own node.
    assert_eq!(records(dir.path()).len(), 2 * 2 * 11);
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("run.json")).unwrap())
            .unwrap();
    assert_eq!(run["plan"]["probe"], "basics");
    assert_eq!(run["plan"]["pairs"], serde_json::json!(["0,1", "1,2"]));
    assert_eq!(run["plan"]["device_cpus"].as_object().unwrap().len(), 3);

    // `chd report` renders the same table again.
    std::fs::remove_file(dir.path().join("summary.md")).unwrap();
    let out = chd(&["report", out_dir], &[]);
    assert_ok(&out);
    let again = std::fs::read_to_string(dir.path().join("summary.md")).unwrap();
    assert_eq!(again, summary);
}

#[test]
fn what_a_backend_cannot_measure_is_said_not_shown_as_zeros() {
    let lib = fake::fake_runtime_path();
    // acl: no matmul (cuBLAS is CUDA's); H2D, D2D and the HCCL allgather are measured.
    let dir = tempfile::tempdir().unwrap();
    let args = basics(
        dir.path().to_str().unwrap(),
        &["--backend", "acl", "--acl-runtime", lib, "--hccl", lib],
    );
    let out = run(&args, &[("CHD_FAKE_DEVICE_COUNT", "2")]);
    assert_ok(&out);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("note: matmul not measured: the acl backend has no matmul in chd yet"),
        "{stderr}"
    );
    let summary = std::fs::read_to_string(dir.path().join("summary.md")).unwrap();
    assert!(
        summary
            .contains("**Not measured: matmul (SGEMM).** the acl backend has no matmul in chd yet"),
        "{summary}"
    );
    assert!(!summary.contains("| matmul (SGEMM) |"), "{summary}");
    assert!(
        summary.contains("| allgather (2 ranks) | GB/s | idle | 13.7 (device 0) |"),
        "{summary}"
    );
    assert!(summary.contains("| H2D copy | GB/s | idle |"), "{summary}");
    assert!(
        summary.contains("| D2D copy (same device) | GB/s | idle | 400.0 (device 0) |"),
        "{summary}"
    );

    // The host backend: one device per NUMA node here, no matmul; an allgather needs a
    // collective library.
    let dir = tempfile::tempdir().unwrap();
    let args = basics(dir.path().to_str().unwrap(), &["--backend", "host"]);
    let out = run(&args, &[]);
    assert_ok(&out);
    let summary = std::fs::read_to_string(dir.path().join("summary.md")).unwrap();
    assert!(
        summary.contains(
            "**Not measured: matmul (SGEMM).** the host backend has no device to multiply on"
        ),
        "{summary}"
    );
    assert!(
        summary.contains("**Not measured: allgather (2 ranks).**"),
        "{summary}"
    );
    assert!(summary.contains("| H2D copy | GB/s | idle |"), "{summary}");
    // The host backend's same-device copy: between two buffers of the node.
    assert!(
        summary.contains("| D2D copy (same device) | GB/s | idle |"),
        "{summary}"
    );
    assert!(!summary.contains("not supported"), "{summary}");
}

#[test]
fn bad_basics_flags_name_themselves() {
    for (flag, value, want) in [
        (
            "--ops",
            "tflops",
            "--ops: unknown measurement \"tflops\": expected matmul, h2d, d2d or allgather",
        ),
        (
            "--size",
            "64MB",
            "--size: \"64MB\": sizes are binary here; write 64MiB",
        ),
        ("--matrix-side", "0", "--matrix-side: must be at least 1"),
        (
            "--devices",
            "9",
            "--devices: \"9\" is not a device of the host backend",
        ),
    ] {
        let out = chd(&["probe", "basics", "--backend", "host", flag, value], &[]);
        assert!(!out.status.success(), "{flag} {value}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(want), "{flag} {value}: {stderr}");
    }
}
