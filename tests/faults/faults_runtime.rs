//! Runtime faults injected into a running `chd serve` through the fake runtime's control
//! file (`CHD_FAKE_CONTROL_FILE`, re-read on every call, so a fault starts and ends while chd
//! runs) and survived: copies failing mid-window on one device and on all; a device lost
//! (fallen off the bus) and back; a collective hanging; SIGTERM with a cell in flight (a
//! slow pinned allocation, a hung collective); and the first two in a one-shot
//! `chd probe h2d`. The fake's exit report (`CHD_FAKE_EXIT_REPORT`) says what chd still held,
//! and which threads were bound, when it exited.
//! `tests/serve/accelerators.rs` has a device failing from the start, `tests/serve/pair_probe.rs`
//! and `tests/runtime/pair_teardown.rs` the hung collective's error and teardown,
//! `tests/serve/serve.rs` SIGTERM on the host backend; this file adds what those leave out.

use crate::chd_process;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::chd_process::{promtool_check_metrics, Chd, Metrics};
use crate::fake::fake_runtime_path as lib;

/// A `chd serve` on the fake runtime with a control file, and the state directory.
struct Faulty {
    chd: Chd,
    dir: tempfile::TempDir,
    control: PathBuf,
}

impl Faulty {
    /// `backend` `cuda` (with NVML and NCCL) or `acl` (with HCCL); `args` after the fast
    /// defaults; `env` the fake's variables.
    fn start(backend: &str, devices: u32, args: &[&str], env: &[(&str, &str)]) -> Faulty {
        let dir = tempfile::tempdir().unwrap();
        let control = dir.path().join("fake-control");
        std::fs::write(&control, "").unwrap();
        // Fast windows over small cells; `args` override any of these flags.
        let defaults = [
            ("--interval", "1s"),
            ("--window-budget", "800ms"),
            ("--cpu-busy-threshold", "1"),
            ("--sizes", "16"),
            ("--iterations", "2"),
        ];
        let mut all: Vec<&str> = vec!["--backend", backend];
        for (flag, value) in defaults {
            if !args.contains(&flag) {
                all.extend([flag, value]);
            }
        }
        match backend {
            "cuda" => all.extend(["--cuda-runtime", lib(), "--nvml", lib(), "--nccl", lib()]),
            _ => all.extend(["--acl-runtime", lib(), "--hccl", lib()]),
        }
        all.extend_from_slice(args);
        let count = devices.to_string();
        let mut vars = vec![
            ("CHD_FAKE_DEVICE_COUNT", count.as_str()),
            ("CHD_FAKE_CONTROL_FILE", control.to_str().unwrap()),
        ];
        vars.extend_from_slice(env);
        let chd = Chd::serve_env(dir.path(), &all, &vars);
        Faulty { chd, dir, control }
    }

    /// Replace the faults in force (`KEY=VALUE` lines, see the fake's README).
    fn set(&self, faults: &str) {
        std::fs::write(&self.control, faults).unwrap();
    }

    fn wait(&self, what: &str, ready: impl Fn(&Metrics) -> bool) -> Metrics {
        self.chd.wait_for(Duration::from_secs(60), what, ready)
    }

    /// No panic, from chd or a thread of it, in the log.
    fn assert_no_panic(&self) {
        let log = self.chd.log();
        assert!(!log.contains("panicked"), "{log}");
    }
}

fn cells(m: &Metrics, device: &str) -> BTreeMap<BTreeMap<String, String>, f64> {
    m.find("chd_h2d_bandwidth_bytes_per_second", &[("device", device)])
        .into_iter()
        .map(|s| (s.labels.clone(), s.value))
        .collect()
}

fn errors(m: &Metrics, probe: &str, device: &str, reason: &str) -> f64 {
    m.find(
        "chd_probe_errors_total",
        &[("probe", probe), ("device", device), ("reason", reason)],
    )
    .iter()
    .map(|s| s.value)
    .sum()
}

fn runs(m: &Metrics, probe: &str, result: &str) -> f64 {
    m.find(
        "chd_probe_runs_total",
        &[("probe", probe), ("result", result)],
    )
    .iter()
    .map(|s| s.value)
    .sum()
}

