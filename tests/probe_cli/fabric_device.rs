//! `chd probe fabric --backend cuda|acl` on this machine's loopback, over the fake CUDA
//! runtime / ACL and their NCCL / HCCL, whose point-to-point sends and collectives move real
//! bytes between the processes: each rail is a send between two rank processes chd starts
//! for it (the receiving side makes the rendezvous, rank 0 relays it), the collectives run in
//! one rank process per rank; the records name the device each side ran on. A rank process
//! that hangs is killed at the transfer deadline and costs only its step; a run whose ranks
//! disagree on the backend is refused; two ranks of one node never put a rail's two sides on
//! one GPU (NCCL, and the fake, refuse two ranks of a communicator on one device of one
//! host). Traffic only on 127.0.0.1.

use std::time::Duration;

use serde_json::Value;

use crate::fabric::{free_port, rank, records, Running, TOKEN};
use crate::fake::fake_runtime_path;

/// The device flags of `backend` over the fake.
fn device_args(backend: &str) -> Vec<String> {
    let fake = fake_runtime_path().to_string();
    match backend {
        "cuda" => vec![
            "--backend".into(),
            "cuda".into(),
            "--cuda-runtime".into(),
            fake.clone(),
            "--nccl".into(),
            fake,
        ],
        _ => vec![
            "--backend".into(),
            "acl".into(),
            "--acl-runtime".into(),
            fake.clone(),
            "--hccl".into(),
            fake,
        ],
    }
}

fn loopback_run(backend: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (sa, sb) = (dir.path().join("a"), dir.path().join("b"));
    let port = free_port();
    let mut extra: Vec<String> = device_args(backend);
    extra.extend(["--bytes", "8MiB", "--iterations", "2"].map(String::from));
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let mut c0 = rank(0, port, "node-a", &sa, TOKEN, &extra);
    let mut c1 = rank(1, port, "node-b", &sb, TOKEN, &extra);
    // node-b's rank runs everything on the fake's second device.
    c1.args(["--device", "1"]);
    c0.env("CHD_FAKE_DEVICE_COUNT", "2");
    c1.env("CHD_FAKE_DEVICE_COUNT", "2");
    let r0 = Running::start(c0);
    let r1 = Running::start(c1);
    let (ok1, out1, log1) = r1.finish();
    let (ok0, out0, log0) = r0.finish();
    assert!(ok0 && ok1, "rank 0:\n{log0}\nrank 1:\n{log1}");
    // Each rail direction ran in rank processes of its own; the log says which device.
    assert!(
        log0.contains("receiving on lo from 127.0.0.1: device 0")
            && log0.contains("sending on lo to 127.0.0.1: device 0"),
        "{log0}"
    );
    assert!(
        log1.contains("sending on lo to 127.0.0.1: device 1 (") && log1.contains(", named)"),
        "{log1}"
    );
    for (node, state, out, device) in [("node-a", &sa, &out0, "0"), ("node-b", &sb, &out1, "1")] {
        let printed: Value = serde_json::from_str(out).unwrap();
        assert_eq!(printed["outcome"], "ok", "{out}");
        let recs = records(state);
        assert_eq!(recs.len(), 1, "{node}");
        let r = &recs[0];
        assert_eq!(r["backend"], backend, "{r}");
        let rails = r["rails"].as_array().unwrap();
        assert_eq!(rails.len(), 2, "{r}");
        for rail in rails {
            assert!(rail["error"].is_null(), "{rail}");
            assert!(rail["gbps"].as_f64().unwrap() > 0.0, "{rail}");
            assert_eq!(rail["bytes"], 8 << 20, "{rail}");
            assert_eq!(rail["device"], device, "{node}: {rail}");
        }
        let colls = r["collectives"].as_array().unwrap();
        assert_eq!(colls.len(), 2, "{r}");
        for c in colls {
            assert!(c["error"].is_null(), "{c}");
            assert!(c["bus_gbps"].as_f64().unwrap() > 0.0, "{c}");
        }
    }
}

#[test]
fn over_nccl_each_rail_direction_runs_in_rank_processes_of_its_own() {
    loopback_run("cuda");
}

