//! `chd probe fabric` on this machine's loopback, two ranks as two processes (as two nodes
//! named by `--node`): the run, and the faults a launcher meets: a rank that never arrives, a
//! wrong token, a rank killed mid-run, rank 0 killed mid-run. Each ends on every surviving
//! rank within its deadline with an error that names the rank, and the failed run is
//! recorded. Traffic only on 127.0.0.1.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::chd_process::{chd_bin, text};

pub(crate) const TOKEN: &str = "fabric-test-token-0123456789";

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One rank: `chd probe fabric` on loopback with the test's token.
pub(crate) fn rank(
    rank: u32,
    port: u16,
    node: &str,
    state: &Path,
    token: &str,
    extra: &[&str],
) -> Command {
    let mut c = Command::new(chd_bin());
    c.args(["probe", "fabric", "--world-size", "2", "--rails", "^lo$"])
        .args(["--rank", &rank.to_string()])
        .args(["--rendezvous", &format!("127.0.0.1:{port}")])
        .args([
            "--node",
            node,
            "--format",
            "json",
            "--collective-sizes",
            "4MiB",
        ])
        .arg("--state-dir")
        .arg(state)
        .args(extra)
        .env("CHD_FABRIC_TOKEN", token)
        // Each rank plays a node of its own: NCCL tells hosts apart by NCCL_HOSTID (the
        // device backends' runs; the host backend ignores it).
        .env("NCCL_HOSTID", node)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// A rank running in the background, its stderr collected as it comes.
pub(crate) struct Running {
    child: Child,
    log: Arc<Mutex<String>>,
}

impl Running {
    pub(crate) fn start(mut c: Command) -> Running {
        let mut child = c.spawn().expect("spawn chd probe fabric");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let l = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut g = l.lock().unwrap();
                g.push_str(&line);
                g.push('\n');
            }
        });
        Running { child, log }
    }

    fn wait_for_log(&mut self, needle: &str) {
        // Bounded by what the rank does: it logs the line, or it exits first (a failure).
        while !self.log.lock().unwrap().contains(needle) {
            if let Ok(Some(status)) = self.child.try_wait() {
                std::thread::sleep(Duration::from_millis(50));
                panic!(
                    "the rank exited ({status}) before logging {needle:?}:\n{}",
                    self.log.lock().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Wait for the exit; (status success, stdout, stderr).
    pub(crate) fn finish(self) -> (bool, String, String) {
        let out: Output = self.child.wait_with_output().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let log = self.log.lock().unwrap().clone();
        (out.status.success(), text(&out.stdout), log)
    }
}

pub(crate) fn records(state: &Path) -> Vec<Value> {
    let dir = state.join("fabric");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        out.push(serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap());
    }
    out
}

#[test]
fn two_ranks_measure_loopback_both_ways_and_each_node_keeps_its_side() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (sa, sb) = (dir.path().join("a"), dir.path().join("b"));
    let out = dir.path().join("out");
    let r0 = Running::start(rank(
        0,
        port,
        "node-a",
        &sa,
        TOKEN,
        &["--bytes", "32MiB", "--out", out.to_str().unwrap()],
    ));
    let r1 = Running::start(rank(1, port, "node-b", &sb, TOKEN, &["--bytes", "32MiB"]));
    let (ok1, stdout1, log1) = r1.finish();
    let (ok0, stdout0, log0) = r0.finish();
    assert!(ok0 && ok1, "rank 0:\n{log0}\nrank 1:\n{log1}");
    let printed: Value = serde_json::from_str(&stdout0).unwrap();
    assert_eq!(printed["rank"], 0);
    assert_eq!(printed["world_size"], 2);
    assert_eq!(printed["outcome"], "ok");
    let result = &printed["results"][0];
    assert_eq!(result["peer"], "node-b");
    let rails = result["rails"].as_array().unwrap();
    let ways: Vec<&str> = rails
        .iter()
        .map(|r| r["direction"].as_str().unwrap())
        .collect();
    assert_eq!(ways, ["send", "receive"]);
    for r in rails {
        assert_eq!(r["rail"], "lo");
        assert_eq!(r["bytes"], 32 << 20, "{r}");
        assert!(r["gbps"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(r["slow"], false, "one rail is never judged slow: {r}");
    }
    // The collectives over both ranks: allgather and allreduce of 4 MiB, bus bandwidth as
    // nccl-tests defines it (2 ranks: allgather (n-1)/n of the algorithm bandwidth, allreduce
    // 2(n-1)/n).
    let collectives = result["collectives"].as_array().unwrap();
    let ops: Vec<&str> = collectives
        .iter()
        .map(|c| c["op"].as_str().unwrap())
        .collect();
    assert_eq!(ops, ["allgather", "allreduce"], "{result}");
    for c in collectives {
        assert_eq!(
            (c["bytes"].as_u64(), c["ranks"].as_u64()),
            (Some(4 << 20), Some(2)),
            "{c}"
        );
        let (alg, bus) = (
            c["alg_gbps"].as_f64().unwrap(),
            c["bus_gbps"].as_f64().unwrap(),
        );
        let factor = if c["op"] == "allgather" { 0.5 } else { 1.0 };
        assert!((bus - alg * factor).abs() < 1e-9 && bus > 0.0, "{c}");
    }
    // Rank 1 sees the same two transfers from the other side.
    let p1: Value = serde_json::from_str(&stdout1).unwrap();
    let r1rails = p1["results"][0]["rails"].as_array().unwrap();
    assert_eq!(r1rails[0]["direction"], "send");
    assert_eq!(
        r1rails[0]["gbps"], rails[1]["gbps"],
        "rank 1's send is rank 0's receive"
    );
    // Each node's state directory holds its own side; --out has rank 0's and the whole run.
    let a = records(&sa);
    assert_eq!(
        (a.len(), a[0]["node"].as_str(), a[0]["peer"].as_str()),
        (1, Some("node-a"), Some("node-b"))
    );
    assert_eq!(records(&sb)[0]["node"], "node-b");
    let whole: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("fabric-run.json")).unwrap())
            .unwrap();
    assert_eq!(whole["ranks"].as_array().unwrap().len(), 2);
    assert_eq!(whole["transfers"].as_array().unwrap().len(), 2);
}

#[test]
fn a_rank_that_never_arrives_fails_rank_0_within_its_deadline_and_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("a");
    let r0 = Running::start(rank(
        0,
        free_port(),
        "node-a",
        &state,
        TOKEN,
        &["--timeout", "2"],
    ));
    let (ok, stdout, log) = r0.finish();
    assert!(!ok);
    assert!(log.contains("rank 1 never arrived within 2 s"), "{log}");
    let printed: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(printed["outcome"], "failed");
    let kept = records(&state);
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0]["outcome"], "failed");
    assert_eq!(kept[0]["peer"], "unknown");
    assert!(kept[0]["error"].as_str().unwrap().contains("never arrived"));
}

