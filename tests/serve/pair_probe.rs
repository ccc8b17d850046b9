//! The core-pair probe end to end through the fake runtime (CUDA + NCCL, ACL + HCCL, and the
//! peer-copy fallback): pair metrics fill, a planted slow rank-0 core is the only CPU below
//! 0.7, a failing or hanging collective shows in `chd_probe_errors_total` while the exporter
//! keeps serving; `chd_pair_probe_info` names the method (`copy-staged` where peer access is
//! refused) and communicators are released between windows (`chd_held_communicators`,
//! `chd_held_device_memory_bytes`), quarantined where HCCL says `HCCL_E_AGAIN`.

use crate::chd_process;

use std::time::Duration;

use crate::chd_process::{promtool_check_metrics, Chd, Metrics};
use crate::fake::fake_runtime_path as lib;
use chd::runtime::pair::CommState;

fn cpus() -> Vec<String> {
    chd_process::allowed_cpus()
        .iter()
        .map(u32::to_string)
        .collect()
}

fn serve(
    backend: &str,
    collective: &str,
    env: &[(&str, &str)],
    extra: &[&str],
) -> (tempfile::TempDir, Chd) {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec![
        "--interval",
        "1s",
        "--window-budget",
        "800ms",
        "--cpu-busy-threshold",
        "1",
        "--sizes",
        "16",
        "--iterations",
        "2",
        "--pair",
        "0,1",
        "--pair-size",
        "16",
        "--collective",
        collective,
        "--backend",
        backend,
    ];
    match backend {
        "cuda" => args.extend(["--cuda-runtime", lib(), "--nvml", lib(), "--nccl", lib()]),
        _ => args.extend(["--acl-runtime", lib(), "--hccl", lib()]),
    }
    args.extend_from_slice(extra);
    let mut all_env = vec![("CHD_FAKE_DEVICE_COUNT", "2")];
    all_env.extend_from_slice(env);
    let chd = Chd::serve_env(dir.path(), &args, &all_env);
    (dir, chd)
}

/// Every (rank, cpu) has a per-CPU median.
fn pair_covered(m: &Metrics) -> bool {
    let cpus = cpus();
    ["0", "1"].iter().all(|rank| {
        cpus.iter().all(|cpu| {
            !m.find(
                "chd_pair_bandwidth_bytes_per_second",
                &[("pair", "0,1"), ("rank", rank), ("cpu", cpu)],
            )
            .is_empty()
        })
    })
}

fn slow_rank0_core(backend: &str, collective: &str) {
    let cpus = cpus();
    assert!(cpus.len() >= 2, "this test needs two CPUs");
    let slow = cpus.last().unwrap().clone();
    let spec = format!("13.7;rank0:{slow}=4.0");
    let (_dir, chd) = serve(backend, collective, &[("CHD_FAKE_PAIR_GBPS", &spec)], &[]);
    // Ratios are judged on the whole matrix: wait until every cell is measured and the window
    // that measured the last of them has ended (its cells reach the store as they are
    // measured, its run is counted when it ends, so one scrape can fall in between).
    let m = chd.wait_for(
        Duration::from_secs(60),
        "the whole pair matrix, and a pair window ended",
        |m| {
            pair_covered(m)
                && m.value(
                    "chd_probe_cells",
                    &[("probe", "pair"), ("state", "unmeasured")],
                ) == 0.0
                && m.find("chd_probe_runs_total", &[("probe", "pair")])
                    .iter()
                    .map(|s| s.value)
                    .sum::<f64>()
                    >= 1.0
        },
    );
    for rank in ["0", "1"] {
        for cpu in &cpus {
            let r = m.value(
                "chd_pair_cpu_ratio",
                &[("pair", "0,1"), ("rank", rank), ("cpu", cpu)],
            );
            let planted = rank == "0" && *cpu == slow;
            assert_eq!(
                r < 0.7,
                planted,
                "rank {rank} cpu {cpu}: ratio {r}; pair series: {:?}",
                m.0.iter()
                    .filter(|s| s.name.starts_with("chd_pair_cell") || s.name == "chd_probe_cells")
                    .map(|s| format!("{}{:?}={}", s.name, s.labels, s.value))
                    .collect::<Vec<_>>()
            );
        }
    }
    // Bus bandwidth of a fast cell is exactly the configured rate.
    let fast = m.value(
        "chd_pair_bandwidth_bytes_per_second",
        &[("pair", "0,1"), ("rank", "0"), ("cpu", &cpus[0])],
    );
    assert!((fast - 13.7e9).abs() < 0.01 * 13.7e9, "{fast}");
    assert!(
        m.value(
            "chd_probe_runs_total",
            &[("probe", "pair"), ("result", "ok")]
        ) >= 1.0
    );
    assert!(
        chd.log().contains(&format!("method=\"{collective}\"")),
        "{}",
        chd.log()
    );
    assert_eq!(
        m.value(
            "chd_pair_probe_info",
            &[("pair", "0,1"), ("method", collective)]
        ),
        1.0
    );
    // Between windows chd holds no communicator (they were cached for the process before).
    let m = chd.wait_for(Duration::from_secs(30), "no communicator held", |m| {
        m.value(
            "chd_held_communicators",
            &[("library", collective), ("state", "in_use")],
        ) == 0.0
    });
    for state in ["releasing", "quarantined", "leaked"] {
        let labels = [("library", collective), ("state", state)];
        assert_eq!(m.value("chd_held_communicators", &labels), 0.0, "{state}");
    }
    if collective == "hccl" {
        assert_eq!(
            m.value("chd_held_device_memory_bytes", &[("device", "0")]),
            0.0
        );
    } else {
        assert!(m.find("chd_held_device_memory_bytes", &[]).is_empty());
    }
    promtool_check_metrics(&chd.scrape());
}

