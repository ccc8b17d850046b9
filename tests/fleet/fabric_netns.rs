//! Two nodes in network namespaces, three rails between them (veth pairs in their own
//! subnets, each side shaped to 1 Gbit/s with `tc qdisc ... tbf`, a rate any loaded machine
//! sustains): rail 2 throttled to 100 Mbit/s one way, rail 3 a black hole (each side routes
//! the other's address to nowhere: a rail that carries nothing). One `chd probe fabric` rank
//! runs in each namespace (host backend, TCP over the veths); each node's `chd serve`
//! publishes what its rank wrote into its state directory, and a real Prometheus with chd's
//! rules fires `ChdFabricRailSlow` for exactly the throttled rail's direction on both of its
//! nodes and for the dead rail, and nothing else of the fabric group.
//!
//! The same run with `--backend cuda` and `--backend acl` over the fake CUDA runtime / ACL and
//! their NCCL / HCCL, whose point-to-point sends and collectives move real bytes over sockets
//! bound to the interface `NCCL_SOCKET_IFNAME` / `HCCL_SOCKET_IFNAME` select: each rail is a
//! send between two rank processes chd starts for it, confined to it by those variables, so
//! the same rails are judged the same way.
//!
//! Traffic only on addresses inside the namespaces the test made; they (and their veths) are
//! deleted at the end, and every process started is stopped by its pid. Needs root (network
//! namespaces): the test fails saying so otherwise.

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::chd_process::{chd_bin, text, Chd};
use crate::fake::fake_runtime_path;
use crate::json_schema::{calibration_schema, validate};
use crate::prometheus::{rules_path, rules_with_for, Prometheus};

/// Two namespaces, deleted on drop.
struct Namespaces {
    a: String,
    b: String,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap_or_else(|e| {
        panic!("`ip` (iproute2) is required for this test and could not be run: {e}; apt-get install iproute2")
    });
    assert!(
        out.status.success(),
        "ip {}: {}{}",
        args.join(" "),
        text(&out.stdout),
        text(&out.stderr)
    );
}

fn in_ns(ns: &str, args: &[&str]) {
    let mut all = vec!["netns", "exec", ns];
    all.extend_from_slice(args);
    ip(&all);
}

