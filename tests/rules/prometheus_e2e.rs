//! The whole path to the pager, for real: a real Prometheus (Debian's `prometheus`, on a free
//! loopback port) loads alerts/chd.rules.yml (every `for` shortened to 0s, the hourly baseline
//! group evaluated every second) and scrapes
//!
//! - `chd-probing`: `chd serve` probing the fake CUDA runtime with five devices: device 0 is a
//!   slow column (12.3 GB/s against 58.9), device 1 is slow only from the CPU of NUMA node 1
//!   (a sysfs tree that puts the first two CPUs this process may use on NUMA nodes 0 and 1),
//!   device 4 fails every copy; the core-pair probe runs on devices 2,3 through the fake NCCL,
//!   with rank 0 slow on that same CPU;
//! - `chd-fixture`: `chd serve --no-probe` on the roce-dual-rail fixture tree (two RoCE rails,
//!   numastat, GPU 0's PCIe link trained at x8 of x16), for the RDMA, NUMA and PCIe series;
//! - `chd-replay`: a replayed ClusterHealthDetect recording;
//! - `chd-fleet-a`, `chd-fleet-b`, `chd-fleet-slow`: three nodes of one device model (`Fake
//!   B200`) on copies of the gpu-node fixture: two at 50 GB/s on Gen5 x16 links (b with device
//!   2 planted at 0.3 of its link), one at 25 GB/s on links trained at x8 (issue 15's fleet
//!   and physics rules);
//! - `chd-dead`: a port nobody listens on.
//!
//! It checks that exactly the expected alerts fire, with the right labels and annotations,
//! and that every PromQL expression of every dashboard returns data through the HTTP API.
//!
//! A second test has Prometheus scrape a chd with a web config (TLS, a client certificate
//! required, basic auth) as `deploy/prometheus/README.md` configures it: `scheme: https`,
//! `tls_config`, `basic_auth`; the same job with a wrong password is down with a 401.

use crate::prometheus;
use crate::tls;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::chd_process::Chd;
use crate::fake::fake_runtime_path;
use crate::prometheus::{
    dashboard_queries, dashboards, free_port, http_get, matrix_link, panels, rules_path,
    rules_with_for, substitute, Alert, Prometheus,
};
use crate::sysfs_builder::{CpuSpec, CpuTopology, Machine, NodeSpec, Numa};

/// How long to wait for the expected alerts (probing, scraping and evaluating every second).
const ALERT_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a dashboard query that returns no data is asked, a scrape interval apart.
const QUERY_TRIES: usize = 5;

/// CPUs this process may run on (the probe binds to them for real).
fn allowed_cpus() -> Vec<u32> {
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).expect("affinity");
    (0..nix::sched::CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .map(|c| c as u32)
        .collect()
}

/// A sysfs/procfs tree with the first allowed CPU on NUMA node 0 and the second (if any) on
/// node 1. Returns (sys, proc, the CPU of node 1).
fn two_node_tree(root: &Path) -> (PathBuf, PathBuf, Option<u32>) {
    let allowed = allowed_cpus();
    let first = allowed[0];
    let second = allowed.get(1).copied();
    let cpu = |id: u32, package: u32| CpuSpec {
        id,
        online: true,
        topology: Some(CpuTopology {
            physical_package_id: package.to_string(),
            core_id: "0".into(),
            die_id: "0".into(),
            thread_siblings: vec![id],
            package_cpus: vec![id],
            thread_siblings_list_text: None,
        }),
    };
    let mut cpus = vec![cpu(first, 0)];
    cpus.extend(second.map(|c| cpu(c, 1)));
    let present: Vec<u32> = cpus.iter().map(|c| c.id).collect();
    let machine = Machine {
        possible: present.iter().max().unwrap() + 1,
        allowed: Some(present),
        cpus,
        numa: Some(Numa {
            nodes: vec![
                NodeSpec {
                    id: 0,
                    cpus: vec![first],
                    mem_total_kb: 16 << 20,
                },
                NodeSpec {
                    id: 1,
                    cpus: second.into_iter().collect(),
                    mem_total_kb: 16 << 20,
                },
            ],
            has_memory_file: true,
        }),
    };
    let (sys, proc) = machine.write(root).expect("write sysfs tree");
    (sys, proc, second)
}