#[test]
fn over_hccl_each_rail_direction_runs_in_rank_processes_of_its_own() {
    loopback_run("acl");
}

/// The pids of live processes whose environment holds `marker`.
fn marked(marker: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        if env.split(|&b| b == 0).any(|v| v == marker.as_bytes()) {
            out.push(pid);
        }
    }
    out
}

#[test]
fn a_hung_rank_process_is_killed_at_the_transfer_deadline_and_costs_only_its_step() {
    let dir = tempfile::tempdir().unwrap();
    let (sa, sb) = (dir.path().join("a"), dir.path().join("b"));
    let port = free_port();
    let marker = format!("CHD_TEST_HUNG_FABRIC={}", std::process::id());
    let mut extra: Vec<String> = device_args("cuda");
    extra.extend(["--bytes", "1MiB", "--transfer-timeout", "3"].map(String::from));
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let mut c0 = rank(0, port, "node-a", &sa, TOKEN, &extra);
    let mut c1 = rank(1, port, "node-b", &sb, TOKEN, &extra);
    // Every operation of rank 1's processes hangs (ten minutes): a stuck device.
    c1.env("CHD_FAKE_PAIR_HANG_MS", "600000");
    for c in [&mut c0, &mut c1] {
        let (k, v) = marker.split_once('=').unwrap();
        c.env(k, v).env("CHD_FAKE_PAIR_TIMEOUT_MS", "20000");
    }
    let r0 = Running::start(c0);
    let r1 = Running::start(c1);
    let (ok1, _, log1) = r1.finish();
    let (ok0, out0, log0) = r0.finish();
    // The run finishes: each step failed on its own, recorded, and the rank exits 0 as for a
    // rail that carries nothing.
    assert!(ok0 && ok1, "rank 0:\n{log0}\nrank 1:\n{log1}");
    let printed: Value = serde_json::from_str(&out0).unwrap();
    let rails = printed["results"][0]["rails"].as_array().unwrap();
    assert_eq!(rails.len(), 2, "{out0}");
    for rail in rails {
        let e = rail["error"].as_str().unwrap_or_else(|| panic!("{rail}"));
        assert!(
            e.contains("no answer within 3 s; its rank process (pid "),
            "{rail}"
        );
    }
    for c in printed["results"][0]["collectives"].as_array().unwrap() {
        assert!(c["error"].as_str().is_some(), "{c}");
    }
    // Nothing is left: every rank process was killed or ended, by its pid.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        marked(&marker),
        Vec::<u32>::new(),
        "rank processes left behind"
    );
}

#[test]
fn ranks_that_disagree_on_the_backend_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (sa, sb) = (dir.path().join("a"), dir.path().join("b"));
    let port = free_port();
    let cuda = device_args("cuda");
    let cuda: Vec<&str> = cuda.iter().map(String::as_str).collect();
    let mut c0 = rank(0, port, "node-a", &sa, TOKEN, &["--timeout", "5"]);
    let c1 = rank(1, port, "node-b", &sb, TOKEN, &cuda);
    c0.env("RUST_LOG", "warn");
    let r0 = Running::start(c0);
    let r1 = Running::start(c1);
    let (ok1, _, log1) = r1.finish();
    let (ok0, _, log0) = r0.finish();
    assert!(!ok0 && !ok1, "rank 0:\n{log0}\nrank 1:\n{log1}");
    assert!(
        log1.contains("measures with --backend cuda, rank 0 with host"),
        "{log1}"
    );
}

/// The CPUs this test may run on.
fn allowed_cpus() -> Vec<u32> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_string();
    chd::topology::cpulist::parse(&list).unwrap()
}