impl Namespaces {
    fn create(tag: &str) -> Namespaces {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let euid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|u| u.parse::<u32>().ok());
        assert_eq!(
            euid,
            Some(0),
            "the two-namespace fabric test needs root (ip netns add); run the suite as root, as CI does"
        );
        let pid = std::process::id();
        let ns = Namespaces {
            a: format!("chdfab-a-{tag}-{pid}"),
            b: format!("chdfab-b-{tag}-{pid}"),
        };
        ip(&["netns", "add", &ns.a]);
        ip(&["netns", "add", &ns.b]);
        for n in [&ns.a, &ns.b] {
            in_ns(n, &["ip", "link", "set", "lo", "up"]);
        }
        for rail in 1..=3 {
            let (va, vb) = (format!("va{rail}"), format!("vb{rail}"));
            ip(&[
                "-n", &ns.a, "link", "add", &va, "type", "veth", "peer", "name", &vb, "netns",
                &ns.b,
            ]);
            in_ns(
                &ns.a,
                &[
                    "ip",
                    "addr",
                    "add",
                    &format!("10.231.{rail}.1/24"),
                    "dev",
                    &va,
                ],
            );
            in_ns(
                &ns.b,
                &[
                    "ip",
                    "addr",
                    "add",
                    &format!("10.231.{rail}.2/24"),
                    "dev",
                    &vb,
                ],
            );
            in_ns(&ns.a, &["ip", "link", "set", &va, "up"]);
            in_ns(&ns.b, &["ip", "link", "set", &vb, "up"]);
        }
        // Every side of rails 1 and 2 sends at 1 Gbit/s, a rate any loaded machine sustains,
        // so what is measured is the links, not how busy the CPUs are; node a's side of rail 2
        // at 100 Mbit/s: the throttled direction.
        for (n, dev, rate) in [
            (&ns.a, "va1", "1gbit"),
            (&ns.b, "vb1", "1gbit"),
            (&ns.b, "vb2", "1gbit"),
            (&ns.a, "va2", "100mbit"),
        ] {
            in_ns(
                n,
                &[
                    "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", "1mb",
                    "latency", "100ms",
                ],
            );
        }
        // Rail 3 carries nothing, either way.
        // Streams bound to the rail's device skip the host route, so each side black-holes the
        // other's address: the answers to the other side's SYNs go nowhere, both ways.
        in_ns(&ns.b, &["ip", "route", "add", "blackhole", "10.231.3.1/32"]);
        in_ns(&ns.a, &["ip", "route", "add", "blackhole", "10.231.3.2/32"]);
        ns
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

const TOKEN: &str = "netns-fabric-token-0123456789";

/// What measures.
#[derive(Debug, Clone, Copy)]
enum Via {
    /// TCP streams and ring.
    Host,
    /// The fake CUDA runtime and NCCL.
    Cuda,
    /// The fake ACL and HCCL.
    Acl,
}

fn rank(
    ns: &str,
    rank: u32,
    node: &str,
    rails: &str,
    state: &std::path::Path,
    port: u16,
    via: Via,
) -> Command {
    let mut c = Command::new("ip");
    c.args([
        "netns",
        "exec",
        ns,
        chd_bin(),
        "probe",
        "fabric",
        "--world-size",
        "2",
    ])
    .args([
        "--rank",
        &rank.to_string(),
        "--node",
        node,
        "--rails",
        rails,
    ])
    .args(["--rendezvous", &format!("10.231.1.1:{port}")])
    .args([
        "--bytes",
        "16MiB",
        "--streams",
        "4",
        "--timeout",
        "60",
        "--format",
        "json",
        "--collective-sizes",
        "8MiB",
    ])
    .arg("--state-dir")
    .arg(state)
    .env("CHD_FABRIC_TOKEN", TOKEN)
    // The fake's ranks give up on a peer that never connects (the dead rail) well within
    // chd's own deadline for the rank process.
    .env("CHD_FAKE_PAIR_TIMEOUT_MS", "8000")
    // The two namespaces share one host, its name and boot id; NCCL tells hosts apart by
    // NCCL_HOSTID (one rank per GPU and host).
    .env("NCCL_HOSTID", node);
    let fake = fake_runtime_path();
    match via {
        Via::Host => {}
        Via::Cuda => {
            c.args(["--backend", "cuda", "--cuda-runtime", fake, "--nccl", fake]);
        }
        Via::Acl => {
            c.args(["--backend", "acl", "--acl-runtime", fake, "--hccl", fake]);
        }
    }
    c.args(["--transfer-timeout", "30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

#[test]
fn a_throttled_rail_between_two_namespaces_fires_on_both_of_its_nodes() {
    throttled_rail_fires(Via::Host, "tcp");
}

#[test]
fn over_nccl_a_throttled_rail_fires_on_both_of_its_nodes() {
    throttled_rail_fires(Via::Cuda, "nccl");
}

#[test]
fn over_hccl_a_throttled_rail_fires_on_both_of_its_nodes() {
    throttled_rail_fires(Via::Acl, "hccl");
}

fn throttled_rail_fires(via: Via, tag: &str) {
    let ns = Namespaces::create(tag);
    let dir = tempfile::tempdir().unwrap();
    let (sa, sb) = (dir.path().join("node-a"), dir.path().join("node-b"));
    // Each test has namespaces of its own: the same port in each.
    let port = 29700 + (std::process::id() % 200) as u16;
    let r0 = rank(&ns.a, 0, "node-a", "^va", &sa, port, via)
        .spawn()
        .unwrap();
    let r1 = rank(&ns.b, 1, "node-b", "^vb", &sb, port, via)
        .spawn()
        .unwrap();
    let (o1, o0) = (
        r1.wait_with_output().unwrap(),
        r0.wait_with_output().unwrap(),
    );
    assert!(
        o0.status.success() && o1.status.success(),
        "rank 0:\n{}\nrank 1:\n{}",
        text(&o0.stderr),
        text(&o1.stderr)
    );

    // The table of the run, both nodes' sides.
    let mut slow = BTreeSet::new();
    println!("{via:?}:");
    println!(
        "{:<8} {:<5} {:<8} {:>10}  judged",
        "node", "rail", "way", "GB/s"
    );
    for out in [&o0, &o1] {
        let printed: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
        let node = printed["node"].as_str().unwrap().to_string();
        for r in printed["results"][0]["rails"].as_array().unwrap() {
            let (rail, way) = (
                r["rail"].as_str().unwrap(),
                r["direction"].as_str().unwrap(),
            );
            println!(
                "{node:<8} {rail:<5} {way:<8} {:>10}  {}",
                r["gbps"].as_f64().map_or("-".into(), |g| format!("{g:.3}")),
                r["error"].as_str().map_or_else(
                    || if r["slow"] == true {
                        "slow".to_string()
                    } else {
                        "ok".to_string()
                    },
                    |e| format!("failed: {e}")
                )
            );
            if r["slow"] == true {
                slow.insert(format!("{node} {rail} {way}"));
            }
        }
        // The collectives over both ranks ran (on a device backend, in rank processes of
        // their own, rank 0's rendezvous relayed with the first).
        for c in printed["results"][0]["collectives"].as_array().unwrap() {
            println!(
                "{node:<8} {:<14} {:>10}  bus GB/s {}",
                c["op"].as_str().unwrap(),
                c["bytes"],
                c["bus_gbps"]
                    .as_f64()
                    .map_or("-".into(), |g| format!("{g:.3}"))
            );
            assert!(c["error"].is_null(), "{via:?} {node}: {c}");
            assert!(c["bus_gbps"].as_f64().unwrap() > 0.0, "{via:?} {node}: {c}");
        }
    }
    // Slow: the throttled direction of rail 2, seen from both of its nodes, and the dead
    // rail 3 both ways on both. Not rail 1, nor rail 2's other direction.
    let must: BTreeSet<String> = [
        "node-a va2 send",
        "node-a va3 send",
        "node-a va3 receive",
        "node-b vb2 receive",
        "node-b vb3 send",
        "node-b vb3 receive",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(slow, must, "the rails the probe judged slow");

    // Each node's chd serve publishes its side; Prometheus judges.
    // The verdict names a finding at its first window: the results are all there at start.
    let serve_args = ["--no-probe", "--verdict-confirm-windows", "1"];
    let serve_a = Chd::serve(&sa, &serve_args);
    let serve_b = Chd::serve(&sb, &serve_args);
    let scraped = serve_a.scrape();
    assert!(
        scraped.contains("chd_fabric_rail_gbps{rail=\"va1\",direction=\"send\"}"),
        "{scraped}"
    );
    // Each node's ledger holds its fabric section and a verdict naming its slow rails, and
    // validates against the schema.
    for (node, serve, dir) in [("node-a", &serve_a, &sa), ("node-b", &serve_b, &sb)] {
        // The scheduler's first tick judges right after start (and logs the change); the
        // held verdict is written right after the line.
        serve.wait_for_log("node verdict ok -> ", Duration::from_secs(60));
        let mut body = String::new();
        for _ in 0..100 {
            let (status, _, b) = serve.get("/api/v1/calibration", None);
            assert_eq!(status, 200, "{b}");
            body = b;
            if body.contains("slow_fabric_rail") {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let path = dir.join("served-ledger.json");
        std::fs::write(&path, &body).unwrap();
        if let Err(e) = validate(&calibration_schema(), &[&path]) {
            panic!("{node}'s ledger does not validate: {e}");
        }
        let doc: Value = serde_json::from_str(&body).unwrap();
        let ledger_slow: BTreeSet<String> = doc["fabric"]["rails"]
            .as_array()
            .unwrap_or_else(|| panic!("{node}: no fabric section: {body}"))
            .iter()
            .filter(|r| r["slow"] == true)
            .map(|r| {
                format!(
                    "{node} {} {}",
                    r["rail"].as_str().unwrap(),
                    r["direction"].as_str().unwrap()
                )
            })
            .collect();
        let of_node: BTreeSet<String> = must
            .iter()
            .filter(|m| m.starts_with(node))
            .cloned()
            .collect();
        assert_eq!(ledger_slow, of_node, "{node}'s ledger");
        let peers: Vec<&str> = doc["fabric"]["peers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["peer"].as_str().unwrap())
            .collect();
        assert_eq!(peers.len(), 1, "{node}: one peer: {peers:?}");
        let causes: BTreeSet<String> = doc["verdict"]["causes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_str().unwrap().to_string())
            .collect();
        let want: BTreeSet<String> = of_node
            .iter()
            .map(|m| {
                let mut w = m.split(' ').skip(1);
                format!(
                    "slow_fabric_rail:{}:{}",
                    w.next().unwrap(),
                    w.next().unwrap()
                )
            })
            .collect();
        assert_eq!(causes, want, "{node}'s verdict: {:#}", doc["verdict"]);
        assert_eq!(doc["verdict"]["level"], "degraded", "{node}");
    }
    let job = |name: &str, addr: std::net::SocketAddr| {
        format!("  - job_name: {name}\n    static_configs:\n      - targets: ['{addr}']\n")
    };
    let config = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nrule_files:\n  - chd.rules.yml\nscrape_configs:\n{}{}",
        job("chd-node-a", serve_a.addr),
        job("chd-node-b", serve_b.addr)
    );
    let rules = rules_with_for(&std::fs::read_to_string(rules_path()).unwrap(), "0s");
    let prom = Prometheus::start(&config, &[("chd.rules.yml", rules)]);
    let on_prom = |s: &String| s.replacen("node-", "chd-node-", 1);
    let want: BTreeSet<String> = must.iter().map(on_prom).collect();
    // Bounded by Prometheus' evaluations: it scrapes and evaluates every second.
    let start = Instant::now();
    let mut firing = BTreeSet::new();
    while start.elapsed() < Duration::from_secs(90) {
        firing = prom
            .firing()
            .into_iter()
            .filter(|a| a.name().starts_with("ChdFabric"))
            .map(|a| {
                assert_eq!(a.name(), "ChdFabricRailSlow", "{a:?}");
                format!(
                    "{} {} {}",
                    a.labels["job"], a.labels["rail"], a.labels["direction"]
                )
            })
            .collect();
        if firing == want {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(
        firing,
        want,
        "targets {:?}; ratios {:?}; alerts {:?}",
        prom.targets(),
        prom.query("chd_fabric_rail_ratio"),
        prom.alerts()
    );
    drop(serve_a);
    drop(serve_b);
}
