//! `chd fabric rounds` through the real binary: the three formats, one round alone, node
//! files (comments, stdin), the errors a user can make, and hostlists expanded exactly as
//! Debian's Slurm `scontrol show hostnames` expands them.

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::chd_process::{run_chd, text};
use crate::common::assert_ok;

fn rounds(args: &[&str]) -> Output {
    let mut all = vec!["fabric", "rounds"];
    all.extend_from_slice(args);
    run_chd(&all, &[])
}

fn json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["--format", "json"]);
    let out = rounds(&all);
    assert_ok(&out);
    serde_json::from_slice(&out.stdout).unwrap()
}

fn pairs_of(round: &Value) -> Vec<(String, String)> {
    round["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_str().unwrap().into(), p[1].as_str().unwrap().into()))
        .collect()
}

#[test]
fn text_prints_one_line_per_round_with_the_bye() {
    let out = rounds(&["--nodes", "a,b,c,d,e"]);
    assert_ok(&out);
    assert_eq!(
        text(&out.stdout),
        "round 1: b-e c-d bye: a\n\
         round 2: a-c d-e bye: b\n\
         round 3: a-e b-d bye: c\n\
         round 4: a-b c-e bye: d\n\
         round 5: a-d b-c bye: e\n"
    );
    let out = rounds(&["--nodes", "a,b,c,d", "--round", "2", "--format", "pairs"]);
    assert_ok(&out);
    assert_eq!(text(&out.stdout), "2 a c\n2 b d\n");
}

#[test]
fn json_covers_every_pair_once_and_one_round_is_that_round() {
    let all = json(&["--nodes", "gpu-[01-07],ib.node_8"]);
    let nodes: Vec<&str> = all["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert_eq!(nodes.len(), 8);
    assert_eq!(nodes[0], "gpu-01");
    assert_eq!(nodes[7], "ib.node_8");
    assert_eq!(all["round_count"], 7);
    let list = all["rounds"].as_array().unwrap();
    assert_eq!(list.len(), 7);
    let mut met = BTreeSet::new();
    for round in list {
        assert!(round["bye"].is_null(), "an even count has no bye");
        let pairs = pairs_of(round);
        assert_eq!(pairs.len(), 4);
        let in_round: BTreeSet<&String> = pairs.iter().flat_map(|(a, b)| [a, b]).collect();
        assert_eq!(
            in_round.len(),
            8,
            "round {}: pairs share a node",
            round["round"]
        );
        for (a, b) in pairs {
            assert!(met.insert((a.clone(), b.clone())), "{a}-{b} twice");
        }
    }
    assert_eq!(met.len(), 28, "8 nodes: 28 pairs");
    for k in 1..=7 {
        let one = json(&[
            "--nodes",
            "gpu-[01-07],ib.node_8",
            "--round",
            &k.to_string(),
        ]);
        assert_eq!(one["round_count"], 7);
        assert_eq!(one["rounds"].as_array().unwrap().len(), 1);
        assert_eq!(one["rounds"][0], list[k - 1], "round {k} alone");
    }
}

#[test]
fn a_node_file_and_stdin_take_one_node_per_line_with_comments() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fleet.txt");
    std::fs::write(&file, "# rack 1\nnode01\nnode02  # spare\n\nnode[03-04]\n").unwrap();
    let from_file = json(&["--nodes", file.to_str().unwrap()]);
    assert_eq!(
        from_file["nodes"],
        serde_json::json!(["node01", "node02", "node03", "node04"])
    );

    let mut child = Command::new(crate::chd_process::chd_bin())
        .args(["fabric", "rounds", "--nodes", "-", "--format", "json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"node01\nnode02\nnode03\nnode04\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_ok(&out);
    let from_stdin: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(from_stdin, from_file);
}

#[test]
fn bad_node_lists_and_rounds_are_errors_that_name_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "# nobody yet\n\n").unwrap();
    let twice = dir.path().join("twice.txt");
    std::fs::write(&twice, "a\nb\na\n").unwrap();
    let missing = dir.path().join("missing.txt");
    let cases: Vec<(Vec<&str>, String)> = vec![
        (
            vec!["--nodes", "a,node[1-2],node1"],
            "chd: --nodes: node node1 is listed twice (as node 2 and node 4)".into(),
        ),
        (
            vec!["--nodes", twice.to_str().unwrap()],
            "node a is listed twice (as node 1 and node 3)".into(),
        ),
        (
            vec!["--nodes", "solo"],
            "needs at least 2 nodes, got 1 (solo)".into(),
        ),
        (
            vec!["--nodes", empty.to_str().unwrap()],
            format!("--nodes: {}: no nodes listed", empty.display()),
        ),
        (
            vec!["--nodes", "n[4-1]"],
            "hostlist \"n[4-1]\": range \"4-1\" runs backwards".into(),
        ),
        (
            vec!["--nodes", "n[1-2"],
            "'[' at byte 1 is never closed".into(),
        ),
        (
            vec!["--nodes", missing.to_str().unwrap()],
            format!("reading the node file {}", missing.display()),
        ),
        (
            vec!["--nodes", "a,b,c", "--round", "4"],
            "chd: --round: round 4: the schedule of 3 nodes has rounds 1 to 3".into(),
        ),
        (
            vec!["--nodes", "a,b", "--round", "0"],
            "round 0: the schedule of 2 nodes has rounds 1 to 1".into(),
        ),
    ];
    for (args, expected) in cases {
        let out = rounds(&args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}: printed a schedule");
        assert!(
            stderr.contains(&expected),
            "{args:?}: {expected:?} not in {stderr}"
        );
    }
    let out = rounds(&["--nodes", "a,b", "--format", "csv"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("[possible values: text, json, pairs]"));
}

/// Debian's Slurm client expands hostlists without a controller, given a slurm.conf.
fn scontrol_hostnames(expression: &str, conf: &std::path::Path) -> Vec<String> {
    let out = Command::new("scontrol")
        .args(["show", "hostnames", expression])
        .env("SLURM_CONF", conf)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "scontrol is needed to compare hostlists (apt-get install slurm-client; \
                 scripts/test.sh installs it): {e}"
            )
        });
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "scontrol show hostnames {expression}: {}",
        text(&out.stderr)
    );
    text(&out.stdout).lines().map(str::to_owned).collect()
}