#[test]
fn rank_processes_run_on_chds_advice_for_their_device_when_the_node_has_a_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let (sa, sb) = (dir.path().join("a"), dir.path().join("b"));
    // node-a's state directory holds measured H2D cells of device 0: its last allowed CPU
    // feeds it twice as fast as its first, so chd advises that one.
    let cpus = allowed_cpus();
    let (slow, best) = (cpus[0], *cpus.last().unwrap());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let cell = |cpu: u32, gbps: f64| {
        serde_json::json!({
            "cpu": cpu, "device": "0", "size_bytes": 268435456u64, "direction": "h2d",
            "samples": [{"bytes_per_second": gbps * 1e9, "at": now}],
            "last_attempt": now, "consecutive_errors": 0
        })
    };
    let mut cells = vec![cell(best, 20.0)];
    if slow != best {
        cells.push(cell(slow, 10.0));
    }
    std::fs::create_dir_all(&sa).unwrap();
    std::fs::write(
        sa.join("state.json"),
        serde_json::json!({
            "version": 1, "saved_at": now, "h2d": cells, "bindable": [], "last_success": {}
        })
        .to_string(),
    )
    .unwrap();
    let port = free_port();
    let mut extra: Vec<String> = device_args("cuda");
    extra.extend(["--bytes", "1MiB"].map(String::from));
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let c0 = rank(0, port, "node-a", &sa, TOKEN, &extra);
    let c1 = rank(1, port, "node-b", &sb, TOKEN, &extra);
    let r0 = Running::start(c0);
    let r1 = Running::start(c1);
    let (ok1, _, log1) = r1.finish();
    let (ok0, _, log0) = r0.finish();
    assert!(ok0 && ok1, "rank 0:\n{log0}\nrank 1:\n{log1}");
    assert!(
        log0.contains(&format!(
            "chd's advice from {}: device 0 on CPUs {best}",
            sa.join("state.json").display()
        )),
        "{log0}"
    );
    assert!(
        log0.contains(&format!("CPUs {best}, chd's advice for the device")),
        "{log0}"
    );
    // Without a ledger, node-b's rank processes run where its rail puts them: lo has no
    // NUMA node, so unbound.
    assert!(
        log1.contains("no ") && log1.contains("state.json to advise CPUs from"),
        "{log1}"
    );
    for rail in records(&sa)[0]["rails"].as_array().unwrap() {
        assert!(rail["error"].is_null(), "{rail}");
        assert_eq!(rail["cpus"], best.to_string(), "{rail}");
        assert_eq!(rail["device"], "0", "{rail}");
    }
    for rail in records(&sb)[0]["rails"].as_array().unwrap() {
        assert!(rail["cpus"].is_null(), "{rail}");
    }
}

#[test]
fn the_two_sides_of_a_rail_on_one_node_run_on_two_devices() {
    let dir = tempfile::tempdir().unwrap();
    let (sa, sb) = (dir.path().join("a"), dir.path().join("b"));
    let port = free_port();
    let mut extra: Vec<String> = device_args("cuda");
    // Both ranks ask for device 0: a rail's sender takes the next one, the collectives (both
    // ranks on device 0 of one host, as asked) meet NCCL's rule.
    extra.extend(["--bytes", "1MiB", "--device", "0"].map(String::from));
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let mut c0 = rank(0, port, "box", &sa, TOKEN, &extra);
    let mut c1 = rank(1, port, "box", &sb, TOKEN, &extra);
    c1.args(["--local-rank", "1"]);
    for c in [&mut c0, &mut c1] {
        c.env("NCCL_HOSTID", "one-host");
    }
    let r0 = Running::start(c0);
    let r1 = Running::start(c1);
    let (ok1, _, log1) = r1.finish();
    let (ok0, out0, log0) = r0.finish();
    assert!(ok0 && ok1, "rank 0:\n{log0}\nrank 1:\n{log1}");
    assert!(
        log0.contains("sending on lo to 127.0.0.1: device 1 (")
            && log0.contains("the next one: the other side on this node has the first choice"),
        "{log0}"
    );
    let printed: Value = serde_json::from_str(&out0).unwrap();
    let rec = &printed["results"][0];
    for rail in rec["rails"].as_array().unwrap() {
        assert!(rail["error"].is_null(), "{rail}");
        let want = if rail["direction"] == "send" {
            "1"
        } else {
            "0"
        };
        assert_eq!(rail["device"], want, "{rail}");
    }
    for c in rec["collectives"].as_array().unwrap() {
        let e = c["error"].as_str().unwrap_or_else(|| panic!("{c}"));
        assert!(
            e.contains("Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 10000"),
            "{c}"
        );
    }
}
