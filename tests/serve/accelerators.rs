//! The accelerator backends end to end through the fake runtime library (a cdylib built by
//! the workspace that exports the CUDA runtime, NVML and ACL symbols chd loads): real
//! loading, symbol resolution, device-event timing arithmetic, errors, the device idle gate
//! and the exported ratios, with only the silicon missing.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::chd_process::{chd_bin, promtool_check_metrics, Chd, Metrics};
use crate::fake::fake_runtime_path as lib;

const SIZE_64_MIB: &str = "67108864";

/// Fast windows over the fake's devices; never skip for CPU load (tests run in parallel).
fn fast(backend: &str) -> Vec<String> {
    let mut args: Vec<String> = [
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
        backend,
    ]
    .map(String::from)
    .to_vec();
    match backend {
        "cuda" => args.extend(["--cuda-runtime", lib(), "--nvml", lib()].map(String::from)),
        _ => args.extend(["--acl-runtime", lib()].map(String::from)),
    }
    args
}

fn serve(dir: &Path, args: &[String], env: &[(&str, &str)]) -> Chd {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Chd::serve_env(dir, &args, env)
}

fn ratio(m: &Metrics, device: &str) -> f64 {
    m.value(
        "chd_h2d_device_ratio",
        &[
            ("device", device),
            ("size_bytes", SIZE_64_MIB),
            ("direction", "h2d"),
        ],
    )
}

fn every_device_measured(m: &Metrics, devices: &[&str]) -> bool {
    devices.iter().all(|d| {
        !m.find("chd_h2d_bandwidth_bytes_per_second", &[("device", d)])
            .is_empty()
    })
}

fn slow_device_column(backend: &str) {
    let dir = tempfile::tempdir().unwrap();
    let chd = serve(
        dir.path(),
        &fast(backend),
        &[
            ("CHD_FAKE_DEVICE_COUNT", "4"),
            ("CHD_FAKE_H2D_GBPS", "58.9;0=12.3"),
        ],
    );
    let m = chd.wait_for(Duration::from_secs(60), "cells on every device", |m| {
        every_device_measured(m, &["0", "1", "2", "3"])
    });
    assert!(ratio(&m, "0") < 0.5, "slow device ratio {}", ratio(&m, "0"));
    for d in ["1", "2", "3"] {
        let r = ratio(&m, d);
        assert!((0.95..=1.05).contains(&r), "device {d} ratio {r}");
    }
    // Device-event timing: the fake's clock runs at exactly the configured rate.
    for s in m.find("chd_h2d_bandwidth_bytes_per_second", &[("device", "1")]) {
        assert!((s.value - 58.9e9).abs() < 0.01 * 58.9e9, "{s:?}");
    }
    assert_eq!(m.value("chd_backend_up", &[("backend", backend)]), 1.0);
    assert_eq!(
        m.find("chd_device_info", &[("kind", backend)]).len(),
        4,
        "device info rows"
    );
    promtool_check_metrics(&chd.scrape());
}

#[test]
fn cuda_slow_device_has_a_low_ratio_and_the_others_about_one() {
    slow_device_column("cuda");
}

#[test]
fn acl_slow_device_has_a_low_ratio_and_the_others_about_one() {
    slow_device_column("acl");
}

#[test]
fn a_failing_device_costs_its_cells_only() {
    let dir = tempfile::tempdir().unwrap();
    let chd = serve(
        dir.path(),
        &fast("cuda"),
        &[
            ("CHD_FAKE_DEVICE_COUNT", "3"),
            ("CHD_FAKE_FAIL_DEVICES", "2"),
        ],
    );
    let m = chd.wait_for(Duration::from_secs(60), "errors on device 2", |m| {
        every_device_measured(m, &["0", "1"])
            && m.find(
                "chd_probe_errors_total",
                &[("probe", "h2d"), ("device", "2"), ("reason", "copy")],
            )
            .iter()
            .any(|s| s.value >= 1.0)
    });
    assert!(m
        .find("chd_h2d_bandwidth_bytes_per_second", &[("device", "2")])
        .is_empty());
    assert!(
        chd.log().contains("cudaMemcpyAsync failed"),
        "{}",
        chd.log()
    );
    // Still serving, and the healthy devices keep being measured.
    let again = chd.wait_for(Duration::from_secs(30), "another window", |later| {
        later.value(
            "chd_probe_runs_total",
            &[("probe", "h2d"), ("result", "ok")],
        ) > m.value(
            "chd_probe_runs_total",
            &[("probe", "h2d"), ("result", "ok")],
        )
    });
    assert!(every_device_measured(&again, &["0", "1"]));
}

