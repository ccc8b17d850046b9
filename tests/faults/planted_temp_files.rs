//! Symlinks and FIFOs planted where chd writes (issue 30 items 2 and 3). The NFD feature
//! directory is group-writable, so the kernel's protected-symlink and FIFO rules do not apply
//! there; state and run directories may be shared too. Before issue 30 chd wrote through
//! fixed temp names with a plain create: a symlink at one made chd overwrite its target, and
//! a FIFO hung the scheduler (one window in 12 s at a 3 s interval) and SIGTERM could not
//! save. Here every temp name chd ever used (`.chd.tmp` beside the feature file,
//! `state.json.tmp`, `.chd-write-test`, `run.json.tmp`) holds a symlink to a file of someone
//! else's or a FIFO, while the real binary runs: the targets stay untouched, windows keep
//! ending, the feature file and the state are written, and SIGTERM exits and saves. (The
//! names chd uses now are random and created with `O_EXCL | O_NOFOLLOW`; planting at those is
//! tested on the opening itself, `format::atomic_file`.)

use crate::chd_process;

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::chd_process::{run_chd, text, Chd};
use chd::format::state_file;

/// Probe every second, never skip for CPU load, small cells.
const FAST: &[&str] = &[
    "--backend",
    "host",
    "--interval",
    "1s",
    "--window-budget",
    "300ms",
    "--cpu-busy-threshold",
    "1",
    "--sizes",
    "1",
    "--iterations",
    "2",
];

const PRECIOUS: &str = "someone else's file\n";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Plant {
    Symlink,
    Fifo,
}

/// Plant `what` at `at`; a symlink points at `victim`.
fn plant(what: Plant, at: &Path, victim: &Path) {
    match what {
        Plant::Symlink => std::os::unix::fs::symlink(victim, at).unwrap(),
        Plant::Fifo => {
            nix::unistd::mkfifo(at, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap()
        }
    }
}

/// `at` still holds what was planted there.
fn still_planted(what: Plant, at: &Path) {
    let t = std::fs::symlink_metadata(at)
        .unwrap_or_else(|e| panic!("{} is gone: {e}", at.display()))
        .file_type();
    let ok = match what {
        Plant::Symlink => t.is_symlink(),
        Plant::Fifo => t.is_fifo(),
    };
    assert!(ok, "{}: {t:?}, planted a {what:?}", at.display());
}

fn probed_windows(chd: &Chd) -> usize {
    chd.log().matches("probe window done").count()
}

/// One `chd serve` with `fifo_or_link` planted at the old temp names of the feature file and
/// the state file, and the other kind at the write test's.
fn serve_among(at_temp_names: Plant) {
    let other = match at_temp_names {
        Plant::Symlink => Plant::Fifo,
        Plant::Fifo => Plant::Symlink,
    };
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, PRECIOUS).unwrap();
    let state = dir.path().join("state");
    let features = dir.path().join("features.d");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::create_dir_all(&features).unwrap();
    let planted: Vec<(Plant, PathBuf)> = vec![
        (at_temp_names, features.join(".chd.tmp")),
        (at_temp_names, state.join("state.json.tmp")),
        (other, state.join(".chd-write-test")),
    ];
    for (what, at) in &planted {
        plant(*what, at, &victim);
    }
    let nfd = features.join("chd");
    let mut args = FAST.to_vec();
    args.extend(["--nfd-features-file", nfd.to_str().unwrap()]);
    let chd = Chd::serve(&state, &args);
    // Windows keep ending (by count, with a generous bound for a loaded machine).
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while probed_windows(&chd) < 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "{at_temp_names:?}: only {} windows ended; log:\n{}",
            probed_windows(&chd),
            chd.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let labels = std::fs::read_to_string(&nfd).expect("the feature file");
    assert!(
        labels.contains("chd.feature.node.kubernetes.io/verdict="),
        "{labels}"
    );
    let (status, log) = chd.terminate();
    assert!(status.success(), "{at_temp_names:?}: {status}; log:\n{log}");
    for failure in [
        "cannot write the NFD feature file",
        "probing goes on with the matrix in memory",
        "stopping without",
        "has not finished",
    ] {
        assert!(
            !log.contains(failure),
            "{at_temp_names:?}: {failure:?} in\n{log}"
        );
    }
    let saved = state_file::decode(&std::fs::read(state.join("state.json")).unwrap())
        .expect("state.json saved at exit");
    assert!(!saved.h2d.is_empty(), "the cells measured were saved");

    assert_eq!(std::fs::read_to_string(&victim).unwrap(), PRECIOUS);
    for (what, at) in &planted {
        still_planted(*what, at);
    }
    // Nothing of chd's own is left behind but its two files.
    for (d, mine) in [(&features, "chd"), (&state, "state.json")] {
        let names: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !planted.iter().any(|(_, p)| p.ends_with(n)))
            .collect();
        assert_eq!(names, [mine], "{}", d.display());
    }
}

#[test]
fn serve_writes_past_fifos_planted_at_its_old_temp_names() {
    serve_among(Plant::Fifo);
}

#[test]
fn serve_writes_past_symlinks_planted_at_its_old_temp_names() {
    serve_among(Plant::Symlink);
}

#[test]
fn probe_writes_run_json_past_a_symlink_or_fifo_at_its_old_temp_name() {
    for what in [Plant::Symlink, Plant::Fifo] {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, PRECIOUS).unwrap();
        let out = dir.path().join("run");
        std::fs::create_dir(&out).unwrap();
        let tmp = out.join("run.json.tmp");
        plant(what, &tmp, &victim);
        let cpu = chd_process::allowed_cpus()[0].to_string();
        let ran = run_chd(
            &[
                "probe",
                "h2d",
                "--backend",
                "host",
                "--cpus",
                &cpu,
                "--sizes",
                "1MiB",
                "--iters",
                "1",
                "--repeats",
                "1",
                "--out",
                out.to_str().unwrap(),
            ],
            &[],
        );
        assert!(ran.status.success(), "{what:?}: {}", text(&ran.stderr));
        let run: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("run.json")).unwrap()).unwrap();
        assert!(run.get("format").is_some(), "{run}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), PRECIOUS);
        still_planted(what, &tmp);
    }
}
