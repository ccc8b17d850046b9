//! The Grafana dashboards of dashboards/ without Grafana (no offline validator exists): the
//! JSON parses, uids are set and unique, every panel reads the `${datasource}` variable, every
//! variable a query uses is defined, every metric is in the contract (docs/METRICS.md) or a
//! recording rule of alerts/, and every PromQL expression, with the variables substituted,
//! passes `promtool check rules`. tests/prometheus_e2e.rs runs them against a real Prometheus.

#[path = "support/prometheus.rs"]
mod prometheus;

use std::collections::BTreeSet;

use prometheus::{
    contract, dashboard_queries, dashboards, is_known_metric, metric_names, panels,
    promtool_check_exprs, record_names, repo, rules_path, substitute,
};
use serde_json::{json, Value};

/// Values standing in for the dashboards' variables.
const VARS: &[(&str, &str)] = &[
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
    // The fleet view's recording rules exist for the dashboards: each is read by one.
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
