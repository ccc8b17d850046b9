//! The jsonnet mixin (mixin/) as the source of the shipped rules and dashboards (issue 29):
//! the committed alerts/chd.rules.yml and dashboards/*.json are exactly what it renders
//! (`scripts/gen-mixin.py --check`, PyPI's jsonnet, installed by scripts/test.sh), it renders
//! valid rules with other fleet group labels, and the rules pass the checks of `mixtool lint`
//! (mixtool itself is a Go program these machines cannot install; its alert checks are
//! copied here from monitoring-mixins/mixtool's pkg/mixer/lint.go), plus the annotations the
//! mixin conventions ask for: a runbook_url to an existing section of docs/runbook.md and a
//! dashboard_url to a shipped dashboard.

use crate::prometheus;

use std::collections::BTreeSet;
use std::process::Command;

use crate::prometheus::{dashboards, promtool_ok, repo, rules_path};
use serde_yaml::Value;

/// `python3 scripts/gen-mixin.py ARGS`: (success, stdout, stderr).
fn gen_mixin(args: &[&str]) -> (bool, String, String) {
    let out = Command::new("python3")
        .arg(repo().join("scripts/gen-mixin.py"))
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap_or_else(|e| panic!("python3 is required to render the mixin: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn generated_rules_and_dashboards_are_up_to_date() {
    let (ok, stdout, stderr) = gen_mixin(&["--check"]);
    assert!(
        ok,
        "alerts/chd.rules.yml or dashboards/ differ from what mixin/ renders.\n\
         Run scripts/gen-mixin.py to regenerate them (it also regenerates the PrometheusRule), \
         and commit the result.\n{stdout}{stderr}"
    );
}

#[test]
fn the_mixin_renders_valid_rules_with_other_group_labels() {
    let (ok, rules, stderr) = gen_mixin(&["--rules-with", "{ groupLabels: ['cluster', 'pool'] }"]);
    assert!(ok, "{stderr}");
    // Every fleet aggregation and every node join carries both labels.
    assert!(
        rules.contains("quantile by (cluster, pool, name, size_bytes, direction)"),
        "{rules}"
    );
    assert!(
        rules.contains("on (cluster, pool, job, instance, device)"),
        "{rules}"
    );
    assert!(!rules.contains("by (job, instance)"), "{rules}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool.rules.yml");
    std::fs::write(&path, &rules).unwrap();
    promtool_ok(
        [
            std::ffi::OsStr::new("check"),
            "rules".as_ref(),
            path.as_os_str(),
        ],
        "rules rendered with groupLabels cluster, pool",
    );
}

fn rules() -> Value {
    let text = std::fs::read_to_string(rules_path()).unwrap();
    serde_yaml::from_str(&text).expect("alerts/chd.rules.yml is YAML")
}

fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// mixtool lint: alert-group-rule-count, alert-group-name-length, alert-name-camelcase,
/// alert-name-length, alert-severity-rule, alert-description-missing-rule,
/// alert-description-templating, alert-summary-missing-rule, alert-summary-templating,
/// alert-summary-style.
#[test]
fn alerts_pass_mixtool_lint_checks() {
    let camel = regex::Regex::new(r"^([A-Z]+[a-z0-9]+)+$").unwrap();
    let template = regex::Regex::new(r"\{\{.+\}\}").unwrap();
    let sentence = regex::Regex::new(r"^[A-Z].+\.$").unwrap();
    let mut errors = Vec::new();
    let mut alerts = 0;
    for group in rules()["groups"].as_sequence().unwrap() {
        let name = str_of(group, "name").unwrap();
        let rules = group["rules"].as_sequence().unwrap();
        if rules.len() > 20 {
            errors.push(format!(
                "[alert-group-rule-count] group {name} has {} rules",
                rules.len()
            ));
        }
        if name.len() > 40 {
            errors.push(format!("[alert-group-name-length] group {name}"));
        }
        for rule in rules {
            let Some(alert) = str_of(rule, "alert") else {
                continue;
            };
            alerts += 1;
            if !camel.is_match(alert) {
                errors.push(format!("[alert-name-camelcase] {alert}"));
            }
            if alert.len() > 40 {
                errors.push(format!("[alert-name-length] {alert}"));
            }
            let severity = str_of(&rule["labels"], "severity").unwrap_or_default();
            if !["warning", "critical", "info"].contains(&severity) {
                errors.push(format!("[alert-severity-rule] {alert}: {severity:?}"));
            }
            let annotations = &rule["annotations"];
            match str_of(annotations, "description") {
                None => errors.push(format!("[alert-description-missing-rule] {alert}")),
                Some(d) if !template.is_match(d) => {
                    errors.push(format!("[alert-description-templating] {alert}: {d}"))
                }
                Some(_) => {}
            }
            match str_of(annotations, "summary") {
                None => errors.push(format!("[alert-summary-missing-rule] {alert}")),
                Some(s) => {
                    if template.is_match(s) {
                        errors.push(format!("[alert-summary-templating] {alert}: {s}"));
                    }
                    if !sentence.is_match(s) {
                        errors.push(format!("[alert-summary-style] {alert}: {s}"));
                    }
                }
            }
        }
    }
    assert!(alerts > 20, "only {alerts} alerts found");
    assert!(errors.is_empty(), "mixtool lint:\n{}", errors.join("\n"));
}

/// Every alert's runbook_url ends in `#<alertname in lower case>` and docs/runbook.md has
/// that section (`## <AlertName>`); every section is an alert's; every dashboard_url opens a
/// shipped dashboard.
#[test]
fn every_alert_links_its_runbook_section_and_a_dashboard() {
    let runbook = std::fs::read_to_string(repo().join("docs/runbook.md")).expect("docs/runbook.md");
    let sections: BTreeSet<String> = runbook
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .filter(|h| h.starts_with("Chd"))
        .map(|h| h.trim().to_string())
        .collect();
    let uids: BTreeSet<String> = dashboards()
        .iter()
        .map(|(_, d)| d["uid"].as_str().unwrap().to_string())
        .collect();
    let mut alerts = BTreeSet::new();
    for group in rules()["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let Some(alert) = str_of(rule, "alert") else {
                continue;
            };
            alerts.insert(alert.to_string());
            let url = str_of(&rule["annotations"], "runbook_url").unwrap_or_default();
            assert!(
                url.ends_with(&format!("runbook.md#{}", alert.to_lowercase())),
                "{alert}: runbook_url {url:?}"
            );
            let dashboard = str_of(&rule["annotations"], "dashboard_url").unwrap_or_default();
            let uid = dashboard
                .split("/d/")
                .nth(1)
                .and_then(|rest| rest.split('/').next())
                .unwrap_or_default();
            assert!(uids.contains(uid), "{alert}: dashboard_url {dashboard:?}");
        }
    }
    let missing: Vec<_> = alerts.difference(&sections).collect();
    assert!(
        missing.is_empty(),
        "docs/runbook.md has no section for {missing:?}"
    );
    let extra: Vec<_> = sections.difference(&alerts).collect();
    assert!(
        extra.is_empty(),
        "docs/runbook.md sections for no alert: {extra:?}"
    );
}

