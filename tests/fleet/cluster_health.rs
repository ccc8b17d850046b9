//! ClusterHealthDetect recordings in every shape the public tool writes (fixtures in
//! `tests/fixtures/cluster-health/`, see its README): `chd report` and `chd serve --replay`
//! read them with one reader and agree cell for cell; partial runs say so; rows chd cannot
//! use are named; a recording with nothing usable is refused with exit code 1.

use crate::chd_process;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::chd_process::{promtool_check_metrics, Chd, Metrics};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/cluster-health")
        .join(name)
}

fn report(input: &Path, out: &Path) -> Output {
    Command::new(chd_process::chd_bin())
        .arg("report")
        .arg(input)
        .arg("--out")
        .arg(out)
        .output()
        .expect("run chd report")
}

fn replay(input: &Path, state: &Path) -> Chd {
    Chd::serve(
        state,
        &[
            "--replay",
            input.to_str().unwrap(),
            "--cells",
            "true",
            "--pair-cells",
            "true",
            // Every per-CPU series too: the topology is asserted from chd_cpu_info.
            "--cpu-series",
            "all",
        ],
    )
}

/// A cell of `cells.csv`: (matrix, cpu, peer cpu, device, size bytes, direction).
type CellId = (String, String, String, String, String, String);
/// Cells of a report: (bytes per second if measured, failed samples).
type CsvCells = BTreeMap<CellId, (Option<f64>, u32)>;

/// `cells.csv` of a report: cell -> (bytes per second if measured, failed samples).
fn csv_cells(dir: &Path) -> CsvCells {
    let text = std::fs::read_to_string(dir.join("cells.csv")).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let mut out = BTreeMap::new();
    for line in lines {
        // Only the device column may be quoted ("0,5"); split around it.
        let fields = split_csv(line);
        let get = |name: &str| fields[col(name)].clone();
        let id = (
            get("matrix"),
            get("cpu"),
            get("peer_cpu"),
            get("device"),
            get("size_bytes"),
            get("direction"),
        );
        let value = get("bytes_per_second").parse::<f64>().ok();
        out.insert(id, (value, get("failed").parse().unwrap()));
    }
    out
}

fn split_csv(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut quoted = false;
    for c in line.chars() {
        match (c, quoted) {
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(String::new()),
            (c, _) => fields.last_mut().unwrap().push(c),
        }
    }
    fields
}

/// The cells a replay serves, keyed like [`csv_cells`].
fn scraped_cells(m: &Metrics) -> BTreeMap<CellId, f64> {
    let mut out = BTreeMap::new();
    for s in m.find("chd_h2d_bandwidth_bytes_per_second", &[]) {
        let l = &s.labels;
        out.insert(
            (
                "h2d".to_string(),
                l["cpu"].clone(),
                String::new(),
                l["device"].clone(),
                l["size_bytes"].clone(),
                l["direction"].clone(),
            ),
            s.value,
        );
    }
    for s in m.find("chd_pair_cell_bandwidth_bytes_per_second", &[]) {
        let l = &s.labels;
        out.insert(
            (
                "pair".to_string(),
                l["rank0_cpu"].clone(),
                l["rank1_cpu"].clone(),
                l["pair"].clone(),
                String::new(),
                "allgather".to_string(),
            ),
            s.value,
        );
    }
    out
}

