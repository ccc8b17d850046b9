//! `deploy/slurm/chd-fabric-round.sbatch` run as sbatch runs it (the job's
//! `SLURM_JOB_NODELIST` in its environment), with the real `scontrol show hostnames` (Debian's
//! Slurm client on a minimal slurm.conf: no daemon needed to expand a hostlist), the real
//! `chd fabric rounds`, and an `srun` on PATH that records each step it is asked to start
//! and fails the steps it is told to. Checked: one step per pair of exactly the asked round,
//! each on its two nodes with one task per node; the probe's flags from the environment;
//! a failed pair named and the exit status 1; usage errors exit 2. shellcheck passes on it.
//! (A real Slurm submitting the script end to end is issue 26's Slurm test.)

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::tools::{chd_bin, require_tool, root, run, temp_dir, Ran};

const SCRIPT: &str = "deploy/slurm/chd-fabric-round.sbatch";
const SLURM_CLIENT: &str = "apt-get install slurm-client (Debian's Slurm 22.05)";

/// A job's world: a bin directory with the recording srun first on PATH, a slurm.conf for
/// scontrol, the file the srun records to.
struct Job {
    dir: tempfile::TempDir,
    bin: PathBuf,
    record: PathBuf,
}

impl Job {
    fn new() -> Job {
        require_tool("scontrol", SLURM_CLIENT);
        let dir = temp_dir();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let record = dir.path().join("srun.log");
        // One line per step: its arguments, tab-separated. A step whose --nodelist is in
        // FAIL_NODELISTS exits 3, as srun does with a task's failure.
        let srun = bin.join("srun");
        std::fs::write(
            &srun,
            "#!/bin/bash\n\
             (IFS=$'\\t'; echo \"$*\") >>\"$SRUN_RECORD\"\n\
             for arg in \"$@\"; do\n\
             \x20 case \"$arg\" in --nodelist=*) nodelist=\"${arg#--nodelist=}\" ;; esac\n\
             done\n\
             echo \"0: measured $nodelist\"\n\
             [[ \" $FAIL_NODELISTS \" == *\" $nodelist \"* ]] && exit 3\n\
             exit 0\n",
        )
        .unwrap();
        std::fs::set_permissions(&srun, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(
            dir.path().join("slurm.conf"),
            "ClusterName=fabric-test\nSlurmctldHost=localhost\nNodeName=localhost CPUs=1\n\
             PartitionName=test Nodes=localhost\n",
        )
        .unwrap();
        Job { dir, bin, record }
    }

    /// Run the script with `args` as job `SLURM_JOB_ID` 42 on `nodelist`.
    fn run(&self, nodelist: Option<&str>, args: &[&str], env: &[(&str, &str)]) -> Ran {
        let path = format!(
            "{}:{}",
            self.bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut cmd = Command::new("bash");
        cmd.arg(root().join(SCRIPT))
            .args(args)
            .current_dir(self.dir.path())
            .env_clear()
            .env("PATH", path)
            .env("SLURM_CONF", self.dir.path().join("slurm.conf"))
            .env("SRUN_RECORD", &self.record)
            .env("CHD_BIN", chd_bin())
            .env("SLURM_JOB_ID", "42")
            .envs(env.iter().copied());
        if let Some(list) = nodelist {
            cmd.env("SLURM_JOB_NODELIST", list);
        }
        run(&mut cmd)
    }

    /// The steps srun was asked to start, each as its arguments.
    fn steps(&self) -> Vec<Vec<String>> {
        std::fs::read_to_string(&self.record)
            .unwrap_or_default()
            .lines()
            .map(|l| l.split('\t').map(str::to_owned).collect())
            .collect()
    }

    fn logs(&self) -> PathBuf {
        self.dir.path().join("chd-fabric-42")
    }
}

/// The pairs of `chd fabric rounds --round K` as `a,b` node lists.
fn round_pairs(nodes: &str, round: usize) -> BTreeSet<String> {
    let out = run(Command::new(chd_bin()).args([
        "fabric",
        "rounds",
        "--nodes",
        nodes,
        "--format",
        "pairs",
        "--round",
        &round.to_string(),
    ]))
    .expect_success();
    out.stdout
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            format!("{},{}", f[1], f[2])
        })
        .collect()
}

fn nodelist_of(step: &[String]) -> String {
    step.iter()
        .find_map(|a| a.strip_prefix("--nodelist="))
        .unwrap_or_else(|| panic!("a step without --nodelist: {step:?}"))
        .to_string()
}

