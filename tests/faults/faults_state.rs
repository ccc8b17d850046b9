//! Faults of the state directory, injected into a running `chd serve` (issue 14): its
//! state directory is a size-limited tmpfs in a private mount namespace
//! (`support/mount_ns.rs`) that the test fills to ENOSPC and remounts read-only. Every
//! failed save is a warning naming the path and the OS error and a count in
//! `chd_state_save_errors_total{reason}`; probing goes on in memory; a save that fails
//! half-way leaves the old `state.json` whole and no temp file; and the first save after
//! the directory recovers writes every cell measured meanwhile, which a second chd
//! (`--no-probe`) then serves with the same values.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::chd_process::{Chd, Metrics};
use crate::mount_ns::TmpfsChd;
use chd::format::state_file::{self, StateFile};

/// Probe every second, never skip for CPU load; 3 sizes x 2 directions per CPU, so that
/// state.json is larger than the one page the full disk leaves (the temp file's write
/// fails half-way).
const FAST: &[&str] = &[
    "--interval",
    "1s",
    "--window-budget",
    "500ms",
    "--cpu-busy-threshold",
    "1",
    "--sizes",
    "1,2,4",
    "--directions",
    "h2d,d2h",
    "--iterations",
    "2",
];

/// The tmpfs: room for a few state files, filled by the test.
const TMPFS_SIZE: &str = "256k";
const PAGE: u64 = 4096;

fn save_errors(m: &Metrics, reason: &str) -> f64 {
    m.value("chd_state_save_errors_total", &[("reason", reason)])
}

fn runs_ok(m: &Metrics) -> f64 {
    m.value(
        "chd_probe_runs_total",
        &[("probe", "h2d"), ("result", "ok")],
    )
}

type CellKey = (String, String, String, String);

fn served_cells(m: &Metrics) -> BTreeSet<CellKey> {
    m.find("chd_h2d_bandwidth_bytes_per_second", &[])
        .into_iter()
        .map(|s| {
            (
                s.labels["cpu"].clone(),
                s.labels["device"].clone(),
                s.labels["size_bytes"].clone(),
                s.labels["direction"].clone(),
            )
        })
        .collect()
}

fn file_cells(f: &StateFile) -> BTreeSet<CellKey> {
    f.h2d
        .iter()
        .filter(|c| !c.history.samples.is_empty())
        .map(|c| {
            (
                c.cpu.to_string(),
                c.device.clone(),
                c.size_bytes.to_string(),
                c.direction.clone(),
            )
        })
        .collect()
}

fn now() -> f64 {
    chd::store::unix_now()
}

/// Wait until the scrape shows at least `n` failed saves for `reason`.
fn wait_for_save_errors(t: &TmpfsChd, reason: &str, n: f64) -> Metrics {
    t.chd.wait_for(
        Duration::from_secs(30),
        &format!("{n} failed saves for {reason}"),
        |m| save_errors(m, reason) >= n,
    )
}

