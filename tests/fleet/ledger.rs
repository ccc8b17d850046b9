//! `chd ledger` and `/api/v1/calibration`: the calibration ledger of recordings, of a
//! `chd probe h2d --out` run with the fake runtime, of a state directory and of `chd serve`,
//! each validated against docs/calibration.schema.json by python's `jsonschema` (Draft
//! 2020-12); documents that violate the schema are refused by it; `--merge` makes a fleet
//! file and refuses other versions and duplicate hosts.

use crate::fake;

use std::path::{Path, PathBuf};

use crate::chd_process::{allowed_cpus, run_chd, text, Chd};
use crate::json_schema::{calibration_schema, validate};
use serde_json::Value;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

/// `chd ledger ARGS --out DIR/NAME`; the file and its JSON.
fn ledger(args: &[&str], dir: &Path, name: &str, env: &[(&str, &str)]) -> (PathBuf, Value) {
    let out = dir.join(name);
    let mut all = vec!["ledger"];
    all.extend_from_slice(args);
    all.extend(["--out", out.to_str().unwrap()]);
    let run = run_chd(&all, env);
    assert!(
        run.status.success(),
        "chd {all:?} failed: {}",
        text(&run.stderr)
    );
    let value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    (out, value)
}

fn assert_valid(docs: &[&Path]) {
    if let Err(e) = validate(&calibration_schema(), docs) {
        panic!("ledger does not validate against docs/calibration.schema.json:\n{e}");
    }
}