/// The gpu-node fixture (tests/fixtures/accelerators) copied under `root`, with every PCIe
/// link of the three functions the fleet nodes use trained at `width` lanes (of 16), Gen5.
fn fleet_node_tree(root: &Path, width: u32) -> (PathBuf, PathBuf) {
    let fixture = prometheus::repo().join("tests/fixtures/accelerators/gpu-node");
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(&fixture)
        .arg(root.join("node"))
        .status()
        .expect("cp");
    assert!(status.success(), "cp -a {fixture:?}");
    let sys = root.join("node/sys");
    for bdf in FLEET_BUS_IDS.split(',') {
        let dir = sys.join("bus/pci/devices").join(bdf.to_ascii_lowercase());
        std::fs::write(dir.join("current_link_width"), format!("{width}\n")).unwrap();
        std::fs::write(dir.join("max_link_width"), "16\n").unwrap();
        std::fs::write(dir.join("current_link_speed"), "32.0 GT/s PCIe\n").unwrap();
        std::fs::write(dir.join("max_link_speed"), "32.0 GT/s PCIe\n").unwrap();
    }
    (sys, root.join("node/proc"))
}

/// The PCI functions of gpu-node that the fleet nodes' three fake devices sit on.
const FLEET_BUS_IDS: &str = "0000:1A:00.0,0000:9C:00.0,0000:C1:00.0";

