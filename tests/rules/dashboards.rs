//! The Grafana dashboards of dashboards/ without Grafana (no offline validator exists): the
//! JSON parses, uids are set and unique, every panel reads the `${datasource}` variable, every
//! variable a query uses is defined, every metric is in the contract (docs/METRICS.md) or a
//! recording rule of alerts/, and every PromQL expression, with the variables substituted,
//! passes `promtool check rules`. `prometheus_e2e` runs them against a real Prometheus.

use std::collections::BTreeSet;

use crate::prometheus::{
    contract, dashboard_queries, dashboards, is_known_metric, matrix_link, metric_names, panels,
    promtool_check_exprs, record_names, repo, rules_path, substitute,
};
use serde_json::{json, Value};

/// Values standing in for the dashboards' variables.
const VARS: &[(&str, &str)] = &[
    ("cluster", ".*"),
    ("model", ".+"),
    ("job", ".*chd.*"),
    ("instance", "gpu-node-17:9863"),
    ("size", "67108864"),
    ("direction", "h2d"),
    ("pair", "0,5"),
];

fn datasource_ref() -> Value {
    json!({"type": "prometheus", "uid": "${datasource}"})
}

#[test]
fn dashboards_have_unique_uids_and_grafana_10_schema() {
    let mut uids = BTreeSet::new();
    for (file, d) in dashboards() {
        let f = file.display();
        let uid = d["uid"].as_str().unwrap_or_default();
        assert!(!uid.is_empty() && uid.len() <= 40, "{f}: uid {uid:?}");
        assert!(uids.insert(uid.to_string()), "{f}: uid {uid} used twice");
        assert!(
            d["title"].as_str().is_some_and(|t| !t.is_empty()),
            "{f}: title"
        );
        let schema = d["schemaVersion"].as_i64().unwrap_or(0);
        assert!(
            schema >= 38,
            "{f}: schemaVersion {schema} is older than Grafana 10"
        );
        let mut ids = BTreeSet::new();
        for p in panels(&d) {
            let id = p["id"].as_i64().expect("panel id");
            assert!(ids.insert(id), "{f}: panel id {id} used twice");
            assert!(
                p["gridPos"]["w"].as_i64().is_some(),
                "{f}: panel {id} gridPos"
            );
        }
    }
}

#[test]
fn every_panel_reads_the_datasource_variable() {
    for (file, d) in dashboards() {
        let f = file.display();
        let vars = d["templating"]["list"].as_array().expect("templating.list");
        let ds: Vec<&Value> = vars.iter().filter(|v| v["type"] == "datasource").collect();
        assert_eq!(ds.len(), 1, "{f}: one datasource variable");
        assert_eq!(ds[0]["name"], "datasource", "{f}");
        assert_eq!(ds[0]["query"], "prometheus", "{f}");
        for v in vars.iter().filter(|v| v["type"] == "query") {
            assert_eq!(
                v["datasource"],
                datasource_ref(),
                "{f}: variable {}",
                v["name"]
            );
        }
        for p in panels(&d).into_iter().filter(|p| p["type"] != "row") {
            let title = p["title"].as_str().unwrap_or_default();
            assert!(!title.is_empty(), "{f}: panel {} has no title", p["id"]);
            assert!(
                p["description"].as_str().is_some_and(|s| s.len() > 20),
                "{f}: panel {title:?} needs a description (the README describes panels from them)"
            );
            assert_eq!(p["datasource"], datasource_ref(), "{f}: panel {title:?}");
            let targets = p["targets"].as_array().expect("targets");
            assert!(!targets.is_empty(), "{f}: panel {title:?} has no query");
            for t in targets {
                assert_eq!(t["datasource"], datasource_ref(), "{f}: panel {title:?}");
                assert!(
                    t["expr"].as_str().is_some_and(|e| !e.is_empty()),
                    "{f}: {title:?}"
                );
            }
        }
    }
}