#[test]
fn nccl_slow_rank0_core_is_the_only_one_below_0_7() {
    slow_rank0_core("cuda", "nccl");
}

#[test]
fn hccl_slow_rank0_core_is_the_only_one_below_0_7() {
    slow_rank0_core("acl", "hccl");
}

#[test]
fn peer_copy_fallback_fills_the_pair_metrics() {
    let (_dir, chd) = serve("cuda", "copy", &[("CHD_FAKE_STAGED_GBPS", "3")], &[]);
    let m = chd.wait_for(
        Duration::from_secs(60),
        "every CPU in both ranks",
        pair_covered,
    );
    assert_eq!(
        m.value(
            "chd_pair_probe_info",
            &[("pair", "0,1"), ("method", "copy")]
        ),
        1.0
    );
    // Peer access enabled: the link's rate, not the host-staged one.
    let bw = m.value(
        "chd_pair_bandwidth_bytes_per_second",
        &[("pair", "0,1"), ("rank", "0"), ("cpu", &cpus()[0])],
    );
    assert!((bw - 13.7e9).abs() < 0.01 * 13.7e9, "{bw}");
    assert!(m.find("chd_held_communicators", &[]).is_empty());
}

#[test]
fn refused_peer_access_is_measured_and_labelled_copy_staged() {
    let (_dir, chd) = serve(
        "cuda",
        "copy",
        &[("CHD_FAKE_NO_PEER", "0,1"), ("CHD_FAKE_STAGED_GBPS", "3")],
        &[],
    );
    let m = chd.wait_for(
        Duration::from_secs(60),
        "every CPU in both ranks",
        pair_covered,
    );
    assert_eq!(
        m.value(
            "chd_pair_probe_info",
            &[("pair", "0,1"), ("method", "copy-staged")]
        ),
        1.0
    );
    assert!(m
        .find("chd_pair_probe_info", &[("method", "copy")])
        .is_empty());
    let bw = m.value(
        "chd_pair_bandwidth_bytes_per_second",
        &[("pair", "0,1"), ("rank", "0"), ("cpu", &cpus()[0])],
    );
    assert!((bw - 3e9).abs() < 0.01 * 3e9, "host-staged: {bw}");
    let log = chd.log();
    assert!(
        log.contains("method=\"copy-staged\"") && log.contains("staged through host memory"),
        "{log}"
    );
}

#[test]
fn a_failing_collective_is_an_error_not_an_outage() {
    let (_dir, chd) = serve("cuda", "nccl", &[("CHD_FAKE_PAIR_FAIL", "1")], &[]);
    let m = chd.wait_for(Duration::from_secs(60), "pair errors", |m| {
        m.find(
            "chd_probe_errors_total",
            &[
                ("probe", "pair"),
                ("device", "0,1"),
                ("reason", "collective"),
            ],
        )
        .iter()
        .any(|s| s.value >= 1.0)
    });
    assert!(m
        .find("chd_pair_bandwidth_bytes_per_second", &[])
        .is_empty());
    // Copy cells go on; the exporter keeps serving.
    chd.wait_for(Duration::from_secs(30), "copy cells", |m| {
        !m.find("chd_h2d_bandwidth_bytes_per_second", &[]).is_empty()
    });
}

#[test]
fn a_hung_collective_is_bounded_by_the_timeout() {
    let (_dir, chd) = serve(
        "cuda",
        "nccl",
        &[("CHD_FAKE_PAIR_HANG_MS", "5000")],
        &["--pair-timeout", "300ms"],
    );
    chd.wait_for(Duration::from_secs(60), "timeout errors", |m| {
        m.find(
            "chd_probe_errors_total",
            &[("probe", "pair"), ("device", "0,1"), ("reason", "timeout")],
        )
        .iter()
        .any(|s| s.value >= 1.0)
    });
    assert_eq!(chd.get("/healthz", None).2, "ok\n");
}