fn coverage(m: &Metrics, state: &str) -> f64 {
    m.value("chd_probe_cells", &[("probe", "h2d"), ("state", state)])
}

fn every_cell_measured(m: &Metrics, devices: &[&str]) -> bool {
    coverage(m, "unmeasured") == 0.0 && devices.iter().all(|d| !cells(m, d).is_empty())
}

/// Fault 1: copies fail mid-window, after two good copies on every stream of the failing
/// device (`CHD_FAKE_FAIL_AFTER=2`: each cell's timed copies fail part-way), first on one
/// device, then on all. Each failed cell is counted as a `copy` error against its device,
/// every window tries again, cells measured before keep their values, and the exporter goes
/// on serving; once the fault is gone the cells are measured again.
#[test]
fn copies_failing_mid_window_cost_the_failing_cells_and_the_next_window_tries_again() {
    let f = Faulty::start("cuda", 3, &[], &[("CHD_FAKE_FAIL_AFTER", "2")]);
    let all = ["0", "1", "2"];
    let before = f.wait("every cell measured", |m| every_cell_measured(m, &all));
    let device1 = cells(&before, "1");

    // One device fails.
    f.set("fail_devices=1\n");
    let first = f.wait("copy errors on device 1", |m| {
        errors(m, "h2d", "1", "copy") >= 1.0
    });
    let later = f.wait("device 1 failing again in a later window", |m| {
        errors(m, "h2d", "1", "copy") > errors(&first, "h2d", "1", "copy")
            && runs(m, "h2d", "ok") >= runs(&first, "h2d", "ok") + 2.0
    });
    assert_eq!(
        cells(&later, "1"),
        device1,
        "device 1's cells kept their values"
    );
    for d in ["0", "2"] {
        assert_eq!(errors(&later, "h2d", d, "copy"), 0.0, "device {d}");
        assert!(!cells(&later, d).is_empty());
    }
    assert!(
        f.chd
            .log()
            .contains("cudaMemcpyAsync failed: cudaErrorUnknown: unknown error (code 999)"),
        "{}",
        f.chd.log()
    );

    // Every device fails: windows measure nothing and count as errors.
    f.set("fail_devices=0,1,2\n");
    let failing = f.wait("a window that measured nothing", |m| {
        runs(m, "h2d", "error") >= 1.0
    });
    let kept: Vec<_> = all.iter().map(|d| cells(&failing, d)).collect();
    let worse = f.wait("two more failed windows", |m| {
        runs(m, "h2d", "error") >= runs(&failing, "h2d", "error") + 2.0
    });
    for (d, kept) in all.iter().zip(&kept) {
        assert!(
            errors(&worse, "h2d", d, "copy") > errors(&failing, "h2d", d, "copy"),
            "device {d} tried again"
        );
        assert_eq!(
            &cells(&worse, d),
            kept,
            "device {d}'s cells kept their values"
        );
    }
    assert_eq!(f.chd.get("/healthz", None).2, "ok\n");
    promtool_check_metrics(&f.chd.scrape());

    // The fault clears: the next window measures every device again.
    f.set("");
    let ok = runs(&worse, "h2d", "ok");
    f.wait("a good window after the fault", |m| {
        runs(m, "h2d", "ok") > ok
    });
    let last = f.wait("no new errors", |m| runs(m, "h2d", "ok") > ok + 1.0);
    let settled = f.wait("a window without errors", |m| {
        runs(m, "h2d", "ok") > runs(&last, "h2d", "ok")
            && all
                .iter()
                .all(|d| errors(m, "h2d", d, "copy") == errors(&last, "h2d", d, "copy"))
    });
    assert!(every_cell_measured(&settled, &all));
    f.assert_no_panic();
}