/// The checks of grafana/dashboard-linter that `mixtool lint` runs on dashboards, on their
/// text (no PromQL parser here; every expression also passes promtool in
/// tests/rules/dashboards.rs): the job variable (template-job-rule), refresh on time range change
/// (template-on-time-change-reload-rule), the job and instance matchers in every selector
/// (target-job-rule, target-instance-rule), `$__rate_interval` in rate()
/// (target-rate-interval-rule), counters only under rate/irate/increase
/// (target-counter-agg-rule), units on stat, time series and gauge panels (panel-units-rule).
/// Exclusions, as a mixin's .lint file would list them: the node dashboards pick one node (the
/// instance variable is single-select, without All), the fleet dashboard has no instance
/// variable, and fleet-group series (`name:chd_*`) carry no job or instance.
#[test]
fn dashboards_pass_dashboard_linter_checks() {
    let selector =
        regex::Regex::new(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}(\[[^\]]*\])?").unwrap();
    let rate = regex::Regex::new(r"\b(i?rate)\(\s*[^\[]*\[([^\]]*)\]").unwrap();
    let mut errors = Vec::new();
    for (file, d) in dashboards() {
        let f = file.file_name().unwrap().to_string_lossy().into_owned();
        let vars = d["templating"]["list"].as_array().unwrap();
        let var = |name: &str| vars.iter().find(|v| v["name"] == name);
        match var("job") {
            None => errors.push(format!("[template-job-rule] {f}: no job variable")),
            Some(job) => {
                if job["multi"] != true || job["allValue"] != ".+" || job["type"] != "query" {
                    errors.push(format!("[template-job-rule] {f}: {job}"));
                }
                if job["datasource"]["uid"] != "${datasource}" {
                    errors.push(format!("[template-job-rule] {f}: datasource {job}"));
                }
            }
        }
        for v in vars.iter().filter(|v| v["type"] == "query") {
            if v["refresh"] != 2 {
                errors.push(format!(
                    "[template-on-time-change-reload-rule] {f}: {}",
                    v["name"]
                ));
            }
        }
        let has_instance = var("instance").is_some();
        for q in prometheus::dashboard_queries(&file, &d) {
            if q.source.starts_with("variable") {
                continue;
            }
            for c in selector.captures_iter(&q.expr) {
                let (name, matchers) = (&c[1], &c[2]);
                if name.starts_with("name:") {
                    continue;
                }
                if !matchers.contains("job=~\"$job\"") {
                    errors.push(format!("[target-job-rule] {f}: {}: {}", q.source, &c[0]));
                }
                if has_instance && !matchers.contains("instance=~\"$instance\"") {
                    errors.push(format!(
                        "[target-instance-rule] {f}: {}: {}",
                        q.source, &c[0]
                    ));
                }
                if name.ends_with("_total") && c.get(3).is_none() {
                    errors.push(format!(
                        "[target-counter-agg-rule] {f}: {}: {}",
                        q.source, &c[0]
                    ));
                }
            }
            for c in rate.captures_iter(&q.expr) {
                if &c[2] != "$__rate_interval" {
                    errors.push(format!(
                        "[target-rate-interval-rule] {f}: {}: {}",
                        q.source, &c[0]
                    ));
                }
            }
        }
        for p in prometheus::panels(&d) {
            let kind = p["type"].as_str().unwrap_or_default();
            if !["stat", "timeseries", "gauge"].contains(&kind) {
                continue;
            }
            let defaults = &p["fieldConfig"]["defaults"];
            let mapped = defaults["mappings"]
                .as_array()
                .is_some_and(|m| !m.is_empty());
            if defaults["unit"].as_str().unwrap_or_default().is_empty() && !mapped {
                errors.push(format!("[panel-units-rule] {f}: {:?}", p["title"]));
            }
        }
    }
    assert!(
        errors.is_empty(),
        "dashboard-linter:\n{}",
        errors.join("\n")
    );
}

