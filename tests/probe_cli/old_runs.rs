//! Run directories written by chd before the typed slots of issue 24 (commit 73ea187, one of
//! each probe kind: `tests/fixtures/run-dirs/`): a later chd reads every one, resumes it
//! without measuring any slot again (so each old slot line parses to the identity the planner
//! gives it now), and reports it with the values and failures it holds.

use std::path::{Path, PathBuf};

use crate::chd_process::run_chd as chd;
use crate::chd_process::text;
use crate::common::{assert_ok, lines_in};
use crate::fake;
use crate::golden::assert_golden;

const KINDS: [&str; 6] = ["h2d", "pair", "d2d", "p2p", "sweep", "basics"];

fn old_run(kind: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/run-dirs")
        .join(kind)
}

/// A copy of the old run directory to write into.
fn copy_of(kind: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for name in ["run.json", "cells.jsonl"] {
        std::fs::copy(old_run(kind).join(name), dir.path().join(name)).unwrap();
    }
    dir
}

/// The fake devices the runs were made with (README.md there).
const ENV: [(&str, &str); 2] = [
    ("CHD_FAKE_DEVICE_COUNT", "4"),
    (
        "CHD_FAKE_PCI_BUS_IDS",
        "0000:03:00.0,0000:04:00.0,0000:83:00.0,0000:84:00.0",
    ),
];

#[test]
fn every_kind_resumes_with_nothing_left_to_measure() {
    let lib = fake::fake_runtime_path();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/accelerators/p2p-node");
    let (sys, proc_) = (root.join("sys"), root.join("proc"));
    for kind in KINDS {
        let dir = copy_of(kind);
        let out = dir.path().to_str().unwrap();
        let before = lines_in(&dir.path().join("cells.jsonl"));
        assert!(before > 0, "{kind}: the fixture holds no sample");
        let run = chd(
            &[
                "--sysfs-root",
                sys.to_str().unwrap(),
                "--procfs-root",
                proc_.to_str().unwrap(),
                "probe",
                kind,
                "--out",
                out,
                "--resume",
                "--no-report",
                "--no-progress-bar",
                "--cuda-runtime",
                lib,
                "--nvml",
                lib,
                "--nccl",
                lib,
            ],
            &ENV,
        );
        let stderr = text(&run.stderr);
        // Runs whose fixture holds failed cells exit 1 naming them; none may measure more.
        assert!(
            stderr.contains(&format!("{before} already measured, resuming")),
            "{kind}: {stderr}"
        );
        assert_eq!(
            lines_in(&dir.path().join("cells.jsonl")),
            before,
            "{kind}: a resumed old run measured a slot again:\n{stderr}"
        );
    }
}

/// Every file `chd report` writes for an old run (summary.md, the CSVs, the pictures), kept
/// as `tests/golden/run-dirs/<kind>/`: text files compared line by line, pictures by their
/// SHA-256 (`pictures.sha256`); report.xlsx, whose zip entries carry the time, is left out.
#[test]
fn every_kind_reports_exactly_as_before() {
    for kind in KINDS {
        let out = tempfile::tempdir().unwrap();
        let run = chd(
            &[
                "report",
                old_run(kind).to_str().unwrap(),
                "--out",
                out.path().to_str().unwrap(),
            ],
            &[],
        );
        assert_ok(&run);
        let mut names: Vec<String> = std::fs::read_dir(out.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n != "report.xlsx")
            .collect();
        names.sort();
        let mut pictures = String::new();
        for name in &names {
            let bytes = std::fs::read(out.path().join(name)).unwrap();
            if name.ends_with(".png") {
                pictures.push_str(&format!("{}  {name}\n", sha256_hex(&bytes)));
            } else {
                assert_golden(&format!("run-dirs/{kind}/{name}"), &text(&bytes));
            }
        }
        assert_golden(&format!("run-dirs/{kind}/pictures.sha256"), &pictures);
        assert!(names.iter().any(|n| n == "summary.md"), "{kind}: {names:?}");
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
