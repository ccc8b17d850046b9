//! The fabric round of `deploy/slurm/chd-fabric-round.sbatch`, submitted to a real Slurm of
//! two nodes (Debian's slurmctld, two slurmd on this machine, `slurmd -N`): the script pairs
//! the job's nodes with `chd fabric rounds`, runs one `srun` step of two tasks per pair, each
//! task a `chd probe fabric` rank that knows who it is from Slurm's own environment; rank 1
//! finds rank 0's node, whose Slurm name does not resolve, at its `NodeAddr` (`scontrol show
//! node`); each node's rank writes its side into the state directory, and `chd serve` there
//! publishes both sides.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::chd_process::{chd_bin, text, Chd};
use crate::slurm_cluster::Cluster;

#[test]
fn the_deploy_sbatch_script_runs_a_round_on_two_nodes_and_both_sides_are_kept() {
    let nodes = ["fabnode1", "fabnode2"];
    let mut cluster = Cluster::start_nodes("fabric-sbatch", "true", &nodes);
    cluster.wait_until(
        "both nodes register (idle)",
        Duration::from_secs(120),
        |c| {
            let (ok, text) = c.scontrol(&["show", "nodes"]);
            ok && text.matches("State=IDLE").count() >= 2
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let logs = dir.path().join("logs");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/slurm/chd-fabric-round.sbatch");
    let job_out = dir.path().join("job.out");
    let path = format!(
        "{}:{}",
        Path::new(chd_bin()).parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = cluster.sbatch(
        &[
            "--wait",
            "--nodes=2",
            &format!("--nodelist={}", nodes.join(",")),
            "--output",
            job_out.to_str().unwrap(),
            script.to_str().unwrap(),
            "1",
        ],
        &[
            ("PATH", path.as_str()),
            ("CHD_BIN", chd_bin()),
            ("CHD_FABRIC_RAILS", "^lo$"),
            ("CHD_FABRIC_BYTES", "16MiB"),
            ("CHD_FABRIC_COLLECTIVE_SIZES", "4MiB"),
            ("CHD_FABRIC_STATE_DIR", state.to_str().unwrap()),
            ("CHD_FABRIC_LOG_DIR", logs.to_str().unwrap()),
            ("CHD_FABRIC_TOKEN", "slurm-sbatch-fabric-token-0123456789"),
        ],
    );
    let job = std::fs::read_to_string(&job_out).unwrap_or_default();
    let pair_log = std::fs::read_to_string(logs.join("fabnode1-fabnode2.log")).unwrap_or_default();
    assert!(
        out.status.success(),
        "sbatch: {}{}\njob:\n{job}\npair:\n{pair_log}\n{}",
        text(&out.stdout),
        text(&out.stderr),
        cluster.logs()
    );
    // With --nocapture: what the pair's step printed (each rank's table, srun's labels).
    eprintln!("{job}\n{pair_log}");
    assert!(
        job.contains("chd-fabric-round: fabnode1-fabnode2: ok")
            && job.contains("round 1: all 1 pairs ok"),
        "{job}"
    );
    assert!(
        pair_log.contains("does not resolve; Slurm's NodeAddr is 127.0.0.1"),
        "rank 1 found rank 0 through Slurm: {pair_log}"
    );
    // Both nodes' sides, each naming the other as its peer (both "nodes" keep the one state
    // directory here, under different names).
    let mut sides: Vec<(String, String)> = std::fs::read_dir(state.join("fabric"))
        .unwrap()
        .map(|e| {
            let v: Value =
                serde_json::from_str(&std::fs::read_to_string(e.unwrap().path()).unwrap()).unwrap();
            assert_eq!(v["outcome"], "ok", "{v}");
            assert!(
                v["rails"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|r| r["gbps"].as_f64().unwrap() > 0.0),
                "{v}"
            );
            (
                v["node"].as_str().unwrap().to_string(),
                v["peer"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    sides.sort();
    assert_eq!(
        sides,
        [
            ("fabnode1".to_string(), "fabnode2".to_string()),
            ("fabnode2".to_string(), "fabnode1".to_string())
        ]
    );
    let serve = Chd::serve(&state, &["--no-probe"]);
    let scraped = serve.scrape();
    assert!(
        scraped.contains("chd_fabric_runs{outcome=\"ok\"} 1"),
        "{scraped}"
    );
    drop(serve);
}