#[test]
fn a_busy_device_keeps_windows_from_opening() {
    let dir = tempfile::tempdir().unwrap();
    let chd = serve(
        dir.path(),
        &fast("cuda"),
        &[
            ("CHD_FAKE_DEVICE_COUNT", "2"),
            ("CHD_FAKE_BUSY_DEVICES", "1"),
        ],
    );
    let m = chd.wait_for(Duration::from_secs(30), "two device_busy ticks", |m| {
        m.value("chd_idle_windows_total", &[("outcome", "device_busy")]) >= 2.0
    });
    assert_eq!(
        m.value("chd_idle_windows_total", &[("outcome", "probed")]),
        0.0
    );
    assert!(m.find("chd_h2d_bandwidth_bytes_per_second", &[]).is_empty());
    assert_eq!(
        m.value("chd_device_utilization_ratio", &[("device", "1")]),
        1.0
    );
    assert_eq!(
        m.value("chd_device_utilization_ratio", &[("device", "0")]),
        0.0
    );
}

/// The device half of the gate fails closed: a device whose utilization and processes NVML
/// cannot read keeps every window shut as `gate_error`, with the device named in the log,
/// while its memory (which the gate does not need) is still exported.
#[test]
fn unreadable_device_telemetry_keeps_windows_shut() {
    let dir = tempfile::tempdir().unwrap();
    let chd = serve(
        dir.path(),
        &fast("cuda"),
        &[
            ("CHD_FAKE_DEVICE_COUNT", "2"),
            ("CHD_FAKE_TELEMETRY_FAIL_DEVICES", "1"),
        ],
    );
    let m = chd.wait_for(Duration::from_secs(30), "two gate_error ticks", |m| {
        m.value("chd_idle_windows_total", &[("outcome", "gate_error")]) >= 2.0
    });
    assert_eq!(
        m.value("chd_idle_windows_total", &[("outcome", "probed")]),
        0.0
    );
    assert!(m.find("chd_h2d_bandwidth_bytes_per_second", &[]).is_empty());
    assert!(!m
        .find("chd_device_memory_used_bytes", &[("device", "1")])
        .is_empty());
    let log = chd.log();
    assert!(
        log.contains("idle gate input unreadable: device 1: nvml utilization could not be read"),
        "{log}"
    );
}

#[test]
fn a_device_turning_busy_stops_the_window_in_progress() {
    let dir = tempfile::tempdir().unwrap();
    let busy = dir.path().join("busy");
    std::fs::write(&busy, "").unwrap();
    let mut args = fast("acl");
    for (flag, value) in [
        ("--interval", "1h"),
        ("--window-budget", "30m"),
        ("--sizes", "256,512,768,1024"),
        ("--iterations", "20"),
        ("--directions", "h2d,d2h"),
    ] {
        let at = args.iter().position(|a| a == flag);
        match at {
            Some(i) => args[i + 1] = value.into(),
            None => args.extend([flag.to_string(), value.to_string()]),
        }
    }
    let chd = serve(
        dir.path(),
        &args,
        &[
            ("CHD_FAKE_DEVICE_COUNT", "8"),
            ("CHD_FAKE_BUSY_FILE", busy.to_str().unwrap()),
        ],
    );
    chd.wait_for(Duration::from_secs(60), "the first cell", |m| {
        !m.find("chd_h2d_bandwidth_bytes_per_second", &[]).is_empty()
    });
    std::fs::write(&busy, "3").unwrap();
    let m = chd.wait_for(Duration::from_secs(30), "an aborted window", |m| {
        m.value(
            "chd_probe_runs_total",
            &[("probe", "h2d"), ("result", "aborted")],
        ) >= 1.0
    });
    assert!(
        m.value(
            "chd_probe_cells",
            &[("probe", "h2d"), ("state", "unmeasured")]
        ) > 0.0
    );
    assert!(
        chd.log()
            .contains("idle gate closed mid-window (device 3 busy)"),
        "{}",
        chd.log()
    );
}

