//! `chd report` end to end: a ClusterHealthDetect `results.json` (fixture and a generated
//! 640-CPU matrix) and a chd run directory rendered to summary.md, cells.csv, heatmap PNGs
//! and report.xlsx; what the summary names, what the CSV holds for failed rows, how big the
//! pictures are.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::chd_process::chd_bin;
use crate::xlsx::zip_names;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/reports")
        .join(name)
}

fn report(input: &Path, out: &Path) -> Output {
    let output = Command::new(chd_bin())
        .arg("report")
        .arg(input)
        .arg("--out")
        .arg(out)
        .output()
        .expect("run chd report");
    assert!(
        output.status.success(),
        "chd report failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Width and height from a PNG's IHDR chunk.
fn png_size(path: &Path) -> (u32, u32) {
    let b = std::fs::read(path).unwrap();
    assert_eq!(
        &b[..8],
        b"\x89PNG\r\n\x1a\n",
        "{} is not a PNG",
        path.display()
    );
    assert_eq!(&b[12..16], b"IHDR");
    let be = |s: &[u8]| u32::from_be_bytes([s[0], s[1], s[2], s[3]]);
    (be(&b[16..20]), be(&b[20..24]))
}

#[test]
fn cluster_health_results_name_the_slow_device_the_slow_rank_cpu_and_the_failure() {
    let dir = tempfile::tempdir().unwrap();
    let out = report(&fixture("cluster-health/results.json"), dir.path());
    let stdout = String::from_utf8_lossy(&out.stdout);
    for f in [
        "h2d_64MiB.png",
        "pair_0-5_64MiB.png",
        "cells.csv",
        "summary.md",
        "report.xlsx",
    ] {
        assert!(
            stdout.contains(&format!("wrote {}", dir.path().join(f).display())),
            "{stdout}"
        );
    }
    let summary = read(&dir.path().join("summary.md"));
    let findings: Vec<&str> = summary
        .split("## Findings\n\n")
        .nth(1)
        .unwrap()
        .lines()
        .take_while(|l| l.starts_with("- "))
        .collect();
    assert_eq!(
        findings,
        [
            "- device 0 is slow in 1 of 1 matrices: 0.22 x the typical device at worst, median 12.70 GB/s (H2D 64MiB h2d, unspecified memory, load idle)",
            "- 1 of 32 cells had failed samples (H2D 64MiB h2d, unspecified memory, load idle); see \"Failed cells\"",
            "- 1 slow rank 0 CPU (below 0.7 x the matrix median 13.70 GB/s): 3 (0.29) (Pair 0,5 allgather 64MiB, load idle)",
        ],
        "{summary}"
    );
    assert!(summary.contains("| hostname | a3-node-17 |"), "{summary}");
    assert!(summary.contains("| other tests (not shown) | nccl_allgather_2node x1 |"));
    assert!(
        summary.contains("| 6 | 2 | 1 | 0 | error: cudaErrorLaunchTimeout |"),
        "{summary}"
    );
    assert!(
        summary.contains("| NUMA 0 | 12.65 | 58.45 | 58.35 | 58.40 |"),
        "{summary}"
    );
    assert!(summary.contains("### NUMA x NUMA (median GB/s)"));

    // A failed row is a failure, not 0 GB/s.
    let csv = read(&dir.path().join("cells.csv"));
    let failed: Vec<&str> = csv
        .lines()
        .filter(|l| l.starts_with("h2d,idle,6,1,,2,"))
        .collect();
    assert_eq!(
        failed,
        ["h2d,idle,6,1,,2,64MiB,67108864,h2d,unspecified,,,0,1,error: cudaErrorLaunchTimeout"]
    );
    assert_eq!(csv.lines().filter(|l| l.starts_with("pair,")).count(), 64);

    let names = zip_names(&dir.path().join("report.xlsx"));
    let sheets: Vec<&String> = names
        .iter()
        .filter(|n| n.starts_with("xl/worksheets/sheet"))
        .collect();
    assert_eq!(
        sheets.len(),
        4,
        "summary, h2d, pair and cells sheets: {names:?}"
    );
    let (w, h) = png_size(&dir.path().join("h2d_64MiB.png"));
    assert!(w >= 560 && h >= 400, "{w}x{h}");
}

#[test]
fn a_run_directory_rerenders_with_each_load_against_idle() {
    let dir = tempfile::tempdir().unwrap();
    report(&fixture("run-loads"), dir.path());
    let summary = read(&dir.path().join("summary.md"));
    for row in [
        "| H2D 1MiB h2d, pinned memory | cpu:2 | 0 | 50.00 | 40.00 | -20.0% |",
        "| H2D 1MiB h2d, pinned memory | cpu:2 | 1 | 50.00 | 45.00 | -10.0% |",
        "| H2D 1MiB h2d, pinned memory | cpu:2 | all | 50.00 | 42.50 | -15.0% |",
        "| 0 | Fake H200 | 0 | 2 | 50.00 | 1.00 |",
        "| samples | 8 of 8 measured |",
    ] {
        assert!(summary.contains(row), "missing {row:?}:\n{summary}");
    }
    assert!(dir.path().join("h2d_1MiB_idle.png").is_file());
    assert!(dir.path().join("h2d_1MiB_cpu-2.png").is_file());
    // A run.json path works as well as its directory.
    let again = tempfile::tempdir().unwrap();
    report(&fixture("run-loads/run.json"), again.path());
    assert_eq!(read(&again.path().join("summary.md")), summary);
}

/// A results.json like the seed's A3 run: 640 CPUs on 8 NUMA nodes x 16 devices, device 0 at
/// ~12.7 GB/s, device 3 slow from CPU 320 on, one extreme cell.
fn seed_like_results(path: &Path) {
    let mut rows = Vec::new();
    for cpu in 0..640u32 {
        for d in 0..16u32 {
            let noise = f64::from((cpu * 31 + d * 17) % 11) * 0.05;
            let gbps = match (cpu, d) {
                (_, 0) => 12.7 + noise,
                (320.., 3) => 6.1,
                (77, 9) => 0.2,
                _ => 58.4 + noise,
            };
            rows.push(format!(
                r#"{{"test":"core_h2d_matrix","host_cpu":{cpu},"device_id":{d},"size_mb":64,"gbps":{gbps:.3},"status":"ok"}}"#
            ));
        }
    }
    let nodes: Vec<String> = (0..8)
        .map(|n| {
            let cpus: Vec<String> = (n * 80..(n + 1) * 80).map(|c: u32| c.to_string()).collect();
            format!(r#""{n}":{{"cpus":[{}]}}"#, cpus.join(","))
        })
        .collect();
    let text = format!(
        r#"{{"meta":{{"affinity_summary":{{"numa_nodes":{{{}}}}}}},"metrics":[{}]}}"#,
        nodes.join(","),
        rows.join(",\n")
    );
    std::fs::write(path, text).unwrap();
}

#[test]
fn a_640_cpu_matrix_gets_a_readable_picture_and_the_seed_findings() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("results.json");
    seed_like_results(&input);
    let out = dir.path().join("report");
    report(dir.path(), &out);
    // 2-pixel rows for 640 CPUs, at least 50 pixels per device column.
    let (w, h) = png_size(&out.join("h2d_64MiB.png"));
    assert!((640 * 2..1700).contains(&h), "height {h}");
    assert!(w >= 16 * 50, "width {w}");
    let summary = read(&out.join("summary.md"));
    for want in [
        "- device 0 is slow in 1 of 1 matrices: 0.22 x the typical device",
        "- device 3 is slow from NUMA 4, 5, 6, 7 in 1 of 1 matrices: 0.10 x its best NUMA segment",
        "- 1 extreme cell below 0.2 x its NUMA segment's median: CPU 77 -> device 9 0.20 GB/s",
        "| 77 | 0 | 9 | 0.20 | 0.00 |",
        "| NUMA 7 | 12.",
    ] {
        assert!(summary.contains(want), "missing {want:?}:\n{summary}");
    }
    assert!(!summary.contains("- device 1 is slow"), "{summary}");
}

#[test]
fn nothing_to_report_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(chd_bin())
        .arg("report")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("nothing to report (no run.json, results.json or affinity.json)"),
        "{stderr}"
    );
    let bad = dir.path().join("results.json");
    std::fs::write(&bad, "{\"metrics\": 3}").unwrap();
    let out = Command::new(chd_bin())
        .arg("report")
        .arg(&bad)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("not a ClusterHealthDetect results file: no \"metrics\" array"),
        "{stderr}"
    );
}