/// Fault 2: a device is lost while chd runs (every call on it answers the vendor's
/// device-lost code, and so does its telemetry). Its cells go stale, the other devices' cells
/// stay fresh, the idle gate does not shut for it (a lost device runs no job), each try
/// counts a `device` error against it, the node's verdict is failed, nothing panics; back, it
/// is measured again and the verdict clears.
fn a_lost_device_goes_stale_and_comes_back(backend: &str) {
    let f = Faulty::start(backend, 3, &["--stale-after", "4s"], &[]);
    let all = ["0", "1", "2"];
    let before = f.wait("every cell measured", |m| every_cell_measured(m, &all));
    let per_device = cells(&before, "2").len() as f64;
    let total = coverage(&before, "fresh");
    assert_eq!(total, 3.0 * per_device);

    f.set("lost_devices=2\n");
    let gone = f.wait("device 2's cells stale, the others fresh", |m| {
        coverage(m, "stale") == per_device && coverage(m, "fresh") == total - per_device
    });
    assert!(errors(&gone, "h2d", "2", "device") >= 1.0);
    // Whichever call saw the loss (a cell in flight fails in a copy or an event record),
    // the reason is the device's.
    for reason in ["copy", "timing", "alloc"] {
        assert_eq!(errors(&gone, "h2d", "2", reason), 0.0, "{reason}");
    }
    assert_eq!(
        gone.value("chd_idle_windows_total", &[("outcome", "gate_error")]),
        0.0,
        "the lost device shut the gate"
    );
    assert_eq!(cells(&gone, "2").len() as f64, per_device, "values kept");
    for d in ["0", "1"] {
        assert_eq!(errors(&gone, "h2d", d, "device"), 0.0);
    }
    let code = match backend {
        "cuda" => "cudaSetDevice failed: cudaErrorDevicesUnavailable",
        _ => "aclrtSetDevice failed",
    };
    assert!(f.chd.log().contains(code), "{}", f.chd.log());
    promtool_check_metrics(&f.chd.scrape());
    // The node is failed while the device is gone, whatever its old cells say: its values are
    // kept, so only the telemetry's word names it.
    let failed = |m: &Metrics| m.value("chd_node_verdict", &[("verdict", "failed")]) == 1.0;
    f.wait("the verdict failed", failed);
    assert!(
        f.chd
            .log()
            .contains("device 2 lost (its telemetry says it fell off the bus)"),
        "{}",
        f.chd.log()
    );

    f.set("");
    f.wait("device 2 fresh again and the node ok", |m| {
        coverage(m, "fresh") == total
            && coverage(m, "stale") == 0.0
            && m.value("chd_node_verdict", &[("verdict", "ok")]) == 1.0
    });
    f.assert_no_panic();
}

#[test]
fn cuda_a_lost_device_goes_stale_and_comes_back() {
    a_lost_device_goes_stale_and_comes_back("cuda");
}

#[test]
fn acl_a_lost_device_goes_stale_and_comes_back() {
    a_lost_device_goes_stale_and_comes_back("acl");
}

/// The `elapsed_ms` of every "probe window done" line logged after `skip` such lines.
fn window_times(log: &str, skip: usize) -> Vec<u64> {
    log.lines()
        .filter(|l| l.contains("probe window done"))
        .skip(skip)
        .filter_map(|l| l.split("elapsed_ms=").nth(1))
        .filter_map(|v| v.split_whitespace().next()?.parse().ok())
        .collect()
}