#[test]
fn topology_lists_fake_devices_with_bus_ids_and_numa_nodes() {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/accelerators/gpu-node");
    let run = |backend: &str, flag: &str, ids: &str, acl_bus_ids: &str| {
        let out = Command::new(chd_bin())
            .arg("--sysfs-root")
            .arg(fixture.join("sys"))
            .arg("--procfs-root")
            .arg(fixture.join("proc"))
            .args(["topology", "--json", "--backend", backend, flag, lib()])
            .env("CHD_FAKE_DEVICE_COUNT", "2")
            .env("CHD_FAKE_PCI_BUS_IDS", ids)
            .env("CHD_FAKE_ACL_PCI_BUS_ID", acl_bus_ids)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["backend"], backend);
        v["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                (
                    d["id"].as_str().unwrap().to_string(),
                    d["pci_bus_id"].as_str().unwrap().to_string(),
                    d["numa_node"].as_u64(),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        run("cuda", "--cuda-runtime", "0000:1A:00.0,0000:9C:00.0", "1"),
        vec![
            ("0".to_string(), "0000:1a:00.0".to_string(), Some(0)),
            ("1".to_string(), "0000:9c:00.0".to_string(), Some(1)),
        ]
    );
    // ACL answers aclrtDeviceGetPCIBusId (CANN 9.2+): its numbering wins over bus order.
    assert_eq!(
        run("acl", "--acl-runtime", "0000:c2:00.0,0000:c1:00.0", "1"),
        vec![
            ("0".to_string(), "0000:c2:00.0".to_string(), Some(1)),
            ("1".to_string(), "0000:c1:00.0".to_string(), Some(0)),
        ]
    );
    // Without the query: NPUs are the Huawei accelerators in bus order.
    assert_eq!(
        run("acl", "--acl-runtime", "0000:c2:00.0,0000:c1:00.0", "0"),
        vec![
            ("0".to_string(), "0000:c1:00.0".to_string(), Some(0)),
            ("1".to_string(), "0000:c2:00.0".to_string(), Some(1)),
        ]
    );
}

