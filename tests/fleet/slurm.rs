//! Issue 27: `chd check --slurm` as the `HealthCheckProgram` of a real Slurm (Debian's
//! slurmctld, slurmd and munge, 22.05 on bookworm), one node in a scratch directory
//! (`support/slurm_cluster.rs`). slurmd runs the program with `SLURMD_NODENAME` as its
//! whole environment: no `PATH`, no `SLURM_CONF`, so chd finds scontrol in the install paths
//! and the script gives the config. Each case switches the recording chd judges and waits for
//! at most two health checks of the new script: a failed recording drains the node with chd's
//! reason, a healthy one resumes it, an admin's drain stays whatever chd says, and with two
//! other nodes of the partition drained by chd already `--max-drained 2` keeps the node in
//! service (the log says why, the exit status is 4) while `--max-drained 3` lets it drain.
//! `sinfo -N -o '%N %T %E'` is printed before and after each case (`--nocapture`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::chd_process::{chd_bin, run_chd, text};
use crate::slurm_cluster::{Cluster, GHOSTS, HEALTH_CHECK_INTERVAL_S, NODE};

fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// The failed recording (device 0 slow from every CPU) and a healthy one, as tests/fleet/verdict.rs
/// and the README use them.
fn failed() -> PathBuf {
    fixture("tests/fixtures/replay/results-npu-node.json")
}

fn healthy() -> PathBuf {
    fixture("tests/fixtures/cluster-health/h2d-v1")
}

/// The health check's chd command line: `chd check --slurm` on `recording`, `extra` flags,
/// the cluster's config through SLURM_CONF (or `--slurm-conf`), no PATH.
fn chd_line(cluster: &Cluster, recording: &Path, extra: &str, conf_flag: bool) -> String {
    let conf = cluster.conf();
    let (env, flag) = if conf_flag {
        (String::new(), format!(" --slurm-conf {}", conf.display()))
    } else {
        (format!("SLURM_CONF={} ", conf.display()), String::new())
    };
    format!(
        "{env}{chd} check --slurm{flag} --replay {rec} {extra}",
        chd = chd_bin(),
        rec = recording.display()
    )
}

/// The causes `chd check` names for a recording (its line after `CHD LEVEL - `).
fn causes(recording: &Path) -> String {
    let out = run_chd(&["check", "--replay", recording.to_str().unwrap()], &[]);
    let line = text(&out.stdout);
    line.trim().split_once(" - ").unwrap().1.to_string()
}

/// Print `sinfo -N -o '%N %T %E'` (shown with `--nocapture`, and with a failure).
fn show(cluster: &Cluster, when: &str) {
    println!("--- {when}: sinfo -N -o '%N %T %E'\n{}", cluster.sinfo());
}

/// Wait until slurmctld hears from the node again, then [`show`]. A resume (chd's or an
/// admin's) marks the node not responding (`idle*`) until slurmctld's next ping of it comes
/// back, and slurmctld sends no health check to a node that is not responding.
fn before(cluster: &mut Cluster, stall: Duration, when: &str) {
    cluster.wait_until("the node responds", stall, |c| {
        !c.node_state().0.ends_with('*')
    });
    show(cluster, when);
}

