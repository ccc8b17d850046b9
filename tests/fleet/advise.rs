//! `chd advise` on a recorded node (tests/fixtures/advise: a slow NUMA segment on device 1,
//! a slow column on device 2, a slow rank-0 core in pair 0,1): the CPUs it advises per device,
//! their NUMA node, the bindings, and `--map` scoring with its exit codes; the same advice
//! from a ledger file and from a node's `/api/v1/calibration` (`--url`).

use crate::chd_process;

use std::path::{Path, PathBuf};

use crate::chd_process::{run_chd, text, Chd};
use serde_json::Value;

fn recording() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/advise/results.json")
}

fn advise(extra: &[&str]) -> std::process::Output {
    let rec = recording();
    let mut args = vec!["advise", "--replay", rec.to_str().unwrap()];
    args.extend_from_slice(extra);
    run_chd(&args, &[])
}

fn json(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", text(&out.stdout), text(&out.stderr)))
}

#[test]
fn advice_picks_each_devices_best_cpus_and_their_node() {
    let out = advise(&["--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let a = json(&out);
    assert_eq!(a["host"], "gpu-node-3");
    let devices = a["devices"].as_array().unwrap();
    let row = |i: usize| {
        (
            devices[i]["device"].as_str().unwrap().to_string(),
            devices[i]["cpus"].as_str().unwrap().to_string(),
            devices[i]["numa_nodes"].clone(),
        )
    };
    // Device 0: node 0's CPUs; device 1 (slow from node 0): node 1's but CPU 5 (0.89 of
    // its best); device 2 (a slow column, alike from every CPU): all of them.
    assert_eq!(row(0), ("0".into(), "0-3".into(), serde_json::json!([0])));
    assert_eq!(row(1), ("1".into(), "4,6-7".into(), serde_json::json!([1])));
    assert_eq!(
        row(2),
        ("2".into(), "0-7".into(), serde_json::json!([0, 1]))
    );
    assert_eq!(
        devices[1]["numactl"],
        "numactl --physcpubind=4,6-7 --membind=1"
    );
    assert_eq!(devices[1]["taskset"], "taskset -c 4,6-7");
    // A recording declares no NUMA node for its devices.
    assert_eq!(devices[0]["on_declared_node"], Value::Null);
    assert_eq!(a["cpu_bind"]["map_cpu"], "map_cpu:0,4,1");
    assert_eq!(a["cpu_bind"]["mask_cpu"], "mask_cpu:0xf,0xd0,0xff");

    let out = advise(&[]);
    assert!(out.status.success());
    let shown = text(&out.stdout);
    assert!(
        shown.contains("local rank 1 -> device 1: CPUs 4,6-7 (NUMA 1; no node declared)"),
        "{shown}"
    );
    assert!(shown.contains("--cpu-bind=map_cpu:0,4,1"), "{shown}");
    assert!(
        shown.contains("note: device 2: its column is 0.35 x the typical device's"),
        "{shown}"
    );
}

fn map_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn a_map_flags_exactly_the_bad_ranks_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    // Rank 0 on the slow pair core (its H2D is fine), rank 1 on device 1's slow NUMA
    // segment, rank 2 on a good CPU of device 0, rank 3 on the slow column (against its own
    // best: fine).
    let bad = map_file(
        dir.path(),
        "bad.txt",
        "# rank device cpus\n0 0 2\n1 1 0-1\n2 0 3\n3 2 5\n",
    );
    let out = advise(&["--map", bad.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let s = json(&out);
    let flagged: Vec<u64> = s["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["ok"] == false)
        .map(|r| r["rank"].as_u64().unwrap())
        .collect();
    assert_eq!(flagged, [0, 1], "{s}");
    let r0 = &s["ranks"][0];
    assert!(
        (r0["h2d_ratio"].as_f64().unwrap() - 1.0).abs() < 1e-9,
        "{r0}"
    );
    assert_eq!(r0["pair_penalties"][0]["pair"], "0,1");
    assert!(r0["score"].as_f64().unwrap() < 0.5, "{r0}");
    let r1 = &s["ranks"][1];
    assert!(
        (r1["h2d_ratio"].as_f64().unwrap() - 20.3 / 58.6).abs() < 1e-9,
        "{r1}"
    );
    // Text: one line per rank, the reasons, the count.
    let out = advise(&["--map", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let shown = text(&out.stdout);
    assert!(shown.contains("2 of 4 ranks below 0.90"), "{shown}");
    assert!(shown.contains("pair 0,1's median as rank 0"), "{shown}");
    assert!(
        shown.contains(
            "rank 1 device 1 CPUs 0-1: 20.3 of 58.6 GB/s = 0.35, pair 0,1 with rank 0 1.00"
        ),
        "{shown}"
    );
    // A lower threshold lets the H2D rank through, not the pair core.
    let out = advise(&[
        "--map",
        bad.to_str().unwrap(),
        "--threshold",
        "0.3",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let flagged: Vec<u64> = json(&out)["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["ok"] == false)
        .map(|r| r["rank"].as_u64().unwrap())
        .collect();
    assert_eq!(flagged, [0]);
}

#[test]
fn a_good_map_passes_with_exit_0_in_either_format() {
    let dir = tempfile::tempdir().unwrap();
    let good = map_file(
        dir.path(),
        "good.json",
        r#"{"ranks": [{"rank": 0, "device": "0", "cpus": "0-1"}, {"rank": 1, "device": "1", "cpus": "6-7"}, {"rank": 2, "device": "2", "cpus": "4"}]}"#,
    );
    let out = advise(&["--map", good.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(text(&out.stdout).contains("every rank at or above 0.90"));
    // The advice's own bindings, as a map, pass.
    let advised = map_file(dir.path(), "advised.txt", "0 0 0-3\n1 1 4,6-7\n2 2 0-7\n");
    let out = advise(&["--map", advised.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
}

#[test]
fn bad_maps_and_unknown_devices_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let unknown = map_file(dir.path(), "u.txt", "0 7 0\n");
    let out = advise(&["--map", unknown.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("device \"7\" is not one of this node's devices (0, 1, 2)"),
        "{}",
        text(&out.stderr)
    );
    let garbled = map_file(dir.path(), "g.txt", "0 0\n");
    let out = advise(&["--map", garbled.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("g.txt:1"),
        "{}",
        text(&out.stderr)
    );
    let out = advise(&["--threshold", "2"]);
    assert_eq!(out.status.code(), Some(2));
}

/// `--url` reads a node's `/api/v1/calibration` (chd serve, here replaying the recording)
/// and `--ledger` a ledger file: the same advice as from the recording.
#[test]
fn url_and_ledger_file_give_the_same_advice() {
    let dir = tempfile::tempdir().unwrap();
    let rec = recording();
    let expected = json(&advise(&["--json"]));
    let chd = Chd::serve(dir.path(), &["--replay", rec.to_str().unwrap()]);
    let url = format!("http://{}", chd.addr);
    let out = run_chd(&["advise", "--url", &url, "--json"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let got = json(&out);
    assert_eq!(got["devices"], expected["devices"]);
    assert_eq!(got["cpu_bind"], expected["cpu_bind"]);
    chd.terminate();

    let file = dir.path().join("ledger.json");
    let made = run_chd(
        &[
            "ledger",
            "--replay",
            rec.to_str().unwrap(),
            "--out",
            file.to_str().unwrap(),
        ],
        &[],
    );
    assert!(made.status.success());
    let out = run_chd(
        &["advise", "--ledger", file.to_str().unwrap(), "--json"],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(json(&out)["devices"], expected["devices"]);

    // https:// to a node serving plain HTTP: the answer is not TLS.
    let chd = Chd::serve(dir.path(), &["--replay", rec.to_str().unwrap()]);
    let refused = run_chd(&["advise", "--url", &format!("https://{}", chd.addr)], &[]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        text(&refused.stderr).contains("not TLS") && text(&refused.stderr).contains("http://"),
        "{}",
        text(&refused.stderr)
    );
    // Basic auth over plain http:// works, with a warning that the password goes in clear.
    let out = run_chd(
        &[
            "advise",
            "--url",
            &format!("http://{}", chd.addr),
            "--user",
            "alice",
        ],
        &[("CHD_PASSWORD", "s3cret")],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("clear text"),
        "{}",
        text(&out.stderr)
    );
    chd.terminate();
}

/// The README's `chd advise` examples are this binary's output on the fixture.
#[test]
fn the_readme_shows_real_output() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let rel = "tests/fixtures/advise/results.json";
    let run = |args: &[&str]| {
        let out = std::process::Command::new(chd_process::chd_bin())
            .args(args)
            .current_dir(root)
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        text(&out.stdout)
    };
    let advice = run(&["advise", "--replay", rel]);
    assert!(
        readme.contains(&format!("$ chd advise --replay {rel}\n{advice}$ printf")),
        "README's chd advise block is not\n{advice}"
    );
    let dir = tempfile::tempdir().unwrap();
    let map = map_file(dir.path(), "map.txt", "0 0 2\n1 1 0-1\n2 0 3\n3 2 5\n");
    let scored = run(&["advise", "--replay", rel, "--map", map.to_str().unwrap()]);
    assert!(
        readme.contains(&format!("echo \"exit $?\"\n{scored}exit 1\n")),
        "README's chd advise --map block is not\n{scored}"
    );
}
