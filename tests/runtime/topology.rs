//! Integration tests of `chd::topology` on fixture trees shaped like real kernels' sysfs and
//! procfs (`tests/fixtures/topology/`, see its README), on the 640-CPU A3 tree built at test
//! time by `support/sysfs_builder.rs`, and on the live machine.

use crate::sysfs_builder;

use std::fs;
use std::path::{Path, PathBuf};

use crate::sysfs_builder::Machine;
use chd::topology::{render, Roots, Topology, TopologyError};
use serde_json::Value;

fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/topology")
        .join(name)
}

fn fixture(name: &str) -> Roots {
    let dir = fixture_dir(name);
    Roots {
        sysfs: dir.join("sys"),
        procfs: dir.join("proc"),
    }
}

/// Write `m` into a fresh tempdir; the dir must outlive the returned roots' use.
fn build(m: &Machine) -> (tempfile::TempDir, Roots) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (sysfs, procfs) = m.write(tmp.path()).expect("write machine");
    (tmp, Roots { sysfs, procfs })
}

/// The 640-CPU trees are large: write each once per test run, under cargo's per-target tmp
/// dir (rewritten from scratch every run), and share it between tests.
fn shared(
    name: &str,
    cell: &'static std::sync::OnceLock<Roots>,
    m: fn() -> Machine,
) -> &'static Roots {
    cell.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("topology-{name}"));
        let _ = fs::remove_dir_all(&dir);
        let (sysfs, procfs) = m().write(&dir).expect("write machine");
        Roots { sysfs, procfs }
    })
}

fn a3_roots() -> &'static Roots {
    static CELL: std::sync::OnceLock<Roots> = std::sync::OnceLock::new();
    shared("a3", &CELL, sysfs_builder::a3)
}

fn x86_640_roots() -> &'static Roots {
    static CELL: std::sync::OnceLock<Roots> = std::sync::OnceLock::new();
    shared("x86-640", &CELL, sysfs_builder::x86_640)
}

fn read(roots: &Roots) -> Topology {
    Topology::read(roots).unwrap_or_else(|e| panic!("read {roots:?}: {e}"))
}

/// `(cpu, numa_node)` of every online CPU.
fn numa_map(t: &Topology) -> Vec<(u32, Option<u32>)> {
    t.cpus.iter().map(|c| (c.id, c.numa_node)).collect()
}

fn node_of(t: &Topology, cpu: u32) -> Option<u32> {
    t.cpu(cpu).and_then(|c| c.numa_node)
}

fn package_of(t: &Topology, cpu: u32) -> Option<u32> {
    t.cpu(cpu).and_then(|c| c.package)
}

// ---- committed fixtures ------------------------------------------------------------------

/// The committed fixtures are the builder's output; fail when either drifts. Regenerate
/// with `CHD_REGENERATE_FIXTURES=1 cargo test --test runtime topology::committed_fixtures`.
#[test]
fn committed_fixtures_match_builder() {
    let regenerate = std::env::var_os("CHD_REGENERATE_FIXTURES").is_some();
    for (name, machine) in [
        ("two-node-offline", sysfs_builder::two_node_offline()),
        ("no-numa", sysfs_builder::no_numa()),
        ("garbage", sysfs_builder::garbage()),
    ] {
        let committed = fixture_dir(name);
        if regenerate {
            for sub in ["sys", "proc"] {
                let _ = fs::remove_dir_all(committed.join(sub));
            }
            machine.write(&committed).expect("regenerate fixture");
            continue;
        }
        let tmp = tempfile::tempdir().expect("tempdir");
        machine.write(tmp.path()).expect("write machine");
        let want = sysfs_builder::snapshot(tmp.path()).expect("snapshot built tree");
        let have = sysfs_builder::snapshot(&committed).expect("snapshot committed tree");
        let have: Vec<_> = have
            .into_iter()
            .filter(|(p, _)| p.file_name().is_some_and(|n| n != "README.md"))
            .collect();
        for ((wp, wt), (hp, ht)) in want.iter().zip(&have) {
            assert_eq!(wp, hp, "{name}: file sets differ");
            assert_eq!(wt, ht, "{name}: {} differs", wp.display());
        }
        assert_eq!(want.len(), have.len(), "{name}: file counts differ");
    }
}