/// Fault 3: a collective hangs (every allgather blocks 5 s, far past `--pair-timeout`). The
/// window still ends on time (its budget, plus at most one cell's timeout and cleanup
/// grace), scrapes answer while a rank hangs, the timed-out communicators are aborted (held
/// `releasing`, then gone: never `leaked`), and once the hang is over the next window
/// measures the pair. `tests/serve/pair_probe.rs` has the timeout error and `/healthz`;
/// `tests/runtime/pair_teardown.rs` the in-process teardown bounds.
#[test]
fn a_hung_collective_ends_its_window_on_time_and_scrapes_answer_meanwhile() {
    let f = Faulty::start(
        "cuda",
        2,
        &[
            "--pair",
            "0,1",
            "--pair-size",
            "16",
            "--collective",
            "nccl",
            "--pair-timeout",
            "300ms",
            // The fake's pair hang holds peer copies too, and a peer copy cell (like a copy
            // cell) cannot be given up mid-call: this test is about the collective.
            "--p2p-size",
            "0",
        ],
        // Each abort takes 1.5 s, so a scrape sees the communicators it is releasing.
        &[("CHD_FAKE_ABORT_HANG_MS", "1500")],
    );
    f.wait("a pair cell measured", |m| {
        !m.find("chd_pair_bandwidth_bytes_per_second", &[])
            .is_empty()
    });
    let windows_before = window_times(&f.chd.log(), 0).len();
    f.set("pair_hang_ms=5000\n");
    // Scrape throughout the hang: every answer complete and quick.
    let hung_since = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut scrapes = 0;
    let mut seen = Metrics::default();
    let mut releasing = 0.0f64;
    while hung_since.elapsed() < Duration::from_secs(6)
        || errors(&seen, "pair", "0,1", "timeout") < 2.0
    {
        assert!(
            hung_since.elapsed() < Duration::from_secs(60),
            "no timeouts; log:\n{}",
            f.chd.log()
        );
        let t = Instant::now();
        seen = Metrics::parse(&f.chd.scrape());
        slowest = slowest.max(t.elapsed());
        releasing = releasing.max(seen.value(
            "chd_held_communicators",
            &[("library", "nccl"), ("state", "releasing")],
        ));
        scrapes += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        slowest < Duration::from_secs(2),
        "slowest of {scrapes} scrapes during the hang: {slowest:?}"
    );
    // Windows end on time: the 800 ms budget, plus one pair cell over budget (its 300 ms
    // timeout and at most as much cleanup grace) and one copy cell, about 1.5 s; 3.5 s leaves
    // room for a loaded machine and is still far below the 5 s hang.
    let times = window_times(&f.chd.log(), windows_before);
    assert!(times.len() >= 2, "{times:?}");
    assert!(
        times.iter().all(|&ms| ms < 3500),
        "window times during the hang: {times:?}"
    );
    eprintln!("during the hang: {scrapes} scrapes, slowest {slowest:?}; window times {times:?} ms");
    // The timed-out set was aborted on the side: both communicators counted while the abort
    // ran, none ever leaked.
    assert!(
        releasing >= 2.0,
        "releasing communicators seen: {releasing}"
    );
    assert_eq!(
        seen.value(
            "chd_held_communicators",
            &[("library", "nccl"), ("state", "leaked")]
        ),
        0.0
    );
    let log = f.chd.log();
    assert!(log.contains("pair cell failed: timed out"), "{log}");

    // The hang ends: aborted communicators are gone, and the next window measures the pair.
    f.set("");
    let ok = runs(&seen, "pair", "ok");
    let m = f.wait("a pair window that measured again", |m| {
        runs(m, "pair", "ok") > ok
            && ["in_use", "releasing", "quarantined", "leaked"]
                .iter()
                .all(|state| {
                    m.value(
                        "chd_held_communicators",
                        &[("library", "nccl"), ("state", state)],
                    ) == 0.0
                })
    });
    assert!(!m
        .find("chd_pair_bandwidth_bytes_per_second", &[])
        .is_empty());
    f.assert_no_panic();
}

/// The fake's exit report (`CHD_FAKE_EXIT_REPORT`): its counters and the threads' masks.
struct ExitReport {
    values: BTreeMap<String, u64>,
    /// (tid, name, Cpus_allowed_list), the main thread first.
    threads: Vec<(String, String, String)>,
}

impl ExitReport {
    fn read(path: &Path) -> ExitReport {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("no exit report at {}: {e}", path.display()));
        let mut values = BTreeMap::new();
        let mut threads = Vec::new();
        for line in text.lines() {
            let (key, value) = line.split_once('=').expect("KEY=VALUE");
            if key == "thread" {
                let mut parts = value.splitn(3, ' ');
                let mut next = || parts.next().unwrap_or("").to_string();
                threads.push((next(), next(), next()));
            } else if key == "context_devices" {
                // A device list, not a count (tests/probe_cli/fake_cuda.rs reads it).
            } else {
                values.insert(key.to_string(), value.parse().expect("a count"));
            }
        }
        ExitReport { values, threads }
    }
}