#[test]
fn a_named_backend_that_cannot_load_is_a_clear_error_and_auto_falls_back() {
    let out = Command::new(chd_bin())
        .args([
            "topology",
            "--backend",
            "cuda",
            "--cuda-runtime",
            "/nonexistent/libcudart.so",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(
            "chd: backend cuda: cannot load the CUDA runtime library: /nonexistent/libcudart.so:"
        ),
        "{err}"
    );
    let out = Command::new(chd_bin())
        .args(["topology", "--cuda-runtime", "/nonexistent/libcudart.so"])
        .args(["--acl-runtime", "/nonexistent/libascendcl.so"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("backend host:"), "{text}");
    assert!(text.contains("note: cuda skipped:"), "{text}");
    // A library that loads but lacks symbols names the missing one.
    let out = Command::new(chd_bin())
        .args(["topology", "--backend", "acl", "--acl-runtime", "libc.so.6"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("libc.so.6 lacks symbol aclInit"), "{err}");
}

#[test]
fn pageable_host_memory_on_acl_is_a_configuration_error_naming_the_key() {
    let state = tempfile::tempdir().unwrap();
    let runs = [
        vec!["serve", "--listen", "127.0.0.1:0", "--state-dir"],
        vec![
            "probe",
            "h2d",
            "--sizes",
            "1MiB",
            "--memory",
            "pinned,pageable",
        ],
    ];
    for mut args in runs {
        if args[0] == "serve" {
            args.push(state.path().to_str().unwrap());
            args.extend(["--host-memory", "pageable"]);
        }
        args.extend(["--backend", "acl", "--acl-runtime", lib()]);
        let out = Command::new(chd_bin()).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {err}");
        assert!(err.contains("runtime.host_memory"), "{args:?}: {err}");
        assert!(err.contains("aclrtMallocHost"), "{args:?}: {err}");
        // Refused up front: no cell ran (a probe would have printed a row or a summary).
        assert!(
            String::from_utf8_lossy(&out.stdout).trim().is_empty(),
            "{args:?}"
        );
    }
    // The CUDA backend measures pageable memory (its copies are synchronous, not undefined).
    let out = Command::new(chd_bin())
        .args(["probe", "h2d", "--sizes", "1MiB", "--iterations", "1"])
        .args(["--repeats", "1", "--devices", "0", "--memory", "pageable"])
        .args(["--backend", "cuda", "--cuda-runtime", lib()])
        .args(["--nvml", lib()])
        .env("CHD_FAKE_DEVICE_COUNT", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Issue 15's physics check end to end: the link each device is seen with after its copies
/// (the fixture's sysfs: device 0 Gen5 x16, device 1 Gen5 trained at x8 of x16) gives its
/// payload limit, and each column's median over it the link efficiency.
#[test]
fn link_efficiency_is_the_column_median_over_the_link_seen_while_probing() {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/accelerators/gpu-node");
    let sysfs = fixture.join("sys");
    let procfs = fixture.join("proc");
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec![
        "--sysfs-root".to_string(),
        sysfs.to_str().unwrap().to_string(),
        "--procfs-root".to_string(),
        procfs.to_str().unwrap().to_string(),
        "--cpus".to_string(),
        "0".to_string(),
    ];
    args.extend(fast("cuda"));
    let chd = serve(
        dir.path(),
        &args,
        &[
            ("CHD_FAKE_DEVICE_COUNT", "2"),
            ("CHD_FAKE_PCI_BUS_IDS", "0000:1A:00.0,0000:9C:00.0"),
            // 0.79 of Gen5 x16 and 0.30 of Gen5 x8.
            ("CHD_FAKE_H2D_GBPS", "49.8;1=9.45"),
        ],
    );
    let m = chd.wait_for(
        Duration::from_secs(60),
        "both links and efficiencies",
        |m| m.find("chd_h2d_link_efficiency_ratio", &[]).len() == 2,
    );
    let link = |device: &str, state: &str| {
        m.value(
            "chd_device_pcie_link_bandwidth_bytes_per_second",
            &[("device", device), ("state", state)],
        )
    };
    assert_eq!(link("0", "current"), 63_015_384_615.0);
    assert_eq!(link("0", "max"), 63_015_384_615.0);
    assert_eq!(link("1", "current"), 31_507_692_308.0);
    assert_eq!(link("1", "max"), 63_015_384_615.0);
    let efficiency = |device: &str| {
        m.value(
            "chd_h2d_link_efficiency_ratio",
            &[
                ("device", device),
                ("size_bytes", SIZE_64_MIB),
                ("direction", "h2d"),
            ],
        )
    };
    assert!(
        (efficiency("0") - 0.790).abs() < 0.01,
        "{}",
        efficiency("0")
    );
    assert!(
        (efficiency("1") - 0.300).abs() < 0.01,
        "{}",
        efficiency("1")
    );
    // The scrape-time collector reads the same link files.
    assert_eq!(
        m.value(
            "chd_device_pcie_link_width",
            &[("device", "1"), ("state", "current")]
        ),
        8.0
    );
    // The /matrix page puts the link and the efficiency beside each device.
    let (status, _, page) = chd.get("/matrix", None);
    assert_eq!(status, 200);
    for row in [
        "<td>0000:1a:00.0</td><td>0</td><td>x16 Gen5 of x16 Gen5, 63.0 GB/s</td><td>0.79 (64MiB h2d)</td>",
        "<td>0000:9c:00.0</td><td>1</td><td>x8 Gen5 of x16 Gen5, 31.5 GB/s</td><td>0.30 (64MiB h2d)</td>",
    ] {
        assert!(page.contains(row), "{row} not in\n{page}");
    }
    promtool_check_metrics(&chd.scrape());
}