#[test]
fn chd_check_drains_resumes_leaves_others_alone_and_stops_at_the_breaker() {
    let failed_reason = format!("chd: {}", causes(&failed()));
    assert!(
        failed_reason.starts_with("chd: device 0 slow column (0.2"),
        "{failed_reason}"
    );

    let mut cluster = Cluster::start("startup", "true");
    let boot = chd_line(&cluster, &healthy(), "", false);
    cluster.set_health_check("startup", &boot);
    // The node registers, and the health checks come at their interval: the waits below are
    // counted in health checks, and bounded in time only by how often they are seen to come.
    cluster.wait_until("the node registers (idle)", Duration::from_secs(120), |c| {
        c.node_state().0 == "idle"
    });
    cluster.wait_until(
        "three health checks of chd",
        Duration::from_secs(120),
        |c| c.runs_of("startup").len() >= 3,
    );
    let startup = cluster.runs_of("startup");
    let n = startup.len();
    let interval = startup[n - 1].at.duration_since(startup[n - 2].at);
    let stall = (interval * 20).max(Duration::from_secs(60));
    println!(
        "health checks every {interval:?} observed (HealthCheckInterval={HEALTH_CHECK_INTERVAL_S}); waits stall after {stall:?}"
    );
    assert!(
        startup.iter().all(|r| r.status == 0),
        "{startup:?}\n{}",
        cluster.logs()
    );
    // What slurmd gives a health check: SLURMD_NODENAME, no PATH, no SLURM_CONF.
    let env = cluster.health_check_env();
    assert!(env.contains(&format!("SLURMD_NODENAME={NODE}\n")), "{env}");
    assert!(!env.lines().any(|l| l.starts_with("PATH=")), "{env}");
    assert!(!env.contains("SLURM_CONF="), "{env}");

    // 1. A failed recording drains the node with chd's reason, within two health checks.
    before(&mut cluster, stall, "before case 1 (failed recording)");
    let line = chd_line(&cluster, &failed(), "", false);
    cluster.set_health_check("failed", &line);
    let drained = cluster.within_runs("failed", 2, stall, |c| {
        c.node_state() == ("drained".to_string(), failed_reason.clone())
    });
    show(&cluster, "after case 1");
    assert!(
        drained,
        "not drained with {failed_reason:?}: {:?}\n{}",
        cluster.node_state(),
        cluster.logs()
    );
    // The drain can be seen before the run that caused it is recorded: wait for that run, so
    // the exit codes below are never checked on no run at all.
    cluster.wait_until("a recorded run of case 1", stall, |c| {
        !c.runs_of("failed").is_empty()
    });
    let runs = cluster.runs_of("failed");
    assert!(runs.iter().all(|r| r.status == 2), "{runs:?}");
    assert!(
        cluster.chd_log().contains(&format!(
            "draining node {NODE} (IDLE), verdict failed: Reason=\"{failed_reason}\""
        )),
        "{}",
        cluster.chd_log()
    );

    // 2. A healthy recording resumes it (--slurm-conf instead of SLURM_CONF this time).
    before(&mut cluster, stall, "before case 2 (healthy recording)");
    let line = chd_line(&cluster, &healthy(), "", true);
    cluster.set_health_check("healthy", &line);
    let resumed = cluster.within_runs("healthy", 2, stall, |c| {
        c.node_state() == ("idle".to_string(), "none".to_string())
    });
    show(&cluster, "after case 2");
    assert!(
        resumed,
        "not resumed: {:?}\n{}",
        cluster.node_state(),
        cluster.logs()
    );
    assert!(cluster
        .chd_log()
        .contains(&format!("resuming node {NODE} (IDLE+DRAIN), verdict ok")));

    // 3. An admin's drain stays, failed or healthy.
    let admin = "admin: PSU swap, ticket 4711";
    let (ok, out) = cluster.scontrol(&[
        "update",
        &format!("NodeName={NODE}"),
        "State=DRAIN",
        &format!("Reason={admin}"),
    ]);
    assert!(ok, "{out}");
    before(
        &mut cluster,
        stall,
        "before case 3 (an admin's drain; failed, then healthy recording)",
    );
    for (case, recording) in [("admin-failed", failed()), ("admin-healthy", healthy())] {
        let line = chd_line(&cluster, &recording, "", false);
        cluster.set_health_check(case, &line);
        let changed = cluster.within_runs(case, 2, stall, |c| {
            c.node_state() != ("drained".to_string(), admin.to_string())
        });
        assert!(
            !changed,
            "{case}: the admin's drain changed: {:?}\n{}",
            cluster.node_state(),
            cluster.logs()
        );
    }
    show(&cluster, "after case 3");
    assert!(cluster.chd_log().contains(&format!(
        "leaving node {NODE} (IDLE+DRAIN) as it is, verdict failed: drained by someone else (reason \"{admin}\")"
    )));
    let (ok, out) = cluster.scontrol(&["update", &format!("NodeName={NODE}"), "State=RESUME"]);
    assert!(ok, "{out}");

    // 4. Two other nodes of the partition drained by chd: --max-drained 2 refuses a third.
    for ghost in &GHOSTS[..2] {
        let (ok, out) = cluster.scontrol(&[
            "update",
            &format!("NodeName={ghost}"),
            "State=DRAIN",
            &format!("Reason=chd: device 1 slow column (0.31 x the typical device) on {ghost}"),
        ]);
        assert!(ok, "{out}");
    }
    before(
        &mut cluster,
        stall,
        "before case 4 (two nodes drained by chd, --max-drained 2, failed recording)",
    );
    let line = chd_line(&cluster, &failed(), "--max-drained 2", false);
    cluster.set_health_check("breaker", &line);
    let drained = cluster.within_runs("breaker", 2, stall, |c| {
        !c.node_state().0.starts_with("idle")
    });
    show(&cluster, "after case 4");
    assert!(
        !drained,
        "drained past the breaker: {:?}\n{}",
        cluster.node_state(),
        cluster.logs()
    );
    let runs = cluster.runs_of("breaker");
    assert!(
        !runs.is_empty() && runs.iter().all(|r| r.status == 4),
        "exit 4 when the breaker refuses: {runs:?}"
    );
    let refused = format!(
        "circuit breaker: not draining node {NODE} (IDLE), verdict failed: 2 of the 5 nodes of partition debug already drained by chd, --max-drained allows 2"
    );
    assert!(
        cluster.chd_log().contains(&refused),
        "{}",
        cluster.chd_log()
    );

    // ... and --max-drained 3 lets it drain: the breaker was what held it.
    let line = chd_line(&cluster, &failed(), "--max-drained 3", false);
    cluster.set_health_check("breaker-3", &line);
    let drained = cluster.within_runs("breaker-3", 2, stall, |c| {
        c.node_state() == ("drained".to_string(), failed_reason.clone())
    });
    show(&cluster, "after case 4 with --max-drained 3");
    assert!(drained, "{:?}\n{}", cluster.node_state(), cluster.logs());

    // The others' drains were never chd's to undo: a healthy check resumes only its node.
    let line = chd_line(&cluster, &healthy(), "", false);
    cluster.set_health_check("end", &line);
    assert!(cluster.within_runs("end", 2, stall, |c| {
        c.node_state().0.starts_with("idle")
    }));
    let table = cluster.sinfo();
    for ghost in &GHOSTS[..2] {
        assert!(
            table
                .lines()
                .any(|l| l.starts_with(&format!("{ghost} drained"))
                    && l.contains(" chd: device 1 slow column")),
            "{table}"
        );
    }
    show(&cluster, "at the end (healthy recording)");
    drop(cluster);
}

