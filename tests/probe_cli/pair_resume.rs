//! `chd probe pair` resumed after SIGKILL and after Ctrl-C.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::chd_process::run_chd as chd;
use crate::chd_process::{chd_bin, text};
use crate::common::{assert_ok, records, slot, wait_for_lines, wait_with_timeout};
use crate::fake;
use crate::pair::{cpu_pairs, fake_pair_args, two_cpus};

/// Start a long pair run (2 x 2 CPUs x `repeats` samples, each collective delayed 5 ms).
pub(crate) fn start_long_pair_run(dir: &Path, cpus: &str, repeats: &str) -> Child {
    let lib = fake::fake_runtime_path();
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

pub(crate) const PAIR_RUN_ENV: [(&str, &str); 2] = [
    ("CHD_FAKE_DEVICE_COUNT", "2"),
    ("CHD_FAKE_PAIR_HANG_MS", "5"),
];

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