#[test]
fn a_hung_hccl_collective_keeps_its_communicators_quarantined_and_says_why() {
    let (_dir, chd) = serve(
        "acl",
        "hccl",
        &[("CHD_FAKE_PAIR_HANG_MS", "3000"), ("HCCL_BUFFSIZE", "16")],
        &["--pair-timeout", "300ms"],
    );
    let m = chd.wait_for(Duration::from_secs(60), "quarantined communicators", |m| {
        m.value(
            "chd_held_communicators",
            &[("library", "hccl"), ("state", "quarantined")],
        ) >= 2.0
    });
    // Quarantined communicators still hold their buffers: 2 x HCCL_BUFFSIZE each.
    assert!(
        m.value("chd_held_device_memory_bytes", &[("device", "0")]) >= f64::from(2 * (16 << 20))
    );
    let log = chd.log();
    assert!(
        log.contains("HcclCommDestroy failed: try again (code 20)") && log.contains("quarantined"),
        "{log}"
    );
    assert_eq!(chd.get("/healthz", None).2, "ok\n");
}

/// CANN runs one collective API at a time on a card (the fake refuses and counts any other,
/// `hccl_concurrent_calls`): while a hung allgather keeps its communicators quarantined, the
/// pair's next cells create no new communicator and start no collective on those cards; they
/// are skipped with the reason `quarantined`, and no further 2 x HCCL_BUFFSIZE is taken.
#[test]
fn a_card_with_a_quarantined_communicator_runs_no_other_collective() {
    let report = tempfile::NamedTempFile::new().unwrap();
    let report_path = report.path().to_str().unwrap().to_string();
    let (_dir, chd) = serve(
        "acl",
        "hccl",
        &[
            ("CHD_FAKE_PAIR_HANG_MS", "4000"),
            ("HCCL_BUFFSIZE", "16"),
            ("CHD_FAKE_EXIT_REPORT", &report_path),
        ],
        &["--pair-timeout", "300ms"],
    );
    let m = chd.wait_for(Duration::from_secs(60), "a quarantined pair cell", |m| {
        m.find(
            "chd_probe_errors_total",
            &[("probe", "pair"), ("reason", "quarantined")],
        )
        .iter()
        .any(|s| s.value >= 1.0)
    });
    // At most the hung cell's two communicators (fewer once its allgather returned and
    // they were released: a busy machine may scrape that late).
    let held: f64 = CommState::ALL
        .iter()
        .map(|s| {
            m.value(
                "chd_held_communicators",
                &[("library", "hccl"), ("state", s.as_str())],
            )
        })
        .sum();
    assert!(held <= 2.0, "{held} communicators: {}", chd.log());
    let (status, log) = chd.terminate();
    assert!(status.success(), "{log}");
    let text = std::fs::read_to_string(&report_path).unwrap();
    assert!(
        text.lines().any(|l| l == "hccl_concurrent_calls=0"),
        "chd called HCCL on a card whose collective was in flight:\n{text}\n{log}"
    );
}

/// Each HCCL communicator holds 2 x HCCL_BUFFSIZE of its card: a window over every pair of
/// three NPUs holds at most `runtime.hccl_communicators_per_card` (default 1) per card at
/// once, the fake's high-water mark says so, and two per card is honoured too.
#[test]
fn a_window_over_every_pair_holds_the_configured_communicators_per_card() {
    for (per_card, extra) in [("1", None), ("2", Some("2"))] {
        let report = tempfile::NamedTempFile::new().unwrap();
        let report_path = report.path().to_str().unwrap().to_string();
        // serve() names 0,1.
        let mut args = vec!["--pair", "0,2", "--pair", "1,2"];
        if let Some(n) = extra {
            args.extend(["--hccl-communicators-per-card", n]);
        }
        let (_dir, chd) = serve(
            "acl",
            "hccl",
            &[
                ("CHD_FAKE_DEVICE_COUNT", "3"),
                ("HCCL_BUFFSIZE", "16"),
                ("CHD_FAKE_EXIT_REPORT", &report_path),
            ],
            &args,
        );
        chd.wait_for(Duration::from_secs(60), "every pair measured", |m| {
            ["0,1", "0,2", "1,2"].iter().all(|p| {
                !m.find("chd_pair_bandwidth_bytes_per_second", &[("pair", p)])
                    .is_empty()
            })
        });
        let (status, log) = chd.terminate();
        assert!(status.success(), "{log}");
        let text = std::fs::read_to_string(&report_path).unwrap();
        assert!(
            text.lines()
                .any(|l| l == format!("hccl_max_communicators_per_card={per_card}")),
            "--hccl-communicators-per-card {per_card}:\n{text}\n{log}"
        );
    }
}