/// Fault 4: SIGTERM while a cell is in flight (each 128 MiB pinned buffer takes 512 ms to
/// pin, `CHD_FAKE_PIN_SLEEP`, and each cell's copies a few hundred ms). chd exits 0 within 2 s of the
/// signal, every cell measured before it is in state.json, and by the time the process
/// exits the fake holds no pinned or device memory and no communicator for it, and no
/// thread is left bound to a probe CPU (the exit report lists every thread's mask).
/// `tests/serve/serve.rs` has the same on the host backend, without the holdings.
#[test]
fn sigterm_with_a_cell_in_flight_exits_in_time_holding_nothing() {
    let report = tempfile::NamedTempFile::new().unwrap();
    let report_path = report.path().to_str().unwrap().to_string();
    let f = Faulty::start(
        "cuda",
        4,
        &[
            "--interval",
            "1h",
            "--window-budget",
            "30m",
            "--sizes",
            "128",
            "--directions",
            "h2d,d2h",
            "--iterations",
            "4",
        ],
        &[
            ("CHD_FAKE_PIN_MS_PER_MIB", "4"),
            ("CHD_FAKE_PIN_SLEEP", "1"),
            ("CHD_FAKE_EXIT_REPORT", &report_path),
        ],
    );
    let before = f.wait("the first measured cells", |m| {
        m.find("chd_h2d_bandwidth_bytes_per_second", &[]).len() >= 2
    });
    let measured: Vec<_> = (0..4)
        .flat_map(|d| cells(&before, &d.to_string()))
        .collect();
    assert!(
        coverage(&before, "unmeasured") > 0.0,
        "the window finished before SIGTERM; make it longer"
    );
    let Faulty { chd, dir, .. } = f;
    let signalled = Instant::now();
    let (status, log) = chd.terminate();
    let took = signalled.elapsed();
    eprintln!("SIGTERM to exit: {took:?}");
    assert!(status.success(), "exit {status:?}; log:\n{log}");
    assert!(
        took < Duration::from_secs(2),
        "exit took {took:?}; log:\n{log}"
    );

    let exit = ExitReport::read(report.path());
    for key in [
        "live_pinned_allocations",
        "live_pinned_bytes",
        "live_device_allocations",
        "live_communicators",
    ] {
        assert_eq!(exit.values.get(key), Some(&0), "{key}; log:\n{log}");
    }
    let (_, _, process_mask) = &exit.threads[0];
    for (tid, name, mask) in &exit.threads {
        assert_eq!(
            mask, process_mask,
            "thread {tid} ({name}) still bound at exit"
        );
    }

    // Every cell served before the signal is in the state file, with the value served.
    let state = std::fs::read_to_string(dir.path().join("state.json")).expect("state.json");
    let state: serde_json::Value = serde_json::from_str(&state).unwrap();
    let records = state["h2d"].as_array().expect("h2d records");
    for (labels, value) in &measured {
        let record = records
            .iter()
            .find(|r| {
                r["cpu"].as_u64() == labels["cpu"].parse().ok()
                    && r["device"] == labels["device"].as_str()
                    && r["size_bytes"].as_u64() == labels["size_bytes"].parse().ok()
                    && r["direction"] == labels["direction"].as_str()
            })
            .unwrap_or_else(|| panic!("{labels:?} not saved"));
        let samples: Vec<f64> = record["samples"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["bytes_per_second"].as_f64().unwrap())
            .collect();
        // The exposition prints whole bytes per second.
        let saved = chd::stats::median(&samples).expect("a sample");
        assert!(
            (saved - value).abs() <= 1.0,
            "{labels:?}: saved {saved}, served {value}"
        );
    }
}