#[test]
fn full_and_read_only_state_dir_cost_no_cell() {
    let dir = tempfile::tempdir().unwrap();
    let t = TmpfsChd::start(dir.path(), TMPFS_SIZE, FAST);
    let state = dir.path().join("state.json");
    let log_path = state.display().to_string();

    // A first good save.
    let first = t
        .chd
        .wait_for(Duration::from_secs(30), "a measured cell", |m| {
            !served_cells(m).is_empty()
        });
    for reason in state_file::SAVE_ERROR_REASONS {
        assert_eq!(save_errors(&first, reason), 0.0, "{reason}");
    }
    // Saves until state.json is larger than a page (a few samples per cell).
    let start = Instant::now();
    while std::fs::metadata(t.path("state.json")).map_or(0, |m| m.len()) <= PAGE + 512 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "state.json did not outgrow a page; log:\n{}",
            t.chd.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !dir.path().join("state.json").exists(),
        "the tmpfs leaked to the host's mount namespace"
    );

    // 1. The disk fills, leaving one page: the temp file's write fails half-way.
    let outage_start = now();
    t.fill(PAGE);
    let full = wait_for_save_errors(&t, "no_space", 2.0);
    let kept = std::fs::read(t.path("state.json")).unwrap();
    assert!(kept.len() as u64 > PAGE, "state.json shrank");
    let kept_file = state_file::decode(&kept).expect("the old state.json is whole");
    // No temp file is left to keep the disk full: the page is free again between saves.
    let mut clean = 0;
    for _ in 0..20 {
        if !t.path("state.json.tmp").exists() && t.free_bytes() >= PAGE {
            clean += 1;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(clean > 0, "state.json.tmp stays behind on the full disk");
    assert_eq!(
        std::fs::read(t.path("state.json")).unwrap(),
        kept,
        "state.json changed on a full disk"
    );

    // 2. The directory turns read-only, still full.
    t.remount("ro");
    let read_only = wait_for_save_errors(&t, "read_only", 2.0);
    // 3. Writable again but still full: the reason follows the error.
    let no_space_before = save_errors(&read_only, "no_space");
    t.remount("rw");
    let during = wait_for_save_errors(&t, "no_space", no_space_before + 1.0);
    assert_eq!(save_errors(&during, "other"), 0.0);
    assert_eq!(save_errors(&during, "permission"), 0.0);

    // Probing went on in memory all along.
    assert!(
        runs_ok(&during) > runs_ok(&full),
        "no probe window ran while the state directory was broken"
    );
    let last_success = during.value(
        "chd_probe_last_success_timestamp_seconds",
        &[("probe", "h2d")],
    );
    assert!(last_success > outage_start);
    assert_eq!(std::fs::read(t.path("state.json")).unwrap(), kept);
    let measured_in_outage = served_cells(&during);

    // The log: one warning per run of the same error, naming the path and the OS error.
    let log = t.chd.log();
    for error in [
        "No space left on device (os error 28)",
        "Read-only file system (os error 30)",
    ] {
        let warning = format!("cannot write state file {log_path}: {error}");
        assert!(
            log.lines()
                .any(|l| l.contains(" WARN ") && l.contains(&warning)),
            "no warning {warning:?}; log:\n{log}"
        );
    }
    let failed = save_errors(&during, "no_space") + save_errors(&during, "read_only");
    let warnings = log
        .lines()
        .filter(|l| l.contains(" WARN ") && l.contains("cannot write state file"))
        .count();
    assert_eq!(
        warnings, 3,
        "one warning per run of one error (full, read-only, full), not one per failed save \
         ({failed}); log:\n{log}"
    );

    // 4. Space again: the next save writes everything measured meanwhile.
    let recovered_at = now();
    std::fs::remove_file(t.path("filler")).unwrap();
    let start = Instant::now();
    let saved = loop {
        let bytes = std::fs::read(t.path("state.json")).unwrap();
        let file = state_file::decode(&bytes).expect("state.json is always whole");
        if file.saved_at > recovered_at {
            break bytes;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no save after the disk was freed; log:\n{}",
            t.chd.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let after = Metrics::parse(&t.chd.scrape());
    let counted = state_file::SAVE_ERROR_REASONS
        .iter()
        .map(|r| save_errors(&after, r))
        .sum::<f64>();
    t.chd.wait_for_log(
        &format!("state saved to {log_path} again, the whole matrix, after {counted} failed saves"),
        Duration::from_secs(10),
    );
    drop(t);

    let saved_file = state_file::decode(&saved).unwrap();
    assert!(
        saved_file.last_success["h2d"] >= last_success,
        "the window that ended at {last_success} (during the outage) is not in the saved file"
    );
    let outage_samples = saved_file
        .h2d
        .iter()
        .flat_map(|c| &c.history.samples)
        .filter(|s| s.at > outage_start && s.at < recovered_at)
        .count();
    assert!(
        outage_samples > 0,
        "no sample measured during the outage was saved"
    );
    let cells = file_cells(&saved_file);
    assert!(
        cells.is_superset(&measured_in_outage) && cells.is_superset(&file_cells(&kept_file)),
        "cells lost: saved {cells:?}, served during the outage {measured_in_outage:?}"
    );

    // 5. A second chd serves exactly the saved cells, with the saved values.
    let again_dir = tempfile::tempdir().unwrap();
    std::fs::write(again_dir.path().join("state.json"), &saved).unwrap();
    let mut args = FAST.to_vec();
    args.push("--no-probe");
    let again = Chd::serve(again_dir.path(), &args);
    let m = Metrics::parse(&again.scrape());
    assert_eq!(served_cells(&m), cells);
    let store = chd::store::persist::decode(&saved).unwrap();
    for (key, cell) in store.h2d() {
        let Some(median) = cell.median() else {
            continue;
        };
        let size = key.size_bytes.to_string();
        let cpu = key.cpu.to_string();
        let served = m.value(
            "chd_h2d_bandwidth_bytes_per_second",
            &[
                ("cpu", cpu.as_str()),
                ("device", key.device.as_str()),
                ("size_bytes", size.as_str()),
                ("direction", key.direction.as_str()),
            ],
        );
        // Served in whole bytes per second.
        assert!(
            (served - median).abs() <= 0.5,
            "{key:?}: served {served}, saved {median}"
        );
    }
    eprintln!(
        "tmpfs {TMPFS_SIZE}; state.json {} bytes; {counted} saves failed ({} no_space, {} \
         read_only), then one succeeded with {} cells ({} samples from the outage)",
        saved.len(),
        save_errors(&after, "no_space"),
        save_errors(&after, "read_only"),
        cells.len(),
        outage_samples
    );
}