/// One node of the small fleet: the fake runtime's three devices (named `Fake B200`, a model
/// of its own) on the CPU tests run on first, at `gbps` (the fake's CHD_FAKE_H2D_GBPS rule).
fn fleet_node(state: &Path, tree: &Path, width: u32, gbps: &str) -> Chd {
    let (sys, proc) = fleet_node_tree(tree, width);
    let lib = fake_runtime_path();
    let cpu = allowed_cpus()[0].to_string();
    Chd::serve_env(
        state,
        &[
            "--sysfs-root",
            s(&sys),
            "--procfs-root",
            s(&proc),
            "--cpus",
            &cpu,
            "--interval",
            "1s",
            "--window-budget",
            "800ms",
            "--cpu-busy-threshold",
            "1",
            "--sizes",
            "64",
            "--iterations",
            "2",
            "--backend",
            "cuda",
            "--cuda-runtime",
            lib,
            "--nvml",
            lib,
        ],
        &[
            ("CHD_FAKE_DEVICE_COUNT", "3"),
            ("CHD_FAKE_PCI_BUS_IDS", FLEET_BUS_IDS),
            ("CHD_FAKE_DEVICE_NAME", "Fake B200"),
            ("CHD_FAKE_H2D_GBPS", gbps),
        ],
    )
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// An alert as the test compares it: name and the labels that identify it.
fn key(a: &Alert) -> String {
    let mut parts = vec![a.name().to_string()];
    for l in [
        "job",
        "device",
        "numa_node",
        "link",
        "size_bytes",
        "direction",
        "reason",
        "aer",
        "collector",
        "backend",
        "hca",
        "cpu",
        "pair",
        "rank",
    ] {
        if let Some(v) = a.labels.get(l) {
            parts.push(format!("{l}={v}"));
        }
    }
    parts.join(" ")
}

#[test]
fn alerts_fire_and_dashboards_return_data_in_a_real_prometheus() {
    let started = Instant::now();
    let lib = fake_runtime_path().to_string();

    // (a) A node probing the fake runtime.
    let tree = tempfile::tempdir().unwrap();
    let (sys, proc, numa1_cpu) = two_node_tree(tree.path());
    let slow_rule = numa1_cpu.map(|c| format!("1@{c}=6"));
    let pair_rule = match numa1_cpu {
        Some(c) => format!("13.7;rank0:{c}=4.0"),
        None => "13.7".to_string(),
    };
    let mut env = vec![
        ("CHD_FAKE_DEVICE_COUNT", "5"),
        ("CHD_FAKE_H2D_GBPS", "58.9;0=12.3"),
        ("CHD_FAKE_FAIL_DEVICES", "4"),
        ("CHD_FAKE_PAIR_GBPS", &pair_rule),
    ];
    if let Some(rule) = &slow_rule {
        env.push(("CHD_FAKE_SLOW_CPUS", rule));
    } else {
        eprintln!("only one CPU allowed: no second NUMA node, no slow segment to plant");
    }
    let state_probing = tempfile::tempdir().unwrap();
    let probing = Chd::serve_env(
        state_probing.path(),
        &[
            "--sysfs-root",
            s(&sys),
            "--procfs-root",
            s(&proc),
            "--interval",
            "1s",
            "--window-budget",
            "800ms",
            "--cpu-busy-threshold",
            "1",
            "--sizes",
            "64",
            "--iterations",
            "2",
            // The failing device 4 would fail a random peer copy pair with it each window
            // (`ChdProbeErrors device=SRC>DST`), which an exact alert set cannot name.
            "--p2p-size",
            "0",
            "--pair",
            "2,3",
            "--pair-size",
            "16",
            "--collective",
            "nccl",
            "--nccl",
            &lib,
            "--backend",
            "cuda",
            "--cuda-runtime",
            &lib,
            "--nvml",
            &lib,
        ],
        &env,
    );

    // (b) The dual-rail RoCE fixture machine, with the fake runtime's two GPUs tied to the
    // fixture's PCI functions (GPU 0 is the x8-of-x16 one).
    let fixture_root = prometheus::repo().join("tests/fixtures/collectors/roce-dual-rail");
    let state_fixture = tempfile::tempdir().unwrap();
    let fixture = Chd::serve_env(
        state_fixture.path(),
        &[
            "--sysfs-root",
            s(&fixture_root.join("sys")),
            "--procfs-root",
            s(&fixture_root.join("proc")),
            "--no-probe",
            "--backend",
            "cuda",
            "--cuda-runtime",
            &lib,
            "--nvml",
            &lib,
        ],
        &[
            ("CHD_FAKE_DEVICE_COUNT", "2"),
            ("CHD_FAKE_PCI_BUS_IDS", "0000:1A:00.0,0000:9B:00.0"),
        ],
    );

    // (c) A replayed ClusterHealthDetect recording: NPU 0 slow, a failed row on NPU 3, and
    // rank-0 CPU 6 slow in the 0,3 pair matrix.
    let state_replay = tempfile::tempdir().unwrap();
    let replay = Chd::serve(
        state_replay.path(),
        &[
            "--replay",
            s(&prometheus::repo().join("tests/fixtures/replay/results-npu-node.json")),
            "--interval",
            "1s",
            "--window-budget",
            "500ms",
        ],
    );

    // (e) A small fleet of one model (issue 15): two nodes at 50 GB/s on Gen5 x16 links, one
    // of them with device 2 planted at 18.9 GB/s (0.3 of its link), and one node whose every
    // device gives 25 GB/s on links trained at x8 (the seed's low-ceiling node).
    let fleet_trees: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let fleet_states: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let fleet_a = fleet_node(fleet_states[0].path(), fleet_trees[0].path(), 16, "50");
    let fleet_b = fleet_node(
        fleet_states[1].path(),
        fleet_trees[1].path(),
        16,
        "50;2=18.9",
    );
    let fleet_slow = fleet_node(fleet_states[2].path(), fleet_trees[2].path(), 8, "25");

    // (d) Nobody listens there.
    let dead = format!("127.0.0.1:{}", free_port());

    let probing_instance = probing.addr.to_string();
    let fixture_instance = fixture.addr.to_string();
    let replay_instance = replay.addr.to_string();
    let fleet_jobs: String = [
        ("chd-fleet-a", &fleet_a),
        ("chd-fleet-b", &fleet_b),
        ("chd-fleet-slow", &fleet_slow),
    ]
    .iter()
    .map(|(job, chd)| {
        format!(
            "\x20 - job_name: {job}\n    static_configs:\n      - targets: ['{}']\n",
            chd.addr
        )
    })
    .collect();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - chd.rules.yml\n\
         scrape_configs:\n\
         \x20 - job_name: chd-probing\n    static_configs:\n      - targets: ['{probing_instance}']\n\
         \x20 - job_name: chd-fixture\n    static_configs:\n      - targets: ['{fixture_instance}']\n\
         \x20 - job_name: chd-replay\n    static_configs:\n      - targets: ['{replay_instance}']\n\
         \x20 - job_name: chd-dead\n    static_configs:\n      - targets: ['{dead}']\n\
         {fleet_jobs}"
    );
    // Every `for` 0s, and the hourly baseline group evaluated every second, so that the 7-day
    // baseline the node dashboard draws has data within the test.
    let rules = std::fs::read_to_string(rules_path()).unwrap();
    let rules = rules_with_for(&rules, "0s").replace("interval: 1h", "interval: 1s");
    let prom = Prometheus::start(&config, &[("chd.rules.yml", rules)]);

    // What must fire, and nothing else. Issue 29 aggregated the device, segment, fleet and
    // pair alerts over sizes, directions and cores (no size_bytes, direction, cpu, pair or
    // rank labels any more), silenced the replay's ChdProbeErrors (a recording's failed rows
    // are old errors on a newly scraped node: its counter never grows) and added
    // ChdNodeVerdictFailed for the three nodes whose verdict is failed (a device column slow
    // from every CPU, a device whose every cell fails).
    let mut expected: BTreeSet<String> = [
        "ChdH2DSlowDeviceColumn job=chd-probing device=0".to_string(),
        "ChdProbeErrors job=chd-probing device=4 reason=copy".to_string(),
        "ChdNodeVerdictFailed job=chd-probing".to_string(),
        "ChdPcieLinkDegraded job=chd-fixture device=0 link=width".to_string(),
        "ChdExporterDown job=chd-dead".to_string(),
        "ChdH2DSlowDeviceColumn job=chd-replay device=0".to_string(),
        "ChdPairCpuSlow job=chd-replay".to_string(),
        "ChdNodeVerdictFailed job=chd-replay".to_string(),
        // The fleet: the slow node against its peers (its x8 links explain it), and the
        // planted device against its link (and its node's other devices).
        "ChdH2DNodeBelowFleet job=chd-fleet-slow".to_string(),
        "ChdPcieLinkDegraded job=chd-fleet-slow device=0 link=width".to_string(),
        "ChdPcieLinkDegraded job=chd-fleet-slow device=1 link=width".to_string(),
        "ChdPcieLinkDegraded job=chd-fleet-slow device=2 link=width".to_string(),
        "ChdH2DBelowLink job=chd-fleet-b device=2".to_string(),
        "ChdH2DSlowDeviceColumn job=chd-fleet-b device=2".to_string(),
        "ChdNodeVerdictFailed job=chd-fleet-b".to_string(),
        // The procfs trees these nodes read (built by the test, or the gpu-node fixture's)
        // have no /proc/net/dev: the netdev collector fails at every scrape, which silenced
        // its series before issue 29 and is an alert now.
        "ChdCollectorFailed job=chd-probing collector=netdev".to_string(),
        "ChdCollectorFailed job=chd-fleet-a collector=netdev".to_string(),
        "ChdCollectorFailed job=chd-fleet-b collector=netdev".to_string(),
        "ChdCollectorFailed job=chd-fleet-slow collector=netdev".to_string(),
    ]
    .into_iter()
    .collect();
    if numa1_cpu.is_some() {
        expected.insert("ChdH2DSlowNumaSegment job=chd-probing device=1 numa_node=1".to_string());
        expected.insert("ChdPairCpuSlow job=chd-probing".to_string());
    }

    let active =
        |prom: &Prometheus| -> BTreeSet<String> { prom.alerts().iter().map(key).collect() };
    let deadline = Instant::now() + ALERT_TIMEOUT;
    let mut seen = BTreeSet::new();
    loop {
        let now = active(&prom);
        if now == expected {
            break;
        }
        if Instant::now() > deadline {
            panic!(
                "after {ALERT_TIMEOUT:?} the active alerts are\n  {}\nexpected exactly\n  {}\n\
                 targets: {:?}\nrule evaluation log:\n{}\nchd-probing log:\n{}",
                now.iter().cloned().collect::<Vec<_>>().join("\n  "),
                expected.iter().cloned().collect::<Vec<_>>().join("\n  "),
                prom.targets(),
                prom.log(),
                probing.log()
            );
        }
        seen.extend(now);
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!(
        "expected alerts firing after {:.1?}; seen on the way: {seen:?}",
        started.elapsed()
    );

    // They stay exactly these over a few more evaluations: nothing else fires (no
    // ChdCpuNotBindable, no ChdExporterDown for the live exporters, no RDMA alert on the
    // fixture's static counters, no column alert for devices 1-3, ...).
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(750));
        assert_eq!(active(&prom), expected, "the set of active alerts changed");
    }

    // Labels and annotations as rendered by the real server.
    let alerts = prom.firing();
    let find = |name: &str, want: &[(&str, &str)]| -> Alert {
        alerts
            .iter()
            .find(|a| a.name() == name && a.has(want))
            .cloned()
            .unwrap_or_else(|| panic!("no firing {name} {want:?} in {alerts:#?}"))
    };
    let column = find(
        "ChdH2DSlowDeviceColumn",
        &[("device", "0"), ("job", "chd-probing")],
    );
    assert_eq!(column.labels["severity"], "warning");
    assert_eq!(column.labels["instance"], probing_instance);
    let ratio: f64 = column.value.parse().unwrap();
    // 12.3 / median(12.3, median(58.9, 6 or 58.9), 58.9, 58.9)
    assert!(ratio > 0.15 && ratio < 0.3, "ratio {ratio}");
    // Mixin-standard annotations: a static summary, the details in the description, the
    // runbook section and the node dashboard with the node selected.
    assert_eq!(
        column.annotations["summary"],
        "A device is fed much slower than the other devices of its node."
    );
    assert!(
        column.annotations["description"].starts_with(&format!(
            "Device 0 on {probing_instance} moves copies of 64MiB and more at "
        )),
        "{column:?}"
    );
    assert!(
        column.annotations["runbook_url"].ends_with("/docs/runbook.md#chdh2dslowdevicecolumn"),
        "{column:?}"
    );
    assert!(
        column.annotations["dashboard_url"].ends_with(&format!(
            "/d/chd-node/chd-node?orgId=1&var-job=chd-probing&var-instance={}",
            prometheus::urlencode(&probing_instance)
        )),
        "{column:?}"
    );

    let link = find(
        "ChdPcieLinkDegraded",
        &[("device", "0"), ("job", "chd-fixture")],
    );
    assert_eq!(link.labels["instance"], fixture_instance);
    assert!(
        link.annotations["description"].starts_with(&format!(
            "The PCIe link of device 0 on {fixture_instance} trained at 50% of its maximum width"
        )),
        "{link:?}"
    );

    if numa1_cpu.is_some() {
        let segment = find("ChdH2DSlowNumaSegment", &[("device", "1")]);
        // 6 GB/s from node 1 over the device's median over both CPUs, (58.9 + 6) / 2.
        let v: f64 = segment.value.parse().unwrap();
        assert!((v - 6.0 / 32.45).abs() < 0.01, "segment ratio {v}");
        assert!(
            segment.annotations["description"].contains("from the CPUs of NUMA node 1 run at"),
            "{segment:?}"
        );
    }

    if let Some(cpu) = numa1_cpu {
        let pair = find("ChdPairCpuSlow", &[("job", "chd-probing")]);
        let v: f64 = pair.value.parse().unwrap();
        assert!(v < 0.7, "pair cpu ratio {v}");
        // One alert for the node, its slow CPUs listed.
        assert!(
            pair.annotations["description"].contains(&format!("CPU {cpu} (pair 2,3, rank 0, ")),
            "{pair:?}"
        );
    }

    let down = find("ChdExporterDown", &[("job", "chd-dead")]);
    assert_eq!(down.labels["instance"], dead);
    assert_eq!(down.labels["severity"], "warning");

    let errors = find("ChdProbeErrors", &[("device", "4")]);
    assert!(
        errors.annotations["description"].contains("device 4"),
        "{errors:?}"
    );

    // Issue 15: the slow node against its fleet, with its links beside the value, and the
    // planted device against its link.
    let below_fleet = find("ChdH2DNodeBelowFleet", &[("job", "chd-fleet-slow")]);
    assert_eq!(below_fleet.labels["name"], "Fake B200");
    let v: f64 = below_fleet.value.parse().unwrap();
    assert!((v - 0.5).abs() < 0.01, "node over fleet {v}");
    let description = &below_fleet.annotations["description"];
    for part in [
        "at 25GB/s against a fleet median of 50GB/s (50%)",
        "Its links: x8 at 32GT/s, 31.51GB/s of payload, 0.79 of the link",
    ] {
        assert!(description.contains(part), "{part:?} not in {description}");
    }
    let below_link = find("ChdH2DBelowLink", &[("job", "chd-fleet-b")]);
    let v: f64 = below_link.value.parse().unwrap();
    assert!((v - 18.9 / 63.015).abs() < 0.01, "efficiency {v}");
    assert!(
        below_link.annotations["description"]
            .contains("(63.02GB/s, the lowest chd_h2d_link_efficiency_ratio"),
        "{below_link:?}"
    );

    // The column alert says what chd knows of the cause, from the node's own series.
    let explained = find("ChdH2DSlowDeviceColumn", &[("job", "chd-fleet-b")]);
    assert!(
        explained.annotations["description"].contains(
            "What chd knows of the cause: PCIe link x16 of x16 at 32GT/s of 32GT/s; NUMA node 0 declared by sysfs, 0 measured best; device utilization now 0%"
        ),
        "{explained:?}"
    );

    // The fleet recording rules see the slow column.
    let ratio_min = prom
        .query(&format!(
            "instance:chd_h2d_device_ratio:min{{instance=\"{probing_instance}\"}}"
        ))
        .unwrap();
    assert_eq!(ratio_min.len(), 1, "{ratio_min:?}");
    let slow_columns = prom
        .query(&format!(
            "instance:chd_h2d_slow_device_columns:count{{instance=\"{probing_instance}\"}}"
        ))
        .unwrap();
    assert_eq!(slow_columns[0]["value"][1], "1", "{slow_columns:?}");
    let links = prom
        .query(&format!(
            "instance:chd_device_pcie_degraded_links:count{{instance=\"{fixture_instance}\"}}"
        ))
        .unwrap();
    assert_eq!(links[0]["value"][1], "1", "{links:?}");

    // Every dashboard expression returns data (three chd instances stand for `$instance`).
    let instance_regex = format!("{probing_instance}|{fixture_instance}|{}", fleet_b.addr);
    let vars: &[(&str, &str)] = &[
        ("cluster", ".*"),
        ("model", ".+"),
        ("job", ".*chd.*"),
        ("instance", &instance_regex),
        ("size", "67108864"),
        ("direction", "h2d"),
        ("pair", ".*"),
    ];
    let mut failures = Vec::new();
    let mut checked = 0;
    for (file, d) in dashboards() {
        for q in dashboard_queries(&file, &d) {
            let expr = substitute(&q.expr, vars)
                .unwrap_or_else(|e| panic!("{}: {}: {e}", q.dashboard, q.source));
            checked += 1;
            // A query with no data is asked again over the next few scrapes: with a 1 s
            // scrape_timeout, one scrape of a debug chd that outlasts it on a busy machine
            // marks that target's series stale until the next scrape succeeds.
            let mut result = prom.query(&expr);
            for _ in 1..QUERY_TRIES {
                if !matches!(&result, Ok(r) if r.is_empty()) {
                    break;
                }
                std::thread::sleep(Duration::from_secs(1));
                result = prom.query(&expr);
            }
            match result {
                Err(e) => failures.push(format!("{}: {}: {e}", q.dashboard, q.source)),
                Ok(result) if result.is_empty() => failures.push(format!(
                    "{}: {}: no data for {expr} ({QUERY_TRIES} tries, 1 s apart)",
                    q.dashboard, q.source
                )),
                Ok(_) => {}
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} dashboard queries failed:\n{}",
        failures.len(),
        failures.join("\n")
    );

    // The node dashboard's links to the node's /matrix page, built from the `instance`
    // label as this Prometheus stores it, open the probing node's heatmaps.
    let (_, node) = dashboards()
        .into_iter()
        .find(|(f, _)| f.ends_with("chd-node.json"))
        .expect("dashboards/chd-node.json");
    let build_info = prom
        .query(&format!(
            "chd_build_info{{instance=\"{probing_instance}\"}}"
        ))
        .unwrap();
    let instance = build_info[0]["metric"]["instance"].as_str().unwrap();
    let port = probing.addr.port().to_string();
    let mut links = 0;
    for p in panels(&node) {
        let to_matrix = p["links"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|l| l["url"].as_str().is_some_and(|u| u.ends_with("/matrix")));
        if !to_matrix {
            continue;
        }
        let url = matrix_link(&node, p, instance, &port);
        let (address, path) = url
            .strip_prefix("http://")
            .and_then(|rest| rest.split_once('/'))
            .unwrap_or_else(|| panic!("{url}"));
        let (status, body) = http_get(address.parse().unwrap(), &format!("/{path}")).unwrap();
        assert_eq!(status, 200, "{url}: {body}");
        assert!(
            body.contains("<svg"),
            "{url} is not the heatmap page: {body}"
        );
        links += 1;
    }
    assert!(links >= 2, "{links} panels link to /matrix");

    let elapsed = started.elapsed();
    eprintln!("{checked} dashboard queries returned data; whole test {elapsed:.1?}");
    assert!(elapsed < Duration::from_secs(120), "took {elapsed:?}");
    drop(prom);
    drop(probing);
    drop(fixture);
    drop((fleet_a, fleet_b, fleet_slow));
}