/// Fault 4 with the cell in flight a hung collective (every allgather blocks 20 s, within
/// the default-like 30 s pair timeout): SIGTERM still ends chd within 2 s, exit status 0;
/// the hung cell is given up as on its timeout (its communicators aborted), so at exit the
/// fake holds no communicator and no thread is left bound.
#[test]
fn sigterm_during_a_hung_collective_exits_in_time() {
    let report = tempfile::NamedTempFile::new().unwrap();
    let report_path = report.path().to_str().unwrap().to_string();
    let f = Faulty::start(
        "cuda",
        2,
        &[
            "--pair",
            "0,1",
            "--pair-size",
            "16",
            "--collective",
            "nccl",
            "--pair-timeout",
            "30s",
            // The fake's pair hang holds peer copies too, and a peer copy cell (like a copy
            // cell) cannot be given up mid-call: this test is about the collective.
            "--p2p-size",
            "0",
        ],
        &[
            ("CHD_FAKE_PAIR_HANG_MS", "20000"),
            ("CHD_FAKE_EXIT_REPORT", &report_path),
        ],
    );
    // The copy half of the first window is done: its pair half is hanging now.
    f.wait("the copy half of a window", |m| runs(m, "h2d", "ok") >= 1.0);
    std::thread::sleep(Duration::from_millis(300));
    let Faulty { chd, dir, .. } = f;
    let signalled = Instant::now();
    let (status, log) = chd.terminate();
    let took = signalled.elapsed();
    eprintln!("SIGTERM to exit, a collective hanging: {took:?}");
    assert!(status.success(), "exit {status:?}; log:\n{log}");
    assert!(
        took < Duration::from_secs(2),
        "exit took {took:?}; log:\n{log}"
    );
    assert!(dir.path().join("state.json").exists());
    let exit = ExitReport::read(report.path());
    assert_eq!(
        exit.values.get("live_communicators"),
        Some(&0),
        "log:\n{log}"
    );
    assert_eq!(
        exit.values.get("live_pinned_allocations"),
        Some(&0),
        "log:\n{log}"
    );
    let (_, _, process_mask) = &exit.threads[0];
    for (tid, name, mask) in &exit.threads {
        assert_eq!(
            mask, process_mask,
            "thread {tid} ({name}) still bound at exit"
        );
    }
}

/// Faults 1 and 2 in a one-shot `chd probe h2d`: device 1 lost, device 2 failing after two
/// good copies per stream. Every cell of device 0 is measured, every cell of 1 and 2 is a
/// failed sample with its reason (`device`, `copy`), the run ends with the summary's count
/// and exit status 1, and at exit nothing is held and no thread is bound.
#[test]
fn a_one_shot_run_records_each_failing_device_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let control = dir.path().join("control");
    std::fs::write(&control, "lost_devices=1\nfail_devices=2\n").unwrap();
    let report = dir.path().join("exit-report");
    let out = dir.path().join("run");
    let output = chd_process::run_chd(
        &[
            "probe",
            "h2d",
            "--sizes",
            "4MiB",
            "--iterations",
            "2",
            "--repeats",
            "2",
            "--backend",
            "cuda",
            "--cuda-runtime",
            lib(),
            "--nvml",
            lib(),
            "--out",
            out.to_str().unwrap(),
        ],
        &[
            ("CHD_FAKE_DEVICE_COUNT", "3"),
            ("CHD_FAKE_FAIL_AFTER", "2"),
            ("CHD_FAKE_CONTROL_FILE", control.to_str().unwrap()),
            ("CHD_FAKE_EXIT_REPORT", report.to_str().unwrap()),
        ],
    );
    let stderr = chd_process::text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let cpus = chd_process::allowed_cpus().len();
    assert!(
        stderr.contains(&format!(
            "chd: {} of {} cells could not be measured",
            2 * cpus,
            3 * cpus
        )),
        "{stderr}"
    );
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(out.join("cells.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 3 * cpus * 2, "every sample recorded");
    for row in &rows {
        let want = match row["device"].as_str().unwrap() {
            "0" => None,
            "1" => Some("device"),
            _ => Some("copy"),
        };
        assert_eq!(row["reason"].as_str(), want, "{row}");
        assert_eq!(row["bytes_per_second"].is_number(), want.is_none(), "{row}");
    }
    let exit = ExitReport::read(&report);
    for key in [
        "live_pinned_allocations",
        "live_device_allocations",
        "live_communicators",
    ] {
        assert_eq!(exit.values.get(key), Some(&0), "{key}");
    }
    let (_, _, process_mask) = &exit.threads[0];
    for (tid, name, mask) in &exit.threads {
        assert_eq!(
            mask, process_mask,
            "thread {tid} ({name}) still bound at exit"
        );
    }
}