/// Part 5 of issue 29: links between dashboards keep the variables and the time range, data
/// links into a dashboard carry the time range and the group variables, every dashboard has
/// the `cluster` variable, the fleet dashboard a device-model filter, the node dashboard's
/// segment matrix is coloured by ratio with fixed thresholds, and its size defaults to the
/// largest.
#[test]
fn dashboards_keep_context_across_links_and_colour_by_fixed_ratios() {
    for (file, d) in dashboards() {
        let f = file.display();
        for l in d["links"].as_array().unwrap() {
            assert_eq!(l["includeVars"], true, "{f}: {l}");
            assert_eq!(l["keepTime"], true, "{f}: {l}");
        }
        let names: Vec<&str> = d["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        assert_eq!(names.get(1), Some(&"cluster"), "{f}: {names:?}");
        for p in prometheus::panels(&d) {
            for l in p["fieldConfig"]["defaults"]["links"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let url = l["url"].as_str().unwrap();
                if url.starts_with("/d/") {
                    assert!(url.contains("${__url_time_range}"), "{f}: {url}");
                    assert!(url.contains("${cluster:queryparam}"), "{f}: {url}");
                }
            }
        }
    }
    let by_uid = |uid: &str| {
        dashboards()
            .into_iter()
            .find(|(_, d)| d["uid"] == uid)
            .map(|(_, d)| d)
            .unwrap()
    };
    let fleet = by_uid("chd-fleet");
    let fleet_text = fleet.to_string();
    assert!(
        fleet["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "model"),
        "no model variable on the fleet dashboard"
    );
    assert!(
        fleet_text.contains("name=~\\\"$model\\\""),
        "nothing reads $model"
    );
    let node = by_uid("chd-node");
    let size = node["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "size")
        .unwrap();
    assert_eq!(
        size["sort"], 4,
        "size sorted numerically, largest first (the default)"
    );
    let segment = prometheus::panels(&node)
        .into_iter()
        .find(|p| p["id"] == 3)
        .unwrap();
    let expr = segment["targets"][0]["expr"].as_str().unwrap();
    assert!(
        expr.contains("/ ignoring (numa_node) group_left ()"),
        "the segment matrix shows the ratio to the device's median: {expr}"
    );
    let defaults = &segment["fieldConfig"]["defaults"];
    assert_eq!(defaults["color"]["mode"], "thresholds");
    let steps: Vec<(String, Option<f64>)> = defaults["thresholds"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["color"].as_str().unwrap().to_string(),
                s["value"].as_f64(),
            )
        })
        .collect();
    assert_eq!(
        steps,
        [
            ("red".to_string(), None),
            ("yellow".to_string(), Some(0.5)),
            ("green".to_string(), Some(0.8))
        ]
    );
}