/// Every recording in tests/fixtures/cluster-health and tests/fixtures/replay that chd can
/// replay gives a ledger that validates; the one it cannot (skip-only) is refused clearly.
#[test]
fn every_replayable_recording_gives_a_valid_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let mut written = Vec::new();
    let mut recordings: Vec<PathBuf> = std::fs::read_dir(fixture("cluster-health"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    recordings.sort();
    recordings.push(fixture("replay/results-npu-node.json"));
    assert_eq!(recordings.len(), 9, "{recordings:?}");
    for (i, rec) in recordings.iter().enumerate() {
        let name = format!("{i}.json");
        if rec.ends_with("skip-only") {
            let out = run_chd(&["ledger", "--replay", rec.to_str().unwrap()], &[]);
            assert!(!out.status.success());
            assert!(
                text(&out.stderr).contains("no matrix cells"),
                "{}",
                text(&out.stderr)
            );
            continue;
        }
        let (path, doc) = ledger(&["--replay", rec.to_str().unwrap()], dir.path(), &name, &[]);
        assert_eq!(doc["schema"], "chd.calibration/v2");
        written.push(path);
    }
    assert_eq!(written.len(), 8);
    let refs: Vec<&Path> = written.iter().map(PathBuf::as_path).collect();
    assert_valid(&refs);

    // The seed-shaped node: NPU 0 is the slow column, on both sizes; rank 0 CPU 6 of pair
    // 0,3 is slow; one profile, so no load-profile delta.
    let (_, doc) = ledger(
        &[
            "--replay",
            fixture("replay/results-npu-node.json").to_str().unwrap(),
        ],
        dir.path(),
        "npu.json",
        &[],
    );
    assert_eq!(doc["node"]["host"], "npu-node-17");
    let slow: Vec<&str> = doc["findings"]["slow_devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["device"].as_str().unwrap())
        .collect();
    assert_eq!(slow, ["0", "0"]);
    assert_eq!(doc["findings"]["slow_pair_cpus"][0]["cpu"], 6);
    assert_eq!(doc["load_profile_delta"], serde_json::json!({}));
    assert_eq!(doc["d2d_alg_gbps_by_core_pair"][0]["pair"], "0,3");
    // The recording's affinity.json becomes the bindable CPUs.
    let (_, npu) = ledger(
        &[
            "--replay",
            fixture("cluster-health/h2d-npu").to_str().unwrap(),
        ],
        dir.path(),
        "h2d-npu.json",
        &[],
    );
    assert_eq!(npu["affinity_bindable_cpus"]["bindable"], "0-6");
    assert_eq!(npu["affinity_bindable_cpus"]["not_bindable"], "7");
    assert_eq!(
        npu["affinity_bindable_cpus"]["age_seconds"],
        Value::Null,
        "of unknown age"
    );
    assert_eq!(npu["node"]["backend"], "npu");
}

/// Documents the schema must refuse: it is a check that can fail.
#[test]
fn documents_that_violate_the_schema_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_, doc) = ledger(
        &[
            "--replay",
            fixture("replay/results-npu-node.json").to_str().unwrap(),
        ],
        dir.path(),
        "good.json",
        &[],
    );
    type Mutation = (&'static str, fn(&mut Value));
    let mutations: [Mutation; 8] = [
        ("a cell's value as text", |d| {
            d["h2d_gbps_by_core_device"][0]["cells"][0]["gbps"] = "fast".into()
        }),
        ("no findings", |d| {
            d.as_object_mut().unwrap().remove("findings");
        }),
        ("another schema version", |d| {
            d["schema"] = "chd.calibration/v1".into()
        }),
        ("an unknown field", |d| d["node"]["colour"] = "blue".into()),
        ("no p2p section", |d| {
            d.as_object_mut().unwrap().remove("p2p");
        }),
        ("a sweep point without its dip flag", |d| {
            d["sweeps"] = serde_json::json!([{"op": "h2d", "device": "0", "setting": "idle",
                "max_gbps": 20.0, "plateau_bytes": null, "plateau_scatter": null,
                "plateau_band": 0.05, "dip_ratio": 0.8,
                "points": [{"size_bytes": 1, "gbps": 1.0, "spread": null, "samples": 1,
                            "failed": 0, "remeasure": false, "unsupported": false,
                            "last_error": null}]}])
        }),
        ("a cpulist that is not one", |d| {
            d["node"]["cpus"] = "0-3,x".into()
        }),
        ("a load-profile delta that is not a ratio", |d| {
            d["load_profile_delta"] = serde_json::json!({"0": {"cpu:8": -1}})
        }),
    ];
    for (what, mutate) in mutations {
        let mut bad = doc.clone();
        mutate(&mut bad);
        let path = dir.path().join("bad.json");
        std::fs::write(&path, serde_json::to_string(&bad).unwrap()).unwrap();
        assert!(
            validate(&calibration_schema(), &[&path]).is_err(),
            "{what}: the schema accepted it"
        );
    }
    // The unchanged document passes the same check.
    assert_valid(&[&dir.path().join("good.json")]);
}

/// A `chd probe h2d --out` run with the fake runtime on the gpu-node fixture (device 1's link
/// at x8 of x16) under two load profiles: the ledger has the recorded links, the devices'
/// declared NUMA nodes and the delta of `cpu:1` against idle (1.0: the fake times copies on
/// a virtual clock that load does not slow).
#[test]
fn a_probe_run_with_two_load_profiles_gives_links_and_the_delta() {
    let lib = fake::fake_runtime_path();
    let gpu_node = fixture("accelerators/gpu-node");
    let (sys, proc) = (gpu_node.join("sys"), gpu_node.join("proc"));
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let cpu = allowed_cpus()[0].to_string();
    let env = [
        ("CHD_FAKE_DEVICE_COUNT", "2"),
        ("CHD_FAKE_PCI_BUS_IDS", "0000:1A:00.0,0000:9C:00.0"),
        ("CHD_FAKE_H2D_GBPS", "49.8;1=9.45"),
    ];
    let probe = run_chd(
        &[
            "--sysfs-root",
            sys.to_str().unwrap(),
            "--procfs-root",
            proc.to_str().unwrap(),
            "probe",
            "h2d",
            "--cpus",
            &cpu,
            "--sizes",
            "1MiB",
            "--iters",
            "1",
            "--repeats",
            "1",
            "--load",
            "idle",
            "--load",
            "cpu:1",
            "--out",
            run_dir.to_str().unwrap(),
            "--backend",
            "cuda",
            "--cuda-runtime",
            lib,
            "--nvml",
            lib,
        ],
        &env,
    );
    assert!(probe.status.success(), "{}", text(&probe.stderr));
    let (path, doc) = ledger(
        &["--replay", run_dir.to_str().unwrap()],
        dir.path(),
        "run.json",
        &[],
    );
    assert_valid(&[&path]);
    assert_eq!(doc["node"]["backend"], "cuda");
    let devices = doc["node"]["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[1]["pci_bus_id"], "0000:9c:00.0");
    assert_eq!(devices[1]["link"]["current"]["width"], 8);
    assert_eq!(devices[1]["link"]["max"]["width"], 16);
    assert_eq!(devices[0]["link"]["current"]["width"], 16);
    let delta = &doc["load_profile_delta"];
    for d in ["0", "1"] {
        let r = delta[d]["cpu:1"]
            .as_f64()
            .unwrap_or_else(|| panic!("{delta}"));
        assert!((r - 1.0).abs() < 1e-9, "{delta}");
    }
    // Only idle is in the matrices (as chd serve --replay serves it).
    assert_eq!(
        doc["h2d_gbps_by_core_device"][0]["cells"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

/// The node's CPUs, NUMA nodes, packages and cores, as sysfs has them, in the ledger
/// `chd serve` serves (`/api/v1/calibration`): the per-CPU facts `/metrics` exports only
/// with `exposition.cpu_series = "all"` (issue 28 part 4). The tree is
/// `tests/fixtures/topology/two-node-offline`: 2 packages of 2 SMT cores (siblings `c` and
/// `c + 4`), CPUs 6 and 7 offline.
#[test]
fn the_served_ledger_has_the_cpus_numa_nodes_packages_and_cores_of_the_node() {
    let (dir, chd) = crate::chd_process::serve_tree(&fixture("topology/two-node-offline"), &[]);
    let metrics = chd.scrape();
    assert!(!metrics.contains("chd_cpu_info{"), "{metrics}");
    assert!(
        metrics.contains("chd_cpus{state=\"unchecked\"} 6\n"),
        "{metrics}"
    );
    let (status, _, body) = chd.get("/api/v1/calibration", None);
    assert_eq!(status, 200, "{body}");
    let path = dir.path().join("served.json");
    std::fs::write(&path, &body).unwrap();
    assert_valid(&[&path]);
    let doc: Value = serde_json::from_str(&body).unwrap();
    let node = &doc["node"];
    assert_eq!(node["cpus"], "0-5", "{node}");
    assert_eq!(node["numa_nodes"][0]["cpus"], "0-1,4-5", "{node}");
    assert_eq!(node["numa_nodes"][1]["cpus"], "2-3", "{node}");
    assert_eq!(
        node["packages"],
        serde_json::json!([{"id": 0, "cpus": "0-1,4-5"}, {"id": 1, "cpus": "2-3"}]),
        "{node}"
    );
    assert_eq!(
        node["cores"],
        serde_json::json!([
            {"package": 0, "core": 0, "cpus": "0,4"},
            {"package": 0, "core": 1, "cpus": "1,5"},
            {"package": 1, "core": 0, "cpus": "2"},
            {"package": 1, "core": 1, "cpus": "3"},
        ]),
        "{node}"
    );
}

/// A state directory as `chd serve` leaves it: cells with their sample times, affinity
/// verdicts; ages are counted from when the ledger is made.
#[test]
fn a_state_directory_gives_ages_and_the_bindable_cpus() {
    use chd::runtime::Direction;
    use chd::store::{persist, unix_now, CellKey, Sample, Store};
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::default();
    let now = unix_now();
    store.set_cpu_numa((0..4u32).map(|cpu| (cpu, cpu / 2)).collect());
    for cpu in 0..4u32 {
        for (device, gbps) in [("0", 50.0), ("1", if cpu < 2 { 50.0 } else { 20.0 })] {
            store.record_sample(
                CellKey {
                    cpu,
                    device: device.into(),
                    size_bytes: 64 << 20,
                    direction: Direction::H2d,
                },
                Sample {
                    bytes_per_second: gbps * 1e9,
                    at: now - 600.0,
                },
                5,
            );
        }
    }
    store.record_bindable(&[(0, true), (1, true), (2, true), (3, false)], now - 60.0);
    persist::save(dir.path(), &store, now).unwrap();
    let (path, doc) = ledger(
        &[
            "--state-dir",
            dir.path().to_str().unwrap(),
            "--host",
            "gpu-7",
        ],
        dir.path(),
        "ledger.json",
        &[],
    );
    assert_valid(&[&path]);
    assert_eq!(doc["node"]["host"], "gpu-7");
    let age = doc["h2d_gbps_by_core_device"][0]["cells"][0]["age_seconds"]
        .as_f64()
        .unwrap();
    assert!((590.0..700.0).contains(&age), "{age}");
    assert_eq!(doc["affinity_bindable_cpus"]["bindable"], "0-2");
    assert_eq!(doc["affinity_bindable_cpus"]["not_bindable"], "3");
    // Device 1's node 1 segment is slow; its best CPUs are node 0's.
    assert_eq!(doc["findings"]["slow_segments"][0]["device"], "1");
    assert_eq!(doc["findings"]["slow_segments"][0]["numa_node"], 1);
    assert_eq!(doc["node"]["devices"][1]["best_cpus"]["cpus"], "0-1");
    assert_eq!(doc["node"]["devices"][1]["measured_numa_node"], 0);
    let missing = run_chd(&["ledger", "--state-dir", "/nonexistent/chd"], &[]);
    assert!(!missing.status.success());
    assert!(
        text(&missing.stderr).contains("state directory"),
        "{}",
        text(&missing.stderr)
    );
}

/// A state directory with `chd probe fabric`'s results: the ledger gains its `fabric` section
/// (rails over all peers, each peer's row, the unreadable file named) and validates; the
/// snapshot verdict, and `chd check --state-dir`, name the slow rail.
#[test]
fn a_state_directory_with_fabric_results_gives_the_fabric_section_and_its_verdict() {
    use chd::format::fabric::{self, FabricRecord, Outcome, RailRecord, Way, SCHEMA};
    use chd::store::{persist, unix_now, Store};
    let dir = tempfile::tempdir().unwrap();
    let now = unix_now();
    persist::save(dir.path(), &Store::default(), now).unwrap();
    let rail = |name: &str, way: Way, gbps: f64| RailRecord {
        rail: name.into(),
        address: format!("10.0.{}.1", &name[3..]),
        peer_rail: Some(name.into()),
        peer_address: Some(format!("10.0.{}.2", &name[3..])),
        way,
        gbps: Some(gbps),
        bytes: 1 << 30,
        streams: 4,
        seconds: Some(1.0 / gbps),
        error: None,
        slow: false,
        cpus: None,
        rdma_port: None,
        device: None,
    };
    for (i, peer) in ["node-b", "node-c", "node-d"].iter().enumerate() {
        let mut rails = vec![
            rail("eth1", Way::Send, 11.8),
            rail("eth2", Way::Send, 2.4),
            rail("eth3", Way::Send, 12.1),
            rail("eth1", Way::Receive, 11.9),
            rail("eth2", Way::Receive, 12.0),
            rail("eth3", Way::Receive, 11.7),
        ];
        chd::analysis::fabric::judge(&mut rails);
        let record = FabricRecord {
            schema: SCHEMA,
            run: format!("run{i}"),
            node: "node-a".into(),
            peer: peer.to_string(),
            backend: "host".into(),
            world_size: 2,
            started: now - 100.0,
            finished: now - 90.0 + i as f64,
            outcome: Outcome::Ok,
            error: None,
            rails,
            collectives: Vec::new(),
        };
        fabric::write(&fabric::dir_of(dir.path()), &record).unwrap();
    }
    std::fs::write(
        fabric::dir_of(dir.path()).join("run9__node-e.json"),
        "{\"schema\": 1,",
    )
    .unwrap();
    let state = dir.path().to_str().unwrap();
    let (path, doc) = ledger(
        &["--state-dir", state, "--host", "node-a"],
        dir.path(),
        "ledger.json",
        &[],
    );
    assert_valid(&[&path]);
    let f = &doc["fabric"];
    let slow: Vec<String> = f["rails"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["slow"] == true)
        .map(|r| {
            format!(
                "{} {}",
                r["rail"].as_str().unwrap(),
                r["direction"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(slow, ["eth2 send"], "{f:#}");
    let peers: Vec<&str> = f["peers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["peer"].as_str().unwrap())
        .collect();
    assert_eq!(peers, ["node-b", "node-c", "node-d"]);
    assert_eq!(f["peers"][0]["rails"].as_array().unwrap().len(), 6);
    assert!(
        f["unreadable"][0]
            .as_str()
            .unwrap()
            .contains("run9__node-e.json"),
        "{f:#}"
    );
    let causes: Vec<&str> = doc["verdict"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(causes, ["slow_fabric_rail:eth2:send"]);
    assert_eq!(doc["verdict"]["level"], "degraded");

    let check = run_chd(&["check", "--state-dir", state], &[]);
    let out = text(&check.stdout);
    assert_eq!(check.status.code(), Some(1), "{out}{}", text(&check.stderr));
    assert!(
        out.starts_with("CHD DEGRADED - fabric rail eth2 (send) slow: 0.20 x"),
        "{out}"
    );
}

/// `chd serve --replay`'s `/api/v1/calibration` is the document `chd ledger --replay` prints
/// (the same node, cells, analysis and findings), and validates.
#[test]
fn the_served_ledger_validates_and_matches_chd_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let file = fixture("replay/results-npu-node.json");
    let chd = Chd::serve(dir.path(), &["--replay", file.to_str().unwrap()]);
    let (status, headers, body) = chd.get("/api/v1/calibration", None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(headers["content-type"], "application/json");
    let served_path = dir.path().join("served.json");
    std::fs::write(&served_path, &body).unwrap();
    assert_valid(&[&served_path]);
    let (_, printed) = ledger(
        &["--replay", file.to_str().unwrap()],
        dir.path(),
        "printed.json",
        &[],
    );
    let served: Value = serde_json::from_str(&body).unwrap();
    for part in [
        "node",
        "analysis",
        "findings",
        "load_profile_delta",
        "affinity_bindable_cpus",
    ] {
        assert!(served[part] == printed[part], "{part} differs");
    }
    // The cells too, but for their ages (a replay's samples are stamped when it is read).
    let without_ages = |doc: &Value| {
        let mut cells = doc["d2d_alg_gbps_by_core_pair"].clone();
        for m in cells.as_array_mut().unwrap() {
            for c in m["cells"].as_array_mut().unwrap() {
                c.as_object_mut().unwrap().remove("age_seconds");
            }
        }
        cells
    };
    assert!(
        without_ages(&served) == without_ages(&printed),
        "pair cells differ"
    );
    let (_, index_headers, index) = chd.get("/", None);
    assert!(index_headers["content-type"].starts_with("text/html"));
    assert!(index.contains("/api/v1/calibration"));
    chd.terminate();

    // A recording's affinity.json is in the served ledger as in the printed one.
    let npu = fixture("cluster-health/h2d-npu");
    let chd = Chd::serve(
        &dir.path().join("npu"),
        &["--replay", npu.to_str().unwrap()],
    );
    let (status, _, body) = chd.get("/api/v1/calibration", None);
    assert_eq!(status, 200, "{body}");
    let served: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(served["affinity_bindable_cpus"]["not_bindable"], "7");
    chd.terminate();
}

/// `--merge`: one fleet file of two hosts (valid, by host), refusing a duplicate host and a
/// ledger of another schema version with errors that say so.
#[test]
fn merge_makes_a_fleet_file_and_refuses_duplicates_and_other_versions() {
    let dir = tempfile::tempdir().unwrap();
    let file = fixture("replay/results-npu-node.json");
    let rec = file.to_str().unwrap();
    let (b, _) = ledger(
        &["--replay", rec, "--host", "node-10"],
        dir.path(),
        "b.json",
        &[],
    );
    let (a, _) = ledger(
        &["--replay", rec, "--host", "node-9"],
        dir.path(),
        "a.json",
        &[],
    );
    let fleet = dir.path().join("fleet.json");
    let merged = run_chd(
        &[
            "ledger",
            "--merge",
            b.to_str().unwrap(),
            a.to_str().unwrap(),
            "--out",
            fleet.to_str().unwrap(),
        ],
        &[],
    );
    assert!(merged.status.success(), "{}", text(&merged.stderr));
    assert_valid(&[&fleet]);
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&fleet).unwrap()).unwrap();
    assert_eq!(doc["schema"], "chd.calibration-fleet/v1");
    let hosts: Vec<&str> = doc["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["node"]["host"].as_str().unwrap())
        .collect();
    assert_eq!(hosts, ["node-9", "node-10"]);

    let dup = run_chd(
        &[
            "ledger",
            "--merge",
            a.to_str().unwrap(),
            a.to_str().unwrap(),
        ],
        &[],
    );
    assert!(!dup.status.success());
    assert!(
        text(&dup.stderr).contains("host \"node-9\" is already in"),
        "{}",
        text(&dup.stderr)
    );

    let mut old: Value = serde_json::from_str(&std::fs::read_to_string(&b).unwrap()).unwrap();
    old["schema"] = "chd.calibration/v0".into();
    let old_path = dir.path().join("old.json");
    std::fs::write(&old_path, old.to_string()).unwrap();
    let refused = run_chd(
        &[
            "ledger",
            "--merge",
            a.to_str().unwrap(),
            old_path.to_str().unwrap(),
        ],
        &[],
    );
    assert!(!refused.status.success());
    let err = text(&refused.stderr);
    assert!(
        err.contains("chd.calibration/v0") && err.contains("old.json"),
        "{err}"
    );
    // A fleet file is not a node's ledger: merging it is refused too.
    let again = run_chd(&["ledger", "--merge", fleet.to_str().unwrap()], &[]);
    assert!(
        text(&again.stderr).contains("chd.calibration-fleet/v1"),
        "{}",
        text(&again.stderr)
    );
}

/// A live `chd serve` (host backend): once a window has measured, its ledger validates and
/// holds the measured cells, this host's name and the host backend's devices.
#[test]
fn a_live_nodes_ledger_validates() {
    let dir = tempfile::tempdir().unwrap();
    let chd = Chd::serve(
        dir.path(),
        &[
            "--backend",
            "host",
            "--interval",
            "1s",
            "--window-budget",
            "500ms",
            "--cpu-busy-threshold",
            "1",
            "--sizes",
            "4",
            "--iterations",
            "2",
        ],
    );
    chd.wait_for(std::time::Duration::from_secs(30), "a measured cell", |m| {
        !m.find("chd_h2d_bandwidth_bytes_per_second", &[]).is_empty()
    });
    let (status, _, body) = chd.get("/api/v1/calibration", None);
    assert_eq!(status, 200, "{body}");
    let path = dir.path().join("live.json");
    std::fs::write(&path, &body).unwrap();
    assert_valid(&[&path]);
    let doc: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["source"], "chd serve");
    assert_eq!(doc["node"]["backend"], "host");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(doc["node"]["host"], host.trim());
    let cells = doc["h2d_gbps_by_core_device"][0]["cells"]
        .as_array()
        .unwrap();
    assert!(
        cells
            .iter()
            .any(|c| c["gbps"].as_f64().is_some_and(|g| g > 0.0)),
        "{body}"
    );
    assert!(doc["node"]["devices"][0]["id"]
        .as_str()
        .unwrap()
        .starts_with("numa"));
    chd.terminate();
}

/// Issue 28: `chd ledger --replay` takes a ClusterHealthDetect H2D workbook (as `chd report`,
/// `chd serve --replay`, `chd check` and `chd advise` do, through `dataset::load`): its cells
/// and the CPU that cannot be bound are in a ledger that validates.
#[test]
fn a_cluster_health_workbook_gives_a_valid_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let wb = crate::workbook_files::generate("h2d", &dir.path().join("core-h2d.xlsx"));
    let (path, doc) = ledger(
        &["--replay", wb.to_str().unwrap()],
        dir.path(),
        "wb.json",
        &[],
    );
    assert_eq!(doc["schema"], "chd.calibration/v2");
    assert_valid(&[&path]);
    // 7 CPUs with a row (CPU 7 failed every sample) x 4 devices, less the empty and the nan
    // cell, at each of the two sizes; NPU 1 is the slow column; CPU 7 cannot be bound.
    let matrices = doc["h2d_gbps_by_core_device"].as_array().unwrap();
    assert_eq!(matrices.len(), 2);
    for m in matrices {
        assert_eq!(m["cells"].as_array().unwrap().len(), 7 * 4 - 2, "{m}");
    }
    assert_eq!(doc["affinity_bindable_cpus"]["not_bindable"], "7");
    assert_eq!(doc["verdict"]["causes"][0]["id"], "slow_device:1");
}

/// One `chd probe` run directory of each kind besides h2d and pair (tests/fixtures/run-dirs,
/// written by chd itself) gives a ledger with its section, and every one validates; a v1
/// ledger of an earlier chd (tests/fixtures/ledger) merges into a valid v2 fleet file.
#[test]
fn every_kind_has_its_section_and_an_old_ledger_still_reads() {
    let dir = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    for kind in ["d2d", "p2p", "sweep", "basics"] {
        let run = fixture(&format!("run-dirs/{kind}"));
        let (path, doc) = ledger(
            &["--replay", run.to_str().unwrap()],
            dir.path(),
            &format!("{kind}.json"),
            &[],
        );
        match kind {
            "d2d" => {
                let size = &doc["d2d"][0];
                assert_eq!(size["size_bytes"], 1 << 20);
                let devices: Vec<&str> = size["devices"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d["device"].as_str().unwrap())
                    .collect();
                assert_eq!(devices, ["0", "1", "2"]);
                // Device 2's cells were planned on CPU 2, which failed to bind.
                assert_eq!(size["devices"][2]["gbps"], Value::Null);
                assert_eq!(size["devices"][0]["ratio"], 1.0);
            }
            "p2p" => {
                let pairs = doc["p2p"]["pairs"].as_array().unwrap();
                assert!(!pairs.is_empty());
                let classes: Vec<&str> = doc["p2p"]["classes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|c| c["path"].as_str().unwrap())
                    .collect();
                assert_eq!(classes, ["PIX", "SYS"], "the run's recorded path classes");
                assert_eq!(pairs[0]["src"], "0");
                assert_eq!(pairs[0]["dst"], "1");
                assert_eq!(pairs[0]["path"], "PIX");
            }
            "sweep" => {
                let curves = doc["sweeps"].as_array().unwrap();
                let ops: std::collections::BTreeSet<&str> =
                    curves.iter().map(|c| c["op"].as_str().unwrap()).collect();
                assert!(ops.contains("h2d") && ops.contains("d2d"), "{ops:?}");
                let points = curves[0]["points"].as_array().unwrap();
                assert_eq!(points.len(), 3, "128, 256 and 512 KiB");
                assert_eq!(points[0]["size_bytes"], 128 << 10);
            }
            "basics" => {
                let rows = doc["basics"]["rows"].as_array().unwrap();
                let matmul = rows.iter().find(|r| r["measurement"] == "matmul").unwrap();
                assert_eq!(matmul["unit"], "TFLOPS");
                assert_eq!(matmul["failed"][0]["device"], "2");
            }
            _ => unreachable!(),
        }
        paths.push(path);
    }
    let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
    assert_valid(&refs);

    let fleet = dir.path().join("fleet.json");
    let merged = run_chd(
        &[
            "ledger",
            "--merge",
            fixture("ledger/v1-advise.json").to_str().unwrap(),
            paths[0].to_str().unwrap(),
            "--out",
            fleet.to_str().unwrap(),
        ],
        &[],
    );
    assert!(merged.status.success(), "{}", text(&merged.stderr));
    assert_valid(&[&fleet]);
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&fleet).unwrap()).unwrap();
    let old = doc["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node"]["host"] == "fixture-v1")
        .expect("the v1 ledger is in the fleet file");
    assert_eq!(old["schema"], "chd.calibration/v2");
    assert_eq!(old["d2d"], serde_json::json!([]));
}