#[test]
fn two_node_offline_numa_map_and_offline_list() {
    let t = read(&fixture("two-node-offline"));
    assert_eq!(
        numa_map(&t),
        vec![
            (0, Some(0)),
            (1, Some(0)),
            (2, Some(1)),
            (3, Some(1)),
            (4, Some(0)),
            (5, Some(0)),
        ]
    );
    assert_eq!(t.offline_cpus, vec![6, 7]);
    assert!(t.cpu(6).is_none() && t.cpu(7).is_none());
    assert_eq!(t.numa_nodes.len(), 2);
    assert_eq!(t.numa_nodes[0].cpus, vec![0, 1, 4, 5]);
    // x86 drops an unplugged CPU from its node's cpulist.
    assert_eq!(t.numa_nodes[1].cpus, vec![2, 3]);
}

#[test]
fn two_node_offline_packages_cores_and_siblings() {
    let t = read(&fixture("two-node-offline"));
    let rows: Vec<_> = t
        .cpus
        .iter()
        .map(|c| (c.id, c.package, c.core, c.siblings.clone()))
        .collect();
    assert_eq!(
        rows,
        vec![
            (0, Some(0), Some(0), vec![0, 4]),
            (1, Some(0), Some(1), vec![1, 5]),
            // Siblings 6 and 7 are offline: the kernel removed them from the masks.
            (2, Some(1), Some(0), vec![2]),
            (3, Some(1), Some(1), vec![3]),
            (4, Some(0), Some(0), vec![0, 4]),
            (5, Some(0), Some(1), vec![1, 5]),
        ]
    );
}

#[test]
fn two_node_offline_restricted_cpuset() {
    let t = read(&fixture("two-node-offline"));
    let allowed: Vec<u32> = t.allowed_cpus().map(|c| c.id).collect();
    assert_eq!(allowed, vec![1, 2, 3]);
    assert!(!t.cpu(0).unwrap().allowed);
    assert!(!t.cpu(4).unwrap().allowed);
}

#[test]
fn two_node_offline_memory() {
    let t = read(&fixture("two-node-offline"));
    let mem: Vec<_> = t
        .numa_nodes
        .iter()
        .map(|n| (n.id, n.has_memory, n.memory_total_bytes))
        .collect();
    assert_eq!(
        mem,
        vec![
            (0, true, Some(65_842_120 * 1024)),
            (1, true, Some(66_055_552 * 1024)),
        ]
    );
    assert_eq!(t.memory_nodes().count(), 2);
}

#[test]
fn no_numa_falls_back_to_one_synthetic_node() {
    let roots = fixture("no-numa");
    assert!(!roots.sysfs.join("devices/system/node").exists());
    let t = read(&roots);
    assert_eq!(t.numa_nodes.len(), 1);
    let node = &t.numa_nodes[0];
    assert_eq!(
        (
            node.id,
            node.cpus.clone(),
            node.has_memory,
            node.memory_total_bytes
        ),
        (0, vec![0, 1, 2, 3], true, None)
    );
    // Without NUMA support CPUs carry no node id; with no procfs every CPU is allowed.
    assert_eq!(
        numa_map(&t),
        vec![(0, None), (1, None), (2, None), (3, None)]
    );
    assert_eq!(t.allowed_cpus().count(), 4);
    assert!(t.offline_cpus.is_empty());
    assert_eq!(package_of(&t, 3), Some(0));
    assert_eq!(t.cpu(3).unwrap().core, Some(3));
}

#[test]
fn garbage_per_cpu_files_degrade_fields_not_the_read() {
    let t = read(&fixture("garbage"));
    let rows: Vec<_> = t
        .cpus
        .iter()
        .map(|c| (c.id, c.numa_node, c.package, c.core, c.siblings.clone()))
        .collect();
    assert_eq!(
        rows,
        vec![
            (0, Some(0), Some(0), Some(0), vec![0]),
            // core_id "N/A"
            (1, Some(0), Some(0), None, vec![1]),
            // no topology/ directory
            (2, Some(0), None, None, vec![2]),
            // physical_package_id "-1", thread_siblings_list "3,?"
            (3, Some(0), None, Some(3), vec![3]),
        ]
    );
    // No node/has_memory file: a node with MemTotal > 0 has memory.
    assert!(t.numa_nodes[0].has_memory);
    assert_eq!(t.numa_nodes[0].memory_total_bytes, Some(16_338_432 * 1024));
    assert_eq!(t.allowed_cpus().count(), 4);
}