#[test]
fn a_wrong_token_is_refused_on_both_sides() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let r0 = Running::start(rank(
        0,
        port,
        "node-a",
        &dir.path().join("a"),
        TOKEN,
        &["--timeout", "4"],
    ));
    let r1 = Running::start(rank(
        1,
        port,
        "node-b",
        &dir.path().join("b"),
        "not-the-token-0123456789",
        &["--timeout", "4"],
    ));
    let (ok1, _, log1) = r1.finish();
    let (ok0, _, log0) = r0.finish();
    assert!(!ok0 && !ok1);
    assert!(
        log1.contains("refused this rank: rank 1 (node-b) does not have the run's token"),
        "{log1}"
    );
    assert!(
        log0.contains("rank 1 never arrived") && log0.contains("does not have the run's token"),
        "{log0}"
    );
    let short = rank(1, port, "node-b", &dir.path().join("b"), "short", &[])
        .output()
        .unwrap();
    assert!(!short.status.success());
    assert!(
        text(&short.stderr).contains("CHD_FABRIC_TOKEN is 5 bytes"),
        "{}",
        text(&short.stderr)
    );
}

#[test]
fn a_rank_killed_mid_run_ends_the_run_on_rank_0_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    // A transfer far larger than loopback carries in the test's time: in flight when killed.
    let big = ["--bytes", "512GiB", "--transfer-timeout", "30"];
    let r0 = Running::start(rank(0, port, "node-a", &dir.path().join("a"), TOKEN, &big));
    let mut r1 = Running::start(rank(1, port, "node-b", &dir.path().join("b"), TOKEN, &big));
    r1.wait_for_log("the plan has 2 transfers");
    r1.child.kill().unwrap();
    let _ = r1.child.wait();
    let started = Instant::now();
    let (ok0, stdout0, log0) = r0.finish();
    assert!(!ok0);
    assert!(log0.contains("rank 1 (node-b) died during step"), "{log0}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "rank 0 took {:?}",
        started.elapsed()
    );
    let printed: Value = serde_json::from_str(&stdout0).unwrap();
    assert_eq!(printed["outcome"], "failed");
    assert_eq!(
        printed["results"][0]["peer"], "node-b",
        "rank 0 knew its peer"
    );
}