#[test]
fn prometheus_scrapes_chd_over_tls_with_a_client_certificate_and_basic_auth() {
    let dir = tempfile::tempdir().unwrap();
    let pki = tls::Pki::new(dir.path());
    let web = tls::write(
        dir.path(),
        "web.yml",
        &format!(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  \
             client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n\
             basic_auth_users:\n  prometheus: {}\n",
            tls::bcrypt_hash("scrape-me")
        ),
    );
    let state = tempfile::tempdir().unwrap();
    let chd = Chd::serve(
        state.path(),
        &[
            "--no-probe",
            "--backend",
            "host",
            "--web.config.file",
            s(&web),
        ],
    );
    let job = |name: &str, password: &str| {
        format!(
            "  - job_name: {name}\n    scheme: https\n    basic_auth:\n      username: prometheus\n      \
             password: {password}\n    tls_config:\n      ca_file: ca.crt\n      cert_file: client.crt\n      \
             key_file: client.key\n      server_name: localhost\n    static_configs:\n      \
             - targets: ['127.0.0.1:{}']\n",
            chd.addr.port()
        )
    };
    let config = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n{}{}",
        job("chd-tls", "scrape-me"),
        job("chd-tls-wrong-password", "scrape-you")
    );
    let read = |p: &Path| std::fs::read_to_string(p).unwrap();
    let prom = Prometheus::start(
        &config,
        &[
            ("ca.crt", read(&pki.ca)),
            ("client.crt", read(&pki.client_cert)),
            ("client.key", read(&pki.client_key)),
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let targets = prom.targets();
        let health = |job: &str| {
            targets
                .iter()
                .find(|t| t.0 == job)
                .map(|t| (t.2.clone(), t.3.clone()))
        };
        let good = health("chd-tls");
        let bad = health("chd-tls-wrong-password");
        let scraped = prom
            .query("chd_http_connection_limit{job=\"chd-tls\"}")
            .unwrap_or_default();
        if good.as_ref().map(|g| g.0.as_str()) == Some("up")
            && bad
                .as_ref()
                .is_some_and(|b| b.0 == "down" && b.1.contains("401"))
            && scraped.len() == 1
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "targets after 30 s: {targets:?}\nprometheus log:\n{}\nchd log:\n{}",
            prom.log(),
            chd.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}