#[test]
fn a_round_starts_one_two_node_step_per_pair_with_the_probes_flags() {
    let job = Job::new();
    let token = job.dir.path().join("token");
    let ran = job
        .run(
            Some("gpu-[1-5],ib-node7"),
            &["2"],
            &[
                ("CHD_FABRIC_BACKEND", "cuda"),
                ("CHD_FABRIC_ALGORITHM", "ring"),
                ("CHD_FABRIC_RAILS", "^eth[01]$"),
                ("CHD_FABRIC_BYTES", "256MiB"),
                ("CHD_FABRIC_COLLECTIVE_SIZES", "1GiB"),
                ("CHD_FABRIC_TOKEN_FILE", token.to_str().unwrap()),
            ],
        )
        .expect_success();
    let nodes = "gpu-1,gpu-2,gpu-3,gpu-4,gpu-5,ib-node7";
    let want = round_pairs(nodes, 2);
    assert_eq!(want.len(), 3, "6 nodes: 3 pairs a round");
    let steps = job.steps();
    let got: BTreeSet<String> = steps.iter().map(|s| nodelist_of(s)).collect();
    assert_eq!(got, want, "the steps are the pairs of round 2");
    assert_eq!(steps.len(), 3, "one step per pair: {steps:?}");
    for step in &steps {
        let pair = nodelist_of(step);
        for flag in [
            "--nodes=2",
            "--ntasks=2",
            "--ntasks-per-node=1",
            "--cpu-bind=none",
        ] {
            assert!(
                step.iter().any(|a| a == flag),
                "{pair}: no {flag} in {step:?}"
            );
        }
        let command = step
            .iter()
            .position(|a| a == chd_bin())
            .unwrap_or_else(|| panic!("{pair}: chd is not the step's command: {step:?}"));
        assert_eq!(
            step[command + 1..],
            [
                "probe",
                "fabric",
                "--format",
                "text",
                "--backend",
                "cuda",
                "--algorithm",
                "ring",
                "--rails",
                "^eth[01]$",
                "--bytes",
                "256MiB",
                "--collective-sizes",
                "1GiB",
                "--token-file",
                token.to_str().unwrap(),
            ],
            "{pair}"
        );
        // No rank, world size or rendezvous flags: chd reads them from srun's environment.
        let log = std::fs::read_to_string(job.logs().join(pair.replace(',', "-") + ".log"))
            .unwrap_or_else(|e| panic!("{pair}: no log: {e}"));
        assert_eq!(log.trim(), format!("0: measured {pair}"));
    }
    assert!(
        ran.stdout.contains("round 2: all 3 pairs ok"),
        "{}",
        ran.stdout
    );
}

#[test]
fn a_failed_pair_is_named_and_fails_the_job() {
    let job = Job::new();
    let nodes = "n01,n02,n03,n04";
    let failing: Vec<String> = round_pairs(nodes, 3).into_iter().take(1).collect();
    let ran = job.run(
        Some("n[01-04]"),
        &["3"],
        &[("FAIL_NODELISTS", failing[0].as_str())],
    );
    assert!(
        !ran.success,
        "the job passed with a failed pair:\n{}",
        ran.stdout
    );
    assert_eq!(job.steps().len(), 2, "the other pair still ran");
    let name = failing[0].replace(',', "-");
    assert!(
        ran.stderr.contains(&format!("{name}: failed (exit 3)"))
            && ran.stderr.contains("round 3: 1 of 2 pairs failed"),
        "{}",
        ran.stderr
    );
}

#[test]
fn auto_picks_a_round_of_the_schedule() {
    let job = Job::new();
    let ran = job
        .run(Some("n[1-4]"), &[], &[("CHD_FABRIC_ROUND_SECONDS", "1")])
        .expect_success();
    let got: BTreeSet<String> = job.steps().iter().map(|s| nodelist_of(s)).collect();
    let rounds: Vec<BTreeSet<String>> = (1..=3).map(|k| round_pairs("n1,n2,n3,n4", k)).collect();
    assert!(
        rounds.contains(&got),
        "{got:?} is no round of {rounds:?}\n{}",
        ran.stdout
    );
}

#[test]
fn usage_errors_exit_2_and_start_nothing() {
    let job = Job::new();
    let cases: [(Option<&str>, &[&str], &str); 4] = [
        (None, &["1"], "SLURM_JOB_NODELIST is not set"),
        (
            Some("n[1-4]"),
            &["x"],
            "the round must be a number from 1 or auto",
        ),
        (
            Some("n[1-4]"),
            &["4"],
            "round 4: the schedule of 4 nodes has rounds 1 to 3",
        ),
        (Some("n1"), &["1"], "needs at least 2 nodes, got 1 (n1)"),
    ];
    for (nodelist, args, expected) in cases {
        let ran = job.run(nodelist, args, &[]);
        assert!(!ran.success, "{args:?} passed");
        assert!(ran.stderr.contains(expected), "{args:?}: {}", ran.stderr);
    }
    assert!(job.steps().is_empty(), "a step started: {:?}", job.steps());
}

#[test]
fn the_slurm_scripts_pass_shellcheck() {
    let shellcheck = require_tool("shellcheck", "apt-get install shellcheck");
    run(Command::new(shellcheck)
        .current_dir(root())
        .arg(Path::new(SCRIPT)))
    .expect_success();
}
