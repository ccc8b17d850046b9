//! `chd probe fabric` launched by a real Slurm (Debian's slurmctld, slurmd and munge, one node
//! in a scratch directory): `srun -n2` starts two ranks with the environment Slurm really sets
//! (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_STEP_NODELIST, SLURMD_NODENAME; chd is
//! given no rank flag), they meet at rank 0 (on the step's first host, this node: over
//! loopback), measure the loopback rail both ways, the node's first rank writes the results
//! into the state directory, and `chd serve` publishes them.

use std::time::Duration;

use serde_json::Value;

use crate::chd_process::{chd_bin, text, Chd};
use crate::slurm_cluster::{Cluster, NODE};

#[test]
fn srun_launches_two_ranks_that_rendezvous_from_slurms_own_environment() {
    let mut cluster = Cluster::start("fabric", "true");
    cluster.wait_until("the node registers (idle)", Duration::from_secs(120), |c| {
        c.node_state().0 == "idle"
    });
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let outputs = dir.path().join("task-%t.out");
    let port = (29900 + std::process::id() % 90).to_string();
    let state_arg = state.display().to_string();
    let out = cluster.srun(
        &[
            "-n2",
            "--overcommit",
            "--nodelist",
            NODE,
            "--output",
            outputs.to_str().unwrap(),
            chd_bin(),
            "probe",
            "fabric",
            "--rails",
            "^lo$",
            "--bytes",
            "8MiB",
            "--collective-sizes",
            "4MiB",
            "--port",
            &port,
            "--timeout",
            "60",
            "--state-dir",
            &state_arg,
            "--format",
            "json",
        ],
        &[("CHD_FABRIC_TOKEN", "slurm-fabric-token-0123456789")],
    );
    let task = |t: u32| {
        std::fs::read_to_string(dir.path().join(format!("task-{t}.out"))).unwrap_or_default()
    };
    assert!(
        out.status.success(),
        "srun: {}{}\ntask 0:\n{}\ntask 1:\n{}\n{}",
        text(&out.stdout),
        text(&out.stderr),
        task(0),
        task(1),
        cluster.logs()
    );
    for t in 0..2 {
        let body = task(t);
        let json = &body[body.find('{').unwrap_or_else(|| panic!("task {t}: {body}"))..];
        let printed: Value =
            serde_json::from_str(json).unwrap_or_else(|e| panic!("task {t}: {e}: {body}"));
        assert_eq!(printed["rank"], t, "{body}");
        assert_eq!(printed["world_size"], 2, "{body}");
        assert_eq!(printed["node"], NODE, "{body}");
        assert_eq!(printed["outcome"], "ok", "{body}");
        let rails = printed["results"][0]["rails"].as_array().unwrap();
        assert_eq!(rails.len(), 2, "{body}");
        assert!(
            rails.iter().all(|r| r["gbps"].as_f64().unwrap() > 0.0),
            "{body}"
        );
    }
    // One record, written by the node's first rank.
    let written: Vec<_> = std::fs::read_dir(state.join("fabric")).unwrap().collect();
    assert_eq!(written.len(), 1, "{written:?}");
    let serve = Chd::serve(&state, &["--no-probe"]);
    let scraped = serve.scrape();
    for way in ["send", "receive"] {
        assert!(
            scraped.contains(&format!(
                "chd_fabric_rail_gbps{{rail=\"lo\",direction=\"{way}\"}}"
            )),
            "{scraped}"
        );
    }
    assert!(
        scraped.contains("chd_fabric_runs{outcome=\"ok\"} 1"),
        "{scraped}"
    );
}