/// Report and replay one fixture; assert they agree on every cell and every failed sample.
fn report_and_replay_agree(name: &str) -> (Metrics, CsvCells, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = report(&fixture(name), dir.path());
    assert!(
        out.status.success(),
        "{name}: chd report failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let csv = csv_cells(dir.path());
    let state = tempfile::tempdir().unwrap();
    let chd = replay(&fixture(name), state.path());
    let body = chd.scrape();
    let m = Metrics::parse(&body);
    let served = scraped_cells(&m);
    // Pair series carry no size: the fixtures have one pair size each.
    let strip = |id: &CellId| {
        let mut id = id.clone();
        if id.0 == "pair" {
            id.4 = String::new();
        }
        id
    };
    let measured: BTreeMap<CellId, f64> = csv
        .iter()
        .filter_map(|(id, (v, _))| v.map(|v| (strip(id), v)))
        .collect();
    assert_eq!(
        measured.keys().collect::<Vec<_>>(),
        served.keys().collect::<Vec<_>>(),
        "{name}: report and replay list different measured cells"
    );
    for (id, v) in &measured {
        let got = served[id];
        assert!(
            (got - v).abs() <= 1.0,
            "{name}: cell {id:?}: report {v}, replay {got}"
        );
    }
    let failed: u32 = csv.values().map(|(_, f)| f).sum();
    let counted: f64 = m
        .find("chd_probe_errors_total", &[("reason", "recorded")])
        .iter()
        .map(|s| s.value)
        .sum();
    assert_eq!(
        f64::from(failed),
        counted,
        "{name}: failed samples in the report vs recorded errors in the replay"
    );
    promtool_check_metrics(&body);
    let summary = std::fs::read_to_string(dir.path().join("summary.md")).unwrap();
    let log = chd.log();
    drop(chd);
    (
        m,
        csv,
        format!(
            "{summary}\n--- report stderr\n{}\n--- replay log\n{log}",
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn every_recording_shape_reports_and_replays_the_same_cells() {
    for name in [
        "h2d-npu",
        "h2d-partial",
        "h2d-v1",
        "pair-rank0",
        "pair-all-ranks",
        "pair-ranks-only",
        "pair-partial",
    ] {
        let (_, csv, _) = report_and_replay_agree(name);
        assert!(!csv.is_empty(), "{name}: no cells");
    }
}

#[test]
fn a_finished_npu_run_serves_every_cell_as_h2d_with_its_failures() {
    let (m, csv, text) = report_and_replay_agree("h2d-npu");
    // 8 CPUs x 4 NPUs x 2 sizes from results.json (not the 4-CPU checkpoint beside it).
    assert_eq!(csv.len(), 64, "{text}");
    assert!(csv.keys().all(|k| k.5 == "h2d"));
    assert!(!text.contains("host_to_device"), "{text}");
    assert!(
        !text.contains("partial"),
        "the finished results were read: {text}"
    );
    let ratio = |d: &str| {
        m.value(
            "chd_h2d_device_ratio",
            &[
                ("device", d),
                ("size_bytes", "67108864"),
                ("direction", "h2d"),
            ],
        )
    };
    assert!(ratio("0") < 0.3, "NPU0 at 12.7 GB/s: {}", ratio("0"));
    assert!((0.98..1.02).contains(&ratio("1")));
    // CPU 7 could not be bound: every device and size failed twice, nothing measured.
    for ((_, cpu, ..), (v, failed)) in &csv {
        if cpu == "7" {
            assert_eq!((*v, *failed), (None, 2));
        }
    }
    assert!(m
        .find("chd_h2d_bandwidth_bytes_per_second", &[("cpu", "7")])
        .is_empty());
    // CPU 6 -> NPU 2 at 64 MiB failed once of two repeats: its value is the other sample.
    let cell = &csv[&(
        "h2d".into(),
        "6".into(),
        String::new(),
        "2".into(),
        "67108864".into(),
        "h2d".into(),
    )];
    assert_eq!(cell.1, 1);
    assert!(cell.0.is_some());
    // 8 x 2 failed binds + 1 failed copy, on the devices they hit.
    assert_eq!(
        m.value(
            "chd_probe_errors_total",
            &[("probe", "h2d"), ("device", "2"), ("reason", "recorded")]
        ),
        5.0
    );
    // The topology comes from affinity.json: NUMA node, socket and core of each CPU.
    assert_eq!(
        m.find(
            "chd_cpu_info",
            &[
                ("cpu", "5"),
                ("numa_node", "1"),
                ("package", "0"),
                ("core", "5")
            ]
        )
        .len(),
        1,
        "{text}"
    );
    assert!(text.contains("1 of 8 CPUs cannot be bound: 7"), "{text}");
    assert!(text.contains("| device kind | npu |"), "{text}");
}

#[test]
fn a_run_that_only_left_its_checkpoint_says_so_everywhere() {
    let (_, csv, text) = report_and_replay_agree("h2d-partial");
    assert_eq!(csv.len(), 6, "CPUs 0-2 x 2 GPUs: {text}");
    let note = "only the partial checkpoint partial_results.json exists: the run did not finish \
                (last completed CPU 2";
    assert!(
        text.contains(&format!("> **Note:** {note}")),
        "summary.md: {text}"
    );
    assert!(
        text.contains(&format!("chd report: note: {note}")),
        "stderr: {text}"
    );
    assert!(
        text.contains("partial recording (the run did not finish)"),
        "startup line: {text}"
    );
    let (_, _, text) = report_and_replay_agree("pair-partial");
    assert!(
        text.contains("only the partial checkpoint rank_00000_partial.json exists")
            && text.contains("2 CPU pairs done per rank, last CPU pair 0 x 7"),
        "{text}"
    );
}

#[test]
fn pair_rows_recorded_by_every_rank_are_one_sample_each() {
    let (m, csv, text) = report_and_replay_agree("pair-all-ranks");
    // rank0 CPUs {0, 2} x rank1 CPUs {6, 7}.
    assert_eq!(csv.len(), 4, "{text}");
    for ((_, cpu0, cpu1, ..), (v, failed)) in &csv {
        // Rank 1 could not bind to CPU 7 in repeat 1: one of two samples failed.
        let want_failed = u32::from(cpu1 == "7");
        assert_eq!(*failed, want_failed, "{cpu0} x {cpu1}");
        assert!(v.is_some());
    }
    // Rank 0's value, not the median of both ranks' copies: 13.70 + 0.05 x ((0 + 6) % 3).
    let v = m.value(
        "chd_pair_cell_bandwidth_bytes_per_second",
        &[("pair", "0,5"), ("rank0_cpu", "0"), ("rank1_cpu", "6")],
    );
    assert!((v - 13.7e9).abs() < 1e6, "{v}");
    assert!(
        text.contains("8 pair samples were recorded once per rank"),
        "{text}"
    );
    // The same run without its merged results.json: the per-rank files give the same cells.
    let (_, ranks_only, _) = report_and_replay_agree("pair-ranks-only");
    assert_eq!(csv, ranks_only);
    // Rank 0's CPU 2 is the slow one.
    assert!(
        m.value(
            "chd_pair_cpu_ratio",
            &[("pair", "0,5"), ("rank", "0"), ("cpu", "2")]
        ) < 0.7
    );
}

#[test]
fn a_recording_that_measured_nothing_fails_loudly_in_report_and_replay() {
    let dir = tempfile::tempdir().unwrap();
    let out = report(&fixture("skip-only"), dir.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let want = "no matrix cells: 1 row not used: skipped by the tool: \
                ModuleNotFoundError(\"No module named 'torch'\") x1 (first: results.json metrics[0])";
    assert!(err.contains(want), "{err}");
    let out = Command::new(chd_process::chd_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--replay"])
        .arg(fixture("skip-only"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("replaying") && err.contains(want), "{err}");
    assert!(!err.contains("listening on"), "{err}");
}

#[test]
fn rows_chd_cannot_use_are_counted_and_named_in_report_and_replay() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    std::fs::create_dir(&run).unwrap();
    let mut rows = Vec::new();
    for cpu in 0..4 {
        rows.push(format!(
            r#"{{"device_id": 0, "direction": "host_to_device", "gbps": 50.0, "host_cpu": {cpu}, "pinned": true, "size_mb": 64, "status": "ok", "test": "core_h2d_matrix"}}"#
        ));
    }
    for cpu in 0..3 {
        rows.push(format!(
            r#"{{"device_id": 0, "direction": "device_to_device_same_rank", "gbps": 400.0, "host_cpu": {cpu}, "size_mb": 64, "status": "ok", "test": "core_h2d_matrix"}}"#
        ));
    }
    rows.push(r#"{"device_id": 0, "gbps": 50.0, "size_mb": 64, "status": "ok", "test": "core_h2d_matrix"}"#.into());
    rows.push(r#"{"test": "d2d", "status": "ok", "gbps": 400.0}"#.into());
    std::fs::write(
        run.join("results.json"),
        format!(r#"{{"meta": {{}}, "metrics": [{}]}}"#, rows.join(",\n")),
    )
    .unwrap();
    let out = report(&run, &dir.path().join("out"));
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let direction =
        "direction \"device_to_device_same_rank\" is not host_to_device or device_to_host";
    assert!(
        err.contains(&format!(
            "chd report: 3 rows not used: {direction} (first: results.json metrics[4])"
        )),
        "{err}"
    );
    assert!(
        err.contains("chd report: 1 row not used: no host_cpu (first: results.json metrics[7])"),
        "{err}"
    );
    let summary = std::fs::read_to_string(dir.path().join("out/summary.md")).unwrap();
    assert!(summary.contains("## Rows not used"), "{summary}");
    assert!(
        summary.contains(&format!("| {direction} | 3 | results.json metrics[4] |")),
        "{summary}"
    );
    assert!(
        summary.contains("| other tests (not shown) | d2d x1 |"),
        "{summary}"
    );
    let state = tempfile::tempdir().unwrap();
    let chd = replay(&run, state.path());
    let m = Metrics::parse(&chd.scrape());
    assert_eq!(m.find("chd_h2d_bandwidth_bytes_per_second", &[]).len(), 4);
    let log = chd.log();
    let startup = log
        .lines()
        .find(|l| l.contains("replaying") && l.contains("h2d cells"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(
        startup.contains(&format!(
            "4 h2d cells, 0 pair cells, 0 failed samples, 4 rows not used: {direction} x3 \
             (first: results.json metrics[4]); no host_cpu x1 (first: results.json metrics[7])"
        )),
        "{startup}"
    );
}

#[test]
fn a_640_cpu_16_npu_recording_in_the_tools_shape_replays_every_cell() {
    // The report that opened issue 11: every row "status": "ok" with the tool's full key set,
    // and the replay served an empty matrix because of "direction": "host_to_device".
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("a3");
    std::fs::create_dir(&run).unwrap();
    let mut text = String::from(r#"{"meta": {"affinity_summary": {"numa_nodes": {"#);
    for node in 0..8 {
        let cpus: Vec<String> = (node * 80..node * 80 + 80).map(|c| c.to_string()).collect();
        let _ = write!(
            text,
            r#"{}"{node}": {{"cpu_count": 80, "cpus": [{}]}}"#,
            if node == 0 { "" } else { ", " },
            cpus.join(", ")
        );
    }
    text.push_str(r#"}}, "device_ids": [0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15], "device_kind": "npu", "sizes_mb": [16, 64, 256]}, "metrics": ["#);
    let mut first = true;
    for cpu in 0..640 {
        for size in [16, 64, 256] {
            for d in 0..16 {
                let gbps = if d == 0 { 12.7 } else { 58.4 };
                let _ = write!(
                    text,
                    r#"{}{{"bind_actual_cpus": [{cpu}], "bind_actual_cpus_list": "{cpu}", "device": "npu:{d}", "device_id": {d}, "direction": "host_to_device", "dtype": "float16", "gbps": {gbps}, "host_cpu": {cpu}, "iterations": 20, "operation": "copy", "pinned": true, "repeat": 0, "seconds": 0.1, "size_mb": {size}, "status": "ok", "test": "core_h2d_matrix", "ts": "2026-07-08T03:00:00+00:00"}}"#,
                    if first { "" } else { ",\n" }
                );
                first = false;
            }
        }
    }
    text.push_str("]}\n");
    std::fs::write(run.join("results.json"), text).unwrap();
    let state = tempfile::tempdir().unwrap();
    let chd = replay(&run, state.path());
    let m = Metrics::parse(&chd.scrape());
    let cells = m.find("chd_h2d_bandwidth_bytes_per_second", &[]);
    assert_eq!(cells.len(), 640 * 16 * 3);
    assert!(cells.iter().all(|s| s.labels["direction"] == "h2d"));
    assert!(chd
        .log()
        .contains("30720 h2d cells, 0 pair cells, 0 failed samples"));
    assert!(
        m.value(
            "chd_h2d_device_ratio",
            &[
                ("device", "0"),
                ("size_bytes", "268435456"),
                ("direction", "h2d")
            ]
        ) < 0.3
    );
    drop(chd);

    // By default (`exposition.cells = "auto"`) the 30,720 cells stay off and the whole
    // scrape is within the series budget of issue 13 (a replay runs no collectors).
    let state = tempfile::tempdir().unwrap();
    let chd = Chd::serve(state.path(), &["--replay", run.to_str().unwrap()]);
    let body = chd.scrape();
    let series = body
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count();
    assert!(series <= 3_000, "{series} series");
    let m = Metrics::parse(&body);
    assert!(m.find("chd_h2d_bandwidth_bytes_per_second", &[]).is_empty());
    assert!(
        m.value(
            "chd_h2d_device_ratio",
            &[
                ("device", "0"),
                ("size_bytes", "268435456"),
                ("direction", "h2d")
            ]
        ) < 0.3
    );
    assert!(
        chd.log().contains(
            "per-cell series off: exposition.cells = auto and 30,720 cells > \
             exposition.auto_cells_limit 12,288"
        ),
        "{}",
        chd.log()
    );
    eprintln!("default replay of 640 x 16 x 3: {series} series");
}