/// Without a usable Slurm, `chd check --slurm` changes nothing and says why: exit 3 (unknown),
/// whatever the verdict. A fake scontrol logs what it is asked.
#[test]
fn chd_check_acts_on_nothing_when_slurm_cannot_be_read() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let calls = dir.path().join("calls");
    let fake = dir.path().join("scontrol");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\necho \"$*\" >> {}\n\
             echo 'slurm_load_node error: Unable to contact slurm controller (connect failure)' >&2\nexit 1\n",
            calls.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let failed = failed();
    let rec = failed.to_str().unwrap();
    let on_n1 = || {
        let scontrol = fake.to_str().unwrap();
        let args = [
            "check",
            "--slurm",
            "--scontrol",
            scontrol,
            "--slurm-node",
            "n1",
            "--replay",
            rec,
        ];
        run_chd(&args, &[])
    };
    let out = on_n1();
    let line = text(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{line}");
    assert!(
        line.starts_with("CHD UNKNOWN - cannot act on Slurm node n1: `")
            && line.contains("show nodes` exited with exit status: 1: slurm_load_node error: Unable to contact slurm controller")
            && line.trim_end().ends_with("(verdict: CHD FAILED - device 0 slow column (0.22 x the typical device); pair 0,3: CPU 6 as rank 0 slow (0.30 x the pair median))"),
        "{line}"
    );
    // It only read: no update was tried.
    assert_eq!(std::fs::read_to_string(&calls).unwrap(), "show nodes\n");

    // A node Slurm does not know, and no scontrol at all: unknown too.
    std::fs::write(
        &fake,
        "#!/bin/sh\nprintf 'NodeName=other Arch=x86_64\\n   State=IDLE ThreadsPerCore=1\\n\\n'\n",
    )
    .unwrap();
    let out = on_n1();
    assert_eq!(out.status.code(), Some(3));
    assert!(
        text(&out.stdout)
            .contains("node n1 is not in `scontrol show nodes` (is --slurm-node right?)"),
        "{}",
        text(&out.stdout)
    );
    let missing = dir.path().join("no-scontrol");
    let out = run_chd(
        &[
            "check",
            "--slurm",
            "--scontrol",
            missing.to_str().unwrap(),
            "--replay",
            rec,
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(3));
    assert!(
        text(&out.stdout).contains("not an executable file"),
        "{}",
        text(&out.stdout)
    );
    // Flags of --slurm need --slurm.
    let out = run_chd(&["check", "--max-drained", "3", "--replay", rec], &[]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--slurm"),
        "{}",
        text(&out.stderr)
    );
    let out = run_chd(
        &["check", "--slurm", "--max-drained", "lots", "--replay", rec],
        &[],
    );
    assert!(
        text(&out.stderr).contains("a node count (like 3) or a percentage (like 10%)"),
        "{}",
        text(&out.stderr)
    );
}
