//! What the `chd probe` tests share: a run directory's records and slots, waiting on a
//! running probe, the CPUs this process may use.

use std::path::Path;
use std::process::{Child, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::chd_process::run_chd as chd;
use crate::chd_process::text;

pub(crate) fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "chd failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// The sample records of a run directory, each line parsed.
pub(crate) fn records(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("cells.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}")))
        .collect()
}

/// A record's slot identity (everything but the measurement).
pub(crate) fn slot(r: &Value) -> String {
    let mut o = r.as_object().unwrap().clone();
    for k in ["bytes_per_second", "error", "reason", "at"] {
        o.remove(k);
    }
    serde_json::to_string(&o).unwrap()
}

pub(crate) fn lines_in(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|t| t.matches('\n').count())
        .unwrap_or(0)
}

/// Wait until `dir/cells.jsonl` has at least `n` lines.
pub(crate) fn wait_for_lines(child: &mut Child, dir: &Path, n: usize) {
    let start = Instant::now();
    while lines_in(&dir.join("cells.jsonl")) < n {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the run ended ({status}) before {n} samples were written");
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "fewer than {n} samples after 60 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub(crate) fn wait_with_timeout(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("chd did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

pub(crate) fn cpu_count() -> usize {
    let out = chd(&["topology", "--json", "--backend", "host"], &[]);
    assert_ok(&out);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["cpus"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["allowed"].as_bool().unwrap_or(true))
        .count()
}
