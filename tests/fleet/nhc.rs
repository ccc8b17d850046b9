//! Issue 27 part 4: `deploy/nhc/chd.nhc`, chd's verdict as an LBNL NHC check. NHC itself is
//! not packaged for Debian, so the check runs in bash the way NHC runs a check (sourced, then
//! called with the arguments of its nhc.conf line) with NHC's `die` and `log` stand-ins: a
//! failing check calls `die 1 "<message>"` and returns 1 (NHC's README, "Writing Checks"; the
//! `die` of its `nhc` script marks the node offline with that message), a passing one returns
//! 0. The real chd binary judges the recordings. shellcheck passes on the script.

use std::path::PathBuf;
use std::process::Command;

use crate::chd_process::chd_bin;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Source the check with NHC stand-ins, run `check_chd_verdict ARGS`: (its return code, what
/// `die` was given, what `log` was given).
fn nhc(args: &str) -> (i32, String, String) {
    let script = format!(
        "function die() {{ echo \"$*\" >> \"$DIED\"; }}\n\
         function log() {{ echo \"$*\" >> \"$LOGGED\"; }}\n\
         . {check}\n\
         check_chd_verdict {args}\n",
        check = repo().join("deploy/nhc/chd.nhc").display()
    );
    let dir = tempfile::tempdir().unwrap();
    let (died, logged) = (dir.path().join("died"), dir.path().join("logged"));
    let out = Command::new("bash")
        .arg("-c")
        .arg(script)
        .env("CHD_BIN", chd_bin())
        .env("DIED", &died)
        .env("LOGGED", &logged)
        .output()
        .expect("bash");
    let read = |p: &PathBuf| std::fs::read_to_string(p).unwrap_or_default();
    (out.status.code().unwrap_or(-1), read(&died), read(&logged))
}

#[test]
fn the_nhc_check_fails_a_failed_node_and_passes_the_others() {
    let failed = repo().join("tests/fixtures/replay/results-npu-node.json");
    let healthy = repo().join("tests/fixtures/cluster-health/h2d-v1");
    let (ret, died, _) = nhc(&format!("--replay {}", failed.display()));
    assert_eq!(ret, 1);
    assert_eq!(
        died.trim(),
        "1 chd: device 0 slow column (0.22 x the typical device); pair 0,3: CPU 6 as rank 0 slow (0.30 x the pair median)"
    );
    assert_eq!(
        nhc(&format!("--replay {}", healthy.display())),
        (0, String::new(), String::new())
    );
    // No verdict passes, logged; a bad -d is an error of the check.
    let empty = tempfile::tempdir().unwrap();
    let (ret, died, logged) = nhc(&format!("--state-dir {}", empty.path().display()));
    assert_eq!((ret, died.as_str()), (0, ""));
    assert!(
        logged.starts_with("check_chd_verdict:  no verdict (CHD UNKNOWN - no state file "),
        "{logged}"
    );
    let (ret, died, _) = nhc("-d sometimes");
    assert_eq!(ret, 1);
    assert!(died.contains("-d takes failed or degraded"), "{died}");
}

#[test]
fn the_nhc_check_passes_shellcheck() {
    let out = Command::new("shellcheck")
        .args(["-s", "bash"])
        .arg(repo().join("deploy/nhc/chd.nhc"))
        .output()
        .unwrap_or_else(|e| panic!("shellcheck is needed (apt-get install shellcheck): {e}"));
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