#[test]
fn rank_0_killed_mid_run_ends_the_run_on_the_other_rank() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let big = ["--bytes", "512GiB", "--transfer-timeout", "30"];
    let mut r0 = Running::start(rank(0, port, "node-a", &dir.path().join("a"), TOKEN, &big));
    let mut r1 = Running::start(rank(1, port, "node-b", &dir.path().join("b"), TOKEN, &big));
    // Mid-run: once rank 1 has the plan (rank 0 logs its plan before it sends it, so a kill
    // right after rank 0's line may land before rank 1 has it).
    r1.wait_for_log("the plan has");
    r0.child.kill().unwrap();
    let _ = r0.child.wait();
    let (ok1, _, log1) = r1.finish();
    assert!(!ok1);
    assert!(
        log1.contains("rank 0 at 127.0.0.1") && log1.contains("was lost mid-run"),
        "{log1}"
    );
    assert_eq!(records(&dir.path().join("b"))[0]["outcome"], "failed");
}

/// Five nodes' state directories as a fleet collects them: every pair both ways at 10 GB/s
/// over two rails, but node n3 at 2 with everyone and the path n1 -> n2 at 3.
#[test]
fn chd_report_on_a_fleet_names_the_slow_node_and_the_slow_path() {
    use chd::format::fabric::{self, FabricRecord, Outcome, RailRecord, Way, SCHEMA};
    let dir = tempfile::tempdir().unwrap();
    let nodes = ["n1", "n2", "n3", "n4", "n5"];
    let speed = |s: &str, r: &str| match (s, r) {
        ("n3", _) | (_, "n3") => 2.0,
        ("n1", "n2") => 3.0,
        _ => 10.0,
    };
    let rail = |name: &str, way, gbps: f64| RailRecord {
        rail: name.into(),
        address: "10.0.0.1".into(),
        peer_rail: Some(name.into()),
        peer_address: Some("10.0.0.2".into()),
        way,
        gbps: Some(gbps),
        bytes: 1 << 30,
        streams: 4,
        seconds: Some(1.0),
        error: None,
        slow: false,
        cpus: None,
        rdma_port: None,
        device: None,
    };
    for s in nodes {
        for r in nodes.iter().filter(|r| **r != s) {
            let record = FabricRecord {
                schema: SCHEMA,
                run: format!("run-{s}-{r}"),
                node: s.into(),
                peer: r.to_string(),
                backend: "host".into(),
                world_size: 2,
                started: 1.0,
                finished: 2.0,
                outcome: Outcome::Ok,
                error: None,
                rails: vec![
                    rail("eth1", Way::Send, speed(s, r) / 2.0),
                    rail("eth2", Way::Send, speed(s, r) / 2.0),
                    rail("eth1", Way::Receive, speed(r, s) / 2.0),
                    rail("eth2", Way::Receive, speed(r, s) / 2.0),
                ],
                collectives: Vec::new(),
            };
            fabric::write(&fabric::dir_of(&dir.path().join(s)), &record).unwrap();
        }
    }
    let out = dir.path().join("report");
    let ran = crate::chd_process::run_chd(
        &[
            "report",
            dir.path().to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
        &[],
    );
    let stdout = text(&ran.stdout);
    assert!(ran.status.success(), "{stdout}{}", text(&ran.stderr));
    let findings: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("finding:"))
        .collect();
    assert_eq!(findings.len(), 2, "{stdout}");
    assert!(
        findings[0].contains("node n3 is slow with 8 of its 8"),
        "{stdout}"
    );
    assert!(
        findings[1].contains("n1 -> n2 carries 0.30 x the median pair"),
        "{stdout}"
    );
    let md = std::fs::read_to_string(out.join("fabric.md")).unwrap();
    assert!(
        md.contains("| n1 | - | **3.000** | **2.000** | 10.000 | 10.000 |"),
        "{md}"
    );
    let csv = std::fs::read_to_string(out.join("fabric.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 20 * 4, "{csv}");
    assert!(std::fs::metadata(out.join("fabric.png")).unwrap().len() > 1000);
}

/// `--bind CPULIST` pins a rank's streams there and its records say so; `auto` on loopback
/// (no network device, no NUMA node) runs unbound and says nothing; CPUs the rank may not use
/// are refused before anyone waits.
#[test]
fn bind_places_a_ranks_streams_and_its_records_name_the_cpus() {
    let allowed = crate::chd_process::allowed_cpus();
    let cpu = allowed[allowed.len() - 1].to_string();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (sa, sb) = (dir.path().join("a"), dir.path().join("b"));
    let r0 = Running::start(rank(
        0,
        port,
        "node-a",
        &sa,
        TOKEN,
        &["--bytes", "8MiB", "--bind", &cpu],
    ));
    let r1 = Running::start(rank(1, port, "node-b", &sb, TOKEN, &["--bytes", "8MiB"]));
    let (ok1, _, log1) = r1.finish();
    let (ok0, _, log0) = r0.finish();
    assert!(ok0 && ok1, "rank 0:\n{log0}\nrank 1:\n{log1}");
    assert!(
        log0.contains(&format!("lo 127.0.0.1 (CPUs {cpu})")),
        "{log0}"
    );
    assert!(log1.contains("lo 127.0.0.1 (unbound)"), "{log1}");
    for r in records(&sa)[0]["rails"].as_array().unwrap() {
        assert_eq!(r["cpus"], cpu.as_str(), "{r}");
    }
    for r in records(&sb)[0]["rails"].as_array().unwrap() {
        assert!(r.get("cpus").is_none(), "{r}");
    }

    let out = std::process::Command::new(chd_bin())
        .args(["probe", "fabric", "--world-size", "2", "--rank", "0"])
        .args([
            "--rendezvous",
            "127.0.0.1:1",
            "--rails",
            "^lo$",
            "--bind",
            "4000",
        ])
        .arg("--state-dir")
        .arg(dir.path().join("c"))
        .env("CHD_FABRIC_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("--bind 4000: none of these CPUs may be used"),
        "{err}"
    );
}

/// A rail that is an RDMA port (a RoCE interface on its HCA, in the kernel's sysfs layout:
/// `class/net/<if>` -> `<function>/net/<if>`, `<function>/infiniband/<hca>/ports/<n>`) is named
/// `HCA:PORT` in its records and in the rank's log.
#[test]
fn a_rail_on_an_hca_is_named_by_its_rdma_port() {
    let dir = tempfile::tempdir().unwrap();
    let sys = dir.path().join("sys");
    let function = sys.join("devices/pci0000:16/0000:16:02.0/0000:18:00.0");
    std::fs::create_dir_all(function.join("net/lo")).unwrap();
    std::fs::write(function.join("net/lo/dev_port"), "0\n").unwrap();
    std::fs::write(function.join("numa_node"), "0\n").unwrap();
    std::fs::create_dir_all(function.join("infiniband/mlx5_9/ports/1")).unwrap();
    std::fs::create_dir_all(sys.join("class/net")).unwrap();
    std::os::unix::fs::symlink(
        "../../devices/pci0000:16/0000:16:02.0/0000:18:00.0/net/lo",
        sys.join("class/net/lo"),
    )
    .unwrap();
    let port = free_port();
    let (sa, sb) = (dir.path().join("a"), dir.path().join("b"));
    let sys_arg = sys.display().to_string();
    let extra = [
        "--bytes",
        "4MiB",
        "--bind",
        "none",
        "--sysfs-root",
        sys_arg.as_str(),
    ];
    let r0 = Running::start(rank(0, port, "node-a", &sa, TOKEN, &extra));
    let r1 = Running::start(rank(1, port, "node-b", &sb, TOKEN, &extra));
    let (ok1, _, log1) = r1.finish();
    let (ok0, _, log0) = r0.finish();
    assert!(ok0 && ok1, "rank 0:\n{log0}\nrank 1:\n{log1}");
    assert!(log0.contains("lo mlx5_9:1 127.0.0.1 (unbound)"), "{log0}");
    for r in records(&sa)[0]["rails"].as_array().unwrap() {
        assert_eq!(r["rdma_port"], "mlx5_9:1", "{r}");
    }
    // chd report's fabric.csv carries the port of every rail row.
    let out = dir.path().join("report");
    let ran = crate::chd_process::run_chd(
        &[
            "report",
            sa.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
        &[],
    );
    assert!(ran.status.success(), "{}", text(&ran.stderr));
    let csv = std::fs::read_to_string(out.join("fabric.csv")).unwrap();
    let mut lines = csv.lines();
    assert!(
        lines
            .next()
            .unwrap()
            .ends_with(",error,rdma_port,cpus,device"),
        "{csv}"
    );
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 2, "{csv}");
    assert!(rows.iter().all(|l| l.ends_with(",mlx5_9:1,,")), "{csv}");
}
