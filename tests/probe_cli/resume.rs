//! Resume after SIGKILL and after Ctrl-C: no sample measured twice or lost.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::chd_process::run_chd as chd;
use crate::chd_process::{chd_bin, text};
use crate::common::{assert_ok, cpu_count, records, slot, wait_for_lines, wait_with_timeout};

/// Start a long host-backend run (2 x 150 x `repeats` samples of 8 MiB) in `dir`.
pub(crate) fn start_long_run(dir: &Path, repeats: &str) -> Child {
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