// ---- the seed's A3 host and a same-size x86 host, built at test time ---------------------

#[test]
fn a3_cpu_to_numa_map() {
    let roots = a3_roots().clone();
    let t = read(&roots);
    assert_eq!(t.cpus.len(), 640);
    assert!(t.offline_cpus.is_empty());
    assert_eq!(t.allowed_cpus().count(), 640);
    assert_eq!(t.numa_nodes.len(), 8);
    for node in &t.numa_nodes {
        let first = node.id * 80;
        assert_eq!(
            node.cpus,
            (first..first + 80).collect::<Vec<_>>(),
            "node {}",
            node.id
        );
        assert!(node.has_memory);
        assert_eq!(node.memory_total_bytes, Some(192 << 30));
    }
    for (cpu, node) in [
        (0, 0),
        (79, 0),
        (80, 1),
        (319, 3),
        (320, 4),
        (400, 5),
        (639, 7),
    ] {
        assert_eq!(node_of(&t, cpu), Some(node), "cpu {cpu}");
    }
    for (cpu, package) in [(0, 0), (319, 0), (320, 1), (400, 1), (639, 1)] {
        assert_eq!(package_of(&t, cpu), Some(package), "cpu {cpu}");
    }
    // Every CPU's node is the one whose cpulist holds it: 80 CPUs per node.
    for n in 0..8 {
        assert_eq!(t.cpus.iter().filter(|c| c.numa_node == Some(n)).count(), 80);
    }
    assert_eq!(t.cpu(0).unwrap().siblings, vec![0, 1]);
    assert_eq!(t.cpu(401).unwrap().siblings, vec![400, 401]);
    assert_eq!(t.cpu(401).unwrap().core, Some(40));
}

#[test]
fn x86_640_first_threads_first_siblings_share_a_node() {
    let roots = x86_640_roots().clone();
    let t = read(&roots);
    assert_eq!(t.cpus.len(), 640);
    assert_eq!(t.numa_nodes.len(), 8);
    assert_eq!(
        chd::topology::cpulist::format(&t.numa_nodes[0].cpus),
        "0-39,320-359"
    );
    for (cpu, node) in [
        (0, 0),
        (320, 0),
        (39, 0),
        (40, 1),
        (79, 1),
        (80, 2),
        (400, 2),
        (639, 7),
    ] {
        assert_eq!(node_of(&t, cpu), Some(node), "cpu {cpu}");
    }
    assert_eq!(t.cpu(0).unwrap().siblings, vec![0, 320]);
    assert_eq!(t.cpu(639).unwrap().siblings, vec![319, 639]);
    for (cpu, package) in [(0, 0), (159, 0), (160, 1), (320, 0), (400, 0), (480, 1)] {
        assert_eq!(package_of(&t, cpu), Some(package), "cpu {cpu}");
    }
    for node in &t.numa_nodes {
        assert_eq!(node.cpus.len(), 80);
    }
}

// ---- errors ------------------------------------------------------------------------------

#[test]
fn missing_cpu_online_is_a_read_error_naming_the_file() {
    let (tmp, roots) = build(&sysfs_builder::no_numa());
    fs::remove_file(roots.sysfs.join("devices/system/cpu/online")).unwrap();
    let err = Topology::read(&roots).unwrap_err();
    assert!(matches!(err, TopologyError::Read { .. }), "{err:?}");
    assert!(
        err.to_string().contains("devices/system/cpu/online"),
        "{err}"
    );
    drop(tmp);
}

