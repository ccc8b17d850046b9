//! `chd report` on what ClusterHealthDetect's users keep (issue 28 part 1): the tool's xlsx
//! workbooks (H2D matrix, core-pair, NUMA affinity, the one with no matrix) and the size-sweep
//! JSON and CSV files, several at once, generated in the tool's exact layouts
//! (`scripts/gen-workbook.py`) with the odd shapes: empty cells, `nan`, `npu:N` devices, a
//! CPU whose samples all failed, a CPU that cannot be bound.

use std::path::Path;
use std::process::{Command, Output};

use crate::chd_process::chd_bin;
use crate::workbook_files::generate;

fn report(inputs: &[&Path], out: &Path) -> Output {
    Command::new(chd_bin())
        .arg("report")
        .args(inputs)
        .arg("--out")
        .arg(out)
        .output()
        .expect("run chd report")
}

fn ok(out: &Output) -> (String, String) {
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "chd report failed:\n{stderr}");
    (stdout, stderr)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn an_h2d_workbook_reports_its_matrices_and_names_every_odd_cell() {
    let dir = tempfile::tempdir().unwrap();
    let wb = generate("h2d", &dir.path().join("core-h2d.xlsx"));
    let out = dir.path().join("out");
    let (stdout, stderr) = ok(&report(&[&wb], &out));
    // Both sizes' sheets, devices npu:0..3 read as 0..3; NPU 1 is the slow column.
    assert!(out.join("h2d_16MiB.png").is_file() && out.join("h2d_64MiB.png").is_file());
    assert!(
        stdout.contains("finding: device 1 is slow in 2 of 2 matrices"),
        "{stdout}"
    );
    // CPU 7 failed every sample: no row in the sheets, and not bindable in Affinity.
    assert!(
        stdout.contains("finding: 1 of 8 CPUs cannot be bound: 7"),
        "{stdout}"
    );
    assert!(
        stderr.contains("Affinity: 1 CPU not bindable: 7 ([Errno 22] Invalid argument)"),
        "{stderr}"
    );
    // CPU 5 x NPU 2 has no ok sample (an empty cell); CPU 6 x NPU 3 is nan (column E, row 8).
    assert!(stderr.contains("H2D_16MB: 1 empty cell"), "{stderr}");
    assert!(
        stderr.contains("H2D_64MB: value nan (not a number) (first: core-h2d.xlsx H2D_64MB!E8)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("Summary:"),
        "the Summary sheet is named: {stderr}"
    );
    let csv = read(&out.join("cells.csv"));
    let cells = csv.lines().filter(|l| l.starts_with("h2d,")).count();
    // 7 CPUs x 4 devices x 2 sizes, less one empty and one nan cell per size.
    assert_eq!(cells, 2 * (7 * 4 - 2), "{csv}");
    let summary = read(&out.join("summary.md"));
    assert!(
        summary.contains("ClusterHealthDetect workbook"),
        "{summary}"
    );
}

#[test]
fn core_pair_and_numa_affinity_workbooks_report_what_they_hold() {
    let dir = tempfile::tempdir().unwrap();
    let pair = generate("pair", &dir.path().join("core-pair.xlsx"));
    let (_, stderr) = ok(&report(&[&pair], &dir.path().join("pair")));
    assert!(
        stderr.contains("does not name the core-pair matrix's device pair"),
        "{stderr}"
    );
    assert!(stderr.contains("D2D_8MB: 1 empty cell"), "{stderr}");
    let csv = read(&dir.path().join("pair/cells.csv"));
    assert_eq!(
        csv.lines().filter(|l| l.starts_with("pair,")).count(),
        8,
        "{csv}"
    );

    let numa = generate("numa", &dir.path().join("numa-affinity-heatmap.xlsx"));
    let out = dir.path().join("numa");
    let (stdout, stderr) = ok(&report(&[&numa], &out));
    // H2D under numa:0:shard reads (6.3..6.5) against none (4.2..4.5): +47 %, beyond the
    // spread of either policy's samples.
    assert!(
        stdout.contains(
            "finding: h2d device host_to_device: bind numa:0:shard against bind none: +47.1%"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("1 of 1 sizes differ by more than the points' spread"),
        "{stdout}"
    );
    assert!(
        stdout.contains("finding: 1 of 8 CPUs cannot be bound: 3"),
        "{stdout}"
    );
    assert!(stderr.contains("NUMA policy points"), "{stderr}");
    let summary = read(&out.join("summary.md"));
    assert!(
        summary.contains("### h2d device host_to_device: settings compared"),
        "{summary}"
    );
}

#[test]
fn a_workbook_without_a_matrix_and_a_file_chd_cannot_read_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let empty = generate("empty", &dir.path().join("empty.xlsx"));
    let out = report(&[&empty], &dir.path().join("out"));
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("a ClusterHealthDetect workbook with nothing chd can report"),
        "{e}"
    );
    assert!(e.contains("No core matrix metrics found"), "{e}");

    // Issue 28: a file of no shape chd reads said "not JSON" and repeated the parser's
    // message; now once, with what chd reads.
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "hello").unwrap();
    let out = report(&[&text], &dir.path().join("out"));
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert_eq!(e.matches("expected value").count(), 1, "{e}");
    assert!(e.contains("chd reads a chd run directory"), "{e}");
    assert!(
        e.contains("xlsx workbook") && e.contains("size-sweep"),
        "{e}"
    );

    // Several inputs are for sweep files only.
    let out = report(&[&empty, &text], &dir.path().join("out"));
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("empty.xlsx: several inputs are read together only"),
        "{e}"
    );
}

