//! End-to-end tests of the idle gate: `chd serve` reads CPU counters from a procfs root that
//! the test rewrites, so "other processes keep the CPUs busy" can be played exactly. Busy
//! ticks must be skipped as `cpu_busy`, and a window in progress must stop as `aborted`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::chd_process::Chd;

/// A procfs tree whose `stat` counters advance as the test says: `busy_share` of every
/// elapsed tick is spent by "other processes".
struct FakeProc {
    dir: tempfile::TempDir,
}

impl FakeProc {
    fn new() -> FakeProc {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("self")).unwrap();
        for f in ["status", "stat"] {
            std::fs::copy(
                Path::new("/proc/self").join(f),
                dir.path().join("self").join(f),
            )
            .unwrap();
        }
        let p = FakeProc { dir };
        p.write(1_000_000, 0);
        p
    }

    fn root(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// Write `/proc/stat` with the real file's layout and the given aggregate counters.
    fn write(&self, total: u64, busy: u64) {
        let real = std::fs::read_to_string("/proc/stat").unwrap();
        let idle = total - busy;
        let mut out = format!("cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\n");
        for line in real.lines().skip(1) {
            out.push_str(line);
            out.push('\n');
        }
        let tmp = self.dir.path().join("stat.tmp");
        std::fs::write(&tmp, out).unwrap();
        std::fs::rename(&tmp, self.dir.path().join("stat")).unwrap();
    }

    /// Advance the counters every 50 ms with `busy_share` of the time busy, until stopped.
    fn load(self: &Arc<Self>, busy_share: f64) -> (Arc<AtomicBool>, JoinHandle<()>) {
        let stop = Arc::new(AtomicBool::new(false));
        let (me, flag) = (self.clone(), stop.clone());
        let handle = std::thread::spawn(move || {
            let (mut total, mut busy) = (1_000_000u64, 0u64);
            while !flag.load(Ordering::SeqCst) {
                total += 100;
                busy += (100.0 * busy_share) as u64;
                me.write(total, busy);
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        (stop, handle)
    }
}

#[test]
fn busy_ticks_are_skipped_and_idle_ones_probe() {
    let state = tempfile::tempdir().unwrap();
    let proc = Arc::new(FakeProc::new());
    let root = proc.root();
    let chd = Chd::serve(
        state.path(),
        &[
            "--procfs-root",
            root.to_str().unwrap(),
            "--interval",
            "1s",
            "--window-budget",
            "200ms",
            "--sizes",
            "4",
            "--iterations",
            "1",
        ],
    );
    // The first window runs right at start, whatever the load.
    chd.wait_for(Duration::from_secs(20), "the first window", |m| {
        m.value("chd_idle_windows_total", &[("outcome", "probed")]) >= 1.0
    });
    let (stop, writer) = proc.load(0.9);
    let busy = chd.wait_for(Duration::from_secs(20), "a cpu_busy tick", |m| {
        m.value("chd_idle_windows_total", &[("outcome", "cpu_busy")]) >= 1.0
    });
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    let probed_while_busy = busy.value("chd_idle_windows_total", &[("outcome", "probed")]);
    // Counters frozen: no load seen, the gate opens again.
    chd.wait_for(
        Duration::from_secs(20),
        "a probed tick after the load",
        |m| m.value("chd_idle_windows_total", &[("outcome", "probed")]) > probed_while_busy,
    );
}

/// `chd serve` on `root` with one window long enough (30 min, 16 cells of up to 128 MiB, 20
/// iterations) that it is still running when the test changes the gate's inputs; returns
/// once its first cell is in.
fn serve_one_long_window(state: &Path, root: &Path) -> Chd {
    let chd = Chd::serve(
        state,
        &[
            "--procfs-root",
            root.to_str().unwrap(),
            "--interval",
            "1h",
            "--window-budget",
            "30m",
            "--sizes",
            "16,32,48,64,80,96,112,128",
            "--directions",
            "h2d,d2h",
            "--iterations",
            "20",
        ],
    );
    chd.wait_for(Duration::from_secs(30), "the first cell", |m| {
        !m.find("chd_h2d_bandwidth_bytes_per_second", &[]).is_empty()
    });
    chd
}

/// Waits for the window to be counted as aborted before it covered the matrix.
fn assert_window_aborted(chd: &Chd) {
    let m = chd.wait_for(Duration::from_secs(20), "an aborted window", |m| {
        m.value(
            "chd_probe_runs_total",
            &[("probe", "h2d"), ("result", "aborted")],
        ) >= 1.0
    });
    assert!(
        m.value(
            "chd_probe_cells",
            &[("probe", "h2d"), ("state", "unmeasured")]
        ) > 0.0,
        "the window should have stopped before covering the matrix"
    );
}

#[test]
fn a_window_in_progress_stops_when_the_node_gets_busy() {
    let state = tempfile::tempdir().unwrap();
    let proc = Arc::new(FakeProc::new());
    let chd = serve_one_long_window(state.path(), &proc.root());
    let (stop, writer) = proc.load(0.9);
    assert_window_aborted(&chd);
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    assert!(
        chd.log()
            .contains("idle gate closed mid-window (CPUs busy)"),
        "{}",
        chd.log()
    );
}

/// The gate fails closed: with `/proc/stat` garbled from the start, no window runs (not even
/// the first, which ignores the load but needs a reading), every tick counts as
/// `gate_error`, and the log names the file. Once the file reads again, probing resumes.
#[test]
fn an_unreadable_proc_stat_skips_windows_instead_of_probing_blind() {
    let state = tempfile::tempdir().unwrap();
    let proc = Arc::new(FakeProc::new());
    let root = proc.root();
    std::fs::write(root.join("stat"), "cpu  these are not counters\n").unwrap();
    let chd = Chd::serve(
        state.path(),
        &[
            "--procfs-root",
            root.to_str().unwrap(),
            "--interval",
            "300ms",
            "--window-budget",
            "200ms",
            "--sizes",
            "4",
            "--iterations",
            "1",
        ],
    );
    let m = chd.wait_for(Duration::from_secs(20), "three gate_error ticks", |m| {
        m.value("chd_idle_windows_total", &[("outcome", "gate_error")]) >= 3.0
    });
    assert_eq!(
        m.value("chd_idle_windows_total", &[("outcome", "probed")]),
        0.0
    );
    assert!(m.find("chd_h2d_bandwidth_bytes_per_second", &[]).is_empty());
    let stat = root.join("stat");
    let log = chd.log();
    assert!(
        log.contains("skipping probe window: idle gate input unreadable")
            && log.contains(stat.to_str().unwrap()),
        "{log}"
    );
    // The file reads again (frozen counters: idle): the gate opens.
    proc.write(1_000_000, 0);
    chd.wait_for(Duration::from_secs(20), "a probed tick", |m| {
        m.value("chd_idle_windows_total", &[("outcome", "probed")]) >= 1.0
    });
}

/// A window in progress stops when `/proc/stat` stops reading, as it does when the node
/// gets busy.
#[test]
fn a_window_stops_when_proc_stat_becomes_unreadable() {
    let state = tempfile::tempdir().unwrap();
    let proc = Arc::new(FakeProc::new());
    let root = proc.root();
    let chd = serve_one_long_window(state.path(), &root);
    std::fs::remove_file(root.join("stat")).unwrap();
    assert_window_aborted(&chd);
    let log = chd.log();
    assert!(
        log.contains("idle gate closed mid-window (idle gate input unreadable"),
        "{log}"
    );
}
