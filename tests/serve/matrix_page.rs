//! The `/matrix` page in a real browser: headless Chromium (Debian package `chromium`) loads
//! the page `chd serve` serves, and a page rendered from a known store; the parsed DOM must hold
//! one `<rect class="cell">` per measured cell, and a screenshot must be a real picture.
//! Without Chromium these tests fail and say how to install it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::chd_process::{http_get, Chd, Metrics};
use chd::runtime::DeviceInfo;
use chd::topology::{Cpu, NumaNode, Topology};

/// The Chromium binary, or a failure that says how to get it.
fn chromium() -> PathBuf {
    for name in ["chromium", "chromium-browser"] {
        if let Ok(out) = Command::new("sh")
            .args(["-c", &format!("command -v {name}")])
            .output()
        {
            let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if out.status.success() && !path.is_empty() {
                return PathBuf::from(path);
            }
        }
    }
    panic!(
        "chromium is missing: the /matrix tests render the page in headless Chromium; \
         install Debian's package with `apt-get install -y chromium` (scripts/test.sh does)"
    );
}

/// Run headless Chromium on `url` with `extra` flags; returns stdout. Fails after 90 s.
fn headless(url: &str, extra: &[&str]) -> String {
    let profile = tempfile::tempdir().unwrap();
    let mut child = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start chromium");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            panic!("chromium did not finish {url} within 90 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "chromium failed on {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The DOM Chromium built from `url`.
fn dom(url: &str) -> String {
    let dom = headless(url, &["--dump-dom"]);
    assert!(
        dom.contains("<svg") && dom.contains("</html>"),
        "no page rendered:\n{dom}"
    );
    dom
}

/// A screenshot of `url`; asserts it is a PNG of the window's size with real content.
fn screenshot(url: &str, dir: &Path) {
    let shot = dir.join("matrix.png");
    headless(
        url,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1280,1024",
            "--hide-scrollbars",
        ],
    );
    let png = std::fs::read(&shot).expect("chromium wrote no screenshot");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let be = |s: &[u8]| u32::from_be_bytes([s[0], s[1], s[2], s[3]]);
    assert_eq!((be(&png[16..20]), be(&png[20..24])), (1280, 1024));
    // A blank page compresses to a few hundred bytes; heatmaps with text do not.
    assert!(png.len() > 8_000, "screenshot is only {} bytes", png.len());
}

/// (row, col) of every `<rect class="CLASS" ... data-row="R" data-col="C">` in `html`.
fn rects(html: &str, class: &str) -> Vec<(String, String)> {
    let attr = |tag: &str, name: &str| {
        let key = format!("{name}=\"");
        tag.split(&key)
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or_default()
            .to_string()
    };
    html.split(&format!("<rect class=\"{class}\""))
        .skip(1)
        .map(|tag| {
            let tag = tag.split('>').next().unwrap_or_default();
            (attr(tag, "data-row"), attr(tag, "data-col"))
        })
        .collect()
}

#[test]
fn served_matrix_page_has_one_cell_per_measured_cpu_and_device_in_chromium() {
    let state = tempfile::tempdir().unwrap();
    // One window at start that measures everything, then nothing for an hour: the matrix
    // stays put while the page is checked.
    let chd = Chd::serve(
        state.path(),
        &[
            "--backend",
            "host",
            "--interval",
            "1h",
            "--window-budget",
            "20s",
            "--cpu-busy-threshold",
            "1",
            "--sizes",
            "1",
            "--iterations",
            "1",
        ],
    );
    let m = chd.wait_for(Duration::from_secs(60), "a first complete window", |m| {
        !m.find(
            "chd_probe_runs_total",
            &[("probe", "h2d"), ("result", "ok")],
        )
        .is_empty()
            && m.value(
                "chd_probe_cells",
                &[("probe", "h2d"), ("state", "unmeasured")],
            ) == 0.0
    });
    let measured: BTreeSet<(String, String)> = m
        .find("chd_h2d_bandwidth_bytes_per_second", &[])
        .iter()
        .map(|s| (s.labels["cpu"].clone(), s.labels["device"].clone()))
        .collect();
    assert!(!measured.is_empty());
    let (status, headers, body) = http_get(chd.addr, "/matrix", None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    let served: BTreeSet<(String, String)> = rects(&body, "cell").into_iter().collect();
    assert_eq!(served, measured);
    let (_, _, index) = http_get(chd.addr, "/", None);
    assert!(index.contains("href=\"/matrix\""), "{index}");

    let url = format!("http://{}/matrix", chd.addr);
    let page = dom(&url);
    let cells = rects(&page, "cell");
    assert_eq!(cells.len(), measured.len(), "one <rect> per measured cell");
    assert_eq!(cells.into_iter().collect::<BTreeSet<_>>(), measured);
    assert!(
        page.contains("<title>CPU 0 \u{2192} device numa0"),
        "{page}"
    );
    screenshot(&url, state.path());
    // The last scrape still agrees: nothing was measured in between.
    let again = Metrics::parse(&chd.scrape());
    assert_eq!(
        again.find("chd_h2d_bandwidth_bytes_per_second", &[]).len(),
        measured.len()
    );
}

fn fixture_topology() -> Topology {
    Topology {
        cpus: (0..8)
            .map(|id| Cpu {
                id,
                numa_node: Some(id / 4),
                package: Some(id / 4),
                core: Some(id % 4),
                siblings: vec![id],
                allowed: true,
            })
            .collect(),
        offline_cpus: Vec::new(),
        numa_nodes: (0..2)
            .map(|n| NumaNode {
                id: n,
                cpus: (n * 4..n * 4 + 4).collect(),
                has_memory: true,
                memory_total_bytes: None,
            })
            .collect(),
    }
}

#[test]
fn page_of_a_known_store_shows_every_cell_failures_and_the_pair_matrix() {
    let results = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/reports/cluster-health/results.json");
    let store = chd::dataset::load(&results).unwrap().0.to_store(5, 1.0);
    let devices: Vec<DeviceInfo> = (0..4)
        .map(|i| DeviceInfo {
            id: i.to_string(),
            kind: "cuda".into(),
            name: "Fake H200".into(),
            pci_bus_id: format!("0000:{:02x}:00.0", 0x10 + i),
            numa_node: Some(i / 2),
        })
        .collect();
    let html = chd::report::svg::matrix_page(&store, &fixture_topology(), &devices);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("matrix.html");
    std::fs::write(&path, &html).unwrap();
    let url = format!("file://{}", path.display());
    let page = dom(&url);
    // 8 CPUs x 4 devices minus the failed cell, plus the 8 x 8 pair matrix.
    assert_eq!(rects(&page, "cell").len(), 31 + 64);
    assert_eq!(rects(&page, "failed"), [("6".to_string(), "2".to_string())]);
    assert_eq!(page.matches("<section class=\"matrix\">").count(), 2);
    assert!(page.contains("Pair 0,5"));
    assert!(page.contains("CPU 0 \u{2192} device 0 (NUMA 0): 12.50 GB/s, median of 1 samples"));
    assert_eq!(page.matches("class=\"numa-boundary\"").count(), 3);
    screenshot(&url, dir.path());
}