/// Issue 28 part 3: a sweep run of two H100 PCIe devices (NVML: 5120-bit memory bus at
/// 1593 MHz, so a same-device copy carries at most 1.02 TB/s) where device 0 reads an
/// impossible 1.9 TB/s at 32 MiB and device 1 stays in a cache at 16-64 MiB (~1 TB/s over a
/// ~424 GB/s large-size plateau): flagged, left out of maximum and plateau, explained.
#[test]
fn an_impossible_d2d_point_and_a_cache_resident_sweep_are_flagged_excluded_and_explained() {
    let dir = tempfile::tempdir().unwrap();
    let out = report(&fixture("sweep-physics"), dir.path());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary = read(&dir.path().join("summary.md"));
    for row in [
        "| d2d | 0 | 64MiB | 941.88 | - | - | - | - | 32MiB | 64MiB, 128MiB, 256MiB, 512MiB |",
        "| d2d | 1 | 128MiB | 501.00 | - | - | - | 16MiB, 32MiB, 64MiB | - | 128MiB, 256MiB, 512MiB |",
        "d2d device 0: 1 implausible point at 32MiB (1903.80 GB/s), above the path's limit of \
         1019.52 GB/s (device memory (NVML: 5120-bit bus at 1593 MHz) halved",
        "d2d device 1: cache-resident at 16MiB, 32MiB, 64MiB (981.96-1002.00 GB/s, above 1.5 x \
         the large-size plateau of 423.85 GB/s from 128MiB)",
        "a matrix should use 128MiB, 256MiB, 512MiB",
    ] {
        assert!(summary.contains(row), "missing {row:?}:\n{summary}");
    }
    assert!(stdout.contains("1 implausible point at 32MiB"), "{stdout}");
    let csv = read(&dir.path().join("sweep.csv"));
    assert!(
        csv.contains(
            "d2d,0,32MiB,33554432,1903.800,1903800000000,0.0040,2,0,implausible,1019.520,"
        ),
        "{csv}"
    );
    assert!(
        csv.contains("d2d,1,32MiB,33554432,1002.000,1002000000000,0.0040,2,0,cache-resident,,"),
        "{csv}"
    );
}

