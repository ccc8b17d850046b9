//! `chd probe d2d` end to end: a planted slow device (`CHD_FAKE_D2D_GBPS`) through the fake
//! CUDA runtime is the one the report names; every device's CPU is recorded; a failing device
//! costs only its cells; a run cut short resumes without measuring a slot twice; the host
//! backend's node-memory copies run too; bad flags are clear errors.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::chd_process::run_chd as chd;
use crate::chd_process::{allowed_cpus, text};
use crate::common::{assert_ok, records, slot};
use crate::fake;
use crate::fake_cuda::fake_args;

const ENV: [(&str, &str); 3] = [
    ("CHD_FAKE_DEVICE_COUNT", "4"),
    ("CHD_FAKE_H2D_GBPS", "58.9"),
    // Device 2 is weak at HBM to HBM; its H2D rate is everyone's.
    ("CHD_FAKE_D2D_GBPS", "400;2=120"),
];

fn d2d_args<'a>(lib: &'a str, out: &'a str) -> Vec<&'a str> {
    let mut args = vec![
        "probe",
        "d2d",
        "--sizes",
        "1MiB,4MiB",
        "--iters",
        "2",
        "--repeats",
        "2",
        "--out",
        out,
    ];
    args.extend(fake_args(lib));
    args
}

#[test]
fn planted_slow_device_is_the_one_the_report_names() {
    let lib = fake::fake_runtime_path();
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap();
    let out = chd(&d2d_args(lib, out_dir), &ENV);
    assert_ok(&out);
    let stdout = text(&out.stdout);
    let findings: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("finding: "))
        .collect();
    assert_eq!(findings.len(), 2, "{stdout}");
    assert!(
        findings.iter().all(|f| f.starts_with(
            "finding: device 2 is slow at same-device copies: 0.30 x the typical device (400.00 GB/s), median 120.00 GB/s"
        )),
        "{stdout}"
    );
    let summary = std::fs::read_to_string(dir.path().join("summary.md")).unwrap();
    let slow_rows: Vec<&str> = summary
        .lines()
        .filter(|l| l.ends_with("| **slow** |"))
        .collect();
    assert_eq!(slow_rows.len(), 2, "{summary}");
    assert!(
        slow_rows
            .iter()
            .all(|l| l.starts_with("| 2 | Fake H200 |") && l.contains("| 120.00 | 0.30 |")),
        "{slow_rows:?}"
    );
    assert!(summary.contains("## D2D 4MiB same-device copies, load idle"));
    // cells.csv: one line per device and size, the slow one at 120 GB/s.
    let csv = std::fs::read_to_string(dir.path().join("cells.csv")).unwrap();
    let d2d: Vec<&str> = csv.lines().filter(|l| l.starts_with("d2d,")).collect();
    assert_eq!(d2d.len(), 8, "{csv}");
    // The 120 GB/s lines are device 2's, one per size (an empty set would prove nothing).
    let slow: Vec<&&str> = d2d.iter().filter(|l| l.contains(",120.000,")).collect();
    assert_eq!(slow.len(), 2, "{csv}");
    assert!(
        slow.iter().all(|l| l.split(',').nth(5) == Some("2")),
        "{csv}"
    );
    // run.json records the kind and the CPU each device ran from; every sample used it.
    let run: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("run.json")).unwrap())
            .unwrap();
    assert_eq!(run["plan"]["probe"], "d2d");
    let cpus: Vec<u64> = run["plan"]["cpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_u64().unwrap())
        .collect();
    assert_eq!(cpus.len(), 4);
    let allowed = allowed_cpus();
    assert!(
        cpus.iter().all(|c| allowed.contains(&(*c as u32))),
        "{cpus:?}"
    );
    let recs = records(dir.path());
    assert_eq!(recs.len(), 4 * 2 * 2);
    for r in &recs {
        let device: usize = r["device"].as_str().unwrap().parse().unwrap();
        assert_eq!(r["cpu"].as_u64(), Some(cpus[device]), "{r}");
        assert_eq!(r["matrix"], "d2d");
    }
}