#[test]
fn garbage_cpu_online_is_a_parse_error_naming_the_token() {
    let (_tmp, roots) = build(&sysfs_builder::two_node_offline());
    fs::write(roots.sysfs.join("devices/system/cpu/online"), "0-5,seven\n").unwrap();
    let err = Topology::read(&roots).unwrap_err();
    assert!(matches!(err, TopologyError::Parse { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("cpu/online") && msg.contains("\"seven\""),
        "{msg}"
    );
}

#[test]
fn missing_present_falls_back_to_possible() {
    let (_tmp, roots) = build(&sysfs_builder::two_node_offline());
    fs::remove_file(roots.sysfs.join("devices/system/cpu/present")).unwrap();
    fs::write(roots.sysfs.join("devices/system/cpu/possible"), "0-9\n").unwrap();
    assert_eq!(read(&roots).offline_cpus, vec![6, 7, 8, 9]);
}

#[test]
fn unreadable_status_allows_every_online_cpu() {
    let (_tmp, roots) = build(&sysfs_builder::two_node_offline());
    fs::remove_file(roots.procfs.join("self/status")).unwrap();
    assert_eq!(read(&roots).allowed_cpus().count(), 6);
}

// ---- rendering ---------------------------------------------------------------------------

#[test]
fn table_on_two_node_offline() {
    let text = render::table(&read(&fixture("two-node-offline")));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "6 online CPUs, 3 allowed (1-3), offline: 6-7, 2 NUMA nodes (2 with memory)"
    );
    assert!(
        lines[1].starts_with("node 0   cpus 0-1,4-5") && lines[1].contains("allowed 1 "),
        "{}",
        lines[1]
    );
    assert!(lines[1].ends_with("memory 62.8 GiB"), "{}", lines[1]);
    assert!(
        lines[2].starts_with("node 1   cpus 2-3") && lines[2].contains("allowed 2-3 "),
        "{}",
        lines[2]
    );
    // Header plus one row per online CPU.
    assert_eq!(lines.len(), 3 + 1 + 6, "{text}");
    assert!(lines[3].trim_start().starts_with("cpu"), "{text}");
    assert!(
        lines[4].ends_with(" no") && lines[5].ends_with(" yes"),
        "{text}"
    );
}

#[test]
fn table_on_a3_omits_per_cpu_rows() {
    let roots = a3_roots().clone();
    let text = render::table(&read(&roots));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "640 online CPUs, 640 allowed (0-639), offline: none, 8 NUMA nodes (8 with memory)"
    );
    assert_eq!(lines.len(), 1 + 8 + 1, "{text}");
    assert!(
        lines[8].starts_with("node 7   cpus 560-639"),
        "{}",
        lines[8]
    );
    assert!(
        lines[9].contains("omitted") && lines[9].contains("--json"),
        "{}",
        lines[9]
    );
}

#[test]
fn table_on_no_numa() {
    let text = render::table(&read(&fixture("no-numa")));
    assert!(
        text.starts_with(
            "4 online CPUs, 4 allowed (0-3), offline: none, 1 NUMA node (1 with memory)\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("memory yes (size unknown) (synthetic: kernel without NUMA)\n"),
        "{text}"
    );
}

#[test]
fn json_round_trips_the_key_numbers() {
    for t in [read(&fixture("two-node-offline")), {
        let roots = a3_roots().clone();
        read(&roots)
    }] {
        let v: Value = serde_json::from_str(&render::json(&t)).expect("valid JSON");
        let cpus = v["cpus"].as_array().expect("cpus array");
        assert_eq!(cpus.len(), t.cpus.len());
        for (j, c) in cpus.iter().zip(&t.cpus) {
            assert_eq!(j["id"], c.id);
            assert_eq!(j["numa_node"].as_u64(), c.numa_node.map(u64::from));
            assert_eq!(j["package"].as_u64(), c.package.map(u64::from));
            assert_eq!(j["allowed"], c.allowed);
        }
        assert_eq!(v["offline_cpus"], serde_json::json!(t.offline_cpus));
        let nodes = v["numa_nodes"].as_array().expect("numa_nodes array");
        assert_eq!(nodes.len(), t.numa_nodes.len());
        for (j, n) in nodes.iter().zip(&t.numa_nodes) {
            assert_eq!(j["cpus"], serde_json::json!(n.cpus));
            assert_eq!(j["memory_total_bytes"].as_u64(), n.memory_total_bytes);
        }
    }
}

// ---- the live machine --------------------------------------------------------------------

#[test]
fn live_machine() {
    let roots = Roots::default();
    let t = Topology::read(&roots).expect("read the live topology");
    assert!(!t.cpus.is_empty(), "no online CPU");
    assert!(t.allowed_cpus().next().is_some(), "no allowed CPU");
    if roots.sysfs.join("devices/system/node").is_dir() {
        for c in &t.cpus {
            assert!(
                c.numa_node.is_some(),
                "online cpu {} has no NUMA node",
                c.id
            );
        }
    }
    // This thread's real affinity must be within what we call allowed.
    let affinity =
        nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).expect("sched_getaffinity");
    for c in &t.cpus {
        if affinity.is_set(c.id as usize).unwrap_or(false) {
            assert!(
                c.allowed,
                "cpu {} is in our affinity mask but not allowed",
                c.id
            );
        }
    }
}