/// The same-device copy run chd wrote before issue 28 (`run-dirs/d2d`: three fake devices at
/// ~400 GB/s), with a small memory recorded for device 1 (256-bit bus at 1000 MHz: a copy at
/// most 32 GB/s): device 1 is implausible, has no ratio, and the typical device leaves it out.
#[test]
fn a_d2d_device_above_its_memory_is_implausible_and_out_of_the_typical_device() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/run-dirs/d2d");
    let run_dir = tempfile::tempdir().unwrap();
    let mut run: serde_json::Value = serde_json::from_str(&read(&src.join("run.json"))).unwrap();
    let devices = run["machine"]["devices"].as_array_mut().unwrap();
    let d1 = devices.iter_mut().find(|d| d["id"] == "1").unwrap();
    d1["memory"] = serde_json::json!({"bus_width_bits": 256, "max_clock_mhz": 1000});
    std::fs::write(run_dir.path().join("run.json"), run.to_string()).unwrap();
    std::fs::copy(src.join("cells.jsonl"), run_dir.path().join("cells.jsonl")).unwrap();
    let before = tempfile::tempdir().unwrap();
    report(&src, before.path());
    let plain = read(&before.path().join("summary.md"));
    let dir = tempfile::tempdir().unwrap();
    report(run_dir.path(), dir.path());
    let summary = read(&dir.path().join("summary.md"));
    assert!(!plain.contains("**implausible** ("), "{plain}");
    assert!(
        summary.contains("**implausible** (limit 32.00 GB/s)"),
        "{summary}"
    );
    assert!(
        summary.contains("device 1 reads ")
            && summary.contains("above its path's limit of 32.00 GB/s"),
        "{summary}"
    );
    assert!(summary.contains("1 of 3 devices implausible"), "{summary}");
    let row = summary
        .lines()
        .find(|l| l.starts_with("| 1 |") && l.contains("implausible"))
        .unwrap_or_else(|| panic!("{summary}"));
    assert!(row.contains("| - | **implausible**"), "no ratio: {row}");
}