#[test]
fn hostlists_expand_as_scontrol_show_hostnames_does() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("slurm.conf");
    std::fs::write(
        &conf,
        "ClusterName=hostlists\nSlurmctldHost=localhost\nNodeName=localhost CPUs=1\n\
         PartitionName=test Nodes=localhost\n",
    )
    .unwrap();
    for expression in [
        "node[01-04,07]",
        "gpu-a,gpu-b",
        "rack[1-2]-n[8-10]",
        "x[009-011],y[1-010]",
        "n[01-2] m[7,3,5]",
        "a1,b[10-12],c",
        "dgx[0098-0102]",
    ] {
        let want = scontrol_hostnames(expression, &conf);
        assert!(want.len() >= 2, "{expression}: {want:?}");
        let got = json(&["--nodes", expression]);
        let got: Vec<&str> = got["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap())
            .collect();
        assert_eq!(got, want, "{expression}");
    }
}

#[test]
fn help_explains_the_schedule() {
    let out = run_chd(&["fabric", "rounds", "--help"], &[]);
    assert_ok(&out);
    let help = text(&out.stdout);
    for needle in [
        "every pair of the nodes exactly once",
        "bye",
        "--round <K>",
        "hostlist",
        "chd-fabric-round.sbatch",
        "[possible values: text, json, pairs]",
    ] {
        assert!(help.contains(needle), "{needle:?} not in:\n{help}");
    }
}