#[test]
fn sweep_files_of_several_settings_share_one_chart_and_table() {
    let dir = tempfile::tempdir().unwrap();
    let sweeps = generate("sweeps", &dir.path().join("sweeps"));
    let files: Vec<std::path::PathBuf> = ["copy", "hccl-default", "hccl-buff32", "hccl-buff1024"]
        .iter()
        .map(|n| sweeps.join(format!("{n}-sweep.json")))
        .collect();
    let inputs: Vec<&Path> = files.iter().map(|p| p.as_path()).collect();
    let out = dir.path().join("json");
    let (stdout, _) = ok(&report(&inputs, &out));
    assert!(out.join("sweep.png").is_file());
    let summary = read(&out.join("summary.md"));
    assert!(
        summary.contains("### allgather device 8: settings compared"),
        "{summary}"
    );
    assert!(
        summary.contains(
            "| size | HCCL_BUFFSIZE unset | HCCL_BUFFSIZE=32 | HCCL_BUFFSIZE=1024 | spread |"
        ),
        "{summary}"
    );
    // 1024: 20 % above from 64 MiB, beyond the curves' 3 % plateau scatter; 32: 2 % below
    // from 16 MiB, within it.
    assert!(
        stdout.contains(
            "HCCL_BUFFSIZE=1024 against HCCL_BUFFSIZE unset: +0.0% to +20.0% over 14 sizes; 5 of 14 sizes differ"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("HCCL_BUFFSIZE=32 against HCCL_BUFFSIZE unset: -2.0% to +0.0% over 14 sizes; every difference is within the points' spread"),
        "{stdout}"
    );
    let csv = read(&out.join("sweep.csv"));
    assert!(
        csv.contains("\nallgather,8 (HCCL_BUFFSIZE=1024),1GiB,"),
        "{csv}"
    );
    assert!(csv.contains("\nd2d,8,1GiB,"), "{csv}");

    // The CSV of the same sweep: the series name the settings.
    let out = dir.path().join("csv");
    let (stdout, _) = ok(&report(&[&sweeps.join("size-sweep.csv")], &out));
    assert!(
        stdout.contains(
            "allgather device not recorded: HCCL_BUFFSIZE=1024 against HCCL_BUFFSIZE unset"
        ),
        "{stdout}"
    );
}