#[test]
fn a_failing_device_costs_only_its_cells_and_a_cut_run_resumes() {
    let lib = fake::fake_runtime_path();
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap();
    let mut env = ENV.to_vec();
    env.push(("CHD_FAKE_FAIL_DEVICES", "3"));
    let out = chd(&d2d_args(lib, out_dir), &env);
    assert!(!out.status.success(), "{}", text(&out.stdout));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("2 of 8 cells could not be measured") && stderr.contains("device 3"),
        "{stderr}"
    );
    let recs = records(dir.path());
    assert_eq!(recs.len(), 16);
    for r in &recs {
        let failed = r["device"] == "3";
        assert_eq!(r["bytes_per_second"].is_null(), failed, "{r}");
        if failed {
            assert_eq!(r["reason"], "copy", "{r}");
        }
    }
    // Cut the log to its first 5 samples (a run killed there) and resume: every slot once.
    let log = dir.path().join("cells.jsonl");
    let kept: String = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .take(5)
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&log, kept).unwrap();
    let resume = [
        vec!["probe", "d2d", "--out", out_dir, "--resume"],
        fake_args(lib),
    ]
    .concat();
    let out = chd(&resume, &ENV);
    assert_ok(&out);
    assert!(
        text(&out.stderr).contains("5 already measured, resuming"),
        "{}",
        text(&out.stderr)
    );
    let recs = records(dir.path());
    let slots: BTreeSet<String> = recs.iter().map(slot).collect();
    assert_eq!((recs.len(), slots.len()), (16, 16));
    // A resumed run keeps its plan: another size is refused.
    let other = [
        vec![
            "probe", "d2d", "--out", out_dir, "--resume", "--sizes", "8MiB",
        ],
        fake_args(lib),
    ]
    .concat();
    let out = chd(&other, &ENV);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--sizes"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn host_backend_copies_node_memory_and_bad_flags_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap();
    let out = chd(
        &[
            "probe",
            "d2d",
            "--backend",
            "host",
            "--sizes",
            "1MiB",
            "--iters",
            "2",
            "--repeats",
            "1",
            "--out",
            out_dir,
        ],
        &[],
    );
    assert_ok(&out);
    let recs = records(dir.path());
    assert!(!recs.is_empty());
    assert!(recs.iter().all(
        |r| r["device"].as_str().is_some_and(|d| d.starts_with("numa"))
            && r["bytes_per_second"].as_f64().is_some_and(|v| v > 0.0)
    ));
    for (args, want) in [
        (
            vec!["--devices", "numa99"],
            "--devices: \"numa99\" is not a device",
        ),
        (vec!["--sizes", "64MB"], "--sizes"),
        (
            vec!["--iterations", "0"],
            "--iterations and --repeats must be at least 1",
        ),
    ] {
        let full = [vec!["probe", "d2d", "--backend", "host"], args].concat();
        let out = chd(&full, &[]);
        assert!(!out.status.success(), "{full:?}");
        assert!(
            text(&out.stderr).contains(want),
            "{full:?}: {}",
            text(&out.stderr)
        );
    }
    let help = chd(&["probe", "d2d", "--help"], &[]);
    assert_ok(&help);
    let help = text(&help.stdout);
    assert!(
        help.contains("Same-device copies") && help.contains("NUMA node"),
        "{help}"
    );
}

/// The limit of a same-device copy comes from the device memory NVML describes (the fake
/// answers as an H200: 6144 bits at 3201 MHz, 4.92 TB/s, 2.46 TB/s for a copy, which reads and
/// writes each byte) and is recorded in run.json; a device reading above it is implausible,
/// named with the limit and left out of the typical device; a configured `[limits."MODEL"]`
/// table wins over NVML.
#[test]
fn a_copy_above_what_the_device_memory_carries_is_implausible_and_a_configured_limit_wins() {
    let lib = fake::fake_runtime_path();
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("nvml");
    // Device 1 "reads" 3 TB/s: a copy that stayed in a cache. Devices 2 and 3 copy at
    // 150 GB/s: against the plausible devices' median (150) they are typical; with device 1
    // counted (a median of 275) they would read 0.55 x, slow.
    let env = [
        ("CHD_FAKE_DEVICE_COUNT", "4"),
        ("CHD_FAKE_D2D_GBPS", "400;1=3000;2=150;3=150"),
    ];
    let out = chd(&d2d_args(lib, out_dir.to_str().unwrap()), &env);
    assert_ok(&out);
    let run: Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("run.json")).unwrap()).unwrap();
    for d in run["machine"]["devices"].as_array().unwrap() {
        assert_eq!(
            d["memory"],
            serde_json::json!({"bus_width_bits": 6144, "max_clock_mhz": 3201}),
            "{d}"
        );
    }
    let stdout = text(&out.stdout);
    let implausible: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("implausible, a measurement fault"))
        .collect();
    assert_eq!(implausible.len(), 2, "one per size: {stdout}");
    assert!(
        implausible.iter().all(|l| l.contains(
            "device 1 reads 3000.00 GB/s at same-device copies, above its path's limit of 2458.37 GB/s (device memory"
        )),
        "{implausible:?}"
    );
    // Left out of the typical device: no device is slow.
    assert!(
        !stdout.contains("is slow at same-device copies"),
        "{stdout}"
    );

    // A configured table wins: at most 350 GB/s for this model makes every device
    // implausible, the limit named as the config key.
    let config = dir.path().join("chd.toml");
    std::fs::write(&config, "[limits.\"Fake H200\"]\nd2d_gbps = 350\n").unwrap();
    let out_dir = dir.path().join("configured");
    let mut args = d2d_args(lib, out_dir.to_str().unwrap());
    args.extend(["--config", config.to_str().unwrap()]);
    let env = [
        ("CHD_FAKE_DEVICE_COUNT", "4"),
        ("CHD_FAKE_D2D_GBPS", "400;1=3000"),
    ];
    let out = chd(&args, &env);
    assert_ok(&out);
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("4 of 4 devices implausible at same-device copies"),
        "{stdout}"
    );
    assert!(
        stdout.contains("above its path's limit of 350.00 GB/s ([limits.\"Fake H200\"] d2d_gbps)"),
        "{stdout}"
    );
    let run: Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("run.json")).unwrap()).unwrap();
    assert_eq!(run["machine"]["devices"][0]["limits_gbps"]["d2d"], 350.0);

    // A config key chd does not know is named.
    std::fs::write(&config, "[limits.\"Fake H200\"]\nd2d = 350\n").unwrap();
    let out = chd(&args, &env);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("d2d"), "{}", text(&out.stderr));
}