#[test]
fn every_variable_a_query_uses_is_defined() {
    for (file, d) in dashboards() {
        let defined: Vec<String> = d["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap().to_string())
            .collect();
        let vars: Vec<(&str, &str)> = defined.iter().map(|n| (n.as_str(), "x")).collect();
        for q in dashboard_queries(&file, &d) {
            if let Err(e) = substitute(&q.expr, &vars) {
                panic!("{}: {}: {e}", q.dashboard, q.source);
            }
        }
    }
}

#[test]
fn dashboards_read_only_contract_metrics_and_recording_rules() {
    let rules = std::fs::read_to_string(rules_path()).unwrap();
    let records: BTreeSet<String> = record_names(&rules).into_iter().collect();
    let contract = contract();
    let mut used_records = BTreeSet::new();
    for (file, d) in dashboards() {
        for q in dashboard_queries(&file, &d) {
            for name in metric_names(&q.expr) {
                assert!(
                    is_known_metric(&name, &contract, &records),
                    "{}: {} reads {name}, which is neither in docs/METRICS.md nor a recording rule",
                    q.dashboard,
                    q.source
                );
                if records.contains(&name) {
                    used_records.insert(name);
                }
            }
        }
    }
    // The recording rules exist for the dashboards: each is read by one, or by another rule
    // or an alert (the hourly medians under the 7-day baseline).
    for line in rules
        .lines()
        .filter(|l| !l.trim_start().starts_with("- record:"))
    {
        for name in metric_names(line) {
            if records.contains(&name) {
                used_records.insert(name);
            }
        }
    }
    let unused: Vec<&String> = records.difference(&used_records).collect();
    assert!(
        unused.is_empty(),
        "recording rules no dashboard reads: {unused:?}"
    );
}

#[test]
fn every_dashboard_expression_passes_promtool() {
    let mut exprs = Vec::new();
    for (file, d) in dashboards() {
        for q in dashboard_queries(&file, &d) {
            let expr = substitute(&q.expr, VARS)
                .unwrap_or_else(|e| panic!("{}: {}: {e}", q.dashboard, q.source));
            exprs.push((format!("{}: {}", q.dashboard, q.source), expr));
        }
    }
    assert!(exprs.len() > 40, "only {} expressions found", exprs.len());
    promtool_check_exprs(&exprs);
}

#[test]
fn grafana_provisioning_points_at_the_dashboards() {
    let dir = repo().join("deploy/grafana/provisioning");
    let dashboards = std::fs::read_to_string(dir.join("dashboards/chd.yml")).unwrap();
    assert!(dashboards.contains("apiVersion: 1"), "{dashboards}");
    assert!(dashboards.contains("type: file"), "{dashboards}");
    let path = dashboards
        .lines()
        .find_map(|l| l.trim().strip_prefix("path:"))
        .expect("options.path");
    assert!(path.trim().starts_with('/'), "absolute path: {path}");
    let datasources = std::fs::read_to_string(dir.join("datasources/prometheus.yml")).unwrap();
    assert!(datasources.contains("type: prometheus"), "{datasources}");
}

fn node_dashboard() -> Value {
    let (_, d) = dashboards()
        .into_iter()
        .find(|(f, _)| f.ends_with("chd-node.json"))
        .expect("dashboards/chd-node.json");
    d
}

/// The panel whose first query reads `metric`.
fn panel_reading<'a>(d: &'a Value, metric: &str) -> &'a Value {
    panels(d)
        .into_iter()
        .find(|p| {
            p["targets"][0]["expr"]
                .as_str()
                .is_some_and(|e| e.starts_with(&format!("{metric}{{")))
        })
        .unwrap_or_else(|| panic!("no panel reads {metric}"))
}

#[test]
fn node_dashboard_opens_on_the_numa_segment_heatmap() {
    // The core x device view works whether or not the node exports cells (issue 13): its
    // first panel is the NUMA segment x device heatmap, which every node exports.
    let d = node_dashboard();
    let first = panels(&d)
        .into_iter()
        .find(|p| p["type"] != "row")
        .expect("a panel");
    let seg = panel_reading(&d, "chd_h2d_segment_bandwidth_bytes_per_second");
    assert_eq!(first, seg, "the segment heatmap comes first");
    assert_eq!(seg["gridPos"]["x"], 0);
    assert_eq!(seg["gridPos"]["y"], 1, "right under the first row");
    let expr = seg["targets"][0]["expr"].as_str().unwrap();
    assert!(expr.contains("stat=\"median\""), "{expr}");
    assert!(expr.contains("size_bytes=\"$size\""), "{expr}");
    // A heatmap table: one row per NUMA node, one column per device, coloured cells.
    assert_eq!(seg["type"], "table");
    let grouping = seg["transformations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "groupingToMatrix")
        .expect("groupingToMatrix");
    assert_eq!(grouping["options"]["rowField"], "numa_node");
    assert_eq!(grouping["options"]["columnField"], "device");
    assert_eq!(
        seg["fieldConfig"]["defaults"]["custom"]["cellOptions"]["type"],
        "color-background"
    );

    // The per-cell panel stays, and says when and why it is empty.
    let cells = panel_reading(&d, "chd_h2d_bandwidth_bytes_per_second");
    let why = cells["description"].as_str().unwrap();
    for word in ["exposition.cells", "auto_cells_limit", "/matrix"] {
        assert!(
            why.contains(word),
            "cells panel description lacks {word}: {why}"
        );
    }
}

#[test]
fn node_heatmaps_link_to_the_nodes_matrix_page() {
    let d = node_dashboard();
    let port = chd::config::DEFAULT_LISTEN.rsplit(':').next().unwrap();
    let chd_port = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "chd_port")
        .expect("a chd_port variable");
    assert_eq!(chd_port["type"], "textbox");
    assert_eq!(chd_port["query"], port, "chd_port defaults to chd's port");
    for metric in [
        "chd_h2d_segment_bandwidth_bytes_per_second",
        "chd_h2d_bandwidth_bytes_per_second",
    ] {
        let p = panel_reading(&d, metric);
        // The instance label as the shipped scrape configurations set it (the node's name),
        // or with the port kept, or an address: the link goes to chd's port on that host.
        for (instance, want) in [
            ("gpu-node-17", "http://gpu-node-17:9863/matrix"),
            ("gpu-node-17:9863", "http://gpu-node-17:9863/matrix"),
            ("10.1.2.3:9100", "http://10.1.2.3:9863/matrix"),
            ("[fd00::17]:9863", "http://[fd00::17]:9863/matrix"),
        ] {
            assert_eq!(matrix_link(&d, p, instance, port), want, "{metric}");
        }
        // The same link on every cell (a data link), raw: Grafana percent-encodes variables
        // in links by default, which would turn host:port into host%3Aport.
        let panel_link = &p["links"][0];
        let data_link = &p["fieldConfig"]["defaults"]["links"][0];
        assert_eq!(panel_link["url"], data_link["url"], "{metric}");
        let url = panel_link["url"].as_str().unwrap();
        assert!(
            url.contains("${chd_host:raw}") && url.contains("${chd_port:raw}"),
            "{url}"
        );
        assert_eq!(panel_link["targetBlank"], true);
    }
}
