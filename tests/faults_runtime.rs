//! Runtime faults injected into a running `chd serve` through the fake runtime's control
//! file (`CHD_FAKE_CONTROL_FILE`, re-read on every call, so a fault starts and ends while chd
//! runs) and survived: copies failing mid-window on one device and on all; a device lost
//! (fallen off the bus) and back; a collective hanging; SIGTERM with a cell in flight.
//! `tests/accelerators.rs` has a device failing from the start, `tests/pair_probe.rs` and
//! `tests/pair_teardown.rs` the hung collective's error and teardown, `tests/serve.rs` SIGTERM
//! on the host backend; this file adds what those leave out.

#[path = "support/chd_process.rs"]
mod chd_process;
#[path = "support/fake_runtime.rs"]
mod fake;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use chd_process::{promtool_check_metrics, Chd, Metrics};
use fake::fake_runtime_path as lib;

/// A `chd serve` on the fake runtime with a control file, and the state directory.
struct Faulty {
    chd: Chd,
    dir: tempfile::TempDir,
    control: PathBuf,
}

impl Faulty {
    /// `backend` `cuda` (with NVML) or `acl`; `args` after the fast defaults; `env` the
    /// fake's variables.
    fn start(backend: &str, devices: u32, args: &[&str], env: &[(&str, &str)]) -> Faulty {
        let dir = tempfile::tempdir().unwrap();
        let control = dir.path().join("fake-control");
        std::fs::write(&control, "").unwrap();
        let mut all: Vec<&str> = vec![
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
            "--backend",
            backend,
        ];
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
    assert_eq!(cells(&later, "1"), device1, "device 1's cells kept their values");
    for d in ["0", "2"] {
        assert_eq!(errors(&later, "h2d", d, "copy"), 0.0, "device {d}");
        assert!(!cells(&later, d).is_empty());
    }
    assert!(
        f.chd.log().contains("cudaMemcpyAsync failed: cudaErrorUnknown: unknown error (code 999)"),
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
        assert_eq!(&cells(&worse, d), kept, "device {d}'s cells kept their values");
    }
    assert_eq!(f.chd.get("/healthz", None).2, "ok\n");
    promtool_check_metrics(&f.chd.scrape());

    // The fault clears: the next window measures every device again.
    f.set("");
    let ok = runs(&worse, "h2d", "ok");
    f.wait("a good window after the fault", |m| runs(m, "h2d", "ok") > ok);
    let last = f.wait("no new errors", |m| {
        runs(m, "h2d", "ok") > ok + 1.0
    });
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
/// counts a `device` error against it, nothing panics; back, it is measured again.
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

    f.set("");
    f.wait("device 2 fresh again", |m| {
        coverage(m, "fresh") == total && coverage(m, "stale") == 0.0
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

fn _unused(_: &Path, _: Instant) {}
